"""`course grade`: a class of real and broken submissions, resumed runs, a run killed
mid-way, a job process killed mid-item, an interrupted run, every kind of malformed input
and odd student folder, and the sandbox against each escape a student might try."""

from __future__ import annotations

import base64
import csv
import io
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
import zipfile
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import require_sandbox
from mutate import mutant

from grader import chapters, checks
from grader.delivery import grade as grade_module
from grader.delivery.grade import GradeError, InOrder, Item, _Config, _grade, _needs_grading, _state, grade, results_dir
from grader.delivery.notebook import chapter_notebook
from grader.delivery.seeds import student_seed
from grader.delivery.summary import HISTOGRAM, clip, message_group, summarize, summary_markdown
from grader.isolation.sandbox import SandboxUnavailable, probe
from grader.run import warm_launcher

pytestmark = pytest.mark.slow  # grades submissions, builds releases or runs real tools: not in the fast loop

CH25 = chapters.find("ch25")
FULL = sum(s.points for s in checks.load("ch25", with_hidden=True))
CH17 = chapters.find("ch17")
FULL17 = sum(s.points for s in checks.load("ch17", with_hidden=True))
SOLUTION17 = (chapters.SOLUTIONS / CH17.filename).read_text()
STUB17 = (chapters.EXERCISES / CH17.filename).read_text()


def _probe() -> tuple[bool, str]:
    try:
        return True, probe()
    except SandboxUnavailable as e:
        return False, str(e)


SANDBOX, WHY = _probe()


def write(folder: Path, name: str, data: bytes | str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data if isinstance(data, bytes) else data.encode())


def hang(function: str) -> str:
    """The reference with `function` looping forever."""
    return SOLUTION17.replace(
        f"def {function}(", f"def {function}(*args, **kwargs):\n    while True:\n        pass\n\n\ndef _unused_{function}("
    )


def make_class(root: Path) -> Path:
    subs = root / "subs"
    write(subs / "ada", CH25.filename, (chapters.SOLUTIONS / CH25.filename).read_text())
    write(subs / "bo", CH25.filename, (chapters.EXERCISES / CH25.filename).read_text())
    # the logical block used as the physical one
    wrong = mutant(
        root / "m", "ch25", ("return table[logical] * block_size + pos % block_size", "return logical * block_size + pos % block_size")
    )
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
    return subs, out, grade(subs, [CH25], out, jobs=2, seed=3, sandbox=SANDBOX)


def test_every_student_gets_one_row_and_malformed_ones_a_clear_error(graded):
    _, out, result = graded
    rows = {r["student"]: r for r in result.rows}
    assert set(rows) == {"ada", "bo", "cy", "di", "ed", "fa", "gu", "hi", "io"}
    assert (rows["ada"]["score"], rows["ada"]["status"]) == (FULL, "passed")
    assert (rows["io"]["score"], rows["io"]["status"]) == (FULL, "passed")
    assert rows["bo"]["status"] == "not implemented" and rows["bo"]["score"] == 0  # the stub as given
    assert rows["cy"]["status"] == "failed" and 0 < rows["cy"]["score"] < FULL
    for student, words in (
        ("di", "SyntaxError at line 1"),
        ("ed", "not UTF-8"),
        ("fa", "not JSON"),
        ("gu", "no ch25_paged_kv.py or ch25.ipynb"),
        ("hi", "200 MiB"),
    ):
        assert rows[student]["status"].startswith("error: ") and words in rows[student]["status"], student
    lines = (out / "grades.csv").read_text().splitlines()
    assert lines[0] == "student,chapter,score,max_score,status" and len(lines) == 10


def test_results_are_gradescope_documents_with_figures_beside_them(graded):
    _, out, _ = graded
    doc = json.loads((out / "ada" / "ch25" / "results.json").read_text())
    assert doc["score"] == doc["max_score"] == FULL and doc["seed"] == student_seed("3", "ada")
    assert {"name", "score", "max_score", "status", "output"} <= set(doc["tests"][0])
    assert doc["figures"] and all((out / "ada" / "ch25" / f).is_file() for f in doc["figures"])


