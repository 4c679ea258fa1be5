"""ch16's causal masks and the values a misconception of attention_steps gives (never shipped).

`grader.checks.ch16` names each misconception and compares; the values come from here, through
`grader.authoring.hidden_model` drivers, so a student release holds only those of its fixed instances.
"""

from __future__ import annotations

import math

import torch

NEG_INF = float("-inf")


def causal(T: int, S: int | None = None) -> torch.Tensor:
    """The end-aligned causal mask [T, S] (query i is the token at position S − T + i)."""
    S = T if S is None else S
    return torch.ones(T, S, dtype=torch.bool).tril(S - T)


def causal_mask(ref, T: int, S: int | None = None) -> torch.Tensor:
    """`causal` as a driver: the mask a public check passes as an input."""
    return causal(T, S)


def softmax_rows(s: torch.Tensor, dim: int = -1) -> torch.Tensor:
    e = (s - s.amax(dim=dim, keepdim=True)).exp()
    return e / e.sum(dim=dim, keepdim=True)


def steps_variants(
    ref, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float | None, want: dict
) -> dict:
    """{"scores" | "probs" | "out": {misconception: tensor}} for `grader.checks.ch16`'s hints; probs and out
    variants start from the expected scores and probs in `want`."""
    (T, d), S = q.shape, k.shape[0]
    raw = q.double() @ k.double().T
    scores = {"unscaled": raw, "1/d": raw / d}
    for n, name in ((S, "keys"), (T, "queries")):
        if n != d:
            scores[f"√{name}"] = raw * n**-0.5
    if scale is not None and not math.isclose(scale, d**-0.5):
        scores["default scale"] = raw * d**-0.5
    if T == S:
        scores["transposed"] = want["scores"].double().T
    s = want["scores"].double()
    allowed = torch.ones_like(s, dtype=torch.bool) if mask is None else mask
    probs = {"dim 0": softmax_rows(s.masked_fill(~allowed, NEG_INF), 0)}
    if not bool(allowed.all()):
        probs.update(
            {
                "masked after": softmax_rows(s).masked_fill(~allowed, 0.0),
                "mask inverted": softmax_rows(s.masked_fill(allowed, NEG_INF)),
                "no mask": softmax_rows(s),
            }
        )
    if not math.isclose(d**-0.5 if scale is None else scale, 1.0):
        probs["raw scores"] = softmax_rows(raw.masked_fill(~allowed, NEG_INF))
    p = want["probs"].double()
    out = {"scores @ v": s @ v.double()}
    if k.shape == v.shape:
        out["probs @ k"] = p @ k.double()
    if p.shape[0] == p.shape[1]:
        out["probs.T @ v"] = p.T @ v.double()
    return {"scores": scores, "probs": probs, "out": out}
