"""Figures of ch23 · sampling: one row along the sampling path, and the exponential race."""

from __future__ import annotations

import math

from figures import figure
from figures.kit import Figure, num, text_width
from figures.style import CELL, INK, LABEL, MARGIN, MUTED, RULE, SMALL, VALUE, fill, stroke

NEG_INF = float("-inf")


def _same(a: float, b: float, rtol: float = 1e-5, atol: float = 1e-6) -> bool:
    if a == b:
        return True
    if not (math.isfinite(a) and math.isfinite(b)):
        return False
    return abs(a - b) <= atol + rtol * abs(b)


def _p3(x) -> str:
    """Probabilities and scores with 3 decimals (4 significant digits for small ones)."""
    if isinstance(x, str):
        return x
    if isinstance(x, float) and math.isinf(x):
        return num(x)
    if x == 0:
        return "0"
    return f"{x:.3f}" if abs(x) >= 0.01 else f"{x:.2g}"


def _n4(x) -> str:
    return num(x, 4)


def _instance(f: Figure, items: list[tuple[str, str]]) -> None:
    """The instance as a row of small labelled boxes."""
    x, y = MARGIN, f.y
    for role, label in items:
        w = text_width(label, LABEL, mono=True) + 22
        f.box(x, y, w, 28, role=role, label=label, mono=True)
        x += w + 10
    f.y = y + 28 + 30


def _row(f: Figure, y: float, left: float, col_w: float, label: str, values: list, *, expected: list | None = None,
         role=lambda i, v: "token", fmt=num, bold: bool = False, sub: str = "") -> None:
    """One labelled row of cells; a value that differs from `expected` is marked wrong."""
    f.text(left - 12, y + (CELL / 2 + 4 if not sub else CELL / 2 - 2), label, anchor="end", size=LABEL,
           cls="label", color=INK if bold else MUTED, weight="bold" if bold else "normal")
    if sub:
        f.text(left - 12, y + CELL / 2 + 11, sub, anchor="end", size=SMALL, cls="label", color=MUTED)
    for i, v in enumerate(values):
        want = expected[i] if expected is not None else v
        bad = expected is not None and not _same(v, want)
        f.cell(left + i * col_w, y, "" if v is None else v, role=role(i, v), w=col_w - 6, h=CELL, wrong=bad,
               expected=want if bad else None, fmt=fmt, bold=bold)


@figure("ch23-sampling-path", title="生成采样的概念路径",
        zh="一行 8 个 logits 依次经过:除以温度 T = 0.8 → top-k(k = 5)→ top-p(p = 0.8)→ softmax → "
           "指数竞赛抽出一个 token。被过滤的位置变成 −∞(灰色),概率恰为 0。top-k/top-p 是概念扩展,"
           "按 vLLM v1 的写法;当前 nano-vllm 只实现温度采样。",
        en="The sampling path of one row of 8 logits: divide by T = 0.8, top-k (k = 5), top-p (p = 0.8), softmax, "
           "then the exponential race draws one token. Filtered entries become −∞ (grey) and get probability "
           "exactly 0. Top-k/top-p are extensions written as in vLLM v1; nano-vllm implements temperature only.",
        needs={"topp": "ch23.1"})
