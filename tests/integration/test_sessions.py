"""Stateful sessions over real HTTP: state, isolation, endings and their reasons, hostile code, scale, clean-up.

Every test talks to a real `verl-sf serve` on 127.0.0.1 (POST/GET/DELETE /sessions, POST /run_code with
`session_id`) and asserts verdicts and counts, never timings.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import requests

from tests.cgroup_layout import group_bases, server_groups
from tests.server_fixtures import SERVER_SECRET, ServerHandle, start_server, stop_server
from tests.waiting import wait_until
from verl_sf.backends.http import HttpSandboxBackend
from verl_sf.errors import SessionGone
from verl_sf.models import RunCodeRequest


@pytest.fixture(scope="module")
def server() -> Iterator[ServerHandle]:
    handle = start_server("--slots", "2", "--preload", "", env={**os.environ, "VERL_SF_TEST_SECRET": SERVER_SECRET})
    yield handle
    stop_server(handle.process)


def create(server: ServerHandle, language: str = "python", **fields: Any) -> str:
    response = requests.post(server.url + "/sessions", json={"language": language, **fields}, timeout=60)
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["alive"] is True and body["language"] == language and body["calls"] == 0
    return body["session_id"]


def call(server: ServerHandle, session_id: str, code: str, language: str = "python", **fields: Any) -> dict:
    response = requests.post(server.url + "/run_code", timeout=120,
                             json={"code": code, "language": language, "session_id": session_id, **fields})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["session_id"] == session_id
    return body


def stdout(body: dict) -> str:
    assert body["status"] == "Success", body
    return body["run_result"]["stdout"]


def gone(server: ServerHandle, session_id: str, language: str = "python") -> str:
    """The 404 detail a call into an ended session gets (and GET /sessions/{id} gives the same)."""
    response = requests.post(server.url + "/run_code", timeout=60,
                             json={"code": "print(1)", "language": language, "session_id": session_id})
    assert response.status_code == 404, response.text
    info = requests.get(f"{server.url}/sessions/{session_id}", timeout=60)
    assert info.status_code == 404 and info.json()["detail"] == response.json()["detail"]
    return response.json()["detail"]


def wait_until_gone(server: ServerHandle, session_id: str, limit_s: float = 60.0) -> str:
    wait_until(lambda: requests.get(f"{server.url}/sessions/{session_id}", timeout=60).status_code == 404, limit_s,
               f"session {session_id} has ended", every=0.5)
    return gone(server, session_id)


def health(server: ServerHandle) -> dict:
    return requests.get(server.url + "/health", timeout=60).json()


# ---- state ----------------------------------------------------------------------------------------
def test_python_state_persists_across_calls(server: ServerHandle) -> None:
    sid = create(server)
    assert stdout(call(server, sid, "import fractions\nx = 41\nlog = open('log.txt', 'w')\n"
                                    "def double(v):\n    return 2 * v\nprint('defined')")) == "defined\n"
    assert stdout(call(server, sid, "x += 1\nlog.write('kept open\\n')\nlog.flush()\n"
                                    "print(x, double(x), fractions.Fraction(1, 3))")) == "42 84 1/3\n"
    assert stdout(call(server, sid, "print(open('log.txt').read(), end='')\nimport os\nprint(os.getcwd())")) \
        == "kept open\n/workdir\n"
    info = requests.get(f"{server.url}/sessions/{sid}", timeout=60).json()
    assert info["calls"] == 3 and info["alive"] is True and info["memory_bytes"] > 0
    assert info["idle_since"] >= info["created_at"]


def cells(server: ServerHandle, session_id: str, *sources: str, **fields: Any) -> list[dict]:
    response = requests.post(server.url + "/run_jupyter", timeout=120,
                             json={"cells": list(sources), "session_id": session_id, **fields})
    assert response.status_code == 200, response.text
    return response.json()["cells"]


def test_cells_and_code_share_one_state_across_calls_and_cell_time_outs(server: ServerHandle) -> None:
    """A session's cells run in its `__main__`, as its code does: what one call binds, the next call
    sees, whichever of /run_jupyter and /run_code it is, and a cell's time-out keeps it too."""
    sid = create(server)
    cells(server, sid, "x = 1")
    assert [cell["stdout"] for cell in cells(server, sid, "print(x)", "x += 1")] == ["1\n", ""]
    assert stdout(call(server, sid, "print(x)\ny = x * 10")) == "2\n"
    assert cells(server, sid, "y")[0]["display"][0]["text/plain"] == "20"
    timed_out = cells(server, sid, "import time; time.sleep(30)", "print(x, y)", cell_timeout=1)
    assert timed_out[0]["error"][0]["ename"] == "TimeoutError" and timed_out[1]["stdout"] == "2 20\n", timed_out
    assert [cell["stdout"] for cell in cells(server, sid, "print(x, y)")] == ["2 20\n"]
    assert stdout(call(server, sid, "print(x + y)")) == "22\n"


