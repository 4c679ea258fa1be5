"""Figures of ch16 · attention, step by step: splitting and merging heads cell by cell, one head of
causal attention with every number, the three steps, and one row of probabilities per query.

The checks decide what is wrong: every figure marks the cells the check's own verdict (`wrong`) names."""

from __future__ import annotations

import math

from figures import figure
from figures.kit import Figure, Grid, num, text_width
from figures.layout import Part, column, pad, row, space, wide
from figures.style import FONT, INK, LABEL, LABEL_SMALL, MARGIN, MONO, MUTED, SMALL, stroke
from grader.i18n import tr, tr_in

TRACED = 2  # the element followed through split_heads


TRANSPOSE = "ᵀ"
"""How the figures' strings write a transpose (Kᵀ, Wᵀ); `text_t` draws it as a raised "T"."""


def text_t(
    f: Figure,
    x: float,
    y: float,
    s: str,
    *,
    size: float = LABEL,
    anchor: str = "start",
    mono: bool = False,
    color: str = INK,
    weight: str = "normal",
    cls: str = "label",
) -> None:
    """`f.text`, with every "ᵀ" drawn as a smaller "T" raised by a baseline shift: the modifier letter ᵀ is a
    different font's glyph, tiny and in another style, beside the text it sits in. One way for every figure."""
    if TRANSPOSE not in s:
        f.text(x, y, s, size=size, anchor=anchor, mono=mono, color=color, weight=weight, cls=cls)
        return
    el = f.dwg.text(
        "",
        insert=(x, y),
        font_size=size,
        font_family=MONO if mono else FONT,
        fill=color,
        text_anchor=anchor,
        font_weight=weight,
        class_=cls,
    )
    for i, part in enumerate(s.split(TRANSPOSE)):
        if i:
            el.add(f.dwg.tspan("T", font_size=f"{size * 0.72:g}", baseline_shift=f"{size * 0.36:g}", class_="transpose"))
        if part:
            el.add(f.dwg.tspan(part))
    f.dwg.add(el)


def _label_t(f: Figure, s: str, *, size: float = LABEL_SMALL, color: str = INK) -> Part:
    """One line of text as a part, drawn by `text_t` (a transpose as a raised T)."""
    return Part(text_width(s.replace(TRANSPOSE, "T"), size), size * 1.25, lambda x, y: text_t(f, x, y + size, s, size=size, color=color))


def _captioned(f: Figure, grid: Grid, caption: str, *, rows: int = 0) -> Part:
    """A matrix with its caption centred under it; `rows` lines the caption up with taller neighbours."""
    return column(pad(grid, bottom=max(rows - grid.rows, 0) * grid.ch), _label_t(f, caption), gap=6, align="center")


def _beside(f: Figure, grid: Grid, rows: int, text: str, *, size: float = LABEL + 2) -> Part:
    """A symbol between matrices ("·", "="), level with the middle of a grid's first `rows` rows."""
    part = f.label(text, size=size, color=MUTED, mono=True)
    return pad(part, top=grid.label_h + rows * grid.ch / 2 - part.h / 2)


def _arrow(f: Figure, label: str, w: float, y: float, *, below: str = "") -> Part:
    """Room `w` wide holding an arrow `y` below the part's top, `label` over it (and `below` under it)."""

    def draw(x0: float, y0: float) -> None:
        f.arrow(x0 + 8, y0 + y, x0 + w - 8, y0 + y)
        f.text(x0 + w / 2, y0 + y - 8, label, size=SMALL, anchor="middle", color=MUTED)
        if below:
            f.text(x0 + w / 2, y0 + y + 16, below, size=SMALL, anchor="middle", color=MUTED)

    return Part(w, 0, draw)


def _row_notes(f: Figure, notes: list[list[tuple[str, str, str]]], h: float) -> Part:
    """Notes beside a matrix whose rows are `h` high: row i's lines `(text, colour, cls)`, centred on row i."""
    blocks = []
    for lines in notes:
        block = column(*(f.label(s, size=LABEL_SMALL - 0.5, color=color, bold="mixed" in cls, cls=cls) for s, color, cls in lines), gap=1)
        blocks.append(pad(block, top=(h - block.h) / 2, bottom=(h - block.h) / 2))
    return column(*blocks, gap=0)


def _any(wrong) -> bool:
    """Whether a verdict (nested lists or a dict of them) marks anything wrong."""
    if isinstance(wrong, dict):
        return any(_any(w) for w in wrong.values())
    return any(_any(w) for w in wrong) if isinstance(wrong, list) else bool(wrong)


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
    out: list[int] = []
    s = 1
    for n in reversed(shape):
        out.insert(0, s)
        s *= n
    return out


