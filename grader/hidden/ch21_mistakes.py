"""ch21 · the KV cache and the decode step: the common mistakes, each with the hint that names it and the edit of
the reference that makes it (see `grader.authoring.misconceptions`)."""

from grader.authoring import mistake

# The reference's two writes into the caches, and its decode-step dict (edited below).
K_WRITE, V_WRITE = "k_cache[length:length + n] = k_new", "v_cache[length:length + n] = v_new"
SLOT = '"slot": int(block_table[logical]) * block_size + offset}'

MISTAKES = [
    # -- ch21.1 append_kv: where the new rows go ------------------------------------------------------------
    mistake(
        "swapped_kv",
        "ch21.1",
        "k_new goes into k_cache and v_new into v_cache",
        (K_WRITE, "k_cache[length:length + n] = v_new"),
        (V_WRITE, "v_cache[length:length + n] = k_new"),
    ),
    mistake(
        "row_zero",
        "ch21.1",
        "the new rows go after the {length} cached ones: write {rows} (that overwrites cached tokens)",
        (K_WRITE, "k_cache[:n] = k_new"),
        (V_WRITE, "v_cache[:n] = v_new"),
    ),
    mistake(
        "one_early",
        "ch21.1",
        "rows 0 … length − 1 are taken: the first free row is row length = {length}, not {before}",
        (K_WRITE, "k_cache[length - 1:length - 1 + n] = k_new"),
        (V_WRITE, "v_cache[length - 1:length - 1 + n] = v_new"),
    ),
    mistake(
        "one_late",
        "ch21.1",
        "the first free row is row length = {length}; you left it empty and started at {after}",
        (K_WRITE, "k_cache[length + 1:length + 1 + n] = k_new"),
        (V_WRITE, "v_cache[length + 1:length + 1 + n] = v_new"),
    ),
    mistake(
        "clears_rest",
        "ch21.1",
        "the rows after length + n are not part of the sequence yet: leave them exactly as they were "
        "(clearing or rewriting them costs a write of the whole cache every step)",
        ("    return int(length + n)", "    k_cache[length + n:] = 0\n    v_cache[length + n:] = 0\n    return int(length + n)"),
    ),
    # -- ch21.1 append_kv: the length it returns ---------------------------------------------------------------
    mistake(
        "old_length",
        "ch21.1",
        "return the new length length + n, not the length before the append",
        ("return int(length + n)", "return int(length)"),
    ),
    mistake(
        "count_only",
        "ch21.1",
        "return the total length length + n, not the number of tokens appended",
        ("return int(length + n)", "return int(n)"),
    ),
    mistake(
        "last_index",
        "ch21.1",
        "length + n − 1 is the index of the last filled row; the length is one more",
        ("return int(length + n)", "return int(length + n - 1)"),
    ),
    # -- ch21.2 decode_inputs ----------------------------------------------------------------------------------
    mistake(
        "previous_token",
        "ch21.2",
        "token_ids[-2] is already cached; the step feeds the newest token, token_ids[-1]",
        ('"input_id": int(token_ids[-1])', '"input_id": int(token_ids[-2])'),
    ),
    mistake(
        "position_len",
        "ch21.2",
        "positions count from 0: the newest of len tokens is at position len − 1 "
        "(nano-vllm itself had this off-by-one until commit f5b4840)",
        ("position = n - 1", "position = n"),
    ),
    mistake(
        "position_previous",
        "ch21.2",
        "len − 2 is the previous token's position; token_ids already holds the newest token",
        ("position = n - 1", "position = n - 2"),
    ),
    mistake(
        "context_short",
        "ch21.2",
        "count the newest token too: its K/V is written into the cache before attention reads it, so attention sees len entries",
        ('"context_len": n,', '"context_len": n - 1,'),
    ),
    mistake(
        "previous_slot",
        "ch21.2",
        "that is the slot of the previous token (position {previous}), whose K/V is already cached; this step "
        "writes the newest token's K/V, at position len − 1 = {position}",
        ("logical, offset = divmod(position, block_size)", "logical, offset = divmod(position - 1, block_size)"),
    ),
    mistake(
        "next_slot",
        "ch21.2",
        "that is the slot of position len = {n}, where the next token will go; the newest token is at position len − 1 = {position}",
        ("logical, offset = divmod(position, block_size)", "logical, offset = divmod(position + 1, block_size)"),
    ),
    mistake(
        "position_as_slot", "ch21.2", "the slot uses the physical block from the block table, not the position", (SLOT, '"slot": position}')
    ),
    mistake(
        "table_last",
        "ch21.2",
        "block_table[-1] = {last} is the last block of the table, not the block of position {position}: use "
        "block_table[(len − 1) // block_size] (nano-vllm's table[-1] works only because its table has exactly "
        "ceil(len / block_size) entries)",
        ("int(block_table[logical])", "int(block_table[-1])"),
    ),
    mistake(
        "short_table",
        "ch21.2",
        "raise ValueError when the block table does not reach logical block (len − 1) // block_size: the block "
        "the newest token needs was never allocated (nano-vllm's may_append adds it before the step), and "
        "block_table[-1] would put the K/V in a slot of an earlier token's block",
        (
            "    if logical >= len(block_table):\n"
            '        raise ValueError(f"position {position} needs logical block {logical}; the table has only '
            '{len(block_table)}")\n',
            "",
        ),
    ),
    mistake(
        "block_id_as_slot",
        "ch21.2",
        "a slot is a row of the flat pool: block · block_size + offset, not the block id",
        (SLOT, '"slot": int(block_table[logical])}'),
    ),
]
