"""Figures of ch21 · the KV cache and the decode step: per-layer caches growing along the token axis,
and what one decode step feeds the model and where it writes."""

from __future__ import annotations

from typing import Callable

from figures import figure
from figures.kit import Figure, num
from figures.layout import column, pad, row
from figures.style import CELL, INK, LABEL, LABEL_SMALL, MUTED, stroke
from grader.i18n import tr


def _pair(v: list, shown: bool = False) -> str:
    """A row of a one-head cache of head_dim 2, as the figure writes it: "11, 12" ("" for a row of zeros, unless
    `shown`)."""
    return ", ".join(num(x) for x in v) if any(v) or shown else ""


# -- ch21.1 -------------------------------------------------------------------------------------------


@figure(
    "ch21-cache-growth",
    title="缓存沿 token 轴增长",
    zh="每一层都有自己的一对 K/V 缓存:prefill 一次写入 3 行,之后每个 decode 步在已有长度之后追加 1 行;"
    "有效前缀沿 token 轴变长,各层互不共享。",
    en="The cache grows along the token axis, per layer: a prefill writes 3 rows at once, then every "
    "decode step appends one row after the current length. Each layer has its own K/V cache; "
    "no layer shares another's.",
    needs={"caches": "ch21.1"},
)
def cache_growth_figure(f: Figure, r: dict) -> None:
    l_max, steps, caches, expected, wrong, lengths = (r["l_max"], r["steps"], r["caches"], r["expected"], r["wrong"], r["lengths"])
    layers = len(caches)
    f.instance_row(
        [(tr("{n} layers", n=layers), "plain"), (f"L_max = {l_max}", "plain"), (tr("1 kv head, head_dim 2"), "plain")],
        note=tr("K of layer ℓ, token t = [100ℓ + 10(t+1) + 1, … + 2]; V = −K; every cache starts as zeros"),
    )

    cw, ch = 88, 28
    length = 0
    for s, n in enumerate(steps):
        mark = "①②③④⑤"[s] if s < 5 else s + 1
        call = {"mark": mark, "length": length, "n": n}
        f.heading(
            tr("{mark} prefill: append_kv(…, length={length}, n={n} new tokens)", **call)
            if s == 0
            else tr("{mark} decode step {s}: append_kv(…, length={length}, n={n} new tokens)", s=s, **call)
        )
        # One row of cells per layer and K/V, one column per cache row (token).
        rows = [(layer, kv) for layer in range(layers) for kv in (0, 1)]
        role = lambda i, j: "cached" if j < length else ("kv"[rows[i][1]] if j < length + n else "masked")
        cache = f.matrix(
            [[_pair(x, bad) for x, bad in zip(caches[layer][s][kv], wrong[layer][s][kv])] for layer, kv in rows],
            role=role,
            fmt=str,
            expected=[[_pair(x) or "·" for x in expected[layer][s][kv]] for layer, kv in rows],
            wrong=[wrong[layer][s][kv] for layer, kv in rows],
            w=cw,
            h=ch,
            gap=5,
            row_labels=[tr("layer {layer} · {kv}", layer=layer, kv="KV"[kv]) for layer, kv in rows],
            col_labels=[tr("row {j}", j=j) for j in range(l_max)],
        )
        # Beside each layer's K row: the length its append_kv returned.
        returned = []
        for layer in range(layers):
            got = lengths[layer][s]
            ok = got == length + n
            returned += [
                (
                    f"→ {'?' if got is None else got}",
                    {"bold": True, "color": INK if ok else stroke("wrong"), "cls": "value" if ok else "value wrong"},
                ),
                (
                    tr("returned") if ok else tr("expected {n}", n=length + n),
                    {"color": MUTED if ok else INK, "cls": "label" if ok else "expected"},
                ),
            ]
        f.place(
            row(cache, f.table([[x] for x in returned], header=[tr("token axis →") if s == 0 else ""], h=ch + 5, size=LABEL_SMALL), gap=10),
            after=30,
        )
        end = length + n
        if end:  # the valid prefix after this step, as a bracket under the rows
            x, y, _, h = cache.cell_box(len(rows) - 1, 0)
            f.bracket(
                x,
                cache.cell_box(0, end - 1)[0] + cw,
                y + h + 4,
                tr("valid prefix: rows 0 … {last} (length {n}) — grew by 1 row", last=end - 1, n=end)
                if s
                else tr("valid prefix: rows 0 … {last} (length {n})", last=end - 1, n=end),
            )
        f.y += 12
        length = end

    f.note(
        tr(
            "Rows 0 … length − 1 are the sequence's tokens in order; each append writes rows length … "
            "length + n − 1 and nothing else. The two layers never share rows: layer 1's cache holds layer 1's "
            "K/V (values 1xx), computed from layer 0's output."
        ),
        size=LABEL_SMALL,
    )
    f.y += 4
    wrong_any = any(any(any(kv) for kv in step) for layer in wrong for step in layer) or any(
        got != sum(steps[: s + 1]) for layer in lengths for s, got in enumerate(layer)
    )
    f.legend(
        [
            ("cached", tr("written by an earlier step")),
            ("k", tr("K appended by this step")),
            ("v", tr("V appended by this step")),
            ("masked", tr("free row, beyond the length")),
        ],
        wrong=wrong_any,
    )


