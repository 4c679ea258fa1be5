"""A sandbox for untrusted submissions: bubblewrap (Debian's `bubblewrap`, the tool Flatpak uses).

The student's processes see a file system made of read-only mounts of the system
libraries, the Python installation and a minimal copy of the grader's harness,
the one submission being graded (read-only), a scratch folder, and a private
/tmp; no network, no IPC with the host. The reference solutions, the hidden
checks and other students' files are simply not there. Where bwrap is missing,
`available()` says why and grading falls back to process isolation alone.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from grader import chapters

HARNESS = ("__init__.py", "chapters.py", "child.py", "frames.py", "procs.py", "wire.py", "worker.py", "zygote.py")
"""The grader modules a student's process imports: no check, no answer, no solution among them."""
SYSTEM = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin")


def available() -> tuple[bool, str]:
    """Whether bwrap can sandbox here, and a sentence saying so (or why not)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return False, ("bubblewrap (bwrap) is not installed: student code runs with process isolation only and "
                       "could read this user's files and reach the network; install Debian's bubblewrap")
    probe = subprocess.run([bwrap, "--ro-bind", "/", "/", "--unshare-net", "--die-with-parent", "true"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return False, f"bwrap cannot make a sandbox here ({probe.stderr.strip()[:200]}): process isolation only"
    version = subprocess.run([bwrap, "--version"], capture_output=True, text=True).stdout.strip()
    return True, f"{version}: no network, only the submission and the Python installation visible"


def write_harness(dest: Path) -> Path:
    """Copy the harness modules into `dest/grader/`; `dest` is the root the student's process imports from."""
    package = dest / "grader"
    package.mkdir(parents=True, exist_ok=True)
    for name in HARNESS:
        shutil.copy2(chapters.ROOT / "grader" / name, package / name)
    return dest


def command(*, harness: Path, inbox: Path, scratch: Path) -> list[str]:
    """The bwrap command line that runs what follows it in the sandbox."""
    args = [shutil.which("bwrap") or "bwrap", "--die-with-parent", "--unshare-net", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup-try", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    for path in SYSTEM:
        if Path(path).exists():
            args += ["--ro-bind", path, path]
    for path in dict.fromkeys([sys.base_prefix, sys.prefix]):
        args += ["--ro-bind", path, path]
    args += ["--ro-bind", str(harness), str(harness), "--ro-bind", str(inbox), str(inbox),
             "--bind", str(scratch), str(scratch), "--chdir", str(scratch), "--"]
    return args
