"""Figures of ch24 · the control loop and its counters: one request through the same loop every round,
and the three progresses a request's counters keep apart."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from figures import figure
from figures.kit import Figure, num, text_width
from figures.layout import Part, column, pad, row
from figures.style import INK, LABEL, LABEL_SMALL, MARGIN, MUTED, SMALL, VALUE, stroke
from grader.i18n import tr

ROW_H = 30
SAME = object()
"""`_cell(..., expected=SAME)`: a cell that is not compared."""


# -- ch24.1 -------------------------------------------------------------------------------------------


@figure(
    "ch24-control-loop",
    title="每轮经过相同的控制环",
    zh="同一请求每轮都经过 schedule → 模型计算 → postprocess 这一个环:prompt 分成 4 + 4 + 2 三块计算;"
    "前两块没有算完 prompt,runner 虽然返回了候选 token(第二块的候选甚至是 EOS),postprocess 也不追加它;"
    "第三块算完 prompt 后采样的 token 才被追加,之后每轮 decode 一个 token。",
    en="One request goes through the same loop every round: schedule, compute, postprocess. The prompt is "
    "computed in chunks of 4 + 4 + 2; after an unfinished chunk the runner still returns a candidate token "
    "(the second one is even EOS), and postprocess does not append it. Only the token sampled after the "
    "last chunk is kept; then every round decodes one token.",
    needs={"rounds": "ch24.1"},
)
def control_loop_figure(f: Figure, r: dict) -> None:
    cfg, prompt, max_tokens = r["config"], r["prompt"], r["max_tokens"]
    rounds, expected = r["rounds"], r["expected"]
    P = len(prompt)

    f.instance_row(
        [
            (tr("A: {n}-token prompt, max_tokens {max_tokens}", n=P, max_tokens=max_tokens), "token"),
            (f"max_num_batched_tokens = {cfg['max_num_batched_tokens']}", "plain"),
            (f"block_size = {cfg['block_size']}", "plain"),
            (f"eos = {cfg['eos']}", "plain"),
        ]
    )

    f.heading(tr("the loop every round goes through"))
    f.y += 6
    _loop_diagram(
        f,
        [
            ("schedule()", tr("picks the batch, sets num_scheduled_tokens")),
            ("model runner", tr("computes the chunk, samples 1 token")),
            ("postprocess()", tr("counts the chunk; appends or discards")),
        ],
        tr("next round: the same loop again"),
    )

    f.heading(tr("request A, round by round (your scheduler's trace)"))
    span = max([P + max_tokens] + [x["num_tokens"] for x in rounds + expected])
    columns = [("runner", 66), ("postprocess", 126), (tr("status"), 88), (tr("computed"), 70), ("num_tokens", 76)]
    token = lambda rd: None if rd is None else f"{rd['token']} EOS" if rd["token"] == cfg["eos"] else rd["token"]
    table, wrong = [], len(rounds) != len(expected)
    for i in range(max(len(rounds), len(expected))):
        got = rounds[i] if i < len(rounds) else None
        want = expected[i] if i < len(expected) else None
        shown = got or want
        assert shown is not None  # i < max(len(rounds), len(expected))
        kept = "accent" if got and got["appended"] else "masked"
        values: list[tuple[Any, Any, str, Callable[[Any], str], bool]] = [
            (token(got), token(want), kept, str, True),
            (_verdict(got), _verdict(want), "plain", str, False),
        ]
        values += [
            (got and got[key], want and want[key], "plain", str if key == "status" else num, True)
            for key in ("status", "num_computed_tokens", "num_tokens")
        ]
        wrong |= any(g != w for g, w, *_ in values)
        strip = _Strip(f, _round_roles(got, span), 22) if got else None
        table.append(
            (
                tr("round {i}", i=i + 1),
                tr("step {s} · {kind}", s=shown["step"], kind="prefill" if shown["prefill"] else "decode"),
                strip,
                [
                    _cell(f, g, w=w - 8, expected=e, role=role, fmt=fmt, bold=bold)
                    for (g, e, role, fmt, bold), (_, w) in zip(values, columns)
                ],
            )
        )
        if strip is not None and got and got["n"]:  # this round's chunk, outlined once the strip is placed
            start, n = got["start"], got["n"]
            strip.then = lambda s=strip, a=start, b=start + n: f.outline(*s.span(a, b), role="new", width=1.8, inset=-1.5)
    _rows(f, table, label_w=112, span=span, cw=22, columns=columns, prompt=P, pitch=12)
    f.note(
        tr(
            "Each round's chunk is outlined. The runner samples a token for every scheduled sequence, but a "
            "token sampled before the prompt is complete (computed < num_tokens) is a candidate that postprocess "
            "throws away; the status turns RUNNING when the last chunk is scheduled, FINISHED when max_tokens "
            "completion tokens exist (or EOS is appended)."
        ),
        size=LABEL_SMALL,
    )
    f.legend(
        [
            ("cached", tr("K/V computed in earlier rounds")),
            ("new", tr("this round's chunk")),
            ("plain", tr("known token, no K/V yet")),
            ("accent", tr("token sampled and kept")),
            ("masked", tr("not generated yet / discarded")),
        ],
        wrong=wrong,
    )


def _round_roles(rd: dict, span: int) -> list[tuple[str, Any]]:
    """One round's token strip: K/V from earlier rounds, this round's chunk, known but not computed, the kept
    token, not generated yet."""
    start, n, before = rd["start"], rd["n"], rd["num_tokens_before"]
    return [
        ("cached", "")
        if p < start
        else ("new", "")
        if p < start + n
        else ("plain", "")
        if p < before
        else ("accent", rd["token"])
        if p == before and rd["appended"]
        else ("masked", "")
        for p in range(span)
    ]


def _verdict(rd: dict | None) -> str | None:
    """What postprocess did with the round's token, and why: "discard 4 < 10", "append 10 = 10", "append (decode)"."""
    if rd is None:
        return None
    end, total = rd["start"] + rd["n"], rd["num_tokens_before"]
    why = f"{end} < {total}" if end < total else f"{end} = {total}" if rd["prefill"] else "(decode)"
    return tr("append {why}", why=why) if rd["appended"] else tr("discard {why}", why=why)


