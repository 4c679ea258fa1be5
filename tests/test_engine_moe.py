"""The engine runs Qwen3-MoE through ch31: routing, dispatch and combine over simulated expert-parallel ranks,
EPLB rearranging the experts mid-run, token for token and layer by layer what transformers' Qwen3MoeForCausalLM
computes; a wrong ch31 function is named by step and layer; what the engine does not implement is refused by name."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file, save_file

import engine
from engine import oracle
from engine.core import Settings
from engine.model import PRESETS, ModelConfig, ModelError, load, random_model
from solutions import ch19_rope, ch31_moe_eplb

pytestmark = pytest.mark.slow  # transformers' model against the engine's, runs of a few seconds each

PROMPTS = [list(range(1, 12)), list(range(1, 9)) + [20, 21], list(range(1, 14)), [50, 51], list(range(1, 10))]
"""Five requests, four sharing the prefix 1 … 8: with block_size 4 the later ones hit the cached blocks."""
FORCING = Settings(block_size=4, num_blocks=9, max_num_seqs=2, max_num_batched_tokens=8, eplb_interval=3)
"""Chunked prefill (budget 8 < prompt lengths), preemption (9 blocks of 4), and EPLB every 3 steps."""


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return load("tiny-moe", seed=1).save(tmp_path_factory.mktemp("tiny-moe"))


def test_a_saved_moe_preset_loads_back_and_transformers_forms_load_too(moe_dir, tmp_path):
    from transformers import Qwen3MoeForCausalLM

    model = load(moe_dir)
    assert model.config == PRESETS["tiny-moe"] and model.config.is_moe
    names = set(model.hf_state_dict())
    assert {"model.layers.1.mlp.gate.weight", "model.layers.1.mlp.experts.7.down_proj.weight"} <= names
    assert not any(".mlp.gate_proj." in n for n in names)
    hf = Qwen3MoeForCausalLM.from_pretrained(moe_dir, dtype=torch.float32)
    assert sum(p.numel() for p in hf.parameters()) == model.config.num_parameters
    hf.save_pretrained(tmp_path / "hf")  # per-expert names, and num_local_experts in config.json
    assert "num_local_experts" in json.loads((tmp_path / "hf" / "config.json").read_text())
    # the stacked form transformers holds in memory: [E, 2I, H] gate | up and [E, H, I] down
    tensors = load_file(moe_dir / "model.safetensors")
    stacked = {n: t for n, t in tensors.items() if ".experts." not in n}
    for i, lw in enumerate(model.layers):
        assert lw.moe is not None and lw.gate_up is None
        stacked[f"model.layers.{i}.mlp.experts.gate_up_proj"] = lw.moe.gate_up.contiguous()
        stacked[f"model.layers.{i}.mlp.experts.down_proj"] = lw.moe.down.contiguous()
    (tmp_path / "stacked").mkdir()
    save_file(stacked, tmp_path / "stacked" / "model.safetensors")
    (tmp_path / "stacked" / "config.json").write_text((moe_dir / "config.json").read_text())
    for again in (load(tmp_path / "hf"), load(tmp_path / "stacked")):
        assert again.config == model.config
        for a, b in zip(model.hf_state_dict().values(), again.hf_state_dict().values()):
            assert torch.equal(a, b)
    # weights shipped in bfloat16 under a float32 config (as a small shipped model may be) compute in float32
    save_file({n: t.to(torch.bfloat16) for n, t in stacked.items()}, tmp_path / "stacked" / "model.safetensors")
    half = load(tmp_path / "stacked")
    assert half.layers[0].moe is not None and half.layers[0].moe.gate_up.dtype == torch.float32
    assert torch.equal(half.layers[0].moe.gate_up, model.layers[0].moe.gate_up.to(torch.bfloat16).float())


def test_a_qwen3_30b_a3b_config_reads_as_transformers_builds_it():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    hf = {  # Qwen3-30B-A3B's widths, with one dense layer (mlp_only_layers) to count that path too
        "model_type": "qwen3_moe",
        **dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=48, head_dim=128),
        **dict(num_attention_heads=32, num_key_value_heads=4, num_experts=128, num_experts_per_tok=8),
        **dict(moe_intermediate_size=768, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[3]),
        **dict(tie_word_embeddings=False, rope_theta=1e6, rope_scaling=None, router_aux_loss_coef=0.001),
    }
    config = ModelConfig.from_hf(hf)
    assert config.is_moe and not config.is_moe_layer(3) and config.is_moe_layer(4)
    with torch.device("meta"):  # no memory: only the parameters' shapes
        model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**{k: v for k, v in hf.items() if k not in ("model_type", "rope_theta")}))
    assert config.num_parameters == sum(p.numel() for p in model.parameters())


def test_unsupported_moe_features_are_refused_by_name(tmp_path):
    hf = PRESETS["tiny-moe"].to_hf()
    for field, value, words in [
        ("shared_expert_intermediate_size", 64, "shared_expert_intermediate_size=64: shared experts"),
        ("n_group", 2, "n_group=2: grouped top-k"),
        ("scoring_func", "sigmoid", "scoring_func='sigmoid'"),
    ]:
        (tmp_path / "config.json").write_text(json.dumps({**hf, field: value}))
        with pytest.raises(ModelError, match=words):
            load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**hf, "num_experts_per_tok": 9}))
    with pytest.raises(ModelError, match="num_experts_per_tok=9 exceeds num_experts=8"):
        load(tmp_path)


def test_the_moe_engine_matches_transformers_while_eplb_moves_the_experts(moe_dir):
    result = oracle.compare(moe_dir, PROMPTS, 10, settings=FORCING)
    m = result.run.metrics
    assert m["chunked_prefill_steps"] > 0 and m["prefix_cache_hits"] > 0 and m["preemptions"] > 0, m
    assert result.ok, result.message
    assert result.run.outputs == result.transformers_tokens
    assert len({tuple(out) for out in result.run.outputs}) > 1  # the requests do not all say the same thing
    # EPLB rearranged the experts mid-run: the placement changed, the tokens did not
    assert m["eplb_rebalances"] >= 2 and m["eplb_slots_moved"] > 0, m
    assert m["moe_physical_experts"] == 12 and m["moe_ep_ranks"] == 4
    assert 0 < m["moe_balancedness_before"] <= m["moe_balancedness_after"] <= 1, m
    fixed = engine.Engine(load(moe_dir), engine.reference_parts(), replace(FORCING, eplb_interval=0)).generate(PROMPTS, 10)
    assert fixed.metrics["eplb_rebalances"] == 0 and fixed.metrics["eplb_slots_moved"] == 0
    assert fixed.outputs == result.run.outputs
    stages = {e["stage"]: e for e in result.run.trace}
    assert stages["route top-k"]["chapter"] == "ch31" and stages["route top-k"]["shapes"].startswith("logits [")
    assert stages["dispatch to ranks"]["fn"] == "dispatch" and "4 ranks of [" in stages["dispatch to ranks"]["shapes"]
    assert {"combine to tokens", "expert (SwiGLU)", "EPLB load window"} <= set(stages)


@pytest.mark.parametrize(
    "layers, sparse_step, mlp_only, ranks",
    [(3, 1, (1,), 1), (4, 2, (), 2)],
    ids=["mlp_only_layers, one rank", "decoder_sparse_step 2, two ranks"],
)
def test_dense_layers_of_a_moe_model_match_too(tmp_path, layers, sparse_step, mlp_only, ranks):
    config = replace(
        PRESETS["tiny-moe"], num_hidden_layers=layers, decoder_sparse_step=sparse_step, mlp_only_layers=mlp_only, norm_topk_prob=False
    )
    folder = random_model(config, seed=2).save(tmp_path)
    model = load(folder)
    moe = [i for i, lw in enumerate(model.layers) if lw.moe is not None]
    assert moe == ([0, 2] if mlp_only else [1, 3])
    result = oracle.compare(folder, PROMPTS[:3], 6, settings=replace(FORCING, expert_parallel_ranks=ranks))
    assert result.ok, result.message
    m = result.run.metrics
    assert m["moe_ep_ranks"] == ranks and m["moe_physical_experts"] == 12 and m["eplb_rebalances"] > 0
    assert (m["moe_balancedness"] == 1.0) == (ranks == 1)  # one rank is always balanced; two seldom are


def _without_renormalising(router_logits, k, renormalize=True):
    return ch31_moe_eplb.route_topk(router_logits, k, renormalize=False)


def _concatenated(per_rank_outputs, handle, topk_weights):
    """The mistake ch31's docstring warns of: the ranks' outputs in their physical order, summed k rows at a time."""
    y = torch.cat(list(per_rank_outputs))
    return (y.view(topk_weights.shape[0], topk_weights.shape[1], -1) * topk_weights[..., None]).sum(1).to(y.dtype)


def _least_likely(router_logits, k, renormalize=True):
    return ch31_moe_eplb.route_topk(-router_logits, k, renormalize)


def _q_norm_too_strong(q, k, q_norm_weight, k_norm_weight, positions, base, eps=1e-6):
    return ch19_rope.qk_norm_rope(q, k, q_norm_weight * 1.5, k_norm_weight, positions, base, eps)


@pytest.mark.parametrize(
    "name, wrong, label, inside",
    [
        ("route_topk", _without_renormalising, "ch31.1 route_topk", "inside it, routing: the experts agree but ch31's route_topk weighs"),
        ("route_topk", _least_likely, "ch31.1 route_topk", "inside it, routing: on transformers' input ch31's route_topk chooses"),
        ("combine", _concatenated, "ch31.2 combine", "inside it, the experts: routing agrees"),
        ("qk_norm_rope", _q_norm_too_strong, "ch19.3 qk_norm_rope", "inside it, routing and experts agree"),
    ],
    ids=["weights", "experts", "combine", "attention"],
)
def test_a_wrong_function_is_named_by_step_layer_and_half_of_the_layer(moe_dir, name, wrong, label, inside):
    parts = engine.reference_parts().replaced(**{name: wrong})
    result = oracle.compare(moe_dir, PROMPTS[:2], 3, parts=parts, settings=FORCING)
    assert not result.ok and result.divergence is not None
    d = result.divergence
    assert (d.step, d.kind, d.stage) == (1, "prefill", "decoder layer 0 (its output, the residual stream)"), d.message
    assert "first divergence at step 1 (prefill, request 0" in result.message
    assert d.detail.startswith(inside) and d.detail in result.message, d.detail
    assert result.run.sources[label] == "override"


def test_a_students_ch31_runs_where_its_checks_pass(tmp_path):
    from grader import chapters

    source = (chapters.SOLUTIONS / "ch31_moe_eplb.py").read_text(encoding="utf-8")
    renormalise = "        weights = weights / weights.sum(dim=-1, keepdim=True)\n"
    assert renormalise in source
    wrong = source.replace(renormalise, "        pass\n")  # never renormalises: ch31.1 fails, the rest passes
    (tmp_path / "ch31_moe_eplb.py").write_text(wrong, encoding="utf-8")
    parts = engine.student_parts(tmp_path)
    sources = {label: s for label, s in parts.sources().items() if label.startswith("ch31")}
    assert sources == {
        "ch31.1 route_topk": "reference",
        "ch31.2 dispatch": "yours",
        "ch31.2 combine": "yours",
        "ch31.3 rebalance_experts": "yours",
        "ch31.3 balancedness": "yours",
        "ch31.4 record_expert_load": "yours",
    }
    assert any(note.startswith("ch31: ch31.1 not passing") for note in parts.notes), parts.notes
    model = load("tiny-moe")
    theirs = engine.Engine(model, parts, FORCING).generate(PROMPTS, 6)
    assert theirs.metrics["eplb_rebalances"] > 0
    assert theirs.outputs == engine.Engine(model, engine.reference_parts(), FORCING).generate(PROMPTS, 6).outputs


REPEATING = [[1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3], [7, 8, 9, 7, 8, 9, 7, 8], list(range(1, 12)), [50, 51, 50, 51, 50]]
"""Prompts whose ends recur in them: the n-gram drafter proposes from the first decode step on."""


@pytest.mark.parametrize(
    "settings",
    [replace(FORCING, num_blocks=12, speculative_tokens=3), replace(FORCING, num_blocks=None, async_scheduling=True)],
    ids=["speculative", "async"],
)
def test_the_moe_engine_matches_transformers_speculating_and_scheduling_ahead(moe_dir, settings):
    result = oracle.compare(moe_dir, REPEATING, 8, settings=settings)
    assert result.ok, result.message
    m = result.run.metrics
    assert m["eplb_rebalances"] > 0 and m["eplb_slots_moved"] > 0, m
    called = {label[:4] for label, n in result.run.calls.items() if n}
    if settings.speculative_tokens:  # every chapter in one run but ch23's sampler (greedy: the engine's argmax)
        assert m["draft_tokens"] > 0 and m["accepted_tokens"] > 0, m
        assert called == {f"ch{n}" for n in range(15, 33)} - {"ch23"}, sorted(called)
    for label in ("ch31.1 route_topk", "ch31.2 dispatch", "ch31.2 combine", "ch31.3 rebalance_experts", "ch31.4 record_expert_load"):
        assert result.run.calls[label] > 0, label
