"""ch24's trace machinery, shared by its public and hidden checks: scripts of arriving requests, a
simulated runner, driving the student's Scheduler and the reference through the same script, and
explaining the first step where their observable states differ.
"""

from __future__ import annotations

from typing import Any, Iterator

from grader.authoring import CheckFailed, Remote, Trial, describe

WAITING, RUNNING, FINISHED = "WAITING", "RUNNING", "FINISHED"
FILLER = 999  # what the runner returns for an object the grader does not know
FIELDS = ("num_computed_tokens", "num_tokens", "completion", "status", "num_scheduled_tokens", "blocks")


# -- scripts and the simulated runner -------------------------------------------------------------
def request(name: str, prompt: list[int], max_tokens: int, outputs: list[int], *, arrive: int = 0,
            candidates: dict[int, int] | None = None, ignore_eos: bool = False) -> dict:
    """One request of a script. outputs[k] is what the runner samples when the request has k completion
    tokens and its step reaches num_tokens; candidates[end] what it samples for a chunk ending at `end`
    that leaves the prompt unfinished (a throw-away prediction; 50 + end when not given)."""
    return {"name": name, "prompt": list(prompt), "max_tokens": max_tokens, "outputs": list(outputs),
            "arrive": arrive, "candidates": {str(k): v for k, v in (candidates or {}).items()},
            "ignore_eos": ignore_eos}


def script(name: str, requests: list[dict], *, num_blocks: int, block_size: int, max_num_seqs: int,
           max_num_batched_tokens: int, eos: int) -> dict:
    return {"name": name, "requests": requests,
            "config": {"num_blocks": num_blocks, "block_size": block_size, "max_num_seqs": max_num_seqs,
                       "max_num_batched_tokens": max_num_batched_tokens, "eos": eos}}


def runner_token(req: dict | None, state: dict | None) -> int:
    """The token the simulated runner samples for one scheduled sequence (from the state after schedule())."""
    if req is None or not isinstance(state, dict):
        return FILLER
    end = state["num_computed_tokens"] + state["num_scheduled_tokens"]
    if end < state["num_tokens"]:
        return req["candidates"].get(str(end), 50 + end)
    k = state["num_tokens"] - len(req["prompt"])
    return req["outputs"][k] if 0 <= k < len(req["outputs"]) else FILLER


# -- driving a scheduler -----------------------------------------------------------------------------
class LocalOps:
    """The reference module's objects, driven directly."""

    def __init__(self, module) -> None:
        self.m = module

    def start(self, cfg: dict) -> None:
        self.s = self.m.make_scheduler(**cfg)

    def sequence(self, req: dict, seq_id: int):
        return self.m.Sequence(req["prompt"], max_tokens=req["max_tokens"], ignore_eos=req["ignore_eos"],
                               seq_id=seq_id)

    def add(self, seq) -> None:
        self.s.add(seq)

    def schedule(self):
        return self.s.schedule()

    def postprocess(self, seqs, tokens, is_prefill) -> None:
        self.s.postprocess(seqs, tokens, is_prefill)

    def snapshot(self, seqs) -> dict:
        return self.m.snapshot(self.s, seqs)

    key = staticmethod(id)


class StudentOps(LocalOps):
    """The student's objects, which stay in their process (driven through handles)."""

    def __init__(self, t: Trial) -> None:
        self.t = t

    def start(self, cfg: dict) -> None:
        self.s = self.t.yours.make_scheduler(cfg["num_blocks"], cfg["block_size"], cfg["max_num_seqs"],
                             cfg["max_num_batched_tokens"], eos=cfg["eos"])
        if not isinstance(self.s, Remote):
            raise CheckFailed(f"make_scheduler should return a Scheduler object; yours returned {describe(self.s)}")

    def sequence(self, req: dict, seq_id: int):
        return self.t.yours.Sequence(list(req["prompt"]), max_tokens=req["max_tokens"],
                           ignore_eos=req["ignore_eos"], seq_id=seq_id)

    def add(self, seq) -> None:
        self.s.add(seq)

    def schedule(self):
        got = self.s.schedule()
        if not (isinstance(got, (tuple, list)) and len(got) == 2 and isinstance(got[0], list)
                and all(isinstance(x, Remote) for x in got[0]) and isinstance(got[1], bool)):
            raise CheckFailed("schedule() should return (seqs, is_prefill): a list of Sequence objects and a bool; "
                              f"yours returned {describe(got)}")
        return got

    def postprocess(self, seqs, tokens, is_prefill) -> None:
        self.s.postprocess(list(seqs), list(tokens), is_prefill)

    def snapshot(self, seqs) -> dict:
        return self.t.yours.snapshot(self.s, list(seqs))

    key = staticmethod(lambda h: h)


