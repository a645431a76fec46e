"""Hostile code against a real server: each attack is contained and the server keeps serving.

Host-side checks look at the host itself (its files, its process table), not at what the
sandbox reports, so a test cannot pass because the sandbox lied.  Every server is started as root
and as an ordinary account, on the host (the namespaces rung) and in a reproduced container
profile (the landlock rung); where a rung gives less, the test holds it to what docs/security.md
says of that rung.
"""

from __future__ import annotations

import array
import ast
import fcntl
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from tests.cgroup_layout import group_bases, server_groups
from tests.host_view import run_processes
from tests.server_fixtures import (
    CONTAINER_MODES,
    SERVER_MODES,
    SERVER_SECRET,
    ServerHandle,
    ci_account,
    run_code,
    server_in_mode,
    start_server,
    start_server_as_user,
    stop_server,
)
from tests.waiting import wait_until


def landlock(server: ServerHandle) -> bool:
    """Is this server on the landlock rung (no namespaces)?"""
    return requests.get(server.url + "/health", timeout=10).json()["isolation"] == "landlock"


@pytest.fixture(scope="module", params=[*SERVER_MODES, *CONTAINER_MODES])
def server(request: pytest.FixtureRequest) -> Iterator[ServerHandle]:
    """The default configuration, started as root and as an ordinary account; its environment holds
    a secret, as a real server's would hold an API key."""
    with server_in_mode(request.param, extra_env={"VERL_SF_TEST_SECRET": SERVER_SECRET}) as handle:
        yield handle


def sandbox_processes(server: ServerHandle) -> list[str]:
    """Processes of `server`'s runs still alive on the host (read from the host's /proc)."""
    found = []
    for pid in run_processes(server.process.pid):
        try:
            found.append(f"{pid} {Path(f'/proc/{pid}/cmdline').read_bytes()[:80]!r}")
        except OSError:
            continue
    return found


def assert_no_sandbox_processes_remain(server: ServerHandle) -> None:
    """The answer may leave before the kernel finishes tearing the run down; allow it a moment."""
    wait_until(lambda: sandbox_processes(server) == [], 5, "no sandbox process remains")


def assert_alive(server: ServerHandle) -> None:
    assert server.process.poll() is None, "server died"
    assert run_code(server, "print('alive')")["run_result"]["stdout"] == "alive\n"


@pytest.fixture(scope="module", params=[*SERVER_MODES, *CONTAINER_MODES])
def one_slot_server(request: pytest.FixtureRequest) -> Iterator[ServerHandle]:
    """A single sandbox, so consecutive runs are guaranteed to share it."""
    with server_in_mode(request.param, "--slots", "1", "--sandboxes", "1", "--preload", "") as handle:
        yield handle


@pytest.fixture(scope="module", params=[mode for mode in [*SERVER_MODES, *CONTAINER_MODES] if mode != "non-root-container"])
def one_sandbox_server(request: pytest.FixtureRequest) -> Iterator[ServerHandle]:
    """A single sandbox, so runs at once share it.  Not on the landlock rung as an ordinary account,
    where every run is the server's uid and RLIMIT_NPROC is all of theirs (docs/security.md)."""
    with server_in_mode(request.param, "--sandboxes", "1", "--preload", "") as handle:
        yield handle


def test_runs_leave_no_process_behind_and_the_check_sees_live_ones(server: ServerHandle) -> None:
    """The host-side process check used below finds a run's processes while it runs."""
    thread = threading.Thread(target=run_code, args=(server, "import time; time.sleep(3)"), daemon=True)
    thread.start()
    wait_until(lambda: sandbox_processes(server), 20, "a running run is seen from the host")
    thread.join(timeout=30)
    assert_no_sandbox_processes_remain(server)


def test_code_runs_as_unprivileged_uid_without_capabilities(server: ServerHandle) -> None:
    body = run_code(server, "import os\nprint(os.getuid(), os.geteuid(), os.getgid())\n"
                            "print(open('/proc/self/status').read())")
    lines = body["run_result"]["stdout"].splitlines()
    if landlock(server):  # as root a host uid of the run's own; else the server's own uid, capability-less
        uid = int(lines[0].split()[0])
        assert 110000 <= uid < 160000 if server.as_root else uid == host_uid_of(server), lines[0]
    else:  # as root a second uid is mapped for runs; an ordinary user's only uid is 0 inside, with no capability
        assert lines[0] == ("1000 1000 1000" if server.as_root else "0 0 0")
    status = dict(line.split(":\t", 1) for line in lines[1:] if ":\t" in line)
    # An ordinary user cannot empty a bounding set (no CAP_SETPCAP): with no_new_privs it gains nothing.
    sets = ("CapInh", "CapPrm", "CapEff", "CapAmb") if landlock(server) and not server.as_root else \
        ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")
    for cap in sets:
        assert int(status[cap], 16) == 0, (cap, status[cap])
    assert status["NoNewPrivs"].strip() == "1"


def test_no_network_not_even_the_servers_own_port(server: ServerHandle) -> None:
    port = int(server.url.rsplit(":", 1)[1])
    code = (f"import socket\ntry:\n    socket.socket().close()\n    print(sorted(line.split(':')[0].strip() for line in open('/proc/net/dev').readlines()[2:]))\n"
            f"except OSError as e:\n    print('no sockets', e.errno)\n"
            f"try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n    print('CONNECTED')\n"
            f"except OSError as e:\n    print('refused', type(e).__name__)\n")
    out = run_code(server, code)["run_result"]["stdout"]
    assert out.splitlines()[0] == ("no sockets 1" if landlock(server) else "['lo']")  # landlock: socket() refused
    assert "CONNECTED" not in out and "refused" in out
    assert_alive(server)


