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
    report = graded.mistake("reshape")  # a lookup done as a reshape: the first rows of E, whatever the ids say
    r = result(report, "figure instance", task="ch15.1")
    assert r.status == "failed"
    E = torch.tensor(checks.EMBED_TABLE, dtype=torch.float32)
    assert "table E [6, 4], ids [1, 3] = [[2, 0, 4]]" in r.message
    assert f"ids[0, 0] = 2, so its embedding is row 2 of E = {checks.vec(E[2])}; yours: {checks.vec(E[0])}" in r.message
    assert r.hints == ["reshape"]
    assert tasks_not_passed(report) == {"ch15.1"}
    assert wrong_elements(report, "ch15-dim-embedding")
    assert not wrong_elements(report, "ch15-dim-qkv-linear")


# -- 15.2 ---------------------------------------------------------------------------------------------


def test_reshape_instead_of_transpose(graded):
    report = graded.mistake("reshape_weight")  # W.reshape(in, out) taken for a transpose: scrambled weights
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
    report = graded.mistake("x_at_w")  # the math [in, out] habit: x @ W with a weight stored [out, in]
    square = result(report, "a square weight", task="ch15.2")
    assert square.status == "failed"
    assert "y[0, 0] = Σ_c x[0, c]·W[0, c] = 1·1 + 2·0 + 3·0 = 1; yours: 3" in square.message
    assert square.hints == ["x_at_w"]
    # With in ≠ out the product cannot even be formed: the student's own error is reported.
    fig = result(report, "figure instance", task="ch15.2")
    assert fig.status == "error" and "RuntimeError" in fig.message


def test_convention_named_in_the_error(graded):
    report = graded.mistake("vague_error")  # a ValueError that does not say which convention the weight breaks
    r = result(report, "a weight passed as [in, out]", task="ch15.2")
    assert r.status == "failed"
    assert "its message does not name the convention" in r.message
    assert r.hints == ["vague_error"]
    assert tasks_not_passed(report) == {"ch15.2"}


# -- 15.3 ---------------------------------------------------------------------------------------------


def test_k_and_v_swapped(graded):
    report = graded.mistake("block_swapped")  # the packing read as q | v | k
    r = result(report, "Qwen3-0.6B", task="ch15.3")
    assert r.status == "failed"
    assert "the packing is q | k | v = 2048 | 1024 | 1024 columns, so k is columns 2048–3071 of qkv" in r.message
    assert "yours holds columns 3072–4095" in r.message
    assert r.hints == ["block_swapped"]
    assert result(report, "MHA", task="ch15.3").status == "failed"
    assert tasks_not_passed(report) == {"ch15.3"}
    assert wrong_elements(report, "ch15-dim-qkv-linear")


def test_equal_thirds(graded):
    report = graded.mistake("thirds")  # qkv.chunk(3): three equal parts, as if K and V had as many heads as Q
    r = result(report, "Qwen3-0.6B", task="ch15.3")
    assert r.status == "failed"
    assert "q is num_heads·head_dim = 16·128 = 2048 wide, k and v num_kv_heads·head_dim = 8·128 = 1024 each" in r.message
    assert "yours: float32 tensor [2, 1366], float32 tensor [2, 1366], float32 tensor [2, 1364]" in r.message
    assert r.hints == ["thirds"]
    assert result(report, "MHA", task="ch15.3").status == "passed", "equal thirds are right for MHA"


# -- 15.4 ---------------------------------------------------------------------------------------------


def test_head_dim_derived_from_hidden(graded):
    report = graded.mistake("head_dim_derived")  # the Qwen3 trap: head_dim taken as hidden_size / num_attention_heads
    r = result(report, "figure instance", task="ch15.4")
    assert r.status == "failed"
    assert "qkv_proj is stored [(Hq + 2·Hkv)·d, H] = [(16 + 2·8)·128, 1024] = [4096, 1024]; yours: [2048, 1024]" in r.message
    assert r.hints == ["head_dim_derived"]
    assert result(report, "a synthetic config", task="ch15.4").status == "failed"
    assert result(report, "Llama-3-8B", task="ch15.4").status == "passed", "Llama's head_dim happens to be H / Hq"
    oracle = result(report, "agreement with transformers", task="ch15.4")
    assert oracle.status == "failed" and "transformers' Qwen3ForCausalLM built from it holds q_proj" in oracle.message
    assert tasks_not_passed(report) == {"ch15.4"}
    assert wrong_elements(report, "ch15-qwen3-widths")


