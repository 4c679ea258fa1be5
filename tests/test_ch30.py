"""ch30 · into a native core: wrong submissions get the teaching message meant for them, the figures drawn
from them mark what is wrong, and the record really is the C struct it claims to be."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from figure_layout import off_canvas, overlap, reference_figures, reference_records, texts
from mutate import figure, mutant_grader, result, tasks_not_passed, wrong_elements

from figures import ch30 as drawn
from figures.kit import text_width
from figures.style import MARGIN, SMALL
from grader.checks import ch30 as checks
from solutions import ch30_native_core as ref

SEED = 30


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return mutant_grader(tmp_path_factory, "ch30", SEED)


# -- 30.1 ---------------------------------------------------------------------------------------------
def test_a_packed_record_is_explained_by_alignment(graded):
    report = graded.mistake("packed")  # the struct built without alignment: fields packed back to back
    r = result(report, "the record layout")
    assert r.status == "failed"
    assert "field max_tokens should be at byte offset 28; yours: 25" in r.message
    assert "is_prompt ends at byte 25" in r.message and "3 padding bytes come first" in r.message
    assert r.hints == ["packed"]
    assert tasks_not_passed(report) == {"ch30.1"}
    bad = wrong_elements(report, "ch30-request-path")
    assert bad
    texts = [el.text for el in figure(report, "ch30-request-path").iter() if el.text]
    assert "@25 int32" in texts and "@28 int32" in texts, "the figure shows your offset and the C offset"


def test_top_k_minus_one_left_unlowered_is_explained(graded):
    report = graded.mistake("top_k_raw")  # the front end's −1 ("off") copied into the record instead of the core's 0
    r = result(report, "figure instance", "ch30.1")
    assert r.status == "failed"
    assert "field top_k: top_k = -1, lowered to 0 (the core's 'off'), so 0; yours: -1" in r.message
    assert r.hints == ["top_k_raw"]
    assert result(report, "the record layout").status == "passed"
    assert wrong_elements(report, "ch30-request-path")


def test_outputs_mean_decode_is_explained(graded):
    report = graded.mistake("outputs_mean_decode")  # "a request with output tokens decodes": no recomputation
    r = result(report, "a preempted request")
    assert r.status == "failed"
    assert "field is_prompt: prompt: 5 tokens from position 0 on lack KV" in r.message
    assert "yours: False" in r.message
    assert r.hints == ["outputs_mean_decode"]


def test_decode_first_phase_selection_is_explained(graded):
    report = graded(
        "decode_first",
        # a prompt step only when every request is in its prompt phase
        (
            'return "prompt" if bool(batch["is_prompt"].any()) else "decode"',
            'return "prompt" if bool(batch["is_prompt"].all()) else "decode"',
        ),
    )
    r = result(report, "figure instance", "ch30.1")
    assert r.status == "failed"
    assert "select_phase of the batch ['A', 'B', 'C']" in r.message
    assert "prompt work goes first, so 'prompt'; yours: 'decode'" in r.message
    assert result(report, "random batches").status == "failed"
    assert wrong_elements(report, "ch30-request-path")


def test_a_core_that_trusts_any_buffer_fails(graded):
    report = graded(
        "no_layout_check",
        # select_phase reads whatever bytes it is given
        ("    if got.names != want.names:\n        raise", "    if False:\n        raise"),
        ("        if t_got != t_want:\n            raise", "        if False:\n            raise"),
        ("        if off_got != off_want:\n            raise", "        if False:\n            raise"),
        ("    if got.itemsize != want.itemsize:\n        raise", "    if False:\n        raise"),
    )
    r = result(report, "a packed (unaligned) batch")
    assert r.status == "failed"
    assert "should raise ValueError because a packed record has max_tokens at byte 25" in r.message
    v = result(report, "layout violations")
    assert v.status == "failed" and "big-endian" in v.message


# -- 30.2 ---------------------------------------------------------------------------------------------
def test_a_prefix_cache_taken_for_a_kv_service_is_explained(graded):
    report = graded.mistake("prefix_is_kv_service")  # "it has a KV cache, so it has KV service"
    r = result(report, "figure instance: Qwen3-0.6B")
    assert r.status == "failed"
    assert "feature kv_service is not supported by engine@0a1b2c3 (the matrix says no); yours does not name it" in r.message
    assert r.hints == ["prefix_is_kv_service"]
    assert tasks_not_passed(report) == {"ch30.2"}
    assert wrong_elements(report, "ch30-system-boundary")


def test_an_exclusive_context_limit_is_explained(graded):
    report = graded.mistake("exclusive_context")  # max_context read as exclusive
    r = result(report, "a context exactly at max_context")
    assert r.status == "failed"
    assert "max_position_embeddings = 32768 is supported by engine@0a1b2c3 (allowed: ≤ 32768); yours lists it as unsupported" in r.message
    assert r.hints == ["exclusive_context"]


def test_head_dim_derived_from_hidden_size_is_explained(graded):
    report = graded.mistake("derived_head_dim")  # head_dim always derived as hidden_size // num_attention_heads
    r = result(report, "head_dim from the config")
    assert r.status == "failed"
    assert "head_dim = 96 is not supported" in r.message and "yours does not name it" in r.message
    assert r.hints == ["derived_head_dim"]
    assert f"hint: {checks.M.hint('derived_head_dim', value=96, derived=64)}" in r.message, "the hint names both"


def test_reasons_must_name_the_value(graded):
    report = graded(
        "vague_reasons",
        # every reason is just "unsupported"
        ("out.append(f\"dtype: {dtype} is not among the supported dtypes {m['dtypes']}\")", 'out.append("dtype: unsupported")'),
    )
    r = result(report, "every row unsupported at once")
    assert r.status == "failed"
    assert "the reason for dtype must say what is unsupported and name the value (float32)" in r.message


def test_a_struct_without_tail_padding_is_explained():
    """The C struct's size is a multiple of its widest field, even when that leaves padding after the last one."""
    aligned = np.dtype([("request_id", "<i8"), ("num_tokens", "<i4")], align=True)
    packed = np.dtype([("request_id", "<i8"), ("num_tokens", "<i4")])
    with pytest.raises(checks.CheckFailed) as e:
        checks.explain_layout(packed, aligned, "record_dtype()")
    assert "the record is 16 bytes (num_tokens ends at 12" in str(e.value) and "yours: 12" in str(e.value)
    assert e.value.hints == ["tail_padding"]
    with pytest.raises(checks.CheckFailed) as e:  # a larger record is not a missing tail
        checks.explain_layout(
            np.dtype({"names": ["request_id", "num_tokens"], "formats": ["<i8", "<i4"], "offsets": [0, 8], "itemsize": 24}),
            aligned,
            "record_dtype()",
        )
    assert e.value.hints == []


