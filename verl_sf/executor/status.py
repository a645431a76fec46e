"""What an executor reports of itself: one snapshot that `/health`, `/metrics` and (through
`/health`) `verl-sf cluster status` read, so none of them reaches into the executor's parts."""

from __future__ import annotations

import dataclasses
from typing import Union

from verl_sf.models import RunCodeResponse, RunJupyterResponse


@dataclasses.dataclass
class ExecutorStats:
    """Counts the executor keeps as it works (Prometheus counters)."""

    in_flight: int = 0
    rejected: int = 0
    cancelled: int = 0
    cpu_starved: int = 0
    sessions_created: int = 0
    sessions_expired: int = 0
    sessions_killed: int = 0

    def count(self, response: Union[RunCodeResponse, RunJupyterResponse]) -> None:
        """Count what a response says of its runs (now: whether they were starved of CPU)."""
        results = [getattr(response, "run_result", None), getattr(response, "driver", None)]
        self.cpu_starved += sum(1 for result in results if result is not None and result.cpu_starved)


@dataclasses.dataclass(frozen=True)
class ExecutorStatus:
    faults: dict[str, str]  # sandboxes whose reply reader failed, by name: not healthy until they answer again
    isolation: str  # the rung's name
    cgroups: str  # "on", "off", or why they are not writable
    fast_path: bool
    preloaded: list[str]  # heavy libraries served from warm interpreters
    warm_interpreters: dict[str, int]  # running ones by flavor
    languages: list[str]
    missing_languages: dict[str, str]  # each language this server cannot run, and why
    limits: dict[str, str]  # how each cap is enforced here
    slots: int
    sandboxes: int
    in_flight: int
    queued: int  # runs waiting for a CPU slot
    gpus: dict[str, object]
    max_in_flight: int
    sessions: int
    max_sessions: int
    snapshots: int
    max_snapshots: int
    counts: ExecutorStats  # a copy, as of the snapshot

    def health(self) -> dict[str, object]:
        """The fields `/health` shows, in its order (the counts go to `/metrics`)."""
        shown = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        del shown["faults"], shown["counts"]
        return shown
