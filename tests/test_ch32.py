"""ch32 · speculative decoding and determinism: wrong submissions get the teaching message they need, the
figures drawn from them mark what is wrong, the statistics are sound, and the reference is lossless and
batch-invariant."""

from __future__ import annotations

import pytest
import torch
from mutate import mutant_grader, result, tasks_not_passed, wrong_elements

from grader.checks import ch23
from grader.checks import ch32 as checks
from grader.hidden import ch32 as hidden_checks
from grader.hidden import ch32_models as models
from solutions import ch32_spec_determinism as ref

SEED = 11
ACCEPT = "if qx > 0 and float(uniforms[i]) < min(1.0, px / qx):"


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return mutant_grader(tmp_path_factory, "ch32", SEED)


# -- 32.1 verify_draft ------------------------------------------------------------------------------
def test_replacement_drawn_from_p_is_explained(graded):
    report = graded.mistake("from_p")   # at a rejection, resample from p instead of the residual max(0, p − q)
    r = result(report, "figure instance: the 3 drafts")
    assert r.status == "failed"
    assert "expected [2, 3]; yours [2, 4]" in r.message
    assert "u_1 = 0.62 ≥ min(1, p/q) = 0.375 → rejected" in r.message
    assert "max(0, p_1 − q_1) = [0.03, 0.3, 0.02, 0.1, 0, 0.05]" in r.message and "→ token 3" in r.message
    assert "yours: token 4 (its weight max(0, p − q) is 0: it can never win)" in r.message
    assert r.hints == ["from_p"]
    chi = result(report, "chi-square")
    assert chi.status == "failed"
    assert f"> {ch23.chi2_threshold(3):.4g}" in chi.message
    assert "likely cause: your first tokens are those of 'replacement from p'" in chi.message
    assert chi.hints == ["from_p"]
    assert tasks_not_passed(report) == {"ch32.1"}
    assert wrong_elements(report, "ch32-spec-confidence")
    assert any(el.get("class") == "label wrong-pick" for el in wrong_elements(report, "ch32-spec-confidence"))


def test_inverted_ratio_is_explained(graded):
    report = graded.mistake("inverse_ratio")   # accept with min(1, q/p), draft over target
    r = result(report, "figure instance: the 3 drafts")
    assert r.status == "failed"
    assert "yours [2, 4, 0, 2]" in r.message and "yours: token 4 (you accepted the draft), then 2 more" in r.message
    assert r.hints == ["inverse_ratio"]
    assert wrong_elements(report, "ch32-spec-confidence")


def test_missing_bonus_is_explained(graded):
    report = graded.mistake("no_bonus")   # all drafts accepted, but no bonus token: k tokens instead of k + 1
    # The figure instance has a rejection, which is right; only the all-accepted cases expose it.
    assert result(report, "figure instance: the 3 drafts").status == "passed"
    r = result(report, "all k drafts accepted")
    assert r.status == "failed"
    assert "expected [1, 3, 0, 2]; yours [1, 3, 0]" in r.message
    assert "u_2 = 0.3 < min(1, p/q) = 1 → accepted: emit 0 and go on; yours: your list ends there" in r.message
    assert r.hints == ["no_bonus"]
    k0 = result(report, "edge cases: k = 0")
    assert k0.status == "failed" and "emits exactly 1 (the bonus)" in k0.message


def test_going_on_after_a_rejection_is_explained(graded):
    report = graded.mistake("no_stop")   # emits the recovered token, then keeps verifying the later drafts
    r = result(report, "figure instance: the 3 drafts")
    assert r.status == "failed"
    assert "→ token 3, and verification stops; yours: token 3, then" in r.message
    assert r.hints == ["no_stop"]
    assert wrong_elements(report, "ch32-spec-confidence")


