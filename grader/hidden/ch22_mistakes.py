"""ch22 · naive attention vs FlashAttention: the common mistakes, each with the hint that names it and the edit of
the reference that makes it (see `grader.authoring.misconceptions`)."""

from grader.authoring import mistake

# Pieces of the reference edited below: the naive scores and softmax, the byte counts, FlashAttention's scale and
# key loop, its per-tile update and its lse.
NAIVE_SCORES, NAIVE_PROBS = "scores = (q @ k.T) * d ** -0.5", "probs = scores.softmax(dim=-1)"
IO = "inputs_and_output = (2 * T * d + 2 * S * d) * dtype_bytes"
FLASH_RETURN, NAIVE_RETURN = (
    "return inputs_and_output + 4 * T                           #",
    "return inputs_and_output + 4 * T * S * dtype_bytes",
)
SCALE = "scale, offset = d ** -0.5, S - T"
K_END = "k_end = min(S, offset + q1) if causal else S"
LSE = "lse[q0:q1] = m + torch.log(l)"
ALPHA, P = "alpha = torch.exp(m - m_new)", "p = torch.exp(s - m_new[:, None])"
RESCALE = (
    "when a tile raises a row's running max from m to m_new, everything summed so far was measured against the "
    "old max: multiply {what} by α = exp(m − m_new) before adding this tile's terms"
)

