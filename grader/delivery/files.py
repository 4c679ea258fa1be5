"""Writing where the grader chose, and nowhere else: folders opened without following links, files written to a
temporary name and renamed into place, stale files unlinked through the folder's handle.

A folder the grader writes into may hold what a submission planted (a TA who runs `course check --submission .`
inside a student's folder; a figure file that is a symbolic link to /etc/passwd). So the folder the caller named
is opened as named (its parent's links followed: that path is the caller's own choice), and everything below it,
the named folder itself included, is opened with O_NOFOLLOW: a link there is refused, never followed. A file is
written to a fresh temporary name (O_CREAT | O_EXCL | O_NOFOLLOW) and renamed over the old one, which replaces a
link instead of writing through it; an unlink removes the name itself. Every operation goes through the folder's
file descriptor, so nothing can be swapped in between the check and the use.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

_DIR = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class Refused(OSError):
    """A folder or file the grader would write is a link or not what it should be; the message says which."""


class Folder:
    """An open folder: `Folder.open(path, "ch25")` is `path/ch25`, made where missing, no link followed below `path`'s
    parent. Use it as a context manager (it holds a file descriptor)."""

    def __init__(self, fd: int, shown: Path) -> None:
        self.fd, self.path = fd, shown

    @classmethod
    def open(cls, path: Path, *parts: str, create: bool = True) -> Folder:
        path = Path(os.path.abspath(path))
        fd = os.open(os.path.realpath(path.parent), _DIR)  # the caller's path, up to the folder it names
        shown = path.parent
        try:
            for part in (path.name, *parts):
                if part in ("", ".", "..") or "/" in part or os.sep in part:
                    raise Refused(f"{part!r} is not a folder name")
                shown = shown / part
                try:
                    child = os.open(part, _DIR | _NOFOLLOW, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    os.mkdir(part, 0o755, dir_fd=fd)
                    child = os.open(part, _DIR | _NOFOLLOW, dir_fd=fd)
                except OSError as e:  # ELOOP (a link) or ENOTDIR (a file, or a link to one)
                    raise Refused(f"{shown} is a link or not a folder: the grader writes only into real folders ({e.strerror})") from None
                os.close(fd)
                fd = child
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, shown)

    def __enter__(self) -> Folder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def write(self, name: str, data: bytes | str) -> Path:
        """Write `name` in this folder: a temporary file first, then renamed over whatever `name` was (a link is
        replaced, never written through). Returns the path, for messages."""
        if "/" in name or name in ("", ".", ".."):
            raise Refused(f"{name!r} is not a file name")
        raw = data.encode("utf-8") if isinstance(data, str) else data
        temp = f".{name}.{secrets.token_hex(6)}.partial"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o644, dir_fd=self.fd)
        try:
            with os.fdopen(fd, "wb", closefd=True) as f:
                f.write(raw)
            os.replace(temp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            try:
                os.unlink(temp, dir_fd=self.fd)
            except OSError:
                pass
            raise
        return self.path / name

    def kind(self, name: str) -> str | None:
        """ "file", "link", "folder" or "other" for what `name` is here (never following a link), None if absent."""
        try:
            mode = os.stat(name, dir_fd=self.fd, follow_symlinks=False).st_mode
        except FileNotFoundError:
            return None
        return "link" if stat.S_ISLNK(mode) else "file" if stat.S_ISREG(mode) else "folder" if stat.S_ISDIR(mode) else "other"

    def unlink(self, name: str) -> None:
        """Remove `name` itself (a link is removed, not what it points to)."""
        os.unlink(name, dir_fd=self.fd)


def cache_folder(kind: str) -> Path:
    """Where the course keeps what it can make again between runs (decompressed fonts and their subsets, read
    catalogs), one folder per `kind`: `COURSE_CACHE_DIR/kind`, else `$XDG_CACHE_HOME/course/kind`, else
    `~/.cache/course/kind`; not created here."""
    named = os.environ.get("COURSE_CACHE_DIR")
    base = Path(named) if named else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "course"
    return base / kind
