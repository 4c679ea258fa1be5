"""Public checks of ch25 · paged KV cache, and the messages they share with the hidden ones."""

from __future__ import annotations

from typing import Iterator

import torch

from grader.checks import public
from grader.compare import CheckFailed, describe, expect_tensor, first_wrong, fmt
from grader.trial import Trial

FIGURE_TABLE, FIGURE_BLOCK_SIZE, FIGURE_TOKENS = [3, 0, 4], 2, 5


def token_keys(num_tokens: int, width: int = 2) -> torch.Tensor:
    """Easy-to-read K vectors for figures: token t gets [10(t+1)+1, 10(t+1)+2, …], shape [T, 1, width]."""
    t = torch.arange(1, num_tokens + 1, dtype=torch.float32)[:, None] * 10
    return (t + torch.arange(1, width + 1, dtype=torch.float32))[:, None, :]


def expect_slots(got, want: torch.Tensor, table: list[int], positions: list[int], block_size: int) -> torch.Tensor:
    """Require the slots to equal `want`, explaining the first wrong token in block terms."""
    n = len(positions)
    slots = expect_tensor(got, what=f"the slots of {n} tokens", shape=[n], dtype=torch.int64)
    idx = first_wrong(slots, want)
    if idx is None:
        return slots
    i = idx[0]
    p, yours = positions[i], int(slots[i])
    logical, offset = divmod(p, block_size)
    phys = table[logical]
    lines = [f"inputs: block_size={block_size}, block_table={table}, positions={_short(positions)}",
             f"token {i} is at position {p} → logical block {p} // {block_size} = {logical}, "
             f"offset {p} % {block_size} = {offset}",
             f"block_table[{logical}] = {phys}, so its slot is {phys}·{block_size} + {offset} = {int(want[i])}; "
             f"yours: {yours}"]
    hint = slot_hint(yours, p, logical, offset, phys, block_size, table)
    raise CheckFailed("\n".join(lines + ([f"hint: {hint}"] if hint else [])))


def slot_hint(yours: int, p: int, logical: int, offset: int, phys: int, block_size: int, table: list[int]) -> str:
    """The misconception a wrong slot most likely comes from ('' when none fits)."""
    if yours == p:
        return "the slot uses the physical block from the table, not the logical position"
    if yours == phys:
        return "a slot is a row of the flat pool, not a block id: multiply the block by block_size and add the offset"
    if yours == phys * block_size:
        return "add the offset p % block_size inside the block"
    if p < len(table) and yours == table[p] * block_size + offset:
        return "index the block table with the logical block p // block_size, not with the position"
    if yours == logical * block_size + offset + phys:
        return "the physical block replaces the logical block; it is not added to the position"
    return ""


def expect_cache(got_k: torch.Tensor, got_v: torch.Tensor, want_k: torch.Tensor, want_v: torch.Tensor,
                 slots: list[int], block_size: int) -> None:
    """Require both caches to equal the expected ones, explaining the first wrong slot."""
    for name, got, want in (("k_cache", got_k, want_k), ("v_cache", got_v, want_v)):
        expect_tensor(got, what=name, shape=list(want.shape), dtype=want.dtype)
        flat_got, flat_want = got.reshape(-1, *got.shape[2:]), want.reshape(-1, *want.shape[2:])
        idx = first_wrong(flat_got, flat_want)
        if idx is None:
            continue
        slot = idx[0]
        block, offset = divmod(slot, block_size)
        where = f"{name} slot {slot} (block {block}, offset {offset})"
        tokens = [i for i, s in enumerate(slots) if s == slot]
        if tokens:
            what = f"should hold token {tokens[0]}'s {name[0].upper()} {_vec(flat_want[slot])}"
        else:
            what = f"is not the slot of any token, so it must keep its old value {_vec(flat_want[slot])}"
        hint = ""
        if -1 in slots and slot == flat_want.shape[0] - 1:
            hint = "\nhint: a slot of −1 marks a padding row: skip it (in Python, index −1 is the last row)"
        raise CheckFailed(f"slots={slots}: {where} {what}; yours holds {_vec(flat_got[slot])}{hint}")


def _vec(x: torch.Tensor) -> str:
    return "[" + ", ".join(fmt(v) for v in x.reshape(-1)[:6].tolist()) + (", …]" if x.numel() > 6 else "]")


def _short(xs: list[int]) -> str:
    return str(xs) if len(xs) <= 12 else f"[{', '.join(map(str, xs[:10]))}, … ({len(xs)} positions)]"


def run_slot_case(t: Trial, table: list[int], positions: list[int], block_size: int, *,
                  as_tensor: bool = False) -> torch.Tensor:
    """Call the student's slot_mapping on one case and compare it with the reference."""
    arg = torch.tensor(positions, dtype=torch.int64) if as_tensor else list(positions)
    got = t.call("slot_mapping", list(table), arg, block_size)
    want = t.ref.slot_mapping(table, positions, block_size)
    return expect_slots(got, want, table, positions, block_size)


