"""ch18 · grouped-query attention: wrong submissions that embody real misconceptions fail with the
message that teaches the fix, and their figures mark the wrong values."""

from __future__ import annotations

import math

import pytest
import torch
from figure_layout import lines, off_canvas, reference_figures, texts, transposes
from mutate import checks_not_passed, mutant_grader, result, wrong_elements

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

# q_head % num_kv_heads: the groups interleaved (heads 0, 2, … share K/V head 0) instead of consecutive
INTERLEAVED = (("return q_head // (num_heads // num_kv_heads)", "return q_head % num_kv_heads"),
               ("q.reshape(T, Hkv, group, d).permute(1, 2, 0, 3)", "q.reshape(T, group, Hkv, d).permute(2, 1, 0, 3)"),
               ("out.view(Hkv, group, T, d).permute(2, 0, 1, 3)", "out.view(Hkv, group, T, d).permute(2, 1, 0, 3)"))


def test_interleaved_grouping_is_explained_and_drawn(graded):
    report = graded("ch18_interleaved", *INTERLEAVED)
    r = result(report, "figure instance: 4 query heads")
    assert r.status == "failed"
    want = ref.kv_head_for(1, 4, 2)
    assert f"query head 1 is in group 1 // 2 = {want}, so it reads K/V head {want}; yours: {1 % 2}" in r.message
    assert "hint: q_head % num_kv_heads interleaves the heads" in r.message
    assert "heads 0 … 1 share K/V head 0" in r.message
    assert wrong_elements(report, "ch18-gqa-groups"), "the student's mapping cells are marked wrong"
    # MHA and MQA cannot tell consecutive from interleaved groups: those checks pass.
    assert result(report, "MHA (8 over 8) and MQA").status == "passed"


def test_dividing_by_num_kv_heads_is_explained(graded):
    report = graded("ch18_divide_by_kv_heads",
                    # dividing by the number of K/V heads instead of by the group size
                    ("return q_head // (num_heads // num_kv_heads)", "return q_head // num_kv_heads"),
                    task="ch18.1")
    # With 4 heads over 2, h // num_kv_heads happens to be right: the figure instance passes.
    assert result(report, "figure instance: 4 query heads").status == "passed"
    assert not wrong_elements(report, "ch18-gqa-groups")
    r = result(report, "Qwen3-0.6B: 16 query heads")
    assert r.status == "failed"
    assert f"yours: {2 // 8}" in r.message and f"reads K/V head {ref.kv_head_for(2, 16, 8)}" in r.message
    assert "hint: divide by the group size num_heads // num_kv_heads = 2, not by num_kv_heads = 8" in r.message


