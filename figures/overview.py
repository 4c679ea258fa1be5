"""The course's overview figure: chapters 15–32 as one engine, drawn from a real run of `course engine run`.

The record (`engine.overview_record`) holds the course map, each chapter's part in the
run (the student's functions, the reference's, or none), and the path of one request:
the stage, the chapter function that ran it and the shapes it saw, in one prefill step
and one decode step.
"""

from __future__ import annotations

from figures import figure
from figures.kit import Figure, wrap
from figures.style import FONT, INK, LABEL, MARGIN, MUTED, SMALL, fill, stroke

ROLE = {"yours": "accent", "partly yours": "accent", "reference": "token", "override": "wrong", "engine": "plain",
        None: "masked"}
TAG = {"yours": "yours ✓", "partly yours": "partly yours", "reference": "reference", "override": "planted",
       "engine": "engine", None: "not called"}
LAYER_STAGES = ("input_layernorm", "qkv_proj", "split q | k | v", "q/k norm + RoPE", "write K/V to the cache",
                "attention (GQA, causal)", "o_proj", "post_attention_layernorm", "mlp (SwiGLU)")


@figure("overview", title="课程地图:一个请求走过的章节",
        zh="第 15–32 章合起来是一个推理引擎:一次真实运行中,一个请求依次经过哪些章节的函数、"
           "每一步看到的形状,以及其中哪些是你自己的代码。",
        en="The course map, chapters 15–32, drawn from a real engine run: the chapter function that ran at each "
           "stage of one request's path, the shapes it saw, and which of them were your own code.",
        needs={})
def overview_figure(f: Figure, r: dict) -> None:
    _course_map(f, r["course"])
    _path(f, r)
    m, n = r["model"], r["counts"]
    f.note(f"This run: {_count(n['steps'], 'step')} ({n['prefill_steps']} prefill, {n['decode_steps']} decode), "
           f"{n['chunked_prefill_steps']} with a chunked prefill, "
           f"{_count(n['prefix_cache_hits'], 'prefix-cache hit')}, {_count(n['preemptions'], 'preemption')}. "
           f"Model: {m['layers']} layers, hidden {m['hidden']}, {m['heads']} query / {m['kv_heads']} KV heads of "
           f"head_dim {m['head_dim']}, vocab {m['vocab']} ({m['source']}). "
           f"Request {r['request']} generated {_tokens(r['output'])}.", size=SMALL + 1)
    f.legend([("accent", "your function (its task's checks pass)"), ("token", "the reference solution"),
              ("plain", "the engine's own step"), ("masked", "a chapter the engine does not call")]
             + ([("wrong", "planted (a test's override)")] if any(c["part"] == "override" for c in r["course"])
                else []))


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _tokens(ids: list[int]) -> str:
    shown = ", ".join(map(str, ids[:12]))
    return f"[{shown}{', …' if len(ids) > 12 else ''}]"


def _course_map(f: Figure, course: list[dict]) -> None:
    """The chapters as tiles, 9 to a row, lit by their part in the run."""
    f.heading("课程地图 · the course map: which chapters' functions the engine ran, and whose they were")
    per_row, gap, h = 9, 8, 84
    w = (f.width - 2 * MARGIN - (per_row - 1) * gap) / per_row
    y0 = f.y + 4
    for i, ch in enumerate(course):
        x, y = MARGIN + (i % per_row) * (w + gap), y0 + (i // per_row) * (h + gap)
        part = ch["part"]
        f.box(x, y, w, h, role=ROLE[part], dashed=part is None, rx=4)
        f.text(x + 6, y + 15, ch["id"], size=LABEL, weight="bold", mono=True, cls="label")
        for j, line in enumerate(wrap(ch["zh"], w - 10, SMALL)[:3]):
            f.text(x + 6, y + 31 + j * 13, line, size=SMALL, color=INK if part else MUTED, cls="label")
        f.text(x + 6, y + h - 8, TAG[part], size=SMALL - 0.5, color=stroke(ROLE[part]) if part else MUTED,
               weight="bold" if part in ("yours", "partly yours") else "normal", cls="status")
    f.y = y0 + -(-len(course) // per_row) * (h + gap) + 14


def _path(f: Figure, r: dict) -> None:
    """One row per stage: the chapter badge, the function, and the shapes in the prefill and the decode step."""
    events = {(e["kind"], e["stage"]): e for e in r["path"]}
    stages = list(dict.fromkeys(e["stage"] for e in r["path"] if e["kind"] == "prefill"))
    stages += [e["stage"] for e in r["path"] if e["kind"] == "run"]
    i = r["request"]
    f.heading(f"请求 {i} 的路径 · request {i}'s path: its first prefill step, then its first decode step "
              f"(layer 0 stands for every layer)")
    badge_w, name_w, kind_w = 44, 196, 50
    sx = MARGIN + badge_w + 8 + name_w + kind_w
    y = f.y + 2
    layer_rows = []
    for stage in stages:
        kinds = ["run"] if ("run", stage) in events else ["prefill", "decode"]
        first = events[(kinds[0], stage)]
        h = 40
        f.cell(MARGIN, y + 2, first["chapter"], role=ROLE[first["source"]], w=badge_w, h=h - 4, fmt=str,
               size=SMALL + 0.5, bold=True)
        f.text(MARGIN + badge_w + 8, y + 15, stage, size=LABEL - 0.5, cls="label")
        f.text(MARGIN + badge_w + 8, y + 31, f"{first['fn']}  (ch{first['task']})", size=SMALL, mono=True,
               color=MUTED, cls="function")
        limit = int((f.width - MARGIN - sx) / (SMALL * 0.61))
        for j, kind in enumerate(kinds):
            e = events.get((kind, stage))
            shapes = e["shapes"] if e else "—"
            f.text(sx - 8, y + 15 + 16 * j, "whole run" if kind == "run" else kind, size=SMALL - 0.5, anchor="end",
                   color=MUTED, cls="label")
            f.text(sx, y + 15 + 16 * j, shapes if len(shapes) <= limit else shapes[:limit - 1] + "…", size=SMALL,
                   mono=True, cls="shapes")
        if stage in LAYER_STAGES:
            layer_rows.append((y, y + h))
        f.dwg.add(f.dwg.line((MARGIN, y + h + 1), (f.width - MARGIN, y + h + 1), stroke=fill("plain"),
                             stroke_width=1))
        y += h + 3
    if layer_rows:
        top, bottom = layer_rows[0][0], layer_rows[-1][1]
        x = MARGIN - 10
        f.dwg.add(f.dwg.polyline([(x + 5, top + 2), (x, top + 2), (x, bottom - 2), (x + 5, bottom - 2)],
                                 fill="none", stroke=MUTED, stroke_width=1.2, class_="bracket"))
        label = f.dwg.text(f"× {r['model']['layers']} layers", insert=(x - 4, (top + bottom) / 2), font_size=SMALL,
                           font_family=FONT, fill=MUTED, text_anchor="middle", class_="label",
                           transform=f"rotate(-90 {x - 4} {(top + bottom) / 2})")
        f.dwg.add(label)
    f.y = y + 18
