"""ch29 · from a schedule to execution metadata; measuring: the common mistakes, each with the hint that names it
and the edit of the reference that makes it (see `grader.authoring.misconceptions`)."""

from grader.authoring import mistake

SLOT = "slots.append(table[p // block_size] * block_size + p % block_size)"
KEPT = "kept.append(c + n == len(tokens))"
QSL = "qsl.append(qsl[-1] + n)"
SEQ_LEN = "seq_lens.append(c + n)"
DURATION = 'duration = max(r["chunk_times"][-1] for r in requests) - min(r["start"] for r in requests)'
TPOT = 'tpots.append((e2el - ttft) / (req["output_len"] - 1))'

MISTAKES = [
    # -- 29.1 prepare_inputs -----------------------------------------------------------------------------------
    mistake(
        "qsl_not_cumulative",
        "ch29.1",
        "query_start_loc is cumulative: entry r + 1 sums the scheduled tokens of requests 0…r",
        (QSL, "qsl.append(n)"),
    ),
    mistake(
        "qsl_known_tokens",
        "ch29.1",
        "it counts this step's inputs, num_scheduled_tokens, not every known token",
        (QSL, "qsl.append(qsl[-1] + len(tokens))"),
    ),
    mistake(
        "positions_from_zero",
        "ch29.1",
        "positions continue after the computed prefix: c + j, not j",
        ("            pos.append(p)\n", "            pos.append(p - c)\n"),
    ),
    mistake(
        "input_ids_from_zero",
        "ch29.1",
        "feed the token at the input's position (after the computed prefix)",
        ("            ids.append(tokens[p])\n", "            ids.append(tokens[p - c])\n"),
    ),
    mistake("slot_from_position", "ch29.1", "the slot uses the physical block from the table, not the position", (SLOT, "slots.append(p)")),
    mistake(
        "slot_not_scaled",
        "ch29.1",
        "a slot counts from the start of the pool: multiply the physical block by block_size",
        (SLOT, "slots.append(table[p // block_size] + p % block_size)"),
    ),
    mistake(
        "seq_len_query",
        "ch29.1",
        "seq_lens is the KV length after this step, c + n, not the query length n",
        (SEQ_LEN, "seq_lens.append(n)"),
    ),
    mistake(
        "seq_len_known",
        "ch29.1",
        "seq_lens counts what is computed after this step, c + n, not every known token",
        (SEQ_LEN, "seq_lens.append(len(tokens))"),
    ),
    mistake(
        "first_row_logits",
        "ch29.1",
        "sample at the *last* scheduled row of each request: query_start_loc[1:] − 1",
        ('"logits_indices": query_start_loc[1:] - 1', '"logits_indices": query_start_loc[:-1]'),
    ),
    mistake(
        "kept_partial",
        "ch29.1",
        "a chunk that ends before the last known token is a non-final prefill chunk: its sample is thrown away",
        (KEPT, "kept.append(True)"),
    ),
    mistake(
        "kept_final",
        "ch29.1",
        "a step that reaches every known token keeps its sample (a 1-token step after a prefix hit produces the first output)",
        (KEPT, "kept.append(c + n > len(tokens))"),
    ),
    # -- 29.2 latency_metrics ----------------------------------------------------------------------------------
    mistake(
        "duration_latencies",
        "ch29.2",
        "the run's duration is its wall time, first start to last chunk, not the sum of the latencies",
        (DURATION, 'duration = sum(r["chunk_times"][-1] - r["start"] for r in requests)'),
    ),
    mistake(
        "duration_mean",
        "ch29.2",
        "the run's duration is its wall time, first start to last chunk, not the mean latency",
        (DURATION, "duration = sum(e2els) / len(e2els)"),
    ),
    mistake(
        "throughput_latencies",
        "ch29.2",
        "divide by the wall time of the whole run, not by the sum of the requests' latencies",
        ('"request_throughput": len(requests) / duration', '"request_throughput": len(requests) / sum(e2els)'),
    ),
    mistake(
        "total_tokens_input",
        "ch29.2",
        "total token throughput counts the input tokens too",
        ('"total_token_throughput": (total_in + total_out) / duration', '"total_token_throughput": total_out / duration'),
    ),
    mistake(
        "seconds",
        "ch29.2",
        "report latencies in milliseconds (the timestamps are in seconds)",
        ('out[f"mean_{name}_ms"] = sum(xs) / len(xs) * 1000', 'out[f"mean_{name}_ms"] = sum(xs) / len(xs)'),
    ),
    mistake(
        "tpot_is_itl",
        "ch29.2",
        "TPOT is per token, (E2E − TTFT) / (output_len − 1); ITL is per chunk, and a chunk may carry 2 tokens",
        (TPOT, "tpots += [b - a for a, b in zip(chunks, chunks[1:])]"),
    ),
    mistake(
        "tpot_over_n",
        "ch29.2",
        "TPOT leaves the first token out: divide by output_len − 1",
        (TPOT, 'tpots.append((e2el - ttft) / req["output_len"])'),
    ),
    mistake(
        "tpot_zero",
        "ch29.2",
        "a request with one output token has no TPOT: leave it out instead of counting 0",
        (
            '        if req["output_len"] > 1:\n            ' + TPOT,
            '        tpots.append((e2el - ttft) / (req["output_len"] - 1) if req["output_len"] > 1 else 0.0)',
        ),
    ),
    mistake(
        "itl_mean_of_means",
        "ch29.2",
        "mean ITL pools every gap of every request; it is not a mean of per-request means",
        (
            "itls += [b - a for a, b in zip(chunks, chunks[1:])]",
            "itls += [(chunks[-1] - chunks[0]) / (len(chunks) - 1)] if len(chunks) > 1 else []",
        ),
    ),
    mistake(
        "nearest_rank",
        "ch29.2",
        "percentiles interpolate linearly between neighbours (numpy's default), not the nearest rank",
        (
            "        return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (k - lo)",
            "        return xs[min(len(xs) - 1, -(-len(xs) * q // 100) - 1)]",
        ),
    ),
]
