"""Finding and killing processes that student code left running (Linux /proc).

Both the grader and the student's process make themselves "subreapers": an
orphaned descendant is adopted by the nearest subreaper instead of init, so a
process that escaped its session is still found among our children.
"""

from __future__ import annotations

import os
import signal


def become_subreaper() -> None:
    """Adopt orphaned descendants (PR_SET_CHILD_SUBREAPER); a no-op off Linux."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)
    except Exception:
        pass


def die_with_parent() -> None:
    """Have the kernel SIGKILL this process when the thread that started it ends (PR_SET_PDEATHSIG); Linux only."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)
    except Exception:
        pass


def children() -> set[int]:
    """The pids of this process's children (empty where /proc is missing)."""
    pids: set[int] = set()
    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/children") as f:
                pids.update(int(p) for p in f.read().split())
    except OSError:
        pass
    return pids


def kill_strays(known: set[int] | frozenset[int] = frozenset()) -> list[str]:
    """Kill every child not in `known`, and the orphans that killing them leaves; name the ones
    that were still running (children that had already exited are only reaped)."""
    found: list[str] = []
    for _ in range(5):
        strays = children() - known
        if not strays:
            break
        for pid in strays:
            name = _running(pid)
            if name:
                found.append(name)
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for pid in strays:
            try:
                os.waitpid(pid, 0)
            except OSError:
                pass
    return found[:10]


def _running(pid: int) -> str | None:
    """The command line of a live process, or None for one that has exited (a zombie) or vanished."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                return None
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip() or f"pid {pid}"
    except (OSError, IndexError):
        return None


def descendants(root: int) -> list[int]:
    """Every live descendant of `root`, from outside (its children files in /proc), parents first."""
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        for kid in children_of(pid):
            if kid not in found:
                found.append(kid)
                todo.append(kid)
    return found


def children_of(pid: int) -> set[int]:
    """The children of any process we may look at (empty once it is gone)."""
    kids: set[int] = set()
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids.update(int(p) for p in f.read().split())
    except OSError:
        pass
    return kids


def status(pid: int) -> dict[str, str]:
    """The fields of /proc/PID/status (empty once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    except OSError:
        return {}


def inner_pid(pid: int) -> int | None:
    """The pid a process has in its own (innermost) pid namespace."""
    nspid = status(pid).get("NSpid", "").split()
    return int(nspid[-1]) if nspid else None


def describe(pid: int) -> str | None:
    """The command line of a process student code started, or None once it is gone: one that
    exited but was never waited for (a zombie) is named too, it was started all the same."""
    name = _running(pid)
    if name is None and status(pid).get("State", "").startswith("Z"):
        return f"{status(pid).get('Name', 'pid ' + str(pid))} (exited, never waited for)"
    return name


def kill(pid: int) -> None:
    """SIGKILL, if it is still there."""
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
