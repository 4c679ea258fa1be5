"""ch32 · speculative decoding and determinism: wrong submissions get the teaching message they need, the
figures drawn from them mark what is wrong, the statistics are sound, and the reference is lossless and
batch-invariant."""

from __future__ import annotations

import pytest
import torch
from local_trial import reference_trial
from mutate import checks_not_passed, mutant_grader, result, tasks_not_passed, wrong_elements

from grader.checks import ch23
from grader.checks import ch32 as checks
from grader.hidden import ch32 as hidden_checks
from grader.hidden import ch32_models as models
from grader.hidden.ch32_mistakes import RMS_SPLIT
from solutions import ch32_spec_determinism as ref

SEED = 11
ACCEPT = "if qx > 0 and float(uniforms[i]) < min(1.0, px / qx):"


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return mutant_grader(tmp_path_factory, "ch32", SEED)


# -- 32.1 verify_draft ------------------------------------------------------------------------------
def test_replacement_drawn_from_p_is_explained(graded):
    report = graded.mistake("from_p")  # at a rejection, resample from p instead of the residual max(0, p − q)
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
    report = graded.mistake("inverse_ratio")  # accept with min(1, q/p), draft over target
    r = result(report, "figure instance: the 3 drafts")
    assert r.status == "failed"
    assert "yours [2, 4, 0, 2]" in r.message and "yours: token 4 (you accepted the draft), then 2 more" in r.message
    assert r.hints == ["inverse_ratio"]
    assert wrong_elements(report, "ch32-spec-confidence")


def test_missing_bonus_is_explained(graded):
    report = graded.mistake("no_bonus")  # all drafts accepted, but no bonus token: k tokens instead of k + 1
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
    report = graded.mistake("no_stop")  # emits the recovered token, then keeps verifying the later drafts
    r = result(report, "figure instance: the 3 drafts")
    assert r.status == "failed"
    assert "→ token 3, and verification stops; yours: token 3, then" in r.message
    assert r.hints == ["no_stop"]
    assert wrong_elements(report, "ch32-spec-confidence")


def test_verification_in_float16_is_explained(graded):
    report = graded.mistake("half_precision")  # residuals and races in the probabilities' float16, not float32
    r = result(report, "float64 and float16 probabilities")
    assert r.status == "failed" and r.hints == ["half_precision"]
    assert 'case "float16, tiny noise"' in r.message and "expected [1]; yours [0]" in r.message
    assert checks_not_passed(report) == [r.name], "elsewhere float16 and float32 verdicts agree"


# -- 32.2 num_drafts_to_verify ----------------------------------------------------------------------
def test_confidence_on_its_own_is_explained(graded):
    report = graded.mistake("per_item")  # each draft judged by its own confidence, not the running product
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
    report = graded.mistake("strict")  # a survival equal to the threshold is dropped (> instead of ≥)
    assert result(report, "figure instance: confidences").status == "passed"
    r = result(report, "a survival exactly equal")
    assert r.status == "failed"
    assert "so n = 2; yours: 1" in r.message and r.hints == ["strict"]


# -- 32.3 batch_invariant_matmul --------------------------------------------------------------------
def test_split_k_chosen_by_batch_size_is_caught(graded):
    report = graded.mistake("batch_dependent")  # split-K when there are few rows, as GPU heuristics do
    r = result(report, "figure instance: row 0 in batches")
    assert r.status == "failed"
    assert "pool row 0 computed in a batch of B = 1 (position 0) and of B = 4 (position 0)" in r.message
    assert "ulp apart" in r.message and "(0x" in r.message
    assert "the order in which your function sums over k depends on the batch" in r.message
    assert r.hints == ["batch_dependent"]
    order = result(report, "the bits of the order k = 0")
    assert order.status == "failed" and "must have the bits of the fixed order" in order.message
    assert "your values are right" in order.message, "the values are right, only the bits move"
    assert result(report, "random shapes").status == "failed"
    assert tasks_not_passed(report) == {"ch32.3"}
    bad = wrong_elements(report, "ch32-determinism")
    assert any((el.text or "").startswith("0x") for el in bad), "the changed bits of row 0 are marked"


