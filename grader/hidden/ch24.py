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

# -- ch24.1 ---------------------------------------------------------------------------------------------------


@hidden("ch24.1", "hundreds of requests under memory pressure (preemption)", time_limit=30)
def random_memory_pressure(t: Trial) -> None:
    expect_trace(
        t,
        random_script(
            t.random,
            "memory pressure",
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
            "token budget 1",
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
            "token budget 5",
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
            "short requests",
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
            "one sequence per batch",
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
            "block_size 1",
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
            "block-aligned prompts",
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
            "fills the pool",
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
        "invariants",
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
            raise CheckFailed(describe_case(sc), f"step {k + 1} of your own trace:", *error_lines(rec))
    if yours and yours[-1].get("step", 0) >= limit:
        raise CheckFailed(describe_case(sc), f"after {limit} steps some requests have not finished").named_by(named())


# -- ch24.2 ---------------------------------------------------------------------------------------------------


@hidden("ch24.2", "random request lives from the grading seed")
def random_lives(t: Trial) -> None:
    for i in range(25):
        run_lifecycle(t, random_lifecycle(t.random, f"random life {i + 1}"))


@hidden("ch24.2", "edge cases: the largest allowed hit, a 1-token prompt, preemption before any output")
def progress_edges(t: Trial) -> None:
    run_lifecycle(t, lifecycle("hit of num_tokens − 1", 13, [(1, 12), (1,)]))
    run_lifecycle(t, lifecycle("1-token prompt", 1, [(1,), (1,), ("preempt",), (2,), (1,)]))
    run_lifecycle(t, lifecycle("preempted mid-prefill", 12, [(5,), ("preempt",), (0,), (8, 4), (1,)]))


@hidden("ch24.2", "invariants of your counters along random lives")
def progress_invariants(t: Trial) -> None:
    for i in range(12):
        case = random_lifecycle(t.random, f"life {i + 1}")
        p = start_progress(case["prompt"])
        cached_set = False
        for k, step in enumerate(case["steps"]):
            args, kwargs = step_args(step)
            got = expect_progress(t.yours.progress_after_step(dict(p), *args, **kwargs), case["name"])
            want = t.ref.progress_after_step(dict(p), *args, **kwargs)
            where = f'case "{case["name"]}" step {k + 1} ({", ".join(f"{x} {p[x]}" for x in KEYS)} before)'
            # A broken property is named by the mistake the step's comparison with the reference finds.
            named = explain_progress(case, k, p, step, want, got) if any(got[x] != want[x] for x in KEYS) else None
            if not 0 <= got["num_computed_tokens"] <= got["num_tokens"]:
                raise CheckFailed(
                    f"{where}: num_computed_tokens {got['num_computed_tokens']} must stay within 0 … num_tokens {got['num_tokens']}"
                ).named_by(named)
            if got["num_tokens"] < p["num_tokens"] or got["num_tokens"] > p["num_tokens"] + 1:
                raise CheckFailed(
                    f"{where}: num_tokens went from {p['num_tokens']} to {got['num_tokens']}; "
                    "a step appends at most one token and never removes one"
                ).named_by(named)
            if got["num_prompt_tokens"] != p["num_prompt_tokens"]:
                raise CheckFailed(f"{where}: num_prompt_tokens changed").named_by(named)
            if cached_set and got["num_cached_tokens"] != p["num_cached_tokens"]:
                raise CheckFailed(
                    f"{where}: num_cached_tokens changed from {p['num_cached_tokens']} to "
                    f"{got['num_cached_tokens']}; it is set once, at the first admission"
                ).named_by(named)
            cached_set = got["num_cached_tokens"] >= 0
            p = want  # go on from the right state


@hidden("ch24.2", "the counters agree with the scheduler's trace (no prefix cache: hits are 0)")
def agrees_with_scheduler(t: Trial) -> None:
    sc = random_script(
        t.random,
        "scheduler trace",
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
                case = {"name": f"{sc['name']}, request {n} at step {rec['step']}", "prompt": prompts[n]}
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
    when = f"after step {rec['step']}'s {'schedule()' if phase == 'schedule' else 'postprocess()'}"
    reqs = {r["name"]: r for r in sc["requests"]}
    for n, s in st["seqs"].items():
        if not 0 <= s["num_computed_tokens"] <= s["num_tokens"]:
            return f"{when} request {n} has num_computed_tokens {s['num_computed_tokens']} > num_tokens {s['num_tokens']}"
        if s["num_computed_tokens"] + s["num_scheduled_tokens"] > s["num_tokens"]:
            return (
                f"{when} request {n} schedules {s['num_scheduled_tokens']} tokens after {s['num_computed_tokens']} "
                f"computed, beyond its {s['num_tokens']} tokens"
            )
        if len(s["completion"]) > reqs[n]["max_tokens"]:
            return f"{when} request {n} has {len(s['completion'])} completion tokens, more than max_tokens"
        queued = st["waiting"].count(n) + st["running"].count(n)
        if s["status"] == FINISHED and (queued or s["blocks"]):
            return f"{when} request {n} is FINISHED but is still queued or holds {s['blocks']} blocks"
        if s["status"] != FINISHED and queued != 1:
            return f"{when} request {n} ({s['status']}) is in waiting/running {queued} times; it should be in one, once"
        if phase == "after" and s["num_scheduled_tokens"]:
            return f"{when} request {n} still has num_scheduled_tokens {s['num_scheduled_tokens']}"
        if (
            phase == "after"
            and n in rec["batch"]
            and s["status"] != FINISHED
            and s["num_computed_tokens"] <= rec["sched"]["seqs"][n]["num_computed_tokens"]
        ):
            return (
                f"{when} request {n} was scheduled but its num_computed_tokens did not grow "
                f"({s['num_computed_tokens']}): the loop makes no progress"
            )
    ids = st["free_ids"] + [b for s in st["seqs"].values() for b in s["table"]]
    if len(ids) != cfg["num_blocks"] or sorted(ids) != list(range(cfg["num_blocks"])):
        return (
            f"{when} free blocks + blocks in block tables should be every block exactly once "
            f"({cfg['num_blocks']}); yours: {st['free']} free + {len(ids) - st['free']} held"
        )
    if phase == "schedule":
        if len(rec["batch"]) > cfg["max_num_seqs"]:
            return f"step {rec['step']} schedules {len(rec['batch'])} sequences, more than max_num_seqs"
        chunks = [st["seqs"].get(n, {}).get("num_scheduled_tokens", 0) for n in rec["batch"]]
        if rec["prefill"] and sum(chunks) > cfg["max_num_batched_tokens"]:
            return f"step {rec['step']}'s prefill schedules {sum(chunks)} tokens, more than max_num_batched_tokens"
        if not rec["prefill"] and any(c != 1 for c in chunks):
            return f"step {rec['step']} decodes with num_scheduled_tokens {chunks}; a decode computes 1 token each"
        if not rec["batch"]:
            return f"step {rec['step']} schedules nothing although requests are waiting or running"
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
