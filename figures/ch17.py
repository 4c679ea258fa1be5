"""Figures of ch17 · causal masks: the mask of a whole sequence, and a chunk's mask after a
cached prefix beside the top-left tril it must not be."""

from __future__ import annotations

from figures import figure
from figures.kit import Figure, text_width
from figures.style import CELL, INK, LABEL, MARGIN, MUTED, SMALL, stroke

CW = 44  # mask cell width


def _cell_role(v: bool) -> str:
    return "attend" if v else "masked"


def _keys(row: list[bool]) -> str:
    """The keys a row lets its query see, as k-ranges: 'k0–k3', 'k0', 'none'."""
    idx = [j for j, v in enumerate(row) if v]
    if not idx:
        return "none"
    ranges, start, prev = [], idx[0], idx[0]
    for j in idx[1:]:
        if j != prev + 1:
            ranges.append((start, prev))
            start = j
        prev = j
    ranges.append((start, prev))
    return ", ".join(f"k{a}" if a == b else f"k{a}–k{b}" for a, b in ranges)


def _mask(f: Figure, x: float, y: float, values: list[list[bool]], *, expected: list[list[bool]] | None = None,
          row_labels: list[str], col_labels: list[str], label_w: float, w: float = CW, h: float = CELL,
          lost: list[list[bool]] | None = None) -> tuple[float, float]:
    """A bool mask as cells (True blue, False grey), wrong cells marked against `expected`;
    cells flagged in `lost` get a dashed accent outline (used for a wrong mask drawn on purpose).
    Returns the (left, top) of the first cell."""
    left, top = x + label_w, y + 16
    for j, label in enumerate(col_labels):
        f.text(left + j * w + w / 2, top - 5, label, size=SMALL + 1, anchor="middle", color=MUTED, mono=True,
               cls="label")
    for i, row in enumerate(values):
        f.text(left - 8, top + i * h + h / 2 + 4, row_labels[i], size=SMALL + 1, anchor="end", color=INK,
               cls="label")
        for j, v in enumerate(row):
            bad = expected is not None and v != expected[i][j]
            f.cell(left + j * w, top + i * h, v, role=_cell_role(v), w=w, h=h, wrong=bad,
                   expected=expected[i][j] if bad else None)
            if lost is not None and lost[i][j]:
                _outline(f, left + j * w + 2, top + i * h + 2, w - 4, h - 4, color=stroke("accent"), dashed=True)
    return left, top


def _outline(f: Figure, x: float, y: float, w: float, h: float, *, color: str, dashed: bool = False,
             width: float = 2.2) -> None:
    rect = f.dwg.rect((x, y), (w, h), fill="none", stroke=color, stroke_width=width, class_="outline")
    if dashed:
        rect["stroke-dasharray"] = "4,3"
    f.dwg.add(rect)


def _vbracket(f: Figure, x: float, y1: float, y2: float, label: str, *, color: str = MUTED,
              size: float = SMALL + 1) -> None:
    """A vertical bracket on the right of rows y1..y2 with a label to its right (the kit has horizontal ones)."""
    f.dwg.add(f.dwg.polyline([(x, y1 + 2), (x + 6, y1 + 2), (x + 6, y2 - 2), (x, y2 - 2)], fill="none",
                             stroke=color, stroke_width=1.3, class_="bracket"))
    lines = label.split("\n")
    mid = (y1 + y2) / 2 - (len(lines) - 1) * (size + 3) / 2
    for k, line in enumerate(lines):
        f.text(x + 14, mid + k * (size + 3) + size * 0.36, line, size=size, color=color, cls="label")


# -- ch17.1 -----------------------------------------------------------------------------------

@figure("ch17-causal-mask", title="完整序列的因果遮罩",
        zh="6 个 token 的完整序列:第 i 行是位置 i 的 query,只能看见第 0…i 列的 key。上三角(j > i,未来的 token)"
           "被屏蔽;对角线保留,因为位置 i 的输出要预测第 i + 1 个 token,它必须看见自己。",
        en="The causal mask of a whole sequence of 6 tokens: row i is the query at position i and may attend "
           "keys 0 … i. The upper triangle (j > i, the future) is masked; the diagonal is kept, because the "
           "output at position i predicts token i + 1 and must see token i itself.",
        needs={"yours": "17.1"})
