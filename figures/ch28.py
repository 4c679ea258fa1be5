"""Figures of ch28 · cache identity and the logits boundary: one token string under five identities, and the
rows of a flattened batch whose logits are sampled."""

from __future__ import annotations

from typing import Callable

from figures import figure
from figures.kit import Figure
from figures.layout import column, pad, row, wide
from figures.style import INK, LABEL, LABEL_SMALL, MUTED, SMALL, stroke
from grader.i18n import tr


def roles(of_column: list[str]) -> Callable[[int, int], str]:
    """A one-row matrix's roles, column by column."""
    return lambda _, j: of_column[j]


@figure(
    "ch28-cache-identity",
    title="缓存身份不止 token 子串",
    zh="五个请求的 12 个 token 完全相同,但身份不同:换一张图、加 cache_salt 或换 LoRA,都会改变块 hash;"
    "不同身份的请求不能仅因 token 子串相同就共享缓存。",
    en="Cache identity needs more than the tokens: five requests with the same 12 token ids, but another image, "
    "a cache_salt or a LoRA adapter changes the block hashes, so they cannot share KV just because their "
    "tokens match.",
    needs={"rows": "ch28.1"},
)
def identity_figure(f: Figure, r: dict) -> None:
    tokens, bs, rows = r["tokens"], r["block_size"], r["rows"]
    nblocks = len(tokens) // bs
    label_w, block_w, gap = 236, 159, 31
    prefix = lambda h: h[:8] if h else "—"  # noqa: E731  (a hash's first 4 bytes)
    # The tokens, grouped into blocks, the image's placeholders marked.
    f.heading(tr("the same {n} token ids in every request, blocks of {bs}; 99 = image placeholder", n=len(tokens), bs=bs))
    blocks = [
        f.matrix([block], role=roles(["accent" if tok == 99 else "plain" for tok in block]), w=(block_w + 3) / bs - 3, h=26, gap=3)
        for block in (tokens[b * bs : (b + 1) * bs] for b in range(nblocks))
    ]
    f.place(pad(row(*blocks, gap=gap), left=label_w, top=8), after=44)
    for b, block in enumerate(blocks):
        x, y, _, h = block.span_box(0, 0, 0, bs - 1)
        f.bracket(x, x + block.w, y + h + 4, tr("block {b}: tokens {s}–{e}", b=b, s=b * bs, e=(b + 1) * bs - 1), size=SMALL)
    f.heading(tr("each block's hash, first 4 bytes; → the parent chain"))
    f.y += 6
    base = rows[0]["yours"] or rows[0]["expected"]
    for line in rows:
        yours, want = line["yours"], line["expected"]
        names = column(f.label(line["label"], size=LABEL, color=INK, bold=True), f.label(line["what"], size=SMALL), gap=2, align="right")
        hashes = f.matrix(
            [[prefix(yours[b] if b < len(yours) else "") for b in range(nblocks)]],
            expected=[[prefix(h) for h in want]],
            wrong=[line["wrong"]],
            w=block_w,
            h=28,
            gap=gap,
            fmt=str,
            role=lambda _, b: "cached" if b < len(yours) and b < len(base) and yours[b] == base[b] else "new",
        )
        f.place(row(wide(pad(names, left=label_w - 14 - names.w), label_w), hashes, gap=0), after=30)
        for b in range(nblocks):
            x, y, w, h = hashes.cell_box(0, b)
            f.text(
                x + w / 2, y + h + 14, tr("keys: {keys}", keys=line["keys"][b]), anchor="middle", size=SMALL - 1, color=MUTED, cls="note"
            )
            if b:
                f.arrow(x - gap + 1, y + h / 2, x - 2, y + h / 2, color=MUTED, head=5)
    f.y += 6
    f.note(
        tr(
            "A hash covers its block's tokens, its parent's hash and the block's identity keys. Changing the image "
            "changes block 1 (which overlaps it) and block 2 (through the chain), never block 0; the salt enters block 0 "
            "and the adapter every block, so the whole chain changes. Only the repeated request A can share A's blocks."
        ),
        size=LABEL_SMALL,
    )
    f.legend(
        [
            ("cached", tr("same hash as A's block: its K/V can be reused")),
            ("new", tr("another hash: computed again")),
            ("accent", tr("image placeholder token")),
        ],
        wrong=any(any(line["wrong"]) for line in rows),
    )


