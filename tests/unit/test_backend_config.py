"""Backend configs: tagged, frozen, hashable, validated once; a new backend is one class."""

from __future__ import annotations

import pickle
from typing import Literal

import pytest
from pydantic import ValidationError

from verl_sf.backends.base import SandboxBackend
from verl_sf.backends.config import (
    BackendClass,
    BackendConfig,
    DaytonaBackendConfig,
    HttpBackendConfig,
    LocalBackendConfig,
    parse_backend_config,
)
from verl_sf.backends.daytona import DaytonaSandboxBackend
from verl_sf.backends.http import HttpSandboxBackend
from verl_sf.backends.local import LocalSandboxBackend
from verl_sf.executor import ExecutorConfig
from verl_sf.tools import SandboxFusionTool, ToolConfig


@pytest.mark.parametrize("data, config_type, backend_type, default_session", [
    ({"type": "http", "url": "http://127.0.0.1:8080/run_code"}, HttpBackendConfig, HttpSandboxBackend, "none"),
    ({"type": "local", "executor": {"workers": 2}}, LocalBackendConfig, LocalSandboxBackend, "none"),
    ({"type": "daytona", "labels": {"team": "rl"}}, DaytonaBackendConfig, DaytonaSandboxBackend, "trajectory"),
])
def test_each_tag_parses_builds_and_says_whether_it_keeps_sessions(data: dict, config_type: type,
                                                                   backend_type: type, default_session: str) -> None:
    config = parse_backend_config(data)
    assert type(config) is config_type and config.type == data["type"]
    backend = config.build()  # starts and connects nothing
    assert type(backend) is backend_type and backend.config is config
    assert config.supports_sessions is True is backend_type.supports_sessions
    assert config.default_session == default_session
    assert parse_backend_config(config.model_dump()) == config


def test_configs_are_frozen_hashable_and_pickle() -> None:
    first = HttpBackendConfig(url="http://127.0.0.1:8080/run_code")
    same = HttpBackendConfig(url="http://127.0.0.1:8080")
    assert first == same and hash(first) == hash(same) and first.url == "http://127.0.0.1:8080"
    assert len({first, same, HttpBackendConfig(url="http://127.0.0.1:8080", max_retries=0)}) == 2
    with pytest.raises(ValidationError, match="frozen"):
        first.max_retries = 0  # type: ignore[misc]
    local = LocalBackendConfig(executor=ExecutorConfig(slots=3))
    daytona = DaytonaBackendConfig(labels={"team": "rl"})  # dict and dataclass fields still hash
    assert {local: 1, daytona: 2}[LocalBackendConfig(executor=ExecutorConfig(slots=3))] == 1
    assert pickle.loads(pickle.dumps(daytona)) == daytona


@pytest.mark.parametrize("data, where", [
    ({"type": "docker"}, "unknown backend 'docker'; expected one of http, local, daytona"),
    ({"type": "http"}, "url\n  Field required"),
    ({"type": "http", "url": "http://x", "connection_limit": 0}, "connection_limit\n  Input should be greater"),
    ({"type": "local", "executor": {"workers": "two"}}, "executor.slots\n  Input should be a valid integer"),
    ({"type": "daytona", "auto_delete_interval": -2}, "auto_delete_interval\n  Input should be greater"),
    ({"type": "daytona", "snapshoot": "x"}, "snapshoot\n  Extra inputs are not permitted"),
])
def test_bad_configs_name_the_field(data: dict, where: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_backend_config(data)
    assert where in str(info.value)


def test_a_new_backend_is_one_config_class() -> None:
    class MirrorBackendConfig(BackendConfig):
        """A second name for a Sandbox Fusion server, with its own option."""

        type: Literal["mirror"] = "mirror"
        url: str
        max_retries: int = 1

        def backend_class(self) -> BackendClass:
            return HttpSandboxBackend

        def build(self) -> SandboxBackend:
            return HttpSandboxBackend(self.url, max_retries=self.max_retries)

    try:
        settings = ToolConfig.parse({"backend": "mirror", "mirror": {"url": "http://127.0.0.1:9/run_code"}})
        assert isinstance(settings.backend_config, MirrorBackendConfig)
        backend = settings.backend_config.build()
        assert isinstance(backend, HttpSandboxBackend) and backend.config.max_retries == 1
        tool = SandboxFusionTool({"backend": "mirror", "mirror": {"url": "http://127.0.0.1:9", "max_retries": 0}})
        assert tool.backend_name == "mirror" and tool.backend_config.model_dump()["max_retries"] == 0
        with pytest.raises(ValueError, match="mirror.retries: unknown key"):
            ToolConfig.parse({"backend": "mirror", "mirror": {"url": "http://x", "retries": 0}})
    finally:
        del BackendConfig.registry["mirror"]


def test_http_backend_takes_its_config_or_the_url_shorthand() -> None:
    config = HttpBackendConfig(url="http://127.0.0.1:8080", max_retries=2)
    assert HttpSandboxBackend(config).config is config
    assert HttpSandboxBackend("http://127.0.0.1:8080", max_retries=2).config == config
    with pytest.raises(TypeError, match="go into the HttpBackendConfig"):
        HttpSandboxBackend(config, max_retries=3)
