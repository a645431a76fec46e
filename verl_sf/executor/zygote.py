"""The warm interpreter that runs inside one sandbox slot and forks a child per run.

This file is executed as a standalone script (`python -I -c <source>`) inside the
bubblewrap sandbox, so it imports only the standard library and never the `verl_sf`
package: the sandbox does not see the server's files.  It never runs user code itself;
every run gets a fresh child forked from this pristine, pre-imported interpreter, so
Python state cannot leak from one run to the next and no per-run interpreter start or
library import is paid.

Per run (isolated mode) the child gets: a new PID namespace (it is PID 1 there, so every
process it starts dies with it), a new mount namespace with its own /proc, the slot's
size-capped /workdir and /tmp (wiped by this process after every job), a non-root uid with
no capabilities and no_new_privs, and rlimits.  Network, IPC and UTS namespaces, the
read-only filesystem view and the scrubbed environment come from the slot's bubblewrap.

Protocol: requests on fd 0, replies on fd 1, one per line.  A request line is two JSON
texts joined by a tab (JSON never holds a raw tab): first the fields this process needs to
supervise the run (SUPERVISED_KEYS), then the whole request, which goes to the run's child
unread; a reply is one JSON object.
"""

import _thread
import ast
import atexit
import base64
import contextlib
import ctypes
import gc
import io
import json
import linecache
import os
import resource
import select
import shutil
import signal
import sys
import time
import traceback
import types

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8
PR_SET_NO_NEW_PRIVS = 38
PR_SET_NAME = 15
READY_NAME = b"verl-sf-ready"  # what `ps` shows for a child waiting for its job
PR_CAPBSET_DROP = 24
MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25
READ_CHUNK = 1 << 16
SUPERVISED_KEYS = ("mode", "timeout", "output_limit", "fetch_files", "last")
TRUNCATION_MARKER = "\n[verl-sf: output truncated, {dropped} more bytes not shown]\n"

# First calls into these libraries import submodules and fill caches (sympy's first solve
# takes ~120 ms, later ones ~10 ms); doing them once here spares every forked run.
WARMUPS = {
    "sympy": "import sympy as sp\nx, y = sp.symbols('x y')\nsp.solve(x**2 - 4, x)\nsp.simplify(sp.sin(x)**2 + sp.cos(x)**2)\n"
             "sp.factor(x**2 - y**2)\nsp.integrate(x**2, x)\nsp.diff(sp.exp(x) * x, x)\nsp.Rational(1, 3) + 1\n"
             "sp.sqrt(8)\nsp.N(sp.pi, 10)\nsp.Matrix([[1, 2], [3, 4]]).det()\nsp.limit(sp.sin(x) / x, x, 0)\n",
    "numpy": "import numpy as np\na = np.arange(10)\na.sum(); a.mean(); np.linalg.inv(np.eye(3)); np.random.default_rng(0).random(3)\n",
    "scipy": "import scipy.optimize, scipy.special, scipy.stats, scipy.integrate, scipy.linalg\n",
}

# Generators that libraries seed once, at import: every run forked from the warm interpreter
# would replay the same numbers (np.random.rand() alike in every run), where a fresh
# `python main.py` draws new ones.  Before forking each run the zygote calls `seed()` (no
# argument: fresh OS entropy) of those it holds: numpy's legacy global RandomState, sympy's own
# random.Random instances.  Here, with no run alive, that costs a fraction of what it costs in
# the child, where every page it touches first is a copy-on-write fault (~0.5 ms per numpy
# run).  The stdlib's `random` reseeds itself after a fork.
RESEEDED_MODULES = ("numpy.random", "sympy.core.random")

# JSON goes through the C scanner and encoder directly.  json.loads and json.dumps walk Python
# frames and objects before reaching them, and in a process forked a moment ago every object
# touched is a page to copy: ~30 copy-on-write faults per call, in the zygote and in every run
# (a forked parent's json.loads of a request head: 45 faults over the baseline, scan_once: 17).
_scan_json = json.JSONDecoder().scan_once
_encode_json = json.encoder.c_make_encoder(None, None, json.encoder.encode_basestring_ascii, None, ":", ",",
                                           False, False, True)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
