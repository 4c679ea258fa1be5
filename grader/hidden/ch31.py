"""Hidden checks of ch31 · mixture of experts across ranks: random routing, round trips, EPLB on random loads."""

from __future__ import annotations

import math

import torch

from grader.authoring import CheckFailed, Trial, describe, expect_tensor, first_wrong, hidden, vec
from grader.checks.ch31 import (
    COMBINE_TOL,
    M,
    combine_hint,
    dispatch_structure,
    expect_balancedness,
    expect_dispatch,
    run_combine_case,
    run_placement_case,
    run_routing_case,
    run_window_case,
    run_window_trace,
    scaled_experts,
)
from grader.hidden.ch31_models import ORDERS_LIMIT
from grader.i18n import tr

# -- ch31.1 ----------------------------------------------------------------------------------------------------------


@hidden("ch31.1", "random router logits")
def random_routes(t: Trial) -> None:
    for i in range(25):
        N, E = t.random.randint(1, 40), t.random.choice([2, 4, 8, 16, 64])
        k = t.random.randint(1, min(E, 8))
        logits = torch.randn(N, E, generator=t.rng) * t.random.choice([0.5, 2.0, 6.0])
        run_routing_case(
            t, logits, k, t.random.random() < 0.7, tr("random case {i} ({N} tokens, {E} experts, top-{k})", i=i, N=N, E=E, k=k)
        )


@hidden("ch31.1", "DeepSeek-V3's shape: 256 experts, top-8, bfloat16 logits")
def route_deepseek(t: Trial) -> None:
    logits = (torch.randn(64, 256, generator=t.rng) * 2).to(torch.bfloat16)
    run_routing_case(t, logits, 8, True, tr("64 tokens, 256 experts, top-8, bfloat16"))


@hidden("ch31.1", "many ties")
def route_many_ties(t: Trial) -> None:
    for i in range(10):
        E = t.random.choice([4, 6, 8])
        logits = torch.randint(0, 3, (12, E), generator=t.rng).float()
        run_routing_case(t, logits, t.random.randint(1, E), t.random.random() < 0.5, tr("integer logits {i}", i=i))


# -- ch31.2 ----------------------------------------------------------------------------------------------------------


@hidden("ch31.2", "random routing: rows and handle")
def random_dispatch(t: Trial) -> None:
    for i in range(15):
        R = t.random.choice([1, 2, 4, 8])
        E = R * t.random.choice([1, 2, 4])
        k = t.random.randint(1, min(E, 4))
        N, H = t.random.randint(0, 30), t.random.choice([1, 3, 8])
        x = torch.randn(N, H, generator=t.rng)
        ids = random_routing(t, N, E, k)
        expect_dispatch(t.yours.dispatch(x, ids, E, R), t.ref.dispatch(x, ids, E, R), x, ids, E, R, tr("random case {i}", i=i))


@hidden("ch31.2", "round trips through your dispatch and combine, checked against a dense MoE")
def random_round_trips(t: Trial) -> None:
    for i in range(12):
        R = t.random.choice([1, 2, 4])
        E = R * t.random.choice([1, 2, 3])
        k = t.random.randint(1, min(E, 3))
        N, H = t.random.randint(1, 25), t.random.choice([2, 4])
        x = torch.randn(N, H, generator=t.rng)
        ids = random_routing(t, N, E, k)
        w = torch.rand(N, k, generator=t.rng)
        mats = torch.randn(E, H, H, generator=t.rng)
        dispatched = t.yours.dispatch(x, ids, E, R)
        want = t.ref.dispatch(x, ids, E, R)
        rows, handle = dispatch_structure(dispatched, x, R, tr("round trip {i}", i=i))
        out_rows = [r @ mats[e].T for r, e in zip(torch.cat(rows).split(1), handle["expert"].clamp(0, E - 1).tolist())]
        outputs = list(torch.cat(out_rows).split(handle["rows_per_rank"].tolist())) if out_rows else [torch.zeros(0, H)] * R
        case = tr("round trip {i} ({N} tokens, {E} experts on {R} ranks, top-{k}; expert e computes x·W_eᵀ)", i=i, N=N, E=E, R=R, k=k)
        try:
            got = t.yours.combine(outputs, handle, w)
        except Exception:
            # combine may reject a wrong handle: a dispatch other than the reference's explains itself first.
            expect_dispatch(dispatched, want, x, ids, E, R, case)
            raise
        dense = sum((w[:, j : j + 1] * torch.einsum("nh,noh->no", x, mats[ids[:, j]]) for j in range(k)), torch.zeros(N, H))
        if isinstance(got, torch.Tensor) and got.dim() == 2 and got.shape[0] == N * k != N:
            raise CheckFailed(
                tr("{case}: expected one row per token, [{N}, {H}]; yours: {got}", case=case, N=N, H=H, got=describe(got)),
                hint=M.concatenated,
            )
        out = expect_tensor(got, what=tr("round trip {i}: the output", i=i), shape=[N, H], dtype=torch.float32)
        idx = first_wrong(out, dense, atol=COMBINE_TOL, rtol=COMBINE_TOL)
        if idx is not None:
            tok = idx[0]
            # A dispatch other than the reference's explains itself (with its mistake); else combine is at fault.
            expect_dispatch(dispatched, want, x, ids, E, R, case)
            raise CheckFailed(
                tr(
                    "{case}: token {tok} routes to experts {experts} with weights {weights}, so out[{tok}] = Σ_j w_j · x W_eᵀ = {want}; "
                    "yours: {got}",
                    case=case,
                    tok=tok,
                    experts=ids[tok].tolist(),
                    weights=vec(w[tok]),
                    want=vec(dense[tok]),
                    got=vec(out[tok]),
                ),
                hint=combine_hint(out, outputs, w, handle) or tr("your handle and your combine must agree on where each row came from"),
            )


