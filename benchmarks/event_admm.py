"""Event-based ADMM against FedAvg, FedProx, SCAFFOLD and FedADMM on Fashion-MNIST.

Reproduces the comparison of Er, Trimpe, Muehlebach (ICML 2025): communication events needed to
reach target accuracies, accuracy against events, and runs with dropped messages
(research/event_admm.md, Sec. 5), measured fairly (issue 19):

* Equal tuning budgets (sweep.py): every method is tuned over a grid of the same size on the knob
  that matters to it: participation C for FedAvg, FedProx and SCAFFOLD; rho x C for FedADMM;
  rho x trigger quantile for each event-based variant (constant Delta, randomized, decreasing
  Delta, Delta_z on its own axis, and the two per-agent triggers of event_admm.py, ``relative``
  and ``progress``). The Delta = 0 runs that calibrate the thresholds (one per rho and seed) are
  extra runs of the event family and are never candidates in the tables.
* Seeds: every configuration runs ``--seeds`` times (default 3). A method's configuration for a
  target is the one with the fewest mean events among those that reach it in every seed; the
  tables give its mean and 95% t-interval (intervals.py) over seeds.
* A target counts as reached at the first evaluation whose trailing mean over ``SMOOTH``
  evaluations reaches it (one noisy round above the target is not reaching it).
* Conclusions (savings) are printed only where the 95% intervals separate.

Every run is a normal taciturn run directory under benchmarks/runs/event_admm/ (compare any two
with `taciturn compare`). What the tables need of a finished run (accuracy and messages per round, a
calibration's trigger ratios) is appended to benchmarks/results/event_admm_runs.jsonl (commit it),
keyed by the run's config and the simulation code (run_key.py): a grid longer than a work session
runs over several, and an interrupted one loses only the runs in progress.

    python benchmarks/event_admm.py --quick          # smoke run: the same code at tiny scale
    python benchmarks/event_admm.py                  # settings A and B, 3 seeds, results and docs

Accounting: one communication event is one model-sized vector sent to or from one agent
(SCAFFOLD's messages carry two vectors, so they count two). Load = events / (2 N T).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from docs_section import markdown_table, replace_section
from intervals import separated, t_interval
from rich.console import Console
from rich.table import Table
from run_key import append_run, read_runs, run_key
from sweep import Grid, budget, grid
from workers import one_run_per_core

from taciturn.core.params import norm, sub
from taciturn.experiments.config import to_toml, validate
from taciturn.experiments.runner import RoundEnd, start

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "benchmarks" / "runs" / "event_admm"
RESULTS = ROOT / "benchmarks" / "results"
IMAGES = ROOT / "docs" / "img"
console = Console()

BASELINES = ("fedavg", "fedprox", "scaffold", "fedadmm")
# Event-based variants: (trigger, lucky fraction, Delta decay, Delta_z rule)
EVENT = {
    "event_admm": ("absolute", 0.0, 1.0, "same"),  # the paper's vanilla Alg. 1, constant Delta
    "event_admm_randomized": ("absolute", 0.2, 1.0, "same"),  # a fifth of agents get z when silent
    "event_admm_decay": ("absolute", 0.0, DECAY := 0.98, "same"),  # Delta_k = Delta 0.98^(k-1)
    "event_admm_dz": ("absolute", 0.0, 1.0, "own"),  # Delta at the median, Delta_z at the quantile
    "event_admm_relative": ("relative", 0.0, 1.0, "same"),  # ||v - last|| >= Delta ||last||
    "event_admm_progress": ("progress", 0.0, 1.0, "same"),  # ||v - last|| / N >= Delta ||z step||
}
METHODS = (*EVENT, *BASELINES)
ROW_FIELDS = ("round", "accuracy", "messages_up", "messages_down", "bytes_up", "bytes_down")
SMOOTH = 3  # evaluations in the trailing mean that must reach a target


def setting_a(quick: bool) -> dict[str, Any]:
    """The paper's MNIST setting on Fashion-MNIST: 10 agents, one class each (Sec. 1.6)."""
    return {
        "name": "A",
        "prefix": "quick-" if quick else "",  # run folders of the smoke and full runs apart
        "rounds": 6 if quick else 100,  # issue 19's re-run used 100 (150 before)
        # A stratified 20,000-image draw (2,000 per agent): 189 runs x 3 seeds of the full 60,000
        # did not fit a 2-core session (about 45 s a run with two workers); the same for every method.
        "data": {"dataset": "fashion_mnist", "train_size": 1000 if quick else 20000},
        "partition": {"kind": "one_class", "num_clients": 10},
        "model": {"kind": "mlp", "hidden": [200]},
        "local": {"epochs": 1, "batch_size": 256, "lr": 0.01, "momentum": 0.9},
        "rho_grid": [0.1] if quick else [0.01, 0.1, 1.0],  # quick: a budget of one configuration
        "fractions": [0.5] if quick else [0.1, 0.2, 0.3, 0.5, 0.7, 1.0],
        "fedadmm_fractions": [0.5] if quick else [0.5, 1.0],  # x rho_grid: as many as "fractions"
        "quantiles": [0.5] if quick else [0.5, 0.9],  # x rho_grid: as many as "fractions"
        "target_offsets": [0.10, 0.05, 0.02, 0.01],  # below the best mean accuracy of any configuration
    }


