# ch25 exercises: replace each TODO with your code, then run `course check ch25`.
"""分页 KV 缓存 · paged KV cache

A paged KV cache stores every sequence's keys and values in fixed-size physical
blocks taken from one shared pool, the way an operating system pages memory. A
sequence keeps a *block table*: entry i is the physical block that holds its
logical block i, i.e. its tokens i·block_size … (i+1)·block_size − 1. The blocks
need not be contiguous or in order, so no sequence ever has to be copied when it
grows, and finished sequences return their blocks to the pool.

Inside the pool a token's place is its *slot*: the row of the flattened cache
`[num_blocks · block_size, num_kv_heads, head_dim]` that holds its K (and, in the
V cache, its V). nano-vllm (bb823b3) computes one slot per token being computed in
a step (its `slot_mapping`), writes the new K/V there before attention
(`store_kvcache`), and lets padding rows of a CUDA graph carry slot −1 so that they
write nothing.

Who hands out the blocks is the *block manager* (nano-vllm's `BlockManager`). It
keeps a FIFO free list, a reference count per block, and a *prefix cache*: every
block that has been filled and computed gets a hash of the whole prefix it
completes (a hash chain, h_i = H(h_{i−1} ‖ tokens of block i)), published in a map
from hash to block. A new request whose leading blocks hash to entries of the map
reuses those blocks instead of recomputing them, once it has compared the tokens
stored with each block to its own: a hash collision may cost a hit, never hand out
another prefix's K/V. A finished request's blocks go back
to the free list *with their hashes*: "free" means recyclable, not zeroed, and a
freed block can still be hit and revived until the allocator reuses it for other
tokens, which is the moment its stale map entry is evicted. The last logical block
of a prompt is never taken from the cache, so every request computes at least one
token and has logits to sample from.

在分页 KV 缓存中,逻辑上连续的序列由离散的物理块承载;slot = 物理块号 × block_size + 块内偏移。
块管理器用引用计数和前缀缓存(hash 链)管理物理块:free 是"可回收",不是"已清零",
被释放但仍带 hash 的块在被复用之前仍能被前缀命中而"复活"。
"""

import hashlib
import struct
import traceback
from collections import deque

import torch

PAD_SLOT = -1
"""The slot of a padding row: store_kv writes nothing for it (nano-vllm's convention)."""


def slot_mapping(block_table: list[int], positions: list[int] | torch.Tensor, block_size: int) -> torch.Tensor:
    """Physical KV-cache slot of each token position. Task ch25.1.

    A token at position p lives in logical block p // block_size, at offset
    p % block_size inside it. The block table turns the logical block into a
    physical one, and the slot is that block's first row plus the offset:

        slot = block_table[p // block_size] · block_size + p % block_size

    Args:
        block_table: physical block id of each logical block of the sequence.
        positions: int positions [N] of the tokens to place (any order; a chunk
            of a long prompt need not start at 0).
        block_size: tokens per block (> 0).

    Returns:
        int64 tensor [N] of slots. (nano-vllm keeps slots as int32 on the GPU;
        the course uses int64 like every other index tensor.)

    Raises:
        ValueError: yours to raise: a position whose logical block is beyond the
            end of the block table (no block was allocated for it). The provided
            `_check_slots` (already called) raises it for block_size ≤ 0 and a
            negative position.

    Example:
        >>> slot_mapping([3, 0, 4], [0, 1, 2, 3, 4], 2)
        tensor([6, 7, 0, 1, 8])
    """
    _check_slots(positions, block_size)
    # TODO(ch25.1): your code here (about 8 lines)
    raise NotImplementedError("ch25.1 slot_mapping: not implemented yet (about 8 lines)")


