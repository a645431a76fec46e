"""What a rollout run did, in numbers a person reads at the end of a run."""

from __future__ import annotations

import collections
import dataclasses
import statistics
from collections.abc import Sequence

from verl_sf.rollout.driver import Trajectory


@dataclasses.dataclass
class RolloutSummary:
    trajectories: int
    prompts: int
    accuracy: float  # share of trajectories with score > 0
    mean_score: float
    mean_turns: float  # assistant turns per trajectory
    max_turns: int
    mean_tool_calls: float
    max_tool_calls: int
    tool_time_share: float  # time in tool calls / time in trajectories
    model_time_share: float
    wall_seconds: float
    stop_reasons: dict[str, int]
    tool_errors: dict[str, int]  # error kind (or the tool's status metric) -> calls
    truncated_tool_responses: int
    dropped_calls: int
    failed_trajectories: int  # model-server or reward failures (see each trajectory's `error`)

    @classmethod
    def of(cls, trajectories: Sequence[Trajectory], wall_seconds: float) -> RolloutSummary:
        if not trajectories:
            raise ValueError("no trajectories to summarise")
        busy = sum(t.wall_seconds for t in trajectories) or 1.0
        turns = [t.assistant_turns for t in trajectories]
        calls = [len(t.tool_calls) for t in trajectories]
        records = [r for t in trajectories for r in t.tool_calls]
        return cls(
            trajectories=len(trajectories),
            prompts=len({t.uid for t in trajectories}),
            accuracy=sum(t.score > 0 for t in trajectories) / len(trajectories),
            mean_score=statistics.fmean(t.score for t in trajectories),
            mean_turns=statistics.fmean(turns),
            max_turns=max(turns),
            mean_tool_calls=statistics.fmean(calls),
            max_tool_calls=max(calls),
            tool_time_share=sum(t.tool_seconds for t in trajectories) / busy,
            model_time_share=sum(t.model_seconds for t in trajectories) / busy,
            wall_seconds=wall_seconds,
            stop_reasons=dict(collections.Counter(t.stop_reason for t in trajectories).most_common()),
            tool_errors=dict(collections.Counter(r.error_kind for r in records if r.error_kind).most_common()),
            truncated_tool_responses=sum(r.truncated for r in records),
            dropped_calls=sum(t.dropped_calls for t in trajectories),
            failed_trajectories=sum(t.error is not None for t in trajectories),
        )

    def format(self) -> str:
        def counts(d: dict[str, int]) -> str:
            return ", ".join(f"{k} {v}" for k, v in d.items()) or "none"

        return "\n".join([
            f"trajectories: {self.trajectories} ({self.prompts} prompts)",
            f"accuracy: {self.accuracy:.4f} (mean score {self.mean_score:.4f})",
            f"assistant turns per trajectory: mean {self.mean_turns:.2f}, max {self.max_turns}",
            f"tool calls per trajectory: mean {self.mean_tool_calls:.2f}, max {self.max_tool_calls}",
            f"wall time: {self.wall_seconds:.1f} s; share of trajectory time in tools {self.tool_time_share:.1%}, "
            f"in the model {self.model_time_share:.1%}",
            f"stop reasons: {counts(self.stop_reasons)}",
            f"tool errors: {counts(self.tool_errors)}",
            f"truncated tool responses: {self.truncated_tool_responses}; calls over max_parallel_calls "
            f"(not run): {self.dropped_calls}; failed trajectories: {self.failed_trajectories}",
        ])
