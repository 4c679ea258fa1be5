"""Hidden checks of ch32 · speculative decoding and determinism: random verifications from the grading seed, a
chi-square test of losslessness, edge cases, bitwise batch invariance and the fixed order over many batches (a
matmul and an RMSNorm)."""

from __future__ import annotations

import torch

from grader.authoring import CheckFailed, Trial, fmt, hidden, vec
from grader.checks.ch23 import chi2, chi2_threshold
from grader.checks.ch32 import (
    VARIANTS,
    Case,
    expect_emitted,
    expect_invariant,
    expect_product,
    make_case,
    run_count,
    run_invariance,
    run_rms,
    run_verify,
    variant_hint,
)
from grader.hidden.ch32_models import VARIANT_KNOBS, simulate
from grader.i18n import tr

QWEN3_VOCAB, QWEN3_HIDDEN = 151_936, 1024
# Chi-square instance: the drafter never proposes token 3, the target's favourite, and proposes token 4, which
# the target never emits: the first token is distributed as p only if the recovered tokens restore exactly the
# missing mass.
CHI_P = [0.05, 0.15, 0.30, 0.50, 0.00]
CHI_Q = [0.40, 0.30, 0.20, 0.00, 0.10]
CHI_DRAWS = 400
BATCH_SIZES = [1, 2, 3, 4, 5, 7, 8, 16, 17, 32, 33, 64]  # random_invariance's batches


# -- ch32.1 ----------------------------------------------------------------------------------------------------------


@hidden("ch32.1", "random verifications: exact agreement with the given uniforms and noise")
def random_verifications(t: Trial) -> None:
    for i in range(40):
        c = random_case(t, t.random.randint(1, 8), t.random.choice([2, 3, 5, 17, 64, 500]))
        run_verify(t, c, case=tr("random case {i}", i=i + 1))


@hidden("ch32.1", "chi-square: the first emitted token of 400 verifications follows the target")
def first_token_distribution(t: Trial) -> None:
    V, k, n = len(CHI_P), 2, CHI_DRAWS
    p0, q0 = torch.tensor(CHI_P, dtype=torch.float64), torch.tensor(CHI_Q, dtype=torch.float64)
    # Position 0 is the instance; position 1 and the bonus row are random (they cannot change the first token).
    q = torch.cat([q0.expand(n, 1, V), torch.randn(n, k - 1, V, generator=t.rng, dtype=torch.float64).softmax(-1)], 1)
    p = torch.cat([p0.expand(n, 1, V), torch.randn(n, k, V, generator=t.rng, dtype=torch.float64).softmax(-1)], 1)
    drafts = torch.multinomial(q.reshape(-1, V), 1, generator=t.rng).reshape(n, k)
    u, e = torch.rand(n, k, generator=t.rng), torch.empty(n, k + 1, V).exponential_(generator=t.rng)
    firsts, cases = [], []
    for d in range(n):
        c = Case(drafts[d].tolist(), q[d].float(), p[d].float(), u[d], e[d])
        got = t.yours.verify_draft(*c.args())
        if type(got) not in (list, tuple) or not got or type(got[0]) is not int or not 0 <= got[0] < V:
            expect_emitted(got, c, simulate(c), case=tr("chi-square draw"))  # explains the structure problem
        firsts.append(got[0])
        cases.append(c)
    counts = torch.bincount(torch.tensor(firsts), minlength=V)
    live = p0 > 0
    stat, limit = chi2(counts, p0), chi2_threshold(int(live.sum()) - 1)
    if stat <= limit:
        return
    sd = (CHI_DRAWS * p0 * (1 - p0)).sqrt()
    off = (counts.double() - CHI_DRAWS * p0).abs() / sd.clamp_min(1e-12)
    off[~live] = torch.where(counts[~live] > 0, torch.inf, 0.0)
    j = int(off.argmax())
    lines = [
        tr(
            'case "chi-square": {n} verifications of k = 2 drafts, position 0 always with q_0 = {q}, p_0 = {p}, drafts drawn '
            "from q_0, uniforms and noise from the grading seed",
            n=CHI_DRAWS,
            q=vec(CHI_Q),
            p=vec(CHI_P),
        ),
        tr("the first emitted token must be distributed as p_0 (lossless); counts {counts}", counts=counts.tolist()),
        tr(
            "token {j} was emitted {n} times; expected N·p_0({j}) = {want} ± {sd}",
            j=j,
            n=int(counts[j]),
            want=fmt(CHI_DRAWS * CHI_P[j], 4),
            sd=fmt(float(sd[j]), 3),
        )
        if CHI_P[j] > 0
        else tr(
            "token {j} was emitted {n} times; expected N·p_0({j}) = {want} (the target never emits it)",
            j=j,
            n=int(counts[j]),
            want=fmt(CHI_DRAWS * CHI_P[j], 4),
        ),
        tr(
            "chi-square = {stat} > {limit}, a level a lossless verifier exceeds with probability < 1e-06",
            stat=fmt(stat, 5),
            limit=fmt(limit, 4),
        ),
    ]
    right = [simulate(c)[0] for c in cases]
    for name in VARIANTS:
        alt = [simulate(c, **VARIANT_KNOBS[name])[0] for c in cases]
        share = sum(a == y for a, y in zip(alt, firsts)) / CHI_DRAWS
        if share >= 0.9 and sum(a == r for a, r in zip(alt, right)) / CHI_DRAWS < 0.9:
            raise CheckFailed(
                *lines,
                tr(
                    "likely cause: your first tokens are those of '{name}' on {share}% of the draws",
                    name=tr(name),
                    share=fmt(100 * share, 3),
                ),
                hint=variant_hint(name),
            )
    raise CheckFailed(*lines)


