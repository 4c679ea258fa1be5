"""ch22's closed-form models, for the explanations of its public and hidden checks (never shipped).

Naive attention and FlashAttention in float64 with the knobs a misconception turns, the tiles a causal
loop visits, and the running max and sum of every row after every tile. Public checks reach them through
`grader.authoring.hidden_model` drivers (`t.ref.drive(...)`), so a student release holds only what they gave
for its fixed instances.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def end_aligned(T: int, S: int) -> torch.Tensor:
    """The ch17 offset mask [T, S]: query i is at position S − T + i and sees keys 0 … S − T + i."""
    return torch.ones(T, S, dtype=torch.bool).tril(S - T)


# -- 22.1 naive attention ----------------------------------------------------------------------------


def naive_model(q, k, v, allowed, scale, fill=float("-inf"), dim=-1):
    """(scores, probs, out) of naive attention in float64 under a mask, a scale, a fill value and a softmax dim."""
    s = (q.double() @ k.double().T) * scale
    if allowed is not None:
        s = s.masked_fill(~allowed, fill)
    p = s.softmax(dim=dim)
    return s, p, p @ v.double()


def naive_masks(T: int, S: int, causal: bool) -> dict:
    """The right mask ("") and the masks a misconception gives, by the key `grader.checks.ch22.mask_whys` uses."""
    masks = {"": end_aligned(T, S) if causal else None}
    if causal and S > T:
        masks["top-left"] = torch.ones(T, S, dtype=torch.bool).tril()
    if causal:
        masks["no mask"] = None
    else:
        masks["mask"] = end_aligned(T, S)
    return masks


def naive_variants(ref, q, k, v, causal: bool) -> dict:
    """{"mask|scale|other": (scores, probs, out)} for every wrong combination, and the output without softmax."""
    (T, d), S = q.shape, k.shape[0]
    scales = {"": d**-0.5, "unscaled": 1.0, "1/d": 1.0 / d}
    others: dict[str, dict[str, Any]] = {"": {}, "fill 0": {"fill": 0.0}, "dim 0": {"dim": 0}}
    out = {}
    for m, allowed in naive_masks(T, S, causal).items():
        for s, scale in scales.items():
            for o, kw in others.items():
                if (m, s, o) == ("", "", "") or ("fill" in kw and allowed is None):
                    continue
                out[f"{m}|{s}|{o}"] = naive_model(q, k, v, allowed, scale, **kw)
    scores = naive_model(q, k, v, end_aligned(T, S) if causal else None, d**-0.5)[0]
    return {"combos": out, "no softmax": scores.nan_to_num(neginf=0.0) @ v.double()}


def traffic_variants(ref, T: int, S: int, d: int, b: int, flash: bool) -> dict:
    """The byte counts the misconceptions of `grader.checks.ch22.traffic_hint` give, by name."""
    io = (2 * T * d + 2 * S * d) * b
    return {
        "naive": io + 4 * T * S * b,
        "flash": io + 4 * T,
        "io": io,
        "lse at dtype_bytes": io + T * b,
        "flash without O": (T * d + 2 * S * d) * b + 4 * T,
        "naive, one crossing": io + 2 * T * S * b,
        "naive, three crossings": io + 3 * T * S * b,
        "naive without O": (T * d + 2 * S * d + 4 * T * S) * b,
    }


# -- 22.2 FlashAttention -----------------------------------------------------------------------------


def tiles_to_visit(T: int, S: int, bq: int, bk: int, causal: bool, offset: int | None = None) -> list[tuple]:
    """The (qb, kb) tiles holding at least one visible score, query block by query block."""
    off = S - T if offset is None else offset
    return [(qb, kb) for qb in range(-(-T // bq)) for kb in range(-(-S // bk)) if not causal or kb * bk <= off + min(qb * bq + bq, T) - 1]


def flash_model(
    q,
    k,
    v,
    causal: bool,
    bq: int,
    bk: int,
    *,
    scale: float | None = None,
    offset: int | None = None,
    rescale_acc: bool = True,
    rescale_l: bool = True,
    mask_tiles: bool = True,
    full_k_blocks: bool = False,
    running_max: bool = True,
) -> tuple:
    """What the tiled computation yields, and what a misconception turns it into, in closed form (float64).

    It builds the whole [T, S] score matrix and reads off, per query row, the running max M after each key
    block (a cumulative max over the blocks' maxima) and the running sum
    l = Σ_{blocks ≤ kb} rowsum(exp(s − M_block))·exp(M_block − M_kb), which is what the per-tile updates
    telescope to. Returns (out, lse, trace) with trace [(qb, kb, m, l)] over the tiles the variant visits.
    """
    q, k, v = q.double(), k.double(), v.double()
    (T, d), S = q.shape, k.shape[0]
    scale = d**-0.5 if scale is None else scale
    off = S - T if offset is None else offset
    nk = -(-S // bk)
    tiles = tiles_to_visit(T, S, bq, bk, causal, offset=off)
    if full_k_blocks:
        tiles = [(qb, kb) for qb, kb in tiles if kb < S // bk]
    keys, rows = torch.arange(S), torch.arange(T)
    if not causal:
        visible = torch.ones(T, S, dtype=torch.bool)
    elif mask_tiles:
        visible = keys <= rows[:, None] + off
    else:  # whole visited tiles, nothing masked inside them
        visible = keys // bk * bk <= (off + ((rows // bq + 1) * bq).clamp(max=T) - 1)[:, None]
    if full_k_blocks:
        visible = visible & (keys < S // bk * bk)
    s = (q @ k.T * scale).masked_fill(~visible, -math.inf)
    pad = nk * bk - S
    s = torch.cat([s, torch.full((T, pad), -math.inf, dtype=torch.float64)], 1).view(T, nk, bk)
    vb = torch.cat([v, torch.zeros(pad, d, dtype=torch.float64)]).view(nk, bk, d)
    block_max = s.amax(-1)  # [T, nk]
    M = block_max.cummax(1).values if running_max else block_max  # running max after each block
    p = torch.exp(s - M[..., None])
    rowsum, pv = p.sum(-1), torch.einsum("tnb,nbd->tnd", p, vb)  # per block, relative to its M
    earlier = torch.ones(nk, nk, dtype=torch.bool).tril()  # [kb, kb'] with kb' ≤ kb
    factor = torch.where(earlier, torch.exp(M[:, None, :] - M[:, :, None]), 0.0)  # exp(M_kb' − M_kb)
    l = (factor if rescale_l else earlier.double()) * rowsum[:, None, :]
    l = l.sum(-1)  # [T, nk]: l after each block
    last = torch.tensor([max([kb for qb, kb in tiles if qb == i // bq], default=0) for i in range(T)])
    weight = (factor if rescale_acc else earlier.double().expand(T, nk, nk))[rows, last]
    weight = torch.where(torch.arange(nk) <= last[:, None], weight, 0.0)
    out = torch.einsum("tn,tnd->td", weight, pv) / l[rows, last][:, None]
    lse = M[rows, last] + torch.log(l[rows, last])
    trace = [(qb, kb, M[qb * bq : (qb + 1) * bq, kb].tolist(), l[qb * bq : (qb + 1) * bq, kb].tolist()) for qb, kb in tiles]
    return out, lse, trace


FLASH_KNOBS: dict[str, dict[str, Any]] = {
    "acc": {"rescale_acc": False},
    "l": {"rescale_l": False},
    "acc and l": {"rescale_acc": False, "rescale_l": False},
    "top-left": {"offset": 0},
    "whole tiles": {"mask_tiles": False},
    "causal flipped": {},
    "floor k blocks": {"full_k_blocks": True},
    "unscaled": {"scale": 1.0},
}
"""flash_model's knobs for each misconception `grader.checks.ch22_explain.flash_whys` names (plus "1/d")."""


def flash_models(ref, q, k, v, causal: bool, bq: int, bk: int) -> dict:
    """Everything ch22's FlashAttention explanations compare with, for one instance.

    "trace": the right [(qb, kb, m, l)] after every tile; "tiles": the tiles to visit, and those a top-left
    alignment ("top-left") or no causal skipping ("all") would visit; "variants": {misconception: (out, lse)};
    "trace without running max" and "trace without rescaled l": the per-tile statistics of those mistakes;
    "scores": q·kᵀ/√d, unmasked, for the figure.
    """
    (T, d), S = q.shape, k.shape[0]
    variants = {}
    for key, knobs in {**FLASH_KNOBS, "1/d": {"scale": 1.0 / d}}.items():
        c = (not causal) if key == "causal flipped" else causal
        out, lse, _ = flash_model(q, k, v, c, bq, bk, **knobs)
        variants[key] = (out, lse)
    return {
        "trace": flash_model(q, k, v, causal, bq, bk)[2],
        "tiles": {
            "visit": tiles_to_visit(T, S, bq, bk, causal),
            "top-left": tiles_to_visit(T, S, bq, bk, causal, offset=0),
            "all": tiles_to_visit(T, S, bq, bk, False),
        },
        "variants": variants,
        "trace without running max": flash_model(q, k, v, causal, bq, bk, running_max=False)[2],
        "trace without rescaled l": flash_model(q, k, v, causal, bq, bk, rescale_l=False)[2],
        "scores": (q @ k.T) * d**-0.5,
    }