# Each function is looked up (dlsym) and cached on `_libc` at its first use; `mount` is first
# used in a run, so every run looked it up anew and paid ~50 copy-on-write faults for it.
for _name in ("capget", "capset", "mount", "prctl", "setns", "unshare"):
    getattr(_libc, _name)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _check(result, what):
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _shrink_capabilities():
    """Empty the bounding and inheritable sets for good, keeping the effective ones the zygote
    needs (namespaces, mounts, uid changes).  Children inherit this, so an exec can never
    regain a capability, and each run only has to change uid."""
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break
    header = _CapHeader(0x20080522, 0)
    data = (_CapData * 2)()
    _check(_libc.capget(ctypes.byref(header), data), "capget")
    for half in data:
        half.inheritable = 0
    _check(_libc.capset(ctypes.byref(header), data), "capset")


class Zygote:
    def __init__(self, config):
        self.cfg = config
        self.isolated = config["isolated"]
        self.workdir = config["workdir"]
        self.tmpdir = config["tmpdir"]
        self.uid = config["uid"]
        self.gid = config["gid"]
        self.env = config["env"]
        with open("/proc/self/comm", "rb") as comm:
            self.comm = comm.read().strip()  # a run's name, as `python main.py` would show it
        self.pidns_fd = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC) if self.isolated else -1
        # Protocol fds move out of 0/1 so children can take those numbers for their stdio.
        self.req_fd = os.dup(0)
        self.rep = os.fdopen(os.dup(1), "wb", buffering=0)
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        os.close(devnull)
        # Children inherit the environment, so it is set once here rather than in every run.
        os.environ.clear()
        os.environ.update(self.env)
        if self.isolated:
            _shrink_capabilities()
        # The runs' streams become this process's own, once: a child that installed them would
        # free the old ones and pay ~40 copy-on-write faults for it (0.16 ms per run).  Ours go
        # nowhere anyway (fds 0 and 1 are /dev/null; 2 is the sandbox's stderr).
        _install_stdio(_stdio_for_runs())  # before the preload, whose gc.freeze() then covers it
        self._preload(config.get("preload", []))
        self.ready_child = None
        self.unreaped = None
        self._prepare_dirs()
        self.cwd = os.path.realpath(self.workdir)  # what os.getcwd() gives a run
        sys.argv = ["main.py"]  # as `python main.py` has it; set here, a run need not free ours

    # ---- start-up --------------------------------------------------------------------
    def _preload(self, modules):
        loaded = []
        with _threading_stand_in():
            for name in modules:
                try:
                    __import__(name)
                    loaded.append(name)
                except Exception:  # a missing optional library just is not preloaded
                    pass
            for name in loaded:
                try:
                    exec(WARMUPS.get(name, ""), {})
                except Exception:  # a warm-up is only an optimisation
                    pass
        gc.collect()
        gc.freeze()  # keeps the collector from dirtying shared pages in every child
        self._collapse_heap()

    @staticmethod
    def _collapse_heap():
        """Back the imported heap with huge pages: fork then copies ~500x fewer page-table entries."""
        huge = 1 << 21
        try:
            with open("/proc/self/maps") as maps:
                regions = [line.split() for line in maps]
        except OSError:
            return
        for parts in regions:
            perms = parts[1]
            path = parts[5] if len(parts) > 5 else ""
            if "w" not in perms or "p" not in perms or path not in ("", "[heap]"):
                continue
            start, end = (int(x, 16) for x in parts[0].split("-"))
            start = (start + huge - 1) & ~(huge - 1)
            end &= ~(huge - 1)
            if end > start:
                _libc.madvise(start, end - start, MADV_HUGEPAGE)
                _libc.madvise(start, end - start, MADV_COLLAPSE)

    def _prepare_dirs(self):
        for path in (self.workdir, self.tmpdir):
            os.makedirs(path, exist_ok=True)
            if self.isolated:
                os.chown(path, self.uid, self.gid)
                os.chmod(path, 0o1777 if path == self.tmpdir else 0o755)

    # ---- main loop -------------------------------------------------------------------
    def serve(self):
        self.prepare()
        self._reply({"ready": True, "pid": os.getpid()})
        while True:
            line = self._read_request()
            if line is None:
                return
            # The ready child gets the request before we parse our part of it: the run's path
            # does not wait for us, and we never parse its code or files.
            head, _, job = line.partition(b"\t")
            started = time.monotonic()
            child = self._hand_over(job)
            request = _loads(head.decode())
            try:
                reply = self.handle(request, child, started)
            except Exception as exc:  # a bug here must not take the slot down silently
                reply = {"status": "Error", "stderr": f"verl-sf zygote error: {exc!r}\n{traceback.format_exc()}",
                         "stdout": "", "return_code": None, "execution_time": 0.0}
            self._reply(reply)
            # Clean-up is off the answer's path, but always before the next job is read.
            self.reap()
            if request.get("last", True):
                self._wipe()
            self.prepare()

    def _read_request(self):
        """One request line, or None once the server is gone.  The server sends a request only
        after the reply to the last one, so whole reads never take in part of the next (a raw
        file's readline would cost a system call per byte)."""
        chunks = []
        while True:
            chunk = os.read(self.req_fd, READ_CHUNK)
            if not chunk:
                return None
            chunks.append(chunk)
            if chunk.endswith(b"\n"):
                return b"".join(chunks)

    def _reply(self, obj):
        self.rep.write(_dumps(obj) + b"\n")

    def handle(self, req, child, started):
        if req["mode"] == "wipe":
            for fd in child[1:]:  # its pipes; it exits on its own (nothing to run) and is reaped as usual
                os.close(fd)
            return {"status": "Finished"}  # the serve loop wipes after every job marked last
        result = self.run(req, child, started)
        if req.get("fetch_files") is not None:
            result["files"] = self._fetch_files(req["fetch_files"])
        return result

    # ---- files -----------------------------------------------------------------------
    def _fetch_files(self, paths):
        fetched = {}
        limit = self.cfg["fetch_limit"]
        for rel in paths:
            try:
                path = _resolve(self.workdir, rel)
                # O_NOFOLLOW: a symlink left by the run must not make us read outside /workdir.
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
                with os.fdopen(fd, "rb") as fh:
                    data = fh.read(limit + 1)
                if len(data) <= limit:
                    fetched[rel] = base64.b64encode(data).decode()
            except (OSError, ValueError):
                continue  # Sandbox Fusion leaves missing files out of the answer
        return fetched

    def _wipe(self):
        for base in (self.workdir, self.tmpdir):
            keep = set(self.cfg.get("keep", {}).get(base, ()))  # paths leading to the bound runtime
            try:
                entries = [e for e in os.scandir(base) if e.name not in keep]
            except OSError:
                continue
            for entry in entries:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path, ignore_errors=True)
                    else:
                        os.unlink(entry.path)
                except OSError:
                    pass

    # ---- one run ---------------------------------------------------------------------
    def prepare(self):
        """Fork the next run's child ahead of time, namespaces and all, so a request only pays
        for handing it the job.  It waits on a pipe; the zygote closing that pipe ends it."""
        if self.ready_child is not None:
            return
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        meta_r, meta_w = os.pipe()
        job_r, job_w = os.pipe()
        _reseed_generators()
        if self.isolated:
            # The child becomes PID 1 of a brand-new PID namespace.
            _check(_libc.setns(self.pidns_fd, CLONE_NEWPID), "setns")
            _check(_libc.unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")
        pid = os.fork()
        if pid == 0:
            try:
                for fd in (out_r, err_r, meta_r, job_w, self.req_fd, self.rep.fileno()):
                    os.close(fd)
                self._child(job_r, out_w, err_w, meta_w)
            except BaseException:
                try:
                    os.write(2, f"verl-sf: run setup failed: {traceback.format_exc()}".encode())
                finally:
                    os._exit(126)
        for fd in (out_w, err_w, meta_w, job_r):
            os.close(fd)
        self.ready_child = (pid, out_r, err_r, meta_r, job_w)

    def _hand_over(self, line):
        """Give the ready child the request; it reads to the end of the pipe."""
        self.prepare()  # normally done already, after the last run
        pid, out_r, err_r, meta_r, job_w = self.ready_child
        self.ready_child = None
        view = memoryview(line)
        try:
            while view:
                view = view[os.write(job_w, view):]
        except BrokenPipeError:
            pass  # the child died before its job (e.g. killed from outside): reported when supervised
        os.close(job_w)
        self.unreaped = pid  # whatever happens next, the serve loop collects it after replying
        return pid, out_r, err_r, meta_r

    def run(self, req, child, started):
        pid, out_r, err_r, meta_r = child
        status, code, out, err, records, dropped, cpu_time = self._supervise(pid, out_r, err_r, meta_r, req, started)
        result = {
            "status": status,
            "return_code": code,
            "execution_time": time.monotonic() - started,
            "cpu_time": cpu_time,
            "stdout": out,
            "stderr": err,
            "truncated": dropped > 0,
        }
        if req["mode"] == "jupyter":
            result["cells"] = [r for r in records if "done" not in r]
        return result

    def reap(self):
        """Collect the last run's PID 1 (the kernel has killed everything else in its namespace)."""
        if self.unreaped is None:
            return
        pid, self.unreaped = self.unreaped, None
        self._kill(pid)
        os.waitpid(pid, 0)

    def _supervise(self, pid, out_r, err_r, meta_r, req, started):
        """Watch the run; whatever happens, its pipes and pidfd are not left open in the zygote."""
        open_fds = {out_r, err_r, meta_r}  # _watch closes each at its end of file
        pidfd = os.pidfd_open(pid)
        try:
            return self._watch(pid, pidfd, open_fds, out_r, err_r, meta_r, req, started)
        finally:
            for fd in open_fds:
                os.close(fd)
            os.close(pidfd)

    def _watch(self, pid, pidfd, open_fds, out_r, err_r, meta_r, req, started):
        """Drain output while the run goes on (a full pipe must never stall it) and enforce the deadline."""
        limit = req["output_limit"]
        deadline = started + req["timeout"]
        buffers = {out_r: bytearray(), err_r: bytearray()}
        meta = bytearray()
        dropped = 0
        poller = select.poll()
        for fd in (out_r, err_r, meta_r):
            poller.register(fd, select.POLLIN)
        poller.register(pidfd, select.POLLIN)
        exited = False
        exit_time = 0.0
        timed_out = False
        while open_fds:
            now = time.monotonic()
            if exited:
                # The run (and with it its PID namespace) is gone: drain what is left, briefly.
                wait_ms = max(0, int((min(deadline, exit_time + 1.0) - now) * 1000))
            else:
                wait_ms = max(0, int((deadline - now) * 1000))
            events = poller.poll(wait_ms)
            if not events:
                if exited:
                    break
                timed_out = True
                self._kill(pid)
                exited, exit_time = True, time.monotonic()
                deadline = exit_time + 1.0
                continue
            for fd, _ in events:
                if fd == pidfd:
                    if not exited:
                        exited, exit_time = True, time.monotonic()
                        if not self.isolated:
                            self._kill(pid)  # no PID namespace: take the whole process group down
                    poller.unregister(pidfd)
                    continue
                chunk = os.read(fd, READ_CHUNK)
                if not chunk:
                    poller.unregister(fd)
                    open_fds.discard(fd)
                    os.close(fd)
                    continue
                if fd == meta_r:
                    meta += chunk
                    continue
                buf = buffers[fd]
                room = limit - len(buf)
                if room > 0:
                    buf += chunk[:room]
                dropped += max(0, len(chunk) - max(room, 0))
        records = []
        for line in meta.decode("utf-8", "replace").splitlines():
            try:
                records.append(_loads(line))
            except ValueError:
                pass  # the run may have written garbage into its inherited fd 3; it only hurts itself
        done = next((r for r in records if isinstance(r, dict) and r.get("done") is True), None)
        cpu_time = None
        if done is not None and not timed_out:
            code, cpu_time = done.get("return_code"), done.get("cpu_time")  # reaped after the answer
        else:
            if not exited:
                # Its pipes are closed (by exit or on purpose) but the run goes on: wait, within the deadline.
                remaining = max(0.0, deadline - time.monotonic())
                if not select.select([pidfd], [], [], remaining)[0]:
                    timed_out = True
                    self._kill(pid)
            _, wstatus = os.waitpid(pid, 0)
            self.unreaped = None
            code = os.waitstatus_to_exitcode(wstatus)
        status = "TimeLimitExceeded" if timed_out else "Finished"
        out = buffers[out_r].decode("utf-8", "replace")
        err = buffers[err_r].decode("utf-8", "replace")
        if dropped:
            marker = TRUNCATION_MARKER.format(dropped=dropped)
            if len(buffers[out_r]) >= limit:
                out += marker
            if len(buffers[err_r]) >= limit:
                err += marker
        return status, code, out, err, records, dropped, cpu_time

    def _kill(self, pid):
        try:
            if self.isolated:
                os.kill(pid, signal.SIGKILL)  # PID 1 of its namespace: the kernel kills the rest
            else:
                os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    # ---- inside the child ------------------------------------------------------------
    def _child(self, job_r, out_w, err_w, meta_w):
        _libc.prctl(PR_SET_NAME, READY_NAME, 0, 0, 0)
        if self.isolated:
            _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWIPC), "unshare(CLONE_NEWNS)")
            _check(_libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None), "mount /proc")
        os.setsid()
        # Everything that does not depend on the job is done while waiting for it, off the
        # request's path: the job pipe sits on fd 0 until the run's stdin replaces it.
        os.dup2(job_r, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.dup2(meta_w, 3)
        os.closerange(4, 1 << 16)
        oom = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
        os.write(oom, b"1000")  # under memory pressure the run dies, never the warm interpreter
        os.close(oom)
        os.chdir(self.workdir)
        stdin_fd = os.memfd_create("stdin", 0)
        if self.isolated:
            self._drop_privileges()  # also before the job: the files it brings belong to the run's user
        namespace = _main_namespace(self.cwd)
        req = _read_job()
        _libc.prctl(PR_SET_NAME, self.comm, 0, 0, 0)
        if req["mode"] == "wipe":
            os._exit(0)
        _write_files(self.workdir, req.get("files") or {})
        os.write(stdin_fd, (req.get("stdin") or "").encode("utf-8", "surrogateescape"))
        os.lseek(stdin_fd, 0, os.SEEK_SET)
        os.dup2(stdin_fd, 0)
        os.close(stdin_fd)
        self._limit(req)
        if req["mode"] == "exec":
            code = _exec_as_child(req["argv"], self.env)
        elif req["mode"] == "jupyter":
            code = _run_cells(req["cells"], req.get("cell_timeout") or 0, req["output_limit"], namespace)
        else:
            code = _run_python(req["code"], namespace)
        _report_done(code)
        os._exit(code & 0xFF)

    def _limit(self, req):
        cpu = int(req["timeout"]) + 2
        limits = {
            resource.RLIMIT_CPU: (cpu, cpu + 1),
            resource.RLIMIT_FSIZE: (req["fsize"], req["fsize"]),
            resource.RLIMIT_NOFILE: (req["nofile"], req["nofile"]),
            resource.RLIMIT_NPROC: (req["nproc"], req["nproc"]),
            resource.RLIMIT_CORE: (0, 0),
        }
        for which, value in limits.items():
            resource.setrlimit(which, value)

    def _drop_privileges(self):
        """Per run: the uid change clears the effective and permitted capabilities (the bounding
        and inheritable sets were emptied once in the zygote, see _shrink_capabilities)."""
        os.setgroups([])
        os.setresgid(self.gid, self.gid, self.gid)
        os.setresuid(self.uid, self.uid, self.uid)
        _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


@contextlib.contextmanager
def _threading_stand_in():
    """While the libraries load, `threading` is a module that hands out the `_thread` lock
    types `threading` itself hands out (numpy.random only takes `Lock` and `RLock` from it).

    The real module registers a fork hook that rebuilds its thread state in every forked run,
    used or not: ~0.3 ms of CPU per numpy run here (a bare fork + exit loop with numpy.random
    imported: 1.25-1.36 ms with this stand-in, 1.57-1.68 ms without, 6 of 6 rounds).  Any
    other name read from the stand-in imports the real module then and forwards to it, so a
    library that needs more still gets it (and the hook).  The stand-in leaves `sys.modules`
    afterwards: a run that imports `threading` gets the real module, as in a fresh process."""
    if "threading" in sys.modules:
        yield
        return
    stand_in = types.ModuleType("threading", "verl-sf's stand-in while libraries load (see zygote.py)")
    stand_in.Lock = getattr(_thread, "lock", _thread.allocate_lock)
    stand_in.RLock = _thread.RLock
    stand_in.__getattr__ = _real_threading_attribute
    sys.modules["threading"] = stand_in
    try:
        yield
    finally:
        if sys.modules.get("threading") is stand_in:
            del sys.modules["threading"]


def _real_threading_attribute(name):
    """Put the real `threading` in the stand-in's place and read `name` from it (dunder names,
    which tools probe on every module, are answered as missing instead)."""
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    if getattr(sys.modules.get("threading"), "__getattr__", None) is _real_threading_attribute:
        del sys.modules["threading"]
    import threading
    return getattr(threading, name)


def _loads(text):
    """json.loads for one JSON value, strictly (nothing but whitespace around it)."""
    start = len(text) - len(text.lstrip())
    try:
        value, end = _scan_json(text, start)
    except StopIteration as exc:
        raise ValueError(f"expected a JSON value at {exc.value}") from None
    if text[end:].strip():
        raise ValueError(f"extra data after the JSON value at {end}")
    return value


def _dumps(value):
    """json.dumps(value).encode(), compact: the replies and records are plain dicts."""
    return "".join(_encode_json(value, 0)).encode()


def _reseed_generators():
    for name in RESEEDED_MODULES:
        module = sys.modules.get(name)
        if module is not None:
            module.seed()


# ---- code running in the forked child (user code starts here) ---------------------------
def _resolve(workdir, rel):
    path = os.path.normpath(os.path.join(workdir, rel.lstrip("/")))
    if not (path == workdir or path.startswith(workdir + "/")):
        raise ValueError(f"path {rel!r} escapes the working directory")
    return path


def _write_files(workdir, files):
    """The request's files, written by the run itself (as its user) before its code starts.
    A file that cannot be written ends the run, as a failed `cp` would end a job script."""
    for rel, content in files.items():
        try:
            path = _resolve(workdir, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as fh:
                fh.write(base64.b64decode(content or ""))
        except (OSError, ValueError) as exc:
            os.write(2, f"verl-sf: could not write file {rel!r}: {exc}\n".encode())
            _report_done(1)
            os._exit(1)


def _read_job():
    """The job from fd 0; an empty pipe means the zygote is gone or shutting down."""
    chunks = []
    while True:
        chunk = os.read(0, READ_CHUNK)
        if not chunk:
            break
        chunks.append(chunk)
    if not chunks:
        os._exit(0)
    return _loads(b"".join(chunks).decode())


def _exec_as_child(argv, env):
    """Run a program below us, so it is not PID 1: the kernel shields PID 1 from its own
    signals, which would turn abort() into a crash and ignore `kill $$`.  We report its
    exact wait status on fd 3, since PID 1 cannot die of a signal it sends itself."""
    pid = os.fork()
    if pid == 0:
        os.close(3)
        # Python ignores SIGPIPE (a Python run keeps that, as `python main.py` does); a program
        # gets the default a shell would give it, so `yes | head` ends.
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        os.execve(argv[0], argv, env)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _report_done(code):
    """Close our stdio, then tell the zygote the run is over and how it ended.

    The zygote answers the server right away instead of waiting for the kernel to tear down
    this process and its namespaces (several ms here); it reaps us after answering.
    """
    times = os.times()
    for fd in (0, 1, 2):
        try:
            os.close(fd)
        except OSError:
            pass
    record = {"done": True, "return_code": code,
              "cpu_time": times.user + times.system + times.children_user + times.children_system}
    os.write(3, _dumps(record) + b"\n")
    os.close(3)


def _make_stdio():
    """Unbuffered text streams on fds 0-2: a killed run still shows its partial output."""
    return (io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8", errors="replace"),
            io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
                             write_through=True),
            io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
                             write_through=True))


