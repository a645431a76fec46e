"""The E2B (and Daytona) sandbox's agent, run inside its python session (standard library only).

A cells interpreter imports it as it warms up (warmup.py), so every sandbox's session has it
already; a sandbox's first call is `setup`, and each later E2B call is one session call naming a
function here with its arguments as one JSON string literal (user data is never pasted into code).  Files, directories,
processes and code contexts are then handled by the sandbox's own unprivileged process, with
exactly the rights its code has.

Paths: the SDK's home, `/home/user`, is the session's working directory (bound there under that
name; on the landlock rung, where it cannot be, its paths are mapped); relative paths are
resolved there too.  Answers go back on stdout as one line after `MARK` (see `dispatch`).
"""

import base64
import builtins
import contextlib
import errno
import json
import linecache
import os
import select
import signal
import stat
import subprocess
import sys
import time
from typing import Any

from . import ipython_shell, root
from .messages import NOTE
from .trees import remove_tree

HOME_ALIAS = "/home/user"
"""E2B's home, shown for the session's own; a sandbox set up with no alias shows the real paths."""
MARK = "\x1e\x1fverl-sf-e2b:"
"""Prefix of the answer line; whatever else a call printed comes before it."""
READ_CHUNK = 1 << 16
MAX_ENTRIES = 3000  # an answer stays well under the output limit (1 MiB by default)

_home = os.getcwd()  # set again by `setup`
_contexts: dict[str, dict[str, Any]] = {}  # context id -> {"module", "state", "cwd": local path, "count"}
_processes: dict[int, dict[str, Any]] = {}  # pid -> {"popen", "pipes": {name: fd}, "config": dict}
_alias = {"home": HOME_ALIAS}


