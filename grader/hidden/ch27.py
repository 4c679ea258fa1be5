"""Hidden checks of ch27 · the engine core loop: random request mixes and speculating requests from the grading
seed, traces compared with the reference, invariants checked on the student's own trace, edge cases and hundreds
of requests."""

from __future__ import annotations

from grader.authoring import CheckFailed, Trial, error_lines, expect_records, hidden, mistakes, raised
from grader.checks.ch27_explain import (
    check_spec_trace,
    check_structure,
    check_trace,
    drive_reference,
    drive_spec,
    rollback_hint,
    run_case,
    run_spec_case,
)
from grader.i18n import tr

NAMES = [chr(c) for c in range(ord("A"), ord("Z") + 1)]
M = mistakes("ch27")
EDGES: list[tuple[dict, list[tuple]]] = [
    ({"budget": 1, "max_num_seqs": 2}, [("add", "A", 3, 2, None), ("add", "B", 1, 2, None), ("drain",)]),
    ({"budget": 4, "max_num_seqs": 1}, [("add", "A", 1, 1, None), ("add", "B", 5, 3, 0), ("drain",)]),
    ({"budget": 2, "max_num_seqs": 3}, [("add", "A", 4, 3, 2), ("step", 1), ("add", "B", 2, 1, 0), ("drain",), ("step", 2)]),
]


# -- ch27.1 ---------------------------------------------------------------------------------------------------


@hidden("ch27.1", "random request mixes from the grading seed")
def random_mixes(t: Trial) -> None:
    for i in range(3):
        run_case(t, tr("random mix {n}", n=i + 1), random_config(t, False), random_script(t, t.random.randint(3, 7)))


@hidden("ch27.1", "invariants on your own trace: tokens in order, each emitted once, counters consistent")
def invariants(t: Trial) -> None:
    invariants_case(t, False)


@hidden("ch27.1", "edge cases: a budget of 1, max_tokens 1, one-token prompts, EOS first, idle steps")
def edges(t: Trial) -> None:
    for i, (config, script) in enumerate(EDGES):
        run_case(t, tr("edge {n}", n=i + 1), config | {"async": False}, script)


@hidden("ch27.1", "hundreds of requests through run()", time_limit=5.0)
def hundreds(t: Trial) -> None:
    run_many(t, False)


# -- ch27.2 ---------------------------------------------------------------------------------------------------


@hidden("ch27.2", "random request mixes from the grading seed")
def async_random_mixes(t: Trial) -> None:
    for i in range(3):
        run_case(t, tr("random mix {n}", n=i + 1), random_config(t, True), random_script(t, t.random.randint(3, 7)))


@hidden("ch27.2", "invariants on your own trace: placeholders resolve in order, nothing emitted twice")
def async_invariants(t: Trial) -> None:
    invariants_case(t, True)


@hidden("ch27.2", "edge cases: a budget of 1, max_tokens 1, one-token prompts, EOS first, idle steps")
def async_edges(t: Trial) -> None:
    for i, (config, script) in enumerate(EDGES):
        run_case(t, tr("edge {n}", n=i + 1), config | {"async": True}, script)


@hidden("ch27.2", "async scheduling changes when tokens arrive, not which tokens", time_limit=3.0)
def same_tokens(t: Trial) -> None:
    config = random_config(t, True)
    script = [op for op in random_script(t, 12) if op[0] == "add"] + [("run",)]
    want = t.ref.drive(sync_outputs, config, script)
    ops = t.ref.drive(drive_reference, config, script)["ops"]
    mine = expect_records(t.yours.replay(config, ops))
    if mine and raised(mine[-1]):
        raise CheckFailed(tr('case "same tokens": {config}, 12 requests', config=config), tr("your async run():"), *error_lines(mine[-1]))
    got = mine[-1].get("run") if mine else None
    if got != want:
        rid = next((r for r in want if not isinstance(got, dict) or got.get(r) != want[r]), None)
        yours = got.get(rid) if isinstance(got, dict) else got
        raise CheckFailed(
            tr('case "same tokens": {config}, 12 requests', config=config),
            tr(
                "with or without async scheduling every request gets the same tokens: {rid} gets {want} from the synchronous "
                "engine; your async run() gave it {yours}",
                rid=rid,
                want=want[rid],
                yours=repr(yours)[:200],
            ),
        )


