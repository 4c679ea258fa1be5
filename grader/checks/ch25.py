"""Public checks of ch25 · paged KV cache, and the messages they share with the hidden ones (the block
manager's traces are in `ch25_explain`, on `grader.authoring.trace`)."""

from __future__ import annotations

from typing import Any

import torch

from grader.authoring import (
    CheckFailed,
    Trial,
    expect_records,
    expect_tensor,
    first_wrong,
    hidden_model,
    if_hidden,
    mistakes,
    public,
    short,
    vec,
    wrong_mask,
)
from grader.checks.ch25_explain import (
    LIFECYCLE,
    MOMENTS,
    add,
    block_moment,
    decode,
    drive_reference,
    expect_trace,
    hx,
    op_label,
    run_trace,
    states,
)
from grader.i18n import mark, tr

FIGURE_TABLE, FIGURE_BLOCK_SIZE, FIGURE_TOKENS = [3, 0, 4], 2, 5
M = mistakes("ch25")

slot_variants = hidden_model("ch25_models.slot_variants")
"""`t.ref.drive(slot_variants, block_table, positions, block_size)`: {mistake id: the slots that mistake gives}."""


# -- ch25.1 ---------------------------------------------------------------------------------------------------


@public("ch25.1", "figure instance: T=5, block_size=2, block_table=[3, 0, 4]")
def figure_instance(t: Trial) -> None:
    positions = list(range(FIGURE_TOKENS))
    got = t.yours.slot_mapping(list(FIGURE_TABLE), positions, FIGURE_BLOCK_SIZE)
    want = t.ref.slot_mapping(FIGURE_TABLE, positions, FIGURE_BLOCK_SIZE)
    variants = t.ref.drive(slot_variants, list(FIGURE_TABLE), positions, FIGURE_BLOCK_SIZE)
    slots = expect_tensor(got, what=tr("the slots of {n} tokens", n=FIGURE_TOKENS), shape=[FIGURE_TOKENS], dtype=torch.int64)
    t.figure(
        "ch25-dim-slot-mapping",
        table=FIGURE_TABLE,
        block_size=FIGURE_BLOCK_SIZE,
        num_blocks=5,
        positions=positions,
        keys=token_keys(FIGURE_TOKENS)[:, 0],
        slots=slots,
        expected=want,
        wrong=wrong_mask(slots, want),
    )
    expect_slots(slots, want, FIGURE_TABLE, positions, FIGURE_BLOCK_SIZE, variants)


@public("ch25.1", "one sequence across three scattered blocks")
def sequence_across_blocks(t: Trial) -> None:
    table, block_size, positions = [5, 1, 3], 4, list(range(11))
    got = t.yours.slot_mapping(table, positions, block_size)
    want = t.ref.slot_mapping(table, positions, block_size)
    variants = t.ref.drive(slot_variants, table, positions, block_size)
    slots = expect_tensor(got, what=tr("the slots of {n} tokens", n=11), shape=[11], dtype=torch.int64)
    t.figure("ch25-blocks", table=table, block_size=block_size, num_blocks=6, slots=slots, expected=want, wrong=wrong_mask(slots, want))
    expect_slots(slots, want, table, positions, block_size, variants)


@public("ch25.1", "a chunk that starts mid-block, positions as a tensor")
def chunk_mid_block(t: Trial) -> None:
    run_slot_case(t, [7, 2, 9], [5, 6, 7, 8, 9], 4, as_tensor=True)


@public("ch25.1", "no positions at all")
def no_positions(t: Trial) -> None:
    got = t.yours.slot_mapping([1, 2], [], 4)
    expect_tensor(got, what=tr("the slots of {n} tokens", n=0), shape=[0], dtype=torch.int64)


@public("ch25.1", "a position beyond the block table raises ValueError")
def beyond_table(t: Trial) -> None:
    t.expect_raises(
        ValueError,
        t.yours.slot_mapping,
        [3, 0, 4],
        [0, 6],
        2,
        because=tr("position {p} is in logical block {block}, but the table has only {n} blocks", p=6, block=3, n=3),
    )


