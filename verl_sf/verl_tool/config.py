"""Settings of the /get_observation endpoint, filled from `verl-sf serve --verl-tool-*` flags."""

from __future__ import annotations

import dataclasses
import enum

from verl_sf.models import MAX_TIMEOUT_S


class VerlToolState(str, enum.Enum):
    """How a trajectory's earlier turns reach its next one.

    `session`: one live interpreter (a server session) per trajectory; a turn runs only its own code.
    `replay`: verl-tool's own way; every turn re-runs the trajectory's earlier code, silenced, first.
    """

    session = "session"
    replay = "replay"


@dataclasses.dataclass
class VerlToolConfig:
    state: VerlToolState = VerlToolState.session
    run_timeout: float = 10.0
    """Seconds a turn may run: verl-tool's python_code TIMEOUT."""
    idle_ttl_s: float = 600.0
    """A trajectory not heard from for this long loses its state (its session's idle TTL too)."""
    pre_import: bool = True
    """Star-import the standard modules verl-tool's python_code imports before every program."""
    max_observation_chars: int = 100_000
    """Output kept per observation: verl-tool's MAX_OBS_LENGTH."""

    def __post_init__(self) -> None:
        # Checked here, at start-up, rather than failing every turn's run request later.
        if not 0 < self.run_timeout <= MAX_TIMEOUT_S:
            raise ValueError(f"verl-tool run_timeout must be > 0 and <= {MAX_TIMEOUT_S:g} s, got {self.run_timeout!r}")
        if not 0 < self.idle_ttl_s <= MAX_TIMEOUT_S:  # it is each trajectory's session's idle TTL too
            raise ValueError(f"verl-tool idle_ttl_s must be > 0 and <= {MAX_TIMEOUT_S:g} s, got {self.idle_ttl_s!r}")
