"""Turn a sandbox answer into the text the model reads and the metrics verl logs.

The old verl tool answered "no stdout here" for every time-out, API error and sandbox
error, and an empty message when stderr was missing.  Here every outcome has its own
short, truthful text, and the text is never empty.
"""

from __future__ import annotations

from typing import Any, Optional

from verl_sf.enums import StrEnum
from verl_sf.models import CommandRunResult, CommandRunStatus, RunCodeResponse, RunStatus

NO_OUTPUT = "(no output; print() the values you want to see)"


class CallStatus(StrEnum):
    """Values of the tool's `status` metric (one word per way a call can end)."""

    success = "success"
    error = "error"  # the code raised or exited non-zero
    compile_error = "compile_error"
    timeout = "timeout"
    sandbox_error = "sandbox_error"  # the sandbox (or the way to it) failed, not the code
    session_ended = "session_ended"  # the trajectory's session was gone (expired, evicted, restarted): nothing ran
    invalid_arguments = "invalid_arguments"  # the model's arguments could not be run at all
    setup_failed = "setup_failed"  # the row's set-up could not be run or snapshotted: nothing of the call ran


def status_of(response: RunCodeResponse) -> CallStatus:
    compile_result, run_result = response.compile_result, response.run_result
    for stage in (compile_result, run_result):
        if stage is not None and stage.status == CommandRunStatus.TimeLimitExceeded:
            # A time-out spent mostly waiting for a CPU is the overloaded server's, not the code's.
            return CallStatus.sandbox_error if stage.cpu_starved else CallStatus.timeout
    if response.status == RunStatus.Success:
        return CallStatus.success
    if compile_result is not None and compile_result.status == CommandRunStatus.Finished and compile_result.return_code:
        return CallStatus.compile_error
    if run_result is not None and run_result.status == CommandRunStatus.Finished:
        return CallStatus.error
    return CallStatus.sandbox_error


def reply_text(response: RunCodeResponse, timeout: float, max_chars: int) -> tuple[str, bool]:
    """(text for the model, whether this function cut it to `max_chars`)."""
    status = status_of(response)
    if status == CallStatus.timeout:
        stage = _timed_out_stage(response)
        what = "Compilation" if stage is response.compile_result else "Execution"
        text = _join(f"{what} timed out after {timeout:g} s", _streams(stage, label_partial=True))
    elif status == CallStatus.compile_error:
        text = _join("Compilation failed:", _streams(response.compile_result) or NO_OUTPUT)
    elif status == CallStatus.sandbox_error:
        text = f"Sandbox error: {_one_line(response.message) or 'the sandbox could not run the code'}"
    else:
        run = response.run_result
        text = _streams(run)
        if status == CallStatus.error and run is not None and not (run.stderr or "").strip():
            text = _join(text, f"(exited with code {run.return_code})")
        text = text or NO_OUTPUT
    if response.session_alive is False:
        text = _join(text, f"[The session ended ({_one_line(response.message)}): its variables and files are gone; "
                           f"the next call starts a fresh session.]")
    return _cap(text, max_chars)


def session_ended_text(reason: str) -> str:
    """The text for a call whose session the server no longer has (expired, evicted, restarted)."""
    return (f"Session error: the session that held your earlier state has ended ({_one_line(reason)}); variables, "
            f"imports and files from earlier calls are gone. This code did not run; the next call starts a fresh "
            f"session.")


def setup_failed_text(reason: str) -> str:
    """The text for a call whose trajectory's set-up (its row's `setup`) could not be prepared."""
    return f"Set-up error: {reason.strip() or 'the set-up failed'}\nThis code did not run."


def unavailable_text(error: BaseException) -> str:
    """The text for a call that got no answer at all (network, dead server, retries used up)."""
    return f"Sandbox error: {_one_line(str(error)) or type(error).__name__}"


def metrics(response: Optional[RunCodeResponse], backend: str, *, truncated: bool,
            status: Optional[CallStatus] = None) -> dict[str, Any]:
    """The tool's metrics dict (verl returns it alongside the response and the reward)."""
    run = response.run_result if response else None
    return {
        "status": status or (status_of(response) if response else CallStatus.sandbox_error),
        "execution_time": run.execution_time if run else None,
        "queue_wait": response.queue_wait if response else None,
        "truncated": bool(truncated or (response is not None and response.truncated)),
        "backend": backend,
    }


def _timed_out_stage(response: RunCodeResponse) -> Optional[CommandRunResult]:
    for stage in (response.compile_result, response.run_result):
        if stage is not None and stage.status == CommandRunStatus.TimeLimitExceeded:
            return stage
    return None


def _streams(stage: Optional[CommandRunResult], label_partial: bool = False) -> str:
    """stdout then stderr, as a terminal would show them when stderr follows."""
    if stage is None:
        return ""
    parts = [s for s in (stage.stdout or "", stage.stderr or "") if s]
    text = "".join(p if p.endswith("\n") or p is parts[-1] else p + "\n" for p in parts).rstrip("\n")
    if label_partial and text:
        return "Output before the time-out:\n" + text
    return text


def _join(*parts: str) -> str:
    return "\n".join(p for p in parts if p)


def _one_line(message: str) -> str:
    return " ".join((message or "").split())[:500]


def _cap(text: str, max_chars: int) -> tuple[str, bool]:
    """Keep the head and the tail (where tracebacks end) and say how much was cut."""
    if len(text) <= max_chars:
        return text, False
    tail_len = max_chars // 3
    head_len = max_chars - tail_len
    dropped = len(text) - head_len - tail_len
    return f"{text[:head_len]}\n[... output truncated: {dropped} characters not shown ...]\n{text[-tail_len:]}", True
