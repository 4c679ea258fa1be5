"""ch22 · naive attention vs FlashAttention: wrong submissions that embody real misconceptions fail with
the message that teaches the fix, and the figures drawn from them mark the wrong values."""

from __future__ import annotations

import math

import pytest
import torch
from mutate import checks_not_passed, mutant_grader, result, wrong_elements

from grader.authoring.compare import CheckFailed, fmt
from grader.checks import ch22 as checks
from grader.checks import ch22_flash as flash
from grader.hidden import ch22 as hidden
from grader.hidden import ch22_models as models
from grader.isolation.session import StudentRaised
from grader.run import check
from solutions import ch22_flash_attention as ref

SEED = 22


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return mutant_grader(tmp_path_factory, "ch22", SEED)


# -- 22.1 naive_attention ----------------------------------------------------------------------------

def test_top_left_mask_is_explained(graded):
    report = graded("ch22_naive_topleft",
                    # the top-left tril, as SDPA's is_causal=True does, instead of the mask aligned to the end
                    ("visible = torch.arange(S) <= torch.arange(T)[:, None] + (S - T)",
                     "visible = torch.arange(S) <= torch.arange(T)[:, None]"), task="ch22.1")
    r = result(report, "a chunk of 3 queries after 4 cached keys")
    assert r.status == "failed"
    assert "query 0 is at position 7 − 3 + 0 = 4 and sees keys 0 … 4" in r.message
    assert "scores[0, 1]: expected q[0]·k[1]/√8" in r.message and "yours −∞" in r.message
    assert "hint: the causal mask is aligned to the end" in r.message and "SDPA's is_causal=True" in r.message
    # With T == S the two alignments agree: the figure instance passes and its figure is clean.
    assert result(report, "figure instance: naive attention").status == "passed"
    assert not wrong_elements(report, "ch22-naive")


def test_unscaled_scores_are_explained_and_drawn(graded):
    report = graded("ch22_naive_unscaled",
                    # the 1/√d forgotten: raw dot products go into the softmax
                    ("scores = (q @ k.T) * d ** -0.5", "scores = q @ k.T"), task="ch22.1")
    r = result(report, "figure instance: naive attention")
    assert r.status == "failed"
    q, k, v = checks.naive_tensors()
    want = ref.naive_attention(q, k, v)[1]["scores"]
    dot = float(q[0] @ k[0])
    assert f"scores[0, 0]: expected q[0]·k[0]/√2 = {fmt(dot)}/{fmt(math.sqrt(2))} = {fmt(want[0, 0])}; yours {fmt(dot)}" \
        in r.message
    assert "hint: scale the scores by 1/√d = 1/√2; you did not scale them" in r.message
    assert wrong_elements(report, "ch22-naive"), "the student's scores, probs and out are marked"
    assert {x.status for x in report.results if "HBM bytes" in x.name} == {"passed"}


def test_masking_with_zero_is_explained(graded):
    report = graded("ch22_naive_zero_fill",
                    # future scores set to 0 instead of −inf: exp(0) = 1 still weighs the future keys
                    ('scores = scores.masked_fill(~visible, float("-inf"))', "scores = scores.masked_fill(~visible, 0.0)"),
                    task="ch22.1")
    r = result(report, "figure instance: naive attention")
    assert r.status == "failed"
    assert "scores[0, 1]: expected −∞ (key 1 is in the future of query 0); yours 0" in r.message
    assert "hint: a masked score is −inf, not 0" in r.message


# -- 22.1 attention_hbm_bytes ------------------------------------------------------------------------

def test_one_crossing_per_matrix_is_explained_and_drawn(graded):
    report = graded("ch22_bytes_once",
                    # the scores and probabilities counted once (written) instead of written and read back
                    ("4 * T * S * dtype_bytes", "2 * T * S * dtype_bytes"), task="ch22.1")
    r = result(report, "figure instance: HBM bytes")
    assert r.status == "failed"
    want = ref.attention_hbm_bytes(4, 4, 2, 4, flash=False)
    assert f"(2·4·2 + 2·4·2 + 4·4·4)·4 = {want:,} bytes" in r.message
    assert f"yours: {want - 2 * 16 * 4:,}" in r.message
    assert "hint: the scores and the probabilities each cross HBM twice" in r.message
    assert wrong_elements(report, "ch22-naive"), "the student's byte counts are marked"
    assert result(report, "figure instance: naive attention").status == "passed"


