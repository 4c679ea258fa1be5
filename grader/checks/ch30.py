"""Public checks of ch30 · into a native core, and the messages they share with the hidden ones."""

from __future__ import annotations

from collections import Counter
from typing import Any, Mapping

import numpy as np

from grader.authoring import CheckFailed, Remote, Trial, describe, fmt, hidden_model, mistakes, public
from grader.i18n import mark, tr, tr_in

# ch30-request-path: three requests; A is lowered in detail, [A, B, C] and [B, C] are the two batches.
REQ_A = {
    "request_id": 7,
    "prompt_token_ids": [151, 208, 33, 1024, 7],
    "prompt": "(text stays in Python)",
    "sampling_params": {"temperature": 0.7, "top_p": 0.9, "top_k": -1, "max_tokens": 64, "seed": None},
}
REQ_B = {
    "request_id": 8,
    "prompt_token_ids": [5, 6, 7],
    "output_token_ids": [42, 17],
    "num_computed_tokens": 4,
    "sampling_params": {"temperature": 0.0, "max_tokens": 8, "seed": 1234},
}
REQ_C = {"request_id": 9, "prompt_token_ids": [3, 4, 5, 6], "output_token_ids": [8], "num_computed_tokens": 4}
FIGURE_REQUESTS = {"A": REQ_A, "B": REQ_B, "C": REQ_C}
FIGURE_BATCHES = [["A", "B", "C"], ["B", "C"]]

# ch30-system-boundary: Qwen3-0.6B (its config.json) served with tp 2, against an illustrative matrix.
QWEN3_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "torch_dtype": "bfloat16",
    "hidden_size": 1024,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "tie_word_embeddings": True,
    "tensor_parallel_size": 2,
    "features": ["prefix_caching", "kv_service"],
}
MATRIX = {
    "release": "engine@0a1b2c3",
    "architectures": ["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"],
    "dtypes": ["float16", "bfloat16"],
    "quantization": ["fp8", "gptq"],
    "head_dims": [64, 128],
    "max_context": 32768,
    "tensor_parallel_sizes": [1, 2, 4, 8],
    "features": {"prefix_caching": True, "kv_service": False, "speculative_decoding": False},
}
SUPPORT_ORDER = ["architecture", "dtype", "quantization", "head_dim", "max_position_embeddings", "tensor_parallel_size"]

M = mistakes("ch30")

support_models = hidden_model("ch30_models.support_models")
"""`t.ref.drive(support_models, config, matrix)`: each requirement of the config (key, value, what the matrix
allows, supported or not), for the explanations."""


# -- ch30.1 ---------------------------------------------------------------------------------------------------


@public("ch30.1", "the record layout: fields, types, offsets, itemsize")
def layout(t: Trial) -> None:
    want = np.lib.format.descr_to_dtype(t.ref.drive(reference_layout))
    explain_layout(student_dtype(t, t.yours.record_dtype()), want, "record_dtype()")


@public("ch30.1", "figure instance: a fresh prompt, a decode step, and the two batches")
def figure_instance(t: Trial) -> None:
    wants = {k: t.ref.lower_request(r) for k, r in FIGURE_REQUESTS.items()}
    batches = [batch_of([wants[k][0] for k in b]) for b in FIGURE_BATCHES]
    want_phases = [t.ref.select_phase(b) for b in batches]
    got = t.yours.lower_request(REQ_A)
    rec, ids, pos = lowered_structure(got, tr("request A (a fresh prompt)"))
    w_rec, w_ids, w_pos = wants["A"]
    t.figure(
        "ch30-request-path",
        request=REQ_A,
        record=record_values(rec),
        record_expected=record_values(w_rec),
        layout=[list(r) for r in layout_rows(rec.dtype)],
        layout_expected=[list(r) for r in layout_rows(w_rec.dtype)],
        itemsize=rec.dtype.itemsize,
        itemsize_expected=w_rec.dtype.itemsize,
        input_ids=ids.tolist(),
        positions=pos.tolist(),
        input_ids_expected=w_ids.tolist(),
        positions_expected=w_pos.tolist(),
        batch={k: record_values(w[0]) for k, w in wants.items()},
        batches=FIGURE_BATCHES,
        phases_expected=want_phases,
    )
    phases = [t.yours.select_phase(b) for b in batches]
    t.figure("ch30-request-path", phases=[p if isinstance(p, str) else describe(p) for p in phases])
    expect_lowered(got, wants["A"], REQ_A, tr("request A (a fresh prompt)"))
    expect_lowered(t.yours.lower_request(REQ_B), wants["B"], REQ_B, tr("request B (decode)"))
    for b, p, w in zip(FIGURE_BATCHES, phases, want_phases):
        if p != w:
            reason = (
                tr("request A still has 5 prompt tokens to compute, and prompt work goes first")
                if w == "prompt"
                else tr("every request has only its newest (output) token left: a decode step")
            )
            raise CheckFailed(
                tr("select_phase of the batch {batch}: {reason}, so {want!r}; yours: {got!r}", batch=b, reason=reason, want=w, got=p),
                hint=tr("select_phase returns the string 'prompt' or 'decode'") if not isinstance(p, str) else "",
            )


