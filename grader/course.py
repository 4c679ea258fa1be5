"""The whole course in one run: every chapter checked, spread over the machine's cores.

`check_all` hands the chapters to a pool of worker processes, the longest first. The pool's processes are
forked from one that imported torch and the grader and computed nothing (so torch is imported once, and a
fork never inherits a half-used thread pool); each worker then keeps one warm process from which its
chapters' student processes are forked. Every chapter runs exactly as `course check` runs it (`run.check`,
its own sandbox for somebody else's code), on one grading seed for all, and comes back as a `Report`.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.util
import os
import secrets
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from grader import chapters
from grader.i18n import tr
from grader.report import Report

COST = {"ch22": 6.2, "ch15": 5.5, "ch18": 5.5, "ch20": 5.2, "ch19": 5.0, "ch16": 4.9, "ch32": 4.0}
"""Rough relative cost of a chapter's full run: seconds of `course check chNN --solutions`, measured by
tests/bench/check_all.py on 2 cores (others count 3). The pool starts the longest first, so the slowest chapter
never starts last."""


@dataclass
class CourseReport:
    """Every chapter's report, in course order, and the seed they shared."""

    seed: int
    reports: list[Report] = field(default_factory=list)
    failures: dict[str, str] = field(default_factory=dict)
    """Chapters that could not be run at all (their module missing, say), and why."""
    elapsed: float = 0.0

    @property
    def score(self) -> float:
        return sum(r.score for r in self.reports)

    @property
    def max_score(self) -> float:
        return sum(r.max_score for r in self.reports)

    @property
    def exit_code(self) -> int:
        codes = [r.exit_code for r in self.reports] + [1] * bool(self.failures)
        return 1 if 1 in codes else 2 if 2 in codes else 0

    def to_json(self) -> dict:
        """One Gradescope-style document: every chapter's tests, the total, and the chapters not run."""
        tests = [t for r in self.reports for t in r.to_json()["tests"]]
        return {
            "score": self.score,
            "max_score": self.max_score,
            "seed": self.seed,
            "chapters": {r.chapter.id: {"score": r.score, "max_score": r.max_score} for r in self.reports},
            "not_run": self.failures,
            "tests": tests,
        }


def default_jobs() -> int:
    """One worker per core this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def check_all(
    *,
    solutions: bool = False,
    submission: Path | None = None,
    seed: int | None = None,
    hidden: bool | None = None,
    jobs: int | None = None,
    figures_dir: Path | None = None,
    sandbox: str | None = None,
    time_limit: float | None = None,
    memory_limit: int | None = None,
    only: list[str] | None = None,
    on_report: Callable[[Report], None] | None = None,
    on_failure: Callable[[str, str], None] | None = None,
) -> CourseReport:
    """Check every chapter (or those in `only`), as `run.check` checks one, on one grading seed.

    Args:
        solutions, submission, hidden, figures_dir, sandbox, time_limit, memory_limit: as for `run.check`,
            for every chapter (figures go to figures_dir/<chapter>/).
        seed: the grading seed of every chapter's hidden checks (random when None; reported).
        jobs: worker processes (default: one per core); 1 runs the chapters one after another in this process.
        on_report: called with each chapter's report as it completes (in completion order).
        on_failure: called with (chapter, reason) for a chapter that could not be run at all.
    """
    started = time.monotonic()
    course = CourseReport(secrets.randbelow(2**31) if seed is None else seed)
    ids = [ch.id for ch in chapters.all_chapters() if only is None or ch.id in only]
    options: dict[str, Any] = {
        "solutions": solutions,
        "submission": submission,
        "seed": course.seed,
        "hidden": hidden,
        "figures_dir": figures_dir,
        "sandbox": sandbox,
    }
    if time_limit is not None:
        options["time_limit"] = time_limit
    if memory_limit is not None:
        options["memory_limit"] = memory_limit
    order = sorted(ids, key=lambda c: -COST.get(c, 3))
    done: dict[str, Report] = {}

    def finished(chapter_id: str, outcome: Report | str) -> None:
        if isinstance(outcome, Report):
            done[chapter_id] = outcome
            if on_report:
                on_report(outcome)
        else:
            course.failures[chapter_id] = outcome
            if on_failure:
                on_failure(chapter_id, outcome)

    jobs = min(jobs or default_jobs(), len(order)) or 1
    if jobs == 1:
        global _WARM
        _warm_worker()
        try:
            for chapter_id in order:
                finished(chapter_id, _run_chapter(chapter_id, options))
        finally:
            if _WARM is not None:
                _WARM.close()
            _WARM = None
    else:
        from grader.isolation import portable

        context: multiprocessing.context.BaseContext
        if portable.can_fork():
            forkserver = multiprocessing.get_context("forkserver")
            forkserver.set_forkserver_preload(["torch", "grader.run", "grader.authoring", "figures"])
            context = forkserver
        else:  # macOS, Windows, COURSE_PORTABLE=1: each worker a fresh interpreter
            context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=_warm_worker) as pool:
            pending: dict[Future, str] = {pool.submit(_run_chapter, c, options): c for c in order}
            while pending:
                ready, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in ready:
                    chapter_id = pending.pop(future)
                    try:
                        finished(chapter_id, future.result())
                    except Exception as e:  # a worker that died: that chapter's failure, never the run's
                        error = f"{type(e).__name__}: {e}"
                        finished(chapter_id, tr("its grading process failed ({error})", error=error))
    course.reports = [done[c] for c in ids if c in done]
    course.elapsed = time.monotonic() - started
    return course


_WARM: Any = None
"""This worker's warm process, from which its chapters' student processes are forked (None: not started)."""


def _warm_worker() -> None:
    """A pool worker's setup: one thread for torch (the student's processes compute beside it), a warm
    process for the student's code."""
    global _WARM
    import torch

    from grader.isolation import portable
    from grader.isolation.zygote import Zygote

    torch.set_num_threads(1)
    if _WARM is None and portable.can_fork():
        _WARM = Zygote(lazy=True)  # its torch import overlaps the rest of this worker's start
        multiprocessing.util.Finalize(_WARM, _WARM.close, exitpriority=10)  # ended with the worker


def _run_chapter(chapter_id: str, options: dict[str, Any]) -> Report | str:
    """One chapter, as `run.check` runs it: its report, or why it could not be run."""
    from grader.run import MissingModule, check

    launcher = None if options.get("sandbox") or _WARM is None else _WARM.start
    try:
        return check(chapter_id, launcher=launcher, **options)
    except MissingModule as e:
        return str(e)
