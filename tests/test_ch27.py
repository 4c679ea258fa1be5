"""ch27 · the engine core loop: wrong engines that embody real misconceptions get the trace message meant for
them (the first step that differs, in the chapter's terms), the invariants catch them on their own traces, and
the figures drawn from them mark the wrong cells."""

from __future__ import annotations

import copy

import pytest
from figure_layout import cramped, off_canvas, rects, reference_figures, texts
from mutate import figure_file, mutant_grader, result, statuses, wrong_elements

from figures import ch27 as drawn
from figures.style import MARGIN
from grader.authoring import CheckFailed
from grader.checks import ch27 as public_checks
from grader.checks import ch27_explain as checks
from grader.hidden import ch27 as hidden_checks
from solutions import ch27_engine_core as ref

SEED = 27


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return mutant_grader(tmp_path_factory, "ch27", SEED)


def trace_of(config: dict, script: list) -> list:
    return checks.drive_reference(ref, config, script)["trace"]


# -- the reference against the worked examples of reference/vllm_and_beyond.md ---------------------------------
def test_the_sync_loop_reproduces_the_chunked_prefill_example():
    # §A.5: prompt 10, max_tokens 2, 4 tokens per step: computed 4, 8, 10, 11; the first two samples blanked.
    trace = trace_of({"budget": 4, "max_num_seqs": 1, "async": False}, [("add", "A", 10, 2, None), ("drain",)])
    a = [s["requests"]["A"] for s in trace]
    assert [s["num_computed_tokens"] for s in a] == [4, 8, 10, 11]
    assert [s["num_tokens"] for s in a] == [10, 10, 11, 12]
    assert [s["batches"][0]["sampled_token_ids"]["A"] == [] for s in trace] == [True, True, False, False]
    assert a[-1]["status"] == "FINISHED_LENGTH_CAPPED"


def test_the_async_loop_reproduces_the_placeholder_example():
    # §B.4: prompt 5, budget large: S1 (5 tokens) then S2 (1 token) before S1's output, placeholders 1 → 2 → 1.
    engine = ref.make_engine_core(16, 2, async_scheduling=True)
    engine.add_request("A", [1, 2, 3, 4, 5], 3)
    a = engine.requests["A"]
    s1 = engine.schedule()
    assert (a.num_computed_tokens, a.num_tokens, a.num_output_placeholders) == (5, 5, 1)
    s2 = engine.schedule()
    assert s2["num_scheduled_tokens"] == {"A": 1}
    assert (a.num_computed_tokens, a.num_tokens, a.num_output_placeholders) == (6, 5, 2)
    out1, out2 = engine.executor.execute_model(s1), engine.executor.execute_model(s2)
    engine.reconcile(s1, out1)
    assert (a.num_computed_tokens, a.num_tokens, a.num_output_placeholders) == (6, 6, 1)
    engine.reconcile(s2, out2)
    assert a.num_computed_tokens == a.num_tokens + a.num_output_placeholders - 1


def test_async_and_sync_engines_produce_the_same_tokens():
    script = [("add", r, p, m, e) for r, p, m, e in [("A", 7, 4, None), ("B", 3, 5, 2), ("C", 1, 3, None), ("D", 9, 2, 0)]] + [("run",)]
    for budget in (1, 3, 8):
        runs = [trace_of({"budget": budget, "max_num_seqs": 2, "async": a}, script)[-1]["run"] for a in (False, True)]
        assert runs[0] == runs[1]


def test_the_invariants_hold_on_reference_traces_and_catch_a_token_out_of_order():
    config = {"budget": 3, "max_num_seqs": 3, "async": True}
    script = [("add", "A", 4, 4, None), ("add", "B", 2, 3, 1), ("drain",)]
    expected = checks.drive_reference(ref, config, script)
    hidden_checks.check_invariants(expected["trace"], expected["ops"], "case", True)
    bad = [dict(s, requests={k: dict(v) for k, v in s["requests"].items()}) for s in expected["trace"]]
    outs = bad[-1]["requests"]["A"]["output_token_ids"]
    bad[-1]["requests"]["A"]["output_token_ids"] = [outs[1], outs[0], *outs[2:]]
    with pytest.raises(CheckFailed, match="exactly once"):
        hidden_checks.check_invariants(bad, expected["ops"], "case", True)


