"""ch19 · rotary position embedding: the common mistakes, each with the hint that names it and the edit of the
reference that makes it (see `grader.authoring.misconceptions`)."""

from grader.authoring import mistake

ANGLES = "angles = pos.to(torch.float)[:, None] * inv_freq"
RETURN_TABLES = "    return angles.cos(), angles.sin()"
ROTATE = "    x1, x2 = x.float().chunk(2, dim=-1)\n    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(x.dtype)"
TABLES = "    c, s = cos.float()[:, None, :], sin.float()[:, None, :]"
QK = (
    "    return (apply_rope(head_rms_norm(q, q_norm_weight), cos, sin),\n            apply_rope(head_rms_norm(k, k_norm_weight), cos, sin))"
)
MEAN_SQUARE = "xf.pow(2).mean(dim=-1, keepdim=True) + eps)"
QK_ROPE = "    q, k = qk_norm_rope(q, k, q_norm_weight, k_norm_weight, positions, base, eps)\n"
NORM_ONLY = "torch.zeros_like(positions)"  # position 0 turns nothing: qk_norm_rope then only normalises
ATTEND = '    return torch.einsum("hns,shd->nhd", probs, values).to(q.dtype)'

MISTAKES = [
    # -- ch19.1 rope_cos_sin ----------------------------------------------------------------------------------
    mistake(
        "full_width",
        "ch19.1",
        "one angle per pair: head_dim {d} has d/2 = {half} pairs. Hugging Face repeats the angles as "
        "cat((freqs, freqs)) to width d; nano-vllm and this course keep d/2",
        (RETURN_TABLES, "    angles = torch.cat((angles, angles), dim=-1)\n" + RETURN_TABLES),
    ),
    mistake(
        "sin_cos_order",
        "ch19.1",
        "you returned (sin, cos): the order is (cos, sin)",
        (RETURN_TABLES, "    return angles.sin(), angles.cos()"),
    ),
    mistake(
        "exponent_j_over_d",
        "ch19.1",
        "the exponent is 2j/d (j = 0 … d/2 − 1, i.e. arange(0, d, 2) / d), not j/d",
        ("torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim", "torch.arange(head_dim // 2, dtype=torch.float) / head_dim"),
    ),
    mistake(
        "inverted_frequencies",
        "ch19.1",
        "inv_freq is 1 / base^(2j/d): the frequencies fall from 1 towards 1/base",
        ("inv_freq = 1.0 / (base ** (", "inv_freq = (base ** ("),
    ),
    mistake(
        "one_based",
        "ch19.1",
        "positions are 0-based: position 0 is not rotated",
        (ANGLES, "angles = (pos + 1).to(torch.float)[:, None] * inv_freq"),
    ),
    mistake(
        "bf16_angles",
        "ch19.1",
        "compute the angles in float32: bf16 cannot hold large positions exactly (257 becomes 256)",
        (ANGLES, "angles = (pos.to(torch.bfloat16)[:, None] * inv_freq.to(torch.bfloat16)).float()"),
    ),
    mistake(
        "zero_angles",
        "ch19.1",
        "the angle of pair j at position p is p · inv_freq[j]: yours are all 0",
        (ANGLES, "angles = torch.zeros(pos.shape[0], head_dim // 2)"),
    ),
    # -- ch19.2 apply_rope (and the rotation inside qk_norm_rope) ---------------------------------------------
    mistake(
        "interleaved",
        "ch19.2 ch19.3",
        "the pairs are (x[j], x[j + d/2]) (half-split, NeoX / rotate_half, as nano-vllm and Qwen3), not "
        "(x[2j], x[2j + 1]) (interleaved, GPT-J)",
        (
            ROTATE,
            "    x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]\n"
            "    return torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2).to(x.dtype)",
        ),
    ),
    mistake(
        "backwards",
        "ch19.2",
        "the sign of sin is flipped (you rotate backwards): y1 = x1·cos − x2·sin, y2 = x2·cos + x1·sin",
        ("x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(x.dtype)", "x1 * c + x2 * s, x2 * c - x1 * s), dim=-1).to(x.dtype)"),
    ),
    mistake(
        "swapped_tables",
        "ch19.2",
        "cos and sin are swapped: the cos of the angle multiplies x1 in y1 and x2 in y2",
        (TABLES, "    c, s = sin.float()[:, None, :], cos.float()[:, None, :]"),
    ),
    mistake(
        "one_sign",
        "ch19.2",
        "one half has the wrong sign: y1 = x1·cos − x2·sin and y2 = x2·cos + x1·sin",
        ("x2 * c + x1 * s), dim=-1).to(x.dtype)", "x2 * c - x1 * s), dim=-1).to(x.dtype)"),
    ),
    mistake(
        "low_precision",
        "ch19.2 ch19.3",
        "you rotated in {dtype}: RoPE casts x (and cos, sin) to float32, rotates, and casts the result back once, as nano-vllm does",
        (TABLES, "    c, s = cos.to(x.dtype)[:, None, :], sin.to(x.dtype)[:, None, :]"),
        ("    x1, x2 = x.float().chunk(2, dim=-1)", "    x1, x2 = x.chunk(2, dim=-1)"),
    ),
    # -- ch19.3 qk_norm_rope ----------------------------------------------------------------------------------
    mistake(
        "rotate_first",
        "ch19.3",
        "normalise first, then rotate: the weight scales channel j and j + d/2 differently, so it must act "
        "before RoPE mixes them (nano-vllm: q_norm, k_norm, then rotary_emb)",
        (
            QK,
            "    return (head_rms_norm(apply_rope(q, cos, sin), q_norm_weight),\n"
            "            head_rms_norm(apply_rope(k, cos, sin), k_norm_weight))",
        ),
    ),
    mistake(
        "no_norm",
        "ch19.3",
        "apply the per-head RMSNorm (q_norm / k_norm) before rotating",
        (QK, "    return apply_rope(q, cos, sin), apply_rope(k, cos, sin)"),
    ),
    mistake(
        "no_rope",
        "ch19.3",
        "rotate the normalised q and k with RoPE at the tokens' positions",
        (QK, "    return head_rms_norm(q, q_norm_weight), head_rms_norm(k, k_norm_weight)"),
    ),
    mistake(
        "no_weight",
        "ch19.3",
        "multiply by the norm weight after normalising",
        ("return (normed.to(x.dtype) * weight).to(x.dtype)", "return normed.to(x.dtype)"),
    ),
    mistake(
        "other_weight",
        "ch19.3",
        "q_norm_weight belongs to q and k_norm_weight to k",
        (
            QK,
            "    return (apply_rope(head_rms_norm(q, k_norm_weight), cos, sin),\n"
            "            apply_rope(head_rms_norm(k, q_norm_weight), cos, sin))",
        ),
    ),
    mistake(
        "over_heads",
        "ch19.3",
        "RMSNorm runs over head_dim (the last axis), not across the heads",
        (MEAN_SQUARE, "xf.pow(2).mean(dim=1, keepdim=True) + eps)"),
    ),
    mistake(
        "whole_token",
        "ch19.3",
        "q_norm and k_norm normalise every head separately over its head_dim, not the whole token",
        (MEAN_SQUARE, "xf.pow(2).mean(dim=(1, 2), keepdim=True) + eps)"),
    ),
    mistake(
        "weight_in_float32",
        "ch19.3",
        "cast the normalised x back to {dtype} before multiplying by the weight, as nano-vllm and Hugging Face do",
        ("return (normed.to(x.dtype) * weight).to(x.dtype)", "return (normed * weight.float()).to(x.dtype)"),
    ),
    mistake("returns_v", "ch19.3", "V is neither normalised nor rotated, so qk_norm_rope returns only q and k", (QK, QK[:-1] + ", None)")),
    # -- ch19.4 rope_attention --------------------------------------------------------------------------------
    mistake(
        "rotated_v",
        "ch19.4",
        "RoPE turns q and k only: V is the content that gets mixed, not a position, and nano-vllm hands v to "
        "attention untouched (q, k = rotary_emb(positions, q, k))",
        (QK_ROPE, QK_ROPE + "    v = apply_rope(v, *rope_cos_sin(positions, d, base))\n"),
    ),
    mistake(
        "normed_v",
        "ch19.4",
        "q_norm and k_norm act on q and k only: V goes to attention as the projection gave it",
        (QK_ROPE, f"    v = qk_norm_rope(k, v, k_norm_weight, k_norm_weight, {NORM_ONLY}, base, eps)[1]\n" + QK_ROPE),
    ),
    mistake(
        "v_like_k",
        "ch19.4",
        "V takes neither step: no k_norm and no RoPE; only q and k are normalised and rotated",
        (QK_ROPE, "    v = qk_norm_rope(k, v, k_norm_weight, k_norm_weight, positions, base, eps)[1]\n" + QK_ROPE),
    ),
    mistake(
        "one_rotated",
        "ch19.4",
        "RoPE turns both q and k at their positions; yours turned only {which}, so a score q·k depends on where "
        "the {which} stands instead of on how far apart the two tokens are",
        (
            QK_ROPE,
            "    q, k = (qk_norm_rope(q, k, q_norm_weight, k_norm_weight, positions, base, eps)[0],\n"
            f"            qk_norm_rope(q, k, q_norm_weight, k_norm_weight, {NORM_ONLY}, base, eps)[1])\n",
        ),
    ),
    mistake(
        "rotated_after",
        "ch19.4",
        "RoPE turns q and k before the scores: positions act through q·k. Rotating the attention output afterwards is not the same",
        (QK_ROPE, QK_ROPE.replace("positions, base", f"{NORM_ONLY}, base")),
        (ATTEND, '    return apply_rope(torch.einsum("hns,shd->nhd", probs, values), *rope_cos_sin(positions, d, base)).to(q.dtype)'),
    ),
    mistake(
        "no_offset",
        "ch19.4",
        "the new tokens come after the cached ones: with C cached tokens they stand at positions C … C + N − 1, "
        "not 0 … N − 1 (nano-vllm: range(num_cached_tokens, …); a decode step at len − 1)",
        ("torch.arange(c, c + n)", "torch.arange(n)"),
    ),
    mistake(
        "rotated_cache_again",
        "ch19.4",
        "the cache holds keys as they were stored, normalised and rotated at their own positions: use them as "
        "they are (rotating them again turns them twice)",
        ("k, v = torch.cat((k_cache, k)),", "k, v = torch.cat((apply_rope(k_cache, *rope_cos_sin(torch.arange(c), d, base)), k)),"),
    ),
    mistake(
        "causal_offset",
        "ch19.4",
        "query i stands at position C + i and sees keys 0 … C + i: the causal mask is aligned to the end, past "
        "the cached tokens (ch17's offset rule)",
        (".tril(diagonal=c)", ".tril()"),
    ),
    mistake(
        "kv_groups",
        "ch19.4",
        "query head h reads K/V head h // (Hq / Hkv): consecutive query heads share a K/V head (repeat_interleave, not repeat; ch18)",
        ("keys = k.float().repeat_interleave(group, dim=1)", "keys = k.float().repeat(1, group, 1)"),
        ("values = v.float().repeat_interleave(group, dim=1)", "values = v.float().repeat(1, group, 1)"),
    ),
    mistake("no_scale", "ch19.4", "scale the scores q·k by 1/√d (Qwen3: head_dim ** -0.5) before the softmax", (" * d ** -0.5\n", "\n")),
    mistake(
        "attention_low_precision",
        "ch19.4",
        "compute the attention in float32 (scores, softmax and the weighted sum of V) and cast the output to q's dtype once, at the end",
        ("q.float(), keys", "q, keys.to(q.dtype)"),
        ("probs, values)", "probs.to(q.dtype), values.to(q.dtype))"),
    ),
]
