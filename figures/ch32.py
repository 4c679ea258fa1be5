"""Figures of ch32 · speculative decoding and determinism: confidence sizes the verification and verification
decides acceptance; the bits of one row across batch sizes, measured beside plain x @ w, and the preconditions
of determinism."""

from __future__ import annotations

from figures import figure
from figures.kit import Figure, Grid, num
from figures.layout import Part, column, pad, row
from figures.style import CELL, INK, LABEL, LABEL_SMALL, MARGIN, MUTED, SMALL, VALUE, stroke
from grader.i18n import language, tr


def row_label(f: Figure, text: str, sub: str = "", *, bold: bool = False, mono: bool = False, h: float = CELL) -> Part:
    """A row's label, with an optional second line in small type, right-aligned and centred on a row `h` high."""
    part = column(
        f.label(text, size=LABEL, color=INK if bold else MUTED, bold=bold, mono=mono),
        f.label(sub, size=SMALL) if sub else None,
        gap=1,
        align="right",
    )
    return pad(part, top=(h - part.h) / 2, bottom=(h - part.h) / 2)


def labelled(f: Figure, grid: Grid, labels: list[Part], gutter: float, gap: float = 12) -> Part:
    """`grid` with a label left of each of its rows (`row_label`), right-aligned in a gutter `gutter` wide, so that
    grids labelled with the same gutter line up."""
    side = column(*labels, gap=grid.gap, align="right")
    return row(pad(side, left=max(0.0, gutter - gap - side.w), top=grid.label_h), grid, gap=gap)


def _p(x) -> str:
    return "—" if x is None else (f"{x:.3g}" if isinstance(x, float) else str(x))


def num3(x: float) -> str:
    """A value to three significant digits, as the figure's cells show it."""
    return format(x, ".3g")


def _dashed_line(f: Figure, x1: float, y: float, x2: float, color: str) -> None:
    line = f.dwg.line((x1, y), (x2, y), stroke=color, stroke_width=1.4, class_="threshold")
    line["stroke-dasharray"] = "5,3"
    f.dwg.add(line)


