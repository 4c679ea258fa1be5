"""`course grade`: a class of real and broken submissions, resumed runs, a run killed
mid-way, a job process killed mid-item, an interrupted run, every kind of malformed input
and odd student folder, and the sandbox against each escape a student might try."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from mutate import mutant

from grader import chapters, checks
from grader.grade import Item, _Config, _grade, _needs_grading, grade, results_dir
from grader.notebook import chapter_notebook
from grader.isolation.sandbox import SandboxUnavailable, probe

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
    return SOLUTION17.replace(f"def {function}(", f"def {function}(*args, **kwargs):\n    while True:\n"
                              f"        pass\n\n\ndef _unused_{function}(")


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
    return subs, out, grade(subs, [CH25], out, jobs=2, seed=3, sandbox=SANDBOX)


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
    command = [sys.executable, "-m", "grader.cli", "grade", str(subs), "--chapter", "ch17", "--jobs", "1",
               "--seed", "5"] + ([] if SANDBOX else ["--no-sandbox"])
    whole = tmp_path / "whole"
    subprocess.run(command + ["--out", str(whole)], check=True, capture_output=True)
    cut = tmp_path / "cut"
    killed_tmp = tmp_path / "tmp"  # what a run killed outright cannot remove stays in here
    killed_tmp.mkdir()
    proc = subprocess.Popen(command + ["--out", str(cut)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, env=dict(os.environ, TMPDIR=str(killed_tmp)))
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
    "nb-cell-recursion": ("ch17.ipynb", json.dumps({"cells": [cell("def causal_mask(n):\n    return "
                                                                   + " + ".join(["1"] * 100_000))]}),
                          ["cannot be compiled", "RecursionError"]),
    "py-memory-error": (CH17.filename, "x = " + "-" * 100_000 + "1", ["cannot be compiled", "MemoryError"]),
    "py-recursion-error": (CH17.filename, "x = " + " + ".join(["1"] * 100_000), ["cannot be compiled", "RecursionError"]),
    "py-nul-byte": (CH17.filename, SOLUTION17 + "\0\n", ["contains a NUL byte"]),
    "py-syntax-error": (CH17.filename, "def causal_mask(:\n", ["SyntaxError at line 1"]),
    "py-not-utf8": (CH17.filename, b"\xff\xfe not utf-8", ["not UTF-8"]),
}
SPECIAL = {  # student: words its error row must have (made by make_odd_class)
    "link-to-proc": ["symbolic link (to '/proc/self/pagemap')", "never followed"],
    "link-to-another-student": ["symbolic link", "never followed"],
    "folder-is-a-link": ["folder-is-a-link is a symbolic link, not a folder"],
    "fifo": ["FIFO (named pipe)"],
    "file-is-a-folder": ["is a folder, not a regular file"],
    "py-over-1mib": ["2 MiB, over the 1 MiB"],
    "nothing": ["no ch17_causal_masks.py or ch17.ipynb in nothing/"],
}
RESERVED = ["grades.csv", "grading.json", "summary.md", "summary.json", "_grades.csv"]
FORMULAS = ['=HYPERLINK("evil.example","x")', "+1+1", "-2+3", "@SUM(A1)", "\tx", "\rx"]
STRANGE = "o'neil, \"jr\"\n名 ü"


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
    os.mkdir(os.fsencode(subs) + b"/\xff-not-utf8")
    (subs / "a-file-beside-the-folders.txt").write_text("not a student")
    return subs


@pytest.fixture(scope="module")
def odd(tmp_path_factory):
    root = tmp_path_factory.mktemp("odd")
    subs = make_odd_class(root)
    out = root / "out"
    result = grade(subs, [CH17], out, jobs=2, seed=7, sandbox=SANDBOX)
    return subs, out, result, {r["student"]: r for r in result.rows}


@pytest.mark.parametrize("student", list(MALFORMED) + list(SPECIAL))
def test_each_malformed_input_is_one_clear_error_row(odd, student):
    _, out, _, rows = odd
    words = MALFORMED[student][2] if student in MALFORMED else SPECIAL[student]
    assert rows[student]["status"].startswith("error: ") and rows[student]["score"] == 0, rows[student]
    assert all(w in rows[student]["status"] for w in words), rows[student]["status"]
    doc = json.loads((out / student / "ch17" / "results.json").read_text())
    assert doc["status"] == "error" and not doc.get("retry")  # recorded: a rerun keeps it


def test_a_link_to_another_students_file_is_not_their_grade(odd):
    _, _, _, rows = odd
    assert rows["ok"]["score"] == FULL17
    assert rows["link-to-another-student"]["score"] == rows["folder-is-a-link"]["score"] == 0


def test_a_byte_order_mark_scores_like_the_same_file_without(odd):
    _, out, _, rows = odd
    assert (rows["bom"]["score"], rows["bom"]["status"]) == (FULL17, "passed")
    verdicts = [[(t["name"], t["score"], t["status"]) for t in
                 json.loads((out / s / "ch17" / "results.json").read_text())["tests"]] for s in ("ok", "bom")]
    assert verdicts[0] == verdicts[1]


def test_a_notebooks_outputs_and_prose_do_not_count_against_the_bound(odd):
    _, _, _, rows = odd
    assert (rows["nb-big-outputs"]["score"], rows["nb-big-outputs"]["status"]) == (FULL17, "passed")


def test_reserved_folder_names_neither_collide_nor_overwrite(odd):
    _, out, _, rows = odd
    assert (out / "grades.csv").read_bytes().startswith(b"student,chapter,score,max_score,status\r\n")
    assert json.loads((out / "grading.json").read_text())["seed"] == 7
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
    _, out, _, rows = odd
    assert rows[".alice"]["score"] == 0
    assert "was skipped: its name starts with a dot" in rows[".alice"]["status"]
    assert not (out / ".alice").exists()


def test_csv_cells_a_spreadsheet_would_run_are_escaped(odd):
    _, out, _, rows = odd
    table = list(csv.DictReader(io.StringIO((out / "grades.csv").read_bytes().decode(), newline="")))
    students = [r["student"] for r in table]
    for name in FORMULAS:
        assert name in rows and "'" + name in students, name
    assert not any(s.startswith(("=", "+", "-", "@", "\t", "\r")) for s in students)
    assert "ok" in students and "grades.csv" in students  # others as they are


def test_any_student_name_works(odd):
    subs, out, result, rows = odd
    assert (rows[STRANGE]["score"], rows[STRANGE]["status"]) == (FULL17, "passed")
    assert json.loads((out / STRANGE / "ch17" / "results.json").read_text())["score"] == FULL17
    table = list(csv.DictReader(io.StringIO((out / "grades.csv").read_bytes().decode(), newline="")))
    assert STRANGE in [r["student"] for r in table]
    assert rows["\\xff-not-utf8"]["status"].startswith("error: no ch17")  # a name that is not UTF-8, escaped
    folders = {p.name for p in subs.iterdir() if p.is_dir() or p.is_symlink()}
    assert len(result.rows) == len(folders) == len(table)  # one row per folder, nothing else


def test_an_unexpected_exception_is_that_items_error_row(tmp_path, monkeypatch):
    from grader import run

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(run, "check", broken)
    write(tmp_path / "subs" / "ada", CH17.filename, SOLUTION17)
    out = tmp_path / "out"
    config = _Config(out=str(out), seed=1, limits={"ch17": {"max": 1.0, "checks": {}}}, memory_limit=2 << 30,
                     sandbox=None, scratch=str(tmp_path))
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
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    write(subs / "a-killed", CH17.filename, hang("causal_mask"))
    write(subs / "b-next", CH17.filename, SOLUTION17)
    result = {}
    run = threading.Thread(target=lambda: result.update(r=grade(subs, [CH17], out, jobs=1, seed=2, sandbox=SANDBOX)),
                           daemon=True)
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


def test_an_interrupted_run_removes_its_temporary_folders(tmp_path):
    subs, out, tmp = tmp_path / "subs", tmp_path / "out", tmp_path / "tmp"
    tmp.mkdir()
    write(subs / "a-done", CH17.filename, STUB17)
    write(subs / "b-hangs", CH17.filename, hang("causal_mask"))
    command = [sys.executable, "-m", "grader.cli", "grade", str(subs), "--chapter", "ch17", "--out", str(out),
               "--jobs", "1", "--seed", "4"] + ([] if SANDBOX else ["--no-sandbox"])
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, TMPDIR=str(tmp)), start_new_session=True)
    try:
        partial_of(out, "b-hangs")
        time.sleep(0.5)
        assert list(tmp.iterdir()), "a run makes its temporary folders here"
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C, as a terminal sends it: to the whole process group
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130 and "interrupted" in err, err
    assert list(tmp.iterdir()) == []
    assert not list(out.glob("*/.*.partial-*"))
    assert (out / "a-done" / "ch17" / "results.json").is_file()
    assert not (out / "b-hangs" / "ch17").exists()
