"""ch32's models of verification, of the draft count and of the exact product, for the explanations of its
public and hidden checks (never shipped).

`grader.checks.ch32` explains with what these return for one instance: the verdict and the race at every
position, what each classic mistake emits, the survivals, the float64 product and its rounding bound. Public
checks reach them through `grader.authoring.hidden_model` drivers, so a student release holds only those of its
fixed instances.
"""

from __future__ import annotations

from typing import Any

import torch

from grader.checks.ch32 import CLAMP, UNIT, VARIANTS, Case, near

TINY = {dtype: torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps for dtype in UNIT}
"""The spacing of each dtype's subnormal numbers (float16: 2⁻²⁴): below the smallest normal number a rounding
errs by up to half of it whatever the value, so every bound adds it beside its relative part."""

VARIANT_KNOBS: dict[str, dict[str, Any]] = {
    "no bonus": {"bonus": False},
    "no stop": {"stop": False},
    "rejected draft kept": {"keep_rejected": True},
    "replacement from p": {"recover": "p"},
    "residual q − p": {"recover": "reverse"},
    "ratio q/p": {"accept": "inverse"},
    "accept when u ≥ p/q": {"accept": "flipped"},
    "greedy": {"accept": "greedy", "recover": "argmax"},
    "next noise row": {"shift": 1},
    "bonus from row k − 1": {"bonus_row": 1},
    "unclamped noise": {"clamp": False},
    "q(x) = 0 accepted": {"accept": "q0"},
    "float16 arithmetic": {"low": True},
}
"""simulate's keywords for each classic mistake of `grader.checks.ch32.VARIANTS`."""


def race(weights: torch.Tensor, noise: torch.Tensor, clamp: bool = True, dtype: torch.dtype = torch.float64) -> tuple[int, torch.Tensor]:
    """The exponential race in float64 (or `dtype`): (winner, weights / E)."""
    scores = weights.to(dtype) / (noise.to(dtype).clamp_min(CLAMP) if clamp else noise.to(dtype))
    return int(scores.argmax()), scores


def simulate(
    c: Case,
    accept: str = "ratio",
    recover: str = "residual",
    stop: bool = True,
    bonus: bool = True,
    shift: int = 0,
    bonus_row: int = 0,
    clamp: bool = True,
    keep_rejected: bool = False,
    low: bool = False,
) -> list[int]:
    """Verification in float64, right (the defaults) or with one classic mistake (`low`: the residuals and races in
    the probabilities' own 16-bit dtype instead of float32, where a score p / E above 65504 is inf)."""
    dtype = torch.promote_types(c.p.dtype, c.q.dtype)
    dtype = dtype if low and dtype in (torch.float16, torch.bfloat16) else torch.float64
    p, q = c.p.to(dtype), c.q.to(dtype)
    out = []
    for i, x in enumerate(c.tokens):
        px, qx, u = float(p[i, x]), float(q[i, x]), float(c.u[i])
        ok = {
            "ratio": qx > 0 and u < min(1.0, px / qx),
            "inverse": px > 0 and u < min(1.0, qx / px),
            "flipped": qx > 0 and u >= min(1.0, px / qx),
            "greedy": x == int(p[i].argmax()),
            "q0": qx == 0 or u < min(1.0, px / qx),
        }[accept]
        if ok:
            out.append(x)
            continue
        weights = {"residual": (p[i] - q[i]).clamp_min(0), "p": p[i], "reverse": (q[i] - p[i]).clamp_min(0)}
        if keep_rejected:
            out.append(x)
        if recover == "argmax":
            out.append(int(p[i].argmax()))
        else:
            out.append(race(weights[recover], c.e[min(i + shift, c.k)], clamp, dtype)[0])
        if stop:
            return out
    if bonus:
        out.append(race(p[c.k - bonus_row], c.e[c.k - bonus_row], clamp, dtype)[0])
    return out


