"""Public checks of ch21 · the KV cache and the decode step, and the messages they share with the hidden ones."""

from __future__ import annotations

import torch

from grader.authoring import CheckFailed, Trial, describe, expect_int, expect_tensor, mistakes, public, short, vec, wrong_mask
from grader.i18n import tr

# ch21-cache-growth: two layers, each with its own cache of L_max 6 rows, one K/V head of width 2;
# a prefill of 3 tokens, then two decode steps of one token each.
GROWTH_LAYERS, GROWTH_LMAX, GROWTH_STEPS = 2, 6, (3, 1, 1)

# ch21-decode-step: nano-vllm's example (table [7, 2], len 300, bs 256) scaled down to block_size 4.
DECODE_TOKENS, DECODE_TABLE, DECODE_BS = [5, 9, 2, 8, 4, 6, 3], [7, 2], 4
# reference/nanovllm.md §12, prepare_decode (bs 256): (len, block_table).
NANO_EXAMPLES = [(300, [7, 2]), (10, [5])]

DECODE_KEYS = ("input_id", "position", "context_len", "slot")
M = mistakes("ch21")


# -- ch21.1 append_kv ---------------------------------------------------------------------------------


@public("ch21.1", "figure instance: a prefill of 3, then two decode steps, in each of two layers")
def growth_figure_instance(t: Trial) -> None:
    shape = (GROWTH_LMAX, 1, 2)
    yours, expected, wrong, lengths, calls = [], [], [], [], []
    for layer in range(GROWTH_LAYERS):
        k_cache, v_cache, want_k, want_v = (torch.zeros(shape) for _ in range(4))
        length = 0
        snaps, want_snaps, bad, returned = [], [], [], []
        for n in GROWTH_STEPS:
            k_new, v_new = growth_kv(layer, length, n)
            call = t.yours.append_kv.run(k_cache, v_cache, length, k_new, v_new, mutates=("k_cache", "v_cache"))
            got_k = expect_tensor(call.args[0], what="k_cache", shape=list(shape), dtype=torch.float32)
            got_v = expect_tensor(call.args[1], what="v_cache", shape=list(shape), dtype=torch.float32)
            before = (want_k.clone(), want_v.clone())
            t.ref.append_kv(want_k, want_v, length, k_new, v_new)
            snaps.append([got_k[:, 0].tolist(), got_v[:, 0].tolist()])
            want_snaps.append([want_k[:, 0].tolist(), want_v[:, 0].tolist()])
            bad.append([wrong_rows(got_k, want_k).tolist(), wrong_rows(got_v, want_v).tolist()])
            returned.append(call.value if type(call.value) is int else None)
            calls.append((layer, length, n, call, before, want_k.clone(), want_v.clone(), k_new, v_new))
            k_cache, v_cache = got_k, got_v  # the next step appends to the cache this one wrote
            length += n
        yours.append(snaps)
        expected.append(want_snaps)
        wrong.append(bad)
        lengths.append(returned)
    t.figure(
        "ch21-cache-growth", l_max=GROWTH_LMAX, steps=list(GROWTH_STEPS), caches=yours, expected=expected, wrong=wrong, lengths=lengths
    )
    for layer, length, n, call, (before_k, before_v), want_k, want_v, k_new, v_new in calls:
        label = (
            tr("layer {layer}, prefill", layer=layer)
            if length == 0
            else tr("layer {layer}, decode step {step}", layer=layer, step=length - GROWTH_STEPS[0] + 1)
        )
        explain_length(label, call.value, length, n)
        explain_append(label, call.args[0], call.args[1], want_k, want_v, before_k, before_v, k_new, v_new, length)


@public("ch21.1", "rows beyond the new length keep their values")
def rows_beyond_untouched(t: Trial) -> None:
    k_cache, v_cache = torch.randn(8, 2, 4, generator=t.rng), torch.randn(8, 2, 4, generator=t.rng)
    run_appends(t, k_cache, v_cache, 2, [3], tr("a cache of L_max 8 with 2 cached rows (random contents)"))


# -- ch21.2 decode_inputs -----------------------------------------------------------------------------


@public("ch21.2", "figure instance: 7 tokens, block_table [7, 2], block_size 4")
def decode_figure_instance(t: Trial) -> None:
    got = expect_decode(t.yours.decode_inputs(list(DECODE_TOKENS), list(DECODE_TABLE), DECODE_BS), DECODE_TOKENS, DECODE_TABLE, DECODE_BS)
    want = t.ref.decode_inputs(DECODE_TOKENS, DECODE_TABLE, DECODE_BS)
    neighbours = t.ref.drive(neighbour_slots, DECODE_TOKENS, DECODE_TABLE, DECODE_BS)
    t.figure("ch21-decode-step", token_ids=DECODE_TOKENS, table=DECODE_TABLE, block_size=DECODE_BS, yours=got, expected=want)
    explain_decode(got, want, DECODE_TOKENS, DECODE_TABLE, DECODE_BS, tr("figure instance"), neighbours)