# -- 15.5 ---------------------------------------------------------------------------------------------


def test_logits_for_every_token(graded):
    report = graded.mistake("all_logits")  # logits for all N tokens instead of the last token of each request
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
    report = graded.mistake("concat_partials")  # the all-reduce taken for an all-gather: partials concatenated
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
    report = graded.mistake("interleaved")  # rank r takes every tp-th output column instead of one contiguous block
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


# -- 15.7 ---------------------------------------------------------------------------------------------


def test_rows_of_ids_not_owned_left_unzeroed(graded):
    report = graded.mistake("unzeroed")  # the placeholder row 0 looked up and never zeroed
    r = result(report, "figure instance", task="ch15.7")
    assert r.status == "failed"
    assert "rank 0 holds rows [0, 3); ids [4, 1, 5, 0, 3, 2]" in r.message
    E = torch.tensor(checks.VP_TABLE, dtype=torch.float32)
    assert "ids[0] = 4 belongs to rank 1, so row 0 of rank 0's partial is zeros" in r.message
    assert f"yours: {checks.vec(E[0])}" in r.message
    assert r.hints == ["unzeroed"]
    assert result(report, "tp = 1", task="ch15.7").status == "passed", "one rank owns every id"
    assert tasks_not_passed(report) == {"ch15.7"}
    assert wrong_elements(report, "ch15-vocab-parallel")


def test_global_id_used_as_a_local_row(graded):
    report = graded.mistake("no_start")  # mask * ids: rank 1 indexes its 3-row shard with ids 3 … 5
    r = result(report, "figure instance", task="ch15.7")
    assert r.status == "failed" and "raised IndexError on rank 1" in r.message
    assert r.hints == ["no_start"]


def test_mask_with_an_inclusive_end(graded):
    report = graded.mistake("end_inclusive")  # ids ≤ start + V/tp: id 3 reaches past rank 0's last row
    r = result(report, "figure instance", task="ch15.7")
    assert r.status == "failed" and "raised IndexError on rank 0" in r.message
    assert "with only the ids it owns ([1, 0, 2]) it raises nothing" in r.message
    assert r.hints == ["end_inclusive"]


