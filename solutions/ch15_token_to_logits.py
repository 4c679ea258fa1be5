"""从 token 到 logits · token ids to logits

A language model never sees text. The tokenizer turns a prompt into integer token
ids, and the model's first layer turns each id into a vector by *looking it up*:
row `id` of the embedding table `embed_tokens.weight`, shape [vocab_size, hidden_size]
(Qwen3-0.6B: [151936, 1024]). A lookup is not a reshape: three ids read three rows
of H numbers each, wherever those rows sit in the table.

Every layer after that is made of linear projections. An engine stores each weight
the way `nn.Linear` does, as **[out_features, in_features]**, and applies it as
y = x·Wᵀ (+ b) (`F.linear`). nano-vllm (bb823b3) fuses the three attention
projections into one `qkv_proj` whose output is packed **q | k | v** with widths
num_heads·head_dim, num_kv_heads·head_dim, num_kv_heads·head_dim, and gate and up
into one `gate_up_proj` (gate | up). Every width comes from the model's config, and
head_dim is a config value of its own: Qwen3-0.6B has hidden_size 1024 and 16 query
heads but head_dim 128, not 1024 / 16 = 64, so its qkv_proj is [(16 + 2·8)·128, 1024]
= [4096, 1024] and its o_proj [1024, 2048].

One prefill step runs a whole batch of prompts as one flattened ("varlen") batch of
N = Σ prompt_lens tokens: ids [N] → embeddings [N, H] → the decoder layers [N, H] →
the final RMSNorm [N, H]. Only the last token of each request predicts a next token,
so the LM head keeps the rows at cu_seqlens_q[1:] − 1 ([B, H]) and projects just
those to logits [B, V]. With `tie_word_embeddings` (Qwen3-0.6B) the LM head reuses
the embedding table itself.

With tensor parallelism (张量并行) a layer's weight is split over tp ranks. A
column-parallel layer splits the output features: every rank sees the whole input
and computes its own slice of the output columns (qkv_proj, gate_up_proj). A
row-parallel layer splits the input features: rank r multiplies its slice of the
input by its slice of the weight rows and gets a partial of the *full* output shape;
an all-reduce sums the partials (o_proj, down_proj). Column then row needs one
all-reduce per pair, and none in between.

The vocabulary is split the same way (nanovllm/layers/embed_head.py): rank r holds
the V/tp rows [r·V/tp, (r+1)·V/tp) of the embedding table. Every rank sees all the
ids; an id outside its rows is no error. The rank masks the ids it owns, maps them to
local rows id − r·V/tp and every other id to local row 0, looks the rows up, zeroes the
rows of the ids it does not own, and an all-reduce adds the ranks' partials: each id
has one owner, so the sum is its row. The LM head shares that split: each rank computes
the logits of its own V/tp tokens, and a gather to rank 0 concatenates them along the
vocabulary in rank order. Loading a checkpoint (nanovllm/layers/linear.py), the fused
qkv_proj of each rank takes its chunk of q_proj, k_proj and v_proj, its own q | k | v.

查表不是 reshape;权重按 [out, in] 存储、按 x·Wᵀ 计算;head_dim 来自 config;prefill 只为每个请求的最后一个 token 计算 logits。
"""

import torch