def test_fetching_a_directory_or_a_fifo_leaves_it_out_and_the_session_and_run_stand(server: ServerHandle) -> None:
    """Only regular files are fetched: a directory or FIFO the code made is left out, at once, and
    neither ends the session nor changes what the run did."""
    sid = create(server)
    assert stdout(call(server, sid, "import os\nos.mkdir('d')\nos.mkfifo('f')\nopen('ok.txt', 'w').write('ok')\n"
                                    "x = 1")) == ""
    body = call(server, sid, "print(x)", fetch_files=["d", "f", "ok.txt", "/tmp"], run_timeout=20)
    assert stdout(body) == "1\n" and body["session_alive"] is True and body["files"] == {"ok.txt": "b2s="}
    assert body["run_result"]["execution_time"] < 10, "a FIFO never holds the reply"
    jupyter = requests.post(server.url + "/run_jupyter", timeout=60,
                            json={"cells": ["x"], "session_id": sid, "fetch_files": ["d", "f"]}).json()
    assert jupyter["status"] == "Success" and jupyter["files"] == {}, jupyter
    for language, code in (("python", "import os\nos.mkdir('d')\nos.mkfifo('f')"), ("bash", "mkdir d && mkfifo f")):
        run = requests.post(server.url + "/run_code", timeout=60, json={
            "code": code, "language": language, "fetch_files": ["d", "f"], "run_timeout": 20}).json()
        assert run["status"] == "Success" and run["files"] == {} and run["run_result"]["execution_time"] < 10, run


@pytest.mark.parametrize(("route", "body", "field"), [
    ("/run_code", {"code": "\ud800", "language": "python"}, "code"),
    ("/run_code", {"code": "echo \udfff", "language": "bash"}, "code"),
    ("/run_code", {"code": "print(input())", "language": "python", "stdin": "\ud800"}, "stdin"),
    ("/run_jupyter", {"cells": ["1", "'\ud834'"]}, "cells"),
])
def test_a_lone_surrogate_is_refused_naming_its_field(server: ServerHandle, route: str, body: dict,
                                                       field: str) -> None:
    raw = json.dumps(body)  # JSON's \ud800 escape: valid JSON, not text UTF-8 can carry
    refused = requests.post(server.url + route, data=raw, headers={"Content-Type": "application/json"}, timeout=60)
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"][0]["loc"][-1] == field and "lone surrogate" in refused.text
    assert (refused.json()["code"], refused.json()["field"]) == ("invalid", field)


@pytest.mark.parametrize("in_session", [False, True])
def test_a_lone_surrogate_a_cell_makes_is_answered_escaped(server: ServerHandle, in_session: bool) -> None:
    """Red team, 2026-12-07: a cell whose error or display held a lone surrogate (`chr(0xd800)`, what a
    model's code may well print) was a 500, which clients take for a sandbox failure; it is the run's
    own output, answered as JSON's escape."""
    sources = ["raise ValueError(chr(0xd800))",
               "display({'text/plain': 'a' + chr(0xd800)}, raw=True)",
               "from IPython.display import HTML\ndisplay(HTML('<b>' + chr(0xdfff) + '</b>'))",
               "class Shown:\n    def _repr_html_(self):\n        return chr(0xd800)\nShown()"]
    for source in sources:
        body = {"cells": [source]}
        if in_session:
            body["session_id"] = create(server)
        answered = requests.post(server.url + "/run_jupyter", json=body, timeout=60)
        assert answered.status_code == 200, (source, answered.text)
        cell = answered.json()["cells"][0]
        shown = json.dumps(cell)
        assert ("\\ud800" in shown or "\\udfff" in shown) and "\\ufffd" not in shown, (source, cell)
    assert cell["display"] and cell["display"][0]["text/html"] == chr(0xd800), cell


def test_bash_state_persists_across_calls(server: ServerHandle) -> None:
    sid = create(server, "bash")
    body = call(server, sid, "mkdir -p sub && cd sub && echo data > f.txt\nexport GREETING=hello\n"
                             "shout() { echo \"${1^^}\"; }\nCOUNT=1", language="bash")
    assert body["status"] == "Success", body
    assert stdout(call(server, sid, "COUNT=$((COUNT + 1))\npwd\necho $GREETING $COUNT\nshout quiet\ncat f.txt\n"
                                    "bash -c 'echo child sees $GREETING'", language="bash")) \
        == "/workdir/sub\nhello 2\nQUIET\ndata\nchild sees hello\n"


