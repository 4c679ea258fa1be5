"""Answers written in notebook cells, made into the chapter module that is graded.

Grading is per cell in every channel (a notebook's public test cell, `course check --notebook`, `course
grade`): each cell is compiled and run as itself, under its label ("answer cell ch25.2"), so a message cites
the cell and the line in it, and a cell that does not parse costs only the tasks it answers. This process
only parses and compiles the cells (`assemble` writes them into the module as string literals); they run in
the student's process, by the runner `assemble` puts in the module.
"""

from __future__ import annotations
import __future__

import ast
import functools
import inspect
import re
from dataclasses import dataclass
from pathlib import Path

from grader import chapters
from grader.chapters import Chapter

# -- from cells to a chapter module -------------------------------------------------------------------
CELLS_FILE = "<notebook cells>"
"""The file name of the code that runs a notebook's cells inside the student's process: frames of it
are the grader's, never shown (`grader.isolation.child` shows only the module's and the cells')."""


@dataclass(frozen=True)
class _Cell:
    """One code cell as the assembled module carries it (plain data, written as a Python literal)."""

    label: str
    """What messages call it: "answer cell ch25.2", or its place ("code cell 7", "In [7]")."""
    source: str
    """Its code, magic lines blanked (line numbers are the cell's own)."""
    kept: tuple[int, ...]
    """The indices of the top-level statements that run (definitions, imports, assignments)."""
    graded: tuple[str, ...]
    """The task functions and classes it defines."""
    error: tuple[str, int, int, str] | None
    """(message, line, column, text of the line) when it cannot be compiled: then nothing of it runs."""


class CompilerLimit(ValueError):
    """A cell that Python's compiler cannot take at all (an expression nested too deeply for it:
    RecursionError or MemoryError), when `assemble` is told to refuse one."""


def assemble(ch: Chapter, cells: list[str], where: list[str] | None = None, *, strict: bool = False) -> str:
    """The chapter module a student's code cells amount to: the stub, then every cell in order, each
    compiled as itself (its file name is its label, such as "answer cell ch25.2", so tracebacks give the
    cell and the line in it), as the kernel ran them.

    Of a cell, the definitions run: functions, classes, imports (not of the grader), assignments.
    Other top-level statements (calls, prints, loops, tests) and magics are left out. A statement
    that raises when it runs is reported, one line naming the cell and the line, printed by the
    student's process, and grading goes on without it (a task function or class it was to define
    reports that error when called). A cell that does not compile (SyntaxError, NUL byte, nested too
    deeply) contributes nothing: each task function or class it defines reports "answer cell ch25.2
    does not parse …" with the line, so only its tasks lose points. `where[i]` names cell i when it
    is no answer cell (default "code cell i+1"; a kernel gives "In [n]"). With `strict`, a cell that
    exhausts Python's compiler (RecursionError, MemoryError: no mistake a student types) raises
    CompilerLimit instead, as such a `.py` file is refused (`grader.delivery.submission`).

    Nothing is executed here: the cells are parsed and compiled (to learn whether they compile), and
    written into the module as string literals that the student's process runs.
    """
    stub = (chapters.EXERCISES / ch.filename).read_text(encoding="utf-8")
    flags = compile(stub, ch.filename, "exec", dont_inherit=True).co_flags & _FUTURE_FLAGS
    task_of = {name: t.id for t in ch.tasks for name in t.names}
    order = {t.id: i for i, t in enumerate(ch.tasks)}
    read = []
    for i, text in enumerate(cells):
        place = where[i] if where else f"code cell {i + 1}"
        source, tree, error = _compile_cell(text, place, flags)
        if strict and error is not None and error[0].startswith(_TOO_DEEP):
            raise CompilerLimit(f"{place}: {error[0]}")
        if tree is None:
            graded = tuple(n for n in task_of if re.search(rf"^[ \t]*(?:async[ \t]+def|def|class)[ \t]+{n}\b", source, re.M))
            kept: tuple[int, ...] = ()
        else:
            kept = tuple(j for j, node in enumerate(tree.body) if _kept(node))
            graded = tuple(dict.fromkeys(n for j in kept for n in defines(tree.body[j]) if n in task_of))
        tasks = sorted({task_of[n] for n in graded}, key=order.__getitem__)
        read.append((place, f"answer cell {' and '.join(tasks)}" if tasks else place, source, kept, graded, error))
    count: dict[str, int] = {}
    for _, label, *_ in read:
        count[label] = count.get(label, 0) + 1
    units = [
        _Cell(f"{label} ({place})" if count[label] > 1 and label != place else label, source, kept, graded, error)
        for place, label, source, kept, graded, error in read
    ]
    runner = inspect.getsource(_run_cells)
    return (
        stub.rstrip("\n") + "\n\n\n"
        "# -- your notebook's code cells (grader.delivery.cells.assemble): each runs as itself, its definitions\n"
        "# taken, its other statements left out; a message about them names the cell and the line in it.\n"
        f"__course_cells__ = {tuple(u.label for u in units)!r}\n"
        "_course_cells = {'__name__': __name__}\n"
        f"exec(compile({runner!r}, {CELLS_FILE!r}, 'exec'), _course_cells)\n"
        f"_course_cells['_run_cells'](globals(), {[tuple(vars(u).values()) for u in units]!r})\n"
        "del _course_cells\n"
    )


