"""The benchmarks of tests/bench/ still build what they measure: each one's inputs are made here, small, and
looked at (nothing is run as a benchmark, nothing is timed). A change of the reference, the CLI or a signature
that would break a benchmark fails here instead of at its next run."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import click
import pytest
import torch
from bench import budget, check, check_all, engine_speed, flash, grade
from mutate import row

from grader import chapters
from grader.cli import main
from grader.delivery.notebook import chapter_notebook


def parsed(args: list[str]) -> click.Context:
    """The context `course ARGS` would run in: the arguments parsed and converted by the CLI, nothing run."""
    command = main.get_command(click.Context(main), args[0])
    assert command is not None, f"course has no command {args[0]!r}"
    return command.make_context(args[0], list(args[1:]))


def solution(ch):
    """A chapter's reference module."""
    return importlib.import_module(f"solutions.{Path(ch.filename).stem}")


def definitions(source: str) -> dict[str, str]:
    """The source of each top-level function and class of a module, by name."""
    tree = ast.parse(source)
    return {n.name: ast.get_source_segment(source, n) or "" for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


# -- budget.py ----------------------------------------------------------------------------------------------------
def test_budget_times_a_real_submission_under_each_kind():
    runs = budget.inputs()
    assert set(runs) == set(budget.KINDS)
    for argv in runs.values():
        ctx = parsed(argv[1:])
        assert ctx.params["submission"] is not None and ctx.params["chapter"].id == "ch17"
        answer = ctx.params["submission"] / ctx.params["chapter"].filename
        assert answer.read_text() == (chapters.SOLUTIONS / answer.name).read_text(), "the reference: every check runs"


# -- check.py -----------------------------------------------------------------------------------------------------
def test_check_times_real_course_check_commands(tmp_path):
    runs = check.commands("course", str(tmp_path))
    assert len(runs) == 2
    contexts = [parsed(cmd[1:]) for _, cmd in runs]
    assert [ctx.params["solutions"] for ctx in contexts] == [True, False], "the reference, then the stubs"
    assert all(ctx.params["chapter"].id == check.CHAPTER.id for ctx in contexts)


def test_checks_round_trips_are_valid_calls_of_the_size_it_says():
    ref = solution(check.CHAPTER)
    sizes = []
    for repetitions, (table, positions, block_size) in check.calls():
        slots = ref.slot_mapping(table, positions, block_size)
        assert repetitions > 0 and slots.shape == (len(positions),) and slots.dtype == torch.int64
        assert len(set(slots.tolist())) == len(positions), "distinct positions take distinct slots"
        sizes.append(len(positions))
    assert max(sizes) == 16384, "the large round trip carries 16384 positions, as its line says"


def test_checks_one_call_check_names_the_parameters_of_the_function_it_calls():
    ref = solution(check.CHAPTER)
    spec, params = check.one_call_check()
    assert spec.task in {t.id for t in check.CHAPTER.tasks} and not spec.hidden
    assert params == {"slot_mapping": tuple(inspect.signature(ref.slot_mapping).parameters)}


# -- check_all.py -------------------------------------------------------------------------------------------------
def test_check_all_times_every_chapter_then_the_whole_course(tmp_path):
    *alone, whole = check_all.commands()
    assert [run[1] for run in alone] == [ch.id for ch in chapters.all_chapters()]
    for run in alone:
        ctx = parsed(run + ["--figures", str(tmp_path)])
        assert ctx.params["solutions"] and ctx.params["chapter"].id == run[1]
    ctx = parsed(whole + ["--figures", str(tmp_path)])
    assert ctx.params["solutions"] and ctx.params["chapter"] == "all"


# -- engine_speed.py ----------------------------------------------------------------------------------------------
def test_engine_speeds_workload_is_issue_25s_mixed_one():
    work = engine_speed.workload(1000)
    lo, hi = engine_speed.PROMPT_LENS
    assert len(work.prompts) == len(work.max_tokens) == 32
    assert all(lo <= len(p) <= hi for p in work.prompts) and len({len(p) for p in work.prompts}) > 16, "mixed lengths"
    assert all(engine_speed.MAX_TOKENS[0] <= n <= engine_speed.MAX_TOKENS[1] for n in work.max_tokens)
    assert all(0 <= t < 1000 for p in work.prompts for t in p)
    shared = {tuple(p[: engine_speed.SHARED_LEN]) for p in work.prompts[:: engine_speed.SHARED_EVERY]}
    assert len(shared) == 1 and all(len(p) > engine_speed.SHARED_LEN for p in work.prompts[:: engine_speed.SHARED_EVERY])
    assert len({tuple(p[:8]) for p in work.prompts}) > 8, "the others do not share it"
    assert engine_speed.workload(1000) == work, "the same workload on every run"
    assert [len(p) for p in engine_speed.workload(151936).prompts] == [len(p) for p in work.prompts], "at every shape"


def test_engine_speed_gives_every_request_its_own_max_tokens_and_times_each_decode_step():
    model = engine_speed.random_model(engine_speed.PRESETS["tiny"], seed=0)
    work = engine_speed.Workload([[1, 2, 3], [4, 5, 6, 7, 8], [9] * 20], [2, 5, 3])
    run = engine_speed.run_engine(model, work)
    assert [len(out) for out in run.outputs] == [2, 5, 3]
    assert run.decode_steps == 4 == len(run.decode), "one prefill step, then decodes until the longest is done"
    assert [rows for _, rows in run.decode] == [3, 2, 1, 1], "a finished request leaves the batch"
    assert run.computed_tokens == 28 + 4 + 3
    config = model.config
    machine = engine_speed.Machine(bandwidth=1e9, peak=1e9)
    weights = engine_speed.decode_weights(config)
    assert engine_speed.decode_bound(config, 1, machine) == max(4 * weights, 2 * weights) / 1e9
    assert engine_speed.decode_bound(config, 32, machine) == 64 * weights / 1e9


@pytest.mark.slow  # importing transformers takes seconds
def test_engine_speeds_generate_runs_the_engines_weights_padded_and_cuts_each_completion():
    pytest.importorskip("transformers")
    model = engine_speed.random_model(engine_speed.PRESETS["tiny"], seed=0)
    hf = engine_speed.hf_twin(model)  # asserts that every weight found its place
    theirs = hf.state_dict()
    for key, value in model.hf_state_dict().items():
        assert torch.equal(theirs[key], value), key
    work = engine_speed.Workload([[1, 2, 3], [4, 5, 6, 7, 8], [9] * 20], [2, 5, 3])
    run = engine_speed.run_generate(hf, work)
    assert [len(out) for out in run.outputs] == [2, 5, 3]
    assert run.decode_steps == 4 == len(run.decode) and {rows for _, rows in run.decode} == {3}, "every row decodes"
    assert run.computed_tokens == 3 * 20 + 3 * 4, "padding included"
    assert run.outputs == engine_speed.run_engine(model, work).outputs


# -- flash.py -----------------------------------------------------------------------------------------------------
def test_flash_compares_two_implementations_of_one_attention():
    q, k, v = flash.inputs(70, 8)
    assert all(x.shape == (70, 8) and x.dtype == torch.float32 for x in (q, k, v))
    assert not torch.equal(q, k), "q, k and v are different draws"
    naive, tiled = flash.attention("naive", 16)(q, k, v), flash.attention("flash", 16)(q, k, v)
    out = lambda r: r[0] if isinstance(r, tuple) else r  # naive_attention returns its intermediates too
    torch.testing.assert_close(out(tiled), out(naive), atol=1e-5, rtol=1e-4)


def test_flashs_default_sizes_reach_past_the_checks_budget():
    """Its point is the memory columns: at the largest default size the [T, T] scores must not fit in what the
    hidden check allows a call, while a tile does."""
    T, d, block = max(flash.SIZES), 64, 64
    spare = flash.budget(T, d) - sum(x.numel() * x.element_size() for x in flash.inputs(T, d))
    assert 4 * T * T > spare > 4 * block * block
    assert flash.SIZES == sorted(flash.SIZES)


# -- grade.py -----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def reference() -> str:
    return (chapters.SOLUTIONS / grade.CH.filename).read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def submissions() -> list[tuple[str, str]]:
    return grade.sources(20)


def test_grades_class_has_the_mix_it_says(submissions):
    kinds = [k for k, _ in submissions]
    assert kinds.count("correct") == 12
    assert sorted(k for k in kinds if k in grade.WRONG) == sorted(2 * list(grade.WRONG))
    assert sorted(k for k in kinds if k in grade.HOSTILE) == sorted(grade.HOSTILE)
    assert len(kinds) == 20


def test_grades_submissions_compile_and_only_the_correct_ones_are_the_reference(submissions, reference):
    for kind, source in submissions:
        compile(source, grade.CH.filename, "exec")
        assert (source == reference) == (kind == "correct"), kind


def test_grades_wrong_submissions_change_only_their_mistakes_task(submissions, reference):
    names = {t.id: set(t.names) for t in grade.CH.tasks}
    ref = definitions(reference)
    for kind in grade.WRONG:
        source = next(s for k, s in submissions if k == kind)
        changed = {name for name, text in definitions(source).items() if text != ref.get(name)}
        assert changed and changed <= set().union(*(names[t] for t in row(grade.CH.id, kind).tasks)), (kind, changed)


def test_grades_hostile_submissions_hang_and_allocate_first_thing_in_their_answer(submissions, reference):
    ref = definitions(reference)
    for kind, (function, statement) in grade.HOSTILE.items():
        source = next(s for k, s in submissions if k == kind)
        mine = definitions(source)
        assert {n for n in mine if mine[n] != ref.get(n)} == {function}
        body = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == function).body
        stmts = [ast.dump(s) for s in body]
        first = stmts.index(ast.dump(ast.parse(statement).body[0]))
        assert not any(isinstance(s, (ast.Return, ast.Raise)) for s in body[:first]), f"{kind}: its statement is reached"
    hang = ast.parse(grade.HOSTILE["hang"][1]).body[0]
    assert isinstance(hang, ast.While) and isinstance(hang.test, ast.Constant) and hang.test.value is True
    assert not any(isinstance(n, ast.Break) for n in ast.walk(hang))
    call = ast.parse(grade.HOSTILE["allocate"][1]).body[0]
    assert isinstance(call, ast.Expr) and isinstance(call.value, ast.Call) and ast.unparse(call.value.func) == "torch.empty"
    assert eval(ast.unparse(call.value.args[0])) * 4 >= 2**40, "terabytes of float32"


