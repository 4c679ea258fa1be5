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
copies its values in place into the first bs rows (a new tensor would sit at
an address the graph never reads), and the remaining rows are padding
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
    lens = _checked_lengths(padded, lengths)          # int64 [B]
    ### BEGIN SOLUTION
    B, T_max, _ = padded.shape
    keep = torch.arange(T_max)[None, :] < lens[:, None]          # [B, T_max], row-major = packed order
    cu_seqlens = torch.zeros(B + 1, dtype=torch.int32)
    cu_seqlens[1:] = lens.cumsum(0)
    return padded[keep], cu_seqlens
    ### END SOLUTION


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
    cu = _checked_cu(packed, cu_seqlens, T_max)       # int64 [B + 1]
    ### BEGIN SOLUTION
    lens = cu[1:] - cu[:-1]
    B = lens.numel()
    out = packed.new_zeros(B, T_max, packed.shape[1])
    keep = torch.arange(T_max)[None, :] < lens[:, None]
    out[keep] = packed
    return out
    ### END SOLUTION


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
    q, c = _checked_query_cached(query_lens, cached_lens)    # int64 [B] each
    ### BEGIN SOLUTION
    k = c + q
    cu_q, cu_k = torch.zeros(q.numel() + 1, dtype=torch.int32), torch.zeros(q.numel() + 1, dtype=torch.int32)
    cu_q[1:], cu_k[1:] = q.cumsum(0), k.cumsum(0)
    return {"cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k,
            "max_seqlen_q": int(q.max()) if q.numel() else 0, "max_seqlen_k": int(k.max()) if k.numel() else 0}
    ### END SOLUTION


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
    _check_batch_size(batch_size)
    ### BEGIN SOLUTION
    fits = [int(s) for s in captured_sizes if s >= batch_size]
    if not fits:
        largest = max(captured_sizes, default=None)
        raise ValueError(f"no captured graph holds a batch of {batch_size} (largest captured: {largest}); "
                         f"run this batch eagerly or capture graphs for more sizes")
    return min(fits)
    ### END SOLUTION


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
    s, c, tables = _checked_decode_batch(slots, context_lens, block_tables, graph_bs)
    ### BEGIN SOLUTION
    bs = s.numel()
    width = max((len(row) for row in tables), default=0)
    slot_mapping = torch.full((graph_bs,), -1, dtype=torch.int32)
    lens = torch.zeros(graph_bs, dtype=torch.int32)
    table = torch.full((graph_bs, width), -1, dtype=torch.int32)
    slot_mapping[:bs], lens[:bs] = s.to(torch.int32), c.to(torch.int32)
    for i, row in enumerate(tables):
        table[i, :len(row)] = torch.tensor(row, dtype=torch.int32)
    return {"slot_mapping": slot_mapping, "context_lens": lens, "block_tables": table}
    ### END SOLUTION


