"""ch22's FlashAttention explanations, shared by its public and hidden checks: the values (out and
lse) against naive attention, the tiles a causal loop must visit, and the running max and sum of each
row after every tile, each explained where the student's answer first differs.

What they compare with beyond the reference's answers (the tiles to visit, the per-tile statistics, the
values each misconception gives) comes from `flash_models`, a driver of the hidden side's closed-form
model (`grader/hidden/ch22_models.py`), asked for before comparing: a student release replays it.
"""

from __future__ import annotations

import math

import torch

from grader.authoring import CheckFailed, Hint, Trial, describe, expect_tensor, first_wrong, fmt, hidden_model, mistakes, wrong_mask
from grader.i18n import tr

# Tolerances for float32 attention (flash_attention must agree with naive attention to these).
ATOL, RTOL = 1e-5, 1e-5
STATS_TOL = 1e-5  # a recorded running max or sum agrees with the model's (relative or absolute)

flash_models = hidden_model("ch22_models.flash_models")
"""`t.ref.drive(flash_models, q, k, v, causal, bq, bk)`: the trace, tiles and misconception values of one instance."""
M = mistakes("ch22")


def sees(T: int, S: int, i: int, causal: bool) -> str:
    if not causal:
        return tr("query {i} sees all {S} keys (not causal)", i=i, S=S)
    return tr("query {i} is at position {S} − {T} + {i} = {p} and sees keys 0 … {p}", i=i, S=S, T=T, p=S - T + i)


def case_line(case: str, q: torch.Tensor, k: torch.Tensor, causal: bool, extra: str = "") -> str:
    (T, d), S = q.shape, k.shape[0]
    return tr(
        'case "{case}": q [{T}, {d}], k/v [{S}, {d}], causal={causal}, scale 1/√{d}{extra}',
        case=case,
        T=T,
        d=d,
        S=S,
        causal=causal,
        extra=extra,
    )


def close_to_variant(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-4) -> bool:
    """Whether a student's values match a variant: ±inf only where the variant has the same, nan never."""
    if a.shape != b.shape or bool(torch.isnan(a).any()):
        return False
    a, b = a.double(), b.double()
    finite = torch.isfinite(a)
    return bool(((a == b) | finite).all()) and torch.allclose(a[finite], b[finite], atol=tol, rtol=tol)


# -- ch22.2 flash_attention: values ------------------------------------------------------------------