@figure(
    "ch28-last-token-logits",
    title="最后一个 token 的 logits 边界",
    zh="三个请求压平成 9 行:每个请求只有最后一个被调度的 token 产生被采样的 logits,"
    "logits_indices = cu_seqlens_q[1:] − 1;整段 prompt 都命中时,也要重算最后一整块。"
    "图中块大小取 4 以便寻址;32 token、块大小 16 的例子见正文。",
    en="Which flattened rows produce logits: the last scheduled token of each request, "
    "logits_indices = cu_seqlens_q[1:] − 1; a prompt that is cached entirely still recomputes its whole "
    "last block. Block size 4 here for readable addresses; the 32-token example with block size 16 is in "
    "the text.",
    needs={"indices": "ch28.3", "cached": "ch28.2"},
)
def logits_figure(f: Figure, r: dict) -> None:
    reqs, idx, want, bs, prompt = r["requests"], r["indices"], r["expected"], r["block_size"], r["prompt"]
    cached, cached_want, cached_wrong = r["cached"], r["cached_expected"], r["cached_wrong"]
    lens = [n for *_, n in reqs]
    cu = [sum(lens[:i]) for i in range(len(lens) + 1)]
    hits = prompt // bs
    side = 120  # the labels' column
    # R1's prompt: the prefix hit capped by the last-token rule (from num_cached_tokens_on_hit).
    f.heading(tr("R1: a prompt of {prompt} tokens whose {hits} full blocks of {bs} are all in the cache", prompt=prompt, hits=hits, bs=bs))
    blocks = [
        f.matrix([positions], w=30, h=28, gap=4, role=roles(["cached" if p < cached else "new" for p in positions]))
        for positions in (list(range(b * bs, min((b + 1) * bs, prompt))) for b in range(hits))
    ]
    call = column(
        f.label(f"num_cached_tokens_on_hit({prompt}, {bs}, {hits})", size=LABEL_SMALL, mono=True, color=INK),
        row(
            f.matrix([[cached]], role="cached", expected=[[cached_want]], wrong=[[cached_wrong]], w=60, h=30),
            f.label(f"= min({hits}, ({prompt} − 1) // {bs})·{bs}", size=LABEL_SMALL, mono=True),
            gap=10,
            align="middle",
        ),
        gap=4,
    )
    f.place(
        pad(row(wide(f.label(tr("positions"), size=LABEL), side), *blocks, pad(call, left=14), gap=14, align="bottom"), top=2), after=50
    )
    for b, block in enumerate(blocks):
        x, y, _, h = block.cell_box(0, 0)
        f.bracket(
            x,
            x + block.w,
            y + h + 4,
            tr("block {b}: hit, cached", b=b) if (b + 1) * bs <= cached else tr("block {b}: hit, recomputed", b=b),
            size=SMALL,
        )
    yours = (
        tr(" Yours: {cached} cached, {left} to compute: no row, no logits.", cached=cached, left=prompt - cached)
        if cached >= prompt
        else tr(" Yours: {cached} cached, {left} to compute.", cached=cached, left=prompt - cached)
    )
    f.note(
        tr(
            "The hit is capped at {prompt} − 1 = {capped} tokens so that R1 computes at least its last token, and "
            "hits are whole blocks: {cached} cached, {left} recomputed, the last of them gives R1's first output token.",
            prompt=prompt,
            capped=prompt - 1,
            cached=cached_want,
            left=prompt - cached_want,
        )
        + (yours if cached_wrong else ""),
        size=LABEL_SMALL,
    )
    # The flattened batch.
    f.y += 6
    f.heading(tr("the flattened batch: query_lens {lens}, cu_seqlens_q {cu}", lens=lens, cu=cu))
    f.place(
        pad(
            f.lines(
                *(
                    tr("{name} · {what}: positions {c}–{e}", name=name, what=what, c=c, e=c + n - 1)
                    if n > 1
                    else tr("{name} · {what}: position {c}", name=name, what=what, c=c)
                    for name, what, c, n in reqs
                ),
                size=LABEL_SMALL,
                gap=4,
            ),
            left=12,
        ),
        after=14,
    )
    last = {cu[i + 1] - 1 for i in range(len(reqs))}
    cells = f.matrix(
        [[f"{name} p{c + k}" for name, _, c, n in reqs for k in range(n)]],
        fmt=str,
        w=70,
        h=36,
        gap=7,
        role=lambda _, j: "accent" if j in last else "new",
        col_labels=[tr("row {j}", j=j) for j in range(cu[-1])],
    )
    f.place(row(wide(pad(f.label(tr("rows"), size=LABEL), top=24), side), cells, gap=0), after=30)
    for i, (name, _, _, n) in enumerate(reqs):
        x, y, w, h = cells.span_box(0, cu[i], 0, cu[i + 1] - 1)
        f.bracket(
            x,
            x + w,
            y + h + 6,
            tr("{name}: rows {a}–{e}", name=name, a=cu[i], e=cu[i + 1] - 1) if n > 1 else tr("{name}: row {a}", name=name, a=cu[i]),
            size=SMALL,
        )
    # The logits rows, as the student computed them.
    picked = f.matrix([idx], role="accent", expected=[want], wrong=[r["wrong"]], w=70, h=36, gap=67)
    head = f.chip(tr("→ LM head → sample: {n} candidates", n=len(reqs)), w=250)
    f.place(
        pad(
            row(
                wide(
                    column(
                        f.label("logits_indices", size=LABEL, color=INK, bold=True),
                        f.label("= cu[1:] − 1", size=LABEL_SMALL, mono=True),
                        gap=2,
                    ),
                    side,
                ),
                picked,
                pad(head, left=40),
                gap=0,
                align="middle",
            ),
            top=56,
        ),
        after=40,
    )
    for i, (got, bad) in enumerate(zip(idx, r["wrong"])):
        x, y, w, h = picked.cell_box(0, i)
        f.text(x + w / 2, y + h + 14, f"{reqs[i][0]}: {cu[i + 1]} − 1", anchor="middle", size=SMALL, color=MUTED, mono=True, cls="label")
        if 0 <= got < cu[-1]:
            src_x, src_y, src_w, src_h = cells.cell_box(0, got)
            f.curve(src_x + src_w / 2, src_y + src_h + 28, x + w / 2, y - 4, color=stroke("wrong") if bad else stroke("accent"), width=1.2)
    f.note(
        tr(
            "{inputs} inputs, {n} candidate outputs. R0's chunk ends at position 7 of a 10-token prompt, so its "
            "sample is discarded; R1 and R2 keep theirs.",
            inputs=cu[-1],
            n=len(reqs),
        ),
        size=LABEL_SMALL,
    )
    f.legend(
        [
            ("cached", tr("K/V taken from the prefix cache")),
            ("new", tr("computed in this step")),
            ("accent", tr("the row whose logits are sampled")),
        ],
        wrong=cached_wrong or any(r["wrong"]),
    )
