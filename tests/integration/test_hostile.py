"""Hostile code and hostile requests against real servers, started as root and as an ordinary account.

Every case is its own test, and the server must still answer a good run after it.  Host-side
checks read the host itself (its /etc, its process table, its cgroups), never what the sandbox
says about itself.  What each mode enforces (docs/security.md):

- both: a user namespace without a host-root entry, seccomp on every process of every run, no
  network, a minimal /etc, per-run PID/mount namespaces and tmpfs, fetch and write beneath the
  run's directories as the run itself;
- root: two mapped uids (sandbox root -> host 100000, runs -> host 101000), memory and pids cgroups;
- non-root: one mapped uid (the account's own), rlimits plus a memory watchdog instead of cgroups.
"""

from __future__ import annotations

import base64
import contextlib
import os
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import pytest
import requests

from tests.cgroup_layout import controller_dirs
from tests.host_view import descendants, host_uid
from tests.language_cases import DOUBLE
from tests.other_processes import others_out_of_reach
from tests.server_fixtures import SERVER_MODES, ServerHandle, run_code, server_in_mode
from tests.waiting import wait_until
from verl_sf.executor.config import ExecutorConfig
from verl_sf.executor.languages import COMMON_ETC, SPECS
from verl_sf.executor.system_view import ETC_ENTRIES

SERVER_ARGS = ("--slots", "2", "--sandboxes", "1", "--preload", "")
ROOT_RUN_HOST_UID = ExecutorConfig.host_uid_base + ExecutorConfig.sandbox_uid
SYNTHETIC_ETC = {"passwd", "group", "hosts", "hostname", "resolv.conf", "nsswitch.conf"}
EPERM, ENOSYS = 1, 38


@pytest.fixture(scope="module", params=SERVER_MODES)
def server(request: pytest.FixtureRequest) -> Iterator[ServerHandle]:
    with server_in_mode(request.param, *SERVER_ARGS) as handle:
        yield handle


@pytest.fixture(autouse=True)
def server_survives(server: ServerHandle) -> Iterator[None]:
    """After every hostile case the same server still runs good code."""
    yield
    assert server.process.poll() is None, "the server died"
    assert run_code(server, "print('alive')")["run_result"]["stdout"] == "alive\n"


def host_uid_of_runs(server: ServerHandle) -> int:
    return ROOT_RUN_HOST_UID if server.as_root else os.stat(f"/proc/{server.process.pid}").st_uid


def fetched(server: ServerHandle, code: str, fetch_files: list[str], **fields: Any) -> dict[str, bytes]:
    body = run_code(server, code, fetch_files=fetch_files, **fields)
    assert body["status"] == "Success", body
    return {path: base64.b64decode(data) for path, data in body["files"].items()}


def c_program(server: ServerHandle, source: str, **fields: Any) -> dict:
    return run_code(server, source, language="cpp", compile_timeout=60, run_timeout=20, **fields)


# ---- symlink escapes through fetch_files ------------------------------------------------------
def test_fetch_through_a_directory_symlink_to_etc(server: ServerHandle) -> None:
    code = "import os\nos.symlink('/etc', 'link')\nopen('plain.txt', 'w').write('mine')\n"
    files = fetched(server, code, ["link/shadow", "link/passwd", "link/hostname", "plain.txt"])
    assert files == {"plain.txt": b"mine"}


def test_fetch_through_a_directory_symlink_to_proc(server: ServerHandle) -> None:
    code = "import os\nos.symlink('/proc', 'p')\nos.symlink('/proc/self/environ', 'env')\n"
    paths = ["p/1/environ", "p/1/cmdline", "p/self/environ", "p/self/status", "env", "/proc/self/environ"]
    assert fetched(server, code, paths) == {}


def test_fetch_through_a_symlink_in_nested_directories(server: ServerHandle) -> None:
    code = ("import os\nos.makedirs('a/b/c')\nopen('a/b/c/ok.txt', 'w').write('nested')\n"
            "os.symlink('/etc', 'a/b/c/etc')\nos.symlink('/', 'a/b/root')\nos.symlink('../../..', 'a/b/c/up')\n")
    paths = ["a/b/c/ok.txt", "a/b/c/etc/passwd", "a/b/root/etc/passwd", "a/b/c/up/etc/passwd", "a/b/c/up/a/b/c/ok.txt"]
    assert fetched(server, code, paths) == {"a/b/c/ok.txt": b"nested"}


