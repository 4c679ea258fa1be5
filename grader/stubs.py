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

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"


class StubError(ValueError):
    """A solution file whose solution regions cannot be turned into a stub."""


def make_stub(source: str, chapter_id: str) -> str:
    """The exercise file for a solution file's text."""
    owners = _task_owners(source)
    lines = source.splitlines(keepends=True)
    out = [f"# {chapter_id} exercises: replace each TODO with your code, then run `course check {chapter_id}`.\n"]
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
        n = sum(1 for ln in lines[i + 1:end] if ln.strip() and not ln.strip().startswith("#"))
        size = f"about {n} line{'s' if n != 1 else ''}"
        out.append(f"{indent}# TODO({task[0]}): your code here ({size})\n")
        out.append(f'{indent}raise NotImplementedError("{task[0]} {task[1]}: not implemented yet ({size})")\n')
        i = end + 1
    return "".join(out)


def _task_owners(source: str) -> dict[int, tuple[str, str]]:
    """Line number → (task id, name) of the top-level function or class holding it."""
    owners = {}
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            m = chapters.TASK_RE.search(ast.get_docstring(node) or "")
            if m:
                for line in range(node.lineno, node.end_lineno + 1):
                    owners[line] = (m.group(1), node.name)
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
