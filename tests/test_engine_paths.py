"""Every chapter in one engine run: ch27's loop drives it (sync and async), each attention path runs its chapter's
function (ch22 prefill, ch16 + ch17 chunk, ch18 decode with ch21's inputs and ch26's buffers), ch30 admits,
speculative decoding is verified by ch32 and counted by ch27.3; transformers agrees under each, and a wrong
function in any of them is caught and named."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
import torch

import engine
from engine import oracle
from engine.core import EngineError, Settings
from engine.drafter import propose
from engine.model import load
from solutions import ch21_kv_cache, ch22_flash_attention, ch27_engine_core

pytestmark = pytest.mark.slow

REPEATING = [[1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3], [7, 8, 9, 7, 8, 9, 7, 8], list(range(1, 12)), [50, 51, 50, 51, 50]]
"""Prompts whose ends recur in them: the n-gram drafter proposes from the first decode step on."""
FORCING = Settings(block_size=4, num_blocks=12, max_num_seqs=2, max_num_batched_tokens=8)
SPECULATING = replace(FORCING, speculative_tokens=3)
ASYNC = replace(FORCING, num_blocks=None, async_scheduling=True)
"""ch27's plan_tokens never preempts: the pool holds every request."""


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return load("tiny").save(tmp_path_factory.mktemp("tiny"))


def run(parts=None, settings: Settings = FORCING, prompts=REPEATING, max_tokens: int = 8) -> engine.Run:
    return engine.Engine(load("tiny"), parts or engine.reference_parts(), settings).generate(prompts, max_tokens)


def test_the_drafter_proposes_what_followed_the_longest_earliest_match():
    assert propose([1, 2, 3, 4, 2, 3], k=4, min_n=2, max_n=3) == [4, 2, 3]  # vLLM's NgramProposer docstring example
    assert propose([9, 1, 2, 5, 1, 2, 6, 7, 1, 2], k=2) == [5, 1], "the earliest occurrence of the longest match"
    assert propose([1, 2, 3, 9, 2, 3, 8, 1, 2, 3], k=2) == [9, 2], "a 3-gram beats the later 2-gram"
    assert propose([5, 6, 7, 8], k=3) == [] and propose([4, 4], k=0) == []


def test_every_chapter_but_moe_runs_in_one_speculative_run():
    result = run(settings=SPECULATING)
    chapters_called = {label[:4] for label, n in result.calls.items() if n}
    assert chapters_called == {f"ch{n}" for n in range(15, 33)} - {"ch23", "ch31"}, sorted(chapters_called)
    for label in ("ch22.2 flash_attention", "ch16.3 attention_steps", "ch17.2 causal_mask_with_offset", "ch18.2 gqa_attention"):
        assert result.calls[label] > 0, label
    for label in ("ch21.2 decode_inputs", "ch26.3 pad_decode_batch", "ch26.4 fill_static_buffers", "ch32.1 verify_draft"):
        assert result.calls[label] > 0, label
    m = result.metrics
    assert m["draft_tokens"] > 0 and 0 < m["accepted_tokens"] <= m["draft_tokens"] and m["acceptance_rate"] is not None
    assert {e["kind"] for e in result.trace} >= {"admit", "prefill", "decode", "speculative", "run"}


@pytest.mark.parametrize("settings", [SPECULATING, ASYNC], ids=["speculative", "async"])
def test_the_engine_matches_transformers_under_speculation_and_async_scheduling(tiny_dir, settings):
    result = oracle.compare(tiny_dir, REPEATING, 10, settings=settings)
    assert result.ok, result.message
    assert result.run.outputs == result.transformers_tokens
    plain = run(settings=FORCING, max_tokens=10)
    assert result.run.outputs == plain.outputs, "greedy speculative decoding and async scheduling change no token"


def test_speculation_takes_fewer_steps_and_reports_its_acceptance():
    plain, fast = run(settings=FORCING, max_tokens=12), run(settings=SPECULATING, max_tokens=12)
    assert fast.outputs == plain.outputs
    assert fast.metrics["decode_steps"] < plain.metrics["decode_steps"], (fast.metrics, plain.metrics)
    assert fast.metrics["accepted_tokens"] > 0