def sampling_path(f: Figure, r: dict) -> None:
    logits, T, k, p = r["logits"], r["T"], r["k"], r["p"]
    V = len(logits)
    has_draw = "token" in r
    _instance(f, [("plain", f"logits z: {V} tokens"), ("token", f"T = {num(T)}"), ("token", f"top_k = {k}"),
                  ("token", f"top_p = {num(p)}")] + ([("plain", "noise E ~ Exp(1)")] if has_draw else []))

    kth = sorted(r["scaled_expected"], reverse=True)[k - 1]
    col_w, label_w = 68, 300
    left = MARGIN + label_w
    kept = lambda i, v: "token" if v is not None and v != NEG_INF else "masked"
    f.heading("每一步都是一行 · one row per step; ①②③ are your process_logits, ④ your row's softmax")
    f.y += 4
    for i in range(V):
        f.text(left + i * col_w + (col_w - 6) / 2, f.y + 8, f"token {i}", anchor="middle", size=SMALL + 0.5,
               color=MUTED, cls="label")
    y = f.y + 16
    step = CELL + 8
    rows = [
        ("logits z", "", r["logits"], None, lambda i, v: "plain", _n4, False),
        (f"① z / T = z / {num(T)}", "process_logits(z, T)", r["scaled"], r["scaled_expected"], kept, _n4, True),
        (f"② top-k = {k}: keep ≥ {num(kth)}", f"the {k}th largest of ①; + top_k", r["topk"], r["topk_expected"],
         kept, _n4, True),
        ("q = softmax(②)", "probabilities after top-k", [v if v > 0 else None for v in r["q"]], None,
         lambda i, v: "plain" if v is not None else "masked", _p3, False),
        ("mass of larger tokens", f"top-p keeps a token if < {num(p)}",
         [None if v == NEG_INF else v for v in r["above"]], None,
         lambda i, v: "masked" if v is None or v >= p else "plain", _p3, False),
        (f"③ top-p = {num(p)}", "+ top_p", r["topp"], r["topp_expected"], kept, _n4, True),
        ("④ p = softmax(③)", "the distribution sampled", r["probs"], r["probs_expected"],
         lambda i, v: "token" if v > 0 else "masked", _p3, True),
    ]
    for label, sub, values, expected, role, fmt, bold in rows:
        _row(f, y, left, col_w, label, values, expected=expected, role=role, fmt=fmt, bold=bold, sub=sub)
        y += step
    f.y = y
    if has_draw:
        scores, noise, token, want = r["race_scores"], r["noise"], r["token"], r["token_expected"]
        _row(f, y, left, col_w, "noise E", noise, role=lambda i, v: "plain", fmt=num)
        y += step
        _row(f, y, left, col_w, "⑤ p / E", scores, sub="the race: the largest wins",
             role=lambda i, v: "accent" if i == want else ("plain" if v > 0 else "masked"), fmt=_p3, bold=True)
        wx = left + want * col_w + (col_w - 6) / 2
        y += CELL + 16
        f.arrow(wx, y - 14, wx, y + 6, color=stroke("accent"), width=1.6)
        label = f"sample(③, T = 1, E) → token {token}"
        w = text_width(label, VALUE, mono=True) + 28
        f.cell(wx - w / 2, y + 8, label if token == want else f"token {token}", role="accent", w=w, h=CELL,
               wrong=token != want, expected=f"token {want}", fmt=str, bold=True)
        note = (f"p / E of token {want}: {_p3(r['race_p'][want])} / {num(noise[want])} = {_p3(scores[want])}; "
                f"a filtered token has p = 0 and cannot win, whatever its noise.")
        f.y = y + 8 + CELL + 24
        f.note(note, size=SMALL + 1)
        f.y += 6
    else:
        f.y += 6
        f.note("⑤ the race (p / E and the drawn token) is drawn once ch23.2 passes.", size=SMALL + 1)
    wrong = any(not _same(a, b) for key in ("scaled", "topk", "topp", "probs")
                for a, b in zip(r[key], r[key + "_expected"])) or (has_draw and r["token"] != r["token_expected"])
    f.legend([("token", "kept: z / T"), ("masked", "filtered: −∞, probability 0"),
              ("plain", "inputs and derivations"), ("accent", "the race's winner")], wrong=wrong)


@figure("ch23-exponential-race", title="本地 sampler 的指数竞赛",
        zh="指数竞赛:给每个 token 抽一个 E ~ Exp(1),取 argmax(p / E) = argmin(E / p),而不是 argmax(p)。"
           "logits [2, 1, 0]、T = 0.5 时 token 0 的 p 最大(0.867),但噪声 E = [3.0, 0.05, 1.0] 让 token 1 胜出;"
           "重复多次竞赛,每个 token 胜出的频率就是它的概率 p。",
        en="The exponential race: draw E ~ Exp(1) per token and take argmax(p / E) = argmin(E / p), not argmax(p). "
           "With logits [2, 1, 0] and T = 0.5, token 0 has the largest p (0.867), but the noise [3.0, 0.05, 1.0] "
           "makes token 1 win; over many races each token wins exactly as often as its probability p.",
        needs={"token": "ch23.2"})
