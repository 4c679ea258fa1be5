"""Public checks of ch23 · sampling, and the messages they share with the hidden ones.

The tokens the classic wrong samplers draw and the exact-k reading of top-k come from the hidden side
(`race_variants`, `strict_top_k`), asked for before comparing. (`race_scores`, p and p / E of the race, stays
here: the lab draws and checks a student's own instance with it in a student release.)
"""

from __future__ import annotations

import math
from typing import Any

import torch

from grader.authoring import CheckFailed, Hint, Trial, expect_tensor, fmt, hidden_model, if_hidden, mistakes, public, vec, wrong_mask
from grader.i18n import language, mark, tr

NEG_INF = float("-inf")
ATOL, RTOL = 1e-6, 1e-5  # processed logits: one float32 rounding of logits / T
TIE = 1e-6  # a drawn token is accepted when its p / E is this close (relative) to the best
ALPHA = 1e-6  # a correct sampler fails a goodness-of-fit test with probability < ALPHA
CLAMP = 1e-10  # nano-vllm clamps the exponential noise to ≥ 1e-10
HALF_RACE = mark("the race in the logits' 16-bit dtype (never upcast to float32)")

race_variants = hidden_model("ch23_models.race_variants")
"""`t.ref.drive(race_variants, logits, temperature, noise)`: {wrong sampler: its tokens on the same noise}."""
strict_top_k = hidden_model("ch23_models.strict_top_k")
"""`t.ref.drive(strict_top_k, scaled, ks)`: top-k read as exactly k indices."""
strict_top_p = hidden_model("ch23_models.strict_top_p")
"""`t.ref.drive(strict_top_p, processed, ps)`: top-p read with < for ≤."""

# ch23-sampling-path: one row of 8 logits through temperature, top-k, top-p and the race.
PATH_LOGITS = [1.2, 3.0, -0.5, 2.2, 0.3, 2.6, -1.4, 1.7]
PATH_T, PATH_K, PATH_P = 0.8, 5, 0.8
PATH_NOISE = [0.9, 1.6, 2.1, 0.9, 1.1, 0.7, 0.3, 2.5]

# ch23-exponential-race: the instance of reference/nanovllm.md §13.
RACE_LOGITS, RACE_T, RACE_NOISE = [2.0, 1.0, 0.0], 0.5, [3.0, 0.05, 1.0]
RACE_DRAWS = 4000

M = mistakes("ch23")


# -- ch23.1 process_logits ------------------------------------------------------------------------


@public("ch23.1", "figure instance: one row of 8 logits, T = 0.8, top_k = 5, top_p = 0.8")
def path_instance(t: Trial) -> None:
    logits, temp = torch.tensor([PATH_LOGITS]), torch.tensor([PATH_T])
    stages: list[tuple[str, dict[str, Any]]] = [
        (tr("temperature only"), {}),
        (tr("temperature and top_k = {k}", k=PATH_K), {"top_k": PATH_K}),
        (tr("temperature, top_k = {k} and top_p = {p}", k=PATH_K, p=PATH_P), {"top_k": PATH_K, "top_p": PATH_P}),
    ]
    got, want = [], []
    for label, kw in stages:
        mine = t.yours.process_logits(logits, temp, **kw)
        got.append(expect_tensor(mine, what=tr("the processed logits ({label})", label=label), shape=[1, 8], dtype=torch.float32))
        want.append(t.ref.process_logits(logits, temp, **kw))
    after_k = want[1][0]
    q = after_k.softmax(-1)
    above = [float(q[after_k > after_k[i]].sum()) if after_k[i] != NEG_INF else NEG_INF for i in range(8)]
    probs, probs_expected = got[2][0].softmax(-1), want[2][0].softmax(-1)
    t.figure(
        "ch23-sampling-path",
        logits=PATH_LOGITS,
        T=PATH_T,
        k=PATH_K,
        p=PATH_P,
        scaled=got[0][0],
        scaled_expected=want[0][0],
        scaled_wrong=wrong_entries(got[0], want[0])[0],
        topk=got[1][0],
        topk_expected=want[1][0],
        topk_wrong=wrong_entries(got[1], want[1])[0],
        q=q,
        above=above,
        topp=got[2][0],
        topp_expected=want[2][0],
        topp_wrong=wrong_entries(got[2], want[2])[0],
        probs=probs,
        probs_expected=probs_expected,
        probs_wrong=wrong_entries(probs, probs_expected),
    )
    for (label, kw), mine, w in zip(stages, got, want):
        expect_processed(
            t, mine, logits, temp, kw.get("top_k"), kw.get("top_p"), want=w, case=tr('case "figure instance", {label}', label=label)
        )


