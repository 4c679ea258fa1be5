"""Figures of ch17 · causal masks: the mask of a whole sequence, and a chunk's mask after a
cached prefix beside the top-left tril it must not be."""

from __future__ import annotations

from figures import figure
from figures.kit import Figure
from figures.layout import column, pad, row
from figures.style import CELL, INK, LABEL_SMALL, MUTED, stroke
from grader.i18n import tr

CW = 44  # mask cell width


def _keys(row: list[bool]) -> str:
    """The keys a row lets its query see, as k-ranges: 'k0–k3', 'k0', 'none'."""
    idx = [j for j, v in enumerate(row) if v]
    if not idx:
        return tr("none")
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
        note=tr("bool [{n}, {n}]; True = may attend (the scaled_dot_product_attention convention)", n=n),
    )

    f.heading(tr("your causal_mask({n}): row i = query at position i, column j = key at position j", n=n))
    mask = f.mask(
        yours,
        expected=expected,
        row_labels=[tr("q{i} · pos {p}", i=i, p=i) for i in range(n)],
        col_labels=[f"k{j}" for j in range(n)],
        w=CW,
    )
    seen = f.table(
        [
            [
                (_keys(yours[i]), {} if yours[i] == expected[i] else {"color": stroke("wrong"), "bold": True}),
                (f"k0–k{i}" if i else "k0", {"color": MUTED}),
                (tr("{n} keys", n=i + 1) if i else tr("1 key"), {"color": MUTED, "mono": False}),
            ]
            for i in range(n)
        ],
        header=[tr("your row sees"), tr("rule: j ≤ i"), ""],
        mono=True,
    )
    parts = column(
        f.lines(tr("upper triangle j > i: the future"), size=LABEL_SMALL + 0.5, color=INK),
        f.lines(tr("False (hidden)")),
        pad(f.lines(tr("diagonal j = i: kept"), size=LABEL_SMALL + 0.5, color=stroke("accent")), top=26),
        f.lines(tr("position i sees itself")),
        gap=3,
    )
    f.place(row(mask, seen, pad(parts, top=18), gap=22))
    for i in range(n):  # the kept diagonal, outlined
        f.outline(*mask.cell_box(i, i), role="accent", inset=1.5)

    # One row in use: what SDPA does with it.
    i = min(3, n - 1)
    f.heading(tr("row {i} in attention: a False key gets score −∞ before softmax, so probability 0", i=i))
    labels = [tr("your mask row"), tr("masked score"), tr("softmax weight")]
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
                [
                    [""],
                    [tr("s{i}j = q{i}·k_j / √d where True, −∞ where False", i=i)],
                    [tr("q{i} mixes the values of {keys} only", i=i, keys=_keys(yours[i]))],
                ],
                h=CELL + 6,
                size=LABEL_SMALL,
                color=MUTED,
            ),
            gap=18,
        ),
        after=10,
    )
    f.note(
        tr(
            "torch.tril(torch.ones({n}, {n}, dtype=torch.bool)) builds this mask; for a square mask it is also "
            "what scaled_dot_product_attention(..., is_causal=True) applies. A float mask would be added to the "
            "scores instead, so the answer must be bool.",
            n=n,
        ),
        size=LABEL_SMALL + 0.5,
    )
    f.y += 6
    f.legend(
        [
            ("attend", tr("T: may attend (j ≤ i)")),
            ("masked", tr("F: hidden, the future (j > i)")),
            ("accent", tr("pink outline: the diagonal j = i, kept")),
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
        [(f"num_cached = {c}", "cached"), (f"num_new = {n}", "new"), (tr("S = {c} + {n} = {s} keys", c=c, n=n, s=s), "plain")],
        note=tr("query i is the token at absolute position {c} + i, so it sees keys 0 … {c} + i", c=c),
    )

    # Two panels: yours, and the top-left tril.
    rows = [tr("q{i} · pos {p}", i=i, p=c + i) for i in range(n)]
    cols = [f"k{j}" for j in range(s)]
    yours_mask = f.mask(yours, expected=expected, row_labels=rows, col_labels=cols, w=CW)
    tril_mask = f.mask(top_left, row_labels=rows, col_labels=cols, w=CW)
    sees = lambda values, color: f.table(
        [[(tr("sees {keys}", keys=_keys(v)), {"color": color})] for v in values], header=[""], size=LABEL_SMALL + 0.5, mono=True
    )
    panel_w = (f.width - 2 * 28) / 2 - 12
    mine = f.titled(
        tr("yours: causal_mask_with_offset({n}, {c})", n=n, c=c),
        column(
            pad(row(yours_mask, sees(yours, stroke("wrong") if wrong else INK), gap=10), top=22),
            f.lines(
                tr("= tril(ones({n}, {s}), diagonal={c}): row i sees keys 0 … {c} + i", n=n, s=s, c=c)
                if vouched
                else tr("should be tril(ones({n}, {s}), diagonal={c}): row i sees keys 0 … {c} + i", n=n, s=s, c=c),
                tr("the last rows of the full causal mask (bottom-right)"),
            ),
            gap=8,
        ),
    )
    theirs = f.titled(
        tr("wrong: torch.tril(torch.ones({n}, {s}))", n=n, s=s),
        column(
            pad(row(tril_mask, sees(top_left, stroke("accent")), gap=10), top=22),
            column(
                f.label(tr("q0 (pos {c}) sees only k0: the cached prefix is lost", c=c), color=stroke("accent")),
                f.label(tr("SDPA's is_causal=True with L ≠ S aligns here (top-left)")),
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
    f.heading(tr("the full {s} × {s} causal mask (j ≤ i): which rows each mask takes", s=s))
    full = f.mask(
        [[j <= i for j in range(s)] for i in range(s)],
        col_labels=cols,
        w=CW,
        row_labels=[tr("q{i} · pos {p}", i=i - c, p=i) if i >= c else tr("pos {p}", p=i) for i in range(s)],
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
            tr("positions {a}–{b}: this chunk's queries\n= your [{n}, {s}] mask (bottom-right aligned)", a=c, b=s - 1, n=n, s=s)
            if vouched
            else tr(
                "positions {a}–{b}: this chunk's queries\n= the [{n}, {s}] mask it needs (bottom-right aligned)", a=c, b=s - 1, n=n, s=s
            ),
            color=INK,
        )
    if c and n:
        k = min(n, c)
        f.outline(*full.span_box(0, 0, k - 1, s - 1), role="accent", inset=-3.5, width=2, dashed=True)
        f.vbracket(
            right,
            y,
            full.cell_box(k, 0)[1],
            tr("positions 0–{b}: what torch.tril(ones({n}, {s})) copies\n(top-left aligned: rows of other tokens)", b=k - 1, n=n, s=s),
            color=stroke("accent"),
        )
    if c > n:
        span = (
            tr("position {a}: cached, computed in an earlier step", a=n)
            if c - n == 1
            else tr("positions {a}–{b}: cached, computed in an earlier step", a=n, b=c - 1)
        )
        f.vbracket(right, full.cell_box(n, 0)[1], full.cell_box(c, 0)[1], span, color=MUTED)
    f.note(
        tr(
            "nano-vllm passes causal=True to flash_attn_varlen_func; since flash-attn 2.1 the triangle of a "
            "query block shorter than its keys is aligned to the bottom-right, as here. PyTorch's "
            "scaled_dot_product_attention(..., is_causal=True) aligns it to the top-left when L ≠ S: for a chunk, "
            "pass this mask (or torch.nn.attention.bias.causal_lower_right) instead."
        ),
        size=LABEL_SMALL + 0.5,
    )
    f.legend(
        [
            ("cached", tr("cached prefix keys (K/V already in the cache)")),
            ("new", tr("new tokens of this step")),
            ("attend", tr("T: may attend")),
            ("masked", tr("F: hidden")),
            ("accent", tr("dashed: keys the top-left tril hides by mistake")),
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
            tr("cached") if short else tr("cached 0–{b}", b=c - 1) if c > 1 else tr("cached 0"),
            below=False,
            color=stroke("cached"),
        )
    if n:
        f.bracket(
            grid.cell_box(0, c)[0],
            grid.cell_box(0, c + n)[0],
            top,
            tr("new") if short else tr("new {a}–{b}", a=c, b=c + n - 1) if n > 1 else tr("new {a}", a=c),
            below=False,
            color=stroke("new"),
        )
