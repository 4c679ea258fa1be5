"""Public checks of ch16 · attention, step by step, and the messages they share with the hidden ones.

The causal masks the checks pass and the values a misconception of attention_steps gives come from the hidden
side (`causal_mask`, `steps_variants`), asked for before comparing.
"""

from __future__ import annotations

import itertools
import math

import torch

from grader.authoring import (
    CheckFailed,
    StudentRaised,
    Trial,
    describe,
    expect_tensor,
    first_wrong,
    fmt,
    hidden_model,
    mistakes,
    public,
    vec,
    wrong_mask,
)
from grader.i18n import mark, tr, tr_in

ATOL, RTOL = 1e-5, 1e-5  # float32 attention outputs
NEG_INF = float("-inf")

# ch16-dim-split-heads / ch16-dim-merge-heads: the numbers 0 … 11 as [1, 3, 4], 2 heads of width 2.
NUMBERED_SHAPE, NUMBERED_HEADS = (1, 3, 4), 2
# ch16-dim-one-head-attention: one causal head, T = 3, d = 2, small integers.
ONE_Q = [[1.0, 0.0], [2.0, 1.0], [0.0, 1.0]]
ONE_K = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]
ONE_V = [[1.0, 0.0], [0.0, 2.0], [3.0, 1.0]]
# ch16-three-steps: 2 queries over 4 keys, d = 3, no mask; a second V shows the weights do not move.
STEPS_Q = [[1.0, 0.0, 1.0], [0.0, 2.0, 0.0]]
STEPS_K = [[1.0, 1.0, 0.0], [0.0, 1.0, 1.0], [2.0, 0.0, 0.0], [0.0, 0.0, 1.0]]
STEPS_V = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 1.0, 1.0]]
STEPS_V2 = [[2.0, 2.0, 0.0], [0.0, 0.0, 3.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
# ch16-prob-rows: 5 causal queries.
ROWS_T, ROWS_D = 5, 4

SPLIT_AXES, MERGE_AXES = ("B", "T", "H", "d"), ("B", "H", "T", "d")
CONVENTION = mark("True = may attend, the scaled_dot_product_attention convention")

causal_mask = hidden_model("ch16_models.causal_mask")
"""`t.ref.drive(causal_mask, T, S)`: the end-aligned causal mask [T, S] a check passes as an input."""
steps_variants = hidden_model("ch16_models.steps_variants")
"""`t.ref.drive(steps_variants, q, k, v, mask, scale, want)`: {scores | probs | out: {misconception: tensor}}."""
M = mistakes("ch16")
FIGURE = mark("figure instance")  # a case's name, translated where a message names it


# -- ch16.1 split_heads ------------------------------------------------------------------------------


@public("ch16.1", "figure instance: the numbers 0 … 11 as [1, 3, 4], 2 heads of width 2")
def split_figure_instance(t: Trial) -> None:
    x, case = numbered(), FIGURE
    want = t.ref.split_heads(x, NUMBERED_HEADS)
    out = expect_split(t.yours.split_heads(x, NUMBERED_HEADS), x, want, NUMBERED_HEADS, case, values=False)
    t.figure("ch16-dim-split-heads", x=x, num_heads=NUMBERED_HEADS, yours=out, expected=want, wrong=wrong_mask(out, want))
    explain_split(out, x, want, NUMBERED_HEADS, case)


@public("ch16.1", "Qwen3-0.6B's queries: [2, 3, 2048] into 16 heads of width 128")
def split_qwen3(t: Trial) -> None:
    # q_size = num_attention_heads · head_dim = 16 · 128 = 2048 (head_dim from the config, not 1024 / 16).
    run_split_case(t, torch.randn(2, 3, 2048, generator=t.rng), 16, mark("Qwen3-0.6B q, 2 sequences of 3 tokens"))


@public("ch16.1", "a batch of 2 sequences, 3 heads of width 4, T = 5")
def split_batch(t: Trial) -> None:
    run_split_case(t, torch.randn(2, 5, 12, generator=t.rng), 3, mark("B=2, T=5, 3 heads of width 4"))


@public("ch16.1", "one head: [B, 1, T, d] holds the same rows")
def split_one_head(t: Trial) -> None:
    run_split_case(t, numbered((2, 3, 5)), 1, mark("a single head of width 5"))


# -- ch16.2 merge_heads ------------------------------------------------------------------------------


@public("ch16.2", "figure instance: [1, 2, 3, 2] back to [1, 3, 4]")
def merge_figure_instance(t: Trial) -> None:
    heads = t.ref.split_heads(numbered(), NUMBERED_HEADS).contiguous()  # a fresh [B, H, T, d], as attention makes
    want = t.ref.merge_heads(heads)
    out = expect_merge(call_merge(t, heads, FIGURE), heads, want, FIGURE, values=False)
    t.figure("ch16-dim-merge-heads", heads=heads, yours=out, expected=want, wrong=wrong_mask(out, want), bare=heads.reshape(NUMBERED_SHAPE))
    explain_merge(out, heads, want, FIGURE)


@public("ch16.2", "merge undoes split: Qwen3-0.6B's 16 heads of width 128 back to [2, 3, 2048]")
def merge_qwen3(t: Trial) -> None:
    x = torch.randn(2, 3, 2048, generator=t.rng)
    heads = t.ref.split_heads(x, 16).contiguous()
    run_merge_case(t, heads, mark("Qwen3-0.6B attention output, 2 sequences of 3 tokens"), want=x)


@public("ch16.2", "2 sequences, 3 heads of width 4, T = 5")
def merge_batch(t: Trial) -> None:
    run_merge_case(t, torch.randn(2, 3, 5, 4, generator=t.rng), mark("B=2, 3 heads, T=5, d=4"))


# -- ch16.3 attention_steps ------------------------------------------------------------------------------


@public("ch16.3", "figure instance: one causal head, T = 3, d = 2, small integers")
def one_head_instance(t: Trial) -> None:
    q, k, v, mask, case = tensor(ONE_Q), tensor(ONE_K), tensor(ONE_V), t.ref.drive(causal_mask, 3), FIGURE
    want = t.ref.attention_steps(q, k, v, mask=mask)
    variants = t.ref.drive(steps_variants, q, k, v, mask, None, want)
    parts = call_steps(t, q, k, v, mask, case=case)
    t.figure(
        "ch16-dim-one-head-attention",
        q=q,
        k=k,
        v=v,
        mask=mask,
        **parts,
        expected={key: want[key] for key in ("scores", "probs", "out")},
        wrong=steps_wrong(parts, want, mask),
        sums_wrong=sums_wrong(parts["probs"]),
    )
    explain_steps(parts, want, q, k, v, mask, None, case, variants=variants)


@public("ch16.3", "three steps: 2 queries over 4 keys; a second V changes out, not the weights")
def three_steps(t: Trial) -> None:
    q, k, v, v2 = tensor(STEPS_Q), tensor(STEPS_K), tensor(STEPS_V), tensor(STEPS_V2)
    want, want2 = t.ref.attention_steps(q, k, v), t.ref.attention_steps(q, k, v2)
    variants = [t.ref.drive(steps_variants, q, k, x, None, None, w) for x, w in ((v, want), (v2, want2))]
    parts = call_steps(t, q, k, v, case=mark("three steps, V"))
    parts2 = call_steps(t, q, k, v2, case=mark("three steps, another V"))
    t.figure(
        "ch16-three-steps",
        q=q,
        k=k,
        v=v,
        v2=v2,
        **parts,
        out2=parts2["out"],
        expected={key: want[key] for key in ("scores", "probs", "out")},
        expected_out2=want2["out"],
        wrong=steps_wrong(parts, want, None),
        out2_wrong=steps_wrong(parts2, want2, None)["out"],
    )
    explain_steps(parts, want, q, k, v, None, None, mark("three steps, V"), variants=variants[0])
    explain_steps(parts2, want2, q, k, v2, None, None, mark("three steps, another V"), variants=variants[1])
    if not (torch.equal(parts["scores"], parts2["scores"]) and torch.equal(parts["probs"], parts2["probs"])):
        raise CheckFailed(
            tr(
                "the same q and k with another v gave different scores or probs: Q and K alone decide "
                "the weights; V only supplies the content they average"
            )
        )


@public("ch16.3", "causal, 5 queries: one row of probabilities per query")
def prob_rows(t: Trial) -> None:
    (q, k, v), mask, case = rows_inputs(), t.ref.drive(causal_mask, ROWS_T), mark("5 causal queries")
    want = t.ref.attention_steps(q, k, v, mask=mask)
    variants = t.ref.drive(steps_variants, q, k, v, mask, None, want)
    parts = call_steps(t, q, k, v, mask, case=case)
    t.figure(
        "ch16-prob-rows",
        mask=mask,
        probs=parts["probs"],
        expected=want["probs"],
        wrong=steps_wrong(parts, want, mask)["probs"],
        sums_wrong=sums_wrong(parts["probs"]),
        over_queries=close(parts["probs"], variants["probs"]["dim 0"]),
    )
    explain_steps(parts, want, q, k, v, mask, None, case, variants=variants)


@public("ch16.3", "Qwen3-0.6B's head_dim 128: the default scale is 1/√128; a given scale is used as given")
def qwen3_scale(t: Trial) -> None:
    q, k, v = (torch.randn(n, 128, generator=t.rng) for n in (2, 3, 3))
    run_steps_case(t, q, k, v, t.ref.drive(causal_mask, 2, 3), case=mark("head_dim 128, 2 new tokens after 1 cached"))
    run_steps_case(t, q, k, v, scale=0.5, case=mark("head_dim 128, scale 0.5"))


@public("ch16.3", "a padding mask: the last key is hidden from every query")
def padding_mask(t: Trial) -> None:
    q, k, v = (torch.randn(n, 4, generator=t.rng) for n in (3, 4, 4))
    mask = torch.tensor([[True, True, True, False]] * 3)
    run_steps_case(t, q, k, v, mask, case=mark("key 3 is padding"))


@public("ch16.3", "a query that may attend no key raises ValueError")
def blind_query(t: Trial) -> None:
    q, k = torch.zeros(2, 4), torch.zeros(3, 4)
    t.expect_raises(
        ValueError,
        t.yours.attention_steps,
        q,
        k,
        k,
        mask=torch.tensor([[True, False, False], [False] * 3]),
        because=tr("query 1 may attend no key, and a softmax over no keys is undefined (0/0)"),
    )


# -- the explanations, shared with the hidden checks ------------------------------------------------


def numbered(shape: tuple[int, ...] = NUMBERED_SHAPE) -> torch.Tensor:
    """The numbers 0, 1, 2, … in row order: every element shows where it came from."""
    return torch.arange(float(math.prod(shape))).view(shape)


def is_causal(mask: torch.Tensor) -> bool:
    """Whether a bool [T, S] mask is the end-aligned causal one: True exactly on and below the diagonal S − T."""
    T, S = mask.shape
    hidden_keys = ~mask
    return mask.dtype == torch.bool and bool(mask.equal(mask.tril(S - T))) and bool(hidden_keys.equal(hidden_keys.triu(S - T + 1)))


def tensor(rows: list) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def rows_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fixed q, k, v for ch16-prob-rows: 5 tokens, d = 4, one decimal each."""
    g = torch.Generator().manual_seed(1616)
    q, k, v = ((torch.randn(ROWS_T, ROWS_D, generator=g) * 1.5).round(decimals=1) for _ in range(3))
    return q, k, v


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    return list(a.shape) == list(b.shape) and torch.equal(a.to(torch.float64), b.to(torch.float64))


def replayed(got: torch.Tensor, make) -> tuple[int, ...] | None:
    """The axis order p for which make(p) reproduces the student's tensor, if any."""
    return next((p for p in itertools.permutations(range(4)) if same_values(got, make(p))), None)


def axes_text(p: tuple[int, ...], names: tuple[str, ...]) -> str:
    return "[" + ", ".join(names[i] for i in p) + "]"


def expect_layout(got, want: torch.Tensor, header: str, what: str, hint_of) -> torch.Tensor:
    """Require a tensor of want's shape and dtype; a wrong one is explained by `hint_of(got)`."""
    try:
        return expect_tensor(got, what=what, shape=list(want.shape), dtype=want.dtype)
    except CheckFailed as e:
        hint = "" if not isinstance(got, torch.Tensor) else M.dtype_changed if list(got.shape) == list(want.shape) else hint_of(got)
        raise CheckFailed(header, *e.lines, hint=hint) from None


# -- ch16.1 -----------------------------------------------------------------------------


def split_case(x: torch.Tensor, num_heads: int, case: str) -> str:
    B, T, W = x.shape
    return tr(
        'case "{case}": x [{B}, {T}, {W}] = [B, T, H·d], num_heads={H} → d = {W} // {H} = {d}; '
        "the result is [B, H, T, d] = [{B}, {H}, {T}, {d}]",
        case=tr(case),
        B=B,
        T=T,
        W=W,
        H=num_heads,
        d=W // num_heads,
    )


def split_hint(got: torch.Tensor, x: torch.Tensor, num_heads: int) -> str:
    """The misconception a wrong split comes from, found by replaying it on x ('' when none fits)."""
    B, T, W = x.shape
    d = W // num_heads
    if same_values(got, x.reshape(B, num_heads, T, d)):
        return M.reshape_no_transpose
    if same_values(got, x.reshape(B, T, d, num_heads).permute(0, 3, 1, 2)):
        return M.interleaved_heads.format(H=num_heads)
    p = replayed(got, lambda p: x.reshape(B, T, num_heads, d).permute(p))
    if p == (0, 1, 2, 3):
        return M.no_transpose
    if p is not None and p != (0, 2, 1, 3):
        return M.wrong_axes.format(axes=axes_text(p, SPLIT_AXES), p=p)
    return ""


def expect_split(got, x: torch.Tensor, want: torch.Tensor, num_heads: int, case: str, *, values: bool = True) -> torch.Tensor:
    """Require the student's split to be a [B, H, T, d] tensor in x's dtype (and, with `values`, to equal `want`)."""
    out = expect_layout(got, want, split_case(x, num_heads, case), tr("the heads"), lambda g: split_hint(g, x, num_heads))
    if values:
        explain_split(out, x, want, num_heads, case)
    return out


def explain_split(out: torch.Tensor, x: torch.Tensor, want: torch.Tensor, num_heads: int, case: str) -> None:
    idx = first_wrong(out, want)
    if idx is None:
        return
    b, h, t, _ = idx
    B, T, W = x.shape
    d = W // num_heads
    hits = (x.reshape(B, T, num_heads, d).double() == out[b, h, t].double()).all(-1).nonzero().tolist()
    if hits:
        src = f"x[{hits[0][0]}, {hits[0][1]}, {hits[0][2] * d}:{(hits[0][2] + 1) * d}]"
        yours = tr(
            "yours: {yours}, which is head {h} of token {tok} ({src})", yours=vec(out[b, h, t]), h=hits[0][2], tok=hits[0][1], src=src
        )
    else:
        yours = tr("yours: {yours}, which is not one head of one token of x", yours=vec(out[b, h, t]))
    src = f"x[{b}, {t}, {h * d}:{(h + 1) * d}]"
    raise CheckFailed(
        split_case(x, num_heads, case),
        tr(
            "out[{b}, {h}, {t}, :] is head {h} of token {t}, the columns h·d … h·d + d − 1 = {a} … {z} of row {t}: {src} = {want}; {yours}",
            b=b,
            h=h,
            t=t,
            a=h * d,
            z=h * d + d - 1,
            src=src,
            want=vec(want[b, h, t]),
            yours=yours,
        ),
        tr("({n} of {total} numbers differ)", n=int(wrong_mask(out, want).sum()), total=want.numel()),
        hint=split_hint(out, x, num_heads),
    )


def run_split_case(t: Trial, x: torch.Tensor, num_heads: int, case: str) -> torch.Tensor:
    want = t.ref.split_heads(x, num_heads)
    return expect_split(t.yours.split_heads(x, num_heads), x, want, num_heads, case)


# -- ch16.2 -----------------------------------------------------------------------------


def merge_case(x: torch.Tensor, case: str) -> str:
    B, H, T, d = x.shape
    return tr(
        'case "{case}": x [{B}, {H}, {T}, {d}] = [B, H, T, d] → the result is [B, T, H·d] = [{B}, {T}, {Hd}], '
        "token t's heads side by side in row t",
        case=tr(case),
        B=B,
        H=H,
        T=T,
        d=d,
        Hd=H * d,
    )


def merge_hint(got: torch.Tensor, x: torch.Tensor) -> str:
    """The misconception a wrong merge comes from, found by replaying it on x ('' when none fits)."""
    B, H, T, d = x.shape
    if list(got.shape) == [B, T, H, d] and H > 1:
        return M.unmerged
    p = replayed(got, lambda p: x.permute(p).reshape(B, T, H * d))
    if p == (0, 1, 2, 3):
        return M.bare_reshape
    if p == (0, 2, 3, 1):
        return M.interleaved_merge
    if p is not None and p != (0, 2, 1, 3):
        return M.merge_wrong_axes.format(axes=axes_text(p, MERGE_AXES), p=p)
    return ""


def expect_merge(got, x: torch.Tensor, want: torch.Tensor, case: str, *, values: bool = True) -> torch.Tensor:
    """Require the student's merge to be a [B, T, H·d] tensor in x's dtype (and, with `values`, to equal `want`)."""
    out = expect_layout(got, want, merge_case(x, case), tr("the merged heads"), lambda g: merge_hint(g, x))
    if values:
        explain_merge(out, x, want, case)
    return out


def explain_merge(out: torch.Tensor, x: torch.Tensor, want: torch.Tensor, case: str) -> None:
    idx = first_wrong(out, want)
    if idx is None:
        return
    b, t, c = idx
    B, H, T, d = x.shape
    h, j = divmod(c, d)
    lines = [
        merge_case(x, case),
        tr(
            "out[{b}, {t}, {c}] is column {c} = {h}·{d} + {j} of token {t}'s row, i.e. head {h} of token {t}: "
            "x[{b}, {h}, {t}, {j}] = {want}; yours: {yours}",
            b=b,
            t=t,
            c=c,
            h=h,
            d=d,
            j=j,
            want=fmt(want[idx]),
            yours=fmt(out[idx]),
        ),
    ]
    rows = x.reshape(B * H * T, d).double()
    origins = [(rows == piece).all(-1).nonzero().flatten().tolist() for piece in out[b, t].reshape(H, d).double()]
    origins = [divmod(hit[0] % (H * T), T) if hit else None for hit in origins]  # (head, token) of each piece
    if H <= 8 and any(origins):
        tokens = {o[1] for o in origins if o is not None}
        pieces = ", ".join("?" if o is None else tr("head {h} of token {tok}", h=o[0], tok=o[1]) for o in origins)
        if len(tokens) > 1:
            lines.append(
                tr(
                    "your row {t} holds, piece by piece: {pieces} — values of {n} different tokens in one row",
                    t=t,
                    pieces=pieces,
                    n=len(tokens),
                )
            )
        else:
            lines.append(tr("your row {t} holds, piece by piece: {pieces}", t=t, pieces=pieces))
    differ = tr("({n} of {total} numbers differ)", n=int(wrong_mask(out, want).sum()), total=want.numel())
    raise CheckFailed(*lines, differ, hint=merge_hint(out, x))


def call_merge(t: Trial, x: torch.Tensor, case: str):
    """The student's merge_heads(x); view()'s complaint after a transpose is explained."""
    try:
        return t.yours.merge_heads(x)
    except StudentRaised as e:
        message = str(e.error.get("message"))
        if not e.not_implemented and e.is_a("RuntimeError") and "view size is not compatible" in message:
            raise CheckFailed(merge_case(x, case), e.explain(), hint=M.view_after_transpose) from None
        raise


def run_merge_case(t: Trial, x: torch.Tensor, case: str, want: torch.Tensor | None = None) -> torch.Tensor:
    want = t.ref.merge_heads(x) if want is None else want
    return expect_merge(call_merge(t, x, case), x, want, case)


# -- ch16.3 -----------------------------------------------------------------------------


def steps_case(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float | None, case: str) -> str:
    (T, d), S = q.shape, k.shape[0]
    if mask is None:
        m = tr_in("ch16.mask", "none")
    elif is_causal(mask):
        m = tr_in("ch16.mask", "causal")
    else:
        m = tr("bool [{T}, {S}], {n} of {total} True", T=T, S=S, n=int(mask.sum()), total=mask.numel())
    return tr(
        'case "{case}": q [{T}, {d}], k [{S}, {d}], v {v}, mask: {mask}, scale = {scale}',
        case=tr(case),
        T=T,
        S=S,
        d=d,
        v=list(v.shape),
        mask=m,
        scale=tr("1/√{d} (default)", d=d) if scale is None else fmt(scale),
    )


def call_steps(
    t: Trial, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None, scale: float | None = None, *, case: str
) -> dict:
    """The student's attention_steps on valid inputs, structure checked; a ValueError there is explained."""
    head = steps_case(q, k, v, mask, scale, case)
    kw = ({"mask": mask} if mask is not None else {}) | ({"scale": scale} if scale is not None else {})
    try:
        got = t.yours.attention_steps(q, k, v, **kw)
    except StudentRaised as e:
        if e.not_implemented or not e.is_a("ValueError"):
            raise
        full = [] if mask is None else mask.all(-1).nonzero().flatten().tolist()
        if mask is None:
            why = ""
        elif full:
            why = tr(
                "every query may attend at least one key here ({convention}); read as True = hidden, "
                "query {q}'s row (all True) would hide every key",
                convention=tr(CONVENTION),
                q=full[0],
            )
        else:
            why = tr("every query may attend at least one key here ({convention})", convention=tr(CONVENTION))
        raise CheckFailed(
            head, tr("your attention_steps raised ValueError ({message}), but these inputs are valid", message=e.error.get("message")), why
        ) from None
    if not isinstance(got, dict) or not {"scores", "probs", "out"} <= set(got):
        have = tr("a dict with the keys {keys}", keys=", ".join(map(repr, got))) if isinstance(got, dict) else describe(got)
        raise CheckFailed(
            head, tr("expected a dict with the keys 'scores', 'probs' and 'out'; yours: {have}", have=have), hint=M.missing_steps
        )
    T, S = q.shape[0], k.shape[0]
    parts = {}
    for key, shape, what in (
        ("scores", [T, S], tr("scores (one row per query, one column per key)")),
        ("probs", [T, S], tr("probs (one row per query, one column per key)")),
        ("out", [T, v.shape[1]], tr("out (one row per query, v's width)")),
    ):
        try:
            parts[key] = expect_tensor(got[key], what=what, shape=shape, dtype=q.dtype)
        except CheckFailed as e:
            g = got[key]
            raise CheckFailed(
                head,
                *e.lines,
                hint=""
                if not isinstance(g, torch.Tensor)
                else M.keys_by_queries
                if list(g.shape) == shape[::-1] and T != S and key != "out"
                else tr("keep q's dtype ({dtype})", dtype=str(q.dtype).removeprefix("torch."))
                if list(g.shape) == shape
                else "",
            ) from None
    return parts


def keys_text(row: torch.Tensor) -> str:
    idx = row.nonzero().flatten().tolist()
    if len(idx) == len(row):
        return tr("all {n} keys", n=len(row))
    if idx == list(range(idx[0], idx[-1] + 1)):
        return tr("key {a}", a=idx[0]) if len(idx) == 1 else tr("keys {a}–{b}", a=idx[0], b=idx[-1])
    return tr("keys {keys}", keys=", ".join(map(str, idx[:8])) + (", …" if len(idx) > 8 else ""))


def term(x: float) -> str:
    """A factor in a written-out sum: negatives in parentheses."""
    return f"({fmt(x)})" if x < 0 else fmt(x)


def close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-4) -> bool:
    return list(a.shape) == list(b.shape) and torch.allclose(a.double(), b.double(), atol=tol, rtol=tol, equal_nan=True)


def scores_hint(got: torch.Tensor, want: torch.Tensor, q: torch.Tensor, k: torch.Tensor, mask, scale, variants: dict) -> str:
    """The misconception behind wrong scores ('' if none); `variants` is `steps_variants(...)["scores"]`."""
    (T, d), S = q.shape, k.shape[0]
    if mask is not None and not bool(mask.all()) and close(got[mask], want[mask]) and bool((got[~mask].double() <= -1e3).all()):
        return M.scores_masked
    whys = [
        ("unscaled", M.unscaled.format(d=d)),
        ("1/d", M.one_over_d.format(d=d, root=fmt(d**-0.5))),
        ("√keys", M.sqrt_keys.format(d=d, S=S)),
        ("√queries", M.sqrt_queries.format(d=d, T=T)),
        ("default scale", M.default_scale.format(scale=fmt(scale or 0.0))),
        ("transposed", M.keys_by_queries),
    ]
    return next((hint for key, hint in whys if key in variants and close(got, variants[key])), "")


def probs_hint(got: torch.Tensor, mask, variants: dict) -> str:
    """The misconception behind wrong probabilities ('' if none); `variants` is `steps_variants(...)["probs"]`."""
    allowed = torch.ones_like(got, dtype=torch.bool) if mask is None else mask
    whys = [
        ("dim 0", M.softmax_dim0),
        ("masked after", M.mask_after),
        ("mask inverted", M.mask_inverted),
        ("no mask", M.no_mask),
        ("raw scores", M.raw_scores),
    ]
    hint = next((hint for key, hint in whys if key in variants and close(got, variants[key])), "")
    if not hint and bool((got[~allowed].double().abs() > 1e-4).any()):
        hint = M.fill_too_small
    if not hint and not bool(torch.isfinite(got).all()):
        hint = M.unstable
    return hint


def out_hint(got: torch.Tensor, variants: dict) -> str:
    """The misconception behind a wrong output ('' if none); `variants` is `steps_variants(...)["out"]`."""
    whys = [("scores @ v", M.scores_at_v), ("probs @ k", M.probs_at_k), ("probs.T @ v", M.probs_t_at_v)]
    return next((hint for key, hint in whys if key in variants and close(got, variants[key])), "")


def explain_steps(
    parts: dict,
    want: dict,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask,
    scale,
    case: str,
    *,
    atol: float = ATOL,
    rtol: float = RTOL,
    variants: dict | None = None,
) -> None:
    """Compare scores, then probs, then out with the reference; explain the first wrong number (`variants`:
    `steps_variants`' answer; asked of the hidden side when needed if not given)."""
    (T, d), S = q.shape, k.shape[0]
    hints = lambda: variants if variants is not None else steps_variants(None, q, k, v, mask, scale, want)
    head = steps_case(q, k, v, mask, scale, case)
    allowed = torch.ones(T, S, dtype=torch.bool) if mask is None else mask
    scores, probs, out = parts["scores"], parts["probs"], parts["out"]
    tol = dict(atol=atol, rtol=rtol)
    if (idx := first_wrong(scores, want["scores"], **tol)) is not None:
        i, j = idx
        terms = (
            "(" + " + ".join(f"{term(a)}·{term(b)}" for a, b in zip(q[i].tolist(), k[j].tolist())) + ")"
            if d <= 4
            else fmt(float(q[i].double() @ k[j].double()))
        )
        fields = dict(
            i=i,
            j=j,
            terms=terms,
            scale=f"1/√{d}" if scale is None else fmt(scale),
            want=fmt(want["scores"][i, j]),
            d=d,
            yours=fmt(scores[i, j]),
        )
        if d <= 4:
            line = tr("step 1: scores[{i}, {j}] = (q[{i}] · k[{j}]) × scale = {terms} × {scale} = {want}; yours: {yours}", **fields)
        else:
            line = tr(
                "step 1: scores[{i}, {j}] = (q[{i}] · k[{j}]) × scale = {terms} × {scale} = {want} "
                "(q[{i}] · k[{j}] is a sum of d = {d} products); yours: {yours}",
                **fields,
            )
        raise CheckFailed(
            head,
            line,
            tr("({n} of {total} scores differ)", n=int(wrong_mask(scores, want["scores"], **tol).sum()), total=T * S),
            hint=scores_hint(scores, want["scores"], q, k, mask, scale, hints()["scores"]),
        )
    if (idx := first_wrong(probs, want["probs"], **tol)) is not None:
        i = idx[0]
        m = want["scores"][i].double().masked_fill(~allowed[i], NEG_INF).max()
        raise CheckFailed(
            head,
            tr(
                "step 2: query {i} may attend {keys}; probs[{i}, j] = exp(scores[{i}, j] − m) / Σ exp(scores[{i}, j'] − m) "
                "over those keys, m = the row's max = {m}",
                i=i,
                keys=keys_text(allowed[i]),
                m=fmt(m),
            ),
            tr(
                "expected row {i}: {want} (sums to 1); yours: {yours} (sums to {sum})",
                i=i,
                want=vec(want["probs"][i]),
                yours=vec(probs[i]),
                sum=fmt(probs[i].double().sum()),
            ),
            hint=probs_hint(probs, mask, hints()["probs"]),
        )
    if leak := ((~allowed) & (probs != 0)).nonzero().tolist():
        i, j = leak[0]
        raise CheckFailed(
            head,
            tr(
                "step 2: query {i} may not attend key {j} (mask[{i}, {j}] is False), so probs[{i}, {j}] must be exactly 0; yours: {yours}",
                i=i,
                j=j,
                yours=fmt(probs[i, j]),
            ),
            hint=M.finite_fill,
        )
    if (idx := first_wrong(out, want["out"], **tol)) is not None:
        i, c = idx
        terms = (
            " + ".join(f"{fmt(a, 3)}·{term(b)}" for a, b in zip(want["probs"][i].tolist(), v[:, c].tolist()))
            if S <= 4
            else tr("a sum over the S = {S} keys", S=S)
        )
        raise CheckFailed(
            head,
            tr(
                "step 3: out[{i}, {c}] = Σ_j probs[{i}, j] · v[j, {c}] = {terms} = {want}; yours: {yours}",
                i=i,
                c=c,
                terms=terms,
                want=fmt(want["out"][i, c]),
                yours=fmt(out[i, c]),
            ),
            tr("({n} of {total} outputs differ)", n=int(wrong_mask(out, want["out"], **tol).sum()), total=out.numel()),
            hint=out_hint(out, hints()["out"]),
        )


def steps_wrong(parts: dict, want: dict, mask: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """The checks' verdict on every number of scores, probs and out, as `explain_steps` reaches it: beyond the
    tolerance, and a key the mask hides with a probability that is not exactly 0."""
    wrong = {key: wrong_mask(parts[key], want[key], atol=ATOL, rtol=RTOL) for key in ("scores", "probs", "out")}
    if mask is not None:
        wrong["probs"] |= ~mask & (parts["probs"] != 0)
    return wrong


def sums_wrong(probs: torch.Tensor) -> torch.Tensor:
    """Per query: whether its row of probabilities misses a sum of 1 (beyond the tolerance)."""
    sums = probs.double().sum(-1)
    return wrong_mask(sums, torch.ones_like(sums), atol=ATOL)


def run_steps_case(
    t: Trial,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
    *,
    case: str,
    **tol: float,
) -> dict:
    kw = ({"mask": mask} if mask is not None else {}) | ({"scale": scale} if scale is not None else {})
    want = t.ref.attention_steps(q, k, v, **kw)
    variants = t.ref.drive(steps_variants, q, k, v, mask, scale, want)
    parts = call_steps(t, q, k, v, mask, scale, case=case)
    explain_steps(parts, want, q, k, v, mask, scale, case, **tol, variants=variants)
    return parts
