"""ch25 · paged KV cache: wrong submissions get the teaching message they need, the block manager's
trace format round-trips, and the reference keeps nano-vllm's documented behaviour."""

from __future__ import annotations

import hashlib
import random
import re
import struct

import pytest
import torch
from mutate import figure, hints, mutant_grader, result, wrong_elements

from figures.kit import text_width
from grader.authoring import CheckFailed
from grader.authoring.misconceptions import table
from grader.checks import ch25 as public_checks
from grader.checks import ch25_explain as traces
from grader.hidden import ch25 as hidden_checks
from grader.hidden.ch25_models import slot_variants
from solutions import ch25_paged_kv as ref

SEED = 11
SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return mutant_grader(tmp_path_factory, "ch25", SEED)


# -- 25.1 and 25.2 ------------------------------------------------------------------------------------------
SLOT_IDS = [m.id for m in table("ch25") if m.task == "ch25.1"]


def test_slot_equal_to_position_is_explained(graded):
    # the slot taken to be the token's position, as if the cache were one contiguous sequence
    report = graded.mistake("slot_is_position", task="ch25.1")
    r = result(report, "figure instance")
    assert r.status == "failed"
    assert "token 0 is at position 0 → logical block 0 // 2 = 0" in r.message
    assert "block_table[0] = 3, so its slot is 3·2 + 0 = 6; yours: 0" in r.message
    assert r.hints == ["slot_is_position"]
    assert wrong_elements(report, "ch25-dim-slot-mapping")


def test_every_slot_misconception_is_a_row_of_the_table():
    assert set(SLOT_IDS) == set(public_checks.slot_misconceptions())
    assert set(SLOT_IDS) == set(slot_variants(ref, [3, 0, 4], [0, 1, 2, 3, 4], 2))


@pytest.mark.parametrize("mistake", SLOT_IDS)
def test_a_slot_misconception_gets_its_own_hint_and_no_other(graded, mistake):
    report = graded.mistake(mistake, task="ch25.1")
    figure = result(report, "figure instance")
    formula, _ = public_checks.slot_misconceptions()[mistake]
    assert figure.status == "failed"
    assert f"each of your 5 slots is {formula.format(bs=2)}" in figure.message and figure.hints == [mistake]
    for r in report.results:
        assert r.hints in ([], [mistake]), (r.name, r.hints)
    assert wrong_elements(report, "ch25-dim-slot-mapping")


def test_a_slot_fitting_two_misconceptions_gets_no_hint(graded):
    # a decode step at position 0: slot 0 is both "the position" and "block × offset"
    table, positions = [19], [0]
    variants = slot_variants(None, table, positions, 256)
    with pytest.raises(CheckFailed) as e:
        public_checks.expect_slots(torch.tensor([0]), ref.slot_mapping(table, positions, 256), table, positions, 256, variants)
    assert "yours: 0" in str(e.value) and e.value.hints == [] and "hint:" not in str(e.value) and "slots is" not in str(e.value)
    # the hidden check of decode steps goes on to a length whose slot tells the two apart
    decode = result(graded.mistake("block_times_offset", task="ch25.1"), "the decode step")
    assert decode.status == "failed" and decode.hints == ["block_times_offset"]


def test_a_written_padding_row_is_explained_and_only_then(graded):
    r = result(graded.mistake("padding_written", task="ch25.2"), "a padding row")
    assert r.status == "failed" and r.hints == ["padding_written"]
    dropped = graded(
        "store_offset_dropped",
        ("block, offset = s[keep] // block_size, s[keep] % block_size", "block, offset = s[keep] // block_size, 0 * s[keep]"),
    )
    assert "padding_written" not in hints(dropped)


STORE_INDEXED = "    k_cache[block, offset] = k[keep].to(k_cache.dtype)\n    v_cache[block, offset] = v[keep].to(v_cache.dtype)\n"


def test_writing_through_a_reshaped_copy_loses_points_on_pool_views(graded):
    report = graded.mistake("reshape_copy", task="ch25.2")  # k_cache.reshape(-1, H, D)[slots] = k
    r = result(report, "caches that are views of one pool")
    assert r.status == "failed" and r.hints == ["reshape_copy"]
    assert "K = pool[:, 0] and V = pool[:, 1] of one pool" in r.message and "left both caches exactly as they were" in r.message
    assert result(report, "figure instance: the five tokens").status == "passed", "a fresh cache reshapes to a view"
    assert result(report, "random pools").status == "failed"


