"""What students write is the idea, not the guards: inside the solution regions, the lines of `if …: raise`
statements are at most a small share; the other guards are provided code outside the regions (and tested by the
chapters' own tests). `python tests/test_guards.py` prints the share per chapter."""

from __future__ import annotations

import ast
import re

from grader import chapters

GOAL = 0.15
REGION = re.compile(r"^[ \t]*### BEGIN SOLUTION\n(.*?)^[ \t]*### END SOLUTION", re.S | re.M)


def shares() -> dict[str, tuple[int, int]]:
    """Chapter id → (solution-region lines, of them lines of `if …: raise …` statements); blank and comment lines
    are not counted."""
    out = {}
    for ch in chapters.all_chapters():
        source = (chapters.SOLUTIONS / ch.filename).read_text(encoding="utf-8")
        tree = ast.parse(source)
        guard_lines: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and node.body and all(isinstance(s, ast.Raise) for s in node.body) and not node.orelse:
                guard_lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
        total = guards = 0
        for m in REGION.finditer(source):
            first = source.count("\n", 0, m.start(1)) + 1
            for k, line in enumerate(m.group(1).splitlines()):
                if line.strip() and not line.strip().startswith("#"):
                    total += 1
                    guards += (first + k) in guard_lines
        out[ch.id] = (total, guards)
    return out


def test_guards_are_a_small_share_of_what_students_write():
    counted = shares()
    total = sum(t for t, _ in counted.values())
    guards = sum(g for _, g in counted.values())
    assert total and guards / total <= GOAL, (
        f"{guards} of {total} solution-region lines ({guards / total:.0%}) are guards; at most {GOAL:.0%}: "
        + ", ".join(f"{c} {g}/{t}" for c, (t, g) in counted.items() if t and g / t > GOAL)
    )


if __name__ == "__main__":
    counted = shares()
    for chapter_id, (t, g) in counted.items():
        print(f"{chapter_id}  {g:4d} / {t:4d} guard lines  {g / t if t else 0:.0%}")
    t, g = sum(t for t, _ in counted.values()), sum(g for _, g in counted.values())
    print(f"all   {g:4d} / {t:4d} guard lines  {g / t:.0%}")