class Tags(HTMLParser):
    """Every start tag of an HTML page with its attributes, and its text."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def test_every_student_gets_a_feedback_page_with_the_messages_and_the_figures_inline(graded):
    _, out, result = graded
    for student in (r["student"] for r in result.rows):
        assert (out / student / "ch25" / "feedback.html").is_file(), student
    cy = (out / "cy" / "ch25").joinpath
    doc, page = json.loads(cy("results.json").read_text()), Tags(cy("feedback.html").read_text())
    text = "".join(page.text)
    failing = [t for t in doc["tests"] if t["status"] != "passed"]
    public = [t for t in failing if "hidden" not in t["tags"]]
    hidden = [t for t in failing if "hidden" in t["tags"]]
    assert public and hidden
    assert all(t["output"] in text for t in public)  # the public checks' messages, whole
    assert all(t["name"] in text and t["output"] not in text for t in hidden)  # hidden ones: name and verdict only
    images = [a["src"] for tag, a in page.tags if tag == "img"]
    assert len(images) == len(doc["figures"]) > 0  # every figure, inline: the page needs no other file
    drawn = {base64.b64decode(src.removeprefix("data:image/svg+xml;base64,")).decode() for src in images}
    assert drawn == {cy(f).read_text() for f in doc["figures"]}
    assert not [a for tag, a in page.tags if tag in ("link", "script") or (tag == "img" and not a["src"].startswith("data:"))]
    gu = "".join(Tags((out / "gu" / "ch25" / "feedback.html").read_text()).text)
    assert "not graded: no ch25_paged_kv.py or ch25.ipynb" in gu and "score 0/" in gu


def test_the_summary_names_the_misconception_to_teach_again(graded):
    _, out, _ = graded
    summary = json.loads((out / "summary.json").read_text())["ch25"]
    first = next(c for c in summary["checks"] if c["check"].startswith("ch25.1 slot_mapping: figure instance"))
    assert first["failed"] == 2 and first["graded"] == 4  # bo (stub) and cy (logical block)
    assert summary["errors"] == 5
    assert "## ch25" in (out / "summary.md").read_text()


def table_of(out: Path) -> list[dict]:
    return list(csv.DictReader(io.StringIO((out / "grades.csv").read_bytes().decode(), newline="")))


def test_an_untouched_stub_is_not_implemented_check_by_check(graded):
    _, out, _ = graded
    doc = json.loads((out / "bo" / "ch25" / "results.json").read_text())
    assert doc["status"] == "not implemented" and doc["tests"] and all(t.get("todo") for t in doc["tests"])
    wrong = json.loads((out / "cy" / "ch25" / "results.json").read_text())
    assert wrong["status"] == "failed" and not any(t.get("todo") for t in wrong["tests"])


def test_the_summary_counts_every_student_and_says_over_whom(graded):
    _, out, _ = graded
    s = json.loads((out / "summary.json").read_text())["ch25"]
    table = table_of(out)
    scores = [float(r["score"]) for r in table]
    errors = {r["student"]: r["status"].removeprefix("error: ") for r in table if r["status"].startswith("error: ")}
    assert s["students"] == len(table) and s["errors"] == len(errors) > 0
    assert s["mean_score"] == round(statistics.fmean(scores), 2)  # over everybody, the ungraded at 0
    assert s["median_score"] == round(statistics.median(scores), 2)
    assert s["mean_score_graded"] == round(statistics.fmean([float(r["score"]) for r in table if r["student"] not in errors]), 2)
    assert {r["student"]: r["reason"] for r in s["not_graded"]} == errors
    statuses = {}
    for r in table:
        key = "not graded" if r["status"].startswith("error: ") else r["status"]
        statuses[key] = statuses.get(key, 0) + 1
    assert s["statuses"] == statuses
    md = (out / "summary.md").read_text()
    assert f"over all {len(table)} students (the {len(errors)} not graded count as 0)" in md
    assert f"median **{s['median_score']:g}**" in md
    assert all(f"- `{student}`: " in md for student in errors)


def test_wrong_answers_are_grouped_by_their_hint_and_counted_among_wrong_answers(graded):
    _, out, _ = graded
    s = json.loads((out / "summary.json").read_text())["ch25"]
    docs = [json.loads(p.read_text()) for p in sorted(out.glob("*/ch25/results.json"))]
    docs = [d for d in docs if d["status"] != "error"]
    assert any(c["most_common_message"].startswith("hint: ") for c in s["checks"])
    for c in s["checks"]:
        failing = [t for d in docs for t in d["tests"] if t["name"] == c["check"] and t["status"] != "passed"]
        wrong = [t["output"] for t in failing if not t.get("todo")]
        assert (c["failed"], c["wrong"], c["not_implemented"]) == (len(failing), len(wrong), len(failing) - len(wrong))
        assert c["percent_failing"] == round(100 * len(failing) / len(docs))
        if c["most_common_message"].startswith("hint: "):  # the hint line itself, counted over the wrong answers
            assert c["students_with_it"] == sum(c["most_common_message"] in o.splitlines() for o in wrong)
    first = next(c for c in s["checks"] if c["check"].startswith("ch25.1 slot_mapping: figure instance"))
    assert first["not_implemented"] == 1 and first["wrong"] == 1  # bo's stub apart from cy's wrong answer
    assert first["most_common_message"] == "hint: the slot uses the physical block from the table, not the logical position"
    md = (out / "summary.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith(f"| `{first['most_common_message']}` |"))
    assert row.startswith(f"| `{first['most_common_message']}` | 1 | ch25.1 slot_mapping: figure instance")  # cy alone
    assert "(2)" in row  # the check's failing students: cy, and bo's stub
    for d in s["diagnoses"]:  # every diagnosis shown whole, or cut at a word boundary
        line = next(
            line for line in md.splitlines() if line.startswith("| `") and d["diagnosis"].startswith(line[3:].split("`")[0].rstrip("…"))
        )
        shown = line[3:].split("`")[0]
        if shown.endswith("…"):
            shown = shown[:-1]
            assert not (shown[-1].isalnum() and d["diagnosis"][len(shown)].isalnum()), line


def test_the_histogram_is_beside_the_summary_and_counts_everybody(graded):
    _, out, _ = graded
    md = (out / "summary.md").read_text()
    assert f"]({HISTOGRAM})" in md and (out / HISTOGRAM).is_file()
    svg = ET.fromstring((out / HISTOGRAM).read_text())
    texts = {cls: [el.text for el in svg.iter("{http://www.w3.org/2000/svg}text") if el.get("class") == cls] for cls in ("count", "label")}
    table = table_of(out)
    assert sum(int(t) for t in texts["count"]) == len(table)
    assert "0–10%" in texts["label"] and "90–100%" in texts["label"]
    bars = [el.get("class") for el in svg.iter("{http://www.w3.org/2000/svg}rect") if (el.get("class") or "").startswith("bar")]
    assert {"bar graded", "bar not-implemented", "bar not-graded"} <= set(bars)
    s = json.loads((out / "summary.json").read_text())["ch25"]
    assert sum(b["not_graded"] for b in s["histogram"]) == s["errors"]
    full = sum(float(r["score"]) == float(r["max_score"]) for r in table)
    assert s["histogram"][-1]["graded"] == full  # full marks fall in the last band


def test_a_rerun_skips_finished_work_and_changes_nothing(graded):
    subs, out, _ = graded
    before = {p: p.read_text() for p in out.rglob("*.json")}
    again = grade(subs, [CH25], out, jobs=2, sandbox=SANDBOX)
    assert again.graded_now == 0
    assert {p: p.read_text() for p in out.rglob("*.json")} == before


def comparable(out: Path) -> dict:
    return {str(p.relative_to(out)): json.loads(p.read_text()) for p in sorted(out.glob("*/*/results.json"))}


def test_a_run_killed_at_any_moment_resumes_to_the_same_results(tmp_path):
    subs = tmp_path / "subs"
    for i in range(4):
        write(subs / f"s{i}", CH17.filename, SOLUTION17)
    write(subs / "s2", CH17.filename, hang("causal_mask"))
    command = [sys.executable, "-m", "grader.cli", "grade", str(subs), "--chapter", "ch17", "--jobs", "1", "--seed", "5"] + (
        [] if SANDBOX else ["--no-sandbox"]
    )
    whole = tmp_path / "whole"
    subprocess.run(command + ["--out", str(whole)], check=True, capture_output=True)
    cut = tmp_path / "cut"
    killed_tmp = tmp_path / "tmp"  # what a run killed outright cannot remove stays in here
    killed_tmp.mkdir()
    proc = subprocess.Popen(
        command + ["--out", str(cut)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=dict(os.environ, TMPDIR=str(killed_tmp)),
    )
    deadline = time.monotonic() + 120
    while len(list(cut.glob("*/ch17/results.json"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert 2 <= len(list(cut.glob("*/ch17/results.json"))) < 4, "killed mid-way"
    subprocess.run(command + ["--out", str(cut)], check=True, capture_output=True)
    assert comparable(cut) == comparable(whole)
    assert (cut / "grades.csv").read_text() == (whole / "grades.csv").read_text()
    assert not list(cut.glob("*/.*.partial-*"))


# -- the sandbox ---------------------------------------------------------------------------------------
ESCAPES = {
    "reading the solutions next to the grader": (
        "import grader\nfrom pathlib import Path\n"
        "print('ESCAPED', len((Path(grader.__file__).resolve().parents[1] / 'solutions' / 'ch25_paged_kv.py').read_text()))"
    ),
    "reading the solutions by their absolute path": "print('ESCAPED', len(open({solutions!r}).read()))",
    "listing the other students": "import os\nprint('ESCAPED', os.listdir({subs!r}))",
    "writing into the course tree": "open({target!r}, 'w').write('x')\nprint('ESCAPED')",
    "reaching the network": "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('ESCAPED')",
}


def test_each_escape_fails_with_no_credit(tmp_path):
    require_sandbox()
    server = socket.create_server(("127.0.0.1", 0))
    target = chapters.ROOT / "grader" / "escaped.py"
    subs = tmp_path / "subs"
    names = {}
    for i, (name, attempt) in enumerate(ESCAPES.items()):
        code = attempt.format(
            solutions=str(chapters.SOLUTIONS / CH25.filename), subs=str(subs), target=str(target), port=server.getsockname()[1]
        )
        body = (
            "    try:\n"
            + "".join(f"        {line}\n" for line in code.splitlines())
            + "    except Exception as e:\n        print('blocked:', type(e).__name__)\n"
            "    return torch.zeros(len(positions), dtype=torch.int64)\n"
        )
        source = (
            (chapters.EXERCISES / CH25.filename)
            .read_text()
            .replace('    raise NotImplementedError("ch25.1 slot_mapping', body + '    raise NotImplementedError("ch25.1 slot_mapping')
        )
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
    out = subprocess.run(
        [sys.executable, "-m", "grader.cli", "grade", str(subs), "--chapter", "ch25", "--out", str(tmp_path / "out"), "--no-sandbox"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0 and "sandbox: none" in out.stderr
    assert "ada  ch25  " in out.stdout and "passed" in out.stdout
    shutil.rmtree(tmp_path / "out")


def test_time_limits_follow_the_reference_and_are_recorded(graded):
    _, out, _ = graded
    state = json.loads((out / "grading.json").read_text())
    limits = state["time_limits"]["ch25"]
    assert state["secret"] == "3" and "seed" not in state and limits["max"] == 5.0
    assert set(limits["checks"]) == {s.key for s in checks.load("ch25", with_hidden=True)}
    assert all(0.5 <= v <= 5.0 for v in limits["checks"].values())


def test_each_student_has_a_seed_of_their_own_recorded_twice(graded):
    """grading.json records every student's seed (the HMAC of the name under the run's secret, "3"
    here), and each results.json the seed its hidden checks ran on: the same one."""
    _, out, result = graded
    state = json.loads((out / "grading.json").read_text())
    students = {r["student"] for r in result.rows}
    assert set(state["seeds"]) == students and len(set(state["seeds"].values())) == len(students)
    assert state["seeds"] == {s: student_seed("3", s) for s in students}
    assert (out / "grading.json").stat().st_mode & 0o077 == 0  # the secret: the instructor's alone
    for student in students:
        assert json.loads((out / student / "ch25" / "results.json").read_text())["seed"] == state["seeds"][student]


INSTANCES17 = SOLUTION17.replace(
    "def causal_mask(num_tokens: int) -> torch.Tensor:",
    'def causal_mask(num_tokens: int) -> torch.Tensor:\n    raise ValueError(f"instance: {num_tokens!r}")\n\n\n'
    "def _unused(num_tokens: int) -> torch.Tensor:",
)
"""The reference, whose causal_mask shows each check's instance in its output."""


