"""Figures of ch15 · token ids to logits: an embedding lookup, the fused QKV projection and its split,
the projection widths of Qwen3-0.6B, the six checkpoints of a prefill step, and tensor parallelism."""

from __future__ import annotations

from figures import figure
from figures.kit import Figure, num
from figures.style import CELL, INK, LABEL, MARGIN, MUTED, SMALL, stroke

ATOL = RTOL = 1e-5  # the tolerance of the ch15 checks
RANK = ("token", "block")  # the kit has no rank roles: rank 0 sky blue, rank 1 purple, always labelled


def _close(a, b) -> bool:
    return abs(a - b) <= ATOL + RTOL * abs(b)


def _matrix(f: Figure, x: float, y: float, values, *, expected=None, role="plain", w: float = CELL,
            h: float = CELL, title: str = "", row_labels=None, col_labels=None) -> tuple[float, float]:
    """A grid with a title above it; wrong cells (against `expected`, same shape) are marked."""
    if title:
        f.text(x, y - 8 - (16 if col_labels else 0), title, size=SMALL + 1.5, color=INK, weight="bold", cls="label")
    return f.grid(x, y - (16 if col_labels else 0), values, role=role, expected=expected, w=w, h=h,
                  row_labels=row_labels, col_labels=col_labels,
                  same=(lambda a, b: _close(a, b)) if expected is not None else None)


def _free_grid(f: Figure, x: float, y: float, values, expected, *, role="plain", w: float = CELL,
               h: float = CELL) -> bool:
    """A grid whose shape may differ from `expected`: cells outside it or wrong are marked. Returns 'any wrong'."""
    bad_any = len(values) != len(expected) or any(len(r) != len(expected[0]) for r in values)
    for i, row in enumerate(values):
        for j, v in enumerate(row):
            inside = i < len(expected) and j < len(expected[i])
            bad = not inside or not _close(v, expected[i][j])
            bad_any |= bad
            f.cell(x + j * w, y + i * h, v, role=role(i, j) if callable(role) else role, w=w, h=h, wrong=bad,
                   expected=(expected[i][j] if inside else "—") if bad else None)
    return bad_any


# -- ch15-dim-embedding ----------------------------------------------------------------------------------

@figure("ch15-dim-embedding", title="查表不是 reshape",
        zh="ids = [2, 0, 4] 从 E[6, 4] 中读出第 2、0、4 行,得到 X[1, 3, 4]:输入是 3 个整数下标,输出是 3 × 4 = 12 个浮点数。"
           "查表按 id 选行,而不是把 E 重新排成另一个形状。",
        en="ids = [2, 0, 4] read rows 2, 0 and 4 of E[6, 4] to give X[1, 3, 4]: 3 integer indices go in, "
           "3 × 4 = 12 floats come out. A lookup selects rows by id; it is not a reshape of E.",
        needs={"out": "ch15.1"})
