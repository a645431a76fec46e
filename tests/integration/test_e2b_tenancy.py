"""E2B tenancy against a real `verl-sf serve`: a sandbox belongs to the API key that created it.

Two clients with different keys share a server started without `--e2b-api-key` (each key a tenant
of its own). The second must get, on every control-plane verb and every data-plane route, exactly
the answer a sandbox that never existed gets; the first keeps using the SDKs' documented calls.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import struct
from collections.abc import Iterator
from typing import Any, Optional

import pytest
import requests
from e2b import NotFoundException, RateLimitException, SandboxNotFoundException, SandboxQuery
from e2b_code_interpreter import AsyncSandbox, Sandbox

from tests.server_fixtures import ServerHandle, start_server, stop_server

KEY_A, KEY_B = "tenant-a-key", "tenant-b-key"
ENVD, JUPYTER = "49983", "49999"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerHandle]:
    handle = start_server("--slots", "2", "--preload", "")
    yield handle
    stop_server(handle.process)


def opts(server: ServerHandle, key: str) -> dict[str, str]:
    return {"api_key": key, "api_url": server.url, "sandbox_url": server.url}


def never_id() -> str:
    """An id of the shape the server gives out that it never gave out."""
    return "i" + secrets.token_hex(10)


Answer = tuple[int, str]


def answer(response: requests.Response, sandbox_id: str) -> Answer:
    """Status and body with the addressed id taken out: what tells two sandboxes apart."""
    return response.status_code, response.text.replace(sandbox_id, "{id}")


CONTROL_VERBS: list[tuple[str, str, Optional[dict[str, Any]]]] = [
    ("GET", "/sandboxes/{id}", None),
    ("DELETE", "/sandboxes/{id}", None),
    ("POST", "/sandboxes/{id}/timeout", {"timeout": 5}),
    ("POST", "/sandboxes/{id}/refreshes", {"duration": 5}),
    ("POST", "/sandboxes/{id}/connect", {"timeout": 5}),
    ("POST", "/v2/sandboxes/{id}/connect", {"timeout": 5}),
    ("POST", "/sandboxes/{id}/pause", None),
    ("POST", "/sandboxes/{id}/resume", {"timeout": 5}),
    ("POST", "/sandboxes/{id}/fork", {}),
    ("POST", "/sandboxes/{id}/snapshots", {}),
    ("PUT", "/sandboxes/{id}/network", {}),
    ("GET", "/sandboxes/{id}/logs", None),
    ("GET", "/v2/sandboxes/{id}/logs", None),
    ("GET", "/sandboxes/{id}/metrics", None),
]
"""Every control-plane call that names a sandbox (implemented or not)."""


def control(server: ServerHandle, key: str, method: str, path: str, body: Optional[dict[str, Any]],
            sandbox_id: str) -> Answer:
    response = requests.request(method, server.url + path.format(id=sandbox_id), json=body,
                                headers={"X-API-Key": key}, timeout=60)
    return answer(response, sandbox_id)


def test_another_key_gets_404_on_every_control_verb(server: ServerHandle) -> None:
    a, b = opts(server, KEY_A), opts(server, KEY_B)
    box = Sandbox.create(timeout=120, metadata={"owner": "a"}, **a)
    ended = Sandbox.create(timeout=120, **a)
    ended.kill()
    try:
        end_at = box.get_info().end_at
        assert Sandbox.list(**b).next_items() == []
        assert Sandbox.list(query=SandboxQuery(metadata={"owner": "a"}), **b).next_items() == []
        with pytest.raises(SandboxNotFoundException):
            Sandbox.get_info(box.sandbox_id, **b)
        with pytest.raises(SandboxNotFoundException):
            Sandbox.connect(box.sandbox_id, **b)
        with pytest.raises(SandboxNotFoundException):
            Sandbox.set_timeout(box.sandbox_id, 2, **b)
        with pytest.raises(SandboxNotFoundException):
            Sandbox.pause(box.sandbox_id, **b)
        assert Sandbox.kill(box.sandbox_id, **b) is False
        never = never_id()
        for method, path, body in CONTROL_VERBS:
            seen = [control(server, KEY_B, method, path, body, sid) for sid in (box.sandbox_id, ended.sandbox_id, never)]
            assert seen[0][0] == 404 and seen[0] == seen[1] == seen[2], (method, path, seen)
            assert "Token" not in seen[0][1]
        # The owner still has it all, untouched: alive, its timeout as it was, listed, with its token.
        assert box.run_code("1 + 1").text == "2"
        assert box.get_info().end_at == end_at
        assert [s.sandbox_id for s in Sandbox.list(**a).next_items()] == [box.sandbox_id]
        detail = requests.get(f"{server.url}/sandboxes/{box.sandbox_id}", headers={"X-API-Key": KEY_A}, timeout=30)
        assert detail.json()["envdAccessToken"] == box._envd_access_token
        with pytest.raises(SandboxNotFoundException):
            Sandbox.get_info(ended.sandbox_id, **a)
        owner_view = control(server, KEY_A, "GET", "/sandboxes/{id}", None, ended.sandbox_id)
        assert owner_view[0] == 404 and "killed" in owner_view[1]  # its owner is told why it ended
    finally:
        box.kill()


def _stream_frame(message: dict[str, Any]) -> bytes:
    data = json.dumps(message).encode()
    return struct.pack(">BI", 0, len(data)) + data


def data_routes(context_id: str) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(port, method, path, requests kwargs): every route on a sandbox's host, envd's and the interpreter's."""
    rpc = {"headers": {"Content-Type": "application/json"}}
    return [
        (ENVD, "GET", "/health", {}),
        (ENVD, "GET", "/files", {"params": {"path": "/home/user/secret.txt"}}),
        (ENVD, "POST", "/files", {"params": {"path": "/home/user/planted.txt"}, "data": b"planted",
                                  "headers": {"Content-Type": "application/octet-stream"}}),
        (ENVD, "POST", "/files", {"files": {"file": ("/home/user/planted.txt", b"planted")}}),
        (ENVD, "POST", "/filesystem.Filesystem/Stat", {"json": {"path": "/home/user/secret.txt"}, **rpc}),
        (ENVD, "POST", "/filesystem.Filesystem/ListDir", {"json": {"path": "/home/user"}, **rpc}),
        (ENVD, "POST", "/filesystem.Filesystem/MakeDir", {"json": {"path": "/home/user/made"}, **rpc}),
        (ENVD, "POST", "/filesystem.Filesystem/Move", {"json": {"source": "/home/user/secret.txt",
                                                                "destination": "/home/user/moved.txt"}, **rpc}),
        (ENVD, "POST", "/filesystem.Filesystem/Remove", {"json": {"path": "/home/user/secret.txt"}, **rpc}),
        (ENVD, "POST", "/filesystem.Filesystem/WatchDir", {"json": {"path": "/home/user"}, **rpc}),
        (ENVD, "POST", "/process.Process/List", {"json": {}, **rpc}),
        (ENVD, "POST", "/process.Process/SendSignal", {"json": {"process": {"pid": 1}, "signal": "SIGNAL_SIGKILL"},
                                                       **rpc}),
        (ENVD, "POST", "/process.Process/Start", {
            "data": _stream_frame({"process": {"cmd": "cat", "args": ["/workdir/secret.txt"]}}),
            "headers": {"Content-Type": "application/connect+json"}}),
        (JUPYTER, "GET", "/health", {}),
        (JUPYTER, "POST", "/execute", {"json": {"code": "secret"}}),
        (JUPYTER, "GET", "/contexts", {}),
        (JUPYTER, "POST", "/contexts", {"json": {}}),
        (JUPYTER, "POST", f"/contexts/{context_id}/restart", {}),
        (JUPYTER, "DELETE", f"/contexts/{context_id}", {}),
        ("8000", "GET", "/", {}),
    ]


