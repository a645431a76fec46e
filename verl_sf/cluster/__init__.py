"""A Ray-placed fleet of sandbox servers: one per node, found and supervised through Ray."""

from verl_sf.cluster.names import DEFAULT_NAMESPACE

__all__ = ["DEFAULT_NAMESPACE"]
