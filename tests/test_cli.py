"""The command line: list, check (human and JSON), stubs, and its errors."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from grader import chapters
from grader.cli import main
from grader.report import CheckResult, Report


@pytest.fixture
def cli(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    return lambda *args: runner.invoke(main, list(args), catch_exceptions=False)


def test_list_shows_every_chapter_and_the_last_result(cli):
    out = cli("list")
    assert out.exit_code == 0
    for ch in chapters.all_chapters():
        assert re.search(rf"^{ch.id}\s+{re.escape(ch.title)}\s+{len(ch.tasks)}\s+not run$", out.output, re.M)
    cli("check", "ch25")
    assert re.search(rf"^ch25 .* 0/{len(chapters.find('ch25').tasks)} passed$", cli("list").output, re.M)


def test_check_on_the_stubs_says_not_implemented_without_a_traceback(cli):
    out = cli("check", "ch25")
    assert out.exit_code == 1
    assert re.search(r"✗ 25\.1 slot_mapping\s+0/\d+\s+not implemented yet \(ch25\.1: about \d+ lines\)", out.output)
    assert re.search(r"· hidden checks: \d+ more run at grading time", out.output)
    assert "Traceback" not in out.output and "figures are drawn once a task passes" in out.output


def test_check_solutions_writes_figures_and_prints_the_seed(cli, tmp_path):
    out = cli("check", "25", "--solutions", "--seed", "7", "--figures", "figs")
    assert out.exit_code == 0, out.output
    assert "hidden checks ran on grading seed 7 (repeat with --seed 7)" in out.output
    assert (tmp_path / "figs" / "ch25" / "dim-slot-mapping.svg").is_file()
    assert "figs/ch25/dim-slot-mapping.svg" in out.output


def test_json_is_one_gradescope_document(cli, tmp_path):
    out = cli("check", "ch25", "--solutions", "--json", "--seed", "3")
    doc = json.loads(out.output)
    assert out.exit_code == 0
    assert doc["score"] == doc["max_score"] > 0 and doc["seed"] == 3
    for test in doc["tests"]:
        assert {"name", "score", "max_score", "status", "output", "visibility"} <= set(test)
        assert test["status"] == "passed" and test["name"].startswith(
            ("ch25.1 slot_mapping: ", "ch25.2 store_kv: ", "ch25.3 BlockManager: "))
    assert {t["visibility"] for t in doc["tests"]} == {"visible", "after_due_date"}
    assert all(Path(p).is_file() for p in doc["figures"])


def test_task_filter_runs_one_task(cli):
    doc = json.loads(cli("check", "ch25", "--task", "25.2", "--solutions", "--json").output)
    assert {t["number"] for t in doc["tests"]} == {"25.2"}


def test_a_submission_folder_is_graded(cli, tmp_path):
    sub = tmp_path / "alice"
    sub.mkdir()
    shutil.copy(chapters.SOLUTIONS / "ch25_paged_kv.py", sub)
    doc = json.loads(cli("check", "ch25", "--submission", str(sub), "--json").output)
    assert doc["score"] == doc["max_score"] and doc["hidden_not_run"] == 0
    assert any("hidden" in t["tags"] for t in doc["tests"])


@pytest.mark.parametrize("args, words", [
    (["check", "ch255"], "Did you mean ch25"),
    (["check", "ch25", "--task", "25.9"], "No task '25.9'"),
    (["check", "ch25", "--solutions", "--submission", "."], "exclude each other"),
    (["check", "ch25", "--memory-limit", "lots"], "not a size"),
])
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
    result = lambda status: CheckResult("25.1", "slot_mapping", "x", False, 1.0, status)
    assert Report(ch, "t", 0, [result("passed")]).exit_code == 0
    assert Report(ch, "t", 0, [result("passed"), result("blocked")]).exit_code == 2
    assert Report(ch, "t", 0, [result("blocked"), result("timeout")]).exit_code == 1