def data(server: ServerHandle, sandbox_id: str, port: str, method: str, path: str, kwargs: dict[str, Any],
         tokens: dict[str, str]) -> Answer:
    headers = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": port, **kwargs.get("headers", {}), **tokens}
    response = requests.request(method, server.url + path, **{**kwargs, "headers": headers}, timeout=60)
    return answer(response, sandbox_id)


def test_every_data_plane_route_needs_the_sandbox_own_token(server: ServerHandle) -> None:
    a, b = opts(server, KEY_A), opts(server, KEY_B)
    box, theirs = Sandbox.create(timeout=120, **a), Sandbox.create(timeout=120, **b)
    ended = Sandbox.create(timeout=120, **a)
    ended_tokens = {"X-Access-Token": ended._envd_access_token}
    ended.kill()
    try:
        box.run_code("secret = 'only-a-knows'")
        box.files.write("/home/user/secret.txt", "a's file")
        context = box.create_code_context()
        assert theirs.traffic_access_token and box.traffic_access_token  # the interpreter's calls carry one
        stolen = [  # what a hostile tenant can send: nothing, its own sandbox's tokens, guesses
            {},
            {"X-Access-Token": theirs._envd_access_token},
            {"E2B-Traffic-Access-Token": theirs.traffic_access_token},
            {"X-Access-Token": theirs._envd_access_token, "E2B-Traffic-Access-Token": theirs.traffic_access_token},
            {"X-Access-Token": ""},
            {"X-Access-Token": "x" * 32, "E2B-Traffic-Access-Token": "x" * 32},
            {"X-Access-Token": box._envd_access_token + "x"},
            {"X-Access-Token": box._envd_access_token[:-1]},
        ]
        never = never_id()
        for port, method, path, kwargs in data_routes(context.id):
            for tokens in stolen:
                seen = [data(server, sid, port, method, path, kwargs, tokens)
                        for sid in (box.sandbox_id, ended.sandbox_id, never)]
                assert seen[0][0] == 401 and seen[0] == seen[1] == seen[2], (port, method, path, tokens, seen)
                assert "only-a-knows" not in seen[0][1] and "a's file" not in seen[0][1]
            # A token is scoped: the interpreter's (traffic) token does not open envd; and an ended
            # sandbox's right token only learns why it ended.
            if port == ENVD:
                scoped = data(server, box.sandbox_id, port, method, path, kwargs,
                              {"E2B-Traffic-Access-Token": box.traffic_access_token})
                assert scoped[0] == 401, (path, scoped)
            late = data(server, ended.sandbox_id, port, method, path, kwargs, ended_tokens)
            assert late[0] in (404, 502) and "killed" in late[1], (path, late)
        # Nothing of the owner's changed: its state, its context, its files.
        assert box.run_code("secret").text == "only-a-knows"
        assert box.run_code("secret", context=context).error.name == "NameError"  # the context was not restarted
        assert context.id in {c.id for c in box.list_code_contexts()}
        assert box.files.read("/home/user/secret.txt") == "a's file"
        assert sorted(e.name for e in box.files.list("/home/user")) == ["secret.txt"]
    finally:
        box.kill()
        theirs.kill()


