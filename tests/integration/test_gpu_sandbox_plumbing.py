"""The GPU sandbox and its slots on a host without a GPU: the discovery is given one GPU whose only node is a
stand-in (/dev/full), so what is tested is verl-sf's own part (a sandbox per GPU with that node bound in and the
GPU named in its environment, a slot held for the whole run, no slot within the timeout, the slot back after a
kill).  What CUDA does in that sandbox is checked on a GPU host by scripts/gpu_check.sh."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.waiting import wait_until_async
from verl_sf.executor import executor as executor_module
from verl_sf.executor import pool as pool_module
from verl_sf.executor.config import ExecutorConfig
from verl_sf.executor.gpus import GpuView
from verl_sf.models import RunCodeRequest

pytestmark = pytest.mark.integration
STAND_IN = GpuView(0, ("/dev/full",), (), (), "GPU-00000000-1111-2222-3333-444444444444")
SHOW = "import os; print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['CUDA_DEVICE_ORDER'], os.path.exists('/dev/full'))"


def test_gpu_runs_take_the_gpus_sandbox_and_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(executor_module, "host_gpus", lambda: [0])
    monkeypatch.setattr(pool_module, "gpu_views", lambda chosen: [STAND_IN])  # the warm pool makes the GPU sandboxes

    async def scenario() -> None:
        config = ExecutorConfig(gpus="all", sandboxes=1, preload=())
        async with executor_module.Executor(config) as executor:
            assert "python_gpu" in executor.status().languages
            shown = await executor.run_code(RunCodeRequest(code=SHOW, language="python_gpu"))
            assert shown.run_result is not None and shown.run_result.stdout.split() == [STAND_IN.uuid, "PCI_BUS_ID",
                                                                                         "True"]
            plain = await executor.run_code(RunCodeRequest(code="import os; print('CUDA_VISIBLE_DEVICES' in os.environ)",
                                                           language="python"))
            assert plain.run_result is not None and plain.run_result.stdout == "False\n"  # CPU runs: no GPU named
            hog = asyncio.ensure_future(executor.run_code(RunCodeRequest(code="while True: pass", language="python_gpu",
                                                                         run_timeout=2)))
            await wait_until_async(lambda: executor.status().gpus["free_slots"] == {"0": 0}, 30,
                                   "the hog holds the GPU's only slot", every=0.01)
            started = time.monotonic()
            refused = await executor.run_code(RunCodeRequest(code="print(1)", language="python_gpu", run_timeout=0.5))
            assert refused.status == "SandboxError" and refused.run_result is None
            assert "no GPU slot came free within the run's timeout of 0.5 s" in refused.message
            assert 0.5 <= time.monotonic() - started < 2.0
            killed = await hog
            assert killed.run_result is not None and killed.run_result.status == "TimeLimitExceeded"
            assert executor.status().gpus == {"gpus": [0], "runs_per_gpu": 1, "free_slots": {"0": 1}, "waiting": 0}
            after = await executor.run_code(RunCodeRequest(code="print(2)", language="python_gpu", run_timeout=1))
            assert after.status == "Success" and after.run_result is not None and after.run_result.stdout == "2\n"

    asyncio.run(scenario())
