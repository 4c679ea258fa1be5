"""控制环与进度计数 · the control loop and its counters

An inference engine is a loop. Every round the *scheduler* picks a batch
(`schedule()`), the model runner computes it and samples one token per
sequence, and `postprocess()` folds the sampled tokens back into the requests.
The same request passes through that loop many times: a long prompt is computed
chunk by chunk (chunked prefill), then one token per round (decode), until it
samples EOS or reaches `max_tokens`. nano-vllm (bb823b3) makes the loop's
policy explicit in about a hundred lines:

- **prefill first**: a round either prefills or decodes. `schedule()` first
  admits prompts from the head of `waiting`, strictly first come first served
  (the head is never skipped), within `max_num_batched_tokens` and
  `max_num_seqs`; it decodes only when nothing at all can be prefilled;
- **only the first sequence of a batch is chunked**: a prompt that does not fit
  in what is left of the token budget ends the batch, unless it is the batch's
  first sequence, which then takes a chunk of exactly the budget;
- **a chunk's candidate is thrown away**: the runner samples a token for every
  scheduled sequence, but while a prompt is still incomplete that token is a
  prediction made in the middle of the prompt, and `postprocess()` does not
  append it;
- **preemption from the tail**: when a decode needs a new KV block and none is
  free, the most recently admitted sequence (the right end of `running`) gives
  its blocks back and goes to the *front* of `waiting`, to be recomputed
  (recompute-style preemption, as in vLLM; nothing is swapped out).

What a scheduler promises is written in counters, not in phases: for each
request, how many tokens exist (`num_tokens`: prompt + kept outputs), how many
of them have K/V computed (`num_computed_tokens`), and, in vLLM, how many of the
prompt's tokens the prefix cache served when it was first admitted
(`num_cached_tokens`). These three progresses differ and must be kept apart
(三种“进度”不能混淆): a non-final chunk advances the computed count only, a kept
sample advances the token count only, a preemption resets the computed count
and keeps the tokens. Between two steps a running request that has started
generating always has num_computed_tokens = num_tokens − 1: its newest token is
sampled but not yet fed to the model.

A warning about names: nano-vllm at HEAD calls the computed count
`num_cached_tokens` ("K/V already in the cache"), while vLLM v1 uses
`num_cached_tokens` for the prefix-cache hit only. This chapter uses vLLM's
names everywhere: `Sequence.num_computed_tokens` is nano-vllm's
`num_cached_tokens`, and `num_cached_tokens` appears only in 24.2.

控制环每轮都一样:schedule → 模型计算并采样 → postprocess;chunk 未完成时 runner 虽然返回候选 token,
postprocess 不追加它。计数器(而不是 prefill / decode 这些阶段名)才是调度器与其余部分之间的契约。
"""

import traceback
from collections import deque
from itertools import count

WAITING, RUNNING, FINISHED = "WAITING", "RUNNING", "FINISHED"
"""A sequence's status (nano-vllm's SequenceStatus, as plain strings)."""


