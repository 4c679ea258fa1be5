"""Figures of ch31 · mixture of experts across ranks: the rows of a dispatch leaving token order and coming
back through the handle, the per-GPU load before and after EPLB places replicas, and the window of past passes
whose loads EPLB sums."""

from __future__ import annotations

from figures import figure
from figures.kit import Figure, num, row_label_width, text_width
from figures.layout import column, pad, row, wide
from figures.style import INK, LABEL, LABEL_SMALL, MARGIN, MUTED, PAPER, RULE, SMALL, fill, stroke
from grader.i18n import tr


def _pair(v) -> str:
    return "[" + ", ".join(num(round(float(x), 4)) for x in v) + "]"


def strand_ends(src: list[int], col_x: list[float], token_left: list[float], tw: float) -> list[float]:
    """Where each row's curve meets its token's box (x), the rows of one token spread over the box's middle half
    in the order of their columns: a token's strands never cross one another, and strands of different tokens
    cross only where the rows' order makes them (a row of a later token in a column left of an earlier token's).
    A row naming no token of the batch gets its own column's x (a straight line)."""
    ends = list(col_x)
    for t, left in enumerate(token_left):
        mine = sorted((x, i) for i, (x, s) in enumerate(zip(col_x, src)) if s == t)
        for k, (_, i) in enumerate(mine):
            ends[i] = left + tw / 4 + tw / 2 * (k + 0.5) / len(mine)
    return ends


