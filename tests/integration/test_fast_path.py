"""The warm-interpreter fast path behaves exactly like `python main.py` (the slow path)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests

from tests.server_fixtures import ServerHandle, run_code, start_server, stop_server

CASES = {
    "success": ("import sys\nprint('out'); print('err', file=sys.stderr)", {}),
    "exception": ("def f():\n    return 1 / 0\nf()", {}),
    "exit_code": ("import sys; sys.exit(7)", {}),
    "stdin": ("print(input()[::-1])", {"stdin": "abc\n"}),
    "timeout_partial_output": ("import time\nprint('before', flush=True)\ntime.sleep(30)", {"run_timeout": 1}),
    "memory_cap": ("x = bytearray(300 << 20)\nprint('survived')", {"memory_limit_MB": 64}),
    "output_cap": ("import sys\nsys.stdout.write('z' * (3 << 20))", {}),
    "numpy": ("import numpy as np\nprint(np.arange(10).sum())", {}),
    "sigpipe_ignored": ("import signal\nprint(signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN)", {}),
    "argv_and_file": ("import sys, os\nprint(sys.argv[0], __file__ == sys.argv[0], os.getcwd())", {}),
    # The interpreter's exit waits for non-daemon threads; the fast path's run must too.
    "non_daemon_thread": ("import threading, time\ndef late():\n    time.sleep(0.3)\n    print('thread done')\n"
                          "threading.Thread(target=late).start()\nprint('main done')", {}),
    # numpy's interpreter loads numpy.random without the real `threading` (see zygote.py); a run
    # still gets the whole module, and numpy's generator locks work across threads.
    "numpy_threads": ("import numpy as np, threading\nfrom concurrent.futures import ThreadPoolExecutor\n"
                      "with ThreadPoolExecutor(4) as pool:\n"
                      "    print(sum(pool.map(lambda s: int(np.random.default_rng(s).integers(100)), range(8))))\n"
                      "print(threading.main_thread() is threading.current_thread(), threading.active_count(),\n"
                      "      type(np.random.default_rng(0).bit_generator.lock).__name__, threading.__name__)", {}),
}

# Generators seeded at import (the stdlib's, numpy's global one, sympy's own): a fresh
# `python main.py` draws new numbers every time, so every run of the fast path must too.
FRESH_RANDOMNESS = {
    "random": "import random\nprint(random.getrandbits(64))",
    "numpy_legacy_global": "import numpy as np\nprint(np.random.randint(1 << 62), np.random.rand())",
    "numpy_generator": "import numpy as np\nprint(np.random.default_rng().integers(1 << 62))",
    "sympy": "import sympy\nprint(sympy.randprime(1, 10**15))",
}


@pytest.fixture(scope="module")
def slow_server() -> Iterator[ServerHandle]:
    server = start_server("--no-fast-path", "--slots", "2")
    yield server
    stop_server(server.process)


def comparable(body: dict) -> dict:
    run = body["run_result"]
    return {"status": body["status"], "run_status": run["status"], "return_code": run["return_code"],
            "stdout": run["stdout"], "stderr": run["stderr"].replace("\n[verl-sf: killed", "[killed"),
            "truncated": body["truncated"]}


def test_slow_server_reports_no_fast_path(slow_server: ServerHandle) -> None:
    assert requests.get(slow_server.url + "/health").json()["fast_path"] is False


@pytest.mark.parametrize("case", sorted(CASES))
def test_fast_path_matches_slow_path(sf_server: ServerHandle, slow_server: ServerHandle, case: str) -> None:
    code, fields = CASES[case]
    fast = comparable(run_code(sf_server, code, **fields))
    slow = comparable(run_code(slow_server, code, **fields))
    if case == "memory_cap":
        # Killed by the cgroup in both; the exact point of death (partial output) may differ.
        assert fast["return_code"] == slow["return_code"] == -9
        assert "memory limit of 64 MB" in fast["stderr"] and "memory limit of 64 MB" in slow["stderr"]
        assert "survived" not in fast["stdout"] + slow["stdout"]
        return
    assert fast == slow


@pytest.mark.parametrize("case", sorted(FRESH_RANDOMNESS))
def test_every_run_draws_fresh_random_numbers(sf_server: ServerHandle, case: str) -> None:
    outputs = []
    for _ in range(3):
        body = run_code(sf_server, FRESH_RANDOMNESS[case])
        assert body["status"] == "Success", body
        outputs.append(body["run_result"]["stdout"])
    assert len(set(outputs)) == 3, outputs