class Sequence:
    """One request as the scheduler sees it (course-provided: nano-vllm's Sequence, trimmed).

    Fields the scheduler reads and writes:
        seq_id: the request's id (given, or the next of a process-wide counter, as in nano-vllm).
        status: WAITING (new, mid-prefill or preempted), RUNNING or FINISHED.
        token_ids: prompt + the completion tokens appended so far.
        num_prompt_tokens: the prompt's length (never changes).
        num_computed_tokens: leading tokens whose K/V has been computed (nano-vllm
            HEAD's `num_cached_tokens`); advanced by postprocess, reset to 0 on
            preemption.
        num_scheduled_tokens: tokens this sequence computes in the current step
            (a chunk size in prefill, 1 in decode); set by schedule, reset to 0 by
            postprocess.
        block_table: the physical KV blocks it holds, in logical order.
        max_tokens: completion tokens to generate at most (≥ 1).
        ignore_eos: keep generating after EOS (nano-vllm's SamplingParams flag).

    Args:
        token_ids: the prompt, a non-empty list of ints (copied).
        max_tokens: at most this many completion tokens (≥ 1).
        ignore_eos: if True, only max_tokens ends the request.
        seq_id: an id of your choice (the grader numbers its requests); by default the next one.

    Raises:
        ValueError: an empty prompt or max_tokens < 1, as vLLM's SamplingParams
            refuses it (`_verify_args` in vllm/sampling_params.py; vLLM's "no
            bound" is max_tokens=None, which vllm/v1/engine/input_processor.py
            turns into max_model_len − prompt length). nano-vllm checks nothing:
            its finish test `num_completion_tokens == max_tokens` runs after an
            append, when the count is ≥ 1, so a 0 there never matches and the
            request runs until EOS or, with ignore_eos, until the pool runs out.
            That is an accident of the code, not a mode to rely on.

    Example:
        >>> seq = Sequence([5, 6, 7], max_tokens=2)
        >>> seq.num_tokens, seq.status, seq.completion_token_ids
        (3, 'WAITING', [])
    """

    counter = count()

    def __init__(self, token_ids: list[int], max_tokens: int = 64, ignore_eos: bool = False,
                 seq_id: int | None = None) -> None:
        if len(token_ids) == 0:
            raise ValueError("a request needs at least one prompt token")
        if int(max_tokens) < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        self.seq_id = next(Sequence.counter) if seq_id is None else int(seq_id)
        self.status = WAITING
        self.token_ids = [int(t) for t in token_ids]
        self.num_prompt_tokens = len(self.token_ids)
        self.num_computed_tokens = 0
        self.num_scheduled_tokens = 0
        self.block_table: list[int] = []
        self.max_tokens = int(max_tokens)
        self.ignore_eos = bool(ignore_eos)

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt + completion tokens known so far."""
        return len(self.token_ids)

    @property
    def num_completion_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def completion_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def last_token(self) -> int:
        return self.token_ids[-1]

    def append_token(self, token_id: int) -> None:
        """Append a sampled token (num_tokens grows by one)."""
        self.token_ids.append(int(token_id))


class BlockAllocator:
    """Course-provided KV-block accounting for the scheduler: a FIFO list of free blocks.

    Deliberately simpler than nano-vllm's BlockManager (that one is ch25.3): no
    prefix caching, no hashes, no reference counts; every block belongs to at most
    one sequence. The method names and meanings are nano-vllm's, with two
    differences: `can_allocate` returns a bool (there are no cache hits to
    report), and the allocator never touches a sequence's counters (nano-vllm's
    `deallocate` also zeroes the computed count; here the scheduler does that).

    Free blocks are taken from the left of `free_block_ids` and returned to its
    right, a sequence's blocks in reverse order, as in nano-vllm.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free_block_ids: deque[int] = deque(range(num_blocks))
        self.used_block_ids: set[int] = set()

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold `num_tokens` tokens: ceil(num_tokens / block_size)."""
        return -(-num_tokens // self.block_size)

    def can_allocate(self, seq: Sequence) -> bool:
        """Whether the free blocks can hold all of `seq`'s current tokens."""
        return self.num_free_blocks >= self.blocks_for(len(seq))

    def allocate(self, seq: Sequence) -> None:
        """Give a sequence without blocks the blocks for ALL its current tokens (not just one chunk)."""
        if seq.block_table:
            raise RuntimeError("allocate: this sequence already holds blocks (allocate once, at admission)")
        if not self.can_allocate(seq):
            raise RuntimeError(f"allocate: {self.blocks_for(len(seq))} blocks needed, "
                               f"{self.num_free_blocks} free (check can_allocate first)")
        for _ in range(self.blocks_for(len(seq))):
            block = self.free_block_ids.popleft()
            self.used_block_ids.add(block)
            seq.block_table.append(block)

    def deallocate(self, seq: Sequence) -> None:
        """Return all of a sequence's blocks, last block first, and clear its block table."""
        for block in reversed(seq.block_table):
            self.used_block_ids.remove(block)
            self.free_block_ids.append(block)
        seq.block_table.clear()

    def needs_block(self, seq: Sequence) -> bool:
        """Whether the newest token of a decoding sequence starts a new block.

        nano-vllm writes this as len(seq) % block_size == 1; comparing with the
        table's capacity says the same for block_size ≥ 2 and also works for 1.
        """
        return len(seq) > len(seq.block_table) * self.block_size

    def can_append(self, seq: Sequence) -> bool:
        """Whether a decode step for `seq` can get the block its newest token may need."""
        return self.num_free_blocks >= (1 if self.needs_block(seq) else 0)

    def may_append(self, seq: Sequence) -> None:
        """Give `seq` one more block if its newest token starts a new one (call after can_append)."""
        if self.needs_block(seq):
            if not self.free_block_ids:
                raise RuntimeError("may_append: no free block (check can_append first)")
            block = self.free_block_ids.popleft()
            self.used_block_ids.add(block)
            seq.block_table.append(block)