def test_server_environment_is_not_visible(server: ServerHandle) -> None:
    pid = server.process.pid
    code = (f"import os\nprint(dict(os.environ))\n"
            f"for path in ['/proc/{pid}/environ', '/proc/1/environ', '/proc/self/environ']:\n"
            f"    try:\n        print(path, open(path, 'rb').read())\n    except OSError as e:\n        print(path, e)\n")
    out = run_code(server, code)["run_result"]["stdout"]
    assert SERVER_SECRET not in out
    assert "VERL_SF_TEST_SECRET" not in out
    if landlock(server):  # the server is in the process table, but Landlock scopes ptrace rights away
        assert f"/proc/{pid}/environ [Errno 13]" in out or f"/proc/{pid}/environ [Errno 1]" in out, out
    else:
        assert f"/proc/{pid}/environ [Errno 2]" in out  # the server is not even in the sandbox's process table


@pytest.fixture
def secret_file() -> Iterator[Path]:
    path = Path("/root") / f"verl_sf_secret_{secrets.token_hex(4)}.txt"
    path.write_text("TOP-SECRET-CONTENT")
    path.chmod(0o600)
    yield path
    path.unlink()


def test_host_files_and_home_are_not_readable(server: ServerHandle, secret_file: Path, tmp_path: Path) -> None:
    host_tmp_file = Path("/tmp") / f"verl_sf_host_tmp_{secrets.token_hex(4)}"
    host_tmp_file.write_text("host tmp")
    try:
        code = (f"import os\n"
                f"for action in [lambda: open('{secret_file}').read(), lambda: os.listdir('/root'),\n"
                f"               lambda: os.listdir('/home'), lambda: os.listdir('/tmp'),\n"
                f"               lambda: open('/etc/shadow').read(), lambda: open('{host_tmp_file}').read()]:\n"
                f"    try:\n        print('GOT', action())\n    except OSError as e:\n        print('denied', e.errno)\n")
        out = run_code(server, code)["run_result"]["stdout"]
    finally:
        host_tmp_file.unlink()
    assert "TOP-SECRET-CONTENT" not in out and secret_file.name not in out
    lines = out.splitlines()
    assert lines[0].startswith("denied") and lines[1].startswith("denied")  # secret file, /root listing
    assert lines[4].startswith("denied")
    if landlock(server):  # no /tmp of its own: the host's is there, and out of reach
        assert lines[3].startswith("denied") and lines[5].startswith("denied"), lines
    else:
        assert lines[3].startswith("GOT [") and host_tmp_file.name not in lines[3]  # the sandbox's own /tmp
        assert lines[5] == "denied 2"  # the host's /tmp file does not exist inside


def test_server_files_are_not_visible(server: ServerHandle) -> None:
    import verl_sf

    package_dir = os.path.dirname(verl_sf.__file__)
    if landlock(server):  # names may be seen (stat), contents not (docs/security.md)
        out = run_code(server, f"import os\ntry:\n    print(open({package_dir!r} + '/__init__.py').read())\n"
                               "except OSError as e:\n    print('denied', e.errno)\n")
        assert out["run_result"]["stdout"] == "denied 13\n"
        return
    out = run_code(server, f"import os\nprint(os.path.exists({package_dir!r}), os.path.exists('/work/main/tests'))")
    assert out["run_result"]["stdout"] == "False False\n"


def test_writes_outside_the_workdir_never_reach_the_host(server: ServerHandle) -> None:
    token = secrets.token_hex(6)
    targets = [f"/tmp/verl_sf_{token}", f"/root/verl_sf_{token}", f"/usr/verl_sf_{token}", f"/etc/verl_sf_{token}"]
    code = (f"for path in {targets!r}:\n    try:\n        open(path, 'w').write('x')\n        print('wrote', path)\n"
            f"    except OSError as e:\n        print('denied', path, e.errno)\n")
    run_code(server, code)
    for path in targets:
        assert not os.path.exists(path), path


def test_nothing_of_one_run_is_visible_to_the_next(one_slot_server: ServerHandle) -> None:
    first = ("import os, sys, math, builtins, tempfile\n"
             "open('left_behind.txt', 'w').write('x')\n"
             "open(os.path.join(tempfile.gettempdir(), 'tmp_left.txt'), 'w').write('x')\n"
             "math.pi = 3; builtins.LEAK = 1; sys.modules['json'] = None; globals()['g'] = 1\n"
             "sys.stdout.reconfigure(errors='strict', line_buffering=True); sys.stdout.leak = 1\n"
             "import subprocess; subprocess.Popen(['sleep', '300'])\n"
             "print('planted')")
    assert run_code(one_slot_server, first)["run_result"]["stdout"] == "planted\n"
    second = ("import os, math, builtins, json, tempfile\n"
              "print(sorted(e for e in os.listdir('.') if e != '.tmp'), 'tmp_left.txt' in os.listdir(tempfile.gettempdir()))\n"
              "print(math.pi, hasattr(builtins, 'LEAK'), 'g' in globals())\n"
              "import sys; print(sys.stdout.errors, sys.stdout.line_buffering, hasattr(sys.stdout, 'leak'))\n"
              "print([p for p in os.listdir('/proc') if p.isdigit()])")
    lines = run_code(one_slot_server, second)["run_result"]["stdout"].splitlines()
    assert lines[0] == "[] False"
    assert lines[1] == "3.141592653589793 False False"
    assert lines[2] == "backslashreplace False False"  # the streams are the zygote's, one copy per run
    if not landlock(one_slot_server):  # the landlock rung's /proc shows the host's processes
        assert lines[3] == "['1']"  # only this run's own process
    assert_no_sandbox_processes_remain(one_slot_server)


