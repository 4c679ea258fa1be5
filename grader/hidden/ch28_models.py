"""ch28's models of what a misconception hashes, for the explanations of its checks (never shipped).

`grader.checks.ch28` names each misconception and compares; the values come from here, through
`grader.authoring.hidden_model` drivers, so a student release holds only those of its fixed instances.
"""

from __future__ import annotations

import hashlib
import struct


def salt_everywhere(ref, token_ids: list[int], block_size: int, cache_salt: str) -> list[bytes]:
    """The chained block hashes with the salt in every block's extra keys, not in block 0's alone."""
    salt = cache_salt.encode("utf-8")
    extra = b"salt" + struct.pack("<I", len(salt)) + salt
    out, parent = [], ref.NONE_HASH
    for i in range(len(token_ids) // block_size):
        block = token_ids[i * block_size : (i + 1) * block_size]
        parent = hashlib.sha256(parent + struct.pack(f"<{len(block)}q", *block) + extra).digest()
        out.append(parent)
    return out
