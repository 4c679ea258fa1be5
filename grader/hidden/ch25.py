"""Hidden checks of ch25 · paged KV cache: random instances from the grading seed, edge cases."""

from __future__ import annotations

import random
from collections import deque
from typing import Any, Callable

import torch

from grader.authoring import CheckFailed, Trial, describe, first_named, hidden, mistakes
from grader.checks.ch25 import check_store, expect_slots, run_slot_case, run_store_case, slot_variants
from grader.checks.ch25_explain import describe_op, drive_reference, expect_trace, hx, states
from grader.i18n import mark, tr

M = mistakes("ch25")


# -- ch25.1 ---------------------------------------------------------------------------------------------------


@hidden("ch25.1", "random sequences, whole prompts")
def random_prompts(t: Trial) -> None:
    def case() -> None:
        block_size = t.random.choice([1, 2, 3, 4, 8, 16, 256])
        length = t.random.randint(1, 5 * block_size)
        table = random_table(t, -(-length // block_size), 64)
        run_slot_case(t, table, list(range(length)), block_size, as_tensor=t.random.random() < 0.5)

    first_named(case for _ in range(20))  # a case where two misreadings give the same slots does not hide one that tells


@hidden("ch25.1", "random chunks after a cached prefix, in shuffled order")
def random_chunks(t: Trial) -> None:
    def case() -> None:
        block_size = t.random.choice([2, 4, 16])
        start, length = t.random.randint(0, 40), t.random.randint(1, 30)
        table = random_table(t, -(-(start + length) // block_size), 128)
        positions = [start + int(i) for i in torch.randperm(length, generator=t.rng)]
        run_slot_case(t, table, positions, block_size, as_tensor=True)

    first_named(case for _ in range(20))


@hidden("ch25.1", "the decode step: the newest token's slot")
def decode_step(t: Trial) -> None:
    # nano-vllm's prepare_decode: slot = block_table[-1]·bs + last_block_num_tokens − 1.
    lengths = iter((1, 255, 256, 257, 300, 512))

    def case() -> None:
        length = next(lengths)
        run_slot_case(t, random_table(t, -(-length // 256), 40), [length - 1], 256)

    first_named(case for _ in range(6))


@hidden("ch25.1", "a long prompt (100k tokens)")
def long_prompt(t: Trial) -> None:
    block_size, length = 16, 100_000
    table = random_table(t, -(-length // block_size), 10_000)
    positions = list(range(length))
    got = t.yours.slot_mapping(table, torch.tensor(positions), block_size)
    expect_slots(
        got,
        t.ref.slot_mapping(table, positions, block_size),
        table,
        positions,
        block_size,
        t.ref.drive(slot_variants, table, positions, block_size),
    )


@hidden("ch25.1", "positions beyond the block table raise ValueError")
def beyond_table_hidden(t: Trial) -> None:
    t.expect_raises(ValueError, t.yours.slot_mapping, [], [0], 4, because=tr("an empty block table holds no position"))
    block_size = t.random.choice([2, 4, 16])
    table = random_table(t, t.random.randint(1, 6), 64)
    end = len(table) * block_size
    positions = [t.random.randrange(end) for _ in range(5)] + [end + t.random.randrange(block_size)]
    t.random.shuffle(positions)
    t.expect_raises(
        ValueError,
        t.yours.slot_mapping,
        table,
        positions,
        block_size,
        because=tr(
            "position {p} is in logical block {block}, but the table has only {n} blocks",
            p=max(positions),
            block=max(positions) // block_size,
            n=len(table),
        ),
    )


# -- ch25.2 ---------------------------------------------------------------------------------------------------


@hidden("ch25.2", "random pools, slots and padding; fresh caches, slices of one pool, permuted layouts")
def random_stores(t: Trial) -> None:
    for _ in range(10):
        num_blocks, block_size = t.random.randint(1, 6), t.random.choice([1, 2, 4, 16])
        heads, dim = t.random.choice([1, 2, 4]), t.random.choice([1, 8, 64])
        n = t.random.randint(0, num_blocks * block_size)
        slots = torch.randperm(num_blocks * block_size, generator=t.rng)[:n].tolist()
        slots = [s if t.random.random() > 0.2 else -1 for s in slots]
        run_store_case(t, (num_blocks, block_size, heads, dim), slots, layout=t.random.choice(["fresh", "pool", "permuted"]))


@hidden("ch25.2", "a bfloat16 cache, as in nano-vllm, fresh and sliced from one pool")
def bf16_cache(t: Trial) -> None:
    run_store_case(t, (4, 16, 8, 16), [0, 17, 63, -1, 5], dtype=torch.bfloat16)
    run_store_case(t, (4, 16, 8, 16), [63, 2, -1, 40], dtype=torch.bfloat16, layout="pool")


@hidden("ch25.2", "the last slot of the pool is a real slot")
def last_slot(t: Trial) -> None:
    k = torch.randn(2, 2, 4, generator=t.rng)
    check_store(t, torch.zeros(3, 4, 2, 4), torch.zeros(3, 4, 2, 4), k, 2 * k, [11, 0], 4)


# -- ch25.3 ---------------------------------------------------------------------------------------------------


@hidden("ch25.3", "200 requests sharing four system prompts")
def many_requests(t: Trial) -> None:
    random_trace(
        t,
        num_blocks=48,
        block_size=4,
        num_requests=200,
        max_new=4,
        max_seqs=8,
        budget=32,
        per_step=2,
        case=tr("{requests} requests over {blocks} blocks", requests=200, blocks=48),
    )


@hidden("ch25.3", "memory pressure: 60 requests over 12 blocks, preemption and re-admission")
def memory_pressure(t: Trial) -> None:
    random_trace(
        t,
        num_blocks=12,
        block_size=4,
        num_requests=60,
        max_new=12,
        max_seqs=6,
        budget=24,
        per_step=2,
        case=tr("{requests} requests over {blocks} blocks", requests=60, blocks=12),
    )


@hidden("ch25.3", "block sizes 2 and 16, long prompts prefilled in chunks")
def block_sizes(t: Trial) -> None:
    random_trace(
        t, num_blocks=40, block_size=2, num_requests=30, max_new=6, max_seqs=4, budget=10, per_step=1, case=tr("block_size {bs}", bs=2)
    )
    random_trace(
        t, num_blocks=12, block_size=16, num_requests=24, max_new=18, max_seqs=4, budget=20, per_step=1, case=tr("block_size {bs}", bs=16)
    )


@hidden("ch25.3", "invariants hold on your own trace, driven by your own answers")
def invariants(t: Trial) -> None:
    # The scheduler acts on your can_allocate / can_append, one operation at a time, so whatever order your
    # manager hands blocks out in, the state after every step must still add up.
    own_trace_invariants(t, workload(t.random, num_requests=16, block_size=4, num_prefixes=3, max_new=8, max_len=12 * 4, per_step=2))


@hidden("ch25.3", "weak hash (colliding_hash), collisions everywhere: the same trace, no block with other tokens handed out", time_limit=30)
def weak_hash_collisions(t: Trial) -> None:
    # Prompts share system prompts and half have one block's tokens shuffled: under colliding_hash (the sum of the
    # tokens so far) the shuffled block and every later one collide with the original's.
    random_trace(
        t,
        num_blocks=24,
        block_size=4,
        num_requests=60,
        max_new=6,
        max_seqs=6,
        budget=24,
        per_step=2,
        case=tr("colliding hashes, {requests} requests over {blocks} blocks", requests=60, blocks=24),
        weak_hash=True,
    )
    # and driven by your own answers: a block table never holds a hashed block with other tokens
    own_trace_invariants(
        t,
        workload(t.random, num_requests=20, block_size=4, num_prefixes=3, max_new=6, max_len=12 * 4, per_step=2, shuffle=0.5),
        weak_hash=True,
    )


# -- helpers --------------------------------------------------------------------------------------------------


def own_trace_invariants(t: Trial, requests: list, *, weak_hash: bool = False) -> None:
    """The scheduler in miniature drives your manager on your own answers (12 blocks of 4); every state of your
    trace must satisfy the invariants."""
    num_blocks, bs = 12, 4
    runner, ops, trace = t.yours.ScriptRunner(num_blocks, bs, weak_hash), [], []

    def do(op: list):
        records = runner.run([op])
        if not isinstance(records, list) or len(records) != 1 or not isinstance(records[0], dict):
            raise CheckFailed(tr("ScriptRunner.run should return one record per operation; yours: {what}", what=describe(records)))
        ops.append(op)
        trace.append(records[0])
        if "error" in records[0]:
            raise Stop
        value = records[0]["value"]
        if op[0] == "can_allocate" and not (type(value) is int and value >= -1):
            raise CheckFailed(tr("can_allocate({name}) should return an int ≥ −1; yours: {what}", name=op[1], what=describe(value)))
        if op[0] == "can_append" and type(value) is not bool:
            raise CheckFailed(tr("can_append({name}) should return a bool; yours: {what}", name=op[1], what=describe(value)))
        return value

    try:
        simulate(do, t.random.randrange(2**31), bs, requests, 6, 24, max_ops=1500)
    except Stop:
        pass
    everything = set(range(num_blocks))

    def named() -> CheckFailed | None:
        """The first difference from the reference on the same operations, with the mistake it names. Your answers may
        have driven operations the reference refuses (an allocation with no free block): then the longest prefix of
        the operations it runs is compared."""

        def drive(n: int) -> dict | None:
            try:
                return t.ref.drive(drive_reference, num_blocks, bs, ops[:n], weak_hash=weak_hash)
            except Exception:  # noqa: BLE001 (the reference refused one of the first n operations)
                return None

        expected = drive(len(ops))
        if expected is None:  # the longest prefix that runs: ops[:lo] runs, ops[:hi + 1] does not
            lo, hi = 0, len(ops) - 1
            while lo < hi:
                mid = (lo + hi + 1) // 2
                run = drive(mid)
                if run is None:
                    hi = mid - 1
                else:
                    lo, expected = mid, run
        if expected is None:
            return None
        n = len(expected["trace"])
        try:
            expect_trace(ops[:n], trace[:n], expected, num_blocks, bs, case="")
        except CheckFailed as failure:
            return failure
        return None

    for i, (before, s) in enumerate(states(ops, trace, num_blocks)):
        step = describe_op(ops[i], before, bs)
        head = (
            tr("invariants on your own trace (hashing with colliding_hash), step {k}: {step}", k=i + 1, step=step)
            if weak_hash
            else tr("invariants on your own trace, step {k}: {step}", k=i + 1, step=step)
        )
        if "error" in s:
            raise CheckFailed(head, tr("your code raised {error}", error=s["error"])).named_by(named())
        problem = broken_invariant(s, everything, ops[i][1], bs)
        if problem:
            other = problem.startswith(tr(OTHER_TOKENS))
            raise CheckFailed(head, problem, hint=M.hash_only if other else "").named_by(None if other else named())


def random_table(t: Trial, num_blocks: int, pool: int) -> list[int]:
    return torch.randperm(pool, generator=t.rng)[:num_blocks].tolist()


def workload(
    rnd: random.Random,
    *,
    num_requests: int,
    block_size: int,
    num_prefixes: int,
    max_new: int,
    max_len: int,
    per_step: int,
    shuffle: float = 0.0,
) -> list[tuple[int, str, list[int], int]]:
    """Requests (arrival step, name, prompt, new tokens): a few shared system prompts, some exact duplicates; with
    probability `shuffle` a request has the tokens of one of its full blocks (not the last) shuffled, so that
    under colliding_hash that block collides with the unshuffled one."""
    prefixes = [[rnd.randrange(1, 100) for _ in range(rnd.randint(block_size, 4 * block_size))] for _ in range(num_prefixes)]
    out: list[tuple[int, str, list[int], int]] = []
    for i in range(num_requests):
        if out and rnd.random() < 0.1:
            prompt = list(rnd.choice(out)[2])
        else:
            head = rnd.choice(prefixes) if rnd.random() < 0.8 else []
            prompt = head + [rnd.randrange(1, 100) for _ in range(rnd.randint(1, 3 * block_size))]
        prompt = prompt[: max_len - max_new]
        full = (len(prompt) - 1) // block_size
        if full and rnd.random() < shuffle:
            b = rnd.randrange(full)
            block = prompt[b * block_size : (b + 1) * block_size]
            rnd.shuffle(block)
            prompt[b * block_size : (b + 1) * block_size] = block
        out.append((i // per_step, f"R{i}", prompt, rnd.randint(1, max_new)))
    return out


def simulate(
    do: Callable[[list], object], seed: int, block_size: int, requests: list, max_seqs: int, budget: int, max_ops: int = 20_000
) -> list:
    """nano-vllm's scheduler in miniature (prefill first, FCFS, only the first sequence of a batch chunked,
    preemption from the tail of running), driving a block manager through `do(op) -> value`; returns the
    script of its operations. It keeps its own view of each sequence (length, cached tokens, whether it
    holds blocks), so it can drive any manager on that manager's own answers."""
    rnd, script = random.Random(seed), []
    view: dict[str, dict] = {}

    def run(op: list):
        script.append(op)
        return do(op)

    pending: deque = deque(requests)
    waiting: deque[str] = deque()
    running: deque[str] = deque()
    step = 0
    while (pending or waiting or running) and len(script) < max_ops:
        while pending and pending[0][0] <= step:
            _, name, prompt, n = pending.popleft()
            run(["add", name, prompt])
            view[name] = {"len": len(prompt), "prompt": len(prompt), "new": n, "cached": 0, "held": False}
            waiting.append(name)
        step += 1
        batch: list[tuple[str, int]] = []
        used = 0
        while waiting and len(batch) < max_seqs and used < budget:
            name = waiting[0]
            v = view[name]
            if not v["held"]:
                hits = run(["can_allocate", name])
                if hits == -1:
                    break
                todo = v["len"] - hits * block_size
            else:
                todo = v["len"] - v["cached"]
            if budget - used < todo and batch:
                break
            if not v["held"]:
                run(["allocate", name, hits])
                v["held"], v["cached"] = True, hits * block_size
            k = min(todo, budget - used)
            batch.append((name, k))
            used += k
            if v["cached"] + k == v["len"]:
                running.append(waiting.popleft())
        if not batch:
            if not running:
                break  # nothing fits even in an empty pool: a manager that never admits
            while running and len(batch) < max_seqs:
                name = running.popleft()
                while not run(["can_append", name]):
                    victim = running.pop() if running else name
                    run(["deallocate", victim])
                    view[victim].update(held=False, cached=0)
                    waiting.appendleft(victim)
                    if victim == name:
                        break
                else:
                    run(["may_append", name])
                    batch.append((name, 1))
            running.extendleft(name for name, _ in reversed(batch))
        for name, k in batch:
            v = view[name]
            done = v["cached"] + k == v["len"]
            run(["compute", name, k, rnd.randrange(1, 100) if done else None])
            v["cached"] += k
            v["len"] += done
            if done and v["len"] - v["prompt"] == v["new"]:
                run(["deallocate", name])
                v.update(held=False, cached=0)
                running.remove(name)
    return script


def reference_do(ref: Any, num_blocks: int, block_size: int, weak_hash: bool = False) -> Callable[[list], object]:
    manager, seqs = ref.BlockManager(num_blocks, block_size), dict[str, Any]()
    if weak_hash:
        manager.compute_hash = ref.colliding_hash  # the reference hashes through self.compute_hash
    return lambda op: ref.run_op(manager, seqs, op)


def random_trace(
    t: Trial,
    *,
    num_blocks: int,
    block_size: int,
    num_requests: int,
    max_new: int,
    max_seqs: int,
    budget: int,
    per_step: int,
    case: str,
    weak_hash: bool = False,
) -> tuple[list, list]:
    """A random workload scheduled over the reference; your manager must give the same trace (with weak_hash,
    both hash with colliding_hash and half the prompts have a shuffled block)."""
    requests = workload(
        t.random,
        num_requests=num_requests,
        block_size=block_size,
        num_prefixes=4,
        max_new=max_new,
        max_len=num_blocks * block_size,
        per_step=per_step,
        shuffle=0.5 if weak_hash else 0.0,
    )
    script = simulate(
        reference_do(t.ref, num_blocks, block_size, weak_hash), t.random.randrange(2**31), block_size, requests, max_seqs, budget
    )
    expected = t.ref.drive(drive_reference, num_blocks, block_size, script, weak_hash=weak_hash)
    got = t.yours.replay(num_blocks, block_size, script, weak_hash=weak_hash)
    expect_trace(script, got, expected, num_blocks, block_size, case=case)
    return script, got


class Stop(Exception):
    """The manager raised: the scheduler stops and the trace so far is judged."""


OTHER_TOKENS = mark("a block holding other tokens was handed out")
"""The start of the invariant a colliding hash breaks (translated with `tr` where it is used)."""


def broken_invariant(s: dict, everything: set[int], name: str, block_size: int) -> str | None:
    """The first invariant this state breaks (they hold whatever the allocation order), or None."""
    free, used = s["free"], s["used"]
    if len(set(free)) != len(free):
        return tr("the free list {free} holds a block twice", free=free)
    if set(free) & set(used) or set(free) | set(used) != everything:
        return tr(
            "free + used should be every block exactly once: free {free}, used {used}, {n} blocks",
            free=sorted(free),
            used=sorted(used),
            n=len(everything),
        )
    count = [0] * len(everything)
    for table in s["tables"].values():
        for b in table:
            count[b] += 1
    for b, (r, c) in enumerate(zip(s["ref"], count)):
        if r != c:
            held = [n for n, tb in s["tables"].items() if b in tb]
            if not held:
                return tr("block {b} has ref_count {r}, but no block table holds it", b=b, r=r)
            if c == 1:
                return tr("block {b} has ref_count {r}, but 1 block table holds it {held}", b=b, r=r, held=held)
            return tr("block {b} has ref_count {r}, but {c} block tables hold it {held}", b=b, r=r, c=c, held=held)
        if (r > 0) != (b in used):
            return (
                tr("block {b} has ref_count {r} but is not in used_block_ids", b=b, r=r)
                if r > 0
                else tr("block {b} has ref_count {r} but is in used_block_ids", b=b, r=r)
            )
    for h, b in s["map"].items():
        if s["hash"][b] != h:
            return tr(
                "hash_to_block_id maps {hash} to block {b}, whose hash is {other}: every entry must point at a block "
                "carrying that hash (evict an entry when its block is reused)",
                hash=hx(h),
                b=b,
                other=hx(s["hash"][b]),
            )
    for n, table in s["tables"].items():
        for i, b in enumerate(table):
            mine = s["seqs"][n][i * block_size : (i + 1) * block_size]
            if s["hash"][b] != -1 and s["tokens"][b] != mine:
                return tr(
                    "{other_tokens}: block {b} is {name}'s logical block {i}, whose tokens are {mine}, but it holds {held} "
                    "(hashed with them, {hash})",
                    other_tokens=tr(OTHER_TOKENS),
                    b=b,
                    name=n,
                    i=i,
                    mine=mine,
                    held=s["tokens"][b],
                    hash=hx(s["hash"][b]),
                )
    if s["cached"].get(name, 0) > len(s["seqs"][name]):
        return tr("{name}.num_cached_tokens = {cached} exceeds its {n} tokens", name=name, cached=s["cached"][name], n=len(s["seqs"][name]))
    return None
