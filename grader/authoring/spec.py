"""Declaring checks: `@public(task, name)` and `@hidden(task, name)` make a function of one `Trial` a check
(a `CheckSpec`); `hidden_model` lets a public check use what only the hidden side may compute."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from grader.authoring.trial import Trial


@dataclass(frozen=True)
class CheckSpec:
    """One check: its task ("ch25.1"), its name, its body and how much it is worth."""

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
    """A `t.ref.drive` driver whose body is `grader/hidden/<module>.py`'s `<function>` ("ch22_models.flash_models").

    What a check needs that would compute an answer (the grader's closed-form models of a task, the variants a
    misconception gives, an expected intermediate) lives on the hidden side, which never ships. A public check
    asks for it with `t.ref.drive(driver, ...)` before comparing: the instructor's repository runs the hidden
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