def test_padding_declared_as_fields_is_explained():
    padded = np.dtype([("request_id", "<i8"), ("is_prompt", "?"), ("_pad", "V3"), ("num_tokens", "<i4")])
    with pytest.raises(checks.CheckFailed) as e:
        checks.explain_layout(
            padded, np.dtype([("request_id", "<i8"), ("is_prompt", "?"), ("num_tokens", "<i4")], align=True), "record_dtype()"
        )
    assert "(not in the struct: ['_pad'])" in str(e.value) and e.value.hints == ["padding_fields"]


# -- the reference itself -------------------------------------------------------------------------------
class CRecord(ctypes.Structure):
    _fields_ = [
        ("request_id", ctypes.c_int64),
        ("prompt_len", ctypes.c_int32),
        ("num_tokens", ctypes.c_int32),
        ("num_computed_tokens", ctypes.c_int32),
        ("num_new_tokens", ctypes.c_int32),
        ("is_prompt", ctypes.c_bool),
        ("max_tokens", ctypes.c_int32),
        ("temperature", ctypes.c_float),
        ("top_p", ctypes.c_float),
        ("top_k", ctypes.c_int32),
        ("seed", ctypes.c_int64),
    ]


def test_the_record_is_the_c_struct():
    dt = ref.record_dtype()
    assert dt.itemsize == ctypes.sizeof(CRecord) == 56
    assert [dt.fields[n][1] for n in dt.names] == [getattr(CRecord, n).offset for n, _ in CRecord._fields_]
    rec, _, _ = ref.lower_request(checks.REQ_A)
    c = CRecord.from_buffer_copy(rec.tobytes())
    assert (c.request_id, c.num_new_tokens, c.is_prompt, c.top_k, c.seed, c.max_tokens) == (7, 5, True, 0, -1, 64)
    assert abs(c.temperature - 0.7) < 1e-6


