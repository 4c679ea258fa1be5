"""Hidden checks of ch22 · naive attention vs FlashAttention: random instances from the grading seed,
agreement with torch's scaled_dot_product_attention, many tilings with ragged edges, the trace of visited
tiles, and a memory limit that no [T, S]-sized tensor inside flash_attention fits."""

from __future__ import annotations

import torch.nn.functional as F

from grader.authoring import CheckFailed, OverBudget, Trial, expect_int, first_wrong, fmt, hidden, mistakes, wrong_mask
from grader.checks.ch22 import expect_naive, expect_traffic, explain_naive, naive_variants, random_qkv, run_naive_case, run_traffic_case
from grader.checks.ch22_explain import check_trace, expect_flash, run_flash_case
from grader.hidden.ch22_models import end_aligned
from grader.i18n import tr

# (T, S, causal) at d = 16 with 256 × 256 tiles (256 KiB of float32 scores each): the whole T × S float32 score
# matrix is 256 MiB at T = S = 8192 (its bool causal mask 64 MiB) and 64 MiB at T = 1024, S = 16384. The call may
# use FLASH_SPARE beyond q, k, v, measured by the run's memory budget (memory in use, from outside the student's
# processes; tests/test_ch22.py): the reference uses a few MiB beyond its inputs (one tile and its few temporaries,
# plus the allocator's slack), a [T, S] causal mask about 65 MiB (about 3× FLASH_SPARE), q @ k.T once about 520 MiB
# (T = S = 8192) and 130 MiB (1024 × 16384).
FLASH_MEMORY_CASES = ((8192, 8192, True), (1024, 16384, False))
FLASH_D, FLASH_TILE, FLASH_SPARE = 16, 256, 24 << 20
M = mistakes("ch22")


# -- ch22.1 naive_attention, attention_hbm_bytes ----------------------------------------------------


@hidden("ch22.1", "naive attention: random shapes, causal with S ≥ T and not causal")
def naive_random(t: Trial) -> None:
    for n in range(10):
        T, S, d = random_causal_shape(t)
        causal = n % 3 != 2
        if not causal:
            S = t.random.randint(1, 12)
        q, k, v = random_qkv(t, T, S, d)
        run_naive_case(t, q, k, v, causal=causal, case=f"T={T}, S={S}, d={d}, causal={causal}")


@hidden("ch22.1", "naive attention agrees with scaled_dot_product_attention (explicit end-aligned mask)")
def naive_sdpa(t: Trial) -> None:
    for causal in (True, False, True):
        T, S, d = random_causal_shape(t)
        q, k, v = random_qkv(t, T, S, d)
        out_, scores_, probs_ = expect_naive(t.yours.naive_attention(q, k, v, causal=causal), q, k)
        # SDPA's own is_causal=True is aligned to the top-left: pass the end-aligned mask explicitly.
        out = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=end_aligned(T, S) if causal else None)[0]
        scores = (q @ k.T) * d**-0.5
        if causal:
            scores = scores.masked_fill(~end_aligned(T, S), float("-inf"))
        explain_naive(
            (scores_, probs_, out_),
            (scores, scores.softmax(-1), out),
            q,
            k,
            v,
            causal=causal,
            case=tr("T={T}, S={S}, d={d}, against SDPA", T=T, S=S, d=d),
            variants=t.ref.drive(naive_variants, q, k, v, causal),
        )


@hidden("ch22.1", "naive attention: large scores stay finite (a stable softmax)")
def naive_large(t: Trial) -> None:
    q, k, v = random_qkv(t, 6, 9, 16, magnitude=60.0)
    run_naive_case(t, q, k, v, case=tr("scores up to about ±150"), atol=1e-4, rtol=1e-4)


@hidden("ch22.1", "HBM bytes: random sizes and dtypes, exact Python ints")
def traffic_random(t: Trial) -> None:
    for _ in range(12):
        T, S = t.random.randint(0, 1 << 17), t.random.randint(0, 1 << 17)
        d, b = t.random.choice([32, 64, 80, 96, 128, 256]), t.random.choice([1, 2, 4])
        run_traffic_case(t, T, S, d, b, t.random.random() < 0.5)
    run_traffic_case(t, 10**9 + 7, 10**9 + 9, 128, 2, False)  # beyond 2^53: exact only as an int


