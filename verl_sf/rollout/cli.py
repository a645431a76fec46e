"""`verl-sf rollout`: multi-turn tool rollouts against a running model server, no trainer.

    verl-sf rollout --server http://127.0.0.1:30000 --data test.parquet \\
        --tool-config configs/sandbox_fusion_tool_config.yaml --n 4 --max-turns 5 \\
        --rollout-data-dir rollouts/ [--model NAME] [--reward gsm8k]

Exit status: 0 when every trajectory completed, 1 when some failed (model server or reward;
they are still dumped and counted), 2 for bad input (a message names what was wrong).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any, Optional

from verl_sf.backends.base import SessionsUnsupported
from verl_sf.rollout.client import ChatClient, ModelServerError
from verl_sf.rollout.data import DatasetError, load_samples
from verl_sf.rollout.driver import RewardFn, RolloutConfig, run_rollouts
from verl_sf.rollout.dump import write_rollout_dump
from verl_sf.rollout.summary import RolloutSummary
from verl_sf.rollout.tools import TRUNCATE_SIDES, ToolConfigLoadError, ToolRunner, load_tools


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", required=True, help="model server base URL (OpenAI-compatible, e.g. sglang/vLLM)")
    parser.add_argument("--data", required=True, help="verl-format prompts (.parquet or .jsonl)")
    parser.add_argument("--tool-config", help="verl tool-config yaml (omit for single-turn, tool-free rollouts)")
    parser.add_argument("--session", choices=["none", "trajectory"],
                        help="trajectory: the calls of one trajectory share a live interpreter (sets the tool "
                             "config's `session`; default: the tool config's, else stateless)")
    parser.add_argument("--n", type=int, default=1, help="trajectories per prompt (rollout.n)")
    parser.add_argument("--max-turns", type=int, default=5, help="assistant turns per trajectory (max_assistant_turns)")
    parser.add_argument("--rollout-data-dir", help="write {dir}/{step}.jsonl in verl's rollout-dump format")
    parser.add_argument("--step", type=int, default=0, help="step number for the dump file name and 'step' field")
    parser.add_argument("--model", help="model name for requests (default: the first of the server's /v1/models)")
    parser.add_argument("--reward", default="auto", choices=["auto", "gsm8k", "math", "none"],
                        help="scorer: by data_source (auto), a fixed one, or none")
    parser.add_argument("--response-length", type=int, default=2048,
                        help="token budget after the prompt, tool turns included (data.max_response_length)")
    parser.add_argument("--max-tokens-per-turn", type=int, help="cap on one assistant turn (default: the budget left)")
    parser.add_argument("--max-parallel-calls", type=int, default=1, help="tool calls run per turn (verl's default 1)")
    parser.add_argument("--max-tool-response-length", type=int, default=256,
                        help="characters of a tool response the model reads (verl's default 256)")
    parser.add_argument("--tool-response-truncate-side", default="middle", choices=TRUNCATE_SIDES)
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight to the model server")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--extra-body", default="{}", help="JSON merged into each request, e.g. "
                        '\'{"chat_template_kwargs": {"enable_thinking": false}}\'')
    parser.add_argument("--request-timeout", type=float, default=600.0, help="seconds per model request")
    parser.add_argument("--limit", type=int, help="use only the first N prompts")
    parser.add_argument("--ray-address",
                        help="join a Ray cluster first ('auto', host:port, or 'local' to start one), so tools "
                             "use the Ray execution pool and its cluster-wide rate limit (default with a "
                             "`backend: cluster` tool: RAY_ADDRESS, else auto)")
    parser.add_argument("--ray-namespace",
                        help="Ray namespace to join: the limiter is shared by the pools of one namespace")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _uses_cluster(tool_config: str) -> bool:
    """A tool on `backend: cluster` finds its servers through Ray, so the rollout joins Ray before
    building tools (their pools then take permits from the cluster-wide limiter)."""
    import yaml

    try:
        with open(tool_config) as f:
            tools = (yaml.safe_load(f) or {}).get("tools") or []
    except (OSError, yaml.YAMLError, AttributeError):
        return False  # load_tools reports what is wrong with the file
    return any(isinstance(t, dict) and (t.get("config") or {}).get("backend") == "cluster" for t in tools)


def _cluster_address() -> str:
    """As `verl-sf cluster` and Ray's own commands: RAY_ADDRESS, else the local cluster (`auto`)."""
    return os.environ.get("RAY_ADDRESS") or "auto"


def _reward_fn(name: str) -> Optional[RewardFn]:
    from verl_sf.rewards import SCORERS, compute_score

    if name == "none":
        return None
    if name == "auto":
        return compute_score
    scorer = SCORERS[name]
    return lambda data_source, solution_str, ground_truth, extra_info=None, **kwargs: scorer(solution_str, ground_truth)


def _check_reward(name: str, data_sources: set[str]) -> None:
    """Fail before any request when `auto` has no scorer for a data_source in the file."""
    from verl_sf.rewards import scorer_for

    if name == "auto":
        for source in sorted(data_sources):
            scorer_for(source)


async def _run(args: argparse.Namespace) -> int:
    samples = load_samples(args.data, limit=args.limit)
    _check_reward(args.reward, {s.data_source for s in samples})
    extra_body = json.loads(args.extra_body)
    if not isinstance(extra_body, dict):
        raise ValueError(f"--extra-body must be a JSON object, got {args.extra_body!r}")
    config = RolloutConfig(
        max_turns=args.max_turns, response_length=args.response_length, max_tokens_per_turn=args.max_tokens_per_turn,
        max_parallel_calls=args.max_parallel_calls, max_tool_response_length=args.max_tool_response_length,
        tool_response_truncate_side=args.tool_response_truncate_side, n=args.n,
    )
    ray_address = args.ray_address or (_cluster_address() if args.tool_config and _uses_cluster(args.tool_config)
                                       else None)
    if ray_address:
        import ray

        ray.init(address=None if ray_address == "local" else ray_address, namespace=args.ray_namespace,
                 include_dashboard=False)
    if args.session and not args.tool_config:
        raise ValueError("--session needs --tool-config (the tools whose calls share a session)")
    overrides = {"session": args.session} if args.session else None
    tools = load_tools(args.tool_config, overrides) if args.tool_config else []
    runner = ToolRunner(tools, config.max_tool_response_length, config.tool_response_truncate_side)
    sampling: dict[str, Any] = {"temperature": args.temperature, "top_p": args.top_p, **extra_body}
    try:
        async with ChatClient(args.server, model=args.model, concurrency=args.concurrency,
                              request_timeout=args.request_timeout, sampling=sampling) as client:
            result = await run_rollouts(samples, client, runner, config, _reward_fn(args.reward),
                                        progress=not args.no_progress)
    finally:
        await runner.close()
    summary = RolloutSummary.of(result.trajectories, result.wall_seconds)
    print(summary.format())
    if args.rollout_data_dir:
        print(f"rollouts: {write_rollout_dump(result.trajectories, args.rollout_data_dir, args.step)}")
    return 1 if summary.failed_trajectories else 0


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_run(args))
    except (DatasetError, ToolConfigLoadError, ModelServerError, SessionsUnsupported, ValueError,
            json.JSONDecodeError) as exc:
        print(f"verl-sf rollout: error: {exc}", file=sys.stderr)
        return 2


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="verl-sf rollout", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
