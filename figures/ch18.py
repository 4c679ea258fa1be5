"""Figures of ch18 · grouped-query attention: two query heads sharing one K/V head, the grouping of
4 query heads over 2 K/V heads, and the KV-cache size of MHA / GQA / MQA."""

from __future__ import annotations

from figures import figure
from figures.ch16 import text_t
from figures.kit import Figure, num, text_width
from figures.layout import Part, column, row, wide
from figures.style import CELL, INK, LABEL, MARGIN, MUTED, SMALL, stroke
from grader.i18n import tr

ARROW_ROOM = 14
"""The room, at least, between an arrow's label and the boxes on either side of the arrow."""


@figure(
    "ch18-dim-gqa",
    title="共享 K/V 而非注意力权重",
    zh="两个 [3, 2] 的查询头指向同一个 K/V 头。共享的是 K/V,而不是注意力权重:每个头用自己的 q 算出"
    "自己的分数和 softmax。K/V 只存一份,无需物理复制。",
    en="Two [3, 2] query heads point at the same K/V head: what is shared is K/V, not the attention weights "
    "(each head computes its own scores and softmax); K/V is stored once, with no physical copy.",
    needs={"out": "ch18.2"},
)
def dim_gqa_figure(f: Figure, r: dict) -> None:
    q, k, v, dots, allowed = r["q"], r["k"], r["v"], r["dots"], r["allowed"]
    weights, out, expected, wrong, d = r["weights"], r["out"], r["expected"], r["wrong"], r["head_dim"]
    heads, T, S = len(q), len(q[0]), len(k)
    f.instance_row(
        [
            (f"T = S = {T}", "token"),
            (f"d = {d}", "plain"),
            (tr("{heads} query heads → 1 K/V head", heads=heads), "q"),
            (tr("causal, scale = 1/√{d}", d=d), "plain"),
        ]
    )

    # A row per query head: Q_h → q·k → its own softmax weights → out_h, arrows between (one part each).
    tokens = [f"t{t}" for t in range(T)]
    ops = ["· Kᵀ", f"softmax(·/√{d})", "· V"]

    def blocks(h: int) -> list:
        return [
            f.matrix(q[h], role="q", row_labels=tokens),
            f.matrix(
                [[dots[h][t][j] if allowed[t][j] else "−∞" for j in range(S)] for t in range(T)],
                role=lambda t, j: "plain" if allowed[t][j] else "masked",
                w=40,
                fmt=_str_num,
            ),
            f.matrix(weights[h], role=lambda t, j: "attend" if allowed[t][j] else "masked", w=48, fmt=lambda x: num(round(x, 2))),
            f.matrix(out[h], role="v", expected=expected[h], wrong=wrong[h], w=50),
        ]

    def caption(*lines: tuple[str, dict]) -> Part:
        return column(
            *(f.label(s, size=LABEL + 1, color=INK, bold=True) if i == 0 else f.label(s, **kw) for i, (s, kw) in enumerate(lines)), gap=4
        )

    captions = [
        caption((tr("query head {h}", h=h), {}), (f"kv_head_for({h}, {heads}, 1)", {"mono": True}), (tr("= 0 → reads K/V head 0"), {}))
        for h in range(heads)
    ]
    kv_caption = caption((tr("K/V head 0"), {}), (tr("stored once,"), {}), (tr("read by both heads"), {}))
    left_w = max(p.w for p in captions + [kv_caption]) + 8
    # Each gap is as wide as its arrow's label and ARROW_ROOM on either side; what is left (less the room of
    # V's dashed box) widens the gaps.
    rows = [blocks(h) for h in range(heads)]
    gaps = [text_width(op.replace("ᵀ", "T"), SMALL) + 2 * ARROW_ROOM for op in ops]
    slack = f.width - 2 * MARGIN - left_w - sum(b.w for b in rows[0]) - sum(gaps) - 10
    gaps = [g + max(slack, 0) / len(gaps) for g in gaps]

    def head_row(h: int) -> Part:
        a, b, c, o = rows[h]
        return row(
            wide(captions[h], left_w),
            a,
            _arrow(f, gaps[0], a.h, ops[0]),
            b,
            _arrow(f, gaps[1], a.h, ops[1]),
            c,
            _arrow(f, gaps[2], a.h, ops[2]),
            o,
            gap=0,
        )

    f.y += 16  # the columns' titles
    top = f.place(head_row(0), after=0)
    for block, label in zip(rows[0], (tr("Q of the head"), tr("q · k (future: −∞)"), tr("its own weights"), tr("out = weights · V"))):
        x, y, w, _ = block.span_box(0, 0, 0, block.cols - 1)
        f.text(x + w / 2, y - 10, label, size=SMALL + 1, anchor="middle", color=INK, cls="label")

    # The shared K/V head between the two rows, under the columns it feeds: Kᵀ (columns are keys, like q · k)
    # and V (rows are keys, like the weights' columns).
    dots0, out0 = rows[0][1], rows[0][3]
    band = round(top.bottom) + 62
    kt = f.matrix([[k[j][i] for j in range(S)] for i in range(d)], role="k", w=40, col_labels=[f"k{j}" for j in range(S)])
    vv = f.matrix(v, role="v", w=50, row_labels=[f"k{j}" for j in range(S)])
    kx, vx = dots0.cell_box(0, 0)[0], out0.cell_box(0, 0)[0]
    f.box(kx - 30, band - 30, kt.w + 40, kt.h + 26, role="k", dashed=True, rx=6)
    f.box(vx - 30, band - 12, vv.w - vv.label_w + 40, vv.h + 24, role="v", dashed=True, rx=6)
    kt.at(kx, band - 16)
    vv.at(vx - vv.label_w, band)
    kv_caption.at(MARGIN, band)
    text_t(f, kx - 8, band + d * CELL / 2 + 4, "Kᵀ", size=LABEL, anchor="end", weight="bold", cls="label")
    f.text(vx - 8, band - 18, "V", size=LABEL, anchor="end", weight="bold", cls="label")
    f.y = band + S * CELL + 46
    # The same K feeds both heads' dot products, the same V both heads' outputs.
    for cx, band_top, band_bottom, role in (
        (kx + kt.w / 2, band - 30, band - 4 + kt.h, "k"),
        (vx + out0.w / 2, band - 12, band + vv.h + 12, "v"),
    ):
        f.arrow(cx, band_top, cx, top.bottom + 4, color=stroke(role), width=1.8)
        f.arrow(cx, band_bottom, cx, f.y - 4, color=stroke(role), width=1.8)
    for h in range(1, heads):
        f.place(head_row(h), after=30)

    # What differs, read from the values above: the weights of one token in the two heads.
    t = max(range(T), key=lambda i: sum(abs(weights[0][i][j] - weights[1][i][j]) for j in range(S)))
    w0 = ", ".join(num(round(x, 2)) for x in weights[0][t][: S - T + t + 1])
    w1 = ", ".join(num(round(x, 2)) for x in weights[1][t][: S - T + t + 1])
    f.note(
        tr(
            "Same K, same V, different weights: token {t} weighs keys 0 … {last} as [{w0}] in head 0 and "
            "[{w1}] in head 1, because each head brings its own q. Only K and V are shared.",
            t=t,
            last=S - T + t,
            w0=w0,
            w1=w1,
        ),
        color=INK,
        size=SMALL + 2,
    )
    stored, copied = 2 * S * d, 2 * S * d * heads
    f.note(
        tr(
            "Memory: this layer stores K and V of 1 head: 2 × {S} × {d} = {stored} numbers. Repeating them for "
            "each query head would store {copied} and compute nothing new; GQA kernels index K/V head "
            "h // group instead.",
            S=S,
            d=d,
            stored=stored,
            copied=copied,
        ),
        size=SMALL + 2,
    )
    f.y += 4
    f.legend(
        [
            ("q", tr("query head")),
            ("k", tr("shared K")),
            ("v", tr("shared V, output")),
            ("attend", tr("attention weight")),
            ("masked", tr("masked (future key)")),
        ],
        wrong=any(any(any(c) for c in rw) for rw in wrong),
    )


