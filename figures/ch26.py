"""Figures of ch26 · flattened batches and graph replay: packing a padded batch, the boundaries of a
flattened prefill with a prefix hit, and a decode batch padded into a captured graph's buffers."""

from __future__ import annotations

from typing import Any, Callable

from figures import figure
from figures.kit import Figure, Grid
from figures.layout import Part, column, pad, row, wide
from figures.style import INK, LABEL, LABEL_SMALL, MUTED, SMALL, fill, stroke
from grader.i18n import tr

REQUEST_ROLES = ("token", "accent")


def _tick(f: Figure, x: float, y1: float, y2: float, *, color: str, width: float = 2.2) -> None:
    f.dwg.add(f.dwg.line((x, y1), (x, y2), stroke=color, stroke_width=width, class_="boundary"))


# -- ch26.1 -------------------------------------------------------------------------------------------


@figure(
    "ch26-dim-varlen-pack",
    title="padded → packed + cu_seqlens",
    zh="长度为 3 和 2 的两条请求从 padded [2, 3, 4] 收集到 packed [5, 4],逐行标出来源;用 cu_seqlens = [0, 3, 5] 恢复请求边界。",
    en="Two requests of lengths 3 and 2 gathered from padded [2, 3, 4] into packed [5, 4], each row labelled "
    "with its source; the request boundaries are recovered from cu_seqlens = [0, 3, 5].",
    needs={"packed": "ch26.1"},
)
def varlen_pack_figure(f: Figure, r: dict) -> None:
    padded, lengths, packed, expected = r["padded"], r["lengths"], r["packed"], r["expected"]
    cu, cu_want = r["cu_seqlens"], r["expected_cu"]
    B, T, H = len(padded), len(padded[0]), len(padded[0][0])
    N = len(packed)
    wrong_any = any(map(any, r["wrong"])) or any(r["cu_wrong"])
    f.instance_row(
        [(f"B = {B}", "plain", 70), (f"T_max = {T}", "plain", 90), (f"H = {H}", "plain", 64), (f"lengths = {lengths}", "token", 150)],
        note=tr("value = 100·(request + 1) + 10·token + channel"),
    )

    cells: dict[str, Any] = {"w": 41, "h": 28, "gap": 3}

    def request_role(b: int, n: int) -> Callable[[int, int], str]:
        """Request b's colour on its n real rows, grey on its padding."""
        return lambda t, _: REQUEST_ROLES[b % 2] if t < n else "masked"

    # Left: the padded batch, one block per request, padding rows grey.
    blocks = [
        f.matrix(
            padded[b],
            role=request_role(b, lengths[b]),
            **cells,
            row_labels=[f"t{t}" if t < lengths[b] else tr("t{t} pad", t=t) for t in range(T)],
        )
        for b in range(B)
    ]
    request_titles = [f.label(tr("request {b}", b=b), color=INK) for b in range(B)]
    width = max(block.w for block in blocks)
    left = column(*(column(wide(title, width), block, gap=4, align="right") for title, block in zip(request_titles, blocks)), gap=14)
    # Right: the student's packed rows, each labelled with the padded row it equals, and their boundaries.
    sources = {tuple(padded[b][t]): (b, t) for b in range(B) for t in range(lengths[b])}
    got_src = [sources.get(tuple(row)) for row in packed]
    roles = [REQUEST_ROLES[s[0] % 2] if s else "plain" for s in (sources.get(tuple(row)) for row in expected)]
    packed_grid = f.matrix(
        packed,
        expected=expected,
        wrong=r["wrong"],
        **cells,
        role=lambda i, _: roles[i],
        row_labels=[tr("row {i} ← req {b} · t{t}", i=i, b=s[0], t=s[1]) if s else tr("row {i} ← ?", i=i) for i, s in enumerate(got_src)],
    )
    cu_grid = f.matrix([cu], expected=[cu_want], wrong=[r["cu_wrong"]], w=44, h=28, col_labels=[f"[{j}]" for j in range(len(cu))])
    cu_row = row(
        pad(f.label(tr("your cu_seqlens"), size=LABEL, color=INK), top=21),
        cu_grid,
        pad(f.lines(tr("int32 [B + 1]: 0, then the"), tr("running sums of {lengths}", lengths=lengths)), top=20),
        gap=12,
    )
    heading = lambda s: f.label(s, size=LABEL + 1, color=INK, bold=True, cls="heading")  # noqa: E731
    f.y -= 12  # the headings' tops where a heading's baseline would be
    f.place(
        row(
            column(heading(f"padded [{B}, {T}, {H}]"), left, gap=6),
            column(
                heading(tr("your packed [{N}, {H}]", N=N, H=H)), pad(packed_grid, top=request_titles[0].h + 4), pad(cu_row, top=8), gap=6
            ),
            gap=120,
        )
    )
    # Arrows: where each real padded row belongs (cu_seqlens_expected[b] + t).
    for b in range(B):
        for t in range(lengths[b]):
            i = cu_want[b] + t
            x1, y1, _, h = blocks[b].cell_box(t, H)
            _, y2, _, _ = packed_grid.cell_box(i, 0)
            f.arrow(
                x1 - 1,
                y1 + h / 2,
                packed_grid.right - packed_grid.w - 6,
                y2 + h / 2,
                color=stroke("wrong") if any(r["wrong"][i]) else MUTED,
                width=1.0,
                head=5,
            )
    # Boundaries from the student's cu_seqlens, as brackets beside the packed rows.
    bx = packed_grid.cell_box(0, H)[0] + 3
    for b in range(min(B, len(cu) - 1)):
        a, e = max(0, min(cu[b], N)), max(0, min(cu[b + 1], N))
        if e > a:
            ok = cu[b] == cu_want[b] and cu[b + 1] == cu_want[b + 1]
            f.vbracket(
                bx,
                packed_grid.cell_box(a, 0)[1],
                packed_grid.cell_box(e, 0)[1] - 3,
                tr("request {b}: rows\ncu[{b}] … cu[{next}] − 1\n= {first} … {last}", b=b, next=b + 1, first=cu[b], last=cu[b + 1] - 1),
                color=MUTED if ok else stroke("wrong"),
            )

    unpacked = r.get("unpacked")
    if unpacked is not None:
        want_u = r["unpacked_expected"]
        wrong_any = wrong_any or any(any(map(any, b)) for b in r["unpacked_wrong"])
        f.heading(tr("your unpack_varlen(packed, cu_seqlens, T_max={T}): back to [{B}, {T}, {H}], padding = 0", T=T, B=B, H=H))
        f.place(
            pad(
                row(
                    *(
                        f.titled(
                            tr("request {b} (rows {first} … {last} of packed)", b=b, first=cu_want[b], last=cu_want[b + 1] - 1),
                            f.matrix(
                                unpacked[b],
                                expected=want_u[b],
                                wrong=r["unpacked_wrong"][b],
                                **cells,
                                role=request_role(b, cu_want[b + 1] - cu_want[b]),
                                row_labels=[f"t{t}" for t in range(T)],
                            ),
                            size=LABEL_SMALL,
                            gap=6,
                        )
                        for b in range(B)
                    ),
                    gap=60,
                ),
                top=4,
            ),
            after=30,
        )
    f.legend(
        [
            ("token", tr("request {b}'s tokens", b=0)),
            ("accent", tr("request {b}'s tokens", b=1)),
            ("masked", tr("padding position (dropped when packing, 0 when unpacking)")),
        ],
        wrong=wrong_any,
    )


