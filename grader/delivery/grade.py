"""`course grade`: a whole class, chapter by chapter, resumable and sandboxed.

SUBMISSIONS_DIR holds one folder or one zip per student (`alice/`, `alice.zip`: student
`alice`) with that student's chapter modules (the file names of exercises/) or chapter
notebooks (`ch25.ipynb`), at the top, one folder down (`alice/ch25/ch25_paged_kv.py`, as an
LMS download has it) or, when no other file could be meant, under a name that names the
chapter (`alice/ch25.py`): `grader.delivery.layout` says exactly what is accepted, and what a zip must
satisfy (it is never extracted). Each answer is read by the trusted side with
`grader.delivery.submission` (no link followed, size bounds, any malformed file one clear error) and
graded by `grader.run.check` in a sandbox made for that one submission and torn down before
its result is written. A check that met the stub's NotImplementedError is marked `"todo"` in
results.json, and an item whose only failures are those is "not implemented" (nothing passed:
an untouched stub) or "incomplete", not "failed".

Order. The items are graded in parallel jobs; grades.csv, the rows `on_item` hears (what
`course grade` prints) and the summary all come alphabetically by student (case aside),
then by chapter (`InOrder` says why and what it costs).

Results. `OUT/<student>/<chapter>/results.json` (the Gradescope document) is written
atomically, with the figures beside it and `feedback.html`, the page to hand back to the student
(`grader.delivery.feedback`: the messages and the figures inline, self-contained). A student folder whose name is one of OUT's own
files (`grades.csv`, `grading.json`, `summary.md`, `summary.json`, `summary-histogram.svg`,
`nbgrader-staged.json`, compared case-insensitively), or such a name after leading
underscores, is stored under that name with one more `_` in front (`OUT/_grades.csv/ch17/`),
so that no two students share a folder and no student's folder takes the place of OUT's
files (`results_dir`). Everything else (`grades.csv`, the class summary of `grader.delivery.summary`)
is rebuilt from those files, so a run killed at any moment and started again ends with
exactly what one uninterrupted run writes. The run's secret, each student's grading seed and the
per-check time limits are fixed for the whole class in `OUT/grading.json`.

Seeds. Each student's hidden checks run on a seed of their own (`grader.delivery.seeds`): the HMAC of
the student's name (the folder or zip name) under the run's secret, recorded in grading.json and in
the student's results.json. A rerun or a resumed run uses the recorded seed, so it meets the same
instances; hidden instances one student leaks help nobody else.

One student never ends the run. Every malformed answer (no file, a link, a FIFO, too
large, not UTF-8, not a notebook, not Python) is one row with status "error: <why>",
recorded like a grade (a rerun keeps it unless the answer found is now another file;
`--force` grades again). Anything unexpected while grading one item, and a job process
that dies (killed from outside, a crash) or runs far over its time, costs that item only:
its row says so, the job process is replaced and the others go on; such a row is marked `"retry": true` and the next run
grades that item again. Folders whose name starts with a dot (`.alice`,
`.ipynb_checkpoints`) are not graded: each gets a row saying so (not recorded in OUT).
Other entries of SUBMISSIONS_DIR that are not folders or zips are ignored, except a symbolic
link, which gets an error row (links are never followed), an archive of another kind
(`alice.tar.gz`), whose row says to zip it, and a folder and a zip of the same student
(`alice/`, `alice.zip`), whose row says to keep one. Student names may hold any
character: OUT's folders keep the name as it is, and every text shows it escaped for where it
goes (`grader.delivery.escape`): a control or format character as its escape (`\\x1b`) in grades.csv, in
results.json's messages, on the terminal, in summary.md and feedback.html; in grades.csv a cell that
a spreadsheet would run as a formula (starting with = + - @) starts with a single quote instead.

The job processes are plain processes of this one, each grading one item at a time (a
process that dies is replaced); with `scheduler`, a Dask cluster's workers grade instead, each item
as a job process would (`grade_answer`), and this process writes what they send back
(`grader.delivery.cluster`). Each keeps all its temporary files (the submission it
grades, what `grader.run.check` and the sandbox make) in one folder of its own, which
the run removes when the process dies and when the run ends, also when it is interrupted
(Ctrl-C, SIGTERM).
"""

from __future__ import annotations

import collections
import csv
import io
import json
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path
from typing import Callable

from grader import chapters, checks
from grader.chapters import Chapter
from grader.delivery import escape
from grader.delivery.summary import HISTOGRAM, histogram_svg, summarize, summary_markdown
from grader.i18n import tr, tr_in