def _arrow(f: Figure, w: float, h: float, label: str) -> Part:
    """A right arrow across a gap `w` wide, at mid-height of `h`, its label over it: the arrow starts 5 after
    the block on its left and its head ends 5 before the block on its right."""

    def draw(x: float, y: float) -> None:
        f.arrow(x + 5, y + h / 2, x + w - 5, y + h / 2)
        text_t(f, x + w / 2, y + h / 2 - 7, label, size=SMALL, anchor="middle", color=MUTED, cls="label")

    return Part(w, h, draw)


def _str_num(x) -> str:
    return x if isinstance(x, str) else num(x)


@figure(
    "ch18-gqa-groups",
    title="4 个 Q 头,2 组 K/V",
    zh="4 个查询头按连续分组共享 2 个 K/V 头(kv_head = h // 2)。分组是逻辑上的:缓存只存 2 个头,"
    "不是 4 个;kernel 按下标读取共享的头,无需复制缓存。",
    en="4 query heads, 2 K/V groups: consecutive heads share a K/V head (kv_head = h // 2). The grouping is "
    "logical: the cache holds 2 heads, not 4, and kernels read the shared head by index instead of "
    "repeating the cache.",
    needs={"mapping": "ch18.1"},
)
def gqa_groups_figure(f: Figure, r: dict) -> None:
    nh, nkv, mapping, expected = r["num_heads"], r["num_kv_heads"], r["mapping"], r["expected"]
    group = nh // nkv
    f.instance_row([(f"num_heads = {nh}", "q"), (f"num_kv_heads = {nkv}", "k"), (f"group = {nh} // {nkv} = {group}", "plain")])

    span = f.width - 2 * MARGIN - 150
    x0 = MARGIN + 150
    slot = span / nh
    qw = min(120, slot - 24)
    qx = [x0 + i * slot + (slot - qw) / 2 for i in range(nh)]
    y = f.y + 22
    f.text(MARGIN, y + 24, tr("query heads"), size=LABEL, weight="bold", cls="label")
    for g in range(nkv):
        f.bracket(
            qx[g * group],
            qx[g * group + group - 1] + qw,
            y - 6,
            tr("group {g}: heads {a} … {b}", g=g, a=g * group, b=g * group + group - 1),
            below=False,
        )
    for h in range(nh):
        f.box(qx[h], y, qw, 38, role="q", label=tr("Q head {h}", h=h))
    # The student's mapping, one cell per head.
    my = y + 38 + 26
    f.text(MARGIN, my + 20, f"kv_head_for(h, {nh}, {nkv})", size=SMALL + 1, mono=True, color=INK, cls="label")
    f.text(MARGIN, my + 36, tr("(your values)"), size=SMALL + 1, color=MUTED, cls="label")
    cw = 44
    for h in range(nh):
        bad = mapping[h] != expected[h]
        f.cell(
            qx[h] + qw / 2 - cw / 2, my, mapping[h], role="plain", w=cw, h=CELL, wrong=bad, expected=expected[h] if bad else None, bold=True
        )
        f.arrow(qx[h] + qw / 2, y + 38, qx[h] + qw / 2, my - 2, color=MUTED, width=1, head=5)
        f.text(qx[h] + qw / 2 + cw / 2 + 6, my + CELL / 2 + 4, f"= {h} // {group}", size=SMALL, mono=True, color=MUTED, cls="label")
    # K/V heads, centred under their groups.
    ky = my + CELL + 90
    f.text(MARGIN, ky + 24, tr("K/V heads"), size=LABEL, weight="bold", cls="label")
    f.text(MARGIN, ky + 40, tr("(in the cache)"), size=SMALL + 1, color=MUTED, cls="label")
    kw = 84
    kv_center = {}
    for g in range(nkv):
        cx = (qx[g * group] + qx[g * group + group - 1] + qw) / 2
        kv_center[g] = cx
        f.box(cx - kw - 3, ky, kw, 38, role="k", label=tr("K head {g}", g=g))
        f.box(cx + 3, ky, kw, 38, role="v", label=tr("V head {g}", g=g))
    for h in range(nh):
        target = mapping[h]
        if target in kv_center:
            ok = target == expected[h]
            f.curve(
                qx[h] + qw / 2,
                my + CELL + 2,
                kv_center[target],
                ky - 2,
                color=stroke("q") if ok else stroke("wrong"),
                width=1.6 if ok else 2,
            )
    f.y = ky + 38 + 40

    # The cache: what is stored vs the copy no kernel needs.
    f.heading(tr("one layer's KV cache per token"))
    cell_w = 62
    sx = x0
    f.text(MARGIN, f.y + 22, tr("stored"), size=LABEL, weight="bold", cls="label")
    f.text(MARGIN, f.y + 38, _heads(nkv), size=SMALL + 1, color=MUTED, cls="label")
    items = [(f"K{g}", "k") for g in range(nkv)] + [(f"V{g}", "v") for g in range(nkv)]
    for i, (label, role) in enumerate(items):
        f.cell(sx + i * cell_w, f.y + 6, label, role=role, w=cell_w - 4, h=32, fmt=str, bold=True)
    f.text(sx + len(items) * cell_w + 10, f.y + 27, tr("2 × {nkv} × d numbers", nkv=nkv), size=SMALL + 1, color=INK, cls="label")
    f.y += 56
    f.text(MARGIN, f.y + 22, tr("not needed"), size=LABEL, weight="bold", color=MUTED, cls="label")
    f.text(MARGIN, f.y + 38, _heads(nh), size=SMALL + 1, color=MUTED, cls="label")
    copies = [(f"K{h // group}", "masked") for h in range(nh)] + [(f"V{h // group}", "masked") for h in range(nh)]
    cwc = min(cell_w, (f.width - MARGIN - sx - 150) / len(copies))
    for i, (label, role) in enumerate(copies):
        f.cell(sx + i * cwc, f.y + 6, label, role=role, w=cwc - 4, h=32, fmt=str, dashed=True)
    f.text(
        sx + len(copies) * cwc + 10,
        f.y + 27,
        tr("2 × {nh} × d: {group}× the memory", nh=nh, group=group),
        size=SMALL + 1,
        color=MUTED,
        cls="label",
    )
    f.y += 62
    f.note(
        tr(
            "A repeat_interleave copy gives the same numbers but spends the memory GQA saves. flash-attn (as "
            "nano-vllm calls it) reads K/V head h // (num_heads / num_kv_heads) = h // {group} directly from the "
            "{nkv} K/V heads it is given: the step's fresh k, v in a prefill without a cached prefix, the paged "
            "cache otherwise.",
            group=group,
            nkv=nkv,
        ),
        size=SMALL + 2,
    )
    f.y += 4
    f.legend(
        [("q", tr("query head")), ("k", tr("K head")), ("v", tr("V head")), ("masked", tr("a repeated copy (not needed)"))],
        wrong=mapping != expected,
    )


