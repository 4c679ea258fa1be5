"""ch21 · the KV cache and the decode step: wrong submissions that embody real misconceptions get the
teaching message meant for them, and the figures drawn from them mark the wrong cells."""

from __future__ import annotations

import pytest
import torch
from mutate import mutant_grader, result, statuses, wrong_elements

from grader.authoring import vec
from grader.checks import ch21 as checks
from solutions import ch21_kv_cache as ref

SEED = 21


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return mutant_grader(tmp_path_factory, "ch21", SEED)


# -- 21.1 append_kv -----------------------------------------------------------------------------------
def test_appending_at_row_zero_is_explained(graded):
    report = graded.mistake("row_zero")  # every append written from row 0: decode steps overwrite the prompt
    r = result(report, "figure instance", task="ch21.1")
    assert r.status == "failed"
    k0, _ = checks.growth_kv(0, 0, 1)
    k3, _ = checks.growth_kv(0, 3, 1)
    assert "layer 0, decode step 1: length=3, n=1, L_max=6" in r.message
    assert f"k_cache row 0 holds a token cached before this append and must keep its K {vec(k0[0])}" in r.message
    assert f"yours holds {vec(k3[0])}" in r.message
    assert r.hints == ["row_zero"]
    assert result(report, "rows beyond the new length", task="ch21.1").status == "failed"
    assert result(report, "agrees with transformers", task="ch21.1").status == "failed"
    # The prefill (length 0) is right even so, and appends of nothing change nothing.
    assert result(report, "appends of 0 tokens", task="ch21.1").status == "passed"
    assert statuses(report, "ch21.2") == {"passed"}
    assert wrong_elements(report, "ch21-cache-growth")


def test_returning_the_old_length_is_explained(graded):
    report = graded.mistake("old_length")  # the caller never sees the cache grow
    r = result(report, "figure instance", task="ch21.1")
    assert r.status == "failed"
    assert "layer 0, prefill: 0 cached + 3 new → the new length is 0 + 3 = 3; yours: 0" in r.message
    assert r.hints == ["old_length"]
    dyn = result(report, "agrees with transformers", task="ch21.1")
    assert dyn.status == "failed" and "DynamicLayer holds 5 tokens; your append_kv returned the length 0" in dyn.message
    assert wrong_elements(report, "ch21-cache-growth"), "the returned lengths are marked"


def test_clearing_the_rest_of_the_cache_is_explained(graded):
    report = graded.mistake("clears_rest")  # the rows after the new tokens zeroed "to keep the cache clean"
    # Zeros where the cache already held zeros: the figure instance cannot tell.
    assert result(report, "figure instance", task="ch21.1").status == "passed"
    r = result(report, "rows beyond the new length", task="ch21.1")
    assert r.status == "failed"
    assert "k_cache row 5 is beyond the new length 5 and must keep its old value" in r.message
    assert "yours holds [0, 0, 0, 0" in r.message
    assert r.hints == ["clears_rest"]


# The input checks every task needs but none teaches are provided code (outside the solution regions): plain unit
# tests here, no graded checks.
BAD_APPENDS = {
    "overflow": (torch.zeros(4, 1, 2), torch.zeros(4, 1, 2), 3, torch.ones(2, 1, 2), torch.ones(2, 1, 2)),
    "full cache": (torch.zeros(7, 1, 4), torch.zeros(7, 1, 4), 7, torch.ones(1, 1, 4), torch.ones(1, 1, 4)),
    "other head count": (torch.zeros(5, 4, 4), torch.zeros(5, 4, 4), 0, torch.ones(1, 2, 4), torch.ones(1, 2, 4)),
    "other head_dim": (torch.zeros(6, 2, 4), torch.zeros(6, 2, 4), 0, torch.ones(1, 2, 8), torch.ones(1, 2, 8)),
    "k and v of other lengths": (torch.zeros(6, 2, 4), torch.zeros(6, 2, 4), 0, torch.ones(2, 2, 4), torch.ones(3, 2, 4)),
    "negative length": (torch.zeros(6, 2, 4), torch.zeros(6, 2, 4), -1, torch.ones(1, 2, 4), torch.ones(1, 2, 4)),
    "length beyond L_max": (torch.zeros(6, 2, 4), torch.zeros(6, 2, 4), 9, torch.ones(0, 2, 4), torch.ones(0, 2, 4)),
    "caches of other shapes": (torch.zeros(6, 2, 4), torch.zeros(5, 2, 4), 0, torch.ones(1, 2, 4), torch.ones(1, 2, 4)),
}


@pytest.mark.parametrize("case", BAD_APPENDS)
def test_the_provided_append_check_refuses_bad_inputs(case):
    with pytest.raises(ValueError):
        ref.append_kv(*BAD_APPENDS[case])


