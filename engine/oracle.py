"""The engine against an independent Qwen3: transformers' `Qwen3ForCausalLM` (`Qwen3MoeForCausalLM` for a
Qwen3-MoE folder) with eager attention and, for experts, transformers' eager loop over them.

`compare` runs the engine on a saved model folder with every stage's values kept, then
runs transformers on each request's final tokens (prompt and the engine's completion,
teacher-forced, one full causal forward) and walks the engine's steps in order: at each
step, for the positions that step computed, the embedding, every decoder layer's
output (the residual stream), the final norm and the sampled logits must agree within
the tolerance. The first stage that does not is reported with its step and layer. When
that layer has experts, the comparison looks inside it: it runs the engine's router,
ch31's route_topk and the engine's dispatch → experts → combine on transformers' own
input to that layer's experts, and says which half disagrees (the routing, the experts,
or neither: then the difference arose before them, in attention). Separately,
transformers' own greedy `generate` must give the engine's tokens exactly.

Needs the oracle extra (`pip install -e '.[oracle]'`); nothing is downloaded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from engine.core import Engine, Run, Settings
from engine.model import Model, load
from engine.moe import ExpertParallel, ExpertParallelSettings
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
    detail: str = ""
    """Where inside the layer, when the comparison could tell (a layer of experts: its routing or its experts)."""

    @property
    def message(self) -> str:
        where = "token" if self.stage == "logits" else "channel"
        return (
            f"first divergence at step {self.step} ({self.kind}, request {self.request}, positions "
            f"{self.positions[0]}–{self.positions[1]}), {self.stage}: at position {self.position}, {where} "
            f"{self.channel} the engine has {self.engine:.6g}, transformers {self.transformers:.6g} "
            f"(|Δ| {abs(self.engine - self.transformers):.3g} > {ATOL:g} + {RTOL:g}·|x|)" + (f"; {self.detail}" if self.detail else "")
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
    model, parts = load(folder), parts or reference_parts()
    run = Engine(model, parts, settings).generate(prompts, max_tokens, probe=True)
    hf = transformers_model(folder, moe=model.config.is_moe)
    tokens = [prompt + out[:-1] for prompt, out in zip(prompts, run.outputs)]
    divergence, max_logit_diff = _first_divergence(run, [_states(hf, t) for t in tokens])
    layer = re.match(r"decoder layer (\d+) ", divergence.stage) if divergence else None
    if divergence and layer and model.config.is_moe_layer(int(layer[1])):
        first, last = divergence.positions
        detail = _inside_experts(hf, model, parts, tokens[divergence.request], int(layer[1]), list(range(first, last + 1)))
        divergence = replace(divergence, detail=detail)
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
def _inside_experts(hf: Any, model: Model, parts: Parts, tokens: list[int], layer: int, positions: list[int]) -> str:
    """Which half of a diverging layer of experts is wrong: the engine's router and ch31's route_topk, then its
    dispatch, experts and combine, each run on transformers' own input to that layer's experts and compared with
    transformers' router and experts (so the layers before, and attention, are out of the question)."""
    c, moe = model.config, model.layers[layer].moe
    assert moe is not None  # a layer of experts
    seen: dict[str, torch.Tensor] = {}
    block = hf.model.layers[layer].mlp

    def keep_block(module, args, output):
        seen["x"], seen["y"] = args[0].reshape(-1, c.hidden_size), output.reshape(-1, c.hidden_size)

    def keep_router(module, args, output):
        seen["weights"], seen["ids"] = output[1], output[2]

    hooks = [block.register_forward_hook(keep_block), block.gate.register_forward_hook(keep_router)]
    try:
        hf(torch.tensor([tokens]), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    x = seen["x"][positions].to(c.torch_dtype)
    logits = parts.fn("linear")(x, moe.router)
    ids, weights = parts.fn("route_topk")(logits, c.num_experts_per_tok, c.norm_topk_prob)
    theirs, order, their_order = seen["ids"][positions], ids.argsort(dim=-1), seen["ids"][positions].argsort(dim=-1)
    if not torch.equal(ids.gather(1, order), theirs.gather(1, their_order)):
        return f"inside it, routing: on transformers' input ch31's route_topk chooses experts {_few(ids)}, transformers {_few(theirs)}"
    w, their_w = weights.float().gather(1, order), seen["weights"][positions].float().gather(1, their_order)
    if _first_bad(w, their_w):
        return f"inside it, routing: the experts agree but ch31's route_topk weighs them {_few(w)}, transformers {_few(their_w)}"
    call = lambda stage, name, *args, shapes=None: parts.fn(name)(*args)
    out = ExpertParallel(c, ExpertParallelSettings(rebalance_interval=0), call).forward(layer, moe, x)
    if _first_bad(out.float(), seen["y"][positions].float()):
        return "inside it, the experts: routing agrees with transformers', the output of dispatch → experts → combine does not"
    return "inside it, routing and experts agree with transformers' on its input: the difference comes before them (attention)"


def _few(t: torch.Tensor, rows: int = 2) -> str:
    """The first rows of a small tensor, floats to 3 decimals."""
    values = [[round(v, 3) if isinstance(v, float) else v for v in row] for row in t[:rows].tolist()]
    return str(values)[:-1] + (", …]" if t.shape[0] > rows else "]")


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
