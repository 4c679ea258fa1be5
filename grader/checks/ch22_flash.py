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

from grader.authoring import CheckFailed, Trial, describe, expect_tensor, first_wrong, fmt, hidden_model, wrong_mask

# Tolerances for float32 attention (flash_attention must agree with naive attention to these).
ATOL, RTOL = 1e-5, 1e-5

flash_models = hidden_model("ch22_models.flash_models")
"""`t.ref.drive(flash_models, q, k, v, causal, bq, bk)`: the trace, tiles and misconception values of one instance."""


def sees(T: int, S: int, i: int, causal: bool) -> str:
    if not causal:
        return f"query {i} sees all {S} keys (not causal)"
    return f"query {i} is at position {S} − {T} + {i} = {S - T + i} and sees keys 0 … {S - T + i}"


def case_line(case: str, q: torch.Tensor, k: torch.Tensor, causal: bool, extra: str = "") -> str:
    (T, d), S = q.shape, k.shape[0]
    return f'case "{case}": q [{T}, {d}], k/v [{S}, {d}], causal={causal}, scale 1/√{d}{extra}'


def close_to_variant(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-4) -> bool:
    """Whether a student's values match a variant: ±inf only where the variant has the same, nan never."""
    if a.shape != b.shape or bool(torch.isnan(a).any()):
        return False
    a, b = a.double(), b.double()
    finite = torch.isfinite(a)
    return bool(((a == b) | finite).all()) and torch.allclose(a[finite], b[finite], atol=tol, rtol=tol)


# -- 22.2 flash_attention: values --------------------------------------------------------------------

