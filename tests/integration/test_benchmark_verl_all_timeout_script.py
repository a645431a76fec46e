"""scripts/benchmark_verl_all_timeout.py runs verl's all-timeout case through verl's own client and
reports every verdict, none an API error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "benchmark_verl_all_timeout.py"


def test_every_case_is_a_time_out_or_a_run_error_never_an_api_error(tmp_path: Path) -> None:
    output = tmp_path / "all-timeout.json"
    result = subprocess.run([sys.executable, str(SCRIPT), "--rounds", "1", "--cases", "6", "--timeout", "2",
                             "--output", str(output)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    (only,) = json.loads(output.read_text())["rounds"]
    assert only["api_errors"] == 0 and sum(only["verdicts"].values()) == 6, only
    # A time-out, a run error (the memory kill), or a wrong answer where a case had the CPU to finish.
    assert set(only["verdicts"]) <= {"-3", "-2", "False"}, only
    assert "round 1:" in result.stdout
