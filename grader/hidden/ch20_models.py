"""ch20's models of RMSNorm, the fused add + norm, SiLU-and-mul and the SwiGLU MLP, with the variants a
misconception gives (never shipped).

`grader.checks.ch20` names each misconception and compares; the values come from here, through
`grader.authoring.hidden_model` drivers, so a student release holds only those of its fixed instances.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


def norm_model(
    x: torch.Tensor,
    w: torch.Tensor,
    eps: float = 1e-6,
    *,
    weight_first: bool = False,
    dim=-1,
    eps_outside: bool = False,
    center: bool = False,
) -> torch.Tensor:
    """RMSNorm in float32 (and its variants): over `dim`, eps inside or outside the root, centred or not."""
    xf = x.float()
    if center:
        xf = xf - xf.mean(dim=dim, keepdim=True)
    ms = xf.pow(2).mean(dim=dim, keepdim=True)
    normed = xf / (ms.sqrt() + eps) if eps_outside else xf * torch.rsqrt(ms + eps)
    return (normed * w.float()).to(x.dtype) if weight_first else (normed.to(x.dtype) * w).to(x.dtype)


def norm_variants(ref, x: torch.Tensor, w: torch.Tensor, eps: float) -> dict:
    """{misconception: rms_norm(x) as it computes it}, for `grader.checks.ch20.norm_hint`."""
    out = {
        "center": norm_model(x, w, eps, center=True),
        "dim 0": norm_model(x, w, eps, dim=0),
        "eps outside": norm_model(x, w, eps, eps_outside=True),
    }
    if x.dim() > 1:
        out["all dims"] = norm_model(x, w, eps, dim=tuple(range(x.dim())))
    if x.dtype != torch.float32:
        out["weight first"] = norm_model(x, w, eps, weight_first=True)
    out["no weight"] = norm_model(x, torch.ones_like(w), eps)
    xf = x.float()
    out["sum"] = (xf / xf.pow(2).sum(-1, keepdim=True).add(eps).sqrt() * w.float()).to(x.dtype)
    out["mean square"] = (xf / (xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)
    return out


def add_variants(ref, x: torch.Tensor, residual: torch.Tensor | None, w: torch.Tensor, eps: float) -> dict:
    """The normed outputs of add_rms_norm's misconceptions, for `grader.checks.ch20.add_hint`."""
    s = x.float() if residual is None else x.float() + residual.float()
    out: dict[str, Any] = {}
    if residual is not None:
        out["x alone"] = norm_model(x, w, eps)
    if x.dtype == torch.float32:
        out["norm"] = norm_variants(ref, s, w, eps)
    else:
        if residual is not None:
            out["rounded sum"] = norm_model(s.to(x.dtype), w, eps)
        out["weight first"] = norm_model(s, w, eps, weight_first=True).to(x.dtype)
    return out


def act_variants(ref, gu: torch.Tensor) -> dict:
    """{misconception: its activation of gate_up}, for `grader.checks.ch20.act_hint`."""
    g = gu.float()
    gate, up = g.chunk(2, dim=-1)
    odd, even = g[..., 0::2], g[..., 1::2]
    return {
        "halves swapped": F.silu(up) * gate,
        "even and odd": F.silu(odd) * even,
        "sigmoid": torch.sigmoid(gate) * up,
        "relu": F.relu(gate) * up,
        "gelu": F.gelu(gate) * up,
        "silu of up too": F.silu(gate) * F.silu(up),
        "no up": F.silu(gate),
    }


def mlp_models(ref, x: torch.Tensor, w_gu: torch.Tensor, w_down: torch.Tensor) -> dict:
    """The MLP's intermediates in float32 ("gate_up", "silu_gate", "act") for the derivation and the figure,
    and {misconception: output} for `grader.checks.ch20.mlp_hint`."""
    gu = F.linear(x.float(), w_gu.float())
    gate, up = gu.chunk(2, dim=-1)
    variants = {
        key: F.linear(act, w_down.float()).to(x.dtype) for key, act in act_variants(ref, gu).items() if act.shape[-1] == w_down.shape[1]
    }
    variants["no activation"] = F.linear(gu, w_down.float().repeat(1, 2)).to(x.dtype)
    return {"gate_up": gu, "silu_gate": F.silu(gate), "act": F.silu(gate) * up, "variants": variants}
