"""ch16 · attention, step by step: wrong submissions that embody real misconceptions fail with the
message that teaches the fix, their figures mark the wrong values, and the reference agrees with the
real conventions it claims (SDPA, nano-vllm's flatten, views without copies)."""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F
from figure_layout import reference_figures, transposes
from mutate import checks_not_passed, figure, mutant_grader, result, wrong_elements

from grader import chapters
from grader.authoring.compare import fmt
from grader.checks import ch16 as checks
from grader.hidden import ch16 as hidden
from grader.hidden import ch16_models as models
from grader.run import check
from solutions import ch16_attention_steps as ref

SEED = 16

SPLIT = "return x.view(B, T, num_heads, width // num_heads).transpose(1, 2)"


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return mutant_grader(tmp_path_factory, "ch16", SEED)


def texts(report, figure_id: str, cls: str | None = None) -> list[str]:
    """The texts of a figure (those of class `cls`, when given)."""
    return [
        el.text or ""
        for el in figure(report, figure_id).iter("{http://www.w3.org/2000/svg}text")
        if cls is None or cls in (el.get("class") or "").split()
    ]


# -- 16.1 split_heads ----------------------------------------------------------------------------


def test_reshape_without_transpose_is_explained_and_drawn(graded):
    # a reshape straight to [B, H, T, d]: the heads' rows mix the columns of different tokens
    report = graded.mistake("reshape_no_transpose")
    r = result(report, "figure instance: the numbers 0")
    assert r.status == "failed"
    x = checks.numbered()
    want = ref.split_heads(x, 2)
    assert "num_heads=2 → d = 4 // 2 = 2; the result is [B, H, T, d] = [1, 2, 3, 2]" in r.message
    assert (
        f"out[0, 0, 1, :] is head 0 of token 1, the columns h·d … h·d + d − 1 = 0 … 1 of row 1: "
        f"x[0, 1, 0:2] = {checks.vec(want[0, 0, 1])}; yours: {checks.vec(x[0, 0, 2:4])}, "
        f"which is head 1 of token 0 (x[0, 0, 2:4])"
    ) in r.message
    assert r.hints == ["reshape_no_transpose"]
    assert wrong_elements(report, "ch16-dim-split-heads")
    assert any("In your result #2 sits at out[0, 0, 1, 0]" in s for s in texts(report, "ch16-dim-split-heads"))
    # A single head is the one case a bare reshape gets right.
    assert result(report, "one head").status == "passed"
    assert {r.task for r in report.results if r.status != "passed"} == {"ch16.1"}


def test_wrong_axes_are_named_from_the_shape(graded):
    # transpose(2, 3) instead of transpose(1, 2): the width and head axes swapped, tokens left in place
    report = graded.mistake("wrong_axes", task="ch16.1")
    r = result(report, "figure instance: the numbers 0")
    assert "expected the heads as a 4-D float32 tensor of shape [1, 2, 3, 2]; yours: float32 tensor [1, 3, 2, 2]" in r.message
    assert r.hints == ["wrong_axes"] and "[B, T, d, H] (permute(0, 1, 3, 2))" in r.message
    # Where every size is alike the shape is right, and the values give it away.
    square = result(report, "T = H = d")
    assert square.status == "failed" and "which is not one head of one token of x" in square.message
    assert square.hints == ["wrong_axes"] and "permute(0, 1, 3, 2)" in square.message
    assert not any(p.endswith("ch16-dim-split-heads.svg") for p in report.figures), "no figure from a wrong shape"