@public("ch23.1", "each row is divided by its own temperature")
def per_row_temperature(t: Trial) -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [2.0, 1.0, 0.0, -1.0], [0.5, -0.5, 3.0, 1.5]])
    temp = torch.tensor([0.5, 2.0, 1.0])
    got = t.yours.process_logits(logits, temp)
    expect_processed(t, got, logits, temp, case=tr('case "per-row temperature": T = [0.5, 2, 1], no top-k, no top-p'))


@public("ch23.1", "top-k keeps every entry tied with the k-th largest; k per row")
def topk_ties(t: Trial) -> None:
    logits = torch.tensor([[3.0, 1.0, 1.0, 0.0, -2.0], [0.0, 4.0, 2.0, 2.0, 1.0], [5.0, 4.0, 3.0, 2.0, 1.0]])
    temp = torch.ones(3)
    k = torch.tensor([2, 1, 5])
    got = t.yours.process_logits(logits, temp, top_k=k)
    expect_processed(t, got, logits, temp, k, case=tr('case "top-k ties": top_k = [2, 1, 5] (per row), T = 1'))


@public("ch23.1", "top-p keeps the token that crosses p; p = 1 is off")
def topp_crossing(t: Trial) -> None:
    # Row 0: p = [0.5, 0.3, 0.2] (logits = log p); top_p = 0.6 keeps tokens 0 and 1: the tokens larger
    # than token 1 hold 0.5 < 0.6. Row 1: the same row with top_p = 1 keeps everything.
    logits = torch.tensor([[0.5, 0.3, 0.2], [0.5, 0.3, 0.2]]).log()
    temp = torch.ones(2)
    top_p = torch.tensor([0.6, 1.0])
    got = t.yours.process_logits(logits, temp, top_p=top_p)
    expect_processed(
        t, got, logits, temp, None, top_p, case=tr('case "top-p crossing": softmax = [0.5, 0.3, 0.2], top_p = [0.6, 1.0] (per row), T = 1')
    )


@public("ch23.1", "top-p on exact boundaries: an entry whose mass equals 1 − top_p is removed (≤)")
def topp_boundary(t: Trial) -> None:
    # Equal logits have probabilities 1/4 or 1/8, and their running masses and 1 − top_p are exact in float32. Row 0:
    # top_k = 4 leaves four equal entries, and top_p = 0.5 keeps two (the second holds exactly 1 − 0.5 with the
    # first); rows 1 and 2: eight equal entries, top_p = 0.25 keeps two, 0.75 keeps six; row 3: four of eight, 0.75
    # keeps three. Which of the equal entries go is the sort's choice, not graded.
    logits = torch.tensor([[2.0, -1.0, 2.0, 0.5, 2.0, -3.0, 2.0, 1.0], [0.3] * 8, [-1.2] * 8, [1.0, 1.0, 0.0, 1.0, -2.0, 0.0, 1.0, 0.5]])
    temp = torch.tensor([1.0, 0.7, 1.3, 1.0])
    top_k, top_p = torch.tensor([4, 8, 8, 4]), torch.tensor([0.5, 0.25, 0.75, 0.75])
    got = t.yours.process_logits(logits, temp, top_k, top_p)
    expect_processed(
        t,
        got,
        logits,
        temp,
        top_k,
        top_p,
        case=tr(
            'case "exact boundaries": 4 or 8 equal entries, top_k = [4, 8, 8, 4], top_p = [0.5, 0.25, 0.75, 0.75]: they keep 2, 2, 6, 3'
        ),
    )


@public("ch23.1", "bfloat16 logits give a new float32 tensor")
def bf16_logits(t: Trial) -> None:
    logits = torch.tensor([[1.5, -0.25, 0.75, 2.0], [0.0, 1.0, -1.0, 0.5]]).to(torch.bfloat16)
    temp = torch.tensor([0.6, 1.3])
    got = t.yours.process_logits(logits, temp, top_k=3, top_p=0.9)
    expect_processed(
        t,
        got,
        logits,
        temp,
        3,
        0.9,
        case=tr('case "bfloat16": the logits arrive in bfloat16 (as from the LM head); compute and return float32'),
    )


# -- ch23.2 sample --------------------------------------------------------------------------------


