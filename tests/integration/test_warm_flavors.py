"""Each heavy library has its own warm interpreter, started on first use, chosen by the code's text."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
import requests

from tests.server_fixtures import ServerHandle, run_code, start_server, stop_server

# Which heavy libraries the run's interpreter already holds; the names are spelled so the
# probe itself does not name (and so select) any of them.
PROBE = "import sys\nprint(sorted(m for m in ('num' + 'py', 'sym' + 'py', 'sci' + 'py') if m in sys.modules))"


@pytest.fixture(scope="module")
def one_slot() -> Iterator[ServerHandle]:
    server = start_server("--sandboxes", "1")
    yield server
    stop_server(server.process)


def warm(server: ServerHandle) -> dict[str, int]:
    return requests.get(server.url + "/health", timeout=10).json()["warm_interpreters"]


def stdout(body: dict) -> str:
    assert body["status"] == "Success", body
    return body["run_result"]["stdout"].strip()


def at_start_up(probe: str) -> str:
    """What the runtime's interpreter prints for `probe` before any code of ours: where its `site`
    imports modules (packages' `.pth` files do, on some hosts) every interpreter holds them, ours too."""
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()


def test_heavy_interpreters_start_on_first_use(one_slot: ServerHandle) -> None:
    assert warm(one_slot) == {"stdlib": 1}
    assert stdout(run_code(one_slot, PROBE)) == "[]"
    assert warm(one_slot) == {"stdlib": 1}
    assert stdout(run_code(one_slot, "import numpy\n" + PROBE)) == "['numpy']"
    assert warm(one_slot) == {"stdlib": 1, "numpy": 1}


def test_code_naming_one_library_forks_from_its_interpreter(one_slot: ServerHandle) -> None:
    assert stdout(run_code(one_slot, "import sympy\n" + PROBE)) == "['sympy']"
    # scipy imports numpy itself; sympy stays out.
    assert "'sympy'" not in stdout(run_code(one_slot, "import scipy.special\n" + PROBE))


def test_numpy_interpreter_holds_numpy_random_but_not_threading(one_slot: ServerHandle) -> None:
    """`threading` registers a fork hook every run would pay for; numpy.random loads without it (where
    the runtime's interpreter does not start with it already)."""
    body = run_code(one_slot, "import numpy, sys\nprint('numpy.random' in sys.modules, 'threading' in sys.modules)")
    threading_at_start_up = at_start_up("import sys; print('threading' in sys.modules)")
    assert stdout(body) == f"True {threading_at_start_up}"


def test_the_lean_interpreter_holds_no_module_every_run_would_pay_for(one_slot: ServerHandle) -> None:
    """Fork hooks (`random`, `threading`) run in every forked run; big modules (`inspect`, pulled
    in by `dataclasses`; `shutil`'s compressors) are page-table entries every fork copies and every
    run's exit tears down.  A plain run finds none of them already imported, but those the runtime's
    interpreter itself starts with."""
    probe = ("import sys\nprint(sorted(m for m in ('random', 'threading', 'inspect', 'dataclasses', 'shutil',"
             " 'secrets', 'platform', 'lzma') if m in sys.modules))")
    assert stdout(run_code(one_slot, probe)) == at_start_up(probe)


def test_code_naming_several_libraries_forks_from_the_full_interpreter(one_slot: ServerHandle) -> None:
    body = run_code(one_slot, "import numpy, sympy\n" + PROBE)
    assert stdout(body) == "['numpy', 'scipy', 'sympy']"
    assert warm(one_slot)["full"] == 1


def test_a_small_memory_cap_before_does_not_break_a_heavy_start() -> None:
    """The slot's cgroup keeps the last run's cap; starting an interpreter must not be held to it."""
    server = start_server("--sandboxes", "1")
    try:
        assert stdout(run_code(server, "print('small')", memory_limit_MB=16)) == "small"
        body = run_code(server, "import sympy as sp\nx = sp.symbols('x')\nprint(sp.solve(x**2 - 4, x))",
                        memory_limit_MB=512)
        assert stdout(body) == "[-2, 2]"
        # And the cap applies to runs forked from it: its baseline includes the new interpreter.
        capped = run_code(server, "import sympy\nx = bytearray(300 << 20)\nprint('survived')", memory_limit_MB=64)
        assert capped["run_result"]["return_code"] == -9 and "survived" not in capped["run_result"]["stdout"]
        assert stdout(run_code(server, "import sympy\nprint(sympy.Integer(6) * 7)", memory_limit_MB=64)) == "42"
    finally:
        stop_server(server.process)


def test_preload_none_keeps_only_lean_interpreters() -> None:
    server = start_server("--sandboxes", "1", "--preload", "")
    try:
        assert stdout(run_code(server, "import numpy\n" + PROBE)) == "['numpy']"  # imported by the run itself
        assert warm(server) == {"stdlib": 1}
    finally:
        stop_server(server.process)


def test_a_trickle_of_numpy_calls_reuses_one_warm_interpreter() -> None:
    server = start_server("--sandboxes", "3")
    try:
        for _ in range(5):
            assert stdout(run_code(server, "import numpy as np\nprint(np.arange(4).sum())")) == "6"
        assert warm(server) == {"stdlib": 3, "numpy": 1}
    finally:
        stop_server(server.process)
