"""ch25 · paged KV cache: wrong submissions get the teaching message they need, the block manager's
trace format round-trips, and the reference keeps nano-vllm's documented behaviour."""

from __future__ import annotations

import hashlib
import random
import struct

import pytest
from mutate import mutant_grader, result, wrong_elements

from grader.checks import ch25_blocks as traces
from grader.hidden import ch25 as hidden_checks
from solutions import ch25_paged_kv as ref

SEED = 11


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return mutant_grader(tmp_path_factory, "ch25", SEED)


# -- 25.1 and 25.2 ------------------------------------------------------------------------------------------
def test_slot_equal_to_position_is_explained(graded):
    report = graded("slot_is_position",
                    # the slot taken to be the token's position, as if the cache were one contiguous sequence
                    ("return table[logical] * block_size + pos % block_size", "return pos.clone()"), task="25.1")
    r = result(report, "figure instance")
    assert r.status == "failed"
    assert "token 0 is at position 0 → logical block 0 // 2 = 0" in r.message
    assert "block_table[0] = 3, so its slot is 3·2 + 0 = 6; yours: 0" in r.message
    assert "hint: the slot uses the physical block from the table, not the logical position" in r.message
    assert wrong_elements(report, "dim-slot-mapping")


def test_offset_dropped_in_store_is_explained(graded):
    report = graded("store_offset_dropped",
                    # every token written to the first row of its block: the offset inside the block forgotten
                    ("block, offset = s[keep] // block_size, s[keep] % block_size",
                     "block, offset = s[keep] // block_size, 0 * s[keep]"))
    r = result(report, "figure instance: the five tokens")
    assert r.status == "failed"
    assert "k_cache slot 0 (block 0, offset 0) should hold token 2's K [31, 32]; yours holds [41, 42]" in r.message
    assert wrong_elements(report, "dim-slot-mapping")


# -- 25.3 the block manager ---------------------------------------------------------------------------------
def test_lifo_free_list_is_explained(graded):
    report = graded("lifo",
                    # the free list used as a stack: new blocks taken from the right end
                    ("block_id = self.free_block_ids.popleft()", "block_id = self.free_block_ids.pop()"), task="25.3")
    r = result(report, "figure instance")
    assert r.status == "failed"
    assert "step 3 of 18: allocate(A, num_cached_blocks=0)" in r.message
    assert "A.block_table should be [0, 1, 2]; yours: [3, 2, 1]" in r.message
    assert "all 3 come from the head of the free list [0, 1, 2, 3]" in r.message
    assert "hint: the free list is a FIFO queue: take new blocks from its left end (popleft)" in r.message
    assert wrong_elements(report, "ch25-block-lifecycle")
    # its own answers are consistent: the invariants hold whatever order blocks are handed out in
    assert result(report, "invariants hold").status == "passed"


def test_freeing_head_first_is_explained(graded):
    report = graded("forward_free",
                    # deallocate walks the table from the first block: the shared prefix is evicted first
                    ("for block_id in seq.block_table[::-1]:", "for block_id in seq.block_table:"), task="25.3")
    r = result(report, "figure instance")
    assert r.status == "failed"
    assert "step 9 of 18: deallocate(A)" in r.message
    assert "the free list should be [2, 1]; yours: [1, 2]" in r.message
    assert "block 0: ref 2→1" in r.message
    assert "hint: free the tail first" in r.message
    assert wrong_elements(report, "ch25-block-lifecycle")


def test_zeroing_on_free_is_explained(graded):
    report = graded("zeroed_on_free",
                    # "free" taken to mean "wiped": the hash is dropped when a block is freed
                    ("        self.used_block_ids.discard(block_id)\n        self.free_block_ids.append(block_id)\n",
                     "        self.used_block_ids.discard(block_id)\n        self.free_block_ids.append(block_id)\n"
                     "        self.blocks[block_id].hash = NO_HASH\n"), task="25.3")
    r = result(report, "figure instance")
    assert r.status == "failed"
    assert "block 1's hash should be 0x" in r.message and "yours: none" in r.message
    assert "hint: freeing keeps the hash: a free block stays a cache candidate until it is reused" in r.message
    inv = result(report, "invariants hold")
    assert inv.status == "failed"
    assert "whose hash is none: every entry must point at a block carrying that hash" in inv.message
    assert wrong_elements(report, "ch25-block-lifecycle")


def test_last_block_hit_is_explained(graded):
    report = graded("last_block_hits",
                    # the walk over the hash chain includes the last logical block
                    ("for i in range(seq.num_blocks - 1):", "for i in range(seq.num_blocks):"), task="25.3")
    r = result(report, "nano-vllm's example")
    assert r.status == "failed"
    assert "can_allocate(C) should return 0" in r.message
    assert "logical block 0 is the last one: never a hit" in r.message
    assert "yours: 1" in r.message
    assert "hint: the last logical block never counts as a hit" in r.message
    full = result(report, "a chunked prefill")
    assert "can_allocate(E) should return 3" in full.message and "yours: 4" in full.message


def test_evicting_another_blocks_entry_is_explained(graded):
    report = graded("evict_any",
                    # on reuse, the map entry of the block's old hash is deleted even when it points elsewhere
                    ("if block.hash != NO_HASH and self.hash_to_block_id.get(block.hash) == block_id:",
                     "if block.hash in self.hash_to_block_id:"), task="25.3")
    r = result(report, "identical prompts")
    assert r.status == "failed"
    assert "step 13 of 16: allocate(C, num_cached_blocks=0)" in r.message
    assert "should be 2; yours: no entry" in r.message
    assert "the entry points to block 2, not to the reused block 0" in r.message
    assert "hint: on reuse, delete a map entry only if it still points to the block being reused" in r.message


