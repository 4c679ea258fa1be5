"""`course grade --scheduler tcp://HOST:PORT`: a class graded on a running Dask cluster (`dask.distributed`).

One task is one item (a student's chapter, `grader.delivery.grade.Item`). The client reads the answer itself
(`read_item`: bounds, no link followed; a malformed answer is its error row at once, never sent) and sends the
answer's bytes with everything the grading depends on, fixed once for the class in OUT/grading.json: the
student's seed, the chapter's time limits, the memory limit, the sandbox kind and the run's language. The
worker grades it exactly as a local job process does (`grade_answer`: the student's code in its own sandbox,
one grading at a time per worker process) and returns the results document and the figures' SVG texts as one
JSON text. The client parses and checks that text (its size, the document's fields, each figure's name and
size: no name from a worker is used as a path before it matches `FIGURE`), writes the figures through
`grader.delivery.files` and the item's folder atomically (`_write`), as each result arrives: a killed client or
a lost worker loses nothing, and a rerun resumes exactly as a local one does.

Refusals. Each worker answers with its course version, the fingerprint of the grading inputs (the hash of
grader/, the hidden checks among it, solutions/ and figures/) and whether it can make the sandbox asked for.
A worker that differs from the client, or cannot make the sandbox (unless --no-sandbox), is refused by name:
the client says so once and sends it nothing more; a worker that joins later checks the same on each task.

Failures. A worker that dies mid-task (killed, out of memory) is the scheduler's to handle: it runs the task
on another worker, up to its `distributed.scheduler.allowed-failures`, then the task ends in `KilledWorker`,
which is that item's error row (so a submission that kills every worker it meets costs one row, not the run).
A worker that spends longer than the item's deadline (the local run's, `ITEM_SLACK` plus each check's limit)
ends its own process, which the scheduler treats the same way. Any other failure of the cluster (a lost
connection, a cancelled task) is retried up to `ATTEMPTS` times, then is the item's error row. Every such row
is marked `"retry": true`, so the next run grades the item again. A run left with no worker it may use waits
for one to join (as an adaptive cluster scales up again) and says so after `NO_WORKER_NOTE` seconds, and again
when one is back: the client is never silent while nothing can move.

Trust. The students' code runs only inside a worker's sandbox; what reaches the client from it is the JSON
text described above. Dask's own messages between the client, the scheduler and the workers are pickled, so
the cluster must be the instructor's own (its machines run the course's code; `tls://` where it crosses a
network): the workers are trusted as the job processes are, the submissions are not.

Nothing imports dask until a cluster is asked for: `grader` and the student's path do not need it.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import json
import math
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeGuard

from grader import chapters
from grader.delivery import grade as grading
from grader.delivery.grade import GradeError, Item
from grader.i18n import tr

ATTEMPTS = 3
"""Times an item is sent to the cluster when the cluster itself fails it (not counting worker deaths, which the
scheduler retries on its own)."""
MAX_RESULT = 32 << 20
"""The most characters a worker's result may have (the document and the figures)."""
MAX_FIGURE, MAX_FIGURES = 4 << 20, 64
FIGURE = re.compile(r"figures/(ch[0-9]{2})/([A-Za-z0-9][A-Za-z0-9_.-]{0,120}\.svg)")
"""A figure's name in a result: figures/<chapter>/<name>.svg, nothing else."""
STATUSES = ("passed", "blocked", "not implemented", "incomplete", "failed", "error")
WINDOW_MIN, WINDOW_EVERY = 32, 2.0
"""Items sent ahead: four per worker thread, at least WINDOW_MIN (counted again every WINDOW_EVERY seconds), so
that the client holds few answers in memory and a worker that joins gets work at once."""
CONNECT_TIMEOUT = 30.0
"""Seconds to reach the scheduler and for a first worker to join it."""
NO_WORKER_NOTE, WORKERS_EVERY = 30.0, 5.0
"""Seconds with items out and no worker this run may use connected (a worker that died is started again by its
nanny in seconds) before the run says so; it goes on waiting, as an adaptive cluster scales up again. Asked every
WORKERS_EVERY seconds while nothing ends."""
FINGERPRINTED = ("grader", "solutions", "figures")
"""The course's folders whose files decide a grade: the checks (hidden ones included), the reference, the figures."""
FINGERPRINTED_KINDS = (".py", ".po", ".json", ".woff2")
"""The files among them that do: code, the messages' translations, recorded answers, the figures' fonts (not an
editor's backup or the lab's page)."""


