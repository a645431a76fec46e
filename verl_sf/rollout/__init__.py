"""Multi-turn tool rollouts against an OpenAI-compatible model server (sglang, vLLM).

    from verl_sf.rollout import ChatClient, RolloutConfig, ToolRunner, load_samples, load_tools, run_rollouts

    samples = load_samples("test.parquet")
    runner = ToolRunner(load_tools("tool_config.yaml"), max_tool_response_length=256)
    async with ChatClient("http://127.0.0.1:30000") as client:
        result = await run_rollouts(samples, client, runner, RolloutConfig(n=4), reward_fn=compute_score)
    write_rollout_dump(result.trajectories, "rollouts", step=0)

`verl-sf rollout` (verl_sf.rollout.cli) does the same from the command line.
"""

from verl_sf.rollout.client import ChatClient, Completion, ModelServerError
from verl_sf.rollout.data import DatasetError, Sample, load_samples
from verl_sf.rollout.driver import RolloutConfig, RolloutResult, StopReason, Trajectory, run_rollouts, run_trajectory
from verl_sf.rollout.dump import write_rollout_dump
from verl_sf.rollout.parsing import ToolCall, parse_hermes, parse_openai_tool_calls
from verl_sf.rollout.summary import RolloutSummary
from verl_sf.rollout.tools import ErrorKind, ToolCallRecord, ToolConfigLoadError, ToolRunner, load_tools, truncate_tool_text

__all__ = [
    "ChatClient", "Completion", "DatasetError", "ErrorKind", "ModelServerError", "RolloutConfig", "RolloutResult",
    "RolloutSummary", "Sample", "StopReason", "ToolCall", "ToolCallRecord", "ToolConfigLoadError", "ToolRunner",
    "Trajectory", "load_samples", "load_tools", "parse_hermes", "parse_openai_tool_calls", "run_rollouts",
    "run_trajectory", "truncate_tool_text", "write_rollout_dump",
]
