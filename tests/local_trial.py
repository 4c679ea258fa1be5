"""A check run in this process with the reference as the student's code: for sweeping one check's comparison over
many grading seeds, which `course check` (a sandboxed process per run) would make slow.

`reference_trial(check, seed, module)` is the very `Trial` the check gets at grading time on `seed` (the same random
sources), with `t.yours` the reference module itself, so a failure is the reference losing that check's points.
"""

from __future__ import annotations

from types import ModuleType
from typing import Callable

from grader.authoring.reference import Live
from grader.authoring.trial import Trial


def reference_trial(check: Callable, seed: int, module: ModuleType) -> Trial:
    """The Trial of `check` (a function marked `@public`/`@hidden`) on grading seed `seed`, calling `module` for
    both the reference and the student (functions only: no objects in another process, no measured runs)."""
    t = Trial(check.__check__, session=None, ref=Live(module), seed=seed, params={}, figures={})  # type: ignore[arg-type]
    t.yours = module  # type: ignore[assignment]
    return t
