"""分页 KV 缓存 · paged KV cache

A paged KV cache stores every sequence's keys and values in fixed-size physical
blocks taken from one shared pool, the way an operating system pages memory. A
sequence keeps a *block table*: entry i is the physical block that holds its
logical block i, i.e. its tokens i·block_size … (i+1)·block_size − 1. The blocks
need not be contiguous or in order, so no sequence ever has to be copied when it
grows, and finished sequences return their blocks to the pool.

Inside the pool a token's place is its *slot*: the row of the flattened cache
`[num_blocks · block_size, num_kv_heads, head_dim]` that holds its K (and, in the
V cache, its V). nano-vllm (bb823b3) computes one slot per token being computed in
a step (its `slot_mapping`), writes the new K/V there before attention
(`store_kvcache`), and lets padding rows of a CUDA graph carry slot −1 so that they
write nothing.

在分页 KV 缓存中,逻辑上连续的序列由离散的物理块承载;slot = 物理块号 × block_size + 块内偏移。
"""

import torch

PAD_SLOT = -1
"""The slot of a padding row: store_kv writes nothing for it (nano-vllm's convention)."""


def slot_mapping(block_table: list[int], positions: list[int] | torch.Tensor, block_size: int) -> torch.Tensor:
    """Physical KV-cache slot of each token position. Task ch25.1.

    A token at position p lives in logical block p // block_size, at offset
    p % block_size inside it. The block table turns the logical block into a
    physical one, and the slot is that block's first row plus the offset:

        slot = block_table[p // block_size] · block_size + p % block_size

    Args:
        block_table: physical block id of each logical block of the sequence.
        positions: int positions [N] of the tokens to place (any order; a chunk
            of a long prompt need not start at 0).
        block_size: tokens per block (> 0).

    Returns:
        int64 tensor [N] of slots. (nano-vllm keeps slots as int32 on the GPU;
        the course uses int64 like every other index tensor.)

    Raises:
        ValueError: block_size ≤ 0, a negative position, or a position whose
            logical block is beyond the end of the block table.

    Example:
        >>> slot_mapping([3, 0, 4], [0, 1, 2, 3, 4], 2)
        tensor([6, 7, 0, 1, 8])
    """
    ### BEGIN SOLUTION
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    pos = torch.as_tensor(positions, dtype=torch.int64)
    if pos.numel() and int(pos.min()) < 0:
        raise ValueError(f"positions must be non-negative, got {int(pos.min())}")
    logical = pos // block_size
    if pos.numel() and int(logical.max()) >= len(block_table):
        p = int(pos[logical.argmax()])
        raise ValueError(f"position {p} is in logical block {p // block_size}, "
                         f"but the block table has only {len(block_table)} blocks")
    table = torch.as_tensor(block_table, dtype=torch.int64)
    return table[logical] * block_size + pos % block_size
    ### END SOLUTION


def store_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slots: list[int] | torch.Tensor) -> None:
    """Write each token's K and V into its slot of the paged caches, in place. Task ch25.2.

    Token i goes to block slots[i] // block_size, offset slots[i] % block_size.
    A slot of −1 (`PAD_SLOT`) marks a padding row: nothing is written for it.
    Every other cache entry is left exactly as it was.

    Args:
        k_cache: [num_blocks, block_size, num_kv_heads, head_dim], written in place.
        v_cache: same shape as k_cache, written in place.
        k: [N, num_kv_heads, head_dim] keys of the N tokens (cast to the cache dtype).
        v: [N, num_kv_heads, head_dim] values.
        slots: [N] slot of each token, or −1.

    Returns:
        None: the caches themselves are the result.

    Raises:
        ValueError: k/v not shaped [N, num_kv_heads, head_dim] like the cache, a
            slots length other than N, or a slot outside [−1, num_blocks·block_size).

    Example:
        >>> k_cache = torch.zeros(3, 2, 1, 1); v_cache = torch.zeros(3, 2, 1, 1)
        >>> k = torch.tensor([[[1.]], [[2.]]]); v = 10 * k
        >>> store_kv(k_cache, v_cache, k, v, [5, -1])
        >>> k_cache.flatten().tolist()
        [0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    """
    ### BEGIN SOLUTION
    num_blocks, block_size = k_cache.shape[:2]
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"k_cache {list(k_cache.shape)} and v_cache {list(v_cache.shape)} differ in shape")
    for name, x in (("k", k), ("v", v)):
        if x.dim() != 3 or x.shape[1:] != k_cache.shape[2:]:
            raise ValueError(f"{name} must be [N, {k_cache.shape[2]}, {k_cache.shape[3]}] "
                             f"(tokens, kv heads, head_dim) like the cache; got {list(x.shape)}")
    s = torch.as_tensor(slots, dtype=torch.int64)
    if s.shape != (k.shape[0],) or v.shape[0] != k.shape[0]:
        raise ValueError(f"need one slot per token: {k.shape[0]} keys, {v.shape[0]} values, {s.numel()} slots")
    if s.numel() and (int(s.min()) < PAD_SLOT or int(s.max()) >= num_blocks * block_size):
        raise ValueError(f"slots must lie in [-1, {num_blocks * block_size}); got {s.tolist()}")
    keep = s != PAD_SLOT
    block, offset = s[keep] // block_size, s[keep] % block_size
    k_cache[block, offset] = k[keep].to(k_cache.dtype)
    v_cache[block, offset] = v[keep].to(v_cache.dtype)
    ### END SOLUTION