# -- ch25.2 ---------------------------------------------------------------------------------------------------


@public("ch25.2", "figure instance: the five tokens into a pool of five 2-slot blocks")
def store_figure_instance(t: Trial) -> None:
    keys = token_keys(FIGURE_TOKENS)
    slots = t.ref.slot_mapping(FIGURE_TABLE, list(range(FIGURE_TOKENS)), FIGURE_BLOCK_SIZE).tolist()
    shape = (5, FIGURE_BLOCK_SIZE, 1, 2)
    call = t.yours.store_kv.run(torch.zeros(shape), torch.zeros(shape), keys, -keys, slots, mutates=("k_cache", "v_cache"))
    got = expect_tensor(call.args[0], what="k_cache", shape=list(shape), dtype=torch.float32)
    want_k, want_v = torch.zeros(shape), torch.zeros(shape)
    t.ref.store_kv(want_k, want_v, keys, -keys, slots)
    pool, pool_expected = got.reshape(-1, 2), want_k.reshape(-1, 2)
    t.figure("ch25-dim-slot-mapping", pool=pool, pool_expected=pool_expected, pool_wrong=wrong_mask(pool, pool_expected).any(dim=1))
    if call.value is not None:
        raise CheckFailed(tr("store_kv writes the caches in place and returns None; yours returned a value"))
    expect_cache(got, call.args[1], want_k, want_v, slots, FIGURE_BLOCK_SIZE, (keys, -keys))


@public("ch25.2", "a padding row (slot −1) writes nothing")
def padding_slot(t: Trial) -> None:
    run_store_case(t, (3, 2, 1, 2), [4, -1, 1], fill=0.0)


@public("ch25.2", "slots no token names keep their old values")
def others_untouched(t: Trial) -> None:
    run_store_case(t, (4, 4, 2, 3), [13, 2, 7])


@public("ch25.2", "caches that are views of one pool: K and V sliced from [num_blocks, 2, block_size, H, D], or permuted")
def pool_views(t: Trial) -> None:
    # vLLM allocates each layer's KV as one tensor and hands the attention backend views of it: K = pool[:, 0] and
    # V = pool[:, 1] (FlashInfer's [num_blocks, 2, block_size, H, D]), or a [num_blocks, H, block_size, D] layout
    # permuted to [num_blocks, block_size, H, D]. Neither view is contiguous.
    run_store_case(t, (4, 4, 2, 3), [13, 2, -1, 7, 0], layout="pool")
    run_store_case(t, (3, 2, 2, 4), [5, 1, 2], layout="permuted")


# -- ch25.3 ---------------------------------------------------------------------------------------------------


@public("ch25.3", "compute_hash: one block, then a chain of two")
def hash_format(t: Trial) -> None:
    cases = [([1, 2, 3, 4], None), ([5, 6, 7, 8], 0), (list(range(16)), None), ([70000, -1, 2**40, 3], None)]
    want = t.ref.drive(reference_hashes, cases)
    manager = t.yours.BlockManager(4, 4)
    prefix = -1
    for (tokens, chained), (h, unchained) in zip(cases, want):
        args = (tokens,) if chained is None else (tokens, prefix)
        got = manager.compute_hash(*args)
        call = f"compute_hash({tokens}{'' if chained is None else ', prefix=' + hx(prefix)})"
        if got != h:
            raise CheckFailed(
                tr("{call} should be {want} ({value}); yours: {got}", call=call, want=hx(h), value=h, got=repr(got)),
                hint=M.hash_ignores_prefix if got == unchained and chained is not None else M.hash_bytes,
            )
        prefix = h


