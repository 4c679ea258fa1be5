"""ch19's models of RoPE and of the per-head norm, with the variants a misconception gives (never shipped).

`grader.checks.ch19` names each misconception and compares; the values come from here, through
`grader.authoring.hidden_model` drivers, so a student release holds only those of its fixed instances.
"""

from __future__ import annotations

import torch


def rotate(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, layout: str = "half", direction: int = 1, compute: torch.dtype = torch.float32
) -> torch.Tensor:
    """A rotation (and its wrong variants): pairs in `layout`, sin's sign `direction`, computed in `compute`."""
    c, s = cos.to(compute)[:, None, :], (direction * sin).to(compute)[:, None, :]
    xc = x.to(compute)
    if layout == "half":
        x1, x2 = xc.chunk(2, dim=-1)
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(x.dtype)
    x1, x2 = xc[..., 0::2], xc[..., 1::2]  # GPT-J: pairs (x[2j], x[2j + 1])
    return torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2).to(x.dtype)


def head_norm(x: torch.Tensor, w: torch.Tensor, eps: float, *, dim=-1, weight_first: bool = False) -> torch.Tensor:
    """q_norm / k_norm (and variants): RMSNorm over `dim` in float32."""
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(dim=dim, keepdim=True) + eps)
    return (normed * w.float()).to(x.dtype) if weight_first else (normed.to(x.dtype) * w).to(x.dtype)


def rope_tables(positions: list[int], d: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float) / d))
    angles = torch.tensor(positions, dtype=torch.float)[:, None] * inv
    return angles.cos(), angles.sin()


