"""ch31 · mixture of experts across ranks: wrong submissions get the teaching message meant for them, the
figures drawn from them mark what is wrong, and the reference reproduces the worked examples of DeepEP (§G.3)
and DeepSeek's EPLB (§H.3)."""

from __future__ import annotations

from itertools import combinations

import pytest
import torch
from figure_layout import curves, lines, off_canvas, overlap, rects, reference_figures, reference_records, texts
from local_trial import reference_trial
from mutate import figure_file, mutant_grader, result, tasks_not_passed, wrong_elements

from figures.style import MARGIN
from grader import chapters
from grader.checks import ch31 as checks
from grader.hidden import ch31 as hidden_checks
from grader.hidden import ch31_models as models
from solutions import ch31_moe_eplb as ref

SEED = 31


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return mutant_grader(tmp_path_factory, "ch31", SEED)


# -- 31.1 ---------------------------------------------------------------------------------------------
def test_weights_left_unnormalised_are_explained(graded):
    report = graded.mistake("no_renormalize")  # the k softmax probabilities returned as they are
    r = result(report, "four tokens, four experts")
    assert r.status == "failed"
    assert "divided by their sum" in r.message
    assert r.hints == ["no_renormalize"]
    assert result(report, "renormalize=False").status == "passed"
    assert tasks_not_passed(report) == {"ch31.1"}


def test_ties_to_the_higher_expert_id_are_explained(graded):
    report = graded.mistake("ties_high")  # equal probabilities resolved towards the higher expert id
    r = result(report, "ties go to the lower expert id")
    assert r.status == "failed"
    assert "token 0" in r.message and "experts [1, 2]" in r.message and "yours: experts [2, 1]" in r.message
    assert r.hints == ["ties_high"]
    assert result(report, "four tokens, four experts").status == "passed", "no ties there"


# -- 31.2 ---------------------------------------------------------------------------------------------
def test_rows_grouped_by_token_are_explained(graded):
    report = graded.mistake("by_token")  # rows left in token order: each expert's rows are scattered over the rank
    r = result(report, "figure instance: dispatch")
    assert r.status == "failed"
    assert "rank 0 should receive, grouped by expert then token: T0·e0, T1·e0, T1·e1, T3·e1" in r.message
    assert "(your rank 0: T0·e0, T0·e2, T1·e1, T1·e0)" in r.message
    assert r.hints == ["by_token"]
    assert wrong_elements(report, "ch31-moe-roundtrip")
    assert result(report, "round trips through your dispatch and combine").status == "passed", (
        "a handle that matches its rows still round-trips"
    )


def test_unweighted_combine_is_explained(graded):
    report = graded.mistake("unweighted")  # DeepEP's normal combine sums without weights: never applied here
    r = result(report, "figure instance: combine")
    assert r.status == "failed"
    assert "out[0] = Σ_j topk_weights[0, j] · its expert output = 0.6·y(row 0, e0) + 0.4·y(row 4, e2)" in r.message
    assert "= [1.8, 18]; yours: [4, 40]" in r.message
    assert r.hints == ["unweighted"]
    assert result(report, "identity experts").status == "failed"
    assert wrong_elements(report, "ch31-moe-roundtrip")


def test_rows_concatenated_in_physical_order_are_explained(graded):
    report = graded.mistake("concatenated")  # the ranks' outputs concatenated as they arrived, without the handle
    r = result(report, "figure instance: combine")
    assert r.status == "failed"
    assert "expected one row per token, [4, 2]; yours: float32 tensor [8, 2]" in r.message
    assert r.hints == ["concatenated"]


def test_per_rank_deduplication_is_explained(graded):
    report = graded.mistake("dedup_per_rank")  # DeepEP normal mode's layout: a token sent once per rank
    r = result(report, "figure instance: dispatch")
    assert r.status == "failed"
    assert "handle['rows_per_rank'] = [4, 4]: one row per (token, expert) pair; yours: [3, 3]" in r.message
    assert r.hints == ["dedup_per_rank"]


