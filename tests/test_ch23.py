"""ch23 · sampling: wrong submissions get the teaching message they need, the statistics are sound,
and the reference agrees with an independent statement of vLLM's top-k/top-p and nano-vllm's race."""

from __future__ import annotations

import math

import pytest
import torch
from local_trial import reference_trial
from mutate import figure, mutant_grader, result, wrong_elements

from grader.authoring import CheckFailed
from grader.checks import ch23 as checks
from grader.hidden import ch23 as hidden_checks
from grader.hidden import ch23_models as models
from solutions import ch23_sampling as ref

SEED = 11
SVG = "{http://www.w3.org/2000/svg}"
NEG_INF = float("-inf")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return mutant_grader(tmp_path_factory, "ch23", SEED)


# -- 23.1 process_logits ------------------------------------------------------------------------
def test_temperature_multiplied_is_explained(graded):
    report = graded.mistake("temperature_multiplied")
    r = result(report, "figure instance: one row of 8 logits")
    assert r.status == "failed"
    assert "token 0: logits / T = 1.2 / 0.8 = 1.5" in r.message
    assert "yours: 0.96" in r.message
    assert r.hints == ["temperature_multiplied"]
    assert {x.task for x in report.results if x.status != "passed"} == {"ch23.1"}, "sample is correct in this mutant"
    assert wrong_elements(report, "ch23-sampling-path")


def test_topk_keeping_one_more_is_explained(graded):
    report = graded.mistake("topk_off_by_one")  # the threshold read at index k: top-k keeps k + 1 entries
    r = result(report, "figure instance: one row of 8 logits")
    assert r.status == "failed"
    kth = sorted((torch.tensor(checks.PATH_LOGITS) / checks.PATH_T).tolist(), reverse=True)[checks.PATH_K - 1]
    assert "token 4 (logits / T = 0.375) should be −∞" in r.message
    assert f"the {checks.PATH_K}th largest value of logits / T" in r.message and f"< {kth:g}" in r.message
    assert "yours: 0.375" in r.message
    assert r.hints == ["topk_off_by_one"]
    assert wrong_elements(report, "ch23-sampling-path")
    k1 = result(report, "k = 1 leaves only the row max")
    assert k1.status == "failed" and k1.hints == ["topk_off_by_one"]


def test_topp_with_a_strict_comparison_is_explained(graded):
    report = graded.mistake("topp_strict")  # drop = mass < 1 − p: an entry whose mass is exactly 1 − p stays
    r = result(report, "top-p on exact boundaries")
    assert r.status == "failed" and r.hints == ["topp_strict"]
    assert "stays ≤ 1 − top_p = 0.5 over 2 of the equal entries, which go, so top-p keeps 2 of the 4" in r.message
    hidden = result(report, "exact top-p boundaries")
    assert hidden.status == "failed" and hidden.hints == ["topp_strict"]
    assert {x.name for x in report.results if x.status != "passed"} == {r.name, hidden.name}, "off the boundaries < and ≤ agree"


def test_any_choice_among_equal_entries_is_accepted(graded):
    # The same ≤, with the ties taken from the other end: a descending stable sort removes other equal entries.
    report = graded(
        "other_ties",
        (
            "ascending, order = z.sort(dim=-1)",
            "descending, order = z.sort(dim=-1, descending=True, stable=True)\n"
            "        ascending, order = descending.flip(-1), order.flip(-1)",
        ),
        task="ch23.1",
    )
    boundary = [result(report, "top-p on exact boundaries"), result(report, "exact top-p boundaries")]
    assert all(r.status == "passed" for r in boundary), [r.message for r in boundary]
    # ... which the reference does not remove: the choice differs, and it is accepted.
    kept = ref.process_logits(torch.tensor([[0.3] * 8]), torch.ones(1), None, 0.25)[0] != NEG_INF
    assert kept.nonzero()[:, 0].tolist() != [0, 1], "the stable descending sort keeps tokens 0 and 1; the reference must keep others"


def test_topp_dropping_the_crossing_token_is_explained(graded):
    report = graded.mistake("crossing_dropped")  # top-p keeps tokens only while the running total stays within p
    r = result(report, "top-p keeps the token that crosses p")
    assert r.status == "failed"
    assert "token 1" in r.message and "the larger tokens hold 0.5 < top_p = 0.6, so top-p keeps it" in r.message
    assert "yours: −∞" in r.message
    assert r.hints == ["crossing_dropped"]
    assert wrong_elements(report, "ch23-sampling-path")
    # The figure marks token 3 of the top-p row: kept by the reference, −∞ in this mutant.
    drawn = figure(report, "ch23-sampling-path").iter()
    assert any(el.text == "2.75" and el.get("class") == "expected" for el in drawn)


