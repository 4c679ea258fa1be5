"""ch24 · the control loop and its counters: wrong schedulers and counters that embody real misconceptions get
the trace message meant for them, the figures drawn from them mark the wrong cells, and the reference agrees
with the facts of nano-vllm bb823b3 and vLLM v1 (reference/nanovllm.md §11, vllm_and_beyond.md §A.5)."""

from __future__ import annotations

import copy

import pytest
from mutate import figure, mutant_grader, result, tasks_not_passed, wrong_elements

from figures.kit import Figure, text_width
from grader.checks import ch24 as checks
from grader.checks import ch24_explain as tracing
from grader.hidden import ch24 as hidden_checks
from solutions import ch24_scheduler as ref

SEED = 24
SVG = "{http://www.w3.org/2000/svg}"
CHUNKING = tracing.script(
    "chunking and FCFS",
    [
        tracing.request("A", [5, 5, 5, 5], 2, [41, 42]),
        tracing.request("B", list(range(20, 29)), 2, [43, 44]),
        tracing.request("C", [7, 7], 2, [45, 46]),
    ],
    num_blocks=16,
    block_size=4,
    max_num_seqs=4,
    max_num_batched_tokens=6,
    eos=0,
)
PREEMPTION = tracing.script(
    "preemption",
    [tracing.request(name, list(range(4 * i + 1, 4 * i + 5)), 6, [10 * (i + 1) + j for j in range(1, 7)]) for i, name in enumerate("ABCD")],
    num_blocks=5,
    block_size=4,
    max_num_seqs=2,
    max_num_batched_tokens=16,
    eos=0,
)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return mutant_grader(tmp_path_factory, "ch24", SEED)


# -- 24.1 the scheduler ---------------------------------------------------------------------------------
def test_chunk_not_counted(graded):
    report = graded.mistake("chunk_not_counted")  # postprocess forgets to count the chunk
    r = result(report, "figure instance: one request")
    assert r.status == "failed"
    assert "step 1 of 5: schedule() → prefill [A: tokens 0–3 of 10]" in r.message
    assert "the runner returned A → 37 (candidate of an unfinished chunk)" in r.message
    assert ("after step 1 request A should be WAITING with num_computed_tokens 4; yours has 0: the chunk was not counted") in r.message
    assert r.hints == ["chunk_not_counted"]
    assert tasks_not_passed(report) == {"ch24.1"}
    inv = result(report, "invariants of your own trace")
    assert inv.status == "failed" and "was scheduled but its num_computed_tokens did not grow" in inv.message
    assert wrong_elements(report, "ch24-control-loop")
    assert not wrong_elements(report, "ch24-three-progress")


def test_instance_chips_hold_their_text(graded):
    root = figure(graded.mistake("chunk_not_counted"), "ch24-control-loop")
    elements = list(root.iter())
    boxes = [el for el in elements if el.get("class") == "box" and el.get("height") == "30"]
    assert len(boxes) == 4
    right = 0.0
    for box in boxes:
        x, w = float(box.get("x")), float(box.get("width"))
        label = elements[elements.index(box) + 1]
        assert label.tag == f"{SVG}text" and abs(float(label.get("x")) - (x + w / 2)) < 0.5
        need = text_width(label.text, float(label.get("font-size")), "Mono" in label.get("font-family"))
        assert w >= need + 2 * Figure.CHIP_PAD, (label.text, w, need)
        assert x >= right, "chips do not overlap"
        right = x + w


def test_unset_cached_count_is_explained(graded):
    texts = list(figure(graded.mistake("chunk_not_counted"), "ch24-three-progress").iter(f"{SVG}text"))
    # the start row's num_cached_tokens is vLLM's −1, "not set yet": the figure says what it means
    start = next(i for i, el in enumerate(texts) if el.text == "before the first step")
    assert "−1" in [el.text for el in texts[start : start + 20] if el.get("class") == "value"]
    assert [el.text for el in texts if el.get("class") == "note unset"] == ["−1: not set until admitted"]
    assert any("num_cached_tokens starts at −1" in (el.text or "") for el in texts)


def test_candidate_of_an_unfinished_chunk_appended(graded):
    # the runner's token is appended after every prefill chunk, finished or not
    report = graded.mistake("append_candidate", task="ch24.1")
    r = result(report, "figure instance: one request")
    assert r.status == "failed"
    assert (
        "after step 1 request A should be WAITING with num_tokens 10; yours has 11: the candidate token of an unfinished chunk was appended"
    ) in r.message
    assert r.hints == ["append_candidate"]
    assert wrong_elements(report, "ch24-control-loop")
    hidden = result(report, "hundreds of requests")
    assert hidden.status != "passed"


