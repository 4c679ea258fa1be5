"""Public checks of ch15 · token ids to logits, and the messages they share with the hidden ones."""

from __future__ import annotations

import torch

from grader.authoring import (
    CheckFailed,
    StudentCallable,
    StudentRaised,
    Trial,
    describe,
    expect_tensor,
    first_wrong,
    fmt,
    mistakes,
    public,
    short,
    vec,
    wrong_mask,
)
from grader.i18n import mark, tr

ATOL = RTOL = 1e-5  # float32 products may sum in another order than the reference's

# ch15-dim-embedding: E [6, 4] whose row r holds 10(r+1)+1 … 10(r+1)+4, ids [[2, 0, 4]] → X [1, 3, 4].
EMBED_TABLE = [[10 * (r + 1) + c + 1 for c in range(4)] for r in range(6)]
EMBED_IDS = [[2, 0, 4]]

# ch15-dim-qkv-linear: X [3, 4] · Wᵀ, W stored [8, 4] = [(2 + 2·1)·2, 4]: q 4 columns, k 2, v 2.
QKV_X = [[1, 0, 2, 1], [0, 1, 1, 0], [2, 1, 0, 1]]
QKV_W = [
    [1, 0, 0, 1],
    [0, 1, 1, 0],
    [1, 1, 0, 0],
    [0, 0, 1, -1],  # q: heads 0 and 1, head_dim 2
    [1, 0, 1, 0],
    [0, -1, 0, 1],  # k: one K/V head
    [2, 0, 0, 0],
    [0, 0, 1, 1],
]  # v
QKV_HEADS, QKV_KV_HEADS, QKV_HEAD_DIM = 2, 1, 2

# Qwen3-0.6B (reference/nanovllm.md §0).
QWEN3_06B = dict(
    hidden_size=1024,
    intermediate_size=3072,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=151936,
    tie_word_embeddings=True,
)
CHECKPOINT_LENS = [3, 2]

# ch15-dim-tensor-parallel: x [2, 3] → column-parallel W1 [3, 4] → row-parallel W2 [4, 3], 2 ranks (math [in, out]).
TP_X = [[1, 2, 0], [0, 1, 3]]
TP_W1 = [[1, 0, 2, 1], [0, 1, 1, 0], [1, 1, 0, 2]]
TP_W2 = [[1, 0, 1], [0, 1, 1], [1, 0, 0], [0, 1, 1]]
TP_RANKS = 2

# ch15-vocab-parallel: ch15.7 splits E [6, 3] (VP_TABLE's rows hold 10(r+1)+1 … 10(r+1)+3) over 2 ranks of 3 rows
# and looks up ids that every rank owns some of; ch15.8 uses the same table as a tied LM head over the same ranks,
# on a prefill of 3 + 2 tokens whose last rows (2 and 4) differ from every other row.
VP_TABLE = [[10 * (r + 1) + c + 1 for c in range(3)] for r in range(6)]
VP_IDS = [4, 1, 5, 0, 3, 2]
VP_RANKS = 2
HEAD_HIDDEN = [[0, 1, 0], [1, 1, 0], [1, 0, 0], [0, 0, 1], [1, -1, 1]]
HEAD_CU = [0, 3, 5]

# ch15-qkv-shards: 4 query heads and 2 KV heads of head_dim 2 over 2 ranks.
SHARD_HEADS, SHARD_KV_HEADS, SHARD_HEAD_DIM, SHARD_RANKS = 4, 2, 2, 2

NAMES = ["embed_tokens", "qkv_proj", "o_proj", "q_norm", "k_norm", "gate_up_proj", "down_proj", "lm_head"]
M = mistakes("ch15")
FIGURE = mark("figure instance")  # a case's name, translated where a message names it


# -- ch15.1 embedding_lookup --------------------------------------------------------------------------


@public("ch15.1", "figure instance: ids [[2, 0, 4]] read three rows of E [6, 4]")
def embed_figure_instance(t: Trial) -> None:
    weight, ids = torch.tensor(EMBED_TABLE, dtype=torch.float32), torch.tensor(EMBED_IDS)
    got = t.yours.embedding_lookup(weight, ids)
    want = t.ref.embedding_lookup(weight, ids)
    if isinstance(got, torch.Tensor) and list(got.shape) == list(want.shape) and got.dtype == want.dtype:
        t.figure("ch15-dim-embedding", table=weight, ids=ids, out=got, expected=want, wrong=wrong_mask(got, want))
    expect_lookup(got, want, weight, ids, FIGURE)


@public("ch15.1", "a flattened batch: ids [N] → [N, H], a repeated id reads its row twice")
def embed_flat(t: Trial) -> None:
    weight = torch.randn(10, 5, generator=t.rng)
    run_lookup_case(t, weight, torch.tensor([7, 7, 3, 0, 9]), mark("ids [5] with a repeat"))


@public("ch15.1", "one id (a 0-d tensor) gives one row [H]")
def embed_scalar(t: Trial) -> None:
    run_lookup_case(t, torch.randn(6, 3, generator=t.rng), torch.tensor(5), mark("one id"))


# -- ch15.2 linear ------------------------------------------------------------------------------------


@public("ch15.2", "figure instance: X [3, 4] · Wᵀ with W stored [8, 4]")
def linear_figure_instance(t: Trial) -> None:
    x, weight = torch.tensor(QKV_X, dtype=torch.float32), torch.tensor(QKV_W, dtype=torch.float32)
    got = t.yours.linear(x, weight)
    want = t.ref.linear(x, weight)
    if isinstance(got, torch.Tensor) and list(got.shape) == list(want.shape) and got.dtype == want.dtype:
        t.figure(
            "ch15-dim-qkv-linear",
            x=x,
            weight=weight,
            y=got,
            y_expected=want,
            y_wrong=wrong_mask(got, want, atol=ATOL, rtol=RTOL),
            num_heads=QKV_HEADS,
            num_kv_heads=QKV_KV_HEADS,
            head_dim=QKV_HEAD_DIM,
        )
    expect_linear(got, want, x, weight, None, FIGURE)


@public("ch15.2", "a square weight: y = x @ W.T, not x @ W")
def linear_square(t: Trial) -> None:
    x = torch.tensor([[1.0, 2.0, 3.0]])
    weight = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 2.0]])
    run_linear_case(t, x, weight, None, mark("square weight [3, 3]"))


@public("ch15.2", "leading batch axes and a bias: x [2, 3, 5], W [4, 5], b [4]")
def linear_batched_bias(t: Trial) -> None:
    x, weight, bias = (torch.randn(s, generator=t.rng) for s in ((2, 3, 5), (4, 5), (4,)))
    run_linear_case(t, x, weight, bias, mark("x [2, 3, 5] with bias"))


@public("ch15.2", "a weight passed as [in, out] raises ValueError naming the convention")
def linear_transposed_weight(t: Trial) -> None:
    expect_value_error_naming(
        t,
        t.yours.linear,
        torch.zeros(3, 4),
        torch.zeros(4, 8),
        because=tr("x has 4 features and the weight [4, 8] is [in, out], not [out, in]"),
        words="[out, in]",
    )


# -- ch15.3 split_qkv ---------------------------------------------------------------------------------


@public("ch15.3", "figure instance: Y [3, 8] split into q 4 | k 2 | v 2")
def split_figure_instance(t: Trial) -> None:
    y = t.ref.linear(torch.tensor(QKV_X, dtype=torch.float32), torch.tensor(QKV_W, dtype=torch.float32))
    case = FIGURE
    got = t.yours.split_qkv(y, QKV_HEADS, QKV_KV_HEADS, QKV_HEAD_DIM)
    parts = split_structure(got, y, QKV_HEADS, QKV_KV_HEADS, QKV_HEAD_DIM, case)
    want = t.ref.split_qkv(y, QKV_HEADS, QKV_KV_HEADS, QKV_HEAD_DIM)
    t.figure(
        "ch15-dim-qkv-linear",
        q=parts[0],
        k=parts[1],
        v=parts[2],
        q_expected=want[0],
        k_expected=want[1],
        v_expected=want[2],
        **{f"{n}_wrong": wrong_mask(p, w) for n, p, w in zip("qkv", parts, want)},
    )
    explain_split(parts, want, y, QKV_HEADS, QKV_KV_HEADS, QKV_HEAD_DIM, case)


