"""What the model reads: the ReTool code transforms and the rendering of every outcome."""

from __future__ import annotations

import pytest

from verl_sf.models import CommandRunResult, CommandRunStatus, RunCodeResponse, RunStatus
from verl_sf.tools.code import extract_python_block, print_last_expression
from verl_sf.tools.reply import NO_OUTPUT, metrics, reply_text, unavailable_text


@pytest.mark.parametrize("text, expected", [
    ("no fence here", "no fence here"),
    ("Try:\n```python\nprint(1)\n```\nand\n```python\nprint(2)\n```", "print(1)"),
    ("```py\nx = 1\nx\n```", "x = 1\nx"),
    ("```\nplain fence\n```", "```\nplain fence\n```"),
])
def test_extract_python_block(text: str, expected: str) -> None:
    assert extract_python_block(text) == expected


def run(code: str) -> str:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "main.py", "exec"), {})
    return out.getvalue()


@pytest.mark.parametrize("code, printed", [
    ("x = 6\nx * 7", "42\n"),
    ("x = 1; x  # trailing comment\n", "1\n"),
    ("print('once')", "once\n"),  # print returns None: nothing extra
    ("def f():\n    pass\nf()", ""),
    ("a = (1,\n     2)\n(a[0] +\n a[1])", "3\n"),
    ("s = 'héllo'; s", "héllo\n"),
    ("for i in range(2):\n    i", ""),  # not a top-level expression
    ("x = 5", ""),
    ("'text'", "text\n"),
])
def test_print_last_expression_behaves_like_a_repl(code: str, printed: str) -> None:
    rewritten = print_last_expression(code)
    assert run(rewritten) == printed
    assert rewritten.count("\n") == code.count("\n")  # same line numbers for tracebacks


def test_print_last_expression_leaves_unparsable_code_alone() -> None:
    assert print_last_expression("def f(:\n  1") == "def f(:\n  1"
    assert print_last_expression("") == ""


def finished(stdout: str = "", stderr: str = "", code: int = 0, **kw) -> RunCodeResponse:
    return RunCodeResponse(status=RunStatus.Success if code == 0 else RunStatus.Failed,
                           run_result=CommandRunResult(status=CommandRunStatus.Finished, return_code=code,
                                                       stdout=stdout, stderr=stderr, execution_time=0.1), **kw)


def test_render_each_outcome() -> None:
    assert reply_text(finished("a\n", "b\n"), 10, 1000) == ("a\nb", False)
    assert reply_text(finished("no newline", "err"), 10, 1000) == ("no newline\nerr", False)
    assert reply_text(finished(), 10, 1000) == (NO_OUTPUT, False)
    assert reply_text(finished("", "", code=2), 10, 1000) == ("(exited with code 2)", False)
    assert reply_text(finished("x\n", "Traceback...\nKeyError: 1\n", code=1), 10, 1000) == (
        "x\nTraceback...\nKeyError: 1", False)
    timeout = RunCodeResponse(status=RunStatus.Failed, run_result=CommandRunResult(
        status=CommandRunStatus.TimeLimitExceeded, stdout="", stderr=""))
    assert reply_text(timeout, 2.5, 1000) == ("Execution timed out after 2.5 s", False)
    starved = RunCodeResponse(status=RunStatus.Failed, message="run_timeout exceeded while the run mostly waited "
                              "for a CPU (server overloaded)", run_result=CommandRunResult(
                                  status=CommandRunStatus.TimeLimitExceeded, cpu_wait_time=2.0, cpu_starved=True))
    assert reply_text(starved, 2.5, 1000) == (
        "Sandbox error: run_timeout exceeded while the run mostly waited for a CPU (server overloaded)", False)
    assert metrics(starved, "http", truncated=False)["status"] == "sandbox_error"
    compile_error = RunCodeResponse(status=RunStatus.Failed, compile_result=CommandRunResult(
        status=CommandRunStatus.Finished, return_code=1, stderr="main.cpp:1: error: expected ';'"))
    assert reply_text(compile_error, 10, 1000) == ("Compilation failed:\nmain.cpp:1: error: expected ';'", False)
    sandbox = RunCodeResponse(status=RunStatus.SandboxError, message="language 'cobol'\nnot available")
    assert reply_text(sandbox, 10, 1000) == ("Sandbox error: language 'cobol' not available", False)
    assert reply_text(RunCodeResponse(status=RunStatus.SandboxError), 10, 1000)[0] == (
        "Sandbox error: the sandbox could not run the code")
    assert unavailable_text(RuntimeError("connection refused\nretries: 3")) == (
        "Sandbox error: connection refused retries: 3")
    assert unavailable_text(TimeoutError()) == "Sandbox error: TimeoutError"


def test_render_caps_long_text_keeping_head_and_tail() -> None:
    text, cut = reply_text(finished("h" * 5000 + "TAIL"), 10, 300)
    assert cut and text.startswith("h" * 200) and text.endswith("TAIL")
    assert "[... output truncated: 4704 characters not shown ...]" in text


def test_metrics_fields() -> None:
    response = finished("x", queue_wait=0.25, truncated=True)
    assert metrics(response, "http", truncated=False) == {
        "status": "success", "execution_time": 0.1, "queue_wait": 0.25, "truncated": True, "backend": "http"}
    assert metrics(None, "daytona", truncated=False)["status"] == "sandbox_error"


def test_a_call_that_ended_its_session_says_so_and_a_gone_session_is_named() -> None:
    from verl_sf.tools.reply import session_ended_text

    killed = RunCodeResponse(status=RunStatus.Failed, session_alive=False,
                             message="run_timeout exceeded; the session ended: killed: the call ignored the interrupt",
                             run_result=CommandRunResult(status=CommandRunStatus.TimeLimitExceeded, stdout="partial\n"))
    text, _ = reply_text(killed, 1, 4000)
    assert text.startswith("Execution timed out after 1 s") and "partial" in text
    assert text.endswith("[The session ended (run_timeout exceeded; the session ended: killed: the call ignored the "
                         "interrupt): its variables and files are gone; the next call starts a fresh session.]")
    alive = killed.model_copy(update={"session_alive": True})
    assert "session ended" not in reply_text(alive, 1, 4000)[0]
    gone = session_ended_text("expired: idle for 601 s (idle_ttl_s=600)")
    assert gone.startswith("Session error:") and "expired: idle for 601 s" in gone and "did not run" in gone
