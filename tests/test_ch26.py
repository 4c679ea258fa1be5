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
    assert (
        f"packed row 1 is request 0's token 1 (rows of request 0 start at 0), padded[0, 1] = "
        f"{vec(padded[0, 1])}; yours: {vec(padded[1, 0])}"
    ) in r.message
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
    assert "batch of 3, captured sizes [1, 2, 4, 8, 16, 32, 48, 64, …, 512]: the smallest captured size ≥ 3 is 4; yours: 2" in r.message
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


# -- 26.4 fill_static_buffers -----------------------------------------------------------------------------
def test_a_new_tensor_in_place_of_a_buffer_is_caught(graded):
    report = graded.mistake("new_buffer")  # full_like / zeros_like rebound in the dict: right values, wrong address
    r = result(report, "figure instance", task="ch26.4")
    assert r.status == "failed"
    assert "buffers['slot_mapping'] afterwards is a tensor of your own" in r.message and "other strides" in r.message
    assert r.hints == ["new_buffer"]
    assert statuses(report, "ch26.4") == {"failed"}
    assert statuses(report, "ch26.3") == {"passed"}


def test_padding_rows_left_from_the_previous_batch_are_explained(graded):
    report = graded.mistake("stale_rows")  # no reset: rows 5 and 6 keep the batch of 7's real slots
    r = result(report, "figure instance", task="ch26.4")
    assert r.status == "failed"
    assert "row 5 is beyond the batch of 5, a padding row in any graph that replays it" in r.message
    assert r.hints == ["stale_rows"]
    assert "row 5 still holds slot_mapping" in r.message, "the hint names the stale value"
    # A batch that fills every row has no padding row, so the mistake is invisible there.
    assert result(report, "a batch that fills every row", task="ch26.4").status == "passed"
    assert wrong_elements(report, "ch26-static-buffers")


def test_resetting_after_the_copy_is_explained(graded):
    report = graded.mistake("reset_order")
    r = result(report, "figure instance", task="ch26.4")
    assert r.status == "failed" and r.hints == ["reset_order"]
    assert "slot_mapping[0] is sequence 0's slot this step" in r.message


def test_returning_new_buffers_is_caught(graded):
    body = (
        '    buffers["slot_mapping"].fill_(-1)\n    buffers["context_lens"].zero_()\n'
        '    for key in ("input_ids", "positions", "slot_mapping", "context_lens"):\n'
        "        buffers[key][:bs] = batch[key]\n"
        '    buffers["block_tables"][:bs, :width] = batch["block_tables"]\n'
    )
    report = graded(
        "returns_new",
        (body, "    out = {k: v.clone() for k, v in buffers.items()}\n" + body.replace("buffers[", "out[") + "    return out\n"),
        task="ch26.4",
    )
    r = result(report, "figure instance", task="ch26.4")
    assert r.status == "failed" and r.hints == ["new_buffer"]
    assert "returns None; yours returned dict" in r.message


def test_clearing_cells_no_replay_reads_is_allowed(graded):
    report = graded(
        "clears_all",
        (
            '    buffers["context_lens"].zero_()\n',
            '    buffers["context_lens"].zero_()\n    buffers["input_ids"].zero_()\n    buffers["block_tables"].fill_(-1)\n',
        ),
        task="ch26.4",
    )
    assert statuses(report, "ch26.4") == {"passed"}


def static_pair(max_bs=4, blocks=3):
    buffers = checks.static_buffers(max_bs, blocks)
    batch = checks.decode_batch([(9, [7, 2, 11], 412), (4, [4], 77)])
    return buffers, batch


def test_the_reference_writes_through_views_of_a_pool():
    buffers, batch = static_pair()
    strides = {k: v.stride() for k, v in buffers.items()}
    assert ref.fill_static_buffers(buffers, batch) is None
    assert {k: v.stride() for k, v in buffers.items()} == strides
    assert buffers["slot_mapping"].tolist() == [44, 19, -1, -1]  # 11·4 + 0, 4·4 + 3
    assert buffers["block_tables"].tolist() == [[7, 2, 11], [4, -1, -1], [0, 0, 0], [0, 0, 0]]
    fresh = {k: v.clone() for k, v in buffers.items()}
    assert [k for k in fresh if checks.replaced(fresh[k], buffers[k])] == list(fresh)
    assert not any(checks.replaced(buffers[k], buffers[k]) for k in buffers)