@hidden("ch22.1", "HBM bytes: flash < naive whenever T, S ≥ d; flash traffic has no T·S term")
def traffic_properties(t: Trial) -> None:
    # The properties are checked on your values first (they hold for any sound model), then the values themselves.
    for _ in range(8):
        d, b = t.random.choice([16, 64, 128]), t.random.choice([1, 2, 4])
        T, S = t.random.randint(d, 8192), t.random.randint(d, 8192)
        cases = [(T, S, False), (T, S, True), (2 * T, 2 * S, True)]
        got = [
            expect_int(
                t.yours.attention_hbm_bytes(x, y, d, b, flash=f),
                what=tr("the byte count for {inputs}", inputs="T={}, S={}, d={}, dtype_bytes={}, flash={}".format(x, y, d, b, f)),
            )
            for x, y, f in cases
        ]
        naive, flash, doubled = got
        if not flash < naive:
            raise CheckFailed(
                tr(
                    "T={T:,}, S={S:,}, d={d}, dtype_bytes={b}: FlashAttention must move fewer bytes than the naive kernels, "
                    "which also write and read back two [T, S] matrices; yours: flash {flash:,} vs naive {naive:,}",
                    T=T,
                    S=S,
                    d=d,
                    b=b,
                    flash=flash,
                    naive=naive,
                )
            )
        if doubled != 2 * flash:
            raise CheckFailed(
                tr(
                    "d={d}, dtype_bytes={b}: doubling T and S (from {T:,}, {S:,}) must double FlashAttention's traffic, "
                    "which is linear (no [T, S] matrix reaches HBM); yours goes from {flash:,} to {doubled:,} bytes",
                    d=d,
                    b=b,
                    T=T,
                    S=S,
                    flash=flash,
                    doubled=doubled,
                )
            )
        for (x, y, f), g in zip(cases, got):
            expect_traffic(g, t.ref.attention_hbm_bytes(x, y, d, b, flash=f), x, y, d, b, f)


# -- ch22.2 flash_attention ----------------------------------------------------------------------------


@hidden("ch22.2", "many tilings, causal: ragged last tiles and S > T (aligned to the end)")
def flash_tilings_causal(t: Trial) -> None:
    for _ in range(12):
        T, S, d = random_causal_shape(t, most=20)
        bq, bk = t.random.randint(1, 8), t.random.randint(1, 8)
        q, k, v = random_qkv(t, T, S, d)
        run_flash_case(t, q, k, v, bq=bq, bk=bk, case=tr("T={T}, S={S}, d={d}, {bq} × {bk} tiles", T=T, S=S, d=d, bq=bq, bk=bk))


@hidden("ch22.2", "many tilings, not causal (S may be < T)")
def flash_tilings_not_causal(t: Trial) -> None:
    for _ in range(8):
        T, S, d = t.random.randint(1, 16), t.random.randint(1, 16), t.random.choice([4, 8])
        bq, bk = t.random.randint(1, 7), t.random.randint(1, 7)
        q, k, v = random_qkv(t, T, S, d)
        case = tr("T={T}, S={S}, not causal, {bq} × {bk} tiles", T=T, S=S, bq=bq, bk=bk)
        run_flash_case(t, q, k, v, causal=False, bq=bq, bk=bk, case=case)


@hidden("ch22.2", "extreme tilings: one tile for everything, one element per tile, a decode step")
def flash_extreme_tilings(t: Trial) -> None:
    q, k, v = random_qkv(t, 9, 13, 8)
    run_flash_case(t, q, k, v, bq=64, bk=64, case=tr("blocks larger than T and S: one tile"))
    q, k, v = random_qkv(t, 5, 7, 4)
    run_flash_case(t, q, k, v, bq=1, bk=1, case=tr("1 × 1 tiles"))
    q, k, v = random_qkv(t, 1, 37, 16)
    run_flash_case(t, q, k, v, bq=4, bk=8, case=tr("decode: 1 query over 37 keys"))


@hidden("ch22.2", "the trace: every visible tile once, no future tile, running max/sum per tile, lse = m + log l")
def flash_trace(t: Trial) -> None:
    shapes = [(10, 10, 4, 3), (6, 17, 4, 5), (12, 12, 5, 2)]
    for _ in range(3):
        T, S, d = random_causal_shape(t, most=14)
        shapes.append((T, S, t.random.randint(1, 6), t.random.randint(1, 6)))
    for n, (T, S, bq, bk) in enumerate(shapes):
        q, k, v = random_qkv(t, T, S, 8, magnitude=3.0)  # spread scores: running maxima change from tile to tile
        check_trace(t, q, k, v, causal=n != 2, bq=bq, bk=bk, case=tr("T={T}, S={S}, {bq} × {bk} tiles", T=T, S=S, bq=bq, bk=bk))