@figure(
    "ch31-moe-roundtrip",
    title="非 MegaMoE 路径的数据往返",
    zh="dispatch 把每个 (token, 专家) 对作为一行送到专家所在的 rank,按专家分组;handle 记下每行来自哪个 token、"
    "第几个 top-k 选择;combine 按 handle 把专家输出送回 token 顺序并按权重求和,而不是把各 rank 的输出按物理顺序拼接。",
    en="MoE dispatch and combine: every (token, expert) pair travels as one row to its expert's rank, grouped "
    "by expert; the handle keeps each row's token and top-k slot, so combine returns the expert outputs to "
    "token order, weighted, instead of concatenating the ranks' rows in physical order.",
    needs={"handle": "ch31.2"},
)
def roundtrip_figure(f: Figure, r: dict) -> None:
    x, ids, w = r["x"], r["topk_ids"], r["topk_weights"]
    h, hw = r["handle"], r["handle_expected"]
    rows, rows_w = r["rows"], r["rows_expected"]
    out, out_w, out_wrong = r.get("out"), r.get("out_expected"), r.get("out_wrong")
    N, E, R = len(x), len(hw["tokens_per_expert"]), len(hw["rows_per_rank"])
    per_rank = E // R
    src, slot, exp = h["src_token"], h["topk_slot"], h["expert"]
    flat = [row for rank in rows for row in rank]
    M = min(len(src), len(slot), len(exp), len(flat))
    flat_w = [row for rank in rows_w for row in rank]
    wrong_any = h != hw or rows != rows_w or bool(out_wrong and any(out_wrong))
    bands = {
        "tokens": (tr("① tokens"), "x, top-k"),
        "handle": (tr("② expert"), "handle"),
        "slot": ("", "src · slot"),
        "rows": (tr("rows x"), tr("(dispatched)")),
        "experts": ("③ y = (e+1)·x", tr("(expert output)")),
        "combine": ("④ combine", "Σ w · y"),
    }
    left = (
        MARGIN
        + 10
        + max(
            text_width(s, SMALL + 1, bold=i == 0)
            for lines in bands.values()  # the band labels
            for i, s in enumerate(lines)
        )
    )

    def band(y: float, name: str) -> None:
        for i, line in enumerate(bands[name]):
            f.text(
                left - 10,
                y + i * (SMALL + 4),
                line,
                size=SMALL + 1,
                anchor="end",
                color=INK if i == 0 else MUTED,
                weight="bold" if i == 0 else "normal",
                cls="label",
            )

    f.heading(tr("① route_topk → ② dispatch (labels from your handle) → ③ experts → ④ combine, back in token order"))
    # 1. The tokens and their routing.
    gap = 14
    tw = (f.width - MARGIN - left - (N - 1) * gap) / N
    tokens = f.matrix([[f"T{t}  x = {_pair(x[t])}" for t in range(N)]], role="token", w=tw, h=30, gap=gap, fmt=str)
    f.place(tokens, x=left, after=0)
    token_left = [tokens.cell_box(0, t)[0] for t in range(N)]
    band(tokens.cell_box(0, 0)[1] + 13, "tokens")
    for t in range(N):
        routes = ",  ".join(f"e{e}·{num(round(wt, 3))}" for e, wt in zip(ids[t], w[t]))
        f.text(
            token_left[t] + tw / 2, tokens.bottom + 16, "→ " + routes, size=SMALL + 1, anchor="middle", mono=True, color=MUTED, cls="label"
        )
    token_bottom = tokens.bottom + 22

    # 2. The dispatched rows, one column per row, rank by rank: your handle, your rows, the experts' outputs.
    counts = h["rows_per_rank"] if len(h["rows_per_rank"]) == R else hw["rows_per_rank"]
    spans, start = [], 0
    for rank in range(R):
        spans.append([rank, min(start, M), min(start + max(counts[rank], 0), M)])
        start += max(counts[rank], 0)
    spans[-1][2] = max(spans[-1][2], M)  # counts that do not add up: the rest on the last rank
    spans = [s for s in spans if s[2] > s[1]]
    col_gap, rank_gap = 6, 24
    cw = (f.width - MARGIN - left - (len(spans) - 1) * rank_gap - (M - len(spans)) * col_gap) / max(M, 1)
    want = [(hw["src_token"][i], hw["topk_slot"][i], hw["expert"][i]) if i < len(hw["src_token"]) else None for i in range(M)]
    expert_ok = [v is not None and v[2] == exp[i] for i, v in enumerate(want)]
    handle = [f"T{src[i]} · k{slot[i]}" for i in range(M)]
    handle_w = [f"T{v[0]}·k{v[1]}·e{v[2]}" if v else "—" for v in want]
    dispatched = [_pair(flat[i]) for i in range(M)]
    dispatched_w = [_pair(flat_w[i]) if i < len(flat_w) else "—" for i in range(M)]
    grids = [
        f.matrix(
            [handle[lo:hi], dispatched[lo:hi], [_pair([v * (exp[i] + 1) for v in flat[i]]) for i in range(lo, hi)]],
            role=lambda i, j: "accent" if i == 2 else "block",
            expected=[handle_w[lo:hi], dispatched_w[lo:hi], [None] * (hi - lo)],
            wrong=[
                [(src[i], slot[i], exp[i]) != want[i] for i in range(lo, hi)],
                [i >= len(flat_w) or flat[i] != flat_w[i] for i in range(lo, hi)],
                [False] * (hi - lo),
            ],
            w=cw,
            h=28,
            gap=col_gap,
            fmt=str,
        )
        for _, lo, hi in spans
    ]
    ranks = [
        column(
            grid,
            f.label(
                tr(
                    "rank {rank} · experts e{first}–e{last} · {n} rows",
                    rank=rank,
                    first=rank * per_rank,
                    last=(rank + 1) * per_rank - 1,
                    n=counts[rank],
                ),
                size=LABEL_SMALL,
            ),
            gap=10,
        )
        for grid, (rank, _, _) in zip(grids, spans)
    ]
    f.y = round(token_bottom + 100)
    f.place(row(*ranks, gap=rank_gap), x=left, after=0)
    for part in ranks:  # each rank in a dashed box, its experts' labels included
        f.outline(part.right - part.w, part.bottom - part.h - 20, part.w, part.h + 22, role="plain", dashed=True, width=1, inset=-6)
    col_x = [grid.cell_box(0, j)[0] for grid, (_, lo, hi) in zip(grids, spans) for j in range(hi - lo)]
    ry = grids[0].cell_box(0, 0)[1] if grids else f.y
    band(ry - 4, "handle")
    band(ry + 18, "slot")
    if grids:
        band(grids[0].cell_box(1, 0)[1] + 18, "rows")
        band(grids[0].cell_box(2, 0)[1] + 18, "experts")
    ends = strand_ends(src, [bx + cw / 2 for bx in col_x], token_left, tw)
    for i in range(M):
        cx = col_x[i] + cw / 2
        right = i < len(hw["src_token"]) and src[i] == hw["src_token"][i]
        f.curve(ends[i], token_bottom + 2, cx, ry - 28, color=stroke("block") if right else stroke("wrong"), width=1.0, head=5)
        f.text(
            cx,
            ry - 8,
            f"e{exp[i]}",
            size=SMALL + 1,
            anchor="middle",
            weight="bold",
            color=INK if expert_ok[i] else stroke("wrong"),
            cls="label",
        )
    rows_bottom = max((part.bottom for part in ranks), default=ry) + 8

    # 4. Combine: back to token order, weighted.
    oy = rows_bottom + 96
    for i in range(M):
        if 0 <= src[i] < N:
            f.curve(col_x[i] + cw / 2, rows_bottom + 2, ends[i], oy - 30, color=stroke("accent"), width=1.0, head=5)
    band(oy - 10, "combine")
    for t in range(N):
        terms = [(w[t][j], ids[t][j]) for j in range(len(ids[t]))]
        formula = " + ".join(f"{num(round(wt, 3))}·{e + 1}" for wt, e in terms)
        factor = sum(wt * (e + 1) for wt, e in terms)
        f.text(token_left[t] + tw / 2, oy - 14, f"out[T{t}] = ({formula})·x", size=SMALL - 0.5, anchor="middle", mono=True, cls="label")
        f.text(
            token_left[t] + tw / 2,
            oy - 1,
            f"= {num(round(factor, 4))}·x",
            size=SMALL - 0.5,
            anchor="middle",
            mono=True,
            color=MUTED,
            cls="label",
        )
    f.y = round(oy + 6)
    if out is not None and out_w is not None:
        combined = f.matrix(
            [[_pair(v) for v in out]],
            expected=[[_pair(v) for v in out_w]],
            wrong=[out_wrong or [False] * N],
            role="token",
            w=tw,
            h=30,
            gap=gap,
            fmt=str,
        )
    else:
        combined = f.matrix([[tr("combine not checked yet")] * N], role="masked", w=tw, h=30, gap=gap, fmt=str)
    f.place(combined, x=left, after=28)
    order = ", ".join(f"T{hw['src_token'][i]}" for i in range(len(hw["src_token"])))
    f.note(
        tr(
            "In physical order the rows are [{order}]: {rows} rows for {N} tokens, some twice and "
            "out of place. Concatenating them is wrong; the handle puts each one back. (The course keeps one row per "
            "(token, expert), like DeepEP's low-latency mode; its normal mode sends a token once per rank.)",
            order=order,
            rows=len(hw["src_token"]),
            N=N,
        ),
        size=LABEL_SMALL,
    )
    f.legend(
        [
            ("token", tr("tokens and combined outputs, in token order")),
            ("block", tr("rows on a rank (handle, x)")),
            ("accent", tr("expert outputs")),
        ],
        wrong=wrong_any,
    )