@public("ch23.2", "figure instance: logits [2, 1, 0], T = 0.5, noise [3.0, 0.05, 1.0]")
def race_instance(t: Trial) -> None:
    logits, temp, noise = torch.tensor([RACE_LOGITS]), torch.tensor([RACE_T]), torch.tensor([RACE_NOISE])
    got = t.yours.sample(logits, temp, noise)
    tokens = expect_in_vocab(got, 1, 3)
    p, scores = race_scores(logits, temp, noise)
    want, variants = t.ref.sample(logits, temp, noise), t.ref.drive(race_variants, logits, temp, noise)
    t.figure(
        "ch23-exponential-race",
        logits=RACE_LOGITS,
        T=RACE_T,
        noise=RACE_NOISE,
        p=p[0],
        scores=scores[0],
        token=int(tokens[0]),
        token_expected=int(want[0]),
    )
    expect_tokens(
        tokens, logits, temp, noise, case=tr('case "figure instance": the exponential race, token = argmax(p / E)'), variants=variants
    )


@public("ch23.2", "the sampling path's last step: the race on the processed row")
def path_draw(t: Trial) -> None:
    processed = t.ref.process_logits(torch.tensor([PATH_LOGITS]), torch.tensor([PATH_T]), PATH_K, PATH_P)
    temp, noise = torch.ones(1), torch.tensor([PATH_NOISE])
    got = t.yours.sample(processed, temp, noise)
    tokens = expect_in_vocab(got, 1, 8)
    p, scores = race_scores(processed, temp, noise)
    want, variants = t.ref.sample(processed, temp, noise), t.ref.drive(race_variants, processed, temp, noise)
    t.figure("ch23-sampling-path", noise=PATH_NOISE, race_p=p[0], race_scores=scores[0], token=int(tokens[0]), token_expected=int(want[0]))
    expect_tokens(
        tokens,
        processed,
        temp,
        noise,
        case=tr('case "sampling path": the processed row (filtered entries −∞), T = 1, noise {noise}', noise=vec(PATH_NOISE)),
        variants=variants,
    )


@public("ch23.2", "4000 races on [2, 1, 0] at T = 0.5 follow p")  # 4000 = RACE_DRAWS
def race_frequencies(t: Trial) -> None:
    logits = torch.tensor([RACE_LOGITS]).expand(RACE_DRAWS, 3).contiguous()
    temp = torch.full((RACE_DRAWS,), RACE_T)
    noise = torch.empty(RACE_DRAWS, 3).exponential_(generator=t.rng)
    tokens = expect_in_vocab(t.yours.sample(logits, temp, noise), RACE_DRAWS, 3)
    variants = t.ref.drive(race_variants, logits, temp, noise)
    t.figure("ch23-exponential-race", **frequencies_figure(tokens, RACE_LOGITS, RACE_T))
    expect_distribution(
        tokens,
        RACE_LOGITS,
        RACE_T,
        noise,
        case=tr('case "{n} races": one row, logits [2, 1, 0], T = 0.5, Exp(1) noise from a fixed seed', n=RACE_DRAWS),
        variants=variants,
    )


@public("ch23.2", "a batch: each row races with its own temperature and noise")
def batch_rows(t: Trial) -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0], [0.5, 0.3, 0.2], [1.0, 1.0, 4.0], [0.0, -1.0, 3.0]])
    temp = torch.tensor([0.5, 1.0, 2.0, 0.25])
    noise = torch.tensor([[0.2, 0.9, 1.4], [1.2, 0.2, 0.9], [0.1, 2.0, 3.5], [0.3, 0.01, 2.0]])
    got = t.yours.sample(logits, temp, noise)
    expect_tokens(
        got,
        logits,
        temp,
        noise,
        case=tr('case "batch": 4 rows, T = [0.5, 1, 2, 0.25]'),
        variants=t.ref.drive(race_variants, logits, temp, noise),
    )


# -- helpers: settings of a row -------------------------------------------------------------------


def ordinal(n: int) -> str:
    """ "3rd" in English; the bare number in Chinese, whose messages write 第 {kth} 大 around it."""
    if language() != "en":
        return str(n)
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _row_value(x, b: int, B: int):
    """Row b's setting of a per-row or batch-wide parameter (None when it is off)."""
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        return x.reshape(-1)[b if x.numel() == B else 0].item()
    return x


def row_setting(temperature: torch.Tensor, top_k, top_p, b: int, B: int, V: int) -> str:
    k, p = _row_value(top_k, b, B), _row_value(top_p, b, B)
    parts = [f"T = {fmt(float(temperature[b]))}"]
    if k is not None:
        parts.append(tr("top_k = {k} (= V, off)", k=k) if k == V else f"top_k = {k}")
    if p is not None:
        parts.append(tr("top_p = {p} (off)", p=fmt(p)) if p >= 1 else f"top_p = {fmt(p)}")
    return ", ".join(parts)


# -- helpers of ch23.1: processed logits, explained -------------------------------------------------


