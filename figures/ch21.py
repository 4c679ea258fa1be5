"""Figures of ch21 · the KV cache and the decode step: per-layer caches growing along the token axis,
and what one decode step feeds the model and where it writes."""

from __future__ import annotations

from figures import figure
from figures.kit import Figure, num, text_width
from figures.style import CELL, INK, LABEL, MARGIN, MUTED, SMALL, VALUE, stroke


def _pair(v: list) -> str:
    return ", ".join(num(x) for x in v)


def _is_empty(v: list) -> bool:
    return not any(v)


def _outline(f: Figure, x: float, y: float, w: float, h: float, *, color: str, width: float = 2.2,
             dashed: bool = False) -> None:
    rect = f.dwg.rect((x, y), (w, h), fill="none", stroke=color, stroke_width=width, class_="outline")
    if dashed:
        rect["stroke-dasharray"] = "4,3"
    f.dwg.add(rect)


# -- ch21.1 -------------------------------------------------------------------------------------------

@figure("ch21-cache-growth", title="缓存沿 token 轴增长",
        zh="每一层都有自己的一对 K/V 缓存:prefill 一次写入 3 行,之后每个 decode 步在已有长度之后追加 1 行;"
           "有效前缀沿 token 轴变长,各层互不共享。",
        en="The cache grows along the token axis, per layer: a prefill writes 3 rows at once, then every "
           "decode step appends one row after the current length. Each layer has its own K/V cache; "
           "no layer shares another's.",
        needs={"caches": "ch21.1"})
def cache_growth_figure(f: Figure, r: dict) -> None:
    l_max, steps, caches, expected, lengths = r["l_max"], r["steps"], r["caches"], r["expected"], r["lengths"]
    layers = len(caches)
    wrong_any = caches != expected

    y = f.y
    f.box(MARGIN, y, 104, 30, role="plain", label=f"{layers} layers")
    f.box(MARGIN + 116, y, 110, 30, role="plain", label=f"L_max = {l_max}")
    f.box(MARGIN + 238, y, 196, 30, role="plain", label="1 kv head, head_dim 2")
    f.text(MARGIN + 450, y + 13, "K of layer ℓ, token t = [100ℓ + 10(t+1) + 1, … + 2]", size=SMALL + 1,
           color=MUTED, cls="note")
    f.text(MARGIN + 450, y + 28, "V = −K; every cache starts as zeros", size=SMALL + 1, color=MUTED, cls="note")
    f.y = y + 30 + 34

    label_w, cw, ch = 118, 94, 28
    left = MARGIN + label_w
    length = 0
    for s, n in enumerate(steps):
        kind = "prefill" if s == 0 else f"decode step {s}"
        f.heading(f"{'①②③④⑤'[s] if s < 5 else s + 1} {kind}: append_kv(…, length={length}, n={n} new tokens)")
        top = f.y + 16
        for j in range(l_max):
            f.text(left + j * cw + (cw - 6) / 2, top - 5, f"row {j}", size=SMALL + 1, anchor="middle",
                   color=MUTED, mono=True, cls="label")
        if s == 0:
            f.arrow(left + l_max * cw + 2, top - 9, left + l_max * cw + 40, top - 9, width=1.1)
            f.text(left + l_max * cw + 2, top - 16, "token axis", size=SMALL, color=MUTED, cls="label")
        row_y = top
        for layer in range(layers):
            group_top = row_y
            for kv, name, role in ((0, "K", "k"), (1, "V", "v")):
                f.text(left - 10, row_y + ch / 2 + 4, f"layer {layer} · {name}", size=LABEL - 1, anchor="end",
                       color=INK, cls="label")
                got_rows, want_rows = caches[layer][s][kv], expected[layer][s][kv]
                for j in range(l_max):
                    got, want = got_rows[j], want_rows[j]
                    x = left + j * cw
                    if got != want:
                        f.cell(x, row_y, _pair(got), w=cw - 6, h=ch, wrong=True,
                               expected="·" if _is_empty(want) else _pair(want), fmt=str, size=VALUE - 1)
                        continue
                    if j < length:
                        cell_role = "cached"
                    elif j < length + n:
                        cell_role = role
                    else:
                        cell_role = "masked"
                    empty = cell_role == "masked" and _is_empty(got)
                    f.cell(x, row_y, "" if empty else _pair(got), role=cell_role, w=cw - 6, h=ch, fmt=str,
                           size=VALUE - 1, dashed=cell_role == "masked", bold=cell_role == role)
                row_y += ch + 3
            # The length this layer's append_kv returned, to the right of its two rows.
            ret = lengths[layer][s]
            want_len = length + n
            rx = left + l_max * cw + 4
            ok = ret == want_len
            f.text(rx, group_top + ch / 2 + 5, f"→ {ret if ret is not None else '?'}", size=LABEL, mono=True,
                   weight="bold", color=INK if ok else stroke("wrong"), cls="value" if ok else "value wrong")
            f.text(rx, group_top + ch + 3 + ch / 2 + 4, "returned" if ok else f"expected {want_len}", size=SMALL,
                   color=MUTED if ok else INK, cls="label" if ok else "expected")
            row_y += 8
        # The valid prefix after this step, as a bracket under the rows.
        end = length + n
        if end:
            f.bracket(left, left + end * cw - 6, row_y - 4,
                      f"valid prefix: rows 0 … {end - 1} (length {end})" + (" — grew by 1 row" if s else ""))
        f.y = row_y + 42
        length = end

    f.note("Rows 0 … length − 1 are the sequence's tokens in order; each append writes rows length … "
           "length + n − 1 and nothing else. The two layers never share rows: layer 1's cache holds layer 1's "
           "K/V (values 1xx), computed from layer 0's output.", size=SMALL + 1)
    f.y += 4
    f.legend([("cached", "written by an earlier step"), ("k", "K appended by this step"),
              ("v", "V appended by this step"), ("masked", "free row, beyond the length")], wrong=wrong_any)


