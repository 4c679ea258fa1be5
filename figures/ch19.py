"""Figures of ch19 · rotary position embedding: one 2-D pair turned position by position, and the order
of nano-vllm's q/k path (per-head norm, then RoPE; V never rotated).

The kit has no vector-in-a-plane drawing; `_plane` below draws one locally (axes, a circle, arrows
from the origin and angle arcs) with the kit's classes, so wrong vectors carry class "wrong". Labels
are placed clear of the circle, the arrows and each other (`_place`); a slow pair, whose arrows lie
on top of each other, gets a zoomed inset where the positions part (`_zoom`)."""

from __future__ import annotations

import math
from typing import Sequence

from figures import figure
from figures.kit import Figure, num, text_width
from figures.layout import Part, centred, column, pad, row, space, wide
from figures.style import CELL, INK, LABEL, MARGIN, MUTED, RULE, SMALL, VALUE, stroke
from grader.i18n import mark, tr

PAIR_ROLES = ("accent", "token")  # pair 0, pair 1 (channels j and j + d/2 share a colour)
POS_COLORS = ("#5f5f5f", "#0072B2", "#CC79A7", "#009E73")


def _small(v) -> str:
    """3 significant digits, a real minus sign (also for whole numbers)."""
    return num(round(v, 3) if isinstance(v, float) else v).replace("-", "−")


def _num4(v) -> str:
    return num(v, 4)


def _vector(
    f: Figure,
    cx: float,
    cy: float,
    x: float,
    y: float,
    scale: float,
    color: str,
    *,
    cls: str = "arrow",
    dashed: bool = False,
    width: float = 2.0,
) -> tuple[float, float]:
    """An arrow from the plane's origin to (x, y) in math coordinates (y up); returns the tip in SVG space."""
    tx, ty = cx + x * scale, cy - y * scale
    length = math.hypot(tx - cx, ty - cy)
    if length < 1:
        return tx, ty
    ux, uy = (tx - cx) / length, (ty - cy) / length
    head = 9
    bx, by = tx - head * ux, ty - head * uy
    line = f.dwg.line((cx, cy), (bx, by), stroke=color, stroke_width=width, class_=cls)
    if dashed:
        line["stroke-dasharray"] = "4,3"
    f.dwg.add(line)
    f.dwg.add(
        f.dwg.polygon(
            [(tx, ty), (bx - head * 0.45 * uy, by + head * 0.45 * ux), (bx + head * 0.45 * uy, by - head * 0.45 * ux)],
            fill="none" if dashed else color,
            stroke=color,
            stroke_width=1,
            class_=cls,
        )
    )
    return tx, ty


def _arc(f: Figure, cx: float, cy: float, r: float, a0: float, a1: float, color: str) -> None:
    """A circular arc of radius r from angle a0 to a1 (radians, math orientation), with a small arrowhead."""
    if abs(a1 - a0) < 1e-9:
        return
    x0, y0 = cx + r * math.cos(a0), cy - r * math.sin(a0)
    x1, y1 = cx + r * math.cos(a1), cy - r * math.sin(a1)
    large = 1 if abs(a1 - a0) % (2 * math.pi) > math.pi else 0
    sweep = 0 if a1 > a0 else 1  # counter-clockwise in math = sweep 0 in SVG (y down)
    f.dwg.add(
        f.dwg.path(
            d=f"M{x0:.2f},{y0:.2f} A{r},{r} 0 {large},{sweep} {x1:.2f},{y1:.2f}", fill="none", stroke=color, stroke_width=1.2, class_="arc"
        )
    )


Box = tuple[float, float, float, float]  # x0, y0, x1, y1 in SVG coordinates


def label_box(x: float, y: float, s: str, size: float, anchor: str, mono: bool = True) -> Box:
    """The box a one-line text drawn at baseline (x, y) covers (ascent 0.8·size, descent 0.25·size)."""
    w = text_width(s, size, mono=mono, bold=True)
    x0 = x - (w if anchor == "end" else w / 2 if anchor == "middle" else 0)
    return x0, y - 0.8 * size, x0 + w, y + 0.25 * size


def crosses_ring(box: Box, cx: float, cy: float, r: float, margin: float = 3.0) -> bool:
    """Whether a box touches the circle of radius r around (cx, cy), within `margin`."""
    x0, y0, x1, y1 = box
    near = math.hypot(max(x0 - cx, 0, cx - x1), max(y0 - cy, 0, cy - y1))
    far = max(math.hypot(x - cx, y - cy) for x in (x0, x1) for y in (y0, y1))
    return near <= r + margin and far >= r - margin


def _overlaps(a: Box, b: Box, pad: float = 2.0) -> bool:
    return a[0] < b[2] + pad and b[0] < a[2] + pad and a[1] < b[3] + pad and b[1] < a[3] + pad


