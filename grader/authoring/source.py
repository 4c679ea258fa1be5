"""The student's code as text, for hints: which lines of a graded function hold a given call.

A measured check (memory, measured from outside) knows *how much* a function used, not *where*: the
student's process was stopped or only measured, and nothing it says about itself is believed. The
trusted side reads the module's text instead (the copy it made, never following a link) and parses
it with `ast`, which reads code without running any of it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

MAX_BYTES = 1 << 20
"""A chapter module is at most 1 MiB (grader.run.read_module); longer text is not parsed."""


def function_lines(path: Path, name: str) -> list[tuple[int, str]]:
    """The lines (number, text without its comment) of the top-level function or class `name` in the
    module at `path`; empty where the file cannot be read or parsed, or has no such definition."""
    from grader.run import MissingModule, read_module

    try:
        text = read_module(path, MAX_BYTES).decode("utf-8")
        tree = ast.parse(text)
    except (OSError, MissingModule, UnicodeDecodeError, SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    lines = text.splitlines()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            docstring = _docstring_lines(node)
            end = node.end_lineno or node.lineno
            return [(n, _code(lines[n - 1])) for n in range(node.lineno, min(end, len(lines)) + 1) if n not in docstring]
    return []


def _docstring_lines(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> range:
    """The lines of a definition's docstring (whose prose names the very calls a hint looks for)."""
    first = node.body[0] if node.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return range(first.lineno, (first.end_lineno or first.lineno) + 1)
    return range(0)


def first_line_with(lines: list[tuple[int, str]], *calls: str) -> tuple[str, int, str] | None:
    """The first of `calls` (texts such as ".contiguous(" or "@") found in `lines`, with its line: (call,
    number, line), or None."""
    for number, code in lines:
        for call in calls:
            if call in code:
                return call, number, code.strip()
    return None


def _code(line: str) -> str:
    """A line without its trailing comment (a '#' inside a string is rare enough in these functions)."""
    return re.sub(r"\s+#.*$", "", line)