def setting_b(quick: bool) -> dict[str, Any]:
    """The CIFAR-style heterogeneous setting: Dirichlet(0.5) over 100 agents (Sec. 5)."""
    return {
        "name": "B",
        "prefix": "quick-" if quick else "",  # run folders of the smoke and full runs apart
        "rounds": 5 if quick else 100,
        "data": {"dataset": "fashion_mnist", "train_size": 1500 if quick else 15000},
        "partition": {"kind": "dirichlet", "num_clients": 10 if quick else 100, "alpha": 0.5, "min_size": 10},
        "model": {"kind": "mlp", "hidden": [200]},
        "local": {"epochs": 3, "batch_size": 20, "lr": 0.01, "momentum": 0.9},
        "rho_grid": [0.01] if quick else [0.01, 0.1, 1.0],
        "fractions": [0.5] if quick else [0.1, 0.2, 0.3, 0.5, 0.7, 1.0],
        "fedadmm_fractions": [0.5] if quick else [0.5, 1.0],
        "quantiles": [0.5] if quick else [0.5, 0.9],
        "target_offsets": [0.10, 0.05, 0.02, 0.01],
    }


def grids(setting: dict[str, Any]) -> dict[str, Grid]:
    """Every method's tuning grid; ``budget`` refuses unequal sizes before anything runs."""
    out = {m: grid(m, fraction=setting["fractions"]) for m in ("fedavg", "fedprox", "scaffold")}
    out["fedadmm"] = grid("fedadmm", rho=setting["rho_grid"], fraction=setting["fedadmm_fractions"])
    for method in EVENT:
        out[method] = grid(method, rho=setting["rho_grid"], quantile=setting["quantiles"])
    budget(out)
    return {m: out[m] for m in METHODS}


def knob_label(point: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in point.items())


def smoothed(rows: list[dict[str, Any]]) -> np.ndarray:
    """Trailing mean of the test accuracy over the last ``SMOOTH`` evaluations (fewer at the start)."""
    acc = np.array([r["accuracy"] for r in rows], dtype=float)
    cumulative = np.concatenate([[0.0], np.cumsum(acc)])
    idx = np.arange(1, len(acc) + 1)
    lo = np.maximum(0, idx - SMOOTH)
    return (cumulative[idx] - cumulative[lo]) / (idx - lo)


@dataclass
class Run:
    method: str
    knob: str  # the grid point, "rho=0.1,quantile=0.5"; "calibration" for a Delta = 0 run
    seed: int
    rows: list[dict[str, Any]]
    vectors_per_message: int
    num_agents: int
    rounds: int
    wall_s: float
    trigger_ratios: dict[str, list[float]] = field(default_factory=dict)  # rule -> ||v - last|| / unit
    z_changes: list[float] = field(default_factory=list)

    def events(self, row: dict[str, Any]) -> int:
        return self.vectors_per_message * (row["messages_up"] + row["messages_down"])

    def load(self) -> float:
        return self.events(self.rows[-1]) / (2 * self.num_agents * self.rounds)

    def first_reaching(self, target: float) -> dict[str, Any] | None:
        above = np.flatnonzero(smoothed(self.rows) >= target)
        return self.rows[int(above[0])] if above.size else None

    def best_accuracy(self) -> float:
        return float(smoothed(self.rows).max())

    def summary(self) -> dict[str, Any]:
        last = self.rows[-1]
        return {
            "method": self.method,
            "knob": self.knob,
            "seed": self.seed,
            "final_accuracy": float(smoothed(self.rows)[-1]),
            "best_accuracy": self.best_accuracy(),
            "load": self.load(),
            "events": self.events(last),
            "bytes": last["bytes_up"] + last["bytes_down"],
            "wall_s": self.wall_s,
        }