def _loop_diagram(f: Figure, labels: list[tuple[str, str]], back: str) -> None:
    """Three boxes left to right with arrows, and a return arrow underneath: the same loop every round."""
    gap, h = 44, 46
    w = (f.width - 2 * MARGIN - 2 * gap) / 3
    boxes = [_loop_box(f, title, sub, w, h, role="accent" if i == 1 else "plain") for i, (title, sub) in enumerate(labels)]
    f.place(row(*boxes, gap=gap), after=0)
    for a, b in zip(boxes, boxes[1:]):
        f.arrow(a.right + 4, a.bottom - h / 2, b.right - b.w - 4, a.bottom - h / 2, color=INK, width=1.4)
    first, last = boxes[0], boxes[-1]
    left, right, low = first.right - w / 2, last.right - w / 2, first.bottom + 22
    f.dwg.add(
        f.dwg.path(
            d=f"M{right},{last.bottom} L{right},{low} L{left},{low} L{left},{first.bottom + 6}",
            fill="none",
            stroke=INK,
            stroke_width=1.4,
            class_="arrow",
        )
    )
    f.dwg.add(f.dwg.polygon([(left, first.bottom), (left - 4, first.bottom + 7), (left + 4, first.bottom + 7)], fill=INK))
    f.text((left + right) / 2, low - 5, back, size=LABEL_SMALL, anchor="middle", color=MUTED, cls="label")
    f.y = low + 30


def _loop_box(f: Figure, title: str, sub: str, w: float, h: float, *, role: str) -> Part:
    """A box of the loop: its call, and under it what it does (as large as fits, 8 px from the sides)."""
    sub_size = min(SMALL + 0.5, (SMALL + 0.5) * (w - 16) / text_width(sub, SMALL + 0.5))

    def draw(x: float, y: float) -> None:
        f.box(x, y, w, h, role=role)
        f.text(x + w / 2, y + 19, title, size=LABEL + 1, anchor="middle", mono=True, weight="bold", cls="label")
        f.text(x + w / 2, y + 36, sub, size=round(sub_size, 2), anchor="middle", color=MUTED, cls="label")

    return Part(w, h, draw)


# -- ch24.2 -------------------------------------------------------------------------------------------


