"""Session fork and snapshot in the real executor (real sandboxes, this process): state, files,
independence, lifetimes, and what a fork refuses."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator

import pytest

from tests.host_view import descendants, session_zygote
from tests.waiting import wait_until_async
from verl_sf.errors import SessionBusy, SessionGone, SnapshotGone
from verl_sf.executor import Executor, ExecutorConfig, Overloaded
from verl_sf.executor.executor import InvalidRequest
from verl_sf.models import RunCodeRequest, SessionCreateRequest, SessionForkRequest

SETUP = "import random\nrandom.seed(7)\nx = 41\ndef gen():\n    yield from range(10)\ng = gen()\nnext(g)\n" \
        "open('notes.txt', 'w').write('parent')\nopen('/tmp/t.txt', 'w').write('tmp')\n" \
        "open('/mnt/data/d.txt', 'w').write('data')\nimport os\nos.environ['MARK'] = 'set'\nos.mkdir('sub')\n" \
        "os.chdir('sub')\n"


def _status_field(pid: int, name: str) -> str:
    try:
        with open(f"/proc/{pid}/status") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return ""
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith(name + ":")), "")


def threads_below(root: int) -> dict[int, int]:
    """{pid: its thread count} of every process below `root` (read from the host)."""
    counts = {}
    for pid in descendants(root):
        with contextlib.suppress(OSError):
            counts[pid] = len(os.listdir(f"/proc/{pid}/task"))
    return counts


def traced_below(root: int) -> list[int]:
    """Processes below `root` that a tracer holds (the forker holds a session's interpreter while it copies it)."""
    return [pid for pid in descendants(root) if _status_field(pid, "TracerPid") not in ("", "0")]


@pytest.fixture
async def executor() -> AsyncIterator[Executor]:
    async with Executor(ExecutorConfig(slots=2, sandboxes=1, preload=(), max_sessions=16)) as started:
        yield started


async def run(executor: Executor, session: str, code: str, language: str = "python") -> str:
    response = await executor.run_code(RunCodeRequest(code=code, language=language, session_id=session))
    assert response.run_result is not None
    assert response.run_result.return_code == 0, response.run_result.stderr
    return response.run_result.stdout


async def parent_with_state(executor: Executor) -> str:
    session = (await executor.create_session(SessionCreateRequest(language="python", files={"in.txt": "aW4="})))
    await run(executor, session.session_id, SETUP)
    return session.session_id


STATE = "import os, random\nprint(x, next(g), open('../notes.txt').read(), open('/tmp/t.txt').read(), " \
        "open('/mnt/data/d.txt').read(), open('../in.txt').read(), os.environ['MARK'], os.getcwd(), random.random())"


async def test_forks_carry_the_state_files_directory_and_environment(executor: Executor) -> None:
    parent = await parent_with_state(executor)
    forks = (await executor.fork_session(parent, SessionForkRequest(count=3))).session_ids
    assert len(set(forks)) == 3 and parent not in forks
    expected = await run(executor, parent, STATE)
    assert expected.startswith("41 1 parent tmp data in set /workdir/sub ")
    for fork in forks:
        # The same draw as the parent's: a fork's generators continue where the parent's were (fork(2)).
        assert await run(executor, fork, STATE) == expected


async def test_forks_and_their_parent_are_independent(executor: Executor) -> None:
    parent = await parent_with_state(executor)
    first, second = (await executor.fork_session(parent, SessionForkRequest(count=2))).session_ids
    await run(executor, first, "x = 'first'\nopen('../notes.txt', 'w').write('first')\nimport os\n"
                               "os.remove('/tmp/t.txt')")
    assert await run(executor, first, "print(x, open('../notes.txt').read())") == "first first\n"
    # /home/user (E2B's home: each job's working directory under a second name) is the fork's own too.
    await run(executor, first, "open('/home/user/mine.txt', 'w').write('first')")
    assert await run(executor, first, "print(open('../mine.txt').read())") == "first\n"
    assert await run(executor, parent, "import os\nprint(os.path.exists('/home/user/mine.txt'), "
                                       "open('/home/user/notes.txt').read())") == "False parent\n"
    # kill -1 in one fork ends that fork (its interpreter too: only its PID 1, a reaper, is spared),
    # and reaches no other session: its own PID namespace, the others out of its sight.
    killed = await executor.run_code(RunCodeRequest(
        code="import subprocess\nsubprocess.run(['sh', '-c', 'sleep 30 & kill -9 -1; true'])", language="python",
        session_id=first))
    assert killed.session_alive is False
    for session in (parent, second):
        assert await run(executor, session, "print(x, open('../notes.txt').read(), open('/tmp/t.txt').read())") \
               == "41 parent tmp\n"
    # The parent cannot signal its forks either (kill -1 from the parent, whose uid they share).
    await run(executor, parent, "import os, signal\ntry:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError:\n    pass")
    assert await run(executor, second, "print(x)") == "41\n"


async def test_a_tree_deeper_than_any_path_is_copied_whole(executor: Executor) -> None:
    """Red team, 2026-11-30: the copy of a session's files recursed, so a `mkdir d; cd d` chain past
    Python's recursion limit (and PATH_MAX) failed its fork; a fork copies it as deep as it goes."""
    parent = (await executor.create_session(SessionCreateRequest(language="python"))).session_id
    await run(executor, parent, "import os\ntop = os.getcwd()\nfor _ in range(2500):\n    os.mkdir('d')\n"
                                "    os.chdir('d')\nopen('bottom', 'w').write('deep')\nos.symlink('/etc/hostname', 'link')\n"
                                "os.chmod('.', 0o500)\nos.chdir(top)\nos.makedirs('side/inner')\n"
                                "open('side/inner/f', 'w').write('beside')\nos.chmod('side', 0o750)\nos.chmod('d', 0o751)")
    [fork] = (await executor.fork_session(parent, SessionForkRequest())).session_ids
    walk = "import os\nlevels = 0\nwhile os.path.isdir('d'):\n    os.chdir('d')\n    levels += 1\n" \
           "print(levels, open('bottom').read(), os.readlink('link'), oct(os.stat('.').st_mode & 0o777))\nos.chdir(top)\n" \
           "print(open('side/inner/f').read(), oct(os.stat('side').st_mode & 0o777), oct(os.stat('d').st_mode & 0o777))"
    # Two directories at the top (2026-12-06): the walk's climb to the top went through '..', which
    # lands in the copy's tmpfs mounted over it, so the second was looked for in the copy (the fork
    # failed) and the first took the copy's mode.
    assert await run(executor, fork, walk) == "2500 deep /etc/hostname 0o500\nbeside 0o750 0o751\n"
    assert await run(executor, parent, walk) == "2500 deep /etc/hostname 0o500\nbeside 0o750 0o751\n"


async def test_a_fork_sees_only_its_own_processes_and_network(executor: Executor) -> None:
    parent = await parent_with_state(executor)
    await run(executor, parent, "import socket\nlistener = socket.socket()\nlistener.bind(('127.0.0.1', 8765))\n"
                                "listener.listen()")
    [fork] = (await executor.fork_session(parent, SessionForkRequest())).session_ids
    seen = await run(executor, fork, "import os\nprint(len([p for p in os.listdir('/proc') if p.isdigit()]), "
                                     "os.getpid() != 1, os.path.exists('/proc/1'))")
    assert seen == "2 True True\n"  # its PID 1 (a reaper) and its interpreter, nothing of the parent's
    reach = "import socket\ntry:\n    socket.create_connection(('127.0.0.1', 8765), timeout=2)\n    print('reached')\n" \
            "except OSError:\n    print('refused')"
    other = (await executor.create_session(SessionCreateRequest(language="python"))).session_id
    assert await run(executor, fork, reach.replace("8765", "8765")) in ("refused\n", "reached\n")
    # The parent's listening socket is closed in the fork (inherited sockets would join sessions), and
    # its own loopback is empty: nobody else reaches what the parent listens on.
    assert await run(executor, other, reach) == "refused\n"


async def test_a_fork_outlives_its_parent(executor: Executor) -> None:
    parent = await parent_with_state(executor)
    [fork] = (await executor.fork_session(parent, SessionForkRequest())).session_ids
    await executor.end_session(parent)  # done once every process of the parent is killed
    assert await run(executor, fork, "print(x)") == "41\n"
    with pytest.raises(SessionGone):
        await executor.fork_session(parent, SessionForkRequest())
    executor.end_session(fork)


async def test_a_fork_outlives_its_parents_own_exit(executor: Executor) -> None:
    parent = await parent_with_state(executor)
    [fork] = (await executor.fork_session(parent, SessionForkRequest())).session_ids
    ended = await executor.run_code(RunCodeRequest(code="import os\nos._exit(3)", language="python", session_id=parent))
    assert ended.session_alive is False
    assert await run(executor, fork, "print(x)") == "41\n"
    # ... and one killed at its time-out (the interpreter ignores the interrupt).
    [second] = (await executor.fork_session(fork, SessionForkRequest())).session_ids
    stuck = await executor.run_code(RunCodeRequest(
        code="import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(60)", language="python",
        session_id=fork, run_timeout=1))
    assert stuck.session_alive is False
    assert await run(executor, second, "print(x)") == "41\n"


async def test_forks_of_a_bash_session(executor: Executor) -> None:
    parent = (await executor.create_session(SessionCreateRequest(language="bash"))).session_id
    await run(executor, parent, "X=41; cd /tmp; echo hi > f", "bash")
    [fork] = (await executor.fork_session(parent, SessionForkRequest())).session_ids
    await run(executor, fork, "X=42; echo changed > f", "bash")
    assert await run(executor, parent, "echo $X $PWD $(cat f)", "bash") == "41 /tmp hi\n"
    assert await run(executor, fork, "echo $X $PWD $(cat f)", "bash") == "42 /tmp changed\n"


async def test_reseeded_forks_draw_their_own_numbers(executor: Executor) -> None:
    parent = await parent_with_state(executor)
    forks = (await executor.fork_session(parent, SessionForkRequest(count=2, reseed=True))).session_ids
    draws = {await run(executor, session, "import random\nprint(random.random())") for session in (parent, *forks)}
    assert len(draws) == 3
    shell = (await executor.create_session(SessionCreateRequest(language="bash"))).session_id
    await run(executor, shell, "RANDOM=7", "bash")
    for reseed, distinct in ((False, 1), (True, 2)):
        copies = (await executor.fork_session(shell, SessionForkRequest(count=2, reseed=reseed))).session_ids
        assert len({await run(executor, copy, "echo $RANDOM", "bash") for copy in copies}) == distinct


async def test_a_snapshot_starts_many_sessions_and_runs_nothing(executor: Executor) -> None:
    parent = await parent_with_state(executor)
    snapshot = await executor.snapshot_session(parent)
    await run(executor, parent, "x = 'moved on'")
    started = [(await executor.create_session(SessionCreateRequest(from_snapshot=snapshot.snapshot_id))).session_id
               for _ in range(3)]
    for session in started:
        assert await run(executor, session, "print(x)") == "41\n"
        await run(executor, session, "x = 'mine'")
    assert executor.snapshot_info(snapshot.snapshot_id).sessions_started == 3
    # A snapshot outlives its source, and a session started from it outlives the snapshot.
    executor.end_session(parent)
    again = (await executor.create_session(SessionCreateRequest(from_snapshot=snapshot.snapshot_id))).session_id
    executor.delete_snapshot(snapshot.snapshot_id)
    assert await run(executor, again, "print(x)") == "41\n"
    with pytest.raises(SnapshotGone, match="deleted"):
        await executor.create_session(SessionCreateRequest(from_snapshot=snapshot.snapshot_id))


async def test_what_a_fork_refuses(executor: Executor) -> None:
    parent = await parent_with_state(executor)
    with pytest.raises(SessionGone):
        await executor.fork_session("nope", SessionForkRequest())
    with pytest.raises(SnapshotGone):
        await executor.create_session(SessionCreateRequest(from_snapshot="snap-nope"))
    with pytest.raises(InvalidRequest) as too_many:
        await executor.fork_session(parent, SessionForkRequest(count=17))
    assert too_many.value.field == "count"
    with pytest.raises(Overloaded):  # past max_sessions: 503, and no copy is left behind
        await executor.fork_session(parent, SessionForkRequest(count=16))
    assert len(executor.sessions) == 1
    call = asyncio.ensure_future(run(executor, parent, "import time\ntime.sleep(2)"))
    await wait_until_async(lambda: executor.sessions[parent].busy.locked(), 30, "the parent's call is running")
    with pytest.raises(SessionBusy, match="call is running"):
        await executor.fork_session(parent, SessionForkRequest())
    await call
    zygote = session_zygote(executor, parent)
    threads = threads_below(zygote)
    await run(executor, parent, "import threading, time\nthreading.Thread(target=time.sleep, args=(3,)).start()")
    with pytest.raises(SessionBusy, match="threads"):
        await executor.fork_session(parent, SessionForkRequest())
    await wait_until_async(lambda: all(threads_below(zygote).get(pid, 0) <= count for pid, count in threads.items()),
                           30, "the parent's extra thread has ended")
    await run(executor, parent, "import subprocess\nbackground = subprocess.Popen(['sleep', '30'])")
    with pytest.raises(SessionBusy, match="background"):
        await executor.fork_session(parent, SessionForkRequest())
    with pytest.raises(InvalidRequest, match="snapshot"):
        snapshot = await executor.snapshot_session((await executor.create_session(
            SessionCreateRequest(language="python"))).session_id)
        await executor.create_session(SessionCreateRequest(from_snapshot=snapshot.snapshot_id, language="bash"))
    assert len(executor.sessions) == 2  # nothing half-made is left on record


async def test_hard_links_setuid_bits_and_files_that_do_not_fit(executor: Executor) -> None:
    """Red team, 2026-12-06: a fork copied each name of a hard-linked file apart (one file became two,
    and 130 MB with a second name did not fit the fork's /workdir); the copy's failure answered 500
    with its reason only in the server's log, and every later fork of that session failed ("Permission
    denied: /proc/N/ns/pid": the failed copy's PID 1, still ending, was looked into); setuid and
    setgid bits were dropped; a stack limit too small for the copy to start answered 500 (now it is a
    409 naming it, where the kernel refuses the copy's start)."""
    parent = (await executor.create_session(SessionCreateRequest(language="python"))).session_id
    await run(executor, parent, "import os\nopen('big', 'wb').write(os.urandom(130 << 20))\nos.link('big', 'big2')\n"
                                "open('s', 'w').close()\nos.chmod('s', 0o4755)\nos.mkdir('g')\nos.chmod('g', 0o2711)")
    [fork] = (await executor.fork_session(parent, SessionForkRequest())).session_ids
    check = "import os\nopen('big2', 'r+b').write(b'mark')\nprint(os.stat('big').st_nlink, open('big', 'rb').read(4), " \
            "oct(os.stat('s').st_mode & 0o7777), oct(os.stat('g').st_mode & 0o7777))"
    assert await run(executor, fork, check) == "2 b'mark' 0o4755 0o2711\n"
    await executor.end_session(fork)
    # Past what a fork keeps as one file, each name is a copy: more than fits a fork's /workdir.
    await run(executor, parent, "import os\nos.unlink('big')\nos.unlink('big2')\nos.mkdir('many')\n"
                                "for i in range(2000):\n    open(f'many/{i}', 'wb').write(b'x' * 102400)\n"
                                "    os.link(f'many/{i}', f'many/{i}.again')")
    for _ in range(2):  # the second right after the first: a failed copy still ending hinders nothing
        with pytest.raises(SessionBusy, match="does not fit"):
            await executor.fork_session(parent, SessionForkRequest())
    await run(executor, parent, "import shutil\nshutil.rmtree('many')")
    [fork] = (await executor.fork_session(parent, SessionForkRequest())).session_ids
    assert await run(executor, fork, "import os\nprint(sorted(os.listdir('.')))") == "['g', 's']\n"
    await run(executor, parent, "import resource\nhard = resource.getrlimit(resource.RLIMIT_STACK)[1]\n"
                                "resource.setrlimit(resource.RLIMIT_STACK, (4096, hard))")
    try:  # whether a copy can start under it is the kernel's call (an exec needs room for its arguments)
        await executor.fork_session(parent, SessionForkRequest())
    except SessionBusy as refused:  # never a 500: the session's own doing, and said so
        assert "stack limit" in str(refused), refused
    assert await run(executor, parent, "print('alive')") == "alive\n"


async def test_model_code_cannot_make_namespaces(executor: Executor) -> None:
    session = (await executor.create_session(SessionCreateRequest(language="python"))).session_id
    code = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n" \
           "r = libc.syscall(56, 0x10000000 | 0x20000000 | 17, 0, 0, 0, 0)\n" \
           "if r == 0:\n    os._exit(0)\nprint(r, ctypes.get_errno())"
    assert await run(executor, session, code) == "-1 38\n"  # ENOSYS: clone(CLONE_NEWUSER) made by no tracer


async def test_a_parent_ended_in_the_middle_of_its_fork_leaves_nothing(executor: Executor) -> None:
    parent = await parent_with_state(executor)
    # 200 MB of files: copying them keeps the forker busy while the parent is ended.
    await run(executor, parent, "import os\nfor i in range(4):\n    open(f'/workdir/big{i}', 'wb').write(os.urandom(50 << 20))")
    zygote = session_zygote(executor, parent)
    before = set(descendants(zygote))
    forking = asyncio.ensure_future(executor.fork_session(parent, SessionForkRequest(count=2)))
    await wait_until_async(lambda: forking.done() or traced_below(zygote), 30, "the forker holds the parent",
                           every=0.005)
    assert not forking.done(), "the fork ended before it was seen under way"
    executor.end_session(parent)
    with pytest.raises(SessionGone, match="ended by DELETE /sessions"):
        await forking
    assert set(executor.sessions) == set()
    # Every process the fork made, and the parent's, is gone (but the child ready for the next run).
    await wait_until_async(lambda: len(set(descendants(zygote)) - before) <= 1, 30, "the fork's processes are gone")
    fresh = (await executor.create_session(SessionCreateRequest())).session_id
    assert await run(executor, fresh, "print(1)") == "1\n"


async def test_a_forks_memory_is_what_it_alone_holds(executor: Executor) -> None:
    parent = (await executor.create_session(SessionCreateRequest(memory_limit_MB=1024))).session_id
    await run(executor, parent, "state = [bytes([i % 256]) * 4096 for i in range(32 * 1024)]")  # 128 MB
    [fork] = (await executor.fork_session(parent, SessionForkRequest())).session_ids
    assert await run(executor, fork, "print(len(state))") == f"{32 * 1024}\n"
    parent_bytes, fork_bytes = (executor.session_info(s).memory_bytes for s in (parent, fork))
    assert parent_bytes is not None and fork_bytes is not None  # cgroups here: the server runs as root
    assert parent_bytes > 128 << 20 and fork_bytes < 32 << 20, (parent_bytes, fork_bytes)
    # What the fork writes is its own.
    await run(executor, fork, "mine = [bytes([i % 256]) * 4096 for i in range(16 * 1024)]")  # 64 MB
    assert (executor.session_info(fork).memory_bytes or 0) > fork_bytes + (48 << 20)


async def test_files_held_open_are_the_forks_own(executor: Executor) -> None:
    parent = (await executor.create_session(SessionCreateRequest())).session_id
    await run(executor, parent, "log = open('log.txt', 'a')\nlog.write('before\\n')\nlog.flush()\n"
                                "scratch = open('/tmp/scratch', 'w+')\nscratch.write('12345')\nscratch.flush()")
    [fork] = (await executor.fork_session(parent, SessionForkRequest())).session_ids
    await run(executor, fork, "log.write('fork\\n')\nlog.flush()\nscratch.write('678')\nscratch.flush()")
    await run(executor, parent, "log.write('parent\\n')\nlog.flush()")
    assert await run(executor, parent, "print(repr(open('log.txt').read()), repr(open('/tmp/scratch').read()))") \
           == "'before\\nparent\\n' '12345'\n"
    assert await run(executor, fork, "print(repr(open('log.txt').read()), repr(open('/tmp/scratch').read()))") \
           == "'before\\nfork\\n' '12345678'\n"
