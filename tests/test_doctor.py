"""`course doctor` says what an installation can do, and exits 1 only when something blocks `course check`;
`course --version` prints the version. Each finding is checked against what this machine really has."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys

import torch
from click.testing import CliRunner

from grader import chapters
from grader.cli import main
from grader.isolation import budget


def doctor(*args: str, env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    environment = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "grader.cli", "doctor", *args], capture_output=True, text=True, env=environment, cwd=cwd or chapters.ROOT
    )


def findings(proc: subprocess.CompletedProcess) -> dict[str, dict]:
    return {f["topic"]: f for f in json.loads(proc.stdout)["findings"]}


def test_doctor_reports_this_installation_and_starts_a_student_process():
    proc = doctor("--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = findings(proc)
    assert found["torch"]["found"].startswith(torch.__version__)
    assert found["python"]["found"].startswith(".".join(map(str, sys.version_info[:3])))
    assert found["a student process"]["state"] == "ok" and "imports torch and answers" in found["a student process"]["found"]
    assert found["memory budget"]["found"].startswith(budget.probe().split(" (")[0])
    assert json.loads(proc.stdout)["version"] == importlib.metadata.version("course")


def test_the_portable_route_and_its_watchdog_are_said():
    found = findings(doctor("--json", "--quick", env={"COURSE_PORTABLE": "1"}))
    assert "portable" in found["student processes"]["found"] and "COURSE_PORTABLE=1" in found["student processes"]["found"]
    assert found["memory budget"]["found"].startswith("watchdog") and "COURSE_CGROUP" in found["memory budget"]["fix"]
    assert "a student process" not in found, "--quick starts none"


def test_a_broken_torch_blocks_and_says_how_to_install_one(tmp_path):
    (tmp_path / "torch.py").write_text("raise ImportError('libcudart.so.13: cannot open shared object file')\n")
    proc = doctor("--quick", env={"PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "✗ torch" in proc.stdout and "libcudart.so.13" in proc.stdout and "download.pytorch.org/whl/cpu" in proc.stdout
    assert proc.stdout.rstrip().splitlines()[-1].startswith("✗ blocked: torch")


def test_no_sandbox_is_a_warning_that_names_the_fix(tmp_path):
    (tmp_path / "bin").mkdir()
    path = f"{tmp_path / 'bin'}:{os.path.dirname(sys.executable)}"  # no bwrap on this PATH
    found = findings(doctor("--json", "--quick", env={"PATH": path}))
    sandbox = found["sandbox (somebody else's code)"]
    assert sandbox["state"] == "warn" and "bubblewrap" in sandbox["found"] and "your own exercises need none" in sandbox["fix"]


def test_version_is_printed():
    out = CliRunner().invoke(main, ["--version"])
    assert out.exit_code == 0 and out.output.strip() == f"course {importlib.metadata.version('course')}"
