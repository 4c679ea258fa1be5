"""EngineCore 闭环 · the engine core loop

vLLM v1's `EngineCore` turns requests into tokens with one loop: every step it
asks the scheduler for a plan (`schedule()`), hands the plan to the executor,
which runs the model and samples (`execute_model()`), and gives the sampled
tokens back to the scheduler (`update_from_output()`), which appends them to
the requests, checks the stop conditions and reports the new tokens to the
client. Each arrow of that loop is a contract between layers:

- scheduler → worker (`SchedulerOutput`): how many tokens each request gets this
  step (`num_scheduled_tokens`), the full prompt of a request the worker sees
  for the first time (`scheduled_new_reqs`), and only diffs afterwards: the
  worker keeps its own per-request state and appends its own samples.
- worker → scheduler (`ModelRunnerOutput`): one list of sampled token ids per
  scheduled request. The runner samples at the last scheduled position of every
  request, but a non-final prefill chunk (seq_len < num_tokens) produces no
  token: the runner itself blanks that sample, so the list is empty.
- scheduler → client (`EngineCoreOutputs`): the new tokens of each request and
  whether it finished; a request that produced nothing emits nothing.

The counters are the contract's memory (vLLM's `Request`): `num_computed_tokens`
is advanced *at schedule time*, before the model runs (optimistic);
`num_tokens` (prompt + appended outputs) grows only when an output comes back.
After each appended token the stop conditions are checked in the order of vLLM's
`check_stop` (vllm/v1/core/sched/utils.py): the newest token is EOS (FINISHED_STOPPED)
first, then `num_output_tokens` reaching `max_tokens` (FINISHED_LENGTH_CAPPED), so an
EOS on the last allowed token is a stop, not a length cap. (vLLM up to v0.11.0 checked
the length cap first; PR #27555 moved it after EOS.)

A normal step waits for its own result before it schedules again, so between
steps a decoding request has `num_computed_tokens == num_tokens − 1`: the newest
sampled token has not been fed to the model yet. With async scheduling (异步调度)
vLLM keeps a batch queue of two: it schedules step N+1 *before* step N's output
has come back. The decode it schedules then feeds a token nobody on the CPU has
seen; the scheduler counts it as an output placeholder
(`num_output_placeholders`) and the runner fills the input id on the GPU. When
step N's output arrives, `update_from_output` reconciles (对账): placeholders
resolve into real tokens, and the three boundaries, scheduled/computed,
placeholders and outputs, line up again: computed = num_tokens + placeholders − 1.

Speculative decoding (投机解码) parts the counters too, for a step at a time. A drafter
proposes k tokens after the newest one (`spec_token_ids`); the scheduler counts them
as tokens to compute (num_tokens_with_spec = num_tokens + k) and advances
num_computed_tokens over them at schedule time; the target model accepts a of them
and adds one of its own, and `update_from_output` rolls num_computed_tokens back over
the k − a rejected drafts, whose KV belongs to tokens that will never exist.

The course gives the loop a deliberately simple scheduler policy (`plan_tokens`:
FCFS under a token budget, no KV-cache limit, no preemption; ch24 builds the real
one) and a fake executor (`FakeExecutor`: no model, the sampled token is
`fake_token(request_id, position)`), so that this chapter needs no other
chapter's answer. Passing `non_block=True` to an executor returns a future; it
does not make anything overlap: overlap comes from the batch queue.

普通 step 调度、执行、等待结果、更新,然后才调度下一步;异步调度提前一步调度,用占位符记账,输出回来后对账;
投机解码先把草稿算进已调度,验证后退回被拒绝的部分。
"""

from __future__ import annotations

import traceback
from collections import deque

WAITING, RUNNING = "WAITING", "RUNNING"
FINISHED_STOPPED, FINISHED_LENGTH_CAPPED = "FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED"
FINISHED = (FINISHED_STOPPED, FINISHED_LENGTH_CAPPED)


def fake_token(request_id: str, position: int) -> int:
    """The token the course's fake model samples for `request_id` so that it lands at `position`.

    Deterministic and easy to read: the hundreds name the request, the last two digits
    the position, 100·(Σ ord(c) mod 9 + 1) + position mod 100 (request "A", position 6: 306).
    """
    return 100 * (sum(map(ord, request_id)) % 9 + 1) + position % 100