def test_session_files_are_written_at_creation_and_fetched_per_call(server: ServerHandle) -> None:
    import base64

    sid = create(server, files={"input.txt": base64.b64encode(b"seed").decode()})
    body = call(server, sid, "open('out.txt', 'w').write(open('input.txt').read() + '!')", fetch_files=["out.txt"])
    assert body["status"] == "Success" and base64.b64decode(body["files"]["out.txt"]) == b"seed!"


@pytest.mark.parametrize("language", ["python", "bash"])
def test_a_file_that_is_not_base64_is_named_with_the_reason_the_session_did_not_start(
        server: ServerHandle, language: str) -> None:
    reply = requests.post(server.url + "/sessions", timeout=30,
                          json={"language": language, "files": {"ok.txt": "b2s=", "bad.txt": "!!notbase64"}})
    assert reply.status_code == 422, reply.text
    body = reply.json()
    assert body["field"] == "files" and "'bad.txt': its content is not base64" in reply.text, body
    assert stdout(call(server, create(server, language=language), "echo ok" if language == "bash" else "print('ok')",
                       language=language)) == "ok\n"  # the server serves on


@pytest.mark.parametrize("route, body", [
    ("/run_code", {"code": "import os\nprint(os.listdir('.'))", "language": "python"}),
    ("/run_jupyter", {"cells": ["import os\nprint(os.listdir('.'))"]}),
])
def test_files_on_a_session_call_are_refused_naming_files(server: ServerHandle, route: str, body: dict) -> None:
    """Red team, 2026-12-07: /run_jupyter in a session dropped a call's `files` and answered Success, so
    the code ran without them; a session's files come with it (POST /sessions), on both routes."""
    sid = create(server)
    refused = requests.post(server.url + route, timeout=60,
                            json={**body, "session_id": sid, "files": {"injected.txt": "eA=="}})
    assert refused.status_code == 400 and refused.json()["field"] == "files", refused.text
    assert "POST /sessions" in refused.text
    assert stdout(call(server, sid, "import os\nprint(os.listdir('.'))")) == "[]\n"  # nothing written, it serves on


def test_bash_sessions_fetch_files_from_their_own_directories(server: ServerHandle) -> None:
    import base64

    sid = create(server, "bash")
    body = call(server, sid, "printf 'one\\n' > out.txt; mkdir -p sub; echo two > sub/b.txt; echo t > /tmp/t.txt\n"
                             "ln -s /etc/passwd link.txt; cd /", language="bash",
                fetch_files=["out.txt", "sub/b.txt", "/tmp/t.txt", "missing.txt", "link.txt",
                             "/etc/passwd"])
    assert body["status"] == "Success", body
    files = {path: base64.b64decode(data) for path, data in body["files"].items()}
    assert files == {"out.txt": b"one\n", "sub/b.txt": b"two\n", "/tmp/t.txt": b"t\n"}
    again = call(server, sid, "pwd", language="bash", fetch_files=["out.txt"])  # the shell is in / now
    assert again["run_result"]["stdout"] == "/\n" and base64.b64decode(again["files"]["out.txt"]) == b"one\n"
    refused = requests.post(server.url + "/run_code", timeout=60, json={
        "code": "cat", "language": "bash", "session_id": sid, "stdin": "x"})
    assert refused.status_code == 400 and refused.json()["detail"][0]["loc"] == ["body", "stdin"]


# ---- isolation ------------------------------------------------------------------------------------
def test_two_sessions_see_neither_globals_nor_files_nor_processes(server: ServerHandle) -> None:
    first, second = create(server), create(server)
    assert stdout(call(server, first, "import subprocess\nsecret = 'first-only'\nopen('mine.txt', 'w').write('x')\n"
                                      "sleeper = subprocess.Popen(['sleep', '1000'])\nprint('ok')")) == "ok\n"
    listing = ("import os\nprint('secret' in globals(), os.listdir('.'))\n"
               "cmds = [open(f'/proc/{p}/cmdline', 'rb').read().replace(b'\\0', b' ').decode().strip()\n"
               "        for p in os.listdir('/proc') if p.isdigit()]\nprint(len(cmds), any('sleep' in c for c in cmds))")
    own = stdout(call(server, first, listing)).splitlines()
    other = stdout(call(server, second, listing)).splitlines()
    assert own[0] == "True ['mine.txt']" and own[1].endswith(" True")
    assert other[0] == "False []"
    count, sleeping = other[1].split()
    assert sleeping == "False" and int(count) <= 3  # its stub, its interpreter, at most a helper: nothing of first's
    bash = create(server, "bash")
    out = stdout(call(server, bash, "ls /proc | grep -c '^[0-9]'; ls; cat /proc/*/cmdline 2>/dev/null | tr '\\0' ' '",
                      language="bash"))
    assert "sleep" not in out and "mine.txt" not in out