class Scheduler:
    """nano-vllm's scheduler with chunked prefill (bb823b3), on the course's allocator. Task ch24.1.

    State (set up for you): `waiting` and `running` (deques of Sequence),
    `block_manager` (a `BlockAllocator`), and the limits `max_num_seqs`,
    `max_num_batched_tokens`, `block_size` and `eos`.

    One round of the engine: `seqs, is_prefill = schedule()`; the runner
    computes each sequence's `num_scheduled_tokens` tokens and samples one token
    per sequence; `postprocess(seqs, token_ids, is_prefill)`.

    schedule(), prefill phase, tried first. While `waiting` is non-empty and the
    batch has fewer than max_num_seqs sequences, look at seq = waiting[0] (never
    skip it):
      1. remaining = max_num_batched_tokens − tokens already in the batch; stop at 0.
      2. A sequence without blocks (new or preempted) needs blocks for all its
         tokens: if `block_manager.can_allocate(seq)` is false, stop; its tokens
         to compute are num_tokens. A sequence with blocks is mid-prefill: its
         tokens to compute are num_tokens − num_computed_tokens.
      3. If they exceed `remaining` and the batch is not empty, stop: only the
         first sequence of a batch may be chunked.
      4. Allocate if it had no blocks; num_scheduled_tokens = min(tokens to
         compute, remaining).
      5. If this chunk completes the sequence, it becomes RUNNING and moves from
         waiting to the right end of running; otherwise it stays at waiting[0].
    If anything was scheduled, return (batch, True). (Sequences already running
    do not count against max_num_seqs here, so `running` can grow beyond it;
    each decode batch takes at most max_num_seqs of them.)

    schedule(), decode phase, only when nothing could be prefilled. While
    `running` is non-empty and the batch has fewer than max_num_seqs sequences:
    pop seq from the left of running; while `block_manager.can_append(seq)` is
    false, preempt the sequence at the right end of running, or, if running is
    empty, preempt seq itself and go on with the next. Otherwise set
    num_scheduled_tokens = 1, call `block_manager.may_append(seq)` and add it to
    the batch. Put the batch back at the left of running in its order and return
    (batch, False). Decode ignores max_num_batched_tokens.

    preempt(seq): status WAITING, num_computed_tokens 0, `deallocate` its blocks,
    and put it at the front of waiting (its generated tokens are kept).

    postprocess(seqs, token_ids, is_prefill), for each sequence and its sampled
    token, in order: num_computed_tokens += num_scheduled_tokens and
    num_scheduled_tokens = 0; in a prefill step, if num_computed_tokens is still
    below num_tokens the chunk was not the last one: discard the token.
    Otherwise append it; the sequence finishes when the token is EOS (unless
    ignore_eos; the EOS stays in the output) or when num_completion_tokens
    reaches max_tokens (compared with == after the append, as nano-vllm does; a
    Sequence refuses max_tokens < 1, which would never match): status FINISHED,
    blocks deallocated, removed from running.
    (nano-vllm's deallocate also zeroes a finished sequence's computed count; the
    course's allocator leaves counters alone, and nothing reads that count again.)

    The course's additions to nano-vllm, where nano-vllm would hang or assert,
    are provided (`_check_add`, `_check_schedule`, `_check_tokens`, at the end of
    the file; already called for you): `add` rejects a request that could never
    fit in the pool, `schedule` being called with nothing to schedule, and
    `postprocess` a token list of the wrong length.

    Args:
        num_blocks: KV blocks in the pool (≥ 1).
        block_size: tokens per block (≥ 1).
        max_num_seqs: at most this many sequences per batch (≥ 1).
        max_num_batched_tokens: the prefill token budget per step (≥ 1).
        eos: the end-of-sequence token id.

    Raises:
        ValueError: a limit that is not a positive int (here, when built);
            add: a sequence that is not new (not WAITING, holds blocks, has
            computed tokens, or is already queued), or one that could never fit:
            ceil((num_prompt_tokens + max_tokens − 1) / block_size) > num_blocks
            blocks, the most it can hold at once; schedule: nothing to schedule
            (is_finished()); postprocess: not exactly one token per sequence.

    Example:
        >>> s = make_scheduler(8, 4, 4, 4, eos=0)
        >>> a = Sequence(list(range(1, 11)), max_tokens=3); s.add(a)
        >>> seqs, is_prefill = s.schedule(); (len(seqs), is_prefill, a.num_scheduled_tokens)
        (1, True, 4)
        >>> s.postprocess(seqs, [99], is_prefill)   # chunk 0–3 of 10: the candidate 99 is discarded
        >>> a.num_computed_tokens, a.num_tokens, a.status
        (4, 10, 'WAITING')
    """

    def __init__(self, num_blocks: int, block_size: int, max_num_seqs: int, max_num_batched_tokens: int,
                 eos: int) -> None:
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size), ("max_num_seqs", max_num_seqs),
                            ("max_num_batched_tokens", max_num_batched_tokens)):
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.eos = int(eos)
        self.block_size = block_size
        self.block_manager = BlockAllocator(num_blocks, block_size)
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()

    def is_finished(self) -> bool:
        """True when no sequence is waiting or running."""
        ### BEGIN SOLUTION
        return not self.waiting and not self.running
        ### END SOLUTION

    def add(self, seq: Sequence) -> None:
        """Queue a new request at the right end of `waiting` (the provided check raises ValueError if it is not new
        or can never fit)."""
        _check_add(self, seq)
        ### BEGIN SOLUTION
        self.waiting.append(seq)
        ### END SOLUTION

    def schedule(self) -> tuple[list[Sequence], bool]:
        """Pick this step's batch: (sequences, is_prefill). See the class docstring for the rules."""
        _check_schedule(self)
        ### BEGIN SOLUTION
        scheduled: list[Sequence] = []
        num_batched = 0
        while self.waiting and len(scheduled) < self.max_num_seqs:
            seq = self.waiting[0]
            remaining = self.max_num_batched_tokens - num_batched
            if remaining == 0:
                break
            if not seq.block_table:
                if not self.block_manager.can_allocate(seq):
                    break
                to_compute = seq.num_tokens
            else:
                to_compute = seq.num_tokens - seq.num_computed_tokens
            if remaining < to_compute and scheduled:
                break
            if not seq.block_table:
                self.block_manager.allocate(seq)
            seq.num_scheduled_tokens = min(to_compute, remaining)
            num_batched += seq.num_scheduled_tokens
            if seq.num_computed_tokens + seq.num_scheduled_tokens == seq.num_tokens:
                seq.status = RUNNING
                self.waiting.popleft()
                self.running.append(seq)
            scheduled.append(seq)
        if scheduled:
            return scheduled, True

        while self.running and len(scheduled) < self.max_num_seqs:
            seq = self.running.popleft()
            while not self.block_manager.can_append(seq):
                if self.running:
                    self.preempt(self.running.pop())
                else:
                    self.preempt(seq)
                    break
            else:
                seq.num_scheduled_tokens = 1
                self.block_manager.may_append(seq)
                scheduled.append(seq)
        assert scheduled, "add() admits only requests that fit, so a decode batch is never empty"
        self.running.extendleft(reversed(scheduled))
        return scheduled, False
        ### END SOLUTION

    def preempt(self, seq: Sequence) -> None:
        """Send a running sequence back to the front of `waiting`, freeing its blocks (it will be recomputed)."""
        ### BEGIN SOLUTION
        seq.status = WAITING
        seq.num_computed_tokens = 0
        self.block_manager.deallocate(seq)
        self.waiting.appendleft(seq)
        ### END SOLUTION

    def postprocess(self, seqs: list[Sequence], token_ids: list[int], is_prefill: bool) -> None:
        """Fold one step's sampled tokens (one per sequence, in batch order) back into the sequences."""
        _check_tokens(seqs, token_ids)
        ### BEGIN SOLUTION
        for seq, token in zip(seqs, token_ids):
            seq.num_computed_tokens += seq.num_scheduled_tokens
            seq.num_scheduled_tokens = 0
            if is_prefill and seq.num_computed_tokens < seq.num_tokens:
                continue
            seq.append_token(token)
            if (not seq.ignore_eos and token == self.eos) or seq.num_completion_tokens == seq.max_tokens:
                seq.status = FINISHED
                self.block_manager.deallocate(seq)
                self.running.remove(seq)
        ### END SOLUTION


