"""E2B and Daytona sandboxes across a fleet's servers, through one server's URL, with the real SDKs.

Two real `verl-sf serve` processes are started as `verl-sf cluster up` starts them (`--fleet-node`,
`--fleet-directory`); the test writes the fleet's directory as the node actors do (tests/integration/
test_cluster.py runs the same through Ray).  Server A has two fronts, B one.  Every client talks to A
only: new sandboxes go round the fleet, every later call on one reaches the server holding it, and
a sandbox whose server is gone is not found, never a hang.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from daytona import (
    AsyncDaytona,
    CreateSandboxFromSnapshotParams,
    DaytonaConfig,
    DaytonaError,
    DaytonaNotFoundError,
    ListSandboxesQuery,
)
from e2b import NotFoundException, SandboxException, SandboxNotFoundException, SandboxQuery, ServiceBusyException
from e2b_code_interpreter import Sandbox

from tests.server_fixtures import ServerHandle, start_server, stop_server
from verl_sf.server.process import start_server_process

NODES = {"a": "0a0a0a0a0a0a", "b": "0b0b0b0b0b0b"}
FLAGS = ("--slots", "2", "--preload", "")


class Fleet:
    """Servers A (two fronts) and B, each told the fleet's directory; B can be killed and started again."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.a = self._start("a", "--fronts", "2")
        self.b = self._start("b")
        self.publish()

    def _start(self, node: str, *extra: str, port: int = 0) -> ServerHandle:
        args = (*FLAGS, *extra, "--fleet-node", NODES[node], "--fleet-directory", str(self.directory))
        if port == 0:
            return start_server(*args)
        proc, url = start_server_process(*args, port=port)
        return ServerHandle(url, proc)

    def publish(self, *nodes: str) -> None:
        """The directory as a node actor writes it (every listening server, or only `nodes`)."""
        servers = {NODES[n]: getattr(self, n).url for n in (nodes or ("a", "b"))}
        staged = self.directory.with_suffix(".new")
        staged.write_text(json.dumps({"servers": servers}))
        os.replace(staged, self.directory)

    def kill_b(self) -> None:
        os.killpg(self.b.process.pid, signal.SIGKILL)
        self.b.process.wait(timeout=30)

    def restart_b(self) -> None:
        """B back on its URL after a crash, as its node actor brings it back: the same node, a new boot."""
        self.b = self._start("b", port=int(self.b.url.rsplit(":", 1)[1]))

    def stop(self) -> None:
        for handle in (self.a, self.b):
            if handle.process.poll() is None:
                stop_server(handle.process)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    servers = Fleet(tmp_path / "servers.json")
    try:
        yield servers
    finally:
        servers.stop()


def node_of(sandbox_id: str) -> str:
    return next(name for name, tag in NODES.items() if sandbox_id.startswith(f"n{tag}-"))


def e2b_options(fleet: Fleet, key: str = "fleet-key") -> dict[str, Any]:
    return {"api_key": key, "api_url": fleet.a.url, "sandbox_url": fleet.a.url}


def on_both(fleet: Fleet) -> tuple[Sandbox, Sandbox]:
    """A sandbox on A and one on B, made through A (creations go round; each of A's fronts keeps its own turn)."""
    made: dict[str, Sandbox] = {}
    for _ in range(8):
        box = Sandbox.create(timeout=120, **e2b_options(fleet))
        made.setdefault(node_of(box.sandbox_id), box)
        if len(made) == 2:
            return made["a"], made["b"]
    raise AssertionError(f"8 creations all went to {set(made)}")


def test_e2b_sandboxes_spread_over_the_fleet_and_every_call_reaches_their_server(fleet: Fleet) -> None:
    boxes = [Sandbox.create(timeout=120, metadata={"fleet": "yes"}, **e2b_options(fleet)) for _ in range(4)]
    assert {node_of(box.sandbox_id) for box in boxes} == {"a", "b"}, "round the fleet (each of A's fronts its own turn)"
    for box in boxes:
        assert box.run_code("import os\nos.getpid() > 0").text == "True"
        box.files.write("/home/user/note.txt", box.sandbox_id)
        assert box.commands.run("cat /home/user/note.txt").stdout == box.sandbox_id
        assert box.files.read("note.txt") == box.sandbox_id
        again = Sandbox.connect(box.sandbox_id, **e2b_options(fleet))
        assert again.run_code("1 + 1").text == "2"
    listed = Sandbox.list(query=SandboxQuery(metadata={"fleet": "yes"}), **e2b_options(fleet)).next_items()
    assert sorted(s.sandbox_id for s in listed) == sorted(box.sandbox_id for box in boxes)
    paged = Sandbox.list(query=SandboxQuery(metadata={"fleet": "yes"}), limit=3, **e2b_options(fleet))
    assert len(paged.next_items()) == 3 and len(paged.next_items()) == 1
    on_b = next(box for box in boxes if node_of(box.sandbox_id) == "b")
    with pytest.raises(SandboxNotFoundException):  # another key: as if it never existed, on any server
        Sandbox.connect(on_b.sandbox_id, **e2b_options(fleet, key="another-key"))
    assert Sandbox.list(**e2b_options(fleet, key="another-key")).next_items() == []
    for box in boxes:
        assert Sandbox.kill(box.sandbox_id, **e2b_options(fleet)) is True
    assert Sandbox.list(**e2b_options(fleet)).next_items() == []


