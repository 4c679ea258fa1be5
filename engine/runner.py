"""Qwen3's forward pass over one flattened step, on a paged KV cache, made of chapter functions.

The step's N tokens run as one [N, H] batch through every token-wise layer (ch15's
linear, ch20's norms and MLP, ch19's q/k norm and RoPE); only attention needs the
sequences apart. Each layer writes the step's K/V into the paged cache with ch25's
`store_kv`, then attends sequence by sequence on the path its rows take (`engine.attention`:
ch22's FlashAttention for a first chunk, the dense masked path of ch16 and ch17 for a chunk
after cached tokens, ch18's GQA for a decode). Logits are computed only for the rows the
step samples (ch28's `logits_indices`, and every row of a request with drafts).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from engine.attention import attend
from engine.model import Model
from engine.moe import ExpertParallel, ExpertParallelSettings
from engine.parts import Parts
from engine.words import tr


@dataclass
class Step:
    """One step's execution metadata (ch29's prepare_inputs, ch26's varlen_metadata, ch28's logits_indices, and the
    attention paths of `engine.attention`)."""

    input_ids: torch.Tensor  # [N] int64
    positions: torch.Tensor  # [N] int64
    slot_mapping: torch.Tensor  # [N] int64
    cu_q: list[int]  # B + 1 row offsets (cu_seqlens_q)
    cu_k: list[int]  # B + 1 key offsets (cu_seqlens_k)
    paths: list[str]  # B attention paths: prefill, chunk or decode
    read_slots: list[torch.Tensor | None]  # B: the cache slots of every key a chunk or decode row reads
    kv_heads: list[int]  # Hq: the K/V head of each query head (ch18's kv_head_for)
    sample_rows: torch.Tensor  # rows whose logits are computed: ch28's, and every row of a request with drafts
    seq_ids: list[int]  # B request ids, in row order
    traced_seq: int | None = None


@dataclass
class Probe:
    """What a comparison reads: per stage name ("embedding", "layer 0" …, "final norm") the step's rows."""

    stages: dict[str, torch.Tensor] = field(default_factory=dict)
    logits: torch.Tensor | None = None


class Trace:
    """Records which function ran at each stage of the traced steps, with the shapes it saw (plain data)."""

    def __init__(self) -> None:
        self.on = False
        self.kind = ""
        self.events: list[dict] = []
        self.calls: dict[str, int] = {}
        """How often each chapter function ran in the whole run, by its label ("ch22.2 flash_attention")."""

    def count(self, part: Any) -> None:
        self.calls[part.label] = self.calls.get(part.label, 0) + 1

    def record(self, stage: str, part: Any, shapes: str) -> None:
        """Keep the first call of each stage per traced step (layer 0 stands for every layer)."""
        if self.on and not any(e["stage"] == stage and e["kind"] == self.kind for e in self.events):
            self.events.append(
                {
                    "kind": self.kind,
                    "stage": stage,
                    "chapter": part.chapter,
                    "task": part.task,
                    "fn": part.name,
                    "source": part.source,
                    "shapes": shapes,
                }
            )


def shape(x: Any) -> str:
    """A value's shape as the figure prints it: [12, 64], a tuple's parts joined, a scalar as itself."""
    if isinstance(x, torch.Tensor):
        return f"[{', '.join(map(str, x.shape))}]"
    if isinstance(x, (tuple, list)) and x and all(isinstance(t, torch.Tensor) for t in x):
        return " | ".join(shape(t) for t in x)
    if isinstance(x, list):
        return f"list[{len(x)}]"
    return type(x).__name__ if x is not None else "None"


def ints(x: Any, most: int = 8) -> str:
    """A short integer list or tensor as its values, a longer one as its shape."""
    values = x.tolist() if isinstance(x, torch.Tensor) else list(x)
    return str(values) if len(values) <= most else tr("[{n} values]", n=len(values))