# -- 31.3 ---------------------------------------------------------------------------------------------
def test_replicating_the_heaviest_expert_is_explained(graded):
    report = graded.mistake("raw_load")  # each spare slot to the heaviest expert, whatever its replicas
    r = result(report, "figure instance: EPLB")
    assert r.status == "failed"
    assert "expert 2 gets 2 replica(s)" in r.message and "yours: 1" in r.message
    assert "expected logcnt [3, 1, 2, 1, 2, 1, 1, 1]; yours [3, 1, 1, 1, 3, 1, 1, 1]" in r.message
    assert r.hints == ["raw_load"]
    assert wrong_elements(report, "ch31-eplb-load")
    assert result(report, "balancedness before and after").status == "passed"


def test_global_policy_where_hierarchy_applies_is_explained(graded):
    report = graded.mistake("always_global")  # the global policy even when the groups divide over the nodes
    r = result(report, "random loads, hierarchical policy")
    assert r.status == "failed"
    assert "(hierarchical policy)" in r.message
    assert r.hints == ["always_global"]
    assert result(report, "figure instance: EPLB").hints == ["always_global"]
    assert result(report, "random loads, global policy").status == "passed"


def test_round_robin_packing_is_caught(graded):
    report = graded.mistake("round_robin")  # items dealt to packs in turn instead of to the lightest with room
    r = result(report, "figure instance: EPLB")
    assert r.status == "failed"
    assert "step 1 packs the groups onto the nodes, heaviest first" in r.message
    assert "group loads g0 100, g2 90, g1 60, g3 50" in r.message
    assert "node 0 should hold groups [0, 3]; yours holds experts of groups [0, 1]" in r.message
    assert r.hints == ["round_robin"]
    assert wrong_elements(report, "ch31-eplb-load")
    assert_no_line_crosses_a_label(figure_file(report, "ch31-eplb-load").read_text(encoding="utf-8"))
    g = result(report, "the global policy")  # one node: step 1 is trivial, so step 3's packing is what differs
    assert g.status == "failed" and "should carry experts" in g.message and "expected GPU loads" in g.message


def test_balancedness_upside_down_is_explained(graded):
    report = graded.mistake("max_over_mean")  # max / mean: the imbalance factor instead of the balancedness
    r = result(report, "balancedness before and after")
    assert r.status == "failed"
    assert "Σ_layers mean = 75, Σ_layers max = 100, so balancedness = 0.75; yours: 1.33333" in r.message
    assert r.hints == ["max_over_mean"]
    assert wrong_elements(report, "ch31-eplb-load")
    assert result(report, "figure instance: EPLB").status == "passed"


def test_equivalent_formulations_pass_every_check(graded):
    report = graded(
        "equivalent_forms",
        # not a misconception: the same answers by other arithmetic
        (
            "    gathered = torch.zeros(num_tokens, k, y.shape[1], dtype=torch.float32)\n"
            "    gathered[src, slot] = y.float()\n"
            "    return (gathered * topk_weights.float()[:, :, None]).sum(dim=1).to(y.dtype)",
            "    out = torch.zeros(num_tokens, y.shape[1], dtype=torch.float32)\n"
            "    out.index_add_(0, src, y.float() * topk_weights.float()[src, slot][:, None])\n"
            "    return out.to(y.dtype)",
        ),
        (
            "order = flat.sort(stable=True).indices                  # by expert, then by token (and slot)",
            "order = torch.argsort(flat * flat.numel() + torch.arange(flat.numel()))",
        ),
    )
    failed = [f"{r.name}: {r.message}" for r in report.results if r.status != "passed"]
    assert not failed, failed


