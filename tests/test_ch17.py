"""ch17 · causal masks: wrong submissions that embody real misconceptions get the teaching
message meant for them, and the figures drawn from them mark the wrong cells."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from mutate import mutant_grader, result, row, statuses, wrong_elements

from grader.checks import ch17 as checks
from solutions import ch17_causal_masks as ref

SEED = 17
N, C = checks.FIGURE_NEW, checks.FIGURE_CACHED
T = checks.FIGURE_TOKENS


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return mutant_grader(tmp_path_factory, "ch17", SEED)


def test_top_left_tril_for_a_chunk(graded):
    """torch.tril(ones(L, S)) for a chunk: query 0 sees only key 0 instead of the cached prefix."""
    report = graded.mistake("topleft")
    assert statuses(report, "ch17.1") == {"passed"}
    r = result(report, "figure instance", task="ch17.2")
    assert r.status == "failed"
    want = ref.causal_mask_with_offset(N, C)
    last_visible = int(want[0].nonzero().max())
    assert last_visible == C
    assert f"inputs: num_new={N}, num_cached={C}" in r.message
    assert f"query 0 is the token at absolute position {C} + 0 = {C}, so it sees keys 0–{last_visible}" in r.message
    assert "your row 0 sees only key 0" in r.message
    assert r.hints == ["topleft"]
    assert result(report, "a decode step", task="ch17.2").status == "failed"
    # A mask without an offset is right when nothing is cached.
    assert result(report, "nothing cached", task="ch17.2").status == "passed"
    assert result(report, "num_cached 0 equals", task="ch17.2").status == "passed"
    sdpa = result(report, "agrees with scaled_dot_product_attention", task="ch17.2")
    assert sdpa.status == "failed"
    assert "must equal the last" in sdpa.message and "is_causal=True" in sdpa.message
    assert "SDPA's own is_causal=True uses when L ≠ S" in sdpa.message
    assert wrong_elements(report, "ch17-offset-mask")
    assert not wrong_elements(report, "ch17-causal-mask")


def test_inverted_mask(graded):
    """True = masked: the additive-mask habit carried over to a bool mask."""
    report = graded.mistake("inverted")
    r = result(report, "figure instance", task="ch17.1")
    assert r.status == "failed"
    assert f"inputs: num_tokens={T}" in r.message
    assert "query 0 is the token at position 0, so it sees only key 0 (itself); your row 0 sees keys 1–" in r.message
    assert r.hints == ["inverted"]
    r2 = result(report, "figure instance", task="ch17.2")
    assert r2.status == "failed" and r2.hints == ["inverted"]
    assert wrong_elements(report, "ch17-causal-mask")
    assert wrong_elements(report, "ch17-offset-mask")


def test_float_mask_with_the_right_values(graded):
    """1.0/0.0 instead of True/False: SDPA would add it to the scores."""
    report = graded.mistake("float_values")
    for task in ("ch17.1", "ch17.2"):
        assert statuses(report, task) <= {"failed", "passed"}
        r = result(report, "figure instance", task=task)
        shape = list((ref.causal_mask(T) if task == "ch17.1" else ref.causal_mask_with_offset(N, C)).shape)
        assert r.status == "failed"
        assert f"expected the mask as a 2-D bool tensor of shape {shape}; yours: float32 tensor {shape}" in r.message
        assert r.hints == ["float_values"]
    # The structure check comes before the figure is recorded: nothing to draw.
    assert not report.figures and not report.figure_notes


def test_dropped_diagonal(graded):
    """tril(diagonal=-1): a token that cannot see itself."""
    report = graded.mistake("drop_diagonal", *row("ch17", "drop_diagonal_offset").edits)
    r = result(report, "figure instance", task="ch17.1")
    assert r.status == "failed"
    assert "your row 0 sees no key at all" in r.message
    assert r.hints == ["drop_diagonal"]
    assert result(report, "a single token", task="ch17.1").status == "failed"
    assert result(report, "a single token", task="ch17.1").hints == ["drop_diagonal"]
    r2 = result(report, "figure instance", task="ch17.2")
    assert f"sees keys 0–{C}; your row 0 sees keys 0–{C - 1}" in r2.message
    assert r2.hints == ["drop_diagonal_offset"]
    assert wrong_elements(report, "ch17-causal-mask")
    assert wrong_elements(report, "ch17-offset-mask")


# -- the message helpers on misconceptions that need no submission ------------------------------


def test_additive_float_mask_is_recognised():
    want = ref.causal_mask_with_offset(N, C)
    additive = torch.zeros(want.shape).masked_fill(~want, float("-inf"))
    hint = checks.structure_hint(additive, list(want.shape), want, N, C, whole=False)
    assert hint.id == "additive"


def test_integer_mask_is_recognised():
    want = ref.causal_mask(T)
    hint = checks.structure_hint(want.long(), list(want.shape), want, T, 0, whole=True)
    assert hint.id == "int_values"


@pytest.mark.parametrize(
    "shape, mistake",
    [((N, N), "new_keys_only"), ((N + C, N + C), "every_row"), ((N, C), "cached_keys_only"), ((N + C, N), "keys_by_queries")],
)
def test_wrong_shapes_are_explained(shape, mistake):
    want = ref.causal_mask_with_offset(N, C)
    got = torch.ones(shape, dtype=torch.bool).tril()
    with pytest.raises(checks.CheckFailed) as e:
        checks.expect_mask(got, want, N, C, whole=False)
    assert f"shape {list(want.shape)}; yours: bool tensor {list(shape)}" in str(e.value)
    assert e.value.hints == [mistake]


def test_hidden_prefix_and_off_by_one_hints():
    n, c = 3, 4
    want = ref.causal_mask_with_offset(n, c)
    no_prefix = want.clone()
    no_prefix[:, :c] = False
    assert checks.mask_problem(no_prefix, want, n, c, False).hints == ["prefix_hidden"]
    ahead = torch.ones(n, n + c, dtype=torch.bool).tril(c + 1)
    problem = checks.mask_problem(ahead, want, n, c, False)
    assert f"so it sees keys 0–{c}; your row 0 sees keys 0–{c + 1}" in problem.lines[0]
    assert problem.hints == ["one_ahead"]
    assert checks.mask_problem(want, want, n, c, False) is None


def test_keys_text():
    assert checks.keys_text([True, False, False]) == "only key 0"
    assert checks.keys_text([False, False]) == "no key at all"
    assert checks.keys_text([True, True, False, True]) == "keys 0–1, 3"


def test_sdpa_is_causal_is_top_left_for_a_chunk():
    """The fact the chapter warns about: SDPA's is_causal=True with L ≠ S is the top-left tril,
    so it disagrees with the chunk mask; the chunk mask reproduces full causal attention."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, N + C, 4, generator=g, dtype=torch.float64) for _ in range(3))
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True)[:, C:]
    chunk = F.scaled_dot_product_attention(q[:, C:], k, v, attn_mask=ref.causal_mask_with_offset(N, C))
    torch.testing.assert_close(chunk, full)
    sdpa_causal = F.scaled_dot_product_attention(q[:, C:], k, v, is_causal=True)
    top_left = F.scaled_dot_product_attention(q[:, C:], k, v, attn_mask=torch.ones(N, N + C, dtype=torch.bool).tril())
    torch.testing.assert_close(sdpa_causal, top_left)
    assert not torch.allclose(sdpa_causal, full)


# -- the provided input checks (outside the solution regions: unit tests, no graded checks) ---------------------


@pytest.mark.parametrize("bad", [-1, 2.5, True, "3", None])
def test_the_provided_count_check_refuses_what_is_not_a_number_of_tokens(bad):
    with pytest.raises(ValueError, match="a non-negative int"):
        ref.causal_mask(bad)
    with pytest.raises(ValueError, match="num_new is a number of tokens"):
        ref.causal_mask_with_offset(bad, 3)
    with pytest.raises(ValueError, match="num_cached is a number of tokens"):
        ref.causal_mask_with_offset(2, bad)


def test_the_provided_count_check_lets_zero_through():
    assert ref.causal_mask(0).shape == (0, 0)
    assert ref.causal_mask_with_offset(0, 4).shape == (0, 4)
    assert ref.causal_mask_with_offset(3, 0).shape == (3, 3)
