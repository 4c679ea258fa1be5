"""Frames on the private pipes between the grader and the student's process.

A frame is an 8-byte header length, a UTF-8 JSON header, an 8-byte buffer count,
then each buffer as an 8-byte length and its bytes (lengths big-endian). This
module needs no torch, so the grader can start the student's process before it
imports torch itself and the two imports overlap.
"""

from __future__ import annotations

import json
import os
import select
import struct
import time
from typing import Any

_LEN = struct.Struct(">Q")


class WireError(Exception):
    """A frame could not be read or does not decode to allowed data."""


class WireTimeout(WireError):
    """No complete frame arrived before the deadline."""


class WireClosed(WireError):
    """The other side closed the pipe (it exited or was killed)."""


def write_frame(fd: int, header: Any, buffers: list[bytes] = ()) -> None:
    """Write one frame to a pipe (blocking)."""
    head = json.dumps(header, separators=(",", ":")).encode()
    parts = [_LEN.pack(len(head)), head, _LEN.pack(len(buffers))]
    for b in buffers:
        parts += [_LEN.pack(len(b)), b]
    view = memoryview(b"".join(parts))
    while view:
        view = view[os.write(fd, view):]


def read_frame(fd: int, *, deadline: float | None = None, max_bytes: int = 1 << 30) -> tuple[Any, list[bytes]]:
    """Read one frame; raise WireTimeout after `deadline` (a time.monotonic value)."""

    def exactly(n: int) -> bytes:
        chunks, need = [], n
        while need:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([fd], [], [], left)[0]:
                    raise WireTimeout("no reply before the deadline")
            chunk = os.read(fd, min(need, 1 << 20))
            if not chunk:
                raise WireClosed("pipe closed")
            chunks.append(chunk)
            need -= len(chunk)
        return b"".join(chunks)

    total = 0

    def length() -> int:
        nonlocal total
        (n,) = _LEN.unpack(exactly(8))
        total += n
        if total > max_bytes:
            raise WireError(f"message larger than {max_bytes >> 20} MiB")
        return n

    try:
        header = json.loads(exactly(length()))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise WireError(f"unreadable header: {e}") from None
    (count,) = _LEN.unpack(exactly(8))
    if count > 1 << 16:
        raise WireError("too many buffers")
    return header, [exactly(length()) for _ in range(count)]
