"""Figures of ch25 · paged KV cache: the slot of every token, and blocks carrying a sequence."""

from __future__ import annotations

from figures import figure
from figures.kit import Figure, num, text_width
from figures.layout import Part, column, pad, row
from figures.style import CELL, INK, LABEL, LABEL_SMALL, MARGIN, MUTED, SMALL, VALUE, stroke
from grader.i18n import tr


def _pair(v: list) -> str:
    return ", ".join(num(x) for x in v) if v else ""


@figure(
    "ch25-dim-slot-mapping",
    title="逐 token 的逻辑块 / 偏移 / 物理块 / slot",
    zh="每个 token 由位置算出逻辑块(pos // 2)与块内偏移(pos % 2),查块表得到物理块,"
    "slot = 物理块 × 2 + 偏移;它的 K 写进物理池里这个 slot 的格子。",
    en="Per token: logical block, offset, physical block, slot. The position gives the logical block "
    "(pos // 2) and the offset (pos % 2); the block table gives the physical block; "
    "slot = physical · 2 + offset, and the token's K is written into that cell of the pool.",
    needs={"slots": "ch25.1"},
)
def slot_mapping_figure(f: Figure, r: dict) -> None:
    table, bs, positions = r["table"], r["block_size"], r["positions"]
    slots, expected, keys = r["slots"], r["expected"], r["keys"]
    num_blocks, n = r["num_blocks"], len(positions)
    f.instance_row(
        [(f"T = {n}", "token"), (f"block_size = {bs}", "plain"), (f"block_table = {table}", "block")],
        note=tr("logical block i → physical block block_table[i]"),
    )

    # The derivation: one column per token, top to bottom; the slot row marked where the check found it wrong.
    f.heading(tr("how each token's slot is derived"))
    rows = [
        (tr("token / position"), [f"t{i} · {p}" for i, p in enumerate(positions)], "token"),
        (tr("logical block = pos // {bs}", bs=bs), [p // bs for p in positions], "token"),
        (tr("offset = pos % {bs}", bs=bs), [p % bs for p in positions], "token"),
        (tr("physical = block_table[logical]"), [table[p // bs] for p in positions], "block"),
        (tr("slot = physical · {bs} + offset", bs=bs), slots, "block"),
        (tr("K of the token (2 wide)"), [_pair(k) for k in keys], "k"),
    ]
    derivation = f.matrix(
        [values for _, values, _ in rows],
        role=lambda i, j: rows[i][2],
        expected=[[None] * n] * 4 + [expected] + [[None] * n],
        wrong=[[False] * n] * 4 + [r["wrong"]] + [[False] * n],
        row_labels=[label for label, _, _ in rows],
        w=70,
        h=CELL,
        gap=7,
        fmt=lambda v: v if isinstance(v, str) else num(v),
    )
    f.place(pad(derivation, left=300 - derivation.label_w), after=0)
    f.outline(*derivation.span_box(4, 0, 4, n - 1), role="block", inset=-3, width=1.6)

    # The pool: blocks side by side, each cell above its slot's id. The arrows go to the slots the tokens belong
    # in (those store_kv is given); the cells hold what your store_kv wrote there (marked where the check found it
    # wrong), or, before store_kv is checked, the K values that belong there. A slot of yours that differs is
    # tagged under the slot it points to instead.
    pool, pool_wrong = r.get("pool"), r.get("pool_wrong")
    belongs = {s: j for j, s in enumerate(expected)}
    cells: dict[int, Part] = {}
    blocks = []
    for b in range(num_blocks):
        used = b in table
        for o in range(bs):
            s = b * bs + o
            if pool is not None and pool_wrong is not None:
                value, want = _pair(pool[s]) if any(pool[s]) else "", _pair(r["pool_expected"][s])
                cells[s] = _slot_cell(
                    f,
                    s,
                    value,
                    role="k" if value else "plain" if used else "masked",
                    wrong=pool_wrong[s],
                    expected=want if any(r["pool_expected"][s]) else "·",
                )
            else:
                j = belongs.get(s)
                cells[s] = _slot_cell(
                    f, s, _pair(keys[j]) if j is not None else "", role="k" if j is not None else "plain" if used else "masked"
                )
        name = tr("block {b}", b=b) if used else tr("block {b} (not in table)", b=b)
        title = f.label(name, size=LABEL_SMALL, color=INK if used else MUTED)
        blocks.append(column(title, row(*(cells[b * bs + o] for o in range(bs)), gap=4), gap=4, align="center"))
    strip = row(*blocks, gap=18)
    f.y += 90
    f.place(strip, x=MARGIN + (f.width - 2 * MARGIN - strip.w) / 2, after=0)
    center = {s: c.right - c.w / 2 for s, c in cells.items()}
    for j, s in enumerate(expected):
        if s in cells:
            x, y, w, h = derivation.cell_box(5, j)
            f.curve(x + w / 2, y + h + 2, center[s], strip.bottom - strip.h - 3, color=stroke("block"), width=1.1)
    misplaced = slot_tags(slots, expected, num_blocks * bs)
    for s, tokens in misplaced.items():
        for k, j in enumerate(tokens):
            f.text(
                center[s],
                strip.bottom + 15 + 12 * k,
                f"✗ t{j}",
                anchor="middle",
                size=SMALL,
                weight="bold",
                color=stroke("wrong"),
                cls="mark slot-tag",
            )
    deepest = max((len(t) for t in misplaced.values()), default=0)
    f.y += 26 + (12 * deepest + 8 if deepest else 0)
    f.heading(tr("the physical pool: {nb} blocks × {bs} slots; each token's K lands in its slot", nb=num_blocks, bs=bs))
    source = (
        tr("the K values are what your store_kv wrote, given these slots")
        if pool is not None
        else tr("the K values are placed in them (store_kv not checked yet)")
    )
    outside = [f"t{j} → {s}" for j, s in enumerate(slots) if s != expected[j] and not 0 <= s < num_blocks * bs]
    f.y += 4
    arrows = tr("the slot each token belongs in") if r.get("checked", True) else tr("the slot your slot_mapping gives each token")
    last = num_blocks * bs - 1
    f.note(
        tr("Arrows: {arrows}; {source}.", arrows=arrows, source=source)
        + (tr(" ✗ tN under a slot: your slot_mapping sends token N there instead.") if misplaced else "")
        + (tr(" Yours outside the pool (slots 0–{last}): {outside}.", last=last, outside=", ".join(outside)) if outside else ""),
        size=LABEL_SMALL,
    )
    wrong = any(r["wrong"]) or (pool_wrong is not None and any(pool_wrong))
    f.legend(
        [
            ("token", tr("token, position, logical block")),
            ("block", tr("physical block and slot")),
            ("k", tr("K written into the cache")),
            ("masked", tr("block not in this sequence's table")),
        ],
        wrong=wrong,
    )


def _slot_cell(f: Figure, slot: int, value: str, *, role: str, wrong: bool = False, expected: str = "") -> Part:
    """One slot of the pool: its cell (marked wrong, yours struck through over `expected`), its id under it."""
    w = 60

    def draw(x: float, y: float) -> None:
        f.cell(x, y, value, role=role, w=w, h=CELL, fmt=str, wrong=wrong, expected=expected if wrong else None, size=VALUE - 1)
        f.text(x + w / 2, y + CELL + 14, f"slot {slot}", anchor="middle", size=SMALL, color=MUTED, mono=True, cls="label")

    return Part(w, CELL + 16, draw)


def slot_tags(slots: list[int], expected: list[int], pool_slots: int) -> dict[int, list[int]]:
    """The tokens whose slot of yours differs from the expected one, by the slot of yours they point to
    (only slots inside the pool)."""
    tags: dict[int, list[int]] = {}
    for j, (s, want) in enumerate(zip(slots, expected)):
        if s != want and 0 <= s < pool_slots:
            tags.setdefault(s, []).append(j)
    return tags


@figure(
    "ch25-blocks",
    title="离散物理块承载连续逻辑序列",
    zh="一条 11 个 token 的序列在逻辑上是连续的;块表 [5, 1, 3] 把它的三个逻辑块放进池中不相邻、也不按顺序的物理块,"
    "最后一个块只用了 3 个 slot。",
    en="Discrete physical blocks carry one continuous logical sequence: the table [5, 1, 3] scatters the 11 "
    "tokens' three logical blocks over the pool, out of order; the last block has one slot still free.",
    needs={"slots": "ch25.1"},
)
def blocks_figure(f: Figure, r: dict) -> None:
    table, bs, slots, expected = r["table"], r["block_size"], r["slots"], r["expected"]
    num_blocks, n = r["num_blocks"], len(r["slots"])
    cw, block_gap = 40, 18
    # The logical sequence, one strip, grouped by logical block.
    f.heading(tr("the logical sequence, grouped into logical blocks"))
    strip = len(table) * (bs * cw + block_gap) - block_gap
    lx, ly = MARGIN + (f.width - 2 * MARGIN - strip) / 2, f.y + 30
    for p in range(len(table) * bs):
        lb, off = divmod(p, bs)
        x = lx + p * cw + lb * block_gap
        f.cell(x, ly, p if p < n else "", role="token" if p < n else "masked", w=cw - 3, h=cw - 6, dashed=p >= n)
        if off == 0:
            text = tr("logical {lb} → block_table[{lb}] = {phys}", lb=lb, phys=table[lb])
            f.bracket(x, x + bs * cw - 3, ly - 6, text, below=False, size=SMALL)
    # The pool, physical blocks in id order: each cell shows the position your slots put there.
    py = ly + cw + 100
    pw = (f.width - 2 * MARGIN) / num_blocks
    cell = min(cw, (pw - 12) / bs)
    got, want = pool_positions(slots, num_blocks * bs), pool_positions(expected, num_blocks * bs)
    for b in range(num_blocks):
        bx = MARGIN + b * pw
        used = b in table
        label = tr("block {b} ← logical {lb}", b=b, lb=table.index(b)) if used else tr("block {b}", b=b)
        f.text(bx + bs * cell / 2, py + cell + 16, label, anchor="middle", size=SMALL + 0.5, color=INK if used else MUTED, cls="label")
        for o in range(bs):
            s = b * bs + o
            mine, right = _positions(got.get(s, [])), _positions(want.get(s, []))
            bad = mine != right
            # the largest size at which the text fits the cell (a wrong cell writes one point smaller)
            size = min(SMALL + 1, (cell - 5) / max(text_width(max(mine, right, key=len), 1, mono=True), 1e-9) + bad)
            f.cell(
                bx + o * cell,
                py,
                mine,
                role="token" if mine else ("block" if used else "masked"),
                w=cell - 2,
                h=cell,
                size=round(size, 2),
                fmt=str,
                wrong=bad,
                expected=right or "·",
            )
            f.text(bx + o * cell + (cell - 2) / 2, py - 4, str(s), anchor="middle", size=SMALL - 1, color=MUTED, mono=True, cls="label")
    # One arrow per logical block, to the physical block the table names: a token follows its block's
    # arrow and keeps its offset, so position p is cell p % block_size of block block_table[p // block_size].
    # Each is a band from the logical block's cells to the physical block's cells, with an arrow down its middle.
    top, bottom = ly + cw - 3, py - 14
    for lb, b in enumerate(table):
        l0, l1 = lx + lb * (bs * cw + block_gap), lx + lb * (bs * cw + block_gap) + bs * cw - 3
        p0, p1 = MARGIN + b * pw, MARGIN + b * pw + bs * cell - 2
        f.dwg.add(
            f.dwg.polygon(
                [(l0, top), (l1, top), (p1, bottom), (p0, bottom)],
                fill=stroke("block"),
                fill_opacity=0.10,
                stroke=stroke("block"),
                stroke_opacity=0.45,
                stroke_width=0.8,
                class_="band",
            )
        )
        f.arrow((l0 + l1) / 2, top + 2, (p0 + p1) / 2, bottom - 1, color=stroke("block"), width=1.6, head=7)
    f.y = py + cell + 42
    f.heading(tr("the pool (small numbers: slot ids; cells show the position your slots put there)"))
    f.y += 14
    # The slots as a row, marked where wrong.
    f.heading(tr("slot_mapping: your slots for positions 0–{last}", last=n - 1))
    f.place(
        f.matrix([slots], expected=[expected], wrong=[r["wrong"]], role="block", w=40, h=30, col_labels=[f"p{p}" for p in range(n)]),
        after=26,
    )
    outside = [f"p{p} → {s}" for p, s in enumerate(slots) if not 0 <= s < num_blocks * bs]
    last = num_blocks * bs - 1
    f.note(
        tr("Arrows: logical block i lives in physical block block_table[i], and each token keeps its offset there.")
        + (tr(" Yours outside the pool (slots 0–{last}): {outside}.", last=last, outside=", ".join(outside)) if outside else ""),
        size=SMALL + 1,
    )
    f.legend(
        [
            ("token", tr("a token (its position)")),
            ("block", tr("a slot of this sequence's blocks")),
            ("masked", tr("blocks and slots not in use")),
        ],
        wrong=any(r["wrong"]),
    )


def pool_positions(slots: list[int], pool_slots: int) -> dict[int, list[int]]:
    """The positions each slot of the pool holds under `slots` (slots outside the pool left out)."""
    held: dict[int, list[int]] = {}
    for p, s in enumerate(slots):
        if 0 <= s < pool_slots:
            held.setdefault(s, []).append(p)
    return held


def _positions(held: list[int]) -> str:
    return ",".join(map(str, held))


_CIRCLED = "①②③④⑤⑥"


def _state(m: dict | None) -> str:
    """A block's state name, from its moment record."""
    if m is None:
        return "?"
    if m["ref"] == 0:
        return "FREE-CACHED" if m["hash"] != "none" else "FREE-CLEAN"
    return ("SHARED" if m["ref"] > 1 else "HASHED") if m["hash"] != "none" else "FILLING"


@figure(
    "ch25-block-lifecycle",
    title="物理块的六个时刻",
    zh="同一个物理块 0 的六个时刻:空闲、分配给 A、被 B 的前缀命中共享、释放后仍带 hash(可回收,内容未清零)、"
    "被 C 的前缀命中复活、被 D 复用时旧 hash 被驱逐。",
    en="Six moments in the life of physical block 0: free, allocated to A, shared by B's prefix hit, freed but "
    "still cached (recyclable, not zeroed), revived by C's prefix hit, and evicted when D reuses it for new "
    "tokens.",
    needs={"moments": "ch25.3"},
)
def lifecycle_figure(f: Figure, r: dict) -> None:
    block, bs, moments = r["block"], r["block_size"], r["moments"]
    # The instance: the pool and the four requests.
    f.heading(tr("instance: {nb} blocks × {bs} slots; four requests, one after another", nb=r["num_blocks"], bs=bs))
    reqs = [
        ("A", "[1 … 9]", tr("{n} tokens", n=9)),
        ("B", "[1 2 3 4 | 20 21 22]", tr("shares A's first block")),
        ("C", "[1 2 3 4 | 30 31]", tr("arrives after A, B finished")),
        ("D", "[40 … 55]", tr("{n} new tokens", n=16)),
    ]
    f.place(
        row(
            *(
                column(f.chip(f"{name} = {toks}", role="token", mono=True), f.label(note, size=SMALL, cls="note"), gap=3, align="center")
                for name, toks, note in reqs
            ),
            gap=12,
        ),
        after=14,
    )
    gap, cols = 16, 3
    pw = (f.width - 2 * MARGIN - (cols - 1) * gap) / cols
    ph = 322
    wrong = False
    # One size for the six panel titles, the largest at which every title keeps 10 px from its panel's sides.
    titles = [f"{_CIRCLED[k]} {m['label']}" for k, m in enumerate(moments)]
    title_size = min([TITLE_SIZE] + [TITLE_SIZE * (pw - 20) / text_width(t, TITLE_SIZE, bold=True) for t in titles])
    for k, m in enumerate(moments):
        px, py = MARGIN + (k % cols) * (pw + gap), f.y + (k // cols) * (ph + gap)
        wrong |= _panel(f, px, py, pw, ph, k, m, block, bs, title_size=round(title_size, 2))
        if k % cols < cols - 1:
            f.arrow(px + pw + 2, py + 24, px + pw + gap - 2, py + 24, color=MUTED, head=5)
    f.y += 2 * ph + gap + 24
    f.legend(
        [
            ("masked", tr("free, ref 0 (dashed): recyclable, not zeroed")),
            ("block", tr("in use, ref ≥ 1")),
            ("k", tr("K/V of these tokens, still in the block")),
            ("accent", tr("block {b} in the free list (head on the left)", b=block)),
        ],
        wrong=wrong,
    )


TITLE_SIZE = LABEL + 0.5
"""The size of a lifecycle panel's title, unless a title would not fit its panel."""


def _panel(
    f: Figure, x: float, y: float, w: float, h: float, k: int, m: dict, block: int, bs: int, *, title_size: float = TITLE_SIZE
) -> bool:
    """One moment: the block as a card, its bookkeeping (yours, expected if different), the free list."""
    yours, want = m["yours"], m["expected"]
    f.dwg.add(f.dwg.rect((x, y), (w, h), rx=6, fill="none", stroke=MUTED, stroke_width=0.8, class_="panel"))
    f.text(x + 10, y + 20, f"{_CIRCLED[k]} {m['label']}", size=title_size, weight="bold", cls="label panel-title")
    f.paragraph(x + 10, y + 37, m["what"], width=w - 20, size=SMALL, color=MUTED)
    f.text(x + 10, y + 86, tr("after {op}", op=m["op"]) if m["op"] else tr("at the start"), size=SMALL, mono=True, color=INK, cls="note")
    shown = yours if yours is not None else want
    state = _state(shown)
    role = "masked" if state.startswith("FREE") else "block" if shown else "plain"
    cy = y + 94
    f.box(x + 10, cy, w - 20, 44, role=role, dashed=state.startswith("FREE"))
    head = f"block {block} · {state}" if yours is not None else tr("block {b} · not reached", b=block)
    f.text(x + 18, cy + 14, head, size=SMALL, mono=True, cls="label")
    cw = (w - 36 - 3 * (bs - 1)) / bs
    toks = shown["tokens"] if shown else []
    for s in range(bs):
        f.cell(
            x + 18 + s * (cw + 3),
            cy + 19,
            toks[s] if s < len(toks) else "",
            role="k" if toks else "plain",
            w=cw,
            h=20,
            size=SMALL,
            dashed=not toks,
        )
    rows = [("ref_count", "ref"), ("hash", "hash"), (tr("map entry → it"), "mapped"), (tr("held by"), "holders")]
    ry, bad_any = cy + 54, False
    for label, key in rows:
        got = _show(yours, key)
        exp = _show(want, key)
        bad = got != exp
        bad_any |= bad
        f.text(x + 12, ry + 18, label, size=SMALL + 0.5, color=MUTED, cls="label")
        f.cell(x + 112, ry, got, role="plain", w=w - 122, h=28, fmt=str, size=SMALL + 0.5, wrong=bad, expected=exp if bad else None)
        ry += 32
    free = yours["free"] if yours else []
    free_want = want["free"] if want else []
    f.text(x + 12, ry + 18, tr("free list"), size=SMALL + 0.5, color=MUTED, cls="label")
    fx = x + 112
    n = max(len(free), len(free_want), 1)
    fw = min(26, (w - 122) / n - 2)
    for i in range(max(len(free), len(free_want))):
        got = free[i] if i < len(free) else "·"
        exp = free_want[i] if i < len(free_want) else "·"
        bad = got != exp
        bad_any |= bad
        f.cell(
            fx + i * (fw + 2),
            ry,
            got,
            role="accent" if got == block else "masked",
            w=fw,
            h=28,
            size=SMALL,
            wrong=bad,
            expected=exp if bad else None,
        )
    if not free and not free_want:
        f.text(fx, ry + 18, tr("(empty)"), size=SMALL, color=MUTED, cls="note")
    return bad_any


def _show(m: dict | None, key: str) -> str:
    if m is None:
        return "—"
    v = m[key]
    if key == "mapped":
        return tr("yes") if v else tr("no")
    if key == "holders":
        return ", ".join(v) if v else "—"
    if key == "hash":
        return v if v == "none" else v[:10] + "…"
    return str(v)
