"""ch25's block-manager traces, shared by its public and hidden checks: the reference's trace of a script
of allocate / append / deallocate steps (from the hidden side, with the facts an explanation needs), the
student's trace of the same script (the provided `replay`, in one call), compared step by step
(`grader.authoring.trace`), and the explanation of the first step where the two differ; then what the
block-lifecycle figure reads of a trace.
"""

from __future__ import annotations

from typing import Any, Iterator

from grader.authoring import CheckFailed, Trial, compare_trace, describe, expect_records, hidden_model, mistakes, short, walk
from grader.i18n import mark, tr

drive_reference = hidden_model("ch25_models.drive_reference")
"""`t.ref.drive(drive_reference, num_blocks, block_size, script)`: the reference's trace of a script, plus per step
the facts an explanation needs (for can_allocate the walk over the hash chain, for compute each newly hashed
block's unchained hash). The walk repeats the prefix-cache lookup, so it runs on the hidden side."""
M = mistakes("ch25")


# -- running a script on both sides ------------------------------------------------------------------------
def run_trace(t: Trial, script: list, num_blocks: int, block_size: int, case: str, *, weak_hash: bool = False) -> list[dict]:
    """Drive your BlockManager (through the provided replay) and the reference through one script (with
    weak_hash, both hash with the provided colliding_hash)."""
    expected = t.ref.drive(drive_reference, num_blocks, block_size, script, weak_hash=weak_hash)
    got = t.yours.replay(num_blocks, block_size, script, weak_hash=weak_hash)
    return expect_trace(script, got, expected, num_blocks, block_size, case=case)


def expect_trace(script: list, got: Any, expected: dict, num_blocks: int, bs: int, *, case: str) -> list[dict]:
    """Your trace against the reference's, step by step (`grader.authoring.trace.compare`); the first difference
    is explained with the pool's state before and after the step."""
    want = walk(states(script, expected["trace"], num_blocks))
    yours = walk(states(script, expect_records(got), num_blocks))

    def explain(k: int, _mine: dict, _want: dict) -> CheckFailed | None:
        before, w = want(k)
        return explain_step(script[k], before, w, yours(k)[1], expected["notes"][k], bs)

    return compare_trace(got, expected["trace"], case=case, describe=lambda k: describe_op(script[k], want(k)[0], bs), explain=explain)


def states(script: list, trace: list[dict], num_blocks: int) -> Iterator[tuple[dict, dict]]:
    """Replay a trace of what changed: per step, the op's sequence and the pool before it (a small copy)
    and the full state after it (one dict, updated in place). A step that raised yields a state with
    "error" and ends the walk."""
    s: dict[str, Any] = {
        "free": list(range(num_blocks)),
        "used": [],
        "ref": [0] * num_blocks,
        "hash": [-1] * num_blocks,
        "tokens": [[] for _ in range(num_blocks)],
        "map": {},
        "tables": {},
        "cached": {},
        "seqs": {},
        "value": None,
    }
    try:
        for op, rec in zip(script, trace):
            name = op[1]
            if op[0] == "add":
                s["seqs"][name] = list(op[2])
            before = {
                "free": list(s["free"]),
                "ref": list(s["ref"]),
                "hash": list(s["hash"]),
                "map": dict(s["map"]),
                "tables": {name: s["tables"].get(name, [])},
                "cached": {name: s["cached"].get(name, 0)},
                "seqs": {name: list(s["seqs"][name])},
            }
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
        error = f"{type(e).__name__}: {e}"
        raise CheckFailed(
            tr(
                "your replay's trace is not in the documented form ({error}); replay, run_op and snapshot are provided: "
                "keep them as they are",
                error=error,
            )
        ) from None


# -- describing ---------------------------------------------------------------------------------------------


def hx(h) -> str:
    """A block hash as a student reads it: 16 hex digits, "none" for −1, and a small one (colliding_hash's sums; a
    64-bit hash below 2**16 has odds 2**-48) in decimal."""
    if h == -1:
        return "none"
    return (str(h) if h < 2**16 else f"0x{h:016x}") if isinstance(h, int) and h >= 0 else repr(h)