def _hits_segment(box: Box, x1: float, y1: float, x2: float, y2: float, pad: float = 2.0) -> bool:
    """Whether the segment (x1, y1)–(x2, y2) passes through the box grown by `pad` (Liang–Barsky)."""
    t0, t1 = 0.0, 1.0
    dx, dy = x2 - x1, y2 - y1
    for p, q in ((-dx, x1 - (box[0] - pad)), (dx, box[2] + pad - x1), (-dy, y1 - (box[1] - pad)), (dy, box[3] + pad - y1)):
        if p == 0:
            if q < 0:
                return False
        elif p < 0:
            t0 = max(t0, q / p)
        else:
            t1 = min(t1, q / p)
        if t0 > t1:
            return False
    return True


def _place(
    text: str,
    size: float,
    tip: tuple[float, float],
    centre: tuple[float, float],
    r: float,
    bounds: Box,
    taken: list[Box],
    segments: list[tuple],
) -> tuple[float, float, str]:
    """Where to write an arrow's label: beside its tip, clear of the circle, the panel's edge, the
    other labels and the lines in `segments` (arrows, angle arcs). Tries spots just inside the
    circle along the arrow, then outside it."""
    cx, cy = centre
    ux, uy = (tip[0] - cx) / max(r, 1e-9), (tip[1] - cy) / max(r, 1e-9)
    nx, ny = -uy, ux  # across the arrow
    candidates = []
    for d, off in ((-16, 9), (-30, 9), (-16, 16), (-46, 9), (14, 9), (-62, 9), (-30, 20)):  # d < 0: inside
        for side in (1, -1):
            px, py = cx + ux * (r + d) + nx * off * side, cy + uy * (r + d) + ny * off * side
            # write away from the arrow (the side of the normal decides the anchor), else towards the centre
            sx = nx * side
            baseline = py + (0.3 * size if abs(ny * side) < 0.5 else (size if ny * side > 0 else -2))
            inward = "start" if ux < 0 else "end"
            for anchor in dict.fromkeys(("start" if sx > 0.35 else "end" if sx < -0.35 else "middle", inward)):
                candidates.append((px, baseline, anchor))
    for px, py, anchor in candidates:
        box = label_box(px, py, text, size, anchor)
        inside = bounds[0] <= box[0] and box[2] <= bounds[2] and bounds[1] <= box[1] and box[3] <= bounds[3]
        if (
            inside
            and not crosses_ring(box, cx, cy, r)
            and not any(_overlaps(box, t) for t in taken)
            and not any(_hits_segment(box, *seg) for seg in segments)
        ):
            taken.append(box)
            return px, py, anchor
    px, py, anchor = candidates[0]
    taken.append(label_box(px, py, text, size, anchor))
    return px, py, anchor


ZOOM_SEPARATION = 30
"""Pixels between the tips of neighbouring positions in the zoomed inset of a slow pair."""


