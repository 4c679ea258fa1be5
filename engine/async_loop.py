"""The engine loop with async scheduling: ch27's AsyncEngineCore, one step ahead, on the real model.

`Settings.async_scheduling` runs the student's (or the reference's) `AsyncEngineCore` as it is: its `schedule`
plans with ch27's `plan_tokens` and adds an output placeholder for every step that will sample, its `step` keeps a
batch queue of two (step N + 1 is scheduled before step N's output is back), its `reconcile` resolves the
placeholders. The executor is then the worker of vLLM v1 (`vllm/v1/worker/gpu_model_runner.py`): it keeps its own
copy of every request (the prompt it was sent once, and every token it sampled itself), so the decode that
`schedule` planned for a token still in flight finds its input id here, and it holds each request's KV blocks
through ch25's `BlockManager` (prefix hits included). ch24's scheduler has no part in this mode.

The course simplifies: `plan_tokens` has no KV-cache limit and never preempts, so the pool must hold every request
at once; speculative decoding is not combined with async scheduling.
"""

from __future__ import annotations

import time
from typing import Any

from engine.errors import EngineError
from engine.executor import Done, Row
from engine.loop import Loop
from engine.words import tr


class Track:
    """The worker's copy of one request: its tokens (prompt, then what the worker sampled), how many of them have
    KV, and its blocks (a ch25 sequence: `twin`)."""

    def __init__(self, seq_id: int, prompt: list[int], twin: Any, cached: int) -> None:
        self.seq_id, self.token_ids, self.num_prompt_tokens = seq_id, list(prompt), len(prompt)
        self.num_computed_tokens, self.twin, self.cached = 0, twin, cached
        twin.token_ids = self.token_ids  # one list: what the worker appends, the block manager sees

    @property
    def block_table(self) -> list[int]:
        return self.twin.block_table


