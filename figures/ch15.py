"""Figures of ch15 · token ids to logits: an embedding lookup, the fused QKV projection and its split,
the projection widths of Qwen3-0.6B, the six checkpoints of a prefill step, and tensor parallelism.

The checks decide what is wrong: every figure marks the cells the check's own verdict (`…wrong`) names."""

from __future__ import annotations

from typing import Callable

from figures import figure
from figures.kit import Figure, Grid, num, text_width
from figures.layout import Part, column, pad, row, space, wide
from figures.style import INK, LABEL, LABEL_SMALL, MARGIN, MUTED, SMALL, stroke
from grader.i18n import tr

RANK = ("token", "block")  # the kit has no rank roles: rank 0 sky blue, rank 1 purple, always labelled
ROW, ID_STEP, OUT_STEP = 34, 1.6, 46
"""ch15-dim-embedding: a row's height; ids are ID_STEP rows apart and output rows OUT_STEP px (grader/lab/ch15.py
sizes its instances by them)."""


TITLE = LABEL_SMALL + 0.5  # a panel's title, a little smaller than the kit's default


def _title(f: Figure, s: str, *, color: str = INK) -> Part:
    """A panel's bold title, as `f.titled` draws it, for a panel laid out by hand."""
    return f.label(s, size=TITLE, color=color, bold=True, cls="heading")


def _any(wrong) -> bool:
    """Whether a verdict (nested lists of bools, or None) marks anything wrong."""
    return bool(wrong) and (any(_any(w) for w in wrong) if isinstance(wrong, list) else bool(wrong))


# -- ch15-dim-embedding ----------------------------------------------------------------------------------


@figure(
    "ch15-dim-embedding",
    title="查表不是 reshape",
    zh="ids = [2, 0, 4] 从 E[6, 4] 中读出第 2、0、4 行,得到 X[1, 3, 4]:输入是 3 个整数下标,输出是 3 × 4 = 12 个浮点数。"
    "查表按 id 选行,而不是把 E 重新排成另一个形状。",
    en="ids = [2, 0, 4] read rows 2, 0 and 4 of E[6, 4] to give X[1, 3, 4]: 3 integer indices go in, "
    "3 × 4 = 12 floats come out. A lookup selects rows by id; it is not a reshape of E.",
    needs={"out": "ch15.1"},
)
def embedding_figure(f: Figure, r: dict) -> None:
    table, ids, out, expected, wrong = r["table"], r["ids"][0], r["out"][0], r["expected"][0], r["wrong"][0]
    V, H, n = len(table), len(table[0]), len(ids)
    read = set(ids)
    f.instance_row(
        [
            (tr("E: V = {V} rows × H = {H}", V=V, H=H), "plain"),
            (f"ids [1, {n}] = [[{', '.join(map(str, ids))}]]", "token"),
            (f"X = E[ids]: [1, {n}, {H}]", "plain"),
        ]
    )
    count = lambda s: f.label(s, size=LABEL_SMALL + 0.5, color=stroke("token"), bold=True)
    ids_cells = f.matrix([[tok] for tok in ids], role="token", row_labels=[f"t{t}" for t in range(n)], w=40, h=ROW, gap=(ID_STEP - 1) * ROW)
    names = f.table([[(tr("row {i}", i=i), {"color": INK if i in read else MUTED})] for i in range(V)], h=ROW, size=LABEL_SMALL)
    rows_of_e = f.matrix(table, role=lambda i, j: "token" if i in read else "plain", w=46, h=ROW)
    outs = [f.matrix([out[t]], role="token", expected=[expected[t]], wrong=[wrong[t]], w=46, h=ROW) for t in range(n)]
    checked = r.get("checked", True)  # not compared: the rule, not a claim about yours
    sources = f.table(
        [[f"= E[{tok}]" if checked else tr("should be E[{tok}]", tok=tok)] for tok in ids],
        h=OUT_STEP,
        size=LABEL_SMALL,
        mono=True,
        color=MUTED,
    )
    f.place(
        row(
            column(_title(f, "ids[0, t]"), ids_cells, count(tr("{n} ints in", n=n)), gap=8, align="center"),
            f.titled(tr("E [{V}, {H}] (row r holds 10(r+1)+1 … 10(r+1)+{H})", V=V, H=H), row(names, rows_of_e, gap=8), size=TITLE),
            f.titled(
                tr("your X[0] (X is [1, {n}, {H}])", n=n, H=H),
                row(
                    column(
                        pad(column(*outs, gap=OUT_STEP - ROW), top=ROW / 2),
                        count(tr("{n} × {H} = {total} floats out", n=n, H=H, total=n * H)),
                        gap=14,
                        align="center",
                    ),
                    pad(sources, top=(ROW - OUT_STEP) / 2 + ROW / 2),
                    gap=8,
                ),
                size=TITLE,
            ),
            gap=100,
        ),
        x=MARGIN + 40,
        after=36,
    )
    for t, tok in enumerate(ids):  # each id to its row of E, and that row to the output
        ix, iy, iw, _ = ids_cells.cell_box(t, 0)
        ex, ey, _, _ = rows_of_e.cell_box(tok, 0)
        ox, oy, _, _ = outs[t].cell_box(0, 0)
        f.arrow(ix + iw + 2, iy + ROW / 2, ex - names.w - 20, ey + ROW / 2, color=stroke("token"), width=1.3)
        f.arrow(rows_of_e.cell_box(tok, H)[0] + 4, ey + ROW / 2, ox - 6, oy + ROW / 2, color=stroke("token"), width=1.3)
    f.note(
        tr(
            "In: {n} integer ids (shape [1, {n}]). Out: {n} rows × {H} = {total} floats (shape [1, {n}, {H}]). "
            "E itself holds {V} × {H} = {size} floats. A reshape keeps every number and only regroups them; a "
            "lookup copies one whole row of H = {H} per id, in the order of the ids, and repeats a row when an id "
            "repeats.",
            n=n,
            H=H,
            V=V,
            total=n * H,
            size=V * H,
        ),
        color=INK,
        size=SMALL + 2,
    )
    f.y += 4
    f.legend([("token", tr("the ids and the rows they read")), ("plain", tr("rows no id reads"))], wrong=_any(wrong))


