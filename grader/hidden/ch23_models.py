"""ch23's wrong samplers and the exact-k reading of top-k, for the explanations of its checks (never shipped).

`grader.checks.ch23` names each misconception and compares; the values come from here, through
`grader.authoring.hidden_model` drivers, so a student release holds only those of its fixed instances.
"""

from __future__ import annotations

import torch

from grader.checks.ch23 import CLAMP, NEG_INF


def race_variants(ref, logits: torch.Tensor, temperature: torch.Tensor, noise: torch.Tensor) -> dict:
    """{wrong sampler: the tokens it draws on the same noise}, by the names `grader.checks.ch23.RACE_HINTS` uses
    (uint8 tokens for a small vocabulary: the 4000-race check records them)."""
    z, T, e = logits.float(), temperature.float()[:, None], noise.float().clamp_min(CLAMP)
    p = (z / T).softmax(-1)
    with torch.no_grad():
        out = {
            "argmax(p)": p.argmax(-1),
            "argmax(E / p)": (e / p).argmax(-1),
            "argmax(p · E)": (p * e).argmax(-1),
            "the race on softmax(logits · T)": ((z * T).softmax(-1) / e).argmax(-1),
            "the race on softmax(logits) (temperature left out)": (z.softmax(-1) / e).argmax(-1),
            "argmax((logits / T) / E)": ((z / T) / e).argmax(-1),
            "the race with unclamped noise": (p / noise.float()).argmax(-1),
        }
    small = logits.shape[-1] <= 256
    return {name: tokens.to(torch.uint8) if small else tokens for name, tokens in out.items()}


def strict_top_k(ref, scaled: torch.Tensor, ks: list[int]) -> torch.Tensor:
    """Top-k read as "exactly k indices" (ties cut): the scaled logits with all but k entries per row −∞."""
    keep = torch.zeros(scaled.shape, dtype=torch.bool)
    for b, k in enumerate(ks):
        keep[b, scaled[b].topk(k).indices] = True
    return scaled.masked_fill(~keep, NEG_INF)
