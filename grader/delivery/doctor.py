"""`course doctor`: what this installation can do, on one screen a student can paste into a question.

Each finding is a line: what was looked at, what was found, and where something is missing, what fixes it.
A finding that blocks the main job (`course check` of one's own exercises, or of the reference) makes the
command exit 1; one that only limits something else (grading somebody else's code needs a sandbox) is a
warning.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

PYTHONS = ((3, 11), (3, 12), (3, 13))
"""The Python versions the course is tested on (pyproject.toml's classifiers say the same)."""
CPU_WHEEL = "pip install torch --index-url https://download.pytorch.org/whl/cpu"


@dataclass
class Finding:
    """One line of the report. `state`: "ok", "info", "warn" (something beside the main job is missing) or
    "block" (the main job cannot run)."""

    topic: str
    found: str
    state: str = "ok"
    fix: str = ""


def version() -> str:
    """The course package's version, as installed."""
    try:
        return importlib.metadata.version("course")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed: run from a checkout without `pip install`)"


def examine(*, start_process: bool = True) -> list[Finding]:
    """Every finding, in the order they print. `start_process` also starts a student process (a second or two)."""
    from grader import chapters
    from grader.isolation import budget, portable, sandbox
    from grader.isolation.worker import OUTPUT_LIMIT

    where = "the repository (reference and hidden checks)" if chapters.has_solutions() else "a student release"
    found = [Finding("course", f"{version()}, {where} at {chapters.ROOT}")]
    found.append(_python())
    found.append(Finding("platform", f"{platform.system()} {platform.release()} ({platform.machine()})", "info"))
    torch_finding, torch_ok = _torch()
    found += torch_finding
    found.append(_package("numpy", "numpy", block=True))
    route = "warm process (fork after importing torch; pipes)"
    if not portable.can_fork():
        route = "portable (a fresh interpreter per process; stdin/stdout pipes)"
    if portable.FORCED:
        route += ", asked for by COURSE_PORTABLE=1"
    found.append(Finding("student processes", route, "info"))
    found.append(_budget(budget))
    limits = (
        f"time per check: 10 s for your own `course check` (--time-limit), 50× the reference's time within 0.5–5 s "
        f"when `course grade` grades; memory: {budget.DEFAULT_LIMIT >> 30} GiB in use (--memory-limit); output: "
        f"{OUTPUT_LIMIT >> 20} MiB; in the sandbox: {sandbox.LIMITS['processes']} processes, {sandbox.LIMITS['open_files']} "
        f"open files, files of {sandbox.LIMITS['file_size'] >> 20} MiB, /tmp and home of {sandbox.LIMITS['tmp_size'] >> 20} MiB each"
    )
    found.append(Finding("limits in force", limits, "info"))
    if start_process and torch_ok:
        found.append(_student_process())
    found.append(_sandbox(sandbox))
    found.append(_fonts())
    found.append(_package("transformers (the oracle checks)", "transformers", fix="pip install -e '.[oracle]'"))
    found.append(_package("nbgrader (the nbgrader course)", "nbgrader", fix="pip install nbgrader"))
    return found


def _python() -> Finding:
    v = sys.version_info
    text = f"{platform.python_version()} ({platform.python_implementation()}) at {sys.executable}"
    if (v.major, v.minor) < PYTHONS[0]:
        return Finding("python", text, "block", f"the course needs Python {PYTHONS[0][0]}.{PYTHONS[0][1]} or newer")
    if (v.major, v.minor) not in PYTHONS:
        return Finding("python", text + " (newer than the versions the course is tested on)", "warn", "Python 3.11–3.13 are tested")
    return Finding("python", text)


def _torch() -> tuple[list[Finding], bool]:
    try:
        import torch
    except Exception as e:  # a broken install says so here, not in a traceback
        return [
            Finding("torch", f"cannot be imported ({type(e).__name__}: {e})", "block", f"pip install torch (or, CPU only: {CPU_WHEEL})")
        ], False
    cuda, hip = getattr(torch.version, "cuda", None), getattr(torch.version, "hip", None)
    build = f"CUDA {cuda}" if cuda else f"ROCm {hip}" if hip else "CPU"
    devices = ["cpu"]
    try:
        if torch.cuda.is_available():
            devices += [f"cuda:{i} {torch.cuda.get_device_name(i)}" for i in range(torch.cuda.device_count())]
    except Exception:
        pass
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        devices.append("mps")
    note = "" if build == "CPU" else " (a GPU build works as well; the course computes on the CPU)"
    return [Finding("torch", f"{torch.__version__}, {build} build{note}"), Finding("devices", ", ".join(devices), "info")], True


