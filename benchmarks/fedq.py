"""Benchmark: federated Q-learning against the claims of its two papers.

ICLR 2024 (Zheng et al., Figs. 1-2): S = 3, A = 2, H = 5, FedQ-Hoeffding and FedQ-Bernstein with
M = 10 agents and 3e4 episodes per agent against single-agent UCB-Hoeffding and UCB-Bernstein
(Jin et al. 2018) with 3e5 episodes, the same total; 10 sample paths on one MDP; Regret / sqrt(MT)
against total episodes, and rounds against episodes.

ICML 2025 (Zhang et al., Sec. 6): regret against log T at (H, S, A) = (2, 2, 2) and (5, 3, 2) for
M in {1, 2, 5, 10} and UCB-Hoeffding; rounds against log(episodes), counted after 1/20 of the
episodes, for sweeps of M, S and A in {2, 4, 6, 8}, with the fitted slopes.

Across instances (issue 19, point 6; statistics in fedq_instances.py): the ICLR headline and the
ICML slopes again over `instances` random MDPs (instance i = `[mdp] seed = i`), with 95% intervals
over instances, several fit windows, and a fit window x Delta_min sensitivity table.

    python benchmarks/fedq.py            # full, both parts; writes benchmarks/results/fedq.json,
                                         # docs/img/fedq_*.png and the FedQ section of docs/benchmarks.md
    python benchmarks/fedq.py --instances-only  # only the across-instance part, added to the saved results
    python benchmarks/fedq.py --quick    # smoke run of the same code at tiny scale, writes nothing
    python benchmarks/fedq.py --docs-only  # rewrite the docs section from the saved results
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import fedq_instances as across
import matplotlib.pyplot as plt
import numpy as np
from protocol import Protocol, replace_section
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from taciturn.core import Channel, Ledger, Streams
from taciturn.core.ledger import Direction
from taciturn.core.rng import SERVER
from taciturn.rl import FedQ, FedQFederation, UCBQLearning, random_mdp, ucb
from taciturn.rl.analysis import log_slope, steady_state_slope
from taciturn.rl.mdp import TabularMDP

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Federated Q-learning (FedQ)"
COMMAND = "flock /tmp/taciturn-cpu.lock env PYTHONPATH=src python benchmarks/fedq.py"
PARTS = ("single", "instances")  # one MDP per setting (the papers' protocol); across MDP instances


@dataclass(frozen=True)
class Scale:
    paths: int
    iclr_episodes: int  # per FedQ agent (M = 10); UCB runs 10x as many
    icml_episodes: dict[str, int]  # per agent, per (H, S, A) setting
    icml_agents: tuple[int, ...]
    sweep_episodes: int
    sweep_values: tuple[int, ...]
    instances: int  # random MDPs of the across-instance part
    instance_paths: int  # sample paths per instance
    windows: tuple[tuple[float, float], ...]  # fit windows besides the paper's [T / 20, T]


FULL = Scale(
    paths=10,
    iclr_episodes=30_000,
    icml_episodes={"H=2,S=2,A=2": 1_000_000, "H=5,S=3,A=2": 1_000_000},
    icml_agents=(1, 2, 5, 10),
    sweep_episodes=10_000_000,
    sweep_values=(2, 4, 6, 8),
    instances=10,
    instance_paths=1,
    windows=((1e4, 1e5), (1e5, 1e6), (1e6, 1e7)),
)
QUICK = Scale(
    paths=2,
    iclr_episodes=1_000,
    icml_episodes={"H=2,S=2,A=2": 5_000, "H=5,S=3,A=2": 2_000},
    icml_agents=(1, 2, 5, 10),
    sweep_episodes=5_000,
    sweep_values=(2, 4, 6, 8),
    instances=3,
    instance_paths=1,
    windows=((50, 500), (500, 5_000)),
)
SETTINGS = {"H=2,S=2,A=2": (2, 2, 2), "H=5,S=3,A=2": (5, 3, 2)}


def make_mdp(horizon: int, states: int, actions: int, seed: int = 0) -> TabularMDP:
    """The papers' generator, seeded as `taciturn run` seeds `[mdp] seed`."""
    return random_mdp(states, actions, horizon, Streams(seed).numpy(0, SERVER, "mdp"))


