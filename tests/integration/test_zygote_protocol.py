"""The executor <-> zygote protocol, spoken directly to a zygote (no server, no sandbox: the
zygote's non-isolated mode, which needs neither root nor bubblewrap)."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.host_view import comm, descendants
from tests.waiting import wait_until
from verl_sf.executor.sandbox import ZYGOTE_BOOTSTRAP, ZYGOTE_PACKAGE
from verl_sf.executor.zygote import exits
from verl_sf.executor.zygote.messages import Limits, ZygoteConfig

LIMITS: Limits = {"timeout": 5.0, "hard_timeout": 10.0, "output_limit": 1 << 16, "memory": 0, "nproc": 64}
BODY_LIMITS = {"fsize": 1 << 20, "nofile": 256, "nproc": 64, "memory": 0, "output_limit": 1 << 16}


class Zygote:
    def __init__(self, workdir: str):
        config: ZygoteConfig = {
            "isolated": False, "landlock": None, "run_uids": [], "single_uid": True, "workdir": workdir, "tmpdir": workdir, "datadir": workdir,
            "premade": [],
            "sizes": {}, "keep": {}, "uid": os.getuid(), "gid": os.getgid(),
            "env": {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, "preload": [], "ipython": False, "fetch_limit": 1 << 20,
            "cgroups": {}, "cgroup_v2": False, "cpu_counter": "", "group_prefix": "", "seccomp": [], "seccomp_sockets": [], "seccomp_self_only": {}, "libseccomp": "",
            "demote_after": 0.1,
        }
        config_fd = os.memfd_create("zygote-config")
        os.write(config_fd, json.dumps(config).encode())
        os.lseek(config_fd, 0, os.SEEK_SET)
        command = [sys.executable, "-I", "-c", ZYGOTE_BOOTSTRAP, str(config_fd), os.path.dirname(ZYGOTE_PACKAGE)]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        start_new_session=True, pass_fds=(config_fd,))
        os.close(config_fd)
        self.early: dict[int, dict[str, Any]] = {}
        assert self.read()["kind"] == "ready"

    def send(self, head: dict[str, Any], body: dict[str, Any] | str | None = None) -> None:
        assert self.process.stdin is not None
        text = json.dumps(head) + "\t" + (json.dumps(body) if body is not None else "") + "\n"
        self.process.stdin.write(text.encode())
        self.process.stdin.flush()

    def read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line, "the zygote exited"
        return json.loads(line)

    def reply_to(self, job_id: int) -> dict[str, Any]:
        """Replies arrive in completion order: keep the others for later."""
        while job_id not in self.early:
            reply = self.read()
            self.early[reply["id"]] = reply
        return self.early.pop(job_id)

    def run(self, job_id: int, code: str, hold_exit: bool = False, **body: Any) -> None:
        head = {"op": "run", "id": job_id, "limits": {**LIMITS, **body.pop("limits", {})}, "compile_timeout": 0,
                "exec": False, "hold_exit": hold_exit}
        self.send(head, {**BODY_LIMITS, "mode": "python", "code": code, "files": {}, "stdin": None,
                         "hold_exit": hold_exit, **body})


@pytest.fixture
def zyg() -> Iterator[Zygote]:
    with tempfile.TemporaryDirectory() as workdir:
        z = Zygote(workdir)
        yield z
        # Stopped, the zygote forks no more: then it and all it started go before their directory does.
        z.process.send_signal(signal.SIGSTOP)
        family = descendants(z.process.pid)
        z.process.kill()
        z.process.wait()
        for pid in family:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not any(_running(pid) for pid in family), 30, "every process of the zygote is gone")


def test_replies_carry_their_ids_in_completion_order(zyg: Zygote) -> None:
    zyg.run(1, "import time; time.sleep(1.0); print('slow')")
    zyg.run(2, "print('fast')")
    first = zyg.read()
    assert (first["id"], first["stdout"]) == (2, "fast\n")  # the fast one did not wait for the slow one
    assert zyg.reply_to(1)["stdout"] == "slow\n"


@pytest.mark.parametrize("hold_exit", [False, True])
def test_a_run_reports_status_code_cpu_and_files(zyg: Zygote, hold_exit: bool) -> None:
    files = {"in.txt": base64.b64encode(b"data").decode()}
    zyg.run(3, "import sys\nprint(open('in.txt').read()); open('out.txt', 'w').write('x'); sys.exit(3)",
            hold_exit=hold_exit, files=files, fetch_files=["out.txt", "missing.txt"])
    reply = zyg.reply_to(3)
    assert (reply["status"], reply["return_code"], reply["stdout"]) == ("Finished", 3, "data\n")
    assert reply["files"] == {"out.txt": base64.b64encode(b"x").decode()}
    assert reply["cpu_time"] is not None and reply["execution_time"] > 0


@pytest.mark.parametrize(("ending", "code"), [
    ("import os\nos._exit(5)", 5),
    ("raise ValueError('no')", 1),
    ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", -signal.SIGKILL),  # no exit_group: the kernel's report
    # another thread of PID 1 ending it (after the main thread has finished its code)
    ("import os, threading, time\nthreading.Thread(target=lambda: (time.sleep(0.2), os._exit(6))).start()", 6),
    # a child's exit_group is let go; PID 1's own is the verdict
    ("import subprocess, sys\nassert subprocess.run([sys.executable, '-c', 'raise SystemExit(2)']).returncode == 2\n"
     "sys.exit(4)", 4),
])
def test_a_run_that_holds_its_exit_is_answered_with_its_own_status(zyg: Zygote, ending: str, code: int) -> None:
    zyg.run(6, "print('started', flush=True)\n" + ending, hold_exit=True)
    reply = zyg.reply_to(6)
    assert (reply["status"], reply["return_code"], reply["stdout"]) == ("Finished", code, "started\n"), reply
    assert reply["cpu_time"] is not None


# A thread of PID 1 ends it with 1 and, while that call is under way, the main thread asks for 0:
# the kernel's status is the first call's, whichever the zygote sees last.
THREAD_EXITS_FIRST = """
import ctypes, os, threading
thread = threading.Thread(target=ctypes.CDLL(None)._exit, args=(1,))  # ctypes lets go of the GIL
thread.start()
while True:
    try:
        with open(f"/proc/self/task/{thread.native_id}/syscall") as fh:
            if fh.read().split()[0] == "%d":  # the thread is in its exit_group
                break
    except (OSError, IndexError):
        pass
