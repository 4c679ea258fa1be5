"""The course's overview figure: the chapters as one engine, drawn from a real run of `course engine run`.

The record (`engine.overview_record`) holds the course map, each chapter's part in the
run (the student's functions, the reference's, or none), and the path of one request:
the stage, the chapter function that ran it and the shapes it saw, in one prefill step
and one decode step.
"""

from __future__ import annotations

import re

from figures import figure
from figures.kit import Figure, pieces, text_width, wrap
from figures.style import FONT, INK, LABEL, MARGIN, MUTED, SMALL, fill, stroke
from grader.i18n import language, mark, tr

ROLE = {"yours": "accent", "partly yours": "accent", "reference": "token", "override": "wrong", "engine": "plain", None: "masked"}
TAG = {
    "yours": mark("yours ✓"),
    "partly yours": mark("partly yours"),
    "reference": mark("reference"),
    "override": mark("planted"),
    "engine": mark("engine's own"),
    None: mark("not called"),
}
"""A chapter's part in the run as its tile says it (translated where drawn)."""
LAYER_STAGES = (
    "input_layernorm",
    "qkv_proj",
    "split q | k | v",
    "q/k norm + RoPE",
    "write K/V to the cache",
    "attention: prefill (FlashAttention)",
    "split heads",
    "mask (chunk after a cached prefix)",
    "attention: chunk (dense, masked)",
    "merge heads",
    "attention: decode (GQA over the cache)",
    "o_proj",
    "post_attention_layernorm",
    "mlp (SwiGLU)",
    "router logits",
    "route top-k",
    "dispatch to ranks",
    "expert (SwiGLU)",
    "combine to tokens",
)


STAGE_NAMES = (
    mark("split q | k | v"),
    mark("q/k norm + RoPE"),
    mark("write K/V to the cache"),
    mark("attention: prefill (FlashAttention)"),
    mark("split heads"),
    mark("mask (chunk after a cached prefix)"),
    mark("attention: chunk (dense, masked)"),
    mark("merge heads"),
    mark("attention: decode (GQA over the cache)"),
    mark("engine core loop"),
    mark("engine core step"),
    mark("admit the request"),
    mark("the step's phase"),
    mark("count the drafts"),
    mark("verify drafts"),
    mark("decode inputs"),
    mark("decode batch size"),
    mark("padded decode batch"),
    mark("static decode buffers"),
    mark("K/V slots by block table"),
    mark("query head → K/V head"),
    mark("mlp (SwiGLU)"),
    mark("router logits"),
    mark("route top-k"),
    mark("dispatch to ranks"),
    mark("expert (SwiGLU)"),
    mark("combine to tokens"),
    mark("EPLB load window"),
    mark("EPLB balancedness"),
    mark("EPLB rebalance"),
    mark("final norm"),
    mark("schedule"),
    mark("step metadata"),
    mark("varlen batch"),
    mark("rows to sample"),
    mark("temperature, top-k, top-p"),
    mark("blocks (prefix cache)"),
    mark("postprocess"),
    mark("measure the run"),
    mark("greedy (temperature 0)"),
)
"""The engine's stages that are described in words (the others are the model's module names, kept as code): the
engine names them in English, the overview draws them in the run's language."""


def _chapter_span(r: dict) -> str:
    """The chapters of the record's course map, as "15–32"."""
    numbers = [int(c["id"][2:]) for c in r["course"]]
    return f"{min(numbers)}–{max(numbers)}" if numbers else "?"


