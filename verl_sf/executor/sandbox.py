"""Starting one sandbox: a user namespace, bubblewrap, then the zygote inside.

The process tree: server -> bwrap (PID 1 of the sandbox's PID namespace) -> zygote -> one child
per run or session.  bubblewrap builds the filesystem view: read-only system directories, a
minimal /etc (what runtimes read, plus synthetic identity files), the runtime and toolchain
directories (staged by the server, as root, at a path the sandbox's unprivileged root may
traverse, in a mount namespace of the sandbox's own: nothing inside ever traverses /root),
nothing of /home, the host /tmp or the server's files; and the network (none: not even the
host's 127.0.0.1), IPC and UTS namespaces.  The zygote then gives each run its own PID and
mount namespaces, tmpfs directories, cgroup, uid and seccomp filter (see zygote.py).

Before bwrap starts, the server puts it in a user namespace whose maps it writes itself.  As
root: uid 0 inside maps to an unprivileged host uid (`host_uid_base`) and the run uid to another,
so no process of a sandbox is host root.  As an ordinary user (unprivileged user namespaces):
the user's own uid is the only one mapped; runs keep that uid without any capability.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import shutil
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Optional

from verl_sf.executor import zygote
from verl_sf.executor.cgroups import SandboxCgroup, join_cgroups
from verl_sf.executor.config import CELLS, STDLIB_PRELOAD, ExecutorConfig
from verl_sf.executor.gpus import GpuView
from verl_sf.executor.languages import STANDARD_DIRS, Toolchains
from verl_sf.executor.rungs import Rung, landlock_abi, libseccomp_path
from verl_sf.executor.state_dir import StateDir
from verl_sf.executor.system_view import ETC_ENTRIES, SECCOMP_DENIED_SOCKETS, SECCOMP_SELF_ONLY
from verl_sf.executor.zygote.linux import CLONE_NEWNS, CLONE_NEWUSER, MS_BIND, MS_NODEV, MS_NOSUID, MS_PRIVATE, MS_REC
from verl_sf.executor.zygote.linux import libc as _libc
from verl_sf.executor.zygote.messages import LandlockConfig, ZygoteConfig

STAGE_DIR = "/tmp/verl-sf-stage"
SANDBOX_WORKDIR = "/workdir"
SANDBOX_TMP = "/tmp"
SANDBOX_DATA = "/mnt"  # writable anywhere below, as in Sandbox Fusion; /mnt/data is made in every run
SANDBOX_DATA_DIRS = ("/mnt/data",)
E2B_HOME = "/home/user"
# Without a mount namespace /etc cannot be synthetic: these host entries are read as they are.
LANDLOCK_HOST_ETC = ("passwd", "group", "hosts", "nsswitch.conf", "host.conf", "hostname",
                     "profile", "profile.d")  # what `bash -l` (E2B's commands) reads
ENV_PASSTHROUGH_PREFIXES = ("OPENBLAS_", "OMP_", "MKL_", "LANG", "LC_", "TZ")
ZYGOTE_PACKAGE = os.path.dirname(zygote.__file__)
ZYGOTE_MOUNT = "/verl-sf/zygote"  # where the sandbox sees the zygote package, read-only
# Imports the package from the directory above it, then runs it.  argv: the descriptor its configuration is
# read from (never argv itself, which every run's /proc/1/cmdline shows), then that directory.
ZYGOTE_BOOTSTRAP = ("import sys; sys.path.insert(0, sys.argv[2]); from zygote.main import main; "
                    "main(int(sys.argv[1]), sys.argv[2])")


def sandbox_env(config: ExecutorConfig, toolchains: Toolchains, gpu: Optional[GpuView] = None) -> dict[str, str]:
    """The whole environment code sees: nothing of the server's (API keys live there); in a GPU's
    sandbox also which GPU CUDA uses and where the driver's libraries are."""
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
        "MPLBACKEND": "Agg",
        **toolchains.env(),
    }
    for key, value in os.environ.items():
        if key.startswith(ENV_PASSTHROUGH_PREFIXES) and key not in env:
            env[key] = value
    if gpu is not None:
        env.update(gpu.env)
        if gpu.library_path:  # a driver outside the loader's cache (e.g. /usr/local/nvidia/lib64) is found
            env["LD_LIBRARY_PATH"] = ":".join(gpu.library_path)
    return env


