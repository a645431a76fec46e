"""`{rollout_data_dir}/{step}.jsonl` in verl's format (`RayPPOTrainer._write_generations`).

One object per trajectory with `input`, `output`, `gts`, `score`, `step`, then the reward's
extra fields (verl adds those present for every sample) and a few rollout fields verl's
dumps do not have, so readers of verl's dumps read ours and can learn more if they want.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from verl_sf.rollout.driver import Trajectory


def rollout_fields(traj: Trajectory) -> dict[str, Any]:
    """Per-trajectory facts beyond verl's keys."""
    return {
        "data_source": traj.sample.data_source,
        "uid": traj.uid,
        "request_id": traj.request_id,
        "num_turns": traj.num_turns,
        "num_tool_calls": len(traj.tool_calls),
        "stop_reason": traj.stop_reason,
        "error": traj.error,
        "response_tokens": traj.response_tokens,
        "tool_calls": [
            {"name": r.name, "error_kind": r.error_kind, "seconds": round(r.seconds, 4), "truncated": r.truncated}
            for r in traj.tool_calls
        ],
        "messages": traj.messages,
    }


def write_rollout_dump(trajectories: Sequence[Trajectory], rollout_data_dir: str, step: int) -> str:
    """Write the dump file and return its path."""
    os.makedirs(rollout_data_dir, exist_ok=True)
    path = os.path.join(rollout_data_dir, f"{step}.jsonl")
    shared_extra = set.intersection(*(set(t.reward_extra) for t in trajectories)) if trajectories else set()
    with open(path, "w") as f:
        for traj in trajectories:
            entry = {
                "input": traj.input_text,
                "output": traj.output_text,
                "gts": traj.sample.ground_truth,
                "score": traj.score,
                "step": step,
            }
            # Dict order follows the reward's, as in verl (where a "score" extra overwrites the same value).
            entry.update({k: v for k, v in traj.reward_extra.items() if k in shared_extra})
            entry.update(rollout_fields(traj))
            f.write(json.dumps(entry, ensure_ascii=False, default=str) + "\n")
    return path