def test_the_reference_matches_nano_vllm_run_model():
    # nanovllm/engine/model_runner.py (bb823b3) run_model: input_ids/positions [:bs]; slot_mapping fill_(-1) then
    # [:bs]; context_lens zero_() then [:bs]; block_tables[:bs, :width]; nothing else.
    buffers = {
        k: torch.full((8, 4) if k == "block_tables" else (8,), 5, dtype=torch.int64 if k in ("input_ids", "positions") else torch.int32)
        for k in checks.STATIC_KEYS
    }
    batch = checks.decode_batch(checks.STATIC_NOW)
    ref.fill_static_buffers(buffers, batch)
    bs, width = batch["block_tables"].shape
    assert buffers["input_ids"][bs:].tolist() == [5] * 3 and buffers["block_tables"][:, width:].eq(5).all()
    assert buffers["slot_mapping"][bs:].tolist() == [-1] * 3 and buffers["context_lens"][bs:].tolist() == [0] * 3
    assert torch.equal(buffers["block_tables"][:bs, :width], batch["block_tables"])


# The input checks every task needs but none teaches are provided code (outside the solution regions): plain unit
# tests here, no graded checks.
@pytest.mark.parametrize(
    "padded, lengths",
    [(torch.zeros(2, 3), [1, 2]), (torch.zeros(2, 3, 4), [1, 2, 3]), (torch.zeros(2, 3, 4), [1, -1]), (torch.zeros(2, 3, 4), [3, 4])],
)
def test_the_provided_pack_check_refuses_bad_inputs(padded, lengths):
    with pytest.raises(ValueError):
        ref.pack_varlen(padded, lengths)


@pytest.mark.parametrize(
    "packed, cu, T_max",
    [
        (torch.zeros(5), [0, 5], 5),
        (torch.zeros(5, 2), [], 5),
        (torch.zeros(5, 2), [1, 5], 5),
        (torch.zeros(5, 2), [0, 3, 4], 4),
        (torch.zeros(5, 2), [0, 4, 3, 5], 5),
        (torch.zeros(5, 2), [0, 3, 5], 2),
    ],
)
def test_the_provided_unpack_check_refuses_bad_inputs(packed, cu, T_max):
    with pytest.raises(ValueError):
        ref.unpack_varlen(packed, cu, T_max)


@pytest.mark.parametrize("query, cached", [([1], [0, 4]), ([3, -1], [0, 0]), ([3, 1], [0, -8])])
def test_the_provided_metadata_check_refuses_bad_inputs(query, cached):
    with pytest.raises(ValueError):
        ref.varlen_metadata(query, cached)


def test_the_provided_batch_size_check_refuses_an_empty_batch():
    for bs in (0, -3):
        with pytest.raises(ValueError):
            ref.graph_batch_size(bs, [1, 2, 4])
    assert ref.graph_batch_size(1, [4, 2]) == 2


@pytest.mark.parametrize(
    "slots, ctx, tables, graph_bs",
    [([1, 2], [1], [[0], [0]], 4), ([1, 2], [1, 1], [[0]], 4), ([1] * 9, [1] * 9, [[0]] * 9, 8), ([1, 2, 3], [1] * 3, [[0]] * 3, 2)],
)
def test_the_provided_decode_batch_check_refuses_bad_inputs(slots, ctx, tables, graph_bs):
    with pytest.raises(ValueError):
        ref.pad_decode_batch(slots, ctx, tables, graph_bs)


def bad_static(case):
    buffers, batch = static_pair()
    if case == "missing key":
        del batch["positions"]
    elif case == "float buffer":
        buffers["input_ids"] = buffers["input_ids"].float()
    elif case == "batch larger than the buffers":
        buffers = checks.static_buffers(2, 3)
        batch = checks.decode_batch([(2, [1], 5)] * 3)
    elif case == "tables wider than the buffers":
        buffers = checks.static_buffers(4, 2)
    elif case == "rows disagree":
        batch["context_lens"] = batch["context_lens"][:1]
    elif case == "empty batch":
        batch = {k: v[:0] for k, v in batch.items()}
    elif case == "1-D block tables":
        batch["block_tables"] = batch["block_tables"][:, 0]
    return buffers, batch


@pytest.mark.parametrize(
    "case",
    [
        "missing key",
        "float buffer",
        "batch larger than the buffers",
        "tables wider than the buffers",
        "rows disagree",
        "empty batch",
        "1-D block tables",
    ],
)
def test_the_provided_static_check_refuses_bad_inputs(case):
    with pytest.raises(ValueError):
        ref.fill_static_buffers(*bad_static(case))
