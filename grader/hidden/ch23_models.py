"""ch23's wrong samplers and the exact-k reading of top-k, for the explanations of its checks (never shipped).

`grader.checks.ch23` names each misconception and compares; the values come from here, through
`grader.authoring.hidden_model` drivers, so a student release holds only those of its fixed instances.
"""

from __future__ import annotations

import torch

from grader.checks.ch23 import CLAMP, HALF_RACE, NEG_INF

HALF = (torch.bfloat16, torch.float16)


def race_variants(ref, logits: torch.Tensor, temperature: torch.Tensor, noise: torch.Tensor) -> dict:
    """{wrong sampler: the tokens it draws on the same noise}, by the names `grader.checks.ch23.RACE_HINTS` uses
    (uint8 tokens for a small vocabulary: the 4000-race check records them). The race in 16 bits is the right
    race where the logits are not 16-bit."""
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
            HALF_RACE: half_race(logits, temperature, noise) if logits.dtype in HALF else (p / e).argmax(-1),
        }
    small = logits.shape[-1] <= 256
    return {name: tokens.to(torch.uint8) if small else tokens for name, tokens in out.items()}


def strict_top_k(ref, scaled: torch.Tensor, ks: list[int]) -> torch.Tensor:
    """Top-k read as "exactly k indices" (ties cut): the scaled logits with all but k entries per row −∞."""
    keep = torch.zeros(scaled.shape, dtype=torch.bool)
    for b, k in enumerate(ks):
        keep[b, scaled[b].topk(k).indices] = True
    return scaled.masked_fill(~keep, NEG_INF)


def half_race(logits: torch.Tensor, temperature: torch.Tensor, noise: torch.Tensor, noise_too: bool = True) -> torch.Tensor:
    """The race never upcast: temperature, softmax and (`noise_too`) the division by E in the logits' own dtype."""
    dtype = logits.dtype
    p = (logits / temperature.to(dtype)[:, None]).softmax(-1)
    e = noise.to(dtype) if noise_too else noise.float()
    return (p / e.clamp_min(CLAMP)).argmax(-1)


def strict_top_p(ref, processed: torch.Tensor, ps: list[float]) -> torch.Tensor:
    """Top-p read with < instead of ≤ on already processed rows (each row's p; 1 is off): an entry goes only when it
    and the smaller entries hold strictly less than 1 − p."""
    out = processed.clone()
    for b, p in enumerate(ps):
        if p >= 1:
            continue
        ascending, order = processed[b].sort()
        drop = ascending.softmax(-1).cumsum(-1) < 1 - torch.tensor(p, dtype=torch.float32)
        drop[-1] = False
        out[b, order[drop]] = NEG_INF
    return out