@pytest.mark.parametrize("mistake", ["contiguous_copy", "stack_copy"])  # right values, every number copied
def test_a_copy_does_not_fit_the_measured_check(graded, mistake):
    report = graded.mistake(mistake, task="ch16.1")
    assert checks_not_passed(report) == ["the split is a view: no number is copied (measured)"]
    r = result(report, "the split is a view")
    x_bytes = math.prod(hidden.SPLIT_X) * 4
    assert f"x [2, 512, 4096] float32 is {x_bytes >> 20} MiB" in r.message
    used = re.search(r"your split_heads used about ([\d.]+) MiB beyond x, where this check allows 4 MiB \(line \d+: ", r.message)
    assert used, r.message
    assert x_bytes >> 20 <= float(used.group(1)) < 2 * (x_bytes >> 20), "the copy is measured: about one x beyond x"
    assert x_bytes >= 4 * hidden.SPLIT_SPARE, "a copy needs 4× the limit: no borderline verdicts"
    assert "nano-vllm's q.view(-1, num_heads, head_dim) is a view" in r.message
    assert r.hints == [mistake], "the hint names the copying call on that line, no other"
    assert not wrong_elements(report, "ch16-dim-split-heads")


def test_a_copy_made_with_dispatch_modes_switched_off_is_still_measured(graded):
    # Switching off torch's dispatch modes hid a copy from a recorder inside the student's process; the memory
    # limit is the kernel's, outside it.
    report = graded(
        "split_copy_unseen",
        (
            SPLIT,
            "import torch.utils._python_dispatch\n"
            "    with torch.utils._python_dispatch._disable_current_modes():\n"
            "        " + SPLIT + ".contiguous()",
        ),
        task="ch16.1",
    )
    assert checks_not_passed(report) == ["the split is a view: no number is copied (measured)"]
    used = re.search(r"used about ([\d.]+) MiB beyond x", result(report, "the split is a view").message)
    assert used and 16 <= float(used.group(1)) < 32, "one copy of x, measured"


def test_reference_passes_the_measured_check():
    r = result(check("ch16", solutions=True, task="ch16.1", hidden=True, seed=SEED), "the split is a view")
    assert r.status == "passed", r.message


def test_the_measured_check_counts_use_not_reservation(tmp_path):
    """A split that reserves 8 GiB of address space it never touches (as a CUDA build of torch does when it
    loads) passes: memory is what is used. One that touches a copy's worth of pages fails, and is measured."""
    source = (chapters.SOLUTIONS / "ch16_attention_steps.py").read_text()
    for name, extra, passes in (("reserves", "mmap.mmap(-1, 8 << 30)", True), ("touches", "bytearray(32 << 20)", False)):
        folder = tmp_path / name
        folder.mkdir()
        edited = source.replace(SPLIT, f"_kept = {extra}\n    " + SPLIT, 1).replace("import torch\n", "import mmap\nimport torch\n", 1)
        (folder / "ch16_attention_steps.py").write_text(edited)
        r = result(check("ch16", submission=folder, task="ch16.1", hidden=True, seed=SEED), "the split is a view")
        assert (r.status == "passed") is passes, r.message
        if not passes:
            assert re.search(r"used about (3[2-9]|4\d) MiB beyond x", r.message), r.message


# -- 16.2 merge_heads ----------------------------------------------------------------------------


def test_bare_reshape_mixes_tokens(graded):
    # reshape(B, T, H·d) without transpose(1, 2): each row takes consecutive tokens of one head
    report = graded.mistake("bare_reshape")
    r = result(report, "figure instance: [1, 2, 3, 2]")
    assert r.status == "failed"
    heads = ref.split_heads(checks.numbered(), 2)
    assert (
        f"out[0, 0, 2] is column 2 = 1·2 + 0 of token 0's row, i.e. head 1 of token 0: x[0, 1, 0, 0] = "
        f"{fmt(ref.merge_heads(heads)[0, 0, 2])}; yours: {fmt(heads.reshape(1, 3, 4)[0, 0, 2])}"
    ) in r.message
    assert "your row 0 holds, piece by piece: head 0 of token 0, head 0 of token 1 — values of 2 different tokens" in r.message
    assert r.hints == ["bare_reshape"]
    # With one token or one head there is nothing to mix: those cases pass.
    assert result(report, "one token, one head").status == "passed"
    assert result(report, "T = H: a bare reshape").status == "failed"
    assert wrong_elements(report, "ch16-dim-merge-heads")
    assert "✗ mixed" in texts(report, "ch16-dim-merge-heads")
    assert "ch16.1" not in {r.task for r in report.results if r.status != "passed"}


