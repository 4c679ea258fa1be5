"""The terminal report on its own, fed hand-made results: each thing said once, lines fitted to the
width, the student's output shown as lines, the running check named on a terminal, and a footer that
says which half the score is and what became of each figure. One test drives the real command on a
pseudo-terminal."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time

import click
import pytest

from grader import chapters
from grader.delivery import escape
from grader.report import CheckResult, Report
from grader.terminal import MAX_MESSAGES, PRINTED_LINES, SLOW, TerminalReport, columns, wrap

CH17 = chapters.find("ch17")
HINT = "hint: keep the diagonal: the output at position i predicts token i + 1 and must see token i itself"


def failing(name: str, message: str, *, task: str = "ch17.1", status: str = "failed", **kw) -> CheckResult:
    """A failed check of ch17 worth one point."""
    return CheckResult(task, "causal_mask" if task == "ch17.1" else "causal_mask_with_offset", name, False, 1.0, status, message, **kw)


def passing(name: str, task: str = "ch17.1") -> CheckResult:
    """A passed check of ch17 worth one point."""
    return CheckResult(task, "causal_mask", name, False, 1.0, "passed")


def shown(capsys, results: list[CheckResult], *, verbose: bool = False, width: int = 0, report: Report | None = None) -> str:
    """What the terminal report prints for `results` (no header, not a terminal), styles removed."""
    screen = TerminalReport(CH17, "t", verbose=verbose, header=False, width=width, tty=False)
    for r in results:
        screen.add(r)
    screen.finish(report or Report(CH17, "t", 0, list(results)))
    return click.unstyle(capsys.readouterr().out)


def test_wrap_fits_the_width_keeps_indentation_and_never_splits_a_word():
    text = "    " + HINT + " /a/very/long/path/to/exercises/ch17_causal_masks.py:106 [6, 6]"
    width, indent = 40, " " * 10
    lines = wrap(text, width, indent)
    assert len(lines) > 1
    assert lines[0].startswith(indent + "    hint: ")
    lead = indent + "    " + " " * len("hint: ")  # continuation lines hang past the message's own indent and label
    assert all(line.startswith(lead) and not line[len(lead)].isspace() for line in lines[1:])
    assert [w for line in lines for w in line.split()] == text.split(), "words are kept whole and in order"
    path = next(w for w in text.split() if w.startswith("/a/"))
    assert all(columns(line) <= width or path in line for line in lines), "only an unbreakable word overflows"
    assert wrap(text, 0, indent) == [indent + text], "width 0: no wrapping"


def test_wrap_keeps_aligned_columns_and_counts_wide_characters():
    line = "  ✗ ch17.1 causal_mask               0/5"
    assert wrap(line, 80) == [line], "the padding that aligns task lines survives"
    shapes = " ".join(["a [6, 6] mask, tril(ones(L, S))"] * 8)
    for part in wrap(shapes, 30):
        assert part.count("[") == part.count("]") and part.count("(") == part.count(")"), "a shape stays whole"
    title = "因果遮罩 " * 6
    assert columns("因果遮罩") == 8 and columns(click.style("✗", fg="red")) == 1
    assert all(columns(part) <= 20 for part in wrap(title.strip(), 20))


def test_identical_diagnoses_are_explained_once_and_the_budget_goes_to_different_ones(capsys):
    same = [failing(f"case {i}", f"inputs: num_tokens={i}\nyour row 0 sees no key at all\n{HINT}") for i in range(4)]
    different = failing("a negative length raises ValueError", "causal_mask should raise ValueError; yours returned a bool tensor [0, 0]")
    out = shown(capsys, [*same, passing("an empty sequence"), different])
    assert out.count(HINT) == 1
    assert "inputs: num_tokens=0" in out and "inputs: num_tokens=1" not in out
    assert "(same for 3 more checks: “case 1”, “case 2” and “case 3”)" in out
    assert different.message in out, "the one different failure is explained, not a bare [wrong]"
    assert "not explained" not in out
    verbose = shown(capsys, [*same, different], verbose=True)
    assert verbose.count(HINT) == len(same) and "same for" not in verbose


@pytest.mark.parametrize("extra", [1, 2])
def test_failures_beyond_the_budget_are_counted_in_good_grammar(capsys, extra):
    results = [failing(f"check {i}", f"reason number {chr(97 + i)}") for i in range(MAX_MESSAGES + extra)]
    out = shown(capsys, results)
    assert sum(f"reason number {chr(97 + i)}" in out for i in range(len(results))) == MAX_MESSAGES
    noun = "check" if extra == 1 else "checks"
    assert f"({extra} more failing {noun} not explained; --verbose explains all)" in out


def test_the_same_exception_at_the_same_line_is_one_diagnosis(capsys):
    where = "\n    at ch17_causal_masks.py:7 in causal_mask: return m[num_tokens]"
    results = [
        failing(f"n={n}", f"causal_mask raised IndexError: index {n} is out of bounds for dimension 0 with size {n}{where}", status="error")
        for n in (6, 1, 0)
    ]
    out = shown(capsys, [*results, passing("fine")])
    assert out.count("raised IndexError") == 1 and "(same for 2 more checks: “n=1” and “n=0”)" in out


def test_an_import_failure_is_reported_once_for_the_chapter(capsys):
    message = (
        "importing ch17_causal_masks.py raised SyntaxError: unmatched ')' (ch17_causal_masks.py, line 7)\n"
        "    at ch17_causal_masks.py:7 in <module>: S = num_cached + num_new)"
    )
    results = [
        failing(f"check {i}", message, task=task, status="error", import_failed=True) for task in ("ch17.1", "ch17.2") for i in range(3)
    ]
    out = shown(capsys, results)
    assert out.count("SyntaxError") == 1 and out.count("S = num_cached + num_new)") == 1
    assert out.index("could not be imported, so no check could run") < out.index("ch17.1 causal_mask")
    for task in ("ch17.1", "ch17.2"):
        assert re.search(rf"✗ {re.escape(task)} \S+\s+0/3  not run: your module could not be imported", out)


def test_a_task_failing_every_check_alike_says_it_on_its_line(capsys):
    message = "your module has no function 'causal_mask_with_offset' (was it renamed or deleted?)"
    out = shown(capsys, [failing(f"c{i}", message, task="ch17.2", status="error") for i in range(5)])
    assert out.count(message) == 1 and re.search(rf"ch17\.2 causal_mask_with_offset\s+0/5  {re.escape(message)}", out)
    assert "[error]" not in out


def test_printed_output_is_shown_as_indented_lines_bounded(capsys):
    rows = [f"debug row {i}" for i in range(PRINTED_LINES + 4)]
    rows[0] += "\x1b[2J"  # a terminal escape: shown escaped, never sent to the terminal
    out = shown(capsys, [failing("x", "causal_mask raised IndexError: index 6", status="error", printed="\n".join(rows) + "\n")])
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.strip() == "your code printed:")
    indent = lines[head].index("your")
    for i in range(PRINTED_LINES):
        assert lines[head + 1 + i] == " " * (indent + 2) + escape.terminal(rows[i])
    assert lines[head + 1 + PRINTED_LINES].strip() == f"… ({len(rows) - PRINTED_LINES} more lines)"
    assert "\\n" not in out and "\x1b" not in out and "debug row 0\\x1b[2J" in out


def test_every_line_fits_the_width(capsys):
    long = " ".join(["word"] * 60)
    out = shown(capsys, [failing("x " * 30, f"{long}\n    {HINT} {long}"), passing("y")], width=50)
    assert max(columns(line) for line in out.splitlines()) <= 50


def test_the_running_check_is_named_after_slow_seconds_on_a_terminal(capsys):
    now = [100.0]
    screen = TerminalReport(CH17, "t", header=False, width=80, tty=True, ticker=False, clock=lambda: now[0])
    screen.start("ch17.1", "every length from 1 to 9")
    now[0] += SLOW - 0.1
    screen.tick()
    assert capsys.readouterr().out == "", "nothing before SLOW seconds"
    now[0] += 1.6
    screen.tick()
    out = capsys.readouterr().out
    assert out == f"\r\033[K  … running ch17.1 every length from 1 to 9 ({int(SLOW + 1.5)} s)"
    screen.tick()
    assert capsys.readouterr().out == "", "the same line is not written again"
    screen.add(passing("every length from 1 to 9"))
    assert capsys.readouterr().out == "\r\033[K", "the line is erased when the check finishes"
    quiet = TerminalReport(CH17, "t", header=False, width=80, tty=False, ticker=False, clock=lambda: now[0])
    quiet.start("ch17.1", "x")
    now[0] += 10
    quiet.tick()
    assert capsys.readouterr().out == "", "not a terminal: no running line"


def test_the_footer_says_which_half_the_score_is_and_what_became_of_each_figure(capsys):
    results = [passing("a"), failing("b", "wrong")]
    report = Report(
        CH17,
        "t",
        0,
        results,
        hidden_not_run=14,
        figures=["/x/ch17/ch17-causal-mask.svg"],
        marked=["/x/ch17/ch17-causal-mask.svg"],
        undrawn={"ch17-offset-mask": "waits for ch17.2"},
        removed=["/x/ch17/ch17-offset-mask.svg"],
    )
    out = shown(capsys, results, report=report)
    assert "score 1/2 on the public checks · 14 hidden checks run at grading time" in out
    assert "· figures (your wrong values marked): /x/ch17/ch17-causal-mask.svg" in out
    assert "· not drawn: ch17-offset-mask (waits for ch17.2, its older file removed)" in out
    assert "figures are drawn once a task passes" not in out
    one = Report(CH17, "t", 0, results, hidden_not_run=1, figures=["/x/ch17/ch17-causal-mask.svg"])
    out = shown(capsys, results, report=one)
    assert "on the public checks · 1 hidden check runs at grading time" in out
    assert "· figures: /x/ch17/ch17-causal-mask.svg\n" in out and "wrong values marked" not in out


SLOW_MASK = """
import time
import torch

