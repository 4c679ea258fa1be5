# ch32 exercises: replace each TODO with your code, then run `course check ch32`.
"""投机解码与确定性 · speculative decoding and determinism

Speculative decoding (投机解码) lets a cheap drafter propose k tokens, x_0 … x_{k−1},
each drawn from its own distribution q_i. The target model then scores all k + 1
positions in one forward pass, giving its distributions p_0 … p_k, and verification
decides how many drafts to keep. Done by rejection sampling, verification is
lossless (无损): the emitted tokens are distributed exactly as if the target had
sampled them itself (Leviathan et al.; Chen et al.; vLLM's `rejection_sampler.py`).
Draft i is accepted with probability min(1, p_i(x_i) / q_i(x_i)). At the first
rejection a *recovered* token is drawn from max(0, p_i − q_i), renormalised, and
verification stops: the later drafts were conditioned on a token that is not in the
output. If all k drafts survive, a *bonus* token is drawn from p_k. So every
verification emits accepted + 1 tokens. vLLM draws the recovered token with the
exponential race of ch23, argmax((p − q)⁺ / E), which needs no normalisation. Its
metrics follow this count: the draft acceptance rate is accepted / drafted tokens,
and the mean acceptance length, 1 + accepted / verifications, includes the bonus or
recovered token.

How many drafts to verify is a separate decision. EAGLE-2 (Li et al., 2024,
arXiv:2406.16858) ranks draft-tree paths by the drafter's confidence. SpecDec++
(Huang et al., 2024, arXiv:2405.19715) trains an acceptance head that gives each
draft slot a confidence, and stops drafting once the predicted chance that a draft
so far is rejected passes a threshold. The product of the confidences up to slot j
is the predicted chance that the whole prefix survives, its survival. A batched
engine can go further and admit, across the batch, the draft slots with the highest
survivals, as many as pay for their cost, so each request keeps a prefix of its
drafts. The confidences size the verification workload (置信度决定验证工作量); the
rejection sampler alone decides what is accepted. The confidence is computed from
the draft *distribution*, never from the drawn token, so trimming does not bias the
output.

Determinism (确定性) is a separate problem with a surprising cause. Floating-point
addition is not associative, and kernels choose their reduction strategy from the
shape: split-K and tile configs in matmul, split reductions in RMSNorm, the number
of FlashDecoding splits in attention, and NCCL's all-reduce algorithm all depend on
how many tokens share the step. The same request therefore gets different logits
depending on who it is batched with. In Thinking Machines' test, 1000 temperature-0
completions of one prompt gave 80 different texts. Batch-invariant kernels, which fix
each row's reduction order whatever the batch, gave 1. vLLM's `VLLM_BATCH_INVARIANT=1`
(matmul without split-K, fixed-order reductions and collectives, fp32 reductions)
and SGLang's `--enable-deterministic-inference` follow this recipe. Their promise
holds only under preconditions: the same weights, dtype, GPU architecture, library
versions and parallel layout, with seeded or greedy sampling. It is a recipe at a
pinned commit, not bitwise equality across hardware or versions.

投机解码:置信度决定验证多少个草稿,拒绝采样决定接受哪些,输出分布与目标模型逐位置相同。
确定性:每一行的归约顺序不随批大小改变(批不变性),并且只在一组固定前提下成立。
"""

import torch


