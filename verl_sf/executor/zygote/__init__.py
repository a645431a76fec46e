"""The warm interpreter inside each sandbox: it forks a fresh child per run and per session.

It runs inside the sandbox on the standard library alone (a test checks every import), from this
directory bound read-only there; the server imports only `messages` (and `linux`'s constants).  It never runs user code
itself: every run and session is a child forked from this pre-imported interpreter, so no
per-run interpreter start or library import is paid; forked by its `template`, a copy made before
the first request, since the zygote's own heap holds the jobs' traffic.  One zygote serves many jobs at once.

Modules, in the order a request meets them: `main` (entry), `supervisor` (the loop, pre-forking,
reaping), `template` (forking every child), `wire` (JSON lines), `messages` (every message type),
`run` and `session` (the two job kinds) over `job` (their shared child, output and clock),
`run_groups` (a cgroup per job), `procfs` (sampling a job's processes), `child` (a child's set-up,
then its job), `paths` (files opened strictly beneath a job's directories), `python_runner`,
`jupyter` and `interactive` (what a child runs), `fork_request` and `forker` (a session's copies:
the zygote's side, the forker's), `tracing` (calls made in a stopped process's name), `seccomp`,
`linux` (libc calls and constants) and `warmup` (preloading).
"""