def test_a_full_server_passes_new_sandboxes_to_the_next(tmp_path: Path) -> None:
    directory = tmp_path / "servers.json"
    a = start_server(*FLAGS, "--fleet-node", NODES["a"], "--fleet-directory", str(directory))
    b = start_server(*FLAGS, "--e2b-max-sandboxes", "1", "--fleet-node", NODES["b"], "--fleet-directory",
                     str(directory))
    try:
        directory.write_text(json.dumps({"servers": {NODES["a"]: a.url, NODES["b"]: b.url}}))
        options = {"api_key": "k", "api_url": a.url, "sandbox_url": a.url}
        boxes = [Sandbox.create(timeout=60, **options) for _ in range(4)]
        assert sorted(node_of(box.sandbox_id) for box in boxes) == ["a", "a", "a", "b"]
        assert all(box.run_code("6 * 7").text == "42" for box in boxes)
    finally:
        stop_server(a.process)
        stop_server(b.process)


def test_a_sandbox_whose_server_died_is_not_found_never_a_hang(fleet: Fleet) -> None:
    on_a, on_b = on_both(fleet)
    fleet.kill_b()
    started = time.monotonic()
    with pytest.raises(NotFoundException, match="gone"):
        on_b.run_code("1")
    with pytest.raises(SandboxException, match="not found"):
        on_b.commands.run("true")
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(on_b.sandbox_id, **e2b_options(fleet))
    assert time.monotonic() - started < 20, "each answer comes at once, the dead server's port refuses"
    assert on_a.run_code("2 + 2").text == "4", "the other server's sandboxes carry on"
    with pytest.raises(ServiceBusyException):  # a server that does not answer the list: said, not half a list
        Sandbox.list(**e2b_options(fleet)).next_items()

    fleet.restart_b()  # same URL, a new boot: it never held the old one's sandboxes
    with pytest.raises(NotFoundException, match="gone"):
        on_b.run_code("1")
    with pytest.raises(SandboxException, match="not found"):
        on_b.files.read("note.txt")
    assert [s.sandbox_id for s in Sandbox.list(**e2b_options(fleet)).next_items()] == [on_a.sandbox_id]

    fleet.publish("a")  # B's node left the fleet
    with pytest.raises(SandboxException, match="not found"):
        on_b.commands.run("true")
    assert [node_of(Sandbox.create(timeout=60, **e2b_options(fleet)).sandbox_id) for _ in range(2)] == ["a", "a"]


def test_a_relayed_mark_sent_by_a_client_routes_nothing(fleet: Fleet) -> None:
    """A client's own `X-Verl-Sf-Fleet-Hop` only keeps its call on the server it reached: no loop, no leak."""
    on_b = on_both(fleet)[1]
    headers = {"X-API-Key": "fleet-key", "X-Verl-Sf-Fleet-Hop": NODES["a"]}
    answer = requests.get(f"{fleet.a.url}/sandboxes/{on_b.sandbox_id}", headers=headers, timeout=30)
    assert answer.status_code == 404
    listed = requests.get(f"{fleet.a.url}/v2/sandboxes", headers=headers, timeout=30)
    assert listed.status_code == 200 and on_b.sandbox_id not in listed.text
    made = requests.post(f"{fleet.a.url}/v2/sandboxes", json={"templateID": "base", "timeout": 30},
                         headers=headers, timeout=60)
    assert made.status_code == 201 and node_of(made.json()["sandboxID"]) == "a"


