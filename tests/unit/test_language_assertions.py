"""No false passes: in every language, a failing assertion is `Failed` and a passing one `Success`.

MultiPL-E style tests are assert statements; a language that runs with assertions off
(java without -ea, C++ with NDEBUG, rust's debug_assert! under -O, dmd -release, PHP's
production zend.assertions, mono's logging-only Debug.Assert) would score every wrong
candidate as right.
"""

from __future__ import annotations

import pytest

from tests.server_fixtures import ServerHandle, run_code_batch

INFIX = ("1 + 1 == 3", "1 + 1 == 2")
# language -> (program template with `{cond}`, failing condition, passing condition)
ASSERT_PROGRAMS = {
    "python": ("assert {cond}", *INFIX),
    "pytest": ("def test_it():\n    assert {cond}\n", *INFIX),
    "bash": ("set -e\n(( {cond} ))\necho reached", *INFIX),
    "cpp": ("#include <cassert>\nint main() {{ assert({cond}); return 0; }}", *INFIX),
    "gtest": ("#include <cassert>\n#include <gtest/gtest.h>\nTEST(A, B) {{ assert({cond}); }}", *INFIX),
    "java": ("public class Main {{ public static void main(String[] args) {{ assert {cond}; }} }}", *INFIX),
    "junit": ("import org.junit.jupiter.api.Test;\npublic class ATest {{ @Test void t() {{ assert {cond}; }} }}",
              *INFIX),
    "nodejs": ('const assert = require("assert");\nassert.ok({cond});', *INFIX),
    "typescript": ('import assert from "assert";\nassert.ok({cond});', *INFIX),
    "jest": ("test('t', () => {{ expect({cond}).toBe(true); }});", *INFIX),
    "rust": ("fn main() {{ debug_assert!({cond}); }}", *INFIX),
    "perl": ('use strict;\ndie "assertion failed\\n" unless ({cond});', *INFIX),
    "go": ('package main\nfunc main() {{ if !({cond}) {{ panic("assertion failed") }} }}', *INFIX),
    "go_test": ('package main\nimport "testing"\nfunc TestA(t *testing.T) {{ if !({cond}) {{ t.Fatal("no") }} }}',
                *INFIX),
    "php": ("assert({cond});", *INFIX),
    "ruby": ('raise "assertion failed" unless {cond}', *INFIX),
    "lua": ("assert({cond})", *INFIX),
    "R": ("stopifnot({cond})", *INFIX),
    "racket": ("#lang racket\n(unless {cond} (error \"assertion failed\"))", "(= (+ 1 1) 3)", "(= (+ 1 1) 2)"),
    "csharp": ("using System.Diagnostics;\npublic class Program {{ public static void Main() {{ Debug.Assert({cond}); }} }}",
               *INFIX),
    "D_ut": ("unittest {{ assert({cond}); }}\nvoid main() {{}}", *INFIX),
    "scala": ("object Main {{ def main(args: Array[String]): Unit = assert({cond}) }}", *INFIX),
    "kotlin_script": ("assert({cond})", *INFIX),
    "verilog": ('module tb; initial begin if (!({cond})) $fatal(1, "assertion failed"); $finish; end endmodule',
                *INFIX),
}


@pytest.fixture(scope="module")
def verdicts(sf_server: ServerHandle) -> dict[str, dict]:
    cases = {}
    for language, (template, failing, passing) in ASSERT_PROGRAMS.items():
        for kind, cond in (("failing", failing), ("passing", passing)):
            cases[f"{kind}/{language}"] = (template.format(cond=cond), language,
                                           {"compile_timeout": 180, "run_timeout": 90})
    return run_code_batch(sf_server, cases)


@pytest.mark.parametrize("language", sorted(ASSERT_PROGRAMS))
@pytest.mark.parametrize("kind", ["failing", "passing"])
def test_assertion_verdict(verdicts: dict[str, dict], language: str, kind: str) -> None:
    body = verdicts[f"{kind}/{language}"]
    assert body["status"] == ("Failed" if kind == "failing" else "Success"), body
    assert body["compile_result"] is None or body["compile_result"]["return_code"] == 0, body
    assert body["run_result"]["status"] == "Finished", body
    assert (body["run_result"]["return_code"] == 0) == (kind == "passing"), body