_FUTURE_FLAGS = functools.reduce(lambda a, b: a | b, (getattr(__future__, f).compiler_flag for f in __future__.all_feature_names))
_MAGIC = re.compile(r"^[ \t]*(?:%|!(?!=))")
_TOO_DEEP = "an expression is nested too deeply for Python's compiler"


def _compile_cell(text: str, label: str, flags: int) -> tuple[str, ast.Module | None, tuple | None]:
    """A cell's code (magic lines blanked if it does not compile with them), its syntax tree, and why it
    cannot be compiled (None when it can), compiled as the kernel would (the stub's __future__ flags)."""
    source, error = text, None
    for attempt in (text, "\n".join("" if _MAGIC.match(line) else line for line in text.split("\n"))):
        try:
            compile(attempt, label, "exec", flags=flags, dont_inherit=True)
            return attempt, ast.parse(attempt, label), None
        except SyntaxError as e:
            if "null bytes" in str(e.msg):
                return attempt, None, ("it holds a NUL byte, which Python source cannot hold", 1, 0, "")
            what = e.msg if type(e) is SyntaxError else f"{type(e).__name__}: {e.msg}"
            source, error = attempt, (what, e.lineno or 1, e.offset or 0, (e.text or "").rstrip("\n"))
        except ValueError as e:  # a NUL byte, on Pythons before 3.11.4
            return attempt, None, (f"it cannot be compiled: {e}", 1, 0, "")
        except (RecursionError, MemoryError) as e:
            return attempt, None, (f"{_TOO_DEEP} ({type(e).__name__})", 1, 0, "")
    return source, None, error


def _kept(node: ast.stmt) -> bool:
    """Whether a cell's top-level statement is taken into the module: a definition, an import (not of the
    grader, the reference or the figures) or an assignment."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return not _grader_import(node)
    return isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign, ast.AugAssign))


def defines(node: ast.stmt) -> list[str]:
    """The module-level names a statement binds."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in node.names]
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if hasattr(node, "target") else []
    return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]


