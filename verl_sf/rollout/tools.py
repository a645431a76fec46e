"""Running the model's tool calls through verl-style tools.

A tool is anything shaped like verl's `BaseTool`: `name`, `tool_schema`, and async
`create(instance_id=None, **kw) -> (id, ToolResponse)`, `execute(id, parameters, **kw) ->
(ToolResponse, reward | None, metrics)`, `release(id)`. Each call gets its own instance
(create / execute / release), the same lifecycle verl's ToolAgentLoop uses, and the same
truncation of long responses, so a tool behaves identically in training and here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import inspect
import os
import tempfile
import time
from collections.abc import Sequence
from typing import Any, Optional

import yaml

from verl_sf.enums import StrEnum
from verl_sf.errors import VerlSfError
from verl_sf.rollout.parsing import ToolCall, decode_arguments

TRUNCATE_SIDES = ("left", "right", "middle")


class ToolConfigLoadError(VerlSfError, ValueError):
    """The tool-config yaml is missing or does not describe loadable tools."""


class ErrorKind(StrEnum):
    """Why a call failed, as counted in the summary (beside the tool's own `status` metric)."""

    malformed_call = "malformed_call"  # the model's call could not be read at all
    unknown_tool = "unknown_tool"
    invalid_arguments = "invalid_arguments"  # arguments are not a JSON object
    tool_exception = "tool_exception"  # create/execute raised


# Values of a tool's `status` metric that mean the call did not succeed
# (SandboxFusionTool reports success | error | compile_error | timeout | sandbox_error).
_OK_STATUSES = ("success", "ok", None)


def load_tools(path: str, sandbox_overrides: Optional[dict[str, Any]] = None) -> list[Any]:
    """Instantiate the tools a verl tool-config yaml declares.

    With verl installed this is verl's own `initialize_tools_from_config`, so the tools are
    built exactly as in training; without verl, the same yaml is read here.  `sandbox_overrides`
    (e.g. `{"session": "trajectory"}`) is merged into the config of every SandboxFusionTool entry.
    """
    if not os.path.isfile(path):
        raise ToolConfigLoadError(f"tool config {path!r} does not exist")
    if sandbox_overrides:
        with tempfile.TemporaryDirectory() as directory:
            return load_tools(_with_overrides(path, sandbox_overrides, directory))
    try:
        from verl.tools.tool_registry import initialize_tools_from_config
    except ImportError:
        return _load_tools_without_verl(path)
    return list(initialize_tools_from_config(path))


def _with_overrides(path: str, overrides: dict[str, Any], directory: str) -> str:
    """A copy of the yaml at `path`, in `directory`, whose SandboxFusionTool entries carry `overrides`."""
    from verl_sf.tools import SandboxFusionTool

    with open(path) as f:
        document = yaml.safe_load(f) or {}
    entries = document.get("tools") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise ToolConfigLoadError(f"{path}: expected a top-level 'tools:' list")
    matched = 0
    for entry in entries:
        if isinstance(entry, dict) and issubclass(_tool_class(path, entry), SandboxFusionTool):
            entry["config"] = {**(entry.get("config") or {}), **overrides}
            matched += 1
    if not matched:
        raise ToolConfigLoadError(f"{path}: {sorted(overrides)} apply to SandboxFusionTool entries, and it has none")
    copy = os.path.join(directory, os.path.basename(path))
    with open(copy, "w") as f:
        yaml.safe_dump(document, f)
    return copy


def _tool_class(path: str, entry: dict[str, Any]) -> type:
    module_name, _, class_name = str(entry.get("class_name")).rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ToolConfigLoadError(f"{path}: cannot import {entry.get('class_name')!r}: {exc}") from None


def _load_tools_without_verl(path: str) -> list[Any]:
    from verl_sf.tools._compat import OpenAIFunctionToolSchema

    with open(path) as f:
        document = yaml.safe_load(f) or {}
    entries = document.get("tools") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise ToolConfigLoadError(f"{path}: expected a top-level 'tools:' list")
    tools = []
    for i, entry in enumerate(entries):
        where = f"{path}: tools[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("class_name"), str):
            raise ToolConfigLoadError(f"{where}: 'class_name' (module.Class) is required")
        config = dict(entry.get("config") or {})
        if config.get("type", "native") != "native":
            raise ToolConfigLoadError(f"{where}: config.type {config.get('type')!r} is not supported (only 'native')")
        tool_cls = _tool_class(where, entry)
        schema = entry.get("tool_schema")
        tool_schema = OpenAIFunctionToolSchema.model_validate(schema) if schema else None
        tools.append(tool_cls(config=config, tool_schema=tool_schema))
    return tools


def tool_schema_dict(tool: Any) -> dict[str, Any]:
    """The schema sent in the request's `tools` (verl's `model_dump(exclude_unset, exclude_none)`)."""
    schema = tool.tool_schema
    if isinstance(schema, dict):
        return schema
    return schema.model_dump(exclude_unset=True, exclude_none=True)


def truncate_tool_text(text: str, max_length: int, side: str) -> str:
    """verl's truncation of a tool response longer than `max_length` characters.

    `side` names the part that is cut: "left" keeps the tail, "right" keeps the head,
    "middle" keeps both ends. The markers are verl's, so dumps read the same.
    """
    if side not in TRUNCATE_SIDES:
        raise ValueError(f"tool_response_truncate_side must be one of {TRUNCATE_SIDES}, got {side!r}")
    if len(text) <= max_length:
        return text
    if side == "left":
        return "(truncated)..." + text[-max_length:]
    if side == "right":
        return text[:max_length] + "...(truncated)"
    half = max_length // 2
    return text[:half] + "...(truncated)..." + text[len(text) - half:]


class AgentContext:
    """What verl passes a tool as `execute(..., agent_data=...)`: the trajectory's id and state.

    The driver drops it when the trajectory ends; tools that keep per-trajectory resources
    (SandboxFusionTool's Daytona sandboxes) release them when it is collected, as with
    verl's AgentData.
    """

    def __init__(self, request_id: str, messages: list[dict[str, Any]], tools_kwargs: dict[str, Any]) -> None:
        self.request_id = request_id
        self.messages = messages
        self.tools_kwargs = tools_kwargs
        self.metrics: dict[str, Any] = {}
        self.extra_fields: dict[str, Any] = {}


@dataclasses.dataclass
class ToolCallRecord:
    """One call as executed: what the model sent, what it read back, how it went."""

    call_id: str
    name: str
    arguments: str
    text: str  # exactly what the model read back
    error_kind: Optional[str]  # ErrorKind value, or the tool's non-success `status` metric
    seconds: float
    reward: Optional[float] = None
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    truncated: bool = False  # cut by max_tool_response_length


class ToolRunner:
    """Executes parsed calls against a fixed set of tools, never raising for a bad call."""

    def __init__(self, tools: Sequence[Any], max_tool_response_length: int = 256,
                 truncate_side: str = "middle") -> None:
        if max_tool_response_length < 1:
            raise ValueError(f"max_tool_response_length must be >= 1, got {max_tool_response_length}")
        truncate_tool_text("", 1, truncate_side)  # validate the side now, not on the first long output
        self.tools = {tool.name: tool for tool in tools}
        if len(self.tools) != len(tools):
            raise ValueError(f"tool names must be unique, got {[tool.name for tool in tools]}")
        self.schemas = [tool_schema_dict(tool) for tool in tools]
        self.max_tool_response_length = max_tool_response_length
        self.truncate_side = truncate_side

    async def run(self, calls: Sequence[ToolCall], agent: AgentContext) -> list[ToolCallRecord]:
        """Run `calls` concurrently (one turn's calls), results in call order."""
        return list(await asyncio.gather(*(self.call(call, agent) for call in calls)))

    async def call(self, call: ToolCall, agent: AgentContext) -> ToolCallRecord:
        start = time.perf_counter()
        text, kind, reward, metrics = await self._execute(call, agent)
        truncated_text = truncate_tool_text(text, self.max_tool_response_length, self.truncate_side)
        return ToolCallRecord(
            call_id=call.id, name=call.name, arguments=call.arguments, text=truncated_text, error_kind=kind,
            seconds=time.perf_counter() - start, reward=reward, metrics=metrics,
            truncated=truncated_text != text,
        )

    async def close(self) -> None:
        """Let tools that hold pools or connections (an optional `close()`) release them."""
        for tool in self.tools.values():
            close = getattr(tool, "close", None)
            if close is not None and inspect.iscoroutinefunction(close):
                await close()

    async def _execute(self, call: ToolCall, agent: AgentContext) -> tuple[str, Optional[str], Optional[float], dict]:
        if call.error is not None:
            hint = '<tool_call>\n{"name": <function name>, "arguments": <JSON object>}\n</tool_call>'
            return f"Failed to decode tool call: {call.error}. Expected: {hint}", ErrorKind.malformed_call, None, {}
        tool = self.tools.get(call.name)
        if tool is None:
            text = f"Unknown function '{call.name}'. Available tools: {list(self.tools)}"
            return text, ErrorKind.unknown_tool, None, {}
        arguments, problem = decode_arguments(call)
        if problem is not None:
            return problem, ErrorKind.invalid_arguments, None, {}
        try:
            create_kwargs = (agent.tools_kwargs.get(call.name) or {}).get("create_kwargs") or {}
            instance_id, _ = await tool.create(create_kwargs=create_kwargs)
            try:
                response, reward, metrics = await tool.execute(instance_id, arguments, agent_data=agent)
            finally:
                await tool.release(instance_id)
        except Exception as exc:  # a tool bug must cost one call, not the whole rollout
            return f"Error executing tool '{call.name}': {exc}", ErrorKind.tool_exception, None, {}
        metrics = dict(metrics or {})
        status = metrics.get("status")
        kind = None if status in _OK_STATUSES else str(status)
        return response.text or "", kind, reward, metrics
