"""Settings of the E2B-compatible API (`verl-sf serve --e2b-api-key`, or library users)."""

from __future__ import annotations

import dataclasses
from typing import Optional


@dataclasses.dataclass
class E2BConfig:
    api_key: Optional[str] = None
    """The API key control-plane calls must carry (X-API-Key); None: any non-empty key."""
    max_sandboxes: int = 256
    """Live sandboxes at once (each is one session, counted in the executor's max_sessions too);
    past it, creation answers 429."""
    default_timeout_s: int = 300
    """A sandbox's lifetime when the create call names none (E2B's default)."""
    execute_timeout_s: float = 300.0
    """Longest a `run_code` may run (the SDK's own default timeout); it is then interrupted."""
    command_poll_s: float = 0.2
    """How long one poll of a running command holds the sandbox (other calls wait at most this)."""
    reap_interval_s: float = 0.5
    """How often sandboxes past their timeout are looked for."""
    id_prefix: str = ""
    """Under `--fronts N`, front i's `f{i}-`: a sandbox id names the front whose executor holds it,
    and the fronts route every call on an id there (verl_sf/e2b/fronts.py)."""
