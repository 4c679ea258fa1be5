"""Figures of ch24 · the control loop and its counters: one request through the same loop every round,
and the three progresses a request's counters keep apart."""

from __future__ import annotations

from figures import figure
from figures.kit import Figure, num, text_width
from figures.style import INK, LABEL, MARGIN, MUTED, SMALL, VALUE, stroke

ROW_H = 30


def _table_header(f: Figure, sx: float, cw: float, span: int, cols: list[tuple[str, float]]) -> tuple[float, float]:
    """Number the token positions above a row of `span` cells and name the columns right of them;
    returns the x where the columns start and the y of the first row."""
    cx = sx + span * cw + 14
    top = f.y + 26
    for p in range(span):
        f.text(sx + p * cw + (cw - 3) / 2, top - 6, str(p), size=SMALL - 0.5, anchor="middle", mono=True,
               color=MUTED, cls="label")
    f.text(sx, top - 20, "token positions", size=SMALL + 0.5, color=MUTED, cls="label")
    x = cx
    for name, w in cols:
        f.text(x + w / 2 - 3, top - 6, name, size=SMALL + 1, anchor="middle", color=MUTED, cls="label")
        x += w
    return cx, top


def _outline(f: Figure, x: float, y: float, w: float, h: float, *, color: str, width: float = 1.8,
             dashed: bool = False) -> None:
    rect = f.dwg.rect((x, y), (w, h), fill="none", stroke=color, stroke_width=width, class_="outline")
    if dashed:
        rect["stroke-dasharray"] = "4,3"
    f.dwg.add(rect)


def _vline(f: Figure, x: float, y1: float, y2: float, *, color: str = MUTED, dashed: bool = True) -> None:
    line = f.dwg.line((x, y1), (x, y2), stroke=color, stroke_width=1.2, class_="boundary")
    if dashed:
        line["stroke-dasharray"] = "5,3"
    f.dwg.add(line)


def _value(f: Figure, x: float, y: float, w: float, yours, want, *, role: str = "plain", bold: bool = True,
           fmt=num) -> bool:
    """One result cell, marked wrong (yours struck through, expected below) when it differs."""
    bad = yours != want
    f.cell(x, y, "—" if yours is None else yours, role=role, w=w, h=ROW_H, wrong=bad,
           expected=("—" if want is None else want) if bad else None, bold=bold, fmt=fmt, size=VALUE - 1)
    return bad


def _loop_diagram(f: Figure, labels: list[tuple[str, str]], back: str) -> None:
    """Three boxes left to right with arrows, and a return arrow underneath: the same loop every round."""
    y, h, gap = f.y, 46, 44
    w = (f.width - 2 * MARGIN - 2 * gap) / 3
    # One size for the three subtitles, the largest at which each keeps 8 px from its box's sides.
    sub_size = min([SMALL + 0.5] + [(SMALL + 0.5) * (w - 16) / text_width(sub, SMALL + 0.5) for _, sub in labels])
    for i, (title, sub) in enumerate(labels):
        x = MARGIN + i * (w + gap)
        f.box(x, y, w, h, role="accent" if i == 1 else "plain")
        f.text(x + w / 2, y + 19, title, size=LABEL + 1, anchor="middle", mono=True, weight="bold", cls="label")
        f.text(x + w / 2, y + 36, sub, size=round(sub_size, 2), anchor="middle", color=MUTED, cls="label")
        if i < 2:
            f.arrow(x + w + 4, y + h / 2, x + w + gap - 4, y + h / 2, color=INK, width=1.4)
    right, left, low = MARGIN + 2.5 * w + 2 * gap, MARGIN + w / 2, y + h + 22
    path = f.dwg.path(d=f"M{right},{y + h} L{right},{low} L{left},{low} L{left},{y + h + 6}", fill="none",
                      stroke=INK, stroke_width=1.4, class_="arrow")
    f.dwg.add(path)
    f.dwg.add(f.dwg.polygon([(left, y + h), (left - 4, y + h + 7), (left + 4, y + h + 7)], fill=INK))
    f.text((left + right) / 2, low - 5, back, size=SMALL + 1, anchor="middle", color=MUTED, cls="label")
    f.y = low + 30


