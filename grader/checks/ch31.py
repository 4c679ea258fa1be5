"""Public checks of ch31 · mixture of experts across ranks, and the messages they share with the hidden ones."""

from __future__ import annotations

import torch

from grader.authoring import CheckFailed, Trial, describe, expect_tensor, first_wrong, fmt, hidden_model, mistakes, public, vec, wrong_mask
from grader.i18n import tr

ATOL, RTOL = 1e-6, 1e-5  # route_topk's weights
COMBINE_TOL = 1e-4  # combine's outputs, absolute and relative
LOAD_ATOL, LOAD_RTOL = 1e-6, 1e-5  # a placement's GPU loads
HANDLE_KEYS = ("src_token", "topk_slot", "expert", "rows_per_rank", "tokens_per_expert")

# ch31-moe-roundtrip: DeepEP's worked example (reference §G.3): 4 tokens, 4 experts on 2 ranks, top-2.
G3_IDS = [[0, 2], [1, 0], [3, 2], [1, 3]]
G3_WEIGHTS = [[0.6, 0.4], [0.7, 0.3], [0.5, 0.5], [0.8, 0.2]]
G3_X = [[1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [4.0, 40.0]]  # token t: [t + 1, 10(t + 1)]
G3_EXPERTS, G3_RANKS = 4, 2

# ch31-eplb-load: DeepSeek EPLB's worked example (reference §H.3).
H3_LOADS = [90.0, 10.0, 40.0, 20.0, 60.0, 30.0, 15.0, 35.0]
H3_ARGS = (12, 4, 2, 4)  # num_replicas, num_groups, num_nodes, num_gpus

# ch31-eplb-window: one layer's load history, W = 4 passes of 6 slots; experts 0 and 2 have two replicas each.
W4_WINDOW = [[[12, 3, 7, 2, 11, 6]], [[9, 5, 4, 1, 10, 5]], [[15, 2, 8, 3, 14, 9]], [[10, 4, 6, 2, 12, 7]]]
W4_STEP = 1  # row 1 holds the oldest pass
W4_PASS = [[3, 2, 5, 16, 4, 6]]  # this pass: expert 3, cold so far, is suddenly hot
W4_PHY2LOG = [[0, 1, 2, 3, 0, 2]]
W4_EXPERTS = 4

M = mistakes("ch31")

step2_ties_high = hidden_model("ch31_models.step2_ties_high")
"""`t.ref.drive(step2_ties_high, weight, args)`: logcnt when step 2 gives ties to the higher node-local index."""
step1_orders = hidden_model("ch31_models.step1_orders")
"""`t.ref.drive(step1_orders, weight, args)`: per layer, every placement (phy2log, logcnt) EPLB gives when groups of
equal load arrive in another order in step 1 (its sort is unstable), the reference's first."""


# -- ch31.1 ----------------------------------------------------------------------------------------------------------


@public("ch31.1", "four tokens, four experts, top-2")
def route_small(t: Trial) -> None:
    logits = torch.tensor([[2.0, 0.5, 1.0, -1.0], [1.5, 2.5, 0.0, 0.2], [-0.3, 0.1, 1.1, 1.6], [0.0, 3.0, -2.0, 1.0]])
    run_routing_case(t, logits, 2, True, tr("router logits [4, 4]"))


@public("ch31.1", "ties go to the lower expert id")
def route_ties(t: Trial) -> None:
    run_routing_case(t, torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0], [0.0, 1.0, 0.0, 1.0]]), 2, True, tr("tied logits"))


@public("ch31.1", "renormalize=False keeps the softmax probabilities")
def route_raw(t: Trial) -> None:
    run_routing_case(t, torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]]), 3, False, tr("one token, 6 experts, top-3"))


@public("ch31.1", "k = E routes to every expert")
def route_all(t: Trial) -> None:
    run_routing_case(t, torch.tensor([[0.3, -1.2, 2.0], [1.0, 1.0, 0.0]]), 3, True, "k = E = 3")


# -- ch31.2 ----------------------------------------------------------------------------------------------------------


@public("ch31.2", "figure instance: dispatch of 4 tokens to 4 experts on 2 ranks, top-2")
def dispatch_figure_instance(t: Trial) -> None:
    x, ids, w = g3_instance()
    want = t.ref.dispatch(x, ids, G3_EXPERTS, G3_RANKS)
    got = t.yours.dispatch(x, ids, G3_EXPERTS, G3_RANKS)
    per_rank, handle = dispatch_structure(got, x, G3_RANKS, tr("figure instance"))
    t.figure(
        "ch31-moe-roundtrip",
        x=x,
        topk_ids=ids,
        topk_weights=w,
        handle={k: handle[k] for k in HANDLE_KEYS},
        handle_expected=want[1],
        rows=per_rank,
        rows_expected=want[0],
    )
    expect_dispatch(got, want, x, ids, G3_EXPERTS, G3_RANKS, tr("figure instance"))


@public("ch31.2", "figure instance: combine with experts y = (e + 1)·x")
def combine_figure_instance(t: Trial) -> None:
    x, ids, w = g3_instance()
    rows, handle = t.ref.dispatch(x, ids, G3_EXPERTS, G3_RANKS)
    outputs = scaled_experts(rows, handle)
    got = t.yours.combine(outputs, handle, w)
    want = t.ref.combine(outputs, handle, w)
    if isinstance(got, torch.Tensor) and got.shape == want.shape:
        t.figure(
            "ch31-moe-roundtrip", out=got, out_expected=want, out_wrong=wrong_mask(got, want, atol=COMBINE_TOL, rtol=COMBINE_TOL).any(dim=1)
        )
    expect_combined(got, want, outputs, w, handle, tr("figure instance"), tr(" with y = (e + 1)·x"))


