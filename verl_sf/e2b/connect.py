"""The Connect protocol in its JSON form, as envd speaks it to the E2B SDK (connectrpc's client).

Unary calls: a JSON body in, a JSON body out; an error is an HTTP status with
`{"code": "not_found", "message": ...}`.  Server streams (`application/connect+json`): each
message framed as one flag byte and a 4-byte big-endian length; the last frame (flag 0x02)
carries `{}` or `{"error": {...}}`.
"""

from __future__ import annotations

import json
import struct
from typing import Any, Optional

from aiohttp import web

from verl_sf.errors import VerlSfError
from verl_sf.json_body import JsonBodyError, load_json_off_loop

END_STREAM = 0x02
COMPRESSED = 0x01
STREAM_CONTENT_TYPE = "application/connect+json"
HTTP_STATUS = {
    "canceled": 499, "unknown": 500, "invalid_argument": 400, "deadline_exceeded": 504, "not_found": 404,
    "already_exists": 409, "permission_denied": 403, "resource_exhausted": 429, "failed_precondition": 400,
    "aborted": 409, "out_of_range": 400, "unimplemented": 501, "internal": 500, "unavailable": 503,
    "data_loss": 500, "unauthenticated": 401,
}


class ConnectError(VerlSfError):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code if code in HTTP_STATUS else "internal"
        self.message = message

    def body(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


def unary_error(error: ConnectError) -> web.Response:
    return web.json_response(error.body(), status=HTTP_STATUS[error.code])


def frame(payload: Any, flags: int = 0) -> bytes:
    data = json.dumps(payload, separators=(",", ":")).encode()
    return struct.pack(">BI", flags, len(data)) + data


def end_frame(error: Optional[ConnectError] = None) -> bytes:
    return frame({"error": error.body()} if error else {}, END_STREAM)


def timeout_s(request: web.Request) -> Optional[float]:
    """The call's deadline from `Connect-Timeout-Ms`, in seconds (None: none given)."""
    raw = request.headers.get("Connect-Timeout-Ms")
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 10:
        raise ConnectError("invalid_argument", f"Connect-Timeout-Ms must be a positive integer, got {raw!r}")
    return max(int(raw), 1) / 1000


async def unary_message(request: web.Request) -> dict[str, Any]:
    return await _object(await request.read())


async def stream_message(request: web.Request) -> dict[str, Any]:
    """The one request message of a server-streaming call (its first frame)."""
    raw = await request.read()
    if request.content_type != STREAM_CONTENT_TYPE:
        raise ConnectError("invalid_argument", f"a streaming call takes Content-Type {STREAM_CONTENT_TYPE} "
                                               f"(one enveloped frame), not {request.content_type}")
    if len(raw) < 5:
        raise ConnectError("invalid_argument", "the request is not a Connect stream frame")
    flags, length = struct.unpack(">BI", raw[:5])
    if flags & COMPRESSED:
        raise ConnectError("unimplemented", "compressed frames are not supported")
    if len(raw) < 5 + length:
        raise ConnectError("invalid_argument", "the request's frame is cut short")
    return await _object(raw[5:5 + length])


async def _object(raw: bytes) -> dict[str, Any]:
    try:
        body = await load_json_off_loop(raw or b"{}")
    except JsonBodyError as exc:
        raise ConnectError("invalid_argument", str(exc)) from None
    if not isinstance(body, dict):
        raise ConnectError("invalid_argument", "the request must be a JSON object")
    return body
