"""The engine loop: schedule, build the step's metadata, run the model, sample, fold the tokens back.

Every round, ch24's `Scheduler` picks a batch; ch29's `prepare_inputs` turns it into
input ids, positions and slots; ch26's `varlen_metadata` gives the cu_seqlens of the
flattened batch and ch28's `logits_indices` the rows to sample; the model runner
computes the logits; ch23's `sample` draws the tokens (temperature 0 is greedy argmax,
as in vLLM, which samples greedily below a temperature of 1e-5 (`_SAMPLING_EPS` in
vllm/sampling_params.py); nano-vllm refuses a temperature ≤ 1e-10 (nanovllm/sampling_params.py)
and ch23's sampler has no greedy path, so this engine's greedy step is its own); the blocks the step
completed are hashed into ch25's prefix cache; `Scheduler.postprocess` appends the
tokens. ch29's `latency_metrics` measures the run.

Two chapters meet here that never met in their exercises. The ch24 scheduler was
written against a plain allocator without a prefix cache; `PagedBlocks` gives it
ch25's `BlockManager` behind the same interface. Its budget therefore counts every
token of a prompt, cached or not (nano-vllm counts only the uncached ones), and the
runner skips the tokens the prefix cache already holds: a chunk that lies wholly
inside the cached prefix computes nothing, and its (discarded) sample is a placeholder.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from engine.model import Model
from engine.parts import Parts
from engine.runner import ModelRunner, Probe, Step, Trace, ints, shape

DISCARDED = -1
"""The token handed to postprocess for a sequence whose chunk computed no row (wholly prefix-cached); a
non-final chunk's sample is never appended, so it is never read."""


class EngineError(RuntimeError):
    """Two chapter functions disagree, or a request cannot run; the message names them."""


@dataclass(frozen=True, slots=True)
class Settings:
    """The engine's limits; small values force chunked prefill (max_num_batched_tokens), preemption (num_blocks)
    and, with prompts that share a prefix, prefix-cache hits (block_size)."""

    block_size: int = 16
    num_blocks: int | None = None
    """KV blocks in the pool; None: enough for every request at its longest (no preemption)."""
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512
    temperature: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
            if type(getattr(self, name)) is not int or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive int; got {getattr(self, name)!r}")
        if self.block_size < 2:
            raise ValueError("block_size must be ≥ 2 (ch25's block manager marks a new block by len % block_size == 1)")
        if self.num_blocks is not None and (type(self.num_blocks) is not int or self.num_blocks < 1):
            raise ValueError(f"num_blocks must be a positive int; got {self.num_blocks!r}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be ≥ 0 (0 is greedy); got {self.temperature}")


class PagedBlocks:
    """ch24's allocator interface (what its Scheduler calls) over ch25's BlockManager and its prefix cache.

    The two chapters have a Sequence class each; every scheduler sequence gets a block-manager twin that
    shares its token list and block table, synchronised before every call.
    """

    def __init__(self, manager: Any, twin_class: type, num_blocks: int, block_size: int) -> None:
        self.manager, self.twin_class = manager, twin_class
        self.num_blocks, self.block_size = num_blocks, block_size
        self.cached_tokens: dict[int, int] = {}
        """seq_id → tokens the prefix cache served when the sequence was last admitted."""
        self.hits: list[int] = []
        """The hit (in tokens) of every admission that had one."""
        self._twins: dict[int, Any] = {}

    def _twin(self, seq: Any) -> Any:
        twin = self._twins.get(seq.seq_id)
        if twin is None:
            twin = self._twins[seq.seq_id] = self.twin_class(list(seq.token_ids), self.block_size)
        twin.token_ids, twin.num_tokens, twin.block_table = seq.token_ids, len(seq.token_ids), seq.block_table
        return twin

    def _sync_back(self, seq: Any, twin: Any) -> None:
        if twin.block_table is not seq.block_table:  # a manager that rebinds the table instead of editing it
            seq.block_table[:] = twin.block_table
            twin.block_table = seq.block_table

    @property
    def free_block_ids(self) -> Any:
        return self.manager.free_block_ids

    @property
    def num_free_blocks(self) -> int:
        return len(self.manager.free_block_ids)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_allocate(self, seq: Any) -> bool:
        return self.manager.can_allocate(self._twin(seq)) >= 0

    def allocate(self, seq: Any) -> None:
        twin = self._twin(seq)
        num_cached_blocks = self.manager.can_allocate(twin)
        if num_cached_blocks < 0:
            raise EngineError("ch24's Scheduler allocated a sequence that ch25's can_allocate says does not fit")
        self.manager.allocate(twin, num_cached_blocks)
        self._sync_back(seq, twin)
        self.cached_tokens[seq.seq_id] = num_cached_blocks * self.block_size
        if num_cached_blocks:
            self.hits.append(num_cached_blocks * self.block_size)

    def deallocate(self, seq: Any) -> None:
        twin = self._twin(seq)
        self.manager.deallocate(twin)
        self._sync_back(seq, twin)
        self.cached_tokens.pop(seq.seq_id, None)

    def can_append(self, seq: Any) -> bool:
        return bool(self.manager.can_append(self._twin(seq)))

    def may_append(self, seq: Any) -> None:
        twin = self._twin(seq)
        self.manager.may_append(twin)
        self._sync_back(seq, twin)

    def hash_blocks(self, seq: Any) -> None:
        """Publish the blocks this step completed (before postprocess advances the counters, as nano-vllm)."""
        twin = self._twin(seq)
        twin.num_cached_tokens, twin.num_scheduled_tokens = seq.num_computed_tokens, seq.num_scheduled_tokens
        self.manager.hash_blocks(twin)
        twin.num_scheduled_tokens = 0