@public("ch31.2", "identity experts: the round trip gives x · Σ weights")
def identity_round_trip(t: Trial) -> None:
    x = torch.arange(12, dtype=torch.float32).view(6, 2) + 1
    ids = torch.tensor([[3, 0], [1, 2], [2, 3], [0, 1], [3, 1], [2, 0]])
    w = torch.tensor([[0.5, 0.25], [1.0, 0.5], [0.25, 0.25], [0.75, 0.5], [0.5, 0.5], [1.0, 1.0]])
    case = tr("6 tokens, 4 experts, 2 ranks")
    dispatched = t.yours.dispatch(x, ids, 4, 2)
    rows, handle = dispatch_structure(dispatched, x, 2, case)
    try:
        got = t.yours.combine(rows, handle, w)
    except Exception:
        # combine may reject a wrong handle: a dispatch other than the reference's explains itself first.
        expect_dispatch(dispatched, t.ref.dispatch(x, ids, 4, 2), x, ids, 4, 2, case)
        raise
    want = x * w.sum(1, keepdim=True)
    out = expect_tensor(got, what=tr("the round trip"), shape=[6, 2], dtype=torch.float32)
    idx = first_wrong(out, want, atol=1e-5, rtol=1e-5)
    if idx is not None:
        tok = idx[0]
        raise CheckFailed(
            tr(
                "identity experts return their inputs, so combine(dispatch(x)) = x · Σ_j w: token {tok}: {x} · ({sum}) = {want}; "
                "yours: {got}",
                tok=tok,
                x=vec(x[tok]),
                sum=" + ".join(fmt(v) for v in w[tok].tolist()),
                want=vec(want[tok]),
                got=vec(out[tok]),
            ),
            tr(
                "your handle and your combine must agree: row i goes back to token src_token[i] with weight "
                "topk_weights[src_token[i], topk_slot[i]]"
            ),
            hint=combine_hint(out, rows, w, handle),
        )


@public("ch31.2", "a rank that receives nothing")
def empty_rank(t: Trial) -> None:
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    ids = torch.tensor([[1, 0], [0, 1]])
    want = t.ref.dispatch(x, ids, 4, 2)
    expect_dispatch(t.yours.dispatch(x, ids, 4, 2), want, x, ids, 4, 2, tr("every token on rank 0's experts"))


# -- ch31.3 ----------------------------------------------------------------------------------------------------------


@public("ch31.3", "figure instance: EPLB's worked example, 8 experts on 4 GPUs with 4 redundant slots")
def eplb_figure_instance(t: Trial) -> None:
    weight = torch.tensor([H3_LOADS])
    want = t.ref.rebalance_experts(weight, *H3_ARGS)
    glob = t.ref.rebalance_experts(weight, H3_ARGS[0], 1, 1, H3_ARGS[3])
    got = t.yours.rebalance_experts(weight, *H3_ARGS)
    case = tr("figure instance (EPLB's worked example)")
    phy2log, _, logcnt = placement_structure(got, weight, H3_ARGS[0], case)
    other_order = torch.equal(logcnt, want[2]) and packed_in_some_order(phy2log, logcnt, weight, want[0], H3_ARGS)
    t.figure(
        "ch31-eplb-load",
        loads=H3_LOADS,
        args=list(H3_ARGS),
        phy2log=phy2log[0],
        logcnt=logcnt[0],
        phy2log_expected=(phy2log if other_order else want[0])[0],
        logcnt_expected=want[2][0],
    )
    expect_placement(got, want, weight, H3_ARGS, case, glob)


@public("ch31.3", "balancedness before and after EPLB: 0.75 and 0.9375")
def balancedness_instance(t: Trial) -> None:
    weight = torch.tensor([H3_LOADS])
    want_phy, _, want_cnt = t.ref.rebalance_experts(weight, *H3_ARGS)
    before = static_loads(weight, H3_ARGS[3])[0].float()
    after = gpu_loads(weight, want_phy, want_cnt, H3_ARGS[3])[0].float()
    wants = [t.ref.balancedness(before), t.ref.balancedness(after)]
    gots = [t.yours.balancedness(before), t.yours.balancedness(after)]
    t.figure(
        "ch31-eplb-load",
        balancedness=[g if type(g) is float else None for g in gots],
        balancedness_expected=wants,
        balancedness_wrong=[type(g) is not float or balancedness_wrong(g, w) for g, w in zip(gots, wants)],
    )
    for got, loads, want, case in zip(gots, (before, after), wants, (tr("static placement"), tr("EPLB placement"))):
        expect_balancedness(got, loads, want, case)


@public("ch31.3", "the global policy when groups do not divide over nodes")
def eplb_global(t: Trial) -> None:
    run_placement_case(t, torch.tensor([H3_LOADS]), (12, 1, 2, 4), tr("one group, two nodes"))


@public("ch31.3", "no redundant slots: placement only")
def eplb_no_redundancy(t: Trial) -> None:
    run_placement_case(
        t,
        torch.tensor([[5.0, 80.0, 20.0, 41.0, 7.0, 66.0], [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]]),
        (6, 3, 1, 2),
        tr("6 experts in 6 slots, 2 layers"),
    )


@public("ch31.3", "integer token counts with equal loads: any order of equal groups (step 1), the lower index on a tie (step 2)")
def eplb_equal_loads(t: Trial) -> None:
    # Real loads are token counts, so loads tie. Step 1: the groups of 2 experts hold 30, 30, 20 and 10 tokens; EPLB
    # sorts them with an unstable sort, so either order of the two 30s is EPLB's, and each puts other groups together.
    # Step 2: one node, loads 40, 20, 20, 10 and 2 spare slots: expert 0 takes the first (40); then 40 / 2, 20 and
    # 20 tie, and EPLB's max takes the first maximum, expert 0 again.
    run_placement_case(t, torch.tensor([[10.0, 20.0, 30.0, 0.0, 12.0, 8.0, 4.0, 6.0]]), (8, 4, 2, 4), tr("equal group loads, 1 layer"))
    run_placement_case(t, torch.tensor([[40.0, 20.0, 20.0, 10.0]]), (6, 1, 1, 2), tr("a tie of load / count, 1 layer"))


