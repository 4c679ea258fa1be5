"""ch25's driver of the reference block manager, with the facts its explanations need (never shipped).

Reached through `grader.checks.ch25_explain.drive_reference` (a `grader.authoring.hidden_model` driver): the walk
over the hash chain repeats the prefix-cache lookup of ch25.3, so a student release holds only what it gave for
the public scripts.
"""

from __future__ import annotations

from typing import Any


def drive_reference(ref: Any, num_blocks: int, block_size: int, script: list, weak_hash: bool = False) -> dict:
    """The reference's trace of a script, plus per step the facts an explanation needs (plain data):
    for can_allocate the walk over the hash chain (and, when it stops at a hash whose block holds other tokens,
    that collision), for compute each newly hashed block's unchained hash. With weak_hash, the reference hashes
    with `colliding_hash`, as the student's replay does."""
    manager, notes = ref.BlockManager(num_blocks, block_size), []
    hash_fn = ref.colliding_hash if weak_hash else ref.BlockManager.compute_hash
    manager.compute_hash = hash_fn  # the reference hashes through self.compute_hash
    seqs: dict[str, Any] = {}
    for op in script:
        note: dict = {}
        seq = seqs.get(op[1])  # the sequence of every op but "add", made by an earlier "add"
        if op[0] == "can_allocate" and seq is not None:
            h, walk = -1, []
            for i in range(seq.num_blocks - 1):
                h = hash_fn(seq.block(i), h)
                b = manager.hash_to_block_id.get(h)
                hit = b is not None and manager.blocks[b].token_ids == seq.block(i)
                walk.append([i, b if hit else None, hit and b in manager.used_block_ids])
                if not hit:
                    if b is not None:
                        note["collision"] = {"index": i, "hash": h, "block": b, "tokens": list(manager.blocks[b].token_ids)}
                    break
            note.update(walk=walk, free=len(manager.free_block_ids))
        elif op[0] == "compute" and seq is not None:
            first, end = seq.num_cached_tokens // block_size, (seq.num_cached_tokens + op[2]) // block_size
            note = {"unchained": {seq.block_table[i]: hash_fn(seq.block(i)) for i in range(first, end)}}
        ref.run_op(manager, seqs, op)
        notes.append(note)
    return {"trace": ref.replay(num_blocks, block_size, script, weak_hash=weak_hash), "notes": notes}


def slot_variants(ref, block_table: list[int], positions: list[int], block_size: int) -> dict:
    """{misconception: the slots it gives every position}, by their ids in the table of mistakes
    (`grader.checks.ch25.slot_misconceptions`); a misconception that would index past the block table (and so
    raise) is left out."""
    import torch

    p = torch.as_tensor(positions, dtype=torch.int64)
    table = torch.as_tensor(block_table, dtype=torch.int64)
    logical, offset = p // block_size, p % block_size

    def through(index: torch.Tensor) -> torch.Tensor | None:
        ok = not index.numel() or (int(index.min()) >= 0 and int(index.max()) < len(block_table))
        return table[index] if ok else None

    block = through(logical)
    if block is None:
        return {"slot_is_position": p.clone()}
    out = {
        "slot_is_position": p.clone(),
        "block_times_offset": block * offset,
        "slot_is_block": block.clone(),
        "offset_dropped": block * block_size,
        "block_plus_offset": block + offset,
        "position_as_offset": block * block_size + p,
        "block_added_to_position": p + block,
    }
    ceiling = through((p + block_size - 1) // block_size)
    if ceiling is not None:
        out["ceiling_block"] = ceiling * block_size + offset
    swapped = through(offset)
    if swapped is not None:
        out["divmod_swapped"] = swapped * block_size + logical
    return out
