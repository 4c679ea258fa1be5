"""The isolated runner against hostile submissions: each behaviour costs the check it
happens in, with a clear status and message, and nothing else is lost."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import FRESH, require_sandbox

from grader import chapters
from grader.chapters import EXERCISES, ROOT
from grader.isolation import portable, procs
from grader.run import check

pytestmark = pytest.mark.slow  # grades submissions, builds releases or runs real tools: not in the fast loop

# A correct ch25 whose slot_mapping misbehaves only on the figure instance (the first check).
TEMPLATE = '''
import torch

def _slots(block_table, positions, block_size):
    if block_size <= 0:
        raise ValueError("block_size")
    pos = torch.as_tensor(positions, dtype=torch.int64)
    if pos.numel() and (int(pos.min()) < 0 or int((pos // block_size).max()) >= len(block_table)):
        raise ValueError("beyond the table")
    return torch.as_tensor(block_table, dtype=torch.int64)[pos // block_size] * block_size + pos % block_size

def slot_mapping(block_table, positions, block_size):
    """Task ch25.1."""
    if list(block_table) == [3, 0, 4] and len(positions) == 5:
{hostile}
    return _slots(block_table, positions, block_size)

def store_kv(k_cache, v_cache, k, v, slots):
    """Task ch25.2."""
    raise NotImplementedError("ch25.2 store_kv: not implemented yet (about 3 lines)")
'''

HOSTILE = {
    "endless loop": ("while True:\n    pass", "timeout", "did not finish within 2 s"),
    "sleep": ("import time\ntime.sleep(60)", "timeout", "did not finish within 2 s"),
    "huge allocation": ("torch.empty(10**12)", "error", "ran out of memory"),
    "growing allocation": ("x = []\nwhile True:\n    x.append(b'x' * 10**8)", "error", "ran out of memory: it was stopped at"),
    "sys.exit": ("import sys\nsys.exit(3)", "error", "called sys.exit(3)"),
    "os._exit": ("import os\nos._exit(0)", "error", "ended the grading process with exit code 0"),
    "output flood": ("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", "error", "output limit was reached"),
    "fake results on stdout and stderr": (
        "import sys, json\nprint(json.dumps({'score': 9, 'status': 'passed'}))\n"
        "print('✓ ch25.1 slot_mapping 5/5', file=sys.stderr)\nreturn torch.zeros(5, dtype=torch.int64)",
        "failed",
        "yours: 0",
    ),
    "patched comparisons": (
        "import builtins, numpy\ntorch.equal = lambda *a, **k: True\ntorch.allclose = lambda *a, **k: True\n"
        "torch.Tensor.__eq__ = lambda *a: torch.tensor(True)\nnumpy.array_equal = lambda *a, **k: True\n"
        "builtins.isinstance = lambda *a: True\nreturn torch.zeros(5, dtype=torch.int64)",
        "failed",
        "yours: 0",
    ),
    "an object equal to anything": (
        "class Anything:\n    def __eq__(self, other):\n        return True\n    __hash__ = object.__hash__\nreturn Anything()",
        "failed",
        "yours: an object of type Anything",
    ),
    "importing the reference": (
        "from solutions.ch25_paged_kv import slot_mapping as ref\nreturn ref(block_table, positions, block_size)",
        "error",
        "not allowed while grading",
    ),
    "reading the reference by path": (
        "import importlib.util, grader\nfrom pathlib import Path\n"
        "p = Path(grader.__file__).parent.parent / 'solutions' / 'ch25_paged_kv.py'\n"
        "spec = importlib.util.spec_from_file_location('r', p)\nm = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(m)\nreturn m.slot_mapping(block_table, positions, block_size)",
        "error",
        "not allowed while grading",
    ),
    "a process left running": ("import subprocess\nsubprocess.Popen(['sleep', '300'])", "error", "left a process running"),
    "an escaped daemon (double fork, setsid)": (
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(300)\n    os._exit(0)\nos.wait()",
        "error",
        "left a process running",
    ),
    "a fork that returns twice": ("import os\nos.fork()\nreturn torch.zeros(5, dtype=torch.int64)", "error", "left a process running"),
}


def submission(tmp_path, hostile: str):
    body = textwrap.indent(hostile, " " * 8)
    (tmp_path / "ch25_paged_kv.py").write_text(TEMPLATE.replace("{hostile}", body))
    return tmp_path


IN_THE_SANDBOX = {"reading the reference by path": "No such file or directory"}
"""What an attack meets in the sandbox instead, where the file is simply not there."""


@pytest.mark.parametrize("how", ["fresh", "zygote", "sandbox", "portable"])
@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_behaviour_costs_only_its_check(tmp_path, name, how, request, monkeypatch):
    """Each behaviour in each way a student's process runs: a fresh interpreter, forked from the warm process,
    in the sandbox, and on the portable route (spawn, stdin/stdout pipes, the memory watchdog through psutil:
    what macOS and Windows get, forced here with COURSE_PORTABLE's switch)."""
    code, status, words = HOSTILE[name]
    if how == "sandbox":
        require_sandbox()
        words = IN_THE_SANDBOX.get(name, words)
    elif name in IN_THE_SANDBOX:
        pytest.skip("only the sandbox keeps a submission from the reference's files")
    if how == "portable":
        monkeypatch.setattr(portable, "FORCED", True)
    launcher = request.getfixturevalue("warm_students").start if how == "zygote" else FRESH
    started = time.monotonic()
    report = check(
        "ch25",
        submission=submission(tmp_path, code),
        task="ch25.1",
        hidden=False,
        time_limit=2.0,
        memory_limit=1 << 30,
        figures_dir=None,
        launcher=launcher,
        sandbox="bwrap" if how == "sandbox" else None,
    )
    first, rest = report.results[0], report.results[1:]
    assert first.name.startswith("figure instance")
    assert (first.status, words in first.message) == (status, True), first.message
    assert first.score == 0
    # after a timeout the task's other checks are not run (one time limit per task); otherwise all pass
    expected = "not run" if status == "timeout" else "passed"
    assert [r.status for r in rest] == [expected] * len(rest), [(r.name, r.message) for r in rest]
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("how", ["fresh", "zygote", "sandbox", "portable"])
def test_reserved_address_space_is_not_memory_in_use(tmp_path, how, request, monkeypatch):
    """A right answer that reserves 8 GiB of address space when it is imported, as a CUDA build of torch does when
    it loads, and never touches it, gets full marks in every way a student's process runs; one that touches a
    quarter of its budget's worth more than it may is stopped, and the message names the budget."""
    if how == "sandbox":
        require_sandbox()
    if how == "portable":
        monkeypatch.setattr(portable, "FORCED", True)
    launcher = request.getfixturevalue("warm_students").start if how == "zygote" else FRESH
    answer = (chapters.SOLUTIONS / "ch17_causal_masks.py").read_text()
    options = dict(hidden=True, seed=5, figures_dir=None, launcher=launcher, sandbox="bwrap" if how == "sandbox" else None)
    (tmp_path / "ch17_causal_masks.py").write_text("import mmap\n_reserved = mmap.mmap(-1, 8 << 30)\n" + answer)
    report = check("ch17", submission=tmp_path, memory_limit=512 << 20, **options)
    assert report.score == report.max_score > 0, [(r.name, r.message) for r in report.results if r.status != "passed"]
    (tmp_path / "ch17_causal_masks.py").write_text(answer + "\n_touched = b'x' * (640 << 20)\n")
    report = check("ch17", submission=tmp_path, memory_limit=512 << 20, **options)
    assert report.score == 0 and report.results[0].import_failed
    assert "importing ch17_causal_masks.py ran out of memory: it was stopped at" in report.results[0].message
    assert "all of the 512 MiB it may use" in report.results[0].message, report.results[0].message


def test_no_process_outlives_the_run(tmp_path):
    pidfile = tmp_path / "daemon.pid"
    code = HOSTILE["an escaped daemon (double fork, setsid)"][0].replace(
        "time.sleep(300)", f"open({str(pidfile)!r}, 'a').write(f'{{os.getpid()}}\\n'); time.sleep(300)"
    )
    check("ch25", submission=submission(tmp_path, code), task="ch25.1", hidden=False, figures_dir=None)
    pids = [int(line) for line in pidfile.read_text().split()]
    assert pids, "the daemon ran (and said its pid)"
    alive = [
        pid
        for pid in pids
        if Path(f"/proc/{pid}").exists() and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    ]
    assert not alive, f"the student's daemon {alive} outlived the run"


def test_a_module_that_fails_to_import_errors_every_check_once(tmp_path):
    (tmp_path / "ch25_paged_kv.py").write_text("def slot_mapping(:\n    pass\n")
    report = check("ch25", submission=tmp_path, hidden=False, figures_dir=None)
    assert {r.status for r in report.results} == {"error"}
    assert all("SyntaxError" in r.message and "ch25_paged_kv.py:1" in r.message for r in report.results)
    assert all(r.import_failed for r in report.results), "one cause, so the terminal can say it once"


def test_a_module_that_hangs_on_import_times_out(tmp_path):
    (tmp_path / "ch25_paged_kv.py").write_text("while True:\n    pass\n")
    started = time.monotonic()
    report = check("ch25", submission=tmp_path, hidden=False, time_limit=1.0, figures_dir=None)
    firsts = {r.task: r for r in reversed(report.results)}  # each task's first check
    assert {r.status for r in firsts.values()} == {"timeout"}
    assert {r.status for r in report.results} - {"timeout"} == {"not run"}
    assert "importing ch25_paged_kv.py did not finish" in report.results[0].message
    assert time.monotonic() - started < 15, "the import is timed out once, not once per check"
    assert all(r.import_failed for r in report.results)
    assert all("importing ch25_paged_kv.py ran out of time" in r.message for r in report.results if r.status == "not run"), (
        "a check not run names the import as the reason, not a check"
    )


class EveryCheck(dict):
    """Per-check limits (`grade`'s calibrated ones) of `seconds` for every check."""

    def __init__(self, seconds: float) -> None:
        super().__init__(every=seconds)  # not empty: an empty mapping reads as none
        self.seconds = seconds

    def get(self, key, default=None):
        return self.seconds


def test_an_import_gets_the_runs_limit_where_a_checks_own_is_shorter(tmp_path):
    solution = (chapters.SOLUTIONS / "ch25_paged_kv.py").read_text()
    (tmp_path / "ch25_paged_kv.py").write_text("import time\ntime.sleep(1.5)\n" + solution)  # a slow table, built once
    report = check("ch25", submission=tmp_path, task="ch25.1", hidden=False, figures_dir=None, time_limit=5.0, time_limits=EveryCheck(0.5))
    assert {r.status for r in report.results} == {"passed"}, [r.message for r in report.results]
    (tmp_path / "ch25_paged_kv.py").write_text("while True:\n    pass\n" + solution)
    report = check("ch25", submission=tmp_path, task="ch25.1", hidden=False, figures_dir=None, time_limit=2.0, time_limits=EveryCheck(0.5))
    assert "importing ch25_paged_kv.py did not finish within 2 s" in report.results[0].message  # the limit it had


def test_a_missing_function_is_named(tmp_path):
    (tmp_path / "ch25_paged_kv.py").write_text("def store_kv(*a):\n    pass\n")
    report = check("ch25", submission=tmp_path, task="ch25.1", hidden=False, figures_dir=None)
    assert "has no function 'slot_mapping'" in report.results[0].message


def test_a_missing_function_is_an_error_even_where_a_check_expects_an_exception(tmp_path):
    """The ValueError checks once reported a missing function as "yours raised _Missing" ([wrong])."""
    (tmp_path / "ch25_paged_kv.py").write_text("def store_kv(*a):\n    pass\n")
    report = check("ch25", submission=tmp_path, task="ch25.1", hidden=False, figures_dir=None)
    expect = "your module has no function 'slot_mapping' (was it renamed or deleted?)"
    assert any("raises ValueError" in r.name for r in report.results), "the case this test is about"
    assert [(r.status, r.message) for r in report.results] == [("error", expect)] * len(report.results)
    assert not any(r.import_failed for r in report.results)


def test_a_missing_method_of_a_students_object_is_an_error(tmp_path):
    (tmp_path / "ch25_paged_kv.py").write_text("class BlockManager:\n    def __init__(self, num_blocks, block_size):\n        pass\n")
    report = check("ch25", submission=tmp_path, task="ch25.3", hidden=False, figures_dir=None)
    assert {r.status for r in report.results} == {"error"}, [(r.status, r.message) for r in report.results]
    said = [r.message for r in report.results]
    assert all(
        re.fullmatch(
            r"your (module has no function|BlockManager has no (method|attribute)) '\w+' "
            r"\(was it renamed or deleted\?\)",
            m,
        )
        for m in said
    ), said
    assert any(m.startswith("your BlockManager has no method") for m in said), said


def test_printing_is_allowed_and_shown(tmp_path):
    code = "print('debugging: here I am')\nreturn torch.zeros(5, dtype=torch.int64)"
    report = check("ch25", submission=submission(tmp_path, code), task="ch25.1", hidden=False, figures_dir=None)
    assert report.results[0].status == "failed"
    assert "debugging: here I am" in report.results[0].printed


def test_json_output_is_one_document_whatever_the_student_prints(tmp_path):
    require_sandbox()  # --submission runs in the sandbox
    code = HOSTILE["fake results on stdout and stderr"][0]
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "grader.cli",
            "check",
            "ch25",
            "--task",
            "ch25.1",
            "--json",
            "--submission",
            str(submission(tmp_path, code)),
            "--figures",
            str(tmp_path / "f"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    doc = json.loads(out.stdout)
    assert out.returncode == 1
    assert doc["tests"][0]["status"] == "failed" and doc["score"] < doc["max_score"]


def test_the_stub_module_is_the_default_target():
    report = check("ch25", task="ch25.2", figures_dir=None)
    assert report.target == str(EXERCISES / "ch25_paged_kv.py")
    assert all(r.todo for r in report.results)


def test_a_check_whose_oracle_package_is_missing_is_blocked_with_its_points():
    from grader.authoring.spec import CheckSpec
    from grader.authoring.trial import run_one

    class NoStudent:  # the check blocks before it would call student code
        pids: set = set()
        time_used = 0.0

        def begin_check(self, time_limit):
            pass

        def take_printed(self):
            return ""

    spec = CheckSpec("ch25.1", "needs an oracle", lambda t: t.require("a_package_nobody_has"), True, points=2.0)
    result = run_one(
        spec, "slot_mapping", session=NoStudent(), ref=None, seed=0, params={}, figures={}, time_limit=1.0, strays=lambda keep: []
    )
    assert (result.status, result.score, result.points) == ("blocked", 0.0, 2.0)
    assert "pip install -e '.[oracle]'" in result.message


def test_objects_stay_in_the_students_process_and_are_driven_by_handle(tmp_path):
    from grader.authoring.spec import CheckSpec
    from grader.authoring.trial import run_one
    from grader.isolation.session import Session
    from grader.isolation.worker import OUTPUT_LIMIT, start

    (tmp_path / "ch25_paged_kv.py").write_text(
        "class Counter:\n    def __init__(self, start):\n        self.n = start\n        self.log = []\n"
        "    def add(self, k, other=None):\n        self.n += k\n        self.log.append(k)\n        return other\n"
        "    @property\n    def twice(self):\n        return 2 * self.n\n\n"
        "def slot_mapping(start):\n    return Counter(start)\n"
    )
    seen = {}

    def body(t):
        c = t.yours.slot_mapping(5)
        other = t.yours.slot_mapping(0)
        assert c.add(3) is None and c.add(2, other) == other != c
        seen.update(t.attrs(c, "n", "log", "twice"), handle=c)
        c.nothing()

    spawn = lambda **kw: start(root=ROOT, workdir=tmp_path, memory_limit=1 << 30, output_limit=OUTPUT_LIMIT, **kw)
    session = Session(tmp_path / "ch25_paged_kv.py", spawn=spawn, time_limit=10.0)
    try:
        result = run_one(
            CheckSpec("ch25.1", "objects", body, False),
            "slot_mapping",
            session=session,
            ref=None,
            seed=0,
            params={},
            figures={},
            time_limit=10.0,
            strays=lambda keep: procs.kill_strays(procs.children() - keep),
        )
    finally:
        session.close()
    assert {k: seen[k] for k in ("n", "log", "twice")} == {"n": 10, "log": [3, 2], "twice": 20}
    assert seen["handle"].type_name == "Counter"
    assert result.status == "error" and "your Counter has no method 'nothing'" in result.message


def test_where_the_box_has_no_cgroup_the_run_says_which_limits_hold_instead(tmp_path, monkeypatch):
    require_sandbox()
    (tmp_path / "ch17_causal_masks.py").write_text((chapters.SOLUTIONS / "ch17_causal_masks.py").read_text())
    options = dict(submission=tmp_path, task="ch17.1", hidden=False, figures_dir=None, sandbox="bwrap")
    with_cgroup = check("ch17", **options)
    monkeypatch.setattr(portable, "FORCED", True)  # no cgroup: the watchdog
    without = check("ch17", **options)
    assert without.score == without.max_score > 0
    assert "memory is a watchdog" in without.limits and "processes: 128 per box" in without.limits
    assert without.to_json()["limits"] == without.limits
    if with_cgroup.limits == "":  # this machine gives a cgroup (root): nothing to say
        assert "limits" not in with_cgroup.to_json()


def test_a_grader_killed_outright_takes_its_sandbox_along(tmp_path):
    """SIGKILL leaves the grader no moment to close its boxes: the kernel ends them (bwrap's own process included),
    and the next grader removes what budget folders are left."""
    require_sandbox()
    script = (
        "import os, sys, time\n"
        "from grader.isolation.sandbox import Box\n"
        "from grader.isolation.zygote import Zygote\n"
        "box = Box('bwrap', {})\n"
        "zygote = Zygote(box=box)\n"
        "print(' '.join(map(str, box.processes())), flush=True)\n"
        "time.sleep(60)\n"
    )
    grader = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    pids = [int(p) for p in grader.stdout.readline().split()]
    assert pids, "the box's processes, seen from outside"
    grader.kill()
    grader.wait()
    running = lambda pid: procs.status(pid).get("State", "Z")[0] not in "ZX"  # an exited one may wait to be reaped
    deadline = time.monotonic() + 10
    while (alive := [p for p in pids if running(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive, [procs.describe(p) for p in alive]
    for pid in pids:  # reap what this process adopted (it is a subreaper)
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
