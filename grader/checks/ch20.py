"""Public checks of ch20 · pre-norm, RMSNorm, SwiGLU, and the messages they share with the hidden ones.

What a misconception gives (and the MLP's intermediates of a derivation) comes from the hidden side's models
(`norm_variants`, `add_variants`, `act_variants`, `mlp_models`), asked for before comparing.
"""

from __future__ import annotations

import torch

from grader.authoring import CheckFailed, Hint, Trial, describe, expect_tensor, fmt, hidden_model, mistakes, public, vec, wrong_mask
from grader.checks.ch19 import ROUNDING_SHARE, agrees, dtype_name, par, rounding_failure, rounding_share, ulp, wrong_values
from grader.i18n import tr

EPS = 1e-6

# ch20-prenorm: layer 0's input_layernorm(e, None), its post_attention_layernorm(a, e), and layer 1's
# input_layernorm(m, residual), which performs the add deferred from layer 0's MLP. Weight 1, as initialised.
PRENORM_E, PRENORM_A, PRENORM_M = [0.0, 1.0, 2.0, 3.0], [1.0, 1.0, 1.0, 1.0], [0.5, -0.5, 0.5, -0.5]

# ch20-dim-swiglu: one token, hidden 4, intermediate 6; small weights a reader can multiply out.
SWIGLU_X = [1.0, 0.0, -1.0, 2.0]
SWIGLU_GATE_UP = [
    [1, 0, 0, 0],
    [0, 0, 1, 0],
    [1, 1, 0, 1],
    [0, 0, 0, 1],
    [-1, 0, 1, 0],
    [0, 1, 0, -1],  # gate
    [0, 0, 0, 1],
    [1, 0, 0, 0],
    [1, 0, -1, 0],
    [0, 1, 0, 0],
    [0, 0, 1, 1],
    [-1, 0, 0, 1],
]  # up
SWIGLU_DOWN = [[1, 0, 0, 0.5, 0, -1], [0, 1, 0, 0, 0.5, 0], [0, 0, 1, 0, 1, 0], [0.5, 0, -1, 1, 0, 0.5]]

# ch20-swiglu-branches: three tokens through the same weights, then the same tokens in another order.
BRANCH_X = [[1.0, 0.0, -1.0, 2.0], [0.5, 1.0, 0.0, -1.0], [-1.0, 2.0, 1.0, 0.0]]
BRANCH_ORDER = [2, 0, 1]

M = mistakes("ch20")

norm_variants = hidden_model("ch20_models.norm_variants")
"""`t.ref.drive(norm_variants, x, w, eps)`: {misconception: rms_norm(x) as it computes it}."""
add_variants = hidden_model("ch20_models.add_variants")
"""`t.ref.drive(add_variants, x, residual, w, eps)`: the normed outputs of add_rms_norm's misconceptions."""
act_variants = hidden_model("ch20_models.act_variants")
"""`t.ref.drive(act_variants, gate_up)`: {misconception: activation}."""
mlp_models = hidden_model("ch20_models.mlp_models")
"""`t.ref.drive(mlp_models, x, w_gu, w_down)`: gate_up, SiLU(gate), act and {misconception: output}."""


# -- ch20.1 rms_norm ----------------------------------------------------------------------------------


@public("ch20.1", "the worked example: x = [1, 2, 3, 4], weight 1 and [1, 0.5, 2, 1]")
def norm_worked_example(t: Trial) -> None:
    x = tensor([[1.0, 2.0, 3.0, 4.0]])
    run_norm_case(t, x, torch.ones(4), tr("x = [1, 2, 3, 4], weight 1"))
    run_norm_case(t, x, tensor([1.0, 0.5, 2.0, 1.0]), tr("x = [1, 2, 3, 4], weight [1, 0.5, 2, 1]"))


@public("ch20.1", "each token normalised over its own hidden channels")
def norm_per_token(t: Trial) -> None:
    x = torch.randn(4, 8, generator=t.rng) * tensor([[0.1], [1.0], [10.0], [100.0]])
    run_norm_case(t, x, torch.rand(8, generator=t.rng) + 0.5, tr("4 tokens of very different sizes, H = 8"))


