"""An event loop on a daemon thread, so synchronous callers (TRL, verl) can drive async sandbox backends.

Backends keep loop-bound state (HTTP keep-alive sessions, the local executor's warm slots), so every call of one
reward object must run on the same loop; a caller's own running loop (a notebook) must not be blocked into.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, Optional, TypeVar

T = TypeVar("T")


class BackgroundLoop:
    """One lazily started loop thread; `run` may be called from any thread, `stop` ends it."""

    def __init__(self, name: str):
        self.name = name
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run `coroutine` on the loop and wait for its result (exceptions propagate)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._started()).result()

    def stop(self) -> None:
        """Stop the loop and join its thread.  Idempotent; a later `run` starts a fresh one."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name=self.name, daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop
