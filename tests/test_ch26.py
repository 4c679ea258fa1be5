"""ch26 · flattened batches and graph replay: wrong submissions that embody real misconceptions get the
teaching message meant for them, and the figures drawn from them mark the wrong cells."""

from __future__ import annotations

import pytest
import torch
from mutate import mutant_grader, result, statuses, wrong_elements

from grader.authoring import vec
from grader.checks import ch26 as checks
from solutions import ch26_varlen_graphs as ref

SEED = 26


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return mutant_grader(tmp_path_factory, "ch26", SEED)


# -- 26.1 pack_varlen / unpack_varlen -------------------------------------------------------------------
def test_cu_seqlens_without_the_leading_zero_is_explained(graded):
    report = graded.mistake("no_leading_zero")  # cu_seqlens as the running sums alone: sequence 0's start is missing
    r = result(report, "figure instance: pack", task="ch26.1")
    assert r.status == "failed"
    assert "expected cu_seqlens with B + 1 = 3 entries, [0, 3, 3 + 2 = 5]; yours: [3, 5]" in r.message
    assert r.hints == ["no_leading_zero"]
    # unpack_varlen is right in this mutant, and the figure waits for pack's structure to be right.
    assert result(report, "figure instance: unpack", task="ch26.1").status == "passed"
    assert any("ch26-dim-varlen-pack: drawn once ch26.1 pass" in n for n in report.figure_notes)


def test_packing_token_by_token_is_explained(graded):
    report = graded.mistake("token_major")  # the tokens in time order across requests (t0 of every request, then t1, …)
    r = result(report, "figure instance: pack", task="ch26.1")
    assert r.status == "failed"
    padded = checks.padded_batch(checks.PACK_LENGTHS, checks.PACK_T, checks.PACK_H)
    assert (f"packed row 1 is request 0's token 1 (rows of request 0 start at 0), padded[0, 1] = "
            f"{vec(padded[0, 1])}; yours: {vec(padded[1, 0])}") in r.message
    assert r.hints == ["token_major"]
    assert result(report, "random batches", task="ch26.1").status == "failed"
    assert statuses(report, "ch26.2") == statuses(report, "ch26.3") == {"passed"}
    assert wrong_elements(report, "ch26-dim-varlen-pack")


def test_int64_cu_seqlens_is_caught(graded):
    report = graded.mistake("int64_cu")  # the course's int64 index convention applied where flash-attn needs int32
    r = result(report, "figure instance: pack", task="ch26.1")
    assert r.status == "failed"
    assert "expected cu_seqlens as an int32 tensor; yours: int64 tensor [3]" in r.message
    assert r.hints == ["int64_cu"]


def test_unpack_leaving_padding_unset_is_caught(graded):
    report = graded.mistake("padding_not_zero")  # padding positions filled with ones instead of zeros
    r = result(report, "figure instance: unpack", task="ch26.1")
    assert r.status == "failed"
    assert "padded[1, 2] is padding (request 1 has 2 tokens), so it must be 0; yours: [1, 1, 1, 1]" in r.message
    assert r.hints == ["padding_not_zero"]
    assert result(report, "figure instance: pack", task="ch26.1").status == "passed"
    assert wrong_elements(report, "ch26-dim-varlen-pack")


# -- 26.2 varlen_metadata -----------------------------------------------------------------------------
def test_key_boundaries_from_query_lengths_are_explained(graded):
    report = graded.mistake("keys_without_cache")  # cu_seqlens_k from the query lengths: no cached prefix in attention
    r = result(report, "figure instance", task="ch26.2")
    assert r.status == "failed"
    want = ref.varlen_metadata(checks.FLAT_QUERY, checks.FLAT_CACHED)["cu_seqlens_k"].tolist()
    assert "key lengths cached + query = [5, 11]" in r.message
    assert f"= [0, 5, 5 + 11 = {want[-1]}]; yours: [0, 5, 8]" in r.message
    assert r.hints == ["keys_without_cache"]
    # Without a prefix hit the keys are the queries, so this mistake is invisible there.
    assert result(report, "no prefix hit", task="ch26.2").status == "passed"
    nano = result(report, "nano-vllm's worked example", task="ch26.2")
    assert nano.status == "failed" and "[0, 300, 300 + 600 = 900]; yours: [0, 300, 388]" in nano.message
    assert nano.hints == ["keys_without_cache"]
    assert wrong_elements(report, "ch26-flatten")


