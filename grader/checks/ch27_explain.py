"""ch27's traces, shared by its public and hidden checks: a script of operations ("add" a request, "step" k
times, "drain" until everything finished, "run") made concrete on the reference, run on both engines through
the provided `replay` (`grader.authoring.trace`), and the first step whose batches, counters or outputs differ
explained in the chapter's terms.
"""

from __future__ import annotations

from grader.authoring import CheckFailed, Trial, compare_trace, describe, expect_records, mistakes, raised

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
    head = f'case "{case}": {describe_case(config, ops)}'
    mine = [r for r in yours if not raised(r)]
    check_structure(mine, head)
    if figure:
        t.figure(figure, config=config, ops=ops, trace=mine, expected=want)
    return check_trace(yours, ops, want, head, config["async"])


def check_trace(yours: object, ops: list, want: list, head: str, asyn: bool) -> list:
    """`grader.authoring.trace.compare` with ch27's words: the case, each step, each difference."""
    return compare_trace(yours, want, case=head, describe=lambda k: step_what(ops, k),
                   explain=lambda k, m, w: step_difference(k, m, w, want, asyn))


def check_structure(trace: list, head: str) -> None:
    """Each step returns a list of {"request_id", "new_token_ids", "finished"} dicts."""
    for k, entry in enumerate(trace, 1):
        outs = entry.get("outputs", [])
        if not isinstance(outs, list) or not all(isinstance(o, dict) and {"request_id", "new_token_ids", "finished"}
                                                 <= set(o) for o in outs):
            raise CheckFailed(head, f"step {k}: step() returns a list with one dict {{'request_id', "
                              f"'new_token_ids', 'finished'}} per request that got new tokens; yours: {describe(outs)}"
                              f"{' ' + repr(outs)[:120] if isinstance(outs, list) else ''}")


# -- describing ---------------------------------------------------------------------------------------------
def describe_case(config: dict, ops: list, limit: int = 4) -> str:
    steps, parts = 0, []
    for op in ops:
        if op[0] == "step":
            steps += 1
        elif op[0] == "add":
            eos = "" if op[4] is None else f", eos {op[4]}"
            parts.append(f"{op[1]}: prompt {len(op[2])}, max_tokens {op[3]}{eos}" + (f" (added after step {steps})"
                                                                                      if steps else ""))
    more = f"; … {len(parts) - limit} more requests" if len(parts) > limit else ""
    mode = "async scheduling, " if config["async"] else ""
    return (f"{mode}budget {config['budget']} tokens/step, max_num_seqs {config['max_num_seqs']}; "
            + "; ".join(parts[:limit]) + more)


def step_what(ops: list, k: int) -> str:
    """What the script did for its step k (0-based): the requests added since the step before, then the call."""
    calls = [i for i, op in enumerate(ops) if op[0] != "add"]
    i = calls[k]
    added = [op[1] for op in ops[calls[k - 1] + 1 if k else 0:i] if op[0] == "add"]
    call = "run()" if ops[i][0] == "run" else "step()"
    if not added:
        return call
    return (f"add_request({added[0]}), then {call}" if len(added) == 1 else
            f"{len(added)} requests added ({', '.join(added[:4])}{', …' if len(added) > 4 else ''}), then {call}")


def plan_str(plan: dict) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in plan.items()) + "}" if plan else "nothing"


def state_str(s: dict, placeholders: bool) -> str:
    outs = s["output_token_ids"]
    shown = str(outs) if len(outs) <= 6 else f"[… {outs[-4:]}]"
    ph = f", num_output_placeholders {s['num_output_placeholders']}" if placeholders else ""
    return (f"{s['status']}, num_computed_tokens {s['num_computed_tokens']}, num_tokens {s['num_tokens']} "
            f"(outputs {shown}){ph}")


def out_key(outputs: list) -> list:
    return [(o["request_id"], list(o["new_token_ids"]), o["finished"]) for o in outputs]


def batch_line(w: dict, rid: str | None = None, limit: int = 3) -> str:
    """The batches of a step (or, for a whole run(), the last `limit` that scheduled `rid`)."""
    parts, batches = [], [b for b in w["batches"] if rid is None or rid in b["num_scheduled_tokens"]]
    if len(batches) > limit:
        parts.append(f"… {len(batches) - limit} earlier batches")
        batches = batches[-limit:]
    for b in batches:
        sampled = ", ".join(f"{r}: {v[0] if v else 'blank'}" for r, v in b["sampled_token_ids"].items())
        pos = ", ".join(f"{r} {a}…{e - 1}" for r, (a, e) in b["positions"].items())
        parts.append(f"batch {b['batch']} {plan_str(b['num_scheduled_tokens'])} (positions {pos}; sampled {sampled})")
    return "; ".join(parts) if parts else "no batch"


# -- comparing one step ---------------------------------------------------------------------------------------
def step_difference(k: int, m: dict, w: dict, want: list, asyn: bool) -> CheckFailed | None:
    """The first difference of step k (0-based) in the chapter's terms: the batches it launched, each
    request's counters, then its outputs (or run()'s result); None when the step agrees."""
    prev = want[k - 1]["requests"] if k else {}
    where = f"step {k + 1}" if "run" not in w else "run()"
    mb, wb = [b["num_scheduled_tokens"] for b in m["batches"]], [b["num_scheduled_tokens"] for b in w["batches"]]
    if mb != wb and "run" in w:
        i = next((i for i, (x, y) in enumerate(zip(mb, wb)) if x != y), min(len(mb), len(wb)))
        return CheckFailed(f"run() launched {len(mb)} batches, the reference {len(wb)}; batch {i + 1} should be "
                           f"{plan_str(wb[i]) if i < len(wb) else 'none'}; yours: "
                           f"{plan_str(mb[i]) if i < len(mb) else 'none'}")
    if mb != wb:
        return batches_difference(where, mb, wb, prev, asyn)
    for rid, ws in w["requests"].items():
        ms = m["requests"].get(rid)
        if ms is None or any(ms[f] != ws[f] for f in FIELDS) or ms["output_token_ids"] != ws["output_token_ids"]:
            return request_difference(where, rid, ms, ws, prev.get(rid), w, asyn)
    if "run" in w:
        if m.get("run") != w["run"]:
            return CheckFailed(f"run() should return every request's output tokens, {w['run']}; "
                               f"yours: {m.get('run')!r:.300}")
    elif out_key(m["outputs"]) != out_key(w["outputs"]):
        return outputs_difference(where, m["outputs"], w["outputs"], w)
    return None


