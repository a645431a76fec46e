"""ChatClient: URL forms, retries of transient failures, clear errors for unusable answers."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web

from verl_sf.rollout.client import ChatClient, ModelServerError, api_base

GOOD = {"choices": [{"message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1}}


@pytest.mark.parametrize("url", ["http://h:1", "http://h:1/", "http://h:1/v1", "http://h:1/v1/chat/completions"])
def test_api_base_forms(url: str) -> None:
    assert api_base(url) == "http://h:1/v1"


class Flaky:
    """Answers `statuses` in turn (then 200 with `body`), over real HTTP on 127.0.0.1."""

    def __init__(self, statuses: list[int], body: Any = GOOD) -> None:
        self.statuses, self.body, self.calls = list(statuses), body, 0

    async def __aenter__(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: Any) -> None:
        await self.runner.cleanup()

    async def handle(self, request: web.Request) -> web.Response:
        self.calls += 1
        if self.statuses:
            return web.Response(status=self.statuses.pop(0), text="busy")
        return web.json_response(self.body)


async def test_transient_failures_are_retried() -> None:
    flaky = Flaky([503, 429])
    async with flaky as url, ChatClient(url, model="m", max_retries=2) as client:
        completion = await client.complete([{"role": "user", "content": "x"}], [], 5)
    assert (completion.content, completion.prompt_tokens, completion.completion_tokens) == ("hi", 3, 1)
    assert flaky.calls == 3


async def test_retries_run_out() -> None:
    flaky = Flaky([500, 500])
    async with flaky as url, ChatClient(url, model="m", max_retries=1) as client:
        with pytest.raises(ModelServerError, match=r"HTTP 500: busy \(after 2 attempts\)"):
            await client.complete([], [], 5)


async def test_client_errors_are_not_retried() -> None:
    flaky = Flaky([400])
    async with flaky as url, ChatClient(url, model="m", max_retries=3) as client:
        with pytest.raises(ModelServerError, match="HTTP 400"):
            await client.complete([], [], 5)
    assert flaky.calls == 1


async def test_answer_without_usage_is_an_error() -> None:
    async with Flaky([], body={"choices": [{"message": {"content": "x"}}]}) as url, ChatClient(url, model="m") as client:
        with pytest.raises(ModelServerError, match="usage.prompt_tokens"):
            await client.complete([], [], 5)


def test_bad_settings() -> None:
    with pytest.raises(ValueError, match="concurrency"):
        ChatClient("http://h", concurrency=0)
    with pytest.raises(ValueError, match="http://"):
        ChatClient("h:1")
