"""Figures of ch27 · the engine core loop: the loop with its contracts and a step table from the student's
trace, and the three boundaries (computed, placeholders, outputs) of an async request step by step."""

from __future__ import annotations

from figures import figure
from figures.kit import Figure, text_width, wrap
from figures.layout import Part, row
from figures.style import INK, LABEL, MARGIN, MUTED, SMALL, stroke
from grader.i18n import mark, tr

STATUS = {"WAITING": mark("waiting"), "RUNNING": mark("running"), "FINISHED_LENGTH_CAPPED": mark("length"), "FINISHED_STOPPED": "EOS"}
"""A status as a cell shows it (translated where it is drawn)."""


def _requests(ops: list) -> list[tuple[str, int, int, int]]:
    """(request id, prompt length, max_tokens, step after which it was added) for every added request."""
    out, steps = [], 0
    for op in ops:
        if op[0] == "step":
            steps += 1
        elif op[0] == "add":
            out.append((op[1], len(op[2]), op[3], steps))
    return out


def _instance(f: Figure, config: dict, ops: list) -> None:
    f.instance_row(
        [(tr("budget = {n} tokens/step", n=config["budget"]), "plain"), (f"max_num_seqs = {config['max_num_seqs']}", "plain")]
        + [
            (
                tr("{rid}: prompt {p}, max_tokens {m}, added after step {s}", rid=rid, p=p, m=m, s=s)
                if s
                else tr("{rid}: prompt {p}, max_tokens {m}", rid=rid, p=p, m=m),
                "token",
            )
            for rid, p, m, s in _requests(ops)
        ]
    )


BOX_PAD = 14
"""The room, at least, between a box's widest line and either side of it."""
GAP_PAD = 5
"""The room, at least, between a contract's text under an arrow and the boxes on either side."""

LOOP = [
    (mark("Scheduler"), "schedule()", mark("counters advance now"), "block"),
    (mark("Executor → worker"), "execute_model()", mark("runs the model"), "k"),
    (mark("Scheduler"), "update_from_output()", mark("append, check stop"), "block"),
]
"""The loop's three boxes: who, the call, what it does (its state change); the words translated where drawn."""

CONTRACTS = [
    (
        "SchedulerOutput",
        ["num_scheduled_tokens {id: n};", mark("new requests with their prompt (scheduled_new_reqs), the others as diffs")],
    ),
    ("ModelRunnerOutput", ["{id: [sampled token]};", mark("[] for a non-final prefill chunk (the runner blanks it)")]),
]
"""What crosses each arrow between two boxes: its name and its contents, line by line (a line wider than
the gap between the boxes wraps; the words translated where drawn)."""


def _box_width(who: str, call: str, does: str) -> float:
    """A loop box's width: its widest line, with BOX_PAD on either side."""
    return max(text_width(who, SMALL + 1), text_width(call, LABEL + 1, mono=True), text_width(does, SMALL + 0.5)) + 2 * BOX_PAD


def _three_line_box(f: Figure, who: str, call: str, does: str, role: str, *, h: float = 66) -> Part:
    """A loop box as a part: who, the call, what it does, centred, as wide as its widest line allows."""
    w = _box_width(who, call, does)

    def draw(x: float, y: float) -> None:
        f.box(x, y, w, h, role=role)
        f.text(x + w / 2, y + 17, who, anchor="middle", size=SMALL + 1, color=MUTED, cls="label")
        f.text(x + w / 2, y + 37, call, anchor="middle", size=LABEL + 1, mono=True, weight="bold", cls="label")
        f.text(x + w / 2, y + 55, does, anchor="middle", size=SMALL + 0.5, color=MUTED, cls="label")

    return Part(w, h, draw)


def _lines(
    f: Figure, x: float, y: float, lines: list[str], *, anchor: str = "middle", color: str = MUTED, size: float = SMALL + 0.5
) -> None:
    for i, s in enumerate(lines):
        f.text(x, y + i * (size + 4), s, anchor=anchor, size=size, color=color, cls="label")


