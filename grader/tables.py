"""Columns of text aligned on a terminal and fitted to its width (`course list`, `course list chNN`).

Cells are measured in terminal columns (a CJK character takes two, `grader.terminal.columns`). When
the rows are wider than the terminal, one column, the one holding prose (a chapter's title, a task's
signature), wraps within its own width, and the others keep theirs; a bilingual title breaks at its
" · " first (its Chinese half above its English half), then at spaces. Output that is not a terminal
(width 0) is printed as wide as it is, one line per row, as `grader.terminal.terminal_width` says why.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from grader.terminal import columns, terminal_width, wrap

GAP = "  "
"""Between two columns."""
MIN_FLEX = 16
"""The wrapping column never gets narrower than this: below it, a line overflows instead."""


def fit(text: str, width: int) -> list[str]:
    """`text` as lines of at most `width` columns: whole " · "-separated parts where they fit (a line
    that continues ends in " ·"), a part too long by itself broken at spaces."""
    if columns(text) <= width:
        return [text]
    lines: list[str] = []
    line = ""
    for part in text.split(" · "):
        joined = f"{line} · {part}" if line else part
        if columns(joined) <= width:
            line = joined
            continue
        if line:
            lines.append(line + " ·")
        pieces = wrap(part, width) if columns(part) > width else [part]
        lines += pieces[:-1]
        line = pieces[-1]
    return lines + [line]


def table(rows: Sequence[Sequence[str]], *, right: Collection[int] = (), flex: int | None = None, width: int | None = None) -> list[str]:
    """`rows` (the first a header) as aligned lines, fitted to `width` columns (default: the terminal's;
    0: unfitted) by wrapping column `flex`; the columns in `right` are aligned to the right."""
    width = terminal_width() if width is None else width
    n = len(rows[0])
    widths = [max(columns(r[i]) for r in rows) for i in range(n)]
    if width and flex is not None and sum(widths) + len(GAP) * (n - 1) > width:
        room = width - (sum(widths) - widths[flex]) - len(GAP) * (n - 1)
        widths[flex] = max(room, min(widths[flex], MIN_FLEX))
    lines = []
    for row in rows:
        cells = [fit(c, widths[i]) if i == flex else [c] for i, c in enumerate(row)]
        for k in range(max(len(c) for c in cells)):
            parts = []
            for i, cell in enumerate(cells):
                text = cell[k] if k < len(cell) else ""
                pad = " " * max(0, widths[i] - columns(text))
                parts.append(pad + text if i in right else text + pad)
            lines.append(GAP.join(parts).rstrip())
    return lines