def test_two_students_meet_their_own_hidden_instances_and_a_rerun_the_same(tmp_path):
    subs, out = tmp_path / "subs", tmp_path / "out"
    for student in ("xia", "yan"):
        write(subs / student, CH17.filename, INSTANCES17)
    grade(subs, [CH17], out, jobs=2, sandbox=SANDBOX)  # a secret of its own, recorded

    def hidden(student: str) -> list[str]:
        doc = json.loads((out / student / "ch17" / "results.json").read_text())
        found = [t["output"] for t in doc["tests"] if "hidden" in t["tags"] and "instance: " in t["output"]]
        assert len(found) >= 2, doc["tests"]
        return found

    state = json.loads((out / "grading.json").read_text())
    assert len(state["secret"]) == 64 and state["seeds"]["xia"] != state["seeds"]["yan"]
    assert hidden("xia") != hidden("yan")  # what yan could show of hers is of no use to xia
    before = (out / "yan" / "ch17" / "results.json").read_bytes()
    shutil.rmtree(out / "yan")  # as if the run had been killed before yan: the rerun resumes
    again = grade(subs, [CH17], out, jobs=1, sandbox=SANDBOX)
    assert again.graded_now == 1 and (out / "yan" / "ch17" / "results.json").read_bytes() == before


def test_the_recorded_secret_is_kept_and_an_older_record_is_read(tmp_path, monkeypatch):
    """A rerun keeps the recorded secret and seeds (another --seed is refused); a grading.json written
    before seeds were per student (one "seed") has its seed taken as the secret."""
    monkeypatch.setattr(grade_module, "calibrate", lambda ch, seed, limit: {"max": limit, "checks": {}})
    seeds, _ = _state(tmp_path, None, False, [CH17], 5.0, ["ada", "bo"])
    state = json.loads((tmp_path / "grading.json").read_text())
    assert seeds == state["seeds"] == {s: student_seed(state["secret"], s) for s in ("ada", "bo")} and seeds["ada"] != seeds["bo"]
    later = _state(tmp_path, None, False, [CH17], 5.0, ["ada", "bo", "cy"])[0]  # a student added: the others keep theirs
    assert later == {**seeds, "cy": student_seed(state["secret"], "cy")}
    with pytest.raises(GradeError, match="another secret"):
        _state(tmp_path, 5, False, [CH17], 5.0, ["ada"])
    (tmp_path / "grading.json").write_text(json.dumps({"seed": 5, "time_limits": {}, "chapters": []}))
    assert _state(tmp_path, 5, False, [CH17], 5.0, ["ada"])[0] == {"ada": student_seed("5", "ada")}