MISTAKES = [
    # -- ch22.1 naive_attention ------------------------------------------------------------------------------
    mistake(
        "naive_topleft",
        "ch22.1",
        "the causal mask is aligned to the end: query i is the token at position S − T + i = {offset} + i and "
        "sees keys 0 … {offset} + i; a top-left tril (or SDPA's is_causal=True with T ≠ S) lets it see only "
        "keys 0 … i",
        ("visible = torch.arange(S) <= torch.arange(T)[:, None] + (S - T)", "visible = torch.arange(S) <= torch.arange(T)[:, None]"),
    ),
    mistake(
        "naive_no_mask",
        "ch22.1",
        "causal=True: the keys after each query's position get −inf before the softmax",
        ('scores = scores.masked_fill(~visible, float("-inf"))', "scores = scores"),
    ),
    mistake(
        "naive_mask_not_causal",
        "ch22.1",
        "causal=False: every query sees every key, apply no mask",
        ("    if causal:\n        visible = torch.arange(S)", "    if True:\n        visible = torch.arange(S)"),
    ),
    mistake(
        "unscaled",
        "ch22.1 ch22.2",
        "scale the scores by 1/√d = 1/√{d}; you did not scale them",
        (NAIVE_SCORES, "scores = q @ k.T"),
        (SCALE, "scale, offset = 1.0, S - T"),
    ),
    mistake(
        "scale_1_over_d",
        "ch22.1 ch22.2",
        "the scale is 1/√d = 1/√{d}, not 1/d",
        (NAIVE_SCORES, "scores = (q @ k.T) / d"),
        (SCALE, "scale, offset = 1 / d, S - T"),
    ),
    mistake(
        "fill_zero",
        "ch22.1",
        "a masked score is −inf, not 0: exp(0) = 1 would still give the future key weight",
        ('scores = scores.masked_fill(~visible, float("-inf"))', "scores = scores.masked_fill(~visible, 0.0)"),
    ),
    mistake(
        "softmax_dim0",
        "ch22.1",
        "softmax runs over the keys of each row (dim=-1), not over the queries (dim=0)",
        (NAIVE_PROBS, "probs = scores.softmax(dim=0)"),
    ),
    mistake(
        "no_softmax",
        "ch22.1",
        "out = probs · v: apply the softmax to the scores before multiplying by v",
        ("return probs @ v, {", "return scores.nan_to_num(neginf=0.0) @ v, {"),
    ),
    mistake(
        "unstable_softmax",
        "ch22.1",
        "inf/nan where the answer is finite: subtract each row's maximum before exp (or use torch.softmax)",
        (NAIVE_PROBS, "probs = scores.exp() / scores.exp().sum(dim=-1, keepdim=True)"),
    ),
    # -- ch22.1 attention_hbm_bytes -----------------------------------------------------------------------------
    mistake(
        "flash_counts_matrices",
        "ch22.1",
        "flash=True asks for the FlashAttention kernel: no T·S term at all",
        ("    if flash:\n        " + FLASH_RETURN, "    if False:\n        " + FLASH_RETURN),
    ),
    mistake(
        "naive_without_matrices",
        "ch22.1",
        "flash=False asks for the naive kernels, which move the [T, S] matrices",
        (NAIVE_RETURN, "return inputs_and_output + 4 * T"),
    ),
    mistake(
        "no_lse",
        "ch22.1",
        "add the log-sum-exp the kernel writes: one float32 (4 bytes) per query row, 4·T",
        (FLASH_RETURN, "return inputs_and_output  #"),
    ),
    mistake(
        "lse_dtype",
        "ch22.1",
        "the lse is float32 whatever the inputs' dtype: 4 bytes per query row, not dtype_bytes",
        (FLASH_RETURN, "return inputs_and_output + T * dtype_bytes  #"),
    ),
    mistake(
        "no_output",
        "ch22.1",
        "O is written to HBM too: 2·T·d counts reading Q and writing O",
        (IO, "inputs_and_output = (T * d + 2 * S * d) * dtype_bytes"),
    ),
    mistake(
        "one_crossing",
        "ch22.1",
        "the scores and the probabilities each cross HBM twice: written by one kernel and read back by the next, "
        "4·T·S elements in all, not 2·T·S",
        ("4 * T * S * dtype_bytes", "2 * T * S * dtype_bytes"),
    ),
    mistake(
        "three_crossings",
        "ch22.1",
        "count both round trips: the scores are written then read (2·T·S), the probabilities written then read (2·T·S)",
        ("4 * T * S * dtype_bytes", "3 * T * S * dtype_bytes"),
    ),
    mistake(
        "elements",
        "ch22.1",
        "multiply by dtype_bytes: without it you counted elements, not bytes",
        (IO, "inputs_and_output = (2 * T * d + 2 * S * d)"),
        ("4 * T * S * dtype_bytes", "4 * T * S"),
    ),
    mistake(
        "bits",
        "ch22.1",
        "count bytes, not bits",
        (FLASH_RETURN, "return 8 * (inputs_and_output + 4 * T)  #"),
        (NAIVE_RETURN, "return 8 * (" + NAIVE_RETURN[7:] + ")"),
    ),
    mistake(
        "float_bytes",
        "ch22.1",
        "multiply the Python ints directly (no /, no float(), no math.pow): a byte count is an exact int",
        (IO, "inputs_and_output = float((2 * T * d + 2 * S * d) * dtype_bytes)"),
    ),
    # -- ch22.2 flash_attention: the online softmax ---------------------------------------------------------------
    mistake(
        "acc_not_rescaled",
        "ch22.2",
        RESCALE.format(what="the accumulator acc"),
        ("acc = alpha[:, None] * acc + p @ v[k0:k1]", "acc = acc + p @ v[k0:k1]"),
    ),
    mistake("l_not_rescaled", "ch22.2", RESCALE.format(what="the running sum l"), ("l = alpha * l + p.sum(dim=1)", "l = l + p.sum(dim=1)")),
    mistake(
        "acc_and_l_not_rescaled",
        "ch22.2",
        RESCALE.format(what="both acc and l"),
        ("acc = alpha[:, None] * acc + p @ v[k0:k1]", "acc = acc + p @ v[k0:k1]"),
        ("l = alpha * l + p.sum(dim=1)", "l = l + p.sum(dim=1)"),
    ),
    mistake(
        "flash_unstable",
        "ch22.2",
        "your output has inf/nan: subtract the running max before exp, and visit each query block's key blocks "
        "from 0 upward (key 0 is visible to every query, so the first tile sets a finite m)",
        (ALPHA, "alpha = torch.ones_like(m)"),
        (P, "p = torch.exp(s)"),
        (LSE, "lse[q0:q1] = torch.log(l)"),
    ),
    # -- ch22.2 flash_attention: the tiles ----------------------------------------------------------------------
    mistake(
        "flash_topleft",
        "ch22.2",
        "the causal mask is aligned to the end: query i is at position S − T + i = {offset} + i and sees keys "
        "0 … {offset} + i, so a query block ending at query i needs keys up to {offset} + i (a top-left "
        "alignment stops at key i)",
        (SCALE, "scale, offset = d ** -0.5, 0"),
    ),
    mistake(
        "whole_tiles",
        "ch22.2",
        "tiles that cross the diagonal must mask their future keys (key j > S − T + i gets −inf); skipping whole "
        "future tiles is not enough",
        ("if causal and k1 - 1 > offset + q0:", "if False:"),
    ),
    mistake(
        "no_skip",
        "ch22.2",
        "skip the tiles entirely in the future: for the query block ending at query q_end − 1, stop the key loop "
        "at key S − T + q_end (exclusive), range(0, min(S, S − T + q_end), block_k)",
        (K_END, "k_end = S"),
    ),
    mistake(
        "flash_not_causal",
        "ch22.2",
        "causal=True: mask the keys after each query's position and skip the future tiles",
        ("    " + SCALE + "\n", "    " + SCALE + "\n    causal = False\n"),
    ),
    mistake("flash_causal_always", "ch22.2", "causal=False: every query sees every key, no tile is skipped or masked"),
    mistake(
        "floor_q_blocks",
        "ch22.2",
        "the last query block is ragged: T = {T} = {full}·{bq} + {rest}, so there are ⌈{T}/{bq}⌉ = {n} query "
        "blocks and the last holds {rest} row(s); loop with range(0, T, block_q) and end each block at "
        "min(start + block_q, T) (T // block_q = {full} blocks misses it)",
        ("enumerate(range(0, T, block_q))", "enumerate(range(0, T - block_q + 1, block_q))"),
        ("out = torch.empty(T, d, dtype=q.dtype)", "out = torch.zeros(T, d, dtype=q.dtype)"),
    ),
    mistake(
        "floor_k_blocks",
        "ch22.2",
        "the last key block is ragged: S = {S} = {full}·{bk} + {rest}, so there are ⌈{S}/{bk}⌉ = {n} key blocks "
        "and the last holds {rest} key(s); loop with range(0, S, block_k) and end each block at "
        "min(start + block_k, S)",
        (K_END, "k_end = min(S // block_k * block_k, offset + q1) if causal else S // block_k * block_k"),
    ),
    # -- ch22.2 flash_attention: the lse ----------------------------------------------------------------------------
    mistake(
        "lse_overflow",
        "ch22.2",
        "inf/nan: log Σ exp(score) computed directly overflows once a score passes ~88 in float32; keep the "
        "running max m and return lse = m + log l, where l sums exp(score − m)",
        (LSE, "lse[q0:q1] = torch.log(torch.exp(m) * l)"),
    ),
    mistake(
        "lse_without_max",
        "ch22.2",
        "lse = m + log l: your lse is log l alone, but l sums exp(score − m), measured against the running max m; add m back",
        (LSE, "lse[q0:q1] = torch.log(l)"),
    ),
    mistake("lse_max_only", "ch22.2", "lse = m + log l, not the running max m alone", (LSE, "lse[q0:q1] = m")),
    mistake(
        "lse_log2", "ch22.2", "lse is a natural logarithm (log, not log2)", (LSE, "lse[q0:q1] = m / 0.6931471805599453 + torch.log2(l)")
    ),
    # -- ch22.2 flash_attention: the trace (no edit of the reference reaches these past the checks before them) ------
    mistake("trace_unscaled_m", "ch22.2", "record m in units of the scaled scores q·k/√{d}; yours looks like the unscaled q·k"),
    mistake("trace_tile_max", "ch22.2", "m is the running max over all key blocks so far, max(m, rowmax(s)), not this tile's max alone"),
    mistake("trace_stale", "ch22.2", "append the record after the tile's update: these are the values before it"),
    # -- ch22.2 flash_attention: memory (measured by the hidden check) --------------------------------------------
    mistake(
        "full_scores",
        "ch22.2",
        "compute the scores tile by tile, q[q0:q1] @ k[k0:k1].T, instead of q @ k.T once and slicing it",
        (SCALE + "\n", SCALE + "\n    full = (q @ k.T) * scale\n"),
        ("s = (q[q0:q1] @ k[k0:k1].T) * scale", "s = full[q0:q1, k0:k1]"),
    ),
    mistake(
        "full_mask",
        "ch22.2",
        "a [T, S] causal mask is a full matrix too: compare positions inside each tile, "
        "torch.arange(k0, k1) <= torch.arange(q0, q1)[:, None] + (S − T)",
        (SCALE + "\n", SCALE + "\n    full_mask = torch.arange(S) <= torch.arange(T)[:, None] + offset\n"),
        ("visible = torch.arange(k0, k1) <= torch.arange(q0, q1)[:, None] + offset", "visible = full_mask[q0:q1, k0:k1]"),
    ),
    mistake(
        "one_tile",
        "ch22.2",
        "keep one tile at a time: compute the scores tile by tile, q[q0:q1] @ k[k0:k1].T, instead of q @ k.T once and slicing it{mask}",
    ),
]
