"""Figures of ch23 · sampling: one row along the sampling path, and the exponential race."""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

from figures import figure
from figures.kit import Figure, Grid, num, text_width
from figures.layout import Part, column, pad, row, wide
from figures.style import CELL, INK, LABEL, LABEL_SMALL, MARGIN, MUTED, RULE, SMALL, VALUE, fill, stroke
from grader.i18n import tr

NEG_INF = float("-inf")


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


def _step(
    f: Figure,
    label_w: float,
    label: str,
    sub: str,
    values: Sequence[Any],
    *,
    col_w: float,
    bold: bool = False,
    tokens: bool = False,
    **cells: Any,
) -> tuple[Part, Grid]:
    """One step of a derivation: its name (and what it is, below) right-aligned in `label_w`, then one cell per
    token (`cells`: the matrix's role, expected, wrong and fmt, for this one row); `tokens` labels the columns."""
    grid = f.matrix([values], w=col_w - 6, gap=6, col_labels=[f"token {i}" for i in range(len(values))] if tokens else None, **cells)
    text = column(
        f.label(label, size=LABEL, color=INK if bold else MUTED, bold=bold), f.label(sub, size=SMALL) if sub else None, gap=0, align="right"
    )
    return row(pad(text, left=label_w - text.w, top=grid.label_h + (CELL - text.h) / 2), grid, gap=12), grid


def _row(
    values: Sequence[Any],
    wrong: Sequence[bool] | None = None,
    role: Callable[[int, Any], str] | None = None,
    expected: Sequence[Any] | None = None,
) -> dict:
    """The matrix arguments of one row of cells: the check's verdict per cell (`wrong`), and a role per token."""
    cells: dict[str, Any] = {"role": (lambda _, j: role(j, values[j])) if role else "plain"}
    if wrong is not None:
        cells.update(expected=[expected], wrong=[wrong])
    return cells


# -- ch23.1 -------------------------------------------------------------------------------------------


