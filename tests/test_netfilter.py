"""The uid boundary's network filter (grader.isolation.netfilter), attacked from a process it is
installed in: every way to a network socket this machine has is tried, and only AF_UNIX works.
No privilege is needed (the filter sets no_new_privs itself); each attempt is a fresh interpreter
started under the filter, as the sandbox starts the student's processes."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys

import pytest

from grader.isolation import netfilter

try:
    netfilter.prepare()
    FILTER, WHY = True, ""
except netfilter.Unsupported as e:
    FILTER, WHY = False, str(e)
needs_filter = pytest.mark.skipif(not FILTER, reason=f"no seccomp filter on this machine: {WHY}")

ATTEMPTS = r"""
import ctypes, errno, json, os, socket, sys
out = {}
def attempt(name, make):
    try:
        thing = make()
        (thing.close() if hasattr(thing, "close") else [s.close() for s in thing])
        out[name] = "opened"
    except OSError as e:
        out[name] = errno.errorcode.get(e.errno, str(e.errno))
attempt("unix stream", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
attempt("unix pair", lambda: socket.socketpair(socket.AF_UNIX))
attempt("tcp", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))
attempt("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
attempt("tcp6", lambda: socket.socket(socket.AF_INET6, socket.SOCK_STREAM))
attempt("raw", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
attempt("ping", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP))
attempt("packet", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW))
attempt("netlink", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0))
attempt("inet pair", lambda: socket.socketpair(socket.AF_INET))
libc = ctypes.CDLL(None, use_errno=True)
def syscall(name, *args):
    r = libc.syscall(*args)
    out[name] = "opened" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")
socket_nr = {"x86_64": 41, "aarch64": 198}[os.uname().machine]
# the domain in the low 32 bits, garbage above: the kernel reads an int, so must the filter
syscall("tcp, high bits set", socket_nr, ctypes.c_long(socket.AF_INET | (1 << 32)), socket.SOCK_STREAM, 0)
syscall("unix, high bits set", socket_nr, ctypes.c_long(socket.AF_UNIX | (1 << 32)), socket.SOCK_STREAM, 0)
syscall("io_uring_setup", 425, 4, ctypes.create_string_buffer(120))
syscall("io_uring_enter", 426, -1, 0, 0, 0, None, 0)
syscall("io_uring_register", 427, -1, 0, None, 0)
pidfd = os.pidfd_open(os.getppid()) if hasattr(os, "pidfd_open") else -1
syscall("pidfd_getfd", 438, pidfd, 0, 0)
print(json.dumps(out))
"""


def attempts(filtered: bool) -> dict[str, str]:
    out = subprocess.run(
        [sys.executable, "-I", "-c", ATTEMPTS],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=netfilter.install if filtered else None,
        env={**os.environ, netfilter.SKIP_ENV: "0"},
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@needs_filter
def test_only_unix_sockets_open_under_the_filter():
    found = attempts(filtered=True)
    assert found.pop("unix stream") == found.pop("unix pair") == found.pop("unix, high bits set") == "opened"
    for call in ("io_uring_setup", "io_uring_enter", "io_uring_register", "pidfd_getfd"):
        assert found.pop(call) == "EPERM", call
    assert found == dict.fromkeys(found, "EACCES"), found  # every other socket, whatever its family


@needs_filter
def test_without_the_filter_the_same_attempts_get_sockets():
    """The attempts above can succeed here: the filter, not this machine, stops them."""
    found = attempts(filtered=False)
    assert found["tcp"] == found["udp"] == found["netlink"] == found["tcp, high bits set"] == "opened", found


@needs_filter
def test_another_abi_is_killed():
    """A call through x86-64's x32 ABI (bit 30 of the number) kills the process: the socket numbers
    the filter knows are the native ABI's only."""
    if os.uname().machine != "x86_64":
        pytest.skip("x32 is x86-64's")
    code = "import ctypes; ctypes.CDLL(None).syscall(0x40000000 | 41, 2, 1, 0); print('survived')"
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60, preexec_fn=netfilter.install)
    assert out.returncode == -signal.SIGSYS and "survived" not in out.stdout


@needs_filter
def test_the_program_checks_the_architecture_first():
    """Its first instructions load the architecture and jump to the kill for any but this machine's."""
    code = netfilter.program()
    audit_arch = netfilter.ARCHES[netfilter.machine()][0]
    assert code[0] == (0x20, 0, 0, 4) and code[1][0] == 0x15 and code[1][3] == audit_arch
    assert code[2 + code[1][2]] == (0x06, 0, 0, netfilter.RET_KILL_PROCESS)
    assert code[-1] == (0x06, 0, 0, netfilter.RET_KILL_PROCESS)
    assert (0x06, 0, 0, netfilter.RET_ERRNO | errno.EACCES) in code


def test_every_architecture_it_knows_builds():
    for arch in netfilter.ARCHES:
        assert len(netfilter.program(arch)) < 32
