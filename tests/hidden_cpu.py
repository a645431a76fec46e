"""What runs on past its turn is demoted, on every rung and account: a run that spends its CPU where
/proc does not count it, and what a session's call leaves running after its reply."""

from __future__ import annotations

import requests

from tests.server_fixtures import ServerHandle, run_code

# Spends its CPU in a chain of processes the kernel reaps (SIGCHLD ignored, which they inherit): each
# spins 30 ms of CPU, forks the next and exits, so /proc shows one or two of them at a time, and the
# parent, asleep.  Its nice once demoted, or after 3 s.
HIDDEN_CPU = ("import os, signal, time\nsignal.signal(signal.SIGCHLD, signal.SIG_IGN)\nif os.fork() == 0:\n"
              "    while True:\n        while time.process_time() < 0.03:\n            pass\n"
              "        if os.fork() != 0:\n            os._exit(0)\nuntil = time.monotonic() + 3\n"
              "while os.getpriority(os.PRIO_PROCESS, 0) != 19 and time.monotonic() < until:\n    time.sleep(0.05)\n"
              "print(os.getpriority(os.PRIO_PROCESS, 0), round(time.process_time(), 3))\n")


def hidden_cpu_is_demoted(server: ServerHandle) -> None:
    """Demoted for the CPU it used, a run must not keep its weight by using it where /proc does not
    count it (children of a parent that ignores SIGCHLD leave nothing in its counters): the run's
    cgroup counts it (cpuacct.usage), and where no cgroup does, a run is demoted for the time it lived."""
    result = run_code(server, HIDDEN_CPU, run_timeout=15)
    assert result["status"] == "Success", result
    nice, own_cpu = result["run_result"]["stdout"].split()
    assert nice == "19", result
    assert float(own_cpu) < 0.1, result  # the parent's own CPU stayed under a slice


# A child of the call's and an orphan its PID 1 took in, both asleep; their pids in the session's namespace.
LEFT_RUNNING = ("import os, subprocess, sys\nsleep = [sys.executable, '-c', 'import time; time.sleep(60)']\n"
                "child = subprocess.Popen(sleep).pid\nread, write = os.pipe()\nif os.fork() == 0:\n"
                "    orphan = os.fork()\n    if orphan == 0:\n        os.execv(sys.executable, sleep)\n"
                "    os.write(write, str(orphan).encode())\n    os._exit(0)\nos.wait()\n"
                "orphan = int(os.read(read, 16))\n")


def session_background_is_demoted(server: ServerHandle) -> None:
    """What a session's call leaves running goes to nice 19 with its reply, before the next call is
    read (a call that left nothing, its group holding the session's own processes only, is answered
    as before)."""
    session = requests.post(server.url + "/sessions", json={"language": "python"}, timeout=60).json()["session_id"]
    try:
        assert run_code(server, "x = 1", session_id=session)["status"] == "Success"
        assert run_code(server, LEFT_RUNNING, session_id=session)["status"] == "Success"
        nice = run_code(server, "print(os.getpriority(os.PRIO_PROCESS, child), os.getpriority(os.PRIO_PROCESS, orphan), x)",
                        session_id=session)
        assert nice["run_result"]["stdout"] == "19 19 1\n", nice
    finally:
        requests.delete(f"{server.url}/sessions/{session}", timeout=60)
