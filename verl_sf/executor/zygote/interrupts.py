"""A session call interrupted at its time-out, judged on the interpreter's own progress.

The grace an interrupted call has to stop counts only time its interpreter could run: time spent
waiting for a CPU (behind other runs, or at nice 19 once demoted) does not count, so a busy machine
never turns "took the interrupt" into "ignored it".  When the grace is spent, `why` says what kept
the call from stopping, as /proc shows it.
"""

from __future__ import annotations

import signal

SIGINT_BIT = 1 << (signal.SIGINT - 1)


def cpu_wait(pid: int) -> float:
    """Seconds `pid`'s main thread (the one that runs Python's signal handlers) waited for a CPU."""
    try:
        with open(f"/proc/{pid}/schedstat", "rb") as fh:
            return int(fh.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def _status(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            lines = fh.read().decode("ascii", "replace").splitlines()
    except OSError:
        return {}
    return {key: value.strip() for key, _, value in (line.partition(":") for line in lines)}


class Interrupt:
    def __init__(self, pid: int, grace: float, now: float):
        self.pid = pid
        self.grace = grace
        self.sent_at = now
        self.wait_at_start = cpu_wait(pid)
        self.repeated = False  # sent again halfway through the grace

    def waited(self) -> float:
        return max(0.0, cpu_wait(self.pid) - self.wait_at_start)

    def progress(self, now: float) -> float:
        """Seconds since the interrupt that the interpreter was not kept off a CPU."""
        return (now - self.sent_at) - self.waited()

    def spent(self, now: float) -> bool:
        return self.progress(now) >= self.grace

    def due(self, now: float) -> float:
        """The earliest moment the grace could be half or all spent (it moves later while the call waits for a CPU)."""
        return now + max(0.01, (self.grace if self.repeated else self.grace / 2) - self.progress(now))

    def repeat_due(self, now: float) -> bool:
        """Half the grace gone: send it once more (the first may have come before the call had begun,
        when the session drops what it takes for an interrupt of the call before)."""
        return not self.repeated and self.progress(now) >= self.grace / 2

    def cutoff(self, hard_deadline: float) -> float:
        """When the call is killed whatever its progress: at the client's deadline, but never before
        its grace has passed in wall-clock time (a zygote kept from its timer sends the interrupt late)."""
        return max(hard_deadline, self.sent_at + self.grace)

    def why(self) -> str:
        """What kept the call from stopping, as the kernel shows it."""
        status = _status(self.pid)
        if int(status.get("SigIgn", "0"), 16) & SIGINT_BIT:
            return "the code ignores SIGINT"
        if int(status.get("SigBlk", "0"), 16) & SIGINT_BIT:
            return "the code blocks SIGINT"
        if status.get("State", "").startswith("D"):
            return "the code is blocked in uninterruptible I/O"
        if status.get("State", "").startswith(("T", "t")):
            return "the code is stopped"
        return "the code did not stop on the interrupt (it caught KeyboardInterrupt, or runs a long call in C)"
