"""No network for the uid boundary: a seccomp filter installed before exec, built here with ctypes.

The uid boundary (`grader.isolation.sandbox`, kind "uid") has no network namespace: the student's
processes share the container's network. This filter takes it away from them, and needs no privilege
beyond `no_new_privs` (which it sets). What it does, in the kernel, for every system call:

- the architecture must be this build's own (AUDIT_ARCH_X86_64 or AUDIT_ARCH_AARCH64): a call made
  through another ABI (i386's `int 0x80`, arm32 compat, whose `socketcall` multiplexes sockets) kills
  the process, as does x86-64's x32 ABI (call numbers with bit 30 set); on any other machine no filter
  is built and the uid boundary is refused (`Unsupported`);
- `socket` and `socketpair` fail with EACCES unless the domain is AF_UNIX (the low 32 bits of the
  first argument: the kernel reads it as an int): no TCP, UDP, raw, packet, netlink, vsock, ... socket;
- `io_uring_setup`, `io_uring_enter` and `io_uring_register` fail with EPERM: io_uring can open
  sockets (IORING_OP_SOCKET) without the socket call;
- `pidfd_getfd` fails with EPERM: it copies an open descriptor (a socket) out of another process.

What it does not cover: a socket handed over an AF_UNIX socket (SCM_RIGHTS) by a process outside the
filter that listens on a path or abstract name the student can reach. Every process of the student's
uid runs under this filter (the box's and the one that ends them, `sandbox._kill_uid`), and the
bundle's start-up probe checks from outside that the network cannot be reached.

Filters are inherited over fork and exec and cannot be removed. `prepare()` builds the program in the
parent; `install()`, run in the child between fork and exec (`preexec_fn`), only makes two prctl calls.
`SKIP_ENV=1` in the grader's environment skips installing it: a switch for the tests, which show that
the start-up probe then refuses to grade.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import socket
import struct

SKIP_ENV = "COURSE_TEST_SKIP_NETFILTER"
"""Set to 1, `install` installs nothing (tests: the probe must then refuse to grade)."""

# <linux/filter.h>, <linux/seccomp.h>, <linux/audit.h>, <linux/prctl.h>
_LD_W_ABS = 0x00 | 0x00 | 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x05 | 0x10 | 0x00  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x05 | 0x30 | 0x00  # BPF_JMP | BPF_JGE | BPF_K
_RET_K = 0x06 | 0x00  # BPF_RET | BPF_K
RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000
RET_ALLOW = 0x7FFF0000
_NR, _ARCH, _ARG0 = 0, 4, 16
"""Offsets in struct seccomp_data: the call's number, its architecture, the low word of its first
argument (both architectures are little-endian)."""
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, PR_GET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 21, 2
X32_SYSCALL_BIT = 0x40000000

ARCHES = {
    # machine: (AUDIT_ARCH_*, {call: number}) from the kernel's syscall tables
    "x86_64": (
        0xC000003E,
        {"socket": 41, "socketpair": 53, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "pidfd_getfd": 438},
    ),
    "aarch64": (
        0xC00000B7,
        {"socket": 198, "socketpair": 199, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "pidfd_getfd": 438},
    ),
}
SOCKET_CALLS = ("socket", "socketpair")
"""Allowed for AF_UNIX only, else EACCES."""
DENIED_CALLS = ("io_uring_setup", "io_uring_enter", "io_uring_register", "pidfd_getfd")
"""Always EPERM."""


class Unsupported(RuntimeError):
    """No filter can be installed here (another machine, another OS, a kernel without seccomp)."""


class _Filter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Filter))]


def machine() -> str:
    """This process's architecture as the filter knows it ("x86_64", "aarch64"), or Unsupported."""
    name = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine().lower(), platform.machine().lower())
    if not os.uname().sysname == "Linux":
        raise Unsupported(f"seccomp is Linux's; this is {os.uname().sysname}")
    if name not in ARCHES or struct.calcsize("P") != 8:
        bits = 8 * struct.calcsize("P")
        raise Unsupported(f"no network filter for this machine ({platform.machine()}, {bits}-bit Python): x86-64 or aarch64 only")
    return name


def program(arch: str | None = None) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k) instructions for `arch` (this machine's by default)."""
    audit_arch, numbers = ARCHES[arch or machine()]
    ops: list[tuple[int, object, object, int]] = []  # jt/jf: a label, or 0 (the next instruction)

    def op(code: int, k: int, jt: object = 0, jf: object = 0) -> None:
        ops.append((code, jt, jf, k))

    op(_LD_W_ABS, _ARCH)
    op(_JEQ_K, audit_arch, 0, "kill")
    op(_LD_W_ABS, _NR)
    if (arch or machine()) == "x86_64":
        op(_JGE_K, X32_SYSCALL_BIT, "kill", 0)
    for name in SOCKET_CALLS:
        op(_JEQ_K, numbers[name], "domain", 0)
    for name in DENIED_CALLS:
        op(_JEQ_K, numbers[name], "eperm", 0)
    op(_RET_K, RET_ALLOW)
    labels = {"domain": len(ops)}
    op(_LD_W_ABS, _ARG0)
    op(_JEQ_K, int(socket.AF_UNIX), 0, "eacces")
    op(_RET_K, RET_ALLOW)
    labels["eacces"] = len(ops)
    op(_RET_K, RET_ERRNO | errno.EACCES)
    labels["eperm"] = len(ops)
    op(_RET_K, RET_ERRNO | errno.EPERM)
    labels["kill"] = len(ops)
    op(_RET_K, RET_KILL_PROCESS)

    def offset(at: int, target: object) -> int:
        if target == 0:
            return 0
        jump = labels[str(target)] - at - 1
        if not 0 <= jump < 256:  # classic BPF jumps forward only, by at most 255
            raise ValueError(f"a jump to {target} of {jump} instructions")
        return jump

    return [(code, offset(i, jt), offset(i, jf), k) for i, (code, jt, jf, k) in enumerate(ops)]


_prepared: tuple[ctypes.CDLL, _Program, ctypes.Array] | None = None


def prepare() -> None:
    """Build this machine's filter and find libc's prctl, in the parent, before any fork that
    installs it (so that the child allocates nothing); Unsupported where there is none."""
    global _prepared
    if _prepared is None:
        code = program()
        array = (_Filter * len(code))(*[_Filter(*ins) for ins in code])
        try:
            libc = ctypes.CDLL(None, use_errno=True)
        except OSError as e:
            raise Unsupported(f"libc cannot be loaded ({e})") from None
        _prepared = (libc, _Program(len(code), ctypes.cast(array, ctypes.POINTER(_Filter))), array)


def install() -> None:
    """Install the filter in this process (`no_new_privs` first), for it and everything it starts:
    run between fork and exec. OSError when the kernel refuses (the process then must not go on)."""
    if os.environ.get(SKIP_ENV) == "1":
        return
    prepare()
    assert _prepared is not None
    libc, prog, _ = _prepared
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) refused")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) refused: a kernel without seccomp filters")


def supported() -> str:
    """A sentence saying the filter can be built here; Unsupported saying why not."""
    prepare()
    return f"no network (a seccomp filter: sockets other than AF_UNIX and io_uring refused, {machine()})"
