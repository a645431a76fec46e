"""Multi-turn tool rollouts against an OpenAI-compatible model server (sglang, vLLM).

    from verl_sf.rewards import compute_score
    from verl_sf.rollout import (ChatClient, RolloutConfig, RolloutSummary, ToolRunner, load_samples,
                                 load_tools, run_rollouts, write_rollout_dump)

    samples = load_samples("test.parquet")                      # verl-format prompts
    config = RolloutConfig(n=4, max_turns=5)
    runner = ToolRunner(load_tools("tool_config.yaml"), config.max_tool_response_length)
    async with ChatClient("http://127.0.0.1:30000") as client:
        result = await run_rollouts(samples, client, runner, config, reward_fn=compute_score)
    await runner.close()
    print(RolloutSummary.of(result.trajectories, result.wall_seconds).format())
    write_rollout_dump(result.trajectories, "rollouts", step=0)  # rollouts/0.jsonl, verl's format

`verl-sf rollout` (verl_sf.rollout.cli) does the same from the command line.
"""

from verl_sf.rollout.client import ChatClient, Completion, ModelServerError
from verl_sf.rollout.data import DatasetError, Sample, load_samples
from verl_sf.rollout.driver import RolloutConfig, RolloutResult, StopReason, Trajectory, run_rollouts, run_trajectory
from verl_sf.rollout.dump import write_rollout_dump
from verl_sf.rollout.parsing import ToolCall, parse_hermes, parse_openai_tool_calls
from verl_sf.rollout.summary import RolloutSummary
from verl_sf.rollout.tools import (
    ErrorKind,
    ToolCallRecord,
    ToolConfigLoadError,
    ToolRunner,
    load_tools,
    truncate_tool_text,
)

__all__ = [
    "ChatClient", "Completion", "DatasetError", "ErrorKind", "ModelServerError", "RolloutConfig", "RolloutResult",
    "RolloutSummary", "Sample", "StopReason", "ToolCall", "ToolCallRecord", "ToolConfigLoadError", "ToolRunner",
    "Trajectory", "load_samples", "load_tools", "parse_hermes", "parse_openai_tool_calls", "run_rollouts",
    "run_trajectory", "truncate_tool_text", "write_rollout_dump",
]
