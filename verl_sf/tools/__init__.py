"""verl's `code_interpreter` tool (`SandboxFusionTool`) and the pieces it is built from."""

from verl_sf.tools._compat import VERL_AVAILABLE
from verl_sf.tools.config import ToolConfig, ToolConfigError
from verl_sf.tools.sandbox_fusion_tool import SandboxFusionTool, ToolArgumentError
from verl_sf.tools.schema import CODE_INTERPRETER_SCHEMA, code_interpreter_schema

__all__ = ["CODE_INTERPRETER_SCHEMA", "SandboxFusionTool", "ToolArgumentError", "ToolConfig", "ToolConfigError",
           "VERL_AVAILABLE", "code_interpreter_schema"]