def test_grades_notebooks_carry_each_submissions_code_in_its_answer_cells(submissions, reference):
    """A submission's notebook differs from the reference's in the answer cells of the tasks its module changes."""
    notebook = chapter_notebook(grade.CH)  # the source notebook: its answer cells are the reference's
    cell = {"answer_" + t.id.replace(".", "_"): t for t in grade.CH.tasks}
    answers = lambda nb: {gid: "".join(c["source"]).rstrip() for c in nb["cells"] if (gid := c["metadata"]["nbgrader"]["grade_id"]) in cell}
    want = answers(notebook)
    assert set(want) == set(cell), "an answer cell per task"
    assert answers(grade.answered(notebook, reference)) == want
    ref = definitions(reference)
    for kind, code in submissions:
        got = answers(grade.answered(notebook, code))
        changed = {name for name, text in definitions(code).items() if text != ref.get(name)}
        assert {g for g in want if got[g] != want[g]} == {g for g, t in cell.items() if changed & set(t.names)}, kind


def test_grades_commands_parse(tmp_path):
    (tmp_path / "subs").mkdir()
    (tmp_path / "course").mkdir()
    for source in ([str(tmp_path / "subs")], ["--nbgrader", str(tmp_path / "course")]):
        cmd = grade.grade_command(tmp_path, *source, out=tmp_path / "out")
        ctx = parsed(cmd[1:])
        assert ctx.params["time_limit"] == float(grade.TIME_LIMIT) and ctx.params["jobs"] == 2
