"""The isolation ladder: which rung `auto` picks where, refusals, and the landlock rung under attack.

The container conditions are reproduced with tests/container_profile.py (CAP_SYS_ADMIN dropped,
namespaces and mounts refused by seccomp); servers run as root and as the CI account in each.
What the landlock rung promises, and what it gives less of, is in docs/security.md.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from tests import container_profile
from tests.hidden_cpu import hidden_cpu_is_demoted, session_background_is_demoted
from tests.host_view import comm, cpu_seconds, descendants, killed_by_reply, named, zygotes
from tests.language_cases import DOUBLE, TEST_RUNNERS
from tests.other_processes import others_out_of_reach
from tests.sandbox_kills import kill_sandboxes_mid_run
from tests.server_fixtures import (
    CONTAINER_MODES,
    SERVER_MODES,
    ServerHandle,
    run_code,
    run_code_batch,
    server_in_mode,
    stop_server,
)
from tests.waiting import wait_until

SERVER_ARGS = ("--slots", "2", "--sandboxes", "1", "--preload", "numpy")
SECRET = f"landlock-secret-{secrets.token_hex(4)}"


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def health(server: ServerHandle) -> dict:
    return requests.get(server.url + "/health", timeout=10).json()


# ---- which rung, where --------------------------------------------------------------------------
@pytest.mark.parametrize("mode", SERVER_MODES)
def test_auto_picks_namespaces_on_this_host(mode: str) -> None:
    with server_in_mode(mode, *SERVER_ARGS) as server:
        assert health(server)["isolation"] == "namespaces"


@pytest.mark.parametrize("mode", CONTAINER_MODES)
def test_auto_picks_landlock_in_a_container_profile(mode: str) -> None:
    with server_in_mode(mode, *SERVER_ARGS) as server:
        status = health(server)
        assert status["isolation"] == "landlock", status
        assert "ABI" in status["limits"]["landlock"]


@pytest.mark.parametrize("mode", CONTAINER_MODES)
def test_a_run_in_flight_ends_with_its_server(mode: str) -> None:
    """No PID namespace ends a run with its zygote on this rung: a server stopped mid-run leaves no
    process of it (its own, a child, a setsid'd daemon)."""
    tag = f"ln{secrets.token_hex(3)}"
    code = (f"import ctypes, os, time\nlibc = ctypes.CDLL(None)\n"
            f"if os.fork() == 0:\n    os.setsid()\n"
            f"    if os.fork():\n        os._exit(0)\n"
            f"os.fork()\nlibc.prctl(15, b'{tag}', 0, 0, 0)\ntime.sleep(60)")
    with server_in_mode(mode, *SERVER_ARGS) as server, ThreadPoolExecutor(1) as pool:
        pending = pool.submit(requests.post, server.run_code_url,
                              json={"code": code, "language": "python", "run_timeout": 50}, timeout=120)
        wait_until(lambda: len(named(tag)) == 4, 60, "the run's four processes running")
        stop_server(server.process)
        pending.exception(60)  # answered or cut off as the server stops: what matters is below
    wait_until(lambda: not named(tag), 5, "no process of the run left once its server is gone")


def _serve(*args: str, container: bool) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "verl_sf.cli", "serve", "--port", "0", *args],
                          capture_output=True, text=True, timeout=60,
                          preexec_fn=container_profile.enter if container else None)


def test_a_demanded_rung_the_host_cannot_give_is_refused_with_the_fix() -> None:
    result = _serve("--isolation", "namespaces", container=True)
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr
    assert "--isolation namespaces is not available here" in result.stderr
    assert "seccomp=unconfined" in result.stderr  # the docker flag that would give it


def test_an_unknown_rung_is_a_usage_error_naming_the_choices() -> None:
    result = _serve("--isolation", "chroot", container=False)
    assert result.returncode == 2 and "invalid choice: 'chroot'" in result.stderr
    for rung in ("auto", "namespaces", "landlock", "none"):
        assert rung in result.stderr


