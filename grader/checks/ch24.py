"""Public checks of ch24 · the control loop and its counters.

ch24.1 is graded by trace: the grader drives the student's Scheduler and the reference through the same
script (requests arriving at given rounds; a simulated runner that returns each scheduled sequence's
token), reads the observable state after every schedule() and every postprocess(), and explains the
first step where the two differ (`ch24_trace`). ch24.2 replays a request's life step by step through
progress_after_step.
"""

from __future__ import annotations

from typing import Any

from grader.authoring import CheckFailed, Trial, describe, public
from grader.checks.ch24_trace import drive_reference, expect_trace, request, run_trace, script

# -- ch24.1 public checks -------------------------------------------------------------------------------
LOOP_EOS = 0
LOOP_CASE = script("figure instance: one request through the loop", [
    request("A", list(range(11, 21)), 3, [61, 62, 63], candidates={4: 37, 8: LOOP_EOS})],
    num_blocks=8, block_size=4, max_num_seqs=4, max_num_batched_tokens=4, eos=LOOP_EOS)


def loop_rounds(records: list[dict], name: str) -> list[dict]:
    """One request's rounds, for the control-loop figure: what was scheduled, returned and kept."""
    rounds = []
    for rec in records:
        if name not in rec["batch"]:
            continue
        s, a = rec["sched"]["seqs"][name], rec["after"]["seqs"][name]
        rounds.append({"step": rec["step"], "prefill": rec["prefill"], "start": s["num_computed_tokens"],
                       "n": s["num_scheduled_tokens"], "num_tokens_before": s["num_tokens"],
                       "status_sched": s["status"], "token": rec["tokens"][rec["batch"].index(name)],
                       "appended": len(a["completion"]) > s["num_tokens"] - len(LOOP_CASE["requests"][0]["prompt"]),
                       "status": a["status"], "num_computed_tokens": a["num_computed_tokens"],
                       "num_tokens": a["num_tokens"]})
    return rounds


@public("ch24.1", "figure instance: one request, a 10-token prompt in chunks of 4")
def loop_figure_instance(t: Trial) -> None:
    expected = t.ref.drive(drive_reference, LOOP_CASE)
    records, message = run_trace(t, LOOP_CASE, expected, full=True)
    req = LOOP_CASE["requests"][0]
    t.figure("ch24-control-loop", config=LOOP_CASE["config"], prompt=req["prompt"], max_tokens=req["max_tokens"],
             rounds=loop_rounds(records, "A"), expected=loop_rounds(expected, "A"))
    if message:
        raise CheckFailed(message)


@public("ch24.1", "prefill before decode: a new request interrupts the decodes")
def prefill_first(t: Trial) -> None:
    expect_trace(t, script("prefill first", [
        request("A", [3, 1, 4], 4, [15, 92, 65, 35]),
        request("B", [8, 9, 7, 9, 3], 2, [23, 84], arrive=2),
        request("C", [2, 6], 2, [43, 38], arrive=2)],
        num_blocks=16, block_size=4, max_num_seqs=4, max_num_batched_tokens=8, eos=0))


@public("ch24.1", "only the first sequence of a batch is chunked, first come first served")
def first_sequence_chunked(t: Trial) -> None:
    expect_trace(t, script("chunking and FCFS", [
        request("A", [5, 5, 5, 5], 2, [41, 42]),
        request("B", list(range(20, 29)), 2, [43, 44]),
        request("C", [7, 7], 2, [45, 46])],
        num_blocks=16, block_size=4, max_num_seqs=4, max_num_batched_tokens=6, eos=0))


@public("ch24.1", "memory pressure: preemption from the tail of running")
def preemption_from_tail(t: Trial) -> None:
    # nano-vllm's preemption example (reference/nanovllm.md §11) with one more request and max_num_seqs 2:
    # four 4-token prompts fill 4 of 5 blocks; in the first decode A takes the last block and B must preempt
    # D, the tail of running [C, D], not C.
    expect_trace(t, script("preemption", [
        request("A", [1, 2, 3, 4], 6, [11, 12, 13, 14, 15, 16]),
        request("B", [5, 6, 7, 8], 6, [21, 22, 23, 24, 25, 26]),
        request("C", [9, 10, 11, 12], 6, [31, 32, 33, 34, 35, 36]),
        request("D", [13, 14, 15, 16], 6, [41, 42, 43, 44, 45, 46])],
        num_blocks=5, block_size=4, max_num_seqs=2, max_num_batched_tokens=16, eos=0))


