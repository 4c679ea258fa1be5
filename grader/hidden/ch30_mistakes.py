"""ch30 · into a native core: the common mistakes, each with the hint that names it and the edit of the reference
that makes it (see `grader.authoring.misconceptions`)."""

from grader.authoring import mistake

MISTAKES = [
    # -- 30.1 the record's layout
    mistake(
        "padding_fields",
        "ch30.1",
        "padding bytes are not fields; numpy inserts them itself when the dtype is built with align=True",
        ('("is_prompt", "?"),', '("is_prompt", "?"), ("pad0", "V3"),'),
    ),
    mistake(
        "big_endian",
        "ch30.1",
        "the core reads little-endian bytes; a big-endian field has the right name and the wrong bytes",
        ('("prompt_len", "<i4")', '("prompt_len", ">i4")'),
    ),
    mistake(
        "packed",
        "ch30.1",
        "build the dtype with align=True: C aligns every field to its own size",
        ('("seed", "<i8")], align=True)', '("seed", "<i8")], align=False)'),
    ),
    mistake("tail_padding", "ch30.1", "C pads the end of a struct too, so that the next record in an array is aligned"),
    # -- 30.1 the record's values and the step's arrays
    mistake(
        "top_k_raw",
        "ch30.1",
        "the core encodes 'top-k off' as 0; lower the front end's −1 to 0",
        ("max_tokens, temperature, top_p, max(top_k, 0), seed)", "max_tokens, temperature, top_p, top_k, seed)"),
    ),
    mistake(
        "seed_none",
        "ch30.1",
        "an optional value needs an explicit encoding in a C field: no seed is −1",
        ("seed = -1 if seed is None else", "seed = 0 if seed is None else"),
    ),
    mistake(
        "outputs_mean_decode",
        "ch30.1",
        "output tokens without KV (after a preemption) are recomputed in a prompt step, as nano-vllm does",
        ("decode = computed == num_tokens - 1 and num_tokens > len(prompt)", "decode = len(output) > 0"),
    ),
    mistake(
        "decode_rule",
        "ch30.1",
        "a request decodes only when exactly one token, an output token, lacks KV",
        ("decode = computed == num_tokens - 1 and num_tokens > len(prompt)", "decode = computed == num_tokens - 1"),
    ),
    mistake(
        "refeed_cached",
        "ch30.1",
        "tokens whose KV is already cached are not fed again",
        ("num_tokens - computed, not decode,", "num_tokens, not decode,"),
    ),
    mistake(
        "feed_all_tokens",
        "ch30.1",
        "feed only the tokens whose KV is not cached yet",
        ("input_ids = np.array(tokens[computed:], dtype=np.int32)", "input_ids = np.array(tokens, dtype=np.int32)"),
        ("positions = np.arange(computed, num_tokens, dtype=np.int32)", "positions = np.arange(0, num_tokens, dtype=np.int32)"),
    ),
    # -- 30.2 the support matrix
    mistake(
        "exclusive_context",
        "ch30.2",
        "max_context is inclusive: a context exactly at the limit is supported",
        ('    if context > m["max_context"]:', '    if context >= m["max_context"]:'),
    ),
    mistake(
        "derived_head_dim",
        "ch30.2",
        "read head_dim from the config ({value}); hidden_size / num_attention_heads = {derived} is only the fallback",
        ('    head_dim = c.get("head_dim")\n    if head_dim is None:', "    head_dim = None\n    if head_dim is None:"),
    ),
    mistake(
        "prefix_is_kv_service",
        "ch30.2",
        "a local prefix cache (prefix_caching) is not a KV service: check the feature asked for",
        (
            '        elif not m["features"][f]:',
            '        elif not m["features"][f] and not (f == "kv_service" and m["features"].get("prefix_caching")):',
        ),
    ),
    mistake(
        "unlisted_feature",
        "ch30.2",
        "a README vouches only for what it lists: an unlisted feature is unsupported",
        (
            '            out.append(f"{f}: not listed in {release}\'s support matrix, so this release does not vouch for it")',
            "            pass",
        ),
    ),
    mistake(
        "quant_none",
        "ch30.2",
        "a model without quantization_config needs no quantization support",
        ('    if quant is not None and method not in m["quantization"]:', '    if method not in m["quantization"]:'),
    ),
]
