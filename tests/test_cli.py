"""The command line: list, check (human and JSON), stubs, and its errors."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import require_sandbox

import figures
from grader import chapters, checks
from grader.authoring import reference
from grader.cli import main
from grader.report import CheckResult, Report
from grader.run import hidden_count
from grader.terminal import _pts, columns


@pytest.fixture
def cli(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    # not a terminal and no COLUMNS: lines are not wrapped, whatever the shell running the tests exports
    return lambda *args, env=None: runner.invoke(main, list(args), catch_exceptions=False, env={"COLUMNS": None, **(env or {})})


def solution_with(tmp_path, name: str, *edits: tuple[str, str], chapter: str = "ch17") -> Path:
    """A submission folder `name` holding the chapter's reference with `edits` (old, new) applied."""
    ch = chapters.find(chapter)
    text = (chapters.SOLUTIONS / ch.filename).read_text()
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    folder = tmp_path / name
    folder.mkdir(parents=True)
    (folder / ch.filename).write_text(text)
    return folder


DROPPED_DIAGONAL = ("dtype=torch.bool).tril()", "dtype=torch.bool).tril(diagonal=-1)")
FLOAT_OFFSET_MASK = ("torch.ones(num_new, num_cached + num_new, dtype=torch.bool)", "torch.ones(num_new, num_cached + num_new)")
EMPTY_AS_ONE = (
    "return torch.ones(num_tokens, num_tokens, dtype=torch.bool).tril()",  # right but for T = 0
    "return torch.ones(max(num_tokens, 1), max(num_tokens, 1), dtype=torch.bool).tril()",
)


def test_list_shows_every_chapter_and_the_last_result(cli):
    out = cli("list")
    assert out.exit_code == 0
    for ch in chapters.all_chapters():
        assert re.search(rf"^{ch.id}\s+{re.escape(ch.title)}\s+{len(ch.tasks)}\s+\d+ \+ \d+ hidden\s+not run$", out.output, re.M)
    cli("check", "ch25")
    assert re.search(rf"^ch25 .* 0/{len(chapters.find('ch25').tasks)} passed$", cli("list").output, re.M)


def test_check_on_the_stubs_says_not_implemented_without_a_traceback(cli):
    out = cli("check", "ch25")
    assert out.exit_code == 1
    assert re.search(r"✗ ch25\.1 slot_mapping\s+0/\d+\s+not implemented yet \(ch25\.1: about \d+ lines\)", out.output)
    ch = chapters.find("ch25")
    hidden = hidden_count(ch, reference.load_answers(ch.id))
    public = sum(s.points for s in checks.load(ch.id, with_hidden=False) if not s.hidden)
    assert f"score 0/{_pts(public)} on the public checks · {hidden} hidden checks run at grading time" in out.output
    waiting = ", ".join(f"{f.id} (waits for {', '.join(dict.fromkeys(f.needs.values()))})" for f in figures.catalog(ch.id))
    assert f"· not drawn: {waiting}; a figure is drawn once its task returns an output" in out.output
    assert "Traceback" not in out.output and "figures are drawn once a task passes" not in out.output


def test_check_solutions_writes_figures_and_prints_the_seed(cli, tmp_path):
    out = cli("check", "25", "--solutions", "--seed", "7", "--figures", "figs")
    assert out.exit_code == 0, out.output
    assert "hidden checks ran on grading seed 7 (repeat with --seed 7)" in out.output
    assert (tmp_path / "figs" / "ch25" / "ch25-dim-slot-mapping.svg").is_file()
    assert "figs/ch25/ch25-dim-slot-mapping.svg" in out.output


def test_json_is_one_gradescope_document(cli, tmp_path):
    out = cli("check", "ch25", "--solutions", "--json", "--seed", "3")
    doc = json.loads(out.output)
    assert out.exit_code == 0
    assert doc["score"] == doc["max_score"] > 0 and doc["seed"] == 3
    for test in doc["tests"]:
        assert {"name", "score", "max_score", "status", "output", "visibility"} <= set(test)
        assert test["status"] == "passed" and test["name"].startswith(
            ("ch25.1 slot_mapping: ", "ch25.2 store_kv: ", "ch25.3 BlockManager: ")
        )
    assert {t["visibility"] for t in doc["tests"]} == {"visible", "after_due_date"}
    assert all(Path(p).is_file() for p in doc["figures"])


def test_task_filter_runs_one_task(cli):
    doc = json.loads(cli("check", "ch25", "--task", "ch25.2", "--solutions", "--json").output)
    assert {t["number"] for t in doc["tests"]} == {"ch25.2"}


def test_a_submission_folder_is_graded(cli, tmp_path):
    require_sandbox()  # somebody else's code: graded in the sandbox, or refused
    sub = tmp_path / "alice"
    sub.mkdir()
    shutil.copy(chapters.SOLUTIONS / "ch25_paged_kv.py", sub)
    doc = json.loads(cli("check", "ch25", "--submission", str(sub), "--json").output)
    assert doc["score"] == doc["max_score"] and doc["hidden_not_run"] == 0
    assert any("hidden" in t["tags"] for t in doc["tests"])