@pytest.mark.parametrize(
    "write",
    [
        "    k_cache.index_put_((block, offset), k[keep].to(k_cache.dtype))\n"
        "    v_cache.index_put_((block, offset), v[keep].to(v_cache.dtype))\n",
        "    for i, (b, o) in enumerate(zip(block.tolist(), offset.tolist())):\n"
        "        k_cache[b, o], v_cache[b, o] = k[keep][i], v[keep][i]\n",
    ],
)
def test_writes_into_the_given_views_keep_every_point(graded, write):
    report = graded(f"store {write[:20]}", (STORE_INDEXED, write), task="ch25.2")
    failed = [f"{r.name}: {r.message}" for r in report.results if r.status != "passed"]
    assert not failed, failed


def _crossings(lines: list[tuple[float, float, float, float]]) -> int:
    """Pairs of segments that cross (not merely touch)."""

    def side(ax, ay, bx, by, px, py):
        return (bx - ax) * (py - ay) - (by - ay) * (px - ax)

    n = 0
    for i, (a, b, c, d) in enumerate(lines):
        for e, g, h, k in lines[i + 1 :]:
            if side(a, b, c, d, e, g) * side(a, b, c, d, h, k) < 0 and side(e, g, h, k, a, b) * side(e, g, h, k, c, d) < 0:
                n += 1
    return n


def test_blocks_figure_draws_one_arrow_per_block_and_marks_the_cells_yours_fill_wrongly(graded):
    # slot = block · offset: wrong slots, many of them on the same slot
    report = graded.mistake("block_times_offset")
    r = report.records["ch25-blocks"]
    table, slots, want = r["table"], r["slots"], r["expected"]
    root = figure(report, "ch25-blocks")
    arrows = [tuple(float(el.get(k)) for k in ("x1", "y1", "x2", "y2")) for el in root.iter(f"{SVG}line") if el.get("class") == "arrow"]
    # a token follows its logical block's arrow: one per logical block, crossing only where the table is out of order
    assert len(arrows) == len(table)
    inversions = sum(a > b for i, a in enumerate(table) for b in table[i + 1 :])
    assert _crossings(arrows) == inversions < len(slots)
    # the pool cells that hold other positions than they should, plus the slots of the slot row that differ
    pool = range(r["num_blocks"] * r["block_size"])
    held = lambda ss: {s: sorted(p for p, t in enumerate(ss) if t == s) for s in pool}
    mine, right = held(slots), held(want)
    bad_cells = sum(mine[s] != right[s] for s in mine) + sum(a != b for a, b in zip(slots, want))
    assert len([el for el in root.iter(f"{SVG}rect") if el.get("class") == "cell wrong"]) == bad_cells


def test_slot_mapping_figure_agrees_with_itself_when_only_the_slots_are_wrong(graded):
    # wrong slots, right store_kv: the pool holds what store_kv wrote at the right slots, and the arrows go there
    report = graded.mistake("block_times_offset")
    r = report.records["ch25-dim-slot-mapping"]
    assert r["slots"] != r["expected"] and r["pool"] == r["pool_expected"]
    root = figure(report, "ch25-dim-slot-mapping")
    texts = list(root.iter(f"{SVG}text"))
    slot_labels = [el for el in texts if re.fullmatch(r"slot \d+", el.text or "")]
    slot_x = {int(el.text.split()[1]): float(el.get("x")) for el in slot_labels}
    label_y = min(float(el.get("y")) for el in slot_labels)
    k_at = {
        float(el.get("x")): el.text
        for el in texts  # the K values in the pool's cells, above their labels
        if el.get("class") == "value" and label_y - 40 < float(el.get("y")) < label_y
    }
    ends = [float(el.get("d").split()[-1].split(",")[0]) for el in root.iter(f"{SVG}path") if el.get("class") == "arrow"]
    assert len(ends) == len(r["expected"])
    for j, (end, s) in enumerate(zip(ends, r["expected"])):
        assert abs(end - slot_x[s]) < 0.5, "the arrow of each token goes to its slot"
        assert k_at[slot_x[s]] == ", ".join(f"{v:g}" for v in r["keys"][j]), "and that slot holds its K"
    tags = {(el.text, float(el.get("x"))) for el in texts if el.get("class") == "mark slot-tag"}
    assert tags == {(f"✗ t{j}", slot_x[s]) for j, (s, w) in enumerate(zip(r["slots"], r["expected"])) if s != w and s in slot_x}


