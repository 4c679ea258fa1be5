"""The capstone engine: the chapters' functions generate exactly what transformers' Qwen3 generates, under
chunked prefill, prefix-cache hits and preemption; a wrong chapter function is named by step and layer; a
student's functions run where their checks pass; the CLI and the overview figure."""

from __future__ import annotations

import json
import re
import shutil
import xml.etree.ElementTree as ET
from dataclasses import replace

import pytest
import torch
from click.testing import CliRunner
from conftest import require_sandbox
from figure_layout import height, off_canvas, overlap, texts

import engine
import figures
from engine import oracle
from engine.core import EngineError, Settings
from engine.model import PRESETS, ModelError, load, random_model
from figures.style import MARGIN
from grader import chapters
from grader.cli import main
from solutions import ch19_rope

pytestmark = pytest.mark.slow  # grades submissions, builds releases or runs real tools: not in the fast loop

PROMPTS = [list(range(1, 12)), list(range(1, 9)) + [20, 21], list(range(1, 14)), [50, 51], list(range(1, 10))]
"""Five requests, four sharing the prefix 1 … 8: with block_size 4 the later ones hit the cached blocks."""
FORCING = Settings(block_size=4, num_blocks=9, max_num_seqs=2, max_num_batched_tokens=8)
"""Prefill budget 8 < prompt lengths: chunked prefill; 9 blocks of 4 for five growing requests: preemption."""
SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return load("tiny").save(tmp_path_factory.mktemp("tiny"))


def test_a_saved_preset_loads_back_identically(tmp_path):
    for tied in (True, False):
        model = random_model(replace(PRESETS["tiny"], tie_word_embeddings=tied), seed=3)
        again = load(model.save(tmp_path / str(tied)))
        assert again.config == model.config
        names = set(model.hf_state_dict())
        assert ("lm_head.weight" in names) != tied and "model.layers.1.self_attn.q_norm.weight" in names
        for a, b in zip(model.hf_state_dict().values(), again.hf_state_dict().values()):
            assert torch.equal(a, b)
        assert (again.lm_head is again.embed) == tied
    config = json.loads((tmp_path / "True" / "config.json").read_text())
    assert config["head_dim"] == 32 != config["hidden_size"] // config["num_attention_heads"]


