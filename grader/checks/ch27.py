"""Public checks of ch27 · the engine core loop, and the trace machinery the hidden checks share.

A script of operations ("add" a request, "step" k times, "drain" until everything
finished) drives the student's engine and the reference the same way; after every
step the course's `snapshot()` gives each request's counters and the batches the
executor ran. The traces are compared step by step and the first difference is
explained in the chapter's terms.
"""

from __future__ import annotations

from grader.authoring import CheckFailed, StudentRaised, Trial, describe, public

# ch27-enginecore-loop: §A.5's request (prompt 10, max_tokens 2, budget 4), B arriving after step 2.
LOOP = {"budget": 4, "max_num_seqs": 2, "async": False}
LOOP_SCRIPT = [("add", "A", 10, 2, None), ("step", 2), ("add", "B", 2, 3, None), ("drain",)]
# ch27-three-boundaries: §B.4's prompt of 5, chunked by a budget of 3, max_tokens 4, async.
BOUNDS = {"budget": 3, "max_num_seqs": 2, "async": True}
BOUNDS_SCRIPT = [("add", "A", 5, 4, None), ("drain",)]
MAX_STEPS = 2000
FIELDS = ("status", "num_computed_tokens", "num_tokens", "num_output_placeholders")


# -- driving ------------------------------------------------------------------------------------------------
def drive_reference(ref, config: dict, script: list) -> dict:
    """Run `script` on the reference engine: the concrete operations and the trace after every step."""
    engine = ref.make_engine_core(config["budget"], config["max_num_seqs"], async_scheduling=config["async"])
    ops, trace = [], []
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
            trace.append({"run": engine.run(), **engine.snapshot()})
        else:
            count = op[1] if op[0] == "step" else MAX_STEPS
            while count > 0 and (op[0] == "step" or busy()):
                ops.append(("step",))
                trace.append({"outputs": engine.step(), **engine.snapshot()})
                count -= 1
    return {"ops": ops, "trace": trace}


def drive_student(t: Trial, config: dict, ops: list) -> tuple[list, StudentRaised | None]:
    """Run the concrete `ops` on the student's engine; stop at the first exception it raises."""
    engine = t.yours.make_engine_core(config["budget"], config["max_num_seqs"], async_scheduling=config["async"])
    trace = []
    try:
        for op in ops:
            if op[0] == "add":
                engine.add_request(*op[1:])
            elif op[0] == "run":
                trace.append({"run": engine.run(), **engine.snapshot()})
            else:
                trace.append({"outputs": engine.step(), **engine.snapshot()})
    except StudentRaised as e:
        if e.not_implemented:
            raise
        return trace, e
    return trace, None


def run_case(t: Trial, case: str, config: dict, script: list, figure: str | None = None) -> list:
    """Drive both engines through `script`, record the figure, and compare the traces."""
    expected = t.ref.drive(drive_reference, config, script)
    ops, want = expected["ops"], expected["trace"]
    mine, error = drive_student(t, config, ops)
    head = f'case "{case}": {describe_case(config, ops)}'
    check_structure(mine, head)
    if figure:
        t.figure(figure, config=config, ops=ops, trace=mine, expected=want)
    compare_traces(mine, want, head, config["async"], error)
    return mine


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


def check_structure(trace: list, head: str) -> None:
    """Each step returns a list of {"request_id", "new_token_ids", "finished"} dicts."""
    for k, entry in enumerate(trace, 1):
        outs = entry.get("outputs", [])
        if not isinstance(outs, list) or not all(isinstance(o, dict) and {"request_id", "new_token_ids", "finished"}
                                                 <= set(o) for o in outs):
            raise CheckFailed(f"{head}\nstep {k}: step() returns a list with one dict {{'request_id', "
                              f"'new_token_ids', 'finished'}} per request that got new tokens; yours: {describe(outs)}"
                              f"{' ' + repr(outs)[:120] if isinstance(outs, list) else ''}")


