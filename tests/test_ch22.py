"""ch22 · naive attention vs FlashAttention: wrong submissions that embody real misconceptions fail with
the message that teaches the fix, and the figures drawn from them mark the wrong values."""

from __future__ import annotations

import math
import re

import pytest
import torch
from conftest import require_sandbox
from mutate import checks_not_passed, mutant_grader, result, row, wrong_elements

from grader.authoring.compare import CheckFailed, fmt
from grader.checks import ch22 as checks
from grader.checks import ch22_explain as explain
from grader.hidden import ch22 as hidden
from grader.hidden import ch22_models as models
from grader.isolation import portable
from grader.isolation.session import OverBudget
from grader.run import check
from solutions import ch22_flash_attention as ref

SEED = 22


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return mutant_grader(tmp_path_factory, "ch22", SEED)


# -- 22.1 naive_attention ----------------------------------------------------------------------------


def test_top_left_mask_is_explained(graded):
    report = graded.mistake("naive_topleft", task="ch22.1")  # the top-left tril, as SDPA's is_causal=True does
    r = result(report, "a chunk of 3 queries after 4 cached keys")
    assert r.status == "failed"
    assert "query 0 is at position 7 − 3 + 0 = 4 and sees keys 0 … 4" in r.message
    assert "scores[0, 1]: expected q[0]·k[1]/√8" in r.message and "yours −∞" in r.message
    assert r.hints == ["naive_topleft"]
    # With T == S the two alignments agree: the figure instance passes and its figure is clean.
    assert result(report, "figure instance: naive attention").status == "passed"
    assert not wrong_elements(report, "ch22-naive")


def test_unscaled_scores_are_explained_and_drawn(graded):
    report = graded.mistake("unscaled", task="ch22.1")  # the 1/√d forgotten: raw dot products go into the softmax
    r = result(report, "figure instance: naive attention")
    assert r.status == "failed"
    q, k, v = checks.naive_tensors()
    want = ref.naive_attention(q, k, v)[1]["scores"]
    dot = float(q[0] @ k[0])
    assert f"scores[0, 0]: expected q[0]·k[0]/√2 = {fmt(dot)}/{fmt(math.sqrt(2))} = {fmt(want[0, 0])}; yours {fmt(dot)}" in r.message
    assert r.hints == ["unscaled"]
    assert wrong_elements(report, "ch22-naive"), "the student's scores, probs and out are marked"
    assert {x.status for x in report.results if "HBM bytes" in x.name} == {"passed"}


def test_masking_with_zero_is_explained(graded):
    report = graded.mistake("fill_zero", task="ch22.1")  # exp(0) = 1 still weighs the future keys
    r = result(report, "figure instance: naive attention")
    assert r.status == "failed"
    assert "scores[0, 1]: expected −∞ (key 1 is in the future of query 0); yours 0" in r.message
    assert r.hints == ["fill_zero"]


# -- 22.1 attention_hbm_bytes ------------------------------------------------------------------------


def test_one_crossing_per_matrix_is_explained_and_drawn(graded):
    report = graded.mistake("one_crossing", task="ch22.1")  # the [T, S] matrices written, never read back
    r = result(report, "figure instance: HBM bytes")
    assert r.status == "failed"
    want = ref.attention_hbm_bytes(4, 4, 2, 4, flash=False)
    assert f"(2·4·2 + 2·4·2 + 4·4·4)·4 = {want:,} bytes" in r.message
    assert f"yours: {want - 2 * 16 * 4:,}" in r.message
    assert r.hints == ["one_crossing"]
    assert wrong_elements(report, "ch22-naive"), "the student's byte counts are marked"
    assert result(report, "figure instance: naive attention").status == "passed"


def test_lse_in_the_inputs_dtype_is_explained(graded):
    report = graded.mistake("lse_dtype", task="ch22.1")  # the log-sum-exp counted at dtype_bytes
    r = result(report, "figure instance: HBM bytes")
    assert r.status == "failed"
    assert "flash=True" in r.message and f"= {ref.attention_hbm_bytes(4096, 4096, 128, 2, flash=True):,} bytes" in r.message
    assert r.hints == ["lse_dtype"]


