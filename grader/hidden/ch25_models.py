"""ch25's driver of the reference block manager, with the facts its explanations need (never shipped).

Reached through `grader.checks.ch25_blocks.drive_reference` (a `grader.authoring.hidden_model` driver): the walk
over the hash chain repeats the prefix-cache lookup of ch25.3, so a student release holds only what it gave for
the public scripts.
"""

from __future__ import annotations


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


def slot_variants(ref, block_table: list[int], positions: list[int], block_size: int) -> dict:
    """{misconception: the slots it gives every position}, by the names `grader.checks.ch25.SLOT_HINTS` uses; a
    misconception that would index past the block table (and so raise) is left out."""
    import torch

    p = torch.as_tensor(positions, dtype=torch.int64)
    table = torch.as_tensor(block_table, dtype=torch.int64)
    logical, offset = p // block_size, p % block_size

    def through(index: torch.Tensor) -> torch.Tensor | None:
        ok = not index.numel() or (int(index.min()) >= 0 and int(index.max()) < len(block_table))
        return table[index] if ok else None

    block = through(logical)
    if block is None:
        return {"position": p.clone()}
    out = {"position": p.clone(), "block × offset": block * offset, "block id": block.clone(),
           "offset dropped": block * block_size, "block + offset": block + offset,
           "whole position as offset": block * block_size + p, "added to the position": p + block}
    ceiling = through((p + block_size - 1) // block_size)
    if ceiling is not None:
        out["ceiling"] = ceiling * block_size + offset
    swapped = through(offset)
    if swapped is not None:
        out["divmod swapped"] = swapped * block_size + logical
    return out
