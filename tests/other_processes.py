"""A run changes the scheduling, I/O priority and resource limits of itself only, on every rung and
account: the kernel would let it change those of every process of its uid it can see (red team,
2026-11-30: a session set its fork's RLIMIT_CPU to 1 s, and the fork died on its next busy call)."""

from __future__ import annotations

import ast

from tests.server_fixtures import ServerHandle, run_code

# The errno of each change tried on `pid` (0: it worked); each changes nothing that matters to a
# process of the run's own (the same core limit, a higher nice, SCHED_BATCH, best-effort I/O).
ATTEMPTS = """
import ctypes, os, resource, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
def errno_of(call):
    try:
        call()
        return 0
    except OSError as exc:
        return exc.errno
def ioprio_set(pid):
    if libc.syscall(251, 1, pid, (2 << 13) | 4) != 0:  # IOPRIO_WHO_PROCESS, best effort, level 4
        raise OSError(ctypes.get_errno(), 'ioprio_set')
def attempts(pid):
    core = resource.getrlimit(resource.RLIMIT_CORE)
    return [errno_of(lambda: resource.prlimit(pid, resource.RLIMIT_CORE, core)),
            errno_of(lambda: os.setpriority(os.PRIO_PROCESS, pid, 5)),
            errno_of(lambda: os.sched_setscheduler(pid, os.SCHED_BATCH, os.sched_param(0))),
            errno_of(lambda: ioprio_set(pid))]
child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])
targets = {'child': child.pid, 'parent': os.getppid() or child.pid}
print(({name: attempts(pid) for name, pid in targets.items()}, attempts(0),
       errno_of(lambda: os.setpriority(os.PRIO_USER, 0, 5)), errno_of(lambda: os.setpriority(os.PRIO_PGRP, 0, 5)),
       errno_of(lambda: resource.setrlimit(resource.RLIMIT_CORE, resource.getrlimit(resource.RLIMIT_CORE))),
       errno_of(lambda: os.nice(1)),
       errno_of(lambda: os.sched_setscheduler(child.pid, os.SCHED_OTHER, os.sched_param(0)))))
child.kill()
"""
EPERM = 1


def others_out_of_reach(server: ServerHandle) -> None:
    """Its own child and its parent (the zygote, on the landlock rung; on the namespaces rung the
    run is PID 1, its parent out of sight) are refused each change; the same changes of itself, by
    pid 0 as libc names it, work."""
    result = run_code(server, ATTEMPTS, run_timeout=20)
    assert result["status"] == "Success", result
    others, own, by_user, by_group, setrlimit, nice, other_policy = ast.literal_eval(result["run_result"]["stdout"])
    assert others == {"child": [EPERM] * 4, "parent": [EPERM] * 4}, result
    assert own == [0] * 4 and setrlimit == 0 and nice == 0, result
    # SCHED_OTHER, the default, set on another thread or process (Mono does it for each thread it starts).
    assert other_policy == 0, result
    assert by_user == EPERM and by_group == EPERM, result