def expect_processed(
    t: Trial,
    got,
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k=None,
    top_p=None,
    *,
    case: str = "",
    want: torch.Tensor | None = None,
) -> torch.Tensor:
    """Require the student's processed logits to equal the reference's, explaining the first wrong entry."""
    B, V = logits.shape
    if want is None:
        want = t.ref.process_logits(logits, temperature, top_k, top_p)
    steps = reference_steps(t, logits, temperature, top_k, top_p)
    what = (
        tr("the processed logits of 1 row × {V} tokens", V=V) if B == 1 else tr("the processed logits of {B} rows × {V} tokens", B=B, V=V)
    )
    mine = expect_tensor(got, what=what, shape=[B, V], dtype=torch.float32)
    bad = wrong_entries(mine, want)
    if not bad.any() or only_ties_swapped(mine, want, steps["scaled"]):
        return mine
    b, j = (int(i) for i in bad.nonzero()[0])
    raise explain_processed(mine, want, steps, logits, temperature, top_k, top_p, b, j, case=case)


def reference_steps(t: Trial, logits: torch.Tensor, temperature: torch.Tensor, top_k, top_p) -> dict:
    """The reference's processed batch after each step and under each classic mistake, for the explanations.

    Computed for every row before comparing, whatever the answer (a student release replays t.ref in
    order): "scaled" (temperature only), "after k" (+ top-k), and the misreadings that `processed_hint`
    recognises: top-k with k ∓ 1, exactly k indices ("strict k"), top-p before top-k, top-p at T = 1 and
    at 1 / T, top-p with < for ≤ ("strict p").
    """
    B, V = logits.shape
    run = lambda x=logits, T=temperature, k=top_k, p=top_p: t.ref.process_logits(x, T, k, p)
    ones = torch.ones(B)
    steps = {"scaled": run(k=None, p=None)}
    steps["after k"] = steps["scaled"] if top_k is None else run(p=None)
    if top_k is not None:
        ks = [_row_value(top_k, b, B) for b in range(B)]
        steps["k - 1"] = run(k=torch.tensor([max(k - 1, 1) for k in ks]))
        steps["k + 1"] = run(k=torch.tensor([min(k + 1, V) for k in ks]))
        strict = t.ref.drive(strict_top_k, steps["scaled"], ks)
        steps["strict k"] = strict if top_p is None else run(strict, ones, None)
        if top_p is not None:
            steps["top-p first"] = run(run(k=None), ones, p=None)
    if top_p is not None:
        steps["T = 1"], steps["1 / T"] = run(T=ones), run(T=1 / temperature)
        steps["strict p"] = t.ref.drive(strict_top_p, steps["after k"], [_row_value(top_p, b, B) for b in range(B)])
    return steps


def only_ties_swapped(mine: torch.Tensor, want: torch.Tensor, scaled: torch.Tensor) -> bool:
    """Whether `mine` differs from `want` only in which of several equal entries top-p removed: in every row each
    finite entry is that entry's logits / T, every other entry is −∞, and the values kept are the same (as a
    multiset). Among equal entries the sort decides, so any choice is right."""
    keep_mine, keep_want = mine != NEG_INF, want != NEG_INF
    if bool(wrong_entries(mine[keep_mine], scaled[keep_mine]).any()) or bool((mine[~keep_mine] != NEG_INF).any()):
        return False
    for b in range(mine.shape[0]):
        kept = lambda keep: scaled[b][keep[b]].sort().values
        if not torch.equal(kept(keep_mine), kept(keep_want)):
            return False
    return True


