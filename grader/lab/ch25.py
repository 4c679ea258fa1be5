"""Experiments of ch25 · paged KV cache."""

from __future__ import annotations

from typing import Any

import torch

from grader.authoring import CheckFailed, Trial, expect_tensor, wrong_mask
from grader.checks.ch25 import expect_cache, expect_slots, token_keys
from grader.i18n import mark, tr
from grader.lab import Int, Numbers, ask, expected_or_own, experiment

MAX_POOL_SLOTS = 16


def _constraints(p: dict) -> dict[str, str]:
    T, bs, table, nb = p["T"], p["block_size"], p["block_table"], p["num_blocks"]
    need = -(-T // bs)
    if len(table) < need:
        return {
            "block_table": tr(
                "T = {T} tokens in blocks of {bs} need {need} blocks; the table lists {n}", T=T, bs=bs, need=need, n=len(table)
            )
        }
    if any(b >= nb for b in table):
        return {"block_table": tr("block {b} is not in a pool of {nb} blocks (0 … {last})", b=max(table), nb=nb, last=nb - 1)}
    if len(set(table)) < len(table):
        twice = next(b for b in table if table.count(b) > 1)
        return {"block_table": tr("physical block {b} appears twice: one block holds one logical block", b=twice)}
    if nb * bs > MAX_POOL_SLOTS:
        return {
            "num_blocks": tr(
                "a pool of {nb} × {bs} = {slots} slots is too wide to draw (at most {most} slots)",
                nb=nb,
                bs=bs,
                slots=nb * bs,
                most=MAX_POOL_SLOTS,
            )
        }
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
    title=mark("Paged KV: slot mapping and the pool"),
    about=mark(
        "Change T, the block size and the block table: every token's logical block, offset, physical "
        "block and slot are recomputed by your slot_mapping, and your store_kv writes each token's K "
        "into its slot of the pool."
    ),
    figures=("ch25-dim-slot-mapping",),
    calls=("slot_mapping", "store_kv"),
    params=[
        Int("T", mark("T (tokens)"), 5, 1, 10),
        Int("block_size", "block_size", 2, 1, 4),
        Numbers("block_table", "block_table", [3, 0, 4], 1, 8, 0, 7),
        Int("num_blocks", mark("blocks in the pool"), 5, 1, 8),
    ],
    constraints=_constraints,
    captions=_captions,
)
def paged_kv(t: Trial, p: dict) -> None:
    T, bs, table, nb = p["T"], p["block_size"], p["block_table"], p["num_blocks"]
    positions = list(range(T))
    got = t.yours.slot_mapping(list(table), positions, bs)
    want = ask(t, lambda ref: ref.slot_mapping(list(table), positions, bs))
    slots = expect_tensor(got, what=tr("the slots of {n} tokens", n=T), shape=[T], dtype=torch.int64)
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
        checked=want is not None,
    )
    if want is not None:
        expect_slots(slots, want, table, positions, bs)
    else:
        explain_slot_rules(slots.tolist(), table, positions, bs)
    written = (want if want is not None else slots).tolist()
    if any(not 0 <= s < nb * bs for s in written):
        raise CheckFailed(
            tr(
                "your slots {slots} point outside the pool of {nb} × {bs} = {n} slots: store_kv is not called",
                slots=written,
                nb=nb,
                bs=bs,
                n=nb * bs,
            )
        )
    shape = (nb, bs, 1, 2)
    call = t.yours.store_kv.run(torch.zeros(shape), torch.zeros(shape), keys, -keys, written, mutates=("k_cache", "v_cache"))
    pool = expect_tensor(call.args[0], what="k_cache", shape=list(shape), dtype=torch.float32)

    def stored(ref):
        k, v = torch.zeros(shape), torch.zeros(shape)
        ref.store_kv(k, v, keys, -keys, written)
        return k, v

    want_kv = ask(t, stored)
    pool_expected = expected_or_own(None if want_kv is None else want_kv[0], pool)
    t.figure(
        "ch25-dim-slot-mapping",
        pool=pool.reshape(-1, 2),
        pool_expected=pool_expected.reshape(-1, 2),
        pool_wrong=wrong_mask(pool, pool_expected).reshape(-1, 2).any(dim=1),
        checked=want is not None and want_kv is not None,
    )
    if call.value is not None:
        raise CheckFailed(tr("store_kv writes the caches in place and returns None; yours returned a value"))
    if want_kv is not None:
        expect_cache(pool, call.args[1], want_kv[0], want_kv[1], written, bs)
    else:
        explain_pool_rules(pool, call.args[1], keys, written)


def explain_slot_rules(slots: list[int], table: list[int], positions: list[int], block_size: int) -> None:
    """What a slot must be, checked without an answer: slot // block_size is the physical block the table gives
    the token's logical block, and slot % block_size its offset in it."""
    for i, (s, p) in enumerate(zip(slots, positions)):
        logical, offset = divmod(p, block_size)
        if divmod(s, block_size) != (table[logical], offset):
            block, off = divmod(s, block_size)
            raise CheckFailed(
                tr("inputs: block_size={bs}, block_table={table}, positions={positions}", bs=block_size, table=table, positions=positions),
                tr(
                    "token {i} is at position {p} → logical block {logical}, offset {offset}; block_table[{logical}] = {phys}, "
                    "so its slot lies in physical block {phys} at offset {offset}",
                    i=i,
                    p=p,
                    logical=logical,
                    offset=offset,
                    phys=table[logical],
                ),
                tr("yours: {s} = {block}·{bs} + {off}, which is block {block}, offset {off}", s=s, block=block, bs=block_size, off=off),
            )


def explain_pool_rules(k_pool: torch.Tensor, v_pool: Any, keys: torch.Tensor, slots: list[int]) -> None:
    """What store_kv must do, checked without an answer: token i's K (and V = −K here) in slot slots[i], every
    other slot left as it was (zero)."""
    v = expect_tensor(v_pool, what="v_cache", shape=list(k_pool.shape), dtype=torch.float32)
    for name, pool, sign in (("k_cache", k_pool, 1), ("v_cache", v, -1)):
        flat = pool.reshape(-1, *pool.shape[2:])
        for i, s in enumerate(slots):
            if not torch.equal(flat[s], sign * keys[i]):
                raise CheckFailed(
                    tr(
                        "slots={slots}: {name} slot {s} should hold token {i}'s {kv}; yours holds {got}",
                        slots=slots,
                        name=name,
                        s=s,
                        i=i,
                        kv=name[0].upper(),
                        got=flat[s].tolist(),
                    )
                )
        others = [s for s in range(flat.shape[0]) if s not in slots and bool(flat[s].any())]
        if others:
            s = others[0]
            raise CheckFailed(
                tr(
                    "slots={slots}: {name} slot {s} is not the slot of any token, so it must stay 0; yours holds {got}",
                    slots=slots,
                    name=name,
                    s=s,
                    got=flat[s].tolist(),
                )
            )
