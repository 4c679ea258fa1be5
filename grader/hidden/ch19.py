"""Hidden checks of ch19 · rotary position embedding: random instances from the grading seed, agreement
with transformers' Qwen3 (rotary embedding, apply_rotary_pos_emb, Qwen3Attention), the properties of a
rotation (length kept, scores depend only on the position difference), and attention over a cache that gives
what one prefill of the whole sequence gives. (Bad inputs are refused by provided code, tested in
tests/test_ch19.py.)"""

from __future__ import annotations

import torch

from grader.authoring import CheckFailed, Trial, first_named, fmt, hidden, short
from grader.checks.ch19 import (
    ATTN_TOL,
    EPS,
    agrees,
    cached,
    expect_attention,
    expect_cos_sin,
    expect_qk,
    expect_rotated,
    explain_qk,
    explain_rotated,
    random_weight,
    reference_hint,
    rope_hints,
    rope_variants,
    run_attention_case,
    run_cos_sin_case,
    run_qk_case,
    run_rope_case,
    wrong_values,
)
from grader.i18n import tr

# -- ch19.1 -------------------------------------------------------------------------------------------


@hidden("ch19.1", "random head_dims, bases and positions")
def random_cos_sin(t: Trial) -> None:
    def case() -> None:
        d = t.random.choice([2, 4, 8, 16, 64, 128, 256])
        base = t.random.choice([10000.0, 500000.0, 1e6, float(t.random.randint(100, 10**6))])
        positions = [t.random.randrange(2048) for _ in range(t.random.randint(1, 20))]
        run_cos_sin_case(t, positions, d, base, tr("d={d}, base {base}", d=d, base=fmt(base, 8)), as_tensor=t.random.random() < 0.7)

    first_named(case for _ in range(12))  # large angles may hide a mistake in float32 that a small case names


