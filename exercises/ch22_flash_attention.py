# ch22 exercises: replace each TODO with your code, then run `course check ch22`.
"""朴素 attention 与 FlashAttention · naive attention vs FlashAttention

Attention of T queries over S keys computes, for one head, the scores
S = Q·Kᵀ/√d (one number per query–key pair, [T, S]), the probabilities
P = softmax(S) row by row, and the output O = P·V ([T, d]). Written that way
(朴素实现, the naive implementation) each step is a separate kernel: the first
writes the whole [T, S] score matrix to the GPU's main memory (HBM), the second
reads it back and writes the [T, S] probabilities, the third reads those back.
For a 4k-token prompt that is 16.8 million numbers per head, twice, each written
once and read once. The inputs and the output are only [T, d] and [S, d]: the
intermediates dominate both the memory footprint and the traffic, and the GPU
spends its time waiting for HBM, not computing (计算受限 vs 访存受限).

FlashAttention (Dao et al., 2022; FlashAttention-2, 2023) never builds them. It
cuts Q into blocks of `block_q` rows and K/V into blocks of `block_k` rows; one
block of queries stays in fast on-chip memory (SRAM, registers) while the key
and value blocks stream past. For a tile it computes the scores of block_q
queries against block_k keys, and folds them into three running quantities per
query row (在线 softmax, the online softmax):

    m_new = max(m, rowmax(s))                 the running maximum of the scores
    α     = exp(m − m_new)                    how much the old terms shrink
    l     = α·l + rowsum(exp(s − m_new))      the running sum of exp(score − m)
    acc   = α·acc + exp(s − m_new)·V_block    the unnormalised output

Whenever a tile raises a row's maximum, everything accumulated so far was
measured against the old maximum and is rescaled by α; that is what keeps the
exponentials in range without knowing the row's true maximum in advance. After
the last key block, out = acc / l, and lse = m + log l is the log-sum-exp of the
row's scores (the kernels save it for the backward pass, and split-KV decoding
merges partial results with it). The arithmetic is unchanged (T·S·d
multiply-adds, twice: dense attention stays quadratic); what disappears is the
[T, S] matrix in HBM. Memory becomes linear in the sequence length and traffic
drops by a large factor.

Causal attention makes whole tiles unnecessary. With the mask aligned to the
end, as in ch17/ch18 (query i is the token at absolute position S − T + i and
sees keys 0 … S − T + i, as flash-attn ≥ 2.1 aligns `causal=True`), a tile whose
first key lies after the last visible key of its last query is entirely in the
future: the kernel skips it (about half the tiles of a square prefill), and only
the tiles crossing the diagonal apply a mask element by element.

nano-vllm (bb823b3) never builds a score matrix either. In
`nanovllm/layers/attention.py` each layer first stores the step's new K and V
into the paged cache (`store_kvcache`, at the slots of `slot_mapping`), then
calls flash-attn with `softmax_scale=head_dim ** -0.5, causal=True`. Where the
K/V tiles come from depends on the step. A prefill calls
`flash_attn_varlen_func`: when no sequence of the batch has a cached prefix it
passes the fresh k and v it has just computed, with `block_table=None`; only
when one has (`prepare_prefill` in `nanovllm/engine/model_runner.py` builds the
block tables when cu_seqlens_k[-1] > cu_seqlens_q[-1]) does it pass the paged
k_cache and v_cache and the block tables, so the prefix is read from the cache.
A decode calls `flash_attn_with_kvcache` with the block tables and
`cache_seqlens = context_lens`, and reads every key and value from the cache.

朴素实现把 [T, S] 的分数与概率矩阵写回 HBM 再读出;FlashAttention 分块计算、在线维护每行的最大值与指数和,从不物化整个矩阵,算术量仍是二次的。
"""