def test_preempted_from_the_head(graded):
    # the victim taken from the left end of running (the oldest) instead of the right end
    report = graded.mistake("head_victim", task="ch24.1")
    r = result(report, "memory pressure: preemption from the tail")
    assert r.status == "failed"
    assert "after step 3's schedule() waiting should be [D] and running [A, B, C]; yours: waiting [C]" in r.message
    assert r.hints == ["head_victim"]
    assert result(report, "figure instance").status == "passed"


def test_decode_before_prefill(graded):
    # waiting requests are admitted only when nothing is running: decodes go first
    r = result(graded.mistake("decode_first", task="ch24.1"), "prefill before decode")
    assert r.status == "failed"
    assert "step 3 should be a prefill of [B, C]; yours decodes [A]" in r.message
    assert r.hints == ["decode_first"]


def test_second_sequence_chunked(graded):
    # any sequence may take a chunk of what is left of the budget, not only the first
    r = result(graded.mistake("second_chunked", task="ch24.1"), "only the first sequence of a batch is chunked")
    assert r.status == "failed"
    assert "step 1's prefill batch should be [A]; yours is [A, B]" in r.message
    assert r.hints == ["second_chunked"]


def test_finished_sequence_keeps_its_blocks(graded):
    # a finished sequence is removed from running but its blocks are never returned
    report = graded.mistake("no_free_on_finish", task="ch24.1")
    r = result(report, "figure instance")
    assert r.status == "failed"
    assert "after step 5 request A should be FINISHED with blocks 0; yours has 3" in r.message
    assert r.hints == ["no_free_on_finish"]
    inv = result(report, "invariants of your own trace")
    assert inv.status == "failed" and "is FINISHED but is still queued or holds" in inv.message


# The input checks every task needs but none teaches are provided code (outside the solution regions): plain unit
# tests here, no graded checks.
def test_the_provided_add_check_refuses_what_is_not_new_or_never_fits():
    sched = ref.make_scheduler(3, 4, 4, 16, eos=0)
    with pytest.raises(ValueError, match="can never fit"):  # 9 + 5 − 1 = 13 tokens need 4 blocks of 4
        sched.add(ref.Sequence(list(range(1, 10)), max_tokens=5))
    fits = ref.Sequence(list(range(1, 10)), max_tokens=4)  # 9 + 4 − 1 = 12 tokens: exactly the 3 blocks
    sched.add(fits)
    with pytest.raises(ValueError, match="only a new request"):
        sched.add(fits)  # already waiting
    seqs, is_prefill = sched.schedule()
    assert seqs == [fits] and is_prefill
    with pytest.raises(ValueError, match="only a new request"):
        sched.add(fits)  # running, holds blocks
    with pytest.raises(ValueError, match="one sampled token per scheduled sequence"):
        sched.postprocess(seqs, [], is_prefill)
    with pytest.raises(ValueError, match="one sampled token per scheduled sequence"):
        sched.postprocess(seqs, [1, 2], is_prefill)
    sched.postprocess(seqs, [7], is_prefill)
    assert fits.completion_token_ids == [7]


def test_the_provided_schedule_check_refuses_an_empty_scheduler():
    with pytest.raises(ValueError, match="nothing to schedule"):
        ref.make_scheduler(3, 4, 4, 16, eos=0).schedule()


RUNNING = {"num_prompt_tokens": 6, "num_tokens": 7, "num_computed_tokens": 6, "num_cached_tokens": 0}


@pytest.mark.parametrize(
    "progress, args, kwargs",
    [
        ({"num_tokens": 3}, (1,), {}),  # incomplete counters
        ({**RUNNING, "num_computed_tokens": 9}, (1,), {}),  # computed beyond num_tokens
        ({**RUNNING, "num_tokens": 5}, (1,), {}),  # fewer tokens than the prompt
        ({**RUNNING, "num_cached_tokens": -2}, (1,), {}),
        (RUNNING, (-1,), {}),
        (RUNNING, (1,), {"prefix_hit": -4}),  # negative
        (RUNNING, (1,), {"preempted": True}),
        (RUNNING, (0,), {"preempted": True, "prefix_hit": 4}),
        (RUNNING, (1,), {"prefix_hit": 4}),  # a hit after admission
        (checks.start_progress(8), (0,), {"prefix_hit": 4}),
    ],
)  # a hit without a scheduled step
def test_the_provided_progress_check_refuses_impossible_steps(progress, args, kwargs):
    with pytest.raises(ValueError):
        ref.progress_after_step(dict(progress), *args, **kwargs)


