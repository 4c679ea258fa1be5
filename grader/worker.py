"""The grader's side of the student process: start it, talk to it, kill it.

The child is a fresh interpreter (`subprocess`, never `fork`: forking a process
that has run torch code deadlocks). It talks over two private pipes, so whatever
the student's code prints goes to a log file and can never be mistaken for a
result. It runs in its own session so that killing it kills its process group.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from grader import frames

BOOT = "import sys; sys.path.insert(0, sys.argv[1]); from grader.child import main; main(sys.argv[2:])"
MAX_REPLY_BYTES = 512 << 20
START_TIMEOUT = 120.0
OUTPUT_LIMIT = 16 << 20
"""Bytes the student's process may print (RLIMIT_FSIZE on its output file)."""


class Worker:
    """One student process; `request` sends a frame and waits for the reply."""

    def __init__(self, *, root: Path, workdir: Path, memory_limit: int, output_limit: int,
                 forbidden_dirs: list[Path]) -> None:
        req_r, self.req_w = os.pipe()
        self.rep_r, rep_w = os.pipe()
        self.log_path = workdir / f"output-{time.monotonic_ns()}.log"
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1",
                   PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-c", BOOT, str(root), str(req_r), str(rep_w),
                 str(memory_limit), str(output_limit), os.pathsep.join(map(str, forbidden_dirs))],
                pass_fds=(req_r, rep_w), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=workdir, env=env, start_new_session=True)
        os.close(req_r)
        os.close(rep_w)
        self.ready = False
        self.killed_by_us = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def request(self, header: dict, buffers: list[bytes] = (), *, timeout: float) -> tuple[dict, list[bytes]]:
        """Send one request; raise frames.WireTimeout / WireClosed / WireError."""
        if not self.ready:
            frames.read_frame(self.rep_r, deadline=time.monotonic() + START_TIMEOUT)
            self.ready = True
        try:
            frames.write_frame(self.req_w, header, buffers)
        except OSError:
            raise frames.WireClosed("the student process is gone") from None
        reply, out = frames.read_frame(self.rep_r, deadline=time.monotonic() + timeout, max_bytes=MAX_REPLY_BYTES)
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
        try:
            code = self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return "stopped answering"
        if code is None or code >= 0:
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
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self.close()

    def close(self) -> None:
        for fd in (self.req_w, self.rep_r):
            try:
                os.close(fd)
            except OSError:
                pass
        self.req_w = self.rep_r = -1
