"""Public checks of ch26 · flattened batches and graph replay, and the messages they share with the hidden ones."""

from __future__ import annotations

import torch

from grader.authoring import CheckFailed, Hint, Trial, describe, expect_int, expect_tensor, first_wrong, mistakes, public, vec, wrong_mask
from grader.i18n import tr

# ch26-dim-varlen-pack: two requests of lengths 3 and 2 in padded [2, 3, 4].
PACK_LENGTHS, PACK_T, PACK_H = [3, 2], 3, 4
# ch26-flatten: nano-vllm's worked example (A 300 new; B 512 cached + 88 new) scaled down.
FLAT_QUERY, FLAT_CACHED = [5, 3], [0, 8]
# ch26-graph-replay: five decode sequences (block_size 4) replayed in the graph of 8.
REPLAY_CTX = [7, 3, 9, 5, 2]
REPLAY_TABLES = [[7, 2], [4], [1, 6, 3], [0, 5], [8]]
REPLAY_BS = 4
# ch26-static-buffers: buffers of 8 rows and 4 blocks (block_size 4) that last held a batch of 7; sequences 2 and 6
# finished, the other 5 advanced by one token (sequence 1 into a new block). (context_len, block table, last token).
STATIC_MAX_BS, STATIC_BLOCKS, STATIC_BS = 8, 4, 4
STATIC_PREVIOUS = [
    (9, [7, 2, 11], 412),
    (4, [4], 77),
    (13, [1, 6, 3, 12], 650),
    (6, [0, 5], 903),
    (2, [8], 58),
    (11, [9, 13, 10], 260),
    (5, [14, 15], 31),
]
STATIC_NOW = [(10, [7, 2, 11], 19), (5, [4, 16], 305), (7, [0, 5], 44), (3, [8], 871), (12, [9, 13, 10], 6)]
# nano-vllm's capture_cudagraph: [1, 2, 4, 8] then 16, 32, … up to max_bs = min(max_num_seqs, 512).
NANO_SIZES = [1, 2, 4, 8] + list(range(16, 513, 16))
MAPPED_BATCHES = [1, 3, 5, 9, 17, 37, 100, 512]

META_KEYS = ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")
PAD_KEYS = ("slot_mapping", "context_lens", "block_tables")
STATIC_KEYS = ("input_ids", "positions", "slot_mapping", "context_lens", "block_tables")

M = mistakes("ch26")


# -- ch26.1 pack_varlen / unpack_varlen -------------------------------------------------------------------


@public("ch26.1", "figure instance: pack lengths [3, 2] from padded [2, 3, 4]")
def pack_figure_instance(t: Trial) -> None:
    padded = padded_batch(PACK_LENGTHS, PACK_T, PACK_H)
    got = t.yours.pack_varlen(padded, list(PACK_LENGTHS))
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        raise CheckFailed(tr("pack_varlen returns a pair (packed, cu_seqlens); yours: {what}", what=describe(got)))
    want_packed, want_cu = t.ref.pack_varlen(padded, PACK_LENGTHS)
    packed, cu = got
    if (
        isinstance(packed, torch.Tensor)
        and isinstance(cu, torch.Tensor)
        and list(packed.shape) == list(want_packed.shape)
        and packed.dtype == want_packed.dtype
        and cu.shape == want_cu.shape
        and cu.dtype == torch.int32
    ):
        t.figure(
            "ch26-dim-varlen-pack",
            padded=padded,
            lengths=PACK_LENGTHS,
            packed=packed,
            expected=want_packed,
            wrong=wrong_mask(packed, want_packed),
            cu_seqlens=cu,
            expected_cu=want_cu,
            cu_wrong=wrong_mask(cu, want_cu),
        )
    explain_packed(packed, padded, PACK_LENGTHS, tr("figure instance"))
    expect_cu(cu, PACK_LENGTHS, "cu_seqlens")


@public("ch26.1", "figure instance: unpack back to [2, 3, 4], padding zero")
def unpack_figure_instance(t: Trial) -> None:
    padded = padded_batch(PACK_LENGTHS, PACK_T, PACK_H)
    packed, cu = t.ref.pack_varlen(padded, PACK_LENGTHS)
    got = t.yours.unpack_varlen(packed, cu, PACK_T)
    out = expect_tensor(got, what=tr("the unpacked batch"), shape=list(padded.shape), dtype=padded.dtype)
    t.figure("ch26-dim-varlen-pack", unpacked=out, unpacked_expected=padded, unpacked_wrong=wrong_mask(out, padded))
    explain_unpacked(out, packed, cu.tolist(), PACK_T, tr("figure instance"))


