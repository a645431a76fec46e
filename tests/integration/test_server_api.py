"""The HTTP API against a real `verl-sf serve` on 127.0.0.1: shapes, status rules, bad input."""

from __future__ import annotations

import asyncio
import base64

import aiohttp
import pytest
import requests

from tests.server_fixtures import ServerHandle, run_code, start_server, stop_server


def test_ping_and_health(sf_server: ServerHandle) -> None:
    assert requests.get(sf_server.url + "/v1/ping").json() == "pong"
    health = requests.get(sf_server.url + "/health").json()
    assert health["isolation"] == "namespaces"
    assert health["cgroups"] == "on"
    assert {"python", "pytest", "bash", "cpp"} <= set(health["languages"])
    assert health["in_flight"] == 0 and health["queued"] == 0
    assert "numpy" in health["preloaded"]


def test_success_response_has_every_sandbox_fusion_field(sf_server: ServerHandle) -> None:
    body = run_code(sf_server, "print(2 + 2)")
    assert set(body) >= {"status", "message", "compile_result", "run_result", "executor_pod_name", "files"}
    assert body["status"] == "Success"
    assert body["compile_result"] is None
    run = body["run_result"]
    assert run["status"] == "Finished" and run["return_code"] == 0
    assert run["stdout"] == "4\n" and run["stderr"] == ""
    assert run["execution_time"] > 0
    assert body["queue_wait"] >= 0


def test_exception_is_failed_with_traceback(sf_server: ServerHandle) -> None:
    body = run_code(sf_server, "def f():\n    raise ValueError('boom')\nf()")
    assert body["status"] == "Failed"
    run = body["run_result"]
    assert run["status"] == "Finished" and run["return_code"] == 1
    assert 'File "/workdir/main.py", line 2, in f' in run["stderr"]
    assert run["stderr"].rstrip().endswith("ValueError: boom")
    assert "zygote" not in run["stderr"] and "<string>" not in run["stderr"]


def test_exit_codes(sf_server: ServerHandle) -> None:
    assert run_code(sf_server, "import sys; sys.exit(3)")["run_result"]["return_code"] == 3
    assert run_code(sf_server, "import sys; sys.exit(0)")["status"] == "Success"
    body = run_code(sf_server, "import sys; sys.exit('bye')")
    assert body["run_result"]["return_code"] == 1 and "bye" in body["run_result"]["stderr"]
    # As CPython exits: a status past a C long is -1 (255), never 0 (red team: `sys.exit(2**70)` passed).
    for status, code in (("2**70", 255), ("-2**70", 255), ("2**32 + 1", 1), ("256", 0), ("-1", 255)):
        body = run_code(sf_server, f"import sys; sys.exit({status})")
        assert body["run_result"]["return_code"] == code, (status, body)
    body = run_code(sf_server, "import sys\nsys.stdout = sys.stderr = None\nraise ValueError")
    assert body["run_result"]["return_code"] == 1 and body["run_result"]["stderr"] == "", body  # as CPython


def test_timeout_is_failed_with_partial_output(sf_server: ServerHandle) -> None:
    body = run_code(sf_server, "import time\nprint('started')\ntime.sleep(30)", run_timeout=1)
    assert body["status"] == "Failed"
    assert body["run_result"]["status"] == "TimeLimitExceeded"
    assert body["run_result"]["stdout"] == "started\n"
    assert 0.9 < body["run_result"]["execution_time"] < 10


def test_stdin_files_and_fetch_files(sf_server: ServerHandle) -> None:
    code = ("import sys\nname = sys.stdin.read().strip()\n"
            "data = open('data/in.txt').read()\n"
            "open('out.txt', 'w').write(data.upper() + name)\nprint('ok')")
    body = run_code(sf_server, code, stdin="bob\n",
                    files={"data/in.txt": base64.b64encode(b"hello ").decode()},
                    fetch_files=["out.txt", "missing.txt"])
    assert body["status"] == "Success", body
    assert base64.b64decode(body["files"]["out.txt"]) == b"HELLO bob"
    assert "missing.txt" not in body["files"]


def test_tabs_and_unicode_reach_the_run_unchanged(sf_server: ServerHandle) -> None:
    """The zygote's request line joins two JSON texts with a tab: tabs in the payload must survive."""
    stdin = "a\tb\n\tc \u00e9\u4e2d\U0001f600"
    body = run_code(sf_server, "import sys\nif True:\n\tdata = sys.stdin.read()\n\tprint(ascii(data))", stdin=stdin,
                    files={"t\tab.txt": base64.b64encode(b"x\ty").decode()}, fetch_files=["t\tab.txt"])
    assert body["status"] == "Success", body
    assert body["run_result"]["stdout"] == ascii(stdin) + "\n"
    assert base64.b64decode(body["files"]["t\tab.txt"]) == b"x\ty"


