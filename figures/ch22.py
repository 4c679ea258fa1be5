"""Figures of ch22 · naive attention vs FlashAttention: the matrices naive attention writes to HBM and
reads back, with the traffic model's byte counts; FlashAttention's tiles, visited or skipped, with the
running max and sum after each."""

from __future__ import annotations

import math
from typing import Any, Callable

from figures import figure
from figures.kit import Figure, Grid, num
from figures.layout import Part, column, pad, row, wide
from figures.style import CELL, INK, LABEL, LABEL_SMALL, MUTED, SMALL, fill, stroke
from grader.i18n import tr


def _n3(x) -> str:
    return num(round(x, 3) if isinstance(x, float) and math.isfinite(x) else x)


def _n2(x) -> str:
    return num(round(x, 2) if isinstance(x, float) and math.isfinite(x) else x)


def _pair(a, b, wrong: bool) -> tuple[str, str]:
    """Yours and the expected value as written in a cell: 3 significant digits, or where the check found them
    different, enough digits to show it."""
    if b is None or not wrong:
        return _n3(a), "" if b is None else _n3(b)
    for digits in (3, 4, 5, 6):
        sa, sb = num(a, digits), num(b, digits)
        if sa != sb:
            break
    return sa, sb


def _ghost(f: Figure, w: float, h: float, label: str, sub: str) -> Part:
    """A matrix read back from HBM, drawn as a dashed box with its name and shape (its values are shown above)."""

    def draw(x: float, y: float) -> None:
        f.box(x, y, w, h, role="plain", dashed=True)
        f.text(x + w / 2, y + h / 2 - 2, label, size=LABEL, anchor="middle", cls="label")
        f.text(x + w / 2, y + h / 2 + 14, sub, size=SMALL, anchor="middle", color=MUTED, cls="label")

    return Part(w, h, draw)


def _lookup(roles: list[list[str]]) -> Callable[[int, int], str]:
    """A matrix's roles given cell by cell."""
    return lambda i, j: roles[i][j]


# -- ch22.1 -------------------------------------------------------------------------------------------


