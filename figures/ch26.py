"""Figures of ch26 · flattened batches and graph replay: packing a padded batch, the boundaries of a
flattened prefill with a prefix hit, and a decode batch padded into a captured graph's buffers."""

from __future__ import annotations

from figures import figure
from figures.kit import Figure, text_width
from figures.style import INK, LABEL, MARGIN, MUTED, SMALL, VALUE, stroke

REQUEST_ROLES = ("token", "accent")


def _vbracket(f: Figure, x: float, y1: float, y2: float, lines: list[str], *, color: str = MUTED,
              size: float = SMALL + 1) -> None:
    """A bracket on the right of rows y1..y2 with lines of text to its right (the kit's brackets are horizontal)."""
    f.dwg.add(f.dwg.polyline([(x, y1 + 2), (x + 6, y1 + 2), (x + 6, y2 - 2), (x, y2 - 2)], fill="none",
                             stroke=color, stroke_width=1.3, class_="bracket"))
    mid = (y1 + y2) / 2 - (len(lines) - 1) * (size + 3) / 2
    for k, line in enumerate(lines):
        f.text(x + 14, mid + k * (size + 3) + size * 0.36, line, size=size, color=color, cls="label")


def _tick(f: Figure, x: float, y1: float, y2: float, *, color: str, width: float = 2.2) -> None:
    f.dwg.add(f.dwg.line((x, y1), (x, y2), stroke=color, stroke_width=width, class_="boundary"))


# -- ch26.1 -------------------------------------------------------------------------------------------

@figure("ch26-dim-varlen-pack", title="padded → packed + cu_seqlens",
        zh="长度为 3 和 2 的两条请求从 padded [2, 3, 4] 收集到 packed [5, 4],逐行标出来源;"
           "用 cu_seqlens = [0, 3, 5] 恢复请求边界。",
        en="Two requests of lengths 3 and 2 gathered from padded [2, 3, 4] into packed [5, 4], each row labelled "
           "with its source; the request boundaries are recovered from cu_seqlens = [0, 3, 5].",
        needs={"packed": "ch26.1"})