def test_view_after_transpose_is_explained(graded):
    # view() instead of reshape() after the transpose: torch refuses, the message says why
    report = graded.mistake("view_after_transpose", task="ch16.2")
    r = result(report, "figure instance: [1, 2, 3, 2]")
    assert r.status == "failed"
    assert "merge_heads raised RuntimeError: view size is not compatible" in r.message
    assert r.hints == ["view_after_transpose"]


def test_reference_merge_figure_marks_the_mixed_rows(tmp_path):
    report = check("ch16", solutions=True, seed=SEED, task="ch16.2", figures_dir=tmp_path)
    assert report.exit_code == 0
    mixed = texts(report, "ch16-dim-merge-heads", "mixed")
    assert "row 0 holds t0 and t1 of head 0" in mixed
    assert "row 1 holds t2 of head 0" in mixed and "and t0 of head 1" in mixed
    assert not wrong_elements(report, "ch16-dim-merge-heads")


# -- 16.3 attention_steps ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mistake, factor",
    [
        ("one_over_d", 1 / 2),  # 1/d: the square root forgotten
        ("unscaled", 1.0),
    ],
)  # no scale at all: raw dot products
def test_wrong_scales_are_explained(graded, mistake, factor):
    report = graded.mistake(mistake, task="ch16.3")
    r = result(report, "figure instance: one causal head")
    assert r.status == "failed"
    q, k = checks.tensor(checks.ONE_Q), checks.tensor(checks.ONE_K)
    want = ref.attention_steps(q, k, k, mask=models.causal(3))["scores"]
    assert (
        f"step 1: scores[0, 0] = (q[0] · k[0]) × scale = (1·1 + 0·0) × 1/√2 = {fmt(want[0, 0])}; yours: {fmt(float(q[0] @ k[0]) * factor)}"
    ) in r.message
    assert r.hints == [mistake]
    qwen = result(report, "Qwen3-0.6B's head_dim 128")
    assert "1/√128" in qwen.message and "is a sum of d = 128 products" in qwen.message
    assert wrong_elements(report, "ch16-dim-one-head-attention")
    # Refusing a query that may attend no key does not depend on the scale.
    assert result(report, "a query that may attend no key").status == "passed"


def test_softmax_over_the_queries(graded):
    # softmax along dim=0: each column sums to 1 instead of each row
    report = graded.mistake("softmax_dim0", task="ch16.3")
    r = result(report, "causal, 5 queries")
    assert r.status == "failed"
    assert "expected row 0: [1, 0, 0, 0, 0] (sums to 1)" in r.message
    assert r.hints == ["softmax_dim0"]
    assert wrong_elements(report, "ch16-prob-rows")
    drawn = texts(report, "ch16-prob-rows")
    assert "← your columns sum to 1" in drawn and any("the softmax ran over the queries (dim=0)" in s for s in drawn)
    assert wrong_elements(report, "ch16-three-steps")


def test_masking_after_softmax(graded):
    # softmax over all keys, then the hidden ones zeroed: rows sum to less than 1
    report = graded.mistake("mask_after", task="ch16.3")
    r = result(report, "figure instance: one causal head")
    assert r.status == "failed"
    assert "step 2: query 0 may attend key 0" in r.message and "expected row 0: [1, 0, 0] (sums to 1)" in r.message
    assert r.hints == ["mask_after"]
    # Without a mask, masking after the softmax changes nothing.
    assert result(report, "three steps").status == "passed"
    assert wrong_elements(report, "ch16-dim-one-head-attention")


