"""The engine loop: ch27's EngineCore drives it, ch24's scheduler plans each step, the executor runs it.

`Loop.core()` is a subclass of ch27's `EngineCore` (the student's class where their task passes): its own `run` and
`step` drive the engine (schedule → execute → update) and its `update_from_output` appends the tokens to ch27's
requests and checks their stop conditions. Two methods are this engine's: `schedule`, where ch24's `Scheduler`
(paged blocks, chunked prefill, preemption) decides and ch27's counters follow it (vLLM's scheduler does both, the
course teaches them in two chapters), and the tail of `update_from_output`, which folds the same tokens into ch24's
sequences with `postprocess` and checks that the two chapters agree on every request. ch30's lowering admits each
request (`lower_request`: its record and first step's inputs); the engine keeps each record's counters up to date,
and ch30's `select_phase` reads every step's phase from the records of its batch.

Speculative decoding (`Settings.speculative_tokens` > 0): in a decode step each request proposes up to k drafts
(`engine.drafter`, n-gram prompt lookup), trimmed to the room its blocks already have (ch25's block manager allocates
one token ahead; vLLM allocates slots for the lookahead), ch27's `schedule_spec` counts them, the executor verifies
them with ch32's `verify_draft`, ch27's `update_spec` rolls back the rejected ones, and ch24's `postprocess` takes
the kept tokens one at a time.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from engine.blocks import PagedBlocks
from engine.drafter import propose
from engine.errors import EngineError
from engine.executor import Executor
from engine.model import Model
from engine.runner import Trace
from engine.words import tr

ONE_TOKEN = 1
"""What one kept token of a speculative step counts as, when ch24's postprocess folds it in."""
DISCARDED = -1
"""The token handed to ch24's postprocess for a sequence whose step kept no sample (a non-final chunk)."""