def _stdio_for_runs():
    """The streams of every python run, built once in the zygote (a third of a millisecond per
    run otherwise).  They are built over what a run has on fds 0-2 (a memfd, then pipes), so
    they report the same seekability; each child gets its own copy of them."""
    saved = [os.dup(fd) for fd in (0, 1, 2)]
    stdin_fd = os.memfd_create("stdin", 0)
    out_r, out_w = os.pipe()
    for fd, target in ((stdin_fd, 0), (out_w, 1), (out_w, 2)):
        os.dup2(fd, target)
    try:
        return _make_stdio()
    finally:
        for fd, target in zip(saved, (0, 1, 2)):
            os.dup2(fd, target)
        for fd in (*saved, stdin_fd, out_r, out_w):
            os.close(fd)


def _install_stdio(streams):
    sys.stdin, sys.stdout, sys.stderr = streams
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = streams


def _main_namespace(cwd):
    """As `python main.py` sets them up.  The path is joined by hand: `os.path.join` alone
    costs a run ~35 copy-on-write faults (every object it touches is a page to copy)."""
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    main.__dict__["__file__"] = cwd + "/main.py"
    sys.path[0:0] = [cwd]
    return main.__dict__


def _finish(code):
    try:
        threading = sys.modules.get("threading")
        if threading is not None:  # as at interpreter exit: only a run that imported it can have threads to wait for
            threading._shutdown()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
    return code


