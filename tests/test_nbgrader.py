"""The nbgrader course, for real: generate_assignment → four submissions → autograde →
export → generate_feedback, for two chapters. Scores must be exactly right and no
release or feedback file may carry a solution, a hidden check's source or its data.

Costs about two minutes (nbgrader starts a kernel per notebook, each test cell a
student process); the hanging submission runs under a 1 s per-check limit.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from grader import chapters, checks
from grader.notebook import write_course
from grader.stubs import BEGIN, END

ROUND_TRIP = ("ch17", "ch25")
STUDENTS = ("stub", "partial", "broken", "source")
HIDDEN_LINE = re.compile(r"^(✓|✗) hidden check: .*$|^\d+/\d+ hidden checks passed$|^Exception reporting mode: Minimal$")


def nbgrader(course: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               COURSE_NOTEBOOK_TIME_LIMIT="1")
    out = subprocess.run(["nbgrader", *args], cwd=course, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    return out


def answer_cell(nb: dict, task: str) -> dict:
    (cell,) = [c for c in nb["cells"] if c["metadata"]["nbgrader"]["grade_id"] == f"answer_{task.replace('.', '_')}"]
    return cell


def src(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def submissions(ch, release: dict, source: dict) -> dict[str, dict]:
    """The release as it is; its first task answered from the source; a broken one; the source."""
    first = ch.tasks[0].id
    partial = json.loads(json.dumps(release))
    answer_cell(partial, first)["source"] = src(answer_cell(source, first))
    broken = json.loads(json.dumps(release))
    cell = answer_cell(broken, first)
    stub = "raise NotImplementedError()"
    # ch25 hangs (an endless loop), ch17 kills its process (os._exit)
    cell["source"] = src(cell).replace(stub, "while True:\n        pass" if ch.id == "ch25" else "import os\n    os._exit(3)")
    return {"stub": release, "partial": partial, "broken": broken, "source": source}


def points(chapter_id: str, task: str | None = None) -> float:
    return sum(s.points for s in checks.load(chapter_id, with_hidden=True) if task in (None, s.task))


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    root = tmp_path_factory.mktemp("nbgrader")
    chosen = [chapters.find(c) for c in ROUND_TRIP]
    write_course(root, chosen)
    for student in STUDENTS:
        nbgrader(root, "db", "student", "add", student)
    for ch in chosen:
        nbgrader(root, "generate_assignment", ch.id, "--force")
        release = json.loads((root / "release" / ch.id / f"{ch.id}.ipynb").read_text())
        source = json.loads((root / "source" / ch.id / f"{ch.id}.ipynb").read_text())
        for student, nb in submissions(ch, release, source).items():
            folder = root / "submitted" / student / ch.id
            folder.mkdir(parents=True)
            (folder / f"{ch.id}.ipynb").write_text(json.dumps(nb))
        nbgrader(root, "autograde", ch.id)
        nbgrader(root, "generate_feedback", ch.id)
    nbgrader(root, "export")
    return root


def secret_lines(ch) -> list[str]:
    lines, inside = [], False
    for line in (chapters.SOLUTIONS / ch.filename).read_text().splitlines():
        if line.strip() in (BEGIN, END):
            inside = line.strip() == BEGIN
        elif inside and len(line.strip()) >= 12:
            lines.append(line.strip())
    return lines


def test_release_notebooks_carry_no_solution_and_no_hidden_test(course):
    for cid in ROUND_TRIP:
        text = (course / "release" / cid / f"{cid}.ipynb").read_text()
        nb = json.loads(text)
        assert not [s for s in secret_lines(chapters.find(cid)) if s in text]
        assert "HIDDEN TESTS" not in text and "hidden=True" not in text
        hidden = [c for c in nb["cells"] if c["metadata"]["nbgrader"]["grade_id"].startswith("hidden_")]
        assert hidden and all(not src(c).strip() for c in hidden)


def test_gradebook_scores_are_exactly_the_expected_ones(course):
    rows = {(r["assignment"], r["student_id"]): float(r["score"])
            for r in csv.DictReader(open(course / "grades.csv"))}
    for cid in ROUND_TRIP:
        first = chapters.find(cid).tasks[0].id
        expected = {"stub": 0.0, "partial": points(cid, first), "broken": 0.0, "source": points(cid)}
        assert {s: rows[cid, s] for s in STUDENTS} == expected, cid


def test_feedback_shows_figures_and_keeps_hidden_checks_hidden(course):
    for cid in ROUND_TRIP:
        passing = (course / "feedback" / "source" / cid / f"{cid}.html").read_text()
        assert "image/svg+xml" in passing
        for student in STUDENTS:
            html = (course / "feedback" / student / cid / f"{cid}.html").read_text()
            assert "HIDDEN TESTS" not in html and "hidden=True" not in html
            nb = json.loads((course / "autograded" / student / cid / f"{cid}.ipynb").read_text())
            for cell in nb["cells"]:
                if cell["metadata"].get("nbgrader", {}).get("grade_id", "").startswith("hidden_"):
                    text = "".join("".join(o.get("text", "")) for o in cell["outputs"] if o["output_type"] == "stream")
                    assert all(HIDDEN_LINE.match(line) for line in text.splitlines()), text


def test_course_check_grades_a_notebook_like_nbgrader(course):
    first = chapters.find("ch25").tasks[0].id
    for student, want in (("source", points("ch25")), ("partial", points("ch25", first))):
        path = course / "submitted" / student / "ch25" / "ch25.ipynb"
        out = subprocess.run([sys.executable, "-m", "grader.cli", "check", "ch25", "--notebook", str(path), "--json",
                              "--hidden", "--figures", str(course / "figs")], capture_output=True, text=True)
        doc = json.loads(out.stdout)
        assert (doc["score"], doc["target"]) == (want, str(path)), out.stderr
