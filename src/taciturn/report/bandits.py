"""Plots and report.html of a bandits run, made from its run directory alone."""

from __future__ import annotations

import html
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from taciturn.core.folder import Folder
from taciturn.report.figures import Png, save
from taciturn.report.html import image, page, table
from taciturn.report.rundir import RunDir

Curves = dict[str, dict[str, np.ndarray]]  # method -> {"t": (rounds,), field: (rounds, repetitions)}
FIELDS = ("regret", "bytes_up", "bytes_down", "messages_up", "messages_down", "f1")


def curves(rows: list[dict]) -> Curves:
    """Metrics rows grouped by method, as arrays over records and repetitions."""
    out: Curves = {}
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = sorted((r for r in rows if r["method"] == method), key=lambda r: r["t"])
        out[method] = {"t": np.array([r["t"] for r in mine]), "wall_s": np.array([r["wall_s"] for r in mine])}
        for field in FIELDS:
            if mine[0].get(field) is not None:
                out[method][field] = np.array([r[field] for r in mine], dtype=float)
    return out


def _band(ax, x, values: np.ndarray, label: str) -> None:
    """Mean over repetitions, with the 10-90% band across them."""
    (line,) = ax.plot(x, values.mean(axis=1), label=label)
    if values.shape[1] > 1:
        low, high = np.percentile(values, [10, 90], axis=1)
        ax.fill_between(x, low, high, color=line.get_color(), alpha=0.15)


def regret_vs_time(data: Curves, folder: Folder, rel: str, title: str = "") -> Png:
    fig, ax = plt.subplots(figsize=(6, 4))
    for method, c in data.items():
        _band(ax, c["t"][1:], c["regret"][1:], method)  # from the first record: log scale
    ax.set(
        xlabel="step t (one agent pulls one arm)",
        ylabel="cumulative pseudo-regret",
        title=title or "Regret vs time",
    )
    ax.set_yscale("log")  # methods that pool wrongly sit orders of magnitude above the rest
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save(fig, folder, rel)


def regret_vs_bytes(data: Curves, folder: Folder, rel: str, title: str = "") -> Png:
    fig, ax = plt.subplots(figsize=(6, 4))
    for method, c in data.items():
        shared = (c["bytes_up"] + c["bytes_down"]).mean(axis=1) / 1e6
        ax.plot(shared[1:], c["regret"][1:].mean(axis=1), marker=".", markersize=3, label=method)
    ax.set(
        xlabel="bytes shared, up + down (MB)",
        ylabel="cumulative pseudo-regret",
        title=title or "Regret vs communication",
    )
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save(fig, folder, rel)


def f1_vs_time(data: Curves, folder: Folder, rel: str, title: str = "") -> Png:
    fig, ax = plt.subplots(figsize=(6, 4))
    for method, c in data.items():
        if "f1" in c:
            _band(ax, c["t"], c["f1"], method)
    ax.set(xlabel="step t", ylabel="pairwise F1 (who shares vs true clusters)", ylim=(-0.02, 1.02))
    ax.set_title(title or "Cluster recovery")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save(fig, folder, rel)


def bytes_vs_time(data: Curves, folder: Folder, rel: str) -> Png:
    fig, ax = plt.subplots(figsize=(6, 4))
    for method, c in data.items():
        _band(ax, c["t"], (c["bytes_up"] + c["bytes_down"]) / 1e6, method)
    ax.set(xlabel="step t", ylabel="bytes shared, up + down (MB)", title="Communication vs time")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save(fig, folder, rel)


def summary_rows(rows: list[dict]) -> list[dict]:
    """Final numbers per method: regret mean +- std over repetitions, traffic, F1, time."""
    out = []
    for method, c in curves(rows).items():
        regret = c["regret"][-1]
        out.append(
            {
                "method": method,
                "t": int(c["t"][-1]),
                "regret": f"{regret.mean():.0f} ± {regret.std():.0f}",
                "MB up": f"{c['bytes_up'][-1].mean() / 1e6:.3f}",
                "MB down": f"{c['bytes_down'][-1].mean() / 1e6:.3f}",
                "messages": f"{(c['messages_up'][-1] + c['messages_down'][-1]).mean():.0f}",
                "F1": f"{c['f1'][-1].mean():.2f}" if "f1" in c else "-",
                "wall s": f"{c['wall_s'][-1]:.1f}",
            }
        )
    return out


def write_report(rundir: RunDir) -> Path:
    data = curves(rundir.read_metrics())
    fs = rundir.fs
    parts = [
        f"<h1>taciturn bandits run: {html.escape(rundir.path.name)}</h1>",
        "<p>Cumulative pseudo-regret summed over agents; lines are means over the independent "
        "repetitions, bands their 10-90% range.</p>",
    ]
    rows = summary_rows(rundir.read_metrics())
    parts.append(table(list(rows[0]), [list(r.values()) for r in rows]))
    parts += ["<h2>Regret</h2>", image(regret_vs_time(data, fs, "plots/regret_vs_time.png"))]
    parts += ["<h2>Communication</h2>", image(regret_vs_bytes(data, fs, "plots/regret_vs_bytes.png"))]
    parts.append(image(bytes_vs_time(data, fs, "plots/bytes_vs_time.png")))
    if any("f1" in c for c in data.values()):
        parts += ["<h2>Cluster recovery</h2>", image(f1_vs_time(data, fs, "plots/f1_vs_time.png"))]
    parts += ["<h2>Config</h2>", f"<pre>{html.escape(rundir.read_text(rundir.config))}</pre>"]
    return page(fs, "report.html", f"taciturn: {rundir.path.name}", parts)
