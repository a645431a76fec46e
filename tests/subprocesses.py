"""Waiting for a child process in tests without leaving it behind."""

from __future__ import annotations

import asyncio


async def communicate_or_kill(proc: asyncio.subprocess.Process, timeout: float) -> tuple[bytes, bytes]:
    """`proc.communicate()` within `timeout`; on time-out (or cancellation) the process is killed
    and reaped before the error propagates, so no test leaves a stray child."""
    try:
        return await asyncio.wait_for(proc.communicate(), timeout)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