def test_a_session_is_invisible_to_stateless_runs(server: ServerHandle) -> None:
    sid = create(server)
    call(server, sid, "open('session-file.txt', 'w').write('x')\nimport subprocess\n"
                      "p = subprocess.Popen(['sleep', '1000'])")
    response = requests.post(server.url + "/run_code", timeout=60, json={
        "language": "python", "code": "import os\nprint(os.listdir('.'), "
                                      "[p for p in os.listdir('/proc') if p.isdigit() and "
                                      "b'sleep' in open(f'/proc/{p}/cmdline', 'rb').read()])"})
    body = response.json()
    assert body["status"] == "Success" and body["run_result"]["stdout"] == "[] []\n" and body["session_id"] is None


# ---- endings and their 404 reasons ---------------------------------------------------------------
def test_delete_ends_the_session_and_later_calls_say_so(server: ServerHandle) -> None:
    sid = create(server)
    response = requests.delete(f"{server.url}/sessions/{sid}", timeout=60)
    assert response.status_code == 200 and response.json() == {"session_id": sid, "ended": True}
    assert "ended by DELETE" in gone(server, sid)
    assert requests.delete(f"{server.url}/sessions/{sid}", timeout=60).status_code == 404
    assert "no such session" in gone(server, "not-a-session")


def test_idle_ttl_expires_the_session(server: ServerHandle) -> None:
    sid = create(server, idle_ttl_s=1)
    assert "expired: idle for" in wait_until_gone(server, sid)


def test_the_session_cap_evicts_the_longest_idle() -> None:
    capped = start_server("--slots", "1", "--preload", "", "--max-sessions", "2")
    try:
        oldest, middle = create(capped), create(capped)
        call(capped, oldest, "x = 1")  # now `middle` is the longest idle
        newest = create(capped)
        assert "evicted" in gone(capped, middle) and "longest idle" in gone(capped, middle)
        assert stdout(call(capped, oldest, "print(x)")) == "1\n"
        assert stdout(call(capped, newest, "print('new')")) == "new\n"
        assert health(capped)["sessions"] == 2
    finally:
        stop_server(capped.process)


def test_the_cap_never_evicts_a_session_in_the_middle_of_a_call() -> None:
    capped = start_server("--slots", "1", "--preload", "", "--max-sessions", "2")
    try:
        running, idle = create(capped), create(capped)  # `running` is the older: idle the longest before its call
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            long_call = pool.submit(call, capped, running, "import time\ntime.sleep(3)\nprint('finished')")
            wait_until(lambda: health(capped)["in_flight"] > 0, 60, "the long call started")
            create(capped)
            assert stdout(long_call.result()) == "finished\n"
        assert "evicted" in gone(capped, idle)
        only_busy = create(capped)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            calls = [pool.submit(call, capped, sid, "import time\ntime.sleep(3)") for sid in (running, only_busy)]
            wait_until(lambda: health(capped)["in_flight"] >= 2, 60, "both calls started")
            refused = requests.post(capped.url + "/sessions", json={"language": "python"}, timeout=60)
            assert refused.status_code == 503 and "all running a call" in refused.json()["detail"]
            assert all(c.result()["status"] == "Success" for c in calls)
    finally:
        stop_server(capped.process)


def test_a_server_restart_is_named_as_the_reason() -> None:
    first = start_server("--slots", "1", "--preload", "")
    port = first.url.rsplit(":", 1)[1]
    sid = create(first)
    stop_server(first.process)
    second = start_server("--slots", "1", "--preload", "", "--port", port)
    try:
        assert second.url == first.url
        assert "server restarted" in gone(second, sid)
    finally:
        stop_server(second.process)



# The exit code of a process that is not the server's child reaches it through its pidfd from Linux 6.15.
OWN_EXIT_CODES = tuple(map(int, os.uname().release.split(".")[:2])) >= (6, 15)