def test_bfloat16_accumulator_is_explained(graded):
    report = graded.mistake("low_precision_acc")  # accumulate in the input dtype: a bf16 sum loses its bits
    r = result(report, "bfloat16 in, bfloat16 out")
    assert r.status == "failed"
    assert "over K = 512 terms" in r.message and "(float64), allowed error" in r.message
    assert r.hints == ["low_precision_acc"]
    assert f"hint: {checks.M.hint('low_precision_acc', dtype='bfloat16')}" in r.message, "the hint names the dtype"
    assert result(report, "figure instance: row 0 in batches").status == "passed"


def test_plain_matmul_fails_on_every_machine(graded):
    report = graded.mistake("plain_matmul")  # x @ w from the library: its order is the library's, chosen by shape
    r = result(report, "figure instance: row 0 in batches")
    assert r.status == "failed" and r.hints == ["plain_matmul"]
    # Where this machine's kernel keeps a row's bits across batch sizes, the fixed order still tells them apart.
    assert "must come out with the same bits" in r.message or "must have the bits of the fixed order" in r.message
    assert result(report, "float64 in").status == "failed", "float64 terms of very different sizes: another grouping"
    assert wrong_elements(report, "ch32-determinism")


def test_matmul_on_float64_copies_is_explained(graded):
    report = graded.mistake("upcast_plain")  # (x.double() @ w.double()).to(x.dtype): passed every check before
    r = result(report, "figure instance: row 0 in batches")
    assert r.status == "failed"
    assert "must have the bits of the fixed order (k = 0, 1, …, 255 in turn, a multiply then an add in float32" in r.message
    assert "your values are right and keep their bits from batch to batch here" in r.message
    assert r.hints == ["upcast_plain"]
    assert result(report, "float64 in").hints == ["plain_matmul"], "for float64 inputs it is plain x @ w"
    assert tasks_not_passed(report) == {"ch32.3"}
    bad = wrong_elements(report, "ch32-determinism")
    assert any((el.text or "").startswith("0x") for el in bad), "the bits of row 0 are marked against the fixed order"


def test_a_fused_multiply_add_is_explained(graded):
    x, w = torch.randn(8, 64, generator=torch.Generator().manual_seed(2)), torch.randn(64, 8)
    fused = models.product_models(None, x, w)["fma"]
    if torch.equal(fused, ref.batch_invariant_matmul(x, w)):
        pytest.skip("torch.addcmul rounds the product and the sum apart on this CPU: no fused multiply-add to show")
    report = graded(
        "fused_madd",  # torch.addcmul: one rounding where the order has two
        ("        out = out + xa[:, k:k + 1] * wa[k]", "        out = torch.addcmul(out, xa[:, k:k + 1], wa[k])"),
        task="ch32.3",
    )
    r = result(report, "figure instance: row 0 in batches")
    assert r.status == "failed" and r.hints == ["fused_madd"]


def test_equivalent_formulations_pass_every_check(graded):
    report = graded(
        "equivalent",
        # not a misconception: float64 verification with u·q < p, a cumprod count
        ("dtype = torch.promote_types(torch.promote_types(draft_probs.dtype, target_probs.dtype), torch.float32)", "dtype = torch.float64"),
        (ACCEPT, "if qx > 0 and float(uniforms[i]) * qx < px:"),
        (
            "    survival, n = 1.0, 0\n    for c in values:\n        survival *= c\n        if survival < threshold:\n"
            "            break\n        n += 1\n    return n",
            "    return int((torch.tensor(values, dtype=torch.float64).cumprod(0) >= threshold).sum())",
        ),
        # the same order written in place; rsqrt (accepted); the padding by F.pad
        ("        out = out + xa[:, k:k + 1] * wa[k]", "        out += xa[:, k:k + 1] * wa[k]"),
        ("inv_rms = 1 / torch.sqrt(total / H + eps)", "inv_rms = torch.rsqrt(total / H + eps)"),
        (
            "chunk = torch.cat([chunk, chunk.new_zeros(B, block - chunk.shape[1])], dim=1)",
            "chunk = torch.nn.functional.pad(chunk, (0, block - chunk.shape[1]))",
        ),
    )
    failed = [f"{r.name}: {r.message}" for r in report.results if r.status != "passed"]
    assert not failed, failed


