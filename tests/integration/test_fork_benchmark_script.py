"""scripts/benchmark_fork.py measures forks against rebuilding, on real sandboxes, and prints its tables."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "benchmark_fork.py"


def test_prints_fork_against_rebuild_and_the_memory_a_fork_holds() -> None:
    result = subprocess.run([sys.executable, str(SCRIPT), "--sizes-mb", "20", "--repeats", "1", "--many", "3"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    row = re.search(r"\| 20 MB \| (\d+) ms \| ([\d.]+) ms \| ([\d.]+) \| ([\d.]+) MB \| ([\d.]+) MB \| ([\d.]+) MB \|",
                    result.stdout)
    assert row is not None, result.stdout
    rebuild, fork, ratio, _, fork_private, _ = (float(value) for value in row.groups())
    assert rebuild > 0 and fork > 0 and abs(ratio - fork / rebuild) < 0.05  # printed rounded
    assert fork_private < 20  # the 20 MB of state stays shared with the parent
    many = re.search(r"3 forks of a 10 MB session in one request: (\d+) ms .* ([\d.]+) MB private", result.stdout)
    assert many is not None, result.stdout
