"""One budget for everything a run's student code does: memory it *uses*, never address space it reserves.

A CUDA or ROCm build of torch reserves gigabytes of address space when it loads, without using them, so
a limit on address space (RLIMIT_AS) fails every correct answer there. A budget counts what is used:
the resident pages of every process of the submission, and the pages of the tmpfs folders it writes.

`make` gives the best budget this machine allows, in this order:

- **cgroup v2** (current distributions): a cgroup of its own with `memory.max` (no swap) and
  `pids.max`, its peak in `memory.peak`, the kernel's kills in `memory.events`;
- **cgroup v1** (machines whose memory controller is on v1): `memory.limit_in_bytes`,
  `memory.max_usage_in_bytes`, `memory.oom_control`, and the v1 pids controller;
- **watchdog** (no cgroup can be made: a student's laptop, macOS, Windows, an unprivileged grader
  without a delegated subtree): a thread polls the resident memory of the budget's processes and
  kills the largest one over budget. It samples (every `Watchdog.PERIOD` seconds), so a spike
  shorter than that can pass unseen, and tmpfs pages are bounded by their mounts' sizes instead.

A cgroup budget is a folder `D` with the processes in `D/main` and one `D/measure-N` per measured
call (cgroup v2 allows processes only in leaves): `D`'s limit holds for all of them together.
Pages are charged to the cgroup of the process that first touches them, so a process moved into a
budget is charged only for what it uses from then on (not for the torch it imported before).
Everything here is measured from outside the student's processes: nothing they say is read.
"""

from __future__ import annotations

import errno
import itertools
import os
import threading
import time
from pathlib import Path

from grader.isolation import portable

KINDS = ("cgroup v2", "cgroup v1", "watchdog")
DEFAULT_LIMIT = 2 << 30
"""Bytes a run's student code may use unless told otherwise (`--memory-limit`)."""
PROCESSES = 128
"""Processes and threads a budget's processes may have at once, where a pids controller counts them."""
_names = itertools.count()
_tidied: list[int] = []


class Budget:
    """What every budget offers. `limit` is in bytes; `kind` one of KINDS; `why_not_cgroup` says, for a
    watchdog, why no cgroup could be made (for `course doctor` and the run's output)."""

    kind = "watchdog"
    why_not_cgroup = ""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.base = 0
        """Bytes the budget held before any student code ran (a box's warm process): not the submission's."""

    def enter(self) -> None:
        """Put the calling process into the budget (called between fork and exec; a watchdog admits later)."""

    def admit(self, pid: int) -> None:
        """Count process `pid` (and every process it starts) from now on."""
        raise NotImplementedError

    def set_limit(self, limit: int) -> None:
        self.limit = limit

    def usage(self) -> int:
        """Bytes in use now."""
        raise NotImplementedError

    def peak(self) -> int:
        """The most bytes in use at once since the budget was made."""
        raise NotImplementedError

    def kills(self) -> int:
        """How many processes were killed so far for going over the budget."""
        raise NotImplementedError

    def measure(self, pid: int) -> Budget:
        """A budget of its own for process `pid` (a measured call), nested in this one: its `peak()` is
        what that process and the processes it starts used from now on; it ends with `close()`."""
        raise NotImplementedError

    def close(self) -> None:
        """Kill what is left in the budget and give its resources back."""

    def describe(self) -> str:
        """One line for people: the kind, the limit, and what it counts."""
        what = "every process's resident memory and its tmpfs pages" if self.kind != "watchdog" else "the resident memory of its processes"
        return f"{_size(self.limit)} for {what} ({self.kind})"


def make(limit: int, *, processes: int = PROCESSES, prefer: str | None = None) -> Budget:
    """The best budget this machine allows (see the module's docstring); `prefer` "watchdog" skips cgroups."""
    why = "the portable path was asked for (COURSE_PORTABLE=1)" if portable.FORCED else ""
    if prefer != "watchdog" and not why:
        try:
            if not _tidied:
                _tidied.append(stale())  # once per process: what a grader killed outright left behind
            return Cgroup(limit, processes=processes)
        except CgroupUnavailable as e:
            why = str(e)
    watchdog = Watchdog(limit)
    watchdog.why_not_cgroup = why or "asked for"
    return watchdog


