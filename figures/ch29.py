"""Figures of ch29 · from a schedule to execution metadata; measuring: §D.2's three requests flattened into six
inputs and three candidates, and the client-side latency metrics of a small benchmark run."""

from __future__ import annotations

import math
from typing import Any

from figures import figure
from figures.kit import Figure
from figures.layout import column, pad, row, wide
from figures.style import CELL, INK, LABEL, LABEL_SMALL, MARGIN, MUTED, SMALL, fill, stroke
from grader.i18n import tr

LABELS = 236  # the column of row labels: every grid's cells start there


def _n(x: float) -> str:
    """A metric as a reader would write it: 466.7, 1298, 2.143."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:.4g}" if abs(x) < 1000 else f"{x:.0f}"


# -- ch29.1 -------------------------------------------------------------------------------------------
def rows_of(a: int, e: int) -> str:
    """The rows a … e − 1 of the flattened batch as a reader writes them: "row 4", "rows 0–3"."""
    return tr("row {a}", a=a) if e - a == 1 else tr("rows {a}–{e}", a=a, e=e - 1)


def _situation(q: dict) -> str:
    c, n, known = q["num_computed_tokens"], q["num_scheduled_tokens"], len(q["token_ids"])
    what = tr("non-final chunk") if c + n < known else tr("1 token left") if n == 1 and c > 0 else tr("to the end")
    return tr("{what}: c {c}, n {n}, {known} known", what=what, c=c, n=n, known=known)


@figure(
    "ch29-schedule-to-metadata",
    title="调度计划翻译为执行元数据",
    zh="无 CP、无投机解码、单一标准 KV group:三个请求共 6 个输入,但候选输出最多 3 个(每个请求最后一个被调度的 token),"
    "R0 的 chunk 没到末尾,它的候选被丢弃,只追加 2 个 token。",
    en="A scheduling plan becomes execution metadata (no context parallelism, no spec decode, one standard KV "
    "group): three requests give 6 inputs but at most 3 candidate outputs, one per request at its last "
    "scheduled token; R0's chunk stops short, so its candidate is discarded and 2 tokens are appended.",
    needs={"yours": "ch29.1"},
)
def schedule_to_metadata_figure(f: Figure, r: dict) -> None:
    reqs, B, mine, want, wrong = r["requests"], r["block_size"], r["yours"], r["expected"], r["wrong"]
    # 1. The plan, request by request: computed, scheduled and not-yet-run tokens over their blocks.
    f.heading(tr("the plan, block_size B = {B} (purple: KV already computed; blue: scheduled this step)", B=B))
    f.y += 8
    for i, q in enumerate(reqs):
        c, n, tokens, table = q["num_computed_tokens"], q["num_scheduled_tokens"], q["token_ids"], q["block_table"]
        who = column(
            row(
                f.label(f"R{i}", size=LABEL + 1, color=INK, bold=True),
                pad(f.label(tr("table {table}", table=table), mono=True), top=3),
                gap=8,
            ),
            f.label(_situation(q), size=SMALL),
            gap=2,
        )
        plan = f.matrix([tokens], w=41, h=26, gap=3, role=lambda _, p: "cached" if p < c else "new" if p < c + n else "plain")
        f.place(row(wide(who, LABELS), plan, gap=0), after=29)
        for p in range(len(tokens)):  # each token's position above it; dashed: known, but not run this step
            x, y, w, _ = plan.cell_box(0, p)
            f.text(x + w / 2, y - 3, str(p), anchor="middle", size=SMALL - 1.5, color=MUTED, mono=True, cls="label")
            if p >= c + n:
                f.outline(*plan.cell_box(0, p), role="plain", dashed=True, width=1.2, inset=-1)
        for b in range(-(-len(tokens) // B)):
            x1, y, _, h = plan.cell_box(0, b * B)
            x2 = plan.cell_box(0, min((b + 1) * B, len(tokens)))[0] - 3
            f.bracket(x1, x2, y + h + 3, tr("block {b}", b=table[b]) if b < len(table) else tr("(no block yet)"), size=SMALL)
    f.y += 8

    # 2. The flattened batch: one column per input.
    T = len(want["positions"])
    f.heading(tr("the flattened batch: {T} inputs, one column each (the values are yours)", T=T))
    qsl, qsl_want = mine["query_start_loc"], want["query_start_loc"]
    req_of = [max(i for i in range(len(reqs)) if qsl_want[i] <= t) for t in range(T)]
    lines = [
        (tr("request"), [f"R{i}" for i in req_of], [f"R{i}" for i in req_of], [False] * T, "plain"),
        ("position = c + j", mine["positions"], want["positions"], wrong["positions"], "token"),
        ("input_id = token_ids[pos]", mine["input_ids"], want["input_ids"], wrong["input_ids"], "new"),
        (f"slot = table[pos // {B}]·{B} + pos % {B}", mine["slot_mapping"], want["slot_mapping"], wrong["slot_mapping"], "block"),
    ]
    batch = f.matrix(
        [values for _, values, *_ in lines],
        expected=[e for *_, e, _, _ in lines],
        wrong=[w for *_, w, _ in lines],
        role=lambda k, _: lines[k][4],
        fmt=str,
        w=66,
        h=CELL,
        gap=5,
        row_labels=[label for label, *_ in lines],
        label_w=LABELS,
    )
    f.place(pad(batch, top=26), after=0)
    for i in range(len(reqs)):
        a, e = qsl[i], qsl[i + 1]
        if e > a:
            x, y, _, _ = batch.cell_box(0, a)
            f.bracket(x, batch.cell_box(0, e)[0] - 5 - 6, y - 6, f"R{i}: {rows_of(a, e)}", below=False, size=SMALL + 0.5)
    for t in range(T):  # the slot's derivation under each column
        q, p = reqs[req_of[t]], want["positions"][t]
        blk = q["block_table"][p // B] if p // B < len(q["block_table"]) else "?"
        x, y, w, h = batch.cell_box(len(lines) - 1, t)
        f.text(x + w / 2, y + h + 13, f"{blk}·{B} + {p % B}", anchor="middle", size=SMALL - 0.5, color=MUTED, mono=True, cls="label")
    # logits rows: the student's logits_indices, each a "sample" in its column.
    li, li_want = mine["logits_indices"], want["logits_indices"]
    samples = f.matrix(
        [[tr("sample") if t in li else "" for t in range(T)]],
        fmt=str,
        w=66,
        h=CELL - 6,
        gap=5,
        role=lambda _, t: "accent" if t in li else "plain",
        expected=[[tr("sample") if t in li_want else "·" for t in range(T)]],
        wrong=[[(t in li) != (t in li_want) for t in range(T)]],
        row_labels=["logits_indices = qsl[1:] − 1"],
        label_w=LABELS,
    )
    f.place(pad(samples, top=24), after=24)

    # 3. Per request: query_start_loc, seq_lens and whether the candidate is kept.
    f.heading(tr("per request: seq_len = c + n; the candidate is kept only if seq_len reaches num_tokens"))
    R = len(reqs)
    known = [len(q["token_ids"]) for q in reqs]
    keep, discard = tr("keep"), tr("discard")
    kept = [keep if k else discard for k in mine["kept"]]
    kept_want = [keep if k else discard for k in want["kept"]]
    cells: dict[str, Any] = {"w": 66, "h": 30, "gap": 6}
    starts = f.matrix(
        [qsl],
        expected=[qsl_want],
        wrong=[wrong["query_start_loc"]],
        role="token",
        **cells,
        row_labels=["query_start_loc"],
        col_labels=[f"[{i}]" for i in range(R + 1)],
        label_w=LABELS,
    )
    per_request = f.matrix(
        [mine["seq_lens"], known, kept],
        expected=[want["seq_lens"], known, kept_want],
        wrong=[wrong["seq_lens"], [False] * R, wrong["kept"]],
        fmt=str,
        **cells,
        role=lambda i, j: "plain" if i < 2 else "accent" if kept[j] == keep else "masked",
        row_labels=["seq_len = c + n", tr("num_tokens known"), tr("kept (sample at logits row)")],
        col_labels=[f"R{i}" for i in range(R)],
        label_w=LABELS,
    )
    f.place(column(pad(starts, top=4), per_request, gap=10), after=22)
    appended = sum(1 for k in mine["kept"] if k)
    f.note(
        tr(
            "{T} inputs, {n} candidate outputs (logits rows {rows}), {appended} tokens appended. A non-final chunk still "
            "gets a logits row (the runner samples every request at its last scheduled row); its token is thrown away.",
            T=T,
            n=len(li),
            rows=", ".join(map(str, li)),
            appended=appended,
        ),
        size=LABEL_SMALL + 0.5,
    )
    f.legend(
        [
            ("cached", tr("KV side: computed prefix, slots in the pool")),
            ("new", tr("scheduled this step, input ids")),
            ("accent", tr("sampled and kept")),
            ("masked", tr("sample discarded")),
        ],
        wrong=any(any(v) for v in wrong.values()),
    )


# -- ch29.2 -------------------------------------------------------------------------------------------
@figure(
    "ch29-latency-metrics",
    title="不要把耗时塞进一个 tok/s",
    zh="TTFT、TPOT、ITL、端到端时延和吞吐各有定义:TPOT 按 token 计且不含首 token;ITL 按 chunk 计,合并所有请求的"
    "间隔;吞吐除以整个运行的墙钟时间。图只给测量口径,不提供任何未实测的吞吐数字。",
    en="Don't put everything into one tok/s: TTFT, TPOT, ITL, end-to-end latency and throughput are each defined "
    "separately. TPOT is per token and leaves the first token out; ITL is per chunk, pooled over requests; "
    "throughputs divide by the wall time of the whole run. Measuring rules only, no measured throughput.",
    needs={"yours": "ch29.2"},
)
def latency_metrics_figure(f: Figure, r: dict) -> None:
    reqs, mine, want = r["requests"], r["yours"], r["expected"]
    t0 = min(q["start"] for q in reqs)
    t1 = max(q["chunk_times"][-1] for q in reqs)
    ax0, ax1 = MARGIN + 60, 600
    X = lambda t: ax0 + (t - t0) / (t1 - t0) * (ax1 - ax0)
    f.heading(tr("each request as the client saw it (a box per streamed chunk, its token count inside)"))
    y = f.y + 26
    for i, q in enumerate(reqs):
        s, ch, out = q["start"], q["chunk_times"], q["output_len"]
        f.dwg.add(f.dwg.line((X(s), y + 12), (X(ch[-1]), y + 12), stroke=fill("token"), stroke_width=6))
        f.text(MARGIN, y + 16, f"R{i}", size=LABEL + 1, weight="bold", cls="label")
        f.dwg.add(f.dwg.polygon([(X(s), y + 5), (X(s) + 6, y + 12), (X(s), y + 19), (X(s) - 6, y + 12)], fill=stroke("token")))
        counts = [1] + [0] * (len(ch) - 1)
        rest = out - 1
        for j in range(1, len(ch)):  # the tokens after the first chunk, spread evenly over the later chunks
            counts[j] = rest // (len(ch) - 1) + (1 if j - 1 < rest % (len(ch) - 1) else 0)
        for j, t in enumerate(ch):
            f.cell(X(t) - 8, y + 3, counts[j], role="k", w=16, h=18, size=SMALL)
        ttft, e2e = ch[0] - s, ch[-1] - s
        f.bracket(X(s), X(ch[0]), y + 1, f"TTFT {_n(ttft * 1000)}", below=False, size=SMALL)
        if len(ch) > 1:
            f.bracket(X(s), X(ch[-1]), y + 25, f"E2E {_n(e2e * 1000)} ms", size=SMALL)
        tp = (
            f"TPOT ({_n(e2e * 1000)} − {_n(ttft * 1000)}) / ({out} − 1) = {_n((e2e - ttft) / (out - 1) * 1000)} ms"
            if out > 1
            else tr("one token: no TPOT; E2E {e2e} ms", e2e=_n(e2e * 1000))
        )
        gaps = [b - a for a, b in zip(ch, ch[1:])]
        f.text(ax1 + 20, y + 9, tp, size=SMALL, mono=True, cls="label")
        f.text(
            ax1 + 20,
            y + 23,
            f"ITLs {', '.join(_n(g * 1000) for g in gaps[:5])} ms" if gaps else tr("ITLs none"),
            size=SMALL,
            mono=True,
            color=MUTED,
            cls="label",
        )
        y += 66
    # the axis and the run's duration
    f.dwg.add(f.dwg.line((ax0, y), (ax1, y), stroke=MUTED, stroke_width=1))
    step = 0.2 if t1 - t0 <= 2 else 0.5 if t1 - t0 <= 5 else 1.0
    tick = math.ceil(t0 / step) * step
    while tick <= t1 + 1e-9:
        f.dwg.add(f.dwg.line((X(tick), y), (X(tick), y + 4), stroke=MUTED, stroke_width=1))
        f.text(X(tick), y + 15, f"{tick:.1f}", anchor="middle", size=SMALL - 0.5, color=MUTED, mono=True, cls="label")
        tick += step
    f.text(ax1 + 8, y + 4, tr("time (s)"), size=SMALL, color=MUTED, cls="label")
    f.bracket(ax0, ax1, y + 22, tr("duration = last chunk − first start = {d} s", d=_n(want["duration"])), size=SMALL + 1)
    f.y = y + 64

    # the aggregates, the student's values, marked where the check found them wrong
    wrong = r["wrong"]
    f.heading(tr("your statistics (ms), and the throughputs"))
    metrics = [("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", tr("ITL (pooled)")), ("e2el", "E2E")]
    keys = [[f"{s}_{m}_ms" for s in ("mean", "median", "p99")] for m, _ in metrics]
    stats = f.matrix(
        [[mine[k] for k in line] for line in keys],
        expected=[[want[k] for k in line] for line in keys],
        wrong=[[wrong[k] for k in line] for line in keys],
        w=82,
        h=30,
        gap=4,
        fmt=_n,
        role=lambda i, _: "q" if i in (1, 2) else "plain",
        row_labels=[label for _, label in metrics],
        col_labels=[tr("mean"), tr("median"), "p99"],
    )
    duration = _n(want["duration"])
    rates = [
        ("request_throughput", tr("{n} requests / {d} s", n=want["completed"], d=duration), "req/s"),
        ("output_throughput", tr("{n} output tokens / {d} s", n=want["total_output_tokens"], d=duration), "tok/s"),
        (
            "total_token_throughput",
            tr("({i} + {o}) tokens / {d} s", i=want["total_input_tokens"], o=want["total_output_tokens"], d=duration),
            "tok/s",
        ),
    ]
    throughputs = column(
        *(
            row(
                wide(column(f.label(key, mono=True), f.label(f"= {how}", size=SMALL), gap=1), 262),
                f.matrix([[mine[key]]], expected=[[want[key]]], wrong=[[wrong[key]]], role="v", w=66, h=28, fmt=_n),
                f.label(unit, size=SMALL),
                gap=6,
                align="middle",
            )
            for key, how, unit in rates
        ),
        gap=6,
    )
    f.place(pad(row(stats, pad(throughputs, top=16), gap=36), top=4), after=20)
    note = tr(
        "Mean TPOT {tpot} ms and mean ITL {itl} ms differ: a chunk that carries 2 tokens is one ITL but two tokens of "
        "TPOT. A one-token request has no TPOT and no ITL; it still counts in TTFT, E2E and the throughputs. These are "
        "measuring rules, not a benchmark result.",
        tpot=_n(mine["mean_tpot_ms"]),
        itl=_n(mine["mean_itl_ms"]),
    )
    f.note(note, size=LABEL_SMALL + 0.5)
    f.legend(
        [
            ("token", tr("request in flight (start ◆ to last chunk)")),
            ("k", tr("streamed chunk (tokens in it)")),
            ("q", tr("per-token / per-chunk latency")),
            ("v", tr("throughput over the whole run")),
        ],
        wrong=any(wrong.values()),
    )
