"""Where a student's chapter answer is in what they handed in: the layouts `course grade` and the
Gradescope bundle accept (one set of rules, here).

A class download holds one entry per student: a folder (`SUBMISSIONS/alice/`) or one zip
(`SUBMISSIONS/alice.zip`); Gradescope hands over one folder, /autograder/submission. Inside
it (for a zip: at its root, or inside the one folder that holds everything else, as zipping a
folder makes) the answer to a chapter is, by these rungs in order:

1. a file of the chapter's own name at the top: `ch25_paged_kv.py`, `ch25.ipynb` or
   `ch25_paged_kv.ipynb` (`grader.delivery.submission.answer_names`, the first present wins);
2. else such a file one folder down, in exactly one folder: `alice/ch25/ch25_paged_kv.py`, the
   layout of an LMS download or of a zipped project folder;
3. else one `.py` or `.ipynb` file at either depth whose name names the chapter without being
   its file name: the name starts with the chapter id (`ch25.py`, `CH25 (1).ipynb`, `ch25-v2.py`)
   or is the chapter's slug (`paged_kv.py`, `paged-kv (2).py`), and it is the only such file.
   It is graded as the chapter's module (`Found.renamed` says so, for the summary).

Why not other misnamed files: a name that mentions neither the chapter id nor its slug
(`solution.py`, `main.py`, `utils.py`) could answer any chapter, or be a helper of the
student's own. A file is graded for a chapter only when nothing else could be meant, so two
candidates on the same rung (two folders each holding `ch25_paged_kv.py`, or `ch25.py` and
`paged_kv.py`) are never guessed between: the student's row names both. When nothing matches,
the row says what was expected, where it was looked for and what is there, with a rename hint
for a file that names the chapter but is not a `.py` file or a notebook.

Names starting with a dot (`.ipynb_checkpoints/`, `.DS_Store`, macOS's `._` files), `__MACOSX/`
and `__pycache__/` are not searched. No link is followed: a folder that is a link is listed as
one and not entered, and a link under an answer's name is found, so that reading it says it
is a link (`grader.delivery.submission.read_file` never reads through one).

A zip is hostile input, and is never extracted. Before anything in it is used:

- the zip file is opened without following a link, must be a regular file and at most
  MAX_ZIP_BYTES;
- its end record is read first, so that Python's zipfile never parses a central directory of
  over MAX_ZIP_MEMBERS entries or MAX_ZIP_DIRECTORY_BYTES;
- every member must be a relative path (no leading `/`, no drive letter, no `..`), a file or a
  folder (a symbolic link or any other file type is refused), present once, and the sizes the
  members declare must add up to at most MAX_ZIP_UNPACKED;

then the one member wanted is decompressed straight into memory, at most the bound of its kind
(`MAX_MODULE_BYTES` for a module, `MAX_NOTEBOOK_BYTES` for a notebook), its checksum checked; an
encrypted member is refused. Each broken rule is a `SubmissionError` naming it.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import struct
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from grader.chapters import Chapter
from grader.delivery import escape
from grader.delivery.submission import (
    MAX_MODULE_BYTES,
    MAX_NOTEBOOK_BYTES,
    Answer,
    SubmissionError,
    answer_names,
    is_not,
    open_folder,
    read_answer,
    what_it_is,
)
from grader.i18n import tr, tr_in

MAX_ZIP_BYTES = 128 << 20
"""A student's zip file, as stored."""
MAX_ZIP_MEMBERS = 5000
"""Files and folders in a student's zip."""
MAX_ZIP_DIRECTORY_BYTES = 4 << 20
"""A zip's central directory (its list of members), checked before zipfile parses it."""
MAX_ZIP_UNPACKED = 512 << 20
"""The members' declared sizes together: a zip bomb is refused before anything is decompressed."""
MAX_LISTED = 20_000
"""Entries of a student's folder looked at (both depths together); more are not searched."""
NOT_SEARCHED = ("__macosx", "__pycache__")
"""Folder names (compared case-insensitively) never searched, besides names starting with a dot."""
OTHER_ARCHIVES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".7z", ".rar")
"""Archives that are not opened: a student's entry of one of these kinds gets a row saying to zip it."""
FILE, FOLDER, LINK = "a regular file", "a folder", "a symbolic link"
_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
_END = struct.Struct("<4s4H2LH")
"""A zip's end of central directory record: signature, disk numbers, entry counts, directory size and offset."""
_LOCATOR = struct.Struct("<4sLQL")
"""The zip64 end record's locator, just before the end record."""


