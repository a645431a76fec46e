"""scripts/benchmark_cells.py times cells on two servers in turn and prints the difference."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "benchmark_cells.py"


def test_compares_a_cell_with_a_baseline_checkouts(tmp_path: Path) -> None:
    output = tmp_path / "cells.json"
    # This checkout as its own baseline: both servers answer, and the difference is theirs alone.
    result = subprocess.run([sys.executable, str(SCRIPT), "--baseline", str(ROOT), "--calls", "5", "--warmup", "1",
                             "--mixed", "--output", str(output)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "a cell costs" in result.stdout and "/run_code:" in result.stdout
    written = json.loads(output.read_text())
    rows = {(row["server"], row["api"]): row for row in written["results"]}
    assert set(rows) == {(server, api) for server in ("baseline", "this") for api in ("/run_jupyter", "/run_code")}
    assert all(row["calls"] == 5 and 0 < row["p50_ms"] <= row["p99_ms"] for row in rows.values())
    cells = rows["this", "/run_jupyter"]["p50_ms"] - rows["baseline", "/run_jupyter"]["p50_ms"]
    assert abs(written["cell_p50_delta_ms"] - cells) < 1e-9