def _loop_diagram(f: Figure) -> None:
    """schedule() → execute_model() → update_from_output(), the contracts on the arrows, the way back, and the
    outputs leaving for the client. Every box is as wide as its text; the gaps share what is left."""
    boxes = [_three_line_box(f, tr(who), call, tr(does), role) for who, call, does, role in LOOP]
    gap = (f.width - 2 * MARGIN - sum(b.w for b in boxes)) / (len(LOOP) - 1)
    # The outputs leave update_from_output() upwards, to the client; the loop closes below.
    out_y = f.y + 10
    f.text(
        f.width - MARGIN,
        out_y,
        tr("EngineCoreOutputs → client: new_token_ids, finished"),
        anchor="end",
        size=SMALL + 0.5,
        color=INK,
        cls="label",
    )
    f.y = out_y + 40
    f.place(row(*boxes, gap=gap), after=0)
    widths, xs = [b.w for b in boxes], [b.right - b.w for b in boxes]
    h, size, y = boxes[0].h, SMALL, boxes[0].bottom - boxes[0].h
    f.arrow(xs[2] + widths[2] / 2, y - 2, xs[2] + widths[2] / 2, out_y + 6, color=INK, width=1.4)
    bottom = y + h
    for i, (name, contents) in enumerate(CONTRACTS):
        a, b = xs[i] + widths[i], xs[i + 1]
        f.arrow(a + 4, y + h / 2, b - 4, y + h / 2, color=INK, width=1.6)
        f.text((a + b) / 2, y + h / 2 - 8, name, anchor="middle", size=size, color=INK, cls="label")
        lines = [part for line in contents for part in wrap(tr(line), b - a - 2 * GAP_PAD, size)]
        _lines(f, (a + b) / 2, y + h / 2 + 18, lines, size=size)
        bottom = max(bottom, y + h / 2 + 18 + (len(lines) - 1) * (size + 4) + 4)
    # The way back: from update_from_output down, left, and up into schedule().
    by = bottom + 14
    x_end, x_start = xs[0] + widths[0] / 2, xs[2] + widths[2] / 2
    color = stroke("accent")
    f.dwg.add(
        f.dwg.polyline(
            [(x_start, y + h), (x_start, by), (x_end, by), (x_end, y + h + 10)], fill="none", stroke=color, stroke_width=1.6, class_="arrow"
        )
    )
    f.arrow(x_end, y + h + 10, x_end, y + h + 3, color=color, width=1.6)
    note = tr("the next step is scheduled only after this step's result is back (a normal step waits, even with non_block=True)")
    for i, line in enumerate(wrap(note, f.width - 2 * MARGIN, SMALL + 1)):
        f.text(f.width / 2, by + 16 + i * (SMALL + 5), line, anchor="middle", size=SMALL + 1, color=color, cls="label")
    count = len(wrap(note, f.width - 2 * MARGIN, SMALL + 1))
    f.y = by + 16 + (count - 1) * (SMALL + 5) + 24


def _cells(step: dict | None, rid: str) -> list[str]:
    """A request's four cells in one step: scheduled (positions), sampled, C / N, status."""
    if step is None:
        return ["", "", "", ""]
    if rid not in step["requests"]:
        return ["·", "·", "·", tr("later")]
    sched, sampled = "—", "—"
    for b in step["batches"]:
        if rid in b["num_scheduled_tokens"]:
            a, e = b["positions"][rid]
            sched = f"{b['num_scheduled_tokens'][rid]} · {a}" + (f"–{e - 1}" if e - 1 > a else "")
            s = b["sampled_token_ids"].get(rid, [])
            sampled = str(s[0]) if s else tr("blank")
    s = step["requests"].get(rid)
    if s is None:
        return [sched, sampled, "", ""]
    return [
        sched,
        sampled,
        f"{s['num_computed_tokens']} / {s['num_tokens']}",
        tr(STATUS[s["status"]]) if s["status"] in STATUS else s["status"],
    ]


def _emitted(step: dict | None) -> str:
    if step is None:
        return ""
    outs = step.get("outputs") or []
    return (
        ", ".join(f"{o['request_id']} {' '.join(map(str, o['new_token_ids'])) or '[]'}" + (" ■" if o.get("finished") else "") for o in outs)
        or "—"
    )