import torch


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    causal: bool = True) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Single-head attention that materialises the score and probability matrices. Task ch22.1.

    The three steps of the naive implementation, each producing a full matrix:

        scores = q · kᵀ / √d, with −inf at every masked (future) key   [T, S]
        probs  = softmax(scores) over the keys of each row              [T, S]
        out    = probs · v                                              [T, d]

    With `causal`, the mask is aligned to the end (ch17/ch18): query i is the
    token at absolute position S − T + i and sees keys 0 … S − T + i, so S ≥ T;
    masked probabilities are exactly 0. Without it, every query sees every key
    and S may be anything ≥ 1. (No engine runs this path: nano-vllm calls
    flash-attn, which never builds these matrices; the course builds them to
    look at them and to count their traffic.)

    Args:
        q: [T, d] queries of one head (a floating dtype).
        k: [S, d] keys, same dtype.
        v: [S, d] values, same dtype.
        causal: apply the end-aligned causal mask.

    Returns:
        (out, intermediates): out is [T, d] in q's dtype; intermediates is
        {"scores": [T, S], "probs": [T, S]}, the matrices a naive kernel writes
        to HBM (scaled and masked scores; their row-wise softmax).

    Raises:
        ValueError: tensors that are not 2-D, k and v of different shapes, q and
            k with different d, different or non-floating dtypes, no keys
            (S = 0), or causal with S < T.

    Example:
        >>> q = torch.tensor([[1., 0.], [0., 1.]]); k = torch.tensor([[1., 0.], [0., 1.]])
        >>> out, mid = naive_attention(q, k, torch.tensor([[1., 2.], [3., 4.]]))
        >>> mid["probs"][0].tolist()            # query 0 sees key 0 only
        [1.0, 0.0]
    """
    _check_qkv(q, k, v, causal)
    # TODO(ch22.1): your code here (about 7 of the task's 11 lines, in 2 places)
    raise NotImplementedError("ch22.1 naive_attention: not implemented yet (about 11 lines)")


def attention_hbm_bytes(T: int, S: int, d: int, dtype_bytes: int, *, flash: bool) -> int:
    """Bytes one head's attention moves between HBM and the chip, in the course's traffic model. Task ch22.1.

    The course's simplified version of the IO analysis of the FlashAttention
    paper (Dao et al. 2022, Algorithm 0 vs Algorithm 1). Every tensor crossing
    HBM is counted once per crossing, at `dtype_bytes` per element:

    naive (`flash=False`), three kernels, scaling and masking fused into them:
        1. read Q [T, d] and K [S, d], write the scores [T, S]
        2. read the scores [T, S], write the probabilities [T, S]
        3. read the probabilities [T, S] and V [S, d], write O [T, d]
        bytes = (2·T·d + 2·S·d + 4·T·S) · dtype_bytes

    FlashAttention (`flash=True`), one kernel: read Q, K and V once, write O,
    and write the log-sum-exp of every query row in float32 (4 bytes each, as
    flash-attn stores `softmax_lse`); nothing of size T·S ever reaches HBM:
        bytes = (2·T·d + 2·S·d) · dtype_bytes + 4·T

    (Simplified: the paper's analysis counts the repeated passes that an on-chip
    memory of M elements forces, one operand re-read for every block of the
    other, Θ(T·S·d²/M) accesses; the model reads each input once. Causal
    skipping is not counted in either model.)

    Args:
        T: queries (≥ 0).
        S: keys (≥ 0).
        d: head dimension (> 0).
        dtype_bytes: bytes per element of Q, K, V, O and the matrices (> 0):
            2 for bf16/fp16, 4 for fp32.
        flash: count the FlashAttention kernel instead of the naive one.

    Returns:
        The byte count as a Python int (exact, no float rounding).

    Raises:
        ValueError: a non-int size (or a non-bool `flash`), a negative T or S,
            or d or dtype_bytes ≤ 0.

    Example:
        >>> attention_hbm_bytes(4096, 4096, 128, 2, flash=False)   # S and P dominate
        138412032
        >>> attention_hbm_bytes(4096, 4096, 128, 2, flash=True)
        4210688
    """
    _check_traffic(T, S, d, dtype_bytes, flash)
    # TODO(ch22.1): your code here (about 4 of the task's 11 lines, in 2 places)
    raise NotImplementedError("ch22.1 attention_hbm_bytes: not implemented yet (about 11 lines)")


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True, block_q: int = 64,
                    block_k: int = 64, trace: list | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Tiled single-head attention with an online softmax, never building a [T, S] matrix. Task ch22.2.

    Queries are cut into blocks of `block_q` rows (query block qb holds rows
    qb·block_q … min((qb+1)·block_q, T) − 1) and keys/values into blocks of
    `block_k` rows; the last block of either may be shorter (ragged). For each
    query block, its key blocks are visited in increasing order, keeping per
    query row a running max m (start −inf), a running sum l (start 0) and an
    accumulator acc [rows, d] (start 0). For a tile with scores
    s = q_blk · k_blkᵀ / √d (masked keys −inf):

        m_new = max(m, rowmax(s));  α = exp(m − m_new)
        l = α·l + rowsum(exp(s − m_new));  acc = α·acc + exp(s − m_new) · v_blk;  m = m_new

    and after the block's last tile out = acc / l, lse = m + log l.

    With `causal`, the mask is aligned to the end (ch17/ch18): query i is at
    position S − T + i and sees keys 0 … S − T + i, so S ≥ T. A tile whose
    first key is after the last visible key of its last row lies entirely in
    the future and must be skipped (not visited, not recorded); tiles crossing
    the diagonal mask their future keys. No tensor with T·S elements (or more)
    may be created: the largest intermediates are a tile and the accumulators.

    The trace: when `trace` is a list, append one dict per visited tile, in
    visiting order, right after the tile's update:
    {"qb": query block index, "kb": key block index, "m": [running max of each
    row of the block], "l": [running sum of each row]} (Python ints and lists
    of floats, one float per row of the query block). The order of the query
    blocks is free (FlashAttention-2 puts them in the outer loop, as here); the
    key blocks of one query block come in increasing order.

    The course runs one head in Python loops in the inputs' dtype; real
    kernels give each query block to a thread block, keep its tiles in SRAM and
    registers, and accumulate m, l and acc in fp32.

    Args:
        q: [T, d] queries of one head (a floating dtype).
        k: [S, d] keys, same dtype.
        v: [S, d] values, same dtype.
        causal: apply the end-aligned causal mask and skip future tiles.
        block_q: rows per query block (int > 0).
        block_k: rows per key/value block (int > 0).
        trace: None, or a list the visited tiles are appended to.

    Returns:
        (out, lse): out [T, d] in q's dtype, equal to naive_attention's; lse [T]
        in q's dtype, lse[i] = log Σ_j exp(score[i, j]) over the visible keys,
        with score = q·k/√d.

    Raises:
        ValueError: tensors that are not 2-D, k and v of different shapes, q and
            k with different d, different or non-floating dtypes, no keys
            (S = 0), causal with S < T, or a block size that is not an int > 0.

    Example:
        >>> q, k, v = torch.randn(5, 4), torch.randn(7, 4), torch.randn(7, 4)
        >>> tiles = []
        >>> out, lse = flash_attention(q, k, v, block_q=2, block_k=3, trace=tiles)
        >>> [(t["qb"], t["kb"]) for t in tiles]      # (0, 2) and (1, 2) lie in the future
        [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1), (2, 2)]
    """
    _check_qkv(q, k, v, causal)
    _check_blocks(block_q, block_k)
    # TODO(ch22.2): your code here (about 28 lines)
    raise NotImplementedError("ch22.2 flash_attention: not implemented yet (about 28 lines)")


