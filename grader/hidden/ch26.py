"""Hidden checks of ch26 · flattened batches and graph replay: random instances from the grading seed,
nano-vllm's worked example and its captured sizes, edge cases, bad inputs."""

from __future__ import annotations

import torch

from grader.authoring import CheckFailed, Trial, first_wrong, hidden
from grader.checks.ch26 import (
    NANO_SIZES,
    decode_batch,
    explain_graph_size,
    explain_padded,
    explain_unpacked,
    filled_buffers,
    run_metadata_case,
    run_pack_case,
    run_pad_case,
    run_static_case,
    run_unpack_case,
    stale,
    static_buffers,
)
from grader.i18n import tr

# -- ch26.1 pack_varlen / unpack_varlen -------------------------------------------------------------------


@hidden("ch26.1", "random batches: pack, unpack and the round trip")
def random_round_trips(t: Trial) -> None:
    for i in range(10):
        B, T_max, H = t.random.randint(1, 6), t.random.randint(1, 9), t.random.choice([1, 3, 8, 64])
        dtype = torch.bfloat16 if i % 3 == 2 else torch.float32
        lengths = random_lengths(t, B, T_max)
        padded = torch.randn(B, T_max, H, generator=t.rng).to(dtype)
        case = tr("random batch {k}", k=i + 1) + f": B {B}, T_max {T_max}, H {H}, {str(dtype).removeprefix('torch.')}"
        packed, cu = run_pack_case(t, padded, lengths, case, as_tensor=i % 2 == 1)
        back = run_unpack_case(t, packed, cu.tolist(), T_max, case)
        keep = torch.arange(T_max)[None, :, None] < torch.tensor(lengths)[:, None, None]
        idx = first_wrong(back, padded * keep)
        if idx is not None:
            raise CheckFailed(
                tr(
                    "{case}: unpack_varlen(pack_varlen(padded, lengths)) should give padded back with zeros at padding; "
                    "position {idx} differs",
                    case=case,
                    idx=list(idx),
                )
            )


@hidden("ch26.1", "zero-length requests, and a batch of only empty requests")
def zero_lengths(t: Trial) -> None:
    padded = torch.randn(4, 3, 2, generator=t.rng)
    run_pack_case(t, padded, [0, 3, 0, 1], tr("lengths {lengths}", lengths=[0, 3, 0, 1]))
    run_pack_case(t, padded, [0, 0, 0, 0], tr("lengths {lengths}", lengths=[0, 0, 0, 0]))
    run_unpack_case(t, torch.zeros(0, 2), [0, 0, 0], 3, tr("two empty requests"))
    run_unpack_case(t, torch.randn(2, 2, generator=t.rng), [0, 0, 2, 2], 2, tr("empty requests around one of {n}", n=2))


@hidden("ch26.1", "cu_seqlens is int32 even when the lengths come as an int64 tensor")
def int32_from_int64(t: Trial) -> None:
    padded = torch.randn(3, 5, 4, generator=t.rng)
    run_pack_case(t, padded, [5, 2, 4], tr("lengths as an int64 tensor"), as_tensor=True)


@hidden("ch26.1", "unpack works from the packed rows of a real prefill (long requests)")
def long_requests(t: Trial) -> None:
    lengths, H = [300, 88, 1, 512], 16
    packed = torch.randn(sum(lengths), H, generator=t.rng)
    cu = [0] + torch.tensor(lengths).cumsum(0).tolist()
    got = t.yours.unpack_varlen(packed, torch.tensor(cu, dtype=torch.int32), 512)
    explain_unpacked(got, packed, cu, 512, tr("lengths {lengths}", lengths=lengths) + ", T_max 512")


# -- ch26.2 varlen_metadata -----------------------------------------------------------------------------


@hidden("ch26.2", "nano-vllm's worked example: A 300 new; B 512 cached + 88 new")
def nano_vllm_example(t: Trial) -> None:
    # reference/nanovllm.md §12: cu_seqlens_q [0, 300, 388], cu_seqlens_k [0, 300, 900], max 300 / 600.
    run_metadata_case(t, [300, 88], [0, 512], tr("nano-vllm's worked prefill"))


@hidden("ch26.2", "random batches with prefix hits and continuing chunks")
def random_metadata(t: Trial) -> None:
    for i in range(20):
        B = t.random.randint(1, 8)
        query = [t.random.randint(1, 600) for _ in range(B)]
        cached = [t.random.choice([0, 0, 256 * t.random.randint(1, 4), t.random.randint(1, 2000)]) for _ in range(B)]
        run_metadata_case(t, query, cached, tr("random batch {k}", k=i + 1))


