"""ch16 · attention, step by step: the common mistakes, each with the hint that names it and the edit of the reference
that makes it (see `grader.authoring.misconceptions`)."""

from grader.authoring import mistake

CONVENTION = "True = may attend, the scaled_dot_product_attention convention"
SPLIT = "return x.view(B, T, num_heads, width // num_heads).transpose(1, 2)"
VIEW = "x.view(B, T, num_heads, width // num_heads)"
MERGE = "return x.transpose(1, 2).reshape(B, T, H * d)"
SCALE = "scale = d ** -0.5 if scale is None else scale"
SCORES = "scores = (q @ k.T) * scale"
FILL = 'hidden = scores.masked_fill(~mask, float("-inf"))'
MAX = "e = (hidden - hidden.amax(dim=-1, keepdim=True)).exp()"
NORMALISE = "probs = e / e.sum(dim=-1, keepdim=True)"
OUT = "out = probs @ v"
RETURN = 'return {"scores": scores, "probs": probs, "out": out}'

MISTAKES = [
    # -- ch16.1 split_heads (and ch16.2)
    mistake(
        "dtype_changed",
        "ch16.1 ch16.2",
        "moving numbers never converts them: keep the input's dtype",
        (SPLIT, SPLIT + ".float()"),
        (MERGE, MERGE + ".float()"),
    ),
    mistake(
        "reshape_no_transpose",
        "ch16.1",
        "a reshape to [B, H, T, d] without a transpose keeps the numbers in x's order and cuts them again, so a "
        "head's rows mix the columns of different tokens; view as [B, T, H, d] first, then transpose(1, 2)",
        (SPLIT, "return x.view(B, num_heads, T, width // num_heads)"),
    ),
    mistake(
        "interleaved_heads",
        "ch16.1",
        "head h is the contiguous block of columns h·d … (h+1)·d − 1 (nano-vllm views q as [N, nh, hd]), not "
        "every {H}-th column: view the last dimension as (H, d), not (d, H)",
        (SPLIT, "return x.view(B, T, width // num_heads, num_heads).permute(0, 3, 1, 2)"),
    ),
    mistake(
        "no_transpose",
        "ch16.1",
        "you cut the last dimension into heads ([B, T, H, d]) but did not move the heads in front of the tokens: "
        "transpose(1, 2) gives [B, H, T, d]",
        (SPLIT, f"return {VIEW}"),
    ),
    mistake(
        "wrong_axes",
        "ch16.1",
        "your result is the [B, T, H, d] view with its axes in the order {axes} (permute{p}); only the token and "
        "head axes swap: transpose(1, 2) gives [B, H, T, d]",
        (".transpose(1, 2)\n    ### END", ".transpose(2, 3)\n    ### END"),
    ),
    mistake(
        "contiguous_copy",
        "ch16.1",
        "drop the .contiguous(): the next matmul reads the strided view as it is",
        (SPLIT, SPLIT + ".contiguous()"),
    ),
    mistake("clone_copy", "ch16.1", "drop the .clone(): a view shares x's numbers, which is the point", (SPLIT, SPLIT + ".clone()")),
    mistake(
        "stack_copy",
        "ch16.1",
        "torch.stack writes every number into a new tensor; view and transpose x itself instead",
        (SPLIT, f"return torch.stack({VIEW}.unbind(2), dim=1)"),
    ),
    mistake(
        "cat_copy",
        "ch16.1",
        "torch.cat writes every number into a new tensor; view and transpose x itself instead",
        (SPLIT, f"return torch.cat([h.unsqueeze(1) for h in {VIEW}.unbind(2)], dim=1)"),
    ),
    mistake(
        "copy_into",
        "ch16.1",
        "copy_ writes every number; view and transpose x itself instead",
        (SPLIT, f"return torch.empty(B, num_heads, T, width // num_heads, dtype=x.dtype).copy_({VIEW}.transpose(1, 2))"),
    ),
    # -- ch16.2 merge_heads
    mistake(
        "unmerged",
        "ch16.2",
        "after transpose(1, 2) comes reshape(B, T, H·d): each token's heads side by side in one row",
        (MERGE, "return x.transpose(1, 2)"),
    ),
    mistake(
        "bare_reshape",
        "ch16.2",
        "a reshape without transpose(1, 2) keeps the numbers in their [B, H, T, d] order, so each row takes "
        "consecutive tokens of one head: values of different tokens in one row; transpose(1, 2) back to "
        "[B, T, H, d] first, then reshape",
        (MERGE, "return x.reshape(B, T, H * d)"),
    ),
    mistake(
        "interleaved_merge",
        "ch16.2",
        "a token's row holds head 0's d numbers, then head 1's, …: column h·d + j is x[b, h, t, j]; yours "
        "interleaves the heads ([B, T, d, H])",
        (MERGE, "return x.permute(0, 2, 3, 1).reshape(B, T, H * d)"),
    ),
    mistake(
        "merge_wrong_axes",
        "ch16.2",
        "you brought x to {axes} (permute{p}) before the reshape; only the head and token axes swap back: "
        "transpose(1, 2) gives [B, T, H, d]",
        (MERGE, "return x.transpose(1, 3).reshape(B, T, H * d)"),
    ),
    mistake(
        "view_after_transpose",
        "ch16.2",
        "after transpose(1, 2) the numbers are no longer in row order, so view() cannot cut them into rows "
        "without a copy; reshape copies once when it must (or call .contiguous() before view)",
        (MERGE, "return x.transpose(1, 2).view(B, T, H * d)"),
    ),
    # -- ch16.3 attention_steps: the intermediates and the scores
    mistake(
        "missing_steps",
        "ch16.3",
        "keep every intermediate: return {'scores': scores, 'probs': probs, 'out': out}",
        (RETURN, 'return {"out": out}'),
    ),
    mistake(
        "keys_by_queries",
        "ch16.3",
        "rows are queries and columns keys: scores = q @ k.T, [T, S] (k @ q.T would be [S, T])",
        (SCORES, "scores = (k @ q.T) * scale"),
    ),
    mistake(
        "scores_masked",
        "ch16.3",
        "return the scores before masking: the mask enters in step 2, on the way to the softmax "
        "(masked_fill(~mask, −∞) on a copy); scores are the plain scaled dot products",
        (RETURN, 'return {"scores": hidden, "probs": probs, "out": out}'),
    ),
    mistake(
        "unscaled",
        "ch16.3",
        "scale the dot products: the default scale is 1/√d = 1/√{d}; your scores are not scaled",
        (SCALE, "scale = 1.0 if scale is None else scale"),
    ),
    mistake(
        "one_over_d", "ch16.3", "the scale is 1/√d = 1/√{d} ≈ {root}, not 1/d = 1/{d}", (SCALE, "scale = 1 / d if scale is None else scale")
    ),
    mistake(
        "sqrt_keys",
        "ch16.3",
        "d is the width of q and k (q.shape[-1] = {d}), not the number of keys S = {S}",
        (SCALE, "scale = S ** -0.5 if scale is None else scale"),
    ),
    mistake(
        "sqrt_queries",
        "ch16.3",
        "d is the width of q and k (q.shape[-1] = {d}), not the number of queries T = {T}",
        (SCALE, "scale = T ** -0.5 if scale is None else scale"),
    ),
    mistake(
        "default_scale",
        "ch16.3",
        "use the scale argument ({scale}) when it is given; 1/√d is only the default",
        (SCALE, "scale = d ** -0.5"),
    ),
    # -- the probabilities
    mistake(
        "softmax_dim0",
        "ch16.3",
        "softmax runs over the keys of each query (dim=-1, along a row), so every row sums to 1; yours normalises "
        "each column (dim=0, over the queries)",
        (MAX, MAX.replace("dim=-1", "dim=0")),
        (NORMALISE, NORMALISE.replace("dim=-1", "dim=0")),
    ),
    mistake(
        "mask_after",
        "ch16.3",
        "mask before the softmax, not after: hidden keys get score −∞, so exp gives exactly 0 and the visible keys "
        "of the row still sum to 1; zeroing probabilities afterwards leaves rows that sum to less than 1",
        (FILL, "hidden = scores"),
        (NORMALISE, "probs = (e / e.sum(dim=-1, keepdim=True)).masked_fill(~mask, 0.0)"),
    ),
    mistake(
        "mask_inverted",
        "ch16.3",
        f"{CONVENTION}: hide the keys where the mask is False (masked_fill(~mask, −∞)); yours hides the keys it allows",
        ("mask = torch.ones(T, S, dtype=torch.bool)", "mask = torch.zeros(T, S, dtype=torch.bool)"),
        ("blind = (~mask.any(dim=-1)).nonzero()", "blind = mask.all(dim=-1).nonzero()"),
        (FILL, FILL.replace("~mask", "mask")),
    ),
    mistake("no_mask", "ch16.3", "apply the mask: the keys where it is False get score −∞ before the softmax", (FILL, "hidden = scores")),
    mistake(
        "raw_scores",
        "ch16.3",
        "take the softmax of the scaled scores (step 1's output), not of the raw dot products",
        (FILL, 'hidden = (q @ k.T).masked_fill(~mask, float("-inf"))'),
    ),
    mistake(
        "fill_too_small",
        "ch16.3",
        "keys the mask hides got probability: give their scores −∞ (float('-inf')) before the softmax; a finite "
        "fill such as −100 or −1e4 can still be larger than the visible scores",
        (FILL, FILL.replace('float("-inf")', "-100.0")),
    ),
    mistake(
        "finite_fill",
        "ch16.3",
        "fill the hidden scores with −∞ (float('-inf')) before the softmax: exp(−∞) is exactly 0, while a finite "
        "fill such as −100 leaves exp(−100) ≈ 3.7e−44",
        (FILL, FILL.replace('float("-inf")', "-100.0")),
    ),
    mistake(
        "unstable",
        "ch16.3",
        "your probabilities have inf/nan: exp of a large score overflows (exp(89) is already beyond float32); "
        "subtract each row's maximum before exp, as torch.softmax does",
        (MAX, "e = hidden.exp()"),
    ),
    # -- the output
    mistake("scores_at_v", "ch16.3", "out averages V with the probabilities (step 2), not with the raw scores", (OUT, "out = scores @ v")),
    mistake("probs_at_k", "ch16.3", "the content comes from V: out = probs @ v, not probs @ k", (OUT, "out = probs @ k")),
    mistake("probs_t_at_v", "ch16.3", "out[i] = Σ_j probs[i, j] · v[j], i.e. probs @ v (yours used probs.T)", (OUT, "out = probs.T @ v")),
]
