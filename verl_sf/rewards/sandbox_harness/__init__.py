"""The code-test harness that runs inside the sandbox.  Standard library only: `source()` is the one program sent
with each request (as bytecode where the sandbox's Python reads ours, else as source; see `code_harness`).

Two kinds of run, each one `/run_code` request:

- `reference_run` (`reference`): the task alone, no candidate code.  Evaluates the test inputs (``random`` seeded
  with 0, as the TRL + Daytona example) and the reference's answers, and prints them as plain data (`codec`) for
  the caller to keep.
- `candidate_run` (`candidate`): the candidate's program against those inputs.  The expected answers are not in
  this run at all; the caller compares.  This process (the trusted parent: it exists before any candidate code
  does) makes itself undumpable, then forks a child (`child`) that keeps none of its descriptors (stdout and stderr
  go to a pipe the parent drains and scans, `scan`; results to another), loads a seccomp filter (`confinement`: no
  ptrace or process_vm_*, no new process, thread or program, no signals), and only then compiles the program and
  calls the function on each input.  Each result comes back as tagged JSON of exact builtin types; the parent
  checks the stream's shape and alone writes stdout.

Every line the parent prints is one JSON object: `{"suspect": [kind, detail]}` as soon as it sees something only an
exploit does, then one `{"report": ...}`.  See docs/trl.md for the threat model.

This file is the host's side only (it is not shipped): the parts' names, and how they become one program.
"""

from __future__ import annotations

import ast
import inspect
import sys
from types import ModuleType

from . import candidate, child, codec, confinement, reference, scan
from .candidate import SUSPECT_KINDS, candidate_run
from .codec import NotPlainData, decode, encode
from .reference import reference_run

__all__ = ["PARTS", "SUSPECT_KINDS", "NotPlainData", "candidate_run", "decode", "encode", "reference_run", "source"]

# In the sandbox the parts share one namespace, in this order: a part imports names of the parts before it only.
PARTS: tuple[ModuleType, ...] = (codec, confinement, child, scan, candidate, reference)


def source() -> str:
    """The parts as one program: `from __future__ import annotations` once, then each part's source in `PARTS`
    order without its `__future__` import and its imports of earlier parts, whose names are already bound there.

    Raises RuntimeError where that program would not be the parts as they run here: a name two parts bind to
    different objects, an import of a part that is not at a part's top or renames, one of a later part, or an
    import from outside the standard library."""
    bound: dict[str, object] = {}
    texts = ["from __future__ import annotations\n"]
    for part in PARTS:
        texts.append(_shipped_text(part, bound))
        for name, value in vars(part).items():
            if not name.startswith("__") and bound.setdefault(name, value) is not value:
                raise RuntimeError(f"{part.__name__} binds {name!r}, which an earlier part binds to something else")
    return "".join(texts)


def _shipped_text(part: ModuleType, bound: dict[str, object]) -> str:
    text = inspect.getsource(part)
    tree = ast.parse(text)
    dropped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) or (isinstance(node, ast.ImportFrom) and not node.level):
            modules = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if any(module.split(".")[0] not in sys.stdlib_module_names for module in modules):
                raise RuntimeError(f"{part.__name__}:{node.lineno}: the harness imports the standard library only")
        if isinstance(node, ast.ImportFrom) and (node.level or node.module == "__future__"):
            if node.level and (node not in tree.body or any(alias.asname or alias.name not in bound
                                                            for alias in node.names)):
                raise RuntimeError(f"{part.__name__}:{node.lineno}: a part imports names of earlier parts, at its "
                                   "top and without renaming them")
            dropped.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return "".join(line for number, line in enumerate(text.splitlines(True), 1) if number not in dropped)
