"""The portable route (what macOS and Windows get: spawn, stdin/stdout pipes, threads for deadlines, the watchdog
through psutil), forced on Linux with COURSE_PORTABLE=1: a student's whole own run works there, `course check`,
`course check all` (a spawn pool), `course list`, the figure book's chapters, the lab and a notebook's test cell."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from grader import chapters
from grader.isolation import portable

pytestmark = pytest.mark.slow


def course(*args: str, cwd=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "COURSE_PORTABLE": "1"}
    return subprocess.run([sys.executable, "-m", "grader.cli", *args], capture_output=True, text=True, env=env, cwd=cwd or chapters.ROOT)


def test_check_all_and_list_take_the_portable_route(tmp_path):
    out = course("check", "all", "--solutions", "--json", "--jobs", "2", "--figures", str(tmp_path), "--seed", "3")
    doc = json.loads(out.stdout)
    assert out.returncode == 0 and doc["score"] == doc["max_score"] > 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert len(doc["chapters"]) == len(chapters.all_chapters())
    assert course("list").returncode == 0


def test_the_lab_runs_an_experiment_on_the_portable_route(monkeypatch):
    from grader.lab.runner import Lab

    monkeypatch.setattr(portable, "FORCED", True)
    lab = Lab(solutions=True)
    try:
        assert lab._zygote is None and lab.budget.kind == "watchdog", "no fork, no cgroup"
        experiment = next(iter(lab.catalog.experiments))
        result = lab.run(experiment, None)
        assert result["status"] in ("passed", "ok", "drawn"), result
    finally:
        lab.close()


def test_a_notebook_test_cell_forks_nothing_on_the_portable_route(monkeypatch):
    from grader.delivery import notebook
    from grader.isolation import worker

    monkeypatch.setattr(portable, "FORCED", True)
    launcher = notebook._launcher()
    assert getattr(launcher, "func", None) is worker.start, "a fresh interpreter per student process"