@figure(
    "ch31-eplb-load",
    title="平均负载掩盖最慢 rank",
    zh="平均负载掩盖最慢 rank:不做 EPLB 时每块 GPU 连续放两个专家,最忙的 GPU 负载 100、平均只有 75;"
    "EPLB 给热门专家加冗余副本并装箱后,最忙的 GPU 降到 80,balancedness 从 0.75 升到 0.9375。"
    "这是解释热点的示意数据,非实际 benchmark;EPLB 策略还看多步历史和槽位容量。",
    en="Average load hides the slowest rank: without EPLB each GPU holds two contiguous experts and the busiest "
    "carries 100 against a mean of 75; with redundant replicas of the hot experts packed by EPLB the busiest "
    "carries 80, and balancedness rises from 0.75 to 0.9375. Illustrative loads, not a benchmark; EPLB also "
    "weighs many steps of history and the slots available.",
    needs={"phy2log": "ch31.3"},
)
def eplb_load_figure(f: Figure, r: dict) -> None:
    loads, (num_replicas, num_groups, num_nodes, num_gpus) = r["loads"], r["args"]
    phy, cnt, phy_w, cnt_w = r["phy2log"], r["logcnt"], r["phy2log_expected"], r["logcnt_expected"]
    E = len(loads)
    per_gpu, static_per = num_replicas // num_gpus, E // num_gpus
    bal_wrong = r.get("balancedness_wrong") or [False, False]
    wrong_any = phy != phy_w or cnt != cnt_w or any(bal_wrong)

    # The instance: loads per logical expert, in groups.
    f.heading(
        tr(
            "one layer's loads: {E} logical experts in {groups} groups; {nodes} nodes, {gpus} GPUs, {slots} slots ({per} per GPU)",
            E=E,
            groups=num_groups,
            nodes=num_nodes,
            gpus=num_gpus,
            slots=num_replicas,
            per=per_gpu,
        )
    )
    gs = E // num_groups
    groups = [
        f.matrix([loads[g * gs : (g + 1) * gs]], col_labels=[f"e{e}" for e in range(g * gs, (g + 1) * gs)], role="block", w=60, h=28, gap=4)
        for g in range(num_groups)
    ]
    f.place(row(*groups, gap=10), after=44)
    for g, grid in enumerate(groups):
        x, y, w, h = grid.span_box(0, 0, 0, gs - 1)
        f.bracket(x, x + w, y + h + 6, tr("group {g} = {load}", g=g, load=num(sum(loads[g * gs : (g + 1) * gs]))), size=SMALL + 0.5)

    # Two panels of stacked bars.
    static = [[(e, loads[e]) for e in range(g * static_per, (g + 1) * static_per)] for g in range(num_gpus)]
    stacks = [[(e, loads[e] / cnt[e]) for e in phy[g * per_gpu : (g + 1) * per_gpu]] for g in range(num_gpus)]
    stacks_w = [[(e, loads[e] / cnt_w[e]) for e in phy_w[g * per_gpu : (g + 1) * per_gpu]] for g in range(num_gpus)]
    top = max(sum(v for _, v in s) for s in static + stacks + stacks_w) * 1.08
    panel_w = (f.width - 2 * MARGIN - 30) / 2
    height = 210
    base = f.y + 40 + height
    totals = [sum(v for _, v in s) for s in static + stacks]
    gutter = (
        max(text_width(line_label("max", max(totals)), SMALL, bold=True), text_width(line_label("mean", sum(totals) / len(totals)), SMALL))
        + 12
    )  # the lines' labels
    for p, (title, data, want) in enumerate(
        (
            (tr("without EPLB: {n} contiguous experts per GPU", n=static_per), static, None),
            (tr("after EPLB, your placement: replicas of hot experts, packed"), stacks, stacks_w),
        )
    ):
        px = MARGIN + p * (panel_w + 30)
        f.text(px, f.y + 6, title, size=LABEL, weight="bold", cls="heading")
        _stacked(f, px + gutter, base, panel_w - gutter - 20, height, top, data, want, cnt, num_nodes, num_gpus)
    f.y = base + 92

    # Balancedness: the check's verdict on each of your two values.
    f.heading(tr("balancedness = mean / max: the slowest GPU sets the step time; the average hides it"))
    gots = r.get("balancedness") or [None, None]
    wants = r.get("balancedness_expected") or [None, None]
    panels = []
    for data, got, want, bad in zip((static, stacks), gots, wants, bal_wrong):
        totals = [sum(v for _, v in s) for s in data]
        ratio = f.label(f"{num(sum(totals) / len(totals))} / {num(max(totals))} =", size=LABEL, mono=True, color=INK, cls="value")
        mine = (
            None
            if want is None
            else row(
                f.matrix(
                    [[tr("not run") if got is None else f"{got:.4g}"]],
                    expected=[[f"{want:.4g}"]],
                    wrong=[[bad]],
                    role="accent",
                    w=110,
                    h=30,
                    fmt=str,
                ),
                f.label(tr("your balancedness()"), size=LABEL_SMALL),
                gap=10,
                align="middle",
            )
        )
        panels.append(wide(row(wide(ratio, 140), mine, gap=10, align="middle"), panel_w + 30))
    f.place(pad(row(*panels, gap=0), top=4), after=26)
    f.legend(
        [
            ("block", tr("an expert with one replica")),
            ("accent", tr("a replica of a hot expert (load / count)")),
            ("plain", tr("dashed line: the mean GPU load; solid: the max, the step time")),
        ],
        wrong=wrong_any,
    )