@figure(
    "ch23-sampling-path",
    title="生成采样的概念路径",
    zh="一行 8 个 logits 依次经过:除以温度 T = 0.8 → top-k(k = 5)→ top-p(p = 0.8)→ softmax → "
    "指数竞赛抽出一个 token。被过滤的位置变成 −∞(灰色),概率恰为 0。top-k/top-p 是概念扩展,"
    "按 vLLM v1 的写法;当前 nano-vllm 只实现温度采样。",
    en="The sampling path of one row of 8 logits: divide by T = 0.8, top-k (k = 5), top-p (p = 0.8), softmax, "
    "then the exponential race draws one token. Filtered entries become −∞ (grey) and get probability "
    "exactly 0. Top-k/top-p are extensions, written as vLLM's sort-based apply_top_k_top_p_pytorch does "
    "them; nano-vllm implements temperature only.",
    needs={"topp": "ch23.1"},
)
def sampling_path(f: Figure, r: dict) -> None:
    logits, T, k, p = r["logits"], r["T"], r["k"], r["p"]
    V = len(logits)
    has_draw = "token" in r
    f.instance_row(
        [(tr("logits z: {V} tokens", V=V), "plain"), (f"T = {num(T)}", "token"), (f"top_k = {k}", "token"), (f"top_p = {num(p)}", "token")]
        + ([(tr("noise E ~ Exp(1)"), "plain")] if has_draw else []),
        mono=True,
    )

    kth = sorted(r["scaled_expected"], reverse=True)[k - 1]
    kept = lambda i, v: "token" if v is not None and v != NEG_INF else "masked"
    step = lambda *a, **kw: _step(f, 290, *a, col_w=68, **kw)[0]
    f.heading(tr("one row per step; ①②③ are your process_logits, ④ your row's softmax"))
    q = [v if v > 0 else None for v in r["q"]]
    above = [None if v == NEG_INF else v for v in r["above"]]
    steps = [
        step("logits z", "", logits, fmt=_n4, tokens=True, **_row(logits)),
        step(
            f"① z / T = z / {num(T)}",
            "process_logits(z, T)",
            r["scaled"],
            bold=True,
            fmt=_n4,
            **_row(r["scaled"], r["scaled_wrong"], kept, r["scaled_expected"]),
        ),
        step(
            tr("② top-k = {k}: keep ≥ {kth}", k=k, kth=num(kth)),
            tr("the {k}th largest of ①; + top_k", k=k),
            r["topk"],
            bold=True,
            fmt=_n4,
            **_row(r["topk"], r["topk_wrong"], kept, r["topk_expected"]),
        ),
        step(
            "q = softmax(②)",
            tr("probabilities after top-k"),
            q,
            fmt=_p3,
            **_row(q, role=lambda i, v: "plain" if v is not None else "masked"),
        ),
        step(
            tr("mass of larger tokens"),
            tr("top-p keeps a token if < {p}", p=num(p)),
            above,
            fmt=_p3,
            **_row(above, role=lambda i, v: "masked" if v is None or v >= p else "plain"),
        ),
        step(f"③ top-p = {num(p)}", "+ top_p", r["topp"], bold=True, fmt=_n4, **_row(r["topp"], r["topp_wrong"], kept, r["topp_expected"])),
        step(
            "④ p = softmax(③)",
            tr("the distribution sampled"),
            r["probs"],
            bold=True,
            fmt=_p3,
            **_row(r["probs"], r["probs_wrong"], lambda i, v: "token" if v > 0 else "masked", r["probs_expected"]),
        ),
    ]
    wrong = any(any(r[f"{key}_wrong"]) for key in ("scaled", "topk", "topp", "probs"))
    if not has_draw:
        f.place(column(*steps, gap=8), after=6)
        f.note(tr("⑤ the race (p / E and the drawn token) is drawn once ch23.2 passes."), size=LABEL_SMALL)
    else:
        scores, noise, token, want = r["race_scores"], r["noise"], r["token"], r["token_expected"]
        race, race_grid = _step(
            f,
            290,
            "⑤ p / E",
            tr("the race: the largest wins"),
            scores,
            col_w=68,
            bold=True,
            fmt=_p3,
            **_row(scores, role=lambda i, v: "accent" if i == want else "plain" if v > 0 else "masked"),
        )
        f.place(column(*steps, step(tr("noise E"), "", noise, fmt=num, **_row(noise)), race, gap=8), after=28)
        # The winner, drawn below its column: yours, struck through where it is not the race's.
        x, y, w, h = race_grid.cell_box(0, want)
        label = f"sample(③, T = 1, E) → token {token}" if token == want else f"token {token}"
        drawn = f.matrix(
            [[label]],
            expected=[[f"token {want}"]],
            wrong=[[token != want]],
            fmt=str,
            role="accent",
            w=text_width(f"sample(③, T = 1, E) → token {want}", VALUE, mono=True) + 28,
        )
        f.arrow(x + w / 2, y + h + 4, x + w / 2, f.y - 2, color=stroke("accent"), width=1.6)
        f.place(drawn, x=min(x + w / 2 - drawn.w / 2, f.width - MARGIN - drawn.w), after=24)
        wrong = wrong or token != want
        f.note(
            tr(
                "p / E of token {token}: {p} / {e} = {score}; a filtered token has p = 0 and cannot win, whatever its noise.",
                token=want,
                p=_p3(r["race_p"][want]),
                e=num(noise[want]),
                score=_p3(scores[want]),
            ),
            size=LABEL_SMALL,
        )
    f.y += 6
    f.legend(
        [
            ("token", tr("kept: z / T")),
            ("masked", tr("filtered: −∞, probability 0")),
            ("plain", tr("inputs and derivations")),
            ("accent", tr("the race's winner")),
        ],
        wrong=wrong,
    )


# -- ch23.2 -------------------------------------------------------------------------------------------


