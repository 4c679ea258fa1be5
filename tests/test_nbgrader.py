"""The nbgrader course, for real, for two chapters: generate_assignment → six submissions
(one hostile, one whose second answer cell does not parse) → `course grade --nbgrader` (the
sandboxed class grader writes the gradebook and autograded/; no `nbgrader autograde`) →
generate_feedback → export. Scores must be exactly the checks' points (a cell that does not
parse costing only its task), the hostile notebook gets nothing it did not earn, no release,
autograded notebook or feedback file carries a solution, a hidden check's source or a hidden
check's message, and the feedback shows one box per test cell and describes its figures.

No kernel runs. Costs about a minute and a half on an idle machine (nbgrader's start-ups, the
class grader's calibration and sandboxes); a hanging submission stops after its calibrated
per-check limit.
"""

from __future__ import annotations

import csv
import html
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require_sandbox

from grader import chapters, checks
from grader.delivery.notebook import write_course
from grader.delivery.stubs import BEGIN, END

pytestmark = pytest.mark.slow  # grades submissions, builds releases or runs real tools: not in the fast loop

ROUND_TRIP = ("ch17", "ch25")
HONEST = ("stub", "partial", "broken", "carol", "source")
STUDENTS = HONEST + ("hostile",)
TIMESTAMP = "2025-03-01 12:00:00.000000 UTC"
HIDDEN_LINE = re.compile(
    r"^ch\d+\.\d+, hidden checks, graded by the course grader:$|^(✓|✗) hidden check: [^\n]*$"
    r"|^\d+/\d+ hidden checks passed: [\d.]+/[\d.]+ points$"
)


