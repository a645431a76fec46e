"""Ready sandboxes (verl_sf/e2b/ready.py) through the real E2B SDK: a create that takes one hands
its tenant exactly what a sandbox started for it would hold, on every server mode the isolation
suites use (root and an ordinary account, the namespaces rung and a container's profile)."""

from __future__ import annotations

import re

import pytest
import requests
from e2b_code_interpreter import Sandbox

from tests.server_fixtures import CONTAINER_MODES, SERVER_MODES, ServerHandle, e2b_environment, server_in_mode
from tests.waiting import wait_until

API_KEY = "e2b_" + "5" * 40
PROBE = """import os
print(sorted(name for name in dir() if not name.startswith('__')))
print(len(In), dict(Out), [globals().get(name) for name in ('_', '__', '_i', '_ii', '_1')])
print(os.getcwd(), os.environ.get('HOME'), os.environ.get('READY_PROBE'))
print(sorted(get_ipython().user_ns_hidden), sorted(n for n in __import__('linecache').cache if n.startswith('<')))
"""

NAMES = str(['In', 'Out', '_dh', '_i', '_i1', '_ih', '_ii', '_iii', '_oh', 'exit', 'get_ipython', 'open', 'os', 'quit'])
"""A new kernel's names after the probe's first line (IPython's own, and `os`)."""


def live_sessions(server: ServerHandle) -> int:
    metrics = requests.get(server.url + "/metrics", timeout=10).text
    match = re.search(r"^verl_sf_sessions_live (\S+)$", metrics, re.MULTILINE)
    assert match is not None, "no verl_sf_sessions_live in /metrics"
    return int(float(match.group(1)))


def probed(sandbox: Sandbox) -> tuple[int, list[str]]:
    execution = sandbox.run_code(PROBE)
    assert execution.error is None, execution.error
    assert execution.execution_count is not None
    return execution.execution_count, "".join(execution.logs.stdout).splitlines()


@pytest.mark.parametrize("mode", [*SERVER_MODES, *CONTAINER_MODES])
def test_a_ready_sandbox_holds_what_a_new_one_would(mode: str) -> None:
    with server_in_mode(mode, "--slots", "2", "--preload", "") as server, e2b_environment(server, API_KEY):
        started = Sandbox.create(timeout=120, envs={"READY_PROBE": "given"})  # the first: none is ready yet
        try:
            wait_until(lambda: live_sessions(server) == 3, 60, "two sandboxes ready beside the first")
            taken = Sandbox.create(timeout=120, envs={"READY_PROBE": "given"})
            try:
                assert live_sessions(server) >= 3  # one was taken, not started (the refill may be on its way)
                (count, lines), (count_started, lines_started) = probed(taken), probed(started)
                assert (count, lines[:2]) == (count_started, lines_started[:2]) == \
                    (1, [NAMES, "2 {} [None, None, '', '', None]"])  # the warm-up cell left nothing in the kernel
                assert lines[3] == lines_started[3] and "'_i1'" in lines[3]  # hidden names, cells' sources
                for line in (lines[2], lines_started[2]):  # the home is /home/user but on the landlock rung
                    cwd, home, given = line.split()
                    assert cwd == home and given == "given"
                assert taken.commands.run("echo $READY_PROBE").stdout == "given\n"
                assert sorted(box.sandbox_id for box in Sandbox.list().next_items()) == \
                    sorted([started.sandbox_id, taken.sandbox_id])  # the ready ones are nobody's sandboxes
            finally:
                taken.kill()
        finally:
            started.kill()
