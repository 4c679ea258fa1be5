"""The engine's words in the run's language: its errors, the model's description and the trace's details.

In the grader's process `tr` is `grader.i18n.tr`. The engine also runs inside a sandbox (`engine.boxed`), which
holds the engine and `grader/isolation` but not `grader.i18n` nor its catalogs: there the words are the table the
trusted side sent with the run (`sent_words` there, `use` in the box), and the English where it sent none.
"""

from __future__ import annotations

from typing import Any, Callable

_sent: dict[str, str] | None = None
"""The table sent into the sandbox ({English: translation}), once `use` was called."""
_grader: Callable[..., str] | None = None


def tr(message: str, /, **fields: Any) -> str:
    """`message` in the run's language, filled with `fields` (str.format) when any are given."""
    global _grader
    if _sent is None:
        if _grader is None:
            try:
                from grader.i18n import tr as translate
            except ImportError:  # in the sandbox, before `use`
                translate = _english
            _grader = translate
        return _grader(message, **fields)
    text = _sent.get(message, message)
    return text.format(**fields) if fields else text


def _english(message: str, /, **fields: Any) -> str:
    return message.format(**fields) if fields else message


def use(table: dict[str, str]) -> None:
    """Speak the translations of `table` ({English: translation}) from now on (in the sandbox)."""
    global _sent
    _sent = {k: v for k, v in table.items() if type(k) is str and type(v) is str}


def sent_words() -> dict[str, str]:
    """The engine's messages in the run's language ({English: translation}; {} in English), for a sandbox: the
    engine's own catalog, nothing else."""
    from grader.i18n import language
    from grader.i18n.catalog import LOCALE_DIRS, read

    lang = language()
    path = LOCALE_DIRS[0] / lang / "LC_MESSAGES" / "engine.po"
    if lang == "en" or not path.is_file():
        return {}
    return {message: text for (context, message), text in read(path).items() if context is None}
