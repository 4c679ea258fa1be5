"""The student's chapter module behind a process boundary.

A `Session` loads the module in a `Worker` process, sends calls, turns whatever
comes back (values, exceptions, timeouts, crashes, oversized replies) into data or
into `StudentRaised` / `StudentError`, and starts a fresh process after one is
killed, when asked (`fresh()`, before the hidden checks), and for a call whose
memory is measured. Every process it starts counts against the run's memory budget
(`grader.isolation.budget`), which is measured from outside.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from grader.i18n import tr
from grader.isolation import frames, wire
from grader.isolation.budget import DEFAULT_LIMIT, Budget
from grader.isolation.budget import make as make_budget
from grader.isolation.worker import OUTPUT_LIMIT, Worker

PRINTED_KEEP = 600


class StudentRaised(Exception):
    """The student's code raised; `error` is the exception as the student's process described it."""

    def __init__(self, label: str, error: dict) -> None:
        self.label, self.error = label, error
        super().__init__(tr("{label} raised {name}: {message}", label=label, name=error.get("name"), message=error.get("message")))

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
            return _missing(e)
        if self.not_implemented:
            m = re.search(r"\(about (\d+) lines?\)", e.get("message", ""))
            todo = "ch" + (task if self.not_implemented == "?" else self.not_implemented)
            if not m:
                return tr("not implemented yet ({task})", task=todo)
            n = int(m.group(1))
            return (
                tr("not implemented yet ({task}: about 1 line)", task=todo)
                if n == 1
                else tr("not implemented yet ({task}: about {n} lines)", task=todo, n=n)
            )
        if e.get("exit_code") is not None:
            return tr("{label} called sys.exit({code}); a graded function must return its result", label=self.label, code=e["exit_code"])
        head = tr("{label} raised {name}: {message}", label=self.label, name=e.get("name"), message=e.get("message"))
        if e.get("out_of_memory"):
            head = tr(
                "{label} ran out of memory (the system refused to give it that much): {message}", label=self.label, message=e.get("message")
            )
        where = "".join(
            "\n    " + tr("at {place} in {function}: {code}", place=_place(f, line), function=fn, code=code.strip())
            for f, line, fn, code in e.get("frames", [])
        )
        return head + where


def _missing(e: dict) -> str:
    """A function, method or attribute the student's module lacks, in words (the child's English when it names none)."""
    fields = e.get("missing_of") or {}
    kind = fields.get("kind")
    if kind == "function":
        return tr("your module has no function {name} (was it renamed or deleted?)", name=fields["name"])
    if kind == "method":
        return tr("your {owner} has no method {name} (was it renamed or deleted?)", owner=fields["owner"], name=fields["name"])
    if kind == "attribute":
        return tr("your {owner} has no attribute {name} (was it renamed or deleted?)", owner=fields["owner"], name=fields["name"])
    return tr("{message} (was it renamed or deleted?)", message=e.get("message"))


class StudentError(Exception):
    """The student's process misbehaved (timed out, crashed, left processes); `status` says how."""

    def __init__(self, status: str, message: str) -> None:
        self.status = status
        super().__init__(message)


class OverBudget(StudentError):
    """A call used more memory than it may: `used` bytes (at least, where it was stopped: `stopped`) against
    `allowed`, both measured by the budget from outside the student's processes."""

    def __init__(self, label: str, used: int, allowed: int, *, stopped: bool, what: str = "") -> None:
        self.label, self.used, self.allowed, self.stopped = label, used, allowed, stopped
        fields = {"label": label, "used": size(used), "allowed": size(allowed)}
        if what == "this check allows":
            if stopped:
                message = tr("{label} ran out of memory: it was stopped at {used}, all of the {allowed} this check allows", **fields)
            else:
                message = tr("{label} used {used}, more than the {allowed} this check allows", **fields)
        elif stopped:
            message = tr("{label} ran out of memory: it was stopped at {used}, all of the {allowed} it may use", **fields)
        else:
            message = tr("{label} used {used}, more than the {allowed} it may use", **fields)
        super().__init__("error", message)

    def beyond(self, inputs: int) -> str:
        """What the call used beyond `inputs` bytes (its inputs cross into its process and count), in words:
        "about 17 MiB" (measured: rounded, so that a regrade says the same), "at least 2 GiB" (stopped)."""
        n = max(self.used - inputs, 0)
        if self.stopped:
            return tr("at least {size}", size=size(n))
        rounded = f"{n / 2**30:.2g} GiB" if n >= 1 << 30 else f"{round(n / 2**20):,} MiB" if n >= 10 << 20 else size(n)
        return tr("about {size}", size=rounded)