# -- 27.1 EngineCore ----------------------------------------------------------------------------------------
def test_the_length_cap_checked_before_eos_is_explained(graded):
    # the order of vLLM up to v0.11.0: an EOS on the last allowed token gives FINISHED_LENGTH_CAPPED
    report = graded.mistake("length_first")
    r = result(report, "EOS stops a request", task="ch27.1")
    assert r.status == "failed"
    assert "step 3 of 3: step()" in r.message
    assert "after step 3 request B should be FINISHED_STOPPED" in r.message
    assert "yours: FINISHED_LENGTH_CAPPED" in r.message
    assert r.hints == ["length_first"]
    assert result(report, "figure instance", task="ch27.1").status == "passed"
    assert statuses(report, "ch27.2") == {"passed"}, "reconcile has its own stop check, untouched here"


def test_eos_on_the_last_allowed_token_is_a_stop():
    # today's check_stop (vllm/v1/core/sched/utils.py): EOS first, then the length cap
    for asyn in (False, True):
        trace = trace_of({"budget": 8, "max_num_seqs": 1, "async": asyn}, [("add", "A", 3, 2, 1), ("drain",)])
        a = trace[-1]["requests"]["A"]
        assert a["status"] == "FINISHED_STOPPED" and len(a["output_token_ids"]) == 2


def test_an_empty_output_for_a_partial_prefill_is_explained_and_marked(graded):
    # every scheduled request reports, even when the runner blanked its sample
    report = graded.mistake("empty_outputs")
    r = result(report, "figure instance", task="ch27.1")
    assert r.status == "failed"
    assert "step 1 ran batch 1 {A: 4} (positions A 0…3; sampled A: blank)" in r.message
    assert "step 1 should return [] (nothing new)" in r.message and "yours: [('A', [], False)]" in r.message
    assert r.hints == ["empty_outputs"]
    assert result(report, "the contract piece by piece", task="ch27.1").hints == ["partial_reported"]
    assert wrong_elements(report, "ch27-enginecore-loop")
    svg = figure_file(report, "ch27-enginecore-loop").read_text(encoding="utf-8")
    assert off_canvas(svg, margin=MARGIN - 1) == [], "the marked figure stays inside the page margins too"


def test_computed_advanced_at_update_time_is_caught_by_the_piece_by_piece_check(graded):
    # num_computed_tokens advanced when the output comes back instead of at schedule time
    report = graded.mistake("computed_at_update")
    # After a whole sync step the counters agree again: only the piece-by-piece check sees the difference.
    assert result(report, "figure instance", task="ch27.1").status == "passed"
    r = result(report, "the contract piece by piece", task="ch27.1")
    assert r.status == "failed"
    assert "right after schedule() call 1, before the model runs, A should be RUNNING, num_computed_tokens 4" in r.message
    assert "yours: RUNNING, num_computed_tokens 0" in r.message
    assert r.hints == ["computed_at_update"]


def test_a_step_that_raises_is_reported_with_what_it_did(graded):
    # the prompt sent with every batch: the worker refuses the second one
    report = graded.mistake("prompt_every_time", task="ch27.1")
    r = result(report, "figure instance", task="ch27.1")
    assert r.status == "failed"
    assert "step 2 of 5: step()" in r.message
    assert "your code raised ContractError: batch 2: the worker already has request A" in r.message
    assert "in execute_model: raise ContractError(" in r.message
    assert result(report, "the contract piece by piece", task="ch27.1").hints == ["prompt_every_time"]


# -- 27.2 AsyncEngineCore -----------------------------------------------------------------------------------
def test_a_placeholder_for_a_partial_prefill_is_explained_and_marked(graded):
    # a placeholder for every scheduled request, even a non-final prefill chunk
    report = graded.mistake("placeholder_always")
    r = result(report, "figure instance", task="ch27.2")
    assert r.status == "failed"
    assert "step 1 ran batch 1 {A: 3} (positions A 0…2; sampled A: blank)" in r.message
    assert (
        "num_output_placeholders 0\nyours: RUNNING, num_computed_tokens 3, num_tokens 5 (outputs []), "
        "num_output_placeholders 1" in r.message
    )
    assert r.hints == ["placeholder_always"]
    assert wrong_elements(report, "ch27-three-boundaries")
    assert statuses(report, "ch27.1") == {"passed"}