def _verdict(rd: dict | None) -> str | None:
    """What postprocess did with the round's token, and why: "discard 4 < 10", "append 10 = 10", "append (decode)"."""
    if rd is None:
        return None
    end, total = rd["start"] + rd["n"], rd["num_tokens_before"]
    why = f"{end} < {total}" if end < total else f"{end} = {total}" if rd["prefill"] else "(decode)"
    return f"{'append' if rd['appended'] else 'discard'} {why}"


# -- ch24.1 -------------------------------------------------------------------------------------------

@figure("ch24-control-loop", title="每轮经过相同的控制环",
        zh="同一请求每轮都经过 schedule → 模型计算 → postprocess 这一个环:prompt 分成 4 + 4 + 2 三块计算;"
           "前两块没有算完 prompt,runner 虽然返回了候选 token(第二块的候选甚至是 EOS),postprocess 也不追加它;"
           "第三块算完 prompt 后采样的 token 才被追加,之后每轮 decode 一个 token。",
        en="One request goes through the same loop every round: schedule, compute, postprocess. The prompt is "
           "computed in chunks of 4 + 4 + 2; after an unfinished chunk the runner still returns a candidate token "
           "(the second one is even EOS), and postprocess does not append it. Only the token sampled after the "
           "last chunk is kept; then every round decodes one token.",
        needs={"rounds": "ch24.1"})
def control_loop_figure(f: Figure, r: dict) -> None:
    cfg, prompt, max_tokens = r["config"], r["prompt"], r["max_tokens"]
    rounds, expected = r["rounds"], r["expected"]
    P = len(prompt)

    f.instance_row([(f"A: {P}-token prompt, max_tokens {max_tokens}", "token"),
                    (f"max_num_batched_tokens = {cfg['max_num_batched_tokens']}", "plain"),
                    (f"block_size = {cfg['block_size']}", "plain"), (f"eos = {cfg['eos']}", "plain")])

    f.heading("控制环 · the loop every round goes through")
    f.y += 6
    _loop_diagram(f, [("schedule()", "picks the batch, sets num_scheduled_tokens"),
                      ("model runner", "computes the chunk, samples 1 token"),
                      ("postprocess()", "counts the chunk; appends or discards")],
                  "next round: the same loop again")

    f.heading("请求 A 的每一轮 · request A, round by round (your scheduler's trace)")
    n_rounds = max(len(rounds), len(expected))
    span = max([P + max_tokens] + [x["num_tokens"] for x in rounds + expected])
    label_w, cw = 112, 22
    sx = MARGIN + label_w
    cols = [("runner", 66), ("postprocess", 126), ("status", 88), ("computed", 70), ("num_tokens", 76)]
    cx, top = _table_header(f, sx, cw, span, cols)
    wrong = len(rounds) != len(expected)
    for i in range(n_rounds):
        yy = top + i * (ROW_H + 12)
        got = rounds[i] if i < len(rounds) else None
        want = expected[i] if i < len(expected) else None
        ref = got or want
        kind = "prefill" if ref["prefill"] else "decode"
        f.text(sx - 10, yy + 13, f"round {i + 1}", size=LABEL - 0.5, anchor="end", weight="bold", cls="label")
        f.text(sx - 10, yy + 26, f"step {ref['step']} · {kind}", size=SMALL, anchor="end", color=MUTED, cls="label")
        # The token strip: K/V from earlier rounds, this round's chunk, known but not computed, the kept token.
        if got is not None:
            start, n, before = got["start"], got["n"], got["num_tokens_before"]
            for p in range(span):
                if p < start:
                    role, val = "cached", ""
                elif p < start + n:
                    role, val = "new", ""
                elif p < before:
                    role, val = "plain", ""
                elif p == before and got["appended"]:
                    role, val = "accent", got["token"]
                else:
                    role, val = "masked", ""
                f.cell(sx + p * cw, yy, val, role=role, w=cw - 3, h=ROW_H, size=SMALL, dashed=role == "masked",
                       bold=role == "accent")
            if n:
                _outline(f, sx + start * cw - 1.5, yy - 1.5, n * cw, ROW_H + 3, color=stroke("new"))
        # What the runner returned and what postprocess did with it.
        x = cx
        tok = lambda rd: None if rd is None else f"{rd['token']} EOS" if rd["token"] == cfg["eos"] else rd["token"]
        wrong |= _value(f, x, yy, cols[0][1] - 8, tok(got), tok(want), fmt=str,
                        role="accent" if got and got["appended"] else "masked")
        x += cols[0][1]
        wrong |= _value(f, x, yy, cols[1][1] - 8, _verdict(got), _verdict(want), fmt=str, bold=False)
        x += cols[1][1]
        for key, (name, w) in zip(("status", "num_computed_tokens", "num_tokens"), cols[2:]):
            wrong |= _value(f, x, yy, w - 8, got and got[key], want and want[key], fmt=str if key == "status" else num)
            x += w
    bottom = top + n_rounds * (ROW_H + 12) - 12
    _vline(f, sx + P * cw - 1.5, top - 4, bottom + 6, color=INK)
    f.text(sx + P * cw + 3, bottom + 18, "← prompt | output →", size=SMALL, anchor="middle", color=MUTED,
           cls="label")
    f.y = bottom + 40
    f.note("Each round's chunk is outlined. The runner samples a token for every scheduled sequence, but a "
           "token sampled before the prompt is complete (computed < num_tokens) is a candidate that postprocess "
           "throws away; the status turns RUNNING when the last chunk is scheduled, FINISHED when max_tokens "
           "completion tokens exist (or EOS is appended).", size=SMALL + 1)
    f.legend([("cached", "K/V computed in earlier rounds"), ("new", "this round's chunk"),
              ("plain", "known token, no K/V yet"), ("accent", "token sampled and kept"),
              ("masked", "not generated yet / discarded")], wrong=wrong)