def _view(snap: Any, ids: dict[int, str], watch: list[str]) -> dict:
    """A snapshot with seq ids turned into request names ('?' for a sequence the script did not make)."""
    if not (isinstance(snap, dict) and isinstance(snap.get("seqs"), list) and len(snap["seqs"]) == len(watch)):
        raise CheckFailed(f"snapshot() should return the course's plain-data state; yours returned {describe(snap)} "
                          "(restore the provided snapshot function)")
    name = lambda i: ids.get(i, "?") if isinstance(i, int) else "?"
    seqs = {}
    for n, s in zip(watch, snap["seqs"]):
        table = s["block_table"] if isinstance(s.get("block_table"), list) else []
        seqs[n] = {"status": s["status"], "num_tokens": s["num_tokens"], "completion": s["completion"],
                   "num_computed_tokens": s["num_computed_tokens"], "num_scheduled_tokens": s["num_scheduled_tokens"],
                   "blocks": len(table), "table": table}
    return {"waiting": [name(i) for i in snap["waiting"]], "running": [name(i) for i in snap["running"]],
            "free": len(snap["free_blocks"]), "free_ids": list(snap["free_blocks"]), "finished": snap["finished"],
            "seqs": seqs}


def drive(ops: LocalOps, sc: dict, max_steps: int) -> Iterator[tuple[str, dict]]:
    """Run a script: yield ("schedule", record) after each schedule() and ("after", record) after its postprocess().

    A round first adds the requests arriving at it; when nothing is live, the clock jumps to the next arrival.
    Request i of the script is the Sequence with seq_id i. The state of the sequences a step can touch is read
    (those running and the first max_num_seqs waiting); the queues are read whole.
    """
    reqs = {r["name"]: r for r in sc["requests"]}
    ids = {i: r["name"] for i, r in enumerate(sc["requests"])}
    order = sorted(range(len(sc["requests"])), key=lambda i: sc["requests"][i]["arrive"])
    ops.start(sc["config"])
    objs, index = {}, {}
    nxt, live, clock, step = 0, [], 0, 0
    running, waiting = [], []
    while step < max_steps:
        added = []
        while nxt < len(order) and sc["requests"][order[nxt]]["arrive"] <= clock:
            r = sc["requests"][order[nxt]]
            objs[r["name"]] = obj = ops.sequence(r, order[nxt])
            nxt += 1
            index[ops.key(obj)] = r["name"]
            ops.add(obj)
            live.append(r["name"])
            added.append(r["name"])
        if not live:
            if nxt == len(order):
                return
            clock = sc["requests"][order[nxt]]["arrive"]
            continue
        step += 1
        near = set(running) | set((waiting + added)[:sc["config"]["max_num_seqs"]])
        watch = [n for n in live if n in near]
        handles = [objs[n] for n in watch]
        batch, is_prefill = ops.schedule()
        rec = {"step": step, "clock": clock, "added": added, "prefill": is_prefill,
               "batch": [index.get(ops.key(o), "?") for o in batch]}
        rec["sched"] = _view(ops.snapshot(handles), ids, watch)
        yield "schedule", rec
        rec["tokens"] = [runner_token(reqs.get(n), rec["sched"]["seqs"].get(n)) for n in rec["batch"]]
        ops.postprocess(batch, rec["tokens"], is_prefill)
        rec["after"] = after = _view(ops.snapshot(handles), ids, watch)
        yield "after", rec
        live = [n for n in live if after["seqs"].get(n, {}).get("status") != FINISHED]
        running, waiting = after["running"], after["waiting"]
        clock += 1


