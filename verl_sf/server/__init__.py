"""The HTTP face of the executor: Sandbox Fusion's API plus /health and /metrics."""

from verl_sf.server.app import ServerConfig, build_app, run, serve

__all__ = ["ServerConfig", "build_app", "run", "serve"]
