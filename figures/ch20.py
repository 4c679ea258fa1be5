"""Figures of ch20 · pre-norm, RMSNorm, SwiGLU: the pre-norm sublayer and nano-vllm's fused add + norm,
one token through SwiGLU cell by cell, and the MLP's two branches acting on each token alone."""

from __future__ import annotations

import math

from figures import figure
from figures.ch16 import text_t
from figures.kit import Figure, num, text_width
from figures.style import CELL, INK, LABEL, MARGIN, MUTED, SMALL, VALUE, stroke

TOL = 1e-4
FUSED_SIZE = VALUE - 1.5
"""The size of the values in the fused add + norm rows."""
CELL_PAD = 5
"""The least room between a value and either side of its cell."""


def _close(a: float, b: float, tol: float = TOL) -> bool:
    return abs(a - b) <= tol + tol * abs(b)


def _fmt(v) -> str:
    """3 significant digits with a real minus sign."""
    if isinstance(v, float):
        v = float(f"{v:.3g}")
    return num(v).replace("-", "−")


def _row(f: Figure, x: float, y: float, values: list, role: str, w: float, *, expected: list | None = None,
         h: float = CELL, size: float = VALUE - 1, dashed: bool = False) -> bool:
    """A row of value cells; cells off from `expected` are marked. Returns whether any was wrong."""
    wrong = False
    for i, v in enumerate(values):
        bad = expected is not None and not _close(v, expected[i])
        wrong |= bad
        f.cell(x + i * w, y, v, role=role, w=w - 2, h=h, wrong=bad, expected=expected[i] if bad else None,
               size=size, fmt=_fmt, dashed=dashed)
    return wrong


def _fmt2(v) -> str:
    return f"{v:.2f}".replace("-", "−") if isinstance(v, float) and v != int(v) else _fmt(v)


def _row2(f: Figure, x: float, y: float, values: list, role: str, w: float, *, expected: list | None = None) -> bool:
    """A compact row (2 decimals) for the token grids."""
    wrong = False
    for i, v in enumerate(values):
        bad = expected is not None and not _close(v, expected[i])
        wrong |= bad
        f.cell(x + i * w, y, v, role=role, w=w - 2, h=CELL - 6, wrong=bad, expected=expected[i] if bad else None,
               size=SMALL + 1, fmt=_fmt2)
    return wrong


def _heading_t(f: Figure, s: str) -> None:
    """`f.heading` for a heading with a transpose in it (drawn by `text_t`)."""
    text_t(f, MARGIN, f.y, s, size=LABEL + 1, weight="bold", cls="heading")
    f.y += 14


def _op(f: Figure, x: float, y: float, s: str, color: str = INK) -> None:
    f.text(x, y + CELL / 2 + 6, s, size=LABEL + 4, anchor="middle", weight="bold", color=color, cls="label")


@figure("ch20-prenorm", title="Pre-Norm attention 子层",
        zh="Pre-Norm 子层:只有子层的输入被 RMSNorm 归一化,残差流携带未归一化的和。nano-vllm 把残差加法融合进下一个 "
           "norm:第 0 层用嵌入本身作残差,MLP 的输出到下一层的 input_layernorm 才被加上。公式是逻辑视图,融合只延迟加法,数据流不变。",
        en="The pre-norm sublayer: only the sublayer's input is normalised; the residual stream carries the raw sum. "
           "nano-vllm fuses the residual add into the next norm: layer 0 starts the residual with the embedding, and "
           "the MLP output is added by the next layer's input_layernorm. A fused add+norm may defer the add but "
           "keeps the data flow.",
        needs={"normed": "ch20.2"})