@dataclass
class Run:
    """What a run produced and measured."""

    outputs: list[list[int]]
    metrics: dict[str, Any]
    sources: dict[str, str]
    trace: list[dict] = field(default_factory=list)
    probes: list[dict] = field(default_factory=list)
    """With probe=True: per step, its kind, rows (seq_id, positions) and every stage's values."""
    notes: list[str] = field(default_factory=list)
    model: str = ""
    """Where the model came from (a preset and its seed, or a folder)."""

    def to_json(self) -> dict:
        return {"outputs": self.outputs, "metrics": self.metrics, "parts": self.sources, "notes": self.notes, "model": self.model}


class Engine:
    """One model, one set of chapter functions, one configuration."""

    def __init__(self, model: Model, parts: Parts, settings: Settings = Settings()) -> None:
        self.model, self.parts, self.settings = model, parts, settings

    def generate(
        self,
        prompts: list[list[int]],
        max_tokens: int,
        *,
        trace_request: int = 0,
        probe: bool = False,
        on_step: Callable[[int, int], None] | None = None,
    ) -> Run:
        """Generate up to `max_tokens` tokens for every prompt (fewer when a request samples EOS).

        Args:
            prompts: token-id lists, each non-empty, ids in [0, vocab_size).
            max_tokens: completion tokens per request (≥ 1).
            trace_request: the request whose path the trace (and the overview figure) follows.
            probe: keep every stage's values of every step (for the comparison with transformers).
            on_step: called after each step with (tokens generated so far, tokens at most).

        Raises:
            EngineError: bad prompts, a pool too small for some request, or two chapters that disagree.
        """
        self._validate(prompts, max_tokens)
        loop = _Loop(self, prompts, max_tokens, trace_request, probe)
        start = time.perf_counter()
        while not loop.scheduler.is_finished():
            loop.step(start)
            if on_step:
                on_step(sum(seq.num_completion_tokens for seq in loop.seqs), len(prompts) * max_tokens)
        return loop.finish(prompts)

    def _validate(self, prompts: list[list[int]], max_tokens: int) -> None:
        c = self.model.config
        if type(max_tokens) is not int or max_tokens < 1:
            raise EngineError(f"max_tokens must be a positive int; got {max_tokens!r}")
        if not prompts:
            raise EngineError("no prompts: give a JSON list of token-id lists")
        for i, p in enumerate(prompts):
            if not isinstance(p, list) or not p or not all(type(t) is int and 0 <= t < c.vocab_size for t in p):
                raise EngineError(f"prompt {i} must be a non-empty list of token ids in [0, {c.vocab_size})")
            if len(p) + max_tokens > c.max_position_embeddings:
                raise EngineError(f"prompt {i}: {len(p)} + {max_tokens} tokens exceed max_position_embeddings {c.max_position_embeddings}")


