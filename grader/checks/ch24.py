"""Public checks of ch24 · the control loop and its counters.

ch24.1 is graded by trace: the provided `replay` runs one script (requests arriving at given rounds; a
simulated runner that returns each scheduled sequence's token) on the student's Scheduler, in their process,
and on the reference; the state after every schedule() and every postprocess() is compared and the first
step where the two differ is explained (`ch24_explain`, on `grader.authoring.trace`). ch24.2 replays a
request's life step by step through progress_after_step.
"""

from __future__ import annotations

from typing import Any

from grader.authoring import CheckFailed, Trial, describe, expect_records, public
from grader.checks.ch24_explain import (
    KEYS,
    check_trace,
    expect_trace,
    explain_progress,
    lifecycle,
    request,
    script,
    start_progress,
    step_args,
)
from grader.i18n import mark, tr

LOOP_EOS = 0
LOOP_CASE = script(
    mark("figure instance: one request through the loop"),
    [request("A", list(range(11, 21)), 3, [61, 62, 63], candidates={4: 37, 8: LOOP_EOS})],
    num_blocks=8,
    block_size=4,
    max_num_seqs=4,
    max_num_batched_tokens=4,
    eos=LOOP_EOS,
)
PROGRESS_CASE = lifecycle(mark("figure instance"), 10, [(4, 4), (2,), (1,), ("preempt",), (0,), (4, 8), (1,)])


# -- ch24.1 ---------------------------------------------------------------------------------------------------


@public("ch24.1", "figure instance: one request, a 10-token prompt in chunks of 4")
def loop_figure_instance(t: Trial) -> None:
    expected = t.ref.replay(LOOP_CASE)
    yours = expect_records(t.yours.replay(LOOP_CASE, len(expected) + 3))  # a few steps past the reference's, to draw
    req = LOOP_CASE["requests"][0]
    t.figure(
        "ch24-control-loop",
        config=LOOP_CASE["config"],
        prompt=req["prompt"],
        max_tokens=req["max_tokens"],
        rounds=loop_rounds([r for r in yours if "after" in r], "A"),
        expected=loop_rounds(expected, "A"),
    )
    check_trace(LOOP_CASE, yours, expected)


@public("ch24.1", "prefill before decode: a new request interrupts the decodes")
def prefill_first(t: Trial) -> None:
    expect_trace(
        t,
        script(
            mark("prefill first"),
            [
                request("A", [3, 1, 4], 4, [15, 92, 65, 35]),
                request("B", [8, 9, 7, 9, 3], 2, [23, 84], arrive=2),
                request("C", [2, 6], 2, [43, 38], arrive=2),
            ],
            num_blocks=16,
            block_size=4,
            max_num_seqs=4,
            max_num_batched_tokens=8,
            eos=0,
        ),
    )


@public("ch24.1", "only the first sequence of a batch is chunked, first come first served")
def first_sequence_chunked(t: Trial) -> None:
    expect_trace(
        t,
        script(
            mark("chunking and FCFS"),
            [request("A", [5, 5, 5, 5], 2, [41, 42]), request("B", list(range(20, 29)), 2, [43, 44]), request("C", [7, 7], 2, [45, 46])],
            num_blocks=16,
            block_size=4,
            max_num_seqs=4,
            max_num_batched_tokens=6,
            eos=0,
        ),
    )


@public("ch24.1", "memory pressure: preemption from the tail of running")
def preemption_from_tail(t: Trial) -> None:
    # nano-vllm's preemption example (reference/nanovllm.md §11) with one more request and max_num_seqs 2:
    # four 4-token prompts fill 4 of 5 blocks; in the first decode A takes the last block and B must preempt
    # D, the tail of running [C, D], not C.
    expect_trace(
        t,
        script(
            mark("preemption"),
            [
                request("A", [1, 2, 3, 4], 6, [11, 12, 13, 14, 15, 16]),
                request("B", [5, 6, 7, 8], 6, [21, 22, 23, 24, 25, 26]),
                request("C", [9, 10, 11, 12], 6, [31, 32, 33, 34, 35, 36]),
                request("D", [13, 14, 15, 16], 6, [41, 42, 43, 44, 45, 46]),
            ],
            num_blocks=5,
            block_size=4,
            max_num_seqs=2,
            max_num_batched_tokens=16,
            eos=0,
        ),
    )


@public("ch24.1", "finishing: EOS kept in the output, max_tokens, ignore_eos, an EOS candidate")
def finishing(t: Trial) -> None:
    expect_trace(
        t,
        script(
            mark("finishing"),
            [
                request("A", [4, 4], 1, [71]),
                request("B", [5, 5, 5], 4, [72, 0, 73, 74]),
                request("C", [6], 3, [0, 75, 0], ignore_eos=True),
                request("D", list(range(30, 39)), 3, [76, 77, 0], arrive=1, candidates={6: 0}),
            ],
            num_blocks=16,
            block_size=4,
            max_num_seqs=4,
            max_num_batched_tokens=6,
            eos=0,
        ),
    )