# -- one student never ends the run (ch17, the quickest chapter) ----------------------------------------------
SHAPE = 'a notebook is a JSON object whose "cells" is a list of cells, each with a "source" string or list of strings'


def cell(source) -> dict:
    return {"cell_type": "code", "metadata": {}, "outputs": [], "source": source}


MALFORMED = {  # student: (file, contents, words its error row must have)
    "nb-empty-object": ("ch17.ipynb", "{}", [SHAPE, 'it has no "cells"']),
    "nb-list": ("ch17.ipynb", "[]", [SHAPE, "it is a list"]),
    "nb-cells-object": ("ch17.ipynb", '{"cells": {"a": 1}}', [SHAPE, '"cells" is an object']),
    "nb-cells-ints": ("ch17.ipynb", '{"cells": [1, 2]}', [SHAPE, "cell 1 is a number"]),
    "nb-cells-nan": ("ch17.ipynb", '{"cells": NaN}', [SHAPE, '"cells" is NaN']),
    "nb-source-null": ("ch17.ipynb", json.dumps({"cells": [cell(None)]}), [SHAPE, '"source" of code cell 1 is null']),
    "nb-source-ints": ("ch17.ipynb", json.dumps({"cells": [cell([1, 2])]}), [SHAPE, "a list holding a number"]),
    "nb-nested-deeply": ("ch17.ipynb", "[" * 100_000 + "]" * 100_000, [SHAPE, "RecursionError"]),
    "nb-not-json": ("ch17.ipynb", "{ this is not json", ["not JSON"]),
    "nb-code-over-1mib": ("ch17.ipynb", json.dumps({"cells": [cell("#" * (3 << 19))]}), ["over 1 MiB of code"]),
    "nb-cell-recursion": (
        "ch17.ipynb",
        json.dumps({"cells": [cell("def causal_mask(n):\n    return " + " + ".join(["1"] * 100_000))]}),
        ["cannot be compiled", "RecursionError"],
    ),
    "py-memory-error": (CH17.filename, "x = " + "-" * 100_000 + "1", ["cannot be compiled", "MemoryError"]),
    "py-recursion-error": (CH17.filename, "x = " + " + ".join(["1"] * 100_000), ["cannot be compiled", "RecursionError"]),
    "py-nul-byte": (CH17.filename, SOLUTION17 + "\0\n", ["contains a NUL byte"]),
    "py-syntax-error": (CH17.filename, "def causal_mask(:\n", ["SyntaxError at line 1"]),
    "py-not-utf8": (CH17.filename, b"\xff\xfe not utf-8", ["not UTF-8"]),
}
LAYOUTS = {  # student: the files of their folder, each graded like the reference (made by make_odd_class)
    "lms-nested": {f"ch17/{CH17.filename}": SOLUTION17, "ch17/README.txt": "my notes"},
    "misnamed": {"ch17.py": SOLUTION17, "notes.txt": "x", ".ipynb_checkpoints/ch17-checkpoint.ipynb": "{}"},
}
ZIPS = {  # a student's zip in SUBMISSIONS: its members
    "zipped.zip": {f"zipped/ch17/{CH17.filename}": SOLUTION17, "__MACOSX/zipped/._notes": "junk"},
    "zip-evil.zip": {f"../{CH17.filename}": SOLUTION17},
    "twice.zip": {CH17.filename: SOLUTION17},
    "zip-nothing.zip": {"work/notes.txt": "x", "work/ch17.txt": "x"},
}
SPECIAL = {  # student: words its error row must have (made by make_odd_class)
    "link-to-proc": ["symbolic link (to '/proc/self/pagemap')", "never followed"],
    "link-to-another-student": ["symbolic link", "never followed"],
    "folder-is-a-link": ["folder-is-a-link is a symbolic link, not a folder"],
    "fifo": ["FIFO (named pipe)"],
    "file-is-a-folder": ["is a folder, not a regular file"],
    "py-over-1mib": ["2 MiB, over the 1 MiB"],
    "nothing": ["no ch17_causal_masks.py or ch17.ipynb in nothing/"],
    "zip-evil": ["zip-evil.zip holds '../ch17_causal_masks.py', a path that leaves the zip (..)"],
    "zip-link": ["zip-link.zip is a symbolic link: links are never followed"],
    "zip-nothing": [
        "no ch17_causal_masks.py or ch17.ipynb in zip-nothing.zip (in its folder work/), nor one folder "
        "down; found: ch17.txt (rename it ch17_causal_masks.py), notes.txt"
    ],
    "twice": ["twice/ and twice.zip are both in subs/, each could be twice's submission: keep one of them"],
    "tarball": ["tarball.tar.gz: only zip files are opened; make it tarball.zip"],
}
RESERVED = ["grades.csv", "grading.json", "summary.md", "summary.json", "_grades.csv"]
FORMULAS = ['=HYPERLINK("evil.example","x")', "+1+1", "-2+3", "@SUM(A1)", "\tx", "\rx"]
STRANGE = 'o\'neil, "jr"\n名 ü'
MARKUP = "<img src=x onerror=alert(1)> & <script>alert(2)<\\script>"