@public("ch31.3", "balancedness over layers is Σ mean / Σ max")
def balancedness_layers(t: Trial) -> None:
    loads = torch.tensor([[100.0, 60.0, 90.0, 50.0], [10.0, 10.0, 10.0, 30.0]])
    expect_balancedness(t.yours.balancedness(loads), loads, t.ref.balancedness(loads), tr("two layers"))
    zeros = torch.zeros(3)
    expect_balancedness(t.yours.balancedness(zeros), zeros, t.ref.balancedness(zeros), tr("no load at all"))


# -- ch31.4 ----------------------------------------------------------------------------------------------------------


@public("ch31.4", "figure instance: a window of 4 passes, 6 slots of 4 experts, the cursor at row 1")
def window_figure_instance(t: Trial) -> None:
    window, step, load_pass, phy2log = (torch.tensor(W4_WINDOW), W4_STEP, torch.tensor(W4_PASS), torch.tensor(W4_PHY2LOG))
    want = t.ref.record_expert_load(window, step, load_pass, phy2log, W4_EXPERTS)
    got = t.yours.record_expert_load(window, step, load_pass, phy2log, W4_EXPERTS)
    case = tr("figure instance")
    mine = window_structure(got, window, W4_EXPERTS, case)
    t.figure(
        "ch31-eplb-window",
        window=window,
        step=step,
        load_pass=load_pass,
        phy2log=phy2log,
        num_experts=W4_EXPERTS,
        yours=list(mine),
        expected=list(want),
        wrong=[wrong_mask(mine[0], want[0]), mine[1] != want[1], wrong_mask(mine[2], want[2])],
    )
    expect_window(got, want, window, step, load_pass, phy2log, W4_EXPERTS, case)


@public("ch31.4", "the cursor wraps from the last row back to 0")
def window_wraps(t: Trial) -> None:
    window = torch.tensor([[[3, 1, 4], [1, 5, 9]], [[2, 6, 5], [3, 5, 8]], [[9, 7, 9], [3, 2, 3]]])
    load_pass, phy2log = torch.tensor([[8, 4, 6], [2, 6, 4]]), torch.tensor([[0, 1, 0], [1, 0, 1]])
    run_window_case(t, window, 2, load_pass, phy2log, 2, tr("a full window of 3 passes, 2 layers, step 2 (the last row)"))


@public("ch31.4", "seven passes through a window of three, from an empty window")
def window_trace(t: Trial) -> None:
    phy2log = torch.tensor([[0, 1, 2, 0], [2, 0, 1, 1]])
    passes = [
        [[4, 0, 2, 3], [1, 5, 2, 0]],
        [[6, 1, 0, 5], [0, 3, 3, 2]],
        [[2, 2, 2, 2], [4, 0, 1, 1]],
        [[9, 0, 1, 7], [2, 2, 0, 6]],
        [[0, 4, 4, 0], [5, 1, 2, 2]],
        [[3, 3, 0, 1], [0, 0, 7, 1]],
        [[5, 0, 6, 2], [3, 4, 0, 0]],
    ]
    run_window_trace(
        t, torch.zeros(3, 2, 4, dtype=torch.int64), 0, [torch.tensor(p) for p in passes], phy2log, 3, tr("2 layers, 4 slots of 3 experts")
    )


# -- helpers: route_topk ---------------------------------------------------------------------------------------------


def expect_routing(got, logits: torch.Tensor, k: int, renormalize: bool, want: tuple, case: str):
    N = logits.shape[0]
    if not isinstance(got, tuple) or len(got) != 2:
        raise CheckFailed(tr("{case}: expected (topk_ids, topk_weights); yours: {got}", case=case, got=describe(got)))
    ids = expect_tensor(got[0], what=f"{case}: topk_ids", shape=[N, k], dtype=torch.int64)
    w = expect_tensor(got[1], what=f"{case}: topk_weights", shape=[N, k], dtype=torch.float32)
    want_ids, want_w = want
    bad = first_wrong(ids, want_ids)
    if bad is None:
        bad = first_wrong(w, want_w, atol=ATOL, rtol=RTOL)
    if bad is None:
        return ids, w
    t = bad[0]
    p = logits[t].float().softmax(-1)
    fields = dict(case=case, t=t, logits=vec(logits[t]), k=k, p=vec(p), experts=want_ids[t].tolist(), weights=vec(want_w[t]))
    lines = [
        tr("{case}: token {t}, logits {logits}, k={k}, renormalize={renormalize}", renormalize=renormalize, **fields),
        tr(
            "p = softmax(logits) = {p}; the {k} largest (ties: lower id first) are experts {experts} with weights {weights} "
            "(divided by their sum)",
            **fields,
        )
        if renormalize
        else tr("p = softmax(logits) = {p}; the {k} largest (ties: lower id first) are experts {experts} with weights {weights}", **fields),
        tr("yours: experts {experts}, weights {weights}", experts=ids[t].tolist(), weights=vec(w[t])),
    ]
    hint = ""
    if ids[t].tolist() == want_ids[t].flip(0).tolist() and k > 1 and p[ids[t][0]] < p[ids[t][-1]]:
        hint = M.ascending_order
    elif sorted(ids[t].tolist()) == sorted(want_ids[t].tolist()) or set(ids[t].tolist()) <= set(
        torch.nonzero(p >= p[want_ids[t]].min()).flatten().tolist()
    ):
        if not torch.equal(ids[t], want_ids[t]):
            hint = M.ties_high
        elif torch.allclose(w[t], p[ids[t]], atol=1e-6) and renormalize:
            hint = M.no_renormalize
        elif torch.allclose(w[t], p[ids[t]] / p[ids[t]].sum(), atol=1e-6) and not renormalize:
            hint = M.always_renormalize
        elif torch.allclose(w[t], logits[t][ids[t]].float(), atol=1e-6) or (
            renormalize and torch.allclose(w[t], logits[t][ids[t]].float() / logits[t][ids[t]].float().sum(), atol=1e-6, rtol=1e-5)
        ):
            hint = M.logit_weights  # the logits themselves, or divided by their sum
    raise CheckFailed(*lines, hint=hint)


