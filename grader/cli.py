"""`course`: the command line. Each command is a thin layer over one grader function."""

from __future__ import annotations

import copy
import difflib
import functools
import inspect
import json
import re
import secrets
import shutil
import sys
from pathlib import Path
from typing import Any, Callable, Collection, Sequence

import click

from grader import chapters, progress
from grader.chapters import Chapter, UnknownName
from grader.delivery import doctor, escape
from grader.i18n import LANGUAGES, choose, commands, mark, tr

ALL = "all"
"""`course check all`: every chapter."""


class ChapterType(click.ParamType):
    """A chapter given as ch25, 25 or its slug (or, where `whole`, "all"); an unknown one gets "did you mean"."""

    name = "chapter"

    def __init__(self, *, whole: bool = False) -> None:
        self.whole = whole

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, Chapter) or (self.whole and value == ALL):
            return value
        try:
            return chapters.find(str(value))
        except UnknownName as e:
            self.fail(str(e), param, ctx)


class ByteSize(click.ParamType):
    """A size in bytes written as people write it: 2G, 512M, 64k or 1073741824."""

    name = "size"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)i?[bB]?\s*", str(value))
        if not m:
            self.fail(tr("{value} is not a size like 2G, 512M or 1073741824", value=repr(value)), param, ctx)
        return int(float(m.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m.group(2).lower()])


def memory_limit_option(help: str) -> Callable[[Callable], Callable]:
    """`--memory-limit`, its `help` a marked text (translated when shown)."""
    return click.option("--memory-limit", type=ByteSize(), default="2G", show_default=True, help=help)


YOUR_MEMORY = mark("Memory your code's processes may use, all together (what they use, not the address space they reserve).")
STUDENT_MEMORY = mark("Memory a student's processes may use, all together (what they use, not the address space they reserve).")


solutions_option = click.option("--solutions", is_flag=True, help=mark("Run the reference solutions (instructors)."))
submission_option = click.option(
    "--submission",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    metavar="DIR",
    help=mark("Run the chapter module(s) in DIR (same file names as exercises/)."),
)


INSTRUCTOR_COMMANDS = ("grade", "release", "export", "stubs")
"""Commands that need the instructor's repository (solutions, hidden checks): absent from a student release."""
INSTRUCTOR_OPTIONS = {"check": ("solutions", "hidden", "seed"), "lab": ("solutions",)}
"""Per command, the options that need it (the reference, the hidden checks and their seed)."""


class CourseGroup(click.Group):
    """`course`'s commands. In a student release (no solutions/) the instructor parts are absent: neither listed
    in --help nor parsed nor suggested, so one command line serves both installations. Every command speaks the
    run's language (`--lang`, anywhere on the line; `grader.i18n.commands`)."""

    def main(self, args: Sequence[str] | None = None, *a: Any, **kw: Any) -> Any:
        commands.install()
        commands.choose_from(sys.argv[1:] if args is None else list(args))
        return super().main(args, *a, **kw)

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        original, params = self.help, self.params
        self.help = tr(inspect.cleandoc(self.help)) if self.help else self.help
        self.params = commands.translated_params(self.params)
        try:
            super().format_help(ctx, formatter)
        finally:
            self.help, self.params = original, params

    def list_commands(self, ctx: click.Context) -> list[str]:
        names = super().list_commands(ctx)
        return names if chapters.has_solutions() else [n for n in names if n not in INSTRUCTOR_COMMANDS]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        command = super().get_command(ctx, name)
        if command is None or chapters.has_solutions():
            return None if command is None else commands.translated(command)
        if name in INSTRUCTOR_COMMANDS:
            return None
        return commands.translated(_without(command, INSTRUCTOR_OPTIONS.get(name, ())))

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple:
        name = click.utils.make_str(args[0])
        shown = self.list_commands(ctx)
        if chapters.has_solutions() or name in shown or name.startswith("-") or ctx.resilient_parsing:
            return super().resolve_command(ctx, args)
        close = difflib.get_close_matches(name, shown, n=1)  # never an instructor command
        if close:
            ctx.fail(tr("No such command {name}. Did you mean {close}?", name=repr(name), close=repr(close[0])))
        ctx.fail(tr("No such command {name}.", name=repr(name)))


def _without(command: click.Command, names: tuple[str, ...]) -> click.Command:
    """A copy of `command` without the options `names`, which its function then gets at their defaults."""
    dropped = [p for p in command.params if p.name in names]
    if not dropped:
        return command
    student = copy.copy(command)
    student.params = [p for p in command.params if p not in dropped]
    assert command.callback is not None
    student.callback = functools.partial(command.callback, **{p.name: _default(command, p) for p in dropped if p.name})
    return student


def _default(command: click.Command, param: click.Parameter) -> object:
    """The value `param` takes when not given, as click would pass it (False for a flag, None for an option
    without a default: click marks those with a sentinel of its own that is not None)."""
    value = param.get_default(click.Context(command))
    return None if value is getattr(click.core, "UNSET", None) else value


