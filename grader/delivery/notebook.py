"""Notebooks: the nbgrader course, and grading answers written in notebook cells.

A chapter notebook holds the chapter's prose, a locked setup cell (the module's provided
code), one answer cell per task (the task's functions from the reference, their
`### BEGIN SOLUTION` regions left for nbgrader to strip) and two locked test cells per
task. It runs top to bottom with no error before a single answer. The public test cell
grades the cells the kernel has run, made into the chapter module (`assemble`), through
the same isolated runner as `course check`, prints what happened as one block, shows
the task's figures (SVG, with their caption as alt text), and ends with the score as its
value: the student's own feedback. The hidden test cell (inside `### BEGIN HIDDEN TESTS`)
runs nothing: a kernel that runs the student's code cannot be trusted with hidden checks
or with the score, so both come from the sandboxed class grader, which writes them into
nbgrader's gradebook (`course grade --nbgrader`, grader.delivery.gradebook).

Answers in cells are graded cell by cell (`grader.delivery.cells`).
"""

from __future__ import annotations

import ast
import base64
import contextlib
import functools
import io
import json
import math
import os
import re
import sys
import tempfile
import textwrap
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from grader import chapters, checks
from grader.chapters import Chapter
from grader.delivery import escape
from grader.delivery.cells import defines, segment, submission_from_cells
from grader.i18n import docstrings, language, tr

if TYPE_CHECKING:
    from grader.report import Report

NOTEBOOK_TIME_LIMIT = 5.0
"""Seconds per check in a notebook (COURSE_NOTEBOOK_TIME_LIMIT may lower it): small enough that
a cell of failing checks ends well inside nbgrader's Execute.timeout, which `write_course` sets
from it."""
RESTART = 3.0  # seconds to replace a killed student process
COURSE_ID = "llm-inference"


# -- grading inside the notebook -----------------------------------------------------------------------
def _kernel_cells() -> tuple[list[str], list[str]]:
    """The cells this kernel has run, in order (re-runs included, as the kernel ran them), and their
    names ("In [7]")."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        shell = None
    if shell is None:
        raise RuntimeError(tr("grader.delivery.notebook.check_task runs inside a Jupyter notebook; use `course check` elsewhere"))
    ran = [(f"In [{n}]", c) for n, c in enumerate(shell.user_ns.get("In", [])) if c]
    return [c for _, c in ran], [n for n, _ in ran]


_warm: dict = {}
"""This kernel's warm process (grader.isolation.zygote), started by the first test cell: later cells fork
their student process from it in milliseconds instead of starting an interpreter."""


def _launcher():
    """A launcher forking from this kernel's warm process (started now, before any check runs,
    so that no check takes it for a process the student left behind)."""
    from grader.isolation import portable, worker
    from grader.isolation.zygote import Zygote, ZygoteError

    if not portable.can_fork():  # macOS, Windows, COURSE_PORTABLE=1: a fresh interpreter per process
        return functools.partial(worker.start, root=chapters.ROOT)
    try:
        if "zygote" not in _warm or _warm["zygote"].proc.poll() is not None:
            _warm["zygote"] = Zygote()
        return _warm["zygote"].start
    except ZygoteError:
        _warm.clear()
        return functools.partial(worker.start, root=chapters.ROOT)


@dataclass
class CellGrade:
    """What a public test cell shows: the task's report, as one text, and its figures."""

    report: Report
    """The `grader.report.Report` of the task's public checks."""
    text: str
    """The report as the cell prints it: one block, lines wrapped to `WIDTH` columns."""
    figures: list[dict]
    """Display data of the task's figures (`figure_output`)."""

    @property
    def score(self) -> float:
        return float(self.report.score)


WIDTH = 100
"""Columns a test cell's report is wrapped to (an output box in a notebook or its HTML does not wrap)."""


def grade_cells(chapter_id: str, task_id: str, cells: list[str], *, where: list[str] | None = None, launcher=None) -> CellGrade:
    """Run one task's public checks on the module `cells` amount to (`assemble`), in a student process
    started by `launcher` (default: a fresh interpreter), as a public test cell does with the cells its
    kernel has run. Nothing of the cells runs in this process."""
    from grader.run import check

    ch = chapters.find(chapter_id)
    task = ch.task(task_id)
    with tempfile.TemporaryDirectory(prefix="course-nb-") as tmp, _quiet():
        folder = submission_from_cells(ch, cells, Path(tmp) / "submission", where)
        report = check(
            ch.id,
            task=task.id,
            submission=folder,
            hidden=False,
            figures_dir=Path(tmp) / "figures",
            time_limit=_time_limit(),
            launcher=launcher,
        )
        return CellGrade(report, _public_text(report), _figures_of(report, task.id))


