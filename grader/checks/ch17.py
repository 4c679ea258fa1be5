"""Public checks of ch17 · causal masks, and the messages they share with the hidden ones."""

from __future__ import annotations

import torch

from grader.checks import public
from grader.compare import CheckFailed, expect_tensor, first_wrong, wrong_mask
from grader.trial import Trial

FIGURE_TOKENS = 6
FIGURE_NEW, FIGURE_CACHED = 2, 3

CONVENTION = "True = may attend, the scaled_dot_product_attention convention"


def keys_text(row: list[bool] | torch.Tensor) -> str:
    """The keys a mask row lets its query see, as ranges: 'keys 0–3', 'only key 0', 'no key at all'."""
    idx = [j for j, v in enumerate(row.tolist() if isinstance(row, torch.Tensor) else row) if v]
    if not idx:
        return "no key at all"
    if len(idx) == 1:
        return f"only key {idx[0]}"
    ranges, start, prev = [], idx[0], idx[0]
    for j in idx[1:]:
        if j != prev + 1:
            ranges.append((start, prev))
            start = j
        prev = j
    ranges.append((start, prev))
    parts = [str(a) if a == b else f"{a}–{b}" for a, b in ranges]
    if len(parts) > 4:
        parts = parts[:4] + [f"… ({len(idx)} keys in all)"]
    return "keys " + ", ".join(parts)


def visible_text(position: int) -> str:
    """What the query at `position` must see, in words."""
    return "only key 0 (itself)" if position == 0 else f"keys 0–{position}"


def inputs_line(num_new: int, num_cached: int, whole: bool) -> str:
    if whole:
        return f"inputs: num_tokens={num_new} → a [{num_new}, {num_new}] mask, one row per query, one column per key"
    s = num_new + num_cached
    def span(a: int, b: int) -> str:
        return f"key {a}" if a == b else f"keys {a}–{b}"
    keys = (f"{span(0, num_cached - 1)} cached, {span(num_cached, s - 1)} new" if num_cached and num_new
            else "no cached keys" if num_new else "no queries")
    return f"inputs: num_new={num_new}, num_cached={num_cached} → a [{num_new}, {s}] mask ({keys})"


def structure_hint(got: object, shape: list[int], want: torch.Tensor, num_new: int, num_cached: int,
                   whole: bool) -> str:
    """Why a mask of the wrong type or shape is wrong ('' when nothing specific fits)."""
    if not isinstance(got, torch.Tensor):
        return f"return a torch.Tensor of dtype torch.bool ({CONVENTION})"
    if list(got.shape) == list(shape):
        if got.dtype.is_floating_point and bool(((got == 0) == want).all()) and bool(torch.isinf(got[~want]).all()) \
                and want.numel() and not bool(want.all()):
            return ("that is the additive form (0 where visible, −∞ where hidden) that scaled_dot_product_attention "
                    f"also accepts; this course asks for the boolean form: {CONVENTION}")
        if bool((got.to(torch.float64) == want.to(torch.float64)).all()):
            if got.dtype.is_floating_point:
                return ("your values are right, but not bool: scaled_dot_product_attention *adds* a float attn_mask "
                        "to the scores (1 and 0 would be biases, nothing would be hidden); build the mask with "
                        "dtype=torch.bool or call .bool()")
            return ("your values are right, but not bool: scaled_dot_product_attention refuses an integer attn_mask; "
                    "build the mask with dtype=torch.bool or call .bool()")
        return f"a mask is a bool tensor: {CONVENTION}"
    got_shape, s = list(got.shape), num_new + num_cached
    if whole:
        return "one row per query and one column per key: a square [T, T] mask" if got.dim() != 2 else ""
    if num_cached and got_shape == [num_new, num_new]:
        return ("the keys are the num_cached cached tokens followed by the num_new new ones: "
                "num_cached + num_new columns")
    if num_cached and got_shape == [s, s]:
        return ("one row per new query only: the cached tokens' queries were computed in an earlier step, "
                "only their K/V are reused")
    if num_new and got_shape == [num_new, num_cached]:
        return "the new tokens are keys too: each new query also sees the earlier new tokens and itself"
    if num_new != s and got_shape == [s, num_new]:
        return "rows are the queries (num_new of them), columns the keys (num_cached + num_new)"
    return ""


