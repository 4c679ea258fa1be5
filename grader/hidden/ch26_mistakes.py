"""ch26 · flattened batches and graph replay: the common mistakes, each with the hint that names it and the edit
of the reference that makes it (see `grader.authoring.misconceptions`)."""

from grader.authoring import mistake

CU_PACK = "cu_seqlens[1:] = lens.cumsum(0)"
CU_META = "cu_q[1:], cu_k[1:] = q.cumsum(0), k.cumsum(0)"
RESET = '    buffers["slot_mapping"].fill_(-1)\n    buffers["context_lens"].zero_()\n'
TABLE_COPY = '    buffers["block_tables"][:bs, :width] = batch["block_tables"]\n'

MISTAKES = [
    # -- 26.1 pack_varlen / unpack_varlen ------------------------------------------------------------------
    mistake(
        "no_leading_zero",
        "ch26.1 ch26.2",
        "cu_seqlens starts with 0: sequence b owns rows cu_seqlens[b] … cu_seqlens[b+1] − 1, so sequence 0 needs its start too",
        (CU_PACK, "cu_seqlens = lens.cumsum(0).to(torch.int32)"),
        (CU_META, "cu_q, cu_k = q.cumsum(0).to(torch.int32), k.cumsum(0).to(torch.int32)"),
    ),
    mistake(
        "not_cumulative",
        "ch26.1 ch26.2",
        "cu_seqlens are cumulative: entry b + 1 is the sum of the first b + 1 lengths, not the length of sequence b",
        (CU_PACK, "cu_seqlens[1:] = lens"),
        (CU_META, "cu_q[1:], cu_k[1:] = q, k"),
    ),
    mistake(
        "int64_cu",
        "ch26.1 ch26.2",
        "flash-attn and nano-vllm take cu_seqlens as int32, an exception to the course's int64 index convention",
        ("cu_seqlens = torch.zeros(B + 1, dtype=torch.int32)", "cu_seqlens = torch.zeros(B + 1, dtype=torch.int64)"),
        (
            "cu_q, cu_k = torch.zeros(q.numel() + 1, dtype=torch.int32), torch.zeros(q.numel() + 1, dtype=torch.int32)",
            "cu_q, cu_k = torch.zeros(q.numel() + 1, dtype=torch.int64), torch.zeros(q.numel() + 1, dtype=torch.int64)",
        ),
    ),
    mistake(
        "padding_kept",
        "ch26.1",
        "drop the padding positions: a flattened batch holds only real tokens, not B·T_max = {rows} rows",
        ("return padded[keep], cu_seqlens", "return padded.reshape(B * T_max, -1), cu_seqlens"),
    ),
    mistake(
        "token_major",
        "ch26.1",
        "pack request by request (all of request 0's tokens, then request 1's), not token by token across requests",
        ("return padded[keep], cu_seqlens", "return padded.transpose(0, 1)[keep.T], cu_seqlens"),
    ),
    mistake(
        "padding_not_zero",
        "ch26.1",
        "every padding position of the unpacked batch is 0: start from zeros (new_zeros) and copy in only each request's rows",
        ("out = packed.new_zeros(B, T_max, packed.shape[1])", "out = packed.new_ones(B, T_max, packed.shape[1])"),
    ),
    # -- 26.2 varlen_metadata ---------------------------------------------------------------------------------
    mistake(
        "queries_with_cache",
        "ch26.2",
        "cu_seqlens_q counts the queries, the new tokens only; the cached ones are not computed again",
        (CU_META, "cu_q[1:], cu_k[1:] = k.cumsum(0), k.cumsum(0)"),
    ),
    mistake(
        "keys_without_cache",
        "ch26.2",
        "after a prefix hit (or earlier chunks) the keys include the cached tokens: seqlen_k = cached + query; "
        "built from the query lengths, attention would never see the cached prefix",
        (CU_META, "cu_q[1:], cu_k[1:] = q.cumsum(0), q.cumsum(0)"),
    ),
    mistake(
        "keys_without_new",
        "ch26.2",
        "seqlen_k = cached + query: the new tokens are keys too",
        (CU_META, "cu_q[1:], cu_k[1:] = q.cumsum(0), c.cumsum(0)"),
    ),
    mistake(
        "max_total",
        "ch26.2",
        "{key} is the longest single sequence, not the total Σ = {total}",
        ('"max_seqlen_q": int(q.max()) if q.numel() else 0', '"max_seqlen_q": int(q.sum()) if q.numel() else 0'),
    ),
    mistake(
        "max_other_side",
        "ch26.2",
        "{key} is taken over the {side} lengths, not the {other} lengths",
        ('"max_seqlen_q": int(q.max()) if q.numel() else 0', '"max_seqlen_q": int(k.max()) if q.numel() else 0'),
    ),
    # -- 26.3 graph_batch_size / pad_decode_batch ---------------------------------------------------------------
    mistake(
        "round_down",
        "ch26.3",
        "round up: a graph of {value} rows cannot hold {bs} sequences",
        ("fits = [int(s) for s in captured_sizes if s >= batch_size]", "fits = [int(s) for s in captured_sizes if s <= batch_size]"),
        ("    return min(fits)", "    return max(fits)"),
    ),
    mistake(
        "not_captured",
        "ch26.3",
        "only captured sizes can be replayed; there is no graph of {value} rows",
        ("    return min(fits)", "    return batch_size"),
    ),
    mistake(
        "not_smallest",
        "ch26.3",
        "{value} holds the batch too, but the smallest size ≥ {bs} wastes the fewest padding rows",
        ("    return min(fits)", "    return max(fits)"),
    ),
    mistake(
        "pad_to_bs",
        "ch26.3",
        "the graph was captured for {graph_bs} rows: pad to graph_bs rows, not bs",
        ("table = torch.full((graph_bs, width), -1, dtype=torch.int32)", "table = torch.full((bs, width), -1, dtype=torch.int32)"),
    ),
    mistake(
        "table_width",
        "ch26.3",
        "pad every block table with −1 to the widest one ({width} blocks)",
        ("width = max((len(row) for row in tables), default=0)", "width = max((len(row) for row in tables), default=0) + 1"),
    ),
    mistake(
        "int64_buffers",
        "ch26.3",
        "nano-vllm's graph buffers, and flash-attn's cache_seqlens and block_table, are int32",
        ("slot_mapping = torch.full((graph_bs,), -1, dtype=torch.int32)", "slot_mapping = torch.full((graph_bs,), -1, dtype=torch.int64)"),
    ),
    mistake(
        "pad_slot_real",
        "ch26.3 ch26.4",
        "slot {slot} is a real slot{where}: a padding row would overwrite the K/V stored there; pad with −1, which store_kvcache skips",
        ("slot_mapping = torch.full((graph_bs,), -1, dtype=torch.int32)", "slot_mapping = torch.zeros(graph_bs, dtype=torch.int32)"),
        ('    buffers["slot_mapping"].fill_(-1)\n', '    buffers["slot_mapping"].zero_()\n'),
    ),
    mistake(
        "pad_block_zero",
        "ch26.3",
        "block 0 is a real block; pad block tables with −1",
        ("table = torch.full((graph_bs, width), -1, dtype=torch.int32)", "table = torch.zeros(graph_bs, width, dtype=torch.int32)"),
    ),
    # -- 26.4 fill_static_buffers --------------------------------------------------------------------------------
    mistake(
        "new_buffer",
        "ch26.4",
        "a graph replays on the addresses it was captured with: write into the buffers (slices, fill_, copy_), "
        "never put a new tensor in their place, however right its values; the replay would read the old one",
        (
            RESET,
            '    buffers["slot_mapping"] = torch.full_like(buffers["slot_mapping"], -1)\n'
            '    buffers["context_lens"] = torch.zeros_like(buffers["context_lens"])\n',
        ),
    ),
    mistake(
        "stale_rows",
        "ch26.4",
        "the buffers keep the previous step's values: row {row} still holds {key} {value} from it. Reset every "
        "slot to −1 and every length to 0 before copying the batch, so each row beyond it is harmless padding",
        (RESET, ""),
    ),
    mistake(
        "reset_order",
        "ch26.4",
        "reset first, then copy: a fill_(−1) / zero_() after the copy erases the batch's own slots and lengths",
        (RESET, ""),
        (TABLE_COPY, TABLE_COPY + RESET),
    ),
]