def test_fetch_with_dotdot_after_a_symlink_is_left_out(server: ServerHandle) -> None:
    """`..` is never resolved, even where it would stay inside: such a path is left out, as a missing file is."""
    code = ("import os\nos.symlink('/etc/ssl', 's')\nos.mkdir('d')\nopen('top.txt', 'w').write('top')\n"
            "open('/tmp/t.txt', 'w').write('tmp')\n")
    paths = ["s/../passwd", "s/../shadow", "d/../top.txt", "../etc/passwd", "d/../../etc/passwd",
             "/mnt/data/../../etc/passwd", "/tmp/../etc/passwd", "/workdir/../etc/passwd", "top.txt", "/tmp/t.txt"]
    assert fetched(server, code, paths) == {"top.txt": b"top", "/tmp/t.txt": b"tmp"}


@pytest.mark.parametrize("path", ["", "a\x00b"])
def test_malformed_fetch_path_is_refused_at_the_door(server: ServerHandle, path: str) -> None:
    response = requests.post(server.run_code_url, timeout=60,
                             json={"code": "print(1)", "language": "python", "fetch_files": [path]})
    assert response.status_code == 422 and "fetch_files" in response.text


def test_fetch_of_a_file_symlink_is_left_out(server: ServerHandle) -> None:
    code = "import os\nos.symlink('/etc/passwd', 'f')\nos.symlink('/etc/shadow', 'g')\nos.symlink('/proc/1/environ', 'h')\n"
    assert fetched(server, code, ["f", "./f", "g", "h"]) == {}


def test_fetch_absolute_paths_under_mnt_data_and_tmp(server: ServerHandle) -> None:
    code = ("import os\nopen('/mnt/data/out.txt', 'w').write('data')\nopen('/tmp/t.txt', 'w').write('tmp')\n"
            "os.symlink('/etc', '/mnt/data/link')\nos.symlink('/etc/passwd', '/tmp/pw')\n"
            "os.mkdir('/mnt/data/sub')\nos.symlink('/proc', '/mnt/data/sub/p')\n")
    paths = ["/mnt/data/out.txt", "/tmp/t.txt", "/mnt/data/link/passwd", "/mnt/data/link/shadow", "/tmp/pw",
             "/mnt/data/sub/p/1/environ", "/etc/passwd", "/etc/shadow", "/proc/self/environ", "/workdirx/a"]
    assert fetched(server, code, paths) == {"/mnt/data/out.txt": b"data", "/tmp/t.txt": b"tmp"}


SWAPPER = """
import os
files, dirs = {files!r}, {dirs!r}
while True:
    for i, name in enumerate(files):
        with open(name + '.new', 'w') as f:
            f.write('harmless')
        os.replace(name + '.new', name)
        os.unlink(name)
        os.symlink('/etc/passwd' if i % 2 else '/etc/shadow', name)
    for name in dirs:
        os.makedirs(name + '.new', exist_ok=True)
        with open(name + '.new/passwd', 'w') as f:
            f.write('harmless')
        if os.path.islink(name):
            os.unlink(name)
        os.rename(name + '.new', name)
        os.rename(name, name + '.old')
        os.symlink('/etc', name)
        os.rename(name + '.old', name + '.new')
"""


def test_fetch_while_a_background_process_swaps_symlinks_in(server: ServerHandle) -> None:
    """The run's own background process keeps turning the fetched paths into symlinks (to
    /etc/shadow, /etc/passwd, /etc) while the fetch happens: only what was a plain file is read."""
    files, dirs = [f"race{i}" for i in range(20)], [f"dir{i}" for i in range(10)]
    code = ("import subprocess, sys, time\nopen('control.txt', 'w').write('control')\n"
            f"subprocess.Popen([sys.executable, '-c', {SWAPPER.format(files=files, dirs=dirs)!r}])\n"
            "time.sleep(0.3)\n")
    paths = ["control.txt", *files, *(f"{d}/passwd" for d in dirs)]
    for _ in range(3):
        got = fetched(server, code, paths)
        assert got.pop("control.txt") == b"control"
        assert set(got.values()) <= {b"harmless"}, got


