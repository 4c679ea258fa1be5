"""Figures of ch32 · speculative decoding and determinism: confidence sizes the verification and verification
decides acceptance; the bits of one row across batch sizes, measured beside plain x @ w, and the preconditions
of determinism."""

from __future__ import annotations

from figures import figure
from figures.kit import Figure, num
from figures.style import CELL, INK, LABEL, MARGIN, MUTED, SMALL, VALUE, stroke


def _label(f: Figure, x: float, y: float, text: str, sub: str = "", bold: bool = False) -> None:
    """A row label ending at x, with an optional second line in small type."""
    f.text(x, y + (CELL / 2 - 2 if sub else CELL / 2 + 4), text, anchor="end", size=LABEL, cls="label",
           color=INK if bold else MUTED, weight="bold" if bold else "normal")
    if sub:
        f.text(x, y + CELL / 2 + 11, sub, anchor="end", size=SMALL, cls="label", color=MUTED)


def _p(x) -> str:
    return "—" if x is None else (f"{x:.3g}" if isinstance(x, float) else str(x))


def _dashed_line(f: Figure, x1: float, y: float, x2: float, color: str) -> None:
    line = f.dwg.line((x1, y), (x2, y), stroke=color, stroke_width=1.4, class_="threshold")
    line["stroke-dasharray"] = "5,3"
    f.dwg.add(line)


@figure("ch32-spec-confidence", title="置信度决定验证工作量",
        zh="置信度决定验证多少个草稿,不直接决定接受:生存概率(置信度的累乘)低于阈值的草稿不送去验证;"
           "送去验证的草稿由拒绝采样逐个判定,置信度高的草稿也可能被拒绝。预测接受率与真正的接受/拒绝是两个步骤。",
        en="Confidence sets how much is verified; acceptance is decided by verification. Drafts whose survival "
           "(the running product of confidences) falls below the threshold are not sent; the drafts sent are judged "
           "one by one by rejection sampling, and a confident draft can still be rejected.",
        needs={"n": "ch32.2", "emitted": "ch32.1"})