def varlen_pack_figure(f: Figure, r: dict) -> None:
    padded, lengths, packed, expected = r["padded"], r["lengths"], r["packed"], r["expected"]
    cu, cu_want = r["cu_seqlens"], r["expected_cu"]
    B, T, H = len(padded), len(padded[0]), len(padded[0][0])
    N = len(packed)
    wrong_any = packed != expected or cu != cu_want
    f.instance_row([(f"B = {B}", "plain", 70), (f"T_max = {T}", "plain", 90), (f"H = {H}", "plain", 64),
               (f"lengths = {lengths}", "token", 150)])
    f.text(MARGIN + 424, f.y - 44, "value = 100·(request + 1) + 10·token + channel", size=SMALL + 1, color=MUTED,
           cls="note")

    cw, ch = 44, 28
    lx = MARGIN + 70
    rx = MARGIN + 480
    arrow_end = rx - 14 - text_width("row 0 ← req 0 · t0", SMALL + 1)
    f.text(MARGIN, f.y, f"padded [{B}, {T}, {H}]", size=LABEL + 1, weight="bold", cls="heading")
    f.text(rx - 100, f.y, f"your packed [{N}, {H}]", size=LABEL + 1, weight="bold", cls="heading")
    top = f.y + 14
    # Left: the padded batch, one block per request, padding rows grey.
    row_y = {}
    y = top
    for b in range(B):
        f.text(lx - 8, y + 11, f"request {b}", size=SMALL + 1, anchor="end", color=INK, cls="label")
        y += 16
        for t in range(T):
            real = t < lengths[b]
            f.text(lx - 8, y + ch / 2 + 4, f"t{t}" if real else f"t{t} pad", size=SMALL + 1, anchor="end",
                   color=INK if real else MUTED, cls="label")
            for h in range(H):
                f.cell(lx + h * cw, y, padded[b][t][h], role=REQUEST_ROLES[b % 2] if real else "masked",
                       w=cw - 3, h=ch - 3, size=VALUE - 1.5)
            row_y[b, t] = y + (ch - 3) / 2
            y += ch
        y += 14
    left_bottom = y
    # Right: the student's packed rows, each labelled with the padded row it equals.
    sources = {tuple(padded[b][t]): (b, t) for b in range(B) for t in range(lengths[b])}
    ptop = top + 16
    for i in range(N):
        yy = ptop + i * ch
        src = sources.get(tuple(packed[i]))
        label = f"row {i} ← req {src[0]} · t{src[1]}" if src else f"row {i} ← ?"
        f.text(rx - 8, yy + ch / 2 + 4, label, size=SMALL + 1, anchor="end", color=INK if src else stroke("wrong"),
               cls="label")
        want_src = sources.get(tuple(expected[i]))
        for h in range(H):
            bad = packed[i][h] != expected[i][h]
            f.cell(rx + h * cw, yy, packed[i][h], role=REQUEST_ROLES[want_src[0] % 2] if want_src else "plain",
                   w=cw - 3, h=ch - 3, wrong=bad, expected=expected[i][h] if bad else None, size=VALUE - 1.5)
    # Arrows: where each real padded row belongs (cu_seqlens_expected[b] + t).
    for b in range(B):
        for t in range(lengths[b]):
            i = cu_want[b] + t
            ok = packed[i] == expected[i]
            f.arrow(lx + H * cw + 2, row_y[b, t], arrow_end, ptop + i * ch + (ch - 3) / 2,
                    color=MUTED if ok else stroke("wrong"), width=1.0, head=5)
    # Boundaries from the student's cu_seqlens, as brackets beside the packed rows.
    bx = rx + H * cw + 6
    for b in range(min(B, len(cu) - 1)):
        a, e = max(0, min(cu[b], N)), max(0, min(cu[b + 1], N))
        if e > a:
            ok = cu[b] == cu_want[b] and cu[b + 1] == cu_want[b + 1]
            _vbracket(f, bx, ptop + a * ch, ptop + e * ch - 3,
                      [f"request {b}: rows", f"cu[{b}] … cu[{b + 1}] − 1", f"= {cu[b]} … {cu[b + 1] - 1}"],
                      color=MUTED if ok else stroke("wrong"))
    # The student's cu_seqlens as cells.
    cy = ptop + N * ch + 22
    f.text(rx - 8, cy + 19, "your cu_seqlens", size=LABEL, anchor="end", cls="label")
    f.grid(rx, cy, [cu], expected=[cu_want], role="plain", w=44, h=28, col_labels=[f"[{j}]" for j in range(len(cu))])
    f.text(rx + len(cu) * 44 + 12, cy + 28, "int32 [B + 1]: 0, then the", size=SMALL + 1, color=MUTED, cls="note")
    f.text(rx + len(cu) * 44 + 12, cy + 42, f"running sums of {lengths}", size=SMALL + 1, color=MUTED, cls="note")
    f.y = max(left_bottom, cy + 46) + 24

    unpacked = r.get("unpacked")
    if unpacked is not None:
        want_u = r["unpacked_expected"]
        wrong_any = wrong_any or unpacked != want_u
        f.heading(f"your unpack_varlen(packed, cu_seqlens, T_max={T}) · back to [{B}, {T}, {H}], padding = 0")
        top = f.y + 18
        for b in range(B):
            x0 = MARGIN + 70 + b * (H * cw + 110)
            f.text(x0 + H * cw / 2, top - 6, f"request {b} (rows {cu_want[b]} … {cu_want[b + 1] - 1} of packed)",
                   size=SMALL + 1, anchor="middle", color=INK, cls="label")
            for t in range(T):
                real = t < cu_want[b + 1] - cu_want[b]
                if b == 0:
                    f.text(x0 - 8, top + t * ch + ch / 2 + 4, f"t{t}", size=SMALL + 1, anchor="end", color=MUTED,
                           cls="label")
                for h in range(H):
                    bad = unpacked[b][t][h] != want_u[b][t][h]
                    f.cell(x0 + h * cw, top + t * ch, unpacked[b][t][h], role=REQUEST_ROLES[b % 2] if real else "masked",
                           w=cw - 3, h=ch - 3, wrong=bad, expected=want_u[b][t][h] if bad else None, size=VALUE - 1.5)
        f.y = top + T * ch + 20
    f.legend([("token", "request 0's tokens"), ("accent", "request 1's tokens"),
              ("masked", "padding position (dropped when packing, 0 when unpacking)")], wrong=wrong_any)


