"""Per-student grading seeds: the hidden instances one student meets are nobody else's.

A grading run (a class graded by `course grade`, a Gradescope bundle) has one secret, chosen at
random when the run starts (`new_secret`: 256 bits, so that nobody can find it from the seeds it
gives) and recorded where only the instructor reads it: `OUT/grading.json`, the bundle's
`run_autograder`. Each student's seed is the HMAC-SHA256 of the student's id under that secret,
reduced to the range of grading seeds (`student_seed`): the same secret and id give the same seed
on every rerun, a resumed run or a regrade, and knowing one student's seed (their feedback shows
it) tells nothing of the secret or of any other student's seed, so hidden instances one student
leaks help nobody else. An instructor who fixes the secret (`--seed N`, the secret "N") makes runs
repeatable, and guessable: that is for tests and for rerunning a class, not for a first grading.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

SEED_RANGE = 2**31
"""Grading seeds are in [0, SEED_RANGE), as `course check --seed` and a random seed are."""
CALIBRATION = "/calibration"
"""The id whose seed times the reference for the run's time limits: no student's (a folder name has no `/`)."""


def new_secret() -> str:
    """A run's secret: 64 hexadecimal digits (256 bits)."""
    return secrets.token_hex(32)


def secret_of(seed: int | str | None) -> str:
    """The secret for a run given `seed` (an instructor's `--seed`: that number as text), or a new one."""
    return new_secret() if seed is None else str(seed)


def student_seed(secret: str, student: str) -> int:
    """`student`'s grading seed under `secret`: HMAC-SHA256(secret, student id), its first 8 bytes
    reduced to SEED_RANGE. A student id that is not valid text (a file name's stray bytes, as
    surrogates) is encoded with them as they are: it never fails, and always gives the same seed."""
    key = secret.encode("utf-8")
    message = student.encode("utf-8", "surrogatepass")
    digest = hmac.new(key, message, hashlib.sha256).digest()
    return int.from_bytes(digest[:8], "big") % SEED_RANGE
