"""ch27's traces, shared by its public and hidden checks: a script of operations ("add" a request, "step" k
times, "drain" until everything finished, "run") made concrete on the reference, run on both engines through
the provided `replay` (`grader.authoring.trace`), and the first step whose batches, counters or outputs differ
explained in the chapter's terms.
"""

from __future__ import annotations

from grader.authoring import CheckFailed, Trial, compare_trace, describe, expect_records, mistakes, raised
from grader.i18n import tr

MAX_STEPS = 2000
FIELDS = ("status", "num_computed_tokens", "num_tokens", "num_output_placeholders")
M = mistakes("ch27")


# -- running a script on both engines -------------------------------------------------------------------------
def drive_reference(ref, config: dict, script: list) -> dict:
    """The concrete operations of `script` ("drain" becomes as many steps as the reference needs; a request is
    given by its prompt's length and EOS position) and the reference's trace of them (its `replay`)."""
    engine = ref.make_engine_core(config["budget"], config["max_num_seqs"], async_scheduling=config["async"])
    ops: list[tuple] = []
    busy = lambda: engine.has_unfinished_requests() or bool(getattr(engine, "batch_queue", None))
    for op in script:
        if op[0] == "add":
            _, rid, plen, max_tokens, eos_after = op
            prompt = [ref.fake_token(rid, p) for p in range(plen)]
            eos = None if eos_after is None else ref.fake_token(rid, plen + eos_after)
            ops.append(("add", rid, prompt, max_tokens, eos))
            engine.add_request(rid, prompt, max_tokens, eos)
        elif op[0] == "run":
            ops.append(("run",))
            engine.run()
        else:
            count = op[1] if op[0] == "step" else MAX_STEPS
            while count > 0 and (op[0] == "step" or busy()):
                ops.append(("step",))
                engine.step()
                count -= 1
    return {"ops": ops, "trace": ref.replay(config, ops)}


def run_case(t: Trial, case: str, config: dict, script: list, figure: str | None = None) -> list:
    """Run `script` on both engines, record the figure, and compare the traces."""
    expected = t.ref.drive(drive_reference, config, script)
    ops, want = expected["ops"], expected["trace"]
    yours = expect_records(t.yours.replay(config, ops))
    head = tr('case "{case}": {what}', case=case, what=describe_case(config, ops))
    mine = [r for r in yours if not raised(r)]
    check_structure(mine, head)
    if figure:
        t.figure(figure, config=config, ops=ops, trace=mine, expected=want)
    return check_trace(yours, ops, want, head, config["async"])


def check_trace(yours: object, ops: list, want: list, head: str, asyn: bool) -> list:
    """`grader.authoring.trace.compare` with ch27's words: the case, each step, each difference."""
    return compare_trace(
        yours, want, case=head, describe=lambda k: step_what(ops, k), explain=lambda k, m, w: step_difference(k, m, w, want, asyn)
    )


def check_structure(trace: list, head: str) -> None:
    """Each step returns a list of {"request_id", "new_token_ids", "finished"} dicts."""
    for k, entry in enumerate(trace, 1):
        outs = entry.get("outputs", [])
        if not isinstance(outs, list) or not all(
            isinstance(o, dict) and {"request_id", "new_token_ids", "finished"} <= set(o) for o in outs
        ):
            raise CheckFailed(
                head,
                tr(
                    "step {k}: step() returns a list with one dict {keys} per request that got new tokens; yours: {yours}",
                    k=k,
                    keys="{'request_id', 'new_token_ids', 'finished'}",
                    yours=describe(outs) + (" " + repr(outs)[:120] if isinstance(outs, list) else ""),
                ),
            )


