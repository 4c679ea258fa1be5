"""The catalogs kept in step with the code (Babel): what `python -m grader.i18n update` does.

Extracted, per domain (a chapter's files, `chNN`; `documents` for grader/delivery/, `lab` for the lab and its
page, `figures` for the figures' shared parts, `engine`; `click` for click's own words; `course` for the rest):
- the texts marked in the code: `tr(...)`, `tr_in(context, ...)`, `mark(...)`, and the names of checks
  (`@public(task, name)`, `@hidden(task, name)`), in `grader/`, `figures/` and `engine/`; the lab page's
  `t(...)` and `data-t` texts; the commands' docstrings (their help);
- the rows of each chapter's table of mistakes (`grader/hidden/chNN_mistakes.py`), their id as context
  ("ch17.topleft"): the release records them, so their Chinese is public;
- the paragraphs of the exercises' and solutions' docstrings (`grader.i18n.docstrings`).
The hidden checks' own texts go to `grader/hidden/locale/`, which never ships; everything else to
`grader/locale/`. An existing translation is kept; one whose English changed is kept as fuzzy (Babel's fuzzy
matching), for a translator to confirm, and counts as missing until then.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import io
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import click
from babel.messages.catalog import Catalog
from babel.messages.extract import extract_javascript, extract_python
from babel.messages.pofile import read_po, write_po

from grader.i18n import docstrings
from grader.i18n.catalog import LOCALE_DIRS, PACKAGE

ROOT = PACKAGE.parent
KEYWORDS = {"tr": None, "tr_in": ((1, "c"), 2), "mark": None, "public": (2,), "hidden": (2,)}
SOURCES = ("grader", "figures", "engine")
DOCSTRINGS = ("exercises", "solutions")
CHAPTER = re.compile(r"(ch\d{2})")
TRANSLATED = ("zh",)

Message = tuple[str | None, str]  # (context, English)


DOMAINS = {"grader/delivery": "documents", "grader/lab": "lab", "figures": "figures", "engine": "engine"}
"""Folders whose files (other than a chapter's) have a domain of their own: the documents a release, a grading
run or the figure book writes, the lab's page and runner, the figures' shared parts, the engine."""
OWN_DOMAIN = {"grader/delivery/doctor.py": "course"}


def domain_of(path: Path) -> tuple[str, bool]:
    """(domain, hidden) of a source file: its chapter's, its folder's (`DOMAINS`), or "course"; hidden when under
    grader/hidden/."""
    rel = path.relative_to(ROOT)
    hidden = "hidden" in rel.parts[:2]
    m = CHAPTER.match(path.name)
    if m:
        return m.group(1), hidden
    folder = str(rel.parent)
    return OWN_DOMAIN.get(str(rel), DOMAINS.get(folder, "course")), hidden


def extract() -> dict[tuple[str, bool], dict[Message, list[tuple[str, int]]]]:
    """{(domain, hidden): {(context, English): [(file, line), ...]}}, from every source."""
    out: dict[tuple[str, bool], dict[Message, list[tuple[str, int]]]] = defaultdict(dict)

    def add(key: tuple[str, bool], message: Message, where: tuple[str, int]) -> None:
        if message[1].strip():
            out[key].setdefault(message, []).append(where)

    for folder in SOURCES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "locale" in path.parts:
                continue
            rel = str(path.relative_to(ROOT))
            with path.open("rb") as f:
                for line, funcname, found, _comments in extract_python(f, KEYWORDS, [], {}):
                    for context, text in _texts(funcname, found):  # type: ignore[arg-type]
                        add(domain_of(path), (context, text), (rel, line))
    for message, where in lab_page_texts():
        add(("lab", False), message, where)
    for context, doc, line in command_docstrings(ROOT / "grader" / "cli.py"):
        add(("course", False), (context, doc), ("grader/cli.py", line))
    for path in sorted(Path(click.__file__).parent.glob("*.py")):
        with path.open("rb") as f:
            for line, funcname, found, _comments in extract_python(f, {"_": None, "ngettext": (1, 2)}, [], {}):
                for piece in found if isinstance(found, tuple) else (found,):
                    if isinstance(piece, str):
                        add(("click", False), (None, piece), (f"click/{path.name}", line))
    for path in sorted((ROOT / "grader" / "hidden").glob("ch*_mistakes.py")):
        chapter = CHAPTER.match(path.name).group(1)  # type: ignore[union-attr]
        module = importlib.import_module(f"grader.hidden.{path.stem}")
        for row in module.MISTAKES:
            add((chapter, False), (f"{chapter}.{row.id}", row.message), (str(path.relative_to(ROOT)), 0))
    for folder in DOCSTRINGS:
        for path in sorted((ROOT / folder).glob("ch*.py")):
            chapter = CHAPTER.match(path.name).group(1)  # type: ignore[union-attr]
            rel = str(path.relative_to(ROOT))
            for context, text, line in docstrings.messages(path.read_text(encoding="utf-8"), path.stem):
                add((chapter, False), (context, text), (rel, line))
    return out


LAB_STATIC = ROOT / "grader" / "lab" / "static"


def lab_page_texts() -> Iterator[tuple[Message, tuple[str, int]]]:
    """The lab page's own words: lab.js's `t("…")` (Babel's JavaScript extractor) and index.html's elements
    marked `data-t` (as `grader.lab.server` translates them when it serves the page)."""
    from grader.lab.server import MARKED

    for path in sorted(LAB_STATIC.glob("*.js")):
        rel = str(path.relative_to(ROOT))
        with path.open("rb") as f:
            for line, funcname, found, _comments in extract_javascript(f, {"t": None}, [], {}):
                text = found[0] if isinstance(found, tuple) else found
                if funcname == "t" and isinstance(text, str):
                    yield (None, text), (rel, line)
    for path in sorted(LAB_STATIC.glob("*.html")):
        rel, source = str(path.relative_to(ROOT)), path.read_text(encoding="utf-8")
        for m in MARKED.finditer(source):
            yield (None, m.group(3)), (rel, source.count("\n", 0, m.start()) + 1)


def command_docstrings(path: Path) -> Iterator[tuple[None, str, int]]:
    """The help texts of the command line's commands: the docstrings of functions decorated as click commands,
    as click shows them (`inspect.cleandoc`)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef) and any("command" in ast.unparse(d) or "group" in ast.unparse(d) for d in node.decorator_list):
            doc = ast.get_docstring(node, clean=True)
            if doc:
                yield None, doc, node.lineno


def _texts(funcname: str, found: object) -> Iterator[Message]:
    args = found if isinstance(found, tuple) else (found,)
    if funcname == "tr_in":
        if len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
            yield args[0], args[1]
    elif funcname in ("public", "hidden"):  # (task, name, keywords …): the name is the second argument
        if len(args) >= 2 and isinstance(args[1], str):
            yield None, args[1]
    elif args and isinstance(args[0], str):
        yield None, args[0]


def path_of(domain: str, hidden: bool, lang: str) -> Path:
    return LOCALE_DIRS[1 if hidden else 0] / lang / "LC_MESSAGES" / f"{domain}.po"


def update(domains: list[str] | None = None, langs: tuple[str, ...] = TRANSLATED) -> dict[Path, tuple[int, int]]:
    """Rewrite the catalogs of `domains` (all when None) from the sources; {path: (messages, untranslated)}."""
    found = extract()
    report = {}
    for (domain, hidden), messages in sorted(found.items()):
        if domains and domain not in domains:
            continue
        template = Catalog(project="course", domain=domain)
        for (context, text), where in messages.items():
            template.add(text, locations=where, context=context)
        for lang in langs:
            path = path_of(domain, hidden, lang)
            if path.exists():
                with path.open("rb") as f:
                    catalog = read_po(f, locale=lang, domain=domain)
                template.creation_date = catalog.creation_date  # an unchanged catalog stays byte for byte the same
                catalog.update(template, update_header_comment=False)
            else:
                catalog = Catalog(locale=lang, domain=domain, project="course")
                catalog.update(template)
            catalog.obsolete.clear()
            path.parent.mkdir(parents=True, exist_ok=True)
            buffer = io.BytesIO()
            write_po(buffer, catalog, width=100, include_lineno=False, sort_output=False, omit_header=False)
            path.write_bytes(buffer.getvalue())
            report[path] = (len(catalog), sum(1 for m in catalog if m.id and (not m.string or m.fuzzy)))
    return report


def key(context: str | None, text: str) -> str:
    """A short stable key of a message, for `todo` and `fill`."""
    return hashlib.sha1(f"{context or ''}\x04{text}".encode()).hexdigest()[:10]


def todo(domain: str, lang: str = "zh", hidden: bool | None = None) -> list[dict]:
    """The messages of `domain` still to translate (empty or fuzzy), with their keys."""
    out = []
    for h in (False, True) if hidden is None else (hidden,):
        path = path_of(domain, h, lang)
        if not path.exists():
            continue
        with path.open("rb") as f:
            catalog = read_po(f, locale=lang)
        for m in catalog:
            if isinstance(m.id, str) and m.id and (not m.string or m.fuzzy):
                item: dict[str, object] = {"key": key(m.context, m.id), "context": m.context, "en": m.id}
                if m.fuzzy and m.string:
                    item["old"] = m.string
                item["where"] = sorted({p for p, _ in m.locations})
                item["hidden"] = h
                out.append(item)
    return out


def fill(domain: str, translations: dict[str, str], lang: str = "zh") -> tuple[int, list[str]]:
    """Write `translations` ({key: text}) into `domain`'s catalogs; (filled, keys not found)."""
    found: set[str] = set()
    filled = 0
    for h in (False, True):
        path = path_of(domain, h, lang)
        if not path.exists():
            continue
        with path.open("rb") as f:
            catalog = read_po(f, locale=lang)
        for m in catalog:
            k = key(m.context, m.id) if isinstance(m.id, str) and m.id else ""
            if k in translations:  # the same text can be in the public and the hidden catalog
                found.add(k)
                m.string = translations[k]
                m.flags.discard("fuzzy")
                filled += 1
        buffer = io.BytesIO()
        write_po(buffer, catalog, width=100, include_lineno=False, sort_output=False)
        path.write_bytes(buffer.getvalue())
    return filled, sorted(set(translations) - found)
