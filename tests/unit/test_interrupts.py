"""An interrupted session call's grace, judged on the interpreter's progress (zygote/interrupts.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from verl_sf.executor.zygote.interrupts import Interrupt


def test_the_kill_never_comes_before_the_grace_has_passed_in_wall_clock_time() -> None:
    late = Interrupt(os.getpid(), grace=2.0, now=100.0)  # the zygote sent it after the client's deadline (99)
    assert late.cutoff(hard_deadline=99.0) == 102.0
    early = Interrupt(os.getpid(), grace=2.0, now=90.0)
    assert early.cutoff(hard_deadline=99.0) == 99.0


def test_why_names_an_ignored_interrupt() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import signal, time\nsignal.signal(signal.SIGINT, "
                              "signal.SIG_IGN)\nprint(flush=True)\ntime.sleep(30)"], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"\n"
        interrupt = Interrupt(child.pid, grace=0.2, now=time.monotonic())
        os.kill(child.pid, signal.SIGINT)
        assert interrupt.why() == "the code ignores SIGINT"
        assert not interrupt.spent(interrupt.sent_at) and interrupt.spent(interrupt.sent_at + 0.3)
    finally:
        child.kill()
        child.wait()
