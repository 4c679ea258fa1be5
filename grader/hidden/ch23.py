"""Hidden checks of ch23 · sampling: random batches from the grading seed, a chi-square test, edge cases."""

from __future__ import annotations

import torch

from grader.authoring import CheckFailed, Trial, hidden, vec
from grader.checks.ch23 import NEG_INF, expect_distribution, expect_in_vocab, expect_processed, expect_tokens, race_scores
from grader.hidden.ch23_models import HALF, half_race
from grader.i18n import tr

QWEN3_VOCAB = 151_936
CHI_LOGITS, CHI_T, CHI_DRAWS = [1.0, 0.2, -0.5, 2.0, 0.0, -1.5], 0.7, 20_000
CLOSE_ROWS = 6  # half_logits: rows that only a race in float32 draws right
MARGIN = 1e-4  # random top_p values stay this far from every row's cumulative masses (no float coin flips)


# -- ch23.1 process_logits ------------------------------------------------------------------------


@hidden("ch23.1", "random batches with per-row top_k and top_p")
def random_batches(t: Trial) -> None:
    for i in range(24):
        B, V = t.random.randint(1, 8), t.random.randint(2, 64)
        logits, temp = random_logits(t, B, V)
        k_mode, p_mode = t.random.choice(["none", "int", "rows"]), t.random.choice(["none", "float", "rows"])
        top_k: int | torch.Tensor | None
        top_p: float | torch.Tensor | None
        if k_mode == "int":
            top_k = t.random.randint(1, V)
        elif k_mode == "rows":
            top_k = torch.randint(1, V + 1, (B,), generator=t.rng)
            top_k[t.random.randrange(B)] = V
        else:
            top_k = None
        if p_mode == "float":
            top_p = safe_shared_top_p(t, logits, temp, top_k)
        elif p_mode == "rows":
            ps = safe_top_p(t, logits, temp, top_k, list(range(B)))
            ps[t.random.randrange(B)] = 1.0
            top_p = torch.tensor(ps)
        else:
            top_p = None
        got = t.yours.process_logits(logits, temp, top_k, top_p)
        k_what = {"none": tr("no top_k"), "int": f"top_k = {top_k}", "rows": tr("top_k per row")}[k_mode]
        p_what = {"none": tr("no top_p"), "float": f"top_p = {top_p}", "rows": tr("top_p per row")}[p_mode]
        case = tr("random case {i}: B = {B}, V = {V}, {k_what}, {p_what}", i=i + 1, B=B, V=V, k_what=k_what, p_what=p_what)
        expect_processed(t, got, logits, temp, top_k, top_p, case=case)


@hidden("ch23.1", "k = 1 leaves only the row max; k = V and p = 1 change nothing but the temperature")
def extreme_settings(t: Trial) -> None:
    B, V = 5, 17
    logits, temp = random_logits(t, B, V)
    got = t.yours.process_logits(logits, temp, 1)
    mine = expect_processed(t, got, logits, temp, 1, case=tr('case "top_k = 1": only each row\'s largest entry stays'))
    if not bool(((mine != NEG_INF).sum(-1) == 1).all()):
        raise CheckFailed(tr("top_k = 1 must leave exactly one finite entry per row"))
    for top_k, top_p, label in (
        (V, None, f"top_k = V = {V}"),
        (None, 1.0, "top_p = 1.0"),
        (torch.full((B,), V), torch.ones(B), tr("per-row top_k = V and top_p = 1")),
        (V, 1.0, tr("top_k = {V} and top_p = 1.0", V=V)),
    ):
        got = t.yours.process_logits(logits, temp, top_k, top_p)
        expect_processed(
            t,
            got,
            logits,
            temp,
            top_k,
            top_p,
            want=t.ref.process_logits(logits, temp),
            case=tr('case "{label}": nothing is filtered, the result is logits / T', label=label),
        )


