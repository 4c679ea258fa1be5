"""Public checks of ch27 · the engine core loop.

A script of operations ("add" a request, "step" k times, "drain" until everything finished) is made concrete
on the reference, then the provided `replay` runs it on the student's engine (in their process, in one call)
and on the reference; after every step the course's `snapshot()` gives each request's counters and the batches
the executor ran. The traces are compared step by step and the first difference is explained in the chapter's
terms (`ch27_explain`, on `grader.authoring.trace`). The contract piece by piece drives the student's engine
directly: that is its lesson. ch27.3 runs steps of one speculating request (the drafts of each step given by how
many there are and how many are right) through the provided `replay_spec` the same way.
"""

from __future__ import annotations

from grader.authoring import CheckFailed, Trial, mistakes, public
from grader.checks.ch27_explain import check_structure, out_key, run_case, run_spec_case, state_str
from grader.i18n import tr

# ch27-enginecore-loop: §A.5's request (prompt 10, max_tokens 2, budget 4), B arriving after step 2.
LOOP = {"budget": 4, "max_num_seqs": 2, "async": False}
LOOP_SCRIPT = [("add", "A", 10, 2, None), ("step", 2), ("add", "B", 2, 3, None), ("drain",)]
# ch27-three-boundaries: §B.4's prompt of 5, chunked by a budget of 3, max_tokens 4, async.
BOUNDS = {"budget": 3, "max_num_seqs": 2, "async": True}
BOUNDS_SCRIPT = [("add", "A", 5, 4, None), ("drain",)]
ASYNC = {"budget": 8, "max_num_seqs": 2, "async": True}
# ch27-spec-counters: prompt 4, then steps of (k drafts, a right): partial, all right (bonus), none right, partial.
SPEC_REQUEST = ("A", 4, 12, None)
SPEC_ROUNDS = [(0, 0), (3, 1), (3, 3), (2, 0), (4, 2)]
M = mistakes("ch27")


# -- ch27.1 EngineCore ----------------------------------------------------------------------------------------


@public("ch27.1", "figure instance: A (prompt 10, max_tokens 2), B arriving after step 2, budget 4")
def loop_figure_instance(t: Trial) -> None:
    run_case(t, tr("figure instance"), LOOP, LOOP_SCRIPT, figure="ch27-enginecore-loop")


@public("ch27.1", "the contract piece by piece: schedule, execute_model, update_from_output")
def pieces(t: Trial) -> None:
    config = {"budget": 4, "max_num_seqs": 2, "async": False}
    expected = t.ref.drive(drive_pieces, config)
    want = expected["trace"]
    head = tr('case "piece by piece": budget 4; A: prompt 6, max_tokens 3')
    engine = t.yours.make_engine_core(4, 2, async_scheduling=False)
    executor = t.attrs(engine, "executor")["executor"]
    engine.add_request("A", expected["prompt"], 3)
    for k in range(3):
        so = engine.schedule()
        state, ws = engine.snapshot()["requests"]["A"], want[2 * k]["requests"]["A"]
        if so != want[2 * k]["schedule"]:
            raise CheckFailed(
                head,
                tr("schedule() call {n} should return {want}; yours: {yours}", n=k + 1, want=want[2 * k]["schedule"], yours=repr(so)[:300]),
                hint=M.prompt_every_time if isinstance(so, dict) and so.get("scheduled_new_reqs") and k else "",
            )
        if state["num_computed_tokens"] != ws["num_computed_tokens"] or state["status"] != ws["status"]:
            before = want[2 * k - 1]["requests"]["A"]["num_computed_tokens"] if k else 0
            raise CheckFailed(
                head,
                tr(
                    "right after schedule() call {n}, before the model runs, A should be {want}; yours: {yours}",
                    n=k + 1,
                    want=state_str(ws, False),
                    yours=state_str(state, False),
                ),
                hint=M.computed_at_update
                if state["num_computed_tokens"] == before != ws["num_computed_tokens"]
                else M.status_not_running
                if state["status"] == "WAITING" != ws["status"]
                else "",
            )
        ro = executor.execute_model(so)
        got = engine.update_from_output(so, ro)
        state, ws = engine.snapshot()["requests"]["A"], want[2 * k + 1]["requests"]["A"]
        check_structure([{"outputs": got}], head)
        if out_key(got) != out_key(want[2 * k + 1]["update"]) or state != ws:
            raise CheckFailed(
                head,
                tr(
                    "update_from_output after batch {n} (runner output {runner}) should return {want} and leave A {state}; "
                    "yours: {yours}, A {yours_state}",
                    n=k + 1,
                    runner=ro,
                    want=out_key(want[2 * k + 1]["update"]) or "[]",
                    state=state_str(ws, False),
                    yours=out_key(got) or "[]",
                    yours_state=state_str(state, False),
                ),
                hint=M.partial_reported
                if not ro.get("A") and (out_key(got) or state["output_token_ids"] != ws["output_token_ids"])
                else "",
            )