@figure(
    "overview",
    title="课程地图:一个请求走过的章节",
    zh=lambda r: (
        f"第 {_chapter_span(r)} 章合起来是一个推理引擎:一次真实运行中,一个请求经过的章节函数、每一步看到的形状,以及哪些是你的代码。"
    ),
    en=lambda r: (
        f"The course map, chapters {_chapter_span(r)}, drawn from a real engine run: the chapter function that "
        "ran at each stage of one request's path, the shapes it saw, and which of them were your own code."
    ),
    needs={},
)
def overview_figure(f: Figure, r: dict) -> None:
    _course_map(f, r["course"], r["path"])
    _path(f, r)
    m, n = r["model"], r["counts"]
    run = tr(
        "This run: steps {steps} ({prefill} prefill, {decode} decode; {chunked} with a chunked prefill), "
        "prefix-cache hits {hits}, preemptions {preemptions}.",
        steps=n["steps"],
        prefill=n["prefill_steps"],
        decode=n["decode_steps"],
        chunked=n["chunked_prefill_steps"],
        hits=n["prefix_cache_hits"],
        preemptions=n["preemptions"],
    )
    if n.get("draft_tokens"):
        run += " " + tr(
            "Speculative decoding: {accepted} of {drafts} drafts accepted in {steps} steps.",
            accepted=n["accepted_tokens"],
            drafts=n["draft_tokens"],
            steps=n["speculative_steps"],
        )
    model = tr(
        "Model: {layers} layers, hidden {hidden}, {heads} query / {kv_heads} KV heads of head_dim {head_dim}, vocab {vocab} ({source}).",
        layers=m["layers"],
        hidden=m["hidden"],
        heads=m["heads"],
        kv_heads=m["kv_heads"],
        head_dim=m["head_dim"],
        vocab=m["vocab"],
        source=m["source"],
    )
    if m.get("random_weights"):
        output = tr(
            "Request {request} generated {tokens}: random weights, so the tokens mean nothing and often repeat.",
            request=r["request"],
            tokens=_tokens(r["output"]),
        )
    elif r.get("output_text") is not None:
        output = tr(
            "Request {request} continued “{prompt}” with “{text}”.",
            request=r["request"],
            prompt=_clipped(r.get("prompt_text", ""), 40),
            text=_clipped(r["output_text"], 160),
        )
    else:
        output = tr("Request {request} generated {tokens}.", request=r["request"], tokens=_tokens(r["output"]))
    note = " ".join((run, model, output))
    own = [e for e in r["path"] if e["source"] == "engine"]
    if any(e["fn"] == "argmax" for e in own):
        note += " " + tr(
            "At temperature 0 the engine takes the argmax itself (greedy, as real engines do); ch23's sample "
            "runs only at a temperature above 0 (--temperature)."
        )
    f.note(note, size=SMALL + 1)
    f.y -= 4
    f.legend(
        [
            ("accent", tr("your function (its task's checks pass)")),
            ("token", tr("the reference solution")),
            ("plain", tr("the engine's own step")),
            ("masked", tr("a chapter the engine does not call")),
        ]
        + ([("wrong", tr("planted (a test's override)"))] if any(c["part"] == "override" for c in r["course"]) else [])
    )


def _clipped(text: str, most: int) -> str:
    """A text on one line (its line breaks as spaces), cut to `most` characters with "…"."""
    one = " ".join(text.split())
    return one if len(one) <= most else one[: most - 1].rstrip() + "…"


def _tokens(ids: list[int]) -> str:
    shown = ", ".join(map(str, ids[:6]))
    return f"[{shown}{', …' if len(ids) > 6 else ''}]"


def parts_in_run(course: list[dict], path: list[dict]) -> list[str | None]:
    """Each chapter's part in the run as the map shows it: its part (whose functions) when one of its functions
    ran anywhere in the run (the record's "part", None when none did), "engine" when the engine did that chapter's
    job itself on the traced path (the argmax at temperature 0 instead of ch23's sample), None otherwise."""
    own = {e["chapter"] for e in path if e["source"] == "engine"}
    return [ch["part"] if ch["part"] else "engine" if ch["id"] in own else None for ch in course]


MAP_PER_ROW = 6