def test_fetch_from_a_session_after_planting_a_symlink(server: ServerHandle) -> None:
    created = requests.post(server.url + "/sessions", json={"language": "python"}, timeout=60)
    assert created.status_code == 201, created.text
    session_id = created.json()["session_id"]
    try:
        run_code(server, "import os\nos.symlink('/etc', 'link')\nopen('x.txt', 'w').write('x')", session_id=session_id)
        body = run_code(server, "pass", session_id=session_id, fetch_files=["link/passwd", "x.txt"])
        assert set(body["files"]) == {"x.txt"}
    finally:
        requests.delete(f"{server.url}/sessions/{session_id}", timeout=30)


# ---- files written for the run ----------------------------------------------------------------
def test_files_are_written_beneath_the_runs_directories(server: ServerHandle) -> None:
    files = {"sub/dir/in.txt": "bmVzdGVk", "/mnt/data/in.txt": "ZGF0YQ==", "/tmp/in.txt": "dG1w"}
    code = "print(open('sub/dir/in.txt').read(), open('/mnt/data/in.txt').read(), open('/tmp/in.txt').read())"
    assert run_code(server, code, files=files)["run_result"]["stdout"] == "nested data tmp\n"


@pytest.mark.parametrize("path", ["../escape.txt", "sub/../../escape.txt", "/etc/verl_sf_escape.txt",
                                  "/proc/self/verl_sf_escape", "/mnt/data/../../etc/verl_sf_escape.txt",
                                  "/usr/verl_sf_escape.txt", "/workdir/../verl_sf_escape.txt"])
def test_files_outside_the_runs_directories_are_refused(server: ServerHandle, path: str) -> None:
    """Refused at the door: HTTP 422 naming the field and the path; nothing is written anywhere."""
    response = requests.post(server.run_code_url, timeout=60,
                             json={"code": "print('ran')", "language": "python", "files": {path: "ZXNjYXBl"}})
    assert response.status_code == 422 and "files" in response.text and path in response.text, response.text
    for where in ("/", "/etc", "/usr"):
        assert not list(Path(where).glob("verl_sf_escape*"))


# ---- identity ---------------------------------------------------------------------------------
def test_uid_map_has_no_host_root_entry(server: ServerHandle) -> None:
    out = run_code(server, "print(open('/proc/self/uid_map').read(), open('/proc/self/gid_map').read())")
    rows = [line.split() for line in out["run_result"]["stdout"].splitlines() if line.strip()]
    assert rows and all(len(row) == 3 for row in rows)
    if server.as_root:
        assert all(int(row[1]) != 0 for row in rows), rows  # column 2: the host id
        assert {(r[0], r[1]) for r in rows} == {("0", str(ExecutorConfig.host_uid_base)),
                                                (str(ExecutorConfig.sandbox_uid), str(ROOT_RUN_HOST_UID))}
    else:  # a user namespace of the run's own (its process count apart), whose 0 is the sandbox's 0: the
        # server's account on the host (the next test looks at the host's side)
        assert rows == [["0", "0", "1"], ["0", "0", "1"]], rows


def test_host_uids_of_a_runs_processes_are_not_root(server: ServerHandle) -> None:
    marker = f"{secrets.randbelow(10**6) / 10**6 + 40:.6f}"
    thread = threading.Thread(target=run_code, args=(server, f"import subprocess\nsubprocess.run(['sleep', '{marker}'])"),
                              kwargs={"run_timeout": 3}, daemon=True)
    thread.start()

    def the_sleeper() -> Optional[int]:
        for pid in descendants(server.process.pid):
            try:
                if Path(f"/proc/{pid}/cmdline").read_bytes() == b"sleep\0" + marker.encode() + b"\0":
                    return pid
            except OSError:
                continue
        return None

    sleeper = wait_until(the_sleeper, 20, "the run's process is found below the server")
    sandbox = {pid: host_uid(pid) for pid in descendants(server.process.pid)}
    assert sandbox and 0 not in sandbox.values(), sandbox  # bwrap, zygotes, runs: none is host root
    assert os.stat(f"/proc/{sleeper}").st_uid == host_uid_of_runs(server)
    if server.as_root:  # the sandbox's own cgroups hold only non-root processes too
        pids_groups = controller_dirs()["pids"]  # v1: the pids hierarchy; v2: the one tree
        members = [int(p) for procs in pids_groups.glob(f"verl-sf-{server.process.pid}-*/**/cgroup.procs")
                   for p in procs.read_text().split()]
        assert sleeper in members
        assert all(os.stat(f"/proc/{pid}").st_uid != 0 for pid in members if Path(f"/proc/{pid}").exists())
    thread.join(timeout=30)


