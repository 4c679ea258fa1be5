"""ch20 · pre-norm, RMSNorm, SwiGLU: wrong submissions that embody real misconceptions get the teaching
message meant for them, the figures drawn from them mark the wrong values, and the reference agrees with
the documented numbers and with transformers' Qwen3RMSNorm / Qwen3MLP."""

from __future__ import annotations

import re

import pytest
import torch
from figure_layout import cramped, off_canvas, rects, reference_figures, reference_records, texts, transposes
from mutate import figure_file, mutant_grader, result, row, tasks_not_passed, wrong_elements

from figures import ch20 as drawn
from figures.style import MARGIN
from grader.checks import ch20 as checks
from solutions import ch20_norms_swiglu as ref

SEED = 20


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return mutant_grader(tmp_path_factory, "ch20", SEED)


# -- 20.1 rms_norm -------------------------------------------------------------------------------------


def test_weight_multiplied_before_the_cast(graded):
    """The weight multiplied in float32, before the cast back to bf16."""
    report = graded.mistake("weight_first")
    assert result(report, "the worked example", task="ch20.1").status == "passed"  # float32: the order cannot matter
    r = result(report, "bf16: cast back", task="ch20.1")
    assert r.status == "failed"
    assert "every value is within one bf16 rounding step of the reference, but" in r.message
    assert r.hints == ["weight_first"]
    oracle = result(report, "agreement with transformers' Qwen3RMSNorm", task="ch20.1")
    assert oracle.status == "failed" and oracle.hints == ["weight_first"]
    assert not wrong_elements(report, "ch20-prenorm")  # the figure instance is float32


def test_layernorm_instead_of_rmsnorm(graded):
    """LayerNorm's habit: the mean subtracted before the mean square."""
    report = graded.mistake("layernorm")
    r = result(report, "the worked example", task="ch20.1")
    assert r.status == "failed"
    assert "token 0 of x = [1, 2, 3, 4]: mean(x²) over its 4 channels = 7.5, rsqrt(7.5 + eps) = 0.3651" in r.message
    assert "rms_norm(x)[0, 0] = 1·0.3651·w[0] = 1·0.3651·1 = 0.3651; yours: -1.342" in r.message
    assert r.hints == ["layernorm"]
    # layer 0's add_rms_norm normalises with rms_norm: the figure marks its normed row
    assert wrong_elements(report, "ch20-prenorm")
    assert off_canvas(figure_file(report, "ch20-prenorm").read_text(encoding="utf-8"), margin=MARGIN - 1) == []


# -- 20.2 add_rms_norm ---------------------------------------------------------------------------------


def test_normed_value_returned_as_the_residual(graded):
    """The fused add hands the normalised sum on as the residual stream."""
    report = graded.mistake("normed_residual")
    assert tasks_not_passed(report) == {"ch20.2"}
    r = result(report, "figure instance", task="ch20.2")
    assert r.status == "failed"
    assert 'case "layer 0: post_attention_layernorm(attention output, residual)"' in r.message
    assert "new_residual[0, 0] = x + residual = 1 + 0 = 1; yours: 0.3651" in r.message
    assert r.hints == ["normed_residual"]
    assert result(report, "a stack of pre-norm layers", task="ch20.2").status == "failed"
    assert wrong_elements(report, "ch20-prenorm")


def test_layer0_without_a_residual(graded):
    """Layer 0 hands on no residual at all."""
    report = graded.mistake("layer0_none")
    r = result(report, "residual None (layer 0)", task="ch20.2")
    assert r.status == "failed"
    assert "yours returned None as new_residual" in r.message
    assert r.hints == ["layer0_none"]
    assert "ch20-prenorm" not in " ".join(report.figures)  # nothing to draw before the structure is right


def test_normalising_the_rounded_sum(graded):
    """The sum rounded to bf16 before it is normalised: only the bf16 check can see it."""
    report = graded.mistake("rounded_sum")
    assert result(report, "the sum goes on", task="ch20.2").status == "passed"  # float32: no difference
    r = result(report, "bf16: the float32 sum", task="ch20.2")
    assert r.status == "failed"
    assert r.hints == ["rounded_sum"]


def test_the_rounded_sum_hint_names_a_convention_not_an_error():
    # Normalising the rounded sum is what vLLM's fused kernel and transformers do: the hint says which convention the
    # course follows, and calls the other one neither wrong nor a mistake.
    text = row("ch20", "rounded_sum").message
    assert "follows nano-vllm" in text and "vLLM" in text and "transformers" in text
    assert not re.search(r"wrong|mistake|not its|instead of", text), text


# -- 20.3 silu_and_mul ---------------------------------------------------------------------------------


