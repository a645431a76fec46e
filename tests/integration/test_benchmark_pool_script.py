"""scripts/benchmark_pool.py runs end to end in a tiny configuration and reports every path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "benchmark_pool.py"


def test_tiny_run_reports_limiter_and_all_three_paths(tmp_path: Path) -> None:
    out = tmp_path / "pool.json"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--limiter-seconds", "0.5", "--limiter-callers", "16", "--limiter-actors", "2",
         "--concurrency", "4", "--requests", "40", "--rounds", "2", "--workload", "print",
         "--server-arg=--slots=2", "--num-cpus", "2", "--json", str(out)],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert len(report["limiter"]) >= 3 and all(row["grants_per_s"] > 0 for row in report["limiter"])
    (row,) = report["e2e"]
    assert set(row["calls_per_s"]) == {"direct", "ray", "ray_actor"}
    assert all(len(rates) == 2 and min(rates) > 0 for rates in row["calls_per_s"].values())
    assert set(row["overhead_pct"]) == {"ray", "ray_actor"}
    assert row["cpu_ms_per_call"]["ray_actor"]["pool actor"] > row["cpu_ms_per_call"]["ray"]["pool actor"]
