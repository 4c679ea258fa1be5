"""The examples in the reference solutions' docstrings are what students read first: each one runs and gives
what it shows."""

from __future__ import annotations

import doctest
import importlib

import pytest

from grader import chapters


@pytest.mark.parametrize("chapter_id", [ch.id for ch in chapters.all_chapters()])
def test_the_solutions_examples_hold(chapter_id: str):
    ch = chapters.find(chapter_id)
    module = importlib.import_module(f"solutions.{ch.filename[:-3]}")
    finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    tests = [t for t in finder.find(module) if t.examples]
    for test in tests:
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.attempted > 0, f"{ch.filename} has no example in its docstrings"
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {ch.filename} fail (see above)"