def _plane(
    f: Figure,
    left: float,
    top: float,
    size: float,
    j: int,
    half: int,
    x: list[float],
    rotated: list[list[float]],
    expected: list[list[float]],
    wrong: list[list[bool]],
    positions: list[int],
    theta: float,
) -> float:
    """Pair j of x (channels j and j + d/2) in the plane, turned to each position by the student's apply_rope
    (`wrong`: the check's verdict per value); returns the y below its captions."""
    cx, cy = left + size / 2, top + size / 2
    radius = math.hypot(x[j], x[j + half])
    scale = (size / 2 - 26) / max(radius, 1e-9)
    R = radius * scale
    f.dwg.add(f.dwg.rect((left, top), (size, size), fill="#fcfcfc", stroke=RULE, stroke_width=0.6, class_="plane"))
    for x1, y1, x2, y2 in ((left + 8, cy, left + size - 8, cy), (cx, top + 8, cx, top + size - 8)):
        f.dwg.add(f.dwg.line((x1, y1), (x2, y2), stroke=RULE, stroke_width=0.8))
    circle = f.dwg.circle((cx, cy), R, fill="none", stroke=RULE, stroke_width=0.8, class_="orbit")
    circle["stroke-dasharray"] = "2,3"
    f.dwg.add(circle)
    base_angle = math.atan2(x[j + half], x[j])
    spread = theta * max(positions) > 0.3  # slow pairs: the vectors lie on top of each other
    vectors = []  # (p, got, want, bad, color)
    for i, p in enumerate(positions):
        got = (rotated[i][j], rotated[i][j + half])
        want = (expected[i][j], expected[i][j + half])
        bad = bool(wrong[i][j] or wrong[i][j + half])
        vectors.append((p, got, want, bad, stroke("wrong") if bad else POS_COLORS[i % len(POS_COLORS)]))
    for p, got, want, bad, color in vectors:
        if bad:
            _vector(f, cx, cy, *want, scale, INK, dashed=True, width=1.2, cls="expected-arrow")
        _vector(f, cx, cy, *got, scale, color, cls="arrow wrong" if bad else "arrow")
    segments = [(cx, cy, cx + g[0] * scale, cy - g[1] * scale) for _, g, _, _, _ in vectors]
    segments += [(cx, cy, cx + w[0] * scale, cy - w[1] * scale) for _, _, w, bad, _ in vectors if bad]
    bounds = (left + 4, top + 4, left + size - 4, top + size - 4)
    zoom = None if spread else _zoom_box(left, top, size, cx, cy, vectors)
    # the axes' names just inside the circle at the axes' ends, on the side away from the inset
    zx = zoom is not None and zoom[0] > cx  # the inset is right of the vertical axis
    zy = zoom is not None and zoom[1] < cy  # the inset is above the horizontal axis
    upper_left = zoom is not None and zy and not zx
    axis_labels = (
        (cx + R - 8, cy + (14 if zx and zy else -6), f"x[{j}]", "end"),
        (cx + (6 if upper_left else -6), cy - R + (32 if upper_left else 20), f"x[{j + half}]", "start" if upper_left else "end"),
    )  # (lower beside an inset: clear of its connector)
    taken = [label_box(lx, ly, s, SMALL, a) for lx, ly, s, a in axis_labels]
    for lx, ly, s, a in axis_labels:
        f.text(lx, ly, s, size=SMALL, anchor=a, mono=True, color=MUTED, cls="label")
    if zoom is not None:
        taken.append(zoom)
    arcs = []  # the angle arcs, as short segments
    for i, (p, *_) in enumerate(vectors):
        if p and spread:
            r_arc, steps = 22 + 13 * i, max(2, int(abs(p * theta) / 0.1))
            pts = [
                (cx + r_arc * math.cos(base_angle + p * theta * k / steps), cy - r_arc * math.sin(base_angle + p * theta * k / steps))
                for k in range(steps + 1)
            ]
            arcs += [(*a, *b) for a, b in zip(pts, pts[1:])]
    for i, (p, got, want, bad, color) in enumerate(vectors):
        if not spread and i:
            continue
        label = (f"p={p}" + (f" · {num(p * theta, 3)} rad" if p else "")) if spread else "p = " + ", ".join(map(str, positions))
        angle = math.atan2(got[1], got[0])
        tip = (cx + R * math.cos(angle), cy - R * math.sin(angle))
        lx, ly, anchor = _place(label, SMALL, tip, (cx, cy), R, bounds, taken, segments + arcs)
        f.text(lx, ly, label, size=SMALL, anchor=anchor, mono=True, color=color, weight="bold", cls="label")
        if p and spread:
            _arc(f, cx, cy, 22 + 13 * i, base_angle, base_angle + p * theta, color)
    if zoom is not None:
        _zoom(f, zoom, cx, cy, R, scale, vectors, theta)
    # Captions under the panel, never over the circle.
    y = top + size + 15
    f.text(left, y, tr("pair {j}: θ_{j} = {theta} rad per position", j=j, theta=num(theta, 4)), size=SMALL + 0.5, color=INK, cls="label")
    if any(bad for *_, bad, _ in vectors):
        f.text(left + size, y, tr("dashed: expected"), size=SMALL, anchor="end", color=INK, cls="label")
    if not spread:
        y += 14
        f.text(
            left,
            y,
            tr("≈ {degrees}° per position: the arrows overlap (zoomed in the inset);", degrees=num(math.degrees(theta), 2)),
            size=SMALL,
            color=MUTED,
            cls="label",
        )
        y += 13
        f.text(left, y, tr("slow pairs tell far positions apart"), size=SMALL, color=MUTED, cls="label")
    return y


def _zoom_box(left: float, top: float, size: float, cx: float, cy: float, vectors: list) -> Box:
    """The inset's place: the quadrant beside the one the expected tips point into (same half, other side)."""
    mx = sum(w[0] for _, _, w, _, _ in vectors) / len(vectors)
    my = sum(w[1] for _, _, w, _, _ in vectors) / len(vectors)
    w, h = size / 2 - 26, size / 2 - 44
    x0 = left + 10 if mx >= 0 else cx + 16
    y0 = top + 30 if my >= 0 else cy + 14
    return x0, y0, x0 + w, y0 + h


