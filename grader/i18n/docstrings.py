"""The exercises' docstrings in the release's language.

The repository writes each docstring in English; its Chinese is in the chapter's catalog, one message per
paragraph (paragraphs are separated by blank lines), with the docstring's owner as the context
("ch17_causal_masks" for the module's, "ch17_causal_masks.causal_mask" for a function's). A paragraph that is
code (a doctest, `>>>`) or has no letters stays as it is. `translate_source` rewrites a module's source with
every docstring in the language asked for: what `course release` and the notebooks use.
"""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Iterator

from grader.i18n.catalog import table

CODE = re.compile(r"^\s*(>>>|\.\.\.)", re.M)


def paragraphs(doc: str) -> list[str]:
    """A docstring's paragraphs, dedented, in order."""
    return [p.strip("\n") for p in re.split(r"\n[ \t]*\n", inspect.cleandoc(doc)) if p.strip()]


def translatable(paragraph: str) -> bool:
    """Whether a paragraph is prose to translate (not a doctest, not only symbols, not already Chinese)."""
    if CODE.search(paragraph) or not re.search(r"[A-Za-z]{2,}", paragraph):
        return False
    return not re.fullmatch(r"[^A-Za-z]*[\u3400-\u9fff][^\n]*", paragraph)  # a line of Chinese already


def owners(tree: ast.Module, module: str) -> Iterator[tuple[str, ast.Constant, str]]:
    """(context, the docstring's string node, its text) for the module and every function and class in it."""

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, ast.Constant, str]]:
        body = getattr(node, "body", [])
        first = body[0].value if body and isinstance(body[0], ast.Expr) else None
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            yield prefix, first, first.value
        for child in body:
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                yield from walk(child, f"{prefix}.{child.name}")

    yield from walk(tree, module)


def messages(source: str, module: str) -> Iterator[tuple[str, str, int]]:
    """(context, paragraph, line) of every translatable paragraph of a module's docstrings."""
    for context, node, doc in owners(ast.parse(source), module):
        for p in paragraphs(doc):
            if translatable(p):
                yield context, p, node.lineno


def translate_doc(doc: str, context: str, lang: str) -> str:
    """A docstring's text with each paragraph in `lang` (the English where it has no translation)."""
    found = table(lang)
    return "\n\n".join(found.get((context, p), p) if translatable(p) else p for p in paragraphs(doc))


def translate_source(source: str, module: str, lang: str) -> str:
    """`source` with every docstring in `lang`, indented as it was; the rest of the file untouched."""
    if lang == "en":
        return source
    lines = source.splitlines(keepends=True)
    edits = []
    for context, node, doc in owners(ast.parse(source), module):
        new = translate_doc(doc, context, lang)
        if new == inspect.cleandoc(doc):
            continue
        indent = " " * node.col_offset
        first, *rest = new.split("\n")
        body = "\n".join([first, *[(indent + r if r else r) for r in rest]])
        multi = "\n" in body or len(body) > 60
        literal = '"""' + body.replace("\\", "\\\\").replace('"""', '\\"\\"\\"') + (f"\n{indent}" if multi else "") + '"""'
        edits.append((node.lineno, node.col_offset, node.end_lineno or node.lineno, node.end_col_offset or 0, literal))
    for lineno, col, end_lineno, end_col, literal in sorted(edits, reverse=True):
        head = lines[lineno - 1].encode()[:col].decode()  # ast's columns count UTF-8 bytes
        tail = lines[end_lineno - 1].encode()[end_col:].decode()
        lines[lineno - 1 : end_lineno] = [head + literal + tail]
    return "".join(lines)