# -- what each side is ---------------------------------------------------------------------------------------
def course_version() -> str:
    """The installed course's version (its package metadata), or "unknown"."""
    from importlib import metadata

    try:
        return metadata.version("course")
    except metadata.PackageNotFoundError:
        return "unknown"


@functools.cache
def fingerprint() -> str:
    """The SHA-256 of the grading inputs: every file of `FINGERPRINTED_KINDS` under `FINGERPRINTED` (hidden files
    and __pycache__ aside), by path and content. Two machines grade alike when their fingerprints are equal."""
    digest = hashlib.sha256()
    for top in FINGERPRINTED:
        base = chapters.ROOT / top
        for path in sorted(base.rglob("*")):
            inside = path.relative_to(base).parts
            if path.suffix in FINGERPRINTED_KINDS and path.is_file() and not any(p.startswith(".") or p == "__pycache__" for p in inside):
                digest.update(str(path.relative_to(chapters.ROOT)).encode() + b"\0")
                digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def identity(sandbox: str | None) -> dict:
    """What a machine is, for the client to compare with its own: the course version, the grading inputs'
    fingerprint and, for `sandbox` (a kind, or None for none), the sandbox's description or why none can be made."""
    me: dict[str, Any] = {"course": course_version(), "fingerprint": fingerprint(), "sandbox": None, "no_sandbox": None}
    if sandbox:
        from grader.isolation.sandbox import SandboxUnavailable, probe

        try:
            me["sandbox"] = probe(sandbox)
        except SandboxUnavailable as e:
            me["no_sandbox"] = str(e)
    return me


def refusal(worker: str, theirs: dict, ours: dict) -> str | None:
    """Why the client refuses a worker (its identity `theirs`, the client's `ours`), or None."""
    if (theirs.get("course"), theirs.get("fingerprint")) != (ours["course"], ours["fingerprint"]):
        return tr(
            "worker {worker} refused: it has course {theirs} (grading inputs {their_print}), this client course {ours} "
            "(grading inputs {our_print}); install the same course there",
            worker=worker,
            theirs=theirs.get("course"),
            their_print=str(theirs.get("fingerprint"))[:12],
            ours=ours["course"],
            our_print=ours["fingerprint"][:12],
        )
    if theirs.get("no_sandbox"):
        return tr(
            "worker {worker} refused: it cannot make a sandbox for the students' code ({why}); or grade with --no-sandbox",
            worker=worker,
            why=theirs["no_sandbox"],
        )
    return None


# -- the worker's side -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Task:
    """One item as a worker gets it: the answer's bytes and all the grading depends on (plain data)."""

    item: Item
    source: bytes
    seed: int
    limits: dict
    """The chapter's time limits, as recorded in grading.json."""
    memory_limit: int
    sandbox: str | None
    lang: str
    course: str
    fingerprint: str
    seconds: float
    """The deadline: past it the worker ends its own process (the scheduler then retries the task elsewhere)."""


_one_at_a_time = threading.Lock()
"""A worker process grades one item at a time, whatever its number of threads (a grading sets the process's
language and temporary folder)."""


