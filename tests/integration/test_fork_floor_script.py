"""scripts/fork_floor.py measures its floor in a clean interpreter and prints every figure."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "fork_floor.py"


def test_prints_fault_cost_and_both_floors() -> None:
    result = subprocess.run([sys.executable, str(SCRIPT), "--iterations", "50"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert float(re.search(r"RSS ([\d.]+) MiB", out).group(1)) < 40  # the stdlib list, not this package
    assert float(re.search(r"copy-on-write fault\s+([\d.]+) us", out).group(1)) > 0
    per_run = [float(x) for x in re.findall(r"([\d.]+) ms CPU per run", out)]
    assert len(per_run) == 2 and all(x > 0 for x in per_run)  # run as root here: namespaces measured too


def test_as_zygote_loads_numpy_random_without_threading() -> None:
    """The zygote's import wrapper, as the numpy interpreter uses it; without it numpy.random
    brings `threading` and its fork hook."""
    def loaded(*flags: str) -> str:
        result = subprocess.run([sys.executable, "-I", str(SCRIPT), "--iterations", "20", "--modules",
                                 "numpy,numpy.random", *flags], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        return re.search(r"threading (loaded|not loaded)", result.stdout).group(1)

    assert loaded("--as-zygote") == "not loaded"
    assert loaded() == "loaded"