class Loop:
    """One generate call's state: ch24's scheduler over ch25's blocks, the executor, the requests, what is counted."""

    def __init__(
        self, model: Model, parts: Any, settings: Any, prompts: list[list[int]], max_tokens: list[int], trace_request: int, probe: bool
    ) -> None:
        self.model, self.parts, self.settings = model, parts, settings
        c, s, bs = model.config, settings, settings.block_size
        num_blocks = s.num_blocks or sum(-(-(len(p) + m + s.speculative_tokens) // bs) for p, m in zip(prompts, max_tokens))
        self.trace = Trace()
        self.probes: list[dict] | None = [] if probe else None
        self.counts = dict.fromkeys(
            (
                "steps",
                "prefill_steps",
                "decode_steps",
                "chunked_prefill_steps",
                "preemptions",
                "prefix_cache_hits",
                "prefix_cached_tokens",
                "computed_tokens",
                "speculative_steps",
                "draft_tokens",
                "accepted_tokens",
            ),
            0,
        )
        eos = -1 if c.eos_token_id is None else c.eos_token_id
        self.scheduler = parts.fn("Scheduler")(num_blocks, bs, s.max_num_seqs, s.max_num_batched_tokens, eos)
        self.blocks = PagedBlocks(parts.fn("BlockManager")(num_blocks, bs), parts["BlockManager"].companion, num_blocks, bs)
        self.scheduler.block_manager = self.blocks  # the course's scheduler holds its allocator as state
        sequence = parts["Scheduler"].companion
        self.seqs = [
            sequence(p, max_tokens=m, ignore_eos=c.eos_token_id is None, seq_id=i) for i, (p, m) in enumerate(zip(prompts, max_tokens))
        ]
        self.traced = self.seqs[trace_request]
        self.traced_id = trace_request
        self.records: dict[int, np.ndarray] = {}
        """seq_id → its ch30 record (lowered on admission, its counters kept up to date by the engine)."""
        self.scheduler_part = "Scheduler"
        self.executor = Executor(self, num_blocks=num_blocks)
        self.chunk_times: list[list[float]] = [[] for _ in prompts]
        self.sampling = {"temperature": float(s.temperature), "top_p": float(s.top_p), "top_k": s.top_k, "seed": s.seed}
        self.start = time.perf_counter()
        self.on_step: Callable[[int, int], None] | None = None
        self.total = sum(max_tokens)
        self.max_steps = sum(len(p) + m for p, m in zip(prompts, max_tokens)) * 4 + 100

    # -- admission --------------------------------------------------------------------------------------------------

    def admit(self, core: Any) -> None:
        """Lower each request (ch30) and add it to ch27's core and ch24's scheduler."""
        for seq in self.seqs:
            prompt = list(seq.token_ids)
            request = {"request_id": seq.seq_id, "prompt_token_ids": prompt, "sampling_params": self.sampling_of(seq)}
            try:
                record, ids, positions = self._lower(request, seq.seq_id == self.traced.seq_id, "admit", "admit the request")
            except ValueError as e:
                raise EngineError(tr("request {id}: ch30's lower_request refused it: {error}", id=seq.seq_id, error=e)) from None
            if ids.tolist() != prompt or positions.tolist() != list(range(len(prompt))):
                raise EngineError(
                    tr(
                        "request {id}: ch30's lower_request gives input ids {ids}… at positions {positions}…, not its prompt at 0 … {last}",
                        id=seq.seq_id,
                        ids=ids.tolist()[:8],
                        positions=positions.tolist()[:8],
                        last=len(prompt) - 1,
                    )
                )
            self.records[seq.seq_id] = record
            core.add_request(str(seq.seq_id), prompt, seq.max_tokens, None if seq.ignore_eos else self.scheduler.eos)
            try:
                self.scheduler.add(seq)
            except ValueError as e:
                raise EngineError(tr("request {id}: {error} (raise --num-blocks)", id=seq.seq_id, error=e)) from None

    def sampling_of(self, seq: Any) -> dict:
        """The request's sampling parameters, as ch30's lowering takes them."""
        return {**self.sampling, "max_tokens": seq.max_tokens}

    def cached(self, seq: Any) -> int:
        """Tokens of `seq` the prefix cache served when it was last admitted."""
        return self.blocks.cached_tokens.get(seq.seq_id, 0)

    def _lower(self, request: dict, traced: bool, kind: str, stage: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        part = self.parts["lower_request"]
        out = part.fn(request)
        self.trace.count(part)
        if traced:
            self.note(
                kind, stage, "lower_request", tr("record of {size} bytes · input_ids [{n}]", size=out[0].dtype.itemsize, n=len(out[1]))
            )
        return out

    # -- ch27's core, driven by ch24's scheduler ----------------------------------------------------------------------

    def core(self) -> Any:
        """A ch27 EngineCore whose scheduler is ch24's and whose executor runs the model."""
        base = self.parts.fn("EngineCore")
        loop = self

        class ChapterCore(base):  # type: ignore[misc, valid-type]
            """ch27's EngineCore; `schedule` is ch24's, `update_from_output` ch27's followed by ch24's postprocess."""

            def __init__(self) -> None:
                super().__init__(loop.settings.max_num_batched_tokens, loop.settings.max_num_seqs)
                self.executor = loop.executor

            def schedule(self) -> dict:
                return loop.schedule(self)

            def update_from_output(self, scheduler_output: dict, runner_output: dict) -> list[dict]:
                return loop.update(self, scheduler_output, runner_output, super().update_from_output)

        return ChapterCore()

    def schedule(self, core: Any) -> dict:
        """ch24 picks the batch; ch27's requests advance as it says; drafts are proposed and counted (ch27.3)."""
        if self.scheduler.is_finished():
            left = [rid for rid, r in core.requests.items() if not r.is_finished]
            raise EngineError(
                tr(
                    "ch24's scheduler finished every request, but ch27's EngineCore still has {requests} unfinished "
                    "(its update_from_output did not mark them finished)",
                    requests=", ".join(left),
                )
            )
        if self.counts["steps"] >= self.max_steps:
            raise EngineError(tr("no end after {steps} steps: ch27's EngineCore loop does not finish", steps=self.counts["steps"]))
        was_running = {seq.seq_id for seq in self.scheduler.running}
        batch, is_prefill = self.scheduler.schedule()
        preempted = [seq for seq in self.scheduler.waiting if seq.seq_id in was_running]
        for seq in preempted:  # vLLM's preemption: the request waits again and will be recomputed from position 0
            request = core.requests[str(seq.seq_id)]
            request.status, request.num_computed_tokens = "WAITING", 0
        drafts = {} if is_prefill or not self.settings.speculative_tokens else self._drafts(batch)
        kind = "prefill" if is_prefill else "speculative" if str(self.traced.seq_id) in drafts else "decode"
        self._count(batch, is_prefill, preempted, drafts)
        self.trace.on = self.traced in batch and not any(e["kind"] == kind for e in self.trace.events)
        self.trace.kind = kind
        if self.trace.on:
            self.note(kind, "engine core step", "EngineCore", tr("schedule → execute → update"))
        self._check_phase(batch, is_prefill, kind)
        plan, new, spec = {}, {}, {}
        schedule_spec = self.parts.fn("schedule_spec")
        for seq in batch:
            rid = str(seq.seq_id)
            request = core.requests[rid]
            if request.status == "WAITING":
                request.status = "RUNNING"
                new[rid] = list(seq.token_ids)
            if rid in drafts:
                request.spec_token_ids = list(drafts[rid])
                planned = schedule_spec(request)
                self.trace.count(self.parts["schedule_spec"])
                if (
                    planned.get("num_scheduled_tokens") != 1 + len(drafts[rid])
                    or list(planned.get("scheduled_spec_token_ids", [])) != drafts[rid]
                ):
                    raise EngineError(
                        tr(
                            "request {id}: ch27's schedule_spec planned {planned} for its newest token and {n} drafts {drafts}",
                            id=rid,
                            planned=repr(planned)[:120],
                            n=len(drafts[rid]),
                            drafts=drafts[rid],
                        )
                    )
                plan[rid], spec[rid] = planned["num_scheduled_tokens"], list(drafts[rid])
                if seq is self.traced and self.trace.on:
                    self.note(
                        kind, "count the drafts", "schedule_spec", tr("{n} drafts → {m} tokens to compute", n=len(drafts[rid]), m=plan[rid])
                    )
            else:
                request.num_computed_tokens += seq.num_scheduled_tokens
                plan[rid] = seq.num_scheduled_tokens
        return {
            "num_scheduled_tokens": plan,
            "scheduled_new_reqs": new,
            "scheduled_spec_token_ids": spec,
            "batch": batch,
            "kind": kind,
            "is_prefill": is_prefill,
        }

    def _drafts(self, batch: list) -> dict[str, list[int]]:
        """Each decoding sequence's n-gram drafts, no more than its blocks have room for nor its max_tokens allows."""
        k, out = self.settings.speculative_tokens, {}
        for seq in batch:
            room = min(k, self.blocks.room(seq), seq.max_tokens - seq.num_completion_tokens - 1)
            drafts = propose(list(seq.token_ids), k=room) if room > 0 else []
            if drafts:
                out[str(seq.seq_id)] = drafts
        return out

    def _check_phase(self, batch: list, is_prefill: bool, kind: str) -> None:
        """ch30's select_phase over the batch's records must name the phase the records are in."""
        phase, expected = self.phase([(seq.seq_id, seq.num_tokens, seq.num_computed_tokens, seq.num_prompt_tokens) for seq in batch], kind)
        if phase != expected:
            raise EngineError(
                tr(
                    "ch30's select_phase says {phase} for a batch whose records are in the {expected} phase (ch24's "
                    "scheduler made it a {kind} step)",
                    phase=repr(phase),
                    expected=expected,
                    kind="prefill" if is_prefill else "decode",
                )
            )

    def phase(self, entries: list[tuple[int, int, int, int]], kind: str) -> tuple[str, str]:
        """The records of this step's requests, brought up to date as the native core's front end keeps them (the
        counters of (seq_id, num_tokens, num_computed_tokens, prompt_len); each was lowered by ch30 on admission),
        then ch30's select_phase over them: (its phase, the phase the records are in). A decode record is one whose
        only token without KV is an output token (a resumed sequence's last prefill chunk of one token is one too,
        so the phase expected is the records', not always the scheduler's)."""
        rows = []
        for seq_id, num_tokens, computed, prompt_len in entries:
            record = self.records[seq_id]
            decode = computed == num_tokens - 1 and num_tokens > prompt_len
            record["num_tokens"], record["num_computed_tokens"] = num_tokens, computed
            record["num_new_tokens"], record["is_prompt"] = num_tokens - computed, not decode
            rows.append(record)
        phase = self.parts.fn("select_phase")(np.concatenate(rows))
        self.trace.count(self.parts["select_phase"])
        if self.trace.on:
            self.note(kind, "the step's phase", "select_phase", tr("{n} records → {phase}", n=len(rows), phase=repr(phase)))
        expected = "prompt" if any(bool(r["is_prompt"][0]) for r in rows) else "decode"
        return phase, expected

    def update(
        self, core: Any, scheduler_output: dict, runner_output: dict, chapter_update: Callable[[dict, dict], list[dict]]
    ) -> list[dict]:
        """ch27 appends the tokens and checks the stops (update_from_output; update_spec for drafts), then ch24's
        postprocess does the same to its sequences; the two must agree."""
        spec = scheduler_output["scheduled_spec_token_ids"]
        plain = {k: v for k, v in scheduler_output["num_scheduled_tokens"].items() if k not in spec}
        outputs = chapter_update(
            {**scheduler_output, "num_scheduled_tokens": plain}, {k: v for k, v in runner_output.items() if k in plain}
        )
        update_spec = self.parts.fn("update_spec")
        for rid, drafts in spec.items():
            request = core.requests[rid]
            new = update_spec(request, drafts, list(runner_output.get(rid, [])))
            self.trace.count(self.parts["update_spec"])
            if new:
                outputs.append({"request_id": rid, "new_token_ids": list(new), "finished": request.is_finished})
        self._postprocess(scheduler_output, runner_output)
        self._agree(core, scheduler_output["batch"])
        self.counts["steps"] += 1
        if self.on_step:
            self.on_step(sum(seq.num_completion_tokens for seq in self.seqs), self.total)
        self.trace.on = False
        return outputs

    def _postprocess(self, scheduler_output: dict, runner_output: dict) -> None:
        """ch25 hashes the blocks each token completed, ch24 appends the tokens (a speculative request's one at a time)."""
        batch, is_prefill, kind = scheduler_output["batch"], scheduler_output["is_prefill"], scheduler_output["kind"]
        tokens = {seq.seq_id: list(runner_output.get(str(seq.seq_id), [])) for seq in batch}
        before = {seq.seq_id: seq.num_completion_tokens for seq in batch}
        for seq in batch:
            self.blocks.hash_blocks(seq)
        first = [tokens[seq.seq_id][0] if tokens[seq.seq_id] else DISCARDED for seq in batch]
        postprocess = self.scheduler.postprocess
        postprocess(batch, first, is_prefill)
        for seq in batch:
            for token in tokens[seq.seq_id][1:]:
                if seq.status == "FINISHED":
                    break
                seq.num_scheduled_tokens = ONE_TOKEN  # each kept token folds in as a step of its own
                self.blocks.hash_blocks(seq)
                postprocess([seq], [token], False)
        now = time.perf_counter() - self.start
        for seq in batch:
            if seq.num_completion_tokens > before[seq.seq_id]:
                self.chunk_times[seq.seq_id].append(now)
        if self.traced in batch and self.trace.on:
            kept = self.traced.num_completion_tokens - before[self.traced.seq_id]
            mine = tokens[self.traced.seq_id]
            self.note(
                kind,
                "postprocess",
                "Scheduler",
                tr("tokens {tokens} appended", tokens=mine)
                if kept
                else tr("token {token} discarded: the chunk did not reach the prompt's end", token=first[batch.index(self.traced)]),
            )

    def _agree(self, core: Any, batch: list) -> None:
        """ch27's requests and ch24's sequences must hold the same tokens, counters and end."""
        for seq in batch:
            request = core.requests[str(seq.seq_id)]
            mine, theirs = list(request.output_token_ids), seq.completion_token_ids
            if mine != theirs:
                raise EngineError(
                    tr(
                        "request {id}: ch27's EngineCore holds outputs {mine}, ch24's scheduler {theirs}",
                        id=seq.seq_id,
                        mine=mine[-6:],
                        theirs=theirs[-6:],
                    )
                )
            if request.is_finished != (seq.status == "FINISHED"):
                raise EngineError(
                    tr(
                        "request {id}: ch27's EngineCore says {mine}, ch24's scheduler {theirs} after {n} tokens",
                        id=seq.seq_id,
                        mine=request.status,
                        theirs=seq.status,
                        n=len(mine),
                    )
                )
            if not request.is_finished and request.num_computed_tokens != seq.num_computed_tokens:
                raise EngineError(
                    tr(
                        "request {id}: ch27 counts {mine} computed tokens, ch24 {theirs}",
                        id=seq.seq_id,
                        mine=request.num_computed_tokens,
                        theirs=seq.num_computed_tokens,
                    )
                )

    def _count(self, batch: list, is_prefill: bool, preempted: list, drafts: dict) -> None:
        kind = "prefill" if is_prefill else "decode"
        self.counts[f"{kind}_steps"] += 1
        self.counts["preemptions"] += len(preempted)
        self.counts["speculative_steps"] += bool(drafts)
        self.counts["chunked_prefill_steps"] += is_prefill and any(
            seq.num_computed_tokens + seq.num_scheduled_tokens < seq.num_tokens for seq in batch
        )

    def note(self, kind: str, stage: str, name: str, shapes: str) -> None:
        """Record a stage that is not a single function call (scheduling, bookkeeping)."""
        on, self.trace.kind, self.trace.on = self.trace.on, kind, True
        self.trace.record(stage, self.parts[name], shapes)
        self.trace.on = on

    def run(self, core: Any) -> None:
        """ch27's run: step until every request has finished."""
        for name in ("EngineCore", "Scheduler", "BlockManager"):  # classes: they run in every step
            self.trace.count(self.parts[name])
        self.trace.kind = "run"
        self.note("run", "engine core loop", "EngineCore", tr("{n} requests: step until none is unfinished", n=len(self.seqs)))
        core.run()

    def result_outputs(self) -> list[list[int]]:
        return [seq.completion_token_ids for seq in self.seqs]
