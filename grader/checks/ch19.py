"""Public checks of ch19 · rotary position embedding, and the messages they share with the hidden ones.

The rotations, angle tables and norms a misconception gives (and the normalised q, k of a derivation) come
from the hidden side's models (`cos_sin_variants`, `rope_variants`, `qk_models`, `attention_models`), asked for
before comparing. The input checks of the reference are provided code, tested in tests/test_ch19.py, not graded.
"""

from __future__ import annotations

import math

import torch

from grader.authoring import CheckFailed, Hint, Trial, describe, expect_tensor, fmt, hidden_model, mistakes, public, short, vec, wrong_mask
from grader.i18n import tr

# ch19-rope-pair: the worked example of reference/nanovllm.md §4 at positions 0, 1, 2.
PAIR_X, PAIR_POSITIONS, PAIR_D, PAIR_BASE = [1.0, 2.0, 3.0, 4.0], [0, 1, 2], 4, 10000.0

# ch19-nanovllm-order: one token at position 1, 2 query heads over 1 K/V head, d = 4.
ORDER_Q = [[[1.0, 2.0, 3.0, 4.0], [2.0, -1.0, 0.0, 1.0]]]
ORDER_K = [[[1.0, 0.0, -1.0, 2.0]]]
ORDER_V = [[[0.5, -1.0, 2.0, 1.0]]]
ORDER_QW, ORDER_KW = [1.0, 0.5, 2.0, 1.0], [0.5, 1.0, 1.0, 2.0]
ORDER_POSITIONS, ORDER_BASE, EPS = [1], 10000.0, 1e-6
# ch19.4 on the same token: it is at position 1 because one earlier token is cached (its key normalised and rotated).
ORDER_K_CACHE = [[[0.5, 1.0, -1.0, 0.5]]]
ORDER_V_CACHE = [[[1.0, 2.0, -1.0, 0.0]]]

ATOL = RTOL = 1e-5  # float32 results
ATTN_TOL = 1e-4  # float32 attention: scores, softmax and a weighted sum (any order of summation)
ROUNDING_SHARE = 0.02  # bf16: at most this share of elements may differ by one rounding step

M = mistakes("ch19")

cos_sin_variants = hidden_model("ch19_models.cos_sin_variants")
"""`t.ref.drive(cos_sin_variants, positions, d, base)`: {misconception: (cos, sin)}."""
rope_variants = hidden_model("ch19_models.rope_variants")
"""`t.ref.drive(rope_variants, x, cos, sin)`: {misconception: rotated x}."""
qk_models = hidden_model("ch19_models.qk_models")
"""`t.ref.drive(qk_models, x, w, other_w, positions, base, eps)`: normalised heads, cos, sin, {misconception: y}."""
attention_models = hidden_model("ch19_models.attention_models")
"""`t.ref.drive(attention_models, q, k, v, wq, wk, base, eps, k_cache, v_cache)`: positions, rotated q and k,
attention weights, {misconception: output}."""


# -- ch19.1 rope_cos_sin ------------------------------------------------------------------------------


@public("ch19.1", "figure instance: positions 0, 1, 2 at head_dim 4, base 10000")
def cos_sin_figure_instance(t: Trial) -> None:
    got = t.yours.rope_cos_sin(torch.tensor(PAIR_POSITIONS), PAIR_D, PAIR_BASE)
    want = t.ref.rope_cos_sin(PAIR_POSITIONS, PAIR_D, PAIR_BASE)
    variants = t.ref.drive(cos_sin_variants, PAIR_POSITIONS, PAIR_D, PAIR_BASE)
    if (
        type(got) in (tuple, list)
        and len(got) == 2
        and all(isinstance(g, torch.Tensor) and list(g.shape) == [3, 2] and g.dtype == torch.float32 for g in got)
    ):
        atol = angle_atol(PAIR_POSITIONS)
        t.figure(
            "ch19-rope-pair",
            positions=PAIR_POSITIONS,
            head_dim=PAIR_D,
            base=PAIR_BASE,
            cos=got[0],
            sin=got[1],
            cos_expected=want[0],
            sin_expected=want[1],
            cos_wrong=wrong_mask(got[0], want[0], atol=atol),
            sin_wrong=wrong_mask(got[1], want[1], atol=atol),
        )
    expect_cos_sin(got, PAIR_POSITIONS, PAIR_D, PAIR_BASE, want, tr("figure instance"), variants)


@public("ch19.1", "Qwen3: head_dim 128, base 1,000,000, positions 0–7")
def qwen3_cos_sin(t: Trial) -> None:
    run_cos_sin_case(t, list(range(8)), 128, 1e6, tr("Qwen3, positions 0–7"))


@public("ch19.1", "positions as a list, out of order (a chunk after a prefix)")
def list_positions(t: Trial) -> None:
    run_cos_sin_case(t, [7, 5, 6, 100], 8, 10000.0, tr("positions [7, 5, 6, 100]"), as_tensor=False)


