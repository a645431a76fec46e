"""Existing Sandbox Fusion clients work against our server unchanged."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests
import sandbox_fusion
from sandbox_fusion import RunCodeRequest, RunJupyterRequest, RunStatus
from verl.utils.reward_score.sandbox_fusion.utils import _process_single_case, call_sandbox_api

from tests.server_fixtures import CONTAINER_MODES, ServerHandle, server_in_mode


@pytest.fixture(scope="module", params=["namespaces", *CONTAINER_MODES])
def server(request: pytest.FixtureRequest) -> Iterator[ServerHandle]:
    """The shared server (the namespaces rung here), then the landlock rung in a container profile."""
    if request.param == "namespaces":
        yield request.getfixturevalue("sf_server")
        return
    with server_in_mode(request.param, "--slots", "2", "--sandboxes", "1", "--preload", "") as handle:
        yield handle


def test_sandbox_fusion_client_run_code_and_run_jupyter(server: ServerHandle) -> None:
    sandbox_fusion.set_endpoint(server.url)
    result = sandbox_fusion.run_code(RunCodeRequest(code="print(input()[::-1])", language="python", stdin="abc"))
    assert result.status == RunStatus.Success
    assert result.run_result.stdout == "cba\n"

    failed = sandbox_fusion.run_code(RunCodeRequest(code="int('x')", language="python"))
    assert failed.status == RunStatus.Failed and "ValueError" in failed.run_result.stderr

    compiled = sandbox_fusion.run_code(RunCodeRequest(
        code="#include <iostream>\nint main(){int a,b;std::cin>>a>>b;std::cout<<a+b<<std::endl;}",
        language="cpp", stdin="2 3"))
    assert compiled.status == RunStatus.Success and compiled.run_result.stdout == "5\n"
    assert compiled.compile_result.return_code == 0

    notebook = sandbox_fusion.run_jupyter(RunJupyterRequest(cells=["x = 20", "x + 22", "print(x)"]))
    assert notebook.status == RunStatus.Success
    assert notebook.cells[1].display == [{"text/plain": "42"}]
    assert notebook.cells[2].stdout == "20\n"


def test_sandbox_fusion_client_run_jupyter_is_ipython(server: ServerHandle) -> None:
    sandbox_fusion.set_endpoint(server.url)
    cells = ["    s = 'abc'\n    s",  # indented as a model writes it; text/plain is the repr
             "from IPython.display import display, HTML, Latex\ndisplay(HTML('<b>1</b>'))\n"
             "display(Latex('$x$'))\n{'k': [1, 2]}",
             "!echo from-shell", "%time sum(range(5))", "import asyncio\nawait asyncio.sleep(0)\n7",
             "1 / 0", "def broken(:", "!pip install anything"]
    notebook = sandbox_fusion.run_jupyter(RunJupyterRequest(cells=cells, cell_timeout=20, total_timeout=60))
    assert notebook.status == RunStatus.Success
    indented, shown, shell, timed, awaited, failed, syntax, offline = notebook.cells
    assert indented.display == [{"text/plain": "'abc'"}] and indented.error == []
    assert shown.display == [{"text/plain": "<IPython.core.display.HTML object>", "text/html": "<b>1</b>"},
                             {"text/plain": "<IPython.core.display.Latex object>", "text/latex": "$x$"},
                             {"text/plain": "{'k': [1, 2]}"}]
    assert shell.stdout == "from-shell\n"
    assert timed.display == [{"text/plain": "10"}] and "Wall time" in timed.stdout
    assert awaited.display == [{"text/plain": "7"}]
    assert (failed.error[0]["ename"], failed.error[0]["evalue"]) == ("ZeroDivisionError", "division by zero")
    assert any("----> 1 1 / 0" in line for line in failed.error[0]["traceback"])
    assert syntax.error[0]["ename"] == "SyntaxError"
    assert "no network" in offline.stderr and offline.error == []


def test_skyrl_sandbox_fusion_calls(server: ServerHandle) -> None:
    """SkyRL's coder1 verifier posts {language, code, stdin, run_timeout} and reads it with the
    client's model; its CodeInterpreter tool goes through verl's _process_single_case, stdin None."""
    body = {"language": "python", "code": "print(input() * 2)", "stdin": "ab", "run_timeout": 10}
    answer = requests.post(server.run_code_url, json=body, timeout=12)
    result = sandbox_fusion.RunCodeResponse(**answer.json())
    assert result.status == RunStatus.Success and result.run_result.stdout == "abab\n"
    _, meta = _process_single_case(0, None, None, server.run_code_url, "print(6 * 7)", 30, 1024, "python")
    assert meta["run_status"] == "Finished" and meta["stdout"] + meta["stderr"] == "42\n"


def test_verl_call_sandbox_api(server: ServerHandle) -> None:
    response, error = call_sandbox_api(server.run_code_url, "print(sum(range(10)))", None, 10, 10, 256, "python")
    assert error is None
    assert response["status"] == "Success" and response["run_result"]["stdout"] == "45\n"

    response, error = call_sandbox_api(server.run_code_url, "import time; time.sleep(5)", None, 10, 1, 256, "python")
    assert error is None
    assert response["status"] == "Failed" and response["run_result"]["status"] == "TimeLimitExceeded"


def test_verl_process_single_case(server: ServerHandle) -> None:
    solution = "a, b = map(int, input().split())\nprint(a * b)"
    # verl returns (passed: True | False | -1 for errors, metadata)
    passed, meta = _process_single_case(0, "6 7", "42", server.run_code_url, solution, 10, 256, "python")
    assert passed is True and meta["status"] == "success", meta
    passed, meta = _process_single_case(1, "6 7", "41", server.run_code_url, solution, 10, 256, "python")
    assert passed is False and meta["status"] == "wrong_answer", meta
    passed, meta = _process_single_case(2, "", "", server.run_code_url, "while True: pass", 1, 256, "python")
    assert meta["status"] == "timeout", meta
