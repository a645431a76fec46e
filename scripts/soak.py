"""A soak: C clients for D seconds, each looping over a mix of what a server's users do at once:
stateless runs (right answers), hostile runs (fork bomb, memory hog, output flood, a sleep past
its time-out), sessions (state kept across calls and through a time-out), forks (each copy keeps
the parent's state) and E2B sandboxes (the real SDK).  Every answer is checked; a session, copy or
sandbox that ends unasked is an *unexplained end* unless its reply names a documented cause.
Prints a Markdown table (docs/performance.md); exits 1 on any wrong answer or unexplained end."""

from __future__ import annotations

import argparse
import collections
import os
import random
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from verl_sf.server.process import start_server_process, stop_server_process  # noqa: E402

HOSTILE = {
    "fork_bomb": ("import os\nwhile True:\n    os.fork()", 3),
    "memory_hog": ("x = bytearray(8 << 30)", 5),
    "flood": ("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", 3),
    "sleeper": ("import time\ntime.sleep(60)", 2),
}
# What a reply may name as the cause when a session ends that was not asked to (docs/sessions.md).
DOCUMENTED = ("evicted", "expired", "killed for exceeding its memory limit", "ignored the interrupt",
              "memory cap")
INTERRUPTIBLE = ("session", "fork parent", "fork copy")


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.right: collections.Counter[str] = collections.Counter()
        self.wrong: list[str] = []
        self.unexplained: list[str] = []
        self.explained: collections.Counter[str] = collections.Counter()

    def ok(self, kind: str) -> None:
        with self.lock:
            self.right[kind] += 1

    def bad(self, kind: str, what: str) -> None:
        with self.lock:
            self.wrong.append(f"{kind}: {what[:300]}")

    def ended(self, kind: str, reason: str) -> None:
        # This soak's sessions and copies sleep when interrupted: for them, "ignored the interrupt" is no cause.
        causes = [cause for cause in DOCUMENTED if cause in reason
                  and not (cause == "ignored the interrupt" and kind in INTERRUPTIBLE)]
        with self.lock:
            if causes:
                self.explained[f"{kind}: {causes[0]}"] += 1
            else:
                self.unexplained.append(f"{kind}: {reason[:600]!r}")