def test_the_provided_progress_check_lets_every_possible_step_through():
    assert ref.progress_after_step(dict(RUNNING), 0, preempted=True)["num_computed_tokens"] == 0
    assert ref.progress_after_step(dict(RUNNING), 0) == RUNNING
    assert ref.progress_after_step(dict(RUNNING), 1)["num_tokens"] == 8
    assert ref.progress_after_step(checks.start_progress(8), 4, prefix_hit=4)["num_tokens"] == 9


@pytest.mark.parametrize("max_tokens", [0, -1])
def test_a_request_needs_a_bound_on_its_completion(max_tokens):
    # vLLM's SamplingParams._verify_args refuses max_tokens < 1; in nano-vllm a 0 only means that its finish test
    # (num_completion_tokens == max_tokens, after the append) never matches
    with pytest.raises(ValueError, match="max_tokens must be at least 1"):
        ref.Sequence([1, 2, 3], max_tokens=max_tokens)


def test_max_tokens_is_compared_after_the_append():
    steps, (one, two) = run_reference(
        dict(num_blocks=8, block_size=4, max_num_seqs=4, max_num_batched_tokens=16, eos=-1), [(3, 1), (3, 2)], lambda q: 5
    )
    assert (one.completion_token_ids, two.completion_token_ids) == ([5], [5, 5])
    assert [p for p, *_ in steps] == [True, False]


def test_a_step_that_raises_is_reported_with_what_it_did(graded):
    # postprocess raises in the first step: the step is described, then what was raised and where
    report = graded(
        "postprocess_raises",
        ("            seq.num_scheduled_tokens = 0\n", "            seq.num_scheduled_tokens = 0\n            1 / 0\n"),
        task="ch24.1",
    )
    r = result(report, "figure instance: one request")
    assert r.status == "failed"
    assert "step 1 of 5: schedule() → prefill [A: tokens 0–3 of 10]" in r.message
    assert "your code raised ZeroDivisionError: division by zero" in r.message
    assert "in postprocess: 1 / 0" in r.message


# Hints no edit of the reference makes: the explanation of a made-up difference names them.
def explained(sc: dict, change) -> checks.CheckFailed:
    """The failure for the reference's trace of `sc` with `change(records)` applied to a copy of it."""
    expected = ref.replay(sc)
    yours = copy.deepcopy(expected)
    change(yours)
    with pytest.raises(checks.CheckFailed) as e:
        tracing.check_trace(sc, yours, expected)
    return e.value


def test_a_prefill_where_nothing_fits_is_told_fcfs_waits():
    sc = tracing.script(
        "full pool",
        [tracing.request("A", list(range(1, 9)), 4, [9, 9, 9, 9]), tracing.request("B", list(range(1, 9)), 1, [9], arrive=1)],
        num_blocks=3,
        block_size=4,
        max_num_seqs=2,
        max_num_batched_tokens=16,
        eos=0,
    )
    failure = explained(sc, lambda yours: yours[1].update(prefill=True, batch=["B"]))
    assert "step 2 should decode [A]; yours prefills [B]" in str(failure)
    assert failure.hints == ["prefill_without_blocks"]


def test_a_skipped_head_is_told_strict_fcfs():
    failure = explained(CHUNKING, lambda yours: yours[0].update(batch=["A", "C"]))
    assert "step 1's prefill batch should be [A]; yours is [A, C]" in str(failure)
    assert failure.hints == ["skip_head"]


def test_a_head_without_blocks_ends_the_batch():
    sc = tracing.script(
        "no blocks for B",
        [tracing.request("A", [1, 2, 3, 4], 2, [9, 9]), tracing.request("B", list(range(1, 9)), 1, [9])],
        num_blocks=2,
        block_size=4,
        max_num_seqs=2,
        max_num_batched_tokens=16,
        eos=0,
    )
    failure = explained(sc, lambda yours: yours[0].update(batch=["A", "B"]))
    assert failure.hints == ["admit_without_blocks"]


def preemption_step(trace: list[dict]) -> int:
    return next(k for k, rec in enumerate(trace) if not rec["prefill"] and rec["sched"]["waiting"])