@figure(
    "ch22-naive",
    title="朴素 attention 的中间矩阵",
    zh="朴素实现分三个 kernel:分数 S = QKᵀ/√d(未来位置为 −∞)和概率 P = softmax(S) 都是完整的 [T, S] 矩阵,"
    "各写入 HBM 一次、再读回一次。大中间矩阵在 HBM 中往返,访存量随 T·S 增长。",
    en="Naive attention materialises the full score and probability matrices: three kernels, and both [T, S] "
    "matrices are written to HBM and read back by the next kernel, so the traffic grows with T·S.",
    needs={"scores": "ch22.1", "big_bytes": "ch22.1"},
)
def naive_figure(f: Figure, r: dict) -> None:
    q, k, v = r["q"], r["k"], r["v"]
    T, S, d, b = len(q), len(k), len(q[0]), r["dtype_bytes"]
    f.instance_row(
        [
            (f"T = S = {T}" if T == S else f"T = {T}, S = {S}", "token"),
            (f"d = {d}", "plain"),
            ("causal", "plain"),
            (f"scale = 1/√{d} ≈ {num(d**-0.5, 3)}", "plain"),
            (tr("fp32: {b} bytes per element", b=b), "plain"),
        ]
    )
    visible = [[j <= S - T + i for j in range(S)] for i in range(T)]
    rows = T * CELL

    def kernel(title: str, inputs: Part, out: Grid, reads: list[tuple[str, int]], write: tuple[str, int]) -> None:
        """One kernel: what it reads, the matrix it writes (yours, wrong cells marked), and its HBM traffic."""
        f.heading(title)
        big = write[0] in ("scores", "probs")
        traffic = f.table(
            [[(tr("HBM traffic of this kernel"), {"mono": False, "color": MUTED})]]
            + [[tr("read  {name}: {n} elements", name=name, n=n)] for name, n in reads]
            + [
                [(tr("write {name}: {n} elements", name=write[0], n=write[1]), {"color": stroke("accent") if big else INK, "bold": big})],
                [(f"= {sum(n for _, n in reads) + write[1]} × {b} B = {(sum(n for _, n in reads) + write[1]) * b} B", {"color": MUTED})],
            ],
            h=18,
            size=SMALL + 1.5,
            mono=True,
        )
        f.place(
            row(wide(pad(inputs, left=40, top=16 + (rows - inputs.h) / 2), 272), wide(out, 4 * 58), pad(traffic, top=12), gap=28), after=26
        )
        x, y, _, _ = out.cell_box(0, 0)
        f.arrow(x - 52, y + rows / 2, x - 12, y + rows / 2, color=INK, width=1.5)

    def matrix(key: str, role: Any, w: float) -> Grid:
        cols = len(r[key][0])
        return f.matrix(
            r[key],
            expected=r[f"expected_{key}"],
            wrong=r[f"{key}_wrong"],
            role=role,
            w=w,
            fmt=_n3,
            col_labels=[f"k{j}" for j in range(cols)] if cols == S else [f"d{j}" for j in range(cols)],
        )

    name = lambda s: f.label(s, size=LABEL, color=INK, bold=True)
    inputs = row(
        name("Q"),
        f.matrix(q, role="q", w=34),
        name("K"),
        f.matrix(k, role="k", w=34, row_labels=[f"k{j}" for j in range(S)]),
        gap=8,
        align="middle",
    )
    kernel(
        tr("① kernel 1: scores = Q·Kᵀ/√{d}, future keys −∞ → a full [{T}, {S}] matrix written to HBM", d=d, T=T, S=S),
        inputs,
        matrix("scores", lambda i, j: "plain" if visible[i][j] else "masked", 58),
        [("Q", T * d), ("K", S * d)],
        ("scores", T * S),
    )
    kernel(
        tr("② kernel 2: probs = softmax(scores) row by row → another [{T}, {S}] matrix", T=T, S=S),
        pad(_ghost(f, 170, rows - 20, f"scores [{T}, {S}]", tr("read back from HBM")), left=30),
        matrix("probs", lambda i, j: "attend" if visible[i][j] else "masked", 58),
        [("scores", T * S)],
        ("probs", T * S),
    )
    kernel(
        tr("③ kernel 3: out = probs · V → [{T}, {d}]", T=T, d=d),
        row(
            _ghost(f, 110, rows - 20, f"probs [{T}, {S}]", tr("read back from HBM")),
            name("V"),
            f.matrix(v, role="v", w=34),
            gap=8,
            align="middle",
        ),
        matrix("out", "v", 58),
        [("probs", T * S), ("V", S * d)],
        ("O", T * d),
    )

    # The model's totals for this instance and for a real prompt, from the student's attention_hbm_bytes.
    f.y += 12
    f.heading(tr("the traffic model, attention_hbm_bytes (your values)"))
    formulas = f.table(
        [
            [
                f"naive = (2·T·d + 2·S·d + 4·T·S)·{b}",
                ("=", {"color": MUTED}),
                (f"(2·{T}·{d} + 2·{S}·{d} + 4·{T}·{S})·{b}", {"color": MUTED}),
            ],
            [f"flash = (2·T·d + 2·S·d)·{b} + 4·T", ("=", {"color": MUTED}), (f"(2·{T}·{d} + 2·{S}·{d})·{b} + 4·{T}", {"color": MUTED})],
        ],
        h=CELL + 6,
        mono=True,
    )
    small, small_want = r["small_bytes"], r["small_expected"]
    counts = f.matrix(
        [[x] for x in small],
        expected=[[x] for x in small_want],
        wrong=[[g != w] for g, w in zip(small, small_want)],
        role=lambda i, j: "accent" if i == 0 else "plain",
        w=110,
        gap=6,
        fmt=lambda x: f"{x:,} B",
    )
    f.place(pad(row(pad(formulas, top=-3), counts, gap=24), top=8), after=26)  # text on the cells' centres

    big = r["big"]
    bT, bS, bd, bb = big["T"], big["S"], big["d"], big["dtype_bytes"]
    f.heading(tr("a 4k prompt: one head, T = S = {T:,}, d = {d}, bf16 ({b} bytes)", T=bT, d=bd, b=bb))
    io, sp = (2 * bT * bd + 2 * bS * bd) * bb, 4 * bT * bS * bb
    want_naive, want_flash = r["big_expected"]
    mib = lambda x: f"{x / 2**20:,.1f} MiB" if isinstance(x, (int, float)) else str(x)
    bars = f.bar_chart(
        r["big_bytes"],
        labels=[tr("naive"), "FlashAttention"],
        height=160,
        bar_w=96,
        gap=44,
        role=["accent", "q"],
        expected=r["big_expected"],
        fmt=mib,
        tol=0.0,
    )
    lines = f.table(
        [
            [(line, {"color": color, "mono": False})]
            for line, color in [
                (tr("Q, K, V read, O written: (2·T·d + 2·S·d)·{b} = {io:,} B", b=bb, io=io), INK),
                (tr("S and P written + read back: 4·T·S·{b} = {sp:,} B", b=bb, sp=sp), stroke("accent")),
                (tr("→ {share:.0%} of the naive traffic is [T, S] round trips", share=sp / want_naive), stroke("accent")),
                (tr("FlashAttention keeps tiles on chip, adds lse: 4·T = {lse:,} B", lse=4 * bT), INK),
                (tr("→ {ratio:.0f}× less traffic, the same T·S·d arithmetic", ratio=want_naive / want_flash), INK),
            ]
        ],
        h=20,
        size=SMALL + 1.5,
    )
    f.place(row(pad(f.lines(tr("bytes moved"), tr("(your values)")), top=90), bars, pad(lines, top=30), gap=20), after=24)
    wrong = any(any(any(x) for x in r[f"{key}_wrong"]) for key in ("scores", "probs", "out"))
    wrong = wrong or small != small_want or r["big_bytes"] != r["big_expected"]
    f.legend(
        [
            ("q", "Q"),
            ("k", "K"),
            ("v", "V, out"),
            ("plain", tr("score")),
            ("attend", tr("probability")),
            ("masked", tr("future key: −∞ / 0")),
            ("accent", tr("the [T, S] round trips")),
        ],
        wrong=wrong,
    )


