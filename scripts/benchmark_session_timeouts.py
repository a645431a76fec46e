"""Sessions that time out on a saturated machine: N session calls reach their time-out at once
while c=64 CPU-bound stateless runs keep every core busy.  Each session's call is interrupted; the
share of sessions whose state lives on is the result (target: 100%).  The server is started as a
shell starts a background job (SIGINT and SIGQUIT ignored), as `verl-sf serve &` runs.
Prints a Markdown table (docs/performance.md)."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from verl_sf.server.process import start_server_process, stop_server_process  # noqa: E402

# What a model's turn does that runs past its time-out: sleeps, and spins on the CPU (demoted to nice 19 then).
STUCK = {"sleep": "import time\ntime.sleep(60)", "spin": "while True:\n    pass"}
BURN = "while True:\n    pass"


def as_background_job() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)


async def post(http: aiohttp.ClientSession, url: str, body: dict, timeout: float) -> dict:
    async with http.post(url, json=body, timeout=aiohttp.ClientTimeout(total=timeout)) as response:
        return await response.json()


async def burn(http: aiohttp.ClientSession, url: str, stop: asyncio.Event) -> int:
    runs = 0
    while not stop.is_set():
        await post(http, url + "/run_code", {"code": BURN, "language": "python", "run_timeout": 3}, 60)
        runs += 1
    return runs


async def one_session(http: aiohttp.ClientSession, url: str, kind: str, timeout: float) -> tuple[bool, str]:
    sid = (await post(http, url + "/sessions", {"language": "python"}, 60))["session_id"]
    call = {"language": "python", "session_id": sid}
    await post(http, url + "/run_code", {**call, "code": "x = 5"}, 60)
    stuck = await post(http, url + "/run_code", {**call, "code": STUCK[kind], "run_timeout": timeout}, timeout + 30)
    after = await post(http, url + "/run_code", {**call, "code": "print(x)"}, 60)
    async with http.delete(f"{url}/sessions/{sid}"):
        pass
    alive = stuck.get("session_alive") is True and (after.get("run_result") or {}).get("stdout") == "5\n"
    return alive, "" if alive else f"{kind}: {stuck.get('message', '')} / next call: {after}"


async def measure(url: str, sessions: int, load: int, timeout: float) -> tuple[int, int, list[str], int]:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        stop = asyncio.Event()
        burners = [asyncio.create_task(burn(http, url, stop)) for _ in range(load)]
        await asyncio.sleep(3)  # the load is on every core before the sessions start
        kinds = [("sleep", "spin")[index % 2] for index in range(sessions)]
        outcomes = await asyncio.gather(*(one_session(http, url, kind, timeout) for kind in kinds))
        stop.set()
        runs = sum(await asyncio.gather(*burners))
    survived = sum(alive for alive, _ in outcomes)
    return survived, sessions, [reason for alive, reason in outcomes if not alive], runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--load", type=int, default=64, help="concurrent CPU-bound stateless runs")
    parser.add_argument("--run-timeout", type=float, default=2.0)
    parser.add_argument("--url", help="an already running server (default: start one)")
    args = parser.parse_args()
    proc = None
    url = args.url
    if url is None:
        proc, url = start_server_process("--max-sessions", str(args.sessions * 2), preexec_fn=as_background_job)
    try:
        started = time.perf_counter()
        survived, total, reasons, runs = asyncio.run(measure(url, args.sessions, args.load, args.run_timeout))
        elapsed = time.perf_counter() - started
    finally:
        if proc is not None:
            stop_server_process(proc)
    print("| sessions timing out | stateless CPU-bound load | survived | load runs | wall |")
    print("|---|---|---|---|---|")
    print(f"| {total} (half sleep, half spin; run_timeout {args.run_timeout:g} s) | c={args.load} | "
          f"{survived}/{total} ({100 * survived / total:.0f}%) | {runs} | {elapsed:.0f} s |")
    for reason in reasons:
        print(f"- lost: {reason}")
    sys.exit(0 if survived == total else 1)


if __name__ == "__main__":
    main()