def verify_draft(draft_tokens: torch.Tensor | list[int], draft_probs: torch.Tensor, target_probs: torch.Tensor,
                 uniforms: torch.Tensor, noise: torch.Tensor) -> list[int]:
    """Verify k draft tokens by lossless rejection sampling; return the tokens emitted. Task ch32.1.

    Walk the drafts in order. At position i, with x = draft_tokens[i],
    q = draft_probs[i] and p = target_probs[i]:

    - accept x when  uniforms[i] < min(1, p(x) / q(x)), emit x, go on;
      a draft with q(x) = 0 is rejected (vLLM does the same, to avoid 0 / 0);
    - otherwise emit the recovered token, drawn from max(0, p − q) renormalised
      by the exponential race of ch23, argmax_j max(0, p_j − q_j) / noise[i, j],
      and stop (the normalisation does not change the argmax; clamp the noise
      to ≥ 1e-10 as in ch23);
    - when all k drafts are accepted, emit a bonus token drawn from
      target_probs[k] by the race argmax_j target_probs[k, j] / noise[k, j].

    Whatever the draft distributions, the first emitted token is distributed
    as target_probs[0] (lossless). Compute in float32, or in float64 when an
    input of probabilities is float64.

    The course verifies one request with the randomness passed in. vLLM
    verifies a batch, draws float64 uniforms and tests p/q ≥ u. It draws one
    noise vector per request for the recovered token, and the bonus token comes
    from its ordinary sampler.

    Args:
        draft_tokens: [k] int64 tensor (or list of ints) of the drafted tokens, k ≥ 0.
        draft_probs: [k, V] floating tensor, row i = q_i, the drafter's distribution at position i.
        target_probs: [k + 1, V] floating tensor, row i = p_i, the target's distribution at
            position i (row k is the bonus position).
        uniforms: [k] floating tensor of U(0, 1) draws, each in [0, 1).
        noise: [k + 1, V] floating tensor of Exp(1) draws (≥ 0), one row per position.

    Returns:
        The emitted tokens as a list of Python ints: the accepted drafts followed by
        one recovered or bonus token (1 … k + 1 tokens).

    Raises:
        ValueError: shapes that do not fit k and V as above, a draft token outside
            0 … V − 1, a probability row that is negative, non-finite or does not sum
            to 1 (within 1e-3), a uniform outside [0, 1), or negative noise (the
            provided first line checks these and hands you the drafts as a list of
            ints).

    Example:
        >>> q = torch.tensor([[0.6, 0.3, 0.1]]); p = torch.tensor([[0.3, 0.5, 0.2], [0.2, 0.2, 0.6]])
        >>> verify_draft([0], q, p, torch.tensor([0.7]), torch.tensor([[0.2, 1.5, 0.6], [1., 1., 1.]]))
        [2]
        >>> verify_draft([0], q, p, torch.tensor([0.4]), torch.tensor([[0.2, 1.5, 0.6], [1., 1., 1.]]))
        [0, 2]
    """
    tokens = _checked_drafts(draft_tokens, draft_probs, target_probs, uniforms, noise)
    # TODO(ch32.1): your code here (about 15 lines)
    raise NotImplementedError("ch32.1 verify_draft: not implemented yet (about 15 lines)")


def num_drafts_to_verify(confidences: torch.Tensor | list[float], threshold: float) -> int:
    """How many drafts to send for verification: the longest prefix whose survival stays ≥ threshold. Task ch32.2.

    The survival of draft j is the running product c_0 · c_1 · … · c_j of the
    confidences: the predicted probability that drafts 0 … j are all accepted.
    Return the largest n such that the survival of draft n − 1 is ≥ threshold
    (0 when even c_0 is below it). Because every c ≤ 1, survival never rises:
    a confident late draft cannot rescue a weak prefix. Compute the products in
    float64.

    This only sizes the workload. The drafts sent still pass through
    verify_draft (ch32.1), which alone decides what is accepted. The confidences
    must come from the draft *distributions* (a confidence head, the max
    probability of q_i), never from the drawn token itself, or trimming would
    bias the output. The course keeps one request and a fixed threshold, as
    SpecDec++ does (it stops when 1 − survival exceeds its threshold h); a batched
    engine may instead pick one budget over all requests, by expected tokens per
    unit cost.

    Args:
        confidences: [k] floats in [0, 1] (a 1-D floating tensor or a list), k ≥ 0.
        threshold: a number in [0, 1].

    Returns:
        n, a Python int in 0 … k.

    Raises:
        ValueError: confidences not 1-D, or a confidence or the threshold outside [0, 1]
            (the provided first line checks these and hands you the confidences as a
            list of Python floats).

    Example:
        >>> num_drafts_to_verify(torch.tensor([0.9, 0.8, 0.5]), 0.5)    # survivals 0.9, 0.72, 0.36
        2
        >>> num_drafts_to_verify([0.6, 0.5, 0.9], 0.35)                  # 0.6, 0.30: the 0.9 comes too late
        1
    """
    values = _checked_confidences(confidences, threshold)
    # TODO(ch32.2): your code here (about 7 lines)
    raise NotImplementedError("ch32.2 num_drafts_to_verify: not implemented yet (about 7 lines)")


