"""No false passes: in every language, a failing assertion is `Failed` and a passing one `Success`.

MultiPL-E style tests are assert statements; a language that runs with assertions off
(java without -ea, C++ with NDEBUG, rust's debug_assert! under -O, dmd -release) would score
every wrong candidate as right.
"""

from __future__ import annotations

import pytest

from tests.server_fixtures import ServerHandle, run_code

# language -> program template; `{cond}` is the asserted condition in that language's syntax.
ASSERT_PROGRAMS = {
    "python": "assert {cond}",
    "cpp": "#include <cassert>\nint main() {{ assert({cond}); return 0; }}",
    "java": "public class Main {{ public static void main(String[] args) {{ assert {cond}; }} }}",
    "nodejs": 'const assert = require("assert");\nassert.ok({cond});',
    "rust": "fn main() {{ debug_assert!({cond}); }}",
    "perl": 'use strict;\ndie "assertion failed\\n" unless ({cond});',
}
FAILING, PASSING = "1 + 1 == 3", "1 + 1 == 2"


@pytest.mark.parametrize("language", sorted(ASSERT_PROGRAMS))
@pytest.mark.parametrize(("cond", "verdict"), [(FAILING, "Failed"), (PASSING, "Success")], ids=["failing", "passing"])
def test_assertion_verdict(sf_server: ServerHandle, language: str, cond: str, verdict: str) -> None:
    body = run_code(sf_server, ASSERT_PROGRAMS[language].format(cond=cond), language=language,
                    compile_timeout=120, run_timeout=60)
    assert body["status"] == verdict, body
    assert body["run_result"]["status"] == "Finished", body
    assert (body["run_result"]["return_code"] == 0) == (verdict == "Success"), body
