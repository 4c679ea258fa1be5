"""ch24 · the control loop and its counters: wrong schedulers and counters that embody real misconceptions get
the trace message meant for them, the figures drawn from them mark the wrong cells, and the reference agrees
with the facts of nano-vllm bb823b3 and vLLM v1 (reference/nanovllm.md §11, vllm_and_beyond.md §A.5)."""

from __future__ import annotations

import pytest
from mutate import figure, mutant_grader, result, tasks_not_passed, wrong_elements

from figures.kit import Figure, text_width
from grader.checks import ch24 as checks
from grader.checks import ch24_trace as tracing
from grader.hidden import ch24 as hidden_checks
from solutions import ch24_scheduler as ref

SEED = 24
SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return mutant_grader(tmp_path_factory, "ch24", SEED)


# -- 24.1 the scheduler ---------------------------------------------------------------------------------
NO_COUNT = ("            seq.num_computed_tokens += seq.num_scheduled_tokens\n", "")


def test_chunk_not_counted(graded):
    report = graded("no_count",
                    # postprocess forgets to count the chunk: num_computed_tokens never advances
                    NO_COUNT)
    r = result(report, "figure instance: one request")
    assert r.status == "failed"
    assert "step 1: schedule() → prefill [A: tokens 0–3 of 10]" in r.message
    assert "the runner returned A → 37 (candidate of an unfinished chunk)" in r.message
    assert ("after step 1 request A should be WAITING with num_computed_tokens 4; yours has 0: "
            "the chunk was not counted") in r.message
    assert "hint: postprocess adds each sequence's num_scheduled_tokens to num_computed_tokens" in r.message
    assert tasks_not_passed(report) == {"ch24.1"}
    inv = result(report, "invariants of your own trace")
    assert inv.status == "failed" and "was scheduled but its num_computed_tokens did not grow" in inv.message
    assert wrong_elements(report, "ch24-control-loop")
    assert not wrong_elements(report, "ch24-three-progress")


def test_instance_chips_hold_their_text(graded):
    root = figure(graded("no_count", NO_COUNT), "ch24-control-loop")
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
    texts = list(figure(graded("no_count", NO_COUNT), "ch24-three-progress").iter(f"{SVG}text"))
    # the start row's num_cached_tokens is vLLM's −1, "not set yet": the figure says what it means
    start = next(i for i, el in enumerate(texts) if el.text == "before the first step")
    assert "−1" in [el.text for el in texts[start:start + 20] if el.get("class") == "value"]
    assert [el.text for el in texts if el.get("class") == "note unset"] == ["−1: not set until admitted"]
    assert any("num_cached_tokens starts at −1" in (el.text or "") for el in texts)


def test_candidate_of_an_unfinished_chunk_appended(graded):
    report = graded("append_candidate",
                    # the runner's token is appended after every prefill chunk, finished or not
                    ("            if is_prefill and seq.num_computed_tokens < seq.num_tokens:\n                continue\n",
                     ""), task="ch24.1")
    r = result(report, "figure instance: one request")
    assert r.status == "failed"
    assert ("after step 1 request A should be WAITING with num_tokens 10; yours has 11: "
            "the candidate token of an unfinished chunk was appended") in r.message
    assert "hint: A's prompt is not complete after this chunk (4 of 10 computed)" in r.message
    assert wrong_elements(report, "ch24-control-loop")
    hidden = result(report, "hundreds of requests")
    assert hidden.status != "passed"


def test_preempted_from_the_head(graded):
    report = graded("head_victim",
                    # the victim taken from the left end of running (the oldest) instead of the right end
                    ("self.preempt(self.running.pop())", "self.preempt(self.running.popleft())"), task="ch24.1")
    r = result(report, "memory pressure: preemption from the tail")
    assert r.status == "failed"
    assert "after step 3's schedule() waiting should be [D] and running [A, B, C]; yours: waiting [C]" in r.message
    assert "hint: preempted from the head instead of the tail" in r.message
    assert result(report, "figure instance").status == "passed"


