"""The grader's side of the student process: start it, talk to it, kill it.

`start` makes the child a fresh interpreter (`subprocess`, never a fork of the
grader: forking a process that has run torch code deadlocks); `grader.isolation.zygote`
forks it from a warm process that has only imported torch. Either way it talks
over two private pipes, so whatever the student's code prints goes to a log file
and can never be mistaken for a result, and it runs in its own session so that
killing it kills its process group.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from grader.isolation import frames

if TYPE_CHECKING:
    from collections.abc import Sequence

BOOT = "import sys; sys.path.insert(0, sys.argv[1]); from grader.isolation.child import main; main(sys.argv[2:])"
MAX_REPLY_BYTES = 128 << 20
"""Bytes a reply may have in all: larger is a failed check, refused before it is read."""
START_TIMEOUT = 120.0
WRITE_TIMEOUT = 10.0
"""Seconds the student's process has to take in a request (a stopped one never does)."""
OUTPUT_LIMIT = 16 << 20
"""Bytes the student's process may print (RLIMIT_FSIZE on its output file)."""


class Process(Protocol):
    """What a Worker needs of the process it talks to."""

    pid: int

    def wait(self, timeout: float) -> int | None:
        """The exit status once it has ended (negative: the signal), None if still running after `timeout`."""


class _Popen:
    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc, self.pid = proc, proc.pid

    def wait(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None


def start(*, root: Path, workdir: Path, memory_limit: int, output_limit: int, memory_extra: int = 0, **_: object) -> "Worker":
    """A student process in a fresh interpreter, with no sandbox (about a second: it imports torch).

    For the student's own exercises and the tests; somebody else's code runs in a
    `grader.isolation.sandbox.Box`, forked by the zygote inside it.
    """
    from grader.isolation.sandbox import environment

    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    log_path = workdir / f"output-{time.monotonic_ns()}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-I",
                "-B",
                "-c",
                BOOT,
                str(root),
                str(req_r),
                str(rep_w),
                str(memory_limit),
                str(memory_extra),
                str(output_limit),
            ],
            pass_fds=(req_r, rep_w),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            env=environment(str(workdir)),
            start_new_session=True,
        )
    os.close(req_r)
    os.close(rep_w)
    return Worker(_Popen(proc), req_w, rep_r, log_path)


class Worker:
    """One student process; `request` sends a frame and waits for the reply."""

    def __init__(self, process: Process, req_w: int, rep_r: int, log_path: Path) -> None:
        self.process, self.req_w, self.rep_r, self.log_path = process, req_w, rep_r, log_path
        self.ready = False
        self.killed_by_us = False

    @property
    def pid(self) -> int:
        return self.process.pid

    def request(
        self, header: dict, buffers: Sequence[bytes | bytearray | memoryview] = (), *, timeout: float, max_bytes: int = MAX_REPLY_BYTES
    ) -> tuple[dict, list[bytearray]]:
        """Send one request; raise frames.WireTimeout / WireClosed / FrameTooLarge / WireError.

        Both directions have deadlines: the request must be taken in within WRITE_TIMEOUT
        (counted in `timeout` too), the reply must come within `timeout`.
        """
        if not self.ready:
            frames.read_frame(self.rep_r, deadline=time.monotonic() + START_TIMEOUT, max_bytes=1 << 16)
            self.ready = True
        deadline = time.monotonic() + timeout
        try:
            frames.write_frame(self.req_w, header, buffers, deadline=min(deadline, time.monotonic() + WRITE_TIMEOUT))
        except OSError:
            raise frames.WireClosed("the student process is gone") from None
        reply, out = frames.read_frame(self.rep_r, deadline=deadline, max_bytes=max_bytes)
        if type(reply) is not dict:
            raise frames.WireError("reply is not a record")
        return reply, out

    def printed_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def printed_since(self, offset: int, limit: int = 600) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                return f.read(limit).decode(errors="replace")
        except OSError:
            return ""

    def exit_reason(self) -> str:
        """Why the process ended, in words, once it has ended."""
        code = self.process.wait(timeout=2)
        if code is None:
            return "stopped answering"
        if code >= 0:
            last = self.printed_since(max(self.printed_size() - 300, 0)).strip().splitlines()
            said = f"; its last output: {last[-1]!r}" if code and last else ""
            return f"ended the grading process with exit code {code} (os._exit or sys.exit?){said}"
        sig = -code
        if sig == signal.SIGXFSZ:
            return "printed so much output that the output limit was reached"
        if sig == signal.SIGKILL and not self.killed_by_us:
            return "was killed by the system (out of memory?)"
        return f"crashed (signal {signal.Signals(sig).name})"

    def kill(self) -> None:
        """Kill the process and everything in its session."""
        self.killed_by_us = True
        for kill in (os.killpg, os.kill):  # the process too: killed before its setsid, it has no group yet
            try:
                kill(self.pid, signal.SIGKILL)
            except OSError:
                pass
        self.process.wait(timeout=5)
        self.close()

    def close(self) -> None:
        for fd in (self.req_w, self.rep_r):
            try:
                os.close(fd)
            except OSError:
                pass
        self.req_w = self.rep_r = -1
