"""Hidden checks of ch18 · grouped-query attention: random instances from the grading seed, real
model shapes, agreement with torch's scaled_dot_product_attention, no copy of K/V (measured), edge cases."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from grader.authoring import CheckFailed, OverBudget, Trial, hidden, mistakes
from grader.authoring.source import first_line_with
from grader.checks.ch18 import expect_output, explain_output, random_qkv, run_attention_case, run_bytes_case, run_mapping_case
from grader.hidden.ch18_models import end_aligned
from grader.i18n import tr

# (name, num_layers, num_heads, num_kv_heads, head_dim) of real models, from their config.json.
REAL_MODELS = [
    ("Qwen3-0.6B", 28, 16, 8, 128),
    ("Qwen3-32B", 64, 64, 8, 128),
    ("Llama-3-8B", 32, 32, 8, 128),
    ("Llama-3-70B", 80, 64, 8, 128),
    ("Qwen2.5-7B", 28, 28, 4, 128),
    ("Falcon-7B (MQA)", 32, 71, 1, 64),
    ("GPT-2 (MHA)", 12, 12, 12, 64),
]

# (T, S, Hq, Hkv, d, causal): a chunk of 3 queries under GQA (group 8) and an MQA decode step, over 8192 keys of
# width 128: K and V are 8 MiB each (4 MiB with one K/V head), a copy of either for every query head 64 MiB. The
# call may use KV_SPARE beyond q, k, v. Measured with this limit (a fresh student process capped at its own size
# plus the budget; 2-core machine): the reference needs 3 MiB (GQA) and 1.5 MiB (MQA) beyond its inputs, in 0.05 s;
# repeat_interleave of K and V and expand(…).reshape need 131 MiB, a broadcasting matmul against K as
# [Hkv, 1, d, S] 67 MiB: 4× KV_SPARE and more. (With one K/V head the last two copy nothing: torch folds the
# size-1 axis, so only the GQA case catches them.)
KV_CASES = ((3, 8192, 16, 2, 128, True), (1, 8192, 16, 1, 128, False))
KV_SPARE = 16 << 20

M = mistakes("ch18")


# -- ch18.1 ---------------------------------------------------------------------------------------------


@hidden("ch18.1", "random head counts, consecutive groups")
def random_groups(t: Trial) -> None:
    for _ in range(15):
        num_kv_heads, group = t.random.choice([1, 2, 3, 4, 8, 16]), t.random.choice([1, 2, 3, 4, 5, 8])
        num_heads = num_kv_heads * group
        run_mapping_case(t, num_heads, num_kv_heads, sample_heads(t, num_heads, num_kv_heads))


@hidden("ch18.1", "real models: Qwen3, Llama-3, Qwen2.5, Falcon (MQA), GPT-2 (MHA)")
def real_model_groups(t: Trial) -> None:
    for _, _, num_heads, num_kv_heads, _ in REAL_MODELS:
        run_mapping_case(t, num_heads, num_kv_heads, sample_heads(t, num_heads, num_kv_heads, 6))


@hidden("ch18.1", "tensor parallelism: each rank's heads keep the grouping")
def tensor_parallel_groups(t: Trial) -> None:
    # nano-vllm: rank r holds q heads [r·H/tp, …) and kv heads [r·Hkv/tp, …); per rank the same rule applies.
    for tp in (2, 4, 8):
        run_mapping_case(t, 64 // tp, 8 // tp)


# -- ch18.2 ---------------------------------------------------------------------------------------------


@hidden("ch18.2", "agreement with scaled_dot_product_attention: MHA, GQA, MQA, causal, S ≥ T")
def sdpa_causal(t: Trial) -> None:
    fixed = [(4, 4, 4, 4, 16), (4, 9, 8, 2, 16), (3, 11, 8, 1, 32)]  # MHA, GQA, MQA
    for T, S, Hq, Hkv, d in fixed + [random_shape(t) for _ in range(7)]:
        q, k, v = random_qkv(t, T, S, Hq, Hkv, d)
        case = tr("T={T}, S={S}, Hq={Hq}, Hkv={Hkv}, d={d}, causal", T=T, S=S, Hq=Hq, Hkv=Hkv, d=d)
        run_attention_case(t, q, k, v, case=case, want=sdpa(q, k, v, True, None))


@hidden("ch18.2", "agreement with scaled_dot_product_attention: not causal, custom scales")
def sdpa_not_causal(t: Trial) -> None:
    for i in range(8):
        T, S, Hq, Hkv, d = random_shape(t)
        S = T + t.random.randint(0, 8)
        scale = [None, 1.0, 0.05, round(t.random.uniform(0.1, 2.0), 3)][i % 4]
        q, k, v = random_qkv(t, T, S, Hq, Hkv, d)
        run_attention_case(
            t,
            q,
            k,
            v,
            causal=False,
            scale=scale,
            case=tr("T={T}, S={S}, Hq={Hq}, Hkv={Hkv}, d={d}, not causal, scale {scale}", T=T, S=S, Hq=Hq, Hkv=Hkv, d=d, scale=scale),
            want=sdpa(q, k, v, False, scale),
        )


@hidden("ch18.2", "Qwen3-0.6B shapes: 16 query heads over 8 K/V heads, head_dim 128")
def qwen3_shapes(t: Trial) -> None:
    # A chunked prefill (5 new after 7 cached) and a decode step; the default scale is 1/√128.
    for T, S in ((5, 12), (1, 30)):
        q, k, v = random_qkv(t, T, S, 16, 8, 128)
        run_attention_case(t, q, k, v, case=tr("Qwen3-0.6B heads, T={T}, S={S}", T=T, S=S))


@hidden("ch18.2", "no per-query-head copy of K or V is created (measured)")
def no_kv_copy(t: Trial) -> None:
    for T, S, Hq, Hkv, d, causal in KV_CASES:
        q, k, v = random_qkv(t, T, S, Hq, Hkv, d)
        inputs = q.nbytes + k.nbytes + v.nbytes
        try:
            call = t.yours.gqa_attention.run(q, k, v, causal=causal, memory=inputs + KV_SPARE)
        except OverBudget as e:
            raise explain_copy(e, t.lines_of("gqa_attention"), inputs, T, S, Hq, Hkv, d, k.element_size()) from None
        out = expect_output(call.value, q)
        # No hints here (they would model every misconception at this size): the smaller checks explain values.
        explain_output(
            out,
            t.ref.gqa_attention(q, k, v, causal=causal),
            q,
            k,
            v,
            causal=causal,
            scale=None,
            case=f"T={T}, S={S}, Hq={Hq}, Hkv={Hkv}, d={d}",
            variants={},
        )


@hidden("ch18.2", "large scores stay finite (a stable softmax)")
def large_scores(t: Trial) -> None:
    # Scores up to ~±150: exp() of them overflows float32 unless each row's maximum is subtracted first.
    q, k, v = random_qkv(t, 4, 10, 4, 2, 16, magnitude=50.0)
    got = t.yours.gqa_attention(q, k, v)
    out = expect_output(got, q)
    explain_output(
        out, t.ref.gqa_attention(q, k, v), q, k, v, causal=True, scale=None, case=tr("scores up to about ±150"), atol=1e-4, rtol=1e-4
    )


# -- ch18.3 ---------------------------------------------------------------------------------------------


@hidden("ch18.3", "random configurations")
def random_bytes(t: Trial) -> None:
    for _ in range(20):
        run_bytes_case(
            t,
            t.random.randint(1, 128),
            t.random.choice([1, 2, 4, 8, 16, 32]),
            t.random.choice([32, 64, 80, 96, 128, 256]),
            t.random.randint(0, 1 << 20),
            t.random.choice([1, 2, 4]),
        )


@hidden("ch18.3", "real models: a 32k context in bf16, fp8, fp32, per tensor-parallel rank")
def real_model_bytes(t: Trial) -> None:
    for _, layers, _, kv_heads, head_dim in REAL_MODELS:
        for dtype_bytes in (2, 1, 4):
            run_bytes_case(t, layers, kv_heads, head_dim, 32768, dtype_bytes)
    for tp in (2, 4, 8):  # Qwen3-0.6B per rank: num_kv_heads = 8 / tp
        run_bytes_case(t, 28, 8 // tp, 128, 256, 2)


@hidden("ch18.3", "huge caches stay exact (beyond 2^53)")
def huge_exact(t: Trial) -> None:
    for _ in range(3):
        args = (
            t.random.randint(10**5, 10**6) | 1,
            t.random.choice([3, 7, 9]),
            t.random.randint(10**4, 10**5) | 1,
            t.random.randint(10**9, 10**10) | 1,
            t.random.choice([1, 3]),
        )
        assert float(t.ref.kv_cache_bytes(*args)) != t.ref.kv_cache_bytes(*args)  # a float cannot hold it
        run_bytes_case(t, *args)


# -- helpers ---------------------------------------------------------------------------------------------


def sample_heads(t: Trial, num_heads: int, num_kv_heads: int, count: int = 10) -> list[int]:
    """Group boundaries plus random heads, sorted, at most `count` + 4 of them."""
    group = num_heads // num_kv_heads
    heads = {0, group - 1, min(group, num_heads - 1), num_heads - 1}
    heads |= {t.random.randrange(num_heads) for _ in range(count)}
    return sorted(heads)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None) -> torch.Tensor:
    """torch's scaled_dot_product_attention in the course's layout, K/V repeated here (on the grader's side)
    with consecutive groups, and an explicit end-aligned bool mask (SDPA's is_causal is top-left aligned)."""
    group = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    mask = end_aligned(q.shape[0], k.shape[0]) if causal else None
    out = F.scaled_dot_product_attention(q.transpose(0, 1), kk.transpose(0, 1), vv.transpose(0, 1), attn_mask=mask, scale=scale)
    return out.transpose(0, 1)


def random_shape(t: Trial) -> tuple[int, int, int, int, int]:
    num_kv_heads, group = t.random.choice([1, 2, 4]), t.random.choice([1, 2, 4])
    T = t.random.randint(1, 8)
    return T, T + t.random.choice([0, 0, 1, 5, 17]), num_kv_heads * group, num_kv_heads, t.random.choice([8, 16, 64])


def mib(n: int) -> str:
    return f"{n / 2**20:,.4g} MiB"


def explain_copy(
    e: OverBudget, code: list[tuple[int, str]], inputs: int, T: int, S: int, Hq: int, Hkv: int, d: int, itemsize: int
) -> CheckFailed:
    """The GQA lesson for a call that used more memory than the check allows (it fits easily without copies);
    `code` is the student's gqa_attention as text, where the copying line is looked for."""
    group = Hq // Hkv
    repeat = first_line_with(code, "repeat_interleave", "repeat(", "index_select", "cat(", "stack(")
    expand = first_line_with(code, "expand(")
    matmul = first_line_with(code, "@", "matmul")
    found = repeat or expand or matmul
    kv, per_head = S * Hkv * d, S * Hq * d
    fields = dict(T=T, S=S, Hq=Hq, Hkv=Hkv, group=group, d=d, kv=f"{kv:,}", kv_size=mib(kv * itemsize))
    used = dict(used=e.beyond(inputs), allowed=mib(KV_SPARE), per_head=f"{per_head:,}", per_head_size=mib(per_head * itemsize))
    lines = [
        tr(
            "case: T={T} queries, S={S} keys, Hq={Hq} query heads over Hkv={Hkv} K/V head (group {group}), d={d}; "
            "K and V hold S·Hkv·d = {kv} numbers each ({kv_size})",
            **fields,
        )
        if Hkv == 1
        else tr(
            "case: T={T} queries, S={S} keys, Hq={Hq} query heads over Hkv={Hkv} K/V heads (group {group}), d={d}; "
            "K and V hold S·Hkv·d = {kv} numbers each ({kv_size})",
            **fields,
        ),
        tr(
            "your gqa_attention used {used} beyond its inputs, where this check allows {allowed} (line {line}: {code}). "
            "A copy of K or V for every query head is S·Hq·d = {per_head} numbers ({per_head_size}) and does not fit.",
            line=found[1],
            code=found[2],
            **used,
        )
        if found
        else tr(
            "your gqa_attention used {used} beyond its inputs, where this check allows {allowed}. "
            "A copy of K or V for every query head is S·Hq·d = {per_head} numbers ({per_head_size}) and does not fit.",
            **used,
        ),
        tr(
            "The point of GQA is that the query heads of a group share one K/V head: view q as "
            "[Hkv, group·T, d] (or [Hkv, group, T, d]) and multiply by k of its group instead of repeating "
            "k and v (a library call that repeats them internally counts too)."
        ),
    ]
    hint = (
        M.repeat_kv.format(op=repeat[0].rstrip("("))
        if repeat
        else M.expand_kv
        if expand
        else M.broadcast_matmul.format(kv_heads=Hkv, group=group, d=d, S=S)
        if matmul
        else ""
    )
    return CheckFailed(*lines, hint=hint)