def test_request_files_belong_to_the_run_and_a_bad_one_is_refused(sf_server: ServerHandle) -> None:
    """The run writes its request's files itself, as its own user: it may change or delete them."""
    code = ("import os\nst = os.stat('deep/er/in.txt')\nprint(st.st_uid, os.stat('deep').st_uid)\n"
            "open('deep/er/in.txt', 'a').write('!')\nos.remove('deep/er/in.txt')\nprint('ok')")
    body = run_code(sf_server, code, files={"deep/er/in.txt": base64.b64encode(b"x").decode()})
    assert body["status"] == "Success", body
    assert body["run_result"]["stdout"] == "1000 1000\nok\n"
    # Never run as the code's own failure (red team): not base64, a directory's name, a file inside another.
    for files, says in (({"in.txt": "abc"}, "'in.txt': its content is not base64"), ({"in.txt": "!!!"}, "not base64"),
                        ({".": "YQ=="}, "names a directory"), ({"/workdir/": "YQ=="}, "names a directory"),
                        ({"x": "YQ==", "x/y": "YQ=="}, "is also a directory of"),
                        ({"a" * 256: "YQ=="}, "longer than Linux allows"), ({"a/" * 2100 + "x": "YQ=="}, "longer than")):
        bad = requests.post(sf_server.run_code_url, json={"code": "print('never')", "language": "python",
                                                          "files": files}, timeout=30)
        assert bad.status_code == 422 and bad.json()["field"] == "files" and says in bad.text, (files, bad.text)
    wrapped = base64.encodebytes(b"x" * 100).decode()  # MIME's line breaks, as some clients send
    assert run_code(sf_server, "print(len(open('w').read()))", files={"w": wrapped})["run_result"]["stdout"] == "100\n"


def test_fetch_files_does_not_follow_symlinks_out_of_the_workdir(sf_server: ServerHandle) -> None:
    body = run_code(sf_server, "import os; os.symlink('/etc/hostname', 'link.txt')", fetch_files=["link.txt"])
    assert body["status"] == "Success"
    assert body["files"] == {}


def test_output_is_drained_while_running(sf_server: ServerHandle) -> None:
    # Sandbox Fusion stalls past 128 KiB and reports a false time-out; we must not.
    body = run_code(sf_server, "import sys\nfor i in range(4000):\n    print('x' * 99)", run_timeout=20)
    assert body["status"] == "Success"
    assert len(body["run_result"]["stdout"]) == 4000 * 100
    assert body["truncated"] is False


def test_output_flood_is_capped_with_marker(sf_server: ServerHandle) -> None:
    body = run_code(sf_server, "while True:\n    print('y' * 1000)", run_timeout=2)
    assert body["run_result"]["status"] == "TimeLimitExceeded"
    stdout = body["run_result"]["stdout"]
    assert len(stdout) < (1 << 20) + 200
    assert "[verl-sf: output truncated" in stdout
    assert body["truncated"] is True


def test_invalid_utf8_output_gives_valid_json(sf_server: ServerHandle) -> None:
    body = run_code(sf_server, "import sys, os\nos.write(1, b'bad \\xff\\xfe bytes\\n')\nsys.stdout.write('after\\n')")
    assert body["status"] == "Success"
    assert body["run_result"]["stdout"] == "bad \ufffd\ufffd bytes\nafter\n"


def test_memory_limit_kills_and_reports(sf_server: ServerHandle) -> None:
    body = run_code(sf_server, "x = bytearray(600 << 20)\nprint('survived')", memory_limit_MB=128, run_timeout=20)
    assert body["status"] == "Failed"
    assert "survived" not in body["run_result"]["stdout"]
    assert body["run_result"]["return_code"] in (-9, 1)
    assert "memory limit of 128 MB" in body["run_result"]["stderr"] or "MemoryError" in body["run_result"]["stderr"]


def test_numpy_threads_work_under_a_memory_limit(sf_server: ServerHandle) -> None:
    # RLIMIT_AS (Sandbox Fusion) breaks OpenBLAS thread creation; a memory cgroup does not.
    code = ("import numpy as np, threading\na = np.random.rand(300, 300)\nprint((a @ a).shape)\n"
            "ts = [threading.Thread(target=lambda: (a @ a).sum()) for _ in range(8)]\n"
            "[t.start() for t in ts]; [t.join() for t in ts]\nprint('threads ok')")
    body = run_code(sf_server, code, memory_limit_MB=256)
    assert body["status"] == "Success", body
    assert body["run_result"]["stdout"] == "(300, 300)\nthreads ok\n"