class ModelRunner:
    """Runs steps of one model with one set of parts over a paged cache of `num_blocks` × `block_size` tokens."""

    def __init__(self, model: Model, parts: Parts, *, num_blocks: int, block_size: int, trace: Trace) -> None:
        c = model.config
        self.model, self.parts, self.trace, self.block_size = model, parts, trace, block_size
        cache_shape = (c.num_hidden_layers, num_blocks, block_size, c.num_key_value_heads, c.head_dim)
        self.k_cache = torch.zeros(cache_shape, dtype=c.torch_dtype)
        self.v_cache = torch.zeros(cache_shape, dtype=c.torch_dtype)

    def call(self, stage: str, name: str, *args: Any, shapes: Callable[[Any], str] | None = None) -> Any:
        """Call the part `name` for `stage`, recording the shapes it saw when this step is traced."""
        part = self.parts[name]
        out = part.fn(*args)
        self.trace.count(part)
        if self.trace.on:
            seen = shapes(out) if shapes else " · ".join(shape(a) for a in args if isinstance(a, torch.Tensor))
            self.trace.record(stage, part, seen if shapes else f"{seen} → {shape(out)}")
        return out

    @torch.inference_mode()
    def forward(self, step: Step, *, probe: Probe | None = None) -> torch.Tensor:
        """Logits [R, V] of the rows at step.sample_rows; `probe` collects every stage's rows."""
        c, w = self.model.config, self.model
        N, Hq, Hkv, d = step.input_ids.numel(), c.num_attention_heads, c.num_key_value_heads, c.head_dim
        h = self.call("embed_tokens", "embedding_lookup", w.embed, step.input_ids)
        if probe is not None:
            probe.stages["embedding"] = h.float().clone()
        residual = None
        for layer, lw in enumerate(w.layers):
            x, residual = self.call("input_layernorm", "add_rms_norm", h, residual, lw.input_norm, c.rms_norm_eps)
            qkv = self.call("qkv_proj", "linear", x, lw.qkv)
            q, k, v = self.call("split q | k | v", "split_qkv", qkv, Hq, Hkv, d, shapes=lambda out: f"{shape(qkv)} → {shape(out)}")
            q, k = self.call(
                "q/k norm + RoPE",
                "qk_norm_rope",
                q.reshape(N, Hq, d),
                k.reshape(N, Hkv, d),
                lw.q_norm,
                lw.k_norm,
                step.positions,
                c.rope_theta,
                c.rms_norm_eps,
                shapes=lambda out: tr(
                    "q {q} · k {k} at positions {positions}; V untouched", q=shape(out[0]), k=shape(out[1]), positions=ints(step.positions)
                ),
            )
            v = v.reshape(N, Hkv, d)
            self.call(
                "write K/V to the cache",
                "store_kv",
                self.k_cache[layer],
                self.v_cache[layer],
                k,
                v,
                step.slot_mapping,
                shapes=lambda _: tr("{kv} ×2 → cache {cache}", kv=shape(k), cache=shape(self.k_cache[layer])),
            )
            o = attend(self, layer, q, k, v, step)
            h = self.call("o_proj", "linear", o.reshape(N, Hq * d), lw.o_proj)
            x, residual = self.call("post_attention_layernorm", "add_rms_norm", h, residual, lw.post_norm, c.rms_norm_eps)
            h = self._mlp(layer, lw, x)
            if probe is not None:
                probe.stages[f"layer {layer}"] = (h.float() + residual.float()).clone()
        h, _ = self.call("final norm", "add_rms_norm", h, residual, w.norm, c.rms_norm_eps)
        if probe is not None:
            probe.stages["final norm"] = h.float().clone()
        logits = self.call("lm_head", "linear", h[step.sample_rows], w.lm_head)
        if probe is not None:
            probe.logits = logits.float().clone()
        return logits

    expert_parallel: ExpertParallel | None = None
    """A Qwen3-MoE run's expert placement and load history (set by the loop; engine.moe)."""

    def _mlp(self, layer: int, lw: Any, x: torch.Tensor) -> torch.Tensor:
        """The layer's feed-forward block: ch20's SwiGLU MLP, or where the layer has one a mixture of experts over
        simulated expert-parallel ranks (ch31's route_topk, dispatch, combine; engine.moe)."""
        if lw.moe is None:
            return self.call("mlp (SwiGLU)", "swiglu_mlp", x, lw.gate_up, lw.down)
        if self.expert_parallel is None:
            self.expert_parallel = ExpertParallel(self.model.config, ExpertParallelSettings(), self.call)
        return self.expert_parallel.forward(layer, lw.moe, x)
