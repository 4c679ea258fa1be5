"""The chapters' public checks, one module per chapter (`chNN.py`, found by file name), and finding them.

`grader/checks/chNN.py` holds a chapter's public checks (they ship to students); `grader/hidden/chNN.py` its
hidden ones (never shipped). How to write one: `grader/checks/README.md`; what a check imports:
`grader.authoring`. This module only finds and counts them.
"""

from __future__ import annotations

import ast
import importlib
import json
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grader.authoring.spec import CheckSpec

DEFAULT_TIME_LIMIT = 10.0


def _collect(module: ModuleType) -> list[CheckSpec]:
    return [v.__check__ for v in vars(module).values() if hasattr(v, "__check__")]


def has_hidden(chapter_id: str) -> bool:
    """Whether this installation carries the chapter's hidden checks (a student release does not).

    Looked up by file, beside this package: an import could find another installation's.
    """
    return (Path(__file__).resolve().parent.parent / "hidden" / f"{chapter_id}.py").is_file()


def points(chapter_id: str) -> dict[str, tuple[float, float]]:
    """Task id → (public points, hidden points) of a chapter, read from the check files' decorators without
    importing them (`course list` stays quick); in a student release the hidden points are those `course release`
    recorded. Equal to what `load` collects (`tests/test_list.py`)."""
    here = Path(__file__).resolve().parent
    out: dict[str, list[float]] = {}
    for path, kind in ((here / f"{chapter_id}.py", "public"), (here.parent / "hidden" / f"{chapter_id}.py", "hidden")):
        if not path.is_file():
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for dec in getattr(node, "decorator_list", ()):
                if isinstance(dec, ast.Call) and isinstance(dec.func, ast.Name) and dec.func.id == kind:
                    task = ast.literal_eval(dec.args[0])
                    worth = next((ast.literal_eval(k.value) for k in dec.keywords if k.arg == "points"), 1.0)
                    out.setdefault(task, [0.0, 0.0])[kind == "hidden"] += worth
    if not has_hidden(chapter_id):
        from grader import chapters

        try:
            record = json.loads((chapters.ANSWERS / f"{chapter_id}.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            record = {}
        for task, worth in record.get("hidden_points", record.get("hidden", {})).items():
            out.setdefault(task, [0.0, 0.0])[1] = float(worth)
    return {task: (pub, hid) for task, (pub, hid) in out.items()}


def load(chapter_id: str, *, with_hidden: bool) -> list[CheckSpec]:
    """The chapter's checks, public first within each task, in definition order."""
    specs = _collect(importlib.import_module(f"grader.checks.{chapter_id}"))
    if with_hidden and has_hidden(chapter_id):
        specs += _collect(importlib.import_module(f"grader.hidden.{chapter_id}"))
    return sorted(specs, key=lambda s: (tuple(int(p) for p in s.task.removeprefix("ch").split(".")), s.hidden))
