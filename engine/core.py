"""The engine: one model, one set of chapter functions, one configuration; `Engine.generate` runs a batch of requests.

The loop itself is `engine.loop` (ch27's EngineCore driving ch24's scheduler), a step's work `engine.executor`,
the model's forward pass `engine.runner`, attention `engine.attention`, the paged blocks `engine.blocks`. ch29's
`latency_metrics` measures the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from engine.async_loop import AsyncLoop
from engine.errors import EngineError
from engine.loop import Loop
from engine.model import Model
from engine.moe import ExpertParallel, ExpertParallelSettings
from engine.parts import Parts
from engine.words import tr

__all__ = ["Engine", "EngineError", "Run", "Settings"]


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
    top_k: int = 0
    """Sample among the k most likely tokens only (ch23's process_logits); 0 turns it off."""
    top_p: float = 1.0
    """Sample among the most likely tokens that hold p of the probability (ch23's process_logits); 1 turns it off."""
    seed: int = 0
    speculative_tokens: int = 0
    """Drafts per decode step (n-gram prompt lookup, verified by ch32); 0 turns speculative decoding off."""
    async_scheduling: bool = False
    """Run ch27's AsyncEngineCore (one step ahead, output placeholders) instead of ch24's scheduler under ch27's
    EngineCore; see `engine.async_loop`."""
    expert_parallel_ranks: int = 4
    """A Qwen3-MoE model's experts are spread over this many simulated ranks (engine.moe)."""
    eplb_interval: int = 8
    """Steps between two EPLB rearrangements of the experts (0: never)."""

    def __post_init__(self) -> None:
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
            if type(getattr(self, name)) is not int or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive int; got {getattr(self, name)!r}")
        if self.block_size < 2:
            raise ValueError("block_size must be ≥ 2 (ch25's block manager marks a new block by len % block_size == 1)")
        if self.num_blocks is not None and (type(self.num_blocks) is not int or self.num_blocks < 1):
            raise ValueError(f"num_blocks must be a positive int; got {self.num_blocks!r}")
        if type(self.speculative_tokens) is not int or self.speculative_tokens < 0:
            raise ValueError(f"speculative_tokens must be an int ≥ 0; got {self.speculative_tokens!r}")
        if self.async_scheduling and self.speculative_tokens:
            raise ValueError("speculative decoding and async scheduling are not combined here: choose one")
        if type(self.top_k) is not int or self.top_k < 0:
            raise ValueError(f"top_k must be an int ≥ 0 (0 is off); got {self.top_k!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (1 is off); got {self.top_p!r}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be ≥ 0 (0 is greedy); got {self.temperature}")


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
    calls: dict[str, int] = field(default_factory=dict)
    """How often each chapter function ran ("ch22.2 flash_attention" → 96); a stage never run is absent."""

    def to_json(self) -> dict:
        return {
            "outputs": self.outputs,
            "metrics": self.metrics,
            "parts": self.sources,
            "calls": self.calls,
            "notes": self.notes,
            "model": self.model,
        }


class Engine:
    """One model, one set of chapter functions, one configuration."""

    def __init__(self, model: Model, parts: Parts, settings: Settings = Settings()) -> None:
        self.model, self.parts, self.settings = model, parts, settings

    def generate(
        self,
        prompts: list[list[int]],
        max_tokens: int | list[int],
        *,
        trace_request: int = 0,
        probe: bool = False,
        on_step: Callable[[int, int], None] | None = None,
    ) -> Run:
        """Generate up to `max_tokens` tokens for every prompt (fewer when a request samples EOS).

        Args:
            prompts: token-id lists, each non-empty, ids in [0, vocab_size).
            max_tokens: completion tokens per request (≥ 1): one for all, or one per prompt (as vLLM takes sampling
                parameters per request).
            trace_request: the request whose path the trace (and the overview figure) follows.
            probe: keep every stage's values of every step (for the comparison with transformers).
            on_step: called after each step with (tokens generated so far, tokens at most).

        Raises:
            EngineError: bad prompts, a pool too small for some request, or two chapters that disagree.
        """
        limits = self._validate(prompts, max_tokens)
        kind = AsyncLoop if self.settings.async_scheduling else Loop
        loop = kind(self.model, self.parts, self.settings, prompts, limits, trace_request, probe)
        if self.model.config.is_moe:
            s, runner = self.settings, loop.executor.runner
            ep = ExpertParallelSettings(num_ranks=s.expert_parallel_ranks, rebalance_interval=s.eplb_interval)
            runner.expert_parallel = ExpertParallel(self.model.config, ep, runner.call)
        loop.on_step = on_step
        core = loop.core()
        loop.admit(core)
        loop.run(core)
        return self._finish(loop, prompts)

    def _finish(self, loop: Loop, prompts: list[list[int]]) -> Run:
        """Measure the run with ch29's latency_metrics and hand everything back."""
        counts: dict[str, Any] = dict(loop.counts)
        counts["prefix_cache_hits"] = len(loop.blocks.hits)
        counts["prefix_cached_tokens"] = sum(loop.blocks.hits)
        drafts = counts["draft_tokens"]
        counts["acceptance_rate"] = round(counts["accepted_tokens"] / drafts, 4) if drafts else None
        outputs = loop.result_outputs()
        loop.trace.count(self.parts["latency_metrics"])
        metrics = self.parts.fn("latency_metrics")(
            [
                {"start": 0.0, "chunk_times": times, "input_len": len(p), "output_len": len(out)}
                for p, out, times in zip(prompts, outputs, loop.chunk_times)
            ]
        )
        loop.note(
            "run",
            "measure the run",
            "latency_metrics",
            tr(
                "{n} requests → TTFT {ttft:.1f} ms, TPOT {tpot:.1f} ms, {output:.0f} tok/s",
                n=len(prompts),
                ttft=metrics["mean_ttft_ms"],
                tpot=metrics["mean_tpot_ms"],
                output=metrics["output_throughput"],
            ),
        )
        experts = loop.executor.runner.expert_parallel
        return Run(
            outputs,
            {**metrics, **counts, **(experts.metrics() if experts else {})},
            self.parts.sources(),
            loop.trace.events,
            loop.probes or [],
            list(self.parts.notes),
            calls=dict(loop.trace.calls),
        )

    def _validate(self, prompts: list[list[int]], max_tokens: int | list[int]) -> list[int]:
        """Each prompt's max_tokens, once the prompts and limits are checked."""
        c = self.model.config
        if not prompts:
            raise EngineError(tr("no prompts: give a JSON list of token-id lists"))
        limits = [max_tokens] * len(prompts) if not isinstance(max_tokens, list) else list(max_tokens)
        if len(limits) != len(prompts):
            raise EngineError(tr("{n} max_tokens for {prompts} prompts: give one, or one per prompt", n=len(limits), prompts=len(prompts)))
        for i, (p, m) in enumerate(zip(prompts, limits)):
            if type(m) is not int or m < 1:
                raise EngineError(tr("max_tokens must be a positive int; got {value}", value=repr(m)))
            if not isinstance(p, list) or not p or not all(type(t) is int and 0 <= t < c.vocab_size for t in p):
                raise EngineError(tr("prompt {i} must be a non-empty list of token ids in [0, {vocab})", i=i, vocab=c.vocab_size))
            if len(p) + m > c.max_position_embeddings:
                raise EngineError(
                    tr(
                        "prompt {i}: {n} + {m} tokens exceed max_position_embeddings {limit}",
                        i=i,
                        n=len(p),
                        m=m,
                        limit=c.max_position_embeddings,
                    )
                )
        return limits
