"""ch24's traces, shared by its public and hidden checks: scripts of arriving requests, the comparison of the
student's trace with the reference's (`grader.authoring.trace`; both run the provided `replay`, which carries
the simulated runner), and the explanation of the first step where their observable states differ.

A step is one round of the loop: schedule(), the runner, postprocess(). Its record holds the state after
schedule() ("sched") and after postprocess() ("after"); the schedule phase is compared first.
"""

from __future__ import annotations

from grader.authoring import CheckFailed, Trial, compare_trace, mistakes
from grader.i18n import tr, tr_in

WAITING, RUNNING, FINISHED = "WAITING", "RUNNING", "FINISHED"
FIELDS = ("num_computed_tokens", "num_tokens", "completion", "status", "num_scheduled_tokens", "blocks")
M = mistakes("ch24")


# -- scripts --------------------------------------------------------------------------------------------
def request(
    name: str,
    prompt: list[int],
    max_tokens: int,
    outputs: list[int],
    *,
    arrive: int = 0,
    candidates: dict[int, int] | None = None,
    ignore_eos: bool = False,
) -> dict:
    """One request of a script. outputs[k] is what the runner samples when the request has k completion
    tokens and its step reaches num_tokens; candidates[end] what it samples for a chunk ending at `end`
    that leaves the prompt unfinished (a throw-away prediction; 50 + end when not given)."""
    return {
        "name": name,
        "prompt": list(prompt),
        "max_tokens": max_tokens,
        "outputs": list(outputs),
        "arrive": arrive,
        "candidates": {str(k): v for k, v in (candidates or {}).items()},
        "ignore_eos": ignore_eos,
    }


def script(
    name: str, requests: list[dict], *, num_blocks: int, block_size: int, max_num_seqs: int, max_num_batched_tokens: int, eos: int
) -> dict:
    return {
        "name": name,
        "requests": requests,
        "config": {
            "num_blocks": num_blocks,
            "block_size": block_size,
            "max_num_seqs": max_num_seqs,
            "max_num_batched_tokens": max_num_batched_tokens,
            "eos": eos,
        },
    }


# -- running a script on both sides ------------------------------------------------------------------------
def expect_trace(t: Trial, sc: dict) -> list[dict]:
    """The student's trace of `sc` against the reference's (both through the provided replay); the first
    difference is explained."""
    expected = t.ref.replay(sc)
    return check_trace(sc, t.yours.replay(sc, len(expected) + 1), expected)


def check_trace(sc: dict, yours: object, expected: list[dict]) -> list[dict]:
    """`grader.authoring.trace.compare` with ch24's words: the case, each step, each difference."""
    n = len(expected)
    return compare_trace(
        yours,
        expected,
        case=describe_case(sc),
        partial=True,
        describe=lambda k: step_text(expected[k], expected[k - 1] if k else None),
        explain=lambda k, mine, want: first_difference(sc, want, mine, expected[k - 1] if k else None),
        beyond=lambda rec: (
            tr(
                "every request has finished after step {n} (is_finished() is True); yours schedules a prefill of {batch}",
                n=n,
                batch=names(rec["batch"]),
            )
            if rec["prefill"]
            else tr(
                "every request has finished after step {n} (is_finished() is True); yours schedules a decode of {batch}",
                n=n,
                batch=names(rec["batch"]),
            )
        ),
    )


# -- describing -----------------------------------------------------------------------------------------------
def names(xs: list[str]) -> str:
    return "[" + ", ".join(xs) + "]" if len(xs) <= 12 else f"[{', '.join(xs[:10])}, … ({len(xs)})]"


def describe_case(sc: dict) -> str:
    c, reqs = sc["config"], sc["requests"]
    cfg = tr(
        "block_size {block_size}, {num_blocks} blocks, max_num_seqs {max_num_seqs}, "
        "max_num_batched_tokens {max_num_batched_tokens}, eos {eos}",
        **c,
    )
    if len(reqs) <= 5:
        who = tr_in("ch24.separator", "; ").join(request_text(r) for r in reqs)
    else:
        lens, mts = [len(r["prompt"]) for r in reqs], [r["max_tokens"] for r in reqs]
        who = tr(
            "{n} requests, prompts of {shortest}–{longest} tokens, max_tokens {least}–{most}, arriving over rounds 0–{last}",
            n=len(reqs),
            shortest=min(lens),
            longest=max(lens),
            least=min(mts),
            most=max(mts),
            last=max(r["arrive"] for r in reqs),
        )
    return tr('case "{name}": {config}', name=tr(sc["name"]), config=cfg) + f"\n  {who}"