STATE = "grading.json"
RESERVED = ("grades.csv", "grading.json", "summary.md", "summary.json", HISTOGRAM, "nbgrader-staged.json")
"""OUT's own files: a student folder of one of these names is stored with a `_` in front."""
SLACK, FLOOR = 50.0, 0.5
"""A check may spend SLACK times what the reference needs in it, at least FLOOR seconds and at
most the class's time limit: a hanging submission then costs seconds, not minutes."""
ITEM_SLACK, CHECK_SLACK = 180.0, 10.0
"""A job process that spends longer on one item than ITEM_SLACK seconds plus, per check, its time
limit and CHECK_SLACK is stopped: that item gets an error row, the class goes on."""
STOP_GRACE = 15.0
"""Seconds a job process has to clean up (its sandbox, its folders) when the run is interrupted."""


class GradeError(RuntimeError):
    """The class cannot be graded as asked (an unknown folder, a secret that differs from the recorded one)."""


@dataclass(frozen=True)
class Item:
    """One student's one chapter: where the answer is, or why there is none."""

    student: str
    chapter: str
    folder: str
    """SUBMISSIONS_DIR."""
    name: str | None = None
    """The answer's path in the student's folder (`ch25_paged_kv.py`, `ch25/ch25_paged_kv.py`), or
    its member name in the student's zip."""
    problem: str | None = None
    """Why it cannot be graded (no answer, the student's folder is a link...)."""
    recorded: bool = True
    """False for a row that is not kept in OUT (a dot-folder's)."""
    archive: str | None = None
    """The student's zip in SUBMISSIONS_DIR (`alice.zip`) when the answer is in one."""
    renamed: bool = False
    """The answer's file name is not the chapter's own (`grader.delivery.layout`, rung 3)."""

    @property
    def where(self) -> str | None:
        """The answer as the instructor finds it: `alice/ch25/ch25_paged_kv.py`, `alice.zip: ch25.py`."""
        if not self.name:
            return None
        return f"{self.archive}: {self.name}" if self.archive else f"{self.student}/{self.name}"

    @property
    def source(self) -> str | None:
        where = self.where
        return os.path.join(self.folder, where) if where else None


def results_dir(out: Path, student: str, chapter: str) -> Path:
    """Where a student's result of a chapter lives: OUT/<student>/<chapter>, the student's folder
    name escaped (one more leading `_`) when it is, or could shadow, one of OUT's own files."""
    folder = "_" + student if student.lstrip("_").casefold() in RESERVED else student
    return Path(out) / folder / chapter


def find_items(submissions: Path, chosen: list[Chapter]) -> list[Item]:
    """Every (student, chapter) pair, alphabetically by student (case aside), with the answer
    found by `grader.delivery.layout` (nothing followed) or why there is none. A student is a folder of
    SUBMISSIONS_DIR or a zip in it (`alice.zip` is student `alice`); a symbolic link gets an error
    row, an archive of another kind a row saying to zip it, and other files are not students."""
    from grader.delivery.layout import OTHER_ARCHIVES

    if not submissions.is_dir():
        raise GradeError(tr("{folder} is not a folder of student folders", folder=submissions))
    students: dict[str, list[tuple[str, str]]] = collections.defaultdict(list)  # student -> (entry, kind)
    with os.scandir(submissions) as listing:
        for entry in listing:
            try:
                is_dir, is_link = entry.is_dir(follow_symlinks=False), entry.is_symlink()
                is_file = entry.is_file(follow_symlinks=False)
            except OSError:
                continue
            name = entry.name
            lower = name.lower()
            archive = next((s for s in OTHER_ARCHIVES if lower.endswith(s) and len(name) > len(s)), None)
            if lower.endswith(".zip") and len(name) > 4 and (is_file or is_link):
                students[name[:-4]].append((name, "link" if is_link else "zip"))
            elif is_dir or is_link:
                students[name].append((name, "link" if is_link else "folder"))
            elif is_file and archive:
                students[name[: -len(archive)]].append((name, "other archive"))
            # any other file beside the student folders is not a student
    items = []
    for student in sorted(students, key=lambda s: (_text(s).casefold(), s)):  # as shown, case aside
        items += _items_of(submissions, student, students[student], chosen)
    return items


