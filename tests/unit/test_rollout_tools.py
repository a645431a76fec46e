"""ToolRunner: verl's call lifecycle, error kinds, truncation, tool-config loading.

The small tools (here and in tests/rollout_helpers.py) are real verl `BaseTool` subclasses (no
sandbox: they compute in process). The sandbox-backed tool is exercised in tests/special_e2e.
"""

from __future__ import annotations

import asyncio
from typing import Any, Optional

import pytest
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema

from tests.rollout_helpers import CALCULATOR_TOOL_YAML, CalculatorTool, schema
from verl_sf.rollout.parsing import ToolCall
from verl_sf.rollout.tools import AgentContext, ErrorKind, ToolConfigLoadError, ToolRunner, load_tools


class RaisingTool(BaseTool):
    def __init__(self, config: dict, tool_schema: Optional[OpenAIFunctionToolSchema] = None) -> None:
        super().__init__(config, tool_schema or schema("broken"))
        self.released = 0

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        raise RuntimeError("backend exploded")

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self.released += 1


def _call(name: str, arguments: str, error: Optional[str] = None) -> ToolCall:
    return ToolCall("id1", name, arguments, error)


def _agent(tools_kwargs: Optional[dict] = None) -> AgentContext:
    return AgentContext("req-1", [], tools_kwargs or {})


async def test_successful_call_and_lifecycle() -> None:
    calc = CalculatorTool({})
    runner = ToolRunner([calc])
    kwargs = {"calculator": {"create_kwargs": {"ground_truth": "7"}}}
    record = await runner.call(_call("calculator", '{"expression": "3 + 4"}'), _agent(kwargs))
    assert (record.text, record.error_kind, record.reward, record.metrics) == ("7", None, 0.5, {"status": "success"})
    assert calc.created == 1 and calc.live == {}  # released
    assert runner.schemas[0]["function"]["name"] == "calculator"


async def test_create_and_execute_get_verls_keyword_arguments() -> None:
    seen: dict = {}

    class Spy(CalculatorTool):
        async def execute(self, instance_id, parameters, **kwargs):
            seen.update(self.live[instance_id], agent=kwargs["agent_data"])
            return await super().execute(instance_id, parameters)

    agent = _agent({"calculator": {"create_kwargs": {"ground_truth": "1"}}})
    await ToolRunner([Spy({})]).call(_call("calculator", '{"expression": "1"}'), agent)
    # verl's calls: create(create_kwargs=...), execute(id, args, agent_data=...)
    assert seen == {"create_kwargs": {"ground_truth": "1"}, "agent": agent}
    assert agent.request_id == "req-1"


@pytest.mark.parametrize("call, kind, text", [
    (_call("", "", error="tool call is not valid JSON: x"), ErrorKind.malformed_call, "Failed to decode tool call"),
    (_call("nope", "{}"), ErrorKind.unknown_tool, "Unknown function 'nope'. Available tools: ['calculator', 'broken']"),
    (_call("calculator", "{bad"), ErrorKind.invalid_arguments, "Invalid JSON in arguments for 'calculator'"),
    (_call("calculator", '"1+1"'), ErrorKind.invalid_arguments, "expected a JSON object, got str"),
    (_call("broken", "{}"), ErrorKind.tool_exception, "Error executing tool 'broken': backend exploded"),
    (_call("calculator", '{"expression": "1/0"}'), "error", "error: division by zero"),
])
async def test_failures_become_messages_for_the_model(call: ToolCall, kind: str, text: str) -> None:
    broken = RaisingTool({})
    runner = ToolRunner([CalculatorTool({}), broken])
    record = await runner.call(call, _agent())
    assert record.error_kind == kind
    assert text in record.text
    if call.name == "broken":
        assert broken.released == 1  # released even though execute raised


async def test_truncation_applies_to_tool_output() -> None:
    runner = ToolRunner([CalculatorTool({})], max_tool_response_length=10, truncate_side="right")
    record = await runner.call(_call("calculator", '{"expression": "repeat:ab"}'), _agent())
    assert record.text == "ababababab...(truncated)" and record.truncated


async def test_calls_of_one_turn_run_concurrently() -> None:
    """Both calls of a turn are in flight at once (checked by overlap, not by time)."""
    started, overlap = [], []

    class Slow(CalculatorTool):
        async def execute(self, instance_id, parameters, **kwargs):
            started.append(instance_id)
            await asyncio.sleep(0.05)
            overlap.append(len(started))
            return await super().execute(instance_id, parameters)

    runner = ToolRunner([Slow({})])
    records = await runner.run([ToolCall("a", "calculator", '{"expression": "1"}'),
                                ToolCall("b", "calculator", '{"expression": "2"}')], _agent())
    assert [r.call_id for r in records] == ["a", "b"] and [r.text for r in records] == ["1", "2"]
    assert overlap == [2, 2]  # both had started before either finished


def test_bad_runner_settings() -> None:
    with pytest.raises(ValueError, match="tool_response_truncate_side"):
        ToolRunner([], truncate_side="up")
    with pytest.raises(ValueError, match="max_tool_response_length"):
        ToolRunner([], max_tool_response_length=0)
    with pytest.raises(ValueError, match="unique"):
        ToolRunner([CalculatorTool({}), CalculatorTool({})])


def test_load_tools_through_verl(tmp_path) -> None:
    path = tmp_path / "tools.yaml"
    path.write_text(CALCULATOR_TOOL_YAML)
    (tool,) = load_tools(str(path))
    assert isinstance(tool, CalculatorTool) and tool.name == "calculator"


def test_load_tools_errors(tmp_path) -> None:
    with pytest.raises(ToolConfigLoadError, match="does not exist"):
        load_tools(str(tmp_path / "missing.yaml"))


def test_load_tools_without_verl_reads_the_same_yaml(tmp_path) -> None:
    """The loader used when verl is not installed builds the same tools from the same yaml."""
    from verl_sf.rollout.tools import _load_tools_without_verl

    path = tmp_path / "tools.yaml"
    path.write_text("tools:\n  - class_name: tests.unit.test_rollout_tools.RaisingTool\n    config: {type: native}\n")
    (tool,) = _load_tools_without_verl(str(path))
    assert isinstance(tool, RaisingTool) and tool.name == "broken"
    for body, error in [
        ("tools: 3\n", "top-level 'tools:' list"),
        ("tools:\n  - config: {}\n", r"tools\[0\]: 'class_name'"),
        ("tools:\n  - class_name: no.such.Tool\n", r"cannot import 'no.such.Tool'"),
        ("tools:\n  - class_name: tests.unit.test_rollout_tools.RaisingTool\n    config: {type: mcp}\n", "not supported"),
    ]:
        path.write_text(body)
        with pytest.raises(ToolConfigLoadError, match=error):
            _load_tools_without_verl(str(path))


async def test_close_reaches_tools_that_have_it() -> None:
    closed = []

    class Closable(CalculatorTool):
        async def close(self) -> None:
            closed.append(self.name)

    await ToolRunner([Closable({}), RaisingTool({})]).close()  # RaisingTool has no close(): skipped
    assert closed == ["calculator"]
