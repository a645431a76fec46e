"""The verl tool of Daytona's verl-retool guide (recipe/retool/daytona_sandbox_tool.py), reproduced
call for call so the tests can load it through verl 0.9's registry and point it at `verl-sf serve`.

One sandbox per trajectory: `AsyncDaytona.create(CreateSandboxFromSnapshotParams(...), timeout=...)`
in `create`, `sandbox.code_interpreter.run_code(code, timeout=..., envs=...)` in `execute`,
`sandbox.delete(timeout=...)` in `release`, and `close()` on the client.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, Optional

from daytona import AsyncDaytona, CreateSandboxFromSnapshotParams, DaytonaConfig
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from verl.utils.rollout_trace import rollout_trace_op


class DaytonaRetoolTool(BaseTool):
    def __init__(self, config: dict, tool_schema: Optional[OpenAIFunctionToolSchema]):
        super().__init__(config, tool_schema)  # type: ignore[arg-type]
        client = {k: config[k] for k in ("api_key", "api_url") if config.get(k)}
        self._daytona = AsyncDaytona(DaytonaConfig(**client)) if client else AsyncDaytona()
        self._sandboxes: dict[str, Any] = {}
        self._outputs: dict[str, list[str]] = {}
        self.default_timeout = config.get("default_timeout", 30)
        self._create_timeout = config.get("create_timeout", 60)
        self._delete_timeout = config.get("delete_timeout", 60)
        self._semaphore = asyncio.Semaphore(config.get("rate_limit", 32))

    async def create(self, instance_id: Optional[str] = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        instance_id = instance_id or str(uuid.uuid4())
        params = CreateSandboxFromSnapshotParams(
            name=f"verl-daytona-{instance_id[:8]}", language="python", snapshot=None, env_vars=None,
            labels={"framework": "verl", "backend": "daytona", "tool": self.name, "instance_id": instance_id},
            auto_stop_interval=15, auto_delete_interval=30)
        async with self._semaphore:
            self._sandboxes[instance_id] = await self._daytona.create(params, timeout=self._create_timeout)
        self._outputs[instance_id] = []
        return instance_id, ToolResponse()

    @rollout_trace_op
    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
                      ) -> tuple[ToolResponse, float, dict]:
        sandbox = self._sandboxes[instance_id]
        async with self._semaphore:
            result = await sandbox.code_interpreter.run_code(parameters["code"],
                                                             timeout=parameters.get("timeout", self.default_timeout),
                                                             envs=parameters.get("envs"))
        output = result.stdout + result.stderr
        if result.error is not None:
            error_text = f"{result.error.name}: {result.error.value}"
            if result.error.traceback:
                error_text = f"{error_text}\n{result.error.traceback}"
            output = f"{output.rstrip()}\n{error_text}".strip()
        self._outputs[instance_id].append(output)
        return ToolResponse(text=output), 0.0, {"sandbox_id": sandbox.id, "had_error": result.error is not None}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> list[str]:  # type: ignore[override]
        return self._outputs[instance_id]

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        sandbox = self._sandboxes.pop(instance_id)
        async with self._semaphore:
            await sandbox.delete(timeout=self._delete_timeout)
        del self._outputs[instance_id]

    async def close(self) -> None:
        await self._daytona.close()
