"""The Gradescope bundle: exported, installed as setup.sh installs it, run against a fake /autograder.

The bundle's venv is made once per session, the way setup.sh makes it but faster: a venv of
Debian's /usr/bin/python3 (Gradescope's image has apt's python3, and this repository's editable
install must not be visible), the course package's dependencies hard-linked from this venv's
site-packages (the very files pip installed here: installing torch's wheel again takes about two
minutes, linking it one second), then a plain, non-editable `pip install` of the bundle's course/
as setup.sh runs it (15 to 30 s in all here). Everything lives in a folder every uid may traverse
(/tmp/course-gradescope-test-*), so the student's uid meets only the permissions the bundle sets.

Each boundary is forced in turn (`COURSE_SANDBOX`), with a uid of the tests' own for the student
(`COURSE_STUDENT_UID`): the reference scores full marks, the stub 0, and attacks score 0 without
reading a line of the reference or the hidden checks, without touching results.json, without
reaching the network (a listener of the test's own on 127.0.0.1 hears nothing) and without reading
/autograder (submission_metadata.json with its previous results, the results folder). Each fake
/autograder has a submission_metadata.json naming its student: two ids get different hidden
instances, the same id the same ones.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest
from conftest import missing, require_root, require_sandbox
from linkedvenv import link_distributions
from netlisten import Listener

from grader import chapters, checks
from grader.delivery.gradescope import STUDENT_USER, VENV, export, processes_of
from grader.isolation import netfilter
from grader.isolation.sandbox import _closure

pytestmark = pytest.mark.slow  # grades submissions, builds releases or runs real tools: not in the fast loop

CH25 = chapters.find("ch25")
SEED = 9
"""The bundle's secret is "9" (`export(seed=9)`): every student's seed is derived from it."""
STUDENT = 1_250_000 + os.getpid() % 10_000
"""The student's uid in these tests: outside the range the sandbox picks uids from, used by no one else."""
KINDS = ["bwrap", "uid"]
SYSTEM_PYTHON = "/usr/bin/python3"


@dataclass
class Installed:
    base: Path
    bundle: Path
    python: Path
    site: Path


@dataclass
class Run:
    root: Path
    proc: subprocess.CompletedProcess
    raw: bytes

    @property
    def doc(self) -> dict:
        return json.loads(self.raw)

    @property
    def results(self) -> Path:
        return self.root / "results" / "results.json"


def _dependencies() -> list[metadata.Distribution]:
    """The installed distributions the course package needs (extras left out), not itself."""
    return [d for d in _closure(("course",)) if d.metadata["Name"] != "course"]


