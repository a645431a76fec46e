"""A run's memory holds nothing of another job: not code, stdin, files, output nor a session's calls.

The zygote relays every job's traffic through its heap and freed memory is not cleared, so a child
forked from it would start with earlier (and concurrent) jobs' bytes in its own pages.  Each case
leaves a random secret in every channel a job has, then a later run reads every writable mapping of
its own process (`/proc/self/maps`, `ctypes.string_at`) and reports what follows the secret's
prefix.  On every rung, as root and as an ordinary account.
"""

from __future__ import annotations

import base64
import json
import secrets
import string
import threading
from collections.abc import Iterator

import pytest
import requests

from tests.server_fixtures import CONTAINER_MODES, SERVER_MODES, ServerHandle, run_code, server_in_mode

PREFIX = "RSDU7" + "_"
# Reads its own rw mappings; prints every PREFIX + lowercase run found there (its code holds the
# prefix only, split, so that only a copy of someone else's secret matches).
SCAN = f"""
import ctypes, json, re
prefix = {PREFIX[:3]!r}.encode() + {PREFIX[3:]!r}.encode()
found = set()
for line in open('/proc/self/maps').read().splitlines():
    fields = line.split()
    name = fields[5] if len(fields) > 5 else 'anonymous'
    if not fields[1].startswith('rw') or name.startswith('[v'):
        continue
    low, high = (int(text, 16) for text in fields[0].split('-'))
    if high - low > 1 << 30:
        continue
    for match in re.finditer(re.escape(prefix) + rb'[a-z]{{16}}', ctypes.string_at(low, high - low)):
        found.add(match.group(0)[len(prefix):].decode())
print(json.dumps(sorted(found)))
"""


@pytest.fixture(scope="module", params=SERVER_MODES + CONTAINER_MODES)
def server(request: pytest.FixtureRequest) -> Iterator[ServerHandle]:
    with server_in_mode(request.param, "--slots", "2", "--sandboxes", "1") as handle:
        yield handle


def secret() -> str:
    return "".join(secrets.choice(string.ascii_lowercase) for _ in range(16))


def found(server: ServerHandle) -> set[str]:
    """What a fresh run finds in its own memory (three runs: each ready child there was forked at a
    different moment)."""
    seen: set[str] = set()
    for _ in range(3):
        body = run_code(server, SCAN)
        assert body["status"] == "Success", body
        seen.update(json.loads(body["run_result"]["stdout"]))
    return seen


def test_a_run_reads_nothing_of_earlier_runs(server: ServerHandle) -> None:
    code, output, error, data = (secret() for _ in range(4))
    for _ in range(3):
        body = run_code(server, f"x = '{PREFIX}{code}'\nprint('{PREFIX}' + input())\n"
                                f"import sys; print('{PREFIX}{error}', file=sys.stderr)\nprint(open('data.txt').read())",
                        stdin=f"{output}\n", files={"data.txt": base64.b64encode(f"{PREFIX}{data}".encode()).decode()})
        assert body["run_result"]["stdout"] == f"{PREFIX}{output}\n{PREFIX}{data}\n", body
    assert found(server).isdisjoint({code, output, error, data})


def test_a_run_reads_nothing_of_a_running_one(server: ServerHandle) -> None:
    """A run still going holds its output in the zygote while the next is forked and runs."""
    output = secret()
    slow = threading.Thread(target=run_code, args=(server, f"print('{PREFIX}{output}' * 64, flush=True)\n"
                                                           "import time; time.sleep(6)"))
    slow.start()
    try:
        assert output not in found(server)
    finally:
        slow.join()


def test_a_run_reads_nothing_of_a_sessions_calls(server: ServerHandle) -> None:
    code, output = secret(), secret()
    response = requests.post(server.url + "/sessions", json={"language": "python"}, timeout=60)
    assert response.status_code == 201, response.text
    session_id = response.json()["session_id"]
    try:
        for _ in range(3):
            body = run_code(server, f"y = '{PREFIX}{code}'\nprint('{PREFIX}{output}')", session_id=session_id)
            assert body["run_result"]["stdout"] == f"{PREFIX}{output}\n", body
        assert found(server).isdisjoint({code, output})
    finally:
        requests.delete(f"{server.url}/sessions/{session_id}", timeout=60)