@hidden("ch31.2", "combine alone on random expert outputs")
def random_combine(t: Trial) -> None:
    for i in range(10):
        R, k = t.random.choice([2, 4]), t.random.randint(1, 3)
        E, N, H = R * 2, t.random.randint(1, 20), 4
        ids = random_routing(t, N, E, k)
        rows, handle = t.ref.dispatch(torch.zeros(N, H), ids, E, R)
        outputs = [torch.randn(r.shape, generator=t.rng) for r in rows]
        run_combine_case(t, outputs, handle, torch.rand(N, k, generator=t.rng), tr("random case {i}", i=i))


@hidden("ch31.2", "bfloat16 rows, top-1, one rank")
def dispatch_edges(t: Trial) -> None:
    x = torch.randn(9, 8, generator=t.rng).to(torch.bfloat16)
    ids = random_routing(t, 9, 4, 1)
    want = t.ref.dispatch(x, ids, 4, 1)
    rows, handle = expect_dispatch(t.yours.dispatch(x, ids, 4, 1), want, x, ids, 4, 1, tr("bfloat16, top-1, R = 1"))
    outputs = scaled_experts(want[0], want[1])
    run_combine_case(t, outputs, want[1], torch.ones(9, 1), tr("bfloat16, top-1"), tr(" with y = (e + 1)·x"))


# -- ch31.3 ----------------------------------------------------------------------------------------------------------


@hidden("ch31.3", "random loads, hierarchical policy (some integer token counts, ties judged as EPLB decides them)")
def eplb_random_hierarchical(t: Trial) -> None:
    for i in range(12):
        E, args = random_shape(t, True)
        run_placement_case(t, random_loads(t, t.random.choice([1, 2]), E, args), args, tr("random case {i}", i=i))


@hidden("ch31.3", "random loads, global policy (some integer token counts, ties judged as EPLB decides them)")
def eplb_random_global(t: Trial) -> None:
    for i in range(10):
        E, args = random_shape(t, False)
        run_placement_case(t, random_loads(t, t.random.choice([1, 2]), E, args), args, tr("random case {i}", i=i))


@hidden("ch31.3", "DeepSeek-V3's shape: 256 experts in 8 groups, 288 slots on 32 GPUs in 4 nodes")
def eplb_deepseek(t: Trial) -> None:
    run_placement_case(t, random_loads(t, 2, 256), (288, 8, 4, 32), tr("256 experts, 2 layers"))


@hidden("ch31.3", "one slot per GPU and one group per node keep the identity")
def eplb_identity(t: Trial) -> None:
    run_placement_case(t, random_loads(t, 1, 4), (4, 4, 4, 4), tr("4 experts, 4 nodes, 4 GPUs"))
    run_placement_case(t, random_loads(t, 1, 8), (8, 4, 2, 8), tr("8 experts on 8 GPUs, one slot each"))


@hidden("ch31.3", "balancedness on random loads")
def balancedness_random(t: Trial) -> None:
    for i in range(12):
        shape = [t.random.randint(1, 16)] if t.random.random() < 0.5 else [t.random.randint(1, 4), t.random.randint(1, 16)]
        loads = torch.rand(shape, generator=t.rng) * 100
        if t.random.random() < 0.3:
            loads = loads.round()
        expect_balancedness(t.yours.balancedness(loads), loads, t.ref.balancedness(loads), tr("random loads {i}", i=i))


# -- ch31.4 ----------------------------------------------------------------------------------------------------------


@hidden("ch31.4", "random traces from an empty window, several layers and replicas")
def window_random_traces(t: Trial) -> None:
    for i in range(8):
        W, L, E = t.random.randint(2, 6), t.random.randint(1, 3), t.random.randint(2, 8)
        phy2log = random_placement(t, L, E, E + t.random.randint(0, 4))
        passes = [random_pass(t, phy2log.shape) for _ in range(t.random.randint(W + 1, 3 * W + 2))]
        run_window_trace(
            t,
            torch.zeros(W, *phy2log.shape, dtype=torch.int64),
            0,
            passes,
            phy2log,
            E,
            tr("random trace {i} (W = {W}, {L} layer(s), {P} slots of {E} experts)", i=i, W=W, L=L, P=phy2log.shape[1], E=E),
        )


