"""Every chapter's table of common mistakes (grader/hidden/chNN_mistakes.py), checked row by row: the row's edits
of the reference, graded, get the row's hint in each of its tasks. Tests assert hint ids, never the prose."""

from __future__ import annotations

import re

import pytest
from mutate import mutant

from grader import chapters
from grader.authoring.misconceptions import Mistake, mistakes, recorded, table
from grader.run import check

SEED = 2024
TIME_LIMIT = 5.0
"""Seconds per check: a mistake that makes the code hang costs that, not the default 10 s."""
ROWS = [(ch.id, m) for ch in chapters.all_chapters() for m in table(ch.id)]


def _sources(chapter_id: str) -> str:
    """The chapter's check modules (public and hidden, helpers included)."""
    here = chapters.ROOT / "grader"
    files = sorted((here / "checks").glob(f"{chapter_id}*.py")) + sorted((here / "hidden").glob(f"{chapter_id}*.py"))
    return "\n".join(p.read_text(encoding="utf-8") for p in files if not p.name.endswith("_mistakes.py"))


@pytest.mark.slow
@pytest.mark.parametrize("chapter_id, row", [r for r in ROWS if r[1].edits], ids=lambda v: getattr(v, "id", v))
def test_each_mistake_gets_its_hint(tmp_path, chapter_id: str, row: Mistake):
    submission = mutant(tmp_path / "submission", chapter_id, *row.edits)
    for task in row.tasks:
        seen = []
        for public in (True, False):  # the hidden checks only where no public check names it (half the time)
            report = check(
                chapter_id,
                submission=submission,
                task=task,
                public=public,
                hidden=not public,
                seed=SEED,
                figures_dir=None,
                time_limit=TIME_LIMIT,
            )
            seen += [r for r in report.results if r.status != "passed"]
            if row.id in {h for r in seen for h in r.hints}:
                break
        named = {h for r in seen for h in r.hints}
        assert row.id in named, (
            f"{chapter_id} mistake {row.id!r} should be named by a failing check of {task}; "
            f"named: {sorted(named)}; " + "; ".join(f"{r.name}: {r.status} {r.message[:200]}" for r in seen)
        )


@pytest.mark.parametrize("chapter_id", sorted({c for c, _ in ROWS}))
def test_a_table_is_well_formed(chapter_id: str):
    """Ids are unique names, tasks exist, every row is used by a check, and every hint a check names is a row."""
    rows = table(chapter_id)
    ids = [m.id for m in rows]
    assert len(ids) == len(set(ids)), ids
    assert all(re.fullmatch(r"[a-z][a-z0-9_]*", i) for i in ids), ids
    tasks = {t.id for t in chapters.find(chapter_id).tasks}
    assert all(set(m.tasks) <= tasks for m in rows), [(m.id, m.task) for m in rows]
    source = _sources(chapter_id)
    used = set(re.findall(r"\bM\.(\w+)", source)) | set(re.findall(r"""\bM\.hint\(\s*["'](\w+)""", source))
    assert not used - set(ids) - {"hint", "rows"}, f"hints named by the checks but not in the table: {used - set(ids)}"
    unused = [i for i in ids if i not in used]
    assert not unused, f"rows no check names (M.<id>): {unused}"
    for m in rows:
        if not m.edits:  # a mistake no edit of the reference makes is shown by a test of the chapter's own
            own = (chapters.ROOT / "tests" / f"test_{chapter_id}.py").read_text(encoding="utf-8")
            assert f'"{m.id}"' in own, f"{m.id} has no edits, so tests/test_{chapter_id}.py must show its hint"


def test_a_release_carries_the_hints_without_the_edits():
    for chapter_id in sorted({c for c, _ in ROWS}):
        record = recorded(chapter_id)
        assert set(record) == {m.id for m in table(chapter_id)}
        assert all(set(v) == {"task", "message"} for v in record.values())


def test_hints_are_filled_and_carry_their_id():
    chapter_id, row = next((c, m) for c, m in ROWS if "{" not in m.message)
    hint = mistakes(chapter_id).hint(row.id)
    assert hint == row.message and hint.id == row.id
    with pytest.raises(KeyError, match="no mistake"):
        mistakes(chapter_id).hint("no_such_mistake")


HIDDEN_NAMED = [
    ("ch15", "reshape", "random tables and ids of any shape"),  # a 0-d case cannot tell; a later one does
    ("ch15", "out_in_swapped", "agreement with transformers' Qwen3ForCausalLM"),
    ("ch15", "shard_zero", "loading real tensors"),
    ("ch19", "one_sign", "a rotation keeps every head's length"),
    ("ch19", "no_offset", "a chunk after a cache gives the rows"),
    ("ch19", "rotated_v", "agreement with transformers' Qwen3Attention: a chunk"),
    ("ch20", "mixes_tokens", "random widths, leading shapes and bf16"),
    ("ch21", "last_index", "appends of 0 tokens"),
    ("ch21", "swapped_kv", "agrees with transformers' DynamicLayer"),
    ("ch23", "probabilities", "random batches with per-row top_k and top_p"),
    ("ch24", "budget_used_up", "invariants of your own trace"),
    ("ch24", "cached_is_computed", "invariants of your counters"),
    ("ch25", "slot_is_position", "random chunks after a cached prefix"),
    ("ch25", "hash_bytes", "memory pressure"),
    ("ch25", "revived_ref", "invariants hold on your own trace"),
    ("ch27", "length_cap_missed", "invariants on your own trace: tokens in order"),
    ("ch27", "no_launch_ahead", "invariants on your own trace: placeholders"),
    ("ch28", "unchained", "random requests, block sizes and identity keys"),
    ("ch28", "salt_everywhere", "a long prompt"),
    ("ch29", "itl_mean_of_means", "random timestamp sets"),
    ("ch31", "logit_weights", "random router logits"),
    ("ch31", "weights_in_row_order", "round trips through your dispatch and combine"),
    ("ch31", "concatenated", "bfloat16 rows, top-1, one rank"),
]
"""Hidden checks that once failed these mistakes without naming them: a property of the student's own trace, an
oracle other than the reference, or a first random case that fits several mistakes. Each now names the row."""


@pytest.mark.slow
@pytest.mark.parametrize("chapter_id, mistake_id, check_name", HIDDEN_NAMED, ids=lambda v: v if isinstance(v, str) else None)
def test_hidden_checks_name_the_mistake_that_fails_them(tmp_path, chapter_id: str, mistake_id: str, check_name: str):
    row = next(m for m in table(chapter_id) if m.id == mistake_id)
    submission = mutant(tmp_path / "submission", chapter_id, *row.edits)
    found = []
    for task in row.tasks:
        report = check(
            chapter_id, submission=submission, task=task, public=False, hidden=True, seed=SEED, figures_dir=None, time_limit=TIME_LIMIT
        )
        found += [r for r in report.results if r.name.startswith(check_name)]
    assert len(found) == 1, [r.name for r in found]
    assert found[0].status == "failed" and found[0].hints == [mistake_id], (found[0].status, found[0].hints, found[0].message[:400])
