"""Figures of ch16 · attention, step by step: splitting and merging heads cell by cell, one head of
causal attention with every number, the three steps, and one row of probabilities per query."""

from __future__ import annotations

import math

from figures import figure
from figures.kit import Figure, num
from figures.style import CELL, FONT, INK, LABEL, MARGIN, MONO, MUTED, SMALL, VALUE, stroke

ATOL = RTOL = 1e-5  # the tolerance of the ch16.3 checks
TRACED = 2          # the element followed through split_heads


TRANSPOSE = "ᵀ"
"""How the figures' strings write a transpose (Kᵀ, Wᵀ); `text_t` draws it as a raised "T"."""


def text_t(f: Figure, x: float, y: float, s: str, *, size: float = LABEL, anchor: str = "start", mono: bool = False,
           color: str = INK, weight: str = "normal", cls: str = "label") -> None:
    """`f.text`, with every "ᵀ" drawn as a smaller "T" raised by a baseline shift: the modifier letter ᵀ is a
    different font's glyph, tiny and in another style, beside the text it sits in. One way for every figure."""
    if TRANSPOSE not in s:
        f.text(x, y, s, size=size, anchor=anchor, mono=mono, color=color, weight=weight, cls=cls)
        return
    el = f.dwg.text("", insert=(x, y), font_size=size, font_family=MONO if mono else FONT, fill=color,
                    text_anchor=anchor, font_weight=weight, class_=cls)
    for i, part in enumerate(s.split(TRANSPOSE)):
        if i:
            el.add(f.dwg.tspan("T", font_size=f"{size * 0.72:g}", baseline_shift=f"{size * 0.36:g}",
                               class_="transpose"))
        if part:
            el.add(f.dwg.tspan(part))
    f.dwg.add(el)


def _close(a: float, b: float) -> bool:
    if isinstance(a, float) and isinstance(b, float) and (math.isinf(a) or math.isinf(b)):
        return a == b
    return abs(a - b) <= ATOL + RTOL * abs(b)


def _r(x: float, digits: int = 3) -> str:
    """A value as a cell shows it: 0.667, 1.41, −∞."""
    return num(x, digits)


def _outline(f: Figure, x: float, y: float, w: float, h: float, *, role: str, dashed: bool = False,
             width: float = 2.2, cls: str = "outline") -> None:
    rect = f.dwg.rect((x, y), (w, h), fill="none", stroke=stroke(role), stroke_width=width, class_=cls)
    if dashed:
        rect["stroke-dasharray"] = "4,3"
    f.dwg.add(rect)


def _matrix(f: Figure, x: float, y: float, values: list[list], *, role="q", expected: list[list] | None = None,
            w: float = CELL, h: float = CELL, row_labels: list[str] | None = None, col_labels: list[str] | None = None,
            fmt=_r, traced: tuple[int, int] | None = None, close=_close) -> None:
    """Cells at (x, y) (labels outside, to the left and above); wrong cells marked; one traced cell in accent."""
    for j, label in enumerate(col_labels or []):
        f.text(x + j * w + w / 2, y - 5, label, size=SMALL, anchor="middle", color=MUTED, mono=True, cls="label")
    for i, row in enumerate(values):
        if row_labels:
            f.text(x - 6, y + i * h + h / 2 + 4, row_labels[i], size=SMALL, anchor="end", color=MUTED, mono=True,
                   cls="label")
        for j, v in enumerate(row):
            want = expected[i][j] if expected is not None else v
            bad = expected is not None and not close(v, want)
            r = role(i, j) if callable(role) else role
            if traced == (i, j) and not bad:
                r = "accent"
            f.cell(x + j * w, y + i * h, v, role=r, w=w, h=h, wrong=bad, expected=want if bad else None, fmt=fmt,
                   bold=traced == (i, j))


def _where(values, target) -> list[int] | None:
    """The coordinates of the first element equal to `target` in a nested list, or None."""
    if not isinstance(values, list):
        return [] if values == target else None
    for i, sub in enumerate(values):
        found = _where(sub, target)
        if found is not None:
            return [i] + found
    return None


def _strides(shape: list[int]) -> list[int]:
    out, s = [], 1
    for n in reversed(shape):
        out.insert(0, s)
        s *= n
    return out


# -- ch16.1 ------------------------------------------------------------------------------------------

@figure("ch16-dim-split-heads", title="拆头与转置",
        zh="编号 0 至 11 的 [1, 3, 4] 先 view 成 [1, 3, 2, 2],再 transpose 成 [1, 2, 3, 2];逐 head 画出矩阵,"
           "并追踪编号 2 的三套坐标。",
        en="The numbers 0–11 as [1, 3, 4] are viewed as [1, 3, 2, 2], then transposed to [1, 2, 3, 2]; each head "
           "is drawn as a matrix, and element #2 is traced through its three coordinate triples.",
        needs={"yours": "ch16.1"})