def request_text(r: dict) -> str:
    """One request of a case: "A: 3-token prompt, max_tokens 4, arrives at round 2"."""
    text = tr("{name}: {n}-token prompt, max_tokens {max_tokens}", name=r["name"], n=len(r["prompt"]), max_tokens=r["max_tokens"])
    if r["ignore_eos"]:
        text = tr("{request}, ignore_eos", request=text)
    if r["arrive"]:
        text = tr("{request}, arrives at round {round}", request=text, round=r["arrive"])
    return text


def chunk_text(n: str, s: dict) -> str:
    c, k, total = s["num_computed_tokens"], s["num_scheduled_tokens"], s["num_tokens"]
    if k > 1:
        return tr("{name}: tokens {first}–{last} of {total}", name=n, first=c, last=c + k - 1, total=total)
    return tr("{name}: token {first} of {total}", name=n, first=c, total=total)


def step_text(rec: dict, prev: dict | None) -> str:
    """What the reference did in a step: its schedule(), the queues before it, what the runner returned."""
    kind = "prefill" if rec["prefill"] else "decode"
    chunks = [chunk_text(n, rec["sched"]["seqs"][n]) for n in rec["batch"][:6]]
    if len(rec["batch"]) > 6:
        chunks.append(tr("… ({n} sequences in all)", n=len(rec["batch"])))
    lines = [f"schedule() → {kind} [{', '.join(chunks)}]", "  " + before_text(prev, rec)]
    said = []
    for n, tok in list(zip(rec["batch"], rec["tokens"]))[:6]:
        s = rec["sched"]["seqs"][n]
        partial = s["num_computed_tokens"] + s["num_scheduled_tokens"] < s["num_tokens"]
        said.append(tr("{name} → {token} (candidate of an unfinished chunk)", name=n, token=tok) if partial else f"{n} → {tok}")
    returned = ", ".join(said) + (", …" if len(rec["batch"]) > 6 else "")
    lines.append("  " + tr("the runner returned {tokens}", tokens=returned))
    return "\n".join(lines)


def before_text(prev: dict | None, rec: dict) -> str:
    waiting = (prev["after"]["waiting"] if prev else []) + rec["added"]
    running = prev["after"]["running"] if prev else []
    free = prev["after"]["free"] if prev else None
    if free is None:
        return tr("before it: waiting {waiting}, running {running}", waiting=names(waiting), running=names(running))
    return tr(
        "before it: waiting {waiting}, running {running}, {free} free blocks", waiting=names(waiting), running=names(running), free=free
    )


# -- comparing one step and explaining the first difference ----------------------------------------------
def first_difference(sc: dict, want: dict, got: dict, prev: dict | None) -> CheckFailed | None:
    """The failure explaining the first difference between the reference's step and the student's (their
    schedule phase first, then what postprocess left), or None. A step of the student's that raised after
    schedule() is compared as far as it went."""
    if "sched" not in got:
        return None
    found = schedule_difference(sc, want, got, prev)
    if found is None and "after" in got:
        found = after_difference(sc, want, got)
    return found


