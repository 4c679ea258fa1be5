"""ch19 · rotary position embedding: wrong submissions that embody real misconceptions get the teaching
message meant for them, the figures drawn from them mark the wrong values, and the reference agrees with
the documented worked example and with transformers' Qwen3."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import pytest
import torch
from mutate import figure, mutant_grader, result, tasks_not_passed, wrong_elements

import figures
from figures import ch19 as rope_figures
from figures.style import stroke
from grader.checks import ch19 as checks
from grader.hidden import ch19_models as models
from solutions import ch19_rope as ref

SEED = 19
SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return mutant_grader(tmp_path_factory, "ch19", SEED)


# -- 19.1 rope_cos_sin --------------------------------------------------------------------------------


def test_cos_and_sin_swapped(graded):
    """(sin, cos) returned in the wrong order."""
    report = graded.mistake("sin_cos_order")
    r = result(report, "figure instance", task="ch19.1")
    assert r.status == "failed"
    assert "positions [0, 1, 2], head_dim 4, base 10000" in r.message
    assert "pair j = 0: inv_freq[0] = 1 / 10000^(2·0/4) = 1; position 0 → angle 0 · 1 = 0 rad" in r.message
    assert "cos[0, 0] = cos(0) = 1; yours: 0" in r.message
    assert r.hints == ["sin_cos_order"]
    assert result(report, "agreement with transformers", task="ch19.1").status == "failed"
    assert wrong_elements(report, "ch19-rope-pair")
    assert "ch19.2" not in tasks_not_passed(report)  # apply_rope is graded with the reference's tables


def test_exponent_without_the_two(graded):
    """inv_freq = base^(−j/d): arange(d/2) / d, the factor 2 of 2j/d forgotten."""
    report = graded.mistake("exponent_j_over_d")
    r = result(report, "figure instance", task="ch19.1")
    assert r.status == "failed"
    want = 1 / 10000**0.5
    assert f"pair j = 1: inv_freq[1] = 1 / 10000^(2·1/4) = {checks.fmt(want, 6)}" in r.message
    assert r.hints == ["exponent_j_over_d"]
    assert wrong_elements(report, "ch19-rope-pair")
    # qk_norm_rope uses the student's own tables, so it inherits the mistake
    assert result(report, "figure instance", task="ch19.3").status == "failed"


def test_full_width_tables_are_a_shape_problem(graded):
    """Hugging Face's cat((freqs, freqs)): cos and sin [N, d] instead of [N, d/2]."""
    report = graded.mistake("full_width")
    r = result(report, "figure instance", task="ch19.1")
    assert r.status == "failed"
    assert "expected cos as a 2-D float32 tensor of shape [3, 2]; yours: float32 tensor [3, 4]" in r.message
    assert r.hints == ["full_width"]
    assert not report.figures  # the structure check comes before the figure is recorded


# -- 19.2 apply_rope ----------------------------------------------------------------------------------


def test_interleaved_layout(graded):
    """The GPT-J layout: pairs (x[2j], x[2j + 1]) instead of (x[j], x[j + d/2])."""
    report = graded.mistake("interleaved")
    assert "ch19.1" not in tasks_not_passed(report)
    r = result(report, "figure instance", task="ch19.2")
    assert r.status == "failed"
    assert "token 1 (position 1), head 0, channel 0 belongs to pair 0 = (x[0], x[2]) = (1, 3)" in r.message
    assert "y[0] = x[0]·cos − x[2]·sin = 1·0.5403 − 3·0.8415 = -1.984; yours: -1.143" in r.message
    assert r.hints == ["interleaved"]
    hf = result(report, "agreement with transformers", task="ch19.2")
    assert hf.status == "failed" and hf.hints == ["interleaved"]
    # a rotation in the wrong planes still keeps lengths and relative positions: only the layout is wrong
    assert result(report, "a rotation keeps", task="ch19.2").status == "passed"
    assert result(report, "relative position", task="ch19.2").status == "passed"
    assert wrong_elements(report, "ch19-rope-pair")