@pytest.mark.parametrize(
    "args, words",
    [
        (["check", "ch255"], "Did you mean ch25"),
        (["check", "ch25", "--task", "ch25.9"], "No task 'ch25.9'"),
        (["check", "ch25", "--solutions", "--submission", "."], "exclude each other"),
        (["check", "ch25", "--memory-limit", "lots"], "not a size"),
    ],
)
def test_bad_arguments_are_usage_errors(cli, args, words):
    out = cli(*args)
    assert out.exit_code == 2 and words in out.output, out.output


def test_a_submission_without_the_chapter_file_is_named(cli, tmp_path):
    out = cli("check", "ch25", "--submission", str(tmp_path))
    assert out.exit_code == 1 and "has no ch25_paged_kv.py" in out.output


def test_stubs_check_reports_no_drift(cli):
    out = cli("stubs", "--check")
    assert out.exit_code == 0 and "all stubs up to date" in out.output


def test_exit_codes_follow_the_worst_status():
    ch = chapters.find("ch25")
    result = lambda status: CheckResult("ch25.1", "slot_mapping", "x", False, 1.0, status)
    assert Report(ch, "t", 0, [result("passed")]).exit_code == 0
    assert Report(ch, "t", 0, [result("passed"), result("blocked")]).exit_code == 2
    assert Report(ch, "t", 0, [result("blocked"), result("timeout")]).exit_code == 1


def test_a_syntax_error_is_reported_once_for_the_chapter(cli, tmp_path):
    sub = solution_with(tmp_path, "sub", ("    return torch.ones(num_tokens", "    return (torch.ones(num_tokens"))
    out = cli("check", "ch17", "--submission", str(sub), "--no-sandbox", "--no-hidden")
    assert out.exit_code == 1
    assert out.stdout.count("SyntaxError") == 1, out.stdout
    assert "your module could not be imported, so no check could run" in out.stdout
    for task in chapters.find("ch17").tasks:
        assert re.search(rf"✗ {task.id} {task.name}\s+0/\d+  not run: your module could not be imported", out.stdout)
    doc = json.loads(cli("check", "ch17", "--submission", str(sub), "--no-sandbox", "--no-hidden", "--json").stdout)
    assert {t["outcome"] for t in doc["tests"]} == {"error"}, "the verdicts themselves are unchanged"
    assert all("SyntaxError" in t["output"] for t in doc["tests"])


def test_a_renamed_function_is_an_error_named_once(cli, tmp_path):
    sub = solution_with(tmp_path, "sub", ("def causal_mask_with_offset(", "def causal_mask_offset("))
    args = ["check", "ch17", "--task", "ch17.2", "--submission", str(sub), "--no-sandbox", "--no-hidden"]
    doc = json.loads(cli(*args, "--json").stdout)
    message = "your module has no function 'causal_mask_with_offset' (was it renamed or deleted?)"
    assert [(t["outcome"], t["output"]) for t in doc["tests"]] == [("error", message)] * len(doc["tests"])
    out = cli(*args)
    assert out.stdout.count(message) == 1 and "_Missing" not in out.stdout and "[wrong]" not in out.stdout


def test_the_budget_of_explanations_goes_to_different_failures(cli, tmp_path):
    sub = solution_with(tmp_path, "sub", (EMPTY_AS_ONE[0], EMPTY_AS_ONE[1].replace(".tril()", ".tril(diagonal=-1)")))
    out = cli("check", "ch17", "--task", "ch17.1", "--submission", str(sub), "--no-sandbox", "--no-hidden", env={"COLUMNS": "80"}).stdout
    hints = [line for line in out.splitlines() if line.strip().startswith("hint: keep the diagonal")]
    assert len(hints) == 1, out
    assert re.search(r"\(same for \d+ more checks?: “", out)
    assert "[0, 0]" in out.split("same for")[1], "the empty sequence's different failure is explained too"
    assert "not explained" not in out
    assert max(columns(line) for line in out.splitlines()) <= 80


def test_figures_unwritable_is_one_line_and_the_report_is_kept(cli, tmp_path, monkeypatch):
    monkeypatch.chdir("/proc")
    out = cli("check", "ch17", "--solutions", "--no-hidden", "--figures", "/proc/nope")
    assert out.exit_code == 0 and "Traceback" not in out.output
    notes = [line for line in out.stdout.splitlines() if "/proc/nope" in line]
    assert notes == ["  · figures not written: /proc/nope/ch17 cannot be written (No such file or directory)"]
    assert all(f"✓ {t.id} {t.name}" in out.stdout for t in chapters.find("ch17").tasks)
    assert re.search(r"^score (\d+)/\1 ", out.stdout, re.M), "the footer is kept"