@dataclass
class Tree:
    """What one student handed in, two levels deep: each path (names from the top) and what it is."""

    kinds: dict[tuple[str, ...], str] = field(default_factory=dict)
    """Path -> what it is, in `what_it_is` words ("a regular file", "a folder", "a symbolic link"...)."""
    not_searched: list[str] = field(default_factory=list)
    """Top-level names passed over (dot names, `__MACOSX/`), for messages."""
    members: dict[tuple[str, ...], str] = field(default_factory=dict)
    """For a zip: each file's member name."""
    top: str | None = None
    """For a zip: the one folder everything is in, which paths start below."""
    cut: bool = False
    """The listing stopped at MAX_LISTED entries."""

    def name_of(self, path: tuple[str, ...]) -> str:
        """The name to read `path` by: its member name in a zip, else the path joined with `/`."""
        return self.members.get(path, "/".join(path))


@dataclass(frozen=True)
class Found:
    """Where a chapter's answer is in a student's tree."""

    path: tuple[str, ...]
    renamed: bool = False
    """True when its name is not one of the chapter's own (rung 3)."""


def skipped(name: str) -> bool:
    """A name that is never searched: a dot name, `__MACOSX`, `__pycache__`."""
    return name.startswith(".") or name.casefold() in NOT_SEARCHED


def names_chapter(name: str, ch: Chapter) -> bool:
    """Whether a file name, its suffix aside, names the chapter: it starts with the chapter id
    (`ch25`, `CH25 (1)`, `ch25-v2`; `ch250` does not) or is the chapter's slug (`paged_kv`,
    `paged-kv (2)`), case, spaces and dashes aside."""
    stem = name.split(".", 1)[0] if not name.startswith(".") else name
    words = re.sub(r"[^0-9a-z]+", "_", stem.casefold()).strip("_")
    slug = ch.filename[len(ch.id) + 1 : -3]
    return bool(re.match(rf"{ch.id}(?![0-9])", words)) or words == slug or words.startswith(slug + "_")


# -- listing a folder --------------------------------------------------------------------------------------
def folder_tree(folder_fd: int) -> Tree:
    """A student's folder (an open descriptor) two levels deep, nothing followed: subfolders are
    opened with `open_folder`, which refuses a link."""
    tree = Tree()

    def kind_of(entry: os.DirEntry) -> str:
        try:
            if entry.is_symlink():
                return LINK
            if entry.is_dir(follow_symlinks=False):
                return FOLDER
            if entry.is_file(follow_symlinks=False):
                return FILE
            return what_it_is(entry.stat(follow_symlinks=False).st_mode)
        except OSError:
            return "not readable"

    def scan(fd: int, prefix: tuple[str, ...]) -> list[str]:
        folders = []
        with os.scandir(fd) as listing:
            for entry in listing:
                if len(tree.kinds) >= MAX_LISTED:
                    tree.cut = True
                    break
                kind = kind_of(entry)
                if skipped(entry.name):
                    if not prefix:
                        tree.not_searched.append(entry.name + ("/" if kind == FOLDER else ""))
                    continue
                tree.kinds[prefix + (entry.name,)] = kind
                if kind == FOLDER:
                    folders.append(entry.name)
        return folders

    for name in sorted(scan(folder_fd, ())):
        try:
            sub = open_folder(name, dir_fd=folder_fd)
        except SubmissionError:  # replaced since it was listed: not entered
            continue
        try:
            scan(sub, (name,))
        finally:
            os.close(sub)
    tree.not_searched.sort()
    return tree


