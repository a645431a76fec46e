"""Starting one sandbox slot: user namespace, bubblewrap, then the zygote inside.

The slot's process tree: server -> bwrap (PID 1 of the slot's PID namespace) -> zygote ->
one child per run.  bubblewrap builds the filesystem view (read-only system directories,
the runtime python, size-capped tmpfs /workdir and /tmp, nothing of /root, /home, the host
/tmp or the server's files) and the network (none: not even the host's 127.0.0.1), IPC
and UTS namespaces.  Before bwrap starts we put it in a user namespace whose uid map we
write ourselves: uid 0 inside stays host root (so bwrap may bind the runtime even when it
lives under /root) but holds capabilities only inside; the uid that runs code is mapped
to the host's `nobody`, so even an escaped process owns nothing on the host.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Callable, Optional

from verl_sf.executor import zygote
from verl_sf.executor.cgroups import join_cgroups
from verl_sf.executor.config import LEAN_PRELOAD, ExecutorConfig, IsolationMode
from verl_sf.executor.languages import Toolchains

CLONE_NEWUSER = 0x10000000
HOST_NOBODY = 65534
SANDBOX_WORKDIR = "/workdir"
SANDBOX_TMP = "/tmp"
ENV_PASSTHROUGH_PREFIXES = ("OPENBLAS_", "OMP_", "MKL_", "LANG", "LC_", "TZ")
ZYGOTE_SOURCE = Path(zygote.__file__).read_text()


class IsolationUnavailable(RuntimeError):
    """The machine cannot build the sandbox; the message says what is missing."""


def check_isolation_support() -> None:
    """Fail early, with the fix, rather than on the first request."""
    if shutil.which("bwrap") is None:
        raise IsolationUnavailable(
            "bubblewrap (bwrap) is not installed: install it (e.g. `apt-get install bubblewrap`), "
            "or start with `--isolation none` to run code without isolation (unsafe)")
    if os.geteuid() != 0:
        raise IsolationUnavailable(
            "the sandbox maps run uids in a user namespace, which needs the server to run as root "
            "(as in a GPU container); otherwise start with `--isolation none` (unsafe)")


def sandbox_env(config: ExecutorConfig, toolchains: Toolchains) -> dict[str, str]:
    """The whole environment code sees: nothing of the server's (API keys live there)."""
    bin_dirs = [os.path.dirname(config.python), os.path.dirname(os.path.realpath(config.python))]
    bin_dirs += [os.path.join(d, "bin") for d in toolchains.extra_dirs]
    env = {
        "PATH": ":".join(dict.fromkeys(bin_dirs + ["/usr/local/bin", "/usr/bin", "/bin"])),
        "HOME": SANDBOX_WORKDIR,
        "TMPDIR": SANDBOX_TMP,
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONIOENCODING": "utf-8",
        **toolchains.env(),
    }
    for key, value in os.environ.items():
        if key.startswith(ENV_PASSTHROUGH_PREFIXES) and key not in env:
            env[key] = value
    return env


def _runtime_dirs(python: str) -> list[str]:
    """Directories holding the runtime interpreter and its packages (venv and base install)."""
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.dirname(os.path.realpath(python)))}
    if python != sys.executable:
        dirs.add(os.path.dirname(os.path.dirname(python)))
    return sorted(d for d in dirs if not d.startswith("/usr"))


def _ancestors(path: str) -> list[str]:
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