def grade_task(task: Task) -> str:
    """Grade one item on this worker: a JSON text holding the results document and the figures' SVG texts, or
    this worker's refusal (another course, no sandbox). Never raises for the submission's sake."""
    from distributed import get_worker

    from grader.i18n.choose import set_language

    worker = get_worker()
    with _one_at_a_time:
        me = identity(task.sandbox)
        why = refusal(worker.address, me, {"course": task.course, "fingerprint": task.fingerprint})
        if why:
            return json.dumps({"refused": why, "worker": worker.address, "identity": me})
        set_language(task.lang)
        scratch = tempfile.mkdtemp(prefix="course-grade-")  # where a local job's goes (TMPDIR, /tmp)
        os.chmod(scratch, 0o711)  # as a local job's: a sandbox of kind "uid" reaches its own folder inside
        partial = Path(scratch) / "result"
        partial.mkdir()
        item = task.item
        config = grading._Config(
            out=scratch,
            seeds={item.student: task.seed},
            limits={item.chapter: task.limits},
            memory_limit=task.memory_limit,
            sandbox=task.sandbox,
            scratch=scratch,
        )
        watchdog = threading.Timer(task.seconds, _overrun, args=(worker.address, task.seconds))
        watchdog.daemon = True
        before, tempfile.tempdir = tempfile.tempdir, scratch  # check()'s folders too: removed with it
        start = time.perf_counter()
        watchdog.start()
        try:
            try:
                doc = grading.grade_answer(item, task.source, config, partial)
            except Exception as e:
                grading._complain(item, "", _trace())
                error = f"{type(e).__name__}: {str(e)[:300]}"
                message = tr("the grader failed on this submission ({error}); a rerun grades it again", error=error)
                doc = grading.error_doc(item, message, seed=task.seed, retry=True)
            figures = {rel: (partial / rel).read_text(encoding="utf-8") for rel in doc.get("figures", [])}
            took = time.perf_counter() - start
        finally:
            watchdog.cancel()
            tempfile.tempdir = before
            shutil.rmtree(scratch, ignore_errors=True)
        return json.dumps({"doc": doc, "figures": figures, "worker": worker.address, "seconds": took}, ensure_ascii=False)


def _trace() -> str:
    import traceback

    return traceback.format_exc()