def run_routing_case(t: Trial, logits: torch.Tensor, k: int, renormalize: bool, case: str):
    got = t.yours.route_topk(logits, k, renormalize=renormalize)
    return expect_routing(got, logits, k, renormalize, t.ref.route_topk(logits, k, renormalize=renormalize), case)


# -- helpers: dispatch and combine -----------------------------------------------------------------------------------


def g3_instance() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.tensor(G3_X), torch.tensor(G3_IDS), torch.tensor(G3_WEIGHTS)


def scaled_experts(per_rank: list[torch.Tensor], handle: dict) -> list[torch.Tensor]:
    """Expert e multiplies its rows by (e + 1): the outputs each rank returns, row for row."""
    scale = (handle["expert"] + 1).to(torch.float32)[:, None]
    rows = torch.cat(per_rank) if per_rank else torch.zeros(0)
    out = (rows.float() * scale).to(rows.dtype)
    return list(out.split(handle["rows_per_rank"].tolist()))


def dispatch_structure(got, x: torch.Tensor, R: int, case: str) -> tuple[list, dict]:
    if not isinstance(got, tuple) or len(got) != 2:
        raise CheckFailed(tr("{case}: expected (per_rank_inputs, handle); yours: {got}", case=case, got=describe(got)))
    per_rank, handle = got
    if not isinstance(per_rank, (list, tuple)) or len(per_rank) != R:
        raise CheckFailed(
            tr(
                "{case}: expected per_rank_inputs as a list of {R} tensors, one per rank; yours: {got}",
                case=case,
                R=R,
                got=describe(per_rank),
            )
        )
    for r, rows in enumerate(per_rank):
        if not isinstance(rows, torch.Tensor) or rows.dim() != 2 or rows.shape[1] != x.shape[1] or rows.dtype != x.dtype:
            raise CheckFailed(
                tr(
                    "{case}: expected rank {r}'s rows as a {dtype} tensor [n_{r}, {H}]; yours: {got}",
                    case=case,
                    r=r,
                    dtype=str(x.dtype).removeprefix("torch."),
                    H=x.shape[1],
                    got=describe(rows),
                )
            )
    if not isinstance(handle, dict):
        raise CheckFailed(
            tr(
                "{case}: expected the handle as a dict of tensors {keys}; yours: {got}",
                case=case,
                keys=list(HANDLE_KEYS),
                got=describe(handle),
            )
        )
    for key in HANDLE_KEYS:
        if key not in handle or not isinstance(handle[key], torch.Tensor) or handle[key].dtype != torch.int64 or handle[key].dim() != 1:
            raise CheckFailed(
                tr("{case}: the handle needs {key!r} as a 1-D int64 tensor; yours: {got}", case=case, key=key, got=describe(handle[key]))
                if key in handle
                else tr("{case}: the handle needs {key!r} as a 1-D int64 tensor; yours has none", case=case, key=key)
            )
    return list(per_rank), handle


def rows_text(handle: dict, lo: int, hi: int) -> str:
    return ", ".join(f"T{s}·e{e}" for s, e in zip(handle["src_token"][lo:hi].tolist(), handle["expert"][lo:hi].tolist()))


