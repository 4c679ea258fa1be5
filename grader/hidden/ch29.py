"""Hidden checks of ch29 · execution metadata and metrics: random batches and timestamp sets from the grading
seed, numpy's statistics as vLLM's benchmark computes them, edge cases and bad inputs."""

from __future__ import annotations

import numpy as np

from grader.authoring import Trial, hidden
from grader.checks.ch29 import METRICS, STATS, expect_metrics, make_times, run_metadata_case, run_metrics_case
from grader.hidden.ch29_models import per_request
from grader.i18n import tr

# -- ch29.1 prepare_inputs ----------------------------------------------------------------------------------


@hidden("ch29.1", "random batches: chunks, prefix hits and decodes mixed")
def random_batches(t: Trial) -> None:
    for i in range(15):
        block_size = t.random.choice([1, 2, 4, 16])
        run_metadata_case(t, random_batch(t, t.random.randint(1, 8), block_size), block_size, tr("random batch {n}", n=i + 1))


@hidden("ch29.1", "a large batch: 300 requests, block_size 16")
def large_batch(t: Trial) -> None:
    run_metadata_case(t, random_batch(t, 300, 16, pool=20_000), 16, tr("{n} requests", n=300))


@hidden("ch29.1", "edge cases: an empty batch, block_size 1, a 1-token step after a full-block prefix hit")
def metadata_edges(t: Trial) -> None:
    run_metadata_case(t, [], 4, tr("empty batch"))
    run_metadata_case(
        t, [{"token_ids": [7, 8, 9], "num_computed_tokens": 0, "num_scheduled_tokens": 3, "block_table": [5, 0, 3]}], 1, tr("block_size 1")
    )
    run_metadata_case(
        t,
        [{"token_ids": list(range(33)), "num_computed_tokens": 32, "num_scheduled_tokens": 1, "block_table": [4, 9, 1]}],
        16,
        tr("prefix hit of 32, one token left"),
    )


# -- ch29.2 latency_metrics ---------------------------------------------------------------------------------


@hidden("ch29.2", "random timestamp sets from the grading seed")
def random_timestamps(t: Trial) -> None:
    for i in range(10):
        run_metrics_case(t, random_times(t, t.random.randint(1, 12)), tr("random set {n}", n=i + 1))


@hidden("ch29.2", "agreement with numpy's mean, median and percentile, as vLLM's benchmark computes them")
def numpy_agreement(t: Trial) -> None:
    for i in range(5):
        requests = random_times(t, t.random.randint(2, 30))
        expect_metrics(t.yours.latency_metrics(requests), numpy_metrics(requests), requests, tr("numpy set {n}", n=i + 1))


@hidden("ch29.2", "p99 over 200 requests: linear interpolation between neighbours")
def many_requests(t: Trial) -> None:
    run_metrics_case(t, random_times(t, 200), tr("{n} requests", n=200))


@hidden("ch29.2", "edge cases: one one-token request, one chunk carrying every token, equal chunk times")
def metric_edges(t: Trial) -> None:
    run_metrics_case(t, make_times([(0.5, [0.9], 3, 1)]), tr("one token"))
    run_metrics_case(t, make_times([(0.0, [0.4], 3, 6), (0.1, [0.3, 0.6], 5, 2)]), tr("one chunk, six tokens"))
    run_metrics_case(t, make_times([(0.0, [0.2, 0.2, 0.5], 1, 3)]), tr("equal chunk times"))


# -- helpers ------------------------------------------------------------------------------------------------


def random_batch(t: Trial, num_requests: int, block_size: int, pool: int = 4096) -> list[dict]:
    """Prefill chunks, prefix hits and decodes mixed; tables of distinct random blocks, sometimes longer than needed."""
    blocks = t.random.sample(range(pool), k=pool)
    requests = []
    for r in range(num_requests):
        known = t.random.randint(1, 40)
        kind = t.random.choice(["prompt", "chunk", "decode", "hit"])
        c = {"prompt": 0, "decode": known - 1, "hit": (known - 1) // block_size * block_size}.get(kind, t.random.randint(0, known - 1))
        n = t.random.randint(1, known - c) if kind == "chunk" else known - c
        need = -(-(c + n) // block_size) + t.random.randint(0, 2)
        table, blocks = blocks[:need], blocks[need:]
        requests.append(
            {
                "token_ids": [t.random.randint(0, 151_935) for _ in range(known)],
                "num_computed_tokens": c,
                "num_scheduled_tokens": n,
                "block_table": table,
            }
        )
    return requests


def random_times(t: Trial, n: int) -> list[dict]:
    """n requests sent over a second, streaming 1–3 tokens per chunk, some with a single output token."""
    out = []
    for _ in range(n):
        start = round(t.random.uniform(0, 1), 4)
        chunks = [start + round(t.random.uniform(0.05, 0.8), 4)]
        for _ in range(t.random.choice([0, 0, 1, 3, 8, 20])):
            chunks.append(chunks[-1] + round(t.random.expovariate(40), 4))
        output_len = len(chunks) + sum(t.random.choice([0, 0, 1, 2]) for _ in chunks[1:])
        out.append({"start": start, "chunk_times": chunks, "input_len": t.random.randint(0, 2000), "output_len": output_len})
    return out


def numpy_metrics(requests: list[dict]) -> dict:
    """vLLM's benchmark statistics computed with numpy itself (np.mean / np.median / np.percentile, `x or 0`)."""
    rows = per_request(requests)
    series = {
        "ttft": [r["ttft"] for r in rows],
        "e2el": [r["e2el"] for r in rows],
        "itl": [x for r in rows for x in r["itl"]],
        "tpot": [r["tpot"] for r in rows if r["tpot"] is not None],
    }
    duration = max(q["chunk_times"][-1] for q in requests) - min(q["start"] for q in requests)
    total_in, total_out = sum(q["input_len"] for q in requests), sum(q["output_len"] for q in requests)
    out = {
        "completed": len(requests),
        "duration": duration,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(requests) / duration,
        "output_throughput": total_out / duration,
        "total_token_throughput": (total_in + total_out) / duration,
    }
    for m in METRICS:
        xs = series[m] or 0
        out |= {
            f"mean_{m}_ms": float(np.mean(xs)) * 1000,
            f"median_{m}_ms": float(np.median(xs)) * 1000,
            f"p99_{m}_ms": float(np.percentile(xs, 99)) * 1000,
        }
    assert {f"{s}_{m}_ms" for s in STATS for m in METRICS} <= set(out)
    return out
