"""Hidden checks of ch21 · the KV cache and the decode step: random instances from the grading seed,
edge cases, agreement with transformers' DynamicLayer and with a whole generation's decode steps."""

from __future__ import annotations

import torch

from grader.authoring import CheckFailed, Trial, expect_int, expect_tensor, first_named, first_wrong, hidden
from grader.checks.ch21 import (
    append_hint,
    expect_decode,
    expect_short_table,
    explain_decode,
    length_hint,
    neighbour_slots,
    run_appends,
    run_decode_case,
)
from grader.i18n import tr

# -- ch21.1 append_kv ---------------------------------------------------------------------------------


@hidden("ch21.1", "random shapes and sequences of appends (random cache contents)")
def random_appends(t: Trial) -> None:
    first_named(lambda: random_append_case(t) for _ in range(8))  # an append at length 0 cannot show a row off by one


def random_append_case(t: Trial) -> None:
    l_max, heads, dim = t.random.randint(1, 24), t.random.choice([1, 2, 4, 8]), t.random.choice([1, 4, 16, 64])
    length = t.random.randint(0, l_max // 2)
    k_cache, v_cache = torch.randn(l_max, heads, dim, generator=t.rng), torch.randn(l_max, heads, dim, generator=t.rng)
    shown = {"l_max": l_max, "heads": heads, "dim": dim, "length": length}
    case = tr("L_max {l_max}, {heads} kv heads, head_dim {dim}, starting at length {length}", **shown)
    run_appends(t, k_cache, v_cache, length, random_sizes(t, l_max - length), case)


@hidden("ch21.1", "appends of 0 tokens change nothing and return the same length")
def empty_appends(t: Trial) -> None:
    for l_max, length in ((5, 0), (5, 3), (5, 5)):
        k_cache, v_cache = torch.randn(l_max, 2, 3, generator=t.rng), torch.randn(l_max, 2, 3, generator=t.rng)
        run_appends(t, k_cache, v_cache, length, [0], tr("an empty append at length {length} of L_max {l_max}", length=length, l_max=l_max))


@hidden("ch21.1", "appends that fill the cache exactly to L_max")
def exact_fill(t: Trial) -> None:
    k_cache, v_cache = torch.randn(7, 1, 4, generator=t.rng), torch.randn(7, 1, 4, generator=t.rng)
    run_appends(t, k_cache, v_cache, 0, [7], tr("a prefill of exactly L_max = 7 tokens"))
    k_cache, v_cache = torch.randn(7, 1, 4, generator=t.rng), torch.randn(7, 1, 4, generator=t.rng)
    run_appends(t, k_cache, v_cache, 4, [2, 1], tr("decode steps up to the last row of L_max = 7"))


@hidden("ch21.1", "a bfloat16 cache, as engines keep it")
def bf16_cache(t: Trial) -> None:
    k_cache = torch.randn(16, 8, 16, generator=t.rng).to(torch.bfloat16)
    v_cache = torch.randn(16, 8, 16, generator=t.rng).to(torch.bfloat16)
    run_appends(t, k_cache, v_cache, 0, [9, 1, 1], tr("a bfloat16 cache of L_max 16, 8 kv heads, head_dim 16"))


@hidden("ch21.1", "agrees with transformers' DynamicLayer over a prefill and decode steps")
def agrees_with_transformers(t: Trial) -> None:
    t.require("transformers")
    from transformers.cache_utils import DynamicLayer

    layer = DynamicLayer()
    l_max, heads, dim, length = 12, 2, 8, 0
    k_cache, v_cache = torch.zeros(l_max, heads, dim), torch.zeros(l_max, heads, dim)
    for step, n in enumerate((5, 1, 1, 1)):
        k_new, v_new = torch.randn(n, heads, dim, generator=t.rng), torch.randn(n, heads, dim, generator=t.rng)
        call = t.yours.append_kv.run(k_cache, v_cache, length, k_new, v_new, mutates=("k_cache", "v_cache"))
        ref_k, ref_v = k_cache.clone(), v_cache.clone()  # the reference's append, to name a mistake by
        t.ref.append_kv(ref_k, ref_v, length, k_new, v_new)
        # transformers keeps [batch, heads, tokens, head_dim] and concatenates along the tokens.
        keys, values = layer.update(k_new.transpose(0, 1)[None], v_new.transpose(0, 1)[None])
        before, length = length, expect_int(call.value, what=tr("append_kv's return value after append {step}", step=step + 1))
        if length != layer.get_seq_length():
            raise CheckFailed(
                tr(
                    "after appends of {sizes} transformers' DynamicLayer holds {n} tokens; your append_kv returned the length {length}",
                    sizes=[5, 1, 1, 1][: step + 1],
                    n=layer.get_seq_length(),
                    length=length,
                ),
                hint=length_hint(length, before, n),
            )
        for name, got, want, ref_after, old, new, other in (
            ("k_cache", call.args[0], keys, ref_k, k_cache, k_new, v_new),
            ("v_cache", call.args[1], values, ref_v, v_cache, v_new, k_new),
        ):
            got = expect_tensor(got, what=name, shape=[l_max, heads, dim], dtype=torch.float32)
            want = want[0].transpose(0, 1)
            idx = first_wrong(got[:length], want)
            if idx is not None:
                raise CheckFailed(
                    tr(
                        "after appends of {sizes}: row {row} of your {name} differs from token {row} of transformers' "
                        "DynamicLayer (kv head {head}); rows 0 … {last} must hold the tokens in the order they were appended",
                        sizes=[5, 1, 1, 1][: step + 1],
                        row=idx[0],
                        name=name,
                        head=idx[1],
                        last=length - 1,
                    ),
                    hint=append_hint(got, ref_after, old, new, other, before),
                )
        k_cache, v_cache = call.args[0], call.args[1]


# -- ch21.2 decode_inputs -----------------------------------------------------------------------------


@hidden("ch21.2", "nano-vllm's block boundaries (block_size 256): len 1, 256, 257 and 512")
def block_boundaries(t: Trial) -> None:
    # reference/nanovllm.md §12: a sequence that has just reached len 257 with table [9, 4] → slot 1024.
    for length, table in ((257, [9, 4]), (256, [3]), (1, [6]), (512, [2, 8]), (513, [2, 8, 0])):
        ids = [t.random.randrange(151_936) for _ in range(length)]
        run_decode_case(t, ids, table, 256, tr("len {n}, table {table}, block_size 256", n=length, table=table))


@hidden("ch21.2", "random sequences, block sizes and tables")
def random_decodes(t: Trial) -> None:
    for _ in range(30):
        bs = t.random.choice([1, 2, 3, 4, 8, 16, 256])
        length = t.random.randint(1, 6 * bs)
        needed = -(-length // bs)
        table = torch.randperm(64, generator=t.rng)[: needed + t.random.choice([0, 0, 0, 1, 2])].tolist()
        ids = [t.random.randrange(1000) for _ in range(length)]
        run_decode_case(t, ids, table, bs, tr("random, block_size {bs}", bs=bs))


@hidden("ch21.2", "a whole generation: 30 decode steps, the table growing as nano-vllm's may_append grows it")
def whole_generation(t: Trial) -> None:
    bs, free = 4, torch.randperm(40, generator=t.rng).tolist()
    ids = [t.random.randrange(1000) for _ in range(6)]  # a 6-token prompt, prefilled
    table = [free.pop() for _ in range(-(-len(ids) // bs))]
    written: dict[int, int] = {}
    for _ in range(30):
        ids.append(t.random.randrange(1000))  # the token the previous step sampled
        if len(ids) % bs == 1:  # may_append: a new block for position len − 1
            table.append(free.pop())
        got = expect_decode(t.yours.decode_inputs(list(ids), list(table), bs), ids, table, bs)
        explain_decode(
            got,
            t.ref.decode_inputs(ids, table, bs),
            ids,
            table,
            bs,
            tr("decode step {step} of a generation", step=len(ids) - 6),
            t.ref.drive(neighbour_slots, ids, table, bs),
        )
        if got["slot"] in written:
            raise CheckFailed(
                tr(
                    "decode steps at len {first} and {second} both wrote slot {slot}: the second overwrote the K/V of the first",
                    first=written[got["slot"]],
                    second=len(ids),
                    slot=got["slot"],
                )
            )
        written[got["slot"]] = len(ids)


@hidden("ch21.2", "tables too short for the newest position raise ValueError")
def tables_too_short(t: Trial) -> None:
    expect_short_table(t, [1] * 257, [9], 256, tr("position 256 is in logical block 1, but the table has only block 0"))
    bs = t.random.choice([2, 4, 16])
    blocks = t.random.randint(1, 4)
    ids = [t.random.randrange(1000) for _ in range(blocks * bs + 1)]
    expect_short_table(
        t,
        ids,
        list(range(blocks)),
        bs,
        tr(
            "position {pos} is the first token of logical block {blocks}, and the table holds blocks 0 … {last} only "
            "(may_append has not run)",
            pos=blocks * bs,
            blocks=blocks,
            last=blocks - 1,
        ),
    )
    expect_short_table(t, [5], [], 4, tr("an empty table holds no block, not even block 0 for position 0"))


# -- helpers ------------------------------------------------------------------------------------------


def random_sizes(t: Trial, l_max: int) -> list[int]:
    """Append sizes that fit in l_max: a prefill, decode steps of 1, and some empty appends."""
    sizes: list[int] = []
    total = 0
    while True:
        n = t.random.choice([0, 1, 1, 1, t.random.randint(1, max(1, l_max // 2))])
        if total + n > l_max or len(sizes) >= 8:
            return sizes
        sizes.append(n)
        total += n
