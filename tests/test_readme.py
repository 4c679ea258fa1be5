"""The README keeps its two commands, and CI runs the test one."""

import re

from grader.chapters import ROOT


def commands():
    return re.findall(r"```\n(python3 -m venv .*)\n```", (ROOT / "README.md").read_text())


def test_the_readme_has_exactly_two_fresh_machine_commands():
    main_job, tests = commands()
    assert "course check" in main_job and "--solutions" in main_job
    assert "pytest" in tests


def test_ci_runs_the_readme_test_command():
    assert commands()[1] in (ROOT / ".ci" / "run").read_text().splitlines()


def test_the_readme_names_the_chapters_there_are():
    """The one place the chapter range is written by hand; everything else derives it from the chapters."""
    from grader import chapters

    numbers = [int(ch.id[2:]) for ch in chapters.all_chapters()]
    assert f"Chapters {min(numbers)}–{max(numbers)} " in (ROOT / "README.md").read_text()


def test_the_readme_names_the_fast_loop():
    assert 'pytest -m "not slow"' in (ROOT / "README.md").read_text()


def test_the_readme_states_the_time_limits_that_run():
    """`course check`'s flat limit, and the class grader's: SLACK times the reference's own time, FLOOR at least,
    `course grade --time-limit` at most (the numbers the code uses, not the ones once written)."""
    from grader import checks
    from grader.cli import main
    from grader.delivery.grade import FLOOR, SLACK

    text = " ".join((ROOT / "README.md").read_text().split())
    check = next(p.default for p in main.commands["check"].params if p.name == "time_limit")
    grade = next(p.default for p in main.commands["grade"].params if p.name == "time_limit")
    assert check == checks.DEFAULT_TIME_LIMIT and f"time limit ({check:g} s per check, `--time-limit`;" in text
    assert f"{SLACK:g} times what the reference solution needs in it, at least {FLOOR:g} s and at most {grade:g} s" in text
    assert f"at least {FLOOR:g} s and at most `--time-limit` ({grade:g} s by default)" in text