def test_offset_dropped_in_store_is_explained(graded):
    report = graded(
        "store_offset_dropped",
        # every token written to the first row of its block: the offset inside the block forgotten
        ("block, offset = s[keep] // block_size, s[keep] % block_size", "block, offset = s[keep] // block_size, 0 * s[keep]"),
    )
    r = result(report, "figure instance: the five tokens")
    assert r.status == "failed"
    assert "k_cache slot 0 (block 0, offset 0) should hold token 2's K [31, 32]; yours holds [41, 42]" in r.message
    assert wrong_elements(report, "ch25-dim-slot-mapping")


# -- 25.3 the block manager ---------------------------------------------------------------------------------
def test_lifo_free_list_is_explained(graded):
    report = graded.mistake("lifo", task="ch25.3")  # the free list used as a stack: new blocks taken from the right
    r = result(report, "figure instance")
    assert r.status == "failed"
    assert "step 3 of 18: allocate(A, num_cached_blocks=0)" in r.message
    assert "A.block_table should be [0, 1, 2]; yours: [3, 2, 1]" in r.message
    assert "all 3 come from the head of the free list [0, 1, 2, 3]" in r.message
    assert r.hints == ["lifo"]
    assert wrong_elements(report, "ch25-block-lifecycle")
    # every panel's title stays inside its panel, 10 px from the border
    elements = list(figure(report, "ch25-block-lifecycle").iter())
    panels = [el for el in elements if el.get("class") == "panel"]
    titles = [el for el in elements if el.get("class") == "label panel-title"]
    assert len(panels) == len(titles) == 6
    for panel, title in zip(panels, titles):
        right = float(panel.get("x")) + float(panel.get("width"))
        width = text_width(title.text, float(title.get("font-size")), bold=True)
        assert float(title.get("x")) + width <= right - 10 + 1e-6, title.text
    # its own answers are consistent: the invariants hold whatever order blocks are handed out in
    assert result(report, "invariants hold").status == "passed"


def test_freeing_head_first_is_explained(graded):
    report = graded.mistake("forward_free", task="ch25.3")  # deallocate walks the table from its first block
    r = result(report, "figure instance")
    assert r.status == "failed"
    assert "step 9 of 18: deallocate(A)" in r.message
    assert "the free list should be [2, 1]; yours: [1, 2]" in r.message
    assert "block 0: ref 2→1" in r.message
    assert r.hints == ["forward_free"]
    assert wrong_elements(report, "ch25-block-lifecycle")


def test_zeroing_on_free_is_explained(graded):
    report = graded.mistake("zeroed_on_free", task="ch25.3")  # "free" taken to mean "wiped": the hash dropped
    r = result(report, "figure instance")
    assert r.status == "failed"
    assert "block 1's hash should be 0x" in r.message and "yours: none" in r.message
    assert r.hints == ["zeroed_on_free"]
    inv = result(report, "invariants hold")
    assert inv.status == "failed"
    assert "whose hash is none: every entry must point at a block carrying that hash" in inv.message
    assert wrong_elements(report, "ch25-block-lifecycle")


def test_last_block_hit_is_explained(graded):
    report = graded.mistake("last_block_hits", task="ch25.3")  # the walk includes the last logical block
    r = result(report, "nano-vllm's example")
    assert r.status == "failed"
    assert "can_allocate(C) should return 0" in r.message
    assert "logical block 0 is the last one: never a hit" in r.message
    assert "yours: 1" in r.message
    assert r.hints == ["last_block_hits"]
    full = result(report, "a chunked prefill")
    assert "can_allocate(E) should return 3" in full.message and "yours: 4" in full.message


def test_evicting_another_blocks_entry_is_explained(graded):
    # on reuse, the map entry of the block's old hash is deleted even when it points elsewhere
    report = graded.mistake("evict_any", task="ch25.3")
    r = result(report, "identical prompts")
    assert r.status == "failed"
    assert "step 13 of 16: allocate(C, num_cached_blocks=0)" in r.message
    assert "should be 2; yours: no entry" in r.message
    assert "the entry points to block 2, not to the reused block 0" in r.message
    assert r.hints == ["evict_any"]