@pytest.fixture(scope="session")
def installed() -> Installed:
    require_root("the bundle's sandboxes, as in Gradescope's container")
    require_sandbox("bwrap")
    if not os.path.exists(SYSTEM_PYTHON):
        missing(f"no {SYSTEM_PYTHON} to make the bundle's venv with (Debian's python3)")
    base = Path(tempfile.mkdtemp(prefix="course-gradescope-test-"))
    os.chmod(base, 0o755)
    try:
        zipfile.ZipFile(export(CH25, base / "autograder.zip", seed=SEED, lang="en")).extractall(base / "bundle")  # the tests read English
        venv = base / "venv"
        subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(venv)], check=True)
        python = venv / "bin" / "python"
        site = Path(
            subprocess.run(
                [str(python), "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        )
        link_distributions(_dependencies(), site)  # hard links of what pip installed here
        pip = subprocess.run(
            [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", str(base / "bundle" / "course")],
            capture_output=True,
            text=True,
        )
        assert pip.returncode == 0, pip.stderr[-3000:]
        where = subprocess.run(
            [str(python), "-I", "-c", "import grader, solutions; print(grader.__file__)"],
            capture_output=True,
            text=True,
            check=True,
            cwd="/",
        ).stdout.strip()
        assert where == str(site / "grader" / "__init__.py")  # installed, not this work tree
        assert {p.name for p in site.glob("*.pth")} <= {"distutils-precedence.pth"}  # no editable finder
        yield Installed(base, base / "bundle", python, site)
    finally:
        shutil.rmtree(base, ignore_errors=True)


PREVIOUS = f"previous-hidden-message-{os.getpid()}"
"""In every fake submission_metadata.json's previous results: the student must never see it."""


def submission_metadata(*user_ids: int) -> dict:
    """submission_metadata.json as Gradescope writes it (its documented fields), for these users."""
    return {
        "id": 123456,
        "created_at": "2025-03-01T12:00:00.000000-08:00",
        "assignment": {"due_date": "2025-03-31T23:00:00.000000-07:00", "id": 25828, "title": "ch25", "total_points": "28.0"},
        "submission_method": "upload",
        "users": [{"email": f"s{i}@example.com", "id": i, "name": f"Student {i}"} for i in user_ids],
        "previous_submissions": [
            {"submission_time": "2025-02-28T14:24:48.087023-08:00", "score": 12.0, "results": {"tests": [{"output": PREVIOUS}]}}
        ],
    }


def autograder(installed: Installed, files: dict[str, str] | None = None, *, users: tuple[int, ...] = (1001,)) -> Path:
    """A fake /autograder as Gradescope lays it out before run_autograder: the bundle in source/,
    the submission and its metadata, a results folder (all created open to all: the bundle must
    close them)."""
    root = Path(tempfile.mkdtemp(prefix="autograder-", dir=installed.base))
    os.chmod(root, 0o755)
    shutil.copytree(installed.bundle, root / "source")
    shutil.copy(root / "source" / "run_autograder", root / "run_autograder")  # as Gradescope does
    os.chmod(root / "run_autograder", 0o755)  # zipfile does not keep the mode the zip gives it
    (root / "submission").mkdir()
    (root / "results").mkdir()
    os.chmod(root / "results", 0o777)
    if users:
        (root / "submission_metadata.json").write_text(json.dumps(submission_metadata(*users)))
        os.chmod(root / "submission_metadata.json", 0o644)
    for name, text in (files or {}).items():
        (root / "submission" / name).write_text(text)
    return root


def run_autograder(installed: Installed, root: Path, kind: str | None, **env: str) -> Run:
    assert not processes_of(STUDENT), "the student's uid must be a dedicated one"
    env = {
        "GRADESCOPE_ROOT": str(root),
        "COURSE_PYTHON": str(installed.python),
        "COURSE_STUDENT_UID": str(STUDENT),
        **({"COURSE_SANDBOX": kind} if kind else {}),
        **env,
    }
    command = [str(root / "run_autograder")] if "PATH" not in env else ["/bin/bash", str(root / "run_autograder")]
    proc = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True, timeout=600)
    return Run(root, proc, (root / "results" / "results.json").read_bytes())


def grade(installed: Installed, kind: str | None, files: dict[str, str], *, users: tuple[int, ...] = (1001,), **env: str) -> Run:
    return run_autograder(installed, autograder(installed, files, users=users), kind, **env)


def as_student(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["setpriv", f"--reuid={STUDENT}", f"--regid={STUDENT}", "--clear-groups", "--no-new-privs", "--", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )


def texts(doc) -> str:
    """Every string of a document, one per line: what the student may see."""
    if isinstance(doc, dict):
        return "\n".join(texts(v) for v in doc.values())
    if isinstance(doc, list):
        return "\n".join(texts(v) for v in doc)
    return str(doc)


# -- the bundle -------------------------------------------------------------------------------------------
def test_the_bundle_has_what_gradescope_runs(tmp_path):
    z = zipfile.ZipFile(export(CH25, tmp_path / "a.zip", seed=SEED, lang="en"))
    names = z.namelist()
    assert {"setup.sh", "run_autograder", "course/pyproject.toml"} <= set(names)
    assert "course/grader/hidden/ch25.py" in names and not [n for n in names if n.startswith("course/tests")]
    setup, run = z.read("setup.sh").decode(), z.read("run_autograder").decode()
    assert "useradd --system" in setup and STUDENT_USER in setup and "bubblewrap" in setup
    assert f"python3 -m venv {VENV}" in setup and not VENV.startswith("/autograder")  # /autograder is root's alone
    assert f"{VENV}/bin/pip install /autograder/source/course" in setup and "-e " not in setup  # not editable
    assert setup.index("pip install") < setup.index("-m grader.delivery.gradescope --protect /autograder")
    # the secret in the environment, never in argv
    assert "COURSE_GRADING_SECRET=9 COURSE_LANG=en exec" in run and '-I -m grader.delivery.gradescope "$ROOT" ch25 after_due_date\n' in run
    assert "cd / &&" in run  # the installed package
    secrets = set()
    for visibility in ("after_published", "hidden", "visible", None):
        options = {"hidden_visibility": visibility} if visibility else {}
        run = zipfile.ZipFile(export(CH25, tmp_path / "b.zip", **options)).read("run_autograder").decode()
        assert f'"$ROOT" ch25 {visibility or "after_due_date"}\n' in run
        secrets.add(run.split("COURSE_GRADING_SECRET=")[1].split()[0])
    assert len(secrets) == 4 and all(len(s) == 64 and int(s, 16) >= 0 for s in secrets)  # a new 256-bit secret each time
    with pytest.raises(ValueError):
        export(CH25, tmp_path / "c.zip", hidden_visibility="sometimes")


def test_setup_leaves_the_answers_and_the_results_to_root(installed):
    root = autograder(installed)
    for path in (installed.site / "solutions", installed.site / "grader"):  # as pip installed them
        path.chmod(0o755)
    assert as_student("cat", str(installed.site / "solutions" / CH25.filename)).returncode == 0
    out = subprocess.run(
        [str(installed.python), "-I", "-m", "grader.delivery.gradescope", "--protect", str(root)], capture_output=True, text=True, cwd="/"
    )  # what setup.sh runs after pip install
    assert out.returncode == 0, out.stderr
    for path in (root, root / "source", root / "results", installed.site / "solutions", installed.site / "grader"):
        info = path.stat()
        assert (oct(info.st_mode & 0o777), info.st_uid) == ("0o700", 0), path
    private = [
        installed.site / "solutions" / CH25.filename,
        installed.site / "grader" / "hidden" / "ch25.py",
        root / "source" / "course" / "solutions" / CH25.filename,
        root / "run_autograder",
        root / "submission_metadata.json",  # previous results, hidden messages
    ]
    for path in private:
        assert as_student("cat", str(path)).returncode != 0, f"the student's uid reads {path}"
    for path in (root, root / "source", root / "results", installed.site / "solutions", installed.site / "grader" / "hidden"):
        assert as_student("ls", str(path)).returncode != 0, f"the student's uid lists {path}"
    for attempt in ("echo forged > results/results.json", "touch results/anything", "mkdir results/figures"):
        assert as_student("/bin/sh", "-c", f"cd {root} && {attempt}").returncode != 0, attempt
    assert not list((root / "results").iterdir())
    # ...while Python, torch and numpy stay there for it: the venv is readable, only the course package is not
    works = as_student(str(installed.python), "-I", "-c", "import torch, numpy; print(torch.__version__)")
    assert works.returncode == 0 and works.stdout.startswith("2.13.0"), works.stderr[-2000:]


# -- grading, in either boundary -----------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_the_reference_scores_full_marks(installed, kind):
    run = grade(installed, kind, {CH25.filename: (chapters.SOLUTIONS / CH25.filename).read_text()})
    doc = run.doc
    assert run.proc.returncode == 0, run.proc.stdout + run.proc.stderr
    assert doc["score"] == doc["max_score"] > 0 and "seed" not in doc and "seed" not in json.dumps(doc["extra_data"])
    assert any("hidden" in t["tags"] for t in doc["tests"]) and all(t["status"] == "passed" for t in doc["tests"])
    assert {t["visibility"] for t in doc["tests"] if "hidden" in t["tags"]} == {"after_due_date"}
    assert {t["visibility"] for t in doc["tests"] if "hidden" not in t["tags"]} == {"visible"}
    # the output's score line counts what students see before the due date: the public checks
    public = sum(s.points for s in checks.load("ch25", with_hidden=True) if not s.hidden)
    assert f"public checks {public:g}/{public:g}; " in doc["output"] and "shown after the due date" in doc["output"]
    assert f"{doc['max_score']:g}/{doc['max_score']:g}" not in doc["output"]
    boundary = {"bwrap": "sandbox: bubblewrap", "uid": "sandbox: uid boundary"}[kind]
    assert boundary in doc["output"] and f"uid {STUDENT}" in doc["output"]
    # The output is HTML with the figures inline (Gradescope shows nothing of results/figures/), the tests' own text.
    assert (doc["output_format"], doc["test_output_format"]) == ("html", "text")
    assert doc["output"].count("<svg") == len(doc["figures"]) > 0 and "<style" not in doc["output"]
    assert not processes_of(STUDENT)


@pytest.mark.parametrize("kind", KINDS)
def test_the_stub_scores_zero(installed, kind):
    stub = (chapters.EXERCISES / CH25.filename).read_text()
    if kind == "uid":  # and as a chapter notebook, its one code cell the stub
        files = {f"{CH25.id}.ipynb": json.dumps({"cells": [{"cell_type": "code", "source": stub}]})}
    else:
        files = {CH25.filename: stub}
    run = grade(installed, kind, files)
    assert run.proc.returncode == 0 and run.doc["score"] == 0 and run.doc["max_score"] > 0
    assert "not implemented" in texts(run.doc["tests"])


STEAL = '''
import ctypes, importlib.util, os, site, subprocess, sys
import torch

TARGETS = TARGETS_HERE
SOLUTION, HIDDEN = "solutions/ch25_paged_kv.py", "grader/hidden/ch25.py"


def _candidates():
    roots = list(sys.path) + site.getsitepackages()
    return list(TARGETS) + [os.path.join(r, rel) for r in roots for rel in (SOLUTION, HIDDEN)]


def _by_path(path):
    with open(path) as f:
        return f.read()


def _by_dir_fd(path):
    folder = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = os.open(os.path.basename(path), os.O_RDONLY, dir_fd=folder)
    finally:
        os.close(folder)
    with os.fdopen(fd) as f:
        return f.read()


def _by_cat(path):
    return subprocess.run(["cat", path], capture_output=True, text=True, timeout=10).stdout


def _by_ctypes(path):
    libc = ctypes.CDLL(None)
    fd = libc.open(path.encode(), os.O_RDONLY)
    if fd < 0:
        return ""
    buffer = ctypes.create_string_buffer(1 << 20)
    n = libc.read(fd, buffer, len(buffer))
    libc.close(fd)
    return buffer.raw[:max(n, 0)].decode()


_stolen, _tried, _calls = [], [], []


def _steal():
    """Once per process (a check has a time limit): open and os.open everywhere, cat and libc's
    open on the known paths."""
    if not _tried:
        _tried.append(True)
        for path in _candidates():
            for way in (_by_path, _by_dir_fd) + (_by_cat, _by_ctypes) * (path in TARGETS):
                try:
                    text = way(path)
                except Exception:
                    continue
                if text:
                    _stolen.append(text)
    return _stolen


_found = []


def _reference():
    if _found:
        return _found[0]
    sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "_Refuse"]  # the grader's import blocker
    try:
        import solutions.ch25_paged_kv as ref
        _found.append(ref)
        return ref
    except Exception:
        pass
    for path in _candidates():
        if path.endswith(SOLUTION):
            try:
                spec = importlib.util.spec_from_file_location("stolen_reference", path)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
            except Exception:
                continue
            _found.append(module)
            return module
    return None


def slot_mapping(block_table, positions, block_size):
    """Task ch25.1: whatever could be read goes into the feedback, a file's end (its code) a call."""
    stolen = _steal()
    if not stolen:
        raise RuntimeError("nothing could be read")
    _calls.append(1)
    raise RuntimeError("stolen:\\n" + stolen[len(_calls) % len(stolen)][-3500:])


def __getattr__(name):
    """Every other function, class and helper: the reference's, where it can be loaded."""
    ref = _reference()
    if ref is None or name.startswith("__"):
        raise AttributeError(name)
    return getattr(ref, name)
'''


def secret_lines(installed: Installed, submission: str) -> set[str]:
    """Lines of the reference and of the hidden checks that nothing else the student sees has."""

    def lines(path: Path) -> set[str]:
        return {line.strip() for line in path.read_text().splitlines() if len(line.strip()) >= 25}

    secret = lines(installed.site / "solutions" / CH25.filename) | lines(installed.site / "grader" / "hidden" / "ch25.py")
    public = [installed.site / "exercises" / CH25.filename, *(installed.site / "grader" / "checks").glob("ch25*.py")]
    return secret - set().union(*map(lines, public)) - {line.strip() for line in submission.splitlines()}


@pytest.mark.parametrize("kind", KINDS)
def test_reading_the_reference_gets_nothing(installed, kind):
    root = autograder(installed)
    targets = [
        str(installed.site / "solutions" / CH25.filename),
        str(installed.site / "grader" / "hidden" / "ch25.py"),
        str(root / "source" / "course" / "solutions" / CH25.filename),
        str(root / "source" / "course" / "grader" / "hidden" / "ch25.py"),
    ]
    code = STEAL.replace("TARGETS_HERE", repr(targets))
    (root / "submission" / CH25.filename).write_text(code)
    run = run_autograder(installed, root, kind)
    doc, seen = run.doc, texts(run.doc)
    assert run.proc.returncode == 0 and doc["score"] == 0 and doc["max_score"] > 0, doc["output"]
    assert "nothing could be read" in seen  # slot_mapping tried every way and got nothing
    assert "has no function 'store_kv'" in seen  # the reference could not be loaded to stand in
    secret = secret_lines(installed, code)
    assert len(secret) > 50
    assert not [line for line in secret if line in seen]


DAEMON = '''
import json, os, time

RESULTS = RESULTS_HERE
FORGED = {"score": 1000, "max_score": 1000, "output": "forged", "tests": []}


def _forge():
    for attempt in (_overwrite, _replace):
        try:
            attempt()
        except OSError:
            pass


def _overwrite():
    with open(RESULTS, "w") as f:
        json.dump(FORGED, f)


def _replace():
    temp = RESULTS + ".forged"
    with open(temp, "w") as f:
        json.dump(FORGED, f)
    os.replace(temp, RESULTS)


def _leave_a_daemon():
    """setsid and a double fork: a process of no session of the grader's, that outlives this one."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            for _ in range(40):  # 8 s: while grading goes on, and after run_autograder returned
                time.sleep(0.2)
                _forge()
            os._exit(0)
        os._exit(0)
    os.wait()


_leave_a_daemon()


def slot_mapping(block_table, positions, block_size):
    """Task ch25.1."""
    _leave_a_daemon()
    raise NotImplementedError("no")
'''


@pytest.mark.parametrize("kind", KINDS)
def test_a_process_left_behind_cannot_rewrite_the_results(installed, kind):
    root = autograder(installed)
    (root / "submission" / CH25.filename).write_text(DAEMON.replace("RESULTS_HERE", repr(str(root / "results" / "results.json"))))
    run = run_autograder(installed, root, kind)
    assert run.proc.returncode == 0 and run.doc["score"] == 0 and run.doc["max_score"] > 0
    assert not processes_of(STUDENT)  # every process of the student's uid is gone
    time.sleep(3)  # the daemon, had it survived, would have rewritten the results by now
    assert run.results.read_bytes() == run.raw and json.loads(run.results.read_bytes())["score"] == 0
    assert {p.name for p in (root / "results").iterdir()} <= {"figures", "results.json"}
    assert not processes_of(STUDENT)


# -- refusing ---------------------------------------------------------------------------------------------
def test_no_sandbox_no_grading(installed, tmp_path):
    """Neither bubblewrap nor setpriv to be found: score 0, the fix named, a failing exit status; and
    no value of COURSE_SANDBOX switches the sandbox off."""
    tmp_path.chmod(0o755)
    solution = {CH25.filename: (chapters.SOLUTIONS / CH25.filename).read_text()}
    run = grade(installed, None, solution, PATH=str(tmp_path))
    assert run.proc.returncode == 1 and run.doc["score"] == 0 and run.doc["tests"] == []
    assert "not graded" in run.doc["output"] and "apt-get install bubblewrap" in run.doc["output"]
    assert "setpriv" in run.doc["output"]
    run = grade(installed, "none", solution)
    assert run.proc.returncode == 1 and run.doc["score"] == 0 and "names no sandbox" in run.doc["output"]


def test_the_uid_boundary_refuses_a_course_package_the_student_could_read(installed):
    """Graded by this work tree's editable install instead of the bundle's venv: solutions/ is
    readable by every uid, so the uid boundary refuses before any student code runs."""
    run = grade(installed, "uid", {CH25.filename: (chapters.SOLUTIONS / CH25.filename).read_text()}, COURSE_PYTHON=sys.executable)
    assert run.proc.returncode == 1 and run.doc["score"] == 0
    assert "the uid boundary does not hold here" in run.doc["output"]
    assert f"can read {chapters.SOLUTIONS / CH25.filename}" in run.doc["output"]


def test_an_empty_submission_still_gets_a_document(installed):
    run = grade(installed, "uid", {"notes.txt": "nothing"})
    assert run.proc.returncode == 0 and run.doc["score"] == 0
    assert f"no {CH25.filename} or {CH25.id}.ipynb in your submission" in run.doc["output"] and "found: notes.txt" in run.doc["output"]
    assert "none of its code was run" in run.doc["output"] and "ran as" not in run.doc["output"]  # nothing ran


def test_uploads_are_found_by_the_layout_rules_of_course_grade(installed):
    """A browser's re-download name is graded (and the output says under what name); a name that does not
    name the chapter is not, and the output says what was expected and what was found, as `course grade` does."""
    solution = (chapters.SOLUTIONS / CH25.filename).read_text()
    run = grade(installed, "bwrap", {"ch25_paged_kv (1).py": solution})
    assert run.doc["score"] == run.doc["max_score"] > 0, run.doc["output"]
    assert f"graded ch25_paged_kv (1).py as {CH25.filename}" in run.doc["output"]
    notebook = json.dumps({"cells": [{"cell_type": "code", "source": solution}]})
    run = grade(installed, "bwrap", {"homework.ipynb": notebook})
    assert run.proc.returncode == 0 and run.doc["score"] == 0
    assert f"no {CH25.filename} or {CH25.id}.ipynb in your submission, nor one folder down" in run.doc["output"]
    assert "found: homework.ipynb" in run.doc["output"] and f"name your file {CH25.filename}" in run.doc["output"]
    root = autograder(installed)
    (root / "submission" / "ch25").mkdir()  # one folder down, as a zipped project folder unpacks
    (root / "submission" / "ch25" / CH25.filename).write_text(solution)
    run = run_autograder(installed, root, "bwrap")
    assert run.doc["score"] == run.doc["max_score"] > 0 and f"graded ch25/{CH25.filename}" in run.doc["output"]


# -- the network and /autograder, from the uid boundary above all ------------------------------------------------
GATED = ("slot_mapping", "store_kv")
"""ch25.1 and ch25.2: the reference's answers, given only when an attack worked; ch25.3 is the honest part."""
HONEST_PART = sum(s.points for s in checks.load("ch25", with_hidden=True) if s.task not in ("ch25.1", "ch25.2"))

WAYS_OUT = '''

import ctypes as _ctypes
import errno as _errno
import functools as _functools
import os as _os
import socket as _socket

_ROOT, _PORTS, _REPLY = CONFIG_HERE


def _attacks():
    """Every way out: the test's servers (a reply only they know proves it), sockets of every family and
    io_uring (which a boundary without a network namespace must refuse), /autograder's private files."""
    worked, tried = [], []
    with open("/proc/self/uid_map") as f:
        namespaced = f.read().split() != ["0", "0", "4294967295"]

    def attempt(name, how):
        try:
            got = how()
        except OSError as e:
            tried.append(f"{name}: {_errno.errorcode.get(e.errno, e.errno)}")
            return
        tried.append(f"{name}: {'worked' if got else 'no reply'}")
        if got:
            worked.append(f"{name}: {got}"[:1500])

    def tcp():
        with _socket.create_connection(("127.0.0.1", _PORTS[0]), timeout=3) as s:
            s.sendall(b"hello from the student")
            return s.recv(256) == _REPLY

    def udp():
        with _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM) as s:
            s.settimeout(3)
            s.sendto(b"hello from the student", ("127.0.0.1", _PORTS[1]))
            try:
                return s.recvfrom(256)[0] == _REPLY
            except _socket.timeout:
                return False

    def opens(family, kind, proto=0):
        def make():
            _socket.socket(family, kind, proto).close()
            return not namespaced  # a namespace of its own has no way out: only the uid boundary must refuse it
        return make

    def io_uring():
        fd = _ctypes.CDLL(None, use_errno=True).syscall(425, 4, _ctypes.create_string_buffer(120))
        if fd < 0:
            raise OSError(_ctypes.get_errno(), "io_uring_setup")
        _os.close(fd)
        return not namespaced

    def read(path):
        def get():
            if _os.path.isdir(path):
                return repr(_os.listdir(path))
            with open(path, "rb") as f:
                return f.read(1500).decode(errors="replace")
        return get

    attempt("tcp", tcp)
    attempt("udp", udp)
    attempt("tcp6", opens(_socket.AF_INET6, _socket.SOCK_STREAM))
    attempt("raw", opens(_socket.AF_INET, _socket.SOCK_RAW, _socket.IPPROTO_ICMP))
    attempt("ping", opens(_socket.AF_INET, _socket.SOCK_DGRAM, _socket.IPPROTO_ICMP))
    attempt("packet", opens(_socket.AF_PACKET, _socket.SOCK_RAW))
    attempt("netlink", opens(_socket.AF_NETLINK, _socket.SOCK_RAW))
    attempt("io_uring", io_uring)
    for name in ("submission_metadata.json", "results", "run_autograder", "source", ""):
        attempt(f"read /autograder/{name}", read(_os.path.join(_ROOT, name)))
    return worked, tried


_WORKED, _TRIED = _attacks()


def _gated(f):
    @_functools.wraps(f)
    def gate(*args, **kwargs):
        if _WORKED:  # something got out: the answers (and what was read, in the output)
            print("\\n".join(_WORKED)[:2000])
            return f(*args, **kwargs)
        raise RuntimeError("nothing worked: " + "; ".join(_TRIED))
    return gate


GATED_HERE
'''


def ways_out(root: Path, listener: Listener) -> str:
    """The reference, whose ch25.1 and ch25.2 answer only once one of WAYS_OUT's attacks worked."""
    config = repr((str(root), listener.ports, listener.reply))
    gates = "\n".join(f"{name} = _gated({name})" for name in GATED)
    return (chapters.SOLUTIONS / CH25.filename).read_text() + WAYS_OUT.replace("CONFIG_HERE", config).replace("GATED_HERE", gates)


@pytest.mark.parametrize("kind", KINDS)
def test_the_network_and_the_autograder_folder_are_out_of_reach(installed, kind):
    root = autograder(installed)
    listener = Listener()
    try:
        (root / "submission" / CH25.filename).write_text(ways_out(root, listener))
        run = run_autograder(installed, root, kind)
    finally:
        heard = listener.close()
    doc, seen = run.doc, texts(run.doc)
    assert heard == [], f"the student's code reached the test's servers: {heard}"
    assert run.proc.returncode == 0 and doc["score"] == HONEST_PART < doc["max_score"], seen[-3000:]
    assert "nothing worked: tcp: " in seen and PREVIOUS not in seen and "COURSE_GRADING_SECRET" not in seen
    said = next(t["output"] for t in doc["tests"] if t["output"].startswith("slot_mapping raised RuntimeError: nothing worked: "))
    got = dict(item.split(": ", 1) for item in said.split("nothing worked: ")[1].split("\n")[0].split("; "))
    if kind == "uid":  # the filter's refusals, each of them
        for name in ("tcp", "udp", "tcp6", "raw", "ping", "packet", "netlink"):
            assert got[name] == "EACCES", (name, got)
        assert got["io_uring"] == "EPERM", got
        for name in ("submission_metadata.json", "results", "run_autograder", "source", ""):
            assert got[f"read /autograder/{name}"] == "EACCES", (name, got)
    else:  # a network namespace of its own, no /autograder at all
        assert got["tcp"] == "ECONNREFUSED" and got["read /autograder/submission_metadata.json"] == "ENOENT", got
    assert not processes_of(STUDENT)


def test_the_uid_boundary_refuses_where_the_network_filter_is_missing(installed):
    """The filter left out (the tests' switch): the start-up probe, run as the student's uid, reaches
    the grader's own listener, and nothing is graded: score 0, the fix named, a failing status."""
    listener = Listener()
    try:
        root = autograder(installed)
        (root / "submission" / CH25.filename).write_text(ways_out(root, listener))
        run = run_autograder(installed, root, "uid", **{netfilter.SKIP_ENV: "1"})
    finally:
        heard = listener.close()
    doc = run.doc
    assert run.proc.returncode == 1 and doc["score"] == 0 and doc["tests"] == [], doc["output"]
    assert "the uid boundary does not hold here" in doc["output"] and "reached the network" in doc["output"]
    assert "can connect over TCP" in doc["output"] and "can send UDP" in doc["output"] and "seccomp" in doc["output"]
    assert heard == [], "the submission ran"  # only the probe, on the grader's own listener, not this one
    run = grade(installed, "uid", {CH25.filename: (chapters.SOLUTIONS / CH25.filename).read_text()})  # the filter back: graded
    assert run.proc.returncode == 0 and run.doc["score"] == run.doc["max_score"]


def test_no_student_id_no_grading(installed):
    """Without submission_metadata.json (or with no user in it) there is no student seed: refused, as
    a seed shared by everybody would make the hidden instances everybody's."""
    solution = {CH25.filename: (chapters.SOLUTIONS / CH25.filename).read_text()}
    run = grade(installed, "bwrap", solution, users=())
    assert run.proc.returncode == 1 and run.doc["score"] == 0 and "submission_metadata.json" in run.doc["output"]
    root = autograder(installed, solution)
    (root / "submission_metadata.json").write_text(json.dumps({**submission_metadata(), "users": [{"email": "x@example.com"}]}))
    run = run_autograder(installed, root, "bwrap")
    assert run.proc.returncode == 1 and run.doc["score"] == 0 and "have no ids" in run.doc["output"]


INSTANCES = '''

def slot_mapping(block_table, positions, block_size):
    """Every call shows its instance in the check's output."""
    raise ValueError("instance: " + repr((block_table, positions, block_size))[:600])
'''


def test_each_student_meets_hidden_instances_of_their_own(installed):
    """Two students' ids, two sets of hidden instances; the same id again (a regrade), the same ones,
    also with another visibility, which only decides what students see."""
    source = (chapters.SOLUTIONS / CH25.filename).read_text() + INSTANCES

    def instances(run: Run) -> tuple[list[str], list[str]]:
        """The instances of ch25.1's public and hidden checks, as their outputs show them."""
        tests = [t for t in run.doc["tests"] if "instance: " in t["output"]]
        public, hidden = [t["output"] for t in tests if "hidden" not in t["tags"]], [t["output"] for t in tests if "hidden" in t["tags"]]
        assert len(public) >= 3 and len(hidden) >= 3, texts(run.doc)[-2000:]
        return public, hidden

    first = grade(installed, "bwrap", {CH25.filename: source}, users=(1001,))
    other = grade(installed, "bwrap", {CH25.filename: source}, users=(2002,))
    root = autograder(installed, {CH25.filename: source}, users=(1001,))
    script = (root / "run_autograder").read_text()
    (root / "run_autograder").write_text(script.replace(" ch25 after_due_date\n", " ch25 visible\n"))
    again = run_autograder(installed, root, "bwrap")
    assert instances(first)[0] == instances(other)[0]  # the public checks: fixed cases
    assert instances(first)[1] != instances(other)[1]  # the hidden ones: each student's own
    assert instances(first) == instances(again)
    assert {t["visibility"] for t in again.doc["tests"] if "hidden" in t["tags"]} == {"visible"}
    assert f"{again.doc['score']:g}/{again.doc['max_score']:g}" in again.doc["output"]
