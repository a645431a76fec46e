"""What every route of the server shares: the app's keys, FastAPI-shaped errors, a JSON body read
in time and parsed to a bounded depth, then validated.

Error bodies follow FastAPI's shape (`{"detail": ...}`) because Sandbox Fusion is a FastAPI app and
its users' tooling already parses that.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any, Optional, TypeVar

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler, Middleware
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError

from verl_sf.byte_budget import BodiesFull, ByteBudget
from verl_sf.errors import answer_of
from verl_sf.executor import Executor
from verl_sf.json_body import JsonBodyError, load_json
from verl_sf.off_loop import OFF_LOOP_BYTES, json_bytes, off_loop, text_size
from verl_sf.sending import answer_in_pieces
from verl_sf.server.connections import TrackedConnection
from verl_sf.server.inflate import BodyTooLarge, UndecodableBody, encoding_of, inflate
from verl_sf.server.metrics import ServerMetrics

if sys.version_info >= (3, 11):
    from asyncio import timeout as deadline
else:  # aiohttp depends on async-timeout below 3.11
    from async_timeout import timeout as deadline

EXECUTOR_KEY = web.AppKey("executor", Executor)
METRICS_KEY = web.AppKey("metrics", ServerMetrics)
INFLATING_AT_ONCE = 1  # compressed bodies inflated at a time: a storm of gzip bombs waits, the CPUs do not
RequestT = TypeVar("RequestT", bound=BaseModel)


def refused(request: web.Request, status: int, code: str, detail: Any,
            headers: Optional[dict[str, str]] = None) -> web.Response:
    """A request refused for what it is (its body, a field), counted under `code` as the Prometheus
    reason and carrying it, as `errors.ANSWERS`' answers do; a 422 also names its first `field`."""
    get_metrics(request).rejections.labels(code).inc()
    body: dict[str, Any] = {"detail": detail, "code": code}
    if isinstance(detail, list) and detail and len(detail[0]["loc"]) > 1:
        body["field"] = str(detail[0]["loc"][1])
    return web.json_response(body, status=status, headers=headers)


async def model_answer(model: BaseModel, status: int = 200) -> web.Response:
    """`model` as a JSON answer, for a middleware to read or rewrite (a front's session ids)."""
    return web.Response(body=await _json_of(model), content_type="application/json", status=status)


async def run_answer(request: web.Request, model: BaseModel) -> web.StreamResponse:
    """A run's answer, which no middleware rewrites: a large one (fetched files, outputs) is sent a
    piece at a time (`answer_in_pieces`)."""
    data = await _json_of(model)
    if len(data) < OFF_LOOP_BYTES:
        return web.Response(body=data, content_type="application/json")
    return await answer_in_pieces(request, data, {"Content-Type": "application/json"})


async def _json_of(model: BaseModel) -> bytes:
    """A large model encoded a piece at a time in a thread (`model_dump_json` held the event loop
    ~75 ms for a 32 MiB file)."""
    body = model.model_dump(mode="json")  # shares the model's strings
    size = text_size(body)
    if size >= OFF_LOOP_BYTES:
        return await off_loop(size, json_bytes, body)
    try:
        return model.model_dump_json().encode()
    except PydanticSerializationError:  # a lone surrogate of the run's (a cell's `\\ud800`): escaped as json.dumps does
        return json_bytes(body)


def validation_detail(exc: ValidationError, where: str = "body") -> list[dict[str, Any]]:
    """FastAPI's 422 entries: `where` is the part of the request (body, query) the fields are in."""
    return [{"loc": [where, *err["loc"]], "msg": err["msg"], "type": err["type"]} for err in exc.errors()]


def get_executor(request: web.Request) -> Executor:
    return request.app[EXECUTOR_KEY]


def get_metrics(request: web.Request) -> ServerMetrics:
    return request.app[METRICS_KEY]


async def parse(request: web.Request, model: type[RequestT]) -> RequestT | web.Response:
    """The body as `model`, or the 400/422 answer naming what is wrong (the body middleware read it)."""
    raw = await request.read()
    try:
        parsed = await off_loop(len(raw), _validated, raw, model)
    except JsonBodyError as exc:
        return refused(request, 400, "malformed", str(exc))
    except ValidationError as exc:
        return refused(request, 422, "invalid", validation_detail(exc))
    if parsed is None:
        return refused(request, 422, "malformed",
                       [{"loc": ["body"], "msg": "request body must be a JSON object", "type": "type_error"}])
    return parsed


