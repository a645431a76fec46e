"""The server against hostile HTTP clients (issue #25): headers and bodies that never finish, more
connections than the open-files limit, JSON nested without end, bodies too large or undecodable,
and verl-tool trajectory ids that another client could guess.

Every server here is a real `verl-sf serve` process; the slow clients are raw sockets, so the
test controls exactly which bytes arrive and when.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import resource
import select
import socket
import threading
import time
import uuid
import zlib
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
import requests

from tests.server_fixtures import SERVER_MODES, ServerHandle, run_code, server_in_mode, start_server, stop_server
from tests.waiting import wait_until
from verl_sf.json_body import MAX_JSON_TOKENS

MAX_DEPTH = 100  # the documented limit (docs/configuration.md)
JSON_ENDPOINTS = ["/run_code", "/run_jupyter", "/sessions", "/get_observation"]
SLOW_CLIENTS = 1100


@pytest.fixture(scope="module")
def strict_server() -> Iterator[ServerHandle]:
    """Short time-outs: 2 s for a header, 2 s for a body."""
    handle = start_server("--slots", "2", "--timeout-keep-alive", "2", "--timeout-body", "2")
    yield handle
    stop_server(handle.process)


@pytest.fixture(scope="module")
def fronts_server() -> Iterator[ServerHandle]:
    """Two fronts (session calls forwarded between them) and a 1 MB body limit."""
    handle = start_server("--slots", "2", "--fronts", "2", "--max-body-mb", "1")
    yield handle
    stop_server(handle.process)


def connect(server: ServerHandle, sent: bytes = b"") -> socket.socket:
    address = urlsplit(server.url)
    sock = socket.create_connection((address.hostname, address.port or 80), timeout=10)
    if sent:
        sock.sendall(sent)
    return sock


def read_until_closed(sock: socket.socket, within: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and when it closed (seconds
    from now); fails if it is still open after `within`."""
    started = time.monotonic()
    received = b""
    while time.monotonic() - started < within:
        if readable(sock, 0.1):
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return received, time.monotonic() - started
            received += chunk
    raise AssertionError(f"the server kept the connection open for {within:g} s (received {received[:200]!r})")


def read_response(sock: socket.socket, within: float) -> bytes:
    """One whole HTTP response (its header and Content-Length bytes of body), the connection left as it is."""
    sock.settimeout(within)
    received = b""
    while b"\r\n\r\n" not in received or len(received.split(b"\r\n\r\n", 1)[1]) < content_length(received):
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the connection before its answer was complete: {received[:200]!r}"
        received += chunk
    return received


def content_length(response: bytes) -> int:
    for line in response.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    raise AssertionError(f"no Content-Length in {response[:200]!r}")


def readable(sock: socket.socket, timeout_s: float) -> bool:
    """Data, EOF or a reset waits on `sock` (poll: these tests hold descriptors past select's 1024)."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(timeout_s * 1000))


def is_open(sock: socket.socket) -> bool:
    """Still connected: nothing to read (no EOF, no reset) right now."""
    if not readable(sock, 0):
        return True
    try:
        return bool(sock.recv(1, socket.MSG_PEEK))
    except ConnectionResetError:
        return False


def _tcp_queues() -> dict[tuple[int, int], tuple[int, int]]:
    """{(local port, remote port): (bytes not yet acknowledged, bytes not yet read)} of the host's
    established IPv4 TCP connections (/proc/net/tcp)."""
    queues = {}
    with open("/proc/net/tcp") as fh:
        for line in fh.readlines()[1:]:
            fields = line.split()
            if fields[3] == "01":
                tx, rx = (int(value, 16) for value in fields[4].split(":"))
                queues[int(fields[1].split(":")[1], 16), int(fields[2].split(":")[1], 16)] = (tx, rx)
    return queues


def request_read(server: ServerHandle, sock: socket.socket) -> bool:
    """The server has read all `sock` sent (seen by the host's kernel: asking the server would take a
    connection): the bytes left the client, acknowledged, and none wait unread at the server's end."""
    ours, theirs = sock.getsockname()[1], urlsplit(server.url).port
    queues = _tcp_queues()
    return queues.get((ours, theirs), (1, 0))[0] == 0 and queues.get((theirs, ours), (0, 1))[1] == 0


def header(path: str, content_length: int | None = None, extra: str = "") -> bytes:
    length = f"Content-Length: {content_length}\r\n" if content_length is not None else ""
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{length}{extra}"
            "\r\n").encode()