def make_scheduler(num_blocks: int, block_size: int, max_num_seqs: int, max_num_batched_tokens: int,
                   eos: int) -> Scheduler:
    """A Scheduler over a fresh pool of `num_blocks` blocks of `block_size` tokens (course-provided)."""
    return Scheduler(num_blocks, block_size, max_num_seqs, max_num_batched_tokens, eos)


def snapshot(scheduler: Scheduler, seqs: list[Sequence]) -> dict:
    """The observable state of a scheduler and of some of its sequences, as plain data (course-provided).

    The grader reads it after every schedule() and every postprocess(); you can
    print it while debugging. Queues are lists of seq_id; "seqs" holds the state
    of each sequence in `seqs`, in order.
    """
    return {"waiting": [s.seq_id for s in scheduler.waiting], "running": [s.seq_id for s in scheduler.running],
            "free_blocks": list(scheduler.block_manager.free_block_ids), "finished": scheduler.is_finished(),
            "seqs": [{"status": s.status, "num_tokens": s.num_tokens, "num_computed_tokens": s.num_computed_tokens,
                      "num_scheduled_tokens": s.num_scheduled_tokens, "block_table": list(s.block_table),
                      "completion": s.completion_token_ids} for s in seqs]}


FILLER = 999
"""What the simulated runner samples for a sequence that no request of the script made."""


