"""采样 · sampling

After the forward pass the engine holds one row of logits per request, `[B, V]`,
and must turn each row into one next token. Sampling (采样) happens in two steps.

First the logits are *processed*. Each row is divided by its request's
temperature (温度) T: T < 1 sharpens the distribution softmax(logits / T), T > 1
flattens it. vLLM v1 then optionally filters the row: top-k keeps the k largest
logits, top-p (nucleus sampling, 核采样) keeps the smallest set of largest tokens
whose probability reaches p. A filtered entry becomes −∞, so its probability is
exactly 0 after the softmax. nano-vllm (bb823b3) implements temperature only. For
top-k and top-p, applied in that order, the course follows the sort-based
`apply_top_k_top_p_pytorch` of vLLM's `vllm/v1/sample/ops/topk_topp_sampler.py`.
vLLM does not always take that path: in newer versions of that file,
`apply_top_k_top_p` hands the filtering to a Triton kernel
(`vllm/v1/sample/ops/topk_topp_triton.py`) that finds each row's thresholds
without sorting the vocabulary, whenever Triton is available (in some versions
only for batches of 8 rows or more), and the sort path is left for the rest.

Then one token is *drawn* from p = softmax(processed logits). The course draws it
by the exponential race (指数竞赛), as nano-vllm's `Sampler`
(`nanovllm/layers/sampler.py`) and vLLM's PyTorch-native path (`random_sample` in
the same vLLM file, which avoids `torch.multinomial` because it makes the CPU wait
for the GPU) do. Draw E_i ~ Exp(1) independently for every token and take
argmax_i p_i / E_i. Since E_i / p_i is exponential with rate p_i, the smallest of
them belongs to token i with probability p_i: the winner is an exact sample from
p, computed with one division and one argmax over the row and no cumulative sums.
It is the same trick as Gumbel-max, since −log E is Gumbel-distributed. In the
course the caller hands in the noise, so a draw can be repeated and checked token
by token.

Not every vLLM path draws this way. On CUDA with FlashInfer, a batch with top-k or
top-p goes to FlashInfer's sampling kernels (`flashinfer_sample`, by rejection
sampling: the same distribution, not the same token for the same noise); the ROCm
path with aiter uses aiter's sampling kernels and calls `torch.multinomial` for
top-k alone; the CPU path runs the race or a fused Gumbel-max kernel. Which path
runs, and whether FlashInfer is on by default, has changed between versions of
`topk_topp_sampler.py`: the course's numbers are those of the native path.

采样 = 处理 logits(温度、top-k、top-p,过滤掉的位置置为 −∞)+ 指数竞赛 argmax(p / E)。
"""

import torch