@public("ch19.1", "no positions at all")
def no_positions(t: Trial) -> None:
    got = t.yours.rope_cos_sin(torch.zeros(0, dtype=torch.int64), 8, 10000.0)
    want = t.ref.rope_cos_sin([], 8, 10000.0)
    expect_cos_sin(got, [], 8, 10000.0, want, tr("no positions"), t.ref.drive(cos_sin_variants, [], 8, 10000.0))


# -- ch19.2 apply_rope --------------------------------------------------------------------------------


@public("ch19.2", "figure instance: x = [1, 2, 3, 4] at positions 0, 1, 2 (d = 4, base 10000)")
def rope_figure_instance(t: Trial) -> None:
    x = torch.tensor(PAIR_X).expand(len(PAIR_POSITIONS), 1, PAIR_D).contiguous()
    cos, sin = t.ref.rope_cos_sin(PAIR_POSITIONS, PAIR_D, PAIR_BASE)
    y = expect_rotated(t.yours.apply_rope(x, cos, sin), x)
    want = t.ref.apply_rope(x, cos, sin)
    variants = t.ref.drive(rope_variants, x, cos, sin)
    t.figure("ch19-rope-pair", x=PAIR_X, rotated=y[:, 0], expected=want[:, 0], wrong=wrong_values(y, want)[:, 0])
    explain_rotated(y, want, x, cos, sin, tr("figure instance"), PAIR_POSITIONS, variants)


@public("ch19.2", "two tokens, three heads: each token's angles rotate all its heads")
def heads_share_angles(t: Trial) -> None:
    run_rope_case(t, torch.randn(2, 3, 8, generator=t.rng), [3, 10], 10000.0, tr("2 tokens at positions 3, 10, 3 heads"))


@public("ch19.2", "position 0 leaves x unchanged")
def position_zero(t: Trial) -> None:
    run_rope_case(t, torch.randn(1, 2, 6, generator=t.rng), [0], 10000.0, tr("position 0"))


@public("ch19.2", "bf16 queries: rotated in float32, cast back to bf16")
def bf16_rope(t: Trial) -> None:
    x = (torch.randn(16, 4, 64, generator=t.rng) * 4).bfloat16()
    run_rope_case(t, x, list(range(100, 116)), 1e6, tr("16 bf16 tokens at positions 100–115"))


# -- ch19.3 qk_norm_rope ------------------------------------------------------------------------------


@public("ch19.3", "figure instance: one token at position 1, 2 query heads, 1 K/V head (d = 4)")
def order_figure_instance(t: Trial) -> None:
    q, k = torch.tensor(ORDER_Q), torch.tensor(ORDER_K)
    wq, wk = torch.tensor(ORDER_QW), torch.tensor(ORDER_KW)
    got = t.yours.qk_norm_rope(q, k, wq, wk, torch.tensor(ORDER_POSITIONS), ORDER_BASE, EPS)
    yq, yk = expect_qk(got, q, k)
    want_q, want_k = t.ref.qk_norm_rope(q, k, wq, wk, ORDER_POSITIONS, ORDER_BASE, EPS)
    models_q = t.ref.drive(qk_models, q, wq, wk, ORDER_POSITIONS, ORDER_BASE, EPS)
    models_k = t.ref.drive(qk_models, k, wk, wq, ORDER_POSITIONS, ORDER_BASE, EPS)
    t.figure(
        "ch19-nanovllm-order",
        q=q[0],
        k=k[0],
        v=ORDER_V[0],
        q_weight=ORDER_QW,
        k_weight=ORDER_KW,
        position=ORDER_POSITIONS[0],
        base=ORDER_BASE,
        q_normed=models_q["normed"][0],
        k_normed=models_k["normed"][0],
        q_out=yq[0],
        k_out=yk[0],
        q_expected=want_q[0],
        k_expected=want_k[0],
        q_wrong=wrong_values(yq, want_q)[0],
        k_wrong=wrong_values(yk, want_k)[0],
    )
    explain_qk("q", yq, want_q, q, wq, wk, ORDER_POSITIONS, ORDER_BASE, EPS, tr("figure instance"), models_q)
    explain_qk("k", yk, want_k, k, wk, wq, ORDER_POSITIONS, ORDER_BASE, EPS, tr("figure instance"), models_k)


@public("ch19.3", "the order: normalise, then rotate (weights that tell the orders apart)")
def order_matters(t: Trial) -> None:
    q, k = torch.randn(3, 2, 8, generator=t.rng), torch.randn(3, 1, 8, generator=t.rng)
    wq = torch.tensor([2.0, 1.0, 0.5, 1.0, 0.25, 1.5, 1.0, 3.0])
    run_qk_case(t, q, k, wq, wq.flip(0), [5, 6, 7], 10000.0, tr("3 tokens at positions 5–7"))


@public("ch19.3", "GQA shapes: 4 query heads, 2 K/V heads, base 1,000,000")
def gqa_shapes(t: Trial) -> None:
    q, k = torch.randn(4, 4, 16, generator=t.rng) * 3, torch.randn(4, 2, 16, generator=t.rng) * 3
    run_qk_case(t, q, k, random_weight(t, 16), random_weight(t, 16), [0, 1, 2, 3], 1e6, tr("4 tokens, Hq=4, Hkv=2"))