def check_task(chapter_id: str, task_id: str, *, hidden: bool = False) -> float:
    """Grade one task from the cells this kernel has run; print the results and show the figures.

    Returns the points earned (the cell's value, which nbgrader reads as partial credit). The report
    is printed once, as one block (one output box). With `hidden=True` nothing runs: the hidden checks
    never run in a kernel that also runs the student's code (it could replace this function or read
    them). The cell says where they run and returns 0; `course grade --nbgrader` writes their points
    into the gradebook.
    """
    _speak_the_course()
    ch = chapters.find(chapter_id)
    task = ch.task(task_id)
    if hidden:
        print(
            tr(
                "The hidden checks of {task} run when the instructor grades the class with "
                "`course grade --nbgrader`, in a sandbox, not in this notebook: this cell gives 0 points here.",
                task=task.id,
            )
        )
        return 0.0
    from IPython.display import display

    cells, where = _kernel_cells()
    graded = grade_cells(ch.id, task.id, cells, where=where, launcher=_launcher())
    print(graded.text, end="")
    for data in graded.figures:
        display(data, raw=True)
    return graded.score


def _speak_the_course() -> None:
    """A test cell speaks the course's language: `COURSE_LANG`, the installed release's setting, else the setting
    `course release` wrote at the root of the nbgrader course this notebook sits in (where `nbgrader autograde`
    runs it), else the locale."""
    from grader.i18n import choose

    if os.environ.get(choose.ENV) or choose.course_setting():
        return
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if (folder / "nbgrader_config.py").is_file():
            setting = choose.course_setting(folder / choose.SETTING.name)
            if setting:
                choose.set_language(setting)
            return


def _time_limit() -> float:
    return min(float(os.environ.get("COURSE_NOTEBOOK_TIME_LIMIT", NOTEBOOK_TIME_LIMIT)), NOTEBOOK_TIME_LIMIT)


@contextlib.contextmanager
def _quiet():
    """No warnings and nothing on stderr: nbgrader gives a cell that writes to stderr zero points."""
    with warnings.catch_warnings(), contextlib.redirect_stderr(sys.stdout):
        warnings.simplefilter("ignore")
        yield


def _public_text(report) -> str:
    """The task's report as `course check --verbose` words it (without its header), wrapped to WIDTH."""
    from grader.terminal import TerminalReport

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        screen = TerminalReport(report.chapter, report.target, verbose=True, header=False, width=WIDTH, tty=False, ticker=False)
        for result in report.results:
            screen.add(result)
        screen.flush()
    return wrap_lines(out.getvalue())


def wrap_lines(text: str, width: int = WIDTH) -> str:
    """`text` with every line longer than `width` broken at spaces, its continuation lines indented
    two more than the line itself (a notebook's output box, or its HTML, clips long lines)."""
    lines = []
    for line in text.splitlines():
        indent = line[: len(line) - len(line.lstrip(" "))]
        lines += textwrap.wrap(
            line, width, subsequent_indent=indent + "  ", break_long_words=False, break_on_hyphens=False, drop_whitespace=True
        ) or [line]
    return "\n".join(lines) + "\n" if lines else ""


def figure_output(spec, svg: str) -> dict:
    """Display data of a figure: the SVG, and an HTML image of it with the figure's caption as its alt
    text (what HTML renderers, nbgrader's feedback included, show), and the caption as plain text."""
    caption = spec.zh if language() == "zh" else spec.en
    alt = f"{spec.title} · {caption}" if isinstance(caption, str) else spec.title
    src = "data:image/svg+xml;base64," + base64.b64encode(svg.encode("utf-8")).decode("ascii")
    return {"text/html": f'<img alt="{escape.html(alt)}" src="{src}">', "image/svg+xml": svg, "text/plain": alt}


def _figures_of(report, task_id: str) -> list[dict]:
    import figures

    mine = {spec.id: spec for spec in figures.catalog(report.chapter.id) if task_id in spec.needs.values()}
    return [
        figure_output(mine[Path(path).stem], Path(path).read_text(encoding="utf-8")) for path in report.figures if Path(path).stem in mine
    ]


# -- the nbgrader course ---------------------------------------------------------------------------------
def write_course(dest: Path, chosen: list[Chapter]) -> None:
    """An nbgrader course root: nbgrader_config.py and source/<chapter>/<chapter>.ipynb per chapter."""
    longest = 0
    for ch in chosen:
        nb = chapter_notebook(ch)
        folder = dest / "source" / ch.id
        folder.mkdir(parents=True)
        (folder / f"{ch.id}.ipynb").write_text(json.dumps(nb, ensure_ascii=False, indent=1), encoding="utf-8")
        specs = checks.load(ch.id, with_hidden=False)  # only public test cells run checks in a kernel
        for task in ch.tasks:
            longest = max(longest, sum(1 for s in specs if s.task == task.id))
    timeout = math.ceil(longest * (NOTEBOOK_TIME_LIMIT + RESTART) + 60)
    (dest / "nbgrader_config.py").write_text(_config(timeout), encoding="utf-8")