@hidden("ch23.1", "exact top-p boundaries: n = 2, 4, 8 or 16 equal entries, top_p = j / n, after top-k or among −∞")
def topp_exact_boundaries(t: Trial) -> None:
    # The running masses of n = 2^m equal entries are j / n, exact in float32, as is 1 − top_p: the entry whose mass
    # equals 1 − top_p goes (≤). The other entries are smaller ones that top-k removes, or −∞ (already filtered).
    for i in range(8):
        B, V = t.random.randint(1, 4), t.random.choice([16, 24, 40])
        logits, ks, ps = torch.empty(B, V), [], []
        for b in range(B):
            n = t.random.choice([2, 4, 8, 16])
            row = torch.randn(V, generator=t.rng) * 0.5 - 6  # all below the equal entries
            if t.random.random() < 0.5:
                ks.append(n)
            else:
                ks.append(V)
                row[:] = NEG_INF  # the others already filtered
            row[torch.randperm(V, generator=t.rng)[:n]] = round(t.random.uniform(-1.0, 2.0), 2)
            logits[b] = row
            ps.append(t.random.randint(1, n - 1) / n)
        temp = torch.rand(B, generator=t.rng) * 1.7 + 0.3
        top_k, top_p = torch.tensor(ks), torch.tensor(ps)
        got = t.yours.process_logits(logits, temp, top_k, top_p)
        expect_processed(
            t,
            got,
            logits,
            temp,
            top_k,
            top_p,
            case=tr("boundary case {i}: B = {B}, V = {V}, top_k = {ks}, top_p = {ps}", i=i + 1, B=B, V=V, ks=ks, ps=ps),
        )


@hidden("ch23.1", "Qwen3's vocabulary: 151,936 logits per row")
def real_vocab(t: Trial) -> None:
    logits, temp = random_logits(t, 2, QWEN3_VOCAB)
    top_k = torch.tensor([50, 1000])
    top_p = torch.tensor(safe_top_p(t, logits, temp, top_k, [0, 1]))
    got = t.yours.process_logits(logits, temp, top_k, top_p)
    expect_processed(
        t,
        got,
        logits,
        temp,
        top_k,
        top_p,
        case=tr('case "Qwen3 vocabulary": B = 2, V = {V}, top_k = [50, 1000], top_p = {p}', V=QWEN3_VOCAB, p=vec(top_p)),
    )


# -- ch23.2 sample --------------------------------------------------------------------------------


@hidden("ch23.2", "random batches: exact agreement with the given noise")
def random_races(t: Trial) -> None:
    # one row 16 times: a sampler with its own randomness draws different tokens for equal rows
    logits, noise = torch.randn(1, 12, generator=t.rng), torch.empty(1, 12).exponential_(generator=t.rng)
    got = t.yours.sample(logits.repeat(16, 1), torch.ones(16), noise.repeat(16, 1))
    expect_tokens(got, logits.repeat(16, 1), torch.ones(16), noise.repeat(16, 1), case=tr("one row, repeated 16 times"))
    for i in range(24):
        B, V = t.random.randint(1, 16), t.random.randint(2, 300)
        logits = torch.randn(B, V, generator=t.rng) * t.random.choice([0.5, 1.0, 3.0])
        temp = torch.rand(B, generator=t.rng) * 2.9 + 0.1
        for b in range(B):
            if t.random.random() < 0.3:  # a processed row: some entries filtered to −∞
                drop = torch.rand(V, generator=t.rng) < 0.5
                drop[t.random.randrange(V)] = False
                logits[b, drop] = NEG_INF
        noise = torch.empty(B, V).exponential_(generator=t.rng)
        got = t.yours.sample(logits, temp, noise)
        expect_tokens(got, logits, temp, noise, case=tr("random case {i}: B = {B}, V = {V}", i=i + 1, B=B, V=V))


@hidden("ch23.2", "chi-square: 20000 races on one row follow softmax(logits / T)")  # 20000 = CHI_DRAWS
def chi_square(t: Trial) -> None:
    V = len(CHI_LOGITS)
    logits = torch.tensor([CHI_LOGITS]).expand(CHI_DRAWS, V).contiguous()
    temp = torch.full((CHI_DRAWS,), CHI_T)
    noise = torch.empty(CHI_DRAWS, V).exponential_(generator=t.rng)
    tokens = expect_in_vocab(t.yours.sample(logits, temp, noise), CHI_DRAWS, V)
    expect_distribution(
        tokens,
        CHI_LOGITS,
        CHI_T,
        noise,
        case=tr('case "chi-square": {n} rows of the same logits, T = {T}, Exp(1) noise from the grading seed', n=CHI_DRAWS, T=CHI_T),
    )


