"""Bytes a job's sockets hold in their queues, read through sock_diag (the kernel's socket-monitoring
netlink family), for the memory watchdog where no memory cgroup charges them: socket buffers are
kernel memory in no process's address space (300 filled socketpairs held 2.3 GB against a 128 MB
cap, 400 loopback TCP connections 2.2 GB).

A job with a network namespace of its own (the namespaces rung) is charged every socket in it,
those only in flight in another's queue included; one sharing the zygote's (the landlock rung) the
sockets its processes hold."""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Collection, Iterator
from typing import Optional

from . import linux
from .linux import CLONE_NEWNET

NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY = 4, 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port
ATTRIBUTE = struct.Struct("=HH")  # rtattr: length, type
UDIAG_SHOW_MEMINFO, UNIX_DIAG_MEMINFO, UNIX_MESSAGE = 0x20, 5, 16  # unix_diag_msg: 16 bytes
INET_DIAG_SKMEMINFO, INET_MESSAGE, INET_INODE = 7, 72, 68  # inet_diag_msg: 72 bytes, its inode at 68
RMEM_ALLOC, WMEM_ALLOC, WMEM_QUEUED = 0, 2, 5  # of the SK_MEMINFO array
ALL_STATES = 0xFFFFFFFF


def _request(payload: bytes, sequence: int) -> bytes:
    header = HEADER.pack(HEADER.size + len(payload), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, sequence, 0)
    return header + payload


UNIX_DUMP = struct.pack("=BBHIII8x", socket.AF_UNIX, 0, 0, ALL_STATES, 0, UDIAG_SHOW_MEMINFO)
# An inet dump walks the machine's whole hash table (2.6 ms for the four of an empty namespace), a unix
# one the namespace's own (0.02 ms): each inet one is made only where the namespace's sockstat counts
# a socket of its kind (0.03 ms to read).
INET_DUMPS = {(name, sockstat): struct.pack("=BBBxI48x", family, protocol, 1 << (INET_DIAG_SKMEMINFO - 1), ALL_STATES)
              for family, sockstat in ((socket.AF_INET, "sockstat"), (socket.AF_INET6, "sockstat6"))
              for name, protocol in (("TCP", socket.IPPROTO_TCP), ("UDP", socket.IPPROTO_UDP))}


class SocketProbe:
    """A sock_diag socket in one network namespace: a netlink socket reports on the namespace it was
    made in, so the zygote enters the job's for the moment it takes to make one."""

    def __init__(self, network: Optional[int]):
        """`network`: a descriptor of the job's own namespace; None: the zygote's, which the job shares."""
        self.own_namespace = network is not None
        if network is None:
            self.socket = self._open()
            return
        home = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            linux.check(linux.libc.setns(network, CLONE_NEWNET), "setns(CLONE_NEWNET)")
            try:
                self.socket = self._open()
            finally:
                linux.check(linux.libc.setns(home, CLONE_NEWNET), "setns(CLONE_NEWNET) back")
        finally:
            os.close(home)

    @staticmethod
    def _open() -> socket.socket:
        probe = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_SOCK_DIAG)
        probe.settimeout(1.0)  # the kernel answers a dump at once; never hang the zygote on it
        return probe

    def queued(self, held: Collection[int], member: int) -> int:
        """Bytes in the queues of the namespace's sockets (its own), or of those of `held` (inodes);
        `member` is a process in it whose /proc the zygote may read."""
        total = 0
        dumps = [(UNIX_DUMP, UNIX_MESSAGE, UNIX_DIAG_MEMINFO, 4)]
        if self.own_namespace:  # a shared namespace's inet sockets are never a job's: socket() is refused there
            dumps += [(dump, INET_MESSAGE, INET_DIAG_SKMEMINFO, INET_INODE) for dump in _inet_dumps(member)]
        elif not held:
            return 0
        for sequence, (payload, message, kind, inode_at) in enumerate(dumps, 1):
            self.socket.send(_request(payload, sequence))
            for body in self._answers(sequence):
                if not self.own_namespace and struct.unpack_from("=I", body, inode_at)[0] not in held:
                    continue
                total += _queued(body, message, kind)
        return total

    def _answers(self, sequence: int) -> Iterator[memoryview]:
        """The bodies of one dump's messages, to its end."""
        while True:
            data = memoryview(self.socket.recv(1 << 16))
            at = 0
            while at + HEADER.size <= len(data):
                length, kind, _, number, _ = HEADER.unpack_from(data, at)
                if length < HEADER.size:
                    return
                if number == sequence:
                    if kind in (NLMSG_DONE, NLMSG_ERROR):
                        return
                    yield data[at + HEADER.size:at + length]
                at += (length + 3) & ~3

    def close(self) -> None:
        self.socket.close()


def _inet_dumps(member: int) -> list[bytes]:
    """The inet dumps worth making: of the kinds of which `member`'s namespace has a socket in use."""
    in_use = {}
    for sockstat in ("sockstat", "sockstat6"):
        with open(f"/proc/{member}/net/{sockstat}") as counts:
            for line in counts:
                name, _, fields = line.partition(":")
                words = fields.split()
                if len(words) >= 2 and words[0] == "inuse":
                    in_use[(name.removesuffix("6"), sockstat)] = int(words[1])
    return [dump for kind, dump in INET_DUMPS.items() if in_use.get(kind, 1)]


def _queued(body: memoryview, message: int, kind: int) -> int:
    """A socket's queued bytes from its SK_MEMINFO attribute: what it has received and not read, and
    what it sent (a TCP one's unacknowledged, a unix one's in its peer's queue, charged to it)."""
    at = message
    while at + ATTRIBUTE.size <= len(body):
        length, attribute = ATTRIBUTE.unpack_from(body, at)
        if length < ATTRIBUTE.size:
            break
        if attribute == kind and length >= ATTRIBUTE.size + 4 * (WMEM_QUEUED + 1):
            info = struct.unpack_from(f"={WMEM_QUEUED + 1}I", body, at + ATTRIBUTE.size)
            return info[RMEM_ALLOC] + max(info[WMEM_ALLOC], info[WMEM_QUEUED])
        at += (length + 3) & ~3
    return 0