# -- ch21.2 -------------------------------------------------------------------------------------------


@figure(
    "ch21-decode-step",
    title="一个 decode step 的真实工作",
    zh="最新采样的 token 已经在 token_ids 里,但还没有自己的 KV:decode 步以它为输入,position = len − 1,"
    "先把它的 K/V 写进 slot,再让 attention 读取全部 context_len = len 个条目。",
    en="What one decode step does: the newest sampled token is already in token_ids but has no KV yet. "
    "The step feeds it at position len − 1, writes its K/V into its slot first, then attention reads "
    "all context_len = len entries.",
    needs={"yours": "ch21.2"},
)
def decode_step_figure(f: Figure, r: dict) -> None:
    ids, table, bs, yours, want = r["token_ids"], r["table"], r["block_size"], r["yours"], r["expected"]
    n = len(ids)
    pos = n - 1
    wrong_any = yours != want
    f.instance_row(
        [(f"len = {n}", "token"), (f"block_size = {bs}", "plain"), (f"block_table = {table}", "block")],
        note=tr("nano-vllm's {table} example, with blocks of {bs} instead of 256", table=table, bs=bs),
    )

    # token_ids: the cached prefix and the newest token.
    f.heading(tr("token_ids: the sequence as the scheduler holds it after the previous step"))
    tokens = f.matrix(
        [ids],
        role=lambda i, j: "cached" if j < pos else "new",
        row_labels=[tr("token id")],
        w=58,
        gap=6,
        col_labels=[f"pos {j}" for j in range(n)],
    )
    f.place(pad(tokens, left=50), after=60)
    f.outline(*tokens.cell_box(0, pos), inset=-2)
    x, y, w, h = tokens.cell_box(0, pos)
    if pos:
        f.bracket(tokens.cell_box(0, 0)[0], x - 6, y + h + 4, tr("{n} tokens with K/V in the cache (num_cached = len − 1)", n=pos))
    for k, line in enumerate((tr("sampled last step:"), tr("no K/V yet"))):
        f.text(x + w / 2, y + h + 18 + 13 * k, line, size=LABEL_SMALL, anchor="middle", color=stroke("accent"), cls="label")

    # The four inputs, each beside the rule that derives it.
    f.heading(tr("your decode_inputs: what this step feeds the model"))
    lb, off = divmod(pos, bs)
    phys = table[lb] if lb < len(table) else "?"
    keys = ("input_id", "position", "context_len", "slot")
    rules = [
        tr("= token_ids[-1]  (the newest token)"),
        tr("= len − 1 = {n} − 1  (positions count from 0)", n=n),
        tr("= len = {n}  (the cache entries attention reads, the new one included)", n=n),
        f"= block_table[{pos} // {bs} = {lb}] · {bs} + {pos} % {bs} = {phys} · {bs} + {off}",
    ]
    inputs = f.matrix(
        [[yours[k]] for k in keys],
        expected=[[want[k]] for k in keys],
        wrong=[[yours[k] != want[k]] for k in keys],
        row_labels=keys,
        w=70,
        gap=6,
    )
    rules_text = f.table([[x] for x in rules], h=CELL + 6, size=LABEL - 0.5, mono=True, color=MUTED)
    f.place(pad(row(inputs, pad(rules_text, top=-3), gap=14), left=30, top=4), after=40)

    # The sequence's blocks in the pool, the new token's slot, and what attention reads.
    def role(i: int) -> Callable[[int, int], str]:  # logical block i's cells
        return lambda _, o: "cached" if i * bs + o < pos else "new" if i * bs + o == pos else "masked"

    blocks = [
        f.matrix(
            [[f"pos {i * bs + o}" if i * bs + o <= pos else "" for o in range(bs)]],
            role=role(i),
            w=66,
            gap=4,
            fmt=str,
            col_labels=[f"slot {b * bs + o}" for o in range(bs)],
        )
        for i, b in enumerate(table)
    ]
    pool = column(
        row(
            *(
                column(grid, pad(f.label(tr("block {b} = block_table[{i}]", b=b, i=i), color=INK), top=30), gap=0, align="center")
                for i, (grid, b) in enumerate(zip(blocks, table))
            ),
            gap=40,
        ),
        f.label(tr("the sequence's blocks in the pool (each cell: the position whose K/V it holds)"), size=LABEL, color=INK, bold=True),
        gap=14,
        align="center",
    )
    f.place(pool, x=(f.width - pool.w) / 2, after=18)
    cells = {b * bs + o: blocks[i].cell_box(0, o) for i, b in enumerate(table) for o in range(bs)}
    # ① The curve from your slot to the cell it names; the right cell is outlined.
    slot = yours["slot"]
    if want["slot"] in cells:
        f.outline(*cells[want["slot"]], inset=-2)
    if slot in cells:
        x, y, w, _ = cells[slot]
        ix, iy, iw, ih = inputs.cell_box(3, 0)
        color = stroke("accent") if slot == want["slot"] else stroke("wrong")
        f.curve(ix + iw / 2, iy + ih, x + w / 2, y - 20, color=color, width=1.3)
        f.text(
            x + w / 2 + 8,
            y - 23,
            tr("① store the new K/V here") if slot == want["slot"] else tr("① yours writes here"),
            size=LABEL_SMALL,
            color=color,
            cls="label",
        )
    # ② What attention reads: the first context_len positions, wherever their blocks are.
    ctx = yours["context_len"]
    for i, grid in enumerate(blocks):
        read = [o for o in range(bs) if i * bs + o < ctx]
        if read:
            x, y, _, h = grid.cell_box(0, read[0])
            f.bracket(x, grid.cell_box(0, read[-1])[0] + grid.cw, y + h + 4, tr("② read by attention: {n}", n=len(read)))
    shown = {"ctx": ctx, "pos": pos, "n": n, "next": n + 1}
    note = (
        tr(
            "Attention reads context_len = {ctx} entries: the {pos} cached ones and the one this step just wrote. The sampler "
            "then draws the token at position {n}; it joins token_ids without K/V, and the next step starts from len = {next}.",
            **shown,
        )
        if ctx == want["context_len"]
        else tr(
            "Attention reads context_len = {ctx} entries (expected {want}): the {pos} cached ones and the one this step just "
            "wrote. The sampler then draws the token at position {n}; it joins token_ids without K/V, and the next step starts "
            "from len = {next}.",
            want=want["context_len"],
            **shown,
        )
    )
    if slot not in cells:
        note += tr(" Your slot {slot} is in none of this sequence's blocks.", slot=slot)
    f.note(note, size=LABEL_SMALL)
    f.y += 10

    examples = r.get("examples")
    if examples:
        f.heading(tr("nano-vllm's examples (block_size 256): your values"))
        cols = ("position", "context_len", "slot")
        bad = [[False, False] + [e["yours"][c] != e["expected"][c] for c in cols] for e in examples]
        grid = f.matrix(
            [[e["len"], str(e["table"])] + [e["yours"][c] for c in cols] for e in examples],
            expected=[[e["len"], str(e["table"])] + [e["expected"][c] for c in cols] for e in examples],
            wrong=bad,
            col_labels=["len", "block_table", *cols],
            w=100,
            h=30,
            gap=8,
            fmt=str,
        )
        derivations = f.table(
            [[f"pos {e['len'] - 1} → block_table[{(e['len'] - 1) // 256}]·256 + {(e['len'] - 1) % 256}"] for e in examples],
            header=[""],
            h=38,
            size=LABEL_SMALL,
            mono=True,
            color=MUTED,
        )
        f.place(pad(row(grid, pad(derivations, top=-4), gap=12), left=20, top=8))  # on the cells' centres
        wrong_any = wrong_any or any(any(b) for b in bad)
    f.legend(
        [
            ("cached", tr("token whose K/V is already in the cache")),
            ("new", tr("the newest token: computed and written this step")),
            ("masked", tr("free slot")),
        ],
        wrong=wrong_any,
    )