def _config(timeout: int) -> str:
    return f'''# nbgrader configuration of the course, written by `course release`.
import os

c = get_config()  # noqa: F821 (provided by nbgrader)
here = os.path.dirname(os.path.abspath(__file__))
c.CourseDirectory.root = here
c.CourseDirectory.course_id = "{COURSE_ID}"
c.CourseDirectory.db_url = "sqlite:///" + os.path.join(here, "gradebook.db")
# Scores come from the sandboxed class grader, not from a kernel: after collecting, run
#   course grade --nbgrader <this folder> --chapter chNN
# which writes the gradebook and autograded/, then `nbgrader generate_feedback` and `nbgrader export`.
# `nbgrader autograde` still runs, but its hidden test cells give 0 and a student's code can fake
# the rest. Longer than the slowest public test cell can take: its checks each stop after {NOTEBOOK_TIME_LIMIT:g} s.
c.Execute.timeout = {timeout}
c.ExecutePreprocessor.kernel_name = "python3"
c.ClearSolutions.code_stub = {{"python": "# YOUR CODE HERE\\nraise NotImplementedError()"}}
# Feedback shows the hidden test cells' outputs (`course grade` writes check names and verdicts), not their source.
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.GetGrades",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
    "nbgrader.preprocessors.ClearHiddenTests",
]
# Students' answers live in the notebook; no .py file of theirs is ever overwritten.
c.Autograde.exclude_overwriting = {{}}
'''


def chapter_notebook(ch: Chapter) -> dict:
    """The source notebook of a chapter (nbformat 4, as plain JSON data).

    Its locked setup cell holds the module's provided code (all but the task functions and classes) as
    the module has it, so that the notebook runs top to bottom with no error before a single answer:
    an annotation naming a task class is written as a string (looked up when used, never when
    defined), and provided code that needs a task's names when it is defined goes into a locked
    "provided" cell after that task's answer cell.
    """
    source = (chapters.SOLUTIONS / ch.filename).read_text(encoding="utf-8")
    source = docstrings.translate_source(source, Path(ch.filename).stem, language())  # the release's language
    tree = ast.parse(source)
    prose = (ast.get_docstring(tree) or "").split("\n", 1)[-1].strip()
    setup, provided = _provided_code(ch, source, tree)
    specs = checks.load(ch.id, with_hidden=True)
    cells = [
        _markdown(
            f"# {ch.id} · {ch.title_zh if language() == 'zh' else ch.title_en}\n\n{prose}\n\n"
            + tr(
                "Write your code in the answer cells, run them, then run the test cell under each. "
                "The test cells run the public checks on your machine and draw the chapter's figures from "
                "your outputs: they are your feedback. Your grade comes from the instructor's grader "
                "(`course grade --nbgrader`), which runs the public and the hidden checks on your notebook "
                "in a sandbox; run by `nbgrader autograde` instead, the hidden test cells give 0 points."
            ),
            "intro",
        ),
        _code(setup, "setup", locked=True),
    ]
    for i, task in enumerate(ch.tasks):
        public_points = sum(s.points for s in specs if s.task == task.id and not s.hidden)
        hidden_points = sum(s.points for s in specs if s.task == task.id and s.hidden)
        code = "\n\n\n".join(
            segment(source, n) for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in task.names
        )
        tid = task.id.replace(".", "_")
        cells += [_markdown(f"## {task.id} · {task.name}", f"task_{tid}"), _code(code, f"answer_{tid}", solution=True)]
        if provided.get(i):
            cells.append(_code(provided[i], f"provided_{tid}", locked=True))
        cells += [
            _code(
                f'from grader.delivery.notebook import check_task\ncheck_task("{ch.id}", "{task.id}")',
                f"public_{tid}",
                points=public_points,
            ),
            _code(
                "### BEGIN HIDDEN TESTS\nfrom grader.delivery.notebook import check_task\n"
                f'check_task("{ch.id}", "{task.id}", hidden=True)\n### END HIDDEN TESTS',
                f"hidden_{tid}",
                points=hidden_points,
            ),
        ]
    return {
        "cells": cells,
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"},
            "language_info": {"name": "python"},
        },
    }


