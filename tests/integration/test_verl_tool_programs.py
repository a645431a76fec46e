"""verl-tool's replay programs (`build_program`), run as `python main.py` runs them: in a child interpreter."""

from __future__ import annotations

import subprocess
import sys

from verl_sf.verl_tool.programs import build_program


def _run(program: str, stdin: str = "") -> subprocess.CompletedProcess:
    """A program as `python main.py` runs it (a child, so the pre-imports' recursion limit stays there)."""
    return subprocess.run([sys.executable, "-c", program], input=stdin, capture_output=True, text=True, timeout=60)


def test_pre_imports_make_verl_tools_star_imports_available() -> None:
    result = _run(build_program("print(sqrt(16), math.floor(2.5), Counter('aab')['a'], deque([1]))", pre_import=True))
    assert result.stdout == "4.0 2 2 deque([1])\n", result.stderr


def test_replayed_turns_define_names_silently_and_keep_going_past_errors() -> None:
    earlier = ["x = 10\nprint('turn 1 output')", "def f(y):\n    return x * y\nraise ValueError('turn 2 error')\nz = 3",
               "import sys\nsys.exit(4)", "w = input()"]
    result = _run(build_program("print(f(2) + z)", pre_import=False, earlier=earlier), stdin="current stdin\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "23\n" and result.stderr == ""


def test_replayed_turns_do_not_consume_the_current_turns_stdin() -> None:
    result = _run(build_program("print(input())", pre_import=False, earlier=["a = input()"]), stdin="mine\n")
    assert result.stdout == "mine\n", result.stderr


def test_replay_salvages_earlier_code_that_does_not_parse() -> None:
    earlier = ["a = 1\nif True:\nprint('bad indent')\nb = 2\n"]
    result = _run(build_program("print(a, 'b' in globals())", pre_import=False, earlier=earlier))
    assert result.stdout == "1 False\n", result.stderr


def test_earlier_code_survives_quotes_and_backslashes() -> None:
    earlier = ['s = """triple \'\'\' quotes"""\nt = "back\\\\slash\\n"']
    result = _run(build_program("print(repr(s), repr(t))", pre_import=False, earlier=earlier))
    assert result.stdout == repr("triple ''' quotes") + " " + repr("back\\slash\n") + "\n", result.stderr


def test_the_turns_code_starts_on_line_two_of_the_program() -> None:
    result = _run(build_program("x = 1\nraise ValueError('here')", pre_import=True, earlier=["y = 2"]))
    assert 'line 3, in <module>' in result.stderr and result.stderr.rstrip().endswith("ValueError: here")