def batches_difference(where: str, mb: list, wb: list, prev: dict, asyn: bool) -> CheckFailed:
    lines = [f"{where} should launch {' and '.join(map(plan_str, wb)) or 'no batch'}; "
             f"yours launched {' and '.join(map(plan_str, mb)) or 'no batch'}"]
    for plan in wb[:1]:
        for rid, n in plan.items():
            p = prev.get(rid)
            if p is not None:
                lines.append(f"  {rid} needs num_tokens + placeholders − computed = {p['num_tokens']} + "
                             f"{p['num_output_placeholders']} − {p['num_computed_tokens']} = "
                             f"{p['num_tokens'] + p['num_output_placeholders'] - p['num_computed_tokens']}, gets {n}")
    hint = ""
    if asyn and wb and not mb:
        hint = M.no_launch_ahead
    elif asyn and not wb and mb:
        hint = M.empty_batch_launched
    elif len(mb) > len(wb):
        hint = M.two_batches
    return CheckFailed(*lines, hint=hint)


def request_difference(where: str, rid: str, ms: dict | None, ws: dict, p: dict | None, w: dict,
                       asyn: bool) -> CheckFailed:
    hints = request_hints(rid, ms, ws, p, w)
    return CheckFailed(f"{where} ran {batch_line(w, rid if 'run' in w else None)}",
                       f"after {where} request {rid} should be {state_str(ws, asyn)}",
                       f"yours: {'missing from snapshot()' if ms is None else state_str(ms, asyn)}",
                       hint=hints[0] if hints else "")


def request_hints(rid: str, ms: dict | None, ws: dict, p: dict | None, w: dict) -> list[str]:
    """The mistakes a request's wrong state most likely comes from, likeliest first."""
    if ms is None:
        return [M.finished_removed]
    sampled = [b["sampled_token_ids"].get(rid) for b in w["batches"] if rid in b["num_scheduled_tokens"]]
    partial = any(s == [] for s in sampled)
    mo, wo = ms["output_token_ids"], ws["output_token_ids"]
    hints: list[str] = []
    if ms["num_computed_tokens"] != ws["num_computed_tokens"] and \
            ms["num_computed_tokens"] == (p["num_computed_tokens"] if p else 0):
        hints.append(M.computed_not_advanced)
    if ms["status"] == "WAITING" and ws["status"] != "WAITING":
        hints.append(M.status_not_running)
    if len(mo) > len(wo) and p is not None and p["status"].startswith("FINISHED"):
        hints.append(M.stale_kept.format(rid=rid, status=p["status"]))
    launched_now = [] if "run" in w else \
        [v[0] for b in w["batches"] for r, v in b["sampled_token_ids"].items() if r == rid and v]
    first = next((i for i, (a, b) in enumerate(zip(mo, wo)) if a != b), min(len(mo), len(wo)))
    if first < len(mo) and mo[first] in launched_now:
        hints.append(M.newest_first.format(token=mo[first]))
    if len(mo) > len(wo) and mo[:len(wo)] == wo and ws["status"] == "FINISHED_STOPPED":
        hints.append(M.appended_after_eos.format(rid=rid, eos=wo[-1]))
    if sorted(mo) == sorted(wo) and mo != wo:
        hints.append(M.outputs_out_of_order)
    if mo == wo and ws["status"] == "FINISHED_LENGTH_CAPPED" and ms["status"] != ws["status"]:
        hints.append(M.eos_first if ms["status"] == "FINISHED_STOPPED" else M.length_cap_missed)
    if mo == wo and ws["status"] == "FINISHED_STOPPED" and ms["status"] != ws["status"]:
        hints.append(M.eos_missed)
    if len(mo) > len(wo) and ws["status"] == "FINISHED_LENGTH_CAPPED":
        hints.append(M.length_cap_missed)
    if len(mo) < len(wo) and any(sampled):
        hints.append(M.sample_not_appended.format(tokens=[s[0] for s in sampled if s], rid=rid))
    mp, wp = ms["num_output_placeholders"], ws["num_output_placeholders"]
    if mp != wp:
        hints.append(M.placeholder_always if mp > wp and partial else
                     M.placeholder_not_resolved if mp > wp else M.placeholder_missing)
    return hints


def outputs_difference(where: str, mo: list, wo: list, w: dict) -> CheckFailed:
    hint = ""
    if any(not o["new_token_ids"] for o in mo):
        hint = M.empty_outputs
    elif {o["request_id"] for o in mo} - {o["request_id"] for o in wo}:
        hint = M.extra_outputs
    elif [o[:2] for o in out_key(mo)] == [o[:2] for o in out_key(wo)]:
        hint = M.finished_flag
    return CheckFailed(f"{where} ran {batch_line(w)}",
                       f"{where} should return {out_key(wo) or '[] (nothing new)'} as (request_id, new_token_ids, "
                       f"finished); yours: {out_key(mo) or '[]'}", hint=hint)