def make_odd_class(root: Path) -> Path:
    subs = root / "subs"
    write(subs / "ok", CH17.filename, SOLUTION17)
    write(subs / "bom", CH17.filename, b"\xef\xbb\xbf" + SOLUTION17.encode())
    nb = chapter_notebook(CH17)  # all correct, with 6 MiB of outputs and prose: only its code counts
    nb["cells"][2]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "x" * (3 << 20)}]
    nb["cells"].append({"cell_type": "markdown", "metadata": {}, "source": "y" * (3 << 20)})
    write(subs / "nb-big-outputs", "ch17.ipynb", json.dumps(nb))
    for student, (name, data, _) in MALFORMED.items():
        write(subs / student, name, data)
    (subs / "link-to-proc").mkdir()
    (subs / "link-to-proc" / CH17.filename).symlink_to("/proc/self/pagemap")
    (subs / "link-to-another-student").mkdir()
    (subs / "link-to-another-student" / CH17.filename).symlink_to(Path("..") / "ok" / CH17.filename)
    (subs / "folder-is-a-link").symlink_to(subs / "ok")
    (subs / "fifo").mkdir()
    os.mkfifo(subs / "fifo" / CH17.filename)
    (subs / "file-is-a-folder" / CH17.filename).mkdir(parents=True)
    write(subs / "py-over-1mib", CH17.filename, "")
    os.truncate(subs / "py-over-1mib" / CH17.filename, 2 << 20)
    (subs / "nothing").mkdir()
    write(subs / "grades.csv", CH17.filename, SOLUTION17)
    for name in RESERVED[1:]:
        (subs / name).mkdir()
    write(subs / ".alice", CH17.filename, SOLUTION17)
    for name in FORMULAS:
        (subs / name).mkdir()
    write(subs / STRANGE, CH17.filename, SOLUTION17)
    write(
        subs / MARKUP, CH17.filename, SOLUTION17.replace("return torch.ones(num_tokens, num_tokens, dtype=torch.bool).tril()", "return 0")
    )
    os.mkdir(os.fsencode(subs) + b"/\xff-not-utf8")
    (subs / "a-file-beside-the-folders.txt").write_text("not a student")
    for student, files in LAYOUTS.items():
        for name, data in files.items():
            write((subs / student / name).parent, Path(name).name, data)
    for name, members in ZIPS.items():
        with zipfile.ZipFile(subs / name, "w", zipfile.ZIP_DEFLATED) as z:
            for member, data in members.items():
                z.writestr(member, data)
    write(subs / "twice", CH17.filename, SOLUTION17)
    (subs / "tarball.tar.gz").write_bytes(b"\x1f\x8b not a zip")
    (subs / "zip-link.zip").symlink_to(subs / "zipped.zip")
    return subs


@pytest.fixture(scope="module")
def odd(tmp_path_factory):
    root = tmp_path_factory.mktemp("odd")
    subs = make_odd_class(root)
    out = root / "out"
    heard = []
    result = grade(subs, [CH17], out, jobs=2, seed=7, sandbox=SANDBOX, on_item=heard.append)
    return subs, out, result, {r["student"]: r for r in result.rows}, heard


@pytest.mark.parametrize("student", list(MALFORMED) + list(SPECIAL))
def test_each_malformed_input_is_one_clear_error_row(odd, student):
    _, out, _, rows, _ = odd
    words = MALFORMED[student][2] if student in MALFORMED else SPECIAL[student]
    assert rows[student]["status"].startswith("error: ") and rows[student]["score"] == 0, rows[student]
    assert all(w in rows[student]["status"] for w in words), rows[student]["status"]
    doc = json.loads((out / student / "ch17" / "results.json").read_text())
    assert doc["status"] == "error" and not doc.get("retry")  # recorded: a rerun keeps it


def test_a_link_to_another_students_file_is_not_their_grade(odd):
    _, _, _, rows, _ = odd
    assert rows["ok"]["score"] == FULL17
    assert rows["link-to-another-student"]["score"] == rows["folder-is-a-link"]["score"] == 0


def test_a_byte_order_mark_scores_like_the_same_file_without(odd):
    _, out, _, rows, _ = odd
    assert (rows["bom"]["score"], rows["bom"]["status"]) == (FULL17, "passed")
    verdicts = [
        [(t["name"], t["score"], t["status"]) for t in json.loads((out / s / "ch17" / "results.json").read_text())["tests"]]
        for s in ("ok", "bom")
    ]
    assert verdicts[0] == verdicts[1]


def test_a_notebooks_outputs_and_prose_do_not_count_against_the_bound(odd):
    _, _, _, rows, _ = odd
    assert (rows["nb-big-outputs"]["score"], rows["nb-big-outputs"]["status"]) == (FULL17, "passed")


def test_reserved_folder_names_neither_collide_nor_overwrite(odd):
    _, out, _, rows, _ = odd
    assert (out / "grades.csv").read_bytes().startswith(b"student,chapter,score,max_score,status\r\n")
    assert json.loads((out / "grading.json").read_text())["secret"] == "7"
    assert "ch17" in json.loads((out / "summary.json").read_text())
    assert (out / "summary.md").read_text().startswith("# Class summary")
    assert rows["grades.csv"]["score"] == FULL17
    assert json.loads((out / "_grades.csv" / "ch17" / "results.json").read_text())["score"] == FULL17
    for name in RESERVED:
        assert rows[name]["status"] != "passed" or name == "grades.csv"
        assert results_dir(out, name, "ch17") == out / ("_" + name) / "ch17"
        assert (results_dir(out, name, "ch17") / "results.json").is_file(), name
    assert (out / "__grades.csv" / "ch17").is_dir()  # "_grades.csv" is not "grades.csv" escaped
    assert rows["_grades.csv"]["status"].startswith("error: no ch17")


def test_a_dot_folder_gets_a_row_saying_it_was_skipped(odd):
    _, out, _, rows, _ = odd
    assert rows[".alice"]["score"] == 0
    assert "was skipped: its name starts with a dot" in rows[".alice"]["status"]
    assert not (out / ".alice").exists()
    _, _, result, _, _ = odd
    summary = json.loads((out / "summary.json").read_text())["ch17"]  # no student: counted nowhere
    assert summary["students"] == len(result.rows) - 1 and [r["student"] for r in summary["skipped"]] == [".alice"]
    line = result.count_line()
    total, graded, errors = map(int, re.match(r"(\d+) results = (\d+) graded \+ (\d+) could not be graded", line).groups())
    assert total == graded + errors == summary["students"] and line.endswith("skipped, not students: .alice/")


def test_csv_cells_a_spreadsheet_would_run_are_escaped(odd):
    _, out, _, rows, _ = odd
    table = list(csv.DictReader(io.StringIO((out / "grades.csv").read_bytes().decode(), newline="")))
    students = [r["student"] for r in table]
    for name in FORMULAS:  # a formula quoted; a tab or CR shown as its escape, so no longer a formula either
        shown = "'" + name if name.startswith(("=", "+", "-", "@")) else name.replace("\t", "\\t").replace("\r", "\\r")
        assert name in rows and shown in students, name
    assert not any(s.startswith(("=", "+", "-", "@", "\t", "\r")) for s in students)
    assert "ok" in students and "grades.csv" in students  # others as they are