def cos_sin_variants(ref, positions: list[int], d: int, base: float) -> dict:
    """{misconception: (cos, sin)} for the wrong angle tables `grader.checks.ch19.cos_sin_hint` names."""
    p = torch.tensor(positions, dtype=torch.float64)[:, None]
    j = torch.arange(d // 2, dtype=torch.float64)
    inv = base ** (-2 * j / d)
    angles = {
        "j/d": p * base ** (-j / d),
        "inverted": p * base ** (2 * j / d),
        "1-based": (p + 1) * inv,
        "bf16": (p.bfloat16() * inv.bfloat16()).double(),
        "zero": p * 0,
    }
    return {key: (a.cos().float(), a.sin().float()) for key, a in angles.items()}


def rope_variants(ref, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> dict:
    """{misconception: y} for the wrong rotations `grader.checks.ch19.rope_hints` names."""
    out = {
        "interleaved": rotate(x, cos, sin, layout="interleaved"),
        "backwards": rotate(x, cos, sin, direction=-1),
        "interleaved backwards": rotate(x, cos, sin, layout="interleaved", direction=-1),
        "swapped": rotate(x, sin, cos),
        "swapped backwards": rotate(x, sin, cos, direction=-1),
    }
    if x.dtype != torch.float32:
        out["low precision"] = rotate(x, cos, sin, compute=x.dtype)
    x1, x2 = x.float().chunk(2, dim=-1)
    c, s = cos.float()[:, None], sin.float()[:, None]
    out["sign of y2"] = torch.cat((x1 * c - x2 * s, x2 * c - x1 * s), -1).to(x.dtype)
    out["sign of y1"] = torch.cat((x1 * c + x2 * s, x2 * c + x1 * s), -1).to(x.dtype)
    return out


def qk_models(ref, x: torch.Tensor, w: torch.Tensor, other_w: torch.Tensor, positions: list[int], base: float, eps: float) -> dict:
    """For one of q, k: its normalised heads ("normed"), the angles' "cos" and "sin", and {misconception: y}."""
    cos, sin = rope_tables(positions, x.shape[-1], base)
    rope = lambda z: rotate(z, cos, sin)
    variants = {
        "rotate first": head_norm(rope(x), w, eps),
        "no norm": rope(x),
        "no rope": head_norm(x, w, eps),
        "no weight": rope(head_norm(x, torch.ones_like(w), eps)),
        "other weight": rope(head_norm(x, other_w, eps)),
        "over heads": rope(head_norm(x, w, eps, dim=1)),
        "whole token": rope(head_norm(x.flatten(1), w.repeat(x.shape[1]), eps).view(x.shape)),
        "interleaved": rotate(head_norm(x, w, eps), cos, sin, layout="interleaved"),
    }
    if x.dtype != torch.float32:
        variants["weight in float32"] = rope(head_norm(x, w, eps, weight_first=True))
        variants["rotation in low precision"] = rotate(head_norm(x, w, eps), cos, sin, compute=x.dtype)
    return {"normed": head_norm(x, w, eps), "cos": cos, "sin": sin, "variants": variants}


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    num_cached: int,
    *,
    mask: str = "end",
    grouping: str = "consecutive",
    scaled: bool = True,
    compute: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Causal GQA attention computed in `compute` (and its wrong variants), [N, Hq, d]: query i at position
    num_cached + i; `mask` "end" (the offset rule), "top-left" (tril without offset) or "none"."""
    n, hq, d = q.shape
    group = hq // k.shape[1]
    spread = (lambda x: x.repeat_interleave(group, dim=1)) if grouping == "consecutive" else (lambda x: x.repeat(1, group, 1))
    keys, values = spread(k.to(compute)), spread(v.to(compute))
    scores = torch.einsum("nhd,shd->hns", q.to(compute), keys) * (d**-0.5 if scaled else 1.0)
    s = keys.shape[0]
    visible = {
        "end": torch.ones(n, s, dtype=torch.bool).tril(diagonal=s - n),
        "top-left": torch.ones(n, s, dtype=torch.bool).tril(),
        "none": torch.ones(n, s, dtype=torch.bool),
    }[mask]
    return torch.einsum("hns,shd->nhd", scores.masked_fill(~visible, float("-inf")).softmax(-1), values)


def attention_models(
    ref,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    wq: torch.Tensor,
    wk: torch.Tensor,
    base: float,
    eps: float,
    k_cache: torch.Tensor | None,
    v_cache: torch.Tensor | None,
) -> dict:
    """ch19.4 step by step: the "positions", the normalised and rotated "q", "k" (new tokens), the attention
    weights "probs" [Hq, N, C + N], and {misconception: output in q's dtype} for `grader.checks.ch19.attention_hint`."""
    n, _, d = q.shape
    c = 0 if k_cache is None else k_cache.shape[0]
    kc = k.new_zeros(0, *k.shape[1:]) if k_cache is None else k_cache
    vc = v.new_zeros(0, *v.shape[1:]) if v_cache is None else v_cache
    positions = list(range(c, c + n))

    def turn(x: torch.Tensor, at: list[int]) -> torch.Tensor:
        return rotate(x, *rope_tables(at, d, base))

    nq, nk = head_norm(q, wq, eps), head_norm(k, wk, eps)
    rq, rk = turn(nq, positions), turn(nk, positions)
    cat = lambda a, b: torch.cat((a, b))
    run = lambda qq, kk, vv, **kw: attend(qq, kk, vv, c, **kw).to(q.dtype)
    every = list(range(c + n))
    variants = {
        "rotated v": run(rq, cat(kc, rk), cat(vc, turn(v, positions))),
        "rotated cached v": run(rq, cat(kc, rk), turn(cat(vc, v), every)),
        "normed v": run(rq, cat(kc, rk), cat(vc, head_norm(v, wk, eps))),
        "v like k": run(rq, cat(kc, rk), cat(vc, turn(head_norm(v, wk, eps), positions))),
        "only q": run(rq, cat(kc, nk), cat(vc, v)),
        "only k": run(nq, cat(kc, rk), cat(vc, v)),
        "after attention": turn(attend(nq, cat(kc, nk), cat(vc, v), c), positions).to(q.dtype),
        "no offset": run(turn(nq, list(range(n))), cat(kc, turn(nk, list(range(n)))), cat(vc, v)),
        "cache rotated again": run(rq, cat(turn(kc, list(range(c))), rk), cat(vc, v)),
        "top-left mask": run(rq, cat(kc, rk), cat(vc, v), mask="top-left"),
        "no mask": run(rq, cat(kc, rk), cat(vc, v), mask="none"),
        "grouped by repeat": run(rq, cat(kc, rk), cat(vc, v), grouping="repeat"),
        "no scale": run(rq, cat(kc, rk), cat(vc, v), scaled=False),
    }
    if q.dtype != torch.float32:
        variants["attention in low precision"] = run(rq, cat(kc, rk), cat(vc, v), compute=q.dtype)
    keys = cat(kc, rk).float().repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scores = torch.einsum("nhd,shd->hns", rq.float(), keys) * d**-0.5
    visible = torch.ones(n, c + n, dtype=torch.bool).tril(diagonal=c)
    probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
    return {"positions": positions, "q": rq, "k": rk, "probs": probs, "variants": variants}
