"""Public checks of ch32 · speculative decoding and determinism, and the messages they share with the hidden ones.

What an explanation compares with beyond the reference's answers (each position's verdict and race, what a classic
mistake emits, the survivals, the float64 product and its rounding bound) comes from the hidden side's models
(`verify_models`, `count_models`, `product_models`, `rms_models`), asked for before comparing.

Tasks ch32.3 and ch32.4 prescribe one summation order, and their checks compare the student's bits with it: an answer
that leaves the order to a library (plain `x @ w`, `torch.sum`, `@` on float64 copies) fails on every machine, not
only on one whose library happens to split the batch.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass

import torch

from grader.authoring import CheckFailed, Hint, Trial, describe, expect_int, expect_tensor, fmt, hidden_model, mistakes, public, vec
from grader.i18n import mark, tr

CLAMP = 1e-10  # the race clamps its noise to ≥ 1e-10, as in ch23
NEAR = 1e-5  # a verdict u < p/q or a race this close (relative) to a tie may go either way

# The figure instance of ch32-spec-confidence: 5 drafts over a vocabulary of 6; the confidence of a
# draft is the largest probability of its draft distribution (a function of q_i, never of the token).
SPEC_TOKENS = [2, 4, 0, 5, 1]
SPEC_Q = [
    [0.05, 0.05, 0.70, 0.10, 0.05, 0.05],
    [0.02, 0.05, 0.03, 0.05, 0.80, 0.05],
    [0.60, 0.10, 0.10, 0.10, 0.05, 0.05],
    [0.10, 0.10, 0.10, 0.10, 0.10, 0.50],
    [0.10, 0.60, 0.10, 0.10, 0.05, 0.05],
]
SPEC_P = [
    [0.05, 0.10, 0.60, 0.15, 0.05, 0.05],
    [0.05, 0.35, 0.05, 0.15, 0.30, 0.10],
    [0.50, 0.20, 0.10, 0.10, 0.05, 0.05],
    [0.10, 0.10, 0.20, 0.30, 0.20, 0.10],
    [0.05, 0.45, 0.20, 0.10, 0.10, 0.10],
    [0.20, 0.20, 0.15, 0.15, 0.15, 0.15],
]
SPEC_U = [0.30, 0.62, 0.20, 0.50, 0.40]
SPEC_NOISE = [
    [1.0, 0.8, 1.3, 0.6, 2.0, 0.9],
    [1.2, 1.9, 0.5, 0.35, 0.2, 2.0],
    [0.7, 1.1, 0.4, 1.6, 0.9, 1.0],
    [0.9, 1.4, 0.3, 1.2, 0.8, 2.2],
    [1.1, 0.5, 0.9, 1.3, 0.6, 1.0],
    [0.8, 1.0, 1.2, 0.4, 1.5, 0.9],
]
SPEC_CONF = [max(row) for row in SPEC_Q]  # 0.7, 0.8, 0.6, 0.5, 0.6
SPEC_THRESHOLD = 0.3  # survivals 0.7, 0.56, 0.336 | 0.168, 0.1008 → 3 drafts

VARIANTS = [  # names shown to the student (mark: translated where shown); the keys of VARIANT_KNOBS
    mark("no bonus"),
    mark("no stop"),
    mark("rejected draft kept"),
    mark("replacement from p"),
    mark("residual q − p"),
    mark("ratio q/p"),
    mark("accept when u ≥ p/q"),
    mark("greedy"),
    mark("next noise row"),
    mark("bonus from row k − 1"),
    mark("unclamped noise"),
    mark("q(x) = 0 accepted"),
    mark("float16 arithmetic"),
]
"""The classic mistakes of verification, as `verify_models` names what each emits, in the order they are tried
(each is a row of the table of mistakes: `variant_hint`)."""

# ch32-determinism: row 0 of x [64, 256] @ w [256, 64] in batches of 1 … 64, and the shapes plain x @ w is probed on.
INT_OF = {
    torch.float32: torch.int32,
    torch.float64: torch.int64,
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
}  # a float's bits, as the int of its width
UNIT = {torch.float32: 2.0**-24, torch.float64: 2.0**-53, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
FIG_K, FIG_N, FIG_BATCHES = 256, 64, [1, 2, 3, 4, 8, 16, 32, 64]
RMS_H, RMS_BLOCK, RMS_EPS, RMS_BATCHES = 40, 16, 1e-6, [1, 2, 3, 4, 8, 16]  # ch32-rms-split: chunks 16, 16, 8 + 8 zeros
PROBE_SHAPES = [
    (torch.float32, 64, 64),
    (torch.float32, 256, 128),
    (torch.float32, 1024, 64),
    (torch.bfloat16, 256, 128),
    (torch.float64, 256, 128),
]

M = mistakes("ch32")

verify_models = hidden_model("ch32_models.verify_models")
"""`t.ref.drive(verify_models, case)`: each position's verdict and race, the first rejection, each mistake's tokens."""
count_models = hidden_model("ch32_models.count_models")
"""`t.ref.drive(count_models, conf, threshold)`: the survivals and the counts of the classic misreadings."""
product_models = hidden_model("ch32_models.product_models")
"""`t.ref.drive(product_models, x, w)`: x @ w in float64, its rounding bound, and what the classic mistakes give
(a 16-bit accumulation, `@` on float64 copies, a fused multiply-add)."""
plain_models = hidden_model("ch32_models.plain_models")
"""`t.ref.drive(plain_models, x, w, batches)`: plain x @ w of each batch, on one thread (the library's order)."""
plain_rms_models = hidden_model("ch32_models.plain_rms_models")
"""`t.ref.drive(plain_rms_models, x, weight, eps, batches)`: RMSNorm of each batch with the library's own mean."""
rms_models = hidden_model("ch32_models.rms_models")
"""`t.ref.drive(rms_models, x, weight, eps, block)`: RMSNorm in float64, its rounding bound, the fixed split of each
row (squares, chunk sums, running totals), and what the classic mistakes and the accepted rsqrt give."""


# -- ch32.1 ----------------------------------------------------------------------------------------------------------


@public("ch32.1", "figure instance: the 3 drafts sent for verification, 1 accepted, 1 rejected")
def spec_instance(t: Trial) -> None:
    n = t.ref.num_drafts_to_verify(SPEC_CONF, SPEC_THRESHOLD)
    c = spec_case(n)
    got = t.yours.verify_draft(*c.args())
    want = t.ref.verify_draft(*c.args())
    models = t.ref.drive(verify_models, c)
    if type(got) in (list, tuple) and all(type(y) is int for y in got):
        p, q = c.p.double(), c.q.double()
        rows = [(float(q[i, x]), float(p[i, x]), float(c.u[i])) for i, x in enumerate(c.tokens)]
        stop = models["stop"]
        race = models["positions"][stop]
        t.figure(
            "ch32-spec-confidence",
            tokens=SPEC_TOKENS,
            verified=n,
            q_x=[r[0] for r in rows],
            p_x=[r[1] for r in rows],
            u=[r[2] for r in rows],
            stop=stop,
            race_p=p[stop],
            race_q=q[stop] if stop < c.k else None,
            race_weights=race["weights"],
            race_noise=c.e[stop],
            race_scores=race["scores"],
            emitted=list(got),
            emitted_expected=want,
        )
    expect_emitted(
        got, c, want, case=tr('case "figure instance": drafts {tokens}, uniforms {u}', tokens=c.tokens, u=SPEC_U[:n]), models=models
    )


@public("ch32.1", "the worked example of vLLM's rejection sampler: q = (0.6, 0.3, 0.1), p = (0.3, 0.5, 0.2)")
def worked_example(t: Trial) -> None:
    # Draft A (token 0): accepted with probability min(1, 0.3 / 0.6) = 0.5. u = 0.4 accepts it and the bonus
    # follows; u = 0.7 rejects it, and max(0, p − q) = (0, 0.2, 0.1) races with the noise (0.2, 1.5, 0.6).
    for u in (0.4, 0.7):
        c = make_case([0], [[0.6, 0.3, 0.1]], [[0.3, 0.5, 0.2], [0.2, 0.2, 0.6]], [u], [[0.2, 1.5, 0.6], [1.3, 0.4, 0.9]])
        run_verify(t, c, case=tr('case "worked example": draft A = token 0, u = {u}', u=u))


@public("ch32.1", "all k drafts accepted: k + 1 tokens, the bonus from target_probs[k] with noise[k]")
def all_accepted(t: Trial) -> None:
    c = make_case(
        [1, 3, 0],
        [[0.2, 0.5, 0.2, 0.1], [0.1, 0.1, 0.2, 0.6], [0.4, 0.3, 0.2, 0.1]],
        [[0.1, 0.6, 0.2, 0.1], [0.1, 0.2, 0.1, 0.6], [0.5, 0.2, 0.2, 0.1], [0.1, 0.2, 0.3, 0.4]],
        [0.1, 0.9, 0.3],
        [[1.0] * 4, [1.0] * 4, [1.0] * 4, [0.3, 2.0, 0.5, 1.9]],
    )
    run_verify(t, c, case=tr('case "all accepted": every u < min(1, p/q)'))


@public("ch32.1", "q = p: every draft is accepted, even with u = 0.999")
def same_distributions(t: Trial) -> None:
    p = [[0.25, 0.25, 0.5], [0.7, 0.2, 0.1], [0.1, 0.1, 0.8]]
    c = make_case([2, 1], p[:2], p, [0.999, 0.999], [[1.0, 0.5, 2.0], [0.5, 1.0, 1.0], [2.0, 0.3, 1.0]])
    run_verify(t, c, case=tr('case "q = p": p(x) / q(x) = 1 > u'))


# -- ch32.2 ----------------------------------------------------------------------------------------------------------


@public("ch32.2", "figure instance: confidences 0.7, 0.8, 0.6, 0.5, 0.6 with threshold 0.3")
def count_instance(t: Trial) -> None:
    conf = torch.tensor(SPEC_CONF)
    got = t.yours.num_drafts_to_verify(conf, SPEC_THRESHOLD)
    want = t.ref.num_drafts_to_verify(conf, SPEC_THRESHOLD)
    models = t.ref.drive(count_models, conf.double().tolist(), SPEC_THRESHOLD)
    n = expect_int(got, what=tr("the number of drafts to verify"))
    t.figure(
        "ch32-spec-confidence", confidences=conf.double(), threshold=SPEC_THRESHOLD, survivals=models["survivals"], n=n, n_expected=want
    )
    expect_count(n, conf.double().tolist(), SPEC_THRESHOLD, want, case=tr('case "figure instance"'), models=models)


@public("ch32.2", "the adaptive-verification example: R1 = (0.9, 0.8, 0.5), R2 = (0.6, 0.5, 0.9), threshold 0.35")
def two_requests(t: Trial) -> None:
    run_count(t, [0.9, 0.8, 0.5], 0.35, case=tr('case "R1": survivals 0.9, 0.72, 0.36'))
    run_count(t, [0.6, 0.5, 0.9], 0.35, case=tr('case "R2": survivals 0.6, 0.30, 0.27 (the 0.9 comes too late)'))


@public("ch32.2", "a survival exactly equal to the threshold is still verified")
def equal_threshold(t: Trial) -> None:
    run_count(
        t,
        torch.tensor([0.5, 0.5, 0.5], dtype=torch.float64),
        0.25,
        case=tr('case "equal": survivals 0.5, 0.25, 0.125 (exact in binary), threshold 0.25'),
    )


@public("ch32.2", "no drafts, and a first draft below the threshold: nothing to verify")
def nothing_to_verify(t: Trial) -> None:
    run_count(t, torch.zeros(0), 0.5, case=tr('case "k = 0"'))
    run_count(t, torch.tensor([0.2, 1.0, 1.0]), 0.5, case=tr('case "weak first draft": c0 = 0.2 < 0.5'))


# -- ch32.3 ----------------------------------------------------------------------------------------------------------


@public("ch32.3", "figure instance: row 0 in batches of 1 … 64, beside plain x @ w")
def determinism_instance(t: Trial) -> None:
    x = torch.randn(max(FIG_BATCHES), FIG_K, generator=t.rng)
    w = torch.randn(FIG_K, FIG_N, generator=t.rng)
    batches = [list(range(B)) for B in FIG_BATCHES]
    wants = [t.ref.batch_invariant_matmul(x[idx], w) for idx in batches]
    models = rows_of(t.ref.drive(product_models, x, w), batches)
    plains = t.ref.drive(plain_models, x, w, batches)
    outs = collect(t, x, w, batches)
    mine, plain = [o[0] for o in outs], [p[0] for p in plains]
    col = next((c for c in (first_col(mine), first_col(plain), first_col([wants[0][0], mine[0]])) if c is not None), 0)
    t.figure(
        "ch32-determinism",
        K=FIG_K,
        N=FIG_N,
        batches=FIG_BATCHES,
        column=col,
        yours=[float(r[col]) for r in mine],
        yours_bits=[bits(r[col]) for r in mine],
        yours_changed=changed(mine),
        expected_bits=[bits(want[0, col]) for want in wants],
        wrong=[not bool(same_bits(r, want[0]).all()) for r, want in zip(mine, wants)],
        plain=[float(r[col]) for r in plain],
        plain_bits=[bits(r[col]) for r in plain],
        plain_changed=changed(plain),
        exact=float(models[0]["exact"][0, col]),
        probe=probe_matmul(t.rng),
        machine=machine(),
    )
    expect_invariant(
        outs,
        x,
        w,
        batches,
        case=tr(
            'case "figure instance": row 0 of x [64, {K}], w [{K}, {N}], in batches of B = {batches}', K=FIG_K, N=FIG_N, batches=FIG_BATCHES
        ),
        models=models,
        wants=wants,
        plains=plains,
    )


@public("ch32.3", "a row keeps its bits at any position, beside any neighbours")
def any_position(t: Trial) -> None:
    pool, w = torch.randn(12, 96, generator=t.rng), torch.randn(96, 40, generator=t.rng)
    batches = [[0], [3, 0], [5, 1, 0, 7], [11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0], [0, 0, 0, 4, 4], [4], [7, 3, 11]]
    run_invariance(t, pool, w, batches, case=tr('case "positions": 12 rows of K = 96, N = 40, shuffled into 7 batches'))


@public("ch32.3", "the bits of the order k = 0 … K − 1 in float32, K = 1 and odd sizes included")
def agrees(t: Trial) -> None:
    for B, K, N in ((3, 5, 7), (1, 1, 4), (9, 130, 33), (0, 8, 3)):
        x, w = torch.randn(B, K, generator=t.rng), torch.randn(K, N, generator=t.rng)
        run_invariance(t, x, w, [list(range(B))], case=tr('case "agrees": B = {B}, K = {K}, N = {N}', B=B, K=K, N=N))


@public("ch32.3", "bfloat16 in, bfloat16 out, summed in float32")
def bf16(t: Trial) -> None:
    x = torch.randn(6, 512, generator=t.rng).to(torch.bfloat16)
    w = (torch.randn(512, 24, generator=t.rng) * 0.05).to(torch.bfloat16)
    run_invariance(t, x, w, [list(range(6))], case=tr('case "bfloat16": B = 6, K = 512, N = 24'))


@public("ch32.3", "float64 in: the same order, in a float64 accumulator")
def float64(t: Trial) -> None:
    # Terms of very different sizes, so that any other grouping of the sum rounds differently.
    x = (torch.randn(8, 300, generator=t.rng) * torch.logspace(0, 6, 300)[torch.randperm(300, generator=t.rng)]).double()
    w = torch.randn(300, 16, generator=t.rng, dtype=torch.float64)
    run_invariance(t, x, w, [[0], list(range(8)), [5, 0, 2]], case=tr('case "float64": B = 8, K = 300 terms from 1 to 1e6 in size, N = 16'))


# -- ch32.4 ----------------------------------------------------------------------------------------------------------


@public("ch32.4", "figure instance: row 0 of [16, 40] with block = 16, in batches of 1 … 16")
def rms_instance(t: Trial) -> None:
    x = torch.randn(max(RMS_BATCHES), RMS_H, generator=t.rng) * 2
    weight = 1 + 0.25 * torch.randn(RMS_H, generator=t.rng)
    batches = [list(range(B)) for B in RMS_BATCHES]
    wants = [t.ref.batch_invariant_rms_norm(x[idx], weight, RMS_EPS, RMS_BLOCK) for idx in batches]
    models = t.ref.drive(rms_models, x, weight, RMS_EPS, RMS_BLOCK)
    plain = [p[0] for p in t.ref.drive(plain_rms_models, x, weight, RMS_EPS, batches)]
    outs = collect_rms(t, x, weight, RMS_EPS, RMS_BLOCK, batches)
    mine = [o[0] for o in outs]
    accepted = [rows_of(models, [idx])[0]["rsqrt"] for idx in batches]
    good = [bool(same_bits(r, want[0]).all()) or bool(same_bits(r, alt[0]).all()) for r, want, alt in zip(mine, wants, accepted)]
    col = next((c for c in (first_col(mine), first_col([wants[0][0], mine[0]]), first_col([wants[0][0], plain[0]])) if c is not None), 0)
    t.figure(
        "ch32-rms-split",
        H=RMS_H,
        block=RMS_BLOCK,
        batches=RMS_BATCHES,
        column=col,
        eps=RMS_EPS,
        squares=models["squares"][0],
        chunk_sums=models["chunk sums"][0],
        totals=models["totals"][0],
        yours=[float(r[col]) for r in mine],
        yours_bits=[bits(r[col]) for r in mine],
        expected_bits=[bits(want[0, col]) for want in wants],
        wrong=[not g for g in good],
        plain_bits=[bits(r[col]) for r in plain],
        plain_differs=[not bool(same_bits(r, want[0]).all()) for r, want in zip(plain, wants)],
        exact=float(models["exact"][0, col]),
    )
    expect_rms(
        outs,
        wants,
        x,
        weight,
        batches,
        models,
        case=tr(
            'case "figure instance": row 0 of x [{B}, {H}], block = {block}, in batches of B = {batches}',
            B=max(RMS_BATCHES),
            H=RMS_H,
            block=RMS_BLOCK,
            batches=RMS_BATCHES,
        ),
    )


@public("ch32.4", "batch invariance: a row keeps its bits at any position, beside any neighbours (in any order written out by hand)")
def rms_any_position(t: Trial) -> None:
    # Invariance alone: an answer that fixes another order than the split's keeps this check's point (the checks
    # of the order take the others).
    pool = torch.randn(12, 44, generator=t.rng)
    weight = torch.rand(44, generator=t.rng) + 0.5
    batches = [[0], [3, 0], [5, 1, 0, 7], [11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0], [0, 0, 0, 4, 4], [4], [7, 3, 11]]
    run_rms(
        t,
        pool,
        weight,
        1e-6,
        8,
        batches,
        case=tr('case "positions": 12 rows of H = 44 (chunks 8 × 5 + 4), block = 8, shuffled into 7 batches'),
        order=False,
    )


@public("ch32.4", "one padded chunk, a chunk per column, H = 1, no rows, and vLLM-sized chunks of 256 and 1024")
def rms_shapes(t: Trial) -> None:
    for B, H, block, eps in (
        (3, 20, 32, 1e-6),
        (4, 9, 1, 1e-5),
        (2, 1, 4, 1e-6),
        (0, 16, 4, 1e-6),
        (5, 64, 64, 0.0),
        (8, 600, 256, 1e-6),
        (8, 1024, 1024, 1e-6),
    ):
        pool = torch.randn(B, H, generator=t.rng)
        weight = torch.randn(H, generator=t.rng)
        run_rms(
            t,
            pool,
            weight,
            eps,
            block,
            [list(range(B))],
            case=tr('case "shapes": B = {B}, H = {H}, block = {block}, eps = {eps}', B=B, H=H, block=block, eps=eps),
        )


@public("ch32.4", "a bfloat16 RMSNorm: (x · inv_rms) · weight in float32, one cast at the end")
def rms_bf16(t: Trial) -> None:
    pool = (torch.randn(16, 96, generator=t.rng) * 3).to(torch.bfloat16)
    weight = (1 + 0.5 * torch.randn(96, generator=t.rng)).to(torch.bfloat16)
    run_rms(t, pool, weight, 1e-6, 32, [list(range(16)), [3], [9, 3]], case=tr('case "bfloat16": 16 rows of H = 96, block = 32'))


# -- helpers: verification -------------------------------------------------------------------------------------------


@dataclass
class Case:
    """One verification: draft tokens [k], q [k, V], p [k + 1, V], uniforms [k], noise [k + 1, V]."""

    tokens: list[int]
    q: torch.Tensor
    p: torch.Tensor
    u: torch.Tensor
    e: torch.Tensor

    def args(self) -> tuple:
        return torch.tensor(self.tokens, dtype=torch.int64), self.q, self.p, self.u, self.e

    @property
    def k(self) -> int:
        return len(self.tokens)


def make_case(tokens, q, p, u, e, dtype=torch.float32) -> Case:
    """A Case from nested lists: probabilities in `dtype`, uniforms and noise in float32."""
    V = len(p[0])
    rows = lambda v, n, dt: torch.tensor(v, dtype=dt).reshape(n, V) if n else torch.zeros(0, V, dtype=dt)
    return Case(
        list(tokens),
        rows(q, len(tokens), dtype),
        rows(p, len(p), dtype),
        torch.tensor(u, dtype=torch.float32).reshape(-1),
        rows(e, len(e), torch.float32),
    )


def spec_case(n: int) -> Case:
    """The figure instance cut to its first n drafts (and n + 1 target rows)."""
    return make_case(SPEC_TOKENS[:n], SPEC_Q[:n], SPEC_P[: n + 1], SPEC_U[:n], SPEC_NOISE[: n + 1])


def variant_hint(name: str) -> Hint:
    """The hint of the classic mistake of verification `name` (one of VARIANTS)."""
    return {
        "no bonus": M.no_bonus,
        "no stop": M.no_stop,
        "rejected draft kept": M.rejected_kept,
        "replacement from p": M.from_p,
        "residual q − p": M.reversed_residual,
        "ratio q/p": M.inverse_ratio,
        "accept when u ≥ p/q": M.flipped_accept,
        "greedy": M.greedy,
        "next noise row": M.next_noise_row,
        "bonus from row k − 1": M.bonus_row,
        "unclamped noise": M.unclamped_noise,
        "q(x) = 0 accepted": M.zero_q_accepted,
        "float16 arithmetic": M.half_precision,
    }[name]


def emitted_hint(tokens: list[int], want: list[int], variants: dict) -> str:
    """The hint of the classic mistake that emits exactly the student's tokens (`verify_models(...)["variants"]`)."""
    return next((variant_hint(name) for name in VARIANTS if variants[name] == tokens != want), "")


def near(a: float, b: float) -> bool:
    """Whether a verdict u < p/q (or a race) this close to a tie may go either way in float precision."""
    return abs(a - b) <= NEAR * max(abs(a), abs(b), 1e-30)


def race_ok(race: dict, y: int) -> bool:
    """Whether token y wins the race `race` (a position of `verify_models`), or ties with the winner within NEAR."""
    scores, best = race["scores"], race["winner"]
    if not 0 <= y < scores.numel():
        return False
    return float(scores[y]) > 0 and float(scores[y]) >= float(scores[best]) * (1 - NEAR) or y == best


def first_problem(c: Case, got: list[int], positions: list[dict]) -> int | None:
    """The first position where `got` is not a verification of c (near-ties allowed either way); None if valid.
    `positions` is `verify_models(...)["positions"]`."""
    for i, y in enumerate(got):
        last, pos = i == len(got) - 1, positions[i]
        if i == c.k:
            return None if race_ok(pos, y) else i
        accept, close = pos["accept"], pos["near"]
        if not last and not (y == c.tokens[i] and (accept or close)):
            return i
        if last and not ((not accept or close) and race_ok(pos, y)):
            return i
    return None


def describe_position(c: Case, i: int, positions: list[dict]) -> tuple[str, int]:
    """What verification does at position i (exactly, in float64), and the token it emits there (−1: it goes on)."""
    p, q, pos = c.p.double(), c.q.double(), positions[min(i, c.k)]
    if i >= c.k:
        return (
            tr(
                "all {k} drafts were accepted, so the bonus token is the race on target_probs[{k}] = {p} with noise[{k}] = {e}: "
                "p / E = {scores} → token {winner}",
                k=c.k,
                p=vec(p[c.k]),
                e=vec(c.e[c.k]),
                scores=vec(pos["scores"]),
                winner=pos["winner"],
            ),
            pos["winner"],
        )
    x, u = c.tokens[i], float(c.u[i])
    px, qx = float(p[i, x]), float(q[i, x])
    head = tr("position {i}: draft token {x}, q_{i}({x}) = {q}, p_{i}({x}) = {p}", i=i, x=x, q=fmt(qx), p=fmt(px))
    if pos["accept"]:
        return tr(
            "{head}, u_{i} = {u} < min(1, p/q) = {ratio} → accepted: emit {x} and go on",
            head=head,
            i=i,
            u=fmt(u),
            ratio=fmt(pos["ratio"]),
            x=x,
        ), -1
    verdict = (
        tr("u_{i} = {u} ≥ min(1, p/q) = {ratio} → rejected", i=i, u=fmt(u), ratio=fmt(pos["ratio"]))
        if pos["ratio"] is not None
        else tr("q(x) = 0 → rejected")
    )
    return (
        tr(
            "{head}, {verdict}; the recovered token is the race on max(0, p_{i} − q_{i}) = {weights} with noise[{i}] = {e}: "
            "scores {scores} → token {winner}, and verification stops",
            head=head,
            verdict=verdict,
            i=i,
            weights=vec(pos["weights"]),
            e=vec(c.e[i]),
            scores=vec(pos["scores"]),
            winner=pos["winner"],
        ),
        pos["winner"],
    )


def expect_emitted(got, c: Case, want: list[int], *, case: str, models: dict | None = None) -> list[int]:
    """Require the student's emitted tokens to be a verification of c; explain the first wrong position
    (`models`: `verify_models`' answer; asked of the hidden side when needed if not given)."""
    V = c.p.shape[1]
    if type(got) not in (list, tuple) or any(type(y) is not int for y in got):
        raise CheckFailed(
            case,
            tr("expected the emitted tokens as a list of Python ints; yours: {got}  (use .tolist())", got=describe(got))
            if isinstance(got, torch.Tensor)
            else tr("expected the emitted tokens as a list of Python ints; yours: {got}", got=describe(got)),
        )
    tokens = list(got)
    if tokens == want:
        return tokens
    models = models if models is not None else verify_models(None, c)
    i, problem = None, ""
    if not 1 <= len(tokens) <= c.k + 1:
        problem = (
            tr("{n} tokens, but a verification of k = 0 drafts emits exactly 1 (the bonus)", n=len(tokens))
            if c.k == 0
            else tr("{n} tokens, but a verification of k = {k} drafts emits 1 … {most}", n=len(tokens), k=c.k, most=c.k + 1)
        )
    elif any(not 0 <= y < V for y in tokens):
        problem = tr("token {y} is outside the vocabulary 0 … {last}", y=next(y for y in tokens if not 0 <= y < V), last=V - 1)
    else:
        i = first_problem(c, tokens, models["positions"])
        if i is None:
            return tokens
    lines = [
        case,
        tr("expected {want}; yours {got}: {problem}", want=want, got=tokens, problem=problem)
        if problem
        else tr("expected {want}; yours {got}", want=want, got=tokens),
    ]
    if i is not None:
        text, w = describe_position(c, i, models["positions"])
        y, rest = tokens[i], len(tokens) - i - 1
        if w >= 0 and y != w:
            weights = models["positions"][i]["weights"]
            zero = (
                tr(" (its weight {weight} is 0: it can never win)", weight="p" if i >= c.k else "max(0, p − q)")
                if float(weights[y]) == 0
                else ""
            )
            if i < c.k and y == c.tokens[i] and rest:
                zero = tr(" (you accepted the draft)")
            text += (
                tr("; yours: token {y}{note}, then {rest} more", y=y, note=zero, rest=rest)
                if rest
                else tr("; yours: token {y}{note}", y=y, note=zero)
            )
        elif w >= 0:
            text += tr("; yours: token {y}, then {rest} more", y=y, note="", rest=rest)
        else:
            text += tr("; yours: token {y}{note}", y=y, note="") if y != c.tokens[i] else tr("; yours: your list ends there")
        lines.append(text)
    raise CheckFailed(*lines, hint=emitted_hint(tokens, want, models["variants"]))


def run_verify(t: Trial, c: Case, *, case: str) -> list[int]:
    got = t.yours.verify_draft(*c.args())
    want = t.ref.verify_draft(*c.args())
    models = t.ref.drive(verify_models, c)
    return expect_emitted(got, c, want, case=tr("{case} (k = {k}, V = {V})", case=case, k=c.k, V=c.p.shape[1]), models=models)


# -- helpers: how many drafts to verify ------------------------------------------------------------------------------


def expect_count(got, conf: list[float], threshold: float, want: int, *, case: str, models: dict | None = None) -> int:
    """Require the number of drafts to verify; explain with the survivals (`models`: `count_models`' answer;
    asked of the hidden side when needed if not given)."""
    n = expect_int(got, what=tr("the number of drafts to verify"))
    if n == want:
        return n
    models = models if models is not None else count_models(None, conf, threshold)
    k, surv = len(conf), models["survivals"]
    lines = [
        case,
        tr("confidences {conf}, threshold {threshold}", conf=vec(conf, limit=10), threshold=fmt(threshold)),
        tr(
            "survival = running product: {survivals}",
            survivals=", ".join(f"s{j} = {fmt(s)}" for j, s in enumerate(surv[:10])) + (", …" if k > 10 else ""),
        ),
    ]
    if want < k:
        lines.append(
            tr(
                "s{want} = {s} < {threshold} is the first survival below the threshold, so n = {want}; yours: {n}",
                want=want,
                s=fmt(surv[want]),
                threshold=fmt(threshold),
                n=n,
            )
        )
    else:
        lines.append(
            tr("every survival stays ≥ {threshold}, so all {k} drafts are verified; yours: {n}", threshold=fmt(threshold), k=k, n=n)
        )
    hint = ""
    if n in (models["first alone below"], models["alone at or above"]) and n != want:
        hint = M.per_item
    elif n == models["first at or below"] and n < want:
        hint = M.strict
    elif n == want + 1:
        hint = M.count_first_below
    raise CheckFailed(*lines, hint=hint)


def run_count(t: Trial, conf, threshold: float, *, case: str) -> int:
    got = t.yours.num_drafts_to_verify(conf, threshold)
    want = t.ref.num_drafts_to_verify(conf, threshold)
    values = conf.double().tolist() if isinstance(conf, torch.Tensor) else list(conf)
    return expect_count(got, values, threshold, want, case=case, models=t.ref.drive(count_models, values, threshold))


# -- helpers: batch invariance ---------------------------------------------------------------------------------------


def bits(v: torch.Tensor) -> str:
    """A float's bit pattern in hex (0x3F800000 for float32 1.0)."""
    n = {torch.float64: 16, torch.float32: 8}.get(v.dtype, 4)
    return f"0x{int(v.reshape(1).view(INT_OF[v.dtype])) & ((1 << 4 * n) - 1):0{n}X}"


def same_bits(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.contiguous().view(INT_OF[a.dtype]) == b.contiguous().view(INT_OF[b.dtype])


def probe_matmul(gen: torch.Generator, batches: list[int] = FIG_BATCHES) -> list[dict]:
    """Measured here: for each dtype and shape, the batch sizes at which plain x @ w gives row 0 other bits than
    at B = 1 (an empty list: none found on this machine for that shape)."""
    found = []
    for dtype, K, N in PROBE_SHAPES:
        x = torch.randn(max(batches), K, generator=gen).to(dtype)
        w = torch.randn(K, N, generator=gen).to(dtype)
        alone = (x[:1] @ w)[0]
        found.append(
            {
                "dtype": str(dtype).removeprefix("torch."),
                "K": K,
                "N": N,
                "changed": [B for B in batches if not bool(same_bits((x[:B] @ w)[0], alone).all())],
            }
        )
    return found


def machine() -> str:
    return tr(
        "{machine}, torch {version}, {threads} thread(s)",
        machine=platform.machine() or "cpu",
        version=torch.__version__,
        threads=torch.get_num_threads(),
    )


def expect_product(got, x: torch.Tensor, w: torch.Tensor, *, case: str, models: dict | None = None) -> torch.Tensor:
    """Require x @ w within the rounding of a float32 (float64) accumulation and a cast to x's dtype
    (`models`: `product_models`' answer; asked of the hidden side if not given)."""
    B, K, N = x.shape[0], x.shape[1], w.shape[1]
    out = expect_tensor(got, what=tr("x @ w for a batch of {B} rows", B=B), shape=[B, N], dtype=x.dtype)
    models = models if models is not None else product_models(None, x, w)
    exact, bound = models["exact"], models["bound"]
    bad = ~((out.double() - exact).abs() <= bound)
    if not bool(bad.any()):
        return out
    i, n = (int(v) for v in bad.nonzero()[0])
    lines = [
        case,
        tr(
            "out[{i}, {n}] = Σ_k x[{i}, k] · w[k, {n}] over K = {K} terms = {exact} (float64), allowed error {bound}; yours: {got} "
            "({bad} of {total} entries are off)",
            i=i,
            n=n,
            K=K,
            exact=fmt(float(exact[i, n]), 8),
            bound=fmt(float(bound[i, n]), 2),
            got=fmt(float(out[i, n]), 8),
            bad=int(bad.sum()),
            total=bad.numel(),
        ),
    ]
    low = "low" in models and bool((models["low"] == out).float().mean() > 0.9)
    raise CheckFailed(*lines, hint=M.low_precision_acc.format(dtype=str(x.dtype)[6:]) if low else "")


def changed(rows: list[torch.Tensor]) -> list[int]:
    """For each row, how many of its columns have other bits than rows[0]."""
    return [int((~same_bits(r, rows[0])).sum()) for r in rows]


def first_col(rows: list[torch.Tensor]) -> int | None:
    """The first column in which some row has other bits than rows[0] (None: all alike)."""
    return next((int((~same_bits(r, rows[0])).nonzero()[0]) for r in rows if not bool(same_bits(r, rows[0]).all())), None)


def ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    return abs(int(a.reshape(1).view(INT_OF[a.dtype])) - int(b.reshape(1).view(INT_OF[b.dtype])))


def collect(t: Trial, pool: torch.Tensor, w: torch.Tensor, batches: list[list[int]]) -> list[torch.Tensor]:
    """The student's outputs for batches of pool rows, shape and dtype checked."""
    return [
        expect_tensor(
            t.yours.batch_invariant_matmul(pool[idx], w),
            what=tr("x @ w for a batch of {B} rows", B=len(idx)),
            shape=[len(idx), w.shape[1]],
            dtype=pool.dtype,
        )
        for idx in batches
    ]


def moved_row(outs: list[torch.Tensor], batches: list[list[int]], *, case: str, what: str) -> tuple[list[str], tuple] | None:
    """Whether some pool row came out with other bits in two batches: the lines that say so and the two batches'
    (B, position) pairs, or None when every row kept its bits."""
    first: dict[int, tuple[int, int, torch.Tensor]] = {}
    for idx, out in zip(batches, outs):
        for pos, r in enumerate(idx):
            if r not in first:
                first[r] = (len(idx), pos, out)
                continue
            B0, pos0, out0 = first[r]
            same = same_bits(out[pos], out0[pos0])
            if bool(same.all()):
                continue
            n = int((~same).nonzero()[0])
            a, b = out0[pos0, n], out[pos, n]
            lines = [
                case,
                tr(
                    "pool row {r} computed in a batch of B = {B0} (position {pos0}) and of B = {B1} (position {pos1}) must come out "
                    "with the same bits; column {n}: {a} ({a_bits}) vs {b} ({b_bits}), {ulps} ulp apart; {bad} of {total} columns "
                    "differ",
                    r=r,
                    B0=B0,
                    pos0=pos0,
                    B1=len(idx),
                    pos1=pos,
                    n=n,
                    a=fmt(float(a), 9),
                    a_bits=bits(a),
                    b=fmt(float(b), 9),
                    b_bits=bits(b),
                    ulps=ulps(a, b),
                    bad=int((~same).sum()),
                    total=same.numel(),
                ),
                what,
            ]
            return lines, ((B0, pos0), (len(idx), pos))
    return None


def expect_invariant(
    outs: list[torch.Tensor],
    pool: torch.Tensor,
    w: torch.Tensor,
    batches: list[list[int]],
    *,
    case: str,
    models: list[dict] | None = None,
    wants: list[torch.Tensor] | None = None,
    plains: list[torch.Tensor] | None = None,
) -> None:
    """Values close to x @ w, each pool row with the same bits wherever it appears (batch size, position,
    neighbours), and those bits the fixed order's (`wants`: the reference's outputs; `models`: `product_models`'
    answer for each batch; `plains`: `plain_models`' answer; each asked of the hidden side if not given)."""
    models = models if models is not None else [product_models(None, pool[idx], w) for idx in batches]
    plains = plains if plains is not None else plain_models(None, pool, w, batches)
    for n, (idx, out) in enumerate(zip(batches, outs)):
        expect_product(out, pool[idx], w, case=tr("{case}, batch of B = {B}", case=case, B=len(idx)), models=models[n])
    moved = moved_row(outs, batches, case=case, what=tr("the order in which your function sums over k depends on the batch"))
    if moved:
        plain = all(bool(same_bits(out, p).all()) for out, p in zip(outs, plains))
        raise CheckFailed(*moved[0], hint=M.plain_matmul if plain else M.batch_dependent)
    if wants is None:
        return
    for idx, out, want, model, plain_out in zip(batches, outs, wants, models, plains):
        same = same_bits(out, want)
        if bool(same.all()):
            continue
        i, n = (int(v) for v in (~same).nonzero()[0])
        acc = "float64" if pool.dtype == torch.float64 else "float32"
        lines = [
            tr("{case}, batch of B = {B}", case=case, B=len(idx)),
            tr(
                "out[{i}, {n}] must have the bits of the fixed order (k = 0, 1, …, {last} in turn, a multiply then an add in {acc}, "
                "one cast at the end): {want} ({want_bits}); yours {got} ({got_bits}), {ulps} ulp apart; {bad} of {total} entries "
                "differ",
                i=i,
                n=n,
                last=w.shape[0] - 1,
                acc=acc,
                **_bits_apart(want, out, i, n, same),
            ),
            tr(
                "your values are right and keep their bits from batch to batch here, but they are not the bits of that order: "
                "another machine (or library version) may sum them another way"
            ),
        ]
        hint = ""
        if "upcast" in model and bool(same_bits(out, model["upcast"]).all()):
            hint = M.upcast_plain
        elif bool(same_bits(out, plain_out).all()):
            hint = M.plain_matmul
        elif "fma" in model and bool(same_bits(out, model["fma"]).all()):
            hint = M.fused_madd
        raise CheckFailed(*lines, hint=hint)


def rows_of(models: dict, batches: list[list[int]]) -> list[dict]:
    """A model's answer for the whole pool, cut into each batch's rows (a row's values do not depend on the other
    rows)."""
    return [{key: value[idx] for key, value in models.items() if isinstance(value, torch.Tensor)} for idx in batches]


def run_invariance(t: Trial, pool: torch.Tensor, w: torch.Tensor, batches: list[list[int]], *, case: str) -> None:
    wants = [t.ref.batch_invariant_matmul(pool[idx], w) for idx in batches]
    models = rows_of(t.ref.drive(product_models, pool, w), batches)
    plains = t.ref.drive(plain_models, pool, w, batches)
    outs = collect(t, pool, w, batches)
    expect_invariant(outs, pool, w, batches, case=case, models=models, wants=wants, plains=plains)


# -- helpers: a batch-invariant RMSNorm ------------------------------------------------------------------------------


def collect_rms(t: Trial, pool: torch.Tensor, weight: torch.Tensor, eps: float, block: int, batches: list[list[int]]) -> list[torch.Tensor]:
    """The student's RMSNorm of batches of pool rows, shape and dtype checked."""
    return [
        expect_tensor(
            t.yours.batch_invariant_rms_norm(pool[idx], weight, eps, block),
            what=tr("the RMSNorm of a batch of {B} rows", B=len(idx)),
            shape=[len(idx), pool.shape[1]],
            dtype=pool.dtype,
        )
        for idx in batches
    ]


def expect_rms(
    outs: list[torch.Tensor],
    wants: list[torch.Tensor],
    pool: torch.Tensor,
    weight: torch.Tensor,
    batches: list[list[int]],
    models: dict,
    *,
    case: str,
    order: bool = True,
) -> None:
    """Values close to RMSNorm, each pool row with the same bits in every batch, and (`order`) those bits the fixed
    split's (`wants`: the reference's outputs; `models`: `rms_models`' answer for the pool). Without `order`, any
    order written out by hand passes, but not the library's own sums (`models["library orders"]`), which nothing
    makes keep their bits on another machine."""
    H = pool.shape[1]
    per_batch = rows_of(models, batches)
    for idx, out, model in zip(batches, outs, per_batch):
        bad = ~((out.double() - model["exact"]).abs() <= model["bound"])
        if bool(bad.any()):
            i, n = (int(v) for v in bad.nonzero()[0])
            raise CheckFailed(
                tr("{case}, batch of B = {B}", case=case, B=len(idx)),
                tr(
                    "out[{i}, {n}] = x[{i}, {n}] / sqrt(mean_j x[{i}, j]² + eps) · weight[{n}] = {exact} (float64), allowed error "
                    "{bound}; yours: {got} ({bad} of {total} entries are off)",
                    i=i,
                    n=n,
                    exact=fmt(float(model["exact"][i, n]), 8),
                    bound=fmt(float(model["bound"][i, n]), 2),
                    got=fmt(float(out[i, n]), 8),
                    bad=int(bad.sum()),
                    total=bad.numel(),
                ),
            )
    moved = moved_row(outs, batches, case=case, what=tr("the order in which your function sums over the hidden size depends on the batch"))
    if moved:
        raise CheckFailed(*moved[0], hint=M.rms_batch_split)
    # A hint names a mistake whose bits are the student's in every batch, not in one row by chance.
    everywhere = lambda key: all(bool(same_bits(out, model[key]).all()) for out, model in zip(outs, per_batch))
    if not order:
        library = next((key for key in models["library orders"] if everywhere(key)), None)
        if library is None:
            return
        what = (
            tr("torch.sum (or .mean) of the squares")
            if library == "plain sum"
            else tr("torch.sum over each chunk of {block}", block=models["block"])
        )
        raise CheckFailed(
            case,
            tr(
                "your rows keep their bits from batch to batch here, but they are the bits of {what}: the library picks that order "
                "from the shape (a GPU kernel splits a lone row across blocks), so nothing makes it stay the same in another batch "
                "or on another machine",
                what=what,
            ),
            tr("write the sum out in an order that depends only on H and block"),
            hint=M.rms_plain_sum if library == "plain sum" else M.rms_chunk_sum,
        )
    for idx, out, want, model in zip(batches, outs, wants, per_batch):
        same = same_bits(out, want)
        if bool(same.all()) or bool(same_bits(out, model["rsqrt"]).all()):
            continue
        i, n = (int(v) for v in (~same).nonzero()[0])
        block = models["block"]
        lines = [
            tr("{case}, batch of B = {B}", case=case, B=len(idx)),
            tr(
                "out[{i}, {n}] must have the bits of the fixed split (squares in chunks of {block} columns, each chunk summed by "
                "halving, the chunk sums added in order, 1 / sqrt(total / {H} + eps), (x · inv_rms) · weight, one cast at the "
                "end): {want} ({want_bits}); yours {got} ({got_bits}), {ulps} ulp apart; {bad} of {total} entries differ",
                i=i,
                n=n,
                block=block,
                H=H,
                **_bits_apart(want, out, i, n, same),
            ),
            tr("your values are right and keep their bits from batch to batch here, but they are not the bits of that order"),
        ]
        # With one chunk, torch.sum over the chunk is torch.sum over the row: name the row's. A library sum is named
        # only where its bits differ from every order written out by hand (a loop over j may give torch.sum's bits).
        sums = [("chunk sum", M.rms_chunk_sum), ("plain sum", M.rms_plain_sum)][:: 1 if H > block else -1]
        sums = [(key, h) for key, h in sums if key in models["library orders"]]
        hint = next((h for key, h in [*sums, ("cast first", M.rms_cast_first)] if everywhere(key)), "")
        raise CheckFailed(*lines, hint=hint)


def run_rms(
    t: Trial, pool: torch.Tensor, weight: torch.Tensor, eps: float, block: int, batches: list[list[int]], *, case: str, order: bool = True
) -> None:
    """The student's RMSNorm of each batch: right values, each row's bits the same in every batch, and (`order`)
    the bits of the fixed split; without `order`, the bits of any order written out by hand."""
    wants = [t.ref.batch_invariant_rms_norm(pool[idx], weight, eps, block) for idx in batches]
    models = t.ref.drive(rms_models, pool, weight, eps, block)
    outs = collect_rms(t, pool, weight, eps, block, batches)
    expect_rms(outs, wants, pool, weight, batches, models, case=case, order=order)


def _bits_apart(want: torch.Tensor, out: torch.Tensor, i: int, n: int, same: torch.Tensor) -> dict:
    """The fields of a message on entry [i, n] that is not bit for bit the fixed order's: both values and their bits,
    how many ulps apart, how many entries differ."""
    return {
        "want": fmt(float(want[i, n]), 9),
        "want_bits": bits(want[i, n]),
        "got": fmt(float(out[i, n]), 9),
        "got_bits": bits(out[i, n]),
        "ulps": ulps(want[i, n], out[i, n]),
        "bad": int((~same).sum()),
        "total": same.numel(),
    }
