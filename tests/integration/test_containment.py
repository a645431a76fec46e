"""Nothing outlives its reply, nothing passes between runs, one request cannot stall the server.

Each case is an attack found on a real server, replayed against servers started as root and as an
ordinary account; host-side checks read the host's /proc, never what the sandbox says about itself.
"""

from __future__ import annotations

import base64
import json
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.hidden_cpu import hidden_cpu_is_demoted, session_background_is_demoted
from tests.host_view import comm, cpu_seconds, descendants, killed_by_reply, run_processes, zygotes
from tests.sandbox_kills import kill_sandboxes_mid_run
from tests.server_fixtures import SERVER_MODES, ServerHandle, run_code, server_in_mode
from tests.waiting import wait_until

SERVER_ARGS = ("--slots", "2", "--sandboxes", "1", "--preload", "")


@pytest.fixture(scope="module", params=SERVER_MODES)
def server(request: pytest.FixtureRequest) -> Iterator[ServerHandle]:
    with server_in_mode(request.param, *SERVER_ARGS) as handle:
        yield handle


@pytest.fixture(autouse=True)
def server_answers(server: ServerHandle) -> Iterator[None]:
    """After every case the same server still answers python and C++ runs and opens sessions."""
    yield
    assert server.process.poll() is None, "the server died"
    assert run_code(server, "print('alive')")["run_result"]["stdout"] == "alive\n"
    cpp = run_code(server, '#include <cstdio>\nint main(){puts("c++");}', language="cpp", compile_timeout=60)
    assert cpp["run_result"]["stdout"] == "c++\n", cpp
    session = requests.post(server.url + "/sessions", json={"language": "python"}, timeout=60)
    assert session.status_code == 201, session.text
    requests.delete(f"{server.url}/sessions/{session.json()['session_id']}", timeout=30)


def processes_with(server: ServerHandle, marker: str) -> list[int]:
    """The server's descendants whose command line holds `marker` (read from the host)."""
    found = []
    for pid in descendants(server.process.pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if marker.encode() in fh.read():
                    found.append(pid)
        except OSError:
            continue
    return found


def processes_named(server: ServerHandle, name: str) -> list[int]:
    """The server's descendants whose name (comm, which a run sets with prctl) is `name` (read from the host)."""
    return [pid for pid in descendants(server.process.pid) if comm(pid) == name]


def naming_self(name: str) -> str:
    """Code that names its own process `name` (at most 15 bytes), for the host to see it has got that far."""
    return f"import ctypes\nctypes.CDLL(None).prctl(15, b'{name}', 0, 0, 0)\n"


def zygote_rss_kb(server: ServerHandle) -> int:
    warm = zygotes(server.process.pid)
    assert warm, "no zygote found"
    total = 0
    for pid in warm:
        with open(f"/proc/{pid}/status") as fh:
            total += next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))
    return total


# ---- a reply ends the run ---------------------------------------------------------------------
FORGE = ("import os\n"
         "for record in ({'kind': 'done', 'return_code': 0}, {'done': True, 'return_code': 0}):\n"
         "    os.write(3, (__import__('json').dumps(record) + '\\n').encode())\n"
         "os.close(1); os.close(2)\n")


def test_a_forged_completion_record_neither_ends_nor_outlives_the_run(server: ServerHandle) -> None:
    marker = f"forged-{secrets.token_hex(4)}"
    code = FORGE + f"os.execv('/bin/sleep', ['{marker}', '3600'])\n"
    started = time.monotonic()
    body = run_code(server, code, run_timeout=2)
    assert time.monotonic() - started >= 2, "answered before its time-out: the forged record was believed"
    assert body["status"] == "Failed" and body["run_result"]["status"] == "TimeLimitExceeded", body
    killed_by_reply(processes_with(server, marker), "the run")


def test_a_forged_record_does_not_change_the_return_code(server: ServerHandle) -> None:
    body = run_code(server, FORGE + "import sys\nsys.exit(3)\n")
    assert body["status"] == "Failed" and body["run_result"]["return_code"] == 3, body