@pytest.mark.parametrize("token_ids, block_size", [([], 256), ([1, 2], 0), ([1, 2], -4)])
def test_the_provided_decode_check_refuses_bad_inputs(token_ids, block_size):
    with pytest.raises(ValueError):
        ref.decode_inputs(token_ids, [3], block_size)


# -- 21.2 decode_inputs -------------------------------------------------------------------------------
def test_position_len_is_explained(graded):
    report = graded.mistake("position_len")  # nano-vllm's own bug before f5b4840
    r = result(report, "figure instance", task="ch21.2")
    assert r.status == "failed"
    want = ref.decode_inputs(checks.DECODE_TOKENS, checks.DECODE_TABLE, checks.DECODE_BS)
    n = len(checks.DECODE_TOKENS)
    assert f"position = len − 1 = {n} − 1 = {want['position']}; yours: {n}" in r.message
    assert r.hints == ["position_len"]
    assert statuses(report, "ch21.1") == {"passed"}
    assert wrong_elements(report, "ch21-decode-step")


def test_slot_of_the_previous_token_is_explained(graded):
    report = graded.mistake("previous_slot")  # the slot of the last token whose K/V is cached
    r = result(report, "figure instance", task="ch21.2")
    assert r.status == "failed"
    want = ref.decode_inputs(checks.DECODE_TOKENS, checks.DECODE_TABLE, checks.DECODE_BS)
    prev = ref.decode_inputs(checks.DECODE_TOKENS[:-1], checks.DECODE_TABLE, checks.DECODE_BS)["slot"]
    assert f"block_table[1] = 2, so slot = 2·4 + 2 = {want['slot']}; yours: {prev}" in r.message
    assert r.hints == ["previous_slot"]
    assert "position = " not in r.message, "only the slot is wrong"
    nano = result(report, "nano-vllm's examples", task="ch21.2")
    assert nano.status == "failed" and "= 555; yours: 554" in nano.message
    assert result(report, "a whole generation", task="ch21.2").status == "failed"
    assert wrong_elements(report, "ch21-decode-step")


def test_context_without_the_newest_token_is_explained(graded):
    report = graded.mistake("context_short")  # the newest token's K/V left out of attention
    r = result(report, "figure instance", task="ch21.2")
    assert r.status == "failed"
    assert "context_len = len = 7" in r.message and "yours: 6" in r.message
    assert r.hints == ["context_short"]
    assert wrong_elements(report, "ch21-decode-step")


def test_last_block_of_a_longer_table_is_explained(graded):
    report = graded.mistake("table_last")  # right only when the table has exactly ceil(len / bs) blocks
    assert result(report, "figure instance", task="ch21.2").status == "passed"
    assert result(report, "a whole generation", task="ch21.2").status == "passed"
    r = result(report, "a block table with a spare block", task="ch21.2")
    assert r.status == "failed"
    assert "block_table[1] = 0, so slot = 0·4 + 1 = 1; yours: 37" in r.message
    assert r.hints == ["table_last"]


def test_a_table_too_short_must_be_refused(graded):
    report = graded.mistake("short_table")  # no check of the table: block_table[logical] raises IndexError
    r = result(report, "a block table too short", task="ch21.2")
    assert r.status == "failed"
    assert "should raise ValueError because position 4 is in logical block 1" in r.message
    assert "yours raised IndexError" in r.message
    assert r.hints == ["short_table"]
    hidden = result(report, "tables too short", task="ch21.2")
    assert hidden.status == "failed" and hidden.hints == ["short_table"]
    assert {(x.task, x.name) for x in report.results if x.status != "passed"} == {(r.task, r.name), (hidden.task, hidden.name)}


def test_reference_decode_matches_nano_vllm_examples():
    # reference/nanovllm.md §12 prepare_decode, block_size 256.
    ids = list(range(300))
    assert ref.decode_inputs(ids, [7, 2], 256) == {"input_id": 299, "position": 299, "context_len": 300, "slot": 555}
    assert ref.decode_inputs(list(range(10)), [5], 256)["slot"] == 1289
    assert ref.decode_inputs(list(range(257)), [9, 4], 256)["slot"] == 1024


def test_reference_append_keeps_tokens_in_order_and_leaves_the_rest():
    # HF's StaticLayer writes rows cumulative_length … + n of a max_cache_len buffer; so does append_kv.
    g = torch.Generator().manual_seed(0)
    k_cache, v_cache = torch.zeros(8, 2, 4), torch.zeros(8, 2, 4)
    length, rows = 0, []
    for n in (3, 1, 0, 2):
        k = torch.randn(n, 2, 4, generator=g)
        length = ref.append_kv(k_cache, v_cache, length, k, -k)
        rows.append(k)
    assert type(length) is int and length == 6
    assert torch.equal(k_cache[:6], torch.cat(rows)) and torch.equal(v_cache[:6], -torch.cat(rows))
    assert not k_cache[6:].any()
