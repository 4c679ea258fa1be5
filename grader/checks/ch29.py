"""Public checks of ch29 · from a schedule to execution metadata; measuring, and the messages they share with
the hidden ones."""

from __future__ import annotations

import math

import torch

from grader.authoring import CheckFailed, Hint, Trial, describe, expect_tensor, fmt, hidden_model, mistakes, public, short, vec, wrong_mask
from grader.i18n import tr

# ch29-schedule-to-metadata: reference §D.2 (checked): R0 mid-way through a chunked prefill, R1 a prefix hit
# whose last prompt token is left, R2 a decode; B = 4. Token ids: request r's token at position p is 100(r+1) + p.
D2 = [(10, 4, 4, [7, 3]), (9, 8, 1, [2, 5, 9]), (7, 6, 1, [4, 6])]
D2_BLOCK = 4
# ch29-latency-metrics: three requests; R1 streams two tokens per chunk after its first, R2 has one token.
TIMES = [(0.0, [0.5, 0.7, 0.9, 1.1, 1.3], 8, 5), (0.2, [0.6, 1.0, 1.4], 6, 5), (0.4, [0.9], 4, 1)]
FIELDS = ["query_start_loc", "positions", "input_ids", "slot_mapping", "seq_lens", "logits_indices", "kept"]
METRICS = ["ttft", "tpot", "itl", "e2el"]
STATS = ["mean", "median", "p99"]
TOTALS = [
    "completed",
    "duration",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
]
KEYS = TOTALS + [f"{s}_{m}_ms" for m in METRICS for s in STATS]
RTOL, ATOL = 1e-6, 1e-9

M = mistakes("ch29")

request_latencies = hidden_model("ch29_models.request_latencies")
"""`t.ref.drive(request_latencies, requests)`: each request's TTFT, E2E, TPOT and ITLs, for the derivations."""


# -- ch29.1 prepare_inputs ------------------------------------------------------------------------------------


@public("ch29.1", "figure instance: a prefill chunk, a prefix hit and a decode; 6 inputs, at most 3 candidates (B = 4)")
def d2_instance(t: Trial) -> None:
    run_metadata_case(t, make_requests(D2), D2_BLOCK, tr("figure instance"), figure="ch29-schedule-to-metadata")


@public("ch29.1", "a decode batch: one input per request, every sample kept")
def decode_batch(t: Trial) -> None:
    run_metadata_case(t, make_requests([(5, 4, 1, [3, 1]), (9, 8, 1, [0, 2, 6]), (1, 0, 1, [5])]), 4, tr("decodes"))


@public("ch29.1", "whole prompts in one step, crossing block boundaries")
def whole_prompts(t: Trial) -> None:
    run_metadata_case(t, make_requests([(6, 0, 6, [2, 0]), (3, 0, 3, [1])]), 4, tr("whole prompts"))


@public("ch29.1", "a chunk that starts mid-block, block_size 2")
def mid_block(t: Trial) -> None:
    run_metadata_case(t, make_requests([(9, 3, 4, [6, 1, 4, 0, 3]), (4, 3, 1, [2, 5])]), 2, tr("mid-block"))


# -- ch29.2 latency_metrics -----------------------------------------------------------------------------------


@public("ch29.2", "figure instance: three requests, two tokens per chunk, a one-token answer")
def metrics_instance(t: Trial) -> None:
    run_metrics_case(t, make_times(TIMES), tr("figure instance"), figure="ch29-latency-metrics")


@public("ch29.2", "one request streaming one token per chunk")
def one_request(t: Trial) -> None:
    run_metrics_case(t, make_times([(1.0, [1.25, 1.5, 1.75, 2.0], 10, 4)]), tr("one request"))


@public("ch29.2", "throughput divides by the whole run, idle gaps included")
def idle_gap(t: Trial) -> None:
    run_metrics_case(t, make_times([(0.0, [0.2, 0.4], 5, 2), (3.0, [3.1, 3.3, 3.4], 7, 3)]), tr("idle gap"))


@public("ch29.2", "only one-token answers: no TPOT and no ITL at all")
def single_tokens(t: Trial) -> None:
    run_metrics_case(t, make_times([(0.0, [0.3], 4, 1), (0.1, [0.5], 2, 1)]), tr("single tokens"))


# -- helpers: the instances -------------------------------------------------------------------------------------


def make_requests(spec: list[tuple[int, int, int, list[int]]]) -> list[dict]:
    """(num_tokens, computed, scheduled, block_table) → request dicts with readable token ids."""
    return [
        {
            "token_ids": [100 * (r + 1) + p for p in range(known)],
            "num_computed_tokens": c,
            "num_scheduled_tokens": n,
            "block_table": list(table),
        }
        for r, (known, c, n, table) in enumerate(spec)
    ]