@dataclass
class FedQPath:
    episodes: np.ndarray  # per agent, at the end of each round
    regret: np.ndarray  # cumulative, all agents
    rounds: np.ndarray
    bytes_up: int
    bytes_down: int
    scalars_up: int
    policy_changes: np.ndarray  # cumulative number of (h, x) whose greedy action changed

    def regret_at(self, episodes: np.ndarray) -> np.ndarray:
        """Cumulative regret at given episode counts (linear within a round: one policy, so the
        expected regret grows linearly there)."""
        return np.interp(episodes, np.concatenate([[0], self.episodes]), np.concatenate([[0.0], self.regret]))

    def rounds_at(self, episodes: np.ndarray) -> np.ndarray:
        """Rounds started by the time each episode count is reached."""
        return np.searchsorted(self.episodes, episodes, side="left") + 1


def run_fedq(mdp: TabularMDP, agents: int, bonus: str, episodes: int, seed: int) -> FedQPath:
    """One sample path of FedQ through the same federation (Channel, Ledger) as `taciturn run`."""
    fedq = FedQ(mdp.horizon, mdp.states, mdp.actions, agents, bonus)
    ledger, streams = Ledger(), Streams(seed)
    federation = FedQFederation(mdp, fedq, Channel(ledger, streams), streams)
    state, done, regret, scalars, changes = fedq.init(), 0, 0.0, 0, 0
    ends, regrets, switches = [], [], []
    while done < episodes:
        state, record = federation.run_round(state, len(ends) + 1, episodes - done)
        done += record.episodes
        regret += record.regret
        scalars += record.scalars_up
        changes += record.policy_changes
        ends.append(done)
        regrets.append(regret)
        switches.append(changes)
        if len(ends) % 256 == 0:
            ledger.forget_before(len(ends))  # keep the totals, not per-round rows
    return FedQPath(
        np.array(ends),
        np.array(regrets),
        np.arange(1, len(ends) + 1),
        ledger.totals(Direction.UP).bytes_sent,
        ledger.totals(Direction.DOWN).bytes_sent,
        scalars,
        np.array(switches),
    )


def run_ucb(mdp: TabularMDP, bonus: str, episodes: int, seeds: list[int], grid: np.ndarray) -> np.ndarray:
    """Cumulative regret (paths, len(grid)) of single-agent UCB, one path per run seed, as one batch."""
    learner = UCBQLearning(mdp, len(seeds), bonus)
    return ucb.run(learner, episodes, [Streams(seed) for seed in seeds], grid)


def fit_windows(scale: Scale) -> list[tuple[float, float]]:
    """The paper's window [T / 20, T] first (ICML 2025 counts rounds after 5e5 of 1e7), then the others."""
    paper = (scale.sweep_episodes / 20, float(scale.sweep_episodes))
    return [paper, *(w for w in scale.windows if w != paper)]


def quantiles(values: np.ndarray) -> np.ndarray:
    """Median, 10th and 90th percentile over paths (axis 0)."""
    return np.percentile(values, [50, 10, 90], axis=0)


