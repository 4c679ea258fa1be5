"""Public checks of ch28 · cache identity and the logits boundary, and the messages they share with the
hidden ones."""

from __future__ import annotations

from typing import Any

import torch

from grader.authoring import (
    CheckFailed,
    Trial,
    describe,
    expect_int,
    expect_tensor,
    first_wrong,
    hidden_model,
    mistakes,
    public,
    wrong_mask,
)
from grader.i18n import mark, tr

# ch28-cache-identity: the same 12 tokens (an image behind placeholders 4–7) under five identities, block 4.
IDENTITY_TOKENS = [11, 12, 13, 14, 99, 99, 99, 99, 21, 22, 23, 24]
IDENTITY_BS = 4
IDENTITY_ROWS: list[tuple[str, str, dict[str, Any]]] = [
    ("A", mark("image cat"), {"mm_hashes": [("cat", 4, 4)]}),
    (mark("A again"), mark("image cat (the same request)"), {"mm_hashes": [("cat", 4, 4)]}),
    (mark("other image"), mark("image dog behind the same placeholders"), {"mm_hashes": [("dog", 4, 4)]}),
    (mark("salted"), mark('image cat, cache_salt "tenant-b"'), {"mm_hashes": [("cat", 4, 4)], "cache_salt": "tenant-b"}),
    ("LoRA 7", mark("image cat, lora_id 7"), {"mm_hashes": [("cat", 4, 4)], "lora_id": 7}),
]
"""(label, what, keys) per request; the label and the words are translated where they are shown (`tr`)."""

# ch28-last-token-logits: three requests flattened into 9 rows, block size 4 (after vllm_and_beyond.md §D.2,
# with R1 a full-prompt hit so that the last-token rule shows): (name, situation, computed before, scheduled).
LOGITS_REQUESTS = [
    ("R0", mark("chunked prefill: 10-token prompt, 4 done, the next 4"), 4, 4),
    ("R1", mark("full-prompt hit: 8-token prompt, both blocks of 4 cached"), 4, 4),
    ("R2", mark("decode: 7 tokens, the newest not yet fed"), 6, 1),
]
FIGURE_HIT = (8, 4, 2)

M = mistakes("ch28")

variant_hashes = hidden_model("ch28_models.variant_hashes")
"""`t.ref.drive(variant_hashes, tokens, block_size, keys, chained=False | salt_all=True)`: the hashes unchained, or with
the salt in every block."""


# -- ch28.1 block hashes ---------------------------------------------------------------------------------------


@public("ch28.1", "figure instance: the same 12 tokens under five identities")
def identity_figure(t: Trial) -> None:
    rows = []
    for label, what, keys in IDENTITY_ROWS:
        want, variants = reference_variants(t, IDENTITY_TOKENS, IDENTITY_BS, keys)
        got = t.yours.block_hashes(list(IDENTITY_TOKENS), IDENTITY_BS, **keys)
        rows.append((tr(label), tr(what), keys, got, want, variants))
    t.figure(
        "ch28-cache-identity",
        tokens=IDENTITY_TOKENS,
        block_size=IDENTITY_BS,
        rows=[
            {
                "label": label,
                "what": what,
                "keys": [key_list(i, IDENTITY_BS, keys) for i in range(3)],
                "yours": [h.hex() for h in got] if are_hashes(got) else [],
                "expected": [h.hex() for h in want],
                "wrong": [not are_hashes(got) or b >= len(got) or got[b] != h for b, h in enumerate(want)],
            }
            for label, what, keys, got, want, _ in rows
        ],
    )
    for label, _, keys, got, want, variants in rows:
        expect_hashes(got, want, variants, IDENTITY_TOKENS, IDENTITY_BS, keys, case=tr("request {label}", label=repr(label)))


@public("ch28.1", "a plain chain over the full blocks only")
def plain_chain(t: Trial) -> None:
    run_hash_case(t, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 4, {}, case=tr("10 tokens, no keys"))


