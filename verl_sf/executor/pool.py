"""The zygote pool: warm interpreters per flavor, each in a sandbox of its own, started, picked by
load, and stopped.

Flavors: `stdlib`; one per preloaded heavy library; `full` (all of them) where there are two or
more; each with a cells twin whose IPython shell is built already; and one per GPU given to the
server, whose sandbox holds that GPU's device node and no other's.  Only stdlib and the GPU
flavors start with the server; the others start on first use.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from typing import Optional

from verl_sf.executor.cgroups import CgroupManager, SandboxCgroup
from verl_sf.executor.config import CELLS, ExecutorConfig
from verl_sf.executor.gpus import gpu_views
from verl_sf.executor.languages import Toolchains
from verl_sf.executor.rungs import Rung
from verl_sf.executor.sandbox import SandboxLauncher
from verl_sf.executor.zygote_process import ZygoteProcess
from verl_sf.off_loop import PIECE_CHARS, off_loop

log = logging.getLogger(__name__)
STDLIB, FULL = "stdlib", "full"  # interpreter flavors beside one per preloaded library


def gpu_flavor(index: int) -> str:
    """The zygote group of GPU `index`'s sandbox."""
    return f"gpu{index}"


class ZygotePool:
    def __init__(self, config: ExecutorConfig, rung: Rung, toolchains: Toolchains, cgroups: Optional[CgroupManager],
                 extra_etc: tuple[str, ...], session_died: Callable[[int, str], None]):
        self.config = config
        self.toolchains = toolchains
        self.launcher = SandboxLauncher(config, toolchains, extra_etc, rung)
        self._rung = rung
        self._cgroups = cgroups
        self._extra_etc = extra_etc
        self._session_died = session_died
        self._gpu_launchers: list[SandboxLauncher] = []
        self._zygotes: dict[str, list[ZygoteProcess]] = {}
        self.preloaded = [name for name in config.preload if name in toolchains.importable]
        self._picks_flavor = bool(config.fast_path and self.preloaded)

    async def start(self, gpus: list[int]) -> None:
        """Start the stdlib interpreters and one per GPU in `gpus` (host indices)."""
        for view in await asyncio.to_thread(gpu_views, gpus):
            if view.missing_nodes:
                log.warning("verl-sf: GPU %d: %s missing, so CUDA runs will fail; load the driver's modules "
                            "first (`nvidia-modprobe -u -c=0`, or any CUDA program run once as root)",
                            view.index, ", ".join(view.missing_nodes))
            launcher = SandboxLauncher(self.config, self.toolchains, self._extra_etc, self._rung, gpu=view)
            self._gpu_launchers.append(launcher)
            self._zygotes[gpu_flavor(view.index)] = [self._zygote(STDLIB, 0, launcher, gpu_flavor(view.index))]
        heavy = self.preloaded
        for flavor in [STDLIB, *heavy, *([FULL] if len(heavy) > 1 else [])]:
            for twin in (flavor, flavor + CELLS):
                self._zygotes[twin] = [self._zygote(twin, i, self.launcher) for i in range(self.config.sandboxes)]
        await asyncio.gather(*(z.ensure_started() for flavor, group in self._zygotes.items() for z in group
                               if flavor == STDLIB or flavor.startswith("gpu")))

    def _zygote(self, flavor: str, index: int, launcher: SandboxLauncher, group: str = "") -> ZygoteProcess:
        name = f"{group or flavor}-{index}"
        cgroup: Optional[SandboxCgroup] = self._cgroups.sandbox(name) if self._cgroups else None
        if cgroup is not None:
            cgroup.delegate(launcher.host_uids()[0])
        return ZygoteProcess(name, flavor, launcher, cgroup, self._session_died)

    async def pick(self, flavor: str) -> ZygoteProcess:
        """The least loaded interpreter of `flavor`, started."""
        zygote = min(self._zygotes[flavor], key=lambda z: z.load)
        await zygote.ensure_started()
        return zygote

    async def flavor_for(self, code: str) -> str:
        """The smallest warm interpreter that has what the code names: stdlib, the one library's, or full.
        Only a speed choice: code that imports a library anyway still works from any interpreter."""
        if not self._picks_flavor:
            return STDLIB
        named = await off_loop(len(code), names_in, self.preloaded, code)
        if not named:
            return STDLIB
        return named.pop() if len(named) == 1 else FULL

    def running(self) -> dict[str, int]:
        """Running interpreters by flavor, the flavors with none left out (heavy ones start on first use)."""
        counts = {flavor: sum(1 for z in group if z.process is not None and z.process.returncode is None)
                  for flavor, group in self._zygotes.items()}
        return {flavor: count for flavor, count in counts.items() if count}

    def faults(self) -> dict[str, str]:
        """Sandboxes whose reply reader failed, by name, and why."""
        return {z.name: z.fault for group in self._zygotes.values() for z in group if z.fault}

    async def close(self) -> None:
        zygotes = [z for group in self._zygotes.values() for z in group]
        await asyncio.gather(*(z.stop() for z in zygotes), return_exceptions=True)
        for zygote in zygotes:
            if zygote.cgroup:
                zygote.cgroup.remove()
        for launcher in [self.launcher, *self._gpu_launchers]:
            launcher.close()
        self._gpu_launchers = []
        self._zygotes = {}


def names_in(names: list[str], code: str) -> set[str]:
    """Which of `names` `code` names as a word, searched a piece at a time (in a thread, the GIL is free
    between pieces: one search of 50 MB held it ~190 ms), and once a name is found, for the others
    only (code naming one library a million times costs a search, not a million steps).  A name
    counts in the piece it starts in, each search seeing past its piece, so that a word boundary at a
    piece's end is the real one."""
    found: set[str] = set()
    margin = max(map(len, names), default=0) + 1
    for start in range(0, len(code), PIECE_CHARS):
        end = start + PIECE_CHARS
        while len(found) < len(names):
            unfound = _words([name for name in names if name not in found])
            match = unfound.search(code, start, min(len(code), end + margin))
            if match is None or match.start() >= end:
                break
            found.add(match.group(1))
    return found


def _words(names: list[str]) -> re.Pattern[str]:
    return re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")  # re's cache keeps the few there are