@pytest.mark.parametrize(("language", "code", "exit_code"), [
    ("bash", "echo before; exit 3", 3),
    ("bash", "sleep 100 &\necho before; exit 4", 4),  # a job left running: PID 1 outlives the shell
    ("bash", "echo before; kill -KILL $$", -9),
    ("python", "import os\nprint('before', flush=True)\nos._exit(7)", 7),
])
def test_an_interpreter_that_exits_by_itself_ends_its_call_with_its_exit_code(
        server: ServerHandle, language: str, code: str, exit_code: int) -> None:
    sid = create(server, language)
    body = call(server, sid, code, language=language)
    assert body["status"] == "Failed" and body["session_alive"] is False, body
    assert body["run_result"]["stdout"] == "before\n" and body["run_result"]["status"] == "Finished", body
    if OWN_EXIT_CODES:
        assert body["run_result"]["return_code"] == exit_code, body
        assert body["message"] == f"exited with return code {exit_code}; the session ended: its interpreter exited"
    else:
        assert body["run_result"]["return_code"] is None, body
    assert "its interpreter exited" in gone(server, sid, language)


def test_a_bash_session_ended_by_a_bare_exit_ended_its_call_as_a_success(server: ServerHandle) -> None:
    sid = create(server, "bash")
    body = call(server, sid, "echo bye; exit", language="bash")
    assert body["session_alive"] is False and body["run_result"]["stdout"] == "bye\n", body
    if OWN_EXIT_CODES:
        assert body["status"] == "Success" and body["run_result"]["return_code"] == 0, body


def test_a_call_cut_by_its_sessions_end_keeps_the_output_of_the_cells_that_ran(server: ServerHandle) -> None:
    """Red team, 2026-12-07: a /run_jupyter call in flight when its session was deleted answered no cell
    at all, though its first had run and printed; a time-out keeps them, so does the session's end."""
    sid = create(server)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(requests.post, server.url + "/run_jupyter", timeout=60, json={
            "cells": ["print('start')\nheld = b'x' * (64 << 20)", "import time\ntime.sleep(30)", "print('never')"],
            "total_timeout": 40, "session_id": sid})
        # The first cell has run once the session holds what it wrote (its cgroup's count).
        wait_until(lambda: requests.get(f"{server.url}/sessions/{sid}", timeout=60).json()["memory_bytes"] > 60 << 20,
                   30, "the first cell run", every=0.2)
        assert requests.delete(f"{server.url}/sessions/{sid}", timeout=60).status_code == 200
        body = pending.result().json()
    assert body["status"] == "Failed" and body["session_alive"] is False, body
    assert "ended by DELETE /sessions" in body["message"], body
    assert [cell["stdout"] for cell in body["cells"]] == ["start\n"], body


def test_a_session_the_server_kills_reports_no_exit_code_of_its_own(server: ServerHandle) -> None:
    sid = create(server, memory_limit_MB=128)
    body = call(server, sid, "blocks = []\nwhile True:\n    blocks.append(bytearray(16 << 20))", run_timeout=20)
    assert body["session_alive"] is False and "memory" in body["message"], body
    assert body["run_result"]["return_code"] is None and "exited with return code" not in body["message"], body

# ---- time-outs and memory ------------------------------------------------------------------------
def test_a_timeout_the_interrupt_stops_keeps_the_session(server: ServerHandle) -> None:
    sid = create(server)
    call(server, sid, "kept = 'state'")
    body = call(server, sid, "while True:\n    pass", run_timeout=1)
    assert body["status"] == "Failed" and body["run_result"]["status"] == "TimeLimitExceeded"
    assert body["session_alive"] is True and "session lives on" in body["message"]
    assert stdout(call(server, sid, "print(kept)")) == "state\n"