def _exit_code(exc):
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _run_python(code, namespace):
    filename = namespace["__file__"]  # absolute, as `python main.py` shows it in tracebacks
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    try:
        exec(compile(code, filename, "exec"), namespace)
    except SystemExit as exc:
        return _finish(_exit_code(exc))
    except BaseException as exc:
        sys.stderr.write("".join(_user_traceback(exc)))
        return _finish(1)
    return _finish(0)


def _user_traceback(exc):
    """The traceback as `python main.py` would print it: without this file's frames (named "<string>")."""
    frames = [frame for frame in traceback.extract_tb(exc.__traceback__) if frame.filename != "<string>"]
    head = ["Traceback (most recent call last):\n"] + traceback.StackSummary.from_list(frames).format() if frames else []
    return head + traceback.format_exception_only(type(exc), exc)


def _run_cells(cells, cell_timeout, output_limit, namespace):
    """Cells share one namespace; each cell's output is captured apart and reported on fd 3.

    Every cell writes into a memfd standing in for fds 1 and 2 (so output of subprocesses is
    caught too); after the cell its content is read, capped, and the memfd is emptied.
    """
    captures = [os.memfd_create("cell-stdout"), os.memfd_create("cell-stderr")]
    os.dup2(captures[0], 1)
    os.dup2(captures[1], 2)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a flooding cell gets EFBIG, not death
    _install_stdio(_make_stdio())  # over the memfds: seekable, unlike a python run's pipes

    def _alarm(signum, frame):
        raise TimeoutError(f"cell exceeded cell_timeout of {cell_timeout} s")

    signal.signal(signal.SIGALRM, _alarm)

    for index, source in enumerate(cells):
        name = f"<cell-{index}>"
        linecache.cache[name] = (len(source), None, source.splitlines(True), name)
        display, error = [], []
        if cell_timeout:
            signal.setitimer(signal.ITIMER_REAL, cell_timeout)
        try:
            tree = ast.parse(source, name, "exec")
            last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
            exec(compile(tree, name, "exec"), namespace)
            if last is not None:
                value = eval(compile(ast.Expression(last.value), name, "eval"), namespace)
                if value is not None:
                    display.append({"text/plain": repr(value)})
        except BaseException as exc:  # noqa: B036 - a cell's SystemExit/KeyboardInterrupt is its own error
            error.append({"ename": type(exc).__name__, "evalue": str(exc),
                          "traceback": _user_traceback(exc)})
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        texts = []
        for stream, fd in ((sys.stdout, captures[0]), (sys.stderr, captures[1])):
            try:
                stream.flush()
            except Exception:
                pass
            size = os.fstat(fd).st_size
            data = os.pread(fd, output_limit, 0)
            text = data.decode("utf-8", "replace")
            if size > output_limit:
                text += TRUNCATION_MARKER.format(dropped=size - output_limit)
            texts.append(text)
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
        record = {"stdout": texts[0], "stderr": texts[1], "display": display, "error": error}
        os.write(3, _dumps(record) + b"\n")
    return _finish(0)


if __name__ == "__main__":
    Zygote(json.loads(sys.argv[1])).serve()
