"""The second security review's attack classes (issue 22) that the sandbox and the trusted writer answer, in the
channels each applies to, as root and as an unprivileged user (uid 65534, with the venv tests/test_attacks.py
builds): every verdict is made from outside, and honest students in the same runs keep full marks.

- figures through links: a submission carrying a pyproject.toml and a course-figures/ tree of planted links (to
  files of the grader's user, and a folder link), graded with `course check --submission` from inside it, from
  outside it, with `--notebook` and `check all --submission`: no victim changes, no file appears outside;
- the box's /dev: 200 MiB written to /dev/shm and /dev at import: the system's tmpfs pages (Shmem) never grow by
  more than the box's small /dev/shm;
- memory across processes: four forked children touching 700 MiB each: stopped by the box's one budget, and the
  box's processes never hold much more than the budget at once;
- processes per box: a student who parks hundreds of processes beside an honest classmate graded at the same
  time (`course grade --jobs 2`): the classmate keeps full marks;
- a measured check passed by a helper process (ch16's "no copy", the copy made by an exec'd Python): measured;
- a stride-0 tensor of a few bytes standing for gigabytes: refused at the wire, the grader's memory stays small.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path

import pytest
from test_attacks import CH, FULL, ROOT, SEED, User, base, nobody_user, root_user, run, sandbox_works  # noqa: F401 (fixtures)

from grader import chapters, checks

pytestmark = pytest.mark.slow
BOUND = 150.0
ANSWER = (chapters.SOLUTIONS / CH.filename).read_text()
CH16 = chapters.find("ch16")
FULL16 = sum(s.points for s in checks.load("ch16", with_hidden=True) if s.task == "ch16.1")


@pytest.fixture(params=["root", "nobody"])
def user(request) -> User:
    return request.getfixturevalue(f"{request.param}_user")


def scratch(base: Path, user: User, name: str) -> Path:
    folder = base / f"{name}-{user.name}-{time.monotonic_ns()}"
    folder.mkdir()
    user.give(folder)
    return folder


def score(text: str) -> float | None:
    try:
        return float(json.loads(text)["score"])
    except (ValueError, KeyError, TypeError):
        return None


# -- figures through links ----------------------------------------------------------------------------------------
def planted(work: Path, user: User) -> tuple[Path, dict[Path, str]]:
    """A submission folder that looks like a project and whose figure files are links to the user's own files."""
    sub = work / "sub"
    (sub / "course-figures" / CH.id).mkdir(parents=True)
    (sub / "pyproject.toml").write_text('[project]\nname = "alice"\n')
    (sub / CH.filename).write_text(ANSWER)
    victims = {}
    for spec_id in ("ch17-causal-mask", "ch17-offset-mask"):
        victim = work / f"victim-{spec_id}"
        victim.write_text(f"VICTIM {spec_id}\n")
        victims[victim] = victim.read_text()
        (sub / "course-figures" / CH.id / f"{spec_id}.svg").symlink_to(victim)
    elsewhere = work / "victim-folder"
    elsewhere.mkdir()
    victims[elsewhere] = ""
    user.give(work)
    return sub, victims


def unchanged(victims: dict[Path, str]) -> list[str]:
    changed = []
    for path, text in victims.items():
        if path.is_dir():
            if list(path.iterdir()):
                changed.append(f"{path} now holds {[p.name for p in path.iterdir()]}")
        elif path.read_text() != text:
            changed.append(f"{path} was written")
    return changed


