"""`course grade`: a whole class, chapter by chapter, resumable and sandboxed.

SUBMISSIONS_DIR holds one folder per student with that student's chapter modules
(the file names of exercises/) or chapter notebooks (`ch25.ipynb`). Each
(student, chapter) is graded by a job process that keeps one warm zygote, inside
a bubblewrap sandbox where available, and written atomically as
`OUT/<student>/<chapter>/results.json` with the figures beside it. Everything
else (`grades.csv`, the class summary) is rebuilt from those files, so a run
killed at any moment and started again ends with exactly what one uninterrupted
run writes. The grading seed is fixed for the whole class in `OUT/grading.json`.
"""

from __future__ import annotations

import collections
import csv
import io
import json
import multiprocessing
import os
import secrets
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from grader import chapters, checks
from grader.chapters import Chapter

MAX_FILE_BYTES = 1 << 20
STATE = "grading.json"
SLACK, FLOOR = 50.0, 0.5
"""A check may spend SLACK times what the reference needs in it, at least FLOOR seconds and at
most the class's time limit: a hanging submission then costs seconds, not minutes."""


class GradeError(RuntimeError):
    """The class cannot be graded as asked (an unknown folder, a seed that differs from the recorded one)."""


@dataclass(frozen=True)
class Item:
    """One student's one chapter: where the answer is, or why there is none."""

    student: str
    chapter: str
    source: str | None
    problem: str | None = None


