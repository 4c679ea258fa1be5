"""Wrong submissions for the tests, written as edits of the reference solution.

A mutant is the chapter's reference module with a few small text edits, each one a
misconception a student really has (a mask taken from the wrong corner, a temperature
multiplied instead of divided). Writing the edit instead of a copy of the module keeps
the mutant next to the test that grades it and in step with the reference: when the
reference changes under an edit, the edit no longer applies and the test says so.
"""

from __future__ import annotations

from pathlib import Path

from grader import chapters


def mutant(folder: Path, chapter_id: str, *edits: tuple[str, str]) -> Path:
    """Write the reference of `chapter_id` with each `(old, new)` edit applied into `folder`.

    Every `old` must occur exactly once in the reference (after the edits before it), so
    an edit cannot silently miss or hit twice. Returns `folder`, a submission folder for
    `grader.run.check(chapter_id, submission=folder)`.
    """
    ch = chapters.find(chapter_id)
    path = chapters.SOLUTIONS / ch.filename
    source = path.read_text(encoding="utf-8")
    for old, new in edits:
        count = source.count(old)
        assert count == 1, (f"{path.relative_to(chapters.ROOT)}: the text to edit should occur once, "
                            f"found {count} times: {old!r}")
        source = source.replace(old, new)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ch.filename).write_text(source, encoding="utf-8")
    return folder