def test_signals_cannot_reach_the_server_or_the_sandbox_supervisor(server: ServerHandle) -> None:
    pid = server.process.pid
    code = (f"import os, signal\n"
            f"for target in [{pid}, os.getppid(), 2, -1]:\n"
            f"    try:\n        os.kill(target, signal.SIGKILL)\n        print('sent', target)\n"
            f"    except OSError as e:\n        print('failed', target, e.errno)\n"
            f"print('ppid', os.getppid())\n")
    body = run_code(server, code)
    assert f"sent {pid}" not in body["run_result"]["stdout"]
    assert_alive(server)
    assert_alive(server)  # every slot still works: run a couple more
    assert server.process.poll() is None


def test_ptrace_of_anything_outside_is_impossible(server: ServerHandle) -> None:
    code = ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "r = libc.ptrace(16, 2, 0, 0)\nprint(r, ctypes.get_errno())\n")  # PTRACE_ATTACH pid 2
    out = run_code(server, code)["run_result"]["stdout"].split()
    assert out[0] == "-1"
    assert_alive(server)


def test_fork_bomb_is_contained(server: ServerHandle) -> None:
    code = ("import os\ncount = 0\nfor _ in range(100000):\n    try:\n        if os.fork() == 0:\n"
            "            import time; time.sleep(60); os._exit(0)\n        count += 1\n"
            "    except OSError:\n        break\nprint('forked', count)\n")
    threads_before = int(Path("/proc/loadavg").read_text().split()[3].split("/")[1])
    body = run_code(server, code, run_timeout=10)
    out = body["run_result"]["stdout"]
    if landlock(server) and not server.as_root:
        # The server's uid: RLIMIT_NPROC at the machine's threads plus the cap, or the watchdog first.
        assert "forked" not in out or int(out.split()[1]) < threads_before + 300 + 200, body
    else:
        forked = int(out.split()[1])
        assert forked < 300  # the per-run process cap (256) stopped it
    assert_no_sandbox_processes_remain(server)
    assert_alive(server)


def test_a_fork_bomb_at_its_cap_leaves_other_runs_their_forks(one_sandbox_server: ServerHandle) -> None:
    """A bomb that keeps its processes at its cap for its whole time-out takes nothing of another run's
    (a pids cgroup per run; or, as an ordinary account, a user namespace per run that RLIMIT_NPROC counts
    apart: the sandbox's one uid made every run of it share the bomb's 256)."""
    bomb = ("import os, time\nstarted = time.time()\nwhile time.time() - started < 6:\n    try:\n"
            "        if os.fork() == 0:\n            time.sleep(30)\n            os._exit(0)\n"
            "    except OSError:\n        time.sleep(0.001)\n")
    victim = ("import subprocess, time\ntime.sleep(1.5)\nfailed = 0\nfor _ in range(40):\n    try:\n"
              "        subprocess.run(['true'])\n    except OSError:\n        failed += 1\nprint('failed', failed)\n")
    with ThreadPoolExecutor(2) as pool:
        bombing = pool.submit(run_code, one_sandbox_server, bomb, run_timeout=8)
        time.sleep(0.5)
        body = run_code(one_sandbox_server, victim, run_timeout=20)
        bombing.result()
    assert body["run_result"]["stdout"] == "failed 0\n", body
    assert_no_sandbox_processes_remain(one_sandbox_server)


def test_setsid_double_fork_daemon_does_not_survive(server: ServerHandle) -> None:
    code = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            "        time.sleep(300)\n    os._exit(0)\ntime.sleep(0.2)\nprint('parent done')\n")
    body = run_code(server, code, run_timeout=20)
    # The run ends with its main process (the daemon holding its stdout dies with it), not at the time-out.
    assert body["status"] == "Success" and body["run_result"]["status"] == "Finished", body
    assert body["run_result"]["stdout"] == "parent done\n"
    assert_no_sandbox_processes_remain(server)


def test_memory_bomb_without_limit_hits_the_default_cap(server: ServerHandle) -> None:
    body = run_code(server, "x = bytearray(16 << 30)\nprint('allocated')", run_timeout=30)
    assert body["status"] == "Failed"
    assert "allocated" not in body["run_result"]["stdout"]
    assert_alive(server)


SHARED_MEMORY_BOMB = ("import mmap, time\nm = mmap.mmap(-1, 1 << 30, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)\n"
                      "for i in range(0, 1 << 30, 4096):\n    m[i] = 1\ntime.sleep(2)\nprint('allocated')\n")
HIDDEN_MEMORY_BOMBS = {
    # Undumpable, a process's /proc memory files are closed to a watchdog of its uid without CAP_SYS_PTRACE.
    "undumpable": "import ctypes\nctypes.CDLL(None).prctl(4, 0, 0, 0, 0)\n" + SHARED_MEMORY_BOMB,
    # So is one that runs a program it cannot read (its own copy of the interpreter, mode 0111).
    "unreadable_program": "import os, shutil, sys\nshutil.copy(sys.executable, 'python')\nos.chmod('python', 0o111)\n"
                          f"os.execv('python', ['python', '-c', {SHARED_MEMORY_BOMB!r}])\n",
    # A leader that ended its own thread reads as gone in /proc while its other threads hold its memory.
    "exited_leader": "import ctypes, os, threading\nif os.fork() == 0:\n"
                     f"    threading.Thread(target=exec, args=({SHARED_MEMORY_BOMB!r},)).start()\n"
                     "    ctypes.CDLL(None).pthread_exit(None)\nraise SystemExit(os.waitstatus_to_exitcode(os.wait()[1]))\n",
}