def store_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slots: list[int] | torch.Tensor) -> None:
    """Write each token's K and V into its slot of the paged caches, in place. Task ch25.2.

    Token i goes to block slots[i] // block_size, offset slots[i] % block_size.
    A slot of −1 (`PAD_SLOT`) marks a padding row: nothing is written for it.
    Every other cache entry is left exactly as it was. The caches may be views
    of one bigger pool, not contiguous (vLLM slices each layer's K and V out of
    one allocation, and some backends permute the layout): write into the
    tensors given, since a reshape of such a view is a copy.

    Args:
        k_cache: [num_blocks, block_size, num_kv_heads, head_dim], written in place.
        v_cache: same shape as k_cache, written in place.
        k: [N, num_kv_heads, head_dim] keys of the N tokens (cast to the cache dtype).
        v: [N, num_kv_heads, head_dim] values.
        slots: [N] slot of each token, or −1.

    Returns:
        None: the caches themselves are the result.

    Raises:
        ValueError: from the provided `_check_store` (already called): k/v not
            shaped [N, num_kv_heads, head_dim] like the cache, a slots length other
            than N, or a slot outside [−1, num_blocks·block_size).

    Example:
        >>> k_cache = torch.zeros(3, 2, 1, 1); v_cache = torch.zeros(3, 2, 1, 1)
        >>> k = torch.tensor([[[1.]], [[2.]]]); v = 10 * k
        >>> store_kv(k_cache, v_cache, k, v, [5, -1])
        >>> k_cache.flatten().tolist()
        [0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    """
    _check_store(k_cache, v_cache, k, v, slots)
    # TODO(ch25.2): your code here (about 6 lines)
    raise NotImplementedError("ch25.2 store_kv: not implemented yet (about 6 lines)")


NO_HASH = -1
"""The hash of a block that has none (nano-vllm's sentinel; real hashes are never negative)."""


class Block:
    """One physical block's bookkeeping, as nano-vllm keeps it (provided).

    Attributes:
        block_id: its index in the pool, 0 … num_blocks − 1.
        ref_count: how many block tables hold it; 0 while it is free.
        hash: the chain hash of the prefix this block completes, or `NO_HASH` (−1)
            while it is not (yet) hashed.
        token_ids: the block's tokens, stored with the hash (a hit compares them, so a
            hash collision can never hand out the wrong tokens); [] while not hashed.

    A block is in one of four states (nano-vllm bb823b3):

        FREE-CLEAN     ref 0,  no hash,  in the free list
        FREE-CACHED    ref 0,  hash,     in the free list, usually findable in the map
        FILLING        ref ≥ 1, no hash, in use (its last token not computed yet)
        HASHED/SHARED  ref ≥ 1, hash,    in use (ref > 1: several tables share it)
    """

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.hash = NO_HASH
        self.token_ids: list[int] = []


class Sequence:
    """A request as the block manager sees it: its tokens and its block table (provided).

    A trimmed copy of nano-vllm's `Sequence`. The scheduler (chapter 24's exercise)
    owns the step counters; in this chapter `run_op` plays its part.

    Args:
        token_ids: the prompt, a non-empty list of ints (copied).
        block_size: tokens per block, the block manager's (nano-vllm keeps it as a
            class attribute set from the config; the course passes it in).

    Attributes:
        block_size: as given.
        token_ids: prompt and generated tokens so far; num_tokens = len(token_ids).
        num_prompt_tokens: the prompt's length.
        num_cached_tokens: leading tokens whose K/V is in the cache. `allocate` sets it to
            the prefix-cache hit (a multiple of block_size), every step adds the tokens it
            computed, `deallocate` resets it to 0. While a sequence decodes it is
            num_tokens − 1: the newest sampled token is not cached yet.
        num_scheduled_tokens: the tokens being computed in the current step (0 between steps).
        block_table: physical block ids of its logical blocks, in order.

    Raises:
        ValueError: an empty prompt or block_size < 1.
    """

    def __init__(self, token_ids: list[int], block_size: int) -> None:
        if not token_ids or block_size < 1:
            raise ValueError(f"a sequence needs at least one token and block_size ≥ 1; got {len(token_ids)} "
                             f"tokens, block_size {block_size}")
        self.token_ids = list(token_ids)
        self.block_size = block_size
        self.num_tokens = len(self.token_ids)
        self.num_prompt_tokens = self.num_tokens
        self.num_cached_tokens = 0
        self.num_scheduled_tokens = 0
        self.block_table: list[int] = []

    def __len__(self) -> int:
        return self.num_tokens

    @property
    def num_blocks(self) -> int:
        """Logical blocks needed for all tokens so far: ceil(num_tokens / block_size)."""
        return (self.num_tokens + self.block_size - 1) // self.block_size

    def block(self, i: int) -> list[int]:
        """The tokens of logical block i (the last one may be partial)."""
        if not 0 <= i < self.num_blocks:
            raise IndexError(f"logical block {i} of a sequence with {self.num_blocks} blocks")
        return self.token_ids[i * self.block_size:(i + 1) * self.block_size]

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
        self.num_tokens += 1


