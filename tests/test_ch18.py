"""ch18 · grouped-query attention: wrong submissions that embody real misconceptions fail with the
message that teaches the fix, and their figures mark the wrong values."""

from __future__ import annotations

import math
import re

import pytest
import torch
from figure_layout import lines, off_canvas, reference_figures, texts, transposes
from mutate import checks_not_passed, mutant_grader, result, row, wrong_elements

from figures import ch18 as drawn
from figures.style import MARGIN
from grader.checks import ch18 as checks18
from grader.hidden import ch18 as hidden18
from grader.hidden import ch18_models as models18
from grader.run import check
from solutions import ch18_gqa as ref

SEED = 7


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return mutant_grader(tmp_path_factory, "ch18", SEED)


# -- 18.1 --------------------------------------------------------------------------------------------


def test_interleaved_grouping_is_explained_and_drawn(graded):
    """q_head % num_kv_heads: the groups interleaved (heads 0, 2, … share K/V head 0) instead of consecutive."""
    report = graded.mistake("interleaved")
    r = result(report, "figure instance: 4 query heads")
    assert r.status == "failed"
    want = ref.kv_head_for(1, 4, 2)
    assert f"query head 1 is in group 1 // 2 = {want}, so it reads K/V head {want}; yours: {1 % 2}" in r.message
    assert r.hints == ["interleaved"]
    assert wrong_elements(report, "ch18-gqa-groups"), "the student's mapping cells are marked wrong"
    # MHA and MQA cannot tell consecutive from interleaved groups: those checks pass.
    assert result(report, "MHA (8 over 8) and MQA").status == "passed"


def test_dividing_by_num_kv_heads_is_explained(graded):
    report = graded.mistake("divide_by_kv_heads", task="ch18.1")
    # With 4 heads over 2, h // num_kv_heads happens to be right: the figure instance passes.
    assert result(report, "figure instance: 4 query heads").status == "passed"
    assert not wrong_elements(report, "ch18-gqa-groups")
    r = result(report, "Qwen3-0.6B: 16 query heads")
    assert r.status == "failed"
    assert f"yours: {2 // 8}" in r.message and f"reads K/V head {ref.kv_head_for(2, 16, 8)}" in r.message
    assert r.hints == ["divide_by_kv_heads"]