@hidden("ch19.1", "agreement with transformers' Qwen3RotaryEmbedding")
def hf_rotary_table(t: Trial) -> None:
    for d, base in ((8, 10000.0), (64, 1e6), (128, 1e6)):
        config, qwen3 = tiny_qwen3(t, head_dim=d, base=base)
        positions = sorted(t.random.sample(range(4096), 12))
        cos, sin = hf_cos_sin(qwen3, config, positions)
        if not torch.equal(cos[:, : d // 2], cos[:, d // 2 :]):  # HF repeats the d/2 angles: cat((freqs, freqs))
            raise CheckFailed(tr("grader error: transformers' table is not cat((freqs, freqs)); tell your instructor"))
        got = t.yours.rope_cos_sin(torch.tensor(positions), d, base)
        expect_cos_sin(
            got,
            positions,
            d,
            base,
            (cos[:, : d // 2], sin[:, : d // 2]),
            tr("transformers Qwen3RotaryEmbedding, head_dim {d}, rope_theta {base}", d=d, base=fmt(base, 8)),
        )


@hidden("ch19.1", "long context: positions up to Qwen3's 40960, in float32")
def long_context(t: Trial) -> None:
    positions = [257, 4097, 32767, 40959] + [t.random.randrange(40960) for _ in range(8)]
    run_cos_sin_case(t, positions, 128, 1e6, tr("Qwen3-0.6B, max_position_embeddings 40960"))


# -- ch19.2 -------------------------------------------------------------------------------------------


@hidden("ch19.2", "agreement with transformers' apply_rotary_pos_emb (Qwen3)")
def hf_apply_rotary(t: Trial) -> None:
    for d, base in ((8, 10000.0), (64, 1e6)):
        config, qwen3 = tiny_qwen3(t, head_dim=d, base=base)
        positions = sorted(t.random.sample(range(2048), 6))
        cos, sin = hf_cos_sin(qwen3, config, positions)
        q, k = torch.randn(6, 4, d, generator=t.rng), torch.randn(6, 2, d, generator=t.rng)
        # transformers works head-major [B, H, N, d]; the course token-major [N, H, d].
        want_q, want_k = qwen3.apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos[None], sin[None])
        half = (cos[:, : d // 2], sin[:, : d // 2])
        for name, x, want in (("q", q, want_q), ("k", k, want_k)):
            y = expect_rotated(t.yours.apply_rope(x, *half), x, tr("the rotated {name}", name=name))
            case = tr("transformers apply_rotary_pos_emb, {name}, d={d}", name=name, d=d)
            explain_rotated(y, want[0].transpose(0, 1), x, *half, case, positions)


@hidden("ch19.2", "random shapes and positions, float32 and bf16")
def random_rope(t: Trial) -> None:
    for i in range(8):
        n, h, d = t.random.randint(1, 9), t.random.randint(1, 5), t.random.choice([2, 8, 32, 128])
        x = torch.randn(n, h, d, generator=t.rng) * t.random.choice([0.1, 1.0, 30.0])
        x = x.bfloat16() if i % 2 else x
        positions = [t.random.randrange(4096) for _ in range(n)]
        run_rope_case(
            t,
            x,
            positions,
            t.random.choice([10000.0, 1e6]),
            tr("{n} tokens, {h} heads, d={d}, {dtype}", n=n, h=h, d=d, dtype=str(x.dtype)[6:]),
        )


@hidden("ch19.2", "a rotation keeps every head's length")
def norm_preserved(t: Trial) -> None:
    x = torch.randn(12, 3, 64, generator=t.rng, dtype=torch.float64).float()
    positions = [t.random.randrange(10000) for _ in range(12)]
    cos, sin = t.ref.rope_cos_sin(positions, 64, 1e6)
    y = expect_rotated(t.yours.apply_rope(x, cos, sin), x)
    variants = t.ref.drive(rope_variants, x, cos, sin)
    before, after = x.double().norm(dim=-1), y.double().norm(dim=-1)
    bad = ((after - before).abs() > 1e-5 * before).nonzero()
    if len(bad):
        n, h = (int(v) for v in bad[0])
        raise CheckFailed(
            tr(
                "token {n} (position {p}), head {h}: |x| = {before} but |apply_rope(x)| = {after}; every pair is rotated, "
                "and a rotation keeps lengths: (x1·cos − x2·sin)² + (x2·cos + x1·sin)² = x1² + x2²",
                n=n,
                p=positions[n],
                h=h,
                before=fmt(before[n, h], 7),
                after=fmt(after[n, h], 7),
            ),
            hint=rope_hints(y, x, variants),
        )


@hidden("ch19.2", "relative position: q·k depends only on the position difference")
def relative_position(t: Trial) -> None:
    n, d = 8, 32
    q, k = torch.randn(n, 1, d, generator=t.rng), torch.randn(n, 1, d, generator=t.rng)
    pq = [t.random.randrange(500) for _ in range(n)]
    pk = [t.random.randrange(500) for _ in range(n)]
    shift = t.random.randint(100, 3000)

    named: list = []

    def scores(offset: int) -> torch.Tensor:
        cos_q, sin_q = t.ref.rope_cos_sin([p + offset for p in pq], d, 10000.0)
        rq = expect_rotated(t.yours.apply_rope(q, cos_q, sin_q), q)
        rk = expect_rotated(t.yours.apply_rope(k, *t.ref.rope_cos_sin([p + offset for p in pk], d, 10000.0)), k)
        named.append(rope_hints(rq, q, t.ref.drive(rope_variants, q, cos_q, sin_q)))  # the mistake q's rotation is
        return (rq.double() * rk.double()).sum((1, 2))

    near, far = scores(0), scores(shift)
    bad = ((near - far).abs() > 1e-3 + 1e-3 * near.abs()).nonzero()
    if len(bad):
        i = int(bad[0])
        raise CheckFailed(
            tr(
                "q at position {pq} and k at {pk} score q·k = {near}; shifted by {shift} (positions {pq2} and {pk2}) "
                "the score becomes {far}. RoPE rotates both by angles p·θ, so q·k depends only on p − p′ = {diff} and "
                "must not change",
                pq=pq[i],
                pk=pk[i],
                near=fmt(near[i]),
                shift=shift,
                pq2=pq[i] + shift,
                pk2=pk[i] + shift,
                far=fmt(far[i]),
                diff=pq[i] - pk[i],
            ),
            hint=named[0]
            or tr(
                "rotate every pair by its own angle p·θ_j with cos and sin of the same position; do not add or mix anything else "
                "into q and k"
            ),
        )


# -- ch19.3 -------------------------------------------------------------------------------------------


@hidden("ch19.3", "agreement with transformers' Qwen3Attention (q_norm, k_norm, RoPE; V untouched)")
def hf_qwen3_attention(t: Trial) -> None:
    config, qwen3, attn = hf_attention(t)
    n = 7
    positions = [t.random.randint(0, 3) + i for i in range(n)]
    x = torch.randn(1, n, 32, generator=t.rng)
    cos, sin = hf_cos_sin(qwen3, config, positions)
    mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        want_out = attn(x, (cos[None], sin[None]), mask)[0][0]
        q = attn.q_proj(x[0]).view(n, 4, 16)
        k = attn.k_proj(x[0]).view(n, 2, 16)
        v = attn.v_proj(x[0]).view(n, 2, 16)
        wq, wk = attn.q_norm.weight.detach().clone(), attn.k_norm.weight.detach().clone()
        # transformers' own order of operations gives the expected q and k
        hq, hk = qwen3.apply_rotary_pos_emb(
            attn.q_norm(q).transpose(0, 1)[None], attn.k_norm(k).transpose(0, 1)[None], cos[None], sin[None]
        )
    got = t.yours.qk_norm_rope(q, k, wq, wk, torch.tensor(positions), 1e6, config.rms_norm_eps)
    yq, yk = expect_qk(got, q, k)
    case = tr("transformers Qwen3Attention, 7 tokens, Hq=4, Hkv=2, d=16")
    explain_qk("q", yq, hq[0].transpose(0, 1), q, wq, wk, positions, 1e6, config.rms_norm_eps, case)
    explain_qk("k", yk, hk[0].transpose(0, 1), k, wk, wq, positions, 1e6, config.rms_norm_eps, case)
    # The whole block: attention over your q, k and the untouched v, then o_proj, equals Qwen3Attention's output.
    kk, vv = yk.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    scores = torch.einsum("nhd,mhd->hnm", yq, kk) * 16**-0.5 + mask[0]
    out = attn.o_proj(torch.einsum("hnm,mhd->nhd", scores.softmax(-1), vv).reshape(n, 64)).detach()
    if not agrees(out, want_out, atol=1e-4, rtol=1e-4):
        raise CheckFailed(
            tr(
                "{case}: with your q and k (and V neither normalised nor rotated), the attention block's "
                "output differs from Qwen3Attention's by up to {diff}",
                case=case,
                diff=fmt((out - want_out).abs().max()),
            )
        )


@hidden("ch19.3", "random shapes, positions, bases and dtypes")
def random_qk(t: Trial) -> None:
    for i in range(6):
        n, kv, group = t.random.randint(1, 6), t.random.choice([1, 2]), t.random.choice([1, 2, 4])
        d = t.random.choice([4, 16, 64, 128])
        dtype = torch.bfloat16 if i % 2 else torch.float32
        q = (torch.randn(n, kv * group, d, generator=t.rng) * 3).to(dtype)
        k = (torch.randn(n, kv, d, generator=t.rng) * 3).to(dtype)
        start = t.random.randrange(2000)
        positions = list(range(start, start + n))
        run_qk_case(
            t,
            q,
            k,
            random_weight(t, d, dtype),
            random_weight(t, d, dtype),
            positions,
            t.random.choice([10000.0, 1e6]),
            tr("{n} tokens from position {start}, d={d}, {dtype}", n=n, start=start, d=d, dtype=str(dtype)[6:]),
            eps=t.random.choice([1e-6, 1e-5]),
        )


@hidden("ch19.3", "Qwen3-0.6B shapes: 16 query heads, 8 K/V heads, head_dim 128, bf16")
def qwen3_shapes(t: Trial) -> None:
    q = torch.randn(3, 16, 128, generator=t.rng).bfloat16()
    k = torch.randn(3, 8, 128, generator=t.rng).bfloat16()
    run_qk_case(
        t,
        q,
        k,
        random_weight(t, 128, torch.bfloat16),
        random_weight(t, 128, torch.bfloat16),
        [40, 41, 42],
        1e6,
        tr("Qwen3-0.6B, a chunk at positions 40–42"),
    )


@hidden("ch19.3", "tokens in any order: each token rotated at its own position")
def unordered_positions(t: Trial) -> None:
    positions = [9, 0, 4, 4, 30]
    q, k = torch.randn(5, 2, 8, generator=t.rng), torch.randn(5, 2, 8, generator=t.rng)
    run_qk_case(
        t, q, k, random_weight(t, 8), random_weight(t, 8), positions, 10000.0, tr("positions {positions}", positions=short(positions))
    )


# -- ch19.4 -------------------------------------------------------------------------------------------


@hidden("ch19.4", "random shapes, cache lengths and bases")
def random_attention(t: Trial) -> None:
    for _ in range(8):
        n, kv, group = t.random.randint(1, 6), t.random.choice([1, 2]), t.random.choice([1, 2, 4])
        d, c = t.random.choice([4, 8, 32, 64]), t.random.choice([0, 1, 3, 17, t.random.randrange(200)])
        base = t.random.choice([10000.0, 1e6])
        q = torch.randn(n, kv * group, d, generator=t.rng) * 2
        k, v = torch.randn(n, kv, d, generator=t.rng) * 2, torch.randn(n, kv, d, generator=t.rng)
        k_cache, v_cache = cached(t, c, kv, d, base) if c else (None, None)
        run_attention_case(
            t,
            q,
            k,
            v,
            random_weight(t, d),
            random_weight(t, d),
            base,
            k_cache,
            v_cache,
            tr("{n} new tokens after {c} cached, Hq={hq}, Hkv={kv}, d={d}", n=n, c=c, hq=kv * group, kv=kv, d=d),
            eps=t.random.choice([1e-6, 1e-5]),
        )


@hidden("ch19.4", "a chunk after a cache gives the rows of one prefill of the whole sequence")
def chunk_equals_prefill(t: Trial) -> None:
    c, n, d, base = 5 + t.random.randrange(20), 1 + t.random.randrange(4), 16, 1e6
    q, k = torch.randn(c + n, 4, d, generator=t.rng) * 2, torch.randn(c + n, 2, d, generator=t.rng) * 2
    v = torch.randn(c + n, 2, d, generator=t.rng)
    wq, wk = random_weight(t, d), random_weight(t, d)
    whole = expect_attention(t.yours.rope_attention(q, k, v, wq, wk, base, EPS), q)
    _, k_cache = t.ref.qk_norm_rope(q[:c], k[:c], wq, wk, list(range(c)), base, EPS)  # the cache as stored
    part = expect_attention(t.yours.rope_attention(q[c:], k[c:], v[c:], wq, wk, base, EPS, k_cache, v[:c]), q[c:])
    bad = wrong_values(part, whole[c:], ATTN_TOL, ATTN_TOL)
    if bad.any():
        i, h, _ = (int(x) for x in bad.nonzero()[0])
        # The chunk's (or else the prefill's) output compared with the reference's names the mistake, if one fits.
        named = reference_hint(t, part, q[c:], k[c:], v[c:], wq, wk, base, EPS, k_cache, v[:c]) or reference_hint(
            t, whole, q, k, v, wq, wk, base, EPS
        )
        raise CheckFailed(
            tr(
                "{s} tokens: one prefill of all of them, then the last {n} again as a chunk after "
                "a cache of the first {c} (keys normalised and rotated at positions 0 … {last})",
                s=c + n,
                n=n,
                c=c,
                last=c - 1,
            ),
            tr(
                "token at position {p}, query head {h}: the prefill gives {whole} in channel 0, your chunk {part}; "
                "the same token at the same position must give the same output either way",
                p=c + i,
                h=h,
                whole=fmt(whole[c + i, h, 0]),
                part=fmt(part[i, h, 0]),
            ),
            hint=named
            or tr("the chunk's tokens stand at positions C … C + N − 1 after the C cached ones, and the cached keys are used as stored"),
        )


@hidden("ch19.4", "agreement with transformers' Qwen3Attention: a chunk after a cached prefix")
def hf_attention_with_cache(t: Trial) -> None:
    config, qwen3, attn = hf_attention(t)
    c, n = 6, 3
    x = torch.randn(1, c + n, 32, generator=t.rng)
    cos, sin = hf_cos_sin(qwen3, config, list(range(c + n)))
    mask = torch.full((c + n, c + n), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        want = attn(x, (cos[None], sin[None]), mask)[0][0, c:]
        q = attn.q_proj(x[0]).view(c + n, 4, 16)
        k = attn.k_proj(x[0]).view(c + n, 2, 16)
        v = attn.v_proj(x[0]).view(c + n, 2, 16)
        wq, wk = attn.q_norm.weight.detach().clone(), attn.k_norm.weight.detach().clone()
        # the cache as Qwen3Attention leaves it: k_norm, then RoPE, at positions 0 … c − 1; v as projected
        normed = attn.k_norm(k[:c]).transpose(0, 1)[None]
        _, k_cache = qwen3.apply_rotary_pos_emb(normed, normed, cos[None, :c], sin[None, :c])
    got = t.yours.rope_attention(
        q[c:], k[c:], v[c:], wq, wk, 1e6, config.rms_norm_eps, k_cache[0].transpose(0, 1).contiguous(), v[:c].contiguous()
    )
    y = expect_attention(got, q[c:])
    out = attn.o_proj(y.reshape(n, 64)).detach()
    if not agrees(out, want, atol=1e-4, rtol=1e-4):
        cache = k_cache[0].transpose(0, 1).contiguous(), v[:c].contiguous()
        named = reference_hint(t, y, q[c:], k[c:], v[c:], wq, wk, 1e6, config.rms_norm_eps, *cache)
        raise CheckFailed(
            tr(
                "transformers Qwen3Attention, {c} cached tokens and {n} new, Hq=4, Hkv=2, d=16: after "
                "o_proj, your attention output differs from Qwen3Attention's by up to {diff}",
                c=c,
                n=n,
                diff=fmt((out - want).abs().max()),
            ),
            hint=named
            or tr(
                "q_norm/k_norm, then RoPE on q and k at positions C … C + N − 1, cached keys as stored, V untouched, causal "
                "attention aligned to the end"
            ),
        )


@hidden("ch19.4", "Qwen3-0.6B shapes in bf16: a decode step after 40 cached tokens")
def qwen3_decode_bf16(t: Trial) -> None:
    q = torch.randn(1, 16, 128, generator=t.rng).bfloat16()
    k, v = torch.randn(1, 8, 128, generator=t.rng).bfloat16(), torch.randn(1, 8, 128, generator=t.rng).bfloat16()
    k_cache, v_cache = cached(t, 40, 8, 128, 1e6)
    run_attention_case(
        t,
        q,
        k,
        v,
        random_weight(t, 128, torch.bfloat16),
        random_weight(t, 128, torch.bfloat16),
        1e6,
        k_cache.bfloat16(),
        v_cache.bfloat16(),
        tr("Qwen3-0.6B, decode at position 40, bf16"),
    )


# -- helpers ---------------------------------------------------------------------------------------------


def hf_attention(t: Trial):
    """transformers' Qwen3Attention on a tiny config (Hq=4, Hkv=2, d=16, hidden 32, base 1e6) with weights from the
    grading seed: (config, the qwen3 module, the attention layer). Norm weights look learned, not initial."""
    config, qwen3 = tiny_qwen3(t, head_dim=16, base=1e6, heads=4, kv_heads=2)
    attn = qwen3.Qwen3Attention(config, layer_idx=0).eval()
    with torch.no_grad():
        for proj in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj):
            proj.weight.copy_(torch.randn(proj.weight.shape, generator=t.rng) * 0.3)
        for norm in (attn.q_norm, attn.k_norm):
            norm.weight.copy_(random_weight(t, 16))
    return config, qwen3, attn


def tiny_qwen3(t: Trial, *, head_dim: int, base: float, heads: int = 4, kv_heads: int = 2):
    """A tiny Qwen3 config built in code (no download), and the modeling module."""
    t.require("transformers")
    from transformers.models.qwen3 import modeling_qwen3 as qwen3

    # transformers 5 still takes rope_theta and attn_implementation (as legacy keywords it maps onto rope_parameters
    # and the attention setting) but no longer declares them; 4.x declares both
    config = qwen3.Qwen3Config(
        hidden_size=32,
        intermediate_size=48,
        num_attention_heads=heads,  # type: ignore[call-arg]
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        rope_theta=base,
        num_hidden_layers=1,
        vocab_size=16,
        max_position_embeddings=4096,
        attn_implementation="eager",
    )
    return config, qwen3


def hf_cos_sin(qwen3, config, positions: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3RotaryEmbedding's full-width [N, d] cos and sin (float32) for one sequence."""
    rotary = qwen3.Qwen3RotaryEmbedding(config)
    cos, sin = rotary(torch.zeros(1, dtype=torch.float32), torch.tensor([positions]))
    return cos[0], sin[0]