def _overrun(worker: str, seconds: float) -> None:
    """The worker's grading ran past its deadline: end this worker process (its nanny starts a new one)."""
    print(f"course grade: worker {worker}: grading took over {seconds:.0f} s; ending this worker process", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


# -- the client's side -----------------------------------------------------------------------------------------
class BadResult(ValueError):
    """A worker's result that is not what `grade_task` returns; the message says what is wrong."""


def parse_result(text: object, item: Item) -> tuple[dict, dict[str, str], str, float]:
    """A worker's result, checked: the document, its figures (name -> SVG text), the worker and the seconds it
    took. BadResult when anything is not as `grade_task` makes it (the client writes nothing of it then)."""
    if not isinstance(text, str) or len(text) > MAX_RESULT:
        raise BadResult(tr("not a JSON text of at most {mib} MiB", mib=MAX_RESULT >> 20))
    try:
        data = json.loads(text)
    except ValueError:
        raise BadResult(tr("not JSON")) from None
    if not isinstance(data, dict):
        raise BadResult(tr("not a JSON object"))
    worker, seconds = data.get("worker"), data.get("seconds")
    doc, figures = data.get("doc"), data.get("figures")
    if not isinstance(worker, str) or len(worker) > 300 or not _number(seconds):
        raise BadResult(tr("no worker address or time"))
    if not isinstance(doc, dict) or doc.get("chapter") != item.chapter:
        raise BadResult(tr("no results document of {chapter}", chapter=item.chapter))
    score, max_score, status, tests = doc.get("score"), doc.get("max_score"), doc.get("status"), doc.get("tests")
    if not (_number(score) and _number(max_score) and 0 <= score <= max_score):
        raise BadResult(tr("its score is not a number from 0 to the maximum"))
    if status not in STATUSES or (status == "error") != isinstance(doc.get("error"), str):
        raise BadResult(tr("its status is not one of the grader's"))
    if not isinstance(tests, list) or not all(isinstance(t, dict) for t in tests):
        raise BadResult(tr("its tests are not a list of results"))
    named = doc.get("figures")
    if not isinstance(figures, dict) or not isinstance(named, list) or sorted(named) != sorted(figures) or len(named) > MAX_FIGURES:
        raise BadResult(tr("its figures are not the ones its document names"))
    for name, svg in figures.items():
        match = FIGURE.fullmatch(name) if isinstance(name, str) else None
        if not match or match[1] != item.chapter or not isinstance(svg, str) or len(svg) > MAX_FIGURE:
            raise BadResult(tr("a figure's name or size is not a figure's"))
    return doc, figures, worker, float(seconds)


def _number(x: object) -> TypeGuard[float]:
    """A JSON number that is one (not a boolean, not NaN or infinite)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def write_result(out: Path, item: Item, doc: dict, figures: dict[str, str]) -> dict:
    """Write a checked result (`parse_result`) into OUT atomically: the figures through `grader.delivery.files`
    into the item's partial folder, then its results.json and feedback.html, renamed into place. Its grades row."""
    from grader.delivery.files import Folder

    partial = grading._partial(out, item, os.getpid())
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        for name, svg in figures.items():
            match = FIGURE.fullmatch(name)
            assert match  # parse_result checked it
            with Folder.open(partial, "figures", match[1]) as folder:
                folder.write(match[2], svg)
        return grading._write(out, item, doc, partial)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


@dataclass
class WorkerLog:
    """What one worker graded in this run, and how long each took."""

    items: list[tuple[str, str, float]] = field(default_factory=list)
    """(student, chapter, seconds), in the order they came."""

    @property
    def seconds(self) -> float:
        return sum(s for _, _, s in self.items)


class Cluster:
    """A connection to a Dask scheduler, with the workers vetted for this run (`connect`)."""

    def __init__(self, client, sandbox: str | None, how: str, on_note: Callable[[str], None] | None, address: str = "") -> None:
        self.client = client
        self.address = address
        self.sandbox = sandbox
        self.how = how
        self.on_note = on_note
        self.ours = {"course": course_version(), "fingerprint": fingerprint()}
        self.refused: dict[str, str] = {}
        self.log: dict[str, WorkerLog] = collections.defaultdict(WorkerLog)

    @classmethod
    def connect(cls, address: str, sandbox: str | None, on_note: Callable[[str], None] | None = None) -> Cluster:
        """Reach the scheduler at `address`, wait for a worker, and vet every worker: the same course and grading
        inputs as here, and the sandbox `sandbox` (a kind, or None for none). GradeError when no worker is fit."""
        try:
            from distributed import Client
            from distributed.comm import get_address_host_port
        except ImportError as e:
            raise GradeError(tr("--scheduler needs dask.distributed: pip install 'course[grading]' ({error})", error=e)) from None
        try:
            get_address_host_port(address)  # before a Client, which would hang at exit over an address it cannot use
            client = Client(address, timeout=CONNECT_TIMEOUT, set_as_default=False)
        except (OSError, ValueError) as e:  # unreachable (a timeout is an OSError), or no address
            raise GradeError(tr("cannot reach the scheduler at {address}: {error}", address=address, error=e)) from None
        try:
            try:
                client.wait_for_workers(1, timeout=CONNECT_TIMEOUT)
            except TimeoutError:
                raise GradeError(
                    tr("no worker joined the scheduler at {address} in {seconds:.0f} s", address=address, seconds=CONNECT_TIMEOUT)
                ) from None
            self = cls(client, sandbox, "", on_note, address)
            fit = self.vet()
            if not fit:
                raise GradeError(
                    tr("no worker of {address} can grade this class: {reasons}", address=address, reasons="; ".join(self.refused.values()))
                )
            if sandbox:
                self.how = tr("{n} workers of {address}, each: {sandbox}", n=len(fit), address=address, sandbox=fit[0][1]["sandbox"])
            else:
                self.how = tr(
                    "none: sandbox switched off (--no-sandbox): student code runs with process isolation only "
                    "and could read this user's files and reach the network"
                )
            return self
        except BaseException:
            client.close()
            raise

    def vet(self) -> list[tuple[str, dict]]:
        """Ask every worker what it is; refuse (and say so, once) those unfit. The fit ones, with their identity."""
        answers = self.client.run(identity, self.sandbox, on_error="return")
        fit = []
        for worker, theirs in sorted(answers.items()):
            if not isinstance(theirs, dict):  # it could not even say (a course without this module, say)
                error = _short(theirs) if isinstance(theirs, BaseException) else type(theirs).__name__
                self.refuse(
                    worker,
                    tr(
                        "worker {worker} refused: it cannot say which course it has ({error}); install the same course there",
                        worker=worker,
                        error=error,
                    ),
                )
                continue
            why = refusal(worker, theirs, self.ours)
            if why:
                self.refuse(worker, why)
            else:
                fit.append((worker, theirs))
        return fit

    def refuse(self, worker: str, why: str) -> None:
        if worker not in self.refused:
            self.refused[worker] = why
            if self.on_note:
                self.on_note(why)

    def usable(self) -> list[str]:
        """The workers connected now that are not refused."""
        return [w for w in self.client.scheduler_info(n_workers=-1)["workers"] if w not in self.refused]

    def allowed(self) -> list[str] | None:
        """The workers a task may go to: all (None) while none was refused, else the others of those connected."""
        if not self.refused:
            return None
        workers = self.usable()
        if not workers:
            raise GradeError(tr("every worker of the cluster was refused: {reasons}", reasons="; ".join(self.refused.values())))
        return workers

    def close(self) -> None:
        self.client.close()

    def grade(
        self,
        todo: list[Item],
        config: dict,
        out: Path,
        on_item: Callable[[Item, dict], None] | None,
        seconds: Callable[[Item], float],
        *,
        task_function: Callable[[Task], str] | None = None,
    ) -> None:
        """Grade `todo` on the cluster, writing each result into `out` as it arrives and telling `on_item(item,
        row)` (in the order they finish). `task_function` is what the workers run, `grade_task` unless told (a
        trivial one measures the client's own cost per item: tests/bench/grade_dask.py)."""
        from distributed import as_completed
        from distributed.scheduler import KilledWorker

        from grader.delivery.submission import SubmissionError
        from grader.i18n.choose import language

        lang = language()
        pending = collections.deque((item, 0) for item in todo)
        running: dict[Any, tuple[Item, int, Task]] = {}
        finished = as_completed(loop=self.client.loop, with_results=True, raise_errors=False)  # results fetched as they end
        counter = 0

        def done(item: Item, result: dict) -> None:
            if on_item:
                on_item(item, result)

        def error_row(item: Item, why: str) -> None:
            doc = grading.error_doc(item, why, seed=config["seeds"][item.student], retry=True)
            done(item, grading._write(out, item, doc))

        def send(item: Item, attempt: int, task: Task) -> None:
            nonlocal counter
            counter += 1
            key = f"course-grade-{os.getpid()}-{counter}"
            future = self.client.submit(
                task_function or grade_task, task, key=key, pure=False, workers=self.allowed(), allow_other_workers=False
            )
            running[future] = (item, attempt, task)
            finished.add(future)

        window, counted = 0, -math.inf

        try:
            while pending or running:
                if pending and time.monotonic() - counted > WINDOW_EVERY:  # workers come and go
                    window, counted = max(WINDOW_MIN, 4 * sum(self.client.nthreads().values())), time.monotonic()
                while pending and len(running) < window:
                    item, attempt = pending.popleft()
                    try:
                        answer = grading.read_item(item)
                    except SubmissionError as e:  # malformed: its row at once, nothing sent
                        done(item, grading._write(out, item, grading.error_doc(item, str(e), seed=config["seeds"][item.student])))
                        continue
                    task = Task(
                        item=item,
                        source=answer.source,
                        seed=config["seeds"][item.student],
                        limits=config["limits"][item.chapter],
                        memory_limit=config["memory_limit"],
                        sandbox=config["sandbox"],
                        lang=lang,
                        course=self.ours["course"],
                        fingerprint=self.ours["fingerprint"],
                        seconds=seconds(item),
                    )
                    send(item, attempt, task)
                if not running:
                    continue
                future, text = self._next(finished, running, len(running) + len(pending))
                item, attempt, task = running.pop(future)
                if future.status == "finished":
                    future.release()
                    try:
                        refused = json.loads(text) if isinstance(text, str) and text.startswith('{"refused"') else None
                    except ValueError:
                        refused = None
                    if refused and isinstance(refused.get("refused"), str):
                        self.refuse(str(refused.get("worker"))[:300], refused["refused"][:2000])
                        send(item, attempt, task)  # not the item's fault: another worker
                        continue
                    try:
                        doc, figures, worker, took = parse_result(text, item)
                    except BadResult as e:
                        error_row(item, tr("a worker sent a result that is not valid ({why}); a rerun grades it again", why=e))
                        continue
                    self.log[worker].items.append((grading._text(item.student), item.chapter, took))
                    done(item, write_result(out, item, doc, figures))
                    continue
                error = future.exception() if future.status == "error" else None
                future.release()
                if isinstance(error, KilledWorker):
                    error_row(
                        item,
                        tr(
                            "the workers grading this submission died each time ({error}); the rest of the class was graded, "
                            "a rerun grades it again",
                            error=_short(error),
                        ),
                    )
                elif attempt + 1 < ATTEMPTS:
                    send(item, attempt + 1, task)
                else:
                    why = _short(error) if error is not None else tr("the task was cancelled")
                    error_row(
                        item,
                        tr(
                            "the cluster failed {n} times to grade this submission ({error}); a rerun grades it again",
                            n=ATTEMPTS,
                            error=why,
                        ),
                    )
        finally:
            for future in running:
                future.cancel()
            for item, _, _ in running.values():  # interrupted: nothing of it is half-written
                shutil.rmtree(grading._partial(out, item, os.getpid()), ignore_errors=True)

    def _next(self, finished, running: dict, left: int) -> tuple[Any, Any]:
        """The next task to end and its result (`finished`: an `as_completed` of the tasks in `running`). While
        none ends and no worker this run may use is connected, say so once NO_WORKER_NOTE seconds have passed
        (`left` items not graded yet), and once more when one is back."""
        from distributed import wait

        alone, said = None, False
        while not finished.has_ready():
            try:
                with self.client.as_current():  # `wait` asks for the current client: this one, never another
                    wait(list(running), timeout=WORKERS_EVERY, return_when="FIRST_COMPLETED")
                break  # one ended: its result comes next
            except TimeoutError:
                pass
            if self.usable():
                if said and self.on_note:
                    self.on_note(tr("a worker joined the scheduler at {address}: grading goes on", address=self.address))
                alone, said = None, False
            elif alone is None:
                alone = time.monotonic()
            elif not said and time.monotonic() - alone >= NO_WORKER_NOTE:
                said = True
                if self.on_note:
                    self.on_note(
                        tr(
                            "no worker that may grade this class has been connected to the scheduler at {address} for "
                            "{seconds:.0f} s, and {n} items are not graded yet: the run waits for one to join (start "
                            "workers, or press Ctrl-C: what was graded is kept, and the same command grades the rest)",
                            address=self.address,
                            seconds=NO_WORKER_NOTE,
                            n=left,
                        )
                    )
        return next(finished)

    def summary(self) -> dict[str, dict]:
        """Which worker graded what and how long each took: address -> items, seconds in all, the slowest item."""
        return {
            worker: {
                "items": len(log.items),
                "seconds": round(log.seconds, 3),
                "slowest": max(log.items, key=lambda x: x[2]),
                "graded": log.items,
            }
            for worker, log in sorted(self.log.items())
        }


def _short(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error)[:300]}"
