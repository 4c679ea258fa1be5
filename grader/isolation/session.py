"""The student's chapter module behind a process boundary.

A `Session` loads the module in a `Worker` process, sends calls, turns whatever
comes back (values, exceptions, timeouts, crashes, oversized replies) into data or
into `StudentRaised` / `StudentError`, and starts a fresh process after one is
killed, when asked (`fresh()`, before the hidden checks), and for a call that runs
under a memory budget of its own.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from grader.isolation import frames, wire
from grader.isolation.worker import OUTPUT_LIMIT, Worker

PRINTED_KEEP = 600


class StudentRaised(Exception):
    """The student's code raised; `error` is the exception as the student's process described it."""

    def __init__(self, label: str, error: dict) -> None:
        self.label, self.error = label, error
        super().__init__(f"{label} raised {error.get('name')}: {error.get('message')}")

    def is_a(self, name: str) -> bool:
        return f"builtins.{name}" in self.error.get("types", ())

    @property
    def not_implemented(self) -> str | None:
        """The task id a stub's NotImplementedError names ("ch25.1"), if that is what this is."""
        if not self.is_a("NotImplementedError"):
            return None
        m = re.search(r"\bch(\d{2}\.\d+)\b", self.error.get("message", ""))
        return m.group(1) if m else "?"

    def explain(self, task: str = "?") -> str:
        """The exception in a student's words; `task` names a stub whose message names none."""
        e = self.error
        if e.get("missing"):
            return f"{e['message']} (was it renamed or deleted?)"
        if self.not_implemented:
            m = re.search(r"\((about \d+ lines?)\)", e.get("message", ""))
            todo = task if self.not_implemented == "?" else self.not_implemented
            return f"not implemented yet (ch{todo}{': ' + m.group(1) if m else ''})"
        if e.get("exit_code") is not None:
            return f"{self.label} called sys.exit({e['exit_code']}); a graded function must return its result"
        head = f"{self.label} raised {e.get('name')}: {e.get('message')}"
        if e.get("out_of_memory"):
            head = f"{self.label} ran out of memory (the limit is set by the grader): {e.get('message')}"
        where = "".join(f"\n    at {_place(f, line)} in {fn}: {code.strip()}" for f, line, fn, code in e.get("frames", []))
        return head + where


class StudentError(Exception):
    """The student's process misbehaved (timed out, crashed, left processes); `status` says how."""

    def __init__(self, status: str, message: str) -> None:
        self.status = status
        super().__init__(message)


@dataclass
class Call:
    """One call of student code: its value and its arguments afterwards."""

    value: Any
    args: list = field(default_factory=list)
    kwargs: dict = field(default_factory=dict)
    elapsed: float = 0.0