@public("ch24.1", "finishing: EOS kept in the output, max_tokens, ignore_eos, an EOS candidate")
def finishing(t: Trial) -> None:
    expect_trace(t, script("finishing", [
        request("A", [4, 4], 1, [71]),
        request("B", [5, 5, 5], 4, [72, 0, 73, 74]),
        request("C", [6], 3, [0, 75, 0], ignore_eos=True),
        request("D", list(range(30, 39)), 3, [76, 77, 0], arrive=1, candidates={6: 0})],
        num_blocks=16, block_size=4, max_num_seqs=4, max_num_batched_tokens=6, eos=0))


@public("ch24.1", "a request that can never fit, or added twice, raises ValueError")
def bad_requests(t: Trial) -> None:
    sched = t.yours.make_scheduler(2, 4, 4, 16, eos=0)
    big = t.yours.Sequence(list(range(1, 8)), max_tokens=3)
    t.expect_raises(ValueError, sched.add, big, because="7 prompt tokens + 3 − 1 generated need 3 blocks of 4 and "
                                                        "the pool has only 2: it could never run")
    ok = t.yours.Sequence([1, 2, 3], max_tokens=2)
    sched.add(ok)
    t.expect_raises(ValueError, sched.add, ok, because="this sequence is already waiting")


# -- ch24.2: the three progresses ------------------------------------------------------------------------
KEYS = ("num_prompt_tokens", "num_tokens", "num_computed_tokens", "num_cached_tokens")


def lifecycle(name: str, prompt: int, steps: list[tuple]) -> dict:
    """A request's life as steps (num_scheduled, prefix_hit, preempted); ("preempt",) for a preemption."""
    out = []
    for s in steps:
        out.append({"n": 0, "hit": 0, "preempted": True} if s == ("preempt",) else
                   {"n": s[0], "hit": s[1] if len(s) > 1 else 0, "preempted": False})
    return {"name": name, "prompt": prompt, "steps": out}


def start_progress(prompt: int) -> dict:
    return {"num_prompt_tokens": prompt, "num_tokens": prompt, "num_computed_tokens": 0, "num_cached_tokens": -1}


def step_args(step: dict) -> tuple:
    return (step["n"],), {"prefix_hit": step["hit"], "preempted": step["preempted"]}


def expected_progress(t: Trial, case: dict) -> list[dict]:
    """The reference's counters after each step (every step starts from the reference's previous state)."""
    states, p = [], start_progress(case["prompt"])
    for step in case["steps"]:
        args, kwargs = step_args(step)
        p = t.ref.progress_after_step(dict(p), *args, **kwargs)
        states.append(p)
    return states


def event_text(step: dict, before: dict) -> str:
    if step["preempted"]:
        return "preempted"
    if not step["n"]:
        return "not scheduled (waiting)"
    admit = before["num_computed_tokens"] == 0
    hit = f"admitted with a prefix hit of {step['hit']}, " if step["hit"] else "admitted (no prefix hit), "
    return (hit if admit else "") + f"{step['n']} tokens scheduled"


def explain_progress(case: dict, k: int, before: dict, step: dict, want: dict, got: dict) -> str:
    """Why the counters after step k should be `want`, and what the student's `got` most likely missed."""
    key = next(x for x in KEYS if want[x] != got[x])
    c, total, cached, n, hit = (before["num_computed_tokens"], before["num_tokens"], before["num_cached_tokens"],
                                step["n"], step["hit"])
    admit = n > 0 and c == 0 and not step["preempted"]
    start = hit if admit else c
    lines = [f'case "{case["name"]}": a {case["prompt"]}-token prompt',
             f"step {k + 1}: {event_text(step, before)}; before it: " + ", ".join(f"{x} {before[x]}" for x in KEYS)]
    hint = ""
    if key == "num_computed_tokens":
        if step["preempted"]:
            why = "a preemption frees the request's KV: it is recomputed from 0"
            hint = "reset num_computed_tokens to 0 on preemption"
        elif not n:
            why = "the request was not scheduled, so nothing changes"
        else:
            why = (f"admission starts from the prefix hit: {hit} + {n} = {want[key]}" if admit else
                   f"{c} computed + {n} scheduled = {want[key]}")
            if admit and got[key] == n:
                hint = "an admitted request starts from its prefix hit: the cache served those tokens"
            elif got[key] == c:
                hint = "the chunk was not counted: add num_scheduled to num_computed_tokens"
            elif got[key] == want["num_tokens"]:
                hint = "the newly kept token has no K/V yet: num_computed_tokens stays one behind num_tokens"
    elif key == "num_tokens":
        if step["preempted"]:
            why = "a preemption keeps every token the request has (prompt and outputs)"
            hint = "preemption resets the computed count only"
        elif not n:
            why = "the request was not scheduled, so nothing changes"
        elif want[key] == total + 1:
            why = (f"{start} + {n} = {start + n} = num_tokens: the step computed every known token, so its "
                   f"sampled token is kept: {total} + 1 = {want[key]}")
            hint = "the sample of a step that reaches num_tokens is appended" if got[key] == total else ""
        else:
            why = (f"{start} + {n} = {start + n} < num_tokens {total}: an unfinished prefill chunk, its sample is "
                   f"thrown away, num_tokens stays {total}")
            hint = ("the candidate token of an unfinished chunk was appended" if got[key] == total + 1 else
                    "num_tokens counts known tokens (prompt + kept outputs), not computed ones"
                    if got[key] == total + n else "")
    elif key == "num_cached_tokens":
        if admit and cached < 0:
            why = f"the first admission sets it, once, to the prefix hit: {hit}"
        else:
            why = f"it was set at the first admission and never changes: {cached}"
            if got[key] == got["num_computed_tokens"] or got[key] == want["num_computed_tokens"]:
                hint = ("num_cached_tokens is the prefix-cache hit, not the computed count (nano-vllm HEAD uses the "
                        "name for the computed count; vLLM does not)")
            elif admit and got[key] == hit:
                hint = "a re-admission after preemption does not set it again"
            elif step["preempted"]:
                hint = "preemption resets the computed count only"
    else:
        why = "the prompt's length never changes"
    lines.append(f"{key} after step {k + 1} should be {want[key]} ({why}); yours: {got[key]}")
    return "\n".join(lines + ([f"hint: {hint}"] if hint else []))