def test_one_half_left_unrotated(graded):
    report = graded(
        "half_rotated",
        # only the first half rotated: y2 = x2, which is no rotation at all
        ("x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(x.dtype)", "x1 * c - x2 * s, x2), dim=-1).to(x.dtype)"),
    )
    r = result(report, "a rotation keeps", task="ch19.2")
    assert r.status == "failed"
    assert "but |apply_rope(x)| = " in r.message and "a rotation keeps lengths" in r.message
    assert result(report, "relative position", task="ch19.2").status == "failed"
    assert "must not change" in result(report, "relative position", task="ch19.2").message
    assert wrong_elements(report, "ch19-rope-pair")


def test_sin_sign_flipped(graded):
    """Rotating backwards: the sign of sin flipped in both halves."""
    report = graded.mistake("backwards")
    r = result(report, "figure instance", task="ch19.2")
    assert r.status == "failed"
    assert r.hints == ["backwards"]
    assert wrong_elements(report, "ch19-rope-pair")
    assert result(report, "relative position", task="ch19.2").status == "passed"  # the property alone cannot see it


def test_rotated_in_bf16(graded):
    """The rotation computed in bf16 instead of float32."""
    report = graded.mistake("low_precision")
    assert result(report, "figure instance", task="ch19.2").status == "passed"
    r = result(report, "bf16 queries", task="ch19.2")
    assert r.status == "failed"
    assert "within one bf16 rounding step" in r.message or "values differ" in r.message
    assert r.hints == ["low_precision"]


# -- 19.3 qk_norm_rope --------------------------------------------------------------------------------


def test_rope_before_the_norm(graded):
    """RoPE, then the per-head norm: the weight scales channels already mixed by the rotation."""
    report = graded.mistake("rotate_first")
    assert tasks_not_passed(report) == {"ch19.3", "ch19.4"}  # rope_attention builds on qk_norm_rope
    r = result(report, "figure instance", task="ch19.3")
    assert r.status == "failed"
    assert "token 0 (position 1), q head 0 = [1, 2, 3, 4]: rms = √(mean(x²) + eps) = 2.739" in r.message
    assert "x / 2.739 · q_norm_weight = [0.3651, 0.3651, 2.191, 1.461]" in r.message
    assert "0.3651·0.5403 − 2.191·0.8415 = -1.646" in r.message
    assert r.hints == ["rotate_first"]
    oracle = result(report, "agreement with transformers' Qwen3Attention", task="ch19.3")
    assert oracle.status == "failed" and oracle.hints == ["rotate_first"]
    assert wrong_elements(report, "ch19-nanovllm-order")
    assert not wrong_elements(report, "ch19-rope-pair")


def test_norm_across_the_heads(graded):
    """RMSNorm over the heads axis instead of head_dim."""
    report = graded.mistake("over_heads")
    r = result(report, "figure instance", task="ch19.3")
    assert r.status == "failed"
    assert r.hints == ["over_heads"]
    assert wrong_elements(report, "ch19-nanovllm-order")


def test_weight_before_the_cast_in_bf16(graded):
    """The weight multiplied in float32, before the cast back to bf16: only the bf16 check can see it."""
    report = graded.mistake("weight_in_float32")
    assert result(report, "figure instance", task="ch19.3").status == "passed"
    r = result(report, "bf16 q and k", task="ch19.3")
    assert r.status == "failed"
    assert r.hints == ["weight_in_float32"]


def test_rope_attention_inherits_a_wrong_qk_norm_rope_and_says_so(graded):
    r = result(graded.mistake("rotate_first"), "figure instance", task="ch19.4")
    assert r.status == "failed" and r.hints == []
    assert "rope_attention builds on qk_norm_rope (step 1), and yours gives other q, k" in r.message


# -- 19.4 rope_attention --------------------------------------------------------------------------------


def test_values_rotated_too(graded):
    """RoPE applied to V as well: only q and k carry positions."""
    report = graded.mistake("rotated_v")
    assert tasks_not_passed(report) == {"ch19.4"}
    r = result(report, "figure instance", task="ch19.4")
    assert r.status == "failed"
    assert "1 cached token, so the new tokens stand at positions [1]" in r.message
    assert "token 0 (position 1), query head 0 reads K/V head 0 and sees keys 0 … 1" in r.message
    assert "out[0, 0] = [0.5507, -0.6956, 1.696, 0.8985]" in r.message
    assert r.hints == ["rotated_v"]
    assert all(x.hints == ["rotated_v"] for x in report.results if x.status == "failed" and not x.hidden)
    record = report.records["ch19-nanovllm-order"]
    assert record["attn_stage"] == "v" and record["attn_mistake"] == "rotated v"
    assert wrong_elements(report, "ch19-nanovllm-order")


