"""Real `verl-sf serve` processes on 127.0.0.1 for tests (no in-process shortcuts)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

import pytest
import requests

import verl_sf
from tests import container_profile, leaks
from verl_sf.server.process import start_server_process, stop_server_process


@dataclasses.dataclass
class ServerHandle:
    url: str  # base URL, e.g. http://127.0.0.1:41234
    process: subprocess.Popen
    as_root: bool = True  # started as root (two-uid map, cgroups) or as an ordinary account

    @property
    def run_code_url(self) -> str:
        return self.url + "/run_code"


def start_server(*extra_args: str, env: dict[str, str] | None = None, timeout: float = 120.0,
                 stderr: IO[str] | None = None, preexec_fn: Callable[[], None] | None = None) -> ServerHandle:
    """Start `verl-sf serve --port 0` and wait for its 'listening on' line."""
    proc, url = start_server_process(*extra_args, env=env, timeout=timeout, stderr=stderr, preexec_fn=preexec_fn)
    leaks.SERVERS.add(proc.pid)
    return ServerHandle(url, proc)


def stop_server(proc: subprocess.Popen) -> None:
    stop_server_process(proc)


def daytona_env(key: str) -> Callable[[str], dict[str, str]]:
    """What a `daytona` SDK user sets to reach a server: its /api, and a key."""
    return lambda url: {"DAYTONA_API_URL": f"{url}/api", "DAYTONA_API_KEY": key}


@contextlib.contextmanager
def server_for_sdk(client_env: Callable[[str], dict[str, str]], *extra_args: str) -> Iterator[ServerHandle]:
    """A server, and this process's environment set as an SDK's users set it (`client_env` of the
    server's URL: E2B_API_URL=..., DAYTONA_API_URL=...) while it runs; the environment is restored."""
    handle = start_server(*extra_args)
    try:
        with client_environment(client_env(handle.url)):
            yield handle
    finally:
        stop_server(handle.process)


@contextlib.contextmanager
def client_environment(values: dict[str, str]) -> Iterator[None]:
    """This process's environment with `values` set while the block runs; restored after."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
CI_ACCOUNT = "verlsf-ci" if _WORKER == "gw0" else f"verlsf-ci-{_WORKER}"
"""The ordinary account the non-root server runs as (scripts/dev.sh creates it; so does this fixture).
One per pytest-xdist worker: an account's RLIMIT_NPROC counts every process of it on the machine,
so a fork bomb on one worker's non-root server would otherwise fail the other worker's runs."""


def ci_account() -> pwd.struct_passwd:
    """The non-root account, created (system account, no login, no home) when missing."""
    try:
        return pwd.getpwnam(CI_ACCOUNT)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", CI_ACCOUNT],
                       check=True, capture_output=True)
        return pwd.getpwnam(CI_ACCOUNT)


def start_server_as_user(*extra_args: str, extra_env: dict[str, str] | None = None, timeout: float = 120.0,
                         stderr: IO[str] | None = None,
                         preexec_fn: Callable[[], None] | None = None) -> tuple[ServerHandle, str]:
    """`verl-sf serve` as an ordinary account: as root, the CI account; otherwise ourselves.
    Returns the handle and the server's private HOME/TMPDIR (the caller removes it).

    The account must be able to read the interpreter, the venv and this checkout; a checkout
    under a private (0700) directory cannot be, and is reported as such rather than worked around."""
    if os.geteuid() != 0:
        home = tempfile.mkdtemp(prefix="verl-sf-user-")
        env = {**os.environ, **(extra_env or {}), "HOME": home, "TMPDIR": home}
        handle = start_server(*extra_args, env=env, timeout=timeout, stderr=stderr, preexec_fn=preexec_fn)
        return dataclasses.replace(handle, as_root=False), home
    account = ci_account()
    home = tempfile.mkdtemp(prefix="verl-sf-ci-", dir="/tmp")
    os.chown(home, account.pw_uid, account.pw_gid)
    env = {**os.environ, **(extra_env or {}), "HOME": home, "TMPDIR": home, "USER": CI_ACCOUNT, "LOGNAME": CI_ACCOUNT}
    # The account must import this very checkout: an unreadable PYTHONPATH entry is skipped
    # silently, and another installed copy of verl_sf would be tested in its place.
    probe = subprocess.run([sys.executable, "-c", "import verl_sf.cli; print(verl_sf.__file__)"], env=env,
                           capture_output=True, text=True, user=CI_ACCOUNT, group=account.pw_gid, extra_groups=[],
                           cwd=home)
    if probe.returncode != 0 or probe.stdout.strip() != verl_sf.__file__:
        shutil.rmtree(home, ignore_errors=True)
        raise RuntimeError(
            f"the account {CI_ACCOUNT!r} cannot run {sys.executable} with this checkout ({verl_sf.__file__}; it "
            f"imported {probe.stdout.strip() or 'nothing'}): {probe.stderr.strip()[-400:]}\n"
            "The non-root tests need the venv and the checkout readable by every user: clone into a "
            "directory whose parents are world-traversable (e.g. /opt or /tmp, not under a 0700 home).")
    proc, url = start_server_process(*extra_args, env=env, timeout=timeout, user=CI_ACCOUNT, stderr=stderr,
                                     preexec_fn=preexec_fn)
    leaks.SERVERS.add(proc.pid)
    return ServerHandle(url, proc, as_root=False), home


# The shared server holds this in its environment, as a real one would hold an API key.
SERVER_SECRET = "verl-sf-test-secret-7f3a9c"


@pytest.fixture(scope="session")
def sf_server() -> Iterator[ServerHandle]:
    """One shared server for the whole session, default (isolated) configuration."""
    handle = start_server(env={**os.environ, "VERL_SF_TEST_SECRET": SERVER_SECRET})
    yield handle
    stop_server(handle.process)


def run_code(server: ServerHandle, code: str, language: str = "python", **fields) -> dict:
    """POST /run_code and return the JSON answer (asserting HTTP 200); the client waits for the
    compile and run time-outs asked, twice over (a queued case waits for one ahead of it), and a minute."""
    waits = 2 * (fields.get("compile_timeout", 10) + fields.get("run_timeout", 10)) + 60
    response = requests.post(server.run_code_url, json={"code": code, "language": language, **fields},
                             timeout=max(120, waits))
    assert response.status_code == 200, response.text
    return response.json()


def runs_finished(server: ServerHandle) -> float:
    """Requests the server has finished, from its Prometheus counter (`verl_sf_runs_total`)."""
    text = requests.get(server.url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("verl_sf_runs_total{"))


def run_code_batch(server: ServerHandle, cases: dict[str, tuple[str, str, dict[str, Any]]]) -> dict[str, dict]:
    """POST every case (key -> (code, language, fields)) at once; the server queues them, so
    slow start-ups (JVMs) and sleeps overlap instead of adding up."""
    with ThreadPoolExecutor(8) as pool:
        futures = {key: pool.submit(run_code, server, code, language=language, **fields)
                   for key, (code, language, fields) in cases.items()}
        return {key: future.result() for key, future in futures.items()}


SERVER_MODES = ["root", "non-root"] if os.geteuid() == 0 else ["non-root"]
"""How the isolation suites start their servers: as root (when we are) and as an ordinary account."""
CONTAINER_MODES = [f"{mode}-container" for mode in SERVER_MODES]
"""The same, inside a container's default profile (tests/container_profile.py): the landlock rung."""


def as_background_job() -> None:
    """What a non-interactive shell does to a command it starts with `&` (POSIX): SIGINT and SIGQUIT
    ignored, which the command inherits unless it sets them itself."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)


@contextlib.contextmanager
def server_in_mode(mode: str, *extra_args: str, extra_env: dict[str, str] | None = None,
                   background_job: bool = False) -> Iterator[ServerHandle]:
    """`background_job`: started as a shell starts `verl-sf serve &`, with SIGINT and SIGQUIT ignored."""
    home = None
    steps = [step for step, wanted in ((as_background_job, background_job),
                                       (container_profile.enter, mode.endswith("-container"))) if wanted]
    preexec_fn = (lambda: [step() for step in steps] and None) if steps else None
    if mode.startswith("root"):
        handle = start_server(*extra_args, env={**os.environ, **(extra_env or {})}, preexec_fn=preexec_fn)
    else:
        handle, home = start_server_as_user(*extra_args, extra_env=extra_env, preexec_fn=preexec_fn)
    try:
        yield handle
    finally:
        stop_server(handle.process)
        if home:
            shutil.rmtree(home, ignore_errors=True)


@contextlib.contextmanager
def e2b_environment(handle: ServerHandle, api_key: str) -> Iterator[None]:
    """The E2B SDKs pointed at `handle` as their users point them: by environment variables only."""
    with client_environment({"E2B_API_URL": handle.url, "E2B_SANDBOX_URL": handle.url, "E2B_API_KEY": api_key}):
        yield
