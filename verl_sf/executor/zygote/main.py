"""The zygote's entry point inside the sandbox: `python -I -c BOOTSTRAP CONFIG` (see sandbox.py)."""

from __future__ import annotations

import json
import sys

from .supervisor import Zygote


def main(config_text: str, package_parent: str) -> None:
    config = json.loads(config_text)
    sys.argv = ["main.py"]  # as `python main.py` has it; set here, a run need not free ours
    if package_parent in sys.path:
        sys.path.remove(package_parent)  # runs import their own modules, never ours
    Zygote(config).serve()
