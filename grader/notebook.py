"""Notebooks: the nbgrader course, and grading answers written in notebook cells.

A chapter notebook holds the chapter's prose, one answer cell per task (the task's
functions from the reference, their `### BEGIN SOLUTION` regions left for nbgrader
to strip) and two locked test cells per task. The public test cell grades the
answers the kernel has run, rebuilt into the chapter module, through the same
isolated runner as `course check`, prints what happened, shows the task's figures
as SVG display data, and ends with the score as its value: the student's own
feedback. The hidden test cell (inside `### BEGIN HIDDEN TESTS`) runs nothing: a
kernel that runs the student's code cannot be trusted with hidden checks or with
the score, so both come from the sandboxed class grader, which writes them into
nbgrader's gradebook (`course grade --nbgrader`, grader.gradebook).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import json
import math
import os
import sys
import tempfile
import warnings
from pathlib import Path

from grader import chapters, checks
from grader.chapters import Chapter

NOTEBOOK_TIME_LIMIT = 5.0
"""Seconds per check in a notebook (COURSE_NOTEBOOK_TIME_LIMIT may lower it): small enough that
a cell of failing checks ends well inside nbgrader's Execute.timeout, which `write_course` sets
from it."""
RESTART = 3.0  # seconds to replace a killed student process
COURSE_ID = "llm-inference"


# -- from cells to a chapter module -------------------------------------------------------------------
def assemble(ch: Chapter, cells: list[str]) -> str:
    """The chapter module a student's cells amount to: the stub, with every task function or class
    the cells define (their last definition) in place of the stub's, and the cells' other
    imports, helpers and constants after it. Cell magics and statements that only run code
    (prints, calls, tests) are left out."""
    stub = (chapters.EXERCISES / ch.filename).read_text(encoding="utf-8")
    graded = {name for t in ch.tasks for name in t.names}
    defined: dict[str, str] = {}
    extra: list[str] = []
    for cell in cells:
        code = "\n".join(line for line in cell.splitlines() if not line.lstrip().startswith(("%", "!")))
        try:
            tree = ast.parse(code)
        except (SyntaxError, ValueError, RecursionError, MemoryError):  # left for compile() to report
            defined.update({n: code for n in graded if f"def {n}(" in code or f"class {n}" in code})
            continue
        for node in tree.body:
            text = _segment(code, node)
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in graded:
                defined[node.name] = text
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)) or (
                    isinstance(node, (ast.Import, ast.ImportFrom)) and not _grader_import(node)):
                extra.append(text)
    lines = stub.splitlines(keepends=True)
    stub_tree = ast.parse(stub)
    for node in sorted(stub_tree.body, key=lambda n: n.lineno, reverse=True):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in defined:
            start = min([d.lineno for d in node.decorator_list] + [node.lineno]) - 1
            lines[start:node.end_lineno] = [defined[node.name].rstrip() + "\n"]
    tail = "\n\n# -- more code from your cells\n" + "\n\n".join(extra) + "\n" if extra else ""
    return "".join(lines) + tail


def _segment(code: str, node: ast.stmt) -> str:
    """A statement's source, with its decorators and the indented comments that close its body
    (such as `### END SOLUTION`, which the AST does not count as part of the function)."""
    lines = code.splitlines()
    start = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno])
    end = node.end_lineno
    while end < len(lines) and (not lines[end].strip() or lines[end][:1].isspace() and lines[end].lstrip().startswith("#")):
        end += 1
    while end > node.end_lineno and not lines[end - 1].strip():
        end -= 1
    return "\n".join(lines[start - 1:end])


def _grader_import(node: ast.Import | ast.ImportFrom) -> bool:
    names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
    return any(n.split(".")[0] in ("grader", "solutions", "figures") for n in names)


def cells_of(notebook: Path) -> list[str]:
    """The code cells of an .ipynb file, in order, read by `grader.submission` (the file itself is
    never followed as a link, its size is bounded, any JSON that is not nbformat's shape is a clear
    error): `grader.submission.SubmissionError`, a ValueError, saying why it cannot be read."""
    from grader.submission import read_notebook

    return read_notebook(notebook)


def submission_from_cells(ch: Chapter, cells: list[str], folder: Path) -> Path:
    """Write the module the cells amount to into `folder` (a submission folder) and return it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ch.filename).write_text(assemble(ch, cells), encoding="utf-8")
    return folder


# -- grading inside the notebook -----------------------------------------------------------------------
def _kernel_cells() -> list[str]:
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        shell = None
    if shell is None:
        raise RuntimeError("grader.notebook.check_task runs inside a Jupyter notebook; use `course check` elsewhere")
    return [c for c in shell.user_ns.get("In", []) if c]


_warm: dict = {}
"""This kernel's warm process (grader.isolation.zygote), started by the first test cell: later cells fork
their student process from it in milliseconds instead of starting an interpreter."""


def _launcher():
    """A launcher forking from this kernel's warm process (started now, before any check runs,
    so that no check takes it for a process the student left behind)."""
    from grader.isolation import worker
    from grader.isolation.zygote import Zygote, ZygoteError

    try:
        if "zygote" not in _warm or _warm["zygote"].proc.poll() is not None:
            _warm["zygote"] = Zygote()
        return _warm["zygote"].start
    except ZygoteError:
        _warm.clear()
        return functools.partial(worker.start, root=chapters.ROOT)


