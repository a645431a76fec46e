"""verl's tool base classes when verl is installed, small compatible stand-ins otherwise.

verl is an optional extra (`pip install verl-sf[verl]`).  When it is importable,
`SandboxFusionTool` subclasses the real `verl.tools.base_tool.BaseTool` and returns verl's
own `ToolResponse`, so verl's `initialize_tools_from_config` and `ToolAgentLoop` accept it
unchanged.  Without verl (TRL or plain asyncio users) the classes below keep the same
field names and method signatures, so code written against one works against the other.
"""

from __future__ import annotations

from typing import Any, Optional
from uuid import uuid4

from pydantic import BaseModel, Field

try:
    from verl.tools.base_tool import BaseTool
    from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
    from verl.utils.rollout_trace import rollout_trace_op

    VERL_AVAILABLE = True
except ImportError:
    VERL_AVAILABLE = False

    class ToolResponse(BaseModel):  # type: ignore[no-redef]
        """What the model reads back from a tool (verl's field names)."""

        text: Optional[str] = None
        image: Optional[list[Any]] = None
        video: Optional[list[Any]] = None

        def is_empty(self) -> bool:
            return not self.text and not self.image and not self.video

    class _PropertySchema(BaseModel):
        type: str | list[str]
        description: Optional[str] = None
        enum: Optional[list[Any]] = None

    class _ParametersSchema(BaseModel):
        type: str
        properties: dict[str, _PropertySchema]
        required: list[str] = Field(default_factory=list)

    class _FunctionSchema(BaseModel):
        name: str
        description: str
        parameters: _ParametersSchema = Field(
            default_factory=lambda: _ParametersSchema(type="object", properties={}, required=[])
        )
        strict: bool = False

    class OpenAIFunctionToolSchema(BaseModel):  # type: ignore[no-redef]
        """An OpenAI function-tool schema (`{"type": "function", "function": {...}}`)."""

        type: str
        function: _FunctionSchema

    class BaseTool:  # type: ignore[no-redef]
        """The lifecycle verl's tools follow: create -> execute* -> calc_reward -> release."""

        def __init__(self, config: dict, tool_schema: Optional[OpenAIFunctionToolSchema]):
            self.config = config
            self.tool_schema = tool_schema or self.get_openai_tool_schema()
            if self.tool_schema is None:
                raise ValueError("tool_schema is required")
            self.name = self.tool_schema.function.name

        def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
            return self.tool_schema

        async def create(self, instance_id: Optional[str] = None, **kwargs: Any) -> tuple[str, ToolResponse]:
            return instance_id or str(uuid4()), ToolResponse()

        async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
                          ) -> tuple[ToolResponse, Optional[float], dict]:
            raise NotImplementedError

        async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
            return 0.0

        async def release(self, instance_id: str, **kwargs: Any) -> None:
            return None

    def rollout_trace_op(func: Any) -> Any:
        """verl's tracing decorator; without verl there is nothing to trace into."""
        return func


__all__ = ["VERL_AVAILABLE", "BaseTool", "OpenAIFunctionToolSchema", "ToolResponse", "rollout_trace_op"]
