"""Bursts of slow code against a real `verl-sf serve` (issue #21), scaled to a small shared machine.

Every client here waits what verl's reward client waits (run_timeout + compile_timeout + 10 s) and
no longer: a reply that misses that deadline fails the test as it would cost a verl user a -1.
Counts and verdicts are asserted, never tight timings.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
import requests
import sandbox_fusion
from verl.utils.reward_score.sandbox_fusion.utils import check_correctness

from tests.host_view import cpu_seconds, named, zygotes
from tests.server_fixtures import ServerHandle, run_code, start_server, stop_server
from tests.waiting import wait_until
from verl_sf.models import RunCodeResponse
from verl_sf.tools import reply

LOOP = "while True:\n    pass\n"
SHORT = "print(6 * 7)"
# About 0.3 s of CPU on any machine: the run counts its own CPU time (a forked run starts at zero).
MEDIUM = "import time\nwhile time.process_time() < 0.3:\n    pass\nprint('ok')\n"
# Threads that spin with the GIL released: the main thread waits for a CPU behind its own threads.
THREADS = ("import threading, hashlib\nb = b'x' * (1 << 24)\ndef spin():\n    while True:\n        hashlib.sha256(b).digest()\n"
           "for _ in range(15):\n    threading.Thread(target=spin, daemon=True).start()\nspin()\n")
# A spinning parent whose spinning children exit, are reaped and are replaced: their CPU is the parent's.
RESPAWNS = ("import os, time\ndef spin(seconds):\n    until = time.time() + seconds\n    while time.time() < until:\n        pass\n"
            "live = 0\nwhile True:\n    while live < 16:\n        if os.fork() == 0:\n            spin(0.15)\n            os._exit(0)\n"
            "        live += 1\n    spin(0.05)\n    while live and os.waitpid(-1, os.WNOHANG)[0]:\n        live -= 1\n")
# The same with SIGCHLD ignored: the kernel reaps the children, and /proc keeps none of their CPU.
REAPED = ("import os, signal, time\nsignal.signal(signal.SIGCHLD, signal.SIG_IGN)\ndef spin(seconds):\n"
          "    until = time.time() + seconds\n    while time.time() < until:\n        pass\n"
          "while True:\n    for _ in range(16):\n        if os.fork() == 0:\n            spin(0.15)\n            os._exit(0)\n"
          "    spin(0.15)\n")
BOMB = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"


def client_deadline(body: dict[str, Any]) -> float:
    """What verl's reward client waits for one reply (Sandbox Fusion's defaults filled in)."""
    return body.get("run_timeout", 10) + body.get("compile_timeout", 10) + 10


async def post(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
    """(HTTP status, headers, JSON body); a reply later than the client's deadline raises TimeoutError."""
    async with session.post(url + "/run_code", json=body,
                            timeout=aiohttp.ClientTimeout(total=client_deadline(body))) as response:
        payload = await response.json(content_type=None)
        return response.status, dict(response.headers), payload


async def burst(url: str, bodies: list[dict[str, Any]]) -> list[tuple[int, dict[str, str], Any]]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        return await asyncio.gather(*(post(session, url, body) for body in bodies))


def metric(server: ServerHandle, name: str) -> float:
    for line in requests.get(server.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not on /metrics")


def health(server: ServerHandle) -> dict[str, Any]:
    return requests.get(server.url + "/health", timeout=10).json()


def processes_named(marker: str) -> list[int]:
    """Host pids whose command line holds `marker` (runs live in their own PID namespaces, but
    the host sees every process)."""
    listing = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True, check=True).stdout
    return [int(line.split(None, 1)[0]) for line in listing.splitlines() if marker in line]


@pytest.fixture(scope="module")
def two_slots() -> Iterator[ServerHandle]:
    """Two CPU slots (fewer than every burst below), the default slice, no heavy warm interpreters."""
    handle = start_server("--slots", "2", "--preload", "")
    yield handle
    stop_server(handle.process)


