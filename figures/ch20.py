"""Figures of ch20 · pre-norm, RMSNorm, SwiGLU: the pre-norm sublayer and nano-vllm's fused add + norm,
one token through SwiGLU cell by cell, and the MLP's two branches acting on each token alone."""

from __future__ import annotations

import math
from typing import Sequence

from figures import figure
from figures.ch16 import text_t
from figures.kit import Figure, num, text_width
from figures.layout import Part, centred, column, pad, row, wide
from figures.style import CELL, INK, LABEL, MARGIN, MUTED, SMALL, VALUE, stroke
from grader.i18n import tr

FUSED_SIZE = VALUE - 1.5
"""The size of the values in the fused add + norm rows."""
CELL_PAD = 5
"""The least room between a value and either side of its cell."""


def _fmt(v) -> str:
    """3 significant digits with a real minus sign."""
    if isinstance(v, float):
        v = float(f"{v:.3g}")
    return num(v).replace("-", "−")


def _fmt2(v) -> str:
    return f"{v:.2f}".replace("-", "−") if isinstance(v, float) and v != int(v) else _fmt(v)


def _heading_t(f: Figure, s: str) -> None:
    """`f.heading` for a heading with a transpose in it (drawn by `text_t`)."""
    text_t(f, MARGIN, f.y, s, size=LABEL + 1, weight="bold", cls="heading")
    f.y += 14


def _op(f: Figure, x: float, y: float, s: str, color: str = INK) -> None:
    f.text(x, y + CELL / 2 + 6, s, size=LABEL + 4, anchor="middle", weight="bold", color=color, cls="label")