def runner_token(request: dict | None, state: dict | None) -> int:
    """The token the course's simulated runner samples for one scheduled sequence (course-provided).

    A pure function of the script: `request` is the script's request (None for a sequence the script did not
    make), `state` the sequence's state right after schedule(). A chunk that ends before num_tokens gets the
    request's candidate for that end (`request["candidates"][str(end)]`, else 50 + end): a prediction made in
    the middle of the prompt, for postprocess to discard. A step that reaches num_tokens gets
    `request["outputs"][k]`, k being the completion tokens so far.
    """
    if request is None or not isinstance(state, dict):
        return FILLER
    end = state["num_computed_tokens"] + state["num_scheduled_tokens"]
    if end < state["num_tokens"]:
        return request["candidates"].get(str(end), 50 + end)
    k = state["num_tokens"] - len(request["prompt"])
    return request["outputs"][k] if 0 <= k < len(request["outputs"]) else FILLER


def replay(script: dict, max_steps: int = 100_000) -> list[dict]:
    """Run a script of arriving requests through a fresh Scheduler, step by step (course-provided: the grader's
    driver, run on your Scheduler and on the reference; you can run it while debugging).

    `script` is {"name", "config": make_scheduler's arguments, "requests": [{"name", "prompt", "max_tokens",
    "ignore_eos", "arrive", "outputs", "candidates"}, …]}; request i becomes the Sequence with seq_id i. Each
    round first adds the requests arriving at it (when nothing is live, the clock jumps to the next arrival),
    then runs one step: schedule(), the simulated runner on every scheduled sequence (`runner_token`), then
    postprocess(). At most `max_steps` steps run.

    Returns:
        One record per step: {"step", "clock", "added": the requests added at its round, "prefill",
        "batch": the names of the scheduled sequences, "tokens": what the runner returned for them,
        "sched": the state after schedule(), "after": the state after postprocess()}. A state is
        `snapshot`'s with request names for seq ids ("?" for a sequence the script did not make), the free
        blocks counted ("free") and listed ("free_ids"), and the sequences a step can touch (those running and
        the first max_num_seqs waiting) by name, each with its "table" and its number of "blocks". A step that
        raises ends the list with {"error": "…", "where": "…"} and what the step did before it raised.

    Example:
        >>> a = {"name": "A", "prompt": [5, 6, 7], "max_tokens": 1, "ignore_eos": False, "arrive": 0,
        ...      "outputs": [9], "candidates": {}}
        >>> config = dict(num_blocks=4, block_size=4, max_num_seqs=2, max_num_batched_tokens=8, eos=0)
        >>> [(r["batch"], r["tokens"], r["after"]["seqs"]["A"]["status"]) for r in replay({"name": "one",
        ...  "config": config, "requests": [a]})]
        [(['A'], [9], 'FINISHED')]
    """
    requests = script["requests"]
    names = {i: r["name"] for i, r in enumerate(requests)}
    by_name = {r["name"]: r for r in requests}
    index: dict[int, str] = {}  # id() of a Sequence the script made → its name
    order = sorted(range(len(requests)), key=lambda i: requests[i]["arrive"])
    records: list[dict] = []
    record: dict = {}
    try:
        scheduler = make_scheduler(**script["config"])
        seqs: dict[str, Sequence] = {}
        nxt, live, clock, step = 0, [], 0, 0
        running: list[str] = []
        waiting: list[str] = []
        while step < max_steps:
            added = []
            while nxt < len(order) and requests[order[nxt]]["arrive"] <= clock:
                r = requests[order[nxt]]
                seqs[r["name"]] = Sequence(list(r["prompt"]), max_tokens=r["max_tokens"], ignore_eos=r["ignore_eos"],
                                           seq_id=order[nxt])
                index[id(seqs[r["name"]])] = r["name"]
                nxt += 1
                scheduler.add(seqs[r["name"]])
                live.append(r["name"])
                added.append(r["name"])
            if not live:
                if nxt == len(order):
                    break
                clock = requests[order[nxt]]["arrive"]
                continue
            step += 1
            near = set(running) | set((waiting + added)[:scheduler.max_num_seqs])
            watch = [n for n in live if n in near]
            record = {"step": step, "clock": clock, "added": added}
            got = scheduler.schedule()
            if not (isinstance(got, (tuple, list)) and len(got) == 2 and isinstance(got[0], list)
                    and isinstance(got[1], bool)):
                raise TypeError(f"schedule() should return (seqs, is_prefill): a list of Sequence objects and a "
                                f"bool; yours returned {got!r:.120}")
            batch, is_prefill = got
            record["prefill"] = is_prefill
            record["batch"] = [index.get(id(s), "?") for s in batch]
            record["sched"] = _named(snapshot(scheduler, [seqs[n] for n in watch]), names, watch)
            record["tokens"] = [runner_token(by_name.get(n), record["sched"]["seqs"].get(n)) for n in record["batch"]]
            scheduler.postprocess(batch, list(record["tokens"]), is_prefill)
            record["after"] = after = _named(snapshot(scheduler, [seqs[n] for n in watch]), names, watch)
            records.append(record)
            record = {}
            live = [n for n in live if after["seqs"].get(n, {}).get("status") != FINISHED]
            running, waiting = after["running"], after["waiting"]
            clock += 1
    except NotImplementedError:
        raise
    except Exception as e:  # noqa: BLE001 (the grader reports it with the step that raised)
        records.append({**record, **_error(e)})
    return records