@pytest.mark.parametrize("hiding", sorted(HIDDEN_MEMORY_BOMBS))
def test_a_memory_bomb_that_hides_from_the_watchdog_is_ended(server: ServerHandle, hiding: str) -> None:
    """Shared anonymous memory (RLIMIT_DATA does not count it) in a process the watchdog may not read."""
    body = run_code(server, HIDDEN_MEMORY_BOMBS[hiding], memory_limit_MB=256, run_timeout=10)
    result = body["run_result"]
    assert "allocated" not in result["stdout"], body
    if hiding == "unreadable_program" and server.as_root and landlock(server):
        # A memory cgroup, and a program on disk that the run wrote: its own pages are charged to the
        # run, so at the cap the kernel reclaims and re-reads them rather than ending it (thrashing).
        assert body["status"] == "Failed" and result["status"] in ("Finished", "TimeLimitExceeded"), body
    else:
        assert body["status"] == "Failed" and result["status"] == "Finished", body  # ended well before the time-out
        assert "memory" in result["stderr"], body
    assert_no_sandbox_processes_remain(server)


def test_a_session_memory_bomb_that_hides_from_the_watchdog_ends_the_session(server: ServerHandle) -> None:
    """A session's interpreter is as measurable as a run: an undumpable one is ended, as one past its cap."""
    created = requests.post(server.url + "/sessions", json={"language": "python", "memory_limit_MB": 256}, timeout=60)
    assert created.status_code == 201, created.text
    session_id = created.json()["session_id"]
    time.sleep(1)  # five of the watchdog's samples: a session that hides nothing lives on
    assert run_code(server, "import time\ntime.sleep(1)", session_id=session_id)["status"] == "Success"
    body = run_code(server, HIDDEN_MEMORY_BOMBS["undumpable"], session_id=session_id, run_timeout=10)
    assert "allocated" not in body["run_result"]["stdout"], body
    assert body["status"] == "Failed" and body["run_result"]["status"] == "Finished", body
    assert "memory" in body["run_result"]["stderr"] + body.get("message", ""), body
    assert_no_sandbox_processes_remain(server)


def test_a_sysv_shared_memory_segment_does_not_outlive_its_run(server: ServerHandle) -> None:
    """SysV IPC objects live in an IPC namespace: the run's own, gone with it; on the landlock rung,
    which has none, they would be the host's and outlive the run, so SysV IPC is refused there (and
    wherever there is no memory cgroup: the next test)."""
    size = 1_234_567 + secrets.randbelow(1000)  # a size no other segment on the host has
    code = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            f"print(libc.shmget(0, {size}, 0o1600) >= 0, ctypes.get_errno())\n")
    out = run_code(server, code)["run_result"]["stdout"]
    refused = "sysv_ipc" in requests.get(server.url + "/health", timeout=10).json()["limits"]
    assert refused or not landlock(server)
    assert out == "False 1\n" if refused else out.startswith("True "), out  # refused: EPERM
    segments = Path("/proc/sysvipc/shm").read_text().split("\n")[1:]
    assert not [line for line in segments if str(size) in line.split()], segments


def test_detached_sysv_segments_count_against_the_memory_cap(server: ServerHandle) -> None:
    """Twenty 60 MB segments, each written then detached: mapped by no process, they are beyond the
    watchdog, so without a memory cgroup SysV IPC is refused (and /health says so); with one, they
    are charged to the run, which is killed at its cap."""
    code = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.shmat.restype = ctypes.c_void_p\n"
            "held = 0\nfor _ in range(20):\n    segment = libc.shmget(0, 60 << 20, 0o1600)\n"
            "    if segment < 0:\n        print('refused', ctypes.get_errno()); break\n"
            "    address = libc.shmat(segment, None, 0)\n    ctypes.memset(address, 1, 60 << 20)\n"
            "    libc.shmdt(ctypes.c_void_p(address)); held += 60\nprint('held', held)\n")
    body = run_code(server, code, memory_limit_MB=128, run_timeout=20)
    result = body["run_result"]
    refused = result["stdout"] == "refused 1\nheld 0\n"  # EPERM
    assert refused or "memory limit of 128 MB exceeded" in result["stderr"], body
    limits = requests.get(server.url + "/health", timeout=10).json()["limits"]
    assert refused == ("sysv_ipc" in limits), limits
    assert_alive(server)


SOCKET_FILLERS = {
    # Socketpairs whose sending end is filled and never read: a unix socket's queue is charged to its sender.
    "unix": ("pairs = []\nfor _ in range(60):\n    a, b = socket.socketpair()\n"
             "    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 30)\n    fill(a)\n    pairs.append((a, b))\n"),
    # Loopback connections that never read what they are sent.
    "tcp": ("listener = socket.socket()\nlistener.bind(('127.0.0.1', 0))\nlistener.listen(100)\npairs = []\n"
            "for _ in range(100):\n    a = socket.create_connection(listener.getsockname())\n"
            "    pairs.append((a, listener.accept()[0]))\n    fill(a)\n"),
    # Datagram sockets that never read theirs.
    "udp": ("out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\nsinks = []\nfor _ in range(100):\n"
            "    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            "    sink.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 30)\n"
            "    sink.bind(('127.0.0.1', 0))\n    sinks.append(sink)\n"
            "    for _ in range(150):\n        out.sendto(b'x' * 60000, sink.getsockname())\n"),
    # Filled socketpairs sent over another and closed: held only in its queue, in no descriptor table.
    "in_flight": ("carrier, receiver = socket.socketpair()\ncarrier.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 30)\n"
                  "for _ in range(60):\n    a, b = socket.socketpair()\n"
                  "    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 30)\n    fill(a)\n"
                  "    carrier.sendmsg([b'.'], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array('i', [a.fileno(), b.fileno()]))])\n"
                  "    a.close(); b.close()\n"),
}


