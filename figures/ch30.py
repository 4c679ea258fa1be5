"""Figures of ch30 · into a native core: a request's path from Python into the C++ core (its record's bytes,
its token arrays, the phase of the step), and the system boundary a pinned release's support matrix draws."""

from __future__ import annotations

from figures import figure
from figures.kit import Figure, num, text_width
from figures.layout import Part, centred, column, narrow, pad, row, space
from figures.style import INK, LABEL, LABEL_SMALL, MARGIN, MUTED, SMALL, VALUE
from grader.checks.ch30 import feature_verdict
from grader.i18n import tr, tr_in

LENGTHS = {"prompt_len", "num_tokens", "num_computed_tokens", "num_new_tokens"}
C_TYPES = {"<i8": "int64", "<i4": "int32", "|b1": "bool", "<f4": "float32"}
C_DECLS = {"<i8": "int64_t", "<i4": "int32_t", "|b1": "bool", "<f4": "float"}
BYTE_W, FIELD_H = 56, 34  # one byte of the record across, a field's box high


@figure(
    "ch30-request-path",
    title="请求从 Python 进入 C++",
    zh="Python 前端把请求降低为一条按 C 规则对齐的 56 字节记录(字段有固定类型与偏移,空位是填充字节)"
    "和两组扁平 int32 数组;C++ 核心据记录选出下一步的阶段:还有 prompt 要算就先做 prompt,否则 decode。"
    "公开版本仍有 prompt/decode 阶段选择,并不照搬 vLLM 的全部抽象。",
    en="A request's path from Python into a native core: the front end lowers it to one 56-byte record "
    "aligned like a C struct (typed fields at fixed offsets, padding in the gaps) and two flat int32 "
    "arrays; the C++ core picks the next step's phase from the records: prompt first while any prompt "
    "work remains, else decode. The public engines keep this phase selection rather than copying every "
    "abstraction of vLLM.",
    needs={"record": "ch30.1"},
)
def request_path_figure(f: Figure, r: dict) -> None:
    req, rec, want = r["request"], r["record"], r["record_expected"]
    layout, layout_want = r["layout"], r["layout_expected"]
    wrong_any = (
        rec != want
        or layout != layout_want
        or r["itemsize"] != r["itemsize_expected"]
        or r["input_ids"] != r["input_ids_expected"]
        or r["positions"] != r["positions_expected"]
        or r.get("phases") != r["phases_expected"]
    )

    # 1. The request as Python holds it.
    f.heading(tr("① the Python front end: the request as it holds it (request A)"))
    sp = req["sampling_params"]
    code = f.table(
        [
            ["request_id", f"= {req['request_id']}"],
            ["prompt_token_ids", f"= {req['prompt_token_ids']}"],
            ["prompt", f"= {req['prompt']!r}"],
            ["sampling_params", "= {" + ", ".join(f"{k}: {v}" for k, v in sp.items()) + "}"],
        ],
        h=17,
        size=VALUE - 1.5,
        mono=True,
        gap=10,
    )
    f.place(f.framed(column(f.label("dict · lists · None · str"), code, gap=4), w=f.width - 2 * MARGIN), after=12)
    f.note(
        tr(
            "lower_request keeps what the core needs and encodes what C cannot hold: top_k −1 → 0 (off), "
            "seed None → −1; the prompt text stays in Python."
        ),
        size=LABEL_SMALL,
    )
    f.arrow(f.width / 2, f.y - 6, f.width / 2, f.y + 20, color=INK)
    f.text(f.width / 2 + 10, f.y + 12, tr("pybind11 / ctypes: one buffer, no Python objects"), size=LABEL_SMALL, color=MUTED, cls="label")
    f.y += 40

    # 2. The record's bytes, 8 per row, beside the struct C declares.
    f.heading(
        tr("② the record's bytes: yours is {n} bytes (the C struct: {want}), 8 bytes per row", n=r["itemsize"], want=r["itemsize_expected"])
    )
    mine = {entry[0]: entry for entry in layout}
    slots: dict[int, Part] = {}  # first byte → the field (or padding byte) there
    for name, tstr, off, size in layout_want:
        got = mine.get(name)
        if got is None or got[1] != tstr or got[2] != off:  # your field is elsewhere: where, against where
            cell, expected = (
                tr("missing") if got is None else f"@{got[2]} {C_TYPES.get(got[1], got[1])}",
                f"@{off} {C_TYPES.get(tstr, tstr)}",
            )
        else:
            cell, expected = _value(rec.get(name)), _value(want[name])
        label = f.label(f"{name} · {C_TYPES.get(tstr, tstr)}", size=SMALL, color=INK)
        slots[off] = column(
            narrow(label, size * BYTE_W - 4),  # a 1-byte field's label runs over the padding
            f.matrix([[cell]], expected=[[expected]], role=_role(name), w=size * BYTE_W - 4, h=FIELD_H, fmt=str),
            gap=2,
        )
    rows = -(-r["itemsize_expected"] // 8)
    used = {b for _, _, off, size in layout_want for b in range(off, off + size)}
    for b in set(range(rows * 8)) - used:
        slots[b] = f.matrix([["pad"]], role="masked", w=BYTE_W - 4, h=FIELD_H, fmt=str)
    gutter = 62

    def byte_row(i: int) -> Part:
        name = f.label(tr("byte {n}", n=8 * i), size=SMALL + 0.5, mono=True)
        return row(
            pad(name, left=gutter - name.w, bottom=(FIELD_H - name.h) / 2),
            row(*(slots[b] for b in sorted(slots) if b // 8 == i), gap=4, align="bottom"),
            gap=10,
            align="bottom",
        )

    offsets = row(space(gutter), row(*(centred(f.label(f"+{b}", size=SMALL, mono=True), BYTE_W - 4) for b in range(8)), gap=4), gap=10)
    struct = column(
        f.label(f"struct Request {{   // {r['itemsize_expected']} bytes, align 8", size=SMALL + 0.5, mono=True, color=INK, cls="value"),
        pad(
            f.table(
                [[C_DECLS.get(t, t), f"{name};", (f"// {off}", {"color": MUTED})] for name, t, off, _ in layout_want],
                h=17,
                size=SMALL + 0.5,
                mono=True,
                gap=8,
            ),
            left=14,
        ),
        f.label("};", size=SMALL + 0.5, mono=True, color=INK, cls="value"),
        pad(
            f.text_block(
                tr("np.dtype(fields, align=True) and ctypes.Structure compute these same offsets."),
                width=f.width - 2 * MARGIN - offsets.w - 22,
                size=SMALL + 0.5,
            ),
            top=14,
        ),
        gap=2,
    )
    f.place(row(column(offsets, *(byte_row(i) for i in range(rows)), gap=6), struct, gap=22), after=24)
    f.note(
        tr(
            "A field of s bytes starts at a multiple of s: is_prompt (1 byte at 24) leaves 3 padding bytes before "
            "max_tokens at 28, top_k ends at 44 so seed waits for 48; the size, 56, is a multiple of 8."
        ),
        size=LABEL_SMALL,
    )
    f.y += 8

    # 3. The flat arrays: the student's against the expected, cell by cell.
    f.heading(tr("③ flat arrays: the int32 arrays of the step, the tokens without KV and their positions"))
    arrays = [(r["input_ids"], r["input_ids_expected"]), (r["positions"], r["positions_expected"])]
    n = max(max(len(a), len(b)) for a, b in arrays) or 1
    filled = lambda xs: list(xs) + ["—"] * (n - len(xs))
    f.place(
        pad(
            f.matrix(
                [filled(got) for got, _ in arrays],
                expected=[filled(exp) for _, exp in arrays],
                row_labels=["input_ids", "positions"],
                role="token",
                w=min(70, (f.width - 2 * MARGIN - 110) / n) - 4,
                h=32,
                gap=5,
            ),
            left=30,
            top=4,
        ),
        after=28,
    )

    # 4. The core's phase selection.
    f.heading(tr("④ the C++ core: select_phase on the records of three requests, two batches"))
    cols = ["request_id", "prompt_len", "num_tokens", "num_computed_tokens", "num_new_tokens", "is_prompt"]
    batch = f.matrix(
        [[_value(vals[c]) for c in cols] for vals in r["batch"].values()],
        role=lambda i, j: _role(cols[j]),
        row_labels=list(r["batch"]),
        col_labels=["request_id", "prompt_len", "num_tokens", "computed", "num_new", "is_prompt"],
        w=78,
        h=28,
        gap=6,
        fmt=str,
    )
    phases = r.get("phases") or [tr("(select_phase raised)")] * len(r["batches"])
    room = f.width - 2 * MARGIN - 40 - batch.w - 14
    calls = column(
        *(
            column(
                f.label("select_phase([" + ", ".join(names) + "])", size=LABEL_SMALL, mono=True, color=INK),
                f.matrix([[got]], expected=[[exp]], role="accent", w=room, h=26, fmt=str),
                gap=3,
            )
            for names, got, exp in zip(r["batches"], phases, r["phases_expected"])
        ),
        gap=8,
    )
    f.place(pad(row(batch, calls, gap=14), left=40, top=4), after=20)
    f.note(
        tr(
            "A still has 5 prompt tokens, so [A, B, C] runs a prompt step and B, C wait one step (prefill first, "
            "as in vLLM v0 and nano-vllm); [B, C] has only newest output tokens left: a decode step."
        ),
        size=LABEL_SMALL,
    )
    f.legend(
        [
            ("token", tr("lengths and the token arrays")),
            ("accent", tr("phase")),
            ("plain", tr("id and sampling parameters")),
            ("masked", tr("padding bytes")),
        ],
        wrong=wrong_any,
    )


@figure(
    "ch30-system-boundary",
    title="公开 README 的系统边界",
    zh="一个固定提交的 README 支持矩阵划出系统边界:Qwen3-0.6B 以 tp 2 部署时,模型类、dtype、head_dim、"
    "并行度和本地前缀缓存都在边界内;40960 的上下文与 KV 服务在边界外。缺完整 KV 服务不等于没有本地 KV 缓存。",
    en="The system boundary of a pinned public release: checked against its README's support matrix, "
    "Qwen3-0.6B served with tp 2 is inside for its architecture, dtype, head_dim, parallelism and local "
    "prefix cache, and outside for its 40960-token context and a KV service. Lacking a KV service is not "
    "lacking a local KV cache.",
    needs={"yours": "ch30.2"},
)
def system_boundary_figure(f: Figure, r: dict) -> None:
    matrix, rows, yours = r["matrix"], r["rows"], r["yours"]
    named: dict[str, list[str]] = {}
    for key, reason in yours:
        named.setdefault(key, []).append(reason)
    seen = {row["key"] for row in rows}
    verdicts = []  # (row, your verdict "supported"?, your reason)
    for req in rows:
        reasons = named.get(req["key"], [])
        if sum(x["key"] == req["key"] for x in rows) > 1:  # several architectures: match by the value named
            reasons = [s for s in reasons if str(req["value"]) in s]
        verdicts.append((req, not reasons, reasons[0] if reasons else ""))
    extra = [k for k in named if k not in seen]
    wrong_any = any(ok != req["ok"] for req, ok, _ in verdicts) or bool(extra)

    f.heading(tr("the support matrix of {release} (its README at a pinned commit)", release=matrix["release"]))
    items = [
        ("architectures", ", ".join(matrix["architectures"])),
        ("dtypes", ", ".join(matrix["dtypes"])),
        ("quantization", ", ".join(matrix["quantization"]) or "—"),
        ("head_dims", ", ".join(map(str, matrix["head_dims"]))),
        ("max_context", str(matrix["max_context"])),
        ("tensor_parallel_sizes", ", ".join(map(str, matrix["tensor_parallel_sizes"]))),
        (
            "features",
            ", ".join(f"{k}: {tr_in('ch30.matrix', 'yes') if v else tr_in('ch30.matrix', 'no')}" for k, v in matrix["features"].items()),
        ),
    ]
    f.place(
        pad(
            f.table(
                [[(k, {"color": MUTED, "mono": False, "cls": "label"}), v] for k, v in items], h=17, size=LABEL_SMALL, mono=True, gap=12
            ),
            left=12,
        ),
        after=30,
    )

    # The boundary: supported rows inside the release, unsupported ones outside, as your list says.
    f.heading(tr("the boundary: each requirement of the config, placed by your check_support"))
    inner_w = 420
    outer_w = f.width - 2 * MARGIN - inner_w - 24
    inside = f.framed(
        column(
            f.label(tr("inside {release}: supported", release=matrix["release"]), size=LABEL, color=INK, bold=True),
            *([_chip(f, req, ok, inner_w - 24) for req, ok, _ in verdicts if ok] or [space(h=30)]),
            gap=8,
        ),
        w=inner_w,
        role="cached",
        dashed=True,
        rx=10,
    )
    outside = column(
        f.label(tr("outside: your reasons"), size=LABEL, color=INK, bold=True),
        *(
            column(
                _chip(f, req, ok, outer_w),
                pad(f.text_block(f"“{reason}”", width=outer_w - 12, size=SMALL), left=8) if reason else None,
                gap=4,
            )
            for req, ok, reason in verdicts
            if not ok
        ),
        *(
            f.matrix(
                [[tr("{key}: not a requirement of this config", key=k)]],
                expected=[[tr("(no entry)")]],
                wrong=[[True]],
                w=outer_w,
                h=30,
                fmt=str,
            )
            for k in extra
        ),
        gap=8,
    )
    f.place(row(inside, pad(outside, top=10), gap=24), after=32)

    # Local KV cache versus a KV service.
    f.heading(tr("a local KV cache ≠ a KV service: a local prefix cache lives inside one engine; a KV service spans engines"))
    y = f.y + 6
    kv = {req["key"]: req for req in rows}
    w = 250
    for i, name in enumerate((tr("engine instance {n}", n=1), tr("engine instance {n}", n=2))):
        x = MARGIN if i == 0 else f.width - MARGIN - w
        f.box(x, y, w, 86, role="cached", rx=8)
        f.text(x + 10, y + 18, name, size=LABEL_SMALL, weight="bold", cls="label")
        f.box(x + 10, y + 28, w - 20, 48, role="block", label=tr("paged KV pool + prefix reuse (local)"), size=SMALL + 0.5)
    cx = f.width / 2
    service_ok = kv.get("kv_service", {}).get("ok", False)
    f.box(
        cx - 95,
        y + 14,
        190,
        58,
        role="plain" if service_ok else "masked",
        dashed=not service_ok,
        rx=8,
        label=tr("KV service (shared store)"),
        size=LABEL_SMALL,
    )
    f.arrow(MARGIN + w + 4, y + 43, cx - 99, y + 43, color=MUTED, dashed=True)
    f.arrow(f.width - MARGIN - w - 4, y + 43, cx + 99, y + 43, color=MUTED, dashed=True)
    status = tr("in this release") if service_ok else tr("not in {release}", release=matrix["release"])
    f.text(cx, y + 86, status, size=LABEL_SMALL, anchor="middle", color=MUTED, cls="label")
    f.y = y + 86 + 26
    f.legend(
        [
            ("cached", tr("inside the release boundary")),
            ("block", tr("local KV cache (every candidate engine has one)")),
            ("masked", tr("outside: unsupported")),
        ],
        wrong=wrong_any,
    )


# -- parts --------------------------------------------------------------------------------------------


def _role(name: str) -> str:
    return "token" if name in LENGTHS else "accent" if name == "is_prompt" else "plain"


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:.7g}".replace("-", "−")
    return num(v)


CHIP_PAD = 8
"""The room between a chip's texts and its sides, and between its two texts on one line."""


def _chip_texts(row: dict, ok: bool, w: float) -> tuple[str, str, bool]:
    """A requirement chip's two texts, "✓ key = value" and what the matrix allows, and whether the second needs a
    line of its own: it does when the whole list does not fit beside the first."""
    text = tr("feature {key}", key=row["key"]) if row.get("feature") else f"{row['key']} = {row['value']}"
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


def _chip(f: Figure, row: dict, placed_inside: bool, w: float) -> Part:
    """A requirement (key = value, what the matrix allows) `w` wide; wrong when your verdict differs."""
    text = tr("feature {key}", key=row["key"]) if row.get("feature") else f"{row['key']} = {row['value']}"
    allowed = feature_verdict(row["allowed"]) if isinstance(row["allowed"], str) else ", ".join(map(str, row["allowed"])) or "—"
    h = _chip_height(row, placed_inside, w, 30)

    def draw(x: float, y: float) -> None:
        if placed_inside != row["ok"]:
            f.cell(
                x,
                y,
                text,
                role="plain",
                w=w,
                h=h,
                wrong=True,
                fmt=str,
                size=SMALL + 1,
                expected=tr("supported") if row["ok"] else tr("unsupported (allowed: {allowed})", allowed=allowed),
            )
            return
        f.cell(x, y, "", role="cached" if row["ok"] else "masked", w=w, h=h)
        shown, note, below = _chip_texts(row, row["ok"], w)
        if below:  # the list on a line of its own, under the value
            f.text(x + CHIP_PAD, y + 19, shown, size=SMALL + 1.5, mono=True, cls="value")
            f.text(x + CHIP_PAD + 16, y + h - 9, note, size=SMALL, color=MUTED, cls="label")
            return
        f.text(x + CHIP_PAD, y + h / 2 + 4, shown, size=SMALL + 1.5, mono=True, cls="value")
        f.text(x + w - CHIP_PAD, y + h / 2 + 4, note, size=SMALL, anchor="end", color=MUTED, cls="label")

    return Part(w, h, draw)


def allowed_note(row: dict, room: float) -> str:
    """What the matrix allows, in `room` pixels: the whole list if it fits; else the config's own value first
    (the one the reader looks for) and how many others there are; never a name cut short."""
    allowed = feature_verdict(row["allowed"]) if isinstance(row["allowed"], str) else [str(a) for a in row["allowed"]]
    if isinstance(allowed, str) or not allowed:
        return tr("allowed: {allowed}", allowed=allowed or "—")
    note = tr("allowed: {allowed}", allowed=", ".join(allowed))
    if text_width(note, SMALL) <= room:
        return note
    value = str(row["value"])
    first = [value] if value in allowed else []
    rest = [a for a in allowed if a not in first]
    for keep in range(len(rest), -1, -1):
        shown = first + rest[:keep]
        more = len(allowed) - len(shown)
        note = (
            tr("allowed: {allowed} + {more} more", allowed=", ".join(shown), more=more)
            if more
            else tr("allowed: {allowed}", allowed=", ".join(shown))
        )
        if text_width(note, SMALL) <= room or not shown[1:]:
            return note
    return note
