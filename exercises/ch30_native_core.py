# ch30 exercises: replace each TODO with your code, then run `course check ch30`.
"""进入原生核心 · into a native core

Several public inference engines split the work between two languages. A Python
front end owns everything a user touches (the tokenizer, the OpenAI-style API
server, request validation) and hands every request through pybind11 or an RPC to a
core written in C++ that owns the engine loop: the scheduler, the paged KV cache,
the model runner and the sampler. TensorRT-LLM (its Python `LLM` API over the C++
executor and batch manager), Alibaba's RTP-LLM and Tencent's KsanaLLM all have this
shape. The course cannot pin the exact project its text describes, so this chapter
teaches what these engines have in common, as their public repositories show it.

**Lowering.** At the boundary a request stops being a Python object (a dict of
lists and optional values) and becomes what C++ can read without Python's help: a
fixed-size record with typed fields at fixed byte offsets (a C struct), plus flat
int32 arrays of token ids and positions. Every field has one C type, so every
Python value must be checked to fit it; every optional value needs an explicit
encoding (no seed becomes −1); and a parameter the record has no field for cannot
be silently dropped, because the core would then sample differently from what the
user asked. The layout follows C's alignment rule: a field of size s starts at a
multiple of s, padding bytes fill the gaps, and the record's size is a multiple of
its widest field. A numpy structured dtype built with `align=True` (or a
`ctypes.Structure`) computes exactly the offsets a C compiler would, and an array of
such records can be handed to C++ as one buffer without a copy. The receiving side
checks the layout before it trusts the bytes.

**Phases.** The C++ schedulers of these engines still think in two phases: a
*prompt* (prefill, context) step computes the KV of many prompt tokens per request,
a *decode* (generation) step computes one new token per request. vLLM v0 and
nano-vllm run one phase per step and try prefill first, so a step is a prompt step
whenever some request still has prompt work. TensorRT-LLM's in-flight batching puts
both phases into one step but still orders the batch by phase (context requests
first). vLLM v1 dropped the distinction for one token budget (ch27); the native
cores have not copied all of vLLM's abstractions (公开版本仍有 prompt/decode 阶段选择).

**The system boundary.** What such an engine supports is what its README says at a
pinned commit: a table of verified models, dtypes, quantisation methods, hardware
and features. A configuration outside that table is not "probably fine". Each
unsupported feature is a reason to stop, and the user deserves the whole list at
once. One row deserves care: all these engines keep a **local** paged KV cache with
block reuse and prefix caching inside one engine instance; what a release may lack
is a KV *service*, a store that shares KV across instances (for prefill/decode
disaggregation, say). 缺完整 KV 服务不等于没有本地 KV 缓存;支持矩阵以固定提交的 README 为准。

Python 前端把请求降低(lower)为定长、带类型、按 C 规则对齐的记录和扁平 int32 数组,交给 C++ 核心;
核心按 prompt / decode 阶段组批;支持矩阵划定系统边界。
"""

import math

import numpy as np


def record_dtype() -> np.dtype:
    """The byte layout of one request record, as the native core reads it. Task ch30.1.

    A C struct with natural alignment (numpy: a structured dtype with
    `align=True`), all fields little-endian:

        offset  size  field                type      meaning
         0      8     request_id           int64     the request's id
         8      4     prompt_len           int32     tokens in the prompt
        12      4     num_tokens           int32     prompt + output tokens so far
        16      4     num_computed_tokens  int32     leading tokens whose KV is cached
        20      4     num_new_tokens       int32     tokens this request feeds to its next step
        24      1     is_prompt            bool      its next step is a prompt step
        25      3     (padding)
        28      4     max_tokens           int32     output tokens allowed in total
        32      4     temperature          float32   0 = greedy
        36      4     top_p                float32   1 = off
        40      4     top_k                int32     0 = off
        44      4     (padding)
        48      8     seed                 int64     −1 = no seed
        itemsize 56, alignment 8

    The same struct as a `ctypes.Structure` has the same offsets and
    `ctypes.sizeof` 56.

    Returns:
        The numpy structured dtype above (field names, types, offsets and itemsize
        exactly as listed; padding bytes are not fields).

    Example:
        >>> dt = record_dtype()
        >>> dt.itemsize, dt.fields["max_tokens"][1], dt.fields["seed"][1]
        (56, 28, 48)
    """
    # TODO(ch30.1): your code here (about 4 of the task's 46 lines, in 3 places)
    raise NotImplementedError("ch30.1 record_dtype: not implemented yet (about 46 lines)")


