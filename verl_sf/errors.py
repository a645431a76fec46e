"""The common base of verl-sf's exceptions, and the ones every layer shares."""


class VerlSfError(Exception):
    """Base of every error verl-sf raises."""


class SessionGone(VerlSfError, LookupError):
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


class SnapshotGone(VerlSfError, LookupError):
    """The snapshot a request named does not exist (deleted, expired, or its server restarted)."""

    def __init__(self, snapshot_id: str, reason: str):
        super().__init__(f"snapshot {snapshot_id!r} is gone: {reason}")
        self.snapshot_id = snapshot_id
        self.reason = reason

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return type(self), (self.snapshot_id, self.reason)


class SessionBusy(VerlSfError, RuntimeError):
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
