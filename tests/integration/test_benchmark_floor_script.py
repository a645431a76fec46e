"""scripts/benchmark_floor.py measures every figure of the floor, same run, and writes them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "benchmark_floor.py"


def test_prints_and_writes_the_floor_beside_an_empty_run(tmp_path: Path) -> None:
    output = tmp_path / "floor.json"
    result = subprocess.run([sys.executable, str(SCRIPT), "--calls", "20", "--rung", "namespaces",
                             "--output", str(output)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    figures = json.loads(output.read_text())["results"]
    assert set(figures) == {"fork + exit", "fork + exit, with namespaces", "empty /run_code (namespaces)",
                            "GET /v1/ping (namespaces)"}  # run as root here: the namespaced fork too
    assert all(f["calls"] == 20 and 0 < f["p50_ms"] <= f["p99_ms"] for f in figures.values())
    # An empty run holds a ping and a fork at least: the floor is below what it measures.
    assert figures["empty /run_code (namespaces)"]["p50_ms"] > figures["GET /v1/ping (namespaces)"]["p50_ms"]
    assert "empty /run_code (namespaces)" in result.stdout
