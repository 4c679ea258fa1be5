"""Figures of ch17 · causal masks: the mask of a whole sequence, and a chunk's mask after a
cached prefix beside the top-left tril it must not be."""

from __future__ import annotations

from figures import figure
from figures.kit import Figure
from figures.layout import column, pad, row
from figures.style import CELL, INK, LABEL_SMALL, MUTED, stroke

CW = 44  # mask cell width


def _keys(row: list[bool]) -> str:
    """The keys a row lets its query see, as k-ranges: 'k0–k3', 'k0', 'none'."""
    idx = [j for j, v in enumerate(row) if v]
    if not idx:
        return "none"
    ranges, start, prev = [], idx[0], idx[0]
    for j in idx[1:]:
        if j != prev + 1:
            ranges.append((start, prev))
            start = j
        prev = j
    ranges.append((start, prev))
    return ", ".join(f"k{a}" if a == b else f"k{a}–k{b}" for a, b in ranges)


# -- ch17.1 -----------------------------------------------------------------------------------


@figure(
    "ch17-causal-mask",
    title="完整序列的因果遮罩",
    zh="6 个 token 的完整序列:第 i 行是位置 i 的 query,只能看见第 0…i 列的 key。上三角(j > i,未来的 token)"
    "被屏蔽;对角线保留,因为位置 i 的输出要预测第 i + 1 个 token,它必须看见自己。",
    en="The causal mask of a whole sequence of 6 tokens: row i is the query at position i and may attend "
    "keys 0 … i. The upper triangle (j > i, the future) is masked; the diagonal is kept, because the "
    "output at position i predicts token i + 1 and must see token i itself.",
    needs={"yours": "ch17.1"},
)
def causal_mask_figure(f: Figure, r: dict) -> None:
    n, yours, expected = r["num_tokens"], r["yours"], r["expected"]
    wrong = yours != expected
    f.instance_row(
        [(f"T = {n}", "token"), (f"causal_mask({n})", "plain")],
        note=f"bool [{n}, {n}]; True = may attend (the scaled_dot_product_attention convention)",
    )

    f.heading(f"你的 mask · your causal_mask({n}): row i = query at position i, column j = key at position j")
    mask = f.mask(yours, expected=expected, row_labels=[f"q{i} · pos {i}" for i in range(n)], col_labels=[f"k{j}" for j in range(n)], w=CW)
    seen = f.table(
        [
            [
                (_keys(yours[i]), {} if yours[i] == expected[i] else {"color": stroke("wrong"), "bold": True}),
                (f"k0–k{i}" if i else "k0", {"color": MUTED}),
                (f"{i + 1} key" + ("s" if i else ""), {"color": MUTED, "mono": False}),
            ]
            for i in range(n)
        ],
        header=["your row sees", "rule: j ≤ i", ""],
        mono=True,
    )
    parts = column(
        f.lines("上三角 j > i: 未来, 屏蔽", size=LABEL_SMALL + 0.5, color=INK),
        f.lines("upper triangle: the future,", "False (hidden)"),
        pad(f.lines("对角线 j = i: 保留", size=LABEL_SMALL + 0.5, color=stroke("accent")), top=26),
        f.lines("diagonal: kept, position i", "sees itself"),
        gap=3,
    )
    f.place(row(mask, seen, pad(parts, top=18), gap=22))
    for i in range(n):  # the kept diagonal, outlined
        f.outline(*mask.cell_box(i, i), role="accent", inset=1.5)

    # One row in use: what SDPA does with it.
    i = min(3, n - 1)
    f.heading(f"一行的用法 · row {i} in attention: a False key gets score −∞ before softmax, so probability 0")
    labels = ["your mask row", "masked score", "softmax weight"]
    use = f.matrix(
        [yours[i], [f"s{i}{j}" if v else "−∞" for j, v in enumerate(yours[i])], ["> 0" if v else "0" for v in yours[i]]],
        role=lambda k, j: ("attend" if yours[i][j] else "masked") if k != 1 else ("plain" if yours[i][j] else "masked"),
        expected=[expected[i], *([[None] * n] * 2)],
        wrong=[[a != b for a, b in zip(yours[i], expected[i])], [False] * n, [False] * n],
        row_labels=labels,
        w=CW,
        gap=6,
        fmt=lambda v: v if isinstance(v, str) else "T" if v else "F",
    )
    f.place(
        row(
            use,
            f.table(
                [[""], [f"s{i}j = q{i}·k_j / √d where True, −∞ where False"], [f"q{i} mixes the values of {_keys(yours[i])} only"]],
                h=CELL + 6,
                size=LABEL_SMALL,
                color=MUTED,
            ),
            gap=18,
        ),
        after=10,
    )
    f.note(
        f"torch.tril(torch.ones({n}, {n}, dtype=torch.bool)) builds this mask; for a square mask it is also "
        "what scaled_dot_product_attention(..., is_causal=True) applies. A float mask would be added to the "
        "scores instead, so the answer must be bool.",
        size=LABEL_SMALL + 0.5,
    )
    f.y += 6
    f.legend(
        [
            ("attend", "T: may attend (j ≤ i)"),
            ("masked", "F: hidden, the future (j > i)"),
            ("accent", "pink outline: the diagonal j = i, kept"),
        ],
        wrong=wrong,
    )


