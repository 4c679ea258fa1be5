"""ch25 · paged KV cache: the common mistakes, each with the hint that names it and the edit of the reference
that makes it (see `grader.authoring.misconceptions`). The slot-mapping ones are also the keys of the hidden
model `ch25_models.slot_variants`, which says what slots each gives."""

from grader.authoring import mistake

SLOT_RETURN = "return table[logical] * block_size + pos % block_size"
FREE = "        self.used_block_ids.discard(block_id)\n        self.free_block_ids.append(block_id)\n"
SHARED = "            if block_id in self.used_block_ids:\n                needed -= 1\n"

MISTAKES = [
    # -- ch25.1: slot_mapping --------------------------------------------------------------------------------
    mistake(
        "slot_is_position",
        "ch25.1",
        "the slot uses the physical block from the table, not the logical position",
        (SLOT_RETURN, "return pos.clone()"),
    ),
    mistake(
        "block_times_offset",
        "ch25.1",
        "the slot is the block's first row plus the offset: block · block_size + offset, not block · offset",
        (SLOT_RETURN, "return table[logical] * (pos % block_size)"),
    ),
    mistake(
        "slot_is_block",
        "ch25.1",
        "a slot is a row of the flat pool, not a block id: multiply the block by block_size and add the offset",
        (SLOT_RETURN, "return table[logical]"),
    ),
    mistake(
        "offset_dropped", "ch25.1", "add the offset p % block_size inside the block", (SLOT_RETURN, "return table[logical] * block_size")
    ),
    mistake(
        "block_plus_offset",
        "ch25.1",
        "multiply the physical block by block_size first: its first row is block · block_size",
        (SLOT_RETURN, "return table[logical] + pos % block_size"),
    ),
    mistake(
        "position_as_offset",
        "ch25.1",
        "the offset inside the block is p % block_size, not the whole position p",
        (SLOT_RETURN, "return table[logical] * block_size + pos"),
    ),
    mistake(
        "block_added_to_position",
        "ch25.1",
        "the physical block replaces the logical block; it is not added to the position",
        (SLOT_RETURN, "return pos + table[logical]"),
    ),
    mistake(
        "ceiling_block",
        "ch25.1",
        "the logical block of position p is p // block_size, rounded down: positions 0 … block_size − 1 are "
        "block 0. Rounded up, (p + block_size − 1) // block_size counts the blocks that p tokens need, one too "
        "many for a position inside a block",
        ("logical = pos // block_size", "logical = (pos + block_size - 1) // block_size"),
    ),
    mistake(
        "divmod_swapped",
        "ch25.1",
        "p // block_size is the logical block and p % block_size the offset inside it, not the other way round",
        (SLOT_RETURN, "return table[pos % block_size] * block_size + pos // block_size"),
    ),
    # -- ch25.2: store_kv ---------------------------------------------------------------------------------------
    mistake(
        "padding_written",
        "ch25.2",
        "a slot of −1 marks a padding row: skip it (in Python, index −1 is the last row)",
        ("keep = s != PAD_SLOT", "keep = s == s"),
    ),
    mistake(
        "reshape_copy",
        "ch25.2",
        "write into the caches you were given, whatever their strides: a cache is often a view of one bigger pool "
        "(vLLM slices K and V out of one allocation, or permutes its layout), and reshape (or flatten, or .contiguous()) "
        "of a view that is not contiguous returns a copy, so writing into it leaves the cache unchanged",
        (
            "    k_cache[block, offset] = k[keep].to(k_cache.dtype)\n    v_cache[block, offset] = v[keep].to(v_cache.dtype)\n",
            "    k_cache.reshape(-1, *k_cache.shape[2:])[s[keep]] = k[keep].to(k_cache.dtype)\n"
            "    v_cache.reshape(-1, *v_cache.shape[2:])[s[keep]] = v[keep].to(v_cache.dtype)\n",
        ),
    ),
    # -- ch25.3: hashes --------------------------------------------------------------------------------------------
    mistake(
        "hash_ignores_prefix",
        "ch25.3",
        "feed the prefix first: its 8 bytes little-endian, then the tokens",
        ('        data = b"" if prefix == NO_HASH else prefix.to_bytes(8, "little")', '        data = b""'),
    ),
    mistake(
        "hash_bytes",
        "ch25.3",
        "the bytes are the prefix (8 bytes little-endian, none for −1), then each token as 8 bytes little-endian "
        "int64; BLAKE2b with digest_size=8, digest read little-endian",
        ('digest_size=8).digest(), "little")', 'digest_size=8).digest(), "big")'),
    ),
    mistake(
        "unchained",
        "ch25.3",
        "chain the hashes: the prefix of block i is the hash of block i − 1, so a hash names the whole prefix",
        (
            "            h = self.compute_hash(tokens, h)\n            block.hash, block.token_ids = h, tokens",
            "            h = self.compute_hash(tokens)\n            block.hash, block.token_ids = h, tokens",
        ),
    ),
    mistake(
        "hash_not_all",
        "ch25.3",
        "hash every block the step completed: start = num_cached_tokens // block_size, end = (num_cached_tokens + "
        "num_scheduled_tokens) // block_size",
        ("        for i in range(start, end):\n", "        for i in range(max(start, end - 1), end):\n"),
    ),
    mistake(
        "first_hash_wins",
        "ch25.3",
        "a newly hashed block overwrites the entry of an equal hash (the later hash_blocks wins)",
        ("            self.hash_to_block_id[h] = block.block_id", "            self.hash_to_block_id.setdefault(h, block.block_id)"),
    ),
    # -- ch25.3: can_allocate and can_append -----------------------------------------------------------------
    mistake(
        "last_block_hits",
        "ch25.3",
        "the last logical block never counts as a hit (one token must be computed for the logits)",
        ("for i in range(seq.num_blocks - 1):", "for i in range(seq.num_blocks):"),
    ),
    mistake(
        "shared_hit_costs_a_block",
        "ch25.3",
        "a hit on a block in use needs no free block: subtract it from the blocks needed",
        (SHARED, ""),
    ),
    mistake(
        "free_hit_costless",
        "ch25.3",
        "a hit on a free (cached) block still takes a block out of the free list",
        (SHARED, "            needed -= 1\n"),
    ),
    mistake(
        "hash_only",
        "ch25.3",
        "a hash names a block's tokens only up to collisions: on a hit, compare the tokens stored with the mapped "
        "block to this block's tokens, and treat a difference as a miss (nano-vllm: `self.blocks[block_id]"
        ".token_ids != token_ids`), or a block holding other tokens is handed out as this prefix",
        ("            if block_id is None or self.blocks[block_id].token_ids != tokens:", "            if block_id is None:"),
    ),
    mistake(
        "no_lookup",
        "ch25.3",
        "look each full block's chained hash up in hash_to_block_id: h_i = compute_hash(block i, h_(i−1))",
        ("            if block_id is None or self.blocks[block_id].token_ids != tokens:\n                break\n", "            break\n"),
    ),
    mistake(
        "append_off_by_one",
        "ch25.3",
        "len(seq) counts the newest token, which is not cached yet: a new block is needed when len % block_size == 1",
        ("        needed = 1 if len(seq) % self.block_size == 1 else 0", "        needed = 1 if len(seq) % self.block_size == 0 else 0"),
    ),
    # -- ch25.3: allocate, may_append, deallocate ------------------------------------------------------------
    mistake(
        "partial_table",
        "ch25.3",
        "allocate gives the whole table at once: seq.num_blocks blocks, covering every token so far",
        ("        while len(seq.block_table) < seq.num_blocks:\n", "        if len(seq.block_table) < seq.num_blocks:\n"),
    ),
    mistake(
        "lifo",
        "ch25.3",
        "the free list is a FIFO queue: take new blocks from its left end (popleft)",
        ("block_id = self.free_block_ids.popleft()", "block_id = self.free_block_ids.pop()"),
    ),
    mistake(
        "cached_blocks_not_reused",
        "ch25.3",
        "the first num_cached_blocks entries are the cached blocks themselves, looked up by hash",
        ("        for i in range(num_cached_blocks):\n", "        for i in range(0):\n"),
    ),
    mistake(
        "shared_ref_not_counted",
        "ch25.3",
        "a prefix hit on a block in use adds 1 to its ref_count",
        ("                block.ref_count += 1\n", "                pass\n"),
    ),
    mistake(
        "revived_ref",
        "ch25.3",
        "a prefix hit on a free block revives it with ref_count 1",
        (
            "                block.ref_count = 1\n            seq.block_table.append(block_id)",
            "            seq.block_table.append(block_id)",
        ),
    ),
    mistake(
        "revived_stays_free",
        "ch25.3",
        "a prefix hit on a free block takes it out of the free list",
        ("                self.free_block_ids.remove(block_id)\n", ""),
    ),
    mistake(
        "may_append_on_full_block",
        "ch25.3",
        "a decode step needs a new block exactly when len(seq) % block_size == 1",
        (
            "        if len(seq) % self.block_size == 1:\n            seq.block_table.append",
            "        if len(seq) % self.block_size == 0:\n            seq.block_table.append",
        ),
    ),
    mistake(
        "forward_free",
        "ch25.3",
        "free the tail first: walk the block table in reverse, so the tail block is reused before the prefix",
        ("for block_id in seq.block_table[::-1]:", "for block_id in seq.block_table:"),
    ),
    mistake(
        "freed_to_front",
        "ch25.3",
        "freed blocks go to the right end of the free list (append); the allocator takes from the left",
        (FREE, FREE.replace(".append(", ".appendleft(")),
    ),
    mistake(
        "zeroed_on_free",
        "ch25.3",
        "freeing keeps the hash: a free block stays a cache candidate until it is reused",
        (FREE, FREE + "        self.blocks[block_id].hash = NO_HASH\n"),
    ),
    mistake(
        "map_entry_dropped_on_free",
        "ch25.3",
        "deallocate never removes map entries: a freed block can still be hit and revived",
        (FREE, FREE + "        self.hash_to_block_id.pop(self.blocks[block_id].hash, None)\n"),
    ),
    mistake(
        "evict_any",
        "ch25.3",
        "on reuse, delete a map entry only if it still points to the block being reused",
        ("if block.hash != NO_HASH and self.hash_to_block_id.get(block.hash) == block_id:", "if block.hash in self.hash_to_block_id:"),
    ),
]
