# ch18 exercises: replace each TODO with your code, then run `course check ch18`.
"""分组查询注意力 · grouped-query attention

In multi-head attention (MHA) every query head has its own key and value head, so
the KV cache stores as many K/V heads as there are query heads. Grouped-query
attention (GQA, 分组查询注意力) keeps all the query heads but lets a *group* of
consecutive query heads share one K/V head: with `num_heads` query heads and
`num_kv_heads` K/V heads, each group has `num_heads // num_kv_heads` query heads,
and query head h reads K/V head h // (num_heads // num_kv_heads). Multi-query
attention (MQA) is the extreme case of a single K/V head; MHA is the other extreme,
one K/V head per query head. Qwen3-0.6B has 16 query heads and 8 K/V heads (groups
of 2) with head_dim 128, read from its config rather than derived as
hidden_size / num_heads = 64.

What the heads of a group share is K and V, not the attention weights: each query
head still computes its own scores against the shared keys, its own softmax and its
own weighted sum of the shared values. The sharing is logical. nano-vllm (bb823b3)
projects and caches only `num_kv_heads` K/V heads and hands them to flash-attn,
which maps query head h to K/V head h // (nh / nkv) inside the kernel; nothing ever
repeats K or V once per query head. Repeating them (`repeat_interleave`) gives the
same numbers but spends the memory and bandwidth that GQA exists to save.

The saving is in the KV cache: per token and layer it holds 2 · num_kv_heads ·
head_dim numbers (K and V), so at fixed layers, head_dim, tokens and dtype, 8 query
heads as MHA / GQA with 2 K/V heads / MQA need cache sizes in the ratio 8 : 2 : 1.
For Qwen3-0.6B in bf16 that is 2 · 28 · 8 · 128 · 2 = 114,688 bytes per token.

When a chunk of T new queries attends to S ≥ T keys (a prefix already in the cache
plus the chunk itself), the causal mask is aligned to the end, as in ch17: query i
sits at absolute position S − T + i and sees keys 0 … S − T + i (flash-attn ≥ 2.1,
as nano-vllm uses it).

分组查询注意力让一组相邻的查询头共享同一个 K/V 头:共享的是 K/V,不是注意力权重;分组是逻辑上的,缓存只存 num_kv_heads 个头。
"""

import torch


def kv_head_for(q_head: int, num_heads: int, num_kv_heads: int) -> int:
    """The K/V head that a query head reads under GQA. Task ch18.1.

    Query heads are split into `num_kv_heads` groups of consecutive heads, each of
    `group = num_heads // num_kv_heads` heads; every head of a group reads the same
    K/V head:

        kv_head = q_head // (num_heads // num_kv_heads)

    This is the convention of nano-vllm and flash-attn (query head h uses K/V head
    h // (nh / nkv)), and of the Hugging Face `repeat_kv`: heads 0 … group − 1 share
    K/V head 0, the next `group` heads share K/V head 1, and so on. It is not the
    interleaved q_head % num_kv_heads.

    Args:
        q_head: index of the query head, 0 ≤ q_head < num_heads.
        num_heads: number of query heads (> 0).
        num_kv_heads: number of K/V heads (> 0, divides num_heads). Equal to
            num_heads for MHA, 1 for MQA.

    Returns:
        The K/V head index as a Python int in [0, num_kv_heads).

    Raises:
        ValueError: a non-int argument, a non-positive head count, num_heads not
            divisible by num_kv_heads, or q_head outside [0, num_heads).

    Example:
        >>> [kv_head_for(h, 4, 2) for h in range(4)]
        [0, 0, 1, 1]
    """
    _check_heads(q_head, num_heads, num_kv_heads)
    # TODO(ch18.1): your code here (about 1 line)
    raise NotImplementedError("ch18.1 kv_head_for: not implemented yet (about 1 line)")


def gqa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                  scale: float | None = None) -> torch.Tensor:
    """Grouped-query attention of T queries over S keys, without copying K or V. Task ch18.2.

    Query head h attends with K/V head h // (Hq // Hkv) (the consecutive grouping of
    ch18.1): out[t, h] = softmax(scale · q[t, h] · k[:, kv]ᵀ) · v[:, kv]. With
    `causal`, the mask is aligned to the end: query t is the token at absolute
    position S − T + t and sees keys 0 … S − T + t (T == S is ordinary causal
    prefill, T == 1 a decode step that sees everything).

    Never materialise a copy of K or V per query head (`repeat_interleave`,
    `expand(...).reshape`, or a broadcasting `matmul`, which expands and copies):
    view the queries of one group as extra rows, q as [Hkv, group · T, d], and
    multiply them by that group's K and V.

    The course takes one sequence with dense K/V; nano-vllm's flash-attn call does the
    same per sequence of a packed varlen batch. Where its K/V come from depends on the
    step (`nanovllm/layers/attention.py`, bb823b3): a prefill passes the fresh k and v
    of the step when no sequence has a cached prefix, and the paged k_cache, v_cache
    with the block tables only when one has; a decode reads every key from the cache.

    Args:
        q: [T, Hq, d] queries (token-major, as engines lay them out).
        k: [S, Hkv, d] keys, S ≥ T when causal; Hkv divides Hq.
        v: [S, Hkv, d] values.
        causal: apply the end-aligned causal mask.
        scale: factor applied to q·k; defaults to 1/√d with d = q.shape[-1]
            (1/√128 for Qwen3-0.6B, never hidden_size / num_heads).

    Returns:
        [T, Hq, d] tensor in q's dtype.

    Raises:
        ValueError: tensors that are not 3-D, k and v of different shapes, head_dim
            of q and k different, Hq not divisible by Hkv, or causal with S < T.

    Example:
        >>> q = torch.randn(3, 4, 8); k = torch.randn(5, 2, 8); v = torch.randn(5, 2, 8)
        >>> gqa_attention(q, k, v).shape
        torch.Size([3, 4, 8])
    """
    _check_qkv(q, k, v, causal)
    # TODO(ch18.2): your code here (about 11 lines)
    raise NotImplementedError("ch18.2 gqa_attention: not implemented yet (about 11 lines)")