@public("ch21.2", "nano-vllm's examples (block_size 256): len 300 with table [7, 2], len 10 with table [5]")
def nano_vllm_examples(t: Trial) -> None:
    rows, checks = [], []
    for length, table in NANO_EXAMPLES:
        ids = [(7 * i + 3) % 1000 for i in range(length)]
        got = expect_decode(t.yours.decode_inputs(ids, list(table), 256), ids, table, 256)
        want = t.ref.decode_inputs(ids, table, 256)
        rows.append({"len": length, "table": table, "yours": got, "expected": want})
        checks.append((got, want, ids, table, t.ref.drive(neighbour_slots, ids, table, 256)))
    t.figure("ch21-decode-step", examples=rows)
    for got, want, ids, table, neighbours in checks:
        explain_decode(got, want, ids, table, 256, tr("nano-vllm, len {n}, table {table}", n=len(ids), table=table), neighbours)


@public("ch21.2", "the first token of a new block: len 5, block_size 4, block_table [3, 6]")
def new_block(t: Trial) -> None:
    run_decode_case(t, [4, 4, 1, 9, 7], [3, 6], 4, tr("the first token of a new block"))


@public("ch21.2", "a block table with a spare block (pre-allocated, as in vLLM)")
def spare_block(t: Trial) -> None:
    run_decode_case(t, [1, 2, 3, 4, 5, 6], [4, 0, 9], 4, tr("a block table with a spare block"))


@public("ch21.2", "a block table too short for position len − 1 raises ValueError")
def table_too_short(t: Trial) -> None:
    expect_short_table(t, [1, 2, 3, 4, 5], [3], 4, tr("position 4 is in logical block 1, but the table has only block 0"))


# -- helpers of ch21.1: the caches an append wrote, explained ------------------------------------------------