def test_traffic_hints():
    T, S, d, b = 4096, 2048, 128, 2
    io = (2 * T * d + 2 * S * d) * b
    hint = lambda got, flash: getattr(checks.traffic_hint(got, T, S, d, b, flash), "id", "")
    assert hint(io + 2 * T * S * b, False) == "one_crossing"
    assert hint((T * d + 2 * S * d + 4 * T * S) * b, False) == "no_output"
    assert hint(io, True) == "no_lse"
    naive = ref.attention_hbm_bytes(T, S, d, b, flash=False)
    assert hint(naive, True) == "flash_counts_matrices"
    assert hint(naive // b, False) == "elements"
    assert hint(8 * naive, False) == "bits"
    assert checks.traffic_hint(naive + 1, T, S, d, b, False) == ""
    with pytest.raises(CheckFailed) as e:
        checks.expect_traffic(float(naive), naive, T, S, d, b, False)
    assert "as a Python int; yours: float" in str(e.value) and e.value.hints == ["float_bytes"]


# -- 22.2 flash_attention ----------------------------------------------------------------------------


def test_forgetting_to_rescale_the_accumulator(graded):
    report = graded.mistake("acc_not_rescaled", task="ch22.2")  # acc += p·V, the old acc never multiplied by α
    r = result(report, "figure instance: 6 queries")
    assert r.status == "failed"
    assert "(naive attention); yours" in r.message
    assert r.hints == ["acc_not_rescaled"]
    # m and l are right, so the trace's cells are clean; the rows whose max grew have a wrong output.
    assert wrong_elements(report, "ch22-flash-tiles") and not wrong_elements(report, "ch22-flash-tiles", "tile wrong")
    assert result(report, "no tensor of T·S elements").status == "failed"  # a wrong answer fails there too


def test_forgetting_to_rescale_the_running_sum(graded):
    report = graded.mistake("l_not_rescaled", task="ch22.2")  # the old terms stay measured against the old max
    r = result(report, "ragged tiles")
    assert r.status == "failed"
    assert r.hints == ["l_not_rescaled"]
    assert wrong_elements(report, "ch22-flash-tiles")


def test_top_left_causal_tiles(graded):
    report = graded.mistake("flash_topleft", task="ch22.2")  # positions counted from 0 for the new queries
    r = result(report, "figure instance: 6 queries")
    assert r.status == "failed"
    assert "tile (qb=0, kb=1): queries 0–1, keys 3–5 is missing from your trace" in r.message
    assert r.hints == ["flash_topleft"]
    assert wrong_elements(report, "ch22-flash-tiles", "tile wrong"), "the tiles it failed to visit are marked"
    chunk = result(report, "a chunk of 5 queries after 7 cached keys")
    assert chunk.status == "failed" and chunk.hints == ["flash_topleft"]
    # With T == S nothing changes.
    assert result(report, "agrees with naive attention: T = S = 16").status == "passed"


def test_visiting_future_tiles_is_caught_by_the_trace(graded):
    report = graded.mistake("no_skip", task="ch22.2")  # future tiles masked entirely instead of skipped
    # The output is right (a fully masked tile adds exp(−inf) = 0); only the trace shows the wasted tiles.
    assert checks_not_passed(report) == [result(report, "figure instance: 6 queries").name, result(report, "the trace:").name]
    r = result(report, "figure instance: 6 queries")
    assert (
        "your trace visits tile (qb=0, kb=2): queries 0–1, keys 6–7; its last query, at position 3, sees keys "
        "0 … 3 < 6: the whole tile is in the future"
    ) in r.message
    assert r.hints == ["no_skip"]
    assert wrong_elements(report, "ch22-flash-tiles", "tile wrong")


def memory_failure(report):
    """The measured check's result for the causal T = S = 8192 case, after making sure only it failed."""
    assert checks_not_passed(report) == ["no tensor of T·S elements is ever created (measured)"]
    r = result(report, "no tensor of T·S")
    assert "case: T=8192 queries, S=8192 keys, d=16, causal=True, block_q=256, block_k=256" in r.message
    allows = f"where this check allows {hidden.FLASH_SPARE >> 20} MiB"
    assert re.search(rf"your flash_attention used (about|at least) [\d.,]+ MiB beyond its inputs, {allows}", r.message), r.message
    assert "the whole T × S score matrix alone is 256 MiB (a [T, S] bool mask 64 MiB)" in r.message
    assert "FlashAttention never holds it: each step works on one tile [256, 256] of scores (0.25 MiB)" in r.message
    return r


def test_full_score_matrix_does_not_fit_the_measured_check(graded):
    r = memory_failure(graded.mistake("full_scores", task="ch22.2"))  # q @ k.T once, then sliced into "tiles"
    assert used_beyond(r) >= 256
    assert r.hints == ["full_scores"]


def test_full_causal_mask_does_not_fit_the_measured_check(graded):
    r = memory_failure(graded.mistake("full_mask", task="ch22.2"))  # the mask built once, then sliced per tile
    assert 64 <= used_beyond(r) < 256 and r.hints == ["full_mask"]


def test_a_full_matrix_made_with_dispatch_modes_switched_off_is_still_measured(graded):
    # Switching off torch's dispatch modes hid the matrix from a recorder inside the student's process; the
    # memory limit is the kernel's, outside it.
    (old, new), tiles = row("ch22", "full_scores").edits
    unseen = new.replace(
        "    full = ",
        "    import torch.utils._python_dispatch\n    with torch.utils._python_dispatch._disable_current_modes():\n        full = ",
    )
    r = memory_failure(graded("ch22_full_scores_unseen", (old, unseen), tiles, task="ch22.2"))
    assert used_beyond(r) >= 256


NAIVE = """
import torch

def naive(q, k, v, causal):
    T, S = q.shape[0], k.shape[0]
    scores = (q @ k.T) * q.shape[1] ** -0.5
    if causal:
        scores = scores.masked_fill(torch.arange(S) > torch.arange(T)[:, None] + (S - T), float("-inf"))
    return torch.softmax(scores, -1) @ v, torch.logsumexp(scores, -1)
"""
HELPER = NAIVE + 'import sys\ntorch.save(naive(*torch.load(sys.argv[1] + "/in.pt")), sys.argv[1] + "/out.pt")\n'
OUTSOURCED = (
    NAIVE
    + f"""
import subprocess, sys, tempfile

def flash_attention(q, k, v, causal=True, block_q=64, block_k=64):
    if q.shape[0] * k.shape[0] < 1 << 20:  # small instances here (quick, and wrong where a trace is asked)
        return naive(q, k, v, causal)
    folder = tempfile.mkdtemp()  # large ones in a helper: a fresh process with an address space of its own
    torch.save((q, k, v, causal), folder + "/in.pt")
    subprocess.run([sys.executable, "-c", {HELPER!r}, folder], check=True)
    return torch.load(folder + "/out.pt")
"""
)


@pytest.mark.parametrize("budget", ["cgroup", "watchdog"])
def test_a_helper_process_that_computes_the_whole_matrix_is_measured_too(tmp_path, budget, monkeypatch):
    """The naive answer moved into a helper process of its own (a fresh address space, which a cap on the call's
    own process never saw): the budget measures every process the call starts, so it fails like the naive one."""
    require_sandbox()
    if budget == "watchdog":
        monkeypatch.setattr(portable, "FORCED", True)  # the box's budget is then the watchdog's
    (tmp_path / "ch22_flash_attention.py").write_text(OUTSOURCED)
    report = check("ch22", submission=tmp_path, task="ch22.2", hidden=True, seed=SEED, figures_dir=None, sandbox="bwrap")
    r = result(report, "no tensor of T·S")
    assert r.status == "failed", r.message
    assert used_beyond(r) >= 256 and r.hints == ["full_scores"], r.message


def used_beyond(r) -> float:
    """The MiB a failed measured check says the call used beyond its inputs."""
    found = re.search(r"used (?:about |at least )?([\d.,]+) MiB beyond its inputs", r.message)
    assert found, r.message
    return float(found.group(1).replace(",", ""))


def test_ragged_query_block_dropped(graded):
    report = graded.mistake("floor_q_blocks", task="ch22.2")  # ⌊T / block_q⌋ query blocks: the last never computed
    assert result(report, "figure instance: 6 queries").status == "passed"  # T = 6 is a multiple of 2
    r = result(report, "ragged tiles")
    assert r.status == "failed"
    assert "query 8 is at position 10 − 10 + 8 = 8" in r.message and "yours 0" in r.message
    assert r.hints == ["floor_q_blocks"]


def test_ragged_key_block_dropped(graded):
    report = graded.mistake("floor_k_blocks", task="ch22.2")  # ⌊S / block_k⌋ key blocks: the last never read
    r = result(report, "figure instance: 6 queries")
    assert r.status == "failed"
    assert "tile (qb=2, kb=2): queries 4–5, keys 6–7 is missing from your trace" in r.message
    assert r.hints == ["floor_k_blocks"]
    assert wrong_elements(report, "ch22-flash-tiles", "tile wrong")
    assert result(report, "ragged tiles").hints == ["floor_k_blocks"]


def test_lse_without_the_max(graded):
    report = graded.mistake("lse_without_max", task="ch22.2")  # l was summed relative to the running max m
    r = result(report, "figure instance: 6 queries")
    assert r.status == "failed"
    q, k, v = checks.flash_tensors()
    _, lse = ref.flash_attention(q, k, v, block_q=checks.FLASH_BQ, block_k=checks.FLASH_BK)
    assert f"lse[0]: expected log Σ_visible exp(q[0]·k/√4) = {fmt(lse[0])}" in r.message
    assert r.hints == ["lse_without_max"]
    assert wrong_elements(report, "ch22-flash-tiles")


# -- the memory limit, the trace model, the hints ----------------------------------------------------


def test_reference_passes_the_measured_check():
    report = check("ch22", solutions=True, task="ch22.2", hidden=True, seed=SEED)
    r = result(report, "no tensor of T·S")
    assert r.status == "passed", r.message


def test_memory_hints_follow_the_measured_use():
    inputs = 3 * 8192 * 16 * 4

    def failure(used: int) -> CheckFailed:
        e = OverBudget("flash_attention", inputs + used, inputs + hidden.FLASH_SPARE, stopped=False, what="this check allows")
        return hidden.explain_memory(e, inputs, 8192, 8192, 16, True, 256, 256, 4)

    mask = failure(8192 * 8192 + (1 << 20))
    assert "used about 65 MiB beyond its inputs, where this check allows 24 MiB" in str(mask) and mask.hints == ["full_mask"]
    assert failure(4 * 8192 * 8192).hints == ["full_scores"]
    strip = failure(4 * 256 * 8192)  # one query block against every key
    assert "used about 8 MiB beyond" in str(strip) and strip.hints == ["one_tile"]
    stopped = hidden.explain_memory(
        OverBudget("flash_attention", 2 << 30, inputs + hidden.FLASH_SPARE, stopped=True), inputs, 8192, 8192, 16, True, 256, 256, 4
    )
    assert "used at least 1.999 GiB beyond its inputs" in str(stopped) and stopped.hints == ["full_scores"]


@pytest.mark.parametrize(
    "T, S, bq, bk, causal",
    [(6, 8, 2, 3, True), (10, 10, 4, 3, True), (5, 17, 3, 4, True), (7, 5, 3, 2, False), (1, 9, 4, 4, True), (9, 13, 64, 64, True)],
)
def test_tiles_and_model_agree_with_the_reference(T, S, bq, bk, causal):
    q, k, v = torch.randn(T, 8, dtype=torch.float64), torch.randn(S, 8, dtype=torch.float64), torch.randn(S, 8, dtype=torch.float64)
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
    answers = explain.flash_models(None, q, k, v, True, 2, 3)
    qb, kb, m, l = next(r for r in trace if r[1] > 0 and r[2][1] > [x for x in trace if x[:2] == (r[0], r[1] - 1)][0][2][1])
    hint = lambda *a: getattr(explain.stats_hint(*a, 4, answers), "id", "")
    assert hint(qb, kb, 1, m[1] / 0.5, l[1]) == "trace_unscaled_m"
    stale = [x for x in trace if x[:2] == (qb, kb - 1)][0]
    assert hint(qb, kb, 1, stale[2][1], stale[3][1]) == "trace_stale"
    no_rescale = {x[:2]: x for x in models.flash_model(q, k, v, True, 2, 3, rescale_l=False)[2]}[qb, kb]
    assert hint(qb, kb, 1, m[1], no_rescale[3][1]) == "l_not_rescaled"
    # the tile's own max, where an earlier tile's was larger
    own = {x[:2]: x for x in models.flash_model(q, k, v, True, 2, 3, running_max=False)[2]}
    qb, kb, m, l = next(x for x in trace if x[1] > 0 and any(a < b for a, b in zip(own[x[:2]][2], x[2])))
    r = next(i for i, (a, b) in enumerate(zip(own[qb, kb][2], m)) if a < b)
    assert hint(qb, kb, r, own[qb, kb][2][r], l[r]) == "trace_tile_max"


def test_causal_attention_where_none_was_asked_is_named():
    """causal=False with the causal mask applied anyway: no edit of the reference reaches it past the other checks
    (with S < T its first rows see no key at all), so its values are made here."""
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(n, 8, generator=g) for n in (6, 9, 9))
    models_ = explain.flash_models(None, q, k, v, False, 2, 4)
    out, lse = (x.float() for x in models_["variants"]["causal flipped"])
    want_out, mid = ref.naive_attention(q, k, v, causal=False)
    want_lse = torch.logsumexp(mid["scores"], dim=-1)
    with pytest.raises(CheckFailed) as e:
        explain.explain_flash(out, lse, want_out, want_lse, q, k, v, causal=False, bq=2, bk=4, case="not causal", models=models_)
    assert e.value.hints == ["flash_causal_always"]