@contextlib.contextmanager
def open_files_soft_limit(soft: int) -> Iterator[None]:
    """Processes started inside inherit this soft RLIMIT_NOFILE (the hard limit is left alone), as
    from a login shell's usual 1024."""
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, before[1]), before[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)


def server_open_files_limits(server: ServerHandle) -> tuple[int, int]:
    with open(f"/proc/{server.process.pid}/limits") as fh:
        for line in fh:
            if line.startswith("Max open files"):
                soft, hard = line.split()[3:5]
                return int(soft), int(hard)
    raise AssertionError("no 'Max open files' line")


def metric(server: ServerHandle, name: str) -> float:
    for line in requests.get(server.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


# --- slow clients ---------------------------------------------------------------------------------

def test_by_default_a_slow_header_is_cut_at_20_s_and_a_slow_body_gets_408_at_30_s(sf_server: ServerHandle) -> None:
    slow_header = connect(sf_server, b"POST /run_code HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    slow_body = connect(sf_server, header("/run_code", content_length=1000) + b'{"code": "')
    _, header_closed = read_until_closed(slow_header, within=40)
    received, body_closed = read_until_closed(slow_body, within=40)
    assert 18 < header_closed < 25, header_closed
    assert received.startswith(b"HTTP/1.1 408") and b"not received within 30 s" in received, received[:200]
    assert 28 < header_closed + body_closed < 35, body_closed


def test_a_header_that_trickles_is_cut_at_the_keep_alive_time_out(strict_server: ServerHandle) -> None:
    sock = connect(strict_server, b"POST /run_code HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    started = time.monotonic()
    with contextlib.suppress(OSError):  # a header line every 0.3 s does not buy more time
        while not readable(sock, 0.3):
            sock.sendall(b"X-Slow: 1\r\n")
    _, closed_after = read_until_closed(sock, within=5)
    elapsed = time.monotonic() - started
    assert 1.5 < elapsed < 4.5, f"closed {elapsed:.1f} s after connecting (--timeout-keep-alive 2); {closed_after}"


def test_an_idle_connection_is_closed_after_its_reply_at_the_keep_alive_time_out(strict_server: ServerHandle) -> None:
    sock = connect(strict_server, b"GET /v1/ping HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    received, closed_after = read_until_closed(sock, within=6)
    assert received.startswith(b"HTTP/1.1 200") and b'"pong"' in received
    assert 1.5 < closed_after < 4.5, closed_after


def test_a_body_that_never_finishes_gets_408_at_the_body_time_out(strict_server: ServerHandle) -> None:
    sock = connect(strict_server, header("/run_code", content_length=1000) + b'{"code": "')
    started = time.monotonic()
    with contextlib.suppress(OSError):  # a byte every 0.3 s does not buy more time
        while not readable(sock, 0.3):
            sock.sendall(b"x")
    received, _ = read_until_closed(sock, within=5)
    elapsed = time.monotonic() - started
    assert received.startswith(b"HTTP/1.1 408"), received[:200]
    assert b"request body not received within 2 s" in received
    assert 1.5 < elapsed < 4.5, elapsed


def test_a_client_within_the_time_outs_is_served(strict_server: ServerHandle) -> None:
    body = b'{"code": "print(6 * 7)", "language": "python"}'
    sock = connect(strict_server, header("/run_code", content_length=len(body)) + body[:10])
    time.sleep(1)  # the rest of the body comes late, at half the 2 s body time-out: time has to pass
    sock.sendall(body[10:])
    received = read_response(sock, within=30)
    sock.close()
    assert received.startswith(b"HTTP/1.1 200")
    assert b'"stdout":"42\\n"' in received


@pytest.mark.parametrize("mode", SERVER_MODES)
def test_1100_slow_clients_do_not_stop_the_server(mode: str) -> None:
    """Started with the usual soft limit of 1024 open files: the server raises it to the hard limit
    and keeps answering while 1,100 clients hold headers and bodies unfinished."""
    with contextlib.ExitStack() as stack:
        with open_files_soft_limit(1024):
            server = stack.enter_context(server_in_mode(mode, "--slots", "2"))
        slow = []
        try:
            for index in range(SLOW_CLIENTS):
                partial = header("/run_code", 100) + b'{"co' if index % 2 else b"POST /run_code HTTP/1.1\r\nHo"
                slow.append(connect(server, partial))
            assert requests.get(server.url + "/v1/ping", timeout=10).json() == "pong"
            assert run_code(server, "print(sum(range(10)))")["run_result"]["stdout"] == "45\n"
            soft, hard = server_open_files_limits(server)
            assert soft == hard > SLOW_CLIENTS, (soft, hard)
            health = requests.get(server.url + "/health", timeout=10).json()
            assert health["connections"] >= SLOW_CLIENTS, "the slow clients are held, not refused"
            assert SLOW_CLIENTS < health["max_connections"] < soft
            assert all(is_open(sock) for sock in slow)
        finally:
            for sock in slow:
                sock.close()


def test_at_the_connection_cap_the_longest_waiting_connection_goes() -> None:
    server = start_server("--slots", "2", "--max-connections", "50")
    try:
        busy: dict[str, str] = {}
        runner = threading.Thread(target=lambda: busy.update(
            out=run_code(server, "import time; time.sleep(6); print('done')")["run_result"]["stdout"]))
        runner.start()
        wait_until(lambda: requests.get(server.url + "/health", timeout=10).json()["in_flight"] >= 1, 60,
                   "its handler runs: a busy connection, never evicted")
        slow = [connect(server, b"POST /run_code HTTP/1.1\r\n") for _ in range(200)]
        assert requests.get(server.url + "/v1/ping", timeout=10).json() == "pong"
        health = requests.get(server.url + "/health", timeout=10).json()
        assert health["max_connections"] == 50 and health["connections"] <= 50
        wait_until(lambda: not any(is_open(sock) for sock in slow[:150]), 30, "the oldest slow clients are closed")
        still_open = [is_open(sock) for sock in slow]
        assert not any(still_open[:150]), "the oldest slow clients were closed for the new ones"
        assert all(still_open[-40:]), "the newest slow clients are still waiting"
        assert metric(server, "verl_sf_connections_evicted_total") >= 150
        runner.join(timeout=30)
        assert busy == {"out": "done\n"}
        for sock in slow:
            sock.close()
    finally:
        stop_server(server.process)


def test_when_every_connection_is_busy_a_new_one_gets_503() -> None:
    server = start_server("--slots", "2", "--max-connections", "3")
    try:
        body = json.dumps({"code": "import time; time.sleep(5); print('done')", "language": "python"}).encode()
        runners = [connect(server, header("/run_code", content_length=len(body)) + body) for _ in range(3)]
        # Each request whole in the server's hands (its body read, so its handler runs): all three connections busy.
        wait_until(lambda: all(request_read(server, sock) for sock in runners), 60,
                   "the server read all three requests")
        refused = requests.get(server.url + "/v1/ping", timeout=10)
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
        assert "all 3 connections are busy" in refused.json()["detail"]
        outputs = [json.loads(read_response(sock, within=60).split(b"\r\n\r\n", 1)[1])["run_result"]["stdout"]
                   for sock in runners]
        for sock in runners:
            sock.close()
        assert outputs == ["done\n"] * 3
        assert requests.get(server.url + "/v1/ping", timeout=10).json() == "pong"
        assert metric(server, "verl_sf_connections_refused_total") == 1
    finally:
        stop_server(server.process)


def test_bodies_held_past_the_budget_get_503_and_the_server_keeps_its_memory() -> None:
    """Large bodies queued behind slow answers were held without bound (a client could send as many
    64 MB requests as it had connections); past `--max-bodies-mb` a body now gets 503 with
    Retry-After, and once the answers are sent the next is taken."""
    server = start_server("--slots", "2", "--max-body-mb", "16", "--max-bodies-mb", "40")
    try:
        body = json.dumps({"code": "import time; time.sleep(5); print('done')", "language": "python",
                           "padding": "x" * (15 << 20)}).encode()
        slow = [connect(server, header("/run_code", content_length=len(body)) + body) for _ in range(2)]
        wait_until(lambda: all(request_read(server, sock) for sock in slow), 60, "the server read both bodies")
        refused = requests.post(server.url + "/run_code", data=body, timeout=30,
                                headers={"Content-Type": "application/json"})
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "1", refused.text
        assert refused.json()["code"] == "at_capacity" and "MiB of request bodies" in refused.json()["detail"]
        assert requests.get(server.url + "/v1/ping", timeout=10).json() == "pong"  # no body: not held
        small = run_code(server, "print('small')")  # a body under what is left fits
        assert small["run_result"]["stdout"] == "small\n", small
        outputs = [json.loads(read_response(sock, within=60).split(b"\r\n\r\n", 1)[1])["run_result"]["stdout"]
                   for sock in slow]
        for sock in slow:
            sock.close()
        assert outputs == ["done\n"] * 2
        taken = requests.post(server.url + "/run_code", data=body.replace(b"time.sleep(5)", b"time.sleep(0)"),
                              headers={"Content-Type": "application/json"}, timeout=60)
        assert taken.status_code == 200 and taken.json()["run_result"]["stdout"] == "done\n", taken.text[:300]
    finally:
        stop_server(server.process)


# --- JSON nested past the limit -------------------------------------------------------------------

def nested(depth: int) -> bytes:
    return b'{"a": ' * (depth - 1) + b"{}" + b"}" * (depth - 1)


@pytest.mark.parametrize("endpoint", JSON_ENDPOINTS)
def test_json_nested_without_end_is_a_400_naming_it(sf_server: ServerHandle, endpoint: str) -> None:
    for body in (b"[" * 200_000, nested(MAX_DEPTH + 1)):
        answer = requests.post(sf_server.url + endpoint, data=body, headers={"Content-Type": "application/json"},
                               timeout=30)
        assert answer.status_code == 400, answer.text[:300]
        assert answer.json()["detail"] == f"request body nests JSON deeper than {MAX_DEPTH} levels"
    within = requests.post(sf_server.url + endpoint, data=nested(MAX_DEPTH), timeout=30)
    assert within.status_code == 422, "as deep as allowed: parsed, then refused for its fields"
    assert run_code(sf_server, "print('still serving')")["run_result"]["stdout"] == "still serving\n"


def many_keys(count: int) -> str:
    return "{" + ",".join(f'"k{i}":0' for i in range(count)) + "}"


def test_a_body_of_many_small_values_is_refused_before_it_is_parsed_on_every_api(sf_server: ServerHandle) -> None:
    """Seven million one-letter keys (a red team's 63 MiB) held every client for 6-39 s while they were
    parsed, and E2B's metadata or Daytona's labels of invalid values for as long again while each was
    judged; a body past MAX_JSON_TOKENS is a 400 naming the cap, on each API, in that API's shape."""
    cap_error = f"request body holds more than {MAX_JSON_TOKENS:,} JSON tokens"
    junk = many_keys(MAX_JSON_TOKENS // 2)
    bodies = [("/run_code", f'{{"code": "print(1)", "language": "python", "junk": {junk}}}', {}, "detail"),
              ("/run_jupyter", json.dumps({"cells": [""] * MAX_JSON_TOKENS}), {}, "detail"),
              ("/sessions", f'{{"language": "python", "files": {junk}}}', {}, "detail"),
              ("/v2/sandboxes", f'{{"templateID": "code-interpreter-v1", "metadata": {junk}}}',
               {"X-API-Key": "many-values"}, "message"),
              ("/api/sandbox", f'{{"labels": {junk}}}', {"Authorization": "Bearer many-values"}, "message")]
    for path, body, headers, field in bodies:
        answer = requests.post(sf_server.url + path, data=body.encode(), timeout=60,
                               headers={"Content-Type": "application/json", **headers})
        assert answer.status_code == 400 and answer.json()[field].startswith(cap_error), (path, answer.text[:300])
    # At the cap (12 tokens of fields and braces, 3 a key less one) a body is parsed as ever: its unknown field ignored.
    within = f'{{"code": "print(1)", "language": "python", "junk": {many_keys((MAX_JSON_TOKENS - 11) // 3)}}}'
    answer = requests.post(sf_server.run_code_url, data=within.encode(), headers={"Content-Type": "application/json"},
                           timeout=60)
    assert answer.status_code == 200 and answer.json()["run_result"]["stdout"] == "1\n", answer.text[:300]

def test_a_body_of_long_numbers_is_refused_before_it_is_parsed_on_every_api(sf_server: ServerHandle) -> None:
    """Integers of 4,300 digits convert in time that grows as their digits squared: 15,500 of them (99 KB
    gzipped) held every client ~1 s on each API (red team, 2026-12-07).  Past a MiB outside its strings a
    body is a 400 naming the cap, on each API, in that API's shape."""
    numbers = "[" + ",".join(["7" * 4300] * 300) + "]"
    bodies = [("/run_code", f'{{"code": "print(1)", "language": "python", "x": {numbers}}}', {}, "detail"),
              ("/v2/sandboxes", f'{{"templateID": "code-interpreter-v1", "x": {numbers}}}',
               {"X-API-Key": "long-numbers"}, "message"),
              ("/api/sandbox", f'{{"x": {numbers}}}', {"Authorization": "Bearer long-numbers"}, "message")]
    for path, body, headers, field in bodies:
        answer = requests.post(sf_server.url + path, data=gzip.compress(body.encode()), timeout=60,
                               headers={"Content-Type": "application/json", "Content-Encoding": "gzip", **headers})
        assert answer.status_code == 400, (path, answer.text[:300])
        assert "more than 1,048,576 bytes outside its strings" in answer.json()[field], (path, answer.text[:300])
    assert run_code(sf_server, "print('still serving')")["run_result"]["stdout"] == "still serving\n"


def test_a_display_too_bulky_to_parse_keeps_its_text_and_a_forged_record_is_dropped(sf_server: ServerHandle) -> None:
    """What a cell displays reaches the server as a record, parsed by the zygote and by the server: a red
    team's 130-byte request displayed 3.5 million keys and held every client 4.3 s.  JSON past the token
    or digits cap is left out of the bundle (its text/plain stays); a cell whose displays together pass
    it keeps its output and says its displays were left out; a record written past the caps by hand is
    garbage the run wrote to itself, dropped unread."""
    cells = ["from IPython.display import JSON, display\ndisplay(JSON({str(i): 0 for i in range(200_000)}))",
             "display(JSON([int('7' * 4300)] * 300))", "display(JSON({'a': [1, {'b': 'c'}]}))",
             "for _ in range(30_000):\n    display({'a': [1, 2, 3]})\nprint('many')", "print('next')"]
    answer = requests.post(sf_server.url + "/run_jupyter", json={"cells": cells, "total_timeout": 60}, timeout=90)
    shown = [cell["display"] for cell in answer.json()["cells"]]
    assert [[sorted(bundle) for bundle in display] for display in shown] == [
        [["text/plain"]], [["text/plain"]], [["application/json", "text/plain"]], [], []], answer.text[:500]
    assert shown[2][0]["application/json"] == {"a": [1, {"b": "c"}]}
    many, after = answer.json()["cells"][3:]
    assert many["stdout"] == "many\n" and after["stdout"] == "next\n", answer.text[:500]
    assert many["stderr"] == "\n[verl-sf: 30000 of this cell's displays left out: more than 100,000 JSON tokens]\n"
    forged = "import os\nos.write(3, b'\\n{\"kind\": \"cell\", \"x\": [' + b'1,' * 200_000 + b'1]}\\n')\nprint('on')"
    answer = requests.post(sf_server.url + "/run_jupyter", json={"cells": [forged, "print(2)"]}, timeout=60)
    assert [cell["stdout"] for cell in answer.json()["cells"]] == ["on\n", "2\n"], answer.text[:500]
    assert run_code(sf_server, "print('still serving')")["run_result"]["stdout"] == "still serving\n"



def test_a_run_sends_at_most_max_displays_and_says_so_in_the_cell_past_them(sf_server: ServerHandle) -> None:
    """Cells each under the caps add up: a red team's 100 cells of 19,000 displays (a 300-byte request,
    a 36 MB answer) held every client 0.85 s while the answer was parsed.  Past 20,000 displays in a run
    the rest are left out, and the cell where that happens says how many."""
    cell = "p = get_ipython().display_pub.publish\nfor i in range(9000):\n    p({'text/plain': str(i)}, {})"
    answer = requests.post(sf_server.url + "/run_jupyter", json={"cells": [cell] * 4 + ["print('after')"]},
                           timeout=120).json()
    assert [len(cell["display"]) for cell in answer["cells"]] == [9000, 9000, 2000, 0, 0], answer["cells"][2]["stderr"]
    assert answer["cells"][2]["display"][-1] == {"text/plain": "1999"}
    assert answer["cells"][2]["stderr"].endswith(
        "[verl-sf: 7000 of this cell's displays left out: more than 20,000 displays in one run]\n")
    assert answer["cells"][3]["stderr"].startswith("\n[verl-sf: 9000 of this cell's displays left out")
    assert answer["cells"][4]["stdout"] == "after\n" and answer["truncated"] is True

def test_a_compressed_body_past_the_limit_closes_its_connection(sf_server: ServerHandle) -> None:
    """A gzip bomb's rest is not inflated to be drained: its 413 closes the connection (a red team's 4 MiB
    of gzip, 4 GiB inflated, held every client ~1.1 s; 47 of 199 KiB in 18 s held them 19 s)."""
    bomb = gzip.compress(b'{"code": "' + b"a" * (96 << 20) + b'"}', compresslevel=9)
    with requests.Session() as client:
        answer = client.post(sf_server.run_code_url, data=bomb, timeout=60,
                             headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
    assert answer.status_code == 413 and answer.json()["code"] == "body_too_large", answer.text[:300]
    assert answer.headers.get("Connection", "").lower() == "close", answer.headers
    assert run_code(sf_server, "print('still serving')")["run_result"]["stdout"] == "still serving\n"


def test_gzip_bombs_from_several_clients_leave_every_other_client_served(sf_server: ServerHandle) -> None:
    """80 KB of gzip inflating past the 64 MiB limit: aiohttp inflated it on the event loop, ~0.3 s of it a
    bomb, and with one sender a ping took 285 ms, with four 843 ms (and a run 1.8 s).  The server now
    inflates in a thread: while four clients send bombs back to back, pings and runs go on."""
    bomb = gzip.compress(b'{"code": "' + b"0" * (80 << 20) + b'"}', compresslevel=9)
    sending = threading.Event()
    sending.set()
    refused: list[int] = []

    def send_bombs() -> None:
        with requests.Session() as client:
            while sending.is_set():
                answer = client.post(sf_server.run_code_url, data=bomb, timeout=60,
                                     headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
                refused.append(answer.status_code)

    senders = [threading.Thread(target=send_bombs) for _ in range(4)]
    for sender in senders:
        sender.start()
    try:
        wait_until(lambda: len(refused) >= 4, timeout=60, what="the first bombs answered")
        pings = 0
        with requests.Session() as client:
            ends = time.monotonic() + 3
            while time.monotonic() < ends:  # back to back: with the loop held, a handful would be answered
                assert client.get(sf_server.url + "/v1/ping", timeout=30).json() == "pong"
                pings += 1
        assert run_code(sf_server, "print('served')")["run_result"]["stdout"] == "served\n"
    finally:
        sending.clear()
        for sender in senders:
            sender.join(timeout=60)
    assert set(refused) == {413}, set(refused)
    assert pings >= 100, f"only {pings} pings answered in 3 s beside four senders of gzip bombs"


def test_each_compressed_shape_is_inflated_and_one_not_inflated_is_named(sf_server: ServerHandle) -> None:
    """gzip (members one after another too) and deflate (zlib's format or a bare stream) run; `br` and `zstd`
    are a 400 naming what is inflated; an encoding aiohttp never decoded (`x-gzip`) is taken as it is."""
    body = json.dumps({"code": "print('inflated')", "language": "python"}).encode()
    bare = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    shapes = {"gzip": gzip.compress(body[:10]) + gzip.compress(body[10:]), "deflate": zlib.compress(body),
              "Deflate": bare.compress(body) + bare.flush()}
    for encoding, data in shapes.items():
        answer = requests.post(sf_server.run_code_url, data=data, timeout=60,
                               headers={"Content-Type": "application/json", "Content-Encoding": encoding})
        assert answer.status_code == 200 and answer.json()["run_result"]["stdout"] == "inflated\n", \
            (encoding, answer.text[:300])
    for encoding in ("br", "zstd"):
        answer = requests.post(sf_server.run_code_url, data=b"\x8b\x00", timeout=60,
                               headers={"Content-Type": "application/json", "Content-Encoding": encoding})
        assert answer.status_code == 400, answer.text[:300]
        assert answer.json()["detail"] == (f"request body cannot be read: Can not decode content-encoding: {encoding} "
                                           "(this server inflates gzip and deflate)")
    answer = requests.post(sf_server.run_code_url, data=gzip.compress(body), timeout=60,
                           headers={"Content-Type": "application/json", "Content-Encoding": "x-gzip"})
    assert answer.status_code == 400 and "not valid JSON" in answer.json()["detail"], answer.text[:300]


def test_deep_json_in_a_session_call_through_the_fronts_is_a_400(fronts_server: ServerHandle) -> None:
    body = b'{"session_id": "f0-x", "language": "python", "code": ' + b"[" * 200_000
    for _ in range(4):  # fresh connections: both fronts
        with requests.Session() as client:
            answer = client.post(fronts_server.run_code_url, data=body, timeout=30)
        assert answer.status_code == 400, answer.text[:300]
        assert "deeper than" in answer.json()["detail"]


# --- bodies too large or undecodable --------------------------------------------------------------

def test_a_body_declared_too_large_is_a_413_before_it_is_sent(fronts_server: ServerHandle) -> None:
    sock = connect(fronts_server, header("/run_code", content_length=10 ** 10) + b'{"code": ')
    received = read_response(sock, within=5)
    sock.close()
    assert received.startswith(b"HTTP/1.1 413"), received[:200]
    assert b"request body larger than 1048576 bytes" in received


def test_oversize_bodies_are_a_413_in_the_servers_shape_on_every_route(fronts_server: ServerHandle) -> None:
    """Declared, chunked or compressed; the fronts' forwarded session calls included."""
    routes = [*(("POST", endpoint) for endpoint in JSON_ENDPOINTS), ("GET", "/sessions/f0-x"),
              ("DELETE", "/sessions/f1-x")]
    for method, path in routes:
        bodies = {"declared": (b"x" * (3 << 19), {}), "chunked": (iter([b"x" * (1 << 19)] * 3), {}),
                  "gzip": (gzip.compress(b" " * (4 << 20)), {"Content-Encoding": "gzip"})}
        for kind, (data, headers) in bodies.items():
            with requests.Session() as client:  # a fresh connection: either front
                answer = client.request(method, fronts_server.url + path, data=data, headers=headers, timeout=30)
            assert answer.status_code == 413, (method, path, kind, answer.text[:200])
            assert answer.json() == {"detail": "request body larger than 1048576 bytes", "code": "body_too_large"}, \
                (method, path, kind)


@pytest.mark.parametrize("endpoint", JSON_ENDPOINTS)
def test_an_undecodable_body_is_a_400_naming_it(fronts_server: ServerHandle, endpoint: str) -> None:
    answer = requests.post(fronts_server.url + endpoint, data=b"not gzip", headers={"Content-Encoding": "gzip"},
                           timeout=30)
    assert answer.status_code == 400, answer.text[:300]
    assert answer.json()["detail"] == "request body cannot be read: Can not decode content-encoding: gzip"
    assert requests.get(fronts_server.url + "/v1/ping", timeout=10).json() == "pong"


# --- verl-tool trajectory ids scoped per client ---------------------------------------------------

def observation(server: ServerHandle, trajectory_id: str, action: str, namespace: str | None = None,
                **fields: object) -> str:
    params = {"namespace": namespace} if namespace is not None else None
    answer = requests.post(server.url + "/get_observation", params=params, timeout=60,
                           json={"trajectory_ids": [trajectory_id], "actions": [action], **fields})
    assert answer.status_code == 200, answer.text
    observed: str = answer.json()["observations"][0]
    return observed


def test_the_same_trajectory_id_in_two_namespaces_is_two_trajectories(sf_server: ServerHandle) -> None:
    trajectory = f"shared-{uuid.uuid4().hex[:8]}"
    alice, mallory = f"alice-{uuid.uuid4().hex}", f"mallory-{uuid.uuid4().hex}"
    observation(sf_server, trajectory, "<python>secret = 'alice-only'</python>", alice)
    for namespace in (mallory, None):
        seen = observation(sf_server, trajectory, "<python>print(secret)</python>", namespace)
        assert "NameError" in seen and "alice-only" not in seen, seen
    # Mallory's finish signal ends Mallory's trajectory only.
    observation(sf_server, trajectory, "", mallory, finish=[True])
    assert "alice-only" in observation(sf_server, trajectory, "<python>print(secret)</python>", alice)
    for namespace in (alice, mallory, None):
        observation(sf_server, trajectory, "", namespace, finish=[True])


def test_a_namespace_past_256_characters_is_a_422_naming_it(sf_server: ServerHandle) -> None:
    answer = requests.post(sf_server.url + "/get_observation", params={"namespace": "n" * 257}, timeout=30,
                           json={"trajectory_ids": ["t"], "actions": ["<python>print(1)</python>"]})
    assert answer.status_code == 422
    assert answer.json()["detail"][0]["loc"] == ["query", "namespace"]