def _provided_code(ch: Chapter, source: str, tree: ast.Module) -> tuple[str, dict[int, str]]:
    """The setup cell's code, and the code of the "provided" cell after task i's answer cell (by i).

    The setup cell is the module's text with its docstring and task definitions cut out (its own
    spacing and comments kept), with every single-line annotation that names a task's name quoted.
    A statement that still needs a task's name when it runs (a base class, a default, a decorator, a
    class attribute, a call), or that needs such a statement, goes after the last task it needs."""
    task_of = {name: i for i, t in enumerate(ch.tasks) for name in t.names}
    lazy = any(
        isinstance(n, ast.ImportFrom) and n.module == "__future__" and any(a.name == "annotations" for a in n.names) for n in tree.body
    )
    body = tree.body[1:] if ast.get_docstring(tree) else tree.body
    graded = [n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in task_of]
    setup = [n for n in body if n not in graded]
    quote: list[ast.expr] = []
    level: dict[int, int] = {}
    needs: dict[int, set[str]] = {}
    for node in setup:
        annotations, expressions = _when_defined(node, lazy)
        for a in annotations:
            if {n.id for n in ast.walk(a) if isinstance(n, ast.Name)} & task_of.keys():
                (quote if a.lineno == a.end_lineno else expressions).append(a)
        needs[id(node)] = {n.id for e in expressions for n in ast.walk(e) if isinstance(n, ast.Name)}
        level[id(node)] = max((task_of[n] for n in needs[id(node)] & task_of.keys()), default=-1)
    binder = {name: node for node in setup for name in defines(node)}
    changed = True
    while changed:  # a statement runs after what it needs
        changed = False
        for node in setup:
            after = max((level[id(binder[n])] for n in needs[id(node)] if n in binder and binder[n] is not node), default=-1)
            if after > level[id(node)]:
                level[id(node)], changed = after, True
    lines = source.splitlines(keepends=True)
    for a in sorted(quote, key=lambda a: (a.lineno, a.col_offset), reverse=True):
        raw = lines[a.lineno - 1].encode("utf-8")
        text = raw[a.col_offset : a.end_col_offset].decode("utf-8")
        quoted = f'"{text}"' if '"' not in text and "\\" not in text else repr(text)
        lines[a.lineno - 1] = raw[: a.col_offset].decode("utf-8") + quoted + raw[a.end_col_offset :].decode("utf-8")
    edited = "".join(lines)
    moved = [n for n in setup if level[id(n)] >= 0]
    cut: set[int] = set()
    for node in ([tree.body[0]] if body is not tree.body else []) + graded + moved:
        first = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno])
        last = first + segment(edited, node).count("\n")
        cut.update(range(first - 1, last))
    kept = [line for i, line in enumerate(edited.splitlines()) if i not in cut]
    setup_text = re.sub(r"\n{4,}", "\n\n\n", "\n".join(kept)).strip("\n")
    provided: dict[int, list[str]] = {}
    for node in moved:
        provided.setdefault(level[id(node)], []).append(segment(edited, node))
    return setup_text, {i: "\n\n\n".join(parts) for i, parts in provided.items()}


def _when_defined(node: ast.stmt, lazy: bool) -> tuple[list[ast.expr], list[ast.AST]]:
    """What a top-level statement evaluates when it runs: its annotations (none when they are lazy,
    `from __future__ import annotations`) and its other expressions. A function's body runs when it is
    called, not when it is defined; a class's body runs when it is defined."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        args = node.args
        every = args.posonlyargs + args.args + args.kwonlyargs + [a for a in (args.vararg, args.kwarg) if a]
        annotations = [a.annotation for a in every if a.annotation] + ([node.returns] if node.returns else [])
        expressions: list[ast.AST] = [*node.decorator_list, *args.defaults, *[d for d in args.kw_defaults if d]]
        return ([] if lazy else annotations), expressions
    if isinstance(node, ast.ClassDef):
        annotations = []
        expressions = [*node.decorator_list, *node.bases, *[k.value for k in node.keywords]]
        for stmt in node.body:
            if isinstance(stmt, ast.AnnAssign):
                annotations.append(stmt.annotation)
                expressions += [stmt.target] + ([stmt.value] if stmt.value else [])
            else:
                more, other = _when_defined(stmt, lazy)
                annotations += more
                expressions += other
        return ([] if lazy else annotations), expressions
    return [], [node]


def _meta(grade_id: str, *, grade: bool = False, solution: bool = False, locked: bool = False, points: float | None = None) -> dict:
    meta = {"grade": grade, "solution": solution, "locked": locked, "task": False, "grade_id": grade_id, "schema_version": 3}
    if points is not None:
        meta["points"] = points
    return {"nbgrader": meta}


def _markdown(text: str, grade_id: str) -> dict:
    return {"cell_type": "markdown", "id": grade_id.replace("_", "-"), "metadata": _meta(grade_id, locked=True), "source": text}


def _code(text: str, grade_id: str, *, solution: bool = False, locked: bool = False, points: float | None = None) -> dict:
    grade = points is not None
    return {
        "cell_type": "code",
        "id": grade_id.replace("_", "-"),
        "execution_count": None,
        "outputs": [],
        "metadata": _meta(grade_id, grade=grade, solution=solution, locked=locked or grade, points=points),
        "source": text,
    }
