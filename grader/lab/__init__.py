"""`course lab`: the course's interactive experiments, drawn from the student's own functions.

`grader/lab/chNN.py` holds chapter NN's experiments, found by file name like the checks
and the figures. An experiment is a function of a `Trial` and the instance the page asks
for, marked with `@experiment(...)`: it calls the student's functions through the trial
(in the student's process, with the limits of `course check`), asks for the expected
values with `ask` (the reference where this installation has one; in a student release
the answers recorded at release time, for the instances some public check or the lab's
default asked about), records the figure parts with `t.figure` (with `checked=False` where
it had no expected value: the figure then says so and marks nothing), and explains a
wrong answer with the chapter's own check helpers, or where there is no expected value
with the properties that need none. Its parameters are declared with bounds, so the
server refuses an instance the figure cannot show before any student code runs.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal, overload

from grader import chapters
from grader.i18n import mark, tr

if TYPE_CHECKING:
    from grader.authoring.trial import Trial


class ParamError(ValueError):
    """An instance the page asked for is out of bounds; `errors` maps a parameter to what is wrong."""

    def __init__(self, errors: dict[str, str]) -> None:
        self.errors = errors
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))


# -- parameters ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Param:
    """One control of an experiment: its name in the body, its label on the page and its default."""

    name: str
    label: str
    default: Any

    kind = "text"

    def parse(self, raw: Any) -> Any:
        raise NotImplementedError

    def to_json(self) -> dict:
        return {"name": self.name, "label": tr(self.label), "kind": self.kind, "default": self.shown(self.default)}

    def shown(self, value: Any) -> Any:
        """The value as the page's control holds it."""
        return value


@overload
def _number(raw: Any, *, integer: Literal[True]) -> int: ...
@overload
def _number(raw: Any, *, integer: Literal[False]) -> float: ...
@overload
def _number(raw: Any, *, integer: bool) -> float | int: ...
def _number(raw: Any, *, integer: bool) -> float | int:
    if isinstance(raw, bool):
        raise ValueError(tr("a number, please"))
    if isinstance(raw, (int, float)):
        value = raw
    else:
        text = str(raw).strip().replace("−", "-")
        if not text:
            raise ValueError(tr("a number, please"))
        try:
            value = int(text) if integer else float(text)
        except ValueError:
            shown = repr(str(raw).strip())
            wrong = tr("{value} is not a whole number", value=shown) if integer else tr("{value} is not a number", value=shown)
            raise ValueError(wrong) from None
    if integer:
        if isinstance(value, float) and not value.is_integer():
            raise ValueError(tr("{value} is not a whole number", value=format(value, "g")))
        return int(value)
    if not math.isfinite(value):
        raise ValueError(tr("a finite number, please"))
    return float(value)


@dataclass(frozen=True)
class Int(Param):
    """A whole number in [low, high]."""

    low: int = 0
    high: int = 10
    kind = "int"

    def parse(self, raw: Any) -> int:
        value = _number(raw, integer=True)
        if not self.low <= value <= self.high:
            text = mark("between {low} and {high} (the figure shows at most {high}); got {value}")
            bounds = tr(text, low=self.low, high=self.high, value=value)
            raise ValueError(bounds)
        return value

    def to_json(self) -> dict:
        return {**super().to_json(), "min": self.low, "max": self.high}


@dataclass(frozen=True)
class Float(Param):
    """A number in [low, high]."""

    low: float = 0.0
    high: float = 1.0
    step: float = 0.1
    kind = "float"

    def parse(self, raw: Any) -> float:
        value = _number(raw, integer=False)
        if not self.low <= value <= self.high:
            raise ValueError(tr("between {low:g} and {high:g}; got {value:g}", low=self.low, high=self.high, value=value))
        return value

    def to_json(self) -> dict:
        return {**super().to_json(), "min": self.low, "max": self.high, "step": self.step}


@dataclass(frozen=True)
class Numbers(Param):
    """A list of numbers typed as "3, 0, 4": between `min_len` and `max_len` of them, each in [low, high]."""

    min_len: int = 1
    max_len: int = 6
    low: float = 0
    high: float = 9
    integer: bool = True
    kind = "list"

    def parse(self, raw: Any) -> list:
        items = raw if isinstance(raw, list) else [s for s in re.split(r"[\s,;\[\]]+", str(raw)) if s]
        if not self.min_len <= len(items) <= self.max_len:
            if self.min_len == self.max_len:
                raise ValueError(tr("{n} numbers separated by commas; got {got}", n=self.min_len, got=len(items)))
            many = tr("{low} to {high} numbers separated by commas; got {got}", low=self.min_len, high=self.max_len, got=len(items))
            raise ValueError(many)
        values = []
        for i, item in enumerate(items):
            try:
                v = _number(item, integer=self.integer)
            except ValueError as e:
                raise ValueError(tr("item {i}: {error}", i=i, error=e)) from None
            if not self.low <= v <= self.high:
                raise ValueError(tr("item {i} is {v:g}; each must be between {low:g} and {high:g}", i=i, v=v, low=self.low, high=self.high))
            values.append(v)
        return values

    def shown(self, value: Any) -> str:
        return ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)

    def to_json(self) -> dict:
        return {**super().to_json(), "min": self.low, "max": self.high, "min_len": self.min_len, "max_len": self.max_len}