def test_any_student_name_works(odd):
    subs, out, result, rows, _ = odd
    assert (rows[STRANGE]["score"], rows[STRANGE]["status"]) == (FULL17, "passed")
    assert json.loads((out / STRANGE / "ch17" / "results.json").read_text())["score"] == FULL17
    table = list(csv.DictReader(io.StringIO((out / "grades.csv").read_bytes().decode(), newline="")))
    assert STRANGE.replace("\n", "\\n") in [r["student"] for r in table]  # its line break as an escape
    assert rows["\\xff-not-utf8"]["status"].startswith("error: no ch17")  # a name that is not UTF-8, escaped
    students = {
        re.sub(r"(\.zip|\.tar\.gz)$", "", p.name)
        for p in subs.iterdir()
        if p.is_dir() or p.is_symlink() or p.name.endswith((".zip", ".tar.gz"))
    }
    assert len(result.rows) == len(students) == len(table)  # one row per student folder or zip, nothing else


def test_a_name_that_is_markup_is_text_in_the_feedback_page(odd):
    _, out, _, rows, _ = odd
    assert rows[MARKUP]["status"] == "failed"
    page = Tags((out / MARKUP / "ch17" / "feedback.html").read_text())
    figures = json.loads((out / MARKUP / "ch17" / "results.json").read_text())["figures"]
    assert [tag for tag, _ in page.tags if tag in ("script", "img")] == ["img"] * len(figures)  # the figures, nothing the name made
    assert not [a for _, a in page.tags if any(k.startswith("on") for k in a)]
    assert MARKUP in "".join(page.text)


def test_each_accepted_layout_is_graded_like_the_reference(odd):
    _, out, _, rows, _ = odd
    wheres = {
        "lms-nested": f"lms-nested/ch17/{CH17.filename}",
        "misnamed": "misnamed/ch17.py",
        "zipped": f"zipped.zip: zipped/ch17/{CH17.filename}",
    }
    for student, where in wheres.items():
        assert (rows[student]["score"], rows[student]["status"]) == (FULL17, "passed"), rows[student]
        assert json.loads((out / student / "ch17" / "results.json").read_text())["answer"] == where
    md = (out / "summary.md").read_text()
    renamed = md.split("### Graded under another name", 1)[1].split("###", 1)[0]
    assert "`misnamed`: `misnamed/ch17.py`" in renamed and "lms-nested" not in renamed and "zipped" not in renamed


def test_rows_come_alphabetically_whatever_order_the_jobs_finish_in(odd):
    _, _, result, _, heard = odd
    students = [r["student"] for r in result.rows]
    assert students == sorted(students, key=lambda s: (s.casefold(), s))
    assert heard == [r for r in result.rows if not r["student"].startswith(".")]  # what `course grade` prints


def test_rows_are_handed_on_in_order_each_as_soon_as_it_can_be():
    items = [Item(f"s{i}", "ch17", "subs") for i in range(8)]
    arrival = items[:]
    random.Random(1).shuffle(arrival)
    emitted, seen = [], []
    in_order = InOrder(items, emitted.append)
    for item in arrival:
        in_order(item, {"student": item.student})
        seen.append(item)
        ready = next((n for n, i in enumerate(items) if i not in seen), len(items))  # all before it have come
        assert [r["student"] for r in emitted] == [i.student for i in items[:ready]]
    assert arrival != items and [r["student"] for r in emitted] == [i.student for i in items]


def test_an_unexpected_exception_is_that_items_error_row(tmp_path, monkeypatch):
    from grader import run

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(run, "check", broken)
    write(tmp_path / "subs" / "ada", CH17.filename, SOLUTION17)
    out = tmp_path / "out"
    config = _Config(
        out=str(out),
        seeds={"ada": 1},
        limits={"ch17": {"max": 1.0, "checks": {}}},
        memory_limit=2 << 30,
        sandbox=None,
        scratch=str(tmp_path),
    )
    item = Item("ada", "ch17", str(tmp_path / "subs"), CH17.filename)
    result = _grade(item, config)
    assert result["status"] == "error: the grader failed on this submission (RuntimeError: boom); a rerun grades it again"
    assert json.loads((out / "ada" / "ch17" / "results.json").read_text())["retry"] is True
    assert _needs_grading(out, item)
    assert [p.name for p in (out / "ada").iterdir()] == ["ch17"]  # no partial folder left


def partial_of(out: Path, student: str, timeout: float = 120) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = list((out / student).glob(".ch17.partial-*"))
        if found:
            return found[0]
        time.sleep(0.01)
    raise AssertionError(f"{student} was never being graded")


def test_a_job_process_that_dies_costs_only_its_item_and_a_rerun_grades_it_again(tmp_path, monkeypatch):
    subs, out, tmp = tmp_path / "subs", tmp_path / "out", tmp_path / "tmp"
    tmp.mkdir()
    # this process's warm process (the calibration's) lives as long as the process, its folder where tempdir was
    # when it was made: made first, so that it is not in `tmp` when this test is the process's first to grade
    warm_launcher()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    write(subs / "a-killed", CH17.filename, hang("causal_mask"))
    write(subs / "b-next", CH17.filename, SOLUTION17)
    result = {}
    run = threading.Thread(target=lambda: result.update(r=grade(subs, [CH17], out, jobs=1, seed=2, sandbox=SANDBOX)), daemon=True)
    run.start()
    job = int(partial_of(out, "a-killed").name.rsplit("-", 1)[1])  # the job process grading a-killed
    os.kill(job, signal.SIGKILL)
    run.join(300)
    assert not run.is_alive(), "the run did not end"
    rows = {r["student"]: r for r in result["r"].rows}
    assert rows["a-killed"]["status"].startswith("error: the grading process died (killed by signal 9 (SIGKILL))")
    assert (rows["b-next"]["score"], rows["b-next"]["status"]) == (FULL17, "passed")
    assert len((out / "grades.csv").read_text().splitlines()) == 3
    assert not list(out.glob("*/.*.partial-*"))
    assert list(tmp.iterdir()) == []  # the dead process's folders (its sandbox's included) are removed
    before = (out / "b-next" / "ch17" / "results.json").read_text()
    again = grade(subs, [CH17], out, jobs=1, sandbox=SANDBOX)  # resumes: only the item the dead process cost
    assert again.graded_now == 1
    rows = {r["student"]: r for r in again.rows}
    assert rows["a-killed"]["status"] == "failed" and 0 < rows["a-killed"]["score"] < FULL17
    assert (out / "b-next" / "ch17" / "results.json").read_text() == before