def _zoom(f: Figure, box: Box, cx: float, cy: float, R: float, scale: float, vectors: list, theta: float) -> None:
    """A magnified view of the expected tips of a slow pair, where the arrows of neighbouring positions
    part: the circle, the arrows (clipped to the inset) and a label at each tip."""
    x0, y0, x1, y1 = box
    # The inset shows the expected tips, and those of yours that lie among them.
    tips = [(cx + w[0] * scale, cy - w[1] * scale) for _, _, w, _, _ in vectors]
    ex, ey = sum(t[0] for t in tips) / len(tips), sum(t[1] for t in tips) / len(tips)
    reach = max(8.0, 3 * max(math.hypot(t[0] - ex, t[1] - ey) for t in tips))
    for _, g, _, bad, _ in vectors:
        tip = (cx + g[0] * scale, cy - g[1] * scale)
        if bad and math.hypot(tip[0] - ex, tip[1] - ey) <= reach:
            tips.append(tip)
    xs, ys = [t[0] for t in tips], [t[1] for t in tips]
    mx, my = (min(xs) + max(xs)) / 2, (min(ys) + max(ys)) / 2
    zoom = ZOOM_SEPARATION / max(R * theta, 1e-9)
    zoom = max(1.0, min(zoom, (x1 - x0 - 40) / max(max(xs) - min(xs), 1e-9), (y1 - y0 - 40) / max(max(ys) - min(ys), 1e-9)))
    ix, iy = (x0 + x1) / 2, (y0 + y1) / 2
    to_inset = lambda px, py: (ix + zoom * (px - mx), iy + zoom * (py - my))
    # where the inset looks, in the panel, joined to the inset
    sw, sh = (x1 - x0) / zoom, (y1 - y0) / zoom
    f.dwg.add(f.dwg.rect((mx - sw / 2, my - sh / 2), (sw, sh), fill="none", stroke=MUTED, stroke_width=0.8, class_="zoom-source"))
    near = min(((x, y) for x in (x0, x1) for y in (y0, y1)), key=lambda c: math.hypot(c[0] - mx, c[1] - my))
    f.dwg.add(f.dwg.line(near, (mx, my), stroke=MUTED, stroke_width=0.6, class_="zoom-source"))
    f.dwg.add(f.dwg.rect((x0, y0), (x1 - x0, y1 - y0), fill="#ffffff", stroke=MUTED, stroke_width=0.8, class_="zoom"))
    clip = f.dwg.defs.add(f.dwg.clipPath(id=f"{f.id}-zoom-{int(x0)}-{int(y0)}"))
    clip.add(f.dwg.rect((x0, y0), (x1 - x0, y1 - y0)))
    group = f.dwg.g(clip_path=f"url(#{clip['id']})", class_="zoomed")
    f.dwg.add(group)
    ocx, ocy = to_inset(cx, cy)
    orbit = f.dwg.circle((ocx, ocy), R * zoom, fill="none", stroke=RULE, stroke_width=0.8, class_="orbit zoomed")
    orbit["stroke-dasharray"] = "2,3"
    group.add(orbit)
    labels, segments = [], []
    for p, got, want, bad, color in vectors:
        for (vx, vy), c, dashed, cls in ([(want, INK, True, "expected-arrow zoomed")] if bad else []) + [
            (got, color, False, "arrow wrong zoomed" if bad else "arrow zoomed")
        ]:
            tx, ty = to_inset(cx + vx * scale, cy - vy * scale)
            length = math.hypot(tx - ocx, ty - ocy)
            ux, uy = (tx - ocx) / length, (ty - ocy) / length
            head = 8
            line = f.dwg.line((ocx, ocy), (tx - head * ux, ty - head * uy), stroke=c, stroke_width=1.2 if dashed else 1.6, class_=cls)
            if dashed:
                line["stroke-dasharray"] = "4,3"
            group.add(line)
            group.add(
                f.dwg.polygon(
                    [
                        (tx, ty),
                        (tx - head * ux - head * 0.45 * uy, ty - head * uy + head * 0.45 * ux),
                        (tx - head * ux + head * 0.45 * uy, ty - head * uy - head * 0.45 * ux),
                    ],
                    fill="none" if dashed else c,
                    stroke=c,
                    stroke_width=1,
                    class_=cls,
                )
            )
            segments.append((ocx, ocy, tx, ty))
            if not dashed:
                labels.append((tx, ty, ux, uy, f"p={p}", c))
    taken: list[Box] = []
    for tx, ty, ux, uy, label, c in labels:
        for d in (11, 15, 20, 26):  # outwards from the tip, until clear of the circle
            lx, ly = tx + ux * d, ty + uy * d + 0.3 * SMALL
            lbox = label_box(lx, ly, label, SMALL, "middle")
            if not crosses_ring(lbox, ocx, ocy, R * zoom, margin=1.5):
                break
        if x0 + 2 <= lbox[0] and lbox[2] <= x1 - 2 and y0 + 2 <= lbox[1] and lbox[3] <= y1 - 2:
            f.text(lx, ly, label, size=SMALL, anchor="middle", mono=True, color=c, weight="bold", cls="label zoomed")
            taken.append(lbox)
    # the magnification, in a corner no arrow or label uses
    note = tr("zoom ×{zoom}", zoom=f"{zoom:.0f}")
    for nx, ny, anchor in ((x0 + 4, y1 - 5, "start"), (x1 - 4, y1 - 5, "end"), (x0 + 4, y0 + 12, "start"), (x1 - 4, y0 + 12, "end")):
        nbox = label_box(nx, ny, note, SMALL - 1, anchor, mono=False)
        if (
            not any(_overlaps(nbox, t) for t in taken)
            and not any(_hits_segment(nbox, *g) for g in segments)
            and not crosses_ring(nbox, ocx, ocy, R * zoom, margin=1.5)
        ):
            break
    f.text(nx, ny, note, size=SMALL - 1, anchor=anchor, color=MUTED, cls="label zoomed")


