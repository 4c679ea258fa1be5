"""Which language a run speaks, "zh" or "en".

In order: `--lang` (which calls `set_language`) or `COURSE_LANG`; else the course's own setting, which
`course release --lang` writes into the student package (`grader/answers/course.json`) and the nbgrader course
(Chinese unless told otherwise: it is the course's language); else, in the instructor's repository, the locale
in the order gettext reads it (`LANGUAGE`, `LC_ALL`, `LC_MESSAGES`, `LANG`): Chinese for a `zh*` locale,
English for anything else. Grading (`course grade`, Gradescope, nbgrader's autograde) never reads the locale,
which on a grading machine is the container's (`C.UTF-8`): it speaks the course's setting, Chinese by default.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

LANGUAGES = ("zh", "en")
COURSE_LANGUAGE = "zh"
"""The course's own language: what a release speaks unless `course release --lang en`."""
ENV = "COURSE_LANG"
LOCALE_VARIABLES = ("LANGUAGE", "LC_ALL", "LC_MESSAGES", "LANG")
SETTING = Path(__file__).resolve().parent.parent / "answers" / "course.json"

_chosen: str | None = None


class UnknownLanguage(ValueError):
    """A language the course does not speak."""


def normalize(value: str) -> str:
    """ "zh", "zh_CN.UTF-8", "ZH-tw" → "zh"; "en", "en_US" → "en"; anything else raises `UnknownLanguage`."""
    v = value.strip().lower().replace("-", "_")
    for lang in LANGUAGES:
        if v == lang or v.startswith(lang + "_") or v.startswith(lang + "."):
            return lang
    raise UnknownLanguage(f"{value!r} is not a language of the course: use zh (中文) or en (English)")


def set_language(lang: str | None) -> str:
    """Speak `lang` from now on, in this process and the processes it starts (through `COURSE_LANG`);
    None forgets the choice (the next `language()` resolves it again)."""
    global _chosen
    if lang is None:
        _chosen = None
        os.environ.pop(ENV, None)
        return language()
    _chosen = normalize(lang)
    os.environ[ENV] = _chosen
    return _chosen


def language() -> str:
    """The language this run speaks."""
    global _chosen
    if _chosen is None:
        _chosen = resolve(os.environ)
    return _chosen


def resolve(env: os._Environ | dict[str, str], *, grading: bool = False) -> str:
    """The language `env` asks for: `COURSE_LANG`, else the course's setting, else (never when `grading`) the
    locale; when grading, the course's language by default."""
    if env.get(ENV):
        return normalize(env[ENV])
    setting = course_setting()
    if setting:
        return setting
    return COURSE_LANGUAGE if grading else from_locale(env)


def for_grading(setting: str | None = None) -> str:
    """Set and return the language of a grading run or a release: `--lang` or `COURSE_LANG`, else `setting` (an
    nbgrader course's), the installed course's setting, Chinese; never the locale."""
    if not os.environ.get(ENV) and setting:
        return set_language(setting)
    return set_language(resolve(os.environ, grading=True))


def from_locale(env: os._Environ | dict[str, str]) -> str:
    """The locale's language as gettext finds it: the first of LANGUAGE, LC_ALL, LC_MESSAGES, LANG that is set
    (LANGUAGE is a list, "zh_CN:en"); Chinese for zh*, English for anything else (C, POSIX, fr_FR …)."""
    for name in LOCALE_VARIABLES:
        value = env.get(name, "")
        if name == "LANGUAGE":
            value = next((v for v in value.split(":") if v), "")
        if value:
            return "zh" if value.strip().lower().startswith("zh") else "en"
    return "en"


def course_setting(path: Path | None = None) -> str | None:
    """The language a release was built in (`grader/answers/course.json`), or None in the repository."""
    path = path or SETTING
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("language")
    except (OSError, ValueError, AttributeError):
        return None
    try:
        return normalize(value) if isinstance(value, str) else None
    except UnknownLanguage:
        return None


def write_setting(folder: Path, lang: str) -> Path:
    """Record `lang` as the course's language in a release (`folder` is its `grader/answers/`)."""
    path = Path(folder) / SETTING.name
    path.write_text(json.dumps({"language": normalize(lang)}) + "\n", encoding="utf-8")
    return path