def test_records_of_many_requests_form_one_buffer():
    recs = [ref.lower_request(r)[0] for r in checks.FIGURE_REQUESTS.values()]
    batch = np.concatenate(recs)
    assert batch.dtype == ref.record_dtype() and batch.nbytes == 3 * 56
    assert ref.select_phase(batch) == "prompt" and ref.select_phase(batch[1:]) == "decode"


# -- the figures' layout ------------------------------------------------------------------------------------
def test_what_the_matrix_allows_is_shown_whole_or_with_the_configs_value_first():
    arch = next(row for row in reference_records("ch30")["ch30-system-boundary"]["rows"] if row["key"] == "architecture")
    assert arch["ok"] and len(arch["allowed"]) > 1 and arch["value"] != arch["allowed"][0]
    whole = drawn.allowed_note(arch, float("inf"))
    assert whole == "allowed: " + ", ".join(arch["allowed"])
    narrow = drawn.allowed_note(arch, text_width(whole, SMALL) - 1)
    assert narrow.startswith(f"allowed: {arch['value']}") and "more" in narrow and "…" not in narrow
    assert text_width(narrow, SMALL) <= text_width(whole, SMALL) - 1
    svg = reference_figures("ch30")["ch30-system-boundary"]
    notes = [t for t in texts(svg) if t.s.startswith("allowed: ")]
    assert [t.s for t in notes if "…" in t.s] == [], "no name cut short"
    assert any(arch["value"] in t.s for t in notes), "the architecture asked about is in view"
    chips = [t for t in texts(svg, cls="value") if t.s.startswith(("✓ ", "✗ "))]
    assert chips and not [(a.s, b.s) for a in chips for b in notes if overlap(a, b)]
    assert off_canvas(svg, margin=MARGIN - 1) == []


# -- the provided input checks (outside the solution regions: unit tests, no graded checks) ---------------------
BASE = {"request_id": 1, "prompt_token_ids": [1, 2, 3]}
BAD_REQUESTS = {
    "token id 2**31 does not fit int32": dict(BASE, prompt_token_ids=[1, 2**31]),
    "token id −1": dict(BASE, prompt_token_ids=[1, -1]),
    "a float token id": dict(BASE, prompt_token_ids=[1, 2.0]),
    "a bool token id": dict(BASE, prompt_token_ids=[True, 2]),
    "an empty prompt": dict(BASE, prompt_token_ids=[]),
    "request_id 2**63": dict(BASE, request_id=2**63),
    "request_id −1": dict(BASE, request_id=-1),
    "no token lacks KV": dict(BASE, num_computed_tokens=3),
    "num_computed_tokens −1": dict(BASE, num_computed_tokens=-1),
    "a negative temperature": dict(BASE, sampling_params={"temperature": -0.5}),
    "a NaN temperature": dict(BASE, sampling_params={"temperature": float("nan")}),
    "temperature 1e39 overflows float32": dict(BASE, sampling_params={"temperature": 1e39}),
    "top_p 0": dict(BASE, sampling_params={"top_p": 0.0}),
    "top_p 1.5": dict(BASE, sampling_params={"top_p": 1.5}),
    "top_k −2": dict(BASE, sampling_params={"top_k": -2}),
    "max_tokens 0": dict(BASE, sampling_params={"max_tokens": 0}),
    "seed −5": dict(BASE, sampling_params={"seed": -5}),
    "seed 2**64": dict(BASE, sampling_params={"seed": 2**64}),
    "max_tokens as a str": dict(BASE, sampling_params={"max_tokens": "16"}),
    "a finished request": dict(BASE, output_token_ids=[4, 5], sampling_params={"max_tokens": 2}),
    "no prompt_token_ids": {"request_id": 1},
    "not a dict": [1, 2, 3],
    "sampling_params not a dict": dict(BASE, sampling_params=[("top_p", 0.5)]),
}