def test_the_default_figures_folder_is_the_projects_and_for_a_submission_the_current_one(cli, tmp_path, monkeypatch):
    """One's own code draws into the project's course-figures/ (found from the module, wherever the cwd is);
    somebody else's code into the current folder's: a folder is never looked for inside a submission."""
    project = tmp_path / "project"
    (project / "exercises").mkdir(parents=True)
    (project / "exercises" / "ch17_causal_masks.py").write_text((chapters.SOLUTIONS / "ch17_causal_masks.py").read_text())
    monkeypatch.setattr(chapters, "EXERCISES", project / "exercises")
    deep = project / "somewhere" / "deeper"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    ids = [f.id for f in figures.catalog("ch17")]
    listed = lambda base: "· figures: " + ", ".join(f"{base}/ch17/{i}.svg" for i in ids) + "\n"
    out = cli("check", "ch17")
    assert out.exit_code == 0, out.output
    assert sorted(p.stem for p in (project / "course-figures" / "ch17").glob("*.svg")) == sorted(ids)
    assert listed(project / "course-figures") in out.stdout, "absolute where the cwd is not above it"
    sub = solution_with(project, "mine")  # a submission inside the project, with a project file of its own
    (sub / "pyproject.toml").write_text("[project]\nname = 'mine'\n")
    out = cli("check", "ch17", "--submission", str(sub), "--no-sandbox", "--no-hidden")
    assert out.exit_code == 0, out.output
    assert sorted(p.stem for p in (deep / "course-figures" / "ch17").glob("*.svg")) == sorted(ids)
    assert not (sub / "course-figures").exists()
    assert listed("course-figures") in out.stdout, "relative below the cwd"
    assert "DIR/<chapter>/<figure>.svg" in cli("check", "--help").stdout


def test_a_run_removes_the_chapters_figures_it_did_not_draw_and_nothing_else(cli, tmp_path):
    figs = tmp_path / "figs"
    cli("check", "ch17", "--solutions", "--no-hidden", "--figures", str(figs))
    folder = figs / "ch17"
    ids = [f.id for f in figures.catalog("ch17")]
    assert sorted(p.stem for p in folder.glob("*.svg")) == sorted(ids)
    (folder / "mine.svg").write_text("<svg/>")
    (folder / "notes.txt").write_text("keep me")
    sub = solution_with(tmp_path, "sub", FLOAT_OFFSET_MASK)  # ch17.2's output has the wrong type: nothing to draw
    out = cli("check", "ch17", "--submission", str(sub), "--no-sandbox", "--no-hidden", "--figures", str(figs))
    assert not (folder / "ch17-offset-mask.svg").exists(), "a correct figure must not stay beside wrong code"
    assert (folder / "ch17-causal-mask.svg").is_file() and (folder / "mine.svg").is_file()
    assert (folder / "notes.txt").read_text() == "keep me"
    assert "ch17-offset-mask (waits for ch17.2, its older file removed)" in out.stdout
    assert "figs/ch17/ch17-causal-mask.svg" in out.stdout and "wrong values marked" not in out.stdout
    cli("check", "ch17", "--solutions", "--no-hidden", "--figures", str(figs))
    before = (folder / "ch17-offset-mask.svg").read_bytes()
    out = cli("check", "ch17", "--task", "ch17.1", "--submission", str(sub), "--no-sandbox", "--no-hidden", "--figures", str(figs))
    assert (folder / "ch17-offset-mask.svg").read_bytes() == before, "--task leaves the other tasks' figures alone"
    assert "ch17-offset-mask (ch17.2 left out of this run, its file from an earlier run kept)" in out.stdout


def test_wrong_values_marked_only_when_a_figure_marks_one(cli, tmp_path):
    ids = [f.id for f in figures.catalog("ch17")]
    unchecked = solution_with(tmp_path, "unchecked", EMPTY_AS_ONE)  # the figures' masks right, T = 0 wrong
    out = cli("check", "ch17", "--submission", str(unchecked), "--no-sandbox", "--no-hidden", "--json")
    doc = json.loads(out.stdout)
    assert doc["score"] < doc["max_score"] and len(doc["figures"]) == len(ids)
    out = cli("check", "ch17", "--submission", str(unchecked), "--no-sandbox", "--no-hidden", "--figures", "f")
    assert "· figures: " in out.stdout and "wrong values marked" not in out.stdout
    wrong = solution_with(tmp_path, "wrong", DROPPED_DIAGONAL)
    out = cli("check", "ch17", "--task", "ch17.1", "--submission", str(wrong), "--no-sandbox", "--no-hidden", "--figures", "g")
    assert "· figures (your wrong values marked): g/ch17/ch17-causal-mask.svg\n" in out.stdout
    assert "ch17-offset-mask (ch17.2 left out of this run)" in out.stdout


@pytest.mark.parametrize("content, words", [('{"cells": 3}', 'its "cells" is a number'), ("not json", "not JSON")])
def test_a_malformed_notebook_is_one_clear_line(cli, tmp_path, content, words):
    (tmp_path / "bad.ipynb").write_text(content)
    out = cli("check", "ch17", "--notebook", "bad.ipynb")
    assert out.exit_code == 1 and "Traceback" not in out.output
    assert out.output.strip().splitlines() == [out.output.strip()] and words in out.output
