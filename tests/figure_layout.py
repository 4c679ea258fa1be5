"""A figure's layout read back from its SVG, for the tests: where each text is and how wide it is drawn
(figures.kit.text_width, the embedded fonts' own advance widths), its boxes and its lines.

The tests ask layout questions of a figure drawn from a real record: does every text stay on the canvas, does a
box hold the texts inside it with room to spare, does a reference line cross a label.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass

from figures.kit import text_width

SVG = "{http://www.w3.org/2000/svg}"


@dataclass(frozen=True)
class Text:
    s: str
    x: float
    y: float
    size: float
    anchor: str
    mono: bool
    bold: bool
    cls: str

    @property
    def width(self) -> float:
        return text_width(self.s, self.size, mono=self.mono, bold=self.bold)

    @property
    def left(self) -> float:
        return self.x - {"start": 0, "middle": 0.5, "end": 1}[self.anchor] * self.width

    @property
    def right(self) -> float:
        return self.left + self.width

    @property
    def top(self) -> float:
        return self.y - 0.8 * self.size

    @property
    def bottom(self) -> float:
        return self.y + 0.2 * self.size


@dataclass(frozen=True)
class Rect:
    x: float
    y: float
    w: float
    h: float
    cls: str

    def holds(self, t: Text) -> bool:
        """Whether the text's anchor point lies inside this rectangle."""
        return self.x <= t.x <= self.x + self.w and self.y <= t.y <= self.y + self.h


def parse(svg: str | ET.Element) -> ET.Element:
    return ET.fromstring(svg) if isinstance(svg, str) else svg


def texts(svg, *, cls: str | None = None) -> list[Text]:
    """Every text element that is not rotated, in document order (with its tspans' characters)."""
    out = []
    for el in parse(svg).iter(f"{SVG}text"):
        if el.get("transform"):
            continue
        c = el.get("class") or ""
        if cls is not None and cls not in c.split():
            continue
        out.append(
            Text(
                "".join(el.itertext()),
                float(el.get("x")),
                float(el.get("y")),
                float(el.get("font-size")),
                el.get("text-anchor") or "start",
                "mono" in (el.get("font-family") or "").lower(),
                (el.get("font-weight") or "normal") == "bold",
                c,
            )
        )
    return out


def rects(svg, *, cls: str | None = None) -> list[Rect]:
    out = []
    for el in parse(svg).iter(f"{SVG}rect"):
        c = el.get("class") or ""
        if cls is not None and cls not in c.split():
            continue
        if "%" in (el.get("width") or ""):
            continue
        out.append(Rect(float(el.get("x", 0)), float(el.get("y", 0)), float(el.get("width")), float(el.get("height")), c))
    return out


def lines(svg, *, cls: str) -> list[tuple[float, float, float, float]]:
    """The (x1, y1, x2, y2) of every line element of class `cls`."""
    return [
        (float(el.get("x1")), float(el.get("y1")), float(el.get("x2")), float(el.get("y2")))
        for el in parse(svg).iter(f"{SVG}line")
        if cls in (el.get("class") or "").split()
    ]


def curves(svg) -> list[tuple[float, float, float, float]]:
    """The (x1, y1, x2, y2) ends of every S-curve arrow (figures.kit.Figure.curve)."""
    out = []
    for el in parse(svg).iter(f"{SVG}path"):
        m = re.fullmatch(r"M([-\d.]+),([-\d.]+) C[-\d.]+,[-\d.]+ [-\d.]+,[-\d.]+ ([-\d.]+),([-\d.]+)", el.get("d", ""))
        if m and "arrow" in (el.get("class") or ""):
            out.append(tuple(map(float, m.groups())))
    return out


def width(svg) -> float:
    return float(parse(svg).get("width"))


def height(svg) -> float:
    return float(parse(svg).get("height"))


def off_canvas(svg, *, margin: float = 4) -> list[Text]:
    """The texts reaching closer than `margin` to the canvas's left or right edge."""
    w = width(svg)
    return [t for t in texts(svg) if t.left < margin or t.right > w - margin]


def cramped(svg, box: Rect, *, pad: float, cls: str | None = None) -> list[Text]:
    """The texts (of class `cls`) anchored inside `box` that come closer than `pad` to its left or right side."""
    return [t for t in texts(svg, cls=cls) if box.holds(t) and (t.left < box.x + pad or t.right > box.x + box.w - pad)]


def transposes(svg: str) -> list[str]:
    """The texts (all their characters) holding a transpose drawn as a raised T."""
    out = []
    for el in parse(svg).iter(f"{SVG}text"):
        raised = [t for t in el.iter(f"{SVG}tspan") if "transpose" in (t.get("class") or "")]
        if raised:
            assert all(t.text == "T" and float(t.get("baseline-shift")) > 0 for t in raised)
            out.append("".join(el.itertext()))
    return out


def overlap(a: Text, b: Text) -> bool:
    return a.left < b.right and b.left < a.right and a.top < b.bottom and b.top < a.bottom


_records: dict[str, dict] = {}


def reference_records(chapter: str) -> dict:
    """The figure records of `chapter` from the reference solutions (public checks), by figure id; collected
    once per test session."""
    if chapter not in _records:
        from grader.run import check

        _records[chapter] = check(chapter, solutions=True, hidden=False, figures_dir=None, seed=0).records
    return _records[chapter]


def reference_figures(chapter: str) -> dict[str, str]:
    """The SVG of each figure of `chapter` drawn from the reference's records, by id."""
    import figures

    records = reference_records(chapter)
    return {spec.id: spec.render(records[spec.id]) for spec in figures.catalog(chapter) if spec.id in records}