class GuestError(Exception):
    """An answer with a Connect error code (not_found, invalid_argument, ...)."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


def setup(payload):
    """Sandbox-wide environment variables and the default context (the session's `__main__`)."""
    _set_up(json.loads(payload))
    _answer({"ok": True})


def warm(payload):
    """A ready sandbox's set-up and a first cell run as an execution runs, in a context of its own
    that is dropped after: the pages every first execution writes are copied before a client waits
    for one, in one call (each call is a cell of IPython's of its own)."""
    request = json.loads(payload)
    _set_up(request)
    _execute(_new_context(_home), request["code"], {})
    _answer({"ok": True})


def _set_up(request):
    global _home
    _home = os.getcwd()  # the session's working directory (imported in the warm interpreter, elsewhere)
    if os.path.isdir(HOME_ALIAS) and os.path.samefile(HOME_ALIAS, _home):  # E2B's home is a real directory here
        os.chdir(HOME_ALIAS)
        _home = HOME_ALIAS
    _alias["home"] = request.get("home_alias", HOME_ALIAS)
    os.environ.update(request["envs"])
    os.environ.update(HOME=_home, PWD=_home)
    _contexts[request["default_context"]] = _new_context(_home)


# ---- paths -------------------------------------------------------------------------------------
def local_path(path):
    """The session's path for an E2B path: `/home/user/...` and relative paths live in the home."""
    if "\0" in path:
        raise GuestError("invalid_argument", f"path {path!r} contains a NUL character")
    alias = _alias["home"]
    if alias and (path == alias or path.startswith(alias + "/")):
        path = _home + path[len(alias):]
    elif not path.startswith("/"):
        path = os.path.join(_home, path)
    return os.path.normpath(path)


def public_path(path):
    alias = _alias["home"]
    if alias and (path == _home or path.startswith(_home + "/")):
        return alias + path[len(_home):]
    return path


def _entry(path):
    info = os.lstat(path)
    link = stat.S_ISLNK(info.st_mode)
    shown = info
    if link:
        try:
            shown = os.stat(path)
        except OSError:
            shown = info
    kind = "dir" if stat.S_ISDIR(shown.st_mode) else "file"
    entry = {"name": os.path.basename(path) or path, "type": kind, "path": public_path(path), "size": info.st_size,
             "mode": stat.S_IMODE(info.st_mode),
             "permissions": stat.filemode(info.st_mode), "owner": _user_name(info.st_uid),
             "group": _group_name(info.st_gid), "mtime_ns": info.st_mtime_ns, "is_symlink": link}
    if link:
        target = os.path.join(os.path.dirname(path), os.readlink(path))
        entry["symlink_target"] = public_path(os.path.normpath(target))
    return entry


def _user_name(uid):
    try:
        import pwd
        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return str(uid)


def _group_name(gid):
    try:
        import grp
        return grp.getgrgid(gid).gr_name
    except (ImportError, KeyError):
        return str(gid)


# ---- filesystem --------------------------------------------------------------------------------
def fs_stat(path):
    return _entry(local_path(path))


def fs_list(path, depth):
    root = local_path(path)
    if not os.path.isdir(root):
        if not os.path.lexists(root):
            raise GuestError("not_found", f"path '{path}' does not exist")
        raise GuestError("invalid_argument", f"path '{path}' is not a directory")
    entries = []
    level = [root]
    for _ in range(max(1, depth)):
        below = []
        for directory in level:
            for name in sorted(os.listdir(directory)):
                full = os.path.join(directory, name)
                entries.append(_entry(full))
                if len(entries) > MAX_ENTRIES:
                    raise GuestError("invalid_argument", f"more than {MAX_ENTRIES} entries below '{path}': list a "
                                                         "smaller directory, or with less depth")
                if os.path.isdir(full) and not os.path.islink(full):
                    below.append(full)
        level = below
    return entries


def fs_make_dir(path):
    local = local_path(path)
    if os.path.lexists(local):
        raise GuestError("already_exists", f"directory '{path}' already exists")
    os.makedirs(local)
    return _entry(local)


def fs_move(source, destination):
    src, dst = local_path(source), local_path(destination)
    parent = os.path.dirname(dst)
    if parent:
        os.makedirs(parent, exist_ok=True)
    os.rename(src, dst)
    return _entry(dst)


def fs_remove(path, recursive=True):
    local = local_path(path)
    if os.path.isdir(local) and not os.path.islink(local):
        if not recursive and os.listdir(local):
            raise GuestError("invalid_argument", f"directory '{path}' is not empty (delete it recursively)")
        remove_tree(local)
    else:
        os.unlink(local)
    return None


def fs_chmod(path, mode, owner, group):
    """Permissions only: the sandbox's one user owns its files, so another owner or group is refused."""
    local = local_path(path)
    info = os.stat(local)
    if owner and owner != _user_name(info.st_uid):
        raise GuestError("permission_denied", f"owner '{owner}': only the sandbox's own user can own files")
    if group and group != _group_name(info.st_gid):
        raise GuestError("permission_denied", f"group '{group}': only the sandbox's own group can own files")
    if mode:
        try:
            os.chmod(local, int(mode, 8))
        except ValueError:
            raise GuestError("invalid_argument", f"mode '{mode}' is not an octal number") from None
    return None


def fs_write(path, data):
    """The whole file or none of it: written beside its target and renamed over it, so a write the
    sandbox's disk or caps cut short leaves what was there (as Daytona's toolbox writes).  A symlink
    is written through, the target keeps its mode, and what is not a regular file is refused."""
    local = local_path(path)
    parent = os.path.dirname(local)
    if parent:
        os.makedirs(parent, exist_ok=True)
    target = os.path.realpath(local)
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), local)
    if mode is not None and not stat.S_ISREG(mode):
        raise GuestError("invalid_argument", f"path '{path}' is not a regular file")
    temp = os.path.join(os.path.dirname(target), ".verl-sf-upload-" + os.urandom(8).hex())
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, local) from None  # named as the caller named it
    try:
        with open(fd, "wb") as fh:
            if mode is not None:
                os.fchmod(fd, stat.S_IMODE(mode))
            fh.write(base64.b64decode(data))
        os.rename(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    return {"name": os.path.basename(local), "type": "file", "path": public_path(local)}


def fs_read(path, inline_limit):
    """Small files come back inline; larger ones are named for the server to fetch (its own cap)."""
    local = local_path(path)
    if os.path.isdir(local):
        raise GuestError("invalid_argument", f"path '{path}' is a directory")
    real = os.path.realpath(local)
    fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once, and is refused below
    with open(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise GuestError("invalid_argument", f"path '{path}' is not a regular file")
        data = fh.read(inline_limit + 1)
        size = os.fstat(fd).st_size
    if len(data) <= inline_limit:
        return {"data": base64.b64encode(data).decode()}
    # The session's fetch knows the home by its first name only: a path in it goes relative.
    return {"fetch": os.path.relpath(real, _home) if real.startswith(_home + "/") else real, "size": size}


# ---- processes ---------------------------------------------------------------------------------
def proc_start(cmd, args, envs, cwd, wait, user="user"):
    directory = local_path(cwd) if cwd else _home
    if not os.path.isdir(directory):
        raise GuestError("invalid_argument", f"cwd '{cwd}' does not exist")
    env = {**os.environ, **envs}
    popen: Any
    if user == "root":
        try:
            popen = root.RootProcess([cmd, *args], directory, env)
        except root.NotStarted as exc:
            raise GuestError(exc.code, str(exc)) from None
    else:
        popen = subprocess.Popen([cmd, *args], cwd=directory, env=env, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    assert popen.stdout is not None and popen.stderr is not None
    pipes = {"stdout": popen.stdout.fileno(), "stderr": popen.stderr.fileno()}
    for fd in pipes.values():
        os.set_blocking(fd, False)
    _processes[popen.pid] = {"popen": popen, "pipes": pipes,
                             "config": {"cmd": cmd, "args": args, "envs": envs, "cwd": public_path(directory)}}
    return {"pid": popen.pid, **proc_poll(popen.pid, wait)}


def proc_poll(pid, wait):
    """New output (base64 per stream) and, once the process has exited and both pipes are drained,
    its end; waits up to `wait` seconds for either."""
    process = _process(pid)
    pipes = process["pipes"]
    out = {"stdout": b"", "stderr": b""}
    deadline = time.monotonic() + wait
    while pipes:
        ready, _, _ = select.select(list(pipes.values()), [], [], max(0.0, deadline - time.monotonic()))
        for name, fd in list(pipes.items()):
            if fd not in ready:
                continue
            try:
                chunk = os.read(fd, READ_CHUNK)
            except BlockingIOError:
                continue
            if chunk:
                out[name] += chunk
            else:
                del pipes[name]
        if any(out.values()) or time.monotonic() >= deadline:
            break
    answer: dict[str, Any] = {name: base64.b64encode(data).decode() for name, data in out.items()}
    popen = process["popen"]
    if not pipes:
        remaining = max(0.0, deadline - time.monotonic())
        try:
            popen.wait(remaining)
        except subprocess.TimeoutExpired:
            return answer
        popen.stdout.close()
        popen.stderr.close()
        del _processes[pid]
        code = popen.returncode
        answer["end"] = {"exit_code": code if code >= 0 else -1,
                         "status": f"exit status {code}" if code >= 0 else f"signal: {_signal_name(-code)}"}
    return answer


def _signal_name(number):
    names = {signal.SIGKILL: "killed", signal.SIGTERM: "terminated", signal.SIGINT: "interrupt"}
    return names.get(number, f"signal {number}")


def proc_signal(pid, number):
    _process(pid)
    with contextlib.suppress(ProcessLookupError):  # exited already: the next poll reports its end
        os.killpg(pid, number)
    return None


def proc_list():
    running = []
    for pid, process in _processes.items():
        if process["popen"].poll() is None:
            running.append({"pid": pid, **process["config"]})
    return running


def _process(pid):
    process = _processes.get(pid)
    if process is None:
        raise GuestError("not_found", f"process with pid {pid} not found")
    return process


# ---- the environment ---------------------------------------------------------------------------
def env_update(values, unset, unset_value_prefix):
    """The sandbox-wide environment, which later commands and runs inherit: `unset` names (and, with a
    prefix, the variables whose value starts with it, but for those `values` sets) go, then `values`."""
    for key in unset:
        os.environ.pop(key, None)
    if unset_value_prefix:
        for key, value in list(os.environ.items()):
            if value.startswith(unset_value_prefix) and key not in values:
                del os.environ[key]
    os.environ.update(values)
    return None


# ---- code contexts -----------------------------------------------------------------------------
# Each context is a kernel of its own, as in E2B: its own `__main__`, its own history (`In`, `Out`,
# `_`) and execution count, its own working directory.  Cells run in IPython's shell (the session's
# cells interpreter); a context's namespace is made on its first execution.
def _new_context(cwd):
    return {"module": None, "state": None, "cwd": cwd, "count": 0}


def ctx_create(context_id, cwd):
    directory = local_path(cwd)
    if not os.path.isdir(directory):
        raise GuestError("invalid_argument", f"cwd '{cwd}' does not exist")
    _contexts[context_id] = _new_context(directory)
    return {"cwd": public_path(directory)}


def ctx_restart(context_id):
    context = _context(context_id)
    context.update(module=None, state=None, count=0)
    return None


def ctx_remove(context_id):
    _context(context_id)
    del _contexts[context_id]
    return None


def _context(context_id):
    context = _contexts.get(context_id)
    if context is None:
        raise GuestError("not_found", f"context {context_id} not found")
    return context


HISTORY = ("input_hist_parsed", "input_hist_raw", "output_hist", "output_hist_reprs", "dir_hist",
           "_i00", "_i", "_ii", "_iii")
"""The history manager's record of a kernel's cells: its lists, and the inputs it shows as `_i`, `_ii`..."""
SHOWN = ("_", "__", "___")
"""The display hook's last values, which it shows as `_`, `__`, `___`."""
LAST_ERROR = ("last_type", "last_value", "last_traceback", "last_exc")
"""What `sys` keeps of the last uncaught error (`%debug`, `%tb` read it)."""
LAST_CELL = ("last_execution_result", "last_execution_succeeded", "_last_input_line")
"""What the shell keeps of the last cell it ran."""
UNSET = object()
WRAPPER = "__import__('zygote.guest'"
"""How the server's calls into this module begin (they carry a call's code and `envs`)."""


def _fresh_state():
    return {"history": [[""], [""], {}, {}, [], "", "", "", ""], "shown": ["", "", ""], "hidden": {},
            "error": [UNSET] * len(LAST_ERROR), "cell": [None, True, UNSET], "cells": {}, "lines": {}}


def _state(shell, lines):
    return {"history": [getattr(shell.history_manager, name) for name in HISTORY],
            "shown": [getattr(shell.displayhook, name) for name in SHOWN], "hidden": shell.user_ns_hidden,
            "error": [getattr(sys, name, UNSET) for name in LAST_ERROR],
            "cell": [getattr(shell, name, UNSET) for name in LAST_CELL], "cells": shell.compile._filename_map,
            "lines": lines}


def _restore(shell, state):
    for name, value in zip(HISTORY, state["history"], strict=True):
        setattr(shell.history_manager, name, value)
    for name, value in zip(SHOWN, state["shown"], strict=True):
        setattr(shell.displayhook, name, value)
    shell.user_ns_hidden = state["hidden"]
    shell.compile._filename_map = state["cells"]  # each cell's name (a hash of its code) and number
    for owner, names, values in ((sys, LAST_ERROR, state["error"]), (shell, LAST_CELL, state["cell"])):
        for name, value in zip(names, values, strict=True):
            if value is not UNSET:
                setattr(owner, name, value)
            elif hasattr(owner, name):
                delattr(owner, name)


def _forget_calls(shell, state):
    """The shell's own history, what it queued for its history database, and the names it set for it
    in its namespace (the server's calls into this module, with their code and `envs`, and what they
    showed), emptied: what earlier calls carried is then nowhere in the interpreter."""
    manager = shell.history_manager
    with manager.db_input_cache_lock, manager.db_output_cache_lock:
        manager.db_input_cache.clear()
        manager.db_output_cache.clear()
    history = state["history"]
    for inputs in history[:2]:
        del inputs[1:]
    for outputs in history[2:4]:
        outputs.clear()
    history[5:] = [""] * (len(HISTORY) - 5)
    state["shown"][:] = [""] * len(SHOWN)
    state["cell"][:] = _fresh_state()["cell"]
    for names in (shell.user_ns, state["hidden"]):
        for name in [name for name in names if name.lstrip("_i").isdigit() or name in ("_i", "_ii", "_iii")]:
            del names[name]


def _lines_entered(shell, context_lines):
    """linecache (where IPython keeps each cell's source, for tracebacks and `inspect`) holds the
    context's own cells only: the server's calls are dropped, the context's put back; returns the
    names it held before."""
    for name, entry in list(linecache.cache.items()):
        if len(entry) == 4 and entry[2] and entry[2][0].startswith(WRAPPER):
            del linecache.cache[name]
            shell.compile._filename_map.pop(name, None)
    outside = set(linecache.cache)
    linecache.cache.update(context_lines)
    return outside


def _lines_left(outside):
    """What the context added to linecache, taken out of it."""
    return {name: linecache.cache.pop(name) for name in list(linecache.cache) if name not in outside}


@contextlib.contextmanager
def _entered(shell, context):
    """The shell runs in the context's namespace, history, shown values, hidden names, last error and
    cell, cells' names and sources and count until the block ends: a context is a kernel of its own,
    as in E2B, but for the interpreter they share (one context's objects are reachable from another's
    through `gc`: docs/e2b.md)."""
    fresh = context["module"] is None
    if fresh:
        import types
        context["module"] = types.ModuleType("__main__")
        context["state"] = _fresh_state()
    outside = _lines_entered(shell, context["state"]["lines"])
    saved = (shell.user_module, shell.execution_count, _state(shell, {}), sys.modules.get("__main__"))
    _forget_calls(shell, saved[2])
    _restore(shell, context["state"])
    _bind(shell, context["module"])
    if fresh:
        shell.init_user_ns()
    shell.execution_count = context["count"] + 1
    try:
        yield
    finally:
        context["count"] = shell.execution_count - 1
        context["state"] = _state(shell, _lines_left(outside))
        module, count, state, main = saved
        _restore(shell, state)
        _bind(shell, module)
        shell.execution_count = count
        if main is not None:
            sys.modules["__main__"] = main


def _bind(shell, module):
    shell.user_module, shell.user_ns = module, module.__dict__
    shell.ns_table.update(user_global=module.__dict__, user_local=module.__dict__)
    sys.modules["__main__"] = module


def run_cell(payload):
    """Run one execution in its context, as its kernel would: IPython's own `run_cell`, whose
    output and errors land in this cell's record, followed by a `NOTE` bundle (read by the server,
    so that an execution is one cell).  The context's working directory and the call's environment
    apply only while it runs."""
    request = json.loads(payload)
    context = _context(request["context"])
    main = _execute(context, request["code"], request["envs"])
    ipython_shell.current.display.extend(ipython_shell.figures_display())
    ipython_shell.current.display.append({NOTE: {"count": context["count"], "main": main}})


def _execute(context, code, envs):
    """`code` run in `context` by IPython's own `run_cell`, with `envs` set while it runs; the index of
    its main result among the cell's displays (None without one)."""
    shell = vars(builtins)["get_ipython"]()  # a builtin while IPython runs a cell
    saved_env = {key: os.environ.get(key) for key in envs}
    os.environ.update(envs)
    saved_cwd = os.getcwd()
    os.chdir(context["cwd"])
    hook = shell.displayhook
    hook.main_index = None
    try:
        with _entered(shell, context):
            shell.run_cell(code, store_history=True)
        return hook.main_index
    finally:
        context["cwd"] = os.getcwd()
        os.chdir(saved_cwd)
        for key, old in saved_env.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


# ---- the call protocol -------------------------------------------------------------------------
OPERATIONS: dict[str, Any] = {
    "fs_stat": fs_stat, "fs_list": fs_list, "fs_make_dir": fs_make_dir, "fs_move": fs_move, "fs_remove": fs_remove,
    "fs_chmod": fs_chmod, "fs_write": fs_write, "fs_read": fs_read, "proc_start": proc_start, "proc_poll": proc_poll,
    "proc_signal": proc_signal, "proc_list": proc_list, "ctx_create": ctx_create, "ctx_restart": ctx_restart,
    "ctx_remove": ctx_remove, "env_update": env_update,
}
ERRNO_CODES = {"ENOENT": "not_found", "EEXIST": "already_exists", "ENOTDIR": "invalid_argument",
               "EISDIR": "invalid_argument", "ENOTEMPTY": "invalid_argument", "EACCES": "permission_denied",
               "EPERM": "permission_denied", "EROFS": "permission_denied", "ENOSPC": "resource_exhausted",
               "EDQUOT": "resource_exhausted", "EFBIG": "resource_exhausted", "ENAMETOOLONG": "invalid_argument",
               "EXDEV": "invalid_argument", "EINVAL": "invalid_argument", "EBUSY": "invalid_argument",
               "ELOOP": "invalid_argument", "EMLINK": "resource_exhausted",
               # a socket, a device with nothing behind it, a kernel file that reads this way: the path's
               "ENXIO": "invalid_argument", "ENODEV": "invalid_argument", "EIO": "invalid_argument"}


def dispatch(payload, data=None):
    """One E2B call: `{"op": name, "args": {...}}` in, one answer line on stdout; `data`, where given,
    is the operation's base64 `data` argument (a file's, sent beside the JSON: not encoded twice)."""
    request = json.loads(payload)
    if data is not None:
        request["args"]["data"] = data
    try:
        answer = {"ok": OPERATIONS[request["op"]](**request["args"])}
    except GuestError as exc:
        answer = {"error": {"code": exc.code, "message": str(exc)}}
    except OSError as exc:
        import errno
        code = ERRNO_CODES.get(errno.errorcode.get(exc.errno or 0, ""), "internal")
        answer = {"error": {"code": code, "message": f"{exc.strerror or exc}: {public_path(exc.filename or '')}"}}
    except ValueError as exc:  # an argument the system refuses (a NUL in a command, say): the caller's to fix
        answer = {"error": {"code": "invalid_argument", "message": str(exc)}}
    except RecursionError:  # os.makedirs of a path thousands of directories deep
        answer = {"error": {"code": "invalid_argument", "message": "the path is nested too deep"}}
    _answer(answer)


def _answer(answer):
    sys.stdout.write("\n" + MARK + json.dumps(answer) + "\n")
    sys.stdout.flush()
