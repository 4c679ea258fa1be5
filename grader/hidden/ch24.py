"""Hidden checks of ch24 · the control loop and its counters: long random traces from the grading seed,
invariants on the student's own trace, edge cases (the input checks that teach nothing are provided code, tested
in tests/test_ch24.py)."""

from __future__ import annotations

import random

from grader.authoring import CheckFailed, Trial, error_lines, expect_records, hidden, raised
from grader.checks.ch24 import expect_progress, run_lifecycle
from grader.checks.ch24_explain import (
    FINISHED,
    KEYS,
    check_trace,
    describe_case,
    expect_trace,
    explain_progress,
    lifecycle,
    request,
    script,
    start_progress,
    step_args,
)
from grader.i18n import mark, tr

# -- ch24.1 ---------------------------------------------------------------------------------------------------


@hidden("ch24.1", "hundreds of requests under memory pressure (preemption)", time_limit=30)
def random_memory_pressure(t: Trial) -> None:
    expect_trace(
        t,
        random_script(
            t.random,
            mark("memory pressure"),
            n=150,
            prompts=(1, 20),
            max_tokens=(1, 8),
            block_size=4,
            num_blocks=14,
            max_num_seqs=8,
            budget=16,
            arrivals=60,
        ),
    )


@hidden("ch24.1", "long prompts chunked by small token budgets", time_limit=30)
def random_small_budgets(t: Trial) -> None:
    expect_trace(
        t,
        random_script(
            t.random,
            mark("token budget 1"),
            n=10,
            prompts=(1, 12),
            max_tokens=(1, 4),
            block_size=4,
            num_blocks=40,
            max_num_seqs=4,
            budget=1,
            arrivals=20,
        ),
    )
    expect_trace(
        t,
        random_script(
            t.random,
            mark("token budget 5"),
            n=16,
            prompts=(1, 30),
            max_tokens=(1, 6),
            block_size=4,
            num_blocks=40,
            max_num_seqs=4,
            budget=5,
            arrivals=30,
        ),
    )


@hidden("ch24.1", "many short requests, few sequences per batch, decode beyond the token budget", time_limit=30)
def random_many_short(t: Trial) -> None:
    expect_trace(
        t,
        random_script(
            t.random,
            mark("short requests"),
            n=60,
            prompts=(1, 6),
            max_tokens=(1, 8),
            block_size=2,
            num_blocks=30,
            max_num_seqs=6,
            budget=4,
            arrivals=40,
        ),
    )
    expect_trace(
        t,
        random_script(
            t.random,
            mark("one sequence per batch"),
            n=20,
            prompts=(1, 9),
            max_tokens=(1, 5),
            block_size=3,
            num_blocks=8,
            max_num_seqs=1,
            budget=7,
            arrivals=10,
        ),
    )


@hidden("ch24.1", "edge cases: block_size 1, block-aligned prompts, a request that fills the pool, EOS first")
def edge_cases(t: Trial) -> None:
    expect_trace(
        t,
        script(
            mark("block_size 1"),
            [request("A", [5, 6, 7], 4, [8, 9, 10, 11]), request("B", [1, 2], 3, [3, 4, 5])],
            num_blocks=7,
            block_size=1,
            max_num_seqs=4,
            max_num_batched_tokens=8,
            eos=0,
        ),
    )
    expect_trace(
        t,
        script(
            mark("block-aligned prompts"),
            [request("A", list(range(10, 18)), 3, [30, 31, 32]), request("B", list(range(20, 24)), 3, [33, 34, 35])],
            num_blocks=6,
            block_size=4,
            max_num_seqs=4,
            max_num_batched_tokens=5,
            eos=0,
        ),
    )
    expect_trace(
        t,
        script(
            mark("fills the pool"),
            [request("A", list(range(10, 19)), 4, [30, 31, 32, 33]), request("B", [1, 2], 2, [0, 7], arrive=1)],
            num_blocks=3,
            block_size=4,
            max_num_seqs=2,
            max_num_batched_tokens=16,
            eos=0,
        ),
    )