# -- 32.4 batch_invariant_rms_norm -----------------------------------------------------------------
def test_the_library_sum_is_explained(graded):
    report = graded.mistake("rms_plain_sum")  # squares.sum(dim=1): the right value, the library's order
    r = result(report, "figure instance: row 0 of [16, 40]")
    assert r.status == "failed"
    assert "must have the bits of the fixed split (squares in chunks of 16 columns" in r.message
    assert "your values are right and keep their bits from batch to batch here" in r.message
    assert r.hints == ["rms_plain_sum"]
    assert tasks_not_passed(report) == {"ch32.4"}
    assert wrong_elements(report, "ch32-rms-split")


def test_a_library_sum_earns_no_invariance_point(graded):
    # torch.sum keeps its bits from batch to batch on this CPU, but only because of how this library happens to
    # reduce: it is not an order the answer fixes.
    report = graded.mistake("rms_plain_sum")
    invariance = [r for r in report.results if r.task == "ch32.4" and r.name.startswith("batch invariance")]
    assert len(invariance) == 4 and all(r.status == "failed" for r in invariance), [(r.name, r.status) for r in invariance]
    r = result(report, "batch invariance: a row keeps its bits")
    assert "but they are the bits of torch.sum (or .mean) of the squares" in r.message and r.hints == ["rms_plain_sum"]


def test_another_fixed_order_earns_the_invariance_points_only(graded):
    # Left to right over the whole row: invariant in every batch, but not the split the docstring prescribes.
    report = graded("sequential_rms", (RMS_SPLIT, "    for j in range(H):\n        total = total + squares[:, j]\n"), task="ch32.4")
    invariance = [r for r in report.results if r.name.startswith("batch invariance")]
    order = [r for r in report.results if r.name.startswith(("figure instance", "one padded chunk", "the fixed split's bits"))]
    assert len(invariance) == 4 and all(r.status == "passed" for r in invariance), [(r.name, r.message) for r in invariance]
    assert len(order) == 3 and all(r.status == "failed" for r in order)
    assert all("rms_plain_sum" not in r.hints for r in order), "a loop over j is no library sum, even where their bits agree"
    assert report.score >= 4 and report.score < report.max_score


def test_a_split_chosen_by_batch_size_is_explained(graded):
    report = graded.mistake("rms_batch_split")  # half-width chunks below 4 rows, as a GPU split reduction does
    r = result(report, "figure instance: row 0 of [16, 40]")
    assert r.status == "failed"
    assert "pool row 0 computed in a batch of B = 1 (position 0) and of B = 4 (position 0)" in r.message
    assert "the order in which your function sums over the hidden size depends on the batch" in r.message
    assert r.hints == ["rms_batch_split"]
    assert wrong_elements(report, "ch32-rms-split")


def test_a_cast_before_the_weight_is_explained(graded):
    report = graded.mistake("rms_cast_first")  # ch20's nano-vllm order: cast, then multiply by the weight
    assert result(report, "figure instance: row 0 of [16, 40]").status == "passed", "float32: the cast changes nothing"
    r = result(report, "a bfloat16 RMSNorm")
    assert r.status == "failed" and r.hints == ["rms_cast_first"]


def test_a_library_sum_inside_each_chunk_is_explained(graded):
    report = graded.mistake("rms_chunk_sum")  # torch.sum over each chunk instead of the halving tree
    named = {h for x in report.results if x.task == "ch32.4" for h in x.hints}
    assert "rms_chunk_sum" in named
    assert tasks_not_passed(report) == {"ch32.4"}


def test_reference_rms_norm_keeps_its_bits_and_agrees_with_rms_norm():
    g = torch.Generator().manual_seed(7)
    for dtype, H, block in ((torch.float32, 130, 32), (torch.bfloat16, 1024, 1024), (torch.float64, 77, 8)):
        x, weight = torch.randn(50, H, generator=g).to(dtype), torch.randn(H, generator=g).to(dtype)
        alone = torch.cat([ref.batch_invariant_rms_norm(x[i : i + 1], weight, 1e-6, block) for i in range(50)])
        for B in (2, 7, 50):
            perm = torch.randperm(50, generator=g)[:B]
            got = ref.batch_invariant_rms_norm(x[perm], weight, 1e-6, block)
            assert torch.equal(got.view(checks.INT_OF[dtype]), alone[perm].view(checks.INT_OF[dtype]))
        xd = x.double()
        want = xd / torch.sqrt((xd * xd).mean(1, keepdim=True) + 1e-6) * weight.double()
        assert torch.allclose(alone.double(), want, rtol=1e-2 if dtype == torch.bfloat16 else 1e-5, atol=1e-6)


