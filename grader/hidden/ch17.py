"""Hidden checks of ch17 · causal masks: random sizes from the grading seed, edge cases, large
masks, and agreement with torch's scaled_dot_product_attention."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from grader.authoring import CheckFailed, Trial, first_wrong, fmt, hidden
from grader.checks.ch17 import expect_mask, expect_mask_structure, inputs_line, mask_problem, run_offset_case, run_whole_case
from grader.i18n import tr

# -- 17.1 -------------------------------------------------------------------------------------


@hidden("ch17.1", "random lengths from the grading seed")
def random_lengths(t: Trial) -> None:
    for _ in range(12):
        run_whole_case(t, t.random.randint(0, 300))


@hidden("ch17.1", "a long sequence (T = 2500)")
def long_sequence(t: Trial) -> None:
    run_whole_case(t, 2500)


@hidden("ch17.1", "agrees with scaled_dot_product_attention(is_causal=True)")
def agrees_with_sdpa(t: Trial) -> None:
    for _ in range(3):
        sdpa_agreement(t, t.random.randint(1, 40), 0, t.random.choice([1, 2, 4]), t.random.choice([4, 8, 16]), whole=True)


# -- 17.2 -------------------------------------------------------------------------------------


@hidden("ch17.2", "num_cached 0 equals causal_mask of the chunk")
def no_cache_equals_whole(t: Trial) -> None:
    for n in [1, 2] + [t.random.randint(3, 200) for _ in range(4)]:
        got = t.yours.causal_mask_with_offset(n, 0)
        expect_mask(got, t.ref.causal_mask(n), n, 0, whole=False)


@hidden("ch17.2", "no new tokens: an empty [0, num_cached] mask")
def no_new_tokens(t: Trial) -> None:
    for c in (0, 1, 7, t.random.randint(8, 500)):
        run_offset_case(t, 0, c)


@hidden("ch17.2", "random chunks and decode steps from the grading seed")
def random_chunks(t: Trial) -> None:
    for _ in range(16):
        num_new = 1 if t.random.random() < 0.3 else t.random.randint(1, 120)
        run_offset_case(t, num_new, t.random.randint(0, 300))


@hidden("ch17.2", "a long chunk: 2048 new tokens after 3000 cached")
def long_chunk_after_long_prefix(t: Trial) -> None:
    run_offset_case(t, 2048, 3000)


@hidden("ch17.2", "agrees with scaled_dot_product_attention on a chunk after a prefix")
def offset_agrees_with_sdpa(t: Trial) -> None:
    cases = [
        (t.random.randint(2, 24), t.random.randint(1, 40)),
        (1, t.random.randint(1, 60)),
        (t.random.randint(20, 60), t.random.randint(1, 10)),
    ]
    for num_new, num_cached in cases:
        sdpa_agreement(t, num_new, num_cached, t.random.choice([1, 2, 4]), t.random.choice([4, 8, 16]), whole=False)


# -- helpers -------------------------------------------------------------------------------------


def sdpa_agreement(t: Trial, num_new: int, num_cached: int, heads: int, dim: int, *, whole: bool) -> None:
    """The student's mask as `attn_mask` for the new queries against all keys must reproduce the last
    num_new rows of full causal attention over the whole sequence (float64, so only the mask can differ)."""
    s = num_cached + num_new
    q, k, v = (torch.randn(heads, s, dim, generator=t.rng, dtype=torch.float64) for _ in range(3))
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True)[:, num_cached:]
    if whole:
        got, want = t.yours.causal_mask(num_new), t.ref.causal_mask(num_new)
    else:
        got = t.yours.causal_mask_with_offset(num_new, num_cached)
        want = t.ref.causal_mask_with_offset(num_new, num_cached)
    mask = expect_mask_structure(got, want, num_new, num_cached, whole=whole)
    out = F.scaled_dot_product_attention(q[:, num_cached:], k, v, attn_mask=mask)
    idx = first_wrong(out, full, atol=1e-9, rtol=1e-9)
    if idx is None:
        return
    h, i, d = idx
    call = (
        tr("scaled_dot_product_attention(q, k, v, attn_mask=your mask)")
        if whole
        else tr("scaled_dot_product_attention(q[{c}:], k, v, attn_mask=your mask)", c=num_cached)
    )
    problem = mask_problem(mask, want, num_new, num_cached, whole) or CheckFailed()
    setup = (
        tr(
            "{inputs}; {heads} heads of head_dim {dim}, random float64 q, k, v",
            inputs=inputs_line(num_new, num_cached, whole),
            heads=heads,
            dim=dim,
        )
        if heads > 1
        else tr("{inputs}; 1 head of head_dim {dim}, random float64 q, k, v", inputs=inputs_line(num_new, num_cached, whole), dim=dim)
    )
    raise problem.within(
        setup,
        tr("{call} must equal is_causal=True attention over the {s} tokens", call=call, s=s)
        if whole
        else tr(
            "{call} must equal the last {n} rows of scaled_dot_product_attention(q, k, v, is_causal=True) over all {s} tokens",
            call=call,
            n=num_new,
            s=s,
        ),
        tr(
            "head {h}, output row {i} (position {p}), component {d}: expected {expected}, yours {yours}",
            h=h,
            i=i,
            p=num_cached + i,
            d=d,
            expected=fmt(full[idx]),
            yours=fmt(out[idx]),
        ),
        *(
            [
                tr(
                    "note: this top-left triangle is what SDPA's own is_causal=True uses when L ≠ S; flash-attn ≥ 2.1, "
                    "and nano-vllm through it, aligns the triangle to the bottom-right"
                )
            ]
            if num_cached and torch.equal(mask, torch.ones_like(mask).tril())
            else []
        ),
    )