def exponential_race(f: Figure, r: dict) -> None:
    logits, T, noise, p, scores = r["logits"], r["T"], r["noise"], r["p"], r["scores"]
    token, want = r["token"], r["token_expected"]
    V = len(logits)
    _instance(f, [("plain", f"logits z = [{', '.join(num(x) for x in logits)}]"), ("token", f"T = {num(T)}"),
                  ("plain", f"noise E = [{', '.join(num(x) for x in noise)}]")])

    # The derivation, one column per token.
    f.heading("逐 token 推导 · per token")
    col_w, label_w = 120, 250
    left = MARGIN + label_w
    for i in range(V):
        f.text(left + i * col_w + (col_w - 6) / 2, f.y + 8, f"token {i}", anchor="middle", size=SMALL + 1,
               color=MUTED, cls="label")
    y, step = f.y + 16, CELL + 8
    top_p = max(range(V), key=lambda i: p[i])
    rows = [("logits z", "", logits, lambda i, v: "plain", num),
            (f"z / T = z / {num(T)}", "", [x / T for x in logits], lambda i, v: "plain", num),
            ("p = softmax(z / T)", f"argmax p = token {top_p}", p,
             lambda i, v: "token" if i == top_p else "plain", lambda v: f"{v:.6f}"),
            ("E ~ Exp(1)", "the noise", noise, lambda i, v: "plain", num),
            ("p / E", "the race: largest wins", scores, lambda i, v: "accent" if i == want else "plain",
             lambda v: f"{v:.6f}")]
    for label, sub, values, role, fmt in rows:
        _row(f, y, left, col_w, label, values, role=role, fmt=fmt, bold=label == "p / E", sub=sub)
        y += step
    label = f"sample(z, T, E) → token {token}"
    w = text_width(label, VALUE, mono=True) + 28
    f.text(left - 12, y + CELL / 2 + 4, "your sample", anchor="end", size=LABEL, weight="bold", cls="label")
    f.cell(left, y, label if token == want else f"token {token}", role="accent", w=w, h=CELL, wrong=token != want,
           expected=f"token {want}", fmt=str, bold=True)
    f.text(left + w + 12, y + CELL / 2 + 4,
           f"p_{want} / E_{want} = {p[want]:.6f} / {num(noise[want])} = {scores[want]:.6f} is the largest",
           size=SMALL + 1, color=MUTED, cls="note")
    f.y = y + CELL + 30

    # Two bar panels: p and p / E.
    f.heading("argmax p 与 argmax p / E 不是一回事 · the race is not argmax p")
    f.y += 8
    half = (f.width - 2 * MARGIN) / 2
    bar_w, gap = 56, 22
    panel_w = V * (bar_w + gap) - gap
    for j, (title, values, roles) in enumerate([
            (f"p: the most likely token is {top_p}", p, ["token" if i == top_p else "plain" for i in range(V)]),
            (f"p / E: token {token} {'wins (yours)' if token == want else '(yours)'}", scores,
             ["accent" if i == want else "plain" for i in range(V)])]):
        x0 = MARGIN + j * half + (half - panel_w) / 2
        f.text(x0 + panel_w / 2, f.y + 4, title, anchor="middle", size=LABEL, cls="label",
               color=stroke("wrong") if j == 1 and token != want else INK)
        f.bars(x0, f.y + 30, values, labels=[f"token {i}" for i in range(V)], height=110, bar_w=bar_w, gap=gap,
               role=roles, fmt=lambda v: f"{v:.3f}")
        if j == 1 and token != want and 0 <= token < V:
            f.text(x0 + token * (bar_w + gap) + bar_w / 2, f.y + 30 + 110 + 30, "▲ yours", anchor="middle",
                   size=SMALL + 1, color=stroke("wrong"), weight="bold", cls="label wrong-pick")
    f.y += 30 + 110 + 58

    # Many races: the empirical frequencies against p.
    if "counts" in r:
        _race_frequencies(f, r["counts"], r["n"], p, r["chi2"], r["limit"])
    else:
        f.note("The panel of many races is drawn once the check of many races passes its shape check.",
               size=SMALL + 1)
    f.legend([("token", "argmax p / how often a token won"), ("accent", "the race's winner"),
              ("plain", "p and other values")], wrong=token != want or ("counts" in r and r["chi2"] > r["limit"]))


def race_intervals(p: list[float], n: int, limit: float) -> list[float]:
    """Half-width of each token's interval for its share of n races: √(limit · p(1 − p) / n).

    It is the chi-square test's own bound, token by token: Σ (count − N·p)² / (N·p) ≤ limit allows
    one token's count at most √limit standard deviations √(N·p·(1 − p)) from N·p, so a share
    outside p ± this half-width fails the test on its own (and in a passing run every share is
    inside its interval)."""
    return [math.sqrt(limit * pi * (1 - pi) / n) for pi in p]


def race_outliers(counts: list[int], n: int, p: list[float], chi2: float, limit: float) -> list[int]:
    """The tokens the figure marks: those whose share is outside its interval, or, when the test
    fails with every share inside, the token furthest off in standard deviations."""
    if chi2 <= limit:
        return []
    half = race_intervals(p, n, limit)
    out = [i for i, (c, pi, h) in enumerate(zip(counts, p, half)) if abs(c / n - pi) > h]
    if out:
        return out
    sd = [math.sqrt(pi * (1 - pi) / n) for pi in p]
    return [max(range(len(p)), key=lambda i: abs(counts[i] / n - p[i]) / sd[i] if sd[i] > 0 else 0.0)]