@pytest.mark.parametrize("filler", list(SOCKET_FILLERS))
def test_socket_buffers_count_against_the_memory_cap(server: ServerHandle, filler: str) -> None:
    """Socket buffers are kernel memory in no process's address space. A run that fills hundreds of
    megabytes of them is killed at its cap (the watchdog counts them through sock_diag; a cgroup
    charges them), or, where a v1 cgroup caps TCP and UDP buffers apart, holds no more than its cap:
    the kernel then stalls its sends and drops its datagrams. Before, 2.2 GB against a 128 MB cap."""
    code = ("import array, socket, time\n"
            "def fill(sock):\n    sock.setblocking(False)\n    while True:\n        try:\n"
            "            sock.send(b'x' * 65536)\n        except BlockingIOError:\n            return\n"
            + SOCKET_FILLERS[filler] +
            "held = 0\nfor kind in ('tcp', 'udp'):\n    for line in open(f'/proc/net/{kind}').read().splitlines()[1:]:\n"
            "        held += sum(int(queue, 16) for queue in line.split()[4].split(':'))\n"
            "print('held MB', held >> 20, flush=True)\ntime.sleep(1)\n")
    body = run_code(server, code, memory_limit_MB=128, run_timeout=20)
    result = body["run_result"]
    if landlock(server) and filler in ("tcp", "udp"):
        assert "PermissionError" in result["stderr"], body  # socket() is refused there
    elif landlock(server) and filler == "in_flight" and not server.as_root:
        pass  # open: no namespace of its own to count, nor a cgroup (docs/security.md, "What is not isolated")
    elif "memory limit of 128 MB exceeded" not in result["stderr"]:
        assert filler in ("tcp", "udp") and server.as_root, body  # capped apart by the cgroup, not killed
        assert result["stdout"].startswith("held MB ") and int(result["stdout"].split()[2]) <= 160, body
    assert_alive(server)


def test_page_tables_count_against_the_memory_cap(server: ServerHandle) -> None:
    """Red team, 2026-12-07: one byte read every 2 MiB of a sparse read-only mapping maps the shared
    zero page (no resident memory, no RLIMIT_DATA) and costs a 4 KiB page table each: 1 GB held
    against a 128 MB cap without a memory cgroup. The watchdog counts page tables (a cgroup charges them)."""
    code = ("import mmap, time\ntables = 64 * 1024  # 256 MB of them\n"
            "view = mmap.mmap(-1, tables << 21, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, prot=mmap.PROT_READ)\n"
            "total = sum(view[i << 21] for i in range(tables))\nprint('mapped', flush=True)\ntime.sleep(2)\n")
    body = run_code(server, code, memory_limit_MB=128, run_timeout=20)
    assert "memory limit of 128 MB exceeded" in body["run_result"]["stderr"], body
    assert_alive(server)


def test_an_idle_sessions_socket_buffers_end_it_past_its_cap(server: ServerHandle) -> None:
    """A call that returns at once, leaving a thread to fill 160 MB of socket buffers and keep them:
    the idle session is ended for its memory (on the landlock rung the watchdog reaches the
    namespace through the interpreter: the session's PID 1 is closed to it)."""
    created = requests.post(server.url + "/sessions", json={"language": "python", "memory_limit_MB": 128}, timeout=60)
    assert created.status_code == 201, created.text
    session_id = created.json()["session_id"]
    later = ("import socket, threading, time\npairs = []\ndef fill():\n    time.sleep(0.5)\n    for _ in range(20):\n"
             "        a, b = socket.socketpair()\n        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 30)\n"
             "        a.setblocking(False)\n        while True:\n            try:\n"
             "                a.send(b'x' * 65536)\n            except BlockingIOError:\n                break\n"
             "        pairs.append((a, b))\nthreading.Thread(target=fill).start()\n")
    started = run_code(server, later, session_id=session_id)
    assert started["session_alive"] is True and started["run_result"]["return_code"] == 0, started
    wait_until(lambda: requests.post(server.url + "/run_code", timeout=30, json={
        "code": "print(1)", "language": "python", "session_id": session_id}).status_code == 404, timeout=10,
        what="the idle session ended for its socket buffers")
    assert_alive(server)


def test_filling_the_workdir_is_capped(server: ServerHandle) -> None:
    code = ("chunk = b'z' * (1 << 20)\nwritten = 0\ntry:\n    with open('big.bin', 'wb') as f:\n"
            "        for _ in range(4096):\n            f.write(chunk); written += 1\nexcept OSError as e:\n"
            "    print('stopped', e.errno)\nprint('MB', written)\n")
    body = run_code(server, code, run_timeout=30)
    out = body["run_result"]["stdout"]
    assert "MB 4096" not in out
    assert body["run_result"]["return_code"] != 0 or "stopped" in out
    assert_alive(server)


