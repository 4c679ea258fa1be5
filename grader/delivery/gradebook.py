"""nbgrader's gradebook, filled by the sandboxed class grader: `course grade --nbgrader COURSE_DIR`.

A notebook kernel runs the student's code, so nothing it computes can be trusted: an answer
cell can replace the test cells' function or read the hidden checks. The score of record
therefore comes from `grader.delivery.grade.grade`, the class grader, and is written here into
nbgrader's gradebook through nbgrader's own API. The instructor's flow is

    nbgrader collect chNN                                  (or place submitted/ by hand)
    course grade --nbgrader COURSE_DIR --chapter chNN      (instead of nbgrader autograde)
    nbgrader generate_feedback chNN; nbgrader export

Submissions are read from `submitted/<student>/<chNN>/<chNN>.ipynb` only, what `collect`
writes: `autograded/` is this module's output (as it is autograde's), never its input. Each
notebook is read as `grader.delivery.submission` reads answers (no link followed, bounded size),
sanitized as autograde does (nbgrader's preprocessors restore its locked cells
from the gradebook's source cells), staged as SUBS/<student>/<chNN>.ipynb and graded with
the rest of the class; then, per submission, the gradebook gets its student, submission
(with collect's timestamp) and the auto_score of every test cell (`public_<task>`: the
points of the task's public checks that passed, `hidden_<task>`: of its hidden checks), and
`autograded/<student>/<chNN>/` gets the sanitized notebook whose test cells hold a plain
report of the task (public checks with their messages and figures, hidden checks with their
names and verdicts only) and the points as their value, plus collect's other files. The class
grader's own results (hidden checks' messages included: instructors only) stay in OUT,
COURSE_DIR/course-grade by default, where `nbgrader-staged.json` makes a resubmitted notebook
be graded again.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import shutil
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbgrader import utils as nbutils
from nbgrader.api import Gradebook, MissingEntry
from nbgrader.coursedir import CourseDirectory
from nbgrader.preprocessors import AssignLatePenalties, CheckCellMetadata, ClearOutput, DeduplicateIds, OverwriteCells, OverwriteKernelspec
from sqlalchemy.exc import SAWarning
from traitlets.config import Config
from traitlets.config.loader import PyFileConfigLoader

from grader import checks
from grader.chapters import Chapter
from grader.delivery import escape
from grader.delivery.grade import ClassResult, GradeError, grade, results_dir
from grader.delivery.notebook import figure_output, wrap_lines
from grader.delivery.submission import MAX_NOTEBOOK_BYTES, SubmissionError, read_file
from grader.i18n import tr, tr_in

STAGED = "nbgrader-staged.json"
"""In OUT: the hash of each notebook last staged, so that a resubmitted notebook is graded again."""


@dataclass
class NbgraderResult:
    """What `grade_course` did: the class grader's result and what went into nbgrader's folders."""

    graded: ClassResult
    recorded: list[tuple[str, str]] = field(default_factory=list)
    """(student, chapter) pairs written into the gradebook."""
    notes: list[str] = field(default_factory=list)
    """Submissions without an autograded notebook (none submitted, not a readable notebook, or not
    graded because the grader failed on it: those keep the gradebook's old entry)."""


@dataclass
class _Staged:
    student: str
    chapter: str
    notebook: nbformat.NotebookNode | None
    """The sanitized notebook, or None when the submitted one could not be read as a notebook."""
    problem: str = ""
    staged: bool = True
    """False when nothing was given to the class grader (no notebook, a link, too large): it gets 0."""


def course_directory(root: Path) -> tuple[CourseDirectory, Config]:
    """nbgrader's view of COURSE_DIR: its nbgrader_config.py (paths, gradebook, course id), if any."""
    root = Path(root).resolve()
    config = Config()
    if (root / "nbgrader_config.py").is_file():
        config = PyFileConfigLoader("nbgrader_config.py", path=str(root)).load_config()
    coursedir = CourseDirectory(config=config)
    if "root" not in config.get("CourseDirectory", {}):
        coursedir.root = str(root)
    return coursedir, config


def grade_course(root: Path, chosen: list[Chapter], out: Path | None = None, **options) -> NbgraderResult:
    """Grade the chapters' submitted notebooks with the class grader and write nbgrader's gradebook
    and `autograded/`. `out` (default COURSE_DIR/course-grade) is the class grader's OUT; `options`
    are `grader.delivery.grade.grade`'s (jobs, force, seed, time_limit, memory_limit, sandbox, on_plan, ...)."""
    coursedir, config = course_directory(root)
    out = Path(out) if out else Path(coursedir.root) / "course-grade"
    for ch in chosen:
        _check_assignment(coursedir, ch)
    with tempfile.TemporaryDirectory(prefix="course-nbgrader-") as tmp:
        staged = _stage(coursedir, chosen, Path(tmp))
        if not staged:
            fields = {
                "chapters": tr_in("list", ", ").join(c.id for c in chosen),
                "where": coursedir.format_path(coursedir.submitted_directory, "*", "*"),
            }
            raise GradeError(tr("no submissions of {chapters} in {where}", **fields))
        _forget_changed(out, staged, Path(tmp))
        graded = grade(Path(tmp), chosen, out, **options)
    result = NbgraderResult(graded)
    by_id = {ch.id: ch for ch in chosen}
    for (student, cid), item in staged.items():
        try:
            doc = json.loads((results_dir(out, student, cid) / "results.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            doc = {"retry": True}
        if not item.staged:
            doc = {"chapter": cid, "score": 0.0, "status": "error", "error": item.problem, "tests": []}
        if doc.get("retry") or "tests" not in doc:  # the grader failed on it, not the student: no score
            fields = {"item": f"{student}/{cid}", "error": doc.get("error") or tr("no result")}
            result.notes.append(tr("{item}: not graded ({error}); the gradebook keeps what it had: run this command again", **fields))
            continue
        _record(coursedir, config, by_id[cid], item, doc)
        result.recorded.append((student, cid))
        if item.notebook is None:
            fields = {"item": f"{student}/{cid}", "problem": item.problem, "score": doc["score"]}
            result.notes.append(tr("{item}: {problem}: {score:g} points, no autograded notebook (so no feedback)", **fields))
            stale = Path(coursedir.format_path(coursedir.autograded_directory, student, cid)) / f"{cid}.ipynb"
            stale.unlink(missing_ok=True)  # as autograde removes a notebook it failed on
        else:
            _write_autograded(coursedir, by_id[cid], item, doc, results_dir(out, student, cid))
    return result


# -- before grading ---------------------------------------------------------------------------------------
def _check_assignment(coursedir: CourseDirectory, ch: Chapter) -> None:
    """The assignment is in the gradebook (generate_assignment ran) with the points the checks give."""
    database = coursedir.db_url.removeprefix("sqlite:///")
    if database != coursedir.db_url and not Path(database).is_file():  # opening it would create it
        raise GradeError(
            tr(
                "{root} has no gradebook ({database}): is it an nbgrader course? Run `nbgrader generate_assignment {chapter}` there first",
                root=coursedir.root,
                database=database,
                chapter=ch.id,
            )
        )
    with Gradebook(coursedir.db_url, coursedir.course_id) as gb:
        try:
            notebook = gb.find_notebook(ch.id, ch.id)
        except MissingEntry:
            raise GradeError(
                tr(
                    "the gradebook {db} has no notebook {chapter} in assignment {chapter}: "
                    "run `nbgrader generate_assignment {chapter}` first",
                    db=coursedir.db_url,
                    chapter=ch.id,
                )
            ) from None
        cells = {c.name: c.max_score for c in notebook.grade_cells}
    specs = checks.load(ch.id, with_hidden=True)
    for task in ch.tasks:
        for kind, is_hidden in (("public", False), ("hidden", True)):
            name = f"{kind}_{_tid(task.id)}"
            points = sum(s.points for s in specs if s.task == task.id and s.hidden == is_hidden)
            if name not in cells or abs(cells[name] - points) > 1e-9:
                fields = {"chapter": ch.id, "cell": name, "worth": cells.get(name), "points": points}
                if name not in cells:
                    raise GradeError(
                        tr(
                            "the gradebook's {chapter} has no cell {cell}, the checks give {points:g}: release the course again "
                            "and rerun generate_assignment",
                            **fields,
                        )
                    )
                raise GradeError(
                    tr(
                        "the gradebook's {chapter} cell {cell} is worth {worth}, the checks give {points:g}: release the course "
                        "again and rerun generate_assignment",
                        **fields,
                    )
                )


def _stage(coursedir: CourseDirectory, chosen: list[Chapter], subs: Path) -> dict[tuple[str, str], _Staged]:
    """Every submitted/<student>/<chNN>/ folder: its notebook sanitized as autograde does, written as
    subs/<student>/<chNN>.ipynb. The file is read as `grader.delivery.submission` reads answers (no link
    followed, size-bounded); one nbgrader cannot read is staged as it is (the class grader grades its
    answer cells if it can, or gives its own error row)."""
    staged = {}
    for ch in chosen:
        # the student id from the folder's path, as nbgrader's converters find it
        regexp = re.compile(coursedir.format_path(coursedir.submitted_directory, "(?P<student_id>[^/]+)", ch.id, escape=True) + "$")
        for name in sorted(glob.glob(coursedir.format_path(coursedir.submitted_directory, "*", ch.id))):
            m = regexp.match(name)
            if not m or not os.path.isdir(name) or m["student_id"].startswith("."):
                continue
            student, folder = m["student_id"], Path(name)
            (subs / student).mkdir(exist_ok=True)
            target = subs / student / f"{ch.id}.ipynb"
            try:  # never through a link (to solutions/, to the hidden checks), never unbounded
                if folder.is_symlink() or folder.parent.is_symlink():
                    where = f"{student}/{ch.id}"
                    raise SubmissionError(tr("{item} is a symbolic link: links are never followed", item=where))
                if not os.path.lexists(folder / f"{ch.id}.ipynb"):
                    notebook = f"{ch.id}.ipynb"
                    raise SubmissionError(tr("no {name} submitted", name=notebook))
                data = read_file(folder, f"{ch.id}.ipynb", MAX_NOTEBOOK_BYTES)
            except SubmissionError as e:
                staged[student, ch.id] = _Staged(student, ch.id, None, str(e), staged=False)
                continue
            target.write_bytes(data)
            try:
                nb = _sanitize(coursedir, ch, student, nbformat.reads(data.decode("utf-8-sig"), as_version=4))
            except Exception as e:  # not JSON, not a notebook, nbgrader metadata broken: graded as it is
                why = str(e).splitlines()[0][:200] if str(e) else ""
                fields = {"name": f"{ch.id}.ipynb", "error": f"{type(e).__name__}: {why}"}
                staged[student, ch.id] = _Staged(student, ch.id, None, tr("{name} is not a notebook nbgrader can read ({error})", **fields))
                continue
            nbformat.write(nb, str(target))
            staged[student, ch.id] = _Staged(student, ch.id, nb)
    return staged


def _sanitize(coursedir: CourseDirectory, ch: Chapter, student: str, nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """nbgrader autograde's own sanitizing: outputs cleared, duplicate ids dropped, kernelspec, locked
    cells, points and checksums restored from the gradebook's source cells (missing test cells added)."""
    resources = _resources(coursedir, ch, student)
    for step in (ClearOutput(), DeduplicateIds(), OverwriteKernelspec(), OverwriteCells(add_missing_cells=True), CheckCellMetadata()):
        nb, resources = step.preprocess(nb, resources)
    return nb


def _forget_changed(out: Path, staged: dict, subs: Path) -> None:
    """Drop the class grader's result of every notebook that changed since it was graded (a new
    submission), so that its resumable run grades it again; record the new hashes first."""
    record = out / STAGED
    old = json.loads(record.read_text(encoding="utf-8")) if record.is_file() else {}
    new = dict(old)
    for student, cid in staged:
        path = subs / student / f"{cid}.ipynb"
        key = f"{student}/{cid}"
        new[key] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
        if old.get(key, "") != new[key]:
            shutil.rmtree(results_dir(out, student, cid), ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(new, indent=1, sort_keys=True), encoding="utf-8")


# -- after grading ----------------------------------------------------------------------------------------
def task_points(doc: dict, task_id: str, hidden: bool) -> float:
    """Points of one task's public (or hidden) checks that passed, from a results.json document."""
    return float(sum(t["score"] for t in _tests(doc, task_id, hidden)))


def _tests(doc: dict, task_id: str, hidden: bool) -> list[dict]:
    return [t for t in doc["tests"] if t.get("number") == task_id and ("hidden" in t.get("tags", [])) == hidden]


def _record(coursedir: CourseDirectory, config: Config, ch: Chapter, item: _Staged, doc: dict) -> None:
    """The submission and its test cells' auto_scores into the gradebook, as nbgrader autograde would."""
    folder = coursedir.format_path(coursedir.submitted_directory, item.student, ch.id)
    timestamp = coursedir.get_existing_timestamp(folder)
    with Gradebook(coursedir.db_url, coursedir.course_id) as gb, warnings.catch_warnings():
        warnings.simplefilter("ignore", SAWarning)  # nbgrader's add_submission builds its rows with autoflush on
        gb.update_or_create_student(item.student)
        gb.update_or_create_submission(ch.id, item.student, **({"timestamp": timestamp} if timestamp else {}))
        for task in ch.tasks:
            for kind, hidden in (("public", False), ("hidden", True)):
                grade_cell = gb.find_grade(f"{kind}_{_tid(task.id)}", ch.id, ch.id, item.student)
                grade_cell.auto_score = task_points(doc, task.id, hidden)
                grade_cell.needs_manual_grade = grade_cell.manual_score is not None
        for cell in item.notebook.cells if item.notebook is not None else []:
            if nbutils.is_solution(cell) or nbutils.is_task(cell):
                comment = gb.find_comment(cell.metadata.nbgrader["grade_id"], ch.id, ch.id, item.student)
                unchanged = cell.metadata.nbgrader.get("checksum") == nbutils.compute_checksum(cell)
                comment.auto_comment = "No response." if unchanged and not nbutils.is_task(cell) else None
        gb.db.commit()
    late = AssignLatePenalties(config=config)  # the instructor's late-submission plugin, as in autograde
    late.preprocess(item.notebook or nbformat.v4.new_notebook(), _resources(coursedir, ch, item.student))


def _write_autograded(coursedir: CourseDirectory, ch: Chapter, item: _Staged, doc: dict, results: Path) -> None:
    """autograded/<student>/<chNN>/: the sanitized notebook with each test cell's report and points, and
    the other files of the submitted folder (timestamp.txt) and of the source folder, as autograde copies them."""
    import figures

    nb = item.notebook
    assert nb is not None  # called only for a notebook that could be read
    tasks = {_tid(t.id): t for t in ch.tasks}
    count = 0
    for cell in nb.cells:
        kind, _, tid = cell.metadata.get("nbgrader", {}).get("grade_id", "").partition("_")
        if cell.cell_type != "code" or kind not in ("public", "hidden") or tid not in tasks:
            continue
        task, hidden, count = tasks[tid], kind == "hidden", count + 1
        outputs = [nbformat.v4.new_output("stream", name="stdout", text=task_report(doc, task.id, hidden))]
        if not hidden:
            mine = {spec.id: spec for spec in figures.catalog(ch.id) if task.id in spec.needs.values()}
            for rel in doc.get("figures", []):
                if Path(rel).stem in mine and (results / rel).is_file():
                    svg = (results / rel).read_text(encoding="utf-8")
                    data = figure_output(mine[Path(rel).stem], svg)  # the SVG, and an image with alt text
                    outputs.append(nbformat.v4.new_output("display_data", data=data))
        outputs.append(
            nbformat.v4.new_output("execute_result", execution_count=count, data={"text/plain": repr(task_points(doc, task.id, hidden))})
        )
        cell.outputs, cell.execution_count = outputs, count
    dest = Path(coursedir.format_path(coursedir.autograded_directory, item.student, ch.id))
    dest.mkdir(parents=True, exist_ok=True)
    mode = 0o664 if coursedir.groupshared else 0o444  # autograde's permissions
    for src in (
        Path(coursedir.format_path(coursedir.submitted_directory, item.student, ch.id)),
        Path(coursedir.format_path(coursedir.source_directory, ".", ch.id)),
    ):
        for name in nbutils.find_all_files(str(src), coursedir.ignore + ["*.ipynb"]):
            if os.path.islink(name) or not os.path.isfile(name):
                continue  # a link is never followed: it could point at anything the grader can read
            target = dest / Path(name).relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.unlink(missing_ok=True)
            shutil.copyfile(name, target)
            target.chmod(mode)
    with tempfile.NamedTemporaryFile("w", dir=dest, suffix=".partial", delete=False, encoding="utf-8") as f:
        nbformat.write(nb, f)
    os.chmod(f.name, mode)
    os.replace(f.name, dest / f"{ch.id}.ipynb")


def task_report(doc: dict, task_id: str, hidden: bool) -> str:
    """The plain text a test cell shows, as one output (one box in the feedback), wrapped to
    `grader.delivery.notebook.WIDTH` columns (continuation lines indented): the public checks with their
    messages, or the hidden checks with their names and verdicts only (never their inputs, expected
    values or messages)."""
    tests = _tests(doc, task_id, hidden)
    if doc.get("status") == "error":
        if hidden:
            return wrap_lines(tr("{task}: your notebook could not be graded", task=task_id) + "\n" + tr("0 points") + "\n")
        why = escape.plain(doc.get("error", ""), lines=True)
        return wrap_lines(tr("{task}: your notebook could not be graded: {why}", task=task_id, why=why) + "\n" + tr("0 points") + "\n")
    if hidden:
        lines = [tr("{task}, hidden checks, graded by the course grader:", task=task_id)]
    else:
        lines = [tr("{task}, public checks, graded by the course grader:", task=task_id)]
    for t in tests:
        verdict = "✓" if t["status"] == "passed" else "✗"
        fields = {"verdict": verdict, "name": t["name"], "outcome": t.get("outcome", t["status"])}
        if t["status"] == "passed":
            lines.append(tr("{verdict} hidden check: {name}", **fields) if hidden else f"{verdict} {t['name']}")
        else:
            lines.append(
                tr("{verdict} hidden check: {name} ({outcome})", **fields) if hidden else f"{verdict} {t['name']} ({fields['outcome']})"
            )
        if not hidden and t["status"] != "passed" and t.get("output"):
            lines += ["    " + escape.plain(line) for line in t["output"].splitlines()]  # a notebook obeys ANSI escapes
    fields = {
        "passed": sum(t["status"] == "passed" for t in tests),
        "n": len(tests),
        "score": sum(t["score"] for t in tests),
        "total": sum(t["max_score"] for t in tests),
    }
    if hidden:
        lines.append(tr("{passed}/{n} hidden checks passed: {score:g}/{total:g} points", **fields))
    else:
        lines.append(tr("{passed}/{n} public checks passed: {score:g}/{total:g} points", **fields))
    return wrap_lines("\n".join(lines) + "\n")


def _resources(coursedir: CourseDirectory, ch: Chapter, student: str) -> dict:
    return {"nbgrader": {"notebook": ch.id, "assignment": ch.id, "student": student, "db_url": coursedir.db_url}}


def _tid(task_id: str) -> str:
    return task_id.replace(".", "_")
