"""Public checks of ch18 · grouped-query attention, and the messages they share with the hidden ones."""

from __future__ import annotations

import functools
import itertools
import unicodedata

import torch

from grader.authoring import (
    CheckFailed,
    Hint,
    Trial,
    expect_int,
    expect_tensor,
    first_wrong,
    fmt,
    hidden_model,
    mistakes,
    public,
    short,
    wrong_mask,
)
from grader.i18n import tr

# Tolerances for float32 attention outputs.
ATOL, RTOL = 1e-5, 1e-5

# ch18-dim-gqa: two [3, 2] query heads, one K/V head, small integers a reader can recompute.
DIM_Q = [
    [[1, 0], [0, 1]],  # token 0: head 0, head 1
    [[0, 1], [1, 0]],  # token 1
    [[2, 0], [0, 2]],
]  # token 2
DIM_K = [[[1, 0]], [[0, 1]], [[1, 1]]]
DIM_V = [[[2, 0]], [[0, 2]], [[2, 2]]]

# ch18-gqa-groups: 4 query heads over 2 K/V heads.
GROUPS_HEADS, GROUPS_KV = 4, 2

# ch18-kv-capacity: 8 query heads as MHA / GQA / MQA, Qwen3-0.6B-like layers, head_dim, a 4k context, bf16.
CAPACITY = dict(num_layers=28, head_dim=128, num_tokens=4096, dtype_bytes=2)
CAPACITY_CONFIGS = [("MHA", 8), ("GQA", 2), ("MQA", 1)]
CAPACITY_HEADS = 8

# Qwen3-0.6B (reference/nanovllm.md): 28 layers, 16 query heads, 8 K/V heads, head_dim 128, bf16.
QWEN3 = dict(num_layers=28, num_kv_heads=8, head_dim=128, dtype_bytes=2)

M = mistakes("ch18")

gqa_variants = hidden_model("ch18_models.gqa_variants")
"""`t.ref.drive(gqa_variants, q, k, v, causal, scale)`: {"grouping|mask|scale": output} of the misconceptions."""
gqa_figure = hidden_model("ch18_models.gqa_figure")
"""`t.ref.drive(gqa_figure, q, k, v)`: the figure instance's mask, q·k per head and weights."""


# -- ch18.1 kv_head_for --------------------------------------------------------------------------------


@public("ch18.1", "figure instance: 4 query heads over 2 K/V heads")
def groups_figure_instance(t: Trial) -> None:
    heads, got, want = collect_mapping(t, GROUPS_HEADS, GROUPS_KV)
    t.figure("ch18-gqa-groups", num_heads=GROUPS_HEADS, num_kv_heads=GROUPS_KV, mapping=got, expected=want)
    explain_mapping(heads, got, want, GROUPS_HEADS, GROUPS_KV)


@public("ch18.1", "Qwen3-0.6B: 16 query heads over 8 K/V heads (groups of 2)")
def qwen3_groups(t: Trial) -> None:
    run_mapping_case(t, 16, 8)


@public("ch18.1", "MHA (8 over 8) and MQA (8 over 1)")
def mha_and_mqa(t: Trial) -> None:
    run_mapping_case(t, 8, 8)
    run_mapping_case(t, 8, 1)


@public("ch18.1", "groups of 4: 12 query heads over 3 K/V heads")
def groups_of_four(t: Trial) -> None:
    run_mapping_case(t, 12, 3)


# -- ch18.2 gqa_attention ------------------------------------------------------------------------------