def loop_burst_answered_in_time(server: ServerHandle, count: int) -> list[dict[str, Any]]:
    """`count` loops at once, each client waiting verl's deadline (14 s here): every one must be
    answered TimeLimitExceeded (a late reply raises TimeoutError)."""
    bodies = [{"code": LOOP, "language": "python", "run_timeout": 2, "compile_timeout": 2} for _ in range(count)]
    results = asyncio.run(burst(server.url, bodies))
    assert [status for status, _, _ in results] == [200] * count
    for _, _, body in results:
        assert body["status"] == "Failed" and body["run_result"]["status"] == "TimeLimitExceeded", body
        assert body["run_result"]["cpu_time"] is not None and body["run_result"]["cpu_wait_time"] is not None
    return [body for _, _, body in results]


def test_a_loop_burst_larger_than_the_slots_is_all_answered_as_time_outs_in_time(two_slots: ServerHandle) -> None:
    bodies = loop_burst_answered_in_time(two_slots, 12)
    starved = [body for body in bodies if body["run_result"]["cpu_starved"]]
    assert metric(two_slots, "verl_sf_cpu_starved_timeouts_total") >= len(starved)
    # Every reply (the burst has 12, starved or not) reads in verl-sf's own tool as what it was: a starved
    # time-out as the server's fault, any other as the code's.
    assert len(bodies) == 12
    for body in bodies:
        response = RunCodeResponse.model_validate(body)
        starved_run = body["run_result"]["cpu_starved"]
        assert reply.status_of(response) == (reply.CallStatus.sandbox_error if starved_run else reply.CallStatus.timeout)
        text = reply.reply_text(response, 2, 1000)[0]
        assert text.startswith("Sandbox error:" if starved_run else "Execution timed out after 2 s"), text


def test_time_spent_waiting_for_a_slot_comes_off_the_time_left_before_the_clients_deadline() -> None:
    """Slots held 2 s each: the last of 10 loops waits ~8 s for one, and its CPU-wait extension
    must still end before its client's deadline, which counts from the request, not the slot."""
    server = start_server("--slots", "2", "--cpu-slice", "2", "--preload", "")
    try:
        loop_burst_answered_in_time(server, 10)
    finally:
        stop_server(server.process)


def test_a_sleep_burst_is_answered_at_its_run_timeout_not_at_the_end_of_the_sleeps(two_slots: ServerHandle) -> None:
    bodies = [{"code": "import time\ntime.sleep(60)\n", "language": "python", "run_timeout": 5} for _ in range(16)]
    started = time.monotonic()
    results = asyncio.run(burst(two_slots.url, bodies))  # each client gives up at 25 s
    assert time.monotonic() - started < 60
    for status, _, body in results:
        assert status == 200
        assert body["run_result"]["status"] == "TimeLimitExceeded", body
        assert not body["run_result"]["cpu_starved"], body  # a sleep's time-out is the code's own


def test_a_fork_bombs_time_out_is_its_own_not_a_starved_run(two_slots: ServerHandle) -> None:
    """Two fork bombs on two slots: each bomb's processes wait for a CPU most of the time, but between
    them they had a CPU's worth, so neither is credited that wait. Each ends near its run_timeout as
    the code's own time-out, not at the client's edge as a run the server starved (a sandbox error)."""
    bodies = [{"code": BOMB, "language": "python", "run_timeout": 3, "compile_timeout": 10} for _ in range(2)]
    results = asyncio.run(burst(two_slots.url, bodies))
    for status, _, body in results:
        assert status == 200 and body["run_result"]["status"] == "TimeLimitExceeded", body
        assert not body["run_result"]["cpu_starved"], body
        # Its hard deadline is 20.5 s (the client's 23 s less the reply margin): far from it.
        assert body["run_result"]["execution_time"] < 15, body