# -- ch24.2 ---------------------------------------------------------------------------------------------------


@public("ch24.2", "figure instance: a prefix hit, chunks, a preemption and a re-admission")
def progress_figure_instance(t: Trial) -> None:
    run_lifecycle(t, PROGRESS_CASE, figure=True)


@public("ch24.2", "vLLM's worked example: a 10-token prompt in chunks of 4, max_tokens 2")
def vllm_worked_example(t: Trial) -> None:
    run_lifecycle(t, lifecycle(mark("vLLM A.5"), 10, [(4,), (4,), (2,), (1,)]))


@public("ch24.2", "an unfinished chunk advances the computed count only")
def partial_chunk(t: Trial) -> None:
    run_lifecycle(t, lifecycle(mark("partial chunks"), 7, [(3,), (0,), (3,), (1,), (1,)]))


@public("ch24.2", "num_cached_tokens is set once, at the first admission")
def cached_set_once(t: Trial) -> None:
    run_lifecycle(t, lifecycle(mark("cached once"), 9, [(5, 4), ("preempt",), (2, 8), (1,), ("preempt",), (12,)]))


@public("ch24.2", "impossible steps raise ValueError")
def bad_progress(t: Trial) -> None:
    p = start_progress(8)
    t.expect_raises(ValueError, t.yours.progress_after_step, p, 9, because=tr("9 tokens cannot be computed when only 8 exist"))
    t.expect_raises(
        ValueError,
        t.yours.progress_after_step,
        p,
        1,
        prefix_hit=8,
        because=tr("a hit of all 8 tokens leaves nothing to compute (the last token is never a hit)"),
    )


# -- helpers ----------------------------------------------------------------------------------------------------


def loop_rounds(records: list[dict], name: str) -> list[dict]:
    """One request's rounds, for the control-loop figure: what was scheduled, returned and kept."""
    rounds = []
    for rec in records:
        if name not in rec["batch"]:
            continue
        s, a = rec["sched"]["seqs"][name], rec["after"]["seqs"][name]
        rounds.append(
            {
                "step": rec["step"],
                "prefill": rec["prefill"],
                "start": s["num_computed_tokens"],
                "n": s["num_scheduled_tokens"],
                "num_tokens_before": s["num_tokens"],
                "status_sched": s["status"],
                "token": rec["tokens"][rec["batch"].index(name)],
                "appended": len(a["completion"]) > s["num_tokens"] - len(LOOP_CASE["requests"][0]["prompt"]),
                "status": a["status"],
                "num_computed_tokens": a["num_computed_tokens"],
                "num_tokens": a["num_tokens"],
            }
        )
    return rounds


def expected_progress(t: Trial, case: dict) -> list[dict]:
    """The reference's counters after each step (every step starts from the reference's previous state)."""
    states, p = [], start_progress(case["prompt"])
    for step in case["steps"]:
        args, kwargs = step_args(step)
        p = t.ref.progress_after_step(dict(p), *args, **kwargs)
        states.append(p)
    return states


def expect_progress(got: Any, where: str) -> dict:
    """Require a dict with exactly the four int counters."""
    if not (isinstance(got, dict) and set(got) == set(KEYS) and all(type(got[k]) is int for k in KEYS)):
        fields = {"where": where, "keys": list(KEYS), "got": describe(got)}
        raise CheckFailed(
            tr(
                "{where}: progress_after_step should return a dict with the int counters {keys}; yours returned {got} with keys {got_keys}",
                got_keys=sorted(got),
                **fields,
            )
            if isinstance(got, dict)
            else tr("{where}: progress_after_step should return a dict with the int counters {keys}; yours returned {got}", **fields)
        )
    return got


def run_lifecycle(t: Trial, case: dict, *, figure: bool = False) -> None:
    """Call the student's progress_after_step on every step of `case` (each from the expected previous state)."""
    want = expected_progress(t, case)
    before, got_all, failure = start_progress(case["prompt"]), [], None
    for k, step in enumerate(case["steps"]):
        args, kwargs = step_args(step)
        where = tr('case "{name}", step {k}', name=tr(case["name"]), k=k + 1)
        got = expect_progress(t.yours.progress_after_step(dict(before), *args, **kwargs), where)
        got_all.append(got)
        if failure is None and got != want[k]:
            failure = explain_progress(case, k, before, step, want[k], got)
            if not figure:
                break
        before = want[k]
    if figure:
        t.figure("ch24-three-progress", prompt=case["prompt"], steps=case["steps"], yours=got_all, expected=want)
    if failure:
        raise failure
