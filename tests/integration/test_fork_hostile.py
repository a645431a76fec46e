"""Forks against hostile code: no secret lets clone make namespaces, the copy of a session's files follows none of its paths, and a parent cannot reach its
forks (nor they it)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.host_view import session_zygote
from verl_sf.executor import Executor, ExecutorConfig
from verl_sf.models import RunCodeRequest, SessionCreateRequest, SessionForkRequest


@pytest.fixture
async def executor() -> AsyncIterator[Executor]:
    async with Executor(ExecutorConfig(slots=2, sandboxes=1, preload=(), max_sessions=16)) as started:
        yield started


async def run(executor: Executor, session: str, code: str) -> str:
    response = await executor.run_code(RunCodeRequest(code=code, language="python", session_id=session))
    assert response.run_result is not None
    assert response.run_result.return_code == 0, response.run_result.stderr
    return response.run_result.stdout


async def test_no_secret_admits_a_namespace(executor: Executor) -> None:
    """Nothing a run could learn lets clone make namespaces: the zygote holds no key file (its
    filter's program is in its memory, which every run inherits, and admits by tracer, not by key)."""
    session = (await executor.create_session(SessionCreateRequest())).session_id
    zygote = session_zygote(executor, session)
    names = {os.readlink(fd) for fd in Path(f"/proc/{zygote}/fd").iterdir()}
    assert "anon_inode:[pidfd]" in names  # the zygote that holds the session
    assert not any("key" in name or name.startswith("/memfd:") for name in names)


async def test_copying_files_follows_no_path_the_session_planted(executor: Executor) -> None:
    session = (await executor.create_session(SessionCreateRequest())).session_id
    await run(executor, session, "import os\n"
                                 "os.symlink('/usr', 'usr-link')\n"  # followed, the copy would fill the tmpfs
                                 "os.symlink('loop', 'loop')\n"
                                 "os.mkfifo('fifo')\n"  # opened, the copy would wait forever
                                 "for name in ('sparse', 'sparse2'):\n"  # copied whole, they would not fit
                                 "    with open(name, 'wb') as f:\n        f.truncate(200 << 20)\n        f.write(b'x')\n"
                                 "open('secret', 'w').write('mine')\nos.chmod('secret', 0)\n"
                                 "os.link('secret', 'hard')\n"
                                 "os.makedirs('deep/er/still')\nopen('deep/er/still/f', 'w').write('deep')")
    [fork] = (await executor.fork_session(session, SessionForkRequest())).session_ids
    seen = await run(executor, fork, "import os, stat\n"
                                     "print(os.readlink('usr-link'), os.readlink('loop'), "
                                     "stat.S_ISFIFO(os.lstat('fifo').st_mode), os.stat('sparse2').st_size >> 20, "
                                     "os.stat('sparse').st_blocks < 1024, oct(os.stat('secret').st_mode & 0o777), "
                                     "open('deep/er/still/f').read())")
    assert seen == "/usr loop True 200 True 0o0 deep\n"


async def test_a_parent_cannot_reach_its_forks_processes(executor: Executor) -> None:
    session = (await executor.create_session(SessionCreateRequest())).session_id
    await run(executor, session, "x = 1")
    [fork] = (await executor.fork_session(session, SessionForkRequest())).session_ids
    # From the parent, the fork's processes are in sight (its PID namespace is below the parent's)
    # but out of reach: no signal, no /proc/<pid>/mem, no ptrace (its Landlock domain is its own).
    reach = await run(executor, session, """
import ctypes, os, signal
others = [int(p) for p in os.listdir('/proc') if p.isdigit() and int(p) not in (1, os.getpid())]
libc = ctypes.CDLL(None, use_errno=True)
reached = []
for pid in others:
    try:
        os.kill(pid, signal.SIGCONT)
        reached.append(('signal', pid))
    except OSError:
        pass
    try:
        open(f'/proc/{pid}/mem', 'rb').close()
        reached.append(('mem', pid))
    except OSError:
        pass
    if libc.ptrace(16, pid, 0, 0) == 0:
        reached.append(('ptrace', pid))
print(len(others) >= 2, reached)
""")
    assert reach == "True []\n"
    assert await run(executor, fork, "print(x)") == "1\n"
