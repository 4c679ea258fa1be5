"""ch26 · flattened batches and graph replay: wrong submissions that embody real misconceptions get the
teaching message meant for them, and the figures drawn from them mark the wrong cells."""

from __future__ import annotations

import pytest
import torch
from mutate import mutant_grader, result, statuses, wrong_elements

from grader.checks import ch26 as checks
from solutions import ch26_varlen_graphs as ref

SEED = 26


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return mutant_grader(tmp_path_factory, "ch26", SEED)


# -- 26.1 pack_varlen / unpack_varlen -------------------------------------------------------------------
def test_cu_seqlens_without_the_leading_zero_is_explained(graded):
    report = graded("no_leading_zero",
                    # cu_seqlens as the running sums alone: sequence 0's start is missing
                    ("cu_seqlens[1:] = lens.cumsum(0)", "cu_seqlens = lens.cumsum(0).to(torch.int32)"))
    r = result(report, "figure instance: pack", task="ch26.1")
    assert r.status == "failed"
    assert "expected cu_seqlens with B + 1 = 3 entries, [0, 3, 3 + 2 = 5]; yours: [3, 5]" in r.message
    assert "hint: cu_seqlens starts with 0" in r.message
    # unpack_varlen is right in this mutant, and the figure waits for pack's structure to be right.
    assert result(report, "figure instance: unpack", task="ch26.1").status == "passed"
    assert any("ch26-dim-varlen-pack: drawn once ch26.1 pass" in n for n in report.figure_notes)


def test_packing_token_by_token_is_explained(graded):
    report = graded("interleaved",
                    # packing the tokens in time order across requests (t0 of every request, then t1, …)
                    ("return padded[keep], cu_seqlens", "return padded.transpose(0, 1)[keep.T], cu_seqlens"))
    r = result(report, "figure instance: pack", task="ch26.1")
    assert r.status == "failed"
    padded = checks.padded_batch(checks.PACK_LENGTHS, checks.PACK_T, checks.PACK_H)
    assert (f"packed row 1 is request 0's token 1 (rows of request 0 start at 0), padded[0, 1] = "
            f"{checks._vec(padded[0, 1])}; yours: {checks._vec(padded[1, 0])}") in r.message
    assert "hint: pack request by request" in r.message
    assert result(report, "random batches", task="ch26.1").status == "failed"
    assert statuses(report, "ch26.2") == statuses(report, "ch26.3") == {"passed"}
    assert wrong_elements(report, "ch26-dim-varlen-pack")


def test_int64_cu_seqlens_is_caught(graded):
    report = graded("cu_int64",
                    # the course's int64 index convention applied where flash-attn needs int32
                    ("cu_seqlens = torch.zeros(B + 1, dtype=torch.int32)", "cu_seqlens = torch.zeros(B + 1, dtype=torch.int64)"))
    r = result(report, "figure instance: pack", task="ch26.1")
    assert r.status == "failed"
    assert "as an int32 tensor (flash-attn and nano-vllm take cu_seqlens as int32); yours: int64 tensor [3]" in r.message


def test_unpack_leaving_padding_unset_is_caught(graded):
    report = graded("padding_ones",
                    # padding positions filled with ones instead of zeros
                    ("out = packed.new_zeros(B, T_max, packed.shape[1])", "out = packed.new_ones(B, T_max, packed.shape[1])"))
    r = result(report, "figure instance: unpack", task="ch26.1")
    assert r.status == "failed"
    assert "padded[1, 2] is padding (request 1 has 2 tokens), so it must be 0; yours: [1, 1, 1, 1]" in r.message
    assert result(report, "figure instance: pack", task="ch26.1").status == "passed"
    assert wrong_elements(report, "ch26-dim-varlen-pack")