@hidden("ch24.1", "invariants of your own trace (blocks, counters, limits, every request finishes)", time_limit=30)
def invariants(t: Trial) -> None:
    sc = random_script(
        t.random,
        mark("invariants"),
        n=40,
        prompts=(1, 24),
        max_tokens=(1, 12),
        block_size=4,
        num_blocks=12,
        max_num_seqs=5,
        budget=9,
        arrivals=30,
    )
    expected = t.ref.replay(sc)
    limit = 2 * len(expected) + 20
    yours = expect_records(t.yours.replay(sc, limit))

    def named() -> CheckFailed | None:
        """The first difference from the reference's trace of the same script, with the mistake it names."""
        try:
            check_trace(sc, yours, expected)
        except CheckFailed as failure:
            return failure
        return None

    for k, rec in enumerate(yours):
        for phase, part in (("schedule", "sched"), ("after", "after")):
            bad = part in rec and invariant_failure(sc, phase, rec)
            if bad:
                raise CheckFailed(describe_case(sc), bad).named_by(named())
        if raised(rec):
            raise CheckFailed(describe_case(sc), tr("step {k} of your own trace:", k=k + 1), *error_lines(rec))
    if yours and yours[-1].get("step", 0) >= limit:
        raise CheckFailed(describe_case(sc), tr("after {limit} steps some requests have not finished", limit=limit)).named_by(named())


# -- ch24.2 ---------------------------------------------------------------------------------------------------


@hidden("ch24.2", "random request lives from the grading seed")
def random_lives(t: Trial) -> None:
    for i in range(25):
        run_lifecycle(t, random_lifecycle(t.random, tr("random life {i}", i=i + 1)))


@hidden("ch24.2", "edge cases: the largest allowed hit, a 1-token prompt, preemption before any output")
def progress_edges(t: Trial) -> None:
    run_lifecycle(t, lifecycle(mark("hit of num_tokens − 1"), 13, [(1, 12), (1,)]))
    run_lifecycle(t, lifecycle(mark("1-token prompt"), 1, [(1,), (1,), ("preempt",), (2,), (1,)]))
    run_lifecycle(t, lifecycle(mark("preempted mid-prefill"), 12, [(5,), ("preempt",), (0,), (8, 4), (1,)]))


@hidden("ch24.2", "invariants of your counters along random lives")
def progress_invariants(t: Trial) -> None:
    for i in range(12):
        case = random_lifecycle(t.random, tr("life {i}", i=i + 1))
        p = start_progress(case["prompt"])
        cached_set = False
        for k, step in enumerate(case["steps"]):
            args, kwargs = step_args(step)
            got = expect_progress(t.yours.progress_after_step(dict(p), *args, **kwargs), case["name"])
            want = t.ref.progress_after_step(dict(p), *args, **kwargs)
            counters = ", ".join(f"{x} {p[x]}" for x in KEYS)
            where = tr('case "{name}" step {k} ({counters} before)', name=case["name"], k=k + 1, counters=counters)
            # A broken property is named by the mistake the step's comparison with the reference finds.
            named = explain_progress(case, k, p, step, want, got) if any(got[x] != want[x] for x in KEYS) else None
            if not 0 <= got["num_computed_tokens"] <= got["num_tokens"]:
                raise CheckFailed(
                    tr(
                        "{where}: num_computed_tokens {computed} must stay within 0 … num_tokens {tokens}",
                        where=where,
                        computed=got["num_computed_tokens"],
                        tokens=got["num_tokens"],
                    )
                ).named_by(named)
            if got["num_tokens"] < p["num_tokens"] or got["num_tokens"] > p["num_tokens"] + 1:
                raise CheckFailed(
                    tr(
                        "{where}: num_tokens went from {before} to {after}; a step appends at most one token and never removes one",
                        where=where,
                        before=p["num_tokens"],
                        after=got["num_tokens"],
                    )
                ).named_by(named)
            if got["num_prompt_tokens"] != p["num_prompt_tokens"]:
                raise CheckFailed(tr("{where}: num_prompt_tokens changed", where=where)).named_by(named)
            if cached_set and got["num_cached_tokens"] != p["num_cached_tokens"]:
                raise CheckFailed(
                    tr(
                        "{where}: num_cached_tokens changed from {before} to {after}; it is set once, at the first admission",
                        where=where,
                        before=p["num_cached_tokens"],
                        after=got["num_cached_tokens"],
                    )
                ).named_by(named)
            cached_set = got["num_cached_tokens"] >= 0
            p = want  # go on from the right state