def embedding_figure(f: Figure, r: dict) -> None:
    table, ids, out, expected = r["table"], r["ids"][0], r["out"][0], r["expected"][0]
    V, H = len(table), len(table[0])
    f.instance_row([(f"E: V = {V} rows × H = {H}", "plain"), (f"ids [1, {len(ids)}] = [[{', '.join(map(str, ids))}]]",
                                                           "token"), (f"X = E[ids]: [1, {len(ids)}, {H}]", "plain")])
    cw, ch = 46, 34
    xi, xe, xo = MARGIN + 60, MARGIN + 250, MARGIN + 590
    top = f.y + 26
    f.text(xi + 20, top - 12, "ids[0, t]", size=SMALL + 1.5, anchor="middle", weight="bold", cls="label")
    f.text(xe, top - 12, f"E [{V}, {H}] (row r holds 10(r+1)+1 … 10(r+1)+{H})", size=SMALL + 1.5, weight="bold",
           cls="label")
    f.text(xo, top - 12, f"your X[0] (X is [1, {len(ids)}, {H}])", size=SMALL + 1.5, weight="bold", cls="label")
    read = set(ids)
    for rr in range(V):
        y = top + rr * ch
        f.text(xe - 8, y + ch / 2 + 4, f"row {rr}", size=SMALL + 1, anchor="end", color=INK if rr in read else MUTED,
               cls="label")
        for c in range(H):
            f.cell(xe + c * cw, y, table[rr][c], role="token" if rr in read else "plain", w=cw, h=ch)
    id_y = [top + ch * (0.5 + 1.6 * t) for t in range(len(ids))]
    out_top = top + ch * 0.5
    for t, tok in enumerate(ids):
        y = id_y[t] - ch / 2
        f.text(xi - 10, y + ch / 2 + 4, f"t{t}", size=SMALL + 1, anchor="end", color=MUTED, mono=True, cls="label")
        f.cell(xi, y, tok, role="token", w=40, h=ch, bold=True)
        row_y = top + tok * ch + ch / 2
        f.arrow(xi + 42, id_y[t], xe - 56, row_y, color=stroke("token"), width=1.3)
        oy = out_top + t * (ch + 12)
        for c in range(H):
            bad = not _close(out[t][c], expected[t][c])
            f.cell(xo + c * cw, oy, out[t][c], role="token", w=cw, h=ch, wrong=bad,
                   expected=expected[t][c] if bad else None)
        f.arrow(xe + H * cw + 4, row_y, xo - 6, oy + ch / 2, color=stroke("token"), width=1.3)
        f.text(xo + H * cw + 8, oy + ch / 2 + 4, f"= E[{tok}]", size=SMALL + 1, mono=True, color=MUTED, cls="label")
    n = len(ids)
    count_y = out_top + n * (ch + 12) + 14
    f.text(xi + 20, id_y[-1] + ch / 2 + 22, f"{n} ints in", size=SMALL + 1.5, anchor="middle", weight="bold",
           color=stroke("token"), cls="label")
    f.text(xo + H * cw / 2, count_y, f"{n} × {H} = {n * H} floats out", size=SMALL + 1.5, anchor="middle",
           weight="bold", color=stroke("token"), cls="label")
    f.y = top + V * ch + 30
    f.note(f"In: {n} integer ids (shape [1, {n}]). Out: {n} rows × {H} = {n * H} floats (shape [1, {n}, {H}]). "
           f"E itself holds {V} × {H} = {V * H} floats. A reshape keeps every number and only regroups them; a "
           f"lookup copies one whole row of H = {H} per id, in the order of the ids, and repeats a row when an id "
           f"repeats.", color=INK, size=SMALL + 2)
    f.y += 4
    wrong = any(not _close(a, b) for ro, re in zip(out, expected) for a, b in zip(ro, re))
    f.legend([("token", "the ids and the rows they read"), ("plain", "rows no id reads")], wrong=wrong)


# -- ch15-dim-qkv-linear ---------------------------------------------------------------------------------

@figure("ch15-dim-qkv-linear", title="收缩轴与 Linear.weight 转置约定",
        zh="X[3, 4] 乘以 Wᵀ 得到 Y[3, 8]:W 按 nn.Linear 的约定存成 [out, in] = [8, 4],计算时用 x·Wᵀ;"
           "求和沿 in = 4 这一轴进行。Y 的 8 列依次是 Q 的 4 列(2 个头 × head_dim 2)、K 的 2 列、V 的 2 列。",
        en="X[3, 4] @ W.T gives Y[3, 8]: Linear.weight is stored [out, in] = [8, 4] and applied as x @ W.T, so "
           "the sum runs over the contraction axis in = 4. Y's 8 columns: Q's 4 (2 heads × head_dim 2), K's 2, "
           "V's 2.",
        needs={"y": "ch15.2", "q": "ch15.3"})
