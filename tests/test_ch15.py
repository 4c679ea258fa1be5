"""ch15 · token ids to logits: wrong submissions that embody real misconceptions get the teaching
message meant for them, their figures mark the wrong values, and the reference agrees with the
facts it is pinned to (nano-vllm's Qwen3-0.6B shapes, transformers' Qwen3ForCausalLM)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from mutate import figure_file, mutant_grader, result, tasks_not_passed, wrong_elements

from grader import chapters
from grader.checks import ch15 as checks
from solutions import ch15_token_to_logits as ref

SEED = 15


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return mutant_grader(tmp_path_factory, "ch15", SEED)


# -- 15.1 ---------------------------------------------------------------------------------------------

def test_lookup_as_a_reshape(graded):
    report = graded.mistake("reshape")   # a lookup done as a reshape: the first rows of E, whatever the ids say
    r = result(report, "figure instance", task="ch15.1")
    assert r.status == "failed"
    E = torch.tensor(checks.EMBED_TABLE, dtype=torch.float32)
    assert "table E [6, 4], ids [1, 3] = [[2, 0, 4]]" in r.message
    assert f"ids[0, 0] = 2, so its embedding is row 2 of E = {checks.vec(E[2])}; yours: {checks.vec(E[0])}" in r.message
    assert r.hints == ["reshape"]
    assert tasks_not_passed(report) == {"ch15.1"}
    assert wrong_elements(report, "ch15-dim-embedding")
    assert not wrong_elements(report, "ch15-dim-qkv-linear")


def test_negative_ids_not_rejected(graded):
    report = graded("no_range_check",
                    # no range check: Python indexing wraps −1 to the last row, and an id ≥ V raises IndexError
                    ("        if lo < 0 or hi >= V:\n", "        if False:\n"))
    assert result(report, "figure instance", task="ch15.1").status == "passed"
    neg = result(report, "a negative id", task="ch15.1")
    assert neg.status == "failed"
    assert "embedding_lookup should raise ValueError because id −1 is no token" in neg.message
    assert "yours returned float32 tensor [1, 3, 4]" in neg.message
    high = result(report, "an id ≥ vocab_size", task="ch15.1")
    assert high.status == "failed" and "yours raised IndexError" in high.message
    assert not wrong_elements(report, "ch15-dim-embedding")


# -- 15.2 ---------------------------------------------------------------------------------------------

def test_reshape_instead_of_transpose(graded):
    report = graded.mistake("reshape_weight")   # W.reshape(in, out) taken for a transpose: scrambled weights
    r = result(report, "figure instance", task="ch15.2")
    assert r.status == "failed"
    x, w = torch.tensor(checks.QKV_X, dtype=torch.float32), torch.tensor(checks.QKV_W, dtype=torch.float32)
    want, bad = x @ w.T, x @ w.reshape(4, 8)
    i, j = checks.first_wrong(bad, want)
    assert "x [3, 4], weight stored [out, in] = [8, 4]" in r.message
    assert f"y[{i}, {j}] = Σ_c x[{i}, c]·W[{j}, c] = " in r.message
    assert f"= {checks.fmt(want[i, j])}; yours: {checks.fmt(bad[i, j])}" in r.message
    assert r.hints == ["reshape_weight"]
    assert tasks_not_passed(report) == {"ch15.2"}
    assert wrong_elements(report, "ch15-dim-qkv-linear")


def test_math_convention_x_at_w(graded):
    report = graded.mistake("x_at_w")   # the math [in, out] habit: x @ W with a weight stored [out, in]
    square = result(report, "a square weight", task="ch15.2")
    assert square.status == "failed"
    assert "y[0, 0] = Σ_c x[0, c]·W[0, c] = 1·1 + 2·0 + 3·0 = 1; yours: 3" in square.message
    assert square.hints == ["x_at_w"]
    # With in ≠ out the product cannot even be formed: the student's own error is reported.
    fig = result(report, "figure instance", task="ch15.2")
    assert fig.status == "error" and "RuntimeError" in fig.message


def test_convention_named_in_the_error(graded):
    report = graded.mistake("vague_error")   # a ValueError that does not say which convention the weight breaks
    r = result(report, "a weight passed as [in, out]", task="ch15.2")
    assert r.status == "failed"
    assert "its message does not name the convention" in r.message
    assert r.hints == ["vague_error"]
    assert tasks_not_passed(report) == {"ch15.2"}


# -- 15.3 ---------------------------------------------------------------------------------------------

def test_k_and_v_swapped(graded):
    report = graded.mistake("block_swapped")   # the packing read as q | v | k
    r = result(report, "Qwen3-0.6B", task="ch15.3")
    assert r.status == "failed"
    assert "the packing is q | k | v = 2048 | 1024 | 1024 columns, so k is columns 2048–3071 of qkv" in r.message
    assert "yours holds columns 3072–4095" in r.message
    assert r.hints == ["block_swapped"]
    assert result(report, "MHA", task="ch15.3").status == "failed"
    assert tasks_not_passed(report) == {"ch15.3"}
    assert wrong_elements(report, "ch15-dim-qkv-linear")


def test_equal_thirds(graded):
    report = graded.mistake("thirds")   # qkv.chunk(3): three equal parts, as if K and V had as many heads as Q
    r = result(report, "Qwen3-0.6B", task="ch15.3")
    assert r.status == "failed"
    assert "q is num_heads·head_dim = 16·128 = 2048 wide, k and v num_kv_heads·head_dim = 8·128 = 1024 each" in r.message
    assert "yours: float32 tensor [2, 1366], float32 tensor [2, 1366], float32 tensor [2, 1364]" in r.message
    assert r.hints == ["thirds"]
    assert result(report, "MHA", task="ch15.3").status == "passed", "equal thirds are right for MHA"


# -- 15.4 ---------------------------------------------------------------------------------------------

def test_head_dim_derived_from_hidden(graded):
    report = graded.mistake("head_dim_derived")   # the Qwen3 trap: head_dim taken as hidden_size / num_attention_heads
    r = result(report, "figure instance", task="ch15.4")
    assert r.status == "failed"
    assert "qkv_proj is stored [(Hq + 2·Hkv)·d, H] = [(16 + 2·8)·128, 1024] = [4096, 1024]; yours: [2048, 1024]" \
        in r.message
    assert r.hints == ["head_dim_derived"]
    assert result(report, "a synthetic config", task="ch15.4").status == "failed"
    assert result(report, "Llama-3-8B", task="ch15.4").status == "passed", "Llama's head_dim happens to be H / Hq"
    oracle = result(report, "agreement with transformers", task="ch15.4")
    assert oracle.status == "failed" and "transformers' Qwen3ForCausalLM built from it holds q_proj" in oracle.message
    assert tasks_not_passed(report) == {"ch15.4"}
    assert wrong_elements(report, "ch15-qwen3-widths")


# -- 15.5 ---------------------------------------------------------------------------------------------

def test_logits_for_every_token(graded):
    report = graded.mistake("all_logits")   # logits for all N tokens instead of the last token of each request
    r = result(report, "figure instance", task="ch15.5")
    assert r.status == "failed"
    assert "N = 3 + 2 = 5 tokens flattened, B = 2 requests" in r.message
    assert "logits is [B, V] = [2, 151936]; yours: [5, 151936]" in r.message
    assert r.hints == ["all_logits"]
    # A request of one token each cannot tell the two apart.
    assert result(report, "every request one token long", task="ch15.5").status == "passed"
    assert tasks_not_passed(report) == {"ch15.5"}
    assert wrong_elements(report, "ch15-checkpoints")


# -- 15.6 ---------------------------------------------------------------------------------------------

def test_row_partials_concatenated(graded):
    report = graded.mistake("concat_partials")   # the all-reduce taken for an all-gather: partials concatenated
    r = result(report, "figure instance: row-parallel", task="ch15.6")
    assert r.status == "failed"
    assert "out should be [N, out] = [2, 3]; yours: float32 tensor [2, 6]" in r.message
    assert r.hints == ["concat_partials"]
    assert result(report, "figure instance: column-parallel", task="ch15.6").status == "passed"
    assert result(report, "column-parallel over 4 ranks", task="ch15.6").status == "passed"
    assert tasks_not_passed(report) == {"ch15.6"}
    assert wrong_elements(report, "ch15-dim-tensor-parallel")
    svg = figure_file(report, "ch15-dim-tensor-parallel").read_text()
    assert "yours [2, 6]; expected [2, 3]" in svg


def test_interleaved_column_shards(graded):
    report = graded.mistake("interleaved")   # rank r takes every tp-th output column instead of one contiguous block
    r = result(report, "figure instance: column-parallel", task="ch15.6")
    assert r.status == "failed"
    assert "rank 0 owns the output columns [0·2, 1·2) = [0, 2) of W" in r.message
    assert r.hints == ["interleaved"]
    assert wrong_elements(report, "ch15-dim-tensor-parallel")


def test_two_functions_share_task_15_6(graded):
    ch = chapters.find("ch15")
    task = ch.task("ch15.6")
    assert task.names == ("column_parallel_linear", "row_parallel_linear")
    assert ch.task("row_parallel_linear") is task
    report = graded.mistake("interleaved")
    labels = {r.function for r in report.results if r.task == "ch15.6"}
    assert labels == {"column_parallel_linear, row_parallel_linear"}


# -- equivalent answers pass ---------------------------------------------------------------------------

def test_equivalent_formulations_pass_every_check(graded):
    report = graded("equivalent",
                    # not a misconception: library calls and other arithmetic with the same answers
                    ("return weight[ids.long()]", "return F.embedding(ids.long(), weight)"),
                    ("import torch\n", "import torch\nimport torch.nn.functional as F\n"),
                    ("y = x @ weight.T\n    return y if bias is None else y + bias", "return F.linear(x, weight, bias)"),
                    ("q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)",
                     "q, k, v = qkv[..., :q_size], qkv[..., q_size:q_size + kv_size], qkv[..., q_size + kv_size:]"),
                    ("    out = partials[0]\n    for p in partials[1:]:\n        out = out + p\n",
                     "    out = torch.stack(partials).sum(dim=0)\n"))
    failed = [f"{r.name}: {r.message}" for r in report.results if r.status != "passed"]
    assert not failed, failed


# -- the reference against the facts it is pinned to ---------------------------------------------------

def test_qwen3_06b_shapes_add_up_to_the_documented_parameter_count():
    # reference/nanovllm.md §0: 155,582,464 (tied embedding) + 28 × 15,730,944 + 1,024 = 596,049,920.
    shapes = ref.projection_shapes(checks.QWEN3_06B)
    numel = lambda s: torch.Size(s).numel()
    layer = sum(numel(shapes[n]) for n in ("qkv_proj", "o_proj", "q_norm", "k_norm", "gate_up_proj", "down_proj"))
    layer += 2 * checks.QWEN3_06B["hidden_size"]            # input and post-attention RMSNorm weights
    assert numel(shapes["embed_tokens"]) == 155_582_464 and layer == 15_730_944
    assert numel(shapes["embed_tokens"]) + 28 * layer + 1024 == 596_049_920


def test_tying_shows_in_storage_not_in_shape():
    transformers = pytest.importorskip("transformers")
    for tied in (True, False):
        cfg = dict(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                   vocab_size=97, tie_word_embeddings=tied)
        with torch.device("meta"):
            model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**cfg, num_hidden_layers=1))
        assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
        assert ref.projection_shapes(cfg)["lm_head"] == tuple(model.lm_head.weight.shape)
        attn = model.model.layers[0].self_attn
        assert attn.q_proj.weight.shape[0] == 4 * 16 != cfg["hidden_size"], "head_dim is not hidden / heads here"


def test_split_matches_the_fused_projection():
    # Splitting x @ [Wq; Wk; Wv].T gives the three separate projections (nano-vllm's QKVParallelLinear at tp = 1).
    g = torch.Generator().manual_seed(0)
    wq, wk, wv = torch.randn(8, 6, generator=g), torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)
    x = torch.randn(5, 6, generator=g)
    q, k, v = ref.split_qkv(ref.linear(x, torch.cat([wq, wk, wv])), 4, 2, 2)
    for part, w in ((q, wq), (k, wk), (v, wv)):
        torch.testing.assert_close(part, F.linear(x, w))


def test_column_then_row_matches_nanovllm_example():
    # reference/nanovllm.md §2, RowParallelLinear example in nano-vllm's [out, in] storage:
    # W = [[1, 2, 3, 4], [5, 6, 7, 8]], x = [1, 1, 1, 1], tp = 2 → partials [3, 11], [7, 15], sum [10, 26].
    w_out_in = torch.tensor([[1.0, 2, 3, 4], [5, 6, 7, 8]])
    x = torch.ones(1, 4)
    partials, out = ref.row_parallel_linear(list(x.split(2, dim=1)), w_out_in.T, 2)
    assert [p.tolist() for p in partials] == [[[3.0, 11.0]], [[7.0, 15.0]]]
    assert out.tolist() == [[10.0, 26.0]]


def test_shape_hints():
    c = checks.QWEN3_06B
    assert checks.shapes_hint("o_proj", (2048, 1024), (1024, 2048), c).id == "out_in_swapped"
    assert checks.shapes_hint("qkv_proj", (6144, 1024), (4096, 1024), c).id == "kv_full_heads"
    assert checks.shapes_hint("gate_up_proj", (3072, 1024), (6144, 1024), c).id == "gate_only"
    trap = ref.projection_shapes(dict(c, head_dim=64))
    assert checks.shapes_hint("q_norm", (64,), (128,), c, trap).id == "head_dim_derived"


def test_a_partial_of_the_wrong_shape_is_explained():
    """"partial_shape": a rank's partial cut to its own block of outputs, as if row-parallel split them too."""
    x_shards, w = [torch.ones(2, 2), torch.ones(2, 2)], torch.ones(4, 3)
    with pytest.raises(checks.CheckFailed) as e:
        checks.row_structure(([torch.ones(2, 2), torch.ones(2, 1)], torch.ones(2, 3)), x_shards, w, 2, "made up")
    assert "rank 0's partial should have the full output shape [N, out] = [2, 3]" in str(e.value)
    assert e.value.hints == ["partial_shape"]