# -- ch26.2 -------------------------------------------------------------------------------------------


@figure(
    "ch26-flatten",
    title="压平但不抹掉边界",
    zh="两条序列压平成一个 batch,边界仍记在 cu_seqlens 里。A 没有缓存;B 命中 8 个 token 的前缀,"
    "只计算 3 个新 token:它的 query 长度是 3,key 长度是 8 + 3 = 11。",
    en="Two sequences flattened without losing their boundaries, which cu_seqlens keeps. A has nothing cached; "
    "B hits an 8-token prefix and computes only 3 new tokens: its query length is 3, its key length "
    "8 + 3 = 11 (nano-vllm's 300 / 512 + 88 example, scaled down).",
    needs={"yours": "ch26.2"},
)
def flatten_figure(f: Figure, r: dict) -> None:
    query, cached, yours, want = r["query"], r["cached"], r["yours"], r["expected"]
    names = [chr(ord("A") + b) for b in range(len(query))]
    keys = [c + q for c, q in zip(cached, query)]
    wrong_any = any(any(v) if isinstance(v, list) else v for v in r["wrong"].values())
    f.instance_row(
        [
            (
                tr("{name}: {c} cached + {q} new", name=n, c=c, q=q) if c else tr("{name}: {q} new, nothing cached", name=n, q=q),
                "cached" if c else "new",
                230,
            )
            for n, q, c in zip(names, query, cached)
        ]
    )

    # The flattened queries and keys, one cell per token, labelled sequence + position.
    q_cells = [(n, c + i, "new") for n, q, c in zip(names, query, cached) for i in range(q)]
    k_cells = [(n, i, "cached" if i < c else "new") for n, q, c in zip(names, query, cached) for i in range(c + q)]

    def token_strip(cells: list[tuple[str, int, str]]) -> Grid:
        return f.matrix([[f"{n}{p}" for n, p, _ in cells]], role=lambda _, j: cells[j][2], w=39, h=32, gap=3, fmt=str)

    qs, ks = token_strip(q_cells), token_strip(k_cells)
    f.heading(tr("flattened batch: one row of queries and one of keys, each sequence after the other"))
    f.y += 30
    for label, strip, after in ((tr("queries q"), qs, 96), (tr("keys k"), ks, 56)):
        f.place(
            row(
                wide(pad(f.label(label, size=LABEL, color=INK), left=110 - 12 - f.label(label, size=LABEL).w), 110),
                strip,
                gap=12,
                align="middle",
            ),
            after=after,
        )
    # Bands from each sequence's queries to the keys it attends.
    q_start, k_start = 0, 0
    qy, ky = qs.cell_box(0, 0)[1] + 32, ks.cell_box(0, 0)[1]
    for b, n in enumerate(names):
        qa, qb = qs.cell_box(0, q_start)[0], qs.cell_box(0, q_start + query[b])[0] - 3
        ka, kb = ks.cell_box(0, k_start)[0], ks.cell_box(0, k_start + keys[b])[0] - 3
        f.dwg.add(
            f.dwg.polygon(
                [(qa, qy + 4), (qb, qy + 4), (kb, ky - 4), (ka, ky - 4)],
                fill=fill(("new", "cached")[b % 2]),
                fill_opacity=0.55,
                stroke=MUTED,
                stroke_width=0.8,
                class_="band",
            )
        )
        f.text(
            (qa + qb + ka + kb) / 4,
            (qy + ky) / 2 + 4,
            tr("{name}: {q} queries → {k} keys", name=n, q=query[b], k=keys[b]),
            size=SMALL + 1.5,
            anchor="middle",
            color=INK,
            cls="label",
        )
        q_start += query[b]
        k_start += keys[b]
    # The student's boundaries, as ticks with their values; the check's verdict colours them.
    for key, strip, above in (("cu_seqlens_q", qs, True), ("cu_seqlens_k", ks, False)):
        for j, v in enumerate(yours[key]):
            ok = not r["wrong"][key][j]
            x, y, _, h = strip.cell_box(0, max(0, min(v, strip.cols)))
            color = INK if ok else stroke("wrong")
            _tick(f, x - 1.5, y - 6, y + h + 6, color=color)
            f.text(
                x - 1.5,
                y - 10 if above else y + h + 18,
                f"cu_{key[-1]}[{j}]={v}",
                size=SMALL,
                anchor="middle",
                mono=True,
                color=color,
                cls="value" if ok else "value wrong",
            )

    # The values, with their derivations.
    f.heading(tr("your varlen_metadata: what flash_attn_varlen_func receives"))
    derivs = {
        "cu_seqlens_q": tr("0, then running sums of the query lengths {lens}", lens=query),
        "cu_seqlens_k": tr("0, then running sums of cached + query = {keys}", keys=keys),
        "max_seqlen_q": f"max{tuple(query)}",
        "max_seqlen_k": f"max{tuple(keys)}",
    }
    lines = []
    for key in ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"):
        got, exp, bad = yours[key], want[key], r["wrong"][key]
        cells = (
            f.matrix([got], expected=[exp], wrong=[bad], w=44, h=30)
            if isinstance(got, list)
            else f.matrix([[got]], expected=[[exp]], wrong=[[bad]], w=44, h=30)
        )
        name = f.label(key, size=LABEL, mono=True, color=INK)
        lines.append(
            row(pad(name, left=100 - name.w), cells, f.label(f"= {derivs[key]}", size=LABEL - 0.5, mono=True), gap=12, align="middle")
        )
    f.place(pad(column(*lines, gap=8), top=6), after=26)
    q_end, k_end = yours["cu_seqlens_q"][-1], yours["cu_seqlens_k"][-1]
    rule = (
        tr(
            "cu_seqlens_k[-1] = {k_end} > cu_seqlens_q[-1] = {q_end}: some sequence has more keys than queries, so "
            "nano-vllm passes block_tables and flash-attn reads all K/V from the paged cache (this step's new K/V "
            "were stored there first).",
            k_end=k_end,
            q_end=q_end,
        )
        if k_end > q_end
        else tr(
            "cu_seqlens_k[-1] = cu_seqlens_q[-1] = {q_end}: no sequence has cached keys, so flash-attn uses the "
            "freshly computed K/V directly.",
            q_end=q_end,
        )
    )
    f.note(tr("With your values: {rule}", rule=rule) if wrong_any else rule, size=LABEL_SMALL)
    f.y += 4
    f.legend(
        [("new", tr("computed this step (query, and its key)")), ("cached", tr("key from the prefix cache: read, not recomputed"))],
        wrong=wrong_any,
    )


