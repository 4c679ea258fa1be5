"""旋转位置编码 · rotary position embedding

Attention compares every query with every key by a dot product, and a dot
product knows nothing about where the two tokens stand. Rotary position
embedding (RoPE, 旋转位置编码) puts the position into Q and K themselves: the
head_dim = d channels of a head are taken as d/2 two-dimensional pairs, and at
position p pair j is rotated by the angle p·θ_j, with one frequency per pair,

    θ_j = 1 / base^(2j/d),   j = 0 … d/2 − 1.

Pair 0 turns by one radian per position; the last pair barely moves over
thousands of positions. Since a rotation by p·θ followed by the transpose of a
rotation by p′·θ is a rotation by (p − p′)·θ, the score q·k of a query at p and a
key at p′ depends on the positions only through the difference p − p′: shift the
whole sequence and no score changes. A rotation also keeps every vector's length.

Which channels form a pair is a layout convention, and it must match the weights
the model was trained with. Qwen3, Llama and nano-vllm use the **half-split
("NeoX", rotate_half) layout**: pair j is (x[j], x[j + d/2]), so with
x1 = x[..., :d/2] and x2 = x[..., d/2:]

    y1 = x1·cos − x2·sin,   y2 = x2·cos + x1·sin.

The interleaved ("GPT-J") layout pairs (x[2j], x[2j + 1]) instead; it is an
equally good rotation, but applied to Qwen3's weights it scrambles the model.

nano-vllm (bb823b3) builds the table once: inv_freq in float32, angles
p·inv_freq for every position up to max_position (40960 for Qwen3-0.6B, base =
rope_theta = 1,000,000), cached as one float32 buffer [max_position, 1, d] laid
out as [cos | sin]. Each step gathers the rows of the step's positions and rotates
Q and K in float32, casting back to the model dtype. In Qwen3Attention the order
is: qkv projection, split into q | k | v, per-head RMSNorm of q and k (`q_norm`,
`k_norm`: over head_dim, one weight [d] shared by all heads), then RoPE on q and
k. V is neither normalised nor rotated: positions steer *which* keys a query
attends to; the values carry the content that is mixed. The rotated k is what
the KV cache stores, so a later step attends to cached keys as they are, and its
own tokens stand at positions after the cached ones (task ch19.4).

旋转位置编码:把 head 的 d 个通道看成 d/2 个二维对子,第 j 对在位置 p 旋转 p·θ_j;
nano-vllm 用半分(NeoX)布局,先对 q/k 做逐头 RMSNorm 再旋转,V 不旋转;缓存里存的是旋转后的 k。
"""

import torch