@figure(
    "ch20-prenorm",
    title="Pre-Norm attention 子层",
    zh="Pre-Norm 子层:只有子层的输入被 RMSNorm 归一化,残差流携带未归一化的和。nano-vllm 把残差加法融合进下一个 "
    "norm:第 0 层用嵌入本身作残差,MLP 的输出到下一层的 input_layernorm 才被加上。公式是逻辑视图,融合只延迟加法,数据流不变。",
    en="The pre-norm sublayer: only the sublayer's input is normalised; the residual stream carries the raw sum. "
    "nano-vllm fuses the residual add into the next norm: layer 0 starts the residual with the embedding, and "
    "the MLP output is added by the next layer's input_layernorm. A fused add+norm may defer the add but "
    "keeps the data flow.",
    needs={"normed": "ch20.2"},
)
def prenorm_figure(f: Figure, r: dict) -> None:
    inputs, res_in = r["inputs"], r["residual_in"]
    normed, residual = r["normed"], r["residual"]
    normed_want, residual_want = r["normed_expected"], r["residual_expected"]

    # 1. The logical view.
    f.heading(tr("the logical view of one sublayer: h′ = h + Sublayer(RMSNorm(h))"))
    y = f.y + 30
    boxes = [("h", "block", 70), ("RMSNorm", "plain", 110), ("Attention / MLP", "attend", 150), ("+", "plain", 40), ("h′", "block", 70)]
    x, centers = MARGIN + 40, []
    for label, role, w in boxes:
        f.box(x, y, w, 34, role=role, label=label, rx=17 if label == "+" else 5)
        centers.append((x, x + w))
        x += w + 46
    for (a0, a1), (b0, _) in zip(centers, centers[1:]):
        f.arrow(a1 + 4, y + 17, b0 - 4, y + 17)
    hx, px = (centers[0][0] + centers[0][1]) / 2, (centers[3][0] + centers[3][1]) / 2
    skip = f.dwg.polyline([(hx, y), (hx, y - 20), (px, y - 20)], fill="none", stroke=stroke("block"), stroke_width=1.6, class_="arrow")
    f.dwg.add(skip)
    f.arrow(px, y - 20, px, y - 2, color=stroke("block"), width=1.6)
    skip_label = tr("residual: h goes on un-normalised")
    f.text((hx + px) / 2, y - 26, skip_label, size=SMALL + 1, anchor="middle", color=stroke("block"), cls="label")
    f.text(centers[1][0], y + 52, tr("only the sublayer's input is normalised"), size=SMALL + 1, color=MUTED, cls="label")
    f.y = y + 84

    # 2. The fused form, with the student's add_rms_norm: one row of four groups per call.
    f.heading(tr("nano-vllm's fused add + RMSNorm: three calls of your add_rms_norm (hidden 4, weight 1)"))
    shown = [
        v
        for rows in (inputs, [r for r in res_in if r is not None], residual, residual_want, normed, normed_want)
        for row_ in rows
        for v in row_
    ]
    cw = max(text_width(_fmt(v), FUSED_SIZE, mono=True) for v in shown) + 2 * CELL_PAD + 2
    n = len(inputs[0])
    cw = min(cw, (f.width - 2 * MARGIN - 3 * 30) / (4 * n))  # at the least 30 between the groups
    gap = (f.width - 2 * MARGIN - 4 * n * cw) / 3 + 2

    def group(values: list, role: str, wrong: list | None = None, expected: list | None = None) -> Part:
        return f.vector(values, role=role, w=cw - 2, gap=2, size=FUSED_SIZE, fmt=_fmt, wrong=wrong, expected=expected)

    def joint(s: str) -> Part:
        """What joins two groups: "+", "=" or (empty) an arrow."""

        def draw(x: float, y: float) -> None:
            if s:
                _op(f, x + gap / 2, y, s)
            else:
                f.arrow(x + 6, y + CELL / 2, x + gap - 6, y + CELL / 2)

        return Part(gap, CELL, draw)

    calls = [
        (tr("layer 0 · input_layernorm"), tr("add_rms_norm(e, None): x = the embedding e, no residual yet")),
        (tr("layer 0 · post_attention_layernorm"), tr("add_rms_norm(a, residual): a = attention output (given)")),
        (tr("layer 1 · input_layernorm"), tr("add_rms_norm(m, residual): m = MLP output, its add deferred")),
    ]
    given, new = [], []  # each call's residual in, and the new residual it returns
    rows = []
    for k, (title, sub) in enumerate(calls):
        given.append(
            group(res_in[k], "block")
            if res_in[k] is not None
            else f.vector(["None"], role="masked", w=n * cw - 2, fmt=str, dashed=True, size=VALUE - 1)
        )
        new.append(group(residual[k], "block", r["residual_wrong"][k], residual_want[k]))
        s = residual_want[k]
        rms = math.sqrt(sum(v * v for v in s) / len(s) + 1e-6)
        sub_label = f.label(sub, color=MUTED)
        rows.append(
            column(
                row(wide(f.label(title, size=LABEL, color=INK, bold=True), f.width - 2 * MARGIN - sub_label.w), sub_label, gap=0),
                row(
                    group(inputs[k], "token"),
                    joint("+"),
                    given[k],
                    joint("="),
                    new[k],
                    joint(""),
                    column(
                        group(normed[k], "attend", r["normed_wrong"][k], normed_want[k]),
                        f.label(f"s / rms(s), rms(s) = {num(rms, 4)}", size=SMALL, mono=True),
                        gap=3,
                    ),
                    gap=0,
                ),
                gap=4,
            )
        )
    titles = row(
        *(
            wide(f.label(t), n * cw - 2 + gap)
            for t in [tr("x (sublayer output)"), tr("residual in"), tr("new residual = x + residual"), tr("normed → the next sublayer")]
        ),
        gap=0,
    )
    f.place(column(titles, column(*rows, gap=26), gap=6), after=32)
    for a, b in zip(new, given[1:]):  # the new residual is the next call's residual input
        f.curve(a.right - a.w / 2, a.bottom + 2, b.right - b.w / 2, b.bottom - b.h - 2, color=stroke("block"), width=1.2)
    f.note(
        tr(
            "Layer 0 returns (MLP output, residual) without adding them; layer 1's input_layernorm performs that add "
            "(after the last layer, the final norm does). Every residual equals the logical h + sublayer outputs; "
            "the normalised value never enters the residual stream."
        ),
        size=SMALL + 2,
        color=INK,
    )
    f.legend(
        [
            ("token", tr("x: the sublayer output")),
            ("block", tr("the residual stream (raw sums)")),
            ("attend", tr("normalised: into the next sublayer only")),
            ("masked", tr("no residual yet (layer 0)")),
        ],
        wrong=any(any(w) for w in r["normed_wrong"] + r["residual_wrong"]),
    )


