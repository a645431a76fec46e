"""No process of a run executes after its reply, on both rungs, as root and as an ordinary account:
a cells run is answered as its PID 1 asks to exit, once every process of it is killed and before the
kernel has torn them down (zygote/exits.py); a `/run_code` python run the same way while the server
has a CPU to spare, and on a busy server once the kernel reports its PID 1 gone.

Every process and thread of the run stamps CLOCK_MONOTONIC (shared with this harness: no time
namespace) into its own name, in a tight loop, while PID 1 ends; the harness, reading the host's
/proc once the reply has arrived, finds no stamp later than the reply's arrival.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from e2b_code_interpreter import Sandbox

from tests.integration.test_zygote_protocol import THREAD_EXITS_FIRST
from tests.server_fixtures import (
    CONTAINER_MODES,
    SERVER_MODES,
    ServerHandle,
    e2b_environment,
    run_code,
    server_in_mode,
)
from tests.waiting import wait_until
from verl_sf.executor.zygote import exits

DIGITS = 13  # a name holds 15 bytes: a 2-byte tag, then microseconds modulo 10**13 (115 days)


@pytest.fixture(scope="module", params=SERVER_MODES + CONTAINER_MODES)
def server(request: pytest.FixtureRequest) -> Iterator[ServerHandle]:
    with server_in_mode(request.param, "--slots", "2", "--sandboxes", "1", "--preload", "") as handle:
        yield handle


def stamping_run(tag: str, ending: str, pause: float = 0.0) -> str:
    """PID 1 starts stamping processes of every kind (a child, a setsid'd one, a double-forked daemon,
    one with threads, one that keeps forking), waits until each stamps, then ends with `ending`.
    `pause`: seconds between stamps (0: a tight loop)."""
    return f"""
import ctypes, os, threading, time
libc = ctypes.CDLL(None)
ready_r, ready_w = os.pipe()