def test_inverted_mask_convention(graded):
    # True = hidden: the additive-mask habit, consistently (default all False, a row of True is "blind")
    report = graded.mistake("mask_inverted", task="ch16.3")
    r = result(report, "figure instance: one causal head")
    assert r.status == "failed"
    assert "your attention_steps raised ValueError" in r.message and "but these inputs are valid" in r.message
    assert "read as True = hidden, query 2's row (all True) would hide every key" in r.message
    pad = result(report, "a padding mask")
    assert pad.hints == ["mask_inverted"]
    assert not any(p.endswith("ch16-dim-one-head-attention.svg") for p in report.figures)


def test_unstable_softmax_overflows(graded):
    # exp of the raw scores: fine for small scores, inf/inf = nan at 1e4
    report = graded.mistake("unstable", task="ch16.3")
    assert checks_not_passed(report) == ["large scores (about 1e4) stay finite: a stable softmax"]
    r = result(report, "large scores")
    assert "yours: [nan, nan, nan, nan]" in r.message
    assert r.hints == ["unstable"]


def test_finite_fill_is_not_exactly_zero(graded):
    # −100 instead of −∞ for the hidden keys: exp(−100) is tiny but not 0
    report = graded.mistake("finite_fill", task="ch16.3")
    r = result(report, "masked keys get probability exactly 0")
    assert r.status == "failed"
    assert "must be exactly 0; yours:" in r.message and r.hints == ["finite_fill"]
    big = result(report, "large scores")
    assert big.hints == ["fill_too_small"]
    assert wrong_elements(report, "ch16-prob-rows")


# -- the reference against the conventions it claims ----------------------------------------------


def test_split_is_a_view_with_swapped_strides():
    x = checks.numbered()
    out = ref.split_heads(x, 2)
    assert out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert out.stride() == (12, 2, 4, 1)  # the strides the ch16-dim-split-heads figure prints


def test_merge_is_nanovllm_flatten():
    o = torch.randn(5, 16, 128)
    assert torch.equal(ref.merge_heads(o.transpose(0, 1)[None]), o.flatten(1)[None])
    assert torch.equal(ref.merge_heads(ref.split_heads(o.flatten(1)[None], 16)), o.flatten(1)[None])


def test_sdpa_returns_zeros_for_a_blind_query_where_the_course_raises():
    """The docstring's claim: torch's SDPA quietly returns a zero row; the course raises instead."""
    q, k, v = torch.randn(2, 4), torch.randn(3, 4), torch.randn(3, 4)
    mask = torch.tensor([[True, False, False], [False, False, False]])
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.equal(out[1], torch.zeros(4))
    with pytest.raises(ValueError, match="query 1 may attend no key"):
        ref.attention_steps(q, k, v, mask=mask)


def test_reference_softmax_is_exact_on_large_scores():
    q, k = torch.tensor([[0.5] * 4]), torch.tensor([10000.0, 9999.0, 9998.0, 5000.0])[:, None].expand(4, 4)
    steps = ref.attention_steps(q, k, torch.eye(4))
    assert steps["scores"].tolist() == [[10000.0, 9999.0, 9998.0, 5000.0]]
    torch.testing.assert_close(steps["probs"], torch.tensor([[0.0, 1.0, 2.0, 5000.0]]).neg().softmax(-1))
    assert steps["probs"][0, 3] == 0


# -- the hint helpers on misconceptions that need no submission ------------------------------------


def test_interleaved_heads_are_recognised():
    x = torch.randn(2, 3, 8)
    interleaved = x.view(2, 3, 4, 2).permute(0, 3, 1, 2)  # 2 heads, every 2nd column
    assert checks.split_hint(interleaved, x, 2).id == "interleaved_heads"
    heads = ref.split_heads(x, 2)
    assert checks.merge_hint(heads.permute(0, 2, 3, 1).reshape(2, 3, 8), heads).id == "interleaved_merge"


