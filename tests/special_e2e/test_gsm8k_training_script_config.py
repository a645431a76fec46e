"""The GPU training script, checked on CPU: exactly its Hydra overrides, composed by verl 0.9.1.

The script itself runs (it starts `verl-sf serve`, preprocesses the shipped gsm8k sample,
writes the tool config) with VERL_SF_CONFIG_OUT set, which makes it call verl's
`main_ppo` with Hydra's `--cfg job`: Hydra composes verl's `ppo_trainer` config with every
override and fails on any key verl does not know. The composed config then goes through
verl's own `validate_config` and its typed RolloutConfig, and the generated tool config
through verl's tool loader.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tests", "special_e2e", "run_gsm8k_fsdp_sgl_multiturn_sf_tool.sh")
SAMPLE = os.path.join(ROOT, "tests", "data", "gsm8k_sample")


def run_script(tmp_path, *overrides: str) -> tuple[subprocess.CompletedProcess, str]:
    config_out = str(tmp_path / "verl_config.yaml")
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "WORK_DIR": str(tmp_path / "work"),
        "DATA_DIR": str(tmp_path / "data"),
        "ROLLOUT_DATA_DIR": str(tmp_path / "rollouts"),
        "GSM8K_LOCAL": SAMPLE,
        "SF_PORT": "0",
        "NGPUS": "8",
        "VERL_SF_CONFIG_OUT": config_out,
    }
    proc = subprocess.run(["bash", SCRIPT, *overrides], env=env, capture_output=True, text=True, timeout=300,
                          cwd=str(tmp_path))
    return proc, config_out


def _server_port(tmp_path) -> int:
    log = (tmp_path / "work" / "verl-sf-serve.log").read_text()
    return int(log.split("listening on http://127.0.0.1:")[1].split()[0])


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def composed(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("gsm8k_script")
    proc, config_out = run_script(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return tmp_path, proc, config_out


def test_every_override_is_a_key_verl_knows(composed) -> None:
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config
    from verl.workers.config import RolloutConfig

    tmp_path, proc, config_out = composed
    config = OmegaConf.load(config_out)
    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    rollout = omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
    assert isinstance(rollout, RolloutConfig)
    assert (rollout.name, rollout.mode, rollout.n) == ("sglang", "async", 4)
    multi_turn = rollout.multi_turn
    assert multi_turn.enable and multi_turn.format == "hermes" and multi_turn.max_assistant_turns == 5
    assert multi_turn.tool_config_path == str(tmp_path / "work" / "sandbox_fusion_tool_config.yaml")
    assert config.algorithm.adv_estimator == "grpo"
    assert config.actor_rollout_ref.model.path == "Qwen/Qwen2.5-0.5B-Instruct"
    assert config.data.train_files == str(tmp_path / "data" / "train.parquet")
    assert config.trainer.rollout_data_dir == str(tmp_path / "rollouts")
    assert dict(config.reward.custom_reward_function) == {"path": "pkg://verl_sf.rewards", "name": "compute_score"}


def test_reward_function_resolves_the_way_verl_loads_it(composed) -> None:
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn

    _, _, config_out = composed
    reward_fn = get_custom_reward_fn(OmegaConf.load(config_out))
    assert reward_fn(data_source="openai/gsm8k", solution_str="#### 14", ground_truth="14")["score"] == 1.0


def test_generated_tool_config_and_data(composed) -> None:
    import pyarrow.parquet as pq
    from verl.tools.tool_registry import initialize_tools_from_config

    tmp_path, proc, _ = composed
    (tool,) = initialize_tools_from_config(str(tmp_path / "work" / "sandbox_fusion_tool_config.yaml"))
    port = _server_port(tmp_path)
    assert type(tool).__name__ == "SandboxFusionTool" and tool.name == "code_interpreter"
    assert tool.config["sandbox_fusion_url"] == f"http://127.0.0.1:{port}/run_code"
    assert (tool.config["num_workers"], tool.config["rate_limit"]) == (16, 32)
    assert pq.read_metadata(str(tmp_path / "data" / "train.parquet")).num_rows == 40
    assert f"sandbox server: http://127.0.0.1:{port}" in proc.stdout


def test_server_is_stopped_on_exit(composed) -> None:
    tmp_path, _, _ = composed
    assert not _listening(_server_port(tmp_path))


def test_an_unknown_key_fails(tmp_path) -> None:
    """The check has teeth: an override verl does not know makes the script fail, and the server still stops."""
    proc, _ = run_script(tmp_path, "actor_rollout_ref.rollout.multi_turn.no_such_key=1")
    assert proc.returncode != 0
    assert "Key 'no_such_key' is not in struct" in proc.stderr
    assert not _listening(_server_port(tmp_path))