class Client:
    def __init__(self, url: str, tally: Tally, seed: int):
        self.url = url
        self.tally = tally
        self.http = requests.Session()
        self.rng = random.Random(seed)

    def post(self, path: str, body: dict[str, Any], timeout: float = 60) -> requests.Response:
        return self.http.post(self.url + path, json=body, timeout=timeout)

    def run(self, code: str, **fields: Any) -> dict[str, Any]:
        answer = self.post("/run_code", {"code": code, "language": "python", **fields},
                           timeout=float(fields.get("run_timeout", 10)) + 30)
        return dict(answer.json()) if answer.status_code == 200 else {"http": answer.status_code, "text": answer.text}

    def stateless(self) -> None:
        a, b = self.rng.randint(1, 10**6), self.rng.randint(1, 10**6)
        body = self.run(f"print({a} + {b})")
        if body.get("run_result", {}).get("stdout") == f"{a + b}\n":
            self.tally.ok("stateless")
        elif body.get("http") == 503:
            self.tally.ok("stateless refused 503")
        else:
            self.tally.bad("stateless", str(body))

    def hostile(self) -> None:
        name = self.rng.choice(list(HOSTILE))
        code, timeout = HOSTILE[name]
        body = self.run(code, run_timeout=timeout)
        if body.get("status") in ("Failed", "Success") or body.get("http") == 503:
            self.tally.ok(f"hostile {name}")
        else:
            self.tally.bad(f"hostile {name}", str(body))

    def session_call(self, kind: str, sid: str, code: str, **fields: Any) -> dict[str, Any] | None:
        body = self.run(code, session_id=sid, **fields)
        if body.get("http") == 404:
            self.tally.ended(kind, f"{body.get('text')} (at {code!r})")
            return None
        if body.get("session_alive") is False:
            self.tally.ended(kind, f"{body.get('message')} (at {code!r})")
            return None
        return body

    def session(self) -> None:
        created = self.post("/sessions", {"language": "python"})
        if created.status_code == 503:
            self.tally.ok("session refused 503")
            return
        sid = created.json()["session_id"]
        try:
            value = self.rng.randint(1, 10**6)
            steps: list[tuple[str, dict[str, Any]]] = [(f"x = {value}", {}), ("import time; time.sleep(30)",
                                                                              {"run_timeout": 1}), ("print(x)", {})]
            for step, (code, fields) in enumerate(steps):
                body = self.session_call("session", sid, code, **fields)
                if body is None:
                    return
                if step == 2:
                    if body.get("run_result", {}).get("stdout") == f"{value}\n":
                        self.tally.ok("session")
                    else:
                        self.tally.bad("session", str(body))
        finally:
            self.http.delete(f"{self.url}/sessions/{sid}", timeout=30)

    def fork(self) -> None:
        created = self.post("/sessions", {"language": "python"})
        if created.status_code == 503:
            self.tally.ok("fork refused 503")
            return
        sid = created.json()["session_id"]
        copies: list[str] = []
        try:
            value = self.rng.randint(1, 10**6)
            if self.session_call("fork parent", sid, f"x = {value}") is None:
                return
            answer = self.post(f"/sessions/{sid}/fork", {"count": 2})
            if answer.status_code in (409, 503):
                self.tally.ok(f"fork refused {answer.status_code}")
                return
            if answer.status_code != 201:
                self.tally.bad("fork", answer.text)
                return
            copies = answer.json()["session_ids"]
            for copy in copies:
                body = self.session_call("fork copy", copy, "print(x)")
                if body is not None:
                    if body.get("run_result", {}).get("stdout") == f"{value}\n":
                        self.tally.ok("fork copy")
                    else:
                        self.tally.bad("fork copy", str(body))
        finally:
            for session in (sid, *copies):
                self.http.delete(f"{self.url}/sessions/{session}", timeout=30)

    def e2b(self) -> None:
        from e2b_code_interpreter import Sandbox

        try:
            sandbox = Sandbox.create(timeout=120)
        except Exception as exc:  # the SDK's own errors: a refusal under load is 503/429
            if "503" in str(exc) or "429" in str(exc) or "rate" in str(exc).lower():
                self.tally.ok("e2b refused")
            else:
                self.tally.bad("e2b create", repr(exc))
            return
        try:
            value = self.rng.randint(1, 10**6)
            sandbox.run_code(f"x = {value}")
            execution = sandbox.run_code("x")
            if execution.error is not None:
                self.tally.ended("e2b", f"{execution.error.name}: {execution.error.value}")
            elif execution.text == str(value):
                self.tally.ok("e2b")
            else:
                self.tally.bad("e2b", repr(execution))
        finally:
            sandbox.kill()

    def loop(self, until: float) -> None:
        jobs: list[Callable[[], None]] = [self.stateless] * 4 + [self.hostile, self.session, self.fork, self.e2b]
        while time.monotonic() < until:
            job = self.rng.choice(jobs)
            try:
                job()
            except Exception as exc:
                self.tally.bad(job.__name__, repr(exc))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--url", help="an already running server (default: start one)")
    args = parser.parse_args()
    proc, url = (None, args.url) if args.url else start_server_process()
    os.environ.update(E2B_API_URL=url, E2B_SANDBOX_URL=url, E2B_API_KEY="soak-key")
    tally = Tally()
    until = time.monotonic() + args.seconds
    threads = [threading.Thread(target=Client(url, tally, seed).loop, args=(until,)) for seed in range(args.clients)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        if proc is not None:
            stop_server_process(proc)
    print("| clients | seconds | right answers | wrong | unexplained ends | explained ends |")
    print("|---|---|---|---|---|---|")
    print(f"| {args.clients} | {args.seconds:g} | {sum(tally.right.values())} | {len(tally.wrong)} | "
          f"{len(tally.unexplained)} | {sum(tally.explained.values())} |")
    print("\n" + ", ".join(f"{kind}: {count}" for kind, count in sorted(tally.right.items())))
    for line in [*tally.wrong[:20], *tally.unexplained[:20]]:
        print(f"- {line}")
    for reason, count in tally.explained.items():
        print(f"- explained ({count}): {reason}")
    sys.exit(1 if tally.wrong or tally.unexplained else 0)


if __name__ == "__main__":
    main()