def test_each_tenant_keeps_the_sdk_calls(server: ServerHandle) -> None:
    """Both tenants at once, through the async SDK: contexts, code, files, commands, their own lists."""

    async def tenant(key: str) -> list[str]:
        sandbox = await AsyncSandbox.create(timeout=120, metadata={"tenant": key}, **opts(server, key))
        try:
            context = await sandbox.create_code_context(cwd="/tmp")
            await sandbox.run_code(f"mine = {key!r}", context=context)
            assert [c.id for c in await sandbox.list_code_contexts() if c.id == context.id] == [context.id]
            await sandbox.restart_code_context(context)
            assert (await sandbox.run_code("mine", context=context)).error.name == "NameError"
            await sandbox.remove_code_context(context)
            await sandbox.files.write("/home/user/who.txt", key)
            ran = await sandbox.commands.run("cat who.txt")
            listed = await AsyncSandbox.list(**opts(server, key)).next_items()
            connected = await AsyncSandbox.connect(sandbox.sandbox_id, **opts(server, key))
            assert (await connected.run_code("1 + 1")).text == "2"
            return [ran.stdout, *(s.metadata["tenant"] for s in listed)]
        finally:
            await sandbox.kill()

    async def both() -> list[list[str]]:
        return list(await asyncio.gather(tenant(KEY_A), tenant(KEY_B)))

    assert asyncio.run(both()) == [[KEY_A, KEY_A], [KEY_B, KEY_B]]


def test_a_killed_sandbox_tells_its_owner_why(server: ServerHandle) -> None:
    box = Sandbox.create(timeout=60, **opts(server, KEY_A))
    box.kill()
    with pytest.raises(NotFoundException, match="killed"):
        box.run_code("1")
    with pytest.raises(NotFoundException, match="killed"):
        box.list_code_contexts()


def test_a_burst_of_creations_cannot_push_out_another_tenants_sandbox() -> None:
    """Creations in flight count against --e2b-max-sandboxes: a key creating many at once gets 429s,
    never the places of the executor's sessions, where the longest idle (another key's) would be evicted."""
    handle = start_server("--slots", "2", "--preload", "", "--e2b-max-sandboxes", "2", "--max-sessions", "3")
    try:
        idle = Sandbox.create(timeout=120, **opts(handle, KEY_A))
        idle.run_code("kept = 'yes'")

        async def burst() -> list[object]:
            creations = [AsyncSandbox.create(timeout=60, retries=0, **opts(handle, KEY_B)) for _ in range(8)]
            return list(await asyncio.gather(*creations, return_exceptions=True))

        results = asyncio.run(burst())
        created = [r for r in results if isinstance(r, AsyncSandbox)]
        assert len(created) == 1, results  # the one place A's sandbox leaves
        assert all(isinstance(r, RateLimitException) for r in results if not isinstance(r, AsyncSandbox)), results
        assert idle.run_code("kept").text == "yes"
        for sandbox in created:
            asyncio.run(sandbox.kill())
        idle.kill()
    finally:
        stop_server(handle.process)


def test_a_key_cap_keeps_places_for_the_other_keys() -> None:
    """--e2b-max-sandboxes-per-key: one key creating all it can leaves the rest of the server's places free."""
    handle = start_server("--slots", "2", "--preload", "", "--e2b-max-sandboxes", "4",
                          "--e2b-max-sandboxes-per-key", "2")
    try:
        async def burst(key: str, count: int) -> list[object]:
            creations = [AsyncSandbox.create(timeout=60, retries=0, **opts(handle, key)) for _ in range(count)]
            return list(await asyncio.gather(*creations, return_exceptions=True))

        async def kill(results: list[object]) -> None:
            await asyncio.gather(*(r.kill() for r in results if isinstance(r, AsyncSandbox)))

        hostile = asyncio.run(burst(KEY_B, 6))
        refused = [r for r in hostile if not isinstance(r, AsyncSandbox)]
        assert len(refused) == 4 and all(isinstance(r, RateLimitException) and "per key" in str(r) for r in refused)
        other = asyncio.run(burst(KEY_A, 2))
        assert all(isinstance(r, AsyncSandbox) for r in other), other
        asyncio.run(kill(hostile + other))
    finally:
        stop_server(handle.process)