def _run_cells(namespace: dict, cells: list) -> None:
    """Run a notebook's cells into the module's namespace: this function's source is written into the
    assembled module and runs only in the student's process (`assemble`).

    Each cell is registered with linecache under its label (tracebacks then show its lines) and its kept
    statements run one at a time. One that raises is reported in one line and left out; a task name it
    was to define, or that a cell which cannot be compiled defines, becomes a function raising why."""
    import ast
    import linecache
    import re

    class AnswerCellFailed(Exception):
        """A task function or class that a cell failed to define."""

    def failing(name: str, kind: type, *details):
        def fail(*args, **kwargs):
            raise kind(*details)  # a new exception each call: one raised twice would pile up tracebacks

        fail.__name__ = fail.__qualname__ = name
        return fail

    def say(text: str) -> None:
        try:
            print(text, flush=True)
        except Exception:  # the cells replaced or closed stdout: the note is lost, grading goes on
            pass

    def words(e: BaseException) -> str:
        try:
            return str(e).strip().split("\n")[0][:200]
        except Exception:
            return "(its message cannot be printed)"

    for label, source, kept, graded, error in cells:
        lines = [line + "\n" for line in re.split(r"\r\n|\r|\n", source)]  # as Python counts lines
        if error is None:
            linecache.cache[label] = (len(source), None, lines, label)
            try:
                body = ast.parse(source, label).body
            except Exception as e:  # the grader's compile said it can: only a parser out of memory gets here
                error = (f"{type(e).__name__}: {e}", 1, 0, "")
        if error is not None:
            message, line, column, text = error
            why = f"{label} does not parse, so none of its code is graded: {message}"
            for name in graded:
                namespace[name] = failing(name, SyntaxError, why, (label, line, column, text))
            if not graded:
                say(f"{label}, line {line}: does not parse ({message}); left out")
            continue
        for index in kept:
            node = body[index]
            try:
                exec(compile(ast.Module([node], []), label, "exec"), namespace)
            except Exception as e:
                first = lines[node.lineno - 1].strip() if node.lineno <= len(lines) else ""
                said = words(e)
                say(
                    f"{label}, line {node.lineno}: `{first[:80]}` raised {type(e).__name__}: {said}; "
                    "left out, the rest is graded without it"
                )
                names = (
                    [node.name]
                    if hasattr(node, "name")
                    else [
                        n.id
                        for t in getattr(node, "targets", [getattr(node, "target", None)])
                        if t is not None
                        for n in ast.walk(t)
                        if isinstance(n, ast.Name)
                    ]
                )
                for name in names:
                    if name in graded:
                        why = f"{label}, line {node.lineno}: `{first[:80]}` raised {type(e).__name__}: {said}, so {name} was never defined"
                        namespace[name] = failing(name, AnswerCellFailed, why)


def segment(code: str, node: ast.stmt) -> str:
    """A statement's source, with its decorators and the indented comments that close its body
    (such as `### END SOLUTION`, which the AST does not count as part of the function)."""
    lines = code.splitlines()
    start = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno])
    last = node.end_lineno or node.lineno  # set for every parsed statement
    end = last
    while end < len(lines) and (not lines[end].strip() or lines[end][:1].isspace() and lines[end].lstrip().startswith("#")):
        end += 1
    while end > last and not lines[end - 1].strip():
        end -= 1
    return "\n".join(lines[start - 1 : end])


def _grader_import(node: ast.Import | ast.ImportFrom) -> bool:
    names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
    return any(n.split(".")[0] in ("grader", "solutions", "figures") for n in names)


def cells_of(notebook: Path) -> list[str]:
    """The code cells of an .ipynb file, in order, read by `grader.delivery.submission` (the file itself is
    never followed as a link, its size is bounded, any JSON that is not nbformat's shape is a clear
    error): `grader.delivery.submission.SubmissionError`, a ValueError, saying why it cannot be read."""
    from grader.delivery.submission import read_notebook

    return read_notebook(notebook)


def submission_from_cells(ch: Chapter, cells: list[str], folder: Path, where: list[str] | None = None) -> Path:
    """Write the module the cells amount to (`assemble`) into `folder` (a submission folder) and return it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ch.filename).write_text(assemble(ch, cells, where), encoding="utf-8")
    return folder
