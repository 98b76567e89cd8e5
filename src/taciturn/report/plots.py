"""Plots (PNG) made from a run directory alone, so any run, old or new, can be re-plotted."""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from taciturn.report.figures import save
from taciturn.report.lazy import analysis_plots, has_analysis
from taciturn.report.rundir import RunDir, RunDirError

Series = list[tuple[str, list[dict]]]  # (label, metrics rows)


def metric_keys(metric: str) -> tuple[str, ...]:
    """The columns of a federated run's metrics that plots and summaries read (all numbers)."""
    return (
        *("round", metric, "loss", "bytes_up", "bytes_down", "messages_up", "messages_down"),
        *("delivered_up", "delivered_down", "rejected", "failed", "wall_s"),
    )


def bytes_per_round(ledger: Path) -> dict[str, dict[int, int]]:
    """{'up': {round: bytes sent}, 'down': {...}} from a ledger file."""
    totals: dict[str, dict[int, int]] = {"up": defaultdict(int), "down": defaultdict(int)}
    if ledger.exists():
        with ledger.open(newline="") as f:
            for number, row in enumerate(csv.DictReader(f), 2):
                try:
                    totals[row["direction"]][int(row["round"])] += int(row["bytes_sent"])
                except (KeyError, ValueError, TypeError):
                    raise RunDirError(
                        f"{ledger} line {number} is not a ledger row; the file is damaged"
                    ) from None
    return totals


def accuracy_vs_round(series: Series, path: Path, metric: str = "accuracy") -> Path:
    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(10, 3.8))
    for label, rows in series:
        rounds = [r["round"] for r in rows]
        ax_acc.plot(rounds, [r[metric] for r in rows], label=label)
        ax_loss.plot(rounds, [r["loss"] for r in rows], label=label)
    ax_acc.set(xlabel="round", ylabel=f"test {metric}", title=f"{metric} vs round")
    ax_loss.set(xlabel="round", ylabel="test loss", title="Loss vs round")
    for ax in (ax_acc, ax_loss):
        ax.grid(alpha=0.3)
    if len(series) > 1:
        ax_acc.legend()
    return save(fig, path)


def accuracy_vs_bytes(series: Series, path: Path, metric: str = "accuracy") -> Path:
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for label, rows in series:
        total = [(r["bytes_up"] + r["bytes_down"]) / 1e6 for r in rows]
        ax.plot(total, [r[metric] for r in rows], marker=".", label=label)
    ax.set(
        xlabel="cumulative bytes, up + down (MB)", ylabel=f"test {metric}", title=f"{metric} vs communication"
    )
    ax.grid(alpha=0.3)
    if len(series) > 1:
        ax.legend()
    return save(fig, path)


def traffic_per_round(ledger: Path, path: Path) -> Path:
    totals = bytes_per_round(ledger)
    rounds = sorted(set(totals["up"]) | set(totals["down"]))
    up = np.array([totals["up"].get(r, 0) for r in rounds]) / 1e6
    down = np.array([totals["down"].get(r, 0) for r in rounds]) / 1e6
    fig, ax = plt.subplots(figsize=(6, 3.8))
    ax.bar(rounds, down, label="down (server to clients)", color="tab:blue", width=1.0)
    ax.bar(rounds, up, bottom=down, label="up (clients to server)", color="tab:orange", width=1.0)
    ax.set(xlabel="round", ylabel="MB sent", title="Bytes per round")
    ax.legend()
    return save(fig, path)


def partition_histogram(partition: dict, path: Path) -> Path:
    """Samples per client and class as a heat map (one column per client; fast for 10,000 clients)."""
    hist = np.array(partition["histogram"])
    fig, ax = plt.subplots(figsize=(10, 3.4))
    image = ax.imshow(hist.T, aspect="auto", interpolation="nearest", cmap="viridis")
    fig.colorbar(image, ax=ax, label="samples", pad=0.01)
    ax.set(xlabel="client", ylabel="class", title=f"Samples per client and class: {partition['kind']}")
    if hist.shape[1] <= 20:
        ax.set_yticks(range(hist.shape[1]))
    return save(fig, path)


def client_rows(rows: list[dict], metric: str) -> list[dict]:
    """The rows with a client-side evaluation of ``metric`` ([eval] clients): its distribution's
    numbers, and the per-client values that are numbers."""
    keys = [f"client_{metric}{part}" for part in ("", "_mean", "_min", "_p10", "_p50", "_p90", "_max")]
    return [
        row
        for row in rows
        if all(isinstance(row.get(k), int | float) and not isinstance(row.get(k), bool) for k in keys)
    ]


def client_distribution(rows: list[dict], metric: str, path: Path) -> Path:
    """The global model on each evaluated client's own held-out split, per round: every client's
    value (dots), the 10th-90th percentile band, the median, the weighted and unweighted means."""
    rows = client_rows(rows, metric)
    rounds = np.array([r["round"] for r in rows])
    fig, ax = plt.subplots(figsize=(10, 3.8))
    values = [
        (r["round"], v)
        for r in rows
        if isinstance(r.get(f"client_{metric}_by_client"), dict)
        for v in r[f"client_{metric}_by_client"].values()
        if isinstance(v, int | float) and not isinstance(v, bool)
    ]
    if values:
        x, y = np.array(values, dtype=float).T
        ax.scatter(x, y, s=6, color="0.6", alpha=0.5, label="one client", zorder=1)
    parts = ("", "_mean", "_p10", "_p50", "_p90")
    column = {part: [r[f"client_{metric}{part}"] for r in rows] for part in parts}
    ax.fill_between(rounds, column["_p10"], column["_p90"], color="tab:blue", alpha=0.2, label="p10 to p90")
    ax.plot(rounds, column["_p50"], color="tab:blue", label="median client")
    ax.plot(rounds, column[""], color="black", label="weighted by held-out size")
    ax.plot(rounds, column["_mean"], color="black", linestyle="--", label="mean over clients")
    ax.set(
        xlabel="round",
        ylabel=f"{metric} on the client's held-out data",
        title=f"The global model's {metric} on each evaluated client's own held-out split",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="best")
    return save(fig, path)


def run_plots(rundir: RunDir) -> dict[str, Path]:
    metric = rundir.primary_metric()
    rows = rundir.numeric_metrics(metric_keys(metric))
    series = [(rundir.path.name, rows)]
    plots = {
        "accuracy": accuracy_vs_round(series, rundir.plots / "accuracy_vs_round.png", metric),
        "bytes": accuracy_vs_bytes(series, rundir.plots / "accuracy_vs_bytes.png", metric),
        "traffic": traffic_per_round(rundir.ledger, rundir.plots / "bytes_per_round.png"),
    }
    if rundir.partition.exists():
        plots["partition"] = partition_histogram(rundir.read_partition(), rundir.plots / "partition.png")
    if has_analysis(rows):
        plots |= analysis_plots(rows, rundir.plots)
    if client_rows(rows, metric):
        plots["clients"] = client_distribution(rows, metric, rundir.plots / "client_distribution.png")
    return plots
