"""Isolated execution: sandbox slots with warm interpreters, and the runners per language."""

from verl_sf.executor.config import ExecutorConfig, IsolationMode
from verl_sf.executor.executor import Executor, Overloaded
from verl_sf.executor.sandbox import IsolationUnavailable

__all__ = ["Executor", "ExecutorConfig", "IsolationMode", "IsolationUnavailable", "Overloaded"]