def probe() -> str:
    """What budget a run gets here, in words (for `course doctor`), without keeping one."""
    budget = make(1 << 30)
    try:
        return budget.kind if budget.kind != "watchdog" else f"watchdog ({budget.why_not_cgroup})"
    finally:
        budget.close()


# -- cgroups ------------------------------------------------------------------------------------------------
class CgroupUnavailable(RuntimeError):
    """No cgroup with a memory controller can be made here; the message says why."""


class Cgroup(Budget):
    """A budget of cgroup v2 or v1 (whichever carries the memory controller here)."""

    def __init__(self, limit: int, *, processes: int = PROCESSES, _parent: Cgroup | None = None) -> None:
        super().__init__(limit)
        self.version: int
        self.dirs: dict[str, Path]
        if _parent is not None:
            self.version, self.dirs = _parent.version, {c: d / f"measure-{next(_names)}" for c, d in _parent.dirs.items()}
            for d in self.dirs.values():
                d.mkdir()
            self.leaves = dict(self.dirs)
        else:
            self.version, bases = _bases()
            name = f"course-{_pid_namespace()}-{os.getpid()}-{next(_names)}"
            self.dirs = {c: base / name for c, base in bases.items()}
            try:
                for d in self.dirs.values():
                    d.mkdir()
                if self.version == 2:
                    _enable(self.dirs["memory"], ("memory", "pids"))
                self.leaves = {c: d / "main" for c, d in self.dirs.items()}
                for d in self.leaves.values():
                    d.mkdir()
            except OSError as e:
                self.close()
                raise CgroupUnavailable(f"no cgroup could be made in {bases['memory']} ({e.strerror or e})") from None
        self.kind = f"cgroup v{self.version}"
        self._write_limits(limit, processes)

    def _write_limits(self, limit: int, processes: int) -> None:
        memory, pids = self.dirs["memory"], self.dirs.get("pids")
        if self.version == 2:
            _write(memory / "memory.max", limit)
            _write(memory / "memory.swap.max", 0, missing_ok=True)  # no swap: what is over the budget is over it
            if pids is not None:
                _write(pids / "pids.max", processes, missing_ok=True)
        else:
            _write(memory / "memory.limit_in_bytes", limit)
            _write(memory / "memory.memsw.limit_in_bytes", limit, missing_ok=True)
            if pids is not None:
                _write(pids / "pids.max", processes)

    def set_limit(self, limit: int) -> None:
        memory = self.dirs["memory"]
        if self.version == 2:
            _write(memory / "memory.max", limit)
        else:  # memsw may never be below the memory limit: raise it first, lower it last
            order = ("memory.memsw.limit_in_bytes", "memory.limit_in_bytes")
            for file in order if limit > self.limit else reversed(order):
                _write(memory / file, limit, missing_ok=file.startswith("memory.memsw"))
        self.limit = limit

    def enter(self) -> None:
        for leaf in self.leaves.values():
            _write(leaf / "cgroup.procs", 0)  # 0: the writing process itself

    def admit(self, pid: int) -> None:
        for leaf in self.leaves.values():
            try:
                _write(leaf / "cgroup.procs", pid)
            except ProcessLookupError:  # already gone: nothing left to count
                return

    def usage(self) -> int:
        memory = self.dirs["memory"]
        return _read_int(memory / ("memory.current" if self.version == 2 else "memory.usage_in_bytes"))

    def peak(self) -> int:
        memory = self.dirs["memory"]
        if self.version == 2:  # memory.peak: Linux 5.19 and newer
            return _read_int(memory / "memory.peak", default=self.usage())
        return _read_int(memory / "memory.max_usage_in_bytes")

    def kills(self) -> int:
        """The kernel's out-of-memory kills in the budget (v1 counts them where the limit was hit: add the leaves)."""
        memory = self.dirs["memory"]
        if self.version == 2:
            return _field(memory / "memory.events", "oom_kill")
        return sum(_field(d / "memory.oom_control", "oom_kill") for d in (memory, *memory.iterdir()) if d.is_dir())

    def measure(self, pid: int) -> Budget:
        sub = Cgroup(self.limit, _parent=self)
        sub.admit(pid)
        return sub

    def processes(self) -> list[int]:
        """The pids in the budget (every leaf, recursively)."""
        found: list[int] = []
        for folder, _, _ in os.walk(self.dirs["memory"]):
            try:
                found += [int(p) for p in Path(folder, "cgroup.procs").read_text().split()]
            except OSError:
                pass
        return found

    def close(self) -> None:
        """Kill every process in it (all at once where the kernel can), then remove its folders."""
        memory = self.dirs.get("memory")
        if memory is not None and memory.exists():
            if self.version == 2 and (memory / "cgroup.kill").exists():
                try:
                    _write(memory / "cgroup.kill", 1)
                except OSError:
                    pass
            deadline = time.monotonic() + 5
            while (left := self.processes()) and time.monotonic() < deadline:
                for pid in left:
                    portable.kill(pid)
                time.sleep(0.01)
        for d in self.dirs.values():
            for folder in sorted((p for p in d.glob("*") if p.is_dir()), reverse=True) + [d]:
                try:
                    folder.rmdir()
                except FileNotFoundError:
                    pass
                except OSError:  # still busy: a process that would not die keeps its cgroup; nothing else leaks
                    pass