@public("ch19.3", "bf16 q and k, as in nano-vllm")
def bf16_qk(t: Trial) -> None:
    q = (torch.randn(5, 4, 32, generator=t.rng) * 2).bfloat16()
    k = (torch.randn(5, 2, 32, generator=t.rng) * 2).bfloat16()
    run_qk_case(
        t,
        q,
        k,
        random_weight(t, 32, torch.bfloat16),
        random_weight(t, 32, torch.bfloat16),
        [11, 12, 13, 14, 15],
        1e6,
        tr("5 bf16 tokens at positions 11–15"),
    )


# -- ch19.4 rope_attention ----------------------------------------------------------------------------


@public("ch19.4", "figure instance: the same token at position 1, after one cached token")
def attention_figure_instance(t: Trial) -> None:
    q, k, v = torch.tensor(ORDER_Q), torch.tensor(ORDER_K), torch.tensor(ORDER_V)
    wq, wk = torch.tensor(ORDER_QW), torch.tensor(ORDER_KW)
    k_cache, v_cache = torch.tensor(ORDER_K_CACHE), torch.tensor(ORDER_V_CACHE)
    got = t.yours.rope_attention(q, k, v, wq, wk, ORDER_BASE, EPS, k_cache, v_cache)
    y = expect_attention(got, q)
    want = t.ref.rope_attention(q, k, v, wq, wk, ORDER_BASE, EPS, k_cache, v_cache)
    models = t.ref.drive(attention_models, q, k, v, wq, wk, ORDER_BASE, EPS, k_cache, v_cache)
    qk = t.ref.qk_norm_rope(q, k, wq, wk, models["positions"], ORDER_BASE, EPS)
    mistake = attention_mistake(y, want, models["variants"])
    t.figure(
        "ch19-nanovllm-order",
        k_cache=[x[0] for x in ORDER_K_CACHE],
        v_cache=[x[0] for x in ORDER_V_CACHE],
        attn_out=y[0],
        attn_expected=want[0],
        attn_wrong=wrong_values(y, want, ATTN_TOL, ATTN_TOL)[0],
        attn_probs=models["probs"][:, 0],
        attn_stage=STAGES.get(mistake, ""),
        attn_mistake=mistake,
    )
    explain_attention(t, y, want, q, k, v, wq, wk, ORDER_BASE, EPS, k_cache, v_cache, tr("figure instance"), models, qk)


@public("ch19.4", "a prefill of 5 tokens, no cache: 4 query heads over 2 K/V heads")
def attention_prefill(t: Trial) -> None:
    q, k, v = (torch.randn(5, h, 8, generator=t.rng) * 2 for h in (4, 2, 2))
    run_attention_case(
        t, q, k, v, random_weight(t, 8), random_weight(t, 8), 10000.0, None, None, tr("a prefill of 5 tokens at positions 0–4, Hq=4, Hkv=2")
    )


@public("ch19.4", "a decode step: one token after 6 cached tokens")
def attention_decode(t: Trial) -> None:
    q, k, v = (torch.randn(1, h, 8, generator=t.rng) * 2 for h in (2, 1, 1))
    k_cache, v_cache = cached(t, 6, 1, 8, 10000.0)
    run_attention_case(
        t,
        q,
        k,
        v,
        random_weight(t, 8),
        random_weight(t, 8),
        10000.0,
        k_cache,
        v_cache,
        tr("a decode step: 6 cached tokens, the new one at position 6"),
    )


@public("ch19.4", "a chunk of 3 tokens after a cached prefix of 4 (positions 4–6)")
def attention_chunk(t: Trial) -> None:
    q, k, v = (torch.randn(3, h, 16, generator=t.rng) * 2 for h in (4, 2, 2))
    k_cache, v_cache = cached(t, 4, 2, 16, 1e6)
    run_attention_case(
        t,
        q,
        k,
        v,
        random_weight(t, 16),
        random_weight(t, 16),
        1e6,
        k_cache,
        v_cache,
        tr("a chunk at positions 4–6 after 4 cached tokens, Hq=4, Hkv=2, base 1,000,000"),
    )


@public("ch19.4", "bf16, as in nano-vllm: a decode step after 12 cached tokens, head_dim 64")
def attention_bf16(t: Trial) -> None:
    q = (torch.randn(1, 4, 64, generator=t.rng) * 2).bfloat16()
    k, v = ((torch.randn(1, 2, 64, generator=t.rng) * 2).bfloat16() for _ in range(2))
    k_cache, v_cache = cached(t, 12, 2, 64, 1e6)
    run_attention_case(
        t,
        q,
        k,
        v,
        random_weight(t, 64, torch.bfloat16),
        random_weight(t, 64, torch.bfloat16),
        1e6,
        k_cache.bfloat16(),
        v_cache.bfloat16(),
        tr("12 cached tokens, the new one at position 12, bf16"),
    )


