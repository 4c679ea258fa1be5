# ch26 exercises: replace each TODO with your code, then run `course check ch26`.
"""压平的批与 graph replay · flattened batches and graph replay

A prefill batch holds prompts of different lengths. Padding them to one length
`[B, T_max, H]` wastes compute on padding tokens and needs masks to keep them out
of attention. Engines flatten (压平) the batch instead: the tokens of all
sequences are concatenated into one `[N, H]` tensor, N = Σ lengths, and the
boundaries are kept apart in `cu_seqlens` (cumulative sequence lengths, int32
`[B + 1]`, starting at 0): sequence b owns rows `cu_seqlens[b] … cu_seqlens[b+1] − 1`.
Every token-wise layer (linears, norms, MLP) runs on `[N, H]` as if it were one
long sequence; only attention needs the boundaries.

nano-vllm (bb823b3) calls flash-attn's `flash_attn_varlen_func` with
`cu_seqlens_q`, `cu_seqlens_k`, `max_seqlen_q` and `max_seqlen_k`. Without any
cached prefix, a sequence's keys are its queries and the two agree. After a
prefix-cache hit (ch25) or for a continuing chunk of a chunked prefill, the
queries are only the new tokens, while the keys are the cached ones plus the new
ones: seqlen_k = cached + seqlen_q. When any sequence has more keys than queries
(`cu_seqlens_k[-1] > cu_seqlens_q[-1]`) nano-vllm passes the block tables and
flash-attn reads all K/V from the paged cache, where this step's new K/V were
stored first.

Decode steps have one token per sequence and tiny kernels, so launch overhead
dominates: nano-vllm captures CUDA graphs for batch sizes
`[1, 2, 4, 8, 16, 32, 48, …, 512]` and replays them. A graph replays the exact
kernels it recorded, on the same addresses and shapes, so its inputs live in
pre-allocated buffers (`input_ids`, `positions`, `slot_mapping`, `context_lens`,
`block_tables`): a batch of bs sequences picks the smallest captured size ≥ bs,
copies its values into the first bs rows, and the remaining rows are padding
that must do no harm: slot −1 (the cache write skips it) and context_len 0
(attention reads nothing). Prefill, and any batch above the largest graph, runs
eagerly.

压平不是抹掉边界:cu_seqlens 记住每条序列从哪里开始;graph replay 只改变缓冲区里的值与有效长度,形状与地址是合约。
"""

import torch


