"""Forks against a hostile tenant, through HTTP, as root and as the CI account: the session's code
watches its own fork from a thread or a child started after the server's checks (the gc.freeze the
server calls just before forking, replaced), keeps its interpreter away from its next call, holds
descriptors of its /proc; the copy is charged for the files it holds.  No watcher may see the key,
a refused fork leaves its session as it was, and a copy reaches nothing of its parent's."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import requests

from tests.host_view import zygotes
from tests.server_fixtures import SERVER_MODES, ServerHandle, server_in_mode

pytestmark = pytest.mark.integration

# The server calls gc.freeze in a python session just before forking it.  Replaced, it tells the
# server the call is done (a forged record on fd 3) while it stays out of its read() long enough for
# the fork to be checked and the forker to start waiting for it, then starts a watcher of the
# interpreter's system calls and returns to the read.
WATCH = """
import gc, os, threading, time
seen = []
main = os.getpid()
def watch(stop_at):
    while time.monotonic() < stop_at:
        try:
            with open(f"/proc/{main}/task/{main}/syscall") as fh:
                fields = fh.read().split()
        except OSError:
            continue
        if fields and fields[0] == "56":  # clone(2), as the forker would inject it
            seen.append(fields)
def late_watcher():
    os.write(3, b'{"kind": "call_done", "return_code": 0}\\n')
    time.sleep(0.3)
    {start}