def expect_flash(got, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Require (out [T, d], lse [T]) in q's dtype."""
    T, d = q.shape
    dt = str(q.dtype).removeprefix("torch.")
    if type(got) not in (tuple, list) or len(got) != 2:
        raise CheckFailed(tr("flash_attention returns a pair (out, lse); yours: {got}", got=describe(got)))
    out = expect_tensor(got[0], what=tr("out, the output of {T} queries (d = {d})", T=T, d=d), shape=[T, d], dtype=q.dtype)
    lse = expect_tensor(got[1], what=tr("lse, one {dt} log-sum-exp per query row", dt=dt), shape=[T], dtype=q.dtype)
    return out, lse


def flash_whys(T: int, S: int, d: int, bk: int, causal: bool) -> list[tuple[str, Hint]]:
    """(misconception, hint) for the mistakes the chapter names, in the order they are tried; `flash_models`
    holds each one's (out, lse)."""
    out = [("acc", M.acc_not_rescaled), ("l", M.l_not_rescaled), ("acc and l", M.acc_and_l_not_rescaled)]
    if causal and S > T:
        out.append(("top-left", M.flash_topleft.format(offset=S - T)))
    if causal:
        out += [("whole tiles", M.whole_tiles), ("causal flipped", M.flash_not_causal)]
    else:
        out.append(("causal flipped", M.flash_causal_always))
    if S % bk:
        out.append(("floor k blocks", ragged_keys_hint(S, bk)))
    return out + [("unscaled", M.unscaled.format(d=d)), ("1/d", M.scale_1_over_d.format(d=d))]


def flash_hint(which: int, got: torch.Tensor, models: dict, T: int, S: int, d: int, bk: int, causal: bool) -> str:
    """The misconception whose (out, lse) reproduces the student's out (0) or lse (1); '' if none."""
    for key, why in flash_whys(T, S, d, bk, causal):
        if close_to_variant(got, models["variants"][key][which]):
            return why
    return ""


def ragged_rows_hint(rows: list[int], T: int, bq: int) -> str:
    """The hint for wrong rows that all lie in the last, ragged query block ('' otherwise)."""
    if T % bq == 0 or not rows or min(rows) < T // bq * bq:
        return ""
    return M.floor_q_blocks.format(T=T, bq=bq, full=T // bq, rest=T % bq, n=-(-T // bq))


def ragged_keys_hint(S: int, bk: int) -> Hint:
    """The hint for a last, ragged key block left out."""
    return M.floor_k_blocks.format(S=S, bk=bk, full=S // bk, rest=S % bk, n=-(-S // bk))


def last_records(trace: list) -> list:
    """The last record of each query block, in query-block order: its m and l are the final ones."""
    last = {}
    for r in trace:
        last[r[0]] = r
    return [last[qb] for qb in sorted(last)]


def lse_hint(lse: torch.Tensor, want: torch.Tensor, models: dict, T: int, S: int, d: int, bk: int, causal: bool) -> str:
    if not torch.isfinite(lse).all() and torch.isfinite(want).all():
        return M.lse_overflow
    final_m = torch.tensor([x for r in last_records(models["trace"]) for x in r[2]], dtype=torch.float64)
    if close_to_variant(lse, want.double() - final_m):
        return M.lse_without_max
    if close_to_variant(lse, final_m):
        return M.lse_max_only
    if close_to_variant(lse, want.double() / math.log(2)):
        return M.lse_log2
    return flash_hint(1, lse, models, T, S, d, bk, causal)


def explain_flash(
    out,
    lse,
    want_out,
    want_lse,
    q,
    k,
    v,
    *,
    causal: bool,
    bq: int,
    bk: int,
    case: str,
    atol: float = ATOL,
    rtol: float = RTOL,
    models: dict | None = None,
) -> None:
    """Raise a teaching message at the first wrong output or lse element. `models` is `flash_models`' answer for
    this instance; without it (hidden checks only) the hints ask the hidden side once they are needed."""
    (T, d), S = q.shape, k.shape[0]
    need = lambda: models if models is not None else flash_models(None, q, k, v, causal, bq, bk)
    blocks = tr(", block_q={bq}, block_k={bk}", bq=bq, bk=bk)
    idx = first_wrong(out, want_out, atol=atol, rtol=rtol)
    if idx is not None:
        i, j = idx
        bad = wrong_mask(out, want_out, atol=atol, rtol=rtol)
        last = (S - T + i if causal else S - 1) // bk
        hint = flash_hint(0, out, need(), T, S, d, bk, causal) or ragged_rows_hint(sorted({int(r) for r in bad.nonzero()[:, 0]}), T, bq)
        if not hint and not torch.isfinite(out).all() and torch.isfinite(want_out).all():
            hint = M.flash_unstable
        raise CheckFailed(
            case_line(case, q, k, causal, blocks),
            tr(
                "{sees}: query block {qb} (its row {r}), key blocks 0 … {last}", sees=sees(T, S, i, causal), qb=i // bq, r=i % bq, last=last
            ),
            tr(
                "out[{i}, {j}]: expected {want} (naive attention); yours {got}  ({bad} of {total} elements differ beyond "
                "{atol} + {rtol}·|expected|)",
                i=i,
                j=j,
                want=fmt(want_out[i, j]),
                got=fmt(out[i, j]),
                bad=int(bad.sum()),
                total=want_out.numel(),
                atol=format(atol, "g"),
                rtol=format(rtol, "g"),
            ),
            hint=hint,
        )
    idx = first_wrong(lse, want_lse, atol=atol, rtol=rtol)
    if idx is not None:
        (i,) = idx
        bad = wrong_mask(lse, want_lse, atol=atol, rtol=rtol)
        raise CheckFailed(
            case_line(case, q, k, causal, blocks),
            sees(T, S, i, causal),
            tr(
                "lse[{i}]: expected log Σ_visible exp(q[{i}]·k/√{d}) = {want}; yours {got}  ({bad} of {T} rows differ)",
                i=i,
                d=d,
                want=fmt(want_lse[i]),
                got=fmt(lse[i]),
                bad=int(bad.sum()),
                T=T,
            ),
            hint=(
                lse_hint(lse, want_lse, need(), T, S, d, bk, causal) or ragged_rows_hint(sorted(int(r) for r in bad.nonzero()[:, 0]), T, bq)
            ),
        )


def flash_expected(t: Trial, q, k, v, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """What flash_attention must return: naive attention's output, and logsumexp of its scores."""
    want_out, mid = t.ref.naive_attention(q, k, v, causal=causal)
    return want_out, torch.logsumexp(mid["scores"].double(), dim=-1).to(q.dtype)


def run_flash_case(
    t: Trial, q, k, v, *, causal: bool = True, bq: int, bk: int, case: str, atol: float = ATOL, rtol: float = RTOL
) -> tuple[torch.Tensor, torch.Tensor]:
    got = t.yours.flash_attention(q, k, v, causal=causal, block_q=bq, block_k=bk)
    out, lse = expect_flash(got, q)
    want_out, want_lse = flash_expected(t, q, k, v, causal)
    models = t.ref.drive(flash_models, q, k, v, causal, bq, bk)
    explain_flash(out, lse, want_out, want_lse, q, k, v, causal=causal, bq=bq, bk=bk, case=case, atol=atol, rtol=rtol, models=models)
    return out, lse


# -- ch22.2 flash_attention: the trace ---------------------------------------------------------------


def trace_format() -> str:
    """The documented record format of a trace, in the run's language (no fields: `format` only undoes the doubled
    braces)."""
    return tr(
        'one dict per visited tile, {{"qb": query block, "kb": key block, "m": [running max of each row], "l": [running sum of each row]}}'
    ).format()


def tile_text(qb: int, kb: int, T: int, S: int, bq: int, bk: int) -> str:
    q0, q1, k0, k1 = qb * bq, min(qb * bq + bq, T), kb * bk, min(kb * bk + bk, S)
    queries = tr("query {a}", a=q0) if q0 == q1 - 1 else tr("queries {a}–{b}", a=q0, b=q1 - 1)
    keys = tr("key {a}", a=k0) if k0 == k1 - 1 else tr("keys {a}–{b}", a=k0, b=k1 - 1)
    return tr("tile (qb={qb}, kb={kb}): {queries}, {keys}", qb=qb, kb=kb, queries=queries, keys=keys)


def expect_trace(raw, T: int, S: int, bq: int, bk: int) -> list[tuple[int, int, list[float], list[float]]]:
    """Require the documented record format; return [(qb, kb, m, l)] with m, l as lists of floats."""
    if type(raw) is not list:
        raise CheckFailed(
            tr("trace: append to the list passed as `trace` ({format}); it came back as {got}", format=trace_format(), got=describe(raw))
        )
    if not raw and T:
        raise CheckFailed(
            tr(
                "trace: your flash_attention appended nothing to the list passed as `trace`; expected "
                "{format} (append to the caller's list, do not rebind the name)",
                format=trace_format(),
            )
        )
    records = []
    for n, r in enumerate(raw):
        if type(r) is not dict or not {"qb", "kb", "m", "l"} <= set(r):
            yours = sorted(map(str, r)) if type(r) is dict else describe(r)
            raise CheckFailed(tr("trace[{n}] should be {format}; yours: {got}", n=n, format=trace_format(), got=yours))
        qb, kb = r["qb"], r["kb"]
        if type(qb) is not int or type(kb) is not int:
            raise CheckFailed(
                tr('trace[{n}]: "qb" and "kb" are block indices as Python ints; yours: {qb}, {kb}', n=n, qb=describe(qb), kb=describe(kb))
            )
        rows = min(qb * bq + bq, T) - qb * bq if 0 <= qb < -(-T // bq) else None
        stats: list[list[float]] = []
        for key in ("m", "l"):
            x = r[key]
            x = x.tolist() if isinstance(x, torch.Tensor) and x.dim() == 1 else x
            if type(x) not in (list, tuple) or not all(type(e) in (int, float) for e in x) or (rows is not None and len(x) != rows):
                shown = {"n": n, "qb": qb, "kb": kb, "key": key, "rows": rows, "got": describe(x)}
                raise CheckFailed(
                    tr(
                        'trace[{n}] ("qb": {qb}, "kb": {kb}): "{key}" should list one float per row of query block {qb} '
                        "({rows} rows); yours: {got}",
                        **shown,
                    )
                    if rows
                    else tr(
                        'trace[{n}] ("qb": {qb}, "kb": {kb}): "{key}" should list one float per row of query block {qb}; yours: {got}',
                        **shown,
                    )
                )
            stats.append([float(e) for e in x])
        records.append((qb, kb, stats[0], stats[1]))
    return records


def explain_tiles(records: list, tiles: dict, T: int, S: int, bq: int, bk: int, causal: bool, case: str) -> None:
    """Every tile with a visible score exactly once, no future tile, key blocks in increasing order
    (`tiles` is `flash_models(...)["tiles"]`)."""
    want = tiles["visit"]
    got = [(r[0], r[1]) for r in records]
    head = tr('case "{case}": T={T}, S={S}, block_q={bq}, block_k={bk}, causal={causal}', case=case, T=T, S=S, bq=bq, bk=bk, causal=causal)
    nq, nk = -(-T // bq), -(-S // bk)
    for qb, kb in got:
        if not (0 <= qb < nq and 0 <= kb < nk):
            raise CheckFailed(
                head,
                tr(
                    "your trace has tile (qb={qb}, kb={kb}), which does not exist: ⌈{T}/{bq}⌉ = {nq} query blocks (0 … {lq}) "
                    "and ⌈{S}/{bk}⌉ = {nk} key blocks (0 … {lk})",
                    qb=qb,
                    kb=kb,
                    T=T,
                    bq=bq,
                    nq=nq,
                    lq=nq - 1,
                    S=S,
                    bk=bk,
                    nk=nk,
                    lk=nk - 1,
                ),
            )
    twice = [x for x in dict.fromkeys(got) if got.count(x) > 1]
    if twice:
        qb, kb = twice[0]
        raise CheckFailed(
            head,
            tr(
                "{tile} appears {n} times in your trace: each tile is visited once, its scores folded into m, l and acc once",
                tile=tile_text(qb, kb, T, S, bq, bk),
                n=got.count(twice[0]),
            ),
        )
    hint = tiles_hint(set(got), tiles, T, S, bq, bk, causal)
    extra = [x for x in got if x not in want]
    if extra:
        qb, kb = extra[0]
        p = S - T + min(qb * bq + bq, T) - 1
        raise CheckFailed(
            head,
            tr(
                "your trace visits {tile}; its last query, at position {p}, sees keys 0 … {p} < {k0}: the whole tile is in "
                "the future, so FlashAttention skips it (no scores, no exp, no record). {n} future tiles visited",
                tile=tile_text(qb, kb, T, S, bq, bk),
                p=p,
                k0=kb * bk,
                n=len(extra),
            )
            if len(extra) > 1
            else tr(
                "your trace visits {tile}; its last query, at position {p}, sees keys 0 … {p} < {k0}: the whole tile is in "
                "the future, so FlashAttention skips it (no scores, no exp, no record)",
                tile=tile_text(qb, kb, T, S, bq, bk),
                p=p,
                k0=kb * bk,
            ),
            hint=hint,
        )
    missing = [x for x in want if x not in got]
    if missing:
        qb, kb = missing[0]
        why = (
            tr("its last query, at position {p}, sees key {k0}", p=S - T + min(qb * bq + bq, T) - 1, k0=kb * bk)
            if causal
            else tr("not causal: every tile holds visible scores")
        )
        shown = {"tile": tile_text(qb, kb, T, S, bq, bk), "why": why, "n": len(missing), "total": len(want)}
        raise CheckFailed(
            head,
            tr("{tile} is missing from your trace ({why}); {n} of the {total} tiles with visible scores was not visited", **shown)
            if len(missing) == 1
            else tr("{tile} is missing from your trace ({why}); {n} of the {total} tiles with visible scores were not visited", **shown),
            hint=hint,
        )
    for qb in range(nq):
        kbs = [kb for b, kb in got if b == qb]
        if kbs != sorted(kbs):
            raise CheckFailed(
                head,
                tr(
                    "query block {qb} visits key blocks in the order {kbs}: visit them in increasing order, so each row's "
                    "first tile holds key 0 (visible to every query)",
                    qb=qb,
                    kbs=kbs,
                ),
            )


def tiles_hint(got: set, tiles: dict, T: int, S: int, bq: int, bk: int, causal: bool) -> str:
    """The misconception behind a wrong set of visited tiles ('' when none fits)."""
    want = set(tiles["visit"])
    nq, nk = -(-T // bq), -(-S // bk)
    if causal and S > T and got == set(tiles["top-left"]):
        return M.flash_topleft.format(offset=S - T)
    if causal and got == set(tiles["all"]):
        return M.no_skip
    missing = want - got
    if missing and got <= want:
        if T % bq and missing == {x for x in want if x[0] == nq - 1}:
            return ragged_rows_hint([T - 1], T, bq)
        if S % bk and missing == {x for x in want if x[1] == nk - 1}:
            return ragged_keys_hint(S, bk)
    return ""


def explain_final_stats(records: list, lse: torch.Tensor, T: int, bq: int, case: str) -> None:
    """The last record of each query block must give the returned lse: lse = m + log l."""
    for qb in range(-(-T // bq)):
        mine = [r for r in records if r[0] == qb]
        if not mine:
            continue
        m, l = mine[-1][2], mine[-1][3]
        for r, (mi, li) in enumerate(zip(m, l)):
            i = qb * bq + r
            from_trace = mi + math.log(li) if li > 0 else -math.inf
            if not math.isclose(from_trace, float(lse[i]), rel_tol=1e-4, abs_tol=1e-4):
                raise CheckFailed(
                    tr(
                        'case "{case}": your trace ends query block {qb} (kb={kb}) with row {r} (query {i}) at m = {m}, l = {l}, '
                        "so lse = m + log l = {m} + log {l} = {lse}; your flash_attention returned lse[{i}] = {got}. Record m and l "
                        "right after each tile's update, and return lse = m + log l from those running values",
                        case=case,
                        qb=qb,
                        kb=mine[-1][1],
                        r=r,
                        i=i,
                        m=fmt(mi),
                        l=fmt(li),
                        lse=fmt(from_trace),
                        got=fmt(lse[i]),
                    )
                )


def stats_wrong(records: list, expected: list, tol: float = STATS_TOL) -> list[tuple[list[bool], list[bool]]]:
    """Per record of a trace, per row: whether its running max m and its running sum l differ from those the model
    has after the same tile (`expected`: `flash_models(...)["trace"]`); a tile the model never visits is all wrong."""
    ref = {(r[0], r[1]): r for r in expected}
    close = lambda a, b: math.isclose(a, b, rel_tol=tol, abs_tol=tol)
    out = []
    for qb, kb, m, l in records:
        want = ref.get((qb, kb))
        out.append(
            (
                [want is None or not close(x, want[2][r]) for r, x in enumerate(m)],
                [want is None or not close(x, want[3][r]) for r, x in enumerate(l)],
            )
        )
    return out


def explain_stats(records: list, models: dict, *, T: int, S: int, d: int, causal: bool, bq: int, bk: int, case: str) -> None:
    """Each tile's recorded running max and sum, against the model's after the same tile."""
    ref = {(r[0], r[1]): r for r in models["trace"]}
    for (qb, kb, m, l), (m_bad, l_bad) in zip(records, stats_wrong(records, models["trace"])):
        want = ref[qb, kb]
        for r in range(len(m)):
            if not (m_bad[r] or l_bad[r]):
                continue
            raise CheckFailed(
                tr(
                    'case "{case}": T={T}, S={S}, d={d}, block_q={bq}, block_k={bk}, causal={causal}',
                    case=case,
                    T=T,
                    S=S,
                    d=d,
                    bq=bq,
                    bk=bk,
                    causal=causal,
                ),
                tr(
                    "after {tile}, row {r} (query {i}): expected the running max m = {m} (the largest visible q·k/√{d} over key "
                    "blocks 0 … {kb}) and the running sum l = {l} (Σ exp(score − m) over the same keys); yours m = {got_m}, l = {got_l}",
                    tile=tile_text(qb, kb, T, S, bq, bk),
                    r=r,
                    i=qb * bq + r,
                    m=fmt(want[2][r]),
                    d=d,
                    kb=kb,
                    l=fmt(want[3][r]),
                    got_m=fmt(m[r]),
                    got_l=fmt(l[r]),
                ),
                hint=stats_hint(qb, kb, r, m[r], l[r], d, models),
            )


def stats_hint(qb: int, kb: int, r: int, m: float, l: float, d: int, models: dict) -> str:
    """The misconception behind a wrong running max m or sum l of row r after tile (qb, kb) ('' if none)."""
    close = lambda a, b: math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-4)
    tile = lambda trace: {(x[0], x[1]): x for x in models[trace]}[qb, kb]
    right = tile("trace")
    if close(m, right[2][r] / d**-0.5) or close(m, right[2][r] * d**0.5):
        return M.trace_unscaled_m.format(d=d)
    if kb and close(m, tile("trace without running max")[2][r]) and not close(m, right[2][r]):
        return M.trace_tile_max
    if close(m, right[2][r]) and close(l, tile("trace without rescaled l")[3][r]):
        return M.l_not_rescaled
    if kb:
        before = {(x[0], x[1]): x for x in models["trace"]}.get((qb, kb - 1))
        if before and close(m, before[2][r]) and close(l, before[3][r]):
            return M.trace_stale
    return ""


def check_trace(t: Trial, q, k, v, *, causal: bool, bq: int, bk: int, case: str, figure: str | None = None) -> None:
    """One call with a trace list: tiles, output, lse, final statistics and per-tile statistics."""
    (T, d), S = q.shape, k.shape[0]
    call = t.yours.flash_attention.run(q, k, v, causal=causal, block_q=bq, block_k=bk, trace=[], mutates=("trace",))
    out, lse = expect_flash(call.value, q)
    records = expect_trace(call.kwargs.get("trace"), T, S, bq, bk)
    want_out, want_lse = flash_expected(t, q, k, v, causal)
    models = t.ref.drive(flash_models, q, k, v, causal, bq, bk)
    if figure:
        # scores: shown tile by tile in the figure, as each tile computes them; the verdicts are the checks' below
        t.figure(
            figure,
            T=T,
            S=S,
            d=d,
            block_q=bq,
            block_k=bk,
            causal=causal,
            scores=models["scores"],
            trace=[list(r) for r in records],
            expected_trace=[list(r) for r in models["trace"]],
            trace_wrong=[list(w) for w in stats_wrong(records, models["trace"])],
            lse=lse,
            expected_lse=want_lse,
            lse_wrong=wrong_mask(lse, want_lse, atol=ATOL, rtol=RTOL),
            out=out,
            expected_out=want_out,
            out_wrong=wrong_mask(out, want_out, atol=ATOL, rtol=RTOL).any(dim=1),
        )
    explain_tiles(records, models["tiles"], T, S, bq, bk, causal, case)
    explain_flash(out, lse, want_out, want_lse, q, k, v, causal=causal, bq=bq, bk=bk, case=case, models=models)
    explain_final_stats(records, lse, T, bq, case)
    explain_stats(records, models, T=T, S=S, d=d, causal=causal, bq=bq, bk=bk, case=case)
