"""One check's view of the world (`Trial`), and running one check into a result (`run_one`).

A Trial holds the student's module (through a `Session`), the reference, seeded
random sources and the figure data the check records.
"""

from __future__ import annotations

import contextlib
import importlib
import random
import time
import traceback
import zlib
from types import ModuleType
from typing import Any, Callable, Iterator

import torch

from grader.authoring.compare import Blocked, CheckFailed, describe, same
from grader.authoring.source import function_lines
from grader.authoring.spec import CheckSpec
from grader.i18n import tr
from grader.isolation.session import Call, Session, StudentError, StudentRaised
from grader.isolation.wire import Handle
from grader.report import CheckResult


class Trial:
    """One check's view: call student code, consult the reference, record figure data.

    `t.yours.fn(...)` calls the student's `fn` as `t.ref.fn(...)` calls the reference's; objects the student's
    code makes stay in their process and come back as `Remote`s whose methods are called the same way
    (`manager = t.yours.BlockManager(4, 4)`, `manager.allocate(seq)`). Random sources are seeded from the
    grading seed (hidden checks) or a fixed seed (public checks), and the check's name, so every run can be
    repeated.
    """

    def __init__(
        self, spec: CheckSpec, *, session: Session, ref: Any, seed: int, params: dict[str, tuple[str, ...]], figures: dict[str, dict]
    ) -> None:
        self.spec, self.session, self.ref = spec, session, ref
        self.params, self.figures = params, figures
        mixed = zlib.crc32(f"{seed if spec.hidden else 0}:{spec.key}".encode())
        self.rng = torch.Generator().manual_seed(mixed)
        self.random = random.Random(mixed)
        self.yours = Yours(self)

    def attrs(self, obj: Handle, *names: str) -> dict[str, Any]:
        """Read attributes (or properties) of an object the student's code made: its observable state."""
        with _missing_is_an_error():
            return self._wrap(self.session.attributes(obj, list(names)))

    def expect_raises(self, error: type[Exception], fn: StudentCallable, *args: Any, because: str, **kwargs: Any) -> None:
        """Require `fn(*args)` (`t.yours.fn`, or a method of a `Remote`) to raise `error` (a builtin exception
        class) for the reason `because`."""
        try:
            value = fn(*args, **kwargs)
        except StudentRaised as e:
            if e.not_implemented:
                raise
            if e.is_a(error.__name__):
                return
            raise CheckFailed(
                tr(
                    "{fn} should raise {error} because {because}; yours raised {name}: {message}",
                    fn=fn.label,
                    error=error.__name__,
                    because=because,
                    name=e.error.get("name"),
                    message=e.error.get("message"),
                )
            ) from None
        raise CheckFailed(
            tr(
                "{fn} should raise {error} because {because}; yours returned {value} instead",
                fn=fn.label,
                error=error.__name__,
                because=because,
                value=describe(value),
            )
        )

    def lines_of(self, name: str) -> list[tuple[int, str]]:
        """The lines of the student's function (or class) `name`, read as text by this side, for hints about
        where a measured property was lost (`grader.authoring.source`); empty if it cannot be read."""
        return function_lines(self.session.path, name)

    def require(self, module: str, extra: str = "oracle") -> ModuleType:
        """Import an optional package an oracle check needs, or block the check (status "blocked")."""
        try:
            return importlib.import_module(module)
        except ImportError:
            raise Blocked(
                tr("needs the {module} package, which this installation lacks (pip install -e '.[{extra}]')", module=module, extra=extra)
            ) from None

    def figure(self, figure_id: str, **parts: Any) -> None:
        """Record data for a figure (tensors become nested lists); hidden checks draw nothing.

        A figure marks as wrong what the check found wrong: record the check's own verdict beside the values
        (`wrong=wrong_mask(yours, expected, atol=…)`), so the figure never restates a tolerance."""
        if self.spec.hidden:
            return
        self.figures.setdefault(figure_id, {}).update({k: plain(v) for k, v in parts.items()})

    def _call(
        self, target: str | tuple[Handle, str], label: str, args: tuple, kwargs: dict, *, mutates: tuple[str, ...] = (), memory: int = 0
    ) -> Call:
        with _missing_is_an_error():
            call = self.session.call(target, [_unwrap(a) for a in args], {k: _unwrap(v) for k, v in kwargs.items()}, memory=memory)
        names = self.params.get(target, ()) if isinstance(target, str) else ()
        for i, (before, after) in enumerate(zip(args, call.args)):
            name = names[i] if i < len(names) else tr("argument {i}", i=i + 1)
            if name not in mutates and not same(_unwrap(before), after):
                raise CheckFailed(
                    tr(
                        "{label} changed its input `{name}`: functions in this course leave their "
                        "inputs untouched (build a new tensor instead of writing into `{name}`)",
                        label=label,
                        name=name,
                    )
                )
        for name, before in kwargs.items():
            if name not in mutates and not same(_unwrap(before), call.kwargs.get(name)):
                raise CheckFailed(
                    tr("{label} changed its input `{name}`: functions in this course leave their inputs untouched", label=label, name=name)
                )
        call.value = self._wrap(call.value)
        return call

    def _wrap(self, v: Any) -> Any:
        """Handles in a value become `Remote`s of this trial (the same object, equal remotes)."""
        if isinstance(v, Handle) and not isinstance(v, Remote):
            return Remote(v, self)
        if type(v) is list:
            return [self._wrap(x) for x in v]
        if type(v) is tuple:
            return tuple(self._wrap(x) for x in v)
        if type(v) is dict:
            return {k: self._wrap(x) for k, x in v.items()}
        return v


