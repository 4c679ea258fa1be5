"""The attacks of shared/reviews/security.md, in every channel that grades somebody else's code,
as root and as an unprivileged user: each must fail, and every verdict here is made from outside.

The hostile submissions are ch17 modules in tests/attacks/ (data, never imported here):

- kitchen_sink.py tries, a few per call, everything that does not disrupt the grader: reading the
  reference and the hidden checks (open, a directory fd, `cat`, ctypes, a hard link, import with the
  import refusal removed, /proc/<pid>/root and /cwd, a walk of the file system, inherited fds: S1, S5,
  S6), planting files (a .pyc in figures/__pycache__, a .pth in site-packages, files in the checkout,
  the venvs, other students' folders and results, /tmp: S2, S6), opening grader files and other
  students' files for writing, /proc/<pid>/mem read-write and ptrace on its ancestors and the grader's
  processes (H2, M3), the grader's environment and process list (M1, M2), an earlier student's
  leftovers (H3), filling /tmp and the home folder past the box's 64 MiB (M4), the network (TCP and
  UDP to this module's own servers on 127.0.0.1, and without a network namespace any socket but AF_UNIX
  and io_uring), the files a channel keeps from its students (Gradescope's submission_metadata.json with
  earlier results, the results folder, run_autograder with the bundle's secret), and processes left
  behind (a session leader, a double fork, sleeps: S3, H1, D5) that rewrite results files with full
  marks, plant files and kill later students' processes. Whatever works turns its answers right, so
  any score above 0 is a hole (its "HOLE ..." lines, when the channel kept them, say which);
- stopper.py (alone: it disrupts): a fork bomb (D5), replies too large to read and forged frames
  (D4), its pipes shrunk, then SIGSTOP to its ancestors: the warm process and, were they visible, the
  grader's (D2);
- killer.py (alone): SIGKILL to its ancestors and to everything it may signal (D1, H1);
- a victim: the reference plus a few lines that leave a secret in /tmp, the home and working folders
  and print it: the honest student before and after the hostile ones (H3; it must score 20 each time).

Channels: `course check --submission --json` ("check"), `course check --notebook` ("notebook": a
chapter notebook whose answer cells hold the module), `course grade --jobs 1` with the hostile
students sorted between two honest ones ("grade"), the Gradescope bundle's run_autograder, installed
as setup.sh installs it ("gradescope"), `course grade --nbgrader` on an nbgrader course made with
`nbgrader generate_assignment` ("nbgrader"). The disruptive modules run where a submission has a
process tree of its own and a later student to harm (check, grade, gradescope); the notebook channels
get the kitchen sink and the honest ones. Users: root (this process, the editable .venv) and uid 65534
through setpriv, with a venv built once per session by a regular, non-editable `pip install` of a copy
of the checkout (its dependencies hard-linked from .venv first, as tests/test_gradescope.py does:
about 10 s instead of minutes of unpacking torch). Gradescope runs run_autograder as root only, so
there the two variants are its two boundaries: bubblewrap, and the uid boundary (the student's code as
an unprivileged uid without namespaces), the latter in a mount and pid namespace of its own that
stands for Gradescope's container (this machine's checkout, /tmp, /root and /home out of sight).
Everything skips when `grader.isolation.sandbox.probe()` says no sandbox can be made; the
unprivileged variants skip when setpriv or user namespaces are unavailable to uid 65534.

Asserted from outside, per channel and user: each hostile student's score is what its honest part
earns (0) and the honest ones get exactly theirs (20); every run ends within its bound and no process
of the grader is ever seen stopped; no process of a submission is alive afterwards (by the marker in
their argv, by the pids seen in the run's process tree in a pid namespace of their own, and as root by
the box uids seen); no file outside the boxes changed (every folder the attacks aimed at, the
unprivileged venv file by file, anything new in /tmp or the checkout that carries this session's
token); the grader's canary variable, the solution regions of the reference, the hidden checks' lines
and the victim's secret and the earlier results of Gradescope's metadata never reach what a channel
printed or wrote; this module's servers hear nothing; results files are the same 1 s after the run
(S3); and the trusted side's memory stays bounded (D4). One more test: without
bubblewrap, grading somebody else's code refuses, naming the fix, unless --no-sandbox (which warns).

The whole module takes about 5 minutes on this 2-core machine (each sandboxed run 3 to 6 s, the
disruptive ones about 20 s: they wait out time limits); `-k check-root` and the like run one campaign.
"""

from __future__ import annotations

import glob
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import missing, require_root, require_sandbox
from linkedvenv import link_distributions
from netlisten import Listener

from grader import chapters, checks

pytestmark = pytest.mark.slow  # grades submissions, builds releases or runs real tools: not in the fast loop

ROOT = chapters.ROOT
CH = chapters.find("ch17")
FULL = sum(s.points for s in checks.load("ch17", with_hidden=True))
ATTACKS = Path(__file__).parent / "attacks"
CHECKOUT = Path(__file__).resolve().parents[1]
"""This source tree: readable by every uid on a CI machine, absent from a Gradescope container."""
TOKEN = secrets.token_hex(5)
RUN_TAG = f"graderrun{TOKEN}"
"""In the argv of every grader command this module starts: how the attacks would recognise one."""
PROC_MARK = f"hostileproc{TOKEN}"
"""In the argv of every process the attacks leave behind."""
FILE_MARK = f"zz_attack_{TOKEN}"
"""In the name of every file the attacks plant."""
CANARY = f"canary-{TOKEN}-{secrets.token_hex(4)}"
VICTIM_PREFIX = f"victimsecret{TOKEN}"
VICTIM = VICTIM_PREFIX + secrets.token_hex(6)
NOBODY = 65534
HOST_UID_BASE = 200_000
RUN_BOUND = 150.0
"""Seconds one student's run may take, whatever it does (this 2-core machine is often shared)."""
SEED = 1
PREVIOUS = f"previousresults{TOKEN}"
"""In every Gradescope submission_metadata.json, as an earlier submission's hidden message: no student may see it."""
SERVERS: list[Listener] = []
"""This module's TCP and UDP servers on 127.0.0.1 (started with `base`): the attacks aim at them."""