# -- ch26.3 -------------------------------------------------------------------------------------------


@figure(
    "ch26-graph-replay",
    title="graph replay 使用预分配缓冲区",
    zh="decode 批大小 5 选用捕获好的 8 行图:前 5 行写入本步的值,其余 3 行是填充(slot = −1 不写缓存,"
    "context_len = 0 不读缓存)。数据值与有效长度每步可变,形状与地址是合约。",
    en="Graph replay uses pre-allocated buffers: a decode batch of 5 replays the graph captured for 8; rows "
    "0–4 carry this step's values, rows 5–7 are padding (slot −1 writes no cache, context_len 0 reads "
    "none). Values and the valid length vary; shapes and addresses are a contract.",
    needs={"chosen": "ch26.3", "padded": "ch26.3"},
)
def graph_replay_figure(f: Figure, r: dict) -> None:
    sizes, batches, chosen, chosen_want = r["sizes"], r["batches"], r["chosen"], r["chosen_expected"]
    wrong_any = any(r["chosen_wrong"])
    bs, graph_bs = len(r["slots"]), r["graph_bs"]

    # Captured sizes.
    f.heading(tr("captured graphs: nano-vllm's [1, 2, 4, 8], then every 16 up to max_bs = 512"))
    shown = [f.matrix([[s]], role="block", w=54, h=30) for s in sizes[:9]] + [
        wide(f.label("…", size=LABEL), 20),
        f.matrix([[sizes[-1]]], role="block", w=54, h=30),
    ]
    f.place(pad(row(*shown, f.label(tr("{n} graphs", n=len(sizes))), gap=8, align="middle"), left=20, top=6), after=30)

    # The student's choice for several batch sizes.
    f.heading(tr("your graph_batch_size(bs, sizes): the smallest captured size ≥ bs (round up, never down)"))
    n = len(batches)
    choice = f.matrix(
        [batches, chosen],
        role=lambda i, _: "block" if i else "token",
        expected=[batches, chosen_want],
        wrong=[[False] * n, r["chosen_wrong"]],
        row_labels=[tr("batch bs"), tr("graph")],
        w=60,
        h=30,
        gap=30,
    )
    f.place(pad(choice, left=40, top=10), after=48)
    for j, (b, c, w) in enumerate(zip(batches, chosen, chosen_want)):
        x, y, cw, ch = choice.cell_box(0, j)
        f.arrow(x + cw / 2, y + ch + 2, x + cw / 2, y + ch + 28, color=stroke("wrong") if r["chosen_wrong"][j] else MUTED, width=1.1)
        if not r["chosen_wrong"][j] and c > b:
            f.text(x + cw / 2, y + 2 * ch + 30 + 14, tr("+{n} pad", n=c - b), size=SMALL, anchor="middle", color=MUTED, cls="label")
        if b == bs:  # the batch whose buffers follow
            f.outline(*choice.span_box(0, j, 1, j), role="accent", inset=-4, width=1.6, dashed=True)

    # The buffers of the bs → graph_bs instance.
    padded, expected, wrong = r["padded"], r["padded_expected"], r["padded_wrong"]
    wrong_any = wrong_any or any(any(map(any, v)) if v and isinstance(v[0], list) else any(v) for v in wrong.values())
    width = len(expected["block_tables"][0]) if expected["block_tables"] else 0
    f.heading(
        tr(
            "the graph's input buffers for a batch of {bs} replayed in the graph of {graph_bs}: your pad_decode_batch",
            bs=bs,
            graph_bs=graph_bs,
        )
    )
    cells: dict[str, Any] = {"h": 30, "gap": 3}

    def buffer(name: str, shape: str, grid: Part) -> Part:
        return column(
            f.label(name, size=LABEL_SMALL, mono=True, color=INK), f.label(f"int32 {shape}", mono=True), grid, gap=2, align="center"
        )

    columns = [
        buffer(
            key,
            f"[{graph_bs}]",
            f.matrix(
                [[v] for v in padded[key]],
                expected=[[e] for e in expected[key]],
                wrong=[[w] for w in wrong[key]],
                w=74,
                **cells,
                role=lambda i, _: "masked" if i >= bs else "token",
            ),
        )
        for key in ("slot_mapping", "context_lens")
    ]
    table = f.matrix(
        padded["block_tables"],
        expected=expected["block_tables"],
        wrong=wrong["block_tables"],
        w=42,
        **cells,
        role=lambda i, j: "masked" if expected["block_tables"][i][j] == -1 else "block",
    )
    header = columns[0].h - 33 * graph_bs + 3
    labels = f.table(
        [[(tr("pad row {i}", i=i) if i >= bs else tr("seq {i}", i=i), {"color": MUTED if i >= bs else INK})] for i in range(graph_bs)],
        h=33,
        size=LABEL_SMALL + 0.5,
    )
    f.place(
        pad(row(pad(labels, top=header - 1.5), *columns, buffer("block_tables", f"[{graph_bs}, {width}]", table), gap=12), left=30, top=6),
        after=20,
    )
    bx = table.cell_box(0, width)[0] + 6
    f.vbracket(
        bx,
        table.cell_box(0, 0)[1],
        table.cell_box(bs, 0)[1] - 3,
        tr("{bs} valid rows: this step's values,\ncopied into the first bs rows\n(they change every step)", bs=bs),
    )
    if graph_bs > bs:
        f.vbracket(
            bx,
            table.cell_box(bs, 0)[1],
            table.cell_box(graph_bs, 0)[1] - 3,
            tr("{n} padding rows: slot −1 writes\nno cache, context_len 0 reads none,\nblock table −1", n=graph_bs - bs),
        )
    owner = [(i, j) for i, row in enumerate(r["tables"]) for j, b in enumerate(row) if b == 0]
    zero = (
        tr(
            " Block 0 is sequence {seq}'s block_table[{j}]: slot 0 holds its token {token}, so padding with 0 would overwrite it.",
            seq=owner[0][0],
            j=owner[0][1],
            token=owner[0][1] * r["block_size"],
        )
        if owner
        else ""
    )
    f.note(
        tr(
            "The graph recorded its kernels for {graph_bs} rows at fixed addresses: each replay copies new values "
            "into the same buffers, runs all {graph_bs} rows, and keeps outputs[:{bs}].",
            graph_bs=graph_bs,
            bs=bs,
        )
        + zero,
        size=LABEL_SMALL,
    )
    f.y += 4
    f.legend(
        [
            ("token", tr("a sequence's value this step")),
            ("block", tr("a physical block id")),
            ("masked", tr("padding (−1 slot / 0 length / −1 block)")),
            ("accent", tr("dashed: the batch of {bs} whose buffers are shown", bs=bs)),
        ],
        wrong=wrong_any,
    )


