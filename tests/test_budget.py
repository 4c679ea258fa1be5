"""The memory budget (grader/isolation/budget.py): memory in use is counted and stopped, address space that is
only reserved (as a CUDA build of torch reserves gigabytes when it loads) is not; measured calls see what a
process and its children use from the moment they are measured. Each kind where this machine has it: the
cgroup (v1 here, as root) and the watchdog, through /proc and through psutil (the portable route)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest
from conftest import missing

from grader.isolation import budget, portable

MiB = 1 << 20
TOUCH = "import mmap, time\nm = mmap.mmap(-1, {n} << 20)\nfor i in range(0, len(m), 4096):\n    m[i] = 1\n{after}"
RESERVE = "import mmap, time\nm = mmap.mmap(-1, 8 << 30)\n{after}"
"""Programs: touch n MiB page by page; reserve 8 GiB of address space and touch none of it."""


def start(code: str, *, enter: budget.Budget | None = None) -> subprocess.Popen:
    """A Python process running `code`, born inside `enter` (a cgroup's way in) when given."""
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)], preexec_fn=enter.enter if enter is not None else None, stdout=subprocess.PIPE
    )


def wait_line(proc: subprocess.Popen, timeout: float = 30.0) -> str:
    """The first line the process prints ('' if it died first)."""
    deadline = time.monotonic() + timeout
    line = proc.stdout.readline().decode() if proc.stdout else ""
    assert time.monotonic() < deadline
    return line.strip()


def cgroup_or_skip() -> budget.Budget:
    made = budget.make(256 * MiB)
    if made.kind == "watchdog":
        made.close()
        missing(f"no cgroup can be made here ({made.why_not_cgroup}): needs root on a machine with cgroups")
    return made


@pytest.fixture(params=["cgroup", "watchdog", "watchdog-psutil"])
def kind(request, monkeypatch):
    if request.param == "watchdog-psutil":  # the portable route: psutil reads the processes, as on macOS and Windows
        monkeypatch.setattr(portable, "FORCED", True)
    if request.param == "cgroup":
        cgroup_or_skip().close()
    return request.param


def made(kind: str, limit: int) -> budget.Budget:
    return budget.make(limit, prefer=None if kind == "cgroup" else "watchdog")


def admitted(b: budget.Budget, code: str) -> subprocess.Popen:
    proc = start(code, enter=b if b.kind != "watchdog" else None)
    b.admit(proc.pid)  # a watchdog starts counting here; for a cgroup the process is inside already
    return proc


def test_memory_in_use_over_the_budget_is_stopped(kind):
    b = made(kind, 200 * MiB)
    try:
        proc = admitted(b, TOUCH.format(n=600, after="print('survived', flush=True)\ntime.sleep(30)"))
        assert proc.wait(timeout=30) == -9, "killed (SIGKILL) on the way to 600 MiB in a 200 MiB budget"
        assert b.kills() == 1 and b.peak() >= 150 * MiB
    finally:
        b.close()


def test_reserved_address_space_is_not_counted(kind):
    b = made(kind, 200 * MiB)
    try:
        proc = admitted(b, RESERVE.format(after="print('alive', flush=True)\ntime.sleep(30)"))
        assert wait_line(proc) == "alive"
        time.sleep(3 * budget.Watchdog.PERIOD)
        assert proc.poll() is None and b.kills() == 0
        assert b.usage() < 64 * MiB, "8 GiB reserved, nothing touched: almost nothing in use"
    finally:
        b.close()
    assert proc.wait(timeout=10) is not None


def test_a_measured_process_counts_only_what_it_uses_from_then_on(kind):
    """Inside the run's budget, a measured call's budget counts the pages the process and its children touch after
    `measure`, not the 100 MiB it touched before (as a forked student process does not count the warm process)."""
    b = made(kind, 1 << 30)
    try:
        proc = admitted(
            b,
            TOUCH.format(
                n=100,
                after=textwrap.dedent("""\
                import os, sys
                print('before', flush=True)
                sys.stdin.readline() if False else time.sleep(1.0)
                extra = mmap.mmap(-1, 48 << 20)
                for i in range(0, len(extra), 4096):
                    extra[i] = 1
                print('after', flush=True)
                time.sleep(30)
                """),
            ),
        )
        assert wait_line(proc) == "before"
        measured = b.measure(proc.pid)
        try:
            assert wait_line(proc) == "after"
            time.sleep(5 * budget.Watchdog.MEASURE_PERIOD)
            assert 40 * MiB <= measured.peak() < 90 * MiB, measured.peak() / MiB
        finally:
            measured.close()
    finally:
        b.close()


