"""Benchmark (not a test): the course engine against transformers' `generate` on a mixed workload, same tokens.

Run:  .venv/bin/python tests/bench/engine_speed.py [--skip-large | --skip-small] [--repeats N] [--large-layers L]
Needs the oracle extra (transformers). Issue 25, item 3: 32 requests, prompt lengths
16–256, `max_tokens` 8–64, every 4th request opening with the same 64 tokens (a shared
system prompt), seeded; greedy, float32, on the CPU, random weights, two shapes:

- `small` (vocab 8192, hidden 256, 4 layers, 8 query / 4 KV heads of 64): a step's matrix
  work (6 M weights, 24 MB read per decode step, more than the L2 cache) is of the
  same order as the Python work of the ~20 chapter calls per layer, so both the per-step
  overhead and the real work show; `tiny` (34 k weights) measures only the overhead.
- `qwen3-0.6b` (Qwen3-0.6B's widths: vocab 151936, hidden 1024, 16 / 8 heads of 128),
  with `--large-layers` of its 28 layers (default: all 28).

Each side is run as its user would run it:
- the engine with the reference chapter functions, `max_num_seqs` 32 (the whole workload
  in flight) and a `max_num_batched_tokens` budget of 2048 (a long prompt is chunked, a
  prefill step's activations stay a few MB per layer; later admissions find the shared
  prefix already hashed, so prefix-cache hits happen), each request with its own
  `max_tokens` (as vLLM and nano-vllm take sampling parameters per request).
- transformers' `Qwen3ForCausalLM.generate` (SDPA attention, its dynamic KV cache) called
  once with all 32 prompts, left-padded to the longest with an attention mask: one
  `generate` call takes one `max_new_tokens`, so a user batching requests of different
  lengths asks for the largest and cuts each completion to its own `max_tokens` afterwards
  (with no EOS in these models, every row decodes to the end). Grouping requests by
  length would pad less, but that is a scheduler the user would have to write.

Each repeat runs the engine and transformers alternately (the first of the pair
alternates too), after one warm-up run each; the table gives medians. Per shape it
prints wall time and output tokens/s of each side, the speed-up (the median over the
repeats of generate's time over the engine's in the same repeat, which a machine whose
load changes between repeats disturbs least), the work each did (tokens computed,
engine: its `computed_tokens`, generate: batch × padded prompt + batch × decode steps;
decode steps; rows per decode step; prefix-cache hits), and decode against this
machine's bound. A decode step of B rows must read every weight once (every linear and
the LM head; the embedding lookup reads only B rows) and multiply B rows by them (2·B
flops per weight; attention's flops left out), so it takes at least
max(bytes / bandwidth, flops / peak), with the memory bandwidth (sum of a 1 GiB tensor)
and the matrix-multiply peak (the best of a few large float32 GEMMs) measured here, with
the threads the two sides use. "of bound" is that least time summed over the run's
decode steps, over the decode steps' measured time. On one core, a batch of 32 rows is
already compute-bound at the 0.6B shape (the LM head alone is 10 GFLOP a step), so the
table shows both limits. The tokens of the two must be identical.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

import engine  # noqa: E402
from engine.model import PRESETS, Model, ModelConfig, random_model  # noqa: E402
from engine.parts import Parts  # noqa: E402

SMALL = ModelConfig(
    vocab_size=8192,
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=64,
    max_position_embeddings=1024,
)
"""The small shape (see the module docstring for why)."""

REQUESTS, PROMPT_LENS, MAX_TOKENS, SHARED_EVERY, SHARED_LEN = 32, (16, 256), (8, 64), 4, 64
"""The workload of issue 25: 32 requests, prompt lengths and max_tokens drawn uniformly from these ranges,
every 4th request opening with the same 64 tokens."""

MAX_NUM_SEQS, MAX_NUM_BATCHED_TOKENS, BLOCK_SIZE = 32, 2048, 16


@dataclass
class Workload:
    prompts: list[list[int]]
    max_tokens: list[int]

    @property
    def output_tokens(self) -> int:
        return sum(self.max_tokens)


@dataclass
class Timing:
    """One run of one side: wall seconds, completions, work counters, per-decode-step seconds."""

    seconds: float
    outputs: list[list[int]]
    computed_tokens: int
    decode_steps: int
    prefix_hits: int
    decode: list[tuple[float, int]]
    """Every decode step: (seconds, rows)."""


def workload(vocab_size: int, seed: int = 1) -> Workload:
    """The mixed workload, drawn from `seed`: lengths and max_tokens first (the same for every vocabulary), then
    token ids uniform over the vocabulary; the shared prefix is followed by at least one token of the request's
    own (a prompt of 65 or more tokens)."""
    rng = random.Random(seed)
    shared_first = max(PROMPT_LENS[0], SHARED_LEN + 1)
    lengths = [rng.randint(shared_first if i % SHARED_EVERY == 0 else PROMPT_LENS[0], PROMPT_LENS[1]) for i in range(REQUESTS)]
    max_tokens = [rng.randint(*MAX_TOKENS) for _ in range(REQUESTS)]
    shared = [rng.randrange(vocab_size) for _ in range(SHARED_LEN)]
    prompts = []
    for i, n in enumerate(lengths):
        head = shared if i % SHARED_EVERY == 0 else []
        prompts.append(head + [rng.randrange(vocab_size) for _ in range(n - len(head))])
    return Workload(prompts, max_tokens)


@dataclass
class Machine:
    bandwidth: float
    """bytes per second read from memory"""
    peak: float
    """float32 flops per second of a large matrix multiply"""


def gemm_peak(repeats: int = 3) -> float:
    """Float32 flops per second of this process's best large matrix multiply ([512, 2048] · [2048, 2048])."""
    a, b = torch.randn(512, 2048), torch.randn(2048, 2048)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * 512 * 2048 * 2048 / best


