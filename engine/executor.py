"""The executor: one scheduled step run on the model (vLLM's executor and GPU model runner, on the CPU).

ch27's EngineCore hands it a scheduler output and waits for {request_id: [sampled tokens]}. For every sequence of
the batch it computes the scheduled positions the prefix cache does not already hold (a chunk that lies wholly
inside the cached prefix computes nothing; its sample, never kept, is empty), a speculative request also its
drafts. The metadata comes from the chapters: ch29's `prepare_inputs`, ch26's `varlen_metadata`, ch28's
`logits_indices`; for the decode rows ch21's `decode_inputs` and ch26's padded decode buffers (`graph_batch_size`,
`pad_decode_batch`, `fill_static_buffers`: the buffers a CUDA graph would replay on; the CPU runs no graph and reads
their first rows); ch25's `slot_mapping` gives the slots each sequence's keys are read back from. The runner computes
the logits; ch23's `process_logits` applies the temperature, top-k and top-p and ch23's `sample` draws (temperature 0
is greedy argmax, as in vLLM, which samples greedily below a temperature of 1e-5, `_SAMPLING_EPS` in
vllm/sampling_params.py; ch23's sampler has no greedy path, so this engine's greedy step is its own); ch32's
`verify_draft` decides which drafts a speculative request keeps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from engine.attention import CHUNK, DECODE, path_of
from engine.errors import EngineError
from engine.runner import ModelRunner, Probe, Step, ints, shape
from engine.words import tr


@dataclass(frozen=True)
class Row:
    """What one sequence computes this step: positions first … first + n − 1 of `tokens` (its known tokens and, in a
    speculative step, its drafts)."""

    seq: Any
    first: int
    n: int
    tokens: list[int]
    drafts: list[int]

    @property
    def rid(self) -> str:
        return str(self.seq.seq_id)


class Done:
    """What `execute_model(..., non_block=True)` returns: the output, already computed (one process, no overlap)."""

    def __init__(self, value: dict) -> None:
        self._value = value

    def done(self) -> bool:
        return True

    def result(self) -> dict:
        return self._value


def graph_sizes(max_num_seqs: int) -> list[int]:
    """The decode batch sizes nano-vllm captures CUDA graphs for: 1, 2, 4, 8, then every 16, up to max_num_seqs
    rounded up (`capture_cudagraph` in nanovllm/engine/model_runner.py)."""
    top = max(8, -(-max_num_seqs // 16) * 16)
    return [1, 2, 4, 8] + list(range(16, top + 1, 16))


class Executor:
    """Runs the steps of one generate call: the model runner, the static decode buffers, the sampler's noise."""

    def __init__(self, loop: Any, *, num_blocks: int) -> None:
        self.loop, self.parts, self.settings = loop, loop.parts, loop.settings
        c = loop.model.config
        self.runner = ModelRunner(loop.model, self.parts, num_blocks=num_blocks, block_size=self.settings.block_size, trace=loop.trace)
        self.generator = torch.Generator().manual_seed(self.settings.seed)
        self.sizes = graph_sizes(self.settings.max_num_seqs)
        max_bs, width = self.sizes[-1], num_blocks
        self.buffers = {
            "input_ids": torch.zeros(max_bs, dtype=torch.int64),
            "positions": torch.zeros(max_bs, dtype=torch.int64),
            "slot_mapping": torch.full((max_bs,), -1, dtype=torch.int32),
            "context_lens": torch.zeros(max_bs, dtype=torch.int32),
            "block_tables": torch.full((max_bs, width), -1, dtype=torch.int32),
        }
        self._kv_heads: list[int] | None = None
        self.heads = (c.num_attention_heads, c.num_key_value_heads)

    # -- the executor's contract with ch27's EngineCore --------------------------------------------------------------

    def execute_model(self, scheduler_output: dict, non_block: bool = False) -> dict | Done:
        """Run one step: {request_id: sampled token ids} ([] for a non-final chunk), or a future of it."""
        out = self._step(scheduler_output["batch"], scheduler_output["kind"], scheduler_output.get("scheduled_spec_token_ids", {}))
        return Done(out) if non_block else out

    def _step(self, batch: list, kind: str, drafts: dict[str, list[int]]) -> dict[str, list[int]]:
        return self.run_rows(self._rows(batch, drafts), kind, [str(seq.seq_id) for seq in batch])

    def run_rows(self, rows: list[Row], kind: str, rids: list[str]) -> dict[str, list[int]]:
        """Compute `rows` (the scheduled requests `rids`, minus those with nothing to compute) and sample."""
        loop = self.loop
        if loop.trace.on:
            self._note_schedule(rids, rows, kind)
        loop.counts["computed_tokens"] += sum(r.n for r in rows)
        out: dict[str, list[int]] = dict.fromkeys(rids, [])
        if not rows:
            return out
        step, kept = self._metadata(rows)
        probe = Probe() if loop.probes is not None else None
        logits = self.runner.forward(step, probe=probe)
        sampled = self._sample(rows, logits, kept)
        if probe is not None and loop.probes is not None:
            positions = [(r.seq.seq_id, p) for r in rows for p in (range(r.first, r.first + r.n) if r.drafts else [r.first + r.n - 1])]
            loop.probes.append(
                {
                    "kind": kind,
                    "rows": [(r.seq.seq_id, list(range(r.first, r.first + r.n))) for r in rows],
                    "stages": probe.stages,
                    "logits": probe.logits,
                    "sampled_positions": positions,
                }
            )
        out.update(sampled)
        return out

    def _rows(self, batch: list, drafts: dict[str, list[int]]) -> list[Row]:
        """(seq, first position, tokens) to compute: the scheduled chunk minus what the prefix cache holds, plus drafts."""
        rows = []
        for seq in batch:
            first = max(seq.num_computed_tokens, self.loop.cached(seq))
            extra = drafts.get(str(seq.seq_id), [])
            end = seq.num_computed_tokens + seq.num_scheduled_tokens + len(extra)
            if first < end:
                tokens = seq.token_ids + extra if extra else seq.token_ids  # read only: no copy of a long sequence
                rows.append(Row(seq, first, end - first, tokens, list(extra)))
        return rows

    # -- metadata ----------------------------------------------------------------------------------------------------

    def _metadata(self, rows: list[Row]) -> tuple[Step, list[bool]]:
        """ch29's prepare_inputs, ch26's varlen_metadata and ch28's logits_indices describe the step; the decode rows
        also ch21's decode_inputs and ch26's padded buffers. Returns the step and, per row, whether its sample is kept."""
        call, bs = self.runner.call, self.settings.block_size
        meta = call(
            "step metadata",
            "prepare_inputs",
            [
                {"token_ids": r.tokens, "num_computed_tokens": r.first, "num_scheduled_tokens": r.n, "block_table": r.seq.block_table}
                for r in rows
            ],
            bs,
            shapes=lambda m: " · ".join(f"{k} {shape(m[k])}" for k in ("input_ids", "positions", "slot_mapping")),
        )
        query_lens, cached_lens = [r.n for r in rows], [r.first for r in rows]
        varlen = call(
            "varlen batch",
            "varlen_metadata",
            query_lens,
            cached_lens,
            shapes=lambda m: f"cu_seqlens_q {ints(m['cu_seqlens_q'])} · cu_seqlens_k {ints(m['cu_seqlens_k'])}",
        )
        indices = call(
            "rows to sample", "logits_indices", query_lens, shapes=lambda out: tr("rows {rows} of {n}", rows=ints(out), n=sum(query_lens))
        )
        _agree(meta, varlen, indices)
        cu_q, cu_k = varlen["cu_seqlens_q"].long().tolist(), varlen["cu_seqlens_k"].long().tolist()
        paths = [CHUNK if r.drafts else path_of(r.n, r.first) for r in rows]
        read_slots: list[torch.Tensor | None] = [None] * len(rows)
        decode = [b for b, p in enumerate(paths) if p == DECODE]
        if decode:
            self._decode_buffers(rows, decode, meta, read_slots)
        for b, path in enumerate(paths):
            if path == CHUNK:
                r = rows[b]
                read_slots[b] = self._slots(r.seq.block_table, r.first + r.n, r.seq.seq_id)
        sample_rows, last = [], indices.long().tolist()
        for b, r in enumerate(rows):
            sample_rows += list(range(cu_q[b], cu_q[b + 1])) if r.drafts else [last[b]]
        step = Step(
            meta["input_ids"],
            meta["positions"],
            meta["slot_mapping"],
            cu_q,
            cu_k,
            paths,
            read_slots,
            self._heads(),
            torch.tensor(sample_rows, dtype=torch.int64),
            [r.seq.seq_id for r in rows],
            self.loop.traced_id,
        )
        return step, [bool(k) for k in meta["kept"].tolist()]

    def _decode_buffers(self, rows: list[Row], decode: list[int], meta: dict, read_slots: list) -> None:
        """ch21's decode inputs for each decode row, ch26's padding into the static buffers, and the keys each row
        reads back (its block table and length, as the buffers hold them)."""
        call, bs, trace = self.runner.call, self.settings.block_size, self.loop.trace
        ids, positions, slots, lens, tables = [], [], [], [], []
        on, cu = trace.on, meta["query_start_loc"].long().tolist()
        for b in decode:
            r = rows[b]
            trace.on = on and r.seq.seq_id == self.loop.traced_id
            d = call(
                "decode inputs",
                "decode_inputs",
                r.tokens,
                r.seq.block_table,
                bs,
                shapes=lambda d: f"input_id {d['input_id']} · position {d['position']} · context_len {d['context_len']} · slot {d['slot']}",
            )
            row = cu[b]
            theirs = (int(meta["input_ids"][row]), int(meta["positions"][row]), int(meta["slot_mapping"][row]))
            if (d["input_id"], d["position"], d["slot"]) != theirs:
                raise EngineError(
                    tr(
                        "ch21's decode_inputs (input_id {input_id}, position {position}, slot {slot}) and ch29's prepare_inputs "
                        "({their_id}, {their_position}, {their_slot}) disagree on request {id}'s decode row",
                        input_id=d["input_id"],
                        position=d["position"],
                        slot=d["slot"],
                        their_id=theirs[0],
                        their_position=theirs[1],
                        their_slot=theirs[2],
                        id=r.seq.seq_id,
                    )
                )
            ids.append(d["input_id"])
            positions.append(d["position"])
            slots.append(d["slot"])
            lens.append(d["context_len"])
            tables.append(list(r.seq.block_table))
        trace.on = on
        n = len(decode)
        graph_bs = call(
            "decode batch size", "graph_batch_size", n, self.sizes, shapes=lambda g: tr("{n} sequences → the graph of {size}", n=n, size=g)
        )
        padded = call(
            "padded decode batch",
            "pad_decode_batch",
            slots,
            lens,
            tables,
            graph_bs,
            shapes=lambda p: f"slot_mapping {shape(p['slot_mapping'])} · block_tables {shape(p['block_tables'])}",
        )
        width = padded["block_tables"].shape[1]
        batch = {
            "input_ids": torch.tensor(ids, dtype=torch.int64),
            "positions": torch.tensor(positions, dtype=torch.int64),
            "slot_mapping": padded["slot_mapping"][:n],
            "context_lens": padded["context_lens"][:n],
            "block_tables": padded["block_tables"][:n, :width],
        }
        call(
            "static decode buffers",
            "fill_static_buffers",
            self.buffers,
            batch,
            shapes=lambda _: tr("{n} rows into buffers of {size}", n=n, size=self.sizes[-1]),
        )
        for i, b in enumerate(decode):
            length = int(self.buffers["context_lens"][i])
            table = [int(x) for x in self.buffers["block_tables"][i, : -(-length // bs)].tolist()]
            read_slots[b] = self._slots(table, length, rows[b].seq.seq_id)

    def _slots(self, table: list[int], length: int, seq_id: int) -> torch.Tensor:
        """ch25's slots of positions 0 … length − 1 through `table`: where a sequence's keys are read back from."""
        trace = self.loop.trace
        on = trace.on
        trace.on = on and seq_id == self.loop.traced_id
        out = self.runner.call(
            "K/V slots by block table",
            "slot_mapping",
            table,
            torch.arange(length),
            self.settings.block_size,
            shapes=lambda s: tr("table {table} → slots {slots}", table=ints(table), slots=ints(s)),
        )
        trace.on = on
        return out

    def _heads(self) -> list[int]:
        """ch18's kv_head_for of every query head (asked again in each traced step, so the trace shows it)."""
        if self._kv_heads is None or self.loop.trace.on:
            Hq, Hkv = self.heads
            self._kv_heads = [
                int(
                    self.runner.call(
                        "query head → K/V head",
                        "kv_head_for",
                        h,
                        Hq,
                        Hkv,
                        shapes=lambda g: tr("{query} query heads → {kv} K/V heads", query=Hq, kv=Hkv),
                    )
                )
                for h in range(Hq)
            ]
        return self._kv_heads

    # -- sampling and verification -----------------------------------------------------------------------------------

    def _sample(self, rows: list[Row], logits: torch.Tensor, kept: list[bool]) -> dict[str, list[int]]:
        """Each row's kept tokens: one sample for a plain row (none for a non-final chunk), the verified drafts and one
        more token for a speculative one."""
        out: dict[str, list[int]] = {}
        plain = [b for b, r in enumerate(rows) if not r.drafts]
        offsets, at = [], 0
        for r in rows:
            offsets.append(at)
            at += r.n if r.drafts else 1
        if plain:
            tokens = self._draw(logits[[offsets[b] for b in plain]])
            for b, t in zip(plain, tokens.tolist()):
                out[rows[b].rid] = [int(t)] if kept[b] else []
        for b, r in enumerate(rows):
            if r.drafts:
                out[r.rid] = self._verify(r, logits[offsets[b] : offsets[b] + r.n])
        return out

    def _draw(self, logits: torch.Tensor) -> torch.Tensor:
        """Greedy argmax at temperature 0 (ch23's sampler has no greedy path), else ch23's exponential race."""
        t = self.settings.temperature
        if t == 0:
            tokens = logits.argmax(dim=-1)
            if self.loop.trace.on:
                self.loop.trace.events.append(
                    {
                        "kind": self.loop.trace.kind,
                        "stage": "greedy (temperature 0)",
                        "chapter": "ch23",
                        "task": "ch23.2",
                        "fn": "argmax",
                        "source": "engine",
                        "shapes": f"{shape(logits)} → {shape(tokens)}",
                    }
                )
            return tokens
        noise = torch.empty(logits.shape, dtype=torch.float32).exponential_(generator=self.generator)
        processed = self._processed(logits)
        return self.runner.call("sample", "sample", processed, torch.ones(logits.shape[0]), noise)

    def _processed(self, logits: torch.Tensor) -> torch.Tensor:
        """ch23's process_logits: logits / temperature, then top-k and top-p (filtered entries −∞), as vLLM's sampler
        does before it draws; `sample` then runs at temperature 1 on what it left."""
        s = self.settings
        temperature = torch.full((logits.shape[0],), s.temperature, dtype=torch.float32)
        top_k, top_p = s.top_k or None, s.top_p if s.top_p < 1 else None
        return self.runner.call(
            "temperature, top-k, top-p",
            "process_logits",
            logits,
            temperature,
            top_k,
            top_p,
            shapes=lambda out: tr(
                "{logits} ÷ {temperature:g}, top-k {top_k}, top-p {top_p:g} → {out}",
                logits=shape(logits),
                temperature=s.temperature,
                top_k=s.top_k or tr("off"),
                top_p=s.top_p,
                out=shape(out),
            ),
        )

    def _verify(self, row: Row, logits: torch.Tensor) -> list[int]:
        """ch32's lossless rule over the drafts: the n-gram drafter is certain of its tokens (probability 1), the
        target's distribution is its softmax, or one-hot at its argmax when greedy (so greedy keeps exactly the tokens
        plain decoding would give)."""
        k, V = len(row.drafts), logits.shape[-1]
        t = self.settings.temperature
        logits = logits.float()
        if t == 0:
            target = torch.zeros(k + 1, V).scatter_(1, logits.argmax(dim=-1, keepdim=True), 1.0)
        else:
            target = self._processed(logits).softmax(dim=-1)
        drafts = torch.tensor(row.drafts, dtype=torch.int64)
        draft_probs = torch.zeros(k, V).scatter_(1, drafts[:, None], 1.0)
        uniforms = torch.rand(k, generator=self.generator)
        noise = torch.empty(k + 1, V).exponential_(generator=self.generator)
        tokens = self.runner.call(
            "verify drafts",
            "verify_draft",
            drafts,
            draft_probs,
            target,
            uniforms,
            noise,
            shapes=lambda out: tr(
                "{n} drafts {drafts} → {accepted} accepted, emits {tokens}",
                n=k,
                drafts=ints(row.drafts),
                accepted=len(out) - 1,
                tokens=ints(out),
            ),
        )
        counts = self.loop.counts
        counts["draft_tokens"] += k
        counts["accepted_tokens"] += len(tokens) - 1
        return [int(x) for x in tokens]

    # -- the trace -------------------------------------------------------------------------------------------------------

    def _note_schedule(self, rids: list[str], rows: list[Row], kind: str) -> None:
        loop = self.loop
        mine = next((r for r in rows if r.seq.seq_id == loop.traced_id), None)
        request = loop.traced_id
        if mine is None:
            what = tr("request {request} computes nothing (prefix-cached)", request=request)
        elif mine.n == 1:
            what = tr("request {request} computes position {position}", request=request, position=mine.first)
        else:
            what = tr(
                "request {request} computes positions {first}–{last}", request=request, first=mine.first, last=mine.first + mine.n - 1
            )
        count = tr("{n} sequences", n=len(rids)) if len(rids) > 1 else tr("1 sequence")
        loop.note(kind, "schedule", loop.scheduler_part, f"{kind}: {count}; {what}")  # the kind: the overview's column says it
        if mine is not None:
            table, cached = ints(mine.seq.block_table), loop.cached(mine.seq)
            loop.note(kind, "blocks (prefix cache)", "BlockManager", tr("block table {table}, {n} tokens cached", table=table, n=cached))


def _agree(meta: dict, varlen: dict, indices: torch.Tensor) -> None:
    """The chapters describe one batch three times; they must say the same thing."""
    qsl, cu_q = meta["query_start_loc"].long().tolist(), varlen["cu_seqlens_q"].long().tolist()
    if qsl != cu_q:
        raise EngineError(
            tr(
                "ch29's prepare_inputs (query_start_loc {qsl}) and ch26's varlen_metadata (cu_seqlens_q {cu}) disagree on where "
                "the sequences start",
                qsl=qsl,
                cu=cu_q,
            )
        )
    if meta["logits_indices"].long().tolist() != indices.long().tolist():
        raise EngineError(
            tr(
                "ch29's prepare_inputs (logits_indices {theirs}) and ch28's logits_indices ({mine}) disagree on the rows to sample",
                theirs=meta["logits_indices"].tolist(),
                mine=indices.tolist(),
            )
        )
