"""`verl-sf rollout` as a user runs it: a real subprocess against a policy server on 127.0.0.1."""

from __future__ import annotations

import json
import os

import pytest

from tests.rollout_helpers import CALCULATOR_TOOL_YAML, run_cli
from tests.special_e2e.policy_server import Call, PolicyServer, Script, Turn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

def calc(expression: str) -> Call:
    return Call("calculator", json.dumps({"expression": expression}))


def row(question: str, truth: str, source: str = "openai/gsm8k") -> dict:
    return {"data_source": source, "prompt": [{"role": "user", "content": question}],
            "reward_model": {"ground_truth": truth}, "extra_info": {}}


SCRIPTS = {
    "Q-right": Script([Turn("", [calc("6 * 7")]), Turn("So #### {tool}")]),
    "Q-wrong": Script([Turn("", [calc("6 * 8")]), Turn("So #### {tool}")], mode="hermes"),
}


@pytest.fixture
def files(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in [row("Q-right", "42"), row("Q-wrong", "42")]) + "\n")
    tools = tmp_path / "tools.yaml"
    tools.write_text(CALCULATOR_TOOL_YAML)
    return data, tools, tmp_path / "rollouts"


async def test_rollout_command_end_to_end(files) -> None:
    data, tools, out = files
    async with PolicyServer(SCRIPTS) as server:
        code, stdout, stderr = await run_cli(
            "--server", server.url, "--data", str(data), "--tool-config", str(tools), "--n", "3",
            "--max-turns", "5", "--rollout-data-dir", str(out), "--step", "7", "--no-progress")
    assert code == 0, stderr
    assert "trajectories: 6 (2 prompts)" in stdout
    assert "accuracy: 0.5000" in stdout
    assert "tool calls per trajectory: mean 1.00, max 1" in stdout
    assert "stop reasons: answer 6" in stdout
    assert f"rollouts: {out}/7.jsonl" in stdout
    lines = [json.loads(line) for line in (out / "7.jsonl").read_text().splitlines()]
    assert [(d["uid"], d["score"], d["pred"], d["step"]) for d in lines] == (
        [("0", 1.0, "42", 7)] * 3 + [("1", 0.0, "48", 7)] * 3)
    assert all(r["model"] == "scripted-policy" for r in server.requests)  # resolved from /v1/models


async def test_fixed_reward_and_module_entry_point(files) -> None:
    data, tools, out = files
    async with PolicyServer(SCRIPTS) as server:
        code, stdout, stderr = await run_cli(
            "--server", server.url + "/v1", "--data", str(data), "--tool-config", str(tools), "--reward", "math",
            "--model", "my-model", "--no-progress", module="verl_sf.rollout.cli")
    assert code == 0, stderr
    assert "accuracy: 0.0000" in stdout  # no \boxed answers: the math scorer gives 0
    assert {r["model"] for r in server.requests} == {"my-model"}


async def test_failed_trajectories_exit_1(files) -> None:
    data, tools, out = files
    async with PolicyServer({"Q-right": SCRIPTS["Q-right"]}) as server:  # Q-wrong is not scripted: HTTP 400
        code, stdout, stderr = await run_cli("--server", server.url, "--data", str(data), "--tool-config", str(tools),
                                             "--rollout-data-dir", str(out), "--no-progress")
    assert code == 1
    assert "failed trajectories: 1" in stdout and "model_error 1" in stdout
    failed = [json.loads(line) for line in (out / "0.jsonl").read_text().splitlines()][1]
    assert failed["stop_reason"] == "model_error" and "HTTP 400" in failed["error"]


NOTHING_LISTENS = "http://127.0.0.1:9"  # the discard port: connection refused


@pytest.mark.parametrize("make_args, error", [
    (lambda d, t: ["--data", f"{d}.missing", "--tool-config", str(t)], "does not exist"),
    (lambda d, t: ["--data", str(d), "--tool-config", f"{t}.missing"], "tool config"),
    (lambda d, t: ["--data", str(d), "--tool-config", str(t), "--max-turns", "0"], "max_turns must be >= 1"),
    (lambda d, t: ["--data", str(d), "--extra-body", "[1]"], "--extra-body must be a JSON object"),
    (lambda d, t: ["--data", str(d), "--server", "127.0.0.1:1"], "must start with http://"),
    (lambda d, t: ["--data", str(d)], f"{NOTHING_LISTENS}/v1/models"),
])
def test_bad_input_exits_2_with_a_message(files, capsys, make_args, error: str) -> None:
    """Checked before any model request (in process: these never reach a server)."""
    from verl_sf.rollout.cli import main

    data, tools, _ = files
    args = make_args(data, tools)
    if "--server" not in args:
        args += ["--server", NOTHING_LISTENS]
    assert main([*args, "--no-progress"]) == 2
    assert error in capsys.readouterr().err


def test_unknown_data_source_fails_before_any_request(tmp_path, capsys) -> None:
    from verl_sf.rollout.cli import main

    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps(row("Q-right", "1", source="codecontests")) + "\n")
    # Had it contacted the server first, the error would be about the refused connection.
    assert main(["--server", NOTHING_LISTENS, "--data", str(data), "--no-progress"]) == 2
    assert "no reward for data_source 'codecontests'" in capsys.readouterr().err