def line_label(name: str, value: float) -> str:
    """The label of the max or the mean line: its name in the run's language, then its value."""
    words = {"max": tr("max"), "mean": tr("mean")}
    return f"{words.get(name, name)} {num(round(value, 2))}"


LABEL_H = SMALL + 2
"""The height a segment's label takes (its font size and a little room); a segment shorter than this is unlabelled."""


def label_box(x: float, baseline: float, text: str) -> tuple[float, float, float, float]:
    """The box (left, top, right, bottom) a centred segment label takes: its estimated width, LABEL_H high."""
    w = text_width(text, SMALL, mono=True)
    return x - w / 2, baseline - LABEL_H + 1.5, x + w / 2, baseline + 3


def _label_y(top: float, bottom: float, lines: list[float]) -> float | None:
    """The baseline of a label inside a segment spanning top..bottom (y grows downwards): at its middle, or moved
    up or down within it so that no reference line at a y in `lines` crosses it; None if no place is clear."""
    middle = (top + bottom) / 2 + LABEL_H / 2 - 1.5  # the baseline that centres the label
    candidates = [middle] + [b for y in lines for b in (y - 5.5, y + LABEL_H + 1)]  # just above, just below
    for b in sorted(candidates, key=lambda b: abs(b - middle)):
        _, t, _, u = label_box(0, b, "")
        if top + 1 <= t and u <= bottom - 1 and all(y < t - 1.5 or y > u + 1.5 for y in lines):
            return b
    return None