def server_uid(server: ServerHandle) -> int:
    if server.as_root:
        return 0
    return ci_account().pw_uid if os.geteuid() == 0 else os.geteuid()


def inode_flags(path: Path) -> int:
    """What `lsattr` shows (FS_IOC_GETFLAGS); -1 on a file system without them."""
    flags = array.array("i", [0])
    try:
        with open(path, "rb") as file:
            fcntl.ioctl(file.fileno(), 0x80086601, flags, True)
    except OSError:
        return -1
    return flags[0]


@pytest.fixture
def owned_files(server: ServerHandle) -> Iterator[list[Path]]:
    """Files the server's own account owns, where every rung's runs could name them: one in a
    world-traversable directory under /tmp, one under /usr (which the landlock rung lets runs read)."""
    uid = server_uid(server)
    made = [Path(tempfile.mkdtemp(prefix="verl-sf-metadata-", dir=base)) for base in ("/tmp", "/usr/local/lib")]
    files = []
    for directory, mode in zip(made, (0o600, 0o644), strict=True):
        directory.chmod(0o755)
        path = directory / "owned"
        path.write_text("x")
        path.chmod(mode)
        os.chown(path, uid, -1)
        os.utime(path, (1_000_000, 1_000_000))
        files.append(path)
    yield files
    for directory in made:
        shutil.rmtree(directory)


def test_a_run_changes_the_metadata_of_no_file_outside_its_directory(server: ServerHandle,
                                                                   owned_files: list[Path]) -> None:
    """Landlock governs opening files, not chmod, utimes, chown or xattrs: on the landlock rung as an
    ordinary account a run is the server's uid, and made the account's files world-writable and its
    zygote's directory unusable (every later run failed to start) until the zygote made these changes
    for it, beneath its own directory only."""
    private, readable = (str(path) for path in owned_files)
    code = f"""import os
def attempt(name, action):
    try:
        action()
        print(name, 'changed')
    except OSError as e:
        print(name, 'refused', e.errno)
os.symlink({private!r}, 'link')
attempt('chmod', lambda: os.chmod({private!r}, 0o777))
attempt('chmod through a symlink', lambda: os.chmod('link', 0o777))
attempt('chmod relative', lambda: os.chmod(os.path.relpath({private!r}), 0o777))
attempt('chmod of the parent', lambda: os.chmod('..', 0o500))
attempt('utime', lambda: os.utime({private!r}, (5, 5)))
attempt('utime through a symlink', lambda: os.utime('link', (5, 5)))
os.symlink(os.path.dirname({private!r}), 'folder')
attempt('utime of a symlink named as a directory', lambda: os.utime('folder/', (5, 5), follow_symlinks=False))
attempt('chown', lambda: os.chown({private!r}, os.getuid(), os.getgid()))
attempt('setxattr', lambda: os.setxattr({private!r}, 'user.planted', b'1'))
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
for number in (90, 268, 280):  # chmod, fchmodat, utimensat of a path past any file offset (red team)
    args = (ctypes.c_void_p(1 << 63), 0o641) if number == 90 else (-100, ctypes.c_void_p(1 << 63), 0o641, 0)
    print('pointer', number, libc.syscall(number, *args), ctypes.get_errno())
try:
    fd = os.open({readable!r}, os.O_RDONLY)
except OSError as e:
    print('open refused', e.errno)
else:
    attempt('fchmod', lambda: os.fchmod(fd, 0o777))
    attempt('futimens', lambda: os.utime(fd, (5, 5)))
    import array, fcntl
    attempt('chattr +S', lambda: fcntl.ioctl(fd, 0x40086602, array.array('i', [0x8]), True))  # FS_IOC_SETFLAGS
"""
    flags = [inode_flags(path) for path in owned_files]
    body = run_code(server, code)
    out = body["run_result"]["stdout"]
    assert body["status"] == "Success" and " changed" not in out, body  # a bad pointer ended the zygote
    assert [inode_flags(path) for path in owned_files] == flags
    assert [line for line in out.splitlines() if line.startswith("pointer")] == [
        "pointer 90 -1 14", "pointer 268 -1 14", "pointer 280 -1 14"], out  # EFAULT, as the kernel says
    for path, mode in zip(owned_files, (0o600, 0o644), strict=True):
        info = path.stat()
        assert (oct(info.st_mode & 0o7777), info.st_mtime) == (oct(mode), 1_000_000), path
        assert os.listxattr(path) == [], path
    assert_alive(server)  # the zygote's directory, had its mode changed, would fail every later run