def test_a_record_nested_past_the_stack_ends_neither_the_sandbox_nor_a_run_beside_it(server: ServerHandle) -> None:
    """A line on fd 3 the zygote would recurse into past its stack, or encode again into its reply
    past it: garbage the run wrote to itself, ignored; its run, its zygote and a run beside it go on."""
    warm = set(zygotes(server.process.pid))
    with ThreadPoolExecutor(1) as pool:
        bystander = pool.submit(run_code, server, "import time; time.sleep(1.5); print('bystander')")
        for depth in (100_000, 990):
            for kind in ("cell", "done"):
                nested = "[" * depth + "]" * depth
                record = f'{{"kind": "{kind}", "outputs": {nested}, "files": {nested}, "return_code": 0}}'
                body = run_code(server, f"import os\nos.write(3, {record!r}.encode() + b'\\n')\nprint('attacker')")
                assert body["status"] == "Success" and body["run_result"]["stdout"] == "attacker\n", (depth, kind, body)
        assert bystander.result()["run_result"]["stdout"] == "bystander\n"
    assert set(zygotes(server.process.pid)) == warm, "a zygote died"


def test_records_not_of_their_shape_are_the_runs_doing_never_a_server_error(server: ServerHandle) -> None:
    """A 500 is a sandbox failure to every client (never scored as wrong): a run must not be able to
    make its own reply one by writing records of the wrong shape in place of its child's."""
    def forging(record: dict) -> str:
        return f"import os\nos.write(3, {json.dumps(record)!r}.encode() + b'\\n')\nprint('forger')\nos._exit(0)\n"

    for files in ({"a": 5}, [1], "x"):
        body = run_code(server, forging({"kind": "done", "files": files}), fetch_files=["/workdir/x"])
        assert body["status"] == "Success" and body["files"] == {}, (files, body)
    cells = [forging({"kind": "cell", "stdout": 5, "display": "x"}), "print(1)"]
    answer = requests.post(server.url + "/run_jupyter", json={"cells": cells}, timeout=60)
    assert answer.status_code == 200, answer.text[:300]
    assert "the run's own code wrote it" in answer.json()["cells"][0]["error"][0]["evalue"], answer.text[:300]


def test_a_session_call_forging_its_end_of_any_shape_leaves_the_zygote_and_other_sessions_alone(
        server: ServerHandle) -> None:
    """A python session's interpreter runs the code, so the code can write the call's end itself: one
    not of the interpreter's shape (numbers of other types, files not a list) or cut short is the
    code's garbage and the call ends at its real end; the sandbox, the session and a session beside
    it go on."""
    warm = set(zygotes(server.process.pid))

    def session() -> str:
        opened = requests.post(server.url + "/sessions", json={"language": "python"}, timeout=60)
        assert opened.status_code == 201, opened.text
        return opened.json()["session_id"]

    bystander, forger = session(), session()
    try:
        assert run_code(server, "kept = 'bystander'", session_id=bystander)["status"] == "Success"
        for record in ({"kind": "call_done", "return_code": 0, "fetched": 5}, {"kind": "call_done", "return_code": "x"},
                       {"kind": "call_done", "return_code": 0, "cpu_time": [1]}, {"kind": "call_done", "return_code": 1e300},
                       {"kind": "call_done", "return_code": 2**40}):
            for line_end in ("\\n", ""):  # a whole line, or one left open for the interpreter's record to end
                code = f"import os\nos.write(3, {json.dumps(record)!r}.encode() + b'{line_end}')\nprint('forger')"
                body = run_code(server, code, session_id=forger, fetch_files=["/workdir/x"], run_timeout=5)
                assert body["status"] == "Success" and body["run_result"]["stdout"] == "forger\n", (record, body)
                assert body["run_result"]["execution_time"] < 5, body  # its real end, not its time-out
                assert run_code(server, "print(1)", session_id=forger)["run_result"]["stdout"] == "1\n", record
        assert run_code(server, "print(kept)", session_id=bystander)["run_result"]["stdout"] == "bystander\n"
    finally:
        for sid in (bystander, forger):
            requests.delete(f"{server.url}/sessions/{sid}", timeout=30)
    assert set(zygotes(server.process.pid)) == warm, "a zygote died"


