"""Public checks of ch17 · causal masks, and the messages they share with the hidden ones."""

from __future__ import annotations

import torch

from grader.authoring import CheckFailed, Trial, expect_tensor, first_wrong, mistakes, public, wrong_mask
from grader.i18n import mark, tr

FIGURE_TOKENS = 6
FIGURE_NEW, FIGURE_CACHED = 2, 3

CONVENTION = mark("True = may attend, the scaled_dot_product_attention convention")
M = mistakes("ch17")


# -- 17.1 -------------------------------------------------------------------------------------


@public("ch17.1", "figure instance: a whole sequence of 6 tokens")
def figure_instance(t: Trial) -> None:
    got = t.yours.causal_mask(FIGURE_TOKENS)
    want = t.ref.causal_mask(FIGURE_TOKENS)
    mask = expect_mask_structure(got, want, FIGURE_TOKENS, 0, whole=True)
    t.figure("ch17-causal-mask", num_tokens=FIGURE_TOKENS, yours=mask, expected=want)
    expect_mask(mask, want, FIGURE_TOKENS, 0, whole=True)


@public("ch17.1", "a single token sees itself")
def single_token(t: Trial) -> None:
    run_whole_case(t, 1)


@public("ch17.1", "every length from 1 to 9")
def small_lengths(t: Trial) -> None:
    for n in range(1, 10):
        run_whole_case(t, n)


@public("ch17.1", "an empty sequence gives an empty [0, 0] mask")
def empty_sequence(t: Trial) -> None:
    run_whole_case(t, 0)


# -- 17.2 -------------------------------------------------------------------------------------


@public("ch17.2", "figure instance: 2 new tokens after 3 cached")
def offset_figure_instance(t: Trial) -> None:
    got = t.yours.causal_mask_with_offset(FIGURE_NEW, FIGURE_CACHED)
    want = t.ref.causal_mask_with_offset(FIGURE_NEW, FIGURE_CACHED)
    mask = expect_mask_structure(got, want, FIGURE_NEW, FIGURE_CACHED, whole=False)
    t.figure("ch17-offset-mask", num_new=FIGURE_NEW, num_cached=FIGURE_CACHED, yours=mask, expected=want)
    expect_mask(mask, want, FIGURE_NEW, FIGURE_CACHED, whole=False)


@public("ch17.2", "a decode step: 1 new token after 7 cached sees all 8 keys")
def decode_step(t: Trial) -> None:
    run_offset_case(t, 1, 7)


@public("ch17.2", "a chunk longer than its prefix: 4 new after 2 cached")
def long_chunk(t: Trial) -> None:
    run_offset_case(t, 4, 2)


@public("ch17.2", "nothing cached: 5 new tokens give the whole-sequence mask")
def nothing_cached(t: Trial) -> None:
    run_offset_case(t, 5, 0)


# -- the explanations, shared with the hidden checks -----------------------------------------------------


def keys_text(row: list[bool] | torch.Tensor) -> str:
    """The keys a mask row lets its query see, as ranges: 'keys 0–3', 'only key 0', 'no key at all'."""
    idx = [j for j, v in enumerate(row.tolist() if isinstance(row, torch.Tensor) else row) if v]
    if not idx:
        return tr("no key at all")
    if len(idx) == 1:
        return tr("only key {j}", j=idx[0])
    ranges, start, prev = [], idx[0], idx[0]
    for j in idx[1:]:
        if j != prev + 1:
            ranges.append((start, prev))
            start = j
        prev = j
    ranges.append((start, prev))
    parts = [str(a) if a == b else f"{a}–{b}" for a, b in ranges]
    if len(parts) > 4:
        parts = parts[:4] + [tr("… ({n} keys in all)", n=len(idx))]
    return tr("keys {ranges}", ranges=", ".join(parts))


def visible_text(position: int) -> str:
    """What the query at `position` must see, in words."""
    return tr("only key 0 (itself)") if position == 0 else tr("keys 0–{p}", p=position)