@public("ch18.2", "figure instance: 2 query heads share 1 K/V head (T=3, d=2)")
def dim_gqa_instance(t: Trial) -> None:
    q, k, v = dim_gqa_tensors()
    got = t.yours.gqa_attention(q, k, v)
    out = expect_output(got, q)
    want = t.ref.gqa_attention(q, k, v)
    parts, variants = t.ref.drive(gqa_figure, q, k, v), t.ref.drive(gqa_variants, q, k, v, True, None)
    t.figure(
        "ch18-dim-gqa",
        q=q.transpose(0, 1),
        k=k[:, 0],
        v=v[:, 0],
        dots=parts["dots"],
        allowed=parts["allowed"],
        weights=parts["weights"],
        out=out.transpose(0, 1),
        expected=want.transpose(0, 1),
        head_dim=q.shape[-1],
        wrong=wrong_mask(out, want, atol=ATOL, rtol=RTOL).transpose(0, 1),
    )
    explain_output(out, want, q, k, v, causal=True, scale=None, case=tr("figure instance"), variants=variants)


@public("ch18.2", "MHA: every query head has its own K/V head (T = S = 4)")
def mha_case(t: Trial) -> None:
    q, k, v = random_qkv(t, 4, 4, 3, 3, 4)
    run_attention_case(t, q, k, v, case="MHA, T = S = 4")  # a name, not a sentence


@public("ch18.2", "GQA: a chunk of 3 queries after 4 cached tokens (S = 7)")
def chunk_after_prefix(t: Trial) -> None:
    q, k, v = random_qkv(t, 3, 7, 4, 2, 8)
    run_attention_case(t, q, k, v, case=tr("3 new tokens after 4 cached"))


@public("ch18.2", "not causal, with a custom scale")
def not_causal_custom_scale(t: Trial) -> None:
    q, k, v = random_qkv(t, 2, 5, 6, 3, 4)
    run_attention_case(t, q, k, v, causal=False, scale=0.25, case=tr("not causal, scale {scale}", scale=0.25))


@public("ch18.2", "MQA decode step: one query sees every cached key")
def mqa_decode(t: Trial) -> None:
    q, k, v = random_qkv(t, 1, 6, 4, 1, 8)
    run_attention_case(t, q, k, v, case=tr("MQA decode, 1 query over 6 keys"))


# -- ch18.3 kv_cache_bytes -----------------------------------------------------------------------------


@public("ch18.3", "Qwen3-0.6B in bf16: bytes per token")
def qwen3_per_token(t: Trial) -> None:
    run_bytes_case(t, QWEN3["num_layers"], QWEN3["num_kv_heads"], QWEN3["head_dim"], 1, QWEN3["dtype_bytes"])


@public("ch18.3", "figure instance: 8 query heads as MHA / GQA / MQA (L=28, d=128, T=4096, bf16)")
def capacity_instance(t: Trial) -> None:
    c = CAPACITY
    args = [(c["num_layers"], kv, c["head_dim"], c["num_tokens"], c["dtype_bytes"]) for _, kv in CAPACITY_CONFIGS]
    got = [t.yours.kv_cache_bytes(*a) for a in args]
    want = [t.ref.kv_cache_bytes(*a) for a in args]
    if all(type(g) is int for g in got):
        t.figure("ch18-kv-capacity", configs=CAPACITY_CONFIGS, num_heads=CAPACITY_HEADS, **c, sizes=got, expected=want)
    for a, g, w in zip(args, got, want):
        expect_bytes(g, w, *a)


@public("ch18.3", "one nano-vllm block: 256 tokens of Qwen3-0.6B")
def nanovllm_block(t: Trial) -> None:
    run_bytes_case(t, QWEN3["num_layers"], QWEN3["num_kv_heads"], QWEN3["head_dim"], 256, QWEN3["dtype_bytes"])


@public("ch18.3", "no tokens, no bytes")
def no_tokens(t: Trial) -> None:
    run_bytes_case(t, 28, 8, 128, 0, 2)


# -- helpers: ch18.1, the mapping ----------------------------------------------------------------------


def collect_mapping(t: Trial, num_heads: int, num_kv_heads: int, heads: list[int] | None = None) -> tuple[list[int], list[int], list[int]]:
    """The student's and the reference's K/V head for each query head in `heads` (default: all)."""
    heads = list(range(num_heads)) if heads is None else heads
    got = [
        expect_int(t.yours.kv_head_for(h, num_heads, num_kv_heads), what=f"kv_head_for({h}, {num_heads}, {num_kv_heads})") for h in heads
    ]
    want = [t.ref.kv_head_for(h, num_heads, num_kv_heads) for h in heads]
    return heads, got, want