@pytest.mark.parametrize("code", [THREADS, RESPAWNS, REAPED], ids=["threads", "respawned-children", "reaped-children"])
def test_a_run_that_had_the_cpu_gets_no_credit_for_its_own_processes_waits(two_slots: ServerHandle, code: str) -> None:
    """Red team, 2026-11-28: the CPU a run used is every thread's and every reaped child's, so a run
    whose main thread waits behind its own threads, or whose spinning children come and go, had a
    CPU's worth and is answered at about its run_timeout, not at its hard limit as a starved run.
    Children the kernel reaps leave nothing in /proc: the run's cgroup counts them (cpuacct.usage)."""
    assert health(two_slots)["limits"]["cpu"].endswith("of CPU"), health(two_slots)
    body = {"code": code, "language": "python", "run_timeout": 2, "compile_timeout": 1}
    [(status, _, reply)] = asyncio.run(burst(two_slots.url, [body]))
    assert status == 200 and reply["run_result"]["status"] == "TimeLimitExceeded", reply
    assert not reply["run_result"]["cpu_starved"], reply
    # Its hard limit is 10.5 s (the client's 13 s less the reply margin): it got there before.
    assert reply["run_result"]["execution_time"] < 6, reply
    # Credited at most the time its processes were off a CPU between them: well under half of its time.
    assert reply["run_result"]["cpu_wait_time"] < reply["run_result"]["execution_time"] / 2, reply


def test_a_short_run_is_answered_while_every_slot_is_busy_with_loops(two_slots: ServerHandle) -> None:
    async def scenario() -> tuple[dict[str, Any], int]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            loops = [asyncio.ensure_future(post(session, two_slots.url,
                                                {"code": LOOP, "language": "python", "run_timeout": 8}))
                     for _ in range(6)]
            await asyncio.to_thread(wait_until, lambda: health(two_slots)["in_flight"] == 6, 30, "the loops to start")
            _, _, short = await post(session, two_slots.url, {"code": SHORT, "language": "python"})
            loops_done = sum(loop.done() for loop in loops)
            for status, _, body in await asyncio.gather(*loops):
                assert status == 200 and body["run_result"]["status"] == "TimeLimitExceeded"
            return short, loops_done

    short, loops_done_before = asyncio.run(scenario())
    assert short["status"] == "Success" and short["run_result"]["stdout"] == "42\n", short
    assert loops_done_before == 0  # it did not wait for the loops' time-outs


# Its own nice after sleeping past its first slice, then once it has spun a slice of CPU (0 or 19: demoted).
NICE_AFTER = ("import os, time\ntime.sleep(0.6)\nidle = os.getpriority(os.PRIO_PROCESS, 0)\n"
              "while time.process_time() < 0.3:\n    pass\nuntil = time.monotonic() + 8\n"
              "while os.getpriority(os.PRIO_PROCESS, 0) != 19 and time.monotonic() < until:\n    time.sleep(0.05)\n"
              "print(idle, os.getpriority(os.PRIO_PROCESS, 0))\n")


def test_a_run_is_demoted_for_the_cpu_it_used_never_for_the_time_it_waited(two_slots: ServerHandle) -> None:
    """A fresh CI machine, 2026-11-29: in a batch of 256 verl-tool turns, the first runs had not had a
    slice of CPU by the end of their first slice of wall time (the batch's start kept the machine
    busy); demoted then, they waited behind every fresh run of the batch until their client's deadline
    and were answered as starved.  A run that outlives its slice without using it (waiting for a CPU,
    or asleep, as here) keeps its priority; once it has spun a slice of CPU it is demoted."""
    assert health(two_slots)["limits"]["cpu"].endswith("of CPU"), health(two_slots)  # counted whole: cpuacct
    result = run_code(two_slots, NICE_AFTER, run_timeout=15)
    assert result["status"] == "Success", result
    assert result["run_result"]["stdout"] == "0 19\n", result


# 240 threads, or 200 processes, asleep (a run's pids cap is a little more), next to no CPU: a run
# long, never demoted.
SLEEPING_THREADS = ("import threading, time\nevent = threading.Event()\nfor _ in range(240):\n"
                    "    threading.Thread(target=event.wait, daemon=True).start()\ntime.sleep(60)\n")
SLEEPING_PROCESSES = ("import os, time\nfor _ in range(200):\n    if os.fork() == 0:\n        break\n"
                      "time.sleep(60)\n")


@pytest.mark.parametrize("code, most", [(SLEEPING_THREADS, 0.3), (SLEEPING_PROCESSES, 0.8)],
                         ids=["threads", "processes"])