# -- ch16.1 ------------------------------------------------------------------------------------------


@figure(
    "ch16-dim-split-heads",
    title="拆头与转置",
    zh="编号 0 至 11 的 [1, 3, 4] 先 view 成 [1, 3, 2, 2],再 transpose 成 [1, 2, 3, 2];逐 head 画出矩阵,并追踪编号 2 的三套坐标。",
    en="The numbers 0–11 as [1, 3, 4] are viewed as [1, 3, 2, 2], then transposed to [1, 2, 3, 2]; each head "
    "is drawn as a matrix, and element #2 is traced through its three coordinate triples.",
    needs={"yours": "ch16.1"},
)
def split_heads_figure(f: Figure, r: dict) -> None:
    x, H, yours, expected, wrong = r["x"][0], r["num_heads"], r["yours"][0], r["expected"][0], r["wrong"][0]
    traced = r.get("traced", TRACED)  # a number of x (the lab lets the reader pick it)
    T, W = len(x), len(x[0])
    d = W // H
    f.instance_row(
        [
            (f"x: [1, {T}, {W}] = [B, T, H·d]", "q"),
            (f"num_heads = {H} → d = {W} // {H} = {d}", "plain"),
            (tr("element #{n} traced", n=traced), "accent"),
        ]
    )
    found = _where(x, traced)
    assert found is not None, f"#{traced} is not a number of x"
    tt, tc = found
    th, tj = divmod(tc, d)
    cw = 34

    def block(values, at: tuple[int, int] | None, rows: list[str] | None, cols: list[str], **marks) -> Grid:
        """One matrix of numbers of x, the traced one (at `at`) in accent."""
        return f.matrix(values, role=lambda i, j: "accent" if (i, j) == at else "q", row_labels=rows, col_labels=cols, w=cw, h=cw, **marks)

    heads_of_x = [
        block(
            [line[h * d : (h + 1) * d] for line in x],
            (tt, tj) if h == th else None,
            [f"t{t}" for t in range(T)] if h == 0 else None,
            [f"c{h * d + j}" for j in range(d)],
        )
        for h in range(H)
    ]
    tokens = [
        block(
            [x[t][h * d : (h + 1) * d] for h in range(H)],
            (th, tj) if t == tt else None,
            [f"h{h}" for h in range(H)] if t == 0 else None,
            [f"j{j}" for j in range(d)],
        )
        for t in range(T)
    ]
    heads = [
        block(
            yours[h],
            (tt, tj) if h == th else None,
            [f"t{t}" for t in range(T)] if h == 0 else None,
            [f"j{j}" for j in range(d)],
            expected=expected[h],
            wrong=wrong[h],
        )
        for h in range(H)
    ]

    def panel(name: str, shape: str, grids: list[Grid], gap: float) -> Part:
        return column(
            f.label(name, size=LABEL, color=INK, mono=True, bold=True),
            f.label(shape, size=LABEL_SMALL, mono=True),
            pad(row(*grids, gap=gap), top=4, bottom=26),
            gap=3,
            align="center",
        )

    f.place(
        row(
            panel("x", f"[B, T, H·d] = [1, {T}, {W}]", heads_of_x, 10),
            space(67),
            panel(f"x.view(1, {T}, {H}, {d})", f"[B, T, H, d] = [1, {T}, {H}, {d}]", tokens, 18),
            space(81),
            panel(tr("transpose(1, 2): yours"), f"[B, H, T, d] = [1, {H}, {T}, {d}]", heads, 24),
            gap=0,
        ),
        x=MARGIN + 4,
        after=30,
    )
    for grids, what in ((heads_of_x, "head"), (tokens, "token"), (heads, "head")):
        for n, grid in enumerate(grids):
            f.bracket(grid.cell_box(0, 0)[0], grid.right, grid.bottom + 6, f"{what} {n}", size=SMALL)
    mid = tokens[0].cell_box(0, 0)[1] + min(T, H) * cw / 2  # the arrows, level with the shorter panel's middle
    for a, b, label in ((heads_of_x[-1], tokens[0], ["view"]), (tokens[-1], heads[0], ["(1, 2)", "transpose"])):
        f.arrow(a.right + 8, mid, b.right - b.w - 8, mid)
        for n, line in enumerate(label):
            f.text((a.right + b.right - b.w) / 2, mid - 8 - n * 13, line, size=SMALL, anchor="middle", color=MUTED, mono=True)

    # The traced element through its three coordinate triples.
    f.heading(tr("element #{n} in the three shapes", n=traced))
    f.y += 4
    triples = [
        (f"x[0, {tt}, {tc}]", tr("token {t}, column {c}", t=tt, c=tc)),
        (f"view[0, {tt}, {th}, {tj}]", tr("column {c} = {h}·{d} + {j}: head {h}, j = {j}", c=tc, h=th, d=d, j=tj)),
        (f"out[0, {th}, {tt}, {tj}]", tr("transpose swaps the T and H indices")),
    ]
    chips = [f.chip(coord, role="accent", mono=True, w=210) for coord, _ in triples]
    f.place(row(*(column(chip, f.label(why), gap=8, align="center") for chip, (_, why) in zip(chips, triples)), gap=60), after=20)
    for left, right in zip(chips, chips[1:]):
        f.arrow(left.right + 6, left.bottom - left.h / 2, right.right - right.w - 6, left.bottom - left.h / 2, color=stroke("accent"))
    mine = _where(yours, traced)
    if mine is not None and mine != [th, tt, tj]:
        f.note(
            tr(
                "In your result #{n} sits at out[0, {a}, {b}, {c}], not at [0, {h}, {t}, {j}].",
                n=traced,
                a=mine[0],
                b=mine[1],
                c=mine[2],
                h=th,
                t=tt,
                j=tj,
            ),
            color=stroke("wrong"),
            size=SMALL + 2,
        )
    st = _strides([1, T, H, d])
    moved = [st[0], st[2], st[1], st[3]]
    f.note(
        tr(
            "Nothing is copied: the view has strides ({st}) and transpose(1, 2) only swaps "
            "two of them, ({moved}). Head h of token t is still the numbers at "
            "t·{W} + h·{d} + j in memory, as in x.",
            st=", ".join(map(str, st)),
            moved=", ".join(map(str, moved)),
            W=W,
            d=d,
        ),
        size=SMALL + 2,
    )
    f.legend([("q", tr("a number of x (its value = its position in x)")), ("accent", tr("element #{n}", n=traced))], wrong=_any(wrong))