@hidden("ch32.1", "edge cases: k = 0, q = p, disjoint supports, p(x) = 0 with u = 0, q(x) = 0, zero noise")
def edge_cases(t: Trial) -> None:
    V = 6
    run_verify(
        t,
        make_case([], [], [distribution(t, V).tolist()], [], [[1.3, 0.2, 0.9, 1.1, 0.5, 2.0]]),
        case=tr('case "k = 0": no drafts, only the bonus token'),
    )
    same = torch.stack([distribution(t, V) for _ in range(4)])
    tokens = [int(torch.multinomial(same[i], 1, generator=t.rng)) for i in range(3)]
    run_verify(
        t,
        make_case(tokens, same[:3].tolist(), same.tolist(), [0.9999, 0.5, 0.99], torch.empty(4, V).exponential_(generator=t.rng).tolist()),
        case=tr('case "q = p": every draft accepted whatever u'),
    )
    p, q = [0.5, 0.3, 0.2, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.3, 0.3, 0.4]
    for token in (3, 5):
        run_verify(
            t,
            make_case([token, 1], [q, q], [p, p, p], [0.0, 0.1], torch.empty(3, V).exponential_(generator=t.rng).tolist()),
            case=tr('case "disjoint supports": draft {token} has p = 0, always rejected', token=token),
        )
    run_verify(
        t,
        make_case(
            [2], [[0.2, 0.2, 0.6, 0, 0, 0]], [[0.5, 0.5, 0, 0, 0, 0], [1 / 6] * 6], [0.0], [[1.0, 0.5, 1.0, 1.0, 1.0, 1.0], [1.0] * 6]
        ),
        case=tr('case "p(x) = 0, u = 0": u < min(1, 0 / 0.6) is false, so the draft is rejected'),
    )
    run_verify(
        t,
        make_case(
            [4], [[0.5, 0.5, 0, 0, 0, 0]], [[0.2, 0.2, 0.2, 0.1, 0.2, 0.1], [1 / 6] * 6], [0.3], [[1.0, 1.0, 1.0, 0.4, 2.0, 3.0], [1.0] * 6]
        ),
        case=tr('case "q(x) = 0": a draft the drafter could not have proposed is rejected'),
    )
    run_verify(
        t,
        make_case(
            [0], [[0.7, 0.3, 0, 0, 0, 0]], [[0.2, 0.3, 0.5, 0, 0, 0], [1 / 6] * 6], [0.8], [[1.0, 1.0, 2.0, 0.5, 0.5, 0.0], [1.0] * 6]
        ),
        case=tr('case "zero noise": E = 0 on token 5, whose weight max(0, p − q) is 0 (0 / 0 if unclamped)'),
    )