def find_items(submissions: Path, chosen: list[Chapter]) -> list[Item]:
    """Every (student, chapter) pair, in a stable order, with the file that answers it."""
    if not submissions.is_dir():
        raise GradeError(f"{submissions} is not a folder of student folders")
    items = []
    for folder in sorted(p for p in submissions.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for ch in chosen:
            candidates = [folder / ch.filename, folder / f"{ch.id}.ipynb", folder / f"{ch.filename[:-3]}.ipynb"]
            found = next((p for p in candidates if p.is_file()), None)
            problem = None if found else (f"no {ch.filename} or {ch.id}.ipynb in {folder.name}/")
            items.append(Item(folder.name, ch.id, str(found) if found else None, problem))
    return items


def module_text(item: Item) -> str:
    """The chapter module an item amounts to, or GradeError saying clearly why it cannot be graded."""
    if item.problem:
        raise GradeError(item.problem)
    path = Path(item.source)
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise GradeError(f"{path.name} is {size / 2**20:.0f} MiB, over the {MAX_FILE_BYTES >> 20} MiB a chapter "
                         "file may have")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise GradeError(f"{path.name} is not UTF-8 text (byte {e.start})") from None
    ch = chapters.find(item.chapter)
    if path.suffix == ".ipynb":
        from grader.notebook import assemble, cells_of

        try:
            json.loads(text)
        except ValueError as e:
            raise GradeError(f"{path.name} is not a notebook: not JSON ({e})") from None
        text = assemble(ch, cells_of(path))
    try:
        compile(text, ch.filename, "exec")
    except SyntaxError as e:
        raise GradeError(f"{path.name} does not parse: SyntaxError at line {e.lineno}: {e.msg}") from None
    return text


# -- one job process -------------------------------------------------------------------------------------
_job: dict = {}


def _start_job(out: str, seed: int, limits: dict, memory_limit: int, sandboxed: bool) -> None:
    from grader.isolation import sandbox
    from grader.isolation.zygote import Zygote

    base = Path(tempfile.mkdtemp(prefix="course-grade-"))
    inbox, scratch = base / "inbox", base / "scratch"
    inbox.mkdir()
    scratch.mkdir()
    if sandboxed:
        harness = sandbox.write_harness(base / "harness")
        zygote = Zygote(root=harness, prefix=sandbox.command(harness=harness, inbox=inbox, scratch=scratch),
                        scratch=scratch)
    else:
        zygote = Zygote()
    _job.update(out=Path(out), seed=seed, limits=limits, memory_limit=memory_limit, inbox=inbox,
                scratch=scratch, zygote=zygote)


def _grade(item: Item) -> dict:
    """Grade one item in this job process and write its folder atomically; return its grades row."""
    from grader.run import check

    ch = chapters.find(item.chapter)
    final = _job["out"] / item.student / item.chapter
    partial = final.parent / f".{item.chapter}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    max_score = sum(s.points for s in checks.load(ch.id, with_hidden=True))
    try:
        text = module_text(item)
    except GradeError as e:
        doc = {"chapter": ch.id, "score": 0.0, "max_score": max_score, "status": "error", "error": str(e),
               "seed": _job["seed"], "tests": [{"name": f"{ch.id} submission", "score": 0, "max_score": max_score,
                                                "status": "failed", "output": str(e), "visibility": "visible"}],
               "figures": []}
    else:
        for old in _job["inbox"].iterdir():
            old.unlink()
        (_job["inbox"] / ch.filename).write_text(text, encoding="utf-8")
        limits = _job["limits"][ch.id]
        report = check(ch.id, submission=_job["inbox"], hidden=True, seed=_job["seed"], figures_dir=partial / "figures",
                       time_limit=limits["max"], time_limits=limits["checks"], memory_limit=_job["memory_limit"],
                       launcher=_job["zygote"].start)
        doc = report.to_json()
        doc["target"] = item.source
        doc["status"] = {0: "passed", 1: "failed", 2: "blocked"}[report.exit_code]
        doc["figures"] = [str(Path(p).relative_to(partial)) for p in report.figures]
        doc.pop("execution_time", None)
    (partial / "results.json").write_text(json.dumps(doc, ensure_ascii=False, indent=1), encoding="utf-8")
    shutil.rmtree(final, ignore_errors=True)
    os.replace(partial, final)
    return row(item.student, doc)


def row(student: str, doc: dict) -> dict:
    return {"student": student, "chapter": doc["chapter"], "score": doc["score"], "max_score": doc["max_score"],
            "status": doc["status"] if doc["status"] != "error" else f"error: {doc['error']}"}


# -- the class ------------------------------------------------------------------------------------------------
@dataclass
class ClassResult:
    rows: list[dict]
    graded_now: int
    sandbox: str
    out: Path


def grade(submissions: Path, chosen: list[Chapter], out: Path, *, jobs: int = 2, force: bool = False,
          seed: int | None = None, time_limit: float = 5.0, memory_limit: int = 2 << 30, sandbox: bool = True,
          on_plan: Callable[[int, int, str], None] | None = None, on_item: Callable[[dict], None] | None = None
          ) -> ClassResult:
    """Grade every student's chapters; write results, grades.csv and the class summary into `out`.

    `on_plan(n, total, sandbox)` hears how many of all items are graded now and how they are isolated;
    `on_item(row)` hears each grades row as it is written.
    """
    from grader.isolation import sandbox as bwrap

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    items = find_items(Path(submissions), chosen)
    seed, limits = _state(out, seed, force, chosen, time_limit)
    for stale in out.glob("*/.*.partial-*"):  # left by a run that was killed
        shutil.rmtree(stale, ignore_errors=True)
    todo = [i for i in items if force or not (out / i.student / i.chapter / "results.json").is_file()]
    usable, how = bwrap.available() if sandbox else (False, "sandbox switched off (--no-sandbox)")
    how = how if usable else f"none: {how}"
    if on_plan:
        on_plan(len(todo), len(items), how)
    if todo:
        context = multiprocessing.get_context("spawn")
        with context.Pool(max(1, min(jobs, len(todo))), initializer=_start_job,
                          initargs=(str(out), seed, limits, memory_limit, usable)) as pool:
            for result in pool.imap_unordered(_grade, todo):
                if on_item:
                    on_item(result)
    rows = [row(i.student, json.loads((out / i.student / i.chapter / "results.json").read_text(encoding="utf-8")))
            for i in items]
    _write_atomic(out / "grades.csv", _csv(rows))
    summary = summarize(out, items, chosen)
    _write_atomic(out / "summary.json", json.dumps(summary, ensure_ascii=False, indent=1))
    _write_atomic(out / "summary.md", summary_markdown(summary))
    return ClassResult(rows, len(todo), how, out)


def _state(out: Path, seed: int | None, force: bool, chosen: list[Chapter], time_limit: float) -> tuple[int, dict]:
    """The class's grading seed and per-check time limits: set on the first run, reused by every
    rerun (so a resumed run grades exactly as an uninterrupted one)."""
    state_file = out / STATE
    state = json.loads(state_file.read_text()) if state_file.is_file() and not force else {}
    if state and seed is not None and seed != state["seed"]:
        raise GradeError(f"{out} was graded with seed {state['seed']}; rerun without --seed, or with --force "
                         "to grade everything again")
    state.setdefault("seed", secrets.randbelow(2**31) if seed is None else seed)
    limits = state.setdefault("time_limits", {})
    for ch in chosen:
        if ch.id not in limits:
            limits[ch.id] = calibrate(ch, state["seed"], time_limit)
    state["chapters"] = sorted(set(state.get("chapters", [])) | {ch.id for ch in chosen})
    _write_atomic(state_file, json.dumps(state, indent=1))
    return state["seed"], limits


def calibrate(ch: Chapter, seed: int, time_limit: float) -> dict:
    """Per-check limits from the reference's own time in each check (the flat limit without solutions/)."""
    from grader.run import check

    if not (chapters.SOLUTIONS / ch.filename).is_file():
        return {"max": time_limit, "checks": {}}
    report = check(ch.id, solutions=True, hidden=True, seed=seed, figures_dir=None, time_limit=time_limit)
    return {"max": time_limit, "checks": {f"{r.task}:{r.name}": round(min(time_limit, max(FLOOR, SLACK * r.student_seconds)), 3)
                                          for r in report.results}}


def _write_atomic(path: Path, text: str) -> None:
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, encoding="utf-8", newline="") as f:
        f.write(text)
    os.replace(f.name, path)