@public("ch15.3", "Qwen3-0.6B: 4096 = 2048 | 1024 | 1024")
def split_qwen3(t: Trial) -> None:
    run_split_case(t, coded_qkv([2], 4096), 16, 8, 128, mark("Qwen3-0.6B, 2 tokens"))


@public("ch15.3", "MHA (equal parts) with leading axes [2, 3]")
def split_mha(t: Trial) -> None:
    run_split_case(t, coded_qkv([2, 3], 3 * 4 * 8), 4, 4, 8, "MHA, qkv [2, 3, 96]")


# -- ch15.4 projection_shapes -------------------------------------------------------------------------


@public("ch15.4", "figure instance: Qwen3-0.6B (head_dim 128, not 1024/16)")
def shapes_figure_instance(t: Trial) -> None:
    case, want, trap = "Qwen3-0.6B", t.ref.projection_shapes(QWEN3_06B), trap_shapes(t, QWEN3_06B)
    got = shapes_structure(t.yours.projection_shapes(dict(QWEN3_06B)), want, case)
    t.figure(
        "ch15-qwen3-widths", config=QWEN3_06B, shapes={k: list(v) for k, v in got.items()}, expected={k: list(v) for k, v in want.items()}
    )
    explain_shapes(got, want, QWEN3_06B, case, trap)


@public("ch15.4", "a synthetic config where hidden_size ≠ heads·head_dim, untied")
def shapes_synthetic(t: Trial) -> None:
    run_shapes_case(
        t,
        dict(
            hidden_size=48,
            intermediate_size=80,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            vocab_size=100,
            tie_word_embeddings=False,
        ),
        mark("hidden 48, 4 heads × 16"),
    )


@public("ch15.4", "Llama-3-8B sizes (MHA-sized head_dim, untied, GQA 32/8)")
def shapes_llama(t: Trial) -> None:
    run_shapes_case(
        t,
        dict(
            hidden_size=4096,
            intermediate_size=14336,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            vocab_size=128256,
            tie_word_embeddings=False,
        ),
        mark("Llama-3-8B sizes"),
    )


# -- ch15.5 forward_checkpoints -----------------------------------------------------------------------


@public("ch15.5", "figure instance: Qwen3-0.6B, two prompts of 3 and 2 tokens")
def checkpoints_figure_instance(t: Trial) -> None:
    case, want = FIGURE, t.ref.forward_checkpoints(QWEN3_06B, CHECKPOINT_LENS)
    got = checkpoints_structure(t.yours.forward_checkpoints(dict(QWEN3_06B), list(CHECKPOINT_LENS)), want, case)
    t.figure(
        "ch15-checkpoints",
        prompt_lens=CHECKPOINT_LENS,
        hidden_size=QWEN3_06B["hidden_size"],
        vocab_size=QWEN3_06B["vocab_size"],
        names=[n for n, _ in got],
        shapes=[list(s) for _, s in got],
        expected=[list(s) for _, s in want],
    )
    explain_checkpoints(got, want, QWEN3_06B, CHECKPOINT_LENS, case)


@public("ch15.5", "one request of 7 tokens")
def checkpoints_one_request(t: Trial) -> None:
    run_checkpoints_case(t, QWEN3_06B, [7], mark("one request"))


@public("ch15.5", "a synthetic config, three requests of different lengths")
def checkpoints_three(t: Trial) -> None:
    run_checkpoints_case(t, dict(hidden_size=64, vocab_size=1000), [5, 1, 4], mark("three requests"))


# -- ch15.6 column_parallel_linear, row_parallel_linear -----------------------------------------------


@public("ch15.6", "figure instance: column-parallel x [2, 3] · W1 [3, 4] over 2 ranks")
def column_figure_instance(t: Trial) -> None:
    x, w1, _ = tp_tensors()
    case = mark("figure instance, column-parallel")
    shards, out = column_structure(t.yours.column_parallel_linear(x, w1, TP_RANKS), x, w1, TP_RANKS, case)
    want_shards, want_out = t.ref.column_parallel_linear(x, w1, TP_RANKS)
    t.figure(
        "ch15-dim-tensor-parallel",
        x=x,
        w1=w1,
        shards=shards,
        shards_expected=want_shards,
        shards_wrong=[wrong_mask(s, w, atol=ATOL, rtol=RTOL) for s, w in zip(shards, want_shards)],
        col_out=out,
        col_out_expected=want_out,
        col_out_wrong=wrong_mask(out, want_out, atol=ATOL, rtol=RTOL),
    )
    explain_column(shards, out, x, w1, TP_RANKS, case, t.ref)


@public("ch15.6", "figure instance: row-parallel over the 2 shards · W2 [4, 3]")
def row_figure_instance(t: Trial) -> None:
    x, w1, w2 = tp_tensors()
    x_shards, _ = t.ref.column_parallel_linear(x, w1, TP_RANKS)
    case = mark("figure instance, row-parallel")
    partials, out = row_structure(t.yours.row_parallel_linear(list(x_shards), w2, TP_RANKS), x_shards, w2, TP_RANKS, case)
    want_partials, want_out = t.ref.row_parallel_linear(x_shards, w2, TP_RANKS)
    drawable = isinstance(out, torch.Tensor) and out.dim() == 2 and out.dtype == want_out.dtype
    t.figure(
        "ch15-dim-tensor-parallel",
        w2=w2,
        x_shards=x_shards,
        partials=partials,
        partials_expected=want_partials,
        partials_wrong=[wrong_mask(p, w, atol=ATOL, rtol=RTOL) for p, w in zip(partials, want_partials)],
        row_out=out if drawable else None,
        row_out_expected=want_out,
        row_out_wrong=cells_wrong(out, want_out) if drawable else None,
    )
    explain_row(partials, out, x_shards, w2, TP_RANKS, case, t.ref)


@public("ch15.6", "column-parallel over 4 ranks, and tp = 1 is the plain product")
def column_four_ranks(t: Trial) -> None:
    x, w = torch.randn(3, 5, generator=t.rng), torch.randn(5, 8, generator=t.rng)
    run_column_case(t, x, w, 4, "tp = 4")
    run_column_case(t, x, w, 1, "tp = 1")


@public("ch15.6", "row-parallel over 4 ranks sums to x @ W")
def row_four_ranks(t: Trial) -> None:
    x, w = torch.randn(3, 8, generator=t.rng), torch.randn(8, 5, generator=t.rng)
    run_row_case(t, list(x.split(2, dim=1)), w, 4, "tp = 4")


# -- ch15.7 vocab_parallel_embedding ------------------------------------------------------------------


@public("ch15.7", "figure instance: ids [4, 1, 5, 0, 3, 2] over 2 ranks of E [6, 3]; the all-reduce adds the partials")
def vocab_figure_instance(t: Trial) -> None:
    run_vocab_case(t, torch.tensor(VP_TABLE, dtype=torch.float32), torch.tensor(VP_IDS), VP_RANKS, FIGURE, figure=True)


@public("ch15.7", "tp = 1: the one rank owns every id, the plain lookup")
def vocab_one_rank(t: Trial) -> None:
    run_vocab_case(t, torch.randn(5, 3, generator=t.rng), torch.tensor([4, 0, 0, 2]), 1, "tp = 1")


@public("ch15.7", "tp = 4: repeated ids and the ids at every shard's edges")
def vocab_four_ranks(t: Trial) -> None:
    run_vocab_case(t, torch.randn(12, 4, generator=t.rng), torch.tensor([2, 3, 3, 5, 6, 0, 11, 8, 9, 2]), 4, "tp = 4, V = 12")


