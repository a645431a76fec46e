"""Backend configs: one tagged union, frozen, keyed by their JSON, validated once."""

from __future__ import annotations

import pickle

import pytest
from pydantic import ValidationError

from verl_sf.backends.cluster import ClusterSandboxBackend
from verl_sf.backends.config import (
    BACKEND_CONFIGS,
    ClusterBackendConfig,
    DaytonaBackendConfig,
    HttpBackendConfig,
    LocalBackendConfig,
    parse_backend_config,
)
from verl_sf.backends.daytona import DaytonaSandboxBackend
from verl_sf.backends.http import HttpSandboxBackend, normalize_base_url
from verl_sf.backends.local import LocalSandboxBackend
from verl_sf.executor import ExecutorConfig
from verl_sf.tools import ToolConfig


@pytest.mark.parametrize("data, config_type, backend_type, default_session", [
    ({"type": "http", "url": "http://127.0.0.1:8080/run_code"}, HttpBackendConfig, HttpSandboxBackend, "none"),
    ({"type": "local", "executor": {"workers": 2}}, LocalBackendConfig, LocalSandboxBackend, "none"),
    ({"type": "daytona", "labels": {"team": "rl"}}, DaytonaBackendConfig, DaytonaSandboxBackend, "trajectory"),
    ({"type": "cluster", "spill_at": 4}, ClusterBackendConfig, ClusterSandboxBackend, "none"),
])
def test_each_tag_parses_builds_and_says_whether_it_keeps_sessions(data: dict, config_type: type,
                                                                   backend_type: type, default_session: str) -> None:
    config = parse_backend_config(data)
    assert type(config) is config_type and config.type == data["type"]
    backend = config.build()  # starts and connects nothing
    assert type(backend) is backend_type and backend.config is config
    assert backend.supports_sessions is True  # every backend is on the one session protocol
    assert config.default_session == default_session
    assert parse_backend_config(config.model_dump()) == config


def test_configs_are_frozen_keyed_by_their_json_and_pickle() -> None:
    first = HttpBackendConfig(url="http://127.0.0.1:8080/run_code")
    same = HttpBackendConfig(url="http://127.0.0.1:8080")
    assert first == same and first.key() == same.key() and first.url == "http://127.0.0.1:8080"
    assert len({first.key(), same.key(), HttpBackendConfig(url="http://127.0.0.1:8080", max_retries=0).key()}) == 2
    with pytest.raises(ValidationError, match="frozen"):
        first.max_retries = 0  # type: ignore[misc]
    local = LocalBackendConfig(executor=ExecutorConfig(slots=3))
    daytona = DaytonaBackendConfig(labels={"team": "rl"})  # dict and nested fields have a key too
    assert {local.key(): 1, daytona.key(): 2}[LocalBackendConfig(executor=ExecutorConfig(slots=3)).key()] == 1
    assert pickle.loads(pickle.dumps(daytona)) == daytona


def test_the_union_lists_every_backend_by_its_tag() -> None:
    assert list(BACKEND_CONFIGS) == ["http", "local", "daytona", "cluster"]
    assert all(config.model_fields["type"].default == tag for tag, config in BACKEND_CONFIGS.items())


@pytest.mark.parametrize("data, where", [
    ({"type": "docker"}, "does not match any of the expected tags: 'http', 'local', 'daytona', 'cluster'"),
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


def test_tool_yaml_blocks_name_bad_keys_under_their_backend() -> None:
    with pytest.raises(ValueError, match="config: cluster.namespce: unknown key"):
        ToolConfig.parse({"backend": "cluster", "cluster": {"namespce": "x"}})
    with pytest.raises(ValueError, match="config: local.slots: Input should be a valid integer"):
        ToolConfig.parse({"backend": "local", "local": {"slots": "two"}})
    with pytest.raises(ValueError, match="unknown backend 'docker'; expected one of http, local, daytona, cluster"):
        ToolConfig.parse({"backend": "docker"})


def test_http_backend_takes_its_config_or_the_url_shorthand() -> None:
    config = HttpBackendConfig(url="http://127.0.0.1:8080", max_retries=2)
    assert HttpSandboxBackend(config).config is config
    assert HttpSandboxBackend("http://127.0.0.1:8080", max_retries=2).config == config
    with pytest.raises(TypeError, match="go into the HttpBackendConfig"):
        HttpSandboxBackend(config, max_retries=3)


@pytest.mark.parametrize("url", ["", "127.0.0.1:8080", "ftp://127.0.0.1/run_code", None])
def test_bad_urls_are_rejected(url) -> None:
    with pytest.raises(ValueError, match="sandbox URL"):
        normalize_base_url(url)


@pytest.mark.parametrize("kwargs, message", [
    ({"max_retries": -1}, r"max_retries\n  Input should be greater than or equal to 0"),
    ({"connection_limit": 0}, r"connection_limit\n  Input should be greater than or equal to 1"),
    ({"backoff_base_s": "fast"}, r"backoff_base_s\n  Input should be a valid number"),
    ({"retries": 3}, r"retries\n  Extra inputs are not permitted"),
])
def test_bad_settings_are_rejected(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        HttpSandboxBackend("http://127.0.0.1:1", **kwargs)