class Request:
    """One request and its progress counters, named as in vLLM v1's `Request` (provided by the course).

    Attributes:
        request_id: its name ("A").
        prompt_token_ids: the prompt.
        max_tokens: the most output tokens it may produce (≥ 1).
        eos_token_id: the token that stops it (None: only max_tokens stops it).
        output_token_ids: the output tokens appended so far.
        num_computed_tokens: tokens whose KV is computed *or scheduled to be computed*
            (advanced at schedule time).
        num_output_placeholders: async only: outputs of steps already scheduled whose
            output has not been processed yet.
        spec_token_ids: speculative decoding only (ch27.3): the draft tokens proposed
            after the newest token, not scheduled yet.
        status: "WAITING", "RUNNING", "FINISHED_STOPPED" or "FINISHED_LENGTH_CAPPED".
    """

    def __init__(self, request_id: str, prompt_token_ids: list[int], max_tokens: int,
                 eos_token_id: int | None = None) -> None:
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.max_tokens = max_tokens
        self.eos_token_id = eos_token_id
        self.output_token_ids: list[int] = []
        self.num_computed_tokens = 0
        self.num_output_placeholders = 0
        self.spec_token_ids: list[int] = []
        self.status = WAITING

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt + output tokens actually appended (no placeholders)."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        """num_tokens plus the drafts not scheduled yet: how far the scheduler may compute."""
        return self.num_tokens + len(self.spec_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED

    def state(self) -> dict:
        """The observable state, as plain data."""
        return {"status": self.status, "num_prompt_tokens": self.num_prompt_tokens,
                "num_computed_tokens": self.num_computed_tokens, "num_tokens": self.num_tokens,
                "num_output_placeholders": self.num_output_placeholders,
                "output_token_ids": list(self.output_token_ids)}


def plan_tokens(requests, max_num_batched_tokens: int, max_num_seqs: int) -> dict[str, int]:
    """How many tokens each request gets this step: the course's deliberately simple scheduler policy.

    The first `max_num_seqs` unfinished requests, in arrival order, are the running
    ones (no preemption, no KV-cache limit: ch24 builds the real scheduler). Each,
    in order, takes what it still needs, vLLM's rule

        need = num_tokens + num_output_placeholders − num_computed_tokens

    capped by the token budget left; a request that needs nothing is skipped. As in
    vLLM's `Scheduler.schedule` (vllm/v1/core/sched/scheduler.py), a request already
    certain to reach max_tokens (outputs + placeholders ≥ max_tokens) is not
    scheduled again.

    Args:
        requests: Request objects in arrival order (finished ones are ignored).
        max_num_batched_tokens: the token budget of one step.
        max_num_seqs: how many requests may run at once.

    Returns:
        {request_id: num_scheduled_tokens}, in scheduling order, only entries > 0.
    """
    plan, budget = {}, max_num_batched_tokens
    for request in [r for r in requests if not r.is_finished][:max_num_seqs]:
        if budget == 0:
            break
        if request.num_output_tokens + request.num_output_placeholders >= request.max_tokens:
            continue
        need = request.num_tokens + request.num_output_placeholders - request.num_computed_tokens
        n = min(need, budget)
        if n > 0:
            plan[request.request_id] = n
            budget -= n
    return plan


class ContractError(ValueError):
    """The scheduler broke its contract with the worker (raised by `FakeExecutor`)."""


class FakeFuture:
    """What `execute_model(..., non_block=True)` returns: already complete, as with vLLM's
    uniprocess executor (the work ran inside the call; only the hand-off is deferred)."""

    def __init__(self, value: dict) -> None:
        self._value = value

    def done(self) -> bool:
        return True

    def result(self) -> dict:
        return self._value


class FakeExecutor:
    """The course's stand-in for vLLM's executor and GPU model runner (provided; no model).

    Like vLLM's worker it keeps its own copy of every request (the prompt it was sent
    once, plus the tokens it sampled itself) and its own count of computed tokens,
    and receives only diffs afterwards. For each scheduled request it "computes"
    positions c … c + n − 1 (c: its own computed count, n: the scheduled tokens) and
    samples at the last one. If c + n reaches the end of the tokens it knows, the
    sample is kept: `fake_token(request_id, c + n)`, appended to its own copy;
    otherwise (a non-final prefill chunk) the runner blanks it: an empty list.

    Every call is logged in `self.log` (plain data), which the grader reads.
    """

    def __init__(self) -> None:
        self.tokens: dict[str, list[int]] = {}
        self.computed: dict[str, int] = {}
        self.log: list[dict] = []

    def execute_model(self, scheduler_output: dict, non_block: bool = False):
        """Run one batch: `scheduler_output` → {request_id: sampled token ids}, or a future of it.

        Raises:
            ContractError: a malformed scheduler output, a prompt sent twice or never,
                or tokens scheduled beyond the ones the worker knows.
        """
        batch = len(self.log) + 1
        if not isinstance(scheduler_output, dict) or \
                not isinstance(scheduler_output.get("num_scheduled_tokens"), dict) or \
                not isinstance(scheduler_output.get("scheduled_new_reqs"), dict):
            raise ContractError(f"batch {batch}: a scheduler output is a dict with 'num_scheduled_tokens' "
                                f"{{request_id: n}} and 'scheduled_new_reqs' {{request_id: prompt}}; "
                                f"got {scheduler_output!r:.200}")
        scheduled, new = scheduler_output["num_scheduled_tokens"], scheduler_output["scheduled_new_reqs"]
        for rid, prompt in new.items():
            if rid in self.tokens:
                raise ContractError(f"batch {batch}: the worker already has request {rid}; its prompt is sent "
                                    f"once, the first time it is scheduled, and only diffs afterwards")
            if rid not in scheduled:
                raise ContractError(f"batch {batch}: request {rid} is in scheduled_new_reqs but not scheduled")
        positions, sampled = {}, {}
        for rid, n in scheduled.items():
            c = self.computed.get(rid, 0)
            known = self.tokens[rid] if rid in self.tokens else list(new.get(rid, []))
            if rid not in self.tokens and rid not in new:
                raise ContractError(f"batch {batch}: the worker has never seen request {rid}: send its prompt "
                                    f"in scheduled_new_reqs the first time it is scheduled")
            if type(n) is not int or n < 1:
                raise ContractError(f"batch {batch}: request {rid} is scheduled for {n!r} tokens; "
                                    f"a scheduled request gets at least 1")
            if c + n > len(known):
                raise ContractError(f"batch {batch}: request {rid} is scheduled for positions {c}…{c + n - 1}, "
                                    f"but the worker knows only {len(known)} tokens (positions 0…{len(known) - 1}): "
                                    f"nobody has sampled the token at position {len(known)} yet")
        for rid, prompt in new.items():
            self.tokens[rid], self.computed[rid] = list(prompt), 0
        for rid, n in scheduled.items():
            c = self.computed[rid]
            self.computed[rid] = c + n
            positions[rid] = [c, c + n]
            if c + n == len(self.tokens[rid]):
                token = fake_token(rid, c + n)
                self.tokens[rid].append(token)
                sampled[rid] = [token]
            else:
                sampled[rid] = []
        self.log.append({"batch": batch, "num_scheduled_tokens": dict(scheduled), "new_reqs": list(new),
                         "positions": positions, "sampled_token_ids": {k: list(v) for k, v in sampled.items()},
                         "non_block": bool(non_block)})
        return FakeFuture(sampled) if non_block else sampled


class EngineCoreBase:
    """What both engine cores share (provided by the course, not graded).

    Attributes:
        max_num_batched_tokens, max_num_seqs: the scheduler's limits (see `plan_tokens`).
        executor: the `FakeExecutor` that runs the batches.
        requests: {request_id: Request} of every request added, in arrival order.
            Finished requests stay here (vLLM frees them) so their final state can be read.
    """

    def __init__(self, max_num_batched_tokens: int, max_num_seqs: int) -> None:
        if max_num_batched_tokens < 1 or max_num_seqs < 1:
            raise ValueError(f"need max_num_batched_tokens ≥ 1 and max_num_seqs ≥ 1; got "
                             f"{max_num_batched_tokens} and {max_num_seqs}")
        self.max_num_batched_tokens, self.max_num_seqs = max_num_batched_tokens, max_num_seqs
        self.executor = FakeExecutor()
        self.requests: dict[str, Request] = {}
        self._observed = 0

    def add_request(self, request_id: str, prompt_token_ids: list[int], max_tokens: int,
                    eos_token_id: int | None = None) -> None:
        """Queue a new request (WAITING)."""
        if request_id in self.requests:
            raise ValueError(f"request {request_id} was already added")
        if not prompt_token_ids or max_tokens < 1:
            raise ValueError(f"request {request_id}: need a non-empty prompt and max_tokens ≥ 1")
        self.requests[request_id] = Request(request_id, prompt_token_ids, max_tokens, eos_token_id)

    def has_unfinished_requests(self) -> bool:
        return any(not r.is_finished for r in self.requests.values())

    def snapshot(self) -> dict:
        """The course's observation of the engine: every request's state and the batches the
        executor ran since the previous snapshot (plain data)."""
        batches = self.executor.log[self._observed:]
        self._observed = len(self.executor.log)
        return {"requests": {rid: r.state() for rid, r in self.requests.items()}, "batches": batches}


class EngineCore(EngineCoreBase):
    """The synchronous engine core: schedule → execute → update, one step after another. Task ch27.1.

    Write the four methods below; the rest (requests, the executor, `plan_tokens`)
    is provided. A step:

    1. `schedule()`: ask `plan_tokens(self.requests.values(), self.max_num_batched_tokens,
       self.max_num_seqs)` for {request_id: n}; for each planned request, a WAITING one
       becomes RUNNING and its prompt goes into `scheduled_new_reqs` (the worker sees it
       for the first time); `num_computed_tokens += n` now, at schedule time.
    2. `self.executor.execute_model(scheduler_output)`: the runner output
       {request_id: [sampled tokens]} (empty for a non-final prefill chunk). A normal
       step waits for it before doing anything else.
    3. `update_from_output(...)`: append each sampled token, check the stop
       conditions after each (EOS first, then the length cap), and report the new tokens.

    The course simplifies vLLM: a plain dict stands for SchedulerOutput and
    ModelRunnerOutput, the scheduler policy is `plan_tokens`, and there is no
    preemption, no KV cache and no spec decode (ch27.3 takes spec decode on one request).

    Raises:
        ContractError (a ValueError), from the executor, when a scheduler output breaks
        the worker contract: a prompt never sent or sent twice, or positions scheduled
        beyond the tokens the worker knows.

    Example:
        >>> engine = make_engine_core(4, 2)
        >>> engine.add_request("A", [1, 2, 3, 4, 5, 6], max_tokens=2)
        >>> engine.step()      # positions 0–3: a partial prefill, nothing to report
        []
        >>> engine.step()      # positions 4–5 reach the end: the sample is kept
        [{'request_id': 'A', 'new_token_ids': [306], 'finished': False}]
        >>> engine.run()
        {'A': [306, 307]}
    """

    def schedule(self) -> dict:
        """Plan one step and advance the counters: the scheduler side of a step.

        Returns:
            the scheduler output {"num_scheduled_tokens": {request_id: n} (as planned,
            in order), "scheduled_new_reqs": {request_id: prompt token ids} for requests
            scheduled for the first time}. Every planned request's num_computed_tokens
            has grown by its n.
        """
        ### BEGIN SOLUTION
        plan = plan_tokens(self.requests.values(), self.max_num_batched_tokens, self.max_num_seqs)
        new_reqs = {}
        for rid, n in plan.items():
            request = self.requests[rid]
            if request.status == WAITING:
                request.status = RUNNING
                new_reqs[rid] = list(request.prompt_token_ids)
            request.num_computed_tokens += n
        return {"num_scheduled_tokens": plan, "scheduled_new_reqs": new_reqs}
        ### END SOLUTION

    def update_from_output(self, scheduler_output: dict, runner_output: dict) -> list[dict]:
        """Apply one batch's sampled tokens to its requests and report what is new.

        Args:
            scheduler_output: the batch's scheduler output (from `schedule`).
            runner_output: {request_id: [sampled token ids]} from the executor.

        Returns:
            one dict per request that got new tokens, in scheduling order:
            {"request_id": str, "new_token_ids": [int, ...], "finished": bool}.
            A request whose list was empty (a partial prefill) reports nothing.
        """
        ### BEGIN SOLUTION
        outputs = []
        for rid in scheduler_output["num_scheduled_tokens"]:
            request = self.requests[rid]
            new_token_ids = []
            for token in runner_output.get(rid, []):
                request.output_token_ids.append(token)
                new_token_ids.append(token)
                if token == request.eos_token_id:
                    request.status = FINISHED_STOPPED
                elif request.num_output_tokens >= request.max_tokens:
                    request.status = FINISHED_LENGTH_CAPPED
                if request.is_finished:
                    break
            if new_token_ids:
                outputs.append({"request_id": rid, "new_token_ids": new_token_ids, "finished": request.is_finished})
        return outputs
        ### END SOLUTION

    def step(self) -> list[dict]:
        """One engine step: schedule, execute (and wait for the result), update.

        Returns:
            the outputs of `update_from_output` ([] when there is nothing to run).
        """
        ### BEGIN SOLUTION
        if not self.has_unfinished_requests():
            return []
        scheduler_output = self.schedule()
        if not scheduler_output["num_scheduled_tokens"]:
            return []
        runner_output = self.executor.execute_model(scheduler_output)
        return self.update_from_output(scheduler_output, runner_output)
        ### END SOLUTION

    def run(self) -> dict[str, list[int]]:
        """Step until every request has finished.

        Returns:
            {request_id: output token ids} for every request added, in arrival order.
        """
        ### BEGIN SOLUTION
        while self.has_unfinished_requests():
            self.step()
        return {rid: list(r.output_token_ids) for rid, r in self.requests.items()}
        ### END SOLUTION


class AsyncEngineCore(EngineCore):
    """The engine core with async scheduling: step N+1 is scheduled before step N's output is back. Task ch27.2.

    vLLM's `step_with_batch_queue` with a queue of `max_concurrent_batches = 2`:

    1. If some request is unfinished, `schedule()`; if the plan is not empty, launch
       it with `self.executor.execute_model(scheduler_output, non_block=True)` (a future)
       and push `(future, scheduler_output)` on the left of `self.batch_queue`. If the
       queue is still not full, return [] at once: filling the queue has priority
       over waiting for outputs.
    2. Otherwise pop the *oldest* batch, wait for its future and `reconcile` it.

    `schedule()` adds vLLM's AsyncScheduler rule: after num_computed_tokens += n, a
    request whose step reaches the end of what it will know
    (num_computed_tokens == num_tokens + num_output_placeholders) gets one more
    placeholder; a non-final prefill chunk gets none. `plan_tokens` already counts
    placeholders, so the next step schedules the decode of a token still in flight.
    (You may build on your EngineCore.schedule through super(), as vLLM's
    AsyncScheduler does.)

    `reconcile(scheduler_output, runner_output)` is update_from_output for async
    steps: every placeholder of the batch resolves, num_output_placeholders −=
    len(sampled tokens), and each token is appended with the same stop checks as in
    EngineCore. A request that finished while this batch was in flight (EOS) gets
    nothing appended and emits nothing: its output is stale and is dropped.

    The course follows vLLM's `AsyncScheduler` (vllm/v1/core/sched/async_scheduler.py:
    one placeholder for a scheduled step that is not a prefill chunk, resolved by
    `_update_request_with_output`), with `Scheduler.schedule`'s rule that a request
    certain to reach max_tokens is not scheduled again (vllm/v1/core/sched/scheduler.py);
    an empty plan launches nothing (vLLM queues an empty batch), and where vLLM frees a
    finished request and ignores a stale output, the course keeps the request and
    resolves its placeholder into nothing, so every placeholder resolves exactly once.

    Raises:
        ContractError (a ValueError), from the executor, as in EngineCore: one placeholder
        too many schedules a decode whose input token nobody has sampled.

    Example (prompt 5, one step ahead):
        >>> engine = make_engine_core(8, 2, async_scheduling=True)
        >>> engine.add_request("A", [1, 2, 3, 4, 5], max_tokens=2)
        >>> engine.step(), engine.requests["A"].num_output_placeholders   # S1 in flight
        ([], 1)
        >>> engine.step()      # S2 launched (placeholder 2), then S1 reconciled
        [{'request_id': 'A', 'new_token_ids': [305], 'finished': False}]
    """

    max_concurrent_batches = 2

    def __init__(self, max_num_batched_tokens: int, max_num_seqs: int) -> None:
        super().__init__(max_num_batched_tokens, max_num_seqs)
        self.batch_queue: deque = deque()

    def schedule(self) -> dict:
        """Plan one step, advance num_computed_tokens and add the output placeholders.

        Returns:
            the scheduler output, as EngineCore.schedule.
        """
        ### BEGIN SOLUTION
        scheduler_output = super().schedule()
        for rid in scheduler_output["num_scheduled_tokens"]:
            request = self.requests[rid]
            if request.num_computed_tokens == request.num_tokens + request.num_output_placeholders:
                request.num_output_placeholders += 1
        return scheduler_output
        ### END SOLUTION

    def reconcile(self, scheduler_output: dict, runner_output: dict) -> list[dict]:
        """Bring a batch's output into the counters: placeholders resolve into tokens.

        Args:
            scheduler_output: the batch's scheduler output (from `schedule`).
            runner_output: {request_id: [sampled token ids]} from its future.

        Returns:
            the new tokens per request, as EngineCore.update_from_output (stale outputs
            of requests that already finished are not reported).
        """
        ### BEGIN SOLUTION
        outputs = []
        for rid in scheduler_output["num_scheduled_tokens"]:
            request = self.requests[rid]
            sampled = runner_output.get(rid, [])
            request.num_output_placeholders -= len(sampled)
            if request.is_finished:
                continue
            new_token_ids = []
            for token in sampled:
                request.output_token_ids.append(token)
                new_token_ids.append(token)
                if token == request.eos_token_id:
                    request.status = FINISHED_STOPPED
                elif request.num_output_tokens >= request.max_tokens:
                    request.status = FINISHED_LENGTH_CAPPED
                if request.is_finished:
                    break
            if new_token_ids:
                outputs.append({"request_id": rid, "new_token_ids": new_token_ids, "finished": request.is_finished})
        return outputs
        ### END SOLUTION

    def step(self) -> list[dict]:
        """One engine step with the batch queue: launch a batch if possible, and reconcile
        the oldest one once the queue is full or nothing more can be launched.

        Returns:
            the outputs of `reconcile` ([] when nothing was reconciled this step).
        """
        ### BEGIN SOLUTION
        if self.has_unfinished_requests():
            scheduler_output = self.schedule()
            if scheduler_output["num_scheduled_tokens"]:
                future = self.executor.execute_model(scheduler_output, non_block=True)
                self.batch_queue.appendleft((future, scheduler_output))
                if len(self.batch_queue) < self.max_concurrent_batches:
                    return []
        if not self.batch_queue:
            return []
        future, scheduler_output = self.batch_queue.pop()
        return self.reconcile(scheduler_output, future.result())
        ### END SOLUTION

    def run(self) -> dict[str, list[int]]:
        """Step until every request has finished and no batch is in flight.

        Returns:
            {request_id: output token ids} for every request added, in arrival order.
        """
        ### BEGIN SOLUTION
        while self.has_unfinished_requests() or self.batch_queue:
            self.step()
        return {rid: list(r.output_token_ids) for rid, r in self.requests.items()}
        ### END SOLUTION


def schedule_spec(request: Request) -> dict:
    """Schedule one step of a request whose newest token carries drafts. Task ch27.3.

    Speculative decoding (投机解码): a cheap drafter proposes k tokens that may follow
    the newest one (`request.spec_token_ids`, set before the step as vLLM's
    `Scheduler.update_draft_token_ids` does), and the target model checks all of them
    in one step. To the scheduler the drafts are tokens to compute like any other, so
    it plans with vLLM's rule (`Scheduler.schedule`, vllm/v1/core/sched/scheduler.py)

        n = num_tokens_with_spec − num_computed_tokens    (num_tokens_with_spec = num_tokens + k)

    A decode with k drafts gets 1 + k tokens (its newest token and the drafts); a
    prefill without drafts gets the rest of its prompt. As always num_computed_tokens
    += n at schedule time, drafts included: optimistic, before anyone knows how many
    drafts survive. The drafts move into the scheduler output and the request's
    spec_token_ids is cleared: the drafter proposes fresh ones for the next step.

    The course simplifies: no token budget, so every draft is scheduled (vLLM trims
    the drafts that do not fit) and nothing is chunked.

    Args:
        request: a RUNNING Request, its spec_token_ids holding the drafts (maybe none).

    Returns:
        {"num_scheduled_tokens": n, "scheduled_spec_token_ids": the drafts scheduled, a list}.

    Example (prompt 4, one output so far, computed 4, drafts [305, 356]):
        >>> request = Request("A", [1, 2, 3, 4], max_tokens=8)
        >>> request.output_token_ids, request.num_computed_tokens = [304], 4
        >>> request.spec_token_ids = [305, 356]
        >>> schedule_spec(request)
        {'num_scheduled_tokens': 3, 'scheduled_spec_token_ids': [305, 356]}
        >>> request.num_computed_tokens, request.num_tokens, request.spec_token_ids
        (7, 5, [])
    """
    ### BEGIN SOLUTION
    drafts = list(request.spec_token_ids)
    n = request.num_tokens_with_spec - request.num_computed_tokens
    request.num_computed_tokens += n
    request.spec_token_ids = []
    return {"num_scheduled_tokens": n, "scheduled_spec_token_ids": drafts}
    ### END SOLUTION


def update_spec(request: Request, scheduled_spec_token_ids: list[int], generated_token_ids: list[int]) -> list[int]:
    """Bring a verified step back into the counters: roll back the rejected drafts. Task ch27.3.

    The target model checked the k drafts in order: it accepted the first a of them
    (0 ≤ a ≤ k) and then sampled one token of its own, at the first position it did
    not accept (the bonus token when a = k). So `generated_token_ids` holds a + 1
    tokens and k − a drafts were rejected. Their positions were scheduled and counted
    in num_computed_tokens, but their KV belongs to tokens that will never exist, so
    `update_from_output` (vllm/v1/core/sched/scheduler.py) takes them back:

        num_rejected = k + 1 − len(generated_token_ids)      (= k − a)
        num_computed_tokens −= num_rejected

    (only when there were drafts and something was generated: a step's output can
    come back empty for a request whose sample was discarded, e.g. one preempted or
    aborted while the step ran; nothing was verified then, and k + 1 − 0 would take
    back positions no one rejected). Then each generated
    token is appended with update_from_output's stop checks (EOS first, then the
    length cap); a stop drops the tokens after it, as vLLM trims new_token_ids. The
    roll-back counts from what was generated, before any stop trims it. A request
    that goes on has num_computed_tokens == num_tokens − 1 again: the bonus token
    is new, its KV not computed yet.

    The course simplifies: a synchronous step (with async scheduling vLLM rolls
    num_output_placeholders back by the same num_rejected).

    Args:
        request: the Request scheduled by `schedule_spec`.
        scheduled_spec_token_ids: the drafts that step scheduled (k of them).
        generated_token_ids: the tokens the target model produced (a + 1 of them).

    Returns:
        the tokens appended, in order (the new tokens to report).

    Example (continuing schedule_spec's: 305 accepted, 356 rejected, 306 sampled):
        >>> request = Request("A", [1, 2, 3, 4], max_tokens=8)
        >>> request.output_token_ids, request.num_computed_tokens = [304], 7
        >>> update_spec(request, [305, 356], [305, 306])
        [305, 306]
        >>> request.num_computed_tokens, request.num_tokens
        (6, 7)
    """
    ### BEGIN SOLUTION
    if scheduled_spec_token_ids and generated_token_ids:
        num_rejected = len(scheduled_spec_token_ids) + 1 - len(generated_token_ids)
        request.num_computed_tokens -= num_rejected
    new_token_ids = []
    for token in generated_token_ids:
        request.output_token_ids.append(token)
        new_token_ids.append(token)
        if token == request.eos_token_id:
            request.status = FINISHED_STOPPED
        elif request.num_output_tokens >= request.max_tokens:
            request.status = FINISHED_LENGTH_CAPPED
        if request.is_finished:
            break
    return new_token_ids
    ### END SOLUTION


def make_engine_core(max_num_batched_tokens: int, max_num_seqs: int, *,
                     async_scheduling: bool = False) -> EngineCore:
    """A fresh engine core with its own FakeExecutor (provided): EngineCore, or AsyncEngineCore
    when `async_scheduling`."""
    cls = AsyncEngineCore if async_scheduling else EngineCore
    return cls(max_num_batched_tokens, max_num_seqs)


def replay(config: dict, ops: list) -> list[dict]:
    """Run a script of operations on a fresh engine core (course-provided: the grader's driver, run on your
    engine and on the reference; you can run it while debugging).

    Args:
        config: {"budget": max_num_batched_tokens, "max_num_seqs", "async": async_scheduling}.
        ops: ("add", request_id, prompt_token_ids, max_tokens, eos_token_id) adds a request; ("step",) calls
            step(); ("run",) calls run().

    Returns:
        One record per step() or run(), after it: {"outputs": what step() returned} or {"run": what run()
        returned}, with the engine's `snapshot()` (every request's state, the batches run since the previous
        record). An operation that raises ends the list with {"error": "…", "where": "…"}.

    Example:
        >>> trace = replay({"budget": 4, "max_num_seqs": 2, "async": False},
        ...                [("add", "A", [1, 2, 3], 1, None), ("step",)])
        >>> trace[0]["outputs"], trace[0]["requests"]["A"]["status"]
        ([{'request_id': 'A', 'new_token_ids': [303], 'finished': True}], 'FINISHED_LENGTH_CAPPED')
    """
    trace: list[dict] = []
    try:
        engine = make_engine_core(config["budget"], config["max_num_seqs"], async_scheduling=config["async"])
        for op in ops:
            if op[0] == "add":
                engine.add_request(*op[1:])
            elif op[0] == "run":
                trace.append({"run": engine.run(), **engine.snapshot()})
            else:
                trace.append({"outputs": engine.step(), **engine.snapshot()})
    except NotImplementedError:
        raise
    except Exception as e:  # noqa: BLE001 (the grader reports it with the step that raised)
        trace.append(_error_record(e))
    return trace



def _error_record(e: Exception) -> dict:
    """The record that ends a replay's trace when an operation raises: the error and the line that raised it."""
    frames = traceback.extract_tb(e.__traceback__)
    where = f"line {frames[-1].lineno} in {frames[-1].name}: {frames[-1].line}" if frames else ""
    return {"error": f"{type(e).__name__}: {e}", "where": where}

