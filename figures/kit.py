"""A small drawing kit on top of svgwrite: a figure with a header, cells that
carry values, grids, boxes, arrows, brackets and a legend.

Two ways to place things: at coordinates (`f.cell(x, y, …)`, `f.box(…)`), or as parts whose size is known
before they are placed (`f.matrix(…)`, `f.chip(…)`, `f.label(…)`, stacked with `figures.layout.row` and
`column`, put at the cursor by `f.place(…)`). Prefer parts: a figure then says what goes next to what.

Every text element gets a class ("title", "caption-zh", "caption-en", "label",
"value", "expected", "legend", "note") so tests can read a figure as a document.
A wrong cell shows the student's value struck through and the expected value
under it, on a hatched vermillion background with a ✗.

`Figure.svg()` embeds the fonts the figure's text needs (figures.typeface), and `text_width`
measures with those same fonts, so what a layout computes is what every viewer draws. It also writes every
text with its control and format characters escaped (a value or a name may come from a submission).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import svgwrite

from figures import typeface
from figures.layout import Part, column
from figures.style import (
    CAPTION,
    CELL,
    FONT,
    INK,
    LABEL,
    LABEL_SMALL,
    MARGIN,
    MONO,
    MUTED,
    PAPER,
    RULE,
    SMALL,
    TITLE,
    VALUE,
    WIDTH,
    fill,
    stroke,
)
from grader.i18n import tr


def text_width(s: str, size: float, mono: bool = False, bold: bool = False) -> float:
    """The rendered width: the sum of the embedded fonts' advance widths (figures.typeface; they
    have no kerning), or an estimate for a character no shipped font has (wide for CJK)."""
    w = 0.0
    for ch in s:
        em = typeface.advance(ch, mono=mono, bold=bold)
        if em is not None:
            w += size * em
        elif ord(ch) >= 0x2E80:
            w += size
        elif mono:
            w += size * 0.61
        else:
            w += size * (0.33 if ch in "il.,:;|!'" else 0.58)
    return w


def wrap(s: str, width: float, size: float) -> list[str]:
    """Break `s` into lines no wider than `width` (at spaces for Latin, anywhere for CJK)."""
    lines, line = [], ""
    for token in pieces(s):
        if line and text_width(line + token, size) > width:
            lines.append(line.rstrip())
            line = token.lstrip()
        else:
            line += token
    return lines + ([line.rstrip()] if line.strip() else [])


def pieces(s: str) -> list[str]:
    """`s` cut where a line may break: a word with the space after it, or one CJK character."""
    out, word = [], ""
    for ch in s:
        if ord(ch) >= 0x2E80:
            if word:
                out.append(word)
                word = ""
            out.append(ch)
        elif ch == " ":
            out.append(word + " ")
            word = ""
        else:
            word += ch
    return out + ([word] if word else [])


def num(x: Any, digits: int = 3) -> str:
    """A value as it is printed in a cell."""
    if isinstance(x, bool):
        return "T" if x else "F"
    if isinstance(x, float):
        if math.isinf(x):
            return "−∞" if x < 0 else "∞"
        if math.isnan(x):
            return "nan"
        if x == int(x) and abs(x) < 1e6:
            return str(int(x)).replace("-", "−")
        return f"{x:.{digits}g}".replace("-", "−")
    return str(x).replace("-", "−") if isinstance(x, int) else str(x)


class Figure:
    """An SVG figure being drawn top to bottom; `y` is the next free row."""

    def __init__(self, figure_id: str, *, title: str, zh: str, en: str, width: int = WIDTH) -> None:
        self.id, self.width = figure_id, width
        self._fonts = None  # the <style> with the embedded fonts, made by svg()
        self.dwg = svgwrite.Drawing(size=(width, 100), profile="full", debug=False, id=figure_id)
        self.dwg.set_desc(title=title, desc=en)
        self._hatch()
        self.dwg.add(self.dwg.rect((0, 0), ("100%", "100%"), fill=PAPER))
        self.y: float = MARGIN + TITLE
        self.text(MARGIN, self.y, title, size=TITLE, weight="bold", cls="title")
        self.text(width - MARGIN, MARGIN, figure_id, size=SMALL, anchor="end", mono=True, color=MUTED, cls="figure-id")
        self.y += 10
        for cls, caption, size in (("caption-zh", zh, CAPTION + 1), ("caption-en", en, CAPTION)):
            for line in wrap(caption, width - 2 * MARGIN, size):
                self.y += size + 6
                self.text(MARGIN, self.y, line, size=size, color=INK if cls == "caption-zh" else MUTED, cls=cls)
        self.y += 14
        self.dwg.add(self.dwg.line((MARGIN, self.y), (width - MARGIN, self.y), stroke=RULE, stroke_width=0.8))
        self.y += 22

    def _hatch(self) -> None:
        pattern = self.dwg.pattern(id="hatch-wrong", size=(6, 6), patternUnits="userSpaceOnUse", patternTransform="rotate(45)")
        pattern.add(self.dwg.rect((0, 0), (6, 6), fill=fill("wrong")))
        pattern.add(self.dwg.line((0, 0), (0, 6), stroke=stroke("wrong"), stroke_width=1.2, stroke_opacity=0.35))
        self.dwg.defs.add(pattern)

    # -- text -------------------------------------------------------------------------------
    def text(
        self,
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
        strike: bool = False,
    ) -> None:
        el = self.dwg.text(
            s,
            insert=(x, y),
            font_size=size,
            font_family=MONO if mono else FONT,
            fill=color,
            text_anchor=anchor,
            font_weight=weight,
            class_=cls,
        )
        if strike:
            el["text-decoration"] = "line-through"
        self.dwg.add(el)

    def paragraph(self, x: float, y: float, s: str, *, width: float, size: float = LABEL, color: str = MUTED, cls: str = "note") -> float:
        """Wrapped text starting at baseline y; returns the baseline after the last line."""
        for i, line in enumerate(wrap(s, width, size)):
            self.text(x, y + i * (size + 5), line, size=size, color=color, cls=cls)
        return y + max(len(wrap(s, width, size)) - 1, 0) * (size + 5)

    def heading(self, s: str, *, x: float = MARGIN) -> None:
        """A section label at the cursor; moves the cursor down."""
        self.text(x, self.y, s, size=LABEL + 1, weight="bold", cls="heading")
        self.y += 14

    # -- cells ------------------------------------------------------------------------------
    def cell(
        self,
        x: float,
        y: float,
        value: Any,
        *,
        role: str = "plain",
        w: float = CELL,
        h: float = CELL,
        expected: Any = None,
        wrong: bool = False,
        bold: bool = False,
        size: float = VALUE,
        fmt: Callable[[Any], str] = num,
        dashed: bool = False,
    ) -> None:
        """One cell with its value; `wrong=True` shows `expected` (unless None) under the struck-through value."""
        if wrong:
            self.dwg.add(
                self.dwg.rect((x, y), (w, h), fill="url(#hatch-wrong)", stroke=stroke("wrong"), stroke_width=2, class_="cell wrong")
            )
            self.text(
                x + w / 2,
                y + h * 0.44,
                fmt(value),
                size=size - 1,
                anchor="middle",
                mono=True,
                color=stroke("wrong"),
                cls="value wrong",
                strike=True,
            )
            if expected is not None:
                self.text(x + w / 2, y + h * 0.86, fmt(expected), size=size - 1, anchor="middle", mono=True, weight="bold", cls="expected")
            self.text(x + w - 2, y + 9, "✗", size=9, anchor="end", color=stroke("wrong"), cls="mark")
            return
        rect = self.dwg.rect((x, y), (w, h), fill=fill(role), stroke=stroke(role), stroke_width=1, class_="cell")
        if dashed:
            rect["stroke-dasharray"] = "3,2"
        self.dwg.add(rect)
        if value is not None and value != "":
            self.text(
                x + w / 2,
                y + h / 2 + size * 0.36,
                fmt(value),
                size=size,
                anchor="middle",
                mono=True,
                weight="bold" if bold else "normal",
                cls="value",
            )

    def grid(
        self,
        x: float,
        y: float,
        values: Sequence[Sequence[Any]],
        *,
        role: str | Callable[[int, int], str] = "plain",
        expected: Sequence[Sequence[Any]] | None = None,
        row_labels: Sequence[str] | None = None,
        col_labels: Sequence[str] | None = None,
        w: float = CELL,
        h: float = CELL,
        gap: float = 0,
        fmt: Callable[[Any], str] = num,
        same: Callable[[Any, Any], bool] | None = None,
        wrong: Sequence[Sequence[bool]] | None = None,
        size: float = VALUE,
        bold: bool | Callable[[int, int], bool] = False,
        dashed: bool | Callable[[int, int], bool] = False,
        label_w: float | None = None,
    ) -> tuple[float, float]:
        """A matrix of cells; cells the check found wrong (`wrong`, its verdict per cell), or else differing from
        `expected`, are marked with the expected value. `size` is the values' font size; `bold` and `dashed` may
        depend on the cell. A row label may have a second line after "\\n" (in small type); `label_w` fixes the
        labels' gutter, so grids stacked with the same gutter line up. Returns (width, height)."""
        same = same or (lambda a, b: a == b)
        top = y + (16 if col_labels else 0)
        left = x + (row_label_width(row_labels) if label_w is None else label_w)
        for j, label in enumerate(col_labels or []):
            self.text(left + j * (w + gap) + w / 2, top - 5, label, size=SMALL + 1, anchor="middle", color=MUTED, cls="label")
        for i, row in enumerate(values):
            if row_labels:
                first, _, second = row_labels[i].partition("\n")
                mid = top + i * (h + gap) + h / 2
                self.text(left - 8, mid + 4 - (6 if second else 0), first, size=SMALL + 1, anchor="end", color=MUTED, cls="label")
                if second:
                    self.text(left - 8, mid + 12, second, size=SMALL, anchor="end", color=MUTED, cls="label")
            for j, v in enumerate(row):
                r = role(i, j) if callable(role) else role
                bad = bool(wrong[i][j]) if wrong is not None else expected is not None and not same(v, expected[i][j])
                self.cell(
                    left + j * (w + gap),
                    top + i * (h + gap),
                    v,
                    role=r,
                    w=w,
                    h=h,
                    fmt=fmt,
                    wrong=bad,
                    expected=expected[i][j] if bad and expected is not None else None,
                    size=size,
                    bold=bold(i, j) if callable(bold) else bold,
                    dashed=dashed(i, j) if callable(dashed) else dashed,
                )
        cols = max((len(r) for r in values), default=0)
        return left - x + cols * (w + gap) - gap, top - y + len(values) * (h + gap) - gap

    # -- shapes -----------------------------------------------------------------------------
    def box(
        self,
        x: float,
        y: float,
        w: float,
        h: float,
        *,
        role: str = "plain",
        label: str | None = None,
        size: float = LABEL,
        dashed: bool = False,
        rx: float = 5,
        mono: bool = False,
    ) -> None:
        rect = self.dwg.rect((x, y), (w, h), rx=rx, fill=fill(role), stroke=stroke(role), stroke_width=1.3, class_="box")
        if dashed:
            rect["stroke-dasharray"] = "4,3"
        self.dwg.add(rect)
        if label:
            self.text(x + w / 2, y + h / 2 + size * 0.36, label, size=size, anchor="middle", mono=mono, cls="label")

    CHIP_PAD = 14
    """The least room between a chip's text and each of its sides (`instance_row`)."""

    def instance_row(self, items: Sequence[tuple], *, mono: bool = False, note: str = "") -> None:
        """The figure's instance as a row of small labelled boxes, each `(label, role)` or
        `(label, role, width)`; the row wraps at the right margin. A box is never narrower than
        its text plus `CHIP_PAD` on either side, whatever width is asked for. `note` follows the boxes
        (wrapped beside them when it fits in two lines, else on lines of its own below)."""
        x, y = MARGIN, self.y
        for label, role, *width in items:
            w = max([text_width(label, LABEL, mono) + 2 * self.CHIP_PAD] + width[:1])
            if x > MARGIN and x + w > self.width - MARGIN:
                x, y = MARGIN, y + 30 + 10
            self.box(x, y, w, 30, role=role, label=label, mono=mono)
            x += w + 12
        self.y = y + 30 + 30
        if note:
            size, room = LABEL_SMALL + 0.5, self.width - MARGIN - x - 4
            lines = wrap(note, room, size) if room > 120 else []
            if lines and len(lines) <= 2:
                top = y + 15 - (len(lines) - 1) * (size + 4) / 2 + size * 0.36
                for k, line in enumerate(lines):
                    self.text(x + 4, top + k * (size + 4), line, size=size, color=MUTED, cls="note")
            else:
                self.y -= 14
                self.note(note, size=size)
                self.y += 8

    def arrow(
        self, x1: float, y1: float, x2: float, y2: float, *, color: str = MUTED, width: float = 1.3, head: float = 6, dashed: bool = False
    ) -> None:
        """A straight arrow from (x1, y1) to (x2, y2)."""
        angle = math.atan2(y2 - y1, x2 - x1)
        bx, by = x2 - head * math.cos(angle), y2 - head * math.sin(angle)
        line = self.dwg.line((x1, y1), (bx, by), stroke=color, stroke_width=width, class_="arrow")
        if dashed:
            line["stroke-dasharray"] = "4,3"
        self.dwg.add(line)
        left = (bx + head * 0.5 * math.sin(angle), by - head * 0.5 * math.cos(angle))
        right = (bx - head * 0.5 * math.sin(angle), by + head * 0.5 * math.cos(angle))
        self.dwg.add(self.dwg.polygon([(x2, y2), left, right], fill=color))

    def curve(self, x1: float, y1: float, x2: float, y2: float, *, color: str = MUTED, width: float = 1.2, head: float = 6) -> None:
        """A vertical S-curve arrow from (x1, y1) down (or up) to (x2, y2)."""
        my = (y1 + y2) / 2
        path = self.dwg.path(
            d=f"M{x1},{y1} C{x1},{my} {x2},{my} {x2},{y2 - math.copysign(head, y2 - y1)}",
            fill="none",
            stroke=color,
            stroke_width=width,
            class_="arrow",
        )
        self.dwg.add(path)
        s = math.copysign(1, y2 - y1)
        self.dwg.add(self.dwg.polygon([(x2, y2), (x2 - head * 0.5, y2 - s * head), (x2 + head * 0.5, y2 - s * head)], fill=color))

    def bracket(
        self, x1: float, x2: float, y: float, label: str, *, below: bool = True, color: str = MUTED, size: float = SMALL + 1
    ) -> None:
        """A bracket spanning x1..x2 with a label under (or over) it."""
        d = 5 if below else -5
        self.dwg.add(
            self.dwg.polyline([(x1, y), (x1, y + d), (x2, y + d), (x2, y)], fill="none", stroke=color, stroke_width=1, class_="bracket")
        )
        self.text((x1 + x2) / 2, y + d + (size + 3 if below else -4), label, size=size, anchor="middle", color=color, cls="label")

    def legend(self, items: Sequence[tuple[str, str]], *, wrong: bool = False, x: float = MARGIN) -> None:
        """Swatches with labels in a row (wrapping); `wrong=True` adds the swatch of wrong cells."""
        cx, y = x, self.y
        if wrong:
            items = [*items, ("wrong", tr("wrong: yours struck through, expected below"))]
        for role, label in items:
            width = 18 + 6 + text_width(label, SMALL + 1) + 18
            if cx + width > self.width - MARGIN:
                cx, y = x, y + 22
            self.dwg.add(
                self.dwg.rect(
                    (cx, y - 11),
                    (18, 14),
                    fill="url(#hatch-wrong)" if role == "wrong" else fill(role),
                    stroke=stroke(role),
                    stroke_width=1.5 if role == "wrong" else 1,
                )
            )
            self.text(cx + 24, y, label, size=SMALL + 1, color=MUTED, cls="legend")
            cx += width
        self.y = y + 12

    def bars(
        self,
        x: float,
        y: float,
        values: Sequence[float],
        *,
        labels: Sequence[str],
        height: float = 120,
        bar_w: float = 44,
        gap: float = 14,
        role: str | Sequence[str] = "plain",
        expected: Sequence[float] | None = None,
        top: float | None = None,
        fmt: Callable[[Any], str] = num,
        tol: float = 1e-6,
    ) -> tuple[float, float]:
        """Vertical bars on a baseline with their values above and labels below.

        A bar whose value differs from `expected` is hatched, and the expected
        height is drawn as a dashed outline with its value. Returns (width, height).
        """
        finite = [v for v in list(values) + list(expected or []) if isinstance(v, (int, float)) and math.isfinite(v)]
        top = top or max([abs(v) for v in finite] + [1e-12])
        base = y + height
        for i, v in enumerate(values):
            bx = x + i * (bar_w + gap)
            r = role[i] if not isinstance(role, str) else role
            want = expected[i] if expected is not None else v
            bad = expected is not None and not (abs(v - want) <= tol * max(1.0, abs(want)) or v == want)
            h = height * max(v, 0) / top if math.isfinite(v) else 0
            if bad:
                hw = height * max(want, 0) / top if math.isfinite(want) else 0
                outline = self.dwg.rect((bx, base - hw), (bar_w, hw), fill="none", stroke=INK, stroke_width=1, class_="expected-bar")
                outline["stroke-dasharray"] = "3,2"
                self.dwg.add(outline)
                self.text(
                    bx + bar_w / 2, base - max(h, hw) - 18, fmt(want), size=SMALL, anchor="middle", mono=True, weight="bold", cls="expected"
                )
            self.dwg.add(
                self.dwg.rect(
                    (bx, base - h),
                    (bar_w, h),
                    fill="url(#hatch-wrong)" if bad else fill(r),
                    stroke=stroke("wrong") if bad else stroke(r),
                    stroke_width=1.5 if bad else 1,
                    class_="bar wrong" if bad else "bar",
                )
            )
            self.text(
                bx + bar_w / 2,
                base - h - 5,
                fmt(v),
                size=SMALL,
                anchor="middle",
                mono=True,
                color=stroke("wrong") if bad else INK,
                cls="value wrong" if bad else "value",
                strike=bad,
            )
            self.text(bx + bar_w / 2, base + 15, labels[i], size=SMALL + 0.5, anchor="middle", color=MUTED, cls="label")
        width = len(values) * (bar_w + gap) - gap
        self.dwg.add(self.dwg.line((x - 4, base), (x + width + 4, base), stroke=RULE, stroke_width=1))
        return width, height + 22

    def outline(
        self,
        x: float,
        y: float,
        w: float,
        h: float,
        *,
        role: str = "accent",
        dashed: bool = False,
        width: float = 2.2,
        inset: float = 0,
        cls: str = "outline",
        color: str | None = None,
    ) -> None:
        """An empty rectangle around (x, y, w, h), `inset` inside it (negative: outside), in the role's colour."""
        rect = self.dwg.rect(
            (x + inset, y + inset),
            (w - 2 * inset, h - 2 * inset),
            fill="none",
            stroke=color or stroke(role),
            stroke_width=width,
            class_=cls,
        )
        if dashed:
            rect["stroke-dasharray"] = "4,3"
        self.dwg.add(rect)

    def vbracket(
        self, x: float, y1: float, y2: float, label: str = "", *, side: str = "right", color: str = MUTED, size: float = LABEL_SMALL
    ) -> None:
        """A vertical bracket spanning y1..y2 at x, opening towards the rows; its label (lines split at "\n")
        beside it on `side`, the side away from the rows."""
        d = 6 if side == "right" else -6
        self.dwg.add(
            self.dwg.polyline(
                [(x, y1 + 2), (x + d, y1 + 2), (x + d, y2 - 2), (x, y2 - 2)], fill="none", stroke=color, stroke_width=1.3, class_="bracket"
            )
        )
        lines = label.split("\n") if label else []
        mid = (y1 + y2) / 2 - (len(lines) - 1) * (size + 3) / 2
        for k, line in enumerate(lines):
            self.text(
                x + (14 if side == "right" else -14),
                mid + k * (size + 3) + size * 0.36,
                line,
                size=size,
                color=color,
                anchor="start" if side == "right" else "end",
                cls="label",
            )

    # -- parts (figures.layout) ---------------------------------------------------------------
    def place(self, part: Part, *, x: float = MARGIN, after: float = 24) -> Part:
        """Draw `part` at the cursor (left edge `x`) and move the cursor `after` below it."""
        part.at(x, self.y)
        self.y += part.h + after
        return part

    def label(
        self, s: str, *, size: float = LABEL_SMALL, color: str = MUTED, mono: bool = False, bold: bool = False, cls: str = "label"
    ) -> Part:
        """One line of text as a part (its box: the line's width, one line high)."""
        return Part(
            text_width(s, size, mono, bold),
            size * 1.25,
            lambda x, y: self.text(x, y + size, s, size=size, color=color, mono=mono, weight="bold" if bold else "normal", cls=cls),
        )

    def lines(
        self, *lines: str, size: float = LABEL_SMALL, color: str = MUTED, mono: bool = False, cls: str = "label", gap: float = 3
    ) -> Part:
        """Several lines of text, one under another."""
        return column(*(self.label(s, size=size, color=color, mono=mono, cls=cls) for s in lines), gap=gap)

    def text_block(self, s: str, *, width: float, size: float = LABEL_SMALL, color: str = MUTED, cls: str = "note") -> Part:
        """Text wrapped to `width`."""
        return self.lines(*wrap(s, width, size), size=size, color=color, cls=cls, gap=5)

    def chip(self, label: str, *, role: str = "plain", mono: bool = False, w: float = 0, h: float = 30) -> Part:
        """A small labelled box, never narrower than its text plus `CHIP_PAD` on either side."""
        width = max(text_width(label, LABEL, mono) + 2 * self.CHIP_PAD, w)
        return Part(width, h, lambda x, y: self.box(x, y, width, h, role=role, label=label, mono=mono))

    def table(
        self,
        rows: Sequence[Sequence[Any]],
        *,
        header: Sequence[str] | None = None,
        h: float = CELL,
        gap: float = 18,
        size: float = LABEL,
        mono: bool = False,
        color: str = INK,
        row_gap: float = 0,
    ) -> Part:
        """Columns of text, one line per row, each row `h` high and centred in it, under an optional `header`
        16 px high: beside a `matrix` of the same row height (placed with `row(..., align="top")`), row i of
        the text sits on row i of the cells (give `row_gap` the matrix's `gap`). A cell is a string, or
        `(string, {"color", "bold", "mono"})`."""
        cells = [[c if isinstance(c, tuple) else (str(c), {}) for c in r] for r in rows]
        ncols = max([len(r) for r in cells] + [len(header or [])])
        widths = [
            max(
                [text_width(r[j][0], size, r[j][1].get("mono", mono), r[j][1].get("bold", False)) for r in cells if j < len(r)]
                + ([text_width(header[j], LABEL_SMALL)] if header and j < len(header) else [])
                + [0]
            )
            for j in range(ncols)
        ]
        top = 16 if header else 0

        def draw(x: float, y: float) -> None:
            xs = [x + sum(widths[:j]) + gap * j for j in range(ncols)]
            for j, label in enumerate(header or []):
                self.text(xs[j], y + top - 5, label, size=LABEL_SMALL, color=MUTED, cls="label")
            for i, r in enumerate(cells):
                for j, (s, style) in enumerate(r):
                    self.text(
                        xs[j],
                        y + top + i * (h + row_gap) + h / 2 + size * 0.36,
                        s,
                        size=size,
                        mono=style.get("mono", mono),
                        color=style.get("color", color),
                        weight="bold" if style.get("bold") else "normal",
                        cls=style.get("cls", "value"),
                    )

        return Part(sum(widths) + gap * max(ncols - 1, 0), top + len(cells) * (h + row_gap) - (row_gap if cells else 0), draw)

    def framed(
        self, part: Part, *, w: float | None = None, role: str = "plain", dashed: bool = False, inset: float = 12, rx: float = 5
    ) -> Part:
        """The part in a box (drawn behind it), `inset` from its sides; `w` widens the box to a column's width."""
        width = max(w or 0, part.w + 2 * inset)
        h = part.h + 2 * inset

        def draw(x: float, y: float) -> None:
            self.box(x, y, width, h, role=role, dashed=dashed, rx=rx)
            part.at(x + inset, y + inset)

        return Part(width, h, draw)

    def bar_chart(
        self, values: Sequence[float], *, labels: Sequence[str], height: float = 120, bar_w: float = 44, gap: float = 14, **bars: Any
    ) -> Part:
        """`bars` as a part, with room above the tallest bar for its value and below for the labels."""
        return Part(
            len(values) * (bar_w + gap) - gap,
            18 + height + 22,
            lambda x, y: self.bars(x, y + 18, values, labels=labels, height=height, bar_w=bar_w, gap=gap, **bars),
        )

    def hline(self, w: float, *, color: str = RULE, dashed: bool = False, width: float = 1.2, cls: str = "rule") -> Part:
        """A horizontal line `w` long (a threshold, a separator), as a part 8 px high."""

        def draw(x: float, y: float) -> None:
            line = self.dwg.line((x, y + 4), (x + w, y + 4), stroke=color, stroke_width=width, class_=cls)
            if dashed:
                line["stroke-dasharray"] = "5,3"
            self.dwg.add(line)

        return Part(w, 8, draw)

    def titled(self, title: str, part: Part, *, color: str = INK, size: float = LABEL, gap: float = 8) -> Part:
        """A part with a bold title above it."""
        return column(self.label(title, size=size, color=color, bold=True, cls="heading"), part, gap=gap)

    def matrix(
        self,
        values: Sequence[Sequence[Any]],
        *,
        role: str | Callable[[int, int], str] = "plain",
        expected: Sequence[Sequence[Any]] | None = None,
        wrong: Sequence[Sequence[bool]] | None = None,
        row_labels: Sequence[str] | None = None,
        col_labels: Sequence[str] | None = None,
        w: float = CELL,
        h: float = CELL,
        gap: float = 0,
        fmt: Callable[[Any], str] = num,
        size: float = VALUE,
        bold: bool | Callable[[int, int], bool] = False,
        dashed: bool | Callable[[int, int], bool] = False,
        label_w: float | None = None,
    ) -> "Grid":
        """A grid of cells as a part (`grid`'s cells, labels and wrong marks); `cell_box(i, j)` once placed."""
        return Grid(
            self,
            values,
            role=role,
            expected=expected,
            wrong=wrong,
            row_labels=row_labels,
            col_labels=col_labels,
            w=w,
            h=h,
            gap=gap,
            fmt=fmt,
            size=size,
            bold=bold,
            dashed=dashed,
            label_w=label_w,
        )

    def vector(
        self,
        values: Sequence[Any],
        *,
        role: str | Callable[[int], str] = "plain",
        wrong: Sequence[bool] | None = None,
        expected: Sequence[Any] | None = None,
        w: float = CELL,
        h: float = CELL,
        gap: float = 0,
        size: float = VALUE,
        fmt: Callable[[Any], str] = num,
        bold: bool = False,
        dashed: bool = False,
    ) -> "Grid":
        """One row of cells (`matrix` of one row): `role` may depend on the cell's index; `wrong` is the check's
        verdict per cell, and a wrong cell shows its `expected` value."""
        return self.matrix(
            [values],
            role=(lambda _, j: role(j)) if callable(role) else role,
            wrong=[wrong] if wrong is not None else None,
            expected=[expected] if expected is not None else None,
            w=w,
            h=h,
            gap=gap,
            size=size,
            fmt=fmt,
            bold=bold,
            dashed=dashed,
        )

    def mask(
        self,
        values: Sequence[Sequence[bool]],
        *,
        expected: Sequence[Sequence[bool]] | None = None,
        row_labels: Sequence[str] | None = None,
        col_labels: Sequence[str] | None = None,
        w: float = CELL,
        h: float = CELL,
    ) -> "Grid":
        """A bool mask as cells: True may attend (blue), False hidden (grey); wrong cells marked against
        `expected` (a mask's verdict is exact)."""
        return self.matrix(
            values,
            role=lambda i, j: "attend" if values[i][j] else "masked",
            expected=expected,
            row_labels=row_labels,
            col_labels=col_labels,
            w=w,
            h=h,
        )

    def note(self, s: str, *, x: float = MARGIN, color: str = MUTED, size: float = LABEL) -> None:
        """A wrapped note at the cursor, full width; moves the cursor below it."""
        self.y = self.paragraph(x, self.y, s, width=self.width - x - MARGIN, size=size, color=color) + size + 8

    def svg(self) -> str:
        """The finished document, its height fitted to what was drawn, with its fonts embedded."""
        self.dwg["height"] = math.ceil(self.y + MARGIN)
        self.dwg["viewBox"] = f"0 0 {self.width} {math.ceil(self.y + MARGIN)}"
        _escape_texts(self.dwg)
        self._embed_fonts()
        return self.dwg.tostring()

    def _embed_fonts(self) -> None:
        """Subsets of the shipped fonts holding the characters drawn, as @font-face rules in the
        figure's <style>; every text element names those families before its own."""
        texts = []
        for el in _texts(self.dwg):
            family = el.attribs.get("font-family") or FONT
            own = ", ".join(f for f in family.split(", ") if not f.startswith("cf-"))  # svg() may run twice
            el["font-family"] = own
            kind = typeface.kind_of(own)
            bold = str(el.attribs.get("font-weight", "normal")) in ("bold", "bolder", "600", "700", "800", "900")
            texts.append((el, kind, bold, "".join(_strings(el))))
        css, prefix = typeface.embed((s, kind, bold) for _, kind, bold, s in texts)
        for el, kind, _, _ in texts:
            if prefix.get(kind):
                el["font-family"] = f"{prefix[kind]}, {el['font-family']}"
        if self._fonts is not None:
            self.dwg.defs.elements.remove(self._fonts)
            self._fonts = None
        if css:
            self._fonts = self.dwg.style(css)
            self.dwg.defs.add(self._fonts)