def test_reconciling_the_newest_batch_first_is_explained(graded):
    # the batch queue popped from the wrong end: the batch just launched is reconciled first
    report = graded.mistake("newest_first")
    r = result(report, "one step ahead", task="ch27.2")
    assert r.status == "failed"
    assert "after step 2 request A should be RUNNING, num_computed_tokens 6, num_tokens 6 (outputs [305])" in r.message
    assert "yours: RUNNING, num_computed_tokens 6, num_tokens 6 (outputs [306])" in r.message
    assert r.hints == ["newest_first"]
    assert result(report, "figure instance", task="ch27.2").status == "failed"
    assert wrong_elements(report, "ch27-three-boundaries")


def test_a_stale_output_after_eos_is_explained(graded):
    # an output that arrives after the request finished (EOS) is appended anyway
    report = graded.mistake("stale_kept")
    r = result(report, "an output that arrives after EOS", task="ch27.2")
    assert r.status == "failed"
    assert "after step 4 request A should be FINISHED_STOPPED, num_computed_tokens 5, num_tokens 5 (outputs [303, 304])" in r.message
    assert "yours: FINISHED_STOPPED, num_computed_tokens 5, num_tokens 6 (outputs [303, 304, 305])" in r.message
    assert r.hints == ["stale_kept"]
    edges = result(report, "edge cases", task="ch27.2")
    assert edges.status == "failed" and edges.hints == ["stale_kept"]
    assert statuses(report, "ch27.1") == {"passed"}


# -- 27.3 speculative decoding ------------------------------------------------------------------------------
SPEC = {"request": public_checks.SPEC_REQUEST, "rounds": public_checks.SPEC_ROUNDS}  # the figure instance


def spec_trace(request: tuple, rounds: list) -> list:
    return checks.drive_spec(ref, request, rounds)["trace"]


def test_the_spec_counters_run_ahead_and_roll_back():
    trace = spec_trace(SPEC["request"], SPEC["rounds"])
    assert [r["scheduled"]["num_scheduled_tokens"] for r in trace] == [4, 4, 4, 3, 5]  # 1 + k for a decode
    assert [r["after_schedule"]["num_computed_tokens"] for r in trace] == [4, 8, 10, 13, 16]
    assert [len(r["generated"]) for r in trace] == [1, 2, 4, 1, 3]  # a + 1
    assert [r["after_update"]["num_computed_tokens"] for r in trace] == [4, 6, 10, 11, 14]  # − (k − a)
    assert all(r["after_update"]["num_computed_tokens"] == r["after_update"]["num_tokens"] - 1 for r in trace)
    assert all(r["after_schedule"]["spec_token_ids"] == [] for r in trace)


def test_speculation_changes_how_many_tokens_per_step_not_which():
    trace = spec_trace(("B", 3, 9, None), [(0, 0), (2, 0), (4, 4), (3, 1), (5, 5)])
    assert trace[-1]["after_update"]["output_token_ids"] == [ref.fake_token("B", p) for p in range(3, 12)]
    assert trace[-1]["after_update"]["status"] == "FINISHED_LENGTH_CAPPED"


def test_a_stop_among_the_drafts_trims_and_counts_the_rollback_from_what_was_generated():
    r = spec_trace(("C", 3, 10, 2), [(0, 0), (4, 4)])[-1]
    assert r["new_token_ids"] == r["generated"][:2] and r["after_update"]["status"] == "FINISHED_STOPPED"
    assert r["after_update"]["num_computed_tokens"] == r["after_schedule"]["num_computed_tokens"]  # 0 rejected


def test_a_discarded_output_rolls_nothing_back():
    r = spec_trace(("G", 3, 10, None), [(0, 0), (2, 1), (3, None)])[-1]
    assert r["generated"] == [] and r["new_token_ids"] == [] and r["after_update"] == r["after_schedule"]
    assert r["after_schedule"]["num_computed_tokens"] == r["before"]["num_computed_tokens"] + 4  # 1 + 3 drafts, all kept
    # The replay ends there (the request left the batch), whatever steps follow.
    assert len(spec_trace(("G", 3, 10, None), [(0, 0), (3, None), (2, 2)])) == 2