def expect_progress(got: Any, want: dict, where: str) -> dict:
    """Require a dict with exactly the four int counters."""
    if not (isinstance(got, dict) and set(got) == set(KEYS) and all(type(got[k]) is int for k in KEYS)):
        raise CheckFailed(f"{where}: progress_after_step should return a dict with the int counters {list(KEYS)}; "
                          f"yours returned {describe(got)}" + (f" with keys {sorted(got)}" if isinstance(got, dict)
                                                               else ""))
    return got


def run_lifecycle(t: Trial, case: dict, *, figure: bool = False) -> None:
    """Call the student's progress_after_step on every step of `case` (each from the expected previous state)."""
    want = expected_progress(t, case)
    before, got_all, message = start_progress(case["prompt"]), [], None
    for k, step in enumerate(case["steps"]):
        args, kwargs = step_args(step)
        got = expect_progress(t.yours.progress_after_step(dict(before), *args, **kwargs), want[k],
                              f'case "{case["name"]}", step {k + 1}')
        got_all.append(got)
        if message is None and got != want[k]:
            message = explain_progress(case, k, before, step, want[k], got)
            if not figure:
                break
        before = want[k]
    if figure:
        t.figure("ch24-three-progress", prompt=case["prompt"], steps=case["steps"], yours=got_all, expected=want)
    if message:
        raise CheckFailed(message)


PROGRESS_CASE = lifecycle("figure instance", 10, [(4, 4), (2,), (1,), ("preempt",), (0,), (4, 8), (1,)])


@public("ch24.2", "figure instance: a prefix hit, chunks, a preemption and a re-admission")
def progress_figure_instance(t: Trial) -> None:
    run_lifecycle(t, PROGRESS_CASE, figure=True)


@public("ch24.2", "vLLM's worked example: a 10-token prompt in chunks of 4, max_tokens 2")
def vllm_worked_example(t: Trial) -> None:
    run_lifecycle(t, lifecycle("vLLM A.5", 10, [(4,), (4,), (2,), (1,)]))


@public("ch24.2", "an unfinished chunk advances the computed count only")
def partial_chunk(t: Trial) -> None:
    run_lifecycle(t, lifecycle("partial chunks", 7, [(3,), (0,), (3,), (1,), (1,)]))


@public("ch24.2", "num_cached_tokens is set once, at the first admission")
def cached_set_once(t: Trial) -> None:
    run_lifecycle(t, lifecycle("cached once", 9, [(5, 4), ("preempt",), (2, 8), (1,), ("preempt",), (12,)]))


@public("ch24.2", "impossible steps raise ValueError")
def bad_progress(t: Trial) -> None:
    p = start_progress(8)
    t.expect_raises(ValueError, t.yours.progress_after_step, p, 9,
                    because="9 tokens cannot be computed when only 8 exist")
    t.expect_raises(ValueError, t.yours.progress_after_step, p, 1, prefix_hit=8,
                    because="a hit of all 8 tokens leaves nothing to compute (the last token is never a hit)")
