"""A chapter's common mistakes, as data: `grader/hidden/chNN_mistakes.py` holds one table per chapter.

Each row (a `Mistake`) is one misconception students really have: an id, the task it shows up in, the
hint a check gives when it recognises it, and the edits of the reference solution that make it (text
replacements, each of which must occur exactly once). Three readers use the table:

- the checks, which recognise a mistake in code and name it by id: `raise CheckFailed(..., hint=M.topleft)`,
  where `M = mistakes("ch17")`; a hint with fields is filled with `M.slot_product.format(n=5)`;
- `tests/test_mistakes.py`, which applies every row's edits to the reference, grades the result and
  expects that row's hint id (tests assert ids, never the prose);
- `course release`, which records the ids and messages for the student release (`answers/chNN.json`,
  under "mistakes"): the edits are pieces of the reference and never ship.

The table lives on the hidden side because of its edits; a student release reads the recorded messages.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from grader.authoring.compare import Hint
from grader.i18n import tr_in


@dataclass(frozen=True)
class Mistake:
    """One misconception of a chapter.

    Args:
        id: a short name, unique in the chapter ("topleft"); checks and tests refer to it.
        task: the task whose checks recognise it ("ch17.2"), or several ("ch17.1 ch17.2").
        message: the hint shown after the explanation; `{fields}` are filled by the check.
        edits: `(old, new)` text edits of the reference that make the mistake; `()` when no edit of the
            reference gives it (a unit test of the chapter then shows the hint on a made-up value).
    """

    id: str
    task: str
    message: str
    edits: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    @property
    def tasks(self) -> list[str]:
        return self.task.split()


def mistake(id: str, task: str, message: str, *edits: tuple[str, str]) -> Mistake:
    """A row of a chapter's table: `mistake("topleft", "ch17.2", "a chunk after …", (".tril(diagonal=n)", ".tril()"))`."""
    return Mistake(id, task, message, tuple(edits))


class Mistakes:
    """A chapter's table of mistakes, by id: `M.topleft` is its hint (a `Hint` carrying the id).

    Loaded when first used, from `grader/hidden/chNN_mistakes.py` where the hidden side is installed, else from
    what `course release` recorded; a chapter with neither has an empty table.
    """

    def __init__(self, chapter_id: str) -> None:
        self.chapter_id = chapter_id
        self._rows: dict[str, Mistake] | None = None

    @property
    def rows(self) -> dict[str, Mistake]:
        if self._rows is None:
            self._rows = {m.id: m for m in _load(self.chapter_id)}
        return self._rows

    def __getattr__(self, name: str) -> Hint:
        if name.startswith("_"):
            raise AttributeError(name)
        return self.hint(name)

    def hint(self, id: str, **fields: Any) -> Hint:
        """The hint of mistake `id`, filled with `fields` when given."""
        try:
            row = self.rows[id]
        except KeyError:
            raise KeyError(
                f"{self.chapter_id} has no mistake {id!r} in its table (grader/hidden/{self.chapter_id}_mistakes.py): {sorted(self.rows)}"
            ) from None
        context = f"{self.chapter_id}.{row.id}"  # extracted from the tables themselves (grader.i18n.update)
        text = Hint(tr_in(context, row.message), row.id)
        return text.format(**fields) if fields else text


def mistakes(chapter_id: str) -> Mistakes:
    """The table of `chapter_id`'s common mistakes (loaded on first use)."""
    return Mistakes(chapter_id)


def table(chapter_id: str) -> list[Mistake]:
    """The rows of a chapter's table, with their edits (the hidden side only: [] where it is not installed)."""
    try:
        module = importlib.import_module(f"grader.hidden.{chapter_id}_mistakes")
    except ModuleNotFoundError as e:
        if e.name not in (f"grader.hidden.{chapter_id}_mistakes", "grader.hidden"):
            raise
        return []
    return list(module.MISTAKES)


def recorded(chapter_id: str) -> dict[str, dict[str, str]]:
    """What a student release carries of the table: id → {"task", "message"} (no edits)."""
    return {m.id: {"task": m.task, "message": m.message} for m in table(chapter_id)}


def _load(chapter_id: str) -> list[Mistake]:
    rows = table(chapter_id)
    if rows:
        return rows
    from grader.authoring.reference import load_answers

    answers = load_answers(chapter_id) or {}
    return [Mistake(id, row["task"], row["message"]) for id, row in answers.get("mistakes", {}).items()]