def test_unchained_hash_is_explained(graded):
    report = graded.mistake("unchained", task="ch25.3")  # each block hashed on its own tokens
    r = result(report, "figure instance")
    want = ref.BlockManager.compute_hash([5, 6, 7, 8], ref.BlockManager.compute_hash([1, 2, 3, 4]))
    assert f"block 1's hash should be {traces.hx(want)}" in r.message
    assert f"yours: {traces.hx(ref.BlockManager.compute_hash([5, 6, 7, 8]))}" in r.message
    assert r.hints == ["unchained"]


def test_free_cached_hit_costing_nothing_is_caught_under_pressure(graded):
    # every prefix hit assumed to save a block, also a hit on a block sitting in the free list
    report = graded.mistake("free_hit_costless", task="ch25.3")
    failed = [r for r in report.results if r.status != "passed"]
    assert failed and all(r.hidden for r in failed), "the public scripts never run out of blocks"
    assert "free_hit_costless" in hints(report)


# -- the trace machinery and the reference ----------------------------------------------------------------
def scripts(weak_hash: bool = False) -> list[tuple[int, int, list]]:
    rnd = random.Random(7)
    out = []
    for num_blocks, bs, n in ((12, 4, 30), (20, 2, 20), (6, 16, 10)):
        requests = hidden_checks.workload(
            rnd,
            num_requests=n,
            block_size=bs,
            num_prefixes=3,
            max_new=8,
            max_len=num_blocks * bs,
            per_step=2,
            shuffle=0.5 if weak_hash else 0.0,
        )
        do = hidden_checks.reference_do(ref, num_blocks, bs, weak_hash)
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
            assert hidden_checks.broken_invariant(s, set(range(num_blocks)), op[1], bs) is None


def test_a_broken_invariant_is_named():
    num_blocks, bs, script = scripts()[0]
    for op, (_, s) in zip(script, traces.states(script, ref.replay(num_blocks, bs, script), num_blocks)):
        if any(s["ref"]):
            break
    used = next(b for b, r in enumerate(s["ref"]) if r > 0)
    s["ref"][used] += 1
    assert f"block {used} has ref_count" in hidden_checks.broken_invariant(s, set(range(num_blocks)), op[1], bs)


def test_compute_hash_is_the_documented_blake2b():
    h0 = ref.BlockManager.compute_hash([1, 2, 3, 4])
    assert h0 == int.from_bytes(hashlib.blake2b(struct.pack("<4q", 1, 2, 3, 4), digest_size=8).digest(), "little")
    data = h0.to_bytes(8, "little") + struct.pack("<4q", 5, 6, 7, 8)
    assert ref.BlockManager.compute_hash([5, 6, 7, 8], h0) == int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


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


# -- 25.3: each hint only for the mistake it names ----------------------------------------------------------
def test_a_decode_block_from_the_wrong_end_is_not_called_a_timing_mistake(graded):
    report = graded(
        "may_append_from_the_right",
        # may_append takes the new block from the right end of the free list; allocate is right
        (
            "        if len(seq) % self.block_size == 1:\n            seq.block_table.append(",
            "        if len(seq) % self.block_size == 1:\n            self.free_block_ids.rotate(1)\n            seq.block_table.append(",
        ),
        task="ch25.3",
    )
    assert "lifo" in hints(report) and "may_append_on_full_block" not in hints(report)


def test_a_decode_block_at_the_wrong_length_is_a_timing_mistake(graded):
    # the new block appended when the last one is full, one token too early
    named = hints(graded.mistake("may_append_on_full_block", task="ch25.3"))
    assert "may_append_on_full_block" in named and "lifo" not in named


def test_an_older_entry_kept_is_told_the_later_hash_wins(graded):
    # an equal hash already in the map keeps its older block
    named = hints(graded.mistake("first_hash_wins", task="ch25.3"))
    assert "first_hash_wins" in named and not named & {"map_entry_dropped_on_free", "evict_any"}


def test_entries_dropped_on_free_are_told_deallocate_keeps_them(graded):
    # freeing a block also deletes the map entry of its hash
    named = hints(graded.mistake("map_entry_dropped_on_free", task="ch25.3"))
    assert "map_entry_dropped_on_free" in named and not named & {"first_hash_wins", "zeroed_on_free"}