os._exit(0)
"""


def test_a_threads_exit_under_way_is_the_verdict_of_a_run_that_holds_its_exit(zyg: Zygote) -> None:
    """The race a red team found: a thread's exit_group let go by the zygote, then the main thread's
    taken as the verdict (0) while the kernel ended the process with the thread's 1.  A race: each
    round is one more chance for it."""
    code = THREAD_EXITS_FIRST % exits.SYSCALLS[os.uname().machine][1]
    for round_ in range(20):
        zyg.run(80 + round_, code, hold_exit=True)
        reply = zyg.reply_to(80 + round_)
        assert (reply["status"], reply["return_code"]) == ("Finished", 1), (round_, reply)


def test_timeout_and_cancel(zyg: Zygote) -> None:
    zyg.run(4, "while True: pass", limits={"timeout": 0.5})
    timed_out = zyg.reply_to(4)
    assert timed_out["status"] == "TimeLimitExceeded"
    ready = wait_until(lambda: [pid for pid in _children(zyg.process.pid) if comm(pid) == READY], 30,
                       "a child ready for the next run")
    zyg.run(5, "import time; time.sleep(30)")
    wait_until(lambda: any(comm(pid) not in (READY, "") for pid in ready), 30, "a ready child takes the run")
    zyg.send({"op": "cancel", "id": 5})
    assert zyg.reply_to(5)["error"] == "cancelled"


def test_a_session_keeps_state_and_survives_an_interrupted_call(zyg: Zygote) -> None:
    zyg.send({"op": "open", "id": 10, "language": "python", "limits": LIMITS},
             {**BODY_LIMITS, "mode": "session_python", "files": {}})
    assert zyg.reply_to(10)["session_alive"] is True
    call = {"op": "call", "session": 10, "grace": 2.0, "limits": LIMITS}
    zyg.send({**call, "id": 11}, {"code": "x = 41", "output_limit": 1 << 16})
    assert zyg.reply_to(11)["status"] == "Finished"
    zyg.send({**call, "id": 12, "limits": {**LIMITS, "timeout": 0.5}}, {"code": "import time; time.sleep(30)",
                                                                         "output_limit": 1 << 16})
    interrupted = zyg.reply_to(12)
    assert interrupted["status"] == "TimeLimitExceeded" and interrupted["session_alive"] is True
    assert "KeyboardInterrupt" in interrupted["stderr"]
    zyg.send({**call, "id": 13}, {"code": "print(x + 1)", "output_limit": 1 << 16})
    assert zyg.reply_to(13)["stdout"] == "42\n"
    zyg.send({"op": "close", "id": 14, "session": 10})
    ended = zyg.reply_to(10)  # the session's unprompted last word
    assert ended["session_alive"] is False and ended["session_end"] == "closed"
    zyg.send({**call, "id": 15}, {"code": "print(x)", "output_limit": 1 << 16})
    assert zyg.reply_to(15)["session_alive"] is False


def test_a_call_whose_wait_spent_its_budget_still_gets_its_time_and_grace(zyg: Zygote) -> None:
    """hand_over leaves hard_timeout == timeout after a long queue: the code still runs for its
    time-out, is interrupted then, and has its grace; the session lives."""
    zyg.send({"op": "open", "id": 20, "language": "python", "limits": LIMITS},
             {**BODY_LIMITS, "mode": "session_python", "files": {}})
    assert zyg.reply_to(20)["session_alive"] is True
    call = {"op": "call", "session": 20, "grace": 2.0, "limits": {**LIMITS, "timeout": 1.0, "hard_timeout": 1.0}}
    zyg.send({**call, "id": 21}, {"code": "x = 41\nimport time\ntime.sleep(30)", "output_limit": 1 << 16})
    interrupted = zyg.reply_to(21)
    assert interrupted["status"] == "TimeLimitExceeded" and interrupted["session_alive"] is True, interrupted
    assert "KeyboardInterrupt" in interrupted["stderr"] and interrupted["execution_time"] >= 0.9
    zyg.send({**call, "id": 22}, {"code": "print(x + 1)", "output_limit": 1 << 16})
    assert zyg.reply_to(22)["stdout"] == "42\n"


READY = "verl-sf-ready"  # a child forked ahead of the next run is named so until it takes one


def _sigint_pending(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as fh:
        fields = dict(line.split(":", 1) for line in fh if ":" in line)
    return bool(int(fields["ShdPnd"], 16) & 1 << (signal.SIGINT - 1))


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _children(pid: int) -> list[int]:
    children = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as fh:
            children += map(int, fh.read().split())
    return children


def test_an_interrupt_that_comes_before_the_call_has_begun_is_sent_again(zyg: Zygote) -> None:
    """A starved interpreter reads its call after the call's time-out: the interrupt it finds
    waiting is taken for a late one of the call before and dropped, and the one sent halfway
    through the grace stops the code; the session lives, and the next call is not interrupted."""
    zyg.send({"op": "open", "id": 30, "language": "python", "limits": LIMITS},
             {**BODY_LIMITS, "mode": "session_python", "files": {}})
    assert zyg.reply_to(30)["session_alive"] is True
    # The session's PID 1 is the zygote's child that has a child: its interpreter.
    [interpreter] = [grandchild for child in _children(zyg.process.pid) for grandchild in _children(child)]
    call = {"op": "call", "session": 30, "grace": 2.0, "limits": {**LIMITS, "timeout": 0.3}}
    os.kill(interpreter, signal.SIGSTOP)
    zyg.send({**call, "id": 31}, {"code": "x = 41\nimport time\ntime.sleep(30)", "output_limit": 1 << 16})
    # Past the time-out the zygote interrupts (killpg SIGINT): the signal waits on the stopped interpreter.
    wait_until(lambda: _sigint_pending(interpreter), 30, "the interrupt is pending on the stopped interpreter")
    os.kill(interpreter, signal.SIGCONT)
    interrupted = zyg.reply_to(31)
    assert interrupted["status"] == "TimeLimitExceeded" and interrupted["session_alive"] is True, interrupted
    assert "KeyboardInterrupt" in interrupted["stderr"]
    zyg.send({**call, "id": 32, "limits": LIMITS}, {"code": "import time\ntime.sleep(0.5)\nprint(x + 1)",
                                                    "output_limit": 1 << 16})
    assert zyg.reply_to(32)["stdout"] == "42\n"


@pytest.mark.timeout(60)
def test_output_taken_before_its_event_is_handled_does_not_stall_the_zygote(zyg: Zygote) -> None:
    """A call's request and its session's background output are seen by one poll: the call takes
    that output first (it is not the call's), and the event left for it must not become a read
    that waits on an empty pipe, which would stall every job of the zygote."""
    zyg.send({"op": "open", "id": 40, "language": "python", "limits": LIMITS},
             {**BODY_LIMITS, "mode": "session_python", "files": {}})
    assert zyg.reply_to(40)["session_alive"] is True
    [interpreter] = [grandchild for child in _children(zyg.process.pid) for grandchild in _children(child)]
    threads = _threads(interpreter)
    call = {"op": "call", "session": 40, "grace": 2.0, "limits": LIMITS}
    zyg.send({**call, "id": 41}, {"code": "import threading, time\nthreading.Thread(target=lambda: (time.sleep(1),"
                                          " print('late', flush=True)), daemon=True).start()",
                                  "output_limit": 1 << 16})
    assert zyg.reply_to(41)["status"] == "Finished"
    os.kill(zyg.process.pid, signal.SIGSTOP)
    try:
        # The background thread prints and ends: its output is in the pipe while the zygote is stopped.
        wait_until(lambda: _threads(interpreter) == threads, 30, "the background thread has printed and ended")
        zyg.send({**call, "id": 42, "limits": {**LIMITS, "timeout": 0.5}},
                 {"code": "import time\ntime.sleep(30)", "output_limit": 1 << 16})
    finally:
        os.kill(zyg.process.pid, signal.SIGCONT)
    interrupted = zyg.reply_to(42)
    assert interrupted["status"] == "TimeLimitExceeded" and interrupted["session_alive"] is True, interrupted
    assert "late" not in interrupted["stdout"]


RECVMSG = 47  # x86_64


def _in_syscall(pid: int) -> int:
    """The system call `pid` is blocked in, or -1 while it runs."""
    with open(f"/proc/{pid}/syscall") as fh:
        first = fh.read().split()[0]
    return int(first) if first.isdigit() else -1


def _ready_children(zyg: Zygote) -> int:
    return sum(comm(pid) == READY for pid in _children(zyg.process.pid))


def test_the_second_ready_child_is_forked_once_no_run_waits(zyg: Zygote) -> None:
    """A fork holds the zygote up for its own CPU: while a run waits for its answer one child is
    kept ready, and the second is forked after the answer has left."""
    wait_until(lambda: _ready_children(zyg) == 2, 30, "two children ready while the zygote is idle")
    # It ticks until cancelled: a test starved for a while on a busy machine still sees it running.
    zyg.run(50, "import time\nwhile True:\n    print('tick', flush=True)\n    time.sleep(0.05)",
            limits={"timeout": 60.0, "hard_timeout": 70.0})
    wait_until(lambda: _ready_children(zyg) == 1, 30, "a ready child takes the run")
    # Each tick is an event of the zygote's loop, which refills after every event it handles.
    time.sleep(0.5)
    assert _ready_children(zyg) == 1
    zyg.send({"op": "cancel", "id": 50})
    assert zyg.reply_to(50)["error"] == "cancelled"
    wait_until(lambda: _ready_children(zyg) == 2, 30, "the second child is forked once the answer has left")


def test_a_burst_of_runs_each_gets_its_answer_while_the_template_forks_their_children(zyg: Zygote) -> None:
    """Runs arrive faster than children are forked: a run's start waits for the template's next
    child, and the loop then finds that answer taken.  Every run is answered, and the zygote serves on."""
    for round_ in range(5):
        batch = "".join(json.dumps({"op": "run", "id": 1000 * round_ + i, "limits": LIMITS, "compile_timeout": 0,
                                    "exec": False, "hold_exit": i % 2 == 0}) + "\t" +
                        json.dumps({**BODY_LIMITS, "mode": "python", "code": f"print({i})", "files": {}, "stdin": None,
                                    "hold_exit": i % 2 == 0})
                        + "\n" for i in range(16))
        assert zyg.process.stdin is not None
        zyg.process.stdin.write(batch.encode())  # one write: the zygote reads them all in one go
        zyg.process.stdin.flush()
        for i in range(16):
            assert zyg.reply_to(1000 * round_ + i)["stdout"] == f"{i}\n"


def test_the_zygote_never_waits_for_its_template(zyg: Zygote) -> None:
    """Under a fork bomb the template's fork can take minutes (every fork of the family queues on one
    lock): the zygote's loop goes on meanwhile.  With the template stopped, runs on the children
    already ready still time out on time, a run that finds none fails at its client's deadline as a
    sandbox error, and once the template forks again runs are served."""
    wait_until(lambda: sum(comm(pid) == READY for pid in _children(zyg.process.pid)) == 2, 30, "two ready children")
    [template] = [pid for pid in _children(zyg.process.pid) if comm(pid) == "verl-sf-templat"]
    # Stopped between a fork and its answer, the template would hold up the zygote's next reap of
    # orphans (a child it has not told of may be one): stop it once it waits for its next order.
    wait_until(lambda: _in_syscall(template) == RECVMSG, 30, "the template waits for its next order")
    os.kill(template, signal.SIGSTOP)
    try:
        slow = {"limits": {**LIMITS, "timeout": 1.0, "hard_timeout": 3.0}}
        for job_id in (60, 61):
            zyg.run(job_id, "import time\ntime.sleep(60)", **slow)
        zyg.run(62, "print('never')", **slow)
        for job_id in (60, 61):
            assert zyg.reply_to(job_id)["status"] == "TimeLimitExceeded"
        failed = zyg.reply_to(62)
        assert failed["kind"] == "failed" and "no child could be forked" in failed["error"], failed
    finally:
        os.kill(template, signal.SIGCONT)
    zyg.run(63, "print('served')")
    assert zyg.reply_to(63)["stdout"] == "served\n"


def test_a_runs_clock_starts_once_its_child_has_read_its_job(zyg: Zygote) -> None:
    """Under a fork storm a ready child's set-up (its cgroup join) can wait seconds on the kernel's
    locks while its job waits unread: its run_timeout does not run meanwhile, and a child that has
    not started by the client's deadline is answered as starved (the server's fault, not the code's)."""
    def stopped_ready_children() -> list[int]:
        wait_until(lambda: sum(comm(pid) == READY for pid in _children(zyg.process.pid)) == 2, 30, "two ready children")
        ready = [pid for pid in _children(zyg.process.pid) if comm(pid) == READY]
        for pid in ready:
            os.kill(pid, signal.SIGSTOP)
        return ready

    ready = stopped_ready_children()
    try:
        zyg.run(70, "print('late')", limits={**LIMITS, "timeout": 0.5, "hard_timeout": 10.0})
        time.sleep(2)  # four run_timeouts, its child stopped before it read its job
    finally:
        for pid in ready:
            with contextlib.suppress(ProcessLookupError):  # killed at its time-out meanwhile
                os.kill(pid, signal.SIGCONT)
    late = zyg.reply_to(70)
    assert late["status"] == "Finished" and late["stdout"] == "late\n", late

    ready = stopped_ready_children()
    try:
        zyg.run(71, "print('never')", limits={**LIMITS, "timeout": 0.5, "hard_timeout": 1.5})
        never = zyg.reply_to(71)
    finally:
        for pid in ready:
            with contextlib.suppress(ProcessLookupError):  # killed at its time-out meanwhile
                os.kill(pid, signal.SIGCONT)
    assert never["status"] == "TimeLimitExceeded" and never["cpu_starved"] and never["stdout"] == "", never
