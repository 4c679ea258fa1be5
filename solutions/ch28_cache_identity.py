"""缓存身份与 logits 边界 · cache identity and the logits boundary

A prefix cache may hand a request the K/V of blocks another request computed only if
the two would have computed exactly the same values. Equal token ids are not enough:
the same tokens under another LoRA adapter give other K/V; two images behind the same
placeholder tokens give other K/V; and a tenant that must not share cache timing with
others sends its own `cache_salt`. vLLM v1 therefore hashes each *full* block as

    BlockHash_i = H(parent, tokens of block i, extra_keys_i),   parent = BlockHash_(i−1)

with NONE_HASH as the parent of block 0, and puts the identity into the extra keys
(`generate_block_hash_extra_keys` in `vllm/v1/core/kv_cache_utils.py`): the LoRA
adapter in every block, each multimodal item in the blocks it overlaps (with its
start relative to the block), the salt in block 0 only, and, in newer versions of the
file, for a request given as prompt embeddings rather than token ids, the SHA-256 of
each block's slice of the embeddings (`prompt_embeds`: the placeholder ids say nothing
about them). The course hashes the first three. Because every hash chains through its
parent, a key that changes one block changes that block's hash and every later one,
and never an earlier one: a salt in block 0 isolates the whole chain.

Two rules sit at the boundary between the cache and the sampler. A request must
compute at least its last token, or there would be no logits to sample from, so a
cache hit is capped at num_tokens − 1 tokens; hits come in whole blocks, so a prompt
that is entirely cached still recomputes its whole last block (32 tokens, block size
16: 16 cached, 16 recomputed). And in a flattened batch only one row per request
produces the logits that are sampled, its last scheduled token:
logits_indices = cu_seqlens_q[1:] − 1. vLLM computes them in `_prepare_inputs`
(`vllm/v1/worker/gpu_model_runner.py`); nano-vllm takes the same rows inside its LM
head, `ParallelLMHead.forward` (`nanovllm/layers/embed_head.py`), in a prefill only: a
decode step has one row per sequence and keeps them all.

缓存身份不止 token 子串:LoRA、多模态输入、cache_salt 都进入块 hash;命中上限是 num_tokens − 1,
按整块取整;每个请求只有最后一个被调度的 token 产生被采样的 logits。
"""

import hashlib
import pickle
import struct

import torch

NONE_HASH = hashlib.sha256(pickle.dumps("vllm-none-hash", protocol=5)).digest()
"""The parent of block 0, as vLLM computes it by default. `init_none_hash` in
`vllm/v1/core/kv_cache_utils.py` sets NONE_HASH = hash_fn(seed): the seed is PYTHONHASHSEED when it is set,
else the fixed string "vllm-none-hash" for the cryptographic hashes (sha256, sha256_cbor; random bytes for
xxhash, whose seed must stay secret), and the default hash_fn, `sha256` in `vllm/utils/hashing.py`, is SHA-256
of the *pickled* object (pickle protocol 5), not of the string's bytes. A fixed seed lets separate processes
agree on every hash and share a prefix cache. Earlier versions of kv_cache_utils.py drew NONE_HASH from
os.urandom(32) unless PYTHONHASHSEED was set, so no two processes agreed."""


