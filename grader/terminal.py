"""The human-readable report: one line per task as its checks finish, teaching
messages under failures, then the score and where the figures went.

Each thing is said once: an import error of the module once for the chapter,
failures with the same diagnosis (the same "hint:" lines, or the same message)
once per task, followed by the names of the other checks it covers. Every line is
wrapped to the terminal with a hanging indent; text that came from the student's
process or names a submission's files (messages, what it printed, paths, figure notes) is
shown through `grader.delivery.escape.terminal`: no control or format character of it reaches the
terminal. `CourseScreen` (`course check all`) and `table` (`course list`) fit their lines
to the terminal's width too.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import threading
import time
import unicodedata
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any, Callable

import click

from grader.chapters import Chapter
from grader.delivery import escape
from grader.i18n import mark, tr
from grader.report import CheckResult, Report, is_hint_line, waiting

MAX_MESSAGES = 3
"""Different explanations shown per task (--verbose shows every failing check's)."""
SLOW = 2.0
"""Seconds after which a terminal shows which check is running."""
PRINTED_LINES = 6
"""Lines of what the student's code printed shown under a failure."""
NAMES_SHOWN = 3
"""Checks named in "(same for N more checks: …)" before "and N more"."""
NAME_CHARS = 64
MIN_WIDTH = 40
TAGS = {
    "timeout": mark("timed out"),
    "error": mark("error"),
    "failed": mark("wrong"),
    "not run": mark("not run"),
    "blocked": mark("blocked"),
}
"""A failing check's status as its tag: `✗ name  [wrong]` (translated when shown)."""

_LABEL = re.compile(r"(?:[a-z][a-z ]{0,14}: |[\u4e00-\u9fff]{1,8}：|[✗✓·…] )")
"""A line's own lead ("hint: ", "提示：", "inputs: ", a mark): its continuation lines are indented past it."""

_CJK = "\u2e80-\u9fff\uf900-\ufaff\uff01-\uff60"
_PIECE = re.compile(f"(?:[{_CJK}]|[^{_CJK}]+)[，。：；、！？）》」』”’]*")
"""The pieces of a word a line may break between: each CJK character (Chinese has no spaces), a run of
anything else; closing punctuation stays with what it closes."""


def _pts(x: float) -> str:
    """Points as the report writes them: 5, 2.5."""
    return str(int(x)) if x == int(x) else f"{x:.1f}"


def _count(n: int, one: str, many: str, **fields: Any) -> str:
    """`one` (a marked text with `{n}`) when n is 1, else `many`, translated and filled: "1 check", "2 checks"."""
    return tr(one if n == 1 else many, n=n, **fields)


def terminal_width() -> int:
    """Columns to wrap to: $COLUMNS when set, else the terminal's width, else 0 (no wrapping).

    Output that is not a terminal (a pipe, a file, CI logs) is not wrapped: it has no width of its
    own, whatever shows it wraps (or scrolls) by itself, and whole lines stay greppable."""
    value = os.environ.get("COLUMNS", "")
    if value.isdigit() and int(value) > 0:
        return max(int(value), MIN_WIDTH)
    if sys.stdout.isatty():
        return max(shutil.get_terminal_size().columns, MIN_WIDTH)
    return 0


def columns(text: str) -> int:
    """The width of `text` on a terminal: styles take none, wide (CJK) characters two, combining none."""
    plain = click.unstyle(text)
    return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in plain)