@public("ch25.3", "figure instance: the six moments of physical block 0")
def lifecycle(t: Trial) -> None:
    expected = t.ref.drive(drive_reference, 4, 4, LIFECYCLE)
    got = expect_records(t.yours.replay(4, 4, LIFECYCLE))
    at = {k: i for i, (k, _, _) in enumerate(MOMENTS)}
    start = {"ref": 0, "hash": "none", "mapped": False, "free": [0, 1, 2, 3], "holders": [], "tokens": []}
    moments: list[dict[str, Any]] = [
        {"label": tr(label), "what": tr(what), "op": "", "yours": start if k == 0 else None, "expected": start if k == 0 else None}
        for k, label, what in MOMENTS
    ]
    for whose, trace in (("expected", expected["trace"]), ("yours", got)):
        for k, (_, s) in enumerate(states(LIFECYCLE, trace, 4), 1):
            if k in at:
                moments[at[k]][whose] = block_moment(s, 0)
                moments[at[k]]["op"] = op_label(LIFECYCLE[k - 1])
    t.figure("ch25-block-lifecycle", block=0, block_size=4, num_blocks=4, moments=moments)
    expect_trace(LIFECYCLE, got, expected, 4, 4, case=tr("the life of block {block}", block=0))


@public("ch25.3", "nano-vllm's example: a shared prefix, a duplicate hash, the last block never hits")
def worked_example(t: Trial) -> None:
    # nanovllm.md §10 (8 blocks of 4), then a request D that finds the duplicate hash's newer block.
    script = [
        *add("A", list(range(1, 11))),
        ["compute", "A", 10, 100],
        *add("B", [1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 13], 2),
        *add("C", [1, 2, 3, 4]),
        ["compute", "B", 3, 14],
        ["compute", "C", 4, 5],
        *decode(("A", 101), ("B", 15), ("C", 0)),
        ["deallocate", "C"],
        *add("D", [1, 2, 3, 4, 5, 6, 7, 8, 9], 2),
    ]
    run_trace(t, script, 8, 4, tr("nano-vllm's worked example"))


@public("ch25.3", "preemption with 4 blocks: a reused block loses its hash, a freed one is revived")
def preemption(t: Trial) -> None:
    # nanovllm.md §11: A, B, C with 4-token prompts in a pool of 4 blocks.
    script = [
        *add("A", [1, 2, 3, 4]),
        *add("B", [5, 6, 7, 8]),
        *add("C", [9, 10, 11, 12]),
        ["compute", "A", 4, 13],
        ["compute", "B", 4, 14],
        ["compute", "C", 4, 15],
        ["can_append", "A"],
        ["may_append", "A"],
        ["can_append", "B"],
        ["deallocate", "C"],
        ["can_append", "B"],
        ["may_append", "B"],
        ["compute", "A", 1, 16],
        ["compute", "B", 1, 17],
        ["can_allocate", "C"],
        *decode(("A", 18), ("B", 19)),
        *decode(("A", 20), ("B", 21)),
        *decode(("A", 22), ("B", 23)),
        ["can_append", "A"],
        ["deallocate", "B"],
        ["can_append", "A"],
        ["may_append", "A"],
        ["compute", "A", 1, 0],
        ["deallocate", "A"],
        ["can_allocate", "B"],
        ["allocate", "B", 1],
        ["compute", "B", 5, 25],
        ["can_allocate", "C"],
    ]
    run_trace(t, script, 4, 4, tr("preemption with {n} blocks", n=4))


@public("ch25.3", "identical prompts in one step: the later hash wins, a stale entry survives another block's reuse")
def duplicates(t: Trial) -> None:
    # nano-vllm issue #219 (duplicates) and #163 (evict only the entry that points to the reused block).
    script = [
        ["add", "A", [1, 2, 3, 4, 5, 6]],
        ["add", "B", [1, 2, 3, 4, 5, 6]],
        ["can_allocate", "A"],
        ["allocate", "A", 0],
        ["can_allocate", "B"],
        ["allocate", "B", 0],
        ["compute", "A", 6, 7],
        ["compute", "B", 6, 7],
        ["deallocate", "A"],
        ["deallocate", "B"],
        *add("C", list(range(70, 86))),
        *add("D", [1, 2, 3, 4, 5, 6, 9], 1),
    ]
    run_trace(t, script, 6, 4, tr("identical prompts"))