def drive_reference(module, sc: dict, max_steps: int = 100_000) -> list[dict]:
    """The reference's whole trace of a script, as plain data."""
    return [rec for phase, rec in drive(LocalOps(module), sc, max_steps) if phase == "after"]


# -- describing ----------------------------------------------------------------------------------------
def names(xs: list[str]) -> str:
    return "[" + ", ".join(xs) + "]" if len(xs) <= 12 else f"[{', '.join(xs[:10])}, … ({len(xs)})]"


def describe_case(sc: dict) -> str:
    c, reqs = sc["config"], sc["requests"]
    cfg = (f"block_size {c['block_size']}, {c['num_blocks']} blocks, max_num_seqs {c['max_num_seqs']}, "
           f"max_num_batched_tokens {c['max_num_batched_tokens']}, eos {c['eos']}")
    if len(reqs) <= 5:
        who = "; ".join(f"{r['name']}: {len(r['prompt'])}-token prompt, max_tokens {r['max_tokens']}"
                        + (", ignore_eos" if r["ignore_eos"] else "") + (f", arrives at round {r['arrive']}"
                                                                         if r["arrive"] else "") for r in reqs)
    else:
        lens, mts = [len(r["prompt"]) for r in reqs], [r["max_tokens"] for r in reqs]
        who = (f"{len(reqs)} requests, prompts of {min(lens)}–{max(lens)} tokens, max_tokens {min(mts)}–{max(mts)}, "
               f"arriving over rounds 0–{max(r['arrive'] for r in reqs)}")
    return f'case "{sc["name"]}": {cfg}\n  {who}'


def chunk_text(n: str, s: dict) -> str:
    c, k, total = s["num_computed_tokens"], s["num_scheduled_tokens"], s["num_tokens"]
    return f"{n}: tokens {c}–{c + k - 1} of {total}" if k > 1 else f"{n}: token {c} of {total}"


def step_text(rec: dict) -> str:
    """What the reference did in this step, in one or two lines."""
    kind = "prefill" if rec["prefill"] else "decode"
    chunks = ", ".join(chunk_text(n, rec["sched"]["seqs"][n]) for n in rec["batch"][:6])
    more = f", … ({len(rec['batch'])} sequences)" if len(rec["batch"]) > 6 else ""
    lines = [f"step {rec['step']}: schedule() → {kind} [{chunks}{more}]"]
    if "tokens" in rec:
        said = []
        for n, tok in list(zip(rec["batch"], rec["tokens"]))[:6]:
            s = rec["sched"]["seqs"][n]
            partial = s["num_computed_tokens"] + s["num_scheduled_tokens"] < s["num_tokens"]
            said.append(f"{n} → {tok}" + (" (candidate of an unfinished chunk)" if partial else ""))
        lines.append("  the runner returned " + ", ".join(said) + (", …" if len(rec["batch"]) > 6 else ""))
    return "\n".join(lines)


def before_text(prev: dict | None, rec: dict) -> str:
    waiting = (prev["after"]["waiting"] if prev else []) + rec["added"]
    running = prev["after"]["running"] if prev else []
    free = prev["after"]["free"] if prev else None
    return (f"before step {rec['step']}: waiting {names(waiting)}, running {names(running)}"
            + (f", {free} free blocks" if free is not None else ""))


# -- comparing one step and explaining the first difference ----------------------------------------
def first_difference(sc: dict, phase: str, want: dict, got: dict, prev: dict | None) -> str | None:
    """The teaching message for the first difference between the reference's step and the student's, or None."""
    finding = (_schedule_difference if phase == "schedule" else _after_difference)(sc, want, got, prev)
    if finding is None:
        return None
    what, hint = finding
    lines = [describe_case(sc), before_text(prev, want), step_text(want), what]
    return "\n".join(lines + ([f"hint: {hint}"] if hint else []))


