"""Fork against rebuild: how long a session's fork takes against the size of its state, the time to
make 64 forks, what each fork holds of its own (PSS), and rebuilding the same state from scratch,
in the same run.  Prints a Markdown table (docs/performance.md)."""

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

# Python objects of about `mb` megabytes: a list of distinct 1 KiB strings, as a loaded dataset would be.
BUILD = "state = [('%08d' % i) * 128 for i in range({count})]"
PSS = "import re\nprint(sum(int(v) for v in re.findall(r'^Pss:\\s+(\\d+)', open('/proc/self/smaps_rollup').read(), re.M)))"


async def timed(coro):  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    result = await coro
    return time.perf_counter() - started, result


async def measure(executor: Executor, mb: int, repeats: int) -> dict[str, float]:
    code = BUILD.format(count=mb * 1024)
    session = (await executor.create_session(SessionCreateRequest(memory_limit_MB=4 * mb + 512))).session_id
    rebuild, response = await timed(executor.run_code(RunCodeRequest(code=code, language="python", session_id=session,
                                                                     run_timeout=600)))
    assert response.run_result is not None and response.run_result.return_code == 0, response
    forks = []
    for _ in range(repeats):
        took, made = await timed(executor.fork_session(session, SessionForkRequest(count=1)))
        forks.append(took)
        executor.end_session(made.session_ids[0])
    pss = await executor.run_code(RunCodeRequest(code=PSS, language="python", session_id=session))
    [fork] = (await executor.fork_session(session, SessionForkRequest(count=1))).session_ids
    fork_pss = await executor.run_code(RunCodeRequest(code=PSS, language="python", session_id=fork))
    executor.end_session(fork)
    executor.end_session(session)
    return {"rebuild": rebuild, "fork": statistics.median(forks),
            "parent_pss_mb": int(pss.run_result.stdout) / 1024 if pss.run_result else 0.0,  # type: ignore[union-attr]
            "fork_pss_mb": int(fork_pss.run_result.stdout) / 1024 if fork_pss.run_result else 0.0}  # type: ignore[union-attr]


async def many(executor: Executor, count: int) -> tuple[float, float]:
    session = (await executor.create_session(SessionCreateRequest())).session_id
    await executor.run_code(RunCodeRequest(code=BUILD.format(count=10 * 1024), language="python", session_id=session))
    took, made = await timed(executor.fork_session(session, SessionForkRequest(count=count)))
    pss = [await executor.run_code(RunCodeRequest(code=PSS, language="python", session_id=fork))
           for fork in made.session_ids]
    for fork in made.session_ids:
        executor.end_session(fork)
    executor.end_session(session)
    return took, statistics.mean(int(r.run_result.stdout) / 1024 for r in pss if r.run_result)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[10, 200, 1024])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--many", type=int, default=64)
    args = parser.parse_args()
    config = ExecutorConfig(sandboxes=1, preload=(), max_sessions=args.many + 8, runs_memory_mb=16384)
    async with Executor(config) as executor:
        print("| state | rebuild | fork (median) | fork / rebuild | parent PSS | fork PSS |")
        print("|---|---|---|---|---|---|")
        for mb in args.sizes_mb:
            row = await measure(executor, mb, args.repeats)
            print(f"| {mb} MB | {row['rebuild'] * 1000:.0f} ms | {row['fork'] * 1000:.1f} ms | "
                  f"{row['fork'] / row['rebuild']:.3f} | {row['parent_pss_mb']:.0f} MB | {row['fork_pss_mb']:.1f} MB |")
        took, pss = await many(executor, args.many)
        print(f"\n{args.many} forks of a 10 MB session in one request: {took * 1000:.0f} ms "
              f"({took / args.many * 1000:.1f} ms each); mean PSS per fork {pss:.1f} MB")


if __name__ == "__main__":
    asyncio.run(main())
