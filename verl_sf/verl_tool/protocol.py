"""verl-tool's /get_observation wire format: one entry per trajectory, in request order.

verl-tool's agent loop sends `finish` and `is_last_step` as top-level lists next to
`extra_fields`; its server folds them into each entry's extra fields, where a value the entry
already carries wins.  Unknown top-level fields are ignored, as its server does.

A trajectory id alone names a trajectory's state to anyone who sends it, as on verl-tool's
server; the optional `?namespace=` of the URL scopes ids to a client (verl-tool posts to its
configured `tool_server_url` verbatim, query included, so no client code changes).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from verl_sf.models import RunCodeResponse
from verl_sf.verl_tool.parsing import Observation

TrajectoryKey = tuple[str, str]
"""(namespace, trajectory id): what a trajectory's state is kept under."""


class ObservationQuery(BaseModel):
    """The URL's query: unknown parameters are ignored, as unknown body fields are."""

    model_config = ConfigDict(extra="ignore")

    namespace: str = Field("", max_length=256)
    """Scopes the request's trajectory ids: the same id in two namespaces is two trajectories."""


class GetObservationRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    trajectory_ids: list[str] = Field(min_length=1)
    actions: list[str]
    extra_fields: Optional[list[dict[str, Any]]] = None
    finish: Optional[list[bool]] = None
    is_last_step: Optional[list[bool]] = None

    @field_validator("actions", "extra_fields", "finish", "is_last_step")
    @classmethod
    def _one_per_trajectory(cls, value: Optional[list[Any]], info: ValidationInfo) -> Optional[list[Any]]:
        trajectory_ids = info.data.get("trajectory_ids")
        if value is not None and trajectory_ids is not None and len(value) != len(trajectory_ids):
            raise ValueError(f"needs one entry per trajectory id: {len(value)} entries for "
                             f"{len(trajectory_ids)} trajectory_ids")
        return value

    @field_validator("extra_fields")
    @classmethod
    def _stdin_is_text(cls, value: Optional[list[dict[str, Any]]]) -> Optional[list[dict[str, Any]]]:
        for index, extra in enumerate(value or []):
            stdin = extra.get("stdin")
            if stdin is not None and not isinstance(stdin, str):
                raise ValueError(f"extra_fields[{index}].stdin must be a string, got {type(stdin).__name__}")
        return value

    def steps(self, namespace: str = "") -> list[Step]:
        steps = []
        for index, (trajectory_id, action) in enumerate(zip(self.trajectory_ids, self.actions, strict=True)):
            extra = dict(self.extra_fields[index]) if self.extra_fields else {}
            finish = extra.get("finish", self.finish[index] if self.finish else False)
            last = extra.get("is_last_step", self.is_last_step[index] if self.is_last_step else False)
            steps.append(Step(index, trajectory_id, action, extra, bool(finish), bool(last), namespace))
        return steps


@dataclasses.dataclass(frozen=True)
class Step:
    """One trajectory's entry of a batch."""

    index: int
    trajectory_id: str
    action: str
    extra_field: dict[str, Any]
    finish: bool
    """The trajectory has ended: nothing runs, its state goes."""
    is_last_step: bool
    """The action runs, then the trajectory's state goes."""
    namespace: str = ""

    @property
    def key(self) -> TrajectoryKey:
        return self.namespace, self.trajectory_id


@dataclasses.dataclass(frozen=True)
class StepOutcome:
    observation: Observation
    done: bool
    valid: bool
    response: Optional[RunCodeResponse] = None
    """What the sandbox answered, when code of this entry reached one."""
    seconds: float = 0.0
    """From the entry's start to that answer (queue wait included)."""
    refused: bool = False
    """The server was too busy to admit this entry's run; nothing of it ran."""

    @property
    def ran(self) -> bool:
        return self.response is not None


class GetObservationResponse(BaseModel):
    observations: list[Observation]
    dones: list[bool]
    valids: list[bool]
    processing_time_ms: float
