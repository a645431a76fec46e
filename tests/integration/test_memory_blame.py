"""Memory caps that blame the right run: idle sessions' files never get an innocent run killed."""

from __future__ import annotations

import os

import pytest
import requests

from tests.server_fixtures import run_code, server_in_mode


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
