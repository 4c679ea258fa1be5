# ch16 exercises: replace each TODO with your code, then run `course check ch16`.
"""Attention 逐步拆解 · attention, step by step

One attention layer turns every token's hidden vector into a query, a key and a
value per head, lets each query weigh all the keys it may see, and returns for
each query a weighted average of the values. This chapter takes that apart with
every intermediate kept.

**Heads are a view (拆头).** The Q projection of a batch is [B, T, H·d]: each
token's row holds its H heads side by side, head h in columns h·d … (h+1)·d − 1.
Splitting the heads is `view(B, T, H, d)`, the same memory with the last
dimension cut into H pieces of width d, followed by `transpose(1, 2)` to the
[B, H, T, d] layout in which every head is a [T, d] matrix and one batched
matmul serves all heads at once. Neither step moves a number: the view changes
the shape, the transpose swaps two strides. Merging the heads (合头) undoes this
in reverse order: `transpose(1, 2)` back to [B, T, H, d], then
`reshape(B, T, H·d)`, which has to copy because the transposed memory is no
longer in row order. A bare `reshape` without the transpose keeps the numbers in
memory order and cuts them again: the shape is right, but each row of the
result mixes values of different tokens, a mistake no shape check catches.

nano-vllm (bb823b3) never leaves the token-major layout: Qwen3Attention views
q as [N, nh, hd] (a view of the fused qkv output), flash-attn reads
[tokens, heads, head_dim] directly, and the output [N, nh, hd] is flattened
from dim 1 to [N, nh·hd] for o_proj without any transpose. The [B, H, T, d]
layout is the one of `torch.nn.functional.scaled_dot_product_attention` (SDPA)
and of Hugging Face's eager attention; the course uses it here to look at the
heads one by one.

**Attention in three steps (三步).** For one head with queries q [T, d], keys
k [S, d] and values v [S, d]:

1. scores = q · kᵀ · scale, [T, S]: one dot product per (query, key) pair, a
   sum over d. The scale 1/√d keeps the spread of the scores independent of the
   head width. Qwen3-0.6B's head_dim is 128, read from its config, so its scale
   is 1/√128 ≈ 0.0884 (not 1/√(1024/16) = 1/8).
2. probs = softmax over each row, [T, S]: the masked keys get score −∞ first, so
   their probability is exactly 0, and each row sums to 1. The mask is bool
   [T, S] with True = may attend (SDPA's convention). A stable softmax subtracts
   each row's maximum before exp: exp(89) already overflows float32.
3. out = probs · v, [T, d]: for each query a weighted average of the value rows,
   a sum over the S keys.

Q and K decide the weights; V supplies the content that is averaged. Changing V
changes the output and nothing else. Real kernels (flash-attn in nano-vllm)
fuse the three steps and never materialise scores or probs (ch22); this chapter
keeps them to look at them.

注意力三步:分数 = Q·Kᵀ/√d(沿 d 求和),概率 = 每行 softmax(沿 key 归一),输出 = 概率·V(沿 key 求和);拆头是 view 加 transpose,合头要先 transpose 再 reshape。
"""