def test_a_run_changes_the_metadata_of_its_own_files(server: ServerHandle) -> None:
    """What a run does to its own files works on every rung: `chmod +x` then run it, `touch -d`,
    `cp -p`, `install -m`, shutil.copy2 and copytree with a symlink (modes and times, a symlink's
    own), fchmod and futimens, through a path with `..` in it, and from a thread (red team,
    2026-12-07: a thread's chmod was refused, `cp -p` failed on its ACL, copytree on the symlink)."""
    code = r"""import os, shutil, subprocess, threading
os.mkdir('sub')
with open('tool.sh', 'w') as f:
    f.write('#!/bin/sh\necho ran\n')
print(subprocess.run('chmod +x tool.sh && ./tool.sh && touch -d 2001-01-01 tool.sh && cp -p tool.sh kept.sh '
                     '&& install -m 700 tool.sh installed.sh && mkdir -p src/d && chmod 750 src/d && tar cf x.tar src '
                     '&& mkdir out && tar xpf x.tar -C out && stat -c "%a %Y" kept.sh installed.sh out/src/d',
                     shell=True, capture_output=True, text=True).stdout.split())
shutil.copy2('tool.sh', 'copy.sh')
info = os.stat('copy.sh')
print(oct(info.st_mode & 0o777), int(info.st_mtime))
os.chmod('sub/../copy.sh', 0o700)
os.chmod(os.path.abspath('sub'), 0o750)
fd = os.open('copy.sh', os.O_RDONLY)
os.fchmod(fd, 0o640)
os.utime(fd, (7, 7))
print(oct(os.stat('copy.sh').st_mode & 0o777), os.stat('copy.sh').st_mtime, oct(os.stat('sub').st_mode & 0o777))
worker = threading.Thread(target=lambda: (os.chmod('copy.sh', 0o604), os.utime('copy.sh', (9, 9))))
worker.start()
worker.join()
print(oct(os.stat('copy.sh').st_mode & 0o777), os.stat('copy.sh').st_mtime)
os.symlink('copy.sh', 'sub/link')
shutil.copytree('sub', 'tree', symlinks=True)
print(os.readlink('tree/link'))
here = os.open('.', os.O_RDONLY | os.O_DIRECTORY)
os.chmod('sub', 0o711, dir_fd=here, follow_symlinks=False)  # glibc: through /proc/self/fd, without fchmodat2
print(oct(os.stat('sub').st_mode & 0o777))
"""
    body = run_code(server, code)
    lines = body["run_result"]["stdout"].splitlines()
    shell = ast.literal_eval(lines[0])  # ran, then kept.sh's, installed.sh's and the untarred d's mode and mtime
    assert shell[:4] == ["ran", "755", "978307200", "700"] and shell[5] == "750", body
    assert lines[1:] == ["0o755 978307200", "0o640 7.0 0o750", "0o604 9.0", "copy.sh", "0o711"], body


def test_git_commits_in_a_run(server: ServerHandle) -> None:
    """Model code versions its work with git (red team, 2026-12-07: on the landlock rung git stopped at
    the host's unreadable /etc/gitconfig); its lock files are chmodded on the way."""
    body = run_code(server, "git init -q repo && cd repo && echo x > f && git add f && "
                            "git -c user.name=t -c user.email=t@t commit -qm one && git log --format=%s",
                    language="bash")
    assert body["run_result"]["stdout"] == "one\n", body


def test_a_run_that_cannot_be_set_up_is_a_sandbox_error() -> None:
    """A run whose child fails before any code of the run's (here: the zygote's directory refuses the
    run's own, as a full or read-only disk would) is the sandbox's failure, never the code's exit 126."""
    with server_in_mode("non-root-container") as server:
        cwd = run_code(server, "import os; print(os.getcwd())")["run_result"]["stdout"].strip()
        zygote_dir = Path(cwd).parent
        zygote_dir.chmod(0o500)
        try:
            bodies = [run_code(server, "print('ran')") for _ in range(40)]
            opened = [requests.post(server.url + "/sessions", json={"language": "python"}, timeout=60)
                      for _ in range(10)]
        finally:
            zygote_dir.chmod(0o755)
        refused = [answer.json() for answer in opened if not answer.ok]
        assert refused and {answer.status_code for answer in opened if not answer.ok} == {500}, refused
        assert all(body["code"] == "sandbox_failure" and "could not be set up" in body["detail"]
                   for body in refused), refused
        statuses = {body["status"] for body in bodies}
        assert statuses <= {"Success", "SandboxError"}, bodies  # started ahead, or a sandbox error
        failed = [body for body in bodies if body["status"] == "SandboxError"]
        assert failed and "could not be set up" in failed[0]["message"], bodies
        assert all(body["run_result"] is None for body in failed), failed
        wait_until(lambda: run_code(server, "print('ran')")["status"] == "Success", 10, "runs start again")


def test_thousands_of_threads_are_refused(server: ServerHandle) -> None:
    code = ("import threading, time\nstarted = 0\ntry:\n    for _ in range(5000):\n"
            "        threading.Thread(target=time.sleep, args=(5,), daemon=True).start(); started += 1\n"
            "except RuntimeError as e:\n    print('refused', e)\nprint('started', started)\n")
    body = run_code(server, code, run_timeout=20)
    out = body["run_result"]["stdout"]
    if landlock(server) and not server.as_root:  # the server's uid: bounded by the machine's threads plus the cap
        assert "refused" in out or body["run_result"]["return_code"] != 0, body
    else:
        assert "refused" in out and int(out.split("started")[-1]) < 300
    assert_alive(server)


def test_segfault_is_reported(server: ServerHandle) -> None:
    body = run_code(server, "import ctypes\nctypes.string_at(0)")
    assert body["status"] == "Failed"
    assert body["run_result"]["return_code"] == -11
    assert_alive(server)


def test_cpu_spin_is_stopped_at_the_timeout(server: ServerHandle) -> None:
    body = run_code(server, "while True:\n    pass", run_timeout=1)
    assert body["run_result"]["status"] == "TimeLimitExceeded"
    assert_alive(server)


def test_closing_its_own_stdio_does_not_escape_the_timeout(server: ServerHandle) -> None:
    body = run_code(server, "import os, time\nos.close(1); os.close(2)\ntime.sleep(30)", run_timeout=1)
    assert body["run_result"]["status"] == "TimeLimitExceeded"
    assert body["run_result"]["execution_time"] < 5


