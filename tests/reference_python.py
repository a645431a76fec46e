"""The reference a sandboxed Python run is compared with: a real `python main.py` of the same code."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile


def python_main_py(code: str, shown_directory: str) -> tuple[str, str]:
    """stdout and stderr of `python main.py` with `code`, run by this interpreter (the server's runtime)
    in a temporary directory that tracebacks then name `shown_directory` ("/workdir/", or "" for none)."""
    with tempfile.TemporaryDirectory() as directory:
        with open(os.path.join(directory, "main.py"), "w") as main:
            main.write(code)
        done = subprocess.run([sys.executable, "main.py"], cwd=directory, capture_output=True, text=True, timeout=60)
    return done.stdout, done.stderr.replace(f'File "{directory}/', f'File "{shown_directory}')
