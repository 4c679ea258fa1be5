"""Reading a student's chapter answer, safely: the trusted side of every channel.

`course grade`, `course check --notebook` and the Gradescope runner all read files a student
made (or a zip or tar they uploaded made) in the trusted process, which can read the reference
solutions and the hidden checks. So a file is read only as itself:

- without following a link: the folder is opened, then the file relative to it with
  `O_NOFOLLOW | O_NONBLOCK`, and `fstat` must say it is a regular file. A symbolic link (to
  solutions/, to another student's file, to /proc/self/...), a FIFO, a device, a socket or a
  folder under a chapter's file name is a `SubmissionError` naming what it is, never read;
- within a size bound: a chapter module (`.py`) at most `MAX_MODULE_BYTES`; a notebook at
  most `MAX_NOTEBOOK_BYTES` as a file (outputs included), and the sources of its code cells,
  which are what is graded, at most `MAX_MODULE_BYTES` together;
- decoded as Python decodes source: UTF-8 unless a coding declaration says otherwise, a
  UTF-8 byte-order mark accepted (a notebook is UTF-8 JSON, a byte-order mark accepted too);
- a notebook's JSON parsed with every failure (not JSON, nested too deeply, out of memory,
  any shape but nbformat's) turned into one clear error naming the convention broken;
- a `.py` module compiled once here, so that a module Python cannot compile (a SyntaxError, a
  NUL byte, an expression nested too deeply: RecursionError or MemoryError) is one clear error too;
- a notebook's code cells made into the chapter module (`grader.delivery.cells.assemble`), each cell
  compiled here on its own: one that does not parse (or holds a NUL byte) costs only the tasks it
  answers (their checks say "answer cell ch25.2 does not parse … (answer cell ch25.2, line 42)"), never
  the notebook; one that exhausts Python's compiler (nested too deeply) is refused, as such a `.py`.

Every failure is a `SubmissionError` (a ValueError) whose message is meant for the student.
"""

from __future__ import annotations

import io
import json
import math
import os
import stat
import tokenize
from dataclasses import dataclass
from pathlib import Path

from grader.chapters import Chapter
from grader.i18n import mark, tr, tr_in

MAX_MODULE_BYTES = 1 << 20
"""A chapter module, or all the code cells of a notebook together."""
MAX_NOTEBOOK_BYTES = 64 << 20
"""A notebook file, outputs (figures, printed text) included: larger is refused unread."""
NOTEBOOK_SHAPE = mark(
    'a notebook is a JSON object whose "cells" is a list of cells, each with a "source" string or list of strings (nbformat)'
)
"""What a notebook must be, said after each way one is broken (marked: `tr` it where said)."""
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)


class SubmissionError(ValueError):
    """A submission that cannot be graded as it is; the message says why and names the file."""


@dataclass(frozen=True)
class Answer:
    """A student's answer to one chapter, read and checked: what to grade."""

    name: str
    """The file it came from (a name in the student's folder)."""
    source: bytes
    """The chapter module to grade: a `.py` file's own bytes, or the module a notebook's cells amount to (UTF-8)."""
    text: str
    """`source` decoded."""


def answer_names(ch: Chapter) -> tuple[str, ...]:
    """The file names that answer a chapter in a student's folder, in the order they are looked for."""
    return ch.filename, f"{ch.id}.ipynb", f"{ch.filename[:-3]}.ipynb"


def what_it_is(mode: int) -> str:
    """A file type in words ("a symbolic link", "a FIFO (named pipe)", ...) from an `st_mode`."""
    for test, words in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return words
    return "not a regular file"


NOT_A = {
    "folder": {
        "a regular file": mark("{name} is a regular file, not a folder"),
        "a symbolic link": mark("{name} is a symbolic link, not a folder: links are never followed"),
        "a FIFO (named pipe)": mark("{name} is a FIFO (named pipe), not a folder"),
        "a character device": mark("{name} is a character device, not a folder"),
        "a block device": mark("{name} is a block device, not a folder"),
        "a socket": mark("{name} is a socket, not a folder"),
        "": mark("{name} is not a folder"),
    },
    "file": {
        "a folder": mark("{name} is a folder, not a regular file: submit the file itself"),
        "a FIFO (named pipe)": mark("{name} is a FIFO (named pipe), not a regular file: submit the file itself"),
        "a character device": mark("{name} is a character device, not a regular file: submit the file itself"),
        "a block device": mark("{name} is a block device, not a regular file: submit the file itself"),
        "a socket": mark("{name} is a socket, not a regular file: submit the file itself"),
        "": mark("{name} is not a regular file: submit the file itself"),
    },
    "zip": {
        "a folder": mark("{name} is a folder, not a zip file"),
        "a FIFO (named pipe)": mark("{name} is a FIFO (named pipe), not a zip file"),
        "a character device": mark("{name} is a character device, not a zip file"),
        "a block device": mark("{name} is a block device, not a zip file"),
        "a socket": mark("{name} is a socket, not a zip file"),
        "": mark("{name} is not a regular file, so not a zip file"),
    },
}
"""What the student reads when `name` is of `what_it_is` kind (the key) where a "folder", a regular "file" or a
"zip" was wanted: one whole sentence each, so that each language words it its own way (marked: see `is_not`)."""