def _runtime_dirs(python: str) -> list[str]:
    """Directories holding the runtime interpreter and its packages (venv and base install)."""
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.dirname(os.path.realpath(python)))}
    if python != sys.executable:
        dirs.add(os.path.dirname(os.path.dirname(python)))
    return sorted(d for d in dirs if not d.startswith("/usr"))


def _reachable_by_others(directory: str) -> bool:
    """May a uid other than the owner traverse every parent of `directory` and list it?"""
    try:
        if (os.stat(directory).st_mode & 0o005) != 0o005:
            return False
        return all(os.stat(parent).st_mode & 0o001 for parent in _ancestors(directory + "/x"))
    except OSError:
        return False


def _ancestors(path: str) -> list[str]:
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


class SandboxLauncher:
    """Builds the argv for a sandbox and spawns it; one per executor."""

    def __init__(self, config: ExecutorConfig, toolchains: Toolchains, extra_etc: tuple[str, ...], rung: Rung,
                 gpu: Optional[GpuView] = None):
        self.config = config
        self.toolchains = toolchains
        self.rung = rung
        self.gpu = gpu
        self.isolated = rung.isolated
        self.single_uid = os.geteuid() != 0 or not self.isolated
        self.env = sandbox_env(config, toolchains, gpu)
        self.extra_etc = extra_etc
        self._state = StateDir()
        self._etc_dir = os.path.join(self._state.path, "etc")
        if self.isolated:
            self._build_etc()
        # As root, every directory bwrap binds is staged in a private tmpfs (see _stage) that the
        # sandbox's unprivileged root can traverse, wherever the runtime and $TMPDIR live.
        staging = self.isolated and not self.single_uid
        self._staged = {d: (f"{STAGE_DIR}/bind{i}" if staging else d)
                        for i, d in enumerate([self._etc_dir, ZYGOTE_PACKAGE, *self.bound_dirs()])
                        } if self.isolated else {}

    def run_uid_range(self) -> tuple[int, int]:
        """(first, count) of the uids runs get one of each on the landlock rung; count 0: they keep
        ours (without CAP_SETUID)."""
        return self.rung.run_uids(self.config.host_uid_base)

    def uid_status(self) -> dict[str, str]:
        """Whose uid runs have, for /health (and, for runs of uids of their own, what they cannot reach)."""
        first, count = self.run_uid_range()
        if count:
            status = {"uid": f"a host uid of its own per run ({first}-{first + count - 1})"}
            unreachable = self.unreachable_dirs()
            if unreachable:
                status["unreachable"] = (f"{', '.join(unreachable)}: out of the runs' uids' reach (a parent "
                                         "directory another uid cannot traverse); move it, or chmod o+x the parent")
            return status
        if not self.isolated:
            return {"uid": "the server's own uid, no capabilities; Landlock scopes signals and tracing to the run"}
        return {"uid": "the server's own uid, no capabilities (single-uid user namespace)" if self.single_uid else
                       f"host uid {self.config.host_uid_base + self.config.sandbox_uid}, not root"}

    def unreachable_dirs(self) -> list[str]:
        """Runtime and toolchain directories a run's own uid could not traverse to (or list), as under
        a 0700 /root: what lives there is out of the runs' reach on the landlock rung."""
        return [d for d in self.bound_dirs() if os.path.isdir(d) and not _reachable_by_others(d)]

    @property
    def run_uid(self) -> int:
        """The uid code runs as inside (0 of the namespace, without capabilities, when only one uid is mapped)."""
        return 0 if self.single_uid else self.config.sandbox_uid

    def host_uids(self) -> tuple[int, int]:
        """(host uid of the sandbox's root, host uid of its runs)."""
        if self.single_uid:
            return os.geteuid(), os.geteuid()
        base = self.config.host_uid_base
        return base, base + self.config.sandbox_uid

    def _build_etc(self) -> None:
        """The sandbox's /etc, built once per server as a copy (one bind mount instead of one per
        entry, which every run's mount namespace would copy and tear down): the world-readable
        entries runtimes read, and synthetic identity files.  Nothing added to the host's /etc
        later shows inside."""
        os.mkdir(self._etc_dir, 0o755)
        entries = [os.path.relpath(os.path.normpath(os.path.join("/etc", e)), "/etc")
                   for e in ETC_ENTRIES + self.extra_etc]
        for entry in dict.fromkeys(e for e in entries if not e.startswith("..")):
            target = os.path.join(self._etc_dir, entry)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            _copy_readable(os.path.join("/etc", entry), target)
        uid = self.config.sandbox_uid
        identity = {
            # getpwuid() must work inside (Python's getpass, javac), without showing host accounts.
            "passwd": "root:x:0:0:root:/nonexistent:/usr/sbin/nologin\n"
                      f"sandbox:x:{uid}:{uid}:sandbox:{SANDBOX_WORKDIR}:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
            "group": f"root:x:0:\nsandbox:x:{uid}:\nnogroup:x:65534:\n",
            "hosts": "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n",
            "hostname": "sandbox\n",
            "resolv.conf": "# no network in the sandbox\n",
            "nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files\nnetworks: files\n"
                             "protocols: files\nservices: files\n",
        }
        for name, text in identity.items():
            path = os.path.join(self._etc_dir, name)
            Path(path).write_text(text)
            os.chmod(path, 0o644)

    def heavy_preload(self, flavor: str) -> list[str]:
        """A flavor is `stdlib` (the standard library only), one preloaded library by name, or `full` (all of
        them); each has a twin for cells (`CELLS` appended) that preloads the same."""
        flavor = flavor.removesuffix(CELLS)
        if flavor == "stdlib":
            return []
        if flavor == "full":
            return list(self.config.preload)
        if flavor not in self.config.preload:
            raise ValueError(f"unknown interpreter flavor {flavor!r}")
        return [flavor]

    def zygote_config(self, name: str, flavor: str, cgroup_fds: dict[str, int],
                      cgroup: Optional[SandboxCgroup]) -> ZygoteConfig:
        cfg = self.config
        if self.isolated:
            workdir, tmpdir, datadir = SANDBOX_WORKDIR, SANDBOX_TMP, SANDBOX_DATA
        else:
            workdir = os.path.join(self._state.path, name)
            tmpdir = datadir = workdir
        return {
            "isolated": self.isolated,
            "landlock": self._landlock() if self.rung.landlocked else None,
            "run_uids": list(self.run_uid_range()),
            "single_uid": self.single_uid,
            "workdir": workdir,
            "home_alias": E2B_HOME if self.isolated else "",
            "tmpdir": tmpdir,
            "datadir": datadir,
            "premade": list(SANDBOX_DATA_DIRS) if self.isolated else [],
            "sizes": {workdir: cfg.workdir_size_mb << 20, tmpdir: cfg.tmp_size_mb << 20,
                      datadir: cfg.workdir_size_mb << 20},
            "keep": ({d: self.kept_entries(d) for d in (SANDBOX_TMP, SANDBOX_WORKDIR, SANDBOX_DATA)}
                     if self.isolated else {}),
            "uid": cfg.sandbox_uid,
            "gid": cfg.sandbox_uid,
            "env": self.env if self.isolated else {**self.env, "HOME": workdir, "TMPDIR": workdir},
            "preload": list(STDLIB_PRELOAD) + self.heavy_preload(flavor),
            "ipython": flavor.endswith(CELLS),
            "fetch_limit": cfg.fetch_file_limit_bytes,
            "cgroups": cgroup_fds,
            "cgroup_v2": bool(cgroup and cgroup.v2),
            "cpu_counter": cgroup.cpu_counter if cgroup else "",
            "group_prefix": cgroup.prefix if cgroup else "",
            "seccomp": self.rung.seccomp_denied(memory_cgroup=bool(cgroup and "memory" in cgroup.dirs)),
            "seccomp_sockets": [list(pair) for pair in SECCOMP_DENIED_SOCKETS] if self.isolated else [],
            "seccomp_self_only": {call: [[list(pair) for pair in refusal] for refusal in refusals]
                                  for call, refusals in SECCOMP_SELF_ONLY.items()},
            "libseccomp": libseccomp_path() or "" if self.rung.confined else "",
            "demote_after": cfg.cpu_slice_s,
        }

    def _landlock(self) -> LandlockConfig:
        """What a run may read (and execute) on the landlock rung: the system, the runtimes, the
        /etc entries runtimes read; nothing of homes, the server's files or other runs."""
        system = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/proc"]
        etc = [os.path.join("/etc", e) for e in (*ETC_ENTRIES, *self.extra_etc, *LANDLOCK_HOST_ETC)]
        return {"abi": landlock_abi(), "read": [*system, *etc, *self.bound_dirs()],
                "devices": ["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom",
                            *(self.gpu.nodes if self.gpu else ())]}

    def bound_dirs(self) -> list[str]:
        """Read-only directories beyond the system's: the runtime, toolchains, and a GPU sandbox's
        driver libraries where they live outside /usr and /lib."""
        gpu_dirs = [d for d in (self.gpu.library_dirs if self.gpu else ()) if not d.startswith(STANDARD_DIRS)]
        return list(dict.fromkeys(_runtime_dirs(self.config.python) + list(self.toolchains.extra_dirs) + gpu_dirs))

    def kept_entries(self, directory: str) -> list[str]:
        """Top entries of a per-run mount point that lead to bound runtime dirs: bound again in every run."""
        prefix = directory.rstrip("/") + "/"
        return sorted({d[len(prefix):].split("/")[0] for d in self.bound_dirs() if d.startswith(prefix)})

    def command(self, name: str, flavor: str, cgroup_fds: dict[str, int], cgroup: Optional[SandboxCgroup],
                config_fd: int) -> list[str]:
        """The sandbox's argv; `cgroup_fds` are descriptors of its delegated cgroups (`cgroup`'s, controller
        -> fd), which the caller passes to the process: the zygote makes run groups through them.  Its
        configuration is written to `config_fd` (a memfd the caller passes too), where it reads it."""
        config = self.zygote_config(name, flavor, cgroup_fds, cgroup)
        os.write(config_fd, json.dumps(config).encode())
        os.lseek(config_fd, 0, os.SEEK_SET)
        if not self.isolated:
            os.makedirs(os.path.join(self._state.path, name), exist_ok=True)
            return [self.config.python, "-I", "-c", ZYGOTE_BOOTSTRAP, str(config_fd), os.path.dirname(ZYGOTE_PACKAGE)]
        return self._bwrap_args() + ["--", self.config.python, "-I", "-c", ZYGOTE_BOOTSTRAP, str(config_fd),
                                     os.path.dirname(ZYGOTE_MOUNT)]

    def _bwrap_args(self) -> list[str]:
        cfg = self.config
        args = ["bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                "--hostname", "sandbox", "--die-with-parent", "--new-session", "--cap-add", "ALL"]
        for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
            if os.path.islink(top):
                args += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                args += ["--ro-bind", top, top]
        args += ["--ro-bind", "/usr", "/usr", "--ro-bind", self._staged[self._etc_dir], "/etc"]
        # The tmpfs mounts come first: a runtime that lives under /tmp (a CI checkout, say) is then
        # bound on top of them; each run mounts its own tmpfs there and binds the runtime again.
        args += ["--proc", "/proc", "--dev", "/dev",
                 "--size", str(cfg.tmp_size_mb << 20), "--perms", "1777", "--tmpfs", SANDBOX_TMP,
                 "--size", str(cfg.workdir_size_mb << 20), "--perms", "0755", "--tmpfs", SANDBOX_WORKDIR,
                 "--dir", SANDBOX_DATA]
        args += gpu_device_args(self.gpu)
        args += ["--ro-bind", self._staged[ZYGOTE_PACKAGE], ZYGOTE_MOUNT]
        for extra, staged in self._staged.items():
            if extra in (self._etc_dir, ZYGOTE_PACKAGE):
                continue
            # Parents such as /root are made traverse-only: the runtime is reachable, nothing else is listed.
            for parent in _ancestors(extra):
                if parent not in (SANDBOX_TMP, SANDBOX_WORKDIR):
                    args += ["--perms", "0711", "--dir", parent]
            args += ["--ro-bind", staged, extra]
        # E2B's working directory is /home/user: each job binds its own working directory there too.
        args += ["--perms", "0755", "--dir", os.path.dirname(E2B_HOME), "--perms", "0755", "--dir", E2B_HOME,
                 "--chdir", SANDBOX_WORKDIR]
        return args

    def preexec(self, procs_files: list[str]) -> Callable[[], None]:
        """Runs in the forked child before exec: join the sandbox's cgroups, enter the user namespace."""
        isolated = self.isolated
        single = self.single_uid
        root_uid, run_uid = self.host_uids()
        inner_uid = self.config.sandbox_uid
        staged = {d: s for d, s in self._staged.items() if d != s}

        def _preexec() -> None:
            step = "joining its cgroups"
            try:
                if procs_files:
                    join_cgroups(procs_files)
                if not isolated:
                    os.setsid()
                elif single:
                    step = "entering a user namespace"
                    _enter_own_user_namespace()
                else:
                    step = "staging its directories"
                    _stage(staged)
                    step = "entering its mapped user namespace"
                    _enter_mapped_user_namespace(root_uid, inner_uid, run_uid)
            except BaseException as exc:
                # subprocess reports only "Exception occurred in preexec_fn": say which step failed and why.
                os.write(2, f"verl-sf: a sandbox could not start: {step} failed: {exc!r}\n".encode())
                raise

        return _preexec

    def close(self) -> None:
        self._state.close()


def gpu_device_args(gpu: Optional[GpuView]) -> list[str]:
    """bwrap's binds of one GPU's device nodes over its minimal /dev (every run's mount namespace
    then makes them read-only: ioctl and mmap on them still work, as on /dev/null)."""
    args: list[str] = []
    for node in gpu.nodes if gpu else ():
        args += ["--dev-bind", node, node]
    return args


def _unshare(flag: int, what: str) -> None:
    if _libc.unshare(flag) != 0:
        raise OSError(ctypes.get_errno(), f"unshare({what}) failed")


def _stage(staged: dict[str, str]) -> None:
    """In a mount namespace of the sandbox's own, still as host root: a fresh tmpfs on /tmp (the
    sandbox never sees the host's /tmp) holding, bound from descriptors opened before it hid
    anything, every directory bwrap binds.  The sandbox's root is an unprivileged host uid that
    could not traverse e.g. /root or a private $TMPDIR to reach them."""
    _unshare(CLONE_NEWNS, "CLONE_NEWNS")
    _mount(None, "/", None, MS_REC | MS_PRIVATE, None)
    sources = {target: os.open(directory, os.O_PATH | os.O_DIRECTORY) for directory, target in staged.items()}
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
    os.mkdir(STAGE_DIR, 0o755)
    for target, fd in sources.items():
        os.mkdir(target, 0o755)
        _mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC, None)
        os.close(fd)