class _Loop:
    """One run's state: the scheduler over the paged blocks, the runner, the sequences and what is counted."""

    def __init__(self, engine: Engine, prompts: list[list[int]], max_tokens: int, trace_request: int, probe: bool) -> None:
        s, c, self.parts = engine.settings, engine.model.config, engine.parts
        self.settings, bs = s, s.block_size
        num_blocks = s.num_blocks or sum(-(-(len(p) + max_tokens) // bs) for p in prompts)
        self.trace = Trace()
        self.runner = ModelRunner(engine.model, self.parts, num_blocks=num_blocks, block_size=bs, trace=self.trace)
        self.scheduler = self.parts.fn("Scheduler")(
            num_blocks, bs, s.max_num_seqs, s.max_num_batched_tokens, -1 if c.eos_token_id is None else c.eos_token_id
        )
        self.blocks = PagedBlocks(self.parts.fn("BlockManager")(num_blocks, bs), self.parts["BlockManager"].companion, num_blocks, bs)
        self.scheduler.block_manager = self.blocks  # the course's scheduler holds its allocator as state
        sequence = self.parts["Scheduler"].companion
        self.seqs = [sequence(p, max_tokens=max_tokens, ignore_eos=c.eos_token_id is None, seq_id=i) for i, p in enumerate(prompts)]
        for seq in self.seqs:
            try:
                self.scheduler.add(seq)
            except ValueError as e:
                raise EngineError(f"request {seq.seq_id}: {e} (raise --num-blocks)") from None
        self.traced = self.seqs[trace_request]
        self.generator = torch.Generator().manual_seed(s.seed)
        self.chunk_times: list[list[float]] = [[] for _ in prompts]
        self.probes: list[dict] | None = [] if probe else None
        self.counts = {
            "steps": 0,
            "prefill_steps": 0,
            "decode_steps": 0,
            "chunked_prefill_steps": 0,
            "preemptions": 0,
            "prefix_cache_hits": 0,
            "prefix_cached_tokens": 0,
            "computed_tokens": 0,
        }

    def step(self, start: float) -> None:
        """schedule → run → hash the completed blocks → postprocess, counting what happened."""
        was_running = {seq.seq_id for seq in self.scheduler.running}
        batch, is_prefill = self.scheduler.schedule()
        kind = "prefill" if is_prefill else "decode"
        self._count(batch, kind, was_running)
        self.trace.on = self.traced in batch and not any(e["kind"] == kind for e in self.trace.events)
        self.trace.kind, traced = kind, self.trace.on
        tokens = self._run(batch, kind)
        self.trace.on = False
        for seq in batch:
            self.blocks.hash_blocks(seq)
        before = [seq.num_completion_tokens for seq in batch]
        self.scheduler.postprocess(batch, [tokens.get(seq.seq_id, DISCARDED) for seq in batch], is_prefill)
        now = time.perf_counter() - start
        for seq, n in zip(batch, before):
            if seq.num_completion_tokens > n:
                self.chunk_times[seq.seq_id].append(now)
        if traced:
            kept = self.traced.num_completion_tokens > before[batch.index(self.traced)]
            self._note(
                kind,
                "postprocess",
                "Scheduler",
                f"token {tokens.get(self.traced.seq_id, '—')} "
                + ("appended" if kept else "discarded: the chunk did not reach the prompt's end"),
            )

    def _count(self, batch: list, kind: str, was_running: set[int]) -> None:
        self.counts["steps"] += 1
        self.counts[f"{kind}_steps"] += 1
        self.counts["preemptions"] += sum(seq.seq_id in was_running for seq in self.scheduler.waiting)
        self.counts["chunked_prefill_steps"] += kind == "prefill" and any(
            seq.num_computed_tokens + seq.num_scheduled_tokens < seq.num_tokens for seq in batch
        )

    def _note(self, kind: str, stage: str, name: str, shapes: str) -> None:
        """Record a stage that is not a single function call (scheduling, bookkeeping)."""
        on, self.trace.kind, self.trace.on = self.trace.on, kind, True
        self.trace.record(stage, self.parts[name], shapes)
        self.trace.on = on

    def _rows(self, batch: list) -> list[tuple[Any, int, int]]:
        """(seq, first position, tokens) to compute: the scheduled chunk minus what the prefix cache holds."""
        rows = []
        for seq in batch:
            first = max(seq.num_computed_tokens, self.blocks.cached_tokens.get(seq.seq_id, 0))
            end = seq.num_computed_tokens + seq.num_scheduled_tokens
            if first < end:
                rows.append((seq, first, end - first))
        return rows

    def _run(self, batch: list, kind: str) -> dict[int, int]:
        """Run one scheduled batch; the sampled token of every sequence that computed a row."""
        rows = self._rows(batch)
        if self.trace.on:
            mine = next(((a, n) for seq, a, n in rows if seq is self.traced), None)
            what = f"positions {mine[0]}–{mine[0] + mine[1] - 1}" if mine else "nothing (prefix-cached)"
            plural = "s" * (len(batch) > 1)
            self._note(
                kind, "schedule", "Scheduler", f"{kind}: {len(batch)} sequence{plural}; request {self.traced.seq_id} computes {what}"
            )
            self._note(
                kind,
                "blocks (prefix cache)",
                "BlockManager",
                f"block table {ints(self.traced.block_table)}, {self.blocks.cached_tokens.get(self.traced.seq_id, 0)} tokens cached",
            )
        self.counts["computed_tokens"] += sum(n for _, _, n in rows)
        if not rows:
            return {}
        probe = Probe() if self.probes is not None else None
        logits = self.runner.forward(self._metadata(rows), traced_seq=self.traced.seq_id, probe=probe)
        sampled = self._sample(logits)
        if probe is not None and self.probes is not None:  # both or neither
            self.probes.append(
                {
                    "kind": kind,
                    "rows": [(seq.seq_id, list(range(a, a + n))) for seq, a, n in rows],
                    "stages": probe.stages,
                    "logits": probe.logits,
                    "tokens": sampled.tolist(),
                }
            )
        return {seq.seq_id: int(t) for (seq, _, _), t in zip(rows, sampled)}

    def _metadata(self, rows: list[tuple[Any, int, int]]) -> Step:
        """ch29's prepare_inputs, ch26's varlen_metadata and ch28's logits_indices describe the step."""
        call = self.runner.call
        meta = call(
            "step metadata",
            "prepare_inputs",
            [
                {"token_ids": seq.token_ids, "num_computed_tokens": a, "num_scheduled_tokens": n, "block_table": seq.block_table}
                for seq, a, n in rows
            ],
            self.settings.block_size,
            shapes=lambda m: " · ".join(f"{k} {shape(m[k])}" for k in ("input_ids", "positions", "slot_mapping")),
        )
        query_lens, cached_lens = [n for _, _, n in rows], [a for _, a, _ in rows]
        varlen = call(
            "varlen batch",
            "varlen_metadata",
            query_lens,
            cached_lens,
            shapes=lambda m: f"cu_seqlens_q {ints(m['cu_seqlens_q'])} · cu_seqlens_k {ints(m['cu_seqlens_k'])}",
        )
        indices = call("rows to sample", "logits_indices", query_lens, shapes=lambda out: f"rows {ints(out)} of {sum(query_lens)}")
        _agree(meta, varlen, indices)
        return Step(
            meta["input_ids"],
            meta["positions"],
            meta["slot_mapping"],
            varlen["cu_seqlens_q"],
            varlen["cu_seqlens_k"],
            [list(seq.block_table) for seq, _, _ in rows],
            indices.long(),
            [seq.seq_id for seq, _, _ in rows],
        )

    def _sample(self, logits: torch.Tensor) -> torch.Tensor:
        """Greedy argmax at temperature 0 (ch23's sampler has no greedy path), else ch23's exponential race."""
        t = self.settings.temperature
        if t == 0:
            tokens = logits.argmax(dim=-1)
            if self.trace.on:
                self.trace.events.append(
                    {
                        "kind": self.trace.kind,
                        "stage": "greedy (temperature 0)",
                        "chapter": "ch23",
                        "task": "ch23.2",
                        "fn": "argmax",
                        "source": "engine",
                        "shapes": f"{shape(logits)} → {shape(tokens)}",
                    }
                )
            return tokens
        noise = torch.empty(logits.shape, dtype=torch.float32).exponential_(generator=self.generator)
        temperature = torch.full((logits.shape[0],), t, dtype=torch.float32)
        return self.runner.call("sample", "sample", logits, temperature, noise)

    def finish(self, prompts: list[list[int]]) -> Run:
        """Measure the run with ch29's latency_metrics and hand everything back."""
        self.counts["prefix_cache_hits"] = len(self.blocks.hits)
        self.counts["prefix_cached_tokens"] = sum(self.blocks.hits)
        metrics = self.parts.fn("latency_metrics")(
            [
                {"start": 0.0, "chunk_times": times, "input_len": len(p), "output_len": len(seq.completion_token_ids)}
                for p, seq, times in zip(prompts, self.seqs, self.chunk_times)
            ]
        )
        self._note(
            "run",
            "measure the run",
            "latency_metrics",
            f"{len(prompts)} requests → TTFT {metrics['mean_ttft_ms']:.1f} ms, "
            f"TPOT {metrics['mean_tpot_ms']:.1f} ms, {metrics['output_throughput']:.0f} tok/s",
        )
        return Run(
            [seq.completion_token_ids for seq in self.seqs],
            {**metrics, **self.counts},
            self.parts.sources(),
            self.trace.events,
            self.probes or [],
            list(self.parts.notes),
        )


def _agree(meta: dict, varlen: dict, indices: torch.Tensor) -> None:
    """The chapters describe one batch three times; they must say the same thing."""
    qsl, cu_q = meta["query_start_loc"].long().tolist(), varlen["cu_seqlens_q"].long().tolist()
    if qsl != cu_q:
        raise EngineError(
            f"ch29's prepare_inputs (query_start_loc {qsl}) and ch26's varlen_metadata "
            f"(cu_seqlens_q {cu_q}) disagree on where the sequences start"
        )
    if meta["logits_indices"].long().tolist() != indices.long().tolist():
        raise EngineError(
            f"ch29's prepare_inputs (logits_indices {meta['logits_indices'].tolist()}) and ch28's "
            f"logits_indices ({indices.tolist()}) disagree on the rows to sample"
        )