def qkv_linear_figure(f: Figure, r: dict) -> None:
    x, w, y, y_want = r["x"], r["weight"], r["y"], r["y_expected"]
    nh, nkv, d = r["num_heads"], r["num_kv_heads"], r["head_dim"]
    sizes = [nh * d, nkv * d, nkv * d]
    roles = ["q"] * sizes[0] + ["k"] * sizes[1] + ["v"] * sizes[2]
    out_f, in_f, T = len(w), len(w[0]), len(x)
    f.instance_row([(f"num_heads = {nh}", "q"), (f"num_kv_heads = {nkv}", "k"), (f"head_dim = {d}", "plain"),
               (f"out = ({nh} + 2·{nkv})·{d} = {out_f}", "plain"), (f"in = {in_f}", "plain")])
    c = 34
    # Stored W [out, in] on the left; the product laid out as X | Y with Wᵀ above Y.
    xw, top = MARGIN + 20, f.y + 40
    f.text(MARGIN, top - 22, f"W as stored: [out, in] = [{out_f}, {in_f}]", size=SMALL + 1.5, weight="bold",
           cls="label")
    for i in range(out_f):
        f.text(xw - 6, top + i * 26 + 17, roles[i], size=SMALL + 1, anchor="end", color=stroke(roles[i]),
               mono=True, cls="label")
        for j in range(in_f):
            f.cell(xw + j * 30, top + i * 26, w[i][j], role=roles[i], w=30, h=26)
    f.text(xw + in_f * 15, top + out_f * 26 + 16, "row j = output feature j", size=SMALL, anchor="middle",
           color=MUTED, cls="label")
    xm = MARGIN + 250                    # X's left edge
    xy = xm + in_f * c + 30              # Y's (and Wᵀ's) left edge
    wt_top = top
    f.text(xy, wt_top - 10, f"Wᵀ = W.T: [in, out] = [{in_f}, {out_f}]", size=SMALL + 1.5, mono=True,
           weight="bold", cls="label")
    f.arrow(xw + in_f * 30 + 8, top + 40, xy - 60, wt_top + in_f * c / 2, color=MUTED, width=1.2)
    f.text((xw + in_f * 30 + xy - 60) / 2, top + 30, "transpose (a view)", size=SMALL, anchor="middle",
           color=MUTED, cls="label")
    for i in range(in_f):
        for j in range(out_f):
            f.cell(xy + j * c, wt_top + i * c, w[j][i], role=roles[j], w=c, h=c)
    y_top = wt_top + in_f * c + 22
    f.text(xm + in_f * c / 2, y_top - 8, f"X [{T}, {in_f}]", size=SMALL + 1.5, anchor="middle", weight="bold",
           cls="label")
    for i in range(T):
        f.text(xm - 6, y_top + i * c + c / 2 + 4, f"t{i}", size=SMALL + 1, anchor="end", color=MUTED, mono=True,
               cls="label")
        for j in range(in_f):
            f.cell(xm + j * c, y_top + i * c, x[i][j], role="token", w=c, h=c)
    for i in range(T):
        for j in range(out_f):
            bad = not _close(y[i][j], y_want[i][j])
            f.cell(xy + j * c, y_top + i * c, y[i][j], role=roles[j], w=c, h=c, wrong=bad,
                   expected=y_want[i][j] if bad else None, bold=True)
    f.text(xy + out_f * c + 10, y_top + c / 2 + 4, "your Y = X·Wᵀ", size=SMALL + 1.5, mono=True, weight="bold",
           cls="label")
    f.text(xy + out_f * c + 10, y_top + c / 2 + 20, f"[{T}, {out_f}] = linear(X, W)", size=SMALL, color=MUTED,
           cls="label")
    # The contraction axis: X's columns and Wᵀ's rows are the same in = 4 axis.
    f.bracket(xm, xm + in_f * c, y_top + T * c + 4, f"in = {in_f}: summed", color=stroke("accent"))
    _vbracket(f, xy - 6, wt_top, wt_top + in_f * c, f"in = {in_f}")
    # The column groups of Y and the student's split below them.
    yb = y_top + T * c + 6
    start = 0
    for name, size in zip(("q", "k", "v"), sizes):
        f.bracket(xy + start * c + 2, xy + (start + size) * c - 2, yb, f"{name}: {size}", color=stroke(name))
        start += size
    split_top = yb + 62
    start, gap = 0, 18
    wrong = any(not _close(a, b) for ro, re in zip(y, y_want) for a, b in zip(ro, re))
    for k, (name, size) in enumerate(zip(("q", "k", "v"), sizes)):
        sx = xy + start * c + k * gap - gap
        f.text(sx + size * c / 2, split_top - 8, f"your {name.upper()} [{T}, {size}]", size=SMALL + 1,
               anchor="middle", weight="bold", color=stroke(name), cls="label")
        f.arrow(xy + (start + size / 2) * c, yb + 26, sx + size * c / 2, split_top - 22, color=stroke(name), width=1.2)
        part, want = r[name], r[name + "_expected"]
        for i in range(T):
            for j in range(size):
                bad = not _close(part[i][j], want[i][j])
                wrong |= bad
                f.cell(sx + j * c, split_top + i * c, part[i][j], role=name, w=c, h=c, wrong=bad,
                       expected=want[i][j] if bad else None)
        start += size
    f.text(xy - gap - 14, split_top + c, f"split_qkv(Y, {nh}, {nkv}, {d})", size=SMALL + 1.5, anchor="end",
           mono=True, cls="label")
    f.text(xy - gap - 14, split_top + c + 16, "your split of the expected Y", size=SMALL, anchor="end",
           color=MUTED, cls="label")
    f.y = split_top + T * c + 26
    terms = " + ".join(f"{num(a)}·{num(b)}" for a, b in zip(x[0], w[0]))
    f.note(f"Y[0, 0] = Σ_c X[0, c]·W[0, c] = {terms} = {num(y_want[0][0])} (yours: {num(y[0][0])}). The sum runs "
           f"over in, the last axis of X and of the stored W: row j of W is output feature j.", color=INK,
           size=SMALL + 2)
    f.y += 4
    f.legend([("token", "X: one row per token"), ("q", "Q columns"), ("k", "K columns"), ("v", "V columns")],
             wrong=wrong)