def run_store_case(t: Trial, cache_shape: tuple[int, int, int, int], slots: list[int], *, fill: float | None = None,
                   dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Call the student's store_kv on fresh caches and compare both caches with the reference's."""
    n, (_, block_size, heads, dim) = len(slots), cache_shape
    k = torch.randn(n, heads, dim, generator=t.rng).to(dtype)
    v = torch.randn(n, heads, dim, generator=t.rng).to(dtype)
    if fill is None:
        k_cache = torch.randn(cache_shape, generator=t.rng).to(dtype)
        v_cache = torch.randn(cache_shape, generator=t.rng).to(dtype)
    else:
        k_cache, v_cache = torch.full(cache_shape, fill, dtype=dtype), torch.full(cache_shape, fill, dtype=dtype)
    return check_store(t, k_cache, v_cache, k, v, slots, block_size)


def check_store(t: Trial, k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                slots: list[int], block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    call = t.run("store_kv", k_cache, v_cache, k, v, list(slots), mutates=("k_cache", "v_cache"))
    if call.value is not None:
        raise CheckFailed("store_kv writes the caches in place and returns None; yours returned a value")
    want_k, want_v = k_cache.clone(), v_cache.clone()
    t.ref.store_kv(want_k, want_v, k, v, list(slots))
    got_k, got_v = call.args[0], call.args[1]
    expect_cache(got_k, got_v, want_k, want_v, list(slots), block_size)
    return got_k, want_k


@public("25.1", "figure instance: T=5, block_size=2, block_table=[3, 0, 4]")
def figure_instance(t: Trial) -> None:
    positions = list(range(FIGURE_TOKENS))
    got = t.call("slot_mapping", list(FIGURE_TABLE), positions, FIGURE_BLOCK_SIZE)
    want = t.ref.slot_mapping(FIGURE_TABLE, positions, FIGURE_BLOCK_SIZE)
    slots = expect_tensor(got, what=f"the slots of {FIGURE_TOKENS} tokens", shape=[FIGURE_TOKENS], dtype=torch.int64)
    t.figure("dim-slot-mapping", table=FIGURE_TABLE, block_size=FIGURE_BLOCK_SIZE, num_blocks=5,
             positions=positions, keys=token_keys(FIGURE_TOKENS)[:, 0], slots=slots, expected=want)
    expect_slots(slots, want, FIGURE_TABLE, positions, FIGURE_BLOCK_SIZE)


@public("25.1", "one sequence across three scattered blocks")
def sequence_across_blocks(t: Trial) -> None:
    table, block_size, positions = [5, 1, 3], 4, list(range(11))
    got = t.call("slot_mapping", table, positions, block_size)
    want = t.ref.slot_mapping(table, positions, block_size)
    slots = expect_tensor(got, what="the slots of 11 tokens", shape=[11], dtype=torch.int64)
    t.figure("ch25-blocks", table=table, block_size=block_size, num_blocks=6, slots=slots, expected=want)
    expect_slots(slots, want, table, positions, block_size)


@public("25.1", "a chunk that starts mid-block, positions as a tensor")
def chunk_mid_block(t: Trial) -> None:
    run_slot_case(t, [7, 2, 9], [5, 6, 7, 8, 9], 4, as_tensor=True)


@public("25.1", "no positions at all")
def no_positions(t: Trial) -> None:
    got = t.call("slot_mapping", [1, 2], [], 4)
    expect_tensor(got, what="the slots of 0 tokens", shape=[0], dtype=torch.int64)


@public("25.1", "a position beyond the block table raises ValueError")
def beyond_table(t: Trial) -> None:
    t.expect_raises(ValueError, "slot_mapping", [3, 0, 4], [0, 6], 2,
                    because="position 6 is in logical block 3, but the table has only 3 blocks")


@public("25.2", "figure instance: the five tokens into a pool of five 2-slot blocks")
def store_figure_instance(t: Trial) -> None:
    keys = token_keys(FIGURE_TOKENS)
    slots = t.ref.slot_mapping(FIGURE_TABLE, list(range(FIGURE_TOKENS)), FIGURE_BLOCK_SIZE).tolist()
    shape = (5, FIGURE_BLOCK_SIZE, 1, 2)
    call = t.run("store_kv", torch.zeros(shape), torch.zeros(shape), keys, -keys, slots,
                 mutates=("k_cache", "v_cache"))
    got = expect_tensor(call.args[0], what="k_cache", shape=list(shape), dtype=torch.float32)
    want_k, want_v = torch.zeros(shape), torch.zeros(shape)
    t.ref.store_kv(want_k, want_v, keys, -keys, slots)
    t.figure("dim-slot-mapping", pool=got.reshape(-1, 2), pool_expected=want_k.reshape(-1, 2))
    if call.value is not None:
        raise CheckFailed("store_kv writes the caches in place and returns None; yours returned a value")
    expect_cache(got, call.args[1], want_k, want_v, slots, FIGURE_BLOCK_SIZE)


@public("25.2", "a padding row (slot −1) writes nothing")
def padding_slot(t: Trial) -> None:
    run_store_case(t, (3, 2, 1, 2), [4, -1, 1], fill=0.0)


@public("25.2", "slots no token names keep their old values")
def others_untouched(t: Trial) -> None:
    run_store_case(t, (4, 4, 2, 3), [13, 2, 7])


@public("25.2", "a slot outside the pool raises ValueError")
def slot_out_of_pool(t: Trial) -> None:
    k = torch.ones(2, 1, 2)
    t.expect_raises(ValueError, "store_kv", torch.zeros(2, 2, 1, 2), torch.zeros(2, 2, 1, 2), k, k, [1, 4],
                    because="slot 4 is outside a pool of 2 blocks × 2 slots (slots 0–3)")


# -- 25.3 the block manager: traces ---------------------------------------------------------------------
def drive_reference(ref, num_blocks: int, block_size: int, script: list) -> dict:
    """The reference's trace of a script, plus per step the facts an explanation needs (plain data):
    for can_allocate the walk over the hash chain, for compute each newly hashed block's unchained hash."""
    manager, seqs, notes = ref.BlockManager(num_blocks, block_size), {}, []
    for op in script:
        note: dict = {}
        seq = seqs.get(op[1])
        if op[0] == "can_allocate":
            h, walk = -1, []
            for i in range(seq.num_blocks - 1):
                h = ref.BlockManager.compute_hash(seq.block(i), h)
                b = manager.hash_to_block_id.get(h)
                hit = b is not None and manager.blocks[b].token_ids == seq.block(i)
                walk.append([i, b if hit else None, hit and b in manager.used_block_ids])
                if not hit:
                    break
            note = {"walk": walk, "free": len(manager.free_block_ids)}
        elif op[0] == "compute":
            first, end = seq.num_cached_tokens // block_size, (seq.num_cached_tokens + op[2]) // block_size
            note = {"unchained": {seq.block_table[i]: ref.BlockManager.compute_hash(seq.block(i))
                                  for i in range(first, end)}}
        ref.run_op(manager, seqs, op)
        notes.append(note)
    return {"trace": ref.replay(num_blocks, block_size, script), "notes": notes}


def states(script: list, trace, num_blocks: int, *, whose: str = "your") -> Iterator[tuple[dict, dict]]:
    """Replay a trace of what changed: per step, the op's sequence and the pool before it (a small copy)
    and the full state after it (one dict, updated in place). A step that raised yields a state with
    "error" and ends the walk."""
    if not isinstance(trace, list) or not all(isinstance(r, dict) for r in trace):
        raise CheckFailed(f"replay should return a list of dicts, one per operation; {whose}s returned "
                          f"{describe(trace)} (replay, run_op and snapshot are provided: keep them as they are)")
    s = {"free": list(range(num_blocks)), "used": [], "ref": [0] * num_blocks, "hash": [-1] * num_blocks,
         "tokens": [[] for _ in range(num_blocks)], "map": {}, "tables": {}, "cached": {}, "seqs": {}, "value": None}
    try:
        for op, rec in zip(script, trace):
            name = op[1]
            if op[0] == "add":
                s["seqs"][name] = list(op[2])
            before = {"free": list(s["free"]), "ref": list(s["ref"]), "hash": list(s["hash"]),
                      "tables": {name: s["tables"].get(name, [])}, "cached": {name: s["cached"].get(name, 0)},
                      "seqs": {name: list(s["seqs"][name])}}
            if op[0] == "compute" and op[3] is not None:
                s["seqs"][name].append(op[3])
            if "error" in rec:
                yield before, {**s, "error": f"{rec['error']}" + (f"\n    at {rec['where']}" if rec.get("where") else "")}
                return
            s["value"], s["tables"][name], s["cached"][name] = rec["value"], rec["table"], rec["cached"]
            if "free" in rec:
                s["free"] = rec["free"]
            elif "free_appended" in rec:
                gone = set(rec["free_removed"])
                s["free"] = [b for b in s["free"] if b not in gone] + rec["free_appended"]
            if "used_added" in rec:
                s["used"] = sorted(set(s["used"]) - set(rec["used_removed"]) | set(rec["used_added"]))
            for j, (r, h, toks) in rec.get("blocks", {}).items():
                s["ref"][j], s["hash"][j], s["tokens"][j] = r, h, toks
            for h, b in rec.get("map", {}).items():
                if b is None:
                    s["map"].pop(h, None)
                else:
                    s["map"][h] = b
            yield before, s
    except (KeyError, TypeError, IndexError, ValueError) as e:
        raise CheckFailed(f"{whose} replay trace is not in the documented form ({type(e).__name__}: {e}); "
                          "replay, run_op and snapshot are provided: keep them as they are") from None


def hx(h) -> str:
    """A block hash as a student reads it: 16 hex digits, or "none" for −1."""
    return "none" if h == -1 else f"0x{h:016x}" if isinstance(h, int) and h >= 0 else repr(h)


def short(xs: list, n: int = 12) -> str:
    return str(xs) if len(xs) <= n else f"[{', '.join(map(str, xs[:n - 2]))}, … ({len(xs)} in all)]"


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def describe_op(op: list, s: dict, bs: int) -> str:
    """One operation of a script in the chapter's terms, given the state before it."""
    kind, name = op[0], op[1]
    toks = s["seqs"].get(name, op[2] if kind == "add" else [])
    if kind == "add":
        return f"request {name} arrives: {len(toks)} tokens {short(toks)}, {plural(-(-len(toks) // bs), 'logical block')} of {bs}"
    if kind == "allocate":
        return f"allocate({name}, num_cached_blocks={op[2]}) with {name} = {short(toks)}"
    if kind == "compute":
        c = s["cached"].get(name, 0)
        end = "appends the sampled token " + str(op[3]) if op[3] is not None else "discards its sample (prompt unfinished)"
        where = f"position {c}" if op[2] == 1 else f"positions {c}–{c + op[2] - 1}"
        return (f"{name}'s step computes {where} (num_scheduled_tokens {op[2]}), "
                f"then hash_blocks({name}); the scheduler {end}")
    if kind in ("can_append", "may_append"):
        return f"{kind}({name}) with len({name}) = {len(toks)}, {len(toks)} % {bs} = {len(toks) % bs}"
    return f"{kind}({name}) with {name}'s block_table {s['tables'].get(name, [])}" if kind == "deallocate" else \
        f"{kind}({name}) with {name} = {short(toks)} ({len(toks)} tokens, {plural(-(-len(toks) // bs), 'block')})"


def holders(s: dict, block: int) -> list[str]:
    return [n for n, t in s["tables"].items() for b in t if b == block]


def expect_trace(script: list, got, expected: dict, num_blocks: int, bs: int, *, case: str) -> None:
    """Your trace against the reference's, step by step; the first difference is explained."""
    want = states(script, expected["trace"], num_blocks, whose="the reference's")
    yours = states(script, got, num_blocks)
    for i, op in enumerate(script):
        before, w = next(want)
        head = f"{case}, step {i + 1} of {len(script)}: {describe_op(op, before, bs)}"
        y = next(yours, (None, None))[1]
        if y is None:
            raise CheckFailed(f"{head}\nyour replay trace stopped before this step")
        if "error" in y:
            raise CheckFailed(f"{head}\nyour code raised {y['error']}")
        why = explain_step(op, before, w, y, expected["notes"][i], bs)
        if why:
            raise CheckFailed(f"{head}\n" + why)


def explain_step(op: list, before: dict, w: dict, y: dict, note: dict, bs: int) -> str | None:
    """The first observable difference after one step, explained (None when there is none)."""
    kind, name = op[0], op[1]
    if y["value"] != w["value"]:
        return explain_value(op, before, w["value"], y["value"], note, bs)
    if y["tables"][name] != w["tables"][name]:
        return explain_table(op, before, w, y, bs)
    if y["cached"][name] != w["cached"][name]:
        rule = {"allocate": f"allocate sets it to the hit: num_cached_blocks · block_size = {op[2]}·{bs}",
                "deallocate": "deallocate resets it to 0"}.get(kind, "it counts the leading tokens already cached")
        return f"{name}.num_cached_tokens should be {w['cached'][name]} ({rule}); yours: {y['cached'][name]}"
    if y["free"] != w["free"]:
        return explain_free(op, before, w, y)
    if y["used"] != w["used"]:
        return (f"used_block_ids should be {w['used']} (every block with ref_count ≥ 1); yours: {y['used']}")
    for j in range(len(w["ref"])):
        if y["ref"][j] != w["ref"][j]:
            hold = holders(w, j)
            hint = ""
            if kind == "allocate" and j in w["tables"][name][:op[2]]:
                hint = ("\nhint: a prefix hit on a block in use adds 1 to its ref_count" if before["ref"][j] else
                        "\nhint: a prefix hit on a free block revives it with ref_count 1")
            return (f"block {j} is held by {len(hold)} block table{'s' * (len(hold) != 1)}"
                    f"{' (' + ', '.join(hold) + ')' if hold else ''}, so its ref_count is {w['ref'][j]}; "
                    f"yours: {y['ref'][j]}{hint}")
    for j in range(len(w["hash"])):
        if y["hash"][j] != w["hash"][j]:
            return explain_hash(op, j, before, w, y, note, bs)
    for j in range(len(w["tokens"])):
        if w["hash"][j] != -1 and y["tokens"][j] != w["tokens"][j]:
            return (f"block {j} stores the tokens it was hashed with, {w['tokens'][j]} (can_allocate compares them "
                    f"on a hit, against hash collisions); yours: {y['tokens'][j]}")
    if y["map"] != w["map"]:
        return explain_map(op, before, w, y)
    return None


def explain_value(op: list, before: dict, want, got, note: dict, bs: int) -> str:
    kind, name = op[0], op[1]
    toks = before["seqs"][name]
    if kind == "can_allocate":
        nblocks = -(-len(toks) // bs)
        lines = []
        for i, b, in_use in note["walk"]:
            lines.append(f"  logical block {i} {toks[i * bs:(i + 1) * bs]}: " +
                         ("miss: the walk stops" if b is None else
                          f"hit, block {b} ({'in use: shared for free' if in_use else 'free but cached: revived, still takes a free block'})"))
        hits = sum(b is not None for _, b, _ in note["walk"])
        shared = sum(1 for _, b, u in note["walk"] if b is not None and u)
        lines.append(f"  logical block {nblocks - 1} is the last one: never a hit")
        lines.append(f"  blocks to take from the free list: {nblocks} − {shared} shared = {nblocks - shared}; "
                     f"{note['free']} free → " + (f"{hits} hit{'s' * (hits != 1)}" if want >= 0 else "−1 (does not fit)"))
        hint = ""
        if isinstance(got, int) and want >= 0 and got == want + 1 and want + 1 == nblocks:
            hint = "the last logical block never counts as a hit (one token must be computed for the logits)"
        elif got == -1 and want >= 0:
            hint = "a hit on a block in use needs no free block: subtract it from the blocks needed"
        elif isinstance(got, int) and got >= 0 and want == -1:
            hint = "a hit on a free (cached) block still takes a block out of the free list"
        elif got == 0 and want > 0:
            hint = "look each full block's chained hash up in hash_to_block_id: h_i = compute_hash(block i, h_(i−1))"
        return (f"can_allocate({name}) should return {want}:\n" + "\n".join(lines) +
                f"\nyours: {got!r}" + (f"\nhint: {hint}" if hint else ""))
    if kind == "can_append":
        n = len(toks)
        need = 1 if n % bs == 1 else 0
        hint = ("\nhint: len(seq) counts the newest token, which is not cached yet: a new block is needed when "
                "len % block_size == 1" if n % bs in (0, 1) else "")
        return (f"can_append({name}) should be {want}: len = {n}, {n} % {bs} = {n % bs}, so {need} free block"
                f"{'s' * (need != 1)} needed and {len(before['free'])} free; yours: {got!r}{hint}")
    return f"{kind} returns nothing; yours returned {describe(got)}"


def explain_table(op: list, before: dict, w: dict, y: dict, bs: int) -> str:
    kind, name = op[0], op[1]
    want, got, free = w["tables"][name], y["tables"][name], before["free"]
    line = f"{name}.block_table should be {want}; yours: {got}"
    if kind == "allocate":
        n, new = op[2], len(want) - op[2]
        why = (f"logical blocks 0–{n - 1} are the prefix hit {want[:n]}, found through the hash chain; the other "
               if n else "all ") + f"{new} come{'s' * (new == 1)} from the head of the free list {short(free)}"
        hint = ""
        if len(got) < len(want):
            hint = "allocate gives the whole table at once: seq.num_blocks blocks, covering every token so far"
        elif got[n:] == free[::-1][:new] and new > 0 and got[n:] != want[n:]:
            hint = "the free list is a FIFO queue: take new blocks from its left end (popleft)"
        elif got[:n] != want[:n]:
            hint = "the first num_cached_blocks entries are the cached blocks themselves, looked up by hash"
        return f"{line}\n{why}" + (f"\nhint: {hint}" if hint else "")
    if kind == "may_append":
        n = len(before["seqs"][name])
        why = (f"{n} % {bs} == 1: the newest token starts logical block {n // bs}, so the head of the free list, "
               f"block {free[0]}, is appended" if n % bs == 1 else f"{n} % {bs} = {n % bs}: the last block still "
               "has room, nothing is appended")
        return f"{line}\n{why}\nhint: a decode step needs a new block exactly when len(seq) % block_size == 1"
    if kind == "deallocate":
        return f"{line}\ndeallocate clears the block table"
    return line


def explain_free(op: list, before: dict, w: dict, y: dict) -> str:
    kind, name = op[0], op[1]
    want, got, free = w["free"], y["free"], before["free"]
    line = f"the free list should be {short(want, 16)}; yours: {short(got, 16)}"
    cut = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
    if cut > 10:
        line += f"\n(they differ from position {cut} on: expected …{want[cut:cut + 8]}, yours …{got[cut:cut + 8]})"
    if kind == "deallocate":
        table = before["tables"][name]
        freed = [b for b in table[::-1] if w["ref"][b] == 0 and before["ref"][b] > 0]
        steps = ", ".join(f"block {b}: ref {before['ref'][b]}→{before['ref'][b] - 1}" for b in table[::-1])
        why = f"{name}'s table {table} is walked in reverse ({steps}); blocks reaching 0 are appended: {freed}"
        hint = ""
        if got == free + freed[::-1]:
            hint = "free the tail first: walk the block table in reverse, so the tail block is reused before the prefix"
        elif got[:len(freed)] == freed or got[:len(freed)] == freed[::-1]:
            hint = "freed blocks go to the right end of the free list (append); the allocator takes from the left"
        return f"{line}\n{why}" + (f"\nhint: {hint}" if hint else "")
    if kind == "allocate":
        revived = [b for b in w["tables"][name][:op[2]] if b in free]
        why = "new blocks leave from the head of the free list" + \
              (f"; the hit{'s' * (len(revived) > 1)} on free block{'s' * (len(revived) > 1)} {revived} "
               "revive them: they leave the free list too" if revived else "")
        hint = "\nhint: a prefix hit on a free block takes it out of the free list" if any(b in got for b in revived) else ""
        return f"{line}\n{why}{hint}"
    return f"{line}\nthe new block is the head of the free list" if kind == "may_append" else line


def explain_hash(op: list, j: int, before: dict, w: dict, y: dict, note: dict, bs: int) -> str:
    kind, name = op[0], op[1]
    want, got = w["hash"][j], y["hash"][j]
    line = f"block {j}'s hash should be {hx(want)}; yours: {hx(got)}"
    table = w["tables"].get(name, [])
    if kind == "compute" and want != -1 and before["hash"][j] == -1:
        i = table.index(j)
        prev = f"the hash of {name}'s logical block {i - 1}, physical {table[i - 1]}" if i else "−1: it is the first block"
        why = (f"block {j} is {name}'s logical block {i}, tokens {w['tokens'][j]}: full, and this step computed its "
               f"last token, so hash_blocks hashes it with compute_hash(tokens, prefix = {prev})")
        hint = ""
        if got == note.get("unchained", {}).get(j) and i:
            hint = "chain the hashes: the prefix of block i is the hash of block i − 1, so a hash names the whole prefix"
        elif got == -1:
            hint = ("hash every block the step completed: start = num_cached_tokens // block_size, "
                    "end = (num_cached_tokens + num_scheduled_tokens) // block_size")
        return f"{line}\n{why}" + (f"\nhint: {hint}" if hint else "")
    if want == -1 and kind in ("allocate", "may_append") and before["hash"][j] != -1:
        return f"{line}\nblock {j} was taken from the free list for new tokens: its old hash goes (ref 1, hash −1)"
    if want == -1:
        return (f"{line}\nonly full blocks whose last token has been computed get a hash, and only in hash_blocks "
                f"(allocate and may_append hash nothing)")
    if kind == "deallocate":
        return f"{line}\nhint: freeing keeps the hash: a free block stays a cache candidate until it is reused"
    return line


def explain_map(op: list, before: dict, w: dict, y: dict) -> str:
    kind = op[0]
    want, got = w["map"], y["map"]
    missing = [h for h in want if got.get(h) != want[h]]
    extra = [h for h in got if h not in want]
    if missing:
        h = missing[0]
        line = (f"hash_to_block_id[{hx(h)}] should be {want[h]}; yours: "
                + (f"{got[h]}" if h in got else "no entry"))
        if kind == "compute" and h in got:
            return f"{line}\nhint: a newly hashed block overwrites the entry of an equal hash (the later hash_blocks wins)"
        if kind == "compute":
            return f"{line}\nhash_blocks publishes every block it hashes: hash_to_block_id[hash] = block id"
        if kind == "deallocate":
            return f"{line}\nhint: deallocate never removes map entries: a freed block can still be hit and revived"
        reused = [b for b in w["tables"].get(op[1], []) if before["hash"][b] == h]
        return (f"{line}\nthe entry points to block {want[h]}, not to the reused block "
                f"{reused[0] if reused else '(none)'}\nhint: on reuse, delete a map entry only if it still points to "
                "the block being reused")
    h = extra[0]
    if kind in ("allocate", "may_append"):
        return (f"hash_to_block_id should have no entry {hx(h)}; yours maps it to {got[h]}\nblock {got[h]} was taken "
                "from the free list for new tokens, so the entry of its old hash is evicted")
    return f"hash_to_block_id should have no entry {hx(h)}; yours maps it to {got[h]}"


def run_trace(t: Trial, script: list, num_blocks: int, block_size: int, case: str) -> list[dict]:
    """Drive your BlockManager (through the provided replay) and the reference through one script."""
    expected = t.reference(drive_reference, num_blocks, block_size, script)
    got = t.call("replay", num_blocks, block_size, script)
    return expect_trace(script, got, expected, num_blocks, block_size, case=case)


def add(name: str, tokens: list[int], hits: int = 0) -> list[list]:
    """A request arriving and being admitted: add, can_allocate, allocate."""
    return [["add", name, tokens], ["can_allocate", name], ["allocate", name, hits]]


def decode(*steps: tuple[str, int]) -> list[list]:
    """One decode step of a batch: can_append and may_append for each, then each computes 1 token."""
    return [op for name, _ in steps for op in (["can_append", name], ["may_append", name])] + \
        [["compute", name, 1, token] for name, token in steps]


# The life of physical block 0 (4 blocks of 4): the six moments are the states after these steps.
LIFECYCLE = [*add("A", [1, 2, 3, 4, 5, 6, 7, 8, 9]), ["compute", "A", 9, 10],
             *add("B", [1, 2, 3, 4, 20, 21, 22], 1), ["compute", "B", 3, 23],
             ["deallocate", "A"], ["deallocate", "B"],
             *add("C", [1, 2, 3, 4, 30, 31], 1), ["compute", "C", 2, 32], ["deallocate", "C"],
             *add("D", list(range(40, 56)))]
MOMENTS = [(0, "free · 空闲", "every block starts free: ref 0, no hash, in the free list"),
           (4, "allocated · 已分配", "A's logical block 0; A's prefill computed it, so hash_blocks hashed it"),
           (7, "shared · 前缀命中共享", "B's first block hits it: B takes no new block for it, ref_count 2"),
           (10, "freed, still cached · 已释放仍可命中", "A, then B finished: ref 0, back in the free list, hash and "
                                                   "map entry kept"),
           (13, "revived · 被前缀命中复活", "C's first block hits it in the free list: taken out of it, ref 1"),
           (18, "evicted on reuse · 复用时驱逐", "D takes all 4 free blocks; block 0 comes last: its old hash is "
                                               "evicted, D's tokens 52–55 will overwrite it")]


def op_label(op: list) -> str:
    """An operation in a few characters: allocate(B, 1), compute(A, 9 tokens)."""
    if op[0] == "compute":
        return f"compute({op[1]}, {op[2]} token{'s' * (op[2] != 1)})"
    return f"{op[0]}({', '.join(map(str, op[1:2] + op[2:3] if op[0] == 'allocate' else op[1:2]))})"


def block_moment(s: dict | None, block: int) -> dict | None:
    """One block's state at one moment, for the lifecycle figure (None past an error)."""
    if s is None or "error" in s:
        return None
    h = s["hash"][block]
    return {"ref": s["ref"][block], "hash": hx(h), "mapped": block in s["map"].values(), "free": list(s["free"]),
            "holders": holders(s, block), "tokens": list(s["tokens"][block]) if h != -1 else []}


@public("25.3", "compute_hash: one block, then a chain of two")
def hash_format(t: Trial) -> None:
    cases = [([1, 2, 3, 4], None), ([5, 6, 7, 8], 0), (list(range(16)), None), ([70000, -1, 2**40, 3], None)]
    want = t.reference(reference_hashes, cases)
    manager = t.call("BlockManager", 4, 4)
    prefix = -1
    for (tokens, chained), (h, unchained) in zip(cases, want):
        args = (tokens,) if chained is None else (tokens, prefix)
        got = t.method(manager, "compute_hash", *args)
        call = f"compute_hash({tokens}{'' if chained is None else ', prefix=' + hx(prefix)})"
        if got != h:
            hint = ("feed the prefix first: its 8 bytes little-endian, then the tokens" if got == unchained and chained is not None
                    else "the bytes are the prefix (8 bytes little-endian, none for −1), then each token as 8 bytes "
                         "little-endian int64; BLAKE2b with digest_size=8, digest read little-endian")
            raise CheckFailed(f"{call} should be {hx(h)} ({h}); yours: {got!r}\nhint: {hint}")
        prefix = h


def reference_hashes(ref, cases: list) -> list:
    out, prefix = [], -1
    for tokens, chained in cases:
        h = ref.BlockManager.compute_hash(tokens, prefix if chained is not None else -1)
        out.append([h, ref.BlockManager.compute_hash(tokens)])
        prefix = h
    return out


@public("25.3", "figure instance: the six moments of physical block 0")
def lifecycle(t: Trial) -> None:
    expected = t.reference(drive_reference, 4, 4, LIFECYCLE)
    got = t.call("replay", 4, 4, LIFECYCLE)
    at = {k: i for i, (k, _, _) in enumerate(MOMENTS)}
    start = {"ref": 0, "hash": "none", "mapped": False, "free": [0, 1, 2, 3], "holders": [], "tokens": []}
    moments = [{"label": label, "what": what, "op": "", "yours": start if k == 0 else None,
                "expected": start if k == 0 else None} for k, label, what in MOMENTS]
    for whose, trace in (("expected", expected["trace"]), ("yours", got)):
        walk = states(LIFECYCLE, trace, 4, whose="the reference's" if whose == "expected" else "your")
        for k, (_, s) in enumerate(walk, 1):
            if k in at:
                moments[at[k]][whose] = block_moment(s, 0)
                moments[at[k]]["op"] = op_label(LIFECYCLE[k - 1])
    t.figure("ch25-block-lifecycle", block=0, block_size=4, num_blocks=4, moments=moments)
    expect_trace(LIFECYCLE, got, expected, 4, 4, case="the life of block 0")


@public("25.3", "nano-vllm's example: a shared prefix, a duplicate hash, the last block never hits")
def worked_example(t: Trial) -> None:
    # nanovllm.md §10 (8 blocks of 4), then a request D that finds the duplicate hash's newer block.
    script = [*add("A", list(range(1, 11))), ["compute", "A", 10, 100],
              *add("B", [1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 13], 2), *add("C", [1, 2, 3, 4]),
              ["compute", "B", 3, 14], ["compute", "C", 4, 5],
              *decode(("A", 101), ("B", 15), ("C", 0)), ["deallocate", "C"],
              *add("D", [1, 2, 3, 4, 5, 6, 7, 8, 9], 2)]
    run_trace(t, script, 8, 4, "nano-vllm's worked example")


@public("25.3", "preemption with 4 blocks: a reused block loses its hash, a freed one is revived")
def preemption(t: Trial) -> None:
    # nanovllm.md §11: A, B, C with 4-token prompts in a pool of 4 blocks.
    script = [*add("A", [1, 2, 3, 4]), *add("B", [5, 6, 7, 8]), *add("C", [9, 10, 11, 12]),
              ["compute", "A", 4, 13], ["compute", "B", 4, 14], ["compute", "C", 4, 15],
              ["can_append", "A"], ["may_append", "A"], ["can_append", "B"], ["deallocate", "C"],
              ["can_append", "B"], ["may_append", "B"], ["compute", "A", 1, 16], ["compute", "B", 1, 17],
              ["can_allocate", "C"], *decode(("A", 18), ("B", 19)), *decode(("A", 20), ("B", 21)),
              *decode(("A", 22), ("B", 23)), ["can_append", "A"], ["deallocate", "B"], ["can_append", "A"],
              ["may_append", "A"], ["compute", "A", 1, 0], ["deallocate", "A"],
              ["can_allocate", "B"], ["allocate", "B", 1], ["compute", "B", 5, 25], ["can_allocate", "C"]]
    run_trace(t, script, 4, 4, "preemption with 4 blocks")


@public("25.3", "identical prompts in one step: the later hash wins, a stale entry survives another block's reuse")
def duplicates(t: Trial) -> None:
    # nano-vllm issue #219 (duplicates) and #163 (evict only the entry that points to the reused block).
    script = [["add", "A", [1, 2, 3, 4, 5, 6]], ["add", "B", [1, 2, 3, 4, 5, 6]],
              ["can_allocate", "A"], ["allocate", "A", 0], ["can_allocate", "B"], ["allocate", "B", 0],
              ["compute", "A", 6, 7], ["compute", "B", 6, 7], ["deallocate", "A"], ["deallocate", "B"],
              *add("C", list(range(70, 86))), *add("D", [1, 2, 3, 4, 5, 6, 9], 1)]
    run_trace(t, script, 6, 4, "identical prompts")


@public("25.3", "a chunked prefill, decode across a block boundary, a full prompt that hits all but its last block")
def chunks_and_decode(t: Trial) -> None:
    prompt = list(range(1, 14))
    script = [*add("A", prompt), ["compute", "A", 5, None], ["compute", "A", 5, None], ["compute", "A", 3, 14],
              *decode(("A", 15)), *decode(("A", 16)), *decode(("A", 17)), *decode(("A", 18)), ["deallocate", "A"],
              *add("B", prompt + [14, 15, 16, 99], 4), *add("E", prompt + [14, 15, 16], 3), ["compute", "E", 4, 1]]
    run_trace(t, script, 6, 4, "chunks and decode")
