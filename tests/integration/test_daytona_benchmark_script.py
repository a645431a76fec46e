"""scripts/benchmark_daytona.py measures the Daytona API beside /run_code on a server it starts, and reports both."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "benchmark_daytona.py"


def test_measures_both_apis_and_the_pool_setup(tmp_path: Path) -> None:
    output = tmp_path / "daytona.json"
    result = subprocess.run([sys.executable, str(SCRIPT), "--concurrency", "1", "3", "--warmup", "0", "--iterations",
                             "2", "--scenarios", "simple_stdout", "runtime_error", "--output", str(output)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    measured = json.loads(output.read_text())
    assert measured["setup"]["sandbox_count"] == 3 and 0 < measured["setup"]["p50_create_s"] < 30
    rows = {(r["api"], r["scenario"], r["concurrency"]): r for r in measured["results"]}
    assert set(rows) == {(api, scenario, c) for api in ("daytona run_code", "sandbox-fusion /run_code")
                         for scenario in ("simple_stdout", "runtime_error") for c in (1, 3)}
    for (_, _, concurrency), row in rows.items():
        assert row["calls"] == 2 * concurrency and row["failures"] == 0 and row["throughput_calls_per_s"] > 0
    assert "teardown: 3 sandboxes deleted" in result.stdout