def growth_kv(layer: int, start: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Readable K/V for the figure: layer ℓ's token t has K = [100ℓ + 10(t+1) + 1, … + 2] and V = −K."""
    t = torch.arange(start + 1, start + n + 1, dtype=torch.float32)[:, None] * 10 + 100 * layer
    k = (t + torch.tensor([1.0, 2.0]))[:, None, :]
    return k, -k


def wrong_rows(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Per row of a cache (a token), whether any of its values differs: the verdict of `explain_append`."""
    return wrong_mask(got, want).reshape(got.shape[0], -1).any(dim=1)


def run_appends(
    t: Trial, k_cache: torch.Tensor, v_cache: torch.Tensor, length: int, sizes: list[int], what: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Several appends in a row, each into the caches the previous call wrote (random K/V)."""
    _, heads, dim = k_cache.shape
    for step, n in enumerate(sizes):
        k_new = torch.randn(n, heads, dim, generator=t.rng).to(k_cache.dtype)
        v_new = torch.randn(n, heads, dim, generator=t.rng).to(k_cache.dtype)
        k_cache, v_cache = append_once(
            t,
            k_cache,
            v_cache,
            length,
            k_new,
            v_new,
            tr("{what}, append {step} of {count} (sizes {sizes})", what=what, step=step + 1, count=len(sizes), sizes=list(sizes)),
        )
        length += n
    return k_cache, v_cache


def append_once(
    t: Trial, k_cache: torch.Tensor, v_cache: torch.Tensor, length: int, k_new: torch.Tensor, v_new: torch.Tensor, label: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """One call of the student's append_kv, compared with the reference; returns the caches it wrote."""
    call = t.yours.append_kv.run(k_cache, v_cache, length, k_new, v_new, mutates=("k_cache", "v_cache"))
    want_k, want_v = k_cache.clone(), v_cache.clone()
    t.ref.append_kv(want_k, want_v, length, k_new, v_new)
    explain_length(label, call.value, length, k_new.shape[0])
    explain_append(label, call.args[0], call.args[1], want_k, want_v, k_cache, v_cache, k_new, v_new, length)
    return call.args[0], call.args[1]


def explain_length(label: str, got, length: int, n: int) -> int:
    """Require the returned length to be the Python int length + n."""
    value = expect_int(got, what=tr("append_kv's return value (the new length), {label}", label=label))
    if value == length + n:
        return value
    raise CheckFailed(
        tr(
            "{label}: {length} cached + {n} new → the new length is {length} + {n} = {total}; yours: {value}",
            label=label,
            length=length,
            n=n,
            total=length + n,
            value=value,
        ),
        hint=length_hint(value, length, n),
    )


def length_hint(value: int, length: int, n: int) -> str:
    """The misreading of the returned length that gives `value` after appending n tokens at `length`, when exactly one
    does ('' otherwise: with n = 0 the old length is the right one, and misreadings may coincide)."""
    readings = [(M.old_length, length), (M.count_only, n), (M.last_index, length + n - 1)]
    fits = [hint for hint, v in readings if v == value != length + n]
    return fits[0] if len(fits) == 1 else ""


def explain_append(
    label: str,
    got_k: torch.Tensor,
    got_v: torch.Tensor,
    want_k: torch.Tensor,
    want_v: torch.Tensor,
    before_k: torch.Tensor,
    before_v: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    length: int,
) -> None:
    """Require both caches to equal the expected ones, explaining the first wrong row in token terms."""
    n = k_new.shape[0]
    for name, got, want, before, new, other in (
        ("k_cache", got_k, want_k, before_k, k_new, v_new),
        ("v_cache", got_v, want_v, before_v, v_new, k_new),
    ):
        expect_tensor(got, what=name, shape=list(want.shape), dtype=want.dtype)
        bad = wrong_rows(got, want)
        if not bad.any():
            continue
        r = int(bad.nonzero()[0])
        kv = name[0].upper()
        if length <= r < length + n:
            what = tr(
                "{name} row {r} is new token {i} of this append (new rows go to length … length + n − 1 = "
                "{first} … {last}), so it should hold its {kv} {want}; yours holds {got}",
                name=name,
                r=r,
                i=r - length,
                first=length,
                last=length + n - 1,
                kv=kv,
                want=vec(want[r]),
                got=vec(got[r]),
            )
        elif r < length:
            what = tr(
                "{name} row {r} holds a token cached before this append and must keep its {kv} {want}; yours holds {got}",
                name=name,
                r=r,
                kv=kv,
                want=vec(want[r]),
                got=vec(got[r]),
            )
        else:
            what = tr(
                "{name} row {r} is beyond the new length {total} and must keep its old value {want}; yours holds {got}",
                name=name,
                r=r,
                total=length + n,
                want=vec(want[r]),
                got=vec(got[r]),
            )
        raise CheckFailed(
            tr("{label}: length={length}, n={n}, L_max={l_max}", label=label, length=length, n=n, l_max=got.shape[0]),
            what,
            hint=append_hint(got, want, before, new, other, length),
        )


def append_hint(
    got: torch.Tensor, want: torch.Tensor, before: torch.Tensor, new: torch.Tensor, other_new: torch.Tensor, length: int
) -> str:
    """The misconception a wrong cache most likely comes from ('' when none fits)."""
    n, L = new.shape[0], got.shape[0]
    if n and torch.equal(got[length : length + n], other_new.to(got.dtype)):
        return M.swapped_kv
    if n and length and torch.equal(got[:n], new.to(got.dtype)):
        rows = (
            tr("row length = {length}, not row 0", length=length)
            if n == 1
            else tr("rows length … length + n − 1 = {length} … {last}, not 0 … {n1}", length=length, last=length + n - 1, n1=n - 1)
        )
        return M.row_zero.format(length=length, rows=rows)
    if n and length and torch.equal(got[length - 1 : length - 1 + n], new.to(got.dtype)):
        return M.one_early.format(length=length, before=length - 1)
    if n and length + n < L and torch.equal(got[length + 1 : length + 1 + n], new.to(got.dtype)):
        return M.one_late.format(length=length, after=length + 1)
    rest = slice(length + n, L)
    if L > length + n and not torch.equal(got[rest], before[rest]) and torch.equal(got[: length + n], want[: length + n]):
        return M.clears_rest
    return ""


# -- helpers of ch21.2: the four inputs of a decode step, explained --------------------------------------------


def expect_decode(got, token_ids: list[int], table: list[int], block_size: int) -> dict:
    """Require a dict of the four Python ints; return it (values not yet compared)."""
    if type(got) is not dict:
        raise CheckFailed(tr("expected a dict with keys {keys}; yours: {got}", keys=", ".join(DECODE_KEYS), got=describe(got)))
    missing = [k for k in DECODE_KEYS if k not in got]
    if missing:
        raise CheckFailed(
            tr(
                "the dict lacks {missing}; expected keys {keys}, yours: {got}",
                missing=", ".join(missing),
                keys=", ".join(DECODE_KEYS),
                got=", ".join(map(str, got)),
            )
        )
    return {k: expect_int(got[k], what=f"{k}") for k in DECODE_KEYS}


def neighbour_slots(ref, token_ids: list[int], table: list[int], bs: int) -> dict:
    """A driver of the reference: the slots of the positions before and after the newest token (None where the
    reference refuses the sequence), for the hints of `explain_decode`."""

    def slot(ids: list[int]) -> int | None:
        try:
            return ref.decode_inputs(ids, table, bs)["slot"]
        except ValueError:
            return None

    return {"previous": slot(token_ids[:-1]), "next": slot(token_ids + token_ids[-1:])}


def expect_short_table(t: Trial, token_ids: list[int], table: list[int], block_size: int, because: str) -> None:
    """Require decode_inputs to refuse a table that does not reach position len − 1 (ValueError), naming the
    mistake when it returned a slot or failed some other way."""
    try:
        t.expect_raises(ValueError, t.yours.decode_inputs, list(token_ids), list(table), block_size, because=because)
    except CheckFailed as e:
        raise CheckFailed(*e.lines, hint=M.short_table) from None


def run_decode_case(t: Trial, token_ids: list[int], table: list[int], block_size: int, case: str) -> dict:
    got = expect_decode(t.yours.decode_inputs(list(token_ids), list(table), block_size), token_ids, table, block_size)
    want = t.ref.decode_inputs(token_ids, table, block_size)
    explain_decode(got, want, token_ids, table, block_size, case, t.ref.drive(neighbour_slots, token_ids, table, block_size))
    return got


def explain_decode(got: dict, want: dict, token_ids: list[int], table: list[int], bs: int, case: str, neighbours: dict) -> None:
    """Explain every wrong value of the decode inputs, with a hint for the first (`neighbours`:
    `t.ref.drive(neighbour_slots, token_ids, table, bs)`, asked before comparing)."""
    n = len(token_ids)
    pos = n - 1
    wrong = [k for k in DECODE_KEYS if got[k] != want[k]]
    if not wrong:
        return
    lines = [
        tr(
            'case "{case}": token_ids={ids} (len {n}), block_table={table}, block_size={bs}',
            case=case,
            ids=short(token_ids, limit=10),
            n=n,
            table=table,
            bs=bs,
        ),
        tr(
            "the newest token, token_ids[-1] = {last}, was sampled by the previous step and has no K/V yet: this step computes it",
            last=token_ids[-1],
        ),
    ]
    hints: list[str] = []
    for k in wrong:
        y = got[k]
        if k == "input_id":
            lines.append(tr("input_id = token_ids[-1] = {want}; yours: {got}", want=want[k], got=y))
            if n > 1 and y == token_ids[-2]:
                hints.append(M.previous_token)
        elif k == "position":
            lines.append(tr("position = len − 1 = {n} − 1 = {want}; yours: {got}", n=n, want=want[k], got=y))
            if y == n:
                hints.append(M.position_len)
            elif y == n - 2:
                hints.append(M.position_previous)
        elif k == "context_len":
            lines.append(
                tr(
                    "context_len = len = {want}: attention reads every cached entry, the newest one included; yours: {got}",
                    want=want[k],
                    got=y,
                )
            )
            if y == n - 1:
                hints.append(M.context_short)
        else:
            lb, off = divmod(pos, bs)
            lines.append(
                tr(
                    "position {pos} → logical block {pos} // {bs} = {lb}, offset {pos} % {bs} = {off}; "
                    "block_table[{lb}] = {block}, so slot = {block}·{bs} + {off} = {want}; yours: {got}",
                    pos=pos,
                    bs=bs,
                    lb=lb,
                    off=off,
                    block=table[lb],
                    want=want[k],
                    got=y,
                )
            )
            fits = []  # every misconception this one slot fits; a hint only when it fits just one
            if y == neighbours["previous"]:
                fits.append(M.previous_slot.format(previous=pos - 1, position=pos))
            if y == neighbours["next"] or y == want[k] + 1:
                fits.append(M.next_slot.format(n=n, position=pos))
            if y == pos:
                fits.append(M.position_as_slot)
            if len(table) - 1 != lb and y == table[-1] * bs + off:
                fits.append(M.table_last.format(last=table[-1], position=pos))
            if y == table[lb]:
                fits.append(M.block_id_as_slot)
            hints += fits if len(fits) == 1 else []
    raise CheckFailed(*lines, hint=hints[0] if hints else "")