gc.freeze = late_watcher
"""
THREAD = "threading.Thread(target=watch, args=(time.monotonic() + 5,), daemon=True).start()"
CHILD = ("pid = os.fork()\n    if pid == 0:\n        watch(time.monotonic() + 5)\n"
         "        open('/tmp/seen', 'w').write(json.dumps(seen)); os._exit(0)")


@pytest.fixture(scope="module", params=SERVER_MODES)
def server(request: pytest.FixtureRequest) -> Iterator[ServerHandle]:
    with server_in_mode(request.param) as handle:
        yield handle


def create(server: ServerHandle) -> str:
    response = requests.post(server.url + "/sessions", json={"language": "python"}, timeout=60)
    assert response.status_code == 201, response.text
    return str(response.json()["session_id"])


def call(server: ServerHandle, sid: str, code: str) -> dict:
    response = requests.post(server.url + "/run_code", json={"code": code, "language": "python", "session_id": sid},
                             timeout=60)
    assert response.status_code == 200, response.text
    return dict(response.json())


def fork(server: ServerHandle, sid: str) -> requests.Response:
    return requests.post(f"{server.url}/sessions/{sid}/fork", json={"count": 1}, timeout=60)


def fork_and_snapshot(server: ServerHandle, sid: str) -> tuple[str, str]:
    """One fork of the session, and a snapshot of it: the fork's id and the snapshot's."""
    answer = fork(server, sid)
    assert answer.status_code == 201, answer.text
    [copy] = answer.json()["session_ids"]
    made = requests.post(f"{server.url}/sessions/{sid}/snapshot", timeout=60)
    assert made.status_code == 201, made.text
    return copy, made.json()["snapshot_id"]


def stdout(body: dict) -> str:
    assert body["status"] == "Success", body
    return str(body["run_result"]["stdout"])


def namespace_attempt() -> str:
    """Code that tries clone(CLONE_NEWUSER|CLONE_NEWNET) with every argument pattern it was shown."""
    return ("import ctypes, json\nlibc = ctypes.CDLL(None, use_errno=True)\nok = []\n"
            "for fields in seen:\n    args = [int(x, 16) for x in fields[1:6]]\n"
            "    r = libc.syscall(56, 0x10000000 | 0x40000000 | 17, 0, args[2], args[3], 0)\n"
            "    if r == 0: libc.syscall(60, 0)\n    ok.append(r > 0)\nprint(json.dumps([len(seen), any(ok)]))")


@pytest.mark.parametrize("start", [THREAD, CHILD], ids=["thread", "child"])
def test_a_watcher_started_after_the_checks_sees_no_key_and_the_session_lives(server: ServerHandle,
                                                                                 start: str) -> None:
    sid = create(server)
    call(server, sid, "import json\nkept = 'state'\n" + WATCH.replace("{start}", start))
    answer = fork(server, sid)
    # Refused (409, the thread or child is seen once the interpreter is stopped) or made safely.
    assert answer.status_code in (201, 409), answer.text
    if answer.status_code == 409:
        assert any(reason in answer.text for reason in ("thread", "background process", "not waiting")), answer.text
    if start == CHILD:
        call(server, sid, "import os, time\nwhile not os.path.exists('/tmp/seen'): time.sleep(0.05)\n"
                          "time.sleep(0.2)\nseen = json.load(open('/tmp/seen'))")
    else:
        call(server, sid, "import time\ntime.sleep(5.5)")
    watched, created = json.loads(stdout(call(server, sid, namespace_attempt())))
    assert watched == 0 and created is False
    assert stdout(call(server, sid, "print(kept)")) == "state\n"


def test_a_session_kept_from_its_read_is_refused_and_lives(server: ServerHandle) -> None:
    sid = create(server)
    # Just before the fork, a timer whose handler spins for 3 s: the interpreter is out of its read()
    # for longer than the forker waits for it.
    call(server, sid, "import gc, signal, time\nkept = 1\n"
                      "def spin(*_):\n    end = time.monotonic() + 3\n    while time.monotonic() < end: pass\n"
                      "signal.signal(signal.SIGALRM, spin)\n"
                      "gc.freeze = lambda: signal.setitimer(signal.ITIMER_REAL, 0.001)")
    answer = fork(server, sid)
    # Refused when the forker finds it spinning; made when it caught the read before the timer fired.
    assert answer.status_code == 201 or answer.status_code == 409 and "not waiting for its next call" in answer.text, \
        answer.text
    body = call(server, sid, "print(kept)")
    assert stdout(body) == "1\n" and body["session_alive"] is True


def test_a_copy_closes_the_parents_proc_descriptors(server: ServerHandle) -> None:
    sid = create(server)
    call(server, sid, "import os\nproc_fd = os.open('/proc/self', os.O_RDONLY | os.O_DIRECTORY)\n"
                      "task_fd = os.open('/proc/self/status', os.O_RDONLY)")
    assert stdout(call(server, sid, "print(os.read(os.open('status', os.O_RDONLY, dir_fd=proc_fd), 5))")) == "b'Name:'\n"
    answer = fork(server, sid)
    assert answer.status_code == 201, answer.text
    [copy] = answer.json()["session_ids"]
    probe = ("import errno\nfor fd in (proc_fd, task_fd):\n    try:\n        os.fstat(fd)\n        print('open')\n"
             "    except OSError as exc:\n        print(errno.errorcode[exc.errno])")
    assert stdout(call(server, copy, probe)) == "EBADF\nEBADF\n"


@pytest.fixture(scope="module")
def root_server() -> Iterator[ServerHandle]:
    """Memory cgroups need a root server here (cgroup v1): there the copy's charge is checked."""
    with server_in_mode("root") as handle:
        yield handle


def test_a_copy_is_charged_for_the_files_it_holds(root_server: ServerHandle) -> None:
    server = root_server
    response = requests.post(server.url + "/sessions", json={"language": "python", "memory_limit_MB": 256},
                             timeout=60)
    sid = response.json()["session_id"]
    call(server, sid, "open('/tmp/big', 'wb').write(b'x' * (48 << 20))")
    answer = fork(server, sid)
    assert answer.status_code == 201, answer.text
    [copy] = answer.json()["session_ids"]
    info = requests.get(f"{server.url}/sessions/{copy}", timeout=30).json()
    assert info["memory_bytes"] >= 48 << 20, info
    # Its files count against its limit: 48 MB of them and 220 MB of memory pass 256 MB.
    body = call(server, copy, "hold = bytearray(220 << 20)")
    assert body["session_alive"] is False and "memory" in body["message"], body