def is_not(name: str, kind: str, wanted: str) -> str:
    """The sentence saying that `name`, of `what_it_is` kind `kind`, is not the `wanted` ("folder", "file" or
    "zip"), in the run's language."""
    sentences = NOT_A[wanted]
    return tr(sentences.get(kind, sentences[""]), name=name)


def open_folder(name: str | os.PathLike, *, dir_fd: int | None = None, follow: bool = False) -> int:
    """A file descriptor of the folder `name` (relative to `dir_fd` when given), opened without
    following a link unless `follow`; SubmissionError when it is not a folder (a link, a file...)."""
    flags = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0) | (0 if follow else os.O_NOFOLLOW)
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except OSError as e:
        try:
            kind = what_it_is(os.stat(name, dir_fd=dir_fd, follow_symlinks=follow).st_mode)
        except OSError:
            kind = ""
        if kind and kind != "a folder":
            raise SubmissionError(is_not(os.fsdecode(name), kind, "folder")) from None
        raise SubmissionError(tr("cannot open the folder {name} ({error})", name=os.fsdecode(name), error=e.strerror)) from None


def read_file(folder: int | str | os.PathLike, name: str, limit: int) -> bytes:
    """The bytes of the regular file `name` in `folder` (an open folder descriptor, or a path
    that is followed), read without following a link and at most `limit` bytes long."""
    own = not isinstance(folder, int)
    dir_fd = folder if isinstance(folder, int) else os.open(folder, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    try:
        try:
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError as e:
            raise SubmissionError(tr("cannot read {name} ({error})", name=name, error=e.strerror)) from None
        if not stat.S_ISREG(info.st_mode):
            raise SubmissionError(_not_a_file(name, info.st_mode, dir_fd))
        _bound(name, info.st_size, limit)
        try:
            fd = os.open(name, _OPEN_FLAGS, dir_fd=dir_fd)
        except OSError as e:  # replaced since (by a link: ELOOP), or unreadable
            raise SubmissionError(tr("cannot read {name} ({error}): links are never followed", name=name, error=e.strerror)) from None
        with os.fdopen(fd, "rb", buffering=0) as f:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise SubmissionError(_not_a_file(name, info.st_mode, dir_fd))
            _bound(name, info.st_size, limit)
            chunks, size = [], 0
            while size <= limit:
                chunk = f.read(min(1 << 20, limit + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            _bound(name, size, limit)
            return b"".join(chunks)
    finally:
        if own:
            os.close(dir_fd)


def _not_a_file(name: str, mode: int, dir_fd: int) -> str:
    kind = what_it_is(mode)
    if stat.S_ISLNK(mode):
        try:
            target = os.readlink(name, dir_fd=dir_fd)
        except OSError:
            target = "?"
        return tr(
            "{name} is a symbolic link (to {target}), not a file: links are never followed; submit the file itself",
            name=name,
            target=repr(target[:200]),
        )
    return is_not(name, kind, "file")


def _bound(name: str, size: int, limit: int) -> None:
    if size > limit:
        fields = {"name": name, "size": _size(size), "limit": _size(limit)}
        if name.endswith(".ipynb"):
            raise SubmissionError(tr("{name} is {size}, over the {limit} a notebook may have", **fields))
        raise SubmissionError(tr("{name} is {size}, over the {limit} a chapter file may have", **fields))


def _size(n: int) -> str:
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def decode_module(data: bytes, name: str) -> str:
    """A `.py` file's text as Python reads it: UTF-8 (a byte-order mark accepted) unless a coding
    declaration on its first two lines names another encoding."""
    problem = None
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as e:  # an unknown or contradictory declaration, or its lines not UTF-8
        encoding, problem = "utf-8-sig", str(e).replace("'<string>'", "it")
    try:
        text = data.decode(encoding)
    except (UnicodeDecodeError, LookupError) as e:
        what = "UTF-8" if encoding.startswith("utf-8") else encoding
        if isinstance(e, UnicodeDecodeError):
            raise SubmissionError(
                tr("{name} is not {encoding} text (byte {byte}): save it as UTF-8", name=name, encoding=what, byte=e.start)
            ) from None
        raise SubmissionError(tr("{name} is not {encoding} text: save it as UTF-8", name=name, encoding=what)) from None
    if problem:
        raise SubmissionError(tr("{name} cannot be read as Python source: {problem}", name=name, problem=problem))
    return text


def notebook_cells(data: bytes, name: str, *, limit: int = MAX_MODULE_BYTES) -> list[str]:
    """The sources of a notebook's code cells, in order; SubmissionError for anything that is not
    nbformat's shape (say which part), and when the code cells together exceed `limit` bytes."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise SubmissionError(tr("{name} is not a notebook: not UTF-8 text (byte {byte})", name=name, byte=e.start)) from None
    try:
        nb = json.loads(text)
    except RecursionError:
        raise SubmissionError(
            tr(
                "{name} is not a notebook: its JSON is nested too deeply to read (RecursionError); {shape}",
                name=name,
                shape=tr(NOTEBOOK_SHAPE),
            )
        ) from None
    except MemoryError:
        raise SubmissionError(tr("{name} is not a notebook: its JSON does not fit in memory (MemoryError)", name=name)) from None
    except ValueError as e:
        raise SubmissionError(tr("{name} is not a notebook: not JSON ({error})", name=name, error=str(e)[:200])) from None

    def broken(sentence: str, **fields: object) -> SubmissionError:
        """`sentence` (marked, with {name} and {shape}) filled: a notebook of the wrong shape."""
        return SubmissionError(tr(sentence, name=name, shape=tr(NOTEBOOK_SHAPE), **fields))

    if not isinstance(nb, dict):
        raise broken(mark("{name} is not a notebook: it is {kind}, not a JSON object; {shape}"), kind=_json_kind(nb))
    if "cells" not in nb:
        raise broken(mark('{name} is not a notebook: it has no "cells"; {shape}'))
    if not isinstance(nb["cells"], list):
        raise broken(mark('{name} is not a notebook: its "cells" is {kind}; {shape}'), kind=_json_kind(nb["cells"]))
    sources, total = [], 0
    for i, cell in enumerate(nb["cells"], 1):
        if not isinstance(cell, dict):
            raise broken(mark("{name} is not a notebook: cell {i} is {kind}, not a JSON object; {shape}"), i=i, kind=_json_kind(cell))
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source")
        if isinstance(source, list) and all(isinstance(s, str) for s in source):
            source = "".join(source)
        elif not isinstance(source, str):
            if "source" not in cell:
                raise broken(mark('{name} is not a notebook: the "source" of code cell {i} is missing; {shape}'), i=i)
            if isinstance(source, list):
                kind = _json_kind(next(s for s in source if not isinstance(s, str)))
                raise broken(
                    mark('{name} is not a notebook: the "source" of code cell {i} is a list holding {kind}; {shape}'), i=i, kind=kind
                )
            raise broken(mark('{name} is not a notebook: the "source" of code cell {i} is {kind}; {shape}'), i=i, kind=_json_kind(source))
        try:
            total += len(source.encode("utf-8"))
        except UnicodeEncodeError as e:
            raise SubmissionError(
                tr("{name}: code cell {i} holds {char}, a lone UTF-16 surrogate, not text", name=name, i=i, char=repr(source[e.start]))
            ) from None
        if total > limit:
            raise SubmissionError(
                tr("{name}: its code cells hold over {limit} of code, more than a chapter file may have", name=name, limit=_size(limit))
            )
        sources.append(source)
    return sources


def _json_kind(value: object) -> str:
    """A JSON value's kind as a notebook's errors name it, a noun in the run's language ("a number")."""
    if value is None:
        return tr_in("json", "null")
    if isinstance(value, bool):
        return tr_in("json", "true (a boolean)") if value else tr_in("json", "false (a boolean)")
    if isinstance(value, (int, float)):
        return tr_in("json", "NaN (a number)") if isinstance(value, float) and math.isnan(value) else tr_in("json", "a number")
    if isinstance(value, str):
        return tr_in("json", "a string")
    if isinstance(value, list):
        return tr_in("json", "a list")
    if isinstance(value, dict):
        return tr_in("json", "an object")
    return type(value).__name__


def compile_module(text: str, name: str, filename: str, *, assembled: bool = False) -> None:
    """Compile a chapter module once, here; SubmissionError for any reason Python cannot (a
    SyntaxError, a NUL byte, an expression nested too deeply for its compiler). `assembled`: the module
    was made of a notebook's code cells (so a SyntaxError in it is the grader's)."""
    try:
        compile(text, filename, "exec", dont_inherit=True)
    except SyntaxError as e:
        if "null bytes" in str(e.msg):
            raise SubmissionError(tr("{name} contains a NUL byte, which Python source cannot hold", name=name)) from None
        fields = {"name": name, "line": e.lineno, "error": e.msg}
        if assembled:
            raise SubmissionError(
                tr(
                    "{name} does not parse: SyntaxError at line {line} of the module your code cells amount to "
                    "(a grader error: show it to your instructor): {error}",
                    **fields,
                )
            ) from None
        raise SubmissionError(tr("{name} does not parse: SyntaxError at line {line}: {error}", **fields)) from None
    except ValueError as e:  # a NUL byte, on Pythons before 3.11.4
        raise SubmissionError(tr("{name} cannot be compiled: {error}", name=name, error=e)) from None
    except RecursionError:
        raise SubmissionError(
            tr("{name} cannot be compiled: an expression is nested too deeply for Python's compiler (RecursionError)", name=name)
        ) from None
    except MemoryError:
        raise SubmissionError(
            tr(
                "{name} cannot be compiled: Python's parser ran out of memory on it (MemoryError: an expression nested too deeply?)",
                name=name,
            )
        ) from None


def module_of_notebook(ch: Chapter, cells: list[str], name: str) -> str:
    """The chapter module a notebook's code cells amount to (`grader.delivery.cells.assemble`: each cell
    compiled on its own, one that does not parse graded as such, in its own tasks only); a cell that
    exhausts Python's compiler (nested too deeply) is refused as such a `.py` module is, and a failure
    of the assembling itself is a SubmissionError too."""
    from grader.delivery.cells import CompilerLimit, assemble

    try:
        return assemble(ch, cells, strict=True)
    except CompilerLimit as e:
        raise SubmissionError(tr("{name} cannot be compiled: {error}", name=name, error=e)) from None
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        error = f"{type(e).__name__}: {str(e)[:200]}"
        raise SubmissionError(
            tr("{name}: its code cells cannot be made into the chapter module ({error})", name=name, error=error)
        ) from None


def read_answer(folder: int | str | os.PathLike, name: str, ch: Chapter) -> Answer:
    """Read, bound, decode and compile one chapter answer (`name`: a `.py` module or an `.ipynb`
    notebook in `folder`, an open folder descriptor or a path); SubmissionError says what is wrong.
    A notebook is refused only when it cannot be read as one: a code cell that does not compile is
    graded as such, in the tasks it answers (`module_of_notebook`)."""
    if name.endswith(".ipynb"):
        cells = notebook_cells(read_file(folder, name, MAX_NOTEBOOK_BYTES), name)
        text = module_of_notebook(ch, cells, name)
        try:
            source = text.encode("utf-8")
        except UnicodeEncodeError:  # cannot happen: notebook_cells refused lone surrogates
            raise SubmissionError(tr("{name}: its code cells are not text", name=name)) from None
    else:
        source = read_file(folder, name, MAX_MODULE_BYTES)
        text = decode_module(source, name)
    compile_module(text, name, ch.filename, assembled=name.endswith(".ipynb"))
    return Answer(name, source, text)


def read_notebook(path: str | os.PathLike) -> list[str]:
    """The code cells of the notebook at `path` (its folder is followed, the file itself never)."""
    path = Path(path)
    return notebook_cells(read_file(path.parent, path.name, MAX_NOTEBOOK_BYTES), path.name)


def read_module(path: str | os.PathLike) -> Answer:
    """A chapter module at `path` (`course check --submission`): its folder is followed, the file
    itself never; the file name says which chapter."""
    from grader import chapters

    path = Path(path)
    ch = next((c for c in chapters.all_chapters() if c.filename == path.name), None)
    if ch is None:
        raise SubmissionError(tr("{name} is not the file name of a chapter module", name=path.name))
    return read_answer(path.parent, path.name, ch)