def _validated(raw: bytes, model: type[RequestT]) -> RequestT | None:
    """The body as `model`; None when it is JSON but not an object."""
    body = load_json(raw)
    return model.model_validate(body) if isinstance(body, dict) else None


def body_middleware(timeout_s: float, bodies: ByteBudget) -> Middleware:
    """Read every request's whole body before its handler runs: within `timeout_s` of its header
    (else 408 and the connection closes), within the app's size limit (else 413), decodable
    (else 400), and within what `bodies` holds of all requests being answered (else 503 with
    Retry-After: many large bodies queued behind slow answers would otherwise take the server's
    memory).  Until its body is in, a connection counts as waiting, and may be evicted.  A compressed
    body is inflated here, in a thread (the app's runner leaves `Content-Encoding` to us: inflate.py)."""
    inflating = asyncio.Semaphore(INFLATING_AT_ONCE)

    @web.middleware
    async def read_body(request: web.Request, handler: Handler) -> web.StreamResponse:
        connection = TrackedConnection.of(request)
        if connection is not None:
            connection.request_started()
        size = 0
        if request.body_exists:
            early = await _read_body(request, timeout_s, inflating)
            if early is not None:
                return early
            size = len(await request.read())
        try:
            with bodies.hold(size):
                if connection is None:
                    return await handler(request)
                connection.working()
                try:
                    return await handler(request)
                finally:
                    connection.waiting()
        except BodiesFull as exc:
            answer = answer_of(exc)
            return refused(request, answer.status, answer.code, str(exc),
                           answer.headers(request.app["retry_after_s"]))

    return read_body


async def _read_body(request: web.Request, timeout_s: float,
                     inflating: asyncio.Semaphore) -> web.StreamResponse | None:
    limit = request.app["max_body_bytes"]
    too_large = f"request body larger than {limit} bytes"
    if (request.content_length or 0) > limit:  # refused before a byte of it is read
        return refused(request, 413, "body_too_large", too_large)
    try:
        async with deadline(timeout_s):  # not wait_for: its own task turns a client's leaving into an error
            request._read_bytes = await _body_of(request, limit)  # what `request.read()` gives the handler
    except BodyTooLarge:  # chunked: its size shows as it arrives
        # Closed after: the rest is not worth reading.
        return await _answer_and_close(request, refused(request, 413, "body_too_large", too_large))
    except web.RequestPayloadError as exc:  # a broken chunked framing
        reason = getattr(exc.__cause__, "message", None) or str(exc)
        return await _answer_and_close(request, refused(request, 400, "malformed",
                                                        f"request body cannot be read: {reason}"))
    except asyncio.TimeoutError:
        return await _answer_and_close(request, refused(request, 408, "body_timeout", f"request body not received "
                                                        f"within {timeout_s:g} s of its header"))
    encoding = encoding_of(request.headers.get(hdrs.CONTENT_ENCODING, ""))
    if encoding is None:
        return None
    try:
        async with inflating:
            request._read_bytes = await asyncio.to_thread(inflate, await request.read(), encoding, limit)
    except BodyTooLarge:  # a bomb's sender is answered and let go
        return await _answer_and_close(request, refused(request, 413, "body_too_large", too_large))
    except UndecodableBody as exc:
        return refused(request, 400, "malformed", f"request body cannot be read: {exc}")
    return None


async def _body_of(request: web.Request, limit: int) -> bytes:
    """The body as it came, joined in a thread when large: `bytes.join` lets the GIL go past a MiB, where
    aiohttp's own `read()` copies it on the event loop (~40 ms for 50 MB, every other client waiting)."""
    chunks, size = [], 0
    while chunk := await request.content.readany():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"past {limit} bytes")
        chunks.append(chunk)
    return await off_loop(size, b"".join, chunks)


async def _answer_and_close(request: web.Request, answer: web.Response) -> web.Response:
    """Send `answer`, then close the connection: the rest of this body is not worth aiohttp's
    lingering read (a slow client's, one that cannot be decoded, or one that inflates past the limit)."""
    answer.force_close()
    await answer.prepare(request)
    await answer.write_eof()
    request.protocol.force_close()  # what is written still goes out: the transport closes once flushed
    return answer
