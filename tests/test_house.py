"""The house keeps its shape: few modules at the top of grader/, one suffix per kind of chapter helper module, checks
before the helpers that explain them, and figures that never restate a check's tolerance."""

from __future__ import annotations

import ast
import re

import pytest

from grader import chapters

GRADER = chapters.ROOT / "grader"
KINDS = {"checks": r"ch\d\d(_explain)?", "hidden": r"ch\d\d(_models|_mistakes)?"}


def test_the_top_of_grader_holds_only_the_cli_and_the_spine_of_a_run():
    top = sorted(p.name for p in GRADER.glob("*.py"))
    assert len(top) <= 8, top


@pytest.mark.parametrize("folder", sorted(KINDS))
def test_a_chapters_helper_modules_have_one_suffix_per_kind(folder: str):
    odd = [p.name for p in (GRADER / folder).glob("ch*.py") if not re.fullmatch(KINDS[folder], p.stem)]
    assert not odd, f"grader/{folder}/ holds chNN.py and {KINDS[folder]}.py only: {odd}"


def _check_modules():
    return sorted(p for folder in KINDS for p in (GRADER / folder).glob("ch*.py") if re.fullmatch(r"ch\d\d", p.stem))


@pytest.mark.parametrize("path", _check_modules(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_checks_come_before_the_helpers(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    checks = [
        n for n in functions if any(isinstance(d, ast.Call) and getattr(d.func, "id", "") in ("public", "hidden") for d in n.decorator_list)
    ]
    assert checks, f"{path.name} has no check"
    helpers = [n.name for n in functions if n not in checks and n.lineno < checks[0].lineno]
    assert not helpers, f"{path.parent.name}/{path.name}: helpers before the first check: {helpers}"


@pytest.mark.parametrize("path", sorted((chapters.ROOT / "figures").glob("ch*.py")), ids=lambda p: p.name)
def test_a_figure_draws_the_checks_verdict_and_restates_no_tolerance(path):
    text = path.read_text(encoding="utf-8")
    assert not re.search(r"^(ATOL|RTOL|TOL)\b|def _close\(", text, re.M), f"{path.name} restates a check's tolerance"
