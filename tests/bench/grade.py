"""Benchmark (not a test): a class of 200 ch25 submissions graded by `course grade --jobs 2`
and by `nbgrader autograde` on the equivalent notebooks, in one run.

Run:  .venv/bin/python tests/bench/grade.py [N]      (N submissions, default 200; nbgrader takes long)

The class: 60 % correct, 30 % wrong (three misconceptions, rows of ch25's table of mistakes),
10 % hostile (half hang, half allocate 4 TB); tests/test_bench.py checks that it is built so.
All graders use the same per-check time limit (2 s). `course grade` runs every submission in a
sandbox of its own (a fresh warm process each) and runs the hidden checks; `nbgrader autograde`
runs the notebooks' test cells, whose hidden cells no longer grade in the kernel (they score 0:
the score of record is `course grade --nbgrader`, timed too, on the same submitted notebooks,
which must score as the modules do). Peak memory is the largest sum of PSS (proportional set
size: shared pages split between the processes sharing them) over the grader's process tree.
"""

from __future__ import annotations

import ast
import copy
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for mutate
from mutate import edited, row  # type: ignore[import-not-found, unused-ignore]  # noqa: E402 (mypy does not follow sys.path)

from grader import chapters  # noqa: E402
from grader.delivery.cells import segment  # noqa: E402
from grader.delivery.notebook import write_course  # noqa: E402

CH = chapters.find("ch25")
TIME_LIMIT = "2"
WRONG = ("slot_is_position", "offset_dropped", "padding_written")
"""The wrong submissions' misconceptions: rows of ch25's table of mistakes (grader/hidden/ch25_mistakes.py), whose
edits of the reference tests/test_mistakes.py keeps applicable (and graded) as the reference changes."""
HOSTILE = {"hang": ("slot_mapping", "while True:\n    pass"), "allocate": ("store_kv", "torch.empty(10**12)")}
"""kind: (function, statement): the reference with `statement` run first in that task function's answer (4 TB is
10**12 float32)."""


def first_in_answer(source: str, function: str, statement: str) -> str:
    """`source` with `statement` put first in the answer of its top-level function `function`: on the line after
    the function's `### BEGIN SOLUTION`, at that marker's indentation."""
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == function)
    lines = source.splitlines(keepends=True)
    at = next(i for i in range(node.lineno, node.end_lineno or node.lineno) if lines[i].strip() == "### BEGIN SOLUTION")
    indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
    return "".join(lines[: at + 1]) + textwrap.indent(statement, indent) + "\n" + "".join(lines[at + 1 :])


def sources(n: int) -> list[tuple[str, str]]:
    """(kind, source) of each submission, in order: kind is "correct", a mistake of WRONG or a key of HOSTILE.
    Of every 10: 6 correct, 3 wrong (one of each mistake) and 1 hostile (hang and allocate in turn)."""
    correct = (chapters.SOLUTIONS / CH.filename).read_text(encoding="utf-8")
    wrong = [(m, edited(CH.id, *row(CH.id, m).edits)) for m in WRONG]
    hostile = [(kind, first_in_answer(correct, function, statement)) for kind, (function, statement) in HOSTILE.items()]
    out = []
    for i in range(n):
        k, h = i % 10, (i // 10) % len(hostile)
        out.append(("correct", correct) if k < 6 else wrong[k % 3] if k < 9 else hostile[h])
    return out


def grade_command(bin_dir: Path, *source: str, out: Path) -> list[str]:
    """The `course grade` command line timed: the class `source` (a folder of submissions, or `--nbgrader` and an
    nbgrader course) graded into `out` on 2 cores, seed 1, TIME_LIMIT seconds per check."""
    return [
        str(bin_dir / "course"),
        "grade",
        *source,
        "--chapter",
        CH.id,
        "--out",
        str(out),
        "--jobs",
        "2",
        "--seed",
        "1",
        "--time-limit",
        TIME_LIMIT,
    ]


def answered(notebook: dict, code: str) -> dict:
    """A copy of the chapter notebook with each answer cell holding `code`'s definitions of its task's names (the
    notebook that a student who wrote the module `code` submits)."""
    tree = ast.parse(code)
    out = copy.deepcopy(notebook)
    for cell in out["cells"]:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", "")
        for task in CH.tasks:
            if gid == "answer_" + task.id.replace(".", "_"):
                defined = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in task.names]
                cell["source"] = "\n\n\n".join(segment(code, n) for n in defined) + "\n"
    return out