def _schedule_difference(sc: dict, want: dict, got: dict, prev: dict | None):
    cfg, ws, gs = sc["config"], want["sched"], got["sched"]
    s = want["step"]
    before_running = prev["after"]["running"] if prev else []
    if want["prefill"] != got["prefill"]:
        head = (prev["after"]["waiting"] if prev else []) + want["added"]
        if want["prefill"]:
            return (f"step {s} should be a prefill of {names(want['batch'])}; yours decodes {names(got['batch'])}",
                    "decode before prefill: prefill has strict priority; schedule() decodes only when no waiting "
                    "sequence can be prefilled")
        return (f"step {s} should decode {names(want['batch'])}; yours prefills {names(got['batch'])}",
                f"nothing can be prefilled: waiting[0] = {head[0]} needs blocks for all its tokens and only "
                f"{prev['after']['free'] if prev else '?'} are free; FCFS means no later request is tried instead"
                if head else "")
    if want["batch"] != got["batch"]:
        return _batch_difference(cfg, want, got, before_running)
    for n in want["batch"]:
        a, b = ws["seqs"][n]["num_scheduled_tokens"], gs["seqs"][n]["num_scheduled_tokens"]
        if a != b:
            st = ws["seqs"][n]
            if not want["prefill"]:
                return (f"after step {s}'s schedule() request {n} should have num_scheduled_tokens 1; yours has {b}",
                        "a decode step computes exactly one token per sequence")
            left = st["num_tokens"] - st["num_computed_tokens"]
            used = sum(ws["seqs"][m]["num_scheduled_tokens"] for m in want["batch"][:want["batch"].index(n)])
            budget = cfg["max_num_batched_tokens"] - used
            hint = ("a chunk never exceeds the token budget left" if b > budget else
                    "a sequence mid-prefill has only num_tokens − num_computed_tokens tokens left to compute"
                    if b > left else "")
            return (f"after step {s}'s schedule() request {n} should have num_scheduled_tokens "
                    f"min(tokens left {left}, budget left {budget}) = {a}; yours has {b}", hint)
    if (ws["waiting"], ws["running"]) != (gs["waiting"], gs["running"]):
        return _queue_difference(want, got, before_running)
    return _fields_difference(want, got, ws, gs, f"after step {s}'s schedule()", sc)


def _batch_difference(cfg: dict, want: dict, got: dict, before_running: list[str]):
    s, w, g = want["step"], want["batch"], got["batch"]
    kind = "prefill" if want["prefill"] else "decode"
    what = f"step {s}'s {kind} batch should be {names(w)}; yours is {names(g)}"
    k = next((i for i, (a, b) in enumerate(zip(w, g)) if a != b), min(len(w), len(g)))
    ws = want["sched"]
    if not want["prefill"]:
        lost = [n for n in w if n not in g and n in got["sched"]["waiting"]]
        if lost:
            victims = [n for n in ws["waiting"] if n in before_running]
            return what, (f"yours preempted {lost[0]}, which should be decoded in this step: " +
                          (f"when a decode needs a block, the victim is the sequence at the right end of running "
                           f"({victims[-1]}), not the next one in line" if victims else
                           "no sequence needs to be preempted in this step"))
        preempted = [n for n in g if n in ws["waiting"]]
        if preempted:
            return what, (f"{preempted[0]} had to be preempted in this step to free a block; the victim is the "
                          "sequence at the right end of running")
        if len(g) > cfg["max_num_seqs"]:
            return what, f"at most max_num_seqs = {cfg['max_num_seqs']} sequences per batch"
        return what, "the decode batch takes sequences from the left end of running, in order"
    if len(g) > cfg["max_num_seqs"]:
        return what, f"at most max_num_seqs = {cfg['max_num_seqs']} sequences per batch"
    head = ws["waiting"][0] if ws["waiting"] else None  # where the reference stopped
    if k == len(w) and head is not None:
        used = sum(ws["seqs"][n]["num_scheduled_tokens"] for n in w)
        left = cfg["max_num_batched_tokens"] - used
        h = ws["seqs"][head]
        need = h["num_tokens"] - h["num_computed_tokens"]
        if g[k] != head:
            return what, (f"strict FCFS: waiting[0] is never skipped; {head} does not fit, so the batch stops "
                          f"before {g[k]}")
        if left == 0:
            return what, f"the token budget ({cfg['max_num_batched_tokens']}) is used up, so the batch stops"
        if need > left:
            return what, (f"only the first sequence of a batch may be chunked: {head} needs {need} tokens and only "
                          f"{left} are left in the budget, so the batch stops")
        return what, (f"{head} needs blocks for all its {h['num_tokens']} tokens and only {ws['free']} are free, "
                      "so the batch stops")
    if k < len(w) and k < len(g) and g[k] not in w:
        return what, f"strict FCFS: the sequences are taken from the head of waiting in order; {w[k]} comes first"
    if k == len(g) < len(w):
        left = cfg["max_num_batched_tokens"] - sum(ws["seqs"][n]["num_scheduled_tokens"] for n in w[:k])
        return what, (f"{w[k]} fits too: its {ws['seqs'][w[k]]['num_scheduled_tokens']} tokens are within the {left} "
                      "left in the budget, and the prefill loop goes on while waiting[0] fits")
    return what, ""