def test_a_victim_left_in_the_batch_is_told_to_be_preempted():
    k = preemption_step(ref.replay(PREEMPTION))
    failure = explained(PREEMPTION, lambda yours: yours[k].update(batch=["A", "D"]))
    assert failure.hints == ["no_preemption"]


def test_a_preemption_where_none_is_needed_is_told_the_rule():
    trace = ref.replay(PREEMPTION)
    k = next(k for k, rec in enumerate(trace) if k and not rec["prefill"] and not rec["sched"]["waiting"])

    def preempt_last(yours: list[dict]) -> None:
        sched = yours[k]["sched"]
        victim = yours[k - 1]["after"]["running"][-1]
        sched["running"] = [n for n in sched["running"] if n != victim]
        sched["waiting"] = [victim] + sched["waiting"]

    assert explained(PREEMPTION, preempt_last).hints == ["wrong_victim"]


def test_scheduled_tokens_outside_the_batch_are_named():
    failure = explained(CHUNKING, lambda yours: yours[0]["sched"]["seqs"]["B"].update(num_scheduled_tokens=2))
    assert failure.hints == ["scheduled_leftover"]


def test_blocks_for_the_chunk_only_are_named():
    failure = explained(checks.LOOP_CASE, lambda yours: yours[0]["sched"]["seqs"]["A"].update(blocks=1))
    assert "after step 1's schedule() request A should be WAITING with blocks 3; yours has 1" in str(failure)
    assert failure.hints == ["chunk_blocks"]


def test_blocks_missing_from_the_free_list_are_named():
    failure = explained(checks.LOOP_CASE, lambda yours: yours[-1]["after"].update(free=yours[-1]["after"]["free"] - 1))
    assert failure.hints == ["blocks_lost"]


def test_the_harness_reports_a_trace_that_stops_early_or_goes_on():
    expected = ref.replay(CHUNKING)
    with pytest.raises(
        checks.CheckFailed, match=f"step 3 of {len(expected)}: .*\n.*\n.*\nyour trace stopped after 2 steps, before this one"
    ):
        tracing.check_trace(CHUNKING, expected[:2], expected)
    extra = copy.deepcopy(expected[-1])
    with pytest.raises(
        checks.CheckFailed,
        match=f"the reference's trace ends after step {len(expected)}; yours goes on to a step .*: every request has finished",
    ):
        tracing.check_trace(CHUNKING, expected + [extra], expected)
    with pytest.raises(checks.CheckFailed, match="replay should return a list of dicts"):
        tracing.check_trace(CHUNKING, {"not": "a list"}, expected)
    broken = copy.deepcopy(expected)
    del broken[1]["sched"]["seqs"]
    with pytest.raises(checks.CheckFailed, match="record of step 2 is not in the documented form"):
        tracing.check_trace(CHUNKING, broken, expected)


# -- 24.2 the counters -----------------------------------------------------------------------------------
def test_cached_set_again_on_readmission(graded):
    # num_cached_tokens overwritten by every admission instead of set once
    report = graded.mistake("cached_again", task="ch24.2")
    r = result(report, "figure instance: a prefix hit")
    assert r.status == "failed"
    assert ("num_cached_tokens after step 6 should be 4 (it was set at the first admission and never changes: 4); yours: 8") in r.message
    assert r.hints == ["cached_again"]
    assert wrong_elements(report, "ch24-three-progress")


def test_cached_is_the_computed_count(graded):
    # num_cached_tokens read as nano-vllm HEAD's name: the computed count
    r = result(graded.mistake("cached_is_computed", task="ch24.2"), "figure instance: a prefix hit")
    assert r.status == "failed"
    assert "num_cached_tokens after step 1 should be 4 (the first admission sets it, once, to the prefix hit" in r.message
    assert "yours: 8" in r.message and r.hints == ["cached_is_computed"]


def test_sample_of_a_partial_chunk_kept(graded):
    # every scheduled step appends its sample, finished prompt or not
    r = result(graded.mistake("keep_every_sample", task="ch24.2"), "vLLM's worked example")
    assert r.status == "failed"
    assert "step 1: admitted (no prefix hit), 4 tokens scheduled" in r.message
    assert "0 + 4 = 4 < num_tokens 10: an unfinished prefill chunk, its sample is thrown away" in r.message
    assert r.hints == ["keep_every_sample"]


def test_admission_ignores_the_prefix_hit(graded):
    # the prefix hit not counted as computed on admission
    r = result(graded.mistake("hit_ignored", task="ch24.2"), "figure instance: a prefix hit")
    assert r.status == "failed"
    assert "num_computed_tokens after step 1 should be 8 (admission starts from the prefix hit: 4 + 4 = 8); yours: 4" in r.message
    assert r.hints == ["hit_ignored"]


