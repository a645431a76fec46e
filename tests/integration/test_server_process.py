"""`start_server_process`: its start-up deadline holds even for a server that prints nothing."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from verl_sf.server.process import start_server_process, stop_server_process

SILENT_FOR_S = 60  # longer than the test waits: the deadline, not the child, must end the wait


def test_a_server_that_prints_nothing_fails_at_the_deadline(tmp_path: Path) -> None:
    # The interpreter runs sitecustomize before `verl_sf.cli`: a real child that stays alive and silent.
    (tmp_path / "sitecustomize.py").write_text(f"import time\ntime.sleep({SILENT_FOR_S})\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="did not start within 2 s"):
        proc, _ = start_server_process(env=env, timeout=2)
        stop_server_process(proc)  # reached only when the deadline did not fire: leave no server behind
    assert time.monotonic() - started < SILENT_FOR_S / 2