@public("ch30.1", "defaults and encodings: top_k −1 → 0, seed None → −1, max_tokens 16")
def defaults(t: Trial) -> None:
    run_lower_case(t, {"request_id": 3, "prompt_token_ids": [1, 2]}, tr("a request without sampling_params"))
    run_lower_case(
        t, {"request_id": 4, "prompt_token_ids": [9], "sampling_params": {"top_k": -1, "seed": None}}, tr("top_k −1 and seed None")
    )


@public("ch30.1", "a preempted request recomputes prompt and outputs in a prompt step")
def preempted(t: Trial) -> None:
    run_lower_case(
        t, {"request_id": 5, "prompt_token_ids": [4, 5, 6], "output_token_ids": [7, 8], "num_computed_tokens": 0}, tr("a preempted request")
    )
    run_lower_case(
        t,
        {"request_id": 6, "prompt_token_ids": [4, 5, 6, 7, 8, 9], "num_computed_tokens": 4},
        tr("a prompt after a 4-token prefix-cache hit"),
    )


@public("ch30.1", "a packed (unaligned) batch is rejected, not reinterpreted")
def packed_batch(t: Trial) -> None:
    rec = t.ref.lower_request(REQ_C)[0]
    fields = record_fields(rec.dtype)
    packed = np.dtype([(n, fields[n][0]) for n in fields])  # no padding: offsets shift
    t.expect_raises(
        ValueError,
        t.yours.select_phase,
        rec.astype(packed),
        because=tr("a packed record has max_tokens at byte 25, not 28: the bytes are not the C struct's"),
    )


@public("ch30.1", "a sampling parameter the record has no field for raises ValueError")
def lower_unknown_parameter(t: Trial) -> None:
    t.expect_raises(
        ValueError,
        t.yours.lower_request,
        {"request_id": 1, "prompt_token_ids": [1], "sampling_params": {"min_p": 0.1}},
        because=tr("the record has no field for min_p, and dropping it would change the sampling"),
    )


# -- ch30.2 ---------------------------------------------------------------------------------------------------


@public("ch30.2", "figure instance: Qwen3-0.6B with tp 2, prefix caching and a KV service")
def support_figure_instance(t: Trial) -> None:
    got = t.yours.check_support(QWEN3_CONFIG, MATRIX)
    rows = t.ref.drive(support_models, QWEN3_CONFIG, MATRIX)
    entries = split_entries(got, "Qwen3-0.6B")
    t.figure("ch30-system-boundary", config=QWEN3_CONFIG, matrix=MATRIX, rows=rows, yours=[list(e) for e in entries])
    expect_support(got, QWEN3_CONFIG, MATRIX, "Qwen3-0.6B", rows)


@public("ch30.2", "a context exactly at max_context is supported")
def everything_supported(t: Trial) -> None:
    config = dict(QWEN3_CONFIG, max_position_embeddings=32768, features=["prefix_caching"])
    run_support_case(t, config, MATRIX, tr("Qwen3-0.6B at 32768 tokens"))


@public("ch30.2", "every row unsupported at once")
def everything_unsupported(t: Trial) -> None:
    config = {
        "architectures": ["MixtralForCausalLM", "DeepseekV3ForCausalLM"],
        "torch_dtype": "float32",
        "quantization_config": {"quant_method": "awq"},
        "hidden_size": 4096,
        "num_attention_heads": 16,
        "head_dim": 256,
        "max_position_embeddings": 131072,
        "tensor_parallel_size": 3,
        "features": ["kv_service", "lora"],
    }
    run_support_case(t, config, MATRIX, tr("a config outside every row"))