@public("ch26.1", "a request of length 0 between two others")
def zero_length_request(t: Trial) -> None:
    padded = torch.randn(3, 4, 2, generator=t.rng)
    run_pack_case(t, padded, [2, 0, 3], tr("a zero-length request"))


@public("ch26.1", "unpack fills padding positions with zeros (T_max larger than every request)")
def unpack_padding_zero(t: Trial) -> None:
    run_unpack_case(t, torch.randn(5, 3, generator=t.rng), [0, 1, 5], 6, "T_max = 6")


# -- ch26.2 varlen_metadata -----------------------------------------------------------------------------


@public("ch26.2", "figure instance: A 5 new tokens; B 8 cached (a prefix hit) + 3 new")
def flatten_figure_instance(t: Trial) -> None:
    got = expect_metadata(t.yours.varlen_metadata(list(FLAT_QUERY), list(FLAT_CACHED)))
    want = t.ref.varlen_metadata(FLAT_QUERY, FLAT_CACHED)
    parts = {k: got[k] for k in META_KEYS}
    if all(
        isinstance(parts[k], torch.Tensor) and parts[k].shape == want[k].shape and parts[k].dtype == torch.int32 for k in META_KEYS[:2]
    ) and all(type(parts[k]) is int for k in META_KEYS[2:]):
        t.figure("ch26-flatten", query=FLAT_QUERY, cached=FLAT_CACHED, yours=parts, expected=want, wrong=metadata_wrong(parts, want))
    explain_metadata(got, FLAT_QUERY, FLAT_CACHED, tr("figure instance"))


@public("ch26.2", "no prefix hit: cu_seqlens_k equals cu_seqlens_q")
def no_prefix_hit(t: Trial) -> None:
    run_metadata_case(t, [4, 1, 6], [0, 0, 0], tr("no prefix hit"))


@public("ch26.2", "a continuing chunk of a chunked prefill: 16 new after 32 computed")
def continuing_chunk(t: Trial) -> None:
    run_metadata_case(t, [16], [32], tr("a continuing chunk"))


# -- ch26.3 graph_batch_size / pad_decode_batch -----------------------------------------------------------


@public("ch26.3", "figure instance: nano-vllm's captured sizes; a batch of 5 and others")
def graph_size_figure_instance(t: Trial) -> None:
    got = [expect_int(t.yours.graph_batch_size(bs, list(NANO_SIZES)), what=f"graph_batch_size({bs}, …)") for bs in MAPPED_BATCHES]
    want = [t.ref.graph_batch_size(bs, NANO_SIZES) for bs in MAPPED_BATCHES]
    t.figure(
        "ch26-graph-replay",
        sizes=NANO_SIZES,
        batches=MAPPED_BATCHES,
        chosen=got,
        chosen_expected=want,
        chosen_wrong=[g != w for g, w in zip(got, want)],
    )
    for bs, value in zip(MAPPED_BATCHES, got):
        explain_graph_size(value, bs, NANO_SIZES)


@public("ch26.3", "figure instance: 5 sequences padded to the graph of 8")
def pad_figure_instance(t: Trial) -> None:
    slots = replay_slots()
    got = t.yours.pad_decode_batch(slots, list(REPLAY_CTX), [list(r) for r in REPLAY_TABLES], 8)
    want = t.ref.pad_decode_batch(slots, REPLAY_CTX, REPLAY_TABLES, 8)
    if type(got) is dict and all(
        isinstance(got.get(k), torch.Tensor) and got[k].shape == want[k].shape and got[k].dtype == torch.int32 for k in want
    ):
        t.figure(
            "ch26-graph-replay",
            slots=slots,
            ctx=REPLAY_CTX,
            tables=REPLAY_TABLES,
            block_size=REPLAY_BS,
            graph_bs=8,
            padded={k: got[k] for k in want},
            padded_expected=want,
            padded_wrong={k: wrong_mask(got[k], want[k]) for k in want},
        )
    explain_padded(got, slots, REPLAY_CTX, REPLAY_TABLES, 8, tr("figure instance"), REPLAY_BS)


@public("ch26.3", "a batch that fills its graph exactly has no padding rows")
def no_padding_rows(t: Trial) -> None:
    run_pad_case(t, [5, 9, 14, 2], [6, 2, 7, 3], [[1, 0], [2], [3, 4], [0]], 4, tr("a full graph"))


@public("ch26.3", "a batch larger than every captured graph raises ValueError")
def no_graph_fits(t: Trial) -> None:
    t.expect_raises(
        ValueError,
        t.yours.graph_batch_size,
        20,
        [1, 2, 4, 8, 16],
        because=tr("no captured size holds {bs} sequences: the batch must run eagerly", bs=20),
    )


