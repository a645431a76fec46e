"""The multi-turn loop: model turn -> tool calls -> tool results -> model turn ...

It follows verl's ToolAgentLoop (max assistant turns, response-length budget,
`max_parallel_calls`, tool-response truncation) but talks to a model server over the
OpenAI chat API instead of token ids, so it can evaluate a checkpoint served by sglang or
vLLM, generate data, or load the sandbox with real traffic, all without a trainer.

The response-length budget is counted in the server's own tokens (`usage`): what verl
calls the response is everything after the prompt, i.e. assistant turns plus tool turns,
which is `prompt_tokens + completion_tokens - first_prompt_tokens` of the latest request.
Each turn may generate what is left of the budget as known before the request; the tokens
of the tool turn just appended are only learned from the reply's usage, so a trajectory can
end past the budget by at most that one tool turn (verl, holding the token ids, stops
exactly). A reply whose prompt alone was already over budget is dropped, as verl would
never have generated it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import time
from collections.abc import Callable, Sequence
from typing import Any, Optional

from tqdm.auto import tqdm

from verl_sf.enums import StrEnum
from verl_sf.rollout.client import ChatClient, ModelServerError
from verl_sf.rollout.data import Sample
from verl_sf.rollout.parsing import ToolCall, parse_hermes, parse_openai_tool_calls
from verl_sf.rollout.render import render_prompt, render_response
from verl_sf.rollout.tools import AgentContext, ToolCallRecord, ToolRunner

RewardFn = Callable[..., Any]  # verl's compute_score(data_source, solution_str, ground_truth, extra_info)


class StopReason(StrEnum):
    """Why a trajectory ended (the dump's and the summary's `stop_reason`)."""

    answer = "answer"  # the model replied without calling a tool
    max_turns = "max_turns"  # it still wanted tools after `max_turns` assistant turns
    length = "length"  # the response-length budget ran out (or a turn was cut by it)
    model_error = "model_error"  # the model server failed (after retries); see `error`


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """Per-trajectory limits, named after verl's `actor_rollout_ref.rollout.multi_turn` keys."""

    max_turns: int = 5  # multi_turn.max_assistant_turns
    response_length: int = 2048  # data.max_response_length (tokens after the prompt)
    max_tokens_per_turn: Optional[int] = None  # cap on one assistant turn (default: what is left)
    max_parallel_calls: int = 1  # multi_turn.max_parallel_calls
    max_tool_response_length: int = 256  # multi_turn.max_tool_response_length (characters)
    tool_response_truncate_side: str = "middle"  # multi_turn.tool_response_truncate_side
    n: int = 1  # trajectories per prompt (rollout.n)

    def __post_init__(self) -> None:
        for name in ("max_turns", "response_length", "max_parallel_calls", "max_tool_response_length", "n"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_tokens_per_turn is not None and self.max_tokens_per_turn < 1:
            raise ValueError(f"max_tokens_per_turn must be >= 1, got {self.max_tokens_per_turn}")


@dataclasses.dataclass
class Trajectory:
    sample: Sample
    uid: str  # one per prompt: the GRPO group
    request_id: str  # one per trajectory
    messages: list[dict[str, Any]]  # the whole conversation, prompt included
    tool_calls: list[ToolCallRecord] = dataclasses.field(default_factory=list)
    assistant_turns: int = 0
    tool_turns: int = 0
    dropped_calls: int = 0  # calls beyond max_parallel_calls in a turn (not run, as in verl)
    stop_reason: str = ""
    error: Optional[str] = None
    response_tokens: int = 0
    model_seconds: float = 0.0
    tool_seconds: float = 0.0
    wall_seconds: float = 0.0
    score: float = 0.0
    reward_extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def response_messages(self) -> list[dict[str, Any]]:
        return self.messages[len(self.sample.messages):]

    @property
    def num_turns(self) -> int:
        """verl's `num_turns`: assistant turns + tool turns + the prompt."""
        return self.assistant_turns + self.tool_turns + 1

    @property
    def input_text(self) -> str:
        return render_prompt(self.sample.messages)

    @property
    def output_text(self) -> str:
        return render_response(self.response_messages)


@dataclasses.dataclass
class RolloutResult:
    trajectories: list[Trajectory]
    wall_seconds: float


async def run_trajectory(
    sample: Sample, client: ChatClient, runner: ToolRunner, config: RolloutConfig, uid: str, request_id: str
) -> Trajectory:
    """One conversation to its end; never raises for model or tool failures (they are recorded)."""
    traj = Trajectory(sample=sample, uid=uid, request_id=request_id, messages=[dict(m) for m in sample.messages])
    agent = AgentContext(request_id, traj.messages, sample.tools_kwargs)
    first_prompt_tokens: Optional[int] = None
    while True:
        remaining = config.response_length - traj.response_tokens
        max_tokens = min(remaining, config.max_tokens_per_turn or remaining)
        start = time.perf_counter()
        try:
            completion = await client.complete(traj.messages, runner.schemas, max_tokens)
        except ModelServerError as exc:
            traj.stop_reason, traj.error = StopReason.model_error, str(exc)
            break
        finally:
            traj.model_seconds += time.perf_counter() - start
        if first_prompt_tokens is None:
            first_prompt_tokens = completion.prompt_tokens
        traj.response_tokens = completion.prompt_tokens - first_prompt_tokens
        if traj.response_tokens >= config.response_length:
            # The tool results alone filled the budget: verl stops before generating, so this turn is not kept.
            traj.stop_reason = StopReason.length
            break
        traj.response_tokens += completion.completion_tokens
        traj.assistant_turns += 1
        calls = _append_assistant_turn(traj, completion.content, completion.tool_calls, config.max_parallel_calls)
        if completion.finish_reason == "length" or traj.response_tokens >= config.response_length:
            traj.stop_reason = StopReason.length
            break
        if not calls:
            traj.stop_reason = StopReason.answer
            break
        if traj.assistant_turns >= config.max_turns:
            traj.stop_reason = StopReason.max_turns
            break
        start = time.perf_counter()
        records = await runner.run(calls, agent)
        traj.tool_seconds += time.perf_counter() - start
        traj.tool_calls += records
        traj.tool_turns += 1
        traj.messages += [{"role": "tool", "tool_call_id": r.call_id, "content": r.text} for r in records]
    return traj


def _append_assistant_turn(traj: Trajectory, content: str, raw_calls: list[Any],
                           max_parallel_calls: int) -> list[ToolCall]:
    """Record the assistant message; return the calls to run (the first `max_parallel_calls`)."""
    id_prefix = f"call_{traj.request_id}_{traj.assistant_turns}_"
    if raw_calls:
        calls = parse_openai_tool_calls(raw_calls, id_prefix)
        kept = calls[:max_parallel_calls]
        message: dict[str, Any] = {"role": "assistant", "content": content,
                                   "tool_calls": [c.openai_dict() for c in kept]}
    else:
        # Raw text: keep it verbatim (blocks included) so the model sees exactly what it wrote.
        _, calls = parse_hermes(content, id_prefix)
        kept = calls[:max_parallel_calls]
        message = {"role": "assistant", "content": content}
    traj.messages.append(message)
    traj.dropped_calls += len(calls) - len(kept)
    return kept


async def score_trajectory(traj: Trajectory, reward_fn: RewardFn) -> None:
    """verl's reward call: the whole response text (tool turns included) against the ground truth."""
    sample = traj.sample
    kwargs = dict(data_source=sample.data_source, solution_str=traj.output_text, ground_truth=sample.ground_truth,
                  extra_info={**sample.extra_info, "num_turns": traj.num_turns})
    try:
        if inspect.iscoroutinefunction(reward_fn):
            result = await reward_fn(**kwargs)
        else:
            result = await asyncio.get_running_loop().run_in_executor(None, lambda: reward_fn(**kwargs))
    except Exception as exc:  # recorded and counted; one bad sample must not discard the run
        traj.score, traj.reward_extra = 0.0, {}
        traj.error = f"reward function failed: {type(exc).__name__}: {exc}"
        return
    if isinstance(result, dict):
        traj.score, traj.reward_extra = float(result["score"]), dict(result)
    else:
        traj.score, traj.reward_extra = float(result), {"acc": float(result)}


async def run_rollouts(
    samples: Sequence[Sample],
    client: ChatClient,
    runner: ToolRunner,
    config: RolloutConfig,
    reward_fn: Optional[RewardFn] = None,
    progress: bool = True,
) -> RolloutResult:
    """All `len(samples) * config.n` trajectories at once; the client's semaphore bounds the model
    server, the tools (e.g. the Ray pool's cluster-wide limit) bound the sandbox."""
    start = time.perf_counter()
    bar = tqdm(total=len(samples) * config.n, desc="rollout", unit="traj", disable=not progress)
    done = correct = 0

    async def one(sample: Sample, k: int) -> Trajectory:
        nonlocal done, correct
        t0 = time.perf_counter()
        traj = await run_trajectory(sample, client, runner, config, uid=str(sample.index),
                                    request_id=f"{sample.index}_{k}")
        if reward_fn is not None:
            await score_trajectory(traj, reward_fn)
        traj.wall_seconds = time.perf_counter() - t0
        done, correct = done + 1, correct + (traj.score > 0)
        bar.update(1)
        bar.set_postfix(acc=f"{correct / done:.3f}", refresh=False)
        return traj

    try:
        trajectories = await asyncio.gather(*(one(s, k) for s in samples for k in range(config.n)))
    finally:
        bar.close()
    return RolloutResult(list(trajectories), time.perf_counter() - start)