def _vbracket(f: Figure, x: float, y1: float, y2: float, label: str) -> None:
    """A vertical bracket on the left of rows y1..y2 with its label to the left (the kit's are horizontal)."""
    color = stroke("accent")
    f.dwg.add(f.dwg.polyline([(x, y1 + 2), (x - 5, y1 + 2), (x - 5, y2 - 2), (x, y2 - 2)], fill="none",
                             stroke=color, stroke_width=1.2, class_="bracket"))
    f.text(x - 9, (y1 + y2) / 2 + 4, label, size=SMALL + 1, anchor="end", color=color, cls="label")


# -- ch15-qwen3-widths ------------------------------------------------------------------------------

@figure("ch15-qwen3-widths", title="Qwen3-0.6B 的投影宽度",
        zh="Qwen3-0.6B 每个投影的权重形状 [out, in] 都由 config 推出。head_dim = 128 是 config 里的值,"
           "不是 hidden / 头数 = 1024 / 16 = 64;所以注意力宽度 16 × 128 = 2048 大于 hidden 1024。",
        en="The projection widths of Qwen3-0.6B, from its config: every weight's [out, in] shape. head_dim = 128 is "
           "a config value, not hidden / heads = 1024 / 16 = 64, so the attention width 16 × 128 = 2048 exceeds "
           "hidden = 1024.",
        needs={"shapes": "ch15.4"})