def split_heads_figure(f: Figure, r: dict) -> None:
    x, H, yours, expected = r["x"][0], r["num_heads"], r["yours"][0], r["expected"][0]
    traced = r.get("traced", TRACED)  # a number of x (the lab lets the reader pick it)
    T, W = len(x), len(x[0])
    d = W // H
    f.instance_row([(f"x: [1, {T}, {W}] = [B, T, H·d]", "q"), (f"num_heads = {H} → d = {W} // {H} = {d}", "plain"),
               (f"element #{traced} traced", "accent")])
    cw, gap_h = 34, 10
    # Panel geometry, left to right (row labels sit in the gaps).
    ax = MARGIN + 24
    a_w = W * cw + (H - 1) * gap_h
    bx = ax + a_w + 86
    b_w = T * d * cw + (T - 1) * 18
    cx = bx + b_w + 100
    top = f.y + 52
    headings = [(ax, a_w, "x", f"[B, T, H·d] = [1, {T}, {W}]"),
                (bx, b_w, f"x.view(1, {T}, {H}, {d})", f"[B, T, H, d] = [1, {T}, {H}, {d}]"),
                (cx, H * d * cw + (H - 1) * 24, "transpose(1, 2): yours", f"[B, H, T, d] = [1, {H}, {T}, {d}]")]
    for hx, hw, name, shape in headings:
        f.text(hx + hw / 2, top - 38, name, size=LABEL, anchor="middle", weight="bold", mono=True, cls="label")
        f.text(hx + hw / 2, top - 22, shape, size=SMALL + 1, anchor="middle", color=MUTED, mono=True, cls="label")
    tr = _where(x, traced)  # [t, c]
    tt, tc = tr
    th, tj = divmod(tc, d)

    # A: x, heads as column blocks.
    for h in range(H):
        hx = ax + h * (d * cw + gap_h)
        _matrix(f, hx, top, [row[h * d:(h + 1) * d] for row in x], role="q", w=cw, h=cw,
                row_labels=[f"t{t}" for t in range(T)] if h == 0 else None,
                col_labels=[f"c{h * d + j}" for j in range(d)], traced=(tt, tc - h * d) if h == th else None)
        f.bracket(hx, hx + d * cw, top + T * cw + 6, f"head {h}", size=SMALL)
    # B: the view, one [H, d] block per token.
    for t in range(T):
        tx = bx + t * (d * cw + 18)
        _matrix(f, tx, top, [x[t][h * d:(h + 1) * d] for h in range(H)], role="q", w=cw, h=cw,
                row_labels=[f"h{h}" for h in range(H)] if t == 0 else None,
                col_labels=[f"j{j}" for j in range(d)], traced=(th, tj) if t == tt else None)
        f.bracket(tx, tx + d * cw, top + H * cw + 6, f"token {t}", size=SMALL)
    # C: the student's result, one [T, d] matrix per head.
    for h in range(H):
        hx = cx + h * (d * cw + 24)
        _matrix(f, hx, top, yours[h], role="q", expected=expected[h], w=cw, h=cw,
                row_labels=[f"t{t}" for t in range(T)] if h == 0 else None,
                col_labels=[f"j{j}" for j in range(d)], traced=(tt, tj) if h == th else None,
                close=lambda a, b: a == b)
        f.bracket(hx, hx + d * cw, top + T * cw + 6, f"head {h}", size=SMALL)
    mid = top + min(T, H) * cw / 2
    for x0, x1, label in ((ax + a_w, bx - 24, "view"), (bx + b_w, cx - 26, "transpose\n(1, 2)")):
        f.arrow(x0 + 8, mid, x1 - 8, mid)
        for n, line in enumerate(reversed(label.split("\n"))):
            f.text((x0 + x1) / 2, mid - 8 - n * 13, line, size=SMALL, anchor="middle", color=MUTED, mono=True,
                   cls="label")
    f.y = top + max(T, H) * cw + 60

    # The traced element through its three coordinate triples.
    f.heading(f"编号 {traced} 的三套坐标 · element #{traced} in the three shapes")
    y = f.y + 4
    triples = [(f"x[0, {tt}, {tc}]", f"token {tt}, column {tc}"),
               (f"view[0, {tt}, {th}, {tj}]", f"column {tc} = {th}·{d} + {tj}: head {th}, j = {tj}"),
               (f"out[0, {th}, {tt}, {tj}]", "transpose swaps the T and H indices")]
    bw, step = 210, 270
    for i, (coord, why) in enumerate(triples):
        bx_i = MARGIN + i * step
        f.box(bx_i, y, bw, 30, role="accent", label=coord, mono=True)
        f.text(bx_i + bw / 2, y + 48, why, size=SMALL + 1, anchor="middle", color=MUTED, cls="label")
        if i:
            f.arrow(bx_i - step + bw + 6, y + 15, bx_i - 6, y + 15, color=stroke("accent"))
    f.y = y + 72
    found = _where(yours, traced)
    if found is not None and found != [th, tt, tj]:
        f.note(f"In your result #{traced} sits at out[0, {found[0]}, {found[1]}, {found[2]}], not at "
               f"[0, {th}, {tt}, {tj}].", color=stroke("wrong"), size=SMALL + 2)
    st = _strides([1, T, H, d])
    moved = [st[0], st[2], st[1], st[3]]
    f.note(f"Nothing is copied: the view has strides ({', '.join(map(str, st))}) and transpose(1, 2) only swaps "
           f"two of them, ({', '.join(map(str, moved))}). Head h of token t is still the numbers at "
           f"t·{W} + h·{d} + j in memory, as in x.", size=SMALL + 2)
    bad = yours != expected
    f.legend([("q", "a number of x (its value = its position in x)"), ("accent", f"element #{traced}")], wrong=bad)