def memory_bandwidth(gib: float = 1.0, repeats: int = 5) -> float:
    """Bytes per second this process reads from memory: the best of `repeats` sums of a `gib` GiB float32 tensor
    (with the threads torch uses here, as the two sides do)."""
    x = torch.ones(int(gib * 2**30) // 4)
    x.sum()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - start)
    return x.numel() * 4 / best


def decode_weights(c: ModelConfig) -> int:
    """Weights one decode step reads: every layer's, the final norm and the LM head (the embedding lookup reads B
    rows only; with tied embeddings the LM head is the embedding matrix, read once)."""
    untied_embedding = 0 if c.tie_word_embeddings else c.vocab_size * c.hidden_size
    return c.num_parameters - untied_embedding


def decode_bound(c: ModelConfig, rows: int, machine: Machine) -> float:
    """The least seconds a decode step of `rows` rows can take here: its weight bytes over the bandwidth, or its
    matrix flops (2 per weight per row) over the GEMM peak, whichever is more."""
    weights = decode_weights(c)
    weight_bytes = weights * torch.empty((), dtype=c.torch_dtype).element_size()
    return max(weight_bytes / machine.bandwidth, 2 * rows * weights / machine.peak)


def engine_parts(kinds: list[tuple[bool, int]]) -> Parts:
    """The reference parts, with an instrument that changes no function that runs: the Scheduler records whether each
    step is a prefill (True) or a decode (False), and its batch size."""
    parts = engine.reference_parts()
    scheduler_part = parts["Scheduler"]

    class Recording(scheduler_part.fn):  # type: ignore[misc, name-defined]
        def schedule(self):
            batch, is_prefill = super().schedule()
            kinds.append((is_prefill, len(batch)))
            return batch, is_prefill

    swapped = {p.name: p for p in parts}
    swapped["Scheduler"] = replace(scheduler_part, fn=Recording)
    return Parts(swapped, parts.notes)


def run_engine(model: Model, work: Workload) -> Timing:
    kinds: list[tuple[bool, int]] = []
    stamps: list[float] = []
    settings = engine.Settings(block_size=BLOCK_SIZE, max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS)
    eng = engine.Engine(model, engine_parts(kinds), settings)
    start = time.perf_counter()
    stamps.append(start)
    run = eng.generate(work.prompts, work.max_tokens, on_step=lambda *_: stamps.append(time.perf_counter()))
    seconds = time.perf_counter() - start
    steps = [b - a for a, b in zip(stamps, stamps[1:])]
    m = run.metrics
    return Timing(
        seconds,
        run.outputs,
        m["computed_tokens"],
        m["decode_steps"],
        m["prefix_cache_hits"],
        [(s, rows) for s, (prefill, rows) in zip(steps, kinds) if not prefill],
    )


def hf_twin(model: Model):
    """transformers' Qwen3ForCausalLM holding the same weights (the same tensors: no second copy in memory)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    hf = Qwen3ForCausalLM(Qwen3Config(**model.config.to_hf())).eval()
    missing, unexpected = hf.load_state_dict(model.hf_state_dict(), strict=False, assign=True)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    if model.config.tie_word_embeddings:
        hf.lm_head.weight = hf.model.embed_tokens.weight
    return hf


@torch.inference_mode()
def run_generate(hf, work: Workload, pad_id: int = 0) -> Timing:
    """One `generate` call over the left-padded batch; each completion cut to its request's max_tokens."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    stamps: list[float] = []

    class Clock(StoppingCriteria):
        """Called once after each forward pass (the prefill's first): a timestamp, never a stop."""

        def __call__(self, input_ids, scores, **kwargs):
            stamps.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    width = max(map(len, work.prompts))
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in work.prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in work.prompts])
    new = max(work.max_tokens)
    start = time.perf_counter()
    out = hf.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=new,
        min_new_tokens=new,
        do_sample=False,
        pad_token_id=pad_id,
        stopping_criteria=StoppingCriteriaList([Clock()]),
    )
    seconds = time.perf_counter() - start
    completions = [row[width : width + n] for row, n in zip(out.tolist(), work.max_tokens)]
    decode_steps = out.shape[1] - width - 1
    return Timing(
        seconds,
        completions,
        len(work.prompts) * (width + decode_steps),
        decode_steps,
        0,
        [(b - a, len(work.prompts)) for a, b in zip(stamps, stamps[1:])],
    )


