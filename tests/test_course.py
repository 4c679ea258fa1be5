"""`course check all`: every chapter in one run, over the cores, on one grading seed, one report."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from click.testing import CliRunner
from mutate import mutant, row

from grader import chapters
from grader.checks import load
from grader.cli import main
from grader.course import check_all

pytestmark = pytest.mark.slow


def test_the_chapters_come_back_in_course_order_on_one_seed():
    course = check_all(solutions=True, only=["ch21", "ch17", "ch26"], jobs=2, seed=77, figures_dir=None)
    assert [r.chapter.id for r in course.reports] == ["ch17", "ch21", "ch26"]
    assert {r.seed for r in course.reports} == {77} and course.seed == 77
    assert course.score == course.max_score == sum(r.max_score for r in course.reports) > 0
    assert course.exit_code == 0 and not course.failures
    assert all(any(x.hidden for x in r.results) for r in course.reports), "hidden checks ran for the reference"


def test_one_worker_gives_the_same_verdicts_as_several():
    one = check_all(solutions=True, only=["ch17", "ch21"], jobs=1, seed=5, figures_dir=None)
    two = check_all(solutions=True, only=["ch17", "ch21"], jobs=2, seed=5, figures_dir=None)
    verdicts = lambda c: [(x.task, x.name, x.status) for r in c.reports for x in r.results]
    assert verdicts(one) == verdicts(two)


def worth(chapter_id: str) -> float:
    """The chapter's full marks, public and hidden checks, as the checks declare them."""
    return sum(spec.points for spec in load(chapter_id, with_hidden=True))


@pytest.fixture(scope="module")
def student(tmp_path_factory):
    """A folder with ch17 wrong (an inverted mask) and ch21 right; no other chapter."""
    folder = tmp_path_factory.mktemp("student")
    mutant(folder, "ch17", *row("ch17", "inverted").edits)
    mutant(folder, "ch21")
    return folder


def test_a_submission_gets_a_line_per_chapter_and_a_total(student, tmp_path):
    out = CliRunner().invoke(
        main,
        ["check", "all", "--submission", str(student), "--no-sandbox", "--jobs", "2", "--seed", "3", "--figures", str(tmp_path)],
        env={"COLUMNS": None},  # not a terminal: one line per chapter (test_terminal fits them to a width)
    )
    assert out.exit_code == 1, out.output
    assert re.search(r"^  ✗ ch17 .*ch17\.1, ch17\.2 not passing → course check ch17$", out.output, re.M), out.output
    ch21 = worth("ch21")
    assert re.search(rf"^  ✓ ch21 .* {ch21:g}/{ch21:g} ", out.output, re.M), out.output
    assert "not in " in out.output and "ch15" in out.output.split("not in ")[1]
    assert re.search(rf"^score \d+/{worth('ch17') + worth('ch21'):g} · 2 chapters in ", out.output, re.M), out.output
    assert "hidden checks ran on grading seed 3" in out.output
    assert (tmp_path / "ch17" / "ch17-causal-mask.svg").is_file() and (tmp_path / "ch21").is_dir()


def test_json_is_one_document_with_every_chapters_tests(student, tmp_path):
    out = CliRunner().invoke(main, ["check", "all", "--submission", str(student), "--no-sandbox", "--json", "--figures", str(tmp_path)])
    doc = json.loads(out.stdout)
    assert set(doc["chapters"]) == {"ch17", "ch21"}
    assert doc["score"] == sum(t["score"] for t in doc["tests"]) and doc["max_score"] == worth("ch17") + worth("ch21")
    assert {t["number"].split(".")[0] for t in doc["tests"]} == {"ch17", "ch21"}


def test_all_names_whole_chapters_only(tmp_path):
    out = CliRunner().invoke(main, ["check", "all", "--task", "ch17.1"])
    assert out.exit_code == 2 and "checks whole chapters" in out.output
    empty = tmp_path / "empty"
    empty.mkdir()
    out = CliRunner().invoke(main, ["check", "all", "--submission", str(empty), "--no-sandbox"])
    assert out.exit_code == 1 and "holds no chapter module" in out.output


def test_a_missing_exercise_is_that_chapters_line(tmp_path, monkeypatch):
    """In the student's own checkout, a chapter file deleted is its chapter's line, not the run's end."""
    exercises = tmp_path / "exercises"
    shutil.copytree(chapters.EXERCISES, exercises)
    (exercises / chapters.find("ch17").filename).unlink()
    monkeypatch.setattr(chapters, "EXERCISES", exercises)
    course = check_all(only=["ch17", "ch21"], jobs=1, figures_dir=None)
    assert "ch17" in course.failures and [r.chapter.id for r in course.reports] == ["ch21"]
    assert course.exit_code == 1