@figure(
    "ch19-rope-pair",
    title="一个二维对子上的 RoPE",
    zh="x = [1, 2, 3, 4] 的 4 个通道分成两个二维对子 (x0, x2) 与 (x1, x3)。位置 p 把第 j 对旋转 p·θ_j:"
    "第 0 对每个位置转 1 弧度,第 1 对只转 0.01 弧度。真实 head 有 d/2 个对子,各有不同频率。",
    en="RoPE rotating one 2-D pair: head_dim 4 splits x = [1, 2, 3, 4] into the pairs (x0, x2) and (x1, x3) "
    "(half-split layout); position p turns pair j by p·θ_j, 1 radian per position for pair 0 and 0.01 for "
    "pair 1. A real head has d/2 pairs, each with its own frequency.",
    needs={"cos": "ch19.1", "rotated": "ch19.2"},
)
def rope_pair_figure(f: Figure, r: dict) -> None:
    x, positions, d, base = r["x"], r["positions"], r["head_dim"], r["base"]
    cos, sin, cos_want, sin_want = r["cos"], r["sin"], r["cos_expected"], r["sin_expected"]
    rotated, expected, wrong = r["rotated"], r["expected"], r["wrong"]
    half = d // 2
    thetas = [1.0 / base ** (2 * j / d) for j in range(half)]
    f.instance_row(
        [
            (f"x = [{', '.join(num(v) for v in x)}]", "plain"),
            (tr("head_dim d = {d} → {half} pairs", d=d, half=half), "plain"),
            (f"base = {num(base)}", "plain"),
            (tr("positions {positions}", positions=", ".join(map(str, positions))), "token"),
        ]
    )

    # 1. One frequency per pair, and the student's cos / sin of each position's angle.
    f.heading(tr("one frequency per pair: θ_j = 1 / base^(2j/d); your cos and sin of p·θ_j"))
    cw = 60

    def position(i: int, p: int) -> Part:
        names = row(*(centred(f.label(s, size=SMALL, mono=True), cw) for s in ("cos", "sin")), gap=2)
        values = column(
            *(
                f.vector(
                    [cos[i][j], sin[i][j]],
                    w=cw,
                    gap=2,
                    fmt=_num4,
                    wrong=[r["cos_wrong"][i][j], r["sin_wrong"][i][j]],
                    expected=[cos_want[i][j], sin_want[i][j]],
                    size=VALUE - 1,
                )
                for j in range(half)
            ),
            gap=8,
        )
        return column(centred(f.label(tr("position {p}", p=p)), names.w), names, values, gap=2)

    tables = [position(i, p) for i, p in enumerate(positions)]
    pairs = column(
        *(
            row(
                f.vector([tr("pair {j} = (x[{j}], x[{j2}])", j=j, j2=j + half)], role=PAIR_ROLES[j % 2], w=150, size=SMALL + 1, fmt=str),
                f.label(f"θ_{j} = {num(thetas[j], 4)}", mono=True, color=INK),
                gap=10,
                align="middle",
            )
            for j in range(half)
        ),
        gap=8,
    )
    f.place(row(pad(pairs, top=tables[0].h - pairs.h, right=12), *tables, gap=22, align="top"), after=28)

    # 2. The pairs in the plane, turned by the student's apply_rope.
    f.heading(tr("each pair turns in its own plane (your apply_rope outputs)"))
    size = 300
    gap = (f.width - 2 * MARGIN - 2 * size) / 1
    ptop = f.y + 8
    bottom: float = ptop + size
    for j in range(min(half, 2)):
        bottom = max(bottom, _plane(f, MARGIN + j * (size + gap), ptop, size, j, half, x, rotated, expected, wrong, positions, thetas[j]))
    mid = MARGIN + size + gap / 2
    notes = (tr("same x,"), tr("other frequency"), "", tr("dashed circle:"), tr("a rotation keeps"), tr("the pair's length"))
    for i, line in enumerate(notes):
        f.text(mid, ptop + size / 2 - 40 + 16 * i, line, size=SMALL + 1, anchor="middle", color=MUTED, cls="label")
    f.y = round(bottom) + 26

    # 3. The rotated vectors, cell by cell, under the tables of part 1.
    f.heading(tr("y = apply_rope(x): y[j] = x[j]·cos − x[j+d/2]·sin, y[j+d/2] = x[j+d/2]·cos + x[j]·sin"))
    ys = f.matrix(
        rotated,
        role=lambda i, c: PAIR_ROLES[(c % half) % 2],
        expected=expected,
        wrong=wrong,
        w=74,
        gap=4,
        fmt=_num4,
        col_labels=[tr("y[{c}] (pair {j})", c=c, j=c % half) for c in range(d)],
        row_labels=[tr("position {p}: angles {angles}", p=p, angles=", ".join(num(p * t, 3) for t in thetas[:2])) for p in positions],
    )
    f.place(ys, x=max(MARGIN, tables[0].right - tables[0].w - ys.label_w), after=22)
    f.note(
        tr(
            "Position {p}: pair 0 = ({a}, {b}) turned by {theta} rad gives ({ya}, {yb}); pair 1 barely moves. Pair j of a "
            "real head turns by θ_j = base^(−2j/d): Qwen3-0.6B has d = 128, i.e. 64 pairs, with base 1,000,000 their "
            "frequencies run from 1 down to {lowest} rad per position.",
            p=positions[1],
            a=num(x[0]),
            b=num(x[half]),
            theta=num(thetas[0], 3),
            ya=num(expected[1][0], 4),
            yb=num(expected[1][half], 4),
            lowest=f"{1e6 ** (-126 / 128):.7f}",
        ),
        size=SMALL + 2,
        color=INK,
    )
    bad = any(any(row) for row in wrong + r["cos_wrong"] + r["sin_wrong"])
    f.legend([("accent", tr("pair 0: channels 0 and 2")), ("token", tr("pair 1: channels 1 and 3"))], wrong=bad)