# -- a zip ---------------------------------------------------------------------------------------------------
def open_zip(dir_fd: int, name: str) -> zipfile.ZipFile:
    """The zip `name` in the folder `dir_fd`, opened without following a link and checked against
    every bound of the module docstring; SubmissionError naming the rule it breaks. Close it."""
    try:
        fd = os.open(name, _FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise SubmissionError(tr("{name} is a symbolic link: links are never followed; submit the zip itself", name=name)) from None
        raise SubmissionError(tr("cannot read {name} ({error})", name=name, error=e.strerror)) from None
    f = os.fdopen(fd, "rb")
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SubmissionError(is_not(name, what_it_is(info.st_mode), "zip"))
        if info.st_size > MAX_ZIP_BYTES:
            fields = {"name": name, "size": _size(info.st_size), "limit": _size(MAX_ZIP_BYTES)}
            raise SubmissionError(tr("{name} is {size}, over the {limit} a student's zip may have", **fields))
        _check_directory(f, info.st_size, name)
        try:
            archive = _OwnZip(f)
        except Exception as e:  # BadZipFile, and whatever else a crafted directory makes zipfile raise
            error = f"{type(e).__name__}: {str(e)[:200]}"
            raise SubmissionError(tr("{name} is not a zip file that can be read ({error})", name=name, error=error)) from None
        try:
            _check_members(archive, name)
        except BaseException:
            archive.close()
            raise
        return archive
    except BaseException:
        f.close()
        raise


class _OwnZip(zipfile.ZipFile):
    """A ZipFile on a file object that closing it closes too (zipfile leaves a file object it was given open)."""

    def __init__(self, f: BinaryIO) -> None:
        self._file = f  # first: a ZipFile that fails to open is closed when collected
        super().__init__(f)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._file.close()


def _check_directory(f, size: int, name: str) -> None:
    """Refuse a zip whose end record announces more members or a larger directory than allowed."""
    tail_size = min(size, _END.size + 0xFFFF)  # the record, and a comment of at most 64 KiB after it
    f.seek(size - tail_size)
    tail = f.read(tail_size)
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) - at < _END.size:
        raise SubmissionError(tr("{name} is not a zip file (it has no end of central directory record)", name=name))
    _, _, _, _, entries, directory, offset, _ = _END.unpack_from(tail, at)
    if entries == 0xFFFF or directory == 0xFFFFFFFF or offset == 0xFFFFFFFF:  # zip64: the real numbers are elsewhere
        record = b""
        if at >= _LOCATOR.size and tail[at - _LOCATOR.size : at - _LOCATOR.size + 4] == b"PK\x06\x07":
            _, _, where, _ = _LOCATOR.unpack_from(tail, at - _LOCATOR.size)
            if where + 56 <= size:
                f.seek(where)
                record = f.read(56)
        if len(record) < 56 or record[:4] != b"PK\x06\x06":
            raise SubmissionError(tr("{name} is a zip64 file whose directory cannot be found: zip it again", name=name))
        entries, directory = struct.unpack_from("<QQ", record, 32)
    if entries > MAX_ZIP_MEMBERS:
        raise SubmissionError(_too_many(name, entries))
    if directory > MAX_ZIP_DIRECTORY_BYTES:
        fields = {"name": name, "size": _size(directory), "limit": _size(MAX_ZIP_DIRECTORY_BYTES)}
        raise SubmissionError(tr("{name} has a list of files of {size}, over the {limit} a student's zip may have", **fields))


def _too_many(name: str, entries: int) -> str:
    return tr("{name} holds {n} files and folders, over the {most} a student's zip may have", name=name, n=entries, most=MAX_ZIP_MEMBERS)