def expect_dispatch(got, want: tuple, x: torch.Tensor, ids: torch.Tensor, E: int, R: int, case: str):
    """Require the student's rows and handle to equal the reference's, explaining the first difference."""
    per_rank, handle = dispatch_structure(got, x, R, case)
    want_rows, want_h = want
    counts = want_h["rows_per_rank"].tolist()
    inputs = tr(
        "{case}: {N} tokens, top-{k}, {E} experts on {R} ranks ({per} per rank)",
        case=case,
        N=x.shape[0],
        k=ids.shape[1],
        E=E,
        R=R,
        per=E // R,
    )
    for key in ("rows_per_rank", "tokens_per_expert"):
        if handle[key].tolist() != want_h[key].tolist():
            dedup = [int(((ids // (E // R)) == r).any(dim=1).sum()) for r in range(R)]
            raise CheckFailed(
                inputs,
                tr(
                    "handle[{key!r}] = {want}: one row per (token, expert) pair; yours: {got}",
                    key=key,
                    want=want_h[key].tolist(),
                    got=handle[key].tolist(),
                ),
                hint=M.dedup_per_rank if key == "rows_per_rank" and handle[key].tolist() == dedup else "",
            )
    for key in ("src_token", "topk_slot", "expert"):
        if handle[key].shape != want_h[key].shape:
            raise CheckFailed(
                inputs,
                tr(
                    "handle[{key!r}] has one entry per row, {want}; yours: {got}",
                    key=key,
                    want=want_h[key].numel(),
                    got=handle[key].numel(),
                ),
            )
    start = 0
    for r in range(R):
        lo, hi = start, start + counts[r]
        start = hi
        for key in ("expert", "src_token", "topk_slot"):
            idx = first_wrong(handle[key][lo:hi], want_h[key][lo:hi])
            if idx is None:
                continue
            i = lo + idx[0]
            hint = ""
            if key == "expert" and handle["expert"][lo:hi].tolist() == (want_h["expert"][lo:hi] % (E // R)).tolist():
                hint = M.local_expert_ids
            elif sorted(zip(handle["src_token"][lo:hi].tolist(), handle["topk_slot"][lo:hi].tolist())) == list(
                zip(handle["src_token"][lo:hi].tolist(), handle["topk_slot"][lo:hi].tolist())
            ):
                hint = M.by_token
            raise CheckFailed(
                inputs,
                tr("rank {r} should receive, grouped by expert then token: {rows}", r=r, rows=rows_text(want_h, lo, hi)),
                tr(
                    "row {i} (rank {r}'s row {j}): handle[{key!r}] = {want}; yours: {got} (your rank {r}: {rows})",
                    i=i,
                    r=r,
                    j=i - lo,
                    key=key,
                    want=int(want_h[key][i]),
                    got=int(handle[key][i]),
                    rows=rows_text(handle, lo, hi),
                ),
                hint=hint,
            )
        idx = first_wrong(per_rank[r], want_rows[r])
        if idx is not None:
            j = idx[0]
            src = int(want_h["src_token"][lo + j])
            raise CheckFailed(
                inputs,
                tr(
                    "rank {r}'s row {j} is a copy of token {src}'s hidden row x[{src}] = {want}; yours: {got}",
                    r=r,
                    j=j,
                    src=src,
                    want=vec(x[src]),
                    got=vec(per_rank[r][j]),
                ),
            )
    return per_rank, handle


def expect_combined(
    got, want: torch.Tensor, outputs: list, weights: torch.Tensor, handle: dict, case: str, scale_note: str = ""
) -> torch.Tensor:
    N, k = weights.shape
    H = want.shape[1]
    if isinstance(got, torch.Tensor) and got.dim() == 2 and got.shape[0] == N * k != N:
        raise CheckFailed(
            tr("{case}: expected one row per token, [{N}, {H}]; yours: {got}", case=case, N=N, H=H, got=describe(got)), hint=M.concatenated
        )
    out = expect_tensor(got, what=tr("{case}: the combined output", case=case), shape=[N, H], dtype=want.dtype)
    idx = first_wrong(out, want, atol=COMBINE_TOL, rtol=COMBINE_TOL)
    if idx is None:
        return out
    tok = idx[0]
    rows = [i for i, s in enumerate(handle["src_token"].tolist()) if s == tok]
    terms = " + ".join(
        tr("{w}·y(row {i}, e{e})", w=fmt(float(weights[tok, handle["topk_slot"][i]])), i=i, e=int(handle["expert"][i]))
        for i in sorted(rows, key=lambda i: int(handle["topk_slot"][i]))
    )
    raise CheckFailed(
        tr(
            "{case}: out[{tok}] = Σ_j topk_weights[{tok}, j] · its expert output = {terms}{note} = {want}; yours: {got}",
            case=case,
            tok=tok,
            terms=terms,
            note=scale_note,
            want=vec(want[tok]),
            got=vec(out[tok]),
        ),
        hint=combine_hint(out, outputs, weights, handle),
    )


def combine_hint(out: torch.Tensor, outputs: list, weights: torch.Tensor, handle: dict) -> str:
    """The misconception a wrong combine most likely comes from ('' when none fits)."""
    y = torch.cat(outputs).double()
    src = handle["src_token"]
    if len(src) != len(y) or len(src) != weights.numel() or (len(src) and (int(src.min()) < 0 or int(src.max()) >= out.shape[0])):
        return ""

    def summed(row_weights: torch.Tensor) -> torch.Tensor:
        return torch.zeros(out.shape, dtype=torch.float64).index_add_(0, src, y * row_weights[:, None])

    close = lambda alt: torch.allclose(out.double(), alt, atol=COMBINE_TOL, rtol=COMBINE_TOL)
    if y.shape == out.shape and close(y):
        return M.concatenated  # the ranks' rows as they came back (top-1: one per token, in rank order)
    if close(summed(torch.ones(len(src), dtype=torch.float64))):
        return M.unweighted
    if close(summed(weights.double().reshape(-1))):
        return M.weights_in_row_order
    return ""


def run_combine_case(t: Trial, per_rank_out: list, handle: dict, weights: torch.Tensor, case: str, scale_note: str = "") -> torch.Tensor:
    got = t.yours.combine(per_rank_out, handle, weights)
    want = t.ref.combine(per_rank_out, handle, weights)
    return expect_combined(got, want, per_rank_out, weights, handle, case, scale_note)


# -- helpers: rebalance_experts and balancedness ---------------------------------------------------------------------


def gpu_loads(weight: torch.Tensor, phy2log: torch.Tensor, logcnt: torch.Tensor, num_gpus: int) -> torch.Tensor:
    """[L, G] load per GPU: each slot carries its expert's load / replica count."""
    per_replica = (weight.double() / logcnt.double()).gather(1, phy2log)
    return per_replica.view(weight.shape[0], num_gpus, -1).sum(-1)


def static_loads(weight: torch.Tensor, num_gpus: int) -> torch.Tensor:
    """[L, G] load per GPU without EPLB: E/G contiguous experts on each GPU, no replicas."""
    return weight.double().view(weight.shape[0], num_gpus, -1).sum(-1)


def placement_structure(got, weight: torch.Tensor, num_replicas: int, case: str):
    """(phy2log, log2phy, logcnt) as a tuple with phy2log [L, num_replicas] and logcnt [L, E] consistent."""
    L, E = weight.shape
    if not isinstance(got, tuple) or len(got) != 3:
        raise CheckFailed(tr("{case}: expected (phy2log, log2phy, logcnt); yours: {got}", case=case, got=describe(got)))
    phy2log = expect_tensor(got[0], what=f"{case}: phy2log", shape=[L, num_replicas], dtype=torch.int64)
    logcnt = expect_tensor(got[2], what=f"{case}: logcnt", shape=[L, E], dtype=torch.int64)
    if int(phy2log.min()) < 0 or int(phy2log.max()) >= E:
        raise CheckFailed(
            tr(
                "{case}: phy2log holds logical expert ids 0 … {last}; yours has {low} … {high}",
                case=case,
                last=E - 1,
                low=int(phy2log.min()),
                high=int(phy2log.max()),
            )
        )
    for layer in range(L):
        counts = torch.bincount(phy2log[layer], minlength=E)
        if not torch.equal(counts, logcnt[layer]):
            e = int((counts != logcnt[layer]).nonzero()[0])
            raise CheckFailed(
                tr(
                    "{case}: layer {layer}: your phy2log places expert {e} in {n} slots but your logcnt says {count}",
                    case=case,
                    layer=layer,
                    e=e,
                    n=int(counts[e]),
                    count=int(logcnt[layer, e]),
                )
            )
    return phy2log, got[1], logcnt


def expect_log2phy(got, phy2log: torch.Tensor, E: int, width: int, case: str) -> torch.Tensor:
    """log2phy [L, E, X]: each expert's slots (any order among its replicas), then −1 padding."""
    L = phy2log.shape[0]
    if not isinstance(got, torch.Tensor) or got.dtype != torch.int64 or list(got.shape) != [L, E, width]:
        raise CheckFailed(
            tr(
                "{case}: expected log2phy as an int64 tensor [L, E, X] = [{L}, {E}, {X}], X being the largest replica count over "
                "all layers; yours: {got}",
                case=case,
                L=L,
                E=E,
                X=width,
                got=describe(got),
            )
        )
    log2phy = got
    for layer in range(L):
        for e in range(E):
            slots = sorted((phy2log[layer] == e).nonzero().flatten().tolist())
            row = log2phy[layer, e].tolist()
            if sorted(s for s in row if s >= 0) != slots or row[len(slots) :] != [-1] * (width - len(slots)):
                raise CheckFailed(
                    tr(
                        "{case}: layer {layer}: expert {e} is in slots {slots} of your phy2log; your log2phy[{layer}, {e}] = {row} "
                        "(its slots, then −1 padding)",
                        case=case,
                        layer=layer,
                        e=e,
                        slots=slots,
                        row=row,
                    )
                )
    return log2phy


def expect_placement(got, want: tuple, weight: torch.Tensor, args: tuple, case: str, global_hint=None, ties_high=None):
    """Require the student's EPLB placement to equal the reference's, in the terms of EPLB's three steps."""
    num_replicas, num_groups, num_nodes, num_gpus = args
    w_phy, _, w_cnt = want
    phy2log, log2phy, logcnt = placement_structure(got, weight, num_replicas, case)
    policy = "hierarchical" if num_groups % num_nodes == 0 else "global"
    fields = dict(case=case, E=weight.shape[1], groups=num_groups, slots=num_replicas, gpus=num_gpus, nodes=num_nodes)
    inputs = (
        tr("{case}: {E} experts in {groups} groups, {slots} slots on {gpus} GPUs in {nodes} nodes (hierarchical policy)", **fields)
        if policy == "hierarchical"
        else tr("{case}: {E} experts in {groups} groups, {slots} slots on {gpus} GPUs in {nodes} nodes (global policy)", **fields)
    )
    if policy == "hierarchical" and num_nodes > 1:
        global_phy = global_hint[0] if global_hint is not None else None
        explain_nodes(phy2log, w_phy, weight, num_groups, num_nodes, inputs, global_phy)
    idx = first_wrong(logcnt, w_cnt)
    if idx is not None:
        layer, e = idx
        hint = ""
        if global_hint is not None and torch.equal(logcnt, global_hint[2]) and policy == "hierarchical":
            hint = M.always_global.format(groups=num_groups, nodes=num_nodes)
        elif ties_high is not None and torch.equal(logcnt, ties_high):
            hint = M.step2_tie_high
        elif (logcnt[layer] > 1).sum() < (w_cnt[layer] > 1).sum():
            hint = M.raw_load
        raise CheckFailed(
            inputs,
            tr(
                "layer {layer}, loads {loads}: expert {e} gets {want} replica(s) (step 2: spare slots go, one by one, to the "
                "largest load / count); yours: {got}",
                layer=layer,
                loads=vec(weight[layer]),
                e=e,
                want=int(w_cnt[layer, e]),
                got=int(logcnt[layer, e]),
            ),
            tr("expected logcnt {want}; yours {got}", want=vec(w_cnt[layer], 16), got=vec(logcnt[layer], 16)),
            hint=hint,
        )
    loads, w_loads = gpu_loads(weight, phy2log, logcnt, num_gpus), gpu_loads(weight, w_phy, w_cnt, num_gpus)
    idx = first_wrong(loads, w_loads, atol=LOAD_ATOL, rtol=LOAD_RTOL)
    per_gpu = num_replicas // num_gpus
    if idx is not None:
        layer, g = idx
        mine = phy2log[layer, g * per_gpu : (g + 1) * per_gpu].tolist()
        theirs = w_phy[layer, g * per_gpu : (g + 1) * per_gpu].tolist()
        same_loads = torch.allclose(loads[layer].sort().values, w_loads[layer].sort().values, rtol=LOAD_RTOL)
        raise CheckFailed(
            inputs,
            tr(
                "layer {layer}: GPU {g} (slots {first}–{last}) should carry experts {want} = {want_load}; yours: {got} = {got_load}",
                layer=layer,
                g=g,
                first=g * per_gpu,
                last=(g + 1) * per_gpu - 1,
                want=theirs,
                want_load=fmt(float(w_loads[layer, g])),
                got=mine,
                got_load=fmt(float(loads[layer, g])),
            ),
            tr("expected GPU loads {want}; yours {got}", want=vec(w_loads[layer]), got=vec(loads[layer])),
            hint=M.packing_order if same_loads else "",
        )
    idx = first_wrong(phy2log, w_phy)
    if idx is not None and not packed_in_some_order(phy2log, logcnt, weight, w_phy, args):
        layer, s = idx
        raise CheckFailed(
            inputs,
            tr(
                "layer {layer}: slot {s} (GPU {g}) holds expert {want}; yours: {got} (your GPU loads are right; the order inside a "
                "GPU is the order in which balanced packing gave it its replicas)",
                layer=layer,
                s=s,
                g=s // per_gpu,
                want=int(w_phy[layer, s]),
                got=int(phy2log[layer, s]),
            ),
        )
    return phy2log, expect_log2phy(log2phy, phy2log, weight.shape[1], int(w_cnt.max()), case), logcnt


def packed_in_some_order(phy2log: torch.Tensor, logcnt: torch.Tensor, weight: torch.Tensor, w_phy: torch.Tensor, args: tuple) -> bool:
    """Whether a placement differs from the reference's only in the order step 3 took replicas of equal load (EPLB
    sorts them with an unstable sort): every node holds the reference's replicas, and every GPU's slots hold them in
    an order balanced packing can give, each next replica (to the lightest GPU with room, the lower GPU on equal
    totals) being one of the heaviest left. Loads and running totals in float32, as in EPLB."""
    num_replicas, num_groups, num_nodes, num_gpus = args
    if num_groups % num_nodes:
        num_nodes = 1
    per_node, gpus, per_gpu = num_replicas // num_nodes, num_gpus // num_nodes, num_replicas // num_gpus
    if per_gpu == 1 or phy2log.shape != w_phy.shape:
        return False  # one replica per GPU: no sort, the identity
    share = (weight.float() / logcnt.float()).gather(1, phy2log)
    for layer in range(phy2log.shape[0]):
        for n in range(num_nodes):
            nodes = slice(n * per_node, (n + 1) * per_node)
            if sorted(phy2log[layer, nodes].tolist()) != sorted(w_phy[layer, nodes].tolist()):
                return False
            loads = share[layer, nodes].view(gpus, per_gpu)
            totals, counts = torch.zeros(gpus, dtype=torch.float32), [0] * gpus
            for heaviest in sorted(loads.flatten().tolist(), reverse=True):
                g = min((g for g in range(gpus) if counts[g] < per_gpu), key=lambda g: float(totals[g]))
                if float(loads[g, counts[g]]) != heaviest:
                    return False
                totals[g] += loads[g, counts[g]]
                counts[g] += 1
    return True


def explain_nodes(
    phy2log: torch.Tensor,
    w_phy: torch.Tensor,
    weight: torch.Tensor,
    num_groups: int,
    num_nodes: int,
    inputs: str,
    global_phy: torch.Tensor | None = None,
) -> None:
    """Step 1: each node must hold the experts of the groups balanced packing gives it (`global_phy`: the global
    policy's placement, which a student who never packs groups onto nodes gives)."""
    L, E = weight.shape
    gs, per_node = E // num_groups, phy2log.shape[1] // num_nodes
    for layer in range(L):
        groups = lambda phy, n: sorted({e // gs for e in phy[layer, n * per_node : (n + 1) * per_node].tolist()})
        for n in range(num_nodes):
            mine, want = groups(phy2log, n), groups(w_phy, n)
            if mine != want:
                loads = weight[layer].double().view(num_groups, gs).sum(1)
                order = sorted(range(num_groups), key=lambda g: -float(loads[g]))
                raise CheckFailed(
                    inputs,
                    tr(
                        "layer {layer}: step 1 packs the groups onto the nodes, heaviest first, each to the lightest node with "
                        "room: group loads {loads}",
                        layer=layer,
                        loads=", ".join(f"g{g} {fmt(float(loads[g]))}" for g in order),
                    ),
                    tr("node {n} should hold groups {want}; yours holds experts of groups {got}", n=n, want=want, got=mine),
                    hint=M.always_global.format(groups=num_groups, nodes=num_nodes)
                    if global_phy is not None and torch.equal(phy2log, global_phy)
                    else M.round_robin
                    if num_groups // num_nodes > 1
                    else M.node_identity,
                )


def run_placement_case(t: Trial, weight: torch.Tensor, args: tuple, case: str):
    got = t.yours.rebalance_experts(weight, *args)
    want = t.ref.rebalance_experts(weight, *args)
    glob = t.ref.rebalance_experts(weight, args[0], 1, 1, args[3])
    orders, high = t.ref.drive(step1_orders, weight, args), t.ref.drive(step2_ties_high, weight, args)
    return expect_placement(got, closest_placement(got, want, orders, weight, args), weight, args, case, glob, high)


def closest_placement(got, want: tuple, orders: list, weight: torch.Tensor, args: tuple) -> tuple:
    """The placement to hold the student's to: in each layer, the first of EPLB's placements for an order of equal
    group loads (`step1_orders`' answer) that theirs equals (up to step 3's order of equal replicas), else the
    reference's. Only (phy2log, logcnt) are used, and log2phy's width follows logcnt."""
    try:
        phy2log, _, logcnt = placement_structure(got, weight, args[0], "")
    except CheckFailed:
        return want
    phys, cnts = list(want[0]), list(want[2])
    for layer, candidates in enumerate(orders):
        for w_phy, w_cnt in candidates:
            rows = (phy2log[layer : layer + 1], logcnt[layer : layer + 1])
            if torch.equal(rows[1][0], w_cnt) and (
                torch.equal(rows[0][0], w_phy) or packed_in_some_order(*rows, weight[layer : layer + 1], w_phy[None], args)
            ):
                phys[layer], cnts[layer] = w_phy, w_cnt
                break
    return torch.stack(phys), None, torch.stack(cnts)


def balancedness_wrong(got: float, want: float) -> bool:
    """The check's verdict on a balancedness: off by more than 1e-9 (relative, for values above 1)."""
    return abs(got - want) > 1e-9 * max(1.0, abs(want))


def expect_balancedness(got, loads: torch.Tensor, want: float, case: str) -> float:
    if type(got) is not float:
        raise CheckFailed(tr("{case}: expected balancedness as a Python float; yours: {got}", case=case, got=describe(got)))
    if balancedness_wrong(got, want):
        rows = loads.double().reshape(-1, loads.shape[-1])
        mean, top = rows.mean(1).sum().item(), rows.max(1).values.sum().item()
        hint = ""
        if want and abs(got - 1 / want) < 1e-6:
            hint = M.max_over_mean
        elif rows.shape[0] > 1 and abs(got - (rows.mean(1) / rows.max(1).values).mean().item()) < 1e-9:
            hint = M.ratio_mean
        shown = vec(loads, 16) if loads.dim() == 1 else "[" + ", ".join(vec(row) for row in loads) + "]"
        raise CheckFailed(
            tr(
                "{case}: loads {loads}: Σ_layers mean = {mean}, Σ_layers max = {max}, so balancedness = {want}; yours: {got}",
                case=case,
                loads=shown,
                mean=fmt(mean),
                max=fmt(top),
                want=fmt(want, 6),
                got=fmt(got, 6),
            ),
            hint=hint,
        )
    return got


# -- helpers: record_expert_load -------------------------------------------------------------------------------------


def per_expert(per_slot: torch.Tensor, phy2log: torch.Tensor, num_experts: int) -> torch.Tensor:
    """[L, E]: each slot's count added to its logical expert."""
    return torch.zeros(per_slot.shape[0], num_experts, dtype=torch.int64).scatter_add_(1, phy2log, per_slot.long())


def window_structure(got, window: torch.Tensor, num_experts: int, case: str) -> tuple[torch.Tensor, int, torch.Tensor]:
    """(window, next_step, load) as a tuple of an int64 [W, L, P] tensor, an int and an int64 [L, E] tensor."""
    W, L, P = window.shape
    if not isinstance(got, tuple) or len(got) != 3:
        raise CheckFailed(tr("{case}: expected (window, next_step, load); yours: {got}", case=case, got=describe(got)))
    mine = expect_tensor(got[0], what=tr("{case}: the window", case=case), shape=[W, L, P], dtype=torch.int64)
    if type(got[1]) is not int:
        raise CheckFailed(tr("{case}: expected next_step as a Python int; yours: {got}", case=case, got=describe(got[1])))
    if isinstance(got[2], torch.Tensor) and list(got[2].shape) == [L, P] and P != num_experts:
        raise CheckFailed(
            tr(
                "{case}: expected the load per logical expert, [L, E] = [{L}, {E}]; yours: {got}, one entry per slot",
                case=case,
                L=L,
                E=num_experts,
                got=describe(got[2]),
            ),
            hint=M.physical_loads,
        )
    load = expect_tensor(got[2], what=tr("{case}: the load", case=case), shape=[L, num_experts], dtype=torch.int64)
    return mine, got[1], load


def expect_window(
    got, want: tuple, window: torch.Tensor, step: int, load_pass: torch.Tensor, phy2log: torch.Tensor, num_experts: int, case: str
) -> tuple[torch.Tensor, int, torch.Tensor]:
    """Require the student's (window, next_step, load) to equal the reference's, explaining the first difference."""
    mine, next_step, load = window_structure(got, window, num_experts, case)
    w_window, w_step, w_load = want
    W = window.shape[0]
    inputs = (
        tr("{case}: a window of {W} passes, cursor at row {step}, this pass {load}", case=case, W=W, step=step, load=vec(load_pass, 12))
        if W != 1
        else tr("{case}: a window of 1 pass, cursor at row {step}, this pass {load}", case=case, step=step, load=vec(load_pass, 12))
    )
    idx = first_wrong(mine, w_window)
    if idx is not None:
        row, layer, p = idx
        shifted = torch.cat([window[1:], load_pass[None]])
        raise CheckFailed(
            inputs,
            tr(
                "row {step} (the oldest pass) becomes this pass's counts and the other rows stay: window[{row}, {layer}, {p}] = {want}; "
                "yours: {got}",
                step=step,
                row=row,
                layer=layer,
                p=p,
                want=int(w_window[row, layer, p]),
                got=int(mine[row, layer, p]),
            ),
            hint=M.shifted_window if torch.equal(mine, shifted) else "",
        )
    if next_step != w_step:
        raise CheckFailed(
            inputs,
            tr(
                "the cursor moves to the next row, back to 0 after row {last}: next_step = ({step} + 1) mod {W} = {want}; yours: {got}",
                last=W - 1,
                step=step,
                W=W,
                want=w_step,
                got=next_step,
            ),
            hint=M.not_wrapped if next_step == step + 1 == W else "",
        )
    idx = first_wrong(load, w_load)
    if idx is not None:
        layer, e = idx
        slots = (phy2log[layer] == e).nonzero().flatten().tolist()
        hint = ""
        if torch.equal(load, per_expert(load_pass, phy2log, num_experts)) and W > 1:
            hint = M.last_step_only
        elif torch.equal(load, w_load // W) or torch.equal(load, per_expert(w_window.sum(0) // W, phy2log, num_experts)):
            hint = M.window_mean
        raise CheckFailed(
            inputs,
            tr(
                "layer {layer}: expert {e} is in slots {slots}, so its load is the sum of those slots over all {W} rows of the new "
                "window = {want}; yours: {got}",
                layer=layer,
                e=e,
                slots=slots,
                W=W,
                want=int(w_load[layer, e]),
                got=int(load[layer, e]),
            ),
            tr("expected load {want}; yours {got}", want=vec(w_load[layer], 16), got=vec(load[layer], 16)),
            hint=hint,
        )
    return mine, next_step, load


def run_window_case(t: Trial, window: torch.Tensor, step: int, load_pass: torch.Tensor, phy2log: torch.Tensor, num_experts: int, case: str):
    got = t.yours.record_expert_load(window, step, load_pass, phy2log, num_experts)
    want = t.ref.record_expert_load(window, step, load_pass, phy2log, num_experts)
    return expect_window(got, want, window, step, load_pass, phy2log, num_experts, case)


def run_window_trace(
    t: Trial, window: torch.Tensor, step: int, passes: list[torch.Tensor], phy2log: torch.Tensor, num_experts: int, case: str
) -> None:
    """Feed the passes one by one, each call getting the window and cursor the previous one returned (yours to
    yours, the reference's to the reference); the first call that differs fails."""
    wants = []
    w_window, w_step = window, step
    for load_pass in passes:
        want = t.ref.record_expert_load(w_window, w_step, load_pass, phy2log, num_experts)
        wants.append(want)
        w_window, w_step = want[0], want[1]
    mine, my_step = window, step
    for i, (load_pass, want) in enumerate(zip(passes, wants)):
        if not (type(my_step) is int and 0 <= my_step < window.shape[0]):
            raise CheckFailed(
                tr(
                    "{case}: before pass {i} your cursor is {step}, outside the window's rows 0 … {last}",
                    case=case,
                    i=i,
                    step=my_step,
                    last=window.shape[0] - 1,
                ),
                hint=M.not_wrapped if my_step == window.shape[0] else "",
            )
        got = t.yours.record_expert_load(mine, my_step, load_pass, phy2log, num_experts)
        mine, my_step, _ = expect_window(
            got, want, mine, my_step, load_pass, phy2log, num_experts, tr("{case}, pass {i} of {n}", case=case, i=i, n=len(passes))
        )