def test_a_timeout_that_ignores_the_interrupt_kills_the_session_and_says_so(server: ServerHandle) -> None:
    sid = create(server)
    body = call(server, sid, "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                             "while True:\n    time.sleep(0.1)", run_timeout=1)
    assert body["status"] == "Failed" and body["run_result"]["status"] == "TimeLimitExceeded"
    assert body["session_alive"] is False and "the session ended" in body["message"]
    assert "the code ignores SIGINT" in body["message"]
    assert "killed" in gone(server, sid)


def test_a_bash_timeout_is_interrupted_and_the_shell_lives_on(server: ServerHandle) -> None:
    sid = create(server, "bash")
    call(server, sid, "KEPT=yes", language="bash")
    body = call(server, sid, "sleep 100", language="bash", run_timeout=1)
    assert body["run_result"]["status"] == "TimeLimitExceeded" and body["session_alive"] is True, body
    assert stdout(call(server, sid, "echo $KEPT", language="bash")) == "yes\n"



@pytest.mark.parametrize("code", ["sleep 100; echo late > /workdir/late; echo done",
                                  "for i in $(seq 50); do sleep 0.2; echo $i >> /workdir/late; done; echo done",
                                  "while :; do :; done; echo late > /workdir/late; echo done",
                                  "g() { sleep 100; echo late > /workdir/late; }; g; echo late >> /workdir/late; echo done",
                                  "a() { b; echo late > /workdir/late; }; b() { while :; do sleep 0.2; done; echo late; }\n"
                                  "for i in 1 2; do a; echo late >> /workdir/late; done; echo done",
                                  "f() { local v=$(sleep 100); echo late > /workdir/late; }; f",
                                  "f() { local -; sleep 100; echo late > /workdir/late; }; f; echo done",
                                  "set -u; f() { x=$(sleep 100); echo late > /workdir/late; }; f; echo done",
                                  "timeout 30 sleep 100; echo late > /workdir/late; echo done",
                                  "f() { setsid sleep 100; echo late > /workdir/late; }; f; echo done"],
                         ids=["a-list", "a-loop", "a-busy-loop", "in-a-function", "in-nested-functions-in-a-loop",
                              "a-substitution-ending-a-function", "local-options", "nounset", "timeout",
                              "setsid-in-a-function"])
def test_a_bash_timeout_runs_nothing_after_the_interrupted_command(server: ServerHandle, code: str) -> None:
    """Red team, 2026-12-07: the INT trap only printed KeyboardInterrupt, so bash went on with the
    rest of the call after its time-out (and a loop ran until the session was killed near the
    client's deadline); then, a second red team: in a function the trap's `break` was refused, and
    the rest of the function and of the call ran; a third: a substitution ending a function, `local -`,
    `set -u` and a program in a process group of its own (`timeout`) had the session killed.  As in a Jupyter kernel, the interrupt now ends the call's
    code, and the shell's own DEBUG trap and options are as they were."""
    sid = create(server, "bash")
    call(server, sid, "declare -A kept=([a]=1)", language="bash")
    body = call(server, sid, code, language="bash", run_timeout=1)
    assert body["run_result"]["status"] == "TimeLimitExceeded" and body["session_alive"] is True, body
    assert body["run_result"]["return_code"] == 130 and "done" not in body["run_result"]["stdout"], body
    time.sleep(1.5)  # what a loop left running would have written by now
    after = call(server, sid, "cat /workdir/late 2>/dev/null | wc -l; echo ${kept[a]}", language="bash")
    lines, kept = stdout(after).split()[-2:]
    assert int(lines) <= 5 and kept == "1", after
    shell = call(server, sid, "trap -p DEBUG; shopt -q extdebug && echo extdebug; [[ $- == *T* ]] && echo functrace; "
                              "f() { echo in-f; }; f; echo after-f", language="bash")
    assert stdout(shell) == "in-f\nafter-f\n", shell


def test_a_time_out_racing_the_end_of_a_bash_call_leaves_its_fetched_file_whole(server: ServerHandle) -> None:
    """Red team, 2026-12-07: the interrupt of a call that ended just before its time-out reached the
    shell's fetch of its files and killed `base64` part way: the file came back cut short."""
    sid = create(server, "bash")
    whole = call(server, sid, "head -c 20000000 /dev/urandom > f; base64 -w0 f | wc -c", language="bash")
    size = int(stdout(whole))
    for sleep in (0.95, 0.96, 0.97, 0.98, 0.99, 1.0):
        body = call(server, sid, f"sleep {sleep}", language="bash", run_timeout=1, fetch_files=["f"])
        assert len(body["files"].get("f") or "") in (0, size), (sleep, len(body["files"].get("f") or ""), size)
        assert body["session_alive"] is True, (sleep, body["message"], body["run_result"]["stderr"][-300:])


def test_a_bare_break_or_return_in_bash_ends_only_its_call(server: ServerHandle) -> None:
    sid = create(server, "bash")
    assert stdout(call(server, sid, "X=1; break; echo unreached", language="bash")) == ""
    body = call(server, sid, "return; echo $X", language="bash")
    assert body["run_result"]["stdout"] == "1\n" and "can only `return'" in body["run_result"]["stderr"], body
    assert stdout(call(server, sid, "echo $X", language="bash")) == "1\n"
    assert stdout(call(server, sid, "set -u", language="bash")) == ""  # nothing of ours reads an unset name
    assert stdout(call(server, sid, "echo $X", language="bash")) == "1\n"

def test_a_memory_bomb_kills_only_its_own_session(server: ServerHandle) -> None:
    bomb, bystander = create(server, memory_limit_MB=128), create(server)
    call(server, bystander, "alive = 'still here'")
    body = call(server, bomb, "blocks = []\nwhile True:\n    blocks.append(bytearray(16 << 20))", run_timeout=20)
    assert body["status"] == "Failed" and body["session_alive"] is False, body
    assert "memory" in body["message"]
    assert "memory" in gone(server, bomb)
    assert stdout(call(server, bystander, "print(alive)")) == "still here\n"


# ---- round-1 hostile cases inside a session ------------------------------------------------------
def test_no_network_inside_a_session(server: ServerHandle) -> None:
    sid = create(server)
    port = int(server.url.rsplit(":", 1)[1])
    out = stdout(call(server, sid, f"import socket\nprint(sorted(line.split(':')[0].strip() for line in open('/proc/net/dev').readlines()[2:]))\n"
                                   f"try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
                                   f"    print('CONNECTED')\nexcept OSError as e:\n    print('refused')\n"))
    assert out == "['lo']\nrefused\n"


def test_host_files_and_server_env_are_invisible_inside_a_session(server: ServerHandle) -> None:
    secret = Path("/root") / f"verl_sf_session_secret_{secrets.token_hex(4)}"
    secret.write_text("TOP-SECRET-CONTENT")
    secret.chmod(0o600)
    try:
        sid = create(server)
        pid = server.process.pid
        out = stdout(call(server, sid, f"import os\nprint(dict(os.environ))\n"
                                       f"for path in ['{secret}', '/etc/shadow', '/proc/{pid}/environ']:\n"
                                       f"    try:\n        print('GOT', open(path).read())\n"
                                       f"    except OSError as e:\n        print('denied', e.errno)\n"))
        bash = create(server, "bash")
        bash_out = stdout(call(server, bash, f"env; cat {secret} /proc/{pid}/environ 2>&1; echo done",
                               language="bash"))
    finally:
        secret.unlink()
    for text in (out, bash_out):
        assert "TOP-SECRET-CONTENT" not in text and SERVER_SECRET not in text and "VERL_SF_TEST_SECRET" not in text
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["denied"] * 3
    assert bash_out.rstrip().endswith("done")


def test_a_fork_bomb_in_a_session_is_contained(server: ServerHandle) -> None:
    sid, bystander = create(server), create(server)
    body = call(server, sid, "import os\ncount = 0\nfor _ in range(100000):\n    try:\n        if os.fork() == 0:\n"
                             "            import time; time.sleep(60); os._exit(0)\n        count += 1\n"
                             "    except OSError:\n        break\nprint('forked', count)\n", run_timeout=10)
    assert body["status"] == "Success", body
    assert int(body["run_result"]["stdout"].split()[1]) < 300  # the session's pids cap stopped it
    assert stdout(call(server, bystander, "print('fine')")) == "fine\n"
    requests.delete(f"{server.url}/sessions/{sid}", timeout=60)
    assert health(server)["status"] == "ok"


def test_processes_a_session_starts_live_only_as_long_as_the_session(server: ServerHandle) -> None:
    sid = create(server, "bash")
    body = call(server, sid, "setsid sleep 4567 > /dev/null 2>&1 < /dev/null &\n"
                             "nohup sleep 4567 > /dev/null 2>&1 &\necho started", language="bash")
    assert stdout(body) == "started\n"
    # Alive between calls: the call may end before both background shells have exec'd `sleep`, and
    # from its reply on they run at the least CPU weight.
    wait_until(lambda: len(host_processes("sleep 4567")) == 2, 30, "both background sleeps", every=0.05)
    requests.delete(f"{server.url}/sessions/{sid}", timeout=60)
    wait_until(lambda: host_processes("sleep 4567") == [], 30, "the session's daemons died with it", every=0.2)


def host_processes(command: str) -> list[str]:
    return subprocess.run(["pgrep", "-f", command], capture_output=True, text=True).stdout.split()


# ---- scale ---------------------------------------------------------------------------------------
def _session_calls(index: int, marker: str) -> tuple[str, list[str]]:
    """Five calls that count in the session's own state; python and bash alternate."""
    if index % 2:
        return "bash", [f"M={marker}; N=1; echo $M $N"] + ["N=$((N + 1)); echo $M $N"] * 4
    return "python", [f"marker = {marker!r}\nn = 1\nprint(marker, n)"] + ["n += 1\nprint(marker, n)"] * 4


async def _one_session(http: aiohttp.ClientSession, url: str, index: int) -> list[str]:
    marker = f"m{index}-{secrets.token_hex(4)}"
    language, codes = _session_calls(index, marker)
    async with http.post(url + "/sessions", json={"language": language}) as response:
        assert response.status == 201, await response.text()
        sid = (await response.json())["session_id"]
    outputs = []
    for code in codes:
        async with http.post(url + "/run_code", json={"code": code, "language": language, "session_id": sid,
                                                      "run_timeout": 30}) as response:
            assert response.status == 200, await response.text()
            body = await response.json()
        assert body["status"] == "Success" and body["session_id"] == sid, body
        outputs.append(body["run_result"]["stdout"])
    async with http.delete(f"{url}/sessions/{sid}") as response:
        assert response.status == 200
    assert outputs == [f"{marker} {i}\n" for i in range(1, 6)], (index, outputs)
    return outputs


def test_300_concurrent_sessions_of_5_calls_none_lost_none_crossed(server: ServerHandle) -> None:
    async def main() -> list[list[str]]:
        timeout = aiohttp.ClientTimeout(total=600)
        async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=300)) as http:
            return await asyncio.gather(*(_one_session(http, server.url, i) for i in range(300)))

    results = asyncio.run(main())
    assert len(results) == 300 and all(len(outputs) == 5 for outputs in results)