def _course_map(f: Figure, course: list[dict], path: list[dict]) -> None:
    """The chapters as tiles, six to a row, lit by their part in the run: the id and the part on the first line,
    the title under them."""
    f.heading(tr("The course map: which chapters' functions the engine ran, and whose they were"))
    gap, pad = 8, 7
    w = (f.width - 2 * MARGIN - (MAP_PER_ROW - 1) * gap) / MAP_PER_ROW
    zh = language() == "zh"
    size = SMALL if zh else SMALL - 0.5  # Latin titles wrap more: a little smaller, closer lines, one slide still
    titles = [wrap(ch["zh"] if zh else ch.get("en") or ch["zh"], w - 2 * pad, size) for ch in course]
    rows = [titles[k : k + MAP_PER_ROW] for k in range(0, len(titles), MAP_PER_ROW)]
    pitch = 12 if zh else 11
    heights = [22 + pitch * max(len(t) for t in row) for row in rows]  # a row as tall as its longest title
    tops = [sum(heights[:k]) + k * gap for k in range(len(rows))]
    y0 = f.y + 2
    for i, (ch, part, lines) in enumerate(zip(course, parts_in_run(course, path), titles)):
        h = heights[i // MAP_PER_ROW]
        x, y = MARGIN + (i % MAP_PER_ROW) * (w + gap), y0 + tops[i // MAP_PER_ROW]
        f.box(x, y, w, h, role=ROLE[part], dashed=part is None, rx=4)
        f.text(x + pad, y + 15, ch["id"], size=LABEL, weight="bold", mono=True, cls="label")
        f.text(
            x + w - pad,
            y + 14,
            tr(TAG[part]),
            size=SMALL - 0.5,
            anchor="end",
            color=stroke(ROLE[part]) if part not in (None, "engine") else MUTED,
            weight="bold" if part in ("yours", "partly yours") else "normal",
            cls="status",
        )
        for j, line in enumerate(lines):
            f.text(x + pad, y + 29 + j * pitch, line, size=size, color=INK if part else MUTED, cls="label")
    f.y = y0 + sum(heights) + len(rows) * gap + 14


PATH = {"stage": LABEL - 2, "fn": SMALL - 1, "shapes": SMALL - 1, "line": 12}
"""The path table's text sizes and its line pitch."""


STEP_KINDS = (("prefill", mark("prefill")), ("decode", mark("decode")), ("speculative", mark("speculative decode")))
"""The step kinds of the path table's columns, in order (a column only when the traced request had such a step)."""


def path_rows(path: list[dict]) -> tuple[list[str], list[str], list[str]]:
    """The path table's rows: the stages before the first step (the loop, the admission), the stages of the steps
    in the order they run (each kind's own order kept, merged), and the stages after the last step."""
    steps = [i for i, e in enumerate(path) if e["kind"] in dict(STEP_KINDS)]
    if not steps:
        return [], [], list(dict.fromkeys(e["stage"] for e in path))
    before = list(dict.fromkeys(e["stage"] for e in path[: steps[0]]))
    after = list(dict.fromkeys(e["stage"] for e in path[steps[-1] + 1 :] if e["kind"] not in dict(STEP_KINDS)))
    merged: list[str] = []
    for kind, _ in STEP_KINDS:
        at = 0  # a stage this kind adds goes right after the stage that precedes it in this kind's own order
        for stage in dict.fromkeys(e["stage"] for e in path if e["kind"] == kind):
            if stage in merged:
                at = merged.index(stage) + 1
            else:
                merged.insert(at, stage)
                at += 1
    return before, merged, after


def _path(f: Figure, r: dict) -> None:
    """One row per stage: the chapter badge, the stage, the function, and the shapes it saw in each kind of step
    side by side (a long one wraps in its column)."""
    path = r["path"]
    events: dict[tuple[str, str], dict] = {}
    for e in path:
        events.setdefault((e["kind"], e["stage"]), e)
    before, step_stages, after = path_rows(path)
    kinds = [(k, label) for k, label in STEP_KINDS if any(e["kind"] == k for e in path)]
    whole = {s: next(e for e in path if e["stage"] == s and e["kind"] not in dict(STEP_KINDS)) for s in before + after}
    stages = before + step_stages + after
    i = r["request"]
    f.heading(tr("Request {i}'s path: its first step of each kind (layer 0 stands for every layer)", i=i))
    firsts = [whole.get(s) or next(e for e in path if e["stage"] == s and e["kind"] in dict(kinds)) for s in stages]
    badge_w, gap = 44, 12
    x_stage = MARGIN + badge_w + 8
    x_fn = x_stage + max(text_width(tr(s), PATH["stage"]) for s in stages) + gap
    x_cols = x_fn + max(text_width(_function(e), PATH["fn"], mono=True) for e in firsts) + gap
    n = max(1, len(kinds))
    col_w = (f.width - MARGIN - x_cols - (n - 1) * gap) / n
    xs = [x_cols + j * (col_w + gap) for j in range(n)]
    y = f.y + 10
    heads = [(x_stage, tr("stage")), (x_fn, tr("function"))] + [(x, tr(label)) for x, (_, label) in zip(xs, kinds)]
    for x, label in heads:
        f.text(x, y, label, size=SMALL - 0.5, color=MUTED, cls="label column")
    y += 6
    layer_rows = []
    for stage, first in zip(stages, firsts):
        if stage in whole:
            cells = [(x_cols, f.width - MARGIN - x_cols, _shown(whole[stage]))]
        else:
            cells = [(x, col_w, _shown(events.get((kind, stage)), kind)) for x, (kind, _) in zip(xs, kinds)]
        lines = [wrap_shapes(s, w) for _, w, s in cells]
        h = 7 + PATH["line"] * max(1, *map(len, lines))
        own = first["source"] == "engine"
        f.cell(
            MARGIN,
            y + 2,
            first["chapter"] if own else first["task"],
            role=ROLE[first["source"]],
            w=badge_w,
            h=h - 4,
            fmt=str,
            size=SMALL - 0.5,
            bold=True,
        )
        base = y + 3 + PATH["line"] - 3
        f.text(x_stage, base, tr(stage), size=PATH["stage"], cls="label")
        f.text(x_fn, base, _function(first), size=PATH["fn"], mono=True, color=MUTED, cls="function")
        for (x, _, _), shown in zip(cells, lines):
            for j, line in enumerate(shown):
                f.text(x, base + j * PATH["line"], line, size=PATH["shapes"], mono=True, cls="shapes")
        if stage in LAYER_STAGES:
            layer_rows.append((y, y + h))
        f.dwg.add(f.dwg.line((MARGIN, y + h + 0.5), (f.width - MARGIN, y + h + 0.5), stroke=fill("plain"), stroke_width=1))
        y += h + 1
    if layer_rows:
        top, bottom = layer_rows[0][0], layer_rows[-1][1]
        x = MARGIN - 10
        f.dwg.add(
            f.dwg.polyline(
                [(x + 5, top + 2), (x, top + 2), (x, bottom - 2), (x + 5, bottom - 2)],
                fill="none",
                stroke=MUTED,
                stroke_width=1.2,
                class_="bracket",
            )
        )
        label = f.dwg.text(
            tr("× {layers} layers", layers=r["model"]["layers"]),
            insert=(x - 4, (top + bottom) / 2),
            font_size=SMALL,
            font_family=FONT,
            fill=MUTED,
            text_anchor="middle",
            class_="label",
            transform=f"rotate(-90 {x - 4} {(top + bottom) / 2})",
        )
        f.dwg.add(label)
    f.y = y + 20


def _function(e: dict) -> str:
    """The function of a stage as the table names it (the badge's colour says whose it is)."""
    return e["fn"]


def _shown(e: dict | None, kind: str | None = None) -> str:
    """The shapes a stage saw, without a leading "prefill: " that the column already says."""
    if e is None:
        return "—"
    s = re.sub(r"positions (\d+)–\1\b", r"position \1", e["shapes"])  # one position is not a range
    return s[len(kind) + 2 :] if kind and s.startswith(f"{kind}: ") else s


CLOSING = set("，。；：、？！）")
"""Chinese punctuation no line starts with: it stays with the character before it."""


def _glued(cut: list[str]) -> list[str]:
    out: list[str] = []
    for piece in cut:
        if out and piece[0] in CLOSING:
            out[-1] += piece
        else:
            out.append(piece)
    return out


def wrap_shapes(s: str, width: float, *, lines: int = 3) -> list[str]:
    """`s` in lines no wider than `width` (monospaced, the table's size), at most `lines` of them (the last one
    cut short with "…" if even that is not enough). Lines break at spaces, and between CJK characters (a Chinese
    detail has runs without spaces)."""
    out, line = [], ""
    for piece in _glued(pieces(s)):
        if line.strip() and text_width((line + piece).rstrip(), PATH["shapes"], mono=True) > width:
            out.append(line.rstrip())
            line = piece.lstrip()
        else:
            line += piece
    out.append(line.rstrip())
    if len(out) > lines:
        out = out[:lines]
        while out[-1] and text_width(out[-1] + " …", PATH["shapes"], mono=True) > width:
            out[-1] = out[-1][:-1]
        out[-1] += " …"
    return out
