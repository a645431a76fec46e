"""Sandbox runs that time themselves, shared by the pool tests (one Ray cluster or two nodes)."""

from __future__ import annotations

from verl_sf.models import RunCodeRequest

TIMED_CODE = "import time\nprint(time.time(), flush=True)\ntime.sleep({sleep})\nprint(time.time())"


def timed_request(sleep: float) -> RunCodeRequest:
    """Code that prints its start and end time (from inside the sandbox) around a sleep."""
    return RunCodeRequest(code=TIMED_CODE.format(sleep=sleep), language="python", run_timeout=30)