# -- ch16.2 ------------------------------------------------------------------------------------------

def _tagged(f: Figure, x: float, y: float, rows: list[list], tags: list[list[str]], *, expected=None,
            w: float = 48, h: float = 40) -> None:
    """Cells with their value and, under it, the (token, head) the value came from."""
    for i, row in enumerate(rows):
        f.text(x - 6, y + i * h + h / 2 + 4, f"row {i}", size=SMALL, anchor="end", color=MUTED, mono=True,
               cls="label")
        for j, v in enumerate(row):
            bad = expected is not None and v != expected[i][j]
            if bad:
                f.cell(x + j * w, y + i * h, v, w=w, h=h, wrong=True, expected=expected[i][j])
                continue
            f.cell(x + j * w, y + i * h, "", role="q", w=w, h=h)
            f.text(x + j * w + w / 2, y + i * h + h * 0.47, num(v), size=VALUE, anchor="middle", mono=True,
                   cls="value")
            f.text(x + j * w + w / 2, y + i * h + h - 6, tags[i][j], size=SMALL - 1.5, anchor="middle",
                   color=MUTED, mono=True, cls="label")


@figure("ch16-dim-merge-heads", title="transpose 后合头 vs 直接 reshape",
        zh="同一组 12 个编号分别按 transpose 后合头与直接 reshape 排列:直接 reshape 把不同 token 的值混到一行。",
        en="The same 12 numbers merged back by transpose-then-reshape and by a bare reshape: the bare reshape "
           "mixes values of different tokens into one row.",
        needs={"yours": "ch16.2"})