import torch


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Split the last dimension into heads and move the heads in front of the tokens. Task ch16.1.

    Token t's row of x holds its heads side by side: head h is the columns
    h·d … (h+1)·d − 1, with d = width // num_heads. The result is the view
    `x.view(B, T, H, d).transpose(1, 2)`: out[b, h, t, j] = x[b, t, h·d + j].
    No number is moved or copied; only the shape and the strides change.
    (nano-vllm keeps the token-major view [N, nh, hd] and skips the transpose.)

    Args:
        x: [B, T, H·d] tensor of any dtype, e.g. the Q projection of a batch.
        num_heads: H, a positive int that divides the last dimension.

    Returns:
        [B, H, T, d] tensor (a view of x) in x's dtype.

    Raises:
        ValueError: x is not 3-D, num_heads is not a positive int, or the last
            dimension is not divisible by num_heads.

    Example:
        >>> split_heads(torch.arange(12).view(1, 3, 4), 2)[0, 1]
        tensor([[ 2,  3],
                [ 6,  7],
                [10, 11]])
    """
    _check_split(x, num_heads)
    # TODO(ch16.1): your code here (about 2 lines)
    raise NotImplementedError("ch16.1 split_heads: not implemented yet (about 2 lines)")


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """Put the heads of every token back side by side: the inverse of split_heads. Task ch16.2.

    out[b, t, h·d + j] = x[b, h, t, j]: first `transpose(1, 2)` back to
    [B, T, H, d], so that each token's heads are next to each other, then
    `reshape(B, T, H·d)`. A reshape without the transpose would keep the memory
    order of [B, H, T, d] and fill each row with values of several tokens.
    (nano-vllm's attention output is token-major already, [N, nh, hd], and is
    flattened from dim 1 to [N, nh·hd].)

    Args:
        x: [B, H, T, d] tensor of any dtype, in any memory layout (an attention
            output is often a non-contiguous view).

    Returns:
        [B, T, H·d] tensor in x's dtype, with merge_heads(split_heads(y, H)) == y.

    Raises:
        ValueError: x is not 4-D.

    Example:
        >>> x = torch.arange(12).view(1, 3, 4)
        >>> torch.equal(merge_heads(split_heads(x, 2)), x)
        True
    """
    _check_merge(x)
    # TODO(ch16.2): your code here (about 2 lines)
    raise NotImplementedError("ch16.2 merge_heads: not implemented yet (about 2 lines)")


def attention_steps(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
                    scale: float | None = None) -> dict[str, torch.Tensor]:
    """One head of attention in three steps, every intermediate kept. Task ch16.3.

    1. scores = q · kᵀ · scale, [T, S] (a sum over d), returned before masking;
    2. probs = softmax of each row over the keys, with the keys the mask hides
       set to −∞ first, so they get probability exactly 0; the row maximum is
       subtracted before exp, so large scores cannot overflow;
    3. out = probs · v, [T, dv] (a sum over the S keys).

    The mask uses the scaled_dot_product_attention convention: True = may
    attend. A query that may attend no key has no softmax (0/0); the course
    makes that an error, where torch's SDPA quietly returns a row of zeros.
    (Real kernels never materialise scores and probs; see ch22.)

    Args:
        q: [T, d] queries of one head (floating point).
        k: [S, d] keys, same dtype and width d as q.
        v: [S, dv] values, one row per key (usually dv = d).
        mask: optional bool [T, S]; mask[i, j] = True lets query i attend key j.
            None lets every query attend every key.
        scale: multiplies the dot products; None means 1/√d with d = q.shape[-1]
            (Qwen3-0.6B: d = 128, scale = 1/√128).

    Returns:
        dict with "scores" [T, S], "probs" [T, S] and "out" [T, dv], all in q's dtype.

    Raises:
        ValueError: q, k or v not 2-D; k's width differs from q's; v's row count
            differs from k's; a mask that is not a bool [T, S] tensor; a query
            that may attend no key.

    Example:
        >>> q = torch.tensor([[1., 0.]]); k = torch.tensor([[1., 0.], [0., 1.]])
        >>> steps = attention_steps(q, k, torch.tensor([[2., 0.], [0., 2.]]), scale=1.0)
        >>> steps["scores"], steps["probs"].sum().item()
        (tensor([[1., 0.]]), 1.0)
    """
    _check_steps(q, k, v, mask)
    # TODO(ch16.3): your code here (about 14 lines)
    raise NotImplementedError("ch16.3 attention_steps: not implemented yet (about 14 lines)")


# -- provided: the input checks every task needs but none teaches (not part of the exercise) ----------------------

def _check_split(x: torch.Tensor, num_heads: int) -> None:
    """Provided: raise ValueError unless x is 3-D [B, T, H·d] and num_heads is a positive int dividing its width."""
    if x.dim() != 3:
        raise ValueError(f"x must be [B, T, H·d] (batch, tokens, heads·width); got shape {list(x.shape)}")
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads <= 0:
        raise ValueError(f"num_heads must be a positive int; got {num_heads!r}")
    if x.shape[-1] % num_heads:
        raise ValueError(f"the last dimension {x.shape[-1]} cannot be cut into {num_heads} heads of equal width")


def _check_merge(x: torch.Tensor) -> None:
    """Provided: raise ValueError unless x is 4-D [B, H, T, d]."""
    if x.dim() != 4:
        raise ValueError(f"x must be [B, H, T, d] (batch, heads, tokens, head width); got shape {list(x.shape)}")


def _check_steps(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> None:
    """Provided: raise ValueError unless q [T, d], k [S, d] and v [S, dv] are 2-D with matching widths and rows,
    and the mask, if given, is a bool [T, S] tensor."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dim() != 2:
            raise ValueError(f"{name} must be 2-D [tokens, width] (one head); got shape {list(x.shape)}")
    (T, d), S = q.shape, k.shape[0]
    if k.shape[1] != d:
        raise ValueError(f"a dot product needs q and k of the same width: q [{T}, {d}], k {list(k.shape)}")
    if v.shape[0] != S:
        raise ValueError(f"v needs one row per key: k has {S} rows, v has {v.shape[0]}")
    if mask is not None and (mask.dtype != torch.bool or list(mask.shape) != [T, S]):
        raise ValueError(f"mask must be a bool tensor [T, S] = [{T}, {S}] (True = may attend); "
                         f"got {str(mask.dtype).removeprefix('torch.')} {list(mask.shape)}")
