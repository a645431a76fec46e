"""A traceback through /run_code, alone or in a session, is the one `python main.py` prints in /workdir.

The reference is a real `python main.py` run of the same code by the server's runtime interpreter,
in a temporary directory whose path is then read as /workdir.
"""

from __future__ import annotations

import pytest
import requests

from tests.reference_python import python_main_py
from tests.server_fixtures import ServerHandle, run_code

PROGRAMS = {
    # No trailing newline: the carets once sat one column right of the name.
    "module-level name error": "prnit(1)",
    "name error in a function": "def scale(y):\n    factor = 2\n    return y * facto\n\nprint(scale(3))\n",
    "attribute error": "import math\nprint('before')\nmath.sqr(2)\n",
    "method of a str with wide characters": "word = 'naïve ✓'\nword.uper()",
    "chained exceptions": "try:\n    {}['key']\nexcept KeyError as exc:\n    raise ValueError('no key') from exc\n",
    "exception during handling": "try:\n    1 / 0\nexcept ZeroDivisionError:\n    int('x')\n",
    "syntax error": "x = (1 +\n",
}
HINTED = {"module-level name error", "name error in a function", "attribute error", "method of a str with wide characters"}


@pytest.mark.parametrize("name", PROGRAMS)
def test_a_traceback_is_the_one_python_main_py_prints(sf_server: ServerHandle, name: str) -> None:
    code = PROGRAMS[name]
    stdout, stderr = python_main_py(code, "/workdir/")
    assert stderr.endswith("\n") and ("Did you mean" in stderr) == (name in HINTED)  # CPython 3.10+ hints
    run = run_code(sf_server, code)["run_result"]
    assert (run["stdout"], run["stderr"]) == (stdout, stderr)
    session = requests.post(sf_server.url + "/sessions", json={"language": "python"}, timeout=60).json()["session_id"]
    try:
        call = run_code(sf_server, code, session_id=session)["run_result"]
        assert (call["stdout"], call["stderr"]) == (stdout, stderr)
    finally:
        requests.delete(f"{sf_server.url}/sessions/{session}", timeout=60)