# ---- seccomp on every kind of run -------------------------------------------------------------
def _seccomp_line(text: str) -> str:
    return next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Seccomp:")), "")


def test_seccomp_on_the_python_fast_path(server: ServerHandle) -> None:
    out = run_code(server, "print(open('/proc/self/status').read())")["run_result"]["stdout"]
    assert _seccomp_line(out) == "2"


def test_seccomp_on_exec_d_programs(server: ServerHandle) -> None:
    body = run_code(server, "grep Seccomp: /proc/self/status; python3 -c \"print(open('/proc/self/status').read())\" "
                            "| grep Seccomp:", language="bash")
    assert body["run_result"]["stdout"].split() == ["Seccomp:", "2", "Seccomp:", "2"]


SLOW_TO_COMPILE = ("constexpr long spin(long n) { long s = 0; for (long i = 0; i < n; ++i) for (long j = 0; j < 1000; ++j)"
                   " s += i ^ j; return s; }\nstatic_assert(spin(1500) != 1, \"\");\nint main() {}\n")


def test_seccomp_on_the_compile_stage(server: ServerHandle) -> None:
    """Read from the host: the compiler proper (cc1plus), busy with a slow constant expression."""
    thread = threading.Thread(target=c_program, args=(server, SLOW_TO_COMPILE), daemon=True)
    thread.start()
    seen: list[str] = []

    def compiler_seen_or_compile_over() -> bool:
        for pid in descendants(server.process.pid):
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == "cc1plus":
                    seen.append(Path(f"/proc/{pid}/status").read_text())
                    return True
            except OSError:
                continue
        return not thread.is_alive()

    wait_until(compiler_seen_or_compile_over, 120, "the compiler is seen running, or the compile is over", every=0.02)
    thread.join(timeout=120)
    status = seen[0] if seen else None
    assert status is not None, "the compiler was not seen running"
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    assert fields["Seccomp"].strip() == "2" and fields["NoNewPrivs"].strip() == "1"
    assert int(fields["Uid"].split()[0]) == host_uid_of_runs(server) and int(fields["CapEff"], 16) == 0


def test_seccomp_on_a_compiled_program(server: ServerHandle) -> None:
    source = ('#include <fstream>\n#include <iostream>\n#include <string>\nint main(){ std::ifstream f("/proc/self/status");'
              ' std::string l; while (std::getline(f, l)) if (l.rfind("Seccomp:", 0) == 0) std::cout << l << "\\n"; }')
    assert c_program(server, source)["run_result"]["stdout"].split() == ["Seccomp:", "2"]


def test_seccomp_in_jupyter(server: ServerHandle) -> None:
    response = requests.post(server.url + "/run_jupyter", timeout=60, json={
        "cells": ["s = open('/proc/self/status').read()", "print([l for l in s.splitlines() if l.startswith('Seccomp:')])"]})
    assert response.status_code == 200, response.text
    assert response.json()["cells"][1]["stdout"] == "['Seccomp:\\t2']\n"


@pytest.mark.parametrize("language", ["python", "bash"])
def test_seccomp_in_sessions(server: ServerHandle, language: str) -> None:
    created = requests.post(server.url + "/sessions", json={"language": language}, timeout=60)
    assert created.status_code == 201, created.text
    session_id = created.json()["session_id"]
    code = "print(open('/proc/self/status').read())" if language == "python" else "cat /proc/self/status"
    try:
        out = run_code(server, code, language=language, session_id=session_id)["run_result"]["stdout"]
        assert _seccomp_line(out) == "2"
    finally:
        requests.delete(f"{server.url}/sessions/{session_id}", timeout=30)