def _bases() -> tuple[int, dict[str, Path]]:
    """Where this process may make cgroups: (version, {controller: folder}); CgroupUnavailable if nowhere."""
    if not portable.has_proc():
        raise CgroupUnavailable("this system has no cgroups (not Linux)")
    own = _own_cgroups()
    mounts = _cgroup_mounts()
    if "memory" in mounts.get("v1", {}):  # the memory controller lives on v1 here
        v1 = mounts["v1"]
        bases: dict[str, Path] = {c: _join(v1[c], own.get(c, "/")) for c in ("memory", "pids") if c in v1}
        for controller, base in bases.items():
            if not os.access(base, os.W_OK):
                if controller == "memory":
                    raise CgroupUnavailable(f"this user may not make cgroups in {base} (cgroup v1: root, or a folder chown-ed to it)")
                del bases[controller]
        return 1, bases
    if "v2" not in mounts:
        raise CgroupUnavailable("no cgroup file system is mounted")
    mount, root = mounts["v2"]["unified"]
    here = _join((mount, root), own.get("", "/"))
    tried = []
    for base in _v2_candidates(here, Path(mount)):
        controllers = _words(base / "cgroup.subtree_control")
        if "memory" in controllers and os.access(base, os.W_OK) and os.access(base / "cgroup.procs", os.W_OK):
            return 2, {"memory": base, **({"pids": base} if "pids" in controllers else {})}
        tried.append(str(base))
    if _claim(here):
        return 2, {"memory": here, **({"pids": here} if "pids" in _words(here / "cgroup.subtree_control") else {})}
    raise CgroupUnavailable(
        f"no cgroup v2 folder with the memory controller is writable by this user (tried {', '.join(tried) or here}); "
        f"a delegated subtree (systemd's Delegate=yes) or root gives one, or COURSE_CGROUP=DIR names one"
    )


def _v2_candidates(here: Path, mount: Path) -> list[Path]:
    """COURSE_CGROUP if set; this process's cgroup; its parent (a delegated slice where our cgroup is a leaf)."""
    named = os.environ.get("COURSE_CGROUP")
    found = [Path(named)] if named else []
    found.append(here)
    if here != mount:
        found.append(here.parent)
    return found


