"""Comparing the student's values with the expected ones, in words a student can use.

Structure is checked before values ("expected a 1-D int64 tensor of 5 slots;
yours: float32 [5, 1]"), so a later message can talk about elements safely.
Every helper raises `CheckFailed` with the message to show.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch

from grader.i18n import language, tr
from grader.isolation.wire import Handle
from grader.report import hint_line


class Hint(str):
    """A hint's text that knows which common mistake it names (`id`, a row of the chapter's table of
    mistakes, `grader.authoring.misconceptions`); an empty `id` is a hint that names no mistake in particular."""

    id: str

    def __new__(cls, text: str, id: str = "") -> "Hint":
        hint = super().__new__(cls, text)
        hint.id = id
        return hint

    def format(self, *args: Any, **kwargs: Any) -> "Hint":
        return Hint(str.format(self, *args, **kwargs), self.id)


class CheckFailed(Exception):
    """The student's answer is wrong; the message says how, in the chapter's terms.

    `CheckFailed(line, line, ..., hint=h)`: the lines of the explanation, then "hint: h" when a hint is
    given (a `Hint` from the chapter's table of mistakes, or plain text; several hints, when one answer makes
    several mistakes at once, are joined in one sentence); empty lines are left out. `hints` lists the ids of
    the mistakes the message names (what tests assert, not the prose).
    """

    def __init__(self, *lines: str, hint: str | Sequence[str] | None = None) -> None:
        named = [h for h in ([hint] if isinstance(hint, str) or hint is None else list(hint)) if h]
        self.lines = [str(line) for line in lines if line]
        self.hint = tr("; ").join(named) or None
        self.hints = [h.id for h in named if isinstance(h, Hint) and h.id]
        super().__init__("\n".join(self.lines + ([hint_line(self.hint)] if self.hint else [])))

    def named_by(self, other: "CheckFailed | None") -> "CheckFailed":
        """The same failure with `other`'s hint: a property of the student's own trace that fails is named by the
        mistake a comparison with the reference on the same inputs finds (itself when it names one already, or when
        `other` names none)."""
        if self.hints or other is None or not other.hints:
            return self
        failed = type(self).__new__(type(self))
        CheckFailed.__init__(failed, *self.lines, hint=other.hint)
        failed.hints = list(other.hints)
        return failed

    def within(self, *lines: str) -> "CheckFailed":
        """The same failure with `lines` of context before it (the inputs, the case, the step)."""
        failed = type(self).__new__(type(self))
        CheckFailed.__init__(failed, *lines, *self.lines, hint=self.hint)
        failed.hints = list(self.hints)
        return failed


def first_named(cases: Iterable[Callable[[], object]]) -> None:
    """Run every case of a check; re-raise the first failure that names a mistake of the chapter's table (a hint id),
    else the first failure. A random case whose wrong answer fits several mistakes, or none in float precision, then
    does not hide a later case that names the one it is."""
    first: CheckFailed | None = None
    for case in cases:
        try:
            case()
        except CheckFailed as failure:
            if failure.hints:
                raise
            first = first or failure
    if first is not None:
        raise first


class Blocked(Exception):
    """The check cannot run here (missing hardware or an optional package); says what it needs."""


def describe(v: Any) -> str:
    """A short description of a value's type and shape: "float32 [5, 1]", "int 3"."""
    if isinstance(v, torch.Tensor):
        return tr("{dtype} tensor {shape}", dtype=str(v.dtype).removeprefix("torch."), shape=list(v.shape))
    if isinstance(v, Handle):
        return tr("an object of type {type}", type=v.type_name)
    if type(v) in (list, tuple):
        kinds = sorted({type(x).__name__ for x in v})
        if kinds:
            return tr("{kind} of {n} {types}", kind=type(v).__name__, n=len(v), types="/".join(kinds))
        return tr("{kind} of {n}", kind=type(v).__name__, n=len(v))
    if v is None:
        return "None"
    return f"{type(v).__name__} {fmt(v) if type(v) in (int, float, bool) else ''}".rstrip()


def fmt(x: Any, digits: int = 4) -> str:
    """A number as a student would write it: ints plain, floats with `digits` significant digits."""
    if isinstance(x, torch.Tensor) and x.numel() == 1:
        x = x.item()
    if isinstance(x, bool) or isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        if math.isnan(x) or math.isinf(x):
            return {"nan": "nan", "inf": "∞", "-inf": "−∞"}[repr(x)]
        return f"{x:.{digits}g}"
    return str(x)