def test_runs_of_many_sleeping_tasks_cost_the_sandbox_little_to_watch(two_slots: ServerHandle, code: str,
                                                                      most: float) -> None:
    """Red teams, 2026-11-29: the zygote sampled each run past its first slice after every one of its
    events, reading every thread's schedstat: 16 runs of 240 sleeping threads took 0.6 CPUs of the
    zygotes' (outside any run's group) by themselves, 1.4 beside a stream of short runs, whose p50
    went from 0.09 to 1.5 s; once that was mended, 16 runs of 255 sleeping processes took 1.2-1.3.
    A run is now sampled once a tick: its group's count, its processes as the group lists them, and
    the waits of a bounded few (0.05 and 0.18 CPUs here)."""
    short = {"code": SHORT, "language": "python", "run_timeout": 5}

    async def stream(session: aiohttp.ClientSession, pids: list[int]) -> float:
        """The zygotes' CPU seconds over 40 short runs, 4 at a time."""
        before = cpu_seconds(pids)
        for _ in range(10):
            await asyncio.gather(*(post(session, two_slots.url, short) for _ in range(4)))
        return cpu_seconds(pids) - before

    async def scenario() -> tuple[float, float, float, list[Any]]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            await stream(session, [])  # the zygotes started and warm
            pids = zygotes(two_slots.process.pid)
            alone = await stream(session, pids)
            sleepers = [asyncio.ensure_future(post(session, two_slots.url, {"code": code, "language": "python",
                                                                           "run_timeout": 6}))
                        for _ in range(16)]
            await asyncio.to_thread(wait_until, lambda: health(two_slots)["in_flight"] == 16, 30, "the sleepers")
            await asyncio.sleep(1)  # each past its first slice, its threads or processes started
            before = cpu_seconds(pids)
            await asyncio.sleep(2)
            idle = cpu_seconds(pids) - before
            beside = await stream(session, pids)
            return alone, idle, beside, await asyncio.gather(*sleepers)

    alone, idle, beside, sleepers = asyncio.run(scenario())
    assert all(body["run_result"]["status"] == "TimeLimitExceeded" for _, _, body in sleepers), sleepers
    assert idle < most, idle  # CPU seconds of the zygotes in 2 s of watching the 16 runs
    assert beside < 2 * alone + 0.2, (alone, beside)


def test_the_medium_case_more_runs_than_cores_needing_some_cpu_each_all_succeed(two_slots: ServerHandle) -> None:
    """Correct programs that need ~0.3 s of CPU each, 24 in flight on this machine's cores: waiting
    for the CPU never turns one into a time-out."""
    bodies = [{"code": MEDIUM, "language": "python", "run_timeout": 10} for _ in range(24)]
    results = asyncio.run(burst(two_slots.url, bodies))
    verdicts = [(status, body["status"], body["run_result"]["status"]) for status, _, body in results]
    assert verdicts == [(200, "Success", "Finished")] * 24, [b for _, _, b in results if b["status"] != "Success"]
    assert all(body["run_result"]["stdout"] == "ok\n" for _, _, body in results)


# Named from the host's view (/proc/<pid>/comm), so the test can read the CPU they get meanwhile.
SPINNERS = ("import ctypes, os\nctypes.CDLL(None).prctl(15, b'spinners', 0, 0, 0)\nfor _ in range(150):\n"
            "    if os.fork() == 0:\n        break\nwhile True:\n    pass\n")
# Spins for 2 s of wall time and says how much CPU it got meanwhile.
CPU_SHARE = "import time\nstart = time.monotonic()\nwhile time.monotonic() - start < 2:\n    pass\nprint(time.process_time())\n"


def cpu_shares(server: ServerHandle, beside: str) -> tuple[float, float]:
    """CPU a one-process run gets per second of wall time, and what the host's processes named
    `beside` get per second meanwhile: both share the machine with whatever else runs on it (the
    check's other worker), so their ratio says how the kernel weighs them against each other."""
    pids = named(beside)
    assert pids, f"no process named {beside}"
    before, started = cpu_seconds(pids), time.monotonic()
    result = run_code(server, CPU_SHARE)
    theirs = (cpu_seconds(pids) - before) / (time.monotonic() - started)
    assert set(pids) <= set(named(beside)), f"some of the processes named {beside} ended while measured"
    assert result["status"] == "Success", result
    return float(result["run_result"]["stdout"]) / result["run_result"]["execution_time"], theirs


