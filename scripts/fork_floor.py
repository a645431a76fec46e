#!/usr/bin/env python3
"""The floor under any fresh-process-per-run fast path on this machine.

Imports what the stdlib warm interpreter imports, freezes the heap as the zygote does, then
forks, lets the child do nothing (or only the per-run namespaces), and reaps it, N times.
The CPU per iteration (parent and children, from os.times) is what one run costs before it
executes a single line of user code: the fork's page-table and VMA copy, copy-on-write
faults of both processes, and the exit's unmapping.  Two cores divided by it is the most
runs per second any fork-per-run design can reach here, before HTTP and the server.

Also prints what one copy-on-write fault costs here: every page a run (or the zygote after
a fork) writes to first is copied, and runs take hundreds of them.

Run as root for the namespace variants:  python scripts/fork_floor.py --iterations 2000
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import importlib
import os
import sys
import time
from pathlib import Path

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWPID = 0x00020000, 0x08000000, 0x20000000
MS_REC, MS_PRIVATE = 0x4000, 0x40000
MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8


def measure(iterations: int, namespaces: bool) -> float:
    """CPU seconds per fork + exit + waitpid, children included."""
    libc = ctypes.CDLL(None, use_errno=True)
    own_pidns = os.open("/proc/self/ns/pid", os.O_RDONLY)
    before = os.times()
    for _ in range(iterations):
        if namespaces:
            libc.setns(own_pidns, CLONE_NEWPID)
            libc.unshare(CLONE_NEWPID)
        pid = os.fork()
        if pid == 0:
            if namespaces:
                libc.unshare(CLONE_NEWNS | CLONE_NEWIPC)
                libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
            os._exit(0)
        os.waitpid(pid, 0)
    after = os.times()
    os.close(own_pidns)
    spent = sum(after[:4]) - sum(before[:4])
    return spent / iterations


def cow_fault_us(pages: int = 4000) -> float:
    """Microseconds per copy-on-write fault: write one byte into each of `pages` pages shared
    with a sleeping child, minus the same writes once the pages are our own."""
    import mmap
    import signal

    area = mmap.mmap(-1, pages * mmap.PAGESIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for offset in range(0, pages * mmap.PAGESIZE, mmap.PAGESIZE):
        area[offset] = 1
    pid = os.fork()
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    try:
        started = time.perf_counter()
        for offset in range(0, pages * mmap.PAGESIZE, mmap.PAGESIZE):
            area[offset] = 2  # each write copies a page
        shared = time.perf_counter() - started
        started = time.perf_counter()
        for offset in range(0, pages * mmap.PAGESIZE, mmap.PAGESIZE):
            area[offset] = 3  # the same writes, pages now private
        private = time.perf_counter() - started
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    return (shared - private) / pages * 1e6


def _zygote_import_context() -> contextlib.AbstractContextManager:
    """The zygote's own import wrapper, loaded from its file: the zygote is standard library
    only, so this keeps the package (and its dependencies) out of the measured process."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "verl_sf" / "executor"))
    try:
        warmup = importlib.import_module("zygote.warmup")
    finally:
        del sys.path[0]
    return warmup.threading_stand_in()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--modules", help="comma-separated modules to import instead of the stdlib interpreter's list "
                                          "(run with `python -I`), e.g. to see what a module's fork hooks cost")
    parser.add_argument("--as-zygote", action="store_true",
                        help="import --modules as the zygote does (numpy.random without the real `threading`)")
    args = parser.parse_args()
    if args.modules is None:
        # Measure in a clean interpreter (-I, like the zygote), not in one holding this package.
        import subprocess  # only here: it imports `threading`, whose fork hook would be measured

        from verl_sf.executor.config import STDLIB_PRELOAD

        command = [sys.executable, "-I", __file__, "--iterations", str(args.iterations),
                   "--modules", ",".join(STDLIB_PRELOAD)]
        raise SystemExit(subprocess.run(command).returncode)
    with _zygote_import_context() if args.as_zygote else contextlib.nullcontext():
        for name in filter(None, args.modules.split(",")):
            importlib.import_module(name)
    gc.collect()
    gc.freeze()
    with open("/proc/self/status") as status:
        rss_kb = int(next(line for line in status if line.startswith("VmRSS")).split()[1])
    cores = len(os.sched_getaffinity(0))
    variants = [("fork + exit + waitpid", False)]
    if os.geteuid() == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.unshare(CLONE_NEWNS)  # our own mount namespace: the children's /proc mounts stay in it
        libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None)
        variants.append(("+ new PID, mount, IPC namespaces and /proc", True))
    hooked = "threading" in sys.modules  # its fork hook runs in every child
    print(f"interpreter RSS {rss_kb / 1024:.1f} MiB (frozen heap, threading {'loaded' if hooked else 'not loaded'}), "
          f"{cores} cores")
    print(f"  one copy-on-write fault                       {cow_fault_us():6.2f} us")  # before any PID namespace
    for label, namespaces in variants:
        measure(max(1, args.iterations // 10), namespaces)  # warm-up
        per_run = measure(args.iterations, namespaces)
        print(f"  {label:<45} {per_run * 1000:6.3f} ms CPU per run -> at most {cores / per_run:6.0f} runs/s")


if __name__ == "__main__":
    main()
