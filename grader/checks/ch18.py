"""Public checks of ch18 · grouped-query attention, and the messages they share with the hidden ones."""

from __future__ import annotations

import itertools

import torch

from grader.authoring import (
    CheckFailed,
    Trial,
    describe,
    expect_int,
    expect_tensor,
    first_wrong,
    fmt,
    hidden_model,
    public,
    wrong_mask,
)

# Tolerances for float32 attention outputs.
ATOL, RTOL = 1e-5, 1e-5

# ch18-dim-gqa: two [3, 2] query heads, one K/V head, small integers a reader can recompute.
DIM_Q = [[[1, 0], [0, 1]],        # token 0: head 0, head 1
         [[0, 1], [1, 0]],        # token 1
         [[2, 0], [0, 2]]]        # token 2
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


# -- 18.1 kv_head_for --------------------------------------------------------------------------------

def collect_mapping(t: Trial, num_heads: int, num_kv_heads: int,
                    heads: list[int] | None = None) -> tuple[list[int], list[int], list[int]]:
    """The student's and the reference's K/V head for each query head in `heads` (default: all)."""
    heads = list(range(num_heads)) if heads is None else heads
    got = [expect_int(t.yours.kv_head_for(h, num_heads, num_kv_heads),
                      what=f"kv_head_for({h}, {num_heads}, {num_kv_heads})") for h in heads]
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
    kv_heads = f"{num_kv_heads} K/V head{'s' if num_kv_heads > 1 else ''}"
    lines = [f"{num_heads} query heads share {kv_heads} → group size {num_heads} // {num_kv_heads} = {group}",
             f"query head {h} is in group {h} // {group} = {kv}, so it reads K/V head {kv}; yours: {yours}"]
    if len(heads) > 1:
        lines.append(f"  query heads        {_short(heads)}")
        lines.append(f"  expected K/V heads {_short(want)}")
        lines.append(f"  yours              {_short(got)}")
    hint = mapping_hint(heads, got, num_heads, num_kv_heads)
    raise CheckFailed("\n".join(lines + ([f"hint: {hint}"] if hint else [])))