class Session:
    """The student's chapter module loaded in a child process, restarted after a kill."""

    def __init__(self, path: Path, *, spawn: Callable[..., Worker], worker: Worker | None = None, time_limit: float) -> None:
        """`spawn(memory_extra=0)` starts a fresh student process (with `memory_extra`, one whose address
        space is capped at its size plus that many bytes); `worker`, if given, is one already starting."""
        self.path, self.spawn, self.time_limit = path, spawn, time_limit
        self.worker: Worker | None = worker
        self.loaded = False
        self.load_failure: StudentError | None = None
        self.printed: list[str] = []
        self._log_offset = 0
        self.time_left = time_limit
        if worker is None:
            self._spawn()

    def _spawn(self, memory_extra: int = 0) -> None:
        try:
            self.worker = self.spawn(memory_extra=memory_extra) if memory_extra else self.spawn()
        except Exception as e:  # the warm process is gone or stopped (the student's code may have signalled it)
            self.worker = None
            raise StudentError("error", f"no process could be started for your code ({e})") from None
        self.loaded, self._log_offset = False, 0

    def fresh(self) -> None:
        """Let the next call start a new process: nothing of the old one's state reaches it."""
        self._kill()

    @property
    def pids(self) -> set[int]:
        return {self.worker.pid} if self.worker else set()

    def _ensure_loaded(self) -> None:
        if self.load_failure:
            raise self.load_failure
        if self.worker is None:
            self._spawn()
        if not self.loaded:
            try:
                self._request(
                    {"op": "load", "path": str(self.path), "name": f"student_{self.path.stem}"},
                    [],
                    f"importing {self.path.name}",
                    self.time_limit,
                )
            except StudentRaised as e:  # not the call's exception: no check may accept it
                self.load_failure = StudentError("error", e.explain())
                raise self.load_failure from None
            except StudentError as e:
                self.load_failure = e
                raise
            self.loaded = True

    def _request(self, header: dict, buffers: list[bytes], label: str, timeout: float) -> tuple[dict, list[bytearray]]:
        worker = self.worker
        assert worker is not None  # started by _ensure_loaded
        try:
            reply, out = worker.request(header, buffers, timeout=max(timeout, 0.0))
        except frames.WireTimeout:
            self._kill()
            raise StudentError(
                "timeout", f"{label} did not finish within {self.time_limit:g} s (an endless loop, a sleep, or far too much work?)"
            ) from None
        except frames.WireClosed:
            reason = worker.exit_reason()
            self._kill()
            raise StudentError("error", f"{label} {reason}") from None
        except frames.FrameTooLarge as e:
            self._kill()
            raise StudentError(
                "error",
                f"{label} sent back a result far too large ({e}): graded functions return tensors of the sizes their docstrings give",
            ) from None
        except frames.WireError as e:
            self._kill()
            raise StudentError("error", f"{label}: the grading process sent back something unreadable ({e})") from None
        finally:
            self._collect_output()
        if not reply.get("ok"):
            error = reply.get("error") or {}
            if error.get("output_limit"):
                self._kill()  # its log is full: the next check gets a fresh process
                raise StudentError(
                    "error", f"{label} printed more than {OUTPUT_LIMIT >> 20} MiB: the output limit was reached (print less)"
                )
            raise StudentRaised(label, error)
        return reply, out

    def _collect_output(self) -> None:
        if self.worker is None:
            return
        size = self.worker.printed_size()
        if size > self._log_offset and sum(map(len, self.printed)) < PRINTED_KEEP:
            self.printed.append(self.worker.printed_since(self._log_offset, PRINTED_KEEP))
        self._log_offset = size

    def _kill(self) -> None:
        if self.worker:
            self._collect_output()  # what it printed before it hung or crashed is often the clue
            self.worker.kill()
        self.worker = None

    def call(self, target: str | tuple[wire.Handle, str], args: list, kwargs: dict, *, memory: int = 0) -> Call:
        """Call a function of the module, or a method of an object it made, within the check's time left.

        With `memory` (bytes), the call runs in a process of its own whose address space is capped
        at the warm process's size plus `memory`: loading the module, the inputs, the call and its
        reply all count, and the kernel refuses anything beyond (objects of earlier calls are gone).
        """
        where: str | dict[str, object]
        if isinstance(target, str):
            label, where = target, target
        else:
            label, where = f"{target[0].type_name}.{target[1]}", {"handle": target[0].id, "method": target[1]}
        (args_tree, kwargs_tree), buffers = wire.encode([list(args), dict(kwargs)])
        header = {"op": "call", "target": where, "args": args_tree, "kwargs": kwargs_tree}
        if not memory:
            return self._timed(header, buffers, label)
        failure = self.load_failure  # an import that does not fit the budget fails this call only
        self._kill()
        self._spawn(memory_extra=memory)
        try:
            return self._timed(header, buffers, label)
        finally:
            self._kill()
            self.load_failure = failure

    def attributes(self, handle: wire.Handle, names: list[str]) -> dict:
        """Read attributes of an object the module made (its observable state)."""
        return self._timed({"op": "getattr", "handle": handle.id, "names": list(names)}, [], f"{handle.type_name}.{'/'.join(names)}").value

    def _timed(self, header: dict, buffers: list, label: str) -> Call:
        self._ensure_loaded()
        started = time.monotonic()
        try:  # reading the reply counts in the check's time
            reply, out = self._request(header, buffers, label, self.time_left)
            result = wire.decode(reply["result"], out)
            return Call(result["value"], result["args"], result["kwargs"], float(reply.get("elapsed", 0.0)))
        except (frames.WireError, KeyError, TypeError, ValueError, RecursionError, MemoryError) as e:
            self._kill()
            raise StudentError("error", f"{label}: its result could not be read ({type(e).__name__}: {e})") from None
        finally:
            self.time_left -= time.monotonic() - started

    def begin_check(self, time_limit: float) -> None:
        """Start a check's time budget: the seconds its calls may spend in student code
        (starting the process and importing the module do not count)."""
        self.time_limit = self.time_left = time_limit

    @property
    def time_used(self) -> float:
        """Seconds the current check has spent in student code so far."""
        return self.time_limit - self.time_left

    def take_printed(self) -> str:
        """What the student's code printed since the last call of this method."""
        text, self.printed = "".join(self.printed)[:PRINTED_KEEP], []
        return text

    def close(self) -> None:
        """End the student's process (killed: it holds nothing worth a clean exit)."""
        self._kill()


def _place(filename: str, line: int) -> str:
    """Where a frame is, for a student: "ch25_paged_kv.py:76", or "answer cell ch25.2, line 31" for a
    notebook cell (grader.delivery.cells labels each cell's code with its name)."""
    if filename.startswith(("answer cell ", "code cell ", "In [")):
        return f"{filename}, line {line}"
    return f"{Path(filename).name}:{line}"
