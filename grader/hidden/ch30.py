"""Hidden checks of ch30 · into a native core: random requests and batches, layout violations, matrix edges."""

from __future__ import annotations

import numpy as np

from grader.authoring import CheckFailed, Trial, hidden
from grader.checks.ch30 import MATRIX, QWEN3_CONFIG, batch_of, expect_lowered, record_fields, run_support_case
from grader.i18n import tr

# -- ch30.1 ---------------------------------------------------------------------------------------------------


@hidden("ch30.1", "random requests: every field, ids and positions")
def random_requests(t: Trial) -> None:
    for i in range(40):
        req = random_request(t, i)
        expect_lowered(t.yours.lower_request(req), t.ref.lower_request(req), req, tr("random request {i}", i=i))


@hidden("ch30.1", "edge values that still fit")
def edge_values(t: Trial) -> None:
    cases = [
        ({"request_id": 2**63 - 1, "prompt_token_ids": [2**31 - 1, 0]}, tr("the largest request_id and token id")),
        ({"request_id": 0, "prompt_token_ids": [5]}, tr("a one-token prompt")),
        ({"request_id": 1, "prompt_token_ids": [5, 6], "num_computed_tokens": 1}, tr("one prompt token left")),
        (
            {
                "request_id": 2,
                "prompt_token_ids": [5],
                "output_token_ids": [6, 7],
                "num_computed_tokens": 1,
                "sampling_params": {"max_tokens": 3},
            },
            tr("a preempted request after a partial hit"),
        ),
        (
            {"request_id": 3, "prompt_token_ids": [5], "sampling_params": {"temperature": 0, "top_p": 1, "top_k": 1, "seed": 2**63 - 1}},
            tr("greedy, ints for floats, the largest seed"),
        ),
        ({"request_id": 4, "prompt_token_ids": [1, 2], "arrival_time": 3.5, "prompt": "hi"}, tr("front-end keys stay in Python")),
    ]
    for req, case in cases:
        expect_lowered(t.yours.lower_request(req), t.ref.lower_request(req), req, case)


@hidden("ch30.1", "sampling parameters the record has no field for raise ValueError")
def lower_unknown_parameters(t: Trial) -> None:
    base = {"request_id": 1, "prompt_token_ids": [1, 2, 3]}
    for key, value in (("logprobs", 5), ("min_p", 0.05), ("presence_penalty", 0.5), ("stop", ["\n"]), ("repetition_penalty", 1.1)):
        params = {"temperature": 0.7, key: value} if t.random.random() < 0.5 else {key: value}
        t.expect_raises(
            ValueError,
            t.yours.lower_request,
            dict(base, sampling_params=params),
            because=tr("the record has no field for {key}, and dropping it would change the sampling", key=key),
        )


@hidden("ch30.1", "random batches: prompt first, else decode")
def random_batches(t: Trial) -> None:
    pool = [t.ref.lower_request(random_request(t, i))[0] for i in range(30)]
    for _ in range(25):
        batch = batch_of(t.random.sample(pool, t.random.randint(1, 8)))
        got, want = t.yours.select_phase(batch), t.ref.select_phase(batch)
        if got != want:
            fields = dict(n=len(batch), is_prompt=batch["is_prompt"].tolist(), want=want, got=got)
            raise CheckFailed(
                tr(
                    "a batch of {n} records, is_prompt = {is_prompt}: some record has prompt work, and prompt goes first, "
                    "so {want!r}; yours: {got!r}",
                    **fields,
                )
                if want == "prompt"
                else tr("a batch of {n} records, is_prompt = {is_prompt}: no record has prompt work, so {want!r}; yours: {got!r}", **fields)
            )


@hidden("ch30.1", "layout violations are rejected")
def layout_violations(t: Trial) -> None:
    rec = batch_of([t.ref.lower_request(random_request(t, i))[0] for i in range(3)])
    fields = record_fields(rec.dtype)
    names = list(fields)
    swapped = names[:]
    swapped[2], swapped[3] = swapped[3], swapped[2]
    cases = [
        (
            _rebuilt(rec, names, top_k=">i4", prompt_len=">i4"),
            tr("its prompt_len and top_k are big-endian: the right names, the wrong bytes"),
        ),
        (_rebuilt(rec, names, top_k="<i8"), tr("its top_k is an int64, which moves seed and the size")),
        (_rebuilt(rec, names, temperature="<f8"), tr("its temperature is a float64")),
        (
            rec.astype(
                np.dtype(
                    {"names": names, "formats": [fields[n][0] for n in names], "offsets": [fields[n][1] for n in names], "itemsize": 64}
                )
            ),
            tr("its records are 64 bytes apart: the right offsets, the wrong stride"),
        ),
        (_rebuilt(rec, swapped), tr("num_tokens and num_computed_tokens are swapped: the same sizes, another meaning")),
        (_rebuilt(rec, names[:-1]), tr("its records have no seed")),
    ]
    for batch, because in cases:
        t.expect_raises(ValueError, t.yours.select_phase, batch, because=because)


