"""Check definitions: `grader/checks/chNN.py` holds a chapter's public checks and
`grader/hidden/chNN.py` its hidden ones (the student release leaves that folder out).

A check is a function of one `Trial`, marked with `@public(task, name)` or
`@hidden(task, name)`. It calls the student's code through the trial, computes
what is expected from the reference, and raises `CheckFailed` with a teaching
message when they disagree. Checks are collected in definition order.

Rules a public check keeps, because the student release replays `t.ref` from a
recording of the reference's answers (`grader.reference`): it is deterministic
(fixed inputs, `t.rng`/`t.random` only), and every `t.ref` call it makes happens
whatever the student answered, i.e. before comparing; an explanation uses only
values computed by then. `tests/test_release.py` checks both for every chapter.

And since the public checks ship, they hold no working answer: what an explanation compares with beyond the
reference's answers (a model of the task, what a misconception gives) comes from `hidden_model` drivers,
asked for before comparing like `t.ref`. `tests/test_shipped_answers.py` calls every shipped chapter
function on the public checks' inputs and fails if one reproduces an answer.
"""

from __future__ import annotations

import ast
import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from grader.trial import Trial

DEFAULT_TIME_LIMIT = 10.0


@dataclass(frozen=True)
class CheckSpec:
    """One check: its task ("25.1"), its name, its body and how much it is worth."""

    task: str
    name: str
    body: Callable[["Trial"], None]
    hidden: bool
    points: float = 1.0
    time_limit: float | None = None

    @property
    def key(self) -> str:
        return f"{self.task}:{self.name}"


def public(task: str, name: str, *, points: float = 1.0, time_limit: float | None = None) -> Callable:
    """Mark a function as a public check of `task` (shipped to students)."""
    return _mark(task, name, False, points, time_limit)


def hidden(task: str, name: str, *, points: float = 1.0, time_limit: float | None = None) -> Callable:
    """Mark a function as a hidden check of `task` (run only at grading time)."""
    return _mark(task, name, True, points, time_limit)


def _mark(task: str, name: str, is_hidden: bool, points: float, time_limit: float | None) -> Callable:
    def wrap(fn: Callable[["Trial"], None]) -> Callable[["Trial"], None]:
        fn.__check__ = CheckSpec(task, name, fn, is_hidden, points, time_limit)  # type: ignore[attr-defined]
        return fn

    return wrap


def hidden_model(name: str) -> Callable[..., Any]:
    """A `Trial.reference` driver whose body is `grader/hidden/<module>.py`'s `<function>` ("ch22_models.flash_models").

    What a check needs that would compute an answer (the grader's closed-form models of a task, the variants a
    misconception gives, an expected intermediate) lives on the hidden side, which never ships. A public check
    asks for it with `t.reference(driver, ...)` before comparing: the instructor's repository runs the hidden
    function on the reference module, and a student release replays what `course release` recorded for the
    check's fixed inputs, so the release can explain its public instances without holding the model. Called
    directly (`driver(None, ...)`), it needs the hidden side, i.e. the repository.
    """
    module_name, _, function = name.rpartition(".")

    def driver(ref: Any, *args: Any, **kwargs: Any) -> Any:
        module = importlib.import_module(f"grader.hidden.{module_name}")
        return getattr(module, function)(ref, *args, **kwargs)

    driver.__name__ = driver.__qualname__ = function
    driver.__doc__ = f"grader.hidden.{name} (run on the hidden side; replayed in a student release)"
    return driver


def if_hidden(driver: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`driver(None, ...)` where this installation has the hidden side, else None: for helpers that also serve
    outside a check (the lab), which in a student release explain without what only the hidden side knows."""
    try:
        return driver(None, *args, **kwargs)
    except ImportError:
        return None


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
    return sorted(specs, key=lambda s: (tuple(int(p) for p in s.task.split(".")), s.hidden))

