"""The course's figures, drawn from the values a student's functions returned.

`figures/chNN.py` holds chapter NN's figures: each is a function that draws onto a
`Figure` from a record (plain data the checks collected), marked with
`@figure(...)`. Figures never import student code and never write files.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field
from typing import Callable

from figures.kit import Figure

Caption = str | Callable[[dict], str]
"""A caption, or a function of the figure's record that gives it (when it names the record's values)."""


@dataclass(frozen=True)
class FigureSpec:
    """A figure's id and captions, the record parts it needs (and the tasks supplying them), and how to draw it."""

    id: str
    title: str
    zh: Caption
    en: Caption
    draw: Callable[[Figure, dict], None]
    needs: dict[str, str] = field(default_factory=dict)

    def captions(self, record: dict) -> tuple[str, str]:
        """The Chinese and English captions, for this record."""
        return tuple(c(record) if callable(c) else c for c in (self.zh, self.en))  # type: ignore[return-value]

    def missing(self, record: dict | None) -> list[str]:
        """The tasks whose data the record still lacks ("ch25.1"), in order."""
        have = record or {}
        return list(dict.fromkeys(task for part, task in self.needs.items() if part not in have))

    def render(self, record: dict) -> str:
        zh, en = self.captions(record)
        fig = Figure(self.id, title=self.title, zh=zh, en=en)
        self.draw(fig, record)
        return fig.svg()


def figure(figure_id: str, *, title: str, zh: Caption, en: Caption, needs: dict[str, str]) -> Callable:
    """Mark a drawing function as the figure `figure_id`; `needs` maps record parts to tasks."""

    def wrap(fn: Callable[[Figure, dict], None]) -> Callable[[Figure, dict], None]:
        fn.__figure__ = FigureSpec(figure_id, title, zh, en, fn, needs)  # type: ignore[attr-defined]
        return fn

    return wrap


def catalog(chapter_id: str) -> list[FigureSpec]:
    """The figures of one chapter, in definition order (none if it has no figure module)."""
    name = f"figures.{chapter_id}"
    if importlib.util.find_spec(name) is None:
        return []
    module = importlib.import_module(name)
    return [v.__figure__ for v in vars(module).values() if hasattr(v, "__figure__")]