@hidden("ch26.2", "edge cases: one sequence, zero new tokens, nothing cached")
def metadata_edges(t: Trial) -> None:
    run_metadata_case(t, [1], [0], tr("one token, nothing cached"))
    run_metadata_case(t, [7, 0, 2], [3, 256, 0], tr("a sequence with 0 new tokens (nano-vllm issue #144)"))
    run_metadata_case(t, [512], [0], tr("one full prompt"))


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
        t.expect_raises(
            ValueError,
            t.yours.graph_batch_size,
            bs,
            sizes,
            because=tr("no captured size holds {bs} sequences (the largest is {largest})", bs=bs, largest=16),
        )
    t.expect_raises(ValueError, t.yours.graph_batch_size, 1, [], because=tr("nothing was captured"))


@hidden("ch26.3", "random decode batches padded to their graph")
def random_padding(t: Trial) -> None:
    for i in range(12):
        bs, block_size = t.random.randint(1, 40), t.random.choice([4, 16, 256])
        graph_bs = min(s for s in NANO_SIZES if s >= bs)
        ctx = [t.random.randint(1, 6 * block_size) for _ in range(bs)]
        pool = torch.randperm(400, generator=t.rng).tolist()
        tables = [[pool.pop() for _ in range(-(-c // block_size))] for c in ctx]
        slots = [tab[(c - 1) // block_size] * block_size + (c - 1) % block_size for c, tab in zip(ctx, tables)]
        run_pad_case(t, slots, ctx, tables, graph_bs, tr("random batch {k}", k=i + 1), block_size)


@hidden("ch26.3", "inputs as int32 tensors, as nano-vllm holds them")
def tensor_inputs(t: Trial) -> None:
    slots, ctx, tables = [10, 18, 12], [7, 3, 9], [[7, 2], [4], [1, 6, 3]]
    got = t.yours.pad_decode_batch(torch.tensor(slots, dtype=torch.int32), torch.tensor(ctx, dtype=torch.int32), tables, 4)
    explain_padded(got, slots, ctx, tables, 4, tr("int32 tensor inputs"), 4)


# -- ch26.4 fill_static_buffers ---------------------------------------------------------------------------


@hidden("ch26.4", "a decode loop on the same buffers: batches that grow, shrink and change width")
def static_loop(t: Trial) -> None:
    max_bs, max_blocks, block_size = 16, 6, 4
    state = stale(t, max_bs, max_blocks)
    for step, bs in enumerate([16, 9, 12, 3, 1, 7, 16, 2]):
        batch = random_decode_batch(t, bs, max_blocks, block_size)
        buffers = static_buffers(max_bs, max_blocks, state)
        run_static_case(t, buffers, batch, tr("decode step {k} of a loop: {bs} sequences", k=step + 1, bs=bs))
        state = t.ref.drive(filled_buffers, buffers, batch)


@hidden("ch26.4", "nano-vllm's sizes: buffers of 512 rows, batches of 1, 37 and 512")
def static_nano_sizes(t: Trial) -> None:
    max_bs, max_blocks, block_size = 512, 32, 256  # max_model_len 8192 in blocks of 256
    state = stale(t, max_bs, max_blocks)
    for bs in (512, 37, 1):
        batch = random_decode_batch(t, bs, max_blocks, block_size)
        buffers = static_buffers(max_bs, max_blocks, state)
        run_static_case(t, buffers, batch, tr("a batch of {bs} after a larger one", bs=bs))
        state = t.ref.drive(filled_buffers, buffers, batch)


@hidden("ch26.4", "batch tensors of other integer dtypes are converted by the copy")
def static_dtypes(t: Trial) -> None:
    batch = {
        k: v.to(torch.int64 if v.dtype == torch.int32 else torch.int32)
        for k, v in decode_batch([(9, [7, 2, 11], 412), (4, [4], 77), (2, [5], 8)]).items()
    }
    run_static_case(t, static_buffers(4, 3, stale(t, 4, 3)), batch, tr("int64 slots, lengths and tables; int32 ids"))


# -- helpers ----------------------------------------------------------------------------------------------------


def random_decode_batch(t: Trial, bs: int, max_blocks: int, block_size: int) -> dict[str, torch.Tensor]:
    """bs sequences with distinct random blocks and lengths that fit max_blocks blocks."""
    pool = torch.randperm(2 * max_blocks * bs, generator=t.rng).tolist()
    seqs = []
    for _ in range(bs):
        c = t.random.randint(1, max_blocks * block_size)
        seqs.append((c, [pool.pop() for _ in range(-(-c // block_size))], t.random.randint(0, 151_935)))
    return decode_batch(seqs, block_size)


def random_lengths(t: Trial, B: int, T_max: int) -> list[int]:
    return [t.random.choice([0, T_max, t.random.randint(0, T_max)]) for _ in range(B)]
