"""`course grade --scheduler`: a class graded on a Dask cluster of this machine (a scheduler and two worker
processes on 127.0.0.1, started and stopped here, importing the course from this checkout) gives what the local
run gives; a worker killed mid-item, a killed client, a worker of another course and a worker that dies on every
try each cost what they should; a worker's result is checked before anything of it is written."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from conftest import require_sandbox
from test_grade import CH17, SANDBOX, SOLUTION17, hang, write

from grader import chapters
from grader.delivery import cluster as cluster_module
from grader.delivery import grade as grade_module
from grader.delivery.cluster import MAX_FIGURE, BadResult, parse_result, refusal
from grader.delivery.grade import GradeError, Item, grade

pytestmark = pytest.mark.slow  # starts a scheduler and workers, grades classes twice
distributed = pytest.importorskip("distributed", reason="dask.distributed is the grading extra: pip install -e '.[grading]'")

DASK = Path(sys.executable).parent / "dask"
MEMORY = 1 << 30


def make_dask_class(root: Path) -> Path:
    """A ch17 class: correct, wrong, hostile (reads another student's file, loops forever,
    allocates beyond its budget) and malformed (`test_grade.make_class`'s kinds: a syntax error, not UTF-8, no
    file, a 200 MB file)."""
    subs = root / "subs"
    reads = f"try:\n    LEAK = open({str(root / 'subs' / 'ada' / CH17.filename)!r}).read()\nexcept OSError:\n    LEAK = ''\n"
    wrong = SOLUTION17.replace(".tril(diagonal=num_cached)", ".tril(diagonal=num_cached + 1)")
    assert wrong != SOLUTION17
    for student, source in {
        "ada": SOLUTION17,
        "cy-wrong": wrong,
        "di": "def causal_mask(:\n",
        "ed": b"\xff\xfe not utf-8",
        "ja-reads-ada": reads + SOLUTION17,
        "ka-loops": hang("causal_mask_with_offset"),
        "lu-hogs-memory": SOLUTION17.replace("def causal_mask(", "_HOG = b'x' * (3 << 30)\n\n\ndef causal_mask(", 1),
    }.items():
        write(subs / student, CH17.filename, source)
    (subs / "gu").mkdir()
    write(subs / "hi", CH17.filename, "")
    with open(subs / "hi" / CH17.filename, "r+b") as f:
        f.truncate(200 << 20)  # sparse
    return subs


class LocalDask:
    """A scheduler and worker processes on 127.0.0.1, each in its own process group (so that killing one kills its
    nanny and its worker: a machine lost)."""

    def __init__(self, root: Path, env: dict[str, str] | None = None) -> None:
        self.root = root
        self.env = dict(os.environ, PYTHONPATH=str(chapters.ROOT), COURSE_LANG="en", **(env or {}))
        self.file = root / "scheduler.json"
        self.procs: list[subprocess.Popen] = []
        self.workers: dict[str, subprocess.Popen] = {}
        self.scheduler = self._start(
            ["scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard", "--scheduler-file", str(self.file)]
        )
        deadline = time.monotonic() + 60
        while not self.file.is_file() and time.monotonic() < deadline:
            time.sleep(0.1)
        self.address = json.loads(self.file.read_text())["address"]
        self.client = distributed.Client(self.address, set_as_default=False, timeout=60)

    def _start(self, args: list[str], **env: str) -> subprocess.Popen:
        log = open(self.root / f"{args[0]}-{len(self.procs)}.log", "wb")
        environment = dict(self.env, **env)
        proc = subprocess.Popen([str(DASK), *args], stdout=log, stderr=log, env=environment, cwd=self.root, start_new_session=True)
        log.close()
        self.procs.append(proc)
        return proc

    def add_worker(self, name: str, **env: str) -> None:
        folder = self.root / name
        folder.mkdir(exist_ok=True)
        n = len(self.client.scheduler_info(n_workers=-1)["workers"])
        self.workers[name] = self._start(
            [
                "worker",
                self.address,
                "--nthreads",
                "1",
                "--no-dashboard",
                "--host",
                "127.0.0.1",
                "--name",
                name,
                "--local-directory",
                str(folder),
            ],
            **{"TMPDIR": str(folder), **env},  # its gradings' folders: `grading` sees them
        )
        self.client.wait_for_workers(n + 1, timeout=120)

    def kill(self, name: str) -> None:
        """Kill worker `name` and its nanny; return once the scheduler knows it is gone."""
        os.killpg(self.workers.pop(name).pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and name in {w["name"] for w in self.client.scheduler_info(n_workers=-1)["workers"].values()}:
            time.sleep(0.1)

    def grading(self, name: str) -> bool:
        """Whether worker `name` is grading an item now (its scratch folder is there)."""
        try:
            return any((self.root / name).rglob("course-grade-*"))
        except OSError:  # a folder below went while it was walked (an item ending): ask again next time
            return False

    def kill_mid_item(self, name: str, *args, **kwargs) -> tuple[threading.Thread, dict]:
        """`grade(*args, scheduler=this cluster, **kwargs)` in a thread, and worker `name` killed (with its nanny) as
        soon as it grades an item; the thread and the dict where its result lands (as "r")."""
        done: dict = {}
        run = threading.Thread(target=lambda: done.update(r=grade(*args, scheduler=self.address, **kwargs)), daemon=True)
        run.start()
        deadline = time.monotonic() + 120
        while not self.grading(name) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self.grading(name), f"{name} never graded"
        self.kill(name)
        return run, done

    def stop(self) -> None:
        self.client.close()
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def cluster_root() -> Path:
    """A folder for a cluster's logs and its workers' folders (their TMPDIR: where each grading's scratch goes),
    reachable by a sandbox that is another uid (the fallback where bubblewrap is missing), as /tmp is for a worker
    started by hand; pytest's own temporary folders are root's alone."""
    root = Path(tempfile.mkdtemp(prefix="course-dask-"))
    root.chmod(0o711)
    return root


@pytest.fixture(scope="module")
def dask_cluster():
    require_sandbox()  # a worker needs bubblewrap (the README); without it a worker refuses, as a local run would
    root = cluster_root()
    # one death per task is retried; a second is the task's end (KilledWorker): the suicidal test stays short
    cluster = LocalDask(root, {"DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "1"})
    try:
        cluster.add_worker("w1")
        cluster.add_worker("w2")
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def graded_locally(tmp_path_factory):
    """The class graded by the local run (--jobs 2): what every cluster run must give."""
    root = tmp_path_factory.mktemp("class")
    subs = make_dask_class(root)
    local = root / "local"
    grade(subs, [CH17], local, jobs=2, seed=7, sandbox=SANDBOX, memory_limit=MEMORY)
    return subs, local


def same_start(local: Path, out: Path) -> Path:
    """OUT holding the local run's grading.json (its secret, seeds and time limits), as a rerun finds it: the
    cluster then grades under the same limits, so that even a time limit's message is the same."""
    out.mkdir()
    shutil.copy(local / "grading.json", out / "grading.json")
    return out


MEASURED = re.compile(rb"\d+(?:\.\d+)? (?:GiB|MiB|KiB)")
"""A size the memory budget measured (how far a hog got before it was stopped differs from run to run, locally too)."""


def files(out: Path) -> dict[str, bytes]:
    """Every file below `out`, its bytes with the measured sizes written as "N": the rest must match to the byte."""
    return {str(p.relative_to(out)): MEASURED.sub(b"N", p.read_bytes()) for p in sorted(out.rglob("*")) if p.is_file()}


def some_of(subs: Path, root: Path, students: tuple[str, ...]) -> Path:
    """A smaller class of the same students (same names: same seeds), for the runs that are cut."""
    for student in students:
        shutil.copytree(subs / student, root / "subs" / student)
    return root / "subs"


def same_results(out: Path, local: Path, students: tuple[str, ...]) -> None:
    """Each student's folder as the local run wrote it (results.json's target aside: the answer's path, in
    another folder), and grades.csv's rows among the local run's."""
    for student in students:
        ours, theirs = files(out / student), files(local / student)
        doc, local_doc = (json.loads(f.pop("ch17/results.json")) for f in (ours, theirs))
        targets = {str(d.pop("target", "")).removesuffix(f"/{student}/{CH17.filename}") for d in (doc, local_doc)}
        assert ours == theirs and doc == local_doc and targets in ({""}, {str(out.parent / "subs"), str(local.parent / "subs")}), student
    rows = (local / "grades.csv").read_text().splitlines()
    assert set((out / "grades.csv").read_text().splitlines()) <= set(rows)


def test_the_cluster_grades_a_class_as_the_local_run_does(graded_locally, dask_cluster, tmp_path):
    subs, local = graded_locally
    remote = same_start(local, tmp_path / "remote")
    result = grade(subs, [CH17], remote, scheduler=dask_cluster.address, sandbox=SANDBOX, memory_limit=MEMORY)
    assert files(remote) == files(local)  # results, figures, feedback pages, grades.csv, summaries: byte for byte
    rows = {r["student"]: r["status"] for r in result.rows}
    assert rows["ada"] == rows["ja-reads-ada"] == "passed"  # what ja read (nothing: the sandbox) earned nothing
    assert rows["cy-wrong"] == rows["ka-loops"] == rows["lu-hogs-memory"] == "failed"
    assert all(rows[s].startswith("error: ") for s in ("di", "ed", "gu", "hi"))  # the client's rows, never sent
    graded = [(s, c) for log in result.workers.values() for s, c, _ in log["graded"]]
    assert sorted(graded) == sorted((s, "ch17") for s, status in rows.items() if not status.startswith("error"))
    assert set(result.workers) <= set(dask_cluster.client.scheduler_info(n_workers=-1)["workers"])
    assert "bubblewrap" in result.sandbox if SANDBOX else "none" in result.sandbox


def test_a_rerun_after_the_client_was_killed_resumes_without_grading_anything_twice(graded_locally, dask_cluster, tmp_path):
    students = ("ada", "cy-wrong", "gu", "ja-reads-ada")
    subs, local = graded_locally
    subs = some_of(subs, tmp_path, students)
    out = same_start(local, tmp_path / "out")
    command = [sys.executable, "-m", "grader.cli", "grade", str(subs), "--chapter", "ch17", "--out", str(out)]
    command += ["--scheduler", dask_cluster.address, "--memory-limit", str(MEMORY)] + ([] if SANDBOX else ["--no-sandbox"])
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while len(list(out.glob("*/ch17/results.json"))) < 2 and time.monotonic() < deadline:  # gu's, and one graded
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    before = {p: (p.stat().st_ino, p.read_bytes()) for p in out.glob("*/ch17/results.json")}
    assert 2 <= len(before) < 4, "killed mid-way"
    again = subprocess.run(command, capture_output=True, text=True, check=True)
    assert f"{4 - len(before)} new in this run" in again.stdout and "worker tcp://127.0.0.1:" in again.stdout
    assert {p: (p.stat().st_ino, p.read_bytes()) for p in before} == before  # kept, not graded again
    same_results(out, local, students)
    assert not list(out.glob("*/.*.partial-*"))


def test_a_worker_of_other_hidden_checks_is_refused_by_name_and_the_others_grade(dask_cluster, tmp_path):
    other = tmp_path / "course"  # the same course, but one hidden check changed
    for folder in ("grader", "solutions", "figures", "exercises"):
        shutil.copytree(chapters.ROOT / folder, other / folder, ignore=shutil.ignore_patterns("__pycache__"))
    with open(other / "grader" / "hidden" / "ch17.py", "a") as f:
        f.write("\n# another version of the hidden checks\n")
    dask_cluster.add_worker("w-other", PYTHONPATH=str(other))
    try:
        (address,) = (a for a, w in dask_cluster.client.scheduler_info(n_workers=-1)["workers"].items() if w["name"] == "w-other")
        subs = tmp_path / "subs"
        for student in ("ada", "bo"):
            write(subs / student, CH17.filename, SOLUTION17)
        notes: list[str] = []
        result = grade(subs, [CH17], tmp_path / "out", seed=1, scheduler=dask_cluster.address, sandbox=SANDBOX, on_note=notes.append)
    finally:
        dask_cluster.kill("w-other")
    version = cluster_module.course_version()
    ((note,),) = [notes]
    assert note.startswith(f"worker {address} refused: it has course {version} (grading inputs ")
    assert f"this client course {version} (grading inputs {cluster_module.fingerprint()[:12]})" in note
    assert [r["status"] for r in result.rows] == ["passed", "passed"] and address not in result.workers


def test_a_worker_of_another_course_is_refused_by_name(dask_cluster, tmp_path, monkeypatch):
    monkeypatch.setattr(cluster_module, "fingerprint", lambda: "f" * 64)  # this client: other grading inputs
    subs = tmp_path / "subs"
    write(subs / "ada", CH17.filename, SOLUTION17)
    notes: list[str] = []
    with pytest.raises(GradeError) as refused:
        grade(subs, [CH17], tmp_path / "out", scheduler=dask_cluster.address, sandbox=SANDBOX, on_note=notes.append)
    workers = dask_cluster.client.scheduler_info(n_workers=-1)["workers"]
    assert len(notes) == len(workers) == 2
    for worker, note in zip(sorted(workers), sorted(notes)):
        assert note.startswith(f"worker {worker} refused: it has course ") and "ffffffffffff" in note
    assert "no worker of" in str(refused.value)


def test_a_submission_that_kills_every_worker_it_meets_is_one_error_row(dask_cluster, tmp_path, monkeypatch):
    subs, out = tmp_path / "subs", tmp_path / "out"
    write(subs / "killer", CH17.filename, SOLUTION17)
    monkeypatch.setattr(cluster_module, "grade_task", lambda task: os._exit(1))  # as if grading it killed the worker
    result = grade(subs, [CH17], out, seed=1, scheduler=dask_cluster.address, sandbox=SANDBOX)
    (row,) = result.rows
    assert row["status"].startswith("error: the workers grading this submission died each time (KilledWorker")
    assert json.loads((out / "killer" / "ch17" / "results.json").read_text())["retry"] is True  # a rerun grades it
    dask_cluster.client.wait_for_workers(2, timeout=120)  # their nannies start them again


def test_a_worker_past_the_items_deadline_ends_itself_and_the_item_is_one_error_row(dask_cluster, tmp_path, monkeypatch):
    subs, out = tmp_path / "subs", tmp_path / "out"
    write(subs / "slow", CH17.filename, SOLUTION17)
    monkeypatch.setattr(grade_module, "ITEM_SLACK", -1e6)  # every item's deadline long past: each worker ends at once
    result = grade(subs, [CH17], out, seed=1, scheduler=dask_cluster.address, sandbox=SANDBOX)
    (row,) = result.rows
    assert row["status"].startswith("error: the workers grading this submission died each time (KilledWorker")
    dask_cluster.client.wait_for_workers(2, timeout=120)
    assert any("grading took over" in log.read_text() for log in dask_cluster.root.glob("worker-*.log"))


def test_a_worker_killed_mid_item_costs_nothing(graded_locally, dask_cluster, tmp_path):
    students = ("ada", "cy-wrong", "ja-reads-ada")
    subs, local = graded_locally
    subs = some_of(subs, tmp_path, students)
    out = same_start(local, tmp_path / "out")
    # the worker and its nanny, mid-item: a machine lost
    run, done = dask_cluster.kill_mid_item("w1", subs, [CH17], out, sandbox=SANDBOX, memory_limit=MEMORY)
    run.join(300)
    assert not run.is_alive() and "r" in done, "the run did not end"
    same_results(out, local, students)
    assert [w for w in done["r"].workers if done["r"].workers[w]["items"]]


def test_a_run_left_without_workers_says_so_and_goes_on_when_one_joins(tmp_path, monkeypatch):
    require_sandbox()
    monkeypatch.setattr(cluster_module, "NO_WORKER_NOTE", 1.0)
    monkeypatch.setattr(cluster_module, "WORKERS_EVERY", 0.2)
    root = cluster_root()
    lonely = LocalDask(root)
    try:
        lonely.add_worker("first")
        subs, out = tmp_path / "subs", tmp_path / "out"
        write(subs / "ada", CH17.filename, SOLUTION17)
        write(subs / "bo", CH17.filename, SOLUTION17)
        notes: list[str] = []
        # the only one, mid-item; no nanny starts it again
        run, done = lonely.kill_mid_item("first", subs, [CH17], out, seed=1, sandbox=SANDBOX, on_note=notes.append)
        deadline = time.monotonic() + 120
        while not notes and time.monotonic() < deadline:
            time.sleep(0.05)
        (note,) = notes
        assert note.startswith(f"no worker that may grade this class has been connected to the scheduler at {lonely.address} for 1 s")
        assert "2 items are not graded yet: the run waits for one to join" in note and run.is_alive()
        lonely.add_worker("second")
        run.join(120)
        assert not run.is_alive() and "r" in done, "the run did not end"
        assert [r["status"] for r in done["r"].rows] == ["passed", "passed"]
        assert notes[1:] == [f"a worker joined the scheduler at {lonely.address}: grading goes on"]
    finally:
        lonely.stop()
        shutil.rmtree(root, ignore_errors=True)


# -- a worker's result, checked on the client ------------------------------------------------------------------
ITEM = Item("ada", "ch17", "/subs", CH17.filename)


def result_text(**changes) -> str:
    doc = {"chapter": "ch17", "score": 3.0, "max_score": 4.0, "status": "failed", "tests": [{"name": "t"}], "figures": []}
    data = {"doc": doc, "figures": {}, "worker": "tcp://127.0.0.1:1", "seconds": 1.5}
    for key, value in changes.items():
        (doc if key in doc else data)[key] = value
    return json.dumps(data)


def test_a_good_result_is_read():
    figure = "figures/ch17/ch17-causal-mask.svg"
    doc, figures, worker, took = parse_result(
        result_text(figures=[figure]).replace('"figures": {}', f'"figures": {{"{figure}": "<svg/>"}}'), ITEM
    )
    assert (doc["score"], figures, worker, took) == (3.0, {figure: "<svg/>"}, "tcp://127.0.0.1:1", 1.5)


@pytest.mark.parametrize(
    "changes",
    [
        {"chapter": "ch25"},
        {"score": 5.0},
        {"score": "3"},
        {"score": float("nan")},
        {"status": "excellent"},
        {"status": "error"},  # an error without its message
        {"tests": "all passed"},
        {"figures": ["figures/ch17/x.svg"]},  # named, not sent
        {"worker": None},
    ],
)
def test_a_result_unlike_the_graders_is_refused(changes):
    with pytest.raises(BadResult):
        parse_result(result_text(**changes), ITEM)


@pytest.mark.parametrize(
    "name",
    ["../../../etc/x.svg", "figures/ch17/../../x.svg", "figures/ch25/x.svg", "figures/ch17/.x.svg", "figures/ch17/x.html", "/tmp/x.svg"],
)
def test_a_figure_name_that_is_not_a_figures_is_refused(name):
    text = result_text(figures=[name]).replace('"figures": {}', json.dumps({"figures": {name: "<svg/>"}})[1:-1])
    with pytest.raises(BadResult):
        parse_result(text, ITEM)


def test_a_figure_too_large_and_a_result_that_is_no_text_are_refused():
    name = "figures/ch17/x.svg"
    text = result_text(figures=[name]).replace('"figures": {}', json.dumps({"figures": {name: "x" * (MAX_FIGURE + 1)}})[1:-1])
    for bad in (text, b"{}", None, "[]", "not json"):
        with pytest.raises(BadResult):
            parse_result(bad, ITEM)


def test_a_worker_is_refused_for_another_course_or_no_sandbox_and_accepted_alike():
    ours = {"course": "0.1.0", "fingerprint": "a" * 64}
    assert refusal("tcp://w:1", dict(ours, sandbox="bwrap ..."), ours) is None
    assert "course 0.2.0" in (refusal("tcp://w:1", dict(ours, course="0.2.0"), ours) or "")
    assert "bbbbbbbbbbbb" in (refusal("tcp://w:1", dict(ours, fingerprint="b" * 64), ours) or "")
    assert "no bwrap" in (refusal("tcp://w:1", dict(ours, no_sandbox="no bwrap"), ours) or "")


def test_grader_imports_no_dask():
    code = "import sys, grader.cli, grader.delivery.grade, grader.run; print(sorted({m.split('.')[0] for m in sys.modules}))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=chapters.ROOT).stdout
    assert "'grader'" in loaded and "'dask'" not in loaded and "'distributed'" not in loaded


def test_the_benchmarks_made_up_result_is_one_the_client_takes():
    from types import SimpleNamespace

    from bench import grade_dask

    doc, figures, _, _ = parse_result(grade_dask.trivial(SimpleNamespace(item=ITEM)), ITEM)
    assert doc["status"] == "passed" and figures == {}