def _named(snap: dict, names: dict[int, str], watch: list[str]) -> dict:
    """A snapshot with request names for seq ids, and the watched sequences by name."""
    name = lambda i: names.get(i, "?") if isinstance(i, int) else "?"
    return {"waiting": [name(i) for i in snap["waiting"]], "running": [name(i) for i in snap["running"]],
            "free": len(snap["free_blocks"]), "free_ids": list(snap["free_blocks"]), "finished": snap["finished"],
            "seqs": {n: {**{k: v for k, v in s.items() if k != "block_table"}, "blocks": len(s["block_table"]),
                         "table": list(s["block_table"])} for n, s in zip(watch, snap["seqs"])}}


def _error(e: Exception) -> dict:
    """An exception as a trace record: what it said, and the line that raised it."""
    frames = traceback.extract_tb(e.__traceback__)
    where = f"line {frames[-1].lineno} in {frames[-1].name}: {frames[-1].line}" if frames else ""
    return {"error": f"{type(e).__name__}: {e}", "where": where}


PROGRESS_KEYS = ("num_prompt_tokens", "num_tokens", "num_computed_tokens", "num_cached_tokens")
"""The counters of 24.2, in vLLM v1's names."""


def progress_after_step(progress: dict[str, int], num_scheduled: int, prefix_hit: int = 0,
                        preempted: bool = False) -> dict[str, int]:
    """A request's counters after one synchronous engine step, in vLLM v1's terms. Task ch24.2.

    The counters (`vllm/v1/request.py`), kept apart:
        num_prompt_tokens: the prompt's length; never changes.
        num_tokens: prompt + output tokens actually appended.
        num_computed_tokens: leading tokens whose K/V is computed.
        num_cached_tokens: prompt tokens the prefix cache served when the request
            was first admitted; −1 until then, and set only that once.

    One step, in the order vLLM applies it:
      - preempted: the request lost its KV blocks this step (it is not scheduled):
        num_computed_tokens = 0; it keeps its tokens and num_cached_tokens.
      - num_scheduled = 0 (and not preempted): the request waited; nothing changes.
      - otherwise, if num_computed_tokens is 0 the step admits the request from the
        waiting queue: num_computed_tokens = prefix_hit, and num_cached_tokens =
        prefix_hit if it was still −1. Then num_computed_tokens += num_scheduled.
        If that reaches num_tokens, the step completed everything known and its
        sampled token is kept: num_tokens += 1. Below num_tokens it was a partial
        prefill chunk and the sample is thrown away (vLLM's runner discards it).

    vLLM advances num_computed_tokens right after schedule(), before the model
    runs; nano-vllm after the run, in postprocess. Between steps, which is all this
    function sees, the two agree. (The course models one synchronous step, no
    speculative tokens, no async placeholders: ch27.)

    Args:
        progress: {"num_prompt_tokens", "num_tokens", "num_computed_tokens",
            "num_cached_tokens"} as ints, the request before the step (not modified).
        num_scheduled: tokens of this request computed in this step (≥ 0).
        prefix_hit: tokens served by the prefix cache when this step admits the
            request (only then; at most num_tokens − 1: the last token is always
            computed, so there are logits to sample from).
        preempted: the request was preempted in this step.

    Returns:
        A new dict with the same four keys, the counters after the step.

    Raises:
        ValueError: yours to raise: a hit that leaves no token to compute
            (prefix_hit ≥ num_tokens at admission), and a step that would compute
            tokens beyond num_tokens. The provided `_check_progress` (already
            called) raises it for the rest: missing keys, inconsistent counters
            (num_tokens < num_prompt_tokens, num_computed_tokens outside
            [0, num_tokens], num_cached_tokens < −1), num_scheduled or prefix_hit
            negative, a preempted request that is also scheduled or given a hit,
            and a hit for a request that is not being admitted.

    Example:
        >>> p = {"num_prompt_tokens": 10, "num_tokens": 10, "num_computed_tokens": 0, "num_cached_tokens": -1}
        >>> p = progress_after_step(p, 4, prefix_hit=4); p   # admitted with 4 cached, 4 computed now
        {'num_prompt_tokens': 10, 'num_tokens': 10, 'num_computed_tokens': 8, 'num_cached_tokens': 4}
        >>> progress_after_step(p, 2)["num_tokens"]          # 8 + 2 = 10: the sample is kept
        11
    """
    _check_progress(progress, num_scheduled, prefix_hit, preempted)
    ### BEGIN SOLUTION
    prompt, total, computed, cached = (int(progress[k]) for k in PROGRESS_KEYS)
    if preempted:
        computed = 0
    elif num_scheduled:
        if computed == 0:
            if prefix_hit >= total:
                raise ValueError(f"a prefix hit of {prefix_hit} of {total} tokens leaves nothing to compute: "
                                 f"the last token is never a hit (at most {total - 1})")
            computed = prefix_hit
            if cached < 0:
                cached = prefix_hit
        if computed + num_scheduled > total:
            raise ValueError(f"{computed} computed + {num_scheduled} scheduled exceeds the {total} tokens that exist")
        computed += num_scheduled
        if computed == total:
            total += 1
    return {"num_prompt_tokens": prompt, "num_tokens": total, "num_computed_tokens": computed,
            "num_cached_tokens": cached}
    ### END SOLUTION


