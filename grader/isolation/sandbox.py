"""One sandbox per submission: where somebody else's code runs (bubblewrap, Debian's `bubblewrap`).

A `Box` is made for one submission and torn down after it. Inside it the student's
processes (a warm process and the student processes it forks) have:

- their own user namespace with uid/gid 65534 and no capabilities, no further user
  namespaces (`--disable-userns`); when the grader runs as root, the box first drops
  to a host uid of its own (`setpriv`), so that nothing inside is root on the host
  and the process limit counts the box's processes alone;
- their own pid, network, IPC and UTS namespaces: no process of the grader is
  visible, no network at all; `--die-with-parent`, `--new-session` (no terminal);
- a read-only file system made of the system libraries, the Python standard library,
  the third-party packages a student may import (`STUDENT_PACKAGES` and what they
  need, by their installed file lists), a copy of `grader/isolation/` (this folder,
  nothing else of the course package) and the submission's own files; a private
  scratch folder and /tmp, small tmpfs mounts that vanish with the box;
- an environment built from an allow-list, and limits on processes, open files,
  file size (their output goes to files the grader opened and passed in).

Every process of a box is a descendant of the box's first process (the pid
namespace's init), so the grader finds them from outside and `close()` ends them
all at once, before the submission's result is written. Where a box cannot be made
(`probe()` says why), grading somebody else's code refuses unless the caller asks
for no sandbox. A box of kind "uid" is the fallback for containers that forbid user
namespaces (Gradescope's): a dedicated host uid with no privileges and the same
limits, its processes found by their uid, and no network: every one of its processes runs
under `grader.isolation.netfilter`'s seccomp filter (no socket but AF_UNIX, no io_uring); the
files it must not read are the caller's business (owned by root, mode 0700).
"""

from __future__ import annotations

import functools
import json
import os
import re
import resource
import shutil
import signal
import site
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from importlib import metadata
from pathlib import Path
from typing import cast

from grader.i18n import mark, tr
from grader.isolation import budget, netfilter, procs

STUDENT_PACKAGES = ("torch", "numpy")
"""What a student's code may import besides the standard library (with what these need)."""
INSIDE_UID = 65534
HOST_UID_BASE = 200_000
"""As root, box k runs as host uid HOST_UID_BASE + k: a uid with no files, no other processes."""
HOME = "/home/student"
WARM_ALLOWANCE = 4 << 30
"""Bytes the box may hold while its warm process imports torch (a CUDA build's libraries included), before
`settle` sets its budget to the submission's memory on top of what the warm process then holds."""
KINDS = ("bwrap", "uid")
LIMITS = {"processes": 128, "open_files": 512, "file_size": 32 << 20, "tmp_size": 64 << 20}
ENV_ALLOWED = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "COURSE_LANG")
"""Host variables passed through (this machine's BLAS needs them; the language of the few messages the student's
process words itself); everything else is set here."""
SYSTEM = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime")
FIX = {
    "bwrap": mark("install Debian's bubblewrap (apt-get install bubblewrap)"),
    "userns": mark(
        "allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, or a container "
        "started without a seccomp profile that refuses them)"
    ),
    "uid": mark("run the grader as root so it can drop student code to an unprivileged uid (setpriv)"),
}
"""What makes a sandbox possible where it is not, per missing piece (translated where it is said)."""


class SandboxUnavailable(RuntimeError):
    """No sandbox can be made here; the message says why and what fixes it."""


def environment(home: str = HOME) -> dict[str, str]:
    """The student's processes' whole environment: an allow-list, never the grader's own variables."""
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "USER": "student",
        "LOGNAME": "student",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    env.update({k: os.environ[k] for k in ENV_ALLOWED if k in os.environ})
    return env


