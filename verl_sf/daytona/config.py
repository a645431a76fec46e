"""Settings of the Daytona-compatible API (`verl-sf serve --daytona-api-key`, or library users)."""

from __future__ import annotations

import dataclasses

from verl_sf.e2b.config import BoxApiConfig


@dataclasses.dataclass
class DaytonaConfig(BoxApiConfig):
    """`api_key` is sent as `Authorization: Bearer`; without one every key is its own tenant."""

    max_sandboxes: int = 512
    """Started sandboxes at once (each is one session, counted in the executor's max_sessions too);
    past it, creation answers 503 with Retry-After.  The TRL guide's pool is 500."""
    auto_stop_min: int = 15
    """Minutes without activity after which a sandbox stops, when its creation names none (Daytona's)."""
    run_timeout_s: float = 600.0
    """Longest a code run or command may take when its call names no timeout (the SDK's own default)."""
    minute_s: float = 60.0
    """Seconds in a minute of the auto-stop and auto-delete intervals (`--daytona-minute-s`; tests shorten it)."""