def expect_flash(got, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Require (out [T, d], lse [T]) in q's dtype."""
    T, d = q.shape
    dt = str(q.dtype).removeprefix("torch.")
    if type(got) not in (tuple, list) or len(got) != 2:
        raise CheckFailed(f"flash_attention returns a pair (out, lse); yours: {describe(got)}")
    out = expect_tensor(got[0], what=f"out, the output of {T} queries (d = {d})", shape=[T, d], dtype=q.dtype)
    lse = expect_tensor(got[1], what=f"lse, one {dt} log-sum-exp per query row", shape=[T], dtype=q.dtype)
    return out, lse


def flash_whys(T: int, S: int, d: int, bk: int, causal: bool) -> list[tuple[str, str]]:
    """(misconception, why) for the mistakes the chapter names, in the order they are tried; `flash_models`
    holds each one's (out, lse)."""
    rescale = ("when a tile raises a row's running max from m to m_new, everything summed so far was measured "
               "against the old max: multiply {what} by α = exp(m − m_new) before adding this tile's terms")
    out = [("acc", rescale.format(what="the accumulator acc")), ("l", rescale.format(what="the running sum l")),
           ("acc and l", rescale.format(what="both acc and l"))]
    if causal and S > T:
        out.append(("top-left", f"the causal mask is aligned to the end: query i is at position S − T + i = {S - T} "
                                f"+ i and sees keys 0 … {S - T} + i (the top-left alignment lets it see keys 0 … i "
                                f"only)"))
    if causal:
        out.append(("whole tiles", "tiles that cross the diagonal must mask their future keys (key j > S − T + i "
                                   "gets −inf); skipping whole future tiles is not enough"))
        out.append(("causal flipped", "causal=True: mask the keys after each query's position and skip the future "
                                      "tiles"))
    else:
        out.append(("causal flipped", "causal=False: every query sees every key, no tile is skipped or masked"))
    if S % bk:
        out.append(("floor k blocks", f"the last key block is ragged: S = {S} = {S // bk}·{bk} + {S % bk}, so "
                                      f"there are ⌈{S}/{bk}⌉ = {-(-S // bk)} key blocks and the last holds {S % bk} "
                                      f"key(s); loop with range(0, S, block_k) and end each block at "
                                      f"min(start + block_k, S)"))
    out += [("unscaled", f"scale the scores by 1/√d = 1/√{d}; you did not scale them"),
            ("1/d", f"the scale is 1/√d = 1/√{d}, not 1/d")]
    return out


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
    return (f"the last query block is ragged: T = {T} = {T // bq}·{bq} + {T % bq}, so there are ⌈{T}/{bq}⌉ = "
            f"{-(-T // bq)} query blocks and the last holds {T % bq} row(s); loop with range(0, T, block_q) and "
            f"end each block at min(start + block_q, T) (T // block_q = {T // bq} blocks misses it)")


def last_records(trace: list) -> list:
    """The last record of each query block, in query-block order: its m and l are the final ones."""
    last = {}
    for r in trace:
        last[r[0]] = r
    return [last[qb] for qb in sorted(last)]


def lse_hint(lse: torch.Tensor, want: torch.Tensor, models: dict, T: int, S: int, d: int, bk: int,
             causal: bool) -> str:
    if not torch.isfinite(lse).all() and torch.isfinite(want).all():
        return ("inf/nan: log Σ exp(score) computed directly overflows once a score passes ~88 in float32; keep "
                "the running max m and return lse = m + log l, where l sums exp(score − m)")
    final_m = torch.tensor([x for r in last_records(models["trace"]) for x in r[2]], dtype=torch.float64)
    if close_to_variant(lse, want.double() - final_m):
        return ("lse = m + log l: your lse is log l alone, but l sums exp(score − m), measured against the "
                "running max m; add m back")
    if close_to_variant(lse, final_m):
        return "lse = m + log l, not the running max m alone"
    if close_to_variant(lse, want.double() / math.log(2)):
        return "lse is a natural logarithm (log, not log2)"
    return flash_hint(1, lse, models, T, S, d, bk, causal)


def explain_flash(out, lse, want_out, want_lse, q, k, v, *, causal: bool, bq: int, bk: int, case: str,
                  atol: float = ATOL, rtol: float = RTOL, models: dict | None = None) -> None:
    """Raise a teaching message at the first wrong output or lse element. `models` is `flash_models`' answer for
    this instance; without it (hidden checks only) the hints ask the hidden side once they are needed."""
    (T, d), S = q.shape, k.shape[0]
    need = lambda: models if models is not None else flash_models(None, q, k, v, causal, bq, bk)
    blocks = f", block_q={bq}, block_k={bk}"
    idx = first_wrong(out, want_out, atol=atol, rtol=rtol)
    if idx is not None:
        i, j = idx
        bad = wrong_mask(out, want_out, atol=atol, rtol=rtol)
        last = (S - T + i if causal else S - 1) // bk
        lines = [case_line(case, q, k, causal, blocks),
                 f"{sees(T, S, i, causal)}: query block {i // bq} (its row {i % bq}), key blocks 0 … {last}",
                 f"out[{i}, {j}]: expected {fmt(want_out[i, j])} (naive attention); yours {fmt(out[i, j])}  "
                 f"({int(bad.sum())} of {want_out.numel()} elements differ beyond {atol:g} + {rtol:g}·|expected|)"]
        hint = (flash_hint(0, out, need(), T, S, d, bk, causal)
                or ragged_rows_hint(sorted({int(r) for r in bad.nonzero()[:, 0]}), T, bq))
        if not hint and not torch.isfinite(out).all() and torch.isfinite(want_out).all():
            hint = ("your output has inf/nan: subtract the running max before exp, and visit each query block's "
                    "key blocks from 0 upward (key 0 is visible to every query, so the first tile sets a finite m)")
        raise CheckFailed("\n".join(lines + ([f"hint: {hint}"] if hint else [])))
    idx = first_wrong(lse, want_lse, atol=atol, rtol=rtol)
    if idx is not None:
        (i,) = idx
        bad = wrong_mask(lse, want_lse, atol=atol, rtol=rtol)
        lines = [case_line(case, q, k, causal, blocks), sees(T, S, i, causal),
                 f"lse[{i}]: expected log Σ_visible exp(q[{i}]·k/√{d}) = {fmt(want_lse[i])}; yours {fmt(lse[i])}  "
                 f"({int(bad.sum())} of {T} rows differ)"]
        hint = (lse_hint(lse, want_lse, need(), T, S, d, bk, causal)
                or ragged_rows_hint(sorted(int(r) for r in bad.nonzero()[:, 0]), T, bq))
        raise CheckFailed("\n".join(lines + ([f"hint: {hint}"] if hint else [])))


def flash_expected(t: Trial, q, k, v, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """What flash_attention must return: naive attention's output, and logsumexp of its scores."""
    want_out, mid = t.ref.naive_attention(q, k, v, causal=causal)
    return want_out, torch.logsumexp(mid["scores"].double(), dim=-1).to(q.dtype)


def run_flash_case(t: Trial, q, k, v, *, causal: bool = True, bq: int, bk: int, case: str, atol: float = ATOL,
                   rtol: float = RTOL) -> tuple[torch.Tensor, torch.Tensor]:
    got = t.yours.flash_attention(q, k, v, causal=causal, block_q=bq, block_k=bk)
    out, lse = expect_flash(got, q)
    want_out, want_lse = flash_expected(t, q, k, v, causal)
    models = t.ref.drive(flash_models, q, k, v, causal, bq, bk)
    explain_flash(out, lse, want_out, want_lse, q, k, v, causal=causal, bq=bq, bk=bk, case=case, atol=atol,
                  rtol=rtol, models=models)
    return out, lse


# -- 22.2 flash_attention: the trace -----------------------------------------------------------------

TRACE_FORMAT = ('one dict per visited tile, {"qb": query block, "kb": key block, "m": [running max of each row], '
                '"l": [running sum of each row]}')


def tile_text(qb: int, kb: int, T: int, S: int, bq: int, bk: int) -> str:
    q0, q1, k0, k1 = qb * bq, min(qb * bq + bq, T), kb * bk, min(kb * bk + bk, S)
    span = lambda one, many, a, b: f"{one} {a}" if a == b else f"{many} {a}–{b}"
    return f"tile (qb={qb}, kb={kb}): {span('query', 'queries', q0, q1 - 1)}, {span('key', 'keys', k0, k1 - 1)}"


def expect_trace(raw, T: int, S: int, bq: int, bk: int) -> list[tuple[int, int, list[float], list[float]]]:
    """Require the documented record format; return [(qb, kb, m, l)] with m, l as lists of floats."""
    if type(raw) is not list:
        raise CheckFailed(f"trace: append to the list passed as `trace` ({TRACE_FORMAT}); it came back as "
                          f"{describe(raw)}")
    if not raw and T:
        raise CheckFailed(f"trace: your flash_attention appended nothing to the list passed as `trace`; expected "
                          f"{TRACE_FORMAT} (append to the caller's list, do not rebind the name)")
    records = []
    for n, r in enumerate(raw):
        if type(r) is not dict or not {"qb", "kb", "m", "l"} <= set(r):
            raise CheckFailed(f"trace[{n}] should be {TRACE_FORMAT}; yours: "
                              f"{sorted(map(str, r)) if type(r) is dict else describe(r)}")
        qb, kb = r["qb"], r["kb"]
        if type(qb) is not int or type(kb) is not int:
            raise CheckFailed(f'trace[{n}]: "qb" and "kb" are block indices as Python ints; yours: {describe(qb)}, '
                              f"{describe(kb)}")
        rows = min(qb * bq + bq, T) - qb * bq if 0 <= qb < -(-T // bq) else None
        stats = []
        for key in ("m", "l"):
            x = r[key]
            x = x.tolist() if isinstance(x, torch.Tensor) and x.dim() == 1 else x
            if type(x) not in (list, tuple) or not all(type(e) in (int, float) for e in x) or \
                    (rows is not None and len(x) != rows):
                raise CheckFailed(f'trace[{n}] ("qb": {qb}, "kb": {kb}): "{key}" should list one float per row of '
                                  f"query block {qb}" + (f" ({rows} rows)" if rows else "") + f"; yours: {describe(x)}")
            stats.append([float(e) for e in x])
        records.append((qb, kb, *stats))
    return records


def explain_tiles(records: list, tiles: dict, T: int, S: int, bq: int, bk: int, causal: bool, case: str) -> None:
    """Every tile with a visible score exactly once, no future tile, key blocks in increasing order
    (`tiles` is `flash_models(...)["tiles"]`)."""
    want = tiles["visit"]
    got = [(r[0], r[1]) for r in records]
    head = f'case "{case}": T={T}, S={S}, block_q={bq}, block_k={bk}, causal={causal}'
    nq, nk = -(-T // bq), -(-S // bk)
    for qb, kb in got:
        if not (0 <= qb < nq and 0 <= kb < nk):
            raise CheckFailed(f"{head}\nyour trace has tile (qb={qb}, kb={kb}), which does not exist: ⌈{T}/{bq}⌉ = "
                              f"{nq} query blocks (0 … {nq - 1}) and ⌈{S}/{bk}⌉ = {nk} key blocks (0 … {nk - 1})")
    twice = [x for x in dict.fromkeys(got) if got.count(x) > 1]
    if twice:
        qb, kb = twice[0]
        raise CheckFailed(f"{head}\n{tile_text(qb, kb, T, S, bq, bk)} appears {got.count(twice[0])} times in your "
                          f"trace: each tile is visited once, its scores folded into m, l and acc once")
    hint = tiles_hint(set(got), tiles, T, S, bq, bk, causal)
    extra = [x for x in got if x not in want]
    if extra:
        qb, kb = extra[0]
        p = S - T + min(qb * bq + bq, T) - 1
        raise CheckFailed(f"{head}\nyour trace visits {tile_text(qb, kb, T, S, bq, bk)}; its last query, at position "
                          f"{p}, sees keys 0 … {p} < {kb * bk}: the whole tile is in the future, so FlashAttention "
                          f"skips it (no scores, no exp, no record). {len(extra)} future tile"
                          f"{'s' if len(extra) > 1 else ''} visited" + (f"\nhint: {hint}" if hint else ""))
    missing = [x for x in want if x not in got]
    if missing:
        qb, kb = missing[0]
        why = (f"its last query, at position {S - T + min(qb * bq + bq, T) - 1}, sees key {kb * bk}" if causal
               else "not causal: every tile holds visible scores")
        raise CheckFailed(f"{head}\n{tile_text(qb, kb, T, S, bq, bk)} is missing from your trace ({why}); "
                          f"{len(missing)} of the {len(want)} tiles with visible scores "
                          f"{'was' if len(missing) == 1 else 'were'} not visited"
                          + (f"\nhint: {hint}" if hint else ""))
    for qb in range(nq):
        kbs = [kb for b, kb in got if b == qb]
        if kbs != sorted(kbs):
            raise CheckFailed(f"{head}\nquery block {qb} visits key blocks in the order {kbs}: visit them in "
                              f"increasing order, so each row's first tile holds key 0 (visible to every query)")


def tiles_hint(got: set, tiles: dict, T: int, S: int, bq: int, bk: int, causal: bool) -> str:
    """The misconception behind a wrong set of visited tiles ('' when none fits)."""
    want = set(tiles["visit"])
    nq, nk = -(-T // bq), -(-S // bk)
    if causal and S > T and got == set(tiles["top-left"]):
        return (f"the causal mask is aligned to the end: query i is at position S − T + i = {S - T} + i, so a query "
                f"block ending at query i needs keys up to {S - T} + i (a top-left alignment stops at key i)")
    if causal and got == set(tiles["all"]):
        return ("skip the tiles entirely in the future: for the query block ending at query q_end − 1, stop the "
                "key loop at key S − T + q_end (exclusive), range(0, min(S, S − T + q_end), block_k)")
    missing = want - got
    if missing and got <= want:
        if T % bq and missing == {x for x in want if x[0] == nq - 1}:
            return ragged_rows_hint([T - 1], T, bq)
        if S % bk and missing == {x for x in want if x[1] == nk - 1}:
            return (f"the last key block is ragged: S = {S} = {S // bk}·{bk} + {S % bk}, so there are ⌈{S}/{bk}⌉ = "
                    f"{nk} key blocks; loop with range(0, S, block_k) so its {S % bk} key(s) are read")
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
                raise CheckFailed(f'case "{case}": your trace ends query block {qb} (kb={mine[-1][1]}) with row {r} '
                                  f"(query {i}) at m = {fmt(mi)}, l = {fmt(li)}, so lse = m + log l = "
                                  f"{fmt(mi)} + log {fmt(li)} = {fmt(from_trace)}; your flash_attention returned "
                                  f"lse[{i}] = {fmt(lse[i])}. Record m and l right after each tile's update, and "
                                  f"return lse = m + log l from those running values")


def explain_stats(records: list, models: dict, *, T: int, S: int, d: int, causal: bool, bq: int, bk: int, case: str,
                  tol: float = 1e-5) -> None:
    """Each tile's recorded running max and sum, against the model's after the same tile."""
    ref = {(r[0], r[1]): r for r in models["trace"]}
    for qb, kb, m, l in records:
        want = ref[qb, kb]
        for r in range(len(m)):
            if math.isclose(m[r], want[2][r], rel_tol=tol, abs_tol=tol) and \
                    math.isclose(l[r], want[3][r], rel_tol=tol, abs_tol=tol):
                continue
            i = qb * bq + r
            lines = [f'case "{case}": T={T}, S={S}, d={d}, block_q={bq}, block_k={bk}, causal={causal}',
                     f"after {tile_text(qb, kb, T, S, bq, bk)}, row {r} (query {i}): expected the running max "
                     f"m = {fmt(want[2][r])} (the largest visible q·k/√{d} over key blocks 0 … {kb}) and the running "
                     f"sum l = {fmt(want[3][r])} (Σ exp(score − m) over the same keys); yours m = {fmt(m[r])}, "
                     f"l = {fmt(l[r])}"]
            hint = stats_hint(qb, kb, r, m[r], l[r], d, models)
            raise CheckFailed("\n".join(lines + ([f"hint: {hint}"] if hint else [])))


def stats_hint(qb: int, kb: int, r: int, m: float, l: float, d: int, models: dict) -> str:
    """The misconception behind a wrong running max m or sum l of row r after tile (qb, kb) ('' if none)."""
    close = lambda a, b: math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-4)
    tile = lambda trace: {(x[0], x[1]): x for x in models[trace]}.get((qb, kb))
    right = tile("trace")
    if close(m, right[2][r] / d ** -0.5) or close(m, right[2][r] * d ** 0.5):
        return f"record m in units of the scaled scores q·k/√{d}; yours looks like the unscaled q·k"
    if kb and close(m, tile("trace without running max")[2][r]) and not close(m, right[2][r]):
        return "m is the running max over all key blocks so far, max(m, rowmax(s)), not this tile's max alone"
    if close(m, right[2][r]) and close(l, tile("trace without rescaled l")[3][r]):
        return ("when the max grows from m to m_new, the running sum was measured against the old max: "
                "l = exp(m − m_new)·l + rowsum(exp(s − m_new))")
    if kb:
        before = {(x[0], x[1]): x for x in models["trace"]}.get((qb, kb - 1))
        if before and close(m, before[2][r]) and close(l, before[3][r]):
            return "append the record after the tile's update: these are the values before it"
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
        # scores: shown tile by tile in the figure, as each tile computes them
        t.figure(figure, T=T, S=S, d=d, block_q=bq, block_k=bk, causal=causal, scores=models["scores"],
                 trace=[list(r) for r in records], expected_trace=[list(r) for r in models["trace"]],
                 lse=lse, expected_lse=want_lse, out=out, expected_out=want_out)
    explain_tiles(records, models["tiles"], T, S, bq, bk, causal, case)
    explain_flash(out, lse, want_out, want_lse, q, k, v, causal=causal, bq=bq, bk=bk, case=case, models=models)
    explain_final_stats(records, lse, T, bq, case)
    explain_stats(records, models, T=T, S=S, d=d, causal=causal, bq=bq, bk=bk, case=case)