# -- provided: the input checks every task needs but none teaches (not part of the exercise) ----------------------

def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> None:
    """Provided: raise ValueError unless q is [T, d], k and v are [S, d], all of one floating dtype, S ≥ 1, and,
    with `causal`, S ≥ T (the T queries are the last of the S tokens)."""
    if q.dim() != 2 or k.dim() != 2 or v.dim() != 2:
        raise ValueError(f"q, k, v are one head's [tokens, d] matrices; got {list(q.shape)}, {list(k.shape)}, "
                         f"{list(v.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k {list(k.shape)} and v {list(v.shape)} must have the same shape [S, d]")
    (T, d), S = q.shape, k.shape[0]
    if k.shape[1] != d:
        raise ValueError(f"q has d={d} but k has d={k.shape[1]}")
    if not q.is_floating_point() or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share one floating dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if S == 0:
        raise ValueError("attention needs at least one key (S = 0)")
    if causal and S < T:
        raise ValueError(f"causal attention needs S ≥ T (the {T} queries are the last of the {S} keys); "
                         f"got S={S}, T={T}")


def _check_blocks(block_q: int, block_k: int) -> None:
    """Provided: raise ValueError unless both block sizes are ints > 0."""
    for name, b in (("block_q", block_q), ("block_k", block_k)):
        if type(b) is not int or b <= 0:
            raise ValueError(f"{name} must be a positive int, got {b!r}")


def _check_traffic(T: int, S: int, d: int, dtype_bytes: int, flash: bool) -> None:
    """Provided: raise ValueError unless T, S ≥ 0 and d, dtype_bytes > 0 are ints and `flash` is a bool."""
    for name, x in (("T", T), ("S", S), ("d", d), ("dtype_bytes", dtype_bytes)):
        if type(x) is not int:
            raise ValueError(f"{name} must be an int, got {type(x).__name__} {x!r}")
        if x < 0 or (x == 0 and name in ("d", "dtype_bytes")):
            raise ValueError(f"{name} must be {'≥ 0' if name in ('T', 'S') else '> 0'}, got {x}")
    if type(flash) is not bool:
        raise ValueError(f"flash must be True or False, got {flash!r}")
