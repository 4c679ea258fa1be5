"""Benchmark (not a test): `course grade --scheduler` on a Dask cluster of this machine against the local `--jobs 2`,
in one run, and the client's own cost per item.

Run:  .venv/bin/python tests/bench/grade_dask.py [N] [TRIVIAL]      (N ch25 submissions, default 40; TRIVIAL items
      for the client's cost, default 10000)

1. Throughput: the class of tests/bench/grade.py (60 % correct, 30 % wrong, 10 % hostile ch25 submissions) graded by
   `course grade --jobs 2`, then by `course grade --scheduler` with one worker process and with two (`dask worker
   --nthreads 1`, started before the clock starts, not warmed), each from the same grading.json (secret, seeds,
   time limits: calibrated once, not timed). Each must give the same grades.csv.
2. The client's cost per item: TRIVIAL students whose task returns a made-up result at once (no grading), sent to one
   worker with 4 threads: the client's CPU time (all its threads) and wall time per item, reading the answer,
   sending, checking the result and writing results.json and feedback.html included. The scheduler and the worker
   are other processes, not counted. From the measured seconds per graded item, the items per second 100 workers
   would ask of the client.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/bench, for the class of grade.py
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for mutate
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's course, as the workers import it
from grade import sources  # type: ignore[import-not-found, unused-ignore]  # noqa: E402

from grader import chapters  # noqa: E402
from grader.delivery import grade as grading  # noqa: E402

CH = chapters.find("ch25")
DASK = Path(sys.executable).parent / "dask"
ENV = dict(os.environ, PYTHONPATH=str(chapters.ROOT), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", COURSE_LANG="en")


class Cluster:
    """A `dask scheduler` and `dask worker` processes on 127.0.0.1."""

    def __init__(self, root: Path) -> None:
        self.root, self.procs = root, []
        root.mkdir(parents=True, exist_ok=True)
        file = root / "scheduler.json"
        self._start("scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard", "--scheduler-file", str(file))
        while not file.is_file():
            time.sleep(0.1)
        self.address = json.loads(file.read_text())["address"]

    def _start(self, *args: str) -> None:
        log = open(self.root / f"{args[0]}-{len(self.procs)}.log", "wb")
        self.procs.append(subprocess.Popen([str(DASK), *args], stdout=log, stderr=log, env=ENV, cwd=self.root, start_new_session=True))
        log.close()

    def workers(self, n: int, threads: int = 1) -> None:
        from distributed import Client

        for _ in range(n):
            self._start("worker", self.address, "--nthreads", str(threads), "--no-dashboard", "--host", "127.0.0.1")
        with Client(self.address, set_as_default=False) as client:
            client.wait_for_workers(n, timeout=120)

    def stop(self) -> None:
        for proc in self.procs:
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            proc.wait()


def course(*args: str) -> float:
    """Run `course ARGS`; its wall time."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "grader.cli", *args], check=True, env=ENV, cwd=chapters.ROOT, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def throughput(root: Path, n: int) -> float:
    """Part 1; the seconds a worker spends per item (for part 2)."""
    subs = root / "subs"
    for i, (_, source) in enumerate(sources(n)):
        (subs / f"s{i:04d}").mkdir(parents=True)
        (subs / f"s{i:04d}" / CH.filename).write_text(source)
    first = root / "calibration"
    (root / "empty").mkdir()
    grading.grade(root / "empty", [CH], first, seed=1, time_limit=2.0)  # the time limits, once (as grade.py's: 2 s)
    runs = {}

    def out(name: str) -> Path:
        folder = root / name
        folder.mkdir()
        shutil.copy(first / grading.STATE, folder / grading.STATE)
        return folder

    common = [str(subs), "--chapter", CH.id]
    runs["local --jobs 2"] = course("grade", *common, "--jobs", "2", "--out", str(out("local")))
    per_item = 0.0
    for workers in (1, 2):
        cluster = Cluster(root / f"cluster{workers}")
        try:
            cluster.workers(workers)
            name = f"--scheduler, {workers} worker{'s' * (workers > 1)}"
            runs[name] = course("grade", *common, "--scheduler", cluster.address, "--out", str(out(f"dask{workers}")))
            if workers == 1:
                per_item = runs[name] / n
        finally:
            cluster.stop()
    expected = (root / "local" / "grades.csv").read_text()
    for name in ("dask1", "dask2"):
        assert (root / name / "grades.csv").read_text() == expected, f"{name}'s grades.csv differs from the local run's"
    print(f"1. {n} ch25 submissions (the same grades.csv each time):")
    for name, seconds in runs.items():
        print(f"   {name:<24} {seconds:6.1f} s   {n / seconds:5.2f} submissions/s")
    return per_item


def trivial(task) -> str:
    """A made-up result for any item, at once: what a worker returns, without the grading."""
    doc = {"chapter": task.item.chapter, "score": 1.0, "max_score": 1.0, "status": "passed", "tests": [], "figures": []}
    return json.dumps({"doc": doc, "figures": {}, "worker": "bench", "seconds": 0.0})


def client_cost(root: Path, n: int, per_item: float) -> None:
    """Part 2."""
    from grader.delivery.cluster import Cluster as Connection

    subs = root / "trivial"
    for i in range(n):
        (subs / f"t{i:05d}").mkdir(parents=True)
        (subs / f"t{i:05d}" / CH.filename).write_text("x = 1\n")
    items = grading.find_items(subs, [CH])
    config = dict(seeds={i.student: 1 for i in items}, limits={CH.id: {"max": 2.0, "checks": {}}}, memory_limit=1 << 30, sandbox=None)
    out = root / "trivial-out"
    cluster = Cluster(root / "trivial-cluster")
    statuses: list[str] = []
    try:
        cluster.workers(1, threads=4)
        connection = Connection.connect(cluster.address, None)
        try:
            cpu, wall = time.process_time(), time.perf_counter()
            connection.grade(items, config, out, lambda item, row: statuses.append(row["status"]), lambda item: 60.0, task_function=trivial)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        finally:
            connection.close()
            grading._close_dirs()
    finally:
        cluster.stop()
    assert statuses == ["passed"] * n, sorted(set(statuses))[:3]
    print(f"2. {n} trivial items through the client: {cpu / n * 1e3:.2f} ms of client CPU and {wall / n * 1e3:.2f} ms of wall time each")
    if per_item:
        need = 100 / per_item
        print(
            f"   100 workers grading {per_item:.2f} s per item (part 1, one worker) ask {need:.0f} items/s of the client; "
            f"its CPU allows {n / cpu:.0f}/s, its wall time (the scheduler's share included) {n / wall:.0f}/s"
        )


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    trivial_n = int(sys.argv[2]) if len(sys.argv) > 2 else 10_000
    print(f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f} at the start (a shared machine's numbers are noisy)")
    with tempfile.TemporaryDirectory(prefix="bench-dask-") as tmp:
        per_item = throughput(Path(tmp), n) if n else 0.0
        client_cost(Path(tmp), trivial_n, per_item)


if __name__ == "__main__":
    main()