@hidden("ch31.4", "random full windows, the cursor anywhere")
def window_random_cases(t: Trial) -> None:
    for i in range(12):
        W, L, E = t.random.randint(1, 8), t.random.randint(1, 4), t.random.randint(1, 10)
        phy2log = random_placement(t, L, E, E + t.random.randint(0, 6))
        window = torch.stack([random_pass(t, phy2log.shape) for _ in range(W)])
        run_window_case(t, window, t.random.randrange(W), random_pass(t, phy2log.shape), phy2log, E, tr("random case {i}", i=i))


@hidden("ch31.4", "a window of one pass, and DeepSeek-V3's 288 slots of 256 experts")
def window_edges(t: Trial) -> None:
    phy2log = random_placement(t, 2, 6, 8)
    run_window_trace(
        t,
        torch.zeros(1, 2, 8, dtype=torch.int64),
        0,
        [random_pass(t, (2, 8)) for _ in range(3)],
        phy2log,
        6,
        tr("W = 1: the window is the last pass"),
    )
    phy2log = random_placement(t, 2, 256, 288)
    window = torch.stack([random_pass(t, (2, 288), 4096) for _ in range(5)])
    run_window_case(t, window, 3, random_pass(t, (2, 288), 4096), phy2log, 256, tr("W = 5, 2 layers, 288 slots"))


# -- helpers: random routings, loads and shapes from the grading seed ------------------------------------------------


def random_routing(t: Trial, N: int, E: int, k: int) -> torch.Tensor:
    """int64 [N, k]: k distinct experts per token, skewed towards a few hot experts."""
    hot = torch.rand(E, generator=t.rng) ** 3 + 0.01
    return torch.multinomial(hot.expand(N, E), k, replacement=False, generator=t.rng) if N else torch.zeros(0, k, dtype=torch.int64)


def random_loads(t: Trial, L: int, E: int, args: tuple = ()) -> torch.Tensor:
    """Skewed loads, a few hot experts and the rest light: continuous, or (given the placement's `args`) at times
    integer token counts, as EPLB really gets, whose ties the checks judge by EPLB's rules (few enough equal group
    loads that every order of them is tried)."""
    kind = t.random.choice(["uniform", "skewed", "counts"] if args else ["uniform", "skewed"])
    if kind == "uniform":
        return torch.rand(L, E, generator=t.rng) * 1000
    if kind == "skewed":
        return (torch.rand(L, E, generator=t.rng) ** 4) * 5000 + torch.rand(L, E, generator=t.rng)
    for _ in range(50):
        counts = ((torch.rand(L, E, generator=t.rng) ** 3) * t.random.choice([8, 30, 200])).round()
        if few_step1_orders(counts, args):
            return counts
    return torch.rand(L, E, generator=t.rng) * 1000


def few_step1_orders(weight: torch.Tensor, args: tuple) -> bool:
    """Whether every layer's equal group loads allow at most ORDERS_LIMIT orders (`step1_orders` tries them all)."""
    _, num_groups, num_nodes, _ = args
    if num_groups % num_nodes or num_groups == num_nodes:
        return True
    loads = weight.float().view(weight.shape[0], num_groups, -1).sum(-1)
    for row in loads.tolist():
        sizes = [row.count(v) for v in set(row)]
        if math.prod(math.factorial(n) for n in sizes) > ORDERS_LIMIT:
            return False
    return True


def random_shape(t: Trial, hierarchical: bool) -> tuple[int, tuple]:
    """E and (num_replicas, num_groups, num_nodes, num_gpus); groups divide over nodes iff hierarchical."""
    nodes = t.random.choice([1, 2, 4] if hierarchical else [2, 4])
    gpus = nodes * t.random.choice([1, 2, 4])
    groups = nodes * t.random.choice([1, 2, 4]) if hierarchical else t.random.choice([1, 3, 5])
    E = groups * t.random.choice([1, 2, 4])
    replicas = gpus * (-(-E // gpus)) + gpus * t.random.choice([0, 1, 2])
    return E, (replicas, groups, nodes, gpus)


def random_placement(t: Trial, L: int, E: int, P: int) -> torch.Tensor:
    """int64 [L, P]: every logical expert in at least one slot, the P − E spare slots to random experts, shuffled."""
    rows = []
    for _ in range(L):
        ids = torch.cat([torch.arange(E), torch.randint(0, E, (P - E,), generator=t.rng)])
        rows.append(ids[torch.randperm(P, generator=t.rng)])
    return torch.stack(rows)


def random_pass(t: Trial, shape, most: int = 60) -> torch.Tensor:
    """int64 token counts of one pass, skewed: a few hot slots."""
    return (torch.rand(shape, generator=t.rng) ** 3 * most).long()