@figure(
    "ch20-dim-swiglu",
    title="一个 token 的 SwiGLU",
    zh="一个 token 的 SwiGLU:合并投影得到 12 维的 gate_up,前 6 维是 gate、后 6 维是 up。SiLU(gate) 与 up "
    "逐元素相乘,再由 down 权重投影回 4 维 hidden;每个格子都是真实计算的值。",
    en="One token through SwiGLU: the merged projection gives a 12-wide gate_up whose first 6 channels are the "
    "gate and last 6 are up; SiLU(gate)·up elementwise, then the down weight projects back to hidden width 4. "
    "Every cell holds its computed value.",
    needs={"act": "ch20.3", "out": "ch20.4"},
)
def swiglu_figure(f: Figure, r: dict) -> None:
    x, w_gu, w_down, gu = r["x"], r["gate_up_weight"], r["down_weight"], r["gate_up"]
    act, act_want, out, out_want = r["act"], r["act_expected"], r["out"], r["out_expected"]
    hdim, two_i = len(x), len(gu)
    inter = two_i // 2
    f.instance_row(
        [
            (f"hidden H = {hdim}", "token"),
            (f"intermediate I = {inter}", "plain"),
            (f"gate_up_weight [{two_i}, {hdim}]", "plain"),
            (f"down_weight [{hdim}, {inter}]", "plain"),
        ]
    )
    label_w, cw = 176, 54
    left = MARGIN + label_w
    role = lambda c: "accent" if c < inter else "block"

    def labelled(rows: Sequence[tuple[str, Part]], *, size: float = SMALL + 1, mono: bool = True, bold: bool = False) -> None:
        """Each placed row's label, right-aligned before the cells (a transpose drawn as a raised T)."""
        for label, part in rows:
            text_t(
                f,
                left - 10,
                part.bottom - part.h / 2 + 4,
                label,
                size=size,
                anchor="end",
                mono=mono,
                color=INK,
                weight="bold" if bold else "normal",
                cls="label",
            )

    # ① the merged projection: Wᵀ with x along its rows, gate_up below.
    _heading_t(f, "① gate_up = x · W_gate_upᵀ: gate_up[c] = Σ_i x[i] · W[c, i]")
    names = row(
        *(
            centred(f.label(f"{'g' if c < inter else 'u'}{c % inter}", size=SMALL, mono=True, color=stroke(role(c))), cw - 2)
            for c in range(two_i)
        ),
        gap=2,
    )
    weights = [f.vector([w_gu[c][i] for c in range(two_i)], w=cw - 2, gap=2, h=CELL - 8, size=SMALL + 1, fmt=_fmt) for i in range(hdim)]
    gate_up = f.vector(gu, role=role, w=cw - 2, gap=2, size=VALUE, fmt=_fmt, bold=True)
    f.place(column(names, column(*weights, gap=2), gate_up, gap=8), x=left, after=44)
    labelled([(tr("x[{i}] = {x}  ×  Wᵀ row {i}", i=i, x=_fmt(x[i])), w) for i, w in enumerate(weights)])
    labelled([(tr("gate_up ({n} wide)", n=two_i), gate_up)], size=LABEL, mono=False, bold=True)
    f.bracket(left, left + inter * cw - 2, gate_up.bottom + 4, tr("gate = gate_up[:{i}] (first half)", i=inter), size=SMALL + 1)
    f.bracket(left + inter * cw, left + two_i * cw - 2, gate_up.bottom + 4, tr("up = gate_up[{i}:] (second half)", i=inter), size=SMALL + 1)

    # ② SiLU(gate) · up, under the gate columns.
    f.heading(tr("② act = SiLU(gate) · up, with SiLU(z) = z · sigmoid(z)  (your silu_and_mul)"))
    f.y += 8
    silu = [g / (1 + math.exp(-g)) for g in gu[:inter]]
    steps = [
        ("SiLU(gate)", f.vector(silu, role="accent", w=cw - 2, gap=2, fmt=_fmt, size=VALUE - 1)),
        ("× up", f.vector(gu[inter:], role="block", w=cw - 2, gap=2, fmt=_fmt, size=VALUE - 1)),
        ("= act", f.vector(act, role="attend", w=cw - 2, gap=2, fmt=_fmt, wrong=r["act_wrong"], expected=act_want, size=VALUE - 1)),
    ]
    f.place(column(*(part for _, part in steps), gap=6), x=left, after=20)
    labelled(steps, size=LABEL, mono=False, bold=True)
    up = steps[1][1]
    f.curve(left + (inter + 0.5) * cw, up.bottom - up.h - CELL - 46, up.right + 8, up.bottom - CELL / 2, color=stroke("block"), width=1.1)
    f.lines(
        tr("up[c] meets gate[c]: channel c of gate_up"), tr("pairs with channel c + {i}", i=inter), size=SMALL, color=stroke("block"), gap=1
    ).at(left + (inter + 1.2) * cw, up.bottom - up.h - CELL - 6 + 4)

    # ③ the down projection: out[i] = Σ_j W_down[i, j] · act[j].
    _heading_t(f, tr("③ out = act · W_downᵀ: out[i] = Σ_j W_down[i, j] · act[j]  (your swiglu_mlp)"))
    f.y += 8
    downs = [
        row(
            f.vector(w_down[i], w=cw - 2, gap=2, h=CELL - 6, size=SMALL + 1, fmt=_fmt),
            centred(f.label("→", size=LABEL), 38),
            f.vector(
                [out[i]],
                role="token",
                w=2 * cw - 10,
                h=CELL - 6,
                size=VALUE,
                fmt=_fmt,
                bold=True,
                wrong=[r["out_wrong"][i]],
                expected=[out_want[i]],
            ),
            pad(f.label(f"out[{i}]", mono=True), left=10),
            gap=0,
            align="middle",
        )
        for i in range(hdim)
    ]
    f.place(column(*downs, gap=2), x=left, after=18)
    labelled([(tr("W_down row {i}", i=i), part) for i, part in enumerate(downs)])
    f.note(
        tr(
            "Widths: H = {h} → 2I = {two_i} → I = {i} → H = {h}. Qwen3-0.6B: 1024 → 6144 → 3072 → 1024, "
            "the same three steps for every token.",
            h=hdim,
            two_i=two_i,
            i=inter,
        ),
        size=SMALL + 2,
        color=INK,
    )
    f.legend(
        [
            ("token", tr("hidden (x, out)")),
            ("accent", tr("gate half")),
            ("block", tr("up half")),
            ("attend", "act = SiLU(gate)·up"),
            ("plain", tr("weights")),
        ],
        wrong=any(r["act_wrong"]) or any(r["out_wrong"]),
    )