def qwen3_widths_figure(f: Figure, r: dict) -> None:
    c, shapes, expected = r["config"], r["shapes"], r["expected"]
    H, I, V, d = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["head_dim"]
    Hq, Hkv, tied = c["num_attention_heads"], c["num_key_value_heads"], c["tie_word_embeddings"]
    f.instance_row([(f"hidden H = {H}", "plain"), (f"heads Hq = {Hq}", "q"), (f"kv heads Hkv = {Hkv}", "k"),
               (f"head_dim d = {d}", "accent"), (f"intermediate I = {I}", "plain"), (f"vocab V = {V}", "token"),
               (f"tie_word_embeddings = {tied}", "token")])
    f.note(f"head_dim comes from the config: d = {d}. Deriving it as H / Hq = {H} / {Hq} = {H // Hq} would shrink "
           f"qkv_proj to [{(Hq + 2 * Hkv) * (H // Hq)}, {H}], o_proj to [{H}, {Hq * (H // Hq)}] and change the "
           f"attention scale from 1/√{d} to 1/√{H // Hq}.", color=INK, size=SMALL + 2)
    f.y += 6
    f.heading("每个权重的形状 · each weight as stored, [out, in] (your values)")
    rows = [("embed_tokens", "a table: one row per token id", "[V, H]", "token"),
            ("qkv_proj", f"q | k | v packed: ({Hq} + 2·{Hkv})·{d} rows", "[(Hq + 2·Hkv)·d, H]", "q"),
            ("o_proj", f"attention output {Hq}·{d} → H", "[H, Hq·d]", "q"),
            ("q_norm", "RMSNorm weight over one head", "[d]", "accent"),
            ("k_norm", "RMSNorm weight over one head", "[d]", "accent"),
            ("gate_up_proj", f"gate | up packed: 2·{I} rows", "[2·I, H]", "plain"),
            ("down_proj", f"intermediate {I} → H", "[H, I]", "plain"),
            ("lm_head", "tied: it is embed_tokens.weight" if tied else "untied: its own matrix", "[V, H]", "token")]
    x_name, x_cells, x_sym, x_note = MARGIN, MARGIN + 120, MARGIN + 300, MARGIN + 450
    cw, ch = 84, 28
    y = f.y + 20
    for k, label in enumerate(("out", "in")):
        f.text(x_cells + k * cw + (cw - 4) / 2, y - 6, label, size=SMALL + 1, anchor="middle", color=MUTED,
               cls="label")
    f.text(x_sym, y - 6, "from the config", size=SMALL + 1, color=MUTED, cls="label")
    wrong = False
    for name, note, sym, role in rows:
        f.text(x_name, y + ch / 2 + 4, name, size=LABEL, mono=True, weight="bold", cls="label")
        got, want = shapes[name], expected[name]
        for k, v in enumerate(got):
            bad = k >= len(want) or v != want[k]
            wrong |= bad
            f.cell(x_cells + k * cw, y, v, role=role, w=cw - 4, h=ch, wrong=bad,
                   expected=(want[k] if k < len(want) else "—") if bad else None)
        if len(got) < len(want):
            wrong = True
            f.text(x_cells + len(got) * cw + 2, y + ch / 2 + 4, f"✗ expected {want}", size=SMALL,
                   color=stroke("wrong"), cls="label")
        f.text(x_sym, y + ch / 2 + 4, sym, size=SMALL + 1, mono=True, color=MUTED, cls="label")
        f.text(x_note, y + ch / 2 + 4, note, size=SMALL + 1, color=MUTED, cls="label")
        y += ch + 6
    f.y = y + 22
    # One token's widths through a layer, to scale, read from the student's shapes.
    f.heading("一个 token 在一层里的宽度(按比例)· one token's width through a layer, to scale (your shapes)")
    q_w, kv_w = Hq * d, Hkv * d
    bars = [("hidden h", H, H, [(H, "plain", f"H = {H}")]),
            ("qkv_proj(h)", shapes["qkv_proj"][0], expected["qkv_proj"][0],
             [(q_w, "q", f"q {Hq}·{d} = {q_w}"), (kv_w, "k", f"k {Hkv}·{d}"), (kv_w, "v", f"v {Hkv}·{d}")]),
            ("attention output", shapes["o_proj"][-1], expected["o_proj"][-1], [(q_w, "q", f"{Hq} heads · {d} = {q_w}")]),
            ("o_proj(·)", shapes["o_proj"][0], expected["o_proj"][0], [(H, "plain", f"{H}")]),
            ("gate_up_proj(h)", shapes["gate_up_proj"][0], expected["gate_up_proj"][0],
             [(I, "plain", f"gate {I}"), (I, "plain", f"up {I}")]),
            ("SiLU(gate) · up", shapes["down_proj"][-1], expected["down_proj"][-1], [(I, "plain", f"I = {I}")]),
            ("down_proj(·)", shapes["down_proj"][0], expected["down_proj"][0], [(H, "plain", f"{H}")])]
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
            outline = f.dwg.rect((x0, y), (want * scale, 22), fill="none", stroke=INK, stroke_width=1,
                                 class_="expected-bar")
            outline["stroke-dasharray"] = "3,2"
            f.dwg.add(outline)
            f.dwg.add(f.dwg.rect((x0, y + 3), (max(got, 0) * scale, 16), fill="url(#hatch-wrong)",
                                 stroke=stroke("wrong"), stroke_width=1.5, class_="bar wrong"))
            f.text(x0 + max(got, want) * scale + 8, y + 15, f"yours {got}, expected {want}", size=SMALL,
                   color=stroke("wrong"), cls="value wrong")
        y += 30
    f.y = y + 14
    f.legend([("q", "q and the attention width"), ("k", "k"), ("v", "v"), ("accent", "head_dim, from the config"),
              ("token", "vocabulary-sized"), ("plain", "hidden and MLP widths")], wrong=wrong)