@pytest.mark.parametrize(
    "mistake_id, stage, public_failing",
    [
        ("normed_v", "v", 5),
        ("v_like_k", "v", 5),
        ("one_rotated", "rope", 5),
        ("rotated_after", "attention", 5),
        ("no_offset", "rope", 4),  # a prefill without a cache starts at position 0 anyway
        ("rotated_cache_again", None, 3),  # the figure's one cached key is at position 0: no turn
        ("causal_offset", "attention", 4),  # a prefill without a cache is aligned either way
        ("kv_groups", None, 3),  # one K/V head (the figure, the decode step) has no groups
    ],
)
def test_each_wrong_order_is_named(graded, mistake_id, stage, public_failing):
    report = graded.mistake(mistake_id, task="ch19.4")
    failed = [x for x in report.results if x.status == "failed" and not x.hidden]
    assert len(failed) == public_failing, [x.name for x in failed]
    assert all(x.hints == [mistake_id] for x in failed), [(x.name, x.hints) for x in failed]
    record = report.records["ch19-nanovllm-order"]
    assert record["attn_stage"] == (stage or "")


def test_a_rotation_gone_wrong_in_rope_attention_does_not_frame_a_right_qk_norm_rope(graded):
    # Only q rotated inside rope_attention; qk_norm_rope (stage ③, the student's ch19.3 values) is right, so the
    # outline goes on the keys attention should read, below stage ④'s heading, and the figure says ③ is right.
    report = graded.mistake("one_rotated")
    assert result(report, "figure instance", task="ch19.3").status == "passed"
    root = figure(report, "ch19-nanovllm-order")
    text = {"".join(el.itertext()): el for el in root.iter(f"{SVG}text")}
    heading = next(el for s, el in text.items() if s.startswith("④ in numbers"))
    outlines = [el for el in root.iter(f"{SVG}rect") if el.get("class") == "outline" and el.get("stroke") == stroke("wrong")]
    assert outlines and all(float(el.get("y")) > float(heading.get("y")) for el in outlines), [el.attrib for el in outlines]
    assert any(s.startswith("③ shows your qk_norm_rope, and its values are right") for s in text)


def test_a_decode_step_without_the_offset(graded):
    """Positions 0 … N − 1 for the new tokens, as if the cache were empty."""
    r = result(graded.mistake("no_offset", task="ch19.4"), "a decode step", task="ch19.4")
    assert r.status == "failed" and r.hints == ["no_offset"]
    assert "6 cached tokens, so the new tokens stand at positions [6]" in r.message


def test_attention_in_bf16_is_named(graded):
    report = graded.mistake("attention_low_precision", task="ch19.4")
    assert result(report, "figure instance", task="ch19.4").status == "passed"
    r = result(report, "bf16, as in nano-vllm", task="ch19.4")
    assert r.status == "failed" and r.hints == ["attention_low_precision"]


def test_attention_by_torch_sdpa_passes(graded):
    """A right answer written another way: torch's scaled_dot_product_attention with a boolean mask and GQA."""
    report = graded(
        "sdpa",
        (
            "    group = num_heads // k.shape[1]\n"
            "    keys = k.float().repeat_interleave(group, dim=1)                 # [C + N, Hq, d]\n"
            "    values = v.float().repeat_interleave(group, dim=1)\n"
            '    scores = torch.einsum("nhd,shd->hns", q.float(), keys) * d ** -0.5\n'
            "    visible = torch.ones(n, c + n, dtype=torch.bool).tril(diagonal=c)    # query i sees keys 0 … C + i\n"
            '    probs = scores.masked_fill(~visible, float("-inf")).softmax(dim=-1)\n'
            '    return torch.einsum("hns,shd->nhd", probs, values).to(q.dtype)',
            "    visible = torch.ones(n, c + n, dtype=torch.bool).tril(diagonal=c)\n"
            "    o = torch.nn.functional.scaled_dot_product_attention(\n"
            "        q.float().transpose(0, 1), k.float().transpose(0, 1), v.float().transpose(0, 1), attn_mask=visible,\n"
            "        enable_gqa=True)\n"
            "    return o.transpose(0, 1).to(q.dtype)",
        ),
    )
    assert not tasks_not_passed(report)
    assert not wrong_elements(report, "ch19-nanovllm-order")