# -- ch22.2 -------------------------------------------------------------------------------------------


@figure(
    "ch22-flash-tiles",
    title="FlashAttention 的分块视图",
    zh="6 个新 query 接在 2 个缓存 token 之后(S = 8),按 2 × 3 分块。每个 query 块按顺序访问它的 key 块,"
    "每行只维护运行最大值 m 和运行和 l;完全在未来的块直接跳过。算法不物化完整的分数/概率矩阵,"
    "但 dense attention 的算术规模仍是二次的。",
    en="FlashAttention's tiles and online softmax: 6 queries after 2 cached tokens (S = 8) in tiles of 2 × 3. "
    "Each query block visits its key blocks in order, keeping only a running max m and sum l per row; "
    "tiles entirely in the future are skipped. No full score matrix, still quadratic arithmetic.",
    needs={"trace": "ch22.2"},
)
def flash_tiles_figure(f: Figure, r: dict) -> None:
    T, S, d, bq, bk, causal = r["T"], r["S"], r["d"], r["block_q"], r["block_k"], r["causal"]
    trace, expected, scores = r["trace"], r["expected_trace"], r["scores"]
    nq, nk = -(-T // bq), -(-S // bk)
    want = {(x[0], x[1]): x for x in expected}
    order: dict[tuple, list[int]] = {}
    for n, x in enumerate(trace):
        order.setdefault((x[0], x[1]), []).append(n + 1)
    f.instance_row(
        [
            (tr("T = {T} new after {cached} cached", T=T, cached=S - T), "token"),
            (tr("S = {S} keys", S=S), "k"),
            (f"d = {d}", "plain"),
            (f"block_q = {bq}, block_k = {bk}", "accent"),
            (tr("causal (end-aligned)") if causal else tr("not causal"), "plain"),
        ]
    )

    f.heading(tr("scores q·k/√{d} of each tile, computed inside the tile; your visiting order", d=d))
    # Per query block: its rows' labels, its tiles, and the final statistics of its rows from your trace.
    last = {x[0]: x for x in trace}
    tiles: dict[tuple[int, int], Grid] = {}
    blocks = []
    for qb in range(nq):
        q0, q1 = qb * bq, min(qb * bq + bq, T)
        first = qb == 0
        for kb in range(nk):
            k0, k1 = kb * bk, min(kb * bk + bk, S)
            seen = [[not causal or j <= S - T + i for j in range(k0, k1)] for i in range(q0, q1)]
            should = (qb, kb) in want
            roles = [["attend" if x else "masked" for x in line] if should else ["plain"] * len(line) for line in seen]
            tiles[qb, kb] = f.matrix(
                [
                    [_n2(scores[i][j] if seen[i - q0][j - k0] else -math.inf) if should else "" for j in range(k0, k1)]
                    for i in range(q0, q1)
                ],
                w=44,
                h=32,
                fmt=str,
                role=_lookup(roles),
                col_labels=[f"k{j}" for j in range(k0, k1)] if first else None,
            )
        stats = []
        for i in range(q0, q1):
            rec = last.get(qb)
            m = rec[2][i - q0] if rec and i - q0 < len(rec[2]) else None
            l = rec[3][i - q0] if rec and i - q0 < len(rec[3]) else None
            lse, lse_want, bad = r["lse"][i], r["expected_lse"][i], r["lse_wrong"][i]
            diff = max(abs(a - e) if math.isfinite(a) else math.inf for a, e in zip(r["out"][i], r["expected_out"][i]))
            stats.append(
                [
                    ("—" if m is None else _n3(m), ""),
                    ("—" if l is None else _n3(l), ""),
                    (_n3(m + math.log(l)) if m is not None and l is not None and l > 0 else "—", ""),
                    _pair(lse, lse_want, bad),
                    (f"Δ {diff:.2g}" if r["out_wrong"][i] else tr("= naive"), tr("= naive")),
                ]
            )
        final = f.matrix(
            [[x for x, _ in s] for s in stats],
            expected=[[e for _, e in s] for s in stats],
            wrong=[[False, False, False, r["lse_wrong"][i], r["out_wrong"][i]] for i in range(q0, q1)],
            role=lambda i, j: ("plain", "plain", "plain", "accent", "v")[j],
            w=66,
            h=32,
            fmt=str,
            col_labels=[tr("final m"), tr("final l"), "m + log l", tr("your lse"), tr("out vs naive")] if first else None,
        )
        labels = f.table([[f"q{i} · pos {S - T + i}"] for i in range(q0, q1)], h=32, size=LABEL_SMALL, header=[""] if first else None)
        blocks.append(row(wide(labels, 74), row(*(tiles[qb, kb] for kb in range(nk)), gap=14), pad(final, left=18), gap=4))
    f.place(pad(column(*blocks, gap=18), top=14), after=34)
    wrong = any(r["lse_wrong"]) or any(r["out_wrong"])
    for (qb, kb), grid in tiles.items():
        box = grid.span_box(0, 0, grid.rows - 1, grid.cols - 1)
        x, y, w, h = box
        visited, should = (qb, kb) in order, (qb, kb) in want
        if visited != should:  # a tile visited in the future, or one with visible scores left out
            wrong = True
            f.dwg.add(f.dwg.rect((x, y), (w, h), fill="url(#hatch-wrong)", stroke=stroke("wrong"), stroke_width=2.4, class_="tile wrong"))
            f.text(
                x + w / 2,
                y + h / 2 + 4,
                tr("future: skip it") if visited else tr("not visited"),
                size=LABEL_SMALL,
                anchor="middle",
                color=stroke("wrong"),
                weight="bold",
                cls="label wrong",
            )
        elif should:
            f.outline(*box, color=INK, width=1.6)
        else:
            f.outline(*box, role="masked", width=1, dashed=True)
            f.text(x + w / 2, y + min(h, 32) / 2 + 4, tr("skipped"), size=LABEL_SMALL, anchor="middle", color=MUTED, cls="label")
        if visited:
            nums = ",".join(map(str, order[qb, kb]))
            f.dwg.add(
                f.dwg.circle((x - 3, y - 2), 9 + 3 * (len(nums) - 1), fill=fill("accent"), stroke=stroke("accent"), stroke_width=1.4)
            )  # on the corner, clear of the labels
            f.text(x - 3, y + 2, nums, size=SMALL + 0.5, anchor="middle", weight="bold", mono=True, cls="label")

    # The trace, tile by tile: the running statistics after each, and the rescaling when a max grew.
    f.heading(tr("after each visited tile (your trace): running max m and sum l of the block's rows"))
    rh, notes = 28, []
    prev: dict[int, list[float]] = {}
    values, expects, bad = [], [], []
    for (qb, kb, m, l), (m_bad, l_bad) in zip(trace, r["trace_wrong"]):
        ref = want.get((qb, kb))
        cells = []
        for stat, idx, stat_bad in ((m, 2, m_bad), (l, 3, l_bad)):
            for k in range(bq):
                exp = ref[idx][k] if ref and k < len(ref[idx]) else None
                mine, theirs = _pair(stat[k], exp, stat_bad[k]) if k < len(stat) else ("", "")
                cells.append((mine, tr("skip") if exp is None else theirs, k < len(stat) and stat_bad[k]))
        values.append([c[0] for c in cells])
        expects.append([c[1] for c in cells])
        bad.append([c[2] for c in cells])
        before = prev.get(qb)
        grew = (
            [(k, math.exp(before[k] - m[k])) for k in range(min(len(m), len(before))) if m[k] > before[k] + 1e-12]
            if before is not None
            else []
        )
        notes.append(
            [
                (tr("first tile: m from −∞"), {"color": MUTED})
                if before is None
                else tr(", ").join(tr("row {k}: ×{a:.2f}", k=k, a=a) for k, a in grew)
                if grew
                else tr("max unchanged: α = 1")
            ]
        )
        prev[qb] = m
    wrong = wrong or any(any(x) for x in bad)
    spans = (
        [[str(n + 1)] for n in range(len(trace))],
        [[f"({x[0]}, {x[1]})"] for x in trace],
        [[f"{x[0] * bq}–{min(x[0] * bq + bq, T) - 1} · {x[1] * bk}–{min(x[1] * bk + bk, S) - 1}"] for x in trace],
    )
    table = row(
        f.matrix(spans[0], role="accent", w=30, h=rh, gap=4, fmt=str, col_labels=["#"]),
        f.matrix(spans[1], w=96, h=rh, gap=4, fmt=str, col_labels=[tr("tile (qb, kb)")]),
        f.matrix(spans[2], w=110, h=rh, gap=4, fmt=str, col_labels=[tr("queries · keys")]),
        f.matrix(
            values,
            expected=expects,
            wrong=bad,
            w=62,
            h=rh,
            gap=4,
            fmt=str,
            role=lambda i, j: "masked" if values[i][j] == "" else "plain",
            col_labels=[tr("{s} row {k}", s=s, k=k) for s in "ml" for k in range(bq)],
        ),
        pad(f.table(notes, header=["l, acc × α = exp(m − m_new)"], h=rh + 4, size=LABEL_SMALL), top=-2),
        gap=4,
    )
    f.place(table, after=14)

    computed = sum((min(qb * bq + bq, T) - qb * bq) * (min(kb * bk + bk, S) - kb * bk) for qb, kb in order if 0 <= qb < nq and 0 <= kb < nk)
    f.note(
        tr(
            "Scores computed: {computed} of the {T}·{S} = {pairs} pairs, in {visited} of {tiles} tiles, each "
            "followed by α = exp(m − m_new) rescaling of l and acc where a row's max grew. The largest tensors alive "
            "are one [{bq}, {bk}] tile and the accumulator [{bq}, {d}]: the [{T}, {S}] matrix never exists. "
            "The arithmetic is still about T·S·d multiply-adds twice (q·k and p·V): quadratic in the length.",
            computed=computed,
            T=T,
            S=S,
            pairs=T * S,
            visited=len(order),
            tiles=nq * nk,
            bq=bq,
            bk=bk,
            d=d,
        ),
        color=INK,
        size=SMALL + 2,
    )
    f.y += 6
    f.legend(
        [
            ("attend", tr("visible score, computed in its tile")),
            ("masked", tr("future key inside a visited tile (−∞)")),
            ("plain", tr("skipped tile: entirely in the future")),
            ("accent", tr("visit order / your lse")),
        ],
        wrong=wrong,
    )
