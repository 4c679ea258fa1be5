"""Drawing a figure for an instance the page chose: as wide as its content needs.

The catalog's figures are laid out for their canonical instance at the course's standard
width. A lab instance may be a little wider (more tokens, more heads); `fit` draws the
figure, measures how far its cells, arrows and labels reach, and draws it again on a
wider canvas when they pass the right margin, up to `MAX_WIDTH`.

A record whose values were not compared with expected ones (`checked=False`: a student
release has no answer for this instance) is drawn under a line that says so, and
marks nothing.
"""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET

from figures import FigureSpec
from figures.kit import Figure, text_width
from figures.style import INK, LABEL, MARGIN, WIDTH
from grader.i18n import mark, tr

MAX_WIDTH = 1400
SLACK = 20
"""Pixels the estimate may pass the margin by: text widths are estimated (the catalog's canonical figures
measure up to 894 at width 880 and fit)."""
SVG = "{http://www.w3.org/2000/svg}"
WRAPPED = {"title", "caption-zh", "caption-en", "figure-id", "note", "legend", "heading"}
"""Text that follows the canvas width (wrapped or right-aligned), so it never decides it."""


UNCHECKED = mark(
    "Not compared with an answer: none ships with the student release for this instance, so these "
    "are your values as they came, nothing is marked and no text below vouches for them; only the chapter's "
    "rules that need no answer were checked (see the status). The lab's starting instance has its answer recorded."
)


class TooWide(ValueError):
    """The instance needs a wider figure than the page can show."""


def render(spec: FigureSpec, record: dict, width: int = WIDTH) -> str:
    zh, en = spec.captions(record)
    fig = Figure(spec.id, title=spec.title, zh=zh, en=en, width=width)
    if record.get("checked") is False:
        size = LABEL + 1
        fig.y = (
            fig.paragraph(MARGIN, fig.y, tr(UNCHECKED), width=width - 2 * MARGIN, size=size, color=INK, cls="note unchecked") + size + 16
        )
    spec.draw(fig, record)
    return fig.svg()


def fit(spec: FigureSpec, record: dict) -> str:
    """The figure at the standard width, or wider when its content needs it; raises TooWide past MAX_WIDTH.

    A widening overshoots by the overflow: figures that split the width into panels move their right
    panel by half of what the canvas gains, and this settles them in a step or two."""
    width = WIDTH
    for _ in range(6):
        svg = render(spec, record, width)
        needed = math.ceil(reach(svg, width) + MARGIN)
        if needed <= width + SLACK:
            return svg
        if width >= MAX_WIDTH:
            break
        width = min(MAX_WIDTH, needed + (needed - width))
    raise TooWide(tr("this instance needs a figure wider than {width} px: choose a smaller one", width=MAX_WIDTH))


def reach(svg: str, width: float) -> float:
    """How far right the drawing's content goes (text by its estimated width)."""
    root = ET.fromstring(svg)
    far = 0.0
    for el in root.iter():
        tag = el.tag.removeprefix(SVG)
        if tag == "pattern":
            continue
        if tag == "rect" and not el.get("width", "").endswith("%") and (x := el.get("x")) is not None:
            far = max(far, float(x) + float(el.get("width", 0)))
        elif tag == "line":
            x1, x2 = float(el.get("x1", 0)), float(el.get("x2", 0))
            if not (x1 == MARGIN and x2 == width - MARGIN):  # the rule under the captions
                far = max(far, x1, x2)
        elif tag in ("polyline", "polygon"):
            far = max([far] + [float(p.split(",")[0]) for p in el.get("points", "").split()])
        elif tag == "path":
            numbers = [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?", el.get("d", ""))]
            far = max([far] + numbers[0::2])
        elif tag == "text" and not WRAPPED & set(el.get("class", "").split()):
            far = max(far, _text_right(el))
    return far


def _text_right(el: ET.Element) -> float:
    s = "".join(el.itertext())
    size = float(el.get("font-size", 13))
    w = text_width(s, size, mono="monospace" in el.get("font-family", ""))
    x = float(el.get("x", 0))
    anchor = el.get("text-anchor", "start")
    return x + (w if anchor == "start" else w / 2 if anchor == "middle" else 0)