def test_lse_in_the_inputs_dtype_is_explained(graded):
    report = graded("ch22_bytes_lse_dtype",
                    # the log-sum-exp counted at dtype_bytes instead of float32
                    ("return inputs_and_output + 4 * T                           #",
                     "return inputs_and_output + T * dtype_bytes  #"), task="ch22.1")
    r = result(report, "figure instance: HBM bytes")
    assert r.status == "failed"
    assert "flash=True" in r.message and f"= {ref.attention_hbm_bytes(4096, 4096, 128, 2, flash=True):,} bytes" \
        in r.message
    assert "hint: the lse is float32 whatever the inputs' dtype" in r.message


def test_traffic_hints():
    T, S, d, b = 4096, 2048, 128, 2
    io = (2 * T * d + 2 * S * d) * b
    assert "each cross HBM twice" in checks.traffic_hint(io + 2 * T * S * b, T, S, d, b, False)
    assert "O is written" in checks.traffic_hint((T * d + 2 * S * d + 4 * T * S) * b, T, S, d, b, False)
    assert "add the log-sum-exp" in checks.traffic_hint(io, T, S, d, b, True)
    assert "no T·S term" in checks.traffic_hint(ref.attention_hbm_bytes(T, S, d, b, flash=False), T, S, d, b, True)
    naive = ref.attention_hbm_bytes(T, S, d, b, flash=False)
    assert "multiply by dtype_bytes" in checks.traffic_hint(naive // b, T, S, d, b, False)
    assert checks.traffic_hint(naive + 1, T, S, d, b, False) == ""
    with pytest.raises(CheckFailed, match="hint: multiply the Python ints"):
        checks.expect_traffic(float(naive), naive, T, S, d, b, False)


# -- 22.2 flash_attention ----------------------------------------------------------------------------

def test_forgetting_to_rescale_the_accumulator(graded):
    report = graded("ch22_no_acc_rescale",
                    # acc += p·V without multiplying the old acc by α = exp(m − m_new) when the max grows
                    ("acc = alpha[:, None] * acc + p @ v[k0:k1]", "acc = acc + p @ v[k0:k1]"), task="ch22.2")
    r = result(report, "figure instance: 6 queries")
    assert r.status == "failed"
    assert "(naive attention); yours" in r.message
    assert "hint: when a tile raises a row's running max from m to m_new" in r.message
    assert "multiply the accumulator acc by α = exp(m − m_new)" in r.message
    # m and l are right, so the trace's cells are clean; the rows whose max grew have a wrong output.
    assert wrong_elements(report, "ch22-flash-tiles") and not wrong_elements(report, "ch22-flash-tiles", "tile wrong")
    assert result(report, "no tensor of T·S elements").status == "failed"   # a wrong answer fails there too


def test_forgetting_to_rescale_the_running_sum(graded):
    report = graded("ch22_no_l_rescale",
                    # l += rowsum(p) without α: the old terms stay measured against the old max
                    ("l = alpha * l + p.sum(dim=1)", "l = l + p.sum(dim=1)"), task="ch22.2")
    r = result(report, "ragged tiles")
    assert r.status == "failed"
    assert "multiply the running sum l by α = exp(m − m_new)" in r.message
    assert wrong_elements(report, "ch22-flash-tiles")


def test_top_left_causal_tiles(graded):
    report = graded("ch22_flash_topleft",
                    # positions counted from 0 for the new queries: the top-left alignment
                    ("scale, offset = d ** -0.5, S - T", "scale, offset = d ** -0.5, 0"), task="ch22.2")
    r = result(report, "figure instance: 6 queries")
    assert r.status == "failed"
    assert "tile (qb=0, kb=1): queries 0–1, keys 3–5 is missing from your trace" in r.message
    assert "hint: the causal mask is aligned to the end: query i is at position S − T + i = 2 + i" in r.message
    assert wrong_elements(report, "ch22-flash-tiles", "tile wrong"), "the tiles it failed to visit are marked"
    chunk = result(report, "a chunk of 5 queries after 7 cached keys")
    assert chunk.status == "failed" and "top-left alignment" in chunk.message
    # With T == S nothing changes.
    assert result(report, "agrees with naive attention: T = S = 16").status == "passed"


def test_visiting_future_tiles_is_caught_by_the_trace(graded):
    report = graded("ch22_no_skip",
                    # every key block visited: future tiles masked entirely instead of skipped
                    ("k_end = min(S, offset + q1) if causal else S", "k_end = S"), task="ch22.2")
    # The output is right (a fully masked tile adds exp(−inf) = 0); only the trace shows the wasted tiles.
    assert checks_not_passed(report) == [result(report, "figure instance: 6 queries").name,
                                         result(report, "the trace:").name]
    r = result(report, "figure instance: 6 queries")
    assert ("your trace visits tile (qb=0, kb=2): queries 0–1, keys 6–7; its last query, at position 3, sees keys "
            "0 … 3 < 6: the whole tile is in the future") in r.message
    assert "hint: skip the tiles entirely in the future" in r.message
    assert wrong_elements(report, "ch22-flash-tiles", "tile wrong")


# The whole [T, S] score matrix computed once, then sliced into "tiles".
FULL_SCORES = (("scale, offset = d ** -0.5, S - T\n",
                "scale, offset = d ** -0.5, S - T\n    full = (q @ k.T) * scale\n"),
               ("s = (q[q0:q1] @ k[k0:k1].T) * scale", "s = full[q0:q1, k0:k1]"))


def memory_message(report) -> str:
    """The measured check's message for the causal T = S = 8192 case, after making sure only it failed."""
    assert checks_not_passed(report) == ["no tensor of T·S elements is ever created (measured)"]
    r = result(report, "no tensor of T·S")
    assert "case: T=8192 queries, S=8192 keys, d=16, causal=True, block_q=256, block_k=256" in r.message
    assert f"needed more than {hidden.FLASH_SPARE >> 20} MiB beyond its inputs, all this check allows" in r.message
    assert "ran out at ch22_flash_attention.py:" in r.message
    assert "the whole T × S score matrix alone is 256 MiB (a [T, S] bool mask 64 MiB)" in r.message
    assert "FlashAttention never holds it: each step works on one tile [256, 256] of scores (0.25 MiB)" in r.message
    return r.message


def test_full_score_matrix_does_not_fit_the_measured_check(graded):
    message = memory_message(graded("ch22_full_scores", *FULL_SCORES, task="ch22.2"))
    assert "full = (q @ k.T) * scale, asking for 256 MiB" in message
    assert "hint: compute the scores tile by tile" in message


def test_full_causal_mask_does_not_fit_the_measured_check(graded):
    report = graded("ch22_full_mask",
                    # the causal mask built once for all [T, S] positions, then sliced per tile
                    ("scale, offset = d ** -0.5, S - T\n",
                     "scale, offset = d ** -0.5, S - T\n"
                     "    full_mask = torch.arange(S) <= torch.arange(T)[:, None] + offset\n"),
                    ("visible = torch.arange(k0, k1) <= torch.arange(q0, q1)[:, None] + offset",
                     "visible = full_mask[q0:q1, k0:k1]"), task="ch22.2")
    message = memory_message(report)
    assert "asking for 64 MiB" in message and "hint: a [T, S] causal mask is a full matrix too" in message


def test_a_full_matrix_made_with_dispatch_modes_switched_off_is_still_measured(graded):
    # Switching off torch's dispatch modes hid the matrix from a recorder inside the student's process; the
    # memory limit is the kernel's, outside it.
    (old, new), tiles = FULL_SCORES
    unseen = new.replace("    full = ", "    import torch.utils._python_dispatch\n"
                                      "    with torch.utils._python_dispatch._disable_current_modes():\n"
                                      "        full = ")
    message = memory_message(graded("ch22_full_scores_unseen", (old, unseen), tiles, task="ch22.2"))
    assert "asking for 256 MiB" in message


def test_ragged_query_block_dropped(graded):
    report = graded("ch22_floor_q",
                    # ⌊T / block_q⌋ query blocks: the last, ragged block is never computed
                    ("enumerate(range(0, T, block_q))", "enumerate(range(0, T - block_q + 1, block_q))"),
                    ("out = torch.empty(T, d, dtype=q.dtype)", "out = torch.zeros(T, d, dtype=q.dtype)"), task="ch22.2")
    assert result(report, "figure instance: 6 queries").status == "passed"   # T = 6 is a multiple of 2
    r = result(report, "ragged tiles")
    assert r.status == "failed"
    assert "query 8 is at position 10 − 10 + 8 = 8" in r.message and "yours 0" in r.message
    assert "hint: the last query block is ragged: T = 10 = 2·4 + 2, so there are ⌈10/4⌉ = 3 query blocks" in r.message


def test_ragged_key_block_dropped(graded):
    report = graded("ch22_floor_k",
                    # ⌊S / block_k⌋ key blocks: the last, ragged block of keys is never read
                    ("k_end = min(S, offset + q1) if causal else S",
                     "k_end = min(S // block_k * block_k, offset + q1) if causal else S // block_k * block_k"),
                    task="ch22.2")
    r = result(report, "figure instance: 6 queries")
    assert r.status == "failed"
    assert "tile (qb=2, kb=2): queries 4–5, keys 6–7 is missing from your trace" in r.message
    assert "hint: the last key block is ragged: S = 8 = 2·3 + 2" in r.message
    assert wrong_elements(report, "ch22-flash-tiles", "tile wrong")
    assert "the last key block is ragged: S = 10 = 3·3 + 1" in result(report, "ragged tiles").message


def test_lse_without_the_max(graded):
    report = graded("ch22_lse_no_max",
                    # lse = log l, forgetting that l was summed relative to the running max m
                    ("lse[q0:q1] = m + torch.log(l)", "lse[q0:q1] = torch.log(l)"), task="ch22.2")
    r = result(report, "figure instance: 6 queries")
    assert r.status == "failed"
    q, k, v = checks.flash_tensors()
    _, lse = ref.flash_attention(q, k, v, block_q=checks.FLASH_BQ, block_k=checks.FLASH_BK)
    assert f"lse[0]: expected log Σ_visible exp(q[0]·k/√4) = {fmt(lse[0])}" in r.message
    assert "hint: lse = m + log l: your lse is log l alone" in r.message
    assert wrong_elements(report, "ch22-flash-tiles")


# -- the memory limit, the trace model, the hints ----------------------------------------------------

def test_reference_passes_the_measured_check():
    report = check("ch22", solutions=True, task="ch22.2", hidden=True, seed=SEED)
    r = result(report, "no tensor of T·S")
    assert r.status == "passed", r.message


def test_memory_hints_follow_the_refused_size():
    def message(text: str, frames: list) -> str:
        e = StudentRaised("flash_attention", {"name": "RuntimeError", "message": text, "frames": frames,
                                              "out_of_memory": True})
        return str(hidden.explain_memory(e, 8192, 8192, 16, True, 256, 256, 4))

    refused = "DefaultCPUAllocator: can't allocate memory: you tried to allocate {} bytes. Error code 12"
    line = [["/x/ch22_flash_attention.py", 12, "flash_attention",
             "    m = torch.arange(S) <= torch.arange(T)[:, None]  # the whole mask"]]
    mask = message(refused.format(8192 * 8192), line)
    assert "it ran out at ch22_flash_attention.py:12, m = torch.arange(S) <= torch.arange(T)[:, None], asking for " \
           "64 MiB" in mask and "hint: a [T, S] causal mask is a full matrix too" in mask
    assert "hint: compute the scores tile by tile" in message(refused.format(4 * 8192 * 8192), line)
    strip = message(refused.format(4 * 256 * 8192), [])                    # one query block against every key
    assert "asking for 8 MiB" in strip and "hint: keep one tile at a time" in strip
    bare = message("", [])                                                  # a MemoryError says nothing more
    assert "all this check allows; the whole T × S" in bare and "hint: keep one tile at a time" in bare


@pytest.mark.parametrize("T, S, bq, bk, causal", [(6, 8, 2, 3, True), (10, 10, 4, 3, True), (5, 17, 3, 4, True),
                                                  (7, 5, 3, 2, False), (1, 9, 4, 4, True), (9, 13, 64, 64, True)])
def test_tiles_and_model_agree_with_the_reference(T, S, bq, bk, causal):
    q, k, v = torch.randn(T, 8, dtype=torch.float64), torch.randn(S, 8, dtype=torch.float64), \
        torch.randn(S, 8, dtype=torch.float64)
    trace: list = []
    out, lse = ref.flash_attention(q, k, v, causal, bq, bk, trace)
    assert [(r["qb"], r["kb"]) for r in trace] == models.tiles_to_visit(T, S, bq, bk, causal)
    m_out, m_lse, m_trace = models.flash_model(q, k, v, causal, bq, bk)
    assert torch.allclose(out, m_out) and torch.allclose(lse, m_lse)
    assert [(a[0], a[1]) for a in m_trace] == [(r["qb"], r["kb"]) for r in trace]
    naive, mid = ref.naive_attention(q, k, v, causal)
    assert torch.allclose(out, naive) and torch.allclose(lse, torch.logsumexp(mid["scores"], -1))


def test_stats_hints():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(n, 4, generator=g) * 3 for n in (6, 8, 8))
    trace = models.flash_model(q, k, v, True, 2, 3)[2]
    answers = flash.flash_models(None, q, k, v, True, 2, 3)
    qb, kb, m, l = next(r for r in trace if r[1] > 0 and r[2][1] > [x for x in trace if x[:2] == (r[0], r[1] - 1)][0][2][1])
    assert "unscaled" in flash.stats_hint(qb, kb, 1, m[1] / 0.5, l[1], 4, answers)
    stale = [x for x in trace if x[:2] == (qb, kb - 1)][0]
    assert "after the tile's update" in flash.stats_hint(qb, kb, 1, stale[2][1], stale[3][1], 4, answers)
    no_rescale = {x[:2]: x for x in models.flash_model(q, k, v, True, 2, 3, rescale_l=False)[2]}[qb, kb]
    assert "l = exp(m − m_new)·l" in flash.stats_hint(qb, kb, 1, m[1], no_rescale[3][1], 4, answers)