@hidden("ch24.2", "the counters agree with the scheduler's trace (no prefix cache: hits are 0)")
def agrees_with_scheduler(t: Trial) -> None:
    sc = random_script(
        t.random,
        mark("scheduler trace"),
        n=12,
        prompts=(1, 14),
        max_tokens=(1, 6),
        block_size=4,
        num_blocks=6,
        max_num_seqs=3,
        budget=5,
        arrivals=6,
    )
    trace = t.ref.replay(sc)
    prompts = {r["name"]: len(r["prompt"]) for r in sc["requests"]}
    progress: dict[str, dict] = {}
    for rec in trace:
        for n, sched in rec["sched"]["seqs"].items():
            before = progress.setdefault(n, start_progress(prompts[n]))
            preempted = before["num_computed_tokens"] > 0 and sched["num_computed_tokens"] == 0
            step = {"n": sched["num_scheduled_tokens"], "hit": 0, "preempted": preempted and n not in rec["batch"]}
            if preempted and n in rec["batch"]:  # never happens in nano-vllm: a victim is not scheduled that step
                continue
            args, kwargs = step_args(step)
            got = expect_progress(t.yours.progress_after_step(dict(before), *args, **kwargs), n)
            after = rec["after"]["seqs"][n]
            want = {
                **before,
                "num_computed_tokens": after["num_computed_tokens"],
                "num_tokens": after["num_tokens"],
                "num_cached_tokens": 0 if before["num_cached_tokens"] >= 0 or step["n"] else -1,
            }
            if got != want:
                name = tr("{case}, request {name} at step {s}", case=tr(sc["name"]), name=n, s=rec["step"])
                case = {"name": name, "prompt": prompts[n]}
                raise explain_progress(case, rec["step"] - 1, before, step, want, got)
            progress[n] = want


# -- helpers --------------------------------------------------------------------------------------------------