def test_a_copy_cannot_reach_its_pid_1(server: ServerHandle) -> None:
    """A copy's PID 1 is a reaper exec'd by the forker (so dumpable): the copy's code may neither
    trace it, read its system calls, nor signal it; were it able to, it could run code there."""
    sid = create(server)
    answer = fork(server, sid)
    assert answer.status_code == 201, answer.text
    [copy] = answer.json()["session_ids"]
    probe = ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
             "print(libc.ptrace(0x4206, 1, 0, 0), ctypes.get_errno())\n"  # PTRACE_SEIZE
             "try:\n    open('/proc/1/syscall').read()\n    print('read')\nexcept OSError as exc:\n"
             "    print(exc.errno)\n"
             "try:\n    os.kill(1, 0)\n    print('signalled')\nexcept OSError as exc:\n    print(exc.errno)")
    traced, read, signalled = stdout(call(server, copy, probe)).split("\n")[:3]
    assert traced == "-1 1" and read in ("1", "13") and signalled == "1"  # EPERM (EACCES for the read)


# Every process the session sees but itself and its PID 1: a fork's or a snapshot's, nested below it.
POISON = ("import os, resource\nothers = [int(p) for p in os.listdir('/proc') if p.isdigit() and int(p) not in (1, os.getpid())]\n"
          "def errno_of(call):\n    try:\n        call()\n        return 0\n    except OSError as exc:\n        return exc.errno\n"
          "print(sorted({errno_of(call) for pid in others for call in (\n"
          "    lambda: resource.prlimit(pid, resource.RLIMIT_CPU, (1, 1)),\n"
          "    lambda: os.setpriority(os.PRIO_PROCESS, pid, 19),\n"
          "    lambda: os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0)))}), len(others))")
BUSY = ("import os, resource, time\nnice, policy = os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0)\n"
        "while time.process_time() < 1.5:\n    pass\n"
        "print(resource.getrlimit(resource.RLIMIT_CPU)[0] == resource.RLIM_INFINITY, nice, policy)")


def test_a_session_cannot_poison_its_forks_or_its_snapshots(server: ServerHandle) -> None:
    """Red team, 2026-11-30: a session saw its fork's and its snapshot's processes (their PID namespaces
    are nested below its own) and, sharing their uid, set their RLIMIT_CPU to 1 s, their nice and
    their policy: the fork died on its next busy call, as did every session started from the snapshot."""
    sid = create(server)
    copy, snapshot = fork_and_snapshot(server, sid)
    sessions = [sid, copy]
    try:
        refused, seen = stdout(call(server, sid, POISON)).split(" ", 1)
        assert refused == "[1]" and int(seen) >= 4, (refused, seen)  # EPERM for each, on two processes of each copy
        assert stdout(call(server, copy, BUSY)) == "True 0 0\n"
        started = requests.post(server.url + "/sessions", json={"from_snapshot": snapshot}, timeout=60)
        assert started.status_code == 201, started.text
        sessions.append(started.json()["session_id"])
        assert stdout(call(server, sessions[-1], BUSY)) == "True 0 0\n"
    finally:  # the module's later tests count the sandbox's processes: a copy's interpreter looks like a zygote
        for session in sessions:
            requests.delete(f"{server.url}/sessions/{session}", timeout=60)
        requests.delete(f"{server.url}/snapshots/{snapshot}", timeout=60)