# -- facts -------------------------------------------------------------------------------------------------
def run_reference(cfg: dict, prompts: list[tuple[int, int]], tokens) -> tuple[list[tuple], list]:
    """Drive the reference directly: returns [(is_prefill, [(seq index, num_scheduled)])] per step, and the seqs."""
    s = ref.make_scheduler(**cfg)
    seqs = [ref.Sequence(list(range(1, n + 1)), max_tokens=m, seq_id=i) for i, (n, m) in enumerate(prompts)]
    for q in seqs:
        s.add(q)
    steps = []
    while not s.is_finished():
        batch, is_prefill = s.schedule()
        steps.append(
            (is_prefill, [(q.seq_id, q.num_scheduled_tokens) for q in batch], [q.seq_id for q in s.waiting], [q.seq_id for q in s.running])
        )
        s.postprocess(batch, [tokens(q) for q in batch], is_prefill)
    return steps, seqs


def test_nanovllm_chunked_prefill_example():
    # nanovllm.md §11: bs 256, max_num_batched_tokens 400, a 1000-token prompt: 400, 400, 200, then decode.
    steps, (seq,) = run_reference(
        dict(num_blocks=8, block_size=256, max_num_seqs=4, max_num_batched_tokens=400, eos=-1), [(1000, 2)], lambda q: 7
    )
    assert [(p, chunks) for p, chunks, _, _ in steps] == [(True, [(0, 400)]), (True, [(0, 400)]), (True, [(0, 200)]), (False, [(0, 1)])]
    assert seq.completion_token_ids == [7, 7] and seq.status == ref.FINISHED


def test_nanovllm_preemption_example():
    # nanovllm.md §11: bs 4, 4 blocks, A, B, C with 4-token prompts: the first decode preempts C (the tail);
    # later A needs a third block and B, the tail, is preempted.
    steps, _ = run_reference(
        dict(num_blocks=4, block_size=4, max_num_seqs=4, max_num_batched_tokens=16, eos=-1), [(4, 6), (4, 6), (4, 6)], lambda q: 5
    )
    assert steps[0][:2] == (True, [(0, 4), (1, 4), (2, 4)])
    assert steps[1][1:] == ([(0, 1), (1, 1)], [2], [0, 1])
    first_b_victim = next(i for i, st in enumerate(steps) if 1 in st[2])
    assert steps[first_b_victim][1] == [(0, 1)] and steps[first_b_victim][2] == [1, 2]


def test_vllm_worked_example_counters():
    # vllm_and_beyond.md §A.5: P = 10, budget 4: computed 4, 8, 10, 11; num_tokens 10, 10, 11, 12.
    p = checks.start_progress(10)
    seen = []
    for n in (4, 4, 2, 1):
        p = ref.progress_after_step(p, n)
        seen.append((p["num_computed_tokens"], p["num_tokens"]))
    assert seen == [(4, 10), (8, 10), (10, 11), (11, 12)]
    assert p["num_cached_tokens"] == 0


def test_invariants_hold_on_reference_traces():
    import random

    for seed in range(5):
        sc = hidden_checks.random_script(
            random.Random(seed),
            "inv",
            n=30,
            prompts=(1, 20),
            max_tokens=(1, 8),
            block_size=4,
            num_blocks=10,
            max_num_seqs=4,
            budget=6,
            arrivals=20,
        )
        for rec in ref.replay(sc):
            for phase in ("schedule", "after"):
                assert hidden_checks.invariant_failure(sc, phase, rec) is None


def test_every_request_of_a_random_script_finishes_and_fits():
    import random

    sc = hidden_checks.random_script(
        random.Random(3),
        "fit",
        n=50,
        prompts=(1, 30),
        max_tokens=(1, 12),
        block_size=4,
        num_blocks=9,
        max_num_seqs=3,
        budget=5,
        arrivals=30,
    )
    trace = ref.replay(sc)
    done = {n for rec in trace for n, s in rec["after"]["seqs"].items() if s["status"] == ref.FINISHED}
    assert done == {r["name"] for r in sc["requests"]}
    assert any(
        n in rec["sched"]["waiting"] and n in prev["after"]["running"]
        for prev, rec in zip(trace, trace[1:])
        for n in rec["sched"]["waiting"]
    ), "some preemption happened"