@figure(
    "ch20-swiglu-branches",
    title="SwiGLU 的两条支路",
    zh="SwiGLU 的两条投影支路:gate 支路经过 SiLU,与 up 支路逐元素相乘,再投影回 hidden。它是逐 token 的通道变换:"
    "第 t 行输出只取决于第 t 行输入,打乱 token 顺序,输出跟着同样打乱;FFN 自身不沿 token 维混合信息。",
    en="SwiGLU's two projection branches: the gate branch goes through SiLU, is multiplied elementwise with the "
    "up branch and projected back to hidden. A per-token channel transform: row t of the output depends "
    "only on row t of the input, so shuffling the tokens shuffles the outputs; the FFN never mixes tokens.",
    needs={"out": "ch20.4"},
)
def branches_figure(f: Figure, r: dict) -> None:
    x, gate, up, out, want = r["x"], r["gate"], r["up"], r["out"], r["expected"]
    order, out_p, want_p = r["order"], r["out_permuted"], r["expected_permuted"]
    n, hdim, inter = len(x), len(x[0]), len(gate[0])
    cw = 42
    xl = MARGIN + 30
    bl = xl + hdim * cw + 60
    yl = bl + inter * cw + 66
    f.heading(tr("two branches, one row per token"))
    top = f.y + 40
    band = n * (CELL - 4)
    gate_y, up_y = top, top + band + 56
    mid = (gate_y + up_y + band) / 2 - band / 2

    def token_rows(
        x0: float,
        y0: float,
        rows: list,
        role: str,
        wrong: list | None = None,
        expected: list | None = None,
        labels: list[str] | None = None,
    ) -> None:
        """A block of token rows (values to 2 decimals) with its top-left at (x0, y0); `wrong`: the check's
        verdict per value."""
        column(
            *(
                f.vector(
                    vals,
                    role=role,
                    w=cw - 2,
                    gap=2,
                    h=CELL - 6,
                    size=SMALL + 1,
                    fmt=_fmt2,
                    wrong=wrong[t] if wrong else None,
                    expected=expected[t] if expected else None,
                )
                for t, vals in enumerate(rows)
            ),
            gap=2,
        ).at(x0, y0)
        for t, label in enumerate(labels or []):
            f.text(
                x0 - 8, y0 + t * (CELL - 4) + (CELL - 4) / 2 + 4, label, size=SMALL + 1, anchor="end", mono=True, color=MUTED, cls="label"
            )

    f.text(xl, mid - 10, f"X [{n}, {hdim}]", size=SMALL + 1, color=MUTED, cls="label")
    token_rows(xl, mid, x, "token", labels=[f"t{t}" for t in range(n)])
    f.text(
        bl,
        gate_y - 10,
        tr("gate branch: SiLU(gate_proj(x))  [{n}, {i}]", n=n, i=inter),
        size=SMALL + 1,
        color=stroke("accent"),
        weight="bold",
        cls="label",
    )
    token_rows(bl, gate_y, gate, "accent")
    up_label = tr("up branch: up_proj(x)  [{n}, {i}]", n=n, i=inter)
    f.text(bl, up_y - 10, up_label, size=SMALL + 1, color=stroke("block"), weight="bold", cls="label")
    token_rows(bl, up_y, up, "block")
    for yy, role in ((gate_y, "accent"), (up_y, "block")):
        f.arrow(xl + hdim * cw + 6, mid + band / 2, bl - 8, yy + band / 2, color=stroke(role), width=1.4)
        f.arrow(bl + inter * cw + 4, yy + band / 2, yl - 10, mid + band / 2, color=stroke(role), width=1.4)
    f.text(yl, mid - 10, tr("Y = your swiglu_mlp(X)  [{n}, {h}]", n=n, h=hdim), size=SMALL + 1, color=MUTED, cls="label")
    token_rows(yl, mid, out, "token", r["wrong"], want)
    f.text(yl, mid + band + 18, "Y = down_proj(gate ⊙ up)", size=SMALL + 1, color=INK, cls="label")
    f.y = up_y + band + 36

    # The same tokens in another order: the outputs follow their tokens.
    f.heading(tr("the same tokens in the order {order}: each output row follows its token", order=order))
    top = f.y + 26
    f.text(xl, top - 10, "X[order]", size=SMALL + 1, color=MUTED, cls="label")
    token_rows(xl, top, [x[t] for t in order], "token", labels=[f"t{t}" for t in order])
    f.arrow(xl + hdim * cw + 10, top + band / 2, yl - 10, top + band / 2, color=MUTED, width=1.4)
    f.text(
        (xl + hdim * cw + yl) / 2,
        top + band / 2 - 8,
        tr("the same swiglu_mlp, the same weights"),
        size=SMALL + 1,
        anchor="middle",
        color=MUTED,
        cls="label",
    )
    f.text(yl, top - 10, tr("your swiglu_mlp(X[order])"), size=SMALL + 1, color=MUTED, cls="label")
    token_rows(yl, top, out_p, "token", r["wrong_permuted"], want_p)
    for k, t in enumerate(order):
        f.text(
            yl + hdim * cw + 8, top + k * (CELL - 4) + (CELL - 4) / 2 + 4, f"= Y t{t}", size=SMALL + 1, mono=True, color=MUTED, cls="label"
        )
    f.y = top + band + 24
    f.note(
        tr(
            "Both projections and SiLU act along the channels of one row; nothing reduces over the token axis. "
            "Tokens meet only in attention, so the MLP of a batch is the MLP of each token."
        ),
        size=SMALL + 2,
        color=INK,
    )
    f.legend(
        [("token", tr("tokens: X and Y rows")), ("accent", tr("gate branch (after SiLU)")), ("block", tr("up branch"))],
        wrong=any(any(w) for w in r["wrong"] + r["wrong_permuted"]),
    )