def test_a_kept_entry_where_minus_infinity_is_expected_is_caught():
    # compare.wrong_mask treats any finite value as close to −∞ when rtol > 0; ch23 compares infinities exactly.
    want = torch.tensor([[1.0, NEG_INF]])
    assert checks.wrong_entries(torch.tensor([[1.0, 0.5]]), want).tolist() == [[False, True]]
    assert checks.wrong_entries(torch.tensor([[1.0 + 1e-7, NEG_INF]]), want).tolist() == [[False, False]]


# -- 23.2 sample --------------------------------------------------------------------------------
def test_argmax_p_is_explained(graded):
    report = graded.mistake("argmax_p")  # the most likely token instead of the race argmax(p / E)
    r = result(report, "figure instance: logits [2, 1, 0]")
    assert r.status == "failed"
    assert "p / E = [0.2889, 2.346, 0.01588]" in r.message
    assert "so the race draws token 1; yours: token 0" in r.message
    assert r.hints == ["argmax_p"]
    chi = result(report, "chi-square")
    assert chi.status == "failed" and chi.hints == ["argmax_p"]
    assert wrong_elements(report, "ch23-exponential-race")
    assert {x.task for x in report.results if x.status != "passed"} == {"ch23.2"}
    # argmax(p) wins every race with token 0: all three shares are outside their intervals
    assert _marked_tokens(report) == _outside_their_intervals(report) == [0, 1, 2]
    _assert_yours_above_expected(report)


def test_noise_divided_by_p_is_explained(graded):
    report = graded.mistake("noise_over_p")  # the race upside down: argmax(E / p)
    r = result(report, "figure instance: logits [2, 1, 0]")
    assert r.status == "failed"
    assert "yours: token 2 (p / E = 0.01588 / 1 = 0.01588)" in r.message
    assert r.hints == ["noise_over_p"]
    assert wrong_elements(report, "ch23-exponential-race")


def test_temperature_left_out_of_the_race_fails_the_chi_square_test(graded):
    report = graded.mistake("race_temperature_ignored")  # the race run on softmax(logits)
    # T = 0.5 does not change the winner of the figure instance, so only the statistics expose it.
    assert result(report, "figure instance: logits [2, 1, 0]").status == "passed"
    chi = result(report, "chi-square")
    assert chi.status == "failed"
    p = (torch.tensor(hidden_checks.CHI_LOGITS) / hidden_checks.CHI_T).softmax(-1)
    worst = int(p.argmax())  # the temperature sharpens towards the largest logit; leaving it out starves it
    assert f"token {worst} was drawn" in chi.message and f"{float(p[worst]):.4g}" in chi.message
    assert f"> {checks.chi2_threshold(len(hidden_checks.CHI_LOGITS) - 1):.4g}" in chi.message
    assert chi.hints == ["race_temperature_ignored"]
    assert _marked_tokens(report) == _outside_their_intervals(report) == [0, 1, 2], (
        "the panel of many races marks every token whose share of wins is outside its interval"
    )
    _assert_yours_above_expected(report)


def test_a_sampler_with_its_own_randomness_passes_statistics_but_not_the_race(graded):
    report = graded.mistake("own_randomness")  # torch.multinomial: the right distribution, its own randomness
    assert result(report, "chi-square").status == "passed"
    exact = result(report, "random batches: exact agreement")
    assert exact.status == "failed"
    assert "one row, repeated 16 times" in exact.message
    assert "have the same logits, T and noise, yet yours drew token" in exact.message
    assert exact.hints == ["own_randomness"]


def test_an_unknown_deterministic_sampler_gets_the_derivation_and_no_hint(graded):
    report = graded(
        "argmin_race",
        # a sampler no known misconception gives: the loser of the race
        (
            "(probs / noise.to(torch.float32).clamp_min(1e-10)).argmax(dim=-1)",
            "(probs / noise.to(torch.float32).clamp_min(1e-10)).argmin(dim=-1)",
        ),
    )
    failed = [r for r in report.results if r.task == "ch23.2" and r.status == "failed" and "race draws token" in r.message]
    assert failed
    assert not [r.name for r in failed if "own_randomness" in r.hints]