@figure(
    "ch23-exponential-race",
    title="本地 sampler 的指数竞赛",
    zh="指数竞赛:给每个 token 抽一个 E ~ Exp(1),取 argmax(p / E) = argmin(E / p),而不是 argmax(p)。"
    "logits [2, 1, 0]、T = 0.5 时 token 0 的 p 最大(0.867),但噪声 E = [3.0, 0.05, 1.0] 让 token 1 胜出;"
    "重复多次竞赛,每个 token 胜出的频率就是它的概率 p。",
    en="The exponential race: draw E ~ Exp(1) per token and take argmax(p / E) = argmin(E / p), not argmax(p). "
    "With logits [2, 1, 0] and T = 0.5, token 0 has the largest p (0.867), but the noise [3.0, 0.05, 1.0] "
    "makes token 1 win; over many races each token wins exactly as often as its probability p.",
    needs={"token": "ch23.2"},
)
def exponential_race(f: Figure, r: dict) -> None:
    logits, T, noise, p, scores = r["logits"], r["T"], r["noise"], r["p"], r["scores"]
    token, want = r["token"], r["token_expected"]
    V = len(logits)
    f.instance_row(
        [
            (f"logits z = [{', '.join(num(x) for x in logits)}]", "plain"),
            (f"T = {num(T)}", "token"),
            (tr("noise E = {values}", values="[" + ", ".join(num(x) for x in noise) + "]"), "plain"),
        ],
        mono=True,
    )

    # The derivation, one column per token.
    f.heading(tr("the derivation, token by token"))
    top_p = max(range(V), key=lambda i: p[i])
    six = lambda v: f"{v:.6f}"
    step = lambda *a, **kw: _step(f, 236, *a, col_w=120, **kw)[0]
    f.place(
        column(
            step("logits z", "", logits, fmt=num, tokens=True, **_row(logits)),
            step(f"z / T = z / {num(T)}", "", [x / T for x in logits], fmt=num, **_row(logits)),
            step(
                "p = softmax(z / T)",
                f"argmax p = token {top_p}",
                p,
                fmt=six,
                **_row(p, role=lambda i, v: "token" if i == top_p else "plain"),
            ),
            step("E ~ Exp(1)", tr("the noise"), noise, fmt=num, **_row(noise)),
            step(
                "p / E",
                tr("the race: the largest wins"),
                scores,
                fmt=six,
                bold=True,
                **_row(scores, role=lambda i, v: "accent" if i == want else "plain"),
            ),
            gap=8,
        ),
        after=8,
    )
    label = f"sample(z, T, E) → token {token}" if token == want else f"token {token}"
    drawn = f.matrix(
        [[label]],
        expected=[[f"token {want}"]],
        wrong=[[token != want]],
        fmt=str,
        role="accent",
        w=text_width(f"sample(z, T, E) → token {want}", VALUE, mono=True) + 28,
    )
    formula = f"p_{want} / E_{want} = {p[want]:.6f} / {num(noise[want])} = {scores[want]:.6f}"
    why = f.label(tr("{formula} is the largest", formula=formula))
    name = f.label(tr("your sample"), size=LABEL, color=INK, bold=True)
    f.place(row(pad(name, left=236 - name.w), drawn, why, gap=12, align="middle"), after=30)

    # Two bar panels: p and p / E.
    f.heading(tr("the race is not argmax p"))
    half = (f.width - 2 * MARGIN) / 2
    bar: dict[str, Any] = dict(height=110, bar_w=56, gap=22, labels=[f"token {i}" for i in range(V)], fmt=lambda v: f"{v:.3f}")
    panels = [
        f.titled(
            tr("p: the most likely token is {token}", token=top_p),
            f.bar_chart(p, role=["token" if i == top_p else "plain" for i in range(V)], **bar),
        ),
        f.titled(
            tr("p / E: token {token} wins (yours)", token=token) if token == want else tr("p / E: token {token} (yours)", token=token),
            f.bar_chart(scores, role=["accent" if i == want else "plain" for i in range(V)], **bar),
            color=stroke("wrong") if token != want else INK,
        ),
    ]
    placed = f.place(row(*(wide(pad(panel, left=(half - panel.w) / 2, top=8), half) for panel in panels), gap=0), after=36)
    if token != want and 0 <= token < V:
        right = panels[1]
        f.text(
            right.right - right.w + token * (56 + 22) + 28,
            placed.bottom + 8,
            tr("▲ yours"),
            anchor="middle",
            size=LABEL_SMALL,
            color=stroke("wrong"),
            weight="bold",
            cls="label wrong-pick",
        )

    # Many races: the empirical frequencies against p.
    if "counts" in r:
        _race_frequencies(f, r["counts"], r["n"], p, r["chi2"], r["limit"], r["intervals"], r["wrong"])
    else:
        f.note(tr("The panel of many races is drawn once the check of many races passes its shape check."), size=LABEL_SMALL)
    f.legend(
        [("token", tr("argmax p / how often a token won")), ("accent", tr("the race's winner")), ("plain", tr("p and other values"))],
        wrong=token != want or any(r.get("wrong", [])),
    )


