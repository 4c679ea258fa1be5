"""Running grader code as in a student release: the hidden checks (and their models) and the solutions
cannot be imported. Shared by the release tests and the scan of shipped code."""

from __future__ import annotations

import contextlib
import importlib.abc
import sys

ABSENT = ("solutions", "grader.hidden")
"""What a student release leaves out, as importable names."""


def absent(name: str) -> bool:
    return any(name == a or name.startswith(a + ".") for a in ABSENT)


class _Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if absent(name):
            raise ImportError(f"{name} is not part of a student release")
        return None


@contextlib.contextmanager
def as_in_a_release():
    """Within the block, importing the hidden side or the solutions fails (modules already imported included),
    and no chapter has hidden checks here (`grader.checks.has_hidden`)."""
    import grader.checks

    gone = {n: m for n, m in sys.modules.items() if absent(n)}
    for n in gone:
        del sys.modules[n]
    finder, has_hidden = _Absent(), grader.checks.has_hidden
    sys.meta_path.insert(0, finder)
    grader.checks.has_hidden = lambda chapter_id: False
    try:
        yield
    finally:
        grader.checks.has_hidden = has_hidden
        sys.meta_path.remove(finder)
        sys.modules.update(gone)
