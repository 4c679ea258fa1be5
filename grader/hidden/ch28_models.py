"""ch28's models of what a misconception hashes, for the explanations of its checks (never shipped).

`grader.checks.ch28` names each misconception and compares; the values come from here, through
`grader.authoring.hidden_model` drivers, so a student release holds only those of its fixed instances.
"""

from __future__ import annotations

import hashlib
import struct


def variant_hashes(ref, token_ids: list[int], block_size: int, keys: dict, *, chained: bool = True, salt_all: bool = False) -> list[bytes]:
    """The block hashes with the request's extra keys (`keys`: cache_salt, lora_id, mm_hashes, as block_hashes takes
    them), unchained (every parent NONE_HASH) or with the salt in every block: what those misreadings hash."""
    salt, lora, items = keys.get("cache_salt"), keys.get("lora_id"), keys.get("mm_hashes") or []
    out, parent = [], ref.NONE_HASH
    for i in range(len(token_ids) // block_size):
        s, e = i * block_size, (i + 1) * block_size
        extra = b"" if lora is None else b"lora" + struct.pack("<q", lora)
        for ident, offset, length in items:
            if offset < e and offset + length > s:
                name = ident.encode()
                extra += b"mm" + struct.pack("<I", len(name)) + name + struct.pack("<q", offset - s)
        if salt is not None and (i == 0 or salt_all):
            extra += b"salt" + struct.pack("<I", len(salt.encode())) + salt.encode()
        digest = hashlib.sha256((parent if chained else ref.NONE_HASH) + struct.pack(f"<{block_size}q", *token_ids[s:e]) + extra).digest()
        out.append(digest)
        parent = digest
    return out
