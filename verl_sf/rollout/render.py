"""Conversations as text for the rollout dump and the reward, in ChatML with Hermes tool blocks.

verl's dump holds the decoded prompt and response tokens. Over the chat API there are no
tokens, so the messages are written out the way Qwen-family chat templates (ChatML with
Hermes `<tool_call>` / `<tool_response>` blocks) lay them out — which is what the default
model of the training script sees. Consecutive tool results share one `user` block, as in
Qwen's template.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

GENERATION_PROMPT = "<|im_start|>assistant\n"


def _block(role: str, body: str) -> str:
    return f"<|im_start|>{role}\n{body}<|im_end|>\n"


def _tool_call_text(call: dict[str, Any]) -> str:
    function = call.get("function") or {}
    arguments = function.get("arguments", "")
    with contextlib.suppress(json.JSONDecodeError):  # malformed arguments are shown as the model wrote them
        arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
    payload = json.dumps({"name": function.get("name", ""), "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{payload}\n</tool_call>"


def _assistant_body(message: dict[str, Any]) -> str:
    parts = [message.get("content") or ""]
    parts += [_tool_call_text(call) for call in message.get("tool_calls") or []]
    return "\n".join(p for p in parts if p)


def render_messages(messages: list[dict[str, Any]]) -> str:
    out = []
    pending_tool: list[str] = []
    for message in messages:
        if message["role"] == "tool":
            pending_tool.append(f"<tool_response>\n{message.get('content') or ''}\n</tool_response>")
            continue
        if pending_tool:
            out.append(_block("user", "\n".join(pending_tool)))
            pending_tool = []
        body = _assistant_body(message) if message["role"] == "assistant" else str(message.get("content") or "")
        out.append(_block(message["role"], body))
    if pending_tool:
        out.append(_block("user", "\n".join(pending_tool)))
    return "".join(out)


def render_prompt(messages: list[dict[str, Any]]) -> str:
    """The dump's `input`: the prompt followed by the generation prompt."""
    return render_messages(messages) + GENERATION_PROMPT


def render_response(messages: list[dict[str, Any]]) -> str:
    """The dump's `output` and the reward's `solution_str`: everything after the prompt.

    It continues `render_prompt`, so the first assistant turn has no opening marker, just as
    verl's response tokens start right after the generation prompt.
    """
    text = render_messages(messages)
    return text[len(GENERATION_PROMPT):] if text.startswith(GENERATION_PROMPT) else text
