"""Shared setup: offline, one thread, a private progress file for every test, and one warm
process for the whole session, from which every in-process `check` forks its student
process (tests that mean the fresh-interpreter path pass `launcher=FRESH`).

Tests that need a tool a fresh machine may lack (bubblewrap, chromium, root) ask for it with
`require_sandbox`, `require_chromium` or `require_root`: without it they skip, naming the package
to install; under COURSE_REQUIRE_TOOLS=1 (set by .ci/run) they fail instead, so CI never skips the
attack suite without a word."""

import functools
import os
import shutil
import tempfile
from pathlib import Path
from typing import NoReturn

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("COURSE_CACHE_DIR", tempfile.mkdtemp(prefix="course-test-cache-"))  # never the user's own cache
# Tests assert ids, and English where they read prose, whatever the machine's locale; tests/test_i18n.py asks for
# Chinese where it checks it.
os.environ["COURSE_LANG"] = "en"

from grader import chapters  # noqa: E402
from grader.isolation import worker  # noqa: E402
from grader.isolation.zygote import Zygote  # noqa: E402

FRESH = functools.partial(worker.start, root=chapters.ROOT)
"""Start a student process in a fresh interpreter, as `course check` does."""
REQUIRE_TOOLS = os.environ.get("COURSE_REQUIRE_TOOLS") == "1"
"""Set by .ci/run: a missing tool fails the tests that need it instead of skipping them."""
CHROMIUM_PACKAGES = "Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)"


def missing(reason: str) -> NoReturn:
    """Skip a test whose tool this machine lacks (the reason names what to install); fail it under COURSE_REQUIRE_TOOLS=1."""
    if REQUIRE_TOOLS:
        pytest.fail(f"{reason}; COURSE_REQUIRE_TOOLS=1 says this machine must have it (.ci/run installs it)", pytrace=False)
    pytest.skip(reason)


def require_sandbox(kind: str = "bwrap") -> str:
    """The sandbox's description, or skip/fail naming the fix (install bubblewrap, allow user namespaces, be root)."""
    from grader.isolation.sandbox import SandboxUnavailable, probe

    try:
        return probe(kind)
    except SandboxUnavailable as e:
        missing(f"no sandbox of kind {kind!r} can be made here: {e}")


def require_root(why: str) -> None:
    """Root (and setpriv), which the unprivileged variants and Gradescope's container need."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        missing(f"{why}: needs root and setpriv (util-linux)")


def require_chromium() -> tuple[str, str]:
    """(chromium, chromedriver), Debian's, found on PATH; or skip/fail naming the packages."""
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        missing(f"needs {CHROMIUM_PACKAGES}")
    return str(Path(chromium).resolve()), str(Path(driver).resolve())


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