def test_mapping_hint_recognises_each_misconception():
    heads = list(range(12))
    assert "interleaves" in checks18.mapping_hint(heads, [h % 3 for h in heads], 12, 3)
    assert "divide by the group size" in checks18.mapping_hint(heads, [h // 3 for h in heads], 12, 3)
    assert "place inside its group" in checks18.mapping_hint(heads, [h % 4 for h in heads], 12, 3)
    assert checks18.mapping_hint(heads, [(h + 1) % 3 for h in heads], 12, 3) == ""


# -- 18.2 --------------------------------------------------------------------------------------------

def test_interleaved_attention_names_head_token_and_grouping(graded):
    report = graded("ch18_interleaved", *INTERLEAVED)
    r = result(report, "GQA: a chunk of 3 queries")
    assert r.status == "failed"
    assert "q [3, 4, 8], k/v [7, 2, 8]" in r.message
    assert "query head 1 reads K/V head 1 // 2 = 0" in r.message
    assert "token 0 is at position 7 − 3 + 0 = 4 and sees keys 0 … 4" in r.message
    assert "out[0, 1, 0]: expected" in r.message
    assert ("hint: query head h reads K/V head h // group = h // 2 (consecutive groups), not h % num_kv_heads"
            in r.message)


def test_top_left_mask_is_explained(graded):
    report = graded("ch18_topleft",
                    # the top-left tril, as SDPA's is_causal=True, instead of the mask aligned to the end
                    ("allowed = torch.arange(S) <= torch.arange(T)[:, None] + (S - T)",
                     "allowed = torch.ones(T, S, dtype=torch.bool).tril()"),
                    task="ch18.2")
    r = result(report, "GQA: a chunk of 3 queries")
    assert r.status == "failed"
    assert "hint: the causal mask is aligned to the end" in r.message
    assert "SDPA's is_causal=True" in r.message
    # With T == S the two alignments agree: the figure instance and the MHA case pass, the figure is clean.
    assert result(report, "figure instance: 2 query heads").status == "passed"
    assert result(report, "MHA: every query head").status == "passed"
    assert not wrong_elements(report, "ch18-dim-gqa")


def test_unscaled_scores_are_explained_and_marked(graded):
    report = graded("ch18_unscaled",
                    # the default scale forgotten: scores not divided by √d
                    ("scale = d ** -0.5 if scale is None else scale", "scale = 1.0 if scale is None else scale"),
                    task="ch18.2")
    r = result(report, "figure instance: 2 query heads")
    assert r.status == "failed"
    assert "hint: scale the scores by 1/√d = 1/√2; you did not scale them" in r.message
    q, k, v = checks18.dim_gqa_tensors()
    want = ref.gqa_attention(q, k, v)
    t, h, j = (int(i) for i in ((want - models18.attend(q, k, v, [0, 0], models18.end_aligned(3, 3), 1.0)).abs()
                                > 1e-5).nonzero()[0])
    assert f"out[{t}, {h}, {j}]: expected {checks18.fmt(want[t, h, j])}" in r.message
    assert wrong_elements(report, "ch18-dim-gqa"), "the student's wrong outputs are marked in ch18-dim-gqa"
    # A custom scale is still honoured, so the non-causal custom-scale case passes.
    assert result(report, "not causal, with a custom scale").status == "passed"


# A copy of K and V for every query head, then plain multi-head attention: repeat_kv, or expand(...).reshape.
REPEAT_KV = ("    group = Hq // Hkv\n",
             "    group = Hq // Hkv\n"
             "    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)\n"
             "    Hkv, group = Hq, 1\n")
EXPAND_KV = ("    group = Hq // Hkv\n",
             "    group = Hq // Hkv\n"
             "    k = k[:, :, None].expand(S, Hkv, group, d).reshape(S, Hq, d)\n"
             "    v = v[:, :, None].expand(S, Hkv, group, d).reshape(S, Hq, d)\n"
             "    Hkv, group = Hq, 1\n")


def copy_message(report) -> str:
    """The measured check's message, after making sure it is the only check that failed."""
    assert checks_not_passed(report) == ["no per-query-head copy of K or V is created (measured)"]
    r = result(report, "no per-query-head copy")
    T, S, Hq, Hkv, d, causal = hidden18.KV_CASES[0]
    assert f"case: T={T} queries, S={S} keys, Hq={Hq} query heads over Hkv={Hkv} K/V heads" in r.message
    assert f"needed more than {hidden18.KV_SPARE >> 20} MiB beyond its inputs, all this check allows" in r.message
    assert f"S·Hq·d = {S * Hq * d:,} numbers ({S * Hq * d * 4 >> 20} MiB) and does not fit" in r.message
    assert "view q as [Hkv, group·T, d]" in r.message
    return r.message


@pytest.mark.parametrize("name, edit, hint", [
    ("ch18_repeat_kv", REPEAT_KV, "hint: repeat_interleave materialises the repeated K/V"),
    ("ch18_expand_kv", EXPAND_KV, "hint: expand is a view, but the reshape (or contiguous) after it"),
])
def test_repeating_kv_does_not_fit_the_measured_check(graded, name, edit, hint):
    message = copy_message(graded(name, edit, task="ch18.2"))
    assert "ran out at ch18_gqa.py:" in message and "asking for 64 MiB" in message
    assert hint in message


def test_broadcasting_matmul_copy_is_caught_with_its_hint(graded):
    report = graded("ch18_broadcast_matmul",
                    # a broadcasting matmul against K as [Hkv, 1, d, S]: torch expands (copies) K per query head
                    ("permute(1, 2, 0, 3).reshape(Hkv, group * T, d)", "permute(1, 2, 0, 3)"),
                    ("(qg @ k.permute(1, 2, 0))", "(qg @ k.permute(1, 2, 0).unsqueeze(1))"),
                    ('float("-inf")).view(Hkv, group * T, S)', 'float("-inf"))'),
                     ("@ v.permute(1, 0, 2)", "@ v.permute(1, 0, 2).unsqueeze(1)"),
                     task="ch18.2")
    message = copy_message(report)
    assert "hint: a torch.matmul that broadcasts a [Hkv, 1, …] K" in message and "[2, 8, 128, 8192]" in message


def test_a_copy_made_with_dispatch_modes_switched_off_is_still_measured(graded):
    # Switching off torch's dispatch modes hid the copies from a recorder inside the student's process; the
    # memory limit is the kernel's, outside it.
    old, new = REPEAT_KV
    unseen = new.replace("    k, v = k.repeat_interleave",
                         "    import torch.utils._python_dispatch\n"
                         "    with torch.utils._python_dispatch._disable_current_modes():\n"
                         "        k, v = k.repeat_interleave")
    assert "asking for 64 MiB" in copy_message(graded("ch18_repeat_kv_unseen", (old, unseen), task="ch18.2"))


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
    both = models18.attend(q, k, v, [h % Hkv for h in range(Hq)], torch.ones(T, S, dtype=torch.bool).tril(), d ** -0.5)
    hint = checks18.attention_hint(both, q, k, v, True, None, variants)
    assert "interleaved" in hint and "aligned to the end" in hint
    full_width = models18.attend(q, k, v, [h // 2 for h in range(Hq)], models18.end_aligned(T, S), (Hq * d) ** -0.5)
    assert "not 1/√(num_heads·head_dim)" in checks18.attention_hint(full_width, q, k, v, True, None, variants)


# -- 18.3 --------------------------------------------------------------------------------------------

def test_forgetting_v_is_explained_and_drawn(graded):
    report = graded("ch18_k_only",
                    # only K counted: the factor 2 for K and V forgotten
                    ("return 2 * num_layers", "return num_layers"),
                    task="ch18.3")
    r = result(report, "Qwen3-0.6B in bf16")
    assert r.status == "failed"
    want = ref.kv_cache_bytes(28, 8, 128, 1, 2)
    assert f"= {want:,} bytes; yours: {want // 2:,}" in r.message
    assert "hint: count both K and V" in r.message
    assert wrong_elements(report, "ch18-kv-capacity"), "the student's bars are marked wrong"


def test_float_bytes_are_refused_with_a_hint(graded):
    report = graded("ch18_float_bytes",
                    # the byte count computed in floats (2.0 · …), not as an exact Python int
                    ("return 2 * num_layers", "return 2.0 * num_layers"),
                    task="ch18.3")
    r = result(report, "Qwen3-0.6B in bf16")
    assert r.status == "failed"
    assert "as a Python int; yours: float" in r.message
    assert "hint: multiply the Python ints directly" in r.message
    assert not any(p.endswith("/ch18-kv-capacity.svg") for p in report.figures), \
        "no figure from values of the wrong type"


def test_bytes_hints():
    L, kv, d, T, b = 28, 8, 128, 4096, 2
    want = ref.kv_cache_bytes(L, kv, d, T, b)
    assert "num_layers" in checks18.bytes_hint(want // L, want, L, b, T)
    fp32 = ref.kv_cache_bytes(L, kv, d, T, 4)
    assert "multiply by dtype_bytes" in checks18.bytes_hint(fp32 // 4, fp32, L, 4, T)
    assert "bits" in checks18.bytes_hint(want * 8, want, L, b, T)
    big = ref.kv_cache_bytes(100_003, 7, 10_001, 1_000_000_007, 3)
    assert int(float(big)) != big
    assert "float arithmetic rounds" in checks18.bytes_hint(int(float(big)), big, 100_003, 3, 1_000_000_007)
    assert math.prod([2, L, kv, d, T, b]) == want


def test_a_count_two_misconceptions_give_names_both():
    # bf16: dtype_bytes = 2, so half the answer is the factor 2 forgotten or dtype_bytes forgotten
    L, kv, d, T = 28, 8, 128, 1
    want = ref.kv_cache_bytes(L, kv, d, T, 2)
    hint = checks18.bytes_hint(want // 2, want, L, 2, T)
    assert "count both K and V" in hint and "multiply by dtype_bytes" in hint
    fp32 = ref.kv_cache_bytes(L, kv, d, T, 4)
    assert "dtype_bytes" not in checks18.bytes_hint(fp32 // 2, fp32, L, 4, T), "in fp32 only the factor 2 fits"
    assert checks18.bytes_hint(want + 3, want, L, 2, T) == "", "no misconception gives want + 3"


# -- the figures' layout ------------------------------------------------------------------------------------
def test_the_arrow_labels_between_the_blocks_have_room_and_the_transpose_is_a_raised_t():
    svg = reference_figures("ch18")["ch18-dim-gqa"]
    assert "ᵀ" not in svg and "KT" in transposes(svg) and transposes(svg).count("· KT") == 2
    arrows = [(x1, y, x2) for x1, y, x2, y2 in lines(svg, cls="arrow") if y == y2 and x2 > x1]
    labels = [t for t in texts(svg) if t.s in ("· KT", "softmax(·/√2)", "· V")]
    assert len(labels) == 6
    for t in labels:
        (x1, _, x2), = [(x1, y, x2) for x1, y, x2 in arrows if x1 < t.x < x2 and 0 < y - t.y < 12]
        gap_left, gap_right = x1 - 5, x2 + 6 + 5          # the arrow starts 5 after a block, its head ends 5 before
        assert t.left - gap_left >= drawn.ARROW_ROOM - 0.5 and gap_right - t.right >= drawn.ARROW_ROOM - 0.5, t.s
    assert off_canvas(svg, margin=MARGIN - 1) == []