def test_async_scheduling_runs_ch27s_async_core_with_placeholders():
    result = run(settings=ASYNC)
    assert result.calls.get("ch27.2 AsyncEngineCore") and not result.calls.get("ch24.1 Scheduler")
    assert result.outputs == run(settings=FORCING).outputs
    with pytest.raises(ValueError, match="not combined"):
        Settings(async_scheduling=True, speculative_tokens=2)
    with pytest.raises(EngineError, match="never preempts"):
        run(settings=replace(FORCING, async_scheduling=True, num_blocks=3))


def no_scale_flash(q, k, v, causal=True, block_q=64, block_k=64, trace=None):
    return ch22_flash_attention.flash_attention(q * k.shape[-1] ** 0.5, k, v, causal, block_q, block_k, trace)


def top_left_mask(num_new, num_cached):
    """SDPA's is_causal alignment: query i sees keys 0 … i, as if nothing were cached."""
    return torch.ones(num_new, num_new + num_cached, dtype=torch.bool).tril()


@pytest.mark.parametrize(
    "override, where",
    [
        ({"flash_attention": no_scale_flash}, r"step 1 \(prefill, request 0, positions 0–7\), decoder layer 0"),
        ({"causal_mask_with_offset": top_left_mask}, r"\((prefill|speculative), request \d, positions"),
    ],
    ids=["flash without 1/sqrt(d)", "mask aligned top-left"],
)
def test_a_wrong_attention_path_is_named_by_step_and_layer(tiny_dir, override, where):
    parts = engine.reference_parts().replaced(**override)
    result = oracle.compare(tiny_dir, REPEATING[:2], 4, parts=parts, settings=SPECULATING)
    assert not result.ok and re.search(where, result.message), result.message


def off_by_one_decode_inputs(token_ids, block_table, block_size):
    out = ch21_kv_cache.decode_inputs(token_ids, block_table, block_size)
    return {**out, "slot": out["slot"] + 1}


class NeverFinishing(ch27_engine_core.EngineCore):
    def update_from_output(self, scheduler_output, runner_output):
        outputs = super().update_from_output(scheduler_output, runner_output)
        for r in self.requests.values():
            r.status = ch27_engine_core.RUNNING
        return outputs


def accept_everything(draft_tokens, draft_probs, target_probs, uniforms, noise):
    return [int(t) for t in draft_tokens] + [int(target_probs[-1].argmax())]


@pytest.mark.parametrize(
    "override, message",
    [
        ({"decode_inputs": off_by_one_decode_inputs}, r"ch21's decode_inputs .* and ch29's prepare_inputs .* disagree"),
        ({"EngineCore": NeverFinishing}, r"ch27's EngineCore says RUNNING, ch24's scheduler FINISHED"),
        ({"lower_request": lambda request: (_ for _ in ()).throw(ValueError("no"))}, r"ch30's lower_request refused it: no"),
        ({"select_phase": lambda batch: "decode"}, r"ch30's select_phase says 'decode'"),
        ({"schedule_spec": lambda request: {"num_scheduled_tokens": 1, "scheduled_spec_token_ids": []}}, r"ch27's schedule_spec planned"),
    ],
    ids=["ch21", "ch27.1", "ch30 lower", "ch30 phase", "ch27.3"],
)
def test_chapters_that_disagree_with_the_engine_are_named(override, message):
    with pytest.raises(EngineError, match=message):
        run(engine.reference_parts().replaced(**override), settings=SPECULATING)


def test_a_verifier_that_accepts_every_draft_changes_the_tokens_and_is_caught(tiny_dir):
    parts = engine.reference_parts().replaced(verify_draft=accept_everything)
    result = oracle.compare(tiny_dir, [[7, 8, 9, 7, 8, 9, 7, 8]], 12, parts=parts, settings=SPECULATING)
    assert result.run.metrics["acceptance_rate"] == 1.0
    assert not result.ok and "completion token" in result.message, result.message