# -- ch15-checkpoints -------------------------------------------------------------------------------

@figure("ch15-checkpoints", title="token 到 logits 的六个检查点",
        zh="一次 prefill 从 token 到 logits 的六个检查点。变长 batch 被压平成 [总 token 数, H],不做 padding;"
           "只有每个请求的最后一个 token(cu_seqlens_q[1:] − 1 这些行)进入 lm_head,所以 logits 是 [B, V] 而不是 [N, V]。",
        en="Six checkpoints from token ids to logits in one prefill step. The varlen batch is flattened to "
           "[total_tokens, H] with no padding; only each request's last token (rows cu_seqlens_q[1:] − 1) reaches "
           "the LM head, so the logits are [B, V], not [N, V].",
        needs={"shapes": "ch15.5"})
def checkpoints_figure(f: Figure, r: dict) -> None:
    lens, H, V = r["prompt_lens"], r["hidden_size"], r["vocab_size"]
    names, shapes, expected = r["names"], r["shapes"], r["expected"]
    N, B = sum(lens), len(lens)
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    last = [e - 1 for e in cu[1:]]
    owner = [b for b, n in enumerate(lens) for _ in range(n)]
    f.instance_row([(f"prompt_lens = {lens}", "token"), (f"N = {' + '.join(map(str, lens))} = {N} tokens", "plain"),
               (f"B = {B} requests", "plain"), (f"cu_seqlens_q = {cu}", "plain"), (f"H = {H}, V = {V}", "plain")])
    steps = ["the prompts, concatenated", "embed_tokens: a row per id", "through every decoder layer",
             "the final RMSNorm", f"rows cu_seqlens_q[1:] − 1 = {last}", "lm_head: x @ W.T (W [V, H])"]
    x_name, x_shape, x_strip = MARGIN, MARGIN + 215, MARGIN + 450
    row_h, sq = 52, 30
    y = f.y + 10
    f.text(x_shape, y - 4, "your shape", size=SMALL + 1, color=MUTED, cls="label")
    f.text(x_strip, y - 4, "rows of the tensor (colour: request)", size=SMALL + 1, color=MUTED, cls="label")
    y += 8
    wrong = False
    centers_above: list[float] = []
    for k, (name, shape, want) in enumerate(zip(names, shapes, expected)):
        f.text(x_name, y + 14, f"{k + 1}  {name}", size=LABEL, mono=True, weight="bold", cls="label")
        f.text(x_name + 16, y + 31, steps[k], size=SMALL, color=MUTED, cls="label")
        for j, v in enumerate(shape):
            bad = j >= len(want) or v != want[j]
            wrong |= bad
            f.cell(x_shape + j * 76, y + 2, v, role="plain", w=72, h=sq, wrong=bad,
                   expected=(want[j] if j < len(want) else "—") if bad else None)
        if len(shape) < len(want):
            wrong = True
            f.text(x_shape + len(shape) * 76 + 4, y + 22, f"✗ expected {want}", size=SMALL, color=stroke("wrong"),
                   cls="label")
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
                f.cell(cx, y + 2, labels[i] if i < len(labels) else "", role="plain", w=sq, h=sq, fmt=str,
                       size=SMALL + 1, wrong=True, expected="")
            centers.append(cx + sq / 2)
        if k == 5:
            f.text(x_strip + shown * (sq + 6) + 4, y + 22, f"each row {V} logits wide", size=SMALL, color=MUTED,
                   cls="label")
        elif k in (1, 2, 3, 4):
            f.text(x_strip + shown * (sq + 6) + 4, y + 22, f"each row {H} wide", size=SMALL, color=MUTED, cls="label")
        if k == 4 and len(centers_above) >= N:
            for b, cx in enumerate(centers[:B]):
                f.arrow(centers_above[last[b]], y - row_h + sq + 4, cx, y, color=stroke("accent"), width=1.4)
        elif k > 0 and centers_above:
            f.arrow(x_name + 6, y - row_h + 38, x_name + 6, y + 2, color=MUTED, width=1)
        centers_above = centers
        y += row_h
    f.y = y + 6
    f.note(f"The LM head keeps {B} rows of {N}: the last token of each request ({', '.join(f't{i}' for i in last)}), "
           f"because only that token predicts the request's next token. Logits for all {N} tokens would be "
           f"[{N}, {V}], {N * V:,} numbers instead of {B * V:,}.", color=INK, size=SMALL + 2)
    f.y += 4
    f.legend([(RANK[0], "request 0's tokens"), (RANK[1], "request 1's tokens"),
              ("accent", "arrows: the last-token rows kept"), ("plain", "shape dimensions")], wrong=wrong)