def _queue_difference(want: dict, got: dict, before_running: list[str]):
    s, ws, gs = want["step"], want["sched"], got["sched"]
    what = (f"after step {s}'s schedule() waiting should be {names(ws['waiting'])} and running "
            f"{names(ws['running'])}; yours: waiting {names(gs['waiting'])}, running {names(gs['running'])}")
    victims_w = [n for n in ws["waiting"] if n in before_running]
    victims_g = [n for n in gs["waiting"] if n in before_running]
    if set(victims_w) != set(victims_g) and victims_g:
        if victims_w and before_running.index(victims_g[0]) < before_running.index(victims_w[0]):
            return what, (f"preempted from the head instead of the tail: the victim is the sequence at the right end "
                          f"of running ({victims_w[0]}), the most recently admitted, not one nearer its left end")
        return what, "when a decode needs a block and none is free, preempt the sequence at the right end of running"
    if victims_w and set(victims_w) == set(victims_g):
        return what, ("a preempted sequence goes to the front of waiting (appendleft), ahead of requests that never "
                      "ran; several victims of one step end up in their running order")
    for n in want["batch"]:
        in_run_w, in_run_g = n in ws["running"], n in gs["running"]
        if in_run_w and not in_run_g:
            return what, (f"{n}'s chunk completes its prompt, so schedule() makes it RUNNING and moves it from "
                          "waiting to the right end of running")
        if in_run_g and not in_run_w:
            return what, f"{n}'s chunk leaves tokens to compute: it stays at the head of waiting, WAITING"
    if not want["prefill"]:
        return what, "after a decode the batch goes back to the left end of running, in its order"
    return what, ""


def _fields_difference(want: dict, got: dict, ws: dict, gs: dict, when: str, sc: dict):
    order = want["batch"] + [n for n in ws["seqs"] if n not in want["batch"]]
    for n in order:
        f = differing_field(ws["seqs"][n], gs["seqs"][n])
        if f:
            return _field_message(when, n, f, ws["seqs"][n], gs["seqs"][n], want, sc)
    if ws["free"] != gs["free"]:
        return (f"{when} the pool should have {ws['free']} free blocks; yours has {gs['free']}",
                "every block a sequence gives back (finished or preempted) returns to the free list")
    if ws["finished"] != gs["finished"]:
        return (f"{when} is_finished() should be {ws['finished']}; yours is {gs['finished']}",
                "is_finished() is true exactly when both waiting and running are empty")
    return None