def test_the_partials_add_up_to_the_lookup():
    g = torch.Generator().manual_seed(1)
    E, ids = torch.randn(12, 5, generator=g), torch.tensor([11, 0, 3, 4, 7, 8, 3])
    for tp in (1, 2, 3, 4, 6):
        partials = [ref.vocab_parallel_embedding(s, ids, r, tp) for r, s in enumerate(E.split(12 // tp))]
        torch.testing.assert_close(checks.all_reduce(partials), F.embedding(ids, E), rtol=0, atol=0)
        assert all(
            int((p != 0).any(-1).sum()) == int(((ids >= r * 12 // tp) & (ids < (r + 1) * 12 // tp)).sum()) for r, p in enumerate(partials)
        ), "a rank's non-zero rows are the ids it owns"


# -- 15.8 ---------------------------------------------------------------------------------------------


def test_logits_gathered_in_reverse_rank_order(graded):
    report = graded.mistake("rank_order")  # the blocks concatenated last rank first
    r = result(report, "figure instance", task="ch15.8")
    assert r.status == "failed"
    assert (
        "logits[0, 0] is token 0's logit: rank 0's local column 0, for sequence 0's last token, row "
        "cu_seqlens_q[1] − 1 = 2 of hidden: expected 11; yours: 41" in r.message
    )
    assert r.hints == ["rank_order"]
    assert tasks_not_passed(report) == {"ch15.8"}
    assert wrong_elements(report, "ch15-vocab-parallel")


def test_logits_summed_over_ranks(graded):
    report = graded.mistake("summed_logits")  # the gather taken for an all-reduce
    r = result(report, "figure instance", task="ch15.8")
    assert r.status == "failed" and "expected logits [2, 6]" in r.message and "yours: float32 tensor [2, 3]" in r.message
    assert r.hints == ["summed_logits"]


def test_the_head_is_the_tied_linear_of_the_last_rows():
    g = torch.Generator().manual_seed(2)
    hidden, W = torch.randn(9, 4, generator=g), torch.randn(8, 4, generator=g)
    cu = torch.tensor([0, 2, 7, 9], dtype=torch.int32)  # nano-vllm's cu_seqlens_q is int32
    for tp in (1, 2, 4):
        torch.testing.assert_close(ref.parallel_lm_head(hidden, list(W.split(8 // tp)), cu), F.linear(hidden[[1, 6, 8]], W))
        torch.testing.assert_close(ref.parallel_lm_head(hidden, list(W.split(8 // tp))), F.linear(hidden, W))


# -- 15.9 ---------------------------------------------------------------------------------------------


def test_k_loaded_over_q(graded):
    report = graded.mistake("k_offset_zero")  # k written at offset 0, over the rank's q rows
    r = result(report, "figure instance", task="ch15.9")
    assert r.status == "failed"
    assert 'rank 0, "k": size = (2/2)·2 = 2, offset = (Hq/tp)·d = 4, start = rank·size = 0·2 = 0' in r.message
    assert "(offset, start, size): expected (4, 0, 2); yours: (0, 0, 2)" in r.message
    assert r.hints == ["k_offset_zero"]
    assert tasks_not_passed(report) == {"ch15.9"}
    assert wrong_elements(report, "ch15-qkv-shards")


def test_every_rank_loading_rank_0s_heads(graded):
    report = graded.mistake("shard_zero")
    r = result(report, "figure instance", task="ch15.9")
    assert r.status == "failed" and 'rank 1, "q"' in r.message
    assert r.hints == ["shard_zero"]
    assert result(report, "tp = 1", task="ch15.9").status == "passed", "one rank's chunk is the whole weight"


@pytest.mark.parametrize("heads, kv, tp", [(4, 2, 2), (16, 8, 4), (8, 8, 2), (32, 8, 8), (4, 2, 1)])
def test_loading_as_nanovllm_gives_each_rank_its_own_heads(heads, kv, tp):
    # nano-vllm's QKVParallelLinear.weight_loader copies loaded_weight.chunk(tp, 0)[rank] into the rank's rows at
    # 0, (Hq/tp)·d and (Hq/tp + Hkv/tp)·d (nanovllm/layers/linear.py, bb823b3); the rank's fused projection then
    # splits (split_qkv) into its own heads of the full q, k and v.
    d, H = 3, 5
    g = torch.Generator().manual_seed(heads + kv + tp)
    w = {s: torch.randn(n * d, H, generator=g) for s, n in (("q", heads), ("k", kv), ("v", kv))}
    x = torch.randn(2, H, generator=g)
    for rank in range(tp):
        param = torch.empty((heads + 2 * kv) // tp * d, H)
        for s in "qkv":
            offset, start, size = ref.qkv_shard(s, heads, kv, d, tp, rank)
            assert torch.equal(w[s][start : start + size], w[s].chunk(tp, 0)[rank])
            param[offset : offset + size] = w[s][start : start + size]
        q, k, v = ref.split_qkv(ref.linear(x, param), heads // tp, kv // tp, d)
        for part, s, n in ((q, "q", heads), (k, "k", kv), (v, "v", kv)):
            heads_here = slice(rank * n // tp * d, (rank + 1) * n // tp * d)
            torch.testing.assert_close(part, F.linear(x, w[s])[:, heads_here])


# -- the provided input checks (outside the solution regions: unit tests, no graded checks) ---------------------

z = torch.zeros


@pytest.mark.parametrize(
    "weight, ids",
    [
        (z(6, 4), torch.tensor([2, 6])),
        (z(6, 4), torch.tensor([[2, -1, 4]])),
        (z(6, 4), torch.tensor([2.0, 0.0])),
        (z(6, 4), torch.tensor([True, False])),
        (z(6), torch.tensor([1])),
    ],
)
def test_the_provided_lookup_check(weight, ids):
    with pytest.raises(ValueError):
        ref.embedding_lookup(weight, ids)


def test_the_provided_lookup_check_passes_good_ids():
    assert ref.embedding_lookup(z(6, 4), torch.tensor([[0, 5]], dtype=torch.int32)).shape == (1, 2, 4)
    assert ref.embedding_lookup(z(6, 4), torch.zeros(0, dtype=torch.int64)).shape == (0, 4)


@pytest.mark.parametrize("x, w, b", [(z(2, 5), z(3, 4), None), (z(2, 4), z(3, 4), z(4)), (z(2, 4), z(4), None), (z(()), z(3, 4), None)])
def test_the_provided_linear_check(x, w, b):
    with pytest.raises(ValueError):
        ref.linear(x, w, b)


def test_the_lesson_guard_of_linear_names_the_convention():
    with pytest.raises(ValueError, match=r"\[out, in\]"):
        ref.linear(z(2, 4), z(4, 8))
    assert ref.linear(z(2, 4), z(3, 4), z(3)).shape == (2, 3)


@pytest.mark.parametrize(
    "args", [(z(2, 4095), 16, 8, 128), (z(2, 3072), 16, 8, 128), (z(2, 0), 0, 0, 128), (z(2, 8), 2, 1, 2.0), (z(()), 2, 1, 2)]
)
def test_the_provided_split_check(args):
    with pytest.raises(ValueError):
        ref.split_qkv(*args)


@pytest.mark.parametrize(
    "change",
    [
        {"head_dim": None},
        {"vocab_size": None},
        {"num_key_value_heads": 6},
        {"head_dim": 0},
        {"hidden_size": 1024.0},
        {"tie_word_embeddings": 1},
    ],
)
def test_the_provided_config_check(change):
    config = {k: v for k, v in {**checks.QWEN3_06B, **change}.items() if v is not None}
    with pytest.raises(ValueError):
        ref.projection_shapes(config)


@pytest.mark.parametrize(
    "config, lens",
    [(checks.QWEN3_06B, []), (checks.QWEN3_06B, [3, 0]), (checks.QWEN3_06B, [-2]), (checks.QWEN3_06B, [2.0]), ({"hidden_size": 1024}, [3])],
)
def test_the_provided_checkpoint_check(config, lens):
    with pytest.raises(ValueError):
        ref.forward_checkpoints(dict(config), lens)


def test_the_provided_tp_checks():
    for args in ((z(2, 3), z(3, 6), 4), (z(2, 3), z(3, 4), 0), (z(2, 5), z(3, 4), 2), (z(2, 3), z(3, 4), 2.0)):
        with pytest.raises(ValueError):
            ref.column_parallel_linear(*args)
    for args in (([z(2, 2)] * 3, z(6, 3), 4), ([z(2, 2)] * 3, z(4, 3), 2), ([z(2, 3), z(2, 1)], z(4, 3), 2), ([z(2, 2)] * 2, z(4), 2)):
        with pytest.raises(ValueError):
            ref.row_parallel_linear(*args)
    assert ref.column_parallel_linear(z(2, 3), z(3, 4), 2)[1].shape == (2, 4)
    assert ref.row_parallel_linear([z(2, 2)] * 2, z(4, 3), 2)[1].shape == (2, 3)


@pytest.mark.parametrize(
    "shard, ids, rank, tp",
    [
        (z(3, 2), torch.tensor([6]), 0, 2),
        (z(3, 2), torch.tensor([-1]), 1, 2),
        (z(3, 2), torch.tensor([1.0]), 0, 2),
        (z(3, 2), torch.tensor([[1]]), 0, 2),
        (z(3, 2), torch.tensor([1]), 2, 2),
        (z(3, 2), torch.tensor([1]), 0, 0),
        (z(3), torch.tensor([1]), 0, 2),
    ],
)
def test_the_provided_vocab_shard_check(shard, ids, rank, tp):
    with pytest.raises(ValueError):
        ref.vocab_parallel_embedding(shard, ids, rank, tp)


def test_an_id_of_another_rank_is_no_error():
    assert ref.vocab_parallel_embedding(torch.ones(3, 2), torch.tensor([5, 0]), 0, 2).tolist() == [[0, 0], [1, 1]]


@pytest.mark.parametrize(
    "hidden, shards, cu",
    [
        (z(5), [z(3, 2)], None),
        (z(5, 2), [], None),
        (z(5, 2), [z(3, 2), z(2, 2)], None),
        (z(5, 2), [z(3, 4)], None),
        (z(5, 2), [z(3, 2)], torch.tensor([0, 3, 4])),
        (z(5, 2), [z(3, 2)], torch.tensor([1, 5])),
        (z(5, 2), [z(3, 2)], torch.tensor([0, 3, 3, 5])),
        (z(5, 2), [z(3, 2)], torch.tensor([0.0, 5.0])),
    ],
)
def test_the_provided_lm_head_check(hidden, shards, cu):
    with pytest.raises(ValueError):
        ref.parallel_lm_head(hidden, shards, cu)


@pytest.mark.parametrize(
    "args",
    [
        ("o", 4, 2, 2, 2, 0),
        ("q", 4, 2, 2, 4, 0),
        ("k", 4, 3, 2, 2, 0),
        ("v", 4, 2, 2, 2, 2),
        ("q", 4, 2, 0, 2, 0),
        ("q", 4, 2, 2, 2.0, 0),
        ("q", 4, 2, 2, 2, -1),
    ],
)
def test_the_provided_qkv_shard_check(args):
    with pytest.raises(ValueError):
        ref.qkv_shard(*args)


# -- equivalent answers pass ---------------------------------------------------------------------------


def test_equivalent_formulations_pass_every_check(graded):
    report = graded(
        "equivalent",
        # not a misconception: library calls and other arithmetic with the same answers
        ("return weight[ids.long()]", "return F.embedding(ids.long(), weight)"),
        ("import torch\n", "import torch\nimport torch.nn.functional as F\n"),
        ("y = x @ weight.T\n    return y if bias is None else y + bias", "return F.linear(x, weight, bias)"),
        (
            "q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)",
            "q, k, v = qkv[..., :q_size], qkv[..., q_size:q_size + kv_size], qkv[..., q_size + kv_size:]",
        ),
        ("    out = partials[0]\n    for p in partials[1:]:\n        out = out + p\n", "    out = torch.stack(partials).sum(dim=0)\n"),
        # torch.where for the masked shift, F.embedding for the lookup, masked_fill for the zeroing
        ("local = mask * (ids - start)", "local = torch.where(mask, ids - start, torch.zeros_like(ids))"),
        (
            "return weight_shard[local] * mask.unsqueeze(-1)",
            "return F.embedding(local.long(), weight_shard).masked_fill(~mask.unsqueeze(-1), 0)",
        ),
        # one matmul with the shards stacked back, and the last rows by index arithmetic
        ("hidden = hidden[cu_seqlens_q[1:] - 1]", "hidden = hidden.index_select(0, cu_seqlens_q[1:].long() - 1)"),
        (
            "local = [hidden @ w.T for w in weight_shards]\n    return torch.cat(local, dim=-1)",
            "return F.linear(hidden, torch.cat(weight_shards))",
        ),
        # the offsets as running sums of the sizes
        (
            'offset = {"q": 0, "k": q_rows, "v": q_rows + kv_rows}[shard_id]',
            'offset = [0, q_rows, q_rows + kv_rows]["qkv".index(shard_id)]',
        ),
    )
    failed = [f"{r.name}: {r.message}" for r in report.results if r.status != "passed"]
    assert not failed, failed


# -- the reference against the facts it is pinned to ---------------------------------------------------


def test_qwen3_06b_shapes_add_up_to_the_documented_parameter_count():
    # reference/nanovllm.md §0: 155,582,464 (tied embedding) + 28 × 15,730,944 + 1,024 = 596,049,920.
    shapes = ref.projection_shapes(checks.QWEN3_06B)
    numel = lambda s: torch.Size(s).numel()
    layer = sum(numel(shapes[n]) for n in ("qkv_proj", "o_proj", "q_norm", "k_norm", "gate_up_proj", "down_proj"))
    layer += 2 * checks.QWEN3_06B["hidden_size"]  # input and post-attention RMSNorm weights
    assert numel(shapes["embed_tokens"]) == 155_582_464 and layer == 15_730_944
    assert numel(shapes["embed_tokens"]) + 28 * layer + 1024 == 596_049_920


def test_tying_shows_in_storage_not_in_shape():
    transformers = pytest.importorskip("transformers")
    for tied in (True, False):
        cfg = dict(
            hidden_size=32,
            intermediate_size=48,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            vocab_size=97,
            tie_word_embeddings=tied,
        )
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
    """ "partial_shape": a rank's partial cut to its own block of outputs, as if row-parallel split them too."""
    x_shards, w = [torch.ones(2, 2), torch.ones(2, 2)], torch.ones(4, 3)
    with pytest.raises(checks.CheckFailed) as e:
        checks.row_structure(([torch.ones(2, 2), torch.ones(2, 1)], torch.ones(2, 3)), x_shards, w, 2, "made up")
    assert "rank 0's partial should have the full output shape [N, out] = [2, 3]" in str(e.value)
    assert e.value.hints == ["partial_shape"]
