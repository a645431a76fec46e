"""Requests past a MiB (parsed, checked and sent to the sandbox off the event loop) are answered as
small ones are: the run gets every byte, and a bad one gets the same typed error."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from tests.server_fixtures import ServerHandle, run_code

LARGE = 3 << 20  # bytes, past OFF_LOOP_BYTES (verl_sf/off_loop.py) once base64'd
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "benchmark_large_body.py"


def _post(server: ServerHandle, data: bytes) -> requests.Response:
    return requests.post(server.run_code_url, data=data, headers={"Content-Type": "application/json"}, timeout=60)


def test_a_large_file_and_stdin_reach_the_run_whole(sf_server: ServerHandle) -> None:
    blob = bytes(range(256)) * (LARGE // 256)
    code = ("import hashlib, sys\ndata = sys.stdin.read()\n"
            "print(hashlib.sha256(open('/tmp/blob.bin', 'rb').read()).hexdigest(), len(data), data[-3:])")
    body = run_code(sf_server, code, files={"/tmp/blob.bin": base64.b64encode(blob).decode()},
                    stdin="x" * LARGE + "end", run_timeout=30)
    assert body["status"] == "Success", body
    assert body["run_result"]["stdout"] == f"{hashlib.sha256(blob).hexdigest()} {LARGE + 3} end\n"


def test_a_large_body_of_escapes_and_any_text_reaches_the_run_as_json_loads_reads_it(sf_server: ServerHandle) -> None:
    """The server decodes a large body's long strings a piece at a time: escapes (surrogate pairs among
    them), raw UTF-8 and short strings beside them come out as the whole body's `json.loads` has them."""
    text = ("a\"\\/\n\t\u2028é😀\x7f" * (LARGE // 40))[:LARGE // 4]
    request = {"language": "python", "code": f"import sys, hashlib\nt = {text!r}\n"
               "s = sys.stdin.read()\nprint(hashlib.sha256((t + s).encode()).hexdigest(), len(s))",
               "stdin": "é😀" * (LARGE // 8), "run_timeout": 30}
    expected = f"{hashlib.sha256((text + request['stdin']).encode()).hexdigest()} {len(request['stdin'])}\n"
    for raw in (json.dumps(request).encode(), json.dumps(request, ensure_ascii=False, indent=2).encode(),
                re.sub(rb"\\u([0-9a-f]{4})", lambda escape: b"\\u" + escape.group(1).upper(), json.dumps(request).encode())):
        assert len(raw) > 1 << 20
        answer = _post(sf_server, raw)
        assert answer.status_code == 200 and answer.json()["run_result"]["stdout"] == expected, answer.text[:300]


def test_a_large_answer_carries_its_fetched_file_and_output_whole(sf_server: ServerHandle) -> None:
    """An answer of tens of MB (a fetched file, a full output) is encoded a piece at a time: what the
    client reads is what the run wrote."""
    code = ("import os\nblob = bytes(range(256)) * (3 << 12)\nopen('/tmp/out.bin', 'wb').write(blob * 8)\n"
            "print('é😀\"\\\\' * ((1 << 17) - 1))")
    body = run_code(sf_server, code, fetch_files=["/tmp/out.bin"], run_timeout=30)
    assert body["status"] == "Success", str(body)[:300]
    assert base64.b64decode(body["files"]["/tmp/out.bin"]) == bytes(range(256)) * (3 << 15)
    assert body["run_result"]["stdout"].startswith('é😀"\\é😀') and body["run_result"]["stdout"].endswith("\\\n")


def test_a_large_session_call_reaches_its_session_whole(sf_server: ServerHandle) -> None:
    session = requests.post(sf_server.url + "/sessions", json={"language": "python"}, timeout=30).json()["session_id"]
    try:
        for _ in range(2):  # the session lives on after a large call
            body = run_code(sf_server, "import sys\nprint(len(sys.stdin.read()))", session_id=session,
                            stdin="y" * LARGE)
            assert body["status"] == "Success" and body["run_result"]["stdout"] == f"{LARGE}\n", body
    finally:
        requests.delete(f"{sf_server.url}/sessions/{session}", timeout=30)


def test_a_large_bad_body_gets_the_error_a_small_one_gets(sf_server: ServerHandle) -> None:
    padding = "a" * LARGE
    not_json = _post(sf_server, b'{"code": "' + padding.encode() + b'"')
    assert not_json.status_code == 400 and "not valid JSON" in not_json.json()["detail"], not_json.text[:300]
    not_object = _post(sf_server, json.dumps([padding]).encode())
    assert not_object.status_code == 422 and "must be a JSON object" in not_object.text, not_object.text[:300]
    not_base64 = _post(sf_server, json.dumps({"code": "print('never')", "language": "python",
                                              "files": {"in.txt": padding + "!"}}).encode())
    assert not_base64.status_code == 422 and not_base64.json()["field"] == "files", not_base64.text[:300]
    assert "'in.txt': its content is not base64" in not_base64.text
    lone = _post(sf_server, json.dumps({"code": padding + "\ud800", "language": "python"}).encode())
    assert lone.status_code == 422 and lone.json()["field"] == "code", lone.text[:300]
    assert run_code(sf_server, "print('still serving')")["run_result"]["stdout"] == "still serving\n"


@pytest.mark.parametrize("into", ["files", "code", "stdin"])
def test_the_large_body_benchmark_measures_the_pings_around_a_large_run(sf_server: ServerHandle, tmp_path: Path,
                                                                       into: str) -> None:
    output = tmp_path / "large.json"
    result = subprocess.run([sys.executable, str(SCRIPT), "--url", sf_server.url, "--mb", "2", "--rounds", "1",
                             "--into", into, "--output", str(output)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    written = json.loads(output.read_text())
    assert written["into"] == into
    (measured,) = written["rounds"]
    assert measured["pings"] > 0 and measured["ping_max_ms"] >= measured["ping_p50_ms"] > 0
    assert measured["large_ms"] > 0 and "pings meanwhile" in result.stdout


def test_the_large_body_benchmark_sends_a_gzip_bomb_and_pings_are_answered_beside_it(sf_server: ServerHandle,
                                                                                       tmp_path: Path) -> None:
    """70 MiB of code in ~70 KB of gzip, past the server's 64 MiB: a 413, and pings answered while it is
    inflated (none were, when aiohttp inflated it on the event loop)."""
    output = tmp_path / "bomb.json"
    result = subprocess.run([sys.executable, str(SCRIPT), "--url", sf_server.url, "--mb", "70", "--rounds", "1",
                             "--into", "code", "--gzip", "--output", str(output)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    written = json.loads(output.read_text())
    (measured,) = written["rounds"]
    assert written["gzip"] and measured["answer"] == 413, written
    assert measured["pings"] > 0 and "answered 413" in result.stdout, result.stdout


def test_a_large_e2b_execution_runs_and_a_large_bad_body_is_refused(sf_server: ServerHandle) -> None:
    key = {"X-API-Key": "large-bodies"}
    created = requests.post(sf_server.url + "/v2/sandboxes", json={"templateID": "code-interpreter-v1", "timeout": 60},
                            headers=key, timeout=60)
    assert created.status_code == 201, created.text
    sandbox = {"E2b-Sandbox-Id": created.json()["sandboxID"], "E2b-Sandbox-Port": "49999",
               "X-Access-Token": created.json()["envdAccessToken"]}
    try:
        code = f"text = {'z' * LARGE!r}\nprint(len(text))"
        ran = requests.post(sf_server.url + "/execute", json={"code": code}, headers=sandbox, timeout=60)
        events = [json.loads(line) for line in ran.text.splitlines()]
        assert ran.status_code == 200, ran.text[:300]
        assert [e["text"] for e in events if e["type"] == "stdout"] == [f"{LARGE}\n"], events
        broken = requests.post(sf_server.url + "/execute", data=b'{"code": "' + b"a" * LARGE, headers=sandbox,
                               timeout=60)
        assert broken.status_code == 400 and "request body is not valid JSON" in broken.text, broken.text[:300]
    finally:
        requests.delete(f"{sf_server.url}/sandboxes/{sandbox['E2b-Sandbox-Id']}", headers=key, timeout=60)
