"""The messages of a language: every `.po` catalog of the course read into one table, (context, English) → text.

The catalogs are read by a small parser of the subset of the PO format Babel writes (comments, flags,
`msgctxt`, `msgid`, `msgstr`, continued strings; no plurals: the course words its counts without them); a fuzzy or
empty translation counts as missing, and a missing one falls back to the English. The table is cached on disk
(`COURSE_CACHE_DIR`, else `$XDG_CACHE_HOME/course`), keyed by the catalogs' names, sizes and times, so a run pays
a few milliseconds for it, not the parse. `tests/test_i18n.py` reads every catalog with Babel too and compares.
"""

from __future__ import annotations

import ast
import hashlib
import marshal
import os
from pathlib import Path
from typing import Any

from grader.delivery.files import cache_folder
from grader.i18n.choose import language

PACKAGE = Path(__file__).resolve().parent.parent
LOCALE_DIRS = (PACKAGE / "locale", PACKAGE / "hidden" / "locale")
"""Where catalogs live: `<dir>/<lang>/LC_MESSAGES/<domain>.po`; the hidden checks' stay out of a release."""
CACHE_VERSION = b"course-catalog-1"

Table = dict[tuple[str | None, str], str]
_tables: dict[str, Table] = {}


def tr(message: str, /, **fields: Any) -> str:
    """`message` in the run's language, filled with `fields` (str.format) when any are given."""
    text = message if language() == "en" else table(language()).get((None, message), message)
    return text.format(**fields) if fields else text


def tr_in(context: str, message: str, /, **fields: Any) -> str:
    """`tr` for a text with a context (a mistake's id, a docstring's owner): the same English can differ."""
    text = message if language() == "en" else table(language()).get((context, message), message)
    return text.format(**fields) if fields else text


def mark(message: str) -> str:
    """Marks `message` for the catalogs without translating it (translate it where it is used, with `tr`)."""
    return message


def catalogs(lang: str) -> list[Path]:
    """The `.po` files of `lang`, public ones first."""
    return [p for d in LOCALE_DIRS for p in sorted((d / lang / "LC_MESSAGES").glob("*.po"))]


def table(lang: str) -> Table:
    """Every translated message of `lang` ({} for English)."""
    if lang not in _tables:
        _tables[lang] = {} if lang == "en" else _cached(catalogs(lang))
    return _tables[lang]


def forget() -> None:
    """Drop the tables read so far (after a catalog changed, in tests)."""
    _tables.clear()


def _cached(paths: list[Path]) -> Table:
    stamp = hashlib.sha256(CACHE_VERSION)
    for p in paths:
        st = p.stat()
        stamp.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    cache = cache_folder("catalogs") / f"{stamp.hexdigest()}.marshal"
    try:
        loaded = marshal.loads(cache.read_bytes())
        return {(c or None, m): s for c, m, s in loaded}
    except (OSError, ValueError, EOFError, TypeError):
        pass
    merged: Table = {}
    for p in paths:
        merged.update(read(p))
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(marshal.dumps([(c or "", m, s) for (c, m), s in merged.items()]))
        os.replace(tmp, cache)
    except OSError:
        pass  # a read-only home: parse again next time
    return merged


def read(path: Path) -> Table:
    """The translated entries of one `.po` file (fuzzy and empty ones left out)."""
    out: Table = {}
    entry: dict[str, Any] = {}
    key = ""

    def close() -> None:
        if "msgid" in entry and entry.get("msgstr") and entry["msgid"] and not entry.get("fuzzy"):
            out[(entry.get("msgctxt"), entry["msgid"])] = entry["msgstr"]

    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            if key == "msgstr":  # a comment after a complete entry starts the next one
                close()
                entry, key = {}, ""
            if line.startswith("#,") and "fuzzy" in line:
                entry["fuzzy"] = True
            continue
        if line.startswith('"'):
            entry[key] += ast.literal_eval(line)
            continue
        word, _, rest = line.partition(" ")
        if word in ("msgctxt", "msgid") and key == "msgstr":
            close()
            entry, key = {}, ""
        if word in ("msgctxt", "msgid", "msgstr"):
            key = word
            entry[key] = ast.literal_eval(rest)
    if key == "msgstr":
        close()
    return out