def schedule_difference(sc: dict, want: dict, got: dict, prev: dict | None) -> CheckFailed | None:
    cfg, ws, gs = sc["config"], want["sched"], got["sched"]
    s = want["step"]
    before_running = prev["after"]["running"] if prev else []
    if want["prefill"] != got["prefill"]:
        head = (prev["after"]["waiting"] if prev else []) + want["added"]
        if want["prefill"]:
            return CheckFailed(
                tr("step {s} should be a prefill of {want}; yours decodes {got}", s=s, want=names(want["batch"]), got=names(got["batch"])),
                hint=M.decode_first,
            )
        return CheckFailed(
            tr("step {s} should decode {want}; yours prefills {got}", s=s, want=names(want["batch"]), got=names(got["batch"])),
            hint=M.prefill_without_blocks.format(head=head[0], free=prev["after"]["free"] if prev else "?") if head else "",
        )
    if want["batch"] != got["batch"]:
        return batch_difference(cfg, want, got, before_running)
    for n in want["batch"]:
        a, b = ws["seqs"][n]["num_scheduled_tokens"], gs["seqs"][n]["num_scheduled_tokens"]
        if a != b:
            st = ws["seqs"][n]
            if not want["prefill"]:
                return CheckFailed(
                    tr(
                        "after step {s}'s schedule() request {name} should have num_scheduled_tokens 1; yours has {got}", s=s, name=n, got=b
                    ),
                    hint=M.decode_one_token,
                )
            left = st["num_tokens"] - st["num_computed_tokens"]
            used = sum(ws["seqs"][m]["num_scheduled_tokens"] for m in want["batch"][: want["batch"].index(n)])
            budget = cfg["max_num_batched_tokens"] - used
            return CheckFailed(
                tr(
                    "after step {s}'s schedule() request {name} should have num_scheduled_tokens "
                    "min(tokens left {left}, budget left {budget}) = {want}; yours has {got}",
                    s=s,
                    name=n,
                    left=left,
                    budget=budget,
                    want=a,
                    got=b,
                ),
                hint=M.chunk_over_budget if b > budget else M.chunk_recounts_prompt if b > left else "",
            )
    if (ws["waiting"], ws["running"]) != (gs["waiting"], gs["running"]):
        return queue_difference(want, got, before_running)
    return fields_difference(want, got, ws, gs, tr("after step {s}'s schedule()", s=s), sc, "schedule")


def batch_difference(cfg: dict, want: dict, got: dict, before_running: list[str]) -> CheckFailed:
    s, w, g = want["step"], want["batch"], got["batch"]
    what = (
        tr("step {s}'s prefill batch should be {want}; yours is {got}", s=s, want=names(w), got=names(g))
        if want["prefill"]
        else tr("step {s}'s decode batch should be {want}; yours is {got}", s=s, want=names(w), got=names(g))
    )
    k = next((i for i, (a, b) in enumerate(zip(w, g)) if a != b), min(len(w), len(g)))
    ws = want["sched"]
    if not want["prefill"]:
        lost = [n for n in w if n not in g and n in got["sched"]["waiting"]]
        holding = [n for n in got["sched"]["waiting"] if n in before_running and got["sched"]["seqs"].get(n, {}).get("blocks")]
        if lost and holding:  # a victim that kept its blocks freed nothing, so more had to go
            return CheckFailed(what, hint=M.preempt_keeps_blocks)
        if lost:
            victims = [n for n in ws["waiting"] if n in before_running]
            return CheckFailed(
                what,
                hint=M.victim_next_in_line.format(name=lost[0], victim=victims[-1])
                if victims
                else M.needless_preemption.format(name=lost[0]),
            )
        preempted = [n for n in g if n in ws["waiting"]]
        if preempted:
            return CheckFailed(what, hint=M.no_preemption.format(name=preempted[0]))
        if len(g) > cfg["max_num_seqs"]:
            return CheckFailed(what, hint=M.max_num_seqs.format(n=cfg["max_num_seqs"]))
        return CheckFailed(what, hint=M.decode_order)
    if len(g) > cfg["max_num_seqs"]:
        return CheckFailed(what, hint=M.max_num_seqs.format(n=cfg["max_num_seqs"]))
    head = ws["waiting"][0] if ws["waiting"] else None  # where the reference stopped
    if k == len(w) and head is not None:
        used = sum(ws["seqs"][n]["num_scheduled_tokens"] for n in w)
        left = cfg["max_num_batched_tokens"] - used
        h = ws["seqs"][head]
        need = h["num_tokens"] - h["num_computed_tokens"]
        if g[k] != head:
            return CheckFailed(what, hint=M.skip_head.format(head=head, next=g[k]))
        if left == 0:
            return CheckFailed(what, hint=M.budget_used_up.format(budget=cfg["max_num_batched_tokens"]))
        if need > left:
            return CheckFailed(what, hint=M.second_chunked.format(head=head, need=need, left=left))
        return CheckFailed(what, hint=M.admit_without_blocks.format(head=head, tokens=h["num_tokens"], free=ws["free"]))
    if k < len(w) and k < len(g) and g[k] not in w:
        return CheckFailed(what, hint=M.fcfs_order.format(first=w[k]))
    if k == len(g) < len(w):
        left = cfg["max_num_batched_tokens"] - sum(ws["seqs"][n]["num_scheduled_tokens"] for n in w[:k])
        return CheckFailed(what, hint=M.stops_early.format(name=w[k], n=ws["seqs"][w[k]]["num_scheduled_tokens"], left=left))
    return CheckFailed(what)