def test_decode_before_prefill(graded):
    report = graded("decode_first",
                    # waiting requests are admitted only when nothing is running: decodes go first
                    ("        while self.waiting and len(scheduled) < self.max_num_seqs:",
                     "        while self.waiting and len(scheduled) < self.max_num_seqs and not self.running:"),
                    task="ch24.1")
    r = result(report, "prefill before decode")
    assert r.status == "failed"
    assert "step 3 should be a prefill of [B, C]; yours decodes [A]" in r.message
    assert "hint: decode before prefill: prefill has strict priority" in r.message


def test_second_sequence_chunked(graded):
    report = graded("second_chunked",
                    # any sequence may take a chunk of what is left of the budget, not only the first
                    ("            if remaining < to_compute and scheduled:\n                break\n", ""), task="ch24.1")
    r = result(report, "only the first sequence of a batch is chunked")
    assert r.status == "failed"
    assert "step 1's prefill batch should be [A]; yours is [A, B]" in r.message
    assert ("hint: only the first sequence of a batch may be chunked: B needs 9 tokens and only 2 are left in the "
            "budget") in r.message


def test_preempted_to_the_back_of_waiting(graded):
    report = graded("victim_to_back",
                    # a preempted sequence queued behind the requests that never ran
                    ("self.waiting.appendleft(seq)", "self.waiting.append(seq)"), task="ch24.1")
    r = result(report, "hundreds of requests")
    assert r.status == "failed"
    assert "hint: a preempted sequence goes to the front of waiting (appendleft)" in r.message


def test_finished_sequence_keeps_its_blocks(graded):
    report = graded("no_free_on_finish",
                    # a finished sequence is removed from running but its blocks are never returned
                    ("                seq.status = FINISHED\n                self.block_manager.deallocate(seq)\n",
                     "                seq.status = FINISHED\n"), task="ch24.1")
    r = result(report, "figure instance")
    assert r.status == "failed"
    assert "after step 5 request A should be FINISHED with blocks 0; yours has 3" in r.message
    assert "hint: a finished sequence gives its blocks back (deallocate)" in r.message
    inv = result(report, "invariants of your own trace")
    assert inv.status == "failed" and "is FINISHED but is still queued or holds" in inv.message


def test_no_fit_check(graded):
    report = graded("no_fit_check",
                    # add() accepts a request that can never fit in the pool (nano-vllm would stall on it)
                    ("        if need > self.block_manager.num_blocks:", "        if False:"), task="ch24.1")
    r = result(report, "a request that can never fit")
    assert r.status == "failed"
    assert "add should raise ValueError because 7 prompt tokens + 3 − 1 generated need 3 blocks" in r.message
    assert "yours returned None" in r.message


# -- 24.2 the counters -----------------------------------------------------------------------------------
def test_cached_set_again_on_readmission(graded):
    report = graded("cached_again",
                    # num_cached_tokens overwritten by every admission instead of set once
                    ("            if cached < 0:\n                cached = prefix_hit\n",
                     "            cached = prefix_hit\n"), task="ch24.2")
    r = result(report, "figure instance: a prefix hit")
    assert r.status == "failed"
    assert ("num_cached_tokens after step 6 should be 4 (it was set at the first admission and never changes: 4); "
            "yours: 8") in r.message
    assert "hint: a re-admission after preemption does not set it again" in r.message
    assert wrong_elements(report, "ch24-three-progress")


def test_cached_is_the_computed_count(graded):
    report = graded("cached_is_computed",
                    # num_cached_tokens read as nano-vllm HEAD's name: the computed count
                    ('            "num_cached_tokens": cached}', '            "num_cached_tokens": computed}'),
                    task="ch24.2")
    r = result(report, "figure instance: a prefix hit")
    assert r.status == "failed"
    assert "num_cached_tokens after step 1 should be 4 (the first admission sets it, once, to the prefix hit" \
           in r.message
    assert "yours: 8" in r.message


