"""Experiments of ch15 · token ids to logits."""

from __future__ import annotations

import math

import torch

from figures.ch15 import ID_STEP, OUT_STEP, ROW
from grader.authoring import CheckFailed, Trial, expect_tensor, wrong_mask
from grader.checks.ch15 import expect_lookup, row_hint
from grader.i18n import mark, tr
from grader.lab import Int, Numbers, ask, expected_or_own, experiment


def room_for_ids(V: int) -> int:
    """How many ids ch15-dim-embedding can draw beside a table of V rows (ids and output rows take more height)."""
    return max(1, min(math.floor(1 + (V - 0.91) / ID_STEP), math.floor((ROW * V - 6) / OUT_STEP)))


def table(V: int, H: int) -> torch.Tensor:
    """E [V, H] whose row r holds 10(r+1)+1 … 10(r+1)+H (the figure's pattern: a row's values name it)."""
    return torch.tensor([[10 * (r + 1) + c + 1 for c in range(H)] for r in range(V)], dtype=torch.float32)


def _constraints(p: dict) -> dict[str, str]:
    V, ids = p["V"], p["ids"]
    if max(ids) >= V:
        return {
            "ids": tr(
                "id {id} is not a row of E (V = {V} rows, ids 0 … {last}); an id ≥ vocab_size is "
                "an error your function raises (check ch15.1), not something to draw",
                id=max(ids),
                V=V,
                last=V - 1,
            )
        }
    if len(ids) > room_for_ids(V):
        return {"ids": tr("with V = {V} rows the figure has room for {n} ids; add rows or remove ids", V=V, n=room_for_ids(V))}
    return {}


def _captions(p: dict) -> dict[str, tuple[str, ...]]:
    V, H, ids = p["V"], p["H"], p["ids"]
    n = len(ids)
    return {
        "ch15-dim-embedding": (
            f"ids = {ids} 从 E[{V}, {H}] 中读出第 {'、'.join(map(str, ids))} 行,得到 X[1, {n}, {H}]:输入是 {n} 个整数下标,"
            f"输出是 {n} × {H} = {n * H} 个浮点数。查表按 id 选行,而不是把 E 重新排成另一个形状。",
            f"ids = {ids} read rows {', '.join(map(str, ids))} of E[{V}, {H}] to give X[1, {n}, {H}]: {n} integer "
            f"indices go in, {n} × {H} = {n * H} floats come out. A lookup selects rows by id; it is not a reshape of E.",
        )
    }


@experiment(
    "embedding",
    title=mark("embedding lookup"),
    about=mark(
        "Edit the ids and the table's shape: your embedding_lookup reads one whole row of E per id, in "
        "the order of the ids (a repeated id reads its row twice)."
    ),
    figures=("ch15-dim-embedding",),
    calls=("embedding_lookup",),
    params=[
        Int("V", mark("V (rows of E)"), 6, 2, 8),
        Int("H", mark("H (row width)"), 4, 1, 6),
        Numbers("ids", "ids", [2, 0, 4], 1, 5, 0, 7),
    ],
    constraints=_constraints,
    captions=_captions,
)
def embedding(t: Trial, p: dict) -> None:
    weight, ids = table(p["V"], p["H"]), torch.tensor([p["ids"]])
    got = t.yours.embedding_lookup(weight, ids)
    want = ask(t, lambda ref: ref.embedding_lookup(weight, ids))
    shape = [1, len(p["ids"]), p["H"]]
    if isinstance(got, torch.Tensor) and list(got.shape) == shape and got.dtype == weight.dtype:
        expected = expected_or_own(want, got)
        t.figure(
            "ch15-dim-embedding",
            table=weight,
            ids=ids,
            out=got,
            expected=expected,
            wrong=wrong_mask(got, expected),
            checked=want is not None,
        )
    if want is not None:
        expect_lookup(got, want, weight, ids, mark("your instance"))
    else:
        explain_rows(
            expect_tensor(got, what=tr("the embeddings of ids {shape}", shape=shape[:2]), shape=shape, dtype=weight.dtype), weight, p["ids"]
        )


def explain_rows(out: torch.Tensor, weight: torch.Tensor, ids: list[int]) -> None:
    """What a lookup must do, checked without an answer: row t of X is a whole row of E, the row ids[t] names
    (E's rows hold distinct values, so a row of X says which row of E it is)."""
    for t, tok in enumerate(ids):
        found = [r for r in range(len(weight)) if torch.equal(out[0, t], weight[r])]
        if found != [tok]:
            what = tr("row {r} of E", r=found[0]) if found else tr("not a row of E: a lookup copies whole rows")
            raise CheckFailed(
                tr('case "{case}": {inputs}', case=tr("your instance"), inputs=f"ids = {ids}, E [{len(weight)}, {len(weight[0])}]"),
                tr("ids[0, {t}] = {tok}, so X[0, {t}] is row {tok} of E; yours is {what}", t=t, tok=tok, what=what),
                hint=row_hint(out[0], weight, t, tok),
            )