def wrap(text: str, width: int, indent: str = "") -> list[str]:
    """`indent + text` as lines of at most `width` columns (0: one line), broken at spaces only, so a
    path, a number or a tensor shape is never split (a longer word overflows instead). Continuation
    lines keep the text's own indentation and are indented past its lead ("hint: ", "✗ "), or by 2."""
    own = text[: len(text) - len(text.lstrip(" "))]
    body = text[len(own) :]
    if not width or columns(indent + text) <= width:
        return [indent + text]
    lead = _LABEL.match(click.unstyle(body))
    hang = indent + own + " " * (columns(lead.group(0)) if lead else 2)
    if columns(hang) > width // 2:
        hang = indent + own + "  "
    lines, line, gap = [], indent + own, ""
    for i, part in enumerate(re.split(r"( +)", _bind(body))):
        if i % 2:  # a run of spaces: kept inside a line (aligned columns), dropped at a break
            gap = part.replace(_BOUND, " ")
        elif part:
            for j, piece in enumerate(_PIECE.findall(part) or [part]):  # Chinese breaks between characters too
                piece = piece.replace(_BOUND, " ")
                if (gap or j) and columns(line + gap + piece) > width:
                    lines.append(line)
                    line = hang + piece
                else:
                    line += gap + piece
                gap = ""
    lines.append(line)
    return lines


_BOUND = "\x00"
_PAIRS = {"(": ")", "[": "]", "{": "}"}


def _bind(text: str, short: int = 12) -> str:
    """`text` with the spaces inside a short bracketed group ("[6, 6]", "ones(L, S)") made unbreakable
    (as _BOUND): a shape or a call is a token too."""
    chars, stack = list(text), []
    for i, c in enumerate(chars):
        if c in _PAIRS:
            stack.append(i)
        elif c in _PAIRS.values() and stack and _PAIRS[chars[stack[-1]]] == c:
            start = stack.pop()
            if i - start <= short:
                for j in range(start, i):
                    if chars[j] == " ":
                        chars[j] = _BOUND
    return "".join(chars)


def _diagnosis(r: CheckResult) -> tuple:
    """What makes two failures "the same": their status and their hint lines; without a hint, their
    message, where for an exception the numbers of its first line do not count (the same IndexError
    at the same line of the student's code, whatever the index)."""
    lines = [line.strip() for line in r.message.splitlines()]
    hints = tuple(line for line in lines if is_hint_line(line))
    if not hints and r.status == "error" and lines:
        lines[0] = re.sub(r"\d+", "#", lines[0])
    return (r.status, hints or tuple(lines))


def _names(rs: list[CheckResult]) -> str:
    """Check names, compactly: quoted, each cut to NAME_CHARS, at most NAMES_SHOWN and "N more"."""
    cut = [f"“{r.name if len(r.name) <= NAME_CHARS else r.name[:NAME_CHARS].rsplit(' ', 1)[0] + ' …'}”" for r in rs]
    if len(cut) > NAMES_SHOWN:
        cut = cut[: NAMES_SHOWN - 1] + [tr("{n} more", n=len(cut) - NAMES_SHOWN + 1)]
    if len(cut) == 1:
        return cut[0]
    return tr("{names} and {last}", names=tr(", ").join(cut[:-1]), last=cut[-1])