def test_equivalent_formulations_pass_every_check(graded):
    # reciprocal temperature, torch.topk, top-p by the mass of the larger tokens (descending sort),
    # Gumbel-max in float64: other arithmetic, the same answers, so every check must accept them.
    report = graded(
        "equivalent_forms",
        # not a misconception: the same answers by other arithmetic
        ("z = logits.to(torch.float32) / temp[:, None]", "z = logits.to(torch.float32) * (1.0 / temp)[:, None]"),
        (
            "kth = z.sort(dim=-1, descending=True).values.gather(1, (k - 1)[:, None])",
            "kth = torch.topk(z, int(k.max()), dim=-1).values.gather(1, k[:, None] - 1)",
        ),
        (
            "ascending, order = z.sort(dim=-1)\n"
            "        mass = ascending.softmax(dim=-1).cumsum(dim=-1)      # mass of each entry and all smaller ones\n"
            "        drop = mass <= (1 - p)[:, None]\n"
            "        drop[:, -1] = False                                  # the largest entry always stays\n"
            "        drop &= (p < 1)[:, None]                             # p = 1 is off\n",
            "descending, order = z.sort(dim=-1, descending=True)\n"
            "        probs = descending.softmax(dim=-1)\n"
            "        larger = probs.cumsum(dim=-1) - probs                # mass of the entries larger than each\n"
            "        drop = (larger >= p[:, None]) & (p < 1)[:, None]\n",
        ),
        (
            "probs = (logits.to(torch.float32) / temp[:, None]).softmax(dim=-1)\n"
            "    return (probs / noise.to(torch.float32).clamp_min(1e-10)).argmax(dim=-1)",
            "logp = (logits.double() / temp.double()[:, None]).log_softmax(dim=-1)\n"
            "    return (logp - noise.double().clamp_min(1e-10).log()).argmax(dim=-1)",
        ),
    )
    failed = [f"{r.name}: {r.message}" for r in report.results if r.status != "passed"]
    assert not failed, failed
    assert not wrong_elements(report, "ch23-exponential-race") and _outside_their_intervals(report) == []
    won = [el for el in figure(report, "ch23-exponential-race").iter() if el.get("class") == "bar won"]
    assert len(won) == len(report.records["ch23-exponential-race"]["p"])


def test_a_race_that_ignores_or_multiplies_the_temperature_is_named_once():
    """One row where leaving T out and multiplying by it both draw token 1 (the race draws token 0): the hint
    names the temperature without guessing which of the two mistakes it is."""
    logits, temp, noise = torch.tensor([[2.0, 1.0, 0.0]]), torch.tensor([0.5]), torch.tensor([[1.0, 0.25, 5.0]])
    variants = models.race_variants(None, logits, temp, noise)
    assert (
        int(variants["the race on softmax(logits · T)"][0]) == 1 == int(variants["the race on softmax(logits) (temperature left out)"][0])
    )
    with pytest.raises(CheckFailed) as e:
        checks.expect_tokens(torch.tensor([1]), logits, temp, noise, variants=variants)
    assert "so the race draws token 0; yours: token 1" in str(e.value)
    assert e.value.hints == ["race_temperature"]


def test_every_row_drawing_the_same_token_is_named():
    """A sampler that draws one token for every race (one row's noise for all): no known sampler matches, the
    goodness-of-fit test fails, and the hint says why."""
    n = 2000
    logits, temp = torch.tensor([checks.RACE_LOGITS]).expand(n, 3), torch.full((n,), checks.RACE_T)
    noise = torch.empty(n, 3).exponential_(generator=torch.Generator().manual_seed(5))
    tokens = torch.ones(n, dtype=torch.int64)
    with pytest.raises(CheckFailed) as e:
        checks.expect_distribution(
            tokens, checks.RACE_LOGITS, checks.RACE_T, noise, case="every race", variants=models.race_variants(None, logits, temp, noise)
        )
    assert "token 1 was drawn 2000 times" in str(e.value)
    assert e.value.hints == ["same_token"]


# -- the figure's panel of many races -----------------------------------------------------------------
def _outside_their_intervals(report) -> list[int]:
    """The tokens whose share of the races lies outside N·p ± √limit·√(N·p(1 − p)), from the figure's inputs:
    the chi-square test's bound token by token (a share outside it fails the test on its own)."""
    r = report.records["ch23-exponential-race"]
    n, limit = r["n"], r["limit"]
    return [i for i, (c, p) in enumerate(zip(r["counts"], r["p"])) if abs(c - n * p) > math.sqrt(limit * n * p * (1 - p))]


