"""The course in Chinese and in English: which language a run speaks, and its messages in that language.

Every student-facing text is written once, in English, in the code, and marked: `tr("only key {k}", k=3)`
(translated, then filled), `tr_in("ch17.topleft", text)` (with a context, for texts that share words but not
meaning), `mark("…")` (only marked, for a text translated later with `tr`). The Chinese lives in gettext catalogs,
one `.po` file per domain (a chapter, or `course` for the rest) under `grader/locale/zh/LC_MESSAGES/` (the
hidden checks' under `grader/hidden/locale/`), keyed by the English text and its context: the form translators
and their tools know. `python -m grader.i18n update` (Babel) extracts the marked texts, the tables of mistakes and
the exercises' docstrings into those catalogs, keeping what is translated; `tests/test_i18n.py` fails when a text
lacks its Chinese or a translation's placeholders differ from the English. English needs no catalog: its texts
are the ids.

Which language a run speaks: `grader.i18n.choose`.
"""

from grader.i18n.catalog import mark, tr, tr_in
from grader.i18n.choose import LANGUAGES, language, set_language

__all__ = ["LANGUAGES", "language", "mark", "set_language", "tr", "tr_in"]
