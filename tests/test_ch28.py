"""ch28 · cache identity and the logits boundary: wrong submissions get the teaching message they need, and the
reference agrees with the block manager of chapter 25 on the last-token rule."""

from __future__ import annotations

import hashlib
import struct

import pytest
import torch
from mutate import mutant_grader, result, wrong_elements

from solutions import ch25_paged_kv as ch25
from solutions import ch28_cache_identity as ref

SEED = 11


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return mutant_grader(tmp_path_factory, "ch28", SEED)


# -- 28.1 ---------------------------------------------------------------------------------------------------
def test_salt_in_every_block_is_explained(graded):
    report = graded.mistake("salt_everywhere")  # the salt in every block's extra keys instead of block 0's only
    r = result(report, "the salt enters block 0")
    assert r.status == "failed", r.message  # "error" once in CI, loaded: the message says why if it comes again
    want = ref.block_hashes([7] * 8, 4, cache_salt="s1")
    assert f"block 1's hash should be {want[1].hex()}" in r.message
    assert "its extra keys: none" in r.message
    assert r.hints == ["salt_everywhere"]
    assert {x.task for x in report.results if x.status != "passed"} == {"ch28.1"}
    assert wrong_elements(report, "ch28-cache-identity")


def test_unchained_blocks_are_explained(graded):
    report = graded.mistake("unchained")  # every block's parent NONE_HASH: equal blocks after other prefixes collide
    r = result(report, "a plain chain")
    assert r.status == "failed"
    want = ref.block_hashes(list(range(1, 11)), 4)
    assert f"block 1's hash should be {want[1].hex()}" in r.message
    assert f"parent hash_0 ({want[0][:4].hex()}…, which yours matches)" in r.message
    assert r.hints == ["unchained"]
    sens = result(report, "changing one key")
    assert sens.status == "failed"
    assert wrong_elements(report, "ch28-cache-identity")
    salted = result(report, "the salt enters block 0")
    assert salted.status == "failed" and "block 1's hash should be" in salted.message
    assert salted.hints == ["unchained"], "unchained with the salt in block 0: not a salt in every block"


def test_absolute_image_offset_is_explained(graded):
    report = graded(
        "mm_absolute_offset",
        # the image's offset taken from the prompt start instead of the block start
        ('struct.pack("<q", offset - s)', 'struct.pack("<q", offset)'),
    )
    r = result(report, "an image that starts")
    assert r.status == "failed"
    assert "block 1's hash should be" in r.message
    assert "its extra keys: mm ('img-1', offset 2 − 4 = -2)" in r.message


# -- 28.2 ---------------------------------------------------------------------------------------------------
def test_uncapped_hit_is_explained(graded):
    report = graded.mistake("uncapped")  # every hit block taken from the cache, even when no token is left to compute
    r = result(report, "the 32-token example")
    assert r.status == "failed"
    assert "the hit is capped at 32 − 1 = 31 tokens, i.e. 31 // 16 = 1 whole block" in r.message
    assert "min(2, 1)·16 = 16 tokens are cached and 16 computed; yours: 32" in r.message
    assert r.hints == ["uncapped"]
    assert result(report, "33 tokens").status == "passed"
    assert wrong_elements(report, "ch28-last-token-logits")


# -- 28.3 ---------------------------------------------------------------------------------------------------
def test_first_row_instead_of_last_is_explained(graded):
    report = graded.mistake("first_row")  # each request's first scheduled row taken for its logits
    r = result(report, "figure instance: 3 requests")
    assert r.status == "failed"
    assert "request 0 has 4 scheduled tokens, rows cu_seqlens_q[0] … cu_seqlens_q[1] − 1 = 0 … 3" in r.message
    assert "its logits row is the last, 4 − 1 = 3; yours: 0" in r.message
    assert r.hints == ["first_row"]
    assert result(report, "a decode-only batch").status == "passed", "decodes have one row: first = last"
    assert wrong_elements(report, "ch28-last-token-logits")