def prenorm_figure(f: Figure, r: dict) -> None:
    inputs, res_in = r["inputs"], r["residual_in"]
    normed, residual = r["normed"], r["residual"]
    normed_want, residual_want = r["normed_expected"], r["residual_expected"]

    # 1. The logical view.
    f.heading("逻辑视图 · the logical view of one sublayer: h′ = h + Sublayer(RMSNorm(h))")
    y = f.y + 30
    boxes = [("h", "block", 70), ("RMSNorm", "plain", 110), ("Attention / MLP", "attend", 150), ("+", "plain", 40),
             ("h′", "block", 70)]
    x, centers = MARGIN + 40, []
    for label, role, w in boxes:
        f.box(x, y, w, 34, role=role, label=label, rx=17 if label == "+" else 5)
        centers.append((x, x + w))
        x += w + 46
    for (a0, a1), (b0, _) in zip(centers, centers[1:]):
        f.arrow(a1 + 4, y + 17, b0 - 4, y + 17)
    hx, px = (centers[0][0] + centers[0][1]) / 2, (centers[3][0] + centers[3][1]) / 2
    skip = f.dwg.polyline([(hx, y), (hx, y - 20), (px, y - 20)], fill="none", stroke=stroke("block"), stroke_width=1.6,
                          class_="arrow")
    f.dwg.add(skip)
    f.arrow(px, y - 20, px, y - 2, color=stroke("block"), width=1.6)
    f.text((hx + px) / 2, y - 26, "residual: h goes on un-normalised", size=SMALL + 1, anchor="middle",
           color=stroke("block"), cls="label")
    f.text(centers[1][0], y + 52, "only the sublayer's input is normalised", size=SMALL + 1, color=MUTED, cls="label")
    f.y = y + 84

    # 2. The fused form, with the student's add_rms_norm.
    f.heading("nano-vllm 的融合形式 · the fused add + RMSNorm, three calls of your add_rms_norm (hidden 4, weight 1)")
    shown = [v for rows in (inputs, [r for r in res_in if r is not None], residual, residual_want, normed, normed_want)
             for row in rows for v in row]
    cw = max(text_width(_fmt(v), FUSED_SIZE, mono=True) for v in shown) + 2 * CELL_PAD + 2
    n = len(inputs[0])
    cw = min(cw, (f.width - 2 * MARGIN - 3 * 30) / (4 * n))       # at the least 30 between the groups
    gap = (f.width - 2 * MARGIN - 4 * n * cw) / 3
    groups = [MARGIN + i * (n * cw + gap) for i in range(4)]
    titles = ["x (sublayer output)", "residual in", "new residual = x + residual", "normed → the next sublayer"]
    top = f.y + 26
    for gx, title in zip(groups, titles):
        f.text(gx, top - 8, title, size=SMALL + 1, color=MUTED, cls="label")
    calls = [("layer 0 · input_layernorm", "add_rms_norm(e, None): x = the embedding e, no residual yet"),
             ("layer 0 · post_attention_layernorm", "add_rms_norm(a, residual): a = attention output (given)"),
             ("layer 1 · input_layernorm", "add_rms_norm(m, residual): m = MLP output, its add deferred")]
    row_h = CELL + 62
    wrong = False
    for k, (title, sub) in enumerate(calls):
        y = top + k * row_h + 22
        f.text(MARGIN, y - 8, title, size=LABEL, weight="bold", color=INK, cls="label")
        f.text(f.width - MARGIN, y - 8, sub, size=SMALL + 1, anchor="end", color=MUTED, cls="label")
        _row(f, groups[0], y, inputs[k], "token", cw, size=FUSED_SIZE)
        _op(f, groups[1] - gap / 2, y, "+")
        if res_in[k] is None:
            f.cell(groups[1], y, "None", role="masked", w=n * cw - 2, h=CELL, fmt=str, dashed=True)
        else:
            _row(f, groups[1], y, res_in[k], "block", cw, size=FUSED_SIZE)
        _op(f, groups[2] - gap / 2, y, "=")
        wrong |= _row(f, groups[2], y, residual[k], "block", cw, expected=residual_want[k], size=FUSED_SIZE)
        f.arrow(groups[3] - gap + 6, y + CELL / 2, groups[3] - 6, y + CELL / 2)
        wrong |= _row(f, groups[3], y, normed[k], "attend", cw, expected=normed_want[k], size=FUSED_SIZE)
        s = residual_want[k]
        rms = math.sqrt(sum(v * v for v in s) / len(s) + 1e-6)
        f.text(groups[3], y + CELL + 13, f"s / rms(s), rms(s) = {num(rms, 4)}", size=SMALL, mono=True, color=MUTED,
               cls="label")
        if k + 1 < len(calls):   # the new residual is the next call's residual input
            nx = top + (k + 1) * row_h + 22
            f.curve(groups[2] + n * cw / 2, y + CELL + 2, groups[1] + n * cw / 2, nx - 2, color=stroke("block"),
                    width=1.2)
    f.y = top + len(calls) * row_h + 8
    f.note("Layer 0 returns (MLP output, residual) without adding them; layer 1's input_layernorm performs that add "
           "(after the last layer, the final norm does). Every residual equals the logical h + sublayer outputs; "
           "the normalised value never enters the residual stream.", size=SMALL + 2, color=INK)
    f.legend([("token", "x: the sublayer output"), ("block", "the residual stream (raw sums)"),
              ("attend", "normalised: into the next sublayer only"), ("masked", "no residual yet (layer 0)")],
             wrong=wrong)