@figure(
    "ch27-enginecore-loop",
    title="EngineCore 闭环",
    zh="每一步都走同一个闭环:schedule() 给出计划并当场推进 num_computed_tokens;execute_model() 运行模型并采样。"
    "update_from_output() 追加 token、检查停止条件。普通 step 等结果回来才调度下一步,"
    "non_block=True 本身并不带来重叠。",
    en="The engine-core loop and its cross-layer contracts: schedule() plans the step and advances "
    "num_computed_tokens at once, execute_model() runs and samples, update_from_output() appends and checks the "
    "stop conditions; a normal step waits for its result before it schedules again (non_block=True alone "
    "creates no overlap).",
    needs={"trace": "ch27.1"},
)
def enginecore_loop_figure(f: Figure, r: dict) -> None:
    config, ops, trace, expected = r["config"], r["ops"], r["trace"], r["expected"]
    _instance(f, config, ops)
    _loop_diagram(f)

    f.heading(tr("your steps (C / N = num_computed_tokens / num_tokens after the step)"))
    rids = [rid for rid, *_ in _requests(ops)]
    widths = [76, 58, 66, 62]
    step_w, emit_w, gap = 46, 170, 12
    x0 = MARGIN
    top = f.y + 8
    for i, rid in enumerate(rids):
        gx = x0 + step_w + i * (sum(widths) + gap)
        f.chip(tr("request {rid}", rid=rid), role="token", w=sum(widths) - 4, h=20).at(gx, top)
        for j, label in enumerate([tr("scheduled · pos"), tr("sampled"), "C / N", tr("status")]):
            f.text(gx + sum(widths[:j]) + (widths[j] - 4) / 2, top + 36, label, anchor="middle", size=SMALL, color=MUTED, cls="label")
    ex = x0 + step_w + len(rids) * (sum(widths) + gap)
    f.text(ex + emit_w / 2, top + 36, tr("emitted (■ finished)"), anchor="middle", size=SMALL, color=MUTED, cls="label")
    f.text(x0 + 18, top + 36, tr("step"), anchor="middle", size=SMALL, color=MUTED, cls="label")
    quiet, finished = ("·", tr("later"), tr("blank")), (tr("length"), "EOS")
    y = top + 44
    wrong = False
    for k in range(max(len(trace), len(expected))):
        mine = trace[k] if k < len(trace) else None
        want = expected[k] if k < len(expected) else None
        f.text(x0 + 18, y + 19, str(k + 1), anchor="middle", size=LABEL, mono=True, cls="label")
        for i, rid in enumerate(rids):
            gx = x0 + step_w + i * (sum(widths) + gap)
            got, exp = _cells(mine, rid), _cells(want, rid)
            for j, (g, e) in enumerate(zip(got, exp)):
                bad = g != e
                wrong |= bad
                role = (
                    "masked"
                    if g in quiet
                    else ("block" if g not in ("—", "") else "plain")
                    if j == 0
                    else ("k" if g not in ("—", "") else "plain")
                    if j == 1
                    else ("accent" if g in finished else "plain")
                )
                f.cell(
                    gx + sum(widths[:j]),
                    y,
                    g,
                    role=role,
                    w=widths[j] - 4,
                    h=30,
                    fmt=str,
                    wrong=bad,
                    expected=e if bad else None,
                    size=SMALL + 1.5,
                )
        g, e = _emitted(mine), _emitted(want)
        wrong |= g != e
        f.cell(
            ex,
            y,
            g,
            role="new" if g not in ("—", "") else "plain",
            w=emit_w,
            h=30,
            fmt=str,
            wrong=g != e,
            expected=e if g != e else None,
            size=SMALL + 1.5,
        )
        y += 34
    f.y = y + 16
    blanks = [(k + 1, rid) for k, s in enumerate(trace) for b in s["batches"] for rid, v in b["sampled_token_ids"].items() if not v]
    if blanks:
        steps = tr(", ").join(tr("step {k} ({rid})", k=k, rid=rid) for k, rid in blanks)
        f.note(
            tr(
                "Blank samples, {steps}: the chunk ends before the request's last known token (seq_len < num_tokens), "
                "so the runner returns [] and nothing is appended or emitted. Every other sample is appended at once: "
                "after each step a generating request has C = N − 1.",
                steps=steps,
            ),
            size=SMALL + 1.5,
        )
    f.legend(
        [
            ("block", tr("scheduler: tokens scheduled (positions)")),
            ("k", tr("worker: sampled and kept")),
            ("masked", tr("blank: a non-final chunk's sample")),
            ("new", tr("emitted to the client")),
            ("accent", tr("finished")),
        ],
        wrong=wrong,
    )