class StudentCallable:
    """A function of the student's module (`t.yours.fn`) or a method of an object it made (`remote.m`)."""

    def __init__(self, trial: Trial, target: str | tuple[Handle, str], label: str) -> None:
        self._trial, self._target, self.label = trial, target, label

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The value the student's code returns (objects as `Remote`s); a changed input fails the check."""
        return self._trial._call(self._target, self.label, args, kwargs).value

    def run(self, *args: Any, mutates: tuple[str, ...] = (), memory: int = 0, **kwargs: Any) -> Call:
        """The whole call: its value and its arguments afterwards (`call.args`), for functions that write into
        the inputs named in `mutates` (any other input changed fails the check).

        With `memory` (bytes) the call's memory is measured from outside (`Session.call`): it runs in a fresh
        process, and the inputs, the call, every process it starts and its reply count (`call.peak`), so a
        property like "no [T, S] tensor" is measured, not believed. Going over raises `OverBudget` (its `used`
        and `allowed`), after the call or when a budget stopped it.
        """
        return self._trial._call(self._target, self.label, args, kwargs, mutates=mutates, memory=memory)


class Yours:
    """`t.yours`: the student's module, called like the reference (`t.yours.causal_mask(6)`)."""

    def __init__(self, trial: Trial) -> None:
        self._trial = trial

    def __getattr__(self, name: str) -> StudentCallable:
        if name.startswith("__"):
            raise AttributeError(name)
        return StudentCallable(self._trial, name, name)


class Remote(Handle):
    """An object the student's code made, which stays in their process: `remote.method(...)` calls it there.

    It is a `Handle` (passed back to the student's code as the same object); a method named like a field of a
    Handle (`id`, `type_name`) is called as `remote.call("id")`.
    """

    def __init__(self, handle: Handle, trial: Trial) -> None:
        super().__init__(handle.id, handle.type_name)
        object.__setattr__(self, "_trial", trial)

    def __getattr__(self, name: str) -> StudentCallable:
        if name.startswith("_"):
            raise AttributeError(name)
        return self.call(name)

    def call(self, name: str) -> StudentCallable:
        """The method `name` of this object."""
        return StudentCallable(self.__dict__["_trial"], (Handle(self.id, self.type_name), name), f"{self.type_name}.{name}")

    def __repr__(self) -> str:
        return f"<{self.type_name} object>"

    def __copy__(self) -> "Remote":
        return self

    def __deepcopy__(self, memo: dict) -> "Remote":
        return self  # it names an object of the student's process: a copy names the same one


