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