def _marked_tokens(report) -> list[int]:
    """The tokens whose bar of wins the figure draws as wrong (hatched)."""
    won = [el for el in figure(report, "ch23-exponential-race").iter() if "won" in (el.get("class") or "")]
    return [i for i, el in enumerate(won) if "wrong" in el.get("class")]


def _assert_yours_above_expected(report) -> None:
    """The legend's order: yours struck through, the expected value below it (above each marked bar)."""
    root = figure(report, "ch23-exponential-race")
    won = [el for el in root.iter() if "won" in (el.get("class") or "")]
    texts = [el for el in root.iter(f"{SVG}text") if el.get("class") in ("value wrong", "expected")]
    for i in _marked_tokens(report):
        bar = won[i]
        cx = float(bar.get("x")) + float(bar.get("width")) / 2
        at = {el.get("class"): float(el.get("y")) for el in texts if abs(float(el.get("x")) - cx) < 0.5}
        assert at.keys() == {"value wrong", "expected"} and at["value wrong"] < at["expected"], at


# -- statistics and agreement with the real systems ---------------------------------------------
def test_chi_square_threshold_matches_closed_forms():
    # df = 2: P(X > c) = exp(−c/2); df = 4: exp(−c/2)(1 + c/2).
    c2 = checks.chi2_threshold(2)
    assert abs(c2 - (-2 * math.log(checks.ALPHA))) < 1e-6
    c4 = checks.chi2_threshold(4)
    assert abs(math.exp(-c4 / 2) * (1 + c4 / 2) - checks.ALPHA) < 1e-12


def test_the_race_draws_follow_p():
    g = torch.Generator().manual_seed(0)
    n = 50_000
    logits = torch.tensor([[2.0, 1.0, 0.0]]).expand(n, 3)
    noise = torch.empty(n, 3).exponential_(generator=g)
    tokens = ref.sample(logits, torch.full((n,), 0.5), noise)
    p = torch.tensor([0.866813, 0.117310, 0.015876])
    counts = torch.bincount(tokens, minlength=3)
    assert checks.chi2(counts, p) < checks.chi2_threshold(2)


def _vllm_style(logits: torch.Tensor, k, p) -> torch.Tensor:
    """An independent statement of vLLM v1's PyTorch-native top-k/top-p (ascending sort, scatter back)."""
    values, idx = logits.sort(dim=-1)
    if k is not None:
        threshold = values.gather(1, (values.shape[1] - k)[:, None])
        values = values.masked_fill(values < threshold, NEG_INF)
    if p is not None:
        cum = values.softmax(-1).cumsum(-1)
        drop = cum <= 1 - p[:, None]
        drop[:, -1] = False
        values = values.masked_fill(drop, NEG_INF)
    return torch.empty_like(logits).scatter(1, idx, values)


def test_reference_matches_vllm_top_k_top_p():
    g = torch.Generator().manual_seed(3)
    for _ in range(200):
        B, V = int(torch.randint(1, 8, (1,), generator=g)), int(torch.randint(1, 60, (1,), generator=g))
        logits = torch.randn(B, V, generator=g) * 3
        temp = torch.rand(B, generator=g) + 0.2
        k = torch.randint(1, V + 1, (B,), generator=g)
        p = torch.rand(B, generator=g) * 0.98 + 0.01
        assert torch.equal(ref.process_logits(logits, temp, k, p), _vllm_style(logits / temp[:, None], k, p))


def test_reference_race_matches_the_documented_instance():
    # reference/nanovllm.md §13: ratios [0.288938, 2.346200, 0.015876] → token 1.
    p, scores = checks.race_scores(torch.tensor([[2.0, 1.0, 0.0]]), torch.tensor([0.5]), torch.tensor([[3.0, 0.05, 1.0]]))
    assert torch.allclose(p, torch.tensor([[0.866813, 0.117310, 0.015876]]), atol=1e-6)
    assert torch.allclose(scores, torch.tensor([[0.288938, 2.346200, 0.015876]]), atol=1e-5)
    assert ref.sample(torch.tensor([[2.0, 1.0, 0.0]]), torch.tensor([0.5]), torch.tensor([[3.0, 0.05, 1.0]])).item() == 1


def test_a_sampler_that_never_upcasts_is_explained(graded):
    report = graded.mistake("no_upcast")  # temperature, softmax and race in the logits' bfloat16 / float16
    r = result(report, "bfloat16 and float16 logits")
    assert r.status == "failed" and r.hints == ["no_upcast"]
    assert 'case "bfloat16"' in r.message and "so the race draws token" in r.message
    assert {x.name for x in report.results if x.status != "passed"} == {r.name}, "on float32 logits it is the race"