def _csv(rows: list[dict]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, ["student", "chapter", "score", "max_score", "status"], lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def summarize(out: Path, items: list[Item], chosen: list[Chapter]) -> dict:
    """Per chapter and check: how many students failed it, and the most common failure message."""
    summary = {}
    for ch in chosen:
        docs = [json.loads((out / i.student / i.chapter / "results.json").read_text(encoding="utf-8"))
                for i in items if i.chapter == ch.id]
        graded = [d for d in docs if d["status"] != "error"]
        failures: dict[str, list[str]] = collections.defaultdict(list)
        order: dict[str, None] = {}
        for doc in graded:
            for test in doc["tests"]:
                order.setdefault(test["name"])
                if test["status"] != "passed":
                    failures[test["name"]].append(test["output"].split("\n(your code printed")[0])
        checks_summary = []
        for name in order:
            messages = collections.Counter(failures.get(name, []))
            common, count = messages.most_common(1)[0] if messages else ("", 0)
            checks_summary.append({"check": name, "failed": len(failures.get(name, [])), "graded": len(graded),
                                   "most_common_message": common, "students_with_it": count})
        checks_summary.sort(key=lambda c: -c["failed"])
        summary[ch.id] = {"title": ch.title, "students": len(docs), "errors": len(docs) - len(graded),
                          "mean_score": round(sum(d["score"] for d in graded) / max(len(graded), 1), 2),
                          "max_score": docs[0]["max_score"] if docs else 0, "checks": checks_summary}
    return summary


def summary_markdown(summary: dict) -> str:
    lines = ["# Class summary", ""]
    for cid, s in summary.items():
        lines += [f"## {cid} · {s['title']}", "",
                  f"{s['students']} students, {s['errors']} could not be graded; mean {s['mean_score']}/{s['max_score']}.",
                  "", "| check | failed | most common failure (students) |", "|---|---|---|"]
        for c in s["checks"]:
            message = c["most_common_message"].replace("\n", " ⏎ ").replace("|", "\\|")[:300]
            lines.append(f"| {c['check']} | {c['failed']}/{c['graded']} | "
                         + (f"{message} ({c['students_with_it']})" if c["failed"] else "") + " |")
        lines.append("")
    return "\n".join(lines)