def pack_varlen(padded: torch.Tensor, lengths: list[int] | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Flatten a padded batch into packed rows plus cu_seqlens. Task ch26.1.

    Row t of sequence b (t < lengths[b]) becomes row cu_seqlens[b] + t of the
    packed tensor; padding positions (t ≥ lengths[b]) are dropped.

        cu_seqlens = [0, l0, l0 + l1, …, Σ l]     (int32, B + 1 entries)

    Args:
        padded: [B, T_max, H], sequence b's tokens in rows 0 … lengths[b] − 1.
        lengths: [B] ints, 0 ≤ lengths[b] ≤ T_max.

    Returns:
        (packed [N, H] with padded's dtype, N = Σ lengths;
         cu_seqlens int32 [B + 1], as flash-attn and nano-vllm take them).

    Raises:
        ValueError: padded not 3-D, a number of lengths other than B, or a
            length outside [0, T_max].

    Example:
        >>> padded = torch.arange(12.).reshape(2, 3, 2)
        >>> packed, cu = pack_varlen(padded, [3, 1])
        >>> packed.tolist(), cu.tolist()
        ([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0]], [0, 3, 4])
    """
    # TODO(ch26.1): your code here (about 12 of the task's 28 lines, in 2 places)
    raise NotImplementedError("ch26.1 pack_varlen: not implemented yet (about 28 lines)")


def unpack_varlen(packed: torch.Tensor, cu_seqlens: list[int] | torch.Tensor, T_max: int) -> torch.Tensor:
    """Scatter packed rows back into a zero-padded batch. Task ch26.1.

    Sequence b is rows cu_seqlens[b] … cu_seqlens[b+1] − 1 of `packed`; they
    become rows 0 … of padded[b], and every padding position is 0.

    Args:
        packed: [N, H].
        cu_seqlens: [B + 1] ints, starting at 0, non-decreasing, ending at N.
        T_max: rows per sequence in the result (≥ every sequence's length).

    Returns:
        [B, T_max, H] with packed's dtype, zeros at padding positions.

    Raises:
        ValueError: packed not 2-D; cu_seqlens empty, not starting at 0,
            decreasing, or not ending at N; a sequence longer than T_max.

    Example:
        >>> unpack_varlen(torch.tensor([[1.], [2.], [3.]]), [0, 2, 3], 2)[:, :, 0].tolist()
        [[1.0, 2.0], [3.0, 0.0]]
    """
    # TODO(ch26.1): your code here (about 16 of the task's 28 lines, in 2 places)
    raise NotImplementedError("ch26.1 unpack_varlen: not implemented yet (about 28 lines)")


def varlen_metadata(query_lens: list[int], cached_lens: list[int]) -> dict:
    """The cu_seqlens and max lengths flash_attn_varlen_func needs for one prefill batch. Task ch26.2.

    Sequence b computes query_lens[b] new tokens after cached_lens[b] cached ones
    (a prefix-cache hit or earlier chunks), so its queries are the new tokens and
    its keys are all of its tokens so far:

        seqlen_q[b] = query_lens[b]
        seqlen_k[b] = cached_lens[b] + query_lens[b]
        cu_seqlens_q = [0, running sums of seqlen_q]    cu_seqlens_k likewise

    Args:
        query_lens: [B] new tokens per sequence (≥ 0).
        cached_lens: [B] tokens already in the KV cache per sequence (≥ 0).

    Returns:
        dict with `cu_seqlens_q`, `cu_seqlens_k` (int32 tensors [B + 1]) and
        `max_seqlen_q`, `max_seqlen_k` (Python ints; 0 for an empty batch).

    Raises:
        ValueError: lists of different lengths, or a negative length.

    Example:
        >>> m = varlen_metadata([300, 88], [0, 512])      # nano-vllm's worked example
        >>> m["cu_seqlens_q"].tolist(), m["cu_seqlens_k"].tolist(), m["max_seqlen_q"], m["max_seqlen_k"]
        ([0, 300, 388], [0, 300, 900], 300, 600)
    """
    # TODO(ch26.2): your code here (about 11 lines)
    raise NotImplementedError("ch26.2 varlen_metadata: not implemented yet (about 11 lines)")


def graph_batch_size(batch_size: int, captured_sizes: list[int]) -> int:
    """The captured CUDA graph a decode batch replays: the smallest captured size ≥ batch_size. Task ch26.3.

    nano-vllm captures graphs for [1, 2, 4, 8, 16, 32, 48, …, 512]; a batch of 37
    replays the graph of 48 (11 padding rows), a batch of 5 the graph of 8.
    Rounding down would drop sequences; there is no graph for more rows than the
    largest captured size.

    Args:
        batch_size: sequences in the decode batch (≥ 1).
        captured_sizes: the batch sizes graphs were captured for (any order).

    Returns:
        The chosen size, a Python int.

    Raises:
        ValueError: batch_size < 1, or no captured size ≥ batch_size (the batch
            must run eagerly, or larger graphs must be captured).

    Example:
        >>> graph_batch_size(5, [1, 2, 4, 8, 16])
        8
    """
    # TODO(ch26.3): your code here (about 8 of the task's 26 lines, in 2 places)
    raise NotImplementedError("ch26.3 graph_batch_size: not implemented yet (about 26 lines)")


def pad_decode_batch(slots: list[int] | torch.Tensor, context_lens: list[int] | torch.Tensor,
                     block_tables: list[list[int]], graph_bs: int) -> dict:
    """Fill a graph's input buffers for a decode batch, with harmless padding rows. Task ch26.3.

    Rows 0 … bs − 1 carry the batch's values; rows bs … graph_bs − 1 are padding:

        slot_mapping[i] = −1    the cache write skips slot −1 (ch25's store_kv)
        context_lens[i] = 0     attention reads no cache entry for the row
        block_tables[i] = −1s   no block

    Block tables of different lengths are padded with −1 to the widest one, as
    nano-vllm's prepare_block_tables does. Integer dtype: int32 (stated here as an
    exception to the course's int64 convention), because flash-attn takes
    cache_seqlens and block_table as int32 and nano-vllm's graph buffers are int32.
    (nano-vllm's buffers are [max_bs, max_num_blocks] and keep stale values beyond
    the batch's width and in padding rows; the course returns fresh tensors filled
    with −1 instead, the same values wherever a replay reads.)

    Args:
        slots: [bs] the cache slot of each sequence's new token.
        context_lens: [bs] each sequence's length, the new token included.
        block_tables: bs lists of physical block ids (lengths may differ).
        graph_bs: the captured batch size replayed (≥ bs), from graph_batch_size.

    Returns:
        dict with int32 tensors `slot_mapping` [graph_bs], `context_lens`
        [graph_bs] and `block_tables` [graph_bs, widest table].

    Raises:
        ValueError: slots, context_lens and block_tables of different lengths,
            or graph_bs < bs.

    Example:
        >>> out = pad_decode_batch([10, 33], [7, 2], [[7, 2], [8]], 4)
        >>> out["slot_mapping"].tolist(), out["context_lens"].tolist(), out["block_tables"].tolist()
        ([10, 33, -1, -1], [7, 2, 0, 0], [[7, 2], [8, -1], [-1, -1], [-1, -1]])
    """
    # TODO(ch26.3): your code here (about 18 of the task's 26 lines, in 2 places)
    raise NotImplementedError("ch26.3 pad_decode_batch: not implemented yet (about 26 lines)")