def member_path(member: str, name: str = "the zip") -> tuple[str, ...]:
    """A member's path as names from the zip's root (`\\` taken as `/`, as Windows tools write it);
    SubmissionError for a path that is absolute or leaves the zip (`name`: the zip, as the message names it)."""
    path = member.replace("\\", "/")
    fields = {"name": name, "member": repr(member)}
    if "\0" in path:
        raise SubmissionError(tr("{name} holds {member}, a name with a NUL byte; zip the files themselves", **fields))
    if path.startswith("/") or re.match(r"[A-Za-z]:", path):
        raise SubmissionError(
            tr("{name} holds {member}, an absolute path: a zip's files must be relative to its root; zip the files themselves", **fields)
        )
    parts = tuple(p for p in path.split("/") if p not in ("", "."))
    if ".." in parts:
        raise SubmissionError(tr("{name} holds {member}, a path that leaves the zip (..); zip the files themselves", **fields))
    return parts


def _check_members(archive: zipfile.ZipFile, name: str) -> None:
    members = archive.infolist()
    if len(members) > MAX_ZIP_MEMBERS:
        raise SubmissionError(_too_many(name, len(members)))
    unpacked = sum(m.file_size for m in members)
    if unpacked > MAX_ZIP_UNPACKED:
        fields = {"name": name, "size": _size(unpacked), "limit": _size(MAX_ZIP_UNPACKED)}
        raise SubmissionError(tr("{name} would unpack to {size}, over the {limit} a student's zip may hold", **fields))
    seen = set()
    for m in members:
        path = member_path(m.filename, name)
        kind = stat.S_IFMT(m.external_attr >> 16)
        fields = {"name": name, "member": repr(m.filename)}
        if kind and kind not in (stat.S_IFREG, stat.S_IFDIR):
            if kind == stat.S_IFLNK:
                raise SubmissionError(
                    tr(
                        "{name} holds {member}, a symbolic link: a zip may hold files and folders only (links are never followed); "
                        "zip the files themselves",
                        **fields,
                    )
                )
            raise SubmissionError(
                tr(
                    "{name} holds {member}, which is neither a file nor a folder: a zip may hold files and folders only "
                    "(links are never followed); zip the files themselves",
                    **fields,
                )
            )
        if path in seen and not m.is_dir():
            raise SubmissionError(tr("{name} holds {member} twice: zip it again", **fields))
        seen.add(path)


def zip_tree(archive: zipfile.ZipFile) -> Tree:
    """A checked zip (`open_zip`) as a Tree: from its root, or from inside the one folder that
    holds everything not passed over."""
    tree = Tree()
    kept: list[tuple[tuple[str, ...], bool, str]] = []
    for m in archive.infolist():
        path = member_path(m.filename)
        if not path:
            continue
        if any(skipped(p) for p in path):
            top = path[0] + ("/" if len(path) > 1 or m.is_dir() else "")
            if skipped(path[0]) and top not in tree.not_searched:
                tree.not_searched.append(top)
            continue
        kept.append((path, m.is_dir(), m.filename))
    tops = {path[0] for path, _, _ in kept}
    if len(tops) == 1 and all(len(path) > 1 or is_dir for path, is_dir, _ in kept):
        tree.top = tops.pop()
        kept = [(path[1:], is_dir, member) for path, is_dir, member in kept if len(path) > 1]
    for path, is_dir, member in kept:
        for depth in range(1, len(path)):  # the folders it is in, whether or not the zip lists them
            tree.kinds.setdefault(path[:depth], FOLDER)
        if is_dir:
            tree.kinds[path] = FOLDER
        else:
            tree.kinds[path] = FILE
            tree.members[path] = member
    tree.kinds = {p: k for p, k in tree.kinds.items() if len(p) <= 2}
    tree.not_searched.sort()
    return tree