@pytest.mark.parametrize("language", ["bash", "python"])
def test_a_session_killed_for_memory_ends_none_of_its_forks_or_its_snapshots_sessions(
        server: ServerHandle, language: str) -> None:
    """Red team, 2026-12-07: a bash session filling its memory with files had the OOM killer pick its
    PID 1 (a copy of a warm interpreter, larger than bash or `head`, and at the same oom_score_adj),
    whose death ended every process below it: its fork, every session started from its snapshot and
    the snapshot, each told "its interpreter exited".  Its PID 1 is now the OOM killer's last choice."""
    made = requests.post(server.url + "/sessions", json={"language": language, "memory_limit_MB": 64}, timeout=60)
    assert made.status_code == 201, made.text
    parent = made.json()["session_id"]
    copy, snapshot = fork_and_snapshot(server, parent)
    started = requests.post(server.url + "/sessions", json={"from_snapshot": snapshot}, timeout=60)
    assert started.status_code == 201, started.text
    sessions = [copy, started.json()["session_id"]]
    fill = "head -c 300M /dev/zero > /tmp/fill" if language == "bash" else \
        "with open('/tmp/fill', 'wb') as fill:\n    for _ in range(300):\n        fill.write(bytes(1 << 20))"
    try:
        killed = requests.post(server.url + "/run_code", timeout=60, json={
            "code": fill, "language": language, "session_id": parent}).json()
        limits = requests.get(server.url + "/health", timeout=30).json()["limits"]
        if limits["memory"] == "cgroup per run":  # files are charged to it: the OOM killer is what ends it
            assert killed["session_alive"] is False and "memory" in killed["message"], killed
        else:  # its tmpfs is as large as its memory limit: the files cannot fill it
            assert "No space left on device" in killed["run_result"]["stderr"], killed
        for sid in sessions:
            alive = requests.post(server.url + "/run_code", timeout=60, json={
                "code": "echo alive" if language == "bash" else "print('alive')", "language": language,
                "session_id": sid})
            assert alive.status_code == 200 and alive.json()["run_result"]["stdout"] == "alive\n", alive.text
        again = requests.post(server.url + "/sessions", json={"from_snapshot": snapshot}, timeout=60)
        assert again.status_code == 201, again.text
        sessions.append(again.json()["session_id"])
    finally:
        for sid in sessions:
            requests.delete(f"{server.url}/sessions/{sid}", timeout=60)
        requests.delete(f"{server.url}/snapshots/{snapshot}", timeout=60)

def test_a_signal_storm_does_not_fail_the_fork(server: ServerHandle) -> None:
    """A timer every 50 µs would interrupt the clone made in the session's name: its signals wait
    until the fork is made, and then reach it again (its mask is as it was)."""
    sid = create(server)
    call(server, sid, "import signal\nkept = 3\nticks = 0\n"
                      "def tick(*_):\n    global ticks\n    ticks += 1\n"
                      "signal.signal(signal.SIGALRM, tick)\n"
                      "signal.setitimer(signal.ITIMER_REAL, 0.00005, 0.00005)")
    answer = fork(server, sid)
    assert answer.status_code == 201 or answer.status_code == 409 and "not waiting" in answer.text, answer.text
    probe = "import time\nbefore = ticks\ntime.sleep(0.2)\nprint(kept, ticks > before, signal.pthread_sigmask(signal.SIG_BLOCK, []))"
    assert stdout(call(server, sid, probe)) == "3 True set()\n"


# A session's code as a tracer of its own child: it may not ask for seccomp events (the forker's
# way of letting clone make namespaces), and under a tracer that did not, clone still makes none.
OWN_TRACER = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = libc.syscall.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
go_r, go_w = os.pipe()
pid = os.fork()
if pid == 0:
    os.read(go_r, 1)
    made = libc.syscall(56, 0x10000000 | 0x40000000 | 17, 0, 0, 0, 0)
    if made == 0:
        os._exit(0)
    os._exit(100 if made > 0 else ctypes.get_errno())
answers = []
for request, data in ((0x4206, 0x80), (0x4206, 0), (0x4200, 0x80), (21, 0x80)):  # SEIZE, SETOPTIONS, OLDSETOPTIONS
    answers.append(libc.ptrace(request, pid, None, data) == 0 or ctypes.get_errno())