def _unwrap(v: Any) -> Any:
    """A value with its `Remote`s as plain handles (what crosses to the student's process)."""
    if isinstance(v, Remote):
        return Handle(v.id, v.type_name)
    if type(v) is list:
        return [_unwrap(x) for x in v]
    if type(v) is tuple:
        return tuple(_unwrap(x) for x in v)
    if type(v) is dict:
        return {k: _unwrap(x) for k, x in v.items()}
    return v


@contextlib.contextmanager
def _missing_is_an_error() -> Iterator[None]:
    """A function, method or attribute the module lacks is an error of the check ("your module has no
    function 'x' (was it renamed or deleted?)"), never an exception a check could take for the
    student's own (a check that expects ValueError would otherwise report "yours raised _Missing")."""
    try:
        yield
    except StudentRaised as e:
        if e.error.get("missing"):
            raise StudentError("error", e.explain()) from None
        raise


def plain(v: Any) -> Any:
    """Tensors and tuples as nested lists, so figure records are plain data."""
    if isinstance(v, torch.Tensor):
        return v.tolist()
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    return v


def not_run(spec: CheckSpec, function: str, reason: str) -> CheckResult:
    """A check that was not run, and why (no credit)."""
    return CheckResult(
        spec.task,
        function,
        tr(spec.name),
        spec.hidden,
        spec.points,
        "not run",
        tr("not run: {reason}, and each task gets one time limit (fix that first)", reason=reason),
    )


def run_one(
    spec: CheckSpec,
    function: str,
    *,
    session: Session,
    ref,
    seed: int,
    params: dict,
    figures: dict,
    time_limit: float,
    strays: Callable[[set[int]], list[str]],
) -> CheckResult:
    """Run one check and turn whatever happened into a result; never raises.

    `strays(keep)` kills and names the processes the student's code left running, apart from `keep`
    (found from outside the student's process)."""
    result = CheckResult(spec.task, function, tr(spec.name), spec.hidden, spec.points, "passed")
    trial = Trial(spec, session=session, ref=ref, seed=seed, params=params, figures=figures)
    session.begin_check(time_limit)
    t0 = time.monotonic()
    try:
        spec.body(trial)
    except CheckFailed as e:
        result.status, result.message, result.hints = "failed", str(e), list(e.hints)
    except Blocked as e:
        result.status, result.message = "blocked", str(e)
    except StudentRaised as e:
        result.status, result.message, result.todo = "error", e.explain(spec.task), bool(e.not_implemented)
    except StudentError as e:
        result.status, result.message = ("timeout" if e.status == "timeout" else "error"), str(e)
    except Exception as e:  # a result the check did not foresee (or a grader bug): never a crash
        where = f"({type(e).__name__}: {e})" if spec.hidden else "\n" + traceback.format_exc(limit=-3)
        result.status = "error"
        result.message = tr(
            "the grader could not interpret your result; if your answer looks right, show this to your instructor {where}", where=where
        )
    result.elapsed = time.monotonic() - t0
    result.student_seconds = session.time_used
    left = strays(session.pids)
    if left:
        session.fresh()  # the next check meets a process with no children of its own
        note = tr("your code left a process running ({process}); graded code must not start processes", process=left[0])
        result.message = "\n".join(filter(None, [result.message, note]))
        if result.status in ("passed", "failed"):
            result.status = "error"
    printed = session.take_printed()
    result.printed = "" if spec.hidden else printed  # what it printed during a hidden check is never shown
    return result