def merge_heads_figure(f: Figure, r: dict) -> None:
    heads, yours, expected, bare = r["heads"][0], r["yours"][0], r["expected"][0], r["bare"][0]
    H, T, d = len(heads), len(heads[0]), len(heads[0][0])
    f.instance_row([(f"x: [1, {H}, {T}, {d}] = [B, H, T, d]", "q"), (f"→ [1, {T}, {H * d}] = [B, T, H·d]", "plain")])
    origin = {heads[h][t][j]: (t, h) for h in range(H) for t in range(T) for j in range(d)}

    # The input: one [T, d] matrix per head.
    f.heading("输入 · the heads, one [T, d] matrix each")
    cw = 40
    top = f.y + 18
    left = (f.width - (H * d * cw + (H - 1) * 40)) / 2
    for h in range(H):
        hx = left + h * (d * cw + 40)
        _matrix(f, hx, top, heads[h], role="q", w=cw, h=cw, row_labels=[f"t{t}" for t in range(T)],
                col_labels=[f"j{j}" for j in range(d)])
        f.bracket(hx, hx + d * cw, top + T * cw + 6, f"head {h}", size=SMALL)
    in_bottom = top + T * cw + 24
    f.y = in_bottom + 20

    def tags(rows):
        return [[(lambda o: f"t{o[0]}·h{o[1]}" if o else "?")(origin.get(v)) for v in row] for row in rows]

    # Left: the student's transpose-then-reshape; right: the bare reshape, its mixed rows outlined.
    w, h = 48, 40
    lx, rx = MARGIN + 48, MARGIN + 440
    y = f.y + 40
    f.text(lx - 40, y - 22, f"yours: transpose(1, 2) → reshape(1, {T}, {H * d})", size=LABEL, weight="bold",
           cls="label")
    f.text(rx - 40, y - 22, f"bare reshape(1, {T}, {H * d}), no transpose", size=LABEL, weight="bold", cls="label")
    for xx in (lx, rx):
        f.curve(f.width / 2, in_bottom, xx + H * d * w / 2, y - 36, width=1.1)
    _tagged(f, lx, y, yours, tags(yours), expected=expected, w=w, h=h)
    _tagged(f, rx, y, bare, tags(bare), w=w, h=h)
    for i in range(T):
        ry = y + i * h
        mine = sorted({origin[v][0] for v in yours[i] if v in origin})
        ok = yours[i] == expected[i]
        f.text(lx + H * d * w + 10, ry + h / 2 + 4, f"token {mine[0]}: heads 0…{H - 1}" if ok and len(mine) == 1
               else "✗ mixed" if len(mine) > 1 else "", size=SMALL + 0.5, color=MUTED if ok else stroke("wrong"),
               cls="label")
        toks = sorted({origin[v][0] for v in bare[i]})
        if len(toks) > 1:
            _outline(f, rx - 2, ry + 1, H * d * w + 4, h - 2, role="accent", dashed=True, cls="outline mixed")
            by_head: dict[int, list[int]] = {}
            for v in bare[i][::d]:
                t, hh = origin[v]
                by_head.setdefault(hh, []).append(t)
            groups = [" and ".join(f"t{t}" for t in ts) + f" of head {hh}" for hh, ts in by_head.items()]
            lines = [f"row {i} holds {groups[0]}"] + [f"and {g}" for g in groups[1:]]
            for n, line in enumerate(lines):
                f.text(rx + H * d * w + 10, ry + h / 2 + 4 + (n - (len(lines) - 1) / 2) * 14, line,
                       size=SMALL + 0.5, color=stroke("accent"), weight="bold", cls="label mixed")
        else:
            f.text(rx + H * d * w + 10, ry + h / 2 + 4, f"token {toks[0]} only", size=SMALL + 0.5, color=MUTED,
                   cls="label")
    f.y = y + T * h + 30
    f.note(f"transpose(1, 2) first brings every token's heads together ([1, {T}, {H}, {d}]); the reshape then lays "
           f"them side by side, so row t is token t: column h·{d} + j = head h, j. A bare reshape reads the numbers "
           f"in [B, H, T, d] order (head 0's tokens 0 … {T - 1}, then head 1's, …) and cuts rows of {H * d}: same "
           f"shape, rows of mixed tokens.", size=SMALL + 2)
    f.legend([("q", "a number; tag tT·hH = the token and head it came from"),
              ("accent", "a row that mixes tokens (bare reshape)")], wrong=yours != expected)


# -- ch16.3 ------------------------------------------------------------------------------------------

def _sym(x) -> str:
    return x if isinstance(x, str) else _r(x)


def _any_wrong(got: list[list], want: list[list]) -> bool:
    return any(not _close(a, b) for ra, rb in zip(got, want) for a, b in zip(ra, rb))


def _step_label(f: Figure, x: float, y: float, mark: str, text: str) -> None:
    f.text(x, y, mark, size=LABEL + 2, weight="bold", color=stroke("accent"), cls="label")
    f.text(x + 20, y, text, size=LABEL, weight="bold", cls="label")


@figure("ch16-dim-one-head-attention", title="一个 head 的完整注意力",
        zh="完整展示一个 head 的 Q、K 转置、分数、因果 softmax、V 和输出:第一次沿 d 求和得到分数,第二次沿 Tk "
           "(key 的个数)求和得到输出;每个数都可以复算。",
        en="One head in full: Q, K transposed, the scores, the causal softmax, V and the output. The first sum runs over d "
           "(giving the scores), the second over the keys Tk (giving the output); every number can be recomputed.",
        needs={"out": "ch16.3"})