# ---- the kernel surface a run may not reach ---------------------------------------------------
SYSCALLS = {  # x86-64 numbers: name -> (number, arguments)
    "io_uring_setup": (425, (8, 0)),
    "bpf": (321, (0, 0, 0)),  # BPF_MAP_CREATE with no attributes
    "keyctl": (250, (0, -3)),  # KEYCTL_GET_KEYRING_ID of the session keyring
    "add_key": (248, (0, 0, 0, 0, 0)),
    "perf_event_open": (298, (0, 0, -1, -1, 0)),
    "mount": (165, (0, 0, 0, 0, 0)),
    "setns": (308, (0, 0)),
    "unshare": (272, (0x10000000,)),  # CLONE_NEWUSER
    "clone_newuser": (56, (0x10000000 | 17, 0, 0, 0, 0)),  # clone(CLONE_NEWUSER | SIGCHLD)
    "clone_newns": (56, (0x00020000 | 17, 0, 0, 0, 0)),
    "userfaultfd": (323, (0,)),
    "open_by_handle_at": (304, (0, 0, 0)),
    "kexec_load": (246, (0, 0, 0, 0)),
    "init_module": (175, (0, 0, 0)),
    # Red team, 2026-11-29: a run pinned to one CPU beside runs of its own pinned there was credited
    # its wait and answered as starved, a sandbox error, while the other CPU sat idle.
    "sched_setaffinity": (203, (0, 8, 0)),
    # Red team, 2026-12-07: the host's AIO count is one for every process; two calls of one run took it.
    "io_setup": (206, (32768, 0)),
    # ... and 4 KiB of a huge page spliced into a pipe kept its 2 MiB there, no process's any more.
    "vmsplice": (278, (0, 0, 0, 0)),
}


@pytest.mark.parametrize("name", sorted(SYSCALLS))
def test_kernel_interface_is_refused_with_eperm(server: ServerHandle, name: str) -> None:
    number, args = SYSCALLS[name]
    code = ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
            f"r = libc.syscall({number}, *[ctypes.c_long(a) for a in {args!r}])\n"
            "if r == 0 and {name!r}.startswith('clone'):\n    os._exit(0)  # the child of a clone that worked\n"
            "print(r, ctypes.get_errno())\n").replace("{name!r}", repr(name))
    out = run_code(server, code)["run_result"]["stdout"].split()
    # clone with namespace flags goes to a tracer that only a fork's forker can be: none, so ENOSYS.
    assert out == ["-1", str(ENOSYS if name.startswith("clone") else EPERM)], (name, out)


def test_a_run_changes_the_limits_and_priorities_of_itself_only(server: ServerHandle) -> None:
    others_out_of_reach(server)


def test_vsock_sockets_are_refused(server: ServerHandle) -> None:
    """AF_VSOCK is not confined by the network namespace: it would reach the hypervisor or host."""
    code = ("import socket\ntry:\n    socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)\n    print('OPENED')\n"
            "except OSError as e:\n    print(e.errno)\n")
    assert run_code(server, code)["run_result"]["stdout"] == f"{EPERM}\n"


def test_sockets_whose_queues_nothing_counts_are_refused(server: ServerHandle) -> None:
    """Red team, 2026-12-07: queues no memory cgroup charges and sock_diag's TCP and UDP dumps do
    not show. A run's own NETLINK_USERSOCK sockets queued 870 MB to one another and NETLINK_ROUTE's
    error acknowledgements 800 MB (against a 128 MB cap, root or not); MPTCP connections 858 MB.
    The run's network is still there to see, in /proc/net/dev: its loopback only."""
    code = ("import socket\nkinds = [(socket.AF_NETLINK, socket.SOCK_RAW, p) for p in (0, 2, 4, 15, 16)]\n"
            "kinds += [(family, socket.SOCK_STREAM, 262) for family in (socket.AF_INET, socket.AF_INET6)]\n"
            "for kind in kinds:\n    try:\n        socket.socket(*kind)\n        print('OPENED', kind)\n"
            "    except OSError as e:\n        print(e.errno)\n"
            "print(sorted(line.split(':')[0].strip() for line in open('/proc/net/dev').readlines()[2:]))\n")
    assert run_code(server, code)["run_result"]["stdout"] == f"{EPERM}\n" * 7 + "['lo']\n"


