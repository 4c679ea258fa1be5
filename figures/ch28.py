"""Figures of ch28 · cache identity and the logits boundary: one token string under five identities, and the
rows of a flattened batch whose logits are sampled."""

from __future__ import annotations

from figures import figure
from figures.kit import Figure
from figures.style import LABEL, MARGIN, MUTED, SMALL, stroke


def _short(h: str) -> str:
    return h[:8] if h else "—"


@figure("ch28-cache-identity", title="缓存身份不止 token 子串",
        zh="五个请求的 12 个 token 完全相同,但身份不同:换一张图、加 cache_salt 或换 LoRA,都会改变块 hash;"
           "不同身份的请求不能仅因 token 子串相同就共享缓存。",
        en="Cache identity needs more than the tokens: five requests with the same 12 token ids, but another image, "
           "a cache_salt or a LoRA adapter changes the block hashes, so they cannot share KV just because their "
           "tokens match.",
        needs={"rows": "ch28.1"})
def identity_figure(f: Figure, r: dict) -> None:
    tokens, bs, rows = r["tokens"], r["block_size"], r["rows"]
    nblocks = len(tokens) // bs
    label_w, cw, gap = 236, 168, 22
    left = MARGIN + label_w
    # The tokens, grouped into blocks, the image's placeholders marked.
    f.heading(f"同一串 token · the same {len(tokens)} token ids in every request, blocks of {bs}; "
              "99 = image placeholder")
    ty = f.y + 8
    tw = (cw - 6) / bs
    for i, tok in enumerate(tokens):
        b, o = divmod(i, bs)
        x = left + b * (cw + gap) + o * tw
        f.cell(x, ty, tok, role="accent" if tok == 99 else "plain", w=tw - 3, h=26, size=SMALL + 1)
    for b in range(nblocks):
        x = left + b * (cw + gap)
        f.bracket(x, x + cw - 9, ty + 30, f"block {b}: tokens {b * bs}–{(b + 1) * bs - 1}", size=SMALL)
    f.y = ty + 74
    f.heading("每个块的 hash(前 4 字节)· each block's hash, first 4 bytes; → the parent chain")
    base = rows[0]["yours"] or rows[0]["expected"]
    y = f.y + 6
    wrong = False
    for row in rows:
        yours, want = row["yours"], row["expected"]
        f.text(left - 14, y + 17, row["label"], anchor="end", size=LABEL, weight="bold", cls="label")
        f.text(left - 14, y + 33, row["what"], anchor="end", size=SMALL, color=MUTED, cls="label")
        for b in range(nblocks):
            x = left + b * (cw + gap)
            got = yours[b] if b < len(yours) else ""
            bad = got != want[b]
            wrong |= bad
            same = got == (base[b] if b < len(base) else None)
            f.cell(x, y, _short(got), role="cached" if same else "new", w=cw - 9, h=28, fmt=str, wrong=bad,
                   expected=_short(want[b]) if bad else None)
            f.text(x + (cw - 9) / 2, y + 42, "keys: " + row["keys"][b], anchor="middle", size=SMALL - 1,
                   color=MUTED, cls="note")
            if b:
                f.arrow(x - gap + 1, y + 14, x - 2, y + 14, color=MUTED, head=5)
        y += 58
    f.y = y + 6
    f.note("A hash covers its block's tokens, its parent's hash and the block's identity keys. Changing the image "
           "changes block 1 (which overlaps it) and block 2 (through the chain), never block 0; the salt enters block 0 "
           "and the adapter every block, so the whole chain changes. Only the repeated request A can share A's blocks.",
           size=SMALL + 1)
    f.legend([("cached", "same hash as A's block: its K/V can be reused"),
              ("new", "another hash: computed again"), ("accent", "image placeholder token")], wrong=wrong)


@figure("ch28-last-token-logits", title="最后一个 token 的 logits 边界",
        zh="三个请求压平成 9 行:每个请求只有最后一个被调度的 token 产生被采样的 logits,"
           "logits_indices = cu_seqlens_q[1:] − 1;整段 prompt 都命中时,也要重算最后一整块。"
           "图中块大小取 4 以便寻址;32 token、块大小 16 的例子见正文。",
        en="Which flattened rows produce logits: the last scheduled token of each request, "
           "logits_indices = cu_seqlens_q[1:] − 1; a prompt that is cached entirely still recomputes its whole "
           "last block. Block size 4 here for readable addresses; the 32-token example with block size 16 is in "
           "the text.",
        needs={"indices": "ch28.3", "cached": "ch28.2"})
