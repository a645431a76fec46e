"""Every Sandbox Fusion language this machine can run, on a real server: hello world with stdin,
a compile error, a time-out, and the language's own test runner where SF has one.

CI installs every language first (`verl-sf languages install all`), so a language missing here is
a failure, never a skip.  Assertions (failing -> Failed, passing -> Success) are in
test_language_assertions.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import requests

from tests.language_cases import DOUBLE, TEST_RUNNERS
from tests.server_fixtures import ServerHandle, run_code, run_code_batch
from verl_sf.executor.language_packages import SOURCES

# Code that does not compile, for the languages with a compile stage.
COMPILE_ERROR = {
    "cpp": "int main() { return undefined_name; }",
    "java": "public class Main { public static void main(String[] a) { undefined_name(); } }",
    "rust": "fn main() { undefined_name(); }",
    "go": "package main\nfunc main() { undefined_name() }",
    "csharp": "public class Program { public static void Main() { undefined_name(); } }",
    "D_ut": "void main() { undefined_name(); }",
    "scala": "object Main { def main(args: Array[String]): Unit = undefined_name() }",
    "verilog": "module tb; initial begin undefined_name = 1; end endmodule",
    "junit": "public class Main { void f() { undefined_name(); } }",
}
# Runs for far longer than the time-out the test gives it.
SLEEP = {
    "python": "import time\ntime.sleep(60)",
    "bash": "sleep 60",
    "cpp": "#include <unistd.h>\nint main() { sleep(60); }",
    "java": "public class Main { public static void main(String[] a) throws Exception { Thread.sleep(60000); } }",
    "nodejs": "setTimeout(() => {}, 60000);",
    "typescript": "const wait: number = 60000;\nsetTimeout(() => {}, wait);",
    "rust": "fn main() { std::thread::sleep(std::time::Duration::from_secs(60)); }",
    "perl": "sleep 60;",
    "go": 'package main\nimport "time"\nfunc main() { time.Sleep(60 * time.Second) }',
    "go_test": 'package main\nimport (\n"testing"\n"time"\n)\nfunc TestSlow(t *testing.T) { time.Sleep(60 * time.Second) }',
    "php": "sleep(60);",
    "ruby": "sleep 60",
    "lua": 'os.execute("sleep 60")',
    "R": "Sys.sleep(60)",
    "racket": "#lang racket\n(sleep 60)",
    "csharp": "public class Program { public static void Main() { System.Threading.Thread.Sleep(60000); } }",
    "D_ut": "import core.thread;\nvoid main() { Thread.sleep(dur!(\"seconds\")(60)); }",
    "scala": "object Main { def main(args: Array[String]): Unit = Thread.sleep(60000) }",
    "kotlin_script": "Thread.sleep(60000)",
    "verilog": "module tb; initial begin forever #1; end endmodule",
    "jest": "test('slow', async () => { await new Promise(r => setTimeout(r, 60000)); }, 120000);",
    "junit": "import org.junit.jupiter.api.Test;\npublic class SlowTest { @Test void slow() throws Exception"
             " { Thread.sleep(60000); } }",
    "pytest": "import time\n\ndef test_slow():\n    time.sleep(60)\n",
}
RUNNER_VERDICT = {"gtest": ("[  PASSED  ] 1 test", "[  FAILED  ] 1 test"), "go_test": ("ok", "Not equal"), "junit": ("1 tests successful", "1 tests failed"),
                  "jest": ("1 passed", "1 failed"), "pytest": ("1 passed", "1 failed"),
                  "D_ut": ("1 modules passed unittests", "unittest failure")}
UNINSTALLABLE = sorted(name for name, source in SOURCES.items() if source.unavailable)
LONG: dict[str, Any] = {"compile_timeout": 180, "run_timeout": 90}
# Generous for JVM start-up: a time-out must come from the sleep, not from a slow launcher.
SLEEP_LIMITS: dict[str, Any] = {"compile_timeout": 180, "run_timeout": 10}


@pytest.fixture(scope="module")
def results(sf_server: ServerHandle) -> dict[str, dict]:
    """Every per-language case of this module, keyed `kind/language`."""
    cases = {f"double/{lang}": (code, lang, {"stdin": "21\n", **LONG}) for lang, code in DOUBLE.items()}
    cases |= {f"compile/{lang}": (code, lang, LONG) for lang, code in COMPILE_ERROR.items()}
    cases |= {f"sleep/{lang}": (code, lang, SLEEP_LIMITS) for lang, code in SLEEP.items()}
    for lang, template in TEST_RUNNERS.items():
        cases[f"passing/{lang}"] = (template.format(body="n * 2"), lang, LONG)
        cases[f"failing/{lang}"] = (template.format(body="n + 2"), lang, LONG)
    return run_code_batch(sf_server, cases)


@pytest.fixture(scope="module")
def available(sf_server: ServerHandle) -> set[str]:
    return set(requests.get(sf_server.url + "/health").json()["languages"])


def test_every_installable_language_is_available(available: set[str]) -> None:
    installable = {name for name, source in SOURCES.items() if not source.unavailable}
    assert installable - available == set(), "run `verl-sf languages install all` first"
    assert available & set(UNINSTALLABLE) == set()


@pytest.mark.parametrize("language", sorted(DOUBLE))
def test_hello_with_stdin(results: dict[str, dict], language: str) -> None:
    body = results[f"double/{language}"]
    assert body["status"] == "Success", body
    assert body["run_result"]["stdout"].strip() == "42", body


@pytest.mark.parametrize("language", sorted(COMPILE_ERROR))
def test_compile_error_is_failed_with_no_run_result(results: dict[str, dict], language: str) -> None:
    body = results[f"compile/{language}"]
    assert body["status"] == "Failed", body
    assert body["run_result"] is None
    assert body["compile_result"]["status"] == "Finished" and body["compile_result"]["return_code"] != 0
    assert "undefined_name" in body["compile_result"]["stdout"] + body["compile_result"]["stderr"]


@pytest.mark.parametrize("language", sorted(SLEEP))
def test_time_out(results: dict[str, dict], language: str) -> None:
    body = results[f"sleep/{language}"]
    assert body["status"] == "Failed", body
    assert body["run_result"]["status"] == "TimeLimitExceeded", body


@pytest.mark.parametrize("language", sorted(TEST_RUNNERS))
@pytest.mark.parametrize("verdict", ["passing", "failing"])
def test_language_test_runner(results: dict[str, dict], language: str, verdict: str) -> None:
    body = results[f"{verdict}/{language}"]
    assert body["status"] == ("Success" if verdict == "passing" else "Failed"), body
    run = body["run_result"]
    assert run["status"] == "Finished"
    assert RUNNER_VERDICT[language][verdict == "failing"] in run["stdout"] + run["stderr"], body


@pytest.mark.parametrize("language", UNINSTALLABLE)
def test_uninstallable_language_is_a_clear_sandbox_error(sf_server: ServerHandle, language: str) -> None:
    body = run_code(sf_server, "x", language=language)
    assert body["status"] == "SandboxError"
    assert repr(language) in body["message"] and "cannot be installed here" in body["message"], body
    assert body["run_result"] is None and body["compile_result"] is None


def test_unknown_language_is_rejected_at_the_edge(sf_server: ServerHandle) -> None:
    response = requests.post(sf_server.run_code_url, json={"code": "x", "language": "cobol"}, timeout=30)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "language"]


def test_scala_without_an_object_fails_as_in_sandbox_fusion(sf_server: ServerHandle) -> None:
    body = run_code(sf_server, "println(1)", language="scala")
    assert body["status"] == "Failed" and body["run_result"] is None
    assert body["compile_result"]["stderr"] == "Object name not found."


def test_runtime_failure_of_compiled_code(sf_server: ServerHandle) -> None:
    body = run_code(sf_server, "#include <cstdlib>\nint main(){ std::abort(); }", language="cpp")
    assert body["status"] == "Failed"
    assert body["compile_result"]["return_code"] == 0
    assert body["run_result"]["return_code"] == -6


def test_programs_get_the_default_sigpipe(sf_server: ServerHandle) -> None:
    """As from a shell: `yes` dies of SIGPIPE when `head` is done (with it ignored, as Python
    itself has it, `yes` would exit 1 complaining of a broken pipe)."""
    body = run_code(sf_server, 'yes | head -n 2; echo "${PIPESTATUS[0]}"', language="bash")
    assert body["run_result"]["stdout"] == "y\ny\n141\n", body


def test_pytest_mode_counts_each_test(sf_server: ServerHandle) -> None:
    code = "def add(a, b):\n    return a + b\n\ndef test_ok():\n    assert add(1, 2) == 3\n\ndef test_bad():\n    assert add(1, 1) == 3\n"
    body = run_code(sf_server, code, language="pytest", run_timeout=30)
    assert body["status"] == "Failed"
    assert "1 failed, 1 passed" in body["run_result"]["stdout"]


def test_a_compiled_programs_output_is_never_lost(sf_server: ServerHandle) -> None:
    """The program's first output can reach the zygote together with the end of the compile stage;
    it belongs to the run, whatever order the two are read in."""
    source = ('#include <cstdio>\n#include <unistd.h>\nint main(){ std::printf("before\\n"); std::fflush(stdout);'
              ' usleep(100000); return 0; }\n')
    outs = [run_code(sf_server, source, language="cpp", compile_timeout=60)["run_result"]["stdout"] for _ in range(8)]
    assert outs == ["before\n"] * 8


def test_csharp_usings_the_code_has_are_not_added_twice(sf_server: ServerHandle) -> None:
    """A user's run (2026-12-06): every program starting `using System;` compiled with a CS0105
    warning (a using given twice) from the usings dotnet adds implicitly and the server prepends."""
    body = run_code(sf_server, "using System;\nusing System.Linq;\npublic class P { public static void Main() "
                               "{ Console.WriteLine(new[] { 40, 2 }.Sum()); } }", language="csharp", compile_timeout=60)
    assert body["status"] == "Success" and body["run_result"]["stdout"] == "42\n", body
    assert "CS0105" not in body["compile_result"]["stderr"], body