def verify_models(ref, c: Case) -> dict:
    """What `grader.checks.ch32.expect_emitted` explains with: at every position i < k the draft's verdict
    ("accept", "near" a tie, "ratio" min(1, p/q) or None when q(x) = 0) and the race on max(0, p − q); at
    position k the bonus race on p[k] ("weights", "scores" = weights / E, "winner"); "stop", the first
    rejected position (k if none); and "variants", what each classic mistake emits."""
    p, q = c.p.double(), c.q.double()
    positions = []
    for i in range(c.k + 1):
        weights = p[i] if i == c.k else (p[i] - q[i]).clamp_min(0)
        winner, scores = race(weights, c.e[i])
        pos = {"weights": weights, "scores": scores, "winner": winner}
        if i < c.k:
            x, u = c.tokens[i], float(c.u[i])
            px, qx = float(p[i, x]), float(q[i, x])
            ratio = min(1.0, px / qx) if qx > 0 else None
            pos.update(accept=ratio is not None and u < ratio, near=ratio is not None and near(u, ratio), ratio=ratio)
        positions.append(pos)
    stop = next((i for i, pos in enumerate(positions[: c.k]) if not pos["accept"]), c.k)
    return {"positions": positions, "stop": stop, "variants": {name: simulate(c, **VARIANT_KNOBS[name]) for name in VARIANTS}}


def count_models(ref, conf: list[float], threshold: float) -> dict:
    """The survivals (running products) of the confidences, and the counts the misreadings of
    `grader.checks.ch32.expect_count` give: each confidence alone, the survivals ≤ threshold."""
    out, s = [], 1.0
    for c in conf:
        s *= c
        out.append(s)
    k = len(conf)
    return {
        "survivals": out,
        "first alone below": next((j for j, c in enumerate(conf) if c < threshold), k),
        "alone at or above": sum(c >= threshold for c in conf),
        "first at or below": next((j for j, v in enumerate(out) if v <= threshold), k),
    }


def product_models(ref, x: torch.Tensor, w: torch.Tensor) -> dict:
    """x @ w in float64 ("exact"), the error a float32 (float64) accumulation and one cast may make ("bound"),
    and what the classic mistakes give: for 16-bit inputs the product accumulated in their own dtype ("low");
    `@` on float64 copies cast back ("upcast"); the fixed order with a fused multiply-add ("fma")."""
    K = x.shape[1]
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    exact = x.double() @ w.double()
    # Each of the K products and sums, and the final cast, errs by its relative unit or, among subnormals, by half
    # their spacing.
    relative = 2 * K * UNIT[acc] * (x.double().abs() @ w.double().abs()) + 2 * UNIT[x.dtype] * exact.abs()
    bound = relative + 2 * K * TINY[acc] + TINY[x.dtype] + 1e-30
    out = {"exact": exact, "bound": bound.float()}  # the bound needs no float64 precision
    if x.dtype in (torch.bfloat16, torch.float16):
        low = torch.zeros(x.shape[0], w.shape[1], dtype=x.dtype)
        for k in range(K):
            low = low + x[:, k : k + 1] * w[k]
        out["low"] = low
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    fma = torch.zeros(x.shape[0], w.shape[1], dtype=acc)
    xa, wa = x.to(acc), w.to(acc)
    for k in range(K):
        fma = torch.addcmul(fma, xa[:, k : k + 1], wa[k])
    out["fma"] = fma.to(x.dtype)
    if x.dtype != torch.float64:
        out["upcast"] = (x.double() @ w.double()).to(x.dtype)
    return out


