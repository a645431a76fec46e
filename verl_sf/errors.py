"""The common base of verl-sf's exceptions, the ones every layer shares, and `ANSWERS`: the one
table of what the server answers for each of them (HTTP status, a machine-readable `code`, and
whether a client should come back later)."""

import dataclasses
from typing import Optional


class VerlSfError(Exception):
    """Base of every error verl-sf raises (but for the code that runs inside the sandbox, which has
    only the standard library: the zygote package and the reward harness's sandbox side)."""


class InputError(VerlSfError, ValueError):
    """The request itself is wrong: a field, a body, a cursor, a language, source that cannot be
    placed.  A 4xx; sending it again cannot help."""


class NotFoundError(VerlSfError, LookupError):
    """What the request named does not exist (any more): a session, a snapshot, a sandbox.  A 404."""


class ConflictError(VerlSfError, RuntimeError):
    """What the request named exists, but its state forbids this now (busy, stopped, a name taken).  A 409."""


class CapacityError(VerlSfError, RuntimeError):
    """A cap of the server's is reached (slots, sessions, sandboxes): try again later or elsewhere.  A 429 or 503."""


class SandboxFailure(VerlSfError, RuntimeError):
    """The sandbox failed to do what was asked, through no fault of the request or the code.  A 5xx."""


class SessionGone(NotFoundError):
    """The session a call named no longer exists (ended, expired, evicted, killed, or its server died or restarted).

    Its state is gone; `reason` says why.  Every layer raises this one type (executor, backends,
    verl-tool routes), so a caller catches one thing whichever layer found out.
    """

    def __init__(self, session_id: str, reason: str):
        super().__init__(f"session {session_id!r} is gone: {reason}")
        self.session_id = session_id
        self.reason = reason

    def __reduce__(self) -> tuple[type, tuple[str, str]]:  # crosses Ray and process pools intact
        return type(self), (self.session_id, self.reason)


class SnapshotGone(NotFoundError):
    """The snapshot a request named does not exist (deleted, expired, or its server restarted)."""

    def __init__(self, snapshot_id: str, reason: str):
        super().__init__(f"snapshot {snapshot_id!r} is gone: {reason}")
        self.snapshot_id = snapshot_id
        self.reason = reason

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return type(self), (self.snapshot_id, self.reason)


class SessionBusy(ConflictError):
    """The session cannot be forked or snapshotted now (a call is running, or it runs threads or
    background processes that a fork would not copy); `reason` says which.  HTTP 409."""

    def __init__(self, session_id: str, reason: str):
        super().__init__(f"session {session_id!r} cannot be forked now: {reason}")
        self.session_id = session_id
        self.reason = reason

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return type(self), (self.session_id, self.reason)


class ForkUnavailable(VerlSfError, RuntimeError):
    """This server cannot fork sessions (its isolation rung or architecture lacks what a fork needs).  HTTP 501."""


class ForkFailed(SandboxFailure):
    """The sandbox could not make the copies (not the session's doing); none is left behind.  HTTP 500."""


class Overloaded(CapacityError):
    """Too many runs in flight; the HTTP layer turns this into 503 + Retry-After."""


class InvalidRequest(InputError):
    """A request that is well-formed but cannot be served as asked; `field` names the culprit."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return type(self), (self.field, str(self))


@dataclasses.dataclass(frozen=True)
class Answer:
    """What the server answers for an error: its HTTP status, the `code` its JSON body carries (and
    the Prometheus reason it is counted under), and whether it says Retry-After."""

    status: int
    code: str
    retry_after: bool = False

    def headers(self, retry_after_s: int) -> Optional[dict[str, str]]:
        """The headers it carries: Retry-After, where it says to come back, after the server's setting."""
        return {"Retry-After": str(retry_after_s)} if self.retry_after else None


ANSWERS: dict[type[VerlSfError], Answer] = {
    SessionGone: Answer(404, "session_not_found"),
    SnapshotGone: Answer(404, "snapshot_not_found"),
    NotFoundError: Answer(404, "not_found"),
    SessionBusy: Answer(409, "session_busy"),
    ConflictError: Answer(409, "conflict"),
    Overloaded: Answer(503, "overloaded", retry_after=True),
    CapacityError: Answer(503, "at_capacity", retry_after=True),
    ForkUnavailable: Answer(501, "fork_unavailable"),
    ForkFailed: Answer(500, "fork_failed"),
    SandboxFailure: Answer(500, "sandbox_failure"),
    InvalidRequest: Answer(400, "invalid"),
    InputError: Answer(400, "bad_request"),
}
"""Looked up along an error's MRO: the most specific entry answers."""


def answer_for(exc: BaseException) -> Optional[Answer]:
    """The table's answer for `exc`, or None for an error the table does not know."""
    for kind in type(exc).__mro__:
        answer = ANSWERS.get(kind)
        if answer is not None:
            return answer
    return None


def answer_of(exc: VerlSfError) -> Answer:
    """The table's answer for one of the package's errors (every one has one: errors.py's bases do)."""
    answer = answer_for(exc)
    if answer is None:
        raise LookupError(f"{type(exc).__name__} has no answer in errors.ANSWERS")
    return answer


def error_of(code: str, reason: str, *, session_id: str = "", snapshot_id: str = "",
             field: str = "") -> Optional[VerlSfError]:
    """The error a server answered with `code` (its body's), `reason` and `field`, rebuilt as the
    type it raised (for the session or snapshot the caller named); None where the code cannot be."""
    if code == "invalid" and field:
        return InvalidRequest(field, reason)
    if code == "fork_failed":
        return ForkFailed(reason)
    if code == "session_not_found" and session_id:
        return SessionGone(session_id, reason)
    if code == "snapshot_not_found" and snapshot_id:
        return SnapshotGone(snapshot_id, reason)
    if code == "session_busy" and (session_id or snapshot_id):
        return SessionBusy(session_id or snapshot_id, reason)
    return None