# -- ch16.2 ------------------------------------------------------------------------------------------


@figure(
    "ch16-dim-merge-heads",
    title="transpose 后合头 vs 直接 reshape",
    zh="同一组 12 个编号分别按 transpose 后合头与直接 reshape 排列:直接 reshape 把不同 token 的值混到一行。",
    en="The same 12 numbers merged back by transpose-then-reshape and by a bare reshape: the bare reshape "
    "mixes values of different tokens into one row.",
    needs={"yours": "ch16.2"},
)
def merge_heads_figure(f: Figure, r: dict) -> None:
    heads, yours, expected, wrong, bare = r["heads"][0], r["yours"][0], r["expected"][0], r["wrong"][0], r["bare"][0]
    H, T, d = len(heads), len(heads[0]), len(heads[0][0])
    f.instance_row([(f"x: [1, {H}, {T}, {d}] = [B, H, T, d]", "q"), (f"→ [1, {T}, {H * d}] = [B, T, H·d]", "plain")])
    origin = {heads[h][t][j]: (t, h) for h in range(H) for t in range(T) for j in range(d)}

    # The input: one [T, d] matrix per head.
    f.heading(tr("the heads, one [T, d] matrix each"))
    inputs = [
        f.matrix(heads[h], role="q", row_labels=[f"t{t}" for t in range(T)], col_labels=[f"j{j}" for j in range(d)], w=40, h=40)
        for h in range(H)
    ]
    block = pad(row(*inputs, gap=40), top=4, bottom=24)
    given = f.place(block, x=(f.width - block.w) / 2, after=40)
    for h, grid in enumerate(inputs):
        f.bracket(grid.cell_box(0, 0)[0], grid.right, grid.bottom + 6, tr("head {h}", h=h), size=SMALL)

    # Left: the student's transpose-then-reshape; right: the bare reshape, its mixed rows outlined.
    w, h = 48, 44
    rows = [tr("row {i}", i=i) for i in range(T)]
    mine = f.matrix(yours, role="q", expected=expected, wrong=wrong, row_labels=rows, w=w, h=h)
    theirs = f.matrix(bare, role="q", row_labels=rows, w=w, h=h)
    mine_notes, bare_notes = [], []
    for i in range(T):
        toks = sorted({origin[v][0] for v in yours[i] if v in origin})
        ok = not any(wrong[i])
        mine_notes.append(
            [
                (tr("token {t}: heads 0…{last}", t=toks[0], last=H - 1), MUTED, "label")
                if ok and len(toks) == 1
                else (tr("✗ mixed"), stroke("wrong"), "label")
                if len(toks) > 1
                else ("", MUTED, "label")
            ]
        )
        toks = sorted({origin[v][0] for v in bare[i]})
        if len(toks) > 1:
            by_head: dict[int, list[int]] = {}
            for v in bare[i][::d]:
                t, hh = origin[v]
                by_head.setdefault(hh, []).append(t)
            sep = tr_in("ch16.tokens", " and ")  # between the tokens of one head: "t0 and t1"
            groups = [tr("{tokens} of head {h}", tokens=sep.join("t" + str(t) for t in ts), h=hh) for hh, ts in by_head.items()]
            lines = [tr("row {i} holds {group}", i=i, group=groups[0])] + [tr("and {group}", group=g) for g in groups[1:]]
            bare_notes.append([(line, stroke("accent"), "label mixed") for line in lines])
        else:
            bare_notes.append([(tr("token {t} only", t=toks[0]), MUTED, "label")])
    titled = lambda title, grid, notes: f.titled(title, row(grid, _row_notes(f, notes, h), gap=10), size=LABEL)
    left = titled(tr("yours: transpose(1, 2) → reshape(1, {T}, {W})", T=T, W=H * d), mine, mine_notes)
    right = titled(tr("bare reshape(1, {T}, {W}), no transpose", T=T, W=H * d), theirs, bare_notes)
    f.place(row(wide(left, (f.width - 2 * MARGIN) / 2 - 40), right, gap=20), x=MARGIN + 8, after=30)
    for part, grid in ((left, mine), (right, theirs)):
        f.curve(f.width / 2, given.bottom, grid.cell_box(0, 0)[0] + grid.cols * w / 2, part.bottom - part.h - 6, width=1.1)
    for grid, values, marked in ((mine, yours, wrong), (theirs, bare, None)):
        for i, line in enumerate(values):
            if grid is theirs and len({origin[v][0] for v in line}) > 1:
                f.outline(*grid.span_box(i, 0, i, len(line) - 1), role="accent", dashed=True, inset=1, cls="outline mixed")
            for j, v in enumerate(line):  # under each value: the token and head it came from
                if marked is None or not marked[i][j]:
                    x0, y0, _, _ = grid.cell_box(i, j)
                    tag = f"t{origin[v][0]}·h{origin[v][1]}" if v in origin else "?"
                    f.text(x0 + w / 2, y0 + h - 6, tag, size=SMALL - 1.5, anchor="middle", color=MUTED, mono=True)
    f.note(
        tr(
            "transpose(1, 2) first brings every token's heads together ([1, {T}, {H}, {d}]); the reshape then lays "
            "them side by side, so row t is token t: column h·{d} + j = head h, j. A bare reshape reads the numbers "
            "in [B, H, T, d] order (head 0's tokens 0 … {last}, then head 1's, …) and cuts rows of {W}: same "
            "shape, rows of mixed tokens.",
            T=T,
            H=H,
            d=d,
            last=T - 1,
            W=H * d,
        ),
        size=SMALL + 2,
    )
    f.legend(
        [("q", tr("a number; tag tT·hH = the token and head it came from")), ("accent", tr("a row that mixes tokens (bare reshape)"))],
        wrong=_any(wrong),
    )


