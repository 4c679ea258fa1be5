"""`course list` (points, hidden points, one status wording, a chapter's tasks), finding chapters and tasks by
the names a student types, and the command line of a student release (no instructor parts)."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from grader import chapters, checks, progress
from grader.cli import INSTRUCTOR_COMMANDS, INSTRUCTOR_OPTIONS, main
from grader.report import CheckResult, Report

CHAPTERS = chapters.all_chapters()


@pytest.fixture
def cli(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    # not a terminal and no COLUMNS: one line per row, whatever an earlier test or the shell exported
    return lambda *args: runner.invoke(main, list(args), catch_exceptions=False, env={"COLUMNS": None})


@pytest.fixture
def student_release(monkeypatch):
    """The command line as a student release has it: no solutions/ beside the package."""
    monkeypatch.setattr(chapters, "has_solutions", lambda: False)


def ran(ch: chapters.Chapter, outcomes: dict[str, list[str]]) -> None:
    """Record a `course check` of the student's exercises/ whose public checks ended so, per task."""
    report = Report(ch, str(chapters.EXERCISES / ch.filename), 0)
    for task, statuses in outcomes.items():
        for i, status in enumerate(statuses):
            report.results.append(CheckResult(task, "f", f"check {i}", False, 1.0, status))
    progress.record(report)


def loaded_points(chapter_id: str) -> dict[str, tuple[float, float]]:
    out: dict[str, list[float]] = {}
    for spec in checks.load(chapter_id, with_hidden=True):
        out.setdefault(spec.task, [0.0, 0.0])[spec.hidden] += spec.points
    return {task: tuple(p) for task, p in out.items()}


# -- points ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ch", CHAPTERS, ids=[ch.id for ch in CHAPTERS])
def test_points_read_without_importing_equal_the_loaded_checks(ch):
    assert checks.points(ch.id) == loaded_points(ch.id)


def test_the_list_shows_public_and_hidden_points_of_every_chapter(cli):
    out = cli("list")
    assert out.exit_code == 0
    for ch in CHAPTERS:
        pts = loaded_points(ch.id).values()
        public, hidden = sum(p for p, _ in pts), sum(h for _, h in pts)
        assert re.search(
            rf"^{ch.id}\s+{re.escape(ch.title)}\s+{len(ch.tasks)}\s+{public:g} \+ {hidden:g} hidden"
            rf"\s+not run$",
            out.output,
            re.M,
        ), ch.id


def test_a_release_lists_the_hidden_points_it_recorded(cli, monkeypatch, tmp_path):
    ch = chapters.find("ch17")
    answers = tmp_path / "answers"
    answers.mkdir()
    (answers / "ch17.json").write_text('{"hidden_points": {"ch17.1": 7, "ch17.2": 2}}')
    monkeypatch.setattr(chapters, "ANSWERS", answers)
    monkeypatch.setattr(checks, "has_hidden", lambda chapter_id: False)
    public = {task: p for task, (p, _) in loaded_points("ch17").items()}
    assert checks.points("ch17") == {"ch17.1": (public["ch17.1"], 7.0), "ch17.2": (public["ch17.2"], 2.0)}
    assert re.search(
        rf"^ch17\.2\s+causal_mask_with_offset\(num_new, num_cached\)\s+{public['ch17.2']:g} \+ 2 hidden", cli("list", ch.id).output, re.M
    )


# -- status ------------------------------------------------------------------------------------------------
def test_the_status_reads_the_same_whether_all_or_some_tasks_passed(cli):
    ch17, ch25 = chapters.find("ch17"), chapters.find("ch25")
    ran(ch17, {"ch17.1": ["passed"] * 3, "ch17.2": ["passed", "passed"]})
    ran(ch25, {"ch25.1": ["passed", "failed"], "ch25.2": ["passed"], "ch25.3": ["error"]})
    out = cli("list").output
    assert re.search(r"^ch17 .*  2/2 passed$", out, re.M)
    assert re.search(r"^ch25 .*  1/3 passed$", out, re.M)
    assert not re.search(r"passed \d", out), "never 'passed 2/2'"


def test_a_run_of_one_task_keeps_the_other_tasks_status(cli):
    ch = chapters.find("ch25")
    ran(ch, {"ch25.1": ["passed"] * 5})
    assert re.search(r"^ch25 .*  1/3 passed, 2 not run$", cli("list").output, re.M)
    ran(ch, {"ch25.3": ["failed", "passed"]})
    assert re.search(r"^ch25 .*  1/3 passed, 1 not run$", cli("list").output, re.M)
    lines = cli("list", "ch25").output
    assert re.search(r"^ch25\.1\s+slot_mapping\(block_table, positions, block_size\)\s+.*5/5 passed$", lines, re.M)
    assert re.search(r"^ch25\.2\s+store_kv\(.*not run$", lines, re.M)
    assert re.search(r"^ch25\.3\s+BlockManager\(num_blocks, block_size\)\s+.*1/2 passed$", lines, re.M)
    assert "next: `course check ch25 --task ch25.2`" in lines, "the first task not passed yet"


