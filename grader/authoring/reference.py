"""What a check's `t.ref` is: the reference solutions, or, in a student release, a replay
of the reference's answers to the public checks.

Checks call reference functions (`t.ref.slot_mapping(...)`), or run a driver of their
own over the reference module whose result is plain data (`t.ref.drive(driver, ...)`,
e.g. the state trace of a reference object under a script of operations).

The student release carries no solution code. `course release` runs every public
check against the reference once, with `Recorder` standing in for `t.ref`, and
stores each check's reference calls in order: the function, its result and any
argument it changed in place (plain data, `grader.isolation.wire`'s encoding). In the
release, `Replay` hands those results back in the same order. Public checks are
deterministic (fixed seeds), so the same calls come in the same order, except when
a wrong answer sends a check down an explanation path that consults the
reference on new inputs: that call was never recorded, and `ReplayMiss` (a
`CheckFailed`) fails the check with a shorter message.

Each recorded call also carries a digest of its function and inputs (`call_key`). The
lab, which draws instances of the student's choosing, looks its reference calls up by
that digest (`Lookup`): an instance some public check (or the lab's own default, recorded
with it) has asked about is compared with its recorded answer, any other raises `NoAnswer`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct
from types import ModuleType
from typing import Any, Callable

import numpy as np
import torch

from grader.authoring.compare import CheckFailed, same
from grader.chapters import ANSWERS
from grader.isolation import wire


class ReplayMiss(CheckFailed):
    """A public check asked the reference something the release did not record."""


class NoAnswer(Exception):
    """No answer to these inputs was recorded (the lab in a student release, on an instance of its own)."""


def call_key(name: str, args: tuple, kwargs: dict) -> str | None:
    """A digest of a call's function and its inputs' values (None when an input is not plain data).

    Tensors count by dtype, shape and values (a view and its contiguous copy are the same input);
    a list and a tuple of the same items are different inputs, as they are to a function."""
    h = hashlib.sha256(name.encode())

    def feed(tag: str, data: bytes = b"") -> None:
        h.update(tag.encode() + struct.pack("<Q", len(data)) + data)

    def walk(v: Any) -> bool:
        t = type(v)
        if v is None or t in (bool, int, float, str):
            feed(t.__name__, repr(v).encode())
        elif t in (list, tuple):
            feed(t.__name__, str(len(v)).encode())
            return all(walk(x) for x in v)
        elif t is dict:
            feed("dict", str(len(v)).encode())
            return all(walk(k) and walk(x) for k, x in v.items())
        elif isinstance(v, torch.Tensor) and v.layout == torch.strided and v.device.type == "cpu":
            feed("tensor", f"{v.dtype}{list(v.shape)}".encode())
            feed("data", v.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if v.numel() else b"")
        elif isinstance(v, np.ndarray) and v.dtype.kind != "O":
            feed("ndarray", f"{v.dtype}{list(v.shape)}".encode())
            feed("data", np.ascontiguousarray(v).tobytes())
        else:
            return False
        return True

    return h.hexdigest() if walk(args) and walk(kwargs) else None


def _pack(value: Any) -> dict:
    tree, buffers = wire.encode(value)
    return {"tree": tree, "buffers": [base64.b64encode(b).decode() for b in buffers]}


def _unpack(packed: dict) -> Any:
    return wire.decode(packed["tree"], [base64.b64decode(b) for b in packed["buffers"]])


class _Reference:
    """What every kind of `t.ref` offers beside the reference's functions."""

    def compute(self, label: str, thunk: Callable[[ModuleType], Any]) -> Any:
        raise NotImplementedError

    def drive(self, driver: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`driver(reference_module, *args, **kwargs)`: a check's own use of the reference whose result is plain
        data (a trace of a reference object, a hidden model's answer); a student release replays it."""
        return self.compute(driver.__name__, lambda module: driver(module, *args, **kwargs))


class Live(_Reference):
    """The reference module itself (the instructor's repository)."""

    def __init__(self, module: ModuleType) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)

    def compute(self, label: str, thunk: Callable[[ModuleType], Any]) -> Any:
        """Run a check's own driver of the reference (e.g. a trace of a reference object)."""
        return thunk(self._module)


class Recorder(_Reference):
    """The reference module, with every answer it gives written down."""

    def __init__(self, module: ModuleType) -> None:
        self._module = module
        self.calls: list[dict] = []

    def compute(self, label: str, thunk: Callable[[ModuleType], Any]) -> Any:
        value = thunk(self._module)
        self.calls.append({"fn": label, "value": _pack(value), "changed": {}})
        return value

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._module, name)
        if not callable(attr):
            raise AttributeError(f"checks read only functions from t.ref (the release replays calls); {name} is not one")

        def call(*args: Any, **kwargs: Any) -> Any:
            key = call_key(name, args, kwargs)
            before = [a.clone() if isinstance(a, torch.Tensor) else None for a in args]
            value = attr(*args, **kwargs)
            changed = {str(i): _pack(a) for i, (a, b) in enumerate(zip(args, before)) if b is not None and not same(a, b)}
            self.calls.append({"fn": name, "value": _pack(value), "changed": changed, "key": key})
            return value

        return call


