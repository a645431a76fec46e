"""A session call interrupted at its time-out, judged on the interpreter's own progress.

The grace an interrupted call has to stop counts only time its interpreter could run: time spent
waiting for a CPU (behind other runs, or at nice 19 once demoted) does not count, so a busy machine
never turns "took the interrupt" into "ignored it".  When the grace is spent, `why` says what kept
the call from stopping, as /proc shows it.
"""

from __future__ import annotations

import signal

from . import procfs

SIGINT_BIT = 1 << (signal.SIGINT - 1)


def schedstat(pid: int) -> tuple[float, float]:
    """Seconds `pid`'s main thread (the one that runs Python's signal handlers) ran on a CPU, and
    waited for one."""
    try:
        with open(f"/proc/{pid}/schedstat", "rb") as fh:
            ran, waited = fh.read().split()[:2]
        return int(ran) / 1e9, int(waited) / 1e9
    except (OSError, ValueError):
        return 0.0, 0.0


class Interrupt:
    def __init__(self, pid: int, grace: float, now: float):
        self.pid = pid
        self.grace = grace
        self.sent_at = now
        self.cpu_at_start, self.wait_at_start = schedstat(pid)
        self.repeated = False  # sent again halfway through the grace

    def waited(self) -> float:
        return max(0.0, schedstat(self.pid)[1] - self.wait_at_start)

    def ran(self) -> float:
        return max(0.0, schedstat(self.pid)[0] - self.cpu_at_start)

    def progress(self, now: float) -> float:
        """Seconds since the interrupt that the interpreter was not kept off a CPU."""
        return (now - self.sent_at) - self.waited()

    def spent(self, now: float) -> bool:
        """It ran on a CPU for the grace without stopping, or had the grace to run and the kernel shows
        why it did not stop.  Otherwise (asleep, a page fault on a thrashing machine, a caught
        KeyboardInterrupt) it is left to the client's deadline (`cutoff`)."""
        if self.ran() >= self.grace:
            return True
        return self.progress(now) >= self.grace and self._reason() is not None

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

    def _reason(self) -> str | None:
        """What the kernel shows keeps the call from stopping, if anything."""
        status = procfs.status(self.pid)
        if int(status.get("SigIgn", "0"), 16) & SIGINT_BIT:
            return "the code ignores SIGINT"
        if int(status.get("SigBlk", "0"), 16) & SIGINT_BIT:
            return "the code blocks SIGINT"
        if status.get("State", "").startswith("D"):
            return "the code is blocked in uninterruptible I/O"
        if status.get("State", "").startswith(("T", "t")):
            return "the code is stopped"
        return None

    def why(self) -> str:
        """What kept the call from stopping, as the kernel shows it."""
        reason = self._reason()
        if reason is not None:
            return reason
        state = procfs.status(self.pid).get("State", "?")
        try:
            with open(f"/proc/{self.pid}/wchan") as fh:
                where = fh.read().strip() or "-"
        except OSError:
            where = "?"
        return (f"the code did not stop on the interrupt (it caught KeyboardInterrupt, or runs a long call in C; "
                f"state {state}, waiting in {where}, {self.ran():.1f} s on a CPU since)")
