"""Plots and report.html of a FedQ run, made from its run directory alone."""

from __future__ import annotations

import html
import math
import tomllib
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from taciturn.core.codec import decode
from taciturn.core.folder import Folder, as_folder
from taciturn.report import plots
from taciturn.report.figures import Png, save
from taciturn.report.html import _labels, image, page, table
from taciturn.report.rundir import RunDir
from taciturn.rl.analysis import log_slope, steady_state_slope
from taciturn.rl.mdp import TabularMDP

MDP_FILE = "mdp.safetensors"  # the MDP of the run, through the codec


def _columns(rows: list[dict], *keys: str) -> list[np.ndarray]:
    return [np.array([r[k] for r in rows], dtype=np.float64) for k in keys]


def regret_plot(rows: list[dict], agents: int, horizon: int, folder: Folder, rel: str) -> Png:
    episodes, regret, gap = _columns(rows[1:], "episodes", "regret", "policy_gap")
    total = agents * episodes  # the papers' total number of episodes M T / H
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    axes[0].plot(episodes, regret)
    axes[0].set(
        xscale="log", xlabel="episodes per agent", ylabel="regret (all agents)", title="Regret vs log T"
    )
    axes[1].plot(total, regret / np.sqrt(agents * horizon * episodes))
    axes[1].set(xlabel="total episodes M T / H", ylabel="Regret(T) / sqrt(M T)", title="Normalised regret")
    axes[2].plot(episodes, gap, ".", markersize=2, alpha=0.6)  # one point per round
    axes[2].set(
        xscale="log",
        xlabel="episodes per agent (round ends)",
        ylabel="E[V*_1 - V^pi_1] of the round's policy",
        title="Suboptimality of the policy in force",
    )
    for ax in axes:
        ax.grid(alpha=0.3)
    return save(fig, folder, rel)


def rounds_plot(rows: list[dict], horizon: int, folder: Folder, rel: str) -> tuple[Png, float]:
    episodes, rounds = _columns(rows[1:], "episodes", "round")
    start = episodes[-1] / 10 if len(episodes) else 1.0
    slope = log_slope(episodes, rounds, start)
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    ax.plot(episodes, rounds, label="rounds")
    if math.isfinite(slope):
        late = episodes >= start
        fit = rounds[late][-1] + slope * (np.log(episodes[late]) - np.log(episodes[late][-1]))
        ax.plot(episodes[late], fit, "--", label=f"slope {slope:.2f} per ln(episodes) (last decade)")
    ax.set(
        xscale="log",
        xlabel="episodes per agent",
        ylabel="communication rounds",
        title=f"Rounds vs log(episodes); steady state {steady_state_slope(horizon):.2f}",
    )
    ax.grid(alpha=0.3)
    ax.legend()
    return save(fig, folder, rel), slope


def _load(rundir: RunDir) -> tuple[list[dict], int, TabularMDP]:
    """The metrics rows, the number of agents and the MDP of a run."""
    agents = int(tomllib.loads(rundir.read_text(rundir.config))["agents"])
    mdp = TabularMDP.from_message(decode(rundir.read_bytes(MDP_FILE)))
    return rundir.read_metrics(), agents, mdp


def summary(rundir: RunDir) -> dict:
    """Headline numbers of a FedQ run."""
    rows, agents, mdp = _load(rundir)
    last, rounds = rows[-1], max(1, rows[-1]["round"])
    steps = agents * mdp.horizon * max(1, last["episodes"])  # M T
    return {
        "(H, S, A)": f"({mdp.horizon}, {mdp.states}, {mdp.actions})",
        "agents M": agents,
        "episodes per agent": last["episodes"],
        "rounds": last["round"],
        "regret (all agents)": round(last["regret"], 2),
        "regret per agent": round(last["regret"] / agents, 2),
        "Regret / sqrt(M T)": round(last["regret"] / math.sqrt(steps), 3),
        "final policy gap": f"{last['policy_gap']:.3g}",
        "V*_1 (mean over first states)": round(float(mdp.optimal[1][0] @ mdp.initial), 4),
        "Delta_min": f"{mdp.min_gap():.4g}",
        "scalars up per agent per round": round(last["scalars_up"] / rounds / agents, 1),
        "scalars down per agent per round": round(last["scalars_down"] / rounds / agents, 1),
        "MB up": round(last["bytes_up"] / 1e6, 3),
        "MB down": round(last["bytes_down"] / 1e6, 3),
        "messages up (delivered)": f"{last['messages_up']} ({last['delivered_up']})",
        "messages down (delivered)": f"{last['messages_down']} ({last['delivered_down']})",
        "uploads lost": last["uploads_lost"],
        "wall s": last["wall_s"],
    }


