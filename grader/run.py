"""Running a chapter's checks against one student module (or the reference).

The student's module runs in a child process; inputs, expected values,
comparisons, scores and figures all stay here, in the trusted process. This
module imports no torch: the student's process is started first, so its torch
import overlaps the one this process needs for the checks.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Mapping, cast

from grader import chapters, checks
from grader.chapters import Chapter
from grader.i18n import tr
from grader.isolation import budget, portable, procs, worker
from grader.isolation.worker import OUTPUT_LIMIT, Worker
from grader.report import CheckResult, Report, waits_for

DEFAULT_MEMORY_LIMIT = budget.DEFAULT_LIMIT
DEFAULT_FIGURES_DIR = Path("course-figures")


class MissingModule(FileNotFoundError):
    """The folder being graded has no file for this chapter."""


def module_path(chapter: Chapter, *, solutions: bool = False, submission: Path | None = None) -> Path:
    """The file to grade: the reference, a submission folder's copy, or the stub in exercises/."""
    folder = chapters.SOLUTIONS if solutions else Path(submission) if submission else chapters.EXERCISES
    path = (folder / chapter.filename).absolute()
    if not path.is_file() and not path.is_symlink():
        if not solutions and submission is None:  # the student's own exercises/: say how to get the stub back
            raise MissingModule(chapters.missing_exercise(chapter))
        raise MissingModule(
            tr(
                "{folder} has no {file}; a submission holds the chapter modules under the same file names as exercises/",
                folder=folder,
                file=chapter.filename,
            )
        )
    return path


def check(
    chapter: str,
    *,
    task: str | None = None,
    solutions: bool = False,
    submission: Path | None = None,
    seed: int | None = None,
    hidden: bool | None = None,
    public: bool = True,
    figures_dir: Path | None = DEFAULT_FIGURES_DIR,
    time_limit: float = checks.DEFAULT_TIME_LIMIT,
    memory_limit: int = DEFAULT_MEMORY_LIMIT,
    on_result: Callable[[CheckResult], None] | None = None,
    refs: Callable[[str], object] | None = None,
    launcher: Callable[..., Worker] | None = None,
    time_limits: Mapping[str, float] | None = None,
    sandbox: str | None = None,
    source: bytes | None = None,
    on_start: Callable[[str, str], None] | None = None,
    uid: int | None = None,
) -> Report:
    """Run a chapter's checks and draw its figures from the graded code's outputs.

    Args:
        chapter: "ch25", "25" or the slug.
        task: only this task ("ch25.1").
        solutions: grade the reference solutions instead of exercises/.
        submission: grade the chapter module found in this folder.
        seed: grading seed for the hidden checks (random when None; always reported).
        hidden: run the hidden checks; by default only when grading solutions or a submission.
        public: run the public checks (False with hidden=True runs the hidden ones alone).
        figures_dir: where figures go (as <dir>/<chapter>/<figure>.svg); None draws nothing.
        time_limit: seconds each check may spend in student code.
        memory_limit: bytes the student's code may use, all its processes together (`grader.isolation.budget`:
            memory in use, never address space reserved).
        on_result: called with each result as soon as it is known.
        on_start: called with (task, check name) as each check begins.
        refs: who answers a check's `t.ref` (check key -> object); by default the reference
            solutions, or in a student release the recorded answers.
        launcher: starts a student process (keywords workdir, output_limit); by default one forked from a
            warm process made for this run (`grader.isolation.zygote`), or on the portable route a fresh
            interpreter (`grader.isolation.worker.start`). Ignored with `sandbox`.
        time_limits: per-check limits by check key, overriding `time_limit` (see grader.delivery.grade).
        sandbox: "bwrap" or "uid": the code runs in a sandbox made for this one run and torn down
            (every process of it ended) before this returns; SandboxUnavailable if none can be made.
        source: the module's text as the trusted side read it (`grader.delivery.submission`); by default
            the file is read here, without following a link.
        uid: with `sandbox`, the host uid its processes run as (as root; by default one of its
            own per box, `grader.isolation.sandbox.Box`), e.g. a dedicated user's.

    Public checks run first; the hidden ones then run in a fresh process, so nothing the student's
    code saw during them can surface in a public check's output. After a check of a task runs
    out of time, that task's remaining checks are not run (no credit; the reason is given).
    """
    started = time.monotonic()
    ch = chapters.find(chapter)
    only = ch.task(task).id if task else None
    path = module_path(ch, solutions=solutions, submission=submission)
    procs.become_subreaper()
    baseline = procs.children()
    workdir = Path(tempfile.mkdtemp(prefix="course-run-"))
    box = zygote = own_budget = None
    warm = False
    try:
        if sandbox:
            from grader.isolation.sandbox import Box, probe
            from grader.isolation.zygote import Zygote

            probe(sandbox)
            box = Box(sandbox, {ch.filename: read_module(path) if source is None else source}, uid=uid, memory=memory_limit)
            path = box.inbox / ch.filename
            zygote = Zygote(box=box, lazy=True)  # its torch import overlaps ours
            launcher = zygote.start
        elif launcher is None and portable.can_fork():  # a warm process: a fresh student process (the hidden checks'
            launcher = warm_launcher()  # own, one after a crash) then costs a fork, not an interpreter
            warm = launcher is not None
        run_budget = box.budget if box is not None and box.budget is not None else (own_budget := budget.make(memory_limit))
        spawn = functools.partial(
            launcher or functools.partial(worker.start, root=chapters.ROOT), workdir=workdir, output_limit=OUTPUT_LIMIT
        )
        strays = _stray_finder(launcher, baseline)
        first = None if zygote or warm else spawn()  # a warm process is waited for once torch is imported here
        report = _run(
            ch,
            only,
            path,
            solutions,
            submission,
            seed,
            hidden,
            public,
            figures_dir,
            time_limit,
            on_result,
            on_start,
            refs,
            spawn,
            first,
            strays,
            time_limits,
            started,
            run_budget,
        )
        report.limits = box.instead() if box is not None else ""
        return report
    finally:
        if zygote is not None:
            zygote.close()
        if box is not None:
            box.close()  # every process of the submission is gone before its result is used
        if own_budget is not None:
            own_budget.close()
        shutil.rmtree(workdir, ignore_errors=True)


