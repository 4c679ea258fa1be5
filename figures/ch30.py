"""Figures of ch30 · into a native core: a request's path from Python into the C++ core (its record's bytes,
its token arrays, the phase of the step), and the system boundary a pinned release's support matrix draws."""

from __future__ import annotations

from figures import figure
from figures.kit import Figure, num, text_width
from figures.style import INK, LABEL, MARGIN, MUTED, SMALL, VALUE, WIDTH

LENGTHS = {"prompt_len", "num_tokens", "num_computed_tokens", "num_new_tokens"}
C_TYPES = {"<i8": "int64", "<i4": "int32", "|b1": "bool", "<f4": "float32"}


def _role(name: str) -> str:
    return "token" if name in LENGTHS else "accent" if name == "is_prompt" else "plain"


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:.7g}".replace("-", "−")
    return num(v)


def _keep_spaces(f: Figure) -> None:
    """The text just drawn keeps its runs of spaces (SVG collapses them): a code line's columns stay aligned."""
    f.dwg.elements[-1].attribs["xml:space"] = "preserve"


def _code_box(f: Figure, x: float, y: float, w: float, lines: list[str], *, title: str) -> float:
    """A box of monospace lines (a Python value as the front end holds it); returns its height."""
    h = 30 + 17 * len(lines)
    f.box(x, y, w, h, role="plain")
    f.text(x + 10, y + 16, title, size=SMALL + 1, color=MUTED, cls="label")
    for i, line in enumerate(lines):
        f.text(x + 12, y + 36 + 17 * i, line, size=VALUE - 1.5, mono=True, cls="value")
        _keep_spaces(f)
    return h


@figure("ch30-request-path", title="请求从 Python 进入 C++",
        zh="Python 前端把请求降低为一条按 C 规则对齐的 56 字节记录(字段有固定类型与偏移,空位是填充字节)"
           "和两组扁平 int32 数组;C++ 核心据记录选出下一步的阶段:还有 prompt 要算就先做 prompt,否则 decode。"
           "公开版本仍有 prompt/decode 阶段选择,并不照搬 vLLM 的全部抽象。",
        en="A request's path from Python into a native core: the front end lowers it to one 56-byte record "
           "aligned like a C struct (typed fields at fixed offsets, padding in the gaps) and two flat int32 "
           "arrays; the C++ core picks the next step's phase from the records: prompt first while any prompt "
           "work remains, else decode. The public engines keep this phase selection rather than copying every "
           "abstraction of vLLM.",
        needs={"record": "ch30.1"})