@figure(
    "ch18-kv-capacity",
    title="三种配置的 KV 容量",
    zh="三种配置保持 Q 头数为 8。固定 L、d、T、dtype 时,KV 容量之比为 8:2:1。",
    en="MHA / GQA / MQA with 8 query heads: at fixed layers L, head_dim d, tokens T and dtype, the KV cache "
    "sizes are in the ratio 8 : 2 : 1.",
    needs={"sizes": "ch18.3"},
)
def kv_capacity_figure(f: Figure, r: dict) -> None:
    configs, nh, sizes, expected = r["configs"], r["num_heads"], r["sizes"], r["expected"]
    L, d, T, b = r["num_layers"], r["head_dim"], r["num_tokens"], r["dtype_bytes"]
    f.instance_row(
        [
            (tr("L = {L} layers", L=L), "plain"),
            (f"d = {d}", "plain"),
            (tr("T = {T} tokens", T=f"{T:,}"), "token"),
            (tr("bf16: {b} bytes", b=b), "plain"),
            (tr("{nh} query heads", nh=nh), "q"),
        ]
    )

    bar_w, gap = 160, 100
    total = len(configs) * bar_w + (len(configs) - 1) * gap
    bx = MARGIN + 90 + (f.width - 2 * MARGIN - 90 - total) / 2
    # Head schematics: 8 query heads above, their K/V heads below, consecutive groups.
    y = f.y + 8
    f.text(MARGIN, y + 12, tr("query heads"), size=SMALL + 1, color=MUTED, cls="label")
    f.text(MARGIN, y + 68, tr("K/V heads"), size=SMALL + 1, color=MUTED, cls="label")
    sq = (bar_w - 4) / nh
    for i, (name, nkv) in enumerate(configs):
        x = bx + i * (bar_w + gap)
        group = nh // nkv
        kx = [x + (g * group + group / 2) * sq - sq / 2 for g in range(nkv)]
        for h in range(nh):
            f.cell(x + h * sq, y, "", role="q", w=sq - 3, h=18)
            g = h // group
            f.arrow(x + h * sq + (sq - 3) / 2, y + 19, kx[g] + (sq - 3) / 2, y + 52, color=stroke("q"), width=0.8, head=4)
        for g in range(nkv):
            f.cell(kx[g], y + 54, "", role="k", w=sq - 3, h=18)
        f.text(x + bar_w / 2, y - 8, f"{name}: {nh} Q → {nkv} K/V", size=SMALL + 1, anchor="middle", color=INK, weight="bold", cls="label")
    f.y = y + 54 + 18 + 42

    def mib(x) -> str:
        return f"{x / 2**20:,.0f} MiB" if isinstance(x, (int, float)) else str(x)

    f.text(MARGIN, f.y + 70, tr("KV cache"), size=SMALL + 1, color=MUTED, cls="label")
    f.text(MARGIN, f.y + 86, tr("(your bytes)"), size=SMALL + 1, color=MUTED, cls="label")
    _, bars_h = f.bars(
        bx,
        f.y,
        sizes,
        labels=[f"{name} · num_kv_heads = {nkv}" for name, nkv in configs],
        height=190,
        bar_w=bar_w,
        gap=gap,
        role="k",
        expected=expected,
        fmt=mib,
        tol=0.0,
    )
    f.y += round(bars_h) + 6
    for i, (name, nkv) in enumerate(configs):
        cx = bx + i * (bar_w + gap) + bar_w / 2
        f.text(cx, f.y, f"2·{L}·{nkv}·{d}·{T}·{b}", size=SMALL, anchor="middle", mono=True, color=MUTED, cls="label")
        bad = sizes[i] != expected[i]
        f.text(
            cx,
            f.y + 16,
            f"= {sizes[i]:,} B",
            size=SMALL,
            anchor="middle",
            mono=True,
            color=stroke("wrong") if bad else INK,
            cls="value wrong" if bad else "value",
        )
    f.y += 40
    smallest = min(sizes) if all(isinstance(s, int) and s > 0 for s in sizes) else None
    ratio = " : ".join(num(s / smallest) for s in sizes) if smallest else "—"
    f.note(
        tr(
            "Ratio of your sizes: {ratio} (expected {expected}). The query heads "
            "never enter the formula 2 · L · num_kv_heads · d · T · bytes: only K/V heads are cached, so at a fixed "
            "memory budget MQA holds {times}× as many tokens as MHA.",
            ratio=ratio,
            expected=" : ".join(str(nkv) for _, nkv in configs),
            times=configs[0][1] // configs[-1][1],
        ),
        color=INK,
        size=SMALL + 2,
    )
    f.y += 2
    f.legend([("q", tr("query head")), ("k", tr("K/V head, and the bytes its cache takes"))], wrong=sizes != expected)


def _heads(n: int) -> str:
    return tr("1 head") if n == 1 else tr("{n} heads", n=n)