def embedding_lookup(weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Each token id's row of the embedding table. Task ch15.1.

    out[..., :] = weight[ids[...], :]: the ids keep their shape and each id
    becomes the H numbers of its row. Repeated ids read the same row twice; the
    table is never reshaped. This is nano-vllm's `VocabParallelEmbedding` at
    tp = 1 (with tp > 1 each rank holds V/tp rows, maps the ids it does not own to
    its local row 0, zeroes those rows after the lookup, and an all-reduce adds the
    ranks' rows up, as vocab_parallel_embedding does).

    Args:
        weight: the table E, [V, H] (vocab_size, hidden_size), any float dtype.
        ids: integer token ids of any shape (0-d, [N], [B, T], …), each in [0, V).

    Returns:
        [*ids.shape, H] tensor in weight's dtype (a 0-d id gives one row [H]).

    Raises:
        ValueError: weight not 2-D, ids not integers (float or bool), or an id
            outside [0, V) (a negative id would silently wrap to the end of the table).

    Example:
        >>> E = torch.arange(24.).reshape(6, 4)
        >>> embedding_lookup(E, torch.tensor([[2, 0, 4]])).shape
        torch.Size([1, 3, 4])
    """
    ids = _check_lookup(weight, ids)
    ### BEGIN SOLUTION
    return weight[ids.long()]
    ### END SOLUTION


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """A linear layer in the nn.Linear convention: y = x·Wᵀ + b. Task ch15.2.

    The weight is stored [out, in] (one row per output feature) and applied as
    x @ W.T, exactly like `torch.nn.functional.linear`; the sum runs over the
    `in` axis, the last axis of both x and W. Leading axes of x are batch axes.

    Args:
        x: [..., in] input features.
        weight: [out, in] weight, stored as nn.Linear stores it.
        bias: optional [out] bias.

    Returns:
        [..., out] tensor in x's dtype.

    Raises:
        ValueError: a weight passed as [in, out] (x's last dim matches
            weight.shape[0] but not weight.shape[1]), with a message that names the
            convention: weights are stored [out, in]. This one is yours to write; the
            provided check raises for a weight not 2-D, any other feature mismatch and
            a bias that is not [out].

    Example:
        >>> W = torch.tensor([[1., 0., 2.], [0., 1., 0.]])   # [out=2, in=3]
        >>> linear(torch.tensor([[1., 2., 3.]]), W)
        tensor([[7., 2.]])
    """
    _check_linear(x, weight, bias)
    ### BEGIN SOLUTION
    out_features, in_features = weight.shape
    if x.shape[-1] != in_features:  # the one width _check_linear lets through: a weight passed as [in, out]
        raise ValueError(f"x has {x.shape[-1]} features but weight is {list(weight.shape)}: weights are stored "
                         f"[out, in] (the nn.Linear convention) and applied as x @ W.T; this one looks like [in, out]")
    y = x @ weight.T
    return y if bias is None else y + bias
    ### END SOLUTION


def split_qkv(qkv: torch.Tensor, num_heads: int, num_kv_heads: int,
              head_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split the fused QKV projection's output into q, k and v. Task ch15.3.

    nano-vllm's `QKVParallelLinear` packs its output features as
    q | k | v with widths num_heads·head_dim, num_kv_heads·head_dim and
    num_kv_heads·head_dim (Qwen3-0.6B: 2048 | 1024 | 1024 of 4096). Under GQA the
    three parts are not equal thirds. The course splits one rank's output (with
    tp > 1 each rank packs its own q | k | v, so the global layout is
    [q0 k0 v0 | q1 k1 v1 | …]).

    Args:
        qkv: [..., (num_heads + 2·num_kv_heads)·head_dim].
        num_heads: query heads (> 0).
        num_kv_heads: key/value heads (> 0).
        head_dim: width of one head (> 0), from the config.

    Returns:
        (q, k, v): [..., num_heads·head_dim], [..., num_kv_heads·head_dim] and
        [..., num_kv_heads·head_dim], in qkv's dtype (views of qkv are fine).

    Raises:
        ValueError: a head count or head_dim that is not a positive int, or a last
            dim other than (num_heads + 2·num_kv_heads)·head_dim.

    Example:
        >>> q, k, v = split_qkv(torch.zeros(3, 8), 2, 1, 2)
        >>> q.shape, k.shape, v.shape
        (torch.Size([3, 4]), torch.Size([3, 2]), torch.Size([3, 2]))
    """
    _check_split(qkv, num_heads, num_kv_heads, head_dim)
    ### BEGIN SOLUTION
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    return q, k, v
    ### END SOLUTION


def projection_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """The stored [out, in] shape of every weight of a Qwen3-style model, from its config. Task ch15.4.

    For a Hugging Face style config with H = hidden_size, I = intermediate_size,
    Hq = num_attention_heads, Hkv = num_key_value_heads, d = head_dim and
    V = vocab_size, nano-vllm's Qwen3ForCausalLM (tp = 1) holds:

        embed_tokens  [V, H]                 (a table: one row per token id)
        qkv_proj      [(Hq + 2·Hkv)·d, H]    (q | k | v packed)
        o_proj        [H, Hq·d]
        q_norm        [d]                    (RMSNorm over each head)
        k_norm        [d]
        gate_up_proj  [2·I, H]               (gate | up packed)
        down_proj     [H, I]
        lm_head       [V, H]

    head_dim is read from the config, never derived: Hq·d need not equal H
    (Qwen3-0.6B: 16·128 = 2048 ≠ 1024). (nano-vllm falls back to H / Hq when a
    config has no head_dim; the course requires the key.)

    Tying does not show in the shapes: with tie_word_embeddings the lm_head has
    the same [V, H] shape, but its weight *is* embed_tokens.weight (one tensor,
    stored and loaded once, counted once in the parameter count); untied, it is a
    second [V, H] matrix of its own.

    Args:
        config: a dict with at least hidden_size, intermediate_size,
            num_attention_heads, num_key_value_heads, head_dim, vocab_size (positive
            ints) and tie_word_embeddings (bool); other keys are ignored.

    Returns:
        A dict with exactly the eight names above, each a tuple of Python ints.

    Raises:
        ValueError: a required key missing, a size that is not a positive int,
            tie_word_embeddings not a bool, or num_key_value_heads not dividing
            num_attention_heads.

    Example:
        >>> cfg = dict(hidden_size=1024, intermediate_size=3072, num_attention_heads=16,
        ...            num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True)
        >>> projection_shapes(cfg)["qkv_proj"]
        (4096, 1024)
    """
    _check_config(config)
    ### BEGIN SOLUTION
    H, I, V, d = config["hidden_size"], config["intermediate_size"], config["vocab_size"], config["head_dim"]
    Hq, Hkv = config["num_attention_heads"], config["num_key_value_heads"]
    return {"embed_tokens": (V, H), "qkv_proj": ((Hq + 2 * Hkv) * d, H), "o_proj": (H, Hq * d),
            "q_norm": (d,), "k_norm": (d,), "gate_up_proj": (2 * I, H), "down_proj": (H, I), "lm_head": (V, H)}
    ### END SOLUTION


def forward_checkpoints(config: dict, prompt_lens: list[int]) -> list[tuple[str, tuple[int, ...]]]:
    """The six tensor shapes from token ids to logits in one prefill step. Task ch15.5.

    The prompts of a prefill batch run flattened, one after the other, as
    N = sum(prompt_lens) tokens with no padding (the varlen convention); B =
    len(prompt_lens). The checkpoints, by these exact names and in this order:

        ("input_ids",         (N,))      the flattened token ids
        ("embeddings",        (N, H))    embed_tokens(input_ids)
        ("decoder_output",    (N, H))    after all decoder layers (residual stream)
        ("final_norm",        (N, H))    the model's final RMSNorm
        ("last_token_hidden", (B, H))    rows cu_seqlens_q[1:] − 1: each request's last token
        ("logits",            (B, V))    lm_head of those rows only

    Logits are never computed for all N tokens in prefill: only a request's last
    token predicts its next token (nano-vllm's ParallelLMHead.forward).

    Args:
        config: a dict with hidden_size (H) and vocab_size (V), positive ints.
        prompt_lens: the number of tokens of each request in the batch (each > 0).

    Returns:
        A list of six (name, shape) pairs, each shape a tuple of Python ints.

    Raises:
        ValueError: hidden_size or vocab_size missing or not a positive int, no
            requests, or a prompt length that is not a positive int.

    Example:
        >>> forward_checkpoints({"hidden_size": 1024, "vocab_size": 151936}, [3, 2])[-1]
        ('logits', (2, 151936))
    """
    _check_checkpoints(config, prompt_lens)
    ### BEGIN SOLUTION
    H, V = config["hidden_size"], config["vocab_size"]
    N, B = sum(prompt_lens), len(prompt_lens)
    return [("input_ids", (N,)), ("embeddings", (N, H)), ("decoder_output", (N, H)), ("final_norm", (N, H)),
            ("last_token_hidden", (B, H)), ("logits", (B, V))]
    ### END SOLUTION


def column_parallel_linear(x: torch.Tensor, weight: torch.Tensor, tp: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """A column-parallel linear layer over tp simulated ranks. Task ch15.6.

    **Math convention [in, out]: y = x @ W** (the tensor-parallel figure's view;
    nano-vllm stores the same weight as [out, in] and splits its dim 0). The
    output columns are split into tp contiguous blocks of out/tp: rank r holds
    W[:, r·out/tp : (r+1)·out/tp], sees the whole (replicated) input, and computes
    its shard x @ W_r without any communication. Gathering the shards side by
    side (concatenation) gives the full output.

    Args:
        x: [N, in], the same on every rank.
        weight: [in, out], the full weight (the function slices each rank's part).
        tp: number of ranks (≥ 1); must divide out.

    Returns:
        (shards, out): a list of tp tensors [N, out/tp] (rank r's output) and
        their concatenation [N, out], equal to x @ weight.

    Raises:
        ValueError: tp not a positive int, x or weight not 2-D, x's width other
            than weight.shape[0], or tp not dividing out.

    Example:
        >>> shards, out = column_parallel_linear(torch.ones(2, 3), torch.ones(3, 4), 2)
        >>> [s.shape for s in shards], out.shape
        ([torch.Size([2, 2]), torch.Size([2, 2])], torch.Size([2, 4]))
    """
    _check_column(x, weight, tp)
    ### BEGIN SOLUTION
    out_features = weight.shape[1]
    shards = [x @ w for w in weight.split(out_features // tp, dim=1)]
    return shards, torch.cat(shards, dim=1)
    ### END SOLUTION


def row_parallel_linear(x_shards: list[torch.Tensor], weight: torch.Tensor,
                        tp: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """A row-parallel linear layer over tp simulated ranks, all-reduce = sum. Task ch15.6.

    **Math convention [in, out]: y = x @ W.** The input features are split into tp
    contiguous blocks of in/tp: rank r holds x_r (its block of input columns, as a
    column-parallel layer before it left them) and W[r·in/tp : (r+1)·in/tp, :],
    the matching rows of W. Each rank's partial x_r @ W_r has the full output
    shape [N, out]; the all-reduce sums the partials into x @ W. (The course has no
    bias; nano-vllm adds a row-parallel bias on rank 0 only, so the sum counts it
    once.)

    Args:
        x_shards: tp tensors [N, in/tp], rank r's block of the input.
        weight: [in, out], the full weight (the function slices each rank's rows).
        tp: number of ranks (≥ 1); must divide in.

    Returns:
        (partials, out): a list of tp tensors [N, out] (rank r's partial) and
        their sum [N, out].

    Raises:
        ValueError: tp not a positive int, weight not 2-D, tp not dividing in,
            len(x_shards) ≠ tp, or a shard that is not [N, in/tp] (same N for all).

    Example:
        >>> partials, out = row_parallel_linear([torch.ones(2, 2), torch.ones(2, 2)], torch.ones(4, 3), 2)
        >>> partials[0].shape, out[0, 0].item()
        (torch.Size([2, 3]), 4.0)
    """
    _check_row(x_shards, weight, tp)
    ### BEGIN SOLUTION
    part = weight.shape[0] // tp
    partials = [xs @ weight[r * part:(r + 1) * part] for r, xs in enumerate(x_shards)]
    out = partials[0]
    for p in partials[1:]:
        out = out + p
    return partials, out
    ### END SOLUTION


def vocab_parallel_embedding(weight_shard: torch.Tensor, ids: torch.Tensor, rank: int, tp: int) -> torch.Tensor:
    """One rank's partial of a vocabulary-parallel embedding lookup. Task ch15.7.

    The table E [V, H] is split by rows over tp ranks: rank r holds
    weight_shard = E[start : start + V/tp] with start = r·V/tp, and every rank
    receives all the ids. As nano-vllm's `VocabParallelEmbedding.forward`
    (nanovllm/layers/embed_head.py, bb823b3), the rank
      1. marks the ids it owns: mask = (ids ≥ start) & (ids < start + V/tp);
      2. maps them to local rows, id − start, and every other id to local row 0
         (ids · mask after the shift: row 0 is only a placeholder that any rank has);
      3. looks the local rows up in its shard;
      4. zeroes the rows of the ids it does not own (rows · mask), so the placeholder
         adds nothing.
    The all-reduce that follows (a sum over the ranks; the check does it) gives every
    rank E[ids]: each id has exactly one owner, whose row is the only non-zero term.

    Args:
        weight_shard: this rank's rows of E, [V/tp, H].
        ids: integer token ids [N] (the flattened batch), each in [0, V), V = tp·V/tp.
        rank: this rank, 0 ≤ rank < tp.
        tp: the number of ranks (≥ 1).

    Returns:
        The rank's partial [N, H] in weight_shard's dtype: row i is E[ids[i]] where
        this rank owns ids[i], and zeros elsewhere.

    Raises:
        ValueError: weight_shard not 2-D, ids not an integer tensor [N], tp or rank
            out of range, or an id outside [0, tp·V/tp) (the provided check).

    Example:
        >>> E = torch.arange(8.).reshape(4, 2)          # V = 4, H = 2: rank 1 of 2 holds rows 2 and 3
        >>> vocab_parallel_embedding(E[2:], torch.tensor([3, 0, 2]), 1, 2)
        tensor([[6., 7.],
                [0., 0.],
                [4., 5.]])
    """
    _check_vocab_shard(weight_shard, ids, rank, tp)
    ### BEGIN SOLUTION
    start = rank * weight_shard.shape[0]
    mask = (ids >= start) & (ids < start + weight_shard.shape[0])
    local = mask * (ids - start)
    return weight_shard[local] * mask.unsqueeze(-1)
    ### END SOLUTION


def parallel_lm_head(hidden: torch.Tensor, weight_shards: list[torch.Tensor],
                     cu_seqlens_q: torch.Tensor | None = None) -> torch.Tensor:
    """Logits from a vocabulary-parallel LM head, gathered in rank order. Task ch15.8.

    The LM head weight [V, H] is split by rows like the embedding table: rank r
    holds weight_shards[r] = rows [r·V/tp, (r+1)·V/tp), the tokens whose logits it
    computes. As nano-vllm's `ParallelLMHead.forward` (nanovllm/layers/embed_head.py,
    bb823b3):
      1. in a prefill step, keep only each sequence's last token, the rows
         cu_seqlens_q[1:] − 1 (in a decode step each row already is one sequence's
         newest token: keep them all);
      2. on each rank, the local logits x @ W_rᵀ, [B, V/tp];
      3. gather them to rank 0 and concatenate them along the vocabulary in rank
         order: [B, V], column j the logit of token id j.
    The ranks are simulated as a list; nano-vllm returns this on rank 0 (None on
    the others).

    Args:
        hidden: the final norm's output [N, H] (the flattened batch).
        weight_shards: tp tensors [V/tp, H], rank r's rows of the LM head weight.
        cu_seqlens_q: an integer tensor [B + 1], 0 and the running sums of the query
            lengths, in a prefill step; None in a decode step.

    Returns:
        logits [B, V] (prefill, B = len(cu_seqlens_q) − 1) or [N, V] (decode), in
        hidden's dtype.

    Raises:
        ValueError: hidden not [N, H], shards not all [V/tp, H], or cu_seqlens_q not
            an increasing integer vector from 0 to N (the provided check).

    Example:
        >>> W = torch.eye(4)[:, :2]                        # V = 4, H = 2, rows split over 2 ranks
        >>> parallel_lm_head(torch.tensor([[1., 2.], [3., 4.], [5., 6.]]), list(W.split(2)), torch.tensor([0, 2, 3]))
        tensor([[3., 4., 0., 0.],
                [5., 6., 0., 0.]])
    """
    _check_lm_head(hidden, weight_shards, cu_seqlens_q)
    ### BEGIN SOLUTION
    if cu_seqlens_q is not None:  # prefill: each sequence's last token only
        hidden = hidden[cu_seqlens_q[1:] - 1]
    local = [hidden @ w.T for w in weight_shards]
    return torch.cat(local, dim=-1)
    ### END SOLUTION


def qkv_shard(shard_id: str, num_heads: int, num_kv_heads: int, head_dim: int, tp: int,
              rank: int) -> tuple[int, int, int]:
    """Where q_proj, k_proj or v_proj goes in one rank's fused qkv_proj weight. Task ch15.9.

    A checkpoint stores q_proj [Hq·d, H], k_proj [Hkv·d, H] and v_proj [Hkv·d, H]
    apart. nano-vllm's `QKVParallelLinear` (nanovllm/layers/linear.py, bb823b3) holds
    one fused weight per rank, [(Hq/tp + 2·Hkv/tp)·d, H], packed with that rank's own
    heads as q | k | v, and its `weight_loader(param, loaded_weight, shard_id)` copies
    rows [start, start + size) of the loaded weight to rows [offset, offset + size)
    of the rank's weight:
      - size: the rank's share of that projection, (Hq/tp)·d rows for "q" and
        (Hkv/tp)·d for "k" and "v" (under GQA the K/V heads are split by their own
        count, so each rank keeps the K/V heads its query heads read);
      - offset, in the rank's layout (not the global one): 0 for "q", (Hq/tp)·d for
        "k", (Hq/tp + Hkv/tp)·d for "v";
      - start: chunk `rank` of the loaded weight, rank·size.
    The course, like nano-vllm, requires tp to divide both head counts.

    Args:
        shard_id: "q", "k" or "v", the projection being loaded.
        num_heads: query heads Hq; num_kv_heads: key/value heads Hkv.
        head_dim: d, the rows per head.
        tp: the number of ranks; rank: this rank, 0 ≤ rank < tp.

    Returns:
        (offset, start, size), Python ints: param[offset : offset + size] =
        loaded_weight[start : start + size].

    Raises:
        ValueError: shard_id not "q", "k" or "v", a size that is not a positive int,
            tp not dividing both head counts, or rank outside [0, tp) (the provided check).

    Example:
        >>> qkv_shard("k", 16, 8, 128, 2, 1)            # Qwen3-0.6B, rank 1 of 2
        (1024, 512, 512)
    """
    _check_qkv_shard(shard_id, num_heads, num_kv_heads, head_dim, tp, rank)
    ### BEGIN SOLUTION
    q_rows, kv_rows = num_heads // tp * head_dim, num_kv_heads // tp * head_dim
    size = q_rows if shard_id == "q" else kv_rows
    offset = {"q": 0, "k": q_rows, "v": q_rows + kv_rows}[shard_id]
    return offset, rank * size, size
    ### END SOLUTION


# -- provided: the input checks every task needs but none teaches (not part of the exercise) ----------------------

def _check_lookup(weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Provided: raise ValueError unless weight is a 2-D table [V, H] and ids are integers in [0, V) (a negative id
    would silently wrap to the end of the table); returns ids as a tensor."""
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ValueError(f"the embedding table must be a 2-D tensor [V, H]; got {getattr(weight, 'shape', weight)}")
    ids = torch.as_tensor(ids)
    if ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex():
        raise ValueError(f"token ids must be integers (int64); got a {ids.dtype} tensor")
    V = weight.shape[0]
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= V):
        bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
        raise ValueError(f"token id {bad} is outside the vocabulary: the table [V={V}, H] has rows 0 … {V - 1}")
    return ids


def _check_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    """Provided: raise ValueError for a weight that is not 2-D, an x without a feature axis, an x whose width is
    neither in nor out of the weight, or a bias that is not [out] (an x as wide as out is the exercise's case)."""
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D [out, in]; got {list(weight.shape)}")
    if x.dim() < 1:
        raise ValueError("x must have a feature axis: [..., in]")
    out_features, in_features = weight.shape
    if x.shape[-1] not in (in_features, out_features):
        raise ValueError(f"x has {x.shape[-1]} features but weight [out, in] = {list(weight.shape)} expects "
                         f"{in_features}")
    if bias is not None and list(bias.shape) != [out_features]:
        raise ValueError(f"bias must be [out] = [{out_features}]; got {list(bias.shape)}")


def _check_split(qkv: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
    """Provided: raise ValueError for a head count or head_dim that is not a positive int, or a last dim other
    than (num_heads + 2·num_kv_heads)·head_dim."""
    for name, n in (("num_heads", num_heads), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
        if type(n) is not int or n <= 0:
            raise ValueError(f"{name} must be a positive int; got {n!r}")
    width = (num_heads + 2 * num_kv_heads) * head_dim
    if qkv.dim() < 1 or qkv.shape[-1] != width:
        got = qkv.shape[-1] if qkv.dim() else "no feature axis"
        raise ValueError(f"qkv's last dim must be (num_heads + 2·num_kv_heads)·head_dim = "
                         f"({num_heads} + 2·{num_kv_heads})·{head_dim} = {width}; got {got}")


def _check_config(config: dict) -> None:
    """Provided: raise ValueError for a missing key, a size that is not a positive int, a tie_word_embeddings that
    is not a bool, or num_key_value_heads not dividing num_attention_heads."""
    sizes = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
             "vocab_size")
    missing = [key for key in sizes + ("tie_word_embeddings",) if key not in config]
    if missing:
        raise ValueError(f"the config lacks {', '.join(missing)}; every width is read from the config "
                         f"(head_dim too: it is not hidden_size / num_attention_heads)")
    for key in sizes:
        if type(config[key]) is not int or config[key] <= 0:
            raise ValueError(f"config[{key!r}] must be a positive int; got {config[key]!r}")
    if type(config["tie_word_embeddings"]) is not bool:
        raise ValueError(f"config['tie_word_embeddings'] must be a bool; got {config['tie_word_embeddings']!r}")
    if config["num_attention_heads"] % config["num_key_value_heads"]:
        raise ValueError(f"num_key_value_heads={config['num_key_value_heads']} must divide "
                         f"num_attention_heads={config['num_attention_heads']} (GQA groups)")


def _check_checkpoints(config: dict, prompt_lens: list[int]) -> None:
    """Provided: raise ValueError for a hidden_size or vocab_size missing or not a positive int, no requests, or a
    prompt length that is not a positive int."""
    for key in ("hidden_size", "vocab_size"):
        if type(config.get(key)) is not int or config[key] <= 0:
            raise ValueError(f"config[{key!r}] must be a positive int; got {config.get(key)!r}")
    if not prompt_lens or any(type(n) is not int or n <= 0 for n in prompt_lens):
        raise ValueError(f"prompt_lens must list at least one request, each with a positive int length; "
                         f"got {prompt_lens!r}")


def _check_tp(tp: int) -> None:
    """Provided: raise ValueError unless tp is a positive int."""
    if type(tp) is not int or tp < 1:
        raise ValueError(f"tp must be a positive int; got {tp!r}")


def _check_column(x: torch.Tensor, weight: torch.Tensor, tp: int) -> None:
    """Provided: raise ValueError for a bad tp, x or weight not 2-D, x's width other than weight.shape[0], or tp not
    dividing the output columns."""
    _check_tp(tp)
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[0]:
        raise ValueError(f"need x [N, in] and weight [in, out] (the math convention, y = x @ W); got "
                         f"{list(x.shape)} and {list(weight.shape)}")
    if weight.shape[1] % tp:
        raise ValueError(f"tp={tp} must divide the {weight.shape[1]} output columns that column parallelism splits")


def _check_row(x_shards: list[torch.Tensor], weight: torch.Tensor, tp: int) -> None:
    """Provided: raise ValueError for a bad tp, a weight not 2-D, tp not dividing its input rows, len(x_shards) ≠ tp,
    or a shard that is not [N, in/tp] (the same N for all)."""
    _check_tp(tp)
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D [in, out] (the math convention, y = x @ W); got {list(weight.shape)}")
    if weight.shape[0] % tp:
        raise ValueError(f"tp={tp} must divide the {weight.shape[0]} input rows that row parallelism splits")
    if len(x_shards) != tp:
        raise ValueError(f"need one input shard per rank: tp={tp}, got {len(x_shards)} shards")
    part, n = weight.shape[0] // tp, x_shards[0].shape[0] if x_shards[0].dim() == 2 else None
    for r, xs in enumerate(x_shards):
        if xs.dim() != 2 or xs.shape[1] != part or xs.shape[0] != n:
            raise ValueError(f"every shard must be [N, in/tp] = [{n}, {part}]; shard {r} is {list(xs.shape)}")


def _check_vocab_shard(weight_shard: torch.Tensor, ids: torch.Tensor, rank: int, tp: int) -> None:
    """Provided: raise ValueError for a shard that is not 2-D, ids that are not an integer tensor [N], a bad tp or
    rank, or an id outside the whole vocabulary [0, tp·V/tp) (an id outside this rank's rows is no error)."""
    _check_tp(tp)
    if type(rank) is not int or not 0 <= rank < tp:
        raise ValueError(f"rank must be an int in [0, tp = {tp}); got {rank!r}")
    if not isinstance(weight_shard, torch.Tensor) or weight_shard.dim() != 2:
        raise ValueError(f"weight_shard must be a 2-D tensor [V/tp, H]; got {getattr(weight_shard, 'shape', None)}")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 1 or ids.dtype == torch.bool or ids.is_floating_point() \
            or ids.is_complex():
        raise ValueError(f"ids must be an integer tensor [N]; got {getattr(ids, 'dtype', ids)} "
                         f"{list(getattr(ids, 'shape', []))}")
    V = tp * weight_shard.shape[0]
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= V):
        raise ValueError(f"token ids must lie in [0, V = {V}); got {int(ids.min())} … {int(ids.max())}")


def _check_lm_head(hidden: torch.Tensor, weight_shards: list[torch.Tensor], cu_seqlens_q: torch.Tensor | None) -> None:
    """Provided: raise ValueError for a hidden that is not [N, H], no shards or shards not all [V/tp, H], or a
    cu_seqlens_q that is not an increasing integer vector from 0 to N."""
    if not isinstance(hidden, torch.Tensor) or hidden.dim() != 2:
        raise ValueError(f"hidden must be [N, H]; got {getattr(hidden, 'shape', hidden)}")
    shapes = [list(w.shape) if isinstance(w, torch.Tensor) else None for w in weight_shards]
    if not shapes or any(s is None or len(s) != 2 or s != shapes[0] or s[1] != hidden.shape[1] for s in shapes):
        raise ValueError(f"weight_shards must be tp ≥ 1 tensors [V/tp, H = {hidden.shape[1]}] alike; got {shapes}")
    if cu_seqlens_q is None:
        return
    cu = cu_seqlens_q
    if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.is_floating_point() or cu.dtype == torch.bool \
            or len(cu) < 2 or int(cu[0]) != 0 or int(cu[-1]) != hidden.shape[0] or bool((cu[1:] <= cu[:-1]).any()):
        raise ValueError(f"cu_seqlens_q must be an increasing integer vector from 0 to N = {hidden.shape[0]}, one "
                         f"step per sequence; got {cu!r}")


def _check_qkv_shard(shard_id: str, num_heads: int, num_kv_heads: int, head_dim: int, tp: int, rank: int) -> None:
    """Provided: raise ValueError for a shard_id other than "q", "k", "v", a size that is not a positive int, tp not
    dividing both head counts, or rank outside [0, tp)."""
    if shard_id not in ("q", "k", "v"):
        raise ValueError(f'shard_id must be "q", "k" or "v"; got {shard_id!r}')
    for name, n in (("num_heads", num_heads), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim), ("tp", tp)):
        if type(n) is not int or n <= 0:
            raise ValueError(f"{name} must be a positive int; got {n!r}")
    if num_heads % tp or num_kv_heads % tp:
        raise ValueError(f"tp={tp} must divide num_heads={num_heads} and num_kv_heads={num_kv_heads}")
    if type(rank) is not int or not 0 <= rank < tp:
        raise ValueError(f"rank must be an int in [0, tp = {tp}); got {rank!r}")
