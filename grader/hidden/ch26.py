"""Hidden checks of ch26 · flattened batches and graph replay: random instances from the grading seed,
nano-vllm's worked example and its captured sizes, edge cases, bad inputs."""

from __future__ import annotations

import torch

from grader.authoring import CheckFailed, Trial, first_wrong, hidden
from grader.checks.ch26 import (
    NANO_SIZES,
    explain_graph_size,
    explain_padded,
    explain_unpacked,
    run_metadata_case,
    run_pack_case,
    run_pad_case,
    run_unpack_case,
)

# -- ch26.1 pack_varlen / unpack_varlen -------------------------------------------------------------------

@hidden("ch26.1", "random batches: pack, unpack and the round trip")
def random_round_trips(t: Trial) -> None:
    for i in range(10):
        B, T_max, H = t.random.randint(1, 6), t.random.randint(1, 9), t.random.choice([1, 3, 8, 64])
        dtype = torch.bfloat16 if i % 3 == 2 else torch.float32
        lengths = random_lengths(t, B, T_max)
        padded = torch.randn(B, T_max, H, generator=t.rng).to(dtype)
        case = f"random batch {i + 1}: B {B}, T_max {T_max}, H {H}, {str(dtype).removeprefix('torch.')}"
        packed, cu = run_pack_case(t, padded, lengths, case, as_tensor=i % 2 == 1)
        back = run_unpack_case(t, packed, cu.tolist(), T_max, case)
        keep = torch.arange(T_max)[None, :, None] < torch.tensor(lengths)[:, None, None]
        idx = first_wrong(back, padded * keep)
        if idx is not None:
            raise CheckFailed(f"{case}: unpack_varlen(pack_varlen(padded, lengths)) should give padded back with "
                              f"zeros at padding; position {list(idx)} differs")


@hidden("ch26.1", "zero-length requests, and a batch of only empty requests")
def zero_lengths(t: Trial) -> None:
    padded = torch.randn(4, 3, 2, generator=t.rng)
    run_pack_case(t, padded, [0, 3, 0, 1], "lengths [0, 3, 0, 1]")
    run_pack_case(t, padded, [0, 0, 0, 0], "lengths [0, 0, 0, 0]")
    run_unpack_case(t, torch.zeros(0, 2), [0, 0, 0], 3, "two empty requests")
    run_unpack_case(t, torch.randn(2, 2, generator=t.rng), [0, 0, 2, 2], 2, "empty requests around one of 2")


@hidden("ch26.1", "cu_seqlens is int32 even when the lengths come as an int64 tensor")
def int32_from_int64(t: Trial) -> None:
    padded = torch.randn(3, 5, 4, generator=t.rng)
    run_pack_case(t, padded, [5, 2, 4], "lengths as an int64 tensor", as_tensor=True)


@hidden("ch26.1", "unpack works from the packed rows of a real prefill (long requests)")
def long_requests(t: Trial) -> None:
    lengths, H = [300, 88, 1, 512], 16
    packed = torch.randn(sum(lengths), H, generator=t.rng)
    cu = [0] + torch.tensor(lengths).cumsum(0).tolist()
    got = t.yours.unpack_varlen(packed, torch.tensor(cu, dtype=torch.int32), 512)
    explain_unpacked(got, packed, cu, 512, "lengths [300, 88, 1, 512], T_max 512")


@hidden("ch26.1", "bad inputs raise ValueError")
def bad_pack_inputs(t: Trial) -> None:
    t.expect_raises(ValueError, t.yours.pack_varlen, torch.zeros(2, 3, 4), [1, 2, 3],
                    because="3 lengths for a batch of B = 2")
    t.expect_raises(ValueError, t.yours.pack_varlen, torch.zeros(2, 3, 4), [1, -1], because="a length cannot be negative")
    t.expect_raises(ValueError, t.yours.pack_varlen, torch.zeros(1, 3, 4), [5], because="5 tokens do not fit in T_max = 3")
    t.expect_raises(ValueError, t.yours.unpack_varlen, torch.zeros(5, 2), [0, 3, 5], 2,
                    because="request 0 has 3 tokens, more than T_max = 2")
    t.expect_raises(ValueError, t.yours.unpack_varlen, torch.zeros(5, 2), [0, 3, 4], 4,
                    because="cu_seqlens ends at 4 but packed has N = 5 rows")


# -- ch26.2 varlen_metadata -----------------------------------------------------------------------------

@hidden("ch26.2", "nano-vllm's worked example: A 300 new; B 512 cached + 88 new")
def nano_vllm_example(t: Trial) -> None:
    # reference/nanovllm.md §12: cu_seqlens_q [0, 300, 388], cu_seqlens_k [0, 300, 900], max 300 / 600.
    run_metadata_case(t, [300, 88], [0, 512], "nano-vllm's worked prefill")


@hidden("ch26.2", "random batches with prefix hits and continuing chunks")
def random_metadata(t: Trial) -> None:
    for i in range(20):
        B = t.random.randint(1, 8)
        query = [t.random.randint(1, 600) for _ in range(B)]
        cached = [t.random.choice([0, 0, 256 * t.random.randint(1, 4), t.random.randint(1, 2000)]) for _ in range(B)]
        run_metadata_case(t, query, cached, f"random batch {i + 1}")


