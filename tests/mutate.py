"""Wrong submissions for the tests, written as edits of the reference solution, and how they graded.

A mutant is the chapter's reference module with a few small text edits, each one a
misconception a student really has (a mask taken from the wrong corner, a temperature
multiplied instead of divided). Writing the edit instead of a copy of the module keeps
the mutant next to the test that grades it and in step with the reference: when the
reference changes under an edit, the edit no longer applies and the test says so.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from grader import chapters
from grader.authoring.misconceptions import table
from grader.run import check


def mutant(folder: Path, chapter_id: str, *edits: tuple[str, str]) -> Path:
    """Write the reference of `chapter_id` with each `(old, new)` edit applied into `folder`.

    Every `old` must occur exactly once in the reference (after the edits before it), so
    an edit cannot silently miss or hit twice. Returns `folder`, a submission folder for
    `grader.run.check(chapter_id, submission=folder)`.
    """
    ch = chapters.find(chapter_id)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ch.filename).write_text(edited(chapter_id, *edits), encoding="utf-8")
    return folder


def edited(chapter_id: str, *edits: tuple[str, str]) -> str:
    """The text of `chapter_id`'s reference with each `(old, new)` edit applied, in order (each `old` must
    occur exactly once, as `mutant` says)."""
    path = chapters.SOLUTIONS / chapters.find(chapter_id).filename
    source = path.read_text(encoding="utf-8")
    for old, new in edits:
        count = source.count(old)
        assert count == 1, f"{path.relative_to(chapters.ROOT)}: the text to edit should occur once, found {count} times: {old!r}"
        source = source.replace(old, new)
    return source


def mutant_grader(tmp_path_factory, chapter_id: str, seed: int):
    """`grade(name, *edits, task=None) -> Report`: a mutant graded once per test module.

    The mutant is the reference with `edits`; it is graded on its public and hidden
    checks with `seed` (only `task`'s checks when given), and its figures are drawn.
    Tests that grade the same `(name, edits, task)` share one run.
    """
    cache = {}

    def grade(name: str, *edits: tuple[str, str], task: str | None = None):
        key = (name, edits, task)
        if key not in cache:
            submission = mutant(tmp_path_factory.mktemp(f"{chapter_id}_{name}"), chapter_id, *edits)
            cache[key] = check(
                chapter_id, submission=submission, task=task, hidden=True, seed=seed, figures_dir=tmp_path_factory.mktemp(f"{name}_figures")
            )
        return cache[key]

    def mistake(mistake_id: str, *more: tuple[str, str], task: str | None = None):
        """The chapter's mistake `mistake_id` (its row's edits, then `more`), graded as `grade` does."""
        return grade(mistake_id, *row(chapter_id, mistake_id).edits, *more, task=task)

    grade.mistake = mistake  # type: ignore[attr-defined]
    return grade


def row(chapter_id: str, mistake_id: str):
    """The row `mistake_id` of a chapter's table of mistakes (grader/hidden/chNN_mistakes.py)."""
    rows = {m.id: m for m in table(chapter_id)}
    assert mistake_id in rows, f"{chapter_id} has no mistake {mistake_id!r}: {sorted(rows)}"
    return rows[mistake_id]


def hints(report, task: str | None = None) -> set[str]:
    """The ids of the mistakes named by `report`'s checks (of `task`, when given)."""
    return {h for r in report.results if task in (None, r.task) for h in r.hints}


def result(report, name_start: str, task: str | None = None):
    """The one check of `report` whose name starts with `name_start` (in `task`, when given)."""
    found = [r for r in report.results if r.name.startswith(name_start) and task in (None, r.task)]
    assert len(found) == 1, [r.name for r in report.results]
    return found[0]


def statuses(report, task: str) -> set[str]:
    """The statuses that `task`'s checks ended with."""
    return {r.status for r in report.results if r.task == task}


def tasks_not_passed(report) -> set[str]:
    """The tasks with at least one check that did not pass."""
    return {r.task for r in report.results if r.status != "passed"}


def checks_not_passed(report) -> list[str]:
    """The names of the checks that did not pass, in the order they ran."""
    return [r.name for r in report.results if r.status != "passed"]


def figure_file(report, figure_id: str) -> Path:
    """The SVG file of the figure `figure_id` drawn for `report`."""
    paths = [Path(p) for p in report.figures if p.endswith(f"/{figure_id}.svg")]
    assert len(paths) == 1, (paths, report.figure_notes)
    return paths[0]


def figure(report, figure_id: str) -> ET.Element:
    """The root element of the figure `figure_id` drawn for `report`."""
    return ET.parse(figure_file(report, figure_id)).getroot()


def wrong_elements(report, figure_id: str, cls: str = "wrong") -> list[ET.Element]:
    """The elements of a figure whose class mentions `cls` (by default: drawn as wrong)."""
    return [el for el in figure(report, figure_id).iter() if cls in (el.get("class") or "")]
