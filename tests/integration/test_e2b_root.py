"""E2B's `user="root"` through the real SDK: uid 0 of the sandbox's own user namespace, never the
host's root, contained as every run is; refused, with the reason, on the landlock rung.

Every server mode the isolation suites use: as root and as an ordinary account, on the namespaces
rung and inside a container's default profile (the landlock rung).  What a process is on the host
is read from the host's /proc, never from inside the sandbox.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from e2b import CommandExitException, InvalidArgumentException, SandboxException
from e2b_code_interpreter import Sandbox

from tests.host_view import host_uid, run_processes
from tests.server_fixtures import CONTAINER_MODES, SERVER_MODES, ServerHandle, e2b_environment, server_in_mode
from tests.waiting import wait_until

API_KEY = "e2b_" + "7" * 40


@pytest.fixture(scope="module", params=[*SERVER_MODES, *CONTAINER_MODES])
def server(request: pytest.FixtureRequest) -> Iterator[ServerHandle]:
    with server_in_mode(request.param, "--slots", "2", "--preload", "") as handle, e2b_environment(handle, API_KEY):
        yield handle


@pytest.fixture
def sandbox(server: ServerHandle) -> Iterator[Sandbox]:
    box = Sandbox.create(timeout=120)
    yield box
    box.kill()


def rung(server: ServerHandle) -> str:
    return str(requests.get(server.url + "/health", timeout=10).json()["isolation"])


def run(sandbox: Sandbox, command: str, user: str = "root") -> tuple[int, str, str]:
    try:
        result = sandbox.commands.run(command, user=user, timeout=30)
        return result.exit_code, result.stdout, result.stderr
    except CommandExitException as exc:
        return exc.exit_code, exc.stdout, exc.stderr


def host_processes_with(server: ServerHandle, marker: str) -> list[int]:
    found = []
    for pid in run_processes(server.process.pid):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found


def test_root_is_uid_0_of_a_namespace_of_its_own(server: ServerHandle, sandbox: Sandbox) -> None:
    if rung(server) == "landlock":
        with pytest.raises(SandboxException, match="not offered on the landlock isolation rung"):
            sandbox.commands.run("id -u", user="root")
        assert run(sandbox, "id -u", user="user")[0] == 0  # the sandbox's user is untouched
        return
    assert run(sandbox, "id -u; id -g") == (0, "0\n0\n", "")
    user_uid = run(sandbox, "id -u", user="user")[1].strip()
    user_gid = run(sandbox, "id -g", user="user")[1].strip()
    # One entry: root here is the sandbox's user outside, and no other id exists in its namespace.
    code, uid_map, _ = run(sandbox, "cat /proc/self/uid_map /proc/self/gid_map")
    assert code == 0 and [line.split() for line in uid_map.splitlines()] == [["0", user_uid, "1"], ["0", user_gid, "1"]]
    assert run(sandbox, "readlink /proc/self/ns/user")[1] != run(sandbox, "readlink /proc/self/ns/user", "user")[1]
    # On the host, root's processes and the user's have one uid, and it is not the host's root.
    marker = f"60.{secrets.randbelow(10**9):09d}"  # a sleep's length: its command line, seen from the host
    roots = sandbox.commands.run(f"sleep {marker}1", user="root", background=True)
    users = sandbox.commands.run(f"sleep {marker}2", user="user", background=True)
    [root_pid] = wait_until(lambda: host_processes_with(server, f"{marker}1"), 10, "root's sleep on the host")
    [user_pid] = wait_until(lambda: host_processes_with(server, f"{marker}2"), 10, "the user's sleep on the host")
    assert host_uid(root_pid) == host_uid(user_pid) != 0
    # Both are ended by the SDK's kill, whoever started them.
    assert sandbox.commands.kill(roots.pid) and sandbox.commands.kill(users.pid)
    wait_until(lambda: not host_processes_with(server, marker), 10, "the killed commands gone from the host")


def test_root_changes_nothing_of_the_system_and_reaches_nothing_outside(server: ServerHandle, sandbox: Sandbox) -> None:
    if rung(server) == "landlock":
        return  # root is refused there (the test above)
    for attack in (
        "touch /etc/verl-sf-root",
        "echo x >> /etc/passwd",
        "touch /usr/bin/verl-sf-root",
        "mount -t tmpfs none /mnt",
        "unshare -U true",
        "unshare -m true",
        "chroot / true",
        "echo 1 > /proc/sys/kernel/sysrq",
        "hostname pwned",
        "chown 4242 /home/user",
    ):
        code, _, _ = run(sandbox, attack)
        assert code != 0, attack
    # Capabilities hold in its own namespace only: none over the sandbox's (no seccomp-free mount, no ptrace).
    code, out, _ = run(sandbox, "cat /proc/1/environ; cat /proc/1/maps | head -1")
    assert "PATH=" not in out and "python" not in out
    # Another sandbox's files and processes are out of sight.
    other = Sandbox.create(timeout=60)
    try:
        secret = secrets.token_hex(8)
        other.files.write("/home/user/secret.txt", secret)
        other.commands.run(f"sleep 60 & echo {secret} > /tmp/secret.txt; wait", background=True)
        # The secret is in no command line of ours: only a leak could print it.
        _, seen, _ = run(
            sandbox,
            "cat /proc/*/cmdline /proc/*/environ 2>/dev/null | tr '\\0' ' '; "
            "cat /proc/*/root/home/user/secr* /proc/*/root/tmp/secr* /proc/*/cwd/secr* 2>/dev/null; "
            "find / -name 'secr*' -type f -exec cat {} + 2>/dev/null",
        )
        assert secret not in seen
    finally:
        other.kill()


def test_root_and_the_user_share_one_home(server: ServerHandle, sandbox: Sandbox) -> None:
    if rung(server) == "landlock":
        return
    assert run(sandbox, "echo from-root > /home/user/by-root.txt && cd /tmp && echo tmp > t.txt && pwd") == (
        0,
        "/tmp\n",
        "",
    )
    assert run(sandbox, "cat /home/user/by-root.txt /tmp/t.txt; pwd", user="user") == (
        0,
        "from-root\ntmp\n/home/user\n",
        "",
    )
    assert sandbox.files.read("/home/user/by-root.txt") == "from-root\n"
    assert sandbox.run_code("print(open('/home/user/by-root.txt').read().strip())").logs.stdout == ["from-root\n"]
    sandbox.files.write("/home/user/by-sdk.txt", "sdk")
    assert run(sandbox, "cat by-sdk.txt; rm by-sdk.txt by-root.txt; ls") == (0, "sdk", "")


def test_unknown_users_are_refused_and_nothing_else_breaks(sandbox: Sandbox) -> None:
    with pytest.raises(InvalidArgumentException, match="unknown user 'bob'"):
        sandbox.commands.run("id", user="bob")
    assert run(sandbox, "echo still", user="user") == (0, "still\n", "")


def test_root_commands_hold_no_descriptor_of_the_helper(server: ServerHandle, sandbox: Sandbox) -> None:
    """A command cannot write its own end: the helper's pipes are not inherited (red team F4)."""
    if rung(server) == "landlock":
        return
    assert run(sandbox, "ls /proc/$$/fd") == run(sandbox, "ls /proc/$$/fd", user="user")
    assert run(sandbox, "for fd in 3 4 5 6 7 8 9; do echo '{\"exit\": 0}' >&$fd; done 2>/dev/null; exit 3")[0] == 3


def test_code_in_the_session_cannot_shift_or_take_roots_answers(server: ServerHandle, sandbox: Sandbox) -> None:
    """The session's code holds the helper's socket (fd 8): garbage queued on it and a thread reading
    it change nothing of a root command's start, output or end (red team F1)."""
    if rung(server) == "landlock":
        return
    execution = sandbox.run_code(
        "import os, socket, threading\n"
        "_s = socket.socket(fileno=os.dup(8)); _s.setblocking(False)\n"
        "for _ in range(300):\n"
        "    try: _s.send(b'garbage')\n"
        "    except BlockingIOError: break\n"
        "_s.setblocking(True)\n"
        "threading.Thread(target=lambda: [_s.recv(65536) for _ in iter(int, 1)], daemon=True).start()\n"
    )
    assert execution.error is None
    for _ in range(3):
        assert run(sandbox, "echo hi; exit 4") == (4, "hi\n", "")
