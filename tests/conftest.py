"""Shared setup: offline, one thread, a private progress file for every test, and one warm
process for the whole session, from which every in-process `check` forks its student
process (tests that mean the fresh-interpreter path pass `launcher=FRESH`)."""

import functools
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from grader import chapters  # noqa: E402
from grader.isolation import worker  # noqa: E402
from grader.isolation.zygote import Zygote  # noqa: E402

FRESH = functools.partial(worker.start, root=chapters.ROOT)
"""Start a student process in a fresh interpreter, as `course check` does."""


@pytest.fixture(autouse=True, scope="session")
def warm_students():
    warm = Zygote()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(worker, "start", warm.start)
        yield warm
    warm.close()


@pytest.fixture(autouse=True)
def private_state(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_STATE_DIR", str(tmp_path / "state"))


def pytest_collection_modifyitems(items):
    """A test that grades a mutant (the `graded` fixture of the chapter tests) is slow: the fast loop
    (`pytest -m "not slow"`) keeps the tests that grade nothing."""
    for item in items:
        if "graded" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