def test_clone3_answers_enosys(server: ServerHandle) -> None:
    code = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
            "args = (ctypes.c_uint64 * 11)()\nargs[0] = 0x10000000\n"
            "print(libc.syscall(435, ctypes.byref(args), ctypes.c_long(88)), ctypes.get_errno())\n")
    assert run_code(server, code)["run_result"]["stdout"].split() == ["-1", str(ENOSYS)]


@pytest.mark.parametrize("argv", ["unshare -U true", "unshare -Ur true", "unshare -m true", "unshare -n true"])
def test_unshare_command_is_refused(server: ServerHandle, argv: str) -> None:
    body = run_code(server, f"{argv} && echo ESCAPED; echo rc=$?", language="bash")
    out = body["run_result"]["stdout"] + body["run_result"]["stderr"]
    assert "ESCAPED" not in out and "rc=1" in out and "Operation not permitted" in out, out


def test_threads_still_work_under_the_clone_filter(server: ServerHandle) -> None:
    code = ("import threading\nseen = []\nts = [threading.Thread(target=seen.append, args=(i,)) for i in range(8)]\n"
            "[t.start() for t in ts]; [t.join() for t in ts]\nprint(sorted(seen))\n")
    assert run_code(server, code)["run_result"]["stdout"] == f"{list(range(8))}\n"


def test_32_bit_syscall_abi_is_killed_or_refused(server: ServerHandle) -> None:
    source = ("#include <cstdio>\nint main(){ long r; std::printf(\"before\\n\"); std::fflush(stdout);\n"
              "  asm volatile(\"int $0x80\" : \"=a\"(r) : \"a\"(20L) : \"memory\");  // 32-bit getpid\n"
              "  std::printf(\"survived %ld\\n\", r); }\n")
    body = c_program(server, source)
    result = body["run_result"]
    assert result["stdout"].startswith("before")
    survived = [line for line in result["stdout"].splitlines() if line.startswith("survived")]
    # Killed by the filter's bad-architecture action (SIGSYS), or refused without running.
    assert result["return_code"] in (-31, -11) or (survived and int(survived[0].split()[1]) < 0), result


def test_ptrace_reaches_nothing_outside_the_run(server: ServerHandle) -> None:
    """Only the run's own processes exist in its PID namespace; every other pid is out of reach."""
    code = ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "mine = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
            "results = {libc.ptrace(16, pid, 0, 0) for pid in range(2, 4096) if pid not in mine}\n"
            "print(mine, results, os.getppid())\n")
    assert run_code(server, code)["run_result"]["stdout"] == "[1] {-1} 0\n"


# ---- the minimal /etc -------------------------------------------------------------------------
def test_shadow_and_ssh_are_absent(server: ServerHandle) -> None:
    code = "import os\nprint(os.path.lexists('/etc/shadow'), os.path.lexists('/etc/ssh'), sorted(os.listdir('/etc')))"
    out = run_code(server, code)["run_result"]["stdout"]
    shadow, ssh, listing = out.split(" ", 2)
    assert (shadow, ssh) == ("False", "False")
    toolchain_etc = {Path(entry).relative_to("/etc").parts[0] for spec in SPECS.values() for entry in (*spec.etc, *COMMON_ETC)}
    allowed = set(ETC_ENTRIES) | SYNTHETIC_ETC | toolchain_etc
    assert set(eval(listing)) <= allowed


def test_passwd_inside_is_synthetic(server: ServerHandle) -> None:
    inside = run_code(server, "print(open('/etc/passwd').read())")["run_result"]["stdout"]
    host_accounts = {line.split(":")[0] for line in Path("/etc/passwd").read_text().splitlines()}
    assert {line.split(":")[0] for line in inside.splitlines() if line} <= {"root", "sandbox", "nobody"}
    assert host_accounts - {"root", "nobody"}  # the host has other accounts, which stay out


def test_a_file_added_to_host_etc_after_start_is_not_visible(server: ServerHandle) -> None:
    name = f"verl_sf_probe_{secrets.token_hex(6)}"
    probe = Path("/etc") / name
    probe.write_text("host-only")
    probe.chmod(0o644)
    try:
        out = run_code(server, f"import os\nprint(os.path.lexists('/etc/{name}'), '{name}' in os.listdir('/etc'))")
        assert out["run_result"]["stdout"] == "False False\n"
    finally:
        probe.unlink()