# -- the provided input checks (outside the solution regions: unit tests, no graded checks) ---------------------

z = torch.zeros
BAD_QKV = {
    "causal with S < T": (z(5, 4), z(3, 4), z(3, 4)),
    "k and v of other shapes": (z(2, 4), z(5, 4), z(4, 4)),
    "v of another d": (z(2, 4), z(5, 4), z(5, 8)),
    "q of another d": (z(2, 8), z(5, 4), z(5, 4)),
    "q not 2-D": (z(2, 2, 4), z(5, 4), z(5, 4)),
    "no keys": (z(0, 4), z(0, 4), z(0, 4)),
    "integer tensors": (z(2, 4, dtype=torch.int64), z(5, 4, dtype=torch.int64), z(5, 4, dtype=torch.int64)),
    "mixed dtypes": (z(2, 4), z(5, 4, dtype=torch.float64), z(5, 4, dtype=torch.float64)),
}


@pytest.mark.parametrize("case", BAD_QKV)
@pytest.mark.parametrize("fn", [ref.naive_attention, ref.flash_attention], ids=["naive", "flash"])
def test_the_provided_qkv_check_refuses_bad_inputs(fn, case):
    with pytest.raises(ValueError):
        fn(*BAD_QKV[case])


def test_not_causal_attention_may_have_fewer_keys_than_queries():
    q, k, v = torch.randn(5, 4), torch.randn(3, 4), torch.randn(3, 4)
    out, _ = ref.flash_attention(q, k, v, causal=False, block_q=2, block_k=2)
    torch.testing.assert_close(out, ref.naive_attention(q, k, v, causal=False)[0])


@pytest.mark.parametrize("blocks", [{"block_q": 0}, {"block_k": -2}, {"block_q": 2.0}, {"block_k": True}])
def test_the_provided_block_check_refuses_bad_sizes(blocks):
    with pytest.raises(ValueError):
        ref.flash_attention(z(2, 4), z(5, 4), z(5, 4), **blocks)


@pytest.mark.parametrize(
    "args, flash",
    [((16, 16, 0, 2), True), ((-1, 16, 64, 2), False), ((16.0, 16, 64, 2), False), ((16, 16, 64, 0), False), ((16, 16, 64, 2), 1)],
)
def test_the_provided_traffic_check_refuses_bad_sizes(args, flash):
    with pytest.raises(ValueError):
        ref.attention_hbm_bytes(*args, flash=flash)
