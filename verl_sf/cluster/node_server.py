"""`NodeServer`: the Ray actor that owns one node's `verl-sf serve` process.

It starts the server on the node's IP (`--port 0`, reading the bound URL from its stdout),
restarts it on the same port when it dies, answers its URL and health, keeps the fleet's
directory (every server's URL, which the supervisor hands it) in a file the server reads, and
stops it on request.  Ray restarts the actor itself (`max_restarts=-1`); the server is started with a
parent-death signal, so an actor that dies takes its server down with it instead of
leaving an orphan holding the node's cores.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Optional, TypedDict

from verl_sf.server.fleet import node_tag
from verl_sf.server.process import die_with_parent, start_server_process, stop_server_process

log = logging.getLogger(__name__)
START_TIMEOUT_S = 120.0
RESTART_BACKOFF_S = 1.0


class ServerInfo(TypedDict):
    """What the actor says about its server (crosses Ray: plain data)."""

    node_id: str
    node_ip: str
    url: Optional[str]  # None while the server is (re)starting
    pid: Optional[int]
    generation: int  # 1 for the first server process, +1 per restart
    restarts: int
    error: Optional[str]  # why the last start failed, if it did


def _drain(proc: subprocess.Popen) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        log.info("verl-sf serve: %s", line.rstrip())


class NodeServer:
    """One node's sandbox server, started in the constructor (the actor is ready once it listens)."""

    def __init__(self, serve_args: list[str]):
        import ray

        self.node_id = ray.get_runtime_context().get_node_id()
        self.node_ip = ray.util.get_node_ip_address()
        self._directory = Path(tempfile.mkdtemp(prefix="verl-sf-fleet-")) / "servers.json"
        self.serve_args = [*serve_args, "--fleet-node", node_tag(self.node_id),
                           "--fleet-directory", str(self._directory)]
        self._servers: dict[str, str] = {}
        self._lock = threading.Lock()
        self._proc: Optional[subprocess.Popen] = None
        self._url: Optional[str] = None
        self._generation = 0
        self._error: Optional[str] = None
        self._stopping = threading.Event()
        self._first_start = threading.Event()
        # One thread forks every server: the parent-death signal follows the forking thread.
        self._thread = threading.Thread(target=self._supervise, name="verl-sf-node-server", daemon=True)
        self._thread.start()
        if not self._first_start.wait(START_TIMEOUT_S) or self._url is None:
            self._stopping.set()  # no actor is left to stop it: nothing of it may stay behind
            shutil.rmtree(self._directory.parent, ignore_errors=True)
            raise RuntimeError(f"verl-sf serve did not start on node {self.node_id}: {self._error}")

    def _supervise(self) -> None:
        port = 0
        while not self._stopping.is_set():
            try:
                proc, url = start_server_process(*self.serve_args, host=self.node_ip, port=port,
                                                 preexec_fn=die_with_parent, timeout=START_TIMEOUT_S)
            except RuntimeError as exc:
                with self._lock:
                    self._error = str(exc)
                log.error("verl-sf serve failed to start on %s:%s: %s", self.node_ip, port, exc)
                port = 0  # the old port may be taken: any free one will do
                self._first_start.set()
                time.sleep(RESTART_BACKOFF_S)
                continue
            with self._lock:
                self._proc, self._url, self._error = proc, url, None
                self._generation += 1
            # Whatever else it prints must not fill the pipe and stall it; Ray's log has its stderr.
            threading.Thread(target=_drain, args=(proc,), name="verl-sf-serve-stdout", daemon=True).start()
            self._first_start.set()
            port = int(url.rsplit(":", 1)[1])  # come back on the same URL after a crash
            code = proc.wait()
            with self._lock:
                self._url = None
            if not self._stopping.is_set():
                log.warning("verl-sf serve on %s exited with %s; restarting it", url, code)

    def info(self) -> ServerInfo:
        with self._lock:
            return ServerInfo(node_id=self.node_id, node_ip=self.node_ip, url=self._url,
                              pid=self._proc.pid if self._proc and self._url else None,
                              generation=self._generation, restarts=max(0, self._generation - 1), error=self._error)

    def health(self, timeout_s: float = 5.0) -> dict[str, Any]:
        """The server's /health answer, or `{"status": "down", "error": ...}` when it has none."""
        url = self.info()["url"]
        if url is None:
            return {"status": "down", "error": self._error or "restarting"}
        try:
            with urllib.request.urlopen(url + "/health", timeout=timeout_s) as response:
                return json.loads(response.read())
        except (OSError, urllib.error.URLError, ValueError) as exc:
            return {"status": "down", "error": str(exc)}

    def set_fleet(self, servers: dict[str, str]) -> None:
        """The fleet's servers now (node tag -> URL), for the server to route sandbox calls by."""
        if servers == self._servers or self._stopping.is_set():
            return
        staged = self._directory.with_suffix(".new")
        staged.write_text(json.dumps({"servers": servers}))
        os.replace(staged, self._directory)  # the server never reads half a directory
        self._servers = dict(servers)

    def stop(self) -> None:
        """Stop the server (SIGTERM: it ends its sandboxes and removes its cgroups) and do not restart it."""
        self._stopping.set()
        with self._lock:
            proc = self._proc
        if proc is not None:
            stop_server_process(proc)
        self._thread.join(timeout=30)
        shutil.rmtree(self._directory.parent, ignore_errors=True)
