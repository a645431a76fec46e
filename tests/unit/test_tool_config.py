"""Tool configs: every yaml in configs/ loads through verl 0.9.1's registry; bad keys fail clearly."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema
from verl.tools.tool_registry import initialize_tools_from_config

from verl_sf.tools import CODE_INTERPRETER_SCHEMA, SandboxFusionTool, ToolConfigError

CONFIGS = sorted((Path(__file__).parents[2] / "configs").glob("*.yaml"))
TOOL_CONFIGS = [p for p in CONFIGS if "tools" in OmegaConf.load(p)]


def test_configs_dir_has_the_three_backends() -> None:
    names = {p.name for p in TOOL_CONFIGS}
    assert {"sandbox_fusion_tool_config.yaml", "local_tool_config.yaml", "daytona_tool_config.yaml"} <= names


@pytest.mark.parametrize("path", TOOL_CONFIGS, ids=lambda p: p.name)
def test_every_tool_yaml_loads_through_verls_registry(path: Path) -> None:
    (tool,) = initialize_tools_from_config(str(path))
    assert isinstance(tool, SandboxFusionTool) and isinstance(tool, BaseTool)
    assert isinstance(tool.tool_schema, OpenAIFunctionToolSchema)
    function = tool.tool_schema.function
    assert tool.name == function.name == "code_interpreter"
    assert function.parameters.required == ["code"] and function.parameters.properties["code"].type == "string"
    assert tool._dispatcher is None  # nothing started until the first call


def test_default_yaml_points_at_the_local_server() -> None:
    (tool,) = initialize_tools_from_config(str(Path(__file__).parents[2] / "configs/sandbox_fusion_tool_config.yaml"))
    assert tool.settings.sandbox_fusion_url == "http://127.0.0.1:8080/run_code" and tool.backend_name == "http"
    assert (tool.settings.num_workers, tool.settings.rate_limit, tool.settings.enable_global_rate_limit) == (10, 10, True)


def test_schema_defaults_to_code_interpreter() -> None:
    tool = SandboxFusionTool({"backend": "local"}, None)
    assert tool.tool_schema.model_dump(exclude_none=True) == OpenAIFunctionToolSchema.model_validate(
        CODE_INTERPRETER_SCHEMA).model_dump(exclude_none=True)


@pytest.mark.parametrize("config, message", [
    ({}, "sandbox_fusion_url is required"),
    ({"sandbox_fusion_url": "http://x", "rate_limt": 4}, "rate_limt: unknown key"),
    ({"sandbox_fusion_url": "http://x", "rate_limit": 0}, "rate_limit: Input should be greater than 0"),
    ({"sandbox_fusion_url": "http://x", "num_workers": "many"}, "num_workers: Input should be a valid integer"),
    ({"sandbox_fusion_url": "http://x", "default_language": "cobol"}, "default_language: unknown language 'cobol'"),
    ({"sandbox_fusion_url": "http://x", "memory_limit_mb": 3}, "memory_limit_mb: must be -1"),
    ({"sandbox_fusion_url": "http://x", "type": "mcp"}, "type: Input should be 'native'"),
    ({"backend": "docker"}, "unknown backend 'docker'; expected one of http, local, daytona"),
    ({"backend": "local", "local": {"wrokers": 2}}, "local.wrokers: unknown key"),
    ({"backend": "local", "local": {"isolation": "chroot"}}, "local.isolation: Input should be 'auto', 'namespaces', 'landlock' or 'none'"),
    ({"backend": "local", "local": {"workers": "many"}}, "local.slots: Input should be a valid integer"),
    ({"sandbox_fusion_url": "http://x", "http": {"max_retries": -1}},
     "http.max_retries: Input should be greater than or equal to 0"),
    ({"sandbox_fusion_url": "http://x", "http": {"retries": 1}}, "http.retries: unknown key"),
    ({"sandbox_fusion_url": "ftp://x"}, "http.url: sandbox URL must look like http(s)://host"),
    ({"backend": "daytona", "daytona": {"snapshoot": "x"}}, "daytona.snapshoot: unknown key"),
])
def test_bad_config_raises_a_typed_error_naming_the_key(config: dict, message: str) -> None:
    with pytest.raises(ToolConfigError) as info:
        SandboxFusionTool(config, None)
    assert message in str(info.value)


def test_bad_yaml_fails_at_load_time_through_verl(tmp_path: Path) -> None:
    base = OmegaConf.load(TOOL_CONFIGS[0])
    base.tools[0].config["rate_limit"] = -2
    path = tmp_path / "bad.yaml"
    OmegaConf.save(base, path)
    with pytest.raises(ToolConfigError, match="rate_limit"):
        initialize_tools_from_config(str(path))


def test_the_session_key_defaults_per_backend_and_is_checked() -> None:
    url = "http://127.0.0.1:9/run_code"  # nothing listens: the server is asked again at the first create
    assert SandboxFusionTool({"sandbox_fusion_url": url}).settings.session_mode == "none"
    assert SandboxFusionTool({"backend": "daytona"}).settings.session_mode == "trajectory"
    assert SandboxFusionTool({"backend": "daytona", "session": "none"}).settings.session_mode == "none"
    unchecked = SandboxFusionTool({"sandbox_fusion_url": url, "session": "trajectory"})
    assert unchecked.settings.session_mode == "trajectory" and unchecked._sessions_checked is False
    with pytest.raises(ToolConfigError, match="session: Input should be 'none' or 'trajectory'"):
        SandboxFusionTool({"sandbox_fusion_url": url, "session": "episode"})
    assert SandboxFusionTool({"backend": "cluster", "session": "trajectory"}).settings.session_mode == "trajectory"