@pytest.mark.parametrize(
    "guard",
    [
        "    if scheduled_spec_token_ids:\n",  # the row: drafts alone (vLLM's crash: k + 1 − 0)
        "    if True:\n",  # no guard at all: even a step without drafts takes back 1
    ],
)
def test_a_rollback_without_output_loses_points(graded, guard):
    report = graded(f"guard {guard.strip()}", ("    if scheduled_spec_token_ids and generated_token_ids:\n", guard), task="ch27.3")
    r = result(report, "an output that comes back empty")
    assert r.status == "failed" and r.hints == ["rollback_without_output"]
    assert "the step's output came back empty for it" in r.message
    edges = result(report, "edge cases")
    assert edges.status == "failed" and edges.hints == ["rollback_without_output"]
    assert result(report, "figure instance").status == "passed", "with something generated, the guard changes nothing"


def test_the_spec_invariants_hold_on_a_discarded_step_and_name_a_rollback_there():
    trace = copy.deepcopy(spec_trace(("G", 3, 10, None), [(0, 0), (2, 1), (3, None)]))
    hidden_checks.check_spec_invariants(trace, "case")
    trace[-1]["after_update"]["num_computed_tokens"] -= 4
    with pytest.raises(CheckFailed, match="must leave the request as schedule_spec left it") as e:
        hidden_checks.check_spec_invariants(trace, "case")
    assert e.value.hints == ["rollback_without_output"]


def test_a_forgotten_rollback_is_explained_and_marked(graded):
    report = graded.mistake("no_rollback")
    r = result(report, "figure instance", task="ch27.3")
    assert r.status == "failed"
    assert "step 2 of 5: drafts [305, 356, 357], then schedule_spec and update_spec" in r.message
    assert "the target model generated [305, 306] (1 of 3 drafts accepted, 2 rejected)" in r.message
    assert "leave it RUNNING, num_computed_tokens 6, num_tokens 7" in r.message
    assert "yours: [305, 306], RUNNING, num_computed_tokens 8, num_tokens 7" in r.message
    assert r.hints == ["no_rollback"]
    assert wrong_elements(report, "ch27-spec-counters")
    assert statuses(report, "ch27.1") == statuses(report, "ch27.2") == {"passed"}


@pytest.mark.parametrize(
    "mistake_id", ["rollback_one_too_many", "bonus_rejected", "bonus_as_draft", "drafts_not_scheduled", "spec_not_cleared"]
)
def test_the_spec_mistakes_are_named_on_the_figure_instance(graded, mistake_id):
    r = result(graded.mistake(mistake_id), "figure instance", task="ch27.3")
    assert r.status == "failed" and r.hints == [mistake_id]


def test_the_spec_invariants_name_a_missing_rollback():
    trace = copy.deepcopy(spec_trace(SPEC["request"], SPEC["rounds"]))
    hidden_checks.check_spec_invariants(trace, "case")
    trace[1]["after_update"]["num_computed_tokens"] = trace[1]["after_schedule"]["num_computed_tokens"]
    with pytest.raises(CheckFailed, match="computed every token but its newest") as e:
        hidden_checks.check_spec_invariants(trace, "case")
    assert e.value.hints == ["no_rollback"]


# Hints no edit of the reference makes: the explanation of a made-up difference names them.
def explained(config: dict, script: list, change) -> CheckFailed:
    """The failure for the reference's trace of `script` with `change(records)` applied to a copy of it."""
    expected = checks.drive_reference(ref, config, script)
    yours = copy.deepcopy(expected["trace"])
    change(yours)
    with pytest.raises(CheckFailed) as e:
        checks.check_trace(yours, expected["ops"], expected["trace"], 'case "made up"', config["async"])
    return e.value


SYNC = {"budget": 8, "max_num_seqs": 2, "async": False}
EOS_SCRIPT = [("add", "A", 3, 5, 1), ("add", "B", 2, 3, 2), ("drain",)]