def test_unchained_hash_is_explained(graded):
    report = graded("unchained",
                    # each block hashed on its own tokens: equal blocks after different prefixes would collide
                    ("            h = self.compute_hash(tokens, h)\n            block.hash, block.token_ids = h, tokens",
                     "            h = self.compute_hash(tokens)\n            block.hash, block.token_ids = h, tokens"),
                    task="25.3")
    r = result(report, "figure instance")
    want = ref.BlockManager.compute_hash([5, 6, 7, 8], ref.BlockManager.compute_hash([1, 2, 3, 4]))
    assert f"block 1's hash should be {traces.hx(want)}" in r.message
    assert f"yours: {traces.hx(ref.BlockManager.compute_hash([5, 6, 7, 8]))}" in r.message
    assert "hint: chain the hashes" in r.message


def test_free_cached_hit_costing_nothing_is_caught_under_pressure(graded):
    report = graded("free_hit_costless",
                    # every prefix hit assumed to save a block, also a hit on a block sitting in the free list
                    ("            if block_id in self.used_block_ids:\n                needed -= 1\n",
                     "            needed -= 1\n"), task="25.3")
    failed = [r for r in report.results if r.status != "passed"]
    assert failed and all(r.hidden for r in failed), "the public scripts never run out of blocks"
    assert any("hint: a hit on a free (cached) block still takes a block out of the free list" in r.message
               for r in failed)


# -- the trace machinery and the reference ----------------------------------------------------------------
def scripts() -> list[tuple[int, int, list]]:
    rnd = random.Random(7)
    out = []
    for num_blocks, bs, n in ((12, 4, 30), (20, 2, 20), (6, 16, 10)):
        requests = hidden_checks.workload(rnd, num_requests=n, block_size=bs, num_prefixes=3, max_new=8,
                                          max_len=num_blocks * bs, per_step=2)
        do = hidden_checks.reference_do(ref, num_blocks, bs)
        out.append((num_blocks, bs, hidden_checks.simulate(do, rnd.randrange(1000), bs, requests, 4, 20)))
    return out


def test_replayed_changes_rebuild_every_state():
    for num_blocks, bs, script in scripts():
        manager, seqs = ref.BlockManager(num_blocks, bs), {}
        walk = traces.states(script, ref.replay(num_blocks, bs, script), num_blocks)
        for op, (_, s) in zip(script, walk, strict=True):
            ref.run_op(manager, seqs, op)
            snap = ref.snapshot(manager)
            assert s["free"] == snap["free"] and s["used"] == snap["used"] and s["map"] == snap["map"]
            assert [(r, h) for r, h in zip(s["ref"], s["hash"])] == snap["blocks"]
            assert s["tables"][op[1]] == seqs[op[1]].block_table
            assert s["seqs"][op[1]] == seqs[op[1]].token_ids
            assert hidden_checks.broken_invariant(s, set(range(num_blocks)), op[1]) is None


def test_a_broken_invariant_is_named():
    num_blocks, bs, script = scripts()[0]
    for op, (_, s) in zip(script, traces.states(script, ref.replay(num_blocks, bs, script), num_blocks)):
        if any(s["ref"]):
            break
    used = next(b for b, r in enumerate(s["ref"]) if r > 0)
    s["ref"][used] += 1
    assert f"block {used} has ref_count" in hidden_checks.broken_invariant(s, set(range(num_blocks)), op[1])


def test_compute_hash_is_the_documented_blake2b():
    h0 = ref.BlockManager.compute_hash([1, 2, 3, 4])
    assert h0 == int.from_bytes(hashlib.blake2b(struct.pack("<4q", 1, 2, 3, 4), digest_size=8).digest(), "little")
    data = h0.to_bytes(8, "little") + struct.pack("<4q", 5, 6, 7, 8)
    assert ref.BlockManager.compute_hash([5, 6, 7, 8], h0) == int.from_bytes(
        hashlib.blake2b(data, digest_size=8).digest(), "little")


def test_nano_vllm_worked_example():
    # nanovllm.md §10: bs 4, 8 blocks; A = 1..10, then B shares A's first two blocks and C = [1, 2, 3, 4].
    m = ref.BlockManager(8, 4)
    a, b, c = (ref.Sequence(t, 4) for t in (list(range(1, 11)), [1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 13], [1, 2, 3, 4]))
    m.allocate(a, m.can_allocate(a))
    a.num_scheduled_tokens = 10
    m.hash_blocks(a)
    assert (m.can_allocate(b), m.can_allocate(c)) == (2, 0)
    m.allocate(b, 2)
    m.allocate(c, 0)
    assert (b.block_table, b.num_cached_tokens, c.block_table) == ([0, 1, 3], 8, [4])
    assert [m.blocks[i].ref_count for i in (0, 1, 3, 4)] == [2, 2, 1, 1]
    c.num_scheduled_tokens = 4
    m.hash_blocks(c)
    h = ref.BlockManager.compute_hash([1, 2, 3, 4])
    assert m.hash_to_block_id[h] == 4 and m.blocks[0].hash == h, "the later hash wins; block 0 is a duplicate"
    c.append_token(0)
    c.num_cached_tokens, c.num_scheduled_tokens = 4, 0
    m.may_append(c)
    m.deallocate(c)
    assert list(m.free_block_ids)[-2:] == [5, 4], "C frees 5, then 4"
