"""The last score of each chapter per graded folder, for `course list`.

Kept in $COURSE_STATE_DIR/progress.json (default ~/.cache/course); losing it
loses nothing but the status column.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from grader.i18n import tr
from grader.report import Report


def _file() -> Path:
    base = os.environ.get("COURSE_STATE_DIR") or Path.home() / ".cache" / "course"
    return Path(base) / "progress.json"


def load() -> dict:
    try:
        return json.loads(_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def record(report: Report) -> None:
    """Remember how this folder did on this chapter (atomically; failures are ignored).

    Per task, the public checks of its last run: a run of one task (`--task`) replaces that task's line and
    keeps the others'.
    """
    folder = str(Path(report.target).parent)
    state = load()
    entry = state.setdefault(folder, {}).get(report.chapter.id, {})
    tasks = dict(entry.get("tasks", {}))
    ran: dict[str, list[int]] = {}
    for r in report.results:
        if not r.hidden:
            counts = ran.setdefault(r.task, [0, 0, 0])
            counts[0] += r.status == "passed"
            counts[1] += 1
            counts[2] += bool(r.todo)
    for task, (passed, total, todo) in ran.items():
        tasks[task] = {"passed": passed, "checks": total, "not_implemented": todo == total}
    state[folder][report.chapter.id] = {"tasks": tasks}
    try:
        path = _file()
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, encoding="utf-8") as f:
            json.dump(state, f, indent=1)
        os.replace(f.name, path)
    except OSError:
        pass


def tasks(folder: Path, chapter_id: str) -> dict[str, dict]:
    """Task id → {"passed": checks passed, "checks": public checks run, "not_implemented": all were stubs} of
    each task's last run in `folder`; a task never run is absent."""
    return load().get(str(folder.resolve()), {}).get(chapter_id, {}).get("tasks", {})


def task_status(last: dict | None) -> str:
    """A task's status for `course list CHAPTER`: "not run", "not implemented yet" or "3/5 passed" (checks)."""
    if not last:
        return tr("not run")
    if last.get("not_implemented"):
        return tr("not implemented yet")
    return tr("{passed}/{checks} passed", passed=last["passed"], checks=last["checks"])


def status(folder: Path, chapter_id: str, task_ids: list[str]) -> str:
    """A chapter's status for `course list`: "not run", "1/3 passed" (tasks whose every check passed) or
    "1/3 passed, 1 not run"."""
    last = tasks(folder, chapter_id)
    if not any(t in last for t in task_ids):
        return tr("not run")
    passed = sum(1 for t in task_ids if t in last and last[t]["passed"] == last[t]["checks"])
    not_run = sum(1 for t in task_ids if t not in last)
    if not_run:
        return tr("{passed}/{n} passed, {not_run} not run", passed=passed, n=len(task_ids), not_run=not_run)
    return tr("{passed}/{n} passed", passed=passed, n=len(task_ids))