def read_member(archive: zipfile.ZipFile, member: str, limit: int, name: str) -> bytes:
    """The bytes of one member of a checked zip, decompressed into memory, at most `limit` long;
    SubmissionError when it is encrypted, too large or damaged."""
    where = f"{name}: {member}"
    try:
        info = archive.getinfo(member)
    except KeyError:
        if any(m.startswith(member + "/") for m in archive.namelist()):
            raise SubmissionError(tr("{name} is a folder, not a file: submit the file itself", name=where)) from None
        raise SubmissionError(tr("{name} no longer holds {member}", name=name, member=repr(member))) from None
    if info.flag_bits & 0x1:
        raise SubmissionError(tr("{name} is encrypted: zip it without a password", name=where))
    notebook = member.endswith(".ipynb")
    fields = {"name": where, "size": _size(info.file_size), "limit": _size(limit)}
    if info.file_size > limit:
        if notebook:
            raise SubmissionError(tr("{name} is {size}, over the {limit} a notebook may have", **fields))
        raise SubmissionError(tr("{name} is {size}, over the {limit} a chapter file may have", **fields))
    try:
        with archive.open(info) as f:
            data = f.read(limit + 1)
    except Exception as e:  # a bad checksum, a damaged stream, a compression zipfile does not know
        error = f"{type(e).__name__}: {str(e)[:200]}"
        raise SubmissionError(tr("{name} cannot be read from the zip ({error}): zip it again", name=where, error=error)) from None
    if len(data) > limit:
        if notebook:
            raise SubmissionError(tr("{name} is over the {limit} a notebook may have", **fields))
        raise SubmissionError(tr("{name} is over the {limit} a chapter file may have", **fields))
    return data


# -- choosing the answer ----------------------------------------------------------------------------------
def locate(tree: Tree, ch: Chapter, where: str) -> Found:
    """The chapter's answer in a student's tree, by the rungs of the module docstring;
    SubmissionError saying what was expected and what `where` (the student's folder or zip, as
    shown to the instructor) holds, or which files are in doubt."""
    names = answer_names(ch)
    for name in names:
        if (name,) in tree.kinds:
            return Found((name,))
    down = []
    for (folder,) in sorted(p for p, k in tree.kinds.items() if len(p) == 1 and k == FOLDER):
        inside = next((n for n in names if (folder, n) in tree.kinds), None)
        if inside:
            down.append((folder, inside))
    if len(down) == 1:
        return Found(down[0])
    if len(down) > 1:
        raise SubmissionError(
            tr("{files} in {where} could each be the {chapter} answer: keep one of them", files=_doubt(down), where=where, chapter=ch.id)
        )
    candidates = sorted(p for p, k in tree.kinds.items() if k != FOLDER and p[-1].endswith((".py", ".ipynb")) and names_chapter(p[-1], ch))
    if len(candidates) == 1:
        return Found(candidates[0], renamed=True)
    if len(candidates) > 1:
        fields = {"files": _doubt(candidates), "where": where, "chapter": ch.id, "filename": ch.filename}
        raise SubmissionError(tr("{files} in {where} could each be the {chapter} answer: keep one of them, named {filename}", **fields))
    fields = {"file": names[0], "notebook": names[1], "where": where, "found": found_list(tree, ch), "filename": ch.filename}
    raise SubmissionError(
        tr(
            "no {file} or {notebook} in {where}, nor one folder down; {found}: name your file {filename} (or your notebook {notebook})",
            **fields,
        )
    )


def _doubt(paths: Sequence[tuple[str, ...]]) -> str:
    shown = ["/".join(shown_name(p) for p in path) for path in paths[:5]]
    both = tr("{first} and {last}", first=tr_in("list", ", ").join(shown[:-1]), last=shown[-1])
    return tr("{files} (and {n} more)", files=both, n=len(paths) - 5) if len(paths) > 5 else both


