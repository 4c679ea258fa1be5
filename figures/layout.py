"""Layout by composition: a `Part` knows its size before it is placed, so figures say what goes next to
what (`row`, `column`, `titled`) and the kit computes where.

    f.place(row(f.titled("yours", f.matrix(yours, wrong=wrong)),
                f.titled("expected", f.matrix(expected)), gap=40))

A part is drawn once, when the figure places it (`Figure.place`, or a part that holds it); afterwards it
knows where it went (`x`, `y`), so a figure can draw over it (`Grid.cell_box(i, j)` for an outline).
"""

from __future__ import annotations

from typing import Callable, Literal


class Part:
    """Something to draw whose size (`w`, `h`) is known before it is placed; `at(x, y)` draws it with its
    top-left corner there (once)."""

    def __init__(self, w: float, h: float, draw: Callable[[float, float], object] | None = None) -> None:
        self.w, self.h = w, h
        self._draw = draw
        self.x: float | None = None
        self.y: float | None = None

    def at(self, x: float, y: float) -> "Part":
        if self.x is not None:
            raise RuntimeError("a part is drawn once: make another for a second copy")
        self.x, self.y = x, y
        if self._draw is not None:
            self._draw(x, y)
        return self

    @property
    def right(self) -> float:
        return self._placed()[0] + self.w

    @property
    def bottom(self) -> float:
        return self._placed()[1] + self.h

    def _placed(self) -> tuple[float, float]:
        if self.x is None or self.y is None:
            raise RuntimeError("this part is not placed yet")
        return self.x, self.y


def space(w: float = 0, h: float = 0) -> Part:
    """Empty room."""
    return Part(w, h)


def row(*parts: Part | None, gap: float = 24, align: Literal["top", "middle", "bottom"] = "top") -> Part:
    """Parts side by side, left to right, `gap` apart (None is skipped)."""
    kept = [p for p in parts if p is not None]
    h = max((p.h for p in kept), default=0)

    def draw(x: float, y: float) -> None:
        for p in kept:
            p.at(x, y + {"top": 0, "middle": (h - p.h) / 2, "bottom": h - p.h}[align])
            x += p.w + gap

    return Part(sum(p.w for p in kept) + gap * max(len(kept) - 1, 0), h, draw)


def column(*parts: Part | None, gap: float = 10, align: Literal["left", "center", "right"] = "left") -> Part:
    """Parts one under another, top to bottom, `gap` apart (None is skipped)."""
    kept = [p for p in parts if p is not None]
    w = max((p.w for p in kept), default=0)

    def draw(x: float, y: float) -> None:
        for p in kept:
            p.at(x + {"left": 0, "center": (w - p.w) / 2, "right": w - p.w}[align], y)
            y += p.h + gap

    return Part(w, sum(p.h for p in kept) + gap * max(len(kept) - 1, 0), draw)


def pad(part: Part, *, left: float = 0, top: float = 0, right: float = 0, bottom: float = 0) -> Part:
    """The part with room around it."""
    return Part(left + part.w + right, top + part.h + bottom, lambda x, y: part.at(x + left, y + top) and None)


def wide(part: Part, w: float) -> Part:
    """The part in a slot at least `w` wide (for columns of panels that line up)."""
    return Part(max(w, part.w), part.h, lambda x, y: part.at(x, y) and None)


def centred(part: Part, w: float) -> Part:
    """The part in the middle of a slot `w` wide (at least its own width)."""
    room = max(0.0, w - part.w)
    return pad(part, left=room / 2, right=room / 2)


def narrow(part: Part, w: float) -> Part:
    """The part in a slot `w` wide even when it is wider: what sticks out runs into the next slot."""
    return Part(w, part.h, lambda x, y: part.at(x, y))
