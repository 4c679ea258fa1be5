"""Hidden checks of ch16 · attention, step by step: random shapes and dtypes from the grading seed,
a split measured to copy nothing, nano-vllm's flatten, agreement with torch's scaled_dot_product_attention,
large scores, and bad inputs."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from grader.authoring import CheckFailed, OverBudget, Trial, first_wrong, fmt, hidden
from grader.authoring.source import first_line_with
from grader.checks.ch16 import (
    M,
    call_steps,
    expect_split,
    explain_steps,
    numbered,
    run_merge_case,
    run_split_case,
    run_steps_case,
    steps_case,
)
from grader.hidden.ch16_models import causal
from grader.i18n import mark, tr

DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.int64)

# x is 16 MiB; the call may use SPLIT_SPARE beyond it (x crosses into the student's process and counts; so do the call,
# every process it starts and its reply). Measured by the run's memory budget (tests/test_ch16.py): the reference uses
# about 1 MiB beyond x, and .contiguous(), .clone(), torch.stack of the heads and reshape(…).permute(…).contiguous()
# each about 17 MiB, a full copy of x: 4× SPLIT_SPARE.
SPLIT_X, SPLIT_HEADS, SPLIT_SPARE = (2, 512, 4096), 32, 4 << 20


# -- ch16.1 -----------------------------------------------------------------------------------------


@hidden("ch16.1", "random shapes and dtypes")
def split_random(t: Trial) -> None:
    for _ in range(12):
        B, T, H, d = t.random.randint(1, 3), t.random.randint(0, 7), t.random.choice([1, 2, 3, 4, 8]), t.random.choice([1, 2, 3, 8, 64])
        dtype = t.random.choice(DTYPES)
        x = random_tensor(t, (B, T, H * d), dtype)
        run_split_case(t, x, H, f"B={B}, T={T}, H={H}, d={d}, {str(dtype).removeprefix('torch.')}")


@hidden("ch16.1", "T = H = d: a right shape with the wrong axes still fails")
def split_square(t: Trial) -> None:
    # Every size alike, so any permutation of the [B, T, H, d] view has the expected shape.
    for B, n in ((2, 4), (1, 3)):
        run_split_case(t, torch.randn(B, n, n * n, generator=t.rng), n, f"B={B}, T = H = d = {n}")


@hidden("ch16.1", "Qwen3-0.6B's keys: [1, 5, 1024] into 8 K/V heads of width 128")
def split_qwen3_kv(t: Trial) -> None:
    # kv_size = num_key_value_heads · head_dim = 8 · 128 = 1024.
    run_split_case(t, torch.randn(1, 5, 1024, generator=t.rng), 8, mark("Qwen3-0.6B k, 5 tokens"))


@hidden("ch16.1", "the split is a view: no number is copied (measured)")
def split_no_copy(t: Trial) -> None:
    x, H = torch.randn(*SPLIT_X, generator=t.rng), SPLIT_HEADS
    (B, T, W), case = x.shape, tr("B={B}, T={T}, {H} heads of width {d}", B=SPLIT_X[0], T=SPLIT_X[1], H=H, d=SPLIT_X[2] // H)
    try:
        call = t.yours.split_heads.run(x, H, memory=x.nbytes + SPLIT_SPARE)
    except OverBudget as e:
        found = first_line_with(t.lines_of("split_heads"), *COPIES)
        used = dict(used=e.beyond(x.nbytes), spare=mib(SPLIT_SPARE))
        if found:
            line = tr(
                "your split_heads used {used} beyond x, where this check allows {spare} (line {n}: {code})",
                n=found[1],
                code=found[2],
                **used,
            )
        else:
            line = tr("your split_heads used {used} beyond x, where this check allows {spare}", **used)
        raise CheckFailed(
            tr('case "{case}": x [{B}, {T}, {W}] float32 is {size}', case=case, B=B, T=T, W=W, size=mib(x.nbytes)),
            line,
            tr(
                "it copied the numbers. Splitting heads moves no number: view(B, T, H, d) changes the shape and "
                "transpose(1, 2) swaps two strides, both without copying (nano-vllm's q.view(-1, num_heads, head_dim) "
                "is a view of the qkv output)"
            ),
            hint=COPIES[found[0]] if found else "",
        ) from None
    expect_split(call.value, x, t.ref.split_heads(x, H), H, case)


# -- ch16.2 -----------------------------------------------------------------------------------------


@hidden("ch16.2", "merge undoes split for random shapes and dtypes")
def merge_random(t: Trial) -> None:
    for _ in range(12):
        B, T, H, d = t.random.randint(1, 3), t.random.randint(0, 7), t.random.choice([1, 2, 3, 4, 8]), t.random.choice([1, 2, 3, 8, 64])
        dtype = t.random.choice(DTYPES)
        x = random_tensor(t, (B, T, H * d), dtype)
        run_merge_case(t, t.ref.split_heads(x, H), f"B={B}, H={H}, T={T}, d={d}, {str(dtype).removeprefix('torch.')}", want=x)


@hidden("ch16.2", "T = H: a bare reshape has the right shape and the wrong rows")
def merge_square(t: Trial) -> None:
    for B, n, d in ((2, 4, 8), (1, 3, 3)):
        run_merge_case(t, torch.randn(B, n, n, d, generator=t.rng), f"B={B}, H = T = {n}, d={d}")


@hidden("ch16.2", "nano-vllm's layout: merging [1, nh, N, hd] gives o.flatten(1) of the token-major o [N, nh, hd]")
def merge_like_nanovllm(t: Trial) -> None:
    # nano-vllm's attention output is o [N, nh, hd]; Qwen3Attention flattens it from dim 1 for o_proj.
    o = torch.randn(7, 16, 128, generator=t.rng)
    heads = o.transpose(0, 1)[None]
    run_merge_case(t, heads, mark("Qwen3-0.6B: 7 tokens, 16 heads of width 128"), want=o.flatten(1)[None])


@hidden("ch16.2", "a non-contiguous input: [B, H, T, d] as a transposed view of [B, T, H, d]")
def merge_view(t: Trial) -> None:
    x = torch.randn(2, 5, 3, 4, generator=t.rng).transpose(1, 2)  # crosses to the student as a view
    run_merge_case(t, x, tr("B=2, H=3, T=5, d=4, a view with strides {strides}", strides=list(x.stride())))


@hidden("ch16.2", "one token, one head: the edges")
def merge_edges(t: Trial) -> None:
    run_merge_case(t, torch.randn(4, 8, 1, 16, generator=t.rng), mark("a decode step: 4 sequences of 1 token"))
    run_merge_case(t, numbered((2, 1, 3, 5)), mark("a single head"))


# -- ch16.3 -----------------------------------------------------------------------------------------


@hidden("ch16.3", "agreement with scaled_dot_product_attention, no mask, S ≠ T, custom scales")
def sdpa_no_mask(t: Trial) -> None:
    for i in range(8):
        T, S = t.random.randint(1, 6), t.random.randint(1, 12)
        d, dv = t.random.choice([2, 8, 16, 64]), t.random.choice([2, 8, 16, 64])
        scale = [None, None, 1.0, round(t.random.uniform(0.05, 2.0), 3)][i % 4]
        dtype = torch.float64 if i % 3 == 2 else torch.float32
        sdpa_case(t, *random_qkv(t, T, S, d, dv, dtype), None, scale, f"T={T}, S={S}, d={d}, dv={dv}, {str(dtype).removeprefix('torch.')}")


@hidden("ch16.3", "agreement with scaled_dot_product_attention, random and causal masks")
def sdpa_masks(t: Trial) -> None:
    for i in range(8):
        T = t.random.randint(1, 6)
        S = T + t.random.choice([0, 0, 1, 5])
        d = t.random.choice([4, 16, 64])
        mask = causal(T, S) if i % 2 else random_mask(t, T, S)
        name = tr("T={T}, S={S}, d={d}, causal mask", T=T, S=S, d=d) if i % 2 else tr("T={T}, S={S}, d={d}, random mask", T=T, S=S, d=d)
        sdpa_case(t, *random_qkv(t, T, S, d, d), mask, None, name)


@hidden("ch16.3", "masked keys get probability exactly 0, rows sum to 1 (scores near 0)")
def exact_zeros(t: Trial) -> None:
    # Scores near 0: a finite fill such as −100 would leave exp(−100) ≈ 3.7e−44, not 0, in float32.
    for _ in range(4):
        q, k, v = random_qkv(t, 6, 9, 16, 16)
        sdpa_case(t, q * 0.1, k, v, random_mask(t, 6, 9), None, mark("6 queries over 9 keys, scores near 0"))


@hidden("ch16.3", "large scores (about 1e4) stay finite: a stable softmax")
def large_scores(t: Trial) -> None:
    # q = [0.5]·4 and k_j = c_j·[1, 1, 1, 1]: scores[0, j] = 0.5·4·c_j / √4 = c_j, exactly, in float32.
    c = torch.tensor([10000.0, 9999.0, 9998.0, 5000.0])
    k, v = c[:, None].expand(4, 4).contiguous(), torch.randn(4, 3, generator=t.rng)
    q = torch.tensor([[0.5] * 4, [-0.5] * 4])
    run_steps_case(t, q, k, v, case=mark("scores 1e4, 9999, 9998, 5000 and their negatives"))
    mask = torch.tensor([[False, True, True, True], [True, True, True, False]])
    run_steps_case(t, q, k, v, mask, case=mark("scores about ±1e4, the largest key hidden"))


@hidden("ch16.3", "blind queries (an inverted causal mask, no keys at all) raise ValueError")
def steps_blind_queries(t: Trial) -> None:
    z = torch.zeros
    t.expect_raises(
        ValueError,
        t.yours.attention_steps,
        z(3, 4),
        z(3, 4),
        z(3, 4),
        mask=~causal(3),
        because=tr("in this (inverted causal) mask query 2 may attend no key: its row is all False"),
    )
    t.expect_raises(
        ValueError, t.yours.attention_steps, z(2, 4), z(0, 4), z(0, 4), because=tr("with no keys at all no query has anything to attend")
    )


# -- helpers -------------------------------------------------------------------------------------------


def random_tensor(t: Trial, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.int64:
        return torch.randint(-1000, 1000, shape, generator=t.rng)
    return torch.randn(shape, generator=t.rng).to(dtype)


def mib(n: int) -> str:
    return f"{n / 2**20:,.4g} MiB"


COPIES = {".contiguous(": M.contiguous_copy, ".clone(": M.clone_copy, "stack(": M.stack_copy, "cat(": M.cat_copy, ".copy_(": M.copy_into}
"""The copying calls a split can hold, each with its mistake's hint."""