# -- provided: the input checks every task needs but none teaches (not part of the exercise) ----------------------

def _check_add(scheduler: Scheduler, seq: Sequence) -> None:
    """Provided: raise ValueError unless `seq` is new (WAITING, no blocks, nothing computed, not queued) and could
    fit in the pool at its longest: ceil((num_prompt_tokens + max_tokens − 1) / block_size) ≤ num_blocks (the last
    sampled token is never fed back, so it needs no slot)."""
    if seq.status != WAITING or seq.block_table or seq.num_computed_tokens or \
            any(s is seq for s in scheduler.waiting) or any(s is seq for s in scheduler.running):
        raise ValueError("only a new request can be added: this one is already queued, running, "
                         "finished or holds blocks")
    need = scheduler.block_manager.blocks_for(seq.num_prompt_tokens + seq.max_tokens - 1)
    if need > scheduler.block_manager.num_blocks:
        raise ValueError(f"this request can never fit: {seq.num_prompt_tokens} prompt tokens + "
                         f"{seq.max_tokens} − 1 generated need {need} blocks of {scheduler.block_size}, "
                         f"the pool has {scheduler.block_manager.num_blocks}")


def _check_schedule(scheduler: Scheduler) -> None:
    """Provided: raise ValueError when nothing is waiting or running (nano-vllm would fail its assert)."""
    if not scheduler.waiting and not scheduler.running:
        raise ValueError("nothing to schedule: no sequence is waiting or running (is_finished() is True)")


