"""Experiments of ch18 · grouped-query attention."""

from __future__ import annotations

from grader.authoring import Trial, expect_int
from grader.checks.ch18 import explain_mapping
from grader.lab import Int, expected_or_own, experiment


def _constraints(p: dict) -> dict[str, str]:
    nh, nkv = p["num_heads"], p["num_kv_heads"]
    if nh % nkv:
        return {"num_kv_heads": f"{nh} query heads cannot be split into {nkv} equal groups: num_kv_heads must divide num_heads"}
    return {}


def _captions(p: dict) -> dict[str, tuple[str, ...]]:
    nh, nkv = p["num_heads"], p["num_kv_heads"]
    g = nh // nkv
    return {
        "ch18-gqa-groups": (
            f"{nh} 个查询头按连续分组共享 {nkv} 个 K/V 头(kv_head = h // {g})。分组是逻辑上的:缓存只存 {nkv} 个头,"
            f"不是 {nh} 个;kernel 按下标读取共享的头,无需复制缓存。",
            f"{nh} query heads, {nkv} K/V group{'s' if nkv > 1 else ''}: consecutive heads share a K/V head "
            f"(kv_head = h // {g}). The grouping is logical: the cache holds {nkv} head{'s' if nkv > 1 else ''}, not "
            f"{nh}, and kernels read the shared head by index instead of repeating the cache.",
            f"{nh} 个 Q 头,{nkv} 组 K/V",
        )
    }


@experiment(
    "groups",
    title="分组共享 K/V · GQA groups",
    about="Change the number of query heads and of K/V heads (MHA when they are equal, MQA with one K/V "
    "head): your kv_head_for tells each query head which K/V head it reads.",
    figures=("ch18-gqa-groups",),
    calls=("kv_head_for",),
    params=[Int("num_heads", "num_heads (query heads)", 4, 1, 6), Int("num_kv_heads", "num_kv_heads", 2, 1, 3)],
    constraints=_constraints,
    captions=_captions,
)
def groups(t: Trial, p: dict) -> None:
    nh, nkv = p["num_heads"], p["num_kv_heads"]
    heads = list(range(nh))
    got = [expect_int(t.yours.kv_head_for(h, nh, nkv), what=f"kv_head_for({h}, {nh}, {nkv})") for h in heads]
    want = [t.ref.kv_head_for(h, nh, nkv) for h in heads] if t.ref else None
    t.figure("ch18-gqa-groups", num_heads=nh, num_kv_heads=nkv, mapping=got, expected=expected_or_own(want, got))
    if want is not None:
        explain_mapping(heads, got, want, nh, nkv)
