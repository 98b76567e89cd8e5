"""Plots of a run's lazy-training analysis columns (engine/analysis.py), from metrics.jsonl alone."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from taciturn.core.folder import Folder
from taciturn.report.figures import Png, save

# column -> (panel title, y label); all are distances, shown on log axes
DISTANCES = {
    "divergence": ("Client divergence", r"$\sum_i p_i \|\theta_i - \bar\theta\|$"),
    "weight_change": ("Weight change", r"RMSE$(w_t, w_0)$"),
    "ntk_change": ("NTK change", r"$\|\Theta_t - \Theta_0\|_F \,/\, \|\Theta_0\|_F$"),
    "linearization_rmse": ("Distance to the linearised model", r"RMSE$(f, f_{lin})$ on probe points"),
    "centralized_output_rmse": ("FedAvg vs centralized: outputs", "RMSE on probe points"),
    "centralized_param_rmse": ("FedAvg vs centralized: weights", "RMSE of the weights"),
}

COLUMNS = (*DISTANCES, "centralized_loss", "centralized_accuracy", "centralized_train_loss")


def has_analysis(rows: list[dict]) -> bool:
    return any(key in row for row in rows for key in DISTANCES)


def analysis_plots(rows: list[dict], folder: Folder, below: str) -> dict[str, Png]:
    """``analysis.png`` (distances vs round, log scale) and, with a centralized twin,
    ``centralized.png`` (FedAvg and centralized test loss and accuracy vs round)."""
    made: dict[str, Png] = {}
    keys = [k for k in DISTANCES if any(row.get(k) is not None for row in rows)]
    if keys:
        cols = min(3, len(keys))
        grid_rows = (len(keys) + cols - 1) // cols
        fig, _ = plt.subplots(grid_rows, cols, figsize=(4.2 * cols, 3.3 * grid_rows))
        for ax, key in zip(fig.axes, keys, strict=False):
            points = [(r["round"], r[key]) for r in rows if r.get(key) is not None and r[key] > 0]
            if points:
                ax.plot(*zip(*points, strict=True), marker=".")
                ax.set_yscale("log")
            ax.set(title=DISTANCES[key][0], xlabel="round", ylabel=DISTANCES[key][1])
            ax.grid(alpha=0.3, which="both")
        for ax in fig.axes[len(keys) :]:
            ax.axis("off")
        made["analysis"] = save(fig, folder, f"{below}/analysis.png")
    if any("centralized_loss" in row for row in rows):
        fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 3.8))
        rounds = [r["round"] for r in rows]
        for label, loss, acc in (
            ("FedAvg", "loss", "accuracy"),
            ("centralized", "centralized_loss", "centralized_accuracy"),
        ):
            ax_loss.plot(rounds, [r[loss] for r in rows], label=label)
            ax_acc.plot(rounds, [r[acc] for r in rows], label=label)
        ax_loss.set(xlabel="round", ylabel="test loss", title="Test loss, same number of steps", yscale="log")
        ax_acc.set(xlabel="round", ylabel="test accuracy", title="Test accuracy, same number of steps")
        for ax in (ax_loss, ax_acc):
            ax.grid(alpha=0.3)
            ax.legend()
        made["centralized"] = save(fig, folder, f"{below}/centralized.png")
    return made