def causal_mask_figure(f: Figure, r: dict) -> None:
    n, yours, expected = r["num_tokens"], r["yours"], r["expected"]
    wrong = yours != expected

    # The instance.
    y = f.y
    f.box(MARGIN, y, 96, 30, role="token", label=f"T = {n}")
    f.box(MARGIN + 110, y, 196, 30, role="plain", label=f"causal_mask({n})", mono=True)
    f.text(MARGIN + 322, y + 20, f"bool [{n}, {n}]; True = may attend (the scaled_dot_product_attention convention)",
           size=SMALL + 1.5, color=MUTED, cls="note")
    f.y = y + 30 + 30

    f.heading(f"你的 mask · your causal_mask({n}): row i = query at position i, column j = key at position j")
    top_y = f.y + 4
    rows = [f"q{i} · pos {i}" for i in range(n)]
    label_w = max(text_width(s, SMALL + 1) for s in rows) + 12
    left, top = _mask(f, MARGIN, top_y, yours, expected=expected, row_labels=rows,
                      col_labels=[f"k{j}" for j in range(n)], label_w=label_w)
    # The kept diagonal, outlined.
    for i in range(n):
        _outline(f, left + i * CW + 1.5, top + i * CELL + 1.5, CW - 3, CELL - 3, color=stroke("accent"))
    # Per row: what the query sees, read from your mask, and the rule.
    rx = left + n * CW + 18
    f.text(rx, top - 5, "your row sees", size=SMALL + 1, color=MUTED, cls="label")
    f.text(rx + 150, top - 5, "rule: j ≤ i", size=SMALL + 1, color=MUTED, cls="label")
    for i in range(n):
        cy = top + i * CELL + CELL / 2 + 4
        ok = yours[i] == expected[i]
        f.text(rx, cy, _keys(yours[i]), size=LABEL, mono=True, color=INK if ok else stroke("wrong"),
               weight="normal" if ok else "bold", cls="value")
        f.text(rx + 150, cy, f"k0–k{i}" if i else "k0", size=LABEL, mono=True, color=MUTED, cls="label")
        f.text(rx + 230, cy, f"{i + 1} key" + ("s" if i else ""), size=SMALL + 1, color=MUTED, cls="label")
    # Where the triangle's parts are.
    bx = rx + 300
    f.text(bx, top + 14, "上三角 j > i: 未来, 屏蔽", size=SMALL + 1.5, color=INK, cls="label")
    f.text(bx, top + 30, "upper triangle: the future,", size=SMALL + 1, color=MUTED, cls="label")
    f.text(bx, top + 44, "False (hidden)", size=SMALL + 1, color=MUTED, cls="label")
    f.text(bx, top + 3 * CELL + 14, "对角线 j = i: 保留", size=SMALL + 1.5, color=stroke("accent"), cls="label")
    f.text(bx, top + 3 * CELL + 30, "diagonal: kept, position i", size=SMALL + 1, color=MUTED, cls="label")
    f.text(bx, top + 3 * CELL + 44, "sees itself", size=SMALL + 1, color=MUTED, cls="label")
    f.y = top + n * CELL + 34

    # One row in use: what SDPA does with it.
    i = min(3, n - 1)
    f.heading(f"一行的用法 · row {i} in attention: a False key gets score −∞ before softmax, so probability 0")
    y = f.y + 4
    rows_in_use = [("your mask row", yours[i], None), ("masked score", None, "bias"), ("softmax weight", None, "prob")]
    lx = MARGIN + max(label_w, max(text_width(label, SMALL + 1) for label, _, _ in rows_in_use) + 12)
    for k, (label, _, _) in enumerate(rows_in_use):
        f.text(lx - 8, y + k * (CELL + 6) + CELL / 2 + 4, label, size=SMALL + 1, anchor="end", color=MUTED,
               cls="label")
    for j in range(n):
        v, x = yours[i][j], lx + j * CW
        bad = v != expected[i][j]
        f.cell(x, y, v, role=_cell_role(v), w=CW, h=CELL, wrong=bad, expected=expected[i][j] if bad else None)
        f.cell(x, y + CELL + 6, f"s{i}{j}" if v else "−∞", role="plain" if v else "masked", w=CW, h=CELL, fmt=str)
        f.cell(x, y + 2 * (CELL + 6), "> 0" if v else "0", role="attend" if v else "masked", w=CW, h=CELL, fmt=str)
    f.text(lx + n * CW + 18, y + CELL + 6 + CELL / 2 + 4, f"s{i}j = q{i}·k_j / √d where True, −∞ where False",
           size=SMALL + 1, color=MUTED, cls="note")
    f.text(lx + n * CW + 18, y + 2 * (CELL + 6) + CELL / 2 + 4,
           f"q{i} mixes the values of {_keys(yours[i])} only", size=SMALL + 1, color=MUTED, cls="note")
    f.y = y + 3 * (CELL + 6) + 22
    f.note(f"torch.tril(torch.ones({n}, {n}, dtype=torch.bool)) builds this mask; for a square mask it is also "
           "what scaled_dot_product_attention(..., is_causal=True) applies. A float mask would be added to the "
           "scores instead, so the answer must be bool.", size=SMALL + 1.5)
    f.y += 6
    f.legend([("attend", "T: may attend (j ≤ i)"), ("masked", "F: hidden, the future (j > i)"),
              ("accent", "pink outline: the diagonal j = i, kept")], wrong=wrong)