@hidden("ch32.1", "Qwen3's vocabulary: 151,936 tokens per row")
def real_vocab(t: Trial) -> None:
    run_verify(t, random_case(t, 3, QWEN3_VOCAB), case=tr('case "Qwen3 vocabulary"'))


@hidden("ch32.1", "float64 and float16 probabilities; float16 scores p / E beyond float16's range")
def dtypes(t: Trial) -> None:
    for dtype in (torch.float64, torch.float16):
        for i in range(6):
            c = random_case(t, t.random.randint(1, 5), 7, dtype=dtype)
            while not separated(c):
                c = random_case(t, c.k, 7, dtype=dtype)
            run_verify(t, c, case=tr('case "{dtype}" {i}', dtype=str(dtype)[6:], i=i + 1))
    # Exp(1) noise below 1e-5 comes up about once a row over Qwen3's 151,936 tokens. In float32 the scores below are
    # 1e5 and 1.5e5 (or 1.25e5 and 1.67e5); in float16 both are inf (above 65504) and the lower index would win.
    run_verify(
        t,
        make_case([2], [[0.1, 0.1, 0.7, 0.1]], [[0.3, 0.4, 0.2, 0.1], [0.25] * 4], [0.9], [[2e-6, 2e-6, 1, 1], [1] * 4], torch.float16),
        case=tr('case "float16, tiny noise": the recovered token races max(0, p − q) = (0.2, 0.3, 0, 0) with noise (2e-6, 2e-6, 1, 1)'),
    )
    run_verify(
        t,
        make_case([], [], [[0.25, 0.5, 0.25]], [], [[2e-6, 3e-6, 1.0]], torch.float16),
        case=tr('case "float16, tiny noise": the bonus token races p = (0.25, 0.5, 0.25) with noise (2e-6, 3e-6, 1)'),
    )


# -- ch32.2 ----------------------------------------------------------------------------------------------------------


@hidden("ch32.2", "random confidences and thresholds, as tensors and lists")
def random_counts(t: Trial) -> None:
    for i in range(40):
        k = t.random.randint(0, 12)
        conf = (1 - torch.rand(k, generator=t.rng) ** t.random.choice([1, 3, 8])).to(t.random.choice([torch.float32, torch.float64]))
        th = far_threshold(t, conf.double().tolist())
        arg = conf if t.random.random() < 0.7 else conf.double().tolist()
        run_count(t, arg, th, case=tr("random case {i}: k = {k}", i=i + 1, k=k))


@hidden("ch32.2", "edge cases: threshold 0 and 1, confidences of 1 and 0")
def count_edges(t: Trial) -> None:
    run_count(t, torch.rand(7, generator=t.rng), 0.0, case=tr('case "threshold 0": everything is verified'))
    run_count(t, torch.ones(5), 1.0, case=tr('case "all 1, threshold 1": survivals stay exactly 1'))
    run_count(t, torch.tensor([1.0, 1.0, 0.99, 1.0]), 1.0, case=tr('case "threshold 1": the first c < 1 stops'))
    run_count(t, torch.tensor([0.9, 0.0, 1.0, 1.0]), 1e-9, case=tr('case "a zero confidence": the survival drops to 0'))
    run_count(t, [1, 1, 0.5], 0.5, case=tr('case "ints in a list": [1, 1, 0.5], threshold 0.5'))


