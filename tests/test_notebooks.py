"""Chapter notebooks as a student runs them, and as the graders read them.

- Every chapter's source notebook and release notebook (nbgrader's own ClearSolutions and
  ClearHiddenTests applied, as `generate_assignment` does) runs top to bottom with no error in a
  locked cell: fast, in one IPython shell per notebook without its test cells; in full, in a kernel
  through nbclient with its test cells, marked slow (`pytest -m slow tests/test_notebooks.py`).
- Per-cell grading: one answer cell that does not parse costs only its own task, a scratch line that
  raises costs nothing, and `course check --notebook` gives each task what the notebook's own test
  cells give it (their `grade_cells`, driven here without a kernel from the cells a kernel would have
  run by then).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

from grader import chapters, checks
from grader.delivery.cells import CompilerLimit, assemble
from grader.delivery.notebook import WIDTH, chapter_notebook, grade_cells

CODE_STUB = "# YOUR CODE HERE\nraise NotImplementedError()"
"""nbgrader's stub for a solution region, as `write_course` configures it."""


def gid(cell) -> str:
    return cell["metadata"].get("nbgrader", {}).get("grade_id", "")


def release(nb: dict) -> dict:
    """The student's notebook nbgrader makes of a source notebook (its solutions and hidden tests cleared)."""
    from nbgrader.preprocessors import ClearHiddenTests, ClearSolutions

    node = nbformat.from_dict(json.loads(json.dumps(nb)))
    node, _ = ClearSolutions(code_stub={"python": CODE_STUB}).preprocess(node, {})
    node, _ = ClearHiddenTests().preprocess(node, {})
    return json.loads(nbformat.writes(node))


