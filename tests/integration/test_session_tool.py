"""`session: trajectory` in the verl tool, driven by verl 0.9's own ToolAgentLoop, and `verl-sf rollout --session`.

verl calls create -> execute(agent_data=...) -> release around every single call with one AgentData per
trajectory; the session is keyed on that object and ends when it is collected.  The only stand-in is the
language model (a scripted policy).
"""

from __future__ import annotations

import gc
import http.server
import json
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
import requests

from tests.rollout_helpers import run_cli
from tests.server_fixtures import ServerHandle, start_server, stop_server
from tests.special_e2e.policy_server import Call, PolicyServer, Script, Turn
from tests.verl_harness import TOKENIZER, VerlHarness, agent_data, build_loop, write_tool_config
from tests.waiting import wait_until_async
from verl_sf.backends.base import SessionsUnsupported
from verl_sf.tools import SandboxFusionTool, ToolConfigError
from verl_sf.tools.backend_calls import backend_for

pytestmark = [pytest.mark.asyncio(loop_scope="module")]
INPROCESS = {"pool": "inprocess"}  # the dispatcher is not what these tests are about; tests/integration/test_verl_code_interpreter_tool.py covers Ray


@pytest.fixture(scope="module")
def session_server() -> Iterator[ServerHandle]:
    handle = start_server("--slots", "2", "--preload", "")
    yield handle
    stop_server(handle.process)


def live_sessions(server: ServerHandle) -> int:
    return requests.get(server.url + "/health", timeout=30).json()["sessions"]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def session_tool(tmp_path_factory: pytest.TempPathFactory,
                       session_server: ServerHandle) -> AsyncIterator[VerlHarness]:
    harness = VerlHarness(write_tool_config(tmp_path_factory.mktemp("tool"), session="trajectory", **INPROCESS,
                                            sandbox_fusion_url=session_server.run_code_url, default_timeout=5))
    yield harness
    await harness.close()


async def test_state_persists_through_tool_agent_loop(session_tool: VerlHarness) -> None:
    """verl's ToolAgentLoop.run end to end: each turn's call is its own create/execute/release."""

    def call(code: str, **extra: str) -> str:
        return "<tool_call>" + json.dumps({"name": "code_interpreter", "arguments": {"code": code, **extra}}) \
            + "</tool_call>"

    turns = [call("import math\nx = 41\nnotes = open('notes.txt', 'w')"),
             call("x += 1\nnotes.write('kept')\nnotes.close()\nprint(x, math.factorial(3), open('notes.txt').read())"),
             call("cd /tmp && export V=9 && f() { echo fn; }", language="bash"),
             call("echo $PWD $V; f", language="bash"),
             "Done."]
    loop, policy = build_loop(session_tool.cfg, [session_tool.tool], turns)
    output = await loop.run({"temperature": 1.0}, raw_prompt=[{"role": "user", "content": "Count"}])
    final_prompt = policy.prompts[-1]
    assert "<tool_response>\n42 6 kept\n</tool_response>" in final_prompt
    assert "<tool_response>\n/tmp 9\nfn\n</tool_response>" in final_prompt
    assert TOKENIZER.decode(output.response_ids).endswith("Done.<|im_end|>")


async def test_trajectories_are_isolated_and_end_with_their_agent_data(session_tool: VerlHarness,
                                                                       session_server: ServerHandle) -> None:
    before = live_sessions(session_server)
    first, second = agent_data(), agent_data()
    await session_tool.call("owner = 'first'\nopen('mine.txt', 'w').write('1')", first)
    await session_tool.call("owner = 'second'", second)
    mine, _, _ = await session_tool.call("import os\nprint(owner, os.listdir('.'))", first)
    theirs, _, _ = await session_tool.call("import os\nprint(owner, os.listdir('.'))", second)
    assert (mine.text, theirs.text) == ("first ['mine.txt']", "second []")
    fresh, _, _ = await session_tool.call("print(owner)")  # a new trajectory: a new session
    assert "NameError" in fresh.text
    assert live_sessions(session_server) >= before + 2
    backend = backend_for(session_tool.tool.backend_config)
    keys = set(backend.sessions())  # type: ignore[attr-defined]
    del first, second
    gc.collect()
    # The finalizers hand the DELETEs to this loop.
    await wait_until_async(lambda: len(keys - set(backend.sessions())) >= 2, 5,  # type: ignore[attr-defined]
                           "the two collected trajectories' sessions are ended")
    # Their DELETEs may still be in flight on this loop: wait for the server to have ended them (only
    # the third trajectory's session may linger until collected).
    await wait_until_async(lambda: live_sessions(session_server) <= before + 1, 10, "the server ends the two sessions")