def random_script(
    rnd: random.Random,
    name: str,
    *,
    n: int,
    prompts: tuple[int, int],
    max_tokens: tuple[int, int],
    block_size: int,
    num_blocks: int,
    max_num_seqs: int,
    budget: int,
    arrivals: int,
    eos_rate: float = 0.08,
    trap_rate: float = 0.2,
) -> dict:
    """`n` requests with random prompts, outputs (EOS at random places) and arrival rounds; every request fits."""
    eos = rnd.randint(0, 5)
    token = lambda: rnd.randint(10, 999)
    reqs = []
    for i in range(n):
        while True:
            length, mt = rnd.randint(*prompts), rnd.randint(*max_tokens)
            if -(-(length + mt - 1) // block_size) <= num_blocks:
                break
        outputs = [eos if rnd.random() < eos_rate else token() for _ in range(mt)]
        traps = {end: eos for end in range(1, length) if rnd.random() < trap_rate}  # EOS candidates mid-prompt
        reqs.append(
            request(
                f"r{i}",
                [token() for _ in range(length)],
                mt,
                outputs,
                arrive=rnd.randint(0, arrivals),
                candidates=traps,
                ignore_eos=rnd.random() < 0.1,
            )
        )
    return script(
        name, reqs, num_blocks=num_blocks, block_size=block_size, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, eos=eos
    )


def invariant_failure(sc: dict, phase: str, rec: dict) -> str | None:
    """The first invariant the student's state breaks after this phase of a step, or None."""
    cfg = sc["config"]
    st = rec["sched"] if phase == "schedule" else rec["after"]
    when = tr("after step {s}'s {call}", s=rec["step"], call="schedule()" if phase == "schedule" else "postprocess()")
    reqs = {r["name"]: r for r in sc["requests"]}
    for n, s in st["seqs"].items():
        if not 0 <= s["num_computed_tokens"] <= s["num_tokens"]:
            return tr(
                "{when} request {name} has num_computed_tokens {computed} > num_tokens {tokens}",
                when=when,
                name=n,
                computed=s["num_computed_tokens"],
                tokens=s["num_tokens"],
            )
        if s["num_computed_tokens"] + s["num_scheduled_tokens"] > s["num_tokens"]:
            return tr(
                "{when} request {name} schedules {scheduled} tokens after {computed} computed, beyond its {tokens} tokens",
                when=when,
                name=n,
                scheduled=s["num_scheduled_tokens"],
                computed=s["num_computed_tokens"],
                tokens=s["num_tokens"],
            )
        if len(s["completion"]) > reqs[n]["max_tokens"]:
            return tr("{when} request {name} has {n} completion tokens, more than max_tokens", when=when, name=n, n=len(s["completion"]))
        queued = st["waiting"].count(n) + st["running"].count(n)
        if s["status"] == FINISHED and (queued or s["blocks"]):
            return tr(
                "{when} request {name} is FINISHED but is still queued or holds {blocks} blocks", when=when, name=n, blocks=s["blocks"]
            )
        if s["status"] != FINISHED and queued != 1:
            return tr(
                "{when} request {name} ({status}) is in waiting/running {queued} times; it should be in one, once",
                when=when,
                name=n,
                status=s["status"],
                queued=queued,
            )
        if phase == "after" and s["num_scheduled_tokens"]:
            return tr("{when} request {name} still has num_scheduled_tokens {n}", when=when, name=n, n=s["num_scheduled_tokens"])
        if (
            phase == "after"
            and n in rec["batch"]
            and s["status"] != FINISHED
            and s["num_computed_tokens"] <= rec["sched"]["seqs"][n]["num_computed_tokens"]
        ):
            return tr(
                "{when} request {name} was scheduled but its num_computed_tokens did not grow ({computed}): the loop makes no progress",
                when=when,
                name=n,
                computed=s["num_computed_tokens"],
            )
    ids = st["free_ids"] + [b for s in st["seqs"].values() for b in s["table"]]
    if len(ids) != cfg["num_blocks"] or sorted(ids) != list(range(cfg["num_blocks"])):
        return tr(
            "{when} free blocks + blocks in block tables should be every block exactly once ({n}); yours: {free} free + {held} held",
            when=when,
            n=cfg["num_blocks"],
            free=st["free"],
            held=len(ids) - st["free"],
        )
    if phase == "schedule":
        if len(rec["batch"]) > cfg["max_num_seqs"]:
            return tr("step {s} schedules {n} sequences, more than max_num_seqs", s=rec["step"], n=len(rec["batch"]))
        chunks = [st["seqs"].get(n, {}).get("num_scheduled_tokens", 0) for n in rec["batch"]]
        if rec["prefill"] and sum(chunks) > cfg["max_num_batched_tokens"]:
            return tr("step {s}'s prefill schedules {n} tokens, more than max_num_batched_tokens", s=rec["step"], n=sum(chunks))
        if not rec["prefill"] and any(c != 1 for c in chunks):
            return tr("step {s} decodes with num_scheduled_tokens {chunks}; a decode computes 1 token each", s=rec["step"], chunks=chunks)
        if not rec["batch"]:
            return tr("step {s} schedules nothing although requests are waiting or running", s=rec["step"])
    return None


def random_lifecycle(rnd: random.Random, name: str) -> dict:
    """A request's random life: admissions with block-aligned hits, chunks, decodes, waits and preemptions."""
    prompt, budget, bs = rnd.randint(1, 40), rnd.randint(1, 12), 4
    p, steps = start_progress(prompt), list[tuple]()
    while len(steps) < 30 and p["num_tokens"] - prompt < 8:
        roll = rnd.random()
        if p["num_computed_tokens"] and roll < 0.08:
            steps.append(("preempt",))
            p = {**p, "num_computed_tokens": 0}
            continue
        if roll < 0.15:
            steps.append((0,))
            continue
        hit = 0
        if not p["num_computed_tokens"]:
            hit = bs * rnd.randint(0, (p["num_tokens"] - 1) // bs)
        start = hit if not p["num_computed_tokens"] else p["num_computed_tokens"]
        n = min(p["num_tokens"] - start, budget)
        steps.append((n, hit))
        computed = start + n
        p = {**p, "num_computed_tokens": computed, "num_tokens": p["num_tokens"] + (computed == p["num_tokens"])}
    return lifecycle(name, prompt, steps)
