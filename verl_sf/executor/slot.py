"""One sandbox slot seen from the server: its warm interpreters and the JSON-lines pipes to them.

A slot holds a lean zygote (stdlib only), started with the slot, and one zygote per heavy
flavor (a preloaded library, or `full` for code naming several), started on the flavor's
first job.  Fork and exit cost grow with the parent's memory, so a numpy run forked from a
numpy-only interpreter costs about half of one forked from an interpreter that also holds
sympy and scipy; starting flavors on demand keeps idle memory to what the workload uses.
All zygotes live in the slot's cgroup, each in its own sandbox; the slot runs one job at a
time, so they never compete for its memory cap.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from typing import Any, Optional

from verl_sf.executor.cgroups import SlotCgroup
from verl_sf.executor.sandbox import SandboxLauncher
from verl_sf.executor.zygote import SUPERVISED_KEYS

log = logging.getLogger(__name__)
MAX_REPLY_BYTES = 512 << 20  # stdout+stderr caps plus fetched files, base64
LEAN, FULL = "lean", "full"


class SlotCrashed(RuntimeError):
    """A zygote died mid-job (e.g. killed from outside); it is restarted."""


class ZygoteProcess:
    """One warm interpreter in its sandbox, spoken to over its stdin/stdout."""

    def __init__(self, index: int, flavor: str, launcher: SandboxLauncher, cgroup: Optional[SlotCgroup]):
        self.index = index
        self.flavor = flavor
        self.launcher = launcher
        self.cgroup = cgroup
        self.process: Optional[asyncio.subprocess.Process] = None

    async def start(self) -> None:
        procs = self.cgroup.procs_files if self.cgroup else []
        if not self.launcher.isolated:
            os.makedirs(self.launcher.slot_workdir(self.index, self.flavor), exist_ok=True)
        self.process = await asyncio.create_subprocess_exec(
            *self.launcher.command(self.index, self.flavor),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=None,
            env=self.launcher.env, preexec_fn=self.launcher.preexec(procs), limit=MAX_REPLY_BYTES,
        )
        hello = await self._read()
        if not hello.get("ready"):
            raise SlotCrashed(f"sandbox slot {self.index} ({self.flavor}) failed to start: {hello}")

    async def _read(self) -> dict[str, Any]:
        assert self.process and self.process.stdout
        line = await self.process.stdout.readline()
        if not line:
            raise SlotCrashed(f"sandbox slot {self.index} ({self.flavor}) exited (code {await self.process.wait()})")
        return json.loads(line)

    async def job(self, request: dict[str, Any]) -> dict[str, Any]:
        if self.process is None or self.process.returncode is not None:
            await self.restart()
        assert self.process and self.process.stdin
        try:
            head = {key: request[key] for key in SUPERVISED_KEYS if key in request}
            self.process.stdin.write(f"{json.dumps(head)}\t{json.dumps(request)}\n".encode())
            await self.process.stdin.drain()
            return await self._read()
        except (SlotCrashed, ConnectionError) as exc:
            await self.restart()
            raise SlotCrashed(str(exc)) from exc
        except asyncio.CancelledError:
            # The caller went away mid-run: the zygote still owes us a reply we can't match
            # to anyone, so replace it rather than desynchronise the pipe.
            await self.restart()
            raise

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    async def stop(self) -> None:
        proc, self.process = self.process, None
        if proc is None or proc.returncode is not None:
            return
        try:
            proc.send_signal(signal.SIGKILL)  # bwrap is PID 1 of the sandbox: all of it goes
        except ProcessLookupError:
            pass
        await proc.wait()


class Slot:
    """Runs one job at a time; the executor's queue hands out idle slots."""

    def __init__(self, index: int, launcher: SandboxLauncher, cgroup: Optional[SlotCgroup]):
        self.index = index
        self.cgroup = cgroup
        self._launcher = launcher
        self.zygotes = {LEAN: ZygoteProcess(index, LEAN, launcher, cgroup)}
        self.baseline_memory = 0

    async def start(self) -> None:
        await self.zygotes[LEAN].start()
        self._measure_baseline()

    def _measure_baseline(self) -> None:
        """The memory the warm interpreters hold; a run's cap is this plus its own limit."""
        if self.cgroup:
            self.baseline_memory = self.cgroup.memory_usage()

    async def _zygote(self, flavor: str) -> ZygoteProcess:
        zygote = self.zygotes.get(flavor)
        if zygote is not None:
            return zygote
        zygote = ZygoteProcess(self.index, flavor, self._launcher, self.cgroup)
        if self.cgroup:
            self.cgroup.set_memory_limit(None)  # the last run's cap must not kill the import
        try:
            await zygote.start()
        except BaseException:
            await zygote.stop()
            raise
        self.zygotes[flavor] = zygote
        self._measure_baseline()
        return zygote

    async def job(self, request: dict[str, Any], memory_limit_mb: int, flavor: str = LEAN) -> dict[str, Any]:
        """Run one request on the chosen interpreter under the slot's memory cap."""
        zygote = await self._zygote(flavor)
        ooms_before = 0
        if self.cgroup:
            try:
                self.cgroup.set_memory_limit(self.baseline_memory + (memory_limit_mb << 20))
            except OSError as exc:  # e.g. EBUSY: the kernel could not shrink usage below the new cap
                return {"status": "Error", "stdout": "", "return_code": None, "execution_time": 0.0,
                        "stderr": f"could not apply memory_limit_MB={memory_limit_mb}: {exc}"}
            ooms_before = self.cgroup.oom_kills()
        reply = await zygote.job(request)
        if self.cgroup and self.cgroup.oom_kills() > ooms_before:
            reply["oom_killed"] = True
        return reply

    async def stop(self) -> None:
        await asyncio.gather(*(z.stop() for z in self.zygotes.values()))