WRONG_DRAFT = 50
"""The course's drafter guesses wrong by this much: a wrong draft for position p is fake_token(·, p) + 50."""


def verify_drafts(request_id: str, num_tokens: int, drafts: list[int]) -> list[int]:
    """The course's fake target model checking drafts (provided): what it generates for one step.

    Its own token for position p is `fake_token(request_id, p)`. The drafts stand for
    positions num_tokens, num_tokens + 1, …; it accepts them while they equal its own
    tokens and, at the first one it does not accept (or after the last, the bonus
    position), samples its own: a + 1 tokens for a accepted drafts. Greedy
    verification, so the tokens are the same as without drafts, only more per step.
    """
    generated = []
    for i, draft in enumerate(drafts):
        generated.append(fake_token(request_id, num_tokens + i))
        if draft != generated[-1]:
            return generated
    return generated + [fake_token(request_id, num_tokens + len(drafts))]


def replay_spec(config: dict, rounds: list) -> list[dict]:
    """Run steps of one speculating request through your schedule_spec and update_spec (course-provided: the
    grader's driver for ch27.3, run on your code and on the reference; you can run it while debugging).

    Args:
        config: {"request_id", "prompt_token_ids", "max_tokens", "eos_token_id"}: one request, RUNNING from
            the start.
        rounds: one list of draft tokens per step ([] for a step without drafts, such as the prefill). Each
            step: the drafts become the request's spec_token_ids, `schedule_spec`, the fake target model
            (`verify_drafts`, which keeps its own count of the tokens it produced), `update_spec`. Steps
            after the request finished are not run. A step given as {"drafts": [...], "discarded": True}
            runs the same, but its output comes back empty (its sample discarded: the request was
            preempted or aborted meanwhile), so `update_spec` gets no generated tokens; the replay ends
            after it, the request having left the batch.

    Returns:
        One record per step: {"drafts", "before": the counters before it, "scheduled": what schedule_spec
        returned, "after_schedule", "generated": what the target model produced, "new_token_ids": what
        update_spec returned, "after_update"}; counters are {"status", "num_computed_tokens", "num_tokens",
        "num_tokens_with_spec", "spec_token_ids", "output_token_ids"}. An operation that raises ends the list
        with {"error": "…", "where": "…"}.

    Example (prompt 4: the prefill, then 2 drafts of which the first is right):
        >>> trace = replay_spec({"request_id": "A", "prompt_token_ids": [1, 2, 3, 4], "max_tokens": 8,
        ...                      "eos_token_id": None}, [[], [305, 356]])
        >>> [(r["generated"], r["after_update"]["num_computed_tokens"]) for r in trace]
        [([304], 4), ([305, 306], 6)]
    """
    def counters(request: Request) -> dict:
        return {"status": request.status, "num_computed_tokens": request.num_computed_tokens,
                "num_tokens": request.num_tokens, "num_tokens_with_spec": request.num_tokens_with_spec,
                "spec_token_ids": list(request.spec_token_ids), "output_token_ids": list(request.output_token_ids)}

    trace: list[dict] = []
    try:
        request = Request(config["request_id"], config["prompt_token_ids"], config["max_tokens"],
                          config["eos_token_id"])
        request.status = RUNNING
        produced = request.num_prompt_tokens  # the target model's own count of the tokens it knows
        for step in rounds:
            if request.is_finished:
                break
            discarded = isinstance(step, dict) and bool(step.get("discarded"))
            drafts = list(step["drafts"]) if isinstance(step, dict) else step
            if drafts:
                request.spec_token_ids = list(drafts)
            record: dict = {"drafts": list(drafts), "before": counters(request)}
            record["scheduled"] = schedule_spec(request)
            record["after_schedule"] = counters(request)
            spec = list(record["scheduled"]["scheduled_spec_token_ids"])
            record["generated"] = [] if discarded else verify_drafts(request.request_id, produced, spec)
            produced += len(record["generated"])
            record["new_token_ids"] = update_spec(request, spec, list(record["generated"]))
            record["after_update"] = counters(request)
            trace.append(record)
            if discarded:
                break
    except NotImplementedError:
        raise
    except Exception as e:  # noqa: BLE001 (the grader reports it with the step that raised)
        trace.append(_error_record(e))
    return trace