def _race_frequencies(
    f: Figure, counts: list[int], n: int, p: list[float], chi2: float, limit: float, half: list[float], marked: list[bool]
) -> None:
    """Per token: the bar of p, the bar of how often it won, and on the latter the interval the chi-square test
    allows it (`half`: half-widths); a token the check's verdict falls on (`marked`) is drawn wrong (yours struck,
    expected below)."""
    V = len(p)
    freq = [c / n for c in counts]
    ok = chi2 <= limit
    f.heading(tr("{n} races from a fixed seed: how often each token won, against p", n=n))
    f.y += 8
    bw, g, group_gap, height = 52, 24, 100, 110
    total = V * (2 * bw + g) + (V - 1) * group_gap
    x0 = MARGIN + (f.width - 2 * MARGIN - total) / 2
    top = max([pi + h for pi, h in zip(p, half)] + freq + [1e-12])
    base = f.y + (44 if any(marked) else 30) + height
    ys = lambda v: base - height * max(v, 0) / top
    for i in range(V):
        gx = x0 + i * (2 * bw + g + group_gap)
        wx = gx + bw + g
        bad = marked[i]
        # p
        f.dwg.add(
            f.dwg.rect((gx, ys(p[i])), (bw, base - ys(p[i])), fill=fill("plain"), stroke=stroke("plain"), stroke_width=1, class_="bar")
        )
        f.text(gx + bw / 2, ys(p[i]) - 5, f"{p[i]:.3f}", size=SMALL, anchor="middle", mono=True, cls="value")
        # how often it won; where it should be (dashed) when it is marked
        if bad:
            f.outline(wx, ys(p[i]), bw, base - ys(p[i]), color=INK, width=1, dashed=True, cls="expected-bar")
        f.dwg.add(
            f.dwg.rect(
                (wx, ys(freq[i])),
                (bw, base - ys(freq[i])),
                fill="url(#hatch-wrong)" if bad else fill("token"),
                stroke=stroke("wrong") if bad else stroke("token"),
                stroke_width=1.5 if bad else 1,
                class_="bar won wrong" if bad else "bar won",
            )
        )
        # the interval the test allows: a whisker from p − h to p + h across the won bar
        lo, hi, cx = ys(max(p[i] - half[i], 0)), ys(p[i] + half[i]), wx + bw / 2
        f.dwg.add(f.dwg.line((cx, lo), (cx, hi), stroke=INK, stroke_width=1.2, class_="interval"))
        for yy in (lo, hi):
            f.dwg.add(f.dwg.line((cx - 9, yy), (cx + 9, yy), stroke=INK, stroke_width=1.2, class_="interval"))
        label_y = min(ys(freq[i]), hi) - 5
        if bad:
            f.text(
                cx,
                label_y - 13,
                f"{freq[i]:.3f}",
                size=SMALL,
                anchor="middle",
                mono=True,
                color=stroke("wrong"),
                cls="value wrong",
                strike=True,
            )
            f.text(cx, label_y, f"{p[i]:.3f} ± {half[i]:.3f}", size=SMALL, anchor="middle", mono=True, weight="bold", cls="expected")
        else:
            f.text(cx, label_y, f"{freq[i]:.3f}", size=SMALL, anchor="middle", mono=True, cls="value")
        for x, label in ((gx, "p"), (wx, tr("won"))):
            f.text(x + bw / 2, base + 15, label, size=SMALL + 0.5, anchor="middle", color=MUTED, cls="label")
        f.text(
            wx - g / 2,
            base + 32,
            tr("token {i}: {count} of {n}", i=i, count=counts[i], n=n),
            anchor="middle",
            size=LABEL_SMALL,
            color=INK,
            cls="label",
        )
    f.dwg.add(f.dwg.line((x0 - 4, base), (x0 + total + 4, base), stroke=RULE, stroke_width=1))
    f.y = base + 56
    verdict = "≤" if ok else ">"
    text = tr(
        "chi-square = Σ (count − N·p)² / (N·p) = {chi2} {verdict} {limit} (a correct sampler exceeds {limit} with probability "
        "< 1e-6; {df} degrees of freedom). The whisker on each won bar is p ± √({limit} · p(1 − p) / N): a share outside it "
        "alone exceeds the limit.",
        chi2=format(chi2, ".2f"),
        verdict=verdict,
        limit=format(limit, ".1f"),
        df=V - 1,
    )
    if not ok:
        tokens = [i for i in range(V) if marked[i]]
        off = [i for i in tokens if abs(freq[i] - p[i]) > half[i]]
        names = _tokens_phrase(tokens)
        if not off:
            verdict_text = tr("Every share is inside its interval, but together they exceed it: {tokens} is furthest off.", tokens=names)
        elif len(tokens) == 1:
            verdict_text = tr("{tokens} is outside its interval.", tokens=names)
        else:
            verdict_text = tr("{tokens} are outside their intervals.", tokens=names)
        text = tr("{text} {verdict}", text=text, verdict=verdict_text)
    f.note(text, size=LABEL_SMALL, color=MUTED if ok else stroke("wrong"))


def _tokens_phrase(tokens: list[int]) -> str:
    """ "token 2", "tokens 0 and 2", "tokens 0, 1 and 2"."""
    if len(tokens) == 1:
        return f"token {tokens[0]}"
    return tr("tokens {first} and {last}", first=", ".join(map(str, tokens[:-1])), last=tokens[-1])