# -- ch16.3 ------------------------------------------------------------------------------------------


def _sym(x) -> str:
    return x if isinstance(x, str) else num(x)


def _step(f: Figure, mark: str, text: str) -> None:
    """A step's heading: its number in accent, then what it computes."""
    f.place(
        row(
            f.label(mark, size=LABEL + 2, color=stroke("accent"), bold=True),
            f.label(text, size=LABEL, color=INK, bold=True),
            gap=6,
            align="bottom",
        ),
        after=10,
    )


@figure(
    "ch16-dim-one-head-attention",
    title="一个 head 的完整注意力",
    zh="完整展示一个 head 的 Q、K 转置、分数、因果 softmax、V 和输出:第一次沿 d 求和得到分数,第二次沿 Tk "
    "(key 的个数)求和得到输出;每个数都可以复算。",
    en="One head in full: Q, K transposed, the scores, the causal softmax, V and the output. The first sum runs over d "
    "(giving the scores), the second over the keys Tk (giving the output); every number can be recomputed.",
    needs={"out": "ch16.3"},
)
def one_head_figure(f: Figure, r: dict) -> None:
    q, k, v, mask = r["q"], r["k"], r["v"], r["mask"]
    scores, probs, out, want, wrong = r["scores"], r["probs"], r["out"], r["expected"], r["wrong"]
    T, d, S, dv = len(q), len(q[0]), len(k), len(v[0])
    dots = [[sum(a * b for a, b in zip(q[i], k[j])) for j in range(S)] for i in range(T)]
    f.instance_row(
        [
            (tr("T = {T} tokens", T=T), "token"),
            (f"d = {d}", "plain"),
            (tr("causal mask"), "attend"),
            (f"scale = 1/√{d} ≈ {num(d**-0.5)}", "plain"),
        ]
    )
    tl, kl, dl = [f"t{i}" for i in range(T)], [f"k{j}" for j in range(S)], [f"d{c}" for c in range(dv)]
    cw, sw = 36, 52
    attend = lambda a, b: "attend" if mask[a][b] else "masked"

    # Step 1: Q · Kᵀ, a sum over d, then the scale.
    _step(f, "①", tr("scores = Q · K.T × 1/√{d}   (first sum, over d)", d=d))
    qs = f.matrix(q, role="q", row_labels=tl, col_labels=[f"d{c}" for c in range(d)], w=cw, h=cw)
    kt = f.matrix(
        [[k[j][c] for j in range(S)] for c in range(d)], role="k", row_labels=[f"d{c}" for c in range(d)], col_labels=kl, w=cw, h=cw
    )
    dot = f.matrix(dots, col_labels=kl, w=cw + 4, h=cw)
    sc = f.matrix(scores, expected=want["scores"], wrong=wrong["scores"], col_labels=kl, w=sw, h=cw)
    tall = max(T, d)
    f.place(
        row(
            _captioned(f, qs, "Q [T, d]", rows=tall),
            _beside(f, qs, 2, "·"),
            _captioned(f, kt, "Kᵀ [d, Tk]", rows=tall),
            _beside(f, qs, 2, "="),
            _captioned(f, dot, "q·k", rows=tall),
            _beside(f, qs, 2, f"× 1/√{d}", size=SMALL + 1),
            _captioned(f, sc, "scores [T, Tk]", rows=tall),
            gap=16,
        ),
        x=MARGIN + 20,
        after=28,
    )
    i, j = T - 2, 0
    terms = " + ".join(f"{num(a)}·{num(b)}" for a, b in zip(q[i], k[j]))
    f.note(
        f"scores[{i}, {j}] = (q{i} · k{j}) / √{d} = ({terms}) / √{d} = {num(dots[i][j])} × {num(d**-0.5)} = {num(want['scores'][i][j])}",
        color=INK,
        size=SMALL + 2,
    )

    # Step 2: the causal mask, −∞, softmax along each row.
    f.y += 8
    _step(f, "②", tr("probs = softmax(scores, masked) per row   (each row sums to 1)"))
    ms = f.mask(mask, row_labels=tl, col_labels=kl, w=cw, h=cw)
    hidden = f.matrix(
        [[scores[a][b] if mask[a][b] else "−∞" for b in range(S)] for a in range(T)],
        role=lambda a, b: "plain" if mask[a][b] else "masked",
        col_labels=kl,
        w=sw,
        h=cw,
        fmt=_sym,
    )
    ps = f.matrix(probs, role=attend, expected=want["probs"], wrong=wrong["probs"], col_labels=kl, w=sw, h=cw)
    sums = f.matrix(
        [[num(sum(line))] for line in probs],
        expected=[["1"]] * T,
        wrong=[[w] for w in r["sums_wrong"]],
        col_labels=["Σ"],
        w=44,
        h=cw,
        fmt=str,
    )
    at = ms.label_h + cw * 1.5
    f.place(
        row(
            _captioned(f, ms, tr("causal mask (T = may attend)")),
            _arrow(f, "mask", 56, at),
            _captioned(f, hidden, tr("masked scores")),
            _arrow(f, "softmax", 74, at),
            _captioned(f, ps, "probs [T, Tk]"),
            sums,
            gap=8,
        ),
        x=MARGIN + 20,
        after=28,
    )
    vis = [b for b in range(S) if mask[i][b]]
    m = max(want["scores"][i][b] for b in vis)
    exps = [math.exp(want["scores"][i][b] - m) for b in vis]
    f.note(
        tr(
            "probs[{i}] = softmax over the keys query {i} may see (k{a}…k{b}), row max m = {m}: {exps}; "
            "divided by their sum {sum} → [{probs}]; the hidden keys get exactly 0",
            i=i,
            a=vis[0],
            b=vis[-1],
            m=num(m),
            exps=", ".join("e^(" + num(want["scores"][i][b]) + " − " + num(m) + ") = " + num(e) for b, e in zip(vis, exps)),
            sum=num(sum(exps)),
            probs=", ".join(num(e / sum(exps)) for e in exps),
        ),
        color=INK,
        size=SMALL + 2,
    )

    # Step 3: probs · V, a sum over the keys.
    f.y += 8
    _step(f, "③", tr("out = probs · V   (second sum, over the keys)"))
    ps3 = f.matrix(probs, role=attend, expected=want["probs"], wrong=wrong["probs"], row_labels=tl, col_labels=kl, w=sw, h=cw)
    vs = f.matrix(v, role="v", row_labels=kl, col_labels=dl, w=cw, h=cw)
    os_ = f.matrix(out, role="v", expected=want["out"], wrong=wrong["out"], row_labels=tl, col_labels=dl, w=sw, h=cw)
    tall = max(T, S)
    f.place(
        row(
            _captioned(f, ps3, "probs [T, Tk]", rows=tall),
            _beside(f, ps3, 3, "·"),
            _captioned(f, vs, "V [Tk, d]", rows=tall),
            _beside(f, ps3, 3, "="),
            _captioned(f, os_, "out [T, d]", rows=tall),
            gap=16,
        ),
        x=MARGIN + 20,
        after=28,
    )
    c = dv - 1
    terms = " + ".join(f"{num(want['probs'][i][b])}·{num(v[b][c])}" for b in range(S))
    out_ic = num(want["out"][i][c])
    f.note(
        tr("out[{i}, {c}] = Σ over the keys of probs[{i}, k] · v[k, {c}] = {terms} = {out}", i=i, c=c, terms=terms, out=out_ic),
        color=INK,
        size=SMALL + 2,
    )
    f.y += 2
    f.legend(
        [("q", "Q"), ("k", "K"), ("v", tr("V, output")), ("attend", tr("may attend, probability")), ("masked", tr("hidden (future) key"))],
        wrong=_any(wrong) or _any(r["sums_wrong"]),
    )