# -- ch26.2 -------------------------------------------------------------------------------------------

@figure("ch26-flatten", title="压平但不抹掉边界",
        zh="两条序列压平成一个 batch,边界仍记在 cu_seqlens 里。A 没有缓存;B 命中 8 个 token 的前缀,"
           "只计算 3 个新 token:它的 query 长度是 3,key 长度是 8 + 3 = 11。",
        en="Two sequences flattened without losing their boundaries, which cu_seqlens keeps. A has nothing cached; "
           "B hits an 8-token prefix and computes only 3 new tokens: its query length is 3, its key length "
           "8 + 3 = 11 (nano-vllm's 300 / 512 + 88 example, scaled down).",
        needs={"yours": "ch26.2"})
def flatten_figure(f: Figure, r: dict) -> None:
    query, cached, yours, want = r["query"], r["cached"], r["yours"], r["expected"]
    names = [chr(ord("A") + b) for b in range(len(query))]
    keys = [c + q for c, q in zip(cached, query)]
    wrong_any = yours != want
    f.instance_row([(f"{n}: {c} cached + {q} new" if c else f"{n}: {q} new, nothing cached",
                "cached" if c else "new", 230) for n, q, c in zip(names, query, cached)])

    cw, ch = 42, 32
    x0 = MARGIN + 130
    # The flattened queries and keys, one cell per token, labelled sequence + position.
    rows = []
    q_cells = [(n, c + i, "new") for n, q, c in zip(names, query, cached) for i in range(q)]
    k_cells = [(n, i, "cached" if i < c else "new") for n, q, c in zip(names, query, cached) for i in range(c + q)]
    f.heading("flattened batch · one row of queries and one of keys, each sequence after the other")
    qy = f.y + 30
    ky = qy + ch + 96
    for (label, cells, y) in (("queries q", q_cells, qy), ("keys k", k_cells, ky)):
        f.text(x0 - 12, y + ch / 2 + 4, label, size=LABEL, anchor="end", cls="label")
        for j, (n, p, role) in enumerate(cells):
            f.cell(x0 + j * cw, y, f"{n}{p}", role=role, w=cw - 3, h=ch, fmt=str, size=VALUE - 2)
        rows.append((cells, y))
    # Bands from each sequence's queries to the keys it attends.
    q_start, k_start = 0, 0
    for b, n in enumerate(names):
        qa, qb = x0 + q_start * cw, x0 + (q_start + query[b]) * cw - 3
        ka, kb = x0 + k_start * cw, x0 + (k_start + keys[b]) * cw - 3
        band = f.dwg.polygon([(qa, qy + ch + 4), (qb, qy + ch + 4), (kb, ky - 4), (ka, ky - 4)],
                             fill="#e3f2fb" if b % 2 == 0 else "#ece4f4", fill_opacity=0.55, stroke=MUTED,
                             stroke_width=0.8, class_="band")
        f.dwg.add(band)
        f.text((qa + qb + ka + kb) / 4, (qy + ky + ch) / 2 + 4,
               f"{n}: {query[b]} queries → {keys[b]} keys", size=SMALL + 1.5, anchor="middle", color=INK, cls="label")
        q_start += query[b]
        k_start += keys[b]
    # The student's boundaries, as ticks with their values.
    for key, y, above in (("cu_seqlens_q", qy, True), ("cu_seqlens_k", ky, False)):
        got, exp = yours[key], want[key]
        for j, v in enumerate(got):
            ok = j < len(exp) and v == exp[j]
            vx = x0 + max(0, min(v, len(rows[0 if above else 1][0]))) * cw - 1.5
            color = INK if ok else stroke("wrong")
            _tick(f, vx, y - 6, y + ch + 6, color=color)
            ty = y - 10 if above else y + ch + 18
            f.text(vx, ty, f"cu_{key[-1]}[{j}]={v}", size=SMALL, anchor="middle", mono=True, color=color,
                   cls="value" if ok else "value wrong")
    f.y = ky + ch + 56

    # The values, with their derivations.
    f.heading("your varlen_metadata · what flash_attn_varlen_func receives")
    top = f.y + 6
    derivs = {"cu_seqlens_q": "0, then running sums of the query lengths " + str(query),
              "cu_seqlens_k": f"0, then running sums of cached + query = {keys}",
              "max_seqlen_q": f"max{tuple(query)}", "max_seqlen_k": f"max{tuple(keys)}"}
    for i, key in enumerate(("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")):
        y = top + i * (30 + 8)
        f.text(MARGIN + 112, y + 20, key, size=LABEL, anchor="end", mono=True, cls="label")
        got, exp = yours[key], want[key]
        if isinstance(got, list):
            f.grid(MARGIN + 122, y, [got], expected=[exp], role="plain", w=44, h=30)
            dx = MARGIN + 122 + len(got) * 44 + 14
        else:
            bad = got != exp
            f.cell(MARGIN + 122, y, got, role="plain", w=44, h=30, wrong=bad, expected=exp if bad else None)
            dx = MARGIN + 122 + 58
        f.text(dx, y + 20, f"= {derivs[key]}", size=LABEL - 0.5, mono=True, color=MUTED, cls="label")
    f.y = top + 4 * 38 + 12
    q_end, k_end = yours["cu_seqlens_q"][-1], yours["cu_seqlens_k"][-1]
    rule = (f"cu_seqlens_k[-1] = {k_end} > cu_seqlens_q[-1] = {q_end}: some sequence has more keys than queries, so "
            f"nano-vllm passes block_tables and flash-attn reads all K/V from the paged cache (this step's new K/V "
            f"were stored there first)." if k_end > q_end else
            f"cu_seqlens_k[-1] = cu_seqlens_q[-1] = {q_end}: no sequence has cached keys, so flash-attn uses the "
            f"freshly computed K/V directly.")
    f.note(("With your values: " if wrong_any else "") + rule, size=SMALL + 1)
    f.y += 4
    f.legend([("new", "computed this step (query, and its key)"),
              ("cached", "key from the prefix cache: read, not recomputed")], wrong=wrong_any)