def make_times(spec: list[tuple[float, list[float], int, int]]) -> list[dict]:
    return [{"start": s, "chunk_times": list(ch), "input_len": i, "output_len": o} for s, ch, i, o in spec]


# -- helpers: ch29.1 -------------------------------------------------------------------------------------------


def describe_batch(requests: list[dict], block_size: int) -> str:
    parts = [
        tr(
            "R{r}: knows {known}, computed {computed}, scheduled {scheduled}, table {table}",
            r=r,
            known=len(q["token_ids"]),
            computed=q["num_computed_tokens"],
            scheduled=q["num_scheduled_tokens"],
            table=short(q["block_table"], limit=5),
        )
        for r, q in enumerate(requests[:4])
    ]
    sep = tr("; ")
    more = sep + tr("… {n} more", n=len(requests) - 4) if len(requests) > 4 else ""
    return sep.join([f"block_size {block_size}", *parts]) + more


def expect_structure(got: object, requests: list[dict]) -> dict:
    """Require the dict of seven tensors with the documented dtypes and shapes."""
    if not isinstance(got, dict) or not set(FIELDS) <= set(got):
        have = tr("a dict with keys {keys}", keys=sorted(got)) if isinstance(got, dict) else describe(got)
        raise CheckFailed(tr("expected a dict with the keys {keys}; yours: {yours}", keys=", ".join(FIELDS), yours=have))
    T, R = sum(q["num_scheduled_tokens"] for q in requests), len(requests)
    shapes = {"query_start_loc": R + 1, "seq_lens": R, "logits_indices": R, "kept": R}
    for k in FIELDS:
        n = shapes.get(k, T)
        what = tr("{k} (one per input token)", k=k) if n == T and k not in shapes else tr("{k} (per request)", k=k)
        expect_tensor(got[k], what=what, shape=[n], dtype=torch.bool if k == "kept" else torch.int64)
    return got


def explain_field(k: str, yours: list, want: dict, requests: list[dict], block_size: int) -> tuple[list[str], str]:
    """The derivation of the first wrong entry of field `k`, and a hint when a misconception fits."""
    exp = want[k].tolist()
    i = next(i for i, (a, b) in enumerate(zip(yours, exp)) if a != b)
    qsl = want["query_start_loc"].tolist()
    hint: Hint | str = ""
    if k in ("positions", "input_ids", "slot_mapping"):
        r = max(j for j in range(len(requests)) if qsl[j] <= i)
        q = requests[r]
        c, j = q["num_computed_tokens"], i - qsl[r]
        p = c + j
        line = tr(
            "input {i} is request R{r}'s token {j} of this step (R{r} owns inputs {a}…{e}), at position "
            "num_computed_tokens + {j} = {c} + {j} = {p}",
            i=i,
            r=r,
            j=j,
            a=qsl[r],
            e=qsl[r + 1] - 1,
            c=c,
            p=p,
        )
        if k == "positions":
            return [line + tr("; yours: {yours}", yours=yours[i])], M.positions_from_zero if yours[i] == j else ""
        if k == "input_ids":
            return [
                line,
                tr("input_ids[{i}] = R{r}'s token_ids[{p}] = {want}; yours: {yours}", i=i, r=r, p=p, want=exp[i], yours=yours[i]),
            ], M.input_ids_from_zero if yours[i] == q["token_ids"][j] else ""
        table, b = q["block_table"], p // block_size
        hint = M.slot_from_position if yours[i] == p else M.slot_not_scaled if yours[i] == table[b] + p % block_size else ""
        return [
            line,
            tr(
                "logical block {p} // {bs} = {b}, block_table[{b}] = {block}, so the slot is {block}·{bs} + {offset} = {want}; "
                "yours: {yours}",
                p=p,
                bs=block_size,
                b=b,
                block=table[b],
                offset=p % block_size,
                want=exp[i],
                yours=yours[i],
            ),
        ], hint
    ns = [q["num_scheduled_tokens"] for q in requests]
    if k == "query_start_loc":
        known_lens = [len(q["token_ids"]) for q in requests]
        hint = (
            M.qsl_not_cumulative
            if yours == [0] + ns
            else M.qsl_known_tokens
            if yours == [sum(known_lens[:j]) for j in range(len(known_lens) + 1)]
            else ""
        )
        return [
            tr("query_start_loc = [0] + running sums of num_scheduled_tokens {ns} = {want}; yours: {yours}", ns=ns, want=exp, yours=yours)
        ], hint
    q = requests[i]
    c, n = q["num_computed_tokens"], q["num_scheduled_tokens"]
    if k == "seq_lens":
        hint = M.seq_len_query if yours[i] == n else M.seq_len_known if yours[i] == len(q["token_ids"]) else ""
        return [
            tr(
                "seq_lens[{i}] = R{i}'s num_computed_tokens + num_scheduled_tokens = {c} + {n} = {want}; yours: {yours}",
                i=i,
                c=c,
                n=n,
                want=exp[i],
                yours=yours[i],
            )
        ], hint
    if k == "logits_indices":
        return [
            tr(
                "logits_indices[{i}] = query_start_loc[{i1}] − 1 = {end} − 1 = {want}, R{i}'s last input; yours: {yours}",
                i=i,
                i1=i + 1,
                end=qsl[i + 1],
                want=exp[i],
                yours=yours[i],
            )
        ], M.first_row_logits if yours[i] in (qsl[i], qsl[i + 1]) else ""
    known = len(q["token_ids"])
    fields = {"i": i, "c": c, "n": n, "seq_len": c + n, "known": known, "yours": yours[i]}
    return [
        tr("kept[{i}]: R{i}'s seq_len = {c} + {n} = {seq_len} = its {known} known tokens, so its sample is kept; yours: {yours}", **fields)
        if exp[i]
        else tr(
            "kept[{i}]: R{i}'s seq_len = {c} + {n} = {seq_len} < its {known} known tokens, so its sample is discarded; yours: {yours}",
            **fields,
        )
    ], M.kept_final if exp[i] else M.kept_partial