class Bench:
    def __init__(self, scale: Scale, progress: Progress, out: Path | None, parts: tuple[str, ...] = PARTS):
        self.scale, self.progress, self.out = scale, progress, out  # out: where plots go (None: nowhere)
        self.task = progress.add_task("runs", total=self._count(parts))
        self.results: dict = {}

    def _count(self, parts: tuple[str, ...]) -> int:
        s, count = self.scale, 0
        if "single" in parts:
            count += (
                2 * s.paths
                + 2  # ICLR: FedQ-H/B paths, UCB-H/B batches
                + len(s.icml_episodes) * (len(s.icml_agents) * s.paths + 1)
                + 3 * len(s.sweep_values) * s.paths
            )
        if "instances" in parts:
            configs = {across.config(q, v) for q in across.SWEPT for v in s.sweep_values}
            count += s.instances * (2 * s.instance_paths + 2 + len(configs) * s.instance_paths)
        return count

    def step(self, what: str) -> None:
        self.progress.update(self.task, advance=1, description=what)

    # ----- ICLR 2024: Figs. 1 and 2 -----
    def iclr(self) -> dict:
        s, M = self.scale, 10
        mdp = make_mdp(5, 3, 2)
        total = M * s.iclr_episodes
        grid = np.unique(np.linspace(total / 100, total, 100).astype(np.int64))  # total episodes M T / H
        curves, rounds, facts = {}, {}, {}
        for bonus in ("hoeffding", "bernstein"):
            name = f"FedQ-{bonus[0].upper()} (M=10)"
            paths = []
            for seed in range(s.paths):
                paths.append(run_fedq(mdp, M, bonus, s.iclr_episodes, seed))
                self.step(f"ICLR {name} path {seed}")
            per_agent = grid / M
            curves[name] = np.stack([p.regret_at(per_agent) for p in paths]) / np.sqrt(
                M * mdp.horizon * per_agent
            )
            rounds[name] = np.stack([p.rounds_at(per_agent) for p in paths])
            facts[name] = {
                "rounds": float(np.median([p.rounds[-1] for p in paths])),
                "MB_up": float(np.median([p.bytes_up for p in paths]) / 1e6),
                "MB_down": float(np.median([p.bytes_down for p in paths]) / 1e6),
                "scalars_up_per_agent_round": float(paths[0].scalars_up / paths[0].rounds[-1] / M),
            }
        for bonus in ("hoeffding", "bernstein"):
            name = f"UCB-{bonus[0].upper()} (M=1)"
            regret = run_ucb(mdp, bonus, total, list(range(s.paths)), grid)
            curves[name] = regret / np.sqrt(mdp.horizon * grid)
            facts[name] = {"rounds": None}
            self.step(f"ICLR {name}")
        out = {
            "mdp": {"H": 5, "S": 3, "A": 2, "delta_min": mdp.min_gap()},
            "total_episodes": int(total),
            "normalised_regret": {
                name: dict(zip(("median", "p10", "p90"), map(float, quantiles(c)[:, -1]), strict=True))
                for name, c in curves.items()
            },
            "facts": facts,
        }
        self._plot_iclr(grid, curves, rounds, M)
        return out

    def _plot_iclr(self, grid, curves, rounds, M) -> None:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4))
        colours = {"FedQ-H": "tab:blue", "FedQ-B": "tab:orange", "UCB-H": "tab:green", "UCB-B": "tab:red"}
        for name, values in curves.items():
            median, low, high = quantiles(values)
            colour = colours[name.split(" ")[0]]
            ax1.plot(grid, median, label=name, color=colour, ls="-" if "FedQ" in name else "--")
            ax1.fill_between(grid, low, high, color=colour, alpha=0.15)
        ax1.set(
            xlabel="total episodes M T / H", ylabel="Regret(T) / sqrt(M T)", title="ICLR 2024 Fig. 1 setting"
        )
        for name, values in rounds.items():
            median, low, high = quantiles(values)
            colour = colours[name.split(" ")[0]]
            ax2.plot(grid / M, median, label=name, color=colour)
            ax2.fill_between(grid / M, low, high, color=colour, alpha=0.15)
        ax2.set(
            xlabel="episodes per agent T / H", ylabel="communication rounds", title="ICLR 2024 Fig. 2 setting"
        )
        for ax in (ax1, ax2):
            ax.grid(alpha=0.3)
            ax.legend()
        self._save(fig, "fedq_iclr.png")

    # ----- ICML 2025: regret against log T, and the 1/M pattern -----
    def icml_regret(self) -> dict:
        s = self.scale
        out, curves = {}, {}
        for setting, episodes in s.icml_episodes.items():
            H, S, A = SETTINGS[setting]
            mdp = make_mdp(H, S, A)
            grid = np.unique(np.geomspace(10, episodes, 60).astype(np.int64))
            last_decade = grid >= episodes / 10
            rows, curves[setting] = {}, {}
            for M in s.icml_agents:
                paths = []
                for seed in range(s.paths):
                    paths.append(run_fedq(mdp, M, "hoeffding", episodes, seed))
                    self.step(f"ICML {setting} FedQ-H M={M} path {seed}")
                regret = np.stack([p.regret_at(grid) for p in paths])
                curves[setting][f"FedQ-H M={M}"] = regret
                rows[str(M)] = self._regret_row(grid, regret, M, last_decade)
            regret = run_ucb(mdp, "hoeffding", episodes, list(range(s.paths)), grid)
            curves[setting]["UCB-H"] = regret
            self.step(f"ICML {setting} UCB-H")
            out[setting] = {
                "episodes_per_agent": episodes,
                "delta_min": mdp.min_gap(),
                "fedq_hoeffding": rows,
                "ucb_hoeffding": self._regret_row(grid, regret, 1, last_decade),
                "grid": grid.tolist(),
            }
        self._plot_icml_regret(out, curves)
        return out

    @staticmethod
    def _regret_row(grid, regret, M, last_decade) -> dict:
        slopes = [log_slope(grid[last_decade], r[last_decade], 0) for r in regret]
        median, low, high = quantiles(regret[:, -1])
        return {
            "final_regret": float(median),
            "final_regret_p10": float(low),
            "final_regret_p90": float(high),
            "per_agent": float(median / M),
            "slope_per_ln_T": float(np.median(slopes)),  # d regret / d ln(episodes), last decade
            "median_curve": np.median(regret, axis=0).round(3).tolist(),
        }

    def _plot_icml_regret(self, out, curves) -> None:
        settings = list(curves)
        fig, axes = plt.subplots(2, len(settings), figsize=(6.2 * len(settings), 8), squeeze=False)
        for column, setting in enumerate(settings):
            grid = np.array(out[setting]["grid"])
            ax = axes[0, column]
            for name, values in curves[setting].items():
                median, low, high = quantiles(values)
                line = ax.plot(grid, median, label=name, ls="--" if name == "UCB-H" else "-")[0]
                ax.fill_between(grid, low, high, color=line.get_color(), alpha=0.12)
            ax.set(
                xscale="log",
                xlabel="episodes per agent T / H",
                ylabel="regret, all agents",
                title=f"{setting}: regret vs log T (Delta_min {out[setting]['delta_min']:.3g})",
            )
            ax.legend(fontsize=8)
            ax = axes[1, column]
            rows = out[setting]["fedq_hoeffding"]
            M = np.array([int(m) for m in rows])
            per_agent = np.array([rows[m]["per_agent"] for m in rows])
            slope = np.array([rows[m]["slope_per_ln_T"] for m in rows]) / M
            ax.plot(M, per_agent, "o-", label="final regret per agent")
            ax.plot(M, slope, "s-", label="regret per agent per ln T (last decade)")
            ax.plot(M, per_agent[0] / M, ":", color="gray", label="1/M from M=1")
            ax.plot(M, slope[0] / M, ":", color="gray")
            ax.set(xscale="log", yscale="log", xlabel="agents M", title=f"{setting}: per-agent regret vs M")
            ax.set_xticks(M, [str(m) for m in M])
            ax.legend(fontsize=8)
        for ax in axes.ravel():
            ax.grid(alpha=0.3, which="both")
        self._save(fig, "fedq_icml_regret.png")

    # ----- ICML 2025: rounds against log(episodes), sweeps of M, S, A -----
    def icml_rounds(self) -> dict:
        s = self.scale
        episodes, start = s.sweep_episodes, s.sweep_episodes / 20
        grid = np.unique(np.geomspace(start, episodes, 40).astype(np.int64))
        slopes, curves, switches, gaps = {}, {}, {}, {}
        for swept in ("M", "S", "A"):
            slopes[swept], curves[swept], switches[swept], gaps[swept] = {}, {}, {}, {}
            for value in s.sweep_values:
                H, S, A, M = 2, 2, 2, 2
                S, A, M = (
                    (value if swept == "S" else S),
                    (value if swept == "A" else A),
                    (value if swept == "M" else M),
                )
                mdp = make_mdp(H, S, A)
                fits, counted, late_switches = [], [], []
                for seed in range(s.paths):
                    path = run_fedq(mdp, M, "hoeffding", episodes, seed)
                    after = path.episodes >= start
                    fits.append(log_slope(path.episodes[after], path.rounds[after], start))
                    counted.append(path.rounds_at(grid) - path.rounds_at(np.array([start]))[0])
                    before = path.policy_changes[~after][-1] if (~after).any() else 0
                    late_switches.append(path.policy_changes[-1] - before)
                    self.step(f"rounds sweep {swept}={value} path {seed}")
                slopes[swept][str(value)] = float(np.nanmedian(fits))
                curves[swept][value] = np.stack(counted)
                switches[swept][str(value)] = float(np.median(late_switches))
                gaps[swept][str(value)] = mdp.min_gap()
        self._plot_rounds(grid, curves, slopes)
        return {
            "slopes": slopes,
            "policy_changes_after_start": switches,
            "delta_min": gaps,
            "counted_after": start,
            "episodes_per_agent": episodes,
            "H": 2,
        }

    def _plot_rounds(self, grid, curves, slopes) -> None:
        fig, axes = plt.subplots(1, 3, figsize=(16, 4))
        fixed = {"M": "(H, S, A) = (2, 2, 2)", "S": "(H, A, M) = (2, 2, 2)", "A": "(H, S, M) = (2, 2, 2)"}
        for ax, swept in zip(axes, ("M", "S", "A"), strict=True):
            for value, counted in curves[swept].items():
                median = np.median(counted, axis=0)
                ax.plot(np.log(grid), median, label=f"{swept}={value}: slope {slopes[swept][str(value)]:.2f}")
            reference = steady_state_slope(2) * (np.log(grid) - np.log(grid[0]))
            ax.plot(
                np.log(grid), reference, ":", color="gray", label=f"steady state {steady_state_slope(2):.2f}"
            )
            ax.set(
                xlabel="ln(episodes per agent)",
                ylabel=f"rounds after {grid[0]} episodes",
                title=f"sweep of {swept}, {fixed[swept]}",
            )
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        self._save(fig, "fedq_icml_rounds.png")

    # ----- across MDP instances (issue 19, point 6) -----
    def instances(self) -> dict:
        """The claim-carrying part: instances are the report seeds, nothing is tuned (c = iota = 1)."""
        s, started = self.scale, time.perf_counter()
        out = {"count": s.instances, "paths_per_instance": s.instance_paths}
        learners = ("FedQ-H (M=10)", "FedQ-B (M=10)", "UCB-H (M=1)", "UCB-B (M=1)")
        protocol = Protocol("none", (), tuple(range(s.instances)), smoke=s != FULL)
        out["protocol"] = protocol.record(dict.fromkeys(learners, 1))
        out["headline"] = self.instances_headline()
        out["headline_wall_s"] = time.perf_counter() - started
        out["rounds"] = self.instances_rounds()
        out["wall_s"] = time.perf_counter() - started
        self._plot_instances(out)
        return out

    def instances_headline(self) -> dict:
        """The ICLR 2024 setting on every instance: final Regret / sqrt(MT) of FedQ-H/B (M = 10) and
        UCB-H/B (M = 1, same total episodes), and FedQ's rounds; means over the instance's paths."""
        s, M, (H, S, A) = self.scale, 10, (5, 3, 2)
        total = M * s.iclr_episodes
        per: dict[str, dict[str, list[float]]] = {}
        gaps = []
        for i in range(s.instances):
            mdp = make_mdp(H, S, A, seed=i)
            gaps.append(mdp.min_gap())
            seeds = across.instance_seeds(i, s.instance_paths)
            for bonus in ("hoeffding", "bernstein"):
                name = f"FedQ-{bonus[0].upper()} (M={M})"
                paths = []
                for seed in seeds:
                    paths.append(run_fedq(mdp, M, bonus, s.iclr_episodes, seed))
                    self.step(f"instance {i} {name} seed {seed}")
                row = per.setdefault(name, {"normalised_regret": [], "rounds": []})
                row["normalised_regret"].append(
                    float(np.mean([p.regret[-1] for p in paths]) / math.sqrt(M * H * s.iclr_episodes))
                )
                row["rounds"].append(float(np.mean([p.rounds[-1] for p in paths])))
            for bonus in ("hoeffding", "bernstein"):
                name = f"UCB-{bonus[0].upper()} (M=1)"
                regret = run_ucb(mdp, bonus, total, seeds, np.array([total]))
                per.setdefault(name, {"normalised_regret": []})["normalised_regret"].append(
                    float(regret[:, -1].mean() / math.sqrt(H * total))
                )
                self.step(f"instance {i} {name}")
        pairs = [
            ("FedQ-H (M=10)", "UCB-H (M=1)", "normalised_regret"),
            ("FedQ-B (M=10)", "UCB-B (M=1)", "normalised_regret"),
            ("FedQ-B (M=10)", "FedQ-H (M=10)", "normalised_regret"),
            ("FedQ-B (M=10)", "FedQ-H (M=10)", "rounds"),
        ]
        differences, verdicts = {}, []
        for a, b, of in pairs:
            d = across.difference(per[a][of], per[b][of])
            differences[f"{a} - {b}, {of}"] = d
            verdicts.append(across.difference_sentence(a, b, d, f" ({of.replace('_', ' ')})"))
        return {
            "mdp": {"H": H, "S": S, "A": A},
            "total_episodes": int(total),
            "delta_min": gaps,
            "per_instance": per,
            "summary": {name: {k: across.summary(v) for k, v in row.items()} for name, row in per.items()},
            "differences": differences,
            "verdicts": verdicts,
        }

    def instances_rounds(self) -> dict:
        """The ICML 2025 sweeps on every instance, each run fitted over every window."""
        s = self.scale
        episodes, start = s.sweep_episodes, s.sweep_episodes / 20
        windows = fit_windows(s)
        labels = [across.window_label(lo, hi) for lo, hi in windows]
        configs = sorted({across.config(q, v) for q in across.SWEPT for v in s.sweep_values})
        runs = []
        for i in range(s.instances):
            for S, A, M in configs:
                mdp = make_mdp(2, S, A, seed=i)  # the same MDP for every M: the M sweep is paired
                slopes, late = [], []
                for seed in across.instance_seeds(i, s.instance_paths):
                    path = run_fedq(mdp, M, "hoeffding", episodes, seed)
                    slopes.append([log_slope(path.episodes, path.rounds, lo, hi) for lo, hi in windows])
                    before = path.policy_changes[path.episodes < start]
                    late.append(path.policy_changes[-1] - (before[-1] if before.size else 0))
                    self.step(f"instance {i} S={S} A={A} M={M} seed {seed}")
                runs.append(
                    {
                        "S": S,
                        "A": A,
                        "M": M,
                        "instance": i,
                        "delta_min": mdp.min_gap(),
                        "slopes": dict(zip(labels, map(float, np.mean(slopes, axis=0)), strict=True)),
                        "policy_changes_after_start": float(np.mean(late)),
                    }
                )
        return {
            "H": 2,
            "episodes_per_agent": episodes,
            "paper_window": labels[0],
            "windows": labels,
            "values": list(s.sweep_values),
            "delta_edges": list(across.DELTA_EDGES),
            "runs": runs,
            **across.rounds_statistics(runs, s.sweep_values, labels),
        }

    def _plot_instances(self, inst: dict) -> None:
        head, rounds = inst["headline"], inst["rounds"]
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
        for fed, single in (("FedQ-H (M=10)", "UCB-H (M=1)"), ("FedQ-B (M=10)", "UCB-B (M=1)")):
            x, y = (head["per_instance"][n]["normalised_regret"] for n in (single, fed))
            ax1.plot(x, y, "o", label=f"{fed} against {single}")
        low, high = ax1.get_xlim()
        ax1.plot([low, high], [low, high], ":", color="gray", label="equal")
        ax1.set(
            xlabel="single agent: Regret / sqrt(MT)",
            ylabel="FedQ: Regret / sqrt(MT)",
            title=f"ICLR 2024 setting, one point per MDP instance ({inst['count']})",
        )
        paper = rounds["paper_window"]
        for swept in across.SWEPT:
            chosen = [r for r in rounds["runs"] if r[swept] != 2]
            ax2.plot(
                [r["delta_min"] for r in chosen],
                [r["slopes"][paper] for r in chosen],
                "o",
                label=f"{swept} in {{4, 6, 8}}",
            )
        base = [r for r in rounds["runs"] if (r["S"], r["A"], r["M"]) == (2, 2, 2)]
        ax2.plot(
            [r["delta_min"] for r in base], [r["slopes"][paper] for r in base], "ko", label="S = A = M = 2"
        )
        ax2.axhline(
            steady_state_slope(2), ls=":", color="gray", label=f"steady state {steady_state_slope(2):.2f}"
        )
        ax2.set(
            xscale="log",
            xlabel="Delta_min of the instance",
            ylabel="rounds per ln(episodes)",
            title=f"ICML 2025 sweeps (H = 2), fit window {paper}",
        )
        for ax in (ax1, ax2):
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        self._save(fig, "fedq_instances.png")

    def _save(self, fig, name: str) -> None:
        fig.tight_layout()
        if self.out is not None:
            self.out.mkdir(parents=True, exist_ok=True)
            fig.savefig(self.out / name, dpi=100)
        plt.close(fig)