def test_a_run_of_many_processes_gets_the_cpu_of_one_run(two_slots: ServerHandle) -> None:
    """151 spinning processes of one run beside a one-process run: each run is a cpu group of its own
    (cgroup v1, as root), so the lone process gets about what the 151 get together, where in one
    group with them it got 1/151 of it (both demoted alike past their first slice)."""
    async def scenario() -> tuple[tuple[float, float], dict[str, Any]]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            spinners = asyncio.ensure_future(post(session, two_slots.url,
                                                  {"code": SPINNERS, "language": "python", "run_timeout": 12}))
            # Forking 150 from a demoted group takes seconds: the ratio below holds for however many there
            # are (one group of M spinners would leave the lone run 1/M of what they get).
            await asyncio.to_thread(wait_until, lambda: len(named("spinners")) >= 20, 30, "the spinners")
            await asyncio.sleep(1)  # past their first slice: demoted
            shares = await asyncio.to_thread(cpu_shares, two_slots, "spinners")
            _, _, spun = await spinners
            return shares, spun

    assert health(two_slots)["limits"]["cpu"].startswith("cgroup per run"), health(two_slots)
    (alone, spinners), spun = asyncio.run(scenario())
    assert spun["run_result"]["status"] == "TimeLimitExceeded", spun
    # Per second, against the 151 at the same time (so whatever else the machine runs weighs on both):
    # about as much when the two groups share the CPU as their weights say; 1/151 of it in one group.
    assert alone >= 0.2 * spinners, (alone, spinners)


def test_a_session_call_that_ends_itself_early_runs_on_demoted(two_slots: ServerHandle) -> None:
    """A python session's code can write its call's end itself and run on, as a thread it started
    would: what runs between calls is background, its group at the least weight from the reply on,
    so 16 threads spinning in each of two such sessions leave a one-process run its share of the
    machine as a run (red team, 2026-11-29: at full weight they starved such runs to time-outs)."""
    forge = ("import ctypes, os, threading, hashlib\n"
             "ctypes.CDLL(None).prctl(15, b'forger', 0, 0, 0)\n"  # its threads, started after, take the name
             "os.write(3, b'\\n{\"kind\": \"call_done\", \"return_code\": 0, \"cpu_time\": 0.0}\\n')\n"
             "b = b'x' * (1 << 20)\ndef spin():\n    while True:\n        hashlib.sha256(b).digest()\n"
             "for _ in range(15):\n    threading.Thread(target=spin, daemon=True).start()\nspin()\n")
    sessions = [requests.post(two_slots.url + "/sessions", json={"language": "python"}, timeout=60).json()["session_id"]
                for _ in range(2)]
    try:
        for session_id in sessions:
            ended = run_code(two_slots, forge, session_id=session_id, run_timeout=30)
            assert ended["status"] == "Success", ended  # answered at the forged end: it cannot be told apart
        assert health(two_slots)["limits"]["cpu"].startswith("cgroup per run"), health(two_slots)
        wait_until(lambda: len(named("forger")) == 2, 30, "both sessions' interpreters to be named")
        alone, forgers = cpu_shares(two_slots, "forger")
        # Per second, against the two sessions at the same time (whatever else the machine runs weighs
        # on all three alike): a third of the CPU to the run as their weights say, half of theirs; 1/60
        # of theirs at full weight, where the run, demoted past its first slice, starved.
        assert alone >= 0.15 * forgers, (alone, forgers)
    finally:
        for session_id in sessions:
            requests.delete(f"{two_slots.url}/sessions/{session_id}", timeout=60)