def test_figures_are_never_written_through_a_submissions_links(user, base):
    work = scratch(base, user, "links")
    sub, victims = planted(work, user)
    # 1. the TA grades from inside the submission: course-figures/ there is the default; its links are replaced, not followed
    r = run(user, user.course("check", CH.id, "--submission", sub, "--json", "--seed", SEED), "inside", cwd=sub, timeout=BOUND)
    assert score(r.stdout) == FULL, r.stdout[-2000:] + r.stderr[-2000:]
    assert not unchanged(victims), unchanged(victims)
    drawn = sub / "course-figures" / CH.id / "ch17-causal-mask.svg"
    assert drawn.is_file() and not drawn.is_symlink() and "<svg" in drawn.read_text(), "the link itself was replaced"
    # 2. from outside it: the submission's pyproject.toml is no project root; figures go to the current folder
    again, _ = planted(scratch(base, user, "links-out"), user)
    outside = scratch(base, user, "cwd")
    r = run(user, user.course("check", CH.id, "--submission", again, "--json", "--seed", SEED), "outside", cwd=outside, timeout=BOUND)
    assert score(r.stdout) == FULL
    assert (outside / "course-figures" / CH.id / "ch17-causal-mask.svg").is_file()
    assert (again / "course-figures" / CH.id / "ch17-causal-mask.svg").is_symlink(), "nothing written inside the submission"
    # 3. course-figures itself a link to a folder: refused, nothing lands there
    third = scratch(base, user, "folder-link")
    (third / CH.filename).write_text(ANSWER)
    (third / "course-figures").symlink_to(work / "victim-folder")
    user.give(third)
    r = run(user, user.course("check", CH.id, "--submission", third, "--seed", SEED), "folder link", cwd=third, timeout=BOUND)
    assert "is a link or not a folder" in r.stdout, r.stdout[-2000:]
    assert not unchanged(victims), unchanged(victims)


def test_a_notebook_and_check_all_never_write_through_links_either(user, base):
    from grader.delivery.notebook import chapter_notebook

    work = scratch(base, user, "links-nb")
    sub, victims = planted(work, user)
    (sub / "ch17.ipynb").write_text(json.dumps(chapter_notebook(CH)))  # the source notebook: the reference's answers
    user.give(sub)
    argv = user.course("check", CH.id, "--notebook", sub / "ch17.ipynb", "--json", "--seed", SEED)
    r = run(user, argv, "notebook", cwd=sub, timeout=BOUND)
    assert score(r.stdout) == FULL, r.stdout[-2000:] + r.stderr[-2000:]
    assert not unchanged(victims), unchanged(victims)
    (sub / "course-figures" / CH.id / "ch17-causal-mask.svg").unlink()  # planted again for the next channel
    (sub / "course-figures" / CH.id / "ch17-causal-mask.svg").symlink_to(work / "victim-ch17-causal-mask")
    r = run(user, user.course("check", "all", "--submission", sub, "--json", "--seed", SEED), "all", cwd=sub, timeout=BOUND)
    assert score(r.stdout) == FULL, r.stdout[-2000:] + r.stderr[-2000:]
    assert not unchanged(victims), unchanged(victims)


# -- the box's /dev, memory across processes ----------------------------------------------------------------------
def shmem() -> int:
    """Bytes of tmpfs and shared memory pages on the whole machine (/proc/meminfo's Shmem)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Shmem:"):
            return int(line.split()[1]) * 1024
    return 0


class Sampler(threading.Thread):
    """The largest value `read()` took while running."""

    def __init__(self, read) -> None:
        super().__init__(daemon=True)
        self.read, self.peak, self.done = read, 0, threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.02):
            self.peak = max(self.peak, self.read())

    def __enter__(self) -> Sampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.join()


FILL_DEV = """
def _fill():
    for path in ("/dev/shm/filler", "/dev/filler", "/dev/null-planted"):
        try:
            with open(path, "wb") as f:
                for _ in range(200):
                    f.write(b"x" * (1 << 20))
        except OSError:
            pass
_fill()
"""


def test_the_box_dev_holds_no_more_than_its_small_shm(user, base):
    work = scratch(base, user, "dev")
    (work / CH.filename).write_text(FILL_DEV + ANSWER)
    user.give(work)
    before = shmem()
    with Sampler(shmem) as seen:
        r = run(user, user.course("check", CH.id, "--submission", work, "--json", "--seed", SEED), "dev", cwd=work, timeout=BOUND)
    assert score(r.stdout) == FULL, "writing in /dev costs nothing but the space it does not get"
    assert seen.peak - before < 100 << 20, f"the machine's tmpfs pages grew by {(seen.peak - before) >> 20} MiB"


FORK_AND_TOUCH = """
import os, time
_kids = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        _block = b"x" * (700 << 20)
        time.sleep(20)
        os._exit(0)
    _kids.append(pid)
for pid in _kids:
    os.waitpid(pid, 0)