@click.group(cls=CourseGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--lang", type=click.Choice(LANGUAGES), expose_value=False, is_eager=True, help=commands.LANG_HELP)
@click.version_option(doctor.version(), "--version", prog_name="course", message="%(prog)s %(version)s")
def main() -> None:
    """Exercises and autograder of the LLM inference engine course (`course list` shows its chapters).

    Implement the TODOs in exercises/chNN_*.py, then run `course check chNN`.
    """


@main.command("doctor")
@click.option("--json", "as_json", is_flag=True, help=mark("Print the findings as one JSON document."))
@click.option("--quick", is_flag=True, help=mark("Do not start a student process (saves a second or two)."))
def doctor_command(as_json: bool, quick: bool) -> None:
    """What this installation can do: Python, torch and its devices, the memory budget, the sandbox, fonts.

    Paste its output into a question. Exit status 1 when something blocks `course check`.
    """
    findings = doctor.examine(start_process=not quick)
    click.echo(json.dumps(doctor.to_json(findings), ensure_ascii=False, indent=2) if as_json else doctor.report(findings))
    sys.exit(doctor.exit_code(findings))


@main.command("list")
@click.argument("chapter", type=ChapterType(), required=False)
def list_command(chapter: Chapter | None) -> None:
    """List the chapters with their points and how your last check went; with CHAPTER (e.g. ch25), its tasks."""
    from grader import checks

    if chapter is not None:
        _list_tasks(chapter, checks.points(chapter.id))
        return
    rows = [(tr("chapter"), tr("title"), tr("tasks"), tr("points"), tr("status"))]
    for ch in chapters.all_chapters():
        worth = checks.points(ch.id)
        rows.append(
            (
                ch.id,
                ch.title,
                str(len(ch.tasks)),
                _points(sum(p for p, _ in worth.values()), sum(h for _, h in worth.values())),
                progress.status(chapters.EXERCISES, ch.id, [t.id for t in ch.tasks]),
            )
        )
    _table(rows, right={2}, flex=1)
    _say(tr("`course list ch25` lists a chapter's tasks; hidden points are scored at grading time"))


def _list_tasks(ch: Chapter, worth: dict[str, tuple[float, float]]) -> None:
    """`course list CHAPTER`: each task with what it grades, its points and its last status."""
    last = progress.tasks(chapters.EXERCISES, ch.id)
    _say(f"{ch.id} · {ch.title}    exercises/{ch.filename}")
    rows = [(tr("task"), tr("implement"), tr("points"), tr("status"))]
    for t in ch.tasks:
        graded = ", ".join(f"{name}({', '.join(t.params.get(name, ()))})" for name in t.names)
        rows.append((t.id, graded, _points(*worth.get(t.id, (0.0, 0.0))), progress.task_status(last.get(t.id))))
    _table(rows, flex=1)
    todo = next((t.id for t in ch.tasks if not last.get(t.id) or last[t.id]["passed"] != last[t.id]["checks"]), None)
    if todo:
        _say(tr("next: `course check {chapter} --task {task}`; hidden points are scored at grading time", chapter=ch.id, task=todo))
    else:
        _say(tr("every task passes its public checks; hidden points are scored at grading time"))


def _points(public: float, hidden: float) -> str:
    return tr("{public:g} + {hidden:g} hidden", public=public, hidden=hidden) if hidden else f"{public:g}"


def _table(rows: Sequence[Sequence[str]], right: Collection[int] = (), flex: int | None = None) -> None:
    """Print rows in columns aligned by display width, fitted to the terminal by wrapping column `flex`."""
    from grader.terminal import table

    for line in table(rows, right=right, flex=flex):
        click.echo(line)


def _say(text: str) -> None:
    """Print a line of prose wrapped to the terminal."""
    from grader.terminal import terminal_width, wrap

    for line in wrap(text, terminal_width()):
        click.echo(line)


@main.command()
@click.argument("chapter", type=ChapterType(whole=True))
@click.option("--task", metavar="ID", help=mark("Only this task, e.g. ch25.1."))
@solutions_option
@submission_option
@click.option(
    "--notebook",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    metavar="PATH.ipynb",
    help=mark("Grade the answer cells of a chapter notebook."),
)
@click.option("--seed", type=int, help=mark("Grading seed of the hidden checks (printed after each run)."))
@click.option("--hidden/--no-hidden", default=None, help=mark("Run the hidden checks (default: with --solutions or --submission)."))
@click.option("--json", "as_json", is_flag=True, help=mark("Print one results.json document (Gradescope format) only."))
@click.option(
    "--figures",
    "figures_dir",
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    help=mark(
        "Write the figures to DIR/<chapter>/<figure>.svg (default: course-figures/ in the project "
        "folder, the one holding exercises/; for --submission and --notebook, in the current folder). A run "
        "replaces that chapter's figures there; links are never followed."
    ),
)
@click.option(
    "--time-limit", type=click.FloatRange(min=0.1), default=10.0, show_default=True, help=mark("Seconds each check may spend in your code.")
)
@memory_limit_option(YOUR_MEMORY)
@click.option(
    "-v",
    "--verbose",
    is_flag=True,
    help=mark("Explain every failing check (by default: each different explanation once, at most three per task)."),
)
@click.option(
    "--no-sandbox",
    is_flag=True,
    help=mark(
        "UNSAFE: run a --submission or --notebook without the sandbox (its code can then read and "
        "change this user's files, the reference included)."
    ),
)
@click.option("--jobs", type=click.IntRange(min=1), metavar="N", help=mark("With `all`: chapters checked at once (default: one per core)."))
def check(
    chapter: Chapter | str,
    task: str | None,
    solutions: bool,
    submission: Path | None,
    notebook: Path | None,
    seed: int | None,
    hidden: bool | None,
    as_json: bool,
    figures_dir: Path | None,
    time_limit: float,
    memory_limit: int,
    verbose: bool,
    no_sandbox: bool,
    jobs: int | None,
) -> None:
    """Check CHAPTER (e.g. ch25, or `all` for every chapter) and draw its figures from your outputs.

    Your own exercises/ run in a separate process; somebody else's code (--submission,
    --notebook) runs in a sandbox (bubblewrap) made for that one run, and without one
    the command refuses, unless --no-sandbox.

    Exit status: 0 all checks passed, 1 some failed, 2 some were blocked.
    """
    if not isinstance(chapter, Chapter):
        if task or notebook:
            raise click.UsageError(tr("`course check all` checks whole chapters: --task and --notebook name one chapter"))
        _check_all(
            solutions=solutions,
            submission=submission,
            seed=seed,
            hidden=hidden,
            as_json=as_json,
            figures_dir=figures_dir,
            time_limit=time_limit,
            memory_limit=memory_limit,
            no_sandbox=no_sandbox,
            jobs=jobs,
        )
        return
    import tempfile

    from grader.delivery.cells import cells_of, submission_from_cells
    from grader.run import MissingModule, default_figures_dir, module_path
    from grader.run import check as run_check
    from grader.terminal import TerminalReport

    if sum(map(bool, (solutions, submission, notebook))) > 1:
        raise click.UsageError(tr("--solutions, --submission and --notebook exclude each other"))
    scratch = None
    if notebook:
        try:
            cells = cells_of(notebook)
        except ValueError as e:
            raise click.ClickException(escape.terminal(e)) from None
        scratch = Path(tempfile.mkdtemp(prefix="course-notebook-"))
        submission = submission_from_cells(chapter, cells, scratch)
    if task:
        try:
            chapter.task(task)
        except UnknownName as e:
            raise click.BadParameter(str(e), param_hint="--task") from None
    try:
        target = module_path(chapter, solutions=solutions, submission=submission)
    except MissingModule as e:
        raise click.ClickException(escape.terminal(e)) from None
    if figures_dir is None:
        figures_dir = default_figures_dir(notebook if notebook else target, others=bool(submission or notebook))
    sandbox = _sandbox_for(others=submission is not None, no_sandbox=no_sandbox)
    screen = None if as_json else TerminalReport(chapter, str(target), verbose=verbose)
    try:
        report = run_check(
            chapter.id,
            task=task,
            solutions=solutions,
            submission=submission,
            seed=seed,
            hidden=hidden,
            figures_dir=figures_dir,
            time_limit=time_limit,
            memory_limit=memory_limit,
            on_result=screen.add if screen else None,
            on_start=screen.start if screen else None,
            sandbox=sandbox,
        )
    except MissingModule as e:
        raise click.ClickException(escape.terminal(e)) from None
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    if not solutions and not submission:
        try:
            progress.record(report)
        except OSError as e:  # only `course list` reads it: never worth losing the report for
            click.echo(tr("note: your progress could not be saved for `course list` ({error})", error=e), err=True)
    if notebook:
        report.target = str(notebook)
    if screen:
        screen.finish(report)
    else:
        click.echo(escape.json_document(json.dumps(report.to_json(), ensure_ascii=False, indent=2)))
    sys.exit(report.exit_code)


def _check_all(
    *,
    solutions: bool,
    submission: Path | None,
    seed: int | None,
    hidden: bool | None,
    as_json: bool,
    figures_dir: Path | None,
    time_limit: float,
    memory_limit: int,
    no_sandbox: bool,
    jobs: int | None,
) -> None:
    """`course check all`: every chapter, spread over the cores, on one grading seed."""
    from grader.course import check_all, default_jobs
    from grader.run import default_figures_dir
    from grader.terminal import CourseScreen

    if solutions and submission:
        raise click.UsageError(tr("--solutions and --submission exclude each other"))
    ids = [ch.id for ch in chapters.all_chapters()]
    folder = chapters.SOLUTIONS if solutions else submission if submission else chapters.EXERCISES
    missing = [ch.id for ch in chapters.all_chapters() if not (Path(folder) / ch.filename).is_file()]
    if submission and len(missing) == len(ids):
        raise click.ClickException(tr("{folder} holds no chapter module (file names as in exercises/)", folder=escape.terminal(submission)))
    only = [i for i in ids if i not in missing] if submission else None
    figures_dir = figures_dir or default_figures_dir(Path(folder) / "x.py", others=submission is not None)
    sandbox = _sandbox_for(others=submission is not None, no_sandbox=no_sandbox)
    seed = seed if seed is not None else secrets.randbelow(2**31)
    workers = min(jobs or default_jobs(), len(only or ids))
    what = tr("the reference solutions") if solutions else escape.terminal(submission) if submission else tr("your exercises/")
    screen = None if as_json else CourseScreen(only or ids, what, jobs=workers, seed=seed)
    course = check_all(
        solutions=solutions,
        submission=submission,
        seed=seed,
        hidden=hidden,
        jobs=workers,
        figures_dir=figures_dir,
        sandbox=sandbox,
        time_limit=time_limit,
        memory_limit=memory_limit,
        only=only,
        on_report=screen.add if screen else None,
        on_failure=screen.failed if screen else None,
    )
    if not solutions and not submission:
        for report in course.reports:
            try:
                progress.record(report)
            except OSError as e:
                click.echo(tr("note: your progress could not be saved for `course list` ({error})", error=e), err=True)
                break
    if screen:
        if submission and missing:
            screen.say("· " + tr("not in {folder}: {chapters}", folder=escape.terminal(submission), chapters=", ".join(missing)), "  ")
        screen.finish(course, figures_dir)
    else:
        click.echo(escape.json_document(json.dumps(course.to_json(), ensure_ascii=False, indent=2)))
    sys.exit(course.exit_code)


def _sandbox_for(*, others: bool, no_sandbox: bool) -> str | None:
    """The sandbox somebody else's code runs in: "bwrap", or None for the student's own exercises and
    with --no-sandbox (said on every run). Where none can be made, refuse, naming the fix."""
    from grader.isolation.sandbox import SandboxUnavailable, probe

    if not others:
        return None
    if no_sandbox:
        click.echo(
            click.style(
                tr(
                    "warning: --no-sandbox: this code runs with your own rights and can read and change "
                    "your files, the reference and the hidden checks included"
                ),
                fg="yellow",
                bold=True,
            ),
            err=True,
        )
        return None
    try:
        probe("bwrap")
    except SandboxUnavailable as e:
        raise click.ClickException(
            tr("refusing to run somebody else's code without a sandbox: {error}; or give --no-sandbox to run it anyway (unsafe)", error=e)
        ) from None
    return "bwrap"


def grade_line(row: dict) -> str:
    """A grades row as `course grade` prints it: the student's name and the status (which may quote their
    files) escaped, so that nothing of a submission acts on the terminal."""
    return f"{escape.terminal(row['student'])}  {row['chapter']}  {row['score']:g}/{row['max_score']:g}  {escape.terminal(row['status'])}"


@main.command()
@click.argument("submissions", type=click.Path(exists=True, file_okay=False, path_type=Path), required=False)
@click.option("--chapter", "chapter_names", multiple=True, required=True, type=ChapterType(), help=mark("A chapter to grade (repeatable)."))
@click.option(
    "--nbgrader",
    "nbgrader_course",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    metavar="COURSE_DIR",
    help=mark(
        "Grade an nbgrader course's submitted/<student>/<chapter>/ notebooks "
        "(no SUBMISSIONS) and write the scores into its gradebook and autograded/, for generate_feedback "
        "and export (instead of nbgrader autograde)."
    ),
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    metavar="OUT",
    help=mark(
        "Results: OUT/<student>/<chapter>/results.json, OUT/grades.csv, OUT/summary.md "
        "(required, except with --nbgrader: COURSE_DIR/course-grade)."
    ),
)
@click.option("--jobs", type=click.IntRange(min=1), default=2, show_default=True, help=mark("Submissions graded at once."))
@click.option(
    "--scheduler",
    metavar="ADDRESS",
    help=mark(
        "Grade on a running Dask cluster (tcp://HOST:PORT of its scheduler; needs course[grading]) instead of --jobs "
        "local processes: each worker grades in its own sandbox, the results come back here (see the README)."
    ),
)
@click.option("--force", is_flag=True, help=mark("Grade again what OUT already holds (with a new secret unless --seed)."))
@click.option(
    "--seed",
    type=int,
    help=mark(
        "The run's secret, as a number (repeatable, and guessable); by default a random one of 256 bits. Each "
        "student's hidden checks run on a seed derived from it and the student's name (all recorded in OUT/grading.json)."
    ),
)
@click.option(
    "--time-limit",
    type=click.FloatRange(min=0.1),
    default=5.0,
    show_default=True,
    help=mark(
        "The most a check may spend in a student's code; each check gets 50x what the reference "
        "needs in it, at least 0.5 s, at most this (recorded in OUT/grading.json)."
    ),
)
@memory_limit_option(STUDENT_MEMORY)
@click.option(
    "--no-sandbox",
    is_flag=True,
    help=mark(
        "Process isolation only (unsafe: a student's code could read your files); without it grading refuses where no sandbox can be made."
    ),
)
def grade(
    submissions: Path | None,
    chapter_names: tuple[Chapter, ...],
    nbgrader_course: Path | None,
    out: Path | None,
    jobs: int,
    scheduler: str | None,
    force: bool,
    seed: int | None,
    time_limit: float,
    memory_limit: int,
    no_sandbox: bool,
) -> None:
    """Grade a class: SUBMISSIONS holds one folder per student with their chapter files or notebooks.

    With --nbgrader COURSE_DIR instead, the course's submitted notebooks, scored into its gradebook.

    Reruns skip what is already graded (a killed run resumes where it stopped).
    """
    from grader.delivery.grade import GradeError
    from grader.delivery.grade import grade as grade_folders

    grade_class: Callable[..., Any] = grade_folders

    if (submissions is None) == (nbgrader_course is None):
        raise click.UsageError(
            tr("give SUBMISSIONS or --nbgrader COURSE_DIR, not both")
            if submissions
            else tr("missing argument SUBMISSIONS (or --nbgrader COURSE_DIR)")
        )
    if nbgrader_course:
        try:
            from grader.delivery.gradebook import grade_course  # same options, nbgrader's folders

            grade_class = grade_course
        except ImportError as e:
            raise click.ClickException(tr("--nbgrader needs nbgrader installed ({error})", error=e)) from None
        submissions, out = nbgrader_course, out or nbgrader_course / "course-grade"
        choose.for_grading(choose.course_setting(nbgrader_course / choose.SETTING.name))
    elif out is None:
        raise click.UsageError(tr("missing option '--out'"))
    assert submissions is not None and out is not None
    choose.for_grading()  # a grading machine's locale is its container's: the course's language instead
    bar = None
    tty = sys.stdout.isatty() if not scheduler else sys.stderr.isatty()  # on a cluster the bar is on stderr

    def plan(n: int, total: int, how: str) -> None:
        nonlocal bar
        unsafe = no_sandbox  # whatever language `how` is in
        click.echo(click.style(tr("sandbox: {how}", how=how), fg="yellow" if unsafe else None, bold=unsafe), err=unsafe)
        if n < total:
            click.echo(tr("{n} of {total} chapter submissions to grade ({done} graded already)", n=n, total=total, done=total - n))
        else:
            click.echo(tr("{n} of {total} chapter submissions to grade", n=n, total=total))
        if tty and n:
            bar = click.progressbar(length=n, label=tr("grading"), file=sys.stderr if scheduler else None).__enter__()

    def item(r: dict) -> None:
        if bar:
            bar.update(1)
        else:
            click.echo(grade_line(r))

    def note(text: str) -> None:
        # on a line of its own below the bar (which is on stderr too, and is drawn again at its next step)
        click.echo(("\n" if bar else "") + tr("note: {note}", note=escape.terminal(text)), err=True)

    cluster = dict(scheduler=scheduler, on_note=note) if scheduler else {}
    try:
        result = grade_class(
            submissions,
            list(chapter_names),
            out,
            **cluster,
            jobs=jobs,
            force=force,
            seed=seed,
            time_limit=time_limit,
            memory_limit=memory_limit,
            sandbox=not no_sandbox,
            on_plan=plan,
            on_item=item,
        )
    except GradeError as e:
        raise click.ClickException(escape.terminal(e)) from None
    except KeyboardInterrupt:
        if bar:
            bar.__exit__(None, None, None)
            bar = None
        click.echo("\n" + tr("interrupted: what was graded is kept, nothing half-written; run the same command again to resume"), err=True)
        sys.exit(130)
    finally:
        if bar:
            bar.__exit__(None, None, None)
    if nbgrader_course:
        for note in result.notes:
            click.echo(tr("note: {note}", note=escape.terminal(note)), err=True)
        click.echo(
            tr(
                "gradebook: {n} submissions scored, autograded/ written; next: "
                "nbgrader generate_feedback <chapter>, nbgrader export (in {course})",
                n=len(result.recorded),
                course=nbgrader_course,
            )
        )
        result = result.graded
    for worker, did in result.workers.items():
        student, chapter, slowest = did["slowest"]
        click.echo(
            tr(
                "worker {worker}: {n} graded in {seconds:.1f} s ({mean:.2f} s each; slowest {student}/{chapter}, {slowest:.1f} s)",
                worker=escape.terminal(worker),
                n=did["items"],
                seconds=did["seconds"],
                mean=did["seconds"] / did["items"],
                student=escape.terminal(student),
                chapter=chapter,
                slowest=slowest,
            )
        )
    click.echo(f"{result.count_line()} · {escape.terminal(out / 'grades.csv')}, {escape.terminal(out / 'summary.md')}")


@main.command()
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    metavar="DIR",
    help=mark("Writes DIR/student/ (the student package) and DIR/nbgrader/ (the nbgrader course)."),
)
@click.option("--chapter", "chapter_names", multiple=True, type=ChapterType(), help=mark("Only these chapters (repeatable)."))
@click.option("--no-nbgrader", is_flag=True, help=mark("Write only the student package."))
def release(out: Path, chapter_names: tuple[Chapter, ...], no_nbgrader: bool) -> None:
    """Build the student release and the nbgrader course (no solutions, no hidden checks in the former)."""
    from grader.delivery.release import ReleaseError, build

    try:
        built = build(out, chapter_list=list(chapter_names) or None, nbgrader=not no_nbgrader, lang=choose.for_grading())
    except ReleaseError as e:
        raise click.ClickException(str(e)) from None
    click.echo(
        tr(
            "student package: {folder} ({kib:.0f} KiB, chapters {chapters}); install with: pip install -e {folder}",
            folder=built.student,
            kib=built.size(built.student) / 1024,
            chapters=", ".join(built.chapters),
        )
    )
    if built.nbgrader:
        click.echo(
            tr(
                "nbgrader course: {folder} (assignments {chapters}); cd there and run: nbgrader generate_assignment <chapter>",
                folder=built.nbgrader,
                chapters=", ".join(built.chapters),
            )
        )