# -- ch15-dim-qkv-linear ---------------------------------------------------------------------------------


@figure(
    "ch15-dim-qkv-linear",
    title="收缩轴与 Linear.weight 转置约定",
    zh="X[3, 4] 乘以 Wᵀ 得到 Y[3, 8]:W 按 nn.Linear 的约定存成 [out, in] = [8, 4],计算时用 x·Wᵀ;"
    "求和沿 in = 4 这一轴进行。Y 的 8 列依次是 Q 的 4 列(2 个头 × head_dim 2)、K 的 2 列、V 的 2 列。",
    en="X[3, 4] @ W.T gives Y[3, 8]: Linear.weight is stored [out, in] = [8, 4] and applied as x @ W.T, so "
    "the sum runs over the contraction axis in = 4. Y's 8 columns: Q's 4 (2 heads × head_dim 2), K's 2, "
    "V's 2.",
    needs={"y": "ch15.2", "q": "ch15.3"},
)
def qkv_linear_figure(f: Figure, r: dict) -> None:
    x, w, y, y_want = r["x"], r["weight"], r["y"], r["y_expected"]
    nh, nkv, d = r["num_heads"], r["num_kv_heads"], r["head_dim"]
    sizes = [nh * d, nkv * d, nkv * d]
    roles = ["q"] * sizes[0] + ["k"] * sizes[1] + ["v"] * sizes[2]
    out_f, in_f, T = len(w), len(w[0]), len(x)
    c = 34
    f.instance_row(
        [
            (f"num_heads = {nh}", "q"),
            (f"num_kv_heads = {nkv}", "k"),
            (f"head_dim = {d}", "plain"),
            (f"out = ({nh} + 2·{nkv})·{d} = {out_f}", "plain"),
            (f"in = {in_f}", "plain"),
        ]
    )
    # Stored W [out, in] on the left; the product laid out as X | Y with Wᵀ above Y.
    stored = f.matrix(w, role=lambda i, j: roles[i], w=30, h=26)
    stored_rows = f.table([[(name, {"color": stroke(name), "mono": True})] for name in roles], h=26, size=LABEL_SMALL)
    wt = f.matrix([[w[j][i] for j in range(out_f)] for i in range(in_f)], role=lambda i, j: roles[j], w=c, h=c)
    xs = f.matrix(x, role="token", row_labels=[f"t{i}" for i in range(T)], w=c, h=c)
    ys = f.matrix(y, role=lambda i, j: roles[j], expected=y_want, wrong=r["y_wrong"], w=c, h=c)
    x_panel = f.titled(f"X [{T}, {in_f}]", xs, size=TITLE)
    f.y += 16
    f.place(
        row(
            f.titled(
                tr("W as stored: [out, in] = [{o}, {i}]", o=out_f, i=in_f),
                column(row(stored_rows, stored, gap=6), f.label(tr("row j = output feature j")), gap=8, align="center"),
                size=TITLE,
            ),
            column(
                row(space(x_panel.w), f.titled(f"Wᵀ = W.T: [in, out] = [{in_f}, {out_f}]", wt, size=TITLE), gap=40),
                row(x_panel, f.titled(tr("your Y = X·Wᵀ = linear(X, W): [{T}, {o}]", T=T, o=out_f), ys, size=TITLE), gap=40),
                gap=16,
            ),
            gap=70,
        ),
        after=70,
    )
    wx, wy, _, _ = wt.cell_box(0, 0)
    f.vbracket(wx - 6, wy, wt.cell_box(in_f, 0)[1], f"in = {in_f}", side="left", color=stroke("accent"))
    f.arrow(stored.right + 8, stored.cell_box(1, 0)[1], wx - 24 - text_width(f"in = {in_f}", LABEL_SMALL), wy + in_f * c / 2, width=1.2)
    f.text((stored.right + wx) / 2 - 20, stored.cell_box(1, 0)[1] - 12, tr("transpose (a view)"), size=SMALL, anchor="middle", color=MUTED)
    # The contraction axis under X; the column groups of Y, and the student's split below them.
    f.bracket(xs.cell_box(0, 0)[0], xs.right, xs.bottom + 4, tr("in = {n}: summed", n=in_f), color=stroke("accent"))
    first = [sum(sizes[:k]) for k in range(3)]
    for name, start, size in zip("qkv", first, sizes):
        f.bracket(ys.cell_box(0, start)[0] + 2, ys.cell_box(0, start + size)[0] - 2, ys.bottom + 6, f"{name}: {size}", color=stroke(name))
    parts = [f.matrix(r[name], role=name, expected=r[f"{name}_expected"], wrong=r[f"{name}_wrong"], w=c, h=c) for name in "qkv"]
    caption = column(
        f.label(f"split_qkv(Y, {nh}, {nkv}, {d})", size=LABEL_SMALL + 0.5, mono=True, color=INK),
        f.label(tr("your split of the expected Y"), size=SMALL),
        gap=4,
        align="right",
    )
    split = row(
        *(
            column(
                _title(f, tr("your {name} [{T}, {size}]", name=name.upper(), T=T, size=size), color=stroke(name)),
                part,
                gap=8,
                align="center",
            )
            for name, size, part in zip("qkv", sizes, parts)
        ),
        gap=18,
    )
    f.place(row(caption, split, gap=14, align="middle"), x=ys.cell_box(0, 0)[0] - 18 - 14 - caption.w)
    for name, start, size, part in zip("qkv", first, sizes, parts):
        px, py, _, _ = part.cell_box(0, 0)
        f.arrow(ys.cell_box(0, start)[0] + size * c / 2, ys.bottom + 32, px + size * c / 2, py - 24, color=stroke(name), width=1.2)
    terms = " + ".join(f"{num(a)}·{num(b)}" for a, b in zip(x[0], w[0]))
    f.note(
        tr(
            "Y[0, 0] = Σ_c X[0, c]·W[0, c] = {terms} = {want} (yours: {yours}). The sum runs "
            "over in, the last axis of X and of the stored W: row j of W is output feature j.",
            terms=terms,
            want=num(y_want[0][0]),
            yours=num(y[0][0]),
        ),
        color=INK,
        size=SMALL + 2,
    )
    f.y += 4
    f.legend(
        [("token", tr("X: one row per token")), ("q", tr("Q columns")), ("k", tr("K columns")), ("v", tr("V columns"))],
        wrong=any(_any(r[key]) for key in ("y_wrong", "q_wrong", "k_wrong", "v_wrong")),
    )


