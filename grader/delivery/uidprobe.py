"""The uid boundary's start-up probe: before a submission runs as the student's uid, check as that uid
that it can read nothing private, write nothing of the results and reach no network.

The Gradescope bundle runs the student's code as a dedicated uid without namespaces where bubblewrap
cannot make its sandbox (`grader.delivery.gradescope`). That boundary rests on file permissions and on
`grader.isolation.netfilter`'s seccomp filter; here both are tried, in the very box the submission will
get (`Box("uid")`: the same uid, limits and filter, the same Python), before any of its code runs:

- every private path given (all of /autograder but the submission, the installed course package, the
  chapter's reference and hidden checks) must be unreadable (a folder unlistable);
- a file must not be creatable in the results folder;
- the network must be out of reach: the trusted side opens a TCP listener and a UDP socket on
  127.0.0.1, the probe connects and sends a token to each, and what arrived is read from outside (a
  connection queued on the listener, a datagram on the socket), whatever the probe says; it also tries
  sockets of other families (IPv6, raw, packet, netlink) and io_uring, and says which it could open.

Any of these, a probe that does not run to its end, or one that cannot be run, is a problem: the
bundle then refuses to grade (score 0, the fix named, a failing exit status).
"""

from __future__ import annotations

import secrets
import socket
import subprocess
import sys
from pathlib import Path

PROBE = r"""
import ctypes, os, socket, sys
canary, tcp, udp, token = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].encode()
found = []
for path in sys.argv[5:]:
    try:
        os.listdir(path) if os.path.isdir(path) else open(path, "rb").close()
        found.append("can read " + path)
    except OSError:
        pass
try:
    os.close(os.open(canary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    found.append("can write " + os.path.dirname(canary))
except OSError:
    pass
try:
    with socket.create_connection(("127.0.0.1", tcp), timeout=5) as s:
        s.sendall(token)
    found.append("can connect over TCP to 127.0.0.1:%d" % tcp)
except OSError:
    pass
try:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(token, ("127.0.0.1", udp))
    found.append("can send UDP to 127.0.0.1:%d" % udp)
except OSError:
    pass
kinds = [("IPv6", socket.AF_INET6, socket.SOCK_STREAM, 0), ("raw IP", socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
         ("ICMP", socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP), ("packet", getattr(socket, "AF_PACKET", 17), socket.SOCK_RAW, 0),
         ("netlink", getattr(socket, "AF_NETLINK", 16), socket.SOCK_RAW, 0)]
for name, family, kind, proto in kinds:
    try:
        socket.socket(family, kind, proto).close()
        found.append("can open a %s socket" % name)
    except OSError:
        pass
libc = ctypes.CDLL(None, use_errno=True)
params = ctypes.create_string_buffer(120)  # struct io_uring_params
fd = libc.syscall(425, 4, params)  # io_uring_setup: 425 on x86-64 and aarch64
if fd >= 0:
    os.close(fd)
    found.append("can set up io_uring")
print("\n".join(found + ["probe done"]))
"""
"""Run as the student's uid, in the student's box: a line for each thing it could do that it must not,
then "probe done"."""


def problems(uid: int, results: Path, private: list[Path]) -> list[str]:
    """What uid `uid` could do in its box that it must not (read `private`, write in `results`, reach
    the network), found by running PROBE in `Box("uid")`; a probe that fails to run is a problem too."""
    from grader.isolation.sandbox import Box, environment

    token = secrets.token_hex(8)
    canary = results / f".can-the-student-write-{secrets.token_hex(4)}"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as datagrams:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        datagrams.bind(("127.0.0.1", 0))
        tcp, udp = listener.getsockname()[1], datagrams.getsockname()[1]
        box = Box("uid", uid=uid)
        try:
            out = subprocess.run(
                box.wrap([sys.executable, "-I", "-S", "-c", PROBE, str(canary), str(tcp), str(udp), token, *map(str, private)]),
                capture_output=True,
                text=True,
                timeout=60,
                env=environment(box.home),
                preexec_fn=box.limit,  # the student's limits and network filter
                cwd="/",
            )
        except (OSError, subprocess.SubprocessError) as e:
            return [f"the student's Python could not be run as uid {uid} ({e})"]
        finally:
            canary.unlink(missing_ok=True)
            box.close()  # every process of the uid ended
        found = [line for line in out.stdout.splitlines() if line and line != "probe done"]
        found += heard(listener, datagrams, token)
    if out.returncode != 0 or "probe done" not in out.stdout.splitlines():
        found.append(f"the probe did not run to its end as uid {uid} (exit status {out.returncode}: {out.stderr.strip()[-300:]})")
    return list(dict.fromkeys(found))


def heard(listener: socket.socket, datagrams: socket.socket, token: str) -> list[str]:
    """What reached the trusted side's sockets: a TCP connection queued on `listener`, a datagram on
    `datagrams` (anything at all: the token only says it was the probe's)."""
    found = []
    listener.setblocking(False)
    datagrams.setblocking(False)
    try:
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(1)
            try:
                data = conn.recv(64)
            except OSError:
                data = b""
        found.append("reached the network: a TCP connection to 127.0.0.1" + (" with the probe's token" if token.encode() in data else ""))
    except (BlockingIOError, InterruptedError):
        pass
    try:
        data = datagrams.recv(64)
        found.append("reached the network: a UDP datagram to 127.0.0.1" + (" with the probe's token" if token.encode() in data else ""))
    except (BlockingIOError, InterruptedError):
        pass
    return found
