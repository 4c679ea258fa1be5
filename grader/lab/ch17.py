"""Experiments of ch17 · causal masks."""

from __future__ import annotations

import torch

from grader.authoring import Trial, expect_tensor
from grader.checks.ch17 import expect_causal, expect_mask, expect_mask_structure
from grader.i18n import mark, tr
from grader.lab import Int, ask, expected_or_own, experiment

MAX_KEYS = 8


def _constraints(p: dict) -> dict[str, str]:
    S = p["num_cached"] + p["num_new"]
    return {"num_new": tr("{s} keys in all are too many to draw (at most {most})", s=S, most=MAX_KEYS)} if S > MAX_KEYS else {}


def _captions(p: dict) -> dict[str, tuple[str, ...]]:
    c, n = p["num_cached"], p["num_new"]
    s = c + n
    positions = "、".join(str(c + i) for i in range(n))
    return {
        "ch17-causal-mask": (
            f"{s} 个 token 的完整序列:第 i 行是位置 i 的 query,只能看见第 0…i 列的 key。上三角(j > i,未来的 token)被屏蔽;"
            "对角线保留,因为位置 i 的输出要预测第 i + 1 个 token,它必须看见自己。",
            f"The causal mask of a whole sequence of {s} tokens: row i is the query at position i and may attend keys "
            "0 … i. The upper triangle (j > i, the future) is masked; the diagonal is kept, because the output at "
            "position i predicts token i + 1 and must see token i itself.",
        ),
        "ch17-offset-mask": (
            f"{c} 个 token 已在 KV 缓存中,这一步只算 {n} 个新 token:它们的绝对位置是 {positions},所以 [{n}, {s}] 的 mask 是"
            f"完整 {s} × {s} 因果遮罩的最后 {n} 行(tril 取 diagonal = {c},对齐右下角),不能照搬从左上角开始的 tril。",
            f"A chunk after a cached prefix needs its position offset: {c} tokens are cached and {n} new ones are "
            f"computed, at absolute positions {', '.join(str(c + i) for i in range(n))}, so the [{n}, {s}] mask is the "
            f"last {n} rows of the full {s} × {s} causal mask (tril with diagonal = {c}, aligned to the bottom-right), "
            "not a tril taken from the top-left corner.",
        ),
    }


@experiment(
    "masks",
    title=mark("causal mask with an offset"),
    about=mark(
        "Change how many tokens are cached and how many are new: your causal_mask draws the whole "
        "sequence, your causal_mask_with_offset the chunk, which must be its last rows."
    ),
    figures=("ch17-causal-mask", "ch17-offset-mask"),
    calls=("causal_mask", "causal_mask_with_offset"),
    params=[Int("num_cached", "num_cached", 3, 0, 8), Int("num_new", "num_new", 2, 1, 8)],
    constraints=_constraints,
    captions=_captions,
)
def masks(t: Trial, p: dict) -> None:
    c, n = p["num_cached"], p["num_new"]
    s = c + n
    whole = t.yours.causal_mask(s)
    want = ask(t, lambda ref: ref.causal_mask(s))
    whole = (
        expect_mask_structure(whole, want, s, 0, whole=True)
        if want is not None
        else expect_tensor(whole, what=tr("the mask"), shape=[s, s], dtype=torch.bool)
    )
    t.figure("ch17-causal-mask", num_tokens=s, yours=whole, expected=expected_or_own(want, whole), checked=want is not None)
    chunk = t.yours.causal_mask_with_offset(n, c)
    want_c = ask(t, lambda ref: ref.causal_mask_with_offset(n, c))
    chunk = (
        expect_mask_structure(chunk, want_c, n, c, whole=False)
        if want_c is not None
        else expect_tensor(chunk, what=tr("the mask"), shape=[n, s], dtype=torch.bool)
    )
    t.figure("ch17-offset-mask", num_new=n, num_cached=c, yours=chunk, expected=expected_or_own(want_c, chunk), checked=want_c is not None)
    if want is not None:
        expect_mask(whole, want, s, 0, whole=True)
    else:
        expect_causal(whole, 0, whole=True)
    if want_c is not None:
        expect_mask(chunk, want_c, n, c, whole=False)
    else:
        expect_causal(chunk, c, whole=False)