async def test_daytona_sandboxes_spread_over_the_fleet_and_die_with_their_server(fleet: Fleet) -> None:
    client = AsyncDaytona(DaytonaConfig(api_key="fleet-key", api_url=f"{fleet.a.url}/api"))
    try:
        names = [f"fleet-{i}-{uuid.uuid4().hex[:6]}" for i in range(4)]
        boxes = [await client.create(CreateSandboxFromSnapshotParams(name=name, labels={"fleet": "yes"}))
                 for name in names]
        assert {node_of(box.id) for box in boxes} == {"a", "b"}
        for name, box in zip(names, boxes, strict=True):
            ran = await box.code_interpreter.run_code(f"print({name!r})")  # the websocket, relayed
            assert ran.stdout == f"{name}\n" and ran.error is None
            assert (await box.process.exec("echo shell")).result == "shell\n"
            assert (await client.get(name)).id == box.id  # by name: every server is asked
        listed = [s async for s in client.list(ListSandboxesQuery(labels={"fleet": "yes"}, limit=3))]
        assert sorted(s.id for s in listed) == sorted(box.id for box in boxes)
        on_b = next(box for box in boxes if node_of(box.id) == "b")
        await boxes[0].delete()

        fleet.kill_b()
        with pytest.raises(DaytonaNotFoundError):
            await client.get(on_b.id)
        with pytest.raises(DaytonaNotFoundError):
            await on_b.process.exec("true")
        fleet.restart_b()
        with pytest.raises(DaytonaError, match="404"):  # the SDK words a websocket's 404 no better
            await on_b.code_interpreter.run_code("1")
        survivors = [box for box in boxes[1:] if node_of(box.id) == "a"]
        assert [(await box.process.exec("echo on")).result for box in survivors] == ["on\n"] * len(survivors)
    finally:
        await client.close()


def raw_request(url: str, head: bytes) -> bytes:
    """One HTTP/1.1 request written as bytes (no client tidies its path or headers); the answer's bytes."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(head)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer


def test_a_path_with_dot_segments_reaches_no_other_route_of_the_peer(fleet: Fleet) -> None:
    """The relay sends the path as it came: `/sandboxes/<B's id>/../../v2/sandboxes` is not B's list."""
    on_b = on_both(fleet)[1]
    for path in (f"/sandboxes/{on_b.sandbox_id}/../../v2/sandboxes", f"/sandboxes/{on_b.sandbox_id}/./../../metrics",
                 f"/api/toolbox/{on_b.sandbox_id}/../../../health", f"/api/sandbox/{on_b.sandbox_id}/../../../api/sandbox"):
        answer = raw_request(fleet.a.url, f"GET {path} HTTP/1.1\r\nHost: x\r\nX-API-Key: fleet-key\r\n"
                                          "Authorization: Bearer fleet-key\r\nConnection: close\r\n\r\n".encode())
        status = answer.split(b"\r\n", 1)[0]
        assert b" 404 " in status, (path, answer[:400])
        leaked = (b'"templateID"', b'"items"', b"in_flight", b"# HELP")  # a list, /health, /metrics
        assert not any(part in answer for part in leaked), (path, answer[:400])


def test_a_key_that_is_not_printable_ascii_is_refused_on_every_server(fleet: Fleet) -> None:
    """Else its bytes that are not UTF-8 would be lost on the way to the server holding the sandbox,
    and another key that differs only there would own it too."""
    body = b'{"templateID": "base", "timeout": 60}'
    for url in (fleet.a.url, fleet.b.url):
        for key in (b"zz\xe9", b"k\xc3\xa9y"):
            answer = raw_request(url, b"POST /v2/sandboxes HTTP/1.1\r\nHost: x\r\nX-API-Key: " + key +
                                 b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode() +
                                 b"\r\nConnection: close\r\n\r\n" + body)
            assert answer.startswith((b"HTTP/1.1 400 ", b"HTTP/1.1 401 ")), answer[:300]
            assert b"not ASCII" in answer or b"printable ASCII" in answer, answer[:300]
            listed = raw_request(url, b"GET /api/sandbox HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + key +
                                 b"\r\nConnection: close\r\n\r\n")
            assert listed.startswith((b"HTTP/1.1 400 ", b"HTTP/1.1 401 ")), listed[:300]