@figure("ch20-dim-swiglu", title="一个 token 的 SwiGLU",
        zh="一个 token 的 SwiGLU:合并投影得到 12 维的 gate_up,前 6 维是 gate、后 6 维是 up。SiLU(gate) 与 up "
           "逐元素相乘,再由 down 权重投影回 4 维 hidden;每个格子都是真实计算的值。",
        en="One token through SwiGLU: the merged projection gives a 12-wide gate_up whose first 6 channels are the "
           "gate and last 6 are up; SiLU(gate)·up elementwise, then the down weight projects back to hidden width 4. "
           "Every cell holds its computed value.",
        needs={"act": "ch20.3", "out": "ch20.4"})
def swiglu_figure(f: Figure, r: dict) -> None:
    x, w_gu, w_down, gu = r["x"], r["gate_up_weight"], r["down_weight"], r["gate_up"]
    act, act_want, out, out_want = r["act"], r["act_expected"], r["out"], r["out_expected"]
    hdim, two_i = len(x), len(gu)
    inter = two_i // 2
    f.instance_row([(f"hidden H = {hdim}", "token"), (f"intermediate I = {inter}", "plain"),
               (f"gate_up_weight [{two_i}, {hdim}]", "plain"), (f"down_weight [{hdim}, {inter}]", "plain")])
    label_w, cw = 176, 54
    left = MARGIN + label_w
    role = lambda c: "accent" if c < inter else "block"

    # ① the merged projection: Wᵀ with x along its rows, gate_up below.
    _heading_t(f, "① gate_up = x · W_gate_upᵀ: gate_up[c] = Σ_i x[i] · W[c, i]")
    top = f.y + 20
    for c in range(two_i):
        f.text(left + c * cw + cw / 2 - 1, top - 4, f"{'g' if c < inter else 'u'}{c % inter}", size=SMALL,
               anchor="middle", mono=True, color=stroke(role(c)), cls="label")
    for i in range(hdim):
        y = top + i * (CELL - 6)
        text_t(f, left - 10, y + (CELL - 6) / 2 + 4, f"x[{i}] = {_fmt(x[i])}  ×  Wᵀ row {i}", size=SMALL + 1,
               anchor="end", color=INK, mono=True, cls="label")
        for c in range(two_i):
            f.cell(left + c * cw, y, w_gu[c][i], role="plain", w=cw - 2, h=CELL - 8, size=SMALL + 1, fmt=_fmt)
    y = top + hdim * (CELL - 6) + 10
    f.text(left - 10, y + CELL / 2 + 4, "gate_up (12 wide)", size=LABEL, anchor="end", weight="bold", cls="label")
    for c in range(two_i):
        f.cell(left + c * cw, y, gu[c], role=role(c), w=cw - 2, h=CELL, fmt=_fmt, bold=True)
    f.bracket(left, left + inter * cw - 2, y + CELL + 4, "gate = gate_up[:6] (first half)", size=SMALL + 1)
    f.bracket(left + inter * cw, left + two_i * cw - 2, y + CELL + 4, "up = gate_up[6:] (second half)",
              size=SMALL + 1)
    f.y = y + CELL + 44

    # ② SiLU(gate) · up, under the gate columns.
    f.heading("② act = SiLU(gate) · up, with SiLU(z) = z · sigmoid(z)  (your silu_and_mul)")
    y = f.y + 8
    silu = [g / (1 + math.exp(-g)) for g in gu[:inter]]
    rows = [("SiLU(gate)", silu, "accent", None), ("× up", gu[inter:], "block", None),
            ("= act", act, "attend", act_want)]
    wrong = False
    for k, (label, vals, rl, want) in enumerate(rows):
        yy = y + k * (CELL + 6)
        f.text(left - 10, yy + CELL / 2 + 4, label, size=LABEL, anchor="end", weight="bold", cls="label")
        wrong |= _row(f, left, yy, vals, rl, cw, expected=want)
    f.curve(left + (inter + 0.5) * cw, y - 40, left + inter * cw + 6, y + CELL + 6 + CELL / 2, color=stroke("block"),
            width=1.1)
    f.text(left + (inter + 1.2) * cw, y + 14, "up[c] meets gate[c]: channel c of gate_up", size=SMALL,
           color=stroke("block"), cls="label")
    f.text(left + (inter + 1.2) * cw, y + 28, f"pairs with channel c + {inter}", size=SMALL, color=stroke("block"),
           cls="label")
    f.y = y + 3 * (CELL + 6) + 20

    # ③ the down projection: out[i] = Σ_j W_down[i, j] · act[j].
    _heading_t(f, "③ out = act · W_downᵀ: out[i] = Σ_j W_down[i, j] · act[j]  (your swiglu_mlp)")
    y = f.y + 8
    for i in range(hdim):
        yy = y + i * (CELL - 4)
        f.text(left - 10, yy + (CELL - 4) / 2 + 4, f"W_down row {i}", size=SMALL + 1, anchor="end", mono=True,
               color=INK, cls="label")
        for j in range(inter):
            f.cell(left + j * cw, yy, w_down[i][j], role="plain", w=cw - 2, h=CELL - 6, size=SMALL + 1, fmt=_fmt)
        f.text(left + inter * cw + 18, yy + (CELL - 4) / 2 + 4, "→", size=LABEL, anchor="middle", color=MUTED,
               cls="label")
        bad = not _close(out[i], out_want[i])
        wrong |= bad
        f.cell(left + inter * cw + 36, yy, out[i], role="token", w=2 * cw - 10, h=CELL - 6, wrong=bad,
               expected=out_want[i] if bad else None, fmt=_fmt, bold=True)
        f.text(left + inter * cw + 36 + 2 * cw, yy + (CELL - 4) / 2 + 4, f"out[{i}]", size=SMALL + 1, mono=True,
               color=MUTED, cls="label")
    f.y = y + hdim * (CELL - 4) + 18
    f.note(f"Widths: H = {hdim} → 2I = {two_i} → I = {inter} → H = {hdim}. Qwen3-0.6B: 1024 → 6144 → 3072 → 1024, "
           f"the same three steps for every token.", size=SMALL + 2, color=INK)
    f.legend([("token", "hidden (x, out)"), ("accent", "gate half"), ("block", "up half"),
              ("attend", "act = SiLU(gate)·up"), ("plain", "weights")], wrong=wrong)