def spec_confidence(f: Figure, r: dict) -> None:
    tokens, conf, surv, theta = r["tokens"], r["confidences"], r["survivals"], r["threshold"]
    n, n_want, sent = r["n"], r["n_expected"], r["verified"]
    k = len(tokens)
    f.instance_row([(f"k = {k} drafts", "token"), (f"V = {len(r['race_weights'])} tokens", "plain"),
               (f"threshold θ = {num(theta)}", "accent"),
               ("confidence c_i = max_j q_i(j): from q_i, not from x_i", "plain")])

    label_w, col_w = 262, 112
    left = MARGIN + label_w
    cols = lambda i: left + i * col_w
    cw = col_w - 10

    # ① the workload.
    f.heading("① 置信度决定验证多少 · confidence sets the workload: your num_drafts_to_verify")
    f.y += 4
    for i in range(k):
        f.text(cols(i) + cw / 2, f.y + 8, f"draft {i}", anchor="middle", size=SMALL + 0.5, color=MUTED, cls="label")
    y = f.y + 16
    rows = [("draft token x_i", "", [f"token {x}" for x in tokens], lambda i: "token", str),
            ("confidence c_i", "largest probability of q_i", conf, lambda i: "plain", _p),
            ("survival s_i = c_0 · … · c_i", f"sent while s_i ≥ θ = {num(theta)}", surv,
             lambda i: "token" if surv[i] >= theta else "masked", _p)]
    for label, sub, values, role, fmt in rows:
        _label(f, left - 12, y, label, sub, bold=label.startswith("survival"))
        for i, v in enumerate(values):
            f.cell(cols(i), y, v, role=role(i), w=cw, h=CELL, fmt=fmt)
        y += CELL + 8
    # Survival bars against the threshold.
    height = 80
    top = max(max(surv, default=0), theta) * 1.08
    f.bars(cols(0), y + 16, surv, labels=["sent" if i < n_want else "not sent" for i in range(k)], height=height,
           bar_w=cw, gap=col_w - cw, role=["token" if s >= theta else "masked" for s in surv], top=top,
           fmt=lambda v: f"{v:.3g}")
    ty = y + 16 + height * (1 - theta / top)
    _dashed_line(f, cols(0) - 6, ty, cols(k - 1) + cw + 6, stroke("accent"))
    f.text(cols(0) - 10, ty + 4, f"θ = {num(theta)}", anchor="end", size=SMALL + 1, color=stroke("accent"),
           weight="bold", cls="label")
    _label(f, left - 12, y + 6, "survival against θ")
    y += 16 + height + 28
    # n, the student's answer.
    _label(f, left - 12, y, "num_drafts_to_verify → n", "drafts sent for verification", bold=True)
    f.cell(cols(0), y, f"n = {n}", role="token", w=cw, h=CELL, wrong=n != n_want, expected=f"n = {n_want}", fmt=str,
           bold=True)
    f.bracket(cols(0), cols(sent - 1) + cw, y + CELL + 4, f"the {sent} drafts sent to the target model")
    if sent < k:
        f.bracket(cols(sent), cols(k - 1) + cw, y + CELL + 4, "trimmed: never verified")
    f.y = y + CELL + 52

    # ② the verdicts.
    f.heading(f"② 验证决定接受 · verification decides: your verify_draft on the {sent} drafts sent")
    f.y += 6
    q_x, p_x, u, stop = r["q_x"], r["p_x"], r["u"], r["stop"]
    ratio = [min(1.0, p / q) if q > 0 else 0.0 for p, q in zip(p_x, q_x)]
    verdict = ["accept ✓" if i < stop else ("reject ✗" if i == stop else "discarded") for i in range(sent)]
    vrole = ["attend" if i < stop else ("accent" if i == stop else "masked") for i in range(sent)]
    y = f.y
    rows = [("q_i(x_i)", "draft probability of x_i", q_x, lambda i: "plain"),
            ("p_i(x_i)", "target probability of x_i", p_x, lambda i: "plain"),
            ("min(1, p/q)", "the acceptance probability", ratio, lambda i: "plain"),
            ("u_i ~ U(0, 1)", "accept when u_i < min(1, p/q)", u, lambda i: "plain"),
            ("verdict", "", verdict, lambda i: vrole[i])]
    for label, sub, values, role in rows:
        _label(f, left - 12, y, label, sub, bold=label == "verdict")
        for i, v in enumerate(values):
            f.cell(cols(i), y, v, role=role(i), w=cw, h=CELL, fmt=_p, bold=label == "verdict")
        y += CELL + 8

    # The emitted tokens.
    emitted, want = r["emitted"], r["emitted_expected"]
    width = max(len(emitted), len(want))
    kinds = ["accepted draft" if i < stop else ("recovered" if stop < sent else "bonus") for i in range(len(want))]
    _label(f, left - 12, y + 6, "your verify_draft → tokens", f"{len(want)} = accepted + 1", bold=True)
    for i in range(width):
        mine = emitted[i] if i < len(emitted) else "—"
        exp = want[i] if i < len(want) else "—"
        role = "attend" if i < stop else "accent"
        f.cell(cols(i), y + 6, f"token {mine}" if mine != "—" else mine, role=role, w=cw, h=CELL, fmt=str, bold=True,
               wrong=mine != exp, expected=f"token {exp}" if exp != "—" else exp)
        if i < len(kinds):
            f.text(cols(i) + cw / 2, y + 6 + CELL + 14, kinds[i], anchor="middle", size=SMALL + 0.5, color=MUTED,
                   cls="label")
    y += 6 + CELL + 48

    # The race that drew the last token.
    weights, noise, scores = r["race_weights"], r["race_noise"], r["race_scores"]
    winner = max(range(len(scores)), key=lambda j: scores[j])
    V = len(weights)
    recovered = r.get("race_q") is not None
    f.y = y
    what = f"拒绝后的补发 · the recovered token at position {stop}" if recovered else "全部接受后的 bonus · the bonus token"
    f.heading(f"{what}: the exponential race of ch23, argmax weight / E")
    f.y += 4
    rw = 82
    rl = MARGIN + 300
    for j in range(V):
        f.text(rl + j * rw + (rw - 8) / 2, f.y + 8, f"token {j}", anchor="middle", size=SMALL + 0.5, color=MUTED,
               cls="label")
    y = f.y + 16
    race_rows = ([(f"p_{stop}", r["race_p"], "plain"), (f"q_{stop}", r["race_q"], "plain"),
                  (f"max(0, p_{stop} − q_{stop})", weights, "plain")] if recovered else
                 [(f"p_{stop} = target_probs[{stop}]", weights, "plain")])
    race_rows += [(f"noise E = noise[{stop}]", noise, "plain"), ("weight / E", scores, "race")]
    for label, values, role in race_rows:
        _label(f, rl - 12, y, label, bold=label == "weight / E")
        for j, v in enumerate(values):
            cell_role = ("accent" if j == winner else "plain") if role == "race" else (
                "masked" if label.startswith("max") and v == 0 else role)
            f.cell(rl + j * rw, y, v, role=cell_role, w=rw - 8, h=CELL, fmt=lambda v: f"{v:.3g}",
                   bold=role == "race" and j == winner)
        y += CELL + 6
    mine = emitted[len(want) - 1] if len(emitted) == len(want) else None
    if mine is not None and mine != want[-1] and 0 <= mine < V:
        f.text(rl + mine * rw + (rw - 8) / 2, y + 10, "▲ yours", anchor="middle", size=SMALL + 1,
               color=stroke("wrong"), weight="bold", cls="label wrong-pick")
        y += 14
    f.y = y + 16
    accepted = stop
    notes = [f"Draft {stop} had confidence {num(conf[stop])} (survival {surv[stop]:.3g} ≥ θ) and was still rejected: "
             f"u = {num(u[stop])} ≥ min(1, p/q) = {ratio[stop]:.3g}." if stop < sent else
             f"All {sent} drafts sent were accepted, so the bonus token follows.",
             (f"Draft{'s' if sent - stop > 2 else ''} {', '.join(str(i) for i in range(stop + 1, sent))} "
              f"{'were' if sent - stop > 2 else 'was'} verified but discarded: verification stops at the first "
              f"rejection. " if stop + 1 < sent else "")
             + (f"Drafts {sent}–{k - 1} were never sent. " if sent < k - 1 else
                (f"Draft {sent} was never sent. " if sent == k - 1 else ""))
             + f"Tokens emitted: {len(want)} = {accepted} accepted + 1."]
    for line in notes:
        f.note(line, size=SMALL + 1.5)
    f.y += 2
    wrong = n != n_want or emitted != want
    f.legend([("token", "sent / draft tokens"), ("masked", "not sent, discarded, zero weight"),
              ("attend", "accepted"), ("accent", "rejected, threshold, the race's winner")], wrong=wrong)