@pytest.mark.parametrize("case", BAD_REQUESTS)
def test_the_provided_checks_refuse_a_request_that_does_not_fit(case):
    with pytest.raises(ValueError):
        ref.lower_request(BAD_REQUESTS[case])


def test_the_provided_checks_pass_the_edges_that_still_fit():
    ref._check_request(
        dict(
            BASE,
            request_id=2**63 - 1,
            prompt_token_ids=[2**31 - 1],
            num_computed_tokens=0,
            sampling_params={"temperature": 0, "top_p": 1, "top_k": -1, "seed": 0, "max_tokens": 1},
        )
    )
    ref._check_request(dict(BASE, sampling_params={"min_p": 0.1}))  # the unknown key is lower_request's own check
    with pytest.raises(ValueError, match="min_p"):
        ref.lower_request(dict(BASE, sampling_params={"min_p": 0.1}))


@pytest.mark.parametrize("batch", [np.zeros(3, dtype=np.int32), [1, 2], "records"])
def test_the_provided_checks_refuse_what_is_not_a_batch_of_records(batch):
    with pytest.raises(ValueError):
        ref.select_phase(batch)


def test_the_provided_checks_refuse_an_empty_or_2d_batch():
    rec = np.concatenate([ref.lower_request(dict(BASE, request_id=i))[0] for i in range(2)])
    for batch in (rec[:0], rec.reshape(1, 2)):
        with pytest.raises(ValueError):
            ref.select_phase(batch)
    assert ref.select_phase(rec) == "prompt"


def _without(d: dict, key: str) -> dict:
    return {k: v for k, v in d.items() if k != key}


@pytest.mark.parametrize(
    "change",
    [
        "tp 0",
        "tp str",
        "features str",
        "no architecture",
        "no dtype",
        "no context",
        "no head_dim source",
        "matrix context str",
        "matrix without dtypes",
        "matrix without features",
        "matrix not a dict",
    ],
)
def test_the_provided_checks_refuse_a_bad_config_or_matrix(change):
    config, matrix = dict(checks.QWEN3_CONFIG), dict(checks.MATRIX)
    config, matrix = {
        "tp 0": (dict(config, tensor_parallel_size=0), matrix),
        "tp str": (dict(config, tensor_parallel_size="2"), matrix),
        "features str": (dict(config, features="kv_service"), matrix),
        "no architecture": (dict(config, architectures=[]), matrix),
        "no dtype": (_without(config, "torch_dtype"), matrix),
        "no context": (_without(config, "max_position_embeddings"), matrix),
        "no head_dim source": (_without(_without(config, "head_dim"), "hidden_size"), matrix),
        "matrix context str": (config, dict(matrix, max_context="32768")),
        "matrix without dtypes": (config, _without(matrix, "dtypes")),
        "matrix without features": (config, _without(matrix, "features")),
        "matrix not a dict": (config, list(matrix.items())),
    }[change]
    with pytest.raises(ValueError):
        ref.check_support(config, matrix)
