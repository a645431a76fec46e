"""Lines of JSON in and out, cheaply: the C scanner and encoder directly, and a line buffer that
searches each byte once (a peer that never sends a newline costs nothing but its bytes)."""

from __future__ import annotations

import array
import fcntl
import json
import os
import re
import select
from collections.abc import Iterable
from typing import Any

SIOCOUTQ = 0x5411  # <linux/sockios.h>, the same number as TIOCOUTQ on every architecture we run on

READ_CHUNK = 1 << 16
SETUP_FAILED = b"F"  # a child's word on its job socket: it failed before any code of the run's (then why)
SETUP_FAILED_TEXT = 1000  # characters of why at most

# json.loads/dumps' Python layers touch pages that a process forked a moment ago must copy.
_scan_json = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
_encode_json = json.encoder.c_make_encoder(  # type: ignore[attr-defined]
    None, None, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, True)


MAX_DEPTH = 100
"""Nesting a line may have (the server's request bodies have the same limit): a run's records are
its own to write, and one nested near the stack's limit would overflow it when the zygote encodes
its reply around it."""


MAX_TOKENS = 100_000
"""Strings, `,`, `:` and opening brackets a record may hold (the server's request bodies have the
same cap): parsing is one C call, in the zygote and again in the server, for as long as it takes."""
MAX_OUTSIDE_STRINGS = 1 << 20
"""Characters a record may hold outside its strings: Python converts a long integer in time that grows
as its digits squared (a cell displaying 11,000 integers of 4,300 digits held the server ~1.3 s)."""
JSON_STRING = r'"[^"\\]*+(?:\\.[^"\\]*+)*+"'  # a whole JSON string, matched at C speed (possessive: no backtracking)
JSON_TOKEN = re.compile(rf"{JSON_STRING}|[,:\[{{]")  # what MAX_TOKENS counts


def bulk_of(text: str) -> str:
    """What makes JSON `text` cost its readers far more than its size (past MAX_TOKENS tokens or
    MAX_OUTSIDE_STRINGS characters outside its strings), or '' where nothing does."""
    bound = 3 * text.count(":") + 2 * text.count(",") + 2 * text.count("[") + text.count("{") + 1
    if bound <= MAX_TOKENS and len(text) <= MAX_OUTSIDE_STRINGS:
        return ""
    inside = 0
    for tokens, match in enumerate(JSON_TOKEN.finditer(text), 1):
        if tokens > MAX_TOKENS:
            return f"more than {MAX_TOKENS:,} JSON tokens"
        inside += match.end() - match.start() if text[match.start()] == '"' else 0
    if len(text) - inside > MAX_OUTSIDE_STRINGS:
        return f"more than {MAX_OUTSIDE_STRINGS:,} characters outside its strings"
    return ""


def loads(text: str) -> Any:
    """json.loads for one JSON value, strictly (nothing but whitespace around it), nested at most
    MAX_DEPTH levels; ValueError otherwise."""
    start = len(text) - len(text.lstrip())
    try:
        value, end = _scan_json(text, start)
    except StopIteration as exc:
        raise ValueError(f"expected a JSON value at {exc.value}") from None
    except RecursionError:
        raise ValueError(f"JSON nested deeper than {MAX_DEPTH} levels") from None
    if text[end:].strip():
        raise ValueError(f"extra data after the JSON value at {end}")
    if deeper_than(value, MAX_DEPTH):
        raise ValueError(f"JSON nested deeper than {MAX_DEPTH} levels")
    return value


def deeper_than(value: Any, limit: int) -> bool:
    """Level by level, containers only, without recursion: the check itself cannot overflow."""
    level = [value] if isinstance(value, (dict, list)) else []
    for _ in range(limit):
        if not level:
            return False
        level = [child for node in level for child in (node.values() if isinstance(node, dict) else node)
                 if isinstance(child, (dict, list))]
    return bool(level)


def dumps(value: Any) -> bytes:
    """json.dumps(value).encode(), compact: replies and records are plain dicts."""
    return "".join(_encode_json(value, 0)).encode()


def readable(fd: int) -> bool:
    """Is there something (or an end) to read now?"""
    return bool(readable_of((fd,)))


def readable_of(fds: Iterable[int]) -> list[int]:
    """Those of `fds` with something (or an end) to read now, in their order, in one system call.  poll,
    not select: a zygote holds past 1,024 descriptors."""
    probe = select.poll()
    for fd in fds:
        probe.register(fd, select.POLLIN)
    return [fd for fd, _ in probe.poll(0)]


def setup_failure(data: bytes) -> str:
    """What a child said on its job socket (`data`, read there) if it failed to set up; "" otherwise."""
    if not data.startswith(SETUP_FAILED):
        return ""
    why = data[len(SETUP_FAILED):SETUP_FAILED_TEXT + len(SETUP_FAILED)].decode(errors="replace")
    return f"verl-sf: the run's sandbox could not be set up: {why}"


def pending(fd: int) -> bytes:
    """What a non-blocking descriptor holds to read now; b"" if nothing."""
    try:
        return os.read(fd, READ_CHUNK)
    except OSError:  # EAGAIN, or the peer is gone
        return b""


def unsent(fd: int) -> int:
    """Bytes written to a socket that its peer has not read yet (SIOCOUTQ); 0 if it cannot say."""
    count = array.array("i", [0])
    try:
        fcntl.ioctl(fd, SIOCOUTQ, count, True)
    except OSError:
        return 0
    return count[0]


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BrokenPipeError:
            return  # the reader is gone: whoever waits for it learns so from its exit


class Lines:
    """Bytes in, complete lines out, each byte searched once."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.scanned = 0  # bytes of `buffer` already searched for a newline

    def __len__(self) -> int:
        return len(self.buffer)

    def feed(self, chunk: bytes) -> list[bytes]:
        self.buffer += chunk
        lines = []
        start = 0
        while True:
            end = self.buffer.find(b"\n", self.scanned)
            if end < 0:
                self.scanned = len(self.buffer)
                break
            lines.append(bytes(self.buffer[start:end]))
            start = self.scanned = end + 1
        if start:
            # Replaced, not shrunk in place: a large line's memory goes back at once.
            self.buffer = bytearray(self.buffer[start:])
            self.scanned -= start
        return lines

    def clear(self) -> None:
        self.buffer = bytearray()
        self.scanned = 0


REPORT_FD = 3  # a child's records to the zygote


def report(record: Any) -> None:
    """One record from a child to the zygote, on its fd 3, on a line of its own: it ends whatever
    half line the code wrote there before it (dropped as garbage), so the record is still read."""
    os.write(REPORT_FD, b"\n" + dumps(record) + b"\n")