@public("ch28.1", "the salt enters block 0 and reaches the rest through the chain")
def salt_chain(t: Trial) -> None:
    run_hash_case(t, [7, 7, 7, 7, 7, 7, 7, 7], 4, {"cache_salt": "s1"}, case=tr("a salted request"))


@public("ch28.1", "an image that starts in the middle of a block, and an adapter")
def image_across_blocks(t: Trial) -> None:
    tokens = [1, 2, 9, 9, 9, 9, 3, 4, 5, 6, 7]
    run_hash_case(t, tokens, 4, {"mm_hashes": [("img-1", 2, 4)]}, case=tr("an image at tokens 2–5"))
    run_hash_case(t, tokens, 4, {"mm_hashes": [("img-1", 2, 4)], "lora_id": 3}, case=tr("the same under LoRA 3"))


# -- ch28.2 the last-token rule -------------------------------------------------------------------------------------


@public("ch28.2", "the 32-token example: block size 16, both blocks cached")
def full_hit_32(t: Trial) -> None:
    expect_cached(t, 32, 16, 2)


@public("ch28.2", "figure instance: an 8-token prompt, block size 4, both blocks cached")
def figure_hit(t: Trial) -> None:
    want = t.ref.num_cached_tokens_on_hit(*FIGURE_HIT)
    got = t.yours.num_cached_tokens_on_hit(*FIGURE_HIT)
    if type(got) is int:
        t.figure("ch28-last-token-logits", cached=got, cached_expected=want, cached_wrong=got != want)
    expect_cached(t, *FIGURE_HIT)


@public("ch28.2", "33 tokens: one token into a new block, so only it is computed")
def full_hit_33(t: Trial) -> None:
    expect_cached(t, 33, 16, 2)


@public("ch28.2", "partial hits are taken whole, and no hit is no hit")
def partial_hits(t: Trial) -> None:
    for prompt_len, bs, hits in ((40, 16, 1), (40, 16, 2), (40, 16, 0), (1, 16, 0)):
        expect_cached(t, prompt_len, bs, hits)


# -- ch28.3 logits indices --------------------------------------------------------------------------------------------


@public("ch28.3", "figure instance: 3 requests, 9 rows (chunk, full-prompt hit, decode)")
def logits_figure(t: Trial) -> None:
    lens = [n for *_, n in LOGITS_REQUESTS]
    want = t.ref.logits_indices(lens)
    got = t.yours.logits_indices(lens)
    idx = expect_tensor(got, what=tr("the logits rows of {n} requests", n=3), shape=[3], dtype=torch.int64)
    t.figure(
        "ch28-last-token-logits",
        requests=[[name, tr(what), c, n] for name, what, c, n in LOGITS_REQUESTS],
        indices=idx,
        expected=want,
        wrong=wrong_mask(idx, want),
        block_size=4,
        prompt=FIGURE_HIT[0],
    )
    expect_indices(idx, want, lens, case=tr("query_lens {lens}", lens=lens))


@public("ch28.3", "a decode-only batch: every row is sampled")
def decode_batch(t: Trial) -> None:
    run_indices_case(t, [1, 1, 1, 1, 1], case=tr("five decodes"))


@public("ch28.3", "one prefill chunk, then requests of several lengths")
def mixed_lengths(t: Trial) -> None:
    run_indices_case(t, [16], case=tr("one 16-token chunk"))
    run_indices_case(t, [3, 5, 1, 2], case=tr("query_lens {lens}", lens=[3, 5, 1, 2]))


@public("ch28.3", "query_lens as an int32 tensor give int64 indices")
def int32_lengths(t: Trial) -> None:
    run_indices_case(t, torch.tensor([2, 7, 1], dtype=torch.int32), case=tr("int32 query_lens {lens}", lens=[2, 7, 1]))


# -- helpers: ch28.1 --------------------------------------------------------------------------------------------


