"""Benchmark (not a test): a class of 200 ch25 submissions graded by `course grade --jobs 2`
and by `nbgrader autograde` on the equivalent notebooks, in one run.

Run:  .venv/bin/python tests/bench/grade.py [N]      (N submissions, default 200; nbgrader takes long)

The class: 60 % correct, 30 % wrong (three misconceptions), 10 % hostile (half hang,
half allocate 4 TB). All graders use the same per-check time limit (2 s). `course grade`
runs every submission in a sandbox of its own (a fresh warm process each) and runs the
hidden checks; `nbgrader autograde` runs the notebooks' test cells, whose hidden cells
no longer grade in the kernel (they score 0: the score of record is `course grade
--nbgrader`, timed too, on the same submitted notebooks). Peak memory is the largest sum of PSS (proportional set size: shared
pages split between the processes sharing them) over the grader's process tree.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for mutate
from mutate import mutant  # type: ignore[import-not-found, unused-ignore]  # noqa: E402 (mypy does not follow sys.path)

from grader import chapters  # noqa: E402
from grader.delivery.notebook import write_course  # noqa: E402

CH = chapters.find("ch25")
TIME_LIMIT = "2"
WRONG = [  # (old, new) edits of the reference, each a misconception
    ("return table[logical] * block_size + pos % block_size", "return logical * block_size + pos % block_size"),
    ("return table[logical] * block_size + pos % block_size", "return table[logical] * block_size"),
    ("    keep = s != PAD_SLOT\n", "    keep = s == s\n"),
]
HOSTILE = [
    ("    ### BEGIN SOLUTION\n    if block_size <= 0:", "    ### BEGIN SOLUTION\n    while True:\n        pass\n    if block_size <= 0:"),
    ("    num_blocks, block_size = k_cache.shape[:2]", "    torch.empty(10**12)\n    num_blocks, block_size = k_cache.shape[:2]"),
]


def sources(n: int, scratch: Path) -> list[tuple[str, str]]:
    """(kind, source) of each submission: kind is correct, wrong0..2, hang or allocate."""
    correct = (chapters.SOLUTIONS / CH.filename).read_text()
    wrong = [(mutant(scratch / f"w{i}", "ch25", e) / CH.filename).read_text() for i, e in enumerate(WRONG)]
    hostile = [(mutant(scratch / f"h{i}", "ch25", e) / CH.filename).read_text() for i, e in enumerate(HOSTILE)]
    out = []
    for i in range(n):
        k, h = i % 10, (i // 10) % 2
        out.append(("correct", correct) if k < 6 else (f"wrong{k % 3}", wrong[k % 3]) if k < 9 else (("hang", "allocate")[h], hostile[h]))
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
    kinds, codes = zip(*sources(n, work / "mutants"))

    subs = work / "subs"
    for i, code in enumerate(codes):
        (subs / f"s{i:03d}").mkdir(parents=True)
        (subs / f"s{i:03d}" / CH.filename).write_text(code)
    ours, ours_peak = timed(
        [
            str(bin_dir / "course"),
            "grade",
            str(subs),
            "--chapter",
            "ch25",
            "--out",
            str(work / "out"),
            "--jobs",
            "2",
            "--seed",
            "1",
            "--time-limit",
            TIME_LIMIT,
        ]
    )
    scores = by_student(work / "out" / "grades.csv", "student", n)

    course = work / "nbgrader"
    write_course(course, [CH])
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", COURSE_NOTEBOOK_TIME_LIMIT=TIME_LIMIT)
    nb = lambda *a: subprocess.run([str(bin_dir / "nbgrader"), *a], cwd=course, env=env, check=True, capture_output=True)
    nb("generate_assignment", "ch25")
    release = json.loads((course / "release" / "ch25" / "ch25.ipynb").read_text())
    for i, code in enumerate(codes):
        sub = json.loads(json.dumps(release))
        for cell in sub["cells"]:
            gid = cell["metadata"]["nbgrader"]["grade_id"]
            if gid.startswith("answer_"):
                name = "slot_mapping" if gid == "answer_25_1" else "store_kv"
                start = code.index(f"def {name}(")
                end = code.find("\ndef ", start + 1)
                cell["source"] = code[start : end if end > 0 else None].rstrip() + "\n"
        folder = course / "submitted" / f"s{i:03d}" / "ch25"
        folder.mkdir(parents=True)
        (folder / "ch25.ipynb").write_text(json.dumps(sub))
    flow, flow_peak = timed(
        [
            str(bin_dir / "course"),
            "grade",
            "--nbgrader",
            str(course),
            "--chapter",
            "ch25",
            "--out",
            str(work / "nb-out"),
            "--jobs",
            "2",
            "--seed",
            "1",
            "--time-limit",
            TIME_LIMIT,
        ],
        env=env,
    )
    flow_scores = by_student(work / "nb-out" / "grades.csv", "student", n)
    theirs, theirs_peak = timed([str(bin_dir / "nbgrader"), "autograde", "ch25", "--create", "--force"], cwd=course, env=env)
    nb("export")
    nb_scores = by_student(course / "grades.csv", "student_id", n)

    print(f"{n} ch25 submissions: 60% correct, 30% wrong, 10% hostile; per-check limit {TIME_LIMIT} s; 2 cores")
    print(f"{'grader':34s} {'wall':>8s} {'subs/s':>8s} {'peak PSS':>10s}  mean score")
    for label, wall, peak, s in (
        ("course grade --jobs 2 (a sandbox each)", ours, ours_peak, scores),
        ("course grade --nbgrader --jobs 2", flow, flow_peak, flow_scores),
        ("nbgrader autograde (public only)", theirs, theirs_peak, nb_scores),
    ):
        print(f"{label:34s} {wall:7.1f}s {n / wall:8.2f} {peak / 2**20:8.0f} MiB  {sum(s) / len(s):.2f}")
    print(f"throughput ratio: {theirs / ours:.1f}x")
    for kind in sorted(set(kinds)):
        mine = [a for a, k in zip(scores, kinds) if k == kind]
        other = [b for b, k in zip(nb_scores, kinds) if k == kind]
        print(f"  {kind:9s} mean score: course grade {sum(mine) / len(mine):6.2f}, nbgrader {sum(other) / len(other):6.2f}")
    differ = [(i, kinds[i], a, b) for i, (a, b) in enumerate(zip(scores, nb_scores)) if abs(a - b) > 1e-9]
    print(f"submissions scored differently: {len(differ)}" + "".join(f"\n  s{i:03d} ({k}): {a} vs {b}" for i, k, a, b in differ))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