def test_scale_from_the_wrong_dimension_and_wrong_out_are_recognised():
    q, k, v = torch.randn(2, 16), torch.randn(5, 16), torch.randn(5, 16)
    want = ref.attention_steps(q, k, v)
    by_keys = (q @ k.T) / 5**0.5
    variants = models.steps_variants(None, q, k, v, None, None, want)
    assert checks.scores_hint(by_keys, want["scores"], q, k, None, None, variants["scores"]).id == "sqrt_keys"
    assert checks.out_hint(want["scores"] @ v, variants["out"]).id == "scores_at_v"
    assert checks.out_hint(want["probs"] @ k, variants["out"]).id == "probs_at_k"


# -- the figures' layout ------------------------------------------------------------------------------------
def test_a_transpose_is_a_raised_t_in_the_figures_own_font():
    drawn = reference_figures("ch16")
    for figure_id in ("ch16-three-steps", "ch16-dim-one-head-attention"):
        assert "ᵀ" not in drawn[figure_id], "the modifier letter ᵀ is another font's glyph"
        assert [s for s in transposes(drawn[figure_id]) if s.startswith("KT [")], figure_id


# -- the provided input checks (outside the solution regions: unit tests, no graded checks) ---------------------

z = torch.zeros


@pytest.mark.parametrize(
    "x, heads",
    [(z(1, 2, 10), 4), (z(2, 3, 2048), 12), (z(1, 4, 8), 0), (z(1, 4, 8), True), (z(1, 4, 8), 2.0), (z(3, 8), 2), (z(1, 2, 3, 8), 2)],
)
def test_the_provided_split_check_refuses_bad_inputs(x, heads):
    with pytest.raises(ValueError):
        ref.split_heads(x, heads)


@pytest.mark.parametrize("x", [z(2, 3, 4), z(1, 2, 3, 4, 5), z(6, 8)])
def test_the_provided_merge_check_refuses_what_is_not_4d(x):
    with pytest.raises(ValueError, match=r"\[B, H, T, d\]"):
        ref.merge_heads(x)


BAD_STEPS = {
    "q and k of other widths": (z(2, 4), z(3, 8), z(3, 8), None),
    "fewer value rows than keys": (z(2, 4), z(3, 4), z(5, 4), None),
    "q not 2-D": (z(1, 2, 4), z(3, 4), z(3, 4), None),
    "mask transposed": (z(2, 4), z(3, 4), z(3, 4), torch.ones(3, 2, dtype=torch.bool)),
    "float mask": (z(2, 4), z(3, 4), z(3, 4), torch.ones(2, 3)),
}


@pytest.mark.parametrize("case", BAD_STEPS)
def test_the_provided_steps_check_refuses_bad_inputs(case):
    q, k, v, mask = BAD_STEPS[case]
    with pytest.raises(ValueError):
        ref.attention_steps(q, k, v, mask=mask)


def test_the_provided_checks_let_good_inputs_through():
    assert ref.merge_heads(ref.split_heads(z(1, 2, 6), 3)).shape == (1, 2, 6)
    out = ref.attention_steps(z(2, 4), z(3, 4), z(3, 5), mask=torch.ones(2, 3, dtype=torch.bool))["out"]
    assert out.shape == (2, 5)


def test_a_blind_query_stays_the_students_to_refuse():
    """The lesson's guard (a query that may attend no key) is inside the solution region, not a provided check."""
    blind = torch.tensor([[True, False, False], [False] * 3])
    ref._check_steps(z(2, 4), z(3, 4), z(3, 4), blind)  # the provided check lets it through
    with pytest.raises(ValueError, match="query 1 may attend no key"):
        ref.attention_steps(z(2, 4), z(3, 4), z(3, 4), mask=blind)
    with pytest.raises(ValueError, match="may attend no key"):
        ref.attention_steps(z(2, 4), z(0, 4), z(0, 4))