@main.group()
def export() -> None:
    """Export to a grading platform."""


@export.command("gradescope")
@click.argument("chapter", type=ChapterType())
@click.option(
    "-o",
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    metavar="ZIP",
    help=mark("The autograder bundle to write (upload it as the assignment's autograder)."),
)
@click.option(
    "--seed",
    type=int,
    help=mark(
        "The bundle's secret, as a number (repeatable, and guessable: for tests); by default a random one of 256 bits. "
        "Each student's hidden checks run on a seed derived from it and the student's Gradescope id."
    ),
)
@click.option(
    "--hidden-visibility",
    type=click.Choice(["after_due_date", "after_published", "visible", "hidden"]),
    default="after_due_date",
    show_default=True,
    help=mark("When students see the hidden checks' results (Gradescope's visibility)."),
)
def export_gradescope(chapter: Chapter, out: Path, seed: int | None, hidden_visibility: str) -> None:
    """A Gradescope autograder bundle for CHAPTER: setup.sh, run_autograder and the package with its hidden checks."""
    from grader.delivery.gradescope import export as build

    if not any(chapters.SOLUTIONS.glob("ch[0-9][0-9]_*.py")):
        raise click.ClickException(tr("a Gradescope bundle carries the hidden checks: build it from the instructor's repository"))
    build(chapter, out, seed=seed, hidden_visibility=hidden_visibility, lang=choose.for_grading())
    click.echo(
        tr(
            "{zip} ({kib:.0f} KiB): upload it as the autograder of {chapter}; students submit exercises/{file} or their chapter notebook",
            zip=out,
            kib=out.stat().st_size / 1024,
            chapter=chapter.id,
            file=chapter.filename,
        )
    )


