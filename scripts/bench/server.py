"""The server a benchmark measures: the one at `--url`, or one it starts and stops itself."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Optional

from verl_sf.server.process import start_server_process, stop_server_process


@contextlib.contextmanager
def served(url: Optional[str], server_args: list[str],
           checkout: Optional[str] = None) -> Iterator[tuple[str, Optional[int]]]:
    """(base URL, pid of the server when this started it) for the length of the block; `checkout`:
    start it from that checkout's verl_sf (run there, and on PYTHONPATH), else from this one's."""
    if url is not None:
        yield url.rstrip("/"), None
        return
    process, started = start_server_process(*server_args, checkout=checkout)
    try:
        yield started.rstrip("/"), process.pid
    finally:
        stop_server_process(process)
