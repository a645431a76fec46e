"""Memory an idle session holds: Pss summed over its processes, read from the host.

A session is a child forked from a warm interpreter, so most of its pages are shared with that
interpreter; its Pss (/proc/PID/smaps_rollup) counts its private pages plus its share of the
shared ones, which is what one more live session really costs.  Its processes are those of its
cgroup (one per run or session, below the sandbox's delegated cgroup); the session names its
cgroup and its PID namespace from inside, and the namespace picks the right sandbox's group
(every sandbox numbers its groups from 1).  The server's own figure (GET /sessions/{id}
`memory_bytes`, the cgroup's charge) is kept beside it: it misses the pages the child shares
with the interpreter it was forked from, which were charged to that interpreter's group.
"""

from __future__ import annotations

import asyncio
import os
import statistics
from pathlib import Path
from typing import Any, Optional

import aiohttp

from bench.backends import BenchBackend
from bench.memory import process_kb
from verl_sf.models import RunCodeRequest

CGROUP_ROOTS = (Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup"))  # v1, v2
WHO_AM_I = ("import os\nprint(os.stat('/proc/self/ns/pid').st_ino)\n"
            "print([l.split(':', 2)[2] for l in open('/proc/self/cgroup').read().splitlines()"
            " if l.split(':')[1] in ('memory', '')][0])")


def _session_pids(root_pid: Optional[int], namespace: int, group: str) -> list[int]:
    """Host pids of the cgroup `group` (as the session sees it) whose processes live in PID namespace `namespace`."""
    pattern = f"verl-sf-{root_pid}-*" if root_pid else "verl-sf-*"
    for cgroup_root in CGROUP_ROOTS:
        for procs in cgroup_root.glob(f"{pattern}/*/{group.strip('/')}/cgroup.procs"):
            try:
                pids = [int(pid) for pid in procs.read_text().split()]
            except OSError:
                continue
            if pids and all(_namespace(pid) == namespace for pid in pids):
                return pids
    return []


def _namespace(pid: int) -> Optional[int]:
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None


async def _server_figure(base_url: Optional[str], session_id: Optional[str]) -> Optional[float]:
    if not base_url or not session_id:
        return None
    async with aiohttp.ClientSession() as http, http.get(f"{base_url}/sessions/{session_id}") as response:
        if response.status != 200:
            return None
        memory = (await response.json()).get("memory_bytes")
        return memory / 2**20 if memory is not None else None


async def idle_session_memory(backend: BenchBackend, count: int, settle_s: float = 1.0) -> dict[str, Any]:
    """Open `count` stdlib python sessions, let them idle, and measure each one's Pss (MiB)."""
    keys = [f"bench-idle-{i}" for i in range(count)]
    request = RunCodeRequest(code=WHO_AM_I, language="python")
    try:
        responses = await asyncio.gather(*(backend.run_code(request, session=key) for key in keys))
        await asyncio.sleep(settle_s)
        pss, processes, server = [], [], []
        for response in responses:
            lines = (response.run_result.stdout if response.run_result else "").split()
            if len(lines) != 2:
                continue
            pids = _session_pids(backend.memory_root_pid, int(lines[0]), lines[1])
            if pids:
                pss.append(sum(process_kb(pid) for pid in pids) / 1024)
                processes.append(len(pids))
            figure = await _server_figure(backend.base_url, response.session_id)
            if figure is not None:
                server.append(figure)
    finally:
        await asyncio.gather(*(backend.end_session(key) for key in keys))
    return {
        "sessions": count,
        "measured": len(pss),
        "pss_mib_median": statistics.median(pss) if pss else None,
        "pss_mib_max": max(pss) if pss else None,
        "processes_per_session": statistics.median(processes) if processes else None,
        "server_memory_bytes_mib_median": statistics.median(server) if server else None,
        "measure": "Pss summed over the session's processes (its cgroup), after one call and "
                   f"{settle_s:g} s idle; server_memory_bytes is GET /sessions/{{id}} memory_bytes",
    }