def mask_hint(mask: torch.Tensor, want: torch.Tensor, num_new: int, num_cached: int, whole: bool) -> str:
    """The misconception a wrong bool mask most likely comes from ('' when none fits)."""
    ones = torch.ones(num_new, num_new + num_cached, dtype=torch.bool)
    c = num_cached
    if c and torch.equal(mask, ones.tril()):
        return ("a chunk after a cached prefix is offset by num_cached: use tril with diagonal=num_cached, "
                "not the top-left corner (tril(ones(L, S)) gives the rows of positions 0 … L − 1)")
    if torch.equal(mask, ones.tril(c - 1)):
        if whole:
            return ("keep the diagonal: the output at position i predicts token i + 1 and must see token i itself "
                    "(torch.tril keeps it with its default diagonal=0)")
        return "keep the diagonal: query i sees its own key num_cached + i, so tril's diagonal is num_cached, not num_cached − 1"
    if torch.equal(mask, ~want):
        return (f"{CONVENTION}; your mask is its inverse, True where a key is hidden "
                "(an additive mask would put −∞ there; a bool mask keeps True for the visible keys)")
    if torch.equal(mask, ones.triu(c)) or torch.equal(mask, ones.triu(c + 1)):
        return "rows are queries and columns keys: a query sees the keys before it (tril), not the ones after it (triu)"
    if bool(mask.all()):
        return "every query sees every key here; the keys after the query's own position (the future) must be hidden"
    if c and not bool(mask[:, :c].any()) and torch.equal(mask[:, c:], want[:, c:]):
        return ("the cached prefix is the same sequence's earlier tokens: every new query sees all num_cached "
                "cached keys")
    if torch.equal(mask, ones.tril(c + 1)):
        return ("off by one: key num_cached + i + 1 is the next token, the one query i predicts; it is still "
                "in the future")
    return ""


def mask_problem(mask: torch.Tensor, want: torch.Tensor, num_new: int, num_cached: int, whole: bool) -> list[str]:
    """The lines explaining the first wrong row of a bool mask of the right shape ([] when it is right)."""
    idx = first_wrong(mask, want)
    if idx is None:
        return []
    i, p = idx[0], num_cached + idx[0]
    where = f"position {p}" if whole else f"absolute position {num_cached} + {i} = {p}" if num_cached else f"position {p}"
    line = (f"query {i} is the token at {where}, so it sees {visible_text(p)}; "
            f"your row {i} sees {keys_text(mask[i])}")
    count = int(wrong_mask(mask, want).sum())
    lines = [line] + ([f"({count} of {want.numel()} entries of your mask differ)"] if count > 1 else [])
    hint = mask_hint(mask, want, num_new, num_cached, whole)
    return lines + ([f"hint: {hint}"] if hint else [])


def expect_mask_structure(got: object, want: torch.Tensor, num_new: int, num_cached: int, *,
                          whole: bool) -> torch.Tensor:
    """Require a 2-D bool tensor of the expected shape, explaining a wrong type or shape."""
    shape = list(want.shape)
    try:
        return expect_tensor(got, what="the mask", shape=shape, dtype=torch.bool)
    except CheckFailed as e:
        hint = structure_hint(got, shape, want, num_new, num_cached, whole)
        raise CheckFailed(f"{inputs_line(num_new, num_cached, whole)}\n{e}" + (f"\nhint: {hint}" if hint else "")) \
            from None