def where_text(i: int, num_cached: int, whole: bool) -> str:
    """Where query i of a mask stands, in words: 'position 4', 'absolute position 3 + 1 = 4'."""
    p = num_cached + i
    if whole or not num_cached:
        return tr("position {p}", p=p)
    return tr("absolute position {num_cached} + {i} = {p}", num_cached=num_cached, i=i, p=p)


def inputs_line(num_new: int, num_cached: int, whole: bool) -> str:
    if whole:
        return tr("inputs: num_tokens={n} → a [{n}, {n}] mask, one row per query, one column per key", n=num_new)
    s = num_new + num_cached

    def span(a: int, b: int) -> str:
        return tr("key {a}", a=a) if a == b else tr("keys {a}–{b}", a=a, b=b)

    fields = {"num_new": num_new, "num_cached": num_cached, "s": s}
    if num_cached and num_new:
        return tr(
            "inputs: num_new={num_new}, num_cached={num_cached} → a [{num_new}, {s}] mask ({cached} cached, {new} new)",
            cached=span(0, num_cached - 1),
            new=span(num_cached, s - 1),
            **fields,
        )
    if num_new:
        return tr("inputs: num_new={num_new}, num_cached={num_cached} → a [{num_new}, {s}] mask (no cached keys)", **fields)
    return tr("inputs: num_new={num_new}, num_cached={num_cached} → a [{num_new}, {s}] mask (no queries)", **fields)


def structure_hint(got: object, shape: list[int], want: torch.Tensor, num_new: int, num_cached: int, whole: bool) -> str:
    """Why a mask of the wrong type or shape is wrong ('' when nothing specific fits)."""
    if not isinstance(got, torch.Tensor):
        return tr("return a torch.Tensor of dtype torch.bool ({convention})", convention=tr(CONVENTION))
    if list(got.shape) == list(shape):
        if (
            got.dtype.is_floating_point
            and bool(((got == 0) == want).all())
            and bool(torch.isinf(got[~want]).all())
            and want.numel()
            and not bool(want.all())
        ):
            return M.additive
        if bool((got.to(torch.float64) == want.to(torch.float64)).all()):
            return M.float_values if got.dtype.is_floating_point else M.int_values
        return tr("a mask is a bool tensor: {convention}", convention=tr(CONVENTION))
    got_shape, s = list(got.shape), num_new + num_cached
    if whole:
        return tr("one row per query and one column per key: a square [T, T] mask") if got.dim() != 2 else ""
    if num_cached and got_shape == [num_new, num_new]:
        return M.new_keys_only
    if num_cached and got_shape == [s, s]:
        return M.every_row
    if num_new and got_shape == [num_new, num_cached]:
        return M.cached_keys_only
    if num_new != s and got_shape == [s, num_new]:
        return M.keys_by_queries
    return ""


def mask_hint(mask: torch.Tensor, want: torch.Tensor, num_new: int, num_cached: int, whole: bool) -> str:
    """The misconception a wrong bool mask most likely comes from ('' when none fits)."""
    ones = torch.ones(num_new, num_new + num_cached, dtype=torch.bool)
    c = num_cached
    if c and torch.equal(mask, ones.tril()):
        return M.topleft
    if torch.equal(mask, ones.tril(c - 1)):
        return M.drop_diagonal if whole else M.drop_diagonal_offset
    if torch.equal(mask, ~want):
        return M.inverted
    if torch.equal(mask, ones.triu(c)) or torch.equal(mask, ones.triu(c + 1)):
        return M.triu
    if bool(mask.all()):
        return M.no_mask
    if c and not bool(mask[:, :c].any()) and torch.equal(mask[:, c:], want[:, c:]):
        return M.prefix_hidden
    if torch.equal(mask, ones.tril(c + 1)):
        return M.one_ahead
    return ""


