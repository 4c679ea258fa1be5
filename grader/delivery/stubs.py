"""Student stubs from reference solutions.

Each `### BEGIN SOLUTION` … `### END SOLUTION` region (nbgrader's markers) in
`solutions/chNN_<slug>.py` becomes a TODO naming its task and a
`NotImplementedError`; everything else, signatures and docstrings included, is
copied as it is. The result is committed as `exercises/chNN_<slug>.py`.
"""

from __future__ import annotations

import ast
from pathlib import Path

from grader import chapters
from grader.i18n import tr

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"


class StubError(ValueError):
    """A solution file whose solution regions cannot be turned into a stub."""


def make_stub(source: str, chapter_id: str) -> str:
    """The exercise file for a solution file's text."""
    owners = _task_owners(source)
    lines = source.splitlines(keepends=True)
    sizes = _task_sizes(lines, owners)
    out = [
        "# " + tr("{chapter} exercises: replace each TODO with your code, then run `course check {chapter}`.", chapter=chapter_id) + "\n"
    ]
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.strip() != BEGIN:
            if line.strip() == END:
                raise StubError(f"line {i + 1}: {END} without {BEGIN}")
            out.append(line)
            i += 1
            continue
        indent = line[: len(line) - len(line.lstrip())]
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() in (BEGIN, END)), None)
        if end is None or lines[end].strip() != END:
            raise StubError(f"line {i + 1}: {BEGIN} is not closed by {END}")
        if not indent:
            raise StubError(f"line {i + 1}: solution regions must be inside a function")
        task = owners.get(i + 1)
        if task is None:
            raise StubError(f"line {i + 1}: the region is not inside a function or class marked 'Task chNN.k'")
        n = _code_lines(lines[i + 1 : end])
        total, places = sizes[task[0]]
        size = _about(total)
        here = (
            _about(total, words=True)
            if places == 1
            else tr("about {n} of the task's {total} lines, in {places} places", n=n, total=total, places=places)
        )
        out.append(f"{indent}# TODO({task[0]}): " + tr("your code here ({size})", size=here) + "\n")
        # the exception's text stays English: the grader reads the task and the size back from it (isolation/session.py)
        out.append(f'{indent}raise NotImplementedError("{task[0]} {task[1]}: not implemented yet ({size})")\n')
        i = end + 1
    return "".join(out)


def _code_lines(region: list[str]) -> int:
    return sum(1 for ln in region if ln.strip() and not ln.strip().startswith("#"))


def _about(n: int, *, words: bool = False) -> str:
    """ "about 3 lines": in English for the stub's exception (which the grader parses), in the run's language for
    its comment (`words`)."""
    if not words:
        return f"about {n} line{'s' if n != 1 else ''}"
    return tr("about 1 line") if n == 1 else tr("about {n} lines", n=n)


def _task_sizes(lines: list[str], owners: dict[int, tuple[str, str]]) -> dict[str, tuple[int, int]]:
    """Task id → (code lines over all its solution regions, number of regions): a class task's estimate
    counts every method, not only the one whose TODO shows it."""
    sizes: dict[str, tuple[int, int]] = {}
    start = None
    for i, line in enumerate(lines):
        if line.strip() == BEGIN:
            start = i
        elif line.strip() == END and start is not None:
            task = owners.get(start + 1)
            if task:
                total, places = sizes.get(task[0], (0, 0))
                sizes[task[0]] = (total + _code_lines(lines[start + 1 : i]), places + 1)
            start = None
    return sizes


def _task_owners(source: str) -> dict[int, tuple[str, str]]:
    """Line number → (task id, name) of the top-level function or class holding it."""
    owners = {}
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            task = chapters.task_of(ast.get_docstring(node))
            if task:
                for line in range(node.lineno, (node.end_lineno or node.lineno) + 1):  # set for every parsed node
                    owners[line] = (task, node.name)
    return owners


def stub_for(chapter: chapters.Chapter) -> str:
    """The stub text the chapter's solution file generates."""
    source = (chapters.SOLUTIONS / chapter.filename).read_text(encoding="utf-8")
    return make_stub(source, chapter.id)


def write_stubs(chapter_list: list[chapters.Chapter], *, check_only: bool = False) -> list[Path]:
    """Regenerate exercises/ for these chapters; return the files that changed (or would)."""
    changed = []
    for ch in chapter_list:
        path = chapters.EXERCISES / ch.filename
        text = stub_for(ch)
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            changed.append(path)
            if not check_only:
                path.write_text(text, encoding="utf-8")
    return changed
