"""SandboxFusionTool inside real verl 0.9.1: its registry, its ToolAgentLoop, our Ray dispatcher and server.

Calls go through verl's own `ToolAgentLoop._call_tool` (create -> execute(agent_data=)
-> release, then verl's truncation), on a loop built the way verl's AgentLoopWorker builds
it.  The only stand-in is the language model: a scripted `LLMServerClient` that answers
with fixed token sequences, tokenized by a byte-level tokenizer built offline.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from verl.tools.schemas import ToolResponse

from tests.intervals import max_overlap
from tests.ray_fixtures import RayCluster
from tests.server_fixtures import ServerHandle, start_server, stop_server
from tests.verl_harness import (
    TOKENIZER,
    VerlHarness,
    build_loop,
    write_tool_config,
)
from verl_sf.backends.config import BackendConfig
from verl_sf.tools.backend_calls import backend_for

pytestmark = [pytest.mark.ray, pytest.mark.asyncio(loop_scope="module")]

@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http_tool(tmp_path_factory: pytest.TempPathFactory, sf_server: ServerHandle,
                    ray_local: RayCluster) -> AsyncIterator[VerlHarness]:
    """One tool (default dispatcher) shared by the tests that only need the default http setup.

    On the module's event loop, as one rollout worker's loop: the default dispatcher runs the
    backend in this process, and its connections belong to that loop."""
    harness = VerlHarness(write_tool_config(tmp_path_factory.mktemp("tool"), sandbox_fusion_url=sf_server.run_code_url,
                                            default_timeout=5, max_output_chars=4000))
    yield harness
    await harness.close()


async def test_success_exception_and_argument_errors(http_tool: VerlHarness) -> None:
    response, reward, metrics = await http_tool.call("import sys\nprint(6 * 7)\nprint('warn', file=sys.stderr)")
    assert response.text == "42\nwarn" and reward is None
    assert metrics["status"] == "success" and metrics["backend"] == "http" and metrics["truncated"] is False
    assert metrics["execution_time"] > 0 and metrics["queue_wait"] >= 0

    response, _, metrics = await http_tool.call("def f():\n    return 1 / 0\nprint('before')\nf()")
    assert response.text.startswith("before\nTraceback (most recent call last):")
    assert 'line 2, in f' in response.text and response.text.endswith("ZeroDivisionError: division by zero")
    assert metrics["status"] == "error"

    response, _, _ = await http_tool.call("import sys; sys.exit(3)")
    assert response.text == "(exited with code 3)"
    response, _, _ = await http_tool.call("x = 1")
    assert response.text == "(no output; print() the values you want to see)"
    response, _, metrics = await http_tool.call("   ")
    assert response.text.startswith("Invalid arguments: 'code' is required") and metrics["status"] == "invalid_arguments"
    response, _, _ = await http_tool.call("print(1)", timeout="soon")
    assert response.text == "Invalid arguments: 'timeout' must be a number of seconds, got 'soon'"


async def test_timeout_reports_the_limit_and_partial_output(http_tool: VerlHarness) -> None:
    response, _, metrics = await http_tool.call(
        "import time\nprint('step 1', flush=True)\ntime.sleep(30)\nprint('never')", timeout=1)
    assert response.text == "Execution timed out after 1 s\nOutput before the time-out:\nstep 1"
    assert metrics["status"] == "timeout"


async def test_huge_output_is_cut_with_a_marker(http_tool: VerlHarness) -> None:
    response, _, metrics = await http_tool.call("print('x' * 5_000_000)\nraise SystemExit('the end')")
    text = response.text
    assert metrics["truncated"] is True
    assert re.search(r"\[\.\.\. output truncated: \d+ characters not shown \.\.\.\]", text)
    assert text.startswith("xxxx") and text.endswith("the end")
    assert len(text) < 4000 + 100


async def test_verl_truncation_still_applies_on_top(http_tool: VerlHarness) -> None:
    harness = VerlHarness(http_tool.path, max_tool_response_length=256, tool=http_tool.tool)
    response, _, _ = await harness.call("print('y' * 100_000)")
    assert "...(truncated)..." in response.text and len(response.text) <= 256 + len("...(truncated)...")


async def test_sandbox_down_is_a_short_sandbox_error(tmp_path: Path, ray_local: RayCluster) -> None:
    server = start_server("--slots", "1")
    url = server.run_code_url
    harness = VerlHarness(write_tool_config(tmp_path, sandbox_fusion_url=url,
                                            http={"max_retries": 1, "backoff_base_s": 0.05}))
    try:
        response, _, _ = await harness.call("print('up')")
        assert response.text == "up"
        stop_server(server.process)
        response, reward, metrics = await harness.call("print('down')")
        assert response.text.startswith("Sandbox error: ") and "\n" not in response.text
        assert "127.0.0.1" in response.text or "connect" in response.text.lower()
        assert reward is None and metrics["status"] == "sandbox_error"
    finally:
        stop_server(server.process)
        await harness.close()


async def test_retool_conventions(tmp_path: Path, sf_server: ServerHandle, ray_local: RayCluster) -> None:
    harness = VerlHarness(write_tool_config(tmp_path, sandbox_fusion_url=sf_server.run_code_url,
                                            extract_code_block=True, print_last_expression=True))
    try:
        response, _, _ = await harness.call("Let me compute.\n```python\nimport math\nmath.factorial(5)\n```\nDone.")
        assert response.text == "120"
        response, _, _ = await harness.call("print('shown')\nNone")
        assert response.text == "shown"
    finally:
        await harness.close()


TIMED_CODE = "import time\nprint(time.time(), flush=True)\ntime.sleep(0.2)\nprint(time.time())"


def sandbox_intervals(results: list[tuple[ToolResponse, Any, dict]]) -> list[tuple[float, float]]:
    """(start, end) of each run, as the code measured them inside the sandbox."""
    intervals = []
    for response, _, metrics in results:
        assert metrics["status"] == "success", response.text
        start, end = (float(v) for v in response.text.split())
        intervals.append((start, end))
    return intervals


@pytest.mark.parametrize("pool, kind", [("auto", "ray"), ("ray_actor", "ray_actor")])
async def test_rate_limit_caps_runs_in_flight(tmp_path: Path, sf_server: ServerHandle, ray_local: RayCluster,
                                              pool: str, kind: str) -> None:
    harness = VerlHarness(write_tool_config(tmp_path, sandbox_fusion_url=sf_server.run_code_url,
                                            rate_limit=4, num_workers=16, pool=pool))
    try:
        assert harness.tool.dispatcher.kind == kind  # `auto` under Ray: the limiter, no pool actor
        results = await asyncio.gather(*(harness.call(TIMED_CODE) for _ in range(64)))
    finally:
        await harness.close()
    deepest = max_overlap(sandbox_intervals(results))
    assert 2 <= deepest <= 4, deepest


async def test_two_tools_share_the_cluster_wide_cap(tmp_path: Path, sf_server: ServerHandle,
                                                    ray_local: RayCluster) -> None:
    """Two tool objects (as two rollout workers would hold) draw from one limiter."""
    path = write_tool_config(tmp_path, sandbox_fusion_url=sf_server.run_code_url, rate_limit=4, num_workers=16)
    harnesses = [VerlHarness(path), VerlHarness(path)]
    try:
        results = await asyncio.gather(*(h.call(TIMED_CODE) for h in harnesses for _ in range(32)))
    finally:
        for harness in harnesses:
            await harness.close()
    deepest = max_overlap(sandbox_intervals(results))
    assert 2 <= deepest <= 4, deepest


# Runs wherever the dispatcher runs its functions (Ray pickles module-level functions by reference).
async def backend_identity(config: BackendConfig) -> tuple[int, int]:
    return os.getpid(), id(backend_for(config))


async def test_backend_is_built_once_per_tool_not_per_call(http_tool: VerlHarness) -> None:
    for i in range(3):
        response, _, _ = await http_tool.call(f"print({i})")
        assert response.text == str(i)
    tool = http_tool.tool
    identities = {await tool.dispatcher.run(backend_identity, tool.backend_config) for _ in range(3)}
    assert len(identities) == 1 and identities.pop()[0] == os.getpid()  # the default dispatcher runs here


async def test_a_dead_pool_actor_is_reported_then_replaced(tmp_path: Path, sf_server: ServerHandle,
                                                           ray_local: RayCluster) -> None:
    import ray

    harness = VerlHarness(write_tool_config(tmp_path, sandbox_fusion_url=sf_server.run_code_url, pool="ray_actor"))
    try:
        assert (await harness.call("print('first')"))[0].text == "first"
        pid, _ = await harness.tool.dispatcher.run(backend_identity, harness.tool.backend_config)
        assert pid != os.getpid()  # the backend lives in the pool actor
        ray.kill(harness.tool.dispatcher._actor, no_restart=True)
        response, _, metrics = await harness.call("print('second')")
        assert response.text.startswith("Sandbox error: execution pool actor unavailable")
        assert metrics["status"] == "sandbox_error"
        assert (await harness.call("print('third')"))[0].text == "third"
    finally:
        await harness.close()


LOCAL_VS_HTTP_CASES = [
    ("print('hello')", {}),
    ("import sys\nsys.stdout.write('a\\n'); sys.stderr.write('b\\n')", {}),
    ("raise ValueError('bad value')", {}),
    ("import time\nprint('partial', flush=True)\ntime.sleep(10)", {"timeout": 1}),
    ("print('z' * 200_000)", {}),
    ("import numpy as np\nprint(np.arange(4).sum())", {}),
    ("x = [", {}),
]


async def test_local_backend_answers_like_the_http_backend(http_tool: VerlHarness, tmp_path: Path,
                                                           ray_local: RayCluster) -> None:
    local = VerlHarness(write_tool_config(tmp_path, sandbox_fusion_url=None, backend="local", default_timeout=5,
                                          max_output_chars=4000, local={"workers": 2}))
    try:
        for code, extra in LOCAL_VS_HTTP_CASES:
            (http_response, _, http_metrics), (local_response, _, local_metrics) = await asyncio.gather(
                http_tool.call(code, **extra), local.call(code, **extra))
            assert local_response.text == http_response.text, code
            assert local_metrics["status"] == http_metrics["status"]
            assert local_metrics["truncated"] == http_metrics["truncated"]
            assert local_metrics["backend"] == "local"
    finally:
        await local.close()


async def test_tool_agent_loop_runs_a_multi_turn_rollout(http_tool: VerlHarness) -> None:
    """verl's ToolAgentLoop.run end to end, the scripted policy calling the tool twice."""

    def call(code: str) -> str:
        return "<tool_call>" + json.dumps({"name": "code_interpreter", "arguments": {"code": code}}) + "</tool_call>"

    loop, policy = build_loop(http_tool.cfg, [http_tool.tool],
                              [call("print(sum(range(10)))"), call("1/0"), "The answer is 45."])
    output = await loop.run({"temperature": 1.0}, raw_prompt=[{"role": "user", "content": "Sum 0..9"}])
    assert output.num_turns == 6  # user + 3 assistant + 2 tool
    final_prompt = policy.prompts[-1]
    assert "<tool_response>\n45\n</tool_response>" in final_prompt
    assert "ZeroDivisionError: division by zero\n</tool_response>" in final_prompt
    response_text = TOKENIZER.decode(output.response_ids)
    assert response_text.endswith("The answer is 45.<|im_end|>")
    # Tool tokens are masked out of the loss, model tokens are not.
    assert 0 in output.response_mask and 1 in output.response_mask