# -- ch26.4 -------------------------------------------------------------------------------------------

STATIC_COLUMNS = (("input_ids", "ids"), ("positions", "pos"), ("slot_mapping", "slot"), ("context_lens", "len"))


@figure(
    "ch26-static-buffers",
    title="原地写入预分配的缓冲区",
    zh="CUDA graph 在捕获时的地址上重放:每一步把本步的值原地写进同一组缓冲区。上一步是 7 条序列,"
    "这一步只有 5 条:第 5、6 行还留着上一步真实的 slot 和长度,必须先重置为 −1 和 0;"
    "其余旧值(ids、pos、块表的其余格)不会被用到,可以不动。",
    en="A CUDA graph replays on the addresses it was captured with: each step writes its values in place into "
    "the same buffers. The previous step ran 7 sequences, this one 5: rows 5 and 6 still hold that step's "
    "real slots and lengths and must be reset to −1 and 0 first; the other old values (ids, positions, the "
    "rest of the block table) do no harm and may stay.",
    needs={"yours": "ch26.4"},
)
def static_buffers_figure(f: Figure, r: dict) -> None:
    bs, max_bs = r["bs"], r["max_bs"]
    before, yours, want, free, wrong, swapped = (r[k] for k in ("before", "yours", "expected", "free", "wrong", "replaced"))
    blocks = len(want["block_tables"][0])
    previous = sum(1 for s in before["slot_mapping"] if s >= 0)
    wrong_any = any(swapped.values()) or any(any(map(any, v)) if v and isinstance(v[0], list) else any(v) for v in wrong.values())
    f.instance_row(
        [
            (tr("buffers: {rows} rows, {blocks} blocks", rows=max_bs, blocks=blocks), "plain", 190),
            (tr("previous step: {n} sequences", n=previous), "accent", 200),
            (tr("this step: bs = {bs}", bs=bs), "token", 150),
        ],
        note="block_size 4",
    )
    cells: dict[str, Any] = {"w": 36, "h": 28, "gap": 2}
    labels = [tr("row {i}", i=i) for i in range(max_bs)]

    def panel(values: dict, role: Callable[[str, int, int], str], *, marks: bool, row_labels: bool) -> tuple[Part, dict]:
        grids = {}

        def column_of(key: str, short: str) -> Grid:
            return f.matrix(
                [[v] for v in values[key]],
                col_labels=[short],
                **cells,
                role=lambda i, j: role(key, i, j),
                expected=[[v] for v in want[key]] if marks else None,
                wrong=[[w] for w in wrong[key]] if marks else None,
                dashed=lambda i, j: marks and bool(free[key][i]),
                row_labels=labels if row_labels and key == "input_ids" else None,
            )

        for key, short in STATIC_COLUMNS:
            grids[key] = column_of(key, short)
        grids["block_tables"] = f.matrix(
            values["block_tables"],
            col_labels=[f"bt {j}" for j in range(blocks)],
            **cells,
            role=lambda i, j: role("block_tables", i, j),
            expected=want["block_tables"] if marks else None,
            wrong=wrong["block_tables"] if marks else None,
            dashed=lambda i, j: marks and bool(free["block_tables"][i][j]),
        )
        return row(*grids.values(), gap=7), grids

    def before_role(key: str, i: int, j: int) -> str:
        if key in ("slot_mapping", "context_lens") and i >= bs and before["slot_mapping"][i] >= 0:
            return "accent"  # a real slot / length of the previous step, in a row that is padding now
        return "plain"

    def after_role(key: str, i: int, j: int) -> str:
        if free[key][i] if key != "block_tables" else free[key][i][j]:
            return "plain"  # an old value a replay never uses
        if key in ("slot_mapping", "context_lens") and i >= bs:
            return "masked"
        if key == "block_tables":
            return "masked" if want[key][i][j] == -1 else "block"
        return "token"

    left, _ = panel(before, before_role, marks=False, row_labels=True)
    right, grids = panel(yours, after_role, marks=True, row_labels=False)
    heading = lambda s: f.label(s, size=LABEL, color=INK, bold=True, cls="heading")  # noqa: E731
    f.place(
        row(
            column(heading(tr("before: what the previous step left")), left, gap=8),
            column(heading(tr("after: your fill_static_buffers")), right, gap=8),
            gap=44,
        ),
        after=16,
    )
    # Row brackets beside the buffers written this step.
    table = grids["block_tables"]
    bx = table.cell_box(0, blocks)[0] + 6
    f.vbracket(bx, table.cell_box(0, 0)[1], table.cell_box(bs, 0)[1] - 2, tr("bs = {bs}:\nthis step's\nvalues", bs=bs))
    if max_bs > bs:
        f.vbracket(bx, table.cell_box(bs, 0)[1], table.cell_box(max_bs, 0)[1] - 2, tr("padding:\nslot −1,\nlen 0"))
    # A buffer put in place of the captured one: the graph never reads it.
    for key, grid in grids.items():
        if swapped[key]:
            x, y, w, h = grid.span_box(0, 0, max_bs - 1, grid.cols - 1)
            f.outline(x, y, w, h, role="wrong", inset=-3, width=2.4)
            f.text(x + w / 2, y + h + 16, "✗", size=SMALL + 2, anchor="middle", color=stroke("wrong"), cls="mark")
    if any(swapped.values()):
        f.y += 14
        f.note(
            tr(
                "✗ {keys}: yours is a new tensor in place of the captured buffer (other strides, or other memory around "
                "it); the graph would replay on the old buffer.",
                keys=", ".join(k for k in swapped if swapped[k]),
            ),
            color=stroke("wrong"),
            size=LABEL_SMALL,
        )
    f.note(
        tr(
            "ids = input_ids, pos = positions, slot = slot_mapping, len = context_lens, bt j = block_tables[:, j]. "
            "The graph of any captured size ≥ {bs} reads these tensors at the addresses it was captured with, so "
            "every value is copied in place; a new tensor, however right, would never be read.",
            bs=bs,
        ),
        size=LABEL_SMALL,
    )
    f.legend(
        [
            ("token", tr("this step's value")),
            ("block", tr("a block id")),
            ("masked", tr("padding: −1 slot / 0 length / −1 block")),
            ("accent", tr("a real slot or length left in a row now padding")),
            ("plain", tr("old value a replay never uses (dashed: may stay)")),
        ],
        wrong=wrong_any,
    )