def process_logits(logits: torch.Tensor, temperature: torch.Tensor, top_k: int | torch.Tensor | None = None,
                   top_p: float | torch.Tensor | None = None) -> torch.Tensor:
    """Temperature, then top-k, then top-p, row by row; filtered entries become −∞. Task ch23.1.

    The steps, for each row b, on float32 values:

    1. Temperature: z = logits[b] / temperature[b].
    2. Top-k (if given): let t be the k-th largest value of z. Every entry ≥ t
       stays (so ties at the threshold are all kept); every other entry becomes −∞.
       k = V keeps everything.
    3. Top-p (if given), on what top-k left: q = softmax(z). Entry i is removed
       when the probability of i and of all entries smaller than it adds up to
       ≤ 1 − p. Equivalently, i stays when the entries *larger* than i hold
       less than p. The entry whose probability crosses p therefore stays, and
       so does the row's largest entry. p = 1 keeps everything. The test is
       ≤, equality included: four equal entries with p = 0.5 keep two. Among
       equal entries the order of the sort decides which go (the checks
       accept any such choice).

    The provided first lines check the inputs and hand you k and p as one value
    per row (int64 [B] and float32 [B]), or None when that filter is off.

    This follows vLLM's `apply_top_k_top_p_pytorch`
    (`vllm/v1/sample/ops/topk_topp_sampler.py`). Temperature must be
    positive: like nano-vllm, the course has no greedy path. vLLM instead treats
    temperature < 1e-5 as greedy in a separate branch.

    Args:
        logits: [B, V] floating tensor (any float dtype; computed in float32).
        temperature: [B] floating tensor, every entry > 0.
        top_k: None (off), an int, or an int64 tensor [B] of per-row k, 1 ≤ k ≤ V.
        top_p: None (off), a float, or a float tensor [B] of per-row p, 0 < p ≤ 1.

    Returns:
        A new float32 tensor [B, V]: the kept entries hold logits / T, the
        filtered ones −∞. The inputs are not modified.

    Raises:
        ValueError: logits not a 2-D floating tensor; temperature not a [B]
            tensor or not all > 0; top_k not an int or an integer tensor of shape
            [B], or outside 1..V; top_p not a float or a float tensor of shape
            [B], or outside (0, 1].

    Example:
        >>> process_logits(torch.tensor([[2., 1., 0.]]), torch.tensor([0.5]))
        tensor([[4., 2., 0.]])
        >>> process_logits(torch.tensor([[2., 1., 0.]]), torch.tensor([0.5]), top_k=2)
        tensor([[4., 2., -inf]])
    """
    B, V = _check_rows(logits, temperature)
    k, p = _per_row_top_k(top_k, B, V), _per_row_top_p(top_p, B)      # None, or one value per row
    ### BEGIN SOLUTION
    temp = temperature.to(torch.float32)
    z = logits.to(torch.float32) / temp[:, None]
    if k is not None:
        kth = z.sort(dim=-1, descending=True).values.gather(1, (k - 1)[:, None])
        z = z.masked_fill(z < kth, float("-inf"))
    if p is not None:
        ascending, order = z.sort(dim=-1)
        mass = ascending.softmax(dim=-1).cumsum(dim=-1)      # mass of each entry and all smaller ones
        drop = mass <= (1 - p)[:, None]
        drop[:, -1] = False                                  # the largest entry always stays
        drop &= (p < 1)[:, None]                             # p = 1 is off
        z = z.masked_fill(torch.zeros_like(drop).scatter(1, order, drop), float("-inf"))
    return z
    ### END SOLUTION