def rms_models(ref, x: torch.Tensor, weight: torch.Tensor, eps: float, block: int) -> dict:
    """RMSNorm of every row in float64 ("exact") and the error the fixed split in float32 (float64) and one cast
    may make ("bound"); the split of each row ("squares", "chunk sums", "totals": the running total after each
    chunk); the accepted variant with torch.rsqrt ("rsqrt"); and what the classic mistakes give: the library's
    sum of the squares ("plain sum"), torch.sum inside each chunk ("chunk sum"), the cast to x's dtype before the
    weight multiply ("cast first"). "library orders" names those of the library's sums ("plain sum", "chunk sum")
    whose bits differ somewhere from every order written out by hand that the course knows (the fixed split, with
    1 / sqrt or rsqrt; left to right over the row; a halving tree over the whole row; left to right inside each
    chunk): an answer with exactly those bits in every batch left the order to the library."""
    B, H = x.shape
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    xd = x.double()
    exact = xd / torch.sqrt((xd * xd).mean(dim=1, keepdim=True) + eps) * weight.double()
    # Relative: the sum of H squares, the square root and the products, and the cast. Absolute: a product or the cast
    # that lands among subnormals errs by up to half their spacing (a float16 result below 2⁻¹⁴ is a multiple of 2⁻²⁴).
    absolute = TINY[x.dtype] + TINY[acc] * (2 + weight.double().abs())
    bound = (exact.abs() * ((H + 8) * UNIT[acc] + 2 * UNIT[x.dtype]) + absolute + 1e-30).float()
    xa = x.to(acc)
    squares = xa * xa
    chunks = []
    for start in range(0, H, block):
        chunk = squares[:, start : start + block]
        chunk = torch.cat([chunk, chunk.new_zeros(B, block - chunk.shape[1])], dim=1)
        while chunk.shape[1] > 1:
            chunk = chunk[:, : chunk.shape[1] // 2] + chunk[:, chunk.shape[1] // 2 :]
        chunks.append(chunk[:, 0])

    def running(parts: list[torch.Tensor]) -> torch.Tensor:
        total, out = torch.zeros(B, dtype=acc), []
        for part in parts:
            total = total + part
            out.append(total)
        return torch.stack(out, dim=1)

    totals = running(chunks)
    scale = lambda total, rsqrt=False: (torch.rsqrt if rsqrt else lambda v: 1 / torch.sqrt(v))(total / H + eps)
    final = lambda inv, first=False: (xa * inv[:, None]).to(x.dtype) * weight if first else (xa * inv[:, None] * weight.to(acc)).to(x.dtype)
    plain, chunk_sum = one_thread(lambda: (squares.sum(dim=1), running([c.sum(dim=1) for c in squares.split(block, dim=1)])[:, -1]))
    library = {"plain sum": final(scale(plain)), "chunk sum": final(scale(chunk_sum))}
    by_hand = [final(scale(totals[:, -1])), final(scale(totals[:, -1], True))]
    chunked = running([sequential(c) for c in squares.split(block, dim=1)])[:, -1]
    by_hand += [final(scale(total)) for total in (sequential(squares), chunked)]
    by_hand.append(final(scale(halving(squares))))
    return {
        "exact": exact,
        "bound": bound,
        "block": block,
        "squares": squares,
        "chunk sums": torch.stack(chunks, 1),
        "totals": totals,
        "rsqrt": final(scale(totals[:, -1], True)),
        **library,
        "cast first": final(scale(totals[:, -1]), True),
        "library orders": [key for key, out in library.items() if B and all(not torch.equal(out, mine) for mine in by_hand)],
    }


def sequential(parts: torch.Tensor) -> torch.Tensor:
    """Each row of parts [B, n] summed left to right (0 for n = 0)."""
    total = parts.new_zeros(parts.shape[0])
    for j in range(parts.shape[1]):
        total = total + parts[:, j]
    return total


def halving(parts: torch.Tensor) -> torch.Tensor:
    """Each row of parts [B, n] padded with zeros to a power of two and summed by halving."""
    width = 1 << max(parts.shape[1] - 1, 0).bit_length()
    parts = torch.cat([parts, parts.new_zeros(parts.shape[0], width - parts.shape[1])], dim=1)
    while parts.shape[1] > 1:
        parts = parts[:, : parts.shape[1] // 2] + parts[:, parts.shape[1] // 2 :]
    return parts[:, 0]


def one_thread(fn):
    """fn() on one thread, as the student's process runs (its library may split work by thread count)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn()
    finally:
        torch.set_num_threads(threads)


def plain_models(ref, x: torch.Tensor, w: torch.Tensor, batches: list[list[int]]) -> list[torch.Tensor]:
    """Plain x @ w of each batch of x's rows, on one thread: what leaving the order to the library gives."""
    return [one_thread(lambda idx=idx: x[idx] @ w) for idx in batches]


def plain_rms_models(ref, x: torch.Tensor, weight: torch.Tensor, eps: float, batches: list[list[int]]) -> list[torch.Tensor]:
    """RMSNorm of each batch of x's rows with the library's own mean of the squares, on one thread."""
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32

    def norm(rows: torch.Tensor) -> torch.Tensor:
        xa = rows.to(acc)
        return (xa * (1 / torch.sqrt((xa * xa).mean(dim=1, keepdim=True) + eps)) * weight.to(acc)).to(rows.dtype)

    return [one_thread(lambda idx=idx: norm(x[idx])) for idx in batches]