def differing_field(a: dict, b: dict) -> str | None:
    """The first field of a sequence's state that differs. A finished sequence's num_computed_tokens is not
    compared: its blocks are gone (nano-vllm's deallocate zeroes it, the course's allocator leaves it)."""
    finished = a["status"] == b["status"] == FINISHED
    return next((f for f in FIELDS if a[f] != b[f] and not (finished and f == "num_computed_tokens")), None)


def _field_message(when: str, n: str, f: str, a: dict, b: dict, want: dict, sc: dict):
    req = next(r for r in sc["requests"] if r["name"] == n)
    sched = want["sched"]["seqs"][n]
    chunk = sched["num_scheduled_tokens"]
    before = sched["num_computed_tokens"]
    in_batch = n in want["batch"]
    partial = in_batch and want["prefill"] and before + chunk < sched["num_tokens"]
    tok = want["tokens"][want["batch"].index(n)] if in_batch and "tokens" in want else None
    head = f"{when} request {n} should be {a['status']}"
    show = lambda v: names([str(x) for x in v]) if isinstance(v, list) else str(v)
    what = f"{head} with {f} {show(a[f])}; yours has {show(b[f])}" if f != "status" else \
        f"{head}; yours is {b['status']}"
    hint = ""
    if f == "num_computed_tokens":
        if b[f] == before and chunk and "tokens" in want:
            what, hint = what + ": the chunk was not counted", \
                "postprocess adds each sequence's num_scheduled_tokens to num_computed_tokens, prefill and decode alike"
        elif b[f] == before + 1 and chunk > 1:
            hint = f"count the whole chunk ({chunk} tokens), not one token"
        elif a[f] == 0 and b[f] > 0:
            hint = "preemption recomputes from scratch: reset the victim's num_computed_tokens to 0"
        elif "tokens" not in want and b[f] == before + chunk:
            hint = "num_computed_tokens grows in postprocess, after the model ran, not in schedule()"
        elif b[f] == a["num_tokens"] or b[f] == b["num_tokens"]:
            hint = "the newly sampled token has no K/V yet: num_computed_tokens stays one behind num_tokens"
    elif f == "num_tokens" or f == "completion":
        if b["num_tokens"] == a["num_tokens"] + 1 and partial:
            what = f"{head} with num_tokens {a['num_tokens']}; yours has {b['num_tokens']}: " \
                   f"the candidate token of an unfinished chunk was appended"
            hint = (f"{n}'s prompt is not complete after this chunk ({before + chunk} of {sched['num_tokens']} "
                    "computed): postprocess discards the runner's token")
        elif b["num_tokens"] == a["num_tokens"] - 1:
            what = f"{head} with num_tokens {a['num_tokens']}; yours has {b['num_tokens']}: the sampled token " \
                   f"{tok} was not appended"
            hint = ("EOS is appended first, so it stays in the output; then the sequence finishes"
                    if tok == sc["config"]["eos"] and b["status"] == FINISHED else
                    "once num_computed_tokens reaches num_tokens (a final chunk, or any decode) the token is appended")
        elif f == "completion":
            hint = "append exactly the token the runner returned for this sequence (tokens come in batch order)"
    elif f == "status":
        if a["status"] == FINISHED:
            last = a["completion"][-1] if a["completion"] else None
            hint = ("EOS finishes a sequence (it is appended first, so it stays in the output)"
                    if last == sc["config"]["eos"] and not req["ignore_eos"] else
                    f"finish when num_completion_tokens reaches max_tokens = {req['max_tokens']} (checked after "
                    "appending)")
        elif b["status"] == FINISHED:
            hint = ("the candidate of an unfinished chunk is discarded, even when it is EOS" if partial else
                    "ignore_eos: this request stops only at max_tokens" if req["ignore_eos"] and
                    tok == sc["config"]["eos"] else
                    f"max_tokens = {req['max_tokens']} counts completion tokens; this one has "
                    f"{len(a['completion'])}")
        elif a["status"] == RUNNING and b["status"] == WAITING and in_batch:
            hint = "a sequence becomes RUNNING when its final chunk is scheduled (in schedule(), before the model runs)"
        elif a["status"] == WAITING and b["status"] == RUNNING and in_batch:
            hint = "a sequence stays WAITING until the chunk that completes its prompt is scheduled"
        elif a["status"] == WAITING:
            hint = "a preempted sequence is WAITING again"
    elif f == "blocks":
        if a[f] == 0 and a["status"] == FINISHED:
            hint = "a finished sequence gives its blocks back (deallocate)"
        elif a[f] == 0:
            hint = "preemption gives the victim's blocks back (deallocate)"
        elif in_batch and not want["prefill"] and b[f] == a[f] - 1:
            hint = "its newest token starts a new block: call block_manager.may_append in the decode step"
        elif in_batch and b[f] < a[f]:
            hint = "allocate blocks for all of the sequence's tokens when it is admitted, not just for the chunk"
    elif f == "num_scheduled_tokens" and a[f] == 0:
        hint = "postprocess resets num_scheduled_tokens to 0" if "tokens" in want else \
            "only the sequences of this step's batch have scheduled tokens"
    return what, hint