# -- ch15.8 parallel_lm_head --------------------------------------------------------------------------


@public("ch15.8", "figure instance: prefill of 3 + 2 tokens, the tied table E [6, 3] over 2 ranks")
def head_figure_instance(t: Trial) -> None:
    run_head_case(
        t,
        torch.tensor(HEAD_HIDDEN, dtype=torch.float32),
        torch.tensor(VP_TABLE, dtype=torch.float32),
        VP_RANKS,
        torch.tensor(HEAD_CU, dtype=torch.int32),
        FIGURE,
        figure=True,
    )


@public("ch15.8", "decode: every row is one sequence's newest token, 4 rows over 2 ranks")
def head_decode(t: Trial) -> None:
    run_head_case(t, torch.randn(4, 5, generator=t.rng), torch.randn(8, 5, generator=t.rng), 2, None, mark("decode"))


@public("ch15.8", "prefill over 4 ranks: prompts of 1, 4 and 2 tokens")
def head_four_ranks(t: Trial) -> None:
    run_head_case(
        t,
        torch.randn(7, 3, generator=t.rng),
        torch.randn(12, 3, generator=t.rng),
        4,
        torch.tensor([0, 1, 5, 7], dtype=torch.int32),
        "prefill, tp = 4",
    )


# -- ch15.9 qkv_shard ---------------------------------------------------------------------------------


@public("ch15.9", "figure instance: 4 query heads, 2 KV heads, head_dim 2, over 2 ranks")
def shard_figure_instance(t: Trial) -> None:
    run_shard_case(t, SHARD_HEADS, SHARD_KV_HEADS, SHARD_HEAD_DIM, SHARD_RANKS, FIGURE, figure=True)


@public("ch15.9", "Qwen3-0.6B (16 query heads, 8 KV heads, head_dim 128) at tp = 2 and tp = 4")
def shard_qwen3(t: Trial) -> None:
    for tp in (2, 4):
        run_shard_case(t, 16, 8, 128, tp, f"Qwen3-0.6B, tp = {tp}")


@public("ch15.9", "tp = 1: one rank holds the whole q | k | v")
def shard_one_rank(t: Trial) -> None:
    run_shard_case(t, 4, 2, 8, 1, "tp = 1")


# -- the explanations, shared with the hidden checks: ch15.1 ---------------------------------------------


def expect_lookup(got, want: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor, case: str) -> torch.Tensor:
    """Require the looked-up rows, explaining the first wrong one in table terms."""
    (V, H), shape = weight.shape, [*ids.shape, weight.shape[1]]
    head = tr('case "{case}": table E [{V}, {H}], ids {shape} = {ids}', case=tr(case), V=V, H=H, shape=list(ids.shape), ids=ids_text(ids))
    if isinstance(got, torch.Tensor) and list(got.shape) != shape:
        hint = ""
        if list(got.shape) == list(ids.shape):
            hint = M.one_number_per_id
        elif list(got.shape) == [ids.numel(), H]:
            hint = M.flattened_ids
        elif list(got.shape) == [H, *ids.shape]:
            hint = M.column_lookup
        raise CheckFailed(
            head,
            tr(
                "expected a {dim}-D tensor of shape {shape} ([*ids.shape, H]); yours: {yours}",
                dim=len(shape),
                shape=shape,
                yours=describe(got),
            ),
            hint=hint,
        )
    out = expect_tensor(got, what=tr("the embeddings of ids {shape}", shape=list(ids.shape)), shape=shape, dtype=weight.dtype)
    rows, flat_ids = out.reshape(-1, H), ids.reshape(-1)
    bad = wrong_mask(rows, want.reshape(-1, H)).any(-1)
    if not bad.any():
        return out
    i = int(bad.nonzero()[0])
    tok = int(flat_ids[i])
    if ids.dim():
        where = "ids" + str([int(w) for w in torch.unravel_index(torch.tensor(i), tuple(ids.shape))]) + f" = {tok}"
    else:
        where = tr("the id is {tok}", tok=tok)
    raise CheckFailed(
        head,
        tr(
            "{where}, so its embedding is row {tok} of E = {row}; yours: {yours}",
            where=where,
            tok=tok,
            row=vec(weight[tok]),
            yours=vec(rows[i]),
        ),
        hint=row_hint(rows, weight, i, tok),
    )


def row_hint(rows: torch.Tensor, weight: torch.Tensor, i: int, tok: int) -> str:
    """Why looked-up row i ([n, H] rows, one per id) is not row `tok` of E: the misconception it comes from."""
    V, H = weight.shape
    same = [r for r in range(V) if torch.equal(weight[r], rows[i])]
    n = rows.shape[0]
    if 1 < n <= V and torch.equal(rows, weight[:n]):
        return M.reshape.format(last=n - 1, n=n, H=H)
    if same and same[0] in (tok - 1, tok + 1):
        return M.off_by_one.format(row=same[0])
    if same:
        return tr("yours is row {row} of E; read row ids[…] = {tok}", row=same[0], tok=tok)
    return M.not_a_row


def ids_text(ids: torch.Tensor) -> str:
    """The ids as written: nested lists when short, the first ones and their count when long."""
    return str(ids.tolist()) if ids.numel() <= 12 else short(ids.reshape(-1).tolist())


def run_lookup_case(t: Trial, weight: torch.Tensor, ids: torch.Tensor, case: str) -> torch.Tensor:
    got = t.yours.embedding_lookup(weight, ids)
    return expect_lookup(got, t.ref.embedding_lookup(weight, ids), weight, ids, case)


# -- ch15.2 ---------------------------------------------------------------------------------------------


def expect_linear(got, want: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, case: str) -> torch.Tensor:
    """Require y = x·Wᵀ + b, explaining the first wrong element as its sum over the `in` axis."""
    out_f, in_f = weight.shape
    if bias is not None:
        head = tr(
            'case "{case}": x {x}, weight stored [out, in] = {w}, bias [{out}]',
            case=tr(case),
            x=list(x.shape),
            w=list(weight.shape),
            out=out_f,
        )
    else:
        head = tr('case "{case}": x {x}, weight stored [out, in] = {w}', case=tr(case), x=list(x.shape), w=list(weight.shape))
    shape = list(want.shape)
    if isinstance(got, torch.Tensor) and list(got.shape) != shape:
        hint = M.w_at_xt if x.dim() == 2 and list(got.shape) == [out_f, x.shape[0]] else ""
        raise CheckFailed(
            head,
            tr(
                "expected y as a {dim}-D tensor of shape {shape} ([..., out]); yours: {yours}",
                dim=len(shape),
                shape=shape,
                yours=describe(got),
            ),
            hint=hint,
        )
    y = expect_tensor(got, what="y", shape=shape, dtype=want.dtype)
    idx = first_wrong(y, want, atol=ATOL, rtol=RTOL)
    if idx is None:
        return y
    *row, j = idx
    xr = x[tuple(row)]
    terms = " + ".join(f"{factor(a)}·{factor(b)}" for a, b in zip(xr.tolist(), weight[j].tolist())) if in_f <= 6 else "…"
    b_sym, b_val = (f" + b[{j}]", f" + {factor(bias[j].item())}") if bias is not None else ("", "")
    formula = f"y{list(idx)} = Σ_c x[{', '.join(map(str, row))}, c]·W[{j}, c]{b_sym} = {terms}{b_val}"
    raise CheckFailed(
        head,
        tr("{formula} = {want}; yours: {yours}", formula=formula, want=fmt(want[idx]), yours=fmt(y[idx])),
        hint=linear_hint(y, x, weight, bias),
    )


def factor(v: float) -> str:
    """A number inside a sum: negatives in parentheses, 1·(−2) rather than 1·-2."""
    return f"({fmt(v).replace('-', '−')})" if v < 0 else fmt(v)


