#!/usr/bin/env python3
"""How long one client's large request holds up every other client of `verl-sf serve`.

A pinger sends `GET /v1/ping` one after another (2 ms apart) while one `/run_code` carries
--mb MiB: random bytes as a file (base64, as Sandbox Fusion's `files` field takes them), whose
size its code prints; or (--into code, --into stdin) that many characters of a comment in the
code itself (which prints that count), or of stdin (whose length it prints).  With --gzip the body
is sent gzip-compressed (`Content-Encoding: gzip`, as E2B's SDK uploads files) for the server to
inflate: `--into code --gzip` is a few KB on the wire, and past the server's --max-body-mb (64 MiB)
a gzip bomb, which is answered 413.  Printed per round (and written with --output): the large
request's latency and answer and the pings' p50 and max during it; the max is how long the event
loop was held.

Examples:
  python scripts/benchmark_large_body.py                     # starts a server, 32 MiB, 3 rounds
  python scripts/benchmark_large_body.py --url http://127.0.0.1:8080 --mb 8 --rounds 5
  python scripts/benchmark_large_body.py --into code --mb 50
  python scripts/benchmark_large_body.py --into code --mb 80 --gzip   # a gzip bomb of 80 KB
  python scripts/benchmark_large_body.py --checkout /tmp/before   # a server from another checkout
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gzip
import json
import os
import statistics
import time
from typing import Any, Optional

import aiohttp

from bench.server import served

PING_GAP_S = 0.002


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running verl-sf server (else the script starts one)")
    parser.add_argument("--checkout", help="start the server from this checkout's verl_sf")
    parser.add_argument("--server-arg", action="append", default=[], help="an argument for verl-sf serve")
    parser.add_argument("--mb", type=int, default=32, help="MiB of file in the large request (before base64)")
    parser.add_argument("--into", choices=("files", "code", "stdin"), default="files",
                        help="which field of the request carries the bulk")
    parser.add_argument("--gzip", action="store_true", help="send the body gzip-compressed (Content-Encoding: gzip)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", help="write the rounds as JSON here")
    return parser.parse_args(argv)


async def one_round(session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str],
                    size: int) -> dict[str, Any]:
    pings: list[float] = []
    running = True

    async def pinger() -> None:
        while running:
            started = time.perf_counter()
            async with session.get(url + "/v1/ping") as response:
                await response.read()
            pings.append(time.perf_counter() - started)
            await asyncio.sleep(PING_GAP_S)

    task = asyncio.create_task(pinger())
    await asyncio.sleep(0.2)
    before = len(pings)
    started = time.perf_counter()
    async with session.post(url + "/run_code", data=body, headers=headers) as response:
        answer = await response.json()
        status = response.status
    large_s = time.perf_counter() - started
    during = pings[before:]
    running = False
    await task
    refused = status == 413 and answer.get("code") == "body_too_large"  # a body inflating past the limit
    if not refused and (answer.get("status") != "Success" or answer["run_result"]["stdout"] != f"{size}\n"):
        raise RuntimeError(f"the large run failed: {json.dumps(answer)[:500]}")
    return {"large_ms": 1000 * large_s, "answer": status, "pings": len(during),
            "ping_p50_ms": 1000 * statistics.median(during) if during else None,
            "ping_max_ms": 1000 * max(during) if during else None}


async def run(args: argparse.Namespace, url: str) -> list[dict[str, Any]]:
    size = args.mb << 20
    request: dict[str, Any] = {"language": "python", "run_timeout": 60}
    if args.into == "files":
        request["code"] = "import os\nprint(os.path.getsize('blob.bin'))"
        request["files"] = {"blob.bin": base64.b64encode(os.urandom(size)).decode()}
    elif args.into == "stdin":
        request["code"], request["stdin"] = "import sys\nprint(len(sys.stdin.read()))", "x" * size
    else:
        request["code"] = "#" + "x" * size + f"\nprint({size})"
    body = json.dumps(request).encode()
    headers = {"Content-Type": "application/json"}
    if args.gzip:
        body, headers["Content-Encoding"] = gzip.compress(body), "gzip"
    rounds = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        for number in range(args.rounds):
            measured = await one_round(session, url, body, headers, size)
            rounds.append(measured)
            pings = (f"p50 {measured['ping_p50_ms']:.2f} ms, max {measured['ping_max_ms']:.1f} ms" if measured["pings"]
                     else "none answered before it")  # the loop was held throughout
            print(f"round {number + 1}: {len(body) / (1 << 20):.2f} MiB body answered {measured['answer']} in "
                  f"{measured['large_ms']:.0f} ms; {measured['pings']} pings meanwhile, {pings}", flush=True)
    return rounds


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    with served(args.url, args.server_arg, args.checkout) as (url, _):
        rounds = asyncio.run(run(args, url))
    if args.output:
        with open(args.output, "w") as fh:
            json.dump({"mb": args.mb, "into": args.into, "gzip": args.gzip, "checkout": args.checkout,
                       "server_args": args.server_arg,
                       "rounds": rounds}, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
