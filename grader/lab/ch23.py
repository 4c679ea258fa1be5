"""Experiments of ch23 · sampling."""

from __future__ import annotations

import torch

from grader.authoring import Trial
from grader.checks.ch23 import expect_distribution, expect_in_vocab, expect_tokens, frequencies_figure, race_scores
from grader.i18n import mark, tr
from grader.lab import Float, Numbers, ask, experiment

RACES = 4000  # the panel of many races: one call with this many rows of fresh Exp(1) noise


def _constraints(p: dict) -> dict[str, str]:
    if len(p["noise"]) != len(p["logits"]):
        return {"noise": tr("one E per token: {n} numbers, as many as logits", n=len(p["logits"]))}
    return {}


def _captions(p: dict) -> dict[str, tuple[str, ...]]:
    z, T, E = p["logits"], p["temperature"], p["noise"]
    probs, scores = race_scores(torch.tensor([z]), torch.tensor([T]), torch.tensor([E]))
    top, win = int(probs[0].argmax()), int(scores[0].argmax())
    zs, es = ", ".join(f"{v:g}" for v in z), ", ".join(f"{v:g}" for v in E)
    twist = f"但噪声 E = [{es}] 让 token {win} 胜出" if win != top else f"噪声 E = [{es}] 下它也赢得了这一次竞赛"
    twist_en = f"but the noise [{es}] makes token {win} win" if win != top else f"and with the noise [{es}] it also wins this race"
    return {
        "ch23-exponential-race": (
            f"指数竞赛:给每个 token 抽一个 E ~ Exp(1),取 argmax(p / E) = argmin(E / p),而不是 argmax(p)。"
            f"logits [{zs}]、T = {T:g} 时 token {top} 的 p 最大({float(probs[0, top]):.3f}),{twist};"
            "重复多次竞赛,每个 token 胜出的频率就是它的概率 p。",
            f"The exponential race: draw E ~ Exp(1) per token and take argmax(p / E) = argmin(E / p), not argmax(p). "
            f"With logits [{zs}] and T = {T:g}, token {top} has the largest p ({float(probs[0, top]):.3f}), {twist_en}; "
            "over many races each token wins exactly as often as its probability p.",
        )
    }


@experiment(
    "race",
    # title, about and the labels are marked for the catalogs; the lab shows them with tr() (4000 = RACES)
    title=mark("the sampler's exponential race"),
    about=mark(
        "Edit the logits, the temperature and the noise E: your sample must return argmax(p / E). "
        "Lower T sharpens p; a small E makes its token a strong runner whatever its p. Below, "
        "4000 races with fresh noise: each token wins about as often as its p."
    ),
    figures=("ch23-exponential-race",),
    calls=("sample",),
    params=[
        Numbers("logits", mark("logits z"), [2.0, 1.0, 0.0], 2, 5, -9.9, 9.9, integer=False),
        Float("temperature", mark("temperature T"), 0.5, 0.05, 5.0, 0.05),
        Numbers("noise", mark("noise E"), [3.0, 0.05, 1.0], 2, 5, 0.01, 9.9, integer=False),
    ],
    constraints=_constraints,
    captions=_captions,
)
def race(t: Trial, p: dict) -> None:
    z, T, E = p["logits"], p["temperature"], p["noise"]
    logits, temp, noise = torch.tensor([z]), torch.tensor([T]), torch.tensor([E])
    tokens = expect_in_vocab(t.yours.sample(logits, temp, noise), 1, len(z))
    probs, scores = race_scores(logits, temp, noise)
    answer = ask(t, lambda ref: ref.sample(logits, temp, noise))
    want = int(answer[0]) if answer is not None else int(scores[0].argmax())  # the race's winner needs no reference
    t.figure("ch23-exponential-race", logits=z, T=T, noise=E, p=probs[0], scores=scores[0], token=int(tokens[0]), token_expected=want)
    expect_tokens(tokens, logits, temp, noise, case=tr('case "your instance": logits {z}, T = {T}, noise {E}', z=z, T=format(T, "g"), E=E))
    many = torch.empty(RACES, len(z)).exponential_(generator=t.rng)
    drawn = expect_in_vocab(t.yours.sample(logits.expand(RACES, -1).contiguous(), temp.expand(RACES).contiguous(), many), RACES, len(z))
    t.figure("ch23-exponential-race", **frequencies_figure(drawn, z, T))
    expect_distribution(
        drawn, z, T, many, case=tr('case "{n} races": logits {z}, T = {T}, Exp(1) noise from a fixed seed', n=RACES, z=z, T=format(T, "g"))
    )