def linear_hint(y: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> str:
    """The misconception a wrong y of the right shape comes from ('' when none fits)."""
    out_f, in_f = weight.shape
    b = 0 if bias is None else bias
    close = lambda v: v.shape == y.shape and torch.allclose(y.double(), v.double(), atol=1e-4, rtol=1e-4)
    if out_f == in_f and close(x @ weight + b):
        return M.x_at_w
    if close(x @ weight.reshape(in_f, out_f) + b):
        return M.reshape_weight
    if bias is not None and close(x @ weight.T):
        return M.no_bias
    return ""


def expect_value_error_naming(t: Trial, fn: StudentCallable, *args, because: str, words: str) -> None:
    """Require a ValueError whose message contains `words` (spaces ignored)."""
    try:
        value = fn(*args)
    except StudentRaised as e:
        if e.not_implemented or not e.is_a("ValueError"):
            raise
        message = e.error.get("message", "")
        if words.replace(" ", "") not in message.replace(" ", ""):
            raise CheckFailed(
                tr("{fn} raised ValueError ({because}), but its message does not name the convention", fn=fn.label, because=because),
                tr("your message: {message}", message=repr(message)),
                hint=M.vague_error.format(words=words),
            ) from None
        return
    raise CheckFailed(
        tr("{fn} should raise ValueError: {because}; yours returned {value} instead", fn=fn.label, because=because, value=describe(value))
    )


def run_linear_case(t: Trial, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, case: str) -> None:
    got = t.yours.linear(x, weight, bias)
    expect_linear(got, t.ref.linear(x, weight, bias), x, weight, bias, case)


# -- ch15.3 ---------------------------------------------------------------------------------------------


def coded_qkv(lead: list[int], width: int) -> torch.Tensor:
    """A qkv whose column c holds c + 0.5 + 10000·row in every token row, so a part names its source columns."""
    rows = torch.arange(int(torch.tensor(lead).prod()) if lead else 1, dtype=torch.float64)[:, None] * 10000
    return (rows + torch.arange(width, dtype=torch.float64) + 0.5).reshape(*lead, width).float()


def split_case(qkv: torch.Tensor, heads: int, kv_heads: int, d: int, case: str) -> str:
    return tr(
        'case "{case}": qkv {shape}, num_heads={heads}, num_kv_heads={kv_heads}, head_dim={d}',
        case=tr(case),
        shape=list(qkv.shape),
        heads=heads,
        kv_heads=kv_heads,
        d=d,
    )


def split_structure(got, qkv: torch.Tensor, heads: int, kv_heads: int, d: int, case: str) -> list[torch.Tensor]:
    """Require (q, k, v) of the right widths, explaining the packing when they are not."""
    lead = list(qkv.shape[:-1])
    sizes = [heads * d, kv_heads * d, kv_heads * d]
    head = split_case(qkv, heads, kv_heads, d, case)
    if type(got) not in (tuple, list) or len(got) != 3 or not all(isinstance(p, torch.Tensor) for p in got):
        raise CheckFailed(head, tr("expected (q, k, v), a tuple of three tensors; yours: {yours}", yours=describe(got)))
    widths = [p.shape[-1] if p.dim() else None for p in got]
    if not all(list(p.shape) == lead + [s] for p, s in zip(got, sizes)):
        hint = ""
        if widths == [sizes[1], sizes[0], sizes[2]] or widths == [sizes[1], sizes[1], sizes[0]]:
            hint = M.k_first
        elif sizes[0] != sizes[1] and widths in (
            [len(c) for c in torch.arange(sum(sizes)).chunk(3)],
            [len(c) for c in torch.arange(sum(sizes)).tensor_split(3)],
        ):
            hint = M.thirds.format(heads=heads, kv_heads=kv_heads, q=sizes[0], kv=sizes[1])
        raise CheckFailed(
            head,
            tr(
                "q is num_heads·head_dim = {heads}·{d} = {q} wide, k and v num_kv_heads·head_dim = {kv_heads}·{d} = {kv} each "
                "({q} + 2·{kv} = {total})",
                heads=heads,
                d=d,
                q=sizes[0],
                kv_heads=kv_heads,
                kv=sizes[1],
                total=qkv.shape[-1],
            ),
            tr(
                "expected shapes q {q}, k {k}, v {v}; yours: {yours}",
                q=lead + [sizes[0]],
                k=lead + [sizes[1]],
                v=lead + [sizes[2]],
                yours=", ".join(describe(p) for p in got),
            ),
            hint=hint,
        )
    for name, p, size in zip("qkv", got, sizes):
        expect_tensor(p, what=name, shape=lead + [size], dtype=qkv.dtype)
    return list(got)


def explain_split(parts: list[torch.Tensor], want: tuple, qkv: torch.Tensor, heads: int, kv_heads: int, d: int, case: str) -> None:
    """Name the columns of qkv that each wrong part holds."""
    q_size, kv_size = heads * d, kv_heads * d
    starts = {"q": 0, "k": q_size, "v": q_size + kv_size}
    index = {v: c for c, v in enumerate(qkv.reshape(-1, qkv.shape[-1])[0].tolist())}
    for name, p, w in zip("qkv", parts, want):
        if first_wrong(p, w) is None:
            continue
        cols = [index.get(v) for v in p.reshape(-1, p.shape[-1])[0].tolist()]
        a = starts[name]
        other = [o for o in "qkv" if o != name and cols and cols[0] == starts[o]]
        raise CheckFailed(
            split_case(qkv, heads, kv_heads, d, case),
            tr(
                "the packing is q | k | v = {q} | {kv} | {kv} columns, so {name} is columns {a}–{b} of qkv; yours holds {span}",
                q=q_size,
                kv=kv_size,
                name=name,
                a=a,
                b=a + w.shape[-1] - 1,
                span=span(cols),
            ),
            hint=M.block_swapped.format(name=name, other=other[0]) if other else "",
        )


def span(cols: list[int | None]) -> str:
    """Columns as 'columns a–b' when contiguous, else a short list."""
    known = [c for c in cols if c is not None]
    if known and len(known) == len(cols) and known == list(range(known[0], known[0] + len(known))):
        return tr("columns {a}–{b}", a=known[0], b=known[-1]) if len(known) > 1 else tr("column {a}", a=known[0])
    shown = ", ".join("?" if c is None else str(c) for c in cols[:8])
    return tr("columns [{cols}]", cols=shown + (", …" if len(cols) > 8 else ""))


def run_split_case(t: Trial, qkv: torch.Tensor, heads: int, kv_heads: int, d: int, case: str) -> list[torch.Tensor]:
    got = t.yours.split_qkv(qkv, heads, kv_heads, d)
    parts = split_structure(got, qkv, heads, kv_heads, d, case)
    explain_split(parts, t.ref.split_qkv(qkv, heads, kv_heads, d), qkv, heads, kv_heads, d, case)
    return parts


# -- ch15.4 ---------------------------------------------------------------------------------------------


def shape_derivations(c: dict) -> dict[str, str]:
    H, I, V, d = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["head_dim"]
    Hq, Hkv = c["num_attention_heads"], c["num_key_value_heads"]
    tie = tr("tied: the same tensor as embed_tokens") if c["tie_word_embeddings"] else tr("untied: its own matrix")
    return {
        "embed_tokens": tr("[V, H] = [{V}, {H}] (one row per token id)", V=V, H=H),
        "qkv_proj": f"[(Hq + 2·Hkv)·d, H] = [({Hq} + 2·{Hkv})·{d}, {H}] = [{(Hq + 2 * Hkv) * d}, {H}]",
        "o_proj": f"[H, Hq·d] = [{H}, {Hq}·{d}] = [{H}, {Hq * d}]",
        "q_norm": tr("[d] = [{d}] (head_dim from the config)", d=d),
        "k_norm": tr("[d] = [{d}] (head_dim from the config)", d=d),
        "gate_up_proj": tr("[2·I, H] = [2·{I}, {H}] = [{I2}, {H}] (gate | up packed)", I=I, H=H, I2=2 * I),
        "down_proj": f"[H, I] = [{H}, {I}]",
        "lm_head": tr("[V, H] = [{V}, {H}] ({tie})", V=V, H=H, tie=tie),
    }


def shapes_structure(got, want: dict, case: str) -> dict:
    if type(got) is not dict:
        raise CheckFailed(tr('case "{case}": expected a dict of weight shapes; yours: {yours}', case=tr(case), yours=describe(got)))
    missing, extra = [n for n in want if n not in got], [n for n in got if n not in want]
    if missing or extra:
        raise CheckFailed(
            tr('case "{case}": expected exactly the keys {keys}', case=tr(case), keys=", ".join(want)),
            tr("missing: {names}", names=", ".join(map(str, missing))) if missing else "",
            tr("not expected: {names}", names=", ".join(map(str, extra))) if extra else "",
        )
    for name in want:
        v = got[name]
        if type(v) is not tuple or not all(type(s) is int for s in v):
            hint = (
                tr("use a tuple of Python ints, e.g. (4096, 1024)")
                if type(v) in (list, tuple)
                else tr("convert a torch.Size (or tensor) to a tuple of ints")
                if "Size" in describe(v)
                else ""
            )
            raise CheckFailed(
                tr('case "{case}": {name} should be a tuple of ints; yours: {yours}', case=tr(case), name=name, yours=describe(v)),
                hint=hint,
            )
    return got


def trap_shapes(t: Trial, config: dict) -> dict | None:
    """The reference's shapes with head_dim taken as hidden_size // num_attention_heads (asked before comparing)."""
    guess = config["hidden_size"] // config["num_attention_heads"]
    return t.ref.projection_shapes(dict(config, head_dim=guess)) if 0 < guess != config["head_dim"] else None


def explain_shapes(got: dict, want: dict, config: dict, case: str, trap: dict | None = None) -> None:
    derivations = shape_derivations(config)
    c = config
    for name in want:
        if got[name] != want[name]:
            raise CheckFailed(
                tr(
                    'case "{case}": {inputs}',
                    case=tr(case),
                    inputs=f"hidden_size={c['hidden_size']}, intermediate_size={c['intermediate_size']}, "
                    f"num_attention_heads={c['num_attention_heads']}, "
                    f"num_key_value_heads={c['num_key_value_heads']}, head_dim={c['head_dim']}, "
                    f"vocab_size={c['vocab_size']}",
                ),
                tr("{name} is stored {derivation}; yours: {yours}", name=name, derivation=derivations[name], yours=list(got[name])),
                hint=shapes_hint(name, got[name], want[name], config, trap),
            )


def shapes_hint(name: str, got: tuple, want: tuple, c: dict, trap: dict | None = None) -> str:
    """The misconception a wrong weight shape comes from ('' when none fits)."""
    H, I, d = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    Hq, Hkv = c["num_attention_heads"], c["num_key_value_heads"]
    if trap is not None and got == trap[name]:
        return M.head_dim_derived.format(d=d, H=H, Hq=Hq, guess=H // Hq)
    if len(want) == 2 and got == want[::-1]:
        return M.out_in_swapped.format(name=name, n_in=want[1], n_out=want[0], shape=list(want))
    if name == "qkv_proj" and got == (3 * Hq * d, H) and Hkv != Hq:
        return M.kv_full_heads.format(Hkv=Hkv, Hq=Hq)
    if name == "qkv_proj" and got == (Hq * d, H):
        return M.q_only
    if name == "qkv_proj" and got == (3 * H, H):
        return M.hidden_widths
    if name == "gate_up_proj" and got == (I, H):
        return M.gate_only
    return ""


def run_shapes_case(t: Trial, config: dict, case: str) -> dict:
    got = t.yours.projection_shapes(dict(config))
    want, trap = t.ref.projection_shapes(config), trap_shapes(t, config)
    explain_shapes(shapes_structure(got, want, case), want, config, case, trap)
    return got


# -- ch15.5 ---------------------------------------------------------------------------------------------


def checkpoints_structure(got, want: list, case: str) -> list:
    names = [n for n, _ in want]
    ok = type(got) in (list, tuple) and len(got) == len(want) and all(type(p) in (list, tuple) and len(p) == 2 for p in got)
    if not ok:
        raise CheckFailed(
            tr(
                'case "{case}": expected a list of {n} (name, shape) pairs: {names}; yours: {yours}',
                case=tr(case),
                n=len(want),
                names=names,
                yours=describe(got),
            )
        )
    got_names = [p[0] for p in got]
    if got_names != names:
        raise CheckFailed(
            tr(
                'case "{case}": expected the checkpoints named {names}, in this order; yours: {yours}',
                case=tr(case),
                names=names,
                yours=got_names,
            )
        )
    for name, shape in got:
        if type(shape) is not tuple or not all(type(s) is int for s in shape):
            raise CheckFailed(
                tr(
                    'case "{case}": the shape of {name} should be a tuple of ints; yours: {yours}',
                    case=tr(case),
                    name=name,
                    yours=describe(shape),
                ),
                hint=tr("convert a torch.Size or list with tuple(...)") if type(shape) is list or "Size" in describe(shape) else "",
            )
    return list(got)


def explain_checkpoints(got: list, want: list, config: dict, lens: list[int], case: str) -> None:
    H, V = config["hidden_size"], config["vocab_size"]
    N, B = sum(lens), len(lens)
    meaning = {
        "input_ids": "[N]",
        "embeddings": "[N, H]",
        "decoder_output": "[N, H]",
        "final_norm": "[N, H]",
        "last_token_hidden": "[B, H]",
        "logits": "[B, V]",
    }
    for (name, shape), (_, expected) in zip(got, want):
        if shape == expected:
            continue
        hint = ""
        if name in ("logits", "last_token_hidden") and shape and shape[0] == N and N != B:
            hint = M.all_logits.format(last=[n - 1 for n in cumulative(lens)[1:]], B=B, N=N)
        elif len(shape) == len(expected) + 1 and B in shape and max(lens) in shape:
            hint = M.batch_axis.format(N=N, longest=max(lens))
        elif name == "last_token_hidden" and shape == (1, H):
            hint = M.one_row.format(B=B)
        elif name != "logits" and V in shape:
            hint = M.vocab_width
        raise CheckFailed(
            tr('case "{case}": {inputs}', case=tr(case), inputs=f"prompt_lens={lens}, hidden_size={H}, vocab_size={V}"),
            (
                tr("N = {sum} = {N} tokens flattened, B = {B} requests", sum=" + ".join(map(str, lens)), N=N, B=B)
                if B > 1
                else tr("N = {N} tokens, B = 1 request", N=N)
            ),
            tr("{name} is {meaning} = {want}; yours: {yours}", name=name, meaning=meaning[name], want=list(expected), yours=list(shape)),
            hint=hint,
        )


def cumulative(lens: list[int]) -> list[int]:
    """cu_seqlens: 0 and the running sums of the lengths."""
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return out


def run_checkpoints_case(t: Trial, config: dict, lens: list[int], case: str) -> list:
    want = t.ref.forward_checkpoints(config, lens)
    got = checkpoints_structure(t.yours.forward_checkpoints(dict(config), list(lens)), want, case)
    explain_checkpoints(got, want, config, lens, case)
    return got


# -- ch15.6 ---------------------------------------------------------------------------------------------


def tp_tensors() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (torch.tensor(TP_X, dtype=torch.float32), torch.tensor(TP_W1, dtype=torch.float32), torch.tensor(TP_W2, dtype=torch.float32))


def column_structure(got, x: torch.Tensor, weight: torch.Tensor, tp: int, case: str):
    """Require (shards, out): tp shards [N, out/tp] and out [N, out]."""
    (N, _), out_f = x.shape, weight.shape[1]
    head = column_head(x, weight, tp, case)
    if type(got) not in (tuple, list) or len(got) != 2 or type(got[0]) not in (list, tuple):
        raise CheckFailed(
            head, tr("expected (shards, out): a list of {tp} tensors and one tensor; yours: {yours}", tp=tp, yours=describe(got))
        )
    shards, out = got
    if len(shards) != tp:
        raise CheckFailed(head, tr("expected one shard per rank, {tp} shards; yours: {n}", tp=tp, n=len(shards)))
    for r, s in enumerate(shards):
        if isinstance(s, torch.Tensor) and list(s.shape) == [N, out_f] and tp > 1:
            raise CheckFailed(
                head,
                tr("rank {r}'s shard should be [N, out/tp] = [{N}, {w}]; yours: {yours}", r=r, N=N, w=out_f // tp, yours=describe(s)),
                hint=M.full_shard.format(w=out_f // tp),
            )
        expect_tensor(s, what=tr("rank {r}'s shard", r=r), shape=[N, out_f // tp], dtype=x.dtype)
    if isinstance(out, torch.Tensor) and list(out.shape) == [N, out_f // tp] and tp > 1:
        raise CheckFailed(
            head, tr("out should be [N, out] = [{N}, {out}]; yours: {yours}", N=N, out=out_f, yours=describe(out)), hint=M.summed_shards
        )
    return list(shards), expect_tensor(out, what="out", shape=[N, out_f], dtype=x.dtype)


def column_head(x: torch.Tensor, weight: torch.Tensor, tp: int, case: str) -> str:
    return tr('case "{case}": x {x}, weight [in, out] = {w}, tp={tp}', case=tr(case), x=list(x.shape), w=list(weight.shape), tp=tp)


def explain_column(shards: list, out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, tp: int, case: str, ref) -> None:
    want_shards, want_out = ref.column_parallel_linear(x, weight, tp)
    w = weight.shape[1] // tp
    head = column_head(x, weight, tp, case)
    for r, (s, ws) in enumerate(zip(shards, want_shards)):
        idx = first_wrong(s, ws, atol=ATOL, rtol=RTOL)
        if idx is None:
            continue
        i, j = idx
        hint = ""
        if tp > 1 and torch.allclose(s, x @ weight[:, r::tp], atol=1e-4, rtol=1e-4):
            hint = M.interleaved.format(w=w, tp=tp)
        elif torch.allclose(s, x @ weight[:, :w], atol=1e-4, rtol=1e-4) and r > 0:
            hint = M.block_start.format(start=r * w)
        raise CheckFailed(
            head,
            tr(
                "rank {r} owns the output columns [{r}·{w}, {r1}·{w}) = [{a}, {b}) of W; its column {j} is y[:, {c}] = x @ W[:, {c}]",
                r=r,
                r1=r + 1,
                w=w,
                a=r * w,
                b=(r + 1) * w,
                j=j,
                c=r * w + j,
            ),
            tr("shard {r}[{i}, {j}]: expected {want}; yours: {yours}", r=r, i=i, j=j, want=fmt(ws[i, j]), yours=fmt(s[i, j])),
            hint=hint,
        )
    idx = first_wrong(out, want_out, atol=ATOL, rtol=RTOL)
    if idx is not None:
        i, j = idx
        raise CheckFailed(
            head,
            tr(
                "out is the shards concatenated in rank order: out[{i}, {j}] is shard {s}[{i}, {k}] = {want}; yours: {yours}",
                i=i,
                j=j,
                s=j // w,
                k=j % w,
                want=fmt(want_out[i, j]),
                yours=fmt(out[i, j]),
            ),
        )


def row_structure(got, x_shards: list, weight: torch.Tensor, tp: int, case: str):
    """Require tp partials [N, out]; returns them and out unchecked (explain_row checks it after the figure)."""
    N, out_f = x_shards[0].shape[0], weight.shape[1]
    head = row_head(x_shards, weight, tp, case)
    if type(got) not in (tuple, list) or len(got) != 2 or type(got[0]) not in (list, tuple):
        raise CheckFailed(
            head, tr("expected (partials, out): a list of {tp} tensors and one tensor; yours: {yours}", tp=tp, yours=describe(got))
        )
    partials, out = got
    if len(partials) != tp:
        raise CheckFailed(head, tr("expected one partial per rank, {tp} partials; yours: {n}", tp=tp, n=len(partials)))
    for r, p in enumerate(partials):
        if isinstance(p, torch.Tensor) and list(p.shape) != [N, out_f]:
            raise CheckFailed(
                head,
                tr(
                    "rank {r}'s partial should have the full output shape [N, out] = [{N}, {out}]; yours: {yours}",
                    r=r,
                    N=N,
                    out=out_f,
                    yours=describe(p),
                ),
                hint=M.partial_shape,
            )
        expect_tensor(p, what=tr("rank {r}'s partial", r=r), shape=[N, out_f], dtype=weight.dtype)
    return list(partials), out


def row_head(x_shards: list, weight: torch.Tensor, tp: int, case: str) -> str:
    return tr(
        'case "{case}": {tp} input shards {shape}, weight [in, out] = {w}',
        case=tr(case),
        tp=tp,
        shape=list(x_shards[0].shape),
        w=list(weight.shape),
    )


def explain_row(partials: list, got_out, x_shards: list, weight: torch.Tensor, tp: int, case: str, ref) -> None:
    want_partials, want_out = ref.row_parallel_linear(x_shards, weight, tp)
    N, out_f = want_out.shape
    part = weight.size(0) // tp  # input rows per shard
    head = row_head(x_shards, weight, tp, case)
    if isinstance(got_out, torch.Tensor) and list(got_out.shape) == [N, tp * out_f] and tp > 1:
        raise CheckFailed(
            head,
            tr("out should be [N, out] = [{N}, {out}]; yours: {yours}", N=N, out=out_f, yours=describe(got_out)),
            hint=M.concat_partials.format(tp=tp),
        )
    out = expect_tensor(got_out, what="out", shape=[N, out_f], dtype=weight.dtype)
    for r, (p, wp) in enumerate(zip(partials, want_partials)):
        idx = first_wrong(p, wp, atol=ATOL, rtol=RTOL)
        if idx is not None:
            i, j = idx
            raise CheckFailed(
                head,
                tr(
                    "rank {r} holds input block [{a}, {b}) (x_shards[{r}]) and the same rows of W: "
                    "partial {r}[{i}, {j}] = Σ_k x_shards[{r}][{i}, k]·W[{a} + k, {j}] = {want}; yours: {yours}",
                    r=r,
                    a=r * part,
                    b=(r + 1) * part,
                    i=i,
                    j=j,
                    want=fmt(wp[i, j]),
                    yours=fmt(p[i, j]),
                ),
            )
    idx = first_wrong(out, want_out, atol=ATOL, rtol=RTOL)
    if idx is not None:
        i, j = idx
        hint = ""
        if torch.allclose(out, want_out / tp, atol=1e-4, rtol=1e-4) and tp > 1:
            hint = M.averaged
        elif tp > 1 and torch.allclose(out, want_partials[0], atol=1e-4, rtol=1e-4):
            hint = M.rank0_only
        raise CheckFailed(
            head,
            tr(
                "out[{i}, {j}] is the sum of the partials: {terms} = {want}; yours: {yours}",
                i=i,
                j=j,
                terms=" + ".join(fmt(p[i, j]) for p in want_partials),
                want=fmt(want_out[i, j]),
                yours=fmt(out[i, j]),
            ),
            hint=hint,
        )


def cells_wrong(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """The check's verdict on each cell of a 2-D `got` whose shape may differ from `want`'s: wrong beyond the
    tolerance where both have the cell, and wrong wherever `want` has none."""
    bad = torch.ones(got.shape, dtype=torch.bool)
    n, m = min(got.shape[0], want.shape[0]), min(got.shape[1], want.shape[1])
    bad[:n, :m] = wrong_mask(got[:n, :m], want[:n, :m], atol=ATOL, rtol=RTOL)
    return bad


def run_column_case(t: Trial, x: torch.Tensor, weight: torch.Tensor, tp: int, case: str) -> None:
    shards, out = column_structure(t.yours.column_parallel_linear(x, weight, tp), x, weight, tp, case)
    explain_column(shards, out, x, weight, tp, case, t.ref)


def run_row_case(t: Trial, x_shards: list, weight: torch.Tensor, tp: int, case: str) -> None:
    partials, out = row_structure(t.yours.row_parallel_linear(list(x_shards), weight, tp), x_shards, weight, tp, case)
    explain_row(partials, out, x_shards, weight, tp, case, t.ref)


# -- ch15.7 ---------------------------------------------------------------------------------------------


def all_reduce(partials: list[torch.Tensor]) -> torch.Tensor:
    """The provided all-reduce: every rank ends with the sum of the ranks' partials."""
    total = partials[0].clone()
    for partial in partials[1:]:
        total = total + partial
    return total


def vocab_head(ids: torch.Tensor, per: int, rank: int, tp: int, case: str) -> str:
    start = rank * per
    return tr(
        'case "{case}": V = {V} rows over tp = {tp} ranks of {per}; rank {rank} holds rows [{start}, {end}); ids {ids}',
        case=tr(case),
        V=tp * per,
        tp=tp,
        per=per,
        rank=rank,
        start=start,
        end=start + per,
        ids=ids_text(ids),
    )


def call_vocab(t: Trial, shard: torch.Tensor, ids: torch.Tensor, rank: int, tp: int, case: str):
    """The student's partial for one rank. An IndexError is explained by asking again with only the ids the rank
    owns: failing again, the global id indexed the shard; passing, an id the rank does not own got through the
    mask."""
    try:
        return t.yours.vocab_parallel_embedding(shard, ids, rank, tp)
    except StudentRaised as e:
        if not e.is_a("IndexError"):
            raise
        per = shard.shape[0]
        start, head = rank * per, vocab_head(ids, per, rank, tp, case)
        line = tr("your function raised IndexError on rank {rank}: {message}", rank=rank, message=e.error.get("message", ""))
        owned = ids[(ids >= start) & (ids < start + per)]
        try:
            t.yours.vocab_parallel_embedding(shard, owned, rank, tp)
        except StudentRaised as again:
            if rank > 0 and again.is_a("IndexError"):
                raise CheckFailed(head, line, hint=M.no_start.format(rank=rank, start=start, end=start + per - 1, last=per - 1)) from None
            raise e from None
        raise CheckFailed(
            head,
            line,
            tr("with only the ids it owns ({ids}) it raises nothing", ids=short(owned.tolist())),
            hint=M.end_inclusive.format(end=start + per, rank=rank, next=rank + 1),
        ) from None


def vocab_structure(got, ids: torch.Tensor, shard: torch.Tensor, rank: int, tp: int, case: str) -> torch.Tensor:
    shape = [ids.shape[0], shard.shape[1]]
    if isinstance(got, torch.Tensor) and list(got.shape) != shape:
        raise CheckFailed(
            vocab_head(ids, shard.shape[0], rank, tp, case),
            tr(
                "rank {rank}'s partial is one row per id, [N, H] = {shape}, zeros where the rank does not own the id; yours: {yours}",
                rank=rank,
                shape=shape,
                yours=describe(got),
            ),
        )
    return expect_tensor(got, what=tr("rank {r}'s partial", r=rank), shape=shape, dtype=shard.dtype)


def explain_vocab(got: torch.Tensor, want: torch.Tensor, shard: torch.Tensor, ids: torch.Tensor, rank: int, tp: int, case: str) -> None:
    """Explain the first wrong row of one rank's partial: an owned id's row, or zeros."""
    bad = wrong_mask(got, want).any(-1)
    if not bad.any():
        return
    per, start = shard.shape[0], rank * shard.shape[0]
    i = int(bad.nonzero()[0])
    tok = int(ids[i])
    if start <= tok < start + per:
        line = tr(
            "ids[{i}] = {tok} is this rank's: local row {tok} − {start} = {local} of its shard, {row}; yours: {yours}",
            i=i,
            tok=tok,
            start=start,
            local=tok - start,
            row=vec(want[i]),
            yours=vec(got[i]),
        )
        hint = ""
    else:
        line = tr(
            "ids[{i}] = {tok} belongs to rank {owner}, so row {i} of rank {rank}'s partial is zeros "
            "(the all-reduce adds the owner's row); yours: {yours}",
            i=i,
            tok=tok,
            owner=tok // per,
            rank=rank,
            yours=vec(got[i]),
        )
        hint = vocab_hint(got, shard, ids, start)
    raise CheckFailed(vocab_head(ids, per, rank, tp, case), line, hint=hint)


def vocab_hint(got: torch.Tensor, shard: torch.Tensor, ids: torch.Tensor, start: int) -> str:
    """The misconception behind non-zero rows for ids the rank does not own ('' when none fits)."""
    per = shard.shape[0]
    above, below = ids >= start + per, ids < start
    if (
        per > 1
        and above.any()
        and all(torch.equal(row, shard[-1]) for row in got[above])
        and all(torch.equal(row, shard[0]) for row in got[below])
    ):
        return M.clamped.format(last=per - 1)
    if all(torch.equal(row, shard[0]) for row in got[above | below]):
        return M.unzeroed
    return ""


def run_vocab_case(t: Trial, table: torch.Tensor, ids: torch.Tensor, tp: int, case: str, *, figure: bool = False) -> None:
    """Every rank's partial, then the provided all-reduce of them against the plain lookup E[ids]."""
    per = table.shape[0] // tp
    shards = list(table.split(per))
    wants = [t.ref.vocab_parallel_embedding(s, ids, r, tp) for r, s in enumerate(shards)]
    full = t.ref.embedding_lookup(table, ids)
    gots = [vocab_structure(call_vocab(t, s, ids, r, tp, case), ids, s, r, tp, case) for r, s in enumerate(shards)]
    total = all_reduce(gots)
    if figure:
        t.figure(
            "ch15-vocab-parallel",
            table=table,
            ids=ids,
            partials=gots,
            partials_expected=wants,
            partials_wrong=[wrong_mask(g, w) for g, w in zip(gots, wants)],
            summed=total,
            summed_expected=full,
            summed_wrong=wrong_mask(total, full),
        )
    for r, (got, want) in enumerate(zip(gots, wants)):
        explain_vocab(got, want, shards[r], ids, r, tp, case)
    idx = first_wrong(total, full)
    if idx is not None:
        raise CheckFailed(
            tr('case "{case}": the all-reduce of your partials should be E[ids]', case=tr(case)),
            tr(
                "row {row} (id {id}): expected {want}; yours: {yours}",
                row=idx[0],
                id=int(ids[idx[0]]),
                want=vec(full[idx[0]]),
                yours=vec(total[idx[0]]),
            ),
        )


# -- ch15.8 ---------------------------------------------------------------------------------------------


def head_head(hidden: torch.Tensor, shards: list[torch.Tensor], cu: torch.Tensor | None, case: str) -> str:
    per, tp = shards[0].shape[0], len(shards)
    step = tr("prefill, cu_seqlens_q = {cu}", cu=cu.tolist()) if cu is not None else tr("decode (no cu_seqlens_q)")
    return tr(
        'case "{case}": hidden {shape}, {step}; V = {V} over tp = {tp} ranks, '
        "rank r computes the logits of tokens [{per}·r, {per}·r + {per})",
        case=tr(case),
        shape=list(hidden.shape),
        step=step,
        V=tp * per,
        tp=tp,
        per=per,
    )


def head_structure(
    got, want: torch.Tensor, hidden: torch.Tensor, shards: list[torch.Tensor], cu: torch.Tensor | None, case: str
) -> torch.Tensor:
    shape, tp, per = list(want.shape), len(shards), shards[0].shape[0]
    if isinstance(got, torch.Tensor) and list(got.shape) != shape:
        hint = ""
        if tp > 1 and list(got.shape) == [shape[0], per]:
            hint = M.summed_logits.format(tp=tp)
        elif tp > 1 and list(got.shape) == [tp * shape[0], per]:
            hint = M.gather_rows.format(tp=tp)
        elif cu is not None and list(got.shape) == [hidden.shape[0], shape[1]] != shape:
            hint = M.lm_head_all_rows.format(last=(cu[1:] - 1).tolist(), B=shape[0], N=hidden.shape[0])
        rows = tr("one row per sequence's last token") if cu is not None else tr("one row per sequence")
        raise CheckFailed(
            head_head(hidden, shards, cu, case),
            tr(
                "expected logits {shape}: {rows}, all V = {V} token ids; yours: {yours}",
                shape=shape,
                rows=rows,
                V=shape[1],
                yours=describe(got),
            ),
            hint=hint,
        )
    return expect_tensor(got, what=tr("the logits"), shape=shape, dtype=want.dtype)


def explain_head(
    got: torch.Tensor, want: torch.Tensor, hidden: torch.Tensor, shards: list[torch.Tensor], cu: torch.Tensor | None, case: str
) -> None:
    idx = first_wrong(got, want, atol=ATOL, rtol=RTOL)
    if idx is None:
        return
    i, j = idx
    tp, per = len(shards), shards[0].shape[0]
    row = int(cu[i + 1]) - 1 if cu is not None else i
    source = (
        tr("sequence {i}'s last token, row cu_seqlens_q[{i1}] − 1 = {row} of hidden", i=i, i1=i + 1, row=row)
        if cu is not None
        else tr("row {i} of hidden", i=i)
    )
    close = lambda v: v.shape == got.shape and torch.allclose(got.double(), v.double(), atol=1e-4, rtol=1e-4)
    kept = hidden if cu is None else hidden.index_select(0, cu[1:].long() - 1)
    hint = ""
    if tp > 1 and close(torch.cat([kept @ w.T for w in shards[::-1]], dim=-1)):
        hint = M.rank_order.format(tp=tp)
    elif cu is not None and close(torch.cat([hidden.index_select(0, cu[:-1].long()) @ w.T for w in shards], dim=-1)):
        hint = M.first_token_rows
    raise CheckFailed(
        head_head(hidden, shards, cu, case),
        tr(
            "logits[{i}, {j}] is token {j}'s logit: rank {rank}'s local column {col}, for {source}: expected {want}; yours: {yours}",
            i=i,
            j=j,
            rank=j // per,
            col=j % per,
            source=source,
            want=fmt(want[i, j]),
            yours=fmt(got[i, j]),
        ),
        hint=hint,
    )


def run_head_case(
    t: Trial, hidden: torch.Tensor, weight: torch.Tensor, tp: int, cu: torch.Tensor | None, case: str, *, figure: bool = False
) -> None:
    shards = list(weight.split(weight.shape[0] // tp))
    want = t.ref.parallel_lm_head(hidden, shards, cu)
    got = head_structure(t.yours.parallel_lm_head(hidden, list(shards), cu), want, hidden, shards, cu, case)
    if figure:
        kept = hidden if cu is None else hidden.index_select(0, cu[1:].long() - 1)
        t.figure(
            "ch15-vocab-parallel",
            hidden=hidden,
            cu_seqlens_q=cu,
            local=[kept @ w.T for w in shards],
            logits=got,
            logits_expected=want,
            logits_wrong=wrong_mask(got, want, atol=ATOL, rtol=RTOL),
        )
    explain_head(got, want, hidden, shards, cu, case)


# -- ch15.9 ---------------------------------------------------------------------------------------------


def shard_derivation(s: str, heads: int, kv: int, d: int, tp: int, rank: int) -> str:
    """The reference's (offset, start, size) written out in the chapter's terms."""
    q_rows, kv_rows = heads // tp * d, kv // tp * d
    size = q_rows if s == "q" else kv_rows
    share = f"({heads}/{tp})·{d} = {q_rows}" if s == "q" else f"({kv}/{tp})·{d} = {kv_rows}"
    offset = {"q": "0", "k": f"(Hq/tp)·d = {q_rows}", "v": f"(Hq/tp + Hkv/tp)·d = {q_rows + kv_rows}"}[s]
    return f"size = {share}, offset = {offset}, start = rank·size = {rank}·{size} = {rank * size}"


def shard_structure(got, s: str, rank: int, case: str) -> tuple[int, int, int]:
    if type(got) is not tuple or len(got) != 3 or not all(type(v) is int for v in got):
        hint = tr("return a tuple of three Python ints, (offset, start, size)") if type(got) in (list, tuple) else ""
        raise CheckFailed(
            tr(
                'case "{case}": qkv_shard("{s}", …, rank={rank}) should return (offset, start, size), '
                "a tuple of three ints; yours: {yours}",
                case=tr(case),
                s=s,
                rank=rank,
                yours=describe(got),
            ),
            hint=hint,
        )
    return got


def explain_shards(got: dict, want: dict, heads: int, kv: int, d: int, tp: int, case: str) -> None:
    for (rank, s), w in want.items():
        g = got[rank, s]
        if g == w:
            continue
        hint = ""
        if s == "k" and g[0] == 0:
            hint = M.k_offset_zero.format(q_rows=heads // tp * d)
        elif tp > 1 and s != "q" and g[0] == {"k": heads * d, "v": (heads + kv) * d}[s]:
            hint = M.global_offset.format(offset=w[0])
        elif s != "q" and heads != kv and g[2] == heads // tp * d:
            hint = M.kv_by_q_heads.format(kv=kv, tp=tp, d=d, size=w[2])
        elif rank > 0 and g[1] == 0 and w[1] > 0:
            hint = M.shard_zero.format(rank=rank, start=w[1])
        raise CheckFailed(
            tr(
                'case "{case}": num_heads={heads}, num_kv_heads={kv}, head_dim={d}, tp={tp}; each rank holds a fused '
                "[({heads}/{tp} + 2·{kv}/{tp})·{d}, H] = [{rows}, H] weight packed q | k | v",
                case=tr(case),
                heads=heads,
                kv=kv,
                d=d,
                tp=tp,
                rows=(heads + 2 * kv) // tp * d,
            ),
            tr('rank {rank}, "{s}": {derivation}', rank=rank, s=s, derivation=shard_derivation(s, heads, kv, d, tp, rank)),
            tr("(offset, start, size): expected {want}; yours: {yours}", want=w, yours=g),
            hint=hint,
        )


def shard_layout(triples: dict, heads: int, kv: int, d: int, tp: int) -> list[list[str]]:
    """Each rank's fused weight, row by row, as the loaded row each triple copies there ("q3": row 3 of q_proj;
    "" for a row nothing fills); rows a triple puts outside the weight are dropped."""
    rows = (heads + 2 * kv) // tp * d
    layout = [[""] * rows for _ in range(tp)]
    for (rank, s), (offset, start, size) in triples.items():
        for k in range(max(size, 0)):
            if 0 <= offset + k < rows:
                layout[rank][offset + k] = f"{s}{start + k}"
    return layout


def run_shard_case(t: Trial, heads: int, kv: int, d: int, tp: int, case: str, *, figure: bool = False) -> None:
    keys = [(rank, s) for rank in range(tp) for s in "qkv"]
    want = {key: t.ref.qkv_shard(key[1], heads, kv, d, tp, key[0]) for key in keys}
    got = {key: shard_structure(t.yours.qkv_shard(key[1], heads, kv, d, tp, key[0]), key[1], key[0], case) for key in keys}
    if figure:
        mine, theirs = shard_layout(got, heads, kv, d, tp), shard_layout(want, heads, kv, d, tp)
        t.figure(
            "ch15-qkv-shards",
            num_heads=heads,
            num_kv_heads=kv,
            head_dim=d,
            tp=tp,
            triples=[[list(got[rank, s]) for s in "qkv"] for rank in range(tp)],
            triples_expected=[[list(want[rank, s]) for s in "qkv"] for rank in range(tp)],
            layout=mine,
            layout_expected=theirs,
            layout_wrong=[[a != b for a, b in zip(m, w)] for m, w in zip(mine, theirs)],
        )
    explain_shards(got, want, heads, kv, d, tp, case)
