"""Per-student grading seeds (grader.delivery.seeds): the classes' and the bundle's graders use them
(tests/test_grade.py, tests/test_nbgrader.py and tests/test_gradescope.py grade with them)."""

from __future__ import annotations

import hashlib
import hmac

from grader.delivery.seeds import SEED_RANGE, new_secret, student_seed


def test_a_students_seed_is_theirs_and_the_same_every_time():
    secret = new_secret()
    assert len(secret) == 64 and secret != new_secret()
    ids = [f"student{i}" for i in range(200)] + ["12345", "12345,67890", "café", "bad\udcff"]
    seeds = [student_seed(secret, s) for s in ids]
    assert seeds == [student_seed(secret, s) for s in ids]  # a rerun, a regrade
    assert len(set(seeds)) == len(seeds) and all(0 <= s < SEED_RANGE for s in seeds)
    assert student_seed(secret, "12345") != student_seed(new_secret(), "12345")  # another run, another seed
    assert student_seed("3", "ada") == student_seed("3", "ada") != student_seed("4", "ada")


def test_a_seed_is_the_hmac_of_the_id_under_the_secret():
    """What the README promises, so that an instructor can compute a student's seed without this package."""
    digest = hmac.new(b"3", b"ada", hashlib.sha256).digest()
    assert student_seed("3", "ada") == int.from_bytes(digest[:8], "big") % 2**31