# -- ch24.2 -------------------------------------------------------------------------------------------

@figure("ch24-three-progress", title="三种“进度”",
        zh="不要混淆三种“进度”:num_computed_tokens 是已算出 K/V 的前缀,num_tokens 是已知 token(prompt + 保留的输出),"
           "num_cached_tokens 是首次接纳时前缀缓存命中的 token 数;抢占把计算进度清零,却不动其余两个。"
           "prompt 与输出的分界线不是调度器跟踪的边界,计数器才是契约。",
        en="Three kinds of progress: num_computed_tokens is the prefix with K/V computed, num_tokens the known "
           "tokens (prompt + kept outputs), num_cached_tokens the prefix-cache hit at the first admission. A "
           "preemption resets the computed count and touches neither of the others. The prompt/output line is "
           "not what the scheduler tracks: the counters are the contract.",
        needs={"yours": "ch24.2"})
def three_progress_figure(f: Figure, r: dict) -> None:
    P, steps, yours, expected = r["prompt"], r["steps"], r["yours"], r["expected"]
    span = max([P + 1] + [s["num_tokens"] for s in yours + expected]) + 1

    y = f.y
    f.box(MARGIN, y, 170, 30, role="token", label=f"a {P}-token prompt")
    f.text(MARGIN + 186, y + 13, "vLLM v1 counters (request.py), one synchronous step at a time;",
           size=SMALL + 1, color=MUTED, cls="note")
    f.text(MARGIN + 186, y + 27, "the prefix cache serves whole blocks of 4 tokens", size=SMALL + 1, color=MUTED,
           cls="note")
    f.y = y + 30 + 30

    label_w, cw = 196, 24
    sx = MARGIN + label_w
    cols = [("computed", 74), ("num_tokens", 82), ("cached", 70)]
    cx, top = _table_header(f, sx, cw, span, cols)
    row = ROW_H + 26
    wrong = False
    prev = {"num_prompt_tokens": P, "num_tokens": P, "num_computed_tokens": 0, "num_cached_tokens": -1}
    rows = [("start", None, prev, prev)] + [(None, s, g, w) for s, g, w in zip(steps, yours, expected)]
    before = prev
    for i, (label, step, got, want) in enumerate(rows):
        yy = top + i * row
        if step is None:
            title, sub = "before the first step", "new request, WAITING"
        elif step["preempted"]:
            title, sub = f"step {i}: preempted", "KV blocks freed"
        elif not step["n"]:
            title, sub = f"step {i}: waits", "not scheduled"
        else:
            admit = before["num_computed_tokens"] == 0
            title = f"step {i}: +{step['n']} scheduled"
            sub = f"admitted, prefix hit {step['hit']}" if admit else \
                ("decode" if before["num_computed_tokens"] >= before["num_prompt_tokens"] else "next chunk")
        f.text(sx - 10, yy + 13, title, size=LABEL - 0.5, anchor="end", weight="bold", cls="label")
        f.text(sx - 10, yy + 27, sub, size=SMALL, anchor="end", color=MUTED, cls="label")
        c0 = before["num_computed_tokens"] if step and not step["preempted"] else 0
        if step and step["n"] and c0 == 0:
            c0 = step["hit"]  # the hit arrives already computed
        c1, total0, total1 = got["num_computed_tokens"], before["num_tokens"], got["num_tokens"]
        for p in range(span):
            if p < min(c0, c1):
                role = "cached"
            elif p < c1:
                role = "new"
            elif p < total0:
                role = "plain"
            elif p < total1:
                role = "accent"
            else:
                role = "masked"
            f.cell(sx + p * cw, yy, "", role=role, w=cw - 3, h=ROW_H, dashed=role == "masked")
        if step and step["n"] and before["num_computed_tokens"] == 0 and step["hit"]:
            first = want["num_cached_tokens"] == step["hit"] and before["num_cached_tokens"] < 0
            f.bracket(sx, sx + step["hit"] * cw - 3, yy + ROW_H + 3,
                      f"prefix hit {step['hit']}" + (" → num_cached_tokens" if first else
                                                      f" (num_cached_tokens stays {want['num_cached_tokens']})"),
                      color=stroke("block"), size=SMALL)
        x = cx
        for key, (name, w) in zip(("num_computed_tokens", "num_tokens", "num_cached_tokens"), cols):
            wrong |= _value(f, x, yy, w - 8, got[key], want[key],
                            role={"num_computed_tokens": "new", "num_tokens": "plain",
                                  "num_cached_tokens": "block"}[key])
            if key == "num_cached_tokens" and want[key] < 0:
                f.text(x + (w - 8) / 2, yy + ROW_H + 12, f"{num(want[key])}: not set until admitted", size=SMALL - 1,
                       anchor="middle", color=stroke("block"), cls="note unset")
            x += w
        before = want
    bottom = top + len(rows) * row - 26
    _vline(f, sx + P * cw - 1.5, top - 4, bottom + 4, color=INK)
    f.text(sx + P * cw + 3, bottom + 18, "← prompt | output →", size=SMALL, anchor="middle", color=MUTED,
           cls="label")
    f.y = bottom + 40
    f.note(_moral(steps, expected) + " num_cached_tokens starts at −1, vLLM's mark for “not set yet”: the first "
           "time the request is scheduled it becomes the prefix hit found then, and it never changes afterwards.",
           size=SMALL + 1)
    f.legend([("cached", "K/V computed before this step (or a prefix hit)"), ("new", "computed in this step"),
              ("plain", "known, no K/V"), ("accent", "sampled and kept in this step"),
              ("block", "num_cached_tokens and the prefix hits"), ("masked", "no token yet")], wrong=wrong)


def _moral(steps: list[dict], expected: list[dict]) -> str:
    """The instance's lesson in its own numbers (from the expected counters)."""
    k = next((i for i, s in enumerate(steps) if s["preempted"]), None)
    if k is None:
        return "Read the counters, not the picture's boundary."
    after = expected[k]
    again = next((s["hit"] for s in steps[k + 1:] if s["n"]), 0)
    return (f"Read the counters, not the picture's boundary: after the preemption nothing is computed although "
            f"{after['num_tokens']} tokens exist, and num_cached_tokens still says {after['num_cached_tokens']}, "
            f"the hit of the first admission, even though the re-admission found {again} tokens in the prefix "
            "cache.")