def wrong_entries(mine: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Entries of the processed logits that differ beyond ATOL + RTOL·|want| (±∞ only matches itself)."""
    return wrong_mask(mine, want, atol=ATOL, rtol=RTOL)


def _kept(row: torch.Tensor) -> torch.Tensor:
    return row != NEG_INF


def explain_processed(
    mine: torch.Tensor,
    want: torch.Tensor,
    steps: dict,
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k,
    top_p,
    b: int,
    j: int,
    *,
    case: str = "",
) -> CheckFailed:
    B, V = logits.shape
    k, p = _row_value(top_k, b, B), _row_value(top_p, b, B)
    T = float(temperature[b])
    scaled, after_k = steps["scaled"][b], steps["after k"][b]
    setting, row_logits = row_setting(temperature, top_k, top_p, b, B, V), vec(logits[b])
    row = (
        tr("row {b} of {B} ({setting}): logits {logits}", b=b, B=B, setting=setting, logits=row_logits)
        if B > 1
        else tr("row {b} ({setting}): logits {logits}", b=b, setting=setting, logits=row_logits)
    )
    expected, yours = float(want[b, j]), float(mine[b, j])
    if want[b, j] != NEG_INF:
        reasons = [r for r in (_topk_reason(scaled, k, j, V), _topp_reason(after_k, k, p, j, want[b])) if r]
        fields = {"j": j, "logit": fmt(float(logits[b, j])), "T": fmt(T), "want": fmt(expected), "yours": fmt(yours)}
        if len(reasons) == 2:
            reasons = [tr("{first}; {second}", first=reasons[0], second=reasons[1])]
        token = (
            tr("token {j}: logits / T = {logit} / {T} = {want}; it stays: {reasons}; yours: {yours}", reasons=reasons[0], **fields)
            if reasons
            else tr("token {j}: logits / T = {logit} / {T} = {want}; yours: {yours}", **fields)
        )
    else:
        removed_by_k = k is not None and after_k[j] == NEG_INF
        reason = _topk_reason(scaled, k, j, V) if removed_by_k else _topp_reason(after_k, k, p, j, want[b])
        fields = {"j": j, "scaled": fmt(float(scaled[j])), "yours": fmt(yours)}
        token = (
            tr("token {j} (logits / T = {scaled}) should be −∞: {reason}; yours: {yours}", reason=reason, **fields)
            if reason
            else tr("token {j} (logits / T = {scaled}) should be −∞; yours: {yours}", **fields)
        )
    hint = processed_hint(mine[b], want[b], logits[b], T, b, k, p, j, {name: x[b] for name, x in steps.items()})
    return CheckFailed(case, row, token, hint=hint)


def _topk_reason(scaled: torch.Tensor, k, j: int, V: int) -> str:
    if k is None or k >= V:
        return ""
    kth = float(scaled.sort(descending=True).values[k - 1])
    v = float(scaled[j])
    fields = {"k": k, "v": fmt(v), "kth_value": fmt(kth), "kth": ordinal(k)}
    if v >= kth:
        return tr("top-k = {k} keeps it ({v} ≥ {kth_value}, the {kth} largest value of logits / T)", **fields)
    return tr("top-k = {k} removes it ({v} < {kth_value}, the {kth} largest value of logits / T)", **fields)


def _topp_reason(after_k: torch.Tensor, k, p, j: int, want: torch.Tensor) -> str:
    if p is None or p >= 1 or after_k[j] == NEG_INF:
        return ""
    q = after_k.softmax(-1)
    above = float(q[after_k > after_k[j]].sum())
    below = float(q[after_k <= after_k[j]].sum())
    first = (
        tr("after top-k its probability is {q}", q=fmt(float(q[j])))
        if k is not None
        else tr("its probability softmax(logits / T) is {q}", q=fmt(float(q[j])))
    )
    tied = after_k == after_k[j]
    if int(tied.sum()) > 1:
        n, kept = int(tied.sum()), int((tied & (want != NEG_INF)).sum())
        fields = {"first": first, "above": fmt(above), "rest": fmt(1 - p), "gone": n - kept, "kept": kept, "n": n}
        if n == 2:
            return tr(
                "{first}, as for 1 other equal entry; the larger tokens hold {above}; counted in the order of the sort, "
                "the running mass (the smaller entries included) stays ≤ 1 − top_p = {rest} over {gone} of the equal "
                "entries, which go, so top-p keeps {kept} of the {n} (which ones is the sort's choice)",
                **fields,
            )
        return tr(
            "{first}, as for {others} other equal entries; the larger tokens hold {above}; counted in the order of the "
            "sort, the running mass (the smaller entries included) stays ≤ 1 − top_p = {rest} over {gone} of the equal "
            "entries, which go, so top-p keeps {kept} of the {n} (which ones is the sort's choice)",
            others=n - 1,
            **fields,
        )
    if above < p:
        return tr("{first}; the larger tokens hold {above} < top_p = {p}, so top-p keeps it", first=first, above=fmt(above), p=fmt(p))
    return tr(
        "{first}; it and the smaller tokens hold {below} ≤ 1 − top_p = {rest} (the larger ones already hold {above} ≥ {p}), "
        "so top-p removes it",
        first=first,
        below=fmt(below),
        rest=fmt(1 - p),
        above=fmt(above),
        p=fmt(p),
    )


def processed_hint(mine: torch.Tensor, want: torch.Tensor, logits_row: torch.Tensor, T: float, b: int, k, p, j: int, steps: dict) -> str:
    """The misconception behind a wrong row of processed logits ('' when none fits); `steps` holds this
    row of `reference_steps`."""
    V = want.numel()
    mk, wk = _kept(mine), _kept(want)
    close = lambda a, c: math.isfinite(a) and abs(a - c) <= ATOL + RTOL * abs(c)
    yours = float(mine[j])
    if want[j] == NEG_INF and math.isfinite(yours) and yours < -1e4:
        return M.large_negative
    if math.isfinite(yours) and want[j] != NEG_INF:
        l = float(logits_row[j])
        if close(yours, l * T) and not close(yours, l / T):
            return M.temperature_multiplied
        if close(yours, l) and not close(yours, l / T):
            return M.temperature_ignored.format(b=b, T=fmt(T))
        if close(yours, float(want.softmax(-1)[j])):
            return M.probabilities
    if bool(torch.isfinite(mine).all()) and torch.allclose(mine, want.softmax(-1), atol=ATOL, rtol=RTOL):
        return M.probabilities  # the whole row is softmax of the processed logits (0 where filtered)
    if torch.equal(mk, wk):
        return ""
    kept = {name: _kept(row) for name, row in steps.items()}
    misreadings: list[tuple[str, str]] = []  # (name in `kept`, hint), tried in order
    if k is not None:
        for name, n, fits in (("k - 1", k - 1, k >= 2), ("k + 1", k + 1, k < V)):
            if fits:
                misreadings.append((name, M.topk_off_by_one.format(k=k, n=n, kth=ordinal(k))))
        if k < V:
            misreadings.append(("strict k", M.strict_k))
    if p is not None and p < 1:
        kept["crossing dropped"] = wk.clone()
        kept["crossing dropped"][torch.where(wk, want, torch.full_like(want, math.inf)).argmin()] = False
        misreadings.append(("crossing dropped", M.crossing_dropped))
        # < for ≤ differs from the reference only on an exact boundary, where it is the likeliest cause.
        misreadings.insert(0, ("strict p", M.topp_strict))
        if k is not None:
            misreadings.append(("top-p first", M.topp_first))
        misreadings += [("T = 1", M.topp_before_temperature), ("1 / T", M.temperature_multiplied)]
    return next((hint for name, hint in misreadings if not torch.equal(kept[name], wk) and torch.equal(kept[name], mk)), "")


# -- helpers of ch23.2: the exponential race, explained ------------------------------------------------


def race_scores(logits: torch.Tensor, temperature: torch.Tensor, noise: torch.Tensor):
    """p = softmax(logits / T) and the race's scores p / max(E, 1e-10), in float32."""
    p = (logits.float() / temperature.float()[:, None]).softmax(-1)
    return p, p / noise.float().clamp_min(CLAMP)


def race_hints() -> dict[str, Hint]:
    """The classic wrong samplers (as `race_variants` names their tokens), with the hint each one calls for."""
    return {
        "argmax(p)": M.argmax_p,
        "argmax(E / p)": M.noise_over_p,
        "argmax(p · E)": M.times_noise,
        mark("the race on softmax(logits · T)"): M.race_temperature_multiplied,
        mark("the race on softmax(logits) (temperature left out)"): M.race_temperature_ignored,
        "argmax((logits / T) / E)": M.race_logits,
        mark("the race with unclamped noise"): M.unclamped,
        HALF_RACE: M.no_upcast,
    }


def expect_in_vocab(got, B: int, V: int, *, case: str = "") -> torch.Tensor:
    what = tr("the drawn tokens of 1 row") if B == 1 else tr("the drawn tokens of {B} rows", B=B)
    tokens = expect_tensor(got, what=what, shape=[B], dtype=torch.int64)
    out = ((tokens < 0) | (tokens >= V)).nonzero()
    if len(out):
        b = int(out[0])
        raise CheckFailed(case, tr("row {b}: token {token} is not in the vocabulary 0 … {last}", b=b, token=int(tokens[b]), last=V - 1))
    return tokens


def expect_tokens(
    got, logits: torch.Tensor, temperature: torch.Tensor, noise: torch.Tensor, *, case: str = "", variants: dict | None = None
) -> torch.Tensor:
    """Require the student's tokens to win the race with the given noise (near-ties of p / E accepted).
    `variants` is `race_variants`' answer (asked of the hidden side when not given; a student release's lab
    then names no wrong sampler)."""
    B, V = logits.shape
    tokens = expect_in_vocab(got, B, V, case=case)
    p, scores = race_scores(logits, temperature, noise)
    best = scores.max(-1).values
    ok = scores.gather(1, tokens[:, None])[:, 0] >= best * (1 - TIE)
    if bool(ok.all()):
        return tokens
    b = int((~ok).nonzero()[0])
    w, y = int(scores[b].argmax()), int(tokens[b])
    E = noise[b].float()
    fields = {"b": b, "T": fmt(float(temperature[b])), "logits": vec(logits[b]), "noise": vec(E)}
    lines = [
        case,
        tr("row {b} of {B}: T = {T}, logits {logits}, noise E {noise}", B=B, **fields)
        if B > 1
        else tr("row {b}: T = {T}, logits {logits}, noise E {noise}", **fields),
    ]
    if V <= 8:
        lines.append(f"p = softmax(logits / T) = {vec(p[b])}; p / E = {vec(scores[b])}")
    lines.append(
        tr(
            "the largest p / E is token {w}'s: {pw} / {ew} = {sw}, so the race draws token {w}; yours: token {y} "
            "(p / E = {py} / {ey} = {sy})",
            w=w,
            pw=fmt(float(p[b, w])),
            ew=fmt(float(E[w])),
            sw=fmt(float(scores[b, w])),
            y=y,
            py=fmt(float(p[b, y])),
            ey=fmt(float(E[y])),
            sy=fmt(float(scores[b, y])),
        )
    )
    # The wrong sampler that explains this row and agrees with the most other rows.
    variants = variants if variants is not None else if_hidden(race_variants, logits, temperature, noise)
    hint: str = ""
    if variants is not None:
        fits = [
            (int((variants[name] == tokens).sum()), -i, h)
            for i, (name, h) in enumerate(race_hints().items())
            if int(variants[name][b]) == y
        ]
        best_fits = [h for n, _, h in sorted(fits, reverse=True) if n == max(fits)[0]] if fits else []
        both = {M.race_temperature_multiplied.id, M.race_temperature_ignored.id} <= {h.id for h in best_fits}
        hint = M.race_temperature if both else best_fits[0] if best_fits else ""
    twins = own_randomness(tokens, logits, temperature, noise)  # no deterministic sampler, whatever it matches
    if twins:
        (i, a), (j, c) = twins
        lines.append(
            tr(
                "rows {i} and {j} have the same logits, T and noise, yet yours drew token {a} for one and token {c} for the other",
                i=i,
                j=j,
                a=a,
                c=c,
            )
        )
        hint = M.own_randomness
    raise CheckFailed(*lines, hint=hint)


def own_randomness(tokens: torch.Tensor, logits: torch.Tensor, temperature: torch.Tensor, noise: torch.Tensor) -> tuple | None:
    """Two rows with the same inputs whose tokens differ, ((row, token), (row, token)), the proof that a sampler
    draws its own randomness; None when there is none."""
    first: dict[str, int] = {}
    for b in range(tokens.shape[0]):
        key = repr((logits[b].tolist(), float(temperature[b]), noise[b].tolist()))
        if key in first and int(tokens[first[key]]) != int(tokens[b]):
            return (first[key], int(tokens[first[key]])), (b, int(tokens[b]))
        first.setdefault(key, b)
    return None


# -- helpers of ch23.2: goodness of fit ------------------------------------------------------------------


def chi2_threshold(df: int, alpha: float = ALPHA) -> float:
    """The c with P(χ²_df > c) = alpha, by bisection on the regularised upper incomplete gamma."""
    a = torch.tensor(df / 2, dtype=torch.float64)
    lo, hi = 0.0, 10.0 * df + 200.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if float(torch.special.gammaincc(a, torch.tensor(mid / 2, dtype=torch.float64))) > alpha:
            lo = mid
        else:
            hi = mid
    return hi


def chi2(counts: torch.Tensor, p: torch.Tensor) -> float:
    n = float(counts.sum())
    want = n * p.double()
    live = want > 0
    if bool((counts.double()[~live] > 0).any()):
        return math.inf
    return float(((counts.double()[live] - want[live]) ** 2 / want[live]).sum())


def race_intervals(p: list[float], n: int, limit: float) -> list[float]:
    """Half-width of each token's interval for its share of n races: √(limit · p(1 − p) / n).

    It is the chi-square test's own bound, token by token: Σ (count − N·p)² / (N·p) ≤ limit allows
    one token's count at most √limit standard deviations √(N·p·(1 − p)) from N·p, so a share
    outside p ± this half-width fails the test on its own (and in a passing run every share is
    inside its interval)."""
    return [math.sqrt(limit * pi * (1 - pi) / n) for pi in p]


def race_outliers(counts: list[int], n: int, p: list[float], chi2: float, limit: float) -> list[bool]:
    """Per token, whether the test's verdict falls on it: its share is outside its interval, or, when the test
    fails with every share inside, it is the token furthest off in standard deviations."""
    if chi2 <= limit:
        return [False] * len(p)
    half = race_intervals(p, n, limit)
    out = [abs(c / n - pi) > h for c, pi, h in zip(counts, p, half)]
    if any(out):
        return out
    sd = [math.sqrt(pi * (1 - pi) / n) for pi in p]
    worst = max(range(len(p)), key=lambda i: abs(counts[i] / n - p[i]) / sd[i] if sd[i] > 0 else 0.0)
    return [i == worst for i in range(len(p))]


def frequencies_figure(tokens: torch.Tensor, logits_row: list[float], T: float) -> dict:
    """The panel of many races of ch23-exponential-race: how often each token won, the test's interval of each
    share and its verdict per token (`wrong`)."""
    p = (torch.tensor(logits_row, dtype=torch.float32) / T).softmax(-1)
    counts = torch.bincount(tokens, minlength=len(logits_row))
    n, stat, limit = tokens.numel(), chi2(counts, p), chi2_threshold(len(logits_row) - 1)
    return {
        "counts": counts.tolist(),
        "n": n,
        "chi2": stat,
        "limit": limit,
        "intervals": race_intervals(p.tolist(), n, limit),
        "wrong": race_outliers(counts.tolist(), n, p.tolist(), stat, limit),
    }


def expect_distribution(
    tokens: torch.Tensor, logits_row: list[float], T: float, noise: torch.Tensor, *, case: str, variants: dict | None = None
) -> dict:
    """Chi-square goodness of fit of the drawn tokens to softmax(logits / T); returns the figure's numbers.
    `variants` is `race_variants`' answer for the rows (asked of the hidden side when not given)."""
    V, n = len(logits_row), tokens.numel()
    z = torch.tensor(logits_row, dtype=torch.float32)
    p = (z / T).softmax(-1)
    counts = torch.bincount(tokens, minlength=V)
    stat, df = chi2(counts, p), V - 1
    limit = chi2_threshold(df)
    result = {"counts": counts.tolist(), "n": n, "p": p.tolist(), "chi2": stat, "limit": limit, "passed": stat <= limit}
    if stat <= limit:
        return result
    sd = (n * p * (1 - p)).double().sqrt()
    off = (counts.double() - n * p.double()).abs() / sd
    i = int(off.argmax())
    raise CheckFailed(
        case,
        f"logits {vec(z)}, T = {fmt(T)}: p = softmax(logits / T) = {vec(p)}",
        tr(
            "token {i} was drawn {count} times ({share}%); expected N·p_{i} = {n} · {p} = {mean} ± {sd} "
            "(one standard deviation √(N·p·(1 − p)))",
            i=i,
            count=int(counts[i]),
            share=fmt(100 * float(counts[i]) / n, 3),
            n=n,
            p=fmt(float(p[i])),
            mean=fmt(n * float(p[i]), 5),
            sd=fmt(float(sd[i]), 3),
        ),
        tr(
            "chi-square over {V} tokens = {stat} > {limit}, a level a correct sampler exceeds with probability < {alpha} "
            "({df} degrees of freedom)",
            V=V,
            stat=fmt(stat, 5),
            limit=fmt(limit, 4),
            alpha=format(ALPHA, "g"),
            df=df,
        ),
        hint=likely_cause(tokens, counts, z, T, noise, variants),
    )


def likely_cause(
    tokens: torch.Tensor, counts: torch.Tensor, z: torch.Tensor, T: float, noise: torch.Tensor, variants: dict | None = None
) -> str:
    """The sampler the draws of a failed goodness-of-fit test most likely come from."""
    n, V = tokens.numel(), z.numel()
    logits = z.expand(n, V)
    temps = torch.full((n,), T)
    correct = race_scores(logits, temps, noise)[1].argmax(-1)
    variants = variants if variants is not None else if_hidden(race_variants, logits, temps, noise)
    for name, hint in race_hints().items() if variants is not None else ():
        alt = variants[name]
        share = float((alt == tokens).double().mean())
        if share >= 0.9 and float((alt == correct).double().mean()) < 0.9:
            text = tr(
                "your tokens are those of {name} on {share}% of the rows; {hint}", name=tr(name), share=fmt(100 * share, 3), hint=hint
            )
            return Hint(text, hint.id)
    limit = chi2_threshold(V - 1)
    if chi2(counts, z.softmax(-1)) <= limit:
        hint = M.race_temperature_ignored
        return Hint(tr("your draws follow softmax(logits), i.e. the temperature was not applied: {hint}", hint=hint), hint.id)
    if chi2(counts, (z * T).softmax(-1)) <= limit:
        hint = M.race_temperature_multiplied
        return Hint(tr("your draws follow softmax(logits · T): {hint}", hint=hint), hint.id)
    if int(counts.max()) == n:
        return M.same_token
    return tr("use the noise as given: one E per token and row, p / E, argmax over each row")
