"""The Python program a turn runs: the turn's code behind one line of set-up.

The set-up (verl-tool's pre-imports, and in replay mode the silent re-run of earlier turns) sits
on the program's first line, so the turn's own code keeps its line numbers plus one.
"""

from __future__ import annotations

from collections.abc import Sequence

# What verl-tool's python_code imports before every program: star-imports first, then the modules
# themselves, so `sqrt(2)` and `math.sqrt(2)` both work as they did there.
STAR_IMPORTED = ("string", "re", "datetime", "collections", "heapq", "bisect", "copy", "math", "random",
                 "statistics", "itertools", "functools", "operator", "io", "sys", "json", "builtins", "typing")
MODULE_IMPORTED = ("string", "re", "datetime", "collections", "heapq", "bisect", "copy", "math", "random",
                   "statistics", "itertools", "functools", "operator", "io", "sys", "json")
PRE_IMPORT = "; ".join([*(f"from {module} import *" for module in STAR_IMPORTED),
                        f"import {', '.join(MODULE_IMPORTED)}", "sys.setrecursionlimit(6 * 10**5)"])

# Runs inside the sandbox.  Earlier turns are re-run statement by statement for the names they
# define; what they print, read or raise stays hidden, as in verl-tool, and an error in one
# statement does not stop the next.  Code that does not parse is salvaged as verl-tool does it:
# each group of lines that parses on its own runs.
REPLAY_HELPER = '''
def _verl_sf_replay(blocks, namespace):
    import io, sys
    streams = sys.stdin, sys.stdout, sys.stderr
    sys.stdin, sys.stdout, sys.stderr = io.StringIO(), io.StringIO(), io.StringIO()
    try:
        for block in blocks:
            for piece in _verl_sf_pieces(block):
                try:
                    exec(piece, namespace)
                except (Exception, SystemExit):
                    pass
    finally:
        sys.stdin, sys.stdout, sys.stderr = streams


def _verl_sf_pieces(block):
    import ast
    try:
        tree = ast.parse(block)
    except SyntaxError:
        pieces, pending = [], []
        for line in block.splitlines():
            pending.append(line)
            if not line.strip() or line.strip().startswith("#"):
                continue
            try:
                ast.parse("\\n".join(pending))
            except SyntaxError:
                continue
            pieces.append("\\n".join(pending))
            pending = []
        return pieces
    return [compile(ast.Module(body=[node], type_ignores=[]), "<earlier turn>", "exec") for node in tree.body]
'''


def build_program(code: str, *, pre_import: bool, earlier: Sequence[str] = ()) -> str:
    """`code` preceded by the pre-imports and the silent replay of `earlier` turns' code, when asked for."""
    setup = [PRE_IMPORT] if pre_import else []
    if earlier:
        setup.append(f"exec({REPLAY_HELPER!r}); _verl_sf_replay({list(earlier)!r}, globals()); "
                     "del _verl_sf_replay, _verl_sf_pieces")
    return "; ".join(setup) + "\n" + code if setup else code