class Replay(_Reference):
    """Answers a check's reference calls from a recording, in order."""

    def __init__(self, calls: list[dict]) -> None:
        self._calls, self._next = calls, 0

    def _take(self, name: str) -> dict:
        if self._next >= len(self._calls) or self._calls[self._next]["fn"] != name:
            raise ReplayMiss(
                "your answer differs from the expected one here; the step-by-step explanation "
                "needs the reference solution, which the student release does not carry "
                "(your graded feedback will have it)"
            )
        self._next += 1
        return self._calls[self._next - 1]

    def compute(self, label: str, thunk: Callable[[ModuleType], Any]) -> Any:
        return _unpack(self._take(label)["value"])

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            recorded = self._take(name)
            for i, packed in recorded["changed"].items():
                args[int(i)].copy_(_unpack(packed))
            return _unpack(recorded["value"])

        return call


class Lookup(_Reference):
    """Answers a reference call from any recorded call with the same function and inputs, whatever check
    recorded it; an unrecorded one raises `NoAnswer`. `answered` and `missed` count the calls."""

    def __init__(self, index: dict[str, dict]) -> None:
        self._index = index
        self.answered = self.missed = 0

    @staticmethod
    def index(answers: dict) -> dict[str, dict]:
        """{call key: recorded call} over every recorded call of a chapter (public checks and lab defaults)."""
        groups = [*answers.get("checks", {}).values(), *answers.get("lab", {}).values()]
        return {c["key"]: c for calls in groups for c in calls if c.get("key")}

    def compute(self, label: str, thunk: Callable[[ModuleType], Any]) -> Any:
        self.missed += 1
        raise NoAnswer(f"{label}: a check's own driver of the reference is not looked up")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)

        def call(*args: Any, **kwargs: Any) -> Any:
            recorded = self._index.get(call_key(name, args, kwargs) or "")
            if recorded is None or recorded["fn"] != name:
                self.missed += 1
                raise NoAnswer(f"no answer of {name} to these inputs was recorded")
            for i, packed in recorded["changed"].items():
                args[int(i)].copy_(_unpack(packed))
            self.answered += 1
            return _unpack(recorded["value"])

        return call


def load_answers(chapter_id: str) -> dict | None:
    """A release's record of a chapter: {"chapter": …, "checks": {key: calls}, "hidden": {task: count}}."""
    path = ANSWERS / f"{chapter_id}.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def factory(solutions: ModuleType | None, answers: dict | None) -> Callable[[str], Any]:
    """`check key -> t.ref`: the solutions module where present, else a replay of the answers."""
    if solutions is not None:
        live = Live(solutions)
        return lambda key: live
    if answers is not None:
        return lambda key: Replay(answers["checks"].get(key, []))
    return lambda key: None