def _package(topic: str, module: str, *, fix: str = "", block: bool = False) -> Finding:
    if importlib.util.find_spec(module) is None:
        return Finding(topic, "not installed", "block" if block else "info", fix or f"pip install {module}")
    try:
        return Finding(topic, importlib.metadata.version(module), "ok" if block else "info")
    except importlib.metadata.PackageNotFoundError:
        return Finding(topic, "installed", "ok" if block else "info")


def _budget(budget) -> Finding:
    import os

    from grader.isolation.sandbox import LIMITS

    kind = budget.probe()
    if not kind.startswith("watchdog"):
        text = (
            f"{kind}: one budget per run and per sandbox, for all its processes and its tmpfs pages together "
            f"(memory in use, never the address space reserved), and {LIMITS['processes']} processes per sandbox"
        )
        return Finding("memory budget", text)
    processes = "per host uid" if os.geteuid() == 0 else "inside each sandbox's user namespace"
    text = (
        f"{kind}: the resident memory of a run's processes, sampled every {budget.Watchdog.PERIOD * 1000:.0f} ms "
        f"(the measured checks are exact only with a cgroup); a sandbox's tmpfs folders hold at most "
        f"{LIMITS['tmp_size'] >> 20} MiB each; {LIMITS['processes']} processes per sandbox (RLIMIT_NPROC {processes})"
    )
    fix = "a cgroup makes it exact: run as root, or in a delegated cgroup v2 subtree (systemd's Delegate=yes), or name one"
    fix += " with COURSE_CGROUP=DIR"
    return Finding("memory budget", text, "info", fix)


def _student_process() -> Finding:
    """Start a student process as `course check` does, and time it: the one thing every check needs."""
    import tempfile

    from grader import chapters
    from grader.isolation import worker
    from grader.isolation.budget import DEFAULT_LIMIT, make

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="course-doctor-") as scratch:
        budget = make(DEFAULT_LIMIT)
        proc = None
        try:
            proc = worker.start(root=chapters.ROOT, workdir=Path(scratch), output_limit=worker.OUTPUT_LIMIT)
            budget.admit(proc.pid)
            proc.request({"op": "getattr", "handle": 0, "names": []}, timeout=60)  # an unknown handle: any reply will do
        except Exception as e:
            reason = proc.exit_reason() if proc is not None and proc.process.wait(timeout=0.1) is not None else str(e)
            return Finding("a student process", f"could not start ({reason})", "block", "`course doctor` above names what is missing")
        finally:
            if proc is not None:
                proc.kill()
            budget.close()
    return Finding("a student process", f"starts, imports torch and answers in {time.monotonic() - started:.1f} s")


def _sandbox(sandbox) -> Finding:
    from grader import chapters

    try:
        return Finding("sandbox (somebody else's code)", sandbox.probe("bwrap"))
    except sandbox.SandboxUnavailable as e:
        who = "grading a submission" if chapters.has_solutions() else "running somebody else's code (`--submission`)"
        return Finding(
            "sandbox (somebody else's code)", f"none: {e}", "warn", f"{who} refuses until it can be made; your own exercises need none"
        )


def _fonts() -> Finding:
    from figures import typeface

    if typeface.AVAILABLE:
        return Finding("fonts for figures", f"embedded in every figure (Noto subsets in {typeface.FONT_DIR}): no font needs installing")
    return Finding("fonts for figures", f"missing from {typeface.FONT_DIR}", "warn", "reinstall the course package")


def report(findings: list[Finding], *, width: int | None = None) -> str:
    """The findings as the terminal shows them: a mark, the topic, what was found (wrapped to the terminal's
    width), the fix beneath."""
    import shutil
    import textwrap

    width = max(width or shutil.get_terminal_size((100, 24)).columns, 60)
    marks = {"ok": "✓", "info": "·", "warn": "!", "block": "✗"}
    pad = max(len(f.topic) for f in findings)
    indent = " " * (pad + 4)
    lines = []
    for f in findings:
        head = f"{marks[f.state]} {f.topic.ljust(pad)}  "
        lines += textwrap.wrap(f.found, width, initial_indent=head, subsequent_indent=indent) or [head.rstrip()]
        if f.fix:
            lines += textwrap.wrap(f"→ {f.fix}", width, initial_indent=indent, subsequent_indent=indent + "  ")
    blocked = [f.topic for f in findings if f.state == "block"]
    lines.append(f"✗ blocked: {', '.join(blocked)}" if blocked else "ready: `course check chNN` runs here")
    return "\n".join(lines)


def exit_code(findings: list[Finding]) -> int:
    return 1 if any(f.state == "block" for f in findings) else 0


def to_json(findings: list[Finding]) -> dict:
    return {"version": version(), "findings": [asdict(f) for f in findings], "blocked": bool(exit_code(findings))}
