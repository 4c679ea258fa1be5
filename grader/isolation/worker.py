"""The grader's side of the student process: start it, talk to it, kill it.

`start` makes the child a fresh interpreter (`subprocess`, never a fork of the
grader: forking a process that has run torch code deadlocks); `grader.isolation.zygote`
forks it from a warm process that has only imported torch. Either way it talks
over two private pipes, so whatever the student's code prints goes to a log file
and can never be mistaken for a result, and it runs in its own session so that
killing it kills its process group. On the portable route (`grader.isolation.portable`:
macOS, Windows, or COURSE_PORTABLE=1) the pipes are the child's stdin and stdout, and
threads keep the deadlines that select() keeps elsewhere.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol, TypeVar

from grader.isolation import frames, portable

if TYPE_CHECKING:
    from collections.abc import Sequence

BOOT = "import sys; sys.path.insert(0, sys.argv[1]); from grader.isolation.child import main; main(sys.argv[2:])"
BOOT_STDIO = "import sys; sys.path.insert(0, sys.argv[1]); from grader.isolation.child import main_stdio; main_stdio(sys.argv[2:])"
MAX_REPLY_BYTES = 128 << 20
"""Bytes a reply may have in all: larger is a failed check, refused before it is read (a tensor may not describe
more either, whatever its strides: `grader.isolation.wire.MAX_TENSOR_BYTES`; this module imports no torch)."""
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


def start(*, root: Path, workdir: Path, output_limit: int, **_: object) -> "Worker":
    """A student process in a fresh interpreter, with no sandbox (about a second: it imports torch).

    For the student's own exercises and the tests; somebody else's code runs in a
    `grader.isolation.sandbox.Box`, forked by the zygote inside it.
    """
    from grader.isolation.sandbox import environment

    log_path = workdir / f"output-{time.monotonic_ns()}.log"
    if not portable.inherits_fds():
        return _start_stdio(root, workdir, output_limit, log_path, environment(str(workdir)))
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-B", "-c", BOOT, str(root), str(req_r), str(rep_w), str(output_limit)],
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


def _start_stdio(root: Path, workdir: Path, output_limit: int, log_path: Path, env: dict[str, str]) -> "Worker":
    """The portable route: the request pipe is the child's stdin, the reply pipe its stdout (`child.main_stdio`)."""
    if os.name == "nt":  # pragma: no cover - Windows: a DLL search path and a process group of its own
        env = {**os.environ, **env}
        options: dict = {"creationflags": getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0)}
    else:
        options = {"start_new_session": True}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-B", "-c", BOOT_STDIO, str(root), str(output_limit)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            cwd=workdir,
            env=env,
            **options,
        )
    assert proc.stdin is not None and proc.stdout is not None  # both are pipes, asked for above
    req_w, rep_r = os.dup(proc.stdin.fileno()), os.dup(proc.stdout.fileno())
    proc.stdin.close()
    proc.stdout.close()
    return Worker(_Popen(proc), req_w, rep_r, log_path, threaded=True)


class Worker:
    """One student process; `request` sends a frame and waits for the reply."""

    def __init__(self, process: Process, req_w: int, rep_r: int, log_path: Path, *, threaded: bool = False) -> None:
        """`threaded`: the pipes cannot be waited on with select() (the portable route): each exchange runs in
        a thread of its own and the deadline is kept by waiting for that thread."""
        self.process, self.req_w, self.rep_r, self.log_path = process, req_w, rep_r, log_path
        self.threaded = threaded
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
        if self.threaded:
            return self._request_threaded(header, buffers, timeout=timeout, max_bytes=max_bytes)
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

    def _request_threaded(
        self, header: dict, buffers: Sequence[bytes | bytearray | memoryview], *, timeout: float, max_bytes: int
    ) -> tuple[dict, list[bytearray]]:
        """`request` on the portable route: blocking reads and writes in a thread, the deadline kept here. A
        thread still blocked at the deadline ends when the caller kills the process (its pipe then closes)."""
        if not self.ready:
            _within(lambda: frames.read_frame(self.rep_r, max_bytes=1 << 16), START_TIMEOUT)
            self.ready = True

        def exchange() -> tuple[dict, list[bytearray]]:
            try:
                frames.write_frame(self.req_w, header, buffers)
            except OSError:
                raise frames.WireClosed("the student process is gone") from None
            return frames.read_frame(self.rep_r, max_bytes=max_bytes)

        reply, out = _within(exchange, timeout)
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

    def exit_reason(self, label: str = "") -> str:
        """Why the process ended, in words, once it has ended: a sentence about `label` (what was running: "causal_mask",
        "importing ch17_causal_masks.py"), or about the process without one."""
        from grader.i18n import tr  # here, not at the top: the sandbox's harness imports this module without grader.i18n

        code = self.process.wait(timeout=2)
        if code is None:
            return tr("{label} stopped answering", label=label) if label else tr("the process stopped answering")
        if code >= 0:
            last = self.printed_since(max(self.printed_size() - 300, 0)).strip().splitlines()
            if code and last:
                return tr(
                    "{label} ended the grading process with exit code {code} (os._exit or sys.exit?); its last output: {last}",
                    label=label or tr("the student process"),
                    code=code,
                    last=repr(last[-1]),
                )
            return tr(
                "{label} ended the grading process with exit code {code} (os._exit or sys.exit?)",
                label=label or tr("the student process"),
                code=code,
            )
        sig = -code
        if sig == signal.SIGXFSZ:
            return tr("{label} printed so much output that the output limit was reached", label=label or tr("the student process"))
        if sig == signal.SIGKILL and not self.killed_by_us:
            return tr("{label} was killed by the system (out of memory?)", label=label or tr("the student process"))
        return tr("{label} crashed (signal {signal})", label=label or tr("the student process"), signal=signal.Signals(sig).name)

    def kill(self) -> None:
        """Kill the process and everything in its session."""
        self.killed_by_us = True
        if self.threaded:
            portable.kill_tree(self.pid)
        for kill in (getattr(os, "killpg", None), os.kill):  # the process too: killed before its setsid, it has no group yet
            try:
                if kill is not None:
                    kill(self.pid, getattr(signal, "SIGKILL", signal.SIGTERM))
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


T = TypeVar("T")


def _within(work: Callable[[], T], timeout: float) -> T:
    """Run `work` in a thread and wait at most `timeout` seconds for it: frames.WireTimeout after that."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = work()
        except BaseException as e:  # handed to the waiting thread
            box["error"] = e

    thread = threading.Thread(target=run, name="course-student-pipe", daemon=True)
    thread.start()
    thread.join(max(timeout, 0.0))
    if thread.is_alive():
        raise frames.WireTimeout("no reply before the deadline")
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]