# -- 32.2 num_drafts_to_verify ----------------------------------------------------------------------
def test_confidence_on_its_own_is_explained(graded):
    report = graded.mistake("per_item")   # each draft judged by its own confidence, not the running product
    r = result(report, "figure instance: confidences")
    assert r.status == "failed"
    surv = models.count_models(None, checks.SPEC_CONF, checks.SPEC_THRESHOLD)["survivals"]
    n = ref.num_drafts_to_verify(checks.SPEC_CONF, checks.SPEC_THRESHOLD)
    assert f"s{n} = {surv[n]:.4g} < 0.3 is the first survival below the threshold, so n = {n}; yours: 5" in r.message
    assert r.hints == ["per_item"]
    assert result(report, "the adaptive-verification example").status == "failed"
    assert tasks_not_passed(report) == {"ch32.2"}
    assert wrong_elements(report, "ch32-spec-confidence")


def test_strict_threshold_is_explained(graded):
    report = graded.mistake("strict")   # a survival equal to the threshold is dropped (> instead of ≥)
    assert result(report, "figure instance: confidences").status == "passed"
    r = result(report, "a survival exactly equal")
    assert r.status == "failed"
    assert "so n = 2; yours: 1" in r.message and r.hints == ["strict"]


# -- 32.3 batch_invariant_matmul --------------------------------------------------------------------
def test_split_k_chosen_by_batch_size_is_caught(graded):
    report = graded.mistake("batch_dependent")   # split-K when there are few rows, as GPU heuristics do
    r = result(report, "figure instance: row 0 in batches")
    assert r.status == "failed"
    assert "pool row 0 computed in a batch of B = 1 (position 0) and of B = 4 (position 0)" in r.message
    assert "ulp apart" in r.message and "(0x" in r.message
    assert "the order in which your function sums over k depends on the batch" in r.message
    assert r.hints == ["batch_dependent"]
    assert result(report, "agrees with x @ w").status == "passed", "the values are right, only the bits move"
    assert result(report, "random shapes").status == "failed"
    assert tasks_not_passed(report) == {"ch32.3"}
    bad = wrong_elements(report, "ch32-determinism")
    assert any((el.text or "").startswith("0x") for el in bad), "the changed bits of row 0 are marked"


def test_bfloat16_accumulator_is_explained(graded):
    report = graded.mistake("low_precision_acc")   # accumulate in the input dtype: a bf16 sum loses its bits
    r = result(report, "bfloat16 in, bfloat16 out")
    assert r.status == "failed"
    assert "over K = 512 terms" in r.message and "(float64), allowed error" in r.message
    assert r.hints == ["low_precision_acc"]
    assert f"hint: {checks.M.hint('low_precision_acc', dtype='bfloat16')}" in r.message, "the hint names the dtype"
    assert result(report, "figure instance: row 0 in batches").status == "passed"


def test_plain_matmul_fails_exactly_where_this_machine_is_not_batch_invariant(graded):
    report = graded("plain",
                    # x @ w from the library: its kernel choice may depend on the batch size
                    ("    acc = torch.float64 if x.dtype == torch.float64 else torch.float32",
                     "    return x @ w\n    acc = None"))
    probe = checks.probe_matmul(torch.Generator().manual_seed(0))
    r = result(report, "figure instance: row 0 in batches")
    if not any(p["changed"] for p in probe if p["dtype"] == "float32"):
        assert r.status == "passed"
        pytest.skip("plain x @ w is batch-invariant for these shapes on this machine")
    assert r.status == "failed"
    assert r.hints == ["plain_matmul"]     # no edit makes this mistake on every machine: shown here, where it fails
    assert wrong_elements(report, "ch32-determinism")


