"""The chapters, assembled: a small nano-vllm-style inference engine that runs a Qwen3 (or Qwen3-MoE) model on the CPU.

Every stage calls a chapter's graded function, all 18 chapters in one run (`parts.USED` lists them): ch27's
EngineCore drives the loop over ch24's scheduler and ch25's paged blocks with prefix caching; ch30 lowers each
request; ch29, ch26, ch21 and ch28 describe each step; ch15/19/20's layers and ch31's experts (MoE) compute it;
attention takes ch22's, ch16+ch17's or ch18's path; ch23 samples; ch32 verifies speculative drafts; ch29
measures. By default they are the reference solutions; with a submission folder they are the student's own
wherever that task's public checks pass (see `engine.parts`). `course engine run` is the command; `run` below is
its API.

    model.py      the model: config (dense and MoE), weights, Hugging Face–format load and save, presets
    parts.py      which chapter function runs each stage, and whose it is
    core.py       Engine and Settings: one generate call, its metrics
    loop.py       ch27's EngineCore driving ch24's scheduler; ch30's records; speculative drafts counted
    async_loop.py ch27's AsyncEngineCore (one step ahead) on a worker that keeps its own copy of each request
    executor.py   one step: metadata, the forward pass, sampling, ch32's verification
    runner.py     the forward pass of one flattened step over the paged KV cache
    attention.py  attention by path: ch22 prefill, ch16 + ch17 chunk, ch18 decode
    moe.py        a layer of experts through ch31: routing, dispatch, experts, combine, EPLB
    blocks.py     ch24's allocator interface over ch25's BlockManager
    drafter.py    n-gram prompt lookup (vLLM's NgramProposer rule)
    errors.py     EngineError: two chapters disagree, or a request cannot run
    words.py      the engine's words in the run's language (grader.i18n; in the sandbox, the table sent along)
    terminal.py   `course engine run` on a terminal: prompts, progress, summary, overview figure
    text.py       a model folder's tokenizer.json: text prompts in, completions out, at the edge (the engine sees ids)
    models/       qwen3-course, the default model of `course engine run`, and the script that trains it
    boxed.py      `--submission`: the engine in a sandbox (trusted side); inbox.py is what runs in the box
    oracle.py     the comparison with transformers' Qwen3ForCausalLM / Qwen3MoeForCausalLM (needs `.[oracle]`)

It ships in the student release (no solution code is in it): there, with no reference to
fall back on, it runs only when the student's own functions pass every task it needs."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from engine.core import Engine, EngineError, Run, Settings
from engine.model import Model, ModelError, load
from engine.parts import Parts, PartsUnavailable, reference_parts, student_parts

__all__ = [
    "Engine",
    "EngineError",
    "Model",
    "ModelError",
    "Parts",
    "PartsUnavailable",
    "Run",
    "Settings",
    "load",
    "overview_record",
    "reference_parts",
    "run",
    "student_parts",
]


def run(
    *,
    model: str | Path | Model = "tiny",
    prompts: list[list[int]],
    max_tokens: int,
    settings: Settings | None = None,
    seed: int = 0,
    submission: Path | None = None,
    parts: Parts | None = None,
    on_chapter: Callable[[str], None] | None = None,
    on_step: Callable[[int, int], None] | None = None,
) -> Run:
    """Generate from `prompts` with the chapters' functions; see `Engine.generate` and `Settings`.

    Args:
        model: a preset name ("tiny", "tiny-moe", "qwen3-0.6b-shape"), a shipped model ("qwen3-course"), a Hugging
            Face–format folder, or a loaded Model.
        settings: the engine's limits and modes (`Settings()` by default; its seed also draws a preset's weights).
        seed: a preset's weights when no settings are given.
        submission: the student's chapter files: their functions run wherever their public checks pass.
            Without it, the reference solutions, or in a student release the student's exercises/.
        parts: the functions to use, overriding `submission` (tests plant wrong ones this way).
    """
    from grader import chapters

    settings = settings or Settings(seed=seed)
    if parts is None:
        if submission is None and not any(chapters.SOLUTIONS.glob("ch[0-9][0-9]_*.py")):
            submission = chapters.EXERCISES
        parts = reference_parts() if submission is None else student_parts(submission, on_chapter=on_chapter)
    loaded = model if isinstance(model, Model) else load(model, seed=settings.seed)
    result = Engine(loaded, parts, settings).generate(prompts, max_tokens, on_step=on_step)
    result.model = loaded.source
    return result


def overview_record(result: Run, model: Model, *, trace_request: int = 0) -> dict:
    """The data the course's `overview` figure is drawn from: the course map with each chapter's part in this
    run (the student's, the reference's, or none), and the path of one request through the chapters."""
    from grader import chapters

    used: dict[str, set[str]] = {}
    for label, source in result.sources.items():  # "ch19.3 qk_norm_rope" → "yours", for the functions that ran
        if result.calls.get(label):
            used.setdefault(label[:4], set()).add(source)
    course = [{"id": ch.id, "zh": ch.title_zh, "en": ch.title_en, "part": _part_of(used.get(ch.id))} for ch in chapters.all_chapters()]
    c = model.config
    m = result.metrics
    return {
        "course": course,
        "path": result.trace,
        "request": trace_request,
        "output": result.outputs[trace_request],
        "model": {
            "layers": c.num_hidden_layers,
            "hidden": c.hidden_size,
            "heads": c.num_attention_heads,
            "kv_heads": c.num_key_value_heads,
            "head_dim": c.head_dim,
            "vocab": c.vocab_size,
            "source": model.source,
            "random_weights": model.random_weights,
        },
        "counts": {
            k: m[k]
            for k in (
                "steps",
                "prefill_steps",
                "decode_steps",
                "chunked_prefill_steps",
                "prefix_cache_hits",
                "preemptions",
                "speculative_steps",
                "draft_tokens",
                "accepted_tokens",
            )
            if k in m
        },
    }


def _part_of(sources: set[str] | None) -> str | None:
    """A chapter's part in a run: None (not called), "yours", "partly yours", "override" or "reference"."""
    if not sources:
        return None
    if sources == {"yours"}:
        return "yours"
    return "partly yours" if "yours" in sources else "override" if "override" in sources else "reference"