def _run(
    ch,
    only,
    path,
    solutions,
    submission,
    seed,
    hidden,
    public,
    figures_dir,
    time_limit,
    on_result,
    on_start,
    refs,
    spawn,
    first,
    strays,
    time_limits,
    started,
    run_budget,
) -> Report:
    import gc

    import torch  # imported only now that the student's process is starting: the two imports overlap

    from grader.authoring import reference
    from grader.authoring.trial import not_run, run_one
    from grader.isolation.session import Session

    session = Session(path, spawn=spawn, worker=first, time_limit=time_limit, budget=run_budget)
    gc.freeze()  # torch's many objects stay out of full garbage collections (about 0.1 s each)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the student's process computes beside us on a small machine
    try:
        with_hidden = (solutions or submission is not None) if hidden is None else hidden
        specs = [s for s in checks.load(ch.id, with_hidden=with_hidden) if only in (None, s.task) and (public or s.hidden)]
        specs.sort(key=lambda s: s.hidden)  # stable: public checks first, in order, then the hidden ones
        answers = reference.load_answers(ch.id)
        refs = refs or reference.factory(solutions_module(ch), answers)
        report = Report(ch, str(path), secrets.randbelow(2**31) if seed is None else seed)
        if not with_hidden or not checks.has_hidden(ch.id):
            report.hidden_not_run = hidden_count(ch, answers, only)
        names = {t.id: t.name for t in ch.tasks}
        params = {name: p for t in ch.tasks for name, p in t.params.items()}
        hung: dict[str, str] = {}
        for i, spec in enumerate(specs):
            if spec.hidden and (i == 0 or not specs[i - 1].hidden):
                session.fresh()  # the hidden checks meet a process that never saw a public one
            if on_start:
                on_start(spec.task, spec.name)
            if spec.task in hung:
                result = not_run(spec, names.get(spec.task, "?"), hung[spec.task])
            else:
                result = run_one(
                    spec,
                    names.get(spec.task, "?"),
                    session=session,
                    ref=refs(spec.key),
                    seed=report.seed,
                    params=params,
                    figures=report.records,
                    time_limit=spec.time_limit or (time_limits or {}).get(spec.key) or time_limit,
                    strays=strays,
                )
                if result.status == "timeout":
                    hung[spec.task] = (
                        tr("importing {file} ran out of time", file=path.name)
                        if session.load_failure
                        else tr("{function} ran out of time in “{check}”", function=result.function, check=result.name)
                    )
            failure = session.load_failure
            if failure is not None and result.status != "passed" and (str(failure) in result.message or result.status == "not run"):
                result.import_failed = True  # one cause for the whole run, reported once
            report.results.append(result)
            if on_result:
                on_result(result)
    finally:
        session.close()
        torch.set_num_threads(threads)
    if figures_dir is not None:
        draw(report, Path(figures_dir))
    report.elapsed = time.monotonic() - started
    return report