def kv_cache_bytes(num_layers: int, num_kv_heads: int, head_dim: int, num_tokens: int, dtype_bytes: int) -> int:
    """Bytes of KV cache that `num_tokens` tokens occupy across all layers. Task ch18.3.

    Every layer stores, for every token, one K and one V vector per K/V head:

        bytes = 2 · num_layers · num_kv_heads · head_dim · num_tokens · dtype_bytes

    The factor 2 is K and V. Only the K/V heads count: the number of query heads
    does not appear, which is the whole saving of GQA and MQA. nano-vllm sizes one
    cache block the same way (block_bytes = 2 · L · block_size · Hkv · d · itemsize);
    the course counts exact tokens, while nano-vllm allocates whole 256-token blocks.

    Args:
        num_layers: decoder layers (> 0), each with its own cache.
        num_kv_heads: K/V heads per layer (> 0), after any tensor-parallel split.
        head_dim: size of one head (> 0).
        num_tokens: tokens held (≥ 0).
        dtype_bytes: bytes per element (> 0): 2 for bf16/fp16, 1 for fp8, 4 for fp32.

    Returns:
        The exact byte count as a Python int (no float rounding, however large).

    Raises:
        ValueError: a non-int argument, a negative num_tokens, or any other
            argument ≤ 0.

    Example:
        >>> kv_cache_bytes(28, 8, 128, 1, 2)      # Qwen3-0.6B, bf16, one token
        114688
    """
    _check_sizes(num_layers, num_kv_heads, head_dim, num_tokens, dtype_bytes)
    # TODO(ch18.3): your code here (about 1 line)
    raise NotImplementedError("ch18.3 kv_cache_bytes: not implemented yet (about 1 line)")


# -- provided: the input checks every task needs but none teaches (not part of the exercise) ----------------------

def _check_heads(q_head: int, num_heads: int, num_kv_heads: int) -> None:
    """Provided: raise ValueError unless all three are ints, the head counts are positive, num_kv_heads divides
    num_heads and 0 ≤ q_head < num_heads."""
    for name, x in (("q_head", q_head), ("num_heads", num_heads), ("num_kv_heads", num_kv_heads)):
        if type(x) is not int:
            raise ValueError(f"{name} must be an int, got {type(x).__name__} {x!r}")
    if num_heads <= 0 or num_kv_heads <= 0:
        raise ValueError(f"head counts must be positive, got num_heads={num_heads}, num_kv_heads={num_kv_heads}")
    if num_heads % num_kv_heads:
        raise ValueError(f"GQA splits the {num_heads} query heads into num_kv_heads={num_kv_heads} groups of "
                         f"consecutive heads, so num_kv_heads must divide num_heads")
    if not 0 <= q_head < num_heads:
        raise ValueError(f"q_head {q_head} is not a query head: there are {num_heads} (0 … {num_heads - 1})")


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> None:
    """Provided: raise ValueError unless q is [T, Hq, d], k and v are [S, Hkv, d] with Hkv dividing Hq, and, with
    `causal`, S ≥ T (the T queries are the last of the S tokens)."""
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"q, k, v must be [tokens, heads, head_dim]; got {list(q.shape)}, {list(k.shape)}, "
                         f"{list(v.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k {list(k.shape)} and v {list(v.shape)} must have the same shape [S, Hkv, d]")
    (T, Hq, d), (S, Hkv, dk) = q.shape, k.shape
    if dk != d:
        raise ValueError(f"q has head_dim {d} but k has head_dim {dk}")
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"the {Hq} query heads must split into groups over {Hkv} K/V heads: "
                         f"num_kv_heads must divide num_heads")
    if causal and S < T:
        raise ValueError(f"causal attention needs S ≥ T (the {T} queries are the last of the {S} keys); "
                         f"got S={S}, T={T}")


def _check_sizes(num_layers: int, num_kv_heads: int, head_dim: int, num_tokens: int, dtype_bytes: int) -> None:
    """Provided: raise ValueError unless all five are ints, num_tokens ≥ 0 and the others > 0."""
    args = {"num_layers": num_layers, "num_kv_heads": num_kv_heads, "head_dim": head_dim,
            "num_tokens": num_tokens, "dtype_bytes": dtype_bytes}
    for name, x in args.items():
        if type(x) is not int:
            raise ValueError(f"{name} must be an int, got {type(x).__name__} {x!r}")
        if x < 0 or (x == 0 and name != "num_tokens"):
            raise ValueError(f"{name} must be {'≥ 0' if name == 'num_tokens' else '> 0'}, got {x}")
