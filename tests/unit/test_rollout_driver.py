"""The multi-turn driver against a scripted policy server over real HTTP on 127.0.0.1."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.rollout_helpers import CalculatorTool
from tests.special_e2e.policy_server import Call, PolicyServer, Script, Turn
from verl_sf.rewards import compute_score
from verl_sf.rollout import (
    ChatClient,
    RolloutConfig,
    RolloutSummary,
    Sample,
    StopReason,
    ToolRunner,
    run_rollouts,
    write_rollout_dump,
)


def calc(expression: str) -> Call:
    return Call("calculator", json.dumps({"expression": expression}))


def sample(question: str, truth: str = "7", index: int = 0) -> Sample:
    return Sample(index=index, data_source="openai/gsm8k",
                  messages=[{"role": "system", "content": "Use the calculator."}, {"role": "user", "content": question}],
                  ground_truth=truth, extra_info={"tools_kwargs": {"calculator": {"create_kwargs": {"ground_truth": truth}}}})


async def rollout(scripts: dict[str, Script], samples: list[Sample], concurrency: int = 8, hold: float = 0.0,
                  tool: Any = None, **config: Any):
    tool = tool or CalculatorTool({})
    cfg = RolloutConfig(**config)
    runner = ToolRunner([tool], cfg.max_tool_response_length, cfg.tool_response_truncate_side)
    async with PolicyServer(scripts, hold_seconds=hold) as server, \
            ChatClient(server.url, concurrency=concurrency, max_retries=0) as client:
        result = await run_rollouts(samples, client, runner, cfg, compute_score, progress=False)
    assert tool.live == {}, "every created tool instance was released"
    return result, server


@pytest.mark.parametrize("mode", ["openai", "hermes"])
async def test_tool_then_answer(mode: str) -> None:
    scripts = {"Q1": Script([Turn("Let me add.", [calc("3 + 4")]), Turn("It is #### {tool}")], mode=mode)}
    result, server = await rollout(scripts, [sample("Q1")])
    (traj,) = result.trajectories
    assert (traj.stop_reason, traj.assistant_turns, traj.tool_turns, traj.num_turns) == (StopReason.answer, 2, 1, 4)
    assert traj.score == 1.0 and traj.reward_extra == {"score": 1.0, "acc": True, "pred": "7"}
    assert [m["role"] for m in traj.response_messages] == ["assistant", "tool", "assistant"]
    tool_message = traj.response_messages[1]
    assert tool_message["content"] == "7"
    if mode == "openai":
        assert tool_message["tool_call_id"] == traj.response_messages[0]["tool_calls"][0]["id"]
    else:  # raw text kept verbatim, with its Hermes block
        assert "<tool_call>" in traj.response_messages[0]["content"]
        assert "tool_calls" not in traj.response_messages[0]
    # Every request carried the tool schema; the second one carried the tool result back.
    assert all(r["tools"][0]["function"]["name"] == "calculator" for r in server.requests)
    assert server.requests[1]["messages"][-1] == tool_message
    assert "<tool_response>\n7\n</tool_response>" in traj.output_text


async def test_wrong_answer_scores_zero() -> None:
    scripts = {"Q": Script([Turn("", [calc("3 + 5")]), Turn("#### {tool}")])}
    (traj,) = (await rollout(scripts, [sample("Q", truth="7")]))[0].trajectories
    assert (traj.score, traj.reward_extra["pred"]) == (0.0, "8")


@pytest.mark.parametrize("turn, kind, text", [
    (Turn(raw="<tool_call>{not json}</tool_call>"), "malformed_call", "Failed to decode tool call: tool call is not valid JSON"),
    (Turn(raw='<tool_call>{"name": "calculator"}</tool_call>'), "malformed_call", '"name" and "arguments"'),
    (Turn(raw='<tool_call>{"name": "calculator", "arguments": {"expression": "1"}'), "malformed_call", "unterminated"),
    (Turn(calls=[Call("calculator", '{"expression": ')]), "invalid_arguments", "Invalid JSON in arguments"),
    (Turn(raw='<tool_call>{"name": "calculator", "arguments": "1+1"}</tool_call>'), "invalid_arguments",
     "expected a JSON object, got str"),
    (Turn(calls=[Call("python", '{"code": "1"}')]), "unknown_tool", "Unknown function 'python'"),
    (Turn(calls=[calc("1/0")]), "error", "division by zero"),
])
async def test_bad_calls_are_answered_and_the_model_continues(turn: Turn, kind: str, text: str) -> None:
    mode = "hermes" if turn.raw is not None else "openai"
    scripts = {"Q": Script([turn, Turn("", [calc("3+4")]), Turn("#### {tool}")], mode=mode)}
    result, server = await rollout(scripts, [sample("Q")])
    (traj,) = result.trajectories
    assert traj.stop_reason == StopReason.answer and traj.score == 1.0
    assert [r.error_kind for r in traj.tool_calls] == [kind, None]
    assert text in traj.tool_calls[0].text
    assert server.requests[1]["messages"][-1]["content"] == traj.tool_calls[0].text  # the model read the error
    assert RolloutSummary.of(result.trajectories, result.wall_seconds).tool_errors == {kind: 1}


async def test_max_turns_ends_a_model_that_keeps_calling() -> None:
    scripts = {"Q": Script([Turn("", [calc(str(i))]) for i in range(5)])}
    (traj,) = (await rollout(scripts, [sample("Q")], max_turns=3))[0].trajectories
    assert (traj.stop_reason, traj.assistant_turns, traj.tool_turns) == (StopReason.max_turns, 3, 2)
    assert [r.text for r in traj.tool_calls] == ["0", "1"]  # the third turn's call is not run (as verl)


async def test_turn_cut_by_length_ends_the_trajectory() -> None:
    long_turn = Turn(" ".join(["word"] * 100), [calc("1")])
    scripts = {"Q": Script([Turn("", [calc("2")]), long_turn, Turn("#### 7")])}
    result, server = await rollout(scripts, [sample("Q")], response_length=60)
    (traj,) = result.trajectories
    assert traj.stop_reason == StopReason.length and traj.assistant_turns == 2
    assert len(traj.tool_calls) == 1  # the cut turn's call is not run
    assert traj.score == 0.0
    # Turn 2 may use what turn 1 left (60 - 2 tokens); the tool turn's own tokens (11 with the
    # chat overhead) are only known from the usage of the reply, so the total can pass the
    # budget by at most that one tool turn.
    assert server.requests[1]["max_tokens"] == 58
    assert traj.response_tokens == 11 + 58


async def test_per_turn_cap_cuts_a_turn() -> None:
    scripts = {"Q": Script([Turn(" ".join(["w"] * 50))])}
    (traj,) = (await rollout(scripts, [sample("Q")], max_tokens_per_turn=10))[0].trajectories
    assert traj.stop_reason == StopReason.length and traj.response_tokens == 10


async def test_tool_output_that_fills_the_budget_ends_before_the_next_turn() -> None:
    scripts = {"Q": Script([Turn("", [calc("repeat:word ")]), Turn("#### 7")])}
    result, server = await rollout(scripts, [sample("Q")], response_length=50, max_tool_response_length=10_000)
    (traj,) = result.trajectories
    assert traj.stop_reason == StopReason.length
    assert traj.assistant_turns == 1  # the reply generated over budget was not kept
    assert traj.response_tokens >= 50 and traj.score == 0.0


async def test_max_parallel_calls() -> None:
    scripts = {"Q": Script([Turn("", [calc("1"), calc("2"), calc("3")]), Turn("#### 7")])}
    (traj,) = (await rollout(scripts, [sample("Q")], max_parallel_calls=2))[0].trajectories
    assert [r.text for r in traj.tool_calls] == ["1", "2"] and traj.dropped_calls == 1
    assert len(traj.response_messages[0]["tool_calls"]) == 2  # the server saw an answer for each kept call


@pytest.mark.parametrize("side, expected", [("left", "(truncated)...ababab"), ("right", "ababab...(truncated)"),
                                            ("middle", "aba...(truncated)...bab")])
async def test_tool_response_truncation(side: str, expected: str) -> None:
    scripts = {"Q": Script([Turn("", [calc("repeat:ab")]), Turn("#### 7")])}
    (traj,) = (await rollout(scripts, [sample("Q")], max_tool_response_length=6, tool_response_truncate_side=side,
                             response_length=10_000))[0].trajectories
    assert traj.tool_calls[0].text == expected and traj.tool_calls[0].truncated
    assert traj.response_messages[1]["content"] == expected


async def test_model_server_error_is_recorded_not_raised() -> None:
    scripts = {"Q": Script([Turn("", [calc("1")])])}  # no second turn: the server answers 400
    result, _ = await rollout(scripts, [sample("Q"), sample("unscripted", index=1)])
    assert [t.stop_reason for t in result.trajectories] == [StopReason.model_error] * 2
    assert "HTTP 400" in result.trajectories[0].error and "no scripted turn 1" in result.trajectories[0].error
    assert RolloutSummary.of(result.trajectories, result.wall_seconds).failed_trajectories == 2


async def test_many_trajectories_with_bounded_concurrency(tmp_path) -> None:
    """64 prompts x n=4 = 256 trajectories in flight; never more than 8 requests at the server."""
    scripts = {f"Problem {i}:": Script([Turn("", [calc(f"{i} * 3")]), Turn("#### {tool}")],
                                       mode="hermes" if i % 2 else "openai") for i in range(64)}
    samples = [sample(f"Problem {i}: triple {i}", truth=str(3 * i if i % 4 else 3 * i + 1), index=i) for i in range(64)]
    result, server = await rollout(scripts, samples, concurrency=8, hold=0.01, n=4)
    trajs = result.trajectories
    assert len(trajs) == 256 and len(server.requests) == 512
    assert server.max_in_flight == 8
    assert [t.request_id for t in trajs[:5]] == ["0_0", "0_1", "0_2", "0_3", "1_0"]
    assert all(t.stop_reason == StopReason.answer and t.assistant_turns == 2 for t in trajs)
    assert [t.score for t in trajs] == [0.0 if int(t.uid) % 4 == 0 else 1.0 for t in trajs]
    summary = RolloutSummary.of(trajs, result.wall_seconds)
    assert (summary.trajectories, summary.prompts, summary.accuracy) == (256, 64, 0.75)
    assert (summary.mean_turns, summary.mean_tool_calls, summary.tool_errors) == (2.0, 1.0, {})
    assert 0.0 < summary.tool_time_share < 1.0 and 0.0 < summary.model_time_share < 1.0

    path = write_rollout_dump(trajs, str(tmp_path / "dump"), step=3)
    assert path == str(tmp_path / "dump" / "3.jsonl")
    lines = [json.loads(line) for line in Path(path).read_text().splitlines()]
    assert len(lines) == 256
    first = lines[0]
    assert list(first)[:5] == ["input", "output", "gts", "score", "step"]  # verl's keys, verl's order
    assert first["step"] == 3 and first["gts"] == "1" and first["score"] == 0.0
    assert first["input"].endswith("<|im_start|>assistant\n") and "Problem 0: triple 0" in first["input"]
    assert "<tool_response>\n0\n</tool_response>" in first["output"]
    assert (first["acc"], first["pred"], first["num_turns"], first["stop_reason"]) == (False, "0", 4, "answer")
    assert [m["role"] for m in first["messages"]] == ["system", "user", "assistant", "tool", "assistant"]


def test_config_validation_names_the_field() -> None:
    for field in ("max_turns", "response_length", "max_parallel_calls", "max_tool_response_length", "n"):
        with pytest.raises(ValueError, match=field):
            RolloutConfig(**{field: 0})


async def test_agent_data_is_dropped_when_the_trajectory_ends() -> None:
    """Tools keyed on verl's agent_data (SandboxFusionTool's per-trajectory Daytona sandboxes) see it
    collected once its trajectory is over, as verl's AgentData is."""
    import gc
    import weakref

    seen: list[weakref.ref] = []

    class Spy(CalculatorTool):
        async def execute(self, instance_id, parameters, **kwargs):
            agent = kwargs["agent_data"]
            seen.append(weakref.ref(agent))
            assert agent.request_id == "0_0" and agent.messages[-1]["role"] == "assistant"
            return await super().execute(instance_id, parameters)

    scripts = {"Q": Script([Turn("", [calc("3 + 4")]), Turn("#### {tool}")])}
    result, _ = await rollout(scripts, [sample("Q")], tool=Spy({}))
    gc.collect()
    assert len(seen) == 1 and seen[0]() is None
    assert result.trajectories[0].score == 1.0