@figure("ch32-determinism", title="确定性需要一组前提",
        zh="确定性需要一组前提:每一行的归约顺序固定、与批大小无关(批不变性)。同一行在不同批大小下计算,"
           "你的函数每次给出相同的比特;普通的 x @ w 在这台机器上可能不是这样。这是固定提交的配置配方,"
           "不代表跨硬件、跨版本无条件逐位一致。",
        en="Determinism needs preconditions: a fixed reduction order for every row, whatever the batch size (batch "
           "invariance). Row 0 computed in batches of 1 to 64 keeps its bits under your function; plain x @ w, "
           "measured on this machine, need not. It is a recipe at a pinned commit, not bitwise equality across "
           "hardware or versions.",
        needs={"yours": "ch32.3"})
def determinism(f: Figure, r: dict) -> None:
    K, N, batches, col = r["K"], r["N"], r["batches"], r["column"]
    f.instance_row([(f"x: [{max(batches)}, {K}] float32", "token"), (f"w: [{K}, {N}]", "plain"),
               (f"row 0 computed in batches of B = {', '.join(map(str, batches))}", "plain")])
    label_w = 232
    left = MARGIN + label_w
    col_w = (f.width - MARGIN - left) / len(batches)
    cw = col_w - 6
    cols = lambda i: left + i * col_w

    f.heading(f"① 同一行,不同批大小 · the bits of out[0, {col}] for each batch size B")
    f.y += 4
    for i, B in enumerate(batches):
        f.text(cols(i) + cw / 2, f.y + 8, f"B = {B}", anchor="middle", size=SMALL + 1, color=MUTED, cls="label")
    y = f.y + 16
    mine_bits, plain_bits = r["yours_bits"], r["plain_bits"]
    hex_size = SMALL if len(mine_bits[0]) > 6 else VALUE
    rows = [("yours: batch_invariant_matmul", "bits of out[0, %d]" % col, mine_bits, mine_bits[0], "token", True),
            ("", "value", [f"{v:.8g}" for v in r["yours"]], f"{r['yours'][0]:.8g}", "token", False),
            ("", "columns of row 0 changed vs B = 1", r["yours_changed"], 0, "token", True),
            ("plain x @ w (measured here)", "bits of (x @ w)[0, %d]" % col, plain_bits, plain_bits[0], "plain", False),
            ("", "value", [f"{v:.8g}" for v in r["plain"]], f"{r['plain'][0]:.8g}", "plain", False),
            ("", "columns of row 0 changed vs B = 1", r["plain_changed"], 0, "plain", False)]
    wrong = False
    for label, sub, values, same_as, role, graded in rows:
        if label:
            f.text(MARGIN, y + 14, label, size=LABEL, weight="bold", cls="label")
            y += 24
        f.text(left - 12, y + CELL / 2 + 4, sub, anchor="end", size=SMALL + 0.5, color=MUTED, cls="label")
        for i, v in enumerate(values):
            changed = same_as is not None and v != same_as
            bad = graded and changed
            wrong |= bad
            f.cell(cols(i), y, v, role="accent" if changed else role, w=cw, h=CELL - 4, fmt=str,
                   size=hex_size if sub.startswith("bits") else SMALL, wrong=bad, expected=same_as)
        y += CELL + 2
    f.y = y + 12
    f.note(f"Σ_k x[0, k] · w[k, {col}] in float64 = {r['exact']:.9g}. Both functions are within float32 rounding of "
           f"it; a changed bit pattern only means that the terms were added in another order.", size=SMALL + 1.5)
    f.y += 8
    f.heading("② 在这台机器上测得 · measured here: batch sizes at which plain x @ w changes row 0's bits")
    f.y += 4
    for i, B in enumerate(batches):
        f.text(cols(i) + cw / 2, f.y + 8, f"B = {B}", anchor="middle", size=SMALL + 1, color=MUTED, cls="label")
    y = f.y + 16
    any_changed = False
    for p in r["probe"]:
        f.text(left - 12, y + 17, f"{p['dtype']} · K = {p['K']}, N = {p['N']}", anchor="end", size=SMALL + 1.5,
               color=MUTED, cls="label", mono=True)
        for i, B in enumerate(batches):
            ch = B in p["changed"]
            any_changed |= ch
            f.cell(cols(i), y, "changed" if ch else "same", role="accent" if ch else "plain", w=cw, h=CELL - 10,
                   fmt=str, size=SMALL + 1)
        y += CELL - 6
    f.y = y + 14
    gpu = ("On GPUs the same happens through cuBLAS split-K and tile choices made by the number of rows, "
           "FlashDecoding's number of KV splits chosen by batch size, and NCCL's all-reduce algorithm chosen by "
           "message size.")
    if any_changed:
        shapes = [p for p in r["probe"] if p["changed"]]
        f.note(f"On this machine ({r['machine']}) plain x @ w gave row 0 other bits in {len(shapes)} of "
               f"{len(r['probe'])} shapes, from B = {min(min(p['changed']) for p in shapes)} on. {gpu}",
               size=SMALL + 1.5)
    else:
        f.note(f"None found on this machine ({r['machine']}) for these shapes. That does not make x @ w "
               f"batch-invariant: {gpu}", size=SMALL + 1.5)
    f.y += 8
    f.heading("③ 确定性的前提 · the preconditions")
    f.y += 6
    half = (f.width - 2 * MARGIN - 16) / 2
    panels = [("inside the kernels: batch invariance", "token",
               ["matmul: one tile config for every B, no split-K",
                "RMSNorm, softmax, mean: one row per core, no split",
                "attention: a fixed split size (not a fixed number",
                "  of splits); cached and new KV in one order",
                "collectives: a fixed reduction order"]),
              ("around them: a recipe at a pinned commit", "plain",
               ["the same weights, dtype and quantisation",
                "the same GPU architecture",
                "the same engine, torch, CUDA, cuBLAS, NCCL, Triton",
                "the same TP / PP / EP layout",
                "greedy or seeded sampling"])]
    h = 30 + 18 * 5 + 8
    for j, (title, role, lines) in enumerate(panels):
        x = MARGIN + j * (half + 16)
        f.box(x, f.y, half, h, role=role)
        f.text(x + 12, f.y + 20, title, size=LABEL, weight="bold", cls="label")
        for i, line in enumerate(lines):
            f.text(x + 14 + (9 if line.startswith("  ") else 0), f.y + 42 + 18 * i,
                   line.strip() if line.startswith("  ") else "· " + line, size=SMALL + 1.5, color=INK, cls="label")
    f.y += h + 18
    f.note("Not promised: bitwise equality across hardware, library versions or parallel layouts (vLLM's "
           "VLLM_BATCH_INVARIANT=1 and SGLang's --enable-deterministic-inference hold within one fixed setup).",
           size=SMALL + 1.5)
    f.legend([("token", "your function: bits equal to B = 1"), ("plain", "plain x @ w: same bits as B = 1"),
              ("accent", "bits changed with the batch size")], wrong=wrong)