@figure(
    "ch32-spec-confidence",
    title="置信度决定验证工作量",
    zh="置信度决定验证多少个草稿,不直接决定接受:生存概率(置信度的累乘)低于阈值的草稿不送去验证;"
    "送去验证的草稿由拒绝采样逐个判定,置信度高的草稿也可能被拒绝。预测接受率与真正的接受/拒绝是两个步骤。",
    en="Confidence sets how much is verified; acceptance is decided by verification. Drafts whose survival "
    "(the running product of confidences) falls below the threshold are not sent; the drafts sent are judged "
    "one by one by rejection sampling, and a confident draft can still be rejected.",
    needs={"n": "ch32.2", "emitted": "ch32.1"},
)
def spec_confidence(f: Figure, r: dict) -> None:
    tokens, conf, surv, theta = r["tokens"], r["confidences"], r["survivals"], r["threshold"]
    n, n_want, sent = r["n"], r["n_expected"], r["verified"]
    k = len(tokens)
    f.instance_row(
        [
            (tr("k = {k} drafts", k=k), "token"),
            (tr("V = {V} tokens", V=len(r["race_weights"])), "plain"),
            (tr("threshold θ = {theta}", theta=num(theta)), "accent"),
        ],
        note=tr("confidence c_i = max_j q_i(j): a function of q_i, not of the draft x_i"),
    )
    gutter, cw, gap = 262, 102, 10  # the row labels' room; a draft's column

    # 1. The workload: confidences, survivals, and your n.
    f.heading(tr("① confidence sets the workload: your num_drafts_to_verify"))
    workload = f.matrix(
        [[tr("token {x}", x=x) for x in tokens], conf, surv],
        col_labels=[tr("draft {i}", i=i) for i in range(k)],
        role=lambda i, j: "plain" if i == 1 else "masked" if i == 2 and surv[j] < theta else "token",
        w=cw,
        h=CELL,
        gap=gap,
        fmt=_p,
    )
    f.place(
        labelled(
            f,
            workload,
            [
                row_label(f, tr("draft token x_i")),
                row_label(f, tr("confidence c_i"), tr("largest probability of q_i")),
                row_label(f, tr("survival s_i = c_0 · … · c_i"), tr("sent while s_i ≥ θ = {theta}", theta=num(theta)), bold=True),
            ],
            gutter,
        ),
        after=16,
    )
    cols = [workload.cell_box(0, i)[0] for i in range(k)]
    height = 80  # survival bars against the threshold
    top = max(max(surv, default=0), theta) * 1.08
    f.bars(
        cols[0],
        f.y,
        surv,
        labels=[tr("sent") if i < n_want else tr("not sent") for i in range(k)],
        height=height,
        bar_w=cw,
        gap=gap,
        role=["token" if s >= theta else "masked" for s in surv],
        top=top,
        fmt=lambda v: f"{v:.3g}",
    )
    ty = f.y + height * (1 - theta / top)
    _dashed_line(f, cols[0] - 6, ty, cols[-1] + cw + 6, stroke("accent"))
    f.text(cols[0] - 10, ty + 4, f"θ = {num(theta)}", anchor="end", size=LABEL_SMALL, color=stroke("accent"), weight="bold", cls="label")
    label = row_label(f, tr("survival against θ"))
    label.at(cols[0] - 12 - label.w, f.y - 10)
    f.y += height + 28
    answer = f.matrix([[f"n = {n}"]], expected=[[f"n = {n_want}"]], role="token", w=cw, h=CELL, fmt=str)
    f.place(
        labelled(f, answer, [row_label(f, "num_drafts_to_verify → n", tr("drafts sent for verification"), bold=True)], gutter), after=52
    )
    below = answer.cell_box(1, 0)[1] + 4
    f.bracket(cols[0], cols[sent - 1] + cw, below, tr("the {n} drafts sent to the target model", n=sent))
    if sent < k:
        f.bracket(cols[sent], cols[k - 1] + cw, below, tr("trimmed: never verified"))

    # 2. The verdicts on the drafts sent.
    f.heading(tr("② verification decides: your verify_draft on the {n} drafts sent", n=sent))
    f.y += 6
    q_x, p_x, u, stop = r["q_x"], r["p_x"], r["u"], r["stop"]
    ratio = [min(1.0, p / q) if q > 0 else 0.0 for p, q in zip(p_x, q_x)]
    verdict = [tr("accept ✓") if i < stop else (tr("reject ✗") if i == stop else tr("discarded")) for i in range(sent)]
    verdicts = f.matrix(
        [q_x, p_x, ratio, u, verdict],
        w=cw,
        h=CELL,
        gap=8,
        fmt=_p,
        role=lambda i, j: "plain" if i < 4 else "attend" if j < stop else "accent" if j == stop else "masked",
    )
    f.place(
        labelled(
            f,
            verdicts,
            [
                row_label(f, "q_i(x_i)", tr("draft probability of x_i")),
                row_label(f, "p_i(x_i)", tr("target probability of x_i")),
                row_label(f, "min(1, p/q)", tr("the acceptance probability")),
                row_label(f, "u_i ~ U(0, 1)", tr("accept when u_i < min(1, p/q)")),
                row_label(f, tr("verdict"), bold=True),
            ],
            gutter,
        ),
        after=14,
    )

    # The emitted tokens, against the expected ones.
    emitted, want = r["emitted"], r["emitted_expected"]
    width = max(len(emitted), len(want))
    shown = lambda xs: [tr("token {x}", x=xs[i]) if i < len(xs) else "—" for i in range(width)]
    out = f.matrix(
        [shown(emitted)], expected=[shown(want)], role=lambda i, j: "attend" if j < stop else "accent", w=cw, h=CELL, gap=gap, fmt=str
    )
    f.place(
        labelled(f, out, [row_label(f, tr("your verify_draft → tokens"), tr("{n} = accepted + 1", n=len(want)), bold=True)], gutter),
        after=48,
    )
    for i in range(len(want)):
        x, y, w, h = out.cell_box(0, i)
        f.text(
            x + w / 2,
            y + h + 14,
            tr("accepted draft") if i < stop else (tr("recovered") if stop < sent else tr("bonus")),
            anchor="middle",
            size=SMALL + 0.5,
            color=MUTED,
            cls="label",
        )

    # The race that drew the last token.
    weights, noise, scores = r["race_weights"], r["race_noise"], r["race_scores"]
    winner = max(range(len(scores)), key=lambda j: scores[j])
    V = len(weights)
    recovered = r.get("race_q") is not None
    f.heading(
        tr("the recovered token at position {i}: the exponential race of ch23, argmax weight / E", i=stop)
        if recovered
        else tr("the bonus token, all drafts accepted: the exponential race of ch23, argmax weight / E")
    )
    f.y += 4
    race_rows: list[tuple[str, list]] = (
        [(f"p_{stop}", r["race_p"]), (f"q_{stop}", r["race_q"]), (f"max(0, p_{stop} − q_{stop})", weights)]
        if recovered
        else [(f"p_{stop} = target_probs[{stop}]", weights)]
    )
    race_rows += [(f"noise E = noise[{stop}]", noise), ("weight / E", scores)]
    last = len(race_rows) - 1

    def race_role(i: int, j: int) -> str:
        if i == last:
            return "accent" if j == winner else "plain"
        return "masked" if race_rows[i][0].startswith("max") and race_rows[i][1][j] == 0 else "plain"

    race = f.matrix(
        [values for _, values in race_rows],
        role=race_role,
        col_labels=[tr("token {x}", x=j) for j in range(V)],
        w=74,
        h=CELL,
        gap=8,
        fmt=lambda v: f"{v:.3g}",
    )
    f.place(labelled(f, race, [row_label(f, name, bold=i == last) for i, (name, _) in enumerate(race_rows)], 300), after=24)
    mine = emitted[len(want) - 1] if len(emitted) == len(want) else None
    if mine is not None and mine != want[-1] and 0 <= mine < V:
        x, y, w, h = race.cell_box(last, mine)
        f.text(
            x + w / 2,
            y + h + 10,
            tr("▲ yours"),
            anchor="middle",
            size=LABEL_SMALL,
            color=stroke("wrong"),
            weight="bold",
            cls="label wrong-pick",
        )
        f.y += 14
    later = ", ".join(str(i) for i in range(stop + 1, sent))
    tail = []  # the second note, one whole sentence at a time
    if stop + 1 < sent:
        tail.append(
            tr("Drafts {ids} were verified but discarded: verification stops at the first rejection.", ids=later)
            if sent - stop > 2
            else tr("Draft {ids} was verified but discarded: verification stops at the first rejection.", ids=later)
        )
    if sent < k - 1:
        tail.append(tr("Drafts {first}–{last} were never sent.", first=sent, last=k - 1))
    elif sent == k - 1:
        tail.append(tr("Draft {i} was never sent.", i=sent))
    tail.append(tr("Tokens emitted: {n} = {stop} accepted + 1.", n=len(want), stop=stop))
    notes = [
        tr(
            "Draft {i} had confidence {c} (survival {s} ≥ θ) and was still rejected: u = {u} ≥ min(1, p/q) = {ratio}.",
            i=stop,
            c=num(conf[stop]),
            s=num3(surv[stop]),
            u=num(u[stop]),
            ratio=num3(ratio[stop]),
        )
        if stop < sent
        else tr("All {n} drafts sent were accepted, so the bonus token follows.", n=sent),
        ("" if language() == "zh" else " ").join(tail),  # Chinese sentences follow one another without a space
    ]
    for line in notes:
        f.note(line, size=SMALL + 1.5)
    f.y += 2
    wrong = n != n_want or emitted != want
    f.legend(
        [
            ("token", tr("sent / draft tokens")),
            ("masked", tr("not sent, discarded, zero weight")),
            ("attend", tr("accepted")),
            ("accent", tr("rejected, threshold, the race's winner")),
        ],
        wrong=wrong,
    )


