"""Experiments of ch25 · paged KV cache."""

from __future__ import annotations

import torch

from grader.authoring import CheckFailed, Trial, expect_tensor, wrong_mask
from grader.checks.ch25 import expect_cache, expect_slots, token_keys
from grader.lab import Int, Numbers, expected_or_own, experiment

MAX_POOL_SLOTS = 16


def _constraints(p: dict) -> dict[str, str]:
    T, bs, table, nb = p["T"], p["block_size"], p["block_table"], p["num_blocks"]
    need = -(-T // bs)
    if len(table) < need:
        return {"block_table": f"T = {T} tokens in blocks of {bs} need {need} blocks; the table lists {len(table)}"}
    if any(b >= nb for b in table):
        return {"block_table": f"block {max(table)} is not in a pool of {nb} blocks (0 … {nb - 1})"}
    if len(set(table)) < len(table):
        twice = next(b for b in table if table.count(b) > 1)
        return {"block_table": f"physical block {twice} appears twice: one block holds one logical block"}
    if nb * bs > MAX_POOL_SLOTS:
        return {"num_blocks": f"a pool of {nb} × {bs} = {nb * bs} slots is too wide to draw (at most {MAX_POOL_SLOTS} slots)"}
    return {}


def _captions(p: dict) -> dict[str, tuple[str, ...]]:
    bs = p["block_size"]
    return {
        "ch25-dim-slot-mapping": (
            f"T = {p['T']}、block_size = {bs}、block_table = {p['block_table']}:每个 token 由位置算出逻辑块(pos // {bs})"
            f"与块内偏移(pos % {bs}),查块表得到物理块,slot = 物理块 × {bs} + 偏移;它的 K 写进物理池里这个 slot 的格子。",
            f"T = {p['T']}, block_size = {bs}, block_table = {p['block_table']}. Per token: the position gives the logical "
            f"block (pos // {bs}) and the offset (pos % {bs}); the block table gives the physical block; slot = physical · "
            f"{bs} + offset, and the token's K is written into that cell of the pool of {p['num_blocks']} blocks.",
        )
    }


@experiment(
    "paged-kv",
    title="分页 KV · slot mapping and the pool",
    about="Change T, the block size and the block table: every token's logical block, offset, physical "
    "block and slot are recomputed by your slot_mapping, and your store_kv writes each token's K "
    "into its slot of the pool.",
    figures=("ch25-dim-slot-mapping",),
    calls=("slot_mapping", "store_kv"),
    params=[
        Int("T", "T (tokens)", 5, 1, 10),
        Int("block_size", "block_size", 2, 1, 4),
        Numbers("block_table", "block_table", [3, 0, 4], 1, 8, 0, 7),
        Int("num_blocks", "blocks in the pool", 5, 1, 8),
    ],
    constraints=_constraints,
    captions=_captions,
)
def paged_kv(t: Trial, p: dict) -> None:
    T, bs, table, nb = p["T"], p["block_size"], p["block_table"], p["num_blocks"]
    positions = list(range(T))
    got = t.yours.slot_mapping(list(table), positions, bs)
    want = t.ref.slot_mapping(list(table), positions, bs) if t.ref else None
    slots = expect_tensor(got, what=f"the slots of {T} tokens", shape=[T], dtype=torch.int64)
    keys = token_keys(T)
    expected = expected_or_own(want, slots)
    t.figure(
        "ch25-dim-slot-mapping",
        table=table,
        block_size=bs,
        num_blocks=nb,
        positions=positions,
        keys=keys[:, 0],
        slots=slots,
        expected=expected,
        wrong=wrong_mask(slots, expected),
    )
    if want is not None:
        expect_slots(slots, want, table, positions, bs)
    written = (want if want is not None else slots).tolist()
    if any(not 0 <= s < nb * bs for s in written):
        raise CheckFailed(f"your slots {written} point outside the pool of {nb} × {bs} = {nb * bs} slots: store_kv is not called")
    shape = (nb, bs, 1, 2)
    call = t.yours.store_kv.run(torch.zeros(shape), torch.zeros(shape), keys, -keys, written, mutates=("k_cache", "v_cache"))
    pool = expect_tensor(call.args[0], what="k_cache", shape=list(shape), dtype=torch.float32)
    want_k = want_v = None
    if t.ref:
        want_k, want_v = torch.zeros(shape), torch.zeros(shape)
        t.ref.store_kv(want_k, want_v, keys, -keys, written)
    pool_expected = expected_or_own(want_k, pool)
    t.figure(
        "ch25-dim-slot-mapping",
        pool=pool.reshape(-1, 2),
        pool_expected=pool_expected.reshape(-1, 2),
        pool_wrong=wrong_mask(pool, pool_expected).reshape(-1, 2).any(dim=1),
    )
    if call.value is not None:
        raise CheckFailed("store_kv writes the caches in place and returns None; yours returned a value")
    if want_k is not None and want_v is not None:
        expect_cache(pool, call.args[1], want_k, want_v, written, bs)