def _after_difference(sc: dict, want: dict, got: dict, prev: dict | None):
    wa, ga = want["after"], got["after"]
    when = f"after step {want['step']}"
    for n in want["batch"] + [n for n in wa["seqs"] if n not in want["batch"]]:
        f = differing_field(wa["seqs"][n], ga["seqs"][n])
        if f:
            return _field_message(when, n, f, wa["seqs"][n], ga["seqs"][n], want, sc)
    if (wa["waiting"], wa["running"]) != (ga["waiting"], ga["running"]):
        gone = [n for n in ga["running"] if n in wa["seqs"] and wa["seqs"][n]["status"] == FINISHED]
        return (f"{when} waiting should be {names(wa['waiting'])} and running {names(wa['running'])}; yours: "
                f"waiting {names(ga['waiting'])}, running {names(ga['running'])}",
                f"remove a finished sequence ({gone[0]}) from running" if gone else "")
    return _fields_difference(want, got, wa, ga, when, sc)


# -- running the student's trace against the reference's -----------------------------------------------
def run_trace(t: Trial, sc: dict, expected: list[dict], *, full: bool = False) -> tuple[list[dict], str | None]:
    """Drive the student's scheduler through `sc`, comparing every step with `expected`.

    Returns the student's records and the first difference's message (None if none). Without `full` the
    drive stops at the first difference; with it, it goes on (for the figure) until the script ends,
    the student's code fails after the difference, or a few steps past the reference's last.
    """
    from grader.isolation.session import StudentError, StudentRaised

    records, message = [], None
    gen = drive(StudentOps(t), sc, len(expected) + (3 if full else 1))
    while True:
        try:
            phase, rec = next(gen)
        except StopIteration:
            break
        except (StudentRaised, StudentError, CheckFailed):
            if message is None:
                raise
            break
        if phase == "after":
            records.append(rec)
        if message is not None:
            continue
        i = rec["step"] - 1
        if i >= len(expected):
            message = (f"{describe_case(sc)}\nafter step {len(expected)} every request has finished and "
                       f"is_finished() is True; yours schedules a step {i + 1} "
                       f"({'prefill' if rec['prefill'] else 'decode'} {names(rec['batch'])})")
        else:
            message = first_difference(sc, phase, expected[i], rec, expected[i - 1] if i else None)
        if message is not None and not full:
            gen.close()
            break
    if message is None and len(records) < len(expected):
        message = (f"{describe_case(sc)}\nyour trace ends after step {len(records)}, "
                   f"the reference's after step {len(expected)}")
    return records, message


def expect_trace(t: Trial, sc: dict) -> list[dict]:
    """Compare the student's trace of `sc` with the reference's; raise the first difference."""
    expected = t.ref.drive(drive_reference, sc)
    records, message = run_trace(t, sc, expected)
    if message:
        raise CheckFailed(message)
    return records
