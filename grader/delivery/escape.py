"""Text from a submission, escaped for where it goes: one function per destination.

Everything a submission chose is hostile text to the trusted process: a student's folder or zip
name, a file name inside it, a notebook cell's text, a message quoting the student's values, the
messages of exceptions their code raised and what it printed. Such text may hold terminal escapes
(`\\x1b]0;title\\x07` sets a window title, `\\x1b[2K\\r` rewrites the row above), C1 controls, bidi
overrides and isolates that reorder a row (U+202E), a newline that starts a fake row, a spreadsheet
formula, Markdown or HTML. Each function here makes it inert for one destination:

- `visible`: the common step. Every control or invisible format character (Unicode categories Cc,
  Cf, Cs, Co, Cn, Zl and Zp: C0 and C1 controls, DEL, the bidi controls U+202A–U+202E and
  U+2066–U+2069, zero-width characters, line and paragraph separators, lone surrogates, unassigned
  code points) becomes its Python escape, visible as text: `\\x1b`, `\\u202e`, `\\n`;
- `terminal` and `terminal_lines`: a line, or lines, for the terminal (tabs as spaces, nothing else
  left that a terminal obeys);
- `csv_cell`: a spreadsheet cell (controls escaped, and a cell that would run as a formula starts
  with `'`);
- `markdown` and `markdown_code`: Markdown prose or a code span (no markup, link, image, table cell
  or HTML can come of it);
- `html`: HTML text or a quoted attribute value (lines kept where asked, for `<pre>`);
- `plain`: text shown as text by another program (a JSON document's message, an SVG text node, a
  notebook's stream output, text a page puts in `textContent`): controls escaped, lines kept where
  asked;
- `json_document`: a JSON document as written to a file or the terminal, its data unchanged (a
  control character inside a string as its `\\uXXXX` escape).

Escaping is not undone anywhere: a name is shown escaped, and stored as it is where it is data
(a folder of OUT, a path in results.json). A backslash is left as it is, so escaping twice changes
nothing more.
"""

from __future__ import annotations

import html as _html
import re
import unicodedata

HIDDEN = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
"""The Unicode categories shown as escapes: controls, format characters (bidi, zero-width), surrogates,
private use, unassigned, line and paragraph separators."""
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
"""A spreadsheet runs a cell that starts with one of these as a formula (OWASP's CSV injection list)."""
TAB = "    "
"""A tab, as a terminal or a page shows it here."""
_MARKDOWN = re.compile(r"([!-/:-@\[-`{-~])")
"""Every ASCII punctuation character: CommonMark lets each be escaped with a backslash, and each escaped
one is a literal character (no emphasis, link, image, autolink, entity, HTML, heading or cell end)."""


def visible(text: object, *, keep: str = "") -> str:
    """`text` with every control and invisible format character (`HIDDEN`), except those in `keep`, as
    its escape (`\\x1b`, `\\u202e`); a CRLF kept as a line break is one `\\n`."""
    text = str(text)
    if text.isprintable():  # the usual case: nothing to escape
        return text
    if "\n" in keep:
        text = text.replace("\r\n", "\n")
    return "".join(c.encode("unicode_escape").decode("ascii") if c not in keep and unicodedata.category(c) in HIDDEN else c for c in text)


def terminal(text: object) -> str:
    """A string for the terminal: tabs as spaces, every other control or format character as its escape
    (a newline too: the caller splits lines before, where lines are meant)."""
    return visible(str(text).replace("\t", TAB))


def terminal_lines(text: object) -> list[str]:
    """Text of several lines for the terminal: its lines (split at line feeds only, a CRLF counting as
    one), each through `terminal`. A lone CR, a NEL or a line separator is shown escaped, never obeyed."""
    return [terminal(line) for line in str(text).replace("\r\n", "\n").split("\n")]


def plain(text: object, *, lines: bool = False) -> str:
    """Text another program shows as text: controls and format characters escaped, tabs as spaces, and
    line breaks kept when `lines`."""
    return visible(str(text).replace("\t", TAB), keep="\n" if lines else "")


def csv_cell(value: object) -> object:
    """A CSV cell: text with its controls escaped (a tab or a line break too) and, when a spreadsheet would
    run it as a formula, a single quote in front; anything else (a number) as it is."""
    if not isinstance(value, str):
        return value
    value = visible(value)
    return "'" + value if value.startswith(FORMULA_START) else value


def markdown(text: object) -> str:
    """One line of Markdown prose showing `text` as it is: controls escaped (a line break too), then
    every ASCII punctuation character escaped with a backslash, so that nothing in it is markup."""
    return _MARKDOWN.sub(r"\\\1", visible(text))


def markdown_code(text: object, *, table: bool = False) -> str:
    """`text` as a Markdown code span (shown as it is, nothing in it read as markup or HTML): controls
    escaped, fenced by more backticks than it holds in a row; in a table cell (`table`), pipes escaped
    as GFM reads them there."""
    text = visible(text)
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    if text.startswith("`") or text.endswith("`") or (text.startswith(" ") and text.endswith(" ") and text.strip()):
        text = f" {text} "  # CommonMark strips one space from each end: kept, and a backtick off the fence
    if table:
        text = text.replace("|", "\\|")
    return f"{fence}{text}{fence}"


def html(text: object, *, lines: bool = False) -> str:
    """Text for HTML content or a quoted attribute value: controls and format characters escaped (line
    breaks kept when `lines`, for a `<pre>`), then `& < > " '` as character references."""
    return _html.escape(plain(text, lines=lines), quote=True)


def json_document(text: str) -> str:
    """A JSON document's text (`json.dumps(..., ensure_ascii=False)`) with every control and format
    character inside its strings as a `\\uXXXX` escape: the same data, but nothing in the file acts on the
    terminal or the editor that shows it. (Outside its strings a JSON text holds only ASCII, its line breaks
    and indents among it.)"""
    if text.isprintable():
        return text
    out = []
    for c in text:
        if c != "\n" and unicodedata.category(c) in HIDDEN:
            code = ord(c)
            if code > 0xFFFF:  # a surrogate pair, as JSON writes a character beyond the BMP
                code -= 0x10000
                out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
            else:
                out.append(f"\\u{code:04x}")
        else:
            out.append(c)
    return "".join(out)
