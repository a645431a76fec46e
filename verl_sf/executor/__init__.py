"""Isolated execution: warm interpreters in sandboxes, CPU slots, sessions, the runners per language."""

from verl_sf.executor.config import ExecutorConfig, IsolationMode
from verl_sf.executor.executor import Executor, InvalidRequest, Overloaded
from verl_sf.executor.rungs import IsolationUnavailable
from verl_sf.executor.zygote_process import Closed, Closing, closed, closed_now

__all__ = ["Closed", "Closing", "Executor", "ExecutorConfig", "InvalidRequest", "IsolationMode",
           "IsolationUnavailable", "Overloaded", "closed", "closed_now"]