@main.command()
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("course-book"),
    show_default=True,
    metavar="DIR",
    help=mark("Where index.html and the figures go."),
)
@submission_option
@click.option("--jobs", type=click.IntRange(min=1), metavar="N", help=mark("Chapters checked at once (default: one per core)."))
@click.option("--no-sandbox", is_flag=True, help=mark("UNSAFE: run a --submission without the sandbox."))
def figures(out: Path, submission: Path | None, jobs: int | None, no_sandbox: bool) -> None:
    """Draw the figure book: every figure of the course, and OUT/index.html showing them in course order.

    The figures are drawn by the chapters' public checks: from the reference solutions in the instructor's
    repository, from --submission DIR, or in a student release from your own exercises/ (your passing tasks
    drawn, wrong values marked, the others as placeholders naming the task that draws them). Nothing is
    fetched when the page is opened.
    """
    from grader.delivery.book import write_book

    if submission and not any((submission / ch.filename).is_file() for ch in chapters.all_chapters()):
        raise click.ClickException(tr("{folder} holds no chapter module (file names as in exercises/)", folder=escape.terminal(submission)))
    sandbox = _sandbox_for(others=submission is not None, no_sandbox=no_sandbox)
    done: list[str] = []

    def report(r) -> None:
        done.append(r.chapter.id)
        if sys.stderr.isatty():
            click.echo("\r" + tr("drawing the figures · {n} chapters done", n=len(done)), nl=False, err=True)

    book = write_book(out, submission=submission, sandbox=sandbox, jobs=jobs, on_report=report)
    if sys.stderr.isatty():
        click.echo("", err=True)
    waiting = [e for e in book.entries if e.status == "placeholder"]
    marked = [e for e in book.entries if e.status == "marked"]
    fields = {"index": book.index, "drawn": book.drawn, "n": len(book.entries), "source": escape.terminal(book.source)}
    if marked:
        click.echo(
            tr("{index}: {drawn} of {n} figures drawn from {source}, {marked} with wrong values marked", marked=len(marked), **fields)
        )
    else:
        click.echo(tr("{index}: {drawn} of {n} figures drawn from {source}", **fields))
    if waiting:
        ids = ", ".join(e.id for e in waiting[:6])
        if len(waiting) > 6:
            click.echo("  · " + tr("not drawn yet: {ids} and {more} more (placeholders on the page)", ids=ids, more=len(waiting) - 6))
        else:
            click.echo("  · " + tr("not drawn yet: {ids} (placeholders on the page)", ids=ids))
    url = f"file://{book.index.resolve()}"
    click.echo("  · " + tr("open it in a browser: {url}", url=url))