# -- ch17.2 -----------------------------------------------------------------------------------

@figure("ch17-offset-mask", title="缓存 chunk 必须带上位置偏移",
        zh="3 个 token 已在 KV 缓存中,这一步只算 2 个新 token:它们的绝对位置是 3 和 4,所以 [2, 5] 的 mask 是"
           "完整 5 × 5 因果遮罩的最后两行(tril 取 diagonal = 3,对齐右下角),不能照搬从左上角开始的 tril。",
        en="A chunk after a cached prefix needs its position offset: 3 tokens are cached and 2 new ones are "
           "computed, at absolute positions 3 and 4, so the [2, 5] mask is the last two rows of the full 5 × 5 "
           "causal mask (tril with diagonal = 3, aligned to the bottom-right), not a tril taken from the "
           "top-left corner.",
        needs={"yours": "17.2"})
def offset_mask_figure(f: Figure, r: dict) -> None:
    n, c, yours, expected = r["num_new"], r["num_cached"], r["yours"], r["expected"]
    s = n + c
    wrong = yours != expected
    top_left = [[j <= i for j in range(s)] for i in range(n)]
    lost = [[expected[i][j] and not top_left[i][j] for j in range(s)] for i in range(n)]

    # The instance.
    y = f.y
    f.box(MARGIN, y, 150, 30, role="cached", label=f"num_cached = {c}")
    f.box(MARGIN + 162, y, 130, 30, role="new", label=f"num_new = {n}")
    f.box(MARGIN + 304, y, 150, 30, role="plain", label=f"S = {c} + {n} = {s} keys")
    f.text(MARGIN + 470, y + 13, f"query i is the token at absolute position {c} + i,", size=SMALL + 1.5,
           color=MUTED, cls="note")
    f.text(MARGIN + 470, y + 29, f"so it sees keys 0 … {c} + i", size=SMALL + 1.5, color=MUTED, cls="note")
    f.y = y + 30 + 30

    # Two panels: yours and the top-left tril.
    rows = [f"q{i} · pos {c + i}" for i in range(n)]
    cols = [f"k{j}" for j in range(s)]
    label_w = max(text_width(x, SMALL + 1) for x in rows) + 12
    panel_w = (f.width - 2 * MARGIN) / 2
    heads = [(f"你的 mask · yours: causal_mask_with_offset({n}, {c})", yours, expected, None),
             (f"错误 · wrong: torch.tril(torch.ones({n}, {s}))", top_left, None, lost)]
    py = f.y + 30
    for k, (head, values, exp, lost_cells) in enumerate(heads):
        x = MARGIN + k * panel_w
        f.text(x, f.y, head, size=LABEL, weight="bold", color=INK if k == 0 else stroke("accent"), cls="heading")
        left = x + label_w
        # Column groups: cached prefix and new tokens.
        if c:
            f.bracket(left, left + c * CW, py - 2, f"cached 0–{c - 1}" if c > 1 else "cached 0", below=False,
                      color=stroke("cached"))
        if n:
            f.bracket(left + c * CW, left + s * CW, py - 2, f"new {c}–{s - 1}" if n > 1 else f"new {c}",
                      below=False, color=stroke("new"))
        left, top = _mask(f, x, py, values, expected=exp, row_labels=rows, col_labels=cols, label_w=label_w,
                          lost=lost_cells)
        for i in range(n):
            cy = top + i * CELL + CELL / 2 + 4
            ok = exp is None or values[i] == exp[i]
            color = INK if ok and k == 0 else stroke("accent") if k == 1 else stroke("wrong")
            f.text(left + s * CW + 10, cy, "sees " + _keys(values[i]), size=SMALL + 1.5, mono=True, color=color,
                   cls="value")
        note_y = top + n * CELL + 18
        if k == 0:
            f.text(x, note_y, f"= tril(ones({n}, {s}), diagonal={c}): row i sees keys 0 … {c} + i",
                   size=SMALL + 1, color=MUTED, cls="note")
            f.text(x, note_y + 15, "the last rows of the full causal mask (bottom-right)", size=SMALL + 1,
                   color=MUTED, cls="note")
        else:
            f.text(x, note_y, f"q0 (pos {c}) sees only k0: the cached prefix is lost", size=SMALL + 1,
                   color=stroke("accent"), cls="note")
            f.text(x, note_y + 15, "SDPA's is_causal=True with L ≠ S aligns here (top-left)", size=SMALL + 1,
                   color=MUTED, cls="note")
    f.y = py + 16 + n * CELL + 66

    # The full sequence: where both sets of rows come from.
    f.heading(f"从完整序列看 · the full {s} × {s} causal mask (j ≤ i): which rows each mask takes")
    full = [[j <= i for j in range(s)] for i in range(s)]
    full_rows = [f"pos {i}" + (f" · q{i - c}" if i >= c else "") for i in range(s)]
    fl_w = max(text_width(x, SMALL + 1) for x in full_rows) + 12
    fx = MARGIN + 60
    gy = f.y + 22
    if c:
        f.bracket(fx + fl_w, fx + fl_w + c * CW, gy - 2, "cached", below=False, color=stroke("cached"))
    if n:
        f.bracket(fx + fl_w + c * CW, fx + fl_w + s * CW, gy - 2, "new", below=False, color=stroke("new"))
    left, top = _mask(f, fx, gy, full, row_labels=full_rows, col_labels=cols, label_w=fl_w)
    right = left + s * CW
    # Rows of the chunk (bottom-right) and the rows the top-left tril copies.
    if n:
        _outline(f, left - 3, top + c * CELL - 3, s * CW + 6, n * CELL + 6, color=stroke("new"), width=2.5)
        _vbracket(f, right + 10, top + c * CELL, top + s * CELL,
                  f"positions {c}–{s - 1}: this chunk's queries\n= your [{n}, {s}] mask (bottom-right aligned)",
                  color=INK)
    if c and n:
        k = min(n, c)
        _outline(f, left - 4, top - 3, s * CW + 8, k * CELL + 6, color=stroke("accent"), width=2, dashed=True)
        _vbracket(f, right + 10, top, top + k * CELL,
                  f"positions 0–{k - 1}: what torch.tril(ones({n}, {s})) copies\n(top-left aligned: rows of other tokens)",
                  color=stroke("accent"))
    if c > n:
        span = f"position {n}" if c - n == 1 else f"positions {n}–{c - 1}"
        _vbracket(f, right + 10, top + n * CELL, top + c * CELL, span + ": cached, computed in an earlier step",
                  color=MUTED)
    f.y = top + s * CELL + 26
    f.note("nano-vllm passes causal=True to flash_attn_varlen_func; since flash-attn 2.1 the triangle of a "
           "query block shorter than its keys is aligned to the bottom-right, as here. PyTorch's "
           "scaled_dot_product_attention(..., is_causal=True) aligns it to the top-left when L ≠ S: for a chunk, "
           "pass this mask (or torch.nn.attention.bias.causal_lower_right) instead.", size=SMALL + 1.5)
    f.legend([("cached", "cached prefix keys (K/V already in the cache)"), ("new", "new tokens of this step"),
              ("attend", "T: may attend"), ("masked", "F: hidden"),
              ("accent", "dashed: keys the top-left tril hides by mistake")], wrong=wrong)
