"""scripts/benchmark_profile.py samples the machine under load and puts each sample to a process
and an activity."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "benchmark_profile.py"

# `perf script -F comm,pid,ip,sym` as it prints: a header per sample, its frames innermost first.
PERF_SCRIPT = """\
python 4100
\tffffffff81234567 unmap_page_range
\tffffffff81234568 exit_mmap
\tffffffff81234569 do_exit
\tffffffff8123456a do_group_exit

verl-sf-ready 4101
\tffffffff81000001 do_wp_page
\tffffffff81000002 asm_exc_page_fault
\t00007f0000000001 _PyEval_EvalFrameDefault

python 300
\tffffffff81000003 copy_page_range
\tffffffff81000004 kernel_clone

python 200
\t00007f0000000002 _PyEval_EvalFrameDefault

swapper 0
\tffffffff81000005 pv_native_safe_halt

verl-sf-root 4102
\tffffffff81000003 copy_page_range
\tffffffff81000004 kernel_clone
"""


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("benchmark_profile", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_sample_goes_to_its_process_and_what_it_was_doing() -> None:
    profile = _script()
    samples = profile.parse(PERF_SCRIPT.splitlines())
    assert [(comm, pid) for comm, pid, _ in samples] == [("python", 4100), ("verl-sf-ready", 4101),
                                                          ("python", 300), ("python", 200), ("swapper", 0),
                                                          ("verl-sf-root", 4102)]
    roles = profile.tally(samples, {200: "server", 300: "zygote"}, cpu_seconds=1.2, runs=10)
    assert roles["run"]["activities"] == {"exit": {"share": 1 / 6, "ms_per_run": 20.0}}
    assert set(roles["child setting up"]["activities"]) == {"page fault"}
    assert set(roles["zygote"]["activities"]) == {"fork"}
    assert set(roles["server"]["activities"]) == {"user space"}
    assert set(roles["root helper"]["activities"]) == {"fork"}
    assert set(roles) == {"run", "child setting up", "zygote", "server", "idle", "root helper"}
    assert abs(sum(found["ms_per_run"] for found in roles.values()) - 120.0) < 1e-9  # 1.2 s over 10 runs


def test_profiles_a_real_server_under_load(tmp_path: Path) -> None:
    output = tmp_path / "profile.json"
    result = subprocess.run([sys.executable, str(SCRIPT), "--concurrency", "8", "--seconds", "2", "--warmup", "1",
                             "--output", str(output)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    found = json.loads(output.read_text())
    assert found["runs"] > 0 and found["cpu_ms_per_run"] > 0
    roles = found["roles"]
    # The server, its zygote, its template, runs and the children forked ahead of them all took CPU.
    assert {"server", "zygote", "template", "run", "child setting up", "load generator"} <= set(roles)
    assert "fork" in roles["template"]["activities"] and "exit" in roles["run"]["activities"]
    assert abs(sum(role["share"] for role in roles.values()) - 1.0) < 1e-6
    assert "ms of machine CPU per run" in result.stdout


def test_profiles_e2b_sandboxes_lives(tmp_path: Path) -> None:
    """`--workload e2b`: each 'run' is a sandbox's life (create, one execution, kill); its root
    helper, forked as its session's child sets up, is a role of its own."""
    output = tmp_path / "profile.json"
    result = subprocess.run([sys.executable, str(SCRIPT), "--workload", "e2b", "--concurrency", "1", "--seconds", "2",
                             "--warmup", "1", "--output", str(output)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    found = json.loads(output.read_text())
    assert found["workload"] == "e2b" and found["runs"] > 0
    assert {"server", "zygote", "run", "child setting up", "root helper", "load generator"} <= set(found["roles"])
