"""A small OpenAI chat-completions client for the model server (sglang, vLLM, ...).

One aiohttp session and one semaphore bound the requests in flight, however many
trajectories are running: that cap is what protects the model server. Transient failures
(connection errors, time-outs, 429 and 5xx) are retried with back-off; anything else is a
`ModelServerError` that names what the server said.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Optional

import aiohttp

from verl_sf.errors import VerlSfError


class ModelServerError(VerlSfError, RuntimeError):
    """The model server could not give a usable completion (after retries)."""


@dataclasses.dataclass
class Completion:
    """The parts of one chat completion the driver needs."""

    content: str
    tool_calls: list[Any]  # raw `tool_calls` entries; empty when the server returned plain text
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int


def api_base(url: str) -> str:
    """Accept `http://host:port`, `.../v1` or `.../v1/chat/completions`; return `.../v1`."""
    base = url.rstrip("/")
    for suffix in ("/chat/completions", "/v1"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
    if not base.startswith(("http://", "https://")):
        raise ValueError(f"model server URL must start with http:// or https://, got {url!r}")
    return base + "/v1"


class ChatClient:
    """Chat completions against `{server}/v1/chat/completions` with bounded concurrency."""

    def __init__(
        self,
        server_url: str,
        model: Optional[str] = None,
        concurrency: int = 64,
        request_timeout: float = 600.0,
        max_retries: int = 3,
        sampling: Optional[dict[str, Any]] = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.base = api_base(server_url)
        self.model = model
        self.concurrency = concurrency
        self.max_retries = max_retries
        self.sampling = dict(sampling or {})
        self._timeout = aiohttp.ClientTimeout(total=request_timeout)
        self._semaphore = asyncio.Semaphore(concurrency)
        self._session: Optional[aiohttp.ClientSession] = None

    async def __aenter__(self) -> ChatClient:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self.concurrency), timeout=self._timeout
        )
        if self.model is None:
            try:
                self.model = await self._first_model()
            except BaseException:
                await self.__aexit__(None, None, None)
                raise
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _first_model(self) -> str:
        """The served model's name, so users need not repeat what the server already knows."""
        body = await self._request("GET", "/models")
        models = body.get("data") if isinstance(body, dict) else None
        if not models or not isinstance(models[0], dict) or "id" not in models[0]:
            raise ModelServerError(f"{self.base}/models lists no model; pass --model")
        return str(models[0]["id"])

    async def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                       max_tokens: int) -> Completion:
        payload: dict[str, Any] = {**self.sampling, "model": self.model, "messages": messages, "max_tokens": max_tokens}
        if tools:
            payload["tools"] = tools
        async with self._semaphore:
            body = await self._request("POST", "/chat/completions", payload)
        return _read_completion(body)

    async def _request(self, method: str, path: str, payload: Optional[dict[str, Any]] = None) -> Any:
        assert self._session is not None, "use `async with ChatClient(...)`"
        url = self.base + path
        last_error = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                await asyncio.sleep(min(0.5 * 2 ** (attempt - 1), 8.0))
            try:
                async with self._session.request(method, url, json=payload) as resp:
                    text = await resp.text()
                    if resp.status == 200:
                        try:
                            return await resp.json(content_type=None)
                        except ValueError:
                            raise ModelServerError(
                                f"{url} answered 200 with a body that is not JSON: {text[:200]!r}") from None
                    last_error = f"{url} answered HTTP {resp.status}: {text[:500]}"
                    if resp.status != 429 and resp.status < 500:
                        raise ModelServerError(last_error)
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                last_error = f"{url}: {type(exc).__name__}: {exc}"
        raise ModelServerError(f"{last_error} (after {self.max_retries + 1} attempts)")


def _read_completion(body: Any) -> Completion:
    try:
        choice = body["choices"][0]
        message = choice["message"]
        usage = body["usage"]
        prompt_tokens, completion_tokens = int(usage["prompt_tokens"]), int(usage["completion_tokens"])
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise ModelServerError(
            "chat completion lacks choices[0].message or usage.prompt_tokens/completion_tokens "
            f"(needed for the response-length budget): {exc!r} in {str(body)[:300]}"
        ) from None
    return Completion(
        content=message.get("content") or "",
        tool_calls=list(message.get("tool_calls") or []),
        finish_reason=str(choice.get("finish_reason") or "stop"),
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
    )