def key_list(i: int, bs: int, keys: dict) -> str:
    """The identity keys that enter block i, in the chapter's words."""
    s, e = i * bs, (i + 1) * bs
    out = [f"lora {keys['lora_id']}"] if keys.get("lora_id") is not None else []
    out += [
        tr("mm ({ident}, offset {o} − {s} = {d})", ident=repr(ident), o=o, s=s, d=o - s)
        for ident, o, n in keys.get("mm_hashes") or []
        if o < e and o + n > s
    ]
    out += [f"salt {keys['cache_salt']!r}"] if i == 0 and keys.get("cache_salt") is not None else []
    return ", ".join(out) or tr("none")


def hash_prefix(h: object) -> str:
    """A hash as the messages name it: its first 4 bytes in hex, "be97af41…"."""
    return h[:4].hex() + "…" if isinstance(h, bytes) and len(h) >= 4 else repr(h)


def fmt_keys(keys: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in keys.items())


def are_hashes(got: object) -> bool:
    return isinstance(got, list) and all(isinstance(h, bytes) for h in got)


def reference_variants(t: Trial, tokens: list[int], bs: int, keys: dict) -> tuple[list, dict]:
    """The reference's hashes, and for hints the hashes with each key left out (computed before comparing)."""
    want = t.ref.block_hashes(tokens, bs, **keys)
    variants = {"keys": t.ref.block_hashes(tokens, bs)} if len(keys) > 1 else {}
    for k in keys:
        variants[k] = t.ref.block_hashes(tokens, bs, **{n: v for n, v in keys.items() if n != k})
    variants["unchained"] = t.ref.drive(variant_hashes, list(tokens), bs, dict(keys), chained=False)
    if keys.get("cache_salt") is not None:
        variants["salt everywhere"] = t.ref.drive(variant_hashes, list(tokens), bs, dict(keys), salt_all=True)
    return want, variants


def expect_hashes(got: object, want: list[bytes], variants: dict, tokens: list[int], bs: int, keys: dict, *, case: str) -> list:
    """Require your hashes to equal the reference's; explain the first wrong block."""
    n = len(tokens) // bs
    head = tr("{case} ({n} tokens, block_size {bs}{keys})", case=case, n=len(tokens), bs=bs, keys=", " + fmt_keys(keys) if keys else "")
    if not isinstance(got, list) or not are_hashes(got):
        raise CheckFailed(
            tr("{head}: expected a list of {n} hashes as 32-byte bytes objects; yours: {yours}", head=head, n=n, yours=describe(got)),
            hint=M.hex_strings if isinstance(got, list) and got and all(isinstance(h, str) for h in got) else "",
        )
    if len(got) != n:
        raise CheckFailed(
            tr(
                "{head}: expected {n} hashes ({tokens} // {bs} full blocks); yours: {yours}",
                head=head,
                n=n,
                tokens=len(tokens),
                bs=bs,
                yours=len(got),
            ),
            hint=M.partial_block.format(n=len(tokens) % bs) if len(got) == n + 1 else "",
        )
    i = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    if i is None:
        return got
    s = i * bs
    hint: str = ""
    if len(got[i]) != 32:
        hint = M.digest_size.format(n=len(got[i]))
    elif got == variants.get("keys"):
        hint = M.keys_missing
    elif got == variants.get("cache_salt") and i == 0:
        hint = M.salt_missing
    elif got == variants.get("lora_id"):
        hint = M.lora_missing
    elif got == variants.get("mm_hashes"):
        hint = M.mm_missing
    elif variants.get("unchained") and got[i] == variants["unchained"][i]:
        hint = M.unchained
    elif i and got == variants.get("salt everywhere"):
        hint = M.salt_everywhere
    raise CheckFailed(
        tr(
            "{head}: block {i}'s hash should be {want}; yours: {yours}",
            head=head,
            i=i,
            want=want[i].hex(),
            yours=got[i].hex() if len(got[i]) < 64 else hash_prefix(got[i]),
        ),
        tr(
            "block {i} = tokens {s}–{e} {tokens}, parent hash_{p} ({parent}, which yours matches)",
            i=i,
            s=s,
            e=s + bs - 1,
            tokens=tokens[s : s + bs],
            p=i - 1,
            parent=hash_prefix(want[i - 1]),
        )
        if i
        else tr(
            'block {i} = tokens {s}–{e} {tokens}, parent NONE_HASH (SHA-256 of the pickled "vllm-none-hash", vLLM\'s default)',
            i=i,
            s=s,
            e=s + bs - 1,
            tokens=tokens[s : s + bs],
        ),
        tr("its extra keys: {keys}", keys=key_list(i, bs, keys)),
        hint=hint,
    )


