"""A warm start for student processes: fork them from a process that has imported torch.

Starting an interpreter and importing torch costs about a second, paid once per
submission. A `Zygote` is a process that imports torch once, computes nothing
(a fork after torch has computed deadlocks; after a bare import it is safe), and
forks a student process on request in a few milliseconds. Each fork becomes
exactly what `grader.isolation.worker.start` makes: its own session, its own
limits, the pipes and the output file the grader opened and passed in, one thread.

The zygote runs inside the submission's sandbox (`grader.isolation.sandbox.Box`),
so every student process lives there too. It is not dumpable: the student
processes it forks (same uid) cannot read or write its memory, and so cannot change
the next process it forks. The grader believes nothing the zygote reports about the
student process but its pid inside the box, which it looks up in /proc itself.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, cast

from grader.isolation.worker import Worker

if TYPE_CHECKING:
    from collections.abc import Sequence

BOOT = (
    "import sys; sys.dont_write_bytecode = True; sys.path.insert(0, sys.argv[1]); "
    "from grader.isolation.zygote import serve; serve(int(sys.argv[2]), processes=int(sys.argv[3]))"
)
READY_TIMEOUT = 120.0
REPLY_TIMEOUT = 5.0
"""Seconds the warm process may take to answer (it only forks and waits; a stopped one is given up)."""
HARNESS_ROOT = Path(__file__).resolve().parent.parent.parent


class ZygoteError(RuntimeError):
    """The warm process did not start or stopped answering."""


class Zygote:
    """The grader's side of the warm process; `start` has the signature of `grader.isolation.worker.start`."""

    def __init__(self, *, box=None, log: Path | None = None, lazy: bool = False) -> None:
        """`box` is the sandbox it runs in (`grader.isolation.sandbox.Box`; a Box of kind None by default:
        no sandbox, for the student's own exercises and the tests); `log` collects what the warm process
        itself prints; `lazy` returns at once and waits for it to be ready on the first fork (so that
        its torch import overlaps the caller's)."""
        from grader.isolation.sandbox import LIMITS, Box

        self.box = box if box is not None else Box(None)
        self._own_box = box is None
        # in a bubblewrap box, a limit on the processes of the box's own user namespace (0: none, as on one's own machine)
        processes = LIMITS["processes"] if self.box.kind == "bwrap" else 0
        mine, theirs = socket.socketpair()
        out = open(log or self.box.logs / "zygote.log", "ab")
        root = self.box.harness if self.box.kind else HARNESS_ROOT
        try:
            self.proc = self.box.popen(
                [sys.executable, "-I", "-B", "-c", BOOT, str(root), str(theirs.fileno()), str(processes)],
                pass_fds=(theirs.fileno(),),
                stdout=out,
            )
        finally:
            theirs.close()
            out.close()
        self.sock = mine
        self._buffer = b""
        self.host_pid: int | None = None
        self.workdir = self.box.home
        if not lazy:
            self._await_ready()

    def _await_ready(self) -> None:
        """Wait for the warm process to have imported torch (once), and note the box's own processes."""
        if self.host_pid is not None:
            return
        self.sock.settimeout(READY_TIMEOUT)
        ready = self._receive()
        if ready.get("ready") is not True or type(ready.get("pid")) is not int:
            raise ZygoteError("the warm process did not start")
        self.sock.settimeout(REPLY_TIMEOUT)
        # Found now, before any student code has run: the box's one process that is this pid inside.
        self.host_pid = self.box.host_pid(ready["pid"]) or self.proc.pid
        self.box.frame = set(self.box.processes())
        self.box.settle()  # the box's memory budget: its limit on top of what the warm process holds now

    def _receive(self) -> dict:
        while b"\n" not in self._buffer:
            try:
                chunk = self.sock.recv(65536)
            except (TimeoutError, OSError) as e:
                raise ZygoteError(f"the warm process stopped answering ({e})") from None
            if not chunk:
                raise ZygoteError(f"the warm process ended (exit status {self.proc.poll()}; its output: {self._log_tail()!r})")
            self._buffer += chunk
            if len(self._buffer) > 1 << 16:
                raise ZygoteError("the warm process sent a reply far too long")
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            message = json.loads(line)
        except ValueError:
            raise ZygoteError("the warm process sent something unreadable") from None
        if type(message) is not dict:
            raise ZygoteError("the warm process sent something unreadable")
        return message

    def _log_tail(self) -> str:
        try:
            return (self.box.logs / "zygote.log").read_bytes()[-300:].decode(errors="replace")
        except OSError:
            return ""

    def _send(self, message: dict, fds: Sequence[int] = ()) -> None:
        data = json.dumps(message).encode() + b"\n"
        try:
            socket.send_fds(self.sock, [data], list(fds)) if fds else self.sock.sendall(data)
        except OSError as e:
            raise ZygoteError(f"the warm process is gone ({e})") from None

    def start(self, *, workdir: Path | None = None, output_limit: int, **_: object) -> Worker:
        """Fork a student process (what `grader.isolation.worker.start` makes, in milliseconds)."""
        self._await_ready()
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        log_path = self.box.logs / f"output-{time.monotonic_ns()}.log"
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        try:
            self._send({"op": "spawn", "cwd": self.workdir, "output": output_limit}, [req_r, rep_w, log])
            inner = self._receive().get("pid")
        except ZygoteError:
            for fd in (req_w, rep_r):
                os.close(fd)
            raise
        finally:
            for fd in (req_r, rep_w, log):
                os.close(fd)
        host = self.box.host_pid(inner, parent=self.host_pid) if type(inner) is int else None
        if host is None:
            os.close(req_w)
            os.close(rep_r)
            raise ZygoteError("the warm process's new student process is not to be found")
        return Worker(_Forked(self, host, cast(int, inner)), req_w, rep_r, log_path)  # found: an int

    def wait(self, inner: int, timeout: float) -> int | None:
        self._send({"op": "wait", "pid": inner, "timeout": timeout})
        self.sock.settimeout(timeout + REPLY_TIMEOUT)
        try:
            status = self._receive().get("status")
        finally:
            self.sock.settimeout(REPLY_TIMEOUT)
        return status if type(status) is int else None

    def close(self) -> None:
        try:
            self._send({"op": "exit"})
            self.proc.wait(timeout=5)
        except (ZygoteError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        self.sock.close()
        if self._own_box:
            self.box.close()


class _Forked:
    """A student process forked by a zygote: only the zygote can wait for it; `pid` is its host pid."""

    def __init__(self, zygote: Zygote, pid: int, inner: int) -> None:
        self.zygote, self.pid, self.inner = zygote, pid, inner

    def wait(self, timeout: float) -> int | None:
        try:
            return self.zygote.wait(self.inner, timeout)
        except ZygoteError:  # nobody left to ask: say it stopped answering
            return None


# -- inside the warm process ------------------------------------------------------------------------------
def serve(sock_fd: int, *, processes: int = 0) -> None:
    """Import torch, then fork a student process for every request until told to stop.

    `processes` > 0 (in a bubblewrap box): first a hard limit on the processes (and threads) this process and
    everything it forks may have, which the kernel counts per user namespace: per box, whatever uid it runs as.
    """
    if processes > 0:
        import resource

        resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
    from grader.isolation import child  # imports torch: nothing may be computed here before forking
    from grader.isolation.procs import become_subreaper, children

    _not_dumpable()
    become_subreaper()
    sock = socket.socket(fileno=sock_fd)
    live: set[int] = set()
    _reply(sock, {"ready": True, "pid": os.getpid()})
    while True:
        data, fds, _, _ = socket.recv_fds(sock, 65536, 3)
        if not data:
            os._exit(0)
        message = json.loads(data)
        if message["op"] == "exit":
            os._exit(0)  # nothing to tidy: an interpreter's orderly exit with torch loaded takes a second
        if message["op"] == "wait":
            status = _wait(message["pid"], message["timeout"])
            if status is not None:
                live.discard(message["pid"])
            _reply(sock, {"status": status})
            continue
        for stray in children() - live:  # left behind by a student process that was killed
            _kill(stray)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            try:
                sock.close()
                os.setsid()
                os.dup2(fds[2], 1)
                os.dup2(fds[2], 2)
                os.close(fds[2])
                os.chdir(message["cwd"])
                child.run(fds[0], fds[1], output=message["output"])
            except BaseException:
                import traceback

                traceback.print_exc()  # into the log, or the warm process's own output before that
                os._exit(1)
            finally:
                os._exit(0)
        for fd in fds:
            os.close(fd)
        live.add(pid)
        _reply(sock, {"pid": pid})


def _not_dumpable() -> None:
    """PR_SET_DUMPABLE 0: processes of the same uid cannot ptrace this one or open its /proc/PID/mem."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
    except Exception:
        pass


def _reply(sock: socket.socket, message: dict) -> None:
    sock.sendall(json.dumps(message).encode() + b"\n")


def _wait(pid: int, timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return -9  # reaped already (killed as a stray)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.005)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    except OSError:
        pass
