"""What of the host system a sandbox sees beyond /usr, and which system calls a run may not make.

Both lists are policy, kept apart from the code that applies them (sandbox.py, zygote.py) so a
reviewer reads them in one place; docs/security.md explains each choice beside Docker's default.
"""

from __future__ import annotations

# /etc entries bound read-only when they exist.  Everything else of the host's /etc stays out
# (service configs, credentials, cloud-init data); passwd, group, hosts, hostname, resolv.conf
# and nsswitch.conf are synthetic.  Languages add what their toolchains read (LanguageSpec.etc).
ETC_ENTRIES: tuple[str, ...] = (
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d",  # the dynamic loader
    "alternatives",  # Debian's java, javac, cc, c++ ... are symlinks through here
    "ssl", "ca-certificates", "ca-certificates.conf", "pki",  # CA bundles (runtimes load them at start)
    "localtime", "timezone",  # the zone itself is /usr/share/zoneinfo
    "mime.types", "protocols", "services", "host.conf", "gai.conf",
    "java-17-openjdk",  # the JDK's conf/ links here
    "perl",  # Debian's perl reads its site config here
    "gitconfig",  # git reads it first, and stops where it exists but cannot be read (the landlock rung)
    "fonts",  # fontconfig (matplotlib looks for fonts with fc-list)
)

# Refused with EPERM for every run of every language: the kernel surface that container escapes
# and host-wide effects go through, as in Docker's default profile.  clone3 answers ENOSYS (its
# flags are out of a filter's reach; libc then uses clone, whose namespace flags are refused), as
# does every call newer than the filter's table (zygote.FIRST_UNKNOWN_SYSCALL on).
SECCOMP_DENIED: tuple[str, ...] = (
    # namespaces and mounts
    "unshare", "setns", "mount", "umount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount",
    "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    # kernel interfaces with a history of escapes
    "io_uring_setup", "io_uring_enter", "io_uring_register", "bpf", "userfaultfd", "perf_event_open",
    # native AIO: its count (fs.aio-max-nr) is the whole host's, which one run's two io_setup calls took
    "io_setup",
    # user pages in a pipe, no process's any more: 4 KiB of a huge page spliced in keeps all 2 MiB
    # (700 MB held against a 128 MB cap without a memory cgroup)
    "vmsplice",
    "keyctl", "add_key", "request_key", "open_by_handle_at", "name_to_handle_at",
    # the kernel itself and the machine
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot",
    "swapon", "swapoff", "acct", "syslog", "quotactl", "quotactl_fd", "lookup_dcookie", "vhangup",
    "iopl", "ioperm", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "sethostname",
    "setdomainname", "nfsservctl", "uselib", "_sysctl", "sysfs", "ustat", "create_module",
    "get_kernel_syms", "query_module", "vm86", "vm86old", "fanotify_init",
    # newer interfaces a run has no business with: other mounts, LSM attributes, secret memory
    "statmount", "listmount", "lsm_get_self_attr", "lsm_set_self_attr", "lsm_list_modules", "memfd_secret",
    # a run kept to fewer CPUs than its sandbox has would wait by its own choice, credited as the
    # server's (docs/scheduling.md, "The time-out clock")
    "sched_setaffinity",
)

# SysV IPC, refused where a run has no IPC namespace of its own (the landlock rung): its objects are
# the host's, outlive the run (a red team's 300 MB segment stayed after its run was killed) and are
# any other run's to open by key.  Refused too wherever there is no memory cgroup: a detached segment
# is mapped by no process, so the watchdog cannot count it (1.2 GB held against a 128 MB cap).
# POSIX shared memory and semaphores (/dev/shm, a size-capped tmpfs) are not these.
SECCOMP_DENIED_SYSV_IPC: tuple[str, ...] = (
    "shmget", "shmat", "shmdt", "shmctl", "semget", "semop", "semtimedop", "semctl",
    "msgget", "msgsnd", "msgrcv", "msgctl",
)

# Refused where a run has no IPC namespace and no mount namespace of its own (the landlock rung), as
# Landlock does not govern them.  POSIX message queues are then the host's: Landlock refuses opening
# one, not making or removing it, and a red team made the host's 256 (`fs.mqueue.queues_max`), which
# outlived the run and failed every other non-root user's `mq_open`, and removed the account's own.
# An inotify watch names the files of any directory the uid may read, Landlock's listing refusal
# notwithstanding: another run's files as they were made, the account's private directories.
SECCOMP_DENIED_WITHOUT_NAMESPACES: tuple[str, ...] = (
    "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr",
    "inotify_add_watch",
)

# Calls a run may make on itself only.  The kernel lets a process change the resource limits, nice,
# scheduling policy and I/O priority of every process of its uid it can see: a session those of its
# forks and snapshots (their PID namespaces are nested below its own), a run on the landlock rung as
# an ordinary account those of the server and of the runs beside it.  libc's setrlimit, nice and the
# like name the caller as 0.  {call: refusals}: EPERM where, in any one refusal, every
# (argument, value) pair differs.
SECCOMP_SELF_ONLY: dict[str, tuple[tuple[tuple[int, int], ...], ...]] = {
    "prlimit64": (((0, 0),),),
    "setpriority": (((0, 0),), ((1, 0),)),  # PRIO_PROCESS, and who: itself
    # A thread's SCHED_OTHER by its tid stays allowed: Mono sets it for every thread it starts.
    "sched_setscheduler": (((0, 0), (1, 0)),),
    "sched_setattr": (((0, 0),),),
    "ioprio_set": (((0, 1),), ((1, 0),)),  # IOPRIO_WHO_PROCESS, and who: itself
}

# Sockets a run may not open (socket() refused with EPERM): (address family, protocol, or -1 for
# every one). AF_VSOCK (40), as Docker's default profile refuses it: network namespaces do not
# confine it and it reaches the hypervisor or host. AF_NETLINK (16), whose queues no memory cgroup
# charges: a run's own NETLINK_USERSOCK sockets queued 870 MB to one another, and NETLINK_ROUTE's
# error acknowledgements (each echoing its request) 800 MB, against a 128 MB cap (red team,
# 2026-12-07); a run's namespace has nothing to enumerate but its loopback (/proc/net/dev shows it).
# MPTCP (262) over AF_INET (2) and AF_INET6 (10): its queues are neither TCP's nor in sock_diag's
# TCP and UDP dumps (858 MB without a memory cgroup).
ANY_PROTOCOL = -1
SECCOMP_DENIED_SOCKETS: tuple[tuple[int, int], ...] = ((40, ANY_PROTOCOL), (16, ANY_PROTOCOL), (2, 262), (10, 262))