def expect_metadata(got: dict, want: dict, requests: list[dict], block_size: int, case: str) -> None:
    for k in FIELDS:
        if got[k].tolist() != want[k].tolist():
            lines, hint = explain_field(k, got[k].tolist(), want, requests, block_size)
            raise CheckFailed(tr('case "{case}": {what}', case=case, what=describe_batch(requests, block_size)), *lines, hint=hint)


def run_metadata_case(t: Trial, requests: list[dict], block_size: int, case: str, figure: str | None = None) -> dict:
    want = t.ref.prepare_inputs(requests, block_size)
    got = t.yours.prepare_inputs(requests, block_size)
    try:
        expect_structure(got, requests)
    except CheckFailed as e:
        raise e.within(tr('case "{case}": {what}', case=case, what=describe_batch(requests, block_size))) from None
    if figure:
        t.figure(
            figure,
            requests=requests,
            block_size=block_size,
            yours={k: got[k] for k in FIELDS},
            expected={k: want[k] for k in FIELDS},
            wrong={k: wrong_mask(got[k], want[k]) for k in FIELDS},
        )
    expect_metadata(got, want, requests, block_size, case)
    return got


# -- helpers: ch29.2 -------------------------------------------------------------------------------------------


def expect_metric_structure(got: object, head: str) -> dict:
    """Require a dict with every metric as a number."""
    if not isinstance(got, dict):
        raise CheckFailed(head, tr("expected a dict of metrics; yours: {yours}", yours=describe(got)))
    for k in KEYS:
        v = got.get(k)
        if type(v) is bool or not isinstance(v, (int, float)):
            raise CheckFailed(
                head,
                tr("expected {k} as a number; yours: {yours}", k=repr(k), yours=tr("missing") if k not in got else describe(v))
                + (tr("  (use .item())") if isinstance(v, torch.Tensor) else ""),
            )
    return got


def metric_wrong(value: float, want: float) -> bool:
    """The checks' verdict on one metric: outside RTOL / ATOL of the expected value."""
    return not math.isclose(float(value), want, rel_tol=RTOL, abs_tol=ATOL)


def expect_metrics(got: object, want: dict, requests: list[dict], case: str, rows: list | None = None) -> None:
    """Require every metric within tolerance, explaining the first wrong one with its derivation (`rows`:
    `request_latencies`' answer; asked of the hidden side when needed if not given)."""
    head = tr('case "{case}": {n} requests', case=case, n=len(requests))
    metrics = expect_metric_structure(got, head)
    for k in KEYS:
        if metric_wrong(metrics[k], want[k]):
            rows = rows if rows is not None else request_latencies(None, requests)
            lines, hint = explain_metric(k, float(metrics[k]), want, requests, rows)
            raise CheckFailed(head, *lines, hint=hint)


def _ms(xs: list[float]) -> str:
    return f"{vec([x * 1000 for x in xs])} ms"