@figure(
    "ch32-determinism",
    title="确定性需要一组前提",
    zh="确定性需要一组前提:每一行的归约顺序固定、与批大小无关(批不变性)。同一行在不同批大小下计算,"
    "你的函数每次都要给出固定顺序 k = 0 … K − 1 的比特;普通的 x @ w 在这台机器上可能不是这样。这是固定提交的配置配方,"
    "不代表跨硬件、跨版本无条件逐位一致。",
    en="Determinism needs preconditions: a fixed reduction order for every row, whatever the batch size (batch "
    "invariance). Row 0 computed in batches of 1 to 64 must keep the bits of one fixed order, k = 0 … K − 1, "
    "under your function; plain x @ w, measured on this machine, need not. It is a recipe at a pinned commit, "
    "not bitwise equality across hardware or versions.",
    needs={"yours": "ch32.3"},
)
def determinism(f: Figure, r: dict) -> None:
    K, N, batches, col = r["K"], r["N"], r["batches"], r["column"]
    f.instance_row(
        [(f"x: [{max(batches)}, {K}] float32", "token"), (f"w: [{K}, {N}]", "plain")],
        note=tr("row 0 computed in batches of B = {sizes}", sizes=", ".join(map(str, batches))),
    )
    label_w = 232
    left = MARGIN + label_w
    col_w = (f.width - MARGIN - left) / len(batches)
    cw = col_w - 6
    cols = lambda i: left + i * col_w

    f.heading(tr("① one row, different batch sizes: the bits of out[0, {col}] for each batch size B", col=col))
    f.y += 4
    for i, B in enumerate(batches):
        f.text(cols(i) + cw / 2, f.y + 8, f"B = {B}", anchor="middle", size=SMALL + 1, color=MUTED, cls="label")
    y = f.y + 16
    mine_bits, plain_bits = r["yours_bits"], r["plain_bits"]
    hex_size = SMALL if len(mine_bits[0]) > 6 else VALUE
    expected_bits = r.get("expected_bits", mine_bits)
    wrong_at = r.get("wrong", [False] * len(batches))
    rows = [
        (tr("yours: batch_invariant_matmul"), tr("bits of out[0, {col}]", col=col), mine_bits, "token", True, True),
        ("", tr("value"), [f"{v:.7g}" for v in r["yours"]], "token", False, False),
        ("", tr("columns of row 0 changed vs B = 1"), r["yours_changed"], "token", False, False),
        ("", tr("the fixed order k = 0 … K − 1"), expected_bits, "plain", False, True),
        (tr("plain x @ w (measured here)"), tr("bits of (x @ w)[0, {col}]", col=col), plain_bits, "plain", False, True),
        ("", tr("value"), [f"{v:.7g}" for v in r["plain"]], "plain", False, False),
        ("", tr("columns of row 0 changed vs B = 1"), r["plain_changed"], "plain", False, False),
    ]
    wrong = False
    for label, sub, values, role, graded, bits in rows:
        if label:
            f.text(MARGIN, y + 14, label, size=LABEL, weight="bold", cls="label")
            y += 24
        f.text(left - 12, y + CELL / 2 + 4, sub, anchor="end", size=SMALL + 0.5, color=MUTED, cls="label")
        for i, v in enumerate(values):
            changed = v != values[0]
            bad = graded and bool(wrong_at[i])
            wrong |= bad
            f.cell(
                cols(i),
                y,
                v,
                role="accent" if changed else role,
                w=cw,
                h=CELL - 4,
                fmt=str,
                size=hex_size if bits else SMALL,
                wrong=bad,
                expected=expected_bits[i] if graded else None,
            )
        y += CELL + 2
    f.y = y + 12
    f.note(
        tr(
            "Σ_k x[0, k] · w[k, {col}] in float64 = {exact}. Both functions are within float32 rounding of "
            "it; a changed bit pattern only means that the terms were added in another order. Yours is graded "
            "against the bits of the fixed order, in every batch.",
            col=col,
            exact=format(r["exact"], ".9g"),
        ),
        size=SMALL + 1.5,
    )
    f.y += 8
    f.heading(tr("② measured on this machine: batch sizes at which plain x @ w changes row 0's bits"))
    probes = r["probe"]
    probed = f.matrix(
        [[tr("changed") if B in p["changed"] else tr("same") for B in batches] for p in probes],
        role=lambda i, j: "accent" if batches[j] in probes[i]["changed"] else "plain",
        col_labels=[f"B = {B}" for B in batches],
        w=cw,
        h=CELL - 10,
        gap=col_w - cw,
        fmt=str,
    )
    f.place(
        labelled(f, probed, [row_label(f, f"{p['dtype']} · K = {p['K']}, N = {p['N']}", mono=True, h=CELL - 10) for p in probes], label_w),
        after=24,
    )
    any_changed = any(p["changed"] for p in probes)
    gpu = tr(
        "On GPUs the same happens through cuBLAS split-K and tile choices made by the number of rows, "
        "FlashDecoding's number of KV splits chosen by batch size, and NCCL's all-reduce algorithm chosen by "
        "message size."
    )
    if any_changed:
        shapes = [p for p in r["probe"] if p["changed"]]
        f.note(
            tr(
                "On this machine ({machine}) plain x @ w gave row 0 other bits in {n} of {total} shapes, from B = {B} on. {gpu}",
                machine=r["machine"],
                n=len(shapes),
                total=len(r["probe"]),
                B=min(min(p["changed"]) for p in shapes),
                gpu=gpu,
            ),
            size=SMALL + 1.5,
        )
    else:
        f.note(
            tr(
                "None found on this machine ({machine}) for these shapes. That does not make x @ w batch-invariant: {gpu}",
                machine=r["machine"],
                gpu=gpu,
            ),
            size=SMALL + 1.5,
        )
    f.y += 8
    f.heading(tr("③ the preconditions of determinism"))
    f.y += 6
    half = (f.width - 2 * MARGIN - 16) / 2
    panels = [
        (
            tr("inside the kernels: batch invariance"),
            "token",
            [
                tr("matmul: one tile config for every B, no split-K"),
                tr("RMSNorm, softmax, mean: one row per core, no split"),
                *tr("attention: a fixed split size (not a fixed number\n  of splits); cached and new KV in one order").split("\n"),
                tr("collectives: a fixed reduction order"),
            ],
        ),
        (
            tr("around them: a recipe at a pinned commit"),
            "plain",
            [
                tr("the same weights, dtype and quantisation"),
                tr("the same GPU architecture"),
                tr("the same engine, torch, CUDA, cuBLAS, NCCL, Triton"),
                tr("the same TP / PP / EP layout"),
                tr("greedy or seeded sampling"),
            ],
        ),
    ]
    bullet = lambda line: (
        pad(f.label(line.strip(), size=SMALL + 1.5, color=INK), left=9)
        if line.startswith("  ")
        else f.label("· " + line, size=SMALL + 1.5, color=INK)
    )
    texts = [
        (role, column(f.label(title, size=LABEL, color=INK, bold=True), column(*map(bullet, lines), gap=4), gap=8))
        for title, role, lines in panels
    ]
    h = max(part.h for _, part in texts) + 24
    for j, (role, part) in enumerate(texts):  # each panel in its box, the box drawn first
        f.box(MARGIN + j * (half + 16), f.y, half, h, role=role)
        part.at(MARGIN + j * (half + 16) + 12, f.y + 10)
    f.y += round(h) + 18
    f.note(
        tr(
            "Not promised: bitwise equality across hardware, library versions or parallel layouts (vLLM's "
            "VLLM_BATCH_INVARIANT=1 and SGLang's --enable-deterministic-inference hold within one fixed setup)."
        ),
        size=SMALL + 1.5,
    )
    f.legend(
        [
            ("token", tr("your function: bits equal to B = 1")),
            ("plain", tr("plain x @ w: same bits as B = 1")),
            ("accent", tr("bits changed with the batch size")),
        ],
        wrong=wrong,
    )