# -- the reference against the documented worked examples ------------------------------------------------
def test_reference_reproduces_deepeps_example():
    # §G.3, low-latency layout: rank 0's expert 0 rows are [T0, T1], expert 1's [T1, T3]; rank 1: [T0, T2], [T2, T3].
    x, ids, w = checks.g3_instance()
    rows, handle = ref.dispatch(x, ids, 4, 2)
    assert handle["src_token"].tolist() == [0, 1, 1, 3, 0, 2, 2, 3]
    assert handle["expert"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert handle["tokens_per_expert"].tolist() == [2, 2, 2, 2]
    out = ref.combine(checks.scaled_experts(rows, handle), handle, w)
    factors = [0.6 * 1 + 0.4 * 3, 0.7 * 2 + 0.3 * 1, 0.5 * 4 + 0.5 * 3, 0.8 * 2 + 0.2 * 4]
    assert torch.allclose(out, x * torch.tensor(factors)[:, None])


def test_reference_reproduces_eplbs_worked_example():
    # §H.3: GPU loads [75, 75, 80, 70]; G0 = {e7, e0, e1}, G1 = {e0, e0, e6}, G2 = {e4, e4, e2}, G3 = {e5, e2, e3};
    # balancedness 0.9375, and 0.75 for the static placement [100, 60, 90, 50].
    weight = torch.tensor([checks.H3_LOADS])
    phy2log, log2phy, logcnt = ref.rebalance_experts(weight, *checks.H3_ARGS)
    assert phy2log.view(4, 3).tolist() == [[7, 0, 1], [0, 0, 6], [4, 4, 2], [5, 2, 3]]
    loads = checks.gpu_loads(weight, phy2log, logcnt, 4)[0]
    assert loads.tolist() == [75.0, 75.0, 80.0, 70.0]
    assert ref.balancedness(loads) == 0.9375
    assert ref.balancedness(checks.static_loads(weight, 4)[0]) == 0.75
    glob = checks.gpu_loads(weight, *ref.rebalance_experts(weight, 12, 1, 2, 4)[::2], 4)[0]
    assert sorted(glob.tolist()) == [70.0, 75.0, 75.0, 80.0]


def test_eplb_invariants_on_random_loads():
    g = torch.Generator().manual_seed(0)
    for _ in range(30):
        weight = torch.rand(2, 16, generator=g) * 100
        phy2log, log2phy, logcnt = ref.rebalance_experts(weight, 24, 4, 2, 8)
        for layer in range(2):
            assert torch.equal(torch.bincount(phy2log[layer], minlength=16), logcnt[layer])
            for e in range(16):
                slots = log2phy[layer, e][log2phy[layer, e] >= 0]
                assert (phy2log[layer, slots] == e).all() and len(slots) == logcnt[layer, e]
            # hierarchical: an expert's replicas stay on the node that owns its group (12 slots per node)
            for e in range(16):
                slots = log2phy[layer, e][log2phy[layer, e] >= 0]
                assert len(set((slots // 12).tolist())) == 1


# -- the figures' layout ------------------------------------------------------------------------------------
def assert_no_line_crosses_a_label(svg: str) -> None:
    """No mean or max line runs through a text unless a patch drawn over the line hides it behind that text;
    the lines' own labels never meet; nothing leaves the page."""
    refs = lines(svg, cls="mean") + lines(svg, cls="max")
    assert len(refs) == 4, "a mean and a max line in each panel"
    patches = rects(svg, cls="label-patch")
    for t in texts(svg):
        for x1, y, x2, _ in refs:
            if x1 <= t.x <= x2 and t.top - 1 <= y <= t.bottom + 1:
                assert any(p.x <= t.left and t.right <= p.x + p.w and p.y <= y <= p.y + p.h for p in patches), (
                    f"the line at y {y} crosses {t.s!r}"
                )
    labels = texts(svg, cls="line-label")
    assert len(labels) == 4 and not [(a.s, b.s) for a, b in combinations(labels, 2) if overlap(a, b)]
    assert off_canvas(svg, margin=MARGIN - 1) == []


def test_no_reference_line_crosses_a_label_of_the_load_figure():
    svg = reference_figures("ch31")["ch31-eplb-load"]
    assert_no_line_crosses_a_label(svg)
    shown = [t.s for t in texts(svg)]
    assert "e5 30" in shown and "mean 75" in shown, "the label the mean line used to strike through is drawn"


def test_the_roundtrip_strands_cross_only_where_the_rows_order_makes_them():
    src = reference_records("ch31")["ch31-moe-roundtrip"]["handle_expected"]["src_token"]
    svg = reference_figures("ch31")["ch31-moe-roundtrip"]
    strands = curves(svg)
    assert len(strands) == 2 * len(src), "a dispatch and a combine strand per row"
    least = sum(1 for i, j in combinations(range(len(src)), 2) if src[i] > src[j])
    assert least > 0, "the rows leave token order (that is the point of the figure)"
    for group in (strands[: len(src)], strands[len(src) :]):
        ends = [x1 for x1, _, _, _ in group] if group is strands[: len(src)] else [x2 for _, _, x2, _ in group]
        assert len({round(x, 1) for x in ends}) == len(src), "every strand meets its token at a point of its own"
        crossings = sum(1 for a, b in combinations(group, 2) if (a[0] - b[0]) * (a[2] - b[2]) < 0)
        assert crossings == least, "two strands cross only when a later token's row lies left of an earlier one's"
    assert off_canvas(svg, margin=MARGIN - 1) == []


# -- 31.3: equal loads in any order the greedy packing allows --------------------------------------------------
def test_another_order_of_equal_loads_passes_every_eplb_check(graded):
    # EPLB sorts with torch's unstable sort: items of equal load (an expert's replicas, e0's 90/3 = 30 = e5's 30 in
    # the worked example) may come in any order. Taking them higher index first is one such order.
    edit = (
        "for i in sorted(range(len(values)), key=lambda i: -values[i]):",
        "for i in sorted(range(len(values)), key=lambda i: (-values[i], -i)):",
    )
    report = graded("ties_high_index", edit, task="ch31.3")
    failed = [f"{r.name}: {r.message}" for r in report.results if r.status != "passed"]
    assert not failed, failed
    namespace: dict = {}
    exec(compile((chapters.SOLUTIONS / "ch31_moe_eplb.py").read_text(encoding="utf-8").replace(*edit), "mutant", "exec"), namespace)
    weight, args = torch.tensor([checks.H3_LOADS]), (12, 1, 2, 4)
    theirs = namespace["rebalance_experts"](weight, *args)[0]
    ours, _, logcnt = ref.rebalance_experts(weight, *args)
    assert not torch.equal(theirs, ours), "the tie between e5 and e0's replicas goes the other way"
    assert checks.packed_in_some_order(theirs, logcnt, weight, ours, args)
    # Step 1: groups of equal load taken the other way put other experts on each node, and that is EPLB's too.
    weight, args = torch.tensor([[10.0, 20.0, 30.0, 0.0, 12.0, 8.0, 4.0, 6.0]]), (8, 4, 2, 4)
    theirs = namespace["rebalance_experts"](weight, *args)[0]
    placements = models.step1_orders(ref, weight, args)[0]
    assert not torch.equal(theirs, ref.rebalance_experts(weight, *args)[0]) and len(placements) == 2
    assert any(torch.equal(theirs[0], p) for p, _ in placements)


def test_a_step2_tie_to_the_higher_index_is_explained(graded):
    report = graded.mistake("step2_tie_high", task="ch31.3")
    r = result(report, "integer token counts with equal loads")
    assert r.status == "failed" and r.hints == ["step2_tie_high"]
    assert "expert 0 gets 3 replica(s)" in r.message


def test_the_reference_keeps_every_eplb_point_on_integer_loads_over_many_seeds():
    for seed in range(40):
        for check in (hidden_checks.eplb_random_hierarchical, hidden_checks.eplb_random_global):
            check(reference_trial(check, seed, ref))


def test_a_placement_no_greedy_order_gives_is_still_refused():
    weight = torch.tensor([checks.H3_LOADS])
    phy2log, _, logcnt = ref.rebalance_experts(weight, *checks.H3_ARGS)
    swapped = phy2log.clone()
    swapped[0, [1, 2]] = swapped[0, [2, 1]]  # GPU 0's e0 and e1 in the other order: e1 cannot come first
    assert not checks.packed_in_some_order(swapped, logcnt, weight, phy2log, checks.H3_ARGS)
    assert checks.packed_in_some_order(phy2log, logcnt, weight, phy2log, checks.H3_ARGS)


# -- 31.4 ---------------------------------------------------------------------------------------------
def test_the_last_pass_alone_is_explained(graded):
    report = graded.mistake("last_step_only", task="ch31.4")  # the load of this pass, not the window's sum
    r = result(report, "figure instance: a window")
    assert r.status == "failed"
    assert "expert 0 is in slots [0, 4], so its load is the sum of those slots over all 4 rows" in r.message
    assert "expected load [81, 11, 54, 23]; yours [7, 2, 11, 16]" in r.message
    assert r.hints == ["last_step_only"]
    assert wrong_elements(report, "ch31-eplb-window")


def test_a_cursor_that_runs_off_the_window_is_explained(graded):
    report = graded.mistake("not_wrapped", task="ch31.4")
    assert result(report, "figure instance: a window").status == "passed", "the cursor moves from row 1 to 2"
    r = result(report, "the cursor wraps")
    assert r.status == "failed" and "next_step = (2 + 1) mod 3 = 0; yours: 3" in r.message
    assert r.hints == ["not_wrapped"]
    assert result(report, "seven passes").hints == ["not_wrapped"]


def test_slot_loads_and_shifted_windows_are_explained(graded):
    r = result(graded.mistake("physical_loads", task="ch31.4"), "figure instance: a window")
    assert "[L, E] = [1, 4]; yours: int64 tensor [1, 6], one entry per slot" in r.message
    assert r.hints == ["physical_loads"]
    report = graded.mistake("shifted_window", task="ch31.4")
    r = result(report, "figure instance: a window")
    assert "row 1 (the oldest pass) becomes this pass's counts and the other rows stay" in r.message
    assert r.hints == ["shifted_window"]
    assert result(graded.mistake("window_mean", task="ch31.4"), "figure instance: a window").hints == ["window_mean"]


def test_the_reference_keeps_a_ring_buffer():
    phy2log = torch.tensor([[0, 1, 0]])
    window, step = torch.zeros(2, 1, 3, dtype=torch.int64), 0
    loads = []
    for counts in ([5, 1, 2], [4, 3, 0], [1, 1, 1]):
        before = window.clone()
        window, step, load = ref.record_expert_load(window, step, torch.tensor([counts]), phy2log, 2)
        assert torch.equal(before, before.clone()), "the input window is left as it was"
        loads.append(load.tolist())
    assert step == 1 and window[:, 0].tolist() == [[1, 1, 1], [4, 3, 0]], "the third pass overwrote the first"
    assert loads == [[[7, 1]], [[11, 4]], [[6, 4]]]


def test_the_window_figure_stays_on_the_page():
    svg = reference_figures("ch31")["ch31-eplb-window"]
    assert off_canvas(svg, margin=MARGIN - 1) == []
    shown = [t.s for t in texts(svg)]
    assert "row 1 · pass t" in shown and "row 2 · pass t−3  ← cursor" in shown


# -- the provided input checks (outside the solution regions: unit tests, no graded checks) ---------------------
@pytest.mark.parametrize(
    "logits, k",
    [
        (torch.zeros(4), 1),
        (torch.zeros(2, 4, dtype=torch.int64), 1),
        (torch.tensor([[0.0, float("nan")]]), 1),
        (torch.zeros(2, 4), 0),
        (torch.zeros(2, 4), 5),
        (torch.zeros(2, 4), 2.0),
    ],
)
def test_the_provided_checks_refuse_bad_routing_inputs(logits, k):
    with pytest.raises(ValueError):
        ref.route_topk(logits, k)


@pytest.mark.parametrize(
    "ids, E, R",
    [
        (torch.tensor([[0, 0], [1, 2], [3, 1]]), 4, 2),
        (torch.tensor([[0, 4], [1, 2], [3, 1]]), 4, 2),
        (torch.tensor([[0, 1], [1, 2]]), 4, 2),
        (torch.tensor([[0, 1], [1, 2], [3, 1]]).int(), 4, 2),
        (torch.tensor([[0, 1], [1, 2], [3, 1]]), 6, 4),
        (torch.tensor([[0, 1], [1, 2], [3, 1]]), 4, 0),
    ],
)
def test_the_provided_checks_refuse_a_bad_dispatch(ids, E, R):
    with pytest.raises(ValueError):
        ref.dispatch(torch.zeros(3, 2), ids, E, R)


def test_the_provided_checks_refuse_outputs_that_do_not_match_the_handle():
    rows, handle = ref.dispatch(torch.zeros(3, 2), torch.tensor([[0, 1], [1, 2], [3, 1]]), 4, 2)
    for outputs, weights in (
        (rows[:1], torch.ones(3, 2)),
        (rows, torch.ones(2, 2)),
        (rows, torch.ones(6)),
        ([rows[0], torch.zeros(rows[1].shape[0], 5)], torch.ones(3, 2)),
        ([rows[0], rows[1][:1]], torch.ones(3, 2)),
    ):
        with pytest.raises(ValueError):
            ref.combine(outputs, handle, weights)
    assert ref.combine(rows, handle, torch.ones(3, 2)).shape == (3, 2)


@pytest.mark.parametrize(
    "weight, args",
    [
        (torch.rand(1, 8), (6, 4, 2, 2)),
        (torch.rand(1, 8), (12, 3, 1, 4)),
        (torch.rand(1, 8), (12, 4, 3, 4)),
        (-torch.rand(1, 8), (12, 4, 2, 4)),
        (torch.rand(8), (12, 4, 2, 4)),
        (torch.rand(1, 8), (10, 4, 2, 4)),
        (torch.tensor([[1.0, float("inf")]]), (2, 1, 1, 1)),
        (torch.rand(1, 8), (12.0, 4, 2, 4)),
    ],
)
def test_the_provided_checks_refuse_a_bad_placement_request(weight, args):
    with pytest.raises(ValueError):
        ref.rebalance_experts(weight, *args)


@pytest.mark.parametrize(
    "loads",
    [torch.tensor([1.0, -2.0]), torch.zeros(0), torch.zeros(2, 0), torch.zeros(2, 2, 2), torch.tensor([1.0, float("nan")]), [1.0, 2.0]],
)
def test_the_provided_checks_refuse_bad_loads(loads):
    with pytest.raises(ValueError):
        ref.balancedness(loads)


WINDOW, PASS, PHY = torch.zeros(2, 1, 3, dtype=torch.int64), torch.tensor([[1, 2, 3]]), torch.tensor([[0, 1, 0]])


@pytest.mark.parametrize(
    "window, step, load_pass, phy2log, E",
    [
        (WINDOW.int(), 0, PASS, PHY, 2),
        (WINDOW[0], 0, PASS, PHY, 2),
        (WINDOW[:0], 0, PASS, PHY, 2),
        (WINDOW, 2, PASS, PHY, 2),
        (WINDOW, -1, PASS, PHY, 2),
        (WINDOW, 1.0, PASS, PHY, 2),
        (WINDOW, 0, PASS[:, :2], PHY, 2),
        (WINDOW, 0, -PASS, PHY, 2),
        (WINDOW, 0, PASS.float(), PHY, 2),
        (WINDOW, 0, PASS, PHY, 1),
        (WINDOW, 0, PASS, PHY, 0),
        (WINDOW, 0, PASS, -PHY, 2),
    ],
)
def test_the_provided_checks_refuse_a_bad_window(window, step, load_pass, phy2log, E):
    with pytest.raises(ValueError):
        ref.record_expert_load(window, step, load_pass, phy2log, E)