def algorithm_table(method: str, point: dict[str, Any], setting: dict[str, Any], thresholds=None):
    local = dict(setting["local"])
    if method in ("fedavg", "fedprox"):
        local["clip_norm"] = 1.0  # the authors' FedLearn agents clip gradients at norm 1
    common = {"local": local}
    if method == "fedavg":
        return {"name": "fedavg", "fraction": point["fraction"], **common}
    if method == "fedprox":
        return {"name": "fedprox", "fraction": point["fraction"], "mu": 0.01, **common}
    if method == "scaffold":
        return {"name": "scaffold", "fraction": point["fraction"], **common}
    if method == "fedadmm":
        return {"name": "fedadmm", "fraction": point["fraction"], "rho": point["rho"], **common}
    trigger, lucky, decay, _ = EVENT.get(method, EVENT["event_admm"])
    delta, delta_z = thresholds or (0.0, 0.0)
    return {
        "name": "event_admm",
        "rho": point["rho"],
        "trigger": trigger,
        "delta": delta,
        "delta_z": delta_z,
        "delta_decay": decay,
        "lucky_fraction": lucky,
        **common,
    }


def run_one(
    setting: dict[str, Any],
    method: str,
    point: dict[str, Any],
    seed: int,
    thresholds=None,
    channel=None,
    reset_every=None,
    tag: str = "",
    knob: str | None = None,
) -> Run:
    knob = knob or knob_label(point)
    tree = {
        "name": f"{setting['prefix']}{setting['name']}-{method}-{knob}{tag}-s{seed}",
        "seed": seed,
        "rounds": setting["rounds"],
        "data": setting["data"],
        "partition": setting["partition"],
        "model": setting["model"],
        "algorithm": algorithm_table(method, point, setting, thresholds),
        "channel": channel or {},
        "eval": {"every": 1},
        "checkpoint": {"every": setting["rounds"], "keep": 1},
        "engine": {"executor": "sequential"},  # one run per worker process: no workers inside workers
    }
    if reset_every is not None:
        tree["algorithm"]["reset_every"] = reset_every
    config = validate(copy.deepcopy(tree), f"benchmark {tree['name']}")
    ratios: dict[str, list[float]] = {}
    z_changes: list[float] = []
    previous_z: dict[str, Any] = {}

    def observe(end: RoundEnd) -> None:
        for info in end.report.client_info.values():
            for key, unit in info.items():
                if key.startswith("trigger_unit/") and unit > 0:
                    ratios.setdefault(key.split("/", 1)[1], []).append(info["trigger_norm"] / unit)
        z = end.algorithm.global_params(end.state)
        if "z" in previous_z:
            z_changes.append(norm(sub(z, previous_z["z"])))
        previous_z["z"] = {k: v.clone() for k, v in z.items()}

    folder = RUNS / tree["name"]
    # A finished run is kept in the runs log, reused while its config and the simulation code are
    # unchanged (run_key): the grids take longer than a work session, so they run over several.
    key = run_key(to_toml(config))
    log = runs_log(setting)
    vectors = 2 if method == "scaffold" else 1
    agents, rounds = config.partition.num_clients, config.rounds
    if (stored := read_runs(log).get(key)) is not None:
        rows, wall = stored["rows"], stored["wall_s"]
        return Run(
            method, knob, seed, rows, vectors, agents, rounds, wall, stored["ratios"], stored["z_changes"]
        )
    started = time.perf_counter()
    rundir = start(config, folder, overwrite=True, progress=False, callbacks=(observe,))
    wall = time.perf_counter() - started
    # Only the metrics matter here: drop client state and checkpoints (hundreds of MB per run).
    (folder / "client_state.bin").unlink(missing_ok=True)
    shutil.rmtree(folder / "checkpoints", ignore_errors=True)
    rows = [{field: row[field] for field in ROW_FIELDS} for row in rundir.read_metrics()]
    ratios = ratios if method == "calibration" else {}  # only a calibration's ratios set thresholds
    record = {"key": key, "name": tree["name"], "wall_s": wall, "rows": rows, "ratios": ratios}
    append_run(log, record | {"z_changes": z_changes})
    return Run(method, knob, seed, rows, vectors, agents, rounds, wall, ratios, z_changes)


