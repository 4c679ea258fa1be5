"""Comparisons: tolerances, infinities, and the structure messages students see."""

import pytest
import torch

from grader.authoring.compare import CheckFailed, expect_int, expect_tensor, first_wrong, wrong_mask


def test_infinities_only_match_themselves_under_a_tolerance():
    got = torch.tensor([2.0, float("-inf"), float("inf"), 1.0])
    want = torch.tensor([float("-inf"), float("-inf"), float("-inf"), 1.0 + 1e-9])
    assert wrong_mask(got, want, atol=1e-6, rtol=1e-5).tolist() == [True, False, True, False]


def test_nan_equals_nan_and_the_first_wrong_index_is_named():
    got = torch.tensor([[float("nan"), 1.0], [2.0, 3.0]])
    want = torch.tensor([[float("nan"), 1.0], [2.0, 4.0]])
    assert first_wrong(got, want) == (1, 1)
    assert first_wrong(got, got.clone()) is None


def test_structure_messages_say_what_was_expected_and_what_came():
    with pytest.raises(
        CheckFailed,
        match=r"expected the slots as a 1-D int64 tensor of shape \[5\]; "
        r"yours: float32 tensor \[5, 1\]",
    ):
        expect_tensor(torch.zeros(5, 1), what="the slots", shape=[5], dtype=torch.int64)
    with pytest.raises(CheckFailed, match=r"as a Python int; yours: int64 tensor \[\].*\.item\(\)"):
        expect_int(torch.tensor(3), what="the byte count")
    with pytest.raises(CheckFailed, match="yours: bool True"):
        expect_int(True, what="the byte count")