# -- 26.2 varlen_metadata -----------------------------------------------------------------------------
def test_key_boundaries_from_query_lengths_are_explained(graded):
    report = graded("cu_k_from_q",
                    # cu_seqlens_k built from the query lengths: the cached prefix is left out of attention
                    ("cu_q[1:], cu_k[1:] = q.cumsum(0), k.cumsum(0)", "cu_q[1:], cu_k[1:] = q.cumsum(0), q.cumsum(0)"))
    r = result(report, "figure instance", task="ch26.2")
    assert r.status == "failed"
    want = ref.varlen_metadata(checks.FLAT_QUERY, checks.FLAT_CACHED)["cu_seqlens_k"].tolist()
    assert "key lengths cached + query = [5, 11]" in r.message
    assert f"= [0, 5, 5 + 11 = {want[-1]}]; yours: [0, 5, 8]" in r.message
    assert "hint: after a prefix hit (or earlier chunks) the keys include the cached tokens" in r.message
    # Without a prefix hit the keys are the queries, so this mistake is invisible there.
    assert result(report, "no prefix hit", task="ch26.2").status == "passed"
    nano = result(report, "nano-vllm's worked example", task="ch26.2")
    assert nano.status == "failed" and "[0, 300, 300 + 600 = 900]; yours: [0, 300, 388]" in nano.message
    assert wrong_elements(report, "ch26-flatten")


def test_total_instead_of_max_is_explained(graded):
    report = graded("max_total",
                    # max_seqlen_q as the total number of tokens
                    ('"max_seqlen_q": int(q.max()) if q.numel() else 0', '"max_seqlen_q": int(q.sum()) if q.numel() else 0'))
    r = result(report, "figure instance", task="ch26.2")
    assert r.status == "failed"
    assert "max_seqlen_q = max([5, 3]) = 5; yours: 8" in r.message
    assert "hint: max_seqlen_q is the longest single sequence, not the total Σ = 8" in r.message
    assert wrong_elements(report, "ch26-flatten")


# -- 26.3 graph_batch_size / pad_decode_batch -----------------------------------------------------------
def test_rounding_the_graph_size_down_is_explained(graded):
    report = graded("round_down",
                    # the largest captured size ≤ bs: sequences beyond the graph are dropped
                    ("fits = [int(s) for s in captured_sizes if s >= batch_size]",
                     "fits = [int(s) for s in captured_sizes if s <= batch_size]"),
                    ("    return min(fits)", "    return max(fits)"))
    r = result(report, "figure instance: nano-vllm's captured sizes", task="ch26.3")
    assert r.status == "failed"
    assert "batch of 3, captured sizes [1, 2, 4, 8, 16, 32, 48, 64, …, 512]: the smallest captured size ≥ 3 is 4; " \
           "yours: 2" in r.message
    assert "hint: round up: a graph of 2 rows cannot hold 3 sequences" in r.message
    assert result(report, "figure instance: 5 sequences", task="ch26.3").status == "passed"
    assert wrong_elements(report, "ch26-graph-replay")


def test_padding_slots_with_zero_is_explained(graded):
    report = graded("pad_slot_zero",
                    # padding slots left at 0: slot 0 is a real slot, holding another sequence's K/V
                    ("slot_mapping = torch.full((graph_bs,), -1, dtype=torch.int32)",
                     "slot_mapping = torch.zeros(graph_bs, dtype=torch.int32)"))
    r = result(report, "figure instance: 5 sequences", task="ch26.3")
    assert r.status == "failed"
    assert "5 sequences in the graph of 8 rows (3 padding rows)" in r.message
    assert "row 5 is a padding row: its slot must be −1 so the cache write skips it; yours: 0" in r.message
    owner = next(i for i, tab in enumerate(checks.REPLAY_TABLES) if 0 in tab)
    assert f"hint: slot 0 is a real slot (block 0 is sequence {owner}'s block_table[0])" in r.message
    assert result(report, "a batch that fills its graph exactly", task="ch26.3").status == "passed"
    assert wrong_elements(report, "ch26-graph-replay")


def test_padding_only_to_the_batch_is_explained(graded):
    report = graded("pad_to_bs",
                    # block tables padded to bs rows, not to the graph's rows
                    ("table = torch.full((graph_bs, width), -1, dtype=torch.int32)",
                     "table = torch.full((bs, width), -1, dtype=torch.int32)"))
    r = result(report, "figure instance: 5 sequences", task="ch26.3")
    assert r.status == "failed"
    assert "expected block_tables as a 2-D int32 tensor of shape [8, 3]; yours: int32 tensor [5, 3]" in r.message
    assert "hint: the graph was captured for 8 rows: pad to graph_bs rows, not bs" in r.message


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