@hidden("ch27.2", "hundreds of requests through run()", time_limit=5.0)
def async_hundreds(t: Trial) -> None:
    run_many(t, True)


SPEC_EDGES: list[tuple[tuple, list]] = [  # rounds (k, a), or (k, None): an output discarded
    (("A", 1, 6, None), [(0, 0)] + [(3, 0)] * 6),  # every draft rejected
    (("B", 5, 20, None), [(0, 0), (4, 4), (4, 4), (4, 4)]),  # every draft accepted: the bonus each time
    (("C", 3, 1, None), [(0, 0), (3, 3)]),  # max_tokens 1: the prefill finishes it
    (("D", 2, 10, 3), [(0, 0), (2, 2), (2, 2)]),  # EOS is the bonus token
    (("E", 2, 10, 2), [(0, 0), (3, 1)]),  # EOS is the correction of a rejected draft
    (("F", 4, 2, None), [(0, 0), (5, 5)]),  # the length cap at the first accepted draft
    (("G", 2, 10, None), [(0, 0), (4, 4), (1, None)]),  # one draft, its output discarded
    (("H", 6, 10, None), [(0, 0), (0, 0), (0, None)]),  # a decode without drafts, its output discarded
]


# -- ch27.3 ---------------------------------------------------------------------------------------------------


@hidden("ch27.3", "random speculating requests from the grading seed")
def spec_random(t: Trial) -> None:
    for i in range(4):
        run_spec_case(t, tr("random {n}", n=i + 1), *random_spec(t))


@hidden("ch27.3", "invariants on your own trace: 1 + k scheduled, drafts cleared, C = N − 1 after each step")
def spec_invariants(t: Trial) -> None:
    for i in range(3):
        request, rounds = random_spec(t, steps=12)
        drafts = t.ref.drive(drive_spec, request, rounds)
        head = tr(
            'case "spec invariants {n}": {rid}, prompt {prompt}, max_tokens {max_tokens}',
            n=i + 1,
            rid=request[0],
            prompt=request[1],
            max_tokens=request[2],
        )
        yours = expect_records(t.yours.replay_spec(drafts["config"], drafts["rounds"]), what="replay_spec")
        mine = [r for r in yours if not raised(r)]
        try:
            check_spec_invariants(mine, head)
        except CheckFailed as broken:
            if broken.hints:
                raise
            try:  # named by the first difference from the reference's trace of the same steps
                check_spec_trace(yours, drafts["rounds"], drafts["trace"], head)
            except CheckFailed as failure:
                raise broken.named_by(failure) from None
            raise
        if len(mine) < len(yours):
            raise CheckFailed(head, tr("step {n} of your own trace:", n=len(yours)), *error_lines(yours[-1]))


@hidden("ch27.3", "edge cases: drafts all rejected or all accepted, max_tokens 1, EOS as the bonus or the correction, outputs discarded")
def spec_edges(t: Trial) -> None:
    for i, (request, rounds) in enumerate(SPEC_EDGES):
        run_spec_case(t, tr("spec edge {n}", n=i + 1), request, rounds)


# -- helpers --------------------------------------------------------------------------------------------------


def random_config(t: Trial, asyn: bool) -> dict:
    return {"budget": t.random.choice([1, 2, 3, 4, 6, 8, 16, 32]), "max_num_seqs": t.random.randint(1, 4), "async": asyn}


