"""Entry point of a ProcessMode pool process: `python .../verl_sf/pool/_child.py`.

Reads length-prefixed cloudpickled `(fn, args, kwargs)` frames on stdin and answers each
with `("ok", result)` or `("err", exception)`; an awaitable result is run to completion on
the child's own event loop first.  The protocol keeps private duplicates of
fds 0 and 1; fd 1 itself is pointed at stderr so that whatever `fn` prints lands in the
worker's log instead of corrupting the protocol.
"""

from __future__ import annotations

import asyncio
import ctypes
import inspect
import os
import signal
import struct
import sys
import traceback
from typing import Any, BinaryIO

import cloudpickle

HEADER = struct.Struct("!Q")


def read_frame(stream: BinaryIO) -> bytes | None:
    header = stream.read(HEADER.size)
    if len(header) < HEADER.size:
        return None  # parent closed the pipe: time to go
    (size,) = HEADER.unpack(header)
    payload = stream.read(size)
    if len(payload) < size:
        return None
    return payload


def encode_reply(fn: object, outcome: str, value: object) -> bytes:
    try:
        reply = cloudpickle.dumps((outcome, value))
        if outcome == "err":  # an exception whose __init__ takes other arguments pickles, and fails to load
            cloudpickle.loads(reply)
        return reply
    except Exception as exc:  # the result or exception itself does not pickle
        what = "result" if outcome == "ok" else f"exception {type(value).__name__}: {value}"
        error = TypeError(f"the {what} of {getattr(fn, '__qualname__', fn)!r} cannot be pickled: {exc}")
        return cloudpickle.dumps(("err", error))


def run(payload: bytes, loop: asyncio.AbstractEventLoop) -> bytes:
    fn: Any = None
    try:
        fn, args, kwargs = cloudpickle.loads(payload)
        result = fn(*args, **kwargs)
        if inspect.isawaitable(result):
            # One loop for the child's lifetime, so loop-bound resources (aiohttp sessions)
            # are reused across calls.
            result = loop.run_until_complete(result)
        return encode_reply(fn, "ok", result)
    except (Exception, SystemExit, KeyboardInterrupt) as exc:  # sys.exit() in fn is fn's failure, not ours
        if sys.version_info >= (3, 11):  # notes are 3.11+; on 3.10 the caller sees the exception alone
            exc.add_note("Traceback in the pool process:\n" + traceback.format_exc())
        return encode_reply(fn, "err", exc)


def die_with_parent() -> None:
    """Linux: get SIGKILL when the pool actor dies, even if it dies by SIGKILL itself."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def main() -> None:
    # Run as a script, Python put this directory first on sys.path, where our module
    # names (client, worker, ...) would shadow the ones `fn` imports.
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]
    die_with_parent()
    # Buffered streams: read(n) returns n bytes unless the pipe closed.
    protocol_in = os.fdopen(os.dup(0), "rb")
    protocol_out = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    loop = asyncio.new_event_loop()
    while (payload := read_frame(protocol_in)) is not None:
        reply = run(payload, loop)
        sys.stdout.flush()
        protocol_out.write(HEADER.pack(len(reply)) + reply)
        protocol_out.flush()


if __name__ == "__main__":
    main()