def test_the_split_is_vllms_chunk_walk_with_a_halving_tree():
    # One chunk of 4: ((a² + c²) + (b² + d²)); two chunks of 2: (a² + b²) + (c² + d²). Values whose squares round
    # apart in float32 tell the two orders apart.
    x = torch.tensor([[1e4, 1.0, -1e4, 3e-4]])
    one = ref.batch_invariant_rms_norm(x, torch.ones(4), 0.0, 4)
    two = ref.batch_invariant_rms_norm(x, torch.ones(4), 0.0, 2)
    sq = (x * x)[0]
    assert torch.equal(one[0, 1], (x[0, 1] * (1 / torch.sqrt(((sq[0] + sq[2]) + (sq[1] + sq[3])) / 4))))
    assert torch.equal(two[0, 1], (x[0, 1] * (1 / torch.sqrt(((sq[0] + sq[1]) + (sq[2] + sq[3])) / 4))))


# -- the provided input checks (outside the solution regions): unit tests, no graded checks ------------------------
Q2, P3 = torch.full((2, 3), 1 / 3), torch.full((3, 3), 1 / 3)
GOOD_VERIFY = (torch.tensor([0, 1]), Q2, P3, torch.tensor([0.2, 0.4]), torch.ones(3, 3))
BAD_VERIFY = {
    "token outside V": (torch.tensor([0, 3]), Q2, P3, torch.tensor([0.2, 0.4]), torch.ones(3, 3)),
    "float tokens": (torch.tensor([0.0, 1.0]), Q2, P3, torch.tensor([0.2, 0.4]), torch.ones(3, 3)),
    "uniform of 1": (torch.tensor([0, 1]), Q2, P3, torch.tensor([0.2, 1.0]), torch.ones(3, 3)),
    "one uniform for two drafts": (torch.tensor([0, 1]), Q2, P3, torch.tensor([0.2]), torch.ones(3, 3)),
    "k rows of target_probs": (torch.tensor([0, 1]), Q2, Q2.clone(), torch.tensor([0.2, 0.4]), torch.ones(3, 3)),
    "noise with k rows": (torch.tensor([0, 1]), Q2, P3, torch.tensor([0.2, 0.4]), torch.ones(2, 3)),
    "negative noise": (torch.tensor([0, 1]), Q2, P3, torch.tensor([0.2, 0.4]), -torch.ones(3, 3)),
    "log-probabilities": (torch.tensor([0, 1]), Q2.log(), P3, torch.tensor([0.2, 0.4]), torch.ones(3, 3)),
    "rows summing to 2": (torch.tensor([0, 1]), Q2, 2 * P3, torch.tensor([0.2, 0.4]), torch.ones(3, 3)),
    "two vocabularies": (torch.tensor([0, 1]), Q2[:, :2], P3, torch.tensor([0.2, 0.4]), torch.ones(3, 3)),
}


@pytest.mark.parametrize("case", BAD_VERIFY)
def test_the_provided_draft_check_refuses_bad_inputs(case):
    with pytest.raises(ValueError):
        ref._checked_drafts(*BAD_VERIFY[case])


def test_the_provided_draft_check_passes_good_inputs_as_a_list():
    assert ref._checked_drafts(*GOOD_VERIFY) == [0, 1]
    assert ref._checked_drafts([2], Q2[:1], P3[:2], torch.tensor([0.5]), torch.ones(2, 3)) == [2]


@pytest.mark.parametrize(
    "confidences, threshold",
    [
        (torch.tensor([0.9, 1.2]), 0.5),
        (torch.tensor([0.5, -0.1]), 0.2),
        (torch.full((2, 2), 0.5), 0.2),
        (torch.tensor([0.5]), 1.5),
        (torch.tensor([0.5]), -0.5),
        (["0.5"], 0.5),
    ],
)
def test_the_provided_confidence_check_refuses_bad_inputs(confidences, threshold):
    with pytest.raises(ValueError):
        ref._checked_confidences(confidences, threshold)