@public("ch27.1", "EOS stops a request, also on its last allowed token (EOS is checked before the length cap)")
def eos_and_length(t: Trial) -> None:
    run_case(
        t,
        tr("eos and length"),
        {"budget": 8, "max_num_seqs": 2, "async": False},
        [("add", "A", 3, 5, 1), ("add", "B", 2, 3, 2), ("drain",)],
    )


@public("ch27.1", "max_num_seqs: later requests wait for a seat")
def seats(t: Trial) -> None:
    run_case(
        t,
        tr("two seats"),
        {"budget": 16, "max_num_seqs": 2, "async": False},
        [("add", "A", 4, 2, None), ("add", "B", 3, 3, None), ("add", "C", 2, 2, None), ("drain",)],
    )


@public("ch27.1", "run() returns every request's outputs")
def run_all(t: Trial) -> None:
    run_case(
        t,
        tr("run"),
        {"budget": 5, "max_num_seqs": 3, "async": False},
        [("add", "A", 7, 3, None), ("add", "B", 2, 4, 0), ("add", "C", 4, 1, None), ("run",)],
    )


# -- ch27.2 AsyncEngineCore -----------------------------------------------------------------------------------


@public("ch27.2", "figure instance: prompt 5 chunked by a budget of 3, max_tokens 4")
def bounds_figure_instance(t: Trial) -> None:
    run_case(t, tr("figure instance"), BOUNDS, BOUNDS_SCRIPT, figure="ch27-three-boundaries")


@public("ch27.2", "one step ahead: step 2 launches before step 1's output is back")
def one_ahead(t: Trial) -> None:
    run_case(t, tr("one ahead"), ASYNC, [("add", "A", 5, 3, None), ("step", 2)])


@public("ch27.2", "an output that arrives after EOS is stale and dropped")
def stale_after_eos(t: Trial) -> None:
    run_case(t, tr("stale after eos"), ASYNC, [("add", "A", 3, 5, 1), ("drain",)])


@public("ch27.2", "two requests, chunked prefill and decodes interleaved")
def two_requests(t: Trial) -> None:
    run_case(
        t,
        tr("two requests"),
        {"budget": 4, "max_num_seqs": 2, "async": True},
        [("add", "A", 6, 3, None), ("add", "B", 3, 3, 1), ("step", 3), ("add", "C", 2, 2, None), ("drain",)],
    )


@public("ch27.2", "run() drains the batch queue and returns every request's outputs")
def async_run(t: Trial) -> None:
    run_case(
        t,
        tr("run"),
        {"budget": 6, "max_num_seqs": 3, "async": True},
        [("add", "A", 7, 3, None), ("add", "B", 2, 4, 0), ("add", "C", 4, 2, None), ("run",)],
    )


# -- ch27.3 speculative decoding -------------------------------------------------------------------------------


@public("ch27.3", "figure instance: prompt 4, then 3 drafts (1 right), 3 (all right), 2 (none right), 4 (2 right)")
def spec_figure_instance(t: Trial) -> None:
    run_spec_case(t, tr("figure instance"), SPEC_REQUEST, SPEC_ROUNDS, figure="ch27-spec-counters")


@public("ch27.3", "steps without drafts between steps with drafts: nothing to roll back, no stale draft")
def spec_mixed(t: Trial) -> None:
    run_spec_case(t, tr("mixed"), ("B", 3, 10, None), [(0, 0), (0, 0), (2, 1), (0, 0), (1, 1), (0, 0)])


@public("ch27.3", "a stop among the accepted drafts drops the tokens after it (EOS first, then the length cap)")
def spec_stops(t: Trial) -> None:
    run_spec_case(t, tr("EOS among the drafts"), ("C", 3, 10, 2), [(0, 0), (4, 4)])
    run_spec_case(t, tr("length cap among the drafts"), ("D", 2, 3, None), [(0, 0), (4, 3)])
    run_spec_case(t, tr("EOS on the last allowed token"), ("E", 2, 3, 2), [(0, 0), (3, 3)])


@public("ch27.3", "an output that comes back empty (its sample discarded): nothing rolled back, nothing appended")
def spec_discarded(t: Trial) -> None:
    # The request is preempted or aborted while its step runs, so the runner hands back no token for it: with
    # drafts, k + 1 − 0 would take back k + 1 positions that were never rejected; without, 1.
    run_spec_case(t, tr("discarded with drafts"), ("G", 3, 10, None), [(0, 0), (2, 1), (3, None)])
    run_spec_case(t, tr("discarded prefill"), ("H", 5, 10, None), [(0, None)])


# -- helpers ------------------------------------------------------------------------------------------------
def drive_pieces(ref, config: dict) -> dict:
    """Reference for 'piece by piece': schedule, execute, update by hand, with states in between."""
    engine = ref.make_engine_core(config["budget"], config["max_num_seqs"], async_scheduling=config["async"])
    engine.add_request("A", [ref.fake_token("A", p) for p in range(6)], 3)
    out = []
    for _ in range(3):
        so = engine.schedule()
        out.append({"schedule": so, **engine.snapshot()})
        ro = engine.executor.execute_model(so)
        out.append({"runner": ro, "update": engine.update_from_output(so, ro), **engine.snapshot()})
    return {"prompt": engine.requests["A"].prompt_token_ids, "trace": out}