def test_a_shared_hit_counted_as_a_new_block_is_explained(graded):
    # a hit on a block in use still counted among the blocks to take from the free list
    named = hints(graded.mistake("shared_hit_costs_a_block", task="ch25.3"))
    assert "shared_hit_costs_a_block" in named and "free_hit_costless" not in named


def test_a_step_that_raises_is_reported_with_what_it_did(graded):
    # allocate raises when it is handed the cached prefix: the step is described, then what was raised and where
    report = graded(
        "allocate_raises",
        (
            "        h = NO_HASH\n        for i in range(num_cached_blocks):",
            "        h = NO_HASH\n        assert not num_cached_blocks, 'no cache'\n        for i in range(num_cached_blocks):",
        ),
        task="ch25.3",
    )
    r = result(report, "figure instance")
    assert r.status == "failed"
    assert "step 7 of 18: allocate(B, num_cached_blocks=1)" in r.message
    assert "your code raised AssertionError: no cache" in r.message and "in allocate: assert" in r.message


# -- 25.3: hash collisions -------------------------------------------------------------------------------------
def test_a_hit_that_trusts_the_hash_alone_is_caught_under_the_weak_hash(graded):
    # can_allocate without the comparison of the stored tokens: full marks while only 64-bit hashes were tried
    report = graded.mistake("hash_only")
    failed = {(r.task, r.name, r.hidden) for r in report.results if r.status != "passed"}
    public = result(report, "hash collisions")
    assert failed == {("ch25.3", public.name, False), ("ch25.3", result(report, "weak hash").name, True)}
    assert public.hints == ["hash_only"] and result(report, "weak hash").hints == ["hash_only"]
    assert "can_allocate(B) should return 0:" in public.message
    assert (
        "logical block 0 [4, 3, 2, 1]: its hash 10 maps to block 0, which holds other tokens [1, 2, 3, 4]: a hash collision, so a miss"
    ) in public.message and "yours: 1" in public.message


class HashOnly(ref.BlockManager):
    """can_allocate without the token comparison (the mistake hash_only), for the invariant on one's own trace."""

    def can_allocate(self, seq):
        hits, needed, h = 0, seq.num_blocks, ref.NO_HASH
        for i in range(seq.num_blocks - 1):
            h = self.compute_hash(seq.block(i), h)
            block_id = self.hash_to_block_id.get(h)
            if block_id is None:
                break
            hits += 1
            needed -= block_id in self.used_block_ids
        return hits if len(self.free_block_ids) >= needed else -1


def test_a_block_holding_other_tokens_breaks_the_invariant_of_ones_own_trace():
    script = [*traces.add("A", [1, 2, 3, 4, 5]), ["compute", "A", 5, 6], ["add", "B", [4, 3, 2, 1, 7]], ["can_allocate", "B"]]
    runner = ref.ScriptRunner(8, 4, weak_hash=True)
    runner.manager = HashOnly(8, 4)
    runner.before = ref.snapshot(runner.manager)
    trace = runner.run(script)
    hits = trace[-1]["value"]
    assert hits == 1  # [4, 3, 2, 1] and [1, 2, 3, 4] share colliding_hash 10
    script.append(["allocate", "B", hits])
    trace += runner.run(script[-1:])
    *_, (_, s) = traces.states(script, trace, 8)
    problem = hidden_checks.broken_invariant(s, set(range(8)), "B", 4)
    assert problem.startswith(hidden_checks.OTHER_TOKENS)
    assert "block 0 is B's logical block 0, whose tokens are [4, 3, 2, 1], but it holds [1, 2, 3, 4]" in problem
    # the reference under the weak hash never breaks it
    for num_blocks, bs, script in scripts(weak_hash=True):
        for op, (_, s) in zip(script, traces.states(script, ref.replay(num_blocks, bs, script, weak_hash=True), num_blocks)):
            assert hidden_checks.broken_invariant(s, set(range(num_blocks)), op[1], bs) is None