# ---- every language still works in this view ---------------------------------------------------
@pytest.mark.parametrize("language", sorted(DOUBLE))
def test_language_runs_or_names_its_missing_toolchain(server: ServerHandle, language: str) -> None:
    """The languages suite (tests/integration/test_languages.py) runs them all as root; here each also runs
    as an ordinary account, where a toolchain it cannot read is named as missing, never half-working."""
    available = set(requests.get(server.url + "/health", timeout=10).json()["languages"])
    body = run_code(server, DOUBLE[language], language=language, stdin="21\n", compile_timeout=120, run_timeout=60)
    if language in available:
        assert body["status"] == "Success", body
        assert body["run_result"]["stdout"].strip() == "42", body
    else:
        assert not server.as_root, f"{language} is missing on the root server"
        assert body["status"] == "SandboxError" and "not installed" in body["message"], body


# ---- memory: a cgroup as root, RLIMIT_DATA plus the zygote's watchdog without one ---------------
MEMORY_BOMBS = {
    # Shared anonymous memory: RLIMIT_DATA does not count it.
    "shared_mapping": "import mmap\nm = mmap.mmap(-1, 1 << 30)\nfor i in range(0, 1 << 30, 4096):\n    m[i] = 1\n"
                      "print('allocated')\n",
    # Four processes each under RLIMIT_DATA, together far above the cap.
    "many_processes": "import os, time\nfor _ in range(4):\n    if os.fork() == 0:\n        b = bytearray(200 << 20)\n"
                      "        time.sleep(3)\n        os._exit(0)\n"
                      "codes = [os.waitstatus_to_exitcode(os.wait()[1]) for _ in range(4)]\n"
                      "print('allocated' if codes == [0] * 4 else codes)\n",
}


@pytest.mark.parametrize("bomb", sorted(MEMORY_BOMBS))
def test_memory_bomb_is_killed_and_reported(server: ServerHandle, bomb: str) -> None:
    """A memory cgroup's OOM killer takes the biggest processes; the watchdog (no cgroup) the whole run."""
    body = run_code(server, MEMORY_BOMBS[bomb], memory_limit_MB=256, run_timeout=20)
    result = body["run_result"]
    assert "allocated" not in result["stdout"]
    assert result["status"] == "Finished", body  # killed well before the time-out
    assert "memory limit of 256 MB exceeded" in result["stderr"]
    if not server.as_root:
        assert result["return_code"] == -9


EPOLL_WATCHES = r"""
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <cerrno>
#include <cstdio>
int main() {
  int report[2]; pipe(report);
  for (int c = 0; c < 24; c++) if (fork() == 0) {  // 24 x 500 x 500 watches: past the uid's 4% of memory
    int ev = eventfd(0, 0), fds[500], err = 0;
    for (int i = 0; i < 500; i++) fds[i] = dup(ev);
    for (int e = 0; e < 500 && !err; e++) {
      int ep = epoll_create1(0);
      for (int i = 0; i < 500; i++) { epoll_event x = {EPOLLIN, {0}}; if (epoll_ctl(ep, EPOLL_CTL_ADD, fds[i], &x)) { err = errno; break; } }
    }
    write(report[1], &err, sizeof err); sleep(3); _exit(0);
  }
  int full = 0, err;
  for (int c = 0; c < 24; c++) { read(report[0], &err, sizeof err); full += err == ENOSPC; }
  printf("exhausted %d\n", full > 0);
  fflush(stdout); sleep(2);  // held while the test connects
}
"""


def test_a_run_that_exhausts_its_uids_epoll_watches_leaves_the_server_up(server: ServerHandle) -> None:
    """Red team, 2026-12-07: the kernel counts epoll watches per uid, and an ordinary account's runs
    are its uid. A run that took them all made libuv (uvloop's loop) abort the server on its next
    epoll_ctl. Such a server runs asyncio's loop, which refuses that one connection. Until the run's
    processes have finished exiting, after its reply, the sandbox beside it cannot watch a new run
    (answered as a sandbox error); then it serves again."""
    attack: dict[str, Any] = {}
    attacker = threading.Thread(target=lambda: attack.update(c_program(server, EPOLL_WATCHES, memory_limit_MB=2048)))
    attacker.start()
    while attacker.is_alive():  # new connections while the watches are gone: each one refused, never the server
        with contextlib.suppress(requests.RequestException):
            requests.get(server.url + "/v1/ping", timeout=5)
        time.sleep(0.1)
    assert attack["run_result"]["stdout"] == "exhausted 1\n", attack
    wait_until(lambda: run_code(server, "print('alive')")["status"] == "Success", 30, "the sandbox serves again")


