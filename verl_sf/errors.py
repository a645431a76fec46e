"""The base of every error verl-sf raises, so callers can catch ours apart from everyone else's."""


class VerlSfError(Exception):
    """Base of every error verl-sf raises."""