def block_hashes(token_ids: list[int], block_size: int, *, cache_salt: str | None = None, lora_id: int | None = None,
                 mm_hashes: list[tuple[str, int, int]] | None = None) -> list[bytes]:
    """The chained hash of every full block of a request, identity keys included. Task ch28.1.

    Block i covers tokens s = i·block_size … e − 1 with e = s + block_size; only the
    len(token_ids) // block_size full blocks are hashed (a partial tail never is).

        hash_i = SHA-256(parent_i ‖ tokens_i ‖ extra_i).digest()        (32 bytes)

    - parent_0 = NONE_HASH, parent_i = hash_(i−1);
    - tokens_i: each token of the block as 8 bytes little-endian (int64);
    - extra_i: the block's identity keys, in vLLM's order, each as bytes:
        LoRA, in every block when lora_id is given: b"lora" + lora_id as 8 bytes little-endian;
        every multimodal item overlapping the block (offset < e and offset + length > s), in
            the given order: b"mm" + len(identifier) as 4 bytes little-endian + the identifier
            (UTF-8) + (offset − s) as 8 bytes little-endian signed (negative when the item
            began in an earlier block);
        the salt, in block 0 only: b"salt" + its length as 4 bytes little-endian + the salt (UTF-8).
      Lengths are of the UTF-8 bytes. Without keys, extra_i is empty.

    The course simplifies the encoding: vLLM's `hash_block_tokens` hashes a pickled (or
    CBOR) tuple (parent, tokens, extra_keys) with SHA-256, so its bytes differ, but which
    keys enter which block is vLLM's (`generate_block_hash_extra_keys`,
    `vllm/v1/core/kv_cache_utils.py`). The LoRA key is the adapter's integer id, as older
    versions of that file had it (`lora_int_id`; newer ones key on `lora_name`); a
    multimodal key carries its start relative to the block, as newer versions do (older
    ones used the identifier alone). Newer versions also add a `prompt_embeds` key,
    which the course leaves out.

    Args:
        token_ids: the request's token ids, ints ≥ 0.
        block_size: tokens per block (≥ 1).
        cache_salt: a non-empty string isolating this request's cache, or None.
        lora_id: the LoRA adapter's id (≥ 1), or None for the base model.
        mm_hashes: multimodal items as (identifier, offset, length): the item's content hash
            and the placeholder tokens it occupies, offset … offset + length − 1; sorted by
            offset, not overlapping, inside the prompt.

    Returns:
        list of len(token_ids) // block_size digests, 32 bytes each.

    Raises:
        ValueError: block_size < 1, a negative token id, an empty or non-string salt, a
            lora_id < 1, or a multimodal item that is malformed, outside the prompt,
            unsorted or overlapping another.

    Example:
        >>> h = block_hashes([1, 2, 3, 4, 5], 2)            # 2 full blocks; token 5 is not hashed
        >>> len(h), len(h[0])
        (2, 32)
        >>> block_hashes([1, 2, 3, 4, 5], 2, cache_salt="a")[1] != h[1]   # the salt reaches block 1 by the chain
        True
    """
    tokens, items = _checked_request(token_ids, block_size, cache_salt, lora_id, mm_hashes)
    ### BEGIN SOLUTION
    out, parent = [], NONE_HASH
    for i in range(len(tokens) // block_size):
        s, e = i * block_size, (i + 1) * block_size
        extra = b"" if lora_id is None else b"lora" + struct.pack("<q", lora_id)
        for ident, offset, length in items:
            if offset < e and offset + length > s:
                name = ident.encode()
                extra += b"mm" + struct.pack("<I", len(name)) + name + struct.pack("<q", offset - s)
        if i == 0 and cache_salt is not None:
            salt = cache_salt.encode()
            extra += b"salt" + struct.pack("<I", len(salt)) + salt
        parent = hashlib.sha256(parent + struct.pack(f"<{block_size}q", *tokens[s:e]) + extra).digest()
        out.append(parent)
    return out
    ### END SOLUTION


def num_cached_tokens_on_hit(prompt_len: int, block_size: int, num_hit_blocks: int) -> int:
    """Tokens taken from the prefix cache when a prompt's leading blocks hit. Task ch28.2.

    vLLM's get_computed_blocks caps the hit at max_cache_hit_length = num_tokens − 1,
    so at least the last token is computed and produces logits; hits come in whole
    blocks, so at most (prompt_len − 1) // block_size blocks are used:

        num_cached_tokens = min(num_hit_blocks, (prompt_len − 1) // block_size) · block_size

    A prompt whose every block is cached therefore recomputes its whole last block
    (32 tokens, block 16: 16 cached, 16 computed), unless it ends one token into a new
    block (33 tokens: 32 cached, 1 computed). nano-vllm's rule (never hit the last
    logical block) gives the same numbers.

    Args:
        prompt_len: tokens in the prompt (≥ 1).
        block_size: tokens per block (≥ 1).
        num_hit_blocks: leading full blocks whose hashes are in the cache
            (0 ≤ it ≤ prompt_len // block_size).

    Returns:
        int, a multiple of block_size, < prompt_len.

    Raises:
        ValueError: prompt_len < 1, block_size < 1, or num_hit_blocks outside
            [0, prompt_len // block_size].

    Example:
        >>> num_cached_tokens_on_hit(32, 16, 2), num_cached_tokens_on_hit(33, 16, 2)
        (16, 32)
    """
    _check_hit(prompt_len, block_size, num_hit_blocks)
    ### BEGIN SOLUTION
    return min(num_hit_blocks, (prompt_len - 1) // block_size) * block_size
    ### END SOLUTION


def logits_indices(query_lens: list[int] | torch.Tensor) -> torch.Tensor:
    """The rows of a flattened batch whose logits are sampled: each request's last token. Task ch28.3.

    Request r's scheduled tokens are rows cu_seqlens_q[r] … cu_seqlens_q[r + 1] − 1 of
    the flattened batch (cu_seqlens_q = [0, cumsum(query_lens)]), and only its last row
    is sampled, for a decode step as for a prefill chunk:

        logits_indices = cu_seqlens_q[1:] − 1

    This is vLLM's `_prepare_inputs` (`vllm/v1/worker/gpu_model_runner.py`) without
    speculative decoding; for a prefill chunk that does not end its prompt it samples a
    token too, and throws it away. nano-vllm selects the same rows in
    `ParallelLMHead.forward` (`nanovllm/layers/embed_head.py`), before the LM head and in
    a prefill only (a decode step has one row per sequence); its `prepare_sample` only
    gathers the temperatures.

    Args:
        query_lens: tokens scheduled for each of the B requests, each ≥ 1 (a list or a
            1-D integer tensor).

    Returns:
        int64 tensor [B].

    Raises:
        ValueError: query_lens not 1-D, or a length < 1.

    Example:
        >>> logits_indices([4, 1, 1])
        tensor([3, 4, 5])
    """
    q = _checked_lengths(query_lens)          # int64 [B]
    ### BEGIN SOLUTION
    return torch.cumsum(q, 0) - 1
    ### END SOLUTION


# -- provided: the input checks every task needs but none teaches (not part of the exercise) ----------------------

def _checked_request(token_ids: list[int], block_size: int, cache_salt: str | None, lora_id: int | None,
                     mm_hashes: list[tuple[str, int, int]] | None) -> tuple[list[int], list[tuple[str, int, int]]]:
    """Provided: the token ids as Python ints and the multimodal items as a list; raise ValueError for a
    block_size < 1, a negative token id, an empty or non-string salt, a lora_id < 1, or a multimodal item that is
    malformed, outside the prompt, unsorted or overlapping another."""
    if block_size < 1:
        raise ValueError(f"block_size must be ≥ 1, got {block_size}")
    tokens = [int(t) for t in token_ids]
    if any(t < 0 for t in tokens):
        raise ValueError(f"token ids must be ≥ 0, got {min(tokens)}")
    if cache_salt is not None and (not isinstance(cache_salt, str) or not cache_salt):
        raise ValueError(f"cache_salt must be a non-empty string if given, got {cache_salt!r}")
    if lora_id is not None and (not isinstance(lora_id, int) or lora_id < 1):
        raise ValueError(f"lora_id must be an int ≥ 1 (vLLM's LoRA ids start at 1), got {lora_id!r}")
    items = list(mm_hashes or [])
    end_prev = 0
    for item in items:
        if len(item) != 3 or not isinstance(item[0], str) or not item[0]:
            raise ValueError(f"a multimodal item is (identifier, offset, length); got {item!r}")
        _, offset, length = item
        if offset < end_prev or length < 1 or offset + length > len(tokens):
            raise ValueError(f"multimodal items must be sorted, non-overlapping and inside the {len(tokens)}-token "
                             f"prompt; got {item!r} after tokens up to {end_prev}")
        end_prev = offset + length
    return tokens, items


def _check_hit(prompt_len: int, block_size: int, num_hit_blocks: int) -> None:
    """Provided: raise ValueError unless prompt_len ≥ 1, block_size ≥ 1 and 0 ≤ num_hit_blocks ≤ the prompt's
    full blocks."""
    if prompt_len < 1 or block_size < 1:
        raise ValueError(f"need prompt_len ≥ 1 and block_size ≥ 1; got {prompt_len}, {block_size}")
    if not 0 <= num_hit_blocks <= prompt_len // block_size:
        raise ValueError(f"a {prompt_len}-token prompt has {prompt_len // block_size} full blocks of {block_size}; "
                         f"{num_hit_blocks} cannot hit")


def _checked_lengths(query_lens: list[int] | torch.Tensor) -> torch.Tensor:
    """Provided: query_lens as an int64 tensor [B]; raise ValueError unless it is 1-D with every length ≥ 1."""
    q = torch.as_tensor(query_lens, dtype=torch.int64)
    if q.dim() != 1:
        raise ValueError(f"query_lens must be 1-D (one length per request), got shape {list(q.shape)}")
    if q.numel() and int(q.min()) < 1:
        raise ValueError(f"every request in the batch has at least one scheduled token; got {q.tolist()}")
    return q