# -- ch27.2 -------------------------------------------------------------------------------------------
def _row_label(step: dict, k: int) -> list[str]:
    launched = [
        tr(
            "step {k}: launch S{batch} {plan}",
            k=k,
            batch=b["batch"],
            plan="{" + ", ".join(f"{r}: {n}" for r, n in b["num_scheduled_tokens"].items()) + "}",
        )
        for b in step["batches"]
    ]
    got = [f"{o['request_id']} +{' '.join(map(str, o['new_token_ids']))}" for o in step.get("outputs") or []]
    return [
        launched[0] if launched else tr("step {k}: launch nothing", k=k),
        tr("outputs back: {outputs}", outputs=", ".join(got)) if got else tr("no output yet"),
    ]


@figure(
    "ch27-three-boundaries",
    title="三个边界分开看",
    zh="异步调度提前一步调度:num_computed_tokens(已调度)先走,占位符 ? 记下还在路上的 token,"
    "num_tokens(已输出)要等输出回来才前进;每次对账后 computed = num_tokens + placeholders − 1。",
    en="Scheduled, computed and output boundaries differ under async steps and are reconciled: "
    "num_computed_tokens runs ahead at schedule time, placeholders (?) count the tokens in flight, "
    "num_tokens advances only when an output is processed; after each reconcile, C = N + ph − 1.",
    needs={"trace": "ch27.2"},
)
def three_boundaries_figure(f: Figure, r: dict) -> None:
    config, ops, trace, expected = r["config"], r["ops"], r["trace"], r["expected"]
    _instance(f, config, ops)
    rid, plen, _, _ = _requests(ops)[0]
    f.heading(tr("request {rid} after each step (async: a batch queue of 2)", rid=rid))
    label_w, cw = 196, 33
    sx = MARGIN + label_w
    npos = (
        max(
            [
                s["requests"][rid]["num_tokens"] + s["requests"][rid]["num_output_placeholders"]
                for s in trace + expected
                if rid in s["requests"]
            ]
            + [plen]
        )
        + 1
    )
    cx = sx + npos * cw + 16
    top = f.y + 8
    for p in range(npos):
        f.text(sx + p * cw + (cw - 3) / 2, top + 8, str(p), anchor="middle", size=SMALL, color=MUTED, mono=True, cls="label")
    for j, label in enumerate(["C", "N", "ph"]):
        f.text(cx + j * 44 + 20, top + 8, label, anchor="middle", size=SMALL + 1, weight="bold", cls="label")
    f.text(cx + 3 * 44 + 4, top + 8, "C = N + ph − 1", size=SMALL, color=MUTED, cls="label")
    y = top + 18
    wrong = False
    for k in range(max(len(trace), len(expected))):
        mine = trace[k] if k < len(trace) else None
        want = expected[k] if k < len(expected) else None
        shown = mine or want
        assert shown is not None  # k < max(len(trace), len(expected))
        _lines(f, MARGIN, y + 12, _row_label(shown, k + 1), anchor="start", color=INK, size=SMALL + 1)
        s = shown["requests"].get(rid)
        if s is not None:
            C, N, ph = s["num_computed_tokens"], s["num_tokens"], s["num_output_placeholders"]
            arrived = sum(len(o["new_token_ids"]) for o in shown.get("outputs") or [] if o["request_id"] == rid)
            outs = s["output_token_ids"]
            for p in range(npos):
                x = sx + p * cw
                if p < N:
                    f.cell(
                        x,
                        y,
                        outs[p - plen] if p >= plen else f"p{p}",
                        role="k" if p >= plen else "token",
                        w=cw - 3,
                        h=26,
                        fmt=str,
                        size=SMALL + 1,
                    )
                    if p >= N - arrived:
                        ring = f.dwg.rect(
                            (x - 1.5, y - 1.5), (cw, 29), fill="none", stroke=stroke("accent"), stroke_width=2, class_="arrived"
                        )
                        ring["stroke-dasharray"] = "3,2"
                        f.dwg.add(ring)
                elif p < N + ph:
                    f.cell(x, y, "?", role="accent", w=cw - 3, h=26, fmt=str, dashed=True, size=SMALL + 2)
                else:
                    f.cell(x, y, "", role="plain", w=cw - 3, h=26, dashed=True)
            # the computed boundary: a bar under the strip over positions 0 … C − 1
            f.dwg.add(f.dwg.rect((sx, y + 29), (max(C * cw - 3, 0), 5), fill=stroke("block"), class_="boundary"))
            f.dwg.add(f.dwg.line((sx + N * cw - 1.5, y - 3), (sx + N * cw - 1.5, y + 30), stroke=INK, stroke_width=2.2, class_="boundary"))
        got = [
            mine["requests"][rid][k2] if mine and rid in mine["requests"] else ""
            for k2 in ("num_computed_tokens", "num_tokens", "num_output_placeholders")
        ]
        exp = [
            want["requests"][rid][k2] if want and rid in want["requests"] else ""
            for k2 in ("num_computed_tokens", "num_tokens", "num_output_placeholders")
        ]
        for j, (g, e) in enumerate(zip(got, exp)):
            bad = g != e
            wrong |= bad
            f.cell(
                cx + j * 44,
                y,
                g,
                role="block" if j == 0 else "plain" if j == 1 else "accent",
                w=40,
                h=26,
                wrong=bad,
                expected=e if bad else None,
                size=SMALL + 2,
            )
        mine_s = mine["requests"].get(rid) if mine else None
        if mine_s is not None and mine_s["output_token_ids"]:
            holds = mine_s["num_computed_tokens"] == mine_s["num_tokens"] + mine_s["num_output_placeholders"] - 1
            f.text(
                cx + 3 * 44 + 4,
                y + 17,
                ("✓ " if holds else "✗ ") + f"{mine_s['num_computed_tokens']} = "
                f"{mine_s['num_tokens']} + {mine_s['num_output_placeholders']} − 1",
                size=SMALL + 0.5,
                color=INK if holds else stroke("wrong"),
                mono=True,
                cls="label",
            )
        y += 46
    f.y = y + 6
    f.note(
        tr(
            "The purple bar ends at C, the scheduled/computed boundary (advanced when a batch is launched); the black "
            "line is N, the output boundary (advanced when a batch's output is reconciled); each ? is a placeholder, a "
            "token sampled by a batch still in flight. A ringed token arrived in this step: until its batch was reconciled "
            "it was still a ?, so right after the launch two tokens were in flight. A non-final chunk (step 1) adds no placeholder."
        ),
        size=SMALL + 1.5,
    )
    f.legend(
        [
            ("token", tr("prompt token (p0, p1, …)")),
            ("k", tr("output token (reconciled)")),
            ("accent", tr("placeholder ?: in flight")),
            ("block", tr("computed / scheduled (C)")),
        ],
        wrong=wrong,
    )