@dataclass
class Call:
    """One call of student code: its value and its arguments afterwards."""

    value: Any
    args: list = field(default_factory=list)
    kwargs: dict = field(default_factory=dict)
    elapsed: float = 0.0
    peak: int | None = None
    """Bytes the call used at most (inputs and reply included), for a call whose memory was measured."""


class Session:
    """The student's chapter module loaded in a child process, restarted after a kill."""

    def __init__(
        self, path: Path, *, spawn: Callable[[], Worker], worker: Worker | None = None, time_limit: float, budget: Budget | None = None
    ) -> None:
        """`spawn()` starts a fresh student process; `worker`, if given, is one already starting; `budget`
        counts the memory of every process started (by default one of its own, `budget.make`); `time_limit` is the
        run's flat limit, which an import gets even where a check's own limit is shorter."""
        self.path, self.spawn, self.time_limit = path, spawn, time_limit
        self.import_limit = time_limit
        """Seconds an import may take: the run's flat limit, not the first check's calibrated one (a module that
        builds a table when imported is not a slow function, and a hog's import must reach its memory limit before
        its time runs out, on a loaded machine too)."""
        self._own_budget = budget is None
        self.budget = budget if budget is not None else make_budget(DEFAULT_LIMIT)
        self._kills_seen: dict[int, int] = {id(self.budget): self.budget.kills()}
        """Per budget (by id), its kills when last read: a failed request blames memory only for kills since."""
        self.worker: Worker | None = worker
        if worker is not None:
            self.budget.admit(worker.pid)
        self.loaded = False
        self.load_failure: StudentError | None = None
        self.printed: list[str] = []
        self._log_offset = 0
        self.time_left = time_limit
        if worker is None:
            self._spawn()

    def _spawn(self) -> None:
        try:
            self.worker = self.spawn()
        except Exception as e:  # the warm process is gone or stopped (the student's code may have signalled it)
            self.worker = None
            raise StudentError("error", tr("no process could be started for your code ({error})", error=e)) from None
        self.budget.admit(self.worker.pid)  # before the module loads: everything the student's code does counts
        self.loaded, self._log_offset = False, 0

    def fresh(self) -> None:
        """Let the next call start a new process: nothing of the old one's state reaches it."""
        self._kill()

    @property
    def pids(self) -> set[int]:
        return {self.worker.pid} if self.worker else set()

    @property
    def load_limit(self) -> float:
        """Seconds the module's import may take now: the run's flat limit, or the check's where that is longer."""
        return max(self.time_limit, self.import_limit)

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
                    tr("importing {file}", file=self.path.name),
                    self.load_limit,
                )
            except StudentRaised as e:  # not the call's exception: no check may accept it
                self.load_failure = StudentError("error", e.explain())
                raise self.load_failure from None
            except StudentError as e:
                self.load_failure = e
                raise
            self.loaded = True

    def _request(
        self, header: dict, buffers: list[bytes], label: str, timeout: float, budget: Budget | None = None
    ) -> tuple[dict, list[bytearray]]:
        worker = self.worker
        assert worker is not None  # started by _ensure_loaded
        budgets = [self.budget] + ([budget] if budget is not None else [])  # a measured call's, nested in the run's

        def over_budget(*, full: bool = False) -> OverBudget | None:
            """The budget that stopped the process since it was last asked, if one did (its kills are read only when a
            request fails: every process counted there is this run's); with `full`, also one that is nearly full now (a
            process out of time while the kernel, with no memory left to give, kept it waiting)."""
            stopped = []
            for b in budgets:
                kills, seen = b.kills(), self._kills_seen.get(id(b), 0)
                self._kills_seen[id(b)] = kills
                if kills > seen or (full and b.usage() - b.base >= 0.9 * (b.limit - b.base)):
                    stopped.append(b)
            if not stopped:
                return None
            b = stopped[0]  # what the submission used, on top of what the budget held before it ran (`Budget.base`)
            return OverBudget(label, max(b.peak(), b.usage()) - b.base, b.limit - b.base, stopped=True)

        try:
            reply, out = worker.request(header, buffers, timeout=max(timeout, 0.0))
        except frames.WireTimeout:
            over = over_budget(full=True)  # stopped by a budget, or out of time at the end of one (read before the kill)
            self._kill()
            if over:
                raise over from None
            raise StudentError(
                "timeout",
                tr(
                    "{label} did not finish within {limit:g} s (an endless loop, a sleep, or far too much work?)",
                    label=label,
                    limit=self.load_limit if header.get("op") == "load" else self.time_limit,
                ),
            ) from None
        except frames.WireClosed:
            reason = worker.exit_reason(label)
            self._kill()
            if over := over_budget():  # killed for its memory, by the kernel (cgroup) or the watchdog
                raise over from None
            raise StudentError("error", reason) from None
        except frames.FrameTooLarge as e:
            self._kill()
            raise StudentError(
                "error",
                tr(
                    "{label} sent back a result far too large ({error}): "
                    "graded functions return tensors of the sizes their docstrings give",
                    label=label,
                    error=e,
                ),
            ) from None
        except frames.WireError as e:
            self._kill()
            raise StudentError(
                "error", tr("{label}: the grading process sent back something unreadable ({error})", label=label, error=e)
            ) from None
        finally:
            self._collect_output()
        if not reply.get("ok"):
            error = reply.get("error") or {}
            if error.get("output_limit"):
                self._kill()  # its log is full: the next check gets a fresh process
                raise StudentError(
                    "error",
                    tr(
                        "{label} printed more than {limit} MiB: the output limit was reached (print less)",
                        label=label,
                        limit=OUTPUT_LIMIT >> 20,
                    ),
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

        With `memory` (bytes), the call's memory is measured: it runs in a fresh process (objects of
        earlier calls are gone) that loads the module, then gets a budget of its own nested in the run's
        (`Budget.measure`): the inputs, the call, every process it starts and its reply count, and
        `Call.peak` is what they used at most. Over `memory`, OverBudget (raised after the call; also
        when the run's whole budget stopped it first).
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
        failure = self.load_failure  # the fresh process's import fails this call only
        self._kill()
        self.load_failure = None
        self._spawn()
        measured: Budget | None = None
        try:
            self._ensure_loaded()
            assert self.worker is not None  # loaded above
            measured = self.budget.measure(self.worker.pid)
            call = self._timed(header, buffers, label, measured)
            call.peak = measured.peak()
        except OverBudget as e:  # stopped by a budget: the measured one, or the run's
            used = max(e.used, measured.peak() if measured else 0)
            raise OverBudget(label, used, memory, stopped=True, what="this check allows") from None
        finally:
            if measured is not None:
                measured.close()
                self._kills_seen.pop(id(measured), None)  # a later budget may take its id
            self._kill()
            self.load_failure = failure
        if call.peak > memory:
            raise OverBudget(label, call.peak, memory, stopped=False, what="this check allows")
        return call

    def attributes(self, handle: wire.Handle, names: list[str]) -> dict:
        """Read attributes of an object the module made (its observable state)."""
        return self._timed({"op": "getattr", "handle": handle.id, "names": list(names)}, [], f"{handle.type_name}.{'/'.join(names)}").value

    def _timed(self, header: dict, buffers: list, label: str, budget: Budget | None = None) -> Call:
        self._ensure_loaded()
        started = time.monotonic()
        try:  # reading the reply counts in the check's time
            reply, out = self._request(header, buffers, label, self.time_left, budget)
            result = wire.decode(reply["result"], out)
            return Call(result["value"], result["args"], result["kwargs"], float(reply.get("elapsed", 0.0)))
        except (frames.WireError, KeyError, TypeError, ValueError, RecursionError, MemoryError) as e:
            self._kill()
            error = f"{type(e).__name__}: {e}"
            raise StudentError("error", tr("{label}: its result could not be read ({error})", label=label, error=error)) from None
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
        if self._own_budget:
            self.budget.close()


def size(n: int) -> str:
    """Bytes for people: 2 GiB, 16.25 MiB, 512 KiB."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):,.4g} {unit}"
    return tr("{n} bytes", n=n)


def _place(filename: str, line: int) -> str:
    """Where a frame is, for a student: "ch25_paged_kv.py:76", or "answer cell ch25.2, line 31" for a
    notebook cell (grader.delivery.cells labels each cell's code with its name)."""
    if filename.startswith(("answer cell ", "code cell ", "In [")):
        return tr("{cell}, line {line}", cell=filename, line=line)
    return f"{Path(filename).name}:{line}"