# -- ch15-dim-tensor-parallel ----------------------------------------------------------------------------

@figure("ch15-dim-tensor-parallel", title="列切分与行切分",
        zh="张量并行,2 个 rank,权重用数学上的 [in, out] 视角(y = x @ W)。列切分:输入复制到每个 rank,"
           "每个 rank 算出输出的一段列,拼接得到完整输出。行切分:下一层的输入按列切开、W 按行切开,"
           "每个 rank 得到一个与输出同形状的部分和,由 all-reduce 相加。",
        en="Tensor parallelism over 2 ranks, weights in the math [in, out] view (y = x @ W). Column-parallel: the "
           "input is replicated, each rank computes a block of output columns, and the blocks are concatenated. "
           "Row-parallel: the next layer's input is split (W by rows), each rank produces a same-shaped partial, "
           "and the all-reduce sums them.",
        needs={"shards": "ch15.6", "partials": "ch15.6"})
def tensor_parallel_figure(f: Figure, r: dict) -> None:
    x, w1, shards, shards_want = r["x"], r["w1"], r["shards"], r["shards_expected"]
    col_out, col_want = r["col_out"], r["col_out_expected"]
    w2, x_shards, partials, partials_want = r["w2"], r["x_shards"], r["partials"], r["partials_expected"]
    row_out, row_want = r["row_out"], r["row_out_expected"]
    tp, N, in1, out1, out2 = len(shards), len(x), len(w1), len(w1[0]), len(w2[0])
    b1, b2 = out1 // tp, len(w2) // tp
    f.instance_row([(f"tp = {tp} ranks", "plain"), (f"x [{N}, {in1}]", "plain"), (f"W1 [in {in1}, out {out1}]", "plain"),
               (f"W2 [in {len(w2)}, out {out2}]", "plain"), ("math view: y = x @ W, W is [in, out]", "accent")])
    c = 32
    wrong = False
    # Column-parallel.
    f.heading(f"列切分 · column-parallel: every rank gets all of x and a block of {b1} output columns of W1")
    y = f.y + 26
    xs_x, xs_w, xs_s, xs_o = MARGIN + 70, MARGIN + 200, MARGIN + 330, MARGIN + 560
    lane = in1 * c + 34
    centers = []
    for rk in range(tp):
        ly = y + rk * lane
        f.text(MARGIN, ly + in1 * c / 2 + 4, f"rank {rk}", size=LABEL, weight="bold", color=stroke(RANK[rk % 2]),
               cls="label")
        _matrix(f, xs_x, ly, x, role="plain", w=c, h=c, title="x (replicated)" if rk == 0 else "")
        f.text(xs_w - 14, ly + c, "@", size=LABEL, anchor="middle", cls="label")
        block = [row[rk * b1:(rk + 1) * b1] for row in w1]
        _matrix(f, xs_w, ly, block, role=RANK[rk % 2], w=c, h=c, title=f"W1[:, {rk * b1}:{(rk + 1) * b1}]")
        f.text(xs_s - 14, ly + c, "=", size=LABEL, anchor="middle", cls="label")
        _matrix(f, xs_s, ly, shards[rk], expected=shards_want[rk], role=RANK[rk % 2], w=c, h=c,
                title=f"your shard {rk} [{N}, {b1}]")
        wrong |= any(not _close(a, b) for ro, re in zip(shards[rk], shards_want[rk]) for a, b in zip(ro, re))
        centers.append((xs_s + b1 * c, ly + N * c / 2))
    oy = y + (tp * lane - N * c) / 2 - 20
    f.text(xs_o + out1 * c + 10, oy + c / 2 + 4, f"your out [{N}, {out1}]", size=SMALL + 1.5, weight="bold",
           cls="label")
    f.text(xs_o + out1 * c + 10, oy + c / 2 + 20, "concatenate", size=SMALL + 1, color=MUTED, cls="label")
    f.text(xs_o + out1 * c + 10, oy + c / 2 + 34, "(all-gather)", size=SMALL + 1, color=MUTED, cls="label")
    wrong |= _free_grid(f, xs_o, oy, col_out, col_want, role=lambda i, j: RANK[(j // b1) % 2], w=c, h=c)
    for rk, (cx, cy) in enumerate(centers):
        tx = xs_o + rk * b1 * c + b1 * c / 2
        f.arrow(cx + 6, cy, tx, oy - 2 if cy < oy else oy + N * c + 4, color=stroke(RANK[rk % 2]), width=1.3)
    f.y = y + tp * lane + 8
    f.note("No communication inside the layer: each shard is a finished slice of the output (qkv_proj, "
           "gate_up_proj). nano-vllm stores W as [out, in] and splits its dim 0, the same blocks.", size=SMALL + 1.5)
    # Row-parallel.
    f.y += 6
    f.heading(f"行切分 · row-parallel: rank r holds input columns [{b2}r, {b2}r + {b2}) of y and the same rows of W2")
    y = f.y + 26
    xs_x, xs_w, xs_s, xs_o = MARGIN + 70, MARGIN + 180, MARGIN + 320, MARGIN + 600
    lane = b2 * c + 40
    for rk in range(tp):
        ly = y + rk * lane
        f.text(MARGIN, ly + b2 * c / 2 + 4, f"rank {rk}", size=LABEL, weight="bold", color=stroke(RANK[rk % 2]),
               cls="label")
        _matrix(f, xs_x, ly, x_shards[rk], role=RANK[rk % 2], w=c, h=c, title=f"shard {rk} [{N}, {b2}]")
        f.text(xs_w - 14, ly + c, "@", size=LABEL, anchor="middle", cls="label")
        _matrix(f, xs_w, ly, w2[rk * b2:(rk + 1) * b2], role=RANK[rk % 2], w=c, h=c,
                title=f"W2[{rk * b2}:{(rk + 1) * b2}, :]")
        f.text(xs_s - 14, ly + c, "=", size=LABEL, anchor="middle", cls="label")
        _matrix(f, xs_s, ly, partials[rk], expected=partials_want[rk], role=RANK[rk % 2], w=c, h=c,
                title=f"your partial {rk} [{N}, {out2}]")
        wrong |= any(not _close(a, b) for ro, re in zip(partials[rk], partials_want[rk]) for a, b in zip(ro, re))
        f.arrow(xs_s + out2 * c + 6, ly + N * c / 2, xs_o - 8, y + (tp * lane - N * c) / 2 + N * c / 2 - 10 + rk * 20,
                color=stroke(RANK[rk % 2]), width=1.3)
    oy = y + (tp * lane - N * c) / 2 - 10
    f.text(xs_o, oy - 8, "your out: sum (all-reduce)", size=SMALL + 1.5, weight="bold", cls="label")
    if row_out is None:
        wrong = True
        f.cell(xs_o, oy, "not a 2-D tensor", role="plain", w=150, h=c, wrong=True, expected="[2, 3]", fmt=str)
    else:
        wrong |= _free_grid(f, xs_o, oy, row_out, row_want, role="plain", w=c, h=c)
        if len(row_out[0]) != len(row_want[0]) or len(row_out) != len(row_want):
            f.text(xs_o, oy + len(row_out) * c + 30, f"yours [{len(row_out)}, {len(row_out[0])}]; expected "
                   f"[{len(row_want)}, {len(row_want[0])}]", size=SMALL + 1, color=stroke("wrong"), cls="label")
    sums = " + ".join(num(p[0][0]) for p in partials_want)
    f.text(xs_o, oy + N * c + 14, f"out[0, 0] = {sums} = {num(row_want[0][0])}", size=SMALL, mono=True, color=MUTED,
           cls="label")
    f.y = y + tp * lane + 8
    f.note(f"Each partial already has the full output shape [{N}, {out2}]: the all-reduce adds them, it does not "
           f"concatenate. Column then row (o_proj after attention, down_proj after gate_up) needs this one "
           f"all-reduce per pair.", size=SMALL + 1.5)
    f.legend([("plain", "replicated input, summed output"), (RANK[0], "rank 0's slice"), (RANK[1], "rank 1's slice")],
             wrong=wrong)