def random_script(t: Trial, n: int, *, max_prompt: int = 12, max_out: int = 6, names: list | None = None) -> list[tuple]:
    """n requests with random prompts, max_tokens and EOS positions, arriving at random steps; then drain."""
    names = names or NAMES
    script: list[tuple] = []
    arrivals = sorted(t.random.randint(0, 2 * n) for _ in range(n))
    now = 0
    for i, at in enumerate(arrivals):
        if at > now:
            script.append(("step", at - now))
            now = at
        max_tokens = t.random.randint(1, max_out)
        eos = t.random.randrange(max_tokens) if t.random.random() < 0.3 else None
        script.append(("add", names[i], t.random.randint(1, max_prompt), max_tokens, eos))
    return script + [("drain",)]


def many(n: int) -> list[str]:
    return [f"R{i}" for i in range(n)]


def check_invariants(trace: list, ops: list, head: str, asyn: bool, drained: bool = True) -> None:
    """Properties of any correct trace, checked on the student's own one."""
    info = {op[1]: op for op in ops if op[0] == "add"}
    emitted: dict[str, list[int]] = {rid: [] for rid in info}
    samples: dict[tuple[str, int], int] = {}
    finished_at: dict[str, int] = {}
    for k, entry in enumerate(trace, 1):
        where = head + "\n" + tr("after step {k}", k=k)
        for b in entry["batches"]:
            for rid, (_, end) in b["positions"].items():
                if b["sampled_token_ids"].get(rid):
                    samples[rid, end] = b["sampled_token_ids"][rid][0]
        for o in entry.get("outputs", []):
            rid = o["request_id"]
            if rid in finished_at:
                raise CheckFailed(
                    where
                    + tr(
                        ": {rid} emitted {tokens} although it finished at step {k}", rid=rid, tokens=o["new_token_ids"], k=finished_at[rid]
                    ),
                    hint=M.stale_emitted,
                )
            emitted.setdefault(rid, []).extend(o["new_token_ids"])
            if o["finished"]:
                finished_at[rid] = k
        for rid, s in entry["requests"].items():
            _, _, prompt, max_tokens, eos = info[rid]
            outs = s["output_token_ids"]
            if "run" not in entry and emitted.get(rid, []) != outs:
                raise CheckFailed(
                    where
                    + tr(
                        ": {rid} has emitted {emitted} in all, but its output_token_ids are {outs}: every appended token is emitted "
                        "exactly once",
                        rid=rid,
                        emitted=emitted.get(rid, []),
                        outs=outs,
                    )
                )
            for i, tok in enumerate(outs):
                if samples.get((rid, len(prompt) + i)) != tok:
                    raise CheckFailed(
                        where
                        + tr(
                            ": {rid}'s output {i} is {tok}, but the worker sampled {sampled} for position {p}: tokens are appended "
                            "in position order (oldest batch first), each exactly once",
                            rid=rid,
                            i=i,
                            tok=tok,
                            sampled=samples.get((rid, len(prompt) + i)),
                            p=len(prompt) + i,
                        )
                    )
            for what, length_first in problems(rid, s, max_tokens, eos, asyn):
                raise CheckFailed(where + tr(": request {rid}: {what}", rid=rid, what=what), hint=M.length_first if length_first else "")
    last = trace[-1]["requests"] if trace and drained else {}
    left = [rid for rid, s in last.items() if not s["status"].startswith("FINISHED") or s["num_output_placeholders"]]
    if left:
        raise CheckFailed(
            head,
            tr(
                "at the end, {rid} is {status} with {ph} placeholders; a drained engine has finished every request and resolved "
                "every placeholder",
                rid=left[0],
                status=last[left[0]]["status"],
                ph=last[left[0]]["num_output_placeholders"],
            ),
        )