def one_head_figure(f: Figure, r: dict) -> None:
    q, k, v, mask = r["q"], r["k"], r["v"], r["mask"]
    scores, probs, out, want = r["scores"], r["probs"], r["out"], r["expected"]
    T, d, S = len(q), len(q[0]), len(k)
    dots = [[sum(a * b for a, b in zip(q[i], k[j])) for j in range(S)] for i in range(T)]
    kt = [[k[j][c] for j in range(S)] for c in range(d)]
    f.instance_row([(f"T = {T} tokens", "token"), (f"d = {d}", "plain"), ("causal mask", "attend"),
               (f"scale = 1/√{d} ≈ {_r(d ** -0.5)}", "plain")])
    tl = [f"t{i}" for i in range(T)]
    kl = [f"k{j}" for j in range(S)]
    cw, sw = 36, 52

    # Step 1: Q · Kᵀ, a sum over d, then the scale.
    _step_label(f, MARGIN, f.y, "①", f"scores = Q · K.T × 1/√{d}   (第一次求和:沿 d · first sum, over d)")
    y = f.y + 34
    x1 = MARGIN + 40
    _matrix(f, x1, y, q, role="q", row_labels=tl, col_labels=[f"d{c}" for c in range(d)], w=cw, h=cw)
    x2 = x1 + d * cw + 46
    _matrix(f, x2, y, kt, role="k", row_labels=[f"d{c}" for c in range(d)], col_labels=kl, w=cw, h=cw)
    x3 = x2 + S * cw + 56
    _matrix(f, x3, y, dots, role="plain", col_labels=kl, w=cw + 4, h=cw)
    x4 = x3 + S * (cw + 4) + 74
    _matrix(f, x4, y, scores, role="plain", expected=want["scores"], col_labels=kl, w=sw, h=cw)
    for xa, xb, label in ((x1 + d * cw, x2 - 18, "·"), (x2 + S * cw, x3, "="), (x3 + S * (cw + 4), x4, f"× 1/√{d}")):
        f.text((xa + xb) / 2, y + cw * 1.1, label, size=LABEL + 2 if len(label) == 1 else SMALL + 1, anchor="middle",
               color=MUTED, mono=True, cls="label")
    for xx, ww, label in ((x1, d * cw, "Q [T, d]"), (x2, S * cw, "Kᵀ [d, Tk]"), (x3, S * (cw + 4), "q·k"),
                          (x4, S * sw, "scores [T, Tk]")):
        text_t(f, xx + ww / 2, y + max(T, d) * cw + 16, label, size=SMALL + 1, anchor="middle", color=INK, cls="label")
    i, j = T - 2, 0
    f.y = y + max(T, d) * cw + 40
    terms = " + ".join(f"{num(a)}·{num(b)}" for a, b in zip(q[i], k[j]))
    f.note(f"scores[{i}, {j}] = (q{i} · k{j}) / √{d} = ({terms}) / √{d} = {num(dots[i][j])} × {_r(d ** -0.5)} = "
           f"{_r(want['scores'][i][j])}", color=INK, size=SMALL + 2)

    # Step 2: the causal mask, −∞, softmax along each row.
    f.y += 8
    _step_label(f, MARGIN, f.y + 4, "②", "probs = softmax(scores, masked) per row   (每行归一 · each row sums to 1)")
    y = f.y + 38
    _matrix(f, x1, y, [[bool(m) for m in row] for row in mask], role=lambda a, b: "attend" if mask[a][b] else "masked",
            row_labels=tl, col_labels=kl, w=cw, h=cw, fmt=num, close=lambda a, b: True)
    hidden = [[scores[a][b] if mask[a][b] else "−∞" for b in range(S)] for a in range(T)]
    xm = x1 + S * cw + 56
    _matrix(f, xm, y, hidden, role=lambda a, b: "plain" if mask[a][b] else "masked", col_labels=kl, w=sw, h=cw,
            fmt=_sym, close=lambda a, b: True)
    xp = xm + S * sw + 74
    _matrix(f, xp, y, probs, role=lambda a, b: "attend" if mask[a][b] else "masked", expected=want["probs"],
            col_labels=kl, w=sw, h=cw)
    xs = xp + S * sw + 14
    for a in range(T):
        total = sum(probs[a])
        bad = abs(total - 1) > 1e-5
        f.cell(xs, y + a * cw, _r(total), role="plain", w=44, h=cw, wrong=bad, expected="1" if bad else None,
               fmt=str)
    f.text(xs + 22, y - 5, "Σ", size=SMALL + 1, anchor="middle", color=MUTED, cls="label")
    for xa, xb, label in ((x1 + S * cw, xm, "mask"), (xm + S * sw, xp, "softmax")):
        f.arrow(xa + 8, y + cw * 1.5, xb - 8, y + cw * 1.5)
        f.text((xa + xb) / 2, y + cw * 1.5 - 7, label, size=SMALL, anchor="middle", color=MUTED, cls="label")
    for xx, ww, label in ((x1, S * cw, "causal mask (T = may attend)"), (xm, S * sw, "masked scores"),
                          (xp, S * sw, "probs [T, Tk]")):
        f.text(xx + ww / 2, y + T * cw + 16, label, size=SMALL + 1, anchor="middle", color=INK, cls="label")
    f.y = y + T * cw + 40
    vis = [b for b in range(S) if mask[i][b]]
    m = max(want["scores"][i][b] for b in vis)
    exps = [math.exp(want["scores"][i][b] - m) for b in vis]
    f.note(f"probs[{i}] = softmax over the keys query {i} may see (k{vis[0]}…k{vis[-1]}), row max m = {_r(m)}: "
           + ", ".join(f"e^({_r(want['scores'][i][b])} − {_r(m)}) = {_r(e)}" for b, e in zip(vis, exps))
           + f"; divided by their sum {_r(sum(exps))} → [" + ", ".join(_r(e / sum(exps)) for e in exps)
           + "]; the hidden keys get exactly 0", color=INK, size=SMALL + 2)

    # Step 3: probs · V, a sum over the keys.
    f.y += 8
    _step_label(f, MARGIN, f.y + 4, "③", "out = probs · V   (第二次求和:沿 Tk · second sum, over the keys)")
    y = f.y + 38
    _matrix(f, x1, y, probs, role=lambda a, b: "attend" if mask[a][b] else "masked", expected=want["probs"],
            row_labels=tl, col_labels=kl, w=sw, h=cw)
    xv = x1 + S * sw + 46
    _matrix(f, xv, y, v, role="v", row_labels=kl, col_labels=[f"d{c}" for c in range(len(v[0]))], w=cw, h=cw)
    xo = xv + len(v[0]) * cw + 56
    _matrix(f, xo, y, out, role="v", expected=want["out"], row_labels=tl, col_labels=[f"d{c}" for c in range(len(v[0]))],
            w=sw, h=cw)
    for xa, xb, label in ((x1 + S * sw, xv - 18, "·"), (xv + len(v[0]) * cw, xo - 18, "=")):
        f.text((xa + xb) / 2, y + cw * 1.6, label, size=LABEL + 2, anchor="middle", color=MUTED, mono=True, cls="label")
    for xx, ww, label in ((x1, S * sw, "probs [T, Tk]"), (xv, len(v[0]) * cw, "V [Tk, d]"),
                          (xo, len(v[0]) * sw, "out [T, d]")):
        f.text(xx + ww / 2, y + T * cw + 16, label, size=SMALL + 1, anchor="middle", color=INK, cls="label")
    f.y = y + T * cw + 40
    c = len(v[0]) - 1
    terms = " + ".join(f"{_r(want['probs'][i][b])}·{num(v[b][c])}" for b in range(S))
    f.note(f"out[{i}, {c}] = Σ over the keys of probs[{i}, k] · v[k, {c}] = {terms} = {_r(want['out'][i][c])}",
           color=INK, size=SMALL + 2)
    f.y += 2
    bad = any(_any_wrong(r[key], want[key]) for key in ("scores", "probs", "out"))
    f.legend([("q", "Q"), ("k", "K"), ("v", "V, output"), ("attend", "may attend, probability"),
              ("masked", "hidden (future) key")], wrong=bad)