def _items_of(submissions: Path, student: str, entries: list[tuple[str, str]], chosen: list[Chapter]) -> list[Item]:
    """One student's items: the answer to each chapter in their folder or zip, or why not."""
    from grader.delivery.layout import folder_tree, locate, open_zip, zip_tree
    from grader.delivery.submission import SubmissionError, open_folder

    def problem(why: str, recorded: bool = True) -> list[Item]:
        return [Item(student, ch.id, str(submissions), problem=_text(why), recorded=recorded) for ch in chosen]

    if student.startswith("."):
        shown = _text(entries[0][0]) + ("/" if entries[0][1] == "folder" else "")
        return problem(
            tr(
                "{name} was skipped: its name starts with a dot (a hidden folder, such as .ipynb_checkpoints); rename it to grade it",
                name=shown,
            ),
            recorded=False,
        )
    if len(entries) > 1:
        names = [_text(e) + ("/" if kind == "folder" else "") for e, kind in sorted(entries)]
        fields = {"first": tr_in("list", ", ").join(names[:-1]), "last": names[-1], "folder": submissions.name, "student": _text(student)}
        return problem(tr("{first} and {last} are both in {folder}/, each could be {student}'s submission: keep one of them", **fields))
    ((entry, kind),) = entries
    if kind == "other archive":
        return problem(
            tr(
                "{entry}: only zip files are opened; make it {student}.zip, or unpack it into a folder {student}/",
                entry=_text(entry),
                student=_text(student),
            )
        )
    archive = entry if kind == "zip" or entry.lower().endswith(".zip") else None
    top = _open_dir(submissions)
    try:
        if archive:
            zipped = open_zip(top, entry)
            try:
                tree = zip_tree(zipped)
            finally:
                zipped.close()
            where = tr("{zip} (in its folder {folder}/)", zip=_text(entry), folder=_text(tree.top)) if tree.top else _text(entry)
        else:
            folder_fd = open_folder(entry, dir_fd=top)
            try:
                tree = folder_tree(folder_fd)
            finally:
                os.close(folder_fd)
            where = f"{_text(entry)}/"
    except SubmissionError as e:
        return problem(str(e))
    items = []
    for ch in chosen:
        try:
            found = locate(tree, ch, where)
        except SubmissionError as e:
            items.append(Item(student, ch.id, str(submissions), problem=_text(str(e)), archive=archive))
            continue
        items.append(Item(student, ch.id, str(submissions), tree.name_of(found.path), archive=archive, renamed=found.renamed))
    return items


_dirs: dict[str, int] = {}