@public("ch20.1", "bf16: cast back before multiplying by the weight")
def norm_bf16_order(t: Trial) -> None:
    x = (torch.randn(16, 64, generator=t.rng) * 3).bfloat16()
    run_norm_case(t, x, (torch.rand(64, generator=t.rng) + 0.5).bfloat16(), tr("16 bf16 tokens, H = 64"))


@public("ch20.1", "a batch [B, T, H]")
def norm_3d(t: Trial) -> None:
    run_norm_case(t, torch.randn(2, 3, 16, generator=t.rng), torch.rand(16, generator=t.rng) + 0.5, "[2, 3, 16]")


# -- ch20.2 add_rms_norm ------------------------------------------------------------------------------


@public("ch20.2", "figure instance: layer 0, then the add deferred to layer 1 (hidden 4)")
def prenorm_figure_instance(t: Trial) -> None:
    w = torch.ones(4)
    e, a, m = tensor([PRENORM_E]), tensor([PRENORM_A]), tensor([PRENORM_M])
    got0 = expect_pair(t.yours.add_rms_norm(e, None, w, EPS), e)
    want0 = t.ref.add_rms_norm(e, None, w, EPS)
    got1 = expect_pair(t.yours.add_rms_norm(a, want0[1], w, EPS), a, want0[1])
    want1 = t.ref.add_rms_norm(a, want0[1], w, EPS)
    got2 = expect_pair(t.yours.add_rms_norm(m, want1[1], w, EPS), m, want1[1])
    want2 = t.ref.add_rms_norm(m, want1[1], w, EPS)
    variants = [t.ref.drive(add_variants, x, r, w, EPS) for x, r in ((e, None), (a, want0[1]), (m, want1[1]))]
    calls = list(zip((got0, got1, got2), (want0, want1, want2)))
    t.figure(
        "ch20-prenorm",
        inputs=[PRENORM_E, PRENORM_A, PRENORM_M],
        residual_in=[None, want0[1][0], want1[1][0]],
        normed=[g[0][0] for g, _ in calls],
        residual=[g[1][0] for g, _ in calls],
        normed_expected=[w[0][0] for _, w in calls],
        residual_expected=[w[1][0] for _, w in calls],
        normed_wrong=[wrong_values(g[0], w[0])[0] for g, w in calls],
        residual_wrong=[wrong_values(g[1], w[1])[0] for g, w in calls],
    )
    explain_add(*got0, e, None, w, EPS, want0, tr("layer 0: input_layernorm(embedding, None)"), variants[0])
    explain_add(*got1, a, want0[1], w, EPS, want1, tr("layer 0: post_attention_layernorm(attention output, residual)"), variants[1])
    explain_add(*got2, m, want1[1], w, EPS, want2, tr("layer 1: input_layernorm(MLP output, residual)"), variants[2])


@public("ch20.2", "residual None (layer 0): the embedding becomes the residual")
def add_layer0(t: Trial) -> None:
    run_add_case(t, torch.randn(3, 8, generator=t.rng), None, torch.rand(8, generator=t.rng) + 0.5, tr("layer 0"))


@public("ch20.2", "the sum goes on as the residual, its norm into the sublayer")
def add_with_residual(t: Trial) -> None:
    x, r = torch.randn(4, 16, generator=t.rng), torch.randn(4, 16, generator=t.rng) * 5
    run_add_case(t, x, r, torch.rand(16, generator=t.rng) + 0.5, tr("4 tokens, H = 16"))


@public("ch20.2", "bf16: the float32 sum is normalised, its bf16 copy carried")
def add_bf16(t: Trial) -> None:
    x = (torch.randn(16, 64, generator=t.rng) * 0.5).bfloat16()
    r = (torch.randn(16, 64, generator=t.rng) * 8).bfloat16()
    run_add_case(t, x, r, (torch.rand(64, generator=t.rng) + 0.5).bfloat16(), tr("16 bf16 tokens, H = 64"))


# -- ch20.3 silu_and_mul ------------------------------------------------------------------------------