def test_up_and_gate_swapped(graded):
    """up | gate: SiLU applied to the second half."""
    report = graded.mistake("halves_swapped")
    r = result(report, "the worked example", task="ch20.3")
    assert r.status == "failed"
    assert "gate = gate_up[..., 0] = 1, up = gate_up[..., 2] = 2; SiLU(1) = 1·sigmoid(1) = 0.7311" in r.message
    assert "times up: 1.462; yours: 1.762" in r.message
    assert r.hints == ["halves_swapped"]
    mlp = result(report, "figure instance", task="ch20.4")  # swiglu_mlp builds on the student's silu_and_mul
    assert mlp.status == "failed" and mlp.hints == ["halves_swapped"]
    assert wrong_elements(report, "ch20-dim-swiglu")
    assert wrong_elements(report, "ch20-swiglu-branches")


def test_sigmoid_instead_of_silu(graded):
    """The gate's sigmoid without the factor z."""
    report = graded.mistake("sigmoid")
    r = result(report, "the worked example", task="ch20.3")
    assert r.status == "failed"
    assert "SiLU(-1) = -1·sigmoid(-1) = -0.2689, times up: -0.8068; yours: 0.8068" in r.message
    assert r.hints == ["sigmoid"]
    assert wrong_elements(report, "ch20-dim-swiglu")


# -- 20.4 swiglu_mlp -----------------------------------------------------------------------------------


def test_gate_and_up_rows_swapped_in_the_weight(graded):
    report = graded(
        "weight_halves",
        # the merged weight read as up | gate
        (
            "F.linear(silu_and_mul(F.linear(x, gate_up_weight)), down_weight)",
            "F.linear(silu_and_mul(F.linear(x, gate_up_weight.roll(gate_up_weight.shape[0] // 2, 0))), down_weight)",
        ),
    )
    assert tasks_not_passed(report) == {"ch20.4"}
    r = result(report, "figure instance", task="ch20.4")
    assert r.status == "failed"
    assert "token 0: gate_up = x·gate_up_weightᵀ → gate [1, -1, 3, 2, -2, -2], up [2, 1, 2, 0, 1, 1]" in r.message
    assert r.hints == ["halves_swapped"]
    oracle = result(report, "agreement with transformers' Qwen3MLP", task="ch20.4")
    assert oracle.status == "failed" and oracle.hints == ["halves_swapped"]
    assert wrong_elements(report, "ch20-dim-swiglu") and wrong_elements(report, "ch20-swiglu-branches")


def test_a_token_mixing_mlp_fails_token_independence(graded):
    """A bug that lets tokens see each other: every token's activation shifted by the batch mean."""
    report = graded.mistake("mixes_tokens")
    r = result(report, "token independence", task="ch20.4")
    assert r.status == "failed"
    assert "gives a different output when the tokens come in another order" in r.message
    assert "the MLP transforms every token on its own and must never mix tokens" in r.message
    assert r.hints == ["mixes_tokens"]


# -- the reference against the documented numbers and transformers --------------------------------------


def test_reference_matches_the_documented_numbers():
    # reference/nanovllm.md §5 and §6
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert torch.allclose(ref.rms_norm(x, torch.ones(4)), torch.tensor([0.365148, 0.730297, 1.095445, 1.460593]), atol=1e-6)
    assert torch.allclose(
        ref.rms_norm(x, torch.tensor([1.0, 0.5, 2.0, 1.0])), torch.tensor([0.365148, 0.365148, 2.190890, 1.460593]), atol=1e-6
    )
    normed, res = ref.add_rms_norm(torch.ones(4), torch.tensor([0.0, 1.0, 2.0, 3.0]), torch.ones(4))
    assert torch.equal(res, x) and torch.allclose(normed, ref.rms_norm(x, torch.ones(4)))
    assert torch.allclose(ref.silu_and_mul(torch.tensor([1.0, -1.0, 2.0, 3.0])), torch.tensor([1.462117, -0.806824]), atol=1e-6)


def test_reference_matches_transformers():
    m = pytest.importorskip("transformers.models.qwen3.modeling_qwen3")
    g = torch.Generator().manual_seed(0)
    norm = m.Qwen3RMSNorm(64).to(torch.bfloat16)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(64, generator=g) + 0.5)
        x = torch.randn(8, 64, generator=g).bfloat16()
        assert torch.equal(ref.rms_norm(x, norm.weight.detach()), norm(x))  # bit for bit, order included
        config = m.Qwen3Config(
            hidden_size=16,
            intermediate_size=24,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=8,
            num_hidden_layers=1,
            vocab_size=8,
        )
        mlp = m.Qwen3MLP(config)
        x = torch.randn(5, 16, generator=g)
        w_gu = torch.cat((mlp.gate_proj.weight, mlp.up_proj.weight))
        assert torch.allclose(ref.swiglu_mlp(x, w_gu, mlp.down_proj.weight), mlp(x), atol=1e-6)


