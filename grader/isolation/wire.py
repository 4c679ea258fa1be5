"""Values on the wire between the grader and the process that runs student code.

A value becomes a JSON-able tree plus raw byte buffers (sent as one frame, see
`grader.isolation.frames`); nothing is pickled, so a value coming back from student code
can only ever decode to plain data: None, bool, int, float, str, bytes, list,
tuple, dict, torch tensors, numpy arrays and scalars. Anything else stays in the
student's process and crosses as a `Handle` naming its type.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch

from grader.isolation.frames import WireError

if TYPE_CHECKING:
    from collections.abc import Sequence

MAX_DEPTH = 64
MAX_NODES = 2_000_000
"""Parts (numbers, strings, lists, ...) a decoded value may have: decoding stays within a budget."""
MAX_TENSOR_BYTES = 128 << 20
"""Bytes a decoded tensor may describe (elements × item size), whatever its strides: a view with a stride of 0
crosses as a few bytes and could stand for gigabytes that any later work on it (a comparison, a hint) would
make real in the trusted process. Equal to the bound on a whole reply (`grader.isolation.worker.MAX_REPLY_BYTES`)."""


@dataclass(frozen=True)
class Handle:
    """An object that stayed in the student's process; `type_name` says what it is."""

    id: int
    type_name: str

    def __repr__(self) -> str:
        return f"<{self.type_name} object>"


