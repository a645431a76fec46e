"""The CPU half of scripts/gpu_check.sh: the GRPO loop (scripts/grpo_step_timing.py) against a real server on
the CPU, and the GPU languages refused with the reason where the server has no GPU.  The GPU half runs on a GPU
host only (docs/performance.md, "GPU runs")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.server_fixtures import ServerHandle, run_code
from verl_sf.executor.gpus import host_gpus

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "grpo_step_timing.py"


def test_two_grpo_steps_on_the_cpu_take_their_rewards_from_the_server(sf_server: ServerHandle, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--sandbox-url", sf_server.url, "--device", "cpu",
                           "--steps", "2", "--num-generations", "4", "--max-new-tokens", "16", "--hidden-size", "32",
                           "--layers", "1", "--output-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "grpo_steps.json").read_text())
    assert (tmp_path / "grpo_steps.png").stat().st_size > 0
    assert result["device"] == "cpu" and result["model"]["architecture"].startswith("Qwen2ForCausalLM")
    assert [step["step"] for step in result["steps"]] == [1, 2]
    for step in result["steps"]:
        assert step["completions"] == 8 and step["sandbox_failures"] == 0
        # Every completion got a verdict from a run in the sandbox (none was dropped before it as empty).
        assert sum(step["outcomes"].values()) == 8 and "empty" not in step["outcomes"]
        assert -1.0 <= step["mean_reward"] <= 1.0
        assert min(step["generation_s"], step["reward_s"], step["optimizer_s"]) > 0
        parts = step["generation_s"] + step["reward_s"] + step["optimizer_s"]
        assert parts == pytest.approx(step["step_s"], rel=0.05)
        assert step["gpu_idle_share"] == pytest.approx(step["reward_s"] / step["step_s"])


@pytest.mark.parametrize("language", ["cuda", "python_gpu"])
def test_without_a_gpu_the_gpu_languages_answer_sandbox_error_with_the_reason(sf_server: ServerHandle,
                                                                              language: str) -> None:
    answer = run_code(sf_server, "print(1)", language)  # the shared server runs without --gpus
    assert answer["status"] == "SandboxError"
    reason = ("needs a GPU given to the server (`verl-sf serve --gpus all`" if host_gpus() else
              "needs an NVIDIA GPU and the CUDA toolkit: this host has no GPU")
    assert reason in answer["message"]
    assert answer["run_result"] is None


def test_gpus_that_the_host_lacks_stop_the_server_with_the_reason() -> None:
    done = subprocess.run([sys.executable, "-m", "verl_sf.cli", "serve", "--port", "0", "--gpus", "0"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 2
    assert "--gpus '0': no GPU 0 on this host (it has: none)" in done.stderr
