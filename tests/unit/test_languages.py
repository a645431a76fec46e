"""Every language whose toolchain is on this machine compiles and runs inside the sandbox."""

from __future__ import annotations

import pytest
import requests

from tests.server_fixtures import ServerHandle, run_code

PROGRAMS = {
    "python": 'print(int(input()) * 2)',
    "bash": 'read n; echo $((n * 2))',
    "cpp": '#include <iostream>\nint main(){int n; std::cin >> n; std::cout << n * 2 << std::endl;}',
    "java": 'import java.util.*;\npublic class Main { public static void main(String[] a) {'
            ' System.out.println(new Scanner(System.in).nextInt() * 2); } }',
    "nodejs": 'const n = parseInt(require("fs").readFileSync(0, "utf8")); console.log(n * 2);',
    "rust": 'use std::io::Read;\nfn main(){ let mut s = String::new(); std::io::stdin().read_to_string(&mut s).unwrap();'
            ' let n: i64 = s.trim().parse().unwrap(); println!("{}", n * 2); }',
    "perl": 'my $n = <STDIN>; print $n * 2, "\\n";',
    "go": 'package main\nimport "fmt"\nfunc main(){ var n int; fmt.Scan(&n); fmt.Println(n * 2) }',
    "php": '<?php echo intval(fgets(STDIN)) * 2, "\\n";',
    "ruby": 'puts gets.to_i * 2',
    "lua": 'print(io.read("n") * 2)',
}


@pytest.fixture(scope="module")
def available(sf_server: ServerHandle) -> set[str]:
    return set(requests.get(sf_server.url + "/health").json()["languages"])


@pytest.mark.parametrize("language", sorted(PROGRAMS))
def test_language_runs_or_names_its_missing_toolchain(sf_server: ServerHandle, available: set[str], language: str) -> None:
    body = run_code(sf_server, PROGRAMS[language], language=language, stdin="21\n", compile_timeout=60, run_timeout=20)
    if language in available:
        assert body["status"] == "Success", body
        assert body["run_result"]["stdout"].strip() == "42"
    else:
        assert body["status"] == "SandboxError"
        assert "not installed" in body["message"] and language in body["message"]


def test_this_machine_has_the_languages_ci_promises(available: set[str]) -> None:
    assert {"python", "pytest", "bash", "cpp"} <= available


def test_compile_error_is_failed_with_no_run_result(sf_server: ServerHandle) -> None:
    body = run_code(sf_server, "int main() { return undefined_name; }", language="cpp")
    assert body["status"] == "Failed"
    assert body["run_result"] is None
    assert body["compile_result"]["return_code"] != 0
    assert "undefined_name" in body["compile_result"]["stderr"]


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


def test_pytest_mode(sf_server: ServerHandle) -> None:
    code = "def add(a, b):\n    return a + b\n\ndef test_ok():\n    assert add(1, 2) == 3\n\ndef test_bad():\n    assert add(1, 1) == 3\n"
    body = run_code(sf_server, code, language="pytest", run_timeout=30)
    assert body["status"] == "Failed"
    assert "1 failed, 1 passed" in body["run_result"]["stdout"]


def test_python_slow_path_equals_fast_path_on_errors(sf_server: ServerHandle) -> None:
    # python_gpu takes the exec path (`python main.py`); python takes the warm fork.
    fast = run_code(sf_server, "raise KeyError('k')")
    slow = run_code(sf_server, "raise KeyError('k')", language="python_gpu")
    assert fast["run_result"]["stderr"] == slow["run_result"]["stderr"]
    assert fast["run_result"]["return_code"] == slow["run_result"]["return_code"] == 1


def test_a_compiled_programs_output_is_never_lost(sf_server: ServerHandle) -> None:
    """The program's first output can reach the zygote together with the end of the compile stage;
    it belongs to the run, whatever order the two are read in."""
    source = ('#include <cstdio>\n#include <unistd.h>\nint main(){ std::printf("before\\n"); std::fflush(stdout);'
              ' usleep(100000); return 0; }\n')
    outs = [run_code(sf_server, source, language="cpp", compile_timeout=60)["run_result"]["stdout"] for _ in range(8)]
    assert outs == ["before\n"] * 8
