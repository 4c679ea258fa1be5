"""The engine against an independent Qwen3: transformers' `Qwen3ForCausalLM` (`Qwen3MoeForCausalLM` for a
Qwen3-MoE folder) with eager attention and, for experts, transformers' eager loop over them.

`compare` runs the engine on a saved model folder with every stage's values kept, then
runs transformers on each request's final tokens (prompt and the engine's completion,
teacher-forced, one full causal forward) and walks the engine's steps in order: at each
step, for the positions that step computed, the embedding, every decoder layer's
output (the residual stream), the final norm and the sampled logits must agree within
the tolerance. The first stage that does not is reported with its step and layer.
Separately, transformers' own greedy `generate` must give the engine's tokens exactly.

Needs the oracle extra (`pip install -e '.[oracle]'`); nothing is downloaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.core import Engine, Run, Settings
from engine.model import load
from engine.parts import Parts, reference_parts

ATOL, RTOL = 1e-4, 1e-4
"""Agreement in float32: |engine − transformers| ≤ ATOL + RTOL·|transformers|, for every value compared."""


@dataclass(frozen=True)
class Divergence:
    """The first value of the engine's run that transformers does not reproduce."""

    step: int
    kind: str
    request: int
    positions: tuple[int, int]
    stage: str
    position: int
    channel: int
    engine: float
    transformers: float

    @property
    def message(self) -> str:
        where = "token" if self.stage == "logits" else "channel"
        return (
            f"first divergence at step {self.step} ({self.kind}, request {self.request}, positions "
            f"{self.positions[0]}–{self.positions[1]}), {self.stage}: at position {self.position}, {where} "
            f"{self.channel} the engine has {self.engine:.6g}, transformers {self.transformers:.6g} "
            f"(|Δ| {abs(self.engine - self.transformers):.3g} > {ATOL:g} + {RTOL:g}·|x|)"
        )


@dataclass
class Comparison:
    """The engine's run, transformers' greedy tokens, and where (if anywhere) the two part."""

    run: Run
    transformers_tokens: list[list[int]]
    divergence: Divergence | None
    max_logit_diff: float

    @property
    def token_mismatch(self) -> str | None:
        for r, (mine, theirs) in enumerate(zip(self.run.outputs, self.transformers_tokens)):
            for j, (a, b) in enumerate(zip(mine, theirs)):
                if a != b:
                    return f"request {r}, completion token {j}: engine {a}, transformers {b}"
            if len(mine) != len(theirs):
                return f"request {r}: engine generated {len(mine)} tokens, transformers {len(theirs)}"
        return None

    @property
    def ok(self) -> bool:
        return self.divergence is None and self.token_mismatch is None

    @property
    def message(self) -> str:
        if self.ok:
            return f"the engine matches transformers (max |Δ logits| {self.max_logit_diff:.2g})"
        return "; ".join(m for m in (self.divergence and self.divergence.message, self.token_mismatch) if m)


def compare(
    folder: Path, prompts: list[list[int]], max_tokens: int, *, parts: Parts | None = None, settings: Settings = Settings()
) -> Comparison:
    """Run the engine (reference parts unless given) and transformers on the model in `folder`.

    Greedy decoding only (settings.temperature must be 0): sampled tokens have nothing to agree with.
    """
    if settings.temperature != 0:
        raise ValueError("the comparison decodes greedily: use temperature 0")
    model = load(folder)
    run = Engine(model, parts or reference_parts(), settings).generate(prompts, max_tokens, probe=True)
    hf = transformers_model(folder, moe=model.config.is_moe)
    states = [_states(hf, prompt + out[:-1]) for prompt, out in zip(prompts, run.outputs)]
    divergence, max_logit_diff = _first_divergence(run, states)
    generated = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False, pad_token_id=0)
        generated.append(out[0, len(prompt) :].tolist())
    return Comparison(run, generated, divergence, max_logit_diff)


def transformers_model(folder: Path, *, moe: bool) -> Any:
    """transformers' own model of `folder` in float32, eager attention (and eager experts for a mixture of experts)."""
    if moe:
        from transformers import Qwen3MoeForCausalLM

        experts: dict[str, Any] = {"experts_implementation": "eager"}  # transformers' own loop over the experts
        return Qwen3MoeForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32, **experts).eval()
    from transformers import Qwen3ForCausalLM

    return Qwen3ForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32).eval()


@torch.inference_mode()
def _states(hf, tokens: list[int]) -> dict[str, torch.Tensor]:
    """transformers' values at every position of `tokens`, by the engine's stage names."""
    captured: dict[str, torch.Tensor] = {}

    def keep(name: str):
        def hook(module, args, output):
            captured[name] = (output[0] if isinstance(output, tuple) else output)[0].float()

        return hook

    body = hf.model
    hooks = [body.embed_tokens.register_forward_hook(keep("embedding")), body.norm.register_forward_hook(keep("final norm"))]
    hooks += [layer.register_forward_hook(keep(f"layer {i}")) for i, layer in enumerate(body.layers)]
    try:
        captured["logits"] = hf(torch.tensor([tokens]), use_cache=False).logits[0].float()
    finally:
        for h in hooks:
            h.remove()
    return captured


def _first_divergence(run: Run, states: list[dict[str, torch.Tensor]]) -> tuple[Divergence | None, float]:
    max_logit_diff = 0.0
    for number, probe in enumerate(run.probes, start=1):
        spans, start = [], 0
        for seq_id, positions in probe["rows"]:
            spans.append((seq_id, positions, start))
            start += len(positions)
        for stage, values in probe["stages"].items():
            for seq_id, positions, row in spans:
                mine = values[row : row + len(positions)]
                theirs = states[seq_id][stage][positions[0] : positions[-1] + 1]
                found = _first_bad(mine, theirs)
                if found:
                    i, ch = found
                    return Divergence(
                        number,
                        probe["kind"],
                        seq_id,
                        (positions[0], positions[-1]),
                        _name(stage),
                        positions[i],
                        ch,
                        float(mine[i, ch]),
                        float(theirs[i, ch]),
                    ), max_logit_diff
        for b, (seq_id, position) in enumerate(probe["sampled_positions"]):
            mine, theirs = probe["logits"][b : b + 1], states[seq_id]["logits"][position : position + 1]
            max_logit_diff = max(max_logit_diff, float((mine - theirs).abs().max()))
            found = _first_bad(mine, theirs)
            if found:
                return Divergence(
                    number,
                    probe["kind"],
                    seq_id,
                    (position, position),
                    "logits",
                    position,
                    found[1],
                    float(mine[0, found[1]]),
                    float(theirs[0, found[1]]),
                ), max_logit_diff
    return None, max_logit_diff


def _first_bad(mine: torch.Tensor, theirs: torch.Tensor) -> tuple[int, int] | None:
    bad = ((mine - theirs).abs() > ATOL + RTOL * theirs.abs()) | ~torch.isfinite(mine)
    if not bool(bad.any()):
        return None
    i, ch = (int(x) for x in bad.nonzero()[0])
    return i, ch


def _name(stage: str) -> str:
    if stage.startswith("layer "):
        return f"decoder {stage} (its output, the residual stream)"
    return {"embedding": "the embedding", "final norm": "the final norm"}.get(stage, stage)
