"""Hidden checks of ch28 · cache identity and the logits boundary: random instances from the grading seed,
key sensitivity, edge cases, bad inputs."""

from __future__ import annotations

import torch

from grader.authoring import CheckFailed, Trial, hidden
from grader.checks.ch28 import expect_cached, expect_hashes, fmt_keys, reference_variants, run_hash_case, run_indices_case
from grader.i18n import tr

# -- ch28.1 block hashes ---------------------------------------------------------------------------------------


@hidden("ch28.1", "random requests, block sizes and identity keys")
def random_hashes(t: Trial) -> None:
    for k in range(25):
        tokens, bs, keys = random_request(t)
        run_hash_case(t, tokens, bs, keys, case=tr("random request {k}", k=k))


@hidden("ch28.1", "changing one key changes its first block and every later one, never an earlier one")
def key_sensitivity(t: Trial) -> None:
    bs = 4
    tokens = [t.random.randrange(1000) for _ in range(32)]
    base = {"mm_hashes": [("cat", 9, 6)], "lora_id": 2}
    changes = [
        ("cache_salt", {**base, "cache_salt": "s"}, 0),
        ("lora_id", {**base, "lora_id": 3}, 0),
        (tr("the image"), {**base, "mm_hashes": [("dog", 9, 6)]}, 9 // bs),
        (tr("the image's place"), {**base, "mm_hashes": [("cat", 10, 6)]}, 9 // bs),
        (tr("a second image"), {**base, "mm_hashes": [("cat", 9, 6), ("cow", 21, 3)]}, 21 // bs),
    ]
    before = run_hash_case(t, tokens, bs, base, case=tr("the base request"))
    for what, keys, first in changes:
        after = run_hash_case(t, tokens, bs, keys, case=tr("the request with {what} changed", what=what))
        same = [i for i in range(len(after)) if (after[i] == before[i]) != (i < first)]
        if same:
            i = same[0]
            raise CheckFailed(
                tr(
                    "changing {what} ({keys}) should change block {first}'s hash and every later one, and no earlier one; yours "
                    "kept block {i}'s",
                    what=what,
                    keys=fmt_keys(keys),
                    first=first,
                    i=i,
                )
                if after[i] == before[i]
                else tr(
                    "changing {what} ({keys}) should change block {first}'s hash and every later one, and no earlier one; yours "
                    "changed block {i}'s",
                    what=what,
                    keys=fmt_keys(keys),
                    first=first,
                    i=i,
                )
            )


@hidden("ch28.1", "a long prompt: 8192 tokens in blocks of 16")
def long_prompt(t: Trial) -> None:
    tokens = [t.random.randrange(151_936) for _ in range(8192)]
    run_hash_case(t, tokens, 16, {"cache_salt": "long", "mm_hashes": [("video", 100, 5000)]}, case=tr("{n} tokens", n=8192))


@hidden("ch28.1", "short prompts: no full block means no hash; block size 1")
def short_prompts(t: Trial) -> None:
    for tokens, bs in (([], 4), ([5, 6, 7], 4), ([5, 6, 7], 1), ([0], 1)):
        want, variants = reference_variants(t, tokens, bs, {"cache_salt": "s"})
        got = t.yours.block_hashes(list(tokens), bs, cache_salt="s")
        expect_hashes(got, want, variants, tokens, bs, {"cache_salt": "s"}, case=tr("{n} tokens", n=len(tokens)))


# -- ch28.2 the last-token rule -------------------------------------------------------------------------------------


@hidden("ch28.2", "prompts ending just before, on and just after a block boundary")
def block_boundaries(t: Trial) -> None:
    for bs in (1, 2, 4, 16):
        for prompt_len in sorted({max(1, k * bs + d) for k in (1, 2, 3) for d in (-1, 0, 1)}):
            full = prompt_len // bs
            for hits in sorted({0, max(full - 1, 0), full, t.random.randint(0, full)}):
                expect_cached(t, prompt_len, bs, hits)


@hidden("ch28.2", "random large prompts")
def large_prompts(t: Trial) -> None:
    for _ in range(30):
        bs = t.random.choice([16, 32, 256])
        prompt_len = t.random.randint(1, 2_000_000)
        full = prompt_len // bs
        expect_cached(t, prompt_len, bs, t.random.choice([full, max(full - 1, 0), t.random.randint(0, full)]))


# -- ch28.3 logits indices --------------------------------------------------------------------------------------------


@hidden("ch28.3", "random batches")
def random_batches(t: Trial) -> None:
    for k in range(20):
        lens = [t.random.choice([1, 1, 1, t.random.randint(1, 600)]) for _ in range(t.random.randint(1, 64))]
        as_tensor = t.random.random() < 0.5
        run_indices_case(t, torch.tensor(lens) if as_tensor else lens, case=tr("random batch {k} of {n} requests", k=k, n=len(lens)))


@hidden("ch28.3", "a batch of 4096 requests")
def large_batch(t: Trial) -> None:
    lens = torch.randint(1, 512, (4096,), generator=t.rng)
    run_indices_case(t, lens, case=tr("{n} requests", n=4096))


@hidden("ch28.3", "an empty batch has no logits rows")
def empty_batch(t: Trial) -> None:
    run_indices_case(t, [], case=tr("no requests"))


# -- helpers --------------------------------------------------------------------------------------------------


def random_request(t: Trial, *, max_len: int = 80) -> tuple[list[int], int, dict]:
    """Tokens, a block size and a random set of identity keys (images at random places)."""
    bs = t.random.choice([1, 2, 3, 4, 8, 16])
    tokens = [t.random.randrange(0, 151_936) for _ in range(t.random.randint(0, max_len))]
    keys: dict = {}
    if t.random.random() < 0.4:
        keys["cache_salt"] = t.random.choice(["tenant-a", "b", "用户-7", "x" * 40])
    if t.random.random() < 0.4:
        keys["lora_id"] = t.random.randint(1, 2**40)
    if tokens and t.random.random() < 0.6:
        items: list[tuple[str, int, int]] = []
        pos = t.random.randrange(0, len(tokens))
        while pos < len(tokens) and len(items) < 3:
            length = t.random.randint(1, min(len(tokens) - pos, 3 * bs))
            items.append((f"img{t.random.randrange(10**6):06d}", pos, length))
            pos += length + t.random.randint(0, 2 * bs)
        keys["mm_hashes"] = items
    return tokens, bs, keys