class BlockManager:
    """Physical KV blocks: a FIFO free list, reference counts and a prefix cache. Task ch25.3.

    nano-vllm bb823b3's `BlockManager`, method for method. The grader reads these
    attributes (keep their names and types):

        block_size: tokens per block.
        blocks: list[Block], one per physical block.
        free_block_ids: collections.deque of free block ids, all 0 … num_blocks − 1 at
            the start, in order; blocks are taken from the left and returned on the right.
        used_block_ids: set of the ids with ref_count ≥ 1.
        hash_to_block_id: dict from a block hash to the block that holds it.

    The rules, all of them visible in the grader's trace:
    - Taking a free block (`_allocate_block`) pops the leftmost id. If that block still
      carries a hash and the map entry of that hash points to *this* block, the entry
      is deleted (eviction: its old tokens are about to be overwritten); an entry that
      points to another block is left alone. Then ref_count = 1, hash = −1, tokens [].
    - Freeing (ref_count reaching 0) appends the id on the right and keeps hash, tokens
      and map entry: the block stays a cache candidate until it is taken again.
    - Only full, computed blocks are hashed, by `hash_blocks` after the step that
      computed their last token; a new hash overwrites the map entry of an equal one.
    - A prefix hit never includes the last logical block of the sequence.

    Args:
        num_blocks: physical blocks in the pool (≥ 1).
        block_size: tokens per block (≥ 2: "len % block_size == 1" must be able to mark
            a new block; nano-vllm requires a multiple of 256).

    Raises:
        ValueError: num_blocks < 1 or block_size < 2 (the provided `_check_pool`,
            already called in __init__).

    Example:
        >>> m = BlockManager(8, 4); a = Sequence(list(range(1, 11)), 4)
        >>> m.can_allocate(a), m.allocate(a, 0), a.block_table
        (0, None, [0, 1, 2])
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        _check_pool(num_blocks, block_size)
        # TODO(ch25.3): your code here (about 4 of the task's 62 lines, in 10 places)
        raise NotImplementedError("ch25.3 BlockManager: not implemented yet (about 62 lines)")

    @staticmethod
    def compute_hash(token_ids: list[int], prefix: int = NO_HASH) -> int:
        """The chain hash of one block: H(prefix ‖ its tokens), an unsigned 64-bit int.

        Bytes hashed: the prefix as 8 bytes little-endian (unsigned), left out when
        prefix is −1 (the first block); then every token as 8 bytes little-endian
        (int64). H is BLAKE2b with an 8-byte digest (hashlib.blake2b(data,
        digest_size=8)), whose digest is read as a little-endian unsigned int. nano-vllm
        uses xxhash's xxh64 (seed 0, intdigest) over the same bytes; the course uses the
        standard library so nothing needs installing.

        Args:
            token_ids: the block's tokens.
            prefix: the previous block's hash, or −1 for the first block.

        Returns:
            int in [0, 2**64).

        Example:
            >>> h0 = BlockManager.compute_hash([1, 2, 3, 4])
            >>> h1 = BlockManager.compute_hash([5, 6, 7, 8], h0)   # covers tokens 1 … 8
        """
        # TODO(ch25.3): your code here (about 3 of the task's 62 lines, in 10 places)
        raise NotImplementedError("ch25.3 BlockManager: not implemented yet (about 62 lines)")

    def _allocate_block(self) -> int:
        """Take the block at the head of the free list for new tokens; return its id.

        Evicts the block's old map entry if the entry still points to it, resets the
        block (ref_count 1, no hash, no tokens) and marks it used.
        """
        # TODO(ch25.3): your code here (about 7 of the task's 62 lines, in 10 places)
        raise NotImplementedError("ch25.3 BlockManager: not implemented yet (about 62 lines)")

    def _deallocate_block(self, block_id: int) -> None:
        """Return a block whose ref_count just reached 0 to the right end of the free list
        (its hash, tokens and map entry stay)."""
        # TODO(ch25.3): your code here (about 2 of the task's 62 lines, in 10 places)
        raise NotImplementedError("ch25.3 BlockManager: not implemented yet (about 62 lines)")

    def can_allocate(self, seq: Sequence) -> int:
        """How many leading blocks of a new sequence hit the cache, or −1 if it does not fit.

        Walks the logical blocks 0 … seq.num_blocks − 2 (never the last one), chaining
        the hash, and stops at the first block whose hash is not in the map or whose
        mapped block holds other tokens. A hit on a block in use costs nothing; every
        other logical block, a hit on a free (cached) block included, needs a block
        from the free list.

        The token comparison is what makes a hash collision harmless (nano-vllm's
        `self.blocks[block_id].token_ids != token_ids`): a 64-bit hash practically
        never collides, so the grader also replays a script with compute_hash
        replaced by the weak `colliding_hash`, where different blocks do.

        Args:
            seq: a sequence without a block table.

        Returns:
            num_cached_blocks ≥ 0 when enough blocks are free, else −1.

        Example:
            >>> m = BlockManager(8, 4); a = Sequence([1, 2, 3, 4, 5], 4)
            >>> m.can_allocate(a)      # nothing cached yet
            0
        """
        # TODO(ch25.3): your code here (about 11 of the task's 62 lines, in 10 places)
        raise NotImplementedError("ch25.3 BlockManager: not implemented yet (about 62 lines)")

    def allocate(self, seq: Sequence, num_cached_blocks: int) -> None:
        """Give a new sequence its whole block table: the cached prefix, then new blocks.

        The first num_cached_blocks logical blocks (can_allocate's answer) are looked up
        through the hash chain: a block in use gets ref_count + 1; a free one is revived
        (taken out of the free list, ref_count 1, hash kept). The other logical blocks,
        up to seq.num_blocks, get `_allocate_block()`. Sets seq.num_cached_tokens to
        num_cached_blocks · block_size. Hashes nothing.

        Args:
            seq: a sequence without a block table.
            num_cached_blocks: the value can_allocate returned (0 ≤ it < seq.num_blocks).

        Raises:
            ValueError: seq already has a block table, or num_cached_blocks is out of
                range (the provided `_check_allocate`, already called).

        Example:
            >>> m = BlockManager(8, 4); a = Sequence([1, 2, 3, 4, 5], 4)
            >>> m.allocate(a, 0); a.block_table, a.num_cached_tokens
            ([0, 1], 0)
        """
        _check_allocate(seq, num_cached_blocks)
        # TODO(ch25.3): your code here (about 15 of the task's 62 lines, in 10 places)
        raise NotImplementedError("ch25.3 BlockManager: not implemented yet (about 62 lines)")

    def deallocate(self, seq: Sequence) -> None:
        """Release a finished or preempted sequence's blocks, tail first.

        Walks the block table in reverse: each block's ref_count drops by 1, and a block
        reaching 0 is freed (appended to the free list, hash kept). Freeing the tail
        first puts it nearer the head of the free list, so it is reused before the
        prefix blocks that other requests are likelier to hit. Then the table is
        cleared and num_cached_tokens is 0.

        Args:
            seq: a sequence holding blocks.

        Example:
            >>> m = BlockManager(4, 4); a = Sequence([1, 2, 3, 4, 5], 4); m.allocate(a, 0)
            >>> m.deallocate(a); list(m.free_block_ids)
            [2, 3, 1, 0]
        """
        # TODO(ch25.3): your code here (about 7 of the task's 62 lines, in 10 places)
        raise NotImplementedError("ch25.3 BlockManager: not implemented yet (about 62 lines)")

    def can_append(self, seq: Sequence) -> bool:
        """Whether a decoding sequence can get the block its next step may need.

        Called when a decode step is scheduled. len(seq) already counts the newest
        sampled token, which is not cached yet; when len(seq) % block_size == 1 that
        token starts a new block, so one free block is needed, otherwise none.

        Example:
            >>> m = BlockManager(1, 4); a = Sequence([1, 2, 3, 4, 5], 4)
            >>> m.can_append(a)         # token 5 starts block 1: one free block needed
            True
        """
        # TODO(ch25.3): your code here (about 2 of the task's 62 lines, in 10 places)
        raise NotImplementedError("ch25.3 BlockManager: not implemented yet (about 62 lines)")

    def may_append(self, seq: Sequence) -> None:
        """Append a new block to a decoding sequence's table when its newest token starts one
        (len(seq) % block_size == 1). Hashes nothing."""
        # TODO(ch25.3): your code here (about 2 of the task's 62 lines, in 10 places)
        raise NotImplementedError("ch25.3 BlockManager: not implemented yet (about 62 lines)")

    def hash_blocks(self, seq: Sequence) -> None:
        """Hash and publish the blocks that this step's computed tokens completed.

        Called after a step, before num_cached_tokens advances: the step computed
        tokens num_cached_tokens … num_cached_tokens + num_scheduled_tokens − 1, which
        complete logical blocks start … end − 1 with start = num_cached_tokens //
        block_size and end = (num_cached_tokens + num_scheduled_tokens) // block_size.
        Each gets h = compute_hash(its tokens, hash of the previous logical block, or −1
        for block 0), stored with its tokens on the physical block, and
        hash_to_block_id[h] = its id (overwriting an entry for an equal hash).

        Args:
            seq: a sequence with num_scheduled_tokens set for the step just computed.

        Example:
            >>> m = BlockManager(8, 4); a = Sequence(list(range(1, 11)), 4); m.allocate(a, 0)
            >>> a.num_scheduled_tokens = 10; m.hash_blocks(a)      # blocks 0 and 1 are full
            >>> [b.hash != -1 for b in m.blocks[:3]]
            [True, True, False]
        """
        # TODO(ch25.3): your code here (about 9 of the task's 62 lines, in 10 places)
        raise NotImplementedError("ch25.3 BlockManager: not implemented yet (about 62 lines)")


def run_op(manager: BlockManager, seqs: dict[str, Sequence], op: list) -> object:
    """Apply one operation of a script to the manager (provided; the grader's driver).

    `seqs` maps names to the sequences made so far. Operations, as lists:

        ["add", name, token_ids]      a new request: seqs[name] = Sequence(token_ids, manager.block_size)
        ["can_allocate", name]        returns manager.can_allocate(seq)
        ["allocate", name, n]         manager.allocate(seq, n)
        ["compute", name, n, token]   a step computed n tokens of seq; the scheduler's side of it
                                      (nano-vllm's postprocess): num_scheduled_tokens = n,
                                      manager.hash_blocks(seq), num_cached_tokens += n,
                                      num_scheduled_tokens = 0, and append the sampled `token`
                                      unless it is None (an unfinished prefill chunk discards it)
        ["can_append", name]          returns manager.can_append(seq)
        ["may_append", name]          manager.may_append(seq)
        ["deallocate", name]          manager.deallocate(seq) (the request finished or was preempted)

    Returns:
        The method's value (None for those that return nothing).
    """
    kind, name = op[0], op[1]
    if kind == "add":
        seqs[name] = Sequence(op[2], manager.block_size)
        return None
    seq = seqs[name]
    if kind == "compute":
        seq.num_scheduled_tokens = op[2]
        manager.hash_blocks(seq)
        seq.num_cached_tokens += op[2]
        seq.num_scheduled_tokens = 0
        if op[3] is not None:
            seq.append_token(op[3])
        return None
    if kind == "allocate":
        return manager.allocate(seq, op[2])
    if kind in ("can_allocate", "can_append", "may_append", "deallocate"):
        return getattr(manager, kind)(seq)
    raise ValueError(f"unknown operation {op!r}")


def snapshot(manager: BlockManager) -> dict:
    """The manager's observable state as plain data (provided; what the grader compares).

    Returns:
        {"free": the free list in order, "used": sorted used ids, "blocks": (ref_count, hash)
         per block (hash −1 for none), "map": dict hash → block id}
    """
    return {"free": list(manager.free_block_ids), "used": sorted(manager.used_block_ids),
            "blocks": [(b.ref_count, b.hash) for b in manager.blocks], "map": dict(manager.hash_to_block_id)}


class ScriptRunner:
    """A fresh BlockManager driven by operations, recording what each one changed (provided).

    This is how the grader drives your manager: every operation (see `run_op`) is
    followed by a record of its value, its sequence's block_table and num_cached_tokens,
    and what changed in `snapshot`, as compact differences:
        "free_removed", "free_appended": ids that left the free list, ids appended on the
            right (or "free": the whole new list when the change is not of that form);
        "used_added", "used_removed": ids that entered / left used_block_ids;
        "blocks": {id: [ref_count, hash, token_ids]} for the blocks whose ref_count or hash
            changed (token_ids [] unless hashed);
        "map": {hash: block id, or None when the entry was deleted}.
    An operation that raises ends the run with the record {"error": …, "where": …}.

    Args:
        num_blocks, block_size: the BlockManager to make.
        weak_hash: if True, BlockManager.compute_hash is `colliding_hash` while `run` runs (restored
            afterwards), so different blocks share hashes: a hit must still compare the tokens stored with the
            block (the grader's collision test).
    """

    def __init__(self, num_blocks: int, block_size: int, weak_hash: bool = False) -> None:
        self.weak_hash = weak_hash
        self.manager = BlockManager(num_blocks, block_size)
        self.seqs: dict[str, Sequence] = {}
        self.before = snapshot(self.manager)

    def run(self, ops: list[list]) -> list[dict]:
        """Apply the operations in order; one record per operation carried out."""
        trace: list[dict] = []
        strong = BlockManager.__dict__["compute_hash"]
        if self.weak_hash:
            setattr(BlockManager, "compute_hash", staticmethod(colliding_hash))
        try:
            for op in ops:
                try:
                    value = run_op(self.manager, self.seqs, op)
                    seq = self.seqs[op[1]]
                    record = {"value": value, "table": list(seq.block_table), "cached": seq.num_cached_tokens}
                    self._changes(snapshot(self.manager), record)
                except NotImplementedError:
                    raise
                except Exception as e:  # noqa: BLE001 (the grader reports it with the step that raised)
                    frames = traceback.extract_tb(e.__traceback__)
                    where = f"line {frames[-1].lineno} in {frames[-1].name}: {frames[-1].line}" if frames else ""
                    trace.append({"error": f"{type(e).__name__}: {e}", "where": where})
                    break
                trace.append(record)
        finally:
            setattr(BlockManager, "compute_hash", strong)
        return trace

    def _changes(self, after: dict, record: dict) -> None:
        before, self.before = self.before, after
        if after["free"] != before["free"]:
            gone = set(before["free"]) - set(after["free"])
            kept = [b for b in before["free"] if b not in gone]
            if after["free"][:len(kept)] == kept:
                record["free_removed"], record["free_appended"] = sorted(gone), after["free"][len(kept):]
            else:
                record["free"] = after["free"]
        if after["used"] != before["used"]:
            record["used_added"] = sorted(set(after["used"]) - set(before["used"]))
            record["used_removed"] = sorted(set(before["used"]) - set(after["used"]))
        if after["blocks"] != before["blocks"]:
            record["blocks"] = {i: [r, h, list(self.manager.blocks[i].token_ids) if h != NO_HASH else []]
                                for i, ((r, h), old) in enumerate(zip(after["blocks"], before["blocks"]))
                                if (r, h) != old}
        if after["map"] != before["map"]:
            new, old = after["map"], before["map"]
            record["map"] = {h: b for h, b in new.items() if old.get(h) != b}
            record["map"].update({h: None for h in old if h not in new})


def colliding_hash(token_ids: list[int], prefix: int = NO_HASH) -> int:
    """A deliberately weak stand-in for compute_hash (provided; the grader's collision test): the prefix (0 for −1)
    plus the sum of the block's tokens, so a block's hash is the sum of every token up to its end.

    Example:
        >>> colliding_hash([1, 2, 3, 4]), colliding_hash([4, 3, 2, 1]), colliding_hash([5, 6], 10)
        (10, 10, 21)
    """
    return (0 if prefix == NO_HASH else prefix) + sum(token_ids)


def replay(num_blocks: int, block_size: int, script: list[list], weak_hash: bool = False) -> list[dict]:
    """Run a whole script on a fresh BlockManager (provided): ScriptRunner(num_blocks, block_size,
    weak_hash).run(script). With weak_hash=True the run hashes with `colliding_hash`.

    Try it: replay(4, 4, [["add", "A", [1, 2, 3, 4, 5]], ["can_allocate", "A"], ["allocate", "A", 0]]).
    """
    return ScriptRunner(num_blocks, block_size, weak_hash).run(script)


# -- provided: the input checks every task needs but none teaches (not part of the exercise) ----------------------

def _check_slots(positions: list[int] | torch.Tensor, block_size: int) -> None:
    """Provided: raise ValueError for a block_size ≤ 0 or a negative position."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    given = torch.as_tensor(positions, dtype=torch.int64)
    if given.numel() and int(given.min()) < 0:
        raise ValueError(f"positions must be non-negative, got {int(given.min())}")


def _check_store(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 slots: list[int] | torch.Tensor) -> None:
    """Provided: raise ValueError unless both caches have one shape, k and v are [N, num_kv_heads, head_dim] like
    them, there is one slot per token and every slot lies in [−1, num_blocks · block_size)."""
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"k_cache {list(k_cache.shape)} and v_cache {list(v_cache.shape)} differ in shape")
    for name, x in (("k", k), ("v", v)):
        if x.dim() != 3 or x.shape[1:] != k_cache.shape[2:]:
            raise ValueError(f"{name} must be [N, {k_cache.shape[2]}, {k_cache.shape[3]}] "
                             f"(tokens, kv heads, head_dim) like the cache; got {list(x.shape)}")
    slot_ids = torch.as_tensor(slots).to(torch.int64)
    if slot_ids.shape != (k.shape[0],) or v.shape[0] != k.shape[0]:
        raise ValueError(f"need one slot per token: {k.shape[0]} keys, {v.shape[0]} values, {slot_ids.numel()} slots")
    num_slots = k_cache.shape[0] * k_cache.shape[1]
    if slot_ids.numel() and (int(slot_ids.min()) < PAD_SLOT or int(slot_ids.max()) >= num_slots):
        raise ValueError(f"slots must lie in [-1, {num_slots}); got {slot_ids.tolist()}")


def _check_pool(num_blocks: int, block_size: int) -> None:
    """Provided: raise ValueError for num_blocks < 1 or block_size < 2."""
    if num_blocks < 1 or block_size < 2:
        raise ValueError(f"need num_blocks ≥ 1 and block_size ≥ 2; got {num_blocks} blocks of {block_size}")


def _check_allocate(seq: Sequence, num_cached_blocks: int) -> None:
    """Provided: raise ValueError if seq already holds a block table or num_cached_blocks is outside
    [0, seq.num_blocks) (the last block never hits)."""
    if seq.block_table:
        raise ValueError(f"the sequence already has a block table {seq.block_table}: deallocate it first")
    if not 0 <= num_cached_blocks < seq.num_blocks:
        raise ValueError(f"num_cached_blocks must lie in [0, {seq.num_blocks}) (the last block never hits); "
                         f"got {num_cached_blocks}")
