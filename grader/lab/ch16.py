"""Experiments of ch16 · attention, step by step."""

from __future__ import annotations

import torch

from grader.authoring import CheckFailed, Trial, expect_tensor, wrong_mask
from grader.checks.ch16 import call_merge, explain_merge, explain_split, merge_hint, numbered, split_hint
from grader.i18n import mark, tr
from grader.lab import Int, ask, experiment
from grader.lab.draw import MAX_WIDTH


def numbered_heads(B: int, H: int, T: int, d: int) -> torch.Tensor:
    """[B, H, T, d] whose element (b, h, t, j) is the number of x[b, t, h·d + j] in numbered x [B, T, H·d]:
    the heads of x, as attention hands them back."""
    b, h, t, j = torch.meshgrid(*(torch.arange(n) for n in (B, H, T, d)), indexing="ij")
    return (((b * T + t) * H + h) * d + j).float()


def _panels_width(T: int, H: int, d: int) -> int:
    """How wide ch16-dim-split-heads draws its three panels (x, the view, the heads) side by side, margins included."""
    W = H * d
    return (W * 34 + (H - 1) * 10) + (T * d * 34 + (T - 1) * 18) + (H * d * 34 + (H - 1) * 24) + 290


def _constraints(p: dict) -> dict[str, str]:
    B, T, H, d, k = p["B"], p["T"], p["H"], p["d"], p["traced"]
    n = B * T * H * d
    if k >= n:
        return {"traced": tr("x holds the numbers 0 … {last}; pick one of them", last=n - 1)}
    if _panels_width(T, H, d) > MAX_WIDTH:
        return {
            "d": tr(
                "T = {T}, H = {H}, d = {d} make the split figure {width} px wide (at most {most}); make T, H or d smaller",
                T=T,
                H=H,
                d=d,
                width=_panels_width(T, H, d),
                most=MAX_WIDTH,
            )
        }
    return {}


def _captions(p: dict) -> dict[str, tuple[str, ...]]:
    B, T, H, d, k = p["B"], p["T"], p["H"], p["d"], p["traced"]
    W, n = H * d, B * T * H * d
    shown = f"(图中画出编号 {k} 所在的那条序列)" if B > 1 else ""
    shown_en = f" (the figure draws the sequence that holds #{k})" if B > 1 else ""
    return {
        "ch16-dim-split-heads": (
            f"编号 0 至 {n - 1} 的 [{B}, {T}, {W}] 先 view 成 [{B}, {T}, {H}, {d}],再 transpose 成 [{B}, {H}, {T}, {d}];"
            f"逐 head 画出矩阵,并追踪编号 {k} 的三套坐标{shown}。",
            f"The numbers 0–{n - 1} as [{B}, {T}, {W}] are viewed as [{B}, {T}, {H}, {d}], then transposed to "
            f"[{B}, {H}, {T}, {d}]; each head is drawn as a matrix, and element #{k} is traced through its three "
            f"coordinate triples{shown_en}.",
        ),
        "ch16-dim-merge-heads": (
            f"同一组 {T * W} 个编号分别按 transpose 后合头与直接 reshape 排列:直接 reshape 把不同 token 的值混到一行{shown}。",
            f"The same {T * W} numbers merged back by transpose-then-reshape and by a bare reshape: the bare reshape "
            f"mixes values of different tokens into one row{shown_en}.",
        ),
    }


def _layout(got, shape: list[int], what: str, header: str, hint) -> torch.Tensor:
    """A tensor of the expected shape and dtype, or the chapter's hint about the layout it has."""
    try:
        return expect_tensor(got, what=what, shape=shape, dtype=torch.float32)
    except CheckFailed as e:
        raise CheckFailed(header, *e.lines, hint=hint(got) if isinstance(got, torch.Tensor) else "") from None


@experiment(
    "heads",
    title=mark("split and merge heads"),
    about=mark(
        "Change B, T, H and d and pick a number of x: follow it through your split_heads (view, then "
        "transpose) and back through your merge_heads, beside the bare reshape that mixes tokens."
    ),
    figures=("ch16-dim-split-heads", "ch16-dim-merge-heads"),
    calls=("split_heads", "merge_heads"),
    params=[
        Int("B", mark("B (sequences)"), 1, 1, 2),
        Int("T", mark("T (tokens)"), 3, 1, 4),
        Int("H", mark("H (heads)"), 2, 1, 4),
        Int("d", mark("d (head width)"), 2, 1, 3),
        Int("traced", mark("traced number"), 2, 0, 95),
    ],
    constraints=_constraints,
    captions=_captions,
    varies=mark(
        "With B = 2 the figures draw one sequence of the batch, the one holding the traced number; their "
        "coordinates index it as sequence 0."
    ),
)
def heads(t: Trial, p: dict) -> None:
    B, T, H, d, k = p["B"], p["T"], p["H"], p["d"], p["traced"]
    W, case = H * d, mark("your instance")
    b = k // (T * W)  # the sequence the figures draw
    x = numbered((B, T, W))
    inputs = f"x [{B}, {T}, {W}] = [B, T, H·d], num_heads={H} → [B, H, T, d] = [{B}, {H}, {T}, {d}]"
    header = tr('case "{case}": {inputs}', case=tr(case), inputs=inputs)
    out = _layout(t.yours.split_heads(x, H), [B, H, T, d], tr("the heads"), header, lambda g: split_hint(g, x, H))
    heads_in = numbered_heads(B, H, T, d)  # x's numbers name their places: its heads are known without a reference
    want = ask(t, lambda ref: ref.split_heads(x, H))
    expected = heads_in if want is None else want
    t.figure(
        "ch16-dim-split-heads",
        x=x[b : b + 1],
        num_heads=H,
        traced=k,
        yours=out[b : b + 1],
        expected=expected[b : b + 1],
        wrong=wrong_mask(out, expected)[b : b + 1],
    )
    header = tr('case "{case}": {inputs}', case=tr(case), inputs=f"x [{B}, {H}, {T}, {d}] = [B, H, T, d] → [B, T, H·d] = [{B}, {T}, {W}]")
    merged = _layout(call_merge(t, heads_in, case), [B, T, W], tr("the merged heads"), header, lambda g: merge_hint(g, heads_in))
    want_m = ask(t, lambda ref: ref.merge_heads(heads_in))
    expected_m = x if want_m is None else want_m  # the heads of x merge back to x
    t.figure(
        "ch16-dim-merge-heads",
        heads=heads_in[b : b + 1],
        yours=merged[b : b + 1],
        expected=expected_m[b : b + 1],
        wrong=wrong_mask(merged, expected_m)[b : b + 1],
        bare=heads_in.reshape(B, T, W)[b : b + 1],
    )
    explain_split(out, x, expected, H, case)
    explain_merge(merged, heads_in, expected_m, case)