@public("ch30.2", "head_dim from the config, derived only when absent")
def head_dim_source(t: Trial) -> None:
    llama = {
        "architectures": ["LlamaForCausalLM"],
        "torch_dtype": "float16",
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "max_position_embeddings": 8192,
    }
    run_support_case(t, llama, MATRIX, tr("Llama without head_dim (4096 / 32 = 128)"))
    run_support_case(t, dict(QWEN3_CONFIG, head_dim=96, features=[]), MATRIX, tr("head_dim 96 (1024 / 16 would be 64)"))


# -- helpers: the record's layout ------------------------------------------------------------------------------

C_NAMES = {
    "<i8": "int64",
    "<i4": "int32",
    "|b1": "bool",
    "<f4": "float32",
    "<f8": "float64",
    ">i4": mark("big-endian int32"),
    ">i8": mark("big-endian int64"),
    ">f4": mark("big-endian float32"),
}


def c_name(t: str) -> str:
    """The C type of numpy's type string `t`, in the run's language ("int64", "大端 int32")."""
    return tr(C_NAMES[t]) if t in C_NAMES else t


def reference_layout(ref) -> list:
    """The reference dtype as numpy's `descr` (plain data, so a student release can replay it)."""
    return ref.record_dtype().descr


def record_fields(dt: np.dtype) -> dict[str, tuple[np.dtype, int]]:
    """A structured dtype's fields in order: name → (type, byte offset); {} for a plain dtype."""
    fields: Mapping[str, tuple] = dt.fields or {}
    return {n: (fields[n][0], fields[n][1]) for n in dt.names or ()}


def layout_rows(dt: np.dtype) -> list[tuple[str, str, int, int]]:
    """(name, type string, offset, size) of each field, in order."""
    return [(n, t.str, off, t.itemsize) for n, (t, off) in record_fields(dt).items()]


def explain_layout(got: np.dtype, want: np.dtype, what: str) -> None:
    """Require `got` to have `want`'s field names, types, offsets and itemsize, explaining the first difference."""
    want_names = list(want.names or ())
    if got.names is None:
        raise CheckFailed(
            tr("expected {what} as a structured dtype with fields {names}; yours: {got}", what=what, names=want_names, got=got)
        )
    got_names = list(got.names)
    if got_names != want_names:
        missing = [n for n in want_names if n not in got_names]
        extra = [n for n in got_names if n not in want_names]
        raise CheckFailed(
            tr("{what}: expected the fields {names} in this order; yours: {got}", what=what, names=want_names, got=got_names)
            + (tr(" (missing {missing})", missing=missing) if missing else "")
            + (tr(" (not in the struct: {extra})", extra=extra) if extra else ""),
            hint=M.padding_fields if any(n.startswith(("pad", "_")) for n in extra) else "",
        )
    rows = layout_rows(want)
    for i, ((name, t_want, off_want, size), (_, t_got, off_got, _)) in enumerate(zip(rows, layout_rows(got))):
        if t_got != t_want:
            raise CheckFailed(
                tr(
                    "{what}: field {name} is a {want} ({want_code!r}); yours is {got} ({got_code!r})",
                    what=what,
                    name=name,
                    want=c_name(t_want),
                    want_code=t_want,
                    got=c_name(t_got),
                    got_code=t_got,
                ),
                hint=M.big_endian if t_got[0] == ">" else "",
            )
        if off_got != off_want:
            prev = rows[i - 1]
            end = prev[2] + prev[3]
            gap = off_want - end
            fields = dict(prev=prev[0], end=end, size=size, gap=gap, name=name, offset=off_want)
            raise CheckFailed(
                tr("{what}: field {name} should be at byte offset {want}; yours: {got}", what=what, name=name, want=off_want, got=off_got),
                tr(
                    "{prev} ends at byte {end}; a {size}-byte field starts at a multiple of {size}, so {gap} padding bytes "
                    "come first and {name} starts at {offset}",
                    **fields,
                )
                if gap
                else tr(
                    "{prev} ends at byte {end}; a {size}-byte field starts at a multiple of {size}, so {name} starts at {offset}", **fields
                ),
                hint=M.packed if off_got == end else "",
            )
    if got.itemsize != want.itemsize:
        last = rows[-1]
        widest = max(r[3] for r in rows)
        raise CheckFailed(
            tr(
                "{what}: the record is {want} bytes ({last} ends at {end}, and the size is a multiple of the widest "
                "field, {widest} bytes); yours: {got}",
                what=what,
                want=want.itemsize,
                last=last[0],
                end=last[2] + last[3],
                widest=widest,
                got=got.itemsize,
            ),
            hint=M.tail_padding if got.itemsize < want.itemsize else "",
        )


