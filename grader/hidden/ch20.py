"""Hidden checks of ch20 · pre-norm, RMSNorm, SwiGLU: random instances from the grading seed, agreement with
transformers' Qwen3RMSNorm and Qwen3MLP, the residual stream of a chain of layers, token independence,
bad inputs."""

from __future__ import annotations

import torch

from grader.authoring import CheckFailed, Trial, expect_tensor, fmt, hidden, mistakes
from grader.checks.ch20 import (
    EPS,
    expect_pair,
    explain_act,
    explain_add,
    explain_mlp,
    mlp_wrong,
    random_mlp,
    run_act_case,
    run_add_case,
    run_mlp_case,
    run_norm_case,
)
from grader.i18n import tr

M = mistakes("ch20")


# -- ch20.1 -------------------------------------------------------------------------------------------


@hidden("ch20.1", "agreement with transformers' Qwen3RMSNorm (float32 and bf16)")
def hf_rms_norm(t: Trial) -> None:
    m = qwen3(t)
    for dtype, h in ((torch.float32, 32), (torch.bfloat16, 128), (torch.bfloat16, 1024)):
        norm = m.Qwen3RMSNorm(h, eps=1e-6).to(dtype)
        with torch.no_grad():
            norm.weight.copy_(torch.rand(h, generator=t.rng) + 0.5)
            x = (torch.randn(6, h, generator=t.rng) * 4).to(dtype)
            want = norm(x)
        run_norm_case(t, x, norm.weight.detach().clone(), f"Qwen3RMSNorm({h}), {str(dtype)[6:]}", want=want)


@hidden("ch20.1", "random shapes, sizes and dtypes")
def random_norms(t: Trial) -> None:
    for i in range(8):
        shape = [t.random.randint(1, 5) for _ in range(t.random.randint(0, 2))] + [t.random.choice([1, 2, 8, 64, 256])]
        dtype = [torch.float32, torch.bfloat16, torch.float16][i % 3]
        x = (torch.randn(shape, generator=t.rng) * 10 ** t.random.uniform(-1, 2)).to(dtype)
        run_norm_case(
            t, x, (torch.rand(shape[-1], generator=t.rng) * 2).to(dtype), f"x {shape} {str(dtype)[6:]}", eps=t.random.choice([1e-6, 1e-5])
        )


@hidden("ch20.1", "tiny activations: eps inside the root")
def tiny_norms(t: Trial) -> None:
    # mean(x²) ≈ 1e-8 ≪ eps = 1e-6: the result is about x / 1e-3, far from x / rms(x)
    x = torch.randn(3, 16, generator=t.rng) * 1e-4
    run_norm_case(t, x, torch.ones(16), "x ≈ 1e-4, eps 1e-6")


# -- ch20.2 -------------------------------------------------------------------------------------------


@hidden("ch20.2", "random batches, float32 and bf16, with and without a residual")
def random_adds(t: Trial) -> None:
    for i in range(8):
        n, h = t.random.randint(1, 6), t.random.choice([4, 16, 64, 256])
        dtype = torch.bfloat16 if i % 2 else torch.float32
        x = (torch.randn(n, h, generator=t.rng) * t.random.choice([0.1, 1.0, 5.0])).to(dtype)
        r = None if i % 4 == 0 else (torch.randn(n, h, generator=t.rng) * 10).to(dtype)
        run_add_case(
            t,
            x,
            r,
            (torch.rand(h, generator=t.rng) + 0.5).to(dtype),
            tr("{n} tokens, H = {h}, {dtype}, residual None", n=n, h=h, dtype=str(dtype)[6:])
            if r is None
            else tr("{n} tokens, H = {h}, {dtype}, residual given", n=n, h=h, dtype=str(dtype)[6:]),
        )


@hidden("ch20.2", "a stack of pre-norm layers: the residual stream is the running sum")
def residual_stream(t: Trial) -> None:
    # Toy sublayers (fixed linear maps) in nano-vllm's fused form; the residual must equal the logical
    # h_{l+1} = h_l + sublayer(norm(h_l)) computed without any fusion.
    h, n, layers = 16, 3, 3
    maps = [torch.randn(h, h, generator=t.rng) * 0.3 for _ in range(2 * layers)]
    weights = [torch.rand(h, generator=t.rng) + 0.5 for _ in range(2 * layers + 1)]
    emb = torch.randn(n, h, generator=t.rng)
    hidden_out, logical = emb, emb.double()
    residual: torch.Tensor | None = None
    stream = emb  # the residual each call returns
    for k in range(2 * layers + 1):  # the last call is the model's final norm
        case = tr("sublayer {k} of a {layers}-layer stack", k=k, layers=layers) if k < 2 * layers else tr("the final norm")
        got = expect_pair(t.yours.add_rms_norm(hidden_out, residual, weights[k], EPS), hidden_out, residual)
        explain_add(*got, hidden_out, residual, weights[k], EPS, t.ref.add_rms_norm(hidden_out, residual, weights[k], EPS), case)
        if k:
            logical = logical + hidden_out.double()
        normed, stream = got
        residual = stream
        if k < 2 * layers:
            hidden_out = normed @ maps[k].T
    gap = float((stream.double() - logical).abs().max())
    if gap > 1e-4 * float(logical.abs().max()) + 1e-5:
        raise CheckFailed(
            tr(
                "after {layers} layers (the final norm adds the last MLP output), your residual differs "
                "from the logical sum embedding + every sublayer output by up to {gap}",
                layers=layers,
                gap=fmt(gap),
            ),
            hint=tr("each add_rms_norm returns the new sum as the residual; nothing is added twice or dropped"),
        )


