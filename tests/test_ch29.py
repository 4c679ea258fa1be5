"""ch29 · execution metadata and metrics: the reference reproduces the worked examples of
reference/vllm_and_beyond.md §D.2 and §E.1 and agrees with numpy's statistics; wrong submissions get the
teaching message meant for them and the figures drawn from them mark the wrong cells."""

from __future__ import annotations

import random
import re

import pytest
from figure_layout import off_canvas, reference_figures, reference_records, texts
from mutate import mutant_grader, result, statuses, wrong_elements

from figures import ch29 as drawn
from figures.style import MARGIN
from grader.checks import ch29 as checks
from grader.hidden import ch29 as hidden_checks
from solutions import ch29_metadata_metrics as ref

SEED = 29


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return mutant_grader(tmp_path_factory, "ch29", SEED)


# -- the reference against the worked examples ---------------------------------------------------------------
def test_prepare_inputs_reproduces_the_worked_example_of_d2():
    out = ref.prepare_inputs(checks.make_requests(checks.D2), checks.D2_BLOCK)
    assert out["query_start_loc"].tolist() == [0, 4, 5, 6]
    assert out["positions"].tolist() == [4, 5, 6, 7, 8, 6]
    assert out["seq_lens"].tolist() == [8, 9, 7]
    assert out["slot_mapping"].tolist() == [12, 13, 14, 15, 36, 26]
    assert out["logits_indices"].tolist() == [3, 4, 5]
    assert out["kept"].tolist() == [False, True, True]
    # input ids: R0's prompt tokens at positions 4…7, R1's token 8, R2's newest output (position 6)
    assert out["input_ids"].tolist() == [104, 105, 106, 107, 208, 306]


def test_latency_metrics_reproduce_the_worked_example_of_e1():
    # 10 requests of 1000 input and 101 output tokens; TTFT 0.5 s, E2E 2.5 s; two tokens per chunk after the
    # first; the run lasts 5 s. TPOT 20 ms, ITL 40 ms, 2 req/s, 202 and 2202 tok/s.
    starts = [0.25 * i for i in range(9)] + [2.5]
    requests = [{"start": s, "chunk_times": [s + 0.5 + 0.04 * k for k in range(51)], "input_len": 1000, "output_len": 101} for s in starts]
    m = ref.latency_metrics(requests)
    assert m["mean_ttft_ms"] == pytest.approx(500) and m["mean_e2el_ms"] == pytest.approx(2500)
    assert m["mean_tpot_ms"] == pytest.approx(20) and m["mean_itl_ms"] == pytest.approx(40)
    assert m["request_throughput"] == pytest.approx(2) and m["output_throughput"] == pytest.approx(202)
    assert m["total_token_throughput"] == pytest.approx(2202)


def test_latency_metrics_agree_with_numpy_on_random_sets():
    class FakeTrial:
        random = random.Random(3)

    for n in (1, 2, 7, 50):
        requests = hidden_checks.random_times(FakeTrial(), n)
        got, want = ref.latency_metrics(requests), hidden_checks.numpy_metrics(requests)
        assert got == pytest.approx(want, rel=1e-9, abs=1e-9)


# -- 29.1 prepare_inputs ------------------------------------------------------------------------------------
def test_positions_from_zero_are_explained(graded):
    report = graded.mistake("positions_from_zero")  # positions counted within this step's chunk
    r = result(report, "figure instance", task="ch29.1")
    assert r.status == "failed"
    assert (
        "input 0 is request R0's token 0 of this step (R0 owns inputs 0…3), at position num_computed_tokens "
        "+ 0 = 4 + 0 = 4; yours: 0" in r.message
    )
    assert r.hints == ["positions_from_zero"]
    assert wrong_elements(report, "ch29-schedule-to-metadata")
    assert statuses(report, "ch29.2") == {"passed"}


def test_keeping_a_partial_prefill_sample_is_explained_and_marked(graded):
    report = graded.mistake("kept_partial")  # every sample kept, even a chunk's that stops before the last known token
    r = result(report, "figure instance", task="ch29.1")
    assert r.status == "failed"
    assert "kept[0]: R0's seq_len = 4 + 4 = 8 < its 10 known tokens, so its sample is discarded; yours: True" in r.message
    assert r.hints == ["kept_partial"]
    assert wrong_elements(report, "ch29-schedule-to-metadata")
    assert result(report, "a decode batch", task="ch29.1").status == "passed", "every decode sample is kept anyway"


def test_sampling_the_first_row_is_explained(graded):
    report = graded.mistake("first_row_logits")  # logits taken at each request's first scheduled row, not its last
    r = result(report, "figure instance", task="ch29.1")
    assert r.status == "failed"
    assert "logits_indices[0] = query_start_loc[1] − 1 = 4 − 1 = 3, R0's last input; yours: 0" in r.message
    assert r.hints == ["first_row_logits"]