# -- experiments -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Experiment:
    """One interactive experiment: its controls, the student functions it calls, the figures it draws."""

    id: str
    chapter: str
    title: str
    about: str
    """What to try, one or two sentences (the page shows them above the controls)."""
    figures: tuple[str, ...]
    params: tuple[Param, ...]
    calls: tuple[str, ...]
    """The student functions the body calls (shown on the page)."""
    body: Callable[["Trial", dict], None]
    constraints: Callable[[dict], dict[str, str]] | None = None
    """Checks across parameters: {parameter: what is wrong}; empty when the instance is fine."""
    captions: Callable[[dict], dict[str, tuple[str, ...]]] | None = None
    """The (zh, en) captions of this instance, or (zh, en, title), for figures whose catalog captions name
    the canonical instance."""
    varies: str = ""
    """Said on the page when a figure keeps parts of its canonical instance."""
    time_limit: float | None = None

    def parse(self, raw: dict | None) -> dict:
        """The instance from the page's values (defaults for missing ones); raises ParamError."""
        raw = raw or {}
        values, errors = {}, {}
        for p in self.params:
            try:
                values[p.name] = p.parse(raw[p.name]) if p.name in raw else p.default
            except ValueError as e:
                errors[p.name] = str(e)
        unknown = sorted(set(raw) - {p.name for p in self.params})
        if unknown:
            errors[unknown[0]] = tr("this experiment has no control {name}", name=repr(unknown[0]))
        if not errors and self.constraints:
            errors = self.constraints(values)
        if errors:
            raise ParamError(errors)
        return values

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "chapter": self.chapter,
            "title": tr(self.title),
            "about": tr(self.about),
            "figures": list(self.figures),
            "calls": list(self.calls),
            "varies": tr(self.varies) if self.varies else "",
            "params": [p.to_json() for p in self.params],
        }


def experiment(
    experiment_id: str,
    *,
    title: str,
    about: str,
    figures: tuple[str, ...],
    params: list[Param],
    calls: tuple[str, ...],
    constraints: Callable[[dict], dict[str, str]] | None = None,
    captions: Callable[[dict], dict[str, tuple[str, ...]]] | None = None,
    varies: str = "",
    time_limit: float | None = None,
) -> Callable:
    """Mark `body(t, p)` as an experiment of the chapter whose lab module defines it (its id: "ch25-<id>")."""

    def wrap(body: Callable[["Trial", dict], None]) -> Callable[["Trial", dict], None]:
        chapter = body.__module__.rsplit(".", 1)[-1]
        body.__experiment__ = Experiment(  # type: ignore[attr-defined]
            f"{chapter}-{experiment_id}",
            chapter,
            title,
            about,
            tuple(figures),
            tuple(params),
            tuple(calls),
            body,
            constraints,
            captions,
            varies,
            time_limit,
        )
        return body

    return wrap


@dataclass
class Catalog:
    """Every experiment of the chapters this installation has, in course order."""

    experiments: dict[str, Experiment] = field(default_factory=dict)

    def find(self, experiment_id: str) -> Experiment:
        try:
            return self.experiments[experiment_id]
        except KeyError:
            raise chapters.UnknownName("experiment", experiment_id, list(self.experiments)) from None


def of_chapter(chapter_id: str) -> list[Experiment]:
    """A chapter's experiments, in definition order (none if it has no lab module)."""
    name = f"grader.lab.{chapter_id}"
    if importlib.util.find_spec(name) is None:
        return []
    module = importlib.import_module(name)
    return [v.__experiment__ for v in vars(module).values() if hasattr(v, "__experiment__")]


def catalog() -> Catalog:
    found = Catalog()
    for ch in chapters.all_chapters():
        for exp in of_chapter(ch.id):
            found.experiments[exp.id] = exp
    return found


def ask(t: "Trial", question: Callable[[Any], Any]) -> Any:
    """`question(t.ref)`: the reference's answer, or the one recorded for these inputs in a student release;
    None where this installation has neither (the experiment then checks what needs no answer)."""
    from grader.authoring.reference import NoAnswer

    if t.ref is None:
        return None
    try:
        return question(t.ref)
    except NoAnswer:
        return None


def expected_or_own(want: Any, got: Any) -> Any:
    """The expected value for a figure, or where this installation has no reference (a student release)
    the student's own, so that the figure draws their values without marks."""
    return got if want is None else want