def _at(grid: Grid, x: float, y: float) -> Grid:
    """Place a matrix with its first cell's corner at (x, y), its labels outside it (left and above)."""
    grid.at(x - grid.label_w, y - grid.label_h)
    return grid


@figure(
    "ch16-three-steps",
    title="Attention 的三步",
    zh="Attention 的三步,不要跳过中间量:Q/K 决定如何分配权重,V 提供要汇总的内容。换一个 V,分数和概率一个数也不变,只有输出改变。",
    en="Attention's three steps with every intermediate kept: Q and K decide the weights, V supplies the "
    "content. With another V not one score or probability changes; only the output does.",
    needs={"out": "ch16.3"},
)
def three_steps_figure(f: Figure, r: dict) -> None:
    q, k, v, v2 = r["q"], r["k"], r["v"], r["v2"]
    scores, probs, out, out2 = r["scores"], r["probs"], r["out"], r["out2"]
    want, want2, wrong = r["expected"], r["expected_out2"], r["wrong"]
    T, d, S, dv = len(q), len(q[0]), len(k), len(v[0])
    f.instance_row(
        [
            (tr("T = {T} queries", T=T), "q"),
            (tr("S = {S} keys", S=S), "k"),
            (f"d = {d}", "plain"),
            (tr("no mask, scale = 1/√{d}", d=d), "plain"),
        ]
    )
    cw, sw, ow = 34, 50, 46
    xq = MARGIN + 40
    xs = xq + d * cw + 40
    xo = xs + S * sw + 56
    xo2 = xo + dv * ow + 44
    y0 = f.y + 40  # top of K.T
    y1 = y0 + d * cw + 26  # scores
    y2 = y1 + T * cw + 70  # probs, out, out2
    yv = y2 - S * cw - 30  # top of V and V′
    yb = y2 + T * cw + 34  # the "same probs" line
    # Frames: the weights (Q, K) and the content (V).
    f.outline(xq - 36, y0 - 34, xs + S * sw - xq + 52, yb + 26 - y0 + 34, role="q", dashed=True, width=1.2)
    f.text(xq - 28, y0 - 18, tr("Q and K decide the weights"), size=SMALL + 1, color=stroke("q"), weight="bold", cls="label")
    f.outline(xo - 24, yv - 52, xo2 + dv * ow - xo + 44, yb + 26 - yv + 52, role="v", dashed=True, width=1.2)
    f.text(xo - 16, yv - 36, tr("V supplies the content"), size=SMALL + 1, color=stroke("v"), weight="bold", cls="label")
    kl, tl = [f"k{j}" for j in range(S)], [f"q{i}" for i in range(T)]
    _at(
        f.matrix(
            [[k[j][c] for j in range(S)] for c in range(d)], role="k", row_labels=[f"d{c}" for c in range(d)], col_labels=kl, w=sw, h=cw
        ),
        xs,
        y0,
    )
    text_t(f, xs - 30, y0 + d * cw / 2 + 4, f"Kᵀ [{d}, {S}]", size=SMALL + 1, anchor="end", color=INK, cls="label")
    _at(f.matrix(q, role="q", row_labels=tl, w=cw, h=cw), xq, y1)
    f.text(xq + d * cw / 2, y1 + T * cw + 16, f"Q [{T}, {d}]", size=SMALL + 1, anchor="middle", color=INK, cls="label")
    _at(f.matrix(scores, expected=want["scores"], wrong=wrong["scores"], w=sw, h=cw), xs, y1)
    _at(f.matrix(probs, role="attend", expected=want["probs"], wrong=wrong["probs"], row_labels=tl, w=sw, h=cw), xs, y2)
    f.arrow(xs + S * sw / 2, y1 + T * cw + 24, xs + S * sw / 2, y2 - 6)
    f.text(
        xs + S * sw / 2 - 8, (y1 + T * cw + y2) / 2 + 12, tr("softmax, row by row"), size=SMALL + 1, color=MUTED, anchor="end", cls="label"
    )
    for yy, label in ((y1, f"① scores [{T}, {S}]"), (y2, f"② probs [{T}, {S}]")):
        f.text(xs + S * sw / 2, yy + T * cw + 16, label, size=SMALL + 1, anchor="middle", color=INK, cls="label")
    # Step 3, twice: the same probs with V and with V′.
    for xx, vv, oo, ww, bad, name in ((xo, v, out, want["out"], wrong["out"], "V"), (xo2, v2, out2, want2, r["out2_wrong"], "V′")):
        _at(f.matrix(vv, role="v", w=ow, h=cw), xx, yv)
        f.text(xx + dv * ow / 2, yv - 8, f"{name} [{S}, {dv}]", size=SMALL + 1, anchor="middle", color=INK, cls="label")
        _at(f.matrix(oo, role="v", expected=ww, wrong=bad, w=ow, h=cw), xx, y2)
        f.text(xx + dv * ow / 2, y2 + T * cw + 16, f"③ probs · {name} [{T}, {dv}]", size=SMALL + 1, anchor="middle", color=INK, cls="label")
        f.arrow(xx + dv * ow / 2, yv + S * cw + 4, xx + dv * ow / 2, y2 - 4, color=stroke("v"))
    f.arrow(xs + S * sw + 6, y2 + T * cw / 2, xo - 6, y2 + T * cw / 2, color=stroke("attend"))
    f.dwg.add(
        f.dwg.polyline(
            [(xs + S * sw - 10, y2 + T * cw + 22), (xs + S * sw - 10, yb), (xo2 - 20, yb), (xo2 - 20, y2 + T * cw / 2)],
            fill="none",
            stroke=stroke("attend"),
            stroke_width=1.3,
            stroke_dasharray="4,3",
            class_="arrow",
        )
    )
    f.arrow(xo2 - 20, y2 + T * cw / 2, xo2 - 6, y2 + T * cw / 2, color=stroke("attend"))
    f.text((xs + S * sw + xo2) / 2, yb + 16, tr("the same probs, reused with V′"), size=SMALL, anchor="middle", color=MUTED, cls="label")
    f.y = yb + 42
    rows = [
        ("①", tr("scores = Q · K.T / √{d}, [T, S] = [{T}, {S}]: one dot product per (query, key), a sum over d = {d}", d=d, T=T, S=S)),
        ("②", tr("probs = softmax of each row, [{T}, {S}]: query i's weights over the {S} keys, summing to 1", T=T, S=S)),
        ("③", tr("out = probs · V, [T, dv] = [{T}, {dv}]: each query's weighted average of the rows of V", T=T, dv=dv)),
    ]
    f.place(
        column(
            *(
                row(
                    f.label(mark, size=LABEL + 1, color=stroke("accent"), bold=True),
                    f.label(text, size=SMALL + 2, color=INK, cls="note"),
                    gap=8,
                    align="bottom",
                )
                for mark, text in rows
            ),
            gap=4,
        ),
        after=16,
    )
    f.note(
        tr("Only step ③ reads V: with V′ the scores and probs stay as they are and the output follows V′.")
        if not _any(wrong["probs"])
        else tr(
            "Only step ③ reads V: with V′ the scores and probs stay as they are and the output follows V′. "
            "(Your probs differ from the expected ones: see the marked cells.)"
        ),
        size=SMALL + 2,
    )
    f.legend(
        [("q", "Q"), ("k", "K"), ("attend", tr("probabilities (the weights)")), ("v", tr("V and the output"))],
        wrong=_any(wrong) or _any(r["out2_wrong"]),
    )


