"""scripts/benchmark_tool_backends.py, run for real with tiny settings.

The script is run as users run it (a subprocess), against the naive subprocess baseline and a
`verl-sf serve` it starts and stops itself; the tests check what it leaves behind (columns,
counts, plots, comparisons), that it cleans up its server, and how it refuses bad input.
No numbers are asserted: benchmarks carry numbers, tests carry behaviour.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "benchmark_tool_backends.py"
sys.path.insert(0, str(SCRIPT.parent))

from bench.report import BURST_COLUMNS, CSV_COLUMNS  # noqa: E402

GUIDE_COLUMNS = ["scenario", "concurrency", "p50_s", "p95_s", "max_s", "mean_s", "throughput_calls_per_s",
                 "success_count", "failure_count"]
TINY = ["--concurrency", "1", "2", "--iterations", "2", "--warmup", "1", "--pause-ms", "5",
        "--scenarios", "simple_stdout", "runtime_error"]
SMALL_SERVER = "--server-arg=--slots=2"  # passed through to `verl-sf serve`; starts faster
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_script(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          env=env or os.environ.copy(), cwd=ROOT)


def only_subdir(path: Path) -> Path:
    children = list(path.iterdir())
    assert len(children) == 1, children
    return children[0]


def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        return list(reader.fieldnames or []), list(reader)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """One real run: subprocess baseline and a script-started verl-sf server, two scenarios."""
    out = tmp_path_factory.mktemp("bench")
    result = run_script("--backend", "subprocess", "verl-sf", *TINY, SMALL_SERVER, "--output-root", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    return out


@pytest.mark.parametrize("backend", ["subprocess", "verl-sf"])
def test_run_writes_guide_columns_and_counts(tiny_run: Path, backend: str) -> None:
    run_dir = only_subdir(tiny_run / backend)
    assert {p.name for p in run_dir.iterdir()} >= {"summary.json", "results.csv", "throughput.png"}
    assert (run_dir / "throughput.png").read_bytes()[:8] == PNG_MAGIC

    columns, rows = read_csv(run_dir / "results.csv")
    assert columns[:9] == GUIDE_COLUMNS
    assert columns == CSV_COLUMNS
    assert [(r["scenario"], int(r["concurrency"])) for r in rows] == [
        ("simple_stdout", 1), ("simple_stdout", 2), ("runtime_error", 1), ("runtime_error", 2)]
    for row in rows:
        measured = 2 * int(row["concurrency"])  # iterations x concurrency
        assert int(row["measured_call_count"]) == measured
        # Real runs of trivial code on a working backend: every call must succeed
        # (for runtime_error: fail with the expected ValueError).
        assert (int(row["success_count"]), int(row["failure_count"])) == (measured, 0), row
        assert int(row["timeout_count"]) == int(row["client_timeout_count"]) == int(row["error_count"]) == 0
        assert 0 < float(row["p50_s"]) <= float(row["p95_s"]) <= float(row["max_s"])
        assert float(row["throughput_calls_per_s"]) > 0
        assert float(row["peak_memory_mb"]) > 0
        assert float(row["client_cpu_ms_per_call"]) > 0

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["backend"] == backend
    assert summary["config"]["concurrency"] == [1, 2]
    assert (summary["config"]["warmup"], summary["config"]["iterations"], summary["config"]["pause_ms"]) == (1, 2, 5)
    assert len(summary["results"]) == 4
    assert summary["memory"]["idle_after_start_mb"] > 0


def test_server_started_by_the_script_is_stopped(tiny_run: Path) -> None:
    run_dir = only_subdir(tiny_run / "verl-sf")
    summary = json.loads((run_dir / "summary.json").read_text())
    server_log = (run_dir / "server.log").read_text()
    assert "listening on http://127.0.0.1:" in server_log
    assert summary["server"]["slots"] == 2  # --server-arg reached the server (its /health says so)
    assert summary["server"]["fast_path"] is True
    assert summary["label"] == "verl-sf --slots=2"
    # verl-sf answers with its queue wait; the benchmark reports it.
    _, rows = read_csv(run_dir / "results.csv")
    assert all(row["p50_queue_wait_s"] != "" for row in rows)
    with pytest.raises(ProcessLookupError):
        os.kill(summary["memory"]["root_pid"], 0)


def test_a_server_from_another_checkout_serves_that_checkouts_code(tmp_path: Path) -> None:
    """--checkout starts the server from that checkout's verl_sf (a baseline's), labelled with it."""
    # World-readable, as a worktree is: the sandboxes' zygotes import the package from it too.
    checkout = Path(tempfile.mkdtemp(prefix="verl-sf-baseline-"))
    try:
        checkout.chmod(0o755)
        shutil.copytree(ROOT / "verl_sf", checkout / "verl_sf", ignore=shutil.ignore_patterns("__pycache__"))
        init = checkout / "verl_sf" / "__init__.py"
        init.write_text(re.sub(r'__version__ = "[^"]*"', '__version__ = "0.0.0+baseline"', init.read_text()))
        out = tmp_path / "out"
        result = run_script("--backend", "verl-sf", "--checkout", str(checkout), *TINY, SMALL_SERVER,
                            "--output-root", str(out))
        assert result.returncode == 0, result.stdout + result.stderr
    finally:
        shutil.rmtree(checkout)
    summary = json.loads((only_subdir(out / "verl-sf") / "summary.json").read_text())
    assert summary["server"]["version"] == "0.0.0+baseline"  # its /health: the copy's code answered
    assert summary["label"] == f"verl-sf --slots=2 {checkout.name}"  # no git there: the directory names it
    assert summary["config"]["checkout"] == str(checkout)
    assert all(row["failure_count"] == 0 for row in summary["results"])


def test_terminated_run_keeps_its_levels_and_stops_its_server(tmp_path: Path) -> None:
    log = (tmp_path / "script.log").open("w")
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--backend", "verl-sf", "--concurrency", "1", "128",
                             "--iterations", "10", "--warmup", "0", "--scenarios", "simple_stdout", SMALL_SERVER,
                             "--output-root", str(tmp_path / "out")], stdout=log, stderr=log, cwd=ROOT)
    try:
        # Wait until the first level (10 calls) is saved, then stop the run in the second
        # (1,280 calls).  The server start is included in this wait.
        def first_level() -> list[Path]:
            assert proc.poll() is None, (tmp_path / "script.log").read_text()
            return list((tmp_path / "out").glob("verl-sf/*/summary.json"))

        summary_path = wait_until(first_level, 120, "the first level's summary is saved", every=0.1)[0]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGINT
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    assert "interrupted; levels measured so far are saved" in (tmp_path / "script.log").read_text()
    summary = json.loads(summary_path.read_text())
    assert [(r["concurrency"], r["measured_call_count"]) for r in summary["results"]] == [(1, 10)]
    with pytest.raises(ProcessLookupError):
        os.kill(summary["memory"]["root_pid"], 0)


def test_several_backends_are_compared_against_the_baseline(tiny_run: Path) -> None:
    compare_dir = only_subdir(tiny_run / "compare")
    assert (compare_dir / "throughput.png").read_bytes()[:8] == PNG_MAGIC
    _, rows = read_csv(compare_dir / "comparison.csv")
    assert {r["backend"] for r in rows} == {"subprocess", "verl-sf"}
    assert len(rows) == 8
    for row in rows:
        ratio = float(row["throughput_ratio_vs_baseline"])
        if row["backend"] == "subprocess":
            assert ratio == 1.0
        else:
            assert ratio > 0


def test_any_sandbox_fusion_url(sf_server, tmp_path: Path) -> None:
    """The sandbox_fusion backend drives whatever speaks the API at --url (here: a verl-sf server)."""
    result = run_script("--backend", "sandbox_fusion", "--url", sf_server.run_code_url, "--concurrency", "2",
                        "--iterations", "1", "--warmup", "0", "--scenarios", "numpy", "--output-root", str(tmp_path))
    assert result.returncode == 0, result.stderr
    _, rows = read_csv(only_subdir(tmp_path / "sandbox_fusion") / "results.csv")
    assert [(r["scenario"], r["concurrency"], r["success_count"], r["failure_count"]) for r in rows] == [
        ("numpy", "2", "2", "0")]
    assert rows[0]["peak_memory_mb"] == ""  # a server elsewhere: no process tree to watch


def test_compare_replots_earlier_runs(tiny_run: Path, tmp_path: Path) -> None:
    dirs = [str(only_subdir(tiny_run / name)) for name in ("subprocess", "verl-sf")]
    result = run_script("--compare", *dirs, "--output-root", str(tmp_path))
    assert result.returncode == 0, result.stderr
    compare_dir = only_subdir(tmp_path / "compare")
    assert (compare_dir / "throughput.png").read_bytes()[:8] == PNG_MAGIC
    _, rows = read_csv(compare_dir / "comparison.csv")
    assert len(rows) == 8


def test_compare_rejects_a_directory_it_did_not_write(tmp_path: Path) -> None:
    result = run_script("--compare", str(tmp_path), "--output-root", str(tmp_path / "out"))
    assert result.returncode == 2
    assert f"--compare {tmp_path}: no summary.json" in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args, message", [
    (["--backend", "nosuch"], "--backend: unknown 'nosuch'"),
    (["--concurrency", "0"], "--concurrency: every level must be >= 1"),
    (["--iterations", "0"], "--iterations must be >= 1"),
    (["--pause-ms", "-1"], "--pause-ms must be >= 0"),
    (["--backend", "sandbox_fusion"], "sandbox_fusion needs the server's address"),
    (["--backend", "subprocess", "--server-arg=--no-fast-path"], "--server-arg only applies to --backend verl-sf"),
    (["--backend", "subprocess", "--checkout", str(ROOT)], "--checkout needs --backend verl-sf"),
    (["--url", "http://127.0.0.1:1", "--checkout", str(ROOT)], "--checkout needs --backend verl-sf and a server the script starts"),
    (["--checkout", "/nonexistent"], "--checkout /nonexistent: no verl_sf package there"),
    (["--scenarios", "nosuch"], "invalid choice: 'nosuch'"),
    (["--scenarios"], "nothing to run: give --scenarios, --bursts, or both"),
    (["--bursts", "sleeps", "--burst-scale", "0"], "--burst-scale must be > 0"),
])
def test_bad_arguments_are_named(args: list[str], message: str, tmp_path: Path) -> None:
    result = run_script(*args, "--output-root", str(tmp_path))
    assert result.returncode == 2
    assert message in result.stderr
    assert not any(tmp_path.iterdir())


def test_bursts_alone_against_the_baseline_write_their_table_and_comparison(tmp_path: Path) -> None:
    """A tiny sleep burst (4 x sleep 60, run_timeout 5) and medium burst on both backends: every call
    answered in time with the expected verdict, in bursts.csv and the comparison."""
    result = run_script("--backend", "subprocess", "verl-sf", "--scenarios", "--bursts", "sleeps", "medium",
                        "--burst-scale", "0.0625", SMALL_SERVER, "--output-root", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    for backend in ("subprocess", "verl-sf"):
        run_dir = only_subdir(tmp_path / backend)
        columns, rows = read_csv(run_dir / "bursts.csv")
        assert columns == BURST_COLUMNS
        assert [(r["burst"], r["calls"], r["answered_in_time"], r["expected_verdicts"]) for r in rows] == [
            ("sleeps", "4", "4", "4"), ("medium", "16", "16", "16")]
        assert not (run_dir / "results.csv").exists()
        assert json.loads((run_dir / "summary.json").read_text())["results"] == []
    columns, rows = read_csv(only_subdir(tmp_path / "compare") / "comparison_bursts.csv")
    assert columns == ["label", *BURST_COLUMNS] and len(rows) == 4
    assert result.stdout.count(" bursts\n") == 2  # one terminal table per backend


def test_the_fork_bomb_burst_runs_where_a_runs_processes_are_bounded_and_nowhere_else(tmp_path: Path) -> None:
    """Two fork bombs beside five short runs: on verl-sf the bombs are answered TimeLimitExceeded in
    time and every short run is correct; the naive baseline is not given them (it bounds nothing)."""
    result = run_script("--backend", "subprocess", "verl-sf", "--scenarios", "--bursts", "bombs",
                        "--burst-scale", "0.125", SMALL_SERVER, "--output-root", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert [line.split()[0] for line in result.stdout.splitlines()
            if line.endswith("burst bombs: not run (this backend does not bound a run's processes)")] == ["subprocess"]
    assert not (tmp_path / "subprocess").exists() and not (tmp_path / "compare").exists()
    _, rows = read_csv(only_subdir(tmp_path / "verl-sf") / "bursts.csv")
    assert [(r["burst"], r["calls"], r["answered_in_time"], r["expected_verdicts"], r["short_calls"], r["short_ok"])
            for r in rows] == [("bombs", "2", "2", "2", "5", "5")], rows


def test_unavailable_backends_are_skipped_with_a_reason(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DAYTONA_API_KEY", "DAYTONA_JWT_TOKEN")}
    env["DOCKER_HOST"] = f"unix://{tmp_path}/no-docker-engine.sock"  # whether or not a docker CLI exists
    result = run_script("--backend", "daytona", "docker", *TINY, "--output-root", str(tmp_path), env=env)
    assert result.returncode == 3, result.stderr
    assert "SKIPPED daytona: DAYTONA_API_KEY is not set" in result.stderr
    assert "SKIPPED docker:" in result.stderr
    assert not any(tmp_path.glob("*/*"))  # no output directories for backends that did not run


def test_session_scenarios_run_where_sessions_exist_and_are_skipped_elsewhere(tmp_path: Path) -> None:
    result = run_script("--backend", "subprocess", "verl-sf", "--concurrency", "1", "3", "--iterations", "2",
                        "--warmup", "1", "--scenarios", "simple_stdout", "session_print", "http_ping",
                        "--session-memory", "2", SMALL_SERVER, "--output-root", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    baseline = json.loads((only_subdir(tmp_path / "subprocess") / "summary.json").read_text())
    assert baseline["skipped_scenarios"] == ["session_print", "http_ping"] and "sessions" not in baseline
    summary = json.loads((only_subdir(tmp_path / "verl-sf") / "summary.json").read_text())
    assert summary["skipped_scenarios"] == []
    rows = {(r["scenario"], r["concurrency"]): r for r in summary["results"]}
    for scenario in ("simple_stdout", "session_print", "http_ping"):
        for concurrency in (1, 3):
            row = rows[(scenario, concurrency)]
            assert (row["success_count"], row["failure_count"]) == (2 * concurrency, 0), row
    comparison = summary["sessions"]["vs_stateless"]
    assert [r["concurrency"] for r in comparison] == [1, 3]
    assert all(r["throughput_ratio"] > 0 and r["ping_p50_s"] > 0 for r in comparison)
    memory = summary["sessions"]["idle_memory"]
    assert (memory["sessions"], memory["measured"]) == (2, 2)
    assert memory["pss_mib_median"] > 0 and memory["processes_per_session"] >= 1
    assert memory["server_memory_bytes_mib_median"] > 0
    assert "idle stdlib session: Pss median" in result.stdout
