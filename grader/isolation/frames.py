"""Frames on the private pipes between the grader and the student's process.

A frame is an 8-byte header length, a UTF-8 JSON header, an 8-byte buffer count,
then each buffer as an 8-byte length and its bytes (lengths big-endian). This
module needs no torch, so the grader can start the student's process before it
imports torch itself and the two imports overlap.

Both directions have deadlines and bounds: a write that the other side does not
drain in time raises `WireTimeout` (a stopped child cannot hang the grader), a
length over the reader's bound is refused before a byte of it is read, and each
buffer is read straight into its own `bytearray` and written from a memoryview,
so a value of N bytes costs N bytes on each side, once.
"""

from __future__ import annotations

import json
import os
import select
import struct
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

_LEN = struct.Struct(">Q")
MAX_HEADER = 8 << 20
"""Bytes of JSON a header may have (values travel as buffers; the tree of a value is small)."""
MAX_BUFFERS = 1 << 16


class WireError(Exception):
    """A frame could not be read or does not decode to allowed data."""


class WireTimeout(WireError):
    """No complete frame arrived (or could be sent) before the deadline."""


class WireClosed(WireError):
    """The other side closed the pipe (it exited or was killed)."""


class FrameTooLarge(WireError):
    """The other side announced more bytes than the reader accepts."""


def write_frame(fd: int, header: Any, buffers: Sequence[bytes | bytearray | memoryview] = (), *, deadline: float | None = None) -> None:
    """Write one frame; with a `deadline` (a time.monotonic value) the pipe must take it in time.

    Buffers may be bytes, bytearrays or memoryviews; they are written as they are, never joined.
    """
    head = json.dumps(header, separators=(",", ":")).encode()
    parts: list = [_LEN.pack(len(head)) + head + _LEN.pack(len(buffers))]
    for b in buffers:
        view = memoryview(b).cast("B")
        parts += [_LEN.pack(view.nbytes), view]
    blocking = deadline is None
    if not blocking:
        os.set_blocking(fd, False)
    try:
        for part in parts:
            view = memoryview(part)
            while view.nbytes:
                if deadline is not None:  # not blocking
                    left = deadline - time.monotonic()
                    if left <= 0 or not select.select([], [fd], [], left)[1]:
                        raise WireTimeout("the other side did not read in time")
                try:
                    view = view[os.write(fd, view[: 1 << 20]) :]
                except BlockingIOError:
                    continue
                except (BrokenPipeError, ConnectionResetError):
                    raise WireClosed("pipe closed") from None
    finally:
        if not blocking:
            try:
                os.set_blocking(fd, True)
            except OSError:
                pass


def read_frame(fd: int, *, deadline: float | None = None, max_bytes: int = 1 << 30) -> tuple[Any, list[bytearray]]:
    """Read one frame; raise WireTimeout after `deadline`, FrameTooLarge past `max_bytes` in all."""

    def wait() -> None:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise WireTimeout("no reply before the deadline")

    def into(buf: bytearray) -> bytearray:
        view, got = memoryview(buf), 0
        while got < len(buf):
            wait()
            if hasattr(os, "readv"):
                n = os.readv(fd, [view[got:]])
            else:  # Windows: no readv; read a piece and copy it in
                chunk = os.read(fd, min(len(buf) - got, 1 << 20))
                n = len(chunk)
                view[got : got + n] = chunk
            if not n:
                raise WireClosed("pipe closed")
            got += n
        return buf

    total = 0

    def length(bound: int) -> int:
        nonlocal total
        (n,) = _LEN.unpack(into(bytearray(8)))
        total += n
        if n > bound or total > max_bytes:
            raise FrameTooLarge(f"message larger than {min(bound, max_bytes) >> 20} MiB")
        return n

    raw = into(bytearray(length(MAX_HEADER)))
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise WireError(f"unreadable header: {type(e).__name__}") from None
    (count,) = _LEN.unpack(into(bytearray(8)))
    if count > MAX_BUFFERS:
        raise WireError("too many buffers")
    return header, [into(bytearray(length(max_bytes))) for _ in range(count)]