@public("ch25.3", "a chunked prefill, decode across a block boundary, a full prompt that hits all but its last block")
def chunks_and_decode(t: Trial) -> None:
    prompt = list(range(1, 14))
    script = [
        *add("A", prompt),
        ["compute", "A", 5, None],
        ["compute", "A", 5, None],
        ["compute", "A", 3, 14],
        *decode(("A", 15)),
        *decode(("A", 16)),
        *decode(("A", 17)),
        *decode(("A", 18)),
        ["deallocate", "A"],
        *add("B", prompt + [14, 15, 16, 99], 4),
        *add("E", prompt + [14, 15, 16], 3),
        ["compute", "E", 4, 1],
    ]
    run_trace(t, script, 6, 4, tr("chunks and decode"))


@public("ch25.3", "hash collisions (compute_hash replaced by the weak colliding_hash): a hit compares the tokens")
def collisions(t: Trial) -> None:
    # colliding_hash is the sum of every token up to the block's end: [4, 3, 2, 1] collides with [1, 2, 3, 4], and
    # C's [5, 6, 8, 7] after [1, 2, 3, 4] with A's [5, 6, 7, 8] (the same first tokens: compare them all).
    # nano-vllm's can_allocate compares the mapped block's tokens (block_manager.py), so a collision costs a hit
    # (D finds B's block under A's hash) and never hands out a block holding other tokens, whether the block is in
    # use (B, C) or free and cached (D).
    script = [
        *add("A", [1, 2, 3, 4, 5, 6, 7, 8, 9]),
        ["compute", "A", 9, 10],
        *add("B", [4, 3, 2, 1, 9]),
        *add("C", [1, 2, 3, 4, 5, 6, 8, 7, 11], 1),
        ["compute", "B", 5, 12],
        ["compute", "C", 5, 13],
        ["deallocate", "A"],
        ["deallocate", "B"],
        *add("D", [1, 2, 3, 4, 5, 6, 7, 8, 20]),
    ]
    run_trace(t, script, 8, 4, tr("colliding hashes"), weak_hash=True)


# -- helpers ----------------------------------------------------------------------------------------------------


def token_keys(num_tokens: int, width: int = 2) -> torch.Tensor:
    """Easy-to-read K vectors for figures: token t gets [10(t+1)+1, 10(t+1)+2, …], shape [T, 1, width]."""
    t = torch.arange(1, num_tokens + 1, dtype=torch.float32)[:, None] * 10
    return (t + torch.arange(1, width + 1, dtype=torch.float32))[:, None, :]


def slot_misconceptions() -> dict[str, tuple[str, str]]:
    """The misconceptions of slot_mapping, by id (the keys of `slot_variants`' answer): the slot of position p each
    gives, in the student's terms, and its hint."""
    return {
        "slot_is_position": ("p", M.slot_is_position),
        "block_times_offset": ("block_table[p // {bs}] · (p % {bs})", M.block_times_offset),
        "slot_is_block": ("block_table[p // {bs}]", M.slot_is_block),
        "offset_dropped": ("block_table[p // {bs}] · {bs}", M.offset_dropped),
        "block_plus_offset": ("block_table[p // {bs}] + p % {bs}", M.block_plus_offset),
        "position_as_offset": ("block_table[p // {bs}] · {bs} + p", M.position_as_offset),
        "block_added_to_position": ("p + block_table[p // {bs}]", M.block_added_to_position),
        "ceiling_block": ("block_table[(p + {bs} − 1) // {bs}] · {bs} + p % {bs}", M.ceiling_block),
        "divmod_swapped": ("block_table[p % {bs}] · {bs} + p // {bs}", M.divmod_swapped),
    }


def slot_hint(slots: torch.Tensor, variants: dict, block_size: int) -> tuple[str, str]:
    """The line and the hint naming the one misconception whose slots (`slot_variants`' answer) equal all of the
    student's, or ("", "") when none does or several do (then the derivation alone speaks)."""
    matching = [key for key, want in variants.items() if want.shape == slots.shape and torch.equal(want, slots)]
    if len(matching) != 1:
        return "", ""
    formula, hint = slot_misconceptions()[matching[0]]
    n, shown = slots.numel(), formula.format(bs=block_size)
    line = tr("your slot is {formula}", formula=shown) if n == 1 else tr("each of your {n} slots is {formula}", n=n, formula=shown)
    return line, hint