def stamp():
    while True:
        libc.prctl(15, b"{tag}%0{DIGITS}d" % (time.monotonic_ns() // 1000 % 10**{DIGITS}), 0, 0, 0)
        if {pause}:
            time.sleep({pause})

def started():
    os.write(ready_w, b"x")
    stamp()

def child(body):
    if os.fork() == 0:
        try:
            body()
        finally:
            os._exit(0)

def setsid():
    os.setsid()
    started()

def daemon():
    os.setsid()
    if os.fork() == 0:
        started()

def threads():
    for _ in range(2):
        threading.Thread(target=stamp, daemon=True).start()
    started()

def forker():
    os.write(ready_w, b"x")
    for _ in range(20):
        child(stamp)
        libc.prctl(15, b"{tag}%0{DIGITS}d" % (time.monotonic_ns() // 1000 % 10**{DIGITS}), 0, 0, 0)
    stamp()

for body in (started, setsid, daemon, threads, forker):
    child(body)
got = b""
while len(got) < 5:
    got += os.read(ready_r, 5 - len(got))
print("stamping")
{ending}
"""


def stamps(tag: str) -> dict[tuple[int, int], int]:
    """(pid, tid) -> the stamp in its name, of every thread on the host whose name has the tag."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            tasks = os.listdir(f"/proc/{entry}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{entry}/task/{task}/comm") as fh:
                    name = fh.read().strip()
            except OSError:
                continue
            if name.startswith(tag) and name[len(tag):].isdigit():
                found[(int(entry), int(task))] = int(name[len(tag):])
    return found


def new_tag() -> str:
    return secrets.choice("ABCDEFGHJKLMNPQRSTUVWXYZ") + secrets.choice("abcdefghjkmnpqrstuvwxyz")


def assert_nothing_stamps_after(tag: str, arrived: int) -> None:
    for look in range(3):
        late = {thread: stamp for thread, stamp in stamps(tag).items() if stamp > arrived}
        assert not late, f"look {look}: threads of the run stamped after its reply arrived ({arrived}): {late}"
        time.sleep(0.1)  # checking that nothing happens: time must pass for a survivor to stamp again
    wait_until(lambda: not stamps(tag), 10, "every process of the run gone")


@pytest.mark.parametrize("ending", ["pass", "import os\nos._exit(0)"])
def test_no_process_of_a_cells_run_executes_after_its_reply(server: ServerHandle, ending: str) -> None:
    tag = new_tag()
    response = requests.post(server.url + "/run_jupyter", json={"cells": [stamping_run(tag, ending), "print('after')"],
                                                                  "total_timeout": 30}, timeout=60)
    arrived = time.monotonic_ns() // 1000 % 10**DIGITS
    assert response.status_code == 200, response.text
    # os._exit ends the run within its first cell, before the cell's record is sent
    shown = [cell["stdout"] for cell in response.json()["cells"]]
    assert shown == (["stamping\n", "after\n"] if ending == "pass" else []), response.json()
    assert_nothing_stamps_after(tag, arrived)


@contextlib.contextmanager
def busy(server: ServerHandle, runs: int) -> Iterator[None]:
    """`runs` runs sleeping in flight meanwhile: as many as this machine has CPUs leave none to spare,
    and a python run is then answered once the kernel reports its PID 1 gone (admission.py)."""
    with ThreadPoolExecutor(max(runs, 1)) as pool:
        sleepers = [pool.submit(run_code, server, "import time\ntime.sleep(8)", run_timeout=30) for _ in range(runs)]
        wait_until(lambda: requests.get(server.url + "/health", timeout=10).json()["in_flight"] >= runs, 30,
                   f"{runs} runs in flight")
        yield
        assert all(sleeper.result()["run_result"]["status"] == "Finished" for sleeper in sleepers)


@pytest.mark.parametrize("spare_cpu", [True, False])
@pytest.mark.parametrize("ending", ["pass", "raise SystemExit(4)"])
def test_no_process_of_a_run_executes_after_its_reply(server: ServerHandle, ending: str, spare_cpu: bool) -> None:
    tag = new_tag()
    with busy(server, 0 if spare_cpu else len(os.sched_getaffinity(0))):
        body = run_code(server, stamping_run(tag, ending), run_timeout=30)
        arrived = time.monotonic_ns() // 1000 % 10**DIGITS
        assert body["run_result"]["stdout"] == "stamping\n", body
        assert body["run_result"]["return_code"] == (4 if "4" in ending else 0), body
        assert_nothing_stamps_after(tag, arrived)


def test_a_threads_exit_under_way_is_the_verdict_of_a_run_answered_at_its_exit(server: ServerHandle) -> None:
    """A thread of PID 1 ends the run with 1 while the main thread asks for 0 (a red team's finding:
    the main thread's call was taken as the verdict while the kernel ended the run with 1).  A race:
    every round is one more chance for it."""
    code = THREAD_EXITS_FIRST % exits.SYSCALLS[os.uname().machine][1]
    for round_ in range(50):
        result = run_code(server, code, run_timeout=30)["run_result"]
        assert (result["status"], result["return_code"]) == ("Finished", 1), (round_, result)


def test_no_process_of_a_timed_out_run_executes_after_its_reply(server: ServerHandle) -> None:
    """The zygote's own kill (here at run_timeout) is answered once every process is killed.  The
    stampers pause a millisecond between stamps: busy, they would starve the run of CPU, and a
    starved run's time-out waits for its CPU time (docs/scheduling.md)."""
    tag = new_tag()
    body = run_code(server, stamping_run(tag, "import time\ntime.sleep(60)", pause=0.001), run_timeout=2)
    arrived = time.monotonic_ns() // 1000 % 10**DIGITS
    assert body["run_result"]["status"] == "TimeLimitExceeded" and body["run_result"]["stdout"] == "stamping\n", body
    assert_nothing_stamps_after(tag, arrived)


STAMPING_CPP = r"""
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>
#include <cstdio>
#include <ctime>
static void stamp() {
    char name[16];
    for (;;) {
        timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        unsigned long long micros = (now.tv_sec * 1000000ULL + now.tv_nsec / 1000) % 10000000000000ULL;
        snprintf(name, sizeof name, "TAG%013llu", micros);
        prctl(PR_SET_NAME, name);
    }
}
int main() {
    int ready[2];
    if (pipe(ready) != 0) return 2;
    for (int kind = 0; kind < 3; kind++) {
        if (fork() == 0) {
            if (kind > 0) setsid();
            if (kind == 2 && fork() != 0) _exit(0);  // a daemon: double-forked, its parent gone
            if (write(ready[1], "x", 1) != 1) _exit(1);
            stamp();
        }
    }
    char got[3];
    for (int seen = 0; seen < 3;) {
        ssize_t count = read(ready[0], got, 3 - seen);
        if (count > 0) seen += count;
    }
    puts("stamping");
    fflush(stdout);
    clock_t end = clock() + CLOCKS_PER_SEC / 3;  // a third of a second of this process's own CPU
    for (volatile unsigned long spin = 0; clock() < end;) spin++;
    return 3;
}
"""


def test_no_process_of_an_exec_run_executes_after_its_reply(server: ServerHandle) -> None:
    """An exec run is answered on its PID 1's record of the program's status and CPU time (PID 1
    runs no user code), every process of the run killed first."""
    tag = new_tag()
    body = run_code(server, STAMPING_CPP.replace("TAG", tag), language="cpp", compile_timeout=60, run_timeout=30)
    arrived = time.monotonic_ns() // 1000 % 10**DIGITS
    result = body["run_result"]
    assert result["stdout"] == "stamping\n" and result["return_code"] == 3, body
    # The program's own CPU (not its compile stage's, not what its stampers burn beside it).
    assert 0.3 <= result["cpu_time"] <= result["execution_time"] + 0.05, result
    assert_nothing_stamps_after(tag, arrived)


def test_no_process_of_a_session_executes_after_its_delete(server: ServerHandle) -> None:
    """DELETE /sessions answers once every process of the session is killed (its teardown after)."""
    tag = new_tag()
    created = requests.post(server.url + "/sessions", json={"language": "python"}, timeout=60).json()
    body = run_code(server, stamping_run(tag, "pass"), session_id=created["session_id"], run_timeout=30)
    assert body["run_result"]["stdout"] == "stamping\n", body
    ended = requests.delete(f"{server.url}/sessions/{created['session_id']}", timeout=30)
    arrived = time.monotonic_ns() // 1000 % 10**DIGITS
    assert ended.status_code == 200 and ended.json()["ended"], ended.text
    assert_nothing_stamps_after(tag, arrived)


def test_no_process_of_an_e2b_sandbox_executes_after_its_kill(server: ServerHandle) -> None:
    """The E2B SDK's `kill()` returns once every process of the sandbox is killed."""
    tag = new_tag()
    with e2b_environment(server, "e2b_" + "5" * 40):
        box = Sandbox.create(timeout=120)
        try:
            execution = box.run_code(stamping_run(tag, "pass"))
            assert execution.error is None and "".join(execution.logs.stdout) == "stamping\n", execution
        finally:
            box.kill()
        arrived = time.monotonic_ns() // 1000 % 10**DIGITS
    assert_nothing_stamps_after(tag, arrived)


def test_a_runs_cpu_time_and_exit_code_are_its_own(server: ServerHandle) -> None:
    """The CPU the run used (its own and that of a child it waited for) and its exit code."""
    code = ("import subprocess, sys, time\n"
            "end = time.process_time() + 0.3\n"
            "while time.process_time() < end:\n"
            "    pass\n"
            "subprocess.run([sys.executable, '-c', 'import time\\nend = time.process_time() + 0.3\\n"
            "while time.process_time() < end: pass'], check=True)\n"
            "sys.exit(7)\n")
    result = run_code(server, code, run_timeout=30)["run_result"]
    assert result["return_code"] == 7, result
    assert 0.55 <= result["cpu_time"] <= result["execution_time"] + 0.05, result


def test_the_server_keeps_answering_after_many_early_replies(server: ServerHandle) -> None:
    """Cells runs answered at their exit, collected after: nothing piles up (cgroups, networks, children)."""
    for index in range(40):
        response = requests.post(server.url + "/run_jupyter", json={"cells": [f"print({index})"]}, timeout=60)
        assert response.json()["cells"][0]["stdout"] == f"{index}\n", response.text
    session = requests.post(server.url + "/sessions", json={"language": "python"}, timeout=60)
    assert session.status_code == 201, session.text
    requests.delete(f"{server.url}/sessions/{session.json()['session_id']}", timeout=30)