def _check_tokens(seqs: list[Sequence], token_ids: list[int]) -> None:
    """Provided: raise ValueError unless there is exactly one sampled token per scheduled sequence."""
    if len(token_ids) != len(seqs):
        raise ValueError(f"one sampled token per scheduled sequence: {len(seqs)} sequences, "
                         f"{len(token_ids)} tokens")


def _check_progress(progress: dict[str, int], num_scheduled: int, prefix_hit: int, preempted: bool) -> None:
    """Provided: raise ValueError for missing or inconsistent counters, a negative num_scheduled or prefix_hit, a
    preempted request that is scheduled or given a hit, or a hit for a request that is not being admitted (it
    needs num_computed_tokens = 0 and num_scheduled > 0)."""
    missing = [k for k in PROGRESS_KEYS if k not in progress]
    if missing:
        raise ValueError(f"progress lacks {missing}; it needs {list(PROGRESS_KEYS)}")
    prompt, total, computed, cached = (int(progress[k]) for k in PROGRESS_KEYS)
    if prompt < 1 or total < prompt or not 0 <= computed <= total or cached < -1:
        raise ValueError(f"inconsistent counters {dict(progress)}: need 1 ≤ num_prompt_tokens ≤ num_tokens, "
                         f"0 ≤ num_computed_tokens ≤ num_tokens and num_cached_tokens ≥ −1")
    if num_scheduled < 0 or prefix_hit < 0:
        raise ValueError(f"num_scheduled ({num_scheduled}) and prefix_hit ({prefix_hit}) cannot be negative")
    if preempted and (num_scheduled or prefix_hit):
        raise ValueError("a request preempted in this step is not scheduled in it (num_scheduled = 0, no hit)")
    if prefix_hit and not num_scheduled:
        raise ValueError("a prefix hit needs a scheduled step (the request is admitted with num_scheduled > 0)")
    if prefix_hit and computed:
        raise ValueError("a prefix hit happens only when the request is admitted (num_computed_tokens = 0)")