def runs_log(setting: dict[str, Any]) -> Path:
    """Finished runs, one JSON line each (commit it); the smoke run's never mix with the full run's."""
    return RESULTS / ("event_admm_quick_runs.jsonl" if setting["prefix"] else "event_admm_runs.jsonl")


def calibrate(setting: dict[str, Any], rho: float, seed: int) -> Run:
    """A Delta = 0 run (full communication) whose trigger ratios (of every rule: they are all
    reported) and z-changes set the thresholds of every event variant at this rho and seed."""
    return run_one(setting, "calibration", {"rho": rho}, seed)


def thresholds_from(
    calibration: Run, trigger: str, quantile: float, z_quantile: float | None = None
) -> tuple[float, float]:
    """Delta and Delta_z at quantiles of the trigger ratios and z-changes of a Delta = 0 run."""
    skip = max(1, len(calibration.z_changes) // 10)  # ignore the first rounds' large steps
    ratios = calibration.trigger_ratios[trigger]
    delta = float(np.quantile(ratios[len(ratios) * skip // calibration.rounds :], quantile))
    delta_z = float(np.quantile(calibration.z_changes[skip:], quantile if z_quantile is None else z_quantile))
    return delta, delta_z


def event_runs(setting: dict[str, Any], rho: float, seed: int) -> tuple[list[Run], Run]:
    """Every event variant's grid points at one rho and seed, with the Delta = 0 run that sets
    their thresholds (the calibration is never a candidate). A grid point whose algorithm is one
    already run here (Delta_z on its own axis at the median quantile is the constant-Delta method at
    that quantile) takes that run's rows instead of running the same training again."""
    calibration = calibrate(setting, rho, seed)
    _progress(calibration, "Delta = 0")
    runs: list[Run] = []
    by_algorithm: dict[str, Run] = {}
    for method, points in grids(setting).items():
        if method not in EVENT:
            continue
        trigger, *_, dz_rule = EVENT[method]
        for point in points.points:
            if point["rho"] != rho:
                continue
            q = point["quantile"]
            thresholds = (
                thresholds_from(calibration, trigger, 0.5, q)
                if dz_rule == "own"
                else thresholds_from(calibration, trigger, q)
            )
            algorithm = json.dumps(algorithm_table(method, point, setting, thresholds), sort_keys=True)
            if (same := by_algorithm.get(algorithm)) is not None:
                runs.append(replace(same, method=method, knob=knob_label(point)))
                _progress(runs[-1], f"the same algorithm as {same.method}: its run")
                continue
            runs.append(run_one(setting, method, point, seed, thresholds))
            by_algorithm[algorithm] = runs[-1]
            _progress(runs[-1], f"Delta={thresholds[0]:.3g} Delta_z={thresholds[1]:.3g}")
    return runs, calibration


def baseline_run(
    setting: dict[str, Any], method: str, point: dict[str, Any], seed: int
) -> tuple[list[Run], None]:
    runs = [run_one(setting, method, point, seed)]
    _progress(runs[0])
    return runs, None


def sweep(setting: dict[str, Any], seeds: int, jobs: int) -> tuple[list[Run], list[Run]]:
    """Every method's grid at every seed; returns (candidate runs, calibration runs), ordered by
    seed, then method, then grid point, whatever order the ``jobs`` worker processes finish in.
    The work is split into independent tasks: one per baseline run, one per (rho, seed) for the
    event family (its calibration and the variants that depend on it), largest first."""
    console.rule(f"setting {setting['name']}, {seeds} seeds, {jobs} worker processes")
    tasks = [(event_runs, (setting, rho, seed)) for seed in range(seeds) for rho in setting["rho_grid"]]
    tasks += [
        (baseline_run, (setting, method, point, seed))
        for seed in range(seeds)
        for method, points in grids(setting).items()
        if method not in EVENT
        for point in points.points
    ]
    runs: list[Run] = []
    calibrations: list[Run] = []
    with one_run_per_core(jobs) as pool:
        for task_runs, calibration in pool.map(_call, tasks):
            runs += task_runs
            calibrations += [calibration] if calibration is not None else []
    order = {m: i for i, m in enumerate(METHODS)}
    knobs = {m: [knob_label(p) for p in g.points] for m, g in grids(setting).items()}
    runs.sort(key=lambda r: (r.seed, order[r.method], knobs[r.method].index(r.knob)))
    rhos = [knob_label({"rho": rho}) for rho in setting["rho_grid"]]  # the calibrations' knobs
    calibrations.sort(key=lambda r: (r.seed, rhos.index(r.knob)))
    return runs, calibrations


def _call(task):
    function, args = task
    return function(*args)


def _progress(run: Run, extra: str = "") -> None:
    s = run.summary()
    console.print(
        f"  {run.method:<22} {run.knob:<22} load={s['load']:.3f} best={s['best_accuracy']:.4f} "
        f"final={s['final_accuracy']:.4f} {run.wall_s:6.1f}s {extra}",
        soft_wrap=True,
        highlight=False,
    )


def by_config(runs: list[Run]) -> dict[tuple[str, str], list[Run]]:
    groups: dict[tuple[str, str], list[Run]] = {}
    for r in runs:
        groups.setdefault((r.method, r.knob), []).append(r)
    return groups


def ceiling(runs: list[Run]) -> float:
    """The best mean (over seeds) smoothed accuracy of any configuration of any method."""
    return max(float(np.mean([r.best_accuracy() for r in group])) for group in by_config(runs).values())


def targets_for(runs: list[Run], offsets: list[float]) -> list[float]:
    top = ceiling(runs)
    return [math.floor((top - off) * 100) / 100 for off in offsets]


def tuned(runs: list[Run], method: str, target: float, measure: str) -> dict[str, Any] | None:
    """The configuration of ``method`` that reaches ``target`` in every seed with the fewest mean
    events (or bytes): its knob, the per-seed values, their mean and 95% interval."""
    best = None
    for (m, knob), group in by_config(runs).items():
        if m != method:
            continue
        rows = [r.first_reaching(target) for r in group]
        if any(row is None for row in rows):
            continue
        values = [
            float(r.events(row) if measure == "events" else row["bytes_up"] + row["bytes_down"])
            for r, row in zip(group, rows, strict=True)
        ]
        mean = float(np.mean(values))
        if best is None or mean < best["mean"]:
            ci = t_interval(values) if len(values) > 1 else (math.nan, math.nan)
            best = {"knob": knob, "values": values, "mean": mean, "ci": list(ci)}
    return best


def saving(results: dict[str, dict[str, Any]], target: float) -> dict[str, dict[str, Any] | None]:
    """Each event variant against the best baseline (fewest mean events) at ``target``: the relative
    saving of the means, and whether the 95% intervals separate (the only case a claim is made)."""
    baselines = [results[m][str(target)] for m in BASELINES if results[m][str(target)] is not None]
    out: dict[str, dict[str, Any] | None] = {}
    base = min(baselines, key=lambda b: b["mean"]) if baselines else None
    for method in EVENT:
        mine = results[method][str(target)]
        if mine is None or base is None:
            out[method] = None
            continue
        finite = all(math.isfinite(v) for v in (*mine["ci"], *base["ci"]))
        out[method] = {
            "saving": 1 - mine["mean"] / base["mean"],
            "separated": bool(finite and separated(tuple(mine["ci"]), tuple(base["ci"]))),
        }
    return out


def pareto(runs: list[Run]) -> dict[str, list[dict[str, Any]]]:
    """Per method, the configurations not dominated in (mean events, mean best accuracy)."""
    front: dict[str, list[dict[str, Any]]] = {}
    points: dict[str, list[dict[str, Any]]] = {}
    for (method, knob), group in by_config(runs).items():
        points.setdefault(method, []).append(
            {
                "knob": knob,
                "events": float(np.mean([r.events(r.rows[-1]) for r in group])),
                "accuracy": float(np.mean([r.best_accuracy() for r in group])),
            }
        )
    for method, pts in points.items():
        front[method] = sorted(
            (
                p
                for p in pts
                if not any(
                    q["events"] <= p["events"] and q["accuracy"] >= p["accuracy"] and q != p for q in pts
                )
            ),
            key=lambda p: p["events"],
        )
    return front


def failure_runs(setting: dict[str, Any], calibrations: list[Run], seed: int, quick: bool) -> list[dict]:
    """Drop every message with probability p on both links, with and without periodic resets
    (event-based ADMM at the middle rho of the grid, median quantile; FedAvg at C = 1)."""
    rho = setting["rho_grid"][len(setting["rho_grid"]) // 2]
    calibration = next(c for c in calibrations if c.knob == f"rho={rho}" and c.seed == seed)
    thresholds = thresholds_from(calibration, "absolute", 0.5)
    point = {"rho": rho, "quantile": 0.5}
    out = []
    probabilities = [0.3] if quick else [0.0, 0.1, 0.3]
    resets = [None, 4] if quick else [None, 10, 25]
    for p in probabilities:
        channel = {"drop_up": p, "drop_down": p}
        for reset in resets:
            run = run_one(
                setting, "event_admm", point, seed, thresholds, channel, reset, tag=f"-p{p}-r{reset}"
            )
            out.append({"p": p, "reset_every": reset, **run.summary()})
            _progress(run, f"p={p} reset={reset}")
        fedavg = run_one(setting, "fedavg", {"fraction": 1.0}, seed, None, channel, tag=f"-p{p}")
        out.append({"p": p, "reset_every": None, **fedavg.summary()})
        _progress(fedavg, f"p={p}")
    return out


def plot_pareto(setting_name: str, runs: list[Run], front: dict[str, list[dict]], path: Path) -> Path:
    """Best accuracy against events, mean over seeds per configuration; lines join each method's
    Pareto front (fewer events and higher accuracy), dots are its other configurations."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.0, 4.6))
    groups = by_config(runs)
    for i, method in enumerate(METHODS):
        color = f"C{i % 10}"
        pts = [
            (np.mean([r.events(r.rows[-1]) for r in g]), np.mean([r.best_accuracy() for r in g]))
            for (m, _), g in groups.items()
            if m == method
        ]
        if not pts:
            continue
        ax.scatter(*zip(*pts, strict=True), color=color, alpha=0.35, s=14)
        line = front[method]
        ax.plot(
            [p["events"] for p in line], [p["accuracy"] for p in line], marker="o", color=color, label=method
        )
    ax.set(
        xlabel="communication events (mean over seeds)",
        ylabel=f"best test accuracy (trailing mean of {SMOOTH})",
        title=f"Setting {setting_name}: accuracy against events, Pareto fronts",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def conclusions(
    savings: dict[str, dict[str, Any]], targets: list[float], reached: dict[str, dict[str, Any]]
) -> list[str]:
    """Sentences only where an event variant's 95% interval separates from the best baseline's, and
    the targets that only one family reached in every seed (no events to compare there)."""
    out = []
    for t in targets:
        families = {
            name: [m for m in group if reached[m][str(t)] is not None]
            for name, group in (("event", EVENT), ("baseline", BASELINES))
        }
        for name, other in (("event", "baseline"), ("baseline", "event")):
            if families[name] and not families[other]:
                out.append(
                    f"At {t:.0%}, no {other} method reached the target in every seed; "
                    f"{', '.join(families[name])} did."
                )
        for method, s in savings[str(t)].items():
            if s is not None and s["separated"]:
                word = "fewer" if s["saving"] > 0 else "more"
                out.append(
                    f"At {t:.0%}, {method} needs {abs(s['saving']):.0%} {word} events than the best "
                    "baseline (95% intervals separate)."
                )
    if not any("intervals separate" in line for line in out):
        out.append("No event variant's 95% interval separates from the best baseline's: no claim on events.")
    return out


def report(setting: dict[str, Any], runs: list[Run], calibrations: list[Run], failures: list[dict]) -> dict:
    targets = targets_for(runs, setting["target_offsets"])
    result: dict[str, Any] = {"targets": targets, "ceiling": ceiling(runs)}
    best: dict[str, dict[str, dict[str, Any]]] = {}
    for measure in ("events", "bytes"):
        best[measure] = {m: {str(t): tuned(runs, m, t, measure) for t in targets} for m in METHODS}
        result[measure] = {
            m: [b["mean"] if (b := best[measure][m][str(t)]) else None for t in targets] for m in METHODS
        }
        result[f"{measure}_ci"] = {
            m: {str(t): b["ci"] if (b := best[measure][m][str(t)]) else None for t in targets}
            for m in METHODS
        }
    result["tuned"] = {
        m: {str(t): b["knob"] if (b := best["events"][m][str(t)]) else None for t in targets} for m in METHODS
    }
    result["savings"] = {
        measure: {str(t): saving(best[measure], t) for t in targets} for measure in ("events", "bytes")
    }
    result["conclusions"] = conclusions(result["savings"]["events"], targets, best["events"])
    result["pareto"] = pareto(runs)
    result["configs"] = seed_spread(runs)
    result["runs"] = [r.summary() for r in runs]
    result["calibration"] = [r.summary() for r in calibrations]
    result["failures"] = failures
    table = Table(title=f"Setting {setting['name']}: events to reach a target, mean [95% interval]")
    table.add_column("method")
    for t in targets:
        table.add_column(f"{t:.0%}", justify="right")
    for m in METHODS:
        table.add_row(m, *(_ci(best["events"][m][str(t)]) for t in targets))
    console.print(table)
    for line in result["conclusions"]:
        console.print(line, highlight=False)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run of the same code at tiny scale")
    parser.add_argument("--settings", default="A,B")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the failure runs")
    args = parser.parse_args(argv)
    if args.seeds < 3 and not args.quick:
        parser.error("a claim needs at least 3 seeds (use --quick for a smoke run)")
    torch.set_num_threads(args.threads)
    builders = {"A": setting_a, "B": setting_b}
    command = f"python benchmarks/event_admm.py --settings {args.settings} --seeds {args.seeds}"
    command += " --quick" if args.quick else ""
    results: dict[str, Any] = {"quick": args.quick, "command": command, "seeds": args.seeds}
    for name in args.settings.split(","):
        setting = builders[name](args.quick)
        results["rho_grid"] = setting["rho_grid"]
        runs, calibrations = sweep(setting, args.seeds, args.jobs)
        failures = failure_runs(setting, calibrations, 0, args.quick) if name == "A" else []
        results[name] = report(setting, runs, calibrations, failures)
        image = (RUNS if args.quick else IMAGES) / f"event_admm_{name}.png"  # a smoke run stays out of docs
        results[name]["plot"] = str(plot_pareto(name, runs, results[name]["pareto"], image).relative_to(ROOT))
        results[name]["settings"] = {k: v for k, v in setting.items() if k not in ("name", "prefix")}
        results[name]["command"] = command
    out = RESULTS / ("event_admm_quick.json" if args.quick else "event_admm.json")
    results = with_earlier_settings(results, out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    console.print(f"results: {out}")
    if args.quick:  # a smoke run: render the same tables, but leave the docs alone
        RUNS.mkdir(parents=True, exist_ok=True)
        (RUNS / "quick.md").write_text(render(results))
    else:
        docs = replace_section("event_admm", render(results), "Event-based ADMM against its baselines")
        console.print(f"docs: {docs}")
    return 0


def with_earlier_settings(results: dict[str, Any], out: Path) -> dict[str, Any]:
    """``results`` and the settings of the results file ``out`` that this invocation did not run,
    if they were made with the same seeds and rho grid: running ``--settings B`` keeps A's tables."""
    if not out.exists():
        return results
    earlier = json.loads(out.read_text())
    if (earlier.get("seeds"), earlier.get("rho_grid")) != (results["seeds"], results["rho_grid"]):
        return results
    return results | {name: earlier[name] for name in ("A", "B") if name in earlier and name not in results}


def _ci(best: dict[str, Any] | None, scale: float = 1.0, digits: int = 0) -> str:
    if best is None:
        return "n/a"
    lo, hi = best["ci"]
    if not math.isfinite(lo):
        return f"{best['mean'] / scale:.{digits}f}"
    return f"{best['mean'] / scale:.{digits}f} [{lo / scale:.{digits}f}, {hi / scale:.{digits}f}]"


def render(results: dict[str, Any]) -> str:
    """The generated part of the docs section: every table of every setting."""
    smoke = " **Smoke run (--quick): tiny data and few rounds; no conclusion may be drawn.**"
    parts = [
        f"Results: `benchmarks/results/event_admm{'_quick' if results['quick'] else ''}.json`, each "
        f"setting with the command that ran it. Seeds: {results['seeds']}; "
        f"rho grid {results['rho_grid']}." + (smoke if results["quick"] else "")
    ]
    for name in ("A", "B"):
        if name in results:
            parts += render_setting(name, results[name])
    return "\n\n".join(parts)


def render_setting(name: str, res: dict[str, Any]) -> list[str]:
    targets = res["targets"]
    heads = [f"{t:.0%}" for t in targets]

    def cell(measure: str, method: str, t: float, scale: float = 1.0, digits: int = 0) -> str:
        mean = res[measure][method][targets.index(t)]
        ci = res[f"{measure}_ci"][method][str(t)]
        return _ci(None if mean is None else {"mean": mean, "ci": ci}, scale, digits)

    parts = [
        f"### Setting {name}\n\nCommand: `{res['command']}`. "
        f"Settings: `{json.dumps(res['settings'])}`. Best mean accuracy of any "
        f"configuration (trailing mean of {SMOOTH} evaluations): {res['ceiling']:.4f}; targets sit "
        "below it.",
        "Communication events to reach each target: each method at its configuration with the fewest "
        "mean events among those reaching the target in every seed; mean [95% t-interval] over seeds "
        "(n/a: no configuration reached it in every seed):\n\n"
        + markdown_table(
            ["method", *heads], [[m, *(cell("events", m, t) for t in targets)] for m in METHODS]
        ),
        "Megabytes (up + down) for the same targets:\n\n"
        + markdown_table(
            ["method", *heads], [[m, *(cell("bytes", m, t, 1e6, 1) for t in targets)] for m in METHODS]
        ),
        "Configuration chosen per target (events):\n\n"
        + markdown_table(
            ["method", *heads], [[m, *(res["tuned"][m][str(t)] or "n/a" for t in targets)] for m in METHODS]
        ),
    ]
    savings = [
        [
            method,
            *(
                "n/a"
                if (s := res["savings"]["events"][str(t)][method]) is None
                else f"{s['saving']:+.0%} ({'separate' if s['separated'] else 'overlap'})"
                for t in targets
            ),
        ]
        for method in EVENT
    ]
    parts.append(
        "Event saving against the best baseline at each target (positive: fewer events; "
        "'overlap': the 95% intervals overlap, so no claim):\n\n" + markdown_table(["", *heads], savings)
    )
    parts.append("Conclusions:\n\n" + "\n".join(f"- {c}" for c in res["conclusions"]))
    parts.append(f"![accuracy against events, setting {name}]({os.path.relpath(res['plot'], 'docs')})")
    parts.append(
        "Every configuration, mean over seeds [95% interval] (the Delta = 0 calibration runs are in "
        "the JSON, `calibration`):\n\n"
        + markdown_table(
            ["method", "knob", "seeds", "best acc", "load", "events"],
            [
                [
                    c["method"],
                    c["knob"],
                    c["seeds"],
                    _ci({"mean": c["best_accuracy"], "ci": c["best_accuracy_ci"]}, 1.0, 4),
                    f"{c['load']:.3f}",
                    f"{c['events']:.0f}",
                ]
                for c in res["configs"]
            ],
        )
    )
    if res["failures"]:
        parts.append(
            "Dropped messages, seed 0 (probability p on both links; event-based ADMM at the middle rho "
            "and the median trigger quantile; FedAvg at C = 1 for contrast):\n\n"
            + markdown_table(
                ["method", "p", "reset every", "final acc", "best acc", "load"],
                [
                    [
                        f["method"],
                        f["p"],
                        f["reset_every"] or "never",
                        f"{f['final_accuracy']:.4f}",
                        f"{f['best_accuracy']:.4f}",
                        f"{f['load']:.3f}",
                    ]
                    for f in res["failures"]
                ],
            )
        )
    return parts


def seed_spread(runs: list[Run]) -> list[dict[str, Any]]:
    """Per configuration: seeds, mean best accuracy with its 95% interval, mean load and events."""
    out = []
    for (method, knob), group in sorted(
        by_config(runs).items(), key=lambda kv: (METHODS.index(kv[0][0]), kv[0][1])
    ):
        acc = [r.best_accuracy() for r in group]
        out.append(
            {
                "method": method,
                "knob": knob,
                "seeds": len(group),
                "best_accuracy": float(np.mean(acc)),
                "best_accuracy_ci": list(t_interval(acc)) if len(acc) > 1 else [math.nan, math.nan],
                "load": float(np.mean([r.load() for r in group])),
                "events": float(np.mean([r.events(r.rows[-1]) for r in group])),
            }
        )
    return out


if __name__ == "__main__":
    raise SystemExit(main())