@figure(
    "ch16-prob-rows",
    title="每个 query 一行概率",
    zh="每个 query 有自己的一行概率,每行之和为 1。左边的 mask 只表示因果可见性,不是已经算出的概率;"
    "右边是算出的概率,被遮住的位置恰好为 0;列之和没有意义。",
    en="Each query owns one row of probabilities, and each row sums to 1. The mask on the left only shows "
    "causal visibility, not computed probabilities; on the right, the computed ones: a hidden key gets "
    "exactly 0. Column sums mean nothing.",
    needs={"probs": "ch16.3"},
)
def prob_rows_figure(f: Figure, r: dict) -> None:
    mask, probs, want, wrong = r["mask"], r["probs"], r["expected"], r["wrong"]
    T, S = len(mask), len(mask[0])
    f.instance_row([(tr("T = S = {T} tokens", T=T), "token"), (tr("causal mask"), "attend"), (tr("random q, k (d = 4)"), "plain")])
    pw, h = 58, 38
    ql, kl = [f"q{i}" for i in range(T)], [f"k{j}" for j in range(S)]
    shown = lambda p: num(p, 2) if p else "0"
    cells = [[num(p) if bad else shown(p) for p, bad in zip(line, marks)] for line, marks in zip(probs, wrong)]
    ps = f.matrix(
        cells,
        role=lambda a, b: "attend" if mask[a][b] else "masked",
        expected=[[num(p) for p in line] for line in want],
        wrong=wrong,
        row_labels=ql,
        col_labels=kl,
        w=pw,
        h=h,
        fmt=str,
    )
    sums = f.matrix(
        [[num(sum(line))] for line in probs],
        expected=[["1"]] * T,
        wrong=[[w] for w in r["sums_wrong"]],
        col_labels=["row Σ"],
        w=52,
        h=h,
        fmt=str,
    )
    seen = [sum(1 for m in line if m) for line in mask]
    f.place(
        row(
            f.titled(tr("the mask (visibility)"), f.mask(mask, row_labels=ql, col_labels=kl, w=34, h=h)),
            _arrow(f, "softmax", 80, f.label("", size=LABEL).h + 8 + 16 + T * h / 2, below=tr("per row")),
            f.titled(
                tr("your probs, one row per query"),
                row(
                    ps,
                    sums,
                    pad(
                        f.table(
                            [
                                [tr("q{i} sees {n} keys", i=i, n=n) if n > 1 else tr("q{i} sees {n} key", i=i, n=n)]
                                for i, n in enumerate(seen)
                            ],
                            h=h,
                            size=LABEL_SMALL - 0.5,
                            color=MUTED,
                        ),
                        top=16,
                    ),
                    gap=10,
                ),
            ),
            gap=20,
        ),
        x=MARGIN + 12,
        after=8,
    )
    for i, line in enumerate(probs):  # a bar under each probability: its size
        for j, p in enumerate(line):
            if p > 0 and not wrong[i][j]:
                x, y, _, _ = ps.cell_box(i, j)
                f.dwg.add(f.dwg.rect((x + 4, y + h - 9), ((pw - 8) * min(p, 1), 5), fill=stroke("attend"), class_="bar"))
    yc = ps.bottom + 24
    f.text(ps.cell_box(0, 0)[0] - 6, yc, "col Σ", size=SMALL, anchor="end", color=MUTED)
    for j in range(S):
        f.text(
            ps.cell_box(0, j)[0] + pw / 2,
            yc,
            num(sum(line[j] for line in probs), 2),
            size=SMALL + 1,
            anchor="middle",
            color=MUTED,
            mono=True,
        )
    if r["over_queries"]:
        f.text(ps.right + 10, yc, tr("← your columns sum to 1"), size=SMALL + 0.5, color=stroke("wrong"), weight="bold")
    else:
        f.text(ps.right + 10, yc, tr("← column sums: no meaning"), size=SMALL + 0.5, color=MUTED)
    f.y = math.ceil(yc + 28)
    if r["over_queries"]:
        f.note(
            tr(
                "Your columns sum to 1, your rows do not: the softmax ran over the queries (dim=0) "
                "instead of over each query's keys (dim=-1)."
            ),
            color=stroke("wrong"),
            size=SMALL + 2,
        )
    f.note(
        tr(
            "The mask says which keys each query may see; the probabilities are computed row by row from that "
            "query's own scores (the bar under each number is its size). Row i spreads exactly 1 over keys 0 … i; "
            "the future keys get 0, not a small number."
        ),
        size=SMALL + 2,
    )
    f.legend(
        [("attend", tr("a key the query may see")), ("masked", tr("a hidden (future) key: probability 0"))],
        wrong=_any(wrong) or _any(r["sums_wrong"]),
    )