def test_bf16_mlp_tolerance_accepts_eager_rounding_and_rejects_swapped_halves():
    # nano-vllm's compiled SiluAndMul rounds once, an eager bf16 silu(gate) * up twice: both must pass;
    # swapping gate and up must not.
    g = torch.Generator().manual_seed(2)
    h, i = 64, 192
    x = torch.randn(16, h, generator=g).bfloat16()
    w_gu = (torch.randn(2 * i, h, generator=g) * h**-0.5).bfloat16()
    w_down = (torch.randn(h, i, generator=g) * i**-0.5).bfloat16()
    want = ref.swiglu_mlp(x, w_gu, w_down)
    gu = torch.nn.functional.linear(x, w_gu)
    eager = torch.nn.functional.linear(torch.nn.functional.silu(gu[:, :i]) * gu[:, i:], w_down)
    swapped = torch.nn.functional.linear(torch.nn.functional.silu(gu[:, i:]) * gu[:, :i], w_down)
    assert not checks.mlp_wrong(eager, want).any()
    assert checks.mlp_wrong(swapped, want).float().mean() > 0.5


# -- the figures' layout ------------------------------------------------------------------------------------
def test_the_fused_rows_cells_are_wide_enough_for_their_values():
    svg = reference_figures("ch20")["ch20-prenorm"]
    cells = rects(svg, cls="cell")
    values = texts(svg, cls="value")
    assert any(t.s == "0.557" for t in values), "the value that used to touch its cell's borders"
    held = [c for c in cells if any(c.holds(t) for t in values)]
    assert len(held) >= 40
    for c in held:
        assert cramped(svg, c, pad=drawn.CELL_PAD - 0.5, cls="value") == []
    assert off_canvas(svg, margin=MARGIN - 1) == []


def test_a_transpose_is_a_raised_t_in_the_figures_own_font():
    svg = reference_figures("ch20")["ch20-dim-swiglu"]
    assert "ᵀ" not in svg, "the modifier letter ᵀ is another font's glyph"
    assert len([s for s in transposes(svg) if "WT row" in s]) == len(reference_records("ch20")["ch20-dim-swiglu"]["x"])
    assert [s for s in transposes(svg) if s.startswith(("① gate_up = x · W_gate_upT", "③ out = act · W_downT"))]


# -- the provided input checks (outside the solution regions: unit tests, no graded checks) ---------------------

ones = torch.ones


@pytest.mark.parametrize(
    "x, weight",
    [(torch.tensor(1.0), ones(1)), (ones(3, 8), ones(3)), (ones(4, 8), ones(1, 8))],
    ids=["scalar x", "weight of the token count", "weight 2-D"],
)
def test_the_provided_norm_check_refuses_bad_shapes(x, weight):
    with pytest.raises(ValueError):
        ref.rms_norm(x, weight)
    with pytest.raises(ValueError):
        ref.add_rms_norm(x, None, weight)


@pytest.mark.parametrize(
    "x, residual, weight",
    [(ones(2, 8), ones(3, 8), ones(8)), (ones(2, 8), ones(2, 4), ones(8)), (ones(2, 8), ones(2, 8), ones(2))],
    ids=["residual of other tokens", "residual of another width", "weight of another width"],
)
def test_the_provided_add_check_refuses_bad_shapes(x, residual, weight):
    with pytest.raises(ValueError):
        ref.add_rms_norm(x, residual, weight)


@pytest.mark.parametrize("gate_up", [ones(2, 7), ones(3, 4, 5), torch.tensor(1.0)], ids=["odd", "odd 3-D", "scalar"])
def test_the_provided_gate_up_check_refuses_odd_widths(gate_up):
    with pytest.raises(ValueError):
        ref.silu_and_mul(gate_up)


@pytest.mark.parametrize(
    "x, w_gu, w_down, transposed",
    [
        (ones(2, 4), ones(12, 4).T, ones(4, 6), True),
        (ones(2, 4), ones(12, 4), ones(4, 6).T, True),
        (ones(2, 4), ones(11, 4), ones(4, 5), False),
        (ones(2, 4), ones(12, 4), ones(4, 5), False),
        (ones(2, 5), ones(12, 4), ones(4, 6), False),
        (ones(2, 4), ones(12, 4, 1), ones(4, 6), False),
    ],
    ids=["gate_up [in, out]", "down [in, out]", "odd rows", "down of another I", "x of another H", "3-D weight"],
)
def test_the_provided_mlp_check_refuses_bad_weights_and_names_a_transposed_one(x, w_gu, w_down, transposed):
    with pytest.raises(ValueError) as e:
        ref.swiglu_mlp(x, w_gu, w_down)
    assert ("looks transposed" in str(e.value)) == transposed


def test_the_provided_checks_let_good_inputs_through():
    x = torch.randn(3, 8)
    assert ref.rms_norm(x, ones(8)).shape == (3, 8)
    assert ref.add_rms_norm(x, x, ones(8))[1].shape == (3, 8)
    assert ref.silu_and_mul(ones(3, 6)).shape == (3, 3)
    assert ref.swiglu_mlp(x, ones(12, 8), ones(8, 6)).shape == (3, 8)