@figure("ch16-three-steps", title="Attention 的三步",
        zh="Attention 的三步,不要跳过中间量:Q/K 决定如何分配权重,V 提供要汇总的内容。换一个 V,分数和概率一个数"
           "也不变,只有输出改变。",
        en="Attention's three steps with every intermediate kept: Q and K decide the weights, V supplies the "
           "content. With another V not one score or probability changes; only the output does.",
        needs={"out": "ch16.3"})
def three_steps_figure(f: Figure, r: dict) -> None:
    q, k, v, v2 = r["q"], r["k"], r["v"], r["v2"]
    scores, probs, out, out2 = r["scores"], r["probs"], r["out"], r["out2"]
    want, want2 = r["expected"], r["expected_out2"]
    T, d, S, dv = len(q), len(q[0]), len(k), len(v[0])
    f.instance_row([(f"T = {T} queries", "q"), (f"S = {S} keys", "k"), (f"d = {d}", "plain"),
               (f"no mask, scale = 1/√{d}", "plain")])
    cw, sw, ow = 34, 50, 46
    xq = MARGIN + 40
    xs = xq + d * cw + 40
    xo = xs + S * sw + 56
    xo2 = xo + dv * ow + 44
    y0 = f.y + 40                        # top of K.T
    y1 = y0 + d * cw + 26                # scores
    y2 = y1 + T * cw + 70                # probs, out, out2
    yv = y2 - S * cw - 30                # top of V and V′
    yb = y2 + T * cw + 34                # the "same probs" line
    # Frames: the weights (Q, K) and the content (V).
    _outline(f, xq - 36, y0 - 34, xs + S * sw - xq + 52, yb + 26 - y0 + 34, role="q", dashed=True, width=1.2)
    f.text(xq - 28, y0 - 18, "Q、K 决定权重 · Q and K decide the weights", size=SMALL + 1, color=stroke("q"),
           weight="bold", cls="label")
    _outline(f, xo - 24, yv - 52, xo2 + dv * ow - xo + 44, yb + 26 - yv + 52, role="v", dashed=True, width=1.2)
    f.text(xo - 16, yv - 36, "V 提供内容 · V supplies the content", size=SMALL + 1, color=stroke("v"), weight="bold",
           cls="label")
    kt = [[k[j][c] for j in range(S)] for c in range(d)]
    kl, tl = [f"k{j}" for j in range(S)], [f"q{i}" for i in range(T)]
    _matrix(f, xs, y0, kt, role="k", row_labels=[f"d{c}" for c in range(d)], col_labels=kl, w=sw, h=cw)
    text_t(f, xs - 30, y0 + d * cw / 2 + 4, f"Kᵀ [{d}, {S}]", size=SMALL + 1, anchor="end", color=INK, cls="label")
    _matrix(f, xq, y1, q, role="q", row_labels=tl, w=cw, h=cw)
    f.text(xq + d * cw / 2, y1 + T * cw + 16, f"Q [{T}, {d}]", size=SMALL + 1, anchor="middle", color=INK,
           cls="label")
    _matrix(f, xs, y1, scores, role="plain", expected=want["scores"], w=sw, h=cw)
    _matrix(f, xs, y2, probs, role="attend", expected=want["probs"], row_labels=tl, w=sw, h=cw)
    f.arrow(xs + S * sw / 2, y1 + T * cw + 24, xs + S * sw / 2, y2 - 6)
    f.text(xs + S * sw / 2 - 8, (y1 + T * cw + y2) / 2 + 12, "softmax, row by row", size=SMALL + 1, color=MUTED,
           anchor="end", cls="label")
    for yy, label in ((y1, f"① scores [{T}, {S}]"), (y2, f"② probs [{T}, {S}]")):
        f.text(xs + S * sw / 2, yy + T * cw + 16, label, size=SMALL + 1, anchor="middle", color=INK, cls="label")
    # Step 3, twice: the same probs with V and with V′.
    for xx, vv, oo, ww, name in ((xo, v, out, want["out"], "V"), (xo2, v2, out2, want2, "V′")):
        _matrix(f, xx, yv, vv, role="v", w=ow, h=cw)
        f.text(xx + dv * ow / 2, yv - 8, f"{name} [{S}, {dv}]", size=SMALL + 1, anchor="middle", color=INK,
               cls="label")
        _matrix(f, xx, y2, oo, role="v", expected=ww, w=ow, h=cw)
        f.text(xx + dv * ow / 2, y2 + T * cw + 16, f"③ probs · {name} [{T}, {dv}]", size=SMALL + 1,
               anchor="middle", color=INK, cls="label")
        f.arrow(xx + dv * ow / 2, yv + S * cw + 4, xx + dv * ow / 2, y2 - 4, color=stroke("v"))
    f.arrow(xs + S * sw + 6, y2 + T * cw / 2, xo - 6, y2 + T * cw / 2, color=stroke("attend"))
    f.dwg.add(f.dwg.polyline([(xs + S * sw - 10, y2 + T * cw + 22), (xs + S * sw - 10, yb),
                              (xo2 - 20, yb), (xo2 - 20, y2 + T * cw / 2)], fill="none",
                             stroke=stroke("attend"), stroke_width=1.3, stroke_dasharray="4,3", class_="arrow"))
    f.arrow(xo2 - 20, y2 + T * cw / 2, xo2 - 6, y2 + T * cw / 2, color=stroke("attend"))
    f.text((xs + S * sw + xo2) / 2, yb + 16, "the same probs, reused with V′", size=SMALL, anchor="middle",
           color=MUTED, cls="label")
    f.y = yb + 56
    rows = [("①", f"scores = Q · K.T / √{d}, [T, S] = [{T}, {S}]: one dot product per (query, key), "
                  f"a sum over d = {d}"),
            ("②", f"probs = softmax of each row, [{T}, {S}]: query i's weights over the {S} keys, summing to 1"),
            ("③", f"out = probs · V, [T, dv] = [{T}, {dv}]: each query's weighted average of the rows of V")]
    for mark, text in rows:
        f.text(MARGIN, f.y, mark, size=LABEL + 1, weight="bold", color=stroke("accent"), cls="label")
        f.text(MARGIN + 22, f.y, text, size=SMALL + 2, color=INK, cls="note")
        f.y += 20
    same_weights = not _any_wrong(r["probs"], want["probs"])
    f.note("Only step ③ reads V: with V′ the scores and probs stay as they are and the output follows V′."
           + ("" if same_weights else " (Your probs differ from the expected ones: see the marked cells.)"),
           size=SMALL + 2)
    bad = any(_any_wrong(r[key], want[key]) for key in ("scores", "probs", "out")) or _any_wrong(out2, want2)
    f.legend([("q", "Q"), ("k", "K"), ("attend", "probabilities (the weights)"), ("v", "V and the output")],
             wrong=bad)