def queue_difference(want: dict, got: dict, before_running: list[str]) -> CheckFailed:
    s, ws, gs = want["step"], want["sched"], got["sched"]
    what = queues_text(tr("after step {s}'s schedule()", s=s), ws, gs)
    victims_w = [n for n in ws["waiting"] if n in before_running]
    victims_g = [n for n in gs["waiting"] if n in before_running]
    if set(victims_w) != set(victims_g) and victims_g:
        if victims_w and before_running.index(victims_g[0]) < before_running.index(victims_w[0]):
            return CheckFailed(what, hint=M.head_victim.format(victim=victims_w[0]))
        return CheckFailed(what, hint=M.wrong_victim)
    if victims_w and set(victims_w) == set(victims_g):
        return CheckFailed(what, hint=M.victim_to_back)
    for n in want["batch"]:
        in_run_w, in_run_g = n in ws["running"], n in gs["running"]
        if in_run_w and not in_run_g:
            return CheckFailed(what, hint=M.running_too_late.format(name=n))
        if in_run_g and not in_run_w:
            return CheckFailed(what, hint=M.running_too_early.format(name=n))
    if not want["prefill"]:
        return CheckFailed(what, hint=M.batch_back_left)
    return CheckFailed(what)


def fields_difference(want: dict, got: dict, ws: dict, gs: dict, when: str, sc: dict, phase: str) -> CheckFailed | None:
    order = want["batch"] + [n for n in ws["seqs"] if n not in want["batch"]]
    for n in order:
        f = differing_field(ws["seqs"][n], gs["seqs"][n])
        if f:
            return field_message(when, n, f, ws["seqs"][n], gs["seqs"][n], want, sc, phase)
    if ws["free"] != gs["free"]:
        return CheckFailed(
            tr("{when} the pool should have {want} free blocks; yours has {got}", when=when, want=ws["free"], got=gs["free"]),
            hint=M.blocks_lost,
        )
    if ws["finished"] != gs["finished"]:
        return CheckFailed(
            tr("{when} is_finished() should be {want}; yours is {got}", when=when, want=ws["finished"], got=gs["finished"]),
            hint=M.is_finished,
        )
    return None


def differing_field(a: dict, b: dict) -> str | None:
    """The first field of a sequence's state that differs. A finished sequence's num_computed_tokens is not
    compared: its blocks are gone (nano-vllm's deallocate zeroes it, the course's allocator leaves it)."""
    finished = a["status"] == b["status"] == FINISHED
    return next((f for f in FIELDS if a[f] != b[f] and not (finished and f == "num_computed_tokens")), None)