# -- describing ---------------------------------------------------------------------------------------------
def describe_case(config: dict, ops: list, limit: int = 4) -> str:
    steps, parts = 0, []
    for op in ops:
        if op[0] == "step":
            steps += 1
        elif op[0] == "add":
            part = tr("{rid}: prompt {prompt}, max_tokens {max_tokens}", rid=op[1], prompt=len(op[2]), max_tokens=op[3])
            part += "" if op[4] is None else tr(", eos {eos}", eos=op[4])
            parts.append(part + (tr(" (added after step {n})", n=steps) if steps else ""))
    sep = tr("; ")
    more = sep + tr("… {n} more requests", n=len(parts) - limit) if len(parts) > limit else ""
    mode = (
        tr("async scheduling, budget {budget} tokens/step, max_num_seqs {seqs}", budget=config["budget"], seqs=config["max_num_seqs"])
        if config["async"]
        else tr("budget {budget} tokens/step, max_num_seqs {seqs}", budget=config["budget"], seqs=config["max_num_seqs"])
    )
    return mode + sep + sep.join(parts[:limit]) + more


def step_what(ops: list, k: int) -> str:
    """What the script did for its step k (0-based): the requests added since the step before, then the call."""
    calls = [i for i, op in enumerate(ops) if op[0] != "add"]
    i = calls[k]
    added = [op[1] for op in ops[calls[k - 1] + 1 if k else 0 : i] if op[0] == "add"]
    call = "run()" if ops[i][0] == "run" else "step()"
    if not added:
        return call
    return (
        tr("add_request({rid}), then {call}", rid=added[0], call=call)
        if len(added) == 1
        else tr(
            "{n} requests added ({rids}), then {call}",
            n=len(added),
            rids=", ".join(added[:4]) + (", …" if len(added) > 4 else ""),
            call=call,
        )
    )


def plan_str(plan: dict) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in plan.items()) + "}" if plan else tr("nothing")


def state_str(s: dict, placeholders: bool) -> str:
    outs = s["output_token_ids"]
    shown = str(outs) if len(outs) <= 6 else f"[… {outs[-4:]}]"
    ph = f", num_output_placeholders {s['num_output_placeholders']}" if placeholders else ""
    return tr(
        "{status}, num_computed_tokens {computed}, num_tokens {tokens} (outputs {outputs}){placeholders}",
        status=s["status"],
        computed=s["num_computed_tokens"],
        tokens=s["num_tokens"],
        outputs=shown,
        placeholders=ph,
    )


def out_key(outputs: list) -> list:
    return [(o["request_id"], list(o["new_token_ids"]), o["finished"]) for o in outputs]


def batch_line(w: dict, rid: str | None = None, limit: int = 3) -> str:
    """The batches of a step (or, for a whole run(), the last `limit` that scheduled `rid`)."""
    parts, batches = [], [b for b in w["batches"] if rid is None or rid in b["num_scheduled_tokens"]]
    if len(batches) > limit:
        parts.append(tr("… {n} earlier batches", n=len(batches) - limit))
        batches = batches[-limit:]
    for b in batches:
        sampled = ", ".join(f"{r}: {v[0] if v else tr('blank')}" for r, v in b["sampled_token_ids"].items())
        pos = ", ".join(f"{r} {a}…{e - 1}" for r, (a, e) in b["positions"].items())
        parts.append(
            tr(
                "batch {batch} {plan} (positions {positions}; sampled {sampled})",
                batch=b["batch"],
                plan=plan_str(b["num_scheduled_tokens"]),
                positions=pos,
                sampled=sampled,
            )
        )
    return tr("; ").join(parts) if parts else tr("no batch")