# -- 29.2 latency_metrics -----------------------------------------------------------------------------------
def test_tpot_over_output_len_is_explained_and_marked(graded):
    report = graded.mistake("tpot_over_n")  # TPOT divided by every output token, the first one included
    r = result(report, "figure instance", task="ch29.2")
    assert r.status == "failed"
    assert "TPOT = (E2E − TTFT) / (output_len − 1), per request with output_len > 1: [200, 200] ms" in r.message
    assert "mean_tpot_ms = 200; yours: 160" in r.message
    assert r.hints == ["tpot_over_n"]
    assert wrong_elements(report, "ch29-latency-metrics")
    assert statuses(report, "ch29.1") == {"passed"}


def test_a_mean_of_per_request_itls_is_explained(graded):
    report = graded.mistake("itl_mean_of_means")  # one mean gap per request instead of every gap pooled
    r = result(report, "figure instance", task="ch29.2")
    assert r.status == "failed"
    assert "ITLs = gaps between successive chunks, of all requests pooled: [200, 200, 200, 200, 400, 400] ms" in r.message
    assert "mean_itl_ms = 266.7; yours: 300" in r.message
    assert r.hints == ["itl_mean_of_means"]


def test_dividing_by_the_sum_of_latencies_is_explained(graded):
    report = graded.mistake("duration_latencies")  # the run's duration taken as the sum of the requests' latencies
    r = result(report, "throughput divides by the whole run", task="ch29.2")
    assert r.status == "failed"
    assert "duration = last chunk − first start = 3.4 − 0 = 3.4 s; yours: 0.8" in r.message
    assert r.hints == ["duration_latencies"]


# -- the figures' layout ------------------------------------------------------------------------------------
def test_a_range_of_one_row_reads_row_n():
    assert drawn.rows_of(4, 5) == "row 4" and drawn.rows_of(0, 4) == "rows 0–3"
    svg = reference_figures("ch29")["ch29-schedule-to-metadata"]
    qsl = reference_records("ch29")["ch29-schedule-to-metadata"]["expected"]["query_start_loc"]
    ranges = [t for t in texts(svg) if re.fullmatch(r"R\d+: rows? .*", t.s)]
    assert [t.s for t in ranges] == [f"R{i}: {drawn.rows_of(a, e)}" for i, (a, e) in enumerate(zip(qsl, qsl[1:])) if e > a]
    assert any(e - a == 1 for a, e in zip(qsl, qsl[1:])), "the instance has a one-row range"
    assert [t.s for t in texts(svg) if re.search(r"\b(\d+)–\1\b", t.s)] == [], "no range from a row to itself"
    for a, b in zip(ranges, ranges[1:]):
        assert a.right < b.left, "neighbouring ranges' labels do not run into each other"
    assert off_canvas(svg, margin=MARGIN - 1) == []


# The input checks every task needs but none teaches are provided code (outside the solution regions): plain unit
# tests here, no graded checks.
OK_REQUEST = {"token_ids": [1, 2, 3], "num_computed_tokens": 0, "num_scheduled_tokens": 3, "block_table": [0]}
BAD_SCHEDULES = {
    "block_size 0": ([OK_REQUEST], 0),
    "no block_table": ([{k: v for k, v in OK_REQUEST.items() if k != "block_table"}], 4),
    "nothing scheduled": ([OK_REQUEST | {"num_scheduled_tokens": 0}], 4),
    "negative computed": ([OK_REQUEST | {"num_computed_tokens": -1}], 4),
    "beyond the known tokens": ([OK_REQUEST | {"num_computed_tokens": 1}], 4),
    "beyond the block table": ([OK_REQUEST], 2),
}


@pytest.mark.parametrize("case", BAD_SCHEDULES)
def test_the_provided_schedule_check_refuses_bad_inputs(case):
    with pytest.raises(ValueError):
        ref.prepare_inputs(*BAD_SCHEDULES[case])
    assert ref.prepare_inputs([OK_REQUEST], 4)["seq_lens"].tolist() == [3]


BAD_TIMESTAMPS = {
    "no requests": [],
    "no chunk": [(0.0, [], 3, 1)],
    "out of order": [(0.0, [0.5, 0.4], 3, 2)],
    "before the start": [(1.0, [0.5], 3, 1)],
    "more chunks than tokens": [(0.0, [0.1, 0.2, 0.3], 3, 2)],
    "negative input_len": [(0.0, [0.1], -1, 1)],
    "a run of 0 s": [(0.0, [0.0], 3, 1)],
}


@pytest.mark.parametrize("case", BAD_TIMESTAMPS)
def test_the_provided_timestamp_check_refuses_bad_inputs(case):
    with pytest.raises(ValueError):
        ref.latency_metrics(checks.make_times(BAD_TIMESTAMPS[case]))
    with pytest.raises(ValueError):
        ref.latency_metrics([{"start": 0.0, "chunk_times": [0.5], "input_len": 1}])  # no output_len
    assert ref.latency_metrics(checks.make_times([(0.0, [0.5], 3, 1)]))["completed"] == 1
