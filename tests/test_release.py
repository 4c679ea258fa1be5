"""The student release: installable, free of solutions and hidden checks, and its public
checks (replayed from recorded answers) grade and explain exactly as the repository's do."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import require_sandbox
from releaselike import as_in_a_release

import figures
from grader import chapters
from grader.authoring import reference
from grader.delivery.release import build, record_answers
from grader.delivery.stubs import BEGIN, END
from grader.run import check

pytestmark = pytest.mark.slow  # grades submissions, builds releases or runs real tools: not in the fast loop

CHAPTERS = chapters.all_chapters()
FIGURES = sum(len(figures.catalog(ch.id)) for ch in CHAPTERS) + 1  # and the overview
IDS = [ch.id for ch in CHAPTERS]
NAME_ONLY = re.compile(r'"[a-z0-9_]+",?')  # a line holding only a name: a mistake's id, which results and the release carry
DISTINCTIVE = 20  # characters: shorter lines (`return out`, `B, V = x.shape`) are common idiom, not a leak
IDIOMS = {  # longer lines a solution shares with the checks because anyone writes them so: no answer in them
    "if top_k is not None:",
    "if top_p is not None:",
    "if residual is None:",
    "if got.names != want.names:",
    "if off_got != off_want:",
    "if got.itemsize != want.itemsize:",
    "B, H, T, d = x.shape",
    "(T, d), S = q.shape, k.shape[0]",
    'H, V = config["hidden_size"], config["vocab_size"]',
    "for rid, n in plan.items():",
}


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    return build(tmp_path_factory.mktemp("release"), nbgrader=False)


def shipped_files() -> list[Path]:
    """Every Python file that ships on purpose: stubs, the public grader (lab included), figures, the engine."""
    return [p for d in ("exercises", "grader", "figures", "engine") for p in (chapters.ROOT / d).rglob("*.py") if "hidden" not in p.parts]


def public_text() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in shipped_files())


def solution_lines() -> list[str]:
    """Distinctive lines of every solution region that are not provided code (the stubs hold the solution
    files' other lines, so those ship anyway), idioms left out."""
    provided = "\n".join(p.read_text(encoding="utf-8") for p in chapters.EXERCISES.glob("ch*.py"))
    lines = []
    for path in chapters.SOLUTIONS.glob("ch*.py"):
        inside = False
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip() in (BEGIN, END):
                inside = line.strip() == BEGIN
            elif inside:
                lines.append(line.strip())
    return sorted({s for s in lines if len(s) >= DISTINCTIVE and not s.startswith("#") and s not in provided and s not in IDIOMS})


def test_no_solution_line_in_a_shipped_module():
    """A solution region's code must not reappear in shipped code (a check's model of the answer, say), unless
    it is provided code anyway."""
    secrets = solution_lines()
    assert len(secrets) > 100, "the scan has something to look for"
    found = [
        (str(p.relative_to(chapters.ROOT)), n, line.strip())
        for p in shipped_files()
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if any(s in line for s in secrets)
    ]
    assert not found, found[:10]


def secret_lines() -> list[str]:
    """Distinctive lines of every solution region (unless provided code) and of every hidden check (not found in
    public code: the hidden checks call the public helpers)."""
    public = public_text()
    hidden = []
    for path in (chapters.ROOT / "grader" / "hidden").glob("ch*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        hidden += [
            ast.get_source_segment(path.read_text(encoding="utf-8"), n).splitlines()[0].strip()
            for n in ast.walk(tree)
            if isinstance(n, ast.FunctionDef)
        ]
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
        if path.stem.endswith("_mistakes"):  # a mistake's message is public (the release records it, its catalog
            lines = [s for s in lines if not re.fullmatch(r'f?"[^"]*",?\)?', s)]  # translates it); its edits are not
        hidden += lines
    hidden = [s for s in hidden if len(s) >= DISTINCTIVE and not s.startswith("#") and s not in public and not NAME_ONLY.fullmatch(s)]
    return sorted(set(solution_lines()) | set(hidden))


def test_the_release_carries_no_solution_and_no_hidden_check(release):
    secrets = secret_lines()
    assert len(secrets) > 100, "the scan has something to look for"
    files = [p for p in release.student.rglob("*") if p.is_file()]
    assert not [p for p in files if "solutions" in p.parts or "hidden" in p.parts or "tests" in p.parts]
    texts = {p: p.read_text(encoding="utf-8", errors="replace") for p in files}  # each read once (the model is MBs)
    leaks = [(p.name, s) for p, text in texts.items() for s in secrets if s in text]
    assert not leaks, leaks[:5]


def test_the_release_is_an_installable_package(release, tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(release.student)],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("course-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {f"grader/answers/{cid}.json" for cid in IDS} <= set(names)
    assert {f"exercises/{ch.filename}" for ch in CHAPTERS} <= set(names)
    assert not [n for n in names if n.startswith(("solutions/", "grader/hidden/", "tests/"))]
    assert {"engine/core.py", "engine/oracle.py", "figures/overview.py"} <= set(names)
    fonts = {
        f"figures/fonts/{p.name}" for p in (chapters.ROOT / "figures" / "fonts").iterdir() if p.suffix == ".woff2" or p.name == "OFL.txt"
    }
    assert fonts and fonts <= set(names), "a non-editable install of the release draws its figures with the fonts"
    readme = (release.student / "README.md").read_text()
    assert len(re.findall(r"```\n(python3 -m venv .*pip install .*)\n```", readme)) == 1


def test_check_in_the_release_runs_public_checks_and_counts_hidden_ones(release):
    env = dict(os.environ, PYTHONPATH=str(release.student))
    out = subprocess.run(
        [sys.executable, "-m", "grader.cli", "check", "ch25"], cwd=release.student, env=env, capture_output=True, text=True
    )
    assert out.returncode == 1, out.stderr
    hidden = sum(1 for s in __import__("grader.checks", fromlist=["load"]).load("ch25", with_hidden=True) if s.hidden)
    assert f"{hidden} hidden checks run at grading time" in out.stdout
    assert "not implemented yet (ch25.1" in out.stdout
    for ch in CHAPTERS:
        exercise = release.student / "exercises" / ch.filename
        stub = exercise.read_text()
        exercise.write_text((chapters.SOLUTIONS / ch.filename).read_text())
        try:
            out = subprocess.run(
                [sys.executable, "-m", "grader.cli", "check", ch.id, "--json"], cwd=release.student, env=env, capture_output=True, text=True
            )
        finally:  # the release is shared by the module's tests: the others expect the stubs
            exercise.write_text(stub)
        doc = __import__("json").loads(out.stdout)
        assert doc["score"] == doc["max_score"] > 0 and doc["hidden_not_run"] > 0, ch.id
        assert all(Path(release.student, f).is_file() for f in doc["figures"]) and doc["figures"], ch.id


def test_the_whole_course_and_its_figure_book_in_the_release_come_from_the_students_code(release, tmp_path):
    """`course check all` and `course figures` in a release: the student's own exercises/, stubs at first (every
    figure a placeholder naming its task), then two chapters answered (their figures drawn from that code)."""
    student = tmp_path / "student"
    shutil.copytree(release.student, student)
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | {"PYTHONPATH": str(student)}  # not a terminal: unwrapped
    run = lambda *args: subprocess.run([sys.executable, "-m", "grader.cli", *args], cwd=student, env=env, capture_output=True, text=True)
    out = run("check", "all", "--jobs", "2")
    assert out.returncode == 1, out.stderr
    assert all(re.search(rf"^  ✗ {ch.id} ", out.stdout, re.M) for ch in CHAPTERS), out.stdout
    assert re.search(r"^score 0/\d+ · 18 chapters in .* hidden checks run at grading time$", out.stdout, re.M)
    book = run("figures", "--out", str(tmp_path / "book"))
    assert book.returncode == 0 and f"0 of {FIGURES} figures drawn from your exercises/" in book.stdout, book.stdout + book.stderr
    page = (tmp_path / "book" / "index.html").read_text(encoding="utf-8")
    assert page.count("not drawn yet") == FIGURES and "ch25.1" in (tmp_path / "book" / "ch25-dim-slot-mapping.svg").read_text()
    for cid in ("ch17", "ch25"):
        ch = chapters.find(cid)
        (student / "exercises" / ch.filename).write_text((chapters.SOLUTIONS / ch.filename).read_text())
    book = run("figures", "--out", str(tmp_path / "book"))
    drawn = len(figures.catalog("ch17")) + len(figures.catalog("ch25"))
    assert f"{drawn} of {FIGURES} figures drawn from your exercises/" in book.stdout, book.stdout + book.stderr
    svg = (tmp_path / "book" / "ch17-causal-mask.svg").read_text(encoding="utf-8")
    assert "not drawn yet" not in svg and "ch17-causal-mask" in svg


def test_the_release_speaks_to_students(release):
    """Its --help lists no instructor command or option, and `course list` shows the hidden points it recorded."""
    from grader.cli import INSTRUCTOR_COMMANDS

    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | {"PYTHONPATH": str(release.student)}  # not a terminal
    run = lambda *args: subprocess.run(
        [sys.executable, "-m", "grader.cli", *args], cwd=release.student, env=env, capture_output=True, text=True
    )
    top = run("--help")
    assert top.returncode == 0, top.stderr
    commands = set(re.findall(r"^  (\w+)  ", top.stdout.split("Commands:")[1], re.M))
    assert {"check", "list", "lab", "engine"} <= commands and not commands & set(INSTRUCTOR_COMMANDS)
    shown = run("check", "--help").stdout
    assert "--task" in shown and "--submission" in shown
    assert not re.search(r"--solutions|--hidden|--no-hidden|--seed", shown), shown
    refused = run("check", "ch25", "--solutions")
    assert refused.returncode == 2 and "No such option '--solutions'" in refused.stderr
    listed = run("list").stdout
    for ch in CHAPTERS:
        specs = __import__("grader.checks", fromlist=["load"]).load(ch.id, with_hidden=True)
        public, hidden = (sum(s.points for s in specs if s.hidden == h) for h in (False, True))
        assert re.search(rf"^{ch.id} .*  {public:g} \+ {hidden:g} hidden  ", listed, re.M), ch.id


def test_the_engine_in_the_release_runs_the_students_own_code_only(release, tmp_path):
    from engine.parts import USED

    require_sandbox()  # --submission: somebody else's code, boxed

    env = dict(os.environ, PYTHONPATH=str(release.student))
    (tmp_path / "prompts.json").write_text("[[1, 2, 3, 4, 5], [1, 2, 3, 9]]")
    stubs, mine = tmp_path / "stubs", tmp_path / "mine"
    stubs.mkdir()
    mine.mkdir()
    shutil.copy(chapters.EXERCISES / "ch15_token_to_logits.py", stubs)
    for chapter_id in dict.fromkeys(ch for ch, _ in USED):
        shutil.copy(chapters.SOLUTIONS / chapters.find(chapter_id).filename, mine)

    def run(folder: Path) -> subprocess.CompletedProcess:
        command = [
            "engine",
            "run",
            "--model",
            "tiny",
            "--prompts",
            str(tmp_path / "prompts.json"),
            "--max-tokens",
            "3",
            "--submission",
            str(folder),
            "--json",
            "--figures",
            str(tmp_path),
        ]
        return subprocess.run([sys.executable, "-m", "grader.cli", *command], cwd=release.student, env=env, capture_output=True, text=True)

    out = run(stubs)
    missing = "do not pass their public checks yet:\n  ch15: ch15.1 embedding_lookup, ch15.2 linear, ch15.3 split_qkv\n  ch16: "
    assert out.returncode == 1 and missing in out.stderr, out.stderr  # a line per chapter
    out = run(mine)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert set(doc["parts"].values()) == {"yours"} and len(doc["outputs"]) == 2
    assert (tmp_path / "engine" / "overview.svg").is_file()


# -- replayed answers explain wrong answers as well as the reference does ----------------------------

PERTURB = '''

def _perturbed(value, args):
    """The reference's answer with its first number changed (or, for in-place functions, the first output)."""
    import torch
    def first(x):
        if isinstance(x, torch.Tensor) and x.numel():
            y = x.clone().reshape(-1)
            y[0] = ~y[0] if y.dtype == torch.bool else y[0] + 1
            return y.reshape(x.shape)
        if type(x) in (int, float):
            return x + 1
        import numpy as np
        if isinstance(x, np.ndarray) and x.size:
            y = x.copy()
            field = y[y.dtype.names[0]] if y.dtype.names else y
            field.flat[0] = ~field.flat[0] if field.dtype == bool else field.flat[0] + 1
            return y
        if isinstance(x, str):
            return x + "?"
        if isinstance(x, (list, tuple)) and x:
            return type(x)([first(x[0]), *x[1:]])
        if isinstance(x, dict) and x:
            k = next(iter(x))
            return {**x, k: first(x[k])}
        return x
    if value is None:
        for a in args:
            if isinstance(a, torch.Tensor) and a.numel():
                a.reshape(-1)[0] += 1
                break
        return None
    return first(value)
'''


def perturbed_submission(ch, folder: Path) -> Path:
    """The reference with every graded function's answer nudged: a generic wrong student."""
    source = (chapters.SOLUTIONS / ch.filename).read_text(encoding="utf-8")
    wrappers = ""
    for task in ch.tasks:
        for name in task.names:
            source = re.sub(rf"^def {name}\(", f"def _ref_{name}(", source, flags=re.M)
            wrappers += f"\n\ndef {name}(*args, **kwargs):\n    return _perturbed(_ref_{name}(*args, **kwargs), args)\n"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ch.filename).write_text(source + PERTURB + wrappers, encoding="utf-8")
    return folder


@pytest.mark.parametrize("ch", CHAPTERS, ids=IDS)
def test_replayed_answers_grade_and_explain_like_the_reference(ch, tmp_path):
    answers = record_answers(ch)
    replay = reference.factory(None, answers)
    with as_in_a_release():  # what the hidden side computes must come from the recording there
        solved = check(ch.id, solutions=True, hidden=False, figures_dir=None, refs=replay)
    assert [r.status for r in solved.results] == ["passed"] * len(solved.results), [
        (r.name, r.message) for r in solved.results if r.status != "passed"
    ]
    wrong = perturbed_submission(ch, tmp_path)
    here = check(ch.id, submission=wrong, hidden=False, figures_dir=None)
    with as_in_a_release():
        there = check(ch.id, submission=wrong, hidden=False, figures_dir=None, refs=replay)
    assert any(r.status != "passed" for r in here.results), "the perturbation makes answers wrong"
    for a, b in zip(here.results, there.results):
        assert (b.name, b.status, b.message) == (a.name, a.status, a.message), (
            f"{ch.id} {a.task} {a.name}: in a release, explanations may only use reference answers computed "
            "before the comparison (the release replays t.ref)"
        )