def test_unsupported_configs_are_refused_with_a_reason(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({**PRESETS["tiny"].to_hf(), "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6}})
    )
    with pytest.raises(ModelError, match="RoPE scaling 'yarn'"):
        load(tmp_path)
    no_head_dim = {k: v for k, v in PRESETS["tiny"].to_hf().items() if k != "head_dim"}
    (tmp_path / "config.json").write_text(json.dumps(no_head_dim))
    with pytest.raises(ModelError, match="head_dim is read from the config"):
        load(tmp_path)
    with pytest.raises(ModelError, match="neither a preset"):
        load(tmp_path / "nowhere")


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_the_engine_matches_transformers_token_for_token(tied, tmp_path):
    folder = random_model(replace(PRESETS["tiny"], tie_word_embeddings=tied), seed=1).save(tmp_path)
    result = oracle.compare(folder, PROMPTS, 10, settings=FORCING)
    m = result.run.metrics
    assert m["chunked_prefill_steps"] > 0 and m["prefix_cache_hits"] > 0 and m["preemptions"] > 0, m
    assert result.ok, result.message
    assert result.run.outputs == result.transformers_tokens
    assert result.max_logit_diff <= oracle.ATOL + oracle.RTOL * 10


def interleaved_qk_norm_rope(q, k, q_norm_weight, k_norm_weight, positions, base, eps=1e-6):
    """ch19.3 with the GPT-J pairing (x[2j], x[2j+1]) instead of Qwen3's half-split (x[j], x[j + d/2])."""
    cos, sin = ch19_rope.rope_cos_sin(torch.as_tensor(positions), q.shape[-1], base)

    def norm(x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w

    def rotate(x):
        x1, x2, c, s = x[..., 0::2], x[..., 1::2], cos[:, None], sin[:, None]
        return torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)

    return rotate(norm(q, q_norm_weight)), rotate(norm(k, k_norm_weight))


def test_a_wrong_rope_is_named_by_its_first_diverging_step_and_layer(tiny_dir):
    parts = engine.reference_parts().replaced(qk_norm_rope=interleaved_qk_norm_rope)
    result = oracle.compare(tiny_dir, PROMPTS[:2], 3, parts=parts, settings=FORCING)
    assert not result.ok
    assert re.search(
        r"first divergence at step 1 \(prefill, request 0, positions 0–7\), decoder layer 0 \(its "
        r"output, the residual stream\): at position [1-7], channel \d+",
        result.message,
    ), result.message


def test_chunked_prefill_prefix_hits_and_preemption_change_no_token():
    model = load("tiny")
    plain = engine.Engine(model, engine.reference_parts()).generate(PROMPTS, 8)
    forced = engine.Engine(model, engine.reference_parts(), FORCING).generate(PROMPTS, 8)
    assert forced.outputs == plain.outputs
    assert plain.metrics["preemptions"] == plain.metrics["chunked_prefill_steps"] == 0
    assert forced.metrics["computed_tokens"] < plain.metrics["computed_tokens"] + forced.metrics["preemptions"] * 20


def test_temperature_samples_with_ch23_and_is_repeatable():
    model = load("tiny")
    run = lambda seed: engine.Engine(model, engine.reference_parts(), Settings(temperature=1.0, seed=seed)).generate(PROMPTS, 12)
    a, b, c = run(0), run(0), run(1)
    assert a.outputs == b.outputs != c.outputs
    assert any(e["fn"] == "sample" and e["chapter"] == "ch23" for e in a.trace)


def test_eos_ends_a_request_and_stays_in_its_output():
    model = load("tiny")
    first = engine.Engine(model, engine.reference_parts()).generate([[50, 51]], 4).outputs[0]
    model.config = replace(model.config, eos_token_id=first[0])
    assert engine.Engine(model, engine.reference_parts()).generate([[50, 51]], 4).outputs == [[first[0]]]


def test_chapters_that_disagree_about_the_batch_are_named():
    parts = engine.reference_parts().replaced(logits_indices=lambda lens: torch.zeros(len(lens), dtype=torch.long))
    with pytest.raises(EngineError, match=r"ch29's prepare_inputs .* and ch28's logits_indices .* disagree"):
        engine.Engine(load("tiny"), parts).generate(PROMPTS[:2], 2)


def test_a_submission_runs_where_its_tasks_pass_and_the_reference_elsewhere(tmp_path):
    for name in ("ch15_token_to_logits.py", "ch20_norms_swiglu.py"):
        shutil.copy(chapters.SOLUTIONS / name, tmp_path)
    shutil.copy(chapters.EXERCISES / "ch19_rope.py", tmp_path)
    parts = engine.student_parts(tmp_path)
    sources = parts.sources()
    assert {k for k, v in sources.items() if v == "yours"} == {
        "ch15.1 embedding_lookup",
        "ch15.2 linear",
        "ch15.3 split_qkv",
        "ch20.2 add_rms_norm",
        "ch20.4 swiglu_mlp",
    }
    assert sources["ch19.3 qk_norm_rope"] == "reference"
    assert "ch19: ch19.1, ch19.2, ch19.3, ch19.4 not passing yet" in parts.notes
    assert any("no ch25_paged_kv.py" in n for n in parts.notes)
    assert parts["linear"].fn.__module__ == "course_student_ch15_token_to_logits"
    model = load("tiny")
    assert (
        engine.Engine(model, parts).generate(PROMPTS, 4).outputs
        == engine.Engine(model, engine.reference_parts()).generate(PROMPTS, 4).outputs
    )


MARK = "import pathlib\ntry:\n    pathlib.Path({path!r}).write_text('ran outside the sandbox')\nexcept OSError:\n    pass\n"
"""A line a chapter file runs at import: it leaves a file where only an unboxed process could write."""


def test_a_submissions_engine_runs_in_the_sandbox_and_only_data_comes_back(tmp_path):
    """`course engine run --submission`: the public checks and the engine itself run in sandboxes; the student's
    functions where their tasks pass (ch15, ch20), the reference's elsewhere; the tokens are the reference run's."""
    from engine.boxed import run_boxed

    require_sandbox()
    marker = tmp_path / "outside.txt"
    sub = tmp_path / "sub"
    sub.mkdir()
    for name in ("ch15_token_to_logits.py", "ch20_norms_swiglu.py"):
        (sub / name).write_text(MARK.format(path=str(marker)) + (chapters.SOLUTIONS / name).read_text())
    shutil.copy(chapters.EXERCISES / "ch19_rope.py", sub)
    model = load("tiny")
    run = run_boxed(
        model=model,
        model_name="tiny",
        seed=0,
        prompts=PROMPTS,
        max_tokens=4,
        settings=FORCING,
        submission=sub,
        sandbox="bwrap",
        memory_limit=2 << 30,
        time_limit=120,
    )
    assert not marker.exists(), "the student's files were imported in the sandbox only"
    assert run.outputs == engine.Engine(model, engine.reference_parts(), FORCING).generate(PROMPTS, 4).outputs
    assert {k for k, v in run.sources.items() if v == "yours"} == {
        "ch15.1 embedding_lookup",
        "ch15.2 linear",
        "ch15.3 split_qkv",
        "ch20.2 add_rms_norm",
        "ch20.4 swiglu_mlp",
    }
    assert run.sources["ch19.3 qk_norm_rope"] == "reference" and run.trace, "the trace comes back for the overview"
    assert run.metrics["preemptions"] > 0 and run.metrics["prefix_cache_hits"] > 0


def test_what_a_sandboxed_engine_sends_back_is_checked_not_believed(tmp_path):
    """A chapter file that rewrites the engine inside the box so that it returns something else: refused here."""
    from engine.boxed import run_boxed

    require_sandbox()
    sub = tmp_path / "sub"
    sub.mkdir()
    forged = (  # the public checks' sandbox has no engine: there the file is an honest one, and its tasks pass
        "try:\n    import engine.core\n    engine.core.Engine.generate = lambda self, *a, **k: None\nexcept ImportError:\n    pass\n"
    )
    (sub / "ch15_token_to_logits.py").write_text(forged + (chapters.SOLUTIONS / "ch15_token_to_logits.py").read_text())
    with pytest.raises(engine.EngineError, match="the engine stopped in the sandbox|not a run"):
        run_boxed(
            model=load("tiny"),
            model_name="tiny",
            seed=0,
            prompts=PROMPTS,
            max_tokens=4,
            settings=FORCING,
            submission=sub,
            sandbox="bwrap",
            memory_limit=2 << 30,
            time_limit=120,
        )


def test_engine_run_refuses_a_submission_without_a_sandbox_unless_told(tmp_path, monkeypatch):
    from grader.isolation import sandbox

    monkeypatch.setattr(sandbox, "probe", lambda kind="bwrap": (_ for _ in ()).throw(sandbox.SandboxUnavailable("no bwrap here")))
    sub = tmp_path / "sub"
    sub.mkdir()
    marker = tmp_path / "outside.txt"
    (sub / "ch15_token_to_logits.py").write_text(
        MARK.format(path=str(marker)) + (chapters.SOLUTIONS / "ch15_token_to_logits.py").read_text()
    )
    (tmp_path / "prompts.json").write_text(json.dumps(PROMPTS))
    runner = CliRunner()
    args = ["engine", "run", "--model", "tiny", "--prompts", str(tmp_path / "prompts.json"), "--max-tokens", "2", "--submission", str(sub)]
    out = runner.invoke(main, [*args, "--figures", str(tmp_path / "figs")])
    assert out.exit_code == 1 and "refusing to run somebody else's code without a sandbox" in out.output, out.output
    assert not marker.exists()
    out = runner.invoke(main, [*args, "--figures", str(tmp_path / "figs"), "--no-sandbox"])
    assert out.exit_code == 0 and "--no-sandbox" in out.output and marker.exists(), "told: it runs, and says so"


@pytest.fixture
def cli(tmp_path, monkeypatch):
    """`course …` in a project folder of its own (tmp_path, with an exercises/), where figures go by default."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "exercises").mkdir()
    monkeypatch.setattr(chapters, "EXERCISES", tmp_path / "exercises")
    (tmp_path / "prompts.json").write_text(json.dumps(PROMPTS))
    runner = CliRunner()
    return lambda *args: runner.invoke(main, list(args), catch_exceptions=False)


def test_engine_run_prints_outputs_and_metrics_as_json(cli, tmp_path):
    out = cli(
        "engine",
        "run",
        "--model",
        "tiny",
        "--prompts",
        "prompts.json",
        "--max-tokens",
        "5",
        "--block-size",
        "4",
        "--num-blocks",
        "9",
        "--max-num-seqs",
        "2",
        "--max-batched-tokens",
        "8",
        "--json",
        "--save-model",
        "tiny",
    )
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout.splitlines()[-1])
    assert len(doc["outputs"]) == len(PROMPTS) and all(len(o) == 5 for o in doc["outputs"])
    m = doc["metrics"]
    for key in ("mean_ttft_ms", "mean_tpot_ms", "output_throughput", "prefix_cache_hits", "chunked_prefill_steps", "preemptions"):
        assert key in m
    assert m["preemptions"] > 0 and m["prefix_cache_hits"] > 0 and m["chunked_prefill_steps"] > 0
    assert set(doc["parts"].values()) == {"reference"}
    assert (tmp_path / "tiny" / "config.json").is_file() and (tmp_path / "tiny" / "model.safetensors").is_file()
    again = json.loads(cli("engine", "run", "--model", "tiny", "--prompts", "prompts.json", "--max-tokens", "5", "--json").output)
    assert again["outputs"] == doc["outputs"]
    assert (tmp_path / "course-figures" / "engine" / "overview.svg").is_file()


def test_engine_run_for_people(cli):
    out = cli("engine", "run", "--model", "tiny", "--prompts", "prompts.json", "--max-tokens", "3")
    assert out.exit_code == 0, out.output
    assert re.search(r"request 4  prompt   9 tokens → \[\d+, \d+, \d+\]", out.output)
    assert "your code: none (every stage ran the reference)" in out.output
    assert re.search(r"TTFT mean [\d.]+ ms · TPOT mean [\d.]+ ms", out.output)
    assert "figure: course-figures/engine/overview.svg" in out.output


@pytest.mark.parametrize(
    "args, code, words",
    [
        (["--prompts", "bad.json"], 2, "must hold a non-empty JSON list"),
        (["--prompts", "prompts.json", "--model", "nowhere"], 1, "neither a preset"),
        (["--prompts", "prompts.json", "--block-size", "1"], 2, "--block-size"),
        (["--prompts", "prompts.json", "--model", "tiny", "--block-size", "4", "--num-blocks", "2"], 1, "can never fit"),
        ([], 2, "or --prompts FILE"),
    ],
)
def test_engine_run_usage_errors(cli, tmp_path, args, code, words):
    (tmp_path / "bad.json").write_text('{"not": "a list"}')
    out = cli("engine", "run", *args)
    assert out.exit_code == code and words in out.output, out.output


def overview_of(parts, settings: Settings = FORCING) -> tuple[dict, ET.Element]:
    model = load("tiny")
    run = engine.Engine(model, parts, settings).generate(PROMPTS, 4)
    record = engine.overview_record(run, model)
    (spec,) = figures.catalog("overview")
    return record, ET.fromstring(spec.render(record))


def test_the_overview_figure_is_drawn_from_a_real_run(tmp_path):
    for name in ("ch15_token_to_logits.py", "ch25_paged_kv.py"):
        shutil.copy(chapters.SOLUTIONS / name, tmp_path)
    record, root = overview_of(engine.student_parts(tmp_path))
    (spec,) = figures.catalog("overview")
    texts: dict[str, list[str]] = {}
    for el in root.iter(f"{SVG}text"):
        texts.setdefault(el.get("class"), []).append(el.text or "")
    assert texts["title"] == [spec.title] and texts["figure-id"] == ["overview"]
    zh, en = spec.captions(record)
    assert "".join(texts["caption-zh"]).replace(" ", "") == zh.replace(" ", "") and "15–32" in zh
    assert " ".join(texts["caption-en"]) == en and texts["legend"]
    assert 720 <= float(root.get("width")) <= 960
    assert [c["id"] for c in record["course"]] == [f"ch{n}" for n in range(15, 33)]
    labels = texts["label"]
    assert [f"ch{n}" for n in range(15, 33)] == [t for t in labels if re.fullmatch(r"ch\d\d", t)][:18]
    status = dict(zip([c["id"] for c in record["course"]], texts["status"]))
    assert status["ch15"] == status["ch25"] == "yours ✓"
    assert status["ch19"] == status["ch16"] == status["ch17"] == "reference", "FORCING chunks: the dense chunk path runs"
    assert status["ch31"] == "not called", "a dense model has no experts to route"
    shapes = texts["shapes"]
    joined = " ".join(shapes)  # a cell's lines, rejoined where the column wrapped them
    assert "q [8, 4, 32] · k [8, 2, 32] at positions" in joined, shapes
    assert "rows [7] of 8" in joined and "→ [1, 100]" in joined
    functions = " ".join(texts["function"])
    for name in (
        "Scheduler",
        "BlockManager",
        "prepare_inputs",
        "varlen_metadata",
        "logits_indices",
        "qk_norm_rope",
        "store_kv",
        "slot_mapping",
        "gqa_attention",
        "swiglu_mlp",
        "latency_metrics",
    ):
        assert name in functions


def test_the_overview_fits_a_slide_and_says_what_ran_at_temperature_0():
    record, root = overview_of(engine.reference_parts())
    assert height(root) <= 2000, "a page: every chapter's stages, in each kind of step"
    assert off_canvas(root, margin=MARGIN - 1) == []
    status = dict(zip([c["id"] for c in record["course"]], [t.s for t in texts(root, cls="status")]))
    assert record["course"][8]["id"] == "ch23" and record["course"][8]["part"] is None, "ch23's sample never ran"
    assert status["ch23"] == "engine's own", "at temperature 0 the engine takes the argmax itself"
    assert status["ch19"] == status["ch16"] == "reference" and status["ch31"] == "not called"
    shown = [t.s for t in texts(root)]
    assert "argmax" in [t.s for t in texts(root, cls="function")] and "ch23" in shown
    assert not [s for s in shown if "ch23.2" in s], "the argmax is not ch23.2 (that is sample)"
    note = " ".join(t.s for t in texts(root, cls="note"))
    assert "random weights, so the tokens mean" in note and "ch23's sample runs only at a temperature above" in note
    # The prefill and the decode column never run into each other; a one-position range is a position.
    shapes = texts(root, cls="shapes")
    assert not [(a.s, b.s) for i, a in enumerate(shapes) for b in shapes[i + 1 :] if overlap(a, b)]
    assert not [s for s in shown if re.search(r"positions (\d+)–\1\b", s)]


def test_the_overview_shows_ch23s_sample_when_the_engine_samples():
    record, root = overview_of(engine.reference_parts(), replace(FORCING, temperature=0.8, seed=3))
    status = dict(zip([c["id"] for c in record["course"]], [t.s for t in texts(root, cls="status")]))
    assert status["ch23"] == "reference"
    assert "sample" in [t.s for t in texts(root, cls="function")] and "ch23.2" in [t.s for t in texts(root)]
    assert "argmax" not in " ".join(t.s for t in texts(root))


# -- in Chinese --------------------------------------------------------------------------------------------------------


@pytest.fixture
def chinese():
    """The run speaks Chinese (as `--lang zh` or COURSE_LANG=zh make it), English again afterwards."""
    from grader.i18n import set_language

    set_language("zh")
    yield
    set_language("en")


def english_words(s: str) -> list[str]:
    """Runs of three English words in a row: a sentence left untranslated (code names and shapes aside)."""
    return re.findall(r"\b[A-Za-z][a-z]+ [a-z]{2,} [a-z]{2,}\b", s)


def test_engine_run_speaks_chinese_from_its_first_line(cli, chinese):
    out = cli("engine", "run", "--model", "tiny", "--prompts", "prompts.json", "--max-tokens", "3", "--lang", "zh")
    assert out.exit_code == 0, out.output
    assert out.output.splitlines()[0] == "引擎 · 预设 'tiny'，随机权重，seed 0", out.output
    qwen = load("qwen3-course")
    assert qwen.source == "qwen3-course（随包附带：用课程的文字训练）" and not qwen.random_weights


def test_an_engine_error_a_student_can_cause_is_in_chinese(chinese):
    tiny = engine.Engine(load("tiny"), engine.reference_parts())
    with pytest.raises(EngineError, match="^没有 prompt：请给出一个由 token id 列表组成的 JSON 列表$"):
        tiny.generate([], 3)
    with pytest.raises(EngineError, match="^max_tokens 必须是正整数；得到的是 0$"):
        tiny.generate([[1, 2, 3]], 0)
    with pytest.raises(EngineError, match=r"^prompt 0 必须是非空的 token id 列表，每个 id 在 \[0, 100\) 之内$"):
        tiny.generate([[1, 100]], 3)


def test_the_overview_speaks_chinese_and_still_fits(chinese):
    record, root = overview_of(engine.reference_parts())
    assert record["model"]["random_weights"]
    note = "".join(t.s for t in texts(root, cls="note")).replace(" ", "")
    assert "词表100（预设'tiny'，随机权重，seed0）" in note and "权重是随机的" in note, note
    shapes = [t.s for t in texts(root, cls="shapes")]
    joined = "".join(shapes).replace(" ", "")
    for detail in ("5个请求：一步步执行，直到全部完成", "调度→执行→更新", "块表[", "追加了token", "V不变", "个K/V头"):
        assert detail in joined, (detail, shapes)
    assert not [s for s in shapes if english_words(s)], [s for s in shapes if english_words(s)]
    assert "speculative" not in joined and "schedule" not in joined
    # Chinese is wider per character: the page still holds every stage, and no two cells run into each other.
    assert height(root) <= 2000 and off_canvas(root, margin=MARGIN - 1) == []
    cells = texts(root, cls="shapes")
    assert not [(a.s, b.s) for i, a in enumerate(cells) for b in cells[i + 1 :] if overlap(a, b)]
    assert not [t.s for t in cells if t.s and t.s[0] in "，。；：、）"], "no line starts with a closing mark"


def test_a_sandboxed_engine_speaks_the_runs_language(tmp_path, chinese):
    """The sandbox holds no catalogs: the engine's words in the run's language go in with the run; its trace and its
    errors come back in Chinese."""
    from engine.boxed import run_boxed

    require_sandbox()
    sub = tmp_path / "sub"
    sub.mkdir()
    shutil.copy(chapters.SOLUTIONS / "ch15_token_to_logits.py", sub)
    box = dict(
        model=load("tiny"),
        model_name="tiny",
        seed=0,
        settings=FORCING,
        submission=sub,
        sandbox="bwrap",
        memory_limit=2 << 30,
        time_limit=120,
    )
    run = run_boxed(prompts=PROMPTS, max_tokens=2, **box)
    details = " ".join(e["shapes"] for e in run.trace)
    assert "5 个请求：一步步执行，直到全部完成" in details and "调度 → 执行 → 更新" in details, details
    assert "ch15：每个任务都通过了" in run.notes, run.notes
    with pytest.raises(EngineError, match=r"(?s)^引擎在沙箱中停止了：.*prompt 0 必须是非空的 token id 列表"):
        run_boxed(prompts=[[1, 100]], max_tokens=2, **box)