def test_equivalent_formulations_pass_every_check(graded):
    report = graded(
        "equivalent",
        # not a misconception: float64 verification with u·q < p, a cumprod count, a float64 accumulator
        ("dtype = torch.promote_types(torch.promote_types(draft_probs.dtype, target_probs.dtype), torch.float32)",
         "dtype = torch.float64"),
        (ACCEPT, "if qx > 0 and float(uniforms[i]) * qx < px:"),
        ("    survival, n = 1.0, 0\n    for c in values:\n        survival *= c\n        if survival < threshold:\n"
         "            break\n        n += 1\n    return n",
         "    return int((torch.tensor(values, dtype=torch.float64).cumprod(0) >= threshold).sum())"),
        ("acc = torch.float64 if x.dtype == torch.float64 else torch.float32", "acc = torch.float64"))
    failed = [f"{r.name}: {r.message}" for r in report.results if r.status != "passed"]
    assert not failed, failed


# -- the reference and the statistics ---------------------------------------------------------------
def test_reference_is_lossless_on_the_worked_example():
    # reference §I.1: q = (0.6, 0.3, 0.1), p = (0.3, 0.5, 0.2); drafts drawn from q; first token ~ p.
    g = torch.Generator().manual_seed(3)
    q, p = torch.tensor([[0.6, 0.3, 0.1]]), torch.tensor([[0.3, 0.5, 0.2], [1 / 3] * 3])
    n = 6000
    drafts = torch.multinomial(q[0], n, replacement=True, generator=g)
    u, e = torch.rand(n, generator=g), torch.empty(n, 2, 3).exponential_(generator=g)
    firsts = torch.tensor([ref.verify_draft([int(drafts[i])], q, p, u[i:i + 1], e[i])[0] for i in range(n)])
    counts = torch.bincount(firsts, minlength=3)
    assert ch23.chi2(counts, p[0]) < ch23.chi2_threshold(2)
    # and not distributed as q
    assert ch23.chi2(counts, q[0]) > ch23.chi2_threshold(2)


def test_chi_square_instance_has_power_against_resampling_from_p():
    # The first token of 'replacement from p' follows min(p, q) + P(reject)·p; the test must expect to catch it.
    p = torch.tensor(hidden_checks.CHI_P, dtype=torch.float64)
    q = torch.tensor(hidden_checks.CHI_Q, dtype=torch.float64)
    wrong = torch.minimum(p, q) + (1 - torch.minimum(p, q).sum()) * p
    live = p > 0
    noncentrality = hidden_checks.CHI_DRAWS * float(((wrong - p)[live] ** 2 / p[live]).sum())
    assert noncentrality > 2 * ch23.chi2_threshold(int(live.sum()) - 1)


def test_reference_rows_keep_their_bits_in_every_batch():
    g = torch.Generator().manual_seed(5)
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        x, w = torch.randn(70, 130, generator=g).to(dtype), torch.randn(130, 17, generator=g).to(dtype)
        alone = torch.cat([ref.batch_invariant_matmul(x[i:i + 1], w) for i in range(70)])
        for B in (2, 5, 33, 70):
            perm = torch.randperm(70, generator=g)[:B]
            assert torch.equal(ref.batch_invariant_matmul(x[perm], w).view(checks.INT_OF[dtype]),
                               alone[perm].view(checks.INT_OF[dtype]))


def test_the_probe_reports_every_shape():
    found = checks.probe_matmul(torch.Generator().manual_seed(1))
    assert [(p["dtype"], p["K"], p["N"]) for p in found] == \
        [(str(d).removeprefix("torch."), K, N) for d, K, N in checks.PROBE_SHAPES]
    assert all(set(p["changed"]) <= set(checks.FIG_BATCHES) and 1 not in p["changed"] for p in found)


def test_figure_instance_survivals_and_verdicts():
    # The instance must show what the caption claims: a confident draft sent and rejected, one trimmed.
    n = ref.num_drafts_to_verify(checks.SPEC_CONF, checks.SPEC_THRESHOLD)
    assert 1 < n < len(checks.SPEC_CONF)
    c = checks.spec_case(n)
    out = ref.verify_draft(*c.args())
    rejected = len(out) - 1
    assert rejected < n and checks.SPEC_CONF[rejected] >= max(checks.SPEC_CONF[:n]) - 1e-12
    assert out == models.simulate(c)