async def test_the_default_stays_stateless(tmp_path: Path, session_server: ServerHandle) -> None:
    harness = VerlHarness(write_tool_config(tmp_path, sandbox_fusion_url=session_server.run_code_url, **INPROCESS))
    try:
        data = agent_data()
        await harness.call("x = 1", data)
        reply, _, _ = await harness.call("print(x)", data)
        assert "NameError" in reply.text
    finally:
        await harness.close()


async def test_an_expired_session_is_told_to_the_model_then_a_fresh_one_starts(tmp_path: Path) -> None:
    server = start_server("--slots", "1", "--preload", "", "--session-idle-ttl", "1")
    harness = VerlHarness(write_tool_config(tmp_path, session="trajectory", sandbox_fusion_url=server.run_code_url,
                                            **INPROCESS))
    try:
        data = agent_data()
        await harness.call("x = 1", data)
        await wait_until_async(lambda: live_sessions(server) == 0, 60, "the idle session expired", every=0.5)
        lost, _, metrics = await harness.call("print(x)", data)
        assert lost.text.startswith("Session error") and "expired: idle for" in lost.text
        assert metrics["status"] == "session_ended"
        again, _, _ = await harness.call("print('x' in globals())", data)
        assert again.text == "False"
    finally:
        await harness.close()
        stop_server(server.process)


async def test_a_killed_session_is_said_in_the_reply(session_tool: VerlHarness) -> None:
    data = agent_data()
    await session_tool.call("kept = 1", data)
    killed, _, metrics = await session_tool.call(
        "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(100)", data, timeout=1)
    assert metrics["status"] == "timeout" and "[The session ended (" in killed.text and "killed" in killed.text
    after, _, _ = await session_tool.call("print('kept' in globals())", data)
    assert after.text == "False"


class _NoSessionsHandler(http.server.BaseHTTPRequestHandler):
    """A real HTTP server that knows nothing of sessions (as a plain Sandbox Fusion server): 404 for them."""

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"detail":"Not Found"}')

    def log_message(self, *args: object) -> None:
        pass


async def test_a_server_without_sessions_fails_at_construction(tmp_path: Path) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NoSessionsHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/run_code"
        with pytest.raises(SessionsUnsupported, match="keeps no sessions"):
            SandboxFusionTool({"type": "native", "sandbox_fusion_url": url, "session": "trajectory"})
        SandboxFusionTool({"type": "native", "sandbox_fusion_url": url})  # stateless: not asked
    finally:
        server.shutdown()
    with pytest.raises(ToolConfigError, match="session"):
        SandboxFusionTool({"type": "native", "sandbox_fusion_url": url, "session": "episode"})


# ---- verl-sf rollout --session trajectory ----------------------------------------------------------
def code_call(code: str) -> Call:
    return Call("code_interpreter", json.dumps({"code": code}))


async def test_rollout_session_flag_keeps_state_across_turns(tmp_path: Path, session_server: ServerHandle) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "Q-state"}],
                                "reward_model": {"ground_truth": "42"}, "extra_info": {}}) + "\n")
    tools = write_tool_config(tmp_path, sandbox_fusion_url=session_server.run_code_url, **INPROCESS)
    scripts = {"Q-state": Script([Turn("", [code_call("x = 6 * 7")]), Turn("", [code_call("print(x)")]),
                                  Turn("So #### {tool}")])}
    results = {}
    for session in ("trajectory", "none"):
        async with PolicyServer(scripts) as policy:
            code, stdout, stderr = await run_cli("--server", policy.url, "--data", str(data), "--tool-config", tools,
                                                 "--n", "2", "--session", session, "--no-progress")
        assert code == 0, stderr
        results[session] = stdout
    assert "accuracy: 1.0000" in results["trajectory"]
    assert "accuracy: 0.0000" in results["none"]  # each call fresh: print(x) is a NameError