def test_server_shutdown_leaves_no_process_cgroup_or_temp_dir(tmp_path: Path) -> None:
    server = start_server("--slots", "2", "--preload", "", env={**os.environ, "TMPDIR": str(tmp_path)})
    pid = server.process.pid
    run_code(server, "import subprocess; subprocess.Popen(['sleep', '100']); print(1)")
    assert len(server_groups(pid)) == len(group_bases()), "the server should have made its group in each hierarchy"
    stop_server(server.process)
    assert server.process.returncode == 0
    wait_until(lambda: list(tmp_path.iterdir()) == [], 5, "the server's temporary directories are removed")
    assert server_groups(pid) == []
    leftover = subprocess.run(["pgrep", "-f", "bwrap"], capture_output=True, text=True).stdout.split()
    children = [p for p in leftover if Path(f"/proc/{p}/status").exists()
                and f"PPid:\t{pid}\n" in Path(f"/proc/{p}/status").read_text()]
    assert children == []


def test_a_server_stopped_with_calls_in_flight_answers_them_and_exits_at_once() -> None:
    """SIGTERM ends what is in flight rather than waiting for it (a run of 50 s, a session call of
    50 s): the run is answered as a sandbox error, the call as its session's end, each saying why;
    neither as the code's failure."""
    server = start_server("--slots", "2", "--preload", "")
    session = requests.post(server.url + "/sessions", json={"language": "python"}, timeout=30).json()["session_id"]
    sleep = {"code": "import time; time.sleep(60)", "language": "python", "run_timeout": 50}
    with ThreadPoolExecutor(2) as pool:
        answers = [pool.submit(requests.post, server.run_code_url, json=body, timeout=120)
                   for body in (sleep, {**sleep, "session_id": session})]
        wait_until(lambda: requests.get(server.url + "/health", timeout=5).json()["in_flight"] == 2, 30,
                   "both calls running")
        stopped = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=15) == 0
        assert time.monotonic() - stopped < 10
        run, call = (answer.result(timeout=30) for answer in answers)
    assert run.json()["status"] == "SandboxError" and "the server is shutting down" in run.json()["message"], run.text
    assert call.status_code == 404 and call.json()["reason"] == "the server shut down", call.text


def state_dir(pid: int) -> Path:
    """A server's own directory under $TMPDIR, found by the lock it holds open."""
    locks = [Path(os.readlink(fd)) for fd in Path(f"/proc/{pid}/fd").iterdir()
             if os.readlink(fd).endswith("/.owner")]
    assert len(locks) == 1, locks
    return locks[0].parent


def test_a_killed_servers_cgroups_and_directory_are_swept_by_the_next_server() -> None:
    """SIGKILL leaves no chance to clean up; the next server removes the dead one's empty groups
    and its directory (the sandboxes' /etc), and leaves a live server's."""
    bystander = start_server("--slots", "1", "--preload", "")
    live = group_bases()[0] / f"verl-sf-{os.getpid()}-not-stale"  # a live pid: kept
    live.mkdir()
    try:
        victim = start_server("--slots", "2", "--preload", "")
        pid = victim.process.pid
        victims_dir, bystanders_dir = state_dir(pid), state_dir(bystander.process.pid)
        victim.process.kill()
        victim.process.wait()
        assert server_groups(pid), "SIGKILL should have left them"
        assert (victims_dir / "etc" / "passwd").exists()
        # Its sandboxes see their pipes close and exit, which leaves the groups empty (sweepable).
        wait_until(lambda: not any(procs.read_text().strip() for group in server_groups(pid)
                                   for procs in group.rglob("cgroup.procs")), 10, "the dead server's groups are empty")
        stop_server(start_server("--slots", "1", "--preload", "").process)
        assert server_groups(pid) == []
        assert live.exists()
        assert not victims_dir.exists()
        assert (bystanders_dir / "etc" / "passwd").exists(), "a live server's directory was swept"
    finally:
        live.rmdir()
        stop_server(bystander.process)


def test_isolation_none_works_and_says_so() -> None:
    server = start_server("--isolation", "none", "--slots", "1", "--preload", "")
    try:
        import requests

        assert requests.get(server.url + "/health").json()["isolation"] == "none"
        assert run_code(server, "print(6 * 7)")["run_result"]["stdout"] == "42\n"
        body = run_code(server, "import time; time.sleep(10)", run_timeout=1)
        assert body["run_result"]["status"] == "TimeLimitExceeded"
    finally:
        stop_server(server.process)


def test_an_ordinary_user_gets_an_isolated_server_by_default(tmp_path: Path) -> None:
    """No flag: isolated, and what it cannot have without root is said in the log and in /health."""
    log_path = tmp_path / "serve.log"
    with open(log_path, "w") as log:
        server, home = start_server_as_user("--slots", "1", "--sandboxes", "1", "--preload", "", stderr=log)
    try:
        import requests

        health = requests.get(server.url + "/health", timeout=10).json()
        assert health["isolation"] == "namespaces" and health["limits"]["seccomp"] == "on"
        assert "watchdog" in health["limits"]["memory"] and "single-uid" in health["limits"]["uid"]
        out = run_code(server, "print(sorted(line.split(':')[0].strip() for line in open('/proc/net/dev').readlines()[2:]))")
        assert out["run_result"]["stdout"] == "['lo']\n"
        assert host_uid_of(server) != 0
    finally:
        stop_server(server.process)
        shutil.rmtree(home, ignore_errors=True)
    log_text = log_path.read_text()
    assert "rlimits" in log_text and "watchdog" in log_text, log_text
    assert server.process.returncode == 0
    assert run_processes(server.process.pid) == []


def host_uid_of(server: ServerHandle) -> int:
    return os.stat(f"/proc/{server.process.pid}").st_uid