def _stacked(
    f: Figure, x0: float, base: float, width: float, height: float, top: float, data: list, want, cnt: list, num_nodes: int, num_gpus: int
) -> None:
    """One bar per GPU, a segment per replica; a GPU whose replicas differ from `want` is hatched.

    The mean (dashed) and the max (solid) cross the bars; a segment's label sits where neither line crosses it,
    or, in a segment too short for that, on a patch of the segment's colour drawn over the line."""
    gap = 18
    bw = (width - (num_gpus - 1) * gap) / num_gpus
    totals = [sum(v for _, v in s) for s in data]
    mean = sum(totals) / len(totals)
    my = base - height * mean / top
    mx = base - height * max(totals) / top
    labels = []
    for g, stack in enumerate(data):
        bx = x0 + g * (bw + gap)
        bad = want is not None and sorted(stack) != sorted(want[g])
        y = base
        for e, v in stack:
            hgt = height * v / top
            role = "accent" if cnt[e] > 1 and want is not None else "block"
            f.dwg.add(
                f.dwg.rect(
                    (bx, y - hgt),
                    (bw, hgt),
                    fill="url(#hatch-wrong)" if bad else fill(role),
                    stroke=stroke("wrong") if bad else stroke(role),
                    stroke_width=1,
                    class_="bar wrong" if bad else "bar",
                )
            )
            if hgt >= LABEL_H + 2:
                labels.append((bx + bw / 2, y - hgt, y, f"e{e} {num(round(v, 2))}", "wrong" if bad else role))
            y -= hgt
        if bad:
            wt = sum(v for _, v in want[g])
            hw = height * wt / top
            outline = f.dwg.rect((bx - 3, base - hw), (bw + 6, hw), fill="none", stroke=INK, stroke_width=1, class_="expected-bar")
            outline["stroke-dasharray"] = "3,2"
            f.dwg.add(outline)
            f.text(bx + bw / 2, base + 58, tr("expected"), size=SMALL - 1.5, anchor="middle", cls="expected")
            f.text(
                bx + bw / 2,
                base + 69,
                " ".join(f"e{e}" for e, _ in want[g]) + f" = {num(round(wt, 2))}",
                size=SMALL - 1.5,
                anchor="middle",
                cls="expected",
            )
        f.text(
            bx + bw / 2,
            base + 14,
            tr("GPU {g}: {load}", g=g, load=num(round(totals[g], 2))),
            size=SMALL + 1,
            anchor="middle",
            weight="bold",
            color=stroke("wrong") if bad else INK,
            cls="value wrong" if bad else "value",
        )
    line = f.dwg.line((x0 - 6, my), (x0 + width + 6, my), stroke=INK, stroke_width=1.2, class_="mean")
    line["stroke-dasharray"] = "5,3"
    f.dwg.add(line)
    f.dwg.add(f.dwg.line((x0 - 6, mx), (x0 + width + 6, mx), stroke=stroke("accent"), stroke_width=1.4, class_="max"))
    # The two lines' labels, left of the bars: the max above its line, the mean below its own, so they never meet.
    f.text(
        x0 - 8,
        mx - 3,
        line_label("max", max(totals)),
        size=SMALL,
        anchor="end",
        color=stroke("accent"),
        weight="bold",
        cls="label line-label",
    )
    f.text(x0 - 8, my + 11, line_label("mean", mean), size=SMALL, anchor="end", color=INK, cls="label line-label")
    # The segments' labels, drawn after the lines: clear of them, or on a patch that hides the line behind.
    for cx, seg_top, seg_bottom, text, role in labels:
        b = _label_y(seg_top, seg_bottom, [my, mx])
        if b is None:
            b = (seg_top + seg_bottom) / 2 + LABEL_H / 2 - 1.5
            left, t, right, bottom = label_box(cx, b, text)
            f.dwg.add(
                f.dwg.rect(
                    (left - 2, t), (right - left + 4, bottom - t), rx=2, fill=PAPER if role == "wrong" else fill(role), class_="label-patch"
                )
            )
        f.text(cx, b, text, size=SMALL, anchor="middle", mono=True, cls="value")
    per_node = num_gpus // num_nodes
    for n in range(num_nodes):
        a = x0 + n * per_node * (bw + gap)
        f.bracket(a, a + per_node * (bw + gap) - gap, base + 22, tr("node {n}", n=n), size=SMALL)
    f.dwg.add(f.dwg.line((x0 - 4, base), (x0 + width + 4, base), stroke=RULE, stroke_width=1))