# -- the reference --------------------------------------------------------------------------------------------
def test_hash_bytes_follow_the_docstring():
    tokens, bs = [1, 2, 3, 4, 5, 6, 7, 8], 4
    got = ref.block_hashes(tokens, bs, cache_salt="s", lora_id=7, mm_hashes=[("cat", 3, 2)])
    lora = b"lora" + (7).to_bytes(8, "little")
    mm = lambda rel: b"mm" + (3).to_bytes(4, "little") + b"cat" + rel.to_bytes(8, "little", signed=True)
    # vLLM's default NONE_HASH: vllm/utils/hashing.py's sha256 of the pickled seed string (protocol 5)
    none_hash = hashlib.sha256(b"\x80\x05\x95\x12" + bytes(7) + b"\x8c\x0evllm-none-hash\x94.").digest()
    assert ref.NONE_HASH == none_hash
    h0 = hashlib.sha256(none_hash + struct.pack("<4q", 1, 2, 3, 4) + lora + mm(3) + b"salt" + (1).to_bytes(4, "little") + b"s").digest()
    h1 = hashlib.sha256(h0 + struct.pack("<4q", 5, 6, 7, 8) + lora + mm(-1)).digest()
    assert got == [h0, h1]


def test_last_token_rule_agrees_with_the_block_manager_of_chapter_25():
    # nano-vllm never hits a prompt's last logical block; vLLM caps the hit at num_tokens − 1: the same numbers.
    for bs in (2, 4, 16):
        for prompt_len in range(1, 5 * bs):
            m = ch25.BlockManager(64, bs)
            done = ch25.Sequence(list(range(prompt_len)) + [10_000], bs)
            m.allocate(done, 0)
            done.num_scheduled_tokens = len(done)
            m.hash_blocks(done)
            again = ch25.Sequence(list(range(prompt_len)), bs)
            hits = prompt_len // bs
            assert m.can_allocate(again) * bs == ref.num_cached_tokens_on_hit(prompt_len, bs, hits)


def test_logits_indices_of_the_worked_example():
    # vllm_and_beyond.md §D.2: 3 requests, 6 inputs → rows [3, 4, 5]
    assert ref.logits_indices([4, 1, 1]).tolist() == [3, 4, 5]
    assert ref.logits_indices(torch.tensor([], dtype=torch.int64)).dtype == torch.int64


# -- the provided input checks (outside the solution regions: unit tests, no graded checks) ---------------------


@pytest.mark.parametrize(
    "tokens, block_size, keys",
    [
        ([1, 2, 3, 4], 2, {"cache_salt": ""}),
        (list(range(8)), 4, {"cache_salt": 5}),
        (list(range(8)), 4, {"lora_id": 0}),
        (list(range(8)), 4, {"mm_hashes": [("a", 6, 4)]}),
        (list(range(8)), 4, {"mm_hashes": [("a", 4, 2), ("b", 1, 2)]}),
        (list(range(8)), 4, {"mm_hashes": [("a", 1, 3), ("b", 2, 2)]}),
        (list(range(8)), 4, {"mm_hashes": [("a", 1, 0)]}),
        (list(range(8)), 4, {"mm_hashes": [("", 1, 2)]}),
        (list(range(8)), 0, {}),
        ([1, -2, 3], 1, {}),
    ],
)
def test_the_provided_request_check_refuses_bad_inputs(tokens, block_size, keys):
    with pytest.raises(ValueError):
        ref.block_hashes(tokens, block_size, **keys)


@pytest.mark.parametrize("args", [(0, 16, 0), (32, 0, 0), (32, 16, -1), (32, 16, 3), (31, 16, 2)])
def test_the_provided_hit_check_refuses_bad_counts(args):
    with pytest.raises(ValueError):
        ref.num_cached_tokens_on_hit(*args)


@pytest.mark.parametrize("lens", [[3, 0, 2], [[1, 2], [3, 4]], torch.tensor([2, -1])])
def test_the_provided_length_check_refuses_bad_lengths(lens):
    with pytest.raises(ValueError):
        ref.logits_indices(lens)
