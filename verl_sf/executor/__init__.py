"""Isolated execution: warm interpreters in sandboxes, CPU slots, sessions, the runners per language."""

from verl_sf.executor.config import ExecutorConfig, IsolationMode
from verl_sf.executor.executor import Executor, InvalidRequest, Overloaded
from verl_sf.executor.sandbox import IsolationUnavailable

__all__ = ["Executor", "ExecutorConfig", "InvalidRequest", "IsolationMode", "IsolationUnavailable", "Overloaded"]