def lower_request(request: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Lower a Python request to the record and flat arrays a native core takes. Task ch30.1.

    The request is a dict as the Python front end keeps it:

    - `request_id`: int, 0 ≤ id < 2**63;
    - `prompt_token_ids`: non-empty list of ints, each 0 ≤ id < 2**31 (int32);
    - `output_token_ids`: list of ints (default []), same range;
    - `num_computed_tokens`: int (default 0), the leading tokens whose KV is
      cached, 0 ≤ n ≤ num_tokens − 1 (the newest token never has KV yet);
    - `sampling_params`: dict (default {}) with any of `temperature` (default
      1.0, finite, ≥ 0), `top_p` (1.0, 0 < p ≤ 1), `top_k` (0; 0 or −1 mean off,
      else ≥ 1), `max_tokens` (16, ≥ 1), `seed` (None, else 0 ≤ seed < 2**63).
      Numbers must be real numbers, not bools; ints must be ints.

    Other request keys (the prompt text, arrival time, …) stay in Python and are
    ignored. An unknown *sampling* key raises ValueError: the record has no field
    for it, and dropping it would change what the core samples. The provided
    first line checks that every other field is there and fits its C type and
    range; the unknown key is the check the lowering itself owes.

    The next step of the request:

    - a **decode** step when exactly the newest token lacks KV and it is an
      output token (num_computed_tokens = num_tokens − 1 and num_tokens >
      prompt_len): one new token, the last one;
    - otherwise a **prompt** step over all tokens from num_computed_tokens on (a
      fresh prompt, its remainder after a prefix-cache hit, or a whole
      prompt + output after a preemption, as nano-vllm recomputes it).

    The record (see `record_dtype`) encodes: top_k −1 as 0, seed None as −1,
    num_new_tokens = num_tokens − num_computed_tokens, is_prompt as above.
    Simplification: the course has no chunking; the whole remainder is one step.

    Args:
        request: the dict above (never modified).

    Returns:
        (record, input_ids, positions): a structured array of shape [1] with
        dtype `record_dtype()`; int32 [num_new_tokens] token ids of the step;
        int32 [num_new_tokens] their positions num_computed_tokens … num_tokens − 1.

    Raises:
        ValueError: a missing or mistyped field, a value that does not fit its C
            type or range, an unknown sampling parameter, num_computed_tokens out
            of range, or a finished request (len(output_token_ids) ≥ max_tokens).

    Example:
        >>> rec, ids, pos = lower_request({"request_id": 7, "prompt_token_ids": [11, 12, 13],
        ...                                "output_token_ids": [14], "num_computed_tokens": 3})
        >>> bool(rec["is_prompt"][0]), int(rec["num_new_tokens"][0]), ids.tolist(), pos.tolist()
        (False, 1, [14], [3])
    """
    _check_request(request)
    # TODO(ch30.1): your code here (about 21 of the task's 46 lines, in 3 places)
    raise NotImplementedError("ch30.1 lower_request: not implemented yet (about 46 lines)")


def select_phase(batch: np.ndarray) -> str:
    """The phase of the core's next step: "prompt" or "decode". Task ch30.1.

    The core first checks that it can trust the buffer: a 1-D numpy array of at
    least one record whose dtype is exactly `record_dtype()` (same field names in
    the same order, same types and byte order, same offsets, same itemsize). A
    packed (unaligned) array, a big-endian one or an int64 in place of an int32
    has the right field names but the wrong bytes, and must be rejected, not
    reinterpreted. Then every record must be consistent: num_new_tokens =
    num_tokens − num_computed_tokens, and is_prompt as `lower_request` defines it.

    The step is a **prompt** step when any record is in its prompt phase (prefill
    first, as vLLM v0 and nano-vllm schedule), else a **decode** step. The
    provided first line checks that the batch is a non-empty 1-D structured
    array; checking its layout and its records is yours.

    Why the check matters even in Python: np.concatenate keeps this layout only
    for a dtype flagged aligned (built with align=True). Records that crossed
    np.save / np.load (or the grader's wire) lose that flag, and concatenating
    them yields *packed* 49-byte records with the same field names.

    Args:
        batch: structured array [B] of records (B ≥ 1), e.g. the concatenated
            records of `lower_request`.

    Returns:
        "prompt" or "decode".

    Raises:
        ValueError: not a 1-D structured array of `record_dtype()` records (the
            message names the first field whose name, type or offset differs, or
            the itemsize), an empty batch, or an inconsistent record.

    Example:
        >>> a = lower_request({"request_id": 1, "prompt_token_ids": [5, 6]})[0]
        >>> b = lower_request({"request_id": 2, "prompt_token_ids": [5], "output_token_ids": [9],
        ...                    "num_computed_tokens": 1})[0]
        >>> select_phase(np.concatenate([a, b])), select_phase(b)
        ('prompt', 'decode')
    """
    _check_records(batch)
    # TODO(ch30.1): your code here (about 21 of the task's 46 lines, in 3 places)
    raise NotImplementedError("ch30.1 select_phase: not implemented yet (about 46 lines)")


def check_support(model_config: dict, support_matrix: dict) -> list[str]:
    """Every feature of a model configuration that a pinned release does not support. Task ch30.2.

    The support matrix quotes a release's README at a fixed commit; every key
    is required:

        {"release": "engine@0a1b2c3",                  # what the matrix quotes
         "architectures": ["Qwen3ForCausalLM", ...],   # the verified model classes
         "dtypes": ["float16", "bfloat16"],
         "quantization": ["fp8", "gptq"],              # methods; unquantised is always fine
         "head_dims": [64, 128],                       # head sizes its attention kernels build
         "max_context": 32768,                         # longest max_position_embeddings
         "tensor_parallel_sizes": [1, 2, 4, 8],
         "features": {"prefix_caching": True, "kv_service": False, ...}}

    The model configuration is a Hugging Face config dict plus how it is to be
    served: `architectures` (non-empty list of str), `dtype` or `torch_dtype`
    (str), `quantization_config` (absent, None, or a dict with `quant_method`),
    `head_dim` (int; when absent or None, hidden_size // num_attention_heads),
    `max_position_embeddings` (int), `tensor_parallel_size` (int, default 1),
    `features` (list of str, default []).

    One entry per unsupported feature, as "<key>: <reason>", in this order:

    - `architecture`: each architecture not in the list (one entry each);
    - `dtype`: the dtype not in the list;
    - `quantization`: a quant_method not in the list;
    - `head_dim`: a head size not in the list;
    - `max_position_embeddings`: a context longer than max_context (equal is fine);
    - `tensor_parallel_size`: a size not in the list;
    - `<feature>` (its own name): each requested feature the matrix marks False,
      or does not list at all (a README vouches only for what it lists).

    The reason names the offending value (e.g. "40960 > max_context 32768"). A
    release that keeps a local prefix cache but has no KV service supports
    "prefix_caching" and not "kv_service". The checks accept the entries in any
    order.

    Args:
        model_config: the configuration dict above (never modified).
        support_matrix: the matrix dict above (never modified).

    Returns:
        list of str, empty when everything is supported.

    Raises:
        ValueError: a matrix key missing or mistyped; a config without
            architectures, dtype, max_position_embeddings or a derivable
            head_dim; a tensor_parallel_size that is not a positive int; features
            that are not a list of str.

    Example:
        >>> matrix = {"release": "x@1", "architectures": ["LlamaForCausalLM"], "dtypes": ["bfloat16"],
        ...           "quantization": [], "head_dims": [128], "max_context": 8192,
        ...           "tensor_parallel_sizes": [1], "features": {"prefix_caching": True}}
        >>> check_support({"architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16", "head_dim": 128,
        ...                "max_position_embeddings": 8192, "features": ["kv_service"]}, matrix)
        ["kv_service: not listed in x@1's support matrix, so this release does not vouch for it"]
    """
    _check_matrix(support_matrix)
    _check_config(model_config)
    # TODO(ch30.2): your code here (about 31 lines)
    raise NotImplementedError("ch30.2 check_support: not implemented yet (about 31 lines)")


# -- provided: the input checks every task needs but none teaches (not part of the exercise) ----------------------

def _int_field(name: str, v, lo: int, hi: int) -> int:
    """Provided: v as an int; raise ValueError unless it is an int (not a bool) in [lo, hi)."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise ValueError(f"{name} must be an int; got {type(v).__name__} {v!r}")
    if not lo <= int(v) < hi:
        raise ValueError(f"{name}={v} does not fit: it must lie in [{lo}, {hi})")
    return int(v)


def _real_field(name: str, v) -> float:
    """Provided: v as a float; raise ValueError unless it is a finite real number (not a bool)."""
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not math.isfinite(v):
        raise ValueError(f"{name} must be a finite number; got {v!r}")
    return float(v)


def _check_request(request: dict) -> None:
    """Provided: raise ValueError unless every field `lower_request` reads is there and fits its C type and range:
    ids, token ids (int32), a non-empty prompt, num_computed_tokens in [0, num_tokens − 1], and the known sampling
    parameters (temperature finite, ≥ 0 and a float32; top_p in (0, 1]; top_k ≥ −1; max_tokens ≥ 1; seed None or
    in [0, 2**63)), and the request is not finished. Unknown sampling keys are left to `lower_request`."""
    if not isinstance(request, dict):
        raise ValueError("a request is a dict")
    for key in ("request_id", "prompt_token_ids"):
        if key not in request:
            raise ValueError(f"the request has no {key!r}")
    _int_field("request_id", request["request_id"], 0, 2**63)
    prompt, output = request["prompt_token_ids"], request.get("output_token_ids", [])
    for name, ids in (("prompt_token_ids", prompt), ("output_token_ids", output)):
        if not isinstance(ids, (list, tuple)):
            raise ValueError(f"{name} must be a list of token ids")
        for i, t in enumerate(ids):
            _int_field(f"{name}[{i}]", t, 0, 2**31)
    if not prompt:
        raise ValueError("the prompt is empty: there is nothing to compute")
    num_tokens = len(prompt) + len(output)
    if num_tokens >= 2**31:
        raise ValueError("the sequence is longer than int32 can count")
    _int_field("num_computed_tokens", request.get("num_computed_tokens", 0), 0, num_tokens)
    sp = request.get("sampling_params", {})
    if not isinstance(sp, dict):
        raise ValueError("sampling_params must be a dict")
    temperature = _real_field("temperature", sp.get("temperature", 1.0))
    with np.errstate(over="ignore"):  # a temperature beyond float32's range becomes inf: the test below, not an error
        fits = bool(np.isfinite(np.float32(temperature)))
    if temperature < 0 or not fits:
        raise ValueError(f"temperature={temperature} must be ≥ 0 and fit float32")
    top_p = _real_field("top_p", sp.get("top_p", 1.0))
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p} must lie in (0, 1]")
    _int_field("top_k", sp.get("top_k", 0), -1, 2**31)
    max_tokens = _int_field("max_tokens", sp.get("max_tokens", 16), 1, 2**31)
    if sp.get("seed") is not None:
        _int_field("seed", sp["seed"], 0, 2**63)
    if len(output) >= max_tokens:
        raise ValueError(f"the request is finished: {len(output)} of max_tokens={max_tokens} tokens generated")


def _check_records(batch: np.ndarray) -> None:
    """Provided: raise ValueError unless batch is a non-empty 1-D numpy structured array (its layout is the lesson:
    `select_phase` checks it)."""
    if not isinstance(batch, np.ndarray) or batch.dtype.names is None:
        raise ValueError("the batch must be a numpy structured array of records")
    if batch.ndim != 1 or batch.shape[0] == 0:
        raise ValueError(f"the batch must be a non-empty 1-D array of records; got shape {list(batch.shape)}")


def _check_matrix(support_matrix: dict) -> None:
    """Provided: raise ValueError unless the support matrix has every key, each of its type."""
    types = {"release": str, "architectures": list, "dtypes": list, "quantization": list, "head_dims": list,
             "max_context": int, "tensor_parallel_sizes": list, "features": dict}
    if not isinstance(support_matrix, dict):
        raise ValueError("the support matrix is a dict")
    for key, kind in types.items():
        if key not in support_matrix or type(support_matrix[key]) is not kind:
            raise ValueError(f"the support matrix needs {key!r} as a {kind.__name__}")


def _check_config(model_config: dict) -> None:
    """Provided: raise ValueError unless the config has non-empty architectures (str), a dtype, a head_dim or
    hidden_size and num_attention_heads to derive it, a positive max_position_embeddings, a positive int
    tensor_parallel_size (when given) and features as a list of str (when given)."""
    c = model_config
    if not isinstance(c, dict):
        raise ValueError("the model configuration is a dict")
    archs = c.get("architectures")
    if not isinstance(archs, list) or not archs or not all(isinstance(a, str) for a in archs):
        raise ValueError("the config needs 'architectures', a non-empty list of model class names")
    if not isinstance(c.get("dtype") or c.get("torch_dtype"), str):
        raise ValueError("the config names no dtype ('dtype' or 'torch_dtype')")
    if c.get("head_dim") is None:
        hidden, heads = c.get("hidden_size"), c.get("num_attention_heads")
        if type(hidden) is not int or type(heads) is not int or heads <= 0:
            raise ValueError("the config has no head_dim and no hidden_size / num_attention_heads to derive it")
    context = c.get("max_position_embeddings")
    if type(context) is not int or context <= 0:
        raise ValueError("the config needs max_position_embeddings, a positive int")
    tp = c.get("tensor_parallel_size", 1)
    if type(tp) is not int or tp <= 0:
        raise ValueError(f"tensor_parallel_size must be a positive int; got {tp!r}")
    features = c.get("features", [])
    if not isinstance(features, list) or not all(isinstance(f, str) for f in features):
        raise ValueError("features must be a list of feature names")