# -- ch26.4 fill_static_buffers ---------------------------------------------------------------------------


@public("ch26.4", "figure instance: a batch of 5 into buffers of 8 rows that last held a batch of 7")
def static_figure_instance(t: Trial) -> None:
    previous = t.ref.drive(filled_buffers, static_buffers(STATIC_MAX_BS, STATIC_BLOCKS), decode_batch(STATIC_PREVIOUS))
    run_static_case(t, static_buffers(STATIC_MAX_BS, STATIC_BLOCKS, previous), decode_batch(STATIC_NOW), tr("figure instance"), figure=True)


@public("ch26.4", "a batch that fills every row of the buffers")
def static_full_batch(t: Trial) -> None:
    seqs = [(c, [b, b + 8][: -(-c // 4)], 100 + c) for b, c in enumerate([5, 8, 1, 3, 7, 2])]
    run_static_case(t, static_buffers(6, 2, stale(t, 6, 2)), decode_batch(seqs), tr("a full batch"))


@public("ch26.4", "one sequence after a full batch: every other row becomes padding")
def static_shrinks(t: Trial) -> None:
    full = decode_batch([(c, [c, c + 10, c + 20][: -(-c // 4)], 7 * c) for c in range(1, 9)])
    previous = t.ref.drive(filled_buffers, static_buffers(8, 3, stale(t, 8, 3)), full)
    run_static_case(t, static_buffers(8, 3, previous), decode_batch([(6, [30, 31], 5)]), tr("one sequence after {n}", n=8))


# -- helpers: the instances --------------------------------------------------------------------------------------


def padded_batch(lengths: list[int], T_max: int, H: int) -> torch.Tensor:
    """Readable activations: request b, token t, channel h → 100(b+1) + 10t + h; padding positions 0."""
    b, t, h = torch.meshgrid(torch.arange(len(lengths)), torch.arange(T_max), torch.arange(H), indexing="ij")
    x = (100 * (b + 1) + 10 * t + h).float()
    return x * (t < torch.tensor(lengths)[:, None, None])


def replay_slots() -> list[int]:
    return [tab[(c - 1) // REPLAY_BS] * REPLAY_BS + (c - 1) % REPLAY_BS for c, tab in zip(REPLAY_CTX, REPLAY_TABLES)]


def running(lens: list[int]) -> list[int]:
    """[0, l0, l0 + l1, …]: the cu_seqlens of `lens`."""
    return [0] + torch.tensor(lens, dtype=torch.int64).cumsum(0).tolist()


def _running(lens: list[int]) -> str:
    """'[0, 3, 3 + 2 = 5]': the running sums written out."""
    out, total = ["0"], 0
    for i, n in enumerate(lens):
        out.append(f"{n}" if i == 0 else f"{total} + {n} = {total + n}")
        total += n
    return "[" + ", ".join(out) + "]" if len(lens) <= 6 else vec(running(lens))


def decode_batch(seqs: list[tuple[int, list[int], int]], block_size: int = STATIC_BS) -> dict[str, torch.Tensor]:
    """(context_len, block table, last token) per sequence → prepare_decode's tensors (int64 ids and positions,
    int32 slots, lengths and block tables padded with −1 to the widest)."""
    width = max(len(table) for _, table, _ in seqs)
    return {
        "input_ids": torch.tensor([tok for _, _, tok in seqs]),
        "positions": torch.tensor([c - 1 for c, _, _ in seqs]),
        "slot_mapping": torch.tensor(
            [table[(c - 1) // block_size] * block_size + (c - 1) % block_size for c, table, _ in seqs], dtype=torch.int32
        ),
        "context_lens": torch.tensor([c for c, _, _ in seqs], dtype=torch.int32),
        "block_tables": torch.tensor([table + [-1] * (width - len(table)) for _, table, _ in seqs], dtype=torch.int32),
    }


def static_buffers(max_bs: int, max_blocks: int, values: dict | None = None) -> dict[str, torch.Tensor]:
    """The five buffers as views into two pools, one per dtype (row i of the int32 pool is [slot, context_len,
    block table…]), as buffers carved out of one allocation are: a tensor the student makes instead has other
    strides, or other memory around it. Zeros (as nano-vllm allocates them), or `values`."""
    assert max_bs >= 2, "a view of one row is contiguous: it would not show a replaced buffer"
    pool64 = torch.zeros(max_bs, 2, dtype=torch.int64)
    pool32 = torch.zeros(max_bs, 2 + max_blocks, dtype=torch.int32)
    out = {
        "input_ids": pool64[:, 0],
        "positions": pool64[:, 1],
        "slot_mapping": pool32[:, 0],
        "context_lens": pool32[:, 1],
        "block_tables": pool32[:, 2:],
    }
    for k, v in (values or {}).items():
        out[k].copy_(torch.as_tensor(v))
    return out


def stale(t: Trial, max_bs: int, max_blocks: int) -> dict[str, torch.Tensor]:
    """What earlier steps left: token ids, positions, slots, lengths and blocks from t.rng (never −1 or 0 slots)."""
    ints = lambda hi, *shape, dtype=torch.int32: torch.randint(1, hi, shape, generator=t.rng, dtype=dtype)  # noqa: E731
    return {
        "input_ids": ints(1000, max_bs, dtype=torch.int64),
        "positions": ints(90, max_bs, dtype=torch.int64),
        "slot_mapping": ints(400, max_bs),
        "context_lens": ints(90, max_bs),
        "block_tables": ints(100, max_bs, max_blocks),
    }


def filled_buffers(ref: object, buffers: dict[str, torch.Tensor], batch: dict[str, torch.Tensor]) -> dict:
    """The reference's buffers after the step (a driver: `t.ref.drive(filled_buffers, buffers, batch)`), as plain
    tensors; the given buffers are left as they were."""
    copy = {k: v.clone() for k, v in buffers.items()}
    ref.fill_static_buffers(copy, {k: v.clone() for k, v in batch.items()})  # type: ignore[attr-defined]
    return copy


# -- helpers: ch26.1 -------------------------------------------------------------------------------------------


def expect_cu(got: object, lens: list[int], what: str, hints_from: tuple[tuple[Hint, list[int]], ...] = (), of: str = "") -> torch.Tensor:
    """Require cu_seqlens as int32 [B + 1] equal to the running sums of `lens`, explaining the difference;
    `hints_from`: (hint, other lengths) for a cu_seqlens that is the running sums of other lengths; `of`: what the
    lengths are, in the run's language (default: "lengths")."""
    of = of or tr("lengths")
    want = running(lens)
    if isinstance(got, torch.Tensor) and got.dim() == 1 and got.numel() == len(lens) and got.tolist() == want[1:] and lens:
        raise CheckFailed(
            tr(
                "expected {what} with B + 1 = {n} entries, {sums}; yours: {got}",
                what=what,
                n=len(lens) + 1,
                sums=_running(lens),
                got=vec(got),
            ),
            hint=M.no_leading_zero,
        )
    if isinstance(got, torch.Tensor) and got.dtype != torch.int32 and got.shape == (len(lens) + 1,):
        raise CheckFailed(
            tr("expected {what} as an int32 tensor; yours: {got}", what=what, got=describe(got)),
            hint=M.int64_cu if got.dtype == torch.int64 else tr("flash-attn and nano-vllm take cu_seqlens as int32"),
        )
    cu = expect_tensor(got, what=what, shape=[len(lens) + 1], dtype=torch.int32)
    yours = cu.tolist()
    if yours == want:
        return cu
    hint = M.not_cumulative if yours == [0] + list(lens) else next((h for h, other in hints_from if yours == running(other)), "")
    raise CheckFailed(
        tr(
            "{what} = 0, then running sums of the {of} {lens} = {sums}; yours: {got}",
            what=what,
            of=of,
            lens=lens,
            sums=_running(lens),
            got=vec(cu),
        ),
        hint=hint,
    )


def explain_packed(got: object, padded: torch.Tensor, lengths: list[int], case: str) -> torch.Tensor:
    """Require the packed rows to be the requests' tokens, request by request."""
    B, T_max, H = padded.shape
    N = sum(lengths)
    if isinstance(got, torch.Tensor) and got.dim() == 2 and got.shape[0] == B * T_max != N:
        raise CheckFailed(
            tr(
                "{case}: expected packed as [N, H] = [{N}, {H}] with N = Σ lengths = {sum}; yours: {got}",
                case=case,
                N=N,
                H=H,
                sum=" + ".join(map(str, lengths)),
                got=describe(got),
            ),
            hint=M.padding_kept.format(rows=B * T_max),
        )
    packed = expect_tensor(got, what="packed", shape=[N, H], dtype=padded.dtype)
    want = torch.cat([padded[b, :n] for b, n in enumerate(lengths)]) if lengths else padded.new_zeros(0, H)
    idx = first_wrong(packed, want)
    if idx is None:
        return packed
    r = idx[0]
    b = next(i for i in range(B) if r < sum(lengths[: i + 1]))
    t = r - sum(lengths[:b])
    keep = torch.arange(T_max)[None, :] < torch.tensor(lengths)[:, None]
    raise CheckFailed(
        f"{case}: lengths={lengths}, T_max={T_max}",
        tr(
            "packed row {r} is request {b}'s token {t} (rows of request {b} start at {start}), padded[{b}, {t}] = {want}; yours: {got}",
            r=r,
            b=b,
            t=t,
            start=sum(lengths[:b]),
            want=vec(want[r]),
            got=vec(packed[r]),
        ),
        hint=M.token_major if torch.equal(packed, padded.transpose(0, 1)[keep.T]) else "",
    )


def explain_unpacked(got: object, packed: torch.Tensor, cu: list[int], T_max: int, case: str) -> torch.Tensor:
    """Require the unpacked batch: each request's packed rows on top, zeros below."""
    B, H = len(cu) - 1, packed.shape[1]
    out = expect_tensor(got, what=tr("the unpacked batch"), shape=[B, T_max, H], dtype=packed.dtype)
    want = packed.new_zeros(B, T_max, H)
    for b in range(B):
        want[b, : cu[b + 1] - cu[b]] = packed[cu[b] : cu[b + 1]]
    idx = first_wrong(out, want)
    if idx is None:
        return out
    b, t = idx[0], idx[1]
    n = cu[b + 1] - cu[b]
    real = torch.arange(T_max)[None, :] < torch.tensor([cu[i + 1] - cu[i] for i in range(B)])[:, None]
    fields = dict(b=b, t=t, n=n, row=cu[b] + t, got=vec(out[b, t]))
    if t < n:
        line = tr(
            "padded[{b}, {t}] is request {b}'s token {t}, packed row cu_seqlens[{b}] + {t} = {row}: {want}; yours: {got}",
            want=vec(want[b, t]),
            **fields,
        )
    elif n == 1:
        line = tr("padded[{b}, {t}] is padding (request {b} has 1 token), so it must be 0; yours: {got}", **fields)
    else:
        line = tr("padded[{b}, {t}] is padding (request {b} has {n} tokens), so it must be 0; yours: {got}", **fields)
    only_padding = not bool(wrong_mask(out, want)[real].any())
    raise CheckFailed(f"{case}: cu_seqlens={cu}, T_max={T_max}", line, hint=M.padding_not_zero if only_padding else "")


def run_pack_case(
    t: Trial, padded: torch.Tensor, lengths: list[int], case: str, *, as_tensor: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    arg = torch.tensor(lengths, dtype=torch.int64) if as_tensor else list(lengths)
    got = t.yours.pack_varlen(padded, arg)
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        raise CheckFailed(tr("pack_varlen returns a pair (packed, cu_seqlens); yours: {what}", what=describe(got)))
    packed = explain_packed(got[0], padded, lengths, case)
    return packed, expect_cu(got[1], lengths, "cu_seqlens")


def run_unpack_case(t: Trial, packed: torch.Tensor, cu: list[int], T_max: int, case: str) -> torch.Tensor:
    got = t.yours.unpack_varlen(packed, torch.tensor(cu, dtype=torch.int32), T_max)
    return explain_unpacked(got, packed, cu, T_max, case)


# -- helpers: ch26.2 -------------------------------------------------------------------------------------------


def expect_metadata(got: object) -> dict:
    if type(got) is not dict or any(k not in got for k in META_KEYS):
        raise CheckFailed(
            tr("expected a dict with keys {keys}; yours: keys {got}", keys=", ".join(META_KEYS), got=", ".join(map(str, got)))
            if type(got) is dict
            else tr("expected a dict with keys {keys}; yours: {got}", keys=", ".join(META_KEYS), got=describe(got))
        )
    return got


def metadata_wrong(got: dict, want: dict) -> dict:
    """The check's verdict per entry of varlen_metadata's answer (cu_seqlens as masks, the maxima as bools)."""
    return {k: wrong_mask(got[k], want[k]) if isinstance(got[k], torch.Tensor) else got[k] != want[k] for k in META_KEYS}


def explain_metadata(got: dict, query: list[int], cached: list[int], case: str) -> None:
    keys = [c + q for c, q in zip(cached, query)]
    pre = tr(
        'case "{case}": query_lens={query}, cached_lens={cached} → key lengths cached + query = {keys}',
        case=case,
        query=query,
        cached=cached,
        keys=keys,
    )
    try:
        expect_cu(got["cu_seqlens_q"], query, "cu_seqlens_q", ((M.queries_with_cache, keys),), of=tr("query lengths"))
        expect_cu(
            got["cu_seqlens_k"], keys, "cu_seqlens_k", ((M.keys_without_cache, query), (M.keys_without_new, cached)), of=tr("key lengths")
        )
    except CheckFailed as e:
        raise e.within(pre) from None
    for key, lens, other, other_name in (("max_seqlen_q", query, keys, "key"), ("max_seqlen_k", keys, query, "query")):
        value = expect_int(got[key], what=key)
        want = max(lens, default=0)
        if value != want:
            hint = (
                M.max_total.format(key=key, total=sum(lens))
                if value == sum(lens)
                else M.max_other_side.format(key=key, side=key[-1], other=other_name)
                if value == max(other, default=0)
                else ""
            )
            raise CheckFailed(pre, tr("{key} = max({lens}) = {want}; yours: {got}", key=key, lens=lens, want=want, got=value), hint=hint)


def run_metadata_case(t: Trial, query: list[int], cached: list[int], case: str) -> dict:
    got = expect_metadata(t.yours.varlen_metadata(list(query), list(cached)))
    explain_metadata(got, query, cached, case)
    return got


# -- helpers: ch26.3 -------------------------------------------------------------------------------------------


def _sizes(sizes: list[int]) -> str:
    s = sorted(sizes)
    return str(s) if len(s) <= 10 else f"[{', '.join(map(str, s[:8]))}, …, {s[-1]}]"


def explain_graph_size(got: object, bs: int, sizes: list[int]) -> int:
    value = expect_int(got, what=f"graph_batch_size({bs}, …)")
    want = min(s for s in sizes if s >= bs)
    if value == want:
        return value
    hint = M.round_down if value < bs else M.not_captured if value not in sizes else M.not_smallest
    raise CheckFailed(
        tr(
            "batch of {bs}, captured sizes {sizes}: the smallest captured size ≥ {bs} is {want}; yours: {got}",
            bs=bs,
            sizes=_sizes(sizes),
            want=want,
            got=value,
        ),
        hint=hint.format(value=value, bs=bs),
    )


def explain_padded(
    got: object, slots: list[int], ctx: list[int], tables: list[list[int]], graph_bs: int, case: str, block_size: int | None = None
) -> dict:
    """Require the three padded buffers, explaining the first wrong entry in row terms."""
    if type(got) is not dict or any(k not in got for k in PAD_KEYS):
        raise CheckFailed(tr("expected a dict with keys {keys}; yours: {got}", keys=", ".join(PAD_KEYS), got=describe(got)))
    bs, width = len(slots), max((len(r) for r in tables), default=0)
    fields = dict(case=case, bs=bs, graph_bs=graph_bs, pad=graph_bs - bs)
    pre = (
        tr('case "{case}": {bs} sequences in the graph of {graph_bs} rows (1 padding row)', **fields)
        if graph_bs - bs == 1
        else tr('case "{case}": {bs} sequences in the graph of {graph_bs} rows ({pad} padding rows)', **fields)
    )
    for key, shape in (("slot_mapping", [graph_bs]), ("context_lens", [graph_bs]), ("block_tables", [graph_bs, width])):
        v = got[key]
        hint: str = ""
        if isinstance(v, torch.Tensor) and list(v.shape) != shape:
            if v.dim() and v.shape[0] == bs and bs != graph_bs:
                hint = M.pad_to_bs.format(graph_bs=graph_bs)
            elif key == "block_tables" and v.dim() == 2 and v.shape[0] == graph_bs:
                hint = M.table_width.format(width=width)
        elif isinstance(v, torch.Tensor) and v.dtype == torch.int64:
            hint = M.int64_buffers
        try:
            expect_tensor(v, what=key, shape=shape, dtype=torch.int32)
        except CheckFailed as e:
            raise CheckFailed(pre, *e.lines, hint=hint) from None
    owner = {b: (i, j) for i, row in enumerate(tables) for j, b in enumerate(row)}
    for i in range(graph_bs):
        pad = i >= bs
        s, c = int(got["slot_mapping"][i]), int(got["context_lens"][i])
        if s != (-1 if pad else slots[i]):
            if not pad:
                raise CheckFailed(
                    pre, tr("row {i} is sequence {i}: slot_mapping[{i}] = slots[{i}] = {want}; yours: {got}", i=i, want=slots[i], got=s)
                )
            hint = ""
            if s >= 0:
                b = s // block_size if block_size else None
                where = (
                    tr(" (block {b} is sequence {seq}'s block_table[{j}])", b=b, seq=owner[b][0], j=owner[b][1])
                    if b is not None and b in owner
                    else ""
                )
                hint = M.pad_slot_real.format(slot=s, where=where)
            raise CheckFailed(
                pre, tr("row {i} is a padding row: its slot must be −1 so the cache write skips it; yours: {got}", i=i, got=s), hint=hint
            )
        if c != (0 if pad else ctx[i]):
            raise CheckFailed(
                pre,
                tr("row {i} is a padding row: its context_len must be 0 so attention reads nothing; yours: {got}", i=i, got=c)
                if pad
                else tr("row {i} is sequence {i}: context_lens[{i}] = {want}; yours: {got}", i=i, want=ctx[i], got=c),
            )
        row = got["block_tables"][i].tolist()
        want = [-1] * width if pad else tables[i] + [-1] * (width - len(tables[i]))
        if row != want:
            j = next(j for j in range(width) if row[j] != want[j])
            n = len(tables[i])
            if pad:
                why = tr("a padding row has no blocks")
            elif j >= n:
                why = (
                    tr("sequence {i} has 1 block; the rest of its row is padding", i=i)
                    if n == 1
                    else tr("sequence {i} has {n} blocks; the rest of its row is padding", i=i, n=n)
                )
            else:
                why = tr("it is sequence {i}'s block_table[{j}]", i=i, j=j)
            raise CheckFailed(
                pre,
                tr("block_tables[{i}, {j}] = {want} ({why}); yours: {got}", i=i, j=j, want=want[j], why=why, got=row[j]),
                hint=M.pad_block_zero if row[j] == 0 and want[j] == -1 else "",
            )
    return got


def run_pad_case(
    t: Trial, slots: list[int], ctx: list[int], tables: list[list[int]], graph_bs: int, case: str, block_size: int | None = None
) -> dict:
    got = t.yours.pad_decode_batch(list(slots), list(ctx), [list(r) for r in tables], graph_bs)
    return explain_padded(got, slots, ctx, tables, graph_bs, case, block_size)


# -- helpers: ch26.4 -------------------------------------------------------------------------------------------


def free_cells(buffers: dict[str, torch.Tensor], bs: int, width: int) -> dict[str, torch.Tensor]:
    """Per buffer, the cells a step may leave as they are (True): input_ids and positions beyond bs, the block
    table outside [:bs, :width]. Every slot and every length is graded: a row beyond bs is padding in any graph."""
    free = {k: torch.zeros(v.shape, dtype=torch.bool) for k, v in buffers.items()}
    free["input_ids"][bs:] = free["positions"][bs:] = True
    free["block_tables"][:] = True
    free["block_tables"][:bs, :width] = False
    return free


def span(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The memory a strided view reads from its first element to its last, flat, and which of it is the view's
    own (the rest are its neighbours in the pool)."""
    n = 1 + sum((size - 1) * step for size, step in zip(v.shape, v.stride())) if v.numel() else 0
    mine = torch.zeros(n, dtype=torch.bool)
    torch.as_strided(mine, v.shape, v.stride()).fill_(True)
    return torch.as_strided(v, (n,), (1,), v.storage_offset()), mine


def replaced(got: torch.Tensor, buffer: torch.Tensor) -> bool:
    """Whether `got` (the student's buffer afterwards, as it came back) is not the captured buffer written in place:
    other strides, or other memory around it than the pool holds (what came back is the memory the view reads,
    so both are measured here, never asked of the student's process)."""
    if got.stride() != buffer.stride():
        return True
    (mem, mine), (pool, _) = span(got), span(buffer)
    return not torch.equal(mem[~mine], pool[~mine])


def expect_static_structure(got: object, buffers: dict[str, torch.Tensor], pre: str) -> dict[str, torch.Tensor]:
    """Require the buffers dict afterwards with the same five keys, each a tensor of the buffer's shape and dtype."""
    if type(got) is not dict or set(got) != set(buffers):
        keys = ", ".join(STATIC_KEYS)
        line = (
            tr("afterwards, buffers should still hold exactly {keys}; yours: keys {got}", keys=keys, got=", ".join(map(str, got)))
            if type(got) is dict
            else tr("afterwards, buffers should still hold exactly {keys}; yours: {got}", keys=keys, got=describe(got))
        )
        raise CheckFailed(pre, line, hint=M.new_buffer)
    for k in STATIC_KEYS:
        v, b = got[k], buffers[k]
        if not (isinstance(v, torch.Tensor) and v.shape == b.shape and v.dtype == b.dtype):
            raise CheckFailed(
                pre,
                tr(
                    "buffers[{key}] was {dtype} {shape}, the graph's captured buffer; afterwards yours is {got}: it was "
                    "replaced, not written into",
                    key=repr(k),
                    dtype=str(b.dtype).removeprefix("torch."),
                    shape=list(b.shape),
                    got=describe(v),
                ),
                hint=M.new_buffer,
            )
    return got


def explain_static(got: dict, want: dict, before: dict, batch: dict, case: str, pre: str) -> None:
    """Require every graded cell, explaining the first wrong one in row terms."""
    bs, width = batch["block_tables"].shape
    free = free_cells(want, bs, width)
    for k in STATIC_KEYS:
        bad = wrong_mask(got[k], want[k]) & ~free[k]
        if not bool(bad.any()):
            continue
        idx = tuple(int(i) for i in bad.nonzero()[0])
        yours, expected, old = int(got[k][idx]), int(want[k][idx]), int(before[k][idx])
        cell = f"{k}[{', '.join(map(str, idx))}]"
        i = idx[0]
        if i < bs:
            what = (
                f"block_table[{idx[1]}]"
                if k == "block_tables"
                else {"input_ids": "input_id", "positions": "position", "slot_mapping": "slot"}.get(k, "context_len")
            )
            all_padding = bool((got["slot_mapping"] == -1).all()) and bool((got["context_lens"] == 0).all())
            every = all_padding and k in ("slot_mapping", "context_lens")
            fields = dict(cell=cell, i=i, what=what, key=repr(k), idx=", ".join(map(str, idx)), want=expected, got=yours)
            if every:
                line = tr(
                    "{cell} is sequence {i}'s {what} this step: batch[{key}][{idx}] = {want}; yours: {got} (every row of yours is padding)",
                    **fields,
                )
            elif yours == old != expected:
                line = tr(
                    "{cell} is sequence {i}'s {what} this step: batch[{key}][{idx}] = {want}; yours: {got} (the previous step's value)",
                    **fields,
                )
            else:
                line = tr("{cell} is sequence {i}'s {what} this step: batch[{key}][{idx}] = {want}; yours: {got}", **fields)
            raise CheckFailed(pre, line, hint=M.reset_order if every else "")
        role = tr("slot −1 so the cache write skips it") if k == "slot_mapping" else tr("context_len 0 so attention reads nothing")
        hint: Hint | str = ""
        if yours == old:
            hint = M.stale_rows.format(row=i, key=k, value=old)
        elif k == "slot_mapping" and yours >= 0:
            hint = M.pad_slot_real.format(slot=yours, where="")
        raise CheckFailed(
            pre,
            tr(
                "row {i} is beyond the batch of {bs}, a padding row in any graph that replays it: {role}; yours: {cell} = {got}",
                i=i,
                bs=bs,
                role=role,
                cell=cell,
                got=yours,
            ),
            hint=hint,
        )


def run_static_case(t: Trial, buffers: dict[str, torch.Tensor], batch: dict[str, torch.Tensor], case: str, *, figure: bool = False) -> dict:
    """Call fill_static_buffers on views of a pool, then require: the same tensors written in place, None returned,
    and every cell a replay reads right."""
    want = t.ref.drive(filled_buffers, buffers, batch)
    before = {k: v.clone() for k, v in buffers.items()}
    bs, width = batch["block_tables"].shape
    max_bs, max_blocks = buffers["block_tables"].shape
    pre = tr(
        'case "{case}": a batch of {bs} (block tables {width} wide) into buffers of {max_bs} rows and {max_blocks} blocks',
        case=case,
        bs=bs,
        width=width,
        max_bs=max_bs,
        max_blocks=max_blocks,
    )
    call = t.yours.fill_static_buffers.run(buffers, batch, mutates=("buffers",))
    got = expect_static_structure(call.args[0], buffers, pre)
    swapped = [k for k in STATIC_KEYS if replaced(got[k], buffers[k])]
    if figure:
        free = free_cells(want, bs, width)
        t.figure(
            "ch26-static-buffers",
            bs=bs,
            max_bs=max_bs,
            width=width,
            before=before,
            yours={k: got[k] for k in STATIC_KEYS},
            expected=want,
            free=free,
            wrong={k: wrong_mask(got[k], want[k]) & ~free[k] for k in STATIC_KEYS},
            replaced={k: k in swapped for k in STATIC_KEYS},
        )
    if swapped:
        k = swapped[0]
        raise CheckFailed(
            pre,
            tr(
                "buffers[{key}] afterwards is a tensor of your own, not the captured buffer written in place (the buffers "
                "here are views into one pool; yours has other strides): the graph would replay on the old buffer's contents",
                key=repr(k),
            )
            if got[k].stride() != buffers[k].stride()
            else tr(
                "buffers[{key}] afterwards is a tensor of your own, not the captured buffer written in place (the buffers "
                "here are views into one pool; yours has other memory around it): the graph would replay on the old "
                "buffer's contents",
                key=repr(k),
            ),
            hint=M.new_buffer,
        )
    if call.value is not None:
        raise CheckFailed(
            pre,
            tr("fill_static_buffers writes into the buffers and returns None; yours returned {what}", what=describe(call.value)),
            hint=M.new_buffer,
        )
    explain_static(got, want, before, batch, case, pre)
    return got