# ---- backends ------------------------------------------------------------------------------------
def test_http_backend_keys_sessions_and_reports_their_end(server: ServerHandle) -> None:
    async def main() -> None:
        backend = HttpSandboxBackend(server.url)
        await backend.check_sessions()
        first = await backend.run_code(RunCodeRequest(code="x = 1", language="python"), session="traj")
        again = await backend.run_code(RunCodeRequest(code="print(x + 1)", language="python"), session="traj")
        assert again.session_id == first.session_id and again.run_result.stdout == "2\n"
        shell = await backend.run_code(RunCodeRequest(code="echo $0", language="bash"), session="traj")
        assert shell.session_id != first.session_id and backend.sessions() == ["traj"]
        stateless = await backend.run_code(RunCodeRequest(code="print('x' in globals())", language="python"))
        assert stateless.session_id is None and stateless.run_result.stdout == "False\n"
        requests.delete(f"{server.url}/sessions/{first.session_id}", timeout=60)
        with pytest.raises(SessionGone, match="ended by DELETE"):
            await backend.run_code(RunCodeRequest(code="print(x)", language="python"), session="traj")
        fresh = await backend.run_code(RunCodeRequest(code="print('x' in globals())", language="python"),
                                       session="traj")
        assert fresh.session_id != first.session_id and fresh.run_result.stdout == "False\n"
        await backend.end_session("traj")
        assert backend.sessions() == []
        assert requests.get(f"{server.url}/sessions/{fresh.session_id}", timeout=60).status_code == 404
        await backend.close()

    asyncio.run(main())