def test_two_batches_in_one_step_are_named():
    failure = explained(SYNC, EOS_SCRIPT, lambda yours: yours[0]["batches"].append(dict(yours[0]["batches"][0])))
    assert failure.hints == ["two_batches"] and "step 1 should launch {A: 3, B: 2}; yours launched" in str(failure)


def test_an_output_for_a_request_that_got_nothing_is_named():
    failure = explained(
        SYNC, EOS_SCRIPT, lambda yours: yours[0]["outputs"].append({"request_id": "Z", "new_token_ids": [7], "finished": False})
    )
    assert failure.hints == ["extra_outputs"]


def test_a_token_appended_after_eos_is_named():
    trace = checks.drive_reference(ref, SYNC, EOS_SCRIPT)["trace"]
    k = next(k for k, s in enumerate(trace) if s["requests"]["A"]["status"] == "FINISHED_STOPPED")
    failure = explained(SYNC, EOS_SCRIPT, lambda yours: yours[k]["requests"]["A"]["output_token_ids"].append(999))
    assert failure.hints == ["appended_after_eos"]


def test_outputs_in_the_wrong_order_are_named():
    config = {"budget": 8, "max_num_seqs": 2, "async": True}
    script = [("add", "A", 3, 4, None), ("drain",)]

    def swap(yours: list) -> None:
        outs = yours[-1]["requests"]["A"]["output_token_ids"]
        outs[0], outs[1] = outs[1], outs[0]

    assert explained(config, script, swap).hints == ["outputs_out_of_order"]


def test_the_harness_reports_a_trace_that_stopped_early():
    expected = checks.drive_reference(ref, SYNC, EOS_SCRIPT)
    with pytest.raises(CheckFailed, match="step 2 of 3: step\\(\\)\nyour trace stopped after 1 step, before this one"):
        checks.check_trace(expected["trace"][:1], expected["ops"], expected["trace"], 'case "short"', False)


# -- the figures' layout ------------------------------------------------------------------------------------
def test_the_loop_boxes_are_as_wide_as_their_text_and_nothing_leaves_the_page():
    svg = reference_figures("ch27")["ch27-enginecore-loop"]
    assert off_canvas(svg, margin=MARGIN - 1) == []
    calls = {call for _, call, _, _ in drawn.LOOP}
    loop = sorted((b for b in rects(svg, cls="box") if any(b.holds(t) and t.s in calls for t in texts(svg))), key=lambda b: b.x)
    assert len(loop) == len(drawn.LOOP)
    for box in loop:
        assert cramped(svg, box, pad=drawn.BOX_PAD - 0.5) == [], "every line of a loop box has room on both sides"
    for box in rects(svg, cls="box"):
        assert cramped(svg, box, pad=drawn.BOX_PAD - 0.5) == [], "and so has every chip of the instance"
    # What crosses an arrow is written between the two boxes it joins.
    for (name, contents), a, b in zip(drawn.CONTRACTS, loop, loop[1:]):
        words = " ".join(contents).split()
        mine = [t for t in texts(svg) if t.s == name or (a.x + a.w < t.x < b.x and t.s.split() and set(t.s.split()) <= set(words))]
        assert len(mine) >= 1 + len(contents)
        assert all(a.x + a.w + drawn.GAP_PAD - 0.5 <= t.left and t.right <= b.x - drawn.GAP_PAD + 0.5 for t in mine)


def test_the_spec_figure_stays_on_the_page_and_draws_every_step():
    svg = reference_figures("ch27")["ch27-spec-counters"]
    assert off_canvas(svg, margin=MARGIN - 1) == []
    labels = [t.s for t in texts(svg)]
    assert [s for s in labels if s.startswith("step ") and s.endswith("schedule_spec")] == [
        f"step {k}: schedule_spec" for k in range(1, len(SPEC["rounds"]) + 1)
    ]


def test_no_label_of_the_figures_ends_on_a_dangling_separator():
    # ("·" alone is a cell's value: the request is not there yet.)
    for figure_id, svg in reference_figures("ch27").items():
        assert [t.s for t in texts(svg) if t.s.rstrip().endswith("·") and t.s.strip() != "·"] == [], figure_id