def test_jupyter_cells_share_state_and_errors_do_not_stop_later_cells(sf_server: ServerHandle) -> None:
    cells = ["a = 123", "a", "print(a)", "import sys; sys.stderr.write('stderr message')",
             "raise RuntimeError('error message')", "a + 1"]
    body = requests.post(sf_server.url + "/run_jupyter", json={"cells": cells}).json()
    assert body["status"] == "Success"
    assert body["driver"]["status"] == "Finished"
    out = body["cells"]
    assert len(out) == 6
    assert out[1]["display"] == [{"text/plain": "123"}]
    assert out[2]["stdout"] == "123\n"
    assert out[3]["stderr"] == "stderr message"
    assert out[4]["error"][0]["ename"] == "RuntimeError" and out[4]["error"][0]["evalue"] == "error message"
    assert "<string>" not in "".join(out[4]["error"][0]["traceback"])
    assert out[5]["display"] == [{"text/plain": "124"}] and out[5]["error"] == []


def test_jupyter_cell_timeout_and_total_timeout_are_enforced(sf_server: ServerHandle) -> None:
    body = requests.post(sf_server.url + "/run_jupyter", json={
        "cells": ["import time", "time.sleep(10)", "print('next')"], "cell_timeout": 1, "total_timeout": 30}).json()
    assert body["status"] == "Success", body
    assert "cell_timeout" in body["cells"][1]["error"][0]["evalue"]
    assert body["cells"][2]["stdout"] == "next\n"
    assert body["driver"]["execution_time"] < 10

    body = requests.post(sf_server.url + "/run_jupyter", json={
        "cells": ["print('first')", "while True: pass", "print('never')"], "total_timeout": 1.5}).json()
    assert body["status"] == "Failed"
    assert body["driver"]["status"] == "TimeLimitExceeded"
    assert body["cells"][0]["stdout"] == "first\n"
    assert body["cells"][2]["error"][0]["ename"] == "TimeoutError"


def test_a_copy_a_cell_forks_runs_no_further_cells_of_the_kernel(sf_server: ServerHandle) -> None:
    """One result per cell sent, each the kernel's own: a forked copy ends as its cell does (red team 2026-11-27)."""
    # The kernel prints once its copy has ended: two processes printing at once may interleave their writes.
    cells = ["import os, time\npid = os.fork()\nif pid: os.waitpid(pid, 0)\nprint('forked', bool(pid))",
             "print('cell2 from', 'kernel' if pid else 'copy')", "print('cell3 from', 'kernel' if pid else 'copy')"]
    body = requests.post(sf_server.url + "/run_jupyter", json={"cells": cells}, timeout=60).json()
    assert body["status"] == "Success", body
    shown = [cell["stdout"] for cell in body["cells"]]
    assert len(shown) == 3 and sorted(shown[0].splitlines()) == ["forked False", "forked True"], shown
    assert shown[1:] == ["cell2 from kernel\n", "cell3 from kernel\n"], shown


def test_jupyter_files_round_trip(sf_server: ServerHandle) -> None:
    body = requests.post(sf_server.url + "/run_jupyter", json={
        "cells": ["t = open('in.txt').read()", "open('out.txt', 'w').write(t * 2)"],
        "files": {"in.txt": base64.b64encode(b"ab").decode()}, "fetch_files": ["out.txt"]}).json()
    assert base64.b64decode(body["files"]["out.txt"]) == b"abab"


@pytest.mark.parametrize("body, status, field", [
    ({"language": "python"}, 422, "code"),
    ({"code": "print(1)"}, 422, "language"),
    ({"code": "print(1)", "language": "cobol"}, 422, "language"),
    ({"code": 123, "language": "python"}, 422, "code"),
    ({"code": "print(1)", "language": "python", "run_timeout": -1}, 422, "run_timeout"),
    ({"code": "print(1)", "language": "python", "run_timeout": 1e9}, 422, "run_timeout"),
    ({"code": "print(1)", "language": "python", "compile_timeout": "soon"}, 422, "compile_timeout"),
    ({"code": "print(1)", "language": "python", "memory_limit_MB": 1}, 422, "memory_limit_MB"),
    ({"code": "print(1)", "language": "python", "files": ["a"]}, 422, "files"),
    ({"code": "print(1)", "language": "python", "files": {"../escape": ""}}, 422, "files"),
    ({"code": "print(1)", "language": "python", "fetch_files": "out.txt"}, 422, "fetch_files"),
])
def test_bad_requests_name_the_field(sf_server: ServerHandle, body: dict, status: int, field: str) -> None:
    response = requests.post(sf_server.run_code_url, json=body)
    assert response.status_code == status
    detail = response.json()["detail"]
    assert any(field in err["loc"] for err in detail), detail
    assert run_code(sf_server, "print('still serving')")["run_result"]["stdout"] == "still serving\n"