slept = []

def causal_mask(num_tokens):
    if not slept:  # the first check only (the figure instance)
        slept.append(time.sleep({seconds}))
    return torch.ones(num_tokens, num_tokens, dtype=torch.bool).tril()
"""


@pytest.mark.slow
def test_a_pseudo_terminal_shows_the_running_check(tmp_path):
    """The real command on a pseudo-terminal: a check that runs over SLOW seconds is named while it runs."""
    (tmp_path / "ch17_causal_masks.py").write_text(SLOW_MASK.replace("{seconds}", str(SLOW + 1.5)))
    main, child = pty.openpty()
    env = {**os.environ, "COLUMNS": "100", "COURSE_STATE_DIR": str(tmp_path / "state")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "grader.cli",
            "check",
            "ch17",
            "--task",
            "ch17.1",
            "--no-hidden",
            "--submission",
            str(tmp_path),
            "--no-sandbox",
            "--figures",
            str(tmp_path / "f"),
        ],
        stdin=subprocess.DEVNULL,
        stdout=child,
        stderr=child,
        cwd=tmp_path,
        env=env,
    )
    os.close(child)
    out, deadline = b"", time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([main], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(main, 4096)
            except OSError:  # the child's side closed
                break
            if not chunk:
                break
            out += chunk
    proc.wait(timeout=30)
    os.close(main)
    text = out.decode("utf-8", "replace")
    assert re.search(r"… running ch17\.1 figure instance: a whole sequence of 6 tokens \(\d+ s\)", text), text
    running = text.index("… running ch17.1")
    erased = re.compile(r"\r\x1b\[K(?!  …)").search(text, running)
    assert erased and erased.start() < text.index("ch17.1 causal_mask"), "the running line is erased before the report"


# -- the whole course and the chapter list, fitted to the terminal --------------------------------------------
def _course_reports() -> list:
    """Every chapter as `course check all` reports it on the untouched stubs: every task failing."""
    from grader import chapters
    from grader.report import CheckResult, Report

    reports = []
    for ch in chapters.all_chapters():
        report = Report(ch, "exercises", 0, elapsed=1.5)
        report.results = [CheckResult(t.id, t.names[0], "a check", False, 1.0, "failed", todo=True) for t in ch.tasks]
        reports.append(report)
    return reports


@pytest.mark.parametrize("width", [80, 200])
def test_check_all_fits_the_terminal_and_keeps_every_task_and_title(width, capsys):
    from types import SimpleNamespace

    from grader.terminal import CourseScreen

    reports = _course_reports()
    screen = CourseScreen([r.chapter.id for r in reports], "your exercises/", jobs=2, seed=4, width=width)
    for r in reports:
        screen.add(r)
    screen.finish(SimpleNamespace(reports=reports, score=0, max_score=100, elapsed=9.0, seed=4), None)
    out = capsys.readouterr().out
    assert max(columns(line) for line in out.splitlines()) <= width, out
    for r in reports:
        tasks = ", ".join(t.id for t in r.chapter.tasks)
        assert f"{tasks} not passing → course check {r.chapter.id}" in " ".join(out.split()), r.chapter.id  # nothing lost
        assert (r.chapter.title if width == 200 else r.chapter.title_en) in out  # bilingual where it fits
    heads = [line for line in out.splitlines() if line.startswith("  ✗ ch")]
    assert len(heads) == len(reports) and len({line.rstrip().rindex("/") for line in heads if width == 80}) <= 1  # scores align


@pytest.mark.parametrize("width", [80, 200])
def test_the_chapter_list_fits_the_terminal_and_wraps_titles_at_their_halves(width, monkeypatch, tmp_path):
    from click.testing import CliRunner

    from grader import chapters
    from grader.cli import main

    monkeypatch.setenv("COLUMNS", str(width))
    monkeypatch.setenv("COURSE_STATE_DIR", str(tmp_path))
    for args in (["list"], ["list", "ch25"]):
        out = CliRunner().invoke(main, args).output
        assert max(columns(line) for line in out.splitlines()) <= width, out
    out = CliRunner().invoke(main, ["list"]).output
    lines = out.splitlines()
    for ch in chapters.all_chapters():
        at = next(i for i, line in enumerate(lines) if line.startswith(ch.id + " "))
        if width == 200:
            assert ch.title in lines[at]  # one line each
        else:  # the Chinese half on the chapter's line, the English one below it where both do not fit
            shown = " ".join(" ".join(line.split()) for line in lines[at : at + 3])
            assert ch.title_zh in lines[at] and " ".join(ch.title_en.split()) in shown, ch.id