@hidden("ch30.1", "inconsistent records are rejected")
def inconsistent_records(t: Trial) -> None:
    rec = t.ref.lower_request({"request_id": 3, "prompt_token_ids": [1, 2], "output_token_ids": [3], "num_computed_tokens": 2})[0]
    flipped = rec.copy()
    flipped["is_prompt"] = True
    t.expect_raises(
        ValueError,
        t.yours.select_phase,
        flipped,
        because=tr("is_prompt says prompt, but only the newest output token lacks KV: that is a decode step"),
    )
    stale = rec.copy()
    stale["num_new_tokens"] = 3
    t.expect_raises(ValueError, t.yours.select_phase, stale, because=tr("num_new_tokens 3 ≠ num_tokens − num_computed_tokens = 1"))


# -- ch30.2 ---------------------------------------------------------------------------------------------------


@hidden("ch30.2", "random configurations against random matrices")
def random_support(t: Trial) -> None:
    for i in range(30):
        matrix = random_matrix(t)
        run_support_case(t, random_config(t, matrix), matrix, tr("random case {i}", i=i))


@hidden("ch30.2", "the edges of each row")
def support_edges(t: Trial) -> None:
    cases = [
        (dict(QWEN3_CONFIG, max_position_embeddings=32769, features=[]), tr("one token over max_context")),
        (dict(QWEN3_CONFIG, tensor_parallel_size=8, features=[]), tr("the largest listed tp")),
        (dict(QWEN3_CONFIG, tensor_parallel_size=16, features=[]), tr("tp 16, past the list")),
        (dict(QWEN3_CONFIG, quantization_config=None, features=[]), "quantization_config None"),
        (dict(QWEN3_CONFIG, quantization_config={"quant_method": "fp8"}, features=[]), tr("a listed method")),
        (dict(QWEN3_CONFIG, features=["speculative_decoding", "prefix_caching", "lora"]), tr("features marked False and unlisted")),
        (dict(QWEN3_CONFIG, architectures=["Qwen3ForCausalLM", "Qwen3MoeForCausalLM"], features=[]), tr("two architectures, one verified")),
        (
            {**{k: v for k, v in QWEN3_CONFIG.items() if k != "torch_dtype"}, "dtype": "float16", "features": []},
            tr("the newer 'dtype' key"),
        ),
    ]
    for config, case in cases:
        run_support_case(t, config, MATRIX, case)
    local_only = dict(MATRIX, features={"prefix_caching": True})
    run_support_case(
        t,
        dict(QWEN3_CONFIG, max_position_embeddings=4096),
        local_only,
        tr("a release with a local prefix cache that does not list a KV service"),
    )


@hidden("ch30.2", "real model configurations (their config.json) in several deployments")
def real_configs(t: Trial) -> None:
    llama3_8b = {
        "architectures": ["LlamaForCausalLM"],
        "torch_dtype": "bfloat16",
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 8192,
    }
    qwen25_7b = {
        "architectures": ["Qwen2ForCausalLM"],
        "torch_dtype": "bfloat16",
        "hidden_size": 3584,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "max_position_embeddings": 32768,
    }
    mistral_7b = {
        "architectures": ["MistralForCausalLM"],
        "torch_dtype": "bfloat16",
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 32768,
    }
    qwen3_8b = {
        "architectures": ["Qwen3ForCausalLM"],
        "torch_dtype": "bfloat16",
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 40960,
    }
    for name, config in (("Llama-3-8B", llama3_8b), ("Qwen2.5-7B", qwen25_7b), ("Mistral-7B", mistral_7b), ("Qwen3-8B", qwen3_8b)):
        for _ in range(3):
            deployment = {
                "tensor_parallel_size": t.random.choice([1, 2, 4, 8, 16]),
                "features": t.random.sample(["prefix_caching", "kv_service", "speculative_decoding", "lora"], t.random.randint(0, 2)),
            }
            if t.random.random() < 0.3:
                deployment["quantization_config"] = {"quant_method": t.random.choice(["fp8", "awq"])}
            run_support_case(t, {**config, **deployment}, MATRIX, f"{name}, {deployment}")