def explain_mapping(heads: list[int], got: list[int], want: list[int], num_heads: int, num_kv_heads: int) -> None:
    """Raise a teaching message at the first query head mapped to the wrong K/V head."""
    wrong = [i for i in range(len(heads)) if got[i] != want[i]]
    if not wrong:
        return
    i = wrong[0]
    h, yours, kv = heads[i], got[i], want[i]
    group = num_heads // num_kv_heads
    labels = [tr("query heads"), tr("expected K/V heads"), tr("yours")]
    width = max(map(text_width, labels))
    table = (
        [f"  {label}{' ' * (width - text_width(label))} {short(values, limit=16)}" for label, values in zip(labels, (heads, want, got))]
        if len(heads) > 1
        else []
    )
    raise CheckFailed(
        tr("{num_heads} query heads share 1 K/V head → group size {num_heads} // 1 = {group}", num_heads=num_heads, group=group)
        if num_kv_heads == 1
        else tr(
            "{num_heads} query heads share {num_kv_heads} K/V heads → group size {num_heads} // {num_kv_heads} = {group}",
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            group=group,
        ),
        tr(
            "query head {h} is in group {h} // {group} = {kv}, so it reads K/V head {kv}; yours: {yours}",
            h=h,
            group=group,
            kv=kv,
            yours=yours,
        ),
        *table,
        hint=mapping_hint(heads, got, num_heads, num_kv_heads),
    )