@hidden("ch22.2", "no tensor of T·S elements is ever created (measured)")
def flash_memory(t: Trial) -> None:
    d, b = FLASH_D, FLASH_TILE
    for T, S, causal in FLASH_MEMORY_CASES:
        q, k, v = random_qkv(t, T, S, d)
        inputs = q.nbytes + k.nbytes + v.nbytes
        try:
            call = t.yours.flash_attention.run(q, k, v, causal=causal, block_q=b, block_k=b, memory=inputs + FLASH_SPARE)
        except OverBudget as e:
            raise explain_memory(e, inputs, T, S, d, causal, b, b, q.element_size()) from None
        out, lse = expect_flash(call.value, q)
        # A cheap wrong answer does not pass either. The reference's own tiled answer (in the grader's process):
        # naive attention would hold the [T, S] matrices the limit keeps out of the student's.
        want_out, want_lse = t.ref.flash_attention(q, k, v, causal=causal, block_q=b, block_k=b)
        for name, got, want in (("out", out, want_out), ("lse", lse, want_lse)):
            idx = first_wrong(got, want, atol=1e-4, rtol=1e-4)
            if idx is not None:
                bad = int(wrong_mask(got, want, atol=1e-4, rtol=1e-4).sum())
                where = ", ".join(map(str, idx))
                raise CheckFailed(
                    tr(
                        "case: T={T} queries, S={S} keys, d={d}, causal={causal}, block_q={bq}, block_k={bk}",
                        T=T,
                        S=S,
                        d=d,
                        causal=causal,
                        bq=b,
                        bk=b,
                    ),
                    tr(
                        "{name}[{where}]: expected {want}; yours {got} ({bad} of {total} differ beyond 1e-4 + 1e-4·|expected|)",
                        name=name,
                        where=where,
                        want=fmt(want[idx]),
                        got=fmt(got[idx]),
                        bad=bad,
                        total=want.numel(),
                    ),
                    tr(
                        "your flash_attention fits in memory here, but its values are wrong: the checks on "
                        "small instances show where they first differ"
                    ),
                )


@hidden("ch22.2", "large scores: finite output, exact lse")
def flash_large(t: Trial) -> None:
    for T, S, bq, bk in ((7, 11, 3, 4), (9, 9, 2, 5)):
        q, k, v = random_qkv(t, T, S, 16, magnitude=60.0)
        run_flash_case(t, q, k, v, bq=bq, bk=bk, case=tr("T={T}, S={S}, scores up to about ±150", T=T, S=S), atol=1e-4, rtol=1e-4)


# -- helpers ------------------------------------------------------------------------------------------


def random_causal_shape(t: Trial, most: int = 12) -> tuple[int, int, int]:
    T = t.random.randint(1, most)
    return T, T + t.random.choice([0, 0, 1, 3, 9]), t.random.choice([4, 8, 16])


def mib(n: int) -> str:
    return f"{n / 2**20:,.4g} MiB"


def explain_memory(e: OverBudget, inputs: int, T: int, S: int, d: int, causal: bool, bq: int, bk: int, itemsize: int) -> CheckFailed:
    """The chapter's lesson for a flash_attention that used more memory than the check allows (one tile fits
    easily); the hint follows what it used: a whole score matrix, a whole causal mask, or more than one tile."""
    used = e.used - inputs
    lines = [
        tr(
            "case: T={T} queries, S={S} keys, d={d}, causal={causal}, block_q={bq}, block_k={bk}",
            T=T,
            S=S,
            d=d,
            causal=causal,
            bq=bq,
            bk=bk,
        ),
        tr(
            "your flash_attention used {used} beyond its inputs, where this check allows {allowed}; the whole T × S score "
            "matrix alone is {matrix} (a [T, S] bool mask {mask}).",
            used=e.beyond(inputs),
            allowed=mib(FLASH_SPARE),
            matrix=mib(T * S * itemsize),
            mask=mib(T * S),
        )
        if causal
        else tr(
            "your flash_attention used {used} beyond its inputs, where this check allows {allowed}; the whole T × S score "
            "matrix alone is {matrix}.",
            used=e.beyond(inputs),
            allowed=mib(FLASH_SPARE),
            matrix=mib(T * S * itemsize),
        ),
        tr(
            "FlashAttention never holds it: each step works on one tile [{bq}, {bk}] of scores ({tile}) and keeps only the "
            "running max m and sum l [{bq}] and the accumulator acc [{bq}, {d}] of its query block, so memory stays linear "
            "in T and S (the arithmetic is still T·S·d).",
            bq=bq,
            bk=bk,
            tile=mib(bq * bk * itemsize),
            d=d,
        ),
    ]
    if used >= T * S * itemsize:
        hint = M.full_scores
    elif used >= T * S and causal:
        hint = M.full_mask
    else:
        hint = M.one_tile.format(mask=tr("; and {also}", also=M.full_mask) if causal else "")
    return CheckFailed(*lines, hint=hint)
