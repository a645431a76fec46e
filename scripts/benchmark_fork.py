"""Fork against rebuild: how long a session's fork takes against the size of its state, what each
fork holds of its own, the time to make 64 forks, and rebuilding the same state from scratch (a
new session running the set-up again), in the same run.  Prints Markdown tables (docs/performance.md)."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from verl_sf.executor import Executor, ExecutorConfig  # noqa: E402
from verl_sf.models import RunCodeRequest, SessionCreateRequest, SessionForkRequest  # noqa: E402

# About `mb` megabytes of Python objects: rows of a parsed dataset, as a data-analysis task's set-up
# would hold them (parsing, not allocating, is what set-ups spend their time on).
BUILD = ("import json\nrows = json.loads('[' + ','.join('{{\"id\": %d, \"text\": \"%s\"}}' % (i, 'x' * 900)"
         " for i in range({count})) + ']')")
# Memory the process holds alone (private pages) and its share of the rest (PSS), in MB.
MEMORY = ("import re\nfields = dict(re.findall(r'^(\\w+):\\s+(\\d+)', open('/proc/self/smaps_rollup').read(), re.M))\n"
          "print(round((int(fields['Private_Clean']) + int(fields['Private_Dirty'])) / 1024, 1), "
          "round(int(fields['Pss']) / 1024, 1))")


async def call(executor: Executor, session: str, code: str) -> str:
    response = await executor.run_code(RunCodeRequest(code=code, language="python", session_id=session,
                                                      run_timeout=600))
    assert response.run_result is not None and response.run_result.return_code == 0, response
    return response.run_result.stdout


async def measure(executor: Executor, mb: int, repeats: int) -> str:
    code = BUILD.format(count=mb * 1024)
    rebuilds, forks = [], []
    memory_mb = 6 * mb + 512
    for _ in range(repeats):
        started = time.perf_counter()
        session = (await executor.create_session(SessionCreateRequest(memory_limit_MB=memory_mb))).session_id
        await call(executor, session, code)
        rebuilds.append(time.perf_counter() - started)
        executor.end_session(session)
    session = (await executor.create_session(SessionCreateRequest(memory_limit_MB=memory_mb))).session_id
    await call(executor, session, code)
    for _ in range(repeats):
        started = time.perf_counter()
        [fork] = (await executor.fork_session(session, SessionForkRequest())).session_ids
        forks.append(time.perf_counter() - started)
        executor.end_session(fork)
    [fork] = (await executor.fork_session(session, SessionForkRequest())).session_ids
    await call(executor, fork, "rows.append({'id': -1})")  # the fork at work on the state
    private, _ = (await call(executor, fork, MEMORY)).split()
    parent_private, _ = (await call(executor, session, MEMORY)).split()
    charged = executor.session_info(fork).memory_bytes or 0
    executor.end_session(fork)
    executor.end_session(session)
    rebuild, took = statistics.median(rebuilds), statistics.median(forks)
    return (f"| {mb} MB | {rebuild * 1000:.0f} ms | {took * 1000:.1f} ms | {took / rebuild:.3f} | "
            f"{parent_private} MB | {private} MB | {charged / 2**20:.1f} MB |")


async def many(executor: Executor, count: int) -> str:
    session = (await executor.create_session(SessionCreateRequest())).session_id
    await call(executor, session, BUILD.format(count=10 * 1024))
    started = time.perf_counter()
    made = await executor.fork_session(session, SessionForkRequest(count=count))
    took = time.perf_counter() - started
    memory = [(await call(executor, fork, MEMORY)).split() for fork in made.session_ids]
    for fork in made.session_ids:
        executor.end_session(fork)
    executor.end_session(session)
    private = statistics.mean(float(row[0]) for row in memory)
    pss = statistics.mean(float(row[1]) for row in memory)
    return (f"{count} forks of a 10 MB session in one request: {took * 1000:.0f} ms ({took / count * 1000:.1f} ms "
            f"each); per fork: {private:.1f} MB private, {pss:.1f} MB PSS")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[10, 200, 1024])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--many", type=int, default=64)
    args = parser.parse_args()
    config = ExecutorConfig(sandboxes=1, preload=(), max_sessions=args.many + 8, runs_memory_mb=16384)
    async with Executor(config) as executor:
        print("| state | rebuild (new session + set-up) | fork | fork / rebuild | parent private | "
              "fork private | fork's cgroup |")
        print("|---|---|---|---|---|---|---|")
        for mb in args.sizes_mb:
            print(await measure(executor, mb, args.repeats), flush=True)
        print()
        print(await many(executor, args.many))


if __name__ == "__main__":
    asyncio.run(main())