# -- comparing ----------------------------------------------------------------------------------------------
def compare_traces(mine: list, want: list, head: str, asyn: bool, error: StudentRaised | None = None) -> None:
    """Raise CheckFailed at the first step whose batches, counters or outputs differ."""
    for k, (m, w) in enumerate(zip(mine, want), 1):
        prev = want[k - 2]["requests"] if k > 1 else {}
        where = f"step {k}" if "run" not in w else "run()"
        mb, wb = [b["num_scheduled_tokens"] for b in m["batches"]], [b["num_scheduled_tokens"] for b in w["batches"]]
        if mb != wb and "run" in w:
            i = next((i for i, (x, y) in enumerate(zip(mb, wb)) if x != y), min(len(mb), len(wb)))
            raise CheckFailed(f"{head}\nrun() launched {len(mb)} batches, the reference {len(wb)}; batch {i + 1} "
                              f"should be {plan_str(wb[i]) if i < len(wb) else 'none'}; yours: "
                              f"{plan_str(mb[i]) if i < len(mb) else 'none'}")
        if mb != wb:
            fail_batches(head, where, mb, wb, w, prev, asyn)
        for rid, ws in w["requests"].items():
            ms = m["requests"].get(rid)
            if ms is None or any(ms[f] != ws[f] for f in FIELDS) or ms["output_token_ids"] != ws["output_token_ids"]:
                fail_request(head, where, rid, ms, ws, prev.get(rid), w, asyn)
        if "run" in w:
            if m.get("run") != w["run"]:
                raise CheckFailed(f"{head}\nrun() should return every request's output tokens, {w['run']}; "
                                  f"yours: {m.get('run')!r:.300}")
        elif out_key(m["outputs"]) != out_key(w["outputs"]):
            fail_outputs(head, where, m["outputs"], w["outputs"], w, prev)
    if error is not None:
        raise error
    if len(mine) < len(want):
        raise CheckFailed(f"{head}\nthe trace stopped after {len(mine)} of {len(want)} steps")


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


