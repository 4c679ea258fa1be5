"""ch18 · grouped-query attention: the common mistakes, each with the hint that names it and the edit of the
reference that makes it (see `grader.authoring.misconceptions`)."""

from grader.authoring import mistake

KV_FOR = "return q_head // (num_heads // num_kv_heads)"
GROUP = "    group = Hq // Hkv\n"
SCALE = "scale = d ** -0.5 if scale is None else scale"
BYTES = "return 2 * num_layers * num_kv_heads * head_dim * num_tokens * dtype_bytes"

MISTAKES = [
    # -- ch18.1 kv_head_for (and the grouping inside gqa_attention) --------------------------------------------
    mistake(
        "interleaved",
        "ch18.1 ch18.2",
        "query head h reads K/V head h // group = h // {group}: consecutive heads share one (heads 0 … {last} "
        "read K/V head 0, the next {group} K/V head 1, …), as in nano-vllm and flash-attn; q_head % "
        "num_kv_heads interleaves the heads (0, 1, 0, 1, …)",
        (KV_FOR, "return q_head % num_kv_heads"),
        ("q.reshape(T, Hkv, group, d).permute(1, 2, 0, 3)", "q.reshape(T, group, Hkv, d).permute(2, 1, 0, 3)"),
        ("out.view(Hkv, group, T, d).permute(2, 0, 1, 3)", "out.view(Hkv, group, T, d).permute(2, 1, 0, 3)"),
    ),
    mistake(
        "divide_by_kv_heads",
        "ch18.1 ch18.2",
        "query head h reads K/V head h // group: divide by the group size num_heads // num_kv_heads = {group}, "
        "not by num_kv_heads = {num_kv_heads}",
        (KV_FOR, "return q_head // num_kv_heads"),
        # gqa_attention: each query head gathers K/V head h // Hkv (a copy, and the wrong head)
        (GROUP, GROUP + "    kv_of = [h // Hkv for h in range(Hq)]\n    k, v, Hkv, group = k[:, kv_of], v[:, kv_of], Hq, 1\n"),
    ),
    mistake(
        "query_head_itself", "ch18.1", "return the K/V head the query head reads, not the query head itself", (KV_FOR, "return q_head")
    ),
    mistake(
        "place_in_group",
        "ch18.1",
        "h % group is the head's place inside its group; the group (and so the K/V head) is h // group = h // {group}",
        (KV_FOR, "return q_head % (num_heads // num_kv_heads)"),
    ),
    # -- ch18.2 gqa_attention: the mask, the scale, the layout ------------------------------------------------
    mistake(
        "topleft",
        "ch18.2",
        "the causal mask is aligned to the end: query i is the token at position S − T + i = {offset} + i and "
        "sees keys 0 … {offset} + i; a top-left tril (or SDPA's is_causal=True with T ≠ S) lets it see only "
        "keys 0 … i",
        ("allowed = torch.arange(S) <= torch.arange(T)[:, None] + (S - T)", "allowed = torch.ones(T, S, dtype=torch.bool).tril()"),
    ),
    mistake("no_mask", "ch18.2", "causal=True: mask the keys after each query's position", ("    if causal:\n", "    if False:\n")),
    mistake("mask_not_causal", "ch18.2", "causal=False: every query sees every key, apply no mask", ("    if causal:\n", "    if True:\n")),
    mistake(
        "scale_ignored",
        "ch18.2",
        "use the scale argument ({scale}) when one is given; 1/√d is only the default",
        (SCALE, "scale = d ** -0.5"),
    ),
    mistake(
        "unscaled",
        "ch18.2",
        "scale the scores by 1/√d = 1/√{d}; you did not scale them",
        (SCALE, "scale = 1.0 if scale is None else scale"),
    ),
    mistake("scale_1_over_d", "ch18.2", "the scale is 1/√d = 1/√{d}, not 1/d", (SCALE, "scale = 1 / d if scale is None else scale")),
    mistake(
        "scale_all_heads",
        "ch18.2",
        "the scale is 1/√head_dim = 1/√{d}, not 1/√(num_heads·head_dim)",
        (SCALE, "scale = (Hq * d) ** -0.5 if scale is None else scale"),
    ),
    mistake(
        "head_major",
        "ch18.2",
        "keep the token-major layout [T, Hq, d] of q: transpose back after working head-major",
        ("out.view(Hkv, group, T, d).permute(2, 0, 1, 3).reshape(T, Hq, d)", "out.reshape(Hq, T, d)"),
    ),
    mistake(
        "overflow",
        "ch18.2",
        "your output has inf/nan: subtract each row's maximum before exp (or use torch.softmax), and make sure "
        "no query row is fully masked",
        ("scores.softmax(dim=-1)", "(scores.exp() / scores.exp().sum(dim=-1, keepdim=True))"),
    ),
    # -- ch18.2: a copy of K/V per query head (the measured check) --------------------------------------------
    mistake(
        "repeat_kv",
        "ch18.2",
        "{op} materialises the repeated K/V; index the shared head instead of copying it",
        (GROUP, GROUP + "    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)\n    Hkv, group = Hq, 1\n"),
    ),
    mistake(
        "expand_kv",
        "ch18.2",
        "expand is a view, but the reshape (or contiguous) after it writes every repeated K/V row out; keep "
        "the group axis in q instead of copying K and V",
        (
            GROUP,
            GROUP + "    k = k[:, :, None].expand(S, Hkv, group, d).reshape(S, Hq, d)\n"
            "    v = v[:, :, None].expand(S, Hkv, group, d).reshape(S, Hq, d)\n"
            "    Hkv, group = Hq, 1\n",
        ),
    ),
    mistake(
        "broadcast_matmul",
        "ch18.2",
        "a torch.matmul that broadcasts a [Hkv, 1, …] K against [Hkv, group, T, d] queries expands K over the "
        "group and copies it ([{kv_heads}, {group}, {d}, {S}]); fold the group into the rows instead: "
        "[Hkv, group·T, d] @ [Hkv, d, S]",
        # K as [Hkv, 1, d, S] against q as [Hkv, group, T, d]: torch expands (copies) K per query head
        ("permute(1, 2, 0, 3).reshape(Hkv, group * T, d)", "permute(1, 2, 0, 3)"),
        ("(qg @ k.permute(1, 2, 0))", "(qg @ k.permute(1, 2, 0).unsqueeze(1))"),
        ('float("-inf")).view(Hkv, group * T, S)', 'float("-inf"))'),
        ("@ v.permute(1, 0, 2)", "@ v.permute(1, 0, 2).unsqueeze(1)"),
    ),
    # -- ch18.3 kv_cache_bytes -------------------------------------------------------------------------------
    mistake(
        "float_bytes",
        "ch18.3",
        "multiply the Python ints directly (no /, no float(), no math.pow): a float loses bytes above 2^53 and is not a count",
        ("return 2 * num_layers", "return 2.0 * num_layers"),
    ),
    mistake(
        "k_only",
        "ch18.3",
        "count both K and V: every token stores a key and a value vector per K/V head (the factor 2)",
        ("return 2 * num_layers", "return num_layers"),
    ),
    mistake("factor_2_twice", "ch18.3", "the factor 2 (K and V) appears once", ("return 2 * num_layers", "return 2 * 2 * num_layers")),
    mistake(
        "bits",
        "ch18.3",
        "dtype_bytes is already bytes per element: do not multiply by 8 (that counts bits)",
        ("* dtype_bytes\n", "* dtype_bytes * 8\n"),
    ),
    mistake(
        "no_layers",
        "ch18.3",
        "every layer has its own K/V cache: multiply by num_layers",
        ("return 2 * num_layers * num_kv_heads", "return 2 * num_kv_heads"),
    ),
    mistake(
        "no_dtype_bytes",
        "ch18.3",
        "multiply by dtype_bytes: without it you counted elements, not bytes",
        ("* num_tokens * dtype_bytes\n", "* num_tokens\n"),
    ),
    mistake(
        "one_token", "ch18.3", "multiply by num_tokens: your count is for one token", ("* num_tokens * dtype_bytes\n", "* dtype_bytes\n")
    ),
    mistake(
        "float_rounding",
        "ch18.3",
        "off by {diff} bytes: float arithmetic rounds above 2^53; multiply Python ints, which are exact at any size",
        (BYTES, "return int(2.0 * num_layers * num_kv_heads * head_dim * num_tokens * dtype_bytes)"),
    ),
]