def pss_tree(root: int) -> int:
    """Sum of PSS (bytes) over a process and all its descendants."""
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("Pss:")) * 1024
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    todo += [int(p) for p in f.read().split()]
        except (OSError, StopIteration):
            pass
    return total


def by_student(path: Path, id_column: str, n: int) -> list[float]:
    """The scores of a grades CSV, in submission order (s000, s001, ...)."""
    with open(path, newline="") as f:
        score = {row[id_column]: float(row["score"]) for row in csv.DictReader(f)}
    return [score[f"s{i:03d}"] for i in range(n)]


def timed(cmd: list[str], **kw) -> tuple[float, int]:
    """Wall time and peak PSS of a command's process tree."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)
    peak = [0]

    def sample() -> None:
        while proc.poll() is None:
            peak[0] = max(peak[0], pss_tree(proc.pid))
            time.sleep(0.2)

    watcher = threading.Thread(target=sample)
    watcher.start()
    proc.wait()
    watcher.join()
    if proc.returncode:
        raise SystemExit(f"{cmd[0]} failed with {proc.returncode}")
    return time.perf_counter() - start, peak[0]


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    work = Path(tempfile.mkdtemp(prefix="bench-grade-"))
    bin_dir = Path(sys.executable).parent
    kinds, codes = zip(*sources(n))

    subs = work / "subs"
    for i, code in enumerate(codes):
        (subs / f"s{i:03d}").mkdir(parents=True)
        (subs / f"s{i:03d}" / CH.filename).write_text(code, encoding="utf-8")
    ours, ours_peak = timed(grade_command(bin_dir, str(subs), out=work / "out"))
    scores = by_student(work / "out" / "grades.csv", "student", n)

    course = work / "nbgrader"
    write_course(course, [CH])
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", COURSE_NOTEBOOK_TIME_LIMIT=TIME_LIMIT)
    nb = lambda *a: subprocess.run([str(bin_dir / "nbgrader"), *a], cwd=course, env=env, check=True, capture_output=True)
    nb("generate_assignment", "ch25")
    release = json.loads((course / "release" / "ch25" / "ch25.ipynb").read_text())
    for i, code in enumerate(codes):
        sub = answered(release, code)
        folder = course / "submitted" / f"s{i:03d}" / "ch25"
        folder.mkdir(parents=True)
        (folder / "ch25.ipynb").write_text(json.dumps(sub))
    flow, flow_peak = timed(grade_command(bin_dir, "--nbgrader", str(course), out=work / "nb-out"), env=env)
    flow_scores = by_student(work / "nb-out" / "grades.csv", "student", n)
    theirs, theirs_peak = timed([str(bin_dir / "nbgrader"), "autograde", "ch25", "--create", "--force"], cwd=course, env=env)
    nb("export")
    nb_scores = by_student(course / "grades.csv", "student_id", n)

    print(f"{n} ch25 submissions: 60% correct, 30% wrong, 10% hostile; per-check limit {TIME_LIMIT} s; 2 cores")
    print(f"{'grader':38s} {'wall':>8s} {'subs/s':>8s} {'peak PSS':>10s}  mean score")
    for label, wall, peak, s in (
        ("course grade --jobs 2 (a sandbox each)", ours, ours_peak, scores),
        ("course grade --nbgrader --jobs 2", flow, flow_peak, flow_scores),
        ("nbgrader autograde (public only)", theirs, theirs_peak, nb_scores),
    ):
        print(f"{label:38s} {wall:7.1f}s {n / wall:8.2f} {peak / 2**20:8.0f} MiB  {sum(s) / len(s):.2f}")
    print(f"throughput ratio: {theirs / ours:.1f}x")
    for kind in sorted(set(kinds)):
        mean = lambda s: sum(x for x, k in zip(s, kinds) if k == kind) / kinds.count(kind)
        print(
            f"  {kind:17s} mean score: course grade {mean(scores):6.2f}, --nbgrader {mean(flow_scores):6.2f}, "
            f"nbgrader autograde {mean(nb_scores):6.2f}"
        )
    differ = [(i, kinds[i], a, b) for i, (a, b) in enumerate(zip(scores, flow_scores)) if abs(a - b) > 1e-9]
    print(
        f"submissions scored differently as a module and as a notebook: {len(differ)}"
        + "".join(f"\n  s{i:03d} ({k}): {a} vs {b}" for i, k, a, b in differ)
    )
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