def test_total_instead_of_max_is_explained(graded):
    report = graded.mistake("max_total")  # max_seqlen_q as the total number of tokens
    r = result(report, "figure instance", task="ch26.2")
    assert r.status == "failed"
    assert "max_seqlen_q = max([5, 3]) = 5; yours: 8" in r.message
    assert r.hints == ["max_total"]
    assert r.message.endswith(f"hint: {checks.M.max_total.format(key='max_seqlen_q', total=8)}"), "its fields filled"
    assert wrong_elements(report, "ch26-flatten")


# -- 26.3 graph_batch_size / pad_decode_batch -----------------------------------------------------------
def test_rounding_the_graph_size_down_is_explained(graded):
    report = graded.mistake("round_down")  # the largest captured size ≤ bs: sequences beyond the graph are dropped
    r = result(report, "figure instance: nano-vllm's captured sizes", task="ch26.3")
    assert r.status == "failed"
    assert "batch of 3, captured sizes [1, 2, 4, 8, 16, 32, 48, 64, …, 512]: the smallest captured size ≥ 3 is 4; " \
           "yours: 2" in r.message
    assert r.hints == ["round_down"]
    assert result(report, "figure instance: 5 sequences", task="ch26.3").status == "passed"
    assert wrong_elements(report, "ch26-graph-replay")


def test_padding_slots_with_zero_is_explained(graded):
    report = graded.mistake("pad_slot_real")  # padding slots left at 0: slot 0 is a real slot, another sequence's K/V
    r = result(report, "figure instance: 5 sequences", task="ch26.3")
    assert r.status == "failed"
    assert "5 sequences in the graph of 8 rows (3 padding rows)" in r.message
    assert "row 5 is a padding row: its slot must be −1 so the cache write skips it; yours: 0" in r.message
    owner = next(i for i, tab in enumerate(checks.REPLAY_TABLES) if 0 in tab)
    assert r.hints == ["pad_slot_real"]
    assert f"(block 0 is sequence {owner}'s block_table[0])" in r.message, "the hint names the owner of slot 0"
    assert result(report, "a batch that fills its graph exactly", task="ch26.3").status == "passed"
    assert wrong_elements(report, "ch26-graph-replay")


def test_padding_only_to_the_batch_is_explained(graded):
    report = graded.mistake("pad_to_bs")  # block tables padded to bs rows, not to the graph's rows
    r = result(report, "figure instance: 5 sequences", task="ch26.3")
    assert r.status == "failed"
    assert "expected block_tables as a 2-D int32 tensor of shape [8, 3]; yours: int32 tensor [5, 3]" in r.message
    assert r.hints == ["pad_to_bs"]


def test_reference_matches_nano_vllm_examples():
    # reference/nanovllm.md §12: the worked prefill and run_model's graph choices.
    m = ref.varlen_metadata([300, 88], [0, 512])
    assert m["cu_seqlens_q"].tolist() == [0, 300, 388] and m["cu_seqlens_k"].tolist() == [0, 300, 900]
    assert (m["max_seqlen_q"], m["max_seqlen_k"]) == (300, 600) and m["cu_seqlens_q"].dtype == torch.int32
    assert len(checks.NANO_SIZES) == 36
    assert ref.graph_batch_size(37, checks.NANO_SIZES) == 48 and ref.graph_batch_size(5, checks.NANO_SIZES) == 8
    out = ref.pad_decode_batch([555, 1289], [300, 10], [[7, 2], [5]], 2)
    assert out["block_tables"].tolist() == [[7, 2], [5, -1]]


def test_pack_and_unpack_round_trip():
    g = torch.Generator().manual_seed(1)
    for _ in range(50):
        B, T = int(torch.randint(1, 6, (1,), generator=g)), int(torch.randint(1, 8, (1,), generator=g))
        lengths = torch.randint(0, T + 1, (B,), generator=g).tolist()
        padded = torch.randn(B, T, 3, generator=g)
        packed, cu = ref.pack_varlen(padded, lengths)
        assert packed.shape[0] == sum(lengths) and cu.dtype == torch.int32
        mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None])[..., None]
        assert torch.equal(ref.unpack_varlen(packed, cu, T), padded * mask)
