# ch29 exercises: replace each TODO with your code, then run `course check ch29`.
"""从调度到执行元数据;度量 · from a schedule to execution metadata; measuring

The scheduler decides, per request, how many tokens to run this step
(`num_scheduled_tokens`) on top of what is already computed
(`num_computed_tokens`). The model runner turns that plan into the flat tensors a
forward pass needs; vLLM v1's `GPUModelRunner._prepare_inputs` does it like this,
requests in batch order, n_r scheduled and c_r computed tokens for request r:

- `query_start_loc` (cu_seqlens_q) = [0, n_0, n_0 + n_1, …]: request r owns rows
  query_start_loc[r] … query_start_loc[r+1] − 1 of the flattened batch;
- `positions[t]` = c_r + j for the j-th scheduled token of request r: a chunk
  continues after its computed prefix, it does not restart at 0;
- `input_ids[t]` = the request's token at that position (a decode feeds its newest
  sampled token, which has no KV yet);
- `seq_lens[r]` = c_r + n_r, the KV length after this step;
- `slot_mapping[t]` = block_table[pos // B]·B + pos % B (B: the KV block size);
- `logits_indices` = query_start_loc[1:] − 1: the runner samples at the last
  scheduled row of *every* request, so a batch of R requests has at most R
  candidate outputs however many inputs it has;
- a candidate is discarded when seq_len < num_tokens: the step did not reach the
  end of the request's known tokens (a non-final prefill chunk), so its sample is
  thrown away (vLLM's runner blanks it and rewinds the request's RNG).

Measuring the engine is the second half of the chapter. `vllm bench serve` times
every request from the client: TTFT (time to the first streamed chunk), ITL (the
gaps between chunks, per chunk, not per token), E2E latency (to the last chunk)
and TPOT = (E2E − TTFT) / (output_len − 1), defined only when output_len > 1.
Mean TPOT averages per-request TPOTs; mean ITL pools every gap of every request;
the two differ whenever a chunk carries more than one token. Throughputs divide
by the wall time of the whole run. Don't put everything into one tok/s: prefill,
decode, cached and padded tokens are different quantities, and each metric above
answers a different question.

一个 batch 有多少输入,与它最多产出几个候选 token 是两回事;时延与吞吐也各有各的定义。
"""

import torch


def prepare_inputs(requests: list[dict], block_size: int) -> dict:
    """Turn one step's schedule into the runner's execution metadata. Task ch29.1.

    Requests are taken in the order given (the persistent batch order). For request
    r with c = num_computed_tokens and n = num_scheduled_tokens, rows
    query_start_loc[r] … query_start_loc[r+1] − 1 of the flat batch are its tokens at
    positions c … c + n − 1. The course assumes no context parallelism, no
    speculative decoding and one standard KV-cache group.

    Args:
        requests: R dicts, each with
            "token_ids": every token the request knows (prompt + outputs appended so far),
            "num_computed_tokens": tokens whose KV is already computed (c ≥ 0),
            "num_scheduled_tokens": tokens to run this step (n ≥ 1, c + n ≤ len(token_ids)),
            "block_table": its physical KV blocks, logical block i → block_table[i].
        block_size: tokens per KV block (B ≥ 1).

    Returns:
        dict of tensors, T = Σ n tokens, R requests:
            "input_ids" int64 [T], "positions" int64 [T], "slot_mapping" int64 [T],
            "query_start_loc" int64 [R + 1], "seq_lens" int64 [R],
            "logits_indices" int64 [R] (the row sampled for each request),
            "kept" bool [R] (True where that sample is kept: seq_len == len(token_ids)).
        (vLLM keeps several of these as int32 on the GPU; the course uses int64.)

    Raises:
        ValueError: block_size < 1, a missing key, n < 1, c < 0, c + n beyond the
            known tokens, or a position beyond the request's block table.

    Example:
        >>> out = prepare_inputs([{"token_ids": [5, 6, 7], "num_computed_tokens": 1,
        ...                        "num_scheduled_tokens": 2, "block_table": [4]}], 4)
        >>> out["positions"].tolist(), out["slot_mapping"].tolist(), out["kept"].tolist()
        ([1, 2], [17, 18], [True])
    """
    _check_schedule(requests, block_size)
    # TODO(ch29.1): your code here (about 16 lines)
    raise NotImplementedError("ch29.1 prepare_inputs: not implemented yet (about 16 lines)")