def run_hash_case(t: Trial, tokens: list[int], bs: int, keys: dict, *, case: str) -> list:
    want, variants = reference_variants(t, tokens, bs, keys)
    got = t.yours.block_hashes(list(tokens), bs, **keys)
    return expect_hashes(got, want, variants, tokens, bs, keys, case=case)


# -- helpers: ch28.2 --------------------------------------------------------------------------------------------


def expect_cached(t: Trial, prompt_len: int, bs: int, hits: int) -> int:
    want = t.ref.num_cached_tokens_on_hit(prompt_len, bs, hits)
    got = expect_int(t.yours.num_cached_tokens_on_hit(prompt_len, bs, hits), what=tr("the number of cached tokens"))
    if got != want:
        cap = (prompt_len - 1) // bs
        raise CheckFailed(
            tr(
                "prompt_len={prompt_len}, block_size={bs}, leading blocks hit: {hits}; the hit is capped at {prompt_len} − 1 = "
                "{capped} tokens, i.e. {capped} // {bs} = {cap} whole blocks, so min({hits}, {cap})·{bs} = {want} tokens are "
                "cached and {computed} computed; yours: {got}",
                prompt_len=prompt_len,
                bs=bs,
                hits=hits,
                capped=prompt_len - 1,
                cap=cap,
                want=want,
                computed=prompt_len - want,
                got=got,
            ),
            hint=M.uncapped if got == hits * bs else M.token_cap if got == min(hits * bs, prompt_len - 1) else "",
        )
    return got


# -- helpers: ch28.3 --------------------------------------------------------------------------------------------


def expect_indices(got: object, want: torch.Tensor, lens: list[int], *, case: str) -> torch.Tensor:
    b = len(lens)
    idx = expect_tensor(got, what=tr("the logits rows of {n} requests", n=b), shape=[b], dtype=torch.int64)
    wrong = first_wrong(idx, want)
    if wrong is None:
        return idx
    r = wrong[0]
    start, end = sum(lens[:r]), sum(lens[: r + 1])
    yours = int(idx[r])
    hint = (
        M.first_row
        if yours == start and lens[r] > 1
        else M.no_minus_one
        if yours == end
        else M.local_row
        if yours == lens[r] - 1 and r
        else ""
    )
    raise CheckFailed(
        tr(
            "{case}: request {r} has {n} scheduled tokens, rows cu_seqlens_q[{r}] … cu_seqlens_q[{r1}] − 1 = {start} … {last}; "
            "its logits row is the last, {end} − 1 = {last}; yours: {yours}",
            case=case,
            r=r,
            n=lens[r],
            r1=r + 1,
            start=start,
            last=end - 1,
            end=end,
            yours=yours,
        ),
        hint=hint,
    )


def run_indices_case(t: Trial, lens: list[int] | torch.Tensor, *, case: str) -> torch.Tensor:
    want = t.ref.logits_indices(lens)
    got = t.yours.logits_indices(lens)
    plain = lens.tolist() if isinstance(lens, torch.Tensor) else list(lens)
    return expect_indices(got, want, plain, case=case)