def expect_slots(
    got: Any, want: torch.Tensor, table: list[int], positions: list[int], block_size: int, variants: dict | None = None
) -> torch.Tensor:
    """Require the slots to equal `want`, explaining the first wrong token in block terms, and naming the
    misconception whose slots (`variants`, asked of `slot_variants` before comparing; asked of the hidden side
    when not given, so a student release's lab names none) are all of the student's."""
    n = len(positions)
    slots = expect_tensor(got, what=tr("the slots of {n} tokens", n=n), shape=[n], dtype=torch.int64)
    idx = first_wrong(slots, want)
    if idx is None:
        return slots
    i = idx[0]
    p, yours = positions[i], int(slots[i])
    logical, offset = divmod(p, block_size)
    phys = table[logical]
    if variants is None:
        variants = if_hidden(slot_variants, list(table), list(positions), block_size) or {}
    formula, hint = slot_hint(slots, variants, block_size)
    raise CheckFailed(
        tr("inputs: block_size={bs}, block_table={table}, positions={positions}", bs=block_size, table=table, positions=short(positions)),
        tr(
            "token {i} is at position {p} → logical block {p} // {bs} = {logical}, offset {p} % {bs} = {offset}",
            i=i,
            p=p,
            bs=block_size,
            logical=logical,
            offset=offset,
        ),
        tr(
            "block_table[{logical}] = {phys}, so its slot is {phys}·{bs} + {offset} = {want}; yours: {got}",
            logical=logical,
            phys=phys,
            bs=block_size,
            offset=offset,
            want=int(want[i]),
            got=yours,
        ),
        formula,
        hint=hint,
    )


