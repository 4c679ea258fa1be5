"""Hidden checks of ch25 · paged KV cache: random instances from the grading seed, edge cases."""

from __future__ import annotations

import torch

from grader.checks import hidden
from grader.checks.ch25 import check_store, expect_slots, run_slot_case, run_store_case
from grader.trial import Trial


def random_table(t: Trial, num_blocks: int, pool: int) -> list[int]:
    return torch.randperm(pool, generator=t.rng)[:num_blocks].tolist()


@hidden("25.1", "random sequences, whole prompts")
def random_prompts(t: Trial) -> None:
    for _ in range(20):
        block_size = t.random.choice([1, 2, 3, 4, 8, 16, 256])
        length = t.random.randint(1, 5 * block_size)
        table = random_table(t, -(-length // block_size), 64)
        run_slot_case(t, table, list(range(length)), block_size, as_tensor=t.random.random() < 0.5)


@hidden("25.1", "random chunks after a cached prefix, in shuffled order")
def random_chunks(t: Trial) -> None:
    for _ in range(20):
        block_size = t.random.choice([2, 4, 16])
        start, length = t.random.randint(0, 40), t.random.randint(1, 30)
        table = random_table(t, -(-(start + length) // block_size), 128)
        positions = [start + int(i) for i in torch.randperm(length, generator=t.rng)]
        run_slot_case(t, table, positions, block_size, as_tensor=True)


@hidden("25.1", "the decode step: the newest token's slot")
def decode_step(t: Trial) -> None:
    # nano-vllm's prepare_decode: slot = block_table[-1]·bs + last_block_num_tokens − 1.
    for length in (1, 255, 256, 257, 300, 512):
        table = random_table(t, -(-length // 256), 40)
        run_slot_case(t, table, [length - 1], 256)


@hidden("25.1", "a long prompt (100k tokens)")
def long_prompt(t: Trial) -> None:
    block_size, length = 16, 100_000
    table = random_table(t, -(-length // block_size), 10_000)
    positions = list(range(length))
    got = t.call("slot_mapping", table, torch.tensor(positions), block_size)
    expect_slots(got, t.ref.slot_mapping(table, positions, block_size), table, positions, block_size)


@hidden("25.1", "bad inputs raise ValueError")
def bad_slot_inputs(t: Trial) -> None:
    t.expect_raises(ValueError, "slot_mapping", [0, 1], [-1, 0], 2, because="position −1 does not exist")
    t.expect_raises(ValueError, "slot_mapping", [0, 1], [0, 1], 0, because="block_size must be positive")
    t.expect_raises(ValueError, "slot_mapping", [], [0], 4, because="an empty block table holds no position")


@hidden("25.2", "random pools, slots and padding")
def random_stores(t: Trial) -> None:
    for _ in range(10):
        num_blocks, block_size = t.random.randint(1, 6), t.random.choice([1, 2, 4, 16])
        heads, dim = t.random.choice([1, 2, 4]), t.random.choice([1, 8, 64])
        n = t.random.randint(0, num_blocks * block_size)
        slots = torch.randperm(num_blocks * block_size, generator=t.rng)[:n].tolist()
        slots = [s if t.random.random() > 0.2 else -1 for s in slots]
        run_store_case(t, (num_blocks, block_size, heads, dim), slots)


@hidden("25.2", "a bfloat16 cache, as in nano-vllm")
def bf16_cache(t: Trial) -> None:
    run_store_case(t, (4, 16, 8, 16), [0, 17, 63, -1, 5], dtype=torch.bfloat16)


@hidden("25.2", "the last slot of the pool is a real slot")
def last_slot(t: Trial) -> None:
    k = torch.randn(2, 2, 4, generator=t.rng)
    check_store(t, torch.zeros(3, 4, 2, 4), torch.zeros(3, 4, 2, 4), k, 2 * k, [11, 0], 4)


@hidden("25.2", "mismatched shapes raise ValueError")
def bad_store_inputs(t: Trial) -> None:
    cache = torch.zeros(2, 2, 2, 4)
    t.expect_raises(ValueError, "store_kv", cache, cache.clone(), torch.ones(2, 1, 4), torch.ones(2, 1, 4), [0, 1],
                    because="k has 1 kv head but the cache has 2")
    t.expect_raises(ValueError, "store_kv", cache, cache.clone(), torch.ones(2, 2, 4), torch.ones(2, 2, 4), [0],
                    because="there are 2 tokens but only 1 slot")
    t.expect_raises(ValueError, "store_kv", cache, cache.clone(), torch.ones(1, 2, 4), torch.ones(1, 2, 4), [-2],
                    because="−2 is neither a slot nor the padding marker −1")