# -- ch21.2 -------------------------------------------------------------------------------------------

@figure("ch21-decode-step", title="一个 decode step 的真实工作",
        zh="最新采样的 token 已经在 token_ids 里,但还没有自己的 KV:decode 步以它为输入,position = len − 1,"
           "先把它的 K/V 写进 slot,再让 attention 读取全部 context_len = len 个条目。",
        en="What one decode step does: the newest sampled token is already in token_ids but has no KV yet. "
           "The step feeds it at position len − 1, writes its K/V into its slot first, then attention reads "
           "all context_len = len entries.",
        needs={"yours": "ch21.2"})
def decode_step_figure(f: Figure, r: dict) -> None:
    ids, table, bs, yours, want = r["token_ids"], r["table"], r["block_size"], r["yours"], r["expected"]
    n = len(ids)
    pos = n - 1
    wrong_any = yours != want

    # The instance.
    y = f.y
    f.box(MARGIN, y, 96, 30, role="token", label=f"len = {n}")
    f.box(MARGIN + 108, y, 130, 30, role="plain", label=f"block_size = {bs}")
    x = MARGIN + 262
    f.text(x, y + 20, "block_table", size=LABEL, cls="label")
    x += text_width("block_table", LABEL) + 12
    for i, b in enumerate(table):
        f.text(x + i * 40 + 18, y - 3, f"[{i}]", anchor="middle", size=SMALL, color=MUTED, mono=True, cls="label")
        f.cell(x + i * 40, y, b, role="block", w=36, h=30)
    f.text(x + len(table) * 40 + 8, y + 20, "nano-vllm's [7, 2] example, with blocks of 4 instead of 256",
           size=SMALL + 1, color=MUTED, cls="note")
    f.y = y + 30 + 34

    # token_ids: cached prefix and the newest token.
    f.heading("token_ids · the sequence as the scheduler holds it after the previous step")
    cw, ch = 64, CELL
    tx = MARGIN + 110
    top = f.y + 16
    f.text(tx - 10, top + ch / 2 + 4, "token id", size=SMALL + 1, anchor="end", color=MUTED, cls="label")
    for j, t in enumerate(ids):
        f.text(tx + j * cw + (cw - 6) / 2, top - 5, f"pos {j}", size=SMALL + 1, anchor="middle", color=MUTED,
               mono=True, cls="label")
        f.cell(tx + j * cw, top, t, role="cached" if j < pos else "new", w=cw - 6, h=ch, bold=j == pos)
    _outline(f, tx + pos * cw - 2, top - 2, cw - 2, ch + 4, color=stroke("accent"))
    if pos:
        f.bracket(tx, tx + pos * cw - 6, top + ch + 4, f"{pos} tokens with K/V in the cache (num_cached = len − 1)")
    f.text(tx + pos * cw + cw / 2 + 2, top + ch + 22, "sampled last step:", size=SMALL + 1, anchor="middle",
           color=stroke("accent"), cls="label")
    f.text(tx + pos * cw + cw / 2 + 2, top + ch + 36, "no K/V yet", size=SMALL + 1, anchor="middle",
           color=stroke("accent"), cls="label")
    f.y = top + ch + 62

    # The four inputs, derived.
    f.heading("your decode_inputs · what this step feeds the model")
    lb, off = divmod(pos, bs)
    phys = table[lb] if lb < len(table) else "?"
    rows = [("input_id", "= token_ids[-1]  (the newest token)"),
            ("position", f"= len − 1 = {n} − 1  (positions count from 0)"),
            ("context_len", f"= len = {n}  (the cache entries attention reads, the new one included)"),
            ("slot", f"= block_table[{pos} // {bs} = {lb}] · {bs} + {pos} % {bs} = {phys} · {bs} + {off}")]
    top = f.y + 6
    for i, (key, rule) in enumerate(rows):
        yy = top + i * (ch + 6)
        f.text(MARGIN + 96, yy + ch / 2 + 4, key, size=LABEL, anchor="end", mono=True, cls="label")
        bad = yours[key] != want[key]
        f.cell(MARGIN + 106, yy, yours[key], role="plain", w=70, h=ch, wrong=bad,
               expected=want[key] if bad else None, bold=True)
        f.text(MARGIN + 190, yy + ch / 2 + 4, rule, size=LABEL - 0.5, mono=True, color=MUTED, cls="label")
    f.y = top + 4 * (ch + 6) + 16

    # The sequence's blocks in the pool, the new token's slot, and what attention reads.
    scw, gap = 70, 40
    width = len(table) * bs * scw + (len(table) - 1) * gap
    px = MARGIN + (f.width - 2 * MARGIN - width) / 2
    py = f.y + 40
    centers = {}
    for i, b in enumerate(table):
        bx = px + i * (bs * scw + gap)
        f.text(bx + bs * scw / 2, py + ch + 40, f"block {b} = block_table[{i}]", size=SMALL + 1.5, anchor="middle",
               color=INK, cls="label")
        for o in range(bs):
            p, s = i * bs + o, b * bs + o
            x = bx + o * scw
            centers[s] = x + (scw - 4) / 2
            role = "cached" if p < pos else ("new" if p == pos else "masked")
            label = f"pos {p}" if p <= pos else ""
            f.cell(x, py, label, role=role, w=scw - 4, h=ch, fmt=str, dashed=role == "masked",
                   bold=p == pos, size=VALUE - 1)
            f.text(x + (scw - 4) / 2, py - 6, f"slot {s}", size=SMALL, anchor="middle", color=MUTED, mono=True,
                   cls="label")
    slot = yours["slot"]
    # ① The arrow from your slot to the cell it names; the right cell is outlined.
    slot_row_y = top + 3 * (ch + 6)
    if want["slot"] in centers:
        _outline(f, centers[want["slot"]] - (scw - 4) / 2 - 2, py - 2, scw, ch + 4, color=stroke("accent"))
    if slot in centers:
        color = stroke("accent") if slot == want["slot"] else stroke("wrong")
        f.curve(MARGIN + 106 + 35, slot_row_y + ch, centers[slot], py - 18, color=color, width=1.3)
        f.text(centers[slot] + 8, py - 21, "① store the new K/V here" if slot == want["slot"] else "① yours writes here",
               size=SMALL + 1, color=color, cls="label")
    # ② What attention reads: the first context_len positions, wherever their blocks are.
    ctx = yours["context_len"]
    read = [table[p // bs] * bs + p % bs for p in range(min(ctx, len(table) * bs)) if p // bs < len(table)]
    for i, b in enumerate(table):
        in_block = [s for s in read if b * bs <= s < b * bs + bs]
        if in_block:
            x1 = centers[min(in_block)] - (scw - 4) / 2
            x2 = centers[max(in_block)] + (scw - 4) / 2
            f.bracket(x1, x2, py + ch + 4, f"② read by attention: {len(in_block)}")
    f.y = py + ch + 66
    f.heading("the sequence's blocks in the pool (each cell: the position whose K/V it holds)")
    expect_ctx = "" if ctx == want["context_len"] else f" (expected {want['context_len']})"
    missing = "" if slot in centers else f" Your slot {slot} is in none of this sequence's blocks."
    f.y += 2
    f.note(f"Attention reads context_len = {ctx} entries{expect_ctx}: the {pos} cached ones and the one this "
           f"step just wrote. The sampler then draws the token at position {n}; it joins token_ids without K/V, "
           f"and the next step starts from len = {n + 1}.{missing}", size=SMALL + 1)
    f.y += 10

    examples = r.get("examples")
    if examples:
        f.heading("nano-vllm's examples (block_size 256) · your values")
        cols = ["len", "block_table", "position", "context_len", "slot"]
        widths = [70, 120, 100, 110, 100]
        x0 = MARGIN + 20
        top = f.y + 4
        xs = [x0 + sum(widths[:k]) for k in range(len(cols))]
        for k, c in enumerate(cols):
            f.text(xs[k] + (widths[k] - 8) / 2, top + 10, c, size=SMALL + 1, anchor="middle", color=MUTED,
                   mono=True, cls="label")
        for i, e in enumerate(examples):
            yy = top + 18 + i * (30 + 4)
            f.cell(xs[0], yy, e["len"], role="plain", w=widths[0] - 8, h=30)
            f.cell(xs[1], yy, str(e["table"]), role="plain", w=widths[1] - 8, h=30, fmt=str)
            for k, key in enumerate(("position", "context_len", "slot"), start=2):
                bad = e["yours"][key] != e["expected"][key]
                f.cell(xs[k], yy, e["yours"][key], role="plain", w=widths[k] - 8,
                       h=30, wrong=bad, expected=e["expected"][key] if bad else None, bold=key == "slot")
            last = e["len"] - 1
            f.text(xs[-1] + widths[-1] + 4, yy + 20,
                   f"pos {last} → block_table[{last // 256}]·256 + {last % 256}", size=SMALL + 1, color=MUTED,
                   mono=True, cls="label")
            wrong_any = wrong_any or e["yours"] != e["expected"]
        f.y = top + 18 + len(examples) * 34 + 22
    f.legend([("cached", "token whose K/V is already in the cache"),
              ("new", "the newest token: computed and written this step"), ("masked", "free slot")],
             wrong=wrong_any)