@hidden("ch32.2", "long drafts: k = 256 with a slowly falling survival")
def long_drafts(t: Trial) -> None:
    conf = 1 - torch.rand(256, generator=t.rng, dtype=torch.float64) * 0.02
    run_count(t, conf, far_threshold(t, conf.tolist(), 1e-4) or 0.05, case=tr('case "long": k = 256, each c in (0.98, 1]'))


# -- ch32.3 ----------------------------------------------------------------------------------------------------------


@hidden("ch32.3", "random shapes: every row keeps its bits across 12 batch sizes, positions and neighbours")
def random_invariance(t: Trial) -> None:
    for i in range(3):
        K, N = t.random.choice([7, 64, 100, 257]), t.random.choice([1, 16, 33])
        pool, w = torch.randn(64, K, generator=t.rng), torch.randn(K, N, generator=t.rng)
        run_invariance(t, pool, w, random_batches(t, 64), case=tr("random case {i}: K = {K}, N = {N}, float32", i=i + 1, K=K, N=N))


@hidden("ch32.3", "a decode batch growing from 1 to 16 requests at Qwen3-0.6B's hidden size")
def growing_decode_batch(t: Trial) -> None:
    pool = torch.randn(16, QWEN3_HIDDEN, generator=t.rng) * 0.5
    w = torch.randn(QWEN3_HIDDEN, 48, generator=t.rng) * QWEN3_HIDDEN**-0.5
    run_invariance(
        t,
        pool,
        w,
        [list(range(B)) for B in (1, 2, 3, 4, 6, 8, 12, 16)],
        case=tr('case "decode batch": K = {K}, N = 48, request 0 joined by 1 … 15 others', K=QWEN3_HIDDEN),
    )


@hidden("ch32.3", "float64, bfloat16 and float16: output dtype, values and bitwise invariance")
def invariance_dtypes(t: Trial) -> None:
    for dtype in (torch.float64, torch.bfloat16, torch.float16):
        K, N = t.random.choice([48, 200]), t.random.choice([8, 24])
        pool = torch.randn(40, K, generator=t.rng).to(dtype)
        w = (torch.randn(K, N, generator=t.rng) * K**-0.5).to(dtype)
        run_invariance(t, pool, w, random_batches(t, 40), case=tr('case "{dtype}": K = {K}, N = {N}', dtype=str(dtype)[6:], K=K, N=N))


@hidden("ch32.3", "views: w as the transpose of a [N, K] weight, x a strided slice; empty and K = 0 shapes")
def views_and_edges(t: Trial) -> None:
    W = torch.randn(20, 72, generator=t.rng)  # nn.Linear stores [out, in]; x @ W.T is a view
    big = torch.randn(30, 72, generator=t.rng)
    run_invariance(
        t,
        big,
        W.T,
        [[0], list(range(0, 30, 3)), list(range(30))],
        case=tr('case "views": w = W.T for W [20, 72], rows of a [30, 72] batch'),
    )
    x = big[::3]
    want = t.ref.batch_invariant_matmul(x, W.T)
    expect_invariant(
        [expect_product(t.yours.batch_invariant_matmul(x, W.T), x, W.T, case=tr('case "strided x": big[::3]'))],
        x,
        W.T,
        [list(range(x.shape[0]))],
        case=tr('case "strided x": big[::3]'),
        wants=[want],
    )
    for B, K, N in ((0, 5, 3), (4, 0, 3), (2, 3, 0)):
        a, b = torch.randn(B, K, generator=t.rng), torch.randn(K, N, generator=t.rng)
        run_invariance(
            t, a, b, [list(range(B))], case=tr('case "empty": B = {B}, K = {K}, N = {N} (K = 0 sums nothing: zeros)', B=B, K=K, N=N)
        )


@hidden("ch32.3", "float32 terms of very different sizes: any other grouping of the sum rounds differently")
def wide_terms(t: Trial) -> None:
    K = t.random.choice([300, 1024, 1500])
    scale = torch.logspace(-3, 3, K)[torch.randperm(K, generator=t.rng)]
    pool = torch.randn(24, K, generator=t.rng) * scale
    w = torch.randn(K, 12, generator=t.rng)
    run_invariance(t, pool, w, random_batches(t, 24)[:6], case=tr('case "wide terms": K = {K}, terms from 1e-3 to 1e3', K=K))


