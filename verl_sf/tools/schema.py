"""The OpenAI function schema of the `code_interpreter` tool.

Same name and single required `code` argument as verl's old SandboxFusionTool and the
ReTool recipe, so prompts and chat templates written for those keep working.
"""

from __future__ import annotations

from typing import Any

from verl_sf.tools._compat import OpenAIFunctionToolSchema

TOOL_NAME = "code_interpreter"

CODE_INTERPRETER_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "Run Python code in a sandbox and return what it prints (stdout, then stderr).",
        "parameters": {
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "The code to run. Print the values you want to see."},
            },
            "required": ["code"],
        },
    },
}


def code_interpreter_schema() -> OpenAIFunctionToolSchema:
    """A fresh schema object (verl's class when verl is installed)."""
    return OpenAIFunctionToolSchema.model_validate(CODE_INTERPRETER_SCHEMA)