def test_the_weak_hash_is_the_running_sum_and_replay_puts_the_real_one_back():
    assert ref.colliding_hash([1, 2, 3, 4]) == ref.colliding_hash([4, 3, 2, 1]) == 10
    assert ref.colliding_hash([5, 6, 7, 8], 10) == 36
    strong = ref.BlockManager.compute_hash([1, 2, 3, 4])
    trace = ref.replay(4, 4, [*traces.add("A", [1, 2, 3, 4, 5]), ["compute", "A", 5, 6]], weak_hash=True)
    assert trace[-1]["map"] == {10: 0}
    assert ref.BlockManager.compute_hash([1, 2, 3, 4]) == strong
    # also when an operation raises
    assert "error" in ref.replay(4, 4, [["add", "A", [1]], ["allocate", "A", 5]], weak_hash=True)[-1]
    assert ref.BlockManager.compute_hash([1, 2, 3, 4]) == strong


# -- the provided input checks (outside the solution regions: unit tests, no graded checks) ---------------------
@pytest.mark.parametrize(
    "table, positions, block_size", [([0, 1], [-1, 0], 2), ([0, 1], [0, 1], 0), ([0, 1], [0, 1], -2), ([0, 1], torch.tensor([3, -5]), 2)]
)
def test_the_provided_slot_check_refuses_bad_inputs(table, positions, block_size):
    with pytest.raises(ValueError):
        ref.slot_mapping(table, positions, block_size)


@pytest.mark.parametrize("table, positions, block_size", [([], [0], 4), ([3, 0, 4], [0, 6], 2)])
def test_a_position_beyond_the_table_is_the_exercise_s_own_error(table, positions, block_size):
    ref._check_slots(positions, block_size)  # the provided check lets it through
    with pytest.raises(ValueError, match="logical block"):
        ref.slot_mapping(table, positions, block_size)


CACHE = torch.zeros(2, 2, 2, 4)


@pytest.mark.parametrize(
    "v_cache, k, v, slots",
    [
        (torch.zeros(2, 2, 2, 3), torch.ones(1, 2, 4), torch.ones(1, 2, 4), [0]),  # caches of two shapes
        (CACHE, torch.ones(2, 1, 4), torch.ones(2, 1, 4), [0, 1]),  # 1 kv head, the cache has 2
        (CACHE, torch.ones(2, 2, 4), torch.ones(2, 2, 8), [0, 1]),  # v of another head_dim
        (CACHE, torch.ones(2, 2, 4), torch.ones(2, 2, 4), [0]),  # 2 tokens, 1 slot
        (CACHE, torch.ones(2, 2, 4), torch.ones(3, 2, 4), [0, 1]),  # k and v of other lengths
        (CACHE, torch.ones(1, 2, 4), torch.ones(1, 2, 4), [-2]),  # neither a slot nor −1
        (CACHE, torch.ones(2, 2, 4), torch.ones(2, 2, 4), [1, 4]),
    ],
)  # beyond 2 blocks × 2 slots
def test_the_provided_store_check_refuses_bad_inputs(v_cache, k, v, slots):
    with pytest.raises(ValueError):
        ref.store_kv(CACHE.clone(), v_cache.clone(), k, v, slots)


def test_the_provided_store_check_lets_padding_and_the_last_slot_through():
    k_cache, v_cache = CACHE.clone(), CACHE.clone()
    ref.store_kv(k_cache, v_cache, torch.ones(3, 2, 4), 2 * torch.ones(3, 2, 4), [3, -1, 0])
    assert k_cache[1, 1].sum() == 8 and v_cache[0, 0].sum() == 16 and k_cache.sum() == 16


@pytest.mark.parametrize("num_blocks, block_size", [(0, 4), (4, 1), (-1, 2)])
def test_the_provided_pool_check_refuses_bad_sizes(num_blocks, block_size):
    with pytest.raises(ValueError):
        ref.BlockManager(num_blocks, block_size)


@pytest.mark.parametrize(
    "script",
    [
        [["add", "A", [1, 2, 3, 4, 5]], ["allocate", "A", 0], ["allocate", "A", 0]],  # A already has a table
        [["add", "A", [1, 2, 3, 4, 5]], ["allocate", "A", 2]],  # the last block never hits
        [["add", "A", [1, 2, 3, 4, 5]], ["allocate", "A", -1]],
    ],
)
def test_the_provided_allocate_check_refuses_bad_uses(script):
    last = ref.replay(4, 4, script)[-1]
    assert last["error"].startswith("ValueError")
    assert "error" not in ref.replay(4, 4, script[:2] if script[1][2] == 0 else script[:1])[-1]
