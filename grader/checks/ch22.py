"""Public checks of ch22 · naive attention vs FlashAttention, and the messages they share with the hidden ones
(FlashAttention's are in `ch22_explain`). The values a misconception gives come from the hidden side's models
(`naive_variants`, `traffic_variants`), asked for before comparing."""

from __future__ import annotations

import math

import torch

from grader.authoring import (
    CheckFailed,
    Hint,
    Trial,
    describe,
    expect_int,
    expect_tensor,
    first_wrong,
    fmt,
    hidden_model,
    mistakes,
    public,
    wrong_mask,
)
from grader.checks.ch22_explain import ATOL, RTOL, case_line, check_trace, close_to_variant, run_flash_case, sees
from grader.i18n import tr

# ch22-naive: one head, T = S = 4, d = 2, small integers a reader can recompute; fp32 (4 bytes).
NAIVE_Q = [[1, 0], [0, 1], [1, 1], [2, 0]]
NAIVE_K = [[1, 0], [1, 1], [0, 2], [-1, 1]]
NAIVE_V = [[1, 0], [0, 1], [1, 1], [2, -1]]
NAIVE_DTYPE_BYTES = 4
# ... and the traffic of a 4k-token prompt for one head of Qwen3-0.6B (d = 128) in bf16.
BIG = dict(T=4096, S=4096, d=128, dtype_bytes=2)

# ch22-flash-tiles: 6 new queries after 2 cached tokens (S = 8), d = 4, tiles of 2 queries × 3 keys.
FLASH_T, FLASH_S, FLASH_D, FLASH_BQ, FLASH_BK = 6, 8, 4, 2, 3

naive_variants = hidden_model("ch22_models.naive_variants")
"""`t.ref.drive(naive_variants, q, k, v, causal)`: (scores, probs, out) under each wrong mask, scale and softmax."""
traffic_variants = hidden_model("ch22_models.traffic_variants")
"""`t.ref.drive(traffic_variants, T, S, d, b, flash)`: the byte counts `traffic_hint` recognises."""
M = mistakes("ch22")


# -- ch22.1 naive_attention, attention_hbm_bytes ----------------------------------------------------


@public("ch22.1", "figure instance: naive attention materialises scores and probs (T = S = 4, d = 2)")
def naive_figure_instance(t: Trial) -> None:
    q, k, v = naive_tensors()
    out, scores, probs = expect_naive(t.yours.naive_attention(q, k, v), q, k)
    want_out, mid = t.ref.naive_attention(q, k, v)
    variants = t.ref.drive(naive_variants, q, k, v, True)
    t.figure(
        "ch22-naive",
        q=q,
        k=k,
        v=v,
        scores=scores,
        probs=probs,
        out=out,
        expected_scores=mid["scores"],
        expected_probs=mid["probs"],
        expected_out=want_out,
        **{
            f"{name}_wrong": wrong_mask(got, want, atol=ATOL, rtol=RTOL)
            for name, got, want in (("scores", scores, mid["scores"]), ("probs", probs, mid["probs"]), ("out", out, want_out))
        },
    )
    explain_naive(
        (scores, probs, out), (mid["scores"], mid["probs"], want_out), q, k, v, causal=True, case=tr("figure instance"), variants=variants
    )


@public("ch22.1", "a chunk of 3 queries after 4 cached keys: the mask is aligned to the end")
def naive_chunk(t: Trial) -> None:
    q, k, v = random_qkv(t, 3, 7, 8)
    run_naive_case(t, q, k, v, case=tr("3 new tokens after 4 cached"))


@public("ch22.1", "not causal: 5 queries over 3 keys")
def naive_not_causal(t: Trial) -> None:
    q, k, v = random_qkv(t, 5, 3, 4)
    run_naive_case(t, q, k, v, causal=False, case=tr("not causal, T=5, S=3"))


@public("ch22.1", "figure instance: HBM bytes of the 4 × 4 example and of a 4k prompt (bf16)")
def traffic_figure_instance(t: Trial) -> None:
    small = (len(NAIVE_Q), len(NAIVE_K), len(NAIVE_Q[0]), NAIVE_DTYPE_BYTES)
    big = (BIG["T"], BIG["S"], BIG["d"], BIG["dtype_bytes"])
    cases = [(args, flash) for args in (small, big) for flash in (False, True)]
    got = [t.yours.attention_hbm_bytes(*args, flash=flash) for args, flash in cases]
    want = [t.ref.attention_hbm_bytes(*args, flash=flash) for args, flash in cases]
    variants = [t.ref.drive(traffic_variants, *args, flash) for args, flash in cases]
    if all(type(g) is int for g in got):
        t.figure(
            "ch22-naive",
            small_bytes=got[:2],
            small_expected=want[:2],
            big=BIG,
            big_bytes=got[2:],
            big_expected=want[2:],
            dtype_bytes=NAIVE_DTYPE_BYTES,
        )
    for (args, flash), g, w, v in zip(cases, got, want, variants):
        expect_traffic(g, w, *args, flash, v)