def run(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    out = subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    return out


def nbgrader(course: Path, *args: str) -> subprocess.CompletedProcess:
    return run(course, "nbgrader", *args)


def cell(nb: dict, grade_id: str) -> dict:
    (found,) = [c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id]
    return found


def tid(task: str) -> str:
    return task.replace(".", "_")


def src(c: dict) -> str:
    return "".join(c["source"]) if isinstance(c["source"], list) else c["source"]


def copy(nb: dict) -> dict:
    return json.loads(json.dumps(nb))


def hostile(ch, release: dict) -> dict:
    """Stub answers, plus cells that try what a kernel allowed: replace check_task, read the hidden
    checks and the solutions (at import time, so whatever they print would reach the feedback), and
    rewrite a locked test cell and its points."""
    nb = copy(release)
    first, second = (cell(nb, f"answer_{tid(t.id)}") for t in ch.tasks[:2])
    second["source"] = "import grader.delivery.notebook as g\ng.check_task = lambda *a, **k: None\n\n" + src(second)
    targets = [f"grader.hidden.{ch.id}", f"solutions.{ch.filename[:-3]}"]
    files = [str(chapters.ROOT / "grader" / "hidden" / f"{ch.id}.py"), str(chapters.SOLUTIONS / ch.filename)]
    first["source"] = (
        "import importlib, inspect\n"
        "import grader.hidden.%s as h\nprint(inspect.getsource(h))\n\n"
        "def _leak():\n"
        "    for name in %r:\n"
        "        try:\n            print(inspect.getsource(importlib.import_module(name)))\n"
        "        except Exception as e:\n            print('blocked', type(e).__name__)\n"
        "    for path in %r:\n"
        "        try:\n            print(open(path).read())\n"
        "        except Exception as e:\n            print('blocked', type(e).__name__)\n\n\n"
        "_leaked = _leak()\n\n" % (ch.id, targets, files)
    ) + src(first)
    public = cell(nb, f"public_{tid(ch.tasks[0].id)}")
    public["source"] = "print('all checks passed')\n100"
    public["metadata"]["nbgrader"]["points"] = 100
    return nb


def carol(ch, source: dict) -> dict:
    """The source with a syntax error in its second task's answer cell, and a scratch line that raises on
    top of its first: only the second task may lose points."""
    nb = copy(source)
    first, second = (cell(nb, f"answer_{tid(t.id)}") for t in ch.tasks[:2])
    first["source"] = f"demo = {ch.tasks[0].names[0]}()\n" + src(first)  # a TypeError: it takes arguments
    lines = src(second).split("\n")
    n = next(i for i, line in enumerate(lines) if "BEGIN SOLUTION" in line) + 1
    lines[n] += " )("
    second["source"] = "\n".join(lines)
    return nb


def submissions(ch, release: dict, source: dict) -> dict[str, dict]:
    """The release as it is; its first task answered from the source; a broken one; carol's (one cell does
    not parse); the source; a hostile one."""
    first = ch.tasks[0].id
    partial = copy(release)
    cell(partial, f"answer_{tid(first)}")["source"] = src(cell(source, f"answer_{tid(first)}"))
    broken = copy(release)
    answer = cell(broken, f"answer_{tid(first)}")
    stub = "raise NotImplementedError()"
    # ch25 hangs (an endless loop), ch17 kills its process (os._exit)
    answer["source"] = src(answer).replace(stub, "while True:\n        pass" if ch.id == "ch25" else "import os\n    os._exit(3)")
    return {
        "stub": release,
        "partial": partial,
        "broken": broken,
        "carol": carol(ch, source),
        "source": source,
        "hostile": hostile(ch, release),
    }


def points(chapter_id: str, task: str | None = None, hidden: bool | None = None) -> float:
    return sum(s.points for s in checks.load(chapter_id, with_hidden=True) if task in (None, s.task) and hidden in (None, s.hidden))


def expected(cid: str, student: str) -> dict[str, float]:
    """Each test cell's points: what the checks give the tasks a student answered right."""
    ch = chapters.find(cid)
    every = {t.id for t in ch.tasks}
    right = {"partial": {ch.tasks[0].id}, "carol": every - {ch.tasks[1].id}, "source": every}.get(student, set())
    return {
        f"{kind}_{tid(t.id)}": points(cid, t.id, kind == "hidden") if t.id in right else 0.0
        for t in ch.tasks
        for kind in ("public", "hidden")
    }


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    require_sandbox()  # the class grader scores the notebooks in the sandbox, or refuses
    root = tmp_path_factory.mktemp("nbgrader")
    chosen = [chapters.find(c) for c in ROUND_TRIP]
    write_course(root, chosen)
    nbgrader(root, "generate_assignment", "*", "--force")  # every chapter in one run (nbgrader takes globs)
    for ch in chosen:
        release = json.loads((root / "release" / ch.id / f"{ch.id}.ipynb").read_text())
        source = json.loads((root / "source" / ch.id / f"{ch.id}.ipynb").read_text())
        for student, nb in submissions(ch, release, source).items():
            folder = root / "submitted" / student / ch.id  # as `nbgrader collect` leaves it
            folder.mkdir(parents=True)
            (folder / f"{ch.id}.ipynb").write_text(json.dumps(nb))
            (folder / "timestamp.txt").write_text(TIMESTAMP)
    args = [a for ch in chosen for a in ("--chapter", ch.id)]
    run(root, sys.executable, "-m", "grader.cli", "grade", "--nbgrader", str(root), *args)
    feedback = nbgrader(root, "generate_feedback", "*")
    (root / "generate_feedback.log").write_text(feedback.stdout + feedback.stderr)
    nbgrader(root, "export")
    return root


def secret_lines(ch) -> list[str]:
    """The solution regions' lines, but those the stub holds anyway (provided code ships)."""
    stub = (chapters.EXERCISES / ch.filename).read_text()
    lines, inside = [], False
    for line in (chapters.SOLUTIONS / ch.filename).read_text().splitlines():
        if line.strip() in (BEGIN, END):
            inside = line.strip() == BEGIN
        elif inside and len(line.strip()) >= 12 and line.strip() not in stub:
            lines.append(line.strip())
    return lines


def hidden_source_lines(ch) -> list[str]:
    """The hidden checks' own lines: long ones that neither the solutions nor the public checks hold."""
    grader = chapters.ROOT / "grader"
    text = "".join(p.read_text() for p in sorted((grader / "hidden").glob(f"{ch.id}*.py")))
    shared = (chapters.SOLUTIONS / ch.filename).read_text() + "".join(
        p.read_text() for p in sorted((grader / "checks").glob(f"{ch.id}*.py"))
    )
    return [
        s
        for s in (line.strip() for line in text.splitlines())
        if len(s) >= 30 and not s.startswith(("from ", "import ", "#", "@hidden(")) and s not in shared
    ]


def hidden_messages(course: Path, cid: str) -> set[str]:
    """The hidden checks' failure messages in the class grader's own results (instructor-only), less
    any a public check also gave."""
    hidden, public = set(), set()
    for path in (course / "course-grade").glob(f"*/{cid}/results.json"):
        for test in json.loads(path.read_text())["tests"]:
            lines = {s for s in (line.strip() for line in test["output"].splitlines()) if len(s) >= 12}
            (hidden if "hidden" in test["tags"] else public).update(lines)
    return hidden - public


def outputs_text(nb: dict) -> str:
    return "\n".join(
        src(c) + "\n" + "".join("".join(o.get("text", "")) + json.dumps(o.get("data", {})) for o in c.get("outputs", []))
        for c in nb["cells"]
    )


def test_release_notebooks_carry_no_solution_and_no_hidden_test(course):
    for cid in ROUND_TRIP:
        text = (course / "release" / cid / f"{cid}.ipynb").read_text()
        nb = json.loads(text)
        assert not [s for s in secret_lines(chapters.find(cid)) if s in text]
        assert "HIDDEN TESTS" not in text and "hidden=True" not in text
        hidden = [c for c in nb["cells"] if c["metadata"]["nbgrader"]["grade_id"].startswith("hidden_")]
        assert hidden and all(not src(c).strip() for c in hidden)


def test_gradebook_scores_are_exactly_the_expected_ones(course):
    from nbgrader.api import Gradebook

    with open(course / "grades.csv", newline="") as f:
        rows = {(r["assignment"], r["student_id"]): r for r in csv.DictReader(f)}
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        for cid in ROUND_TRIP:
            for student in STUDENTS:
                want = expected(cid, student)
                got = {name: gb.find_grade(name, cid, cid, student).score for name in want}
                assert got == want, (cid, student)
                assert float(rows[cid, student]["score"]) == sum(want.values()), (cid, student)
                assert float(rows[cid, student]["max_score"]) == points(cid)
                assert rows[cid, student]["timestamp"].startswith("2025-03-01 12:00:00")
    assert {r["student_id"] for r in rows.values()} == set(STUDENTS)


def test_hostile_notebook_gets_nothing_and_its_locked_cells_are_restored(course):
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        for cid in ROUND_TRIP:
            submission = gb.find_submission(cid, "hostile")
            assert (submission.score, submission.max_score) == (0, points(cid))
    for cid in ROUND_TRIP:
        ch = chapters.find(cid)
        source = json.loads((course / "source" / cid / f"{cid}.ipynb").read_text())
        graded = json.loads((course / "autograded" / "hostile" / cid / f"{cid}.ipynb").read_text())
        public = f"public_{tid(ch.tasks[0].id)}"
        assert src(cell(graded, public)) == src(cell(source, public))
        assert cell(graded, public)["metadata"]["nbgrader"]["points"] == points(cid, ch.tasks[0].id, False)


def test_feedback_and_autograded_notebooks_keep_secrets(course):
    for cid in ROUND_TRIP:
        ch = chapters.find(cid)
        passing = (course / "feedback" / "source" / cid / f"{cid}.html").read_text()
        assert "image/svg+xml" in passing or "<svg" in passing
        secrets = hidden_source_lines(ch) + sorted(hidden_messages(course, cid))
        assert secrets
        for student in STUDENTS:
            page = html.unescape((course / "feedback" / student / cid / f"{cid}.html").read_text())
            nb = json.loads((course / "autograded" / student / cid / f"{cid}.ipynb").read_text())
            text = outputs_text(nb)
            assert (course / "autograded" / student / cid / "timestamp.txt").read_text() == TIMESTAMP
            assert "HIDDEN TESTS" not in page and "hidden=True" not in page
            solution = secret_lines(ch) if student in ("stub", "broken", "hostile") else []
            for line in secrets + solution:
                assert line not in text and line not in page, (student, line)
            for c in nb["cells"]:
                grade_id = c["metadata"].get("nbgrader", {}).get("grade_id", "")
                if grade_id.startswith(("public_", "hidden_")):
                    value = [o for o in c["outputs"] if o["output_type"] == "execute_result"]
                    assert float("".join(value[0]["data"]["text/plain"])) == expected(cid, student)[grade_id]
                if grade_id.startswith("hidden_"):
                    shown = "".join("".join(o.get("text", "")) for o in c["outputs"] if o["output_type"] == "stream")
                    unwrapped = re.sub(r"\n {2,}", " ", shown)  # a long line's continuations back on it
                    assert shown and all(HIDDEN_LINE.match(line) for line in unwrapped.splitlines()), shown


def test_course_check_grades_a_notebook_like_the_gradebook(course):
    """`course check --notebook` on a submitted file (run here, forking from the tests' warm process)
    gives what the gradebook holds, on the student's own grading seed (the HMAC of the nbgrader student
    id under the class's secret), recorded in grading.json and in the student's results.json."""
    from click.testing import CliRunner
    from nbgrader.api import Gradebook

    from grader.cli import main
    from grader.delivery.seeds import student_seed

    state = json.loads((course / "course-grade" / "grading.json").read_text())
    assert state["seeds"] == {s: student_seed(state["secret"], s) for s in STUDENTS}
    assert len(set(state["seeds"].values())) == len(STUDENTS)  # each student's hidden instances their own
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        for cid in ROUND_TRIP:
            for student in HONEST:
                seed = state["seeds"][student]
                recorded = json.loads((course / "course-grade" / student / cid / "results.json").read_text())
                assert recorded["seed"] == seed
                limit = ["--time-limit", "0.5"] if student == "broken" else []  # it hangs: every check times out
                path = course / "submitted" / student / cid / f"{cid}.ipynb"
                out = CliRunner().invoke(
                    main,
                    [
                        "check",
                        cid,
                        "--notebook",
                        str(path),
                        "--json",
                        "--hidden",
                        "--seed",
                        str(seed),
                        "--figures",
                        str(course / "figs"),
                        *limit,
                    ],
                )
                doc = json.loads(out.stdout)
                assert (doc["score"], doc["target"]) == (gb.find_submission(cid, student).score, str(path)), out.output


def test_a_hidden_test_cell_runs_nothing_and_gives_zero():
    """What the hidden test cell calls, run where it could (no kernel needed): no hidden check and no
    solution imported, 0 points, a sentence saying where the hidden checks run."""
    code = (
        "import sys; from grader.delivery.notebook import check_task; v = check_task('ch25', 'ch25.1', hidden=True); "
        "print(v, sorted(m for m in sys.modules if m.startswith(('grader.hidden', 'solutions', 'torch'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=chapters.ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "0.0 []"
    assert "course grade --nbgrader" in out.stdout


def test_feedback_reads_as_one_block_per_cell_with_described_figures(course):
    """Each test cell's report is one output (one box), wrapped to WIDTH columns; every figure has alt text
    (nbgrader does not warn), no cell says "Exception reporting mode"; carol's broken cell is named with its
    line."""
    from grader.delivery.notebook import WIDTH

    log = (course / "generate_feedback.log").read_text()
    assert "Alternative text is missing" not in log, log
    for cid in ROUND_TRIP:
        ch = chapters.find(cid)
        for student in STUDENTS:
            nb = json.loads((course / "autograded" / student / cid / f"{cid}.ipynb").read_text())
            page = (course / "feedback" / student / cid / f"{cid}.html").read_text()
            assert "Exception reporting mode" not in page
            images = re.findall(r"<img\b[^>]*>", page)
            assert all(re.search(r'\balt="[^"]+"', image) for image in images), images
            for c in nb["cells"]:
                if not c["metadata"].get("nbgrader", {}).get("grade_id", "").startswith(("public_", "hidden_")):
                    continue
                streams = [o for o in c["outputs"] if o["output_type"] == "stream"]
                assert len(streams) == 1, (student, c["outputs"])
                text = "".join(streams[0]["text"])
                assert all(len(line) <= WIDTH or " " not in line.strip() for line in text.splitlines()), text
                for o in c["outputs"]:
                    if o["output_type"] == "display_data":
                        shown = {kind: "".join(value) for kind, value in o["data"].items()}  # nbformat: lists of lines
                        assert 'alt="' in shown["text/html"] and "<svg" in shown["image/svg+xml"]
        graded = json.loads((course / "autograded" / "carol" / cid / f"{cid}.ipynb").read_text())
        second = ch.tasks[1].id
        report = "".join("".join(o.get("text", "")) for o in cell(graded, f"public_{tid(second)}")["outputs"])
        answer = src(cell(json.loads((course / "submitted" / "carol" / cid / f"{cid}.ipynb").read_text()), f"answer_{tid(second)}"))
        line = next(i for i, text in enumerate(answer.split("\n"), 1) if text.endswith(" )("))
        said = " ".join(report.split())  # as wrapped
        assert f"answer cell {second} does not parse" in said and f"(answer cell {second}, line {line})" in said, report
