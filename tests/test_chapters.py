"""Every discovered chapter, whatever it teaches: the reference passes, the stubs fail
as stubs, stub and solution agree, and every figure is drawn from reference outputs."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from figure_fonts import REBUILD, undrawable

import figures
from grader import chapters, checks
from grader.delivery import stubs
from grader.run import check

pytestmark = pytest.mark.slow  # grades submissions, builds releases or runs real tools: not in the fast loop

CHAPTERS = chapters.all_chapters()
IDS = [ch.id for ch in CHAPTERS]
SEEDS = (11, 22, 33)
SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module", params=CHAPTERS, ids=IDS)
def reference_runs(request, tmp_path_factory):
    ch = request.param
    out = tmp_path_factory.mktemp(ch.id)
    return ch, out, [check(ch.id, solutions=True, seed=s, figures_dir=out / str(s)) for s in SEEDS]


def test_there_are_chapters():
    assert {"ch17", "ch18", "ch23", "ch25"} <= set(IDS)


def test_reference_passes_every_check_on_several_seeds(reference_runs):
    ch, _, reports = reference_runs
    for report in reports:
        failed = [f"{r.task} {r.name}: {r.status}: {r.message}" for r in report.results if r.status != "passed"]
        assert not failed, f"seed {report.seed}:\n" + "\n".join(failed)
        assert report.exit_code == 0
        assert {r.task for r in report.results} == {t.id for t in ch.tasks}, "every task has checks"
        assert any(r.hidden for r in report.results), "hidden checks ran"


def test_every_figure_is_drawn_from_reference_outputs(reference_runs):
    ch, out, reports = reference_runs
    report = reports[0]
    specs = figures.catalog(ch.id)
    assert specs, f"{ch.id} has no figures"
    assert not report.figure_notes
    drawn = {p.rsplit("/", 1)[-1].removesuffix(".svg"): p for p in report.figures}
    assert set(drawn) == {s.id for s in specs}
    for spec in specs:
        root = ET.parse(drawn[spec.id]).getroot()
        texts = {}
        for el in root.iter(f"{SVG}text"):
            texts.setdefault(el.get("class"), []).append(el.text or "")
        assert texts["title"] == [spec.title]
        assert texts["figure-id"] == [spec.id]
        squeeze = lambda s: "".join(s.split())
        zh, en = spec.captions(report.records[spec.id])
        assert squeeze("".join(texts["caption-zh"])) == squeeze(zh)
        assert " ".join(texts["caption-en"]) == en
        assert texts.get("legend"), f"{spec.id} has no legend"
        assert not [el for el in root.iter() if "wrong" in (el.get("class") or "")], f"{spec.id} marks a reference value as wrong"
        assert 720 <= float(root.get("width")) <= 960
        svg = Path(drawn[spec.id]).read_text(encoding="utf-8")
        assert not undrawable(svg), f"{spec.id}: {undrawable(svg)}; {REBUILD}"
        assert len(re.search(r"<style.*</style>", svg, re.S)[0]) < 120_000, f"{spec.id} embeds over 120 kB of fonts"


def test_stubs_fail_every_check_as_not_implemented(tmp_path):
    for ch in CHAPTERS:
        report = check(ch.id, hidden=True, seed=5, figures_dir=tmp_path)
        assert report.results
        task_ids = {t.id for t in ch.tasks}
        for r in report.results:
            assert r.status == "error" and r.todo, f"{ch.id} {r.task} {r.name}: {r.status}: {r.message}"
            named = "ch" + r.message.split("(ch", 1)[1].split(":")[0].split(")")[0]
            assert named in task_ids and named <= r.task, f"{r.task} {r.name}: {r.message}"
        assert report.score == 0 and report.exit_code == 1
        assert not report.figures


@pytest.mark.parametrize("ch", CHAPTERS, ids=IDS)
def test_regenerating_the_stub_gives_no_diff(ch):
    committed = (chapters.EXERCISES / ch.filename).read_text(encoding="utf-8")
    assert stubs.stub_for(ch) == committed, f"exercises/{ch.filename} drifted: run `course stubs {ch.id}`"


@pytest.mark.parametrize("ch", CHAPTERS, ids=IDS)
def test_stub_and_solution_have_the_same_interface(ch):
    sol = importlib.import_module(f"solutions.{ch.filename[:-3]}")
    ex = importlib.import_module(f"exercises.{ch.filename[:-3]}")
    public = lambda m: {n for n in vars(m) if not n.startswith("_") and getattr(vars(m)[n], "__module__", m.__name__) == m.__name__}
    assert public(sol) == public(ex)
    assert sol.__doc__ == ex.__doc__
    for task in ch.tasks:
        for name in task.names:
            a, b = getattr(sol, name), getattr(ex, name)
            assert inspect.signature(a) == inspect.signature(b), name
            assert inspect.getdoc(a) == inspect.getdoc(b), name
            assert f"Task {task.id}" in inspect.getdoc(a)


@pytest.mark.parametrize("ch", CHAPTERS, ids=IDS)
def test_every_task_has_public_and_hidden_checks(ch):
    specs = checks.load(ch.id, with_hidden=True)
    for task in ch.tasks:
        mine = [s for s in specs if s.task == task.id]
        assert any(not s.hidden for s in mine) and any(s.hidden for s in mine), task.label
    assert len({s.key for s in specs}) == len(specs), "check names are unique within a task"


@pytest.mark.parametrize("ch", CHAPTERS, ids=IDS)
def test_public_check_modules_never_import_the_hidden_ones(ch):
    tree = ast.parse((chapters.ROOT / "grader" / "checks" / f"{ch.id}.py").read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names] + [
        n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
    ]
    assert not [n for n in names if n.startswith(("grader.hidden", "solutions"))]
