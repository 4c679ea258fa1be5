"""The human-readable report: one line per task as its checks finish, teaching
messages under failures, then the score and where the figures went."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import click

from grader.chapters import Chapter
from grader.report import CheckResult, Report

MAX_MESSAGES = 3
SLOW = 2.0
"""Seconds after which a terminal shows which check is running."""


def _pts(x: float) -> str:
    return str(int(x)) if x == int(x) else f"{x:.1f}"


class TerminalReport:
    """Prints a chapter run as it happens (feed it results, then `finish`)."""

    def __init__(self, chapter: Chapter, target: str, *, verbose: bool = False, header: bool = True) -> None:
        self.chapter, self.verbose = chapter, verbose
        self.pending: list[CheckResult] = []
        self.width = max((len(t.label) for t in chapter.tasks), default=20) + 2
        self._running: tuple[str, float] | None = None
        self._shown = False
        self._lock = threading.Lock()
        if sys.stdout.isatty():
            threading.Thread(target=self._tick, daemon=True).start()
        if header:
            click.echo(click.style(f"{chapter.id} · {chapter.title}", bold=True) + f"    {_relative(target)}")

    def start(self, task: str, name: str) -> None:
        """A check begins (on a terminal, it is named once it has run for SLOW seconds)."""
        with self._lock:
            self._running = (f"{task} {name}", time.monotonic())

    def _tick(self) -> None:
        while True:
            time.sleep(0.5)
            with self._lock:
                if self._running and time.monotonic() - self._running[1] > SLOW:
                    label, since = self._running
                    click.echo(f"\r\033[K  … running {label[:70]} ({time.monotonic() - since:.0f} s)", nl=False)
                    self._shown = True

    def _clear(self) -> None:
        with self._lock:
            self._running = None
            if self._shown:
                click.echo("\r\033[K", nl=False)
                self._shown = False

    def add(self, result: CheckResult) -> None:
        self._clear()
        if self.pending and (self.pending[0].task, self.pending[0].hidden) != (result.task, result.hidden):
            self.flush()
        self.pending.append(result)

    def flush(self) -> None:
        if not self.pending:
            return
        rs, self.pending = self.pending, []
        score, total = sum(r.score for r in rs), sum(r.points for r in rs)
        ok = all(r.status == "passed" for r in rs)
        label = f"{rs[0].task} {rs[0].function}".ljust(self.width) + (" hidden" if rs[0].hidden else "")
        mark = click.style("✓", fg="green") if ok else click.style("✗", fg="red")
        line = f"  {mark} {label} {_pts(score)}/{_pts(total)}"
        bad = [r for r in rs if r.status != "passed"]
        if bad and all(r.todo for r in bad):
            click.echo(f"{line}  {bad[0].message}")
            return
        click.echo(line)
        if ok and not self.verbose:
            return
        explained = 0
        for r in rs:
            hidden = " (hidden)" if r.hidden else ""
            if r.status == "passed":
                click.echo(f"      {click.style('✓', fg='green')} {r.name}{hidden}")
                continue
            tag = {"timeout": "timed out", "error": "error", "failed": "wrong", "not run": "not run"}.get(r.status, r.status)
            click.echo(f"      {click.style('✗', fg='red')} {r.name}{hidden}  " + click.style(f"[{tag}]", fg="yellow"))
            if explained < MAX_MESSAGES or self.verbose:
                explained += 1
                for msg_line in r.message.splitlines():
                    click.echo(f"          {msg_line}")
                if r.printed.strip():
                    click.echo(f"          (your code printed: {r.printed.strip()[:200]!r})")
        if len(bad) > explained:
            click.echo(f"      ({len(bad) - explained} more failing checks not explained; --verbose explains all)")

    def finish(self, report: Report) -> None:
        self._clear()
        self.flush()
        if report.hidden_not_run:
            click.echo(f"  · hidden checks: {report.hidden_not_run} more run at grading time")
        elif any(r.hidden for r in report.results):
            click.echo(f"  · hidden checks ran on grading seed {report.seed} (repeat with --seed {report.seed})")
        summary = f"score {_pts(report.score)}/{_pts(report.max_score)}"
        wrong = report.exit_code != 0
        if report.figures:
            label = "figures (your wrong values marked)" if wrong else "figures"
            summary += f" · {label}: " + ", ".join(_relative(p) for p in report.figures)
        else:
            summary += " · figures are drawn once a task passes"
        click.echo(click.style(summary, bold=True))
        for note in report.figure_notes:
            click.echo(f"  · figure {note}")


def _relative(path: str) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)