# Ends its call at once and every 0.5 s after (forged ends, from a thread), while its interpreter sleeps.
FORGER = ("import os, threading, time\nEND = b'\\n{\"kind\": \"call_done\", \"return_code\": 0}\\n'\n"
          "def forge():\n    while True:\n        time.sleep(0.5)\n        os.write(3, END)\n"
          "threading.Thread(target=forge, daemon=True).start()\nos.write(3, END)\ntime.sleep(60)")


def test_a_session_that_stops_reading_holds_up_no_other_session(server: ServerHandle) -> None:
    """Red team, 2026-11-30: the zygote wrote each call to a session's interpreter with a blocking
    write, so a session whose code ended its call early (a forged end) and kept its interpreter
    from reading froze every session of that sandbox, any tenant's, once a call larger than the
    socket's buffer was sent to it.  Now the rest goes as the interpreter reads; a call that ended
    before it was read whole leaves the session ended (what follows would be read as its rest)."""
    def session() -> str:
        opened = requests.post(server.url + "/sessions", json={"language": "python"}, timeout=60)
        assert opened.status_code == 201, opened.text
        return str(opened.json()["session_id"])

    stuck, bystander = session(), session()
    try:
        assert run_code(server, FORGER, session_id=stuck, run_timeout=10)["status"] == "Success"
        with ThreadPoolExecutor(1) as pool:
            large = pool.submit(run_code, server, "# " + "x" * (4 << 20) + "\nprint('read')", session_id=stuck,
                                run_timeout=3)
            time.sleep(1)
            started = time.monotonic()
            beside = run_code(server, "print('beside')", session_id=bystander, run_timeout=10)
            assert beside["run_result"]["stdout"] == "beside\n", beside
            assert time.monotonic() - started < 5, "a session waited for another's read"
            assert large.result()["run_result"]["stdout"] == "", large.result()
        after = requests.post(server.url + "/run_code", timeout=60,
                              json={"code": "print('after')", "language": "python", "session_id": stuck})
        # The session's end, named: 404 once the server has heard of it, else the call's own answer.
        assert after.status_code in (200, 404) and "kept its interpreter from reading" in after.text, after.text
        assert after.status_code == 404 or after.json()["session_alive"] is False, after.text
    finally:
        for sid in (stuck, bystander):
            requests.delete(f"{server.url}/sessions/{sid}", timeout=30)


def test_an_idle_sessions_endless_output_costs_its_zygote_nothing(server: ServerHandle) -> None:
    """Red team, 2026-11-30: between calls the zygote read all an idle session wrote, at full priority
    outside any run's group: two sessions writing to stdout forever from a thread kept it ~50% busy.
    Now what the next call could not show is left in the pipe, whose writer waits; the next call
    still runs, and still shows the background's output as it did."""
    flood = ("import os, threading\ndef spam():\n    chunk = b'A' * 65536\n    while True:\n        os.write(1, chunk)\n"
             "threading.Thread(target=spam, daemon=True).start()\n")
    sessions = [requests.post(server.url + "/sessions", json={"language": "python"}, timeout=60).json()["session_id"]
                for _ in range(2)]
    try:
        for sid in sessions:
            assert run_code(server, flood, session_id=sid)["session_alive"] is True
        time.sleep(1)
        warm = zygotes(server.process.pid)
        before = cpu_seconds(warm)
        time.sleep(2)
        assert cpu_seconds(warm) - before < 0.3, "the zygote kept reading an idle session's output"
        for sid in sessions:
            assert run_code(server, "print('next')", session_id=sid)["run_result"]["return_code"] == 0
    finally:
        for sid in sessions:
            requests.delete(f"{server.url}/sessions/{sid}", timeout=30)


