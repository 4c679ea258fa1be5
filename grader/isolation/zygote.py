"""A warm start for student processes: fork them from a process that has imported torch.

Starting an interpreter and importing torch costs about a second, paid once per
student process. A `Zygote` is a process that imports torch once, computes nothing
(a fork after torch has computed deadlocks; after a bare import it is safe), and
forks a student process on request in a few milliseconds. Each fork becomes
exactly what `grader.isolation.worker.start` makes: its own session, its own limits, the
same pipes and log file, one thread set before any torch operation.

The zygote can itself run inside a sandbox (`grader.isolation.sandbox`): every student
process forked from it then lives in that sandbox too.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from grader import chapters
from grader.isolation.worker import ENV, Worker

BOOT = "import sys; sys.path.insert(0, sys.argv[1]); from grader.isolation.zygote import serve; serve(int(sys.argv[2]))"
READY_TIMEOUT = 120.0


class ZygoteError(RuntimeError):
    """The warm process did not start or stopped answering."""


class Zygote:
    """The grader's side of the warm process; `start` has the signature of `grader.isolation.worker.start`."""

    def __init__(self, *, root: Path = chapters.ROOT, prefix: list[str] = (), log: Path | None = None,
                 scratch: Path | None = None) -> None:
        """`prefix` runs it under a sandbox command (bwrap …), where only `scratch` is writable: the
        student processes then work and log there, whatever folder they are given; `log` collects
        what the warm process itself prints."""
        self.scratch = scratch
        mine, theirs = socket.socketpair()
        out = open(log, "ab") if log else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen([*prefix, sys.executable, "-I", "-c", BOOT, str(root), str(theirs.fileno())],
                                         pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, env=dict(os.environ, **ENV), start_new_session=True)
        finally:
            theirs.close()
            if log:
                out.close()
        self.sock = mine
        self.sock.settimeout(READY_TIMEOUT)
        self._buffer = b""
        if self._receive().get("ready") is not True:
            raise ZygoteError("the warm process did not start")

    def _receive(self) -> dict:
        while b"\n" not in self._buffer:
            try:
                chunk = self.sock.recv(65536)
            except (TimeoutError, OSError) as e:
                raise ZygoteError(f"the warm process stopped answering ({e})") from None
            if not chunk:
                raise ZygoteError(f"the warm process ended (exit status {self.proc.poll()})")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def _send(self, message: dict, fds: list[int] = ()) -> None:
        data = json.dumps(message).encode() + b"\n"
        try:
            socket.send_fds(self.sock, [data], list(fds)) if fds else self.sock.sendall(data)
        except OSError as e:
            raise ZygoteError(f"the warm process is gone ({e})") from None

    def start(self, *, workdir: Path, memory_limit: int, output_limit: int, forbidden_dirs: list[Path]) -> Worker:
        """Fork a student process (what `grader.isolation.worker.start` makes, in milliseconds)."""
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        workdir = self.scratch or Path(workdir)
        log_path = workdir / f"output-{time.monotonic_ns()}.log"
        try:
            self._send({"op": "spawn", "log": str(log_path), "cwd": str(workdir), "memory": memory_limit,
                        "output": output_limit, "forbidden": [str(d) for d in forbidden_dirs]}, [req_r, rep_w])
            pid = self._receive()["pid"]
        finally:
            os.close(req_r)
            os.close(rep_w)
        return Worker(_Forked(self, pid), req_w, rep_r, log_path)

    def wait(self, pid: int, timeout: float) -> int | None:
        self._send({"op": "wait", "pid": pid, "timeout": timeout})
        return self._receive()["status"]

    def close(self) -> None:
        try:
            self._send({"op": "exit"})
            self.proc.wait(timeout=5)
        except (ZygoteError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        self.sock.close()


class _Forked:
    """A student process forked by a zygote: only the zygote can wait for it."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self.zygote, self.pid = zygote, pid

    def wait(self, timeout: float) -> int | None:
        try:
            return self.zygote.wait(self.pid, timeout)
        except ZygoteError:  # nobody left to ask: say it stopped answering
            return None


# -- inside the warm process ------------------------------------------------------------------------------
def serve(sock_fd: int) -> None:
    """Import torch, then fork a student process for every request until told to stop."""
    from grader.isolation import child  # imports torch: nothing may be computed here before forking
    from grader.isolation.procs import become_subreaper, children

    become_subreaper()
    sock = socket.socket(fileno=sock_fd)
    live: set[int] = set()
    _reply(sock, {"ready": True})
    while True:
        data, fds, _, _ = socket.recv_fds(sock, 65536, 2)
        if not data:
            return
        message = json.loads(data)
        if message["op"] == "exit":
            return
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
                log = os.open(message["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.dup2(log, 1)
                os.dup2(log, 2)
                os.chdir(message["cwd"])
                child.run(fds[0], fds[1], message["memory"], message["output"], message["forbidden"])
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