@public("ch20.3", "the worked example: [1, −1, 2, 3] → [1.4621, −0.8068]")
def act_worked_example(t: Trial) -> None:
    run_act_case(t, tensor([1.0, -1.0, 2.0, 3.0]), "gate_up = [1, −1, 2, 3]")


@public("ch20.3", "figure instance: one token's 12-wide gate_up (intermediate 6)")
def act_figure_instance(t: Trial) -> None:
    gu = tensor([SWIGLU_X]) @ tensor(SWIGLU_GATE_UP).T
    y = expect_tensor(t.yours.silu_and_mul(gu), what=tr("SiLU(gate)·up of gate_up [1, 12]"), shape=[1, 6], dtype=torch.float32)
    want = t.ref.silu_and_mul(gu)
    variants = t.ref.drive(act_variants, gu)
    t.figure(
        "ch20-dim-swiglu",
        x=SWIGLU_X,
        gate_up_weight=SWIGLU_GATE_UP,
        down_weight=SWIGLU_DOWN,
        gate_up=gu[0],
        act=y[0],
        act_expected=want[0],
        act_wrong=act_wrong(y, want)[0],
    )
    explain_act(y, want, gu, tr("figure instance"), variants)


@public("ch20.3", "leading dimensions are kept: [2, 3, 8] → [2, 3, 4]")
def act_leading_dims(t: Trial) -> None:
    run_act_case(t, torch.randn(2, 3, 8, generator=t.rng) * 3, "[2, 3, 8]")


@public("ch20.3", "bf16 gate_up")
def act_bf16(t: Trial) -> None:
    run_act_case(t, (torch.randn(8, 64, generator=t.rng) * 3).bfloat16(), "[8, 64] bf16")


# -- ch20.4 swiglu_mlp --------------------------------------------------------------------------------


@public("ch20.4", "figure instance: one token, hidden 4, intermediate 6")
def mlp_figure_instance(t: Trial) -> None:
    x, w_gu, w_down = tensor([SWIGLU_X]), tensor(SWIGLU_GATE_UP), tensor(SWIGLU_DOWN)
    y = expect_tensor(t.yours.swiglu_mlp(x, w_gu, w_down), what=tr("the MLP output [1, 4]"), shape=[1, 4], dtype=torch.float32)
    want = t.ref.swiglu_mlp(x, w_gu, w_down)
    models = t.ref.drive(mlp_models, x, w_gu, w_down)
    t.figure("ch20-dim-swiglu", out=y[0], out_expected=want[0], out_wrong=mlp_wrong(y, want)[0])
    explain_mlp(y, want, x, w_gu, w_down, tr("figure instance"), models)


@public("ch20.4", "three tokens, then the same tokens in another order")
def mlp_branches_instance(t: Trial) -> None:
    x, w_gu, w_down = tensor(BRANCH_X), tensor(SWIGLU_GATE_UP), tensor(SWIGLU_DOWN)
    what = tr("the MLP output [3, 4]")
    y = expect_tensor(t.yours.swiglu_mlp(x, w_gu, w_down), what=what, shape=[3, 4], dtype=torch.float32)
    y2 = expect_tensor(t.yours.swiglu_mlp(x[BRANCH_ORDER], w_gu, w_down), what=what, shape=[3, 4], dtype=torch.float32)
    want = t.ref.swiglu_mlp(x, w_gu, w_down)
    models = t.ref.drive(mlp_models, x, w_gu, w_down)
    models_permuted = t.ref.drive(mlp_models, x[BRANCH_ORDER], w_gu, w_down)
    t.figure(
        "ch20-swiglu-branches",
        x=x,
        gate=models["silu_gate"],
        up=models["gate_up"][:, 6:],
        out=y,
        expected=want,
        wrong=mlp_wrong(y, want),
        order=BRANCH_ORDER,
        out_permuted=y2,
        expected_permuted=want[BRANCH_ORDER],
        wrong_permuted=mlp_wrong(y2, want[BRANCH_ORDER]),
    )
    explain_mlp(y, want, x, w_gu, w_down, tr("3 tokens"), models)
    again = tr("the same 3 tokens in the order {order}", order=BRANCH_ORDER)
    explain_mlp(y2, want[BRANCH_ORDER], x[BRANCH_ORDER], w_gu, w_down, again, models_permuted)