@main.command()
@solutions_option
@submission_option
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=mark("a free port"), help=mark("Port on 127.0.0.1."))
@click.option("--no-open", is_flag=True, help=mark("Do not open a browser."))
@click.option(
    "--time-limit",
    type=click.FloatRange(min=0.1),
    default=10.0,
    show_default=True,
    help=mark("Seconds each experiment may spend in your code."),
)
@memory_limit_option(YOUR_MEMORY)
@click.option("--no-sandbox", is_flag=True, help=mark("UNSAFE: run a --submission without the sandbox."))
def lab(solutions: bool, submission: Path | None, port: int, no_open: bool, time_limit: float, memory_limit: int, no_sandbox: bool) -> None:
    """Interactive experiments: change an instance in the page, see your functions' outputs drawn.

    Serves http://127.0.0.1:PORT/ until Ctrl-C, only to the browser that opens the URL it prints (that URL holds the
    session's key: other users of this machine cannot use the lab). Your code runs with the limits of `course check`.
    """
    from grader.lab.runner import Lab
    from grader.lab.server import serve

    if solutions and submission:
        raise click.UsageError(tr("--solutions and --submission exclude each other"))
    limit = memory_limit
    sandbox = _sandbox_for(others=submission is not None, no_sandbox=no_sandbox)
    laboratory = Lab(solutions=solutions, submission=submission, time_limit=time_limit, memory_limit=limit, sandbox=sandbox)
    try:
        what = tr("the reference solutions") if solutions else escape.terminal(submission or chapters.EXERCISES)
        if laboratory.checked:
            ready = mark("course lab: {url}  running {what}; the URL holds this session's key: keep it to yourself; Ctrl-C stops")
        else:
            ready = mark(
                "course lab: {url}  running {what} (student release: compared where an answer ships with it, else unmarked); "
                "the URL holds this session's key: keep it to yourself; Ctrl-C stops"
            )
        serve(laboratory, port=port, open_browser=not no_open, on_ready=lambda url: click.echo(tr(ready, url=url, what=what), err=False))
    except OSError as e:
        raise click.ClickException(tr("cannot listen on 127.0.0.1:{port} ({error})", port=port, error=e.strerror or e)) from None
    finally:
        laboratory.close()
    click.echo(tr("course lab stopped"))