class TerminalReport:
    """Prints a chapter run as it happens (feed it results, then `finish`).

    `width` is the wrapping width (default `terminal_width()`, 0 for none); `tty` whether a line may
    show the running check (default: stdout is a terminal), refreshed by a thread unless `ticker` is
    False (then call `tick`); `clock` gives seconds (time.monotonic)."""

    def __init__(
        self,
        chapter: Chapter,
        target: str,
        *,
        verbose: bool = False,
        header: bool = True,
        width: int | None = None,
        tty: bool | None = None,
        ticker: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.chapter, self.verbose = chapter, verbose
        self.pending: list[CheckResult] = []
        self.label_width = max((len(t.label) for t in chapter.tasks), default=20) + 2
        self.width = terminal_width() if width is None else width
        self.tty = sys.stdout.isatty() if tty is None else tty
        self.clock = clock
        self._running: tuple[str, float] | None = ("starting", clock())
        self._shown = ""
        """The running line on the screen now ("" for none)."""
        self._done = False
        self._import_shown = False
        self._lock = threading.Lock()
        if self.tty and ticker:
            threading.Thread(target=self._ticker, daemon=True).start()
        if header:
            self._echo("", click.style(f"{chapter.id} · {chapter.title}", bold=True) + f"    {relative(target)}")

    def _echo(self, indent: str, text: str) -> None:
        """Print `indent + text`, wrapped to the width."""
        for line in wrap(text, self.width, indent):
            click.echo(line)

    def start(self, task: str, name: str) -> None:
        """A check begins (on a terminal, it is named once it has run for SLOW seconds)."""
        with self._lock:
            self._running = (tr("running {task} {name}", task=task, name=name), self.clock())

    def tick(self) -> None:
        """On a terminal, show (or refresh) the line naming the check that has run over SLOW seconds."""
        with self._lock:
            if not self.tty or not self._running or self.clock() - self._running[1] <= SLOW:
                return
            label, since = self._running
            room = (self.width or 100) - 12
            if len(label) > room:
                label = label[: room - 1] + "…"
            text = "  … " + tr("{label} ({s} s)", label=label, s=int(self.clock() - since))
            if text != self._shown:
                click.echo(f"\r\033[K{text}", nl=False, color=True)  # cursor control, kept whatever the colours
                self._shown = text

    def _ticker(self) -> None:
        """The thread that refreshes the running line until `finish`."""
        while not self._done:
            time.sleep(0.5)
            self.tick()

    def _clear(self) -> None:
        """No check is running: erase the running line if one is shown."""
        with self._lock:
            self._running = None
            if self._shown:
                click.echo("\r\033[K", nl=False, color=True)
                self._shown = ""

    def add(self, result: CheckResult) -> None:
        """A check finished: its task's line is printed once the next task's first result comes."""
        self._clear()
        if self.pending and (self.pending[0].task, self.pending[0].hidden) != (result.task, result.hidden):
            self.flush()
        self.pending.append(result)

    def _message(self, r: CheckResult, indent: str = " " * 10) -> None:
        """A failure's explanation, then what the student's code printed as indented lines (bounded)."""
        for line in escape.terminal_lines(r.message):
            self._echo(indent, line)
        printed = r.printed.strip("\n")
        if printed.strip():
            lines = escape.terminal_lines(printed)
            self._echo(indent, tr("your code printed:"))
            for line in lines[:PRINTED_LINES]:
                self._echo(indent + "  ", line.rstrip())
            if len(lines) > PRINTED_LINES:
                self._echo(indent + "  ", _count(len(lines) - PRINTED_LINES, mark("… (1 more line)"), mark("… ({n} more lines)")))

    def _import_failure(self, r: CheckResult) -> None:
        """The module's import failed: said once for the chapter, before the first task's line."""
        self._import_shown = True
        self._echo("  ", click.style("✗", fg="red") + " " + tr("your module could not be imported, so no check could run:"))
        self._message(r, " " * 6)

    def flush(self) -> None:
        """Print the pending task: its line, then its failures, each different explanation once."""
        if not self.pending:
            return
        rs, self.pending = self.pending, []
        score, total = sum(r.score for r in rs), sum(r.points for r in rs)
        ok = all(r.status == "passed" for r in rs)
        label = f"{rs[0].task} {rs[0].function}".ljust(self.label_width) + (" " + tr("hidden") if rs[0].hidden else "")
        sign = click.style("✓", fg="green") if ok else click.style("✗", fg="red")
        line = f"  {sign} {label} {_pts(score)}/{_pts(total)}"
        bad = [r for r in rs if r.status != "passed"]
        unimported = [r for r in bad if r.import_failed]
        if unimported and not self._import_shown:
            self._import_failure(unimported[0])
        if bad and all(r.todo for r in bad):
            self._echo("", f"{line}  {escape.terminal(bad[0].message)}")
            return
        if bad and len(unimported) == len(bad):
            self._echo("", f"{line}  " + tr("not run: your module could not be imported (above)"))
            return
        if (
            bad
            and len(bad) == len(rs) > 1
            and len({_diagnosis(r) for r in bad}) == 1
            and "\n" not in bad[0].message
            and not any(r.printed.strip() for r in bad)
            and not self.verbose
        ):
            self._echo("", f"{line}  {escape.terminal(bad[0].message)}")  # e.g. a renamed function: every check alike
            return
        self._echo("", line)
        if ok and not self.verbose:
            return
        groups: dict[tuple, list[CheckResult]] = {}
        for r in bad:
            if not r.import_failed:
                groups.setdefault(_diagnosis(r), []).append(r)
        explained: set[tuple] = set()
        unexplained = 0
        for r in rs:
            hidden = " " + tr("(hidden)") if r.hidden else ""
            if r.status == "passed":
                self._echo(" " * 6, f"{click.style('✓', fg='green')} {r.name}{hidden}")
                continue
            if r.import_failed:
                continue
            key = _diagnosis(r)
            if key in explained and not self.verbose:
                continue  # named under the first check with this diagnosis
            tag = tr(TAGS[r.status]) if r.status in TAGS else r.status
            self._echo(" " * 6, f"{click.style('✗', fg='red')} {r.name}{hidden}  " + click.style(f"[{tag}]", fg="yellow"))
            if len(explained) < MAX_MESSAGES or self.verbose or key in explained:
                self._message(r)
                same = groups[key][1:]
                if same and not self.verbose:
                    if len(same) == len(rs) - 1 > 1:
                        named = tr("(same for all {n} other checks of {task})", n=len(same), task=r.task)
                    else:
                        named = _count(
                            len(same),
                            mark("(same for 1 more check: {names})"),
                            mark("(same for {n} more checks: {names})"),
                            names=_names(same),
                        )
                    self._echo(" " * 10, named)
                explained.add(key)
            else:
                unexplained += 1
        if unimported:
            self._echo(
                " " * 6,
                _count(
                    len(unimported),
                    mark("(1 more check not run: your module could not be imported, above)"),
                    mark("({n} more checks not run: your module could not be imported, above)"),
                ),
            )
        if unexplained:
            self._echo(
                " " * 6,
                _count(
                    unexplained,
                    mark("(1 more failing check not explained; --verbose explains all)"),
                    mark("({n} more failing checks not explained; --verbose explains all)"),
                ),
            )

    def finish(self, report: Report) -> None:
        """The rest of the run, then the footer: the score (which half it is), the figures drawn
        and why the others were not."""
        self._done = True
        self._clear()
        self.flush()
        if not report.hidden_not_run and any(r.hidden for r in report.results):
            self._echo("  ", "· " + tr("hidden checks ran on grading seed {seed} (repeat with --seed {seed})", seed=report.seed))
        score = tr("score {score}/{total}", score=_pts(report.score), total=_pts(report.max_score))
        if report.hidden_not_run:
            score = _count(
                report.hidden_not_run,
                mark("{score} on the public checks · 1 hidden check runs at grading time"),
                mark("{score} on the public checks · {n} hidden checks run at grading time"),
                score=score,
            )
        self._echo("", click.style(score, bold=True))
        if report.figures:
            marked = set(report.marked)
            if marked >= set(report.figures):
                self._echo(
                    "  ", "· " + tr("figures (your wrong values marked): {paths}", paths=tr(", ").join(map(relative, report.figures)))
                )
            else:
                shown = [relative(p) + (" " + tr("(your wrong values marked)") if p in marked else "") for p in report.figures]
                self._echo("  ", "· " + tr("figures: {paths}", paths=tr(", ").join(shown)))
        removed = {Path(p).stem for p in report.removed}
        if report.undrawn:
            undrawn = tr(", ").join(
                tr("{figure} ({why}, its older file removed)", figure=f, why=escape.terminal(why))
                if f in removed
                else tr("{figure} ({why})", figure=f, why=escape.terminal(why))
                for f, why in report.undrawn.items()
            )
            waits = any(map(waiting, report.undrawn.values()))
            if waits:
                line = tr(
                    "not drawn: {figures}; a figure is drawn once its task returns an output of the right shape and type", figures=undrawn
                )
            else:
                line = tr("not drawn: {figures}", figures=undrawn)
            self._echo("  ", "· " + line)
        for note in map(escape.terminal, report.figure_notes):  # a drawing error may quote the student's values
            figure_id = note.split(":", 1)[0]
            if " " in figure_id:  # not a figure's own note ("figures not written: …"): ids have no spaces
                self._echo("  ", f"· {note}")
            elif figure_id in removed:
                self._echo("  ", "· " + tr("figure {note}, its older file removed", note=note))
            else:
                self._echo("  ", "· " + tr("figure {note}", note=note))
        if report.limits:
            self._echo("  ", "· " + tr("sandbox limits: {limits}", limits=report.limits))


def relative(path: str) -> str:
    """`path` to show on the terminal: relative to the working directory when it lies below it, else as
    given; escaped (`grader.delivery.escape.terminal`), since a folder of it may be named by a student."""
    try:
        shown = str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        shown = str(path)
    return escape.terminal(shown)


class CourseScreen:
    """`course check all` on a terminal: one line per chapter, in course order, each printed as soon as the
    chapters before it are done (a line for a chapter names its failing tasks, not their explanations:
    `course check chNN` gives those), then the total.

    Fitted to the terminal's width: the chapters' titles are bilingual where that fits, else English,
    else Chinese (the same form for every line, so that the scores align); a line's list of failing tasks
    that does not fit goes on the lines below it, wrapped with an indent. `width` 0: not a terminal, so
    nothing is fitted (the bilingual titles, one line per chapter)."""

    INDENT = " " * 8

    def __init__(self, ids: list[str], what: str, *, jobs: int, seed: int, width: int | None = None) -> None:
        self.ids, self.next = ids, 0
        self.done: dict[str, Report | str] = {}
        self.width = terminal_width() if width is None else width
        found = _chapters(ids)
        forms = [
            {ch.id: t for ch, t in zip(found, titles)}
            for titles in ([c.title for c in found], [c.title_en for c in found], [c.title_zh for c in found])
        ]
        room = lambda titles: max((columns(t) for t in titles.values()), default=0)
        self.titles = next((f for f in forms if not self.width or room(f) + 19 <= self.width), forms[1])
        self.title_width = room(self.titles)
        n_chapters = _count(len(ids), mark("1 chapter"), mark("{n} chapters"))
        workers = _count(jobs, mark("1 worker"), mark("{n} workers"))
        head = mark("course · {chapters} · {what} · {workers}, grading seed {seed}")
        head = tr(head, chapters=n_chapters, what=what, workers=workers, seed=seed)
        self.say(head)

    def say(self, text: str, indent: str = "") -> None:
        """Print a line wrapped to the width, its continuation lines indented past `indent`."""
        for line in wrap(text, self.width, indent):
            click.echo(line)

    def add(self, report: Report) -> None:
        self.done[report.chapter.id] = report
        self._flush()

    def failed(self, chapter_id: str, reason: str) -> None:
        self.done[chapter_id] = reason
        self._flush()

    def _flush(self) -> None:
        while self.next < len(self.ids) and self.ids[self.next] in self.done:
            chapter_id = self.ids[self.next]
            outcome = self.done[chapter_id]
            self.next += 1
            if isinstance(outcome, str):
                self.say(f"✗ {chapter_id}  " + tr("not run: {reason}", reason=escape.terminal(outcome)), "  ")
                continue
            title = self.titles[chapter_id]
            title += " " * (self.title_width - columns(title))
            score = f"{_pts(outcome.score)}/{_pts(outcome.max_score)}".rjust(7)
            bad = [task for task, rs in outcome.by_task() if any(r.status != "passed" for r in rs)]
            sign = "✓" if not bad else "✗"
            if bad:
                tail = tr("{tasks} not passing → course check {chapter}", tasks=", ".join(bad), chapter=chapter_id)
            else:
                tail = f"({outcome.elapsed:.1f} s)"
            head = f"  {sign} {chapter_id}  {title}  {score}"
            if not self.width or columns(f"{head}  {tail}") <= self.width:
                click.echo(f"{head}  {tail}")
            else:
                click.echo(head.rstrip())
                self.say(tail, self.INDENT)

    def finish(self, course: Any, figures: Path | None) -> None:
        self._flush()
        hidden = sum(r.hidden_not_run for r in course.reports)
        line = tr("score {score}/{total}", score=_pts(course.score), total=_pts(course.max_score))
        line += " · " + _count(len(course.reports), mark("1 chapter in {s:.1f} s"), mark("{n} chapters in {s:.1f} s"), s=course.elapsed)
        if hidden:
            line += " · " + _count(hidden, mark("1 hidden check run at grading time"), mark("{n} hidden checks run at grading time"))
        first, *rest = wrap(line, self.width)
        click.echo(click.style(first, bold=True))
        for more in rest:
            click.echo(more)
        if any(r.hidden for rep in course.reports for r in rep.results):
            self.say("· " + tr("hidden checks ran on grading seed {seed} (repeat with --seed {seed})", seed=course.seed), "  ")
        drawn = sum(len(r.figures) for r in course.reports)
        if figures is not None and drawn:
            where = f"{relative(str(figures))}/<chapter>/"
            self.say("· " + _count(drawn, mark("1 figure in {folder}"), mark("{n} figures in {folder}"), folder=where), "  ")


def _chapters(ids: list[str]) -> list[Chapter]:
    from grader import chapters

    return [chapters.find(i) for i in ids]


# -- columns (`course list`) ---------------------------------------------------------------------------------
# Cells are measured in terminal columns (a CJK character takes two). When the rows are wider than the
# terminal, one column, the one holding prose (a chapter's title, a task's signature), wraps within its own
# width and the others keep theirs; a bilingual title breaks at its " · " first (its Chinese half above its
# English half), then at spaces. Not a terminal (width 0): as wide as the rows are, one line per row.
GAP = "  "
"""Between two columns."""
MIN_FLEX = 16
"""The wrapping column never gets narrower than this: below it, a line overflows instead."""


def fit(text: str, width: int) -> list[str]:
    """`text` as lines of at most `width` columns: whole " · "-separated parts where they fit (a line
    that continues ends in " ·"), a part too long by itself broken at spaces."""
    if columns(text) <= width:
        return [text]
    lines: list[str] = []
    line = ""
    for part in text.split(" · "):
        joined = f"{line} · {part}" if line else part
        if columns(joined) <= width:
            line = joined
            continue
        if line:
            lines.append(line + " ·")
        pieces = wrap(part, width) if columns(part) > width else [part]
        lines += pieces[:-1]
        line = pieces[-1]
    return lines + [line]


def table(rows: Sequence[Sequence[str]], *, right: Collection[int] = (), flex: int | None = None, width: int | None = None) -> list[str]:
    """`rows` (the first a header) as aligned lines, fitted to `width` columns (default: the terminal's;
    0: unfitted) by wrapping column `flex`; the columns in `right` are aligned to the right."""
    width = terminal_width() if width is None else width
    n = len(rows[0])
    widths = [max(columns(r[i]) for r in rows) for i in range(n)]
    if width and flex is not None and sum(widths) + len(GAP) * (n - 1) > width:
        room = width - (sum(widths) - widths[flex]) - len(GAP) * (n - 1)
        widths[flex] = max(room, min(widths[flex], MIN_FLEX))
    lines = []
    for row in rows:
        cells = [fit(c, widths[i]) if i == flex else [c] for i, c in enumerate(row)]
        for k in range(max(len(c) for c in cells)):
            parts = []
            for i, cell in enumerate(cells):
                text = cell[k] if k < len(cell) else ""
                pad = " " * max(0, widths[i] - columns(text))
                parts.append(pad + text if i in right else text + pad)
            lines.append(GAP.join(parts).rstrip())
    return lines