def test_malformed_json_and_non_object_bodies(sf_server: ServerHandle) -> None:
    response = requests.post(sf_server.run_code_url, data=b"{not json", headers={"Content-Type": "application/json"})
    assert response.status_code == 400 and "not valid JSON" in response.json()["detail"]
    response = requests.post(sf_server.run_code_url, json=[1, 2])
    assert response.status_code == 422
    response = requests.post(sf_server.url + "/run_jupyter", json={"cells": "print(1)"})
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["body", "cells"]
    assert run_code(sf_server, "print(1)")["status"] == "Success"


def test_oversized_body_gets_413(sf_server: ServerHandle) -> None:
    response = requests.post(sf_server.run_code_url, data=b"x" * (80 << 20), headers={"Content-Type": "application/json"})
    assert response.status_code == 413
    assert run_code(sf_server, "print(1)")["status"] == "Success"


def test_known_language_without_toolchain_names_what_is_missing(sf_server: ServerHandle) -> None:
    health = requests.get(sf_server.url + "/health").json()
    missing = sorted({"go", "php", "ruby", "lua", "julia", "swift"} - set(health["languages"]))
    assert missing, "test needs at least one language without a toolchain"
    body = run_code(sf_server, "x", language=missing[0])
    assert body["status"] == "SandboxError"
    assert f"language {missing[0]!r} needs" in body["message"] and "not installed" in body["message"]


async def test_200_concurrent_requests_each_get_their_own_output(sf_server: ServerHandle) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=200)) as session:
        async def one(i: int) -> tuple[int, dict]:
            async with session.post(sf_server.run_code_url, json={"code": f"print({i} * 7)", "language": "python"}) as r:
                assert r.status == 200
                return i, await r.json()

        results = await asyncio.gather(*(one(i) for i in range(200)))
    assert len(results) == 200
    for i, body in results:
        assert body["status"] == "Success", body
        assert body["run_result"]["stdout"] == f"{i * 7}\n"


def test_metrics_count_runs_and_rejections(sf_server: ServerHandle) -> None:
    run_code(sf_server, "print(1)")
    requests.post(sf_server.run_code_url, json={"language": "python"})
    text = requests.get(sf_server.url + "/metrics").text
    assert 'verl_sf_runs_total{endpoint="run_code",language="python",status="Success"}' in text
    assert 'verl_sf_rejections_total{reason="invalid"}' in text
    assert "verl_sf_request_duration_seconds_bucket" in text
    assert "verl_sf_queue_wait_seconds_count" in text
    assert "verl_sf_runs_in_flight 0.0" in text and "verl_sf_queue_depth 0.0" in text


async def test_past_the_in_flight_cap_answers_503_with_retry_after_and_recovers() -> None:
    server = start_server("--slots", "1", "--max-in-flight", "3", "--preload", "")
    try:
        async with aiohttp.ClientSession() as session:
            async def one() -> tuple[int, str | None]:
                async with session.post(server.run_code_url,
                                        json={"code": "import time; time.sleep(1)", "language": "python"}) as r:
                    return r.status, r.headers.get("Retry-After")

            results = await asyncio.gather(*(one() for _ in range(8)))
        statuses = sorted(s for s, _ in results)
        assert statuses.count(200) == 3  # the three admitted ones
        assert statuses.count(503) == 5
        assert all(ra == "1" for s, ra in results if s == 503)
        assert 'verl_sf_rejections_total{reason="overloaded"} 5.0' in requests.get(server.url + "/metrics").text
        assert run_code(server, "print('after')")["status"] == "Success"
    finally:
        stop_server(server.process)


def test_sleeping_runs_hold_no_slot_and_waiting_does_not_count_against_run_timeout() -> None:
    """One CPU slot and six runs that sleep 0.7 s each with run_timeout 2: each gives its slot up
    after its first slice, so all six sleep at once and none waits for the others."""
    server = start_server("--slots", "1", "--preload", "")
    try:
        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(run_code, server, "import time; time.sleep(0.7); print('done')", run_timeout=2)
                       for _ in range(6)]
            bodies = [f.result() for f in futures]
        assert all(b["status"] == "Success" for b in bodies), bodies
        assert max(b["queue_wait"] for b in bodies) < 2  # not FIFO behind five sleeps
    finally:
        stop_server(server.process)