def test_the_provided_confidence_check_passes_good_inputs_as_floats():
    assert ref._checked_confidences(torch.tensor([0.5, 1.0]), 0.25) == [0.5, 1.0]
    assert ref._checked_confidences([1, 0.5], 0) == [1.0, 0.5]


@pytest.mark.parametrize(
    "x, w",
    [
        (torch.ones(3), torch.ones(3, 2)),
        (torch.ones(2, 3), torch.ones(3)),
        (torch.ones(2, 3), torch.ones(3, 2, dtype=torch.float64)),
        (torch.ones(2, 3, dtype=torch.int64), torch.ones(3, 2, dtype=torch.int64)),
        (torch.ones(2, 3), torch.ones(4, 5)),
    ],
)
def test_the_provided_matmul_check_refuses_bad_inputs(x, w):
    with pytest.raises(ValueError):
        ref._check_matmul(x, w)
    ref._check_matmul(torch.ones(2, 3), torch.ones(3, 5))


@pytest.mark.parametrize(
    "x, weight, eps, block",
    [
        (torch.ones(3), torch.ones(3), 1e-6, 4),
        (torch.ones(2, 0), torch.ones(0), 1e-6, 4),
        (torch.ones(2, 3), torch.ones(4), 1e-6, 4),
        (torch.ones(2, 3), torch.ones(3, dtype=torch.float64), 1e-6, 4),
        (torch.ones(2, 3, dtype=torch.int64), torch.ones(3, dtype=torch.int64), 1e-6, 4),
        (torch.ones(2, 3), torch.ones(3), -1e-6, 4),
        (torch.ones(2, 3), torch.ones(3), 1e-6, 6),
        (torch.ones(2, 3), torch.ones(3), 1e-6, 0),
        (torch.ones(2, 3), torch.ones(3), 1e-6, 4.0),
    ],
)
def test_the_provided_rms_norm_check_refuses_bad_inputs(x, weight, eps, block):
    with pytest.raises(ValueError):
        ref._check_rms_norm(x, weight, eps, block)
    ref._check_rms_norm(torch.ones(2, 3), torch.ones(3), 0.0, 1)


# -- the reference and the statistics ---------------------------------------------------------------
def test_reference_is_lossless_on_the_worked_example():
    # reference §I.1: q = (0.6, 0.3, 0.1), p = (0.3, 0.5, 0.2); drafts drawn from q; first token ~ p.
    g = torch.Generator().manual_seed(3)
    q, p = torch.tensor([[0.6, 0.3, 0.1]]), torch.tensor([[0.3, 0.5, 0.2], [1 / 3] * 3])
    n = 6000
    drafts = torch.multinomial(q[0], n, replacement=True, generator=g)
    u, e = torch.rand(n, generator=g), torch.empty(n, 2, 3).exponential_(generator=g)
    firsts = torch.tensor([ref.verify_draft([int(drafts[i])], q, p, u[i : i + 1], e[i])[0] for i in range(n)])
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
        alone = torch.cat([ref.batch_invariant_matmul(x[i : i + 1], w) for i in range(70)])
        for B in (2, 5, 33, 70):
            perm = torch.randperm(70, generator=g)[:B]
            assert torch.equal(ref.batch_invariant_matmul(x[perm], w).view(checks.INT_OF[dtype]), alone[perm].view(checks.INT_OF[dtype]))


def test_the_probe_reports_every_shape():
    found = checks.probe_matmul(torch.Generator().manual_seed(1))
    assert [(p["dtype"], p["K"], p["N"]) for p in found] == [(str(d).removeprefix("torch."), K, N) for d, K, N in checks.PROBE_SHAPES]
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


# -- the reference keeps every point on every seed ---------------------------------------------------------------------
def test_the_reference_keeps_each_dtypes_point_on_many_grading_seeds():
    # float16 results below 2⁻¹⁴ are subnormals, 2⁻²⁴ apart: a purely relative bound took this point from the
    # reference on about 6 % of the seeds (1521312249 among them).
    for seed in (1521312249, *range(200)):
        hidden_checks.rms_dtypes(reference_trial(hidden_checks.rms_dtypes, seed, ref))
