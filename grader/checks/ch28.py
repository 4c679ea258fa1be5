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
    plural,
    public,
    wrong_mask,
)

# ch28-cache-identity: the same 12 tokens (an image behind placeholders 4–7) under five identities, block 4.
IDENTITY_TOKENS = [11, 12, 13, 14, 99, 99, 99, 99, 21, 22, 23, 24]
IDENTITY_BS = 4
IDENTITY_ROWS: list[tuple[str, str, dict[str, Any]]] = [
    ("A", "image cat", {"mm_hashes": [("cat", 4, 4)]}),
    ("A again", "image cat (the same request)", {"mm_hashes": [("cat", 4, 4)]}),
    ("other image", "image dog behind the same placeholders", {"mm_hashes": [("dog", 4, 4)]}),
    ("salted", 'image cat, cache_salt "tenant-b"', {"mm_hashes": [("cat", 4, 4)], "cache_salt": "tenant-b"}),
    ("LoRA 7", "image cat, lora_id 7", {"mm_hashes": [("cat", 4, 4)], "lora_id": 7}),
]

# ch28-last-token-logits: three requests flattened into 9 rows, block size 4 (after vllm_and_beyond.md §D.2,
# with R1 a full-prompt hit so that the last-token rule shows): (name, situation, computed before, scheduled).
LOGITS_REQUESTS = [
    ("R0", "chunked prefill: 10-token prompt, 4 done, the next 4", 4, 4),
    ("R1", "full-prompt hit: 8-token prompt, both blocks of 4 cached", 4, 4),
    ("R2", "decode: 7 tokens, the newest not yet fed", 6, 1),
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
        rows.append((label, what, keys, got, want, variants))
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
        expect_hashes(got, want, variants, IDENTITY_TOKENS, IDENTITY_BS, keys, case=f"request {label!r}")


@public("ch28.1", "a plain chain over the full blocks only")
def plain_chain(t: Trial) -> None:
    run_hash_case(t, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 4, {}, case="10 tokens, no keys")


@public("ch28.1", "the salt enters block 0 and reaches the rest through the chain")
def salt_chain(t: Trial) -> None:
    run_hash_case(t, [7, 7, 7, 7, 7, 7, 7, 7], 4, {"cache_salt": "s1"}, case="a salted request")


@public("ch28.1", "an image that starts in the middle of a block, and an adapter")
def image_across_blocks(t: Trial) -> None:
    tokens = [1, 2, 9, 9, 9, 9, 3, 4, 5, 6, 7]
    run_hash_case(t, tokens, 4, {"mm_hashes": [("img-1", 2, 4)]}, case="an image at tokens 2–5")
    run_hash_case(t, tokens, 4, {"mm_hashes": [("img-1", 2, 4)], "lora_id": 3}, case="the same under LoRA 3")


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
    idx = expect_tensor(got, what="the logits rows of 3 requests", shape=[3], dtype=torch.int64)
    t.figure(
        "ch28-last-token-logits",
        requests=[[name, what, c, n] for name, what, c, n in LOGITS_REQUESTS],
        indices=idx,
        expected=want,
        wrong=wrong_mask(idx, want),
        block_size=4,
        prompt=FIGURE_HIT[0],
    )
    expect_indices(idx, want, lens, case=f"query_lens {lens}")


@public("ch28.3", "a decode-only batch: every row is sampled")
def decode_batch(t: Trial) -> None:
    run_indices_case(t, [1, 1, 1, 1, 1], case="five decodes")


@public("ch28.3", "one prefill chunk, then requests of several lengths")
def mixed_lengths(t: Trial) -> None:
    run_indices_case(t, [16], case="one 16-token chunk")
    run_indices_case(t, [3, 5, 1, 2], case="query_lens [3, 5, 1, 2]")


@public("ch28.3", "query_lens as an int32 tensor give int64 indices")
def int32_lengths(t: Trial) -> None:
    run_indices_case(t, torch.tensor([2, 7, 1], dtype=torch.int32), case="int32 query_lens [2, 7, 1]")


# -- helpers: ch28.1 --------------------------------------------------------------------------------------------


def key_list(i: int, bs: int, keys: dict) -> str:
    """The identity keys that enter block i, in the chapter's words."""
    s, e = i * bs, (i + 1) * bs
    out = [f"lora {keys['lora_id']}"] if keys.get("lora_id") is not None else []
    out += [f"mm ({ident!r}, offset {o} − {s} = {o - s})" for ident, o, n in keys.get("mm_hashes") or [] if o < e and o + n > s]
    out += [f"salt {keys['cache_salt']!r}"] if i == 0 and keys.get("cache_salt") is not None else []
    return ", ".join(out) or "none"


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
    head = f"{case} ({len(tokens)} tokens, block_size {bs}{', ' + fmt_keys(keys) if keys else ''})"
    if not isinstance(got, list) or not are_hashes(got):
        raise CheckFailed(
            f"{head}: expected a list of {n} hashes as 32-byte bytes objects; yours: {describe(got)}",
            hint=M.hex_strings if isinstance(got, list) and got and all(isinstance(h, str) for h in got) else "",
        )
    if len(got) != n:
        raise CheckFailed(
            f"{head}: expected {n} hashes ({len(tokens)} // {bs} full blocks); yours: {len(got)}",
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
        f"{head}: block {i}'s hash should be {want[i].hex()}; yours: {got[i].hex() if len(got[i]) < 64 else hash_prefix(got[i])}",
        f"block {i} = tokens {s}–{s + bs - 1} {tokens[s : s + bs]}, parent "
        + (
            f"hash_{i - 1} ({hash_prefix(want[i - 1])}, which yours matches)"
            if i
            else 'NONE_HASH (SHA-256 of the pickled "vllm-none-hash", vLLM\'s default)'
        ),
        f"its extra keys: {key_list(i, bs, keys)}",
        hint=hint,
    )


def run_hash_case(t: Trial, tokens: list[int], bs: int, keys: dict, *, case: str) -> list:
    want, variants = reference_variants(t, tokens, bs, keys)
    got = t.yours.block_hashes(list(tokens), bs, **keys)
    return expect_hashes(got, want, variants, tokens, bs, keys, case=case)


# -- helpers: ch28.2 --------------------------------------------------------------------------------------------


def expect_cached(t: Trial, prompt_len: int, bs: int, hits: int) -> int:
    want = t.ref.num_cached_tokens_on_hit(prompt_len, bs, hits)
    got = expect_int(t.yours.num_cached_tokens_on_hit(prompt_len, bs, hits), what="the number of cached tokens")
    if got != want:
        cap = (prompt_len - 1) // bs
        raise CheckFailed(
            f"prompt_len={prompt_len}, block_size={bs}, {plural(hits, 'leading block')} hit: "
            f"the hit is capped at {prompt_len} − 1 = {prompt_len - 1} tokens, i.e. {prompt_len - 1} // "
            f"{bs} = {plural(cap, 'whole block')}, so min({hits}, {cap})·{bs} = {want} tokens are "
            f"cached and {prompt_len - want} computed; yours: {got}",
            hint=M.uncapped if got == hits * bs else M.token_cap if got == min(hits * bs, prompt_len - 1) else "",
        )
    return got


# -- helpers: ch28.3 --------------------------------------------------------------------------------------------


def expect_indices(got: object, want: torch.Tensor, lens: list[int], *, case: str) -> torch.Tensor:
    b = len(lens)
    idx = expect_tensor(got, what=f"the logits rows of {plural(b, 'request')}", shape=[b], dtype=torch.int64)
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
        f"{case}: request {r} has {plural(lens[r], 'scheduled token')}, rows "
        f"cu_seqlens_q[{r}] … cu_seqlens_q[{r + 1}] − 1 = {start} … {end - 1}; its logits row is the last, "
        f"{end} − 1 = {end - 1}; yours: {yours}",
        hint=hint,
    )


def run_indices_case(t: Trial, lens: list[int] | torch.Tensor, *, case: str) -> torch.Tensor:
    want = t.ref.logits_indices(lens)
    got = t.yours.logits_indices(lens)
    plain = lens.tolist() if isinstance(lens, torch.Tensor) else list(lens)
    return expect_indices(got, want, plain, case=case)