def _open_dir(path: Path) -> int:
    """SUBMISSIONS_DIR, opened once per run (it is the instructor's: followed if a link)."""
    key = str(path)
    if key not in _dirs:
        _dirs[key] = os.open(path, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    return _dirs[key]


def _close_dirs() -> None:
    while _dirs:
        os.close(_dirs.popitem()[1])


def read_item(item: Item):
    """The answer an item amounts to (`grader.delivery.submission.Answer`), or SubmissionError saying why
    it cannot be graded."""
    from grader.delivery.layout import read_found
    from grader.delivery.submission import SubmissionError

    if item.problem:
        raise SubmissionError(item.problem)
    assert item.name is not None  # an item has an answer or a problem
    return read_found(
        _open_dir(Path(item.folder)), item.archive or item.student, item.name, chapters.find(item.chapter), archive=item.archive is not None
    )


# -- one job process -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Config:
    out: str
    seeds: dict[str, int]
    """Each student's grading seed (`grader.delivery.seeds`), as recorded in grading.json."""
    limits: dict
    memory_limit: int
    sandbox: str | None
    scratch: str
    """The job's own temporary folder, where all its temporary files go (made and removed by the run)."""


def _job_main(conn, config: _Config) -> None:
    """A job process: grade the items the run sends, one at a time, until it sends None."""
    signal.signal(signal.SIGTERM, _stop)  # how the run ends us: as Ctrl-C does, so that every finally runs
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # a run started with Ctrl-C ignored (`… &` in a
        signal.signal(signal.SIGINT, _stop)  # script) ignores it in every job too, never losing items alone
    tempfile.tempdir = config.scratch  # check()'s folders and sandboxes too: the run removes them even if we die
    try:
        while True:
            try:
                item = conn.recv()
            except (EOFError, OSError):
                return
            if item is None:
                return
            conn.send(_grade(item, config))
    except KeyboardInterrupt:
        return


def _stop(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once (Ctrl-C, then the run's SIGTERM): the cleanup
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # this starts (the sandbox, the folders) runs to its end
    raise KeyboardInterrupt


def _grade(item: Item, config: _Config) -> dict:
    """Grade one item in this job process, write its folder atomically and return its grades row;
    never raises (an unexpected exception becomes the item's error row)."""
    out = Path(config.out)
    partial = _partial(out, item, os.getpid())
    try:
        return _write(out, item, _document(item, config, partial), partial)
    except Exception as e:
        shutil.rmtree(partial, ignore_errors=True)
        _complain(item, "", traceback.format_exc())
        error = f"{type(e).__name__}: {str(e)[:300]}"
        doc = error_doc(
            item,
            tr("the grader failed on this submission ({error}); a rerun grades it again", error=error),
            seed=config.seeds[item.student],
            retry=True,
        )
        try:
            return _write(out, item, doc)
        except Exception:
            return row(item.student, doc)


def _document(item: Item, config: _Config, partial: Path) -> dict:
    from grader.delivery.submission import SubmissionError

    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        answer = read_item(item)
    except SubmissionError as e:
        return error_doc(item, str(e), seed=config.seeds[item.student])
    return grade_answer(item, answer.source, config, partial)


def grade_answer(item: Item, source: bytes, config: _Config, partial: Path) -> dict:
    """The results document of an item whose answer (`source`, read by `read_item`) is graded here, in the
    sandbox `config` names, its figures drawn into the folder `partial`. A job process runs it, and so does
    a cluster's worker (`grader.delivery.cluster`), which gets the answer's bytes from the client."""
    from grader.run import check

    ch = chapters.find(item.chapter)
    inbox = Path(tempfile.mkdtemp(prefix="inbox-", dir=config.scratch))
    try:
        (inbox / ch.filename).write_bytes(source)
        limits = config.limits[ch.id]
        report = check(
            ch.id,
            submission=inbox,
            source=source,
            hidden=True,
            seed=config.seeds[item.student],
            figures_dir=partial / "figures",
            time_limit=limits["max"],
            time_limits=limits["checks"],
            memory_limit=config.memory_limit,
            sandbox=config.sandbox,
        )
    finally:
        shutil.rmtree(inbox, ignore_errors=True)
    doc = report.to_json()
    for test, result in zip(doc["tests"], report.results):
        if result.todo:
            test["todo"] = True  # the stub's NotImplementedError: "not implemented" in the summary
    assert item.source is not None and item.where is not None  # read above: it has an answer
    doc["target"] = _text(item.source)
    doc["answer"] = _text(item.where)
    if item.renamed:
        doc["renamed"] = True
    doc["status"] = status_of(report)
    doc["figures"] = [str(Path(p).relative_to(partial)) for p in report.figures]
    doc.pop("execution_time", None)
    return doc


def status_of(report) -> str:
    """A graded item's status: "passed", "blocked", "not implemented" (every check that did not pass
    met the stub's NotImplementedError, and none passed: an untouched stub), "incomplete" (the
    same, but some passed) or "failed"."""
    if report.exit_code != 1:
        return {0: "passed", 2: "blocked"}[report.exit_code]
    bad = [r for r in report.results if r.status != "passed"]
    if bad and all(r.todo for r in bad):
        return "incomplete" if len(bad) < len(report.results) else "not implemented"
    return "failed"


def error_doc(item: Item, message: str, *, seed: int | None, retry: bool = False) -> dict:
    """The results document of an item that could not be graded: no points, and why."""
    ch = chapters.find(item.chapter)
    max_score = sum(s.points for s in checks.load(ch.id, with_hidden=True))
    message = escape.plain(_text(message), lines=True)  # results.json's text: no control character of a name
    doc = {
        "chapter": ch.id,
        "score": 0.0,
        "max_score": max_score,
        "status": "error",
        "error": message,
        "seed": seed,
        "tests": [
            {
                "name": tr("{chapter} submission", chapter=ch.id),
                "score": 0,
                "max_score": max_score,
                "status": "failed",
                "output": message,
                "visibility": "visible",
            }
        ],
        "figures": [],
    }
    if item.source:
        doc["target"] = _text(item.source)
    doc["answer"] = _text(item.where) if item.where else None
    if retry:
        doc["retry"] = True
    return doc


def _partial(out: Path, item: Item, pid: int) -> Path:
    final = results_dir(out, item.student, item.chapter)
    return final.parent / f".{item.chapter}.partial-{pid}"


def _write(out: Path, item: Item, doc: dict, partial: Path | None = None) -> dict:
    """Write an item's folder (results.json, and the figures already in `partial`) atomically."""
    final = results_dir(out, item.student, item.chapter)
    if partial is None:
        partial = _partial(out, item, os.getpid())
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    (partial / "results.json").write_bytes(_utf8(escape.json_document(json.dumps(doc, ensure_ascii=False, indent=1))))
    (partial / "feedback.html").write_bytes(_utf8(feedback_page(item, doc, partial)))
    if final.is_dir() and not final.is_symlink():
        shutil.rmtree(final)
    elif final.exists() or final.is_symlink():
        final.unlink()
    os.replace(partial, final)
    return row(item.student, doc)


def feedback_page(item: Item, doc: dict, folder: Path) -> str:
    """The student's feedback.html (`grader.delivery.feedback.page`): the document and the figures in `folder`.
    A page that cannot be made never costs the grade: it then says so, and results.json holds everything."""
    import html

    from grader.delivery.feedback import page

    try:
        figures = {Path(rel).stem: (folder / rel).read_text(encoding="utf-8") for rel in doc.get("figures", []) if (folder / rel).is_file()}
        return page(doc, figures, student=_text(item.student))
    except Exception as e:
        _complain(item, ": feedback.html", traceback.format_exc())
        said = tr(
            "score {score:g}/{max_score:g}; this page could not be made ({error}): results.json beside it holds the grade "
            "and every message.",
            score=float(doc.get("score", 0)),
            max_score=float(doc.get("max_score", 0)),
            error=type(e).__name__,
        )
        return (
            f'<!doctype html>\n<html><head><meta charset="utf-8"><title>{html.escape(item.chapter)}</title></head><body>'
            f"<p>{html.escape(said)}</p></body></html>\n"
        )


def _complain(item: Item, what: str, trace: str) -> None:
    """Say on stderr that the grader failed on an item: its student escaped for the terminal, and the
    traceback too (its exception may quote the submission)."""
    lines = [escape.terminal(line) for line in trace.splitlines()]
    print(f"course grade: {escape.terminal(_text(item.student))}/{item.chapter}{what}:", *lines, sep="\n", file=sys.stderr, flush=True)


def row(student: str, doc: dict) -> dict:
    """A grades.csv row (as data: unescaped) from a results document."""
    return {
        "student": _text(student),
        "chapter": doc["chapter"],
        "score": doc["score"],
        "max_score": doc["max_score"],
        "status": doc["status"] if doc["status"] != "error" else f"error: {doc['error']}",
    }


def _text(s: str) -> str:
    """A name or message as text that can be written anywhere: bytes of a file name that are not
    UTF-8 as \\xNN escapes."""
    try:
        return s.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate no file name makes
        return _utf8(s).decode("utf-8")


def _utf8(text: str) -> bytes:
    """UTF-8, with whatever is not text (a lone surrogate) as a backslash escape (in JSON, the same one)."""
    return text.encode("utf-8", "backslashreplace")


# -- the job processes, from the run's side ----------------------------------------------------------------
class _Job:
    """One job process and the item it is grading."""

    def __init__(self, context, config: _Config) -> None:
        self.conn, theirs = context.Pipe()
        self.proc = context.Process(target=_job_main, args=(theirs, config), name="course-grade-job", daemon=True)
        self.proc.start()
        theirs.close()
        self.item: Item | None = None
        self.deadline = 0.0
        self.scratch = config.scratch

    def give(self, item: Item, seconds: float) -> None:
        self.conn.send(item)
        self.item, self.deadline = item, time.monotonic() + seconds

    def stop(self, grace: float) -> None:
        """End the process: ask (None), then SIGTERM (it cleans up), then SIGKILL."""
        if self.proc.is_alive():
            try:
                if self.item is None:
                    self.conn.send(None)
                else:
                    self.proc.terminate()
            except OSError:
                pass
            self.proc.join(grace)
            if self.proc.is_alive():
                self.proc.terminate()
                self.proc.join(grace)
            if self.proc.is_alive():
                self.proc.kill()
        self.proc.join()
        self.conn.close()


def _death(exitcode: int | None) -> str:
    """Why an item was lost when its grading process died, one whole sentence (in the run's language)."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            return tr(
                "the grading process died (killed by signal {signal}) while grading this submission; the rest of the class "
                "was graded, a rerun grades it again",
                signal=-exitcode,
            )
        return tr(
            "the grading process died (killed by signal {signal} ({name})) while grading this submission; the rest of "
            "the class was graded, a rerun grades it again",
            signal=-exitcode,
            name=name,
        )
    return tr(
        "the grading process died (exit status {status}) while grading this submission; the rest of the class was "
        "graded, a rerun grades it again",
        status=exitcode,
    )


def _run_jobs(
    todo: list[Item], jobs: int, config: dict, out: Path, on_item: Callable[[Item, dict], None] | None, seconds: Callable[[Item], float]
) -> None:
    """Grade `todo` in at most `jobs` job processes, telling `on_item(item, row)` as each item is
    written (in the order they finish); a process that dies or hangs costs its item only."""
    context = multiprocessing.get_context("spawn")
    pending = collections.deque(todo)
    running: list[_Job] = []
    scratch: list[str] = []

    def new_job() -> _Job:
        folder = tempfile.mkdtemp(prefix="course-grade-")
        os.chmod(folder, 0o711)  # a sandbox of kind "uid" reaches its own folder inside (it cannot list this one)
        scratch.append(folder)
        return _Job(context, _Config(scratch=folder, **config))

    def lost(job: _Job, why: str) -> None:
        item = job.item
        assert item is not None  # a busy job's
        shutil.rmtree(_partial(out, item, job.proc.pid), ignore_errors=True)
        shutil.rmtree(job.scratch, ignore_errors=True)  # what it left: the submission, its sandbox's folders
        doc = error_doc(item, why, seed=config["seeds"][item.student], retry=True)
        try:
            result = _write(out, item, doc)
        except OSError:  # its row still says why; the next run grades it again
            result = row(item.student, doc)
        if on_item:
            on_item(item, result)

    try:
        while pending or any(j.item for j in running):
            while pending and sum(j.item is not None for j in running) < jobs:
                idle = next((j for j in running if j.item is None), None)
                if idle is None:
                    idle = new_job()
                    running.append(idle)
                item = pending.popleft()
                try:
                    idle.give(item, seconds(item))
                except OSError:  # died before it got the item: try another process
                    pending.appendleft(item)
                    idle.item = None
                    running.remove(idle)
                    idle.stop(0)
            busy = [j for j in running if j.item is not None]
            wait([j.conn for j in busy] + [j.proc.sentinel for j in busy], timeout=1.0)
            for job in busy:
                assert job.item is not None  # busy
                result, gone = None, False
                try:
                    if job.conn.poll():
                        result = job.conn.recv()
                except (EOFError, OSError):  # its end of the pipe closed: it is ending
                    gone = True
                if result is not None:
                    item, job.item = job.item, None
                    if on_item:
                        on_item(item, result)
                elif gone or not job.proc.is_alive():
                    job.proc.join(STOP_GRACE)
                    if job.proc.is_alive():
                        job.proc.kill()
                        job.proc.join()
                    lost(job, _death(job.proc.exitcode))
                    job.item = None
                    running.remove(job)
                    job.stop(0)
                elif time.monotonic() > job.deadline:
                    job.proc.kill()
                    job.proc.join()
                    took = tr(
                        "grading took over {seconds:.0f} s, so its process was stopped; the rest of the class was graded, "
                        "a rerun grades it again",
                        seconds=seconds(job.item),
                    )
                    lost(job, took)
                    job.item = None
                    running.remove(job)
                    job.stop(0)
    finally:
        for job in running:
            job.stop(STOP_GRACE)
        for job in running:
            if job.item is not None:  # interrupted: what it was writing is not a result
                shutil.rmtree(_partial(out, job.item, job.proc.pid), ignore_errors=True)
        for folder in scratch:
            shutil.rmtree(folder, ignore_errors=True)


# -- the class ------------------------------------------------------------------------------------------------
@dataclass
class ClassResult:
    rows: list[dict]
    """grades.csv's rows (a skipped dot folder's included, saying it was skipped)."""
    graded_now: int
    sandbox: str
    out: Path
    skipped: list[str] = field(default_factory=list)
    """The entries that are no students (names starting with a dot), as shown: not counted anywhere."""
    workers: dict[str, dict] = field(default_factory=dict)
    """On a cluster (`scheduler`): which worker graded what and how long each took (`Cluster.summary`)."""

    def count_line(self) -> str:
        """What `course grade` ends with: the results, adding up, and what was skipped (names escaped for
        the terminal)."""
        counted = [r for r in self.rows if r["student"] not in self.skipped]
        errors = sum(r["status"].startswith("error") for r in counted)
        fields = {"n": len(counted), "graded": len(counted) - errors, "errors": errors, "new": self.graded_now}
        fields["skipped"] = tr_in("list", ", ").join(escape.terminal(name) + "/" for name in self.skipped)
        new, skipped = self.graded_now < len(counted), bool(self.skipped)
        if new and skipped:
            return tr(
                "{n} results = {graded} graded + {errors} could not be graded (0 points); {new} new in this run; "
                "skipped, not students: {skipped}",
                **fields,
            )
        if new:
            return tr("{n} results = {graded} graded + {errors} could not be graded (0 points); {new} new in this run", **fields)
        if skipped:
            return tr("{n} results = {graded} graded + {errors} could not be graded (0 points); skipped, not students: {skipped}", **fields)
        return tr("{n} results = {graded} graded + {errors} could not be graded (0 points)", **fields)


def grade(
    submissions: Path,
    chosen: list[Chapter],
    out: Path,
    *,
    jobs: int = 2,
    force: bool = False,
    seed: int | None = None,
    time_limit: float = 5.0,
    memory_limit: int = 2 << 30,
    sandbox: bool | str | None = True,
    on_plan: Callable[[int, int, str], None] | None = None,
    on_item: Callable[[dict], None] | None = None,
    scheduler: str | None = None,
    on_note: Callable[[str], None] | None = None,
) -> ClassResult:
    """Grade every student's chapters; write results, grades.csv and the class summary into `out`.

    `sandbox`: True for the first kind of `grader.isolation.sandbox` that can be made here (GradeError
    naming the fix when none can), a kind ("bwrap", "uid"), or False/None for none (process
    isolation only). `on_plan(n, total, sandbox)` hears how many of all items are graded now and
    how they are isolated; `on_item(row)` hears the grades row of each item graded now, in the
    order of grades.csv (alphabetically by student), each as soon as it and every row before it
    are written (`InOrder`).

    `scheduler`: the address of a Dask scheduler (tcp://HOST:PORT) whose workers grade instead of `jobs`
    local job processes (`grader.delivery.cluster`): the same results, the sandbox made on each worker;
    `on_note(text)` hears each worker refused (another course version, no sandbox).
    """
    out = Path(out)
    cluster = None
    try:
        if scheduler:
            from grader.delivery.cluster import Cluster

            wanted = ("bwrap" if sandbox is True else sandbox) or None
            cluster = Cluster.connect(scheduler, wanted, on_note)
            kind, how = wanted, cluster.how
        else:
            kind, how = _sandbox(sandbox)
        out.mkdir(parents=True, exist_ok=True)
        items = find_items(Path(submissions), chosen)
        seeds, limits = _state(out, seed, force, chosen, time_limit, sorted({i.student for i in items if i.recorded}))
        for stale in out.glob("*/.*.partial-*"):  # left by a run that was killed
            shutil.rmtree(stale, ignore_errors=True)
        for stale in out.glob(".*.tmp-*"):
            stale.unlink(missing_ok=True)
        todo = [i for i in items if i.recorded and (force or _needs_grading(out, i))]
        if on_plan:
            on_plan(len(todo), sum(i.recorded for i in items), how)
        per_check = {
            ch.id: [limits[ch.id]["checks"].get(s.key, limits[ch.id]["max"]) for s in checks.load(ch.id, with_hidden=True)] for ch in chosen
        }

        def seconds(item: Item) -> float:
            return ITEM_SLACK + sum(t + CHECK_SLACK for t in per_check[item.chapter])

        if todo:
            config = dict(out=str(out), seeds=seeds, limits=limits, memory_limit=memory_limit, sandbox=kind)
            ordered = InOrder(todo, on_item) if on_item else None
            if cluster:
                cluster.grade(todo, config, out, ordered, seconds)
            else:
                _run_jobs(todo, max(1, min(jobs, len(todo))), config, out, ordered, seconds)
        docs = [_doc_of(out, i, seeds.get(i.student)) for i in items]
    finally:
        _close_dirs()
        if cluster:
            cluster.close()
    rows = [row(i.student, d) for i, d in zip(items, docs)]
    _write_atomic(out / "grades.csv", _csv(rows))
    summary = summarize(items, chosen, docs)
    _write_atomic(out / "summary.json", escape.json_document(json.dumps(summary, ensure_ascii=False, indent=1)))
    _write_atomic(out / HISTOGRAM, histogram_svg(summary))
    _write_atomic(out / "summary.md", summary_markdown(summary, histogram=HISTOGRAM))
    skipped = sorted({_text(i.student) for i in items if not i.recorded})
    return ClassResult(rows, len(todo), how, out, skipped, cluster.summary() if cluster else {})


class InOrder:
    """Hands the rows of `items` to `emit` in the order of `items`, whatever order they come in:
    each as soon as it and all before it have come.

    Why not as they finish: the jobs finish in an order that changes from run to run, and a
    log read or compared like grades.csv should not. What it costs: a row waits for the rows
    before it, at most the time the slowest of them takes, which its checks' time limits bound."""

    def __init__(self, items: list[Item], emit: Callable[[dict], None]) -> None:
        self.index = {item: n for n, item in enumerate(items)}
        self.emit = emit
        self.waiting: dict[int, dict] = {}
        self.next = 0

    def __call__(self, item: Item, result: dict) -> None:
        self.waiting[self.index[item]] = result
        while self.next in self.waiting:
            self.emit(self.waiting.pop(self.next))
            self.next += 1


def _sandbox(sandbox: bool | str | None) -> tuple[str | None, str]:
    """The sandbox kind to grade in and a sentence describing it; GradeError when none can be made."""
    if not sandbox:
        return None, tr(
            "none: sandbox switched off (--no-sandbox): student code runs with process isolation only "
            "and could read this user's files and reach the network"
        )
    from grader.isolation.sandbox import SandboxUnavailable, probe

    reasons = []
    # A class is graded in bubblewrap's sandbox only: the uid boundary shows the host's files, and only
    # the Gradescope bundle makes those unreadable first.
    for kind in ("bwrap",) if sandbox is True else (sandbox,):
        try:
            return kind, probe(kind)
        except SandboxUnavailable as e:
            reasons.append(str(e))
    raise GradeError(
        tr(
            "no sandbox can be made here for the students' code: {reasons}; or pass --no-sandbox to grade with process isolation only",
            reasons=tr_in("list", "; ").join(reasons),
        )
    )


def _needs_grading(out: Path, item: Item) -> bool:
    """No result recorded yet, only one saying the grader failed, or an error row about another
    file than the one found now (a student's folder reorganized, a layout newly accepted): graded
    again. A graded result is kept whatever changed (`--force` grades it again)."""
    try:
        doc = json.loads((results_dir(out, item.student, item.chapter) / "results.json").read_text(encoding="utf-8"))
        moved = doc.get("status") == "error" and doc.get("answer") != (_text(item.where) if item.where else None)
        return bool(doc.get("retry")) or doc.get("chapter") != item.chapter or moved
    except (OSError, ValueError, AttributeError):
        return True


def _doc_of(out: Path, item: Item, seed: int | None) -> dict:
    """An item's results document: its results.json, or (a dot-folder's) the error it was given."""
    if not item.recorded:
        assert item.problem is not None  # a row not kept is one that cannot be graded
        return error_doc(item, item.problem, seed=seed)
    try:
        doc = json.loads((results_dir(out, item.student, item.chapter) / "results.json").read_text(encoding="utf-8"))
        if doc["chapter"] == item.chapter and {"score", "max_score", "status", "tests"} <= set(doc):
            return doc
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return error_doc(item, tr("its result could not be read; a rerun grades it again"), seed=seed, retry=True)


def _state(
    out: Path, seed: int | None, force: bool, chosen: list[Chapter], time_limit: float, students: list[str]
) -> tuple[dict[str, int], dict]:
    """Each student's grading seed and the per-check time limits: the run's secret (a new one, or `seed`
    as text) set on the first run, each student's seed derived from it when the student is first met,
    all recorded in grading.json and reused by every rerun (so a resumed run grades exactly as an
    uninterrupted one)."""
    from grader.delivery.seeds import CALIBRATION, secret_of, student_seed

    state_file = out / STATE
    state = json.loads(state_file.read_text()) if state_file.is_file() and not force else {}
    if "seed" in state and "secret" not in state:  # recorded before seeds were per student: its seed is the secret
        state["secret"] = str(state.pop("seed"))
    if state and seed is not None and str(seed) != state["secret"]:
        raise GradeError(
            tr("{out} was graded with another secret; rerun without --seed, or with --force to grade everything again", out=out)
        )
    secret = state.setdefault("secret", secret_of(seed))
    seeds = state.setdefault("seeds", {})
    for student in students:
        seeds.setdefault(student, student_seed(secret, student))
    limits = state.setdefault("time_limits", {})
    for ch in chosen:
        if ch.id not in limits:
            limits[ch.id] = calibrate(ch, student_seed(secret, CALIBRATION), time_limit)
    state["chapters"] = sorted(set(state.get("chapters", [])) | {ch.id for ch in chosen})
    _write_atomic(state_file, json.dumps(state, indent=1))
    return seeds, limits


def calibrate(ch: Chapter, seed: int, time_limit: float) -> dict:
    """Per-check limits from the reference's own time in each check (the flat limit without solutions/)."""
    from grader.run import check

    if not (chapters.SOLUTIONS / ch.filename).is_file():
        return {"max": time_limit, "checks": {}}
    report = check(ch.id, solutions=True, hidden=True, seed=seed, figures_dir=None, time_limit=time_limit)
    return {
        "max": time_limit,
        "checks": {f"{r.task}:{r.name}": round(min(time_limit, max(FLOOR, SLACK * r.student_seconds)), 3) for r in report.results},
    }


def _write_atomic(path: Path, text: str) -> None:
    with tempfile.NamedTemporaryFile("wb", dir=path.parent, prefix=f".{path.name}.tmp-", delete=False) as f:
        f.write(_utf8(text))
    os.replace(f.name, path)


def _csv(rows: list[dict]) -> str:
    """grades.csv: every cell through `grader.delivery.escape.csv_cell` (no control character, no formula)."""
    buffer = io.StringIO()
    # RFC 4180's CRLF rows (a cell's own CR or LF is escaped by csv_cell)
    writer = csv.DictWriter(buffer, ["student", "chapter", "score", "max_score", "status"], lineterminator="\r\n")
    writer.writeheader()
    writer.writerows({k: escape.csv_cell(v) for k, v in r.items()} for r in rows)
    return buffer.getvalue()