def problems(rid: str, s: dict, max_tokens: int, eos: int | None, asyn: bool):
    """What is wrong with one request's state, and whether it is the EOS-after-length-cap mistake (generated lazily,
    first problem first)."""
    outs, ph, done = s["output_token_ids"], s["num_output_placeholders"], s["status"].startswith("FINISHED")
    computed, tokens, status = s["num_computed_tokens"], s["num_tokens"], s["status"]
    if outs and tokens > computed + 1:
        yield (
            tr(
                "num_tokens {tokens} > num_computed_tokens {computed} + 1: an output beyond the scheduled boundary",
                tokens=tokens,
                computed=computed,
            ),
            False,
        )
    if computed > tokens + ph:
        yield (
            tr(
                "num_computed_tokens {computed} > num_tokens {tokens} + placeholders {ph}: scheduled beyond every token known or in flight",
                computed=computed,
                tokens=tokens,
                ph=ph,
            ),
            False,
        )
    if len(outs) > max_tokens:
        yield tr("{n} outputs, more than max_tokens {max_tokens}", n=len(outs), max_tokens=max_tokens), False
    if ph < 0 or ph > (2 if asyn else 0):
        yield tr("num_output_placeholders {ph} (at most {most} batches are in flight)", ph=ph, most=2 if asyn else 0), False
    if not done and outs and computed != tokens + ph - 1:
        yield (
            tr(
                "num_computed_tokens {computed} ≠ num_tokens {tokens} + placeholders {ph} − 1, the invariant of a generating request "
                "once its output is reconciled",
                computed=computed,
                tokens=tokens,
                ph=ph,
            ),
            False,
        )
    if status == "FINISHED_LENGTH_CAPPED" and len(outs) != max_tokens:
        yield tr("FINISHED_LENGTH_CAPPED with {n} of max_tokens {max_tokens} outputs", n=len(outs), max_tokens=max_tokens), False
    if status == "FINISHED_LENGTH_CAPPED" and outs and outs[-1] == eos:
        yield (
            tr(
                "FINISHED_LENGTH_CAPPED, but its last output is EOS {eos}: EOS is checked before the length cap, so it is FINISHED_STOPPED",
                eos=eos,
            ),
            True,
        )
    if status == "FINISHED_STOPPED" and (not outs or outs[-1] != eos or len(outs) > max_tokens):
        yield tr("FINISHED_STOPPED, but its outputs {outs} do not end in EOS {eos} within max_tokens", outs=outs[-3:], eos=eos), False
    if not done and outs and (len(outs) >= max_tokens or outs[-1] == eos):
        yield (
            tr(
                "still {status} after output {tok} (eos {eos}, {n} of max_tokens {max_tokens})",
                status=status,
                tok=outs[-1],
                eos=eos,
                n=len(outs),
                max_tokens=max_tokens,
            ),
            False,
        )


def invariants_case(t: Trial, asyn: bool) -> None:
    config = random_config(t, asyn) | {"budget": t.random.choice([3, 5, 8, 13])}
    script = random_script(t, 24)
    expected = t.ref.drive(drive_reference, config, script)
    ops = expected["ops"]
    head = tr('case "invariants": {config}, 24 random requests', config=config)
    yours = expect_records(t.yours.replay(config, ops))
    mine = [r for r in yours if not raised(r)]
    check_structure(mine, head)

    def named() -> CheckFailed | None:
        """The first difference from the reference's trace of the same operations, with the mistake it names."""
        try:
            check_trace(yours, ops, expected["trace"], head, asyn)
        except CheckFailed as failure:
            return failure
        return None

    try:
        check_invariants(mine, ops, head, asyn, drained=len(mine) == len(yours))
    except CheckFailed as broken:
        raise broken.named_by(named()) from None
    if len(mine) < len(yours):
        raise CheckFailed(head, tr("step {n} of your own trace:", n=len(yours)), *error_lines(yours[-1])).named_by(named())


def run_many(t: Trial, asyn: bool) -> None:
    n = t.random.randint(150, 250)
    config = {"budget": t.random.choice([8, 16, 32]), "max_num_seqs": t.random.choice([4, 8, 16]), "async": asyn}
    script = [op for op in random_script(t, n, names=many(n)) if op[0] == "add"] + [("run",)]
    run_case(t, tr("{n} requests", n=n), config, script)


def sync_outputs(ref, config: dict, script: list) -> dict:
    return drive_reference(ref, config | {"async": False}, script)["trace"][-1]["run"]


