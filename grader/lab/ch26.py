"""Experiments of ch26 · flattened batches."""

from __future__ import annotations

import torch

from grader.authoring import CheckFailed, Trial, describe, expect_tensor, wrong_mask
from grader.checks.ch26 import (
    META_KEYS,
    expect_cu,
    expect_metadata,
    explain_metadata,
    explain_packed,
    explain_unpacked,
    metadata_wrong,
    padded_batch,
)
from grader.i18n import mark, tr
from grader.lab import Int, Numbers, ask, expected_or_own, experiment

MAX_KEYS = 24  # ch26-flatten draws one cell per key, all sequences in one row


def _constraints(p: dict) -> dict[str, str]:
    query, cached = p["query_lens"], p["cached_lens"]
    if len(cached) != len(query):
        return {"cached_lens": tr("one prefix hit per request: {n} numbers, as many as query_lens", n=len(query))}
    if sum(query) + sum(cached) > MAX_KEYS:
        return {
            "cached_lens": tr("{n} keys in all are too many to draw in one row (at most {most})", n=sum(query) + sum(cached), most=MAX_KEYS)
        }
    return {}


def _cu(lens: list[int]) -> list[int]:
    return [0] + torch.tensor(lens).cumsum(0).tolist()


def _captions(p: dict) -> dict[str, tuple[str, ...]]:
    query, cached, H = p["query_lens"], p["cached_lens"], p["H"]
    B, T, N = len(query), max(query), sum(query)
    keys = [c + q for c, q in zip(cached, query)]
    hits = [f"{chr(65 + b)} 命中 {c} 个 token 的前缀" for b, c in enumerate(cached) if c]
    hits_en = [f"{chr(65 + b)} hits a {c}-token prefix" for b, c in enumerate(cached) if c]
    return {
        "ch26-dim-varlen-pack": (
            f"长度为 {query} 的 {B} 条请求从 padded [{B}, {T}, {H}] 收集到 packed [{N}, {H}],逐行标出来源;"
            f"用 cu_seqlens = {_cu(query)} 恢复请求边界。",
            f"{B} requests of lengths {query} gathered from padded [{B}, {T}, {H}] into packed [{N}, {H}], each row "
            f"labelled with its source; the request boundaries are recovered from cu_seqlens = {_cu(query)}.",
        ),
        "ch26-flatten": (
            f"{B} 条序列压平成一个 batch,边界仍记在 cu_seqlens 里。"
            + (
                "、".join(hits) + f":query 长度 {query},key 长度 cached + query = {keys}。"
                if hits
                else "没有命中前缀:key 长度等于 query 长度。"
            ),
            f"{B} sequences flattened without losing their boundaries, which cu_seqlens keeps. "
            + (
                "; ".join(hits_en) + f": query lengths {query}, key lengths cached + query = {keys}."
                if hits_en
                else "No prefix hit: the key lengths equal the query lengths."
            ),
        ),
    }


@experiment(
    "varlen",
    title=mark("Varlen packing and cu_seqlens"),
    about=mark(
        "Edit the requests' lengths (their new tokens) and their prefix hits (tokens already cached): "
        "your pack_varlen and unpack_varlen move the rows, your varlen_metadata gives cu_seqlens_q and "
        "cu_seqlens_k."
    ),
    figures=("ch26-dim-varlen-pack", "ch26-flatten"),
    calls=("pack_varlen", "unpack_varlen", "varlen_metadata"),
    params=[
        Numbers("query_lens", mark("query_lens (new tokens)"), [3, 2], 1, 4, 1, 6),
        Numbers("cached_lens", mark("cached_lens (prefix hits)"), [0, 4], 1, 4, 0, 12),
        Int("H", mark("H (channels)"), 4, 1, 4),
    ],
    constraints=_constraints,
    captions=_captions,
)
def varlen(t: Trial, p: dict) -> None:
    query, cached, H = p["query_lens"], p["cached_lens"], p["H"]
    T, N, case = max(query), sum(query), tr("your instance")
    padded = padded_batch(query, T, H)
    got = t.yours.pack_varlen(padded, list(query))
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        raise CheckFailed(tr("pack_varlen returns a pair (packed, cu_seqlens); yours: {what}", what=describe(got)))
    packed, cu = got
    want = ask(t, lambda ref: ref.pack_varlen(padded, query)) or (None, None)
    if (
        isinstance(packed, torch.Tensor)
        and isinstance(cu, torch.Tensor)
        and list(packed.shape) == [N, H]
        and packed.dtype == padded.dtype
        and list(cu.shape) == [len(query) + 1]
        and cu.dtype == torch.int32
    ):
        expected, expected_cu = expected_or_own(want[0], packed), expected_or_own(want[1], cu)
        t.figure(
            "ch26-dim-varlen-pack",
            padded=padded,
            lengths=query,
            packed=packed,
            expected=expected,
            wrong=wrong_mask(packed, expected),
            cu_seqlens=cu,
            expected_cu=expected_cu,
            cu_wrong=wrong_mask(cu, expected_cu),
            checked=want[0] is not None,
        )
    try:  # the chapter's explanations know the answer without the reference: running sums, rows in order
        explain_packed(packed, padded, query, case)
        expect_cu(cu, query, "cu_seqlens")
        wrong_pack = None
    except CheckFailed as e:
        wrong_pack = e
    if wrong_pack is None:  # unpack the (correct) packed batch back
        unpacked = t.yours.unpack_varlen(packed, cu, T)
        out = expect_tensor(unpacked, what=tr("the unpacked batch"), shape=list(padded.shape), dtype=padded.dtype)
        t.figure("ch26-dim-varlen-pack", unpacked=out, unpacked_expected=padded, unpacked_wrong=wrong_mask(out, padded))
    meta = expect_metadata(t.yours.varlen_metadata(list(query), list(cached)))
    parts = {k: meta[k] for k in META_KEYS}
    want_meta = ask(t, lambda ref: ref.varlen_metadata(query, cached))
    if all(
        isinstance(parts[k], torch.Tensor) and list(parts[k].shape) == [len(query) + 1] and parts[k].dtype == torch.int32
        for k in META_KEYS[:2]
    ) and all(type(parts[k]) is int for k in META_KEYS[2:]):
        expected_meta = expected_or_own(want_meta, parts)
        t.figure(
            "ch26-flatten",
            query=query,
            cached=cached,
            yours=parts,
            expected=expected_meta,
            wrong=metadata_wrong(parts, expected_meta),
            checked=want_meta is not None,
        )
    if wrong_pack is not None:
        raise wrong_pack
    explain_unpacked(out, packed, cu.tolist(), T, case)
    explain_metadata(meta, query, cached, case)