def _escape_texts(element) -> None:
    """Every text of the document (text and tspan elements, title and desc, attribute values) with its
    control and format characters as escapes (`grader.delivery.escape.plain`): a value or a name drawn from a
    submission may hold them, and XML has no place for most (the file would not parse) nor a page for a bidi
    override. svgwrite escapes markup (`<`, `&`, quotes) when it writes the document."""
    from grader.delivery.escape import plain

    for child in getattr(element, "elements", []):
        if isinstance(getattr(child, "text", None), str):
            child.text = plain(child.text)
        xml = getattr(child, "xml", None)  # svgwrite's title and desc hold their own element
        if xml is not None and isinstance(xml.text, str):
            xml.text = plain(xml.text)
        for name, value in getattr(child, "attribs", {}).items():
            if isinstance(value, str):
                child.attribs[name] = plain(value)
        _escape_texts(child)


def _texts(element) -> list:
    """The text elements under an svgwrite element, in document order."""
    out = []
    for child in getattr(element, "elements", []):
        if getattr(child, "elementname", "") == "text":
            out.append(child)
        else:
            out.extend(_texts(child))
    return out


def _strings(element) -> list[str]:
    """The characters a text element draws: its own text and its tspans'."""
    text = getattr(element, "text", None)
    out = [] if text is None else [str(text)]
    for child in getattr(element, "elements", []):
        out.extend(_strings(child))
    return out