# -- comparing one step ---------------------------------------------------------------------------------------
def step_difference(k: int, m: dict, w: dict, want: list, asyn: bool) -> CheckFailed | None:
    """The first difference of step k (0-based) in the chapter's terms: the batches it launched, each
    request's counters, then its outputs (or run()'s result); None when the step agrees."""
    prev = want[k - 1]["requests"] if k else {}
    where = tr("step {n}", n=k + 1) if "run" not in w else "run()"
    mb, wb = [b["num_scheduled_tokens"] for b in m["batches"]], [b["num_scheduled_tokens"] for b in w["batches"]]
    if mb != wb and "run" in w:
        i = next((i for i, (x, y) in enumerate(zip(mb, wb)) if x != y), min(len(mb), len(wb)))
        return CheckFailed(
            tr(
                "run() launched {n} batches, the reference {want}; batch {i} should be {plan}; yours: {yours}",
                n=len(mb),
                want=len(wb),
                i=i + 1,
                plan=plan_str(wb[i]) if i < len(wb) else tr("none"),
                yours=plan_str(mb[i]) if i < len(mb) else tr("none"),
            )
        )
    if mb != wb:
        return batches_difference(where, mb, wb, prev, asyn)
    for rid, ws in w["requests"].items():
        ms = m["requests"].get(rid)
        if ms is None or any(ms[f] != ws[f] for f in FIELDS) or ms["output_token_ids"] != ws["output_token_ids"]:
            return request_difference(where, rid, ms, ws, prev.get(rid), w, asyn)
    if "run" in w:
        if m.get("run") != w["run"]:
            return CheckFailed(
                tr(
                    "run() should return every request's output tokens, {want}; yours: {yours}",
                    want=w["run"],
                    yours=repr(m.get("run"))[:300],
                )
            )
    elif out_key(m["outputs"]) != out_key(w["outputs"]):
        return outputs_difference(where, m["outputs"], w["outputs"], w)
    return None


def batches_difference(where: str, mb: list, wb: list, prev: dict, asyn: bool) -> CheckFailed:
    lines = [
        tr(
            "{where} should launch {want}; yours launched {yours}",
            where=where,
            want=tr(" and ").join(map(plan_str, wb)) or tr("no batch"),
            yours=tr(" and ").join(map(plan_str, mb)) or tr("no batch"),
        )
    ]
    for plan in wb[:1]:
        for rid, n in plan.items():
            p = prev.get(rid)
            if p is not None:
                lines.append(
                    tr(
                        "  {rid} needs num_tokens + placeholders − computed = {tokens} + {ph} − {computed} = {need}, gets {n}",
                        rid=rid,
                        tokens=p["num_tokens"],
                        ph=p["num_output_placeholders"],
                        computed=p["num_computed_tokens"],
                        need=p["num_tokens"] + p["num_output_placeholders"] - p["num_computed_tokens"],
                        n=n,
                    )
                )
    hint = ""
    if asyn and wb and not mb:
        hint = M.no_launch_ahead
    elif asyn and not wb and mb:
        hint = M.empty_batch_launched
    elif len(mb) > len(wb):
        hint = M.two_batches
    return CheckFailed(*lines, hint=hint)


def request_difference(where: str, rid: str, ms: dict | None, ws: dict, p: dict | None, w: dict, asyn: bool) -> CheckFailed:
    hints = request_hints(rid, ms, ws, p, w)
    return CheckFailed(
        tr("{where} ran {batches}", where=where, batches=batch_line(w, rid if "run" in w else None)),
        tr("after {where} request {rid} should be {state}", where=where, rid=rid, state=state_str(ws, asyn)),
        tr("yours: {state}", state=tr("missing from snapshot()") if ms is None else state_str(ms, asyn)),
        hint=hints[0] if hints else "",
    )