# -- ch15-qwen3-widths ------------------------------------------------------------------------------


@figure(
    "ch15-qwen3-widths",
    title="Qwen3-0.6B 的投影宽度",
    zh="Qwen3-0.6B 每个投影的权重形状 [out, in] 都由 config 推出。head_dim = 128 是 config 里的值,"
    "不是 hidden / 头数 = 1024 / 16 = 64;所以注意力宽度 16 × 128 = 2048 大于 hidden 1024。",
    en="The projection widths of Qwen3-0.6B, from its config: every weight's [out, in] shape. head_dim = 128 is "
    "a config value, not hidden / heads = 1024 / 16 = 64, so the attention width 16 × 128 = 2048 exceeds "
    "hidden = 1024.",
    needs={"shapes": "ch15.4"},
)
def qwen3_widths_figure(f: Figure, r: dict) -> None:
    c, shapes, expected = r["config"], r["shapes"], r["expected"]
    H, I, V, d = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["head_dim"]
    Hq, Hkv, tied = c["num_attention_heads"], c["num_key_value_heads"], c["tie_word_embeddings"]
    f.instance_row(
        [
            (tr("hidden H = {H}", H=H), "plain"),
            (tr("heads Hq = {Hq}", Hq=Hq), "q"),
            (tr("kv heads Hkv = {Hkv}", Hkv=Hkv), "k"),
            (f"head_dim d = {d}", "accent"),
            (tr("intermediate I = {I}", I=I), "plain"),
            (tr("vocab V = {V}", V=V), "token"),
            (f"tie_word_embeddings = {tied}", "token"),
        ]
    )
    f.note(
        tr(
            "head_dim comes from the config: d = {d}. Deriving it as H / Hq = {H} / {Hq} = {g} would shrink "
            "qkv_proj to [{qkv}, {H}], o_proj to [{H}, {o}] and change the attention scale from 1/√{d} to 1/√{g}.",
            d=d,
            H=H,
            Hq=Hq,
            g=H // Hq,
            qkv=(Hq + 2 * Hkv) * (H // Hq),
            o=Hq * (H // Hq),
        ),
        color=INK,
        size=SMALL + 2,
    )
    f.y += 6
    f.heading(tr("each weight as stored, [out, in] (your values)"))
    rows = [
        ("embed_tokens", tr("a table: one row per token id"), "[V, H]", "token"),
        ("qkv_proj", tr("q | k | v packed: ({Hq} + 2·{Hkv})·{d} rows", Hq=Hq, Hkv=Hkv, d=d), "[(Hq + 2·Hkv)·d, H]", "q"),
        ("o_proj", tr("attention output {Hq}·{d} → H", Hq=Hq, d=d), "[H, Hq·d]", "q"),
        ("q_norm", tr("RMSNorm weight over one head"), "[d]", "accent"),
        ("k_norm", tr("RMSNorm weight over one head"), "[d]", "accent"),
        ("gate_up_proj", tr("gate | up packed: 2·{I} rows", I=I), "[2·I, H]", "plain"),
        ("down_proj", tr("intermediate {I} → H", I=I), "[H, I]", "plain"),
        ("lm_head", tr("tied: it is embed_tokens.weight") if tied else tr("untied: its own matrix"), "[V, H]", "token"),
    ]
    x_name, x_cells, x_sym, x_note = MARGIN, MARGIN + 120, MARGIN + 300, MARGIN + 450
    cw, ch = 84, 28
    y = f.y + 20
    for k, label in enumerate(("out", "in")):
        f.text(x_cells + k * cw + (cw - 4) / 2, y - 6, label, size=SMALL + 1, anchor="middle", color=MUTED, cls="label")
    f.text(x_sym, y - 6, tr("from the config"), size=SMALL + 1, color=MUTED, cls="label")
    wrong = False
    for name, note, sym, role in rows:
        f.text(x_name, y + ch / 2 + 4, name, size=LABEL, mono=True, weight="bold", cls="label")
        got, want = shapes[name], expected[name]
        for k, v in enumerate(got):
            bad = k >= len(want) or v != want[k]
            wrong |= bad
            f.cell(
                x_cells + k * cw, y, v, role=role, w=cw - 4, h=ch, wrong=bad, expected=(want[k] if k < len(want) else "—") if bad else None
            )
        if len(got) < len(want):
            wrong = True
            f.text(
                x_cells + len(got) * cw + 2,
                y + ch / 2 + 4,
                tr("✗ expected {want}", want=want),
                size=SMALL,
                color=stroke("wrong"),
                cls="label",
            )
        f.text(x_sym, y + ch / 2 + 4, sym, size=SMALL + 1, mono=True, color=MUTED, cls="label")
        f.text(x_note, y + ch / 2 + 4, note, size=SMALL + 1, color=MUTED, cls="label")
        y += ch + 6
    f.y = y + 22
    # One token's widths through a layer, to scale, read from the student's shapes.
    f.heading(tr("one token's width through a layer, to scale (your shapes)"))
    q_w, kv_w = Hq * d, Hkv * d
    bars = [
        ("hidden h", H, H, [(H, "plain", f"H = {H}")]),
        (
            "qkv_proj(h)",
            shapes["qkv_proj"][0],
            expected["qkv_proj"][0],
            [(q_w, "q", f"q {Hq}·{d} = {q_w}"), (kv_w, "k", f"k {Hkv}·{d}"), (kv_w, "v", f"v {Hkv}·{d}")],
        ),
        (
            tr("attention output"),
            shapes["o_proj"][-1],
            expected["o_proj"][-1],
            [(q_w, "q", tr("{Hq} heads · {d} = {w}", Hq=Hq, d=d, w=q_w))],
        ),
        ("o_proj(·)", shapes["o_proj"][0], expected["o_proj"][0], [(H, "plain", f"{H}")]),
        ("gate_up_proj(h)", shapes["gate_up_proj"][0], expected["gate_up_proj"][0], [(I, "plain", f"gate {I}"), (I, "plain", f"up {I}")]),
        ("SiLU(gate) · up", shapes["down_proj"][-1], expected["down_proj"][-1], [(I, "plain", f"I = {I}")]),
        ("down_proj(·)", shapes["down_proj"][0], expected["down_proj"][0], [(H, "plain", f"{H}")]),
    ]
    x0 = MARGIN + 140
    scale = (f.width - MARGIN - x0 - 150) / max(want for _, _, want, _ in bars)
    y = f.y + 8
    for label, got, want, segments in bars:
        f.text(MARGIN, y + 15, label, size=SMALL + 1.5, mono=True, cls="label")
        if got == want:
            x = x0
            for width, role, text in segments:
                f.box(x, y, width * scale, 22, role=role, rx=2)
                f.text(x + width * scale / 2, y + 15, text, size=SMALL, anchor="middle", mono=True, cls="label")
                x += width * scale
            if len(segments) > 1:
                f.text(x + 8, y + 15, f"= {got}", size=SMALL + 1, mono=True, color=MUTED, cls="label")
        else:
            wrong = True
            outline = f.dwg.rect((x0, y), (want * scale, 22), fill="none", stroke=INK, stroke_width=1, class_="expected-bar")
            outline["stroke-dasharray"] = "3,2"
            f.dwg.add(outline)
            f.dwg.add(
                f.dwg.rect(
                    (x0, y + 3),
                    (max(got, 0) * scale, 16),
                    fill="url(#hatch-wrong)",
                    stroke=stroke("wrong"),
                    stroke_width=1.5,
                    class_="bar wrong",
                )
            )
            f.text(
                x0 + max(got, want) * scale + 8,
                y + 15,
                tr("yours {got}, expected {want}", got=got, want=want),
                size=SMALL,
                color=stroke("wrong"),
                cls="value wrong",
            )
        y += 30
    f.y = y + 14
    f.legend(
        [
            ("q", tr("q and the attention width")),
            ("k", "k"),
            ("v", "v"),
            ("accent", tr("head_dim, from the config")),
            ("token", tr("vocabulary-sized")),
            ("plain", tr("hidden and MLP widths")),
        ],
        wrong=wrong,
    )


# -- ch15-checkpoints -------------------------------------------------------------------------------


@figure(
    "ch15-checkpoints",
    title="token 到 logits 的六个检查点",
    zh="一次 prefill 从 token 到 logits 的六个检查点。变长 batch 被压平成 [总 token 数, H],不做 padding;"
    "只有每个请求的最后一个 token(cu_seqlens_q[1:] − 1 这些行)进入 lm_head,所以 logits 是 [B, V] 而不是 [N, V]。",
    en="Six checkpoints from token ids to logits in one prefill step. The varlen batch is flattened to "
    "[total_tokens, H] with no padding; only each request's last token (rows cu_seqlens_q[1:] − 1) reaches "
    "the LM head, so the logits are [B, V], not [N, V].",
    needs={"shapes": "ch15.5"},
)
def checkpoints_figure(f: Figure, r: dict) -> None:
    lens, H, V = r["prompt_lens"], r["hidden_size"], r["vocab_size"]
    names, shapes, expected = r["names"], r["shapes"], r["expected"]
    N, B = sum(lens), len(lens)
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    last = [e - 1 for e in cu[1:]]
    owner = [b for b, n in enumerate(lens) for _ in range(n)]
    f.instance_row(
        [
            (f"prompt_lens = {lens}", "token"),
            (tr("N = {sum} = {N} tokens", sum=" + ".join(map(str, lens)), N=N), "plain"),
            (tr("B = {B} requests", B=B), "plain"),
            (f"cu_seqlens_q = {cu}", "plain"),
            (f"H = {H}, V = {V}", "plain"),
        ]
    )
    steps = [
        tr("the prompts, concatenated"),
        tr("embed_tokens: a row per id"),
        tr("through every decoder layer"),
        tr("the final RMSNorm"),
        tr("rows cu_seqlens_q[1:] − 1 = {last}", last=last),
        tr("lm_head: x @ W.T (W [V, H])"),
    ]
    x_name, x_shape, x_strip = MARGIN, MARGIN + 215, MARGIN + 450
    row_h, sq = 52, 30
    y = f.y + 10
    f.text(x_shape, y - 4, tr("your shape"), size=SMALL + 1, color=MUTED, cls="label")
    f.text(x_strip, y - 4, tr("rows of the tensor (colour: request)"), size=SMALL + 1, color=MUTED, cls="label")
    y += 8
    wrong = False
    centers_above: list[float] = []
    for k, (name, shape, want) in enumerate(zip(names, shapes, expected)):
        f.text(x_name, y + 14, f"{k + 1}  {name}", size=LABEL, mono=True, weight="bold", cls="label")
        f.text(x_name + 16, y + 31, steps[k], size=SMALL, color=MUTED, cls="label")
        for j, v in enumerate(shape):
            bad = j >= len(want) or v != want[j]
            wrong |= bad
            f.cell(
                x_shape + j * 76,
                y + 2,
                v,
                role="plain",
                w=72,
                h=sq,
                wrong=bad,
                expected=(want[j] if j < len(want) else "—") if bad else None,
            )
        if len(shape) < len(want):
            wrong = True
            f.text(
                x_shape + len(shape) * 76 + 4, y + 22, tr("✗ expected {want}", want=want), size=SMALL, color=stroke("wrong"), cls="label"
            )
        rows = shape[0] if shape else 0
        ok_rows = bool(want) and rows == want[0]
        shown = min(rows, 12)
        if k < 4:
            labels = [f"t{i}" for i in range(shown)]
            roles = [RANK[owner[i] % 2] if i < N else "plain" for i in range(shown)]
        else:
            labels = [f"t{last[b]}" if b < B else "?" for b in range(shown)]
            roles = [RANK[b % 2] if b < B else "plain" for b in range(shown)]
        centers = []
        for i in range(shown):
            cx = x_strip + i * (sq + 6)
            if ok_rows:
                f.cell(cx, y + 2, labels[i], role=roles[i], w=sq, h=sq, fmt=str, size=SMALL + 1)
            else:
                f.cell(
                    cx,
                    y + 2,
                    labels[i] if i < len(labels) else "",
                    role="plain",
                    w=sq,
                    h=sq,
                    fmt=str,
                    size=SMALL + 1,
                    wrong=True,
                    expected="",
                )
            centers.append(cx + sq / 2)
        if k == 5:
            f.text(x_strip + shown * (sq + 6) + 4, y + 22, tr("each row {V} logits wide", V=V), size=SMALL, color=MUTED, cls="label")
        elif k in (1, 2, 3, 4):
            f.text(x_strip + shown * (sq + 6) + 4, y + 22, tr("each row {H} wide", H=H), size=SMALL, color=MUTED, cls="label")
        if k == 4 and len(centers_above) >= N:
            for b, center in enumerate(centers[:B]):
                f.arrow(centers_above[last[b]], y - row_h + sq + 4, center, y, color=stroke("accent"), width=1.4)
        elif k > 0 and centers_above:
            f.arrow(x_name + 6, y - row_h + 38, x_name + 6, y + 2, color=MUTED, width=1)
        centers_above = centers
        y += row_h
    f.y = y + 6
    f.note(
        tr(
            "The LM head keeps {B} rows of {N}: the last token of each request ({rows}), "
            "because only that token predicts the request's next token. Logits for all {N} tokens would be "
            "[{N}, {V}], {all} numbers instead of {kept}.",
            B=B,
            N=N,
            V=V,
            rows=", ".join("t" + str(i) for i in last),
            all=format(N * V, ","),
            kept=format(B * V, ","),
        ),
        color=INK,
        size=SMALL + 2,
    )
    f.y += 4
    f.legend(
        [
            (RANK[0], tr("request 0's tokens")),
            (RANK[1], tr("request 1's tokens")),
            ("accent", tr("arrows: the last-token rows kept")),
            ("plain", tr("shape dimensions")),
        ],
        wrong=wrong,
    )


# -- ch15-dim-tensor-parallel ----------------------------------------------------------------------------


@figure(
    "ch15-dim-tensor-parallel",
    title="列切分与行切分",
    zh="张量并行,2 个 rank,权重用数学上的 [in, out] 视角(y = x @ W)。列切分:输入复制到每个 rank,"
    "每个 rank 算出输出的一段列,拼接得到完整输出。行切分:下一层的输入按列切开、W 按行切开,"
    "每个 rank 得到一个与输出同形状的部分和,由 all-reduce 相加。",
    en="Tensor parallelism over 2 ranks, weights in the math [in, out] view (y = x @ W). Column-parallel: the "
    "input is replicated, each rank computes a block of output columns, and the blocks are concatenated. "
    "Row-parallel: the next layer's input is split (W by rows), each rank produces a same-shaped partial, "
    "and the all-reduce sums them.",
    needs={"shards": "ch15.6", "partials": "ch15.6"},
)
def tensor_parallel_figure(f: Figure, r: dict) -> None:
    x, w1, shards = r["x"], r["w1"], r["shards"]
    w2, x_shards, partials = r["w2"], r["x_shards"], r["partials"]
    row_out, row_want = r["row_out"], r["row_out_expected"]
    tp, N, in1, out1, out2 = len(shards), len(x), len(w1), len(w1[0]), len(w2[0])
    b1, b2 = out1 // tp, len(w2) // tp
    c = 32
    f.instance_row(
        [
            (tr("tp = {tp} ranks", tp=tp), "plain"),
            (f"x [{N}, {in1}]", "plain"),
            (f"W1 [in {in1}, out {out1}]", "plain"),
            (f"W2 [in {len(w2)}, out {out2}]", "plain"),
            (tr("math view: y = x @ W, W is [in, out]"), "accent"),
        ]
    )

    # Column-parallel: x @ W1's column block = a shard; the shards side by side are the output.
    f.heading(tr("column-parallel: every rank gets all of x and a block of {b} output columns of W1", b=b1))
    f.y += 6
    results = [
        f.matrix(s, role=RANK[rk % 2], expected=r["shards_expected"][rk], wrong=r["shards_wrong"][rk], w=c, h=c)
        for rk, s in enumerate(shards)
    ]
    lanes = _lanes(
        f,
        [
            [
                (tr("x (replicated)"), f.matrix(x, w=c, h=c)),
                (
                    f"W1[:, {rk * b1}:{(rk + 1) * b1}]",
                    f.matrix([row_[rk * b1 : (rk + 1) * b1] for row_ in w1], role=RANK[rk % 2], w=c, h=c),
                ),
                (tr("your shard {rk} [{N}, {b}]", rk=rk, N=N, b=b1), results[rk]),
            ]
            for rk in range(tp)
        ],
        c,
    )
    out = f.matrix(r["col_out"], role=lambda i, j: RANK[(j // b1) % 2], expected=r["col_out_expected"], wrong=r["col_out_wrong"], w=c, h=c)
    f.place(
        row(
            lanes,
            row(
                out,
                column(
                    f.label(tr("your out [{N}, {o}]", N=N, o=out1), size=LABEL_SMALL + 0.5, color=INK, bold=True),
                    f.lines(tr("concatenate"), tr("(all-gather)")),
                    gap=3,
                ),
                gap=10,
                align="middle",
            ),
            gap=150,
            align="middle",
        ),
        after=28,
    )
    for rk, shard in enumerate(results):  # each shard to its block of columns of the output
        sx, sy, _, _ = shard.cell_box(0, b1)
        below = sy + N * c / 2 < out.cell_box(0, 0)[1]
        tx = out.cell_box(0, rk * b1)[0] + b1 * c / 2
        f.arrow(sx + 6, sy + N * c / 2, tx, out.cell_box(0, 0)[1] - 2 if below else out.bottom + 4, color=stroke(RANK[rk % 2]), width=1.3)
    f.note(
        tr(
            "No communication inside the layer: each shard is a finished slice of the output (qkv_proj, "
            "gate_up_proj). nano-vllm stores W as [out, in] and splits its dim 0, the same blocks."
        ),
        size=SMALL + 1.5,
    )

    # Row-parallel: a block of the input @ the same rows of W2 = a partial of the whole output; the partials summed.
    f.y += 6
    f.heading(tr("row-parallel: rank r holds input columns [{b}r, {b}r + {b}) of y and the same rows of W2", b=b2))
    f.y += 6
    results = [
        f.matrix(p, role=RANK[rk % 2], expected=r["partials_expected"][rk], wrong=r["partials_wrong"][rk], w=c, h=c)
        for rk, p in enumerate(partials)
    ]
    lanes = _lanes(
        f,
        [
            [
                (tr("shard {rk} [{N}, {b}]", rk=rk, N=N, b=b2), f.matrix(x_shards[rk], role=RANK[rk % 2], w=c, h=c)),
                (f"W2[{rk * b2}:{(rk + 1) * b2}, :]", f.matrix(w2[rk * b2 : (rk + 1) * b2], role=RANK[rk % 2], w=c, h=c)),
                (tr("your partial {rk} [{N}, {o}]", rk=rk, N=N, o=out2), results[rk]),
            ]
            for rk in range(tp)
        ],
        c,
    )
    sums = f"out[0, 0] = {' + '.join(num(p[0][0]) for p in r['partials_expected'])} = {num(row_want[0][0])}"
    if row_out is None:
        total: Part = Part(
            150, c, lambda x0, y0: f.cell(x0, y0, tr("not a 2-D tensor"), w=150, h=c, wrong=True, expected=f"[{N}, {out2}]", fmt=str)
        )
        shape_note = None
    else:
        total = f.matrix(
            row_out,
            expected=[[row_want[i][j] if i < N and j < out2 else "—" for j in range(len(line))] for i, line in enumerate(row_out)],
            wrong=r["row_out_wrong"],
            w=c,
            h=c,
        )
        shape_note = (
            None
            if (len(row_out), len(row_out[0])) == (N, out2)
            else f.label(tr("yours [{a}, {b}]; expected [{N}, {o}]", a=len(row_out), b=len(row_out[0]), N=N, o=out2), color=stroke("wrong"))
        )
    f.place(
        row(
            lanes,
            column(_title(f, tr("your out: sum (all-reduce)")), total, f.label(sums, size=SMALL, mono=True), shape_note, gap=6),
            gap=150,
            align="middle",
        ),
        after=28,
    )
    for rk, partial in enumerate(results):  # each partial into the sum
        px, py, _, _ = partial.cell_box(0, out2)
        f.arrow(
            px + 6,
            py + N * c / 2,
            total.right - total.w - 8,
            total.bottom - total.h / 2 - 10 + rk * 20,
            color=stroke(RANK[rk % 2]),
            width=1.3,
        )
    f.note(
        tr(
            "Each partial already has the full output shape [{N}, {o}]: the all-reduce adds them, it does not "
            "concatenate. Column then row (o_proj after attention, down_proj after gate_up) needs this one "
            "all-reduce per pair.",
            N=N,
            o=out2,
        ),
        size=SMALL + 1.5,
    )
    wrong = row_out is None or any(_any(r[key]) for key in ("shards_wrong", "col_out_wrong", "partials_wrong", "row_out_wrong"))
    f.legend(
        [("plain", tr("replicated input, summed output")), (RANK[0], tr("rank 0's slice")), (RANK[1], tr("rank 1's slice"))], wrong=wrong
    )


def _by_row(roles: list[str]) -> Callable[[int, int], str]:
    """A matrix's role per cell from one role per row."""
    return lambda i, j: roles[i]


def _lanes(f: Figure, lanes: list[list[tuple[str, Grid]]], c: float) -> Part:
    """One lane per rank, "rank r  a @ b = c", each matrix under its title; the slots line up across the lanes."""
    titled = [[f.titled(title, grid, size=TITLE) for title, grid in lane] for lane in lanes]
    slots = [max(part.w for part in slot) for slot in zip(*titled)]
    title_h = _title(f, "x").h + 8

    def at_row(part: Part, rows: float) -> Part:  # a symbol or label level with the middle of a grid's rows
        return pad(part, top=title_h + rows * c - part.h / 2)

    return column(
        *(
            row(
                at_row(f.label(f"rank {rk}", size=LABEL, color=stroke(RANK[rk % 2]), bold=True), lane[1][1].rows / 2),
                wide(a, slots[0]),
                at_row(f.label("@", size=LABEL, color=INK), 1),
                wide(b, slots[1]),
                at_row(f.label("=", size=LABEL, color=INK), 1),
                wide(res, slots[2]),
                gap=14,
            )
            for rk, (lane, (a, b, res)) in enumerate(zip(lanes, titled))
        ),
        gap=30,
    )


# -- ch15-vocab-parallel ---------------------------------------------------------------------------------


@figure(
    "ch15-vocab-parallel",
    title="vocab 并行:embedding 与 LM head",
    zh="vocab 按行切给 2 个 rank:rank r 持有 E 的第 3r … 3r+2 行。embedding:每个 rank 看到全部 id,"
    "不是自己的 id 先换成本地第 0 行、查表后整行置零,all-reduce 相加得到 E[ids]。"
    "LM head(与 E 共用权重):prefill 只取每个请求最后一个 token 的行,各 rank 算出自己那段 vocab 的 "
    "logits,按 rank 顺序沿 vocab 维拼接到 rank 0。",
    en="The vocabulary split by rows over 2 ranks: rank r holds rows 3r … 3r+2 of E. Embedding: every rank sees "
    "all the ids, maps an id it does not own to its local row 0, zeroes that row after the lookup, and the "
    "all-reduce adds the partials into E[ids]. LM head (tied to E): prefill keeps each request's last token, "
    "each rank computes the logits of its own slice of the vocabulary, and rank 0 concatenates them in rank "
    "order.",
    needs={"partials": "ch15.7", "logits": "ch15.8"},
)
def vocab_parallel_figure(f: Figure, r: dict) -> None:
    table, ids, partials = r["table"], r["ids"], r["partials"]
    tp, V, H = len(partials), len(table), len(table[0])
    per = V // tp
    c, h = 34, 28
    f.instance_row(
        [
            (tr("E [{V}, {H}], tp = {tp}: rank r holds rows [{per}r, {per}r + {per})", V=V, H=H, tp=tp, per=per), "plain"),
            (f"ids = {ids}", "token"),
            (tr("all-reduce = sum over ranks"), "plain"),
        ]
    )
    f.heading(tr("vocab-parallel embedding: every rank looks up every id (ch15.7)"))
    f.y += 8
    lanes = []
    for rk in range(tp):
        start = rk * per
        own = [start <= tok < start + per for tok in ids]
        roles = [RANK[rk % 2] if o else "masked" for o in own]
        shard = f.matrix(
            table[start : start + per], role=RANK[rk % 2], w=c, h=h, row_labels=[tr("E row {r}", r=start + i) for i in range(per)]
        )
        mask = f.matrix(
            [[int(o)] for o in own],
            role=_by_row(["attend" if o else "masked" for o in own]),
            row_labels=[f"id {tok}" for tok in ids],
            w=c,
            h=h,
            fmt=str,
        )
        local = f.matrix([[tok - start if o else 0] for tok, o in zip(ids, own)], role=_by_row(roles), w=c, h=h, fmt=str)
        part = f.matrix(partials[rk], role=_by_row(roles), expected=r["partials_expected"][rk], wrong=r["partials_wrong"][rk], w=c, h=h)
        lanes.append(
            row(
                column(
                    f.label(f"rank {rk}", size=LABEL, color=stroke(RANK[rk % 2]), bold=True),
                    f.titled(tr("its shard"), shard, size=TITLE),
                    gap=10,
                ),
                f.titled("mask", mask, size=TITLE),
                f.titled(tr("local row"), local, size=TITLE),
                f.titled(tr("your partial {rk}", rk=rk), part, size=TITLE),
                gap=16,
            )
        )
    total = f.matrix(
        r["summed"], role="token", expected=r["summed_expected"], wrong=r["summed_wrong"], w=c, h=h, row_labels=[f"id {tok}" for tok in ids]
    )
    right = column(
        _title(f, tr("all-reduce: Σ your partials")), total, f.label(tr("= E[ids] when each partial is right"), size=SMALL), gap=8
    )
    f.place(row(column(*lanes, gap=26), right, gap=48, align="middle"), after=16)
    f.note(
        tr(
            "A rank never indexes its shard with a global id: id − {per}·r for the ids it owns, local row 0 as a "
            "placeholder for the others (x = mask · (x − start)), and the placeholder rows zeroed after the lookup "
            "(y = mask · y). Each id has one owner, so the sum over ranks is exactly its row.",
            per=per,
        ),
        color=INK,
        size=SMALL + 1.5,
    )

    hidden, cu, local_logits, logits = r["hidden"], r["cu_seqlens_q"], r["local"], r["logits"]
    last = [e - 1 for e in cu[1:]]
    f.y += 8
    f.heading(tr("the LM head (tied: the same shards of E): local logits gathered in rank order (ch15.8)"))
    f.y += 8
    hid = f.matrix(hidden, role=lambda i, j: "accent" if i in last else "plain", w=c, h=h, row_labels=[f"t{i}" for i in range(len(hidden))])
    blocks = [
        f.matrix(block, role=RANK[rk % 2], w=c, h=h, col_labels=[str(rk * per + j) for j in range(per)])
        for rk, block in enumerate(local_logits)
    ]
    gathered = f.matrix(
        logits,
        role=lambda i, j: RANK[(j // per) % 2],
        expected=r["logits_expected"],
        wrong=r["logits_wrong"],
        w=c,
        h=h,
        col_labels=[str(j) for j in range(len(logits[0]))],
        row_labels=[f"t{t}" for t in last],
    )
    f.place(
        row(
            f.titled(f"hidden [{len(hidden)}, {H}], cu_seqlens_q = {cu}", hid, size=TITLE),
            column(*(f.titled(f"rank {rk}: x · E[{rk * per}:{rk * per + per}]ᵀ", b, size=TITLE) for rk, b in enumerate(blocks)), gap=14),
            f.titled(tr("your logits on rank 0 [{a}, {b}]", a=len(logits), b=len(logits[0])), gathered, size=TITLE),
            gap=56,
            align="middle",
        ),
        after=16,
    )
    for rk, b in enumerate(blocks):  # each rank's block: an arrow to the gathered logits, a bracket under its columns
        bx, by, _, _ = b.cell_box(0, per)
        gx, gy, _, _ = gathered.cell_box(0, 0)
        f.arrow(
            bx + 8,
            by + len(last) * h / 2,
            gx - gathered.label_w - 6,
            gy + (rk + 0.5) * len(last) * h / tp,
            color=stroke(RANK[rk % 2]),
            width=1.3,
        )
        x1, x2 = gathered.cell_box(0, rk * per)[0], gathered.cell_box(0, rk * per + per)[0]
        f.bracket(x1 + 2, x2 - 2, gathered.bottom + 6, f"rank {rk}", color=stroke(RANK[rk % 2]))
    f.note(
        tr(
            "Only rows {rows} (cu_seqlens_q[1:] − 1) reach the LM head in prefill. Rank r's "
            "block holds token ids {per}r … {per}r + {last}: a gather concatenates the blocks along the vocabulary "
            "in rank order; adding them would mix different tokens' logits.",
            rows=", ".join("t" + str(i) for i in last),
            per=per,
            last=per - 1,
        ),
        color=INK,
        size=SMALL + 1.5,
    )
    f.y += 4
    wrong = any(_any(r[k]) for k in ("partials_wrong", "summed_wrong", "logits_wrong"))
    f.legend(
        [
            (RANK[0], tr("rank 0's rows")),
            (RANK[1], tr("rank 1's rows")),
            ("masked", tr("masked: not this rank's id")),
            ("accent", tr("last-token rows")),
        ],
        wrong=wrong,
    )


# -- ch15-qkv-shards ------------------------------------------------------------------------------------


@figure(
    "ch15-qkv-shards",
    title="QKV 权重按 rank 加载",
    zh="4 个 query 头、2 个 KV 头、head_dim 2,2 个 rank。检查点里 q_proj、k_proj、v_proj 分开存放;"
    "每个 rank 的融合 qkv_proj 取每个投影的第 rank 块,按自己的 q | k | v 排列:k 的偏移是本 rank 的 q 行数,"
    "KV 头按 KV 头数切分。",
    en="4 query heads, 2 KV heads, head_dim 2, over 2 ranks. The checkpoint stores q_proj, k_proj and v_proj "
    "apart; each rank's fused qkv_proj takes its own chunk of each and packs them as its own q | k | v: k's "
    "offset is this rank's q rows, and the KV heads are split by their own count.",
    needs={"layout": "ch15.9"},
)
def qkv_shards_figure(f: Figure, r: dict) -> None:
    heads, kv, d, tp = r["num_heads"], r["num_kv_heads"], r["head_dim"], r["tp"]
    c, h = 44, 22
    f.instance_row(
        [
            (f"num_heads = {heads}", "q"),
            (f"num_kv_heads = {kv}", "k"),
            (f"head_dim = {d}", "plain"),
            (f"tp = {tp}", "plain"),
            (
                tr(
                    "per rank: [({heads}/{tp} + 2·{kv}/{tp})·{d}, H] = [{rows}, H]",
                    heads=heads,
                    tp=tp,
                    kv=kv,
                    d=d,
                    rows=(heads + 2 * kv) // tp * d,
                ),
                "plain",
            ),
        ]
    )
    sizes = {"q": heads * d, "k": kv * d, "v": kv * d}
    sources = []
    for s in "qkv":
        chunk = sizes[s] // tp
        grid = f.matrix(
            [[f"{s}{i}"] for i in range(sizes[s])],
            role=s,
            w=c,
            h=h,
            fmt=str,
            row_labels=[f"rank {i // chunk}" if i % chunk == 0 else "" for i in range(sizes[s])],
        )
        sources.append(f.titled(f"{s}_proj [{sizes[s]}, H]", grid, size=TITLE, color=stroke(s)))
    ranks = []
    for rk in range(tp):
        layout = r["layout"][rk]
        fused = f.matrix(
            [[v] for v in layout],
            role=_by_row([v[:1] if v[:1] in ("q", "k", "v") else "masked" for v in layout]),
            expected=[[v] for v in r["layout_expected"][rk]],
            wrong=[[w] for w in r["layout_wrong"][rk]],
            w=c,
            h=h,
            fmt=str,
            row_labels=[str(i) for i in range(len(layout))],
        )
        triples = f.matrix(
            r["triples"][rk],
            expected=r["triples_expected"][rk],
            wrong=[[a != b for a, b in zip(g, e)] for g, e in zip(r["triples"][rk], r["triples_expected"][rk])],
            row_labels=list("qkv"),
            col_labels=["offset", "start", "size"],
            w=52,
            h=h,
        )
        ranks.append(
            column(
                _title(f, tr("rank {rk}: your fused qkv_proj", rk=rk), color=stroke(RANK[rk % 2])),
                row(fused, f.titled(tr("your (offset, start, size)"), triples, size=TITLE), gap=22),
                gap=8,
            )
        )
    f.place(row(column(*sources, gap=14), *ranks, gap=46), after=16)
    f.note(
        tr(
            "Rank r copies rows [r·size, (r+1)·size) of each loaded weight (its chunk) to rows "
            "[offset, offset + size) of its fused weight. Offsets count this rank's rows only: q at 0, k at "
            "({heads}/{tp})·{d} = {k}, v at ({heads}/{tp} + {kv}/{tp})·{d} = {v}. "
            "A cell shows the loaded row it holds (q5: row 5 of q_proj).",
            heads=heads,
            tp=tp,
            d=d,
            kv=kv,
            k=heads // tp * d,
            v=(heads + kv) // tp * d,
        ),
        color=INK,
        size=SMALL + 1.5,
    )
    f.y += 4
    wrong = _any(r["layout_wrong"]) or r["triples"] != r["triples_expected"]
    f.legend(
        [("q", tr("rows of q_proj")), ("k", tr("rows of k_proj")), ("v", tr("rows of v_proj")), ("masked", tr("a row nothing fills"))],
        wrong=wrong,
    )