def test_a_race_on_float16_probabilities_with_float32_noise_fails_too(graded):
    report = graded(
        "half_probs",
        ("probs = (logits.to(torch.float32) / temp[:, None])", "probs = (logits / temp.to(logits.dtype)[:, None])"),
        task="ch23.2",
    )
    r = result(report, "bfloat16 and float16 logits")
    assert r.status == "failed" and r.hints == ["no_upcast"]


def test_the_close_races_are_decided_by_float32_on_many_seeds():
    for seed in range(150):
        t = reference_trial(hidden_checks.half_logits, seed, ref)
        for dtype in models.HALF:
            row, T, noise = hidden_checks.close_race(t, dtype, 32)
            right = int(ref.sample(row[None], torch.tensor([T]), noise[None]))
            p, scores = checks.race_scores(row[None], torch.tensor([T]), noise[None])
            a, b = sorted(scores[0].topk(2).indices.tolist())
            assert right == b and float(scores[0, b]) > float(scores[0, a]) * (1 + 10 * checks.TIE), "float32 decides, beyond the tie"
            assert int(models.half_race(row[None], torch.tensor([T]), noise[None])) == a
        hidden_checks.half_logits(t)
        hidden_checks.topp_exact_boundaries(reference_trial(hidden_checks.topp_exact_boundaries, seed, ref))


# -- the provided input checks (outside the solution regions: unit tests, no graded checks) ---------------------

LOGITS, OK = torch.randn(2, 5, generator=torch.Generator().manual_seed(0)), torch.tensor([0.7, 1.0])
BAD_SETTINGS = {
    "temperature 0": ((LOGITS, torch.tensor([0.7, 0.0])), {}),
    "temperature −1": ((LOGITS, torch.tensor([0.7, -1.0])), {}),
    "3 temperatures for 2 rows": ((LOGITS, torch.tensor([0.7, 1.0, 1.0])), {}),
    "a float temperature": ((LOGITS, 0.7), {}),
    "1-D logits": ((LOGITS[0], OK[:1]), {}),
    "integer logits": ((LOGITS.long(), OK), {}),
    "top_k = 0": ((LOGITS, OK), {"top_k": 0}),
    "top_k = 6 > V": ((LOGITS, OK), {"top_k": 6}),
    "a row's top_k = 0": ((LOGITS, OK), {"top_k": torch.tensor([3, 0])}),
    "a float top_k": ((LOGITS, OK), {"top_k": 2.0}),
    "a bool top_k": ((LOGITS, OK), {"top_k": True}),
    "top_k of 3 rows": ((LOGITS, OK), {"top_k": torch.tensor([1, 2, 3])}),
    "top_p = 0": ((LOGITS, OK), {"top_p": 0.0}),
    "top_p = 1.5": ((LOGITS, OK), {"top_p": 1.5}),
    "a row's top_p = −0.1": ((LOGITS, OK), {"top_p": torch.tensor([0.9, -0.1])}),
    "an integer top_p tensor": ((LOGITS, OK), {"top_p": torch.tensor([1, 1])}),
}


@pytest.mark.parametrize("case", BAD_SETTINGS)
def test_the_provided_checks_refuse_bad_settings(case):
    args, kwargs = BAD_SETTINGS[case]
    with pytest.raises(ValueError):
        ref.process_logits(*args, **kwargs)


@pytest.mark.parametrize(
    "temperature, noise",
    [
        (torch.tensor([1.0, 0.0]), torch.ones(2, 5)),
        (torch.tensor([1.0]), torch.ones(2, 5)),
        (OK, torch.ones(5)),
        (OK, torch.ones(2, 6)),
        (OK, torch.ones(2, 5, dtype=torch.int64)),
    ],
)
def test_the_provided_checks_refuse_a_bad_temperature_or_noise(temperature, noise):
    with pytest.raises(ValueError):
        ref.sample(LOGITS, temperature, noise)


def test_the_provided_settings_come_one_per_row():
    assert ref._per_row_top_k(3, 2, 5).tolist() == [3, 3] and ref._per_row_top_k(None, 2, 5) is None
    assert ref._per_row_top_k(torch.tensor(4), 2, 5).tolist() == [4, 4]
    assert ref._per_row_top_p(1, 2).dtype == torch.float32 and ref._per_row_top_p(None, 2) is None
    assert ref._per_row_top_p(torch.tensor([0.5, 0.9], dtype=torch.float64), 2).dtype == torch.float32
