"""Scripts run on both sides and compared step by step: the chapters graded by trace (ch24's scheduler, ch25's
block manager, ch27's engine core loop).

A trace check runs one script of operations, plain data, on the student's object and on the reference. The
chapter's module provides the function that runs a whole script (`replay`, outside the solution regions, so
the student's file carries it too): it returns one plain-data record per step, and a step that raises ends
the list with `{"error": "ValueError: …", "where": "line … in …: …"}` (a stub's NotImplementedError goes
through: the check then reports "not implemented"). The check asks for the reference's trace first (every
`t.ref` call of a public check happens whatever the student answered), then for the student's, which runs in
their process in one call, and compares the two:

    expected = t.ref.replay(script)            # or t.ref.drive(driver, …) when it needs more than the trace
    yours = t.yours.replay(script)
    compare_trace(yours, expected, case='case "preemption": …', describe=step_text, explain=difference)

`compare_trace` checks the structure (a list of dicts), reports a step that raised and a trace that stopped early,
and otherwise hands the first step whose records differ to the chapter: the chapter keeps only what is its
own, what a step did (`describe`) and why a difference is wrong (`explain`). The failure reads

    case "preemption": …
    step 3 of 18: <what the step did>
    <the explanation, with its hint>
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Sequence

from grader.authoring.compare import CheckFailed, plural
from grader.authoring.compare import describe as describe_value
from grader.i18n import tr

Explain = Callable[[int, dict, dict], "CheckFailed | None"]
"""`explain(k, yours, expected)`: why the records of step k (0-based) differ, or None when they agree."""

MALFORMED = (KeyError, TypeError, IndexError, ValueError, AttributeError)
"""What reading a record that is not in the documented form raises."""


def expect_records(value: Any, *, what: str = "replay") -> list[dict]:
    """The student's trace as it must come back: a list of dicts, one per step (else CheckFailed, naming
    `what`, the provided function that made it)."""
    if not isinstance(value, list) or not all(isinstance(r, dict) for r in value):
        raise CheckFailed(
            tr(
                "{what} should return a list of dicts, one per step; yours returned {value} ({what} is provided: keep it as it is)",
                what=what,
                value=describe_value(value),
            )
        )
    return value


def raised(record: dict) -> bool:
    """Whether this record is the end of a trace whose step raised."""
    return "error" in record


def error_lines(record: dict) -> list[str]:
    """What the student's code raised in a step, and where."""
    where = record.get("where")
    return [tr("your code raised {error}", error=record["error"])] + ([tr("    at {where}", where=where)] if where else [])


def compare_trace(
    yours: Any,
    expected: Sequence[dict],
    *,
    case: str,
    describe: Callable[[int], str],
    explain: Explain,
    what: str = "replay",
    partial: bool = False,
    beyond: Callable[[dict], str] | None = None,
) -> list[dict]:
    """Compare the student's trace with the expected one and raise the first difference, explained.

    Args:
        yours: what the student's `what` returned (checked: a list of dicts).
        expected: the reference's records, one per step.
        case: the first line of every failure (the script, in the chapter's words).
        describe: `describe(k)`, what step k (0-based) did, from the expected side; it follows "step k+1 of n:".
        explain: `explain(k, yours[k], expected[k])`, the failure explaining why step k differs (its lines and
            its hint; it may also raise it), or None when the step agrees. It is called for k = 0, 1, … in
            order, each step at most once, so it may walk a state along (`describe(k)` is asked afterwards,
            for the step a failure is about, or for a step it never saw: one that raised or was missing).
        partial: a record that ends in an error may carry what the step did before it raised: `explain` sees
            it first (it must cope with the missing parts), and the error is reported only if it finds nothing.
        beyond: for a trace longer than the expected one, what its first extra step did (after "the
            reference's trace ends after step n;"), when the chapter can say it.

    Returns:
        The student's records (all agree with the expected ones).
    """
    mine = expect_records(yours, what=what)
    n = len(expected)

    def failure(k: int, *lines: str) -> CheckFailed:
        return CheckFailed(case, _step(k, n, describe(k)), *lines)

    for k, want in enumerate(expected):
        if k >= len(mine):
            raise failure(k, tr("your trace stopped after {steps}, before this one", steps=plural(k, tr("step"))))
        got = mine[k]
        if raised(got) and not partial:
            raise failure(k, *error_lines(got))
        try:
            with documented(what, k):
                found = explain(k, got, want)
        except CheckFailed as e:
            found = e
        if found is not None:
            raise found.within(case, _step(k, n, describe(k)))
        if raised(got):
            raise failure(k, *error_lines(got))
    if len(mine) > n:
        extra = mine[n]
        said = " ".join(error_lines(extra)) if raised(extra) else beyond(extra) if beyond else ""
        if said:
            line = tr("the reference's trace ends after step {n}; yours goes on to a step {m}: {said}", n=n, m=n + 1, said=said)
        else:
            line = tr("the reference's trace ends after step {n}; yours goes on to a step {m}", n=n, m=n + 1)
        raise CheckFailed(case, line)
    return mine


def _step(k: int, n: int, what: str) -> str:
    """ "step k+1 of n: what step k did"."""
    return tr("step {k} of {n}: {what}", k=k + 1, n=n, what=what)


@contextlib.contextmanager
def documented(what: str = "replay", k: int | None = None) -> Iterator[None]:
    """`with documented(what, k):` turns an error of reading a record not in the documented form (a key missing,
    a wrong type) into a failure that says so, instead of a grader error."""
    try:
        yield
    except MALFORMED as e:
        error = f"{type(e).__name__}: {e}"
        if k is not None:
            line = tr(
                "your {what}'s record of step {k} is not in the documented form ({error}); {what} is provided: keep it as it is",
                what=what,
                k=k + 1,
                error=error,
            )
        else:
            line = tr(
                "your {what}'s record is not in the documented form ({error}); {what} is provided: keep it as it is", what=what, error=error
            )
        raise CheckFailed(line) from None


def walk(items: Iterator[Any]) -> Callable[[int], Any]:
    """`at = walk(generator)`: `at(k)` is the generator's item k, for k that never decrease (a state walked along
    a trace, read by `describe` and `explain` at the same step)."""
    seen: list[Any] = []

    def at(k: int) -> Any:
        while len(seen) <= k:
            seen.append(next(items))
            if len(seen) > 2:
                seen[-3] = None  # only the current step and the one before it are kept
        return seen[k]

    return at
