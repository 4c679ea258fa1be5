"""Benchmark (not a test): the whole course against the reference in one run, beside its slowest chapter.

Run:  .venv/bin/python tests/bench/check_all.py [--repeat 3]
Times `course check chNN --solutions` for every chapter (a fresh process each, as a student's terminal runs it),
then `course check all --solutions` (the chapters spread over the cores), and prints both with the ratio of the
whole run to the slowest chapter. The goal is at most 2×. Run it on an otherwise idle machine: every number is a
wall time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COURSE = [sys.executable, "-m", "grader.cli"]
sys.path.insert(0, str(ROOT))
from grader import chapters  # noqa: E402


def commands() -> list[list[str]]:
    """The `course` arguments timed, in order: `check chNN --solutions` for every chapter, then `check all
    --solutions` (each run is also given `--figures` into a scratch folder)."""
    return [["check", ch.id, "--solutions"] for ch in chapters.all_chapters()] + [["check", "all", "--solutions"]]


def timed(args: list[str], figures: Path) -> float:
    started = time.monotonic()
    out = subprocess.run(
        COURSE + args + ["--figures", str(figures)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1"),
    )
    elapsed = time.monotonic() - started
    if out.returncode != 0:
        raise SystemExit(f"course {' '.join(args)} failed ({out.returncode}):\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs of each command; the median is reported")
    args = parser.parse_args()
    *alone_runs, whole_run = commands()
    with tempfile.TemporaryDirectory() as tmp:
        figures = Path(tmp)
        alone = {}
        for run in alone_runs:
            alone[run[1]] = statistics.median(timed(run, figures) for _ in range(args.repeat))
            print(f"course {' '.join(run)}   {alone[run[1]]:6.1f} s", flush=True)
        whole = [timed(whole_run, figures) for _ in range(args.repeat)]
    slowest = max(alone, key=alone.__getitem__)
    median = statistics.median(whole)
    print(f"\none chapter after another (sum of the {len(alone)} commands): {sum(alone.values()):.1f} s")
    print(f"slowest chapter alone: {slowest}, {alone[slowest]:.1f} s")
    print(f"course check all --solutions ({os.cpu_count()} cores): median {median:.1f} s of {[round(w, 1) for w in whole]}")
    print(f"ratio to the slowest chapter: {median / alone[slowest]:.2f} (goal: at most 2)")


if __name__ == "__main__":
    main()