class Grid(Part):
    """`Figure.matrix`: a grid of cells whose cells can be found once it is placed (`cell_box`)."""

    def __init__(
        self,
        f: Figure,
        values: Sequence[Sequence[Any]],
        *,
        row_labels: Sequence[str] | None,
        col_labels: Sequence[str] | None,
        w: float,
        h: float,
        gap: float,
        label_w: float | None = None,
        **cells: Any,
    ) -> None:
        self.rows, self.cols = len(values), max((len(r) for r in values), default=0)
        self.cw, self.ch, self.gap = w, h, gap
        self.label_w = row_label_width(row_labels) if label_w is None else label_w
        self.label_h = 16 if col_labels else 0
        super().__init__(
            self.label_w + self.cols * (w + gap) - (gap if self.cols else 0),
            self.label_h + self.rows * (h + gap) - (gap if self.rows else 0),
            lambda x, y: f.grid(
                x, y, values, row_labels=row_labels, col_labels=col_labels, w=w, h=h, gap=gap, label_w=self.label_w, **cells
            ),
        )

    def cell_box(self, i: int, j: int) -> tuple[float, float, float, float]:
        """(x, y, w, h) of cell (i, j); j may be `cols` (the right edge) and i `rows` (the bottom edge)."""
        x, y = self._placed()
        return (x + self.label_w + j * (self.cw + self.gap), y + self.label_h + i * (self.ch + self.gap), self.cw, self.ch)

    def span_box(self, i1: int, j1: int, i2: int, j2: int) -> tuple[float, float, float, float]:
        """(x, y, w, h) of the cells from (i1, j1) to (i2, j2) inclusive."""
        x1, y1, _, _ = self.cell_box(i1, j1)
        x2, y2, w, h = self.cell_box(i2, j2)
        return x1, y1, x2 + w - x1, y2 + h - y1


def row_label_width(labels: Sequence[str] | None) -> float:
    """The gutter a grid's row labels need (their first lines at the label size, second lines small)."""
    if not labels:
        return 0
    widths = []
    for label in labels:
        first, _, second = label.partition("\n")
        widths += [text_width(first, LABEL_SMALL), text_width(second, SMALL)]
    return max(widths) + 8