def encode(value: Any, keep: Callable[[Any], int] | None = None) -> tuple[Any, list[bytes | memoryview]]:
    """Turn `value` into a JSON-able tree and a list of buffers.

    `keep` stores a value that is not plain data and returns its handle id;
    without it such a value is an error.
    """
    buffers: list[bytes | memoryview] = []

    def walk(v: Any, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise WireError(f"value nested deeper than {MAX_DEPTH} levels")
        t = type(v)
        if v is None or t is bool or t is str:
            return v
        if t is int:
            return v if -(2**63) <= v < 2**63 else {"$": "bigint", "v": str(v)}
        if t is float:
            return v if v == v and abs(v) != float("inf") else {"$": "float", "v": repr(v)}
        if t is list:
            return [walk(x, depth + 1) for x in v]
        if t is tuple:
            return {"$": "tuple", "items": [walk(x, depth + 1) for x in v]}
        if t is dict:
            return {"$": "dict", "items": [[walk(k, depth + 1), walk(x, depth + 1)] for k, x in v.items()]}
        if t is bytes:
            buffers.append(v)
            return {"$": "bytes", "buf": len(buffers) - 1}
        if isinstance(v, Handle):
            return {"$": "handle", "id": v.id, "type": v.type_name}
        if isinstance(v, torch.Tensor) and v.layout == torch.strided and v.device.type == "cpu":
            node: dict[str, Any] = {"$": "tensor", "dtype": str(v.dtype).removeprefix("torch."), "shape": list(v.shape), "cls": t.__name__}
            v = v.detach()
            if v.is_contiguous() or v.numel() == 0 or min(v.stride(), default=0) < 0:
                flat = v.contiguous().reshape(-1)
            else:  # a strided view crosses as a view: the storage span it reads, and its strides
                span = 1 + sum((n - 1) * st for n, st in zip(v.shape, v.stride()))
                flat = torch.as_strided(v, (span,), (1,), v.storage_offset())
                node["stride"] = list(v.stride())
            buffers.append(memoryview(flat.contiguous().view(torch.uint8).numpy()) if flat.numel() else b"")
            node["buf"] = len(buffers) - 1
            return node
        if isinstance(v, (np.ndarray, np.generic)) and np.asarray(v).dtype.kind != "O":
            out = io.BytesIO()
            np.save(out, np.asarray(v), allow_pickle=False)
            buffers.append(out.getvalue())
            return {"$": "ndarray" if isinstance(v, np.ndarray) else "npscalar", "buf": len(buffers) - 1}
        if keep is None:
            raise WireError(f"cannot send a value of type {t.__name__}")
        return {"$": "handle", "id": keep(v), "type": t.__name__}

    return walk(value, 0), buffers


def decode(tree: Any, buffers: Sequence[bytes | bytearray], resolve: Callable[[int], Any] | None = None) -> Any:
    """Rebuild a value from `encode`'s output, accepting only the allowed types.

    `resolve` maps handle ids back to objects (the student's side); without it
    handles decode to `Handle` (the grader's side).
    """

    def buf(i: Any) -> bytes | bytearray:
        if type(i) is not int or not 0 <= i < len(buffers):
            raise WireError("bad buffer index")
        return buffers[i]

    nodes = 0

    def walk(n: Any, depth: int) -> Any:
        nonlocal nodes
        nodes += 1
        if depth > MAX_DEPTH:
            raise WireError("value nested too deeply")
        if nodes > MAX_NODES:
            raise WireError(f"value has more than {MAX_NODES:,} parts")
        if n is None or type(n) in (bool, int, float, str):
            return n
        if type(n) is list:
            return [walk(x, depth + 1) for x in n]
        if type(n) is not dict:
            raise WireError(f"unexpected node {type(n).__name__}")
        tag = n.get("$")
        if tag == "tuple":
            return tuple(walk(x, depth + 1) for x in n["items"])
        if tag == "dict":
            return {_hashable(walk(k, depth + 1)): walk(x, depth + 1) for k, x in n["items"]}
        if tag == "bigint":
            return int(n["v"])
        if tag == "float":
            return float(n["v"])
        if tag == "bytes":
            return bytes(buf(n["buf"]))
        if tag == "tensor":
            return _tensor(n, buf(n["buf"]))
        if tag in ("ndarray", "npscalar"):
            arr = np.load(io.BytesIO(buf(n["buf"])), allow_pickle=False)
            return arr if tag == "ndarray" else arr[()]
        if tag == "handle":
            if resolve is not None:
                return resolve(int(n["id"]))
            return Handle(int(n["id"]), str(n.get("type", "object")))
        raise WireError(f"unknown tag {tag!r}")

    return walk(tree, 0)


def _hashable(key: Any) -> Any:
    try:
        hash(key)
    except TypeError:
        raise WireError("dict key is not hashable") from None
    return key


_DTYPES: dict[Any, torch.dtype] = {
    name: getattr(torch, name)
    for name in ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64", "complex64", "complex128")
}


def _tensor(node: dict, data: bytes | bytearray) -> torch.Tensor:
    dtype = _DTYPES.get(node.get("dtype"))
    shape = node.get("shape")
    if dtype is None or type(shape) is not list or not all(type(s) is int and s >= 0 for s in shape):
        raise WireError("bad tensor header")
    numel = 1
    for s in shape:
        numel *= s
    itemsize = torch.empty((), dtype=dtype).element_size()
    if numel * itemsize > MAX_TENSOR_BYTES:
        raise WireError(
            f"a tensor of shape {shape} ({numel:,} elements, {numel * itemsize / 2**20:,.0f} MiB) is larger than the "
            f"{MAX_TENSOR_BYTES >> 20} MiB any value may be, whatever its strides"
        )
    stride = node.get("stride")
    if stride is not None:
        if type(stride) is not list or len(stride) != len(shape) or not all(type(s) is int and s >= 0 for s in stride):
            raise WireError("bad tensor strides")
        span = 1 + sum((n - 1) * st for n, st in zip(shape, stride))
        if numel == 0 or len(data) != span * itemsize:
            raise WireError("tensor data does not match its strides")
        return torch.as_strided(torch.frombuffer(_writable(data), dtype=dtype), shape, stride)
    if len(data) != numel * itemsize:
        raise WireError("tensor data does not match its shape")
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(_writable(data), dtype=dtype).reshape(shape)


def _writable(data: bytes | bytearray) -> bytearray:
    """The buffer itself when it is a bytearray (frames reads each buffer into its own): no copy."""
    return data if type(data) is bytearray else bytearray(data)