def mapping_hint(heads: list[int], got: list[int], num_heads: int, num_kv_heads: int) -> str:
    """The misconception the student's mapping comes from ('' when none fits)."""
    group = num_heads // num_kv_heads
    if got == [h % num_kv_heads for h in heads]:
        return (f"q_head % num_kv_heads interleaves the heads (0, 1, 0, 1, …); nano-vllm and flash-attn group "
                f"consecutive heads: heads 0 … {group - 1} share K/V head 0, heads {group} … {2 * group - 1} "
                f"K/V head 1, …")
    if got == [h // num_kv_heads for h in heads]:
        return (f"divide by the group size num_heads // num_kv_heads = {group}, not by num_kv_heads = "
                f"{num_kv_heads}")
    if got == heads:
        return "return the K/V head the query head reads, not the query head itself"
    if got == [h % group for h in heads]:
        return (f"h % group is the head's place inside its group; the group (and so the K/V head) is "
                f"h // group = h // {group}")
    return ""


def run_mapping_case(t: Trial, num_heads: int, num_kv_heads: int, heads: list[int] | None = None) -> None:
    heads, got, want = collect_mapping(t, num_heads, num_kv_heads, heads)
    explain_mapping(heads, got, want, num_heads, num_kv_heads)


def _short(xs: list) -> str:
    return str(list(xs)) if len(xs) <= 16 else f"[{', '.join(map(str, xs[:14]))}, … ({len(xs)} heads)]"


# -- 18.2 gqa_attention ------------------------------------------------------------------------------

gqa_variants = hidden_model("ch18_models.gqa_variants")
"""`t.ref.drive(gqa_variants, q, k, v, causal, scale)`: {"grouping|mask|scale": output} of the misconceptions."""
gqa_figure = hidden_model("ch18_models.gqa_figure")
"""`t.ref.drive(gqa_figure, q, k, v)`: the figure instance's mask, q·k per head and weights."""


def attention_hint(got: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                   scale: float | None, variants: dict) -> str:
    """Find the mistakes (grouping × mask × scale) whose output (`gqa_variants`' answer) reproduces the student's
    ('' when none)."""
    (T, Hq, d), (S, Hkv, _) = q.shape, k.shape
    group = Hq // Hkv
    groupings = [("", ""), ("interleaved", f"query head h reads K/V head h // group = h // {group} (consecutive "
                                           f"groups), not h % num_kv_heads (interleaved)"),
                 ("by num_kv_heads", f"query head h reads K/V head h // {group}: divide by the group size, not by "
                                     f"num_kv_heads = {Hkv}")]
    masks = [("", ""), ("top-left", f"the causal mask is aligned to the end: query i is the token at position "
                                    f"S − T + i = {S - T} + i and sees keys 0 … {S - T} + i; a top-left tril (or "
                                    f"SDPA's is_causal=True with T ≠ S) lets it see only keys 0 … i"),
             ("no mask", "causal=True: mask the keys after each query's position"),
             ("mask", "causal=False: every query sees every key, apply no mask")]
    scales = [("", ""), ("default", f"use the scale argument ({fmt(scale or 0.0)}) when one is given; 1/√d is "
                                    f"only the default"),
              ("unscaled", f"scale the scores by 1/√d = 1/√{d}; you did not scale them"),
              ("1/d", f"the scale is 1/√d = 1/√{d}, not 1/d"),
              ("1/√(Hq·d)", f"the scale is 1/√head_dim = 1/√{d}, not 1/√(num_heads·head_dim)")]
    for (g, g_why), (m, m_why), (s, s_why) in itertools.product(groupings, masks, scales):
        variant = variants.get(f"{g}|{m}|{s}")
        if variant is not None and torch.allclose(got.double(), variant.double(), atol=1e-4, rtol=1e-4,
                                                  equal_nan=True):
            return "; ".join(w for w in (g_why, m_why, s_why) if w)
    return ""


def expect_output(got, q: torch.Tensor) -> torch.Tensor:
    """Require a [T, Hq, d] tensor in q's dtype (the token-major layout)."""
    T, Hq, d = q.shape
    what = f"the output of {T} queries × {Hq} heads × head_dim {d}"
    if isinstance(got, torch.Tensor) and list(got.shape) == [Hq, T, d] and T != Hq:
        raise CheckFailed(f"expected {what} as a 3-D {str(q.dtype).removeprefix('torch.')} tensor of shape "
                          f"[{T}, {Hq}, {d}]; yours: {describe(got)}\n"
                          f"hint: keep the token-major layout [T, Hq, d] of q: transpose back after working "
                          f"head-major")
    return expect_tensor(got, what=what, shape=[T, Hq, d], dtype=q.dtype)


def explain_output(out: torch.Tensor, want: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                   causal: bool, scale: float | None, case: str, atol: float = ATOL, rtol: float = RTOL,
                   variants: dict | None = None) -> None:
    """Raise a teaching message at the first wrong output element: its query head, token and keys (`variants`:
    `gqa_variants`' answer; asked of the hidden side when needed if not given)."""
    idx = first_wrong(out, want, atol=atol, rtol=rtol)
    if idx is None:
        return
    (T, Hq, d), (S, Hkv, _) = q.shape, k.shape
    group = Hq // Hkv
    t, h, j = idx
    count = int(wrong_mask(out, want, atol=atol, rtol=rtol).sum())
    scale_txt = f"1/√{d} (default)" if scale is None else fmt(scale)
    kind = "MHA" if Hkv == Hq else "MQA" if Hkv == 1 else "GQA"
    lines = [f'case "{case}": q [{T}, {Hq}, {d}], k/v [{S}, {Hkv}, {d}] ({kind}: {Hq} query heads over {Hkv} K/V '
             f"head{'s' if Hkv > 1 else ''}, group {group}), causal={causal}, scale={scale_txt}"]
    where = f"query head {h} reads K/V head {h} // {group} = {h // group}; token {t}"
    if causal:
        p = S - T + t
        where += f" is at position {S} − {T} + {t} = {p} and sees keys 0 … {p}"
    else:
        where += f" sees all {S} keys"
    lines.append(where)
    lines.append(f"out[{t}, {h}, {j}]: expected {fmt(want[t, h, j])}, yours {fmt(out[t, h, j])} "
                 f"({count} of {want.numel()} elements differ beyond {atol:g} + {rtol:g}·|expected|)")
    if not torch.isfinite(out).all() and torch.isfinite(want).all():
        hint = ("your output has inf/nan: subtract each row's maximum before exp (or use torch.softmax), and make "
                "sure no query row is fully masked")
    else:
        variants = variants if variants is not None else gqa_variants(None, q, k, v, causal, scale)
        hint = attention_hint(out, q, k, v, causal, scale, variants)
    raise CheckFailed("\n".join(lines + ([f"hint: {hint}"] if hint else [])))


def run_attention_case(t: Trial, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = True,
                       scale: float | None = None, case: str, want: torch.Tensor | None = None) -> torch.Tensor:
    """Call the student's gqa_attention on one case and compare with the reference (or `want`)."""
    kw = {"causal": causal} | ({"scale": scale} if scale is not None else {})
    got = t.yours.gqa_attention(q, k, v, **kw)
    out = expect_output(got, q)
    want = t.ref.gqa_attention(q, k, v, **kw) if want is None else want
    variants = t.ref.drive(gqa_variants, q, k, v, causal, scale)
    explain_output(out, want, q, k, v, causal=causal, scale=scale, case=case, variants=variants)
    return out


def random_qkv(t: Trial, T: int, S: int, Hq: int, Hkv: int, d: int,
               magnitude: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q = torch.randn(T, Hq, d, generator=t.rng) * magnitude
    k = torch.randn(S, Hkv, d, generator=t.rng)
    v = torch.randn(S, Hkv, d, generator=t.rng)
    return q, k, v


def dim_gqa_tensors() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (torch.tensor(DIM_Q, dtype=torch.float32), torch.tensor(DIM_K, dtype=torch.float32),
            torch.tensor(DIM_V, dtype=torch.float32))


# -- 18.3 kv_cache_bytes -----------------------------------------------------------------------------

def expect_bytes(got, want: int, num_layers: int, num_kv_heads: int, head_dim: int, num_tokens: int,
                 dtype_bytes: int) -> int:
    """Require the exact byte count as a Python int, explaining the formula and a known mistake."""
    inputs = (f"num_layers={num_layers}, num_kv_heads={num_kv_heads}, head_dim={head_dim}, "
              f"num_tokens={num_tokens:,}, dtype_bytes={dtype_bytes}")
    hint = ("\nhint: multiply the Python ints directly (no /, no float(), no math.pow): a float loses "
            "bytes above 2^53 and is not a count" if isinstance(got, float) else "")
    expect_int(got, what=f"the byte count for {inputs}", hint=hint)
    if got == want:
        return got
    lines = [f"inputs: {inputs}",
             f"expected 2 (K and V) · {num_layers} · {num_kv_heads} · {head_dim} · {num_tokens:,} · {dtype_bytes} "
             f"= {want:,} bytes; yours: {got:,}"]
    hint = bytes_hint(got, want, num_layers, dtype_bytes, num_tokens)
    raise CheckFailed("\n".join(lines + ([f"hint: {hint}"] if hint else [])))


def bytes_hint(got: int, want: int, num_layers: int, dtype_bytes: int, num_tokens: int) -> str:
    """The misconceptions that give the student's count: one hint, or, where two give the same count here (a
    forgotten factor 2 and a forgotten dtype_bytes = 2), both; '' when none does."""
    if not want:
        return ""
    fits = [why for fit, why in (
        (2 * got == want,
         "count both K and V: every token stores a key and a value vector per K/V head (the factor 2)"),
        (got == 2 * want, "the factor 2 (K and V) appears once"),
        (got == 8 * want, "dtype_bytes is already bytes per element: do not multiply by 8 (that counts bits)"),
        (num_layers > 1 and got * num_layers == want, "every layer has its own K/V cache: multiply by num_layers"),
        (dtype_bytes > 1 and got * dtype_bytes == want,
         "multiply by dtype_bytes: without it you counted elements, not bytes"),
        (num_tokens > 1 and got * num_tokens == want, "multiply by num_tokens: your count is for one token")) if fit]
    if not fits and abs(got - want) <= want * 1e-12:
        fits = [f"off by {got - want:+,} bytes: float arithmetic rounds above 2^53; multiply Python ints, which are "
                f"exact at any size"]
    return "; or, as it gives the same count here: ".join(fits)


def run_bytes_case(t: Trial, num_layers: int, num_kv_heads: int, head_dim: int, num_tokens: int,
                   dtype_bytes: int) -> int:
    args = (num_layers, num_kv_heads, head_dim, num_tokens, dtype_bytes)
    got = t.yours.kv_cache_bytes(*args)
    return expect_bytes(got, t.ref.kv_cache_bytes(*args), *args)


# -- public checks -----------------------------------------------------------------------------------

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


@public("ch18.1", "head counts that do not divide raise ValueError")
def counts_not_dividing(t: Trial) -> None:
    t.expect_raises(ValueError, t.yours.kv_head_for, 0, 12, 5,
                    because="12 query heads cannot be split into 5 groups of consecutive heads")


@public("ch18.1", "a query head out of range raises ValueError")
def head_out_of_range(t: Trial) -> None:
    t.expect_raises(ValueError, t.yours.kv_head_for, 4, 4, 2, because="4 query heads are numbered 0 … 3")


@public("ch18.2", "figure instance: 2 query heads share 1 K/V head (T=3, d=2)")
def dim_gqa_instance(t: Trial) -> None:
    q, k, v = dim_gqa_tensors()
    got = t.yours.gqa_attention(q, k, v)
    out = expect_output(got, q)
    want = t.ref.gqa_attention(q, k, v)
    parts, variants = t.ref.drive(gqa_figure, q, k, v), t.ref.drive(gqa_variants, q, k, v, True, None)
    t.figure("ch18-dim-gqa", q=q.transpose(0, 1), k=k[:, 0], v=v[:, 0], dots=parts["dots"], allowed=parts["allowed"],
             weights=parts["weights"], out=out.transpose(0, 1), expected=want.transpose(0, 1), head_dim=q.shape[-1])
    explain_output(out, want, q, k, v, causal=True, scale=None, case="figure instance", variants=variants)


@public("ch18.2", "MHA: every query head has its own K/V head (T = S = 4)")
def mha_case(t: Trial) -> None:
    q, k, v = random_qkv(t, 4, 4, 3, 3, 4)
    run_attention_case(t, q, k, v, case="MHA, T = S = 4")


@public("ch18.2", "GQA: a chunk of 3 queries after 4 cached tokens (S = 7)")
def chunk_after_prefix(t: Trial) -> None:
    q, k, v = random_qkv(t, 3, 7, 4, 2, 8)
    run_attention_case(t, q, k, v, case="3 new tokens after 4 cached")


@public("ch18.2", "not causal, with a custom scale")
def not_causal_custom_scale(t: Trial) -> None:
    q, k, v = random_qkv(t, 2, 5, 6, 3, 4)
    run_attention_case(t, q, k, v, causal=False, scale=0.25, case="not causal, scale 0.25")


@public("ch18.2", "MQA decode step: one query sees every cached key")
def mqa_decode(t: Trial) -> None:
    q, k, v = random_qkv(t, 1, 6, 4, 1, 8)
    run_attention_case(t, q, k, v, case="MQA decode, 1 query over 6 keys")


@public("ch18.2", "query heads that do not split over the K/V heads raise ValueError")
def bad_grouping(t: Trial) -> None:
    q, k, v = torch.zeros(2, 6, 4), torch.zeros(2, 4, 4), torch.zeros(2, 4, 4)
    t.expect_raises(ValueError, t.yours.gqa_attention, q, k, v,
                    because="6 query heads cannot be split into groups over 4 K/V heads")


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
        t.figure("ch18-kv-capacity", configs=CAPACITY_CONFIGS, num_heads=CAPACITY_HEADS, **c, sizes=got,
                 expected=want)
    for a, g, w in zip(args, got, want):
        expect_bytes(g, w, *a)


@public("ch18.3", "one nano-vllm block: 256 tokens of Qwen3-0.6B")
def nanovllm_block(t: Trial) -> None:
    run_bytes_case(t, QWEN3["num_layers"], QWEN3["num_kv_heads"], QWEN3["head_dim"], 256, QWEN3["dtype_bytes"])


@public("ch18.3", "no tokens, no bytes")
def no_tokens(t: Trial) -> None:
    run_bytes_case(t, 28, 8, 128, 0, 2)


@public("ch18.3", "a negative token count raises ValueError")
def negative_tokens(t: Trial) -> None:
    t.expect_raises(ValueError, t.yours.kv_cache_bytes, 28, 8, 128, -1, 2, because="a cache cannot hold −1 tokens")
