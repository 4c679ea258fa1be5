"""ch29's per-request latencies, for the derivations of its metric checks (never shipped).

Each request's TTFT, E2E, TPOT and inter-token latencies are most of `latency_metrics` (29.2); public checks
reach them through `grader.checks.ch29.request_latencies` (a `grader.authoring.hidden_model` driver).
"""

from __future__ import annotations


def per_request(requests: list[dict]) -> list[dict]:
    """Each request's TTFT, E2E, TPOT (None when output_len is 1) and ITLs, in seconds."""
    rows = []
    for q in requests:
        ch = q["chunk_times"]
        ttft, e2e = ch[0] - q["start"], ch[-1] - q["start"]
        rows.append(
            {
                "ttft": ttft,
                "e2el": e2e,
                "itl": [b - a for a, b in zip(ch, ch[1:])],
                "tpot": (e2e - ttft) / (q["output_len"] - 1) if q["output_len"] > 1 else None,
            }
        )
    return rows


def request_latencies(ref: object, requests: list[dict]) -> list[dict]:
    """`per_request` as a driver."""
    return per_request(requests)
