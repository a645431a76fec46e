class VerlSfError(Exception):
    """Base of every error verl-sf raises."""
