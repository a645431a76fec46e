"""Where the fleet lives in Ray: one namespace, one named actor per node, one supervisor.

The names are the registry: `ray.util.list_named_actors` finds the servers, `ray.get_actor`
reaches one, and Ray keeps a name bound to a live (or restarting) actor only.
"""

from __future__ import annotations

DEFAULT_NAMESPACE = "verl-sf-cluster"
SERVER_PREFIX = "verl-sf-server-"
SUPERVISOR_NAME = "verl-sf-supervisor"


def server_name(node_id: str) -> str:
    """The named actor that owns `node_id`'s sandbox server."""
    return SERVER_PREFIX + node_id


def node_of(name: str) -> str:
    """Inverse of `server_name`."""
    return name.removeprefix(SERVER_PREFIX)
