"""`backend: cluster` options are checked when the tool is built, not at the first call (no Ray needed)."""

from __future__ import annotations

import pickle

import pytest

from verl_sf.backends.cluster import ClusterSandboxBackend
from verl_sf.errors import SessionGone
from verl_sf.tools import SandboxFusionTool, ToolConfigError


@pytest.mark.parametrize(("options", "named"), [
    ({"spill_at": 0}, "spill_at"),
    ({"max_rounds": 0}, "max_rounds"),
    ({"busy_s": -1}, "busy_s"),
    ({"http": {"max_retries": 3}}, "max_retries"),
    ({"http": {"connect_timeout_s": "soon"}}, "connect_timeout_s"),
    ({"namespce": "typo"}, "namespce"),
])
def test_bad_cluster_options_name_the_option(options: dict, named: str) -> None:
    with pytest.raises(ToolConfigError, match=named):
        SandboxFusionTool({"backend": "cluster", "cluster": options})


def test_cluster_tool_builds_without_touching_ray() -> None:
    import ray

    connected = ray.is_initialized()  # other tests of the session may have started Ray
    tool = SandboxFusionTool({"backend": "cluster", "cluster": {"namespace": "elsewhere", "spill_at": 8}})
    assert tool.backend_name == "cluster"
    backend = tool.backend_config.build()
    assert isinstance(backend, ClusterSandboxBackend) and backend.config.namespace == "elsewhere"
    assert ray.is_initialized() == connected


def test_backend_and_session_gone_pickle_for_ray() -> None:
    backend = pickle.loads(pickle.dumps(ClusterSandboxBackend(namespace="n", spill_at=3)))
    assert (backend.config.namespace, backend.config.spill_at) == ("n", 3)
    assert backend.supports_sessions and backend.sessions() == []
    gone = pickle.loads(pickle.dumps(SessionGone("f1-abc", "its server died")))
    assert (gone.session_id, gone.reason) == ("f1-abc", "its server died")
    assert str(gone) == "session 'f1-abc' is gone: its server died"


def test_cluster_tool_keeps_sessions_per_trajectory() -> None:
    tool = SandboxFusionTool({"backend": "cluster", "session": "trajectory"})
    assert tool.settings.session_mode == "trajectory"
