"""`course grade`: a class of real and broken submissions, resumed runs, a run killed
mid-way, and the sandbox against each escape a student might try."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mutate import mutant

from grader import chapters, checks
from grader.grade import grade
from grader.notebook import chapter_notebook
from grader.isolation.sandbox import available

CH25 = chapters.find("ch25")
FULL = sum(s.points for s in checks.load("ch25", with_hidden=True))
SANDBOX, WHY = available()


def write(folder: Path, name: str, data: bytes | str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data if isinstance(data, bytes) else data.encode())


def make_class(root: Path) -> Path:
    subs = root / "subs"
    write(subs / "ada", CH25.filename, (chapters.SOLUTIONS / CH25.filename).read_text())
    write(subs / "bo", CH25.filename, (chapters.EXERCISES / CH25.filename).read_text())
    # the logical block used as the physical one
    wrong = mutant(root / "m", "ch25", ("return table[logical] * block_size + pos % block_size",
                                        "return logical * block_size + pos % block_size"))
    write(subs / "cy", CH25.filename, (wrong / CH25.filename).read_text())
    write(subs / "di", CH25.filename, "def slot_mapping(:\n")
    write(subs / "ed", CH25.filename, b"\xff\xfe not utf-8")
    write(subs / "fa", "ch25.ipynb", "{ this is not json")
    (subs / "gu").mkdir()
    write(subs / "hi", CH25.filename, "")
    with open(subs / "hi" / CH25.filename, "r+b") as f:
        f.truncate(200 << 20)  # a 200 MB file (sparse)
    write(subs / "io", "ch25.ipynb", json.dumps(chapter_notebook(CH25)))  # the source notebook: all correct
    return subs


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("class")
    subs = make_class(root)
    out = root / "out"
    return subs, out, grade(subs, [CH25], out, jobs=2, seed=3)


def test_every_student_gets_one_row_and_malformed_ones_a_clear_error(graded):
    _, out, result = graded
    rows = {r["student"]: r for r in result.rows}
    assert set(rows) == {"ada", "bo", "cy", "di", "ed", "fa", "gu", "hi", "io"}
    assert (rows["ada"]["score"], rows["ada"]["status"]) == (FULL, "passed")
    assert (rows["io"]["score"], rows["io"]["status"]) == (FULL, "passed")
    assert rows["bo"]["status"] == "failed" and rows["bo"]["score"] == 0
    assert rows["cy"]["status"] == "failed" and 0 < rows["cy"]["score"] < FULL
    for student, words in (("di", "SyntaxError at line 1"), ("ed", "not UTF-8"), ("fa", "not JSON"),
                           ("gu", "no ch25_paged_kv.py or ch25.ipynb"), ("hi", "200 MiB")):
        assert rows[student]["status"].startswith("error: ") and words in rows[student]["status"], student
    lines = (out / "grades.csv").read_text().splitlines()
    assert lines[0] == "student,chapter,score,max_score,status" and len(lines) == 10


def test_results_are_gradescope_documents_with_figures_beside_them(graded):
    _, out, _ = graded
    doc = json.loads((out / "ada" / "ch25" / "results.json").read_text())
    assert doc["score"] == doc["max_score"] == FULL and doc["seed"] == 3
    assert {"name", "score", "max_score", "status", "output"} <= set(doc["tests"][0])
    assert doc["figures"] and all((out / "ada" / "ch25" / f).is_file() for f in doc["figures"])


def test_the_summary_names_the_misconception_to_teach_again(graded):
    _, out, _ = graded
    summary = json.loads((out / "summary.json").read_text())["ch25"]
    first = next(c for c in summary["checks"] if c["check"].startswith("ch25.1 slot_mapping: figure instance"))
    assert first["failed"] == 2 and first["graded"] == 4  # bo (stub) and cy (logical block)
    assert summary["errors"] == 5
    assert "## ch25" in (out / "summary.md").read_text()


def test_a_rerun_skips_finished_work_and_changes_nothing(graded):
    subs, out, _ = graded
    before = {p: p.read_text() for p in out.rglob("*.json")}
    again = grade(subs, [CH25], out, jobs=2)
    assert again.graded_now == 0
    assert {p: p.read_text() for p in out.rglob("*.json")} == before


def comparable(out: Path) -> dict:
    return {str(p.relative_to(out)): json.loads(p.read_text()) for p in sorted(out.glob("*/*/results.json"))}


def test_a_run_killed_at_any_moment_resumes_to_the_same_results(tmp_path):
    subs = tmp_path / "subs"
    for i in range(6):
        write(subs / f"s{i}", CH25.filename, (chapters.SOLUTIONS / CH25.filename).read_text())
    hang = (chapters.SOLUTIONS / CH25.filename).read_text().replace(
        "    ### BEGIN SOLUTION\n    if block_size <= 0:", "    ### BEGIN SOLUTION\n    while True:\n        pass\n    if block_size <= 0:")
    write(subs / "s3", CH25.filename, hang)
    command = [sys.executable, "-m", "grader.cli", "grade", str(subs), "--chapter", "ch25", "--jobs", "1",
               "--seed", "5", "--time-limit", "0.5"]
    whole = tmp_path / "whole"
    subprocess.run(command + ["--out", str(whole)], check=True, capture_output=True)
    cut = tmp_path / "cut"
    proc = subprocess.Popen(command + ["--out", str(cut)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 60
    while len(list(cut.glob("*/ch25/results.json"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert 2 <= len(list(cut.glob("*/ch25/results.json"))) < 7, "killed mid-way"
    subprocess.run(command + ["--out", str(cut)], check=True, capture_output=True)
    assert comparable(cut) == comparable(whole)
    assert (cut / "grades.csv").read_text() == (whole / "grades.csv").read_text()
    assert not list(cut.glob("*/.*.partial-*"))


# -- the sandbox ---------------------------------------------------------------------------------------
ESCAPES = {
    "reading the solutions next to the grader": (
        "import grader\nfrom pathlib import Path\n"
        "print('ESCAPED', len((Path(grader.__file__).resolve().parents[1] / 'solutions' / 'ch25_paged_kv.py').read_text()))"),
    "reading the solutions by their absolute path": "print('ESCAPED', len(open({solutions!r}).read()))",
    "listing the other students": "import os\nprint('ESCAPED', os.listdir({subs!r}))",
    "writing into the course tree": "open({target!r}, 'w').write('x')\nprint('ESCAPED')",
    "reaching the network": "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('ESCAPED')",
}


@pytest.mark.skipif(not SANDBOX, reason=WHY)
def test_each_escape_fails_with_no_credit(tmp_path):
    server = socket.create_server(("127.0.0.1", 0))
    target = chapters.ROOT / "grader" / "escaped.py"
    subs = tmp_path / "subs"
    names = {}
    for i, (name, attempt) in enumerate(ESCAPES.items()):
        code = attempt.format(solutions=str(chapters.SOLUTIONS / CH25.filename), subs=str(subs), target=str(target),
                              port=server.getsockname()[1])
        body = "    try:\n" + "".join(f"        {line}\n" for line in code.splitlines()) + \
               "    except Exception as e:\n        print('blocked:', type(e).__name__)\n" \
               "    return torch.zeros(len(positions), dtype=torch.int64)\n"
        source = (chapters.EXERCISES / CH25.filename).read_text().replace(
            '    raise NotImplementedError("ch25.1 slot_mapping', body + '    raise NotImplementedError("ch25.1 slot_mapping')
        write(subs / f"e{i}", CH25.filename, source)
        names[f"e{i}"] = name
    try:
        grade(subs, [CH25], tmp_path / "out", jobs=1, seed=1)
    finally:
        server.close()
    assert not target.exists(), "the course tree was written"
    for student, name in names.items():
        doc = json.loads((tmp_path / "out" / student / "ch25" / "results.json").read_text())
        first = doc["tests"][0]
        assert first["status"] == "failed" and first["score"] == 0, name
        assert "blocked:" in first["output"] and "ESCAPED" not in first["output"], (name, first["output"])


def test_without_the_sandbox_the_grader_says_so(tmp_path):
    subs = tmp_path / "subs"
    write(subs / "ada", CH25.filename, (chapters.SOLUTIONS / CH25.filename).read_text())
    out = subprocess.run([sys.executable, "-m", "grader.cli", "grade", str(subs), "--chapter", "ch25", "--out",
                          str(tmp_path / "out"), "--no-sandbox"], capture_output=True, text=True)
    assert out.returncode == 0 and "sandbox: none" in out.stderr
    assert "ada  ch25  " in out.stdout and "passed" in out.stdout
    shutil.rmtree(tmp_path / "out")


def test_time_limits_follow_the_reference_and_are_recorded(graded):
    _, out, _ = graded
    state = json.loads((out / "grading.json").read_text())
    limits = state["time_limits"]["ch25"]
    assert state["seed"] == 3 and limits["max"] == 5.0
    assert set(limits["checks"]) == {s.key for s in checks.load("ch25", with_hidden=True)}
    assert all(0.5 <= v <= 5.0 for v in limits["checks"].values())
