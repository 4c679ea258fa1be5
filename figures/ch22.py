"""Figures of ch22 · naive attention vs FlashAttention: the matrices naive attention writes to HBM and
reads back, with the traffic model's byte counts; FlashAttention's tiles, visited or skipped, with the
running max and sum after each."""

from __future__ import annotations

import math

from figures import figure
from figures.kit import Figure, num
from figures.style import CELL, INK, LABEL, MARGIN, MUTED, SMALL, VALUE, fill, stroke

TOL = 1e-5  # the 22.x checks' tolerance (absolute + relative)


def _close(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b or abs(a - b) <= TOL + TOL * abs(b)
    return a == b


def _n3(x) -> str:
    return num(round(x, 3) if isinstance(x, float) and math.isfinite(x) else x)


def _n2(x) -> str:
    return num(round(x, 2) if isinstance(x, float) and math.isfinite(x) else x)


def _pair(a, b) -> tuple[str, str]:
    """Two numbers with enough digits to show that they differ (3 significant digits when they agree)."""
    if b is None:
        return _n3(a), ""
    for digits in (3, 4, 5, 6):
        sa, sb = num(a, digits), num(b, digits)
        if sa != sb or _close(a, b):
            return sa, sb
    return sa, sb


def _outline(f: Figure, x: float, y: float, w: float, h: float, *, color: str, width: float = 1.6,
             dashed: bool = False, cls: str = "outline", fill_: str = "none") -> None:
    rect = f.dwg.rect((x, y), (w, h), fill=fill_, stroke=color, stroke_width=width, class_=cls)
    if dashed:
        rect["stroke-dasharray"] = "4,3"
    f.dwg.add(rect)


def _ghost(f: Figure, x: float, y: float, w: float, h: float, label: str, sub: str) -> None:
    """A matrix read back from HBM, drawn as a dashed box with its name and shape (values shown above)."""
    f.box(x, y, w, h, role="plain", dashed=True)
    f.text(x + w / 2, y + h / 2 - 2, label, size=LABEL, anchor="middle", cls="label")
    f.text(x + w / 2, y + h / 2 + 14, sub, size=SMALL, anchor="middle", color=MUTED, cls="label")


# -- ch22.1 -------------------------------------------------------------------------------------------

@figure("ch22-naive", title="朴素 attention 的中间矩阵",
        zh="朴素实现分三个 kernel:分数 S = QKᵀ/√d(未来位置为 −∞)和概率 P = softmax(S) 都是完整的 [T, S] 矩阵,"
           "各写入 HBM 一次、再读回一次。大中间矩阵在 HBM 中往返,访存量随 T·S 增长。",
        en="Naive attention materialises the full score and probability matrices: three kernels, and both [T, S] "
           "matrices are written to HBM and read back by the next kernel, so the traffic grows with T·S.",
        needs={"scores": "ch22.1", "big_bytes": "ch22.1"})
def naive_figure(f: Figure, r: dict) -> None:
    q, k, v = r["q"], r["k"], r["v"]
    T, S, d, b = len(q), len(k), len(q[0]), r["dtype_bytes"]
    f.instance_row([(f"T = S = {T}" if T == S else f"T = {T}, S = {S}", "token"), (f"d = {d}", "plain"),
               ("causal", "plain"), (f"scale = 1/√{d} ≈ {num(d ** -0.5, 3)}", "plain"),
               (f"fp32: {b} bytes per element", "plain")])
    visible = [[j <= S - T + i for j in range(S)] for i in range(T)]
    small_w, big_w = 34, 58
    xa, xb, xc = MARGIN + 40, MARGIN + 300, MARGIN + 580
    rows = T * CELL

    def step(title: str, draw_inputs, out_values, out_expected, out_role, out_w, reads: list[tuple[str, int]],
             write: tuple[str, int]) -> None:
        f.heading(title)
        top = f.y + 20
        draw_inputs(top)
        f.arrow(xb - 52, top + rows / 2, xb - 12, top + rows / 2, color=INK, width=1.5)
        cols = len(out_values[0])
        f.grid(xb, top - 16, out_values, expected=out_expected, role=out_role, w=out_w, h=CELL, fmt=_n3,
               same=_close, col_labels=[f"k{j}" for j in range(cols)] if cols == S else [f"d{j}" for j in range(cols)])
        # What crosses HBM in this kernel.
        total = sum(n for _, n in reads) + write[1]
        y = top + 4
        f.text(xc, y, "HBM traffic of this kernel", size=SMALL + 1, color=MUTED, cls="label")
        for name, n in reads:
            y += 18
            f.text(xc, y, f"read  {name}: {n} elements", size=SMALL + 1.5, mono=True, color=INK, cls="value")
        y += 18
        big = write[0].startswith(("scores", "probs"))
        f.text(xc, y, f"write {write[0]}: {write[1]} elements", size=SMALL + 1.5, mono=True,
               color=stroke("accent") if big else INK, weight="bold" if big else "normal", cls="value")
        y += 20
        f.text(xc, y, f"= {total} × {b} B = {total * b} B", size=SMALL + 1.5, mono=True, color=MUTED, cls="value")
        f.y = top + rows + 26

    def qk_inputs(top: float) -> None:
        f.text(xa - 6, top + rows / 2 + 4, "Q", size=LABEL, anchor="end", weight="bold", cls="label")
        f.grid(xa, top, q, role="q", w=small_w, h=CELL)
        f.text(xa + 2 * small_w + 36, top + rows / 2 + 4, "K", size=LABEL, anchor="end", weight="bold", cls="label")
        f.grid(xa + 2 * small_w + 42, top, k, role="k", w=small_w, h=CELL)
        for i in range(T):
            f.text(xa + 2 * small_w + 42 + 2 * small_w + 4, top + i * CELL + CELL / 2 + 4, f"k{i}", size=SMALL,
                   color=MUTED, mono=True, cls="label")

    def scores_back(top: float) -> None:
        _ghost(f, xa + 30, top + 10, 170, rows - 20, f"scores [{T}, {S}]", "read back from HBM")

    def pv_inputs(top: float) -> None:
        _ghost(f, xa - 10, top + 10, 110, rows - 20, f"probs [{T}, {S}]", "read back from HBM")
        f.text(xa + 114, top + rows / 2 + 4, "V", size=LABEL, weight="bold", cls="label")
        f.grid(xa + 128, top, v, role="v", w=small_w, h=CELL)

    role_s = lambda i, j: "plain" if visible[i][j] else "masked"
    role_p = lambda i, j: "attend" if visible[i][j] else "masked"
    step(f"① kernel 1: scores = Q·Kᵀ/√{d}, future keys −∞ → a full [{T}, {S}] matrix written to HBM", qk_inputs,
         r["scores"], r["expected_scores"], role_s, big_w, [("Q", T * d), ("K", S * d)], ("scores", T * S))
    step(f"② kernel 2: probs = softmax(scores) row by row → another [{T}, {S}] matrix", scores_back,
         r["probs"], r["expected_probs"], role_p, big_w, [("scores", T * S)], ("probs", T * S))
    step(f"③ kernel 3: out = probs · V → [{T}, {d}]", pv_inputs, r["out"], r["expected_out"], "v", big_w,
         [("probs", T * S), ("V", S * d)], ("O", T * d))

    # The model's totals for this instance and for a real prompt, from the student's attention_hbm_bytes.
    f.heading("访存模型 · the traffic model, attention_hbm_bytes (your values)")
    f.y += 8
    rows_txt = [(f"naive = (2·T·d + 2·S·d + 4·T·S)·{b}", f"(2·{T}·{d} + 2·{S}·{d} + 4·{T}·{S})·{b}"),
                (f"flash = (2·T·d + 2·S·d)·{b} + 4·T", f"(2·{T}·{d} + 2·{S}·{d})·{b} + 4·{T}")]
    for n, ((formula, filled), got, want) in enumerate(zip(rows_txt, r["small_bytes"], r["small_expected"])):
        y = f.y + n * (CELL + 6)
        f.text(MARGIN, y + CELL / 2 + 4, formula, size=LABEL, mono=True, cls="label")
        f.text(MARGIN + 330, y + CELL / 2 + 4, "=", size=LABEL, mono=True, color=MUTED, cls="label")
        f.text(MARGIN + 350, y + CELL / 2 + 4, filled, size=LABEL, mono=True, color=MUTED, cls="label")
        f.cell(MARGIN + 660, y, got, role="accent" if n == 0 else "plain", w=110, h=CELL, wrong=got != want,
               expected=want, bold=True, fmt=lambda x: f"{x:,} B")
    f.y += 2 * (CELL + 6) + 20

    big = r["big"]
    bT, bS, bd, bb = big["T"], big["S"], big["d"], big["dtype_bytes"]
    f.heading(f"一个 4k prompt · one head, T = S = {bT:,}, d = {bd}, bf16 ({bb} bytes)")
    bars_x = MARGIN + 110
    f.y += 20
    f.text(MARGIN, f.y + 90, "bytes moved", size=SMALL + 1, color=MUTED, cls="label")
    f.text(MARGIN, f.y + 106, "(your values)", size=SMALL + 1, color=MUTED, cls="label")
    mib = lambda x: f"{x / 2**20:,.1f} MiB" if isinstance(x, (int, float)) else str(x)
    w, h = f.bars(bars_x, f.y + 10, r["big_bytes"], labels=["naive", "FlashAttention"], height=160, bar_w=96,
                  gap=44, role=["accent", "q"], expected=r["big_expected"], fmt=mib, tol=0.0)
    tx, ty = bars_x + w + 40, f.y + 30
    io = (2 * bT * bd + 2 * bS * bd) * bb
    sp = 4 * bT * bS * bb
    want_naive, want_flash = r["big_expected"]
    for n, (line, color) in enumerate([
            (f"Q, K, V read, O written: (2·T·d + 2·S·d)·{bb} = {io:,} B", INK),
            (f"S and P written + read back: 4·T·S·{bb} = {sp:,} B", stroke("accent")),
            (f"→ {sp / want_naive:.0%} of the naive traffic is [T, S] round trips", stroke("accent")),
            (f"FlashAttention keeps tiles on chip, adds lse: 4·T = {4 * bT:,} B", INK),
            (f"→ {want_naive / want_flash:.0f}× less traffic, the same T·S·d arithmetic", INK)]):
        f.text(tx, ty + n * 20, line, size=SMALL + 1.5, color=color, cls="note")
    f.y += h + 26
    wrong = any(not _close(a, e) for key in ("scores", "probs", "out")
                for ra, re in zip(r[key], r[f"expected_{key}"]) for a, e in zip(ra, re))
    wrong = wrong or r["small_bytes"] != r["small_expected"] or r["big_bytes"] != r["big_expected"]
    f.legend([("q", "Q"), ("k", "K"), ("v", "V, out"), ("plain", "score"), ("attend", "probability"),
              ("masked", "future key: −∞ / 0"), ("accent", "the [T, S] round trips")], wrong=wrong)


# -- ch22.2 -------------------------------------------------------------------------------------------

@figure("ch22-flash-tiles", title="FlashAttention 的分块视图",
        zh="6 个新 query 接在 2 个缓存 token 之后(S = 8),按 2 × 3 分块。每个 query 块按顺序访问它的 key 块,"
           "每行只维护运行最大值 m 和运行和 l;完全在未来的块直接跳过。算法不物化完整的分数/概率矩阵,"
           "但 dense attention 的算术规模仍是二次的。",
        en="FlashAttention's tiles and online softmax: 6 queries after 2 cached tokens (S = 8) in tiles of 2 × 3. "
           "Each query block visits its key blocks in order, keeping only a running max m and sum l per row; "
           "tiles entirely in the future are skipped. No full score matrix, still quadratic arithmetic.",
        needs={"trace": "ch22.2"})
def flash_tiles_figure(f: Figure, r: dict) -> None:
    T, S, d, bq, bk, causal = r["T"], r["S"], r["d"], r["block_q"], r["block_k"], r["causal"]
    trace, expected, scores = r["trace"], r["expected_trace"], r["scores"]
    nq, nk = -(-T // bq), -(-S // bk)
    want = {(x[0], x[1]): x for x in expected}
    order: dict[tuple, list[int]] = {}
    for n, x in enumerate(trace):
        order.setdefault((x[0], x[1]), []).append(n + 1)
    f.instance_row([(f"T = {T} new after {S - T} cached", "token"), (f"S = {S} keys", "k"), (f"d = {d}", "plain"),
               (f"block_q = {bq}, block_k = {bk}", "accent"), ("causal (end-aligned)" if causal else "not causal",
                                                              "plain")])

    f.heading(f"分块与访问顺序 · scores q·k/√{d} of each tile, computed inside the tile; your visiting order")
    cw, ch, gap, vgap = 44, 32, 8, 18
    label_w = 74
    gx, gy = MARGIN + label_w, f.y + 34
    x_of = lambda j: gx + j * cw + (j // bk) * gap
    y_of = lambda i: gy + i * ch + (i // bq) * vgap
    for j in range(S):
        f.text(x_of(j) + cw / 2, gy - 16, f"k{j}", size=SMALL + 1, anchor="middle", color=MUTED, mono=True,
               cls="label")
    for i in range(T):
        f.text(gx - 8, y_of(i) + ch / 2 + 4, f"q{i} · pos {S - T + i}", size=SMALL + 1, anchor="end", color=INK,
               cls="label")
    wrong = False
    for qb in range(nq):
        for kb in range(nk):
            q0, q1, k0, k1 = qb * bq, min(qb * bq + bq, T), kb * bk, min(kb * bk + bk, S)
            visited, should = (qb, kb) in order, (qb, kb) in want
            for i in range(q0, q1):
                for j in range(k0, k1):
                    vis = not causal or j <= S - T + i
                    role = ("attend" if vis else "masked") if should else "plain"
                    score = scores[i][j] if vis else float("-inf")
                    f.cell(x_of(j), y_of(i), _n2(score) if should else "", role=role, w=cw, h=ch, fmt=str,
                           dashed=not should, size=SMALL + 1)
            tx, ty, tw, th = x_of(k0), y_of(q0), x_of(k1 - 1) + cw - x_of(k0), y_of(q1 - 1) + ch - y_of(q0)
            if visited != should:
                wrong = True
                _outline(f, tx, ty, tw, th, color=stroke("wrong"), width=2.4, cls="tile wrong",
                         fill_="url(#hatch-wrong)")
                f.text(tx + tw / 2, ty + th / 2 + 4, "future: skip it" if visited else "not visited",
                       size=SMALL + 1, anchor="middle", color=stroke("wrong"), weight="bold", cls="label wrong")
            elif should:
                _outline(f, tx, ty, tw, th, color=INK, width=1.6)
            else:
                f.text(tx + tw / 2, ty + min(th, ch) / 2 + 4, "skipped", size=SMALL + 1, anchor="middle", color=MUTED,
                       cls="label")
            if visited:
                nums = ",".join(map(str, order[qb, kb]))
                rad = 9 + 3 * (len(nums) - 1)
                f.dwg.add(f.dwg.circle((tx + 12, ty - 3), rad, fill=fill("accent"), stroke=stroke("accent"),
                                       stroke_width=1.4))
                f.text(tx + 12, ty + 1, nums, size=SMALL + 0.5, anchor="middle", weight="bold", mono=True,
                       cls="label")
    grid_right, grid_bottom = x_of(S - 1) + cw, y_of(T - 1) + ch

    # Per query row: the final m and l of your trace, and the lse you returned.
    last = {}
    for x in trace:
        last[x[0]] = x
    cx = grid_right + 36
    heads = [("final m", 58), ("final l", 58), ("m + log l", 70), ("your lse", 70), ("out vs naive", 74)]
    hx = cx
    for label, w in heads:
        f.text(hx + w / 2 - 2, gy - 16, label, size=SMALL + 1, anchor="middle", color=MUTED, cls="label")
        hx += w + 4
    for i in range(T):
        qb, rr = divmod(i, bq)
        rec = last.get(qb)
        m = rec[2][rr] if rec and rr < len(rec[2]) else None
        l = rec[3][rr] if rec and rr < len(rec[3]) else None
        both = m is not None and l is not None and l > 0
        lse, want_lse = r["lse"][i], r["expected_lse"][i]
        bad = not _close(lse, want_lse)
        x = cx
        for val, (_, w) in zip((m, l, m + math.log(l) if both else None), heads):
            f.cell(x, y_of(i), "—" if val is None else _n3(val), role="plain", w=w, h=ch, fmt=str)
            x += w + 4
        mine, theirs = _pair(lse, want_lse)
        f.cell(x, y_of(i), mine, role="accent", w=heads[3][1], h=ch, fmt=str, wrong=bad, expected=theirs, bold=True)
        x += heads[3][1] + 4
        diff = max(abs(a - b) if math.isfinite(a) else math.inf for a, b in zip(r["out"][i], r["expected_out"][i]))
        off = not diff <= TOL + TOL * max(abs(b) for b in r["expected_out"][i])
        f.cell(x, y_of(i), f"Δ {diff:.2g}" if off else "= naive", role="v", w=heads[4][1], h=ch, fmt=str, wrong=off,
               expected="= naive", size=SMALL + 1)
        wrong |= bad or off
    f.y = grid_bottom + 34

    # The trace, tile by tile: the running statistics after each, and the rescaling when a max grew.
    f.heading("每个 tile 之后 · after each visited tile (your trace): running max m and sum l of the block's rows")
    cols = [("#", 30), ("tile (qb, kb)", 96), ("queries · keys", 110)] + \
        [(f"m row {r_}", 62) for r_ in range(bq)] + [(f"l row {r_}", 62) for r_ in range(bq)] + \
        [("l, acc × α = exp(m − m_new)", 180)]
    x = MARGIN
    y = f.y + 6
    for label, w in cols:
        f.text(x + w / 2, y, label, size=SMALL + 1, anchor="middle", color=MUTED, cls="label")
        x += w + 4
    y += 8
    prev: dict[int, list] = {}
    rh = 28
    for n, (qb, kb, m, l) in enumerate((x_[0], x_[1], x_[2], x_[3]) for x_ in trace):
        ref = want.get((qb, kb))
        q0, q1 = qb * bq, min(qb * bq + bq, T)
        k0, k1 = kb * bk, min(kb * bk + bk, S)
        x = MARGIN
        values = [(str(n + 1), "accent"), (f"({qb}, {kb})", "plain"), (f"{q0}–{q1 - 1} · {k0}–{k1 - 1}", "plain")]
        for (val, role), (_, w) in zip(values, cols):
            f.cell(x, y, val, role=role, w=w, h=rh, fmt=str, size=VALUE - 1)
            x += w + 4
        for stat, idx in ((m, 2), (l, 3)):
            for r_ in range(bq):
                w = cols[3][1]
                if r_ < len(stat):
                    exp_v = ref[idx][r_] if ref and r_ < len(ref[idx]) else None
                    bad = exp_v is None or not _close(stat[r_], exp_v)
                    wrong |= bad
                    mine, theirs = _pair(stat[r_], exp_v)
                    f.cell(x, y, mine, role="plain", w=w, h=rh, fmt=str, wrong=bad,
                           expected="skip" if exp_v is None else theirs, size=VALUE - 1)
                else:
                    f.cell(x, y, "", role="masked", w=w, h=rh, fmt=str)
                x += w + 4
        before = prev.get(qb)
        if before is None:
            note = "first tile: m from −∞"
        else:
            grew = [(r_, math.exp(before[r_] - m[r_])) for r_ in range(min(len(m), len(before)))
                    if m[r_] > before[r_] + 1e-12]
            note = ", ".join(f"row {r_}: ×{a:.2f}" for r_, a in grew) if grew else "max unchanged: α = 1"
        f.text(x + 4, y + rh / 2 + 4, note, size=SMALL + 1, color=INK if before is not None else MUTED, cls="note")
        prev[qb] = m
        y += rh + 4
    f.y = y + 14

    visited = len(order)
    computed = sum((min(qb * bq + bq, T) - qb * bq) * (min(kb * bk + bk, S) - kb * bk) for qb, kb in order
                   if 0 <= qb < nq and 0 <= kb < nk)
    f.note(f"Scores computed: {computed} of the {T}·{S} = {T * S} pairs, in {visited} of {nq * nk} tiles, each "
           f"followed by α = exp(m − m_new) rescaling of l and acc where a row's max grew. The largest tensors alive "
           f"are one [{bq}, {bk}] tile and the accumulator [{bq}, {d}]: the [{T}, {S}] matrix never exists. "
           f"The arithmetic is still about T·S·d multiply-adds twice (q·k and p·V): quadratic in the length.",
           color=INK, size=SMALL + 2)
    f.y += 6
    f.legend([("attend", "visible score, computed in its tile"), ("masked", "future key inside a visited tile (−∞)"),
              ("plain", "skipped tile: entirely in the future"), ("accent", "visit order / your lse")], wrong=wrong)