@public("ch22.1", "HBM bytes: fp32, T = 1024 queries over S = 3072 keys")
def traffic_rectangular(t: Trial) -> None:
    for flash in (False, True):
        run_traffic_case(t, 1024, 3072, 64, 4, flash)


# -- ch22.2 flash_attention (explained in ch22_explain) -----------------------------------------------


@public("ch22.2", "figure instance: 6 queries after 2 cached, tiles of 2 × 3 (trace of running max and sum)")
def flash_figure_instance(t: Trial) -> None:
    q, k, v = flash_tensors()
    check_trace(t, q, k, v, causal=True, bq=FLASH_BQ, bk=FLASH_BK, case=tr("figure instance"), figure="ch22-flash-tiles")


@public("ch22.2", "agrees with naive attention: T = S = 16, tiles of 4 × 4, causal")
def flash_square(t: Trial) -> None:
    q, k, v = random_qkv(t, 16, 16, 8)
    run_flash_case(t, q, k, v, bq=4, bk=4, case=tr("T = S = 16, 4 × 4 tiles"))


@public("ch22.2", "ragged tiles: T = S = 10, tiles of 4 × 3")
def flash_ragged(t: Trial) -> None:
    q, k, v = random_qkv(t, 10, 10, 8)
    run_flash_case(t, q, k, v, bq=4, bk=3, case=tr("ragged tiles"))


@public("ch22.2", "a chunk of 5 queries after 7 cached keys: causal aligned to the end")
def flash_chunk(t: Trial) -> None:
    q, k, v = random_qkv(t, 5, 12, 8)
    run_flash_case(t, q, k, v, bq=2, bk=4, case=tr("5 new tokens after 7 cached"))


@public("ch22.2", "not causal: 7 queries over 5 keys, every tile visited")
def flash_not_causal(t: Trial) -> None:
    q, k, v = random_qkv(t, 7, 5, 4)
    run_flash_case(t, q, k, v, causal=False, bq=3, bk=2, case=tr("not causal, T=7, S=5"))


@public("ch22.2", "large scores: the online softmax stays finite, lse = m + log l")
def flash_large_scores(t: Trial) -> None:
    # Scores up to about ±100: exp(score) overflows float32 (above ~88) unless the running max is subtracted.
    q, k, v = random_qkv(t, 8, 8, 16, magnitude=40.0)
    run_flash_case(t, q, k, v, bq=4, bk=4, case=tr("scores up to about ±100"), atol=1e-4, rtol=1e-4)


# -- helpers: the instances -------------------------------------------------------------------------


def naive_tensors() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q, k, v = (torch.tensor(x, dtype=torch.float32) for x in (NAIVE_Q, NAIVE_K, NAIVE_V))
    return q, k, v


def flash_tensors() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(2022)
    q, k, v = (torch.randn(n, FLASH_D, generator=g).mul(1.5).round(decimals=1) for n in (FLASH_T, FLASH_S, FLASH_S))
    return q, k, v


def random_qkv(t: Trial, T: int, S: int, d: int, magnitude: float = 1.0):
    return (torch.randn(T, d, generator=t.rng) * magnitude, torch.randn(S, d, generator=t.rng), torch.randn(S, d, generator=t.rng))


# -- helpers of ch22.1: naive attention, explained ----------------------------------------------------