def check_task(chapter_id: str, task_id: str, *, hidden: bool = False) -> float:
    """Grade one task from the cells this kernel has run; print the results and show the figures.

    Returns the points earned (the cell's value, which nbgrader reads as partial credit).
    With `hidden=True` nothing runs: the hidden checks never run in a kernel that also runs the
    student's code (it could replace this function or read them). The cell says where they run
    and returns 0; `course grade --nbgrader` writes their points into the gradebook.
    """
    ch = chapters.find(chapter_id)
    task = ch.task(task_id)
    if hidden:
        print(f"The hidden checks of ch{task.id} run when the instructor grades the class with "
              "`course grade --nbgrader`, in a sandbox, not in this notebook: this cell gives 0 points here.")
        return 0.0
    from grader.run import check

    launcher = _launcher()
    with tempfile.TemporaryDirectory(prefix="course-nb-") as tmp, _quiet():
        folder = submission_from_cells(ch, _kernel_cells(), Path(tmp) / "submission")
        report = check(ch.id, task=task.id, submission=folder, hidden=False, figures_dir=Path(tmp) / "figures",
                       time_limit=_time_limit(), launcher=launcher)
        _print_public(report)
        _show_figures(report, task.id)
    return float(report.score)


def _time_limit() -> float:
    return min(float(os.environ.get("COURSE_NOTEBOOK_TIME_LIMIT", NOTEBOOK_TIME_LIMIT)), NOTEBOOK_TIME_LIMIT)


@contextlib.contextmanager
def _quiet():
    """No warnings and nothing on stderr: nbgrader gives a cell that writes to stderr zero points."""
    with warnings.catch_warnings(), contextlib.redirect_stderr(sys.stdout):
        warnings.simplefilter("ignore")
        yield


def _print_public(report) -> None:
    from grader.terminal import TerminalReport

    screen = TerminalReport(report.chapter, report.target, verbose=True, header=False)
    for result in report.results:
        screen.add(result)
    screen.flush()


def _show_figures(report, task_id: str) -> None:
    import figures
    from IPython.display import SVG, display

    mine = {spec.id for spec in figures.catalog(report.chapter.id) if task_id in spec.needs.values()}
    for path in report.figures:
        if Path(path).stem in mine:
            display(SVG(filename=path))


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
    """The source notebook of a chapter (nbformat 4, as plain JSON data)."""
    source = (chapters.SOLUTIONS / ch.filename).read_text(encoding="utf-8")
    tree = ast.parse(source)
    prose = (ast.get_docstring(tree) or "").split("\n", 1)[-1].strip()
    graded = {name for t in ch.tasks for name in t.names}
    body = tree.body[1:] if ast.get_docstring(tree) else tree.body
    setup = [_segment(source, n) for n in body
             if not isinstance(n, (ast.FunctionDef, ast.ClassDef)) or n.name not in graded]
    specs = checks.load(ch.id, with_hidden=True)
    cells = [_markdown(f"# {ch.id} · {ch.title}\n\n{prose}\n\n"
                       "Write your code in the answer cells, run them, then run the test cell under each. "
                       "The test cells run the public checks on your machine and draw the chapter's figures from "
                       "your outputs: they are your feedback. Your grade comes from the instructor's grader "
                       "(`course grade --nbgrader`), which runs the public and the hidden checks on your notebook "
                       "in a sandbox; run by `nbgrader autograde` instead, the hidden test cells give 0 points.",
                       "intro"),
             _code("\n\n".join(setup), "setup", locked=True)]
    for task in ch.tasks:
        public_points = sum(s.points for s in specs if s.task == task.id and not s.hidden)
        hidden_points = sum(s.points for s in specs if s.task == task.id and s.hidden)
        code = "\n\n\n".join(_segment(source, n) for n in tree.body
                             if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in task.names)
        tid = task.id.replace(".", "_")
        cells += [_markdown(f"## ch{task.id} · {task.name}", f"task_{tid}"),
                  _code(code, f"answer_{tid}", solution=True),
                  _code(f'from grader.notebook import check_task\ncheck_task("{ch.id}", "{task.id}")',
                        f"public_{tid}", points=public_points),
                  _code("### BEGIN HIDDEN TESTS\nfrom grader.notebook import check_task\n"
                        f'check_task("{ch.id}", "{task.id}", hidden=True)\n### END HIDDEN TESTS',
                        f"hidden_{tid}", points=hidden_points)]
    return {"cells": cells, "nbformat": 4, "nbformat_minor": 5,
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"},
                         "language_info": {"name": "python"}}}


def _meta(grade_id: str, *, grade: bool = False, solution: bool = False, locked: bool = False,
          points: float | None = None) -> dict:
    meta = {"grade": grade, "solution": solution, "locked": locked, "task": False, "grade_id": grade_id,
            "schema_version": 3}
    if points is not None:
        meta["points"] = points
    return {"nbgrader": meta}


def _markdown(text: str, grade_id: str) -> dict:
    return {"cell_type": "markdown", "id": grade_id.replace("_", "-"), "metadata": _meta(grade_id, locked=True),
            "source": text}


def _code(text: str, grade_id: str, *, solution: bool = False, locked: bool = False,
          points: float | None = None) -> dict:
    grade = points is not None
    return {"cell_type": "code", "id": grade_id.replace("_", "-"), "execution_count": None, "outputs": [],
            "metadata": _meta(grade_id, grade=grade, solution=solution, locked=locked or grade, points=points),
            "source": text}
