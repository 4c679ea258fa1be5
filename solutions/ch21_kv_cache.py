"""KV 缓存与 decode 步 · the KV cache and the decode step

Generating text one token at a time would be quadratic work if every step
recomputed the keys and values of the whole sequence. They never change once a
token is in place (causal attention: token i's K and V depend only on tokens
0 … i), so an engine computes them once and keeps them in a *KV cache* (KV 缓存).
Every decoder layer has its own pair of caches: layer ℓ's attention reads only
layer ℓ's K and V. In nano-vllm (bb823b3) one big tensor
`[2, num_layers, num_blocks, block_size, Hkv, head_dim]` is allocated after
warmup and each layer's attention gets its own views `kv_cache[0, ℓ]` and
`kv_cache[1, ℓ]`; nothing is shared across layers.

Before paging (ch25), a simple engine gives each sequence one contiguous buffer
per layer, `[L_max, Hkv, head_dim]`, and a length: the cache grows along the
token axis by writing the new rows after the ones already there. Hugging Face's
`StaticLayer` (transformers' static cache) works this way, one buffer of
`max_cache_len` rows per layer, written in place at `cumulative_length`; its
`DynamicLayer` concatenates instead. Prefill (预填充) appends the whole prompt at
once; every decode step (解码步) appends exactly one row.

A decode step computes one token: the token sampled by the previous step. That
token is already the last entry of `token_ids`, but its K/V is not in the cache
yet (after nano-vllm's postprocess, `num_cached_tokens = num_tokens − 1`). So the
step feeds `input_id = token_ids[-1]` at `position = len − 1`, writes its K/V at
that position's slot first, and then attends over `context_len = len` cached
entries, the new one included. With a paged cache the slot follows ch25:
`slot = block_table[(len − 1) // block_size] · block_size + (len − 1) % block_size`.

最新采样的 token 已经在 token_ids 里,但它的 K/V 还没有写进缓存:decode 步先写入它的 K/V,再读取全部 len 个条目。
"""

import torch


def append_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, length: int, k_new: torch.Tensor,
              v_new: torch.Tensor) -> int:
    """Append n new tokens' K and V after the `length` cached ones, in place. Task ch21.1.

    One layer's cache of one sequence, contiguous along the token axis (the layout
    of simple engines before paging): rows 0 … length − 1 hold the cached tokens,
    the new tokens go to rows length … length + n − 1, and every other row is left
    exactly as it was. Each decoder layer has its own pair of caches; call this
    once per layer. (nano-vllm pages its cache instead, ch25; the growth along the
    token axis is the same.)

    Args:
        k_cache: [L_max, num_kv_heads, head_dim], written in place.
        v_cache: same shape as k_cache, written in place.
        length: how many rows are already filled (0 ≤ length ≤ L_max).
        k_new: [n, num_kv_heads, head_dim] keys of the n new tokens (n may be 0).
        v_new: [n, num_kv_heads, head_dim] their values.

    Returns:
        The new length, length + n, as a Python int.

    Raises:
        ValueError: caches of different shapes or not 3-D; k_new/v_new not shaped
            [n, num_kv_heads, head_dim] like the cache or of different lengths;
            length outside [0, L_max]; length + n > L_max (the cache would overflow).

    Example:
        >>> k_cache = torch.zeros(4, 1, 2); v_cache = torch.zeros(4, 1, 2)
        >>> append_kv(k_cache, v_cache, 0, torch.ones(3, 1, 2), torch.ones(3, 1, 2))
        3
        >>> append_kv(k_cache, v_cache, 3, torch.full((1, 1, 2), 7.), torch.full((1, 1, 2), 7.))
        4
        >>> k_cache[:, 0, 0].tolist()
        [1.0, 1.0, 1.0, 7.0]
    """
    _check_append(k_cache, v_cache, length, k_new, v_new)
    ### BEGIN SOLUTION
    n = k_new.shape[0]
    k_cache[length:length + n] = k_new.to(k_cache.dtype)
    v_cache[length:length + n] = v_new.to(v_cache.dtype)
    return int(length + n)
    ### END SOLUTION


