"""Where the students are: a fresh venv of every Python 3.11–3.13 this machine can make, with the build of torch
pip gives a Linux student (CUDA, 4–5 GB, which reserves gigabytes of address space when it loads), then the
student release installed by its README's command and the instructor's package from a copy of the checkout.

A student's path: `course doctor`, `course list`, the stub's check, a right answer (full marks), the same
answer reserving 8 GiB of address space it never touches (full marks: memory is what is used), a runaway
(stopped, the limit and the use named), and the portable route (COURSE_PORTABLE=1: spawn and the watchdog).
An instructor's: a submission graded in the sandbox with that torch inside it, and a measured check.

Minutes and about 6 GB of disk per Python (each venv is removed after its test): marked `platforms`, left
out of the README's test command; `.ci/run` runs them (`pytest -m platforms`). torch 2.14.1's CUDA build
lies on this machine's disk for Python 3.11 (and its nvidia-* wheels, which fit every Python); 3.12 and
3.13 take torch itself from PyPI.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import missing, require_sandbox

from grader import chapters

pytestmark = [pytest.mark.platforms, pytest.mark.slow]

TORCH = "2.14.1"
"""A CUDA build of torch (cu13 on Linux), newer than the CPU build the README's commands pin."""
PYTHONS = (11, 12, 13)
CH = chapters.find("ch17")
MiB = 1 << 20


def find_python(minor: int) -> str | None:
    """An interpreter of Python 3.minor that can make a venv: on PATH, or one of pyenv's."""
    found = [shutil.which(f"python3.{minor}") or ""]
    found += sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/3.{minor}.*/bin/python3.{minor}")), reverse=True)
    found += [f"/usr/bin/python3.{minor}", f"/usr/local/bin/python3.{minor}"]
    for python in filter(None, found):
        try:
            version = "import sys, venv; print(sys.version_info[:2])"
            probe = subprocess.run([python, "-c", version], capture_output=True, text=True, timeout=30)
        except OSError:
            continue
        if probe.returncode == 0 and probe.stdout.strip() == f"(3, {minor})":
            return python
    return None


def run(*argv: str | Path, env: dict | None = None, cwd: Path | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    environment.pop("PYTHONPATH", None)
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, env=environment, cwd=cwd, timeout=timeout)


def ok(proc: subprocess.CompletedProcess, code: int = 0) -> str:
    assert proc.returncode == code, f"exit {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    ok(run(sys.executable, "-m", "grader.cli", "release", "--out", out, "--chapter", CH.id, "--no-nbgrader"))
    return out / "student"


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """A copy of the tracked files: what a clean clone holds."""
    copy = tmp_path_factory.mktemp("checkout")
    for name in ok(run("git", "ls-files", cwd=chapters.ROOT)).splitlines():
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(chapters.ROOT / name, copy / name)
    return copy


@pytest.fixture(params=PYTHONS, ids=[f"python3.{m}" for m in PYTHONS])
def venv(request, tmp_path_factory):
    python = find_python(request.param)
    if python is None:
        missing(f"no Python 3.{request.param} that can make a venv (python3.{request.param} or pyenv's)")
    folder = tmp_path_factory.mktemp(f"venv3{request.param}")
    ok(run(python, "-m", "venv", folder))
    ok(run(folder / "bin" / "pip", "install", "-q", f"torch=={TORCH}"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_students_and_instructors_paths_with_a_cuda_build(venv, release, checkout, tmp_path):
    bin_ = venv / "bin"
    course = bin_ / "course"
    student = tmp_path / "student"
    shutil.copytree(release, student)
    readme = (student / "README.md").read_text()
    assert "pip install -e ." in readme and "download.pytorch.org/whl/cpu" in readme, "the release says how to get the CPU wheel"
    ok(run(bin_ / "pip", "install", "-q", "-e", student))  # the release README's own command, into this venv

    doctor = json.loads(ok(run(course, "doctor", "--json", cwd=student)))
    torch_line = next(f["found"] for f in doctor["findings"] if f["topic"] == "torch")
    assert torch_line.startswith(TORCH) and "CUDA" in torch_line, torch_line
    assert not doctor["blocked"]
    ok(run(course, "list", cwd=student))
    stub = run(course, "check", CH.id, cwd=student)
    assert stub.returncode == 1 and "not implemented yet" in stub.stdout, stub.stdout

    mine = student / "exercises" / CH.filename
    answer = (chapters.SOLUTIONS / CH.filename).read_text()
    variants = {
        "right": (answer, 0, "score"),
        "reserving 8 GiB": ("import mmap\n_reserved = mmap.mmap(-1, 8 << 30)\n" + answer, 0, "score"),
        "a runaway": (answer + "\n_kept = b'x' * (3 << 30)  # every page written\n", 1, "ran out of memory"),
    }
    for name, (source, code, words) in variants.items():
        mine.write_text(source)
        result = run(course, "check", CH.id, cwd=student)
        assert result.returncode == code and words in result.stdout, f"{name}: {result.stdout[-2000:]}"
    mine.write_text(answer)
    ok(run(course, "check", CH.id, cwd=student, env={"COURSE_PORTABLE": "1"}))

    # The instructor's package (a regular install of the checkout, replacing the release's) with the same torch.
    ok(run(bin_ / "pip", "install", "-q", "--no-deps", checkout))
    ok(run(course, "check", "ch16", "--solutions", "--task", "ch16.1", "--seed", "1", "--figures", tmp_path / "figs", cwd=tmp_path))
    require_sandbox()
    submission = tmp_path / "alice"
    submission.mkdir()
    (submission / CH.filename).write_text("import mmap\n_reserved = mmap.mmap(-1, 8 << 30)\n" + answer)
    doc = json.loads(ok(run(course, "check", CH.id, "--submission", submission, "--json", cwd=tmp_path)))
    assert doc["score"] == doc["max_score"] > 0, "graded in the sandbox, the CUDA build loaded inside it"