# -- ch27.3 -------------------------------------------------------------------------------------------
def _spec_steps(rounds: list, expected: list) -> list[str]:
    """Each step of the instance in words, from the reference's record: "3 drafts, 1 accepted"."""
    out = []
    for k, drafts in enumerate(rounds):
        if not drafts:
            out.append(tr("no drafts"))
            continue
        a = len(expected[k]["generated"]) - 1 if k < len(expected) else "?"
        out.append(tr("{n} drafts, {a} right", n=len(drafts), a=a))
    return out


def _spec_strip(f: Figure, x0: float, y: float, cw: float, npos: int, s: dict, plen: int, extra: dict[int, tuple]) -> None:
    """A request's positions 0 … npos − 1 as cells: prompt (p0, …), outputs, then `extra` {position: (value,
    role, dashed)} (drafts in flight, rolled-back positions), and empty dashed cells beyond."""
    outs, n = s["output_token_ids"], s["num_tokens"]
    for p in range(npos):
        x = x0 + p * cw
        if p < n and p not in extra:
            f.cell(
                x, y, outs[p - plen] if p >= plen else f"p{p}", role="k" if p >= plen else "token", w=cw - 3, h=26, fmt=str, size=SMALL + 1
            )
        elif p in extra:
            value, role, dashed = extra[p]
            f.cell(x, y, value, role=role, w=cw - 3, h=26, fmt=str, dashed=dashed, size=SMALL + 1)
        else:
            f.cell(x, y, "", role="plain", w=cw - 3, h=26, dashed=True)


