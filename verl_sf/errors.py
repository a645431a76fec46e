"""The common base of verl-sf's exceptions, so a caller can catch everything the package raises."""


class VerlSfError(Exception):
    """Base of every error verl-sf raises."""