@figure(
    "ch19-nanovllm-order",
    title="nano-vllm 的实际执行顺序",
    zh="Qwen3Attention 的真实顺序:qkv 投影并切成 q | k | v,对 q、k 逐头做 RMSNorm(q_norm、k_norm),"
    "再按位置旋转 q 和 k;V 既不归一化也不旋转。最后注意力:查询对缓存中(已旋转)的 key 与新 key 打分,"
    "按权重混合未改动的 V。",
    en="The real execution order in nano-vllm's Qwen3Attention: the qkv projection split into q | k | v, a "
    "per-head RMSNorm of q and k (q_norm, k_norm), then RoPE on q and k at the token's position; V is "
    "neither normalised nor rotated. Then attention: the query scores the cached keys (stored rotated) and "
    "its own, and mixes the untouched values by those weights.",
    needs={"q_out": "ch19.3"},
)
def order_figure(f: Figure, r: dict) -> None:
    q, k, v = r["q"], r["k"], r["v"][0]
    p, d = r["position"], len(r["q"][0])
    # Stage 0: the projection, with Qwen3-0.6B's shapes.
    f.box(
        MARGIN,
        f.y,
        f.width - 2 * MARGIN,
        34,
        role="plain",
        label="hidden x [N, 1024] → qkv_proj → [N, 4096] = q (16·128) | k (8·128) | v (8·128)   (Qwen3-0.6B)",
        size=LABEL,
    )
    f.y += 34
    f.arrow(f.width / 2, f.y + 2, f.width / 2, f.y + 26)
    f.y += 26

    # One column per stage, one row per head: q heads, the k head, then v (split only).
    heads = [
        (tr("q head {h}", h=h), "q", q[h], r["q_normed"][h], r["q_out"][h], r["q_expected"][h], r["q_wrong"][h], r["q_weight"])
        for h in range(len(q))
    ]
    heads += [(tr("k head 0"), "k", k[0], r["k_normed"][0], r["k_out"][0], r["k_expected"][0], r["k_wrong"][0], r["k_weight"])]
    cw, row_h = 48, CELL + 26
    raw = [f.vector(x, role=role, w=cw, fmt=_small, size=VALUE - 1) for _, role, x, *_ in heads] + [
        f.vector(v, role="v", w=cw, fmt=_small, size=VALUE - 1)
    ]
    normed = [f.vector(n, role=role, w=cw, fmt=_small, size=VALUE - 1) for _, role, _, n, *_ in heads]
    out = [f.vector(o, role=role, w=cw, fmt=_small, wrong=bad, expected=want, size=VALUE - 1) for _, role, _, _, o, want, bad, _ in heads]
    rms = [f"rms {num(math.sqrt(sum(a * a for a in x) / d + 1e-6), 4)}, w = [{', '.join(num(a) for a in w)}]" for _, _, x, *_, w in heads]

    def stage(title: str, sub: str, parts: Sequence[Part]) -> Part:
        return column(
            f.label(title, size=LABEL, color=INK, bold=True, cls="heading"),
            f.label(sub, size=SMALL),
            space(h=6),
            *(pad(part, bottom=row_h - part.h) for part in parts),
            gap=2,
        )

    def name(s: str, role: str) -> Part:  # beside its row's cells, centred on them
        label = f.label(s, size=LABEL, color=stroke(role), bold=True)
        return pad(label, top=(CELL - label.h) / 2, bottom=row_h - (CELL + label.h) / 2)

    names = [name(s, role) for s, role, *_ in heads] + [name(tr("v head 0"), "v")]
    labels = column(space(h=stage("", "", []).h), *names, gap=2)
    stages = row(
        stage(tr("① split into heads"), tr("views of qkv: q [N, {hq}, {d}], k, v [N, 1, {d}]", hq=len(q), d=d), raw),
        stage(
            "② q_norm / k_norm",
            tr("per head, over head_dim: x / rms(x) · w"),
            [column(n, f.label(note, size=SMALL, mono=True), gap=4) for n, note in zip(normed, rms)],
        ),
        stage(tr("③ RoPE at position {p}", p=p), tr("pairs (x[j], x[j+{half}]) turn by p·θ_j", half=d // 2), out),
        gap=52,
    )
    f.place(row(wide(labels, 100), stages, gap=0), after=0)
    for h, (_, role, *_) in enumerate(heads):  # each head: split → normed → rotated
        for a, b in ((raw[h], normed[h]), (normed[h], out[h])):
            f.arrow(a.right + 6, a.bottom - CELL / 2, b.right - b.w - 6, a.bottom - CELL / 2, color=stroke(role))

    # V: straight past the norm and the rotation, into attention, fed by the rotated q, k and the untouched v.
    vy, ay = raw[-1].bottom - CELL / 2, raw[-1].bottom + 40
    vx, qx = out[-1].right - 28, out[-1].right - out[-1].w + 40
    stage_of = r.get("attn_stage", "") if "attn_out" in r else ""
    v_color = stroke("wrong") if stage_of == "v" else stroke("v")
    line = f.dwg.polyline(
        [(raw[-1].right + 6, vy), (vx, vy)],
        fill="none",
        stroke=v_color,
        stroke_width=1.6,
        class_="arrow wrong" if stage_of == "v" else "arrow",
    )
    line["stroke-dasharray"] = "4,3"
    f.dwg.add(line)
    f.arrow(vx, vy, vx, ay - 2, color=v_color, width=1.6, dashed=True)
    f.text(
        normed[0].right - normed[0].w / 2,
        vy - 6,
        tr("V: no norm, no rotation"),
        size=SMALL + 1,
        anchor="middle",
        color=stroke("v"),
        weight="bold",
        cls="label",
    )
    f.arrow(qx, out[-1].bottom + 4, qx, ay - 2, color=INK, width=1.4)
    f.text(qx + 6, ay - 8, "q, k", size=SMALL + 1, color=INK, cls="label")
    f.text(vx + 6, ay - 8, "v", size=SMALL + 1, color=v_color, cls="label")
    box_x, box_w = out[-1].right - out[-1].w - 20, out[-1].w + 40
    if "attn_out" not in r:
        f.box(box_x, ay, box_w, 34, role="attend", label=tr("④ attention(q, k, v), then o_proj"))
        f.y = round(ay) + 34 + 28
    else:
        f.y = round(ay)
        _attention_stage(f, r, box_x, box_w, cw, stage_of, out)
    f.note(
        tr(
            "Order matters: the norm weight w scales channel j and channel j + d/2 differently, so it acts before "
            "RoPE mixes them. With w = 1 both orders would agree, because a rotation keeps the rms. Hugging Face's "
            "Qwen3Attention does the same: q_norm(q_proj(x).view(…)), then apply_rotary_pos_emb on q and k only."
        ),
        size=SMALL + 2,
        color=INK,
    )
    wrong = any(any(bad) for *_, bad, _ in heads) or any(any(bad) for bad in r.get("attn_wrong", []))
    f.legend(
        [("q", tr("query heads")), ("k", tr("key head")), ("v", tr("value head (untouched)")), ("attend", tr("attention"))],
        wrong=wrong or bool(stage_of),
    )


MISTAKE_WORDS = {
    "rotated v": mark("V rotated too"),
    "rotated cached v": mark("V (cached too) rotated"),
    "normed v": mark("V through k_norm"),
    "v like k": mark("V normalised and rotated like k"),
    "only q": mark("only q rotated"),
    "only k": mark("only k rotated"),
    "no offset": mark("positions not offset by the cache"),
    "cache rotated again": mark("cached keys rotated a second time"),
    "after attention": mark("the attention output rotated instead of q, k"),
    "top-left mask": mark("a causal mask not offset by the cache"),
    "no mask": mark("no causal mask"),
    "grouped by repeat": mark("K/V heads grouped by repeat"),
    "no scale": mark("scores not scaled by 1/√d"),
    "attention in low precision": mark("attention computed in low precision"),
}
"""How the figure names the misconception the check found in a student's ch19.4 output (its record's key)."""
A_MISTAKE = mark("a mistake")
"""How it names one it does not know."""


def _attention_stage(f: Figure, r: dict, box_x: float, box_w: float, cw: float, stage_of: str, out: Sequence[Part]) -> None:
    """Stage ④ from the student's rope_attention: the keys (the cached one as stored, this token's rotated one)
    and the values (untouched), each query head's weights over them and its output; the stage a recognised
    mistake gets wrong is outlined, with the mistake named."""
    p, c = r["position"], len(r["attn_probs"][0]) - 1
    title = tr("④ in numbers (your rope_attention): the token at position {p} attends to keys 0 … {p}, {c} of them cached", p=p, c=c)
    f.box(box_x, f.y, box_w, 34, role="attend", label=tr("④ attention(q, k, v), then o_proj"))
    f.y += 34 + 22
    f.heading(title)
    f.y += 4

    def cells(values: Sequence[float], role: str, wrong: Sequence[bool] | None = None, expected: Sequence[float] | None = None) -> Part:
        return f.vector(values, role=role, wrong=wrong, expected=expected, w=cw, fmt=_small, size=VALUE - 1)

    kv_rows = [(tr("k, position {i} (cached, stored rotated)", i=i), "k", r["k_cache"][i]) for i in range(c)]
    kv_rows += [(tr("k, position {p} (rotated in ③)", p=p), "k", r["k_expected"][0])]
    kv_rows += [(tr("v, position {i} (cached)", i=i), "v", r["v_cache"][i]) for i in range(c)]
    kv_rows += [(tr("v, position {p} (untouched)", p=p), "v", r["v"][0])]
    gutter = max(text_width(s, SMALL + 1) for s, *_ in kv_rows) + 10

    def listed(rows: list) -> Part:
        return column(
            *(
                row(wide(f.label(s, size=SMALL + 1, color=stroke(role)), gutter), cells(x, role), gap=0, align="middle")
                for s, role, x in rows
            ),
            gap=6,
        )

    key_rows, value_rows = listed(kv_rows[: c + 1]), listed(kv_rows[c + 1 :])
    keys = column(key_rows, value_rows, gap=6)
    heads = []
    for h, (probs, y, want, bad) in enumerate(zip(r["attn_probs"], r["attn_out"], r["attn_expected"], r["attn_wrong"])):
        weights = cells(probs, "plain")
        result = cells(y, "q", wrong=bad, expected=want)
        heads.append(
            column(
                f.label(tr("q head {h}: weights over keys 0 … {p}, then out = Σ weight · v", h=h, p=p), size=SMALL + 1, color=stroke("q")),
                row(weights, f.label("→", size=LABEL, color=INK), result, gap=10, align="middle"),
                gap=4,
            )
        )
    right = column(*heads, gap=10)
    f.place(row(keys, right, gap=48), after=14)
    if stage_of:
        # A rotation gone wrong inside rope_attention is outlined where attention reads it, on the keys: stage ③ above
        # is the student's qk_norm_rope, judged by its own check (its cells marked only where that check failed).
        target = {"v": value_rows, "rope": key_rows, "attention": right}[stage_of]
        f.outline(target.right - target.w - 6, target.bottom - target.h - 5, target.w + 12, target.h + 10, role="wrong", dashed=True)
        where = {"v": tr("V's path"), "rope": tr("the rotated keys it should read"), "attention": tr("the attention step (④)")}[stage_of]
        named = tr(MISTAKE_WORDS.get(r.get("attn_mistake", ""), A_MISTAKE))
        lines = [tr("✗ your rope_attention's output is what {named} gives: {where} outlined", named=named, where=where)]
        if text_width(lines[0], LABEL, bold=True) > f.width - 2 * MARGIN:
            lines = [tr("✗ your rope_attention's output is what {named} gives:", named=named), tr("{where} outlined", where=where)]
        f.y += 8
        for line in lines:
            f.text(MARGIN, f.y, line, size=LABEL, color=stroke("wrong"), weight="bold", cls="label wrong")
            f.y += 20
        f.y += 4
        if stage_of == "rope" and not any(any(bad) for bad in r["q_wrong"] + r["k_wrong"]):
            f.text(
                MARGIN,
                f.y - 4,
                tr("③ shows your qk_norm_rope, and its values are right: the rotation goes wrong inside rope_attention"),
                size=SMALL + 1,
                color=INK,
                cls="label",
            )
            f.y += 20