def _rounds_rows(rounds: dict) -> list[tuple[str, str, list[str]]]:
    """Per swept quantity: the slope, the policy changes after the start, and Delta_min, by value."""
    rows = []
    for swept, by_value in rounds["slopes"].items():
        rows.append((swept, "rounds per ln(episodes)", [f"{v:.2f}" for v in by_value.values()]))
        switches = rounds["policy_changes_after_start"][swept].values()
        rows.append((swept, "policy changes after the start", [f"{v:.0f}" for v in switches]))
        rows.append(
            (swept, "Delta_min of the MDP", [f"{v:.3g}" for v in rounds["delta_min"][swept].values()])
        )
    return rows


def verdicts(results: dict) -> dict[str, str]:
    """Plain answers to the issue's two questions, from the numbers (criteria stated in the text)."""
    slopes = results["icml_rounds"]["slopes"]
    spread = {k: (max(v.values()) - min(v.values())) / np.mean(list(v.values())) for k, v in slopes.items()}
    out = {"slopes_spread": {k: float(s) for k, s in spread.items()}}  # one MDP: described, not tested
    for setting, r in results["icml_regret"].items():
        rows = r["fedq_hoeffding"]
        M = np.array([int(m) for m in rows])
        per_agent_slope = np.array([rows[m]["slope_per_ln_T"] for m in rows]) / M
        exponent = float(np.polyfit(np.log(M), np.log(per_agent_slope), 1)[0])
        final = np.array([rows[m]["per_agent"] for m in rows])
        final_exponent = float(np.polyfit(np.log(M), np.log(final), 1)[0])
        out[setting] = (
            f"per-agent regret growth per ln T ~ M^{exponent:.2f}, "
            f"final per-agent regret ~ M^{final_exponent:.2f}"
        )
        out[f"{setting}_exponents"] = {"log_T_coefficient": exponent, "final": final_exponent}
    return out