def request_hints(rid: str, ms: dict | None, ws: dict, p: dict | None, w: dict) -> list[str]:
    """The mistakes a request's wrong state most likely comes from, likeliest first."""
    if ms is None:
        return [M.finished_removed]
    sampled = [b["sampled_token_ids"].get(rid) for b in w["batches"] if rid in b["num_scheduled_tokens"]]
    partial = any(s == [] for s in sampled)
    mo, wo = ms["output_token_ids"], ws["output_token_ids"]
    hints: list[str] = []
    if ms["num_computed_tokens"] != ws["num_computed_tokens"] and ms["num_computed_tokens"] == (p["num_computed_tokens"] if p else 0):
        hints.append(M.computed_not_advanced)
    if ms["status"] == "WAITING" and ws["status"] != "WAITING":
        hints.append(M.status_not_running)
    if len(mo) > len(wo) and p is not None and p["status"].startswith("FINISHED"):
        hints.append(M.stale_kept.format(rid=rid, status=p["status"]))
    launched_now = [] if "run" in w else [v[0] for b in w["batches"] for r, v in b["sampled_token_ids"].items() if r == rid and v]
    first = next((i for i, (a, b) in enumerate(zip(mo, wo)) if a != b), min(len(mo), len(wo)))
    if first < len(mo) and mo[first] in launched_now:
        hints.append(M.newest_first.format(token=mo[first]))
    if len(mo) > len(wo) and mo[: len(wo)] == wo and ws["status"] == "FINISHED_STOPPED":
        hints.append(M.appended_after_eos.format(rid=rid, eos=wo[-1]))
    if sorted(mo) == sorted(wo) and mo != wo:
        hints.append(M.outputs_out_of_order)
    if mo == wo and ws["status"] == "FINISHED_LENGTH_CAPPED" and ms["status"] != ws["status"]:
        hints.append(M.length_cap_missed)
    if mo == wo and ws["status"] == "FINISHED_STOPPED" and ms["status"] != ws["status"]:
        hints.append(M.length_first if ms["status"] == "FINISHED_LENGTH_CAPPED" else M.eos_missed)
    if len(mo) > len(wo) and ws["status"] == "FINISHED_LENGTH_CAPPED":
        hints.append(M.length_cap_missed)
    if len(mo) < len(wo) and any(sampled):
        hints.append(M.sample_not_appended.format(tokens=[s[0] for s in sampled if s], rid=rid))
    mp, wp = ms["num_output_placeholders"], ws["num_output_placeholders"]
    if mp != wp:
        hints.append(M.placeholder_always if mp > wp and partial else M.placeholder_not_resolved if mp > wp else M.placeholder_missing)
    return hints


def outputs_difference(where: str, mo: list, wo: list, w: dict) -> CheckFailed:
    hint = ""
    if any(not o["new_token_ids"] for o in mo):
        hint = M.empty_outputs
    elif {o["request_id"] for o in mo} - {o["request_id"] for o in wo}:
        hint = M.extra_outputs
    elif [o[:2] for o in out_key(mo)] == [o[:2] for o in out_key(wo)]:
        hint = M.finished_flag
    return CheckFailed(
        tr("{where} ran {batches}", where=where, batches=batch_line(w)),
        tr(
            "{where} should return {want} as (request_id, new_token_ids, finished); yours: {yours}",
            where=where,
            want=out_key(wo) or tr("[] (nothing new)"),
            yours=out_key(mo) or "[]",
        ),
        hint=hint,
    )


# -- ch27.3: speculative decoding on one request ----------------------------------------------------------------
SPEC_FIELDS = ("status", "num_computed_tokens", "num_tokens", "num_tokens_with_spec", "spec_token_ids", "output_token_ids")


def drive_spec(ref, request: tuple, rounds: list) -> dict:
    """The concrete config and draft lists of a spec script, and the reference's trace of them (its
    `replay_spec`). `request` is (request_id, prompt length, max_tokens, EOS position among the outputs or
    None); each round (k, a) is k drafts of which the first a are right (the rest are wrong by WRONG_DRAFT);
    (0, 0) is a step without drafts; (k, None) a step with k drafts whose output comes back empty (discarded),
    the replay's last."""
    rid, plen, max_tokens, eos_after = request
    config = {
        "request_id": rid,
        "prompt_token_ids": [ref.fake_token(rid, p) for p in range(plen)],
        "max_tokens": max_tokens,
        "eos_token_id": None if eos_after is None else ref.fake_token(rid, plen + eos_after),
    }
    drafts: list = []
    known = plen
    for k, a in rounds:
        right = [ref.fake_token(rid, known + i) for i in range(k)]
        if a is None:
            drafts.append({"drafts": right, "discarded": True})
            continue
        drafts.append([tok if i < a else tok + ref.WRONG_DRAFT for i, tok in enumerate(right)])
        known += min(a, k) + 1
    return {"config": config, "rounds": drafts, "trace": ref.replay_spec(config, drafts)}


def round_drafts(step: list | dict) -> list:
    """The drafts of a round of `drive_spec`'s rounds (a list, or a discarded step's dict)."""
    return step["drafts"] if isinstance(step, dict) else step


