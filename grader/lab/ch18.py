"""Experiments of ch18 · grouped-query attention."""

from __future__ import annotations

from grader.authoring import CheckFailed, Trial, expect_int
from grader.checks.ch18 import explain_mapping, mapping_hint
from grader.i18n import mark, tr
from grader.lab import Int, ask, expected_or_own, experiment


def _constraints(p: dict) -> dict[str, str]:
    nh, nkv = p["num_heads"], p["num_kv_heads"]
    if nh % nkv:
        return {
            "num_kv_heads": tr(
                "{nh} query heads cannot be split into {nkv} equal groups: num_kv_heads must divide num_heads", nh=nh, nkv=nkv
            )
        }
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
    title=mark("GQA groups"),
    about=mark(
        "Change the number of query heads and of K/V heads (MHA when they are equal, MQA with one K/V "
        "head): your kv_head_for tells each query head which K/V head it reads."
    ),
    figures=("ch18-gqa-groups",),
    calls=("kv_head_for",),
    params=[Int("num_heads", mark("num_heads (query heads)"), 4, 1, 6), Int("num_kv_heads", "num_kv_heads", 2, 1, 3)],
    constraints=_constraints,
    captions=_captions,
)
def groups(t: Trial, p: dict) -> None:
    nh, nkv = p["num_heads"], p["num_kv_heads"]
    heads = list(range(nh))
    got = [expect_int(t.yours.kv_head_for(h, nh, nkv), what=f"kv_head_for({h}, {nh}, {nkv})") for h in heads]

    def answer(h: int) -> int | None:
        return ask(t, lambda ref: ref.kv_head_for(h, nh, nkv))

    answers = [answer(h) for h in heads]
    want = [a for a in answers if a is not None] if None not in answers else None
    t.figure("ch18-gqa-groups", num_heads=nh, num_kv_heads=nkv, mapping=got, expected=expected_or_own(want, got), checked=want is not None)
    if want is not None:
        explain_mapping(heads, got, want, nh, nkv)
    else:
        explain_group_rules(got, nh, nkv)


def explain_group_rules(got: list[int], num_heads: int, num_kv_heads: int) -> None:
    """What GQA's grouping must be, checked without an answer: every K/V head exists, consecutive query heads
    share one, and every K/V head serves the same number of query heads."""
    group = num_heads // num_kv_heads
    header = (
        tr("{num_heads} query heads share 1 K/V head: groups of {group}", num_heads=num_heads, group=group)
        if num_kv_heads == 1
        else tr(
            "{num_heads} query heads share {num_kv_heads} K/V heads: groups of {group}",
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            group=group,
        )
    )
    hint = mapping_hint(list(range(num_heads)), got, num_heads, num_kv_heads)
    outside = [h for h, kv in enumerate(got) if not 0 <= kv < num_kv_heads]
    if outside:
        h = outside[0]
        raise CheckFailed(
            header,
            tr("query head {h} reads K/V head {kv}, which does not exist (0 … {last})", h=h, kv=got[h], last=num_kv_heads - 1),
            hint=hint,
        )
    back = [h for h in range(1, num_heads) if got[h] < got[h - 1]]
    if back:
        h = back[0]
        raise CheckFailed(
            header,
            tr(
                "query heads are grouped in order; yours sends head {a} to K/V head {kv_a} and head {b} back to {kv_b}",
                a=h - 1,
                kv_a=got[h - 1],
                b=h,
                kv_b=got[h],
            ),
            hint=hint,
        )
    sizes = [got.count(kv) for kv in range(num_kv_heads)]
    if any(n != group for n in sizes):
        kv = next(kv for kv, n in enumerate(sizes) if n != group)
        raise CheckFailed(
            header,
            tr("every K/V head serves {group} query heads; yours sends {n} to K/V head {kv}", group=group, n=sizes[kv], kv=kv),
            hint=hint,
        )
