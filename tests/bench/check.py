"""Benchmark (not a test): how long `course check` takes and what isolation costs per check.

Run:  .venv/bin/python tests/bench/check.py
Prints the median of 5 wall times of `course check ch25 --solutions` (a fresh
process each time, torch import included), then the cost of starting the
student's process, of one round trip to it, and of a whole check around one
call, for 10, 100 and 1000 checks (a run grows linearly with the checks).
"""

from __future__ import annotations

import importlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from grader import chapters
from grader.authoring.spec import CheckSpec
from grader.authoring.trial import run_one
from grader.isolation import procs, worker
from grader.isolation.session import Session
from grader.run import _stray_finder


def wall(cmd: list[str], runs: int = 5) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(cmd, check=False, capture_output=True)
        times.append(time.perf_counter() - start)
    return times


CHAPTER = chapters.find("ch25")


def commands(course: str, figures: str) -> list[tuple[str, list[str]]]:
    """(label, command line) of each whole `course check` timed: ch25 against the reference, and its stubs."""
    runs = (("course check ch25 --solutions", ["--solutions"]), ("course check ch25 (stubs)", []))
    return [(label, [course, "check", CHAPTER.id, *extra, "--figures", figures]) for label, extra in runs]


def calls() -> list[tuple[int, list[Any]]]:
    """(repetitions, [block_table, positions, block_size]) of the slot_mapping round trips timed: the docstring's
    small call, and 16384 positions over a 1024-block table."""
    return [(1000, [[3, 0, 4], [0, 1, 2, 3, 4], 2]), (200, [list(range(1024)), list(range(16384)), 16])]


def one_call_check() -> tuple[CheckSpec, dict[str, tuple[str, ...]]]:
    """The check timed around one call (its spec), and the parameter names of the function it calls (ch25's task)."""
    spec = CheckSpec("ch25.1", "one call", lambda t: t.yours.slot_mapping([3, 0, 4], [0, 1, 2, 3, 4], 2), False)
    params = {name: names for task in CHAPTER.tasks for name, names in task.params.items() if name == "slot_mapping"}
    return spec, params


def main() -> None:
    course = shutil.which("course") or str(Path(sys.executable).with_name("course"))
    figs = tempfile.mkdtemp()
    for label, cmd in commands(course, figs):
        times = wall(cmd)
        print(f"{label:34s} median {statistics.median(times):.2f} s  runs {' '.join(f'{t:.2f}' for t in times)}")
    times = wall([sys.executable, "-c", "import torch"])
    label = 'python -c "import torch"'
    print(f"{label:34s} median {statistics.median(times):.2f} s")

    path = chapters.SOLUTIONS / CHAPTER.filename
    t0 = time.perf_counter()
    spawn = lambda **kw: worker.start(root=chapters.ROOT, workdir=Path(figs), output_limit=worker.OUTPUT_LIMIT, **kw)
    session = Session(path, spawn=spawn, time_limit=10.0)
    session.begin_check(1e9)
    session.call("slot_mapping", [[0], [0], 1], {})
    print(f"start the student process + import torch + load the module: {time.perf_counter() - t0:.2f} s")
    for n, args in calls():
        start = time.perf_counter()
        for _ in range(n):
            session.call("slot_mapping", args, {})
        per = (time.perf_counter() - start) / n
        print(f"round trip per call ({len(args[1]):>5} positions): {per * 1e3:.2f} ms")
    start = time.perf_counter()
    for _ in range(20):
        session.call("slot_mapping", [[3, 0, 4], [0, 1, 2, 3, 4], 2], {}, memory=16 << 20)
    print(f"a call under a memory budget (a fresh process each): {(time.perf_counter() - start) / 20 * 1e3:.1f} ms")

    # A whole check around one call: trial set-up, the call, the input comparison, the stray-process scan.
    finder = _stray_finder(spawn, procs.children())
    ref = importlib.import_module(f"solutions.{Path(CHAPTER.filename).stem}")
    spec, params = one_call_check()
    for n in (10, 100, 1000):
        start = time.perf_counter()
        for _ in range(n):
            run_one(spec, "slot_mapping", session=session, ref=ref, seed=0, params=params, figures={}, time_limit=10.0, strays=finder)
        total = time.perf_counter() - start
        print(f"{n:>5} one-call checks: {total:.3f} s, {total / n * 1e3:.2f} ms per check")
    session.close()


if __name__ == "__main__":
    main()