def run_spec_case(t: Trial, case: str, request: tuple, rounds: list, figure: str | None = None) -> list:
    """Run a spec script through both sides' schedule_spec and update_spec, record the figure, and compare."""
    expected = t.ref.drive(drive_spec, request, rounds)
    config, drafts, want = expected["config"], expected["rounds"], expected["trace"]
    yours = expect_records(t.yours.replay_spec(config, drafts), what="replay_spec")
    mine = [r for r in yours if not raised(r)]
    head = tr('case "{case}": {what}', case=case, what=describe_spec_case(config, drafts))
    if figure:
        t.figure(figure, config=config, rounds=drafts, trace=mine, expected=want)
    return check_spec_trace(yours, drafts, want, head)


def check_spec_trace(yours: object, drafts: list, want: list, head: str) -> list:
    """`compare_trace` with ch27.3's words: each step's drafts, then the first counter that differs."""
    return compare_trace(
        yours,
        want,
        case=head,
        what="replay_spec",
        describe=lambda k: spec_step_what(drafts, k),
        explain=lambda k, m, w: spec_difference(k, m, w),
    )


def describe_spec_case(config: dict, drafts: list, limit: int = 6) -> str:
    eos = "" if config["eos_token_id"] is None else tr(", eos {eos}", eos=config["eos_token_id"])
    steps = [
        (tr("{n} drafts", n=len(round_drafts(d))) if round_drafts(d) else tr("no drafts"))
        + (tr(" (output discarded)") if isinstance(d, dict) else "")
        for d in drafts
    ]
    more = tr(", … {n} more", n=len(steps) - limit) if len(steps) > limit else ""
    return tr(
        "{rid}: prompt {prompt}, max_tokens {max_tokens}{eos}; steps: {steps}",
        rid=config["request_id"],
        prompt=len(config["prompt_token_ids"]),
        max_tokens=config["max_tokens"],
        eos=eos,
        steps=tr(", ").join(steps[:limit]) + more,
    )


def spec_step_what(drafts: list, k: int) -> str:
    step = drafts[k] if k < len(drafts) else []
    d = round_drafts(step)
    if isinstance(step, dict):
        return (
            tr("drafts {drafts}, then schedule_spec and update_spec with no generated token (the output was discarded)", drafts=d)
            if d
            else tr("no drafts, then schedule_spec and update_spec with no generated token (the output was discarded)")
        )
    return tr("drafts {drafts}, then schedule_spec and update_spec", drafts=d) if d else tr("no drafts, then schedule_spec and update_spec")


def spec_str(s: dict) -> str:
    outs = s["output_token_ids"]
    shown = str(outs) if len(outs) <= 6 else f"[… {outs[-4:]}]"
    return tr(
        "{status}, num_computed_tokens {computed}, num_tokens {tokens}, num_tokens_with_spec {with_spec}, "
        "spec_token_ids {spec} (outputs {outputs})",
        status=s["status"],
        computed=s["num_computed_tokens"],
        tokens=s["num_tokens"],
        with_spec=s["num_tokens_with_spec"],
        spec=s["spec_token_ids"],
        outputs=shown,
    )