def median_run(runs: list[Timing]) -> Timing:
    """The run of median wall time."""
    return sorted(runs, key=lambda t: t.seconds)[len(runs) // 2]


def of_bound(t: Timing, c: ModelConfig, machine: Machine) -> float:
    """The least time of the run's decode steps over their measured time."""
    return sum(decode_bound(c, rows, machine) for _, rows in t.decode) / sum(s for s, _ in t.decode)


def bench(name: str, config: ModelConfig, repeats: int) -> dict:
    model = random_model(config, seed=0)
    work = workload(config.vocab_size)
    hf = hf_twin(model)
    warm = Workload([p[:16] for p in work.prompts[:4]], [2] * 4)
    run_engine(model, warm), run_generate(hf, warm)
    engine_runs, hf_runs = [], []
    for r in range(repeats):
        order = (("engine", run_engine, model, engine_runs), ("generate", run_generate, hf, hf_runs))
        for side, fn, m, runs in order if r % 2 == 0 else order[::-1]:
            runs.append(fn(m, work))
            print(f"  {name} repeat {r + 1}/{repeats} {side}: {runs[-1].seconds:.2f} s", file=sys.stderr, flush=True)
    e, g = median_run(engine_runs), median_run(hf_runs)
    same = sum(a == b for a, b in zip(e.outputs, g.outputs))
    ratio = statistics.median(h.seconds / e.seconds for e, h in zip(engine_runs, hf_runs))
    return {"name": name, "config": config, "work": work, "engine": e, "generate": g, "same": same, "ratio": ratio}


def report(row: dict, machine: Machine, repeats: int) -> None:
    """One shape's Markdown table."""
    c, work = row["config"], row["work"]
    print(
        f"### {row['name']}: {c.num_hidden_layers} layers, hidden {c.hidden_size}, vocab {c.vocab_size}, "
        f"{decode_weights(c) / 1e6:.1f} M weights read per decode step; {len(work.prompts)} requests, "
        f"{sum(map(len, work.prompts))} prompt tokens, {work.output_tokens} output tokens; medians of {repeats}\n"
    )
    print(
        "| side | wall s | output tok/s | speed-up | computed tokens | decode steps | rows / decode step | prefix hits "
        "| decode step ms (median) | of bound |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for side, speedup in (("engine", row["ratio"]), ("generate", 1.0)):
        t: Timing = row[side]
        rows = sum(r for _, r in t.decode) / max(len(t.decode), 1)
        print(
            f"| {side} | {t.seconds:.2f} | {work.output_tokens / t.seconds:.1f} | "
            f"{speedup:.2f}× | {t.computed_tokens} | {t.decode_steps} | {rows:.1f} | "
            f"{t.prefix_hits} | {statistics.median(s for s, _ in t.decode) * 1e3:.1f} | {of_bound(t, c, machine):.0%} |"
        )
    bound32 = decode_bound(c, len(work.prompts), machine)
    print(
        f"\nsame tokens: {row['same']}/{len(work.prompts)} requests; a decode step of {len(work.prompts)} rows takes at "
        f"least {bound32 * 1e3:.1f} ms here (memory alone: {decode_bound(c, 0, machine) * 1e3:.1f} ms)\n",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-large", action="store_true", help="only the small shape")
    parser.add_argument("--skip-small", action="store_true", help="only the 0.6B-class shape")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per side (medians)")
    parser.add_argument("--large-layers", type=int, default=28, help="layers of the 0.6B-class shape (Qwen3-0.6B: 28)")
    args = parser.parse_args()
    machine = Machine(memory_bandwidth(), gemm_peak())
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32, greedy; measured here: memory "
        f"{machine.bandwidth / 1e9:.1f} GB/s, GEMM {machine.peak / 1e9:.1f} GFLOP/s\n"
    )
    shapes = [] if args.skip_small else [("small", SMALL)]
    if not args.skip_large:
        shapes.append(("qwen3-0.6b", replace(PRESETS["qwen3-0.6b-shape"], num_hidden_layers=args.large_layers)))
    for name, config in shapes:
        report(bench(name, config, args.repeats), machine, args.repeats)


if __name__ == "__main__":
    main()