def field_message(when: str, n: str, f: str, a: dict, b: dict, want: dict, sc: dict, phase: str) -> CheckFailed:
    """Why field `f` of request `n` should be `a[f]` (the student's: `b[f]`), `when` in the step."""
    req = next(r for r in sc["requests"] if r["name"] == n)
    sched = want["sched"]["seqs"][n]
    chunk = sched["num_scheduled_tokens"]
    before = sched["num_computed_tokens"]
    in_batch = n in want["batch"]
    partial = in_batch and want["prefill"] and before + chunk < sched["num_tokens"]
    tok = want["tokens"][want["batch"].index(n)] if in_batch else None
    after = phase == "after"
    show = lambda v: names([str(x) for x in v]) if isinstance(v, list) else str(v)
    fields = {"when": when, "name": n, "status": a["status"], "field": f, "want": show(a[f]), "got": show(b[f])}
    what = (
        tr("{when} request {name} should be {status} with {field} {want}; yours has {got}", **fields)
        if f != "status"
        else tr("{when} request {name} should be {status}; yours is {got}", when=when, name=n, status=a["status"], got=b["status"])
    )
    hint = ""
    if f == "num_computed_tokens":
        if not after and b[f] == before + chunk and chunk:
            hint = M.computed_in_schedule
        elif after and b[f] == before and chunk:
            what = tr("{when} request {name} should be {status} with {field} {want}; yours has {got}: the chunk was not counted", **fields)
            hint = M.chunk_not_counted
        elif b[f] == before + 1 and chunk > 1:
            hint = M.count_one.format(chunk=chunk)
        elif a[f] == 0 and b[f] > 0:
            hint = M.preempt_keeps_computed
        elif b[f] == a["num_tokens"] or b[f] == b["num_tokens"]:
            hint = M.computed_includes_sample
    elif f == "num_tokens" or f == "completion":
        if b["num_tokens"] == a["num_tokens"] + 1 and partial:
            what = tr(
                "{when} request {name} should be {status} with num_tokens {want}; yours has {got}: "
                "the candidate token of an unfinished chunk was appended",
                when=when,
                name=n,
                status=a["status"],
                want=a["num_tokens"],
                got=b["num_tokens"],
            )
            hint = M.append_candidate.format(name=n, computed=before + chunk, total=sched["num_tokens"])
        elif b["num_tokens"] == a["num_tokens"] - 1:
            what = tr(
                "{when} request {name} should be {status} with num_tokens {want}; yours has {got}: "
                "the sampled token {token} was not appended",
                when=when,
                name=n,
                status=a["status"],
                want=a["num_tokens"],
                got=b["num_tokens"],
                token=tok,
            )
            hint = M.eos_not_appended if tok == sc["config"]["eos"] and b["status"] == FINISHED else M.token_not_appended
        elif f == "completion":
            hint = M.wrong_token
    elif f == "status":
        if a["status"] == FINISHED:
            last = a["completion"][-1] if a["completion"] else None
            hint = (
                M.eos_ignored
                if last == sc["config"]["eos"] and not req["ignore_eos"]
                else M.max_tokens_missed.format(max_tokens=req["max_tokens"])
            )
        elif b["status"] == FINISHED:
            hint = (
                M.eos_candidate_finishes
                if partial
                else M.ignore_eos_ignored
                if req["ignore_eos"] and tok == sc["config"]["eos"]
                else M.max_tokens_total.format(max_tokens=req["max_tokens"], n=len(a["completion"]))
            )
        elif a["status"] == RUNNING and b["status"] == WAITING and in_batch:
            hint = M.running_status_late
        elif a["status"] == WAITING and b["status"] == RUNNING and in_batch:
            hint = M.running_status_early
        elif a["status"] == WAITING:
            hint = M.preempted_status
    elif f == "blocks":
        if a[f] == 0 and a["status"] == FINISHED:
            hint = M.no_free_on_finish
        elif a[f] == 0:
            hint = M.preempt_keeps_blocks
        elif in_batch and not want["prefill"] and b[f] == a[f] - 1:
            hint = M.no_may_append
        elif in_batch and b[f] < a[f]:
            hint = M.chunk_blocks
    elif f == "num_scheduled_tokens" and a[f] == 0:
        hint = M.scheduled_not_reset if after else M.scheduled_leftover
    return CheckFailed(what, hint=hint)


def after_difference(sc: dict, want: dict, got: dict) -> CheckFailed | None:
    wa, ga = want["after"], got["after"]
    when = tr("after step {s}", s=want["step"])
    for n in want["batch"] + [n for n in wa["seqs"] if n not in want["batch"]]:
        f = differing_field(wa["seqs"][n], ga["seqs"][n])
        if f:
            return field_message(when, n, f, wa["seqs"][n], ga["seqs"][n], want, sc, "after")
    if (wa["waiting"], wa["running"]) != (ga["waiting"], ga["running"]):
        gone = [n for n in ga["running"] if n in wa["seqs"] and wa["seqs"][n]["status"] == FINISHED]
        return CheckFailed(queues_text(when, wa, ga), hint=M.finished_in_running.format(name=gone[0]) if gone else "")
    return fields_difference(want, got, wa, ga, when, sc, "after")


def queues_text(when: str, want: dict, got: dict) -> str:
    return tr(
        "{when} waiting should be {waiting} and running {running}; yours: waiting {got_waiting}, running {got_running}",
        when=when,
        waiting=names(want["waiting"]),
        running=names(want["running"]),
        got_waiting=names(got["waiting"]),
        got_running=names(got["running"]),
    )


# -- ch24.2: a request's life through progress_after_step --------------------------------------------------
KEYS = ("num_prompt_tokens", "num_tokens", "num_computed_tokens", "num_cached_tokens")


def lifecycle(name: str, prompt: int, steps: list[tuple]) -> dict:
    """A request's life as steps (num_scheduled, prefix_hit, preempted); ("preempt",) for a preemption."""
    out = []
    for s in steps:
        out.append(
            {"n": 0, "hit": 0, "preempted": True}
            if s == ("preempt",)
            else {"n": s[0], "hit": s[1] if len(s) > 1 else 0, "preempted": False}
        )
    return {"name": name, "prompt": prompt, "steps": out}


