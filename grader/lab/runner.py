"""Running experiments on the student's code: one student process per experiment, newest request first.

Each experiment has a `Lane`: its own student process (a `Session`, forked from one warm
process), running one request at a time with the time and memory limits of `course check`.
A request that arrives while an older one of the same experiment runs or waits replaces
it: the waiting one returns at once as superseded, the running one is stopped by killing
its process (the next request gets a fresh one in milliseconds). A hang therefore costs
its own request the time limit and never holds up another experiment or a newer request.
The chapter module is loaded again whenever its file changes, so an edit shows on the
next change of a control. What a result says in words (a message, what the code printed, a note)
goes to the page with its control and format characters escaped (`shown`).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import os
import shutil
import signal
import tempfile
import threading
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from grader import chapters, checks
from grader.chapters import Chapter
from grader.delivery import escape
from grader.i18n import language, tr
from grader.isolation import budget, portable, procs
from grader.isolation.worker import OUTPUT_LIMIT, Worker
from grader.lab import Experiment, ParamError, catalog
from grader.lab.draw import TooWide, fit
from grader.run import DEFAULT_MEMORY_LIMIT, MissingModule, module_path, solutions_module

DEFAULT_TIME_LIMIT = checks.DEFAULT_TIME_LIMIT


class Superseded(Exception):
    """A newer request for the same experiment replaced this one."""


def shown(result: dict) -> dict:
    """A run's result as the page shows it (as text, in `textContent`): its message, what the student's
    code printed and the notes on its figures with their control and format characters escaped
    (`grader.delivery.escape.plain`), line breaks kept."""
    for key in ("message", "printed"):
        if isinstance(result.get(key), str):
            result[key] = escape.plain(result[key], lines=True)
    if isinstance(result.get("notes"), list):
        result["notes"] = [escape.plain(note, lines=True) for note in result["notes"]]
    return result


def _session_class():
    from grader.isolation.session import Session, StudentError

    class LabSession(Session):
        """A Session whose running call another thread can stop (by killing the student's process)."""

        cancelled = False

        def cancel(self) -> None:
            self.cancelled = True
            worker = self.worker
            if worker is not None and worker.req_w != -1:
                worker.killed_by_us = True
                try:
                    os.killpg(worker.pid, signal.SIGKILL)
                except OSError:
                    pass

        def _timed(self, header: dict, buffers: list[bytes], label: str, budget=None):
            if self.cancelled:
                raise Superseded()
            try:
                return super()._timed(header, buffers, label, budget)
            except StudentError:
                if self.cancelled:
                    raise Superseded() from None
                raise

    return LabSession


def shared_zygote(box=None):
    """The warm process every lane forks its student process from (its socket serves one thread at a time)."""
    from grader.isolation.zygote import Zygote

    class SharedZygote(Zygote):
        def __init__(self, **kwargs: Any) -> None:
            self._lock = threading.RLock()
            super().__init__(**kwargs)

        def start(self, **kwargs: Any) -> Worker:
            with self._lock:
                return super().start(**kwargs)

        def wait(self, pid: int, timeout: float) -> int | None:
            with self._lock:
                return super().wait(pid, timeout)

    return SharedZygote(box=box)


class Lane:
    """One experiment's student process and its newest request."""

    def __init__(self) -> None:
        self.session = None
        self.stamp: str | None = None
        self._turn = threading.Lock()  # one request at a time in the student's process
        self._state = threading.Lock()  # guards the fields below
        self._latest = 0
        self._running: int | None = None

    def submit(self, seq: int, work: Callable[["Lane"], dict]) -> dict:
        """Run `work(lane)` once the older requests are out of the way; a newer one replaces it."""
        with self._state:
            self._latest = seq
            if self._running is not None and self.session is not None:
                self.session.cancel()
        with self._turn:
            with self._state:
                if seq != self._latest:
                    return {"status": "superseded", "message": "a newer request replaced this one"}
                self._running = seq
                if self.session is not None:
                    self.session.cancelled = False
            try:
                return work(self)
            finally:
                with self._state:
                    self._running = None
                    if self.session is not None and self.session.cancelled:
                        self.session.close()
                        self.session = None

    def replace_session(self, session) -> None:
        with self._state:
            old, self.session = self.session, session
        if old is not None:
            old.close()

    def close(self) -> None:
        self.replace_session(None)


class Lab:
    """The experiments of every chapter, run on one target: exercises/, a submission folder or the solutions."""

    def __init__(
        self,
        *,
        solutions: bool = False,
        submission: Path | None = None,
        time_limit: float = DEFAULT_TIME_LIMIT,
        memory_limit: int = DEFAULT_MEMORY_LIMIT,
        launcher: Callable[..., Worker] | None = None,
        sandbox: str | None = None,
        reference: Callable[[Experiment], Any] | None = None,
    ) -> None:
        """`sandbox` ("bwrap") runs the code in a sandbox made for this lab (for a submission: somebody
        else's code); its chapter files are copied in, without following links, as they change.
        `reference(experiment)` gives an experiment's `t.ref` (default: the reference where this
        installation has it, else the answers recorded with the release); `course release` records with it."""
        import torch

        torch.set_num_threads(1)  # the student's processes compute beside us
        self.solutions, self.submission = solutions, Path(submission) if submission else None
        self.time_limit, self.memory_limit = time_limit, memory_limit
        self.catalog = catalog()
        self.workdir = Path(tempfile.mkdtemp(prefix="course-lab-"))
        self._zygote = None
        self.box = None
        if sandbox:
            from grader.isolation.sandbox import Box

            self.box = Box(sandbox, memory=memory_limit)
            self._zygote = shared_zygote(self.box)
            launcher = self._zygote.start
        if launcher is None and portable.can_fork():
            from grader.isolation.zygote import ZygoteError

            try:
                self._zygote = shared_zygote()
                launcher = self._zygote.start
            except ZygoteError:
                pass
        if launcher is None:  # the portable route, or no warm process could start: a fresh interpreter each time
            from grader.isolation import worker

            launcher = functools.partial(worker.start, root=chapters.ROOT)
        self.budget = self.box.budget if self.box is not None and self.box.budget is not None else budget.make(memory_limit)
        """One memory budget for every student process of this lab (`grader.isolation.budget`)."""
        self.spawn = functools.partial(launcher, workdir=self.workdir, output_limit=OUTPUT_LIMIT)
        self._lanes: dict[str, Lane] = {}
        self._lanes_lock = threading.Lock()
        self._seq = itertools.count(1)
        self._refs: dict[str, Any] = {}
        self._reference_of = reference
        procs.become_subreaper()

    # -- what the page shows about this lab --------------------------------------------------------
    @property
    def checked(self) -> bool:
        """Whether every instance has expected values here (the reference solutions; a student release has
        only the answers recorded with it)."""
        return any(chapters.SOLUTIONS.glob("ch[0-9][0-9]_*.py"))

    def target(self, ch: Chapter) -> Path:
        return module_path(ch, solutions=self.solutions, submission=self.submission)

    def describe(self) -> dict:
        folder = chapters.SOLUTIONS if self.solutions else self.submission or chapters.EXERCISES
        groups: dict[str, dict] = {}
        for exp in self.catalog.experiments.values():
            ch = chapters.find(exp.chapter)
            group = groups.setdefault(
                ch.id, {"id": ch.id, "title": ch.title_zh if language() == "zh" else ch.title_en, "file": ch.filename, "experiments": []}
            )
            group["experiments"].append(exp.to_json())
        return {
            "target": escape.plain(folder),  # a submission's folder: named by its student
            "mode": "solutions" if self.solutions else "submission" if self.submission else "exercises",
            "checked": self.checked,
            "time_limit": self.time_limit,
            "chapters": list(groups.values()),
        }

    # -- running -------------------------------------------------------------------------------------
    def run(self, experiment_id: str, raw: dict | None) -> dict:
        """Validate the page's instance, run the experiment on it and draw its figures (never raises)."""
        started = time.monotonic()
        try:
            exp = self.catalog.find(experiment_id)
        except chapters.UnknownName as e:
            return {"status": "invalid", "message": str(e), "errors": {}}
        try:
            params = exp.parse(raw)
        except ParamError as e:
            return {"status": "invalid", "message": tr("this instance cannot be drawn: {error}", error=e), "errors": e.errors}
        result = self._lane(exp.id).submit(next(self._seq), lambda lane: self._execute(exp, params, lane))
        result["elapsed"] = round(time.monotonic() - started, 4)
        return shown(result)

    def _lane(self, experiment_id: str) -> Lane:
        with self._lanes_lock:
            return self._lanes.setdefault(experiment_id, Lane())

    def _reference(self, ch: Chapter):
        """The chapter's `t.ref`: the reference where this installation has it, else a lookup of the answers
        recorded with the release (fresh for each run), else None."""
        from grader.authoring.reference import Live, Lookup, load_answers

        if ch.id not in self._refs:
            module = solutions_module(ch)
            answers = load_answers(ch.id) if module is None else None
            self._refs[ch.id] = Live(module) if module is not None else Lookup.index(answers) if answers else None
        found = self._refs[ch.id]
        return Lookup(found) if isinstance(found, dict) else found

    def _session(self, lane: Lane, path: Path):
        """The lane's student process, started again when the chapter file has changed since it was loaded."""
        from grader.run import read_module

        data = read_module(path)
        stamp = hashlib.sha256(data).hexdigest()
        if self.box is not None:  # the sandbox sees a copy, taken by this (trusted) side
            copy = self.box.inbox / path.name
            if not copy.is_file() or copy.read_bytes() != data:
                temp = copy.with_name(f".{copy.name}.new")
                temp.write_bytes(data)
                os.chmod(temp, 0o644)
                os.replace(temp, copy)
            path = copy
        if lane.session is None or lane.stamp != stamp:
            lane.replace_session(_session_class()(path, spawn=self.spawn, time_limit=self.time_limit, budget=self.budget))
            lane.stamp = stamp
        return lane.session

    def _execute(self, exp: Experiment, params: dict, lane: Lane) -> dict:
        from grader.authoring.compare import Blocked, CheckFailed
        from grader.authoring.spec import CheckSpec
        from grader.authoring.trial import Trial
        from grader.isolation.session import StudentError, StudentRaised

        ch = chapters.find(exp.chapter)
        try:
            path = self.target(ch)
        except MissingModule as e:
            return {"status": "error", "message": str(e)}
        session = self._session(lane, path)
        task = next((t.id for t in ch.tasks for name in exp.calls if name in t.names), "?")
        ref = self._reference_of(exp) if self._reference_of else self._reference(ch)
        records: dict[str, dict] = {}
        spec = CheckSpec(task, exp.id, lambda t: exp.body(t, params), hidden=False)
        trial = Trial(spec, session=session, ref=ref, seed=0, params={n: p for t in ch.tasks for n, p in t.params.items()}, figures=records)
        session.begin_check(exp.time_limit or self.time_limit)
        out: dict[str, Any] = {"status": "passed", "message": ""}
        try:
            spec.body(trial)
        except Superseded:
            return {"status": "superseded", "message": "a newer request replaced this one"}
        except CheckFailed as e:
            out.update(status="failed", message=str(e))
        except Blocked as e:
            out.update(status="blocked", message=str(e))
        except StudentRaised as e:
            out.update(status="todo" if e.not_implemented else "error", message=e.explain(task))
        except StudentError as e:
            out.update(status=e.status, message=str(e))
        except Exception as e:  # a result the experiment did not foresee (or a lab bug): shown, never a crash
            out.update(
                status="error",
                message=tr(
                    "the lab could not interpret your result; if your answer looks right, show this to your instructor ({kind}: {error})",
                    kind=type(e).__name__,
                    error=e,
                )
                + "\n"
                + traceback.format_exc(limit=-3),
            )
        out["printed"] = session.take_printed()
        # Compared: every figure's values were set beside expected ones (the reference's, the answers recorded
        # with the release, or what the instance makes known); otherwise only what needs no answer was checked.
        out["compared"] = all(record.get("checked", True) for record in records.values())
        if out["status"] == "passed" and not out["compared"]:
            out["status"] = "unchecked"
        out["figures"], out["notes"] = self._draw(exp, ch, params, records)
        out["calls"] = [f"{name} ({path.name})" for name in exp.calls]
        return out

    def _draw(self, exp: Experiment, ch: Chapter, params: dict, records: dict) -> tuple[list[dict], list[str]]:
        import figures

        specs = {s.id: s for s in figures.catalog(ch.id)}
        captions = exp.captions(params) if exp.captions else {}
        drawn, notes = [], []
        for fid in exp.figures:
            spec, record = specs[fid], records.get(fid)
            if record is None:
                continue
            missing = spec.missing(record)
            if missing:
                notes.append(tr("{figure}: drawn once {names} return the right shapes", figure=fid, names=", ".join(missing)))
                continue
            if fid in captions:  # (zh, en) or (zh, en, title) of this instance
                spec = replace(spec, zh=captions[fid][0], en=captions[fid][1], title=(*captions[fid], spec.title)[2])
            try:
                drawn.append({"id": fid, "svg": fit(spec, record)})
            except TooWide as e:
                notes.append(f"{fid}: {e}")
            except Exception as e:  # a drawing error never hides the verdict
                notes.append(tr("{figure}: could not be drawn ({kind}: {error})", figure=fid, kind=type(e).__name__, error=e))
        return drawn, notes

    def close(self) -> None:
        """Stop every student process and the warm process; remove the scratch folder."""
        with self._lanes_lock:
            lanes, self._lanes = list(self._lanes.values()), {}
        for lane in lanes:
            lane.close()
        if self._zygote is not None:
            self._zygote.close()
            self._zygote = None
        if self.box is not None:
            self.box.close()  # its budget with it
            self.box = None
        else:
            self.budget.close()
        shutil.rmtree(self.workdir, ignore_errors=True)
