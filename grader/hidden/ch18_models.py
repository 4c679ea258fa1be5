"""ch18's model of per-head attention, with the groupings, masks and scales a misconception gives (never
shipped).

`grader.checks.ch18` names each misconception and compares; the values come from here, through
`grader.authoring.hidden_model` drivers, so a student release holds only those of its fixed instances.
"""

from __future__ import annotations

import itertools
import math

import torch


def end_aligned(T: int, S: int) -> torch.Tensor:
    """The ch17 offset mask [T, S]: query i sees keys 0 … S − T + i."""
    return torch.ones(T, S, dtype=torch.bool).tril(S - T)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_of: list[int], allowed: torch.Tensor | None, scale: float) -> torch.Tensor:
    """Plain per-head attention (float64, K/V gathered per head), for a grouping, a mask and a scale."""
    kk, vv = k[:, kv_of].double(), v[:, kv_of].double()
    s = torch.einsum("thd,shd->hts", q.double(), kk) * scale
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hts,shd->thd", s.softmax(-1), vv).to(q.dtype)


def gqa_variants(ref, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None) -> dict:
    """{"grouping|mask|scale": output} for every wrong combination `grader.checks.ch18.attention_hints` names."""
    (T, Hq, d), (S, Hkv, _) = q.shape, k.shape
    group = Hq // Hkv
    right = d**-0.5 if scale is None else scale
    groupings = {"": [h // group for h in range(Hq)]}
    if Hkv > 1 and group > 1:
        groupings["interleaved"] = [h % Hkv for h in range(Hq)]
        if all(h // Hkv < Hkv for h in range(Hq)) and group != Hkv:
            groupings["by num_kv_heads"] = [h // Hkv for h in range(Hq)]
    masks = {"": end_aligned(T, S) if causal else None}
    if causal:
        if S > T:
            masks["top-left"] = torch.ones(T, S, dtype=torch.bool).tril()
        masks["no mask"] = None
    else:
        masks["mask"] = end_aligned(T, S)
    scales = {"": right}
    if scale is not None and not math.isclose(scale, d**-0.5):
        scales["default"] = d**-0.5
    scales.update({"unscaled": 1.0, "1/d": 1.0 / d, "1/√(Hq·d)": (Hq * d) ** -0.5})
    scales = {key: s for key, s in scales.items() if key == "" or not math.isclose(s, right)}
    out = {}
    for (g, kv_of), (m, allowed), (s, value) in itertools.product(groupings.items(), masks.items(), scales.items()):
        if g or m or s:
            out[f"{g}|{m}|{s}"] = attend(q, k, v, kv_of, allowed, value)
    return out


def gqa_figure(ref, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> dict:
    """The figure instance's intermediates (one K/V head): the causal mask, q·k per head, the weights."""
    T, S, d = q.shape[0], k.shape[0], q.shape[-1]
    allowed = end_aligned(T, S)
    dots = torch.einsum("thd,sd->hts", q, k[:, 0])
    weights = (dots * d**-0.5).masked_fill(~allowed, float("-inf")).softmax(-1)
    return {"allowed": allowed, "dots": dots, "weights": weights}
