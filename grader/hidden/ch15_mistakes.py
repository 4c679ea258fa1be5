"""ch15 · token ids to logits: the common mistakes, each with the hint that names it and the edit of the reference
that makes it (see `grader.authoring.misconceptions`)."""

from grader.authoring import mistake

LOOKUP = "return weight[ids.long()]"
LINEAR = "y = x @ weight.T"
SPLIT = "q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)"
COLUMN = "shards = [x @ w for w in weight.split(out_features // tp, dim=1)]"
SUM = "    return partials, out\n"
ZEROED = "return weight_shard[local] * mask.unsqueeze(-1)"
LOCAL = "local = mask * (ids - start)"
GATHER = "return torch.cat(local, dim=-1)"

MISTAKES = [
    # -- ch15.1 embedding_lookup
    mistake(
        "one_number_per_id",
        "ch15.1",
        "a lookup returns a whole row of H numbers per id: out has shape [*ids.shape, H]",
        (LOOKUP, "return weight[ids.long(), 0]"),
    ),
    mistake(
        "flattened_ids",
        "ch15.1",
        "keep the ids' shape: out is [*ids.shape, H], not flattened to [num_ids, H]",
        (LOOKUP, "return weight[ids.long().reshape(-1)]"),
    ),
    mistake(
        "column_lookup",
        "ch15.1",
        "E is [V, H]: a token's embedding is a row E[id], not a column E[:, id]",
        (LOOKUP, "return weight.T[:, ids.long()]"),
    ),
    mistake(
        "reshape",
        "ch15.1",
        "your rows are rows 0 … {last} of E in order: the ids choose the rows (a lookup is not a reshape of E: "
        "{n} ids read {n}·{H} numbers from wherever their rows sit)",
        (LOOKUP, "return weight.reshape(-1)[: ids.numel() * weight.shape[1]].reshape(*ids.shape, weight.shape[1])"),
    ),
    mistake(
        "off_by_one",
        "ch15.1",
        "yours is row {row}: token ids index the rows from 0, E[id] with no offset",
        (LOOKUP, "return weight[ids.long() - 1]"),
    ),
    mistake(
        "not_a_row",
        "ch15.1",
        "your values are no row of E: a lookup copies the row E[id] and computes nothing",
        (LOOKUP, "return weight[ids.long()] * weight.shape[1] ** 0.5"),
    ),
    # -- ch15.2 linear
    mistake("w_at_xt", "ch15.2", "you computed W·xᵀ: the tokens are the rows of y, so y = x @ W.T", (LINEAR, "y = weight @ x.T")),
    mistake(
        "x_at_w",
        "ch15.2",
        "you computed x @ W, the math [in, out] view; nn.Linear stores W as [out, in] (one row per output feature), so y = x @ W.T",
        (LINEAR, "y = x @ weight"),
    ),
    mistake(
        "reshape_weight",
        "ch15.2",
        "W.reshape(in, out) keeps the memory order and scrambles the weights; a transpose is W.T",
        (LINEAR, "y = x @ weight.reshape(in_features, out_features)"),
    ),
    mistake(
        "no_bias",
        "ch15.2",
        "add the bias: y = x @ W.T + b, one b[j] per output feature",
        ("return y if bias is None else y + bias", "return y"),
    ),
    mistake(
        "vague_error",
        "ch15.2",
        "say that weights are stored {words} (the nn.Linear convention)",
        (
            'weights are stored "\n                         f"[out, in] (the nn.Linear convention)',
            'the shapes "\n                         f"do not match',
        ),
    ),
    # -- ch15.3 split_qkv
    mistake(
        "k_first",
        "ch15.3",
        "the packing order is q | k | v: q's block comes first",
        (SPLIT, "k, q, v = qkv.split([q_size, kv_size, kv_size], dim=-1)"),
    ),
    mistake(
        "block_swapped",
        "ch15.3",
        "your {name} is {other}'s block: the order is q | k | v",
        (SPLIT, "q, v, k = qkv.split([q_size, kv_size, kv_size], dim=-1)"),
    ),
    mistake(
        "thirds",
        "ch15.3",
        "under GQA the parts are not equal thirds: q has {heads} heads, k and v {kv_heads} each (split with sizes "
        "[{q}, {kv}, {kv}], not chunk(3))",
        ("qkv.split([q_size, kv_size, kv_size], dim=-1)", "qkv.chunk(3, dim=-1)"),
    ),
    # -- ch15.4 projection_shapes
    mistake(
        "head_dim_derived",
        "ch15.4",
        "head_dim is read from the config: {d}, not hidden_size / num_attention_heads = {H} / {Hq} = {guess}",
        ('config["vocab_size"], config["head_dim"]', 'config["vocab_size"], config["hidden_size"] // config["num_attention_heads"]'),
    ),
    mistake(
        "out_in_swapped",
        "ch15.4",
        "weights are stored [out, in]: {name} maps {n_in} features to {n_out}, so it is {shape}",
        ('"o_proj": (H, Hq * d)', '"o_proj": (Hq * d, H)'),
    ),
    mistake(
        "kv_full_heads",
        "ch15.4",
        "k and v have num_key_value_heads = {Hkv} heads each, not {Hq}: GQA narrows them",
        ('"qkv_proj": ((Hq + 2 * Hkv) * d, H)', '"qkv_proj": (3 * Hq * d, H)'),
    ),
    mistake(
        "q_only",
        "ch15.4",
        "qkv_proj packs q, k and v into one weight: (Hq + 2·Hkv)·d rows",
        ('"qkv_proj": ((Hq + 2 * Hkv) * d, H)', '"qkv_proj": (Hq * d, H)'),
    ),
    mistake(
        "hidden_widths",
        "ch15.4",
        "the widths are heads × head_dim, not hidden_size: (Hq + 2·Hkv)·d rows",
        ('"qkv_proj": ((Hq + 2 * Hkv) * d, H)', '"qkv_proj": (3 * H, H)'),
    ),
    mistake(
        "gate_only",
        "ch15.4",
        "gate_up_proj packs gate and up: 2·intermediate_size rows",
        ('"gate_up_proj": (2 * I, H)', '"gate_up_proj": (I, H)'),
    ),
    # -- ch15.5 forward_checkpoints
    mistake(
        "all_logits",
        "ch15.5",
        "only the last token of each request predicts a next token: the LM head keeps the rows "
        "cu_seqlens_q[1:] − 1 = {last}, so B = {B} rows, not one per token (N = {N})",
        ('("logits", (B, V))', '("logits", (N, V))'),
    ),
    mistake(
        "batch_axis",
        "ch15.5",
        "the varlen convention flattens the batch: the requests are concatenated into N = {N} rows, with no "
        "batch axis and no padding to the longest prompt ({longest})",
        ('("embeddings", (N, H))', '("embeddings", (B, max(prompt_lens), H))'),
    ),
    mistake(
        "one_row",
        "ch15.5",
        "one row per request: B = {B}",
        ('("last_token_hidden", (B, H)), ("logits"', '("last_token_hidden", (1, H)), ("logits"'),
    ),
    mistake(
        "vocab_width",
        "ch15.5",
        "the hidden width is H; only the LM head maps H to the vocabulary V",
        ('("final_norm", (N, H))', '("final_norm", (N, V))'),
    ),
    # -- ch15.6 column_parallel_linear, row_parallel_linear
    mistake(
        "full_shard",
        "ch15.6",
        "each rank computes only its own block of out/tp = {w} output columns",
        (COLUMN, "shards = [x @ weight for _ in range(tp)]"),
    ),
    mistake(
        "summed_shards",
        "ch15.6",
        "column-parallel shards are gathered side by side (concatenated along the columns), not summed; summing "
        "is what row-parallel partials need",
        ("return shards, torch.cat(shards, dim=1)", "return shards, sum(shards)"),
    ),
    mistake(
        "interleaved",
        "ch15.6",
        "a rank owns one contiguous block of out/tp = {w} columns, not the columns r, r + {tp}, r + 2·{tp}, …",
        (COLUMN, "shards = [x @ weight[:, r::tp] for r in range(tp)]"),
    ),
    mistake(
        "block_start",
        "ch15.6",
        "rank r's block starts at column r·out/tp = {start}",
        (COLUMN, "shards = [x @ weight[:, :out_features // tp] for _ in range(tp)]"),
    ),
    mistake(
        "partial_shape",
        "ch15.6",
        "a row-parallel rank multiplies its input block by its block of W's rows: the result is a same-shaped partial of the whole output",
    ),
    mistake(
        "concat_partials",
        "ch15.6",
        "row-parallel partials are summed (the all-reduce), not concatenated: each of the {tp} partials already "
        "has the full output shape, and their sum is x @ W",
        ("    out = partials[0]\n    for p in partials[1:]:\n        out = out + p\n", "    out = torch.cat(partials, dim=1)\n"),
    ),
    mistake("averaged", "ch15.6", "the all-reduce sums the partials; it does not average them", (SUM, "    return partials, out / tp\n")),
    mistake(
        "rank0_only",
        "ch15.6",
        "add all ranks' partials: rank 0's alone is only part of the sum",
        (SUM, "    return partials, partials[0]\n"),
    ),
    # -- ch15.7 vocab_parallel_embedding
    mistake(
        "unzeroed",
        "ch15.7",
        "an id this rank does not own reads the placeholder, local row 0, and that row must then be zeroed "
        "(rows · mask): otherwise the all-reduce adds row 0 of every rank that does not own the id",
        (ZEROED, "return weight_shard[local]"),
    ),
    mistake(
        "no_start",
        "ch15.7",
        "rank {rank}'s shard holds the global ids {start} … {end} at its local rows 0 … {last}: index the shard "
        "with id − {start}, not with the global id",
        (LOCAL, "local = mask * ids"),
    ),
    mistake(
        "end_inclusive",
        "ch15.7",
        "rank {rank} owns the ids [start, start + V/tp): id {end} is the first id of rank {next}, so the mask "
        "needs ids < start + V/tp (with ≤, that id reaches past the shard's last row)",
        ("(ids < start + weight_shard.shape[0])", "(ids <= start + weight_shard.shape[0])"),
    ),
    mistake(
        "clamped",
        "ch15.7",
        "clamping into the shard reads a real row (row {last} for an id past the shard, row 0 for one before "
        "it); mask the ids the rank does not own instead, and zero their rows after the lookup",
        (LOCAL, "local = (ids - start).clamp(0, weight_shard.shape[0] - 1)"),
        (ZEROED, "return weight_shard[local]"),
    ),
    # -- ch15.8 parallel_lm_head
    mistake(
        "rank_order",
        "ch15.8",
        "concatenate the {tp} local logits in rank order: rank r's block holds token ids r·V/tp … (r+1)·V/tp − 1",
        (GATHER, "return torch.cat(local[::-1], dim=-1)"),
    ),
    mistake(
        "summed_logits",
        "ch15.8",
        "each of the {tp} ranks computes the logits of different token ids: gather them side by side (concatenate "
        "along the vocabulary), do not add them",
        (GATHER, "return sum(local)"),
    ),
    mistake(
        "gather_rows",
        "ch15.8",
        "the {tp} local logits are the same rows' logits for different token ids: concatenate them along the "
        "vocabulary (the last axis), not along the rows",
        (GATHER, "return torch.cat(local, dim=0)"),
    ),
    mistake(
        "lm_head_all_rows",
        "ch15.8",
        "in prefill only each sequence's last token predicts a next token: keep the rows cu_seqlens_q[1:] − 1 = "
        "{last}, so B = {B} rows, not all N = {N}",
        ("        hidden = hidden[cu_seqlens_q[1:] - 1]\n", "        pass\n"),
    ),
    mistake(
        "first_token_rows",
        "ch15.8",
        "cu_seqlens_q[:-1] are the sequences' first tokens; the last token of sequence i is row cu_seqlens_q[i+1] − 1",
        ("hidden[cu_seqlens_q[1:] - 1]", "hidden[cu_seqlens_q[:-1]]"),
    ),
    # -- ch15.9 qkv_shard
    mistake(
        "k_offset_zero",
        "ch15.9",
        "k goes after the rank's q rows in its fused weight: offset (num_heads/tp)·head_dim = {q_rows}, not 0 (at 0 it would overwrite q)",
        ('"k": q_rows,', '"k": 0,'),
    ),
    mistake(
        "global_offset",
        "ch15.9",
        "each rank packs its own heads as q | k | v, so the offset counts this rank's rows only: {offset}, not "
        "the offset in the unsharded weight",
        ('"k": q_rows, "v": q_rows + kv_rows', '"k": num_heads * head_dim, "v": (num_heads + num_kv_heads) * head_dim'),
    ),
    mistake(
        "kv_by_q_heads",
        "ch15.9",
        "k and v are split by their own head count: each rank holds num_kv_heads/tp = {kv}/{tp} heads of "
        "{d} rows, {size} rows, not as many as its query heads",
        ("num_kv_heads // tp * head_dim", "num_heads // tp * head_dim"),
    ),
    mistake(
        "shard_zero",
        "ch15.9",
        "rank {rank} copies its own chunk of the loaded weight, starting at row rank·size = {start}; with 0 every "
        "rank would load the heads of rank 0",
        ("return offset, rank * size, size", "return offset, 0, size"),
    ),
]