def describe_op(op: list, s: dict, bs: int) -> str:
    """One operation of a script in the chapter's terms, given the state before it."""
    kind, name = op[0], op[1]
    toks = s["seqs"].get(name, op[2] if kind == "add" else [])
    n, blocks = len(toks), -(-len(toks) // bs)
    call = f"allocate({name}, num_cached_blocks={op[2]})" if kind == "allocate" else f"{kind}({name})"
    if kind == "add":
        if blocks == 1:
            return tr("request {name} arrives: {n} tokens {tokens}, 1 logical block of {bs}", name=name, n=n, tokens=short(toks), bs=bs)
        return tr(
            "request {name} arrives: {n} tokens {tokens}, {blocks} logical blocks of {bs}",
            name=name,
            n=n,
            tokens=short(toks),
            blocks=blocks,
            bs=bs,
        )
    if kind == "allocate":
        return tr("{call} with {name} = {tokens}", call=call, name=name, tokens=short(toks))
    if kind == "compute":
        c = s["cached"].get(name, 0)
        end = (
            tr("the scheduler appends the sampled token {token}", token=op[3])
            if op[3] is not None
            else tr("the scheduler discards its sample (prompt unfinished)")
        )
        where = tr("position {p}", p=c) if op[2] == 1 else tr("positions {first}–{last}", first=c, last=c + op[2] - 1)
        return tr(
            "{name}'s step computes {where} (num_scheduled_tokens {k}), then hash_blocks({name}); {end}",
            name=name,
            where=where,
            k=op[2],
            end=end,
        )
    if kind in ("can_append", "may_append"):
        return tr("{call} with len({name}) = {n}, {n} % {bs} = {rest}", call=call, name=name, n=n, bs=bs, rest=n % bs)
    if kind == "deallocate":
        return tr("{call} with {name}'s block_table {table}", call=call, name=name, table=s["tables"].get(name, []))
    if blocks == 1:
        return tr("{call} with {name} = {tokens} ({n} tokens, 1 block)", call=call, name=name, tokens=short(toks), n=n)
    return tr("{call} with {name} = {tokens} ({n} tokens, {blocks} blocks)", call=call, name=name, tokens=short(toks), n=n, blocks=blocks)


def holders(s: dict, block: int) -> list[str]:
    return [n for n, t in s["tables"].items() for b in t if b == block]


# -- explaining the first difference -------------------------------------------------------------------------
def explain_step(op: list, before: dict, w: dict, y: dict, note: dict, bs: int) -> CheckFailed | None:
    """The first observable difference after one step, explained (None when there is none)."""
    kind, name = op[0], op[1]
    if y["value"] != w["value"]:
        return explain_value(op, before, w["value"], y["value"], note, bs)
    if y["tables"][name] != w["tables"][name]:
        return explain_table(op, before, w, y, bs)
    if y["cached"][name] != w["cached"][name]:
        if kind == "allocate":
            rule = tr("allocate sets it to the hit: num_cached_blocks · block_size = {n}·{bs}", n=op[2], bs=bs)
        else:
            rule = tr("deallocate resets it to 0") if kind == "deallocate" else tr("it counts the leading tokens already cached")
        return CheckFailed(
            tr(
                "{name}.num_cached_tokens should be {want} ({rule}); yours: {got}",
                name=name,
                want=w["cached"][name],
                rule=rule,
                got=y["cached"][name],
            )
        )
    if y["free"] != w["free"]:
        return explain_free(op, before, w, y)
    if y["used"] != w["used"]:
        return CheckFailed(
            tr("used_block_ids should be {want} (every block with ref_count ≥ 1); yours: {got}", want=w["used"], got=y["used"])
        )
    for j in range(len(w["ref"])):
        if y["ref"][j] != w["ref"][j]:
            hold = holders(w, j)
            hit = kind == "allocate" and j in w["tables"][name][: op[2]]
            fields = dict(j=j, k=len(hold), names=", ".join(hold), want=w["ref"][j], got=y["ref"][j])
            if len(hold) == 1:
                line = tr("block {j} is held by 1 block table ({names}), so its ref_count is {want}; yours: {got}", **fields)
            elif hold:
                line = tr("block {j} is held by {k} block tables ({names}), so its ref_count is {want}; yours: {got}", **fields)
            else:
                line = tr("block {j} is held by no block table, so its ref_count is {want}; yours: {got}", **fields)
            return CheckFailed(line, hint=(M.shared_ref_not_counted if before["ref"][j] else M.revived_ref) if hit else "")
    for j in range(len(w["hash"])):
        if y["hash"][j] != w["hash"][j]:
            return explain_hash(op, j, before, w, y, note)
    for j in range(len(w["tokens"])):
        if w["hash"][j] != -1 and y["tokens"][j] != w["tokens"][j]:
            return CheckFailed(
                tr(
                    "block {j} stores the tokens it was hashed with, {want} (can_allocate compares them on a hit, against "
                    "hash collisions); yours: {got}",
                    j=j,
                    want=w["tokens"][j],
                    got=y["tokens"][j],
                )
            )
    if y["map"] != w["map"]:
        return explain_map(op, before, w, y)
    return None


def explain_value(op: list, before: dict, want: Any, got: Any, note: dict, bs: int) -> CheckFailed:
    kind, name = op[0], op[1]
    toks = before["seqs"][name]
    if kind == "can_allocate":
        nblocks = -(-len(toks) // bs)
        lines = []
        collision = note.get("collision")
        for i, b, in_use in note["walk"]:
            if collision and collision["index"] == i:
                lines.append(
                    "  "
                    + tr(
                        "logical block {i} {tokens}: its hash {hash} maps to block {block}, which holds other tokens {other}: "
                        "a hash collision, so a miss: the walk stops",
                        i=i,
                        tokens=toks[i * bs : (i + 1) * bs],
                        hash=hx(collision["hash"]),
                        block=collision["block"],
                        other=collision["tokens"],
                    )
                )
                continue
            here = dict(i=i, tokens=toks[i * bs : (i + 1) * bs], block=b)
            if b is None:
                lines.append("  " + tr("logical block {i} {tokens}: miss: the walk stops", **here))
            elif in_use:
                lines.append("  " + tr("logical block {i} {tokens}: hit, block {block} (in use: shared for free)", **here))
            else:
                lines.append(
                    "  " + tr("logical block {i} {tokens}: hit, block {block} (free but cached: revived, still takes a free block)", **here)
                )
        hits = sum(b is not None for _, b, _ in note["walk"])
        shared = sum(1 for _, b, u in note["walk"] if b is not None and u)
        lines.append("  " + tr("logical block {i} is the last one: never a hit", i=nblocks - 1))
        if want < 0:
            result = tr("−1 (does not fit)")
        else:
            result = tr("1 hit") if hits == 1 else tr("{n} hits", n=hits)
        lines.append(
            "  "
            + tr(
                "blocks to take from the free list: {blocks} − {shared} shared = {need}; {free} free → {result}",
                blocks=nblocks,
                shared=shared,
                need=nblocks - shared,
                free=note["free"],
                result=result,
            )
        )
        hint = ""
        if collision and isinstance(got, int) and got > collision["index"]:  # went on past the colliding block
            hint = M.hash_only
        elif isinstance(got, int) and want >= 0 and got == want + 1 and want + 1 == nblocks:
            hint = M.last_block_hits
        elif got == -1 and want >= 0 and shared and note["free"] < nblocks:  # fits only with the shared hits free
            hint = M.shared_hit_costs_a_block
        elif got == hits and want == -1 and hits > shared and note["free"] >= nblocks - hits:  # every hit free
            hint = M.free_hit_costless
        elif got == 0 and want > 0:
            hint = M.no_lookup
        return CheckFailed(
            tr("can_allocate({name}) should return {want}:", name=name, want=want), *lines, tr("yours: {got}", got=repr(got)), hint=hint
        )
    if kind == "can_append":
        n = len(toks)
        need = 1 if n % bs == 1 else 0
        fields = dict(name=name, want=want, n=n, bs=bs, rest=n % bs, free=len(before["free"]), got=repr(got))
        return CheckFailed(
            tr(
                "can_append({name}) should be {want}: len = {n}, {n} % {bs} = {rest}, so 1 free block needed and {free} free; yours: {got}",
                **fields,
            )
            if need
            else tr(
                "can_append({name}) should be {want}: len = {n}, {n} % {bs} = {rest}"
                ", so no free block needed and {free} free; yours: {got}",
                **fields,
            ),
            hint=M.append_off_by_one if n % bs in (0, 1) else "",
        )
    return CheckFailed(tr("{kind} returns nothing; yours returned {what}", kind=kind, what=describe(got)))


def explain_table(op: list, before: dict, w: dict, y: dict, bs: int) -> CheckFailed:
    kind, name = op[0], op[1]
    want, got, free = w["tables"][name], y["tables"][name], before["free"]
    line = tr("{name}.block_table should be {want}; yours: {got}", name=name, want=want, got=got)
    if kind == "allocate":
        n, new = op[2], len(want) - op[2]
        fields = dict(last=n - 1, hit=want[:n], new=new, free=short(free))
        if n:
            why = (
                tr(
                    "logical blocks 0–{last} are the prefix hit {hit}, found through the hash chain;"
                    " the other 1 comes from the head of the free list {free}",
                    **fields,
                )
                if new == 1
                else tr(
                    "logical blocks 0–{last} are the prefix hit {hit}, found through the hash chain;"
                    " the other {new} come from the head of the free list {free}",
                    **fields,
                )
            )
        else:
            why = (
                tr("all 1 comes from the head of the free list {free}", **fields)
                if new == 1
                else tr("all {new} come from the head of the free list {free}", **fields)
            )
        hint = ""
        if len(got) < len(want):
            hint = M.partial_table
        elif got[n:] == free[::-1][:new] and new > 0 and got[n:] != want[n:]:
            hint = M.lifo
        elif got[:n] != want[:n]:
            hint = M.cached_blocks_not_reused
        elif any(b in got[n:] for b in want[:n] if b in free):
            hint = M.revived_stays_free  # a hit on a free block left it in the free list, which hands it out again
        return CheckFailed(line, why, hint=hint)
    if kind == "may_append":
        n = len(before["seqs"][name])
        why = (
            tr(
                "{n} % {bs} == 1: the newest token starts logical block {block}, so the head of the free list, block {head}, is appended",
                n=n,
                bs=bs,
                block=n // bs,
                head=free[0],
            )
            if n % bs == 1
            else tr("{n} % {bs} = {rest}: the last block still has room, nothing is appended", n=n, bs=bs, rest=n % bs)
        )
        hint = ""
        if len(got) != len(want):
            hint = M.may_append_on_full_block
        elif free and got[-1] == free[-1] != free[0]:
            hint = M.lifo
        return CheckFailed(line, why, hint=hint)
    if kind == "deallocate":
        return CheckFailed(line, tr("deallocate clears the block table"))
    return CheckFailed(line)


def explain_free(op: list, before: dict, w: dict, y: dict) -> CheckFailed:
    kind, name = op[0], op[1]
    want, got, free = w["free"], y["free"], before["free"]
    lines = [tr("the free list should be {want}; yours: {got}", want=short(want, 16), got=short(got, 16))]
    cut = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
    if cut > 10:
        lines.append(
            tr(
                "(they differ from position {cut} on: expected …{want}, yours …{got})",
                cut=cut,
                want=want[cut : cut + 8],
                got=got[cut : cut + 8],
            )
        )
    if kind == "deallocate":
        table = before["tables"][name]
        freed = [b for b in table[::-1] if w["ref"][b] == 0 and before["ref"][b] > 0]
        steps = ", ".join(
            tr("block {block}: ref {old}→{new}", block=b, old=before["ref"][b], new=before["ref"][b] - 1) for b in table[::-1]
        )
        hint = ""
        if got == free + freed[::-1]:
            hint = M.forward_free
        elif got[: len(freed)] == freed or got[: len(freed)] == freed[::-1]:
            hint = M.freed_to_front
        return CheckFailed(
            *lines,
            tr(
                "{name}'s table {table} is walked in reverse ({steps}); blocks reaching 0 are appended: {freed}",
                name=name,
                table=table,
                steps=steps,
                freed=freed,
            ),
            hint=hint,
        )
    if kind == "allocate":
        revived = [b for b in w["tables"][name][: op[2]] if b in free]
        if len(revived) > 1:
            why = tr(
                "new blocks leave from the head of the free list;"
                " the hits on free blocks {revived} revive them: they leave the free list too",
                revived=revived,
            )
        elif revived:
            why = tr(
                "new blocks leave from the head of the free list; the hit on free block {revived} revives it: it leaves the free list too",
                revived=revived,
            )
        else:
            why = tr("new blocks leave from the head of the free list")
        return CheckFailed(*lines, why, hint=M.revived_stays_free if any(b in got for b in revived) else "")
    return CheckFailed(*lines, tr("the new block is the head of the free list") if kind == "may_append" else "")


def explain_hash(op: list, j: int, before: dict, w: dict, y: dict, note: dict) -> CheckFailed:
    kind, name = op[0], op[1]
    want, got = w["hash"][j], y["hash"][j]
    line = tr("block {j}'s hash should be {want}; yours: {got}", j=j, want=hx(want), got=hx(got))
    table = w["tables"].get(name, [])
    if kind == "compute" and want != -1 and before["hash"][j] == -1:
        i = table.index(j)
        prev = (
            tr("the hash of {name}'s logical block {i}, physical {phys}", name=name, i=i - 1, phys=table[i - 1])
            if i
            else tr("−1: it is the first block")
        )
        return CheckFailed(
            line,
            tr(
                "block {j} is {name}'s logical block {i}, tokens {tokens}: full, and this step computed its last token, so "
                "hash_blocks hashes it with compute_hash(tokens, prefix = {prev})",
                j=j,
                name=name,
                i=i,
                tokens=w["tokens"][j],
                prev=prev,
            ),
            hint=M.unchained
            if got == note.get("unchained", {}).get(j) and i
            else M.hash_not_all
            if got == -1
            else M.hash_bytes
            if got == int.from_bytes(want.to_bytes(8, "little"), "big")
            else "",
        )
    if want == -1 and kind in ("allocate", "may_append") and before["hash"][j] != -1:
        return CheckFailed(line, tr("block {j} was taken from the free list for new tokens: its old hash goes (ref 1, hash −1)", j=j))
    if want == -1:
        return CheckFailed(
            line,
            tr(
                "only full blocks whose last token has been computed get a hash, and only in hash_blocks (allocate and "
                "may_append hash nothing)"
            ),
        )
    if kind == "deallocate" and got == -1:
        return CheckFailed(line, hint=M.zeroed_on_free)
    if kind == "deallocate":
        return CheckFailed(line, tr("deallocate changes no hash: a free block keeps its hash until it is reused"))
    return CheckFailed(line)


def explain_map(op: list, before: dict, w: dict, y: dict) -> CheckFailed:
    kind = op[0]
    want, got = w["map"], y["map"]
    missing = [h for h in want if got.get(h) != want[h]]
    extra = [h for h in got if h not in want]
    if missing:
        h = missing[0]
        line = (
            tr("hash_to_block_id[{hash}] should be {want}; yours: {got}", hash=hx(h), want=want[h], got=got[h])
            if h in got
            else tr("hash_to_block_id[{hash}] should be {want}; yours: no entry", hash=hx(h), want=want[h])
        )
        if kind == "compute" and h in got and got[h] == before["map"].get(h):  # the older entry kept
            return CheckFailed(line, hint=M.first_hash_wins)
        if kind == "compute":
            return CheckFailed(line, tr("hash_blocks publishes every block it hashes: hash_to_block_id[hash] = block id"))
        if kind == "deallocate" and h not in got:
            return CheckFailed(line, hint=M.map_entry_dropped_on_free)
        if kind == "deallocate":
            return CheckFailed(line, tr("deallocate changes no map entry"))
        reused = [b for b in w["tables"].get(op[1], []) if before["hash"][b] == h]
        if h not in got and reused:  # the entry of another block deleted with the reused block's equal hash
            return CheckFailed(
                line,
                tr("the entry points to block {block}, not to the reused block {reused}", block=want[h], reused=reused[0]),
                hint=M.evict_any,
            )
        return CheckFailed(line, tr("only the entry of a reused block's own old hash goes, and only if it points to that block"))
    h = extra[0]
    line = tr("hash_to_block_id should have no entry {hash}; yours maps it to {block}", hash=hx(h), block=got[h])
    if kind in ("allocate", "may_append"):
        return CheckFailed(
            line, tr("block {block} was taken from the free list for new tokens, so the entry of its old hash is evicted", block=got[h])
        )
    return CheckFailed(line)


# -- scripts and the block-lifecycle figure ------------------------------------------------------------------
def add(name: str, tokens: list[int], hits: int = 0) -> list[list]:
    """A request arriving and being admitted: add, can_allocate, allocate."""
    return [["add", name, tokens], ["can_allocate", name], ["allocate", name, hits]]


def decode(*steps: tuple[str, int]) -> list[list]:
    """One decode step of a batch: can_append and may_append for each, then each computes 1 token."""
    return [op for name, _ in steps for op in (["can_append", name], ["may_append", name])] + [
        ["compute", name, 1, token] for name, token in steps
    ]


# The life of physical block 0 (4 blocks of 4): the six moments are the states after these steps.
LIFECYCLE = [
    *add("A", [1, 2, 3, 4, 5, 6, 7, 8, 9]),
    ["compute", "A", 9, 10],
    *add("B", [1, 2, 3, 4, 20, 21, 22], 1),
    ["compute", "B", 3, 23],
    ["deallocate", "A"],
    ["deallocate", "B"],
    *add("C", [1, 2, 3, 4, 30, 31], 1),
    ["compute", "C", 2, 32],
    ["deallocate", "C"],
    *add("D", list(range(40, 56))),
]
MOMENTS = [  # (step, label, what): marked, translated where the figure's moments are made
    (0, mark("free"), mark("every block starts free: ref 0, no hash, in the free list")),
    (4, mark("allocated"), mark("A's logical block 0; A's prefill computed it, so hash_blocks hashed it")),
    (7, mark("shared by a prefix hit"), mark("B's first block hits it: B takes no new block for it, ref_count 2")),
    (10, mark("freed, still cached"), mark("A, then B finished: ref 0, back in the free list, hash and map entry kept")),
    (13, mark("revived by a prefix hit"), mark("C's first block hits it in the free list: taken out of it, ref 1")),
    (
        18,
        mark("evicted on reuse"),
        mark("D takes all 4 free blocks; block 0 comes last: its old hash is evicted, D's tokens 52–55 will overwrite it"),
    ),
]


def op_label(op: list) -> str:
    """An operation in a few characters: allocate(B, 1), compute(A, 9 tokens)."""
    if op[0] == "compute":
        return tr("compute({name}, 1 token)", name=op[1]) if op[2] == 1 else tr("compute({name}, {n} tokens)", name=op[1], n=op[2])
    return f"{op[0]}({', '.join(map(str, op[1:2] + op[2:3] if op[0] == 'allocate' else op[1:2]))})"


def block_moment(s: dict | None, block: int) -> dict | None:
    """One block's state at one moment, for the lifecycle figure (None past an error)."""
    if s is None or "error" in s:
        return None
    h = s["hash"][block]
    return {
        "ref": s["ref"][block],
        "hash": hx(h),
        "mapped": block in s["map"].values(),
        "free": list(s["free"]),
        "holders": holders(s, block),
        "tokens": list(s["tokens"][block]) if h != -1 else [],
    }
