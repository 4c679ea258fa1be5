"""因果遮罩 · causal masks

A decoder-only language model is trained to predict token i + 1 from tokens
0 … i, so when attention runs, the query of the token at position i may read the
keys of positions 0 … i and nothing later. That rule is the *causal mask*
(因果遮罩). Written as a boolean matrix with one row per query and one column per
key, the course uses the convention of `torch.nn.functional.scaled_dot_product_attention`:
**True = may attend**. For a whole sequence of T tokens the mask is
`torch.tril(torch.ones(T, T, dtype=torch.bool))`: the upper triangle (j > i, the
future) is False, and the diagonal is True, because the output at position i is
the one that predicts token i + 1 and it must see token i itself.

With a KV cache a step no longer computes the whole sequence. After a prefix-cache
hit, or for the second chunk of a chunked prefill, the first `num_cached` tokens
already have their K and V in the cache and only `num_new` tokens are computed:
`num_new` queries meet `num_cached + num_new` keys, a non-square [L, S] mask.
Query i of the chunk is the token at absolute position num_cached + i (位置偏移,
the position offset), so it sees keys 0 … num_cached + i: the chunk's mask is the
*last* num_new rows of the full S × S causal mask, a triangle aligned to the
bottom-right corner, `torch.tril(ones(L, S), diagonal=num_cached)`. A decode step
is the case num_new = 1: one row, every key visible. Taking `torch.tril(ones(L, S))`
from the top-left corner instead gives the rows of positions 0 … L − 1: query 0
would see only key 0 and the cached prefix would be lost.

The real systems agree on the bottom-right rule but never build the mask.
nano-vllm (bb823b3) calls `flash_attn_varlen_func(..., causal=True)` with
cu_seqlens_k > cu_seqlens_q whenever a sequence has cached tokens, and since
flash-attn 2.1 `causal=True` with seqlen_q ≠ seqlen_k is aligned to the
bottom-right, so query i of a chunk starting at position `start` sees keys
0 … start + i; the kernel compares positions tile by tile instead of reading a
mask. Beware of PyTorch here: `scaled_dot_product_attention(..., is_causal=True)`
with L ≠ S aligns the triangle to the **top-left** (it is `tril(ones(L, S))`, see
`torch.nn.attention.bias.causal_upper_left`), exactly the wrong mask for a chunk
after a prefix, as flash-attn before 2.1 did. For a chunk pass an explicit mask,
or `torch.nn.attention.bias.causal_lower_right(L, S)`.

因果遮罩:第 i 个位置只能看见 0…i;带缓存的 chunk 要加上位置偏移 num_cached,遮罩对齐右下角而不是左上角。
"""

import torch


def causal_mask(num_tokens: int) -> torch.Tensor:
    """The causal mask of a whole sequence. Task ch17.1.

    Row i is the query of the token at position i, column j the key of the
    token at position j; True means the query may attend that key (the
    `scaled_dot_product_attention` convention). Query i sees keys 0 … i: the
    upper triangle (the future) is False and the diagonal is True.
    (Real attention kernels compare positions instead of materialising this
    mask; the course builds it to look at it.)

    Args:
        num_tokens: T, the length of the sequence (a non-negative int).

    Returns:
        bool tensor [T, T] with mask[i, j] = (j <= i).

    Raises:
        ValueError: num_tokens is negative or not an int (2.5, True, "3").

    Example:
        >>> causal_mask(3)
        tensor([[ True, False, False],
                [ True,  True, False],
                [ True,  True,  True]])
    """
    _check_count("num_tokens", num_tokens)
    ### BEGIN SOLUTION
    return torch.ones(num_tokens, num_tokens, dtype=torch.bool).tril()
    ### END SOLUTION


def causal_mask_with_offset(num_new: int, num_cached: int) -> torch.Tensor:
    """The causal mask of a chunk of new tokens after a cached prefix. Task ch17.2.

    The keys are the num_cached tokens already in the KV cache followed by the
    num_new tokens of this step; the queries are the new tokens only. Query i
    is the token at absolute position num_cached + i, so it may attend keys
    0 … num_cached + i (True = may attend, the `scaled_dot_product_attention`
    convention). The result is the last num_new rows of
    causal_mask(num_cached + num_new): a triangle aligned to the bottom-right
    corner, as flash-attn (≥ 2.1) aligns `causal=True` when seqlen_q < seqlen_k.
    Note that SDPA's own `is_causal=True` aligns to the top-left instead.
    (Real kernels compare positions instead of materialising this mask.)

    Args:
        num_new: L, the number of new tokens (queries) this step (int ≥ 0).
        num_cached: the number of tokens before them whose K/V are cached (int ≥ 0).

    Returns:
        bool tensor [num_new, num_cached + num_new] with
        mask[i, j] = (j <= num_cached + i).

    Raises:
        ValueError: a count is negative or not an int (2.5, True, "3").

    Example:
        >>> causal_mask_with_offset(2, 3)
        tensor([[ True,  True,  True,  True, False],
                [ True,  True,  True,  True,  True]])
    """
    _check_count("num_new", num_new)
    _check_count("num_cached", num_cached)
    ### BEGIN SOLUTION
    return torch.ones(num_new, num_cached + num_new, dtype=torch.bool).tril(diagonal=num_cached)
    ### END SOLUTION


# -- provided: the input checks every task needs but none teaches (not part of the exercise) ----------------------

def _check_count(name: str, n: int) -> None:
    """Provided: raise ValueError unless n is a number of tokens, an int ≥ 0 (not a bool, a float or a string)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"{name} is a number of tokens, a non-negative int; got {n!r}")