@figure(
    "ch27-spec-counters",
    title="投机解码里的三个计数",
    zh="投机解码:调度时草稿也算进 num_computed_tokens(C 先走到 N + k);目标模型接受前 a 个草稿并自己再采样一个,"
    "对账时 C 回到 N + a(被拒绝的 k − a 个位置不算),追加 a + 1 个输出;之后仍在运行的请求再次有 C = N − 1。",
    en="Speculative decoding in the progress counters: at schedule time the k drafts count as tokens to compute (C "
    "runs ahead to N + k); the target model accepts the first a and samples one token of its own; the update "
    "rolls C back over the k − a rejected drafts and appends a + 1 outputs, so a running request has C = N − 1 "
    "again.",
    needs={"trace": "ch27.3"},
)
def spec_counters_figure(f: Figure, r: dict) -> None:
    config, rounds, trace, expected = r["config"], r["rounds"], r["trace"], r["expected"]
    rid, plen = config["request_id"], len(config["prompt_token_ids"])
    f.instance_row(
        [(tr("{rid}: prompt {p}, max_tokens {m}", rid=rid, p=plen, m=config["max_tokens"]), "token")]
        + [(tr("step {k}: {what}", k=k + 1, what=s), "plain") for k, s in enumerate(_spec_steps(rounds, expected))]
    )
    f.heading(tr("request {rid}, each step twice: after schedule_spec, after update_spec", rid=rid))
    label_w, cw, cgap = 150, 30, 44
    sx = MARGIN + label_w
    npos = max([s[key]["num_tokens"] + len(s["drafts"]) for s in trace + expected for key in ("before",)] + [plen]) + 1
    cx = sx + npos * cw + 12
    top = f.y + 8
    for p in range(npos):
        f.text(sx + p * cw + (cw - 3) / 2, top + 8, str(p), anchor="middle", size=SMALL, color=MUTED, mono=True, cls="label")
    for j, label in enumerate(["n / −rej", "C", "N"]):
        f.text(cx + j * cgap + 20, top + 8, label, anchor="middle", size=SMALL + 0.5, weight="bold", cls="label")
    y = top + 18
    wrong = False
    for k in range(max(len(trace), len(expected))):
        mine = trace[k] if k < len(trace) else None
        want = expected[k] if k < len(expected) else None
        shown = mine or want
        assert shown is not None  # k < max(len(trace), len(expected))
        drafts, gen = shown["drafts"], shown["generated"]
        a = len(gen) - 1
        sched = shown["after_schedule"]
        # after schedule_spec: the drafts ride along, C runs ahead over them.
        _lines(
            f,
            MARGIN,
            y + 11,
            [tr("step {k}: {what}", k=k + 1, what="schedule_spec"), tr("{n} drafts", n=len(drafts)) if drafts else tr("no drafts")],
            anchor="start",
            color=INK,
            size=SMALL + 1,
        )
        n0 = sched["num_tokens"]
        _spec_strip(f, sx, y, cw, npos, sched, plen, {n0 + i: (d, "accent", True) for i, d in enumerate(drafts)})
        f.dwg.add(f.dwg.rect((sx, y + 29), (max(sched["num_computed_tokens"] * cw - 3, 0), 5), fill=stroke("block"), class_="boundary"))
        row_s = [(mine or {}).get("scheduled", {}), (want or {}).get("scheduled", {})]
        got = [
            row_s[0].get("num_scheduled_tokens", "") if isinstance(row_s[0], dict) else "",
            mine["after_schedule"]["num_computed_tokens"] if mine else "",
            mine["after_schedule"]["num_tokens"] if mine else "",
        ]
        exp = [
            row_s[1].get("num_scheduled_tokens", ""),
            want["after_schedule"]["num_computed_tokens"] if want else "",
            want["after_schedule"]["num_tokens"] if want else "",
        ]
        for j, (g, e) in enumerate(zip(got, exp)):
            wrong |= g != e
            f.cell(
                cx + j * cgap,
                y,
                g,
                role="block" if j == 1 else "plain",
                w=40,
                h=26,
                wrong=g != e,
                expected=e if g != e else None,
                size=SMALL + 2,
            )
        y += 40
        # after update_spec: accepted drafts became outputs, the target's own token is new, C rolled back.
        upd = shown["after_update"]
        rejected = len(drafts) - a if drafts else 0
        _lines(
            f,
            MARGIN,
            y + 11,
            ["update_spec", tr("{a} accepted, {r} rejected", a=a, r=rejected) if drafts else tr("1 generated")],
            anchor="start",
            color=INK,
            size=SMALL + 1,
        )
        extra = {p: ("✗", "masked", True) for p in range(n0 + a + 1, n0 + len(drafts))}
        _spec_strip(f, sx, y, cw, npos, upd, plen, extra)
        for p in range(n0, min(upd["num_tokens"], n0 + len(gen))):
            ring = f.dwg.rect(
                (sx + p * cw - 1.5, y - 1.5), (cw, 29), fill="none", stroke=stroke("accent"), stroke_width=2, class_="arrived"
            )
            ring["stroke-dasharray"] = "3,2"
            f.dwg.add(ring)
        c_after = upd["num_computed_tokens"]
        f.dwg.add(f.dwg.rect((sx, y + 29), (max(c_after * cw - 3, 0), 5), fill=stroke("block"), class_="boundary"))
        if sched["num_computed_tokens"] > c_after:
            back = f.dwg.rect(
                (sx + c_after * cw, y + 29),
                ((sched["num_computed_tokens"] - c_after) * cw - 3, 5),
                fill="none",
                stroke=stroke("wrong"),
                stroke_width=1,
                class_="rolled-back",
            )
            back["stroke-dasharray"] = "2,2"
            f.dwg.add(back)
        got = [
            (mine["after_schedule"]["num_computed_tokens"] - mine["after_update"]["num_computed_tokens"]) if mine else "",
            mine["after_update"]["num_computed_tokens"] if mine else "",
            mine["after_update"]["num_tokens"] if mine else "",
        ]
        exp = [
            (want["after_schedule"]["num_computed_tokens"] - want["after_update"]["num_computed_tokens"]) if want else "",
            want["after_update"]["num_computed_tokens"] if want else "",
            want["after_update"]["num_tokens"] if want else "",
        ]
        for j, (g, e) in enumerate(zip(got, exp)):
            wrong |= g != e
            shown_g = f"−{g}" if j == 0 and isinstance(g, int) and g > 0 else g
            shown_e = f"−{e}" if j == 0 and isinstance(e, int) and e > 0 else e
            f.cell(
                cx + j * cgap,
                y,
                shown_g,
                role="block" if j == 1 else "plain",
                w=40,
                h=26,
                wrong=g != e,
                expected=shown_e if g != e else None,
                size=SMALL + 2,
                fmt=str,
            )
        y += 48
    f.y = y + 4
    f.note(
        tr(
            "Each step twice. After schedule_spec the drafts (dashed) sit beyond the newest token and the purple bar, "
            "C = num_computed_tokens, already covers them: n = num_tokens_with_spec − C tokens were scheduled. After "
            "update_spec the ringed tokens are the step's outputs (the accepted drafts, then the target's own token), "
            "✗ marks the other rejected drafts, and the dashed outline under the bar is what was rolled back: "
            "k + 1 − len(generated) positions, after which C = N − 1."
        ),
        size=SMALL + 1.5,
    )
    f.legend(
        [
            ("token", tr("prompt token (p0, p1, …)")),
            ("k", tr("output token")),
            ("accent", tr("draft, scheduled")),
            ("masked", tr("rejected draft")),
            ("block", tr("computed / scheduled (C)")),
        ],
        wrong=wrong,
    )