def test_pages_of_the_fleet_s_list_lose_nothing_when_sandboxes_end_between_them(fleet: Fleet) -> None:
    """Cleanup as users write it: kill what each page shows, then take the next page."""
    made = {Sandbox.create(timeout=120, metadata={"pages": "yes"}, **e2b_options(fleet)).sandbox_id for _ in range(7)}
    assert {node_of(i) for i in made} == {"a", "b"}
    seen: set[str] = set()
    paginator = Sandbox.list(query=SandboxQuery(metadata={"pages": "yes"}), limit=2, **e2b_options(fleet))
    while paginator.has_next:
        for listed in paginator.next_items():
            seen.add(listed.sandbox_id)
            Sandbox.kill(listed.sandbox_id, **e2b_options(fleet))
    assert seen == made
    assert Sandbox.list(query=SandboxQuery(metadata={"pages": "yes"}), **e2b_options(fleet)).next_items() == []
    bad = requests.get(f"{fleet.a.url}/v2/sandboxes", params={"nextToken": "3"}, headers={"X-API-Key": "k"},
                       timeout=30)
    assert bad.status_code == 400 and "nextToken" in bad.json()["message"]


async def test_daytona_pages_lose_nothing_when_sandboxes_end_between_them(fleet: Fleet) -> None:
    client = AsyncDaytona(DaytonaConfig(api_key="pages-key", api_url=f"{fleet.a.url}/api"))
    try:
        made = {(await client.create()).id for _ in range(5)}
        seen: set[str] = set()
        cursor = None
        while True:
            answer = requests.get(f"{fleet.a.url}/api/sandbox", params={"limit": 2, **({"cursor": cursor} if cursor
                                                                                       else {})},
                                  headers={"Authorization": "Bearer pages-key"}, timeout=30).json()
            for item in answer["items"]:
                seen.add(item["id"])
                await (await client.get(item["id"])).delete()
            cursor = answer["nextCursor"]
            if cursor is None:
                break
        assert seen == made
        refused = requests.get(f"{fleet.a.url}/api/sandbox", params={"cursor": "2"},
                               headers={"Authorization": "Bearer pages-key"}, timeout=30)
        assert refused.status_code == 400 and "cursor" in refused.json()["message"]
    finally:
        await client.close()


def test_a_gzip_upload_is_written_as_sent_directly_and_through_the_relay(fleet: Fleet) -> None:
    for box in on_both(fleet):
        box.files.write("/home/user/gz.txt", "hello " * 1000, gzip=True)
        assert box.files.read("/home/user/gz.txt") == "hello " * 1000
        direct = Sandbox.connect(box.sandbox_id, api_key="fleet-key", api_url=fleet.a.url,
                                 sandbox_url=getattr(fleet, node_of(box.sandbox_id)).url)
        direct.files.write("gz2.txt", b"\x00\x01" * 50, gzip=True)
        assert box.files.read("gz2.txt", format="bytes") == b"\x00\x01" * 50


def test_a_header_sent_twice_reaches_the_peer_twice_in_its_order(fleet: Fleet) -> None:
    """Two `X-API-Key`s: the sandbox is the first key's wherever it is made, as on one server."""
    body = b'{"templateID": "base", "timeout": 60}'
    made: list[str] = []
    while len({node_of(i) for i in made}) < 2 and len(made) < 8:  # creations go round (each front its own turn)
        answer = raw_request(fleet.a.url, b"POST /v2/sandboxes HTTP/1.1\r\nHost: x\r\nX-API-Key: dup-a\r\n"
                             b"X-API-Key: dup-b\r\nContent-Type: application/json\r\nContent-Length: " +
                             str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
        assert answer.startswith(b"HTTP/1.1 201 "), answer[:300]
        made.append(json.loads(answer.split(b"\r\n\r\n", 1)[1])["sandboxID"])
    assert {node_of(i) for i in made} == {"a", "b"}
    for sandbox_id in made:
        holder = getattr(fleet, node_of(sandbox_id)).url
        assert requests.get(f"{holder}/sandboxes/{sandbox_id}", headers={"X-API-Key": "dup-a"}, timeout=30).ok
        assert requests.get(f"{holder}/sandboxes/{sandbox_id}", headers={"X-API-Key": "dup-b"},
                            timeout=30).status_code == 404


def test_a_websocket_upgrade_on_a_route_that_is_none_gets_the_holder_s_http_answer(fleet: Fleet) -> None:
    on_b = on_both(fleet)[1]
    headers = {"X-API-Key": "fleet-key", "Upgrade": "websocket", "Connection": "Upgrade",
               "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version": "13"}
    through_a = requests.get(f"{fleet.a.url}/sandboxes/{on_b.sandbox_id}", headers=headers, timeout=30)
    direct = requests.get(f"{fleet.b.url}/sandboxes/{on_b.sandbox_id}", headers=headers, timeout=30)
    assert through_a.status_code == direct.status_code == 200, (through_a.text, direct.text)
    assert through_a.json()["sandboxID"] == on_b.sandbox_id