@figure(
    "ch24-three-progress",
    title="三种“进度”",
    zh="不要混淆三种“进度”:num_computed_tokens 是已算出 K/V 的前缀,num_tokens 是已知 token(prompt + 保留的输出),"
    "num_cached_tokens 是首次接纳时前缀缓存命中的 token 数;抢占把计算进度清零,却不动其余两个。"
    "prompt 与输出的分界线不是调度器跟踪的边界,计数器才是契约。",
    en="Three kinds of progress: num_computed_tokens is the prefix with K/V computed, num_tokens the known "
    "tokens (prompt + kept outputs), num_cached_tokens the prefix-cache hit at the first admission. A "
    "preemption resets the computed count and touches neither of the others. The prompt/output line is "
    "not what the scheduler tracks: the counters are the contract.",
    needs={"yours": "ch24.2"},
)
def three_progress_figure(f: Figure, r: dict) -> None:
    P, steps, yours, expected = r["prompt"], r["steps"], r["yours"], r["expected"]
    span = max([P + 1] + [s["num_tokens"] for s in yours + expected]) + 1
    f.instance_row(
        [(tr("a {n}-token prompt", n=P), "token", 170)],
        note=tr("vLLM v1 counters (request.py), one synchronous step at a time; the prefix cache serves whole blocks of 4 tokens"),
    )

    columns = [(tr("computed"), 74), ("num_tokens", 82), (tr("cached"), 70)]
    roles = {"num_computed_tokens": "new", "num_tokens": "plain", "num_cached_tokens": "block"}
    start = {"num_prompt_tokens": P, "num_tokens": P, "num_computed_tokens": 0, "num_cached_tokens": -1}
    table, wrong, before = [], False, start
    for i, (step, got, want) in enumerate([(None, start, start), *zip(steps, yours, expected)]):
        title, sub = _step_title(i, step, before)
        wrong |= any(got[key] != want[key] for key in roles)
        cells = [_cell(f, got[key], w=w - 8, expected=want[key], role=roles[key]) for key, (_, w) in zip(roles, columns)]
        if want["num_cached_tokens"] < 0:  # vLLM's −1: not set yet
            note = _centered(
                f,
                tr("{value}: not set until admitted", value=num(want["num_cached_tokens"])),
                columns[-1][1] - 8,
                size=SMALL - 1,
                color=stroke("block"),
                cls="note unset",
            )
            cells[-1] = column(cells[-1], pad(note, top=3, bottom=-3 - note.h), gap=0)  # under the row, in its gap
        strip = _Strip(f, [(role, "") for role in _progress_roles(step, before, got, span)], 24)
        if step and step["n"] and before["num_computed_tokens"] == 0 and step["hit"]:  # the prefix hit, bracketed
            first = want["num_cached_tokens"] == step["hit"] and before["num_cached_tokens"] < 0
            label = (
                tr("prefix hit {hit} → num_cached_tokens", hit=step["hit"])
                if first
                else tr("prefix hit {hit} (num_cached_tokens stays {cached})", hit=step["hit"], cached=want["num_cached_tokens"])
            )
            strip.then = lambda s=strip, hit=step["hit"], label=label: f.bracket(
                s.span(0, hit)[0], s.span(0, hit)[0] + s.span(0, hit)[2], s.bottom + 3, label, color=stroke("block"), size=SMALL
            )
        table.append((title, sub, strip, cells))
        before = want
    _rows(f, table, label_w=196, span=span, cw=24, columns=columns, prompt=P, pitch=26)
    f.note(
        tr(
            "{moral} num_cached_tokens starts at −1, vLLM's mark for “not set yet”: the first time the request is "
            "scheduled it becomes the prefix hit found then, and it never changes afterwards.",
            moral=_moral(steps, expected),
        ),
        size=LABEL_SMALL,
    )
    f.legend(
        [
            ("cached", tr("K/V computed before this step (or a prefix hit)")),
            ("new", tr("computed in this step")),
            ("plain", tr("known, no K/V")),
            ("accent", tr("sampled and kept in this step")),
            ("block", tr("num_cached_tokens and the prefix hits")),
            ("masked", tr("no token yet")),
        ],
        wrong=wrong,
    )


def _step_title(i: int, step: dict | None, before: dict) -> tuple[str, str]:
    if step is None:
        return tr("before the first step"), tr("new request, WAITING")
    if step["preempted"]:
        return tr("step {i}: preempted", i=i), tr("KV blocks freed")
    if not step["n"]:
        return tr("step {i}: waits", i=i), tr("not scheduled")
    scheduled = tr("step {i}: +{n} scheduled", i=i, n=step["n"])
    if before["num_computed_tokens"] == 0:
        return scheduled, tr("admitted, prefix hit {hit}", hit=step["hit"])
    return scheduled, ("decode" if before["num_computed_tokens"] >= before["num_prompt_tokens"] else tr("next chunk"))


def _progress_roles(step: dict | None, before: dict, got: dict, span: int) -> list[str]:
    """One step's token strip: computed before it (or a prefix hit), computed in it, known without K/V, kept in it."""
    c0 = before["num_computed_tokens"] if step and not step["preempted"] else 0
    if step and step["n"] and c0 == 0:
        c0 = step["hit"]  # the hit arrives already computed
    c1, total0, total1 = got["num_computed_tokens"], before["num_tokens"], got["num_tokens"]
    return [
        "cached" if p < min(c0, c1) else "new" if p < c1 else "plain" if p < total0 else "accent" if p < total1 else "masked"
        for p in range(span)
    ]