def explain_metric(k: str, v: float, want: dict, requests: list[dict], rows: list) -> tuple[list[str], str]:
    """The derivation of metric `k` (yours: `v`), and a hint when a misconception fits."""
    dur = want["duration"]
    close = lambda a, b: math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-9)  # noqa: E731
    if k in TOTALS:
        first, last = min(q["start"] for q in requests), max(q["chunk_times"][-1] for q in requests)
        n, tin, tout = want["completed"], want["total_input_tokens"], want["total_output_tokens"]
        how = {
            "completed": tr("completed = the number of requests = {n}", n=n),
            "duration": tr(
                "duration = last chunk − first start = {last} − {first} = {dur} s", last=fmt(last), first=fmt(first), dur=fmt(dur)
            ),
            "total_input_tokens": f"total_input_tokens = Σ input_len = {tin}",
            "total_output_tokens": f"total_output_tokens = Σ output_len = {tout}",
            "request_throughput": f"request_throughput = completed / duration = {n} / {fmt(dur)} s",
            "output_throughput": f"output_throughput = Σ output_len / duration = {tout} / {fmt(dur)} s",
            "total_token_throughput": f"total_token_throughput = (Σ input_len + Σ output_len) / duration = ({tin} + {tout}) / {fmt(dur)} s",
        }[k]
        line = (
            how + tr("; yours: {yours}", yours=fmt(v))
            if k in ("completed", "duration")
            else how + tr(" = {want}; yours: {yours}", want=fmt(want[k]), yours=fmt(v))
        )
        latencies = sum(r["e2el"] for r in rows)
        hint: Hint | str = ""
        if "throughput" in k and close(v, want[k] * dur / latencies):
            hint = M.throughput_latencies
        elif k == "duration" and close(v, latencies):
            hint = M.duration_latencies
        elif k == "duration" and close(v, want["mean_e2el_ms"] / 1000):
            hint = M.duration_mean
        elif k == "total_token_throughput" and close(v, want["output_throughput"]):
            hint = M.total_tokens_input
        return [line], hint
    stat, metric = k.split("_")[0], k.split("_")[1]
    values = [x for r in rows for x in r["itl"]] if metric == "itl" else [r[metric] for r in rows if r[metric] is not None]
    how = {
        "ttft": tr("TTFT = first chunk − start, per request"),
        "e2el": tr("E2E = last chunk − start, per request"),
        "itl": tr("ITLs = gaps between successive chunks, of all requests pooled"),
        "tpot": tr("TPOT = (E2E − TTFT) / (output_len − 1), per request with output_len > 1"),
    }[metric]
    lines = [
        tr("{how}: {values}", how=how, values=_ms(values) if values else tr("none, so 0.0 (vLLM’s np.mean(x or 0))")),
        tr("{k} = {want}; yours: {yours}", k=k, want=fmt(want[k]), yours=fmt(v)),
    ]
    hint = ""
    if close(v, want[k] / 1000):
        hint = M.seconds
    elif metric == "tpot" and close(v, want[f"{stat}_itl_ms"]):
        hint = M.tpot_is_itl
    elif (
        metric == "tpot"
        and stat == "mean"
        and close(
            v,
            1000
            * sum((r["e2el"] - r["ttft"]) / q["output_len"] for r, q in zip(rows, requests) if r["tpot"] is not None)
            / max(len(values), 1),
        )
    ):
        hint = M.tpot_over_n
    elif metric == "tpot" and stat == "mean" and close(v, 1000 * sum(values) / len(rows)):
        hint = M.tpot_zero
    elif (
        metric == "itl"
        and stat == "mean"
        and any(r["itl"] for r in rows)
        and close(v, 1000 * sum(sum(r["itl"]) / len(r["itl"]) for r in rows if r["itl"]) / sum(1 for r in rows if r["itl"]))
    ):
        hint = M.itl_mean_of_means
    elif metric == "itl" and stat != "mean" and any(r["itl"] for r in rows) and close(v, 1000 * per_request_mean_stat(rows, stat)):
        hint = M.itl_mean_of_means
    elif (
        stat != "mean"
        and values
        and close(v, 1000 * sorted(values)[min(len(values) - 1, math.ceil(len(values) * (0.5 if stat == "median" else 0.99)) - 1)])
    ):
        hint = M.nearest_rank
    return lines, hint


def per_request_mean_stat(rows: list[dict], stat: str) -> float:
    """The median or p99 (numpy's linear interpolation) of each request's own mean gap: what a mean of per-request
    means gives for ITL's median and p99."""
    means = torch.tensor([sum(r["itl"]) / len(r["itl"]) for r in rows if r["itl"]], dtype=torch.float64)
    return float(torch.quantile(means, 0.5 if stat == "median" else 0.99))


def run_metrics_case(t: Trial, requests: list[dict], case: str, figure: str | None = None) -> dict:
    want = t.ref.latency_metrics(requests)
    rows = t.ref.drive(request_latencies, requests)
    got = expect_metric_structure(t.yours.latency_metrics(requests), tr('case "{case}": {n} requests', case=case, n=len(requests)))
    if figure:
        t.figure(
            figure,
            requests=requests,
            yours={k: float(got[k]) for k in KEYS},
            expected=want,
            wrong={k: metric_wrong(got[k], want[k]) for k in KEYS},
        )
    expect_metrics(got, want, requests, case, rows)
    return got
