"""A TCP and a UDP server on 127.0.0.1 for the attacks on the network (tests/test_gradescope.py,
tests/test_attacks.py): they answer whatever reaches them with a reply only they know (a submission
that gets it has reached them) and keep what they heard (the verdict, from outside)."""

from __future__ import annotations

import os
import select
import socket
import threading
import time


class Listener:
    """The two servers, on ports of their own, served by a thread until `close`."""

    def __init__(self) -> None:
        self.reply = f"reached-{os.getpid()}-{time.monotonic_ns()}".encode()
        self.heard: list[bytes] = []
        self.tcp = socket.create_server(("127.0.0.1", 0))
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.ports = self.tcp.getsockname()[1], self.udp.getsockname()[1]
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.done.is_set():
            ready, _, _ = select.select([self.tcp, self.udp], [], [], 0.1)
            if self.tcp in ready:
                conn, _ = self.tcp.accept()
                with conn:
                    conn.settimeout(2)
                    try:
                        self.heard.append(b"tcp:" + conn.recv(256))
                        conn.sendall(self.reply)
                    except OSError:
                        self.heard.append(b"tcp connection")
            if self.udp in ready:
                data, peer = self.udp.recvfrom(256)
                self.heard.append(b"udp:" + data)
                self.udp.sendto(self.reply, peer)

    def close(self) -> list[bytes]:
        self.done.set()
        self.thread.join()
        self.tcp.close()
        self.udp.close()
        return self.heard
