"""Memory caps that blame the right run: idle sessions' files never get an innocent run killed."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.cgroup_layout import controller_dirs, is_v2, v1_mounts
from tests.server_fixtures import run_code, server_in_mode
from tests.waiting import wait_until


@pytest.mark.skipif(os.geteuid() != 0, reason="the all-runs memory cap is a cgroup: the server needs root")
def test_idle_sessions_files_do_not_get_a_run_killed() -> None:
    fill = ("import os\n"
            "for path, mb in (('/workdir/f', 250), ('/mnt/f', 250), ('/tmp/f', 60), ('/dev/shm/f', 60)):\n"
            "    with open(path, 'wb') as fh:\n"
            "        for _ in range(mb):\n            fh.write(b'm' * (1 << 20))\n"
            "print('held')\n")
    with server_in_mode("root", "--slots", "2", "--sandboxes", "1", "--preload", "",
                        "--runs-memory-mb", "2048") as handle:
        sessions = []
        for _ in range(3):
            created = requests.post(handle.url + "/sessions", json={"language": "python", "memory_limit_MB": 1024},
                                    timeout=60).json()
            sessions.append(created["session_id"])
            held = run_code(handle, fill, session_id=created["session_id"], run_timeout=60)
            assert held["run_result"]["stdout"] == "held\n", held
        for _ in range(3):
            body = run_code(handle, "x = bytearray(150 << 20)\nprint('fine')\n", memory_limit_MB=512)
            assert body["status"] == "Success" and body["run_result"]["stdout"] == "fine\n", body



def _members(procs_files: list[Path]) -> set[int]:
    return {int(pid) for procs in procs_files for pid in procs.read_text().split()}


@pytest.mark.skipif(os.geteuid() != 0, reason="the all-runs memory cap is a cgroup: the server needs root")
def test_the_zygotes_stay_out_of_the_cap_over_all_runs() -> None:
    """A burst at the cap makes the kernel reclaim inside it; a zygote there would wait in that reclaim on
    each fork (cgroup v1).  The cap holds the runs only; v2 keeps each zygote's leaf in its sandbox's group.
    Under v1's cpu controller every sandbox's runs are siblings, their zygotes beside them: a run demoted in
    one sandbox weighs the least against a fresh run in any other (a group per sandbox weighed alike)."""
    with server_in_mode("root", "--slots", "2", "--sandboxes", "2", "--preload", "",
                        "--runs-memory-mb", "1536") as handle:
        top = next(controller_dirs()["memory"].glob(f"verl-sf-{handle.process.pid}-*"))
        capped = top if is_v2() else top / "runs"
        assert (capped / ("memory.max" if is_v2() else "memory.limit_in_bytes")).read_text().strip() == str(1536 << 20)
        reply: dict[str, Any] = {}
        running = threading.Thread(target=lambda: reply.update(run_code(handle, "import time; time.sleep(4)")))
        running.start()

        def runs() -> set[int]:  # the run's processes, and each sandbox's child set up ahead in its group
            return _members(list(capped.glob("*/*.run-*/cgroup.procs")))

        wait_until(lambda: len(runs()) >= 3, 20, "the run and the children set up ahead in their groups below the cap")
        if is_v2():
            zygotes = _members(list(capped.glob("*/zygote/cgroup.procs")))
        else:
            zygotes = _members([top / "zygotes" / "cgroup.procs"])
            assert zygotes.isdisjoint(_members(list(capped.rglob("cgroup.procs"))))
        commands = [Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") for pid in zygotes]
        assert any(b"-I" in argv and b"-c" in argv and b"bwrap" not in argv[0] for argv in commands), commands
        assert runs().isdisjoint(zygotes)
        if not is_v2() and "cpu" in v1_mounts():  # out of the root cpu group, where autogroups act (cgroups.py)
            sandboxes, grouped = set(), runs()
            for pid in grouped | zygotes:
                cpu = next(line for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()
                           if "cpu" in line.split(":")[1].split(","))
                # /<server's group> for the zygotes, /<server's group>/<sandbox>.run-<n> for each run
                parts = cpu.split(":")[2].split("/")[1:]
                assert parts[0] == top.name and len(parts) == (2 if pid in grouped else 1), (pid, cpu)
                sandboxes |= {parts[1].split(".run-")[0]} if pid in grouped else set()
            assert sandboxes == {"stdlib-0", "stdlib-1"}, sandboxes
        running.join(timeout=30)
        assert reply["status"] == "Success", reply