def mapping_hint(heads: list[int], got: list[int], num_heads: int, num_kv_heads: int) -> str:
    """The misconception the student's mapping comes from ('' when none fits)."""
    group = num_heads // num_kv_heads
    if got == [h % num_kv_heads for h in heads]:
        return M.interleaved.format(group=group, last=group - 1)
    if got == [h // num_kv_heads for h in heads]:
        return M.divide_by_kv_heads.format(group=group, num_kv_heads=num_kv_heads)
    if got == heads:
        return M.query_head_itself
    if got == [h % group for h in heads]:
        return M.place_in_group.format(group=group)
    return ""


def run_mapping_case(t: Trial, num_heads: int, num_kv_heads: int, heads: list[int] | None = None) -> None:
    heads, got, want = collect_mapping(t, num_heads, num_kv_heads, heads)
    explain_mapping(heads, got, want, num_heads, num_kv_heads)


# -- helpers: ch18.2, attention ------------------------------------------------------------------------


def run_attention_case(
    t: Trial,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = True,
    scale: float | None = None,
    case: str,
    want: torch.Tensor | None = None,
) -> torch.Tensor:
    """Call the student's gqa_attention on one case and compare with the reference (or `want`)."""
    kw = {"causal": causal} | ({"scale": scale} if scale is not None else {})
    got = t.yours.gqa_attention(q, k, v, **kw)
    out = expect_output(got, q)
    want = t.ref.gqa_attention(q, k, v, **kw) if want is None else want
    variants = t.ref.drive(gqa_variants, q, k, v, causal, scale)
    explain_output(out, want, q, k, v, causal=causal, scale=scale, case=case, variants=variants)
    return out


def expect_output(got: object, q: torch.Tensor) -> torch.Tensor:
    """Require a [T, Hq, d] tensor in q's dtype (the token-major layout)."""
    T, Hq, d = q.shape
    what = tr("the output of {T} queries × {Hq} heads × head_dim {d}", T=T, Hq=Hq, d=d)
    try:
        return expect_tensor(got, what=what, shape=[T, Hq, d], dtype=q.dtype)
    except CheckFailed as e:
        head_major = isinstance(got, torch.Tensor) and list(got.shape) == [Hq, T, d] and T != Hq
        raise CheckFailed(*e.lines, hint=M.head_major if head_major else "") from None


def explain_output(
    out: torch.Tensor,
    want: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    scale: float | None,
    case: str,
    atol: float = ATOL,
    rtol: float = RTOL,
    variants: dict | None = None,
) -> None:
    """Raise a teaching message at the first wrong output element: its query head, token and keys (`variants`:
    `gqa_variants`' answer; asked of the hidden side when needed if not given)."""
    idx = first_wrong(out, want, atol=atol, rtol=rtol)
    if idx is None:
        return
    (T, Hq, d), (S, Hkv) = q.shape, k.shape[:2]
    group = Hq // Hkv
    t, h, j = idx
    count = int(wrong_mask(out, want, atol=atol, rtol=rtol).sum())
    scale_txt = tr("1/√{d} (default)", d=d) if scale is None else fmt(scale)
    kind = "MHA" if Hkv == Hq else "MQA" if Hkv == 1 else "GQA"
    shapes = dict(case=case, T=T, Hq=Hq, d=d, S=S, Hkv=Hkv, kind=kind, group=group, causal=causal, scale=scale_txt)
    if not torch.isfinite(out).all() and torch.isfinite(want).all():
        hints = [M.overflow]
    else:
        variants = variants if variants is not None else gqa_variants(None, q, k, v, causal, scale)
        hints = attention_hints(out, q, k, v, causal, scale, variants)
    raise CheckFailed(
        tr(
            'case "{case}": q [{T}, {Hq}, {d}], k/v [{S}, {Hkv}, {d}] ({kind}: {Hq} query heads over 1 K/V head, '
            "group {group}), causal={causal}, scale={scale}",
            **shapes,
        )
        if Hkv == 1
        else tr(
            'case "{case}": q [{T}, {Hq}, {d}], k/v [{S}, {Hkv}, {d}] ({kind}: {Hq} query heads over {Hkv} K/V heads, '
            "group {group}), causal={causal}, scale={scale}",
            **shapes,
        ),
        tr(
            "query head {h} reads K/V head {h} // {group} = {kv}; token {t} is at position {S} − {T} + {t} = {p} and sees keys 0 … {p}",
            h=h,
            group=group,
            kv=h // group,
            t=t,
            S=S,
            T=T,
            p=S - T + t,
        )
        if causal
        else tr(
            "query head {h} reads K/V head {h} // {group} = {kv}; token {t} sees all {S} keys", h=h, group=group, kv=h // group, t=t, S=S
        ),
        tr(
            "out[{t}, {h}, {j}]: expected {expected}, yours {yours} ({count} of {total} elements differ beyond {atol} + {rtol}·|expected|)",
            t=t,
            h=h,
            j=j,
            expected=fmt(want[t, h, j]),
            yours=fmt(out[t, h, j]),
            count=count,
            total=want.numel(),
            atol=f"{atol:g}",
            rtol=f"{rtol:g}",
        ),
        hint=hints,
    )


def attention_hints(
    got: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None, variants: dict
) -> list[Hint]:
    """The mistakes (a grouping, a mask, a scale) whose output (`gqa_variants`' answer) reproduces the student's,
    together ([] when none does)."""
    (T, Hq, d), (S, Hkv) = q.shape, k.shape[:2]
    group = Hq // Hkv
    groupings = [
        ("", None),
        ("interleaved", M.interleaved.format(group=group, last=group - 1)),
        ("by num_kv_heads", M.divide_by_kv_heads.format(group=group, num_kv_heads=Hkv)),
    ]
    masks = [("", None), ("top-left", M.topleft.format(offset=S - T)), ("no mask", M.no_mask), ("mask", M.mask_not_causal)]
    scales = [
        ("", None),
        ("default", M.scale_ignored.format(scale=fmt(scale or 0.0))),
        ("unscaled", M.unscaled.format(d=d)),
        ("1/d", M.scale_1_over_d.format(d=d)),
        ("1/√(Hq·d)", M.scale_all_heads.format(d=d)),
    ]
    for (g, g_why), (m, m_why), (s, s_why) in itertools.product(groupings, masks, scales):
        variant = variants.get(f"{g}|{m}|{s}")
        if variant is not None and torch.allclose(got.double(), variant.double(), atol=1e-4, rtol=1e-4, equal_nan=True):
            return [why for why in (g_why, m_why, s_why) if why]
    return []


def random_qkv(
    t: Trial, T: int, S: int, Hq: int, Hkv: int, d: int, magnitude: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q = torch.randn(T, Hq, d, generator=t.rng) * magnitude
    k = torch.randn(S, Hkv, d, generator=t.rng)
    v = torch.randn(S, Hkv, d, generator=t.rng)
    return q, k, v


def dim_gqa_tensors() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (torch.tensor(DIM_Q, dtype=torch.float32), torch.tensor(DIM_K, dtype=torch.float32), torch.tensor(DIM_V, dtype=torch.float32))


def text_width(text: str) -> int:
    """Columns `text` takes in a terminal: a wide (Chinese) character counts 2."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


# -- helpers: ch18.3, bytes ----------------------------------------------------------------------------


def run_bytes_case(t: Trial, num_layers: int, num_kv_heads: int, head_dim: int, num_tokens: int, dtype_bytes: int) -> int:
    args = (num_layers, num_kv_heads, head_dim, num_tokens, dtype_bytes)
    got = t.yours.kv_cache_bytes(*args)
    return expect_bytes(got, t.ref.kv_cache_bytes(*args), *args)


def expect_bytes(got: object, want: int, num_layers: int, num_kv_heads: int, head_dim: int, num_tokens: int, dtype_bytes: int) -> int:
    """Require the exact byte count as a Python int, explaining the formula and a known mistake."""
    inputs = (
        f"num_layers={num_layers}, num_kv_heads={num_kv_heads}, head_dim={head_dim}, num_tokens={num_tokens:,}, dtype_bytes={dtype_bytes}"
    )
    try:
        count = expect_int(got, what=tr("the byte count for {inputs}", inputs=inputs))
    except CheckFailed as e:
        raise CheckFailed(*e.lines, hint=M.float_bytes if isinstance(got, float) else "") from None
    if count == want:
        return count
    hints = bytes_hints(count, want, num_layers, dtype_bytes, num_tokens)
    failure = CheckFailed(
        tr("inputs: {inputs}", inputs=inputs),
        tr(
            "expected 2 (K and V) · {num_layers} · {num_kv_heads} · {head_dim} · {num_tokens} · {dtype_bytes} = {want} bytes; yours: {got}",
            num_layers=num_layers,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            num_tokens=f"{num_tokens:,}",
            dtype_bytes=dtype_bytes,
            want=f"{want:,}",
            got=f"{count:,}",
        ),
        hint=functools.reduce(
            lambda a, b: tr("{first}; or, as it gives the same count here: {second}", first=a, second=b), hints[1:], str(hints[0])
        )
        if hints
        else "",
    )
    failure.hints = [h.id for h in hints]  # both mistakes give this count
    raise failure


def bytes_hints(got: int, want: int, num_layers: int, dtype_bytes: int, num_tokens: int) -> list[Hint]:
    """The misconceptions that give the student's count: one, or, where two give the same count here (a
    forgotten factor 2 and a forgotten dtype_bytes = 2), both; [] when none does."""
    if not want:
        return []
    fits = [
        why
        for fit, why in (
            (2 * got == want, M.k_only),
            (got == 2 * want, M.factor_2_twice),
            (got == 8 * want, M.bits),
            (num_layers > 1 and got * num_layers == want, M.no_layers),
            (dtype_bytes > 1 and got * dtype_bytes == want, M.no_dtype_bytes),
            (num_tokens > 1 and got * num_tokens == want, M.one_token),
        )
        if fit
    ]
    if not fits and abs(got - want) <= want * 1e-12:
        fits = [M.float_rounding.format(diff=f"{got - want:+,}")]
    return fits


# -- helpers: several mistakes at once ------------------------------------------------------------------