@figure(
    "ch32-rms-split",
    title="归约顺序固定,与批大小无关",
    zh="批不变的 RMSNorm:每一行的平方和按固定宽度切块,块内两两相加求和,块和按顺序累加;"
    "块宽与求和顺序都不随批大小改变,所以同一行单算或在任意批里算,比特完全相同。"
    "torch 自带的 sum/mean 自己决定顺序:值对,但比特不是这个顺序的。",
    en="A batch-invariant RMSNorm: each row's sum of squares is cut into chunks of a fixed width, each chunk "
    "summed by halving, the chunk sums added in order. Neither the chunk width nor the tree depends on the "
    "batch, so a row alone and the same row in any batch get the same bits. The library's own sum or mean "
    "picks its own order: the right value, not these bits.",
    needs={"yours": "ch32.4"},
)
def rms_split(f: Figure, r: dict) -> None:
    H, block, batches, col = r["H"], r["block"], r["batches"], r["column"]
    squares, chunk_sums, totals = r["squares"], r["chunk_sums"], r["totals"]
    n_chunks = len(chunk_sums)
    f.instance_row(
        [(f"x: [{max(batches)}, {H}] float32", "token"), (f"block = {block}", "accent"), (f"eps = {r['eps']:g}", "plain")],
        note=tr("row 0 normalised in batches of B = {sizes}", sizes=", ".join(map(str, batches))),
    )

    # 1. The fixed split of row 0.
    f.heading(
        tr("① a fixed split: row 0's {H} squares in {n} chunks of {block} (the last padded with zeros)", H=H, n=n_chunks, block=block)
    )
    f.y += 6
    padded = n_chunks * block
    w = min(15.0, (f.width - 2 * MARGIN) / padded - 1)
    for j in range(padded):
        c = j // block
        pad = j >= H
        f.cell(
            MARGIN + j * (w + 1) + c * 8, f.y, "", role="masked" if pad else ("token" if c % 2 == 0 else "attend"), w=w, h=22, dashed=pad
        )
    top = f.y
    f.y += 22 + 4
    for c in range(n_chunks):
        x1 = MARGIN + c * block * (w + 1) + c * 8
        x2 = x1 + block * (w + 1) - 1
        real = min(block, H - c * block)
        f.bracket(
            x1,
            x2,
            f.y,
            tr("chunk {c}: columns {first}–{last}", c=c, first=c * block, last=c * block + real - 1)
            + (tr(" + {n} zeros", n=block - real) if real < block else ""),
        )
    f.text(MARGIN, top - 4, tr("x[0, j]² in float32"), size=SMALL + 1, color=MUTED, cls="label")
    f.y += 50

    # The halving tree of chunk 0, level by level.
    levels = [squares[: min(block, H)] + [0.0] * (block - min(block, H))]
    while len(levels[-1]) > 1:
        half = len(levels[-1]) // 2
        levels.append([levels[-1][j] + levels[-1][j + half] for j in range(half)])
    f.heading(tr("inside chunk 0: halving, s = s[:h] + s[h:] with h = width / 2, while wider than 1 (values to 3 digits)"))
    f.y += 4
    cw = min(46.0, (f.width - 2 * MARGIN - 90) / block - 2)
    for depth, level in enumerate(levels):
        f.text(MARGIN + 80, f.y + 14, tr("width {n}", n=len(level)), size=SMALL + 1, anchor="end", color=MUTED, cls="label")
        for j, v in enumerate(level):
            f.cell(
                MARGIN + 90 + j * (cw + 2),
                f.y,
                f"{v:.3g}",
                role="accent" if len(level) == 1 else ("token" if depth == 0 else "plain"),
                w=cw,
                h=20,
                size=SMALL - 0.5,
                fmt=str,
            )
        f.y += 24
    f.y += 12

    running = f.matrix(
        [[f"{v:.6g}" for v in chunk_sums], [f"{v:.6g}" for v in totals]],
        col_labels=[tr("chunk {c}", c=c) for c in range(n_chunks)],
        role=lambda i, j: "plain" if i == 0 else "token",
        w=110,
        h=CELL - 6,
        gap=8,
        fmt=str,
        size=SMALL + 1,
    )
    f.place(
        labelled(
            f,
            running,
            [
                row_label(f, tr("chunk sum (by halving)"), h=CELL - 6),
                row_label(f, tr("running total, chunk 0 first"), h=CELL - 6, bold=True),
            ],
            262,
        ),
        after=22,
    )
    f.note(
        tr(
            "inv_rms = 1 / sqrt({total} / {H} + eps); out[0] = (x[0] · inv_rms) · weight in float32, cast once at the end.",
            total=format(totals[-1], ".6g"),
            H=H,
        ),
        size=SMALL + 1.5,
    )
    f.y += 10

    # 2. The bits of out[0, col] in every batch.
    f.heading(tr("② one row, different batch sizes: the bits of out[0, {col}] for each batch size B", col=col))
    label_w = 232
    left = MARGIN + label_w
    col_w = (f.width - MARGIN - left) / len(batches)
    cwb = col_w - 6
    f.y += 4
    for i, B in enumerate(batches):
        f.text(left + i * col_w + cwb / 2, f.y + 8, f"B = {B}", anchor="middle", size=SMALL + 1, color=MUTED, cls="label")
    y = f.y + 16
    expected = r["expected_bits"]
    rows = [
        (tr("yours: batch_invariant_rms_norm"), r["yours_bits"], "token", r["wrong"]),
        (tr("the fixed split (expected)"), expected, "plain", None),
        (tr("torch's own mean (measured here)"), r["plain_bits"], "plain", None),
    ]
    wrong = False
    for label, values, role, graded in rows:
        f.text(left - 12, y + CELL / 2 + 2, label, anchor="end", size=SMALL + 1, color=MUTED, cls="label")
        for i, v in enumerate(values):
            bad = bool(graded[i]) if graded is not None else False
            wrong |= bad
            f.cell(
                left + i * col_w,
                y,
                v,
                role="accent" if v != expected[i] else role,
                w=cwb,
                h=CELL - 4,
                fmt=str,
                size=SMALL,
                wrong=bad,
                expected=expected[i] if bad else None,
            )
        y += CELL + 2
    f.y = y + 10
    differs = sum(bool(d) for d in r["plain_differs"])
    fields = {"col": col, "exact": f"{r['exact']:.9g}", "n": differs, "total": len(batches)}
    f.note(
        tr(
            "RMSNorm of row 0, column {col}, in float64: {exact}. torch's mean of the squares gave other bits than the "
            "fixed split in {n} of {total} batches here (the same bits in every batch: this CPU sums a row alike "
            "whatever B; a GPU kernel splitting a row when rows are few would not). Only a prescribed order makes "
            "the bits a property of the row.",
            **fields,
        )
        if len(set(r["plain_bits"])) == 1
        else tr(
            "RMSNorm of row 0, column {col}, in float64: {exact}. torch's mean of the squares gave other bits than the "
            "fixed split in {n} of {total} batches here. Only a prescribed order makes the bits a property of the row.",
            **fields,
        ),
        size=SMALL + 1.5,
    )
    f.y += 4
    f.legend(
        [
            ("token", tr("your bits")),
            ("plain", tr("the fixed split / torch's mean, same bits")),
            ("accent", tr("other bits than the fixed split")),
        ],
        wrong=wrong,
    )