def student_dtype(t: Trial, value: Any) -> np.dtype:
    """The dtype the student's record_dtype() returned (it stays in their process; read its descr)."""
    if not isinstance(value, Remote) or not value.type_name.endswith("DType"):
        raise CheckFailed(
            tr("expected record_dtype() to return a numpy dtype (np.dtype([...], align=True)); yours: {got}", got=describe(value))
        )
    descr = t.attrs(value, "descr")["descr"]
    try:
        return np.lib.format.descr_to_dtype(descr)
    except (TypeError, ValueError) as e:
        raise CheckFailed(tr("your dtype's layout could not be read ({error})", error=e)) from None


# -- helpers: lower_request and select_phase -------------------------------------------------------------------


def batch_of(recs: list[np.ndarray]) -> np.ndarray:
    """The records as one batch with exactly their dtype. (np.concatenate would pack records whose dtype
    lost numpy's `isalignedstruct` flag, as any array that crossed np.save/np.load has.)"""
    out = np.zeros(sum(len(r) for r in recs), dtype=recs[0].dtype)
    out[:] = [row for r in recs for row in r]
    return out


def record_values(rec: np.ndarray) -> dict:
    return {name: rec[name][0].item() for name in record_fields(rec.dtype)}


def request_summary(req: dict) -> str:
    p, o = req.get("prompt_token_ids", []), req.get("output_token_ids", [])
    return tr(
        "request {id}: {prompt} prompt + {output} output tokens, num_computed_tokens={computed}, sampling_params={params}",
        id=req.get("request_id"),
        prompt=len(p),
        output=len(o),
        computed=req.get("num_computed_tokens", 0),
        params=req.get("sampling_params", {}),
    )


def derivation(name: str, req: dict, want: dict) -> str:
    """How the record's field `name` follows from the request, in words and numbers."""
    p, o = len(req["prompt_token_ids"]), len(req.get("output_token_ids", []))
    nc, sp = req.get("num_computed_tokens", 0), req.get("sampling_params", {})
    n = p + o
    if name == "is_prompt":
        if not want["is_prompt"]:
            return tr("decode: only the newest token (an output token) lacks KV")
        if nc < n - 1 and o:
            return tr(
                "prompt: {n} tokens from position {start} on lack KV (a preempted request recomputes its outputs too)", n=n - nc, start=nc
            )
        if n - nc == 1:
            return tr("prompt: 1 token from position {start} on lacks KV", start=nc)
        return tr("prompt: {n} tokens from position {start} on lack KV", n=n - nc, start=nc)
    if name == "max_tokens":
        if "max_tokens" in sp:
            return tr("max_tokens = {value}", value=sp["max_tokens"])
        return tr("max_tokens = {value} (the default)", value=16)
    if name == "top_k" and sp.get("top_k") == -1:
        return tr("top_k = {value}, lowered to 0 (the core's 'off')", value=sp["top_k"])
    if name == "seed" and sp.get("seed") is None:
        return tr("seed None is lowered to −1")
    return {
        "prompt_len": f"prompt_len = len(prompt_token_ids) = {p}",
        "num_tokens": f"num_tokens = prompt + output = {p} + {o} = {n}",
        "num_computed_tokens": tr("num_computed_tokens is the request's own, {n}", n=nc),
        "num_new_tokens": f"num_new_tokens = num_tokens − num_computed_tokens = {n} − {nc} = {n - nc}",
        "temperature": tr("temperature = {value} as float32", value=sp.get("temperature", 1.0)),
        "top_p": tr("top_p = {value} as float32", value=sp.get("top_p", 1.0)),
        "top_k": f"top_k = {sp.get('top_k', 0)}",
        "seed": f"seed = {sp.get('seed')}",
        "request_id": f"request_id = {req['request_id']}",
    }[name]