HOSTILE = ("kitchen_sink", "stopper", "killer")


def _solution_lines() -> list[str]:
    lines, inside = [], False
    for line in (chapters.SOLUTIONS / CH.filename).read_text().splitlines():
        if "### BEGIN SOLUTION" in line:
            inside = True
        elif "### END SOLUTION" in line:
            inside = False
        elif inside and len(line.strip()) >= 12:
            lines.append(line.strip())
    return lines


def _hidden_lines() -> list[str]:
    public = (ROOT / "grader" / "checks" / "ch17.py").read_text()
    out = []
    for line in (ROOT / "grader" / "hidden" / "ch17.py").read_text().splitlines():
        s = line.strip()
        if len(s) >= 20 and s not in public and not s.startswith(("from ", "import ", "#", '"""')):
            out.append(s)
    return out


SECRET_LINES = _solution_lines() + _hidden_lines()


# -- who runs the channels --------------------------------------------------------------------------------
@dataclass
class User:
    name: str
    prefix: list[str]
    bin: Path
    uid: int
    home: Path
    site: Path
    venv: Path | None = None

    def course(self, *args: str) -> list[str]:
        return [*self.prefix, str(self.bin / "course"), *map(str, args)]

    def give(self, *paths: Path) -> None:
        """Make `paths` (recursively) this user's, so it can write there."""
        if not self.uid:
            return
        for top in paths:
            for p in [top, *Path(top).rglob("*")]:
                os.lchown(p, self.uid, self.uid)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "COURSE_"))}
        env.update(COURSE_CANARY=CANARY, COURSE_STATE_DIR=str(self.home / "state"), HOME=str(self.home))
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
        return env


@pytest.fixture(scope="session")
def sandbox_works():
    return require_sandbox("bwrap")


@pytest.fixture(scope="session")
def base(sandbox_works):
    """A world-readable scratch folder for everything this module makes; cleaned up, with whatever
    the attacks left, at the end."""
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix=f"attacks-{TOKEN}-", dir="/tmp"))
    os.chmod(folder, 0o755)
    SERVERS.append(Listener())
    yield folder
    SERVERS.pop().close()
    for pid in _marked_processes():
        _kill(pid)
    for path in _planted(_all_targets_seen):
        _remove(path)
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def root_user(base):
    home = base / "home-root"
    home.mkdir()
    return User("root", [], Path(sys.executable).parent, os.getuid(), home, Path(sysconfig.get_paths()["purelib"]))