def _claim(here: Path) -> bool:
    """Make this process's own cgroup v2 usable when it is alone in it (a container's grader, a scope of its
    own): move into a leaf `course-grader` below it, then enable memory and pids there. Never moves others."""
    try:
        if "memory" not in _words(here / "cgroup.controllers") or not os.access(here, os.W_OK):
            return False
        if set(_words(here / "cgroup.procs")) - {str(os.getpid())}:
            return False
        leaf = here / "course-grader"
        leaf.mkdir(exist_ok=True)
        _write(leaf / "cgroup.procs", os.getpid())
        _enable(here, ("memory", "pids"))
        return "memory" in _words(here / "cgroup.subtree_control")
    except OSError:
        return False


def _enable(folder: Path, controllers: tuple[str, ...]) -> None:
    """Let the children of a cgroup v2 folder use these controllers (those it has)."""
    have = _words(folder / "cgroup.controllers")
    wanted = " ".join(f"+{c}" for c in controllers if c in have)
    if wanted:
        (folder / "cgroup.subtree_control").write_text(wanted)


def _own_cgroups(text: str | None = None) -> dict[str, str]:
    """This process's cgroup per controller ("" for cgroup v2), from /proc/self/cgroup (or its `text`)."""
    own: dict[str, str] = {}
    for line in (Path("/proc/self/cgroup").read_text() if text is None else text).splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            own[c] = path
    return own


def _cgroup_mounts(text: str | None = None) -> dict[str, dict[str, tuple[str, str]]]:
    """Mounted cgroup file systems, from /proc/self/mountinfo (or its `text`): {"v1": {controller: (mount
    point, root)}, "v2": {"unified": (mount point, root)}}."""
    found: dict[str, dict[str, tuple[str, str]]] = {}
    for line in (Path("/proc/self/mountinfo").read_text() if text is None else text).splitlines():
        left, _, right = line.partition(" - ")
        fields, (fstype, _, options) = left.split(), (right.split() + ["", "", ""])[:3]
        root, point = _unescape(fields[3]), _unescape(fields[4])
        if fstype == "cgroup2":
            found.setdefault("v2", {}).setdefault("unified", (point, root))
        elif fstype == "cgroup":
            for option in options.split(","):
                if option in ("memory", "pids"):
                    found.setdefault("v1", {}).setdefault(option, (point, root))
    return found


def _join(mount: tuple[str, str], path: str) -> Path:
    """The folder of cgroup `path` under a mount whose own root is `root` (a container may mount a subtree)."""
    point, root = mount
    rel = os.path.relpath(path, root) if path.startswith(root) else path.lstrip("/")
    return Path(point) if rel in (".", "") else Path(point) / rel.lstrip("/")