_WARM: dict[int, object] = {}
"""This process's warm process for runs without a sandbox (by pid: a forked copy of this process makes its own)."""


def warm_launcher() -> Callable[..., Worker] | None:
    """The launcher of this process's warm process (grader.isolation.zygote), made on first use and kept for the
    runs that follow (ended when the process exits); None where none can start (fresh interpreters then)."""
    import atexit

    from grader.isolation.zygote import Zygote, ZygoteError

    zygote = _WARM.get(os.getpid())
    if zygote is None or cast(Zygote, zygote).proc.poll() is not None:
        try:
            zygote = Zygote(lazy=True)  # its torch import overlaps the caller's
        except (ZygoteError, OSError):
            return None
        _WARM.clear()
        _WARM[os.getpid()] = zygote
        atexit.register(zygote.close)
    return cast(Zygote, zygote).start


def _stray_finder(launcher, baseline: set[int]) -> Callable[[set[int]], list[str]]:
    """Who finds the processes student code left running: the box the warm process runs in (all
    of its processes, seen from outside), or for a fresh interpreter this process, a subreaper."""
    launcher = launcher or worker.start
    zygote = getattr(getattr(launcher, "func", launcher), "__self__", None)
    box = getattr(zygote, "box", None)
    if box is not None:
        return lambda keep: box.strays(keep)

    def find(keep: set[int]) -> list[str]:
        found = []
        for pid in [d for k in keep for d in procs.descendants(k)]:
            name = procs.describe(pid)
            if name:
                found.append(name)
            procs.kill(pid)
        return found + procs.kill_strays(baseline | keep)

    return find


