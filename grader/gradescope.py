"""A Gradescope autograder bundle: Gradescope runs every submission in its own container.

`export` writes a zip with `setup.sh` (installs the course package, hidden checks
included, into a venv), `run_autograder` (grades /autograder/submission and
writes /autograder/results/results.json) and the package source. The grading
seed is fixed when the bundle is made, so every student meets the same hidden
instances. `GRADESCOPE_ROOT` moves the /autograder root (tests use it).
"""

from __future__ import annotations

import json
import secrets
import zipfile
from pathlib import Path

from grader import chapters
from grader.chapters import Chapter

SOURCE = ("pyproject.toml", "README.md", "grader", "figures", "solutions", "exercises")

SETUP = """#!/usr/bin/env bash
# Gradescope runs this once to build the image (choose a base image with Python 3.11+, e.g. Ubuntu 24.04).
set -euo pipefail
apt-get update
apt-get install -y --no-install-recommends python3 python3-venv python3-pip bubblewrap
python3 -m venv /autograder/venv
/autograder/venv/bin/pip install /autograder/source/course   # torch==2.13.0 is pinned by the package
"""

RUN = """#!/usr/bin/env bash
# Gradescope runs this for every submission; the results land in results/results.json.
ROOT="${GRADESCOPE_ROOT:-/autograder}"
PYTHON="${COURSE_PYTHON:-$ROOT/venv/bin/python}"
cd "$ROOT/source/course" && exec "$PYTHON" -m grader.gradescope "$ROOT" CHAPTER SEED
"""


def export(chapter: Chapter, out: Path, *, seed: int | None = None) -> Path:
    """Write the bundle for one chapter to `out` (a .zip)."""
    seed = secrets.randbelow(2**31) if seed is None else seed
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        _add(z, "setup.sh", SETUP)
        _add(z, "run_autograder", RUN.replace("CHAPTER", chapter.id).replace("SEED", str(seed)))
        for name in SOURCE:
            path = chapters.ROOT / name
            files = [path] if path.is_file() else sorted(p for p in path.rglob("*.py") if "__pycache__" not in p.parts)
            for f in files:
                z.write(f, f"course/{f.relative_to(chapters.ROOT)}")  # Gradescope unzips into /autograder/source
    return out


def _add(z: zipfile.ZipFile, name: str, text: str) -> None:
    info = zipfile.ZipInfo(name)
    info.external_attr = 0o755 << 16  # executable, as Gradescope expects
    z.writestr(info, text)


def run(root: Path, chapter_id: str, seed: int) -> dict:
    """Grade the submission under `root` and write `root/results/results.json` (never raises)."""
    from grader.notebook import cells_of, submission_from_cells
    from grader.run import check

    results = root / "results"
    results.mkdir(parents=True, exist_ok=True)
    ch = chapters.find(chapter_id)
    submission = root / "submission"
    notebooks = sorted(submission.glob("*.ipynb"))
    try:
        if (submission / ch.filename).is_file():
            folder = submission
        elif notebooks:
            folder = submission_from_cells(ch, cells_of(notebooks[0]), results / "module")
        else:
            raise ValueError(f"the submission has neither {ch.filename} nor a chapter notebook")
        report = check(ch.id, submission=folder, hidden=True, seed=seed, figures_dir=results / "figures")
        doc = report.to_json()
        doc.update(stdout_visibility="hidden", output=f"{ch.id} · {ch.title}: {report.score:g}/{report.max_score:g}")
    except Exception as e:  # a submission that cannot be graded still gets a document
        doc = {"score": 0, "output": f"could not grade this submission: {e}", "tests": []}
    (results / "results.json").write_text(json.dumps(doc, ensure_ascii=False, indent=1), encoding="utf-8")
    return doc


if __name__ == "__main__":
    import sys

    run(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]))