def found_list(tree: Tree, ch: Chapter, *, most: int = 12) -> str:
    """What the top of a tree holds, for a message: `found: notes.txt, work/ (main.py), ...`, with
    a rename hint for a file that names the chapter, and what was not searched."""
    shown = []
    top = sorted(p for p in tree.kinds if len(p) == 1)
    for (name,) in top[:most]:
        kind = tree.kinds[(name,)]
        text = shown_name(name)
        comma = tr_in("list", ", ")
        if kind == FOLDER:
            inside = sorted(p[1] for p in tree.kinds if len(p) == 2 and p[0] == name)
            listed = [shown_name(n) + ("/" if tree.kinds[(name, n)] == FOLDER else "") for n in inside[:4]]
            listed += [tr("{n} more", n=len(inside) - 4)] if len(inside) > 4 else []
            text = tr("{folder}/ ({files})", folder=text, files=comma.join(listed)) if listed else tr("{folder}/ (empty)", folder=text)
        elif kind == LINK:
            text = tr("{name} (a symbolic link, not followed)", name=text)
        elif kind != FILE:
            text = tr("{name} (neither a file nor a folder)", name=text)
        elif names_chapter(name, ch):
            text = tr("{name} (rename it {filename})", name=text, filename=ch.filename)
        elif name.lower().endswith(".zip"):
            text = tr("{name} (a zip inside a student's folder is not opened: unzip it)", name=text)
        shown.append(text)
    comma = tr_in("list", ", ")
    if len(top) > most:
        shown.append(tr("and {n} more", n=len(top) - most))
    elif tree.cut:
        shown.append(tr("and more"))
    found = tr("found: {files}", files=comma.join(shown)) if shown else tr("found: nothing")
    if tree.not_searched:
        skipped = comma.join(shown_name(n) for n in tree.not_searched[:6])
        found = tr("{found}; not searched: {names}", found=found, names=skipped)
    return found


def shown_name(name: str) -> str:
    """A file name as printable text: bytes that are not UTF-8 as \\xNN, control and format characters
    escaped (`grader.delivery.escape.visible`)."""
    try:
        text = name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        text = name.encode("utf-8", "backslashreplace").decode("utf-8")
    return escape.visible(text)


# -- reading the answer that was found ------------------------------------------------------------------------
def read_found(dir_fd: int, entry: str, name: str, ch: Chapter, *, archive: bool) -> Answer:
    """Read a located answer (`grader.delivery.submission.read_answer`'s checks): `name` in the student's
    folder `entry` of the folder `dir_fd`, each folder on the way opened without following a link;
    or, with `archive`, the member `name` of the zip `entry`, read from it bounded into a private
    temporary folder. A SubmissionError's message names the file where it really is."""
    if archive:
        zipped = open_zip(dir_fd, entry)
        try:
            notebook = name.endswith(".ipynb")
            data = read_member(zipped, name, MAX_NOTEBOOK_BYTES if notebook else MAX_MODULE_BYTES, entry)
        finally:
            zipped.close()
        as_name = f"{ch.id}.ipynb" if notebook else ch.filename
        with tempfile.TemporaryDirectory(prefix="zip-answer-") as private:
            (Path(private) / as_name).write_bytes(data)
            try:
                return read_answer(private, as_name, ch)
            except SubmissionError as e:
                raise SubmissionError(_relabel(str(e), as_name, f"{entry}: {name}")) from None
    folder_fd = open_folder(entry, dir_fd=dir_fd)
    try:
        return read_in(folder_fd, name, ch)
    finally:
        os.close(folder_fd)


def read_in(folder_fd: int, name: str, ch: Chapter) -> Answer:
    """Read the located answer `name` (`folder/file` or `file`) of the student's open folder `folder_fd`,
    each folder on the way opened without following a link; a SubmissionError names the file by its path."""
    *folders, base = name.split("/")
    fds: list[int] = []
    try:
        for folder in folders:
            fds.append(open_folder(folder, dir_fd=fds[-1] if fds else folder_fd))
        try:
            return read_answer(fds[-1] if fds else folder_fd, base, ch)
        except SubmissionError as e:
            raise SubmissionError(_relabel(str(e), base, name)) from None
    finally:
        for fd in fds:
            os.close(fd)


def _relabel(message: str, said: str, really: str) -> str:
    """A reading error about `said` made to name the file by where it really is."""
    if said == really:
        return message
    if message.startswith(said):
        return really + message[len(said) :]
    return f"{message} ({really})"


def _size(n: int) -> str:
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"
