"""Hidden checks of ch15 · token ids to logits: random instances from the grading seed, real model
configs, agreement with torch's F.linear and with transformers' Qwen3ForCausalLM, bad inputs."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from grader.authoring import CheckFailed, Trial, first_named, first_wrong, hidden, vec, wrong_mask
from grader.checks.ch15 import (
    NAMES,
    QWEN3_06B,
    coded_qkv,
    column_structure,
    expect_linear,
    expect_value_error_naming,
    explain_column,
    explain_row,
    explain_shards,
    row_structure,
    run_checkpoints_case,
    run_column_case,
    run_head_case,
    run_lookup_case,
    run_row_case,
    run_shapes_case,
    run_shard_case,
    run_split_case,
    run_vocab_case,
    shapes_hint,
    shapes_structure,
    shard_structure,
    trap_shapes,
)
from grader.i18n import mark, tr

# Public config.json values (Hugging Face model cards); Llama-3-8B's head_dim is implied (4096 / 32).
REAL_CONFIGS = {
    "Qwen3-1.7B": dict(
        hidden_size=2048,
        intermediate_size=6144,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "Qwen3-4B": dict(
        hidden_size=2560,
        intermediate_size=9728,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "Qwen3-8B": dict(
        hidden_size=4096,
        intermediate_size=12288,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        tie_word_embeddings=False,
    ),
    "Qwen3-32B": dict(
        hidden_size=5120,
        intermediate_size=25600,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        tie_word_embeddings=False,
    ),
    "Llama-3-8B": dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=128256,
        tie_word_embeddings=False,
    ),
}

# Qwen3-0.6B's config.json as a dict, with the keys projection_shapes must ignore.
QWEN3_06B_FULL = dict(
    QWEN3_06B,
    architectures=["Qwen3ForCausalLM"],
    model_type="qwen3",
    num_hidden_layers=28,
    rope_theta=1000000,
    rope_scaling=None,
    rms_norm_eps=1e-06,
    max_position_embeddings=40960,
    torch_dtype="bfloat16",
    attention_bias=False,
    hidden_act="silu",
    bos_token_id=151643,
    eos_token_id=151645,
    sliding_window=None,
    use_sliding_window=False,
)


# -- ch15.1 -------------------------------------------------------------------------------------------


@hidden("ch15.1", "random tables and ids of any shape (0-d to 3-d, int64 and int32)")
def embed_random(t: Trial) -> None:
    def case(i: int) -> None:
        V, H = t.random.randint(1, 40), t.random.randint(1, 12)
        dtype = [torch.float32, torch.bfloat16, torch.float64][i % 3]
        shape = [[], [t.random.randint(1, 9)], [2, t.random.randint(1, 5)], [2, 3, t.random.randint(1, 4)]][i % 4]
        ids = torch.randint(0, V, shape, generator=t.rng, dtype=torch.int32 if i % 2 else torch.int64)
        run_lookup_case(t, torch.randn(V, H, generator=t.rng).to(dtype), ids, f"V={V}, H={H}, ids {shape}")

    first_named(functools.partial(case, i) for i in range(12))  # one id cannot tell a reshape of E from a wrong row


@hidden("ch15.1", "the first and last rows, and no ids at all")
def embed_edges(t: Trial) -> None:
    weight = torch.randn(7, 3, generator=t.rng)
    run_lookup_case(t, weight, torch.tensor([[6, 0], [0, 6]]), mark("ids 0 and V − 1"))
    run_lookup_case(t, weight, torch.zeros(0, dtype=torch.int64), mark("no ids"))


@hidden("ch15.1", "a vocabulary of 151,936 rows (Qwen3's), narrow rows")
def embed_qwen_vocab(t: Trial) -> None:
    weight = torch.randn(151936, 4, generator=t.rng)
    ids = torch.cat([torch.tensor([151935, 0]), torch.randint(0, 151936, (30,), generator=t.rng)])
    run_lookup_case(t, weight, ids, "V = 151936")


# -- ch15.2 -------------------------------------------------------------------------------------------


@hidden("ch15.2", "random shapes, with and without bias: agreement with torch.nn.functional.linear")
def linear_random(t: Trial) -> None:
    for i in range(10):
        in_f, out_f = t.random.randint(1, 24), t.random.randint(1, 24)
        lead = [[], [t.random.randint(1, 6)], [2, t.random.randint(1, 5)], [2, 1, 3]][i % 4]
        dtype = torch.float64 if i % 3 == 0 else torch.float32
        x = torch.randn(*lead, in_f, generator=t.rng, dtype=dtype)
        weight = torch.randn(out_f, in_f, generator=t.rng, dtype=dtype)
        bias = torch.randn(out_f, generator=t.rng, dtype=dtype) if i % 2 else None
        got = t.yours.linear(x, weight, bias)
        expect_linear(got, F.linear(x, weight, bias), x, weight, bias, f"x {list(x.shape)}, W [{out_f}, {in_f}]")


@hidden("ch15.2", "square weights of random values: x @ W.T, never x @ W")
def linear_square_random(t: Trial) -> None:
    for n in (2, 5, 16):
        x, weight = torch.randn(3, n, generator=t.rng), torch.randn(n, n, generator=t.rng)
        got = t.yours.linear(x, weight)
        expect_linear(got, F.linear(x, weight), x, weight, None, tr("square W [{n}, {n}]", n=n))


@hidden("ch15.2", "Qwen3-0.6B's o_proj: [1024, 2048] applied to 3 tokens")
def linear_o_proj(t: Trial) -> None:
    x, weight = torch.randn(3, 2048, generator=t.rng), torch.randn(1024, 2048, generator=t.rng) * 0.02
    got = t.yours.linear(x, weight)
    expect_linear(got, F.linear(x, weight), x, weight, None, "o_proj [1024, 2048]")


@hidden("ch15.2", "random weights passed as [in, out] raise ValueError naming the convention")
def linear_bad(t: Trial) -> None:
    for lead in ([2], [3, 1]):
        in_f, out_f = t.random.randint(2, 9), t.random.randint(10, 20)
        expect_value_error_naming(
            t,
            t.yours.linear,
            torch.zeros(*lead, in_f),
            torch.zeros(in_f, out_f),
            because=tr("the weight [{in_f}, {out_f}] is [in, out] for x with {in_f} features", in_f=in_f, out_f=out_f),
            words="[out, in]",
        )


# -- ch15.3 -------------------------------------------------------------------------------------------


@hidden("ch15.3", "random head counts, head_dim and leading axes")
def split_random(t: Trial) -> None:
    for _ in range(10):
        kv = t.random.choice([1, 2, 3, 4])
        heads, d = kv * t.random.choice([1, 2, 4]), t.random.choice([1, 2, 8, 16])
        lead = t.random.choice([[], [1], [5], [2, 3]])
        run_split_case(
            t,
            coded_qkv(lead, (heads + 2 * kv) * d),
            heads,
            kv,
            d,
            tr("{heads} heads over {kv}, head_dim {d}, qkv {shape}", heads=heads, kv=kv, d=d, shape=lead + [(heads + 2 * kv) * d]),
        )


@hidden("ch15.3", "real models and tensor-parallel ranks: Qwen3-4B, Qwen3-32B, Llama-3-8B, MQA")
def split_real(t: Trial) -> None:
    for name, heads, kv, d in (
        ("Qwen3-4B", 32, 8, 128),
        ("Qwen3-32B", 64, 8, 128),
        ("Llama-3-8B", 32, 8, 128),
        (mark("Qwen3-0.6B, one of 2 ranks"), 8, 4, 128),
        (mark("an MQA model"), 8, 1, 64),
    ):
        run_split_case(t, coded_qkv([3], (heads + 2 * kv) * d), heads, kv, d, name)


@hidden("ch15.3", "bfloat16 qkv keeps its dtype and values")
def split_bf16(t: Trial) -> None:
    qkv = torch.randn(4, (4 + 2 * 2) * 16, generator=t.rng).to(torch.bfloat16)
    run_split_case(t, qkv, 4, 2, 16, "bfloat16 qkv")


# -- ch15.4 -------------------------------------------------------------------------------------------


@hidden("ch15.4", "real configs: Qwen3-1.7B, 4B, 8B, 32B and Llama-3-8B sizes")
def shapes_real(t: Trial) -> None:
    for name, config in REAL_CONFIGS.items():
        run_shapes_case(t, config, name)


@hidden("ch15.4", "random synthetic configs where hidden_size ≠ heads·head_dim")
def shapes_random(t: Trial) -> None:
    for _ in range(12):
        config = random_config(t)
        run_shapes_case(t, config, tr("synthetic {config}", config=config))


@hidden("ch15.4", "a whole config.json dict: extra keys are ignored")
def shapes_full_config(t: Trial) -> None:
    run_shapes_case(t, QWEN3_06B_FULL, "Qwen3-0.6B config.json")


@hidden("ch15.4", "agreement with transformers' Qwen3ForCausalLM built from the config (offline, tiny)")
def shapes_transformers(t: Trial) -> None:
    transformers = t.require("transformers")
    transformers.logging.set_verbosity_error()
    configs = [
        dict(
            hidden_size=32,
            intermediate_size=48,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            vocab_size=97,
            tie_word_embeddings=True,
        ),
        dict(
            hidden_size=24,
            intermediate_size=40,
            num_attention_heads=6,
            num_key_value_heads=3,
            head_dim=8,
            vocab_size=50,
            tie_word_embeddings=False,
        ),
        random_config(t),
    ]
    for config in configs:
        hf = transformers.Qwen3Config(**config, num_hidden_layers=1, attn_implementation="eager")
        with torch.device("meta"):
            model = transformers.Qwen3ForCausalLM(hf)
        attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
        q, k, v = (tuple(m.weight.shape) for m in (attn.q_proj, attn.k_proj, attn.v_proj))
        gate, up = tuple(mlp.gate_proj.weight.shape), tuple(mlp.up_proj.weight.shape)
        oracle = {
            "embed_tokens": tuple(model.model.embed_tokens.weight.shape),
            "qkv_proj": (q[0] + k[0] + v[0], q[1]),
            "o_proj": tuple(attn.o_proj.weight.shape),
            "q_norm": tuple(attn.q_norm.weight.shape),
            "k_norm": tuple(attn.k_norm.weight.shape),
            "gate_up_proj": (gate[0] + up[0], gate[1]),
            "down_proj": tuple(mlp.down_proj.weight.shape),
            "lm_head": tuple(model.lm_head.weight.shape),
        }
        got = shapes_structure(t.yours.projection_shapes(dict(config)), oracle, mark("transformers oracle"))
        for name in NAMES:
            if got[name] != oracle[name]:
                raise CheckFailed(
                    tr("config {config}", config=config),
                    tr(
                        "transformers' Qwen3ForCausalLM built from it holds q_proj {q}, k_proj {k}, v_proj {v}, "
                        "gate_proj {gate}, up_proj {up}",
                        q=list(q),
                        k=list(k),
                        v=list(v),
                        gate=list(gate),
                        up=list(up),
                    ),
                    tr(
                        "packed as nano-vllm packs them, {name} is {want}; yours: {yours}",
                        name=name,
                        want=list(oracle[name]),
                        yours=list(got[name]),
                    ),
                    hint=shapes_hint(name, got[name], oracle[name], config, trap_shapes(t, config))
                    or (
                        tr("qkv_proj stacks q_proj, k_proj, v_proj along the output rows; gate_up_proj stacks gate_proj and up_proj")
                        if name in ("qkv_proj", "gate_up_proj")
                        else ""
                    ),
                )


# -- ch15.5 -------------------------------------------------------------------------------------------


@hidden("ch15.5", "random batches and configs")
def checkpoints_random(t: Trial) -> None:
    for _ in range(10):
        config = dict(hidden_size=t.random.choice([8, 64, 1024, 5120]), vocab_size=t.random.randint(2, 200000))
        lens = [t.random.randint(1, 600) for _ in range(t.random.randint(1, 6))]
        run_checkpoints_case(t, config, lens, f"prompt_lens={lens}")


@hidden("ch15.5", "real configs with long and short prompts together")
def checkpoints_real(t: Trial) -> None:
    for name, config in REAL_CONFIGS.items():
        run_checkpoints_case(t, config, [4096, 1, 300], name)


@hidden("ch15.5", "every request one token long (N = B)")
def checkpoints_one_token_each(t: Trial) -> None:
    run_checkpoints_case(t, QWEN3_06B, [1] * 8, mark("eight one-token requests"))


# -- ch15.6 -------------------------------------------------------------------------------------------


@hidden("ch15.6", "random column-parallel shapes, tp ∈ {1, 2, 4, 8}")
def column_random(t: Trial) -> None:
    for _ in range(8):
        tp = t.random.choice([1, 2, 4, 8])
        n, in_f, out_f = t.random.randint(1, 6), t.random.randint(1, 12), tp * t.random.randint(1, 5)
        run_column_case(
            t,
            torch.randn(n, in_f, generator=t.rng),
            torch.randn(in_f, out_f, generator=t.rng),
            tp,
            f"x [{n}, {in_f}], W [{in_f}, {out_f}], tp={tp}",
        )


@hidden("ch15.6", "random row-parallel shapes, tp ∈ {1, 2, 4, 8}")
def row_random(t: Trial) -> None:
    for _ in range(8):
        tp = t.random.choice([1, 2, 4, 8])
        n, in_f, out_f = t.random.randint(1, 6), tp * t.random.randint(1, 5), t.random.randint(1, 12)
        x = torch.randn(n, in_f, generator=t.rng)
        run_row_case(
            t,
            list(x.split(in_f // tp, dim=1)),
            torch.randn(in_f, out_f, generator=t.rng),
            tp,
            f"x [{n}, {in_f}], W [{in_f}, {out_f}], tp={tp}",
        )


@hidden("ch15.6", "column then row: one all-reduce gives the unsharded product x·W1·W2")
def column_then_row(t: Trial) -> None:
    for tp in (2, 4):
        x, w1, w2 = (torch.randn(s, generator=t.rng) for s in ((3, 6), (6, 8), (8, 5)))
        case = tr("MLP-shaped pair, tp={tp}", tp=tp)
        shards, col_out = column_structure(t.yours.column_parallel_linear(x, w1, tp), x, w1, tp, case)
        explain_column(shards, col_out, x, w1, tp, case, t.ref)
        partials, out = row_structure(t.yours.row_parallel_linear(shards, w2, tp), shards, w2, tp, case)
        explain_row(partials, out, shards, w2, tp, case, t.ref)
        want = x @ w1 @ w2
        if first_wrong(out, want, atol=1e-4, rtol=1e-4) is not None:
            raise CheckFailed(
                tr(
                    'case "{case}": the pair must equal the unsharded x @ W1 @ W2; row 0 is {want}, yours {yours}',
                    case=case,
                    want=vec(want[0]),
                    yours=vec(out[0]),
                )
            )


@hidden("ch15.6", "Qwen3-0.6B's o_proj at tp = 2: each rank's 8 heads · 128 = 1024 inputs")
def row_o_proj(t: Trial) -> None:
    x, w = torch.randn(2, 2048, generator=t.rng), torch.randn(2048, 1024, generator=t.rng) * 0.02
    run_row_case(t, list(x.split(1024, dim=1)), w, 2, "o_proj [in 2048, out 1024], tp=2")


# -- helpers -------------------------------------------------------------------------------------------


def random_config(t: Trial) -> dict:
    """A small GQA config whose heads·head_dim is (almost always) not hidden_size."""
    kv = t.random.choice([1, 2, 4])
    heads = kv * t.random.choice([1, 2, 3, 4])
    return dict(
        hidden_size=t.random.choice([8, 24, 40, 96]),
        intermediate_size=t.random.choice([16, 56, 200]),
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=t.random.choice([4, 16, 32, 80]),
        vocab_size=t.random.randint(10, 5000),
        tie_word_embeddings=t.random.random() < 0.5,
    )


# -- ch15.7 -------------------------------------------------------------------------------------------


@hidden("ch15.7", "random tables, tp ∈ {1, 2, 3, 4, 8}, int32 and int64 ids, float32/bfloat16/float64")
def vocab_random(t: Trial) -> None:
    for i in range(8):
        tp = t.random.choice([1, 2, 3, 4, 8])
        per, H, N = t.random.randint(1, 6), t.random.randint(1, 5), t.random.randint(1, 12)
        dtype = [torch.float32, torch.bfloat16, torch.float64][i % 3]
        ids = torch.randint(0, tp * per, (N,), generator=t.rng, dtype=torch.int32 if i % 2 else torch.int64)
        run_vocab_case(t, torch.randn(tp * per, H, generator=t.rng).to(dtype), ids, tp, f"V = {tp * per}, H = {H}, tp = {tp}, {N} ids")


@hidden("ch15.7", "every id on one rank (the others all zeros), the shards' edges, and no ids at all")
def vocab_edges(t: Trial) -> None:
    table = torch.randn(12, 3, generator=t.rng)
    run_vocab_case(t, table, torch.tensor([9, 11, 10, 9]), 3, mark("every id on the last rank"))
    run_vocab_case(t, table, torch.tensor([0, 3, 4, 7, 8, 11]), 3, mark("first and last row of every shard"))
    run_vocab_case(t, table, torch.zeros(0, dtype=torch.int64), 2, mark("no ids"))


@hidden("ch15.7", "Qwen3's vocabulary of 151,936 rows at tp = 2, 4 and 8 (narrow rows)")
def vocab_qwen(t: Trial) -> None:
    table = torch.randn(151936, 2, generator=t.rng)
    ids = torch.cat([torch.tensor([0, 151935, 75967, 75968, 37983, 37984]), torch.randint(0, 151936, (20,), generator=t.rng)])
    for tp in (2, 4, 8):
        run_vocab_case(t, table, ids, tp, f"V = 151936, tp = {tp}")


# -- ch15.8 -------------------------------------------------------------------------------------------


@hidden("ch15.8", "random prefill and decode steps, tp ∈ {1, 2, 4, 8}")
def head_random(t: Trial) -> None:
    for i in range(8):
        tp, per, H = t.random.choice([1, 2, 4, 8]), t.random.randint(1, 5), t.random.randint(1, 6)
        lens = [t.random.randint(1, 5) for _ in range(t.random.randint(1, 4))]
        prefill = i % 2 == 0
        N = sum(lens) if prefill else len(lens)
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32) if prefill else None
        dtype = torch.float64 if i % 3 == 0 else torch.float32
        run_head_case(
            t,
            torch.randn(N, H, generator=t.rng, dtype=dtype),
            torch.randn(tp * per, H, generator=t.rng, dtype=dtype),
            tp,
            cu,
            f"{'prefill' if prefill else 'decode'}, lens {lens}, V = {tp * per}, tp = {tp}",
        )


@hidden("ch15.8", "one-token prompts (N = B), and one long prompt")
def head_edges(t: Trial) -> None:
    weight = torch.randn(8, 4, generator=t.rng)
    run_head_case(t, torch.randn(3, 4, generator=t.rng), weight, 2, torch.tensor([0, 1, 2, 3]), mark("three 1-token prompts"))
    run_head_case(t, torch.randn(9, 4, generator=t.rng), weight, 4, torch.tensor([0, 9]), mark("one prompt of 9 tokens"))


@hidden("ch15.8", "Qwen3's vocabulary of 151,936 at tp = 4, narrow rows")
def head_qwen(t: Trial) -> None:
    run_head_case(
        t,
        torch.randn(6, 4, generator=t.rng),
        torch.randn(151936, 4, generator=t.rng) * 0.1,
        4,
        torch.tensor([0, 2, 6], dtype=torch.int32),
        "V = 151936, tp = 4",
    )


# -- ch15.9 -------------------------------------------------------------------------------------------


@hidden("ch15.9", "random GQA, MHA and MQA-like head counts, tp dividing both")
def shard_random(t: Trial) -> None:
    for _ in range(8):
        tp = t.random.choice([1, 2, 4, 8])
        kv = tp * t.random.choice([1, 2])
        heads, d = kv * t.random.choice([1, 2, 4]), t.random.choice([1, 4, 64, 128])
        run_shard_case(t, heads, kv, d, tp, tr("{heads} heads over {kv}, head_dim {d}, tp = {tp}", heads=heads, kv=kv, d=d, tp=tp))


@hidden("ch15.9", "real models: Qwen3-0.6B at tp = 8, Qwen3-32B at tp = 8, Llama-3-8B at tp = 4")
def shard_real(t: Trial) -> None:
    for name, heads, kv, tp in (("Qwen3-0.6B", 16, 8, 8), ("Qwen3-32B", 64, 8, 8), ("Llama-3-8B", 32, 8, 4)):
        run_shard_case(t, heads, kv, 128, tp, f"{name}, tp = {tp}")


@hidden("ch15.9", "loading real tensors: every rank's fused weight is its own heads of q_proj, k_proj, v_proj")
def shard_load(t: Trial) -> None:
    heads, kv, d, H, tp = 8, 2, 4, 5, 2
    loaded = {s: torch.randn(n * d, H, generator=t.rng) for s, n in (("q", heads), ("k", kv), ("v", kv))}
    triples = {
        (rank, s): shard_structure(t.yours.qkv_shard(s, heads, kv, d, tp, rank), s, rank, mark("loading"))
        for rank in range(tp)
        for s in "qkv"
    }
    wants = {(rank, s): t.ref.qkv_shard(s, heads, kv, d, tp, rank) for rank in range(tp) for s in "qkv"}

    def failed(*lines: str) -> CheckFailed:
        """The loading's failure, named by the shard misreading of the triples when one fits (explain_shards)."""
        try:
            explain_shards(triples, wants, heads, kv, d, tp, "loading")
        except CheckFailed as named:
            if named.hints:
                failure = CheckFailed(*lines, hint=named.hint)
                failure.hints = list(named.hints)
                return failure
        return CheckFailed(*lines)

    for rank in range(tp):
        param = torch.full(((heads + 2 * kv) // tp * d, H), float("nan"))
        for s in "qkv":
            got = triples[rank, s]
            offset, start, size = got
            if not (0 <= offset and offset + size <= param.shape[0] and 0 <= start and start + size <= loaded[s].shape[0] and size > 0):
                raise failed(
                    tr(
                        "rank {rank}, {s}_proj [{n}, {H}] into the fused [{rows}, {H}]: (offset, start, size) = {got} does not fit",
                        rank=rank,
                        s=s,
                        n=loaded[s].shape[0],
                        H=H,
                        rows=param.shape[0],
                        got=got,
                    )
                )
            param[offset : offset + size] = loaded[s][start : start + size]
        want = torch.cat([loaded[s].chunk(tp)[rank] for s in "qkv"])  # rank r's own heads, packed q | k | v
        if not torch.equal(param, want):
            bad = int(wrong_mask(param, want).any(-1).nonzero()[0])
            raise failed(
                tr(
                    "num_heads={heads}, num_kv_heads={kv}, head_dim={d}, tp={tp}: rank {rank}'s fused weight should be "
                    "chunk {rank} of q_proj, then of k_proj, then of v_proj",
                    heads=heads,
                    kv=kv,
                    d=d,
                    tp=tp,
                    rank=rank,
                ),
                tr("its row {bad} is wrong after loading with your (offset, start, size)", bad=bad),
            )
