"""Clients that run code, all behind one interface (`SandboxBackend`)."""

from verl_sf.backends.base import SandboxBackend, SandboxUnavailable

__all__ = ["SandboxBackend", "SandboxUnavailable"]
