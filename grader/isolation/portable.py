"""What this platform offers the runner, and the switch that takes the portable route on Linux too.

On Linux the runner forks student processes from a warm process (`grader.isolation.zygote`), talks to
them over inherited pipes, limits them with `resource` and cgroups, and finds their processes in /proc.
macOS and Windows have some of that or none (fork is unsafe with torch on macOS, Windows has no fork,
no `resource`, no /proc, no select() on pipes), so there a student's own run takes the portable route:
a fresh interpreter per student process (spawn), requests on its stdin and replies on its stdout with
deadlines kept by threads, and a watchdog on resident memory read through psutil.

`COURSE_PORTABLE=1` takes that route on Linux as well, so it is tested where only Linux is at hand.
Grading somebody else's code needs Linux and bubblewrap whatever this says (`grader.isolation.sandbox`).
"""

from __future__ import annotations

import os
import signal
import sys

FORCED = os.environ.get("COURSE_PORTABLE") == "1"
"""The portable route, asked for by COURSE_PORTABLE=1."""
LINUX = sys.platform.startswith("linux")


def can_fork() -> bool:
    """Whether student processes may be forked from a warm process (Linux; never on the portable route)."""
    return LINUX and not FORCED and hasattr(os, "fork")


def inherits_fds() -> bool:
    """Whether a child can be handed extra pipes (`pass_fds`) and waited on with select() (POSIX)."""
    return os.name == "posix" and not FORCED


def has_proc() -> bool:
    """Whether processes are read from /proc here (Linux; not on the portable route)."""
    return LINUX and not FORCED and os.path.isdir("/proc/self")


def private_memory(pid: int) -> int | None:
    """Bytes of memory process `pid` holds for itself, or None once it is gone.

    Linux: its resident anonymous and shared-memory pages (RssAnon + RssShmem: a MAP_SHARED mapping or a
    tmpfs file it maps counts; the files it maps, libraries included, do not). Elsewhere, through psutil: the
    private working set on Windows, all resident memory on macOS (and on the portable route on Linux).
    """
    if has_proc():
        try:
            with open(f"/proc/{pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if line.startswith(("RssAnon:", "RssShmem:")))
            return sum(int(v.split()[0]) for v in fields.values()) * 1024 if fields else 0
        except (OSError, ValueError):
            return None
    import psutil

    try:
        info = psutil.Process(pid).memory_info()
    except (psutil.Error, OSError):
        return None
    return int(getattr(info, "private", info.rss))  # Windows' private bytes; resident memory elsewhere


def started(pid: int) -> float | None:
    """When process `pid` started (a number to compare, not a time of day), or None once it is gone: a pid with
    another start is another process that took a freed pid."""
    if has_proc():
        try:
            with open(f"/proc/{pid}/stat") as f:
                return float(f.read().rsplit(")", 1)[1].split()[19])
        except (OSError, IndexError, ValueError):
            return None
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except (psutil.Error, OSError):
        return None


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid`, parents first."""
    if has_proc():
        from grader.isolation import procs

        return procs.descendants(pid)
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except (psutil.Error, OSError):
        return []


def kill(pid: int) -> None:
    """End process `pid` at once, if it is still there (SIGKILL; TerminateProcess on Windows)."""
    try:
        os.kill(pid, getattr(signal, "SIGKILL", signal.SIGTERM))
    except OSError:
        pass


def kill_tree(pid: int) -> list[int]:
    """End `pid` and everything it started (children first found, then all killed); the pids killed."""
    pids = [*descendants(pid), pid]
    for p in pids:
        kill(p)
    return pids