@main.group("engine")
def engine_group() -> None:
    """The chapters as one inference engine: a Qwen3 model on the CPU, paged KV, prefix caching."""


@engine_group.command("run")
@click.option(
    "--model",
    "model_name",
    default="qwen3-course",
    show_default=True,
    metavar="NAME|DIR",
    help=mark(
        "qwen3-course (a tiny Qwen3-MoE trained on the course's prose, with its tokenizer), a preset (tiny, tiny-moe, qwen3-0.6b-shape; "
        "random weights from --seed, no tokenizer) or a folder with config.json, model.safetensors and tokenizer.json."
    ),
)
@click.option(
    "--prompt",
    "prompt_texts",
    multiple=True,
    metavar="TEXT",
    help=mark("A prompt as text, through the model's tokenizer.json (repeat for several requests)."),
)
@click.option(
    "--prompts",
    "prompts_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    metavar="FILE",
    help=mark('A JSON list of token-id lists, e.g. [[1, 2, 3], [1, 2, 4]], or of texts, e.g. ["The KV cache", "A block table"].'),
)
@click.option("--max-tokens", type=click.IntRange(min=1), default=32, show_default=True, help=mark("Completion tokens per request."))
@click.option(
    "--temperature",
    type=click.FloatRange(min=0),
    default=0.5,
    show_default=True,
    help=mark("Sampling temperature (ch23); 0 is greedy (the engine's argmax, as vLLM's)."),
)
@click.option(
    "--top-k", type=click.IntRange(min=0), default=0, show_default=True, help=mark("Sample among the k most likely tokens (0: off).")
)
@click.option(
    "--top-p",
    type=click.FloatRange(min=0, max=1, min_open=True),
    default=0.9,
    show_default=True,
    help=mark("Sample among the most likely tokens holding this much probability (1: off)."),
)
@click.option("--seed", type=int, default=0, show_default=True, help=mark("A preset's weights and the sampler's noise."))
@click.option("--block-size", type=click.IntRange(min=2), default=16, show_default=True, help=mark("Tokens per KV block."))
@click.option(
    "--num-blocks", type=click.IntRange(min=1), help=mark("KV blocks (default: enough for every request; fewer force preemption).")
)
@click.option("--max-num-seqs", type=click.IntRange(min=1), default=16, show_default=True, help=mark("Sequences per step at most."))
@click.option(
    "--max-batched-tokens",
    type=click.IntRange(min=1),
    default=512,
    show_default=True,
    help=mark("Prefill tokens per step (fewer force chunked prefill)."),
)
@click.option(
    "--speculative-tokens",
    type=click.IntRange(min=0),
    metavar="K",
    help=mark(
        "Drafts per decode step (n-gram prompt lookup, verified by ch32); 0 turns speculative decoding off. "
        "Default: 3, or 0 with --async-scheduling."
    ),
)
@click.option(
    "--async-scheduling",
    is_flag=True,
    help=mark("Run ch27's AsyncEngineCore (one step ahead, output placeholders) instead of ch24's scheduler; never preempts."),
)
@click.option(
    "--submission",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    metavar="DIR",
    help=mark(
        "Chapter files (somebody else's): their functions run wherever their public checks pass, the whole "
        "engine in a sandbox (bubblewrap); without one the command refuses unless --no-sandbox."
    ),
)
@click.option(
    "--no-sandbox",
    is_flag=True,
    help=mark("UNSAFE: run a --submission's functions in this process (its code can then read and change this user's files)."),
)
@click.option(
    "--memory-limit",
    type=ByteSize(),
    default="8G",
    show_default=True,
    help=mark("With --submission: memory the sandboxed engine's processes may use, all together."),
)
@click.option(
    "--time-limit",
    type=click.FloatRange(min=1),
    default=600.0,
    show_default=True,
    help=mark("With --submission: seconds the sandboxed engine may run."),
)
@click.option(
    "--save-model",
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    help=mark("Also write the model to DIR (config.json + model.safetensors, Hugging Face's format)."),
)
@click.option(
    "--json", "as_json", is_flag=True, help=mark('Print {"outputs": …, "metrics": …} only (with "texts" where the model has a tokenizer).')
)
@click.option(
    "--figures",
    "figures_dir",
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    help=mark(
        "Write the overview to DIR/engine/overview.svg (default: course-figures/ in the project folder, the one holding exercises/)."
    ),
)
def engine_run(
    model_name: str,
    prompt_texts: tuple[str, ...],
    prompts_file: Path | None,
    max_tokens: int,
    temperature: float,
    top_k: int,
    top_p: float,
    seed: int,
    block_size: int,
    num_blocks: int | None,
    max_num_seqs: int,
    max_batched_tokens: int,
    speculative_tokens: int | None,
    async_scheduling: bool,
    submission: Path | None,
    no_sandbox: bool,
    memory_limit: int,
    time_limit: float,
    save_model: Path | None,
    as_json: bool,
    figures_dir: Path | None,
) -> None:
    """Generate with the chapters' functions, measure the run, and draw the course overview from it.

    With --submission the chapter files are somebody else's code: their public checks and then the whole engine
    run in sandboxes, and only the tokens, the metrics and the trace come back. Text is encoded and decoded here,
    outside any sandbox: the engine sees token ids only.
    """
    import dataclasses

    import engine
    from engine.model import folder_of
    from engine.text import TOKENIZER_FILE, has_tokenizer, load_text

    if figures_dir is None:
        from grader.run import default_figures_dir

        figures_dir = default_figures_dir(chapters.EXERCISES / "__init__.py")
    from engine.terminal import draw_overview, encode_prompts, progress, read_prompts, summary, texts

    if prompt_texts and prompts_file is not None:
        raise click.UsageError(tr("give --prompt TEXT or --prompts FILE, not both"))
    given = read_prompts(prompts_file) if prompts_file is not None else list(prompt_texts) if prompt_texts else None
    if given is None and not save_model:
        raise click.UsageError(tr('give --prompt TEXT (e.g. --prompt "The KV cache") or --prompts FILE (or only --save-model DIR)'))
    try:
        model = engine.load(model_name, seed=seed)
        text = load_text(model_name, config_eos=model.config.eos_token_id) if has_tokenizer(model_name) else None
        if text is not None and model.config.eos_token_id is None and text.eos_token_id is not None:
            model.config = dataclasses.replace(model.config, eos_token_id=text.eos_token_id)  # the tokenizer's EOS ends requests
        if save_model:
            model.save(save_model)
            if text is not None and (folder := folder_of(model_name)) is not None:
                shutil.copyfile(folder / TOKENIZER_FILE, Path(save_model) / TOKENIZER_FILE)
            click.echo(tr("model written to {folder} (config.json, model.safetensors)", folder=save_model), err=as_json)
        if given is None:
            return
        prompts = encode_prompts(given, text, model_name)
        if speculative_tokens is None:
            speculative_tokens = 0 if async_scheduling else 3
        if async_scheduling and speculative_tokens:
            raise click.UsageError(tr("--async-scheduling and --speculative-tokens are not combined: choose one"))
        settings = engine.Settings(
            block_size=block_size,
            num_blocks=num_blocks,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_batched_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            speculative_tokens=speculative_tokens,
            async_scheduling=async_scheduling,
        )
        sandbox = _sandbox_for(others=submission is not None, no_sandbox=no_sandbox)
        with progress(enabled=not as_json and sys.stderr.isatty()) as show:
            if sandbox is not None and submission is not None:
                from engine.boxed import run_boxed

                result = run_boxed(
                    model=model,
                    model_name=str(folder_of(model_name) or model_name),  # a shipped model is a folder seen read-only
                    seed=seed,
                    prompts=prompts,
                    max_tokens=max_tokens,
                    settings=settings,
                    submission=submission,
                    sandbox=sandbox,
                    memory_limit=memory_limit,
                    time_limit=time_limit,
                    on_chapter=show.chapter,
                )
            else:
                result = engine.run(
                    model=model,
                    prompts=prompts,
                    max_tokens=max_tokens,
                    settings=settings,
                    submission=submission,
                    on_chapter=show.chapter,
                    on_step=show.step,
                )
    except (engine.ModelError, engine.PartsUnavailable, engine.EngineError) as e:
        raise click.ClickException("\n".join(escape.terminal_lines(e))) from None  # may quote a submission's exception
    shown = text.completion(prompts[0], result.outputs[0]) if text is not None else None
    figure = draw_overview(result, model, figures_dir, prompt_text=text.decode(prompts[0]) if text else None, output_text=shown)
    if figure is not None:
        from grader.terminal import relative

        figure = relative(figure)
    if as_json:
        doc = result.to_json()
        if text is not None:
            doc["texts"] = texts(result, prompts, text)
        click.echo(json.dumps(doc))
    else:
        click.echo(summary(result, prompts, figure, text))


@main.command()
@click.argument("chapter_names", metavar="[CHAPTER]...", nargs=-1, type=ChapterType())
@click.option("--check", "check_only", is_flag=True, help=mark("Only report stubs that differ; exit 1 if any do."))
def stubs(chapter_names: tuple[Chapter, ...], check_only: bool) -> None:
    """Regenerate exercises/ from solutions/ (all chapters by default)."""
    from grader.delivery.stubs import write_stubs

    if not any(chapters.SOLUTIONS.glob("ch[0-9][0-9]_*.py")):
        raise click.ClickException(tr("this installation has no solutions/ to generate stubs from"))
    changed = write_stubs(list(chapter_names) or list(chapters.all_chapters()), check_only=check_only)
    for path in changed:
        where = path.relative_to(chapters.ROOT)
        click.echo(tr("{path} differs", path=where) if check_only else tr("{path} written", path=where))
    if not changed:
        click.echo(tr("all stubs up to date"))
    sys.exit(1 if check_only and changed else 0)


if __name__ == "__main__":
    main()
