"""ch28 · cache identity and the logits boundary: the common mistakes, each with the hint that names it and the
edit of the reference that makes it (see `grader.authoring.misconceptions`)."""

from grader.authoring import mistake

CAP = "return min(num_hit_blocks, (prompt_len - 1) // block_size) * block_size"
LAST_ROWS = "return torch.cumsum(q, 0) - 1"

MISTAKES = [
    # -- 28.1 block hashes ---------------------------------------------------------------------------------------
    mistake(
        "hex_strings",
        "ch28.1",
        "return the digests (hashlib.sha256(…).digest()), not hex strings",
        ("        out.append(parent)\n", "        out.append(parent.hex())\n"),
    ),
    mistake(
        "partial_block",
        "ch28.1",
        "only full blocks are hashed: the last {n} tokens do not fill a block",
        ("for i in range(len(tokens) // block_size):", "for i in range(-(-len(tokens) // block_size)):"),
        ('struct.pack(f"<{block_size}q", *tokens[s:e])', 'struct.pack(f"<{len(tokens[s:e])}q", *tokens[s:e])'),
    ),
    mistake(
        "digest_size",
        "ch28.1",
        "a hash is SHA-256's 32-byte digest; yours has {n} bytes",
        ("parent = hashlib.sha256(parent + struct.pack", "parent = hashlib.md5(parent + struct.pack"),
    ),
    mistake(
        "keys_missing",
        "ch28.1",
        "the identity keys are missing: the same tokens must hash differently under another salt, adapter or image",
        ("*tokens[s:e]) + extra).digest()", "*tokens[s:e])).digest()"),
    ),
    mistake(
        "salt_missing",
        "ch28.1",
        "the salt is missing: it enters block 0's extra keys (and every later block through the chain)",
        ('            extra += b"salt" + struct.pack("<I", len(salt)) + salt\n', ""),
    ),
    mistake(
        "lora_missing",
        "ch28.1",
        "the LoRA id enters every block's extra keys",
        ('extra = b"" if lora_id is None else b"lora" + struct.pack("<q", lora_id)', 'extra = b""'),
    ),
    mistake(
        "mm_missing",
        "ch28.1",
        "each multimodal item enters the extra keys of every block it overlaps",
        ('                extra += b"mm" + struct.pack("<I", len(name)) + name + struct.pack("<q", offset - s)\n', ""),
    ),
    mistake(
        "unchained",
        "ch28.1",
        "chain the blocks: block i's parent is hash_(i−1), only block 0's is NONE_HASH",
        ("parent = hashlib.sha256(parent + struct.pack", "parent = hashlib.sha256(NONE_HASH + struct.pack"),
    ),
    mistake(
        "salt_everywhere",
        "ch28.1",
        "the salt enters block 0 only; later blocks inherit it through the parent hash",
        ("        if i == 0 and cache_salt is not None:", "        if cache_salt is not None:"),
    ),
    # -- 28.2 the last-token rule ----------------------------------------------------------------------------------
    mistake(
        "uncapped",
        "ch28.2",
        "at least the last token must be computed to get its logits: the hit is capped at prompt_len − 1 tokens, in whole blocks",
        (CAP, "return num_hit_blocks * block_size"),
    ),
    mistake(
        "token_cap",
        "ch28.2",
        "hits come in whole blocks: round prompt_len − 1 down to a multiple of block_size",
        (CAP, "return min(num_hit_blocks * block_size, prompt_len - 1)"),
    ),
    # -- 28.3 logits indices ---------------------------------------------------------------------------------------
    mistake(
        "first_row",
        "ch28.3",
        "the sampled row is the request's last scheduled token, not its first",
        (LAST_ROWS, "return torch.cumsum(q, 0) - q"),
    ),
    mistake(
        "no_minus_one",
        "ch28.3",
        "subtract 1: cu_seqlens_q[r + 1] is already the first row of the next request",
        (LAST_ROWS, "return torch.cumsum(q, 0)"),
    ),
    mistake(
        "local_row",
        "ch28.3",
        "the indices are rows of the flattened batch: add the request's start cu_seqlens_q[r]",
        (LAST_ROWS, "return q - 1"),
    ),
]