def sample(logits: torch.Tensor, temperature: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """One token per row by the exponential race argmax(p / E). Task ch23.2.

    For each row b: p = softmax(logits[b] / temperature[b]) in float32, and the
    token is argmax_i p_i / E_i with E = noise[b]. Logits may come in bfloat16
    or float16 (a 16-bit LM head): upcast them first, as nano-vllm
    (`logits.float()`) and vLLM's sampler do, or probabilities closer than
    bfloat16 can tell round to one value and the race favours the lower index. If the E_i are i.i.d.
    Exp(1), the winner is token i with probability exactly p_i. It is *not*
    argmax p: a likely token with a large E can lose to a less likely one with
    a small E. Following nano-vllm, E is clamped to ≥ 1e-10 first, so E = 0
    cannot give 0/0 on a filtered (−∞) entry. nano-vllm draws E itself
    (`torch.empty_like(probs).exponential_()`); here the caller passes it in, so
    every draw can be repeated.

    Args:
        logits: [B, V] floating tensor; −∞ entries (filtered) have p = 0 and never win.
        temperature: [B] floating tensor, every entry > 0.
        noise: [B, V] floating tensor of Exp(1) draws, one per token.

    Returns:
        int64 tensor [B]: the drawn token of each row.

    Raises:
        ValueError: logits not a 2-D floating tensor; temperature not a [B]
            tensor or not all > 0; noise not a floating tensor of the logits' shape.

    Example:
        >>> sample(torch.tensor([[2., 1., 0.]]), torch.tensor([0.5]), torch.tensor([[3.0, 0.05, 1.0]]))
        tensor([1])
    """
    _check_rows(logits, temperature)
    _check_noise(noise, logits)
    ### BEGIN SOLUTION
    temp = temperature.to(torch.float32)
    probs = (logits.to(torch.float32) / temp[:, None]).softmax(dim=-1)
    return (probs / noise.to(torch.float32).clamp_min(1e-10)).argmax(dim=-1)
    ### END SOLUTION


# -- provided: the input checks every task needs but none teaches (not part of the exercise) ----------------------

def _check_rows(logits: torch.Tensor, temperature: torch.Tensor) -> tuple[int, int]:
    """Provided: raise ValueError unless logits is a 2-D floating tensor [B, V] and temperature a tensor [B] of
    values > 0 (like nano-vllm, the course has no greedy path); return (B, V)."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or not logits.is_floating_point():
        raise ValueError(f"logits must be a 2-D floating tensor [B, V]; got "
                         f"{logits.dtype if isinstance(logits, torch.Tensor) else type(logits).__name__} "
                         f"{list(logits.shape) if isinstance(logits, torch.Tensor) else ''}".rstrip())
    B, V = logits.shape
    if not isinstance(temperature, torch.Tensor) or temperature.shape != (B,):
        shape = list(temperature.shape) if isinstance(temperature, torch.Tensor) else type(temperature).__name__
        raise ValueError(f"temperature must be a tensor [B] = [{B}], one per row; got {shape}")
    if not bool((temperature.to(torch.float32) > 0).all()):
        raise ValueError(f"every temperature must be > 0 (no greedy path, as in nano-vllm); got "
                         f"{temperature.tolist()}")
    return B, V


def _per_row_top_k(top_k: int | torch.Tensor | None, B: int, V: int) -> torch.Tensor | None:
    """Provided: top_k as an int64 tensor [B], one k per row (None when top-k is off); raise ValueError unless it
    is an int or an integer tensor [B] (or a 0-d one) with every k in 1..V."""
    if top_k is None:
        return None
    if isinstance(top_k, torch.Tensor):
        if top_k.is_floating_point() or top_k.dtype == torch.bool or top_k.shape not in ((B,), ()):
            raise ValueError(f"top_k must be an int or an integer tensor [{B}]; got {top_k.dtype} "
                             f"{list(top_k.shape)}")
        k = top_k.to(torch.int64).expand(B)
    elif isinstance(top_k, int) and not isinstance(top_k, bool):
        k = torch.full((B,), top_k, dtype=torch.int64)
    else:
        raise ValueError(f"top_k must be an int or an integer tensor [{B}]; got {type(top_k).__name__}")
    if B and (int(k.min()) < 1 or int(k.max()) > V):
        raise ValueError(f"top_k must lie in 1..V = 1..{V}; got {k.tolist()}")
    return k


def _per_row_top_p(top_p: float | torch.Tensor | None, B: int) -> torch.Tensor | None:
    """Provided: top_p as a float32 tensor [B], one p per row (None when top-p is off); raise ValueError unless it
    is a float or a float tensor [B] (or a 0-d one) with every p in (0, 1]."""
    if top_p is None:
        return None
    if isinstance(top_p, torch.Tensor):
        if not top_p.is_floating_point() or top_p.shape not in ((B,), ()):
            raise ValueError(f"top_p must be a float or a float tensor [{B}]; got {top_p.dtype} {list(top_p.shape)}")
        p = top_p.to(torch.float32).expand(B)
    elif isinstance(top_p, (int, float)) and not isinstance(top_p, bool):
        p = torch.full((B,), float(top_p), dtype=torch.float32)
    else:
        raise ValueError(f"top_p must be a float or a float tensor [{B}]; got {type(top_p).__name__}")
    if not bool(((p > 0) & (p <= 1)).all()):
        raise ValueError(f"top_p must lie in (0, 1]; got {p.tolist()}")
    return p


def _check_noise(noise: torch.Tensor, logits: torch.Tensor) -> None:
    """Provided: raise ValueError unless noise is a floating tensor shaped like the logits (one E per token)."""
    if not isinstance(noise, torch.Tensor) or noise.shape != logits.shape or not noise.is_floating_point():
        shape = list(noise.shape) if isinstance(noise, torch.Tensor) else type(noise).__name__
        raise ValueError(f"noise must be a floating tensor shaped like the logits {list(logits.shape)}; got {shape}")