# -- helpers: random requests, records and matrices from the grading seed --------------------------------------


def random_request(t: Trial, request_id: int) -> dict:
    """A request in any state a front end hands over: fresh, after a prefix hit, decoding, or preempted."""
    r = t.random
    prompt = [r.randrange(0, 151936) for _ in range(r.randint(1, 40))]
    max_tokens = r.randint(1, 64)
    output = [r.randrange(0, 151936) for _ in range(r.randint(0, max_tokens - 1))]
    n = len(prompt) + len(output)
    state = r.choice(["fresh", "prefix", "decode", "preempted", "last"])
    computed = {"fresh": 0, "prefix": r.randint(0, n - 1), "decode": n - 1, "preempted": 0, "last": n - 1}[state]
    if state == "decode" and not output:
        computed = 0
    sp = {}
    for key, draw in (
        ("temperature", lambda: r.choice([0.0, 0.5, 1.0, 1.3, r.random() * 2])),
        ("top_p", lambda: r.choice([1.0, 0.9, r.random() * 0.99 + 0.01])),
        ("top_k", lambda: r.choice([-1, 0, 1, 20, r.randint(1, 1000)])),
        ("seed", lambda: r.choice([None, 0, r.randrange(2**63)])),
    ):
        if r.random() < 0.6:
            sp[key] = draw()
    sp["max_tokens"] = max_tokens
    req = {"request_id": r.randrange(2**63) if r.random() < 0.2 else request_id, "prompt_token_ids": prompt, "sampling_params": sp}
    if output or r.random() < 0.5:
        req["output_token_ids"] = output
    if computed or r.random() < 0.5:
        req["num_computed_tokens"] = computed
    return req


def _rebuilt(rec: np.ndarray, names: list[str], **retype: str) -> np.ndarray:
    """The records with only `names`, in that order, some fields retyped, laid out like a C struct."""
    fields = record_fields(rec.dtype)
    dt = np.dtype([(n, retype.get(n, fields[n][0])) for n in names], align=True)
    out = np.zeros(rec.shape, dtype=dt)
    for n in names:
        out[n] = rec[n]
    return out


def random_matrix(t: Trial) -> dict:
    r = t.random
    archs = ["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM", "Qwen3MoeForCausalLM"]
    return {
        "release": f"engine@{r.randrange(16**7):07x}",
        "architectures": r.sample(archs, r.randint(1, 4)),
        "dtypes": r.sample(["float16", "bfloat16", "float32"], r.randint(1, 3)),
        "quantization": r.sample(["fp8", "gptq", "awq", "int8"], r.randint(0, 3)),
        "head_dims": sorted(r.sample([64, 80, 96, 128, 256], r.randint(1, 4))),
        "max_context": r.choice([4096, 8192, 32768, 131072]),
        "tensor_parallel_sizes": sorted(r.sample([1, 2, 4, 8], r.randint(1, 4))),
        "features": {
            f: r.random() < 0.5 for f in r.sample(["prefix_caching", "kv_service", "lora", "speculative_decoding"], r.randint(0, 4))
        },
    }


def random_config(t: Trial, matrix: dict) -> dict:
    r = t.random
    heads = r.choice([8, 16, 32])
    c = {
        "architectures": [r.choice(["LlamaForCausalLM", "Qwen3ForCausalLM", "MixtralForCausalLM"])],
        ("dtype" if r.random() < 0.3 else "torch_dtype"): r.choice(["float16", "bfloat16", "float32"]),
        "hidden_size": heads * r.choice([64, 96, 128]),
        "num_attention_heads": heads,
        "max_position_embeddings": r.choice([matrix["max_context"], matrix["max_context"] + 1, 2048, 40960]),
    }
    if r.random() < 0.5:
        c["head_dim"] = r.choice([64, 128, 256])
    if r.random() < 0.4:
        c["quantization_config"] = r.choice([None, {"quant_method": r.choice(["fp8", "awq", "gptq"])}])
    if r.random() < 0.7:
        c["tensor_parallel_size"] = r.choice([1, 2, 3, 4, 8, 16])
    if r.random() < 0.7:
        c["features"] = r.sample(["prefix_caching", "kv_service", "lora", "speculative_decoding"], r.randint(0, 3))
    return c