def test_sample_of_a_partial_chunk_kept(graded):
    report = graded("keep_every_sample",
                    # every scheduled step appends its sample, finished prompt or not
                    ("        if computed == total:\n            total += 1\n", "        total += 1\n"), task="ch24.2")
    r = result(report, "vLLM's worked example")
    assert r.status == "failed"
    assert "step 1: admitted (no prefix hit), 4 tokens scheduled" in r.message
    assert "0 + 4 = 4 < num_tokens 10: an unfinished prefill chunk, its sample is thrown away" in r.message
    assert "hint: the candidate token of an unfinished chunk was appended" in r.message


def test_admission_ignores_the_prefix_hit(graded):
    report = graded("hit_ignored",
                    # the prefix hit not counted as computed on admission
                    ("            computed = prefix_hit\n", "            computed = 0\n"), task="ch24.2")
    r = result(report, "figure instance: a prefix hit")
    assert r.status == "failed"
    assert "num_computed_tokens after step 1 should be 8 (admission starts from the prefix hit: 4 + 4 = 8); yours: 4" \
           in r.message
    assert "hint: an admitted request starts from its prefix hit" in r.message


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
        steps.append((is_prefill, [(q.seq_id, q.num_scheduled_tokens) for q in batch],
                      [q.seq_id for q in s.waiting], [q.seq_id for q in s.running]))
        s.postprocess(batch, [tokens(q) for q in batch], is_prefill)
    return steps, seqs


def test_nanovllm_chunked_prefill_example():
    # nanovllm.md §11: bs 256, max_num_batched_tokens 400, a 1000-token prompt: 400, 400, 200, then decode.
    steps, (seq,) = run_reference(dict(num_blocks=8, block_size=256, max_num_seqs=4, max_num_batched_tokens=400,
                                       eos=-1), [(1000, 2)], lambda q: 7)
    assert [(p, chunks) for p, chunks, _, _ in steps] == [(True, [(0, 400)]), (True, [(0, 400)]), (True, [(0, 200)]),
                                                         (False, [(0, 1)])]
    assert seq.completion_token_ids == [7, 7] and seq.status == ref.FINISHED


def test_nanovllm_preemption_example():
    # nanovllm.md §11: bs 4, 4 blocks, A, B, C with 4-token prompts: the first decode preempts C (the tail);
    # later A needs a third block and B, the tail, is preempted.
    steps, _ = run_reference(dict(num_blocks=4, block_size=4, max_num_seqs=4, max_num_batched_tokens=16, eos=-1),
                             [(4, 6), (4, 6), (4, 6)], lambda q: 5)
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
        sc = hidden_checks.random_script(random.Random(seed), "inv", n=30, prompts=(1, 20), max_tokens=(1, 8),
                                         block_size=4, num_blocks=10, max_num_seqs=4, budget=6, arrivals=20)
        for phase, rec in tracing.drive(tracing.LocalOps(ref), sc, 10_000):
            assert hidden_checks.invariant_failure(sc, phase, rec) is None


def test_every_request_of_a_random_script_finishes_and_fits():
    import random

    sc = hidden_checks.random_script(random.Random(3), "fit", n=50, prompts=(1, 30), max_tokens=(1, 12),
                                     block_size=4, num_blocks=9, max_num_seqs=3, budget=5, arrivals=30)
    trace = tracing.drive_reference(ref, sc)
    done = {n for rec in trace for n, s in rec["after"]["seqs"].items() if s["status"] == ref.FINISHED}
    assert done == {r["name"] for r in sc["requests"]}
    assert any(n in rec["sched"]["waiting"] and n in prev["after"]["running"]
               for prev, rec in zip(trace, trace[1:]) for n in rec["sched"]["waiting"]), "some preemption happened"
