"""The results of one chapter run, as data and as a Gradescope-compatible document."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import groupby
from typing import Literal

from grader.chapters import Chapter
from grader.delivery import escape
from grader.i18n import tr

Status = Literal["passed", "failed", "error", "timeout", "not run", "blocked"]
"""How a check ended: its answer right, wrong, raising, out of time, not run (a task's time already spent),
or blocked (this machine lacks what it needs)."""


@dataclass
class CheckResult:
    """The outcome of one check."""

    task: str
    function: str
    name: str
    hidden: bool
    points: float
    status: Status
    message: str = ""
    printed: str = ""
    elapsed: float = 0.0
    student_seconds: float = 0.0
    """Of `elapsed`, the time spent in the graded code (what time limits count)."""
    todo: bool = False
    """True when the student's code raised the stub's NotImplementedError."""
    hints: list[str] = field(default_factory=list)
    """The ids of the common mistakes the message names (`grader.authoring.misconceptions`)."""
    import_failed: bool = False
    """True when the check could not run because the module failed to import (or its import ran out
    of time): `message` is then the import's, the same for every check of the run."""

    @property
    def score(self) -> float:
        return self.points if self.status == "passed" else 0.0

    def to_json(self) -> dict:
        """The check as a Gradescope test. Its `output` is text shown by other programs (Gradescope, the
        feedback page, the class summary): the message's control and format characters escaped
        (`grader.delivery.escape.plain`; it may quote the student's values or exception), what the code printed
        as a Python literal."""
        output = escape.plain(self.message, lines=True)
        if self.printed:
            output += "\n" + tr("(your code printed: {printed})", printed=repr(self.printed.strip()[:300]))
        return {
            "name": f"{self.task} {self.function}: {self.name}",
            "number": self.task,
            "score": self.score,
            "max_score": self.points,
            "status": "passed" if self.status == "passed" else "failed",
            "outcome": self.status,
            "output": output,
            "tags": [self.task] + (["hidden"] if self.hidden else []),
            "visibility": "after_due_date" if self.hidden else "visible",
        }


@dataclass
class Report:
    """Everything one `course check` learned about one chapter."""

    chapter: Chapter
    target: str
    seed: int
    results: list[CheckResult] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)
    records: dict[str, dict] = field(default_factory=dict)
    """The figure data the checks recorded (plain data: what each figure is drawn from)."""
    figure_notes: list[str] = field(default_factory=list)
    """Figures that had data but could not be drawn or written, and why ("<id>: …")."""
    undrawn: dict[str, str] = field(default_factory=dict)
    """Figure id -> why this run recorded no data for it: "ch25.1 left out of this run", or
    "waits for ch25.1" (no output of the right shape and type from it yet)."""
    marked: list[str] = field(default_factory=list)
    """Of `figures`, those that mark a value of the student's as wrong (an element of class "wrong")."""
    removed: list[str] = field(default_factory=list)
    """Figure files of this chapter left by an earlier run and removed, since this run did not draw them."""
    hidden_not_run: int = 0
    elapsed: float = 0.0
    limits: str = ""
    """Where the sandbox's budget could not be a cgroup, the limits that held instead (`Box.instead`)."""

    @property
    def score(self) -> float:
        return sum(r.score for r in self.results)

    @property
    def max_score(self) -> float:
        return sum(r.points for r in self.results)

    @property
    def exit_code(self) -> int:
        """0 when every check passed, 1 when one failed, 2 when some were blocked."""
        if any(r.status in ("failed", "error", "timeout", "not run") for r in self.results):
            return 1
        return 2 if any(r.status == "blocked" for r in self.results) else 0

    def by_task(self) -> list[tuple[str, list[CheckResult]]]:
        return [(task, list(rs)) for task, rs in groupby(self.results, key=lambda r: r.task)]

    def to_json(self) -> dict:
        return {
            "chapter": self.chapter.id,
            "title": self.chapter.title,
            "target": self.target,
            "score": self.score,
            "max_score": self.max_score,
            "execution_time": round(self.elapsed, 3),
            "seed": self.seed,
            "hidden_not_run": self.hidden_not_run,
            "tests": [r.to_json() for r in self.results],
            "figures": self.figures,
            "figure_notes": [escape.plain(note) for note in self.figure_notes],  # may quote an exception's message
            **({"limits": escape.plain(self.limits)} if self.limits else {}),
        }


def waits_for(tasks: str) -> str:
    """Why a figure was not drawn: `tasks` returned no output of the right shape and type yet."""
    return tr("waits for {tasks}", tasks=tasks)


def waiting(why: str) -> bool:
    """Whether a figure's `why` (in `Report.undrawn`) is `waits_for`'s, in English or the run's language."""
    return why.startswith(("waits for ", waits_for("\0").split("\0")[0]))


def hint_line(hint: str) -> str:
    """The line that names a hint under a failure's explanation: "hint: …" (in the run's language)."""
    return tr("hint: {hint}", hint=hint)


def is_hint_line(line: str) -> bool:
    """Whether `line` (stripped) is a hint's line, in English or in the run's language."""
    return line.startswith(("hint:", hint_line("").rstrip()))
