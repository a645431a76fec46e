"""Tool calls out of a chat-completions message: structured `tool_calls` or Hermes text.

sglang and vLLM return structured `tool_calls` when started with a tool-call parser, and raw
text otherwise; with Qwen-family models that text carries Hermes blocks, the format verl's
default `hermes` parser reads::

    <tool_call>
    {"name": "code_interpreter", "arguments": {"code": "print(1)"}}
    </tool_call>

Unlike verl, which logs and drops a block it cannot decode, a malformed call is kept as a
`ToolCall` with `error` set, so the driver can tell the model what was wrong.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Optional

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
_BLOCK_RE = re.compile(re.escape(TOOL_CALL_START) + r"(.*?)" + re.escape(TOOL_CALL_END), re.DOTALL)


@dataclasses.dataclass
class ToolCall:
    """One requested call. `arguments` is the JSON text as the model wrote it."""

    id: str
    name: str
    arguments: str
    error: Optional[str] = None  # set when the call itself could not be read

    def openai_dict(self) -> dict[str, Any]:
        """The call as an assistant message's `tool_calls` entry (what chat templates render)."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def parse_hermes(text: str, id_prefix: str) -> tuple[str, list[ToolCall]]:
    """Split raw model text into (content without the blocks, calls in order).

    Like verl, blocks are only read when both tags occur. An opening tag left without its
    closing tag after the last complete block is reported as a malformed call.
    """
    if TOOL_CALL_START not in text or TOOL_CALL_END not in text:
        if TOOL_CALL_START in text:
            return text, [ToolCall(f"{id_prefix}0", "", "", error="unterminated <tool_call> block (no </tool_call>)")]
        return text, []
    calls = [_decode_block(body, f"{id_prefix}{i}") for i, body in enumerate(_BLOCK_RE.findall(text))]
    content = _BLOCK_RE.sub("", text)
    if TOOL_CALL_START in content:
        calls.append(ToolCall(f"{id_prefix}{len(calls)}", "", "",
                              error="unterminated <tool_call> block (no </tool_call>)"))
    return content, calls


def _decode_block(body: str, call_id: str) -> ToolCall:
    try:
        payload = json.loads(body)
    except json.JSONDecodeError as exc:
        return ToolCall(call_id, "", body.strip(), error=f"tool call is not valid JSON: {exc}")
    if not isinstance(payload, dict) or "name" not in payload or "arguments" not in payload:
        return ToolCall(call_id, "", body.strip(), error='tool call must be a JSON object with "name" and "arguments"')
    name = payload["name"]
    if not isinstance(name, str):
        return ToolCall(call_id, "", body.strip(),
                        error=f'tool call "name" must be a string, got {type(name).__name__}')
    return ToolCall(call_id, name, json.dumps(payload["arguments"], ensure_ascii=False))


def parse_openai_tool_calls(raw_calls: list[Any], id_prefix: str) -> list[ToolCall]:
    """Read a response message's `tool_calls`; entries we cannot read become malformed calls."""
    calls = []
    for i, raw in enumerate(raw_calls):
        call_id = f"{id_prefix}{i}"
        function = raw.get("function") if isinstance(raw, dict) else None
        if isinstance(raw, dict) and isinstance(raw.get("id"), str) and raw["id"]:
            call_id = raw["id"]
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            calls.append(ToolCall(call_id, "", json.dumps(raw, default=str), error="tool call has no function name"))
            continue
        arguments = function.get("arguments", "")
        if not isinstance(arguments, str):  # some servers send the decoded object
            arguments = json.dumps(arguments, ensure_ascii=False)
        calls.append(ToolCall(call_id, function["name"], arguments))
    return calls


def decode_arguments(call: ToolCall) -> tuple[Optional[dict[str, Any]], Optional[str]]:
    """(arguments object, None) or (None, message for the model), with verl's wording."""
    try:
        value = json.loads(call.arguments)
    except (json.JSONDecodeError, TypeError) as exc:
        return None, f"Invalid JSON in arguments for '{call.name}': {exc}"
    if not isinstance(value, dict):
        return None, f"Invalid arguments for '{call.name}': expected a JSON object, got {type(value).__name__}"
    return value, None