def _moral(steps: list[dict], expected: list[dict]) -> str:
    """The instance's lesson in its own numbers (from the expected counters)."""
    k = next((i for i, s in enumerate(steps) if s["preempted"]), None)
    if k is None:
        return tr("Read the counters, not the picture's boundary.")
    after = expected[k]
    again = next((s["hit"] for s in steps[k + 1 :] if s["n"]), 0)
    return tr(
        "Read the counters, not the picture's boundary: after the preemption nothing is computed although {n} tokens "
        "exist, and num_cached_tokens still says {cached}, the hit of the first admission, even though the "
        "re-admission found {again} tokens in the prefix cache.",
        n=after["num_tokens"],
        cached=after["num_cached_tokens"],
        again=again,
    )


# -- the rows both figures are made of --------------------------------------------------------------------------


class _Strip(Part):
    """A row of token cells, one per position; `span(a, b)` is the box of cells a … b − 1 once placed, and
    `then` what to draw over it once it is."""

    def __init__(self, f: Figure, cells: Sequence[tuple[str, Any]], cw: float) -> None:
        self.cw = cw
        self.then: Callable[[], None] | None = None

        def draw(x: float, y: float) -> None:
            for p, (role, value) in enumerate(cells):
                f.cell(x + p * cw, y, value, role=role, w=cw - 3, h=ROW_H, size=SMALL, dashed=role == "masked", bold=role == "accent")

        super().__init__(len(cells) * cw - 3, ROW_H, draw)

    def span(self, a: int, b: int) -> tuple[float, float, float, float]:
        x, y = self._placed()
        return x + a * self.cw, y, (b - a) * self.cw - 3, ROW_H


def _cell(
    f: Figure, value: Any, *, w: float, expected: Any = SAME, role: str = "plain", fmt: Callable[[Any], str] = num, bold: bool = True
) -> Part:
    """One result cell as a part; marked wrong (yours struck through, expected below) when it differs from
    `expected` (the trace's values are exact)."""
    bad = expected is not SAME and value != expected
    shown = lambda v: "—" if v is None else v
    return Part(
        w,
        ROW_H,
        lambda x, y: f.cell(
            x,
            y,
            shown(value),
            role=role,
            w=w,
            h=ROW_H,
            wrong=bad,
            expected=shown(expected) if bad else None,
            bold=bold,
            fmt=fmt,
            size=VALUE - 1,
        ),
    )


def _rows(
    f: Figure,
    table: Sequence[tuple[str, str, _Strip | None, list[Part]]],
    *,
    label_w: float,
    span: int,
    cw: float,
    columns: list[tuple[str, int]],
    prompt: int,
    pitch: float,
) -> None:
    """The rows of a figure, under a header: a two-line label right-aligned in `label_w`, the token strip of
    `span` positions, the value cells in `columns`; then the prompt | output line across the strips."""
    positions = row(*(_centered(f, str(p), cw - 3, size=SMALL - 0.5) for p in range(span)), gap=3)
    names = row(*(_centered(f, name, w - 8, size=LABEL_SMALL) for name, w in columns), gap=8)
    f.place(pad(f.label(tr("token positions"), size=SMALL + 0.5), left=label_w), after=2)
    f.place(row(pad(positions, left=label_w), names, gap=14), after=4)
    strips = []
    for title, sub, strip, cells in table:
        label = column(f.label(title, size=LABEL - 0.5, color=INK, bold=True), f.label(sub, size=SMALL), gap=0, align="right")
        strips.append(strip or Part(span * cw - 3, ROW_H))
        f.place(row(pad(label, left=label_w - 14 - label.w), strips[-1], row(*cells, gap=8), gap=14), after=pitch)
        if strip is not None and strip.then:
            strip.then()
    x = strips[0].right - strips[0].w + prompt * cw - 1.5
    top, bottom = strips[0].bottom - ROW_H - 4, strips[-1].bottom + 4
    f.dwg.add(f.dwg.line((x, top), (x, bottom), stroke=INK, stroke_width=1.2, class_="boundary", stroke_dasharray="5,3"))
    f.text(x + 3, bottom + 12, tr("← prompt | output →"), size=SMALL, anchor="middle", color=MUTED, cls="label")
    f.y = bottom + 34


def _centered(f: Figure, text: str, w: float, *, size: float, color: str = MUTED, cls: str = "label") -> Part:
    """A label centred in a slot `w` wide (it may overflow it on both sides)."""
    return Part(w, size * 1.25, lambda x, y: f.text(x + w / 2, y + size, text, size=size, anchor="middle", color=color, cls=cls))