def test_closing_a_budget_ends_what_is_left_in_a_cgroup():
    b = cgroup_or_skip()
    proc = admitted(b, "import time\nprint('up', flush=True)\ntime.sleep(60)")
    assert wait_line(proc) == "up"
    folders = list(b.dirs.values())  # type: ignore[attr-defined]
    b.close()
    assert proc.wait(timeout=10) == -9
    assert not any(f.exists() for f in folders), "its folders are removed"


def test_a_cgroup_limits_the_processes_of_the_budget():
    b = cgroup_or_skip()
    if "pids" not in b.dirs:  # type: ignore[attr-defined]
        b.close()
        missing("this machine's cgroups have no pids controller")
    try:
        proc = admitted(
            b,
            "import os, time\nn = 0\ntry:\n    for _ in range(400):\n        if os.fork() == 0:\n            time.sleep(30)\n"
            "            os._exit(0)\n        n += 1\nexcept OSError:\n    pass\nprint(n, flush=True)\ntime.sleep(30)",
        )
        started = int(wait_line(proc))
        assert started < budget.PROCESSES, f"{started} children started under pids.max {budget.PROCESSES}"
    finally:
        b.close()


V2_SYSTEMD = """\
25 30 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
"""
V1_CONTAINER = """\
35 31 0:32 /docker/abc /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory
39 31 0:36 /docker/abc /sys/fs/cgroup/pids ro,nosuid - cgroup cgroup rw,pids
40 31 0:37 /docker/abc /sys/fs/cgroup/systemd ro,nosuid - cgroup cgroup rw,name=systemd
"""


def test_cgroup_folders_are_found_from_mountinfo_and_proc_self_cgroup():
    mounts = budget._cgroup_mounts(V2_SYSTEMD)
    own = budget._own_cgroups("0::/user.slice/user-1000.slice/session-3.scope\n")
    assert str(budget._join(mounts["v2"]["unified"], own[""])) == "/sys/fs/cgroup/user.slice/user-1000.slice/session-3.scope"
    mounts = budget._cgroup_mounts(V1_CONTAINER)  # a container sees its own subtree mounted at the top
    own = budget._own_cgroups("12:pids:/docker/abc\n4:memory:/docker/abc/grader\n1:name=systemd:/docker/abc\n")
    assert set(mounts["v1"]) == {"memory", "pids"}
    assert str(budget._join(mounts["v1"]["memory"], own["memory"])) == "/sys/fs/cgroup/memory/grader"
    assert str(budget._join(mounts["v1"]["pids"], own["pids"])) == "/sys/fs/cgroup/pids"


def test_stale_folders_of_a_killed_grader_are_removed():
    b = cgroup_or_skip()
    base = b.dirs["memory"].parent  # type: ignore[attr-defined]
    b.close()
    dead = base / f"course-{budget._pid_namespace()}-999999999-0"  # no process of this namespace has that pid
    elsewhere = base / "course-1-999999999-0"  # a grader of another pid namespace: never judged from here
    elsewhere.mkdir()
    (dead / "main").mkdir(parents=True)
    assert budget.stale() >= 1 and not dead.exists()
    assert elsewhere.exists()
    elsewhere.rmdir()


def test_the_portable_route_reads_processes_through_psutil(monkeypatch):
    proc = start(TOUCH.format(n=64, after="print('up', flush=True)\ntime.sleep(30)"))
    try:
        assert wait_line(proc) == "up"
        native = portable.private_memory(proc.pid)
        monkeypatch.setattr(portable, "FORCED", True)
        through_psutil = portable.private_memory(proc.pid)
        assert native is not None and through_psutil is not None
        assert 60 * MiB <= native <= through_psutil, "resident memory holds the touched pages, and the files mapped too"
        assert portable.descendants(proc.pid) == []
    finally:
        proc.kill()
        proc.wait()
    assert portable.private_memory(proc.pid) is None, "a process that is gone has no memory"
