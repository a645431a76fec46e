"""The server a benchmark measures: the one at `--url`, or one it starts and stops itself."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Optional

from verl_sf.server.process import start_server_process, stop_server_process


@contextlib.contextmanager
def served(url: Optional[str], server_args: list[str],
           env: Optional[dict[str, str]] = None) -> Iterator[tuple[str, Optional[int]]]:
    """(base URL, pid of the server when this started it, with `env`) for the length of the block."""
    if url is not None:
        yield url.rstrip("/"), None
        return
    process, started = start_server_process(*server_args, env=env)
    try:
        yield started.rstrip("/"), process.pid
    finally:
        stop_server_process(process)