def _window_caption(lang: str):
    def caption(r: dict) -> str:
        W = len(r["window"])
        if lang == "zh":
            return (
                f"EPLB 还看多步历史:每个 slot 在前 {W} 次前向中的 token 数存在环形缓冲区里,本次写进 cursor 所指的最旧一行,"
                f"cursor 前进(到末尾回到 0);重排时按 phy2log 把各 slot 加到其逻辑专家上,再对 {W} 行求和,"
                f"得到 rebalance_experts 的 weight。一次前向里变热的专家,在 {W} 行之和里只占一小部分。"
            )
        return (
            f"EPLB looks at history: the tokens of each slot over the last {W} forward passes sit in a ring buffer; "
            "this pass overwrites the oldest row, where the cursor points, and the cursor moves on (back to 0 "
            f"after the last row). To rebalance, each slot is added to its logical expert through phy2log and the "
            f"{W} rows are summed: the weight of rebalance_experts. An expert that is hot in one pass is a small "
            "part of the sum."
        )

    return caption


@figure(
    "ch31-eplb-window",
    title="EPLB 看多步历史:环形缓冲区里的负载",
    zh=_window_caption("zh"),
    en=_window_caption("en"),
    needs={"yours": "ch31.4"},
)
def eplb_window_figure(f: Figure, r: dict) -> None:
    old, step, this_pass, phy2log, E = r["window"], r["step"], r["load_pass"], r["phy2log"], r["num_experts"]
    (mine, my_step, my_load), (want, w_step, w_load) = r["yours"], r["expected"]
    wrong_window, wrong_step, wrong_load = r["wrong"]
    W, P = len(old), len(phy2log[0])
    wrong_any = (
        bool(wrong_step) or any(x for rows in wrong_window for layer in rows for x in layer) or any(x for row_ in wrong_load for x in row_)
    )
    cols = [f"s{p}·e{phy2log[0][p]}" for p in range(P)]

    def labels(cursor: int, newest: int) -> list[str]:
        """Row i: its pass (t is this pass, t−1 the one before), and the cursor, which points at the oldest row."""
        ages = {(cursor - 1 - k) % W: newest + k for k in range(W)}
        age = {i: "−" + str(ages[i]) if ages[i] else "" for i in range(W)}
        return [tr("row {i} · pass t{age}", i=i, age=age[i]) + ("  " + tr("← cursor") if i == cursor else "") for i in range(W)]

    f.heading(tr("layer 0: the window before pass t, {W} rows (passes) × {P} slots; column s·e is slot s, a replica of expert e", W=W, P=P))
    before_labels, after_labels = labels(step, 1), labels(w_step, 0)
    gutter = max(row_label_width(before_labels + after_labels + [tr("pass t"), "next_step"]), 0)
    cell_w, cell_h = 42, 28
    before = f.matrix(
        [row_[0] for row_ in old],
        role=lambda i, j: "masked" if i == step else "block",
        row_labels=before_labels,
        col_labels=cols,
        w=cell_w,
        h=cell_h,
        label_w=gutter,
    )
    incoming = f.matrix([this_pass[0]], role="accent", row_labels=[tr("pass t")], w=cell_w, h=cell_h, label_w=gutter)
    left = column(
        f.label(tr("before: the cursor (step = {step}) is at the oldest pass", step=step), size=LABEL, color=INK, bold=True),
        before,
        pad(incoming, top=6),
        f.label(tr("pass t is written over row {step}", step=step), size=LABEL_SMALL),
        gap=8,
    )
    after = f.matrix(
        [row_[0] for row_ in mine],
        role=lambda i, j: "accent" if i == step else "block",
        expected=[row_[0] for row_ in want],
        wrong=[row_[0] for row_ in wrong_window],
        row_labels=after_labels,
        col_labels=cols,
        w=cell_w,
        h=cell_h,
        label_w=gutter,
    )
    cursor = f.matrix(
        [[my_step]],
        expected=[[w_step]],
        wrong=[[bool(wrong_step)]],
        role="token",
        w=cell_w,
        h=cell_h,
        row_labels=["next_step"],
        label_w=gutter,
    )
    right = column(f.label(tr("after: your window and cursor"), size=LABEL, color=INK, bold=True), after, pad(cursor, top=6), gap=8)
    f.place(row(left, right, gap=28), after=30)

    # The sums: per slot, then per logical expert, beside the same sum of pass t alone.
    f.heading(tr("Σ over the rows → per logical expert (slots added through phy2log) = the weight of rebalance_experts"))
    per_slot = [sum(row_[0][p] for row_ in want) for p in range(P)]
    alone = [sum(this_pass[0][p] for p in range(P) if phy2log[0][p] == e) for e in range(E)]
    total, total_alone = sum(w_load[0]) or 1, sum(alone) or 1
    slots = f.matrix([per_slot], role="block", row_labels=[tr("Σ rows, per slot")], col_labels=cols, w=cell_w, h=cell_h, label_w=gutter)
    expert_labels = [tr("your load (Σ rows)"), tr("pass t alone")]
    expert_gutter = row_label_width(expert_labels)
    experts = f.matrix(
        [my_load[0], alone],
        expected=[w_load[0], alone],
        wrong=[wrong_load[0], [False] * E],
        role=lambda i, j: "token" if i == 0 else "plain",
        row_labels=expert_labels,
        col_labels=[f"e{e}" for e in range(E)],
        w=cell_w + 8,
        h=cell_h,
        label_w=expert_gutter,
    )
    hot = max(range(E), key=lambda e: alone[e] / total_alone - w_load[0][e] / total)
    note = tr(
        "e{e} has {one} % of pass t's tokens but {all} % of the window's: rebalancing from one pass would chase that spike.",
        e=hot,
        one=num(round(100 * alone[hot] / total_alone)),
        all=num(round(100 * w_load[0][hot] / total)),
    )
    f.place(column(row(slots, experts, gap=30, align="bottom"), f.label(note, size=LABEL_SMALL), gap=12), after=26)
    f.legend(
        [
            ("block", tr("a past pass")),
            ("masked", tr("the oldest pass (overwritten)")),
            ("accent", tr("pass t, in row step")),
            ("token", tr("load per logical expert")),
        ],
        wrong=wrong_any,
    )