def expect_cache(
    got_k: torch.Tensor,
    got_v: torch.Tensor,
    want_k: torch.Tensor,
    want_v: torch.Tensor,
    slots: list[int],
    block_size: int,
    new: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """Require both caches to equal the expected ones, explaining the first wrong slot (`new`: the k and v
    written, to recognise a padding row's K or V in the pool's last slot)."""
    for name, got, want in (("k_cache", got_k, want_k), ("v_cache", got_v, want_v)):
        expect_tensor(got, what=name, shape=list(want.shape), dtype=want.dtype)
        flat_got, flat_want = got.reshape(-1, *got.shape[2:]), want.reshape(-1, *want.shape[2:])
        idx = first_wrong(flat_got, flat_want)
        if idx is None:
            continue
        slot = idx[0]
        block, offset = divmod(slot, block_size)
        tokens = [i for i, s in enumerate(slots) if s == slot]
        fields = dict(slots=slots, name=name, slot=slot, block=block, offset=offset, want=vec(flat_want[slot], limit=6))
        fields.update(got=vec(flat_got[slot], limit=6))
        if tokens:
            line = tr(
                "slots={slots}: {name} slot {slot} (block {block}, offset {offset}) should hold token {token}'s {kv} {want}; "
                "yours holds {got}",
                token=tokens[0],
                kv=name[0].upper(),
                **fields,
            )
        else:
            line = tr(
                "slots={slots}: {name} slot {slot} (block {block}, offset {offset}) is not the slot of any token, so it must "
                "keep its old value {want}; yours holds {got}",
                **fields,
            )
        padding = new is not None and slot == flat_want.shape[0] - 1 and holds_padding(flat_got[slot], new[name[0] == "v"], slots)
        raise CheckFailed(line, hint=M.padding_written if padding else "")


def holds_padding(row: torch.Tensor, written: torch.Tensor, slots: list[int]) -> bool:
    """Whether a cache row holds what one of the padding tokens (slot −1) brought: the padding row was written."""
    return any(s == -1 and torch.equal(row, written[i].to(row.dtype)) for i, s in enumerate(slots))


def run_slot_case(t: Trial, table: list[int], positions: list[int], block_size: int, *, as_tensor: bool = False) -> torch.Tensor:
    """Call the student's slot_mapping on one case and compare it with the reference."""
    arg = torch.tensor(positions, dtype=torch.int64) if as_tensor else list(positions)
    got = t.yours.slot_mapping(list(table), arg, block_size)
    want = t.ref.slot_mapping(table, positions, block_size)
    variants = t.ref.drive(slot_variants, list(table), list(positions), block_size)
    return expect_slots(got, want, table, positions, block_size, variants)


LAYOUTS = {
    "fresh": mark("fresh contiguous caches"),
    "pool": mark("K = pool[:, 0] and V = pool[:, 1] of one pool [num_blocks, 2, block_size, H, D]"),
    "permuted": mark("caches stored [num_blocks, H, block_size, D], permuted to [num_blocks, block_size, H, D]"),
}


def run_store_case(
    t: Trial,
    cache_shape: tuple[int, int, int, int],
    slots: list[int],
    *,
    fill: float | None = None,
    dtype: torch.dtype = torch.float32,
    layout: str = "fresh",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Call the student's store_kv on caches laid out as `layout` (one of LAYOUTS) and compare both caches with the
    reference's."""
    n, (num_blocks, block_size, heads, dim) = len(slots), cache_shape
    k = torch.randn(n, heads, dim, generator=t.rng).to(dtype)
    v = torch.randn(n, heads, dim, generator=t.rng).to(dtype)
    if layout == "pool":
        pool = torch.randn(num_blocks, 2, block_size, heads, dim, generator=t.rng).to(dtype)
        k_cache, v_cache = pool[:, 0], pool[:, 1]
    elif layout == "permuted":
        stored = [torch.randn(num_blocks, heads, block_size, dim, generator=t.rng).to(dtype) for _ in range(2)]
        k_cache, v_cache = (x.permute(0, 2, 1, 3) for x in stored)
    elif fill is None:
        k_cache = torch.randn(cache_shape, generator=t.rng).to(dtype)
        v_cache = torch.randn(cache_shape, generator=t.rng).to(dtype)
    else:
        k_cache, v_cache = torch.full(cache_shape, fill, dtype=dtype), torch.full(cache_shape, fill, dtype=dtype)
    if fill is not None and layout != "fresh":
        k_cache.fill_(fill), v_cache.fill_(fill)
    try:
        return check_store(t, k_cache, v_cache, k, v, slots, block_size)
    except CheckFailed as failure:
        raise failure.within(f"{tr(LAYOUTS[layout])} {list(cache_shape)}") if layout != "fresh" else failure


def check_store(
    t: Trial, k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: list[int], block_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    call = t.yours.store_kv.run(k_cache, v_cache, k, v, list(slots), mutates=("k_cache", "v_cache"))
    if call.value is not None:
        raise CheckFailed(tr("store_kv writes the caches in place and returns None; yours returned a value"))
    want_k, want_v = k_cache.clone(), v_cache.clone()
    t.ref.store_kv(want_k, want_v, k, v, list(slots))
    got_k, got_v = call.args[0], call.args[1]
    try:
        expect_cache(got_k, got_v, want_k, want_v, list(slots), block_size, (k, v))
    except CheckFailed as failure:
        # Nothing written into a view that is not contiguous: reshape copied it, and the copy took the writes.
        untouched = isinstance(got_k, torch.Tensor) and torch.equal(got_k, k_cache) and torch.equal(got_v, v_cache)
        if untouched and not k_cache.is_contiguous() and not failure.hints:
            raise CheckFailed(*failure.lines, tr("your store_kv left both caches exactly as they were"), hint=M.reshape_copy) from None
        raise
    return got_k, want_k


def reference_hashes(ref: Any, cases: list) -> list:
    out, prefix = [], -1
    for tokens, chained in cases:
        h = ref.BlockManager.compute_hash(tokens, prefix if chained is not None else -1)
        out.append([h, ref.BlockManager.compute_hash(tokens)])
        prefix = h
    return out