def rope_cos_sin(positions: list[int] | torch.Tensor, head_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotation angles of each position, one per pair. Task ch19.1.

    Pair j of a head (j = 0 … d/2 − 1) turns with frequency
    inv_freq[j] = 1 / base^(2j/d); at position p its angle is p·inv_freq[j].
    Compute inv_freq and the angles in float32 as nano-vllm does
    (`1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float) / d)`), then take
    cos and sin. (nano-vllm precomputes these rows for every position up to
    max_position and keeps them as one [max_position, 1, d] cache laid out as
    [cos | sin]; the course computes the rows of the positions asked for.)

    Args:
        positions: int positions [N] (0-based, non-negative), a list or an
            integer tensor.
        head_dim: d, the width of one head (positive and even).
        base: the RoPE base θ (`rope_theta`: 1,000,000 for Qwen3, 10,000 in
            the original paper), > 0.

    Returns:
        (cos, sin), each a float32 tensor [N, d/2]: cos[n, j] = cos(p_n·inv_freq[j]).

    Raises:
        ValueError: head_dim odd or not positive (RoPE rotates pairs), base ≤ 0,
            positions not a 1-D list/tensor of non-negative integers.

    Example:
        >>> cos, sin = rope_cos_sin([0, 1], 4, 10000.0)    # inv_freq = [1, 0.01]
        >>> cos
        tensor([[1.0000, 1.0000],
                [0.5403, 0.9999]])
        >>> sin
        tensor([[0.0000, 0.0000],
                [0.8415, 0.0100]])
    """
    _check_cos_sin(positions, head_dim, base)
    ### BEGIN SOLUTION
    pos = torch.as_tensor(positions).to(torch.int64)               # [N]; a list or a tensor
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    angles = pos.to(torch.float)[:, None] * inv_freq                # [N, d/2], float32
    return angles.cos(), angles.sin()
    ### END SOLUTION


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate every head of every token by its position's angles (half-split layout). Task ch19.2.

    Pair j of a head is (x[j], x[j + d/2]), the NeoX / Hugging Face "rotate_half"
    layout that nano-vllm and Qwen3 use, not the interleaved (x[2j], x[2j + 1]).
    With x1 = x[..., :d/2] and x2 = x[..., d/2:], in float32:

        y1 = x1·cos − x2·sin,   y2 = x2·cos + x1·sin,   y = concat(y1, y2)

    cos and sin of token n broadcast over its heads. The result is cast back to
    x's dtype. x is not modified.

    Args:
        x: [N, H, d] queries or keys (any float dtype; bf16 in nano-vllm).
        cos: [N, d/2] cos of each token's angles (from `rope_cos_sin`).
        sin: [N, d/2] sin of the same angles.

    Returns:
        [N, H, d] tensor in x's dtype.

    Raises:
        ValueError: x not 3-D or with an odd head_dim; cos or sin not [N, d/2]
            (e.g. the full-width [N, d] tables of Hugging Face).

    Example:
        >>> cos, sin = rope_cos_sin([1], 4, 10000.0)
        >>> apply_rope(torch.tensor([[[1., 2., 3., 4.]]]), cos, sin)
        tensor([[[-1.9841,  1.9599,  2.4624,  4.0198]]])
    """
    _check_rope(x, cos, sin)
    ### BEGIN SOLUTION
    c, s = cos.float()[:, None, :], sin.float()[:, None, :]        # broadcast over heads
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(x.dtype)
    ### END SOLUTION


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, q_norm_weight: torch.Tensor, k_norm_weight: torch.Tensor,
                 positions: list[int] | torch.Tensor, base: float,
                 eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3's q/k path: per-head RMSNorm, then RoPE; V is not touched. Task ch19.3.

    The order of nano-vllm's Qwen3Attention.forward:

    1. per-head RMSNorm of q and of k, over head_dim (every head separately,
       one weight [d] shared by all heads): in float32,
       x·rsqrt(mean(x²) + eps), cast back to the input dtype, then times the
       weight;
    2. RoPE (`rope_cos_sin` and `apply_rope`) of the normalised q and k at the
       tokens' positions.

    Normalising after the rotation is not the same: the weight scales channel j
    and channel j + d/2 differently, so it must act before they are mixed.
    V takes neither step, so it is not an argument here (task ch19.4 adds V and
    the attention). Inputs are not modified.

    Args:
        q: [N, Hq, d] queries of N tokens (after the projection, split into heads).
        k: [N, Hkv, d] keys, same N, d and dtype as q.
        q_norm_weight: [d] weight of q_norm.
        k_norm_weight: [d] weight of k_norm.
        positions: [N] int positions of the tokens.
        base: RoPE base (rope_theta).
        eps: RMSNorm epsilon (Qwen3: 1e-6).

    Returns:
        (q, k): new tensors of the input shapes and dtype.

    Raises:
        ValueError: q or k not 3-D, different N, d or dtype; an odd d; a weight
            that is not [d]; positions not [N].

    Example:
        >>> q, k = torch.tensor([[[1., 2., 3., 4.]]]), torch.tensor([[[2., 0., 0., 0.]]])
        >>> q2, k2 = qk_norm_rope(q, k, torch.ones(4), torch.ones(4), [1], 10000.0)
        >>> q2.round(decimals=4)          # [1, 2, 3, 4] / rms 2.7386, then rotated to position 1
        tensor([[[-0.7245,  0.7157,  0.8991,  1.4678]]])
    """
    _check_qk(q, k, q_norm_weight, k_norm_weight, positions)
    ### BEGIN SOLUTION
    d = q.shape[-1]

    def head_rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)   # over head_dim, per head
        return (normed.to(x.dtype) * weight).to(x.dtype)

    cos, sin = rope_cos_sin(positions, d, base)
    return (apply_rope(head_rms_norm(q, q_norm_weight), cos, sin),
            apply_rope(head_rms_norm(k, k_norm_weight), cos, sin))
    ### END SOLUTION


def rope_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_norm_weight: torch.Tensor,
                   k_norm_weight: torch.Tensor, base: float, eps: float = 1e-6, k_cache: torch.Tensor | None = None,
                   v_cache: torch.Tensor | None = None) -> torch.Tensor:
    """One sequence's attention step as in Qwen3Attention: RoPE turns q and k, never v. Task ch19.4.

    The N new tokens follow the C tokens whose keys and values are already in the
    cache, so they stand at positions C … C + N − 1 (nano-vllm's prepare_prefill
    takes range(num_cached_tokens, …); a decode step, N = 1, is at len − 1 = C).
    In the order of Qwen3Attention.forward (nanovllm/models/qwen3.py, bb823b3):

    1. q, k = `qk_norm_rope(q, k, …)` at those positions (task ch19.3);
    2. the keys and values attended over are the cache's, then the new ones. The
       cache holds keys as they were stored: already normalised and rotated at
       their own positions (nano-vllm's Attention stores the rotated k,
       nanovllm/layers/attention.py), so they are used as they are;
    3. causal grouped-query attention in float32: query i (position C + i) sees
       keys 0 … C + i, query head h reads K/V head h // (Hq / Hkv), the scores
       q·k are scaled by 1/√d (Qwen3's head_dim ** -0.5), softmax, times V.

    V, new or cached, is neither normalised nor rotated: positions decide *how
    much* each key counts; the values are the content that gets mixed. Inputs
    are not modified. (The course takes one sequence and a contiguous cache;
    nano-vllm runs a flattened batch over a paged cache.)

    Args:
        q: [N, Hq, d] queries of the N new tokens (projected, split into heads,
            not yet normalised).
        k: [N, Hkv, d] their keys, likewise.
        v: [N, Hkv, d] their values.
        q_norm_weight: [d] weight of q_norm.
        k_norm_weight: [d] weight of k_norm.
        base: RoPE base (rope_theta).
        eps: RMSNorm epsilon (Qwen3: 1e-6).
        k_cache: [C, Hkv, d] keys of the C earlier tokens, normalised and rotated
            (None: no earlier tokens, C = 0).
        v_cache: [C, Hkv, d] their values (given with k_cache).

    Returns:
        [N, Hq, d], the attention output before o_proj, in q's dtype.

    Raises:
        ValueError: q, k, v not 3-D or not of one N, d and dtype; k and v of
            other shapes; Hq not a multiple of Hkv; one cache without the
            other, or a cache not [C, Hkv, d] in k's dtype.

    Example:
        >>> q, k = torch.tensor([[[1., 2., 3., 4.]]]), torch.tensor([[[2., 0., 0., 0.]]])
        >>> v = torch.tensor([[[0.5, -1., 2., 1.]]])
        >>> rope_attention(q, k, v, torch.ones(4), torch.ones(4), 10000.0)   # one token sees only itself
        tensor([[[ 0.5000, -1.0000,  2.0000,  1.0000]]])
        >>> out = rope_attention(q, k, v, torch.ones(4), torch.ones(4), 10000.0,    # now at position 1
        ...                      k_cache=torch.tensor([[[0., 0., 2., 0.]]]), v_cache=torch.zeros(1, 1, 4))
        >>> out.round(decimals=4)          # weights 0.6304 on the cached zero value, 0.3696 on v
        tensor([[[ 0.1848, -0.3696,  0.7392,  0.3696]]])
    """
    _check_attention(q, k, v, k_cache, v_cache)
    ### BEGIN SOLUTION
    n, num_heads, d = q.shape
    c = 0 if k_cache is None else k_cache.shape[0]
    positions = torch.arange(c, c + n)                               # after the C cached tokens
    q, k = qk_norm_rope(q, k, q_norm_weight, k_norm_weight, positions, base, eps)
    if k_cache is not None and v_cache is not None:                  # cached keys are rotated already
        k, v = torch.cat((k_cache, k)), torch.cat((v_cache, v))
    group = num_heads // k.shape[1]
    keys = k.float().repeat_interleave(group, dim=1)                 # [C + N, Hq, d]
    values = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,shd->hns", q.float(), keys) * d ** -0.5
    visible = torch.ones(n, c + n, dtype=torch.bool).tril(diagonal=c)    # query i sees keys 0 … C + i
    probs = scores.masked_fill(~visible, float("-inf")).softmax(dim=-1)
    return torch.einsum("hns,shd->nhd", probs, values).to(q.dtype)
    ### END SOLUTION


# -- provided: the input checks every task needs but none teaches (not part of the exercise) ----------------------

def _check_cos_sin(positions: list[int] | torch.Tensor, head_dim: int, base: float) -> None:
    """Provided: raise ValueError for a head_dim that is not a positive even int, a base ≤ 0, or positions that
    are not a 1-D list/tensor of non-negative integers."""
    if type(head_dim) is not int or head_dim <= 0 or head_dim % 2:
        raise ValueError(f"head_dim must be a positive even int (RoPE rotates head_dim / 2 pairs of channels); "
                         f"got {head_dim!r}")
    if not base > 0:
        raise ValueError(f"the RoPE base must be positive, got {base!r}")
    if isinstance(positions, (list, tuple)):
        if not all(type(p) is int for p in positions):
            raise ValueError(f"positions must be integers; got {list(positions)[:8]}")
        pos = torch.tensor(positions, dtype=torch.int64).reshape(len(positions))
    else:
        pos = positions
    if pos.dim() != 1 or pos.is_floating_point() or pos.dtype == torch.bool or pos.is_complex():
        raise ValueError(f"positions must be a 1-D list or tensor of integer positions; got "
                         f"{str(pos.dtype).removeprefix('torch.')} {list(pos.shape)}")
    if pos.numel() and int(pos.min()) < 0:
        raise ValueError(f"positions are 0-based and non-negative; got {int(pos.min())}")


def _check_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Provided: raise ValueError unless x is [N, H, d] with an even d and cos, sin are [N, d/2]."""
    if x.dim() != 3:
        raise ValueError(f"x must be [tokens, heads, head_dim]; got {list(x.shape)}")
    n, _, d = x.shape
    if d % 2:
        raise ValueError(f"head_dim must be even (RoPE rotates pairs (x[j], x[j + d/2])); got {d}")
    for name, t in (("cos", cos), ("sin", sin)):
        if list(t.shape) != [n, d // 2]:
            raise ValueError(f"{name} must be [N, d/2] = [{n}, {d // 2}] (one angle per token and pair); "
                             f"got {list(t.shape)}")


def _check_qk(q: torch.Tensor, k: torch.Tensor, q_norm_weight: torch.Tensor, k_norm_weight: torch.Tensor,
              positions: list[int] | torch.Tensor) -> None:
    """Provided: raise ValueError unless q [N, Hq, d] and k [N, Hkv, d] share N, an even d and the dtype, both
    weights are [d] and there are N positions."""
    if q.dim() != 3 or k.dim() != 3:
        raise ValueError(f"q and k must be [tokens, heads, head_dim]; got {list(q.shape)} and {list(k.shape)}")
    if q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2] or q.dtype != k.dtype:
        raise ValueError(f"q {list(q.shape)} {q.dtype} and k {list(k.shape)} {k.dtype} must share "
                         f"the number of tokens, head_dim and dtype")
    n, _, d = q.shape
    if d % 2:
        raise ValueError(f"head_dim must be even (RoPE rotates pairs (x[j], x[j + d/2])); got {d}")
    for name, w in (("q_norm_weight", q_norm_weight), ("k_norm_weight", k_norm_weight)):
        if list(w.shape) != [d]:
            raise ValueError(f"{name} must be [head_dim] = [{d}] (one weight shared by all heads); "
                             f"got {list(w.shape)}")
    if list(torch.as_tensor(positions).shape) != [n]:
        raise ValueError(f"positions must be [N] = [{n}], one per token; got {list(torch.as_tensor(positions).shape)}")


def _check_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor | None,
                     v_cache: torch.Tensor | None) -> None:
    """Provided: raise ValueError unless q [N, Hq, d], k and v [N, Hkv, d] share N, d and the dtype, Hkv divides
    Hq, and the caches are both None or both [C, Hkv, d] in k's dtype."""
    if q.dim() != 3 or k.dim() != 3 or v.shape != k.shape:
        raise ValueError(f"q must be [N, Hq, d] and k, v both [N, Hkv, d]; got {list(q.shape)}, {list(k.shape)} "
                         f"and {list(v.shape)}")
    if q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2] or not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"q {list(q.shape)} {q.dtype}, k and v {list(k.shape)} {k.dtype}, {v.dtype} must share "
                         f"the number of tokens, head_dim and dtype")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"{q.shape[1]} query heads cannot be grouped over {k.shape[1]} K/V heads")
    if (k_cache is None) != (v_cache is None):
        raise ValueError("give k_cache and v_cache together (or neither, for no earlier tokens)")
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if cache is not None and (cache.dim() != 3 or cache.shape[1:] != k.shape[1:] or cache.dtype != k.dtype):
            raise ValueError(f"{name} must be [C, {k.shape[1]}, {k.shape[2]}] in {k.dtype} like k; got "
                             f"{list(cache.shape)} {cache.dtype}")
    if k_cache is not None and v_cache is not None and k_cache.shape[0] != v_cache.shape[0]:
        raise ValueError(f"k_cache holds {k_cache.shape[0]} tokens but v_cache {v_cache.shape[0]}")