"""


def boxed_memory() -> int:
    """Bytes of memory held now by this test's sandboxed processes (descendants of this process in a pid namespace of
    their own), each page shared between them counted once (the sum of their PSS)."""
    from grader.isolation import procs

    total = 0
    for pid in procs.descendants(os.getpid()):
        try:
            if len(procs.status(pid).get("NSpid", "").split()) < 2:
                continue
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        total += sum(int(line.split()[1]) * 1024 for line in rollup.splitlines() if line.startswith("Pss:"))
    return total


def test_one_budget_holds_every_process_of_the_box(user, base):
    work = scratch(base, user, "fork")
    (work / CH.filename).write_text(FORK_AND_TOUCH + ANSWER)
    user.give(work)
    with Sampler(boxed_memory) as seen:
        r = run(user, user.course("check", CH.id, "--submission", work, "--json", "--seed", SEED), "fork", cwd=work, timeout=BOUND)
    doc = json.loads(r.stdout)
    assert doc["score"] == 0 and "ran out of memory" in json.dumps(doc), r.stdout[-2000:]
    assert seen.peak < (2 << 30) + (768 << 20), f"the box held {seen.peak >> 20} MiB at once (budget 2 GiB + its warm process)"


PARK = """
import os, time
for _ in range(400):
    try:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
    except OSError:
        break
"""


def test_a_students_processes_never_take_a_classmates(user, base):
    work = scratch(base, user, "nproc")
    subs, out = work / "subs", work / "out"
    for name, text in (("a-parks", PARK + ANSWER), ("b-honest", ANSWER), ("c-honest", ANSWER)):
        (subs / name).mkdir(parents=True)
        (subs / name / CH.filename).write_text(text)
    user.give(work)
    argv = user.course("grade", subs, "--chapter", CH.id, "--out", out, "--jobs", 2, "--seed", SEED)
    run(user, argv, "class", cwd=work, timeout=3 * BOUND)
    scores = {s: json.loads((out / s / CH.id / "results.json").read_text())["score"] for s in ("b-honest", "c-honest")}
    assert scores == {"b-honest": FULL, "c-honest": FULL}, scores


# -- measured checks, the wire -----------------------------------------------------------------------------------
HELPER_COPY = """
import subprocess, sys

def split_heads(x, num_heads):
    _check_split(x, num_heads)
    if x.numel() >= 1 << 20:  # the measured case: the copy is made by a helper of its own
        subprocess.run([sys.executable, "-c", "import time; b = b'x' * (64 << 20); time.sleep(0.5)"], check=True)
    B, T, width = x.shape
    return x.view(B, T, num_heads, width // num_heads).transpose(1, 2)
"""


def test_a_helper_process_is_measured_with_the_call(user, base):
    work = scratch(base, user, "helper")
    source = (chapters.SOLUTIONS / CH16.filename).read_text()
    (work / CH16.filename).write_text(source + HELPER_COPY)  # the later definition wins
    user.give(work)
    r = run(
        user,
        user.course("check", CH16.id, "--submission", work, "--json", "--seed", SEED, "--task", "ch16.1"),
        "h",
        cwd=work,
        timeout=BOUND,
    )
    tests = {t["name"]: t for t in json.loads(r.stdout)["tests"]}
    measured = next(t for name, t in tests.items() if "no number is copied" in name)
    assert measured["score"] == 0 and re.search(r"used (about|at least) \d+", measured["output"]), measured["output"]


STRIDE0 = """
import torch

def causal_mask(T, S=None, offset=None):
    return torch.zeros(1, dtype=torch.bool).expand(1 << 20, 1 << 14)  # 16 GiB described by one byte
"""


MAXRSS = (
    "import resource, subprocess, sys; p = subprocess.run(sys.argv[1:]); "
    "print(f'maxrss={resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}', file=sys.stderr); sys.exit(p.returncode)"
)
"""Run a command and print the largest resident size (KiB) of any process it waited for."""


def test_a_stride_0_tensor_is_refused_at_the_wire(user, base):
    work = scratch(base, user, "stride")
    (work / CH.filename).write_text(ANSWER + STRIDE0)
    user.give(work)
    course = user.course("check", CH.id, "--submission", work, "--json", "--seed", SEED)
    argv = [*course[: len(user.prefix)], str(user.bin / "python"), "-c", MAXRSS, *course[len(user.prefix) :]]
    r = run(user, argv, "stride", cwd=work, timeout=BOUND)
    assert "larger than the 128 MiB any value may be" in r.stdout, r.stdout[-2000:]
    peak = re.search(r"maxrss=(\d+)", r.stderr)
    assert peak and int(peak.group(1)) < 1_500_000, f"the grader's peak resident size: {r.stderr[-300:]}"
