"""Benchmark (not a test): what the memory budget costs, per submission and per check, for each kind this machine has.

Run:  .venv/bin/python tests/bench/budget.py [RUNS]      (RUNS of each measure, default 20; medians printed)

Per kind (the cgroup where this machine gives one, and the watchdog): making and closing a budget (once per run or
box), admitting a process (once per student process), what a failed call adds (a read of the kernel's or watchdog's
kill count; a call that succeeds adds nothing) and one measured call's budget (made, admitted, read, closed); the
watchdog's own CPU per second of watching a process. Then whole runs side by side: a box started until its warm
process is ready, with its budget and with none, and `course check ch17 --submission` under each kind.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from grader import chapters
from grader.isolation import budget

KINDS = ("cgroup", "watchdog")


def median_ms(work: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def make(kind: str, limit: int = 2 << 30) -> budget.Budget:
    return budget.make(limit, prefer=None if kind == "cgroup" else "watchdog")


def sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def inputs() -> dict[str, list[str]]:
    """What is measured: the kinds and, for the whole runs, the `course check` command of each (env, argv)."""
    submission = tempfile.mkdtemp(prefix="bench-budget-")
    (Path(submission) / "ch17_causal_masks.py").write_text((chapters.SOLUTIONS / "ch17_causal_masks.py").read_text())
    course = str(Path(sys.executable).with_name("course"))
    argv = [course, "check", "ch17", "--submission", submission, "--seed", "1", "--figures", tempfile.mkdtemp()]
    return {"cgroup": argv, "watchdog": argv}


def per_kind(kind: str, runs: int) -> None:
    probe = make(kind)
    kind_name = probe.kind
    probe.close()
    if kind == "cgroup" and kind_name == "watchdog":
        print(f"{kind}: not available here")
        return
    print(f"{kind_name}:")
    print(f"  make + close a budget          {median_ms(lambda: make(kind).close(), runs):8.2f} ms")
    b = make(kind)
    procs = [sleeper() for _ in range(runs)]
    admits = []
    for p in procs:
        start = time.perf_counter()
        b.admit(p.pid)
        admits.append(time.perf_counter() - start)
    print(f"  admit a process                {statistics.median(admits) * 1e3:8.2f} ms")
    print(f"  a failed call's look (kills)   {median_ms(b.kills, runs):8.3f} ms  (a call that succeeds reads nothing)")
    print(f"  a measured call's budget       {median_ms(lambda: b.measure(procs[0].pid).close(), runs):8.2f} ms")
    if kind == "watchdog":
        before = resource.getrusage(resource.RUSAGE_SELF)
        time.sleep(2.0)
        after = resource.getrusage(resource.RUSAGE_SELF)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        print(f"  watching {len(procs)} processes           {cpu / 2.0 * 100:8.1f} % of a core")
    b.close()
    for p in procs:
        p.kill()
        p.wait()


def box_start(with_budget: bool) -> float:
    from grader.isolation.sandbox import Box
    from grader.isolation.zygote import Zygote

    start = time.perf_counter()
    box = Box("bwrap", {})
    if not with_budget and box.budget is not None:
        box.budget.close()
        box.budget = None
    zygote = Zygote(box=box)
    elapsed = time.perf_counter() - start
    zygote.close()
    box.close()
    return elapsed


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    for kind in KINDS:
        per_kind(kind, runs)
    from grader.isolation.sandbox import SandboxUnavailable, probe

    try:
        probe("bwrap")
    except SandboxUnavailable as e:
        print(f"no sandbox here ({e}): the whole runs are left out")
        return
    starts = {flag: statistics.median(box_start(flag) for _ in range(3)) for flag in (True, False)}
    print(f"box + warm process ready: {starts[False]:.2f} s without a budget, {starts[True]:.2f} s with one")
    for kind, argv in inputs().items():
        env = {**os.environ, **({"COURSE_PORTABLE": "1"} if kind == "watchdog" else {})}
        times = []
        for _ in range(3):
            start = time.perf_counter()
            subprocess.run(argv, capture_output=True, env=env)
            times.append(time.perf_counter() - start)
        label = f"course check ch17 --submission ({kind}{', COURSE_PORTABLE=1' * (kind == 'watchdog')})"
        print(f"{label}: median {statistics.median(times):.2f} s")


if __name__ == "__main__":
    main()
