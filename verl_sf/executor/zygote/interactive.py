"""A session's child: a live interpreter that runs one call after another in the same state.

Calls arrive on fd 9; each ends with a `call_done` record on fd 3.  Python calls are JSON lines
(a `SessionCallBody`); bash calls are a line and NUL-terminated fields read by the shell itself (`BASH_CALL`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable
from typing import Any, NoReturn, Optional

from .jupyter import run_cells
from .messages import CallDoneRecord, SessionCallBody
from .python_runner import run_python
from .wire import READ_CHUNK, Lines, loads, report

JOB_FD = 9
INIT_FD = 8  # the bash session's set-up (BASH_INIT), read by bash through BASH_ENV as it starts; it closes it
# The bash session reads its commands from fd 0, a copy of fd 9, one byte at a time (a pipe cannot be
# read ahead): each call is BASH_CALL on a line, then `code NUL fetch-limit NUL path NUL ... NUL`.
# The code is eval'd at the shell's top level, in one loop of ours and no function, so `declare`s stay
# global.  SIGINT is ignored but while the code runs (our two functions around it let it pass: the
# code has not begun or has ended).  At the time-out the trap stops the code, as an interactive shell
# drops the rest of a line on ^C (a non-interactive one runs on after a trap): at the top level it
# breaks out of every loop; in a function it returns, and a DEBUG trap (extdebug, inherited by
# functions) returns from each caller in turn, then breaks out at the top, once, and lets our own
# commands run (the code's eval and our report: bash's `break` outside a loop says so and succeeds,
# and the DEBUG trap would skip the report).  The shell's own DEBUG trap and options are put back at
# the top level once the call is reported (in a function, a DEBUG trap set without functrace is put
# back as it returns).  Nothing of ours needs `set +u`.  The shell fetches the files itself, as the
# session's user in its own mounts, with SIGINT ignored (an interrupt racing the end must not cut a
# file short), and reports them in order ("fetched": base64 or null per path).  It says it is ready
# only once SIGINT is ignored: an interrupt before that would end the session.
CODE_EVAL = 'eval "$__verl_sf_code"'  # how the call's code runs; the DEBUG trap knows it by this text
BASH_CALL = (f'__verl_sf_begin && for __verl_sf_once in 1; do {CODE_EVAL} 3>&- 9<&- </dev/null; done;'
             ' __verl_sf_end; eval "${__verl_sf_restore-}"')
BASH_INIT = f"__verl_sf_eval='{CODE_EVAL}'\n" + r"""unset BASH_ENV
exec 8<&-
trap '' INT
__verl_sf_interrupt='case ${FUNCNAME[0]-} in __verl_sf_begin|__verl_sf_end) ;; *)
builtin printf "\nKeyboardInterrupt\n" >&2
__verl_sf_interrupted=130
if [ -z "${FUNCNAME[0]-}" ]; then [ -z "${__verl_sf_looping-}" ] || { __verl_sf_looping=; break 1000000; }; fi
if [ -z "${__verl_sf_restore-}" ]; then
  __verl_sf_restore="__verl_sf_restore=