@public("ch20.4", "Qwen3-like proportions (H = 32, I = 96) with leading dims [2, 3]")
def mlp_qwen_like(t: Trial) -> None:
    w_gu, w_down = random_mlp(t, 32, 96)
    run_mlp_case(t, torch.randn(2, 3, 32, generator=t.rng), w_gu, w_down, "x [2, 3, 32], I = 96")


# -- helpers ------------------------------------------------------------------------------------------


def tensor(rows, dtype=torch.float32) -> torch.Tensor:
    return torch.tensor(rows, dtype=dtype)


def random_mlp(t: Trial, h: int, i: int, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    return ((torch.randn(2 * i, h, generator=t.rng) * h**-0.5).to(dtype), (torch.randn(h, i, generator=t.rng) * i**-0.5).to(dtype))


# -- helpers: ch20.1, the norm ------------------------------------------------------------------------


def run_norm_case(
    t: Trial, x: torch.Tensor, w: torch.Tensor, case: str, eps: float = EPS, want: torch.Tensor | None = None
) -> torch.Tensor:
    y = expect_tensor(
        t.yours.rms_norm(x, w, eps),
        what=tr("rms_norm of x {shape} (x's shape and dtype)", shape=list(x.shape)),
        shape=list(x.shape),
        dtype=x.dtype,
    )
    want = t.ref.rms_norm(x, w, eps) if want is None else want
    variants = t.ref.drive(norm_variants, x, w, eps)
    explain_norm(y, want, x, w, eps, case, hint=norm_hint(y, x, variants))
    return y


def explain_norm(
    y: torch.Tensor,
    want: torch.Tensor,
    s: torch.Tensor,
    w: torch.Tensor,
    eps: float,
    case: str,
    *,
    what: str = "rms_norm(x)",
    source: str = "x",
    hint: str = "",
) -> None:
    """Raise at the first wrong element of a normalised tensor: its row's mean square, root, weight."""
    bad = wrong_values(y, want)
    head = tr(
        'case "{case}": {source} {shape} {dtype}, eps {eps}',
        case=case,
        source=source,
        shape=list(s.shape),
        dtype=dtype_name(y.dtype),
        eps=fmt(eps),
    )
    if not bad.any():
        share = rounding_share(y, want)
        if share > ROUNDING_SHARE:
            raise rounding_failure(tr("{head}, {what}", head=head, what=what), share, hint)
        return
    idx = tuple(int(v) for v in bad.nonzero()[0])
    row, c = idx[:-1], idx[-1]
    v = s[row].double()
    ms = float(v.pow(2).mean())
    r = (ms + eps) ** -0.5
    where = tr("row {row}", row=list(row)) if len(row) > 1 else tr("token {i}", i=row[0]) if row else tr("the vector")
    raise CheckFailed(
        head,
        tr(
            "{where} of {source} = {v}: mean({s}²) over its {n} channels = {ms}, rsqrt({ms} + eps) = {r}",
            where=where,
            source=source,
            v=vec(v),
            s=source[0],
            n=v.numel(),
            ms=fmt(ms),
            r=fmt(r),
        ),
        tr(
            "{what}[{idx}] = {x}·{r}·w[{c}] = {x}·{r}·{w} = {want}; yours: {got} ({bad} of {total} values differ)",
            what=what,
            idx=", ".join(map(str, idx)),
            x=par(float(v[c])),
            r=fmt(r),
            c=c,
            w=par(float(w[c])),
            want=fmt(want[idx]),
            got=fmt(y[idx]),
            bad=int(bad.sum()),
            total=bad.numel(),
        ),
        hint=hint,
    )


def norm_hint(y: torch.Tensor, x: torch.Tensor, variants: dict) -> str:
    """The misconception whose rms_norm (`norm_variants`' answer) reproduces the student's, or ''."""
    whys = [
        ("center", M.layernorm),
        ("dim 0", M.token_axis),
        ("eps outside", M.eps_outside),
        ("all dims", M.all_dims),
        ("weight first", M.weight_first.format(dtype=dtype_name(x.dtype))),
        ("no weight", M.no_weight),
        ("sum", M.sum_of_squares),
        ("mean square", M.mean_square),
    ]
    return next((why for key, why in whys if key in variants and agrees(y, variants[key])), "")


# -- helpers: ch20.2, the fused add + norm ------------------------------------------------------------


def run_add_case(
    t: Trial, x: torch.Tensor, residual: torch.Tensor | None, w: torch.Tensor, case: str, eps: float = EPS
) -> tuple[torch.Tensor, torch.Tensor]:
    normed, res = expect_pair(t.yours.add_rms_norm(x, residual, w, eps), x, residual)
    want = t.ref.add_rms_norm(x, residual, w, eps)
    explain_add(normed, res, x, residual, w, eps, want, case, t.ref.drive(add_variants, x, residual, w, eps))
    return normed, res


def expect_pair(got, x: torch.Tensor, residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Require (normed, new_residual), two tensors shaped like x (`residual`: the residual add_rms_norm was given)."""
    if type(got) not in (tuple, list) or len(got) != 2:
        raise CheckFailed(tr("expected (normed, new_residual) as a tuple of two tensors shaped like x; yours: {got}", got=describe(got)))
    for name, g in zip(("new_residual", "normed"), (got[1], got[0])):
        if g is None:
            raise CheckFailed(
                tr("expected (normed, new_residual); yours returned None as {name}", name=name),
                hint=M.layer0_none if name == "new_residual" and residual is None else "",
            )
    like = {"shape": list(x.shape), "dtype": dtype_name(x.dtype)}
    return (
        expect_tensor(got[0], what=tr("normed (shaped like x {shape}, {dtype})", **like), shape=list(x.shape), dtype=x.dtype),
        expect_tensor(got[1], what=tr("new_residual (shaped like x {shape}, {dtype})", **like), shape=list(x.shape), dtype=x.dtype),
    )


def explain_add(
    normed: torch.Tensor,
    res: torch.Tensor,
    x: torch.Tensor,
    residual: torch.Tensor | None,
    w: torch.Tensor,
    eps: float,
    want: tuple[torch.Tensor, torch.Tensor],
    case: str,
    variants: dict | None = None,
) -> None:
    """Explain the first wrong new_residual, then normed (`variants`: `add_variants`' answer; asked of the hidden
    side when needed if not given)."""
    want_n, want_r = want
    s = x.float() if residual is None else x.float() + residual.float()
    if wrong_values(res, want_r).any() or rounding_share(res, want_r) > ROUNDING_SHARE:
        idx = tuple(int(v) for v in (wrong_values(res, want_r) | (res != want_r)).nonzero()[0])
        if residual is None:
            line = tr(
                "residual None (layer 0): the new residual is x itself; new_residual{idx} should be x{idx} = {want}; yours: {got}",
                idx=list(idx),
                want=fmt(x[idx]),
                got=fmt(res[idx]),
            )
        else:
            line = tr(
                "new_residual{idx} = x + residual = {x} + {r} = {want}; yours: {got}",
                idx=list(idx),
                x=par(float(x[idx])),
                r=par(float(residual[idx])),
                want=fmt(want_r[idx]),
                got=fmt(res[idx]),
            )
        hint: str = ""
        if agrees(normed, want_r) and agrees(res, want_n):
            hint = M.pair_order
        elif agrees(res, want_n):
            hint = M.normed_residual
        elif residual is not None and agrees(res, residual):
            hint = M.old_residual
        elif residual is not None and agrees(res, x):
            hint = M.x_as_residual
        shown = {"case": case, "shape": list(x.shape), "dtype": dtype_name(x.dtype)}
        head = (
            tr('case "{case}": x {shape} {dtype}, residual None', **shown)
            if residual is None
            else tr('case "{case}": x {shape} {dtype}', **shown)
        )
        raise CheckFailed(head, line, hint=hint)
    if not wrong_values(normed, want_n).any() and rounding_share(normed, want_n) <= ROUNDING_SHARE:
        return
    hint = add_hint(normed, x, residual, variants if variants is not None else add_variants(None, x, residual, w, eps))
    explain_norm(normed, want_n, s, w, eps, case, what="normed", source="s = x + residual" if residual is not None else "x", hint=hint)


def add_hint(normed: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None, variants: dict) -> str:
    """The misconception whose normed output (`add_variants`' answer) reproduces the student's, or ''."""
    if residual is not None and agrees(normed, variants["x alone"]):
        return M.x_alone
    if x.dtype == torch.float32:
        return norm_hint(normed, x.float(), variants["norm"])
    if residual is not None and agrees(normed, variants["rounded sum"]):
        return M.rounded_sum.format(dtype=dtype_name(x.dtype))
    if agrees(normed, variants["weight first"]):
        return M.sum_weight_first.format(dtype=dtype_name(x.dtype))
    return ""


# -- helpers: ch20.3, the activation ------------------------------------------------------------------


def run_act_case(t: Trial, gu: torch.Tensor, case: str) -> torch.Tensor:
    shape = [*gu.shape[:-1], gu.shape[-1] // 2]
    y = expect_tensor(
        t.yours.silu_and_mul(gu),
        what=tr("SiLU(gate)·up of gate_up {shape} (last dim halved, {dtype})", shape=list(gu.shape), dtype=dtype_name(gu.dtype)),
        shape=shape,
        dtype=gu.dtype,
    )
    want = t.ref.silu_and_mul(gu)
    explain_act(y, want, gu, case, t.ref.drive(act_variants, gu))
    return y


def act_wrong(y: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """float32: 1e-5; bf16: one rounding step (an eager bf16 SiLU·up rounds twice, nano-vllm's compiled one once)."""
    return wrong_values(y, want)


def explain_act(y: torch.Tensor, want: torch.Tensor, gu: torch.Tensor, case: str, variants: dict | None = None) -> None:
    """Explain the first wrong activation (`variants`: `act_variants`' answer; asked of the hidden side when
    needed if not given)."""
    bad = act_wrong(y, want)
    if not bad.any():
        return
    idx = tuple(int(v) for v in bad.nonzero()[0])
    i, half = idx[-1], gu.shape[-1] // 2
    g, u = float(gu[idx[:-1] + (i,)]), float(gu[idx[:-1] + (i + half,)])
    silu = g / (1 + torch.exp(torch.tensor(-g, dtype=torch.float64)).item())
    raise CheckFailed(
        tr(
            'case "{case}": gate_up {shape} {dtype} → gate = [..., :{half}], up = [..., {half}:]',
            case=case,
            shape=list(gu.shape),
            dtype=dtype_name(gu.dtype),
            half=half,
        ),
        tr(
            "output{idx}: gate = gate_up[..., {i}] = {g}, up = gate_up[..., {j}] = {u}; SiLU({g}) = {g}·sigmoid({g}) = "
            "{silu}, times up: {want}; yours: {got} ({bad} of {total} values differ)",
            idx=list(idx),
            i=i,
            j=i + half,
            g=fmt(g),
            u=fmt(u),
            silu=fmt(silu),
            want=fmt(want[idx]),
            got=fmt(y[idx]),
            bad=int(bad.sum()),
            total=bad.numel(),
        ),
        hint=act_hint(y, variants if variants is not None else act_variants(None, gu)),
    )


def act_whys() -> list[tuple[str, Hint]]:
    """Each wrong activation's name in `act_variants` and the mistake it embodies, in the order tried."""
    return [
        ("halves swapped", M.halves_swapped),
        ("even and odd", M.even_and_odd),
        ("sigmoid", M.sigmoid),
        ("relu", M.relu),
        ("gelu", M.gelu),
        ("silu of up too", M.silu_of_up),
        ("no up", M.no_up),
    ]


def act_hint(y: torch.Tensor, variants: dict) -> str:
    for key, why in act_whys():
        variant = variants[key]
        if variant.shape == y.shape and agrees(y, variant.to(y.dtype)):
            return why
    return ""


# -- helpers: ch20.4, the MLP -------------------------------------------------------------------------


def run_mlp_case(
    t: Trial, x: torch.Tensor, w_gu: torch.Tensor, w_down: torch.Tensor, case: str, want: torch.Tensor | None = None
) -> torch.Tensor:
    y = expect_tensor(
        t.yours.swiglu_mlp(x, w_gu, w_down),
        what=tr("the MLP output ({shape} like x, {dtype})", shape=list(x.shape), dtype=dtype_name(x.dtype)),
        shape=list(x.shape),
        dtype=x.dtype,
    )
    want = t.ref.swiglu_mlp(x, w_gu, w_down) if want is None else want
    try:
        explain_mlp(y, want, x, w_gu, w_down, case, t.ref.drive(mlp_models, x, w_gu, w_down))
    except CheckFailed as failure:
        if failure.hints or x.dim() < 2 or x.reshape(-1, x.shape[-1]).shape[0] < 2:
            raise
        # No misreading of one token's arithmetic fits: see whether the first token alone gives its row of the batch.
        first = x.reshape(-1, x.shape[-1])[:1]
        alone = t.yours.swiglu_mlp(first, w_gu, w_down)
        if isinstance(alone, torch.Tensor) and alone.shape == first.shape and mlp_wrong(alone, y.reshape(-1, x.shape[-1])[:1]).any():
            raise CheckFailed(*failure.lines, tr("token 0 alone gives another output than in the batch"), hint=M.mixes_tokens) from None
        raise
    return y


def mlp_wrong(y: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """float32: 1e-4 · max(1, |expected|); bf16: a few percent of the output's typical size (the rounding of the
    activation, once or twice, moves a sum of I terms by that much)."""
    if want.dtype in (torch.bfloat16, torch.float16):
        scale = float(want.float().abs().mean()) if want.numel() else 0.0
        return (y.float() - want.float()).abs() > 0.08 * scale + 2 * ulp(want)
    return wrong_mask(y, want, atol=1e-4, rtol=1e-4)


def explain_mlp(
    y: torch.Tensor, want: torch.Tensor, x: torch.Tensor, w_gu: torch.Tensor, w_down: torch.Tensor, case: str, models: dict | None = None
) -> None:
    """Explain the first wrong output through its token's gate_up and activation (`models`: `mlp_models`'
    answer; asked of the hidden side when needed if not given)."""
    bad = mlp_wrong(y, want)
    if not bad.any():
        return
    models = models if models is not None else mlp_models(None, x, w_gu, w_down)
    idx = tuple(int(v) for v in bad.nonzero()[0])
    tok, i = idx[:-1], idx[-1]
    half = w_gu.shape[0] // 2
    gu, act = models["gate_up"][tok], models["act"][tok]
    raise CheckFailed(
        tr(
            'case "{case}": x {shape} {dtype}, gate_up_weight {gu_shape} = [2I, H], down_weight {down_shape} = [H, I]',
            case=case,
            shape=list(x.shape),
            dtype=dtype_name(x.dtype),
            gu_shape=list(w_gu.shape),
            down_shape=list(w_down.shape),
        ),
        tr(
            "token {tok}: gate_up = x·gate_up_weightᵀ → gate {gate}, up {up}",
            tok=tok[0] if len(tok) == 1 else list(tok),
            gate=vec(gu[:half], 6),
            up=vec(gu[half:], 6),
        ),
        tr(
            "SiLU(gate)·up = {act}; out[{i}] = Σ_j down_weight[{i}, j]·act[j] = {want}; yours: {got} ({bad} of {total} values differ)",
            act=vec(act, 6),
            i=i,
            want=fmt(want[idx]),
            got=fmt(y[idx]),
            bad=int(bad.sum()),
            total=bad.numel(),
        ),
        hint=mlp_hint(y, models["variants"]),
    )


def mlp_hint(y: torch.Tensor, variants: dict) -> str:
    """The misconception whose MLP output (`mlp_models(...)["variants"]`) reproduces the student's, or ''."""
    for key, why in act_whys() + [("no activation", M.no_activation)]:
        if key in variants and not mlp_wrong(y, variants[key]).any():
            return why
    return ""