def fill_static_buffers(buffers: dict[str, torch.Tensor], batch: dict[str, torch.Tensor]) -> None:
    """Copy a decode batch into the buffers its CUDA graph was captured on, in place. Task ch26.4.

    A captured graph replays kernels that read fixed addresses: the input buffers
    allocated once, before capture, for the largest graph (max_bs rows). A decode step
    therefore writes its values *into* those tensors and never replaces one: a new
    tensor, however right its values, lives at an address no graph reads, and the
    replay would run on an earlier step's inputs. For a batch of bs sequences whose
    block tables are width columns wide:

        input_ids[:bs], positions[:bs]      ← the batch's
        slot_mapping   ← −1 in every row, then [:bs] ← the batch's
        context_lens   ← 0 in every row, then [:bs] ← the batch's
        block_tables[:bs, :width]           ← the batch's

    The resets are the point: the buffers still hold the previous step's values. After
    a batch of 7, a batch of 5 leaves rows 5 and 6 with real slots and lengths, and a
    padding row with a real slot would overwrite the K/V stored there. −1 and 0 in every
    row beyond bs make each of them harmless padding, whichever captured size ≥ bs
    replays. The other cells (input_ids and positions beyond bs, the block table outside
    [:bs, :width]) may keep what they hold: a replay computes on them, but slot −1
    stores nothing and context_len 0 reads nothing.

    This is what nano-vllm's `run_model` does before `graph.replay()`
    (`nanovllm/engine/model_runner.py`, bb823b3); the buffers come from its
    `capture_cudagraph`.

    Args:
        buffers: the static buffers, written in place: "input_ids" and "positions"
            int64 [max_bs], "slot_mapping" and "context_lens" int32 [max_bs],
            "block_tables" int32 [max_bs, max_num_blocks]. They may be views into a
            larger allocation (as buffers carved from one pool are): write through them.
        batch: this step's values, as prepare_decode makes them: the same five keys,
            [bs] each (bs ≤ max_bs) and "block_tables" [bs, width] (width ≤ max_num_blocks,
            already padded with −1 to the widest table).

    Returns:
        None: the buffers are the result.

    Raises:
        ValueError: a missing key, a batch larger than the buffers, or tensors of
            other shapes or of a non-integer dtype.

    Example:
        >>> buffers = {"input_ids": torch.full((4,), 9), "positions": torch.full((4,), 9),
        ...            "slot_mapping": torch.full((4,), 9, dtype=torch.int32),
        ...            "context_lens": torch.full((4,), 9, dtype=torch.int32),
        ...            "block_tables": torch.full((4, 3), 9, dtype=torch.int32)}
        >>> batch = {"input_ids": torch.tensor([5, 6]), "positions": torch.tensor([6, 1]),
        ...          "slot_mapping": torch.tensor([26, 33]), "context_lens": torch.tensor([7, 2]),
        ...          "block_tables": torch.tensor([[7, 6], [8, -1]])}
        >>> fill_static_buffers(buffers, batch)
        >>> buffers["slot_mapping"].tolist(), buffers["context_lens"].tolist()
        ([26, 33, -1, -1], [7, 2, 0, 0])
        >>> buffers["input_ids"].tolist(), buffers["block_tables"][:2].tolist()
        ([5, 6, 9, 9], [[7, 6, 9], [8, -1, 9]])
    """
    _check_static(buffers, batch)
    ### BEGIN SOLUTION
    bs, width = batch["block_tables"].shape
    buffers["slot_mapping"].fill_(-1)
    buffers["context_lens"].zero_()
    for key in ("input_ids", "positions", "slot_mapping", "context_lens"):
        buffers[key][:bs] = batch[key]
    buffers["block_tables"][:bs, :width] = batch["block_tables"]
    ### END SOLUTION


# -- provided: the input checks every task needs but none teaches (not part of the exercise) ----------------------

def _checked_lengths(padded: torch.Tensor, lengths: list[int] | torch.Tensor) -> torch.Tensor:
    """Provided: lengths as an int64 tensor [B]; raise ValueError unless padded is [B, T_max, H] and there is one
    length per sequence, each in [0, T_max]."""
    if padded.dim() != 3:
        raise ValueError(f"padded must be [B, T_max, H]; got {list(padded.shape)}")
    B, T_max, _ = padded.shape
    lens = torch.as_tensor(lengths, dtype=torch.int64).reshape(-1)
    if lens.numel() != B:
        raise ValueError(f"need one length per sequence: padded has B = {B}, lengths has {lens.numel()}")
    if lens.numel() and (int(lens.min()) < 0 or int(lens.max()) > T_max):
        raise ValueError(f"lengths must lie in [0, T_max = {T_max}]; got {lens.tolist()}")
    return lens


def _checked_cu(packed: torch.Tensor, cu_seqlens: list[int] | torch.Tensor, T_max: int) -> torch.Tensor:
    """Provided: cu_seqlens as an int64 tensor [B + 1]; raise ValueError unless packed is [N, H] and cu_seqlens
    starts at 0, never decreases, ends at N, and no sequence is longer than T_max."""
    if packed.dim() != 2:
        raise ValueError(f"packed must be [N, H]; got {list(packed.shape)}")
    cu = torch.as_tensor(cu_seqlens, dtype=torch.int64).reshape(-1)
    N = packed.shape[0]
    if cu.numel() == 0 or int(cu[0]) != 0 or int(cu[-1]) != N:
        raise ValueError(f"cu_seqlens must start at 0 and end at N = {N}; got {cu.tolist()}")
    lens = cu[1:] - cu[:-1]
    if lens.numel() and int(lens.min()) < 0:
        raise ValueError(f"cu_seqlens must not decrease; got {cu.tolist()}")
    if lens.numel() and int(lens.max()) > T_max:
        raise ValueError(f"a sequence of {int(lens.max())} tokens does not fit in T_max = {T_max} rows")
    return cu


