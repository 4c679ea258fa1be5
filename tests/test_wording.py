"""What students read speaks the chapter's own terms: no section numbers of documents they do not have."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from grader import chapters

SECTION = re.compile(r"§\s*[A-Z0-9]")


def strings(path: Path, *, docstrings: bool) -> list[tuple[int, str]]:
    """(line, text) of every string literal of a module (f-string parts included), docstrings only if asked."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = set()
    if not docstrings:
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                skip.add(id(body[0].value))
    return [(n.lineno, n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip]


MESSAGES = [p for d in ("grader/checks", "grader/hidden", "grader/lab") for p in (chapters.ROOT / d).glob("*.py")]
"""Modules whose strings become messages, check names and page text (their docstrings are for the grader's
readers)."""


@pytest.mark.parametrize("path", MESSAGES + sorted(chapters.EXERCISES.glob("ch*.py")), ids=lambda p: str(p.relative_to(chapters.ROOT)))
def test_no_section_of_a_reference_document_is_named(path):
    found = [(line, text) for line, text in strings(path, docstrings=path.parent == chapters.EXERCISES) if SECTION.search(text)]
    assert not found, found
