"""What a check author imports, in one line: `from grader.authoring import public, Trial, CheckFailed, ...`.

    spec.py            @public / @hidden mark a function of one Trial as a check; hidden_model for what must not ship
    trial.py           Trial: t.yours.fn(...) beside t.ref.fn(...), t.figure(...); run_one gives the verdict
    compare.py         CheckFailed(*lines, hint=...), expect_tensor / expect_int, wrong_mask, fmt / vec / short
    misconceptions.py  a chapter's table of common mistakes (grader/hidden/chNN_mistakes.py): hints by id
    trace.py           scripts run on both sides, compared step by step (ch24, ch25, ch27): the student's side runs the
                       whole script in one call (a provided `replay`), compare_trace explains the first step that differs
    reference.py       what t.ref is: the reference module, or in a student release a replay of its answers
    source.py          the student's code read as text (never run) on this side: where a hint should point

Writing a first check: grader/checks/README.md.
"""

from grader.authoring.compare import (
    Blocked,
    CheckFailed,
    Hint,
    describe,
    expect_int,
    expect_tensor,
    first_named,
    first_wrong,
    fmt,
    plural,
    same,
    short,
    vec,
    wrong_mask,
)
from grader.authoring.misconceptions import Mistake, mistake, mistakes
from grader.authoring.spec import CheckSpec, hidden, hidden_model, if_hidden, public
from grader.authoring.trace import compare_trace, error_lines, expect_records, raised, walk
from grader.authoring.trial import Remote, StudentCallable, Trial
from grader.isolation.session import OverBudget, StudentRaised

__all__ = [
    "Blocked",
    "CheckFailed",
    "CheckSpec",
    "compare_trace",
    "describe",
    "error_lines",
    "expect_int",
    "expect_records",
    "expect_tensor",
    "first_named",
    "first_wrong",
    "fmt",
    "hidden",
    "hidden_model",
    "Hint",
    "if_hidden",
    "Mistake",
    "mistake",
    "mistakes",
    "OverBudget",
    "plural",
    "public",
    "raised",
    "Remote",
    "same",
    "short",
    "StudentCallable",
    "StudentRaised",
    "Trial",
    "vec",
    "walk",
    "wrong_mask",
]
