"""Settings of the Daytona-compatible API (`verl-sf serve --daytona-api-key`, or library users)."""

from __future__ import annotations

import dataclasses
from typing import Optional


@dataclasses.dataclass
class DaytonaConfig:
    api_key: Optional[str] = None
    """The key every call must carry (`Authorization: Bearer`); None: any non-empty key, each its own tenant."""
    max_sandboxes: int = 512
    """Started sandboxes at once (each is one session, counted in the executor's max_sessions too);
    past it, creation answers 503 with Retry-After.  The TRL guide's pool is 500."""
    auto_stop_min: int = 15
    """Minutes without activity after which a sandbox stops, when its creation names none (Daytona's)."""
    run_timeout_s: float = 600.0
    """Longest a code run or command may take when its call names no timeout (the SDK's own default)."""
    command_poll_s: float = 0.2
    """How long one poll of a running command holds the sandbox (its other calls wait at most this)."""
    minute_s: float = 60.0
    """Seconds in a minute of the auto-stop and auto-delete intervals (`--daytona-minute-s`; tests shorten it)."""
    reap_interval_s: float = 0.5
    """How often sandboxes are checked for auto-stop and auto-delete."""
    id_prefix: str = ""
    """Under `--fronts N`, front i's `f{i}-`: a sandbox id names the front whose executor holds it,
    and the fronts route every call on an id there (verl_sf/daytona/fronts.py)."""
