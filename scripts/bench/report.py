"""What a run leaves behind: summary.json, results.csv, throughput.png, and comparisons.

results.csv starts with the Daytona verl-retool guide's nine columns in its order, so tools
written for the guide's output read ours; our extra columns come after them.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Optional

from verl_sf.errors import VerlSfError

GUIDE_COLUMNS = ["scenario", "concurrency", "p50_s", "p95_s", "max_s", "mean_s", "throughput_calls_per_s",
                 "success_count", "failure_count"]
EXTRA_COLUMNS = ["measured_call_count", "timeout_count", "client_timeout_count", "error_count",
                 "p50_queue_wait_s", "p95_queue_wait_s", "peak_memory_mb", "client_cpu_ms_per_call"]
CSV_COLUMNS = GUIDE_COLUMNS + EXTRA_COLUMNS
BURST_COLUMNS = ["burst", "calls", "answered_in_time", "expected_verdicts", "client_timeouts", "errors",
                 "cpu_starved", "slowest_reply_s", "short_calls", "short_ok", "short_p50_s", "short_p99_s", "wall_s"]
"""bursts.csv (see bench/bursts.py); comparison_bursts.csv puts `label` first."""
COMPARE_COLUMNS = ["label", "backend", "scenario", "concurrency", "throughput_calls_per_s", "p50_s", "p95_s",
                   "success_count", "failure_count", "throughput_ratio_vs_baseline"]


class BadOutputDir(VerlSfError, ValueError):
    """A --compare argument is not a directory this script wrote."""


def _fmt(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 100 else f"{value:.2f}"
    return value


def write_json(path: Path, payload: dict) -> None:
    path.write_text(json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")


def write_csv(path: Path, rows: list[dict], columns: list[str]) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({key: _fmt(row.get(key)) for key in columns})


def plot_throughput(series: list[tuple[str, list[dict]]], path: Path, title: str) -> None:
    """calls/s against concurrency, one line per (label, scenario); log axes, since a warm
    interpreter and a fresh one differ by orders of magnitude."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import ScalarFormatter

    scenarios = sorted({row["scenario"] for _, rows in series for row in rows})
    colors = {name: plt.get_cmap("tab10")(i % 10) for i, name in enumerate(scenarios)}
    styles = ["-", "--", ":", "-."]
    markers = ["o", "s", "^", "D", "v"]
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for index, (label, rows) in enumerate(series):
        for scenario in scenarios:
            points = sorted((r["concurrency"], r["throughput_calls_per_s"]) for r in rows if r["scenario"] == scenario)
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], color=colors[scenario],
                        linestyle=styles[index % len(styles)], marker=markers[index % len(markers)],
                        label=f"{label} · {scenario}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sorted({row["concurrency"] for _, rows in series for row in rows}))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.set_xlabel("concurrent calls")
    ax.set_ylabel("throughput (calls/s)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def load_run(directory: Path) -> dict:
    """One earlier run's summary.json, or a BadOutputDir naming what is missing."""
    summary_path = directory / "summary.json"
    if not summary_path.is_file():
        raise BadOutputDir(f"--compare {directory}: no summary.json there "
                           "(expected an outputs/<backend>/<time> directory)")
    try:
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise BadOutputDir(f"--compare {directory}: summary.json is not valid JSON ({exc})") from None
    if not isinstance(summary, dict) or "results" not in summary or "backend" not in summary:
        raise BadOutputDir(f"--compare {directory}: summary.json lacks 'backend'/'results'; not written by this script")
    return summary


def compare(summaries: list[dict], out_dir: Path, baseline: str) -> list[dict]:
    """One chart and one table over several runs, with throughput ratios against the run whose
    backend is `baseline` (measured on the same machine, ideally in the same invocation)."""
    base = next((s for s in summaries if s["backend"] == baseline), None)
    base_rate = {(r["scenario"], r["concurrency"]): r["throughput_calls_per_s"]
                 for r in (base["results"] if base else [])}
    rows = []
    for summary in summaries:
        for result in summary["results"]:
            reference: Optional[float] = base_rate.get((result["scenario"], result["concurrency"]))
            rows.append({**result, "label": summary.get("label", summary["backend"]), "backend": summary["backend"],
                         "throughput_ratio_vs_baseline":
                             result["throughput_calls_per_s"] / reference if reference else None})
    out_dir.mkdir(parents=True, exist_ok=True)
    bursts = [{**row, "label": s.get("label", s["backend"])} for s in summaries for row in s.get("bursts", [])]
    if bursts:
        write_csv(out_dir / "comparison_bursts.csv", bursts, ["label", *BURST_COLUMNS])
    if rows:
        write_csv(out_dir / "comparison.csv", rows, COMPARE_COLUMNS)
        title = f"throughput by backend (ratios vs {baseline} in comparison.csv)" if base else "throughput by backend"
        plot_throughput([(s.get("label", s["backend"]), s["results"]) for s in summaries],
                        out_dir / "throughput.png", title)
    return rows
