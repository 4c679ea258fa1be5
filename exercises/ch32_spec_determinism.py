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

How many drafts to verify is a separate decision. EAGLE-2 ranks draft-tree paths by
the drafter's confidence. vLLM 0.33's adaptive verification (DSpark) gives each draft
slot a confidence from a trained head or an online estimator. The product of the
confidences up to slot j is the predicted chance that the whole prefix survives,
its survival. Across the batch, vLLM admits the draft slots with the highest survivals,
as many as maximise expected tokens per unit of cost, so each request keeps a prefix of
its drafts. The confidences size the verification workload (置信度决定验证工作量); the
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
            to 1 (within 1e-3), a uniform outside [0, 1), or negative noise.

    Example:
        >>> q = torch.tensor([[0.6, 0.3, 0.1]]); p = torch.tensor([[0.3, 0.5, 0.2], [0.2, 0.2, 0.6]])
        >>> verify_draft([0], q, p, torch.tensor([0.7]), torch.tensor([[0.2, 1.5, 0.6], [1., 1., 1.]]))
        [2]
        >>> verify_draft([0], q, p, torch.tensor([0.4]), torch.tensor([[0.2, 1.5, 0.6], [1., 1., 1.]]))
        [0, 2]
    """
    # TODO(ch32.1): your code here (about 46 lines)
    raise NotImplementedError("ch32.1 verify_draft: not implemented yet (about 46 lines)")


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
    bias the output. The course keeps one request and a fixed threshold. vLLM's
    adaptive verification instead picks a global budget over all requests, by
    expected tokens per unit cost.

    Args:
        confidences: [k] floats in [0, 1] (a 1-D floating tensor or a list), k ≥ 0.
        threshold: a number in [0, 1].

    Returns:
        n, a Python int in 0 … k.

    Raises:
        ValueError: confidences not 1-D, or a confidence or the threshold outside [0, 1].

    Example:
        >>> num_drafts_to_verify(torch.tensor([0.9, 0.8, 0.5]), 0.5)    # survivals 0.9, 0.72, 0.36
        2
        >>> num_drafts_to_verify([0.6, 0.5, 0.9], 0.35)                  # 0.6, 0.30: the 0.9 comes too late
        1
    """
    # TODO(ch32.2): your code here (about 20 lines)
    raise NotImplementedError("ch32.2 num_drafts_to_verify: not implemented yet (about 20 lines)")


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

    Accumulate in float32 (float64 for float64 inputs) and return x's dtype. A
    bf16 accumulator would lose most of the sum's precision, and vLLM's
    batch-invariant mode also turns reduced-precision reductions off.

    The course fixes the order with a plain loop over k, slow but plainly
    invariant. Production kernels (vLLM's Triton persistent matmul, cuBLAS
    without split-K) fix one tile configuration for every batch size instead.

    Args:
        x: [B, K] floating tensor (float32, float64, bfloat16 or float16), B ≥ 0.
        w: [K, N] tensor of the same dtype.

    Returns:
        [B, N] tensor of x's dtype, equal to x @ w up to rounding, with row i
        bitwise identical for every batch that contains x[i].

    Raises:
        ValueError: x or w not 2-D, not floating, of different dtypes, or with
            x.shape[1] != w.shape[0].

    Example:
        >>> x, w = torch.tensor([[1., 2.], [3., 4.]]), torch.tensor([[1., 0.], [0.5, 1.]])
        >>> batch_invariant_matmul(x, w)
        tensor([[2., 2.],
                [5., 4.]])
        >>> torch.equal(batch_invariant_matmul(x[:1], w)[0], batch_invariant_matmul(x, w)[0])
        True
    """
    # TODO(ch32.3): your code here (about 14 lines)
    raise NotImplementedError("ch32.3 batch_invariant_matmul: not implemented yet (about 14 lines)")