def test_empty_files_are_bounded_by_each_tmpfs(server: ServerHandle) -> None:
    """Empty files take no blocks of a tmpfs, but each is a kilobyte of the kernel's memory: 500,000
    took 500 MB against a 128 MB cap without a memory cgroup. A tmpfs now holds as many entries as
    it has pages: ENOSPC past them. (The landlock rung counts a run's entries: test_rungs.py.)"""
    code = ("import os\nmade = 0\ntry:\n    for d in range(60):\n        os.mkdir(f'd{d}')\n"
            "        for i in range(5000):\n            os.close(os.open(f'd{d}/{i}', os.O_CREAT | os.O_WRONLY, 0o600))\n"
            "            made += 1\nexcept OSError as e:\n    print('stopped', e.errno)\nprint('files', made)\n")
    body = run_code(server, code, memory_limit_MB=128, run_timeout=30)
    result = body["run_result"]
    if "memory limit of 128 MB exceeded" not in result["stderr"]:  # a memory cgroup may charge them first
        assert result["stdout"].startswith("stopped 28\n"), body  # ENOSPC
        assert 60_000 <= int(result["stdout"].split()[-1]) <= 66_000, body  # the workdir's 256 MB in pages


def test_health_says_how_each_limit_is_enforced(server: ServerHandle) -> None:
    health = requests.get(server.url + "/health", timeout=10).json()
    assert health["isolation"] == "namespaces" and health["limits"]["seccomp"] == "on"
    if server.as_root:
        assert health["cgroups"] == "on" and "cgroup" in health["limits"]["memory"]
    else:
        assert "not writable" in health["cgroups"]
        assert "RLIMIT_DATA" in health["limits"]["memory"] and "watchdog" in health["limits"]["memory"]
        assert "RLIMIT_NPROC" in health["limits"]["processes"]
        assert "single-uid" in health["limits"]["uid"]


def test_dev_shm_is_private_to_each_run(server: ServerHandle) -> None:
    """POSIX shared memory and semaphores live in /dev/shm: a run's are gone with it."""
    token = f"verl_sf_{secrets.token_hex(4)}"
    code = (f"import os, multiprocessing\nopen('/dev/shm/{token}', 'w').write('x')\n"
            "lock = multiprocessing.Lock()\nprint(sorted(os.listdir('/dev/shm')))\n")
    assert run_code(server, code)["run_result"]["stdout"] == f"['{token}']\n"
    again = run_code(server, "import os\nprint(sorted(os.listdir('/dev/shm')))")
    assert again["run_result"]["stdout"] == "[]\n"


def test_an_idle_sessions_memory_bomb_ends_it_and_says_why(server: ServerHandle) -> None:
    """Work a session left running between calls is capped too (the watchdog samples idle sessions)."""
    created = requests.post(server.url + "/sessions", json={"language": "python", "memory_limit_MB": 256}, timeout=60)
    assert created.status_code == 201, created.text
    session_id = created.json()["session_id"]
    bomb = ("import mmap, threading, time\ndef grow():\n    time.sleep(0.5)\n    m = mmap.mmap(-1, 1 << 30)\n"
            "    for i in range(0, 1 << 30, 4096):\n        m[i] = 1\n    time.sleep(60)\n"
            "threading.Thread(target=grow, daemon=True).start()\nprint('started')\n")
    assert run_code(server, bomb, session_id=session_id)["run_result"]["stdout"] == "started\n"
    wait_until(lambda: requests.get(f"{server.url}/sessions/{session_id}", timeout=10).status_code != 200, 30,
               "the session is killed", every=0.2)
    status = requests.get(f"{server.url}/sessions/{session_id}", timeout=10)
    assert status.status_code == 404 and "memory" in status.text, status.text
