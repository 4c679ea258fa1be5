"""Draft tokens by prompt lookup: speculative decoding's n-gram drafter, as vLLM's `NgramProposer` proposes them.

A request's own tokens often repeat (code, quoted text, a model that loops), so its next tokens are guessed by
looking its last n tokens up earlier in the sequence (`vllm/v1/spec_decode/ngram_proposer.py`): the longest n in
[min_n, max_n] whose n-gram ending the sequence occurs before, at its earliest occurrence, proposes the (up to) k
tokens that followed it there. No model runs; the target model verifies the drafts (ch32's `verify_draft`).
"""

from __future__ import annotations


def propose(tokens: list[int], *, k: int, min_n: int = 2, max_n: int = 4) -> list[int]:
    """Up to `k` draft tokens for the sequence `tokens`, or [] when no n-gram of its end recurs.

    Example:
        >>> propose([1, 2, 3, 4, 2, 3], k=4, min_n=2, max_n=3)   # [2, 3] occurs at 1: 4, 2, 3 followed it
        [4, 2, 3]
    """
    total = len(tokens)
    if k < 1 or total < min_n:
        return []
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        suffix = tokens[total - n :]
        for start in range(total - n):  # earliest occurrence first, never the suffix itself
            if tokens[start : start + n] == suffix:
                follow = start + n
                return tokens[follow : follow + k]
    return []