# -- ch32.4 ----------------------------------------------------------------------------------------------------------


@hidden("ch32.4", "batch invariance, random hidden sizes and blocks: every row keeps its bits across 12 batch sizes")
def rms_random(t: Trial) -> None:
    for i in range(3):
        H, block = t.random.choice([7, 40, 100, 257, 512]), t.random.choice([2, 4, 8, 16, 64, 256])
        pool = torch.randn(64, H, generator=t.rng) * t.random.choice([0.01, 1.0, 30.0])
        weight = torch.randn(H, generator=t.rng)
        run_rms(
            t,
            pool,
            weight,
            t.random.choice([1e-6, 1e-5]),
            block,
            random_batches(t, 64),
            case=tr("random case {i}: H = {H}, block = {block}, float32", i=i + 1, H=H, block=block),
            order=False,
        )


@hidden("ch32.4", "batch invariance at Qwen3's hidden sizes with vLLM's block of 1024: a decode batch growing from 1 to 16")
def rms_qwen3(t: Trial) -> None:
    for H in (QWEN3_HIDDEN, 2560):
        pool = torch.randn(16, H, generator=t.rng)
        weight = 1 + 0.1 * torch.randn(H, generator=t.rng)
        run_rms(
            t,
            pool,
            weight,
            1e-6,
            1024,
            [list(range(B)) for B in (1, 2, 3, 4, 6, 8, 12, 16)],
            case=tr('case "Qwen3": H = {H}, block = 1024, request 0 joined by 1 … 15 others', H=H),
            order=False,
        )


@hidden("ch32.4", "batch invariance in each dtype (float64, bfloat16, float16): output dtype, values, every row's bits across batches")
def rms_dtypes(t: Trial) -> None:
    for dtype in (torch.float64, torch.bfloat16, torch.float16):
        H, block = t.random.choice([48, 200]), t.random.choice([8, 32])
        pool = torch.randn(40, H, generator=t.rng).to(dtype)
        weight = (1 + 0.3 * torch.randn(H, generator=t.rng)).to(dtype)
        run_rms(
            t,
            pool,
            weight,
            1e-6,
            block,
            random_batches(t, 40),
            case=tr('case "{dtype}": H = {H}, block = {block}', dtype=str(dtype)[6:], H=H, block=block),
            order=False,
        )


@hidden("ch32.4", "the fixed split's bits: random sizes, blocks and dtypes, Qwen3-4B's 2560 in chunks of 1024, edge rows")
def rms_order(t: Trial) -> None:
    for i in range(4):
        dtype = [torch.float32, torch.float64, torch.bfloat16, torch.float16][i]
        H, block = t.random.choice([7, 40, 100, 257, 512]), t.random.choice([2, 4, 8, 16, 64, 256])
        pool = (torch.randn(6, H, generator=t.rng) * t.random.choice([0.01, 1.0, 30.0])).to(dtype)
        weight = (1 + 0.3 * torch.randn(H, generator=t.rng)).to(dtype)
        case = tr('case "order {i}": H = {H}, block = {block}, {dtype}', i=i + 1, H=H, block=block, dtype=str(dtype)[6:])
        run_rms(t, pool, weight, t.random.choice([1e-6, 1e-5]), block, [list(range(6)), [t.random.randrange(6)]], case=case)
    pool, weight = torch.randn(4, 2560, generator=t.rng), 1 + 0.1 * torch.randn(2560, generator=t.rng)
    case = tr('case "Qwen3-4B": H = 2560, block = 1024 (chunks 1024, 1024, 512 + 512 zeros)')
    run_rms(t, pool, weight, 1e-6, 1024, [[0], list(range(4))], case=case)
    pool = torch.randn(10, 50, generator=t.rng)
    pool[2] = 0
    pool[5, 17] = 1e4
    weight = torch.randn(50, generator=t.rng)
    run_rms(
        t,
        pool,
        weight,
        1e-5,
        16,
        [[2], [5], list(range(10)), [9, 5, 2]],
        case=tr('case "edges": a zero row, a row with one entry of 1e4, H = 50, block = 16'),
    )
    big = torch.randn(30, 33, generator=t.rng)
    x, w = big[::3], torch.randn(33, generator=t.rng)
    run_rms(t, x, w, 1e-6, 4, [list(range(x.shape[0]))], case=tr('case "strided x": big[::3], H = 33, block = 4'))