@hidden("ch26.2", "edge cases: one sequence, zero new tokens, nothing cached")
def metadata_edges(t: Trial) -> None:
    run_metadata_case(t, [1], [0], "one token, nothing cached")
    run_metadata_case(t, [7, 0, 2], [3, 256, 0], "a sequence with 0 new tokens (nano-vllm issue #144)")
    run_metadata_case(t, [512], [0], "one full prompt")


@hidden("ch26.2", "bad inputs raise ValueError")
def bad_metadata_inputs(t: Trial) -> None:
    t.expect_raises(ValueError, t.yours.varlen_metadata, [1], [0, 4], because="1 query length but 2 cached lengths")
    t.expect_raises(ValueError, t.yours.varlen_metadata, [3, -1], [0, 0], because="a query length cannot be negative")
    t.expect_raises(ValueError, t.yours.varlen_metadata, [3, 1], [0, -8], because="a cached length cannot be negative")


# -- ch26.3 graph_batch_size / pad_decode_batch -----------------------------------------------------------

@hidden("ch26.3", "nano-vllm's captured sizes: batches 1 … 64 and random ones up to 512")
def nano_vllm_sizes(t: Trial) -> None:
    batches = list(range(1, 65)) + [t.random.randint(65, 512) for _ in range(30)] + [511, 512]
    for bs in batches:
        explain_graph_size(t.yours.graph_batch_size(bs, list(NANO_SIZES)), bs, NANO_SIZES)


@hidden("ch26.3", "random captured sizes in any order")
def random_captured_sizes(t: Trial) -> None:
    for _ in range(20):
        sizes = t.random.sample(range(1, 200), t.random.randint(1, 8))
        bs = t.random.randint(1, max(sizes))
        explain_graph_size(t.yours.graph_batch_size(bs, list(sizes)), bs, sizes)


@hidden("ch26.3", "max_num_seqs 20 captures up to 16: batches 17–20 find no graph")
def no_graph_for_large_batches(t: Trial) -> None:
    # nano-vllm's edge case: max_num_seqs = 20 gives graph_bs [1, 2, 4, 8, 16]; its next(...) raises StopIteration.
    sizes = [1, 2, 4, 8, 16]
    explain_graph_size(t.yours.graph_batch_size(16, sizes), 16, sizes)
    for bs in (17, 20):
        t.expect_raises(ValueError, t.yours.graph_batch_size, bs, sizes,
                        because=f"no captured size holds {bs} sequences (the largest is 16)")
    t.expect_raises(ValueError, t.yours.graph_batch_size, 1, [], because="nothing was captured")
    t.expect_raises(ValueError, t.yours.graph_batch_size, 0, sizes, because="a decode batch has at least one sequence")


@hidden("ch26.3", "random decode batches padded to their graph")
def random_padding(t: Trial) -> None:
    for i in range(12):
        bs, block_size = t.random.randint(1, 40), t.random.choice([4, 16, 256])
        graph_bs = min(s for s in NANO_SIZES if s >= bs)
        ctx = [t.random.randint(1, 6 * block_size) for _ in range(bs)]
        pool = torch.randperm(400, generator=t.rng).tolist()
        tables = [[pool.pop() for _ in range(-(-c // block_size))] for c in ctx]
        slots = [tab[(c - 1) // block_size] * block_size + (c - 1) % block_size for c, tab in zip(ctx, tables)]
        run_pad_case(t, slots, ctx, tables, graph_bs, f"random batch {i + 1}", block_size)


@hidden("ch26.3", "inputs as int32 tensors, as nano-vllm holds them")
def tensor_inputs(t: Trial) -> None:
    slots, ctx, tables = [10, 18, 12], [7, 3, 9], [[7, 2], [4], [1, 6, 3]]
    got = t.yours.pad_decode_batch(torch.tensor(slots, dtype=torch.int32), torch.tensor(ctx, dtype=torch.int32),
                                   tables, 4)
    explain_padded(got, slots, ctx, tables, 4, "int32 tensor inputs", 4)


@hidden("ch26.3", "bad inputs raise ValueError")
def bad_pad_inputs(t: Trial) -> None:
    t.expect_raises(ValueError, t.yours.pad_decode_batch, [1, 2], [1], [[0], [0]], 4,
                    because="2 slots but only 1 context_len")
    t.expect_raises(ValueError, t.yours.pad_decode_batch, [1, 2], [1, 1], [[0]], 4,
                    because="2 slots but only 1 block table")
    t.expect_raises(ValueError, t.yours.pad_decode_batch, [1] * 9, [1] * 9, [[0]] * 9, 8,
                    because="a graph of 8 rows cannot hold 9 sequences")


# -- helpers ----------------------------------------------------------------------------------------------------

def random_lengths(t: Trial, B: int, T_max: int) -> list[int]:
    return [t.random.choice([0, T_max, t.random.randint(0, T_max)]) for _ in range(B)]
