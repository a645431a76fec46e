"""Isolated execution: warm interpreters in sandboxes, CPU slots, sessions, the runners per language."""

from verl_sf.executor.config import ExecutorConfig, IsolationMode
from verl_sf.executor.executor import Executor, InvalidRequest, Overloaded
from verl_sf.executor.rungs import IsolationUnavailable
from verl_sf.executor.zygote.messages import Reply
from verl_sf.executor.zygote_process import Closing, closed, closed_now

__all__ = ["Closing", "Executor", "ExecutorConfig", "InvalidRequest", "IsolationMode", "IsolationUnavailable",
           "Overloaded", "Reply", "closed", "closed_now"]
