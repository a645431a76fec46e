"""A scripted policy server: the one stand-in allowed, for the language model itself.

It speaks OpenAI chat completions over real HTTP on 127.0.0.1 (`/v1/models`,
`/v1/chat/completions`) the way sglang and vLLM do, and replays scripted assistant turns
chosen by the conversation: the script is the one whose key occurs in the first user
message, the turn is the number of assistant messages already in the request.

Like a real server it
- returns structured `tool_calls` ("openai" scripts) or raw Hermes `<tool_call>` text
  ("hermes" scripts, as sglang/vLLM do without a tool parser);
- counts tokens (whitespace-separated words here) in `usage`, and honours `max_tokens`
  by cutting the turn and answering finish_reason "length";
- rejects a conversation where an assistant tool call has no tool result (HTTP 400).

A turn may quote the latest tool result (`Turn(content="#### {tool}")`), so a scripted
answer is right only when the sandbox really ran the code and printed the right thing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any, Optional

from aiohttp import web

MODEL_NAME = "scripted-policy"
MESSAGE_OVERHEAD_TOKENS = 4  # per message, as chat templates add role markers


def count_tokens(text: str) -> int:
    return len(text.split())


@dataclasses.dataclass
class Call:
    name: str
    arguments: str  # JSON text as the "model" writes it; may be deliberately invalid

    @classmethod
    def code(cls, code: str) -> Call:
        return cls("code_interpreter", json.dumps({"code": code}))


@dataclasses.dataclass
class Turn:
    content: str = ""  # "{tool}" is replaced by the latest tool result, stripped
    calls: list[Call] = dataclasses.field(default_factory=list)
    raw: Optional[str] = None  # hermes scripts: exact text to return (e.g. a malformed block)


@dataclasses.dataclass
class Script:
    turns: list[Turn]
    mode: str = "openai"  # "openai": structured tool_calls; "hermes": raw text with <tool_call> blocks


class PolicyServer:
    def __init__(self, scripts: dict[str, Script], hold_seconds: float = 0.0) -> None:
        self.scripts = scripts
        self.hold_seconds = hold_seconds  # keep each request open a moment so concurrency builds up
        self.requests: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._runner: Optional[web.AppRunner] = None
        self.url = ""

    async def start(self) -> str:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> PolicyServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.stop()

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL_NAME, "object": "model"}]})

    async def _chat(self, request: web.Request) -> web.Response:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            body = await request.json()
            self.requests.append(body)
            if self.hold_seconds:
                await asyncio.sleep(self.hold_seconds)
            return self._reply(body)
        finally:
            self.in_flight -= 1

    def _reply(self, body: dict[str, Any]) -> web.Response:
        messages = body.get("messages") or []
        problem = _check_tool_results(messages)
        if problem:
            return web.json_response({"error": {"message": problem}}, status=400)
        first_user = next((m.get("content", "") for m in messages if m.get("role") == "user"), "")
        script = next((s for key, s in self.scripts.items() if key in first_user), None)
        turn_index = sum(m.get("role") == "assistant" for m in messages)
        if script is None or turn_index >= len(script.turns):
            return web.json_response({"error": {"message": f"no scripted turn {turn_index} for this prompt"}}, status=400)
        turn = script.turns[turn_index]
        last_tool = next((m.get("content", "") for m in reversed(messages) if m.get("role") == "tool"), "")
        content = turn.content.replace("{tool}", last_tool.strip())
        tool_calls: list[dict[str, Any]] = []
        if script.mode == "hermes":
            blocks = [f'<tool_call>\n{{"name": "{c.name}", "arguments": {c.arguments}}}\n</tool_call>' for c in turn.calls]
            content = turn.raw if turn.raw is not None else "\n".join([content, *blocks]).strip()
            completion_tokens = count_tokens(content)
        else:
            tool_calls = [
                {"id": f"chatcmpl-tool-{len(self.requests)}-{i}", "type": "function",
                 "function": {"name": c.name, "arguments": c.arguments}}
                for i, c in enumerate(turn.calls)
            ]
            completion_tokens = count_tokens(content) + sum(count_tokens(c.arguments) for c in turn.calls)
        finish_reason = "tool_calls" if tool_calls else "stop"
        max_tokens = body.get("max_tokens")
        if isinstance(max_tokens, int) and completion_tokens > max_tokens:
            text = content + " " + " ".join(c.arguments for c in turn.calls) if tool_calls else content
            content, tool_calls = " ".join(text.split()[:max_tokens]), []
            completion_tokens, finish_reason = max_tokens, "length"
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if tool_calls:
            message["tool_calls"] = tool_calls
        return web.json_response({
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "model": body.get("model", MODEL_NAME),
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
            "usage": {
                "prompt_tokens": (prompt_tokens := _prompt_tokens(messages)),
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        })


def _prompt_tokens(messages: list[dict[str, Any]]) -> int:
    total = 0
    for m in messages:
        total += MESSAGE_OVERHEAD_TOKENS + count_tokens(str(m.get("content") or ""))
        for call in m.get("tool_calls") or []:
            total += count_tokens(str(call.get("function", {}).get("arguments", "")))
    return total


def _check_tool_results(messages: list[dict[str, Any]]) -> Optional[str]:
    """OpenAI's rule: every tool call id of an assistant message is answered by a tool message."""
    answered = {m.get("tool_call_id") for m in messages if m.get("role") == "tool"}
    for m in messages:
        for call in m.get("tool_calls") or []:
            if call.get("id") not in answered:
                return f"tool call {call.get('id')!r} has no tool message with that tool_call_id"
    return None