os.write(go_w, b"x")
_, status = os.waitpid(pid, 0)
print(answers, os.waitstatus_to_exitcode(status))
"""


def test_no_run_can_be_the_tracer_that_lets_namespaces_be_made(server: ServerHandle) -> None:
    sid = create(server)
    answers, child = stdout(call(server, sid, OWN_TRACER)).rsplit(" ", 1)
    # Seizing with seccomp events and setting them are refused; seizing without them may be allowed.
    assert answers.startswith("[1, ") and answers.endswith(", 1, 1]"), answers
    assert int(child) == 38  # ENOSYS: no tracer let the clone go on
    [copy] = fork(server, sid).json()["session_ids"]
    assert stdout(call(server, copy, OWN_TRACER)).rsplit(" ", 1)[1] == "38\n"


HOLD_CHANNELS = (
    "import ctypes, os, pty, select\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "os.mkfifo('/tmp/fifo')\npoller = select.epoll()\n"
    "held = {'eventfd': os.eventfd(0), 'timerfd': libc.timerfd_create(1, 0), 'epoll': poller.fileno(),\n"
    "        'inotify': libc.inotify_init(), 'pty': pty.openpty()[0], 'fifo': os.open('/tmp/fifo', os.O_RDWR),\n"
    "        'mqueue': libc.mq_open(b'/q', os.O_CREAT | os.O_RDWR, 0o600, None)}\n"
    "targets = {name: os.readlink(f'/proc/self/fd/{fd}') for name, fd in held.items()}\n"
    "kept = {'tmpfs': open('/workdir/kept.txt', 'w+'), 'null': open('/dev/null'), 'system': open('/etc/hostname')}\n"
    "print(sorted(name for name, fd in held.items() if fd < 0))\n")
STILL_HELD = ("print(sorted(name for name, fd in held.items() if os.path.exists(f'/proc/self/fd/{fd}')\n"
              "             and os.readlink(f'/proc/self/fd/{fd}') == targets[name]))\n"
              "kept['tmpfs'].write('x')\nkept['tmpfs'].flush()\n"
              "print(kept['null'].read() == '', len(kept['system'].read()) > 0, open('/workdir/kept.txt').read())\n")


def test_a_copy_holds_no_channel_to_its_parent_or_its_siblings(server: ServerHandle) -> None:
    """A copy keeps its files (its own tmpfs's, reopened; read-only ones; /dev/null) and none of what
    would let it talk to the parent or another copy: eventfd, timerfd, epoll, inotify, pty, FIFO,
    message queue (red team, 2026-11-29: all seven carried data across a fork and a snapshot)."""
    parent = create(server)
    try:
        assert stdout(call(server, parent, HOLD_CHANNELS)) == "[]\n"
        answer = requests.post(f"{server.url}/sessions/{parent}/fork", json={"count": 2}, timeout=60)
        assert answer.status_code == 201, answer.text
        for copy in answer.json()["session_ids"]:
            assert stdout(call(server, copy, STILL_HELD)) == "[]\nTrue True x\n"
            requests.delete(f"{server.url}/sessions/{copy}", timeout=60)
        assert stdout(call(server, parent, STILL_HELD)).startswith(
            "['epoll', 'eventfd', 'fifo', 'inotify', 'mqueue', 'pty', 'timerfd']\nTrue True ")
    finally:
        requests.delete(f"{server.url}/sessions/{parent}", timeout=60)


# Code that leaves its interpreter unable to start again: a seccomp filter of its own (openat refused),
# or a stack limit no new thread of it fits in.
OWN_FILTER = ("import ctypes, struct\nlibc = ctypes.CDLL(None, use_errno=True)\n"
              "code = [(0x20, 0, 0, 0), (0x15, 0, 1, 257), (0x06, 0, 0, 0x00050001), (0x06, 0, 0, 0x7fff0000)]\n"
              "program = ctypes.create_string_buffer(b''.join(struct.pack('HBBI', *op) for op in code))\n"
              "fprog = ctypes.create_string_buffer(struct.pack('HxxxxxxQ', len(code), ctypes.addressof(program)))\n"
              "print(libc.syscall(317, 1, 0, fprog))\n")
TINY_STACK = "import resource\nresource.setrlimit(resource.RLIMIT_STACK, (16384, 16384))\n"


@pytest.mark.parametrize("setup", [OWN_FILTER, TINY_STACK], ids=["own-seccomp-filter", "tiny-stack"])
def test_a_fork_its_code_left_unable_to_live_ends_no_other_session(server: ServerHandle, setup: str) -> None:
    """A copy that dies as it starts (red team, 2026-11-29) once ended its zygote, and every session in it:
    now the fork is refused as the session's own doing (409), or its copy simply ends."""
    warm = set(zygotes(server.process.pid))
    attacker = create(server)
    bystanders = [create(server) for _ in range(6)]
    for number, sid in enumerate(bystanders):
        call(server, sid, f"kept = {number}")
    assert call(server, attacker, setup)["status"] == "Success"
    for _ in range(3):
        answer = fork(server, attacker)
        assert answer.status_code in (201, 409), answer.text
    for number, sid in enumerate(bystanders):
        assert stdout(call(server, sid, "print(kept)")) == f"{number}\n"
    assert set(zygotes(server.process.pid)) == warm, "a zygote died"
    for sid in (attacker, *bystanders):
        requests.delete(f"{server.url}/sessions/{sid}", timeout=60)


def test_a_snapshot_names_no_session_and_none_is_listed(server: ServerHandle) -> None:
    """Ids are capabilities: holding a snapshot's id gives no way into the session it was taken of,
    and a server lists no snapshot ids unless started with --list-snapshots."""
    sid = create(server)
    made = requests.post(f"{server.url}/sessions/{sid}/snapshot", timeout=60)
    assert made.status_code == 201, made.text
    snapshot = made.json()["snapshot_id"]
    shown = requests.get(f"{server.url}/snapshots/{snapshot}", timeout=30).json()
    assert sid not in json.dumps(shown) and sid not in made.text
    listing = requests.get(f"{server.url}/snapshots", timeout=30)
    assert listing.status_code == 403 and snapshot not in listing.text and "--list-snapshots" in listing.text
    assert requests.delete(f"{server.url}/snapshots/{snapshot}", timeout=30).status_code == 200


@pytest.mark.parametrize("mapping", ["m = mmap.mmap(-1, 1 << 20, flags=mmap.MAP_SHARED)",
                                     "fd = os.open('/dev/shm/mine', os.O_RDWR | os.O_CREAT)\nos.ftruncate(fd, 4096)\n"
                                     "m = mmap.mmap(fd, 4096)"],
                         ids=["anonymous", "shm-file"])
def test_shared_memory_is_not_forked(server: ServerHandle, mapping: str) -> None:
    """MAP_SHARED survives fork(2): parent, copies and a snapshot's sessions would write one memory,
    charged to none of them. Refused (409) until it is unmapped; the session lives."""
    refused_until_released(server, f"import mmap, os\n{mapping}\nm[:4] = b'mine'", "shared writable",
                           "print(m[:4])\nm.close()")


@pytest.mark.parametrize("holding", ["m = os.memfd_create('chan')",
                                     "m = os.open('/workdir/gone', os.O_RDWR | os.O_CREAT)\nos.unlink('/workdir/gone')"])
def test_an_open_file_with_no_name_is_not_forked(server: ServerHandle, holding: str) -> None:
    """A memfd, or a file deleted while open, held open unmapped: a copy could not reopen one of its own,
    so parent, copies and a snapshot's sessions would share one file, a channel whose pages none of them
    is charged for (red team: six sessions from a snapshot wrote 240 MB into a 64 MB session's memfd).
    Refused (409) until it is closed; the session lives."""
    refused_until_released(server, f"import os\n{holding}\nos.write(m, b'mine')", "no path reaches",
                           "print(os.pread(m, 4, 0))\nos.close(m)")


def refused_until_released(server: ServerHandle, hold: str, says: str, release: str) -> None:
    """A session that ran `hold` (leaving b'mine' in what it holds) is refused fork and snapshot (409,
    saying `says`); `release` prints b'mine' and lets it go, and then it forks."""
    sid = create(server)
    assert stdout(call(server, sid, hold)) == ""
    for route in ("fork", "snapshot"):
        refused = requests.post(f"{server.url}/sessions/{sid}/{route}", json={} if route == "fork" else None,
                                timeout=60)
        assert refused.status_code == 409 and says in refused.text, refused.text
    assert stdout(call(server, sid, release)) == "b'mine'\n"
    assert fork(server, sid).status_code == 201


def test_a_copy_keeps_no_directory_of_its_parents(server: ServerHandle) -> None:
    """A directory or O_PATH descriptor held across the fork would reach the parent's mount tree
    (its tmpfs, its /proc): closed in the copy before its first step."""
    sid = create(server)
    call(server, sid, "import os\nROOT = os.open('/', os.O_RDONLY | os.O_DIRECTORY)\n"
                      "HANDLE = os.open('/workdir', os.O_PATH)\nopen('/workdir/parent_secret', 'w').write('mine')")
    [copy] = fork(server, sid).json()["session_ids"]
    probe = ("import errno, os\nfor fd in (ROOT, HANDLE):\n    try:\n        os.fstat(fd)\n        print('open')\n"
             "    except OSError as exc:\n        print(errno.errorcode[exc.errno])")
    assert stdout(call(server, copy, probe)) == "EBADF\nEBADF\n"
    assert stdout(call(server, sid, "print(os.listdir(os.open('workdir', os.O_RDONLY, dir_fd=ROOT)))")) \
        == "['parent_secret']\n"


def test_files_a_copy_could_not_be_charged_for_are_not_forked(server: ServerHandle) -> None:
    """Without a memory cgroup (an ordinary account's server) a copy's files count against no cap:
    a session whose files pass its memory limit is refused (409). With one, the files are charged
    to the session itself, which they end."""
    response = requests.post(server.url + "/sessions", json={"language": "python", "memory_limit_MB": 64}, timeout=60)
    sid = response.json()["session_id"]
    code = "with open('/workdir/big', 'wb') as f:\n    for _ in range(80):\n        f.write(b'x' * (1 << 20))"
    written = requests.post(server.run_code_url, json={"code": code,
                                                       "language": "python", "session_id": sid}, timeout=60).json()
    if server.as_root:
        assert written["session_alive"] is False and "memory limit" in written["message"], written
        return
    assert written["status"] == "Success", written
    answer = fork(server, sid)
    assert answer.status_code == 409 and "files take 80 MB" in answer.text, answer.text
    call(server, sid, "import os\nos.remove('/workdir/big')")
    assert fork(server, sid).status_code == 201


def test_copies_share_no_socket_or_pipe_to_pass_each_other_descriptors(server: ServerHandle) -> None:
    """A unix socket pair held across the fork would let one copy send another its /workdir (or /proc)
    descriptor, and any inherited socket or pipe would carry data between copies: each copy is a session
    of its own, so they are closed in the copies (the parent keeps its own)."""
    sid = create(server)
    call(server, sid, "import os, socket\na, b = socket.socketpair()\nr, w = os.pipe()")
    made = requests.post(f"{server.url}/sessions/{sid}/fork", json={"count": 2}, timeout=60)
    assert made.status_code == 201, made.text
    first, second = made.json()["session_ids"]
    send = ("open('/workdir/private.txt', 'w').write('first')\n"
            "try:\n    socket.send_fds(a, [b'x'], [os.open('/workdir', os.O_RDONLY | os.O_DIRECTORY)])\n"
            "    print('sent')\nexcept OSError:\n    print('closed')\n"  # EBADF, or ENOTSOCK: the directory took its number
            "try:\n    os.write(w, b'answer')\n    print('written')\nexcept OSError:\n    print('closed')")
    assert stdout(call(server, first, send)) == "closed\nclosed\n"
    receive = ("try:\n    b.setblocking(False)\n    socket.recv_fds(b, 10, 4)\n    print('received')\n"
               "except OSError:\n    print('closed')\n")
    assert stdout(call(server, second, receive)) == "closed\n"
    assert stdout(call(server, sid, "a.send(b'own'); print(b.recv(3), os.write(w, b'x'))")) == "b'own' 1\n"