def _race_frequencies(f: Figure, counts: list[int], n: int, p: list[float], chi2: float, limit: float) -> None:
    """Per token: the bar of p, the bar of how often it won, and on the latter the interval the
    chi-square test allows it; a share outside it is marked wrong (yours struck, expected below)."""
    V = len(p)
    freq = [c / n for c in counts]
    half = race_intervals(p, n, limit)
    marked = race_outliers(counts, n, p, chi2, limit)
    ok = chi2 <= limit
    f.heading(f"{n} 次竞赛(固定种子)· {n} races from a fixed seed: how often each token won, against p")
    f.y += 8
    bw, g, group_gap, height = 52, 24, 100, 110
    total = V * (2 * bw + g) + (V - 1) * group_gap
    x0 = MARGIN + (f.width - 2 * MARGIN - total) / 2
    top = max([pi + h for pi, h in zip(p, half)] + freq + [1e-12])
    base = f.y + (44 if marked else 30) + height
    ys = lambda v: base - height * max(v, 0) / top
    for i in range(V):
        gx = x0 + i * (2 * bw + g + group_gap)
        wx = gx + bw + g
        bad = i in marked
        # p
        f.dwg.add(f.dwg.rect((gx, ys(p[i])), (bw, base - ys(p[i])), fill=fill("plain"), stroke=stroke("plain"),
                             stroke_width=1, class_="bar"))
        f.text(gx + bw / 2, ys(p[i]) - 5, f"{p[i]:.3f}", size=SMALL, anchor="middle", mono=True, cls="value")
        # how often it won; where it should be (dashed) when it is marked
        if bad:
            outline = f.dwg.rect((wx, ys(p[i])), (bw, base - ys(p[i])), fill="none", stroke=INK, stroke_width=1,
                                 class_="expected-bar")
            outline["stroke-dasharray"] = "3,2"
            f.dwg.add(outline)
        f.dwg.add(f.dwg.rect((wx, ys(freq[i])), (bw, base - ys(freq[i])),
                             fill="url(#hatch-wrong)" if bad else fill("token"),
                             stroke=stroke("wrong") if bad else stroke("token"), stroke_width=1.5 if bad else 1,
                             class_="bar won wrong" if bad else "bar won"))
        # the interval the test allows: a whisker from p − h to p + h across the won bar
        lo, hi, cx = ys(max(p[i] - half[i], 0)), ys(p[i] + half[i]), wx + bw / 2
        f.dwg.add(f.dwg.line((cx, lo), (cx, hi), stroke=INK, stroke_width=1.2, class_="interval"))
        for yy in (lo, hi):
            f.dwg.add(f.dwg.line((cx - 9, yy), (cx + 9, yy), stroke=INK, stroke_width=1.2, class_="interval"))
        label_y = min(ys(freq[i]), hi) - 5
        if bad:
            f.text(cx, label_y - 13, f"{freq[i]:.3f}", size=SMALL, anchor="middle", mono=True, color=stroke("wrong"),
                   cls="value wrong", strike=True)
            f.text(cx, label_y, f"{p[i]:.3f} ± {half[i]:.3f}", size=SMALL, anchor="middle", mono=True, weight="bold",
                   cls="expected")
        else:
            f.text(cx, label_y, f"{freq[i]:.3f}", size=SMALL, anchor="middle", mono=True, cls="value")
        for x, label in ((gx, "p"), (wx, "won")):
            f.text(x + bw / 2, base + 15, label, size=SMALL + 0.5, anchor="middle", color=MUTED, cls="label")
        f.text(wx - g / 2, base + 32, f"token {i}: {counts[i]} of {n}", anchor="middle", size=SMALL + 1, color=INK,
               cls="label")
    f.dwg.add(f.dwg.line((x0 - 4, base), (x0 + total + 4, base), stroke=RULE, stroke_width=1))
    f.y = base + 56
    verdict = "≤" if ok else ">"
    text = (f"chi-square = Σ (count − N·p)² / (N·p) = {chi2:.2f} {verdict} {limit:.1f} (a correct sampler exceeds "
            f"{limit:.1f} with probability < 1e-6; {V - 1} degrees of freedom). The whisker on each won bar is "
            f"p ± √({limit:.1f} · p(1 − p) / N): a share outside it alone exceeds the limit")
    if not ok:
        off = [i for i in marked if abs(freq[i] - p[i]) > half[i]]
        names = _tokens_phrase(marked)
        one = len(marked) == 1
        text += (f"; {names} {'is' if one else 'are'} outside {'its interval' if one else 'their intervals'}" if off
                 else f"; every share is inside its interval, but together they exceed it: {names} is furthest off")
    f.note(text + ".", size=SMALL + 1, color=MUTED if ok else stroke("wrong"))


def _tokens_phrase(tokens: list[int]) -> str:
    """"token 2", "tokens 0 and 2", "tokens 0, 1 and 2"."""
    if len(tokens) == 1:
        return f"token {tokens[0]}"
    return "tokens " + ", ".join(map(str, tokens[:-1])) + f" and {tokens[-1]}"