# -- ch17.2 -----------------------------------------------------------------------------------


@figure(
    "ch17-offset-mask",
    title="缓存 chunk 必须带上位置偏移",
    zh="3 个 token 已在 KV 缓存中,这一步只算 2 个新 token:它们的绝对位置是 3 和 4,所以 [2, 5] 的 mask 是"
    "完整 5 × 5 因果遮罩的最后两行(tril 取 diagonal = 3,对齐右下角),不能照搬从左上角开始的 tril。",
    en="A chunk after a cached prefix needs its position offset: 3 tokens are cached and 2 new ones are "
    "computed, at absolute positions 3 and 4, so the [2, 5] mask is the last two rows of the full 5 × 5 "
    "causal mask (tril with diagonal = 3, aligned to the bottom-right), not a tril taken from the "
    "top-left corner.",
    needs={"yours": "ch17.2"},
)
def offset_mask_figure(f: Figure, r: dict) -> None:
    n, c, yours, expected = r["num_new"], r["num_cached"], r["yours"], r["expected"]
    s = n + c
    wrong = yours != expected
    vouched = not wrong and r.get("checked", True)  # only then may the text below call the mask yours
    top_left = [[j <= i for j in range(s)] for i in range(n)]

    f.instance_row(
        [(f"num_cached = {c}", "cached"), (f"num_new = {n}", "new"), (f"S = {c} + {n} = {s} keys", "plain")],
        note=f"query i is the token at absolute position {c} + i, so it sees keys 0 … {c} + i",
    )

    # Two panels: yours, and the top-left tril.
    rows = [f"q{i} · pos {c + i}" for i in range(n)]
    cols = [f"k{j}" for j in range(s)]
    yours_mask = f.mask(yours, expected=expected, row_labels=rows, col_labels=cols, w=CW)
    tril_mask = f.mask(top_left, row_labels=rows, col_labels=cols, w=CW)
    sees = lambda values, color: f.table(
        [[("sees " + _keys(v), {"color": color})] for v in values], header=[""], size=LABEL_SMALL + 0.5, mono=True
    )
    panel_w = (f.width - 2 * 28) / 2 - 12
    mine = f.titled(
        f"你的 mask · yours: causal_mask_with_offset({n}, {c})",
        column(
            pad(row(yours_mask, sees(yours, stroke("wrong") if wrong else INK), gap=10), top=22),
            f.lines(
                f"{'=' if vouched else 'should be'} tril(ones({n}, {s}), diagonal={c}): row i sees keys 0 … {c} + i",
                "the last rows of the full causal mask (bottom-right)",
            ),
            gap=8,
        ),
    )
    theirs = f.titled(
        f"错误 · wrong: torch.tril(torch.ones({n}, {s}))",
        column(
            pad(row(tril_mask, sees(top_left, stroke("accent")), gap=10), top=22),
            column(
                f.label(f"q0 (pos {c}) sees only k0: the cached prefix is lost", color=stroke("accent")),
                f.label("SDPA's is_causal=True with L ≠ S aligns here (top-left)"),
                gap=3,
            ),
            gap=8,
        ),
        color=stroke("accent"),
    )
    f.place(row(pad(mine, right=max(0, panel_w - mine.w)), theirs, gap=24))
    for grid in (yours_mask, tril_mask):
        _prefix_brackets(f, grid, c, n)
    for i in range(n):  # the keys the top-left tril hides by mistake
        for j in range(s):
            if expected[i][j] and not top_left[i][j]:
                f.outline(*tril_mask.cell_box(i, j), role="accent", inset=3, width=1.6, dashed=True)

    # The full sequence: where both sets of rows come from.
    f.heading(f"从完整序列看 · the full {s} × {s} causal mask (j ≤ i): which rows each mask takes")
    full = f.mask(
        [[j <= i for j in range(s)] for i in range(s)],
        col_labels=cols,
        w=CW,
        row_labels=[f"pos {i}" + (f" · q{i - c}" if i >= c else "") for i in range(s)],
    )
    f.place(pad(full, left=60, top=26), after=26)
    _prefix_brackets(f, full, c, n, short=True)
    x, y, w, _ = full.span_box(0, 0, 0, s - 1)
    right = x + w + 10
    if n:
        f.outline(*full.span_box(c, 0, s - 1, s - 1), role="new", inset=-3, width=2.5)
        f.vbracket(
            right,
            full.cell_box(c, 0)[1],
            full.cell_box(s, 0)[1],
            f"positions {c}–{s - 1}: this chunk's queries\n= "
            + (f"your [{n}, {s}] mask (bottom-right aligned)" if vouched else f"the [{n}, {s}] mask it needs (bottom-right aligned)"),
            color=INK,
        )
    if c and n:
        k = min(n, c)
        f.outline(*full.span_box(0, 0, k - 1, s - 1), role="accent", inset=-3.5, width=2, dashed=True)
        f.vbracket(
            right,
            y,
            full.cell_box(k, 0)[1],
            f"positions 0–{k - 1}: what torch.tril(ones({n}, {s})) copies\n(top-left aligned: rows of other tokens)",
            color=stroke("accent"),
        )
    if c > n:
        span = f"position {n}" if c - n == 1 else f"positions {n}–{c - 1}"
        f.vbracket(right, full.cell_box(n, 0)[1], full.cell_box(c, 0)[1], span + ": cached, computed in an earlier step", color=MUTED)
    f.note(
        "nano-vllm passes causal=True to flash_attn_varlen_func; since flash-attn 2.1 the triangle of a "
        "query block shorter than its keys is aligned to the bottom-right, as here. PyTorch's "
        "scaled_dot_product_attention(..., is_causal=True) aligns it to the top-left when L ≠ S: for a chunk, "
        "pass this mask (or torch.nn.attention.bias.causal_lower_right) instead.",
        size=LABEL_SMALL + 0.5,
    )
    f.legend(
        [
            ("cached", "cached prefix keys (K/V already in the cache)"),
            ("new", "new tokens of this step"),
            ("attend", "T: may attend"),
            ("masked", "F: hidden"),
            ("accent", "dashed: keys the top-left tril hides by mistake"),
        ],
        wrong=wrong,
    )


def _prefix_brackets(f: Figure, grid, c: int, n: int, *, short: bool = False) -> None:
    """Brackets over a mask's columns: the cached prefix and the new tokens."""
    _, y, _, _ = grid.cell_box(0, 0)
    top = y - 22
    if c:
        f.bracket(
            grid.cell_box(0, 0)[0],
            grid.cell_box(0, c)[0],
            top,
            "cached" if short else f"cached 0–{c - 1}" if c > 1 else "cached 0",
            below=False,
            color=stroke("cached"),
        )
    if n:
        f.bracket(
            grid.cell_box(0, c)[0],
            grid.cell_box(0, c + n)[0],
            top,
            "new" if short else f"new {c}–{c + n - 1}" if n > 1 else f"new {c}",
            below=False,
            color=stroke("new"),
        )