# -- helpers: random cases from the grading seed ---------------------------------------------------------------------


def distribution(t: Trial, V: int, *, sparse: float = 0.0) -> torch.Tensor:
    """A random probability row (float64), some entries exactly 0 when sparse > 0."""
    row = (torch.randn(V, generator=t.rng, dtype=torch.float64) * t.random.choice([0.5, 1.5, 3.0])).softmax(-1)
    if sparse:
        row[torch.rand(V, generator=t.rng) < sparse] = 0
        row[t.random.randrange(V)] += 0.1
    return row / row.sum()


def random_case(t: Trial, k: int, V: int, dtype=torch.float32) -> Case:
    """Drafts drawn from q, target rows random: near q (mostly accepted), unrelated, sparse, or equal to q."""
    q = (
        torch.stack([distribution(t, V, sparse=t.random.choice([0.0, 0.0, 0.5])) for _ in range(k)])
        if k
        else torch.zeros(0, V, dtype=torch.float64)
    )
    rows = []
    for i in range(k + 1):
        kind = t.random.choice(["near", "other", "same"]) if i < k else "other"
        if kind == "near":
            row = q[i] * torch.exp(0.5 * torch.randn(V, generator=t.rng, dtype=torch.float64)) + 1e-3 / V
            rows.append(row / row.sum())
        elif kind == "same":
            rows.append(q[i].clone())
        else:
            rows.append(distribution(t, V, sparse=t.random.choice([0.0, 0.3])))
    p = torch.stack(rows)
    tokens = [int(torch.multinomial(q[i], 1, generator=t.rng)) for i in range(k)]
    u = torch.rand(k, generator=t.rng)
    e = torch.empty(k + 1, V).exponential_(generator=t.rng)
    return Case(tokens, q.to(dtype), p.to(dtype), u, e)


def separated(c: Case, margin: float = 0.01) -> bool:
    """No verdict and no race of c within `margin` (relative) of a tie, so any float precision agrees."""
    p, q, e = c.p.double(), c.q.double(), c.e.double()
    for i in range(c.k + 1):
        weights = (p[i] - q[i]).clamp_min(0) if i < c.k else p[i]
        top = (weights / e[i]).topk(min(2, weights.numel())).values
        if top.numel() == 2 and float(top[1]) > float(top[0]) * (1 - margin):
            return False
        if i < c.k:
            x = c.tokens[i]
            ratio = min(1.0, float(p[i, x] / q[i, x]))
            if abs(float(c.u[i]) - ratio) < margin:
                return False
    return True


def far_threshold(t: Trial, conf: list[float], margin: float = 1e-6) -> float:
    """A threshold in (0, 1) no survival comes within `margin` (relative) of, so float32 or float64 agree."""
    s, surv = 1.0, []
    for c in conf:
        s *= c
        surv.append(s)
    for _ in range(100):
        th = t.random.choice([t.random.uniform(0, 1), 10 ** t.random.uniform(-4, 0)])
        if all(abs(v - th) > margin * th for v in surv):
            return th
    return 0.0


def random_batches(t: Trial, pool: int) -> list[list[int]]:
    """Batches of every size in BATCH_SIZES (random rows, random order), and each of 4 rows alone."""
    batches = [torch.randperm(pool, generator=t.rng)[:B].tolist() for B in BATCH_SIZES if B <= pool]
    return batches + [[r] for r in torch.randperm(pool, generator=t.rng)[:4].tolist()]
