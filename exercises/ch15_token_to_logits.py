# ch15 exercises: replace each TODO with your code, then run `course check ch15`.
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

查表不是 reshape;权重按 [out, in] 存储、按 x·Wᵀ 计算;head_dim 来自 config;prefill 只为每个请求的最后一个 token 计算 logits。
"""

import torch


def embedding_lookup(weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Each token id's row of the embedding table. Task ch15.1.

    out[..., :] = weight[ids[...], :]: the ids keep their shape and each id
    becomes the H numbers of its row. Repeated ids read the same row twice; the
    table is never reshaped. This is nano-vllm's `VocabParallelEmbedding` at
    tp = 1 (with tp > 1 each rank holds V/tp rows, zeroes the ids it does not own,
    and an all-reduce adds the rows up).

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
    # TODO(ch15.1): your code here (about 12 lines)
    raise NotImplementedError("ch15.1 embedding_lookup: not implemented yet (about 12 lines)")


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
        ValueError: weight not 2-D; a weight passed as [in, out] (x's last dim
            matches weight.shape[0] but not weight.shape[1]; the message names the
            convention: weights are stored [out, in]); any other feature mismatch;
            a bias that is not [out].

    Example:
        >>> W = torch.tensor([[1., 0., 2.], [0., 1., 0.]])   # [out=2, in=3]
        >>> linear(torch.tensor([[1., 2., 3.]]), W)
        tensor([[7., 2.]])
    """
    # TODO(ch15.2): your code here (about 16 lines)
    raise NotImplementedError("ch15.2 linear: not implemented yet (about 16 lines)")


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
    # TODO(ch15.3): your code here (about 11 lines)
    raise NotImplementedError("ch15.3 split_qkv: not implemented yet (about 11 lines)")


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
    # TODO(ch15.4): your code here (about 17 lines)
    raise NotImplementedError("ch15.4 projection_shapes: not implemented yet (about 17 lines)")


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
    # TODO(ch15.5): your code here (about 10 lines)
    raise NotImplementedError("ch15.5 forward_checkpoints: not implemented yet (about 10 lines)")


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
    # TODO(ch15.6): your code here (about 10 of the task's 29 lines, in 2 places)
    raise NotImplementedError("ch15.6 column_parallel_linear: not implemented yet (about 29 lines)")


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
    # TODO(ch15.6): your code here (about 19 of the task's 29 lines, in 2 places)
    raise NotImplementedError("ch15.6 row_parallel_linear: not implemented yet (about 29 lines)")