def decode_inputs(token_ids: list[int], block_table: list[int], block_size: int) -> dict:
    """The inputs of one decode step for one sequence, as nano-vllm's prepare_decode builds them. Task ch21.2.

    `token_ids` holds the whole sequence, ending with the token the previous step
    sampled; that token has no K/V in the cache yet, and this step computes it:

        input_id    = token_ids[-1]                     (the newest token)
        position    = len − 1                           (positions count from 0)
        context_len = len                               (the cache entries attention reads,
                                                         the newest one included: its K/V
                                                         is stored before attention runs)
        slot        = block_table[(len − 1) // block_size] · block_size + (len − 1) % block_size

    nano-vllm writes the slot as `block_table[-1]·bs + last_block_num_tokens − 1`;
    that is the same block because its table has exactly ceil(len / bs) entries. A
    longer table (vLLM's pre-allocated rows) needs the logical block of position
    len − 1, so use that. A table too short to reach that block is an error to raise
    (ValueError), not one to paper over with block_table[-1]: the block the newest
    token needs was never allocated (nano-vllm's may_append adds it before the step),
    and the last block of the table holds earlier tokens, whose K/V the write would
    overwrite.

    Args:
        token_ids: the sequence's tokens (prompt + generated), len ≥ 1.
        block_table: physical block of each logical block of the sequence.
        block_size: tokens per block (> 0).

    Returns:
        dict with Python ints `input_id`, `position`, `context_len` and `slot`.

    Raises:
        ValueError: empty token_ids, block_size ≤ 0, or a block table too short
            to hold position len − 1.

    Example:
        >>> decode_inputs([5, 9, 2, 8, 4, 6, 3], [7, 2], 4)
        {'input_id': 3, 'position': 6, 'context_len': 7, 'slot': 10}
    """
    _check_decode(token_ids, block_size)
    ### BEGIN SOLUTION
    n = len(token_ids)
    position = n - 1
    logical, offset = divmod(position, block_size)
    if logical >= len(block_table):
        raise ValueError(f"position {position} needs logical block {logical}; the table has only {len(block_table)}")
    return {"input_id": int(token_ids[-1]), "position": position, "context_len": n,
            "slot": int(block_table[logical]) * block_size + offset}
    ### END SOLUTION


# -- provided: the input checks every task needs but none teaches (not part of the exercise) ----------------------

def _check_append(k_cache: torch.Tensor, v_cache: torch.Tensor, length: int, k_new: torch.Tensor,
                  v_new: torch.Tensor) -> None:
    """Provided: raise ValueError unless the caches are [L_max, num_kv_heads, head_dim] alike, k_new and v_new
    are [n, num_kv_heads, head_dim] with the same n, 0 ≤ length ≤ L_max and length + n ≤ L_max."""
    if k_cache.dim() != 3 or v_cache.shape != k_cache.shape:
        raise ValueError(f"k_cache and v_cache must both be [L_max, num_kv_heads, head_dim]; "
                         f"got {list(k_cache.shape)} and {list(v_cache.shape)}")
    L_max, heads, dim = k_cache.shape
    for name, x in (("k_new", k_new), ("v_new", v_new)):
        if x.dim() != 3 or tuple(x.shape[1:]) != (heads, dim):
            raise ValueError(f"{name} must be [n, {heads}, {dim}] (tokens, kv heads, head_dim) like the cache; "
                             f"got {list(x.shape)}")
    n = k_new.shape[0]
    if v_new.shape[0] != n:
        raise ValueError(f"k_new has {n} tokens but v_new has {v_new.shape[0]}")
    if not 0 <= length <= L_max:
        raise ValueError(f"length must lie in [0, L_max = {L_max}]; got {length}")
    if length + n > L_max:
        raise ValueError(f"the cache holds L_max = {L_max} tokens: {length} cached + {n} new = {length + n} "
                         f"would overflow it")


def _check_decode(token_ids: list[int], block_size: int) -> None:
    """Provided: raise ValueError for an empty sequence or a block_size ≤ 0."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    if len(token_ids) == 0:
        raise ValueError("token_ids is empty: a decode step needs at least the token sampled last")