def fail_batches(head: str, where: str, mb: list, wb: list, w: dict, prev: dict, asyn: bool) -> None:
    lines = [head, f"{where} should launch {' and '.join(map(plan_str, wb)) or 'no batch'}; "
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
        hint = ("async scheduling launches the next batch before the previous one's output is back: the request "
                "already counts a placeholder for the token in flight, so plan_tokens gives it its next decode")
    elif asyn and not wb and mb:
        hint = "a batch is launched only when the plan is not empty; with a full queue, reconcile the oldest batch"
    elif len(mb) > len(wb):
        hint = "one step launches at most one batch"
    raise CheckFailed("\n".join(lines + ([f"hint: {hint}"] if hint else [])))


def fail_request(head: str, where: str, rid: str, ms: dict | None, ws: dict, p: dict | None, w: dict,
                 asyn: bool) -> None:
    lines = [head, f"{where} ran {batch_line(w, rid if 'run' in w else None)}",
             f"after {where} request {rid} should be {state_str(ws, asyn)}",
             f"yours: {'missing from snapshot()' if ms is None else state_str(ms, asyn)}"]
    raise CheckFailed("\n".join(lines + [f"hint: {h}" for h in request_hints(rid, ms, ws, p, w)[:1]]))


def request_hints(rid: str, ms: dict | None, ws: dict, p: dict | None, w: dict) -> list[str]:
    if ms is None:
        return ["keep every request in self.requests, finished ones too: the course reads their final state"]
    sampled = [b["sampled_token_ids"].get(rid) for b in w["batches"] if rid in b["num_scheduled_tokens"]]
    partial = any(s == [] for s in sampled)
    mo, wo = ms["output_token_ids"], ws["output_token_ids"]
    hints = []
    if ms["num_computed_tokens"] != ws["num_computed_tokens"] and \
            ms["num_computed_tokens"] == (p["num_computed_tokens"] if p else 0):
        hints.append("num_computed_tokens grows by the scheduled tokens in schedule(), before the model runs")
    if ms["status"] == "WAITING" and ws["status"] != "WAITING":
        hints.append("a request becomes RUNNING when it is scheduled for the first time")
    if len(mo) > len(wo) and p is not None and p["status"].startswith("FINISHED"):
        hints.append(f"{rid} had already finished ({p['status']}): an output that arrives for a finished request "
                     "is stale and is dropped")
    launched_now = [] if "run" in w else \
        [v[0] for b in w["batches"] for r, v in b["sampled_token_ids"].items() if r == rid and v]
    first = next((i for i, (a, b) in enumerate(zip(mo, wo)) if a != b), min(len(mo), len(wo)))
    if first < len(mo) and mo[first] in launched_now:
        hints.append(f"{mo[first]} comes from the batch launched in this very step; with a queue of 2 the batch "
                     "reconciled now is the older one (pop from the right of the queue you appendleft to)")
    if len(mo) > len(wo) and mo[:len(wo)] == wo and ws["status"] == "FINISHED_STOPPED":
        hints.append(f"{rid} stopped at EOS {wo[-1]}: nothing is appended after it; an output that arrives for a "
                     "finished request is stale and is dropped")
    if sorted(mo) == sorted(wo) and mo != wo:
        hints.append("outputs come back in launch order: reconcile the oldest batch first (pop from the right "
                     "of the queue you appendleft to)")
    if mo == wo and ws["status"] == "FINISHED_LENGTH_CAPPED" and ms["status"] != ws["status"]:
        hints.append("num_output_tokens reached max_tokens: FINISHED_LENGTH_CAPPED (vLLM checks the length cap "
                     "before EOS, so this holds even when the last token is EOS)")
    if mo == wo and ws["status"] == "FINISHED_STOPPED" and ms["status"] != ws["status"]:
        hints.append("the newest token is this request's EOS: it stops the request (FINISHED_STOPPED) and stays "
                     "in the output")
    if len(mo) > len(wo) and ws["status"] == "FINISHED_LENGTH_CAPPED":
        hints.append("a request stops as soon as num_output_tokens reaches max_tokens")
    if len(mo) < len(wo) and any(sampled):
        hints.append(f"the worker sampled {[s[0] for s in sampled if s]} for {rid}: append it to its outputs")
    mp, wp = ms["num_output_placeholders"], ws["num_output_placeholders"]
    if mp != wp:
        if mp > wp and partial:
            hints.append("a non-final prefill chunk produces no token, so it gets no placeholder: add one only "
                         "when num_computed_tokens reaches num_tokens + num_output_placeholders")
        elif mp > wp:
            hints.append("each sampled token that arrives resolves one placeholder (num_output_placeholders −= "
                         "the number of tokens sampled for the request in that batch)")
        else:
            hints.append("a step that reaches the end of the known tokens adds one output placeholder at schedule "
                         "time: its token is still in flight")
    return hints


def fail_outputs(head: str, where: str, mo: list, wo: list, w: dict, prev: dict) -> None:
    lines = [head, f"{where} ran {batch_line(w)}",
             f"{where} should return {out_key(wo) or '[] (nothing new)'} as (request_id, new_token_ids, finished); "
             f"yours: {out_key(mo) or '[]'}"]
    hint = ""
    if any(not o["new_token_ids"] for o in mo):
        hint = "a request that got no token this step (a non-final prefill chunk) emits nothing"
    elif {o["request_id"] for o in mo} - {o["request_id"] for o in wo}:
        hint = "only requests that got new tokens this step report them"
    elif [o[:2] for o in out_key(mo)] == [o[:2] for o in out_key(wo)]:
        hint = "'finished' says whether this output finished the request"
    raise CheckFailed("\n".join(lines + ([f"hint: {hint}"] if hint else [])))


# -- 27.1 EngineCore ----------------------------------------------------------------------------------------
@public("ch27.1", "figure instance: A (prompt 10, max_tokens 2), B arriving after step 2, budget 4")
def loop_figure_instance(t: Trial) -> None:
    run_case(t, "figure instance", LOOP, LOOP_SCRIPT, figure="ch27-enginecore-loop")


def drive_pieces(ref, config: dict) -> dict:
    """Reference for 'piece by piece': schedule, execute, update by hand, with states in between."""
    engine = ref.make_engine_core(config["budget"], config["max_num_seqs"], async_scheduling=config["async"])
    engine.add_request("A", [ref.fake_token("A", p) for p in range(6)], 3)
    out = []
    for _ in range(3):
        so = engine.schedule()
        out.append({"schedule": so, **engine.snapshot()})
        ro = engine.executor.execute_model(so)
        out.append({"runner": ro, "update": engine.update_from_output(so, ro), **engine.snapshot()})
    return {"prompt": engine.requests["A"].prompt_token_ids, "trace": out}


@public("ch27.1", "the contract piece by piece: schedule, execute_model, update_from_output")
def pieces(t: Trial) -> None:
    config = {"budget": 4, "max_num_seqs": 2, "async": False}
    expected = t.ref.drive(drive_pieces, config)
    want = expected["trace"]
    head = 'case "piece by piece": budget 4; A: prompt 6, max_tokens 3'
    engine = t.yours.make_engine_core(4, 2, async_scheduling=False)
    executor = t.attrs(engine, "executor")["executor"]
    engine.add_request("A", expected["prompt"], 3)
    for k in range(3):
        so = engine.schedule()
        state, ws = engine.snapshot()["requests"]["A"], want[2 * k]["requests"]["A"]
        if so != want[2 * k]["schedule"]:
            extra = ("\nhint: the worker sees the prompt only the first time (scheduled_new_reqs), diffs afterwards"
                     if isinstance(so, dict) and so.get("scheduled_new_reqs") and k else "")
            raise CheckFailed(f"{head}\nschedule() call {k + 1} should return {want[2 * k]['schedule']}; "
                              f"yours: {so!r:.300}{extra}")
        if state["num_computed_tokens"] != ws["num_computed_tokens"] or state["status"] != ws["status"]:
            before = want[2 * k - 1]["requests"]["A"]["num_computed_tokens"] if k else 0
            hint = ("\nhint: num_computed_tokens is advanced at schedule time (optimistic), not when the output comes "
                    "back" if state["num_computed_tokens"] == before != ws["num_computed_tokens"] else
                    "\nhint: a request becomes RUNNING when it is scheduled for the first time"
                    if state["status"] == "WAITING" != ws["status"] else "")
            raise CheckFailed(f"{head}\nright after schedule() call {k + 1}, before the model runs, A should be "
                              f"{state_str(ws, False)}; yours: {state_str(state, False)}{hint}")
        ro = executor.execute_model(so)
        got = engine.update_from_output(so, ro)
        state, ws = engine.snapshot()["requests"]["A"], want[2 * k + 1]["requests"]["A"]
        check_structure([{"outputs": got}], head)
        if out_key(got) != out_key(want[2 * k + 1]["update"]) or state != ws:
            raise CheckFailed(f"{head}\nupdate_from_output after batch {k + 1} (runner output {ro}) should return "
                              f"{out_key(want[2 * k + 1]['update']) or '[]'} and leave A {state_str(ws, False)}; "
                              f"yours: {out_key(got) or '[]'}, A {state_str(state, False)}"
                              + ("\nhint: an empty list from the runner is a partial prefill: nothing to append, "
                                 "nothing to report" if not ro.get("A") and (
                                     out_key(got) or state["output_token_ids"] != ws["output_token_ids"]) else ""))


@public("ch27.1", "EOS stops a request; the length cap is checked first")
def eos_and_length(t: Trial) -> None:
    run_case(t, "eos and length", {"budget": 8, "max_num_seqs": 2, "async": False},
             [("add", "A", 3, 5, 1), ("add", "B", 2, 3, 2), ("drain",)])


@public("ch27.1", "max_num_seqs: later requests wait for a seat")
def seats(t: Trial) -> None:
    run_case(t, "two seats", {"budget": 16, "max_num_seqs": 2, "async": False},
             [("add", "A", 4, 2, None), ("add", "B", 3, 3, None), ("add", "C", 2, 2, None), ("drain",)])


@public("ch27.1", "run() returns every request's outputs")
def run_all(t: Trial) -> None:
    run_case(t, "run", {"budget": 5, "max_num_seqs": 3, "async": False},
             [("add", "A", 7, 3, None), ("add", "B", 2, 4, 0), ("add", "C", 4, 1, None), ("run",)])


# -- 27.2 AsyncEngineCore -----------------------------------------------------------------------------------
ASYNC = {"budget": 8, "max_num_seqs": 2, "async": True}


@public("ch27.2", "figure instance: prompt 5 chunked by a budget of 3, max_tokens 4")
def bounds_figure_instance(t: Trial) -> None:
    run_case(t, "figure instance", BOUNDS, BOUNDS_SCRIPT, figure="ch27-three-boundaries")


@public("ch27.2", "one step ahead: step 2 launches before step 1's output is back")
def one_ahead(t: Trial) -> None:
    run_case(t, "one ahead", ASYNC, [("add", "A", 5, 3, None), ("step", 2)])


@public("ch27.2", "an output that arrives after EOS is stale and dropped")
def stale_after_eos(t: Trial) -> None:
    run_case(t, "stale after eos", ASYNC, [("add", "A", 3, 5, 1), ("drain",)])


@public("ch27.2", "two requests, chunked prefill and decodes interleaved")
def two_requests(t: Trial) -> None:
    run_case(t, "two requests", {"budget": 4, "max_num_seqs": 2, "async": True},
             [("add", "A", 6, 3, None), ("add", "B", 3, 3, 1), ("step", 3), ("add", "C", 2, 2, None), ("drain",)])


@public("ch27.2", "run() drains the batch queue and returns every request's outputs")
def async_run(t: Trial) -> None:
    run_case(t, "run", {"budget": 6, "max_num_seqs": 3, "async": True},
             [("add", "A", 7, 3, None), ("add", "B", 2, 4, 0), ("add", "C", 4, 2, None), ("run",)])
