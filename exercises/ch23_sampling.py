# ch23 exercises: replace each TODO with your code, then run `course check ch23`.
"""采样 · sampling

After the forward pass the engine holds one row of logits per request, `[B, V]`,
and must turn each row into one next token. Sampling (采样) happens in two steps.

First the logits are *processed*. Each row is divided by its request's
temperature (温度) T: T < 1 sharpens the distribution softmax(logits / T), T > 1
flattens it. vLLM v1 then optionally filters the row: top-k keeps the k largest
logits, top-p (nucleus sampling, 核采样) keeps the smallest set of largest tokens
whose probability reaches p. A filtered entry becomes −∞, so its probability is
exactly 0 after the softmax. nano-vllm (bb823b3) implements temperature only; the
course follows vLLM v1's PyTorch-native path (`apply_top_k_top_p_pytorch`) for
top-k and top-p, applied in that order.

Then one token is *drawn* from p = softmax(processed logits). Neither nano-vllm nor
vLLM calls `torch.multinomial`: both use the exponential race (指数竞赛). Draw
E_i ~ Exp(1) independently for every token and take argmax_i p_i / E_i. Since
E_i / p_i is exponential with rate p_i, the smallest of them belongs to token i
with probability p_i: the winner is an exact sample from p, computed with one
division and one argmax over the row and no cumulative sums. It is the same trick
as Gumbel-max, since −log E is Gumbel-distributed. In the course the caller hands
in the noise, so a draw can be repeated and checked token by token.

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
       so does the row's largest entry. p = 1 keeps everything.

    This follows vLLM v1's `apply_top_k_top_p_pytorch`. Temperature must be
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
    # TODO(ch23.1): your code here (about 45 lines)
    raise NotImplementedError("ch23.1 process_logits: not implemented yet (about 45 lines)")


def sample(logits: torch.Tensor, temperature: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """One token per row by the exponential race argmax(p / E). Task ch23.2.

    For each row b: p = softmax(logits[b] / temperature[b]) in float32, and the
    token is argmax_i p_i / E_i with E = noise[b]. If the E_i are i.i.d.
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
    # TODO(ch23.2): your code here (about 14 lines)
    raise NotImplementedError("ch23.2 sample: not implemented yet (about 14 lines)")