def mask_problem(mask: torch.Tensor, want: torch.Tensor, num_new: int, num_cached: int, whole: bool) -> CheckFailed | None:
    """The failure explaining the first wrong row of a bool mask of the right shape (None when it is right)."""
    idx = first_wrong(mask, want)
    if idx is None:
        return None
    i, p = idx[0], num_cached + idx[0]
    count = int(wrong_mask(mask, want).sum())
    return CheckFailed(
        tr(
            "query {i} is the token at {where}, so it sees {visible}; your row {i} sees {yours}",
            i=i,
            where=where_text(i, num_cached, whole),
            visible=visible_text(p),
            yours=keys_text(mask[i]),
        ),
        tr("({count} of {total} entries of your mask differ)", count=count, total=want.numel()) if count > 1 else "",
        hint=mask_hint(mask, want, num_new, num_cached, whole),
    )


def expect_mask_structure(got: object, want: torch.Tensor, num_new: int, num_cached: int, *, whole: bool) -> torch.Tensor:
    """Require a 2-D bool tensor of the expected shape, explaining a wrong type or shape."""
    shape = list(want.shape)
    try:
        return expect_tensor(got, what=tr("the mask"), shape=shape, dtype=torch.bool)
    except CheckFailed as e:
        raise CheckFailed(
            inputs_line(num_new, num_cached, whole), *e.lines, hint=structure_hint(got, shape, want, num_new, num_cached, whole)
        ) from None


def expect_mask(got: object, want: torch.Tensor, num_new: int, num_cached: int, *, whole: bool) -> torch.Tensor:
    """Require the mask to equal `want`, explaining the first wrong row in positions and keys."""
    mask = expect_mask_structure(got, want, num_new, num_cached, whole=whole)
    problem = mask_problem(mask, want, num_new, num_cached, whole)
    if problem:
        raise problem.within(inputs_line(num_new, num_cached, whole))
    return mask


def run_whole_case(t: Trial, num_tokens: int) -> torch.Tensor:
    """The student's causal_mask(num_tokens), compared with the reference."""
    got = t.yours.causal_mask(num_tokens)
    return expect_mask(got, t.ref.causal_mask(num_tokens), num_tokens, 0, whole=True)


def run_offset_case(t: Trial, num_new: int, num_cached: int) -> torch.Tensor:
    """The student's causal_mask_with_offset(num_new, num_cached), compared with the reference."""
    got = t.yours.causal_mask_with_offset(num_new, num_cached)
    return expect_mask(got, t.ref.causal_mask_with_offset(num_new, num_cached), num_new, num_cached, whole=False)


def expect_causal(mask: torch.Tensor, num_cached: int, *, whole: bool) -> None:
    """Check a bool mask of the right shape against the rules that need no answer: query i, the token at
    position num_cached + i, sees itself and every key before it and no key after it (the lab's instances
    that have no recorded answer). Explains the first row that breaks a rule, as `expect_mask` does."""
    n, s = mask.shape
    for i in range(n):
        p = num_cached + i
        row = mask[i]
        future, past = row[p + 1 :], row[: p + 1]
        if bool(future.any()) or not bool(past.all()):
            broken = (
                tr("key {k} is in its future", k=p + 1 + int(future.nonzero()[0]))
                if bool(future.any())
                else tr("it must see itself")
                if not bool(row[p])
                else tr("key {k} is in its past", k=int((~past).nonzero()[0]))
            )
            ones = torch.ones(n, s, dtype=torch.bool)
            hint = M.topleft if num_cached and not whole and torch.equal(mask, ones.tril()) else ""
            raise CheckFailed(
                inputs_line(n, num_cached, whole),
                tr(
                    "query {i} is the token at {where}, so it sees {visible}; your row {i} sees {yours} ({broken})",
                    i=i,
                    where=where_text(i, num_cached, False),
                    visible=visible_text(p),
                    yours=keys_text(row),
                    broken=broken,
                ),
                hint=hint,
            )