@pytest.mark.parametrize("ignored", [False, True], ids=["ctrl-c", "ctrl-c-ignored"])
def test_an_interrupted_run_removes_its_temporary_folders(tmp_path, ignored):
    subs, out, tmp = tmp_path / "subs", tmp_path / "out", tmp_path / "tmp"
    tmp.mkdir()
    write(subs / "a-done", CH17.filename, STUB17)
    # loops on import, which may take the run's flat limit: still being graded when Ctrl-C comes, however slow the
    # machine (a loop in a function ends at its check's calibrated limit, 0.5 s)
    write(subs / "b-hangs", CH17.filename, "while True:\n    pass\n" + SOLUTION17)
    limit = 3 if ignored else 60
    command = [sys.executable, "-m", "grader.cli", "grade", str(subs), "--chapter", "ch17", "--out", str(out), "--jobs", "1"]
    command += ["--seed", "4", "--time-limit", str(limit)] + ([] if SANDBOX else ["--no-sandbox"])
    # Ctrl-C as at a terminal, or as where the run was started with it ignored (`course grade … &` in a script; a
    # suite started so has it ignored too, and a child inherits that)
    disposition = signal.SIG_IGN if ignored else signal.SIG_DFL
    proc = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, TMPDIR=str(tmp)),
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, disposition),
    )
    try:
        partial_of(out, "b-hangs")
        time.sleep(0.5)
        assert list(tmp.iterdir()), "a run makes its temporary folders here"
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C, as a terminal sends it: to the whole process group
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert list(tmp.iterdir()) == []
    assert not list(out.glob("*/.*.partial-*"))
    assert (out / "a-done" / "ch17" / "results.json").is_file()
    if ignored:  # every process of the run ignores it: b-hangs is graded as ever, not lost by its job alone
        assert proc.returncode == 0, err
        status = json.loads((out / "b-hangs" / "ch17" / "results.json").read_text())["tests"][0]["output"]
        assert f"importing ch17_causal_masks.py did not finish within {limit} s" in status, status
    else:
        assert proc.returncode == 130 and "interrupted" in err, err
        assert not (out / "b-hangs" / "ch17").exists()


# -- the class summary from made-up results (grader.delivery.summary) ----------------------------------------------------
LONG = (
    "the free list should be [12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, "
    "33, 34, 35, 36, 37, 38, 39, 40] after freeing sequence 3; yours keeps blocks 12 and 13 allocated although "
    "their reference counts reached zero"
)
HINTED = ["slot 3 should be 7; yours: 2\nhint: use the block table", "slot 9 should be 11; yours: 0\nhint: use the block table"]
UNHINTED = "slot 4 should be 2; yours: 1"


def made_up_class() -> tuple[list[Item], list[dict]]:
    """Six students of two-point checks t1..t3: their outcomes (None: passed, "todo": the stub, else the message)."""
    outcomes = {
        "a": {},
        "b": {"t1": HINTED[0], "t3": "the mask is upside down"},
        "c": {"t1": HINTED[1], "t2": LONG},
        "d": {"t1": UNHINTED, "t3": "the mask has the wrong shape"},
        "e": {"t1": "todo", "t2": "todo", "t3": "todo"},
    }
    items, docs = [], []
    for student, failed in outcomes.items():
        tests = [
            {
                "name": t,
                "status": "failed" if t in failed else "passed",
                "output": failed.get(t, ""),
                **({"todo": True} if failed.get(t) == "todo" else {}),
            }
            for t in ("t1", "t2", "t3")
        ]
        status = "passed" if not failed else "not implemented" if all(v == "todo" for v in failed.values()) else "failed"
        docs.append(
            {
                "chapter": "ch17",
                "score": 2.0 * sum(t["status"] == "passed" for t in tests),
                "max_score": 6.0,
                "status": status,
                "tests": tests,
            }
        )
        items.append(Item(student, "ch17", "subs", CH17.filename, renamed=student == "d"))
    items.append(Item("f|`x\ny", "ch17", "subs", problem="no file"))
    docs.append({"chapter": "ch17", "score": 0.0, "max_score": 6.0, "status": "error", "error": "no file", "tests": []})
    return items, docs


def test_the_summary_of_a_made_up_class():
    items, docs = made_up_class()
    s = summarize(items, [CH17], docs)["ch17"]
    scores = [d["score"] for d in docs]
    assert (s["mean_score"], s["median_score"]) == (round(statistics.fmean(scores), 2), statistics.median(scores))
    assert s["mean_score_graded"] == round(statistics.fmean(scores[:-1]), 2)
    assert s["not_graded"] == [{"student": "f|`x\ny", "reason": "no file"}]
    checks_ = {c["check"]: c for c in s["checks"]}
    t1 = checks_["t1"]
    assert (t1["failed"], t1["not_implemented"], t1["wrong"]) == (4, 1, 3)
    assert (t1["most_common_message"], t1["students_with_it"], t1["kinds_of_message"]) == ("hint: use the block table", len(HINTED), 2)
    failing = {t: sum(any(x["name"] == t and x["status"] != "passed" for x in d["tests"]) for d in docs) for t in ("t1", "t2", "t3")}
    assert [c["check"] for c in s["checks"]] == sorted(failing, key=lambda t: -failing[t])  # most failing first
    assert s["not_implemented"] == [{"task": t, "students": 1} for t in ("t1", "t2", "t3")]
    assert [b["graded"] + b["not_implemented"] + b["not_graded"] for b in s["histogram"]] == [
        sum(min(9, int(10 * d["score"] / 6.0 + 1e-9)) == band for d in docs) for band in range(10)
    ]
    md = summary_markdown(summarize(items, [CH17], docs))
    assert "6 students = 1 passed + 3 failed + 1 not implemented + 1 not graded." in md
    assert f"| `hint: use the block table` | {len(HINTED)} | t1 (4) |" in md  # one row, the check it covers failed by 4
    assert "| `the mask is upside down` | 1 | t3 (3) |" in md and "| `the mask has the wrong shape` | 1 | t3 (3) |" in md
    t2 = next(line for line in md.splitlines() if "| t2 (2) |" in line)
    shown = re.search(r"`([^`]*)…`", t2).group(1)
    assert LONG.startswith(shown) and not LONG[len(shown)].isalnum() and len(shown) < len(LONG)
    assert "- ``f|`x\\ny``: no file" in md and not any(line.startswith("y") for line in md.splitlines())  # a code span, as it is
    assert "- `d`: `d/ch17_causal_masks.py` graded as the chapter's module" in md