class AsyncLoop(Loop):
    """One generate call under ch27's AsyncEngineCore; the executor keeps the requests' state (see the module)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        s, bs = self.settings, self.settings.block_size
        needed = sum(-(-(len(seq.token_ids) + seq.max_tokens) // bs) for seq in self.seqs)
        if s.num_blocks is not None and s.num_blocks < needed:
            raise EngineError(
                tr(
                    "async scheduling plans with ch27's plan_tokens, which never preempts: the pool must hold every "
                    "request at once, {needed} blocks of {size}; --num-blocks is {given}",
                    needed=needed,
                    size=bs,
                    given=s.num_blocks,
                )
            )
        self.manager = self.parts.fn("BlockManager")(s.num_blocks or needed, bs)
        self.twin_class = self.parts["BlockManager"].companion
        self.tracks: dict[str, Track] = {}
        self.scheduler_part = "AsyncEngineCore"
        self.outputs: dict[str, list[int]] = {}

    def cached(self, seq: Any) -> int:
        return seq.cached

    def core(self) -> Any:
        base = self.parts.fn("AsyncEngineCore")
        loop = self

        class Worker:
            """The executor ch27's core calls: this loop's `execute`."""

            def execute_model(self, scheduler_output: dict, non_block: bool = False) -> dict | Done:
                out = loop.execute(scheduler_output)
                return Done(out) if non_block else out

        class ChapterAsyncCore(base):  # type: ignore[misc, valid-type]
            """ch27's AsyncEngineCore on the real model; `reconcile` is ch27's, then this loop's bookkeeping."""

            def __init__(self) -> None:
                super().__init__(loop.settings.max_num_batched_tokens, loop.settings.max_num_seqs)
                self.executor = Worker()

            def reconcile(self, scheduler_output: dict, runner_output: dict) -> list[dict]:
                outputs = super().reconcile(scheduler_output, runner_output)
                loop.reconciled(self, outputs)
                return outputs

        return ChapterAsyncCore()

    def admit(self, core: Any) -> None:
        for seq in self.seqs:
            prompt = list(seq.token_ids)
            request = {"request_id": seq.seq_id, "prompt_token_ids": prompt, "sampling_params": self.sampling_of(seq)}
            try:
                self.records[seq.seq_id] = self._lower(request, seq.seq_id == self.traced_id, "admit", "admit the request")[0]
            except ValueError as e:
                raise EngineError(tr("request {id}: ch30's lower_request refused it: {error}", id=seq.seq_id, error=e)) from None
            core.add_request(str(seq.seq_id), prompt, seq.max_tokens, None if seq.ignore_eos else self.scheduler.eos)
            self.outputs[str(seq.seq_id)] = []

    def run(self, core: Any) -> None:
        self.trace.kind = "run"
        self.note("run", "engine core loop", "AsyncEngineCore", tr("{n} requests, a batch queue of two", n=len(self.seqs)))
        for name in ("AsyncEngineCore", "BlockManager"):
            self.trace.count(self.parts[name])
        core.run()

    def execute(self, scheduler_output: dict) -> dict[str, list[int]]:
        """Run one scheduled step on the worker's own copy of the requests."""
        if self.counts["steps"] >= self.max_steps:
            raise EngineError(tr("no end after {steps} steps: ch27's AsyncEngineCore loop does not finish", steps=self.counts["steps"]))
        plan, new = scheduler_output["num_scheduled_tokens"], scheduler_output["scheduled_new_reqs"]
        for rid, prompt in new.items():
            if rid in self.tracks:
                raise EngineError(tr("ch27's AsyncEngineCore sent request {id}'s prompt twice (scheduled_new_reqs)", id=rid))
            self.tracks[rid] = self._track(int(rid), list(prompt))
        rows = []
        for rid, n in plan.items():
            track = self.tracks.get(rid)
            if track is None:
                raise EngineError(tr("ch27's AsyncEngineCore scheduled request {id}, whose prompt the worker was never sent", id=rid))
            c = track.num_computed_tokens
            if type(n) is not int or n < 1 or c + n > len(track.token_ids):
                raise EngineError(
                    tr(
                        "ch27's AsyncEngineCore scheduled request {id} for {n} tokens from position {first}; the worker knows "
                        "{known} (one placeholder too many schedules a token nobody has sampled)",
                        id=rid,
                        n=repr(n),
                        first=c,
                        known=len(track.token_ids),
                    )
                )
            track.twin.num_tokens = len(track.token_ids)
            if len(track.token_ids) > len(track.block_table) * self.settings.block_size:
                self.manager.may_append(track.twin)  # the newest token starts a block
            first = max(c, track.cached)
            if first < c + n:
                rows.append(Row(track, first, c + n - first, track.token_ids, []))
        kind = "prefill" if any(self.tracks[rid].num_computed_tokens < self.tracks[rid].num_prompt_tokens for rid in plan) else "decode"
        self.counts[f"{kind}_steps"] += 1
        self.counts["chunked_prefill_steps"] += any(
            self.tracks[rid].num_computed_tokens + n < self.tracks[rid].num_prompt_tokens for rid, n in plan.items()
        )
        self.trace.kind = kind
        self.trace.on = self.traced_key in plan and not any(e["kind"] == kind for e in self.trace.events)
        if self.trace.on:
            self.note(kind, "engine core step", "AsyncEngineCore", tr("schedule N + 1 → execute → reconcile N"))
        self._phase([self.tracks[rid] for rid in plan], kind)
        sampled = self.executor.run_rows(rows, kind, list(plan))
        for rid, n in plan.items():
            track = self.tracks[rid]
            c = track.num_computed_tokens
            track.twin.num_cached_tokens, track.twin.num_scheduled_tokens = c, n
            self.manager.hash_blocks(track.twin)
            track.twin.num_scheduled_tokens = 0
            track.num_computed_tokens = c + n
            track.token_ids.extend(sampled.get(rid, []))
            track.twin.num_tokens = len(track.token_ids)
        self.counts["steps"] += 1
        self.trace.on = False
        return {rid: list(sampled.get(rid, [])) for rid in plan}

    @property
    def traced_key(self) -> str:
        return str(self.traced_id)

    def _track(self, seq_id: int, prompt: list[int]) -> Track:
        twin = self.twin_class(list(prompt), self.settings.block_size)
        num_cached_blocks = self.manager.can_allocate(twin)
        if num_cached_blocks < 0:
            raise EngineError(tr("request {id}: ch25's can_allocate finds no room in a pool sized for every request", id=seq_id))
        self.manager.allocate(twin, num_cached_blocks)
        if num_cached_blocks:
            self.blocks.hits.append(num_cached_blocks * self.settings.block_size)
        return Track(seq_id, prompt, twin, num_cached_blocks * self.settings.block_size)

    def _phase(self, tracks: list[Track], kind: str) -> None:
        """ch30's select_phase over the step's records, as the worker's copies stand."""
        phase, expected = self.phase([(t.seq_id, len(t.token_ids), t.num_computed_tokens, t.num_prompt_tokens) for t in tracks], kind)
        if phase != expected:
            raise EngineError(
                tr(
                    "ch30's select_phase says {phase} for a step whose records are in the {expected} phase",
                    phase=repr(phase),
                    expected=expected,
                )
            )

    def reconciled(self, core: Any, outputs: list[dict]) -> None:
        """After ch27's reconcile: the tokens it reported, their times, and the blocks of finished requests freed."""
        now = time.perf_counter() - self.start
        for out in outputs:
            rid = out["request_id"]
            self.outputs[rid].extend(out["new_token_ids"])
            self.chunk_times[int(rid)].append(now)
            if out["finished"]:
                self.manager.deallocate(self.tracks[rid].twin)
        if self.on_step:
            self.on_step(sum(len(v) for v in self.outputs.values()), self.total)

    def result_outputs(self) -> list[list[int]]:
        return [self.outputs[str(seq.seq_id)] for seq in self.seqs]
