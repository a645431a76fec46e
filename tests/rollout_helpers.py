"""In-process verl tools and their tool config, shared by the rollout tests (no sandbox: they compute here)."""

from __future__ import annotations

import ast
import asyncio
import operator
import os
import sys
import textwrap
from typing import Any, Optional

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from tests.subprocesses import communicate_or_kill

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.Pow: operator.pow, ast.USub: operator.neg}


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.left), _eval(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.operand))
    raise ValueError(f"unsupported expression element {type(node).__name__}")


def schema(name: str, argument: str = "expression") -> OpenAIFunctionToolSchema:
    return OpenAIFunctionToolSchema.model_validate({
        "type": "function",
        "function": {"name": name, "description": f"{name} tool", "parameters": {
            "type": "object", "properties": {argument: {"type": "string", "description": argument}},
            "required": [argument]}},
    })


# A tool config verl's loader reads, naming the tool below.
CALCULATOR_TOOL_YAML = textwrap.dedent("""\
    tools:
      - class_name: tests.rollout_helpers.CalculatorTool
        config: {type: native}
        tool_schema:
          type: function
          function:
            name: calculator
            description: arithmetic
            parameters:
              type: object
              properties:
                expression: {type: string, description: an expression}
              required: [expression]
    """)


class CalculatorTool(BaseTool):
    """Evaluates arithmetic; reports `status` like SandboxFusionTool; tracks live instances."""

    def __init__(self, config: dict, tool_schema: Optional[OpenAIFunctionToolSchema] = None) -> None:
        super().__init__(config, tool_schema or schema("calculator"))
        self.live: dict[str, dict] = {}
        self.created = 0
        self.delay = float(config.get("delay", 0))

    async def create(self, instance_id: Optional[str] = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        instance_id, response = await super().create(instance_id)
        self.live[instance_id] = kwargs
        self.created += 1
        return instance_id, response

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        assert instance_id in self.live, "execute before create"
        if self.delay:
            await asyncio.sleep(self.delay)
        expression = str(parameters.get("expression", ""))
        if expression.startswith("repeat:"):  # long output, for truncation
            return ToolResponse(text=expression[len("repeat:"):] * 100), None, {"status": "success"}
        try:
            value = _eval(ast.parse(expression, mode="eval"))
        except (SyntaxError, ValueError, ZeroDivisionError) as exc:
            return ToolResponse(text=f"error: {exc}"), None, {"status": "error"}
        return ToolResponse(text=f"{value:g}"), 0.5, {"status": "success"}

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        del self.live[instance_id]


async def run_cli(*args: str, module: str = "verl_sf.cli") -> tuple[int, str, str]:
    """`verl-sf rollout ARGS` (or `python -m MODULE ARGS`) from the repository root: exit code, stdout, stderr."""
    prefix = ["rollout"] if module == "verl_sf.cli" else []
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", module, *prefix, *args, cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    stdout, stderr = await communicate_or_kill(proc, timeout=120)
    return proc.returncode, stdout.decode(), stderr.decode()