def field_hint(name: str, yours: Any, want: dict, req: dict) -> str:
    """The misconception a wrong record field most likely comes from ('' when none fits)."""
    sp = req.get("sampling_params", {})
    if name == "top_k" and yours == -1:
        return M.top_k_raw
    if name == "seed" and sp.get("seed") is None:
        return M.seed_none
    if (
        name == "is_prompt"
        and req.get("output_token_ids")
        and req.get("num_computed_tokens", 0) < len(req["prompt_token_ids"]) + len(req["output_token_ids"]) - 1
    ):
        return M.outputs_mean_decode
    if name == "is_prompt":
        return M.decode_rule
    if name == "num_new_tokens" and yours == want["num_tokens"]:
        return M.refeed_cached
    return ""


def lowered_structure(got: Any, case: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Require (record, input_ids, positions) with the record a structured array of shape [1] and the
    arrays 1-D int32 numpy arrays; their layout and values are compared by `expect_lowered`."""
    if not isinstance(got, tuple) or len(got) != 3:
        raise CheckFailed(tr("{case}: expected (record, input_ids, positions); yours: {got}", case=case, got=describe(got)))
    rec, ids, pos = got
    if not isinstance(rec, np.ndarray) or rec.dtype.names is None or rec.shape != (1,):
        yours = f"ndarray {rec.dtype} {list(rec.shape)}" if isinstance(rec, np.ndarray) else describe(rec)
        raise CheckFailed(tr("{case}: expected the record as a numpy structured array of shape [1]; yours: {got}", case=case, got=yours))
    for what, arr in (("input_ids", ids), ("positions", pos)):
        if not isinstance(arr, np.ndarray) or arr.dtype != np.int32 or arr.ndim != 1:
            yours = f"ndarray {arr.dtype} {list(arr.shape)}" if isinstance(arr, np.ndarray) else describe(arr)
            raise CheckFailed(
                tr(
                    "{case}: expected {what} as a 1-D int32 numpy array (the core reads int32); yours: {got}",
                    case=case,
                    what=what,
                    got=yours,
                )
            )
    return rec, ids, pos


def expect_lowered(got: Any, want: tuple, req: dict, case: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Require (record [1], input_ids int32, positions int32) equal to the reference's, field by field."""
    w_rec, w_ids, w_pos = want
    rec, ids, pos = lowered_structure(got, case)
    explain_layout(rec.dtype, w_rec.dtype, tr("{case}: the record's dtype", case=case))
    yours, expected = record_values(rec), record_values(w_rec)
    for name in expected:
        if yours[name] != expected[name]:
            raise CheckFailed(
                f"{case}: {request_summary(req)}",
                tr(
                    "field {name}: {derivation}, so {want}; yours: {got}",
                    name=name,
                    derivation=derivation(name, req, expected),
                    want=fmt(expected[name]),
                    got=fmt(yours[name]),
                ),
                hint=field_hint(name, yours[name], expected, req),
            )
    for what, arr, w in (("input_ids", ids, w_ids), ("positions", pos, w_pos)):
        if arr.tolist() != w.tolist():
            nc = req.get("num_computed_tokens", 0)
            raise CheckFailed(
                f"{case}: {request_summary(req)}",
                tr(
                    "{what} of the step: the tokens from position {start} on, {want}; yours: {got}",
                    what=what,
                    start=nc,
                    want=w.tolist(),
                    got=arr.tolist(),
                ),
                hint=M.feed_all_tokens if len(arr) > len(w) else "",
            )
    return rec, ids, pos


def run_lower_case(t: Trial, req: dict, case: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    got = t.yours.lower_request(req)
    return expect_lowered(got, t.ref.lower_request(req), req, case)


# -- helpers: check_support ------------------------------------------------------------------------------------


def split_entries(got: Any, case: str) -> list[tuple[str, str]]:
    if not isinstance(got, list) or not all(isinstance(s, str) for s in got):
        raise CheckFailed(
            tr('{case}: expected a list of str, one "<key>: <reason>" per unsupported feature; yours: {got}', case=case, got=describe(got))
        )
    out = []
    for s in got:
        if ":" not in s:
            raise CheckFailed(tr('{case}: each entry is "<key>: <reason>"; yours has {entry!r}', case=case, entry=s))
        key, reason = s.split(":", 1)
        out.append((key.strip(), reason.strip()))
    return out


def feature_verdict(allowed: str) -> str:
    """What a matrix says of a requested feature (`support_models`' "allowed": yes, no, not listed), in words."""
    return {"yes": tr_in("ch30.matrix", "yes"), "no": tr_in("ch30.matrix", "no"), "not listed": tr_in("ch30.matrix", "not listed")}.get(
        allowed, allowed
    )


def support_hint(row: dict, config: dict, matrix: dict) -> str:
    """The misconception a wrong verdict on `row` most likely comes from ('' when none fits)."""
    key = row["key"]
    if key == "max_position_embeddings" and row["value"] == matrix["max_context"]:
        return M.exclusive_context
    if (
        key == "head_dim"
        and config.get("head_dim") is not None
        and config.get("hidden_size")
        and config.get("num_attention_heads")
        and config["hidden_size"] // config["num_attention_heads"] != row["value"]
    ):
        return M.derived_head_dim.format(value=row["value"], derived=config["hidden_size"] // config["num_attention_heads"])
    if key == "kv_service":
        return M.prefix_is_kv_service
    if row["allowed"] == "not listed":
        return M.unlisted_feature
    if key == "quantization" and row["value"] == "none":
        return M.quant_none
    return ""


def expect_support(got: Any, config: dict, matrix: dict, case: str, rows: list[dict] | None = None) -> list[tuple[str, str]]:
    """Require one entry per unsupported row (any order), each reason naming the offending value (`rows`:
    `support_models`' answer; asked of the hidden side if not given)."""
    entries = split_entries(got, case)
    rows = rows if rows is not None else support_models(None, config, matrix)
    want = Counter(r["key"] for r in rows if not r["ok"])
    have = Counter(k for k, _ in entries)
    for r in rows:
        key = r["key"]
        if want[key] == have[key]:
            continue
        missing = want[key] > have[key]
        bad = next((x for x in rows if x["key"] == key and x["ok"] != missing), None)
        if bad is None:
            raise CheckFailed(
                tr("{case}: expected {n} entries for {key}; yours has {got}", case=case, n=want[key], key=key, got=have[key]),
                hint=tr("one entry per unsupported value"),
            )
        allowed = feature_verdict(bad["allowed"]) if bad.get("feature") else bad["allowed"]
        fields = dict(case=case, key=key, value=bad["value"], allowed=allowed, release=matrix["release"])
        if bad.get("feature"):
            message = (
                tr("{case}: feature {key} is not supported by {release} (the matrix says {allowed}); yours does not name it", **fields)
                if missing
                else tr(
                    "{case}: feature {key} is supported by {release} (the matrix says {allowed}); yours lists it as unsupported", **fields
                )
            )
        else:
            message = (
                tr("{case}: {key} = {value} is not supported by {release} (allowed: {allowed}); yours does not name it", **fields)
                if missing
                else tr("{case}: {key} = {value} is supported by {release} (allowed: {allowed}); yours lists it as unsupported", **fields)
            )
        raise CheckFailed(message, hint=support_hint(bad, config, matrix))
    extra = [k for k in have if k not in want]
    if extra:
        raise CheckFailed(
            tr(
                "{case}: yours names {key!r}, which is not a key of an unsupported feature (expected keys: {keys})",
                case=case,
                key=extra[0],
                keys=sorted(want),
            )
            if want
            else tr("{case}: yours names {key!r}, but everything is supported: expected no entry", case=case, key=extra[0]),
            hint=tr("keys are {keys} or the feature's own name", keys=", ".join(SUPPORT_ORDER)),
        )
    for key, reason in entries:
        values = [str(r["value"]) for r in rows if r["key"] == key and not r["ok"]]
        if len(reason) < 3 or (key in SUPPORT_ORDER and not any(v in reason for v in values)):
            raise CheckFailed(
                tr(
                    "{case}: the reason for {key} must say what is unsupported and name the value ({values}); yours: {reason!r}",
                    case=case,
                    key=key,
                    values=" / ".join(values),
                    reason=reason,
                )
            )
    return entries


def run_support_case(t: Trial, config: dict, matrix: dict, case: str) -> list:
    got = t.yours.check_support(config, matrix)
    rows = t.ref.drive(support_models, config, matrix)  # asked before comparing (a release replays it)
    return expect_support(got, config, matrix, case, rows)