def spec_difference(k: int, m: dict, w: dict) -> CheckFailed | None:
    """The first difference of spec step k (0-based): what schedule_spec returned, the counters right after it,
    then what update_spec returned and the counters after it; None when the step agrees."""
    drafts, before, gen = w["drafts"], w["before"], w["generated"]
    ctx = tr("before it: {state}", state=spec_str(before))
    sched, wsched = m.get("scheduled"), w["scheduled"]
    if sched != wsched:
        fewer = isinstance(sched, dict) and drafts and sched.get("num_scheduled_tokens") == wsched["num_scheduled_tokens"] - len(drafts)
        return CheckFailed(
            ctx,
            tr(
                "schedule_spec should return {want} (n = num_tokens_with_spec − num_computed_tokens = {with_spec} − {computed}); "
                "yours: {yours}",
                want=wsched,
                with_spec=before["num_tokens_with_spec"],
                computed=before["num_computed_tokens"],
                yours=repr(sched)[:200],
            ),
            hint=M.drafts_not_scheduled if fewer else "",
        )
    ms, ws = m.get("after_schedule"), w["after_schedule"]
    if ms != ws:
        hint = ""
        if isinstance(ms, dict) and ms.get("spec_token_ids") and not ws["spec_token_ids"]:
            hint = M.spec_not_cleared
        elif isinstance(ms, dict) and ms.get("num_computed_tokens") == before["num_computed_tokens"]:
            hint = M.computed_not_advanced
        return CheckFailed(
            ctx,
            tr("right after schedule_spec (returned {returned}) the request should be {state}", returned=wsched, state=spec_str(ws)),
            tr("yours: {state}", state=spec_str(ms) if isinstance(ms, dict) else repr(ms)[:200]),
            hint=hint,
        )
    mu, wu, new, wnew = m.get("after_update"), w["after_update"], m.get("new_token_ids"), w["new_token_ids"]
    if mu == wu and new == wnew:
        return None
    accepted = len(gen) - 1
    verified = (
        tr(
            "the target model generated {generated} ({accepted} of {k} drafts accepted, {rejected} rejected)",
            generated=gen,
            accepted=accepted,
            k=len(drafts),
            rejected=len(drafts) - accepted,
        )
        if gen
        else tr(
            "the step's output came back empty for it (its sample discarded: preempted or aborted meanwhile), so nothing was "
            "verified: nothing to roll back, nothing to append"
        )
    )
    lines = [
        ctx,
        tr("scheduled {n} tokens with drafts {drafts}; {verified}", n=wsched["num_scheduled_tokens"], drafts=drafts, verified=verified),
        tr("update_spec should return {want} and leave it {state}", want=wnew, state=spec_str(wu)),
        tr("yours: {returned}, {state}", returned=repr(new)[:120], state=spec_str(mu) if isinstance(mu, dict) else repr(mu)[:200]),
    ]
    return CheckFailed(*lines, hint=spec_update_hint(m, w) if isinstance(mu, dict) else "")


def spec_update_hint(m: dict, w: dict) -> str:
    """The mistake a wrong update_spec most likely is, from what it returned and the counters it left."""
    drafts, gen, mu, wu = w["drafts"], w["generated"], m["after_update"], w["after_update"]
    new, wnew = m["new_token_ids"], w["new_token_ids"]
    if not gen:
        moved = mu["num_computed_tokens"] != w["after_schedule"]["num_computed_tokens"]
        return M.rollback_without_output if moved and mu["output_token_ids"] == wu["output_token_ids"] else ""
    if drafts and new == gen[:-1] and wnew != new:
        return M.bonus_rejected
    if isinstance(new, list) and len(new) > len(wnew) and new[: len(wnew)] == wnew:
        return M.spec_not_trimmed
    if mu["output_token_ids"] == wu["output_token_ids"] and mu["status"] != wu["status"]:
        if wu["status"] == "FINISHED_STOPPED":
            return M.length_first if mu["status"] == "FINISHED_LENGTH_CAPPED" else M.eos_missed
        return M.length_cap_missed if wu["status"] == "FINISHED_LENGTH_CAPPED" else ""
    if mu["output_token_ids"] != wu["output_token_ids"]:
        return ""
    return rollback_hint(mu["num_computed_tokens"], w["after_schedule"]["num_computed_tokens"], len(drafts), len(gen), len(wnew))


def rollback_hint(got: int, scheduled: int, k: int, generated: int, kept: int) -> str:
    """The roll-back mistake that leaves num_computed_tokens at `got` after a step that scheduled up to `scheduled`
    with k drafts, of which the target generated `generated` tokens and a stop kept `kept`; "" if none fits."""
    if not k:
        return ""
    want = scheduled - (k + 1 - generated)
    if got == scheduled and want != got:
        return M.no_rollback
    if kept < generated and got == scheduled - (k + 1 - kept):
        return M.rollback_after_trim
    if got == want - 1:
        return M.rollback_one_too_many
    if got == want + 1:
        return M.bonus_as_draft
    return ""