# -- ch26.3 -------------------------------------------------------------------------------------------

@figure("ch26-graph-replay", title="graph replay 使用预分配缓冲区",
        zh="decode 批大小 5 选用捕获好的 8 行图:前 5 行写入本步的值,其余 3 行是填充(slot = −1 不写缓存,"
           "context_len = 0 不读缓存)。数据值与有效长度每步可变,形状与地址是合约。",
        en="Graph replay uses pre-allocated buffers: a decode batch of 5 replays the graph captured for 8; rows "
           "0–4 carry this step's values, rows 5–7 are padding (slot −1 writes no cache, context_len 0 reads "
           "none). Values and the valid length vary; shapes and addresses are a contract.",
        needs={"chosen": "ch26.3", "padded": "ch26.3"})
def graph_replay_figure(f: Figure, r: dict) -> None:
    sizes, batches, chosen, chosen_want = r["sizes"], r["batches"], r["chosen"], r["chosen_expected"]
    wrong_any = chosen != chosen_want
    bs, graph_bs = len(r["slots"]), r["graph_bs"]

    # Captured sizes.
    f.heading("captured graphs · nano-vllm: [1, 2, 4, 8], then every 16 up to max_bs = 512")
    shown = sizes[:9] + ["…"] + sizes[-1:]
    y = f.y + 6
    xs = {}
    for i, s in enumerate(shown):
        x = MARGIN + 20 + i * 62
        if s == "…":
            f.text(x + 26, y + 20, "…", size=LABEL, anchor="middle", color=MUTED, cls="label")
            continue
        f.cell(x, y, s, role="block", w=54, h=30)
        xs[s] = x + 27
    f.text(MARGIN + 20 + len(shown) * 62 + 4, y + 20, f"{len(sizes)} graphs", size=SMALL + 1, color=MUTED, cls="note")
    f.y = y + 30 + 30

    # The student's choice for several batch sizes.
    f.heading("your graph_batch_size(bs, sizes) · the smallest captured size ≥ bs (round up, never down)")
    top = f.y + 20
    f.text(MARGIN + 96, top + 19, "batch bs", size=LABEL - 0.5, anchor="end", cls="label")
    f.text(MARGIN + 96, top + 30 + 40 + 19, "graph", size=LABEL - 0.5, anchor="end", cls="label")
    for j, (b, c, w) in enumerate(zip(batches, chosen, chosen_want)):
        x = MARGIN + 110 + j * 90
        f.cell(x, top, b, role="token", w=60, h=30, bold=b == bs)
        f.arrow(x + 30, top + 32, x + 30, top + 30 + 38, color=MUTED if c == w else stroke("wrong"), width=1.1)
        f.cell(x, top + 70, c, role="block", w=60, h=30, wrong=c != w, expected=w if c != w else None, bold=b == bs)
        if c == w and c > b:
            f.text(x + 30, top + 116, f"+{c - b} pad", size=SMALL, anchor="middle", color=MUTED, cls="label")
    f.y = top + 70 + 30 + 40

    # The buffers of the bs → graph_bs instance.
    padded, expected = r["padded"], r["padded_expected"]
    wrong_any = wrong_any or padded != expected
    width = len(expected["block_tables"][0]) if expected["block_tables"] else 0
    f.heading(f"the graph's input buffers for a batch of {bs} replayed in the graph of {graph_bs} · "
              f"your pad_decode_batch")
    top = f.y + 34
    ch, label_w = 30, 110
    cols = [("slot_mapping", 80, f"[{graph_bs}]"), ("context_lens", 80, f"[{graph_bs}]")]
    x = MARGIN + label_w
    col_x = {}
    for name, w, shape in cols:
        col_x[name] = x
        f.text(x + (w - 6) / 2, top - 22, name, size=SMALL + 1, anchor="middle", mono=True, cls="label")
        f.text(x + (w - 6) / 2, top - 8, f"int32 {shape}", size=SMALL, anchor="middle", color=MUTED, mono=True,
               cls="label")
        x += w + 10
    tx = x + 10
    f.text(tx + width * 46 / 2, top - 22, "block_tables", size=SMALL + 1, anchor="middle", mono=True, cls="label")
    f.text(tx + width * 46 / 2, top - 8, f"int32 [{graph_bs}, {width}]", size=SMALL, anchor="middle", color=MUTED,
           mono=True, cls="label")
    for i in range(graph_bs):
        y = top + i * (ch + 3)
        pad = i >= bs
        f.text(MARGIN + label_w - 12, y + ch / 2 + 4, f"pad row {i}" if pad else f"seq {i}", size=SMALL + 1.5,
               anchor="end", color=MUTED if pad else INK, cls="label")
        role = "masked" if pad else "token"
        for name, w, _ in cols:
            v, e = padded[name][i], expected[name][i]
            f.cell(col_x[name], y, v, role=role, w=w - 6, h=ch, wrong=v != e, expected=e if v != e else None)
        for j in range(width):
            v, e = padded["block_tables"][i][j], expected["block_tables"][i][j]
            f.cell(tx + j * 46, y, v, role="masked" if e == -1 else "block", w=42, h=ch, wrong=v != e,
                   expected=e if v != e else None)
    bx = tx + width * 46 + 8
    _vbracket(f, bx, top, top + bs * (ch + 3) - 3,
              [f"{bs} valid rows: this step's values,", "copied into the first bs rows", "(they change every step)"])
    if graph_bs > bs:
        _vbracket(f, bx, top + bs * (ch + 3), top + graph_bs * (ch + 3) - 3,
                  [f"{graph_bs - bs} padding rows: slot −1 writes", "no cache, context_len 0 reads none,",
                   "block table −1"])
    f.y = top + graph_bs * (ch + 3) + 20
    owner = [(i, j) for i, row in enumerate(r["tables"]) for j, b in enumerate(row) if b == 0]
    zero = (f" Block 0 is sequence {owner[0][0]}'s block_table[{owner[0][1]}]: slot 0 holds its token "
            f"{owner[0][1] * r['block_size']}, so padding with 0 would overwrite it." if owner else "")
    f.note(f"The graph recorded its kernels for {graph_bs} rows at fixed addresses: each replay copies new values "
           f"into the same buffers, runs all {graph_bs} rows, and keeps outputs[:{bs}].{zero}", size=SMALL + 1)
    f.y += 4
    f.legend([("token", "a sequence's value this step"), ("block", "a physical block id"),
              ("masked", "padding (−1 slot / 0 length / −1 block)")], wrong=wrong_any)