@pytest.fixture(scope="session")
def nobody_user(base):
    """uid 65534 with a venv of its own: /usr/bin/python3 -m venv, then a regular pip install of a copy
    of the checkout (and nbgrader, for the nbgrader channel)."""
    require_root("the unprivileged variants become uid 65534")
    setpriv = shutil.which("setpriv")
    prefix = [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    userns = subprocess.run(
        [*prefix, "bwrap", "--unshare-user", "--unshare-pid", "--ro-bind", "/", "/", "true"], capture_output=True, text=True
    )
    if userns.returncode:
        missing(f"uid {NOBODY} cannot make user namespaces here: {userns.stderr.strip()[:200]}")
    src, venv, home = base / "src", base / "venv", base / "home-nobody"
    home.mkdir()
    (home / "state").mkdir()
    _build_venv(src, venv)
    site = _purelib(venv / "bin" / "python")
    user = User("nobody", [*prefix, "env", f"HOME={home}"], venv / "bin", NOBODY, home, site, venv)
    user.give(home)
    OTHER_VENVS.append(venv)
    return user


def _purelib(python: Path) -> Path:
    return Path(
        subprocess.run(
            [str(python), "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )


def _closure(names: list[str]) -> list:
    """The installed distributions `names` need, following their requirements, with the extras a
    requirement asks for (bleach[css]) and markers evaluated here."""
    from importlib import metadata

    from packaging.requirements import Requirement

    seen: dict = {}
    todo = [(n, "") for n in names]
    while todo:
        req, extra = todo.pop()
        try:
            r = Requirement(req)
        except Exception:
            continue
        if r.marker is not None and not r.marker.evaluate({"extra": extra}):
            continue
        name = r.name.lower().replace("_", "-")
        if name == "course":
            continue
        for wanted in ("", *sorted(r.extras)):
            if (name, wanted) in seen:
                continue
            try:
                dist = metadata.distribution(name)
            except metadata.PackageNotFoundError:  # not needed here: pip decides
                break
            seen[name, wanted] = dist
            todo += [(q, wanted) for q in dist.requires or ()]
    return list({id(d): d for d in seen.values()}.values())


def make_venv(venv: Path, package: Path, extra: tuple[str, ...] = ()) -> float:
    """A venv of Debian's /usr/bin/python3 with a regular (non-editable) `pip install` of `package`.

    As tests/test_gradescope.py does: the dependencies (and `extra`) are first hard-linked from this
    venv's site-packages (the files pip installed here; installing torch's wheel again takes minutes
    on this machine, linking it a second), then pip installs the package itself. Returns the seconds."""
    from importlib import metadata

    started = time.monotonic()
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = _purelib(python)
    wanted = [r for r in metadata.distribution("course").requires or () if "extra ==" not in r] + list(extra)
    link_distributions(_closure(wanted), site)
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps", str(package)],
        capture_output=True,
        text=True,
    )
    assert pip.returncode == 0, pip.stderr[-3000:]
    where = subprocess.run(
        [str(python), "-I", "-c", "import grader; print(grader.__file__)"], capture_output=True, text=True, check=True, cwd="/"
    ).stdout.strip()
    assert where == str(site / "grader" / "__init__.py"), where  # installed, not this work tree
    return time.monotonic() - started


def _build_venv(src: Path, venv: Path) -> None:
    """A copy of the checkout (tests left out), installed into a venv of its own, with nbgrader."""
    files = (
        subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, files):
        if name.startswith("tests/") or not (ROOT / name).is_file():
            continue
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, src / name)
    seconds = make_venv(venv, src, extra=("nbgrader",))
    print(f"\nunprivileged venv: {seconds:.0f} s (venv, linked dependencies, pip install of the copy)", file=sys.stderr)


def _user(request, name: str) -> User:
    return request.getfixturevalue("nobody_user" if name == "nobody" else "root_user")


# -- the hostile and honest modules ---------------------------------------------------------------------------
def victim_text() -> str:
    """The reference, plus a few lines that leave a secret behind (files, output) for a later student."""
    return (chapters.SOLUTIONS / CH.filename).read_text() + VICTIM_CODE


VICTIM_CODE = f'''

def _victim_notes():
    import os
    for folder in ("/tmp", os.path.expanduser("~"), os.getcwd()):
        try:
            with open(os.path.join(folder, "victim-notes.txt"), "w") as f:
                f.write("{VICTIM}\\n")
        except Exception:
            pass
    print("my notes: {VICTIM}", flush=True)
    return True


_VICTIM_NOTES = _victim_notes()
'''


def hostile_text(kind: str, targets: "Targets", nonce: str, *, fill_cap: int = 72 << 20) -> str:
    """A module of tests/attacks/ with its configuration: what to aim at, the markers, and `fill_cap`, the
    bytes past which filling /tmp or the home folder is a hole (a box's tmpfs holds 64 MiB)."""
    cfg = {
        "nonce": f"{TOKEN}-{nonce}",
        "run_tag": RUN_TAG,
        "proc_mark": PROC_MARK,
        "file_mark": FILE_MARK,
        "victim_prefix": VICTIM_PREFIX,
        "private_dirs": ["/tmp"],
        "fill_cap": fill_cap,
        "bomb": 400,
        "write_dirs": [str(p) for p in targets.write_dirs],
        "existing_files": [str(p) for p in targets.existing],
        "result_files": [str(p) for p in targets.results],
        "secret_paths": [str(p) for p in targets.secrets],
        "private_files": [str(p) for p in targets.private],
        "net": [*SERVERS[0].ports, SERVERS[0].reply.decode()],
    }
    text = (ATTACKS / f"{kind}.py").read_text()
    assert "__CFG_JSON__" in text
    return text.replace("__CFG_JSON__", repr(json.dumps(cfg)))


def module_for(role: str, targets: "Targets", nonce: str, **options) -> str:
    return victim_text() if role in ("victim", "honest") else hostile_text(role, targets, nonce, **options)


def notebook_for(role: str, targets: "Targets", nonce: str) -> dict:
    """A chapter notebook (grader.delivery.notebook.chapter_notebook's layout) whose answer cells hold the module."""
    from grader.delivery.notebook import chapter_notebook

    nb = chapter_notebook(CH)
    answers = [c for c in nb["cells"] if c["metadata"]["nbgrader"]["grade_id"].startswith("answer_")]
    if role in ("victim", "honest"):
        answers[-1]["source"] += VICTIM_CODE
    else:
        answers[0]["source"] = hostile_text(role, targets, nonce)
        for c in answers[1:]:
            c["source"] = "# everything is in the cell above\n"
    return nb


# -- what the attacks aim at, and what is checked afterwards ------------------------------------------------------
@dataclass
class Targets:
    write_dirs: list[Path] = field(default_factory=list)
    existing: list[Path] = field(default_factory=list)
    results: list[Path] = field(default_factory=list)
    secrets: list[Path] = field(default_factory=list)
    private: list[Path] = field(default_factory=list)
    """Files the channel keeps from its students: any byte read is a hole (Gradescope's /autograder)."""


_all_targets_seen: list[Path] = []
OTHER_VENVS: list[Path] = []
"""The unprivileged user's venv, once made: every campaign aims at it too."""


def common_targets(user: User, extra: Targets) -> Targets:
    venvs = [Path(sysconfig.get_paths()["purelib"])]
    nobody_venv = [p for p in OTHER_VENVS if p.is_dir()]
    for v in nobody_venv:
        venvs += list(v.glob("lib/python3*/site-packages"))
    pythons = [
        Path(sys.prefix),
        Path(sysconfig.get_paths()["stdlib"]),
        *nobody_venv,
        Path("/usr/lib/python3"),
        *Path("/usr/lib").glob("python3.*"),
    ]
    dirs = [
        ROOT,
        ROOT / "grader",
        ROOT / "grader" / "isolation",
        ROOT / "grader" / "hidden",
        ROOT / "solutions",
        ROOT / "figures",
        ROOT / "figures" / "__pycache__",
        ROOT / ".git" / "hooks",
        Path(sys.executable).parent,
        Path("/tmp"),
        Path("/root"),
        Path("/work"),
        *[p.parent for p in nobody_venv],
        user.home,
        *pythons,
    ]
    secret = [ROOT / "solutions" / CH.filename, ROOT / "grader" / "hidden" / "ch17.py"]
    existing = [ROOT / "grader" / "run.py", ROOT / "figures" / "__init__.py", ROOT / "solutions" / CH.filename]
    for site in venvs:
        dirs += [site, site / "grader", site / "figures", site / "figures" / "__pycache__", site / "solutions"]
        secret += [site / "solutions" / CH.filename, site / "grader" / "hidden" / "ch17.py"]
        existing += [site / "grader" / "run.py"]
    for v in nobody_venv:
        dirs.append(v / "bin")
        src = v.parent / "src"
        secret += [src / "solutions" / CH.filename, src / "grader" / "hidden" / "ch17.py"]
    t = Targets(
        [d for d in dict.fromkeys(dirs + extra.write_dirs) if d.is_dir() or d in extra.write_dirs],
        [p for p in dict.fromkeys(existing + extra.existing) if p.exists()],
        list(extra.results),
        [p for p in dict.fromkeys(secret + extra.secrets)],
        list(extra.private),
    )
    _all_targets_seen.extend(t.write_dirs)
    return t


def _planted(dirs: list[Path]) -> list[Path]:
    found = []
    for d in dict.fromkeys(dirs):
        found += [Path(p) for p in glob.glob(f"{glob.escape(str(d))}/{FILE_MARK}*")]
    found += [Path(p) for p in glob.glob(f"/tmp/{FILE_MARK}*")]
    found += [Path(p) for p in glob.glob(f"/tmp/.hostile-state-{TOKEN}*") + glob.glob(f"/tmp/.stopper-state-{TOKEN}*")]
    return sorted(set(found))


def _remove(path: Path) -> None:
    try:
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    except OSError:
        pass


def _tree_stat(root: Path) -> dict[str, tuple]:
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(folder, name)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            out[os.path.relpath(p, root)] = (st.st_size, st.st_mtime_ns, st.st_mode, st.st_uid)
    return out


def _carries_token(path: str, limit: int = 256 << 10) -> bool:
    if FILE_MARK in path or TOKEN in os.path.basename(path):
        return True
    try:
        if os.path.getsize(path) > limit or not os.path.isfile(path) or os.path.islink(path):
            return False
        with open(path, "rb") as f:
            return TOKEN.encode() in f.read()
    except OSError:
        return False


def _new_with_token(root: Path, since_ns: int, skip: tuple[str, ...] = (), most: int = 20_000) -> list[str]:
    """Files under `root` changed since `since_ns` that carry this session's token (so the attacks wrote them);
    installed packages (other people's venvs in /tmp) are not looked into."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [
            d for d in dirs if os.path.join(folder, d) not in skip and d not in ("site-packages", "node_modules", ".git", "__pycache__")
        ]
        most -= len(files)
        if most < 0:
            break
        for name in files:
            p = os.path.join(folder, name)
            try:
                if os.lstat(p).st_mtime_ns >= since_ns and _carries_token(p):
                    found.append(p)
            except OSError:
                pass
        for name in dirs:
            if FILE_MARK in name:
                found.append(os.path.join(folder, name))
    return found


# -- processes ----------------------------------------------------------------------------------------------------
def _stat(pid: int) -> tuple[int, int, str] | None:
    """(ppid, starttime, state) of a process, None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return int(rest[1]), int(rest[19]), rest[0]
    except (OSError, IndexError, ValueError):
        return None


def _status(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/status") as f:
            return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    except OSError:
        return {}


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _marked_processes() -> list[int]:
    return [p for p in _pids() if PROC_MARK in _cmdline(p) and RUN_TAG not in _cmdline(p) and p != os.getpid()]


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


@dataclass
class Seen:
    pid: int
    start: int
    uid: int
    boxed: bool
    """In a pid namespace of its own (or a box's uid): a process of a submission, not of the grader."""
    cmd: str


class Watcher(threading.Thread):
    """Every process of a run's tree, seen from outside every 0.2 s: who they are, the trusted side's
    peak memory, and whether a trusted process was found stopped."""

    def __init__(self, pid: int, uid: int) -> None:
        super().__init__(daemon=True)
        self.root, self.uid = pid, uid
        self.seen: dict[tuple[int, int], Seen] = {}
        self.peak = 0
        self.stopped: set[str] = set()
        self.done = threading.Event()
        self.start()

    def run(self) -> None:
        while not self.done.wait(0.2):
            try:
                self.poll()
            except Exception:  # a process that vanished mid-read, say
                pass

    def poll(self) -> None:
        table = {p: s for p in _pids() if (s := _stat(p))}
        kids: dict[int, list[int]] = {}
        for p, (pp, _, _) in table.items():
            kids.setdefault(pp, []).append(p)
        todo, tree = [self.root], [self.root] if self.root in table else []
        while todo:
            for k in kids.get(todo.pop(), []):
                if k not in tree:
                    tree.append(k)
                    todo.append(k)
        for p in tree:
            _, start, state = table[p]
            key = (p, start)
            if key not in self.seen:
                status = _status(p)
                uid = int(status.get("Uid", "-1").split()[0])
                boxed = len(status.get("NSpid", "").split()) > 1 or uid >= HOST_UID_BASE
                self.seen[key] = Seen(p, start, uid, boxed, _cmdline(p))
            info = self.seen[key]
            if not info.boxed and info.uid == self.uid:
                status = _status(p)
                self.peak = max(self.peak, int((status.get("VmHWM", "0 kB").split() or ["0"])[0]) * 1024)
                if state == "T":
                    self.stopped.add(info.cmd[:120])

    def finish(self) -> None:
        self.done.set()
        self.join(5)

    def alive(self, *, boxed: bool) -> list[Seen]:
        out = []
        for (pid, start), info in self.seen.items():
            s = _stat(pid)
            if info.boxed == boxed and s and s[1] == start and s[2] not in "ZX":
                out.append(info)
        return out


@dataclass
class Run:
    label: str
    argv: list[str]
    rc: int | None
    stdout: str
    stderr: str
    elapsed: float
    timed_out: bool
    watcher: Watcher
    leftovers: list[str] = field(default_factory=list)


def run(user: User, argv: list[str], label: str, *, cwd: Path, timeout: float, env: dict | None = None) -> Run:
    """Run a channel command as `user`, watched from outside; a run past `timeout` is killed (its
    whole session; a stopped one too)."""
    started = time.monotonic()
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env or user.env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    watcher = Watcher(proc.pid, user.uid)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        for info in list(watcher.seen.values()):
            _kill(info.pid)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        out, err = proc.communicate()
    elapsed = time.monotonic() - started
    watcher.finish()
    result = Run(label, argv, proc.returncode, out, err, elapsed, timed_out, watcher)
    result.leftovers = leftovers(result)
    return result


def leftovers(r: Run) -> list[str]:
    """The run's submission processes still alive once it returned (then killed, so the next run is clean)."""
    time.sleep(0.2)  # a process that exits as the run ends is given a moment to be reaped
    found = {}
    for info in r.watcher.alive(boxed=True):
        found[info.pid] = f"pid {info.pid} uid {info.uid}: {info.cmd[:150]}"
    for pid in _marked_processes():
        found[pid] = f"pid {pid} (marked): {_cmdline(pid)[:150]}"
    box_uids = {i.uid for i in r.watcher.seen.values() if i.uid >= HOST_UID_BASE}
    for pid in _pids():
        uid = int(_status(pid).get("Uid", "-1").split()[0])
        if uid in box_uids and pid not in found:
            found[pid] = f"pid {pid} of box uid {uid}: {_cmdline(pid)[:150]}"
    deadline = time.monotonic() + 10  # the grader's own processes (a pool's workers) may take a moment
    while (trusted := r.watcher.alive(boxed=False)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for info in trusted:
        found[info.pid] = f"pid {info.pid} (the grader's side, 10 s after the run): {info.cmd[:150]}"
    for pid in found:
        _kill(pid)
    return sorted(found.values())


# -- one campaign: a channel, a user, its students ----------------------------------------------------------------
@dataclass
class Campaign:
    channel: str
    user: str
    roles: dict[str, str]
    """student -> role (victim, kitchen_sink, stopper, killer, honest), in the order they are graded."""
    runs: list[Run] = field(default_factory=list)
    scores: dict[str, float | None] = field(default_factory=dict)
    docs: dict[str, dict | None] = field(default_factory=dict)
    outputs: list[tuple[str, str, str]] = field(default_factory=list)
    """(where, owner student or "", text): everything the channel printed or wrote."""
    targets: Targets = field(default_factory=Targets)
    planted: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    rewritten: list[str] = field(default_factory=list)
    heard: list[bytes] = field(default_factory=list)
    """What this module's servers heard during the campaign."""
    bound: float = RUN_BOUND

    def holes(self, student: str) -> list[str]:
        """What the hostile module said worked, from what the channel kept of its output (a clue)."""
        text = "\n".join(t for _, owner, t in self.outputs if owner in (student, ""))
        return sorted(set(re.findall(r"HOLE [^\n\"|\\]{0,160}", text)))


ROLES_SINGLE = {"a_victim": "victim", "b_kitchen_sink": "kitchen_sink", "c_stopper": "stopper", "d_killer": "killer", "e_honest": "honest"}
CHANNEL_ROLES = {
    "check": ROLES_SINGLE,
    "notebook": {"b_kitchen_sink": "kitchen_sink", "e_honest": "honest"},
    "grade": ROLES_SINGLE,
    "gradescope": {"b_kitchen_sink": "kitchen_sink", "c_stopper": "stopper", "d_killer": "killer", "e_honest": "honest"},
    "nbgrader": {"a_victim": "victim", "b_kitchen_sink": "kitchen_sink", "e_honest": "honest"},
}
CHANNEL_USERS = {
    "check": ("nobody", "root"),
    "notebook": ("nobody", "root"),
    "grade": ("nobody", "root"),
    "gradescope": ("bwrap", "uid"),
    "nbgrader": ("nobody", "root"),
}
"""Who runs each channel: root or uid 65534 (first: its venv is then a target of every later campaign); Gradescope
runs run_autograder as root only, so there the two variants are its two boundaries, the second running the
student's code as an unprivileged uid without namespaces."""
CAMPAIGNS = [(c, u) for c, users in CHANNEL_USERS.items() for u in users]


def _read_outputs(folder: Path, owner_of) -> list[tuple[str, str, str]]:
    out = []
    for p in sorted(Path(folder).rglob("*")) if Path(folder).exists() else []:
        if p.is_file() and not p.is_symlink() and p.stat().st_size < 64 << 20:
            out.append((str(p), owner_of(p), p.read_bytes().decode(errors="replace")))
    return out


def _score(doc: dict | None) -> float | None:
    return None if doc is None else float(doc.get("score", 0))


def _json(text: str) -> dict | None:
    try:
        doc = json.loads(text)
        return doc if isinstance(doc, dict) else None
    except ValueError:
        return None


def campaign_check(user: User, c: Campaign, folder: Path, notebook: bool) -> None:
    for student, role in c.roles.items():
        work = folder / f"{RUN_TAG}-{student}"
        (work / "sub").mkdir(parents=True)
        figs = work / "figs"
        figs.mkdir()
        user.give(figs)
        c.targets = common_targets(user, Targets([work / "sub", folder]))
        if notebook:
            path = work / "sub" / "ch17.ipynb"
            path.write_text(json.dumps(notebook_for(role, c.targets, student)))
            what = ["--notebook", path]
        else:
            (work / "sub" / CH.filename).write_text(module_for(role, c.targets, student))
            what = ["--submission", work / "sub"]
        argv = user.course("check", "ch17", *what, "--json", "--seed", SEED, "--figures", figs, "--time-limit", 3)
        r = run(user, argv, student, cwd=ROOT, timeout=c.bound)
        c.runs.append(r)
        c.docs[student] = _json(r.stdout)
        c.scores[student] = _score(c.docs[student])
        c.outputs += [(f"{student} stdout", student, r.stdout), (f"{student} stderr", student, r.stderr)]
        c.outputs += _read_outputs(figs, lambda p, s=student: s)


def campaign_grade(user: User, c: Campaign, folder: Path) -> None:
    subs, out = folder / "subs", folder / f"{RUN_TAG}-grade" / "out"
    out.parent.mkdir(parents=True)
    user.give(out.parent)
    students = list(c.roles)
    extra = Targets(
        [subs, out, out.parent] + [subs / s for s in students] + [out / s / "ch17" for s in students],
        [subs / s / CH.filename for s in students] + [out / s / "ch17" / "results.json" for s in students],
        [out / s / "ch17" / "results.json" for s in students],
    )
    for s in students:
        (subs / s).mkdir(parents=True)
    c.targets = common_targets(user, extra)  # OUT/<student>/ch17 exist once the earlier students are graded
    for s, role in c.roles.items():
        (subs / s / CH.filename).write_text(module_for(role, c.targets, s))
    argv = user.course("grade", subs, "--chapter", "ch17", "--out", out, "--jobs", 1, "--seed", SEED, "--time-limit", 5)
    r = run(user, argv, "class", cwd=ROOT, timeout=c.bound * len(students))
    c.runs.append(r)
    c.outputs += [("stdout", "", r.stdout), ("stderr", "", r.stderr)]
    _class_results(c, out)
    c.outputs += _read_outputs(out, lambda p: p.relative_to(out).parts[0] if len(p.relative_to(out).parts) > 1 else "")


def _class_results(c: Campaign, out: Path) -> None:
    for s in c.roles:
        f = out / s / "ch17" / "results.json"
        c.docs[s] = _json(f.read_text()) if f.is_file() else None
        c.scores[s] = _score(c.docs[s])


@dataclass
class Bundle:
    source: Path
    """The unzipped bundle (what Gradescope puts in /autograder/source)."""
    python: Path
    """The venv setup.sh would make: a regular pip install of the bundle's course/."""
    site: Path


@pytest.fixture(scope="session")
def bundle(base) -> Bundle:
    """The ch17 Gradescope bundle, installed once as setup.sh installs it (tests/test_gradescope.py's way)."""
    from grader.delivery.gradescope import export

    folder = base / "gradescope"
    folder.mkdir()
    zipfile.ZipFile(export(CH, folder / "autograder.zip", seed=SEED)).extractall(folder / "bundle")
    seconds = make_venv(folder / "venv", folder / "bundle" / "course")
    os.chmod(folder / "bundle", 0o700)  # the template of /autograder/source: root's, as protect() leaves it
    (folder / "autograder.zip").unlink()
    print(f"\ngradescope venv: {seconds:.0f} s", file=sys.stderr)
    python = folder / "venv" / "bin" / "python"
    return Bundle(folder / "bundle", python, _purelib(python))


def container(command: str, keep: list[Path]) -> list[str]:
    """`command` (one program, no arguments) as in a Gradescope container, for the uid boundary (whose
    student sees the host's files and processes): its own mount and pid namespaces, and of the host's
    folders only the system's (/usr, /etc, /lib…, /dev, /proc, /sys, /run), every other top-level folder
    (/tmp, /work, /root, /home, /srv, /opt, /var…) and this checkout empty, but for the folders in `keep`,
    which stay where they are. A container has no clone of the course or other copies of its files;
    a CI machine may have many, readable by every uid. Its init waits 2 s after `command` ends, as the
    harness reads results.json after run_autograder (a leftover process would rewrite it then)."""
    # what to keep and run come in the environment, so that no argv but the grader's own names this test's folders
    stash = "; ".join(f'mkdir /mnt/k{i} && mount --bind "$CONTAINER_KEEP{i}" /mnt/k{i}' for i in range(len(keep)))
    back = "; ".join(f'mkdir -p "$CONTAINER_KEEP{i}" && mount --move /mnt/k{i} "$CONTAINER_KEEP{i}"' for i in range(len(keep)))
    hide = (
        'for d in /* "$CONTAINER_CHECKOUT"; do case "$d" in /bin|/dev|/etc|/lib|/lib32|/lib64|/libx32|/mnt|'
        '/proc|/run|/sbin|/sys|/usr) ;; *) if [ -d "$d" ] && [ ! -L "$d" ]; then '
        'mount -t tmpfs -o mode=755 tmpfs "$d"; fi ;; esac; done; chmod 1777 /tmp'
    )
    script = f'set -e; mount -t tmpfs tmpfs /mnt; {stash}; {hide}; {back}; set +e; "$CONTAINER_RUN"; status=$?; sleep 2; exit $status'
    env = [f"CONTAINER_KEEP{i}={p}" for i, p in enumerate(keep)] + [f"CONTAINER_RUN={command}", f"CONTAINER_CHECKOUT={CHECKOUT}"]
    return ["env", *env, "unshare", "--mount", "--pid", "--fork", "--mount-proc", "--propagation", "private", "/bin/sh", "-c", script]


GRADESCOPE_STUDENT = 1_260_000 + os.getpid() % 10_000
"""The student's uid for the uid boundary: its own, outside the sandbox's range and tests/test_gradescope.py's."""


def campaign_gradescope(user: User, c: Campaign, folder: Path, bundle: Bundle, kind: str) -> None:
    """run_autograder as Gradescope runs it (as root, for each submission in a fresh /autograder),
    with the boundary `kind` forced: bwrap, or the uid boundary Gradescope's containers may need."""
    for student, role in c.roles.items():
        root = folder / f"{RUN_TAG}-gs-{student}"
        root.mkdir()
        os.chmod(root, 0o755)
        shutil.copytree(bundle.source, root / "source")
        shutil.copy(root / "source" / "run_autograder", root / "run_autograder")
        os.chmod(root / "run_autograder", 0o755)
        (root / "submission").mkdir()
        (root / "results").mkdir()
        os.chmod(root / "results", 0o777)  # as Gradescope leaves it: the bundle must close it
        course = root / "source" / "course"
        c.targets = common_targets(
            user,
            Targets(
                [
                    root,
                    root / "results",
                    root / "submission",
                    course,
                    course / "solutions",
                    course / "grader",
                    bundle.site,
                    bundle.site / "grader",
                    bundle.site / "solutions",
                    bundle.python.parent,
                ],
                [course / "grader" / "run.py", bundle.site / "grader" / "run.py"],
                [root / "results" / "results.json"],
                [
                    course / "solutions" / CH.filename,
                    course / "grader" / "hidden" / "ch17.py",
                    bundle.site / "solutions" / CH.filename,
                    bundle.site / "grader" / "hidden" / "ch17.py",
                ],
                [root, root / "submission_metadata.json", root / "results", root / "run_autograder", root / "source"],
            ),
        )
        users = [{"email": f"{student}@example.com", "id": 5000 + len(c.runs), "name": student}]
        earlier = [{"submission_time": "2025-02-28T14:24:48.087023-08:00", "score": 0.0, "results": {"output": PREVIOUS}}]
        (root / "submission_metadata.json").write_text(json.dumps({"id": 1, "users": users, "previous_submissions": earlier}))
        # the uid boundary has no tmpfs of its own: its /tmp is the container's, one per submission on Gradescope
        options = {"fill_cap": 1 << 40} if kind == "uid" else {}
        (root / "submission" / CH.filename).write_text(module_for(role, c.targets, student, **options))
        env = dict(
            user.env(),
            GRADESCOPE_ROOT=str(root),
            COURSE_PYTHON=str(bundle.python),
            COURSE_SANDBOX=kind,
            COURSE_STUDENT_UID=str(GRADESCOPE_STUDENT),
        )
        argv = (
            [str(root / "run_autograder")]
            if kind == "bwrap"
            else container(str(root / "run_autograder"), keep=[bundle.source.parent, folder])
        )
        r = run(user, argv, student, cwd=root, timeout=c.bound, env=env)
        c.runs.append(r)
        result = root / "results" / "results.json"
        c.docs[student] = _json(result.read_text()) if result.is_file() else None
        c.scores[student] = _score(c.docs[student])
        c.outputs += [(f"{student} stdout", student, r.stdout), (f"{student} stderr", student, r.stderr)]
        c.outputs += _read_outputs(root / "results", lambda p, s=student: s)


_NBGRADER_TEMPLATE: dict[str, Path] = {}


def campaign_nbgrader(user: User, c: Campaign, folder: Path) -> None:
    from grader.delivery.notebook import write_course

    if "course" not in _NBGRADER_TEMPLATE:
        template = folder.parent / "nbgrader-template"
        write_course(template, [CH])
        env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
        made = subprocess.run(["nbgrader", "generate_assignment", "ch17", "--force"], cwd=template, env=env, capture_output=True, text=True)
        assert made.returncode == 0, made.stdout + made.stderr
        _NBGRADER_TEMPLATE["course"] = template
    course = folder / f"{RUN_TAG}-nbgrader"
    shutil.copytree(_NBGRADER_TEMPLATE["course"], course)
    release = json.loads((course / "release" / "ch17" / "ch17.ipynb").read_text())
    source = json.loads((course / "source" / "ch17" / "ch17.ipynb").read_text())
    out = course / "course-grade"
    students = list(c.roles)
    extra = Targets(
        [course, course / "submitted", course / "autograded"] + [course / "submitted" / s / "ch17" for s in students],
        [course / "gradebook.db"] + [course / "submitted" / s / "ch17" / "ch17.ipynb" for s in students],
        [out / s / "ch17" / "results.json" for s in students],
    )
    for s in students:
        (course / "submitted" / s / "ch17").mkdir(parents=True)
    c.targets = common_targets(user, extra)
    for s, role in c.roles.items():
        nb = json.loads(json.dumps(source if role in ("victim", "honest") else release))
        answers = [x for x in nb["cells"] if x.get("metadata", {}).get("nbgrader", {}).get("grade_id", "").startswith("answer_")]
        if role in ("victim", "honest"):
            answers[-1]["source"] = "".join(answers[-1]["source"]) + VICTIM_CODE
        else:
            answers[0]["source"] = hostile_text(role, c.targets, s)
            for a in answers[1:]:
                a["source"] = "# everything is in the cell above\n"
        (course / "submitted" / s / "ch17" / "ch17.ipynb").write_text(json.dumps(nb))
        (course / "submitted" / s / "ch17" / "timestamp.txt").write_text("2025-03-01 12:00:00.000000 UTC")
    user.give(course)
    argv = user.course("grade", "--nbgrader", course, "--chapter", "ch17", "--seed", SEED, "--time-limit", 5)
    r = run(user, argv, "class", cwd=course, timeout=c.bound * len(students) + 60)
    c.runs.append(r)
    c.outputs += [("stdout", "", r.stdout), ("stderr", "", r.stderr)]
    _class_results(c, out)

    def owner(p: Path) -> str:
        parts = p.relative_to(course).parts
        return parts[1] if len(parts) > 2 and parts[0] in ("autograded", "feedback", "course-grade") else ""

    for sub in ("course-grade", "autograded", "feedback"):
        c.outputs += [
            o for o in _read_outputs(course / sub, owner) if not (sub != "course-grade" and c.roles.get(o[1]) in ("victim", "honest"))
        ]


RUNNERS = {
    "check": lambda u, c, f, r: campaign_check(u, c, f, False),
    "notebook": lambda u, c, f, r: campaign_check(u, c, f, True),
    "grade": lambda u, c, f, r: campaign_grade(u, c, f),
    "gradescope": lambda u, c, f, r: campaign_gradescope(u, c, f, r.getfixturevalue("bundle"), c.user),
    "nbgrader": lambda u, c, f, r: campaign_nbgrader(u, c, f),
}


@pytest.fixture(scope="module", params=CAMPAIGNS, ids=[f"{c}-{u}" for c, u in CAMPAIGNS])
def campaign(request, base):
    channel, user_name = request.param
    user = _user(request, user_name)
    folder = base / f"{channel}-{user_name}"
    folder.mkdir()
    c = Campaign(channel, user_name, dict(CHANNEL_ROLES[channel]))
    venv_before = _tree_stat(user.venv) if user.venv else None
    tmp_before = set(os.listdir("/tmp"))
    since = time.time_ns()
    heard = len(SERVERS[0].heard)
    RUNNERS[channel](user, c, folder, request)
    c.heard = SERVERS[0].heard[heard:]
    time.sleep(1)  # S3: a leftover process would rewrite results now (it tries every 0.3 s)
    later = {}
    first_read = {s: c.docs.get(s) for s in c.roles}
    if channel in ("grade", "nbgrader"):
        out = folder / (f"{RUN_TAG}-grade/out" if channel == "grade" else f"{RUN_TAG}-nbgrader/course-grade")
        for s in c.roles:
            f = out / s / "ch17" / "results.json"
            later[s] = _json(f.read_text()) if f.is_file() else None
    elif channel == "gradescope":
        for s in c.roles:
            f = folder / f"{RUN_TAG}-gs-{s}" / "results" / "results.json"
            later[s] = _json(f.read_text()) if f.is_file() else None
    c.rewritten = [
        f"{s}: results.json changed after the run ({_score(first_read[s])} -> {_score(d)})" for s, d in later.items() if d != first_read[s]
    ]
    # files: the attacks' targets, the unprivileged venv, /tmp and the checkout
    aimed = list(dict.fromkeys(_all_targets_seen))
    c.planted = [str(p) for p in _planted(aimed)]
    if venv_before is not None:
        after = _tree_stat(user.venv)
        c.changed += [f"{user.venv}/{k}" for k in sorted(set(after) ^ set(venv_before))]
        c.changed += [f"{user.venv}/{k} (modified)" for k in sorted(set(after) & set(venv_before)) if after[k] != venv_before[k]]
    left_in_tmp = []
    for name in sorted(set(os.listdir("/tmp")) - tmp_before):
        if name == base.name:
            continue
        p = Path("/tmp") / name
        if p.is_file() and _carries_token(str(p)):
            left_in_tmp.append(str(p))
        elif p.is_dir():
            left_in_tmp += _new_with_token(p, since)
    c.changed += [f"/tmp leftover: {x}" for x in left_in_tmp]
    skip = (str(ROOT / ".venv"), str(ROOT / ".git" / "objects"))
    c.changed += [f"checkout: {x}" for x in _new_with_token(ROOT, since, skip=skip)]
    for p in [*_planted(aimed), *map(Path, left_in_tmp)]:  # recorded: now gone, so that the next campaign starts clean
        _remove(p)
    runs = ", ".join(f"{r.label} {r.elapsed:.0f} s" for r in c.runs)
    print(f"\n{channel}/{user_name}: scores {c.scores}; {runs}", file=sys.stderr)
    return c


# -- the verdicts --------------------------------------------------------------------------------------------------
def _describe(c: Campaign, student: str) -> str:
    doc = c.docs.get(student) or {}
    fails = [f"{t.get('name')}: {t.get('status')}: {str(t.get('output'))[:160]}" for t in doc.get("tests", []) if t.get("score")][:5]
    runs = [f"{r.label}: rc {r.rc}, {r.elapsed:.0f} s, stderr {r.stderr[-600:]!r}" for r in c.runs if r.label in (student, "class")]
    return f"holes it reported: {c.holes(student)}; points it got: {fails}; runs: {runs}"


def test_hostile_students_earn_only_their_honest_part(campaign):
    for student, role in campaign.roles.items():
        if role in HOSTILE:
            assert campaign.scores[student] is not None, f"{student} got no result: {_describe(campaign, student)}"
            assert campaign.scores[student] == 0, f"{student} ({role}) earned points: {_describe(campaign, student)}"


def test_honest_students_get_exactly_their_own_score(campaign):
    for student, role in campaign.roles.items():
        if role in ("victim", "honest"):
            assert campaign.scores[student] == FULL, f"{student} ({role}): {_describe(campaign, student)}"


def test_every_run_ends_in_time_and_the_grader_is_never_stopped(campaign):
    for r in campaign.runs:
        bound = campaign.bound * (len(campaign.roles) if r.label == "class" else 1)
        assert not r.timed_out and r.elapsed < bound, f"{r.label} ran {r.elapsed:.0f} s (bound {bound:.0f})"
        assert r.rc is not None and r.rc >= 0, f"{r.label}: the grader died (rc {r.rc}): {r.stderr[-800:]}"
        assert not r.watcher.stopped, f"{r.label}: a process of the grader was stopped: {r.watcher.stopped}"


def test_no_process_of_a_submission_outlives_its_run(campaign):
    left = [x for r in campaign.runs for x in r.leftovers]
    assert not left, left


def test_nothing_outside_the_sandbox_changed(campaign):
    assert not campaign.planted, f"files the attacks planted outside their sandbox: {campaign.planted}"
    assert not campaign.changed, f"files changed outside the sandbox: {campaign.changed[:20]}"


def test_no_secret_reaches_what_the_channel_printed_or_wrote(campaign):
    for where, owner, text in campaign.outputs:
        assert CANARY not in text, f"the grader's canary variable reached {where}"
        leaked = [line for line in SECRET_LINES if line in text]
        assert not leaked, f"{where} carries lines of the reference or the hidden checks: {leaked[:3]}"
        if campaign.roles.get(owner) not in ("victim", "honest"):
            assert VICTIM not in text, f"{where} carries the victim's secret (an earlier student's output)"
        assert PREVIOUS not in text, f"{where} carries an earlier submission's results (Gradescope's metadata)"


def test_no_submission_reaches_the_network(campaign):
    assert campaign.heard == [], f"this module's servers on 127.0.0.1 heard: {campaign.heard[:5]}"


def test_results_stay_as_the_grader_wrote_them(campaign):
    assert not campaign.rewritten, campaign.rewritten


def test_the_grader_memory_stays_bounded(campaign):
    for r in campaign.runs:
        assert r.watcher.peak < 1536 << 20, f"{r.label}: the grader's side peaked at {r.watcher.peak >> 20} MiB"


# -- failing closed ------------------------------------------------------------------------------------------------
def test_grading_others_code_refuses_without_bubblewrap_unless_no_sandbox(root_user, base):
    """With bwrap off the PATH, `course check --submission/--notebook` and `course grade` refuse, naming
    the fix; with --no-sandbox they run and warn."""
    from grader.delivery.notebook import chapter_notebook

    folder = base / "fail-closed"
    (folder / "subs" / "a").mkdir(parents=True)
    (folder / "bin").mkdir()
    (folder / "subs" / "a" / CH.filename).write_text((chapters.EXERCISES / CH.filename).read_text())
    (folder / "ch17.ipynb").write_text(json.dumps(chapter_notebook(CH)))
    env = dict(root_user.env(), PATH=str(folder / "bin"), COURSE_LANG="en")  # no bwrap (and nothing else) to be found
    commands = {
        "check --submission": root_user.course(
            "check", "ch17", "--submission", folder / "subs" / "a", "--json", "--figures", folder / "figs"
        ),
        "check --notebook": root_user.course("check", "ch17", "--notebook", folder / "ch17.ipynb", "--json", "--figures", folder / "figs"),
        "grade": root_user.course("grade", folder / "subs", "--chapter", "ch17", "--out", folder / "out", "--jobs", 1, "--seed", SEED),
    }
    for what, argv in commands.items():
        r = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=120)
        said = r.stdout + r.stderr
        assert r.returncode != 0 and _json(r.stdout) is None, f"{what} ran without a sandbox: {said[-800:]}"
        assert "apt-get install bubblewrap" in said, f"{what} does not name the fix: {said[-800:]}"
        assert "--no-sandbox" in said, f"{what} does not name the way out: {said[-800:]}"
        assert "Traceback" not in said, said[-1500:]
    assert not list((folder / "out").rglob("results.json"))
    for what in ("check --submission", "grade"):
        argv = commands[what] + ["--no-sandbox"]
        r = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode in (0, 1), f"{what} --no-sandbox: rc {r.returncode}: {(r.stdout + r.stderr)[-1500:]}"
        assert re.search(r"warning|unsafe|sandbox: none", r.stderr, re.I), (what, r.stderr)
    assert json.loads((folder / "out" / "a" / "ch17" / "results.json").read_text())["score"] == 0