def test_output_floods_past_their_limit_are_drained_slowly_and_runs_beside_them_answer(server: ServerHandle) -> None:
    """Red team, 2026-12-07: four runs writing stdout as fast as they could, drained by their zygote at
    full speed (their bytes past the output limit dropped anyway), froze the whole 2-core VM for up to
    25 s (its kernel, with the runs and the zygote in cpu groups): a run beside them answered as its own
    time-out. Past its limit a stream is now read once a pause; the floods still end at their time-out."""
    floods = {"python": "import os\nchunk = b'x' * (1 << 20)\nwhile True:\n    os.write(1, chunk)\n",
              "bash": "yes xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}
    with ThreadPoolExecutor(4) as pool:
        flooding = [pool.submit(run_code, server, code, language=language, run_timeout=8)
                    for language in floods for code in [floods[language]] * 2]
        time.sleep(2)  # each past its output limit
        warm = zygotes(server.process.pid)
        before = cpu_seconds(warm)
        started = time.monotonic()
        beside = run_code(server, "print('beside')", run_timeout=5)
        assert beside["status"] == "Success" and beside["run_result"]["stdout"] == "beside\n", beside
        assert time.monotonic() - started < 8, "a run beside the floods waited on them"
        time.sleep(max(0.0, 3 - (time.monotonic() - started)))
        spent = cpu_seconds(warm) - before
        assert spent < 0.5 * (time.monotonic() - started), f"the zygote drained the floods at {spent:.2f} CPU-s"
        for flood in flooding:
            body = flood.result()
            assert body["run_result"]["status"] == "TimeLimitExceeded" and body["truncated"] is True, body["message"]
            assert body["run_result"]["stdout"].endswith("not shown]\n"), body["run_result"]["stdout"][-200:]


def test_a_run_reads_nothing_of_the_sandbox_set_up_in_its_command_line(server: ServerHandle) -> None:
    """A run is a fork of the warm interpreter, so its /proc/<pid>/cmdline is the zygote's argv: the
    zygote's configuration (uids, host paths, limits) is read from a descriptor, never passed there."""
    code = ("import os\nfor pid in ('self', '1'):\n    try:\n        print(open(f'/proc/{pid}/cmdline', 'rb').read())\n"
            "    except OSError as exc:\n        print(exc.errno)\n")
    body = run_code(server, code)
    assert body["status"] == "Success", body
    for leaked in ("run_uids", "seccomp", "workdir", "landlock"):
        assert leaked not in body["run_result"]["stdout"], body["run_result"]["stdout"]


def test_daemons_of_a_run_are_dead_by_its_reply(server: ServerHandle) -> None:
    marker = f"daemon-{secrets.token_hex(4)}"
    code = ("import os, subprocess\n"
            f"subprocess.Popen(['{marker}', '3600'], executable='/bin/sleep', start_new_session=True,\n"
            "                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
            + FORGE + "os._exit(0)\n")
    body = run_code(server, code)
    assert body["run_result"]["return_code"] == 0, body
    killed_by_reply(processes_with(server, marker), "a daemon of the run")


def test_an_exec_run_cannot_write_its_pid1s_records(server: ServerHandle) -> None:
    """Under a compiled program, PID 1 is not dumpable: its fd 3 is out of the program's reach."""
    source = ('#include <fcntl.h>\n#include <unistd.h>\n#include <stdio.h>\n#include <string.h>\n'
              'int main(){const char*r="{\\"kind\\": \\"done\\", \\"return_code\\": 0}\\n";'
              'int fd=open("/proc/1/fd/3",O_WRONLY);printf("%d\\n",fd);'
              'if(fd>=0)write(fd,r,strlen(r));return 7;}\n')
    body = run_code(server, source, language="cpp", compile_timeout=60)
    assert body["run_result"]["stdout"] == "-1\n" and body["run_result"]["return_code"] == 7, body


# ---- bounded reply channels -------------------------------------------------------------------
def test_a_flood_of_cell_output_is_capped_and_the_sandbox_keeps_answering(server: ServerHandle) -> None:
    cells = ["print('x' * (1 << 20))"] * 530
    response = requests.post(server.url + "/run_jupyter", json={"cells": cells, "total_timeout": 60}, timeout=90)
    assert response.status_code == 200, response.text[:300]
    body = response.json()
    shown = sum(len(cell["stdout"]) for cell in body["cells"])
    assert shown < 4 << 20, f"{shown} bytes of cell output came back"
    assert body["truncated"] is True
    assert requests.get(server.url + "/health", timeout=10).json()["status"] == "ok"


def test_a_flood_of_records_is_ended_and_reported_truncated(server: ServerHandle) -> None:
    code = "import os\nline = b'{\"kind\": \"cell\", \"stdout\": \"' + b'y' * (1 << 20) + b'\"}\\n'\n" \
           "for _ in range(530):\n    os.write(3, line)\n"
    body = run_code(server, code, run_timeout=30)
    assert body["truncated"] is True and body["status"] == "Failed", {k: v for k, v in body.items() if k != "files"}
    assert "records to the server passed" in body["run_result"]["stderr"]


def test_a_record_without_newline_costs_the_zygote_nothing(server: ServerHandle) -> None:
    before = zygote_rss_kb(server)
    started = time.monotonic()
    body = run_code(server, "import os\nchunk = b'z' * (1 << 16)\nwhile True:\n    os.write(3, chunk)\n",
                    run_timeout=20, memory_limit_MB=32)
    assert time.monotonic() - started < 15, "the flood was not cut at the record cap"
    assert body["truncated"] is True, body
    assert zygote_rss_kb(server) - before < 64 << 10, "the zygote kept the flood"


def test_fetch_files_reads_each_file_once(server: ServerHandle) -> None:
    code = "open('big', 'wb').write(b'b' * (8 << 20))\n"
    body = run_code(server, code, fetch_files=["big", "./big", "/workdir/big"])
    assert list(body["files"]) == ["big"], list(body["files"])
    assert len(base64.b64decode(body["files"]["big"])) == 8 << 20


# ---- nothing passes between runs --------------------------------------------------------------
@pytest.mark.parametrize("target", ["/dev/stdin", "/dev/stdout", "/dev/fd", "/planted", "/opt/planted",
                                    "/usr/planted", "/etc/planted"])
def test_the_sandbox_tree_is_read_only_to_runs(server: ServerHandle, target: str) -> None:
    code = ("import os\n"
            f"target = {target!r}\n"
            "try:\n"
            "    if os.path.lexists(target):\n"
            "        os.remove(target)\n"
            "    os.symlink('/workdir/evil', target)\n"
            "    print('planted')\n"
            "except OSError as exc:\n"
            "    print('refused', exc.errno)\n")
    body = run_code(server, code)
    assert body["run_result"]["stdout"].startswith("refused"), body


def test_a_later_run_reads_its_own_stdin(server: ServerHandle) -> None:
    plant = ("import os\nopen('/workdir/evil', 'w').write('999 999\\n')\n"
             "for path in ('/dev/stdin', '/proc/self/fd/0'):\n"
             "    try:\n        os.remove(path); os.symlink('/workdir/evil', path)\n"
             "    except OSError:\n        pass\n")
    run_code(server, plant)
    node = "const s = require('fs').readFileSync('/dev/stdin', 'utf8').split(' ').map(Number); console.log(s[0] + s[1]);"
    for _ in range(3):
        body = run_code(server, node, language="nodejs", stdin="1 2\n")
        assert body["run_result"]["stdout"] == "3\n", body
    bash = run_code(server, "cat <(echo substituted)", language="bash")
    assert bash["run_result"]["stdout"] == "substituted\n", bash


def test_concurrent_runs_do_not_share_ptys(server: ServerHandle) -> None:
    marker = f"pty-{secrets.token_hex(4)}"
    holder = ("import os, time\nmaster, follower = os.openpty()\nprint(os.ttyname(follower), flush=True)\n"
              f"os.write(follower, b'secret')\n{naming_self(marker)}time.sleep(4)\n")
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(run_code, server, holder, run_timeout=8)
        wait_until(lambda: processes_named(server, marker), 30, "the first run holds its pty")
        spy = ("import os\nnames = sorted(os.listdir('/dev/pts'))\nprint(names)\n"
               "for name in names:\n"
               "    if name.isdigit():\n"
               "        fd = os.open('/dev/pts/' + name, os.O_RDWR | os.O_NONBLOCK)\n"
               "        print('opened', name)\n")
        spied = run_code(server, spy)
        held = first.result()
    assert held["run_result"]["stdout"].startswith("/dev/pts/"), held
    assert "opened" not in spied["run_result"]["stdout"], spied


# ---- one network per run; /mnt as Sandbox Fusion has it ---------------------------------------
def test_concurrent_runs_each_bind_the_same_loopback_port(server: ServerHandle) -> None:
    code = ("import socket, time\ns = socket.socket()\ns.bind(('127.0.0.1', 8000))\ns.listen()\n"
            "time.sleep(1.5)\nprint('bound')\n")
    with ThreadPoolExecutor(8) as pool:
        bodies = list(pool.map(lambda _: run_code(server, code, run_timeout=10), range(8)))
    assert [b["run_result"]["stdout"] for b in bodies] == ["bound\n"] * 8, bodies


def test_a_run_cannot_reach_another_runs_listener(server: ServerHandle) -> None:
    marker = f"listen-{secrets.token_hex(4)}"
    listener = ("import socket\ns = socket.socket()\ns.bind(('127.0.0.1', 8001))\ns.listen()\ns.settimeout(4)\n"
                f"print('listening', flush=True)\n{naming_self(marker)}"
                "try:\n    s.accept(); print('reached')\nexcept socket.timeout:\n    print('alone')\n")
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(run_code, server, listener, run_timeout=8)
        wait_until(lambda: processes_named(server, marker), 30, "the first run listens")
        probe = run_code(server, "import socket\ntry:\n    socket.create_connection(('127.0.0.1', 8001), 1)\n"
                                 "    print('connected')\nexcept OSError as exc:\n    print('refused')\n")
        listened = first.result()
    assert probe["run_result"]["stdout"] == "refused\n", probe
    assert listened["run_result"]["stdout"] == "listening\nalone\n", listened


def test_code_writes_anywhere_under_mnt(server: ServerHandle) -> None:
    body = run_code(server, "import os\nopen('/mnt/b', 'w').write('bee')\nos.makedirs('/mnt/x/y')\n"
                            "open('/mnt/x/y/z', 'w').write('zed')\nprint(sorted(os.listdir('/mnt')))\n",
                    fetch_files=["/mnt/b", "/mnt/x/y/z"])
    assert body["run_result"]["stdout"] == "['b', 'data', 'x']\n", body
    assert {k: base64.b64decode(v) for k, v in body["files"].items()} == {"/mnt/b": b"bee", "/mnt/x/y/z": b"zed"}
    later = run_code(server, "import os\nprint(sorted(os.listdir('/mnt')))\n")
    assert later["run_result"]["stdout"] == "['data']\n", later


# ---- sessions always exist on record ----------------------------------------------------------
def _post_and_leave(url: str, body: bytes, after: float) -> None:
    """Send a whole POST /sessions, then leave `after` seconds later, while the session is opening."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as conn:
        conn.sendall(b"POST /sessions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        time.sleep(after)  # the client must leave at a chosen moment of the opening: time has to pass


def test_clients_that_leave_during_session_creation_leave_no_session(server: ServerHandle) -> None:
    before = len(run_processes(server.process.pid))
    body = json.dumps({"language": "python", "files": {"blob": base64.b64encode(b"f" * (20 << 20)).decode()}})
    threads = [threading.Thread(target=_post_and_leave, args=(server.url, body.encode(), 0.05 + 0.03 * (i % 10)))
               for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wait_until(lambda: len(run_processes(server.process.pid)) <= before, 30, "orphan sessions to be closed")
    health = requests.get(server.url + "/health", timeout=10).json()
    assert health["sessions"] == 0, health


# ---- CPU demotion and seccomp -----------------------------------------------------------------
def _nice(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[16])


def test_a_setsid_busy_loop_is_demoted_with_its_run(server: ServerHandle) -> None:
    marker = f"spin-{secrets.token_hex(4)}"
    code = ("import subprocess, sys, time\n"
            f"subprocess.Popen([sys.executable, '-c', 'while True: pass', '{marker}'], start_new_session=True)\n"
            "time.sleep(4)\n")
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(run_code, server, code, run_timeout=5)
        pids = wait_until(lambda: processes_with(server, marker), 10, "the setsid'd loop to start")
        wait_until(lambda: all(_nice(pid) == 19 for pid in pids), 5, "the setsid'd loop to be demoted")
        running.result()


def test_what_a_session_call_leaves_running_is_demoted_from_its_reply_on(server: ServerHandle) -> None:
    session_background_is_demoted(server)


def test_a_run_spending_its_cpu_in_processes_the_kernel_reaps_is_demoted_all_the_same(server: ServerHandle) -> None:
    hidden_cpu_is_demoted(server)


@pytest.mark.parametrize("name, number, errno_expected", [("listmount", 458, 1), ("statmount", 457, 1),
                                                         ("lsm_set_self_attr", 460, 1), ("newer", 470, 38)])
def test_new_system_calls_are_refused(server: ServerHandle, name: str, number: int, errno_expected: int) -> None:
    code = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            f"print(libc.syscall({number}, 0, 0, 0, 0), ctypes.get_errno())\n")
    body = run_code(server, code)
    assert body["run_result"]["stdout"] == f"-1 {errno_expected}\n", (name, body)


def test_a_port_an_earlier_run_closed_is_free_for_the_next(server: ServerHandle) -> None:
    """Network namespaces are reused once emptied: nothing an earlier run did to a port (a TIME_WAIT
    left by closing an accepted connection first) keeps a later run from binding it."""
    leave_time_wait = ("import socket\ns = socket.socket()\ns.bind(('127.0.0.1', 8003))\ns.listen()\n"
                       "c = socket.create_connection(('127.0.0.1', 8003))\na, _ = s.accept()\n"
                       "a.close(); c.close(); s.close()\nprint('closed')\n")
    bind_again = "import socket\ns = socket.socket()\ns.bind(('127.0.0.1', 8003))\ns.listen()\nprint('bound')\n"
    for _ in range(4):
        assert run_code(server, leave_time_wait)["run_result"]["stdout"] == "closed\n"
        for _ in range(3):
            body = run_code(server, bind_again)
            assert body["run_result"]["stdout"] == "bound\n", body


def test_a_forged_unstarted_record_is_not_a_sandbox_error(server: ServerHandle) -> None:
    """Only an exec run's PID 1 (no user code) may say its program could not be started: python code
    that writes the record on fd 3 still has its own verdict, never a SandboxError that no reward scores."""
    forge = ("import os\nos.write(3, b'{\"kind\": \"unstarted\", \"error\": \"verl-sf: forged\"}\\n')\n"
             "print('ran')\nraise SystemExit(1)\n")
    body = run_code(server, forge)
    assert body["status"] == "Failed" and body["run_result"]["return_code"] == 1, body
    assert body["run_result"]["stdout"] == "ran\n", body


# ---- a sandbox killed from outside ------------------------------------------------------------
def test_a_sandbox_killed_from_outside_fails_its_run_as_the_sandbox_and_is_started_again(server: ServerHandle) -> None:
    kill_sandboxes_mid_run(server)