def test_past_the_in_flight_cap_a_burst_gets_503_with_retry_after_at_once() -> None:
    server = start_server("--slots", "1", "--max-in-flight", "4", "--preload", "")
    try:
        async def scenario() -> list[tuple[int, dict[str, str], Any, float]]:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
                started = time.monotonic()

                async def timed(body: dict[str, Any]) -> tuple[int, dict[str, str], Any, float]:
                    status, headers, payload = await post(session, server.url, body)
                    return status, headers, payload, time.monotonic() - started

                body = {"code": LOOP, "language": "python", "run_timeout": 3}
                admitted = [asyncio.ensure_future(timed(body)) for _ in range(4)]
                await asyncio.to_thread(wait_until, lambda: health(server)["in_flight"] == 4, 30, "the cap to fill")
                refused = await asyncio.gather(*(timed(body) for _ in range(6)))
                return [*await asyncio.gather(*admitted), *refused]

        results = asyncio.run(scenario())
        admitted = [r for r in results if r[0] == 200]
        refused = [r for r in results if r[0] == 503]
        assert len(admitted) == 4 and len(refused) == 6
        assert all(headers["Retry-After"] == "1" for _, headers, _, _ in refused)
        assert all("max_in_flight=4" in payload["detail"] for _, _, payload, _ in refused)
        assert all(payload["run_result"]["status"] == "TimeLimitExceeded" for _, _, payload, _ in admitted)
        assert max(t for *_, t in refused) < min(t for *_, t in admitted)  # refused at once, not after a wait
        assert run_code(server, SHORT)["run_result"]["stdout"] == "42\n"
    finally:
        stop_server(server.process)