@figure("ch20-swiglu-branches", title="SwiGLU 的两条支路",
        zh="SwiGLU 的两条投影支路:gate 支路经过 SiLU,与 up 支路逐元素相乘,再投影回 hidden。它是逐 token 的通道变换:"
           "第 t 行输出只取决于第 t 行输入,打乱 token 顺序,输出跟着同样打乱;FFN 自身不沿 token 维混合信息。",
        en="SwiGLU's two projection branches: the gate branch goes through SiLU, is multiplied elementwise with the "
           "up branch and projected back to hidden. A per-token channel transform: row t of the output depends "
           "only on row t of the input, so shuffling the tokens shuffles the outputs; the FFN never mixes tokens.",
        needs={"out": "ch20.4"})
def branches_figure(f: Figure, r: dict) -> None:
    x, gate, up, out, want = r["x"], r["gate"], r["up"], r["out"], r["expected"]
    order, out_p, want_p = r["order"], r["out_permuted"], r["expected_permuted"]
    n, hdim, inter = len(x), len(x[0]), len(gate[0])
    cw = 42
    xl = MARGIN + 30
    bl = xl + hdim * cw + 60
    yl = bl + inter * cw + 66
    f.heading("两条支路 · two branches, one row per token")
    top = f.y + 40
    band = n * (CELL - 4)
    gate_y, up_y = top, top + band + 56
    mid = (gate_y + up_y + band) / 2 - band / 2
    wrong = False

    def token_rows(x0: float, y0: float, rows: list, role: str, expected: list | None = None,
                   labels: list[str] | None = None) -> bool:
        bad = False
        for t, vals in enumerate(rows):
            yy = y0 + t * (CELL - 4)
            if labels:
                f.text(x0 - 8, yy + (CELL - 4) / 2 + 4, labels[t], size=SMALL + 1, anchor="end", mono=True,
                       color=MUTED, cls="label")
            bad |= _row2(f, x0, yy, vals, role, cw, expected=expected[t] if expected else None)
        return bad

    f.text(xl, mid - 10, f"X [{n}, {hdim}]", size=SMALL + 1, color=MUTED, cls="label")
    token_rows(xl, mid, x, "token", labels=[f"t{t}" for t in range(n)])
    f.text(bl, gate_y - 10, f"gate branch: SiLU(gate_proj(x))  [{n}, {inter}]", size=SMALL + 1, color=stroke("accent"),
           weight="bold", cls="label")
    token_rows(bl, gate_y, gate, "accent")
    f.text(bl, up_y - 10, f"up branch: up_proj(x)  [{n}, {inter}]", size=SMALL + 1, color=stroke("block"),
           weight="bold", cls="label")
    token_rows(bl, up_y, up, "block")
    for yy, role in ((gate_y, "accent"), (up_y, "block")):
        f.arrow(xl + hdim * cw + 6, mid + band / 2, bl - 8, yy + band / 2, color=stroke(role), width=1.4)
        f.arrow(bl + inter * cw + 4, yy + band / 2, yl - 10, mid + band / 2, color=stroke(role), width=1.4)
    f.text(yl, mid - 10, f"Y = your swiglu_mlp(X)  [{n}, {hdim}]", size=SMALL + 1, color=MUTED, cls="label")
    wrong |= token_rows(yl, mid, out, "token", expected=want)
    f.text(yl, mid + band + 18, "Y = down_proj(gate ⊙ up)", size=SMALL + 1, color=INK, cls="label")
    f.y = up_y + band + 36

    # The same tokens in another order: the outputs follow their tokens.
    f.heading(f"换一个顺序 · the same tokens in the order {order}: each output row follows its token")
    top = f.y + 26
    f.text(xl, top - 10, "X[order]", size=SMALL + 1, color=MUTED, cls="label")
    token_rows(xl, top, [x[t] for t in order], "token", labels=[f"t{t}" for t in order])
    f.arrow(xl + hdim * cw + 10, top + band / 2, yl - 10, top + band / 2, color=MUTED, width=1.4)
    f.text((xl + hdim * cw + yl) / 2, top + band / 2 - 8, "the same swiglu_mlp, the same weights", size=SMALL + 1,
           anchor="middle", color=MUTED, cls="label")
    f.text(yl, top - 10, "your swiglu_mlp(X[order])", size=SMALL + 1, color=MUTED, cls="label")
    wrong |= token_rows(yl, top, out_p, "token", expected=want_p)
    for k, t in enumerate(order):
        f.text(yl + hdim * cw + 8, top + k * (CELL - 4) + (CELL - 4) / 2 + 4, f"= Y t{t}", size=SMALL + 1,
               mono=True, color=MUTED, cls="label")
    f.y = top + band + 24
    f.note("Both projections and SiLU act along the channels of one row; nothing reduces over the token axis. "
           "Tokens meet only in attention, so the MLP of a batch is the MLP of each token.", size=SMALL + 2, color=INK)
    f.legend([("token", "tokens: X and Y rows"), ("accent", "gate branch (after SiLU)"), ("block", "up branch")],
             wrong=wrong)