def test_mapping_hint_recognises_each_misconception():
    heads = list(range(12))
    assert checks18.mapping_hint(heads, [h % 3 for h in heads], 12, 3).id == "interleaved"
    assert checks18.mapping_hint(heads, [h // 3 for h in heads], 12, 3).id == "divide_by_kv_heads"
    assert checks18.mapping_hint(heads, heads, 12, 3).id == "query_head_itself"
    assert checks18.mapping_hint(heads, [h % 4 for h in heads], 12, 3).id == "place_in_group"
    assert checks18.mapping_hint(heads, [(h + 1) % 3 for h in heads], 12, 3) == ""


# -- 18.2 --------------------------------------------------------------------------------------------


def test_interleaved_attention_names_head_token_and_grouping(graded):
    report = graded.mistake("interleaved")
    r = result(report, "GQA: a chunk of 3 queries")
    assert r.status == "failed"
    assert "q [3, 4, 8], k/v [7, 2, 8]" in r.message
    assert "query head 1 reads K/V head 1 // 2 = 0" in r.message
    assert "token 0 is at position 7 − 3 + 0 = 4 and sees keys 0 … 4" in r.message
    assert "out[0, 1, 0]: expected" in r.message
    assert r.hints == ["interleaved"]


def test_top_left_mask_is_explained(graded):
    """The top-left tril, as SDPA's is_causal=True, instead of the mask aligned to the end."""
    report = graded.mistake("topleft", task="ch18.2")
    r = result(report, "GQA: a chunk of 3 queries")
    assert r.status == "failed"
    assert r.hints == ["topleft"]
    # With T == S the two alignments agree: the figure instance and the MHA case pass, the figure is clean.
    assert result(report, "figure instance: 2 query heads").status == "passed"
    assert result(report, "MHA: every query head").status == "passed"
    assert not wrong_elements(report, "ch18-dim-gqa")


def test_unscaled_scores_are_explained_and_marked(graded):
    """The default scale forgotten: scores not divided by √d."""
    report = graded.mistake("unscaled", task="ch18.2")
    r = result(report, "figure instance: 2 query heads")
    assert r.status == "failed"
    assert r.hints == ["unscaled"]
    q, k, v = checks18.dim_gqa_tensors()
    want = ref.gqa_attention(q, k, v)
    t, h, j = (int(i) for i in ((want - models18.attend(q, k, v, [0, 0], models18.end_aligned(3, 3), 1.0)).abs() > 1e-5).nonzero()[0])
    assert f"out[{t}, {h}, {j}]: expected {checks18.fmt(want[t, h, j])}" in r.message
    assert wrong_elements(report, "ch18-dim-gqa"), "the student's wrong outputs are marked in ch18-dim-gqa"
    # A custom scale is still honoured, so the non-causal custom-scale case passes.
    assert result(report, "not causal, with a custom scale").status == "passed"


def copy_message(report) -> str:
    """The measured check's message, after making sure it is the only check that failed."""
    assert checks_not_passed(report) == ["no per-query-head copy of K or V is created (measured)"]
    r = result(report, "no per-query-head copy")
    T, S, Hq, Hkv, d, causal = hidden18.KV_CASES[0]
    assert f"case: T={T} queries, S={S} keys, Hq={Hq} query heads over Hkv={Hkv} K/V heads" in r.message
    assert re.search(
        rf"your gqa_attention used about [\d.,]+ MiB beyond its inputs, where this check allows {hidden18.KV_SPARE >> 20} MiB", r.message
    )
    assert f"S·Hq·d = {S * Hq * d:,} numbers ({S * Hq * d * 4 >> 20} MiB) and does not fit" in r.message
    assert "view q as [Hkv, group·T, d]" in r.message
    return r.message


@pytest.mark.parametrize("mistake", ["repeat_kv", "expand_kv"])
def test_repeating_kv_does_not_fit_the_measured_check(graded, mistake):
    """A copy of K and V for every query head, then plain multi-head attention: repeat_kv, or expand(...).reshape."""
    report = graded.mistake(mistake, task="ch18.2")
    message = copy_message(report)
    used = re.search(r"used about ([\d.,]+) MiB beyond its inputs", message)
    assert used and float(used.group(1)) >= 64, "a copy of K or V for every query head: 64 MiB each"
    assert "(line " in message and ("repeat_interleave" in message or "expand" in message)
    assert result(report, "no per-query-head copy").hints == [mistake]


def test_broadcasting_matmul_copy_is_caught_with_its_hint(graded):
    """A broadcasting matmul against K as [Hkv, 1, d, S]: torch expands (copies) K per query head."""
    report = graded.mistake("broadcast_matmul", task="ch18.2")
    message = copy_message(report)
    assert result(report, "no per-query-head copy").hints == ["broadcast_matmul"]
    assert "[2, 8, 128, 8192]" in message  # the copy's shape, of this case


def test_a_copy_made_with_dispatch_modes_switched_off_is_still_measured(graded):
    # Switching off torch's dispatch modes hid the copies from a recorder inside the student's process; the
    # memory limit is the kernel's, outside it.
    ((old, new),) = row("ch18", "repeat_kv").edits
    unseen = new.replace(
        "    k, v = k.repeat_interleave",
        "    import torch.utils._python_dispatch\n"
        "    with torch.utils._python_dispatch._disable_current_modes():\n"
        "        k, v = k.repeat_interleave",
    )
    used = re.search(r"used about ([\d.,]+) MiB beyond", copy_message(graded("ch18_repeat_kv_unseen", (old, unseen), task="ch18.2")))
    assert used and float(used.group(1)) >= 64


def test_reference_passes_the_measured_check():
    report = check("ch18", solutions=True, task="ch18.2", hidden=True, seed=SEED)
    r = result(report, "no per-query-head copy")
    assert r.status == "passed", r.message


def test_attention_hint_finds_combined_mistakes():
    g = torch.Generator().manual_seed(0)
    T, S, Hq, Hkv, d = 3, 7, 4, 2, 8
    q = torch.randn(T, Hq, d, generator=g)
    k, v = torch.randn(S, Hkv, d, generator=g), torch.randn(S, Hkv, d, generator=g)
    variants = models18.gqa_variants(None, q, k, v, True, None)
    both = models18.attend(q, k, v, [h % Hkv for h in range(Hq)], torch.ones(T, S, dtype=torch.bool).tril(), d**-0.5)
    assert [h.id for h in checks18.attention_hints(both, q, k, v, True, None, variants)] == ["interleaved", "topleft"]
    full_width = models18.attend(q, k, v, [h // 2 for h in range(Hq)], models18.end_aligned(T, S), (Hq * d) ** -0.5)
    assert [h.id for h in checks18.attention_hints(full_width, q, k, v, True, None, variants)] == ["scale_all_heads"]


# -- 18.3 --------------------------------------------------------------------------------------------


def test_forgetting_v_is_explained_and_drawn(graded):
    """Only K counted: the factor 2 for K and V forgotten (in bf16, a forgotten dtype_bytes gives the same count)."""
    report = graded.mistake("k_only", task="ch18.3")
    r = result(report, "Qwen3-0.6B in bf16")
    assert r.status == "failed"
    want = ref.kv_cache_bytes(28, 8, 128, 1, 2)
    assert f"= {want:,} bytes; yours: {want // 2:,}" in r.message
    assert r.hints == ["k_only", "no_dtype_bytes"]
    assert wrong_elements(report, "ch18-kv-capacity"), "the student's bars are marked wrong"


def test_float_bytes_are_refused_with_a_hint(graded):
    """The byte count computed in floats (2.0 · …), not as an exact Python int."""
    report = graded.mistake("float_bytes", task="ch18.3")
    r = result(report, "Qwen3-0.6B in bf16")
    assert r.status == "failed"
    assert "as a Python int; yours: float" in r.message
    assert r.hints == ["float_bytes"]
    assert not any(p.endswith("/ch18-kv-capacity.svg") for p in report.figures), "no figure from values of the wrong type"


def ids(hints) -> list[str]:
    return [h.id for h in hints]


def test_bytes_hints():
    L, kv, d, T, b = 28, 8, 128, 4096, 2
    want = ref.kv_cache_bytes(L, kv, d, T, b)
    assert ids(checks18.bytes_hints(want // L, want, L, b, T)) == ["no_layers"]
    fp32 = ref.kv_cache_bytes(L, kv, d, T, 4)
    assert ids(checks18.bytes_hints(fp32 // 4, fp32, L, 4, T)) == ["no_dtype_bytes"]
    assert ids(checks18.bytes_hints(want * 8, want, L, b, T)) == ["bits"]
    big = ref.kv_cache_bytes(100_003, 7, 10_001, 1_000_000_007, 3)
    assert int(float(big)) != big
    assert ids(checks18.bytes_hints(int(float(big)), big, 100_003, 3, 1_000_000_007)) == ["float_rounding"]
    assert math.prod([2, L, kv, d, T, b]) == want


def test_a_count_two_misconceptions_give_names_both():
    # bf16: dtype_bytes = 2, so half the answer is the factor 2 forgotten or dtype_bytes forgotten
    L, kv, d, T = 28, 8, 128, 1
    want = ref.kv_cache_bytes(L, kv, d, T, 2)
    assert ids(checks18.bytes_hints(want // 2, want, L, 2, T)) == ["k_only", "no_dtype_bytes"]
    with pytest.raises(checks18.CheckFailed) as e:
        checks18.expect_bytes(want // 2, want, L, kv, d, T, 2)
    assert e.value.hints == ["k_only", "no_dtype_bytes"]
    fp32 = ref.kv_cache_bytes(L, kv, d, T, 4)
    assert ids(checks18.bytes_hints(fp32 // 2, fp32, L, 4, T)) == ["k_only"], "in fp32 only the factor 2 fits"
    assert checks18.bytes_hints(want + 3, want, L, 2, T) == [], "no misconception gives want + 3"


# -- the figures' layout ------------------------------------------------------------------------------------
def test_the_arrow_labels_between_the_blocks_have_room_and_the_transpose_is_a_raised_t():
    svg = reference_figures("ch18")["ch18-dim-gqa"]
    assert "ᵀ" not in svg and "KT" in transposes(svg) and transposes(svg).count("· KT") == 2
    arrows = [(x1, y, x2) for x1, y, x2, y2 in lines(svg, cls="arrow") if y == y2 and x2 > x1]
    labels = [t for t in texts(svg) if t.s in ("· KT", "softmax(·/√2)", "· V")]
    assert len(labels) == 6
    for t in labels:
        ((x1, _, x2),) = [(x1, y, x2) for x1, y, x2 in arrows if x1 < t.x < x2 and 0 < y - t.y < 12]
        gap_left, gap_right = x1 - 5, x2 + 6 + 5  # the arrow starts 5 after a block, its head ends 5 before
        assert t.left - gap_left >= drawn.ARROW_ROOM - 0.5 and gap_right - t.right >= drawn.ARROW_ROOM - 0.5, t.s
    assert off_canvas(svg, margin=MARGIN - 1) == []


# -- the provided input checks (outside the solution regions: unit tests, no graded checks) ---------------------


@pytest.mark.parametrize(
    "args", [(0, 12, 5), (4, 4, 2), (0, 4, 8), (0, 8, 0), (0, 0, 1), (0, 8, -2), (-1, 8, 2), (16, 16, 8), (1.0, 4, 2), (0, True, 1)]
)
def test_the_provided_head_check_refuses_bad_heads(args):
    with pytest.raises(ValueError):
        ref.kv_head_for(*args)


z = torch.zeros
BAD_GQA = {
    "k and v of other shapes": (z(2, 4, 8), z(5, 2, 8), z(5, 1, 8)),
    "head_dim of q and k differ": (z(2, 4, 8), z(5, 2, 16), z(5, 2, 16)),
    "causal with S < T": (z(5, 4, 8), z(3, 2, 8), z(3, 2, 8)),
    "6 query heads over 4 K/V heads": (z(2, 6, 4), z(2, 4, 4), z(2, 4, 4)),
    "no K/V heads": (z(2, 4, 4), z(2, 0, 4), z(2, 0, 4)),
    "q not 3-D": (z(2, 32), z(2, 2, 16), z(2, 2, 16)),
}


@pytest.mark.parametrize("case", BAD_GQA)
def test_the_provided_qkv_check_refuses_bad_shapes(case):
    with pytest.raises(ValueError):
        ref.gqa_attention(*BAD_GQA[case])


@pytest.mark.parametrize(
    "args",
    [
        (28, 8, 128, -1, 2),
        (28, 8, 128, 10, 0),
        (-28, 8, 128, 10, 2),
        (28, 0, 128, 10, 2),
        (28, 8, -128, 10, 2),
        (28, 8, 128, 10.0, 2),
        (28, 8, 128, True, 2),
    ],
)
def test_the_provided_size_check_refuses_bad_sizes(args):
    with pytest.raises(ValueError):
        ref.kv_cache_bytes(*args)


def test_the_provided_checks_let_good_inputs_through():
    assert ref.kv_head_for(3, 4, 2) == 1 and ref.kv_cache_bytes(28, 8, 128, 0, 2) == 0
    assert ref.gqa_attention(z(5, 4, 8), z(3, 2, 8), z(3, 2, 8), causal=False).shape == (5, 4, 8)
