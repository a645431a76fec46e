"""RL frameworks' own E2B calls, as they make them, against a real `verl-sf serve`: open-r1's code
reward (its direct provider and its router), AReaL's E2B executor and slime's sandbox commands.

Each test writes down a client's facts (request shapes, templates, what it reads back), read from
its public source; the SDKs are the real, unmodified ones, pointed at the server by environment.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
from collections.abc import Iterator

import pytest
from e2b import CommandExitException
from e2b_code_interpreter import AsyncSandbox, Sandbox
from e2b_code_interpreter.models import Execution, ExecutionError, Result

from tests.server_fixtures import ServerHandle, e2b_environment, start_server, stop_server

API_KEY = "e2b_0000000000000000000000000000000000000000"  # the key format slime and older SDKs expect


@pytest.fixture(scope="module")
def server() -> Iterator[ServerHandle]:
    handle = start_server("--slots", "2", "--preload", "")
    with e2b_environment(handle, API_KEY):
        yield handle
    stop_server(handle.process)


# open-r1 src/open_r1/rewards.py, code_reward: the template exactly as the source holds it, its
# four-space indent included (IPython strips a cell's common indent; plain Python would not run it).
OPEN_R1_TEMPLATE = """
    import subprocess
    import json

    def evaluate_code(code, test_cases):
        passed = 0
        total = len(test_cases)
        exec_timeout = 5

        for case in test_cases:
            process = subprocess.run(
                ["python3", "-c", code],
                input=case["input"],
                text=True,
                capture_output=True,
                timeout=exec_timeout
            )

            if process.returncode != 0:  # Error in execution
                continue

            output = process.stdout.strip()

            # TODO: implement a proper validator to compare against ground truth. For now we just check for exact string match on each line of stdout.
            all_correct = True
            for line1, line2 in zip(output.split('\\n'), case['output'].split('\\n')):
                all_correct = all_correct and line1.strip() == line2.strip()

            if all_correct:
                passed += 1

        success_rate = (passed / total)
        return success_rate

    code_snippet = {code}
    test_cases = json.loads({test_cases})

    evaluate_code(code_snippet, test_cases)
    """
CASES = [{"input": "3 4\n", "output": "7"}, {"input": "10 -2\n", "output": "8"}]
SOLUTIONS = {"right": "a, b = map(int, input().split())\nprint(a + b)",
             "half": "a, b = map(int, input().split())\nprint(7)",
             "crash": "raise SystemExit(1)"}
EXPECTED = [1.0, 0.5, 0.0]


def open_r1_scripts(copies: int) -> list[str]:
    """As code_reward formats them: the code and the test cases as JSON literals."""
    return [OPEN_R1_TEMPLATE.format(code=json.dumps(code), test_cases=json.dumps(json.dumps(CASES)))
            for code in SOLUTIONS.values()] * copies


async def open_r1_direct(script: str, semaphore: asyncio.Semaphore) -> float:
    """E2BProvider._run_script (src/open_r1/utils/code_providers.py): a sandbox per script, created
    with timeout 30 and request_timeout 28, run under asyncio.wait_for(32), `float(execution.text)`,
    killed in `finally`.  (It passes `languages=` to run_code, which the SDK rejects with a
    TypeError that it scores 0.0; the language is python either way.)"""
    async with semaphore:
        sandbox = await AsyncSandbox.create(timeout=30, request_timeout=28)
        try:
            execution = await asyncio.wait_for(sandbox.run_code(script, language="python"), timeout=32)
            return float(execution.text)
        except (TypeError, ValueError):
            return 0.0
        finally:
            await sandbox.kill()


def test_open_r1_direct_provider_scores_its_indented_template(server: ServerHandle) -> None:
    async def main() -> list[float]:
        semaphore = asyncio.Semaphore(16)  # 24 sandboxes, 16 at once, as its num_parallel runs them
        return await asyncio.gather(*[open_r1_direct(script, semaphore) for script in open_r1_scripts(8)])

    assert asyncio.run(main()) == EXPECTED * 8
    assert Sandbox.list().next_items() == []  # every sandbox was killed


async def e2b_router_batch(batch: dict) -> list[dict]:
    """scripts/e2b_router.py's /execute_batch: per script AsyncSandbox.create(timeout, request_timeout),
    run_code(script, language) under wait_for(timeout + 1), kill in `finally`; each answer is the
    Execution as JSON (FastAPI encodes the SDK's dataclasses) or the exception's text."""
    semaphore = asyncio.Semaphore(20)

    async def run_script(script: str, language: str) -> dict:
        async with semaphore:
            sandbox = None
            try:
                sandbox = await AsyncSandbox.create(timeout=batch["timeout"], request_timeout=batch["request_timeout"])
                execution = await asyncio.wait_for(sandbox.run_code(script, language=language),
                                                   timeout=batch["timeout"] + 1)
                return {"execution": dataclasses.asdict(execution), "exception_str": None}
            except Exception as exc:
                return {"execution": None, "exception_str": str(exc)}
            finally:
                if sandbox is not None:
                    await sandbox.kill()

    pairs = zip(batch["scripts"], batch["languages"], strict=True)
    answers = await asyncio.gather(*[run_script(script, language) for script, language in pairs])
    return json.loads(json.dumps(answers))  # the HTTP hop between router and trainer


def routed_rewards(answers: list[dict]) -> list[float | None]:
    """RoutedSandbox.run_code (src/open_r1/utils/routed_sandbox.py) rebuilds each Execution;
    E2BProvider then scores `float(execution.text)`, None where that fails."""
    rewards: list[float | None] = []
    for answer in answers:
        found = answer["execution"]
        execution = Execution() if found is None else Execution(
            results=[Result(**r) for r in found["results"]], logs=found["logs"],
            error=ExecutionError(**found["error"]) if found["error"] else None,
            execution_count=found["execution_count"])
        try:
            rewards.append(float(execution.text))  # type: ignore[arg-type]
        except Exception:
            rewards.append(None)
    return rewards


def test_open_r1_router_scores_its_indented_template(server: ServerHandle) -> None:
    scripts = open_r1_scripts(2)
    batch = {"scripts": scripts, "languages": ["python"] * len(scripts), "timeout": 30, "request_timeout": 28}
    assert routed_rewards(asyncio.run(e2b_router_batch(batch))) == EXPECTED * 2


async def areal_run_code(sandbox: AsyncSandbox, code: str) -> dict:
    """AReaL's E2BSandboxExecutor.run_code (areal/infra/sandbox/e2b_sandbox.py): stdout and stderr
    joined by newlines, the error's value, `execution.text` as output_text."""
    execution = await sandbox.run_code(code, timeout=30)
    error = str(execution.error.value) if execution.error else None
    return {"stdout": "\n".join(execution.logs.stdout), "stderr": "\n".join(execution.logs.stderr),
            "exit_code": 1 if error else 0, "error": error, "output_text": execution.text or ""}


async def areal_run_command(sandbox: AsyncSandbox, command: str) -> dict:
    """E2BSandboxExecutor.run_command: a failing command surfaces as the SDK's exception."""
    try:
        result = await sandbox.commands.run(command, timeout=30)
    except Exception as exc:
        return {"error": f"Sandbox command error: {exc}", "exit_code": 1}
    return {"stdout": result.stdout, "stderr": result.stderr, "exit_code": result.exit_code}


def test_areal_e2b_executor(server: ServerHandle) -> None:
    async def main() -> None:
        sandbox = await AsyncSandbox.create(timeout=300)  # E2BSandboxExecutor.create: timeout as an int
        try:
            assert await areal_run_code(sandbox, "print('hello')") == \
                {"stdout": "hello\n", "stderr": "", "exit_code": 0, "error": None, "output_text": ""}
            failed = await areal_run_code(sandbox, "raise ValueError('test error')")
            assert (failed["exit_code"], failed["error"]) == (1, "test error")
            assert (await areal_run_code(sandbox, "x = 6\nx * 7"))["output_text"] == "42"
            assert (await areal_run_code(sandbox, "'answer'"))["output_text"] == "answer"  # E2B drops the quotes
            assert (await areal_run_code(sandbox, "    y = x\n    y"))["output_text"] == "6"  # indented, as models write
            assert await areal_run_command(sandbox, "echo hi") == {"stdout": "hi\n", "stderr": "", "exit_code": 0}
            refused = await areal_run_command(sandbox, "exit 4")
            assert refused["exit_code"] == 1 and "exited with code 4" in refused["error"]
        finally:
            await sandbox.kill()

    asyncio.run(main())


def test_slime_sandbox_commands(server: ServerHandle) -> None:
    """slime/agent/sandbox.py's E2BSandbox: create(timeout, metadata), exec = commands.run(cmd, user,
    envs, timeout, on_stdout, on_stderr) with CommandExitException read for a failure, write_file =
    files.write(..., user, gzip=False, use_octet_stream=True, request_timeout=600), read_file =
    files.read(path, user); its calls default to user="root"."""
    async def main() -> None:
        sandbox = await AsyncSandbox.create(timeout=600, metadata={"example.com/image": "python:3.11"})
        try:
            async def exec_(cmd: str, user: str = "root", env: dict[str, str] | None = None) -> tuple[int, str, str]:
                try:
                    res = await sandbox.commands.run(cmd, user=user, envs=env, timeout=120,
                                                     on_stdout=lambda s: None, on_stderr=lambda s: None)
                    return res.exit_code, res.stdout or "", res.stderr or ""
                except CommandExitException as exc:
                    return exc.exit_code, exc.stdout or "", exc.stderr or ""

            assert await exec_("mkdir -p /tmp/setup && chmod 777 /tmp/setup && echo ok") == (0, "ok\n", "")
            assert await exec_("id -un; id -u") == (0, "root\n0\n", "")  # root of the sandbox's own namespace
            assert await exec_("echo $MODE; echo warn >&2; exit 3", env={"MODE": "eval"}) == (3, "eval\n", "warn\n")
            await sandbox.files.write("/home/user/patch.diff", io.BytesIO(b"diff"), user="root", gzip=False,
                                      use_octet_stream=True, request_timeout=600)
            await sandbox.files.write("/tmp/eval.sh", "cat /home/user/patch.diff", user="root")
            assert await exec_("bash /tmp/eval.sh") == (0, "diff", "")
            assert await sandbox.files.read("/home/user/patch.diff", user="root") == "diff"
        finally:
            await sandbox.kill()

    asyncio.run(main())