def random_spec(t: Trial, steps: int | None = None) -> tuple[tuple, list[tuple[int, int | None]]]:
    """A random speculating request and its steps: the prefill, then (k drafts, a right), a often 0 or k; at times a
    last step whose output is discarded (k, None)."""
    max_tokens = t.random.randint(1, 24)
    eos = t.random.randrange(max_tokens) if t.random.random() < 0.4 else None
    rounds: list[tuple[int, int | None]] = [(0, 0)]
    for _ in range(steps or t.random.randint(2, 8)):
        k = t.random.randint(0, 5)
        rounds.append((k, t.random.choice([0, k, t.random.randint(0, k)])))
    if t.random.random() < 0.3:  # the last step's output comes back empty (preempted or aborted meanwhile)
        rounds.append((t.random.randint(0, 5), None))
    return (t.random.choice(NAMES), t.random.randint(1, 12), max_tokens, eos), rounds


def check_spec_invariants(trace: list, head: str) -> None:
    """Properties of any correct spec trace, checked on the student's own one."""
    generated: list[int] = []
    for k, r in enumerate(trace, 1):
        where = head + "\n" + tr("after step {k} (drafts {drafts})", k=k, drafts=r["drafts"])
        b, s, u = r["before"], r["after_schedule"], r["after_update"]
        n = r["scheduled"]["num_scheduled_tokens"] if isinstance(r["scheduled"], dict) else r["scheduled"]
        if n != b["num_tokens_with_spec"] - b["num_computed_tokens"]:
            raise CheckFailed(
                where,
                tr(
                    "scheduled {n} tokens; num_tokens_with_spec − num_computed_tokens = {with_spec} − {computed}",
                    n=repr(n),
                    with_spec=b["num_tokens_with_spec"],
                    computed=b["num_computed_tokens"],
                ),
                hint=M.drafts_not_scheduled,
            )
        if s["spec_token_ids"]:
            raise CheckFailed(
                where, tr("spec_token_ids is still {spec} right after schedule_spec", spec=s["spec_token_ids"]), hint=M.spec_not_cleared
            )
        if not r["generated"]:  # the output was discarded: nothing verified, nothing to roll back or append
            if u != s or r["new_token_ids"]:
                raise CheckFailed(
                    where,
                    tr(
                        "the step's output came back empty (discarded): update_spec must leave the request as schedule_spec left "
                        "it, {computed} computed and outputs ending {outs}; yours: {yours_computed} computed, outputs ending "
                        "{yours_outs}, returned {returned}",
                        computed=s["num_computed_tokens"],
                        outs=s["output_token_ids"][-4:],
                        yours_computed=u["num_computed_tokens"],
                        yours_outs=u["output_token_ids"][-4:],
                        returned=repr(r["new_token_ids"])[:80],
                    ),
                    hint=M.rollback_without_output if u["num_computed_tokens"] != s["num_computed_tokens"] else "",
                )
            continue
        generated += r["generated"]
        outs = u["output_token_ids"]
        if outs != generated[: len(outs)] or (u["status"] == "RUNNING" and outs != generated):
            raise CheckFailed(
                where,
                tr(
                    "the target model generated {generated} so far; your outputs end {outs}: every generated token is appended in "
                    "order, until a stop",
                    generated=generated[-8:],
                    outs=outs[-8:],
                ),
            )
        if u["status"] == "RUNNING" and u["num_computed_tokens"] != u["num_tokens"] - 1:
            raise CheckFailed(
                where,
                tr(
                    "num_computed_tokens {computed} ≠ num_tokens {tokens} − 1: after a verified step a running request has computed "
                    "every token but its newest",
                    computed=u["num_computed_tokens"],
                    tokens=u["num_tokens"],
                ),
                hint=rollback_hint(
                    u["num_computed_tokens"], s["num_computed_tokens"], len(r["drafts"]), len(r["generated"]), len(r["generated"])
                ),
            )