def test_a_dot_folder_is_no_student_and_a_diagnosis_is_one_row_whatever_it_fails():
    items, docs = made_up_class()
    items.insert(0, Item(".DS_Store_dir", "ch17", "subs", problem="skipped: its name starts with a dot", recorded=False))
    docs.insert(0, {"chapter": "ch17", "score": 0.0, "max_score": 6.0, "status": "error", "error": "skipped", "tests": []})
    same = "hint: free the tail first"
    items.append(Item("g", "ch17", "subs", CH17.filename))
    tests = [
        {"name": t, "status": "failed", "output": f"step {n}: the free list differs\n{same}"} for n, t in enumerate(("t1", "t2", "t3"))
    ]
    docs.append({"chapter": "ch17", "score": 0.0, "max_score": 6.0, "status": "failed", "tests": tests})
    s = summarize(items, [CH17], docs)["ch17"]
    assert s["students"] == 7 and s["skipped"] == [{"student": ".DS_Store_dir", "reason": "skipped"}]
    assert s["mean_score"] == round(statistics.fmean([d["score"] for d in docs[1:]]), 2)  # the dot folder's 0 not in it
    assert sum(sum(b[k] for k in ("graded", "not_implemented", "not_graded")) for b in s["histogram"]) == 7
    md = summary_markdown(s and {"ch17": s})
    assert "7 students = 1 passed + 4 failed + 1 not implemented + 1 not graded." in md  # it adds up
    assert "Not students, skipped: `.DS_Store_dir/`" in md and "- `.DS_Store_dir`" not in md
    rows = [line for line in md.splitlines() if same in line]
    assert rows == [f"| `{same}` | 1 | t1 (5), t2 (3), t3 (4) |"]  # one row, every check it covers


def test_messages_group_by_hint_or_by_first_line_whatever_their_numbers():
    assert message_group(HINTED[0])[1] == message_group(HINTED[1])[1] != message_group(UNHINTED)[1]
    assert message_group(UNHINTED)[1] == message_group("slot 40 should be -1; yours: 0.5\nmore lines")[1]
    assert message_group("wrong\n(your code printed: 'hint: fake')")[0] == "first line"  # the student's print is not a hint
    assert message_group("")[2] == "(no message)"
    case = "inputs: block_size=2, positions=[0, 1]\nslot 1 should be 7; yours: 1"  # the case, the same for everybody
    assert message_group(case)[2] == "slot 1 should be 7; yours: 1"
    assert message_group(case)[1] == message_group(UNHINTED)[1]


@pytest.mark.parametrize("limit", [10, 33, 60, 159])
def test_a_message_is_cut_at_a_word_boundary(limit):
    cut = clip(LONG, limit)
    assert len(cut) <= limit and cut.endswith("…")
    kept = cut[:-1]
    assert LONG.startswith(kept) and not (kept[-1].isalnum() and LONG[len(kept)].isalnum())
    assert clip("short", limit) == "short"
    assert clip("x" * 200, limit) == "x" * (limit - 1) + "…"  # one word longer than the line: cut, marked


def test_printed_rows_are_sorted_and_a_layout_fixed_later_is_graded_on_rerun(tmp_path):
    subs, out = tmp_path / "subs", tmp_path / "out"
    write(subs / "a-graded", CH17.filename, SOLUTION17)  # takes seconds: the error rows after it are done first
    for student in ("B-nothing", "c-nothing", "d-fixed-later"):
        write(subs / student, "notes.txt", "x")
    command = [
        sys.executable,
        "-m",
        "grader.cli",
        "grade",
        str(subs),
        "--chapter",
        "ch17",
        "--out",
        str(out),
        "--jobs",
        "2",
        "--seed",
        "3",
    ] + ([] if SANDBOX else ["--no-sandbox"])
    first = subprocess.run(command, capture_output=True, text=True, check=True)
    printed = [line.split("  ")[0] for line in first.stdout.splitlines() if "  ch17  " in line]
    names = [p.name for p in subs.iterdir()]
    assert printed == sorted(names, key=str.casefold) != sorted(names)  # alphabetically, case aside: a before B
    write(subs / "d-fixed-later" / "ch17", CH17.filename, SOLUTION17)  # the LMS layout, now accepted
    again = subprocess.run(command, capture_output=True, text=True, check=True)
    assert "1 of 4 chapter submissions to grade (3 graded already)" in again.stdout
    rows = {r["student"]: r for r in table_of(out)}
    assert (float(rows["d-fixed-later"]["score"]), rows["d-fixed-later"]["status"]) == (FULL17, "passed")


def test_a_chinese_class_summary_groups_by_hint_and_speaks_chinese():
    from grader.i18n import choose

    choose.set_language("zh")
    try:
        hinted = ["槽 3 应为 7；你的：2\n提示：使用 block table", "槽 9 应为 11；你的：0\n提示：使用 block table"]
        assert message_group(hinted[0])[:2] == message_group(hinted[1])[:2] and message_group(hinted[0])[0] == "hint"
        assert message_group("错了\n（你的代码输出：'提示：假的'）")[0] == "first line"  # the student's print is not a hint
        assert message_group("输入：block_size=2\n槽 1 应为 7；你的：1")[2] == "槽 1 应为 7；你的：1"
        items, docs = made_up_class()
        md = summary_markdown(summarize(items, [CH17], docs))
    finally:
        choose.set_language("en")
    assert md.startswith("# 全班汇总") and "6 名学生 = 1 名通过 + 3 名未通过 + 1 名未实现 + 1 名未批改。" in md
    assert f"| `hint: use the block table` | {len(HINTED)} | t1 (4) |" in md  # an English report's hints still group
