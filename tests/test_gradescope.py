"""The Gradescope bundle, unpacked and run against a fake /autograder layout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile

from grader import chapters
from grader.gradescope import export

CH25 = chapters.find("ch25")


def run_bundle(tmp_path, files: dict[str, str]) -> dict:
    bundle = export(CH25, tmp_path / "autograder.zip", seed=9)
    root = tmp_path / "autograder"
    zipfile.ZipFile(bundle).extractall(root / "source")
    (root / "submission").mkdir()
    for name, text in files.items():
        (root / "submission" / name).write_text(text)
    shutil.copy(root / "source" / "run_autograder", root / "run_autograder")  # as Gradescope does
    os.chmod(root / "run_autograder", 0o755)
    env = dict(os.environ, GRADESCOPE_ROOT=str(root), COURSE_PYTHON=sys.executable)
    subprocess.run([str(root / "run_autograder")], env=env, check=True, capture_output=True)
    return json.loads((root / "results" / "results.json").read_text())


def test_the_bundle_has_what_gradescope_runs(tmp_path):
    names = zipfile.ZipFile(export(CH25, tmp_path / "a.zip")).namelist()
    assert {"setup.sh", "run_autograder", "course/pyproject.toml"} <= set(names)
    assert "course/grader/hidden/ch25.py" in names and not [n for n in names if n.startswith("course/tests")]


def test_run_autograder_writes_results_json(tmp_path):
    doc = run_bundle(tmp_path, {CH25.filename: (chapters.SOLUTIONS / CH25.filename).read_text()})
    assert doc["score"] == doc["max_score"] > 0 and doc["seed"] == 9
    assert any("hidden" in t["tags"] for t in doc["tests"]) and all(t["status"] == "passed" for t in doc["tests"])


def test_an_empty_submission_still_gets_a_document(tmp_path):
    doc = run_bundle(tmp_path, {"notes.txt": "nothing"})
    assert doc["score"] == 0 and "neither" in doc["output"]