def vec(xs: Any, limit: int = 8, digits: int = 4) -> str:
    """A short list of numbers as a student reads it: "[0.5, −1, 2]", cut after `limit` entries
    ("[1, 2, 3, … (40 in all)]"); tensors of any shape are flattened."""
    if isinstance(xs, torch.Tensor):
        xs = xs.reshape(-1).tolist()
    xs = list(xs)
    shown = ", ".join(fmt(x, digits) for x in xs[:limit])
    return f"[{shown}]" if len(xs) <= limit else tr("[{shown}, … ({n} in all)]", shown=shown, n=len(xs))


def short(xs: Any, limit: int = 12) -> str:
    """A list as Python prints it, cut in the middle of a long one: "[3, 0, 4]", "[1, 2, …, 40] (40 in all)"."""
    xs = list(xs)
    if len(xs) <= limit:
        return str(xs)
    return tr("[{shown}, … ({n} in all)]", shown=", ".join(map(str, xs[: limit - 2])), n=len(xs))


def plural(n: int, word: str, words: str | None = None) -> str:
    """ "1 block", "3 blocks" ("2 indices" with `words`); in Chinese, which has no plural, `n word` (the chapter
    passes `word` translated: `plural(n, tr("block"))`)."""
    if language() != "en":
        return f"{n} {word}"
    return f"{n} {word if n == 1 else words or word + 's'}"


def expect_tensor(v: Any, *, what: str, shape: tuple[int, ...] | list[int] | None = None, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Require a tensor of the given shape and dtype; `what` names it ("slots")."""
    wrong = not isinstance(v, torch.Tensor) or (
        (shape is not None and list(v.shape) != list(shape)) or (dtype is not None and v.dtype != dtype)
    )
    if wrong:
        kind = str(dtype).removeprefix("torch.") if dtype is not None else ""
        if shape is not None and kind:
            want = tr("a {ndim}-D {dtype} tensor of shape {shape}", ndim=len(shape), dtype=kind, shape=list(shape))
        elif shape is not None:
            want = tr("a {ndim}-D tensor of shape {shape}", ndim=len(shape), shape=list(shape))
        elif kind:
            want = tr("a {dtype} tensor", dtype=kind)
        else:
            want = tr("a tensor")
        raise CheckFailed(tr("expected {what} as {want}; yours: {yours}", what=what, want=want, yours=describe(v)))
    return v


def expect_int(v: Any, *, what: str, hint: str = "") -> int:
    """Require a plain Python int (not a bool, a float or a tensor); `hint` ends the message if not."""
    if type(v) is not int:
        message = tr("expected {what} as a Python int; yours: {yours}", what=what, yours=describe(v))
        if isinstance(v, torch.Tensor):
            message += tr("  (use .item() to turn a one-element tensor into a number)")
        raise CheckFailed(message + hint)
    return v


def wrong_mask(got: torch.Tensor, want: torch.Tensor, *, atol: float = 0.0, rtol: float = 0.0) -> torch.Tensor:
    """Elementwise: True where `got` differs from `want` beyond the tolerance (NaN equals NaN)."""
    if got.dtype == torch.bool or want.dtype == torch.bool or (atol == 0 and rtol == 0):
        return ~((got == want) | (_isnan(got) & _isnan(want)))
    g, w = got.double(), want.double()
    close = torch.isfinite(w) & ((g - w).abs() <= atol + rtol * w.abs())  # ±∞ only equals itself
    return ~(close | (g == w) | (torch.isnan(g) & torch.isnan(w)))


def _isnan(t: torch.Tensor) -> torch.Tensor:
    return torch.isnan(t) if t.is_floating_point() else torch.zeros_like(t, dtype=torch.bool)


def first_wrong(got: torch.Tensor, want: torch.Tensor, *, atol: float = 0.0, rtol: float = 0.0) -> tuple[int, ...] | None:
    """The index of the first element that differs, or None when all agree."""
    bad = wrong_mask(got, want, atol=atol, rtol=rtol)
    if not bad.any():
        return None
    return tuple(int(i) for i in bad.nonzero()[0])


def same(a: Any, b: Any) -> bool:
    """Deep, exact equality of wire values (tensors compare dtype, shape and bits; NaN equals NaN)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and not wrong_mask(a, b).any()
        )
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if type(a) is float and math.isnan(a):
        return math.isnan(b)
    return a == b