def expect_mask(got: object, want: torch.Tensor, num_new: int, num_cached: int, *, whole: bool) -> torch.Tensor:
    """Require the mask to equal `want`, explaining the first wrong row in positions and keys."""
    mask = expect_mask_structure(got, want, num_new, num_cached, whole=whole)
    lines = mask_problem(mask, want, num_new, num_cached, whole)
    if lines:
        raise CheckFailed("\n".join([inputs_line(num_new, num_cached, whole)] + lines))
    return mask


def run_whole_case(t: Trial, num_tokens: int) -> torch.Tensor:
    """The student's causal_mask(num_tokens), compared with the reference."""
    got = t.call("causal_mask", num_tokens)
    return expect_mask(got, t.ref.causal_mask(num_tokens), num_tokens, 0, whole=True)


def run_offset_case(t: Trial, num_new: int, num_cached: int) -> torch.Tensor:
    """The student's causal_mask_with_offset(num_new, num_cached), compared with the reference."""
    got = t.call("causal_mask_with_offset", num_new, num_cached)
    return expect_mask(got, t.ref.causal_mask_with_offset(num_new, num_cached), num_new, num_cached, whole=False)


# -- 17.1 -------------------------------------------------------------------------------------

@public("17.1", "figure instance: a whole sequence of 6 tokens")
def figure_instance(t: Trial) -> None:
    got = t.call("causal_mask", FIGURE_TOKENS)
    want = t.ref.causal_mask(FIGURE_TOKENS)
    mask = expect_mask_structure(got, want, FIGURE_TOKENS, 0, whole=True)
    t.figure("ch17-causal-mask", num_tokens=FIGURE_TOKENS, yours=mask, expected=want)
    expect_mask(mask, want, FIGURE_TOKENS, 0, whole=True)


@public("17.1", "a single token sees itself")
def single_token(t: Trial) -> None:
    run_whole_case(t, 1)


@public("17.1", "every length from 1 to 9")
def small_lengths(t: Trial) -> None:
    for n in range(1, 10):
        run_whole_case(t, n)


@public("17.1", "an empty sequence gives an empty [0, 0] mask")
def empty_sequence(t: Trial) -> None:
    run_whole_case(t, 0)


@public("17.1", "a negative or fractional length raises ValueError")
def bad_length(t: Trial) -> None:
    t.expect_raises(ValueError, "causal_mask", -1, because="a sequence cannot have −1 tokens")
    t.expect_raises(ValueError, "causal_mask", 2.5, because="num_tokens counts tokens: 2.5 is not a whole number")


# -- 17.2 -------------------------------------------------------------------------------------

@public("17.2", "figure instance: 2 new tokens after 3 cached")
def offset_figure_instance(t: Trial) -> None:
    got = t.call("causal_mask_with_offset", FIGURE_NEW, FIGURE_CACHED)
    want = t.ref.causal_mask_with_offset(FIGURE_NEW, FIGURE_CACHED)
    mask = expect_mask_structure(got, want, FIGURE_NEW, FIGURE_CACHED, whole=False)
    t.figure("ch17-offset-mask", num_new=FIGURE_NEW, num_cached=FIGURE_CACHED, yours=mask, expected=want)
    expect_mask(mask, want, FIGURE_NEW, FIGURE_CACHED, whole=False)


@public("17.2", "a decode step: 1 new token after 7 cached sees all 8 keys")
def decode_step(t: Trial) -> None:
    run_offset_case(t, 1, 7)


@public("17.2", "a chunk longer than its prefix: 4 new after 2 cached")
def long_chunk(t: Trial) -> None:
    run_offset_case(t, 4, 2)


@public("17.2", "nothing cached: 5 new tokens give the whole-sequence mask")
def nothing_cached(t: Trial) -> None:
    run_offset_case(t, 5, 0)


@public("17.2", "a negative or fractional count raises ValueError")
def bad_counts(t: Trial) -> None:
    t.expect_raises(ValueError, "causal_mask_with_offset", 2, -1, because="num_cached = −1 is not a number of tokens")
    t.expect_raises(ValueError, "causal_mask_with_offset", 2.5, 3,
                    because="num_new counts tokens: 2.5 is not a whole number")