@hidden("ch23.2", "the race is not argmax(p): rows where a less likely token wins")
def not_argmax(t: Trial) -> None:
    logits = torch.randn(256, 5, generator=t.rng) * 1.5
    temp = torch.ones(256)
    noise = torch.empty(256, 5).exponential_(generator=t.rng)
    scores = logits.softmax(-1) / noise
    differ = scores.argmax(-1) != logits.argmax(-1)
    rows = differ.nonzero()[:, 0][:32]
    logits, temp, noise = logits[rows], temp[rows], noise[rows]
    got = t.yours.sample(logits, temp, noise)
    expect_tokens(got, logits, temp, noise, case=tr('case "not argmax": {n} rows on which the race and argmax(p) disagree', n=len(rows)))


@hidden("ch23.2", "noise 0 is clamped to 1e-10 (nano-vllm); a filtered token never wins")
def zero_noise(t: Trial) -> None:
    # Row 0: two zeros, the likelier token second: with the clamp, 0.6 / 1e-10 beats 0.3 / 1e-10;
    # unclamped, both are ∞ and argmax takes the first. Row 1: E = 0 on a filtered token: 0 / 1e-10 = 0,
    # unclamped 0 / 0 = NaN, which argmax would pick.
    logits = torch.stack([torch.tensor([0.3, 0.6, 0.1]).log(), torch.tensor([NEG_INF, 1.0, 0.5])])
    temp = torch.ones(2)
    noise = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 2.0]])
    got = t.yours.sample(logits, temp, noise)
    expect_tokens(
        got,
        logits,
        temp,
        noise,
        case=tr('case "zero noise": row 0 p = [0.3, 0.6, 0.1], E = [0, 0, 1]; row 1 logits [−∞, 1, 0.5], E = [0, 1, 2]'),
    )


@hidden("ch23.2", "bfloat16 and float16 logits, as a 16-bit LM head hands them over: the race runs in float32")
def half_logits(t: Trial) -> None:
    V, B = 32, 40
    for dtype in HALF:
        close = [close_race(t, dtype, V) for _ in range(CLOSE_ROWS)]
        logits = torch.cat(
            [torch.stack([c[0] for c in close]), (torch.randn(B, V, generator=t.rng) * t.random.choice([1.0, 3.0])).to(dtype)]
        )
        temp = torch.cat([torch.tensor([c[1] for c in close]), torch.rand(B, generator=t.rng) * 1.7 + 0.3])
        noise = torch.cat([torch.stack([c[2] for c in close]), torch.empty(B, V).exponential_(generator=t.rng)])
        got = t.yours.sample(logits, temp, noise)
        expect_tokens(
            got,
            logits,
            temp,
            noise,
            case=tr(
                'case "{dtype}": {rows} rows of {V} {dtype} logits; in rows 0 … {last} two tokens\' probabilities differ by '
                "less than {dtype} can tell, and float32 decides",
                dtype=str(dtype)[6:],
                rows=CLOSE_ROWS + B,
                V=V,
                last=CLOSE_ROWS - 1,
            ),
        )


@hidden("ch23.2", "Qwen3's vocabulary: 151,936 tokens per row")
def real_vocab_race(t: Trial) -> None:
    B = 3
    logits = torch.randn(B, QWEN3_VOCAB, generator=t.rng) * 2
    temp = torch.tensor([0.6, 0.8, 1.0])
    noise = torch.empty(B, QWEN3_VOCAB).exponential_(generator=t.rng)
    got = t.yours.sample(logits, temp, noise)
    expect_tokens(got, logits, temp, noise, case=tr('case "Qwen3 vocabulary": B = 3, V = {V}', V=QWEN3_VOCAB))


# -- helpers: random instances whose answers no float rounding decides ------------------------------