def test_local_backend_keeps_sessions_too() -> None:
    from verl_sf.backends.config import LocalBackendConfig
    from verl_sf.executor import ExecutorConfig

    async def main() -> None:
        backend = LocalBackendConfig(executor=ExecutorConfig(slots=1, sandboxes=1, preload=())).build()
        try:
            await backend.run_code(RunCodeRequest(code="cd /tmp; X=7", language="bash"), session="t")
            body = await backend.run_code(RunCodeRequest(code="echo $PWD $X", language="bash"), session="t")
            assert body.run_result.stdout == "/tmp 7\n" and body.session_alive is True
            killed = await backend.run_code(RunCodeRequest(
                code="import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(100)",
                language="python", run_timeout=1), session="t")
            assert killed.session_alive is False and backend.sessions() == ["t"]  # bash's session lives on
            fresh = await backend.run_code(RunCodeRequest(code="print('signal' in globals())", language="python"),
                                           session="t")
            assert fresh.run_result.stdout == "False\n" and fresh.session_id != killed.session_id
            await backend.end_session("t")
            assert backend.sessions() == []
        finally:
            await backend.close()

    asyncio.run(main())


# ---- clean-up ------------------------------------------------------------------------------------
def test_server_shutdown_ends_every_session_and_leaves_nothing(tmp_path: Path) -> None:
    handle = start_server("--slots", "1", "--preload", "", env={**os.environ, "TMPDIR": str(tmp_path)})
    pid = handle.process.pid
    python, bash = create(handle), create(handle, "bash")
    call(handle, python, "import subprocess\np = subprocess.Popen(['sleep', '4321'])\nopen('f', 'w').write('x')")
    call(handle, bash, "sleep 4321 &\necho started", language="bash")
    assert len(server_groups(pid)) == len(group_bases()), "the server should have made its group in each hierarchy"
    stop_server(handle.process)
    assert handle.process.returncode == 0
    wait_until(lambda: list(tmp_path.iterdir()) == [], 5, "the server's temporary directories are removed")
    assert server_groups(pid) == []
    leftover = subprocess.run(["pgrep", "-f", "sleep 4321"], capture_output=True, text=True).stdout.split()
    survivors = [p for p in leftover if Path(f"/proc/{p}/status").exists()
                 and "101000" in Path(f"/proc/{p}/status").read_text()]
    assert survivors == []