def write_fedq_report(rundir: RunDir) -> Path:
    rows, agents, mdp = _load(rundir)
    facts = summary(rundir)
    regret_png = regret_plot(rows, agents, mdp.horizon, rundir.fs, "plots/regret.png")
    rounds_png, slope = rounds_plot(rows, mdp.horizon, rundir.fs, "plots/rounds.png")
    traffic_png = plots.traffic_per_round(rundir, "plots/bytes_per_round.png")
    facts["rounds per ln(episodes), last decade"] = "-" if math.isnan(slope) else round(slope, 2)
    keys = ["round", "episodes", "round_episodes", "regret", "policy_gap", "case1", "case2", "scalars_up"]
    keys += ["bytes_up"]
    shown = rows if len(rows) <= 400 else [*rows[:: math.ceil(len(rows) / 400)], rows[-1]]
    body = [[f"{r[k]:.4g}" if isinstance(r[k], float) else r[k] for k in keys] for r in shown]
    parts = [
        f"<h1>taciturn FedQ run: {html.escape(rundir.path.name)}</h1>",
        table(["", "value"], [[k, v] for k, v in facts.items()]),
        "<h2>Regret</h2>",
        "<p>Exact regret: every episode adds V*_1(x_1) - V^pi_1(x_1) of the policy in force. "
        "With a positive gap Delta_min it grows like log T (ICML 2025).</p>",
        image(regret_png),
        "<h2>Communication</h2>",
        image(rounds_png),
        image(traffic_png),
        f"<details><summary>{len(rows)} rows of metrics.jsonl (up to 400 shown)</summary>"
        f"{table(keys, body, 0)}</details>",
        "<h2>Config</h2>",
        f"<pre>{html.escape(rundir.read_text(rundir.config))}</pre>",
    ]
    return page(rundir.fs, "report.html", f"taciturn: {rundir.path.name}", parts)


def write_fedq_comparison(rundirs: list[RunDir], out: Path) -> Path:
    """Several FedQ runs overlaid: regret, normalised regret and rounds against episodes."""
    folder = as_folder(out)
    labels = _labels(rundirs)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for label, rundir in zip(labels, rundirs, strict=True):
        rows, agents, mdp = _load(rundir)
        episodes, regret, rounds = _columns(rows[1:], "episodes", "regret", "round")
        axes[0].plot(episodes, regret, label=label)
        axes[1].plot(agents * episodes, regret / np.sqrt(agents * mdp.horizon * episodes), label=label)
        axes[2].plot(episodes, rounds, label=label)
    axes[0].set(
        xscale="log", xlabel="episodes per agent", ylabel="regret (all agents)", title="Regret vs log T"
    )
    axes[1].set(xlabel="total episodes M T / H", ylabel="Regret(T) / sqrt(M T)", title="Normalised regret")
    axes[2].set(xscale="log", xlabel="episodes per agent", ylabel="communication rounds", title="Rounds")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    figure = save(fig, folder, "fedq_comparison.png")
    facts = [summary(r) for r in rundirs]
    keys = list(facts[0])
    overview = table(["run", *keys], [[label, *f.values()] for label, f in zip(labels, facts, strict=True)])
    configs = "".join(
        f"<details><summary>{html.escape(label)}</summary><pre>{html.escape(r.read_text(r.config))}</pre>"
        "</details>"
        for label, r in zip(labels, rundirs, strict=True)
    )
    return page(
        folder,
        "compare.html",
        "taciturn FedQ comparison",
        ["<h1>taciturn FedQ comparison</h1>", overview, image(figure), "<h2>Configs</h2>", configs],
    )