# -- ch20.3 -------------------------------------------------------------------------------------------


@hidden("ch20.3", "random shapes and dtypes")
def random_acts(t: Trial) -> None:
    for i in range(8):
        shape = [t.random.randint(1, 4) for _ in range(t.random.randint(0, 2))] + [2 * t.random.choice([1, 3, 64])]
        dtype = [torch.float32, torch.bfloat16][i % 2]
        run_act_case(t, (torch.randn(shape, generator=t.rng) * 4).to(dtype), f"gate_up {shape} {str(dtype)[6:]}")


@hidden("ch20.3", "large gates: SiLU saturates without inf or nan")
def large_gates(t: Trial) -> None:
    gate = torch.tensor([[-500.0, -90.0, -20.0, 0.0, 20.0, 90.0, 500.0]])
    run_act_case(t, torch.cat((gate, torch.full_like(gate, 2.0)), dim=-1), tr("gates from −500 to 500, up = 2"))


@hidden("ch20.3", "agreement with transformers' SiLU (ACT2FN['silu']) on Qwen3-0.6B's width")
def hf_silu(t: Trial) -> None:
    t.require("transformers")
    from transformers.activations import ACT2FN

    gu = torch.randn(3, 2 * 3072, generator=t.rng) * 3
    want = ACT2FN["silu"](gu[:, :3072]) * gu[:, 3072:]
    got = expect_tensor(t.yours.silu_and_mul(gu), what="SiLU(gate)·up [3, 3072]", shape=[3, 3072], dtype=torch.float32)
    explain_act(got, want, gu, tr("Qwen3-0.6B width, I = 3072"))


# -- ch20.4 -------------------------------------------------------------------------------------------


@hidden("ch20.4", "agreement with transformers' Qwen3MLP (float32 and bf16)")
def hf_mlp(t: Trial) -> None:
    m = qwen3(t)
    for dtype, h, i in ((torch.float32, 32, 48), (torch.bfloat16, 64, 192)):
        config = m.Qwen3Config(
            hidden_size=h,
            intermediate_size=i,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            num_hidden_layers=1,
            vocab_size=8,
            hidden_act="silu",
        )
        mlp = m.Qwen3MLP(config)
        w_gu, w_down = random_mlp(t, h, i, dtype)
        with torch.no_grad():
            mlp = mlp.to(dtype)
            mlp.gate_proj.weight.copy_(w_gu[:i])  # merged gate_up_proj: gate rows first, then up
            mlp.up_proj.weight.copy_(w_gu[i:])
            mlp.down_proj.weight.copy_(w_down)
            x = torch.randn(5, h, generator=t.rng).to(dtype)
            want = mlp(x)
        run_mlp_case(t, x, w_gu, w_down, f"Qwen3MLP(hidden {h}, intermediate {i}), {str(dtype)[6:]}", want=want)


@hidden("ch20.4", "token independence: permuting the tokens permutes the outputs")
def token_independence(t: Trial) -> None:
    w_gu, w_down = random_mlp(t, 16, 40)
    x = torch.randn(9, 16, generator=t.rng)
    perm = torch.randperm(9, generator=t.rng)
    what = tr("the MLP output [9, 16]")
    y = expect_tensor(t.yours.swiglu_mlp(x, w_gu, w_down), what=what, shape=[9, 16], dtype=torch.float32)
    y_perm = expect_tensor(t.yours.swiglu_mlp(x[perm], w_gu, w_down), what=what, shape=[9, 16], dtype=torch.float32)
    bad = mlp_wrong(y_perm, y[perm]).any(dim=-1).nonzero()
    if len(bad):
        row = int(bad[0])
        raise CheckFailed(
            tr(
                "token {token} gives a different output when the tokens come in another order "
                "(row {row} of the permuted batch): the MLP transforms every token on its own and must "
                "never mix tokens",
                token=int(perm[row]),
                row=row,
            ),
            hint=M.mixes_tokens,
        )
    explain_mlp(y, t.ref.swiglu_mlp(x, w_gu, w_down), x, w_gu, w_down, tr("9 tokens"))
    alone = expect_tensor(t.yours.swiglu_mlp(x[3:4], w_gu, w_down), what=tr("the MLP output [1, 16]"), shape=[1, 16], dtype=torch.float32)
    explain_mlp(alone, y[3:4], x[3:4], w_gu, w_down, tr("token 3 alone must give its row of the batch"))


@hidden("ch20.4", "random widths, leading shapes and bf16")
def random_mlps(t: Trial) -> None:
    for k in range(6):
        h, i = t.random.choice([4, 16, 64]), t.random.choice([1, 6, 48, 96])
        dtype = torch.bfloat16 if k % 2 else torch.float32
        w_gu, w_down = random_mlp(t, h, i, dtype)
        lead = [t.random.randint(1, 4) for _ in range(t.random.randint(1, 2))]
        run_mlp_case(t, torch.randn(*lead, h, generator=t.rng).to(dtype), w_gu, w_down, f"x {lead + [h]}, I = {i}, {str(dtype)[6:]}")


# -- helpers ---------------------------------------------------------------------------------------------


def qwen3(t: Trial):
    t.require("transformers")
    from transformers.models.qwen3 import modeling_qwen3

    return modeling_qwen3