@functools.cache
def probe(kind: str = "bwrap") -> str:
    """A sentence describing the sandbox of this kind, or SandboxUnavailable naming the fix."""
    if kind not in KINDS:
        raise SandboxUnavailable(f"unknown sandbox kind {kind!r}: one of {', '.join(KINDS)}")
    if kind == "uid":
        if os.geteuid() != 0 or not shutil.which("setpriv"):
            raise SandboxUnavailable(tr("the uid boundary needs root and setpriv: {fix}", fix=tr(FIX["uid"])))
        try:
            network = netfilter.supported()
        except (netfilter.Unsupported, OSError) as e:
            why = tr("the uid boundary cannot take the network away here ({error}): {fix}", error=e, fix=tr(FIX["userns"]))
            raise SandboxUnavailable(why) from None
        return tr("uid boundary: a dedicated unprivileged uid, no capabilities, limits, {network} (no namespaces)", network=network)
    if not shutil.which("bwrap"):
        raise SandboxUnavailable(tr("bubblewrap (bwrap) is not installed: {fix}", fix=tr(FIX["bwrap"])))
    box = Box("bwrap")
    try:
        out = subprocess.run(
            box.wrap(["/bin/sh", "-c", "id -u; test -w /usr && echo writable; echo ok"]),
            capture_output=True,
            text=True,
            timeout=30,
            env=environment(),
            preexec_fn=box.limit,
            pass_fds=(),
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SandboxUnavailable(tr("bwrap could not start ({error}): {fix}", error=e, fix=tr(FIX["userns"]))) from None
    finally:
        box.close()
    if out.returncode != 0 or out.stdout.split() != [str(INSIDE_UID), "ok"]:
        why = (out.stderr.strip() or out.stdout.strip())[:300]
        raise SandboxUnavailable(tr("bwrap cannot make the sandbox here ({why}): {fix}", why=why, fix=tr(FIX["userns"])))
    version = subprocess.run(["bwrap", "--version"], capture_output=True, text=True).stdout.strip()
    who = tr("host uid {uid}+", uid=HOST_UID_BASE) if os.geteuid() == 0 else tr("this user's uid")
    return tr(
        "{version}: one sandbox per submission (user, pid, network, IPC namespaces; uid {inside} inside, "
        "{who} outside; no capabilities; only Python, {packages} and the submission visible)",
        version=version,
        inside=INSIDE_UID,
        who=who,
        packages=", ".join(STUDENT_PACKAGES),
    )


class Box:
    """One submission's sandbox: its folders, its command line, its processes, its end."""

    _count = 0

    def __init__(
        self,
        kind: str | None,
        files: dict[str, bytes] | None = None,
        *,
        uid: int | None = None,
        memory: int = budget.DEFAULT_LIMIT,
        packages: tuple[str, ...] = STUDENT_PACKAGES,
        code: tuple[str, ...] = (),
        binds: dict[str, str] | None = None,
    ) -> None:
        """`kind` "bwrap", "uid" or None (no sandbox: the student's own exercises); `files` the
        submission (file name -> bytes), written into a folder the box sees read-only; `uid` the
        host uid the box's processes run as (root only; by default HOST_UID_BASE + k): a uid of
        its own, e.g. a dedicated user's, that no other process or box uses meanwhile; `memory` the
        bytes the submission's processes may use on top of the warm process (one budget for the
        whole box, `grader.isolation.budget`; a box of kind None has none: each run brings its own).
        `packages` the installed packages the box sees (with what they need); `code` folders of the course
        copied in beside grader/isolation (the engine, for `course engine run --submission`); `binds` host
        folders seen read-only at the given paths (a model's files)."""
        if kind is not None and kind not in KINDS:
            raise SandboxUnavailable(f"unknown sandbox kind {kind!r}: one of {', '.join(KINDS)}")
        if uid is not None and (os.geteuid() != 0 or uid <= 0):
            raise SandboxUnavailable(f"a box's uid is chosen by root, and is not root's (uid {uid}): {FIX['uid']}")
        Box._count += 1
        self.kind = kind
        self.root = Path(tempfile.mkdtemp(prefix="course-box-"))
        os.chmod(self.root, 0o711)
        self.harness = write_harness(self.root / "harness", code)
        self.packages, self.binds = packages, dict(binds or {})
        self.inbox = self.root / "inbox"
        self.inbox.mkdir(mode=0o755)
        for name, data in (files or {}).items():
            if "/" in name or name.startswith("."):
                raise ValueError(f"not a plain file name: {name!r}")
            (self.inbox / name).write_bytes(data)
            os.chmod(self.inbox / name, 0o644)
        self.logs = self.root / "logs"  # the grader's side only: never mounted
        self.logs.mkdir(mode=0o700)
        if uid is None:
            uid = HOST_UID_BASE + (os.getpid() * 64 + Box._count) % 1_000_000 if os.geteuid() == 0 else os.getuid()
        self.uid = uid
        self.home = HOME
        if kind == "uid":
            netfilter.prepare()  # built here, installed between fork and exec (`limit`)
        if kind != "bwrap":  # a scratch folder on the host, the box's own
            scratch = self.root / "home"
            scratch.mkdir(mode=0o700)
            if kind == "uid":
                os.chown(scratch, self.uid, self.uid)
            self.home = str(scratch)
        self.memory = memory
        self.budget: budget.Budget | None = budget.make(memory + WARM_ALLOWANCE) if kind is not None else None
        self.proc: subprocess.Popen | None = None
        self._die_with_grader = False
        self.init_pid: int | None = None
        self.frame: set[int] = set()
        """The box's own processes (bwrap's, the warm one), noted before any student code ran."""
        self._info_r: int | None = None

    # -- starting ----------------------------------------------------------------------------------------
    def wrap(self, argv: list[str]) -> list[str]:
        """The command line that runs `argv` in this box (argv itself for no sandbox)."""
        if self.kind is None:
            return list(argv)
        if self.kind == "uid":
            return [*_setpriv(self.uid), *argv]
        inner = ["--unshare-user", "--uid", str(INSIDE_UID), "--gid", str(INSIDE_UID), "--disable-userns", "--cap-drop", "ALL"]
        args = [
            "bwrap",
            "--unshare-pid",
            "--unshare-net",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--die-with-parent",
            "--new-session",
            "--clearenv",
        ]
        if self._info_r is not None:
            args += ["--info-fd", str(self._info_w)]
        for k, v in environment().items():
            args += ["--setenv", k, v]
        args += _mounts(self.harness, self.inbox, self.packages, self.binds)
        args += ["--chdir", HOME, "--remount-ro", "/"]
        if os.geteuid() != 0:  # the warm process is the namespace's init: bwrap's own reaper would be the
            return [*args, "--as-pid-1", *inner, "--", *argv]  # student's to ptrace, init ignores their signals
        # As root: the mounts are made as root, then the box drops to its own host uid and makes its
        # user namespace from there (a second bwrap), so nothing inside is root on the host.
        # --dev-bind: the outer box's tree, its small /dev included (the only device nodes it holds are DEVICES)
        return [*args, "--", *_setpriv(self.uid), "bwrap", *inner, "--dev-bind", "/", "/", "--", *argv]

    def limit(self) -> None:
        """Limits of every process of the box (run in the child before it becomes the box).

        Processes: as root each box runs as a host uid of its own, so RLIMIT_NPROC, which counts per uid, counts
        this box alone. Without root every box runs as the grader's uid; there the box's warm process sets the
        limit inside the box's user namespace (`grader.isolation.zygote.serve`), where the kernel counts the
        namespace's processes apart from every other box's, and the namespace itself is made under the
        grader's own limit. A pids cgroup, where the budget has one, counts the box too."""
        if self.kind is not None and os.geteuid() == 0:
            resource.setrlimit(resource.RLIMIT_NPROC, (LIMITS["processes"], LIMITS["processes"]))
        resource.setrlimit(resource.RLIMIT_NOFILE, (LIMITS["open_files"], LIMITS["open_files"]))
        resource.setrlimit(resource.RLIMIT_FSIZE, (LIMITS["file_size"], LIMITS["file_size"]))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if self.budget is not None:
            self.budget.enter()  # before exec: every process of the box is born inside its budget
        if self._die_with_grader:  # a grader killed outright (SIGKILL) takes its boxes along, bwrap's own included
            procs.die_with_parent()
        if self.kind == "uid":
            netfilter.install()  # last: no socket but AF_UNIX for anything the box runs

    def instead(self) -> str:
        """Where the box's budget is not a cgroup's, the limits that hold instead, in words ("" where it is): what
        `course doctor` and a run's output say."""
        if self.kind is None or self.budget is None or self.budget.kind != "watchdog":
            return ""
        processes = tr("RLIMIT_NPROC per host uid") if os.geteuid() == 0 else tr("RLIMIT_NPROC inside the box's user namespace")
        return tr(
            "no cgroup here ({why}): memory is a watchdog on the resident memory of the box's processes, sampled every "
            "{ms:.0f} ms; its tmpfs folders hold at most {tmp} MiB each; processes: {n} per box ({processes})",
            why=self.budget.why_not_cgroup,
            ms=budget.Watchdog.PERIOD * 1000,
            tmp=LIMITS["tmp_size"] >> 20,
            n=LIMITS["processes"],
            processes=processes,
        )

    def settle(self) -> None:
        """Once the warm process is ready: the budget becomes `memory` on top of what the box holds now."""
        if self.budget is not None:
            self.budget.base = self.budget.usage()
            self.budget.set_limit(self.budget.base + self.memory)

    def popen(self, argv: list[str], *, pass_fds: tuple[int, ...], stdout) -> subprocess.Popen:
        """Start `argv` as the box's first process; remember how to find (and end) everything it starts."""
        # The kernel sends the parent-death signal when the *thread* that started the box ends: only where that is
        # the main thread does it mean the grader's process ended.
        self._die_with_grader = self.kind is not None and threading.current_thread() is threading.main_thread()
        if self.kind == "bwrap":
            self._info_r, self._info_w = os.pipe()
            pass_fds = (*pass_fds, self._info_w)
        try:
            self.proc = subprocess.Popen(
                self.wrap(argv),
                pass_fds=pass_fds,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=subprocess.STDOUT,
                env=environment(self.home),
                start_new_session=True,
                preexec_fn=self.limit,
                cwd="/" if self.kind else None,
            )
        finally:
            if self._info_r is not None:
                os.close(self._info_w)
        if self.kind == "bwrap":
            assert self._info_r is not None  # the pipe made above
            self.init_pid = _child_pid(self._info_r)
            os.close(self._info_r)
        else:
            self.init_pid = self.proc.pid
        if self.budget is not None:
            self.budget.admit(self.proc.pid)  # a watchdog starts counting here; a cgroup holds it already
        return self.proc

    # -- what runs in it ---------------------------------------------------------------------------------
    def processes(self, *, zombies: bool = False) -> list[int]:
        """Every live process of the box, found from outside (host pids); with `zombies`, also those
        that exited and wait to be reaped."""
        if self.init_pid is None:
            return []
        if self.kind == "uid":
            pool = [p for p in _all_pids() if procs.status(p).get("Uid", "").split()[:1] == [str(self.uid)]]
        else:
            pool = [self.init_pid, *procs.descendants(self.init_pid)]
        return [p for p in pool if zombies or _alive(p)]

    def host_pid(self, inner: int, parent: int | None = None) -> int | None:
        """The host pid of the box's process that is `inner` in the box's pid namespace."""
        pool = procs.children_of(parent) if parent else self.processes()
        return next((p for p in pool if procs.inner_pid(p) == inner), None)

    def strays(self, keep: set[int]) -> list[str]:
        """Kill the box's processes outside `keep` and `frame`; name the ones that were running."""
        found = []
        for _ in range(5):
            extra = [
                p
                for p in self.processes(zombies=True)
                if p not in keep and p not in self.frame and not (not _alive(p) and _parent(p) in self.frame)
            ]  # a killed worker not yet reaped
            if not extra:
                break
            for pid in extra:
                name = procs.describe(pid)
                if name:
                    found.append(name)
                _kill(pid)
            time.sleep(0.01)
        return found[:10]

    # -- ending ------------------------------------------------------------------------------------------
    def close(self) -> None:
        """End every process of the box and remove its folders; every process is gone when this returns."""
        try:
            if self.kind == "uid" and self.init_pid is not None:
                _kill_uid(self.uid)
            elif self.init_pid is not None:
                for pid in [self.init_pid] + procs.descendants(self.init_pid):
                    _kill(pid)  # init first: the kernel then ends the whole pid namespace
            if self.proc is not None:
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            deadline = time.monotonic() + 5
            while (left := self.processes()) and time.monotonic() < deadline:
                for pid in left:
                    _kill(pid)
                time.sleep(0.02)
            if left:
                raise RuntimeError(f"the sandbox's processes {left} outlived it")
            for pid in cast("set[int]", {self.init_pid, *self.frame} - {None}):  # a subreaper adopts what bwrap's own leave
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
        finally:
            if self.budget is not None:
                self.budget.close()
            shutil.rmtree(self.root, ignore_errors=True)


# -- the file system ------------------------------------------------------------------------------------
def write_harness(dest: Path, code: tuple[str, ...] = ()) -> Path:
    """Copy `grader/isolation/` (the whole folder: it is what enters the sandbox) into
    `dest/grader/isolation/`, and each folder of the course named in `code` (its .py files) into `dest/`;
    `dest` is the root the student's processes import from."""
    package = dest / "grader" / "isolation"
    package.mkdir(parents=True)
    (dest / "grader" / "__init__.py").write_text("")
    for path in Path(__file__).resolve().parent.glob("*.py"):
        shutil.copyfile(path, package / path.name)
    course = Path(__file__).resolve().parents[2]
    for folder in code:
        (dest / folder).mkdir()
        for path in (course / folder).glob("*.py"):
            shutil.copyfile(path, dest / folder / path.name)
    for path in [dest, dest / "grader", package, *dest.rglob("*")]:
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    return dest


def _mounts(harness: Path, inbox: Path, packages: tuple[str, ...] = STUDENT_PACKAGES, binds: dict[str, str] | None = None) -> list[str]:
    """Mount options: system libraries, Python, the allowed packages, the harness, the submission, and any
    host folder to be seen read-only (`binds`: host path -> path in the box)."""
    args: list[str] = []
    made: set[str] = set()

    def parents(path: str) -> None:
        for parent in reversed(Path(path).parents):
            p = str(parent)
            if p != "/" and p not in made:
                made.add(p)
                args.extend(["--perms", "0755", "--dir", p])

    def bind(path: str) -> None:
        parents(path)
        made.add(path)
        args.extend(["--ro-bind", path, path])

    args += ["--proc", "/proc", *_dev()]  # first: what is bound below may live under /tmp
    for folder in ("/tmp", HOME):
        args += ["--size", str(LIMITS["tmp_size"]), "--perms", "1777", "--tmpfs", folder]
    made.update({"/dev", "/tmp", HOME})
    for path in SYSTEM:
        if os.path.islink(path):
            args.extend(["--symlink", os.readlink(path), path])
        elif os.path.exists(path):
            bind(path)
    for path in python_paths():
        bind(path)
    for site_dir, entries in package_paths(packages).items():
        args.extend(["--perms", "0755", "--tmpfs", site_dir])  # hides whatever else is installed there
        made.add(site_dir)
        for entry in entries:
            bind(entry)
    bind(str(harness))
    bind(str(inbox))
    for source, dest in (binds or {}).items():
        parents(dest)
        made.add(dest)
        args.extend(["--ro-bind", source, dest])
    return args


DEVICES = ("null", "zero", "full", "random", "urandom")
"""The device nodes a Python process needs; no terminal, no GPU, nothing else of the host's /dev."""
LINKS = {"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"}


def _dev() -> list[str]:
    """A small /dev of the box's own (bwrap's --dev makes a tmpfs as large as half the machine's memory, which
    a student could fill): a read-only folder with DEVICES bound from the host, the /dev/fd links, and a
    /dev/shm as small as /tmp (POSIX shared memory and semaphores live there)."""
    args = ["--perms", "0755", "--size", str(64 << 10), "--tmpfs", "/dev"]
    for name in DEVICES:
        args += ["--dev-bind", f"/dev/{name}", f"/dev/{name}"]
    for link, target in LINKS.items():
        args += ["--symlink", target, f"/dev/{link}"]
    args += ["--size", str(LIMITS["tmp_size"]), "--perms", "1777", "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
    return args


@functools.cache
def python_paths() -> list[str]:
    """The Python installation: the interpreter, the standard library, a venv's bin/ and pyvenv.cfg."""
    paths = [
        sys.base_prefix + "/bin",
        sysconfig.get_paths()["stdlib"],
        sysconfig.get_paths()["platstdlib"],
        sysconfig.get_config_var("LIBDIR") or "",
        sys.prefix + "/bin",
        sys.prefix + "/pyvenv.cfg",
        str(Path(sys.executable).resolve().parent),
    ]
    return [p for p in dict.fromkeys(paths) if p and os.path.exists(p) and not p.startswith(("/usr/", "/etc/"))]


@functools.cache
def package_paths(names: tuple[str, ...] = STUDENT_PACKAGES) -> dict[str, list[str]]:
    """Per site-packages folder, its files and folders that the packages `names` need (nothing else)."""
    sites = [s for s in dict.fromkeys(site.getsitepackages() + [site.getusersitepackages()]) if os.path.isdir(s)]
    wanted: dict[str, list[str]] = {s: [] for s in sites}
    for dist in _closure(names):
        for file in dist.files or ():
            if file.parts and file.parts[0] != "..":
                top = os.path.normpath(str(dist.locate_file(file.parts[0])))
                home = next((s for s in sites if top.startswith(s + os.sep)), None)
                if home and top not in wanted[home] and os.path.lexists(top):  # a RECORD may list what is gone
                    wanted[home].append(top)
    return wanted


def _closure(names: tuple[str, ...]) -> list[metadata.Distribution]:
    """The installed distributions `names` need, following their requirements (extras left out)."""
    seen: dict[str, metadata.Distribution] = {}
    todo = list(names)
    while todo:
        name = re.split(r"[\s<>=!~;\[(]", todo.pop(), maxsplit=1)[0].lower().replace("_", "-")
        if name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        seen[name] = dist
        todo += [r for r in dist.requires or () if "extra ==" not in r]
    return list(seen.values())


# -- processes ------------------------------------------------------------------------------------------
def _setpriv(uid: int) -> list[str]:
    return [
        "setpriv",
        f"--reuid={uid}",
        f"--regid={uid}",
        "--clear-groups",
        "--no-new-privs",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--",
    ]


def _child_pid(fd: int, timeout: float = 30.0) -> int | None:
    """bwrap's --info-fd: the host pid of the box's first process (its pid namespace's init)."""
    import select

    data = b""
    deadline = time.monotonic() + timeout
    while b"}" not in data and time.monotonic() < deadline:
        if not select.select([fd], [], [], max(deadline - time.monotonic(), 0))[0]:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    try:
        return int(json.loads(data[: data.index(b"}") + 1])["child-pid"])
    except (ValueError, KeyError):
        return None


def _parent(pid: int) -> int | None:
    ppid = procs.status(pid).get("PPid", "")
    return int(ppid) if ppid.isdigit() else None


def _alive(pid: int) -> bool:
    """Running or stopped, not a zombie that is only waiting to be reaped."""
    state = procs.status(pid).get("State", "")
    return bool(state) and not state.startswith(("Z", "X"))


def _all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def _kill_uid(uid: int) -> None:
    """End every process of `uid`: `kill -9 -1` as that uid reaches all of them at once, forks included."""
    for _ in range(20):
        pids = [p for p in _all_pids() if procs.status(p).get("Uid", "").split()[:1] == [str(uid)]]
        if not pids:
            return
        # under the box's filter too: no process of the uid ever runs without it (one could be taken over)
        subprocess.run([*_setpriv(uid), "kill", "-9", "-1"], capture_output=True, env=environment(), preexec_fn=netfilter.install)
        for pid in pids:
            _kill(pid)
        time.sleep(0.05)