def random_qkv(
    t: Trial, T: int, S: int, d: int, dv: int, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (
        torch.randn(T, d, generator=t.rng, dtype=dtype),
        torch.randn(S, d, generator=t.rng, dtype=dtype),
        torch.randn(S, dv, generator=t.rng, dtype=dtype),
    )


def random_mask(t: Trial, T: int, S: int) -> torch.Tensor:
    """Each query sees a random non-empty subset of the keys."""
    mask = torch.rand(T, S, generator=t.rng) < t.random.uniform(0.2, 0.8)
    mask[torch.arange(T), torch.randint(0, S, (T,), generator=t.rng)] = True
    return mask


def sdpa_case(t: Trial, q, k, v, mask, scale, case: str) -> None:
    """The student's out must equal torch's scaled_dot_product_attention; scores and probs the reference's."""
    kw = ({"mask": mask} if mask is not None else {}) | ({"scale": scale} if scale is not None else {})
    want = t.ref.attention_steps(q, k, v, **kw)
    parts = call_steps(t, q, k, v, mask, scale, case=case)
    oracle = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    explain_steps(parts, want | {"out": oracle}, q, k, v, mask, scale, case)
    sums = parts["probs"].double().sum(-1)
    bad = first_wrong(sums, torch.ones_like(sums), atol=1e-5)
    if bad is not None:
        raise CheckFailed(
            steps_case(q, k, v, mask, scale, case),
            tr(
                "row {row} of your probs sums to {sum}: each query's probabilities over the keys must sum to 1",
                row=bad[0],
                sum=fmt(sums[bad]),
            ),
        )
