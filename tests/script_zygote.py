"""A zygote's side of the wire protocol as a short script, for tests of `ZygoteProcess` without a sandbox.

The script says hello, then answers each request line with a run reply; a test's prelude defines
`fields(head, lines)` (what the reply adds: `lines` are those of the read that carried it) and
`after_read()`, and may do anything before the hello."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Optional

LOOP = r"""
os.write(1, b'{"kind": "ready", "id": 0}\n')
pending = b""
while True:
    chunk = os.read(0, 1 << 20)
    if not chunk:
        break
    pending += chunk
    *lines, pending = pending.split(b"\n")
    for line in lines:
        head = json.loads(line.partition(b"\t")[0])
        os.write(1, json.dumps({"kind": "run", "id": head["id"], **fields(head, lines)}).encode() + b"\n")
    after_read()
"""


class ScriptLauncher:
    """Starts the script as a plain process; stopped as on the landlock rung: its requests close, and it
    exits at their end."""

    env = dict(os.environ)
    isolated = False

    def __init__(self, prelude: str):
        self.script = "import json, os, select, time\n" + prelude + LOOP

    def command(self, name: str, flavor: str, cgroup_fds: dict[str, int], cgroup_v2: bool, config_fd: int) -> list[str]:
        return [sys.executable, "-c", self.script]

    def preexec(self, procs_files: list[str]) -> Optional[Callable[[], None]]:
        return None
