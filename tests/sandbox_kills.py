"""A warm interpreter killed from outside while it runs code (an administrator's `kill -9`, the OOM
killer): what each rung's suite checks of it."""

from __future__ import annotations

import os
import secrets
import signal
from concurrent.futures import ThreadPoolExecutor

from tests.host_view import named, zygotes
from tests.server_fixtures import ServerHandle, run_code
from tests.waiting import wait_until


def spread_run(name: str) -> str:
    """Code whose process, a child of it and a setsid'd daemon all take `name` (at most 15 bytes),
    then sleep: three processes to be ended with the run."""
    return (f"import ctypes, os, time\n"
            f"if os.fork() == 0:\n    os.setsid()\n    if os.fork():\n        os._exit(0)\n"
            f"os.fork()\nctypes.CDLL(None).prctl(15, b'{name}', 0, 0, 0)\ntime.sleep(60)\n")


def kill_sandboxes_mid_run(server: ServerHandle, rounds: int = 3) -> None:
    """Each round: a run is in flight when every zygote of the server is SIGKILLed.  Its reply is a
    sandbox error (never the code's failure), no process of it is left once that reply is in, and
    the next run is answered by a new sandbox.  The server keeps no descriptor of the dead ones."""
    assert run_code(server, "print(1)")["run_result"]["stdout"] == "1\n"
    held = len(os.listdir(f"/proc/{server.process.pid}/fd"))
    for _ in range(rounds):
        tag = f"kd{secrets.token_hex(3)}"
        with ThreadPoolExecutor(1) as pool:
            in_flight = pool.submit(run_code, server, spread_run(tag), run_timeout=50)
            wait_until(lambda tag=tag: len(named(tag)) == 4, 60, "the run's four processes running")
            for pid in zygotes(server.process.pid):
                os.kill(pid, signal.SIGKILL)
            body = in_flight.result(timeout=30)
        assert body["status"] == "SandboxError", body
        assert not named(tag), "a process of the run outlived its reply"
        wait_until(lambda: run_code(server, "print(2)")["run_result"]["stdout"] == "2\n", 60,
                   "a run after the kill is answered by a new sandbox")
    assert len(os.listdir(f"/proc/{server.process.pid}/fd")) <= held + 2, "the killed sandboxes' pipes are open"