def expect_naive(got, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Require (out [T, d], {"scores": [T, S], "probs": [T, S]}) in q's dtype."""
    (T, d), S = q.shape, k.shape[0]
    dt = str(q.dtype).removeprefix("torch.")
    if type(got) not in (tuple, list) or len(got) != 2:
        raise CheckFailed(tr("naive_attention returns a pair (out, intermediates); yours: {got}", got=describe(got)))
    out, mid = got
    out = expect_tensor(out, what=tr("out, the output of {T} queries (d = {d})", T=T, d=d), shape=[T, d], dtype=q.dtype)
    if type(mid) is not dict or not {"scores", "probs"} <= set(mid):
        keys = sorted(map(str, mid)) if type(mid) is dict else describe(mid)
        raise CheckFailed(
            tr(
                'expected the intermediates as a dict with the keys "scores" and "probs" (the two '
                "[{T}, {S}] matrices a naive kernel writes to HBM); yours: {keys}",
                T=T,
                S=S,
                keys=keys,
            )
        )
    scores, probs = (
        expect_tensor(
            mid[n], what=tr('intermediates["{n}"] ({T} queries × {S} keys, {dt})', n=n, T=T, S=S, dt=dt), shape=[T, S], dtype=q.dtype
        )
        for n in ("scores", "probs")
    )
    return out, scores, probs


def mask_whys(T: int, S: int, causal: bool) -> list[tuple[str, Hint | None]]:
    """(mask, mistake) for the right mask ("", None) and the masks a misconception gives."""
    whys: list[tuple[str, Hint | None]] = [("", None)]
    if causal and S > T:
        whys.append(("top-left", M.naive_topleft.format(offset=S - T)))
    whys.append(("no mask", M.naive_no_mask) if causal else ("mask", M.naive_mask_not_causal))
    return whys


def scale_whys(d: int) -> list[tuple[str, Hint | None]]:
    return [("", None), ("unscaled", M.unscaled.format(d=d)), ("1/d", M.scale_1_over_d.format(d=d))]


def naive_hint(which: int, got: torch.Tensor, variants: dict, T: int, S: int, d: int, causal: bool) -> list[Hint]:
    """The misconceptions whose (scores, probs, out) reproduce the student's scores (0), probs (1) or out (2), one
    to three at once (a mask, a scale, a fill or softmax dimension); [] if none. `variants` is `naive_variants`'
    answer for the instance."""
    others: list[tuple[str, Hint | None]] = [("", None)]
    if causal:
        others.append(("fill 0", M.fill_zero))
    if which:
        others.append(("dim 0", M.softmax_dim0))
    for m_key, m_why in mask_whys(T, S, causal):
        for s_key, s_why in scale_whys(d):
            for o_key, o_why in others:
                alt = variants["combos"].get(f"{m_key}|{s_key}|{o_key}")
                if alt is not None and close_to_variant(got, alt[which]):
                    return [w for w in (m_why, s_why, o_why) if w]
    if which == 2 and close_to_variant(got, variants["no softmax"]):
        return [M.no_softmax]
    return []


def explain_naive(
    got: tuple, want: tuple, q, k, v, *, causal: bool, case: str, variants: dict, atol: float = ATOL, rtol: float = RTOL
) -> None:
    """Raise a teaching message at the first wrong score, probability or output element.
    `got` and `want` are (scores, probs, out), in the order naive attention computes them; `variants` is
    `naive_variants`' answer for the instance."""
    (T, d), S = q.shape, k.shape[0]
    for which, name in enumerate(("scores", "probs", "out")):
        g, w = got[which], want[which]
        idx = first_wrong(g, w, atol=atol, rtol=rtol)
        if idx is None:
            continue
        i, j = idx
        count = int(wrong_mask(g, w, atol=atol, rtol=rtol).sum())
        visible = not causal or j <= S - T + i
        if name == "scores":
            dot = float(q[i].double() @ k[j].double())
            line = (
                tr(
                    "scores[{i}, {j}]: expected q[{i}]·k[{j}]/√{d} = {dot}/{root} = {want}; yours {got}",
                    i=i,
                    j=j,
                    d=d,
                    dot=fmt(dot),
                    root=fmt(math.sqrt(d)),
                    want=fmt(dot / math.sqrt(d)),
                    got=fmt(g[i, j]),
                )
                if visible
                else tr("scores[{i}, {j}]: expected −∞ (key {j} is in the future of query {i}); yours {got}", i=i, j=j, got=fmt(g[i, j]))
            )
        elif name == "probs":
            shown = {"i": i, "j": j, "want": fmt(w[i, j]), "got": fmt(g[i, j]), "sum": fmt(g[i].sum())}
            line = (
                tr(
                    "probs[{i}, {j}]: expected softmax(scores[{i}])[{j}] = {want}; yours {got} (your row {i} sums to {sum}, "
                    "a softmax row to 1)",
                    **shown,
                )
                if visible
                else tr(
                    "probs[{i}, {j}]: expected softmax(scores[{i}])[{j}] = {want} (a future key gets probability 0); yours {got} "
                    "(your row {i} sums to {sum}, a softmax row to 1)",
                    **shown,
                )
            )
        else:
            line = tr(
                "out[{i}, {j}]: expected Σ_keys probs[{i}, key]·v[key, {j}] = {want}; yours {got}",
                i=i,
                j=j,
                want=fmt(w[i, j]),
                got=fmt(g[i, j]),
            )
        hints = naive_hint(which, g, variants, T, S, d, causal)
        if not hints and name != "scores" and not torch.isfinite(g[torch.isfinite(w)]).all():
            hints = [M.unstable_softmax]
        raise CheckFailed(
            case_line(case, q, k, causal),
            sees(T, S, i, causal),
            tr(
                "{line}  ({count} of {total} {name} differ beyond {atol} + {rtol}·|expected|)",
                line=line,
                count=count,
                total=w.numel(),
                name=name,
                atol=format(atol, "g"),
                rtol=format(rtol, "g"),
            ),
            hint=hints,
        )


def run_naive_case(
    t: Trial, q, k, v, *, causal: bool = True, case: str, atol: float = ATOL, rtol: float = RTOL
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    out, scores, probs = expect_naive(t.yours.naive_attention(q, k, v, causal=causal), q, k)
    want_out, mid = t.ref.naive_attention(q, k, v, causal=causal)
    variants = t.ref.drive(naive_variants, q, k, v, causal)
    explain_naive(
        (scores, probs, out),
        (mid["scores"], mid["probs"], want_out),
        q,
        k,
        v,
        causal=causal,
        case=case,
        variants=variants,
        atol=atol,
        rtol=rtol,
    )
    return out, scores, probs


# -- helpers of ch22.1: the traffic model, explained ------------------------------------------------


def traffic_derivation(T: int, S: int, d: int, b: int, flash: bool, want: int) -> str:
    if flash:
        return tr(
            "FlashAttention reads Q, K, V once and writes O: (2·T·d + 2·S·d)·dtype_bytes, plus the lse in "
            "float32, 4·T: (2·{T:,}·{d} + 2·{S:,}·{d})·{b} + 4·{T:,} = {want:,} bytes",
            T=T,
            S=S,
            d=d,
            b=b,
            want=want,
        )
    return tr(
        "naive: read Q, K (T·d + S·d), write and read back the scores (2·T·S), write and read back the "
        "probabilities (2·T·S), read V (S·d), write O (T·d): (2·T·d + 2·S·d + 4·T·S)·dtype_bytes = "
        "(2·{T:,}·{d} + 2·{S:,}·{d} + 4·{T:,}·{S:,})·{b} = {want:,} bytes",
        T=T,
        S=S,
        d=d,
        b=b,
        want=want,
    )


def traffic_hint(got, T: int, S: int, d: int, b: int, flash: bool, variants: dict | None = None) -> str:
    """The misconception that explains a wrong byte count ('' when none fits); `variants` is `traffic_variants`'
    answer for the inputs (asked of the hidden side here when not given)."""
    v = variants if variants is not None else traffic_variants(None, T, S, d, b, flash)
    if flash:
        if got == v["naive"]:
            return M.flash_counts_matrices
        if got == v["io"]:
            return M.no_lse
        if got == v["lse at dtype_bytes"] and b != 4:
            return M.lse_dtype
        if got == v["flash without O"]:
            return M.no_output
    else:
        if got == v["flash"]:
            return M.naive_without_matrices
        if got == v["naive, one crossing"]:
            return M.one_crossing
        if got == v["naive, three crossings"]:
            return M.three_crossings
        if got == v["naive without O"]:
            return M.no_output
    want = v["flash"] if flash else v["naive"]
    if b > 1 and got * b == want:
        return M.elements
    if got == 8 * want:
        return M.bits
    return ""


def expect_traffic(got, want: int, T: int, S: int, d: int, b: int, flash: bool, variants: dict | None = None) -> int:
    """Require the exact byte count as a Python int, with the model's derivation on a difference (`variants`:
    `traffic_variants`' answer, which public checks ask for before comparing)."""
    inputs = f"T={T:,}, S={S:,}, d={d}, dtype_bytes={b}, flash={flash}"
    try:
        expect_int(got, what=tr("the byte count for {inputs}", inputs=inputs))
    except CheckFailed as e:
        raise CheckFailed(*e.lines, hint=M.float_bytes if isinstance(got, float) else "") from None
    if got == want:
        return got
    raise CheckFailed(
        tr("inputs: {inputs}", inputs=inputs),
        traffic_derivation(T, S, d, b, flash, want),
        tr("yours: {got:,}", got=got),
        hint=traffic_hint(got, T, S, d, b, flash, variants),
    )


def run_traffic_case(t: Trial, T: int, S: int, d: int, b: int, flash: bool) -> int:
    got = t.yours.attention_hbm_bytes(T, S, d, b, flash=flash)
    want = t.ref.attention_hbm_bytes(T, S, d, b, flash=flash)
    return expect_traffic(got, want, T, S, d, b, flash, t.ref.drive(traffic_variants, T, S, d, b, flash))