def src(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


# -- every notebook runs top to bottom ---------------------------------------------------------------
SHELL = textwrap.dedent('''
    """Run the code cells of each notebook given (but its test cells) in a fresh IPython shell, as a
    kernel would; print per notebook its errors [grade_id, error] and the names it defined."""
    import contextlib, io, json, sys
    from IPython.core.interactiveshell import InteractiveShell

    report = {}
    for path in sys.argv[1:]:
        nb = json.load(open(path))
        InteractiveShell.clear_instance()
        shell = InteractiveShell.instance()
        errors = []
        for cell in nb["cells"]:
            grade_id = cell["metadata"].get("nbgrader", {}).get("grade_id", "")
            if cell["cell_type"] != "code" or grade_id.startswith(("public_", "hidden_")):
                continue
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                result = shell.run_cell("".join(cell["source"]), store_history=True)
            error = result.error_before_exec or result.error_in_exec
            if error is not None:
                errors.append([grade_id, f"{type(error).__name__}: {error}"])
        report[path] = {"errors": errors, "names": sorted(shell.user_ns)}
    print(json.dumps(report))
''')


def notebooks(folder: Path) -> dict[str, tuple[str, dict]]:
    """path -> (chapter id, notebook): every chapter's source notebook and release notebook, written."""
    out = {}
    for ch in chapters.all_chapters():
        source = chapter_notebook(ch)
        for kind, nb in (("source", source), ("release", release(source))):
            path = folder / f"{ch.id}-{kind}.ipynb"
            path.write_text(json.dumps(nb))
            out[str(path)] = (ch.id, nb)
    return out


def top_level_names(ch) -> set[str]:
    """The names the chapter's stub module defines at its top level (what a notebook must define too)."""
    import ast

    tree = ast.parse((chapters.EXERCISES / ch.filename).read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


@pytest.mark.slow
def test_every_notebook_runs_top_to_bottom_without_its_test_cells(tmp_path):
    """The locked cells (setup, provided) of every source and release notebook run with no error, and the
    notebook ends up defining every top-level name of the chapter module (`replay`, `ScriptRunner`…)."""
    written = notebooks(tmp_path)
    out = subprocess.run(
        [sys.executable, "-c", SHELL, *written],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.splitlines()[-1])
    assert len(report) == 2 * len(chapters.all_chapters())
    for path, (cid, nb) in written.items():
        errors, names = report[path]["errors"], set(report[path]["names"])
        assert not errors, (Path(path).name, errors)  # answer cells too: a solution or a stub defines, never fails
        missing = top_level_names(chapters.find(cid)) - names
        assert not missing, (Path(path).name, sorted(missing))


def test_setup_cells_keep_the_module_layout():
    """The setup cell is the module's own text: its imports exactly as the module writes them (one per
    line, no blank line added between two), and no `%xmode` anywhere."""
    import ast

    for ch in chapters.all_chapters():
        nb = chapter_notebook(ch)
        (setup,) = [c for c in nb["cells"] if gid(c) == "setup"]
        source = (chapters.SOLUTIONS / ch.filename).read_text(encoding="utf-8")
        body = ast.parse(source).body[1:]
        leading = []
        for node in body:
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                break
            leading.append(node)
        assert leading, ch.id
        block = "\n".join(source.splitlines()[leading[0].lineno - 1 : leading[-1].end_lineno])
        assert (src(setup) + "\n").startswith(block + "\n"), (ch.id, src(setup)[:300])
        assert "%xmode" not in json.dumps(nb), ch.id


@pytest.mark.slow
@pytest.mark.kernel
@pytest.mark.parametrize("cid", [c.id for c in chapters.all_chapters()])
def test_every_notebook_runs_in_a_kernel(cid, tmp_path):
    """nbclient runs the source and the release notebook, test cells included: no error in a cell that is
    neither an answer nor a test cell; each public test cell prints its report once, as one output, and
    gives the task's public points for the source, 0 for the release; nothing says "Exception reporting
    mode"."""
    from nbclient import NotebookClient

    ch = chapters.find(cid)
    specs = checks.load(cid, with_hidden=False)
    env_path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    source = chapter_notebook(ch)
    for kind, nb in (("source", source), ("release", release(source))):
        node = nbformat.reads(json.dumps(nb), as_version=4)  # sources as strings, as nbclient wants
        NotebookClient(
            node, timeout=600, kernel_name="python3", allow_errors=True, resources={"metadata": {"path": str(tmp_path)}}
        ).execute(env=dict(os.environ, PATH=env_path))
        for cell in node.cells:
            if cell.cell_type != "code":
                continue
            errors = [o for o in cell.outputs if o.output_type == "error"]
            if not gid(cell).startswith(("answer_", "public_", "hidden_")):
                assert not errors, (kind, gid(cell), [(o.ename, o.evalue) for o in errors])
            text = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
            assert "Exception reporting mode" not in text
            if gid(cell).startswith("public_"):
                task = gid(cell).removeprefix("public_").replace("_", ".")
                streams = [o for o in cell.outputs if o.output_type == "stream"]
                assert len(streams) == 1 and not errors, (kind, gid(cell), cell.outputs)
                value = [o for o in cell.outputs if o.output_type == "execute_result"]
                want = sum(s.points for s in specs if s.task == task) if kind == "source" else 0.0
                assert float(value[0]["data"]["text/plain"]) == want, (kind, task, text)
                for output in cell.outputs:
                    if output.output_type == "display_data":
                        assert 'alt="' in output.data["text/html"] and "image/svg+xml" in output.data


# -- per-cell grading -----------------------------------------------------------------------------------
PER_CELL = ("ch17", "ch25")


def answer(nb: dict, task_id: str) -> dict:
    (found,) = [c for c in nb["cells"] if gid(c) == f"answer_{task_id.replace('.', '_')}"]
    return found


def broken_line(cell: dict) -> int:
    """Break the cell's first line of code after `### BEGIN SOLUTION` (an unmatched parenthesis); its line."""
    lines = src(cell).split("\n")
    n = next(i for i, line in enumerate(lines) if "BEGIN SOLUTION" in line) + 1
    lines[n] += " )("
    cell["source"] = "\n".join(lines)
    return n + 1


def variants(ch) -> dict[str, tuple[dict, set[str], dict]]:
    """name -> (notebook, the tasks it answers right, facts): the release; its first task answered from
    the source with a scratch line that raises on top; the source with a syntax error in its second
    task's cell (and only there); the source."""
    source = chapter_notebook(ch)
    stub = release(source)
    first, second = ch.tasks[0], ch.tasks[1]
    partial = json.loads(json.dumps(stub))
    scratch = f"demo = {first.names[0]}()"  # a TypeError: every task function takes arguments
    answer(partial, first.id)["source"] = scratch + "\n" + src(answer(source, first.id))
    broken = json.loads(json.dumps(source))
    line = broken_line(answer(broken, second.id))
    every = {t.id for t in ch.tasks}
    return {
        "stub": (stub, set(), {}),
        "partial": (partial, {first.id}, {"scratch": scratch}),
        "broken": (broken, every - {second.id}, {"line": line, "task": second.id}),
        "source": (source, every, {}),
    }


def kernel_history(nb: dict, task_id: str) -> tuple[list[str], list[str]]:
    """The cells a kernel has run when the task's public test cell runs (top to bottom), with their names."""
    cells = []
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            cells.append(src(cell))
            if gid(cell) == f"public_{task_id.replace('.', '_')}":
                break
    return cells, [f"In [{n}]" for n in range(1, len(cells) + 1)]


def public_points(cid: str, task: str) -> float:
    return sum(s.points for s in checks.load(cid, with_hidden=False) if s.task == task)


@pytest.mark.parametrize("cid", PER_CELL)
def test_course_check_and_the_test_cells_grade_each_task_alike(cid, tmp_path, warm_students):
    """Stub, partial (with a scratch line that raises), broken (one cell does not parse) and correct
    notebooks: `course check --notebook` and the test cells give every task its public points if and only
    if it is answered right; the broken cell's task says which cell and which line of it."""
    from click.testing import CliRunner

    from grader.cli import main

    ch = chapters.find(cid)
    for name, (nb, right, facts) in variants(ch).items():
        path = tmp_path / f"{name}.ipynb"
        path.write_text(json.dumps(nb))
        out = CliRunner().invoke(
            main, ["check", cid, "--notebook", str(path), "--json", "--no-hidden", "--no-sandbox", "--figures", str(tmp_path / "figs")]
        )
        doc = json.loads(out.stdout[out.stdout.index("{") :])
        want = {t.id: public_points(cid, t.id) if t.id in right else 0.0 for t in ch.tasks}
        by_check = {t.id: sum(r["score"] for r in doc["tests"] if r["number"] == t.id) for t in ch.tasks}
        cells = {}
        for t in ch.tasks:
            history, where = kernel_history(nb, t.id)
            graded = grade_cells(cid, t.id, history, where=where, launcher=warm_students.start)
            cells[t.id] = graded.score
            assert all(len(line) <= WIDTH or " " not in line.strip() for line in graded.text.splitlines())
        assert by_check == want == cells, (name, by_check, cells)
        said = "\n".join(r["output"] for r in doc["tests"])
        if name == "broken":
            task = facts["task"]
            mine = "\n".join(r["output"] for r in doc["tests"] if r["number"] == task)
            assert f"answer cell {task} does not parse" in mine
            assert f"(answer cell {task}, line {facts['line']})" in mine
            assert "does not parse" not in said.replace(mine, "")
            history, where = kernel_history(nb, task)
            text = grade_cells(cid, task, history, where=where, launcher=warm_students.start).text
            assert f"(answer cell {task}, line {facts['line']})" in text
        if name == "partial":
            assert f"answer cell {ch.tasks[0].id}, line 1: `{facts['scratch']}` raised TypeError" in said


def test_a_traceback_names_the_answer_cell_and_its_line(warm_students):
    """An exception in the student's function points at the cell and the line in it, not at the module."""
    ch = chapters.find("ch17")
    code = "import torch\n\n\ndef causal_mask(num_tokens):\n    rows = [][num_tokens]\n    return rows\n"
    graded = grade_cells("ch17", "ch17.1", ["import torch", code], launcher=warm_students.start)
    assert graded.score == 0
    assert "at answer cell ch17.1, line 5 in causal_mask: rows = [][num_tokens]" in graded.text, graded.text
    assert ch.filename not in graded.text


def test_assemble_keeps_definitions_and_names_every_cell():
    """What the assembled module holds (compiled only, nothing run): each cell as a literal under its label,
    scratch statements left out, duplicate answer cells told apart, magics and unparsable cells survived."""
    import ast

    ch = chapters.find("ch17")
    good = "def causal_mask(num_tokens):\n    return None\n"
    deep = "y = " + " + ".join(["1"] * 100_000)
    cells = ["%xmode Minimal\nimport math", good, "print(causal_mask(3))\nx = 1", good, "def causal_mask(:\n", "x = 1\0", deep]
    module = assemble(ch, cells)
    compile(module, ch.filename, "exec", dont_inherit=True)
    tree = ast.parse(module)
    (labels,) = [
        ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "__course_cells__"
    ]
    assert labels == (
        "code cell 1",
        "answer cell ch17.1 (code cell 2)",
        "code cell 3",
        "answer cell ch17.1 (code cell 4)",
        "answer cell ch17.1 (code cell 5)",
        "code cell 6",
        "code cell 7",
    )
    run = [n for n in tree.body if isinstance(n, ast.Expr)][-1]
    units = ast.literal_eval(run.value.args[1])
    first, _, scratch, _, bad, nul, nested = units
    assert first[1].splitlines()[0] == "" and first[2] == (0,)  # the magic blanked, the import kept
    assert scratch[2] == (1,) and scratch[3] == ()  # the print left out, the assignment kept
    assert bad[4] is not None and bad[3] == ("causal_mask",) and bad[4][1] == 1
    assert nul[4] is not None and "NUL" in nul[4][0]
    assert "nested too deeply" in nested[4][0]
    with pytest.raises(CompilerLimit, match="code cell 7: an expression is nested too deeply"):
        assemble(ch, cells, strict=True)  # what `course grade` uses: such a notebook is refused, as such a .py


def test_a_statement_that_raises_costs_only_what_it_defines(warm_students):
    """An import that fails is left out (the rest of its cell is graded); a definition that raises leaves its
    task function undefined, and that task's checks say which cell, which line and why."""
    ch = chapters.find("ch17")
    source = chapter_notebook(ch)
    right = "import not_a_module_of_this_course\n" + src(answer(source, "ch17.1"))
    raising = "@(lambda f: 1 / 0)\n" + src(answer(source, "ch17.2"))
    cells = ["import torch", right, raising]
    first = grade_cells("ch17", "ch17.1", cells, launcher=warm_students.start)
    second = grade_cells("ch17", "ch17.2", cells, launcher=warm_students.start)
    assert first.score == public_points("ch17", "ch17.1") and second.score == 0
    said = " ".join(second.text.split())
    assert (
        "answer cell ch17.2, line 2: `def causal_mask_with_offset(num_new: int, num_cached: int) -> torch.Tensor:` "
        "raised ZeroDivisionError: division by zero, so causal_mask_with_offset was never defined"
    ) in said, said