# -- helpers: values in float32 or bf16 (ch20 compares with these too) --------------------------------------


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def ulp(x: torch.Tensor) -> torch.Tensor:
    """One rounding step of a 16-bit float at each value's magnitude (8 bits of mantissa for bf16)."""
    bits = 8 if x.dtype == torch.bfloat16 else 11
    _, e = torch.frexp(x.float().abs().clamp_min(1e-30))
    return torch.ldexp(torch.ones_like(x, dtype=torch.float), e - bits)


def wrong_values(got: torch.Tensor, want: torch.Tensor, atol: float = ATOL, rtol: float = RTOL) -> torch.Tensor:
    """True where `got` is off: beyond the tolerance (float32), or more than one rounding step (bf16/fp16)."""
    if want.dtype in (torch.bfloat16, torch.float16):
        step = torch.maximum(ulp(want), ulp(got))
        return ~((got.float() - want.float()).abs() <= step + 1e-6) & ~(got.isnan() & want.isnan())
    return wrong_mask(got, want, atol=atol, rtol=rtol)


def rounding_share(got: torch.Tensor, want: torch.Tensor) -> float:
    """bf16/fp16: the share of elements whose bits differ from the reference (0 for float32)."""
    if want.dtype not in (torch.bfloat16, torch.float16) or not want.numel():
        return 0.0
    return float((got != want).float().mean())


def agrees(got: torch.Tensor, want: torch.Tensor, atol: float = 1e-4, rtol: float = 1e-4) -> bool:
    """Whether a variant reproduces the student's values (used to name a misconception)."""
    if got.shape != want.shape:
        return False
    if want.dtype in (torch.bfloat16, torch.float16):
        return not wrong_values(got, want).any() and rounding_share(got, want) <= ROUNDING_SHARE
    return torch.allclose(got.double(), want.double(), atol=atol, rtol=rtol)


def rounding_failure(what: str, share: float, hint: str | list[Hint] = "") -> CheckFailed:
    """Every value within one rounding step, but too many rounded differently; `hint` names the mistake that
    does it (a `Hint`), else the general advice."""
    return CheckFailed(
        tr(
            "{what}: every value is within one bf16 rounding step of the reference, but {share} "
            "of them are rounded differently (a faithful float32 computation rounded once at the "
            "end differs in at most {most})",
            what=what,
            share=f"{share:.0%}",
            most=f"{ROUNDING_SHARE:.0%}",
        ),
        hint=hint or tr("compute in float32 and cast to bf16 once, at the end, as nano-vllm does"),
    )


def par(v: float) -> str:
    """A number inside a formula: negatives in parentheses."""
    return f"({fmt(v)})" if v < 0 else fmt(v)


# -- helpers: ch19.1, the angle tables ----------------------------------------------------------------------


def angle_atol(positions: list[int]) -> float:
    """float32 angles p·θ carry an error of about p·2⁻²⁴; allow it (float64 angles pass too)."""
    return 1e-5 + 3e-7 * max(positions, default=0)


