"""ReTool conventions for model-written code, each switchable in the tool config.

Models trained with verl's ReTool recipe often wrap the argument in a Markdown fence and
end with a bare expression expecting a REPL to show it.  Both transforms are pure string
functions so they can be tested, and reused by other rollout drivers, on their own.
"""

from __future__ import annotations

import ast
import re

_PYTHON_FENCE = re.compile(r"```(?:python|py)[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)

# The REPL's own name for the last value; assigned after all user code has run.
_RESULT_NAME = "_"


def extract_python_block(text: str) -> str:
    """The first ```python fenced block of `text`, or `text` unchanged when there is none."""
    match = _PYTHON_FENCE.search(text)
    return match.group(1).strip("\n") if match else text


def print_last_expression(code: str) -> str:
    """Make a trailing bare expression print its value, as a REPL would.

    Only the last top-level statement is touched, in place (same line numbers, so
    tracebacks still point at the model's lines), and only when it is an expression:
    `x` becomes `_ = (x); _ is None or print(_)`, so `print(...)` or `f()` returning None
    adds nothing.  Code that does not parse is returned unchanged: running it shows the model
    its SyntaxError.
    """
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return code
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return code
    node = tree.body[-1]
    lines = code.splitlines(keepends=True)
    start, end = node.lineno - 1, (node.end_lineno or node.lineno) - 1
    start_col = _char_offset(lines[start], node.col_offset)
    end_col = _char_offset(lines[end], node.end_col_offset or 0)
    expression = "".join(lines[start:end + 1])
    if start == end:
        expression = expression[start_col:end_col]
    else:
        expression = lines[start][start_col:] + "".join(lines[start + 1:end]) + lines[end][:end_col]
    # One line, so a traceback quotes something close to what the model wrote.
    replacement = f"{_RESULT_NAME} = ({expression}); {_RESULT_NAME} is None or print({_RESULT_NAME})"
    # Keep what precedes the expression on its first line (e.g. `x = 1; x`) and what
    # follows it on its last line (a comment).
    head = lines[start][:start_col]
    tail = lines[end][end_col:]
    return "".join(lines[:start]) + head + replacement + tail


def _char_offset(line: str, byte_offset: int) -> int:
    """ast reports UTF-8 byte columns; slicing needs character columns."""
    return len(line.encode("utf-8")[:byte_offset].decode("utf-8", errors="ignore"))