async def _send_and_hang_up(url: str, body: dict[str, Any]) -> asyncio.StreamWriter:
    """Send one /run_code request on a raw connection and return without reading the reply;
    closing the writer is the client disconnecting."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    _, writer = await asyncio.open_connection(host, int(port))
    data = json.dumps(body).encode()
    writer.write(b"POST /run_code HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                 % (host.encode(), len(data), data))
    await writer.drain()
    return writer


def _execs_as(marker: str) -> str:
    """Code whose process, once running, shows `marker` in `ps` (and sleeps: it holds its slot by wall time)."""
    return f"import os\nos.execv('/bin/sleep', ['{marker}', '9999'])\n"


def test_a_disconnected_clients_running_run_is_killed_and_its_queued_run_never_starts() -> None:
    """One slot held for 30 s by whichever run has it: the second run queues behind the first."""
    server = start_server("--slots", "1", "--cpu-slice", "30", "--preload", "")
    running, queued = f"verl-sf-running-{uuid.uuid4().hex[:8]}", f"verl-sf-queued-{uuid.uuid4().hex[:8]}"
    try:
        async def scenario() -> None:
            first = await _send_and_hang_up(server.url, {"code": _execs_as(running), "language": "python",
                                                         "run_timeout": 60})
            await asyncio.to_thread(wait_until, lambda: processes_named(running), 30, "the first run to start")
            second = await _send_and_hang_up(server.url, {"code": _execs_as(queued), "language": "python",
                                                          "run_timeout": 60})
            await asyncio.to_thread(wait_until, lambda: health(server)["queued"] == 1, 30, "the second run to queue")
            for writer in (first, second):
                writer.close()
                await writer.wait_closed()

        asyncio.run(scenario())
        wait_until(lambda: not processes_named(running), 15, "the abandoned running run to be killed")
        wait_until(lambda: metric(server, "verl_sf_runs_cancelled_total") == 2, 15,
                   "both runs (the queued one too) to count as cancelled")
        assert health(server)["in_flight"] == 0 and health(server)["queued"] == 0
        # The slot is free now: had the queued run not been dropped, it would start at once.
        reply_after = run_code(server, SHORT)
        assert reply_after["run_result"]["stdout"] == "42\n"
        assert not processes_named(queued)
    finally:
        stop_server(server.process)
    assert not processes_named(running) and not processes_named(queued)


def test_verls_reward_client_scores_a_batch_of_loops_as_time_outs_never_as_api_errors(two_slots: ServerHandle) -> None:
    """verl 0.9's own `check_correctness` (its 32 threads, its HTTP timeout, no retry on a read
    time-out): every case of a looping program is -3 (time-out), none -1 (API error)."""
    cases = 40
    in_outs = {"inputs": [f"{i}\n" for i in range(cases)], "outputs": [f"{i}\n" for i in range(cases)]}
    results, metadata = check_correctness(two_slots.url + "/run_code", in_outs, "import sys\n" + LOOP, timeout=3,
                                          memory_limit_mb=1024, language="python",
                                          concurrent_semaphore=threading.Semaphore(32))
    assert results.count(-1) == 0, [m for m in metadata if m.get("api_request_error")][:3]
    assert results == [-3] * cases


def _starved_reply(server: ServerHandle) -> dict[str, Any]:
    """A real reply carrying `cpu_wait_time` and `cpu_starved`: a loop among enough others to starve."""
    bodies = [{"code": LOOP, "language": "python", "run_timeout": 1, "compile_timeout": 1} for _ in range(10)]
    return asyncio.run(burst(server.url, bodies))[0][2]


def test_the_sandbox_fusion_client_and_verls_helpers_parse_the_new_fields(two_slots: ServerHandle) -> None:
    raw = _starved_reply(two_slots)
    assert {"cpu_time", "cpu_wait_time", "cpu_starved"} <= set(raw["run_result"]) and "session_id" in raw
    parsed = sandbox_fusion.RunCodeResponse(**raw)
    assert parsed.run_result is not None and parsed.run_result.status == sandbox_fusion.CommandRunStatus.TimeLimitExceeded

    # The PyPI client end to end: its request model, its HTTP call, its response model.
    answer = sandbox_fusion.run_code(sandbox_fusion.RunCodeRequest(code=SHORT, language="python"),
                                     endpoint=two_slots.url, max_attempts=1, client_timeout=30)
    assert answer.status == sandbox_fusion.RunStatus.Success and answer.run_result.stdout == "42\n"

    # A session call's reply carries session_id; the PyPI model still reads it.
    created = requests.post(two_slots.url + "/sessions", json={"language": "python"}, timeout=30).json()
    try:
        in_session = run_code(two_slots, "x = 6 * 7\nprint(x)", session_id=created["session_id"])
        assert in_session["session_id"] == created["session_id"]
        assert sandbox_fusion.RunCodeResponse(**in_session).run_result.stdout == "42\n"
    finally:
        requests.delete(f"{two_slots.url}/sessions/{created['session_id']}", timeout=30)

    # verl's helper reads a reply with the new fields (a short program: its verdict is exact).
    results, _ = check_correctness(two_slots.url + "/run_code", {"inputs": ["3\n"], "outputs": ["3\n"]},
                                   "print(input())", timeout=5, language="python")
    assert results == [True]


def test_a_burst_of_memory_hungry_runs_ends_those_runs_never_the_server() -> None:
    """Each run stays under its own cap, but together they ask for twice what the server gives all
    runs: some are killed for memory (and say so), the server and its warm interpreters live on."""
    server = start_server("--slots", "2", "--preload", "", "--runs-memory-mb", "1200")
    hog = "data = b'x' * (400 << 20)\nimport time\ntime.sleep(3)\nprint(len(data))\n"
    try:
        warm_before = health(server)["warm_interpreters"]
        results = asyncio.run(burst(server.url, [{"code": hog, "language": "python", "run_timeout": 20,
                                                  "memory_limit_MB": 500} for _ in range(6)]))
        assert [status for status, _, _ in results] == [200] * 6
        succeeded = [b for _, _, b in results if b["status"] == "Success"]
        # Six 400 MB runs under a 1200 MB cap: the kills are for the shared cap, and say so.
        killed = [b for _, _, b in results if "the runs and sessions of this server together reached its cap of "
                  "1200 MB (--runs-memory-mb); this run was within its own limit of 500 MB" in b["run_result"]["stderr"]]
        assert len(succeeded) + len(killed) == 6 and len(killed) >= 1, [b for _, _, b in results]
        assert all(b["status"] == "Failed" and b["run_result"]["status"] == "Finished" for b in killed)
        assert all(b["run_result"]["stdout"] == f"{400 << 20}\n" for b in succeeded)
        assert server.process.poll() is None and health(server)["warm_interpreters"] == warm_before
        assert run_code(server, SHORT)["run_result"]["stdout"] == "42\n"
    finally:
        stop_server(server.process)
