"""Settings of the E2B-compatible API (`verl-sf serve --e2b-api-key`, or library users), and what
every API on its boxes shares (the Daytona API's settings extend them)."""

from __future__ import annotations

import dataclasses
from typing import Optional

ENVD_PORT, JUPYTER_PORT = "49983", "49999"  # a sandbox's ports, named by the SDK's `E2b-Sandbox-Port`


@dataclasses.dataclass
class BoxApiConfig:
    api_key: Optional[str] = None
    """The only API key control-plane calls may carry (X-API-Key); None: any non-empty key, each a
    tenant of its own (a sandbox is its creating key's: verl_sf.tenancy)."""
    command_poll_s: float = 0.2
    """How long one poll of a running command holds the sandbox (other calls wait at most this)."""
    reap_interval_s: float = 0.5
    """How often sandboxes are looked at for their end (timeout, auto-stop, auto-delete)."""
    ready_sandboxes: int = 2
    """Sandboxes kept started ahead of the creates that take them (verl_sf/e2b/ready.py), once a
    create has asked for one; 0: every create starts its own."""
    ready_ttl_s: float = 300.0
    """How long a ready sandbox waits for a create before it is ended."""
    id_prefix: str = ""
    """What names the executor a sandbox id belongs to: a fleet server's `n{node}-` (`verl-sf cluster`),
    then front i's `f{i}-` (`--fronts N`); every call on an id is routed there (verl_sf/e2b/routing.py,
    verl_sf/daytona/routing.py)."""


@dataclasses.dataclass
class E2BConfig(BoxApiConfig):
    max_sandboxes: int = 256
    """Live sandboxes at once (each is one session, counted in the executor's max_sessions too);
    past it, creation answers 429."""
    max_sandboxes_per_key: Optional[int] = None
    """Live sandboxes of one API key at once; None: a key may take all of `max_sandboxes`."""
    default_timeout_s: int = 300
    """A sandbox's lifetime when the create call names none (E2B's default)."""
    execute_timeout_s: float = 300.0
    """Longest a `run_code` may run (the SDK's own default timeout); it is then interrupted."""