def test_a_chapter_lists_its_tasks_functions_and_points(cli):
    for ch in (chapters.find("ch17"), chapters.find("ch26")):
        out = cli("list", ch.id)
        assert out.exit_code == 0
        assert out.output.startswith(f"{ch.id} · {ch.title}    exercises/{ch.filename}\n")
        for t in ch.tasks:
            public, hidden = loaded_points(ch.id)[t.id]
            graded = ", ".join(f"{n}({', '.join(t.params[n])})" for n in t.names)
            assert re.search(
                rf"^{re.escape(t.id)}\s+{re.escape(graded)}\s+{public:g} \+ {hidden:g} hidden\s+"
                rf"not run$",
                out.output,
                re.M,
            ), (ch.id, t.id)


def test_stubs_that_raised_are_listed_as_not_implemented(cli):
    ch = chapters.find("ch17")
    report = Report(ch, str(chapters.EXERCISES / ch.filename), 0)
    report.results.append(CheckResult("ch17.1", "causal_mask", "a", False, 1.0, "error", todo=True))
    report.results.append(CheckResult("ch17.2", "causal_mask_with_offset", "b", False, 1.0, "failed"))
    progress.record(report)
    out = cli("list", "ch17").output
    assert re.search(r"^ch17\.1 .* not implemented yet$", out, re.M) and re.search(r"^ch17\.2 .* 0/1 passed$", out, re.M)


# -- finding chapters and tasks ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, chapter", [("causal", "ch17"), ("paged", "ch25"), ("slot_mapping", "ch25"), ("RoPE", "ch19"), ("ch25_paged_kv.py", "ch25")]
)
def test_a_chapter_is_found_by_a_word_of_its_name_or_a_function(name, chapter):
    assert chapters.find(name).id == chapter


def test_a_word_several_chapters_share_names_them_all():
    with pytest.raises(chapters.UnknownName) as e:
        chapters.find("attention")
    fits = [ch.id for ch in CHAPTERS if "attention" in ch.title_en.lower()]
    assert len(fits) > 1 and all(f"{cid} (" in str(e.value) for cid in fits)


def test_a_task_of_another_chapter_names_its_chapter(cli):
    out = cli("check", "ch17", "--task", "ch25.1")
    assert out.exit_code == 2
    assert "ch25.1 is a task of ch25 (paged KV cache), not of ch17: run `course check ch25 --task ch25.1`" in out.output
    out = cli("check", "ch17", "--task", "store_kv")
    assert "store_kv is task ch25.2 of ch25" in out.output


# -- the student release's command line ----------------------------------------------------------------------
def test_the_release_offers_no_instructor_command(cli, student_release):
    out = cli("--help")
    assert out.exit_code == 0
    listed = set(re.findall(r"^  (\w+)  ", out.output.split("Commands:")[1], re.M))
    assert listed == set(main.commands) - set(INSTRUCTOR_COMMANDS) and {"check", "list", "lab", "engine"} <= listed
    for name in INSTRUCTOR_COMMANDS:
        out = cli(name, "--help")
        assert out.exit_code == 2 and f"No such command {name!r}." in out.output
    assert "grade" not in cli("grad").output, "a typo is never pointed at an instructor command"


@pytest.mark.parametrize("command", list(INSTRUCTOR_OPTIONS))
def test_the_release_offers_no_instructor_option(cli, student_release, command):
    shown = cli(command, "--help").output
    for param in main.commands[command].params:
        flags = [o for o in param.opts + param.secondary_opts if o.startswith("--")]
        for flag in flags:
            there = re.search(rf"(^|[\s/,]){re.escape(flag)}\b", shown) is not None
            assert there == (param.name not in INSTRUCTOR_OPTIONS[command]), (command, flag)


def test_an_instructor_option_is_refused_in_the_release_and_kept_in_the_repository(cli, student_release, monkeypatch):
    out = cli("check", "ch17", "--solutions")
    assert out.exit_code == 2 and "No such option '--solutions'" in out.output
    monkeypatch.setattr(chapters, "has_solutions", lambda: True)
    shown = cli("check", "--help").output
    assert "--solutions" in shown and "--hidden / --no-hidden" in shown and "--seed" in shown
    assert set(INSTRUCTOR_COMMANDS) <= set(re.findall(r"^  (\w+)  ", cli("--help").output, re.M))


def test_a_missing_exercise_says_how_to_restore_it(monkeypatch):
    ch = chapters.find("ch17")
    here = chapters.missing_exercise(ch)
    assert "exercises/ch17_causal_masks.py is missing" in here and "`course stubs ch17`" in here
    monkeypatch.setattr(chapters, "has_solutions", lambda: False)
    there = chapters.missing_exercise(ch)
    assert "copy it back from the release" in there and "course stubs" not in there
    assert "git checkout -- exercises/ch17_causal_masks.py" in there
    assert "submission" not in here + there


def test_course_check_on_a_missing_exercise_says_how_to_restore_it(cli, monkeypatch, tmp_path):
    monkeypatch.setattr(chapters, "EXERCISES", tmp_path / "exercises")
    (tmp_path / "exercises").mkdir()
    out = cli("check", "ch17")
    assert out.exit_code == 1
    assert chapters.missing_exercise(chapters.find("ch17")) in out.output and "submission" not in out.output