def run_cos_sin_case(
    t: Trial, positions: list[int], d: int, base: float, case: str, *, as_tensor: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    arg = torch.tensor(positions, dtype=torch.int64) if as_tensor else list(positions)
    got = t.yours.rope_cos_sin(arg, d, base)
    want = t.ref.rope_cos_sin(positions, d, base)
    return expect_cos_sin(got, positions, d, base, want, case, t.ref.drive(cos_sin_variants, positions, d, base))


def expect_cos_sin(
    got, positions: list[int], d: int, base: float, want: tuple[torch.Tensor, torch.Tensor], case: str, variants: dict | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Require (cos, sin) as two float32 [N, d/2] tensors equal to the reference's, explaining the first miss
    (`variants`: `cos_sin_variants`' answer; asked of the hidden side when needed if not given)."""
    n, half = len(positions), d // 2
    if type(got) not in (tuple, list) or len(got) != 2:
        raise CheckFailed(
            tr(
                "expected (cos, sin) for {n} positions at head_dim {d} as a tuple of two float32 tensors [{n}, {half}]; yours: {yours}",
                n=n,
                d=d,
                half=half,
                yours=describe(got),
            )
        )
    out = []
    for name, g in zip(("cos", "sin"), got):
        if isinstance(g, torch.Tensor) and list(g.shape) == [n, d]:
            raise CheckFailed(
                tr(
                    "expected {name} as a 2-D float32 tensor of shape [{n}, {half}]; yours: {yours}",
                    name=name,
                    n=n,
                    half=half,
                    yours=describe(g),
                ),
                hint=M.full_width.format(d=d, half=half),
            )
        what = tr("{name} ({n} positions × d/2 = {half} pairs)", name=name, n=n, half=half)
        out.append(expect_tensor(g, what=what, shape=[n, half], dtype=torch.float32))
    atol = angle_atol(positions)
    for name, g, w in zip(("cos", "sin"), out, want):
        bad = wrong_mask(g, w, atol=atol)
        if not bad.any():
            continue
        i, j = (int(v) for v in bad.nonzero()[0])
        p = positions[i]
        inv = 1.0 / base ** (2 * j / d)
        variants = variants if variants is not None else cos_sin_variants(None, positions, d, base)
        raise CheckFailed(
            tr(
                'case "{case}": positions {positions}, head_dim {d}, base {base}',
                case=case,
                positions=short(positions, limit=10),
                d=d,
                base=fmt(base, 8),
            ),
            tr(
                "pair j = {j}: inv_freq[{j}] = 1 / {base}^(2·{j}/{d}) = {inv}; position {p} → angle {p} · {inv} = {angle} rad",
                j=j,
                base=fmt(base, 8),
                d=d,
                inv=fmt(inv, 6),
                p=p,
                angle=fmt(p * inv, 6),
            ),
            tr(
                "{name}[{i}, {j}] = {name}({angle}) = {expected}; yours: {yours} ({count} of {total} {name} values differ beyond {atol})",
                name=name,
                i=i,
                j=j,
                angle=fmt(p * inv, 6),
                expected=fmt(w[i, j], 6),
                yours=fmt(g[i, j], 6),
                count=int(bad.sum()),
                total=bad.numel(),
                atol=f"{atol:.2g}",
            ),
            hint=cos_sin_hint(out[0], out[1], want, atol, variants),
        )
    return out[0], out[1]


def cos_sin_hint(cos: torch.Tensor, sin: torch.Tensor, want: tuple[torch.Tensor, torch.Tensor], atol: float, variants: dict) -> str:
    """The misconception that reproduces the student's (cos, sin), or ''."""
    close = lambda a, b: not wrong_mask(a, b, atol=max(atol, 1e-4)).any()
    if close(cos, want[1]) and close(sin, want[0]):
        return M.sin_cos_order
    whys = [
        ("j/d", M.exponent_j_over_d),
        ("inverted", M.inverted_frequencies),
        ("1-based", M.one_based),
        ("bf16", M.bf16_angles),
        ("zero", M.zero_angles),
    ]
    return next((why for key, why in whys if close(cos, variants[key][0]) and close(sin, variants[key][1])), "")


# -- helpers: ch19.2, the rotation --------------------------------------------------------------------------


def run_rope_case(t: Trial, x: torch.Tensor, positions: list[int], base: float, case: str) -> torch.Tensor:
    """Rotate x with the reference's cos/sin through the student's apply_rope; compare with the reference."""
    cos, sin = t.ref.rope_cos_sin(positions, x.shape[-1], base)
    y = expect_rotated(t.yours.apply_rope(x, cos, sin), x)
    want = t.ref.apply_rope(x, cos, sin)
    explain_rotated(y, want, x, cos, sin, case, positions, t.ref.drive(rope_variants, x, cos, sin))
    return y


def expect_rotated(got, x: torch.Tensor, what: str = "") -> torch.Tensor:
    n, h, d = x.shape
    what = tr("{what} ({n} tokens × {h} heads × head_dim {d}, in x's dtype)", what=what or tr("the rotated x"), n=n, h=h, d=d)
    return expect_tensor(got, what=what, shape=[n, h, d], dtype=x.dtype)


def explain_rotated(
    y: torch.Tensor,
    want: torch.Tensor,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    case: str,
    positions: list[int] | None = None,
    variants: dict | None = None,
) -> None:
    """Raise a teaching message at the first wrong element: its pair, the angle's cos/sin and the formula
    (`variants`: `rope_variants`' answer; asked of the hidden side when needed if not given)."""
    bad = wrong_values(y, want)
    hints = lambda: rope_hints(y, x, variants if variants is not None else rope_variants(None, x, cos, sin))
    n, h, d = x.shape
    head = tr(
        'case "{case}": x [{n}, {h}, {d}] {dtype}, pairs (x[j], x[j + {half}])',
        case=case,
        n=n,
        h=h,
        d=d,
        dtype=dtype_name(x.dtype),
        half=d // 2,
    )
    if not bad.any():
        share = rounding_share(y, want)
        if share > ROUNDING_SHARE:
            named = hints()
            raise rounding_failure(head, share, named)
        return
    t, hh, i = (int(v) for v in bad.nonzero()[0])
    half = d // 2
    j = i % half
    a, b = float(x[t, hh, j]), float(x[t, hh, j + half])
    c, s = float(cos[t, j]), float(sin[t, j])
    if i < half:
        formula = f"y[{i}] = x[{j}]·cos − x[{j + half}]·sin = {par(a)}·{par(c)} − {par(b)}·{par(s)}"
    else:
        formula = f"y[{i}] = x[{i}]·cos + x[{j}]·sin = {par(b)}·{par(c)} + {par(a)}·{par(s)}"
    named = hints()
    pair = dict(hh=hh, i=i, j=j, j2=j + half, a=fmt(a), b=fmt(b), t=t, c=fmt(c), s=fmt(s))
    raise CheckFailed(
        head,
        tr(
            "token {t} (position {p}), head {hh}, channel {i} belongs to pair {j} = (x[{j}], x[{j2}]) = ({a}, {b}); "
            "cos[{t}, {j}] = {c}, sin[{t}, {j}] = {s}",
            p=positions[t],
            **pair,
        )
        if positions
        else tr(
            "token {t}, head {hh}, channel {i} belongs to pair {j} = (x[{j}], x[{j2}]) = ({a}, {b}); "
            "cos[{t}, {j}] = {c}, sin[{t}, {j}] = {s}",
            **pair,
        ),
        tr(
            "{formula} = {expected}; yours: {yours} ({count} of {total} values differ)",
            formula=formula,
            expected=fmt(want[t, hh, i]),
            yours=fmt(y[t, hh, i]),
            count=int(bad.sum()),
            total=bad.numel(),
        ),
        hint=named,
    )


def rope_hints(y: torch.Tensor, x: torch.Tensor, variants: dict) -> list[Hint]:
    """The mistakes whose rotation (`rope_variants`' answer) reproduces the student's ([] when none does)."""
    whys = [
        ("interleaved", [M.interleaved]),
        ("backwards", [M.backwards]),
        ("interleaved backwards", [M.interleaved, M.backwards]),
        ("swapped", [M.swapped_tables]),
        ("swapped backwards", [M.swapped_tables]),
        ("low precision", [M.low_precision.format(dtype=dtype_name(x.dtype))]),
        ("sign of y2", [M.one_sign]),
        ("sign of y1", [M.one_sign]),
    ]
    return next((why for key, why in whys if key in variants and agrees(y, variants[key])), [])


# -- helpers: ch19.3, norm then rotation --------------------------------------------------------------------


def run_qk_case(
    t: Trial,
    q: torch.Tensor,
    k: torch.Tensor,
    wq: torch.Tensor,
    wk: torch.Tensor,
    positions: list[int],
    base: float,
    case: str,
    eps: float = EPS,
) -> tuple[torch.Tensor, torch.Tensor]:
    got = t.yours.qk_norm_rope(q, k, wq, wk, torch.tensor(positions), base, eps)
    yq, yk = expect_qk(got, q, k)
    want_q, want_k = t.ref.qk_norm_rope(q, k, wq, wk, positions, base, eps)
    models_q = t.ref.drive(qk_models, q, wq, wk, positions, base, eps)
    models_k = t.ref.drive(qk_models, k, wk, wq, positions, base, eps)
    explain_qk("q", yq, want_q, q, wq, wk, positions, base, eps, case, models_q)
    explain_qk("k", yk, want_k, k, wk, wq, positions, base, eps, case, models_k)
    return yq, yk


def expect_qk(got, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if type(got) not in (tuple, list) or len(got) != 2:
        raise CheckFailed(
            tr("expected (q, k) as a tuple of two tensors shaped like the inputs; yours: {yours}", yours=describe(got)),
            hint=M.returns_v if type(got) in (tuple, list) and len(got) == 3 else "",
        )
    return (
        expect_tensor(
            got[0],
            what=tr("q (shape {shape}, {dtype} like the input)", shape=list(q.shape), dtype=dtype_name(q.dtype)),
            shape=list(q.shape),
            dtype=q.dtype,
        ),
        expect_tensor(
            got[1],
            what=tr("k (shape {shape}, {dtype} like the input)", shape=list(k.shape), dtype=dtype_name(k.dtype)),
            shape=list(k.shape),
            dtype=k.dtype,
        ),
    )


def explain_qk(
    name: str,
    y: torch.Tensor,
    want: torch.Tensor,
    x: torch.Tensor,
    w: torch.Tensor,
    other_w: torch.Tensor,
    positions: list[int],
    base: float,
    eps: float,
    case: str,
    models: dict | None = None,
) -> None:
    """Raise a teaching message at the first wrong element of q (or k): its head's rms, the norm and the turn
    (`models`: `qk_models`' answer; asked of the hidden side when needed if not given)."""
    n, h, d = x.shape
    bad = wrong_values(y, want)
    if not bad.any() and rounding_share(y, want) <= ROUNDING_SHARE:
        return
    models = models if models is not None else qk_models(None, x, w, other_w, positions, base, eps)
    cos, sin = models["cos"], models["sin"]
    head = tr(
        'case "{case}": {name} [{n}, {h}, {d}] {dtype}, positions {positions}, base {base}',
        case=case,
        name=name,
        n=n,
        h=h,
        d=d,
        dtype=dtype_name(x.dtype),
        positions=short(positions, limit=10),
        base=fmt(base, 8),
    )
    hint = qk_hint(y, x, models["variants"])
    if not bad.any():
        raise rounding_failure(head, rounding_share(y, want), hint)
    t, hh, i = (int(v) for v in bad.nonzero()[0])
    half, j = d // 2, i % (d // 2)
    xf = x[t, hh].double()
    rms = math.sqrt(float(xf.pow(2).mean()) + eps)
    normed = models["normed"][t, hh]
    a, b = float(normed[j]), float(normed[j + half])
    p, inv = positions[t], 1.0 / base ** (2 * j / d)
    sign = "−" if i < half else "+"
    first, second = (a, b) if i < half else (b, a)
    c, s = float(cos[t, j]), float(sin[t, j])
    raise CheckFailed(
        head,
        tr(
            "token {t} (position {p}), {name} head {hh} = {x}: rms = √(mean(x²) + eps) = {rms}",
            t=t,
            p=p,
            name=name,
            hh=hh,
            x=vec(x[t, hh]),
            rms=fmt(rms),
        ),
        tr("normalised and weighted: x / {rms} · {name}_norm_weight = {normed}", rms=fmt(rms), name=name, normed=vec(normed)),
        tr(
            "channel {i} is in pair {j} = ({j}, {j2}), angle {p} · {inv} = {angle}: {formula} = {expected}; "
            "yours: {yours} ({count} of {total} values differ)",
            i=i,
            j=j,
            j2=j + half,
            p=p,
            inv=fmt(inv, 6),
            angle=fmt(p * inv, 6),
            formula=f"{par(first)}·{par(c)} {sign} {par(second)}·{par(s)}",
            expected=fmt(want[t, hh, i]),
            yours=fmt(y[t, hh, i]),
            count=int(bad.sum()),
            total=bad.numel(),
        ),
        hint=hint,
    )


def qk_hint(y: torch.Tensor, x: torch.Tensor, variants: dict) -> str:
    """The misconception whose q (or k) in `qk_models(...)["variants"]` reproduces the student's, or ''."""
    dtype = dtype_name(x.dtype)
    whys = [
        ("rotate first", M.rotate_first),
        ("no norm", M.no_norm),
        ("no rope", M.no_rope),
        ("no weight", M.no_weight),
        ("other weight", M.other_weight),
        ("over heads", M.over_heads),
        ("whole token", M.whole_token),
        ("interleaved", M.interleaved),
        ("weight in float32", M.weight_in_float32.format(dtype=dtype)),
        ("rotation in low precision", M.low_precision.format(dtype=dtype)),
    ]
    return next((why for key, why in whys if key in variants and agrees(y, variants[key])), "")


def random_weight(t: Trial, d: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A learned-looking norm weight: far from uniform, so norm-then-rotate and rotate-then-norm differ."""
    return (torch.rand(d, generator=t.rng) * 1.5 + 0.25).to(dtype)


# -- helpers: ch19.4, attention with RoPE on q and k only ------------------------------------------------------

STAGES = {
    "rotated v": "v",
    "rotated cached v": "v",
    "normed v": "v",
    "v like k": "v",
    "only q": "rope",
    "only k": "rope",
    "no offset": "rope",
    "cache rotated again": "rope",
    "after attention": "attention",
    "top-left mask": "attention",
    "no mask": "attention",
    "grouped by repeat": "attention",
    "no scale": "attention",
    "attention in low precision": "attention",
}
"""The stage of the order (V's path, RoPE, attention) each misconception of `attention_models` gets wrong."""


def cached(t: Trial, c: int, hkv: int, d: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A cache of c earlier tokens: keys as the cache holds them (unit rms per head, rotated at positions 0 … c − 1,
    with the reference's tables) and values."""
    keys = torch.randn(c, hkv, d, generator=t.rng)
    keys = keys / keys.pow(2).mean(-1, keepdim=True).sqrt()
    cos, sin = t.ref.rope_cos_sin(list(range(c)), d, base)
    return t.ref.apply_rope(keys, cos, sin), torch.randn(c, hkv, d, generator=t.rng) * 2


def run_attention_case(
    t: Trial,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    wq: torch.Tensor,
    wk: torch.Tensor,
    base: float,
    k_cache: torch.Tensor | None,
    v_cache: torch.Tensor | None,
    case: str,
    eps: float = EPS,
) -> torch.Tensor:
    got = t.yours.rope_attention(q, k, v, wq, wk, base, eps, k_cache, v_cache)
    y = expect_attention(got, q)
    want = t.ref.rope_attention(q, k, v, wq, wk, base, eps, k_cache, v_cache)
    models = t.ref.drive(attention_models, q, k, v, wq, wk, base, eps, k_cache, v_cache)
    qk = t.ref.qk_norm_rope(q, k, wq, wk, models["positions"], base, eps)
    explain_attention(t, y, want, q, k, v, wq, wk, base, eps, k_cache, v_cache, case, models, qk)
    return y


def expect_attention(got, q: torch.Tensor) -> torch.Tensor:
    n, h, d = q.shape
    return expect_tensor(
        got,
        what=tr(
            "the attention output ({n} tokens × {h} query heads × head_dim {d}, in {dtype} like q)",
            n=n,
            h=h,
            d=d,
            dtype=dtype_name(q.dtype),
        ),
        shape=[n, h, d],
        dtype=q.dtype,
    )


def attention_mistake(y: torch.Tensor, want: torch.Tensor, variants: dict) -> str:
    """The misconception of `attention_models` that reproduces a wrong output, or '' (also for a right one)."""
    if not wrong_values(y, want, ATTN_TOL, ATTN_TOL).any() and rounding_share(y, want) <= ROUNDING_SHARE:
        return ""
    return next((key for key in STAGES if key in variants and agrees(y, variants[key])), "")


def attention_hint(
    t: Trial,
    mistake: str,
    q: torch.Tensor,
    k: torch.Tensor,
    wq: torch.Tensor,
    wk: torch.Tensor,
    base: float,
    eps: float,
    positions: list[int],
    qk: tuple[torch.Tensor, torch.Tensor],
) -> str:
    """The hint a wrong output earns: its misconception's, else a word on the student's own qk_norm_rope when that
    is what goes wrong on these inputs (`qk`: the reference's answer, asked for before comparing)."""
    named = {
        "rotated v": M.rotated_v,
        "rotated cached v": M.rotated_v,
        "normed v": M.normed_v,
        "v like k": M.v_like_k,
        "only q": M.one_rotated.format(which="q"),
        "only k": M.one_rotated.format(which="k"),
        "after attention": M.rotated_after,
        "no offset": M.no_offset,
        "cache rotated again": M.rotated_cache_again,
        "top-left mask": M.causal_offset,
        "no mask": M.causal_offset,
        "grouped by repeat": M.kv_groups,
        "no scale": M.no_scale,
        "attention in low precision": M.attention_low_precision,
    }
    if mistake:
        return named[mistake]
    try:
        yq, yk = expect_qk(t.yours.qk_norm_rope(q, k, wq, wk, torch.tensor(positions), base, eps), q, k)
        fine = not (wrong_values(yq, qk[0]).any() or wrong_values(yk, qk[1]).any())
    except CheckFailed:
        fine = False
    return (
        ""
        if fine
        else tr("rope_attention builds on qk_norm_rope (step 1), and yours gives other q, k on these inputs: make ch19.3 pass first")
    )


def reference_hint(t: Trial, y: torch.Tensor, q, k, v, wq, wk, base: float, eps: float, k_cache=None, v_cache=None) -> str:
    """The hint for a wrong rope_attention output `y` judged by another oracle (a whole prefill, transformers): the
    misconception of `attention_models` that reproduces it on the same inputs, as the reference comparison names it."""
    want = t.ref.rope_attention(q, k, v, wq, wk, base, eps, k_cache, v_cache)
    models = t.ref.drive(attention_models, q, k, v, wq, wk, base, eps, k_cache, v_cache)
    qk = t.ref.qk_norm_rope(q, k, wq, wk, models["positions"], base, eps)
    mistake = attention_mistake(y, want, models["variants"])
    return attention_hint(t, mistake, q, k, wq, wk, base, eps, models["positions"], qk) if mistake or not agrees(y, want) else ""


def explain_attention(
    t: Trial,
    y: torch.Tensor,
    want: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    wq: torch.Tensor,
    wk: torch.Tensor,
    base: float,
    eps: float,
    k_cache: torch.Tensor | None,
    v_cache: torch.Tensor | None,
    case: str,
    models: dict,
    qk: tuple[torch.Tensor, torch.Tensor],
) -> None:
    """Raise a teaching message at the first wrong output row: the token's position, the keys it sees, the
    attention weights and the values they mix (V as given), and the mistake that reproduces the output."""
    bad = wrong_values(y, want, ATTN_TOL, ATTN_TOL)
    share = rounding_share(y, want)
    if not bad.any() and share <= ROUNDING_SHARE:
        return
    n, hq, d = q.shape
    c = k_cache.shape[0] if k_cache is not None else 0  # tokens already cached
    positions = models["positions"]
    hint = attention_hint(t, attention_mistake(y, want, models["variants"]), q, k, wq, wk, base, eps, positions, qk)
    fields = dict(case=case, n=n, hq=hq, hkv=k.shape[1], d=d, dtype=dtype_name(q.dtype), c=c, positions=short(positions, limit=10))
    head = (
        tr(
            'case "{case}": q [{n}, {hq}, {d}], k, v [{n}, {hkv}, {d}] {dtype}, 1 cached token, '
            "so the new tokens stand at positions {positions}",
            **fields,
        )
        if c == 1
        else tr(
            'case "{case}": q [{n}, {hq}, {d}], k, v [{n}, {hkv}, {d}] {dtype}, {c} cached tokens, '
            "so the new tokens stand at positions {positions}",
            **fields,
        )
    )
    if not bad.any():
        raise rounding_failure(head, share, hint)
    i, h, _ = (int(x) for x in bad.nonzero()[0])
    g = h // (hq // k.shape[1])
    values = (v if v_cache is None else torch.cat((v_cache, v)))[: c + i + 1, g]
    shown = ", ".join(vec(r, limit=4) for r in values[:3]) + (", …" if len(values) > 3 else "")
    probs = models["probs"][h, i, : c + i + 1]
    raise CheckFailed(
        head,
        tr(
            "token {i} (position {p}), query head {h} reads K/V head {g} and sees keys 0 … {last}; "
            "its weights softmax(q·k / √{d}) = {probs}",
            i=i,
            p=positions[i],
            h=h,
            g=g,
            last=c + i,
            d=d,
            probs=vec(probs),
        ),
        tr("out = Σ weight · v over those keys, the values as given, neither normalised nor rotated (head {g}: {shown})", g=g, shown=shown),
        tr(
            "out[{i}, {h}] = {expected}; yours: {yours} ({count} of {total} values differ)",
            i=i,
            h=h,
            expected=vec(want[i, h]),
            yours=vec(y[i, h]),
            count=int(bad.sum()),
            total=bad.numel(),
        ),
        hint=hint,
    )
