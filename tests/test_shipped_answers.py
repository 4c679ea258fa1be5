"""Nothing that ships to students computes a task's answer.

The public checks, their helper modules, the figures and the lab ship in the student release; the answers of
the public checks' instances ship too, recorded (`grader/answers/`). What must not ship is code that turns a
task's inputs into its answer: a student could call it (flash_model once gave 13/13 on ch22.2 without an online
softmax). So every public check of every chapter is run on the reference here, every input a graded function
or the reference is given is written down with its answer, and every function the shipped chapter modules
define is called on those inputs, in the ways its signature can take them, as in a release (the hidden side
and the solutions cannot be imported): no result may equal an answer.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import math
import signal
import warnings
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from releaselike import as_in_a_release

import grader.authoring.trial
from grader import chapters
from grader.authoring.reference import Live
from grader.isolation.wire import Handle
from grader.run import check, solutions_module

pytestmark = pytest.mark.slow  # grades submissions, builds releases or runs real tools: not in the fast loop

CHAPTERS = chapters.all_chapters()
PER_FUNCTION = 6  # instances per graded function (or reference driver) tried
CALL_SECONDS = 2.0  # a candidate that runs longer is stopped and counts as failing
SHIPPED_PACKAGES = ("grader.checks", "figures", "grader.lab")


@dataclass
class Instance:
    """One input of a graded function (or of a check's reference driver) and what the reference answered."""

    chapter: str
    fn: str
    args: tuple
    kwargs: dict
    answers: list  # the answer's parts that are not trivial (see `answer_parts`)


# -- what shipped code is -------------------------------------------------------------------------------------


def shipped_functions() -> list[tuple[str, object]]:
    """(module:name, function) of every function defined in a shipped chapter module (checks, helpers,
    figures, lab experiments), check and experiment bodies left out (they need a Trial)."""
    out = []
    for package in SHIPPED_PACKAGES:
        folder = chapters.ROOT.joinpath(*package.split("."))
        for path in sorted(folder.glob("ch[0-9][0-9]*.py")):
            name = f"{package}.{path.stem}"
            module = importlib.import_module(name)
            for attr, value in vars(module).items():
                if (
                    inspect.isfunction(value)
                    and value.__module__ == name
                    and not hasattr(value, "__check__")
                    and not hasattr(value, "__experiment__")
                ):
                    out.append((f"{name}:{attr}", value))
    return out


# -- what an answer is ----------------------------------------------------------------------------------------


def parts(value, out: list) -> list:
    """Every tensor, array, number, list and dict inside a value (the value itself included)."""
    if isinstance(value, (torch.Tensor, np.ndarray)) or type(value) in (int, float):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        out.append(list(value))
        for v in value:
            parts(v, out)
    elif isinstance(value, dict):
        out.append(value)
        for v in value.values():
            parts(v, out)
    return out


def same(a, b) -> bool:
    """Whether two values are the same answer (tensors within float tolerance)."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape or a.is_complex() or b.is_complex():
            return False
        if a.dtype == torch.bool or b.dtype == torch.bool:
            return a.dtype == b.dtype and bool(torch.equal(a, b))
        try:
            return bool(torch.allclose(a.double(), b.double(), atol=1e-5, rtol=1e-4, equal_nan=True))
        except RuntimeError:
            return False
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if type(a) in (int, float) and type(b) in (int, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return False


def trivial(answer, inputs: list) -> bool:
    """An answer any helper may produce by accident: tiny, constant, a small count, or one of the inputs."""
    if isinstance(answer, torch.Tensor):
        flat = answer.reshape(-1)
        if flat.numel() < 2 or bool((flat == flat[0]).all()):
            return True
    elif isinstance(answer, np.ndarray):
        if answer.size < 1:
            return True
    elif type(answer) is int:
        if abs(answer) < 1000:
            return True
    elif type(answer) is float:
        if not math.isfinite(answer) or (answer == int(answer) and abs(answer) < 1000):
            return True
    elif isinstance(answer, (list, dict)):
        leaves = [p for p in parts(answer, [])[1:] if not isinstance(p, (list, dict))]
        if len(answer) < 2 or len({repr(p) for p in leaves}) < 2:
            return True
    else:
        return True
    return any(same(answer, x) for x in inputs)


def answer_parts(value, args: tuple, kwargs: dict, after: tuple | None = None) -> list:
    """The answer's non-trivial parts, and the arguments a reference changed in place (its in-place answer)."""
    inputs = parts((args, kwargs), [])
    out = [p for p in parts(value, []) if not trivial(p, inputs)]
    if after is not None:
        out += [a for a, b in zip(after, args) if isinstance(a, torch.Tensor) and not same(a, b) and not trivial(a, inputs)]
    return out


def has_handle(value) -> bool:
    return isinstance(value, Handle) or any(isinstance(p, Handle) for p in _leaves(value))


def _leaves(value):
    if isinstance(value, (list, tuple)):
        for v in value:
            yield from _leaves(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    else:
        yield value


# -- the public checks' instances -----------------------------------------------------------------------------


class Spy(Live):
    """The reference, writing down every call of a graded function."""

    def __init__(self, module, chapter, names: set[str], seen: list[Instance]) -> None:
        super().__init__(module)
        self._chapter, self._names, self._seen = chapter, names, seen

    def __getattr__(self, name):
        attr = getattr(self._module, name)
        if name not in self._names or not callable(attr) or inspect.isclass(attr):
            return attr

        def call(*args, **kwargs):
            before = copy.deepcopy((args, kwargs))
            value = attr(*args, **kwargs)
            if not has_handle((before, value)):
                answers = answer_parts(value, *before, after=args)
                self._seen.append(Instance(self._chapter, name, *before, answers))
            return value

        return call


def instances(ch) -> list[Instance]:
    """Run the chapter's public checks on the reference, noting each graded call and each reference driver."""
    names = {n for t in ch.tasks for n in t.names}
    seen: list[Instance] = []
    run, reference = grader.authoring.trial.Trial._call, Live.drive

    def spy_run(self, target, label, args, kwargs, **control):
        before = copy.deepcopy((args, kwargs))
        call = run(self, target, label, args, kwargs, **control)
        if isinstance(target, str) and target in names and not has_handle((before, call.value)):
            seen.append(Instance(ch.id, target, *before, answer_parts(call.value, *before, after=tuple(call.args))))
        return call

    def spy_reference(self, driver, *args, **kwargs):
        before = copy.deepcopy((args, kwargs))
        value = reference(self, driver, *args, **kwargs)
        if not has_handle((before, value)):
            seen.append(Instance(ch.id, f"reference driver {driver.__name__}", *before, answer_parts(value, *before)))
        return value

    module = solutions_module(ch)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(grader.authoring.trial.Trial, "_call", spy_run)
        patch.setattr(Live, "drive", spy_reference)
        report = check(ch.id, solutions=True, hidden=False, figures_dir=None, refs=lambda key: Spy(module, ch.id, names, seen))
    assert all(r.status == "passed" for r in report.results), [(r.name, r.message) for r in report.results if r.status != "passed"]
    kept, count = [], {}
    for inst in seen:
        if inst.answers and count.get(inst.fn, 0) < PER_FUNCTION:
            count[inst.fn] = count.get(inst.fn, 0) + 1
            kept.append(inst)
    return kept


# -- calling shipped code on them -----------------------------------------------------------------------------


def call_forms(fn, inst: Instance, params: tuple[str, ...]) -> list[tuple[tuple, dict]]:
    """The ways `fn`'s signature can take the instance: as given, all positional in the graded function's
    parameter order, or by parameter name."""
    sig = inspect.signature(fn)
    forms = [(inst.args, inst.kwargs)]
    ordered = list(inst.args) + [inst.kwargs[p] for p in params[len(inst.args) :] if p in inst.kwargs]
    if inst.kwargs and len(ordered) == len(inst.args) + len(inst.kwargs):
        forms.append((tuple(ordered), {}))
    named = dict(zip(params, inst.args)) | inst.kwargs
    accepted = {k: v for k, v in named.items() if k in sig.parameters}
    if accepted and len(accepted) < len(named):
        forms.append(((), accepted))
    out = []
    for args, kwargs in forms:
        try:
            sig.bind(*args, **kwargs)
        except TypeError:
            continue
        out.append((args, kwargs))
    return out


class _Slow(Exception):
    pass


def _stop(*_):
    raise _Slow


def produces(fn, args: tuple, kwargs: dict, answers: list) -> bool:
    """Whether fn(*args, **kwargs) returns (or writes into its arguments) one of the answers.

    The call is made with warnings ignored: the scan hands every shipped function inputs meant for another
    (a tensor where a figure expects its record, so `r["x"]` indexes a tensor with a string and torch warns
    before it raises), and a warning made an error (pyproject's filterwarnings) must not stop a function that
    would have gone on to compute an answer."""
    mine = copy.deepcopy((args, kwargs))
    previous = signal.signal(signal.SIGALRM, _stop)
    signal.setitimer(signal.ITIMER_REAL, CALL_SECONDS)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            value = fn(*mine[0], **mine[1])
    except BaseException:
        return False
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    got = parts(value, []) + [a for a, b in zip(mine[0], args) if isinstance(a, torch.Tensor) and not same(a, b)]
    return any(same(g, w) for g in got for w in answers)


def answers_made_by_shipped_code(ch, functions) -> list[tuple[str, str]]:
    """(graded function or driver, shipped function) for every shipped function that reproduces an answer."""
    params = {n: p for t in ch.tasks for n, p in t.params.items()}
    found = set()
    cases = instances(ch)
    with as_in_a_release(), torch.no_grad():
        for inst in cases:
            for name, fn in functions:
                if (inst.fn, name) in found:
                    continue
                for args, kwargs in call_forms(fn, inst, params.get(inst.fn, ())):
                    if produces(fn, args, kwargs, inst.answers):
                        found.add((inst.fn, name))
                        break
    return sorted(found)


@pytest.fixture(scope="module")
def functions():
    return shipped_functions()


def test_the_scan_sees_the_shipped_code(functions):
    modules = {n.split(":")[0] for n, _ in functions}
    assert len(functions) > 300 and "grader.checks.ch22_explain:explain_flash" in {n for n, _ in functions}
    assert {"grader.checks.ch22_explain", "grader.checks.ch25_explain", "figures.ch22", "grader.lab.ch26"} <= modules


@pytest.mark.parametrize("ch", CHAPTERS, ids=[ch.id for ch in CHAPTERS])
def test_no_shipped_function_computes_an_answer(ch, functions):
    found = answers_made_by_shipped_code(ch, functions)
    assert not found, (
        f"{ch.id}: shipped code reproduces the reference's answers; move it to grader/hidden/ "
        f"(a hidden_model driver) or take the value from t.ref: {found}"
    )


def test_the_scan_finds_a_closed_form_answer(functions):
    """The scan can fail: a closed-form FlashAttention in a shipped module is caught."""
    from grader.hidden import ch22_models

    planted = [("grader.checks.ch22_explain:flash_model", ch22_models.flash_model)]
    found = answers_made_by_shipped_code(chapters.find("ch22"), planted)
    assert ("flash_attention", "grader.checks.ch22_explain:flash_model") in found