def start_progress(prompt: int) -> dict:
    return {"num_prompt_tokens": prompt, "num_tokens": prompt, "num_computed_tokens": 0, "num_cached_tokens": -1}


def step_args(step: dict) -> tuple[tuple, dict]:
    return (step["n"],), {"prefix_hit": step["hit"], "preempted": step["preempted"]}


def event_text(step: dict, before: dict) -> str:
    if step["preempted"]:
        return tr("preempted")
    if not step["n"]:
        return tr("not scheduled (waiting)")
    if before["num_computed_tokens"] != 0:
        return tr("{n} tokens scheduled", n=step["n"])
    if step["hit"]:
        return tr("admitted with a prefix hit of {hit}, {n} tokens scheduled", hit=step["hit"], n=step["n"])
    return tr("admitted (no prefix hit), {n} tokens scheduled", n=step["n"])


def explain_progress(case: dict, k: int, before: dict, step: dict, want: dict, got: dict) -> CheckFailed:
    """Why the counters after step k should be `want`, and what the student's `got` most likely missed."""
    key = next(x for x in KEYS if want[x] != got[x])
    c, total, cached, n, hit = (before["num_computed_tokens"], before["num_tokens"], before["num_cached_tokens"], step["n"], step["hit"])
    admit = n > 0 and c == 0 and not step["preempted"]
    start = hit if admit else c
    hint = ""
    if key == "num_computed_tokens":
        if step["preempted"]:
            why = tr("a preemption frees the request's KV: it is recomputed from 0")
            hint = M.progress_preempt_keeps
        elif not n:
            why = tr("the request was not scheduled, so nothing changes")
        else:
            why = (
                tr("admission starts from the prefix hit: {hit} + {n} = {total}", hit=hit, n=n, total=want[key])
                if admit
                else tr("{c} computed + {n} scheduled = {total}", c=c, n=n, total=want[key])
            )
            if admit and got[key] == n:
                hint = M.hit_ignored
            elif got[key] == c:
                hint = M.progress_not_counted
            elif got[key] == want["num_tokens"]:
                hint = M.progress_computed_includes_sample
    elif key == "num_tokens":
        if step["preempted"]:
            why = tr("a preemption keeps every token the request has (prompt and outputs)")
            hint = M.preempt_resets_only_computed
        elif not n:
            why = tr("the request was not scheduled, so nothing changes")
        elif want[key] == total + 1:
            why = tr(
                "{start} + {n} = {end} = num_tokens: the step computed every known token, so its sampled token is kept: "
                "{total} + 1 = {want}",
                start=start,
                n=n,
                end=start + n,
                total=total,
                want=want[key],
            )
            hint = M.progress_sample_dropped if got[key] == total else ""
        else:
            why = tr(
                "{start} + {n} = {end} < num_tokens {total}: an unfinished prefill chunk, its sample is thrown away, "
                "num_tokens stays {total}",
                start=start,
                n=n,
                end=start + n,
                total=total,
            )
            hint = M.keep_every_sample if got[key] == total + 1 else M.progress_tokens_computed if got[key] == total + n else ""
    elif key == "num_cached_tokens":
        if admit and cached < 0:
            why = tr("the first admission sets it, once, to the prefix hit: {hit}", hit=hit)
            if got[key] == want["num_computed_tokens"]:
                hint = M.cached_is_computed
        else:
            why = tr("it was set at the first admission and never changes: {cached}", cached=cached)
            if got[key] == got["num_computed_tokens"] or got[key] == want["num_computed_tokens"]:
                hint = M.cached_is_computed
            elif admit and got[key] == hit:
                hint = M.cached_again
            elif step["preempted"]:
                hint = M.preempt_resets_only_computed
    else:
        why = tr("the prompt's length never changes")
    counters = ", ".join(f"{x} {before[x]}" for x in KEYS)
    return CheckFailed(
        tr('case "{name}": a {n}-token prompt', name=tr(case["name"]), n=case["prompt"]),
        tr("step {k}: {event}; before it: {counters}", k=k + 1, event=event_text(step, before), counters=counters),
        tr("{key} after step {k} should be {want} ({why}); yours: {got}", key=key, k=k + 1, want=want[key], why=why, got=got[key]),
        hint=hint,
    )