def logits_figure(f: Figure, r: dict) -> None:
    reqs, idx, want, bs, prompt = r["requests"], r["indices"], r["expected"], r["block_size"], r["prompt"]
    cached, cached_want = r["cached"], r["cached_expected"]
    lens = [n for *_, n in reqs]
    cu = [sum(lens[:i]) for i in range(len(lens) + 1)]
    hits = prompt // bs
    # R1's prompt: the prefix hit capped by the last-token rule (from num_cached_tokens_on_hit).
    f.heading(f"R1 的前缀命中 · R1: a prompt of {prompt} tokens whose {hits} full blocks of {bs} are all in the cache")
    y, cw = f.y + 8, 34
    for p in range(prompt):
        b, o = divmod(p, bs)
        x = MARGIN + 120 + p * cw + b * 14
        f.cell(x, y, p, role="cached" if p < cached else "new", w=cw - 4, h=28, size=SMALL + 1)
        if o == 0:
            f.bracket(x, x + min(bs, prompt - p) * cw - 4, y + 32,
                      f"block {b}: hit, " + ("cached" if (b + 1) * bs <= cached else "recomputed"), size=SMALL)
    f.text(MARGIN, y + 19, "positions", size=LABEL, color=MUTED, cls="label")
    bad = cached != cached_want
    cx = MARGIN + 120 + prompt * cw + (hits - 1) * 14 + 28
    f.text(cx, y + 8, f"num_cached_tokens_on_hit({prompt}, {bs}, {hits})", size=SMALL + 1, mono=True, cls="label")
    f.cell(cx, y + 16, cached, role="cached", w=60, h=30, wrong=bad, expected=cached_want if bad else None, bold=True)
    f.text(cx + 70, y + 36, f"= min({hits}, ({prompt} − 1) // {bs})·{bs}", size=SMALL + 1, mono=True, color=MUTED,
           cls="label")
    f.y = y + 72
    yours = f" Yours: {cached} cached, {prompt - cached} to compute" + (": no row, no logits." if cached >= prompt else ".")
    f.note(f"The hit is capped at {prompt} − 1 = {prompt - 1} tokens so that R1 computes at least its last token, and "
           f"hits are whole blocks: {cached_want} cached, {prompt - cached_want} recomputed, the last of them gives "
           "R1's first output token." + (yours if bad else ""), size=SMALL + 1)
    # The flattened batch.
    f.y += 6
    f.heading(f"压平的批 · the flattened batch: query_lens {lens}, cu_seqlens_q {cu}")
    for name, what, c, n in reqs:
        f.y += 2
        f.text(MARGIN + 12, f.y + 4, f"{name} · {what}: positions {c}–{c + n - 1}" if n > 1 else
               f"{name} · {what}: position {c}", size=SMALL + 1, color=MUTED, cls="note")
        f.y += 16
    rw, x0 = 77, MARGIN + 120
    y = f.y + 26
    f.text(MARGIN, y + 24, "rows", size=LABEL, color=MUTED, cls="label")
    centers = []
    for r_i, (name, what, c, n) in enumerate(reqs):
        for k in range(n):
            row = cu[r_i] + k
            x = x0 + row * rw
            last = k == n - 1
            f.cell(x, y, f"{name} p{c + k}", role="accent" if last else "new", w=rw - 7, h=36, fmt=str,
                   size=SMALL + 1, bold=last)
            f.text(x + (rw - 7) / 2, y - 6, f"row {row}", anchor="middle", size=SMALL, color=MUTED, cls="label")
            centers.append(x + (rw - 7) / 2)
        xa, xb = x0 + cu[r_i] * rw, x0 + cu[r_i + 1] * rw - 7
        f.bracket(xa, xb, y + 42, f"{name}: rows {cu[r_i]}–{cu[r_i + 1] - 1}" if n > 1 else f"{name}: row {cu[r_i]}",
                  size=SMALL)
    # The logits rows, as the student computed them.
    ly = y + 108
    f.text(MARGIN, ly + 22, "logits_indices", size=LABEL, weight="bold", cls="label")
    f.text(MARGIN, ly + 38, "= cu[1:] − 1", size=SMALL + 1, color=MUTED, mono=True, cls="label")
    wrong = bad
    for r_i, (got, exp) in enumerate(zip(idx, want)):
        x = x0 + r_i * (rw + 60)
        miss = got != exp
        wrong |= miss
        f.cell(x, ly, got, role="accent", w=rw - 7, h=36, wrong=miss, expected=exp if miss else None, bold=True)
        f.text(x + (rw - 7) / 2, ly + 50, f"{reqs[r_i][0]}: {cu[r_i + 1]} − 1", anchor="middle", size=SMALL,
               color=MUTED, mono=True, cls="label")
        if 0 <= got < len(centers):
            f.curve(centers[got], y + 64, x + (rw - 7) / 2, ly - 4,
                    color=stroke("accent") if not miss else stroke("wrong"), width=1.2)
    sx = x0 + 3 * (rw + 60) + 10
    f.box(sx, ly, f.width - MARGIN - sx, 36, role="plain", label=f"→ LM head → sample: {len(reqs)} candidates",
          size=SMALL + 1)
    f.y = ly + 72
    f.note(f"{cu[-1]} inputs, {len(reqs)} candidate outputs. R0's chunk ends at position 7 of a 10-token prompt, so its "
           "sample is discarded; R1 and R2 keep theirs.", size=SMALL + 1)
    f.legend([("cached", "K/V taken from the prefix cache"), ("new", "computed in this step"),
              ("accent", "the row whose logits are sampled")], wrong=wrong)
