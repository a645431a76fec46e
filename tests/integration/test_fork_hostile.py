"""Forks against hostile code: the key that lets clone make namespaces stays out of every run's
memory, the copy of a session's files follows none of its paths, and a parent cannot reach its
forks (nor they it)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.host_view import session_zygote
from tests.waiting import wait_until_async
from verl_sf.executor import Executor, ExecutorConfig
from verl_sf.models import RunCodeRequest, SessionCreateRequest, SessionForkRequest

TAG = "import ctypes\nctypes.CDLL(None).prctl(15, b'{tag}', 0, 0, 0)\n"  # PR_SET_NAME: found by the host


@pytest.fixture
async def executor() -> AsyncIterator[Executor]:
    async with Executor(ExecutorConfig(slots=2, sandboxes=1, preload=(), max_sessions=16)) as started:
        yield started


async def run(executor: Executor, session: str, code: str) -> str:
    response = await executor.run_code(RunCodeRequest(code=code, language="python", session_id=session))
    assert response.run_result is not None
    assert response.run_result.return_code == 0, response.run_result.stderr
    return response.run_result.stdout


def _tagged(tag: str) -> int:
    [pid] = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _comm(p) == tag]
    return pid


def _comm(process: Path) -> str:
    try:
        return (process / "comm").read_text().strip()
    except OSError:
        return ""


def _holds(pid: int, needles: list[bytes]) -> list[str]:
    """The needles found in a process's writable memory, read from the host (root)."""
    found = set()
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            fields = line.split()
            if fields[1][0] != "r" or fields[-1] in ("[vvar]", "[vvar_vclock]", "[vsyscall]"):
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            try:
                mem.seek(start)
                chunk = mem.read(end - start)
            except OSError:
                continue
            found.update(needle.hex() for needle in needles if needle in chunk)
    return sorted(found)


def _sealed(executor: Executor, session: str, name: str) -> bytes:
    """A zygote's sealed file, read from the host (root): the key, or the compiled filter."""
    zygote = session_zygote(executor, session)
    for fd in Path(f"/proc/{zygote}/fd").iterdir():
        if os.readlink(fd).startswith(f"/memfd:{name} "):
            return fd.read_bytes()
    raise AssertionError(f"no {name} file in the zygote")


async def test_the_key_is_in_no_runs_memory(executor: Executor) -> None:
    session = (await executor.create_session(SessionCreateRequest())).session_id
    key = _sealed(executor, session, "fork-key")
    program = _sealed(executor, session, "seccomp")
    assert len(key) == 16 and key != bytes(16)
    # The filter's instructions that hold the key (a BPF instruction is 8 bytes, its last 4 a constant).
    words = [key[0:4], key[4:8], key[8:12], key[12:16]]
    instructions = [program[i:i + 8] for i in range(0, len(program), 8) if program[i + 4:i + 8] in words]
    assert len(instructions) >= 4
    needles = [key[:8], key[8:], *instructions]
    [fork] = (await executor.fork_session(session, SessionForkRequest())).session_ids
    for number, who in enumerate((session, fork)):
        await run(executor, who, TAG.format(tag=f"scan-{number}"))
        assert _holds(_tagged(f"scan-{number}"), needles) == []
    # A plain run too (its memory is the zygote's, copied), held alive while the host reads it.
    plain = asyncio.ensure_future(executor.run_code(RunCodeRequest(
        code=TAG.format(tag="scan-run") + "import time\ntime.sleep(3)", language="python")))
    await wait_until_async(lambda: any(_comm(p) == "scan-run" for p in Path("/proc").iterdir()
                                       if p.name.isdigit()), 30, "the run is up")
    assert _holds(_tagged("scan-run"), needles) == []
    assert (await plain).run_result is not None
    # The scan finds what is there: the session, handed the key, holds it.
    await run(executor, session, f"held = bytes.fromhex('{key.hex()}')")
    assert _holds(_tagged("scan-0"), needles) == sorted({key[:8].hex(), key[8:].hex()})


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
