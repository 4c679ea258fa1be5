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

from grader.i18n import mark, tr

PYTHONS = ((3, 11), (3, 12), (3, 13))
"""The Python versions the course is tested on (pyproject.toml's classifiers say the same)."""
CPU_WHEEL = "pip install torch --index-url https://download.pytorch.org/whl/cpu"
TOPICS = (
    mark("course"),
    mark("python"),
    mark("platform"),
    mark("torch"),
    mark("devices"),
    mark("numpy"),
    mark("student processes"),
    mark("memory budget"),
    mark("limits in force"),
    mark("a student process"),
    mark("sandbox (somebody else's code)"),
    mark("fonts for figures"),
    mark("transformers (the oracle checks)"),
    mark("nbgrader (the nbgrader course)"),
)
"""The findings' topics: English in the JSON (its keys), translated on the screen (`report`)."""


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
        return tr("unknown (not installed: run from a checkout without `pip install`)")


def examine(*, start_process: bool = True) -> list[Finding]:
    """Every finding, in the order they print. `start_process` also starts a student process (a second or two)."""
    from grader import chapters
    from grader.isolation import budget, portable, sandbox
    from grader.isolation.worker import OUTPUT_LIMIT

    if chapters.has_solutions():
        course = tr("{version}, the repository (reference and hidden checks) at {root}", version=version(), root=chapters.ROOT)
    else:
        course = tr("{version}, a student release at {root}", version=version(), root=chapters.ROOT)
    found = [Finding("course", course)]
    found.append(_python())
    found.append(Finding("platform", f"{platform.system()} {platform.release()} ({platform.machine()})", "info"))
    torch_finding, torch_ok = _torch()
    found += torch_finding
    found.append(_package("numpy", "numpy", block=True))
    route = tr("warm process (fork after importing torch; pipes)")
    if not portable.can_fork():
        route = tr("portable (a fresh interpreter per process; stdin/stdout pipes)")
    if portable.FORCED:
        route = tr("{route}, asked for by COURSE_PORTABLE=1", route=route)
    found.append(Finding("student processes", route, "info"))
    found.append(_budget(budget))
    limits = tr(
        "time per check: 10 s for your own `course check` (--time-limit), 50× the reference's time within 0.5–5 s "
        "when `course grade` grades; memory: {memory} GiB in use (--memory-limit); output: "
        "{output} MiB; in the sandbox: {processes} processes, {files} "
        "open files, files of {file_size} MiB, /tmp and home of {tmp_size} MiB each",
        memory=budget.DEFAULT_LIMIT >> 30,
        output=OUTPUT_LIMIT >> 20,
        processes=sandbox.LIMITS["processes"],
        files=sandbox.LIMITS["open_files"],
        file_size=sandbox.LIMITS["file_size"] >> 20,
        tmp_size=sandbox.LIMITS["tmp_size"] >> 20,
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
    fields = {"version": platform.python_version(), "kind": platform.python_implementation(), "path": sys.executable}
    text = tr("{version} ({kind}) at {path}", **fields)
    if (v.major, v.minor) < PYTHONS[0]:
        oldest = f"{PYTHONS[0][0]}.{PYTHONS[0][1]}"
        return Finding("python", text, "block", tr("the course needs Python {oldest} or newer", oldest=oldest))
    if (v.major, v.minor) not in PYTHONS:
        newer = tr("{version} ({kind}) at {path} (newer than the versions the course is tested on)", **fields)
        return Finding("python", newer, "warn", tr("Python 3.11–3.13 are tested"))
    return Finding("python", text)


def _torch() -> tuple[list[Finding], bool]:
    try:
        import torch
    except Exception as e:  # a broken install says so here, not in a traceback
        error = f"{type(e).__name__}: {e}"
        return [
            Finding(
                "torch",
                tr("cannot be imported ({error})", error=error),
                "block",
                tr("pip install torch (or, CPU only: {wheel})", wheel=CPU_WHEEL),
            )
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
    if build == "CPU":
        text = tr("{version}, {build} build", version=torch.__version__, build=build)
    else:
        text = tr(
            "{version}, {build} build (a GPU build works as well; the course computes on the CPU)", version=torch.__version__, build=build
        )
    return [Finding("torch", text), Finding("devices", ", ".join(devices), "info")], True


def _package(topic: str, module: str, *, fix: str = "", block: bool = False) -> Finding:
    if importlib.util.find_spec(module) is None:
        return Finding(topic, tr("not installed"), "block" if block else "info", fix or f"pip install {module}")
    try:
        return Finding(topic, importlib.metadata.version(module), "ok" if block else "info")
    except importlib.metadata.PackageNotFoundError:
        return Finding(topic, tr("installed"), "ok" if block else "info")


def _budget(budget) -> Finding:
    import os

    from grader.isolation.sandbox import LIMITS

    kind = budget.probe()
    if not kind.startswith("watchdog"):
        text = tr(
            "{kind}: one budget per run and per sandbox, for all its processes and its tmpfs pages together "
            "(memory in use, never the address space reserved), and {processes} processes per sandbox",
            kind=kind,
            processes=LIMITS["processes"],
        )
        return Finding("memory budget", text)
    fields = {"kind": kind, "ms": budget.Watchdog.PERIOD * 1000, "tmp": LIMITS["tmp_size"] >> 20, "processes": LIMITS["processes"]}
    if os.geteuid() == 0:
        text = tr(
            "{kind}: the resident memory of a run's processes, sampled every {ms:.0f} ms (the measured checks are exact only "
            "with a cgroup); a sandbox's tmpfs folders hold at most {tmp} MiB each; {processes} processes per sandbox "
            "(RLIMIT_NPROC per host uid)",
            **fields,
        )
    else:
        text = tr(
            "{kind}: the resident memory of a run's processes, sampled every {ms:.0f} ms (the measured checks are exact only "
            "with a cgroup); a sandbox's tmpfs folders hold at most {tmp} MiB each; {processes} processes per sandbox "
            "(RLIMIT_NPROC inside each sandbox's user namespace)",
            **fields,
        )
    fix = tr(
        "a cgroup makes it exact: run as root, or in a delegated cgroup v2 subtree (systemd's Delegate=yes), or name one "
        "with COURSE_CGROUP=DIR"
    )
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
            return Finding(
                "a student process",
                tr("could not start ({reason})", reason=reason),
                "block",
                tr("`course doctor` above names what is missing"),
            )
        finally:
            if proc is not None:
                proc.kill()
            budget.close()
    return Finding("a student process", tr("starts, imports torch and answers in {s:.1f} s", s=time.monotonic() - started))


def _sandbox(sandbox) -> Finding:
    from grader import chapters

    try:
        return Finding("sandbox (somebody else's code)", sandbox.probe("bwrap"))
    except sandbox.SandboxUnavailable as e:
        if chapters.has_solutions():
            fix = tr("grading a submission refuses until it can be made; your own exercises need none")
        else:
            fix = tr("running somebody else's code (`--submission`) refuses until it can be made; your own exercises need none")
        return Finding("sandbox (somebody else's code)", tr("none: {error}", error=e), "warn", fix)


def _fonts() -> Finding:
    from figures import typeface

    if typeface.AVAILABLE:
        return Finding(
            "fonts for figures",
            tr("embedded in every figure (Noto subsets in {folder}): no font needs installing", folder=typeface.FONT_DIR),
        )
    return Finding("fonts for figures", tr("missing from {folder}", folder=typeface.FONT_DIR), "warn", tr("reinstall the course package"))


def report(findings: list[Finding], *, width: int | None = None) -> str:
    """The findings as the terminal shows them: a mark, the topic, what was found (wrapped to the terminal's
    width), the fix beneath."""
    import shutil

    width = max(width or shutil.get_terminal_size((100, 24)).columns, 60)
    marks = {"ok": "✓", "info": "·", "warn": "!", "block": "✗"}
    from grader.terminal import columns

    topics = {f.topic: tr(f.topic) for f in findings}
    pad = max(columns(t) for t in topics.values())
    indent = " " * (pad + 4)
    lines = []
    for f in findings:
        topic = topics[f.topic]
        head = f"{marks[f.state]} {topic}{' ' * (pad - columns(topic))}  "
        found = _fitted(f.found, width - len(indent))
        lines += [head + found[0], *(indent + line for line in found[1:])] if f.found else [head.rstrip()]
        if f.fix:
            fix = _fitted(f"→ {f.fix}", width - len(indent) - 2)
            lines += [indent + fix[0], *(indent + "  " + line for line in fix[1:])]
    blocked = [topics[f.topic] for f in findings if f.state == "block"]
    lines.append(tr("✗ blocked: {topics}", topics=", ".join(blocked)) if blocked else tr("ready: `course check chNN` runs here"))
    return "\n".join(lines)


def _fitted(text: str, room: int) -> list[str]:
    """`text` as lines of at most `room` terminal columns (a Chinese character takes two; it breaks between them)."""
    from grader.terminal import wrap

    return [line.lstrip(" ") for line in wrap(text, max(room, 20))]


def exit_code(findings: list[Finding]) -> int:
    return 1 if any(f.state == "block" for f in findings) else 0


def to_json(findings: list[Finding]) -> dict:
    return {"version": version(), "findings": [asdict(f) for f in findings], "blocked": bool(exit_code(findings))}