def _checked_query_cached(query_lens: list[int], cached_lens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Provided: both lists as int64 tensors [B]; raise ValueError for lists of different lengths or a negative
    length."""
    q = torch.as_tensor(query_lens, dtype=torch.int64).reshape(-1)
    c = torch.as_tensor(cached_lens, dtype=torch.int64).reshape(-1)
    if q.numel() != c.numel():
        raise ValueError(f"need one cached length per sequence: {q.numel()} query lengths, {c.numel()} cached")
    if q.numel() and (int(q.min()) < 0 or int(c.min()) < 0):
        raise ValueError(f"lengths must be non-negative; got query_lens {q.tolist()}, cached_lens {c.tolist()}")
    return q, c


def _check_batch_size(batch_size: int) -> None:
    """Provided: raise ValueError for a batch of fewer than one sequence."""
    if batch_size < 1:
        raise ValueError(f"a decode batch has at least one sequence; got batch_size {batch_size}")


def _checked_decode_batch(slots: list[int] | torch.Tensor, context_lens: list[int] | torch.Tensor,
                          block_tables: list[list[int]], graph_bs: int
                          ) -> tuple[torch.Tensor, torch.Tensor, list[list[int]]]:
    """Provided: slots and context_lens as int64 tensors [bs], the block tables as lists of ints; raise ValueError
    unless there is one of each per sequence and graph_bs ≥ bs."""
    s = torch.as_tensor(slots, dtype=torch.int64).reshape(-1)
    c = torch.as_tensor(context_lens, dtype=torch.int64).reshape(-1)
    tables = [list(map(int, row)) for row in (block_tables.tolist() if isinstance(block_tables, torch.Tensor)
                                              else block_tables)]
    bs = s.numel()
    if c.numel() != bs or len(tables) != bs:
        raise ValueError(f"one slot, one context_len and one block table per sequence: got {bs} slots, "
                         f"{c.numel()} context_lens and {len(tables)} block tables")
    if graph_bs < bs:
        raise ValueError(f"a graph of {graph_bs} rows cannot hold a batch of {bs}: pick a captured size ≥ {bs}")
    return s, c, tables


STATIC_KEYS = ("input_ids", "positions", "slot_mapping", "context_lens", "block_tables")


def _check_static(buffers: dict[str, torch.Tensor], batch: dict[str, torch.Tensor]) -> None:
    """Provided: raise ValueError unless buffers and batch both hold the five integer tensors, buffers [max_bs] and
    block_tables [max_bs, max_num_blocks], batch [bs] and block_tables [bs, width], 1 ≤ bs ≤ max_bs and
    width ≤ max_num_blocks."""
    for name, d in (("buffers", buffers), ("batch", batch)):
        missing = [k for k in STATIC_KEYS if not isinstance(d.get(k), torch.Tensor)]
        if missing:
            raise ValueError(f"{name} needs a tensor for each of {', '.join(STATIC_KEYS)}; missing: {missing[0]}")
        odd = [k for k in STATIC_KEYS if d[k].dtype.is_floating_point or d[k].dtype.is_complex or
               d[k].dtype == torch.bool or d[k].dim() != (2 if k == "block_tables" else 1)]
        if odd:
            raise ValueError(f"{name}[{odd[0]!r}] must be a {'2' if odd[0] == 'block_tables' else '1'}-D integer "
                             f"tensor; got {d[odd[0]].dtype} {list(d[odd[0]].shape)}")
    max_bs, max_blocks = buffers["block_tables"].shape
    bs, width = batch["block_tables"].shape
    if any(buffers[k].shape[0] != max_bs for k in STATIC_KEYS) or any(batch[k].shape[0] != bs for k in STATIC_KEYS):
        raise ValueError("every buffer has max_bs rows and every batch tensor bs rows; got buffers "
                         f"{[list(buffers[k].shape) for k in STATIC_KEYS]}, batch {[list(batch[k].shape) for k in STATIC_KEYS]}")
    if not 1 <= bs <= max_bs or width > max_blocks:
        raise ValueError(f"a batch of {bs} sequences with block tables {width} wide does not fit buffers of "
                         f"{max_bs} rows and {max_blocks} blocks")