def markdown(results: dict) -> str:
    iclr, regret, rounds, v = (
        results["iclr"],
        results["icml_regret"],
        results["icml_rounds"],
        results["verdicts"],
    )
    lines = [
        "FedQ-Hoeffding and FedQ-Bernstein (Zheng et al., ICLR 2024) and their gap-dependent analysis",
        "(Zhang et al., ICML 2025), on the papers' random MDPs (r ~ U[0,1], P_h(.|x,a) ~ Dirichlet(1),",
        "first state uniform, `[mdp] seed = 0`), c = iota = 1, exact regret (V* minus the exact value of the",
        f"policy in force, per episode). Medians over {results['paths']} sample paths",
        f"(run seeds 0..{results['paths'] - 1}) with 10-90% bands. Every FedQ path runs through the same",
        "federation as `taciturn run` (Channel, Ledger, encoded messages).",
        f"Wall time {results['wall_s'] / 60:.1f} min on one shared core. Reproduce with:",
        "",
        "```bash",
        COMMAND,
        "```",
        "",
        "### ICLR 2024 setting (S = 3, A = 2, H = 5)",
        "",
        f"FedQ with M = 10 and {iclr['total_episodes'] // 10} episodes per agent against UCB with M = 1 and",
        f"{iclr['total_episodes']} episodes: the same total. "
        f"Delta_min of this MDP: {iclr['mdp']['delta_min']:.4f}.",
        "",
        "![ICLR 2024 setting](img/fedq_iclr.png)",
        "",
        "| learner | Regret/sqrt(MT), median | p10 | p90 | rounds | MB up | MB down "
        "| scalars up / agent / round |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, q in iclr["normalised_regret"].items():
        f = iclr["facts"][name]
        fed = f["rounds"] is not None
        lines.append(
            f"| {name} | {q['median']:.2f} | {q['p10']:.2f} | {q['p90']:.2f} | "
            + (
                f"{f['rounds']:.0f} | {f['MB_up']:.2f} | {f['MB_down']:.2f} "
                f"| {f['scalars_up_per_agent_round']:.0f} |"
                if fed
                else "- | - | - | - |"
            )
        )
    lines += [
        "",
        "### ICML 2025: regret grows like log T, with a multi-agent speed-up",
        "",
        "![ICML 2025 regret](img/fedq_icml_regret.png)",
        "",
        "| setting | learner | episodes / agent | final regret (median) | p10-p90 | per agent "
        "| d regret / d ln T | ... / M |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for setting, r in regret.items():
        rows = {f"FedQ-H M={m}": (int(m), row) for m, row in r["fedq_hoeffding"].items()}
        rows["UCB-H"] = (1, r["ucb_hoeffding"])
        for name, (M, row) in rows.items():
            lines.append(
                f"| {setting} (Delta_min {r['delta_min']:.3g}) | {name} | {r['episodes_per_agent']} | "
                f"{row['final_regret']:.1f} | {row['final_regret_p10']:.0f}-{row['final_regret_p90']:.0f} | "
                f"{row['per_agent']:.1f} | {row['slope_per_ln_T']:.1f} | {row['slope_per_ln_T'] / M:.2f} |"
            )
    lines += [
        "",
        "`d regret / d ln T` is the least-squares slope of the cumulative regret (all agents) against",
        "ln(episodes) over the last decade of episodes; divided by M it is the per-agent log T coefficient.",
        "",
        *(f"* {setting}: {v[setting]}." for setting in regret),
        "",
        "### ICML 2025: rounds against log(episodes), sweeps of M, S and A",
        "",
        f"H = 2, {rounds['episodes_per_agent']} episodes per agent, rounds counted after",
        f"{rounds['counted_after']:.0f} episodes (the paper: 10^7 and 5 x 10^5); slope = least-squares fit",
        "of rounds against ln(episodes) per path, median over paths. Steady-state reference",
        f"1 / ln(1 + 1/(H(H+1))) = {steady_state_slope(2):.2f} (each round then multiplies the visit counts",
        "by 1 + 1/(H(H+1)); our reading of the trigger rule).",
        "",
        "![ICML 2025 rounds](img/fedq_icml_rounds.png)",
        "",
        "| swept | | " + " | ".join(next(iter(rounds["slopes"].values()))) + " |",
        "|---|---|" + "---:|" * len(next(iter(rounds["slopes"].values()))),
    ]
    for swept, line, values in _rounds_rows(rounds):
        lines.append(f"| {swept} | {line} | " + " | ".join(values) + " |")
    lines += [
        "",
        "One MDP per sweep point: whether the slopes differ is tested over instances below.",
        "",
        "### Across MDP instances: the headline and the slopes with intervals",
        "",
        "Everything above is one MDP per setting (`[mdp] seed = 0`). Here the ICLR 2024 headline and the",
        "ICML 2025 sweeps run again on independent draws of the same generator. Reproduce this part alone",
        "(it adds to the saved results) with:",
        "",
        "```bash",
        f"{COMMAND} --instances-only",
        "```",
        "",
    ]
    if "instances" in results:
        lines += [
            *across.markdown(results["instances"]),
            "",
            "![FedQ across instances](img/fedq_instances.png)",
            "",
        ]
    else:
        lines += ["Not yet run at full scale: no numbers here.", ""]
    return "\n".join(lines)


def write_docs(results: dict) -> None:
    """The generated block of the FedQ section; the reading around it is written by hand."""
    replace_section("fedq", markdown(results), SECTION.removeprefix("## "))


def run(scale: Scale, out: Path | None, console: Console, parts: tuple[str, ...] = PARTS) -> dict:
    """Run ``parts`` (of PARTS) at ``scale``; plots go to ``out`` (None: nowhere)."""
    started = time.perf_counter()
    progress = Progress(
        TextColumn("[bold]{task.description:<40}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )
    with progress:
        bench = Bench(scale, progress, out, parts)
        results = {}
        if "single" in parts:
            results["paths"] = scale.paths
            results["iclr"] = bench.iclr()
            results["icml_regret"] = bench.icml_regret()
            results["icml_rounds"] = bench.icml_rounds()
        if "instances" in parts:
            results["instances"] = bench.instances()
            results["protocol"] = results["instances"]["protocol"]
    if "single" not in parts:
        console.print("\n".join(across.markdown(results["instances"])), markup=False, highlight=False)
        return results
    results["wall_s"] = time.perf_counter() - started
    results["verdicts"] = verdicts(results)
    # the schema: round_slopes[quantity][value] and regret[setting][M]
    results["round_slopes"] = results["icml_rounds"]["slopes"]
    results["regret"] = {
        setting: {m: row["final_regret"] for m, row in r["fedq_hoeffding"].items()}
        for setting, r in results["icml_regret"].items()
    }
    console.print(markdown(results), markup=False, highlight=False)  # the docs section's tables
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="a ~1 minute smoke run at tiny scale; writes nothing"
    )
    parser.add_argument(
        "--docs-only", action="store_true", help="rewrite the docs section from benchmarks/results/fedq.json"
    )
    parser.add_argument(
        "--instances-only",
        action="store_true",
        help="run only the across-instance part and add it to benchmarks/results/fedq.json",
    )
    args = parser.parse_args(argv)
    console = Console()
    path = ROOT / "benchmarks" / "results" / "fedq.json"
    parts = ("instances",) if args.instances_only else PARTS
    if args.docs_only:
        write_docs(json.loads(path.read_text()))
        return 0
    if args.quick:
        run(QUICK, None, console, parts)
        return 0
    if args.instances_only and not path.exists():
        parser.error(
            f"--instances-only adds to {path.relative_to(ROOT)}, which does not exist: run the full benchmark"
        )
    saved = json.loads(path.read_text()) if args.instances_only else {"command": COMMAND}
    results = {**saved, **run(FULL, ROOT / "docs" / "img", console, parts)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1))
    write_docs(results)
    console.print(
        f"wrote {path.relative_to(ROOT)}, docs/img/fedq_*.png and the FedQ section of docs/benchmarks.md"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