def test_doctor_says_which_rung_and_what_is_missing() -> None:
    normal = subprocess.run([sys.executable, "-m", "verl_sf.cli", "doctor"], capture_output=True, text=True,
                            timeout=60)
    assert normal.returncode == 0 and "auto would use: namespaces" in normal.stdout, normal.stdout
    contained = subprocess.run([sys.executable, "-m", "verl_sf.cli", "doctor"], capture_output=True, text=True,
                               timeout=60, preexec_fn=container_profile.enter)
    assert contained.returncode == 0 and "auto would use: landlock" in contained.stdout, contained.stdout
    assert "namespaces: missing" in contained.stdout and "fix:" in contained.stdout


# ---- the landlock rung under attack -------------------------------------------------------------
@pytest.fixture(scope="module", params=CONTAINER_MODES)
def server(request: pytest.FixtureRequest) -> Iterator[ServerHandle]:
    with server_in_mode(request.param, *SERVER_ARGS, extra_env={"VERL_SF_TEST_SECRET": SECRET}) as handle:
        assert health(handle)["isolation"] == "landlock"
        yield handle


@pytest.fixture(autouse=True)
def server_survives(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "server" in request.fixturenames:
        server = request.getfixturevalue("server")
        assert server.process.poll() is None, "the server died"
        assert run_code(server, "print('alive')")["run_result"]["stdout"] == "alive\n"


def refused(server: ServerHandle, code: str) -> str:
    """Run `code` (which prints 'escaped' if it got through); the run's output."""
    body = run_code(server, code, run_timeout=10)
    out = body["run_result"]["stdout"] + body["run_result"]["stderr"]
    assert "escaped" not in out, out
    return out


def test_no_network(server: ServerHandle) -> None:
    port = server.url.rsplit(":", 1)[1]
    out = refused(server, "import socket\ntry:\n"
                          f"    socket.create_connection(('127.0.0.1', {port}), 2); print('escaped')\n"
                          "except OSError as exc:\n    print('refused', exc.errno)\n")
    assert "refused 1" in out


def test_no_message_queue_or_inotify_watch_of_the_hosts(server: ServerHandle) -> None:
    """Red team, 2026-12-07: with no IPC namespace a run's POSIX message queues were the host's (it made
    all 256 of them, which outlived it and failed every other non-root user's mq_open, and removed the
    account's own), and an inotify watch named the files of other runs and of the account's private
    directories, which Landlock keeps a run from listing.  Both are refused, and /health says so."""
    code = """import ctypes
libc = ctypes.CDLL(None, use_errno=True)
for name, call in (('mq_open', lambda: libc.mq_open(b'/verl-sf-probe', 0o100 | 2, 0o600, None)),
                   ('mq_unlink', lambda: libc.mq_unlink(b'/verl-sf-probe')),
                   ('inotify_add_watch', lambda: libc.inotify_add_watch(libc.inotify_init1(0), b'..', 0x100))):
    print(name, call(), ctypes.get_errno())
"""
    out = refused(server, code)
    # glibc's mq_unlink turns EPERM into EACCES; unrefused, the unknown queue was ENOENT.
    assert out.splitlines() in (["mq_open -1 1", unlinked, "inotify_add_watch -1 1"]
                                for unlinked in ("mq_unlink -1 1", "mq_unlink -1 13")), out
    limits = health(server)["limits"]
    assert limits["posix_mqueue"].startswith("refused") and limits["inotify"].startswith("refused"), limits


def test_no_server_environment_or_files(server: ServerHandle) -> None:
    server_pid = server.process.pid
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = ("import os\n"
            f"print('escaped' if {SECRET!r} in str(os.environ) else 'clean env')\n"
            f"for path in ('/proc/{server_pid}/environ', '/etc/shadow', '/root/.bashrc', {checkout!r} + '/README.md',"
            " '/home'):\n"
            "    try:\n"
            "        os.listdir(path) if path == '/home' else open(path, 'rb').read()\n"
            "        print('escaped', path)\n"
            "    except OSError as exc:\n"
            "        print('refused', path, exc.errno)\n")
    out = refused(server, code)
    assert "clean env" in out and out.count("refused") == 5, out


def test_no_writes_outside_the_runs_own_directory(server: ServerHandle) -> None:
    out = refused(server, "import os\n"
                          "for path in ('/tmp/planted', '/usr/planted', '/etc/planted', os.path.dirname(os.getcwd()) + "
                          "'/planted', '/dev/shm/planted'):\n"
                          "    try:\n        open(path, 'w').write('x'); print('escaped', path)\n"
                          "    except OSError as exc:\n        print('refused', exc.errno)\n"
                          "open('mine', 'w').write('ok'); print(open('mine').read())\n")
    assert out.count("refused") == 5 and out.rstrip().endswith("ok"), out


def test_no_signal_or_trace_reaches_the_server_or_the_zygote(server: ServerHandle) -> None:
    targets = [server.process.pid, *descendants(server.process.pid)]
    code = ("import ctypes, os, signal\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            f"for pid in {targets!r}:\n"
            "    if pid == os.getpid():\n        continue\n"
            "    try:\n        os.kill(pid, 0); print('escaped signal', pid)\n"
            "    except OSError:\n        pass\n"
            "    if libc.ptrace(16, pid, 0, 0) == 0:\n        print('escaped ptrace', pid)\n"
            "print('done')\n")
    assert refused(server, code).strip().endswith("done")


def test_no_signal_reaches_a_concurrent_run(server: ServerHandle) -> None:
    marker = f"victim-{secrets.token_hex(4)}"
    victim_name = f"vic-{secrets.token_hex(4)}"
    victim = (f"import ctypes, os, time\nopen('pid', 'w')\nprint(os.getpid(), flush=True)\n"
              f"ctypes.CDLL(None).prctl(15, b'{victim_name}', 0, 0, 0)\ntime.sleep(3)\nprint('{marker}')\n")
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(run_code, server, victim, run_timeout=8)
        wait_until(lambda: [pid for pid in descendants(server.process.pid) if comm(pid) == victim_name], 30,
                   "the victim runs")
        pids = [pid for pid in descendants(server.process.pid) if b"python" in cmdline(pid)]
        refused(server, "import os, signal\n"
                        f"for pid in {pids!r}:\n"
                        "    try:\n        os.kill(pid, signal.SIGKILL); print('escaped', pid)\n"
                        "    except OSError:\n        pass\n")
        assert running.result()["run_result"]["stdout"].endswith(f"{marker}\n")


def test_a_sandbox_killed_from_outside_takes_its_runs_with_it(server: ServerHandle) -> None:
    """No PID namespace here: the server adopts what the dead zygote's runs leave and kills it."""
    kill_sandboxes_mid_run(server)


def test_nothing_outlives_the_run(server: ServerHandle) -> None:
    marker = f"daemon-{secrets.token_hex(4)}"
    code = ("import os, subprocess\n"
            f"subprocess.Popen(['{marker}', '3600'], executable='/bin/sleep', start_new_session=True,\n"
            "                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
            "if os.fork() == 0:\n    os.setsid()\n"
            f"    os.execv('/bin/sleep', ['{marker}-2', '3600'])\n"
            "os._exit(0)\n")
    run_code(server, code)
    killed_by_reply([pid for pid in descendants(server.process.pid) if marker.encode() in cmdline(pid)],
                    "a process of the run")


def test_a_timed_out_run_is_ended_whole(server: ServerHandle) -> None:
    marker = f"spin-{secrets.token_hex(4)}"
    body = run_code(server, f"import subprocess\nsubprocess.Popen(['{marker}', '3600'], executable='/bin/sleep')\n"
                            "while True: pass\n", run_timeout=1)
    assert body["run_result"]["status"] == "TimeLimitExceeded"
    killed_by_reply([pid for pid in descendants(server.process.pid) if marker.encode() in cmdline(pid)],
                    "a process of the timed-out run")


def test_a_run_spending_its_cpu_in_processes_the_kernel_reaps_is_demoted_all_the_same(server: ServerHandle) -> None:
    hidden_cpu_is_demoted(server)


def test_what_a_session_call_leaves_running_is_demoted_from_its_reply_on(server: ServerHandle) -> None:
    session_background_is_demoted(server)


def test_a_run_changes_the_limits_and_priorities_of_itself_only(server: ServerHandle) -> None:
    """As an ordinary account every run, the zygote and the server share one uid: without the filter a
    run could set the server's RLIMIT_CPU (red team, 2026-11-30, on the namespaces rung's forks)."""
    others_out_of_reach(server)


def test_memory_cap(server: ServerHandle) -> None:
    body = run_code(server, "x = bytearray(400 << 20)\nx[::4096] = b'1' * len(x[::4096])\nimport time; time.sleep(2)\n",
                    memory_limit_MB=128, run_timeout=10)
    assert body["status"] == "Failed" and "memory" in body["run_result"]["stderr"].lower(), body  # killed, or MemoryError


def test_process_cap(server: ServerHandle) -> None:
    body = run_code(server, "import os, time\nfor _ in range(2000):\n    if os.fork() == 0:\n        time.sleep(30)\n"
                            "        os._exit(0)\nprint('escaped')\n", run_timeout=10)
    assert "escaped" not in body["run_result"]["stdout"], body
    assert run_code(server, "print(1)")["run_result"]["stdout"] == "1\n"


def test_file_size_and_output_caps(server: ServerHandle) -> None:
    big = run_code(server, "open('f', 'wb').write(b'x' * (300 << 20))\n", run_timeout=20)
    assert big["status"] == "Failed", big
    flood = run_code(server, "import sys\nfor _ in range(4096):\n    sys.stdout.write('y' * 4096)\n")
    assert flood["truncated"] is True and len(flood["run_result"]["stdout"]) < (1 << 20) + 200


def test_a_fresh_python_state_per_run(server: ServerHandle) -> None:
    run_code(server, "import builtins, sys\nbuiltins.planted = 1\nsys.modules['json'].dumps = None\n")
    body = run_code(server, "import builtins, json\nprint(hasattr(builtins, 'planted'), json.dumps([1]))\n")
    assert body["run_result"]["stdout"] == "False [1]\n"


def test_runs_do_not_see_each_others_files(server: ServerHandle) -> None:
    first = run_code(server, "import os\nopen('mine', 'w').write('secret')\nprint(os.getcwd())\nimport time\n"
                             "time.sleep(0)\n")
    elsewhere = first["run_result"]["stdout"].strip()
    out = refused(server, f"import os\ntry:\n    print('escaped', os.listdir({os.path.dirname(elsewhere)!r}))\n"
                          "except OSError as exc:\n    print('refused', exc.errno)\n")
    assert "refused" in out


def test_languages_and_numpy_work(server: ServerHandle) -> None:
    assert run_code(server, "import numpy\nprint(numpy.arange(4).sum())\n")["run_result"]["stdout"] == "6\n"
    cpp = run_code(server, '#include <cstdio>\nint main(){int a,b;scanf("%d %d",&a,&b);printf("%d\\n",a+b);}',
                   language="cpp", stdin="2 3", compile_timeout=60)
    assert cpp["run_result"]["stdout"] == "5\n", cpp
    node = run_code(server, "console.log([1,2,3].length)", language="nodejs")
    assert node["run_result"]["stdout"] == "3\n", node
    bash = run_code(server, "echo $((6 * 7))", language="bash")
    assert bash["run_result"]["stdout"] == "42\n", bash


def test_every_language_it_lists_runs_and_one_out_of_reach_is_a_sandbox_error(server: ServerHandle) -> None:
    """Each language `/health` lists runs its program on this rung; one it does not answers
    SandboxError naming why.  A user's run (2026-12-06) found typescript (tsx's CLI relays over a
    unix socket, refused here), go (its cache in the host's /tmp) and rust (a toolchain under /root,
    out of the runs' uids' reach) listed and failing every program as the code's failure."""
    listed = set(health(server)["languages"])
    assert {"cpp", "java", "nodejs", "typescript", "go"} <= listed, listed  # CI installs every language
    cases = {f"double/{lang}": (code, lang, {"stdin": "21\n", "compile_timeout": 180, "run_timeout": 90})
             for lang, code in DOUBLE.items() if lang in listed}
    cases |= {f"passing/{lang}": (template.format(body="n * 2"), lang, {"compile_timeout": 180, "run_timeout": 90})
              for lang, template in TEST_RUNNERS.items() if lang in listed}
    results = run_code_batch(server, cases)
    wrong = {key: body for key, body in results.items() if body["status"] != "Success"
             or key.startswith("double/") and body["run_result"]["stdout"].strip() != "42"}
    assert not wrong, wrong
    for lang in sorted(set(DOUBLE) - listed):
        body = run_code(server, DOUBLE[lang], language=lang)
        assert body["status"] == "SandboxError" and lang in body["message"], body


def test_files_under_workdir_are_the_runs_and_elsewhere_are_refused_naming_files(server: ServerHandle) -> None:
    """A run here has one directory, which `/workdir` names.  A user's run (2026-12-06): a file under
    /tmp answered Failed, the code's failure; it is a request this rung cannot serve as asked (400 naming
    `files`, as configuration.md says of such requests)."""
    mine = run_code(server, "print(open('a.txt').read())", files={"/workdir/a.txt": "QQ=="})
    assert mine["run_result"]["stdout"] == "A\n", mine
    for path in ("/tmp/a.txt", "/mnt/data/a.txt"):
        refused = requests.post(server.url + "/run_code", timeout=30, json={
            "code": "print(1)", "language": "python", "files": {path: "QQ=="}})
        assert refused.status_code == 400 and refused.json()["field"] == "files", refused.text
        assert "/workdir" in refused.text
        opened = requests.post(server.url + "/sessions", json={"language": "python", "files": {path: "QQ=="}},
                               timeout=30)
        assert opened.status_code == 400 and opened.json()["field"] == "files", opened.text
        cells = requests.post(server.url + "/run_jupyter", timeout=30, json={"cells": ["1"], "files": {path: "QQ=="}})
        assert cells.status_code == 400 and cells.json()["field"] == "files", cells.text
    # Red team, 2026-12-07: `.tmp` is the run's TMPDIR here; a file of that name was answered Failed,
    # the code's failure ("Is a directory"). A file beneath it is the run's to write.
    for path in (".tmp", "./.tmp", "/workdir/.tmp"):
        for route, body in (("/run_code", {"code": "print(1)", "language": "python"}), ("/run_jupyter", {"cells": ["1"]}),
                            ("/sessions", {"language": "python"})):
            refused = requests.post(server.url + route, timeout=30, json={**body, "files": {path: "QQ=="}})
            assert refused.status_code == 400 and refused.json()["field"] == "files", refused.text
            assert "TMPDIR" in refused.text
    beneath = run_code(server, "import os\nprint(open(os.environ['TMPDIR'] + '/a.txt').read())",
                       files={".tmp/a.txt": "QQ=="})
    assert beneath["run_result"]["stdout"] == "A\n", beneath


def test_a_runs_files_are_capped_in_all(server: ServerHandle) -> None:
    """No tmpfs of its own: many files under the per-file cap still stop at the directory cap (256 MB)."""
    body = run_code(server, "import time\nfor i in range(4):\n    open(f'f{i}', 'wb').write(b'x' * (100 << 20))\n"
                            "time.sleep(5)\nprint('escaped')\n", run_timeout=20)
    assert "escaped" not in body["run_result"]["stdout"], body
    assert "[verl-sf: killed: its files passed 256 MB]" in body["run_result"]["stderr"], body


def test_a_tree_deeper_than_any_path_is_removed_and_fails_no_run_beside_it(server: ServerHandle) -> None:
    """Red team, 2026-11-30: a run's `mkdir d; cd d` chain past Python's recursion limit (and PATH_MAX)
    made its run directory's removal recurse until the sandbox died, failing the runs beside it, and
    the directory stayed on disk.  Now it is removed, unreadable levels and all."""
    deep = "import os\ntop = os.getcwd()\nfor _ in range(2500):\n    os.mkdir('d')\n    os.chdir('d')\n" \
           "open('payload', 'wb').write(b'x' * (1 << 20))\nos.chmod('.', 0)\nos.chdir(top)\nos.chmod('d', 0)\n" \
           "print(top)\n"
    with ThreadPoolExecutor(2) as pool:
        beside = pool.submit(run_code, server, "import time\ntime.sleep(4)\nprint('beside')\n", run_timeout=20)
        body = run_code(server, deep, run_timeout=20)
        assert body["run_result"]["return_code"] == 0, body
        assert beside.result()["run_result"]["stdout"] == "beside\n", beside.result()
    top = body["run_result"]["stdout"].strip()
    assert os.path.basename(top).startswith("run-"), top
    wait_until(lambda: not os.path.lexists(top), timeout=20, what=f"{top} removed")
    assert health(server)["warm_interpreters"]["stdlib"] == 1


def test_a_dead_zygotes_run_directories_are_removed_by_the_next(server: ServerHandle) -> None:
    """Red team, 2026-12-07: a zygote that died (then: killed by one bad `chmod`) left its runs' and
    sessions' directories on the host's disk, files and all, and a loop of such deaths filled it.
    The sandbox's next zygote removes them before it takes a job."""
    sid = requests.post(server.url + "/sessions", json={"language": "python"}, timeout=60).json()["session_id"]
    home = run_code(server, "import os\nopen('kept', 'wb').write(b'x' * (1 << 20))\nprint(os.getcwd())",
                    session_id=sid)["run_result"]["stdout"].strip()
    assert os.path.basename(home).startswith("run-") and os.path.exists(f"{home}/kept"), home
    for pid in zygotes(server.process.pid):
        os.kill(pid, signal.SIGKILL)
    # A session again, which its sandbox's next zygote holds (a run may go to another flavor's).
    wait_until(lambda: requests.post(server.url + "/sessions", json={"language": "python"}, timeout=60).ok, 30,
               "a new zygote")
    assert not os.path.lexists(home), os.listdir(home)


FALLOCATE = ("import os\nfor i in range(3):\n    fd = os.open(f'big{i}', os.O_CREAT | os.O_WRONLY, 0o600)\n"
             "    os.posix_fallocate(fd, 0, 200 << 20)\n    os.close(fd)\n")


def test_a_sessions_files_are_capped_in_all_when_made_faster_than_a_tick(server: ServerHandle) -> None:
    """Red team, 2026-11-30: on the host's disk, a session's call made 2 GB of files in 0.01 s with
    `posix_fallocate` and returned before the files' first count, and an idle session was never
    counted: the files stayed for the session's life.  Now a call's end counts them, and an idle
    session's are counted each second."""
    opened = requests.post(server.url + "/sessions", json={"language": "python"}, timeout=60)
    assert opened.status_code == 201, opened.text
    sid = opened.json()["session_id"]
    home = run_code(server, "import os\nprint(os.getcwd())", session_id=sid)["run_result"]["stdout"].strip()
    body = run_code(server, FALLOCATE, session_id=sid, run_timeout=10)
    assert body["session_alive"] is False and "its files passed 256 MB" in body["run_result"]["stderr"], body
    wait_until(lambda: not os.path.lexists(home), timeout=20, what=f"{home} removed")
    idle = requests.post(server.url + "/sessions", json={"language": "python"}, timeout=60).json()["session_id"]
    later = "import threading, time\ndef fill():\n    time.sleep(0.5)\n    " + FALLOCATE.replace("\n", "\n    ") + \
            "\nthreading.Thread(target=fill).start()\n"
    started = run_code(server, later, session_id=idle)
    assert started["session_alive"] is True and started["run_result"]["return_code"] == 0, started
    ended = wait_until(lambda: requests.post(server.url + "/run_code", timeout=30, json={
        "code": "print(1)", "language": "python", "session_id": idle}).status_code == 404, timeout=10,
        what="the idle session ended for its files")
    assert ended



def test_files_held_with_no_name_are_counted_and_hard_links_once(server: ServerHandle) -> None:
    """Red team, 2026-12-06: files unlinked while held open (or only mapped) kept their blocks on the
    host's disk out of the count (a session held 1.6 GB for as long as it lived), and a hard link was
    counted once per name (a 150 MB file with a second name was ended as past 256 MB)."""
    held = run_code(server, "import os, time\nheld = []\nfor i in range(3):\n"
                            "    f = open(f'big{i}', 'wb')\n    f.write(b'x' * (100 << 20))\n    f.flush()\n"
                            "    os.unlink(f'big{i}')\n    held.append(f)\ntime.sleep(5)\nprint('escaped')\n",
                    run_timeout=20)
    assert "escaped" not in held["run_result"]["stdout"], held
    assert "[verl-sf: killed: its files passed 256 MB]" in held["run_result"]["stderr"], held
    mapped = run_code(server, "import mmap, os, time\nmaps = []\nfor i in range(3):\n"
                              "    with open(f'big{i}', 'wb+') as f:\n        f.write(b'x' * (100 << 20))\n"
                              "        f.flush()\n        maps.append(mmap.mmap(f.fileno(), 0))\n"
                              "    os.unlink(f'big{i}')\ntime.sleep(5)\nprint('escaped')\n", run_timeout=20)
    assert "escaped" not in mapped["run_result"]["stdout"], mapped
    assert "[verl-sf: killed: its files passed 256 MB]" in mapped["run_result"]["stderr"], mapped
    linked = run_code(server, "import os, time\nopen('big', 'wb').write(b'x' * (150 << 20))\n"
                              "os.link('big', 'big2')\ntime.sleep(1)\nprint('kept')\n", run_timeout=20)
    assert linked["run_result"]["stdout"] == "kept\n", linked


def test_many_names_cost_the_zygote_little_and_past_the_cap_end_the_session(server: ServerHandle) -> None:
    """Red team, 2026-12-06: 200,000 empty files in an idle session were counted each second, and each
    count held up the zygote: every run on the server took 1.6 s.  A job's counts now take at most a
    twentieth of the zygote's time, and past 50,000 names the job ends."""
    many = "import os\nfor d in range(48):\n    os.mkdir(f'd{d}')\n    for i in range(1000):\n" \
           "        open(f'd{d}/{i}', 'w').close()\n"
    sid = requests.post(server.url + "/sessions", json={"language": "python"}, timeout=60).json()["session_id"]
    try:
        warm = zygotes(server.process.pid)
        before = cpu_seconds(warm)
        made = run_code(server, many, session_id=sid, run_timeout=120)
        assert made["session_alive"] is True and made["run_result"]["return_code"] == 0, made
        counting = cpu_seconds(warm) - before  # the zygote's, while the call made its files
        # a twentieth of the zygote's time, 0.045 of the call's measured; every 0.2 s, ~0.2 before
        assert counting < 0.1 * made["run_result"]["execution_time"], (counting, made["run_result"])
        run_code(server, many.replace("range(48)", "range(48, 52)"), session_id=sid, run_timeout=120)
        answers: list[requests.Response] = []
        wait_until(lambda: answers.append(requests.post(server.url + "/run_code", timeout=30, json={
            "code": "print(1)", "language": "python", "session_id": sid})) or answers[-1].status_code == 404,
            timeout=30, what="the session ended for its 52,000 names")
        assert "its files passed 50,000 entries" in answers[-1].text, answers[-1].text
    finally:
        requests.delete(f"{server.url}/sessions/{sid}", timeout=30)


def test_files_in_a_directory_made_unreadable_are_counted_and_its_mode_kept(server: ServerHandle) -> None:
    """A directory a run makes unreadable (write and search only) hid its files from the count when the
    zygote is the run's own account (not root): 600 MB went uncounted.  Now the count opens it up for
    its walk and puts its mode back."""
    kept = run_code(server, "import os, time\nos.mkdir('shut', 0o300)\nopen('shut/f', 'wb').write(b'x')\n"
                            "time.sleep(1)\nprint(oct(os.stat('shut').st_mode & 0o777))\n", run_timeout=10)
    assert kept["run_result"]["stdout"] == "0o300\n", kept  # counted five times meanwhile
    hidden = "import os, time\nos.mkdir('shut', 0o300)\n" + FALLOCATE.replace("f'big{i}'", "f'shut/big{i}'") + \
             "time.sleep(3)\nprint('escaped')\n"
    body = run_code(server, hidden, run_timeout=20)
    assert "escaped" not in body["run_result"]["stdout"], body
    assert "[verl-sf: killed: its files passed 256 MB]" in body["run_result"]["stderr"], body