def _mount(source: Optional[str], target: str, fstype: Optional[str], flags: int, options: Optional[str]) -> None:
    def encode(value: Optional[str]) -> Optional[bytes]:
        return None if value is None else value.encode()

    if _libc.mount(encode(source), encode(target), encode(fstype), flags, encode(options)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def _enter_own_user_namespace() -> None:
    """Without root: a namespace whose uid 0 is this user, the only uid mapped."""
    uid, gid = os.geteuid(), os.getegid()
    _unshare(CLONE_NEWUSER, "CLONE_NEWUSER")
    with open("/proc/self/setgroups", "w") as fh:
        fh.write("deny")
    for name, host in (("uid_map", uid), ("gid_map", gid)):
        with open(f"/proc/self/{name}", "w") as fh:
            fh.write(f"0 {host} 1\n")


def _enter_mapped_user_namespace(root_host_uid: int, run_uid: int, run_host_uid: int) -> None:
    """As root: unshare(CLONE_NEWUSER), then have a still-privileged helper write a two-entry map
    in which neither entry is host root.

    A process may only map its own uid into a namespace it creates; mapping others takes
    CAP_SETUID in the parent namespace, which the forked helper still has.  Then we become
    uid 0 of the new namespace, with its capabilities (and none on the host).
    """
    ready_r, ready_w = os.pipe()
    target = os.getpid()
    helper = os.fork()
    if helper == 0:
        try:
            os.close(ready_w)
            os.read(ready_r, 1)
            mapping = f"0 {root_host_uid} 1\n{run_uid} {run_host_uid} 1\n"
            for name in ("uid_map", "gid_map"):
                with open(f"/proc/{target}/{name}", "w") as fh:
                    fh.write(mapping)
        finally:
            os._exit(0)
    os.close(ready_r)
    _unshare(CLONE_NEWUSER, "CLONE_NEWUSER")
    os.write(ready_w, b"x")
    os.close(ready_w)
    _, status = os.waitpid(helper, 0)
    if status != 0:
        raise OSError("writing the sandbox uid map failed")
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)
    os.setgroups([])


def _copy_readable(source: str, target: str) -> None:
    """Copy what anyone may read of `source` (a file, a symlink as a symlink, or a directory tree)."""
    if os.path.lexists(target):
        return
    if os.path.islink(source):
        os.symlink(os.readlink(source), target)
        return
    try:
        mode = os.stat(source).st_mode
    except OSError:
        return
    if not mode & 0o004:
        return  # e.g. /etc/ssl/private: never into a sandbox
    if stat.S_ISDIR(mode):
        os.mkdir(target, 0o755)
        for entry in sorted(os.listdir(source)):
            _copy_readable(os.path.join(source, entry), os.path.join(target, entry))
    elif stat.S_ISREG(mode):
        shutil.copyfile(source, target)
        os.chmod(target, 0o644)