def latency_metrics(requests: list[dict]) -> dict:
    """Client-side latency and throughput of a benchmark run, as `vllm bench serve` defines them. Task ch29.2.

    Per request (times in seconds, as the client saw them):
        TTFT = chunk_times[0] − start
        E2E  = chunk_times[-1] − start                     (vLLM calls it e2el)
        ITLs = the gaps between successive chunks           (per chunk, not per token)
        TPOT = (E2E − TTFT) / (output_len − 1), only when output_len > 1; a request
               with one output token is left out of the TPOT statistics.
    Aggregates: mean, median and p99 (numpy's default linear interpolation) of the
    per-request TTFTs, TPOTs and E2Es and of the ITLs of all requests pooled
    together, in milliseconds; an empty set of values gives 0.0, as vLLM's
    `np.mean(x or 0)` does. The run's duration is the first start to the last chunk
    (vLLM times the whole run; with only the requests' timestamps the course takes
    this span), and throughputs divide by it:
        request_throughput = completed / duration
        output_throughput = Σ output_len / duration
        total_token_throughput = (Σ input_len + Σ output_len) / duration

    Args:
        requests: one dict per completed request with
            "start": when it was sent (s),
            "chunk_times": when each streamed chunk with content arrived (s), in order,
                at least one; a chunk may carry several tokens,
            "input_len": prompt tokens (≥ 0),
            "output_len": output tokens (≥ the number of chunks).

    Returns:
        dict with "completed" (int), "duration" (s), "total_input_tokens",
        "total_output_tokens" (ints), "request_throughput" (req/s),
        "output_throughput", "total_token_throughput" (tok/s), and for each m in
        ttft, tpot, itl, e2el: f"mean_{m}_ms", f"median_{m}_ms", f"p99_{m}_ms" (floats).

    Raises:
        ValueError: no requests, a missing key, no chunks, chunks out of order or
            before the start, more chunks than output tokens, a negative input_len,
            or a run of zero duration.

    Example:
        >>> m = latency_metrics([{"start": 0.0, "chunk_times": [0.5, 0.7, 0.9], "input_len": 4, "output_len": 3}])
        >>> round(m["mean_ttft_ms"]), round(m["mean_tpot_ms"]), round(m["output_throughput"], 2)
        (500, 200, 3.33)
    """
    _check_timestamps(requests)
    # TODO(ch29.2): your code here (about 26 lines)
    raise NotImplementedError("ch29.2 latency_metrics: not implemented yet (about 26 lines)")


# -- provided: the input checks every task needs but none teaches (not part of the exercise) ----------------------

SCHEDULE_KEYS = ("token_ids", "num_computed_tokens", "num_scheduled_tokens", "block_table")
TIMESTAMP_KEYS = ("start", "chunk_times", "input_len", "output_len")


def _check_schedule(requests: list[dict], block_size: int) -> None:
    """Provided: raise ValueError for a block_size < 1, or a request that lacks a key, has c < 0 or n < 1, goes
    beyond its known tokens (c + n > len(token_ids)) or beyond its block table."""
    if block_size < 1:
        raise ValueError(f"block_size must be ≥ 1, got {block_size}")
    for r, req in enumerate(requests):
        missing = [k for k in SCHEDULE_KEYS if k not in req]
        if missing:
            raise ValueError(f"request {r} lacks {missing[0]!r}; each request needs {', '.join(SCHEDULE_KEYS)}")
        known, c, n = len(req["token_ids"]), req["num_computed_tokens"], req["num_scheduled_tokens"]
        if c < 0 or n < 1:
            raise ValueError(f"request {r}: need num_computed_tokens ≥ 0 and num_scheduled_tokens ≥ 1, got {c}, {n}")
        if c + n > known:
            raise ValueError(f"request {r}: {c} computed + {n} scheduled tokens go beyond the {known} it knows")
        if (c + n - 1) // block_size >= len(req["block_table"]):
            raise ValueError(f"request {r}: position {c + n - 1} is in logical block {(c + n - 1) // block_size}, "
                             f"but its block table has {len(req['block_table'])} blocks")


def _check_timestamps(requests: list[dict]) -> None:
    """Provided: raise ValueError for no requests, a missing key, no chunks, chunks out of order or before the
    start, more chunks than output tokens, a negative input_len, or a run of zero duration."""
    if not requests:
        raise ValueError("need at least one completed request")
    for r, req in enumerate(requests):
        missing = [k for k in TIMESTAMP_KEYS if k not in req]
        if missing:
            raise ValueError(f"request {r} lacks {missing[0]!r}")
        start, chunks = req["start"], list(req["chunk_times"])
        if not chunks or chunks[0] < start or any(b < a for a, b in zip(chunks, chunks[1:])):
            raise ValueError(f"request {r}: chunk_times must be at least one time, in order, not before its start")
        if req["output_len"] < len(chunks) or req["input_len"] < 0:
            raise ValueError(f"request {r}: {len(chunks)} chunks but output_len {req['output_len']} "
                             f"(a chunk carries at least one token), input_len {req['input_len']}")
    if max(r["chunk_times"][-1] for r in requests) - min(r["start"] for r in requests) <= 0:
        raise ValueError("the run lasted 0 s: throughputs are undefined")