def test_the_attention_models_tell_the_mistakes_apart():
    """On the public chunk's shapes every misconception gives its own output, and each differs from the right one."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(3, h, 16, generator=g) * 2 for h in (4, 2, 2))
    k_cache, v_cache = torch.randn(4, 2, 16, generator=g), torch.randn(4, 2, 16, generator=g)
    w = torch.rand(16, generator=g) + 0.5
    got = models.attention_models(None, q, k, v, w, w.flip(0), 1e6, 1e-6, k_cache, v_cache)
    want = ref.rope_attention(q, k, v, w, w.flip(0), 1e6, 1e-6, k_cache, v_cache)
    variants = got["variants"]
    assert all(not checks.agrees(y, want) for y in variants.values())
    assert all(checks.attention_mistake(y, want, variants) == key for key, y in variants.items())
    assert torch.allclose(got["probs"].sum(-1), torch.ones(4, 3))


# The input checks every task needs but none teaches are provided code (outside the solution regions): plain unit
# tests here, no graded checks.
@pytest.mark.parametrize(
    "positions, head_dim, base",
    [
        ([0, 1], 5, 10000.0),
        ([0, 1], 0, 10000.0),
        ([0, 1], 8.0, 10000.0),
        ([0, 1], 8, 0.0),
        ([0, -1], 8, 10000.0),
        ([0.5, 1], 8, 10000.0),
        (torch.tensor([0.5, 1.0]), 8, 10000.0),
        (torch.zeros(2, 2, dtype=torch.long), 8, 1e4),
    ],
)
def test_the_provided_cos_sin_check_refuses_bad_inputs(positions, head_dim, base):
    with pytest.raises(ValueError):
        ref.rope_cos_sin(positions, head_dim, base)


@pytest.mark.parametrize(
    "x, cos",
    [
        (torch.zeros(2, 1, 5), torch.ones(2, 2)),  # odd head_dim
        (torch.zeros(3, 2, 8), torch.ones(2, 4)),  # rows for 2 tokens, x has 3
        (torch.zeros(3, 8), torch.ones(3, 4)),  # no heads axis
        (torch.zeros(2, 1, 8), torch.ones(2, 8)),  # Hugging Face's full-width tables
    ],
)
def test_the_provided_rope_check_refuses_bad_inputs(x, cos):
    with pytest.raises(ValueError):
        ref.apply_rope(x, cos, torch.zeros_like(cos))


@pytest.mark.parametrize(
    "q, k, wq, wk, positions",
    [
        (torch.zeros(2, 4, 8), torch.zeros(3, 2, 8), torch.ones(8), torch.ones(8), [0, 1]),  # 2 and 3 tokens
        (torch.zeros(2, 4, 8), torch.zeros(2, 2, 8), torch.ones(8), torch.ones(8), [0, 1, 2]),  # 3 positions
        (torch.zeros(2, 4, 7), torch.zeros(2, 2, 7), torch.ones(7), torch.ones(7), [0, 1]),  # odd head_dim
        (torch.zeros(2, 4, 8), torch.zeros(2, 2, 16), torch.ones(8), torch.ones(16), [0, 1]),  # other head_dims
        (torch.zeros(2, 4, 8), torch.zeros(2, 2, 8), torch.ones(32), torch.ones(8), [0, 1]),  # weight [Hq·d]
        (torch.zeros(2, 4, 8), torch.zeros(2, 2, 8).double(), torch.ones(8), torch.ones(8), [0, 1]),  # dtypes
    ],
)
def test_the_provided_qk_check_refuses_bad_inputs(q, k, wq, wk, positions):
    with pytest.raises(ValueError):
        ref.qk_norm_rope(q, k, wq, wk, positions, 1e6)


@pytest.mark.parametrize(
    "shapes, caches",
    [
        (((2, 4, 8), (2, 2, 8), (2, 2, 4)), None),  # v of another head_dim
        (((2, 4, 8), (2, 3, 8), (2, 3, 8)), None),  # 4 query heads over 3 K/V heads
        (((2, 4, 8), (2, 2, 8), (2, 2, 8)), ((3, 2, 8), None)),  # a k_cache without a v_cache
        (((2, 4, 8), (2, 2, 8), (2, 2, 8)), ((3, 1, 8), (3, 1, 8))),  # caches of other heads
        (((2, 4, 8), (2, 2, 8), (2, 2, 8)), ((3, 2, 8), (4, 2, 8))),  # caches of other lengths
        (((2, 4, 8), (2, 2, 8), (2, 2, 8)), ((3, 2, 8), (3, 2))),  # a 2-D cache
    ],
)
def test_the_provided_attention_check_refuses_bad_inputs(shapes, caches):
    q, k, v = (torch.zeros(s) for s in shapes)
    k_cache, v_cache = (None if s is None else torch.zeros(s) for s in (caches or (None, None)))
    with pytest.raises(ValueError):
        ref.rope_attention(q, k, v, torch.ones(8), torch.ones(8), 1e6, 1e-6, k_cache, v_cache)


def test_the_provided_checks_let_good_inputs_through():
    cos, sin = ref.rope_cos_sin(torch.tensor([3, 0]), 8, 1e6)
    assert ref.apply_rope(torch.zeros(2, 3, 8), cos, sin).shape == (2, 3, 8)
    assert ref.rope_cos_sin([], 8, 10000.0)[0].shape == (0, 4)
    q, k = ref.qk_norm_rope(torch.ones(2, 4, 8), torch.ones(2, 2, 8), torch.ones(8), torch.ones(8), [5, 6], 1e6)
    assert q.shape == (2, 4, 8) and k.shape == (2, 2, 8)
    out = ref.rope_attention(
        torch.ones(2, 4, 8),
        torch.ones(2, 2, 8),
        torch.ones(2, 2, 8),
        torch.ones(8),
        torch.ones(8),
        1e6,
        1e-6,
        torch.ones(3, 2, 8),
        torch.ones(3, 2, 8),
    )
    assert out.shape == (2, 4, 8)


# -- the figure of one pair in the plane ----------------------------------------------------------------


def _boxes(root) -> list[tuple[str, tuple[float, float, float, float]]]:
    """Every text of a figure with the box it covers (by the kit's own width measure)."""
    out = []
    for el in root.iter(f"{SVG}text"):
        s, size = "".join(el.itertext()), float(el.get("font-size"))
        out.append(
            (
                s,
                rope_figures.label_box(
                    float(el.get("x")), float(el.get("y")), s, size, el.get("text-anchor", "start"), mono="Mono" in el.get("font-family")
                ),
            )
        )
    return out


def _inside(box, rect) -> bool:
    x, y, w, h = (float(rect.get(k)) for k in ("x", "y", "width", "height"))
    return x <= box[0] and box[2] <= x + w and y <= box[1] and box[3] <= y + h


def _rope_figures(record: dict) -> list[ET.Element]:
    """The figure drawn from the record, and drawn from the same inputs with the reference's answers."""
    spec = next(s for s in figures.catalog("ch19") if s.id == "ch19-rope-pair")
    right = {
        **record,
        "rotated": record["expected"],
        "cos": record["cos_expected"],
        "sin": record["sin_expected"],
        **{k: [[False] * len(row) for row in record[k]] for k in ("wrong", "cos_wrong", "sin_wrong")},
    }
    return [ET.fromstring(spec.render(record)), ET.fromstring(spec.render(right))]


def test_rope_pair_labels_and_captions_keep_off_the_circles(graded):
    record = graded.mistake("backwards").records["ch19-rope-pair"]
    for root in _rope_figures(record):
        circles = [c for c in root.iter(f"{SVG}circle") if c.get("class") == "orbit"]
        zooms = [z for z in root.iter(f"{SVG}rect") if z.get("class") == "zoom"]
        zoomed = [c for c in root.iter(f"{SVG}circle") if c.get("class") == "orbit zoomed"]
        assert len(circles) == 2
        for s, box in _boxes(root):
            inset = [k for k, z in enumerate(zooms) if _inside(box, z)]
            # over a main circle unless inside an inset (which hides the circle), over an inset's circle never
            rings = [zoomed[k] for k in inset] if inset else circles
            for c in rings:
                assert not rope_figures.crosses_ring(box, float(c.get("cx")), float(c.get("cy")), float(c.get("r")), margin=1.0), (s, box)


def test_a_slow_pairs_positions_are_told_apart_in_a_zoomed_inset(graded):
    record = graded.mistake("backwards").records["ch19-rope-pair"]
    d, base, positions = record["head_dim"], record["base"], record["positions"]
    slow = [j for j in range(d // 2) if max(positions) / base ** (2 * j / d) <= 0.3]
    assert slow, "the instance has a slow pair"
    for root in _rope_figures(record):
        assert len([z for z in root.iter(f"{SVG}rect") if z.get("class") == "zoom"]) == len(slow)
        groups = [g for g in root.iter(f"{SVG}g") if g.get("class") == "zoomed"]
        for g in groups:
            heads = [p for p in g.iter(f"{SVG}polygon") if "arrow" in p.get("class") and "expected" not in p.get("class")]
            tips = [tuple(map(float, p.get("points").split()[0].split(","))) for p in heads]
            assert len(tips) == len(positions)
            gaps = [math.dist(a, b) for a, b in zip(tips, tips[1:])]
            assert min(gaps) >= 0.5 * rope_figures.ZOOM_SEPARATION, gaps
        labels = {t for t, _ in _boxes(root)}
        assert {f"p={p}" for p in positions} <= labels


# -- the reference against the documented facts and transformers ----------------------------------------


def test_reference_matches_the_worked_example():
    # reference/nanovllm.md §4: d = 4, base 10000, x = [1, 2, 3, 4].
    cos, sin = ref.rope_cos_sin([0, 1, 2], 4, 10000.0)
    assert torch.allclose(cos[1], torch.tensor([0.540302, 0.999950]), atol=1e-6)
    assert torch.allclose(sin[1], torch.tensor([0.841471, 0.010000]), atol=1e-6)
    x = torch.tensor([1.0, 2.0, 3.0, 4.0]).expand(3, 1, 4)
    y = ref.apply_rope(x, cos, sin)[:, 0]
    assert torch.equal(y[0], x[0, 0])
    assert torch.allclose(y[1], torch.tensor([-1.984111, 1.959901, 2.462378, 4.019800]), atol=1e-5)
    assert torch.allclose(y[2], torch.tensor([-3.144039, 1.919605, -0.339143, 4.039197]), atol=1e-5)
    # the grader's model of the interleaved variant gives the documented GPT-J numbers
    gptj = models.rotate(x, cos, sin, layout="interleaved")[1, 0]
    assert torch.allclose(gptj, torch.tensor([-1.142640, 1.922076, 2.959851, 4.029800]), atol=1e-5)


def test_reference_attention_matches_transformers_qwen3_attention():
    """A chunk after a cached prefix, against transformers' Qwen3Attention over the whole sequence."""
    qwen3 = pytest.importorskip("transformers.models.qwen3.modeling_qwen3")
    config = qwen3.Qwen3Config(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rope_theta=1e6,
        num_hidden_layers=1,
        vocab_size=8,
        attn_implementation="eager",
    )
    g = torch.Generator().manual_seed(2)
    attn = qwen3.Qwen3Attention(config, layer_idx=0).eval()
    with torch.no_grad():
        for norm in (attn.q_norm, attn.k_norm):
            norm.weight.copy_(torch.rand(16, generator=g) + 0.5)
        c, n = 5, 2
        x = torch.randn(1, c + n, 32, generator=g)
        cos, sin = qwen3.Qwen3RotaryEmbedding(config)(x, torch.arange(c + n)[None])
        mask = torch.full((c + n, c + n), float("-inf")).triu(1)[None, None]
        want = attn(x, (cos, sin), mask)[0][0, c:]
        q, k, v = (proj(x[0]).view(c + n, -1, 16) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
        wq, wk = attn.q_norm.weight, attn.k_norm.weight
        _, k_cache = ref.qk_norm_rope(q[:c], k[:c], wq, wk, list(range(c)), 1e6)
        out = ref.rope_attention(q[c:], k[c:], v[c:], wq, wk, 1e6, 1e-6, k_cache, v[:c])
        assert torch.allclose(attn.o_proj(out.reshape(n, 64)), want, atol=1e-5)


def test_reference_matches_transformers_qwen3():
    qwen3 = pytest.importorskip("transformers.models.qwen3.modeling_qwen3")
    d, base, positions = 32, 1e6, [0, 3, 17, 4095]
    config = qwen3.Qwen3Config(
        hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=d, rope_theta=base, num_hidden_layers=1, vocab_size=8
    )
    cos, sin = qwen3.Qwen3RotaryEmbedding(config)(torch.zeros(1), torch.tensor([positions]))
    ours = ref.rope_cos_sin(positions, d, base)
    assert torch.equal(ours[0], cos[0, :, : d // 2]) and torch.equal(ours[1], sin[0, :, : d // 2])
    q = torch.randn(4, 2, d, generator=torch.Generator().manual_seed(0))
    want, _ = qwen3.apply_rotary_pos_emb(q.transpose(0, 1)[None], q.transpose(0, 1)[None], cos, sin)
    assert torch.allclose(ref.apply_rope(q, *ours), want[0].transpose(0, 1), atol=1e-6)


def test_both_orders_agree_with_unit_weights():
    # why the checks use non-uniform weights: with w = 1 a rotation keeps the rms, so the orders agree
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 2, 8, generator=g, dtype=torch.float64)
    cos, sin = models.rope_tables([4, 5, 6], 8, 10000.0)
    ones, w = torch.ones(8, dtype=torch.float64), torch.rand(8, generator=g, dtype=torch.float64) + 0.5
    rot = lambda z: models.rotate(z, cos.double(), sin.double(), compute=torch.float64)
    assert torch.allclose(rot(models.head_norm(x, ones, 1e-6)), models.head_norm(rot(x), ones, 1e-6))
    assert not torch.allclose(rot(models.head_norm(x, w, 1e-6)), models.head_norm(rot(x), w, 1e-6), atol=1e-3)


def test_rounding_rule_for_bf16():
    want = torch.tensor([1.0, 2.0, 3.0, 100.0]).bfloat16()
    one_step = torch.tensor([1.0078125, 2.0, 3.0, 100.0]).bfloat16()
    two_steps = torch.tensor([1.015625, 2.0, 3.0, 100.0]).bfloat16()
    assert not checks.wrong_values(one_step, want).any()
    assert checks.wrong_values(two_steps, want).tolist() == [True, False, False, False]
    assert checks.rounding_share(one_step, want) == 0.25


def test_hints_for_swapped_tables_and_bf16_angles():
    # cos and sin swapped inside the rotation; angles computed from bf16 positions
    x = torch.randn(4, 2, 8, generator=torch.Generator().manual_seed(3))
    cos, sin = ref.rope_cos_sin([1, 2, 3, 4], 8, 10000.0)
    variants = models.rope_variants(None, x, cos, sin)
    ids = lambda hints: [h.id for h in hints]
    assert ids(checks.rope_hints(models.rotate(x, sin, cos), x, variants)) == ["swapped_tables"]
    assert ids(checks.rope_hints(models.rotate(x, cos, sin, direction=-1), x, variants)) == ["backwards"]
    both = models.rotate(x, cos, sin, layout="interleaved", direction=-1)
    assert ids(checks.rope_hints(both, x, variants)) == ["interleaved", "backwards"]
    with pytest.raises(checks.CheckFailed) as e:
        checks.explain_rotated(both, ref.apply_rope(x, cos, sin), x, cos, sin, "both", variants=variants)
    assert e.value.hints == ["interleaved", "backwards"]
    positions = [300, 1001, 40001]
    inv = 1.0 / 1e6 ** (torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    angles = (torch.tensor(positions, dtype=torch.float64)[:, None].bfloat16() * inv.bfloat16()).double()
    want = ref.rope_cos_sin(positions, 16, 1e6)
    hint = checks.cos_sin_hint(
        angles.cos().float(), angles.sin().float(), want, checks.angle_atol(positions), models.cos_sin_variants(None, positions, 16, 1e6)
    )
    assert hint.id == "bf16_angles"