def _unescape(s: str) -> str:
    return s.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def _words(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []


def _write(path: Path, value: int, *, missing_ok: bool = False) -> None:
    try:
        fd = os.open(path, os.O_WRONLY)
    except FileNotFoundError:
        if missing_ok:
            return
        raise
    try:
        os.write(fd, str(value).encode())
    except OSError as e:
        if e.errno == errno.ESRCH:
            raise ProcessLookupError(f"no process {value}") from None
        raise
    finally:
        os.close(fd)


def _read_int(path: Path, default: int = 0) -> int:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return default


def _field(path: Path, name: str) -> int:
    """The value of `name` in a file of "name value" lines (memory.events, memory.oom_control)."""
    for line in _words_lines(path):
        key, _, value = line.partition(" ")
        if key == name and value.strip().isdigit():
            return int(value)
    return 0


def _words_lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except OSError:
        return []


# -- the watchdog -------------------------------------------------------------------------------------------
class Watchdog(Budget):
    """A thread that polls the resident memory of the admitted processes and of every process they start.

    What counts: each process's private resident memory (anonymous pages), less what an admitted process
    already had when it was admitted (a process forked from a warm one shares the warm one's pages).
    Over the limit, the process that grew most is killed (SIGKILL), and `kills()` says so.
    """

    PERIOD = 0.02
    """Seconds between two looks (a measured call looks every MEASURE_PERIOD)."""
    MEASURE_PERIOD = 0.004

    def __init__(self, limit: int, *, period: float | None = None, _roots: dict[int, int] | None = None) -> None:
        super().__init__(limit)
        self.period = period or self.PERIOD
        self.roots: dict[int, int] = dict(_roots or {})
        """Admitted pid -> the bytes it had when admitted."""
        self.born: dict[int, float | None] = {}
        """Admitted pid -> when it started (`portable.started`), so that a pid taken over later is never killed."""
        self._peak = 0
        self._kills = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def admit(self, pid: int) -> None:
        base = portable.private_memory(pid)
        with self._lock:
            self.roots[pid] = base if base is not None else 0
            self.born[pid] = portable.started(pid)
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="course-memory-watchdog", daemon=True)
            self._thread.start()

    def usage(self) -> int:
        return sum(self._sizes().values())

    def _sizes(self) -> dict[int, int]:
        """Bytes each process of the budget counts for now."""
        with self._lock:
            roots = dict(self.roots)
        sizes: dict[int, int] = {}
        for root, base in roots.items():
            for pid in [root, *portable.descendants(root)]:
                if pid in sizes:
                    continue
                size = portable.private_memory(pid)
                if size is None:
                    if pid == root:
                        with self._lock:
                            self.roots.pop(root, None)  # gone: a later process with this pid is not it
                    continue
                sizes[pid] = max(size - roots.get(pid, 0), 0) if pid in roots else size
        return sizes

    def _watch(self) -> None:
        while not self._stop.wait(self.period):
            sizes = self._sizes()
            total = sum(sizes.values())
            self._peak = max(self._peak, total)
            if total > self.limit and sizes:
                victim = max(sizes, key=lambda p: sizes[p])
                portable.kill(victim)
                self._kills += 1

    def peak(self) -> int:
        self._peak = max(self._peak, self.usage())
        return self._peak

    def kills(self) -> int:
        return self._kills

    def measure(self, pid: int) -> Budget:
        sub = Watchdog(self.limit, period=self.MEASURE_PERIOD)
        sub.admit(pid)
        return sub

    def close(self) -> None:
        """Stop watching, and kill what is left of the admitted processes and theirs."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=1)
        with self._lock:
            roots, self.roots = list(self.roots), {}
        for root in roots:
            if portable.started(root) == self.born.get(root):  # still the process admitted, not a later one
                portable.kill_tree(root)


def _size(n: int) -> str:
    return f"{n / 2**30:.3g} GiB" if n >= 1 << 30 else f"{n / 2**20:.4g} MiB"


def _pid_namespace() -> int:
    """This process's pid namespace (its inode): a budget's name carries it, so that `stale` only ever judges the
    budgets of graders whose pids it can see (a grader in a container of its own shares the cgroup tree, not the pids)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def stale(prefix: str = "course-") -> int:
    """Remove the budget folders that a grader of this pid namespace, killed outright, left behind (its pid is gone),
    ending any process still in them (a sandbox of that grader); how many were removed."""
    removed = 0
    try:
        version, bases = _bases()
    except CgroupUnavailable:
        return 0
    ours = str(_pid_namespace())
    for base in bases.values():
        for folder in base.glob(prefix + "*-*-*"):
            _, namespace, pid, _ = (folder.name.split("-") + ["", "", "", ""])[:4]
            if namespace != ours or not pid.isdigit() or Path(f"/proc/{pid}").exists():
                continue
            for inner, _, _ in os.walk(folder):
                for p in _words(Path(inner) / "cgroup.procs"):
                    portable.kill(int(p))
            for sub in sorted((p for p in folder.glob("*") if p.is_dir()), reverse=True) + [folder]:
                for _ in range(50):  # a killed process leaves its cgroup a moment later
                    try:
                        sub.rmdir()
                        removed += sub == folder
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        time.sleep(0.01)
    return removed
