"""`course release`: the student release and the nbgrader course, built from this repository.

The student release is an installable copy of the package without `solutions/`,
without `grader/hidden/` and without `tests/`: the stubs, the grader's public
part, the figures, the engine (`course engine run`, which there runs the student's
own chapter functions only), and `grader/answers/chNN.json` (the reference's answers
to the public checks and to the lab's starting instances, recorded here, plus how many
hidden checks each task has).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tomllib
from dataclasses import dataclass
from pathlib import Path

from grader import chapters, checks
from grader.chapters import Chapter
from grader.i18n import choose, docstrings, tr

MARKER = ".course-release"
CHAPTER_FILE = re.compile(r"^(ch\d{2})(_\w+)?\.py$")
PUBLIC_PACKAGES = ("grader", "figures", "exercises", "engine")
LEFT_OUT = ("hidden", "answers", "__pycache__")


class ReleaseError(RuntimeError):
    """The release cannot be built (no solutions here, a reference that fails, a foreign folder)."""


@dataclass
class Release:
    """What `build` wrote."""

    student: Path
    nbgrader: Path | None
    chapters: list[str]

    def size(self, path: Path) -> int:
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def build(out: Path, *, chapter_list: list[Chapter] | None = None, nbgrader: bool = True, lang: str | None = None) -> Release:
    """Write `out/student/` (and `out/nbgrader/`) for every chapter, or the given ones, in `lang` (by default
    `COURSE_LANG`, else the course's language, Chinese): its docstrings, notebooks and README in it, and `lang` recorded as the
    course's setting in both (`grader.i18n.choose`)."""
    if not chapters.has_solutions():
        raise ReleaseError("this installation has no solutions/: a release is built from the instructor's repository")
    before = os.environ.get(choose.ENV)
    lang = choose.set_language(lang) if lang else choose.for_grading()
    try:
        chosen = sorted(chapter_list or chapters.all_chapters(), key=lambda ch: ch.id)
        student = _fresh(Path(out) / "student")
        write_student(student, chosen, lang)
        course = None
        if nbgrader:
            from grader.delivery.notebook import write_course

            course = _fresh(Path(out) / "nbgrader")
            write_course(course, chosen)
            choose.write_setting(course, lang)
    finally:
        choose.set_language(before)  # this process speaks what it spoke before
    return Release(student, course, [ch.id for ch in chosen])


def _fresh(path: Path) -> Path:
    """An empty folder at `path`; a previous release there is replaced, anything else refused."""
    if path.exists():
        if not (path / MARKER).is_file():
            raise ReleaseError(f"{path} exists and is not a course release; choose another --out")
        shutil.rmtree(path)
    path.mkdir(parents=True)
    (path / MARKER).write_text("written by `course release`; replaced by the next one\n")
    return path


def write_student(dest: Path, chosen: list[Chapter], lang: str = choose.COURSE_LANGUAGE) -> None:
    ids = {ch.id for ch in chosen}
    for package in PUBLIC_PACKAGES:
        _copy_package(chapters.ROOT / package, dest / package, ids, lang)
    answers = dest / chapters.ANSWERS.relative_to(chapters.ROOT)
    answers.mkdir()
    choose.write_setting(answers, lang)
    lab = record_lab(chosen)
    for ch in chosen:
        record = {**record_answers(ch), "lab": lab.get(ch.id, {})}
        (answers / f"{ch.id}.json").write_text(json.dumps(record, separators=(",", ":")), encoding="utf-8")
    (dest / "pyproject.toml").write_text(_pyproject(), encoding="utf-8")
    (dest / "README.md").write_text(_readme(chosen), encoding="utf-8")


def _package_data(package: str) -> list[str]:
    """The package's data files (patterns relative to it), as pyproject.toml declares them."""
    tool = tomllib.loads((chapters.ROOT / "pyproject.toml").read_text(encoding="utf-8")).get("tool", {})
    return list(tool.get("setuptools", {}).get("package-data", {}).get(package, []))


def _copy_package(src: Path, dest: Path, ids: set[str], lang: str) -> None:
    """Copy a package's Python files and declared data files, leaving out hidden checks, recorded answers
    and other chapters; the exercises' docstrings in `lang`."""
    data = [p for pattern in _package_data(src.name) for p in src.glob(pattern) if p.is_file()]
    for path in sorted(src.rglob("*.py")) + sorted(data):
        rel = path.relative_to(src)
        chapter = CHAPTER_FILE.match(path.name)
        if any(part in LEFT_OUT for part in rel.parts) or (chapter and chapter.group(1) not in ids):
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if chapter and src.name == "exercises":
            target.write_text(exercise_in(path, chapter.group(1), lang), encoding="utf-8")
        else:
            shutil.copy2(path, target)


def exercise_in(path: Path, chapter_id: str, lang: str) -> str:
    """A chapter's exercise file in `lang`: the stub of its solution with the docstrings and the TODO comments
    translated (the code, and the stub's exception text the grader reads, as they are)."""
    from grader.delivery.stubs import make_stub

    solution = chapters.SOLUTIONS / path.name
    if not solution.is_file():
        return docstrings.translate_source(path.read_text(encoding="utf-8"), path.stem, lang)
    before = os.environ.get(choose.ENV)
    choose.set_language(lang)
    try:
        return make_stub(docstrings.translate_source(solution.read_text(encoding="utf-8"), path.stem, lang), chapter_id)
    finally:
        choose.set_language(before)


def record_answers(ch: Chapter) -> dict:
    """Run the chapter's public checks on the reference, recording every answer `t.ref` gives, and keep the hints of
    the chapter's table of mistakes (not their edits, which are pieces of the reference)."""
    from grader.authoring import misconceptions
    from grader.authoring.reference import Recorder
    from grader.run import check, solutions_module

    module = solutions_module(ch)
    recorders: dict[str, Recorder] = {}
    report = check(ch.id, solutions=True, hidden=False, figures_dir=None, refs=lambda key: recorders.setdefault(key, Recorder(module)))
    failed = [f"{r.task} {r.name}: {r.message}" for r in report.results if r.status != "passed"]
    if failed:
        raise ReleaseError(f"{ch.id}: the reference fails its own public checks:\n" + "\n".join(failed))
    hidden: dict[str, int] = {}
    hidden_points: dict[str, float] = {}
    for spec in checks.load(ch.id, with_hidden=True):
        hidden[spec.task] = hidden.get(spec.task, 0) + spec.hidden
        hidden_points[spec.task] = hidden_points.get(spec.task, 0.0) + spec.points * spec.hidden
    return {
        "chapter": chapters.to_record(ch),
        "checks": {key: rec.calls for key, rec in recorders.items()},
        "hidden": hidden,
        "hidden_points": hidden_points,
        "mistakes": misconceptions.recorded(ch.id),
    }


def record_lab(chosen: list[Chapter]) -> dict[str, dict[str, list]]:
    """Run every experiment of `course lab` at its starting instance on the reference, recording every answer
    `t.ref` gives ({chapter: {experiment: calls}}): in the release the lab compares that instance with them."""
    from grader.authoring.reference import Recorder
    from grader.lab import of_chapter
    from grader.lab.runner import Lab
    from grader.run import solutions_module

    experiments = [exp for ch in chosen for exp in of_chapter(ch.id)]
    if not experiments:
        return {}
    recorders: dict[str, Recorder] = {}

    def recorder(exp):
        return recorders.setdefault(exp.id, Recorder(solutions_module(chapters.find(exp.chapter))))

    lab = Lab(solutions=True, reference=recorder)
    try:
        failed = [f"{exp.id}: {r['message']}" for exp in experiments if (r := lab.run(exp.id, {}))["status"] != "passed"]
    finally:
        lab.close()
    if failed:
        raise ReleaseError("the reference fails the lab at its starting instances:\n" + "\n".join(failed))
    out: dict[str, dict[str, list]] = {}
    for exp in experiments:
        out.setdefault(exp.chapter, {})[exp.id] = recorders[exp.id].calls if exp.id in recorders else []
    return out


def _pyproject() -> str:
    project = tomllib.loads((chapters.ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    deps = "".join(f'  "{d}",\n' for d in project["dependencies"])
    return f'''[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "{project["name"]}"
version = "{project["version"]}"
description = "{project["description"]} (student release)"
readme = "README.md"
requires-python = "{project["requires-python"]}"
dependencies = [
{deps}]

[project.scripts]
course = "grader.cli:main"

[tool.setuptools.packages.find]
include = {json.dumps([p + "*" for p in PUBLIC_PACKAGES])}

[tool.setuptools.package-data]
grader = {json.dumps(["answers/*.json", *_package_data("grader")])}
figures = {json.dumps(_package_data("figures"))}
engine = {json.dumps(_package_data("engine"))}
'''


def _readme(chosen: list[Chapter]) -> str:
    """The release's README.md, in the run's language (`course release` sets it); the commands stay as they are."""
    from grader.delivery.grade import FLOOR, SLACK

    zh = choose.language() == "zh"
    rows = "".join(f"| {ch.id} | {ch.title_zh if zh else ch.title_en} | `exercises/{ch.filename}` |\n" for ch in chosen)
    limit, slack, floor = checks.DEFAULT_TIME_LIMIT, SLACK, FLOOR
    torch_cpu = "`.venv/bin/pip install torch --index-url https://download.pytorch.org/whl/cpu`"
    title = tr("LLM inference engines — exercises (student release)")
    install = tr("Install (Python 3.11, 3.12 or 3.13 and pip; about a minute, once):")
    cuda = tr(
        "On Linux pip takes torch's CUDA build (4–5 GB), which works, GPU or not. Without a GPU the CPU-only\n"
        "wheel is about 200 MB: install it first ({command}) and the command above keeps it.\n"
        "`.venv/bin/course doctor` says what your installation can do; paste its output into any question you ask.",
        command=torch_cpu,
    )
    then = tr("Then implement the `TODO`s of a chapter in `exercises/` and check your work:")
    c_check = tr("public checks, and your figures in course-figures/ch25/")
    c_list = tr("its tasks, their points (public + hidden) and your last results")
    explains = tr(
        "Each docstring gives the convention, the shapes and a small example. `course check` runs\n"
        "your code in a separate process with a time limit and a memory budget (memory in use, not the\n"
        "address space a GPU build reserves), explains every failing check,\n"
        "says how many hidden checks will run at grading time, and draws the chapter's figures from\n"
        "your own outputs (wrong values marked next to the expected ones). Here a check may take\n"
        "{limit:g} s; at grading it may get less, down to {slack:g} times what the reference solution needs\n"
        "in it (at least {floor:g} s), so code far slower than the reference can time out there.",
        limit=limit,
        slack=slack,
        floor=floor,
    )
    engine = tr(
        "The chapters add up to an inference engine. Once their tasks pass, run it on your own code\n"
        "(a small Qwen3 model, paged KV blocks, prefix caching, chunked prefill, preemption):"
    )
    until = tr("Until then it lists the tasks it still needs; it draws `course-figures/engine/overview.svg`.")
    header = tr("| chapter | title | your file |")
    return f"""# {title}

{install}

```
python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/course list
```

{cuda}

{then}

```
.venv/bin/course check ch25            # {c_check}
.venv/bin/course check ch25 --task ch25.1
.venv/bin/course list ch25             # {c_list}
```

{explains}

{engine}

```
.venv/bin/course engine run --prompt "The KV cache" --prompt "A block table"
```

{until}

{header}
|---|---|---|
{rows}"""