@figure("ch16-prob-rows", title="每个 query 一行概率",
        zh="每个 query 有自己的一行概率,每行之和为 1。左边的 mask 只表示因果可见性,不是已经算出的概率;"
           "右边是算出的概率,被遮住的位置恰好为 0;列之和没有意义。",
        en="Each query owns one row of probabilities, and each row sums to 1. The mask on the left only shows "
           "causal visibility, not computed probabilities; on the right, the computed ones: a hidden key gets "
           "exactly 0. Column sums mean nothing.",
        needs={"probs": "ch16.3"})
def prob_rows_figure(f: Figure, r: dict) -> None:
    mask, probs, want = r["mask"], r["probs"], r["expected"]
    T, S = len(mask), len(mask[0])
    f.instance_row([(f"T = S = {T} tokens", "token"), ("causal mask", "attend"), ("random q, k (d = 4)", "plain")])
    cw, pw, h = 34, 58, 38
    xm = MARGIN + 44
    xp = xm + S * cw + 110
    xs = xp + S * pw + 18
    top = f.y + 40
    f.text(xm, top - 26, "可见性 · the mask (visibility)", size=LABEL, weight="bold", cls="label")
    f.text(xp, top - 26, "概率 · your probs, one row per query", size=LABEL, weight="bold", cls="label")
    kl = [f"k{j}" for j in range(S)]
    _matrix(f, xm, top, [[bool(m) for m in row] for row in mask], role=lambda a, b: "attend" if mask[a][b] else "masked",
            row_labels=[f"q{i}" for i in range(T)], col_labels=kl, w=cw, h=h, fmt=num, close=lambda a, b: True)
    f.arrow(xm + S * cw + 16, top + T * h / 2, xp - 36, top + T * h / 2)
    f.text((xm + S * cw + xp) / 2 - 10, top + T * h / 2 - 8, "softmax", size=SMALL, anchor="middle", color=MUTED,
           cls="label")
    f.text((xm + S * cw + xp) / 2 - 10, top + T * h / 2 + 16, "per row", size=SMALL, anchor="middle", color=MUTED,
           cls="label")
    for j, label in enumerate(kl):
        f.text(xp + j * pw + pw / 2, top - 5, label, size=SMALL, anchor="middle", color=MUTED, mono=True, cls="label")
    f.text(xs + 26, top - 5, "row Σ", size=SMALL, anchor="middle", color=MUTED, cls="label")
    for i in range(T):
        y = top + i * h
        f.text(xp - 6, y + h / 2 + 4, f"q{i}", size=SMALL, anchor="end", color=MUTED, mono=True, cls="label")
        for j in range(S):
            p, w_ = probs[i][j], want[i][j]
            bad = not _close(p, w_) or (not mask[i][j] and p != 0)
            x = xp + j * pw
            if bad:
                f.cell(x, y, _r(p), w=pw, h=h, wrong=True, expected=_r(w_), fmt=str)
                continue
            role = "attend" if mask[i][j] else "masked"
            f.cell(x, y, "", role=role, w=pw, h=h)
            f.text(x + pw / 2, y + h * 0.5, _r(p, 2) if p else "0", size=VALUE, anchor="middle", mono=True,
                   cls="value")
            if p > 0:
                f.dwg.add(f.dwg.rect((x + 4, y + h - 9), ((pw - 8) * min(p, 1), 5), fill=stroke("attend"),
                                     class_="bar"))
        total = sum(probs[i])
        bad = abs(total - 1) > 1e-5
        f.cell(xs, y, _r(total), role="plain", w=52, h=h, wrong=bad, expected="1" if bad else None, fmt=str)
        seen = sum(1 for m in mask[i] if m)
        f.text(xs + 62, y + h / 2 + 4, f"q{i} sees {seen} key{'s' if seen > 1 else ''}", size=SMALL + 0.5,
               color=MUTED, cls="label")
    yc = top + T * h + 8
    f.text(xp - 6, yc + 16, "col Σ", size=SMALL, anchor="end", color=MUTED, cls="label")
    for j in range(S):
        f.text(xp + j * pw + pw / 2, yc + 16, _r(sum(probs[i][j] for i in range(T)), 2), size=SMALL + 1,
               anchor="middle", color=MUTED, mono=True, cls="label")
    cols_one = all(abs(sum(probs[i][j] for i in range(T)) - 1) <= 1e-5 for j in range(S))
    rows_one = all(abs(sum(row) - 1) <= 1e-5 for row in probs)
    if cols_one and not rows_one:
        f.text(xs, yc + 16, "← your columns sum to 1: the softmax ran over the queries (dim=0)", size=SMALL + 0.5,
               color=stroke("wrong"), weight="bold", cls="label")
    else:
        f.text(xs, yc + 16, "← column sums: no meaning", size=SMALL + 0.5, color=MUTED, cls="label")
    f.y = yc + 44
    f.note("The mask says which keys each query may see; the probabilities are computed row by row from that "
           "query's own scores (the bar under each number is its size). Row i spreads exactly 1 over keys 0 … i; "
           "the future keys get 0, not a small number.", size=SMALL + 2)
    bad = any(not _close(p, w_) for rp, rw in zip(probs, want) for p, w_ in zip(rp, rw))
    f.legend([("attend", "a key the query may see"), ("masked", "a hidden (future) key: probability 0")], wrong=bad)
