"""The CPU twin of the GPU training script: the whole multi-turn chain, for real, minus the model.

    scripted policy (OpenAI chat over HTTP) <- `verl-sf rollout` (a real subprocess)
        -> SandboxFusionTool (configs/sandbox_fusion_tool_config.yaml) -> Ray execution pool
        -> `verl-sf serve` (real server, real sandbox) -> gsm8k reward -> {step}.jsonl dump

Data: the shipped gsm8k sample, through the real preprocessing script. Each of the 40
problems gets one of eight scripted behaviours (right, wrong, code that raises, code that
times out, a malformed Hermes call, an over-long turn, raw-Hermes right, never stops
calling), 8 trajectories each: 320 at once. Scripted answers quote the tool's output, so
a trajectory scores only if the sandbox really ran the code.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.special_e2e.policy_server import Call, PolicyServer, Script, Turn
from tests.subprocesses import communicate_or_kill

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLE = os.path.join(ROOT, "tests", "data", "gsm8k_sample", "train.jsonl")
N = 8
RESPONSE_LENGTH = 1024
MAX_TOOL_RESPONSE_LENGTH = 256
SCENARIOS = ["right", "wrong", "raises", "times_out", "malformed", "over_long", "hermes_right", "never_stops"]


def final_step(answer: str) -> tuple[str, str]:
    """(expression, value) of the last `<<expr=value>>` step of a gsm8k answer."""
    expression, value = re.findall(r"<<([^=]+)=([^>]+)>>", answer)[-1]
    return expression, value


def code(source: str) -> Call:
    return Call.code(source)


def printing(expression: str) -> Call:
    """Code that prints the value as a person would write it (15, not 15.0)."""
    return code(f"x = round({expression}, 6)\nprint(int(x) if x == int(x) else x)")


def script_for(scenario: str, expression: str, value: str) -> Script:
    compute = printing(expression)
    answer = Turn("So the answer is #### {tool}")
    if scenario == "right":
        return Script([Turn("Let me compute.", [compute]), answer])
    if scenario == "wrong":
        return Script([Turn("", [printing(f"{expression} + 1")]), answer])
    if scenario == "raises":
        return Script([Turn("", [code("x = 1 / 0")]), Turn("Oops, fixing it.", [compute]), answer])
    if scenario == "times_out":
        # A sleep, not a CPU loop: 16 loops on 2 cores now and then pushed another scenario's 0.5 s run past its time-out.
        return Script([Turn("", [code("import time\ntime.sleep(30)")]), Turn(f"Without the tool: #### {value}")])
    if scenario == "malformed":
        broken = Turn(raw='<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(1)"\n</tool_call>')
        return Script([broken, Turn("", [compute]), answer], mode="hermes")
    if scenario == "over_long":
        return Script([Turn(" ".join(["blah"] * 3 * RESPONSE_LENGTH), [compute])])
    if scenario == "hermes_right":
        return Script([Turn("Computing.", [compute]), answer], mode="hermes")
    assert scenario == "never_stops"
    return Script([Turn("", [code("print('ab' * 500)")]) for _ in range(10)], mode="hermes")


def fmt(value: str) -> str:
    number = float(value)
    return str(int(number)) if number.is_integer() else str(round(number, 6))


@pytest.fixture
def inputs(tmp_path, sf_server):
    data_dir = tmp_path / "data"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "data_preprocess", "gsm8k_multiturn_w_tool.py"),
                           "--local_dataset_path", SAMPLE, "--split", "train", "--local_save_dir", str(data_dir)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    with open(os.path.join(ROOT, "configs", "sandbox_fusion_tool_config.yaml")) as f:
        tool_config = yaml.safe_load(f)
    tool_config["tools"][0]["config"].update(
        sandbox_fusion_url=sf_server.run_code_url, pool="ray", num_workers=16, rate_limit=16, default_timeout=0.5)
    tools_path = tmp_path / "tools.yaml"
    tools_path.write_text(yaml.safe_dump(tool_config))
    problems = [json.loads(line) for line in Path(SAMPLE).read_text().splitlines()]
    return data_dir / "train.parquet", tools_path, problems


@pytest.mark.ray
async def test_multiturn_rollouts_through_the_real_sandbox(inputs, ray_local, tmp_path) -> None:
    data, tools_path, problems = inputs
    scripts = {}
    for i, problem in enumerate(problems):
        scripts[problem["question"]] = script_for(SCENARIOS[i % len(SCENARIOS)], *final_step(problem["answer"]))
    out = tmp_path / "rollouts"
    async with PolicyServer(scripts) as policy:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "verl_sf.cli", "rollout", "--server", policy.url, "--data", str(data),
            "--tool-config", str(tools_path), "--n", str(N), "--max-turns", "5", "--rollout-data-dir", str(out),
            "--step", "1", "--reward", "gsm8k", "--response-length", str(RESPONSE_LENGTH),
            "--max-tool-response-length", str(MAX_TOOL_RESPONSE_LENGTH), "--concurrency", "32",
            "--ray-address", ray_local.address, "--ray-namespace", ray_local.namespace, "--no-progress",
            cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        stdout_b, stderr_b = await communicate_or_kill(proc, timeout=400)
    stdout, stderr = stdout_b.decode(), stderr_b.decode()
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]

    # Every request carried the tool schema the shipped config declares.
    assert {r["tools"][0]["function"]["name"] for r in policy.requests} == {"code_interpreter"}

    # The summary a user reads.
    per = N * len(problems) // len(SCENARIOS)  # trajectories per scenario
    assert f"trajectories: {N * len(problems)} ({len(problems)} prompts)" in stdout
    assert "accuracy: 0.6250" in stdout  # right, raises, times_out, malformed, hermes_right
    stops = dict(re.findall(r"(\w+) (\d+)", stdout.split("stop reasons: ")[1].splitlines()[0]))
    assert stops == {"answer": str(5 * per + per), "length": str(per), "max_turns": str(per)}
    errors = dict(re.findall(r"(\w+) (\d+)", stdout.split("tool errors: ")[1].splitlines()[0]))
    assert errors == {"error": str(per), "timeout": str(per), "malformed_call": str(per)}
    assert f"truncated tool responses: {4 * per}" in stdout  # never_stops prints 1000 characters, 4 times
    assert "failed trajectories: 0" in stdout

    # Every trajectory in the dump.
    lines = [json.loads(line) for line in (out / "1.jsonl").read_text().splitlines()]
    assert len(lines) == N * len(problems)
    for entry in lines:
        index = int(entry["uid"])
        scenario = SCENARIOS[index % len(SCENARIOS)]
        expression, value = final_step(problems[index]["answer"])
        check_trajectory(scenario, entry, fmt(value))
        assert entry["step"] == 1 and entry["gts"] == fmt(value).replace(",", "")
        assert problems[index]["question"] in entry["input"]


def tool_texts(entry: dict) -> list[str]:
    return [m["content"] for m in entry["messages"] if m["role"] == "tool"]


def check_trajectory(scenario: str, entry: dict, value: str) -> None:
    kinds = [c["error_kind"] for c in entry["tool_calls"]]
    texts = tool_texts(entry)
    expect_score = 1.0 if scenario in ("right", "raises", "times_out", "malformed", "hermes_right") else 0.0
    assert entry["score"] == expect_score and entry["acc"] is (expect_score == 1.0), (scenario, entry["output"][-300:])
    if scenario in ("right", "hermes_right"):
        assert (entry["stop_reason"], entry["num_turns"], kinds, texts) == ("answer", 4, [None], [value])
        assert entry["pred"] == value
    elif scenario == "wrong":
        assert entry["stop_reason"] == "answer" and kinds == [None]
        assert abs(float(texts[0]) - (float(value) + 1)) < 1e-6 and entry["pred"] == texts[0]
    elif scenario == "raises":
        assert (entry["stop_reason"], entry["num_turns"], kinds) == ("answer", 6, ["error", None])
        assert "ZeroDivisionError: division by zero" in texts[0] and texts[1] == value
    elif scenario == "times_out":
        assert (entry["stop_reason"], kinds) == ("answer", ["timeout"])
        assert texts[0].startswith("Execution timed out after 0.5 s")
    elif scenario == "malformed":
        assert (entry["stop_reason"], kinds, texts[1]) == ("answer", ["malformed_call", None], value)
        assert texts[0].startswith("Failed to decode tool call: tool call is not valid JSON")
        assert "<tool_call>" in entry["messages"][2]["content"]  # the raw Hermes text, kept verbatim
    elif scenario == "over_long":
        assert (entry["stop_reason"], kinds, entry["num_turns"]) == ("length", [], 2)
        assert entry["response_tokens"] == RESPONSE_LENGTH  # cut exactly at the budget on the first turn
    else:  # never_stops: max_turns=5 assistant turns, the fifth turn's call is not run (as in verl)
        assert (entry["stop_reason"], entry["num_turns"], kinds) == ("max_turns", 10, [None] * 4)
        half = MAX_TOOL_RESPONSE_LENGTH // 2
        assert texts == ["ab" * (half // 2) + "...(truncated)..." + "ab" * (half // 2)] * 4
        assert all(c["truncated"] for c in entry["tool_calls"])