trap - DEBUG
$(trap -p DEBUG)
$(shopt -p extdebug)
$(shopt -po functrace)"
fi
shopt -s extdebug
set -o functrace
trap "if [ -z \"\${__verl_sf_interrupted-}\" ] || [ \"\${FUNCNAME[0]-}\" = __verl_sf_end ] \\
    || [ \"\$BASH_COMMAND\" = __verl_sf_end ] \\
    || [ \"\${BASH_COMMAND#\"\$__verl_sf_eval\"}\" != \"\$BASH_COMMAND\" ]; then :
elif [ -n \"\${FUNCNAME[0]-}\" ]; then return 2
elif [ -n \"\${__verl_sf_looping-}\" ]; then __verl_sf_looping=; ! break 1000000; fi" DEBUG
return;;
esac'
__verl_sf_home=$PWD
__verl_sf_begin() {
  IFS= read -r -d '' __verl_sf_code || exit 0
  IFS= read -r -d '' __verl_sf_limit
  __verl_sf_paths=()
  while IFS= read -r -d '' __verl_sf_path && [ -n "$__verl_sf_path" ]; do __verl_sf_paths+=("$__verl_sf_path"); done
  __verl_sf_looping=1
  trap "$__verl_sf_interrupt" INT
}
__verl_sf_end() {
  __verl_sf_status=${__verl_sf_interrupted:-$?}
  trap '' INT
  __verl_sf_interrupted= __verl_sf_looping=
  {
    builtin printf '{"kind": "call_done", "return_code": %d, "fetched": [' "$__verl_sf_status"
    __verl_sf_sep=
    for __verl_sf_path in "${__verl_sf_paths[@]}"; do
      case $__verl_sf_path in
        */../*|*/..|../*) __verl_sf_path= ;;
        "$__verl_sf_home"/*|/tmp/*|/mnt/*) ;;
        /*) __verl_sf_path= ;;
        *) __verl_sf_path=$__verl_sf_home/$__verl_sf_path ;;
      esac
      # No symlink anywhere on the path: resolving it must not change it.
      if [ -n "$__verl_sf_path" ] && [ -f "$__verl_sf_path" ] \
          && [ "$(command realpath -e -- "$__verl_sf_path" 2>/dev/null)" \
               = "$(command realpath -s -m -- "$__verl_sf_path")" ] \
          && [ "$(command stat -c %s -- "$__verl_sf_path")" -le "$__verl_sf_limit" ]; then
        builtin printf '%s"' "$__verl_sf_sep"; command base64 -w0 -- "$__verl_sf_path"; builtin printf '"'
      else
        builtin printf '%snull' "$__verl_sf_sep"
      fi
      __verl_sf_sep=,
    done
    builtin printf ']}\n'
  } >&3
}
builtin printf '{"kind": "session_ready"}\n' >&3
"""


def _between_calls(signum: int, frame: Any) -> None:
    """SIGINT between calls: dropped."""


def _hold_interrupts(code_handler: Any) -> Any:
    """Drop interrupts until the next call; the handler the code left, which that call gets back."""
    current = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, _between_calls)
    if current is _between_calls:
        return code_handler
    return current if current is not None else signal.default_int_handler


def python_session(namespace: dict[str, Any], fetch: Callable[[Optional[list[str]]], dict[str, str]]) -> NoReturn:
    """Each call is one line of JSON on fd 9, run in the same globals; the zygote closing fd 9 ends it."""
    source = os.fdopen(JOB_FD, "rb", buffering=0)
    lines = Lines()  # each byte searched once: a call of tens of MB (an upload) comes in thousands of reads
    pending: list[bytes] = []
    # The zygote's interrupt is for the code: between calls one is dropped (it raced the end of the
    # call before, or came before this call began and is sent again).  Not blocked or ignored, so
    # /proc still shows what the code itself does with SIGINT; the code's own handler is kept.
    code_handler = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, _between_calls)
    report({"kind": "session_ready"})  # only now: an interrupt from here on is dropped, never the session's end
    while True:
        try:
            while not pending:
                chunk = source.read(READ_CHUNK)
                if not chunk:
                    os._exit(0)
                pending = lines.feed(chunk)
            line = pending.pop(0)
            call: SessionCallBody = loads(line.decode())
            started = os.times()
            stdin_fd = os.memfd_create("stdin", 0)
            os.write(stdin_fd, (call.get("stdin") or "").encode("utf-8", "surrogateescape"))
            os.lseek(stdin_fd, 0, os.SEEK_SET)
            os.dup2(stdin_fd, 0)
            os.close(stdin_fd)
            signal.signal(signal.SIGINT, code_handler)
            if call.get("cells") is not None:
                code = run_cells(call["cells"], call.get("cell_timeout") or 0, call["output_limit"], namespace,
                                 at_exit=False)
            else:
                code = run_python(call["code"], namespace, at_exit=False)
            code_handler = _hold_interrupts(code_handler)
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            used = os.times()
            record: CallDoneRecord = {"kind": "call_done", "return_code": code,
                                      "cpu_time": (used.user + used.system) - (started.user + started.system)}
            if call.get("fetch_files") is not None:
                record["files"] = fetch(call["fetch_files"])
            report(record)
        except KeyboardInterrupt:  # it came between statements of ours, just before or after the code
            code_handler = _hold_interrupts(code_handler)
            sys.stderr.write("KeyboardInterrupt\n")
            report({"kind": "call_done", "return_code": 1})
