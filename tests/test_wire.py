"""The wire format: plain data round-trips exactly; anything else stays behind as a handle;
malformed frames are refused."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from grader.authoring.compare import same
from grader.isolation import frames, wire, worker

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text() | st.binary()
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.tuples(inner, inner) | st.dictionaries(st.text(max_size=5) | st.integers(), inner, max_size=4)
    ),
    max_leaves=20,
)


def roundtrip(value, **kw):
    tree, buffers = wire.encode(value, **kw)
    r, w = os.pipe()
    try:
        frames.write_frame(w, tree, buffers)
        header, bufs = frames.read_frame(r)
    finally:
        os.close(r)
        os.close(w)
    return wire.decode(header, bufs)


@given(values)
def test_plain_values_roundtrip_exactly(value):
    assert same(roundtrip(value), value)


@pytest.mark.parametrize(
    "dtype", [torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32, torch.float64]
)
@pytest.mark.parametrize("shape", [(), (0,), (3,), (2, 0, 4), (2, 3, 4)])
def test_tensors_roundtrip_with_dtype_and_shape(dtype, shape):
    x = (torch.randn(shape) * 10).to(dtype)
    y = roundtrip(x)
    assert y.dtype == dtype and y.shape == x.shape and same(x, y)


def test_views_and_numpy_values_arrive_as_what_they_are():
    base = torch.arange(24.0).reshape(4, 6)
    for view in (base.t()[1:3], base[:, ::2], base[1:, 2:5].t(), base[:1].expand(3, 6)):
        got = roundtrip(view)
        assert same(got, view.contiguous()) and got.stride() == view.stride() and not got.is_contiguous()
    arr = np.array([(1, 2.5)], dtype=[("id", "<i8"), ("x", "<f4")])
    assert same(roundtrip(arr), arr)
    assert type(roundtrip(np.int64(7))) is np.int64


def test_other_objects_stay_behind_as_handles():
    class Anything:
        def __eq__(self, other):
            return True

    kept = {}
    handle = roundtrip([Anything()], keep=lambda o: kept.setdefault(id(o), o) and id(o))[0]
    assert isinstance(handle, wire.Handle) and handle.type_name == "Anything"
    with pytest.raises(wire.WireError):
        wire.encode(Anything())


@pytest.mark.parametrize(
    "tree",
    [
        {"$": "tensor", "dtype": "float32", "shape": [4], "buf": 0},
        {"$": "tensor", "dtype": "object", "shape": [1], "buf": 0},
        {"$": "tensor", "dtype": "float32", "shape": [-1], "buf": 0},
        {"$": "pickle", "buf": 0},
        {"$": "bytes", "buf": 7},
    ],
)
def test_malformed_values_are_refused(tree):
    with pytest.raises(wire.WireError):
        wire.decode(tree, [b"\x00" * 8])


def test_a_closed_pipe_and_a_silent_pipe_are_told_apart():
    r, w = os.pipe()
    with pytest.raises(frames.WireTimeout):
        import time

        frames.read_frame(r, deadline=time.monotonic() + 0.05)
    os.close(w)
    with pytest.raises(frames.WireClosed):
        frames.read_frame(r)
    os.close(r)


def test_oversized_frames_are_refused():
    r, w = os.pipe()
    frames.write_frame(w, {"x": "y" * 2000})
    with pytest.raises(frames.WireError, match="larger than"):
        frames.read_frame(r, max_bytes=1000)
    os.close(r)
    os.close(w)


def test_a_tensor_larger_than_the_reply_bound_is_refused_whatever_its_strides():
    """A stride-0 view of one element crosses as four bytes and stands for 4 GiB: the trusted side must never be
    handed it (a comparison or a hint would make it real). One at the bound still crosses, views included."""
    huge = {"$": "tensor", "dtype": "float32", "shape": [1 << 20, 1 << 10], "stride": [0, 0], "buf": 0}
    with pytest.raises(wire.WireError, match="larger than the 128 MiB"):
        wire.decode(huge, [bytearray(4)])
    tree, buffers = wire.encode(torch.zeros(1).expand(1 << 20, 1 << 10))
    with pytest.raises(wire.WireError, match="whatever its strides"):
        wire.decode(tree, buffers)
    n = wire.MAX_TENSOR_BYTES // 4
    tree, buffers = wire.encode(torch.ones(1).expand(n))
    assert wire.decode(tree, buffers).shape == (n,)
    assert wire.MAX_TENSOR_BYTES == worker.MAX_REPLY_BYTES, "no value may describe more than a whole reply may carry"