def read_module(path: Path, max_bytes: int = 1 << 20) -> bytes:
    """A chapter module's bytes, read without following a link, at most `max_bytes`."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        import stat

        if not stat.S_ISREG(info.st_mode):
            raise MissingModule(tr("{file} is not a regular file", file=path.name))
        if info.st_size > max_bytes:
            raise MissingModule(
                tr(
                    "{file} is {size:.1f} MiB, over the {limit} MiB a chapter file may have",
                    file=path.name,
                    size=info.st_size / 2**20,
                    limit=max_bytes >> 20,
                )
            )
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(max_bytes + 1)
    finally:
        os.close(fd)


def hidden_count(ch: Chapter, answers: dict | None, only: str | None = None) -> int:
    """How many hidden checks grading runs (for one task when `only`), here or in a release."""
    if checks.has_hidden(ch.id):
        counts: dict[str, int] = {}
        for s in checks.load(ch.id, with_hidden=True):
            counts[s.task] = counts.get(s.task, 0) + s.hidden
    else:
        counts = (answers or {}).get("hidden", {})
    return sum(n for task, n in counts.items() if only in (None, task))


def solutions_module(ch: Chapter):
    """The reference solutions, imported here in the trusted process (None in a student release)."""
    if not (chapters.SOLUTIONS / ch.filename).is_file():
        return None
    return importlib.import_module(f"solutions.{ch.filename[:-3]}")


def project_root(start: Path) -> Path | None:
    """The nearest folder at or above `start` that holds an exercises/ folder or a pyproject.toml
    (a course project: the instructor's repository or a student release), or None."""
    for folder in [start, *start.parents]:
        if (folder / "exercises").is_dir() or (folder / "pyproject.toml").is_file():
            return folder
    return None


def default_figures_dir(module: Path, cwd: Path | None = None, *, others: bool = False) -> Path:
    """Where `course check` puts figures unless told: for one's own code (exercises/, the solutions), course-figures/
    at the project root, found from the graded module's folder, else by walking up from `cwd`; the cwd itself
    outside any project. For somebody else's code (`others`: --submission, --notebook) always `cwd`/course-figures:
    a folder is never looked for inside a submission, which could carry a pyproject.toml and planted links."""
    cwd = Path.cwd() if cwd is None else cwd
    if others:
        return cwd.absolute() / DEFAULT_FIGURES_DIR
    root = project_root(Path(module).absolute().parent) or project_root(cwd.absolute()) or cwd
    return root / DEFAULT_FIGURES_DIR


_WRONG_MARK = re.compile(r'<[^<>]*\sclass="(?:[^"]*\s)?wrong[\s"-]')
"""An element the figure marks as the student's wrong value: the figures give those a class
"wrong" (or "wrong-…"); a figure drawn from the reference has none. Only a tag matches, never
text (a value shown in the figure cannot hold a "<")."""


def draw(report: Report, out_dir: Path) -> None:
    """Render every figure whose data the checks recorded into out_dir/<chapter>/<id>.svg, and remove
    that chapter's figures this run did not draw although it ran their tasks (an older file could
    show a right answer beside wrong code); files other than the chapter's own figures are never
    touched. Folders are opened and files written without following a link (`grader.delivery.files`):
    a planted link is refused, never written through. A figure that cannot be drawn or written is a
    note: a drawing error never hides a verdict."""
    import figures
    from grader.delivery.files import Folder

    chapter_dir = out_dir / report.chapter.id
    ran = {r.task for r in report.results}
    drawn: set[str] = set()
    unwritable = None
    specs = figures.catalog(report.chapter.id)
    opened: list[Folder] = []

    def folder(create: bool) -> Folder | None:
        """The chapter's folder, opened once (made when `create`; None when it is absent and not to be made)."""
        if not opened:
            try:
                opened.append(Folder.open(out_dir, report.chapter.id, create=create))
            except FileNotFoundError:
                if create:
                    raise
                return None
        return opened[0]

    try:
        for spec in specs:
            record = report.records.get(spec.id)
            missing = spec.missing(record)
            if record is None:
                tasks = list(dict.fromkeys(spec.needs.values()))
                left_out = [t for t in tasks if t not in ran]
                report.undrawn[spec.id] = (
                    tr("{tasks} left out of this run", tasks=", ".join(left_out)) if left_out else waits_for(", ".join(tasks))
                )
                continue
            if missing:
                if len(missing) == 1:
                    note = tr("{figure}: drawn once {task} passes its shape and type checks", figure=spec.id, task=missing[0])
                else:
                    note = tr("{figure}: drawn once {tasks} pass their shape and type checks", figure=spec.id, tasks=", ".join(missing))
                report.figure_notes.append(note)
                continue
            if unwritable:
                continue
            try:
                svg = spec.render(record)
            except Exception as e:
                error = f"{type(e).__name__}: {e}"
                report.figure_notes.append(tr("{figure}: could not be drawn ({error})", figure=spec.id, error=error))
                continue
            try:
                path = cast(Folder, folder(True)).write(f"{spec.id}.svg", svg)
            except OSError as e:
                unwritable = tr("figures not written: {folder} cannot be written ({error})", folder=chapter_dir, error=e.strerror or e)
                report.figure_notes.append(unwritable)
                continue
            drawn.add(spec.id)
            report.figures.append(str(path))
            if _WRONG_MARK.search(svg):
                report.marked.append(str(path))
        _remove_stale(report, specs, ran, drawn, chapter_dir, folder)
    finally:
        for f in opened:
            f.close()


def _remove_stale(report: Report, specs, ran: set[str], drawn: set[str], chapter_dir: Path, folder) -> None:
    """Remove the chapter's figures this run did not draw although it ran their tasks (never through a link)."""
    try:
        here = folder(False)
    except OSError:
        return  # a link or not a folder: nothing of ours to remove there
    if here is None:
        return
    for spec in specs:
        name = f"{spec.id}.svg"
        old, kind = chapter_dir / name, here.kind(name)
        if not set(spec.needs.values()) <= ran:  # `--task`: the figure of a task not run now stays as it was
            if kind == "file" and spec.id in report.undrawn:
                report.undrawn[spec.id] = tr("{why}, its file from an earlier run kept", why=report.undrawn[spec.id])
            continue
        if spec.id not in drawn and kind in ("file", "link"):
            try:
                here.unlink(name)
            except OSError as e:
                report.figure_notes.append(
                    tr(
                        "{figure}: not drawn, and its older file could not be removed ({error}): {old} is out of date",
                        figure=spec.id,
                        error=e.strerror or e,
                        old=old,
                    )
                )
                continue
            report.removed.append(str(old))
