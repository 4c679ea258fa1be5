"""The last score of each chapter per graded folder, for `course list`.

Kept in $COURSE_STATE_DIR/progress.json (default ~/.cache/course); losing it
loses nothing but the status column.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

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
    """Remember how this folder did on this chapter (atomically; failures are ignored)."""
    folder = str(Path(report.target).parent)
    tasks = report.by_task()
    state = load()
    state.setdefault(folder, {})[report.chapter.id] = {
        "tasks_passed": sum(all(r.status == "passed" for r in rs) for _, rs in tasks),
        "tasks_run": len(tasks), "score": report.score, "max_score": report.max_score}
    try:
        path = _file()
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, encoding="utf-8") as f:
            json.dump(state, f, indent=1)
        os.replace(f.name, path)
    except OSError:
        pass


def status(folder: Path, chapter_id: str, num_tasks: int) -> str:
    """"not run", "passed 2/2" or "1/3 passed" for `course list`."""
    entry = load().get(str(folder.resolve()), {}).get(chapter_id)
    if not entry:
        return "not run"
    passed = entry["tasks_passed"]
    if entry["tasks_run"] < num_tasks:
        return f"{passed}/{num_tasks} passed (partial run)"
    return f"passed {passed}/{num_tasks}" if passed == num_tasks else f"{passed}/{num_tasks} passed"