def request_path_figure(f: Figure, r: dict) -> None:
    req, rec, want = r["request"], r["record"], r["record_expected"]
    layout, layout_want = r["layout"], r["layout_expected"]
    wrong_any = rec != want or layout != layout_want or r["itemsize"] != r["itemsize_expected"] or \
        r["input_ids"] != r["input_ids_expected"] or r["positions"] != r["positions_expected"] or \
        r.get("phases") != r["phases_expected"]

    # 1. The request as Python holds it.
    f.heading("① Python 前端 · the request as the front end holds it (request A)")
    sp = req["sampling_params"]
    lines = [f"request_id       = {req['request_id']}",
             f"prompt_token_ids = {req['prompt_token_ids']}",
             f"prompt           = {req['prompt']!r}",
             "sampling_params  = {" + ", ".join(f"{k}: {v}" for k, v in sp.items()) + "}"]
    top = f.y + 4
    h = _code_box(f, MARGIN, top, WIDTH - 2 * MARGIN, lines, title="dict · lists · None · str")
    f.y = top + h + 12
    f.note("lower_request keeps what the core needs and encodes what C cannot hold: top_k −1 → 0 (off), "
           "seed None → −1; the prompt text stays in Python.", size=SMALL + 1)
    f.arrow(WIDTH / 2, f.y - 6, WIDTH / 2, f.y + 20, color=INK)
    f.text(WIDTH / 2 + 10, f.y + 12, "pybind11 / ctypes: one buffer, no Python objects", size=SMALL + 1,
           color=MUTED, cls="label")
    f.y += 40

    # 2. The record's bytes, 8 per row.
    f.heading(f"② 记录的字节 · your record: {r['itemsize']} bytes (the C struct: {r['itemsize_expected']}), "
              f"8 bytes per row")
    byte_w, box_h, band = 56, 34, 15
    gx = MARGIN + 70
    mine = {row[0]: row for row in layout}
    y0 = f.y + 6
    rows = -(-r["itemsize_expected"] // 8)
    for b in range(0, 8):
        f.text(gx + b * byte_w + byte_w / 2, y0 + 2, f"+{b}", size=SMALL, anchor="middle", color=MUTED, mono=True,
               cls="label")
    for i in range(rows):
        f.text(gx - 10, y0 + 12 + i * (box_h + band + 6) + band + box_h / 2 + 4, f"byte {8 * i}", size=SMALL + 0.5,
               anchor="end", color=MUTED, mono=True, cls="label")
    used = set()
    for name, tstr, off, size in layout_want:
        row, col = divmod(off, 8)
        x, y = gx + col * byte_w, y0 + 12 + row * (box_h + band + 6)
        used.update(range(off, off + size))
        f.text(x + 4, y + band - 4, f"{name} · {C_TYPES.get(tstr, tstr)}", size=SMALL - 0.5 if size == 1 else SMALL,
               color=INK, cls="label")
        got = mine.get(name)
        w = size * byte_w - 4
        if got is None or got[1] != tstr or got[2] != off:
            yours = "missing" if got is None else f"@{got[2]} {C_TYPES.get(got[1], got[1])}"
            f.cell(x, y + band, yours, role=_role(name), w=w, h=box_h, wrong=True,
                   expected=f"@{off} {C_TYPES.get(tstr, tstr)}", fmt=str, size=VALUE - 1)
        else:
            bad = rec.get(name) != want[name]
            f.cell(x, y + band, _value(rec.get(name)), role=_role(name), w=w, h=box_h, wrong=bad,
                   expected=_value(want[name]) if bad else None, fmt=str, size=VALUE - 0.5)
    for byte in range(rows * 8):
        if byte not in used:
            row, col = divmod(byte, 8)
            x, y = gx + col * byte_w, y0 + 12 + row * (box_h + band + 6)
            f.cell(x, y + band, "pad", role="masked", w=byte_w - 4, h=box_h, fmt=str, size=SMALL)
    # The same struct as C declares it, beside its bytes.
    sx = gx + 8 * byte_w + 22
    f.text(sx, y0 + 2, f"struct Request {{   // {r['itemsize_expected']} bytes, align 8", size=SMALL + 0.5, mono=True,
           cls="value")
    ctype = {"<i8": "int64_t", "<i4": "int32_t", "|b1": "bool", "<f4": "float"}
    for i, (name, tstr, off, size) in enumerate(layout_want):
        f.text(sx + 14, y0 + 22 + i * 17, f"{ctype.get(tstr, tstr):8} {name};", size=SMALL + 0.5, mono=True,
               cls="value")
        _keep_spaces(f)
        f.text(WIDTH - MARGIN, y0 + 22 + i * 17, f"// {off}", size=SMALL + 0.5, mono=True, anchor="end",
               color=MUTED, cls="value")
    f.text(sx, y0 + 22 + len(layout_want) * 17, "};", size=SMALL + 0.5, mono=True, cls="value")
    f.paragraph(sx, y0 + 22 + (len(layout_want) + 2) * 17,
                "np.dtype(fields, align=True) and ctypes.Structure compute these same offsets.",
                width=WIDTH - MARGIN - sx, size=SMALL + 0.5)
    f.y = y0 + 12 + rows * (box_h + band + 6) + 12
    f.note("A field of s bytes starts at a multiple of s: is_prompt (1 byte at 24) leaves 3 padding bytes before "
           "max_tokens at 28, top_k ends at 44 so seed waits for 48; the size, 56, is a multiple of 8.",
           size=SMALL + 1)
    f.y += 8

    # 3. The flat arrays.
    f.heading("③ 扁平数组 · the int32 arrays of the step: the tokens without KV and their positions")
    y = f.y + 4
    n = max(len(r["input_ids_expected"]), len(r["input_ids"]), 1)
    cw = min(70, (WIDTH - 2 * MARGIN - 110) / n)
    for k, (label, got, exp) in enumerate((("input_ids", r["input_ids"], r["input_ids_expected"]),
                                          ("positions", r["positions"], r["positions_expected"]))):
        yy = y + k * 38
        f.text(MARGIN + 100, yy + 21, label, size=LABEL, anchor="end", cls="label")
        for j in range(max(len(got), len(exp))):
            g = got[j] if j < len(got) else "—"
            e = exp[j] if j < len(exp) else "—"
            f.cell(MARGIN + 110 + j * cw, yy, g, role="token", w=cw - 4, h=32, wrong=g != e, expected=e)
    f.y = y + 2 * 38 + 18

    # 4. The core's phase selection.
    f.heading("④ C++ 核心 · select_phase: the records of three requests, two batches")
    batch = r["batch"]
    cols = ["request_id", "prompt_len", "num_tokens", "num_computed_tokens", "num_new_tokens", "is_prompt"]
    short = ["request_id", "prompt_len", "num_tokens", "computed", "num_new", "is_prompt"]
    y = f.y + 4
    cx, cw = MARGIN + 40, 84
    for j, c in enumerate(short):
        f.text(cx + j * cw + (cw - 6) / 2, y + 10, c, size=SMALL, anchor="middle", color=MUTED, cls="label")
    for i, (key, vals) in enumerate(batch.items()):
        yy = y + 16 + i * 32
        f.text(cx - 10, yy + 19, key, size=LABEL, anchor="end", weight="bold", cls="label")
        for j, c in enumerate(cols):
            f.cell(cx + j * cw, yy, _value(vals[c]), role=_role(c), w=cw - 6, h=28, fmt=str, size=VALUE - 1)
    px = cx + len(cols) * cw + 14
    phases = r.get("phases") or ["(select_phase raised)"] * len(r["batches"])
    for k, (names, got, exp) in enumerate(zip(r["batches"], phases, r["phases_expected"])):
        yy = y + 16 + k * 48
        f.text(px, yy + 12, "select_phase([" + ", ".join(names) + "])", size=SMALL + 1, mono=True, cls="label")
        f.cell(px, yy + 18, got, role="accent", w=WIDTH - MARGIN - px, h=26, fmt=str, wrong=got != exp, expected=exp,
               bold=True)
    f.y = y + 16 + len(batch) * 32 + 14
    f.note("A still has 5 prompt tokens, so [A, B, C] runs a prompt step and B, C wait one step (prefill first, "
           "as in vLLM v0 and nano-vllm); [B, C] has only newest output tokens left: a decode step.",
           size=SMALL + 1)
    f.legend([("token", "lengths and the token arrays"), ("accent", "phase"),
              ("plain", "id and sampling parameters"), ("masked", "padding bytes")], wrong=wrong_any)


@figure("ch30-system-boundary", title="公开 README 的系统边界",
        zh="一个固定提交的 README 支持矩阵划出系统边界:Qwen3-0.6B 以 tp 2 部署时,模型类、dtype、head_dim、"
           "并行度和本地前缀缓存都在边界内;40960 的上下文与 KV 服务在边界外。缺完整 KV 服务不等于没有本地 KV 缓存。",
        en="The system boundary of a pinned public release: checked against its README's support matrix, "
           "Qwen3-0.6B served with tp 2 is inside for its architecture, dtype, head_dim, parallelism and local "
           "prefix cache, and outside for its 40960-token context and a KV service. Lacking a KV service is not "
           "lacking a local KV cache.",
        needs={"yours": "ch30.2"})
def system_boundary_figure(f: Figure, r: dict) -> None:
    matrix, rows, yours = r["matrix"], r["rows"], r["yours"]
    named = {}
    for key, reason in yours:
        named.setdefault(key, []).append(reason)
    seen = {row["key"] for row in rows}
    verdicts = []                                   # (row, your verdict "supported"?, your reason)
    for row in rows:
        reasons = named.get(row["key"], [])
        if sum(x["key"] == row["key"] for x in rows) > 1:    # several architectures: match by the value named
            reasons = [s for s in reasons if str(row["value"]) in s]
        verdicts.append((row, not reasons, reasons[0] if reasons else ""))
    extra = [k for k in named if k not in seen]
    wrong_any = any(ok != row["ok"] for row, ok, _ in verdicts) or bool(extra)

    f.heading(f"支持矩阵 · the support matrix of {matrix['release']} (its README at a pinned commit)")
    y = f.y + 2
    items = [("architectures", ", ".join(matrix["architectures"])), ("dtypes", ", ".join(matrix["dtypes"])),
             ("quantization", ", ".join(matrix["quantization"]) or "—"),
             ("head_dims", ", ".join(map(str, matrix["head_dims"]))), ("max_context", str(matrix["max_context"])),
             ("tensor_parallel_sizes", ", ".join(map(str, matrix["tensor_parallel_sizes"]))),
             ("features", ", ".join(f"{k}: {'yes' if v else 'no'}" for k, v in matrix["features"].items()))]
    for i, (k, v) in enumerate(items):
        f.text(MARGIN + 150, y + 14 + i * 17, k, size=SMALL + 1, anchor="end", color=MUTED, cls="label")
        f.text(MARGIN + 160, y + 14 + i * 17, v, size=SMALL + 1, mono=True, cls="value")
    f.y = y + 14 + len(items) * 17 + 14

    # The boundary: supported rows inside the release, unsupported ones outside, as your list says.
    f.heading("边界 · each requirement of the config, placed by your check_support")
    top = f.y + 6
    inner_w = 420
    bx, by = MARGIN, top
    chip_h, gap = 30, 8
    inside = [v for v in verdicts if v[1]]
    outside = [v for v in verdicts if not v[1]]
    heights = [_chip_height(row, ok, inner_w - 24, chip_h) for row, ok, _ in inside] or [chip_h]
    box_h = 34 + sum(h + gap for h in heights) + 8
    f.box(bx, by, inner_w, box_h, role="cached", dashed=True, rx=10)
    f.text(bx + 12, by + 20, f"inside {matrix['release']}: supported", size=LABEL, weight="bold", cls="label")
    cy = by + 34
    for (row, ok, _), h in zip(inside, heights):
        _chip(f, bx + 12, cy, inner_w - 24, h, row, ok)
        cy += h + gap
    ox = bx + inner_w + 24
    ow = WIDTH - MARGIN - ox
    f.text(ox, by + 20, "outside: your reasons", size=LABEL, weight="bold", cls="label")
    y = by + 34
    for row, ok, reason in outside:
        h = _chip_height(row, ok, ow, chip_h)
        _chip(f, ox, y, ow, h, row, ok)
        if reason:
            y = f.paragraph(ox + 8, y + h + 14, f"“{reason}”", width=ow - 12, size=SMALL, color=MUTED) + 10
        else:
            y += h + gap
    for k in extra:
        f.cell(ox, y, f"{k}: not a requirement of this config", role="plain", w=ow, h=chip_h, wrong=True,
               expected="(no entry)", fmt=str, size=SMALL + 1)
        y += chip_h + gap
    f.y = max(by + box_h, y) + 22

    # Local KV cache versus a KV service.
    f.heading("本地 KV 缓存 ≠ KV 服务 · a local prefix cache lives inside one engine; a KV service spans engines")
    y = f.y + 6
    kv = {row["key"]: row for row in rows}
    w = 250
    for i, name in enumerate(("engine instance 1", "engine instance 2")):
        x = MARGIN if i == 0 else WIDTH - MARGIN - w
        f.box(x, y, w, 86, role="cached", rx=8)
        f.text(x + 10, y + 18, name, size=SMALL + 1, weight="bold", cls="label")
        f.box(x + 10, y + 28, w - 20, 48, role="block", label="paged KV pool + prefix reuse (local)", size=SMALL + 0.5)
    cx = WIDTH / 2
    service_ok = kv.get("kv_service", {}).get("ok", False)
    f.box(cx - 95, y + 14, 190, 58, role="plain" if service_ok else "masked", dashed=not service_ok, rx=8,
          label="KV service (shared store)", size=SMALL + 1)
    f.arrow(MARGIN + w + 4, y + 43, cx - 99, y + 43, color=MUTED, dashed=True)
    f.arrow(WIDTH - MARGIN - w - 4, y + 43, cx + 99, y + 43, color=MUTED, dashed=True)
    status = "in this release" if service_ok else f"not in {matrix['release']}"
    f.text(cx, y + 86, status, size=SMALL + 1, anchor="middle", color=MUTED, cls="label")
    f.y = y + 86 + 26
    f.legend([("cached", "inside the release boundary"), ("block", "local KV cache (every candidate engine has one)"),
              ("masked", "outside: unsupported")], wrong=wrong_any)


CHIP_PAD = 8
"""The room between a chip's texts and its sides, and between its two texts on one line."""


def _chip_texts(row: dict, ok: bool, w: float) -> tuple[str, str, bool]:
    """A requirement chip's two texts, "✓ key = value" and what the matrix allows, and whether the second needs a
    line of its own: it does when the whole list does not fit beside the first."""
    text = f"feature {row['key']}" if row.get("feature") else f"{row['key']} = {row['value']}"
    shown = ("✓ " if ok else "✗ ") + text
    beside = w - 3 * CHIP_PAD - text_width(shown, SMALL + 1.5, mono=True)
    whole = allowed_note(row, float("inf"))
    if text_width(whole, SMALL) <= beside:
        return shown, whole, False
    return shown, allowed_note(row, w - 2 * CHIP_PAD - 16), True


def _chip_height(row: dict, placed_inside: bool, w: float, h: float) -> float:
    """A chip is one line high, or two when what the matrix allows needs its own line."""
    if placed_inside != row["ok"]:
        return h
    return h + 16 if _chip_texts(row, row["ok"], w)[2] else h


def _chip(f: Figure, x: float, y: float, w: float, h: float, row: dict, placed_inside: bool) -> None:
    """A requirement (key = value, what the matrix allows); wrong when your verdict differs."""
    text = f"feature {row['key']}" if row.get("feature") else f"{row['key']} = {row['value']}"
    allowed = row["allowed"] if isinstance(row["allowed"], str) else ", ".join(map(str, row["allowed"])) or "—"
    if placed_inside != row["ok"]:
        f.cell(x, y, text, role="plain", w=w, h=h, wrong=True, fmt=str, size=SMALL + 1,
               expected="supported" if row["ok"] else f"unsupported (allowed: {allowed})")
        return
    f.cell(x, y, "", role="cached" if row["ok"] else "masked", w=w, h=h)
    shown, note, below = _chip_texts(row, row["ok"], w)
    if below:   # the list on a line of its own, under the value
        f.text(x + CHIP_PAD, y + 19, shown, size=SMALL + 1.5, mono=True, cls="value")
        f.text(x + CHIP_PAD + 16, y + h - 9, note, size=SMALL, color=MUTED, cls="label")
        return
    f.text(x + CHIP_PAD, y + h / 2 + 4, shown, size=SMALL + 1.5, mono=True, cls="value")
    f.text(x + w - CHIP_PAD, y + h / 2 + 4, note, size=SMALL, anchor="end", color=MUTED, cls="label")


def allowed_note(row: dict, room: float) -> str:
    """What the matrix allows, in `room` pixels: the whole list if it fits; else the config's own value first
    (the one the reader looks for) and how many others there are; never a name cut short."""
    allowed = row["allowed"] if isinstance(row["allowed"], str) else [str(a) for a in row["allowed"]]
    if isinstance(allowed, str) or not allowed:
        return f"allowed: {allowed or '—'}"
    note = f"allowed: {', '.join(allowed)}"
    if text_width(note, SMALL) <= room:
        return note
    value = str(row["value"])
    first = [value] if value in allowed else []
    rest = [a for a in allowed if a not in first]
    for keep in range(len(rest), -1, -1):
        shown = first + rest[:keep]
        more = len(allowed) - len(shown)
        note = "allowed: " + ", ".join(shown) + (f" + {more} more" if more else "")
        if text_width(note, SMALL) <= room or not shown[1:]:
            return note
    return note