def batch_invariant_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ w whose row i has the same bits whatever the batch it is computed in. Task ch32.3.

    out[i, n] = Σ_k x[i, k] · w[k, n], summed in one fixed order that depends
    only on k, never on the batch size B, on the row's position in the batch,
    or on the other rows. So the bits of out[i] are a function of x[i] and w
    alone. A plain `x @ w` does not promise this: BLAS libraries (and cuBLAS on
    GPUs) pick kernels, tile sizes and split-K by the shape, so the same row can
    come out with different last bits in a batch of 1 and a batch of 16.
    `course check ch32` measures where that happens on your machine and draws
    it in the figure ch32-determinism.

    The order is this one, and the checks compare yours with it bit for bit:
    start from zeros and, for k = 0, 1, …, K − 1 in turn, add the products
    x[:, k] · w[k, :] (a multiply, then an add: no fused multiply-add), in a
    float32 accumulator (float64 for float64 inputs); cast to x's dtype once at
    the end. A bf16 accumulator would lose most of the sum's precision, and
    vLLM's batch-invariant mode also turns reduced-precision reductions off. A
    float64 accumulator (or `@` on float64 copies) fixes no order either: it
    only hides the library's order behind extra precision and a final rounding.

    The course fixes the order with a plain loop over k, slow but plainly
    invariant. Production kernels (vLLM's Triton persistent matmul in
    vllm/model_executor/layers/batch_invariant.py, cuBLAS without split-K) fix
    one tile configuration for every batch size instead.

    Args:
        x: [B, K] floating tensor (float32, float64, bfloat16 or float16), B ≥ 0.
        w: [K, N] tensor of the same dtype.

    Returns:
        [B, N] tensor of x's dtype, equal to x @ w up to rounding, with row i
        bitwise identical for every batch that contains x[i] (the bits of the
        order above).

    Raises:
        ValueError: x or w not 2-D, not floating, of different dtypes, or with
            x.shape[1] != w.shape[0] (the provided first line checks these).

    Example:
        >>> x, w = torch.tensor([[1., 2.], [3., 4.]]), torch.tensor([[1., 0.], [0.5, 1.]])
        >>> batch_invariant_matmul(x, w)
        tensor([[2., 2.],
                [5., 4.]])
        >>> torch.equal(batch_invariant_matmul(x[:1], w)[0], batch_invariant_matmul(x, w)[0])
        True
    """
    _check_matmul(x, w)
    # TODO(ch32.3): your code here (about 6 lines)
    raise NotImplementedError("ch32.3 batch_invariant_matmul: not implemented yet (about 6 lines)")


def batch_invariant_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                             block: int = 1024) -> torch.Tensor:
    """RMSNorm whose row i has the same bits whatever the batch: a fixed split of the sum. Task ch32.4.

    out[i] = x[i] / sqrt(mean_j x[i, j]² + eps) · weight. The mean is a
    reduction over the hidden size H, and a library reduction (torch.sum,
    .mean, a CUDA kernel) picks how to split it from the shape: GPU kernels
    split a row across several blocks when there are few rows, so a request
    alone is summed in another order than in a batch of 64. Here every row is
    reduced in one fixed order, the one of vLLM's batch-invariant RMSNorm
    (`_rms_norm_kernel` in vllm/model_executor/layers/batch_invariant.py: one
    row per program, the hidden size walked in chunks of BLOCK_SIZE = 1024):

    1. square in the accumulator (float32; float64 for float64 inputs);
    2. cut the H squares into chunks of `block` columns, in order; pad the
       last chunk with zeros to `block`;
    3. sum each chunk by halving: while it is wider than 1, add its second
       half to its first, s = s[:, :h] + s[:, h:] with h = width / 2;
    4. add the chunk sums to a running total (starting from 0), chunk 0 first;
    5. inv_rms = 1 / sqrt(total / H + eps), and out = (x · inv_rms) · weight
       in the accumulator, cast to x's dtype once at the end, as vLLM's
       kernel does (torch.rsqrt instead of 1 / sqrt is accepted as well).

    The halving tree stands in for Triton's tl.sum inside a chunk, whose
    tree the course does not reproduce; what matters is that neither the
    chunk size nor the tree depends on the batch. Half of the checks grade
    batch invariance: each row the same bits in batches of every size, in
    any order you write out (not a library's torch.sum or .mean, whose
    order is the library's). The other half compare yours with this order
    bit for bit.

    Args:
        x: [B, H] floating tensor (float32, float64, bfloat16 or float16), B ≥ 0, H ≥ 1.
        weight: [H] tensor of x's dtype.
        eps: a number ≥ 0 added to the mean square.
        block: the chunk width, a power of two ≥ 1 (vLLM's kernel uses 1024).

    Returns:
        [B, H] tensor of x's dtype.

    Raises:
        ValueError: shapes or dtypes other than the above, eps < 0, or a block that
            is not a power of two (the provided first line checks these).

    Example:
        >>> x = torch.tensor([[3.0, 4.0, 0.0], [1.0, 1.0, 1.0]])
        >>> batch_invariant_rms_norm(x, torch.ones(3), eps=0.0, block=2)
        tensor([[1.0392, 1.3856, 0.0000],
                [1.0000, 1.0000, 1.0000]])
        >>> torch.equal(batch_invariant_rms_norm(x[:1], torch.ones(3), block=2)[0],
        ...             batch_invariant_rms_norm(x, torch.ones(3), block=2)[0])
        True
    """
    _check_rms_norm(x, weight, eps, block)
    # TODO(ch32.4): your code here (about 14 lines)
    raise NotImplementedError("ch32.4 batch_invariant_rms_norm: not implemented yet (about 14 lines)")


# -- provided: the input checks every task needs but none teaches (not part of the exercise) ----------------------

def _checked_drafts(draft_tokens: torch.Tensor | list[int], draft_probs: torch.Tensor, target_probs: torch.Tensor,
                    uniforms: torch.Tensor, noise: torch.Tensor) -> list[int]:
    """Provided: the draft tokens as a list of ints; raise ValueError unless the inputs fit k drafts over a
    vocabulary of V ≥ 1 (shapes, token range, probability rows summing to 1, uniforms in [0, 1), noise ≥ 0)."""
    if isinstance(draft_tokens, torch.Tensor):
        if draft_tokens.dim() != 1 or draft_tokens.is_floating_point() or draft_tokens.dtype == torch.bool:
            raise ValueError(f"draft_tokens must be a 1-D integer tensor [k]; got {draft_tokens.dtype} "
                             f"{list(draft_tokens.shape)}")
        tokens = draft_tokens.tolist()
    elif isinstance(draft_tokens, (list, tuple)) and all(type(x) is int for x in draft_tokens):
        tokens = list(draft_tokens)
    else:
        raise ValueError("draft_tokens must be a 1-D integer tensor [k] or a list of ints")
    k = len(tokens)
    for name, x, rows in (("target_probs", target_probs, k + 1), ("draft_probs", draft_probs, k),
                          ("noise", noise, k + 1)):
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.is_floating_point() or x.shape[0] != rows:
            got = f"{x.dtype} {list(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"{name} must be a 2-D floating tensor with {rows} rows (k = {k} drafts); got {got}")
    V = target_probs.shape[1]
    if V == 0 or draft_probs.shape[1] != V or noise.shape[1] != V:
        raise ValueError(f"draft_probs {list(draft_probs.shape)}, target_probs {list(target_probs.shape)} and "
                         f"noise {list(noise.shape)} must share one vocabulary size V ≥ 1")
    if not isinstance(uniforms, torch.Tensor) or not uniforms.is_floating_point() or uniforms.shape != (k,):
        raise ValueError(f"uniforms must be a floating tensor [k] = [{k}], one per draft")
    if not bool(((uniforms >= 0) & (uniforms < 1)).all()):
        raise ValueError(f"uniforms must lie in [0, 1); got {uniforms.tolist()}")
    if any(not 0 <= x < V for x in tokens):
        raise ValueError(f"draft tokens must lie in 0 … {V - 1}; got {tokens}")
    if bool((noise < 0).any()) or bool(noise.isnan().any()):
        raise ValueError("noise holds Exp(1) draws, which are never negative")
    for name, x in (("draft_probs", draft_probs), ("target_probs", target_probs)):
        sums = x.double().sum(dim=1)
        if bool((x < 0).any()) or not bool(x.isfinite().all()) or bool(((sums - 1).abs() > 1e-3).any()):
            raise ValueError(f"every row of {name} must be a probability distribution (entries ≥ 0, summing "
                             f"to 1); row sums: {sums.tolist()}")
    return tokens


def _checked_confidences(confidences: torch.Tensor | list[float], threshold: float) -> list[float]:
    """Provided: the confidences as a list of Python floats; raise ValueError unless they are 1-D and every
    confidence and the threshold lie in [0, 1]."""
    if isinstance(confidences, torch.Tensor):
        if confidences.dim() != 1 or not confidences.is_floating_point():
            raise ValueError(f"confidences must be a 1-D floating tensor [k]; got {confidences.dtype} "
                             f"{list(confidences.shape)}")
        values = confidences.double().tolist()
    elif isinstance(confidences, (list, tuple)) and all(type(c) in (int, float) for c in confidences):
        values = [float(c) for c in confidences]
    else:
        raise ValueError("confidences must be a 1-D floating tensor [k] or a list of numbers")
    if any(not 0 <= c <= 1 for c in values):
        raise ValueError(f"every confidence is a probability in [0, 1]; got {values}")
    if type(threshold) not in (int, float) or not 0 <= threshold <= 1:
        raise ValueError(f"threshold must be a number in [0, 1]; got {threshold!r}")
    return values


def _check_matmul(x: torch.Tensor, w: torch.Tensor) -> None:
    """Provided: raise ValueError unless x [B, K] and w [K, N] are 2-D floating tensors of one dtype."""
    for name, t in (("x", x), ("w", w)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2 or not t.is_floating_point():
            got = f"{t.dtype} {list(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a 2-D floating tensor; got {got}")
    if x.dtype != w.dtype:
        raise ValueError(f"x and w must share one dtype; got {x.dtype} and {w.dtype}")
    if x.shape[1] != w.shape[0]:
        raise ValueError(f"x is [B, K] = {list(x.shape)} and w is [K, N] = {list(w.shape)}: the K's differ")


def _check_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, block: int) -> None:
    """Provided: raise ValueError unless x is [B, H ≥ 1] floating, weight [H] of x's dtype, eps a number ≥ 0 and
    block a power of two ≥ 1."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.is_floating_point() or x.shape[1] == 0:
        got = f"{x.dtype} {list(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x must be a 2-D floating tensor [B, H] with H ≥ 1; got {got}")
    if not isinstance(weight, torch.Tensor) or weight.shape != (x.shape[1],) or weight.dtype != x.dtype:
        got = f"{weight.dtype} {list(weight.shape)}" if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise ValueError(f"weight must be [H] = [{x.shape[1]}] of x's dtype {x.dtype}; got {got}")
    if type(eps) not in (int, float) or not eps >= 0:
        raise ValueError(f"eps must be a number ≥ 0; got {eps!r}")
    if type(block) is not int or block < 1 or block & (block - 1):
        raise ValueError(f"block must be a power of two ≥ 1 (the chunk width); got {block!r}")