class SandboxLauncher:
    """Builds the argv for a slot and spawns it; one per executor."""

    def __init__(self, config: ExecutorConfig, toolchains: Toolchains):
        self.config = config
        self.toolchains = toolchains
        self.isolated = config.isolation == IsolationMode.sandbox
        self.env = sandbox_env(config, toolchains)
        self._state_dir = tempfile.mkdtemp(prefix="verl-sf-")
        os.chmod(self._state_dir, 0o755)
        self._write_identity_files()

    def _write_identity_files(self) -> None:
        # getpwuid() must work inside (Python's getpass, javac), without showing host accounts.
        uid = self.config.sandbox_uid
        Path(self._state_dir, "passwd").write_text(
            f"root:x:0:0:root:/nonexistent:/usr/sbin/nologin\nsandbox:x:{uid}:{uid}:sandbox:{SANDBOX_WORKDIR}:/bin/sh\n"
            f"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
        Path(self._state_dir, "group").write_text(f"root:x:0:\nsandbox:x:{uid}:\nnogroup:x:65534:\n")

    def slot_workdir(self, index: int, flavor: str) -> str:
        if self.isolated:
            return SANDBOX_WORKDIR
        return os.path.join(self._state_dir, f"slot{index}-{flavor}")

    def heavy_preload(self, flavor: str) -> list[str]:
        """A flavor is `lean` (stdlib only), one preloaded library by name, or `full` (all of them)."""
        if flavor == "lean":
            return []
        if flavor == "full":
            return list(self.config.preload)
        if flavor not in self.config.preload:
            raise ValueError(f"unknown interpreter flavor {flavor!r}")
        return [flavor]

    def zygote_argv(self, index: int, flavor: str) -> list[str]:
        workdir = self.slot_workdir(index, flavor)
        preload = list(LEAN_PRELOAD) + self.heavy_preload(flavor)
        zygote_config = {
            "isolated": self.isolated,
            "workdir": workdir,
            "tmpdir": SANDBOX_TMP if self.isolated else os.path.join(workdir, ".tmp"),
            "uid": self.config.sandbox_uid,
            "gid": self.config.sandbox_uid,
            "env": self.env if self.isolated else {**self.env, "HOME": workdir, "TMPDIR": os.path.join(workdir, ".tmp")},
            "preload": preload,
            "fetch_limit": self.config.fetch_file_limit_bytes,
            "keep": {SANDBOX_TMP: self.kept_entries(SANDBOX_TMP), SANDBOX_WORKDIR: self.kept_entries(SANDBOX_WORKDIR)}
            if self.isolated else {},
        }
        return [self.config.python, "-I", "-c", ZYGOTE_SOURCE, json.dumps(zygote_config)]

    def bound_dirs(self) -> list[str]:
        return _runtime_dirs(self.config.python) + list(self.toolchains.extra_dirs)

    def kept_entries(self, directory: str) -> list[str]:
        """Entries of the sandbox's /tmp or /workdir that lead to bound runtime dirs: never wiped."""
        prefix = directory.rstrip("/") + "/"
        return sorted({d[len(prefix):].split("/")[0] for d in self.bound_dirs() if d.startswith(prefix)})

    def command(self, index: int, flavor: str) -> list[str]:
        if not self.isolated:
            return self.zygote_argv(index, flavor)
        return self._bwrap_args() + ["--"] + self.zygote_argv(index, flavor)

    def _bwrap_args(self) -> list[str]:
        cfg = self.config
        args = ["bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                "--hostname", "sandbox", "--die-with-parent", "--new-session", "--cap-add", "ALL"]
        for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
            if os.path.islink(top):
                args += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                args += ["--ro-bind", top, top]
        args += ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc",
                 "--ro-bind", os.path.join(self._state_dir, "passwd"), "/etc/passwd",
                 "--ro-bind", os.path.join(self._state_dir, "group"), "/etc/group"]
        # The tmpfs mounts come first: a runtime that lives under /tmp (a CI checkout, say)
        # is then bound on top of them instead of being hidden by them.
        args += ["--proc", "/proc", "--dev", "/dev",
                 "--size", str(cfg.tmp_size_mb << 20), "--perms", "1777", "--tmpfs", SANDBOX_TMP,
                 "--size", str(cfg.workdir_size_mb << 20), "--perms", "0755", "--tmpfs", SANDBOX_WORKDIR]
        for extra in self.bound_dirs():
            # Parents such as /root are made traverse-only: the runtime is reachable, nothing else is listed.
            for parent in _ancestors(extra):
                if parent not in (SANDBOX_TMP, SANDBOX_WORKDIR):
                    args += ["--perms", "0711", "--dir", parent]
            args += ["--ro-bind", extra, extra]
        args += ["--chdir", SANDBOX_WORKDIR]
        return args

    def preexec(self, procs_files: list[str]) -> Callable[[], None]:
        """Runs in the forked child before exec: join the slot's cgroups, enter the user namespace."""
        isolated = self.isolated
        uid = self.config.sandbox_uid

        def _preexec() -> None:
            if procs_files:
                join_cgroups(procs_files)
            if isolated:
                _enter_user_namespace(uid)
            else:
                os.setsid()

        return _preexec

    def close(self) -> None:
        shutil.rmtree(self._state_dir, ignore_errors=True)


def _enter_user_namespace(sandbox_uid: int) -> None:
    """unshare(CLONE_NEWUSER), then have a still-privileged helper write a two-entry uid map.

    A process may only map its own uid into a namespace it creates; mapping a second uid
    (the one code runs as) takes CAP_SETUID in the parent namespace, which the forked
    helper still has.  Then we become uid 0 of the new namespace, with its capabilities.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    ready_r, ready_w = os.pipe()
    target = os.getpid()
    helper = os.fork()
    if helper == 0:
        try:
            os.close(ready_w)
            os.read(ready_r, 1)
            mapping = f"0 0 1\n{sandbox_uid} {HOST_NOBODY} 1\n"
            for name in ("uid_map", "gid_map"):
                with open(f"/proc/{target}/{name}", "w") as fh:
                    fh.write(mapping)
        finally:
            os._exit(0)
    os.close(ready_r)
    if libc.unshare(CLONE_NEWUSER) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER) failed")
    os.write(ready_w, b"x")
    os.close(ready_w)
    _, status = os.waitpid(helper, 0)
    if status != 0:
        raise OSError("writing the sandbox uid map failed")
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)


def describe(config: ExecutorConfig) -> Optional[str]:
    """A loud one-line warning for unsafe modes, None when isolated."""
    if config.isolation == IsolationMode.none:
        return ("WARNING: --isolation none: code runs as plain child processes of this server, with its "
                "network, files and user. Use only on a throwaway machine.")
    return None
