"""Attention over the paged KV cache: which chapter computes each sequence's attention, by the kind of its rows.

A step's rows are cut per sequence (ch26's cu_seqlens), and each sequence takes one of three paths:

- **prefill**, the first chunk of a sequence with nothing cached before it: ch22's `flash_attention`, one query
  head at a time on the step's own K/V (nano-vllm hands flash-attn the fresh k and v when no sequence of the step
  has a cached prefix, `nanovllm/layers/attention.py`); ch18's `kv_head_for` names each query head's K/V head.
- **chunk**, new tokens after cached ones (a chunked-prefill continuation, the rest of a prompt after a prefix hit,
  a speculative step's newest token and its drafts): the dense path. K/V are read back from the cache, ch16's
  `split_heads` puts the heads in front, ch17's `causal_mask_with_offset` gives the mask of a chunk after its
  cached prefix, ch16's `attention_steps` runs each head, `merge_heads` puts them side by side again.
- **decode**, one new token: ch18's `gqa_attention` over every key of the sequence, read back from the cache
  through the block table and length that ch26's padded decode buffers hold for its row.

The course simplifies: real engines run one batched kernel per step (flash-attn's varlen and paged-KV calls); here
each sequence (and, where the chapter's function takes one head, each head) is a call of its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from engine.words import tr

if TYPE_CHECKING:
    from engine.runner import ModelRunner, Step

PREFILL, CHUNK, DECODE = "prefill", "chunk", "decode"
FLASH_BLOCK = 128
"""Rows per query and key tile of ch22's FlashAttention (flash-attn's own tiles are 64–128 rows; on a CPU a larger
tile means fewer Python iterations, the same values)."""


def path_of(num_new: int, num_cached: int) -> str:
    """The path of a sequence that computes `num_new` tokens after `num_cached` whose K/V the cache holds."""
    if num_cached == 0:
        return PREFILL
    return DECODE if num_new == 1 else CHUNK


def attend(runner: ModelRunner, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, step: Step) -> torch.Tensor:
    """One layer's attention output [N, Hq, d] for the step's queries q [N, Hq, d] (k, v: the step's own [N, Hkv, d],
    already written to the cache)."""
    cu_q = step.cu_q
    spans: list[tuple[int, int] | None] = []  # every cached key the step reads, gathered once per layer, then cut
    read: list[torch.Tensor] = []
    start = 0
    for slots in step.read_slots:
        if slots is None:
            spans.append(None)
            continue
        spans.append((start, start + len(slots)))
        start += len(slots)
        read.append(slots)
    if read:
        index = torch.cat(read)
        k_read = runner.k_cache[layer].flatten(0, 1).index_select(0, index)  # [keys read, Hkv, d]
        v_read = runner.v_cache[layer].flatten(0, 1).index_select(0, index)
    trace, traced = runner.trace, runner.trace.on
    outs = []
    for b, path in enumerate(step.paths):
        runner.trace.on = traced and step.seq_ids[b] == step.traced_seq
        rows = slice(cu_q[b], cu_q[b + 1])
        span = spans[b]
        if path == PREFILL or span is None:
            outs.append(_prefill(runner, q[rows], k[rows], v[rows], step.kv_heads))
        else:
            keys, values = k_read[span[0] : span[1]], v_read[span[0] : span[1]]
            outs.append(_chunk(runner, q[rows], keys, values) if path == CHUNK else _decode(runner, q[rows], keys, values))
    trace.on = traced
    return torch.cat(outs) if outs else q.new_zeros(q.shape)


def _prefill(runner: ModelRunner, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_heads: list[int]) -> torch.Tensor:
    """ch22's FlashAttention, head by head, on the chunk's own K/V (the causal mask is ch22's own)."""
    heads = []
    for h, kv in enumerate(kv_heads):
        out, _ = runner.call(
            "attention: prefill (FlashAttention)",
            "flash_attention",
            q[:, h],
            k[:, kv],
            v[:, kv],
            True,
            FLASH_BLOCK,
            FLASH_BLOCK,
            shapes=lambda r: tr(
                "head {head} ← K/V head {kv}: q {q} · k {k} → out {out} + lse",
                head=h,
                kv=kv,
                q=_dims(q[:, 0]),
                k=_dims(k[:, 0]),
                out=_dims(r[0]),
            ),
        )
        heads.append(out)
    return torch.stack(heads, dim=1)


def _chunk(runner: ModelRunner, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """The dense path: ch16's split/merge of heads and its attention steps, under ch17's offset mask."""
    T, Hq, d = q.shape
    S, Hkv, _ = keys.shape
    # ch16 takes a batch [B, T, H·d]: this sequence is a batch of one.
    qh = runner.call("split heads", "split_heads", q.reshape(1, T, Hq * d), Hq)[0]
    kh = runner.call("split heads", "split_heads", keys.reshape(1, S, Hkv * d), Hkv)[0]
    vh = runner.call("split heads", "split_heads", values.reshape(1, S, Hkv * d), Hkv)[0]
    mask = runner.call(
        "mask (chunk after a cached prefix)",
        "causal_mask_with_offset",
        T,
        S - T,
        shapes=lambda m: tr("{new} new after {cached} cached → mask {mask}", new=T, cached=S - T, mask=_dims(m)),
    )
    group = Hq // Hkv
    outs = [
        runner.call(
            "attention: chunk (dense, masked)",
            "attention_steps",
            qh[h],
            kh[h // group],
            vh[h // group],
            mask,
            shapes=lambda r: f"q {_dims(qh[0])} · k {_dims(kh[0])} → scores {_dims(r['scores'])} → out {_dims(r['out'])}",
        )["out"]
        for h in range(Hq)
    ]
    merged = runner.call("merge heads", "merge_heads", torch.stack(outs)[None])
    return merged.reshape(T, Hq, d)


def _decode(runner: ModelRunner, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """ch18's grouped-query attention of the new token over every key of its sequence."""
    return runner.call("attention: decode (GQA over the cache)", "gqa_attention", q, keys, values)


def _dims(t: torch.Tensor) -> str:
    return f"[{', '.join(map(str, t.shape))}]"
