"""`course`'s command line in the run's language: `--lang`, the commands' help, and click's own words.

The language is read from the command line before click parses it (`--lang zh` anywhere, or `--lang=zh`),
so a usage error or a help page is already in it. The commands' help texts (their docstrings and options'
`help=`) are written in English and translated when shown; click's own texts ("Usage:", "Options:",
"Missing argument …") are looked up in the `click` catalog by patching the `gettext` click imports.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import os
import sys
from collections.abc import Sequence

import click

from grader.i18n.catalog import mark, tr
from grader.i18n.choose import ENV, LANGUAGES, UnknownLanguage, normalize, set_language

CLICK_MODULES = ("core", "decorators", "exceptions", "formatting", "parser", "types", "termui", "utils", "shell_completion")
"""The click modules whose `_` and `ngettext` become ours (their English texts are the catalog's ids)."""

LANG_HELP = mark("Language of the output: zh (中文) or en (English); default: COURSE_LANG, the course's setting, the locale.")


def scan(args: Sequence[str]) -> str | None:
    """The value of the last `--lang X` / `--lang=X` in `args` (None without one; a bad value is left to click)."""
    found = None
    for i, arg in enumerate(args):
        if arg == "--":
            break
        if arg == "--lang" and i + 1 < len(args):
            found = args[i + 1]
        elif arg.startswith("--lang="):
            found = arg.partition("=")[2]
    return found


def choose_from(args: Sequence[str]) -> None:
    """Speak what `args` asks for with `--lang`, if it names a language of the course; a `COURSE_LANG` the course
    does not speak stops here with the convention it broke (exit status 2, as for any usage error)."""
    if os.environ.get(ENV) and not scan(args):
        try:
            normalize(os.environ[ENV])
        except UnknownLanguage as e:
            print(f"Error: {ENV}: {e}", file=sys.stderr)
            raise SystemExit(2) from None
    value = scan(args)
    if value:
        try:
            set_language(normalize(value))
        except ValueError:
            pass  # click refuses it with the list of choices


def install() -> None:
    """Route click's own texts through the course's catalogs."""
    for name in CLICK_MODULES:
        try:
            module = importlib.import_module(f"click.{name}")
        except ImportError:
            continue
        if hasattr(module, "_"):
            module._ = _click_gettext  # type: ignore[attr-defined]
        if hasattr(module, "ngettext"):
            module.ngettext = _click_ngettext  # type: ignore[attr-defined]


def _click_gettext(message: str) -> str:
    return tr(message)


def _click_ngettext(singular: str, plural: str, n: int) -> str:
    return tr(singular if n == 1 else plural)


def lang_option() -> click.Option:
    """`--lang zh|en` (already applied by `choose_from`; the option documents and validates it)."""
    return click.Option(["--lang"], type=click.Choice(LANGUAGES), expose_value=False, is_eager=True, help=LANG_HELP)


def translated(command: click.Command) -> click.Command:
    """A copy of `command` whose help texts are in the run's language, with `--lang` among its options."""
    out = copy.copy(command)
    if command.help:
        out.help = tr(inspect.cleandoc(command.help))
    if command.short_help:
        out.short_help = tr(inspect.cleandoc(command.short_help))
    params = list(command.params)
    if not any(p.name == "lang" for p in params):
        params.append(lang_option())
    out.params = translated_params(params)
    if isinstance(command, click.Group):  # `course engine run`: a group's commands speak too

        def get_command(ctx: click.Context, name: str) -> click.Command | None:
            sub = command.get_command(ctx, name)
            return None if sub is None else translated(sub)

        out.get_command = get_command  # type: ignore[attr-defined]
    return out


def translated_params(params: list[click.Parameter]) -> list[click.Parameter]:
    """Copies of `params` with their help (and a worded default) in the run's language."""
    out = []
    for p in params:
        q = copy.copy(p)
        if isinstance(q, click.Option):
            q.help = tr(q.help) if q.help else q.help
            q.show_default = tr(q.show_default) if isinstance(q.show_default, str) else q.show_default
        out.append(q)
    return out
