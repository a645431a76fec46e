"""The watchdog's count of socket buffers (sock_diag), against sockets this process fills itself."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from verl_sf.executor.zygote.socket_memory import SocketProbe


def fill(sock: socket.socket) -> int:
    """Send until the kernel refuses more; the bytes it took."""
    sock.setblocking(False)
    sent = 0
    while True:
        try:
            sent += sock.send(b"x" * 65536)
        except BlockingIOError:
            return sent


@pytest.fixture
def probe() -> Iterator[SocketProbe]:
    made = SocketProbe(None)
    yield made
    made.close()


def test_held_socketpairs_count_what_they_queue_and_others_do_not(probe: SocketProbe) -> None:
    pairs = [socket.socketpair() for _ in range(4)]
    try:
        sent = sum(fill(a) for a, _ in pairs[:2])
        held = {os.fstat(s.fileno()).st_ino for pair in pairs[:2] for s in pair}
        counted = probe.queued(held, os.getpid())
        assert sent <= counted <= 4 * sent  # each skb's true size, never less than its bytes
        for a, _ in pairs[2:]:
            fill(a)
        assert probe.queued(held, os.getpid()) == counted  # the other two are not these
        assert probe.queued(set(), os.getpid()) == 0
    finally:
        for pair in pairs:
            for s in pair:
                s.close()


def test_a_namespace_of_its_own_counts_every_socket_tcp_included(probe: SocketProbe) -> None:
    probe.own_namespace = True  # as a job's own network namespace is counted: this one whole
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server_side = listener.accept()[0]
    try:
        before = probe.queued(set(), os.getpid())
        sent = fill(client)
        assert sent > 0 and probe.queued(set(), os.getpid()) - before >= sent // 2  # other sockets of the machine move too
    finally:
        for s in (client, server_side, listener):
            s.close()