def close_race(t: Trial, dtype: torch.dtype, V: int) -> tuple[torch.Tensor, float, torch.Tensor]:
    """One row of `dtype` logits, its temperature and its noise, on which the race in float32 draws token b and the
    race in `dtype` (the noise in float32 or in `dtype`) draws token a < b: the two tokens' logits are one step of
    `dtype` apart, so their probabilities round to one `dtype` value, and b's noise is larger than a's by half the
    ratio of their probabilities. The others' noise is kept out of the way."""
    for _ in range(100):
        a, b = sorted(t.random.sample(range(V), 2))
        row = (torch.randn(V, generator=t.rng) * 0.5 - 3).to(dtype)
        row[a] = torch.tensor(t.random.uniform(0.1, 0.2)).to(dtype)
        row[b] = (row[a].view(torch.int16) + 1).view(dtype)  # the next value of dtype
        T = t.random.choice([0.5, 1.0, 2.0])  # a power of two: logits / T is exact in dtype too
        p = (row.float() / T).softmax(-1)
        noise = torch.empty(V).exponential_(generator=t.rng) * 0.5 + 0.5
        noise[a] = noise[a] + 0.5
        noise[b] = noise[a] * float(p[b] / p[a]) ** 0.5
        others = torch.ones(V, dtype=torch.bool)
        others[[a, b]] = False
        noise[others] = torch.maximum(noise[others], 4 * p[others] * noise[a] / p[a])
        right = int(race_scores(row[None], torch.tensor([T]), noise[None])[1].argmax())
        low = [int(half_race(row[None], torch.tensor([T]), noise[None], noise_too=n)) for n in (True, False)]
        if right == b and low == [a, a]:
            return row, T, noise
    raise AssertionError(f"no close race in {dtype} found in 100 tries")


# -- helpers: random instances whose answers no float rounding decides ------------------------------


def random_logits(t: Trial, B: int, V: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct logits and temperatures whose probabilities never underflow to 0 in float32.

    Small rows are Gaussian; a vocabulary-sized row uses the Gaussian quantiles of a random permutation of
    its ranks, because 151,936 float32 Gaussian draws contain exact ties, and where top-p cuts between tied
    entries the result depends on the sort order (vLLM's as much as anyone's).
    """
    scale = t.random.choice([0.5, 1.0, 3.0])
    if V <= 1024:
        logits = torch.randn(B, V, generator=t.rng) * scale
    else:
        ranks = torch.stack([torch.randperm(V, generator=t.rng) for _ in range(B)])
        logits = torch.special.ndtri((ranks.double() + 0.5) / V).float() * scale
    temp = torch.rand(B, generator=t.rng) * 1.7 + 0.3
    return logits, temp


def _masses(t: Trial, logits: torch.Tensor, temp: torch.Tensor, top_k) -> torch.Tensor:
    """Each row's cumulative masses in ascending order after top-k: top-p compares them with 1 − p."""
    after_k = t.ref.process_logits(logits, temp, top_k)
    return after_k.sort(dim=-1).values.softmax(-1).cumsum(-1).double().contiguous()


def _first_far(masses: torch.Tensor, candidates: list[float]) -> float:
    """The first candidate p such that no cumulative mass in `masses` lies within MARGIN of 1 − p (else 1.0)."""
    live = torch.cat([masses[masses > 0], torch.zeros(1, dtype=masses.dtype)])
    gaps = (live[:, None] - (1 - torch.tensor(candidates, dtype=masses.dtype))[None, :]).abs().amin(0)
    ok = (gaps > MARGIN).nonzero()
    return candidates[int(ok[0])] if len(ok) else 1.0


def safe_top_p(t: Trial, logits: torch.Tensor, temp: torch.Tensor, top_k, rows: list[int]) -> list[float]:
    """For each row, a top_p in (0.05, 0.99) that no cumulative mass of the row comes within MARGIN of
    (1.0, i.e. off, if none is found), so that float rounding never decides which token stays."""
    masses = _masses(t, logits, temp, top_k)
    out = []
    for b in rows:
        out.append(_first_far(masses[b], [round(t.random.uniform(0.05, 0.99), 3) for _ in range(50)]))
    return out


def safe_shared_top_p(t: Trial, logits: torch.Tensor, temp: torch.Tensor, top_k) -> float:
    masses = _masses(t, logits, temp, top_k)
    return _first_far(masses, [round(t.random.uniform(0.05, 0.99), 3) for _ in range(100)])
