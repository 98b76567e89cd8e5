"""Event-based ADMM against FedAvg, FedProx, SCAFFOLD and FedADMM on Fashion-MNIST.

Reproduces the comparison of Er, Trimpe, Muehlebach (ICML 2025): communication events needed to
reach target accuracies, accuracy against total load, and runs with dropped messages
(research/event_admm.md, Sec. 5). Every run is a normal taciturn run directory under
benchmarks/runs/event_admm/ (compare any two with `taciturn compare`).

    python benchmarks/event_admm.py --quick          # about a minute: the same code at tiny scale
    python benchmarks/event_admm.py                  # settings A and B, writes results and docs
    python benchmarks/event_admm.py --settings A --seeds 3

Accounting: one communication event is one model-sized vector sent to or from one agent
(SCAFFOLD's messages carry two vectors, so they count two). Load = events / (2 N T).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from docs_section import markdown_table, replace_section
from rich.console import Console
from rich.table import Table

from taciturn.core.params import norm, sub
from taciturn.experiments.config import to_toml, validate
from taciturn.experiments.runner import RoundEnd, start
from taciturn.report.rundir import RunDir

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "benchmarks" / "runs" / "event_admm"
RESULTS = ROOT / "benchmarks" / "results"
IMAGES = ROOT / "docs" / "img"
console = Console()

# Finished runs are reused when their config and the code are unchanged (a crash costs only the run it hit).
CODE_VERSION = hashlib.sha256(
    b"".join(p.read_bytes() for p in sorted((ROOT / "src" / "taciturn").rglob("*.py")))
).hexdigest()
BASELINES = ("fedavg", "fedprox", "scaffold", "fedadmm")
EVENT = ("event_admm", "event_admm_randomized")
METHODS = (*EVENT, *BASELINES)
LUCKY_FRACTION = 0.2  # the randomized variant: share of agents sent z when the server is silent


def setting_a(quick: bool) -> dict[str, Any]:
    """The paper's MNIST setting on Fashion-MNIST: 10 agents, one class each (Sec. 1.6)."""
    return {
        "name": "A",
        "rounds": 8 if quick else 150,
        "data": {"dataset": "fashion_mnist", "train_size": 2000} if quick else {"dataset": "fashion_mnist"},
        "partition": {"kind": "one_class", "num_clients": 10},
        "model": {"kind": "mlp", "hidden": [200]},
        "local": {"epochs": 1, "batch_size": 256, "lr": 0.01, "momentum": 0.9},
        "rho_event": 1.0,
        "rho_fedadmm": 0.01,
        "fractions": [0.5, 1.0] if quick else [0.1, 0.2, 0.3, 0.5, 0.7, 1.0],
        "quantiles": [0.5] if quick else [0.1, 0.3, 0.5, 0.7, 0.85, 0.95],
        "target_offsets": [0.10, 0.05, 0.02],  # below the full-communication ceiling
    }


def setting_b(quick: bool) -> dict[str, Any]:
    """The CIFAR-style heterogeneous setting: Dirichlet(0.5) over 100 agents (Sec. 5)."""
    return {
        "name": "B",
        "rounds": 5 if quick else 100,
        "data": {"dataset": "fashion_mnist", "train_size": 1500 if quick else 15000},
        "partition": {"kind": "dirichlet", "num_clients": 10 if quick else 100, "alpha": 0.5, "min_size": 10},
        "model": {"kind": "mlp", "hidden": [200]},
        "local": {"epochs": 3, "batch_size": 20, "lr": 0.01, "momentum": 0.9},
        "rho_event": 0.01,
        "rho_fedadmm": 0.01,
        "fractions": [0.5] if quick else [0.1, 0.3, 1.0],  # CPU budget: C = 0.5 and q = 0.8 left out
        "quantiles": [0.5] if quick else [0.2, 0.5, 0.95],
        "target_offsets": [0.10, 0.05, 0.02],
    }


@dataclass
class Run:
    method: str
    knob: float  # participation C for baselines, the trigger quantile for event-based ADMM
    seed: int
    rows: list[dict[str, Any]]
    vectors_per_message: int
    num_agents: int
    rounds: int
    wall_s: float
    trigger_norms: list[float] = field(default_factory=list)
    z_changes: list[float] = field(default_factory=list)

    def events(self, row: dict[str, Any]) -> int:
        return self.vectors_per_message * (row["messages_up"] + row["messages_down"])

    def load(self) -> float:
        return self.events(self.rows[-1]) / (2 * self.num_agents * self.rounds)

    def first_reaching(self, target: float) -> dict[str, Any] | None:
        return next((r for r in self.rows if r["accuracy"] >= target), None)

    def best_accuracy(self) -> float:
        return max(r["accuracy"] for r in self.rows)

    def summary(self) -> dict[str, Any]:
        last = self.rows[-1]
        return {
            "method": self.method,
            "knob": self.knob,
            "seed": self.seed,
            "final_accuracy": last["accuracy"],
            "best_accuracy": self.best_accuracy(),
            "load": self.load(),
            "events": self.events(last),
            "bytes": last["bytes_up"] + last["bytes_down"],
            "wall_s": self.wall_s,
        }


def algorithm_table(method: str, knob: float, setting: dict[str, Any], thresholds=None) -> dict[str, Any]:
    local = dict(setting["local"])
    if method in ("fedavg", "fedprox"):
        local["clip_norm"] = 1.0  # the authors' FedLearn agents clip gradients at norm 1
    common = {"local": local}
    if method == "fedavg":
        return {"name": "fedavg", "fraction": knob, **common}
    if method == "fedprox":
        return {"name": "fedprox", "fraction": knob, "mu": 0.01, **common}
    if method == "scaffold":
        return {"name": "scaffold", "fraction": knob, **common}
    if method == "fedadmm":
        return {"name": "fedadmm", "fraction": knob, "rho": setting["rho_fedadmm"], **common}
    delta, delta_z = thresholds or (0.0, 0.0)
    return {
        "name": "event_admm",
        "rho": setting["rho_event"],
        "delta": delta,
        "delta_z": delta_z,
        "lucky_fraction": LUCKY_FRACTION if method == "event_admm_randomized" else 0.0,
        **common,
    }


def run_one(
    setting: dict[str, Any],
    method: str,
    knob: float,
    seed: int,
    thresholds=None,
    channel=None,
    reset_every=None,
    tag: str = "",
) -> Run:
    tree = {
        "name": f"{setting['name']}-{method}-{knob}{tag}-s{seed}",
        "seed": seed,
        "rounds": setting["rounds"],
        "data": setting["data"],
        "partition": setting["partition"],
        "model": setting["model"],
        "algorithm": algorithm_table(method, knob, setting, thresholds),
        "channel": channel or {},
        "eval": {"every": 1},
        "checkpoint": {"every": setting["rounds"]},
    }
    if reset_every is not None:
        tree["algorithm"]["reset_every"] = reset_every
    config = validate(copy.deepcopy(tree), f"benchmark {tree['name']}")
    norms: list[float] = []
    z_changes: list[float] = []
    previous_z: dict[str, Any] = {}

    def observe(end: RoundEnd) -> None:
        norms.extend(
            info["trigger_norm"] for info in end.report.client_info.values() if "trigger_norm" in info
        )
        z = end.algorithm.global_params(end.state)
        if "z" in previous_z:
            z_changes.append(norm(sub(z, previous_z["z"])))
        previous_z["z"] = {k: v.clone() for k, v in z.items()}

    folder = RUNS / tree["name"]
    key = hashlib.sha256((to_toml(config) + CODE_VERSION).encode()).hexdigest()
    done = folder / "benchmark.json"
    vectors = 2 if method == "scaffold" else 1
    if done.exists() and (cached := json.loads(done.read_text()))["key"] == key:  # same config, same code
        return Run(
            method,
            knob,
            seed,
            RunDir(folder).read_metrics(),
            vectors,
            config.partition.num_clients,
            config.rounds,
            cached["wall_s"],
            cached["trigger_norms"],
            cached["z_changes"],
        )
    started = time.perf_counter()
    rundir = start(config, folder, overwrite=True, progress=False, callbacks=(observe,))
    wall = time.perf_counter() - started
    # Only the metrics matter here: drop client state and checkpoints (hundreds of MB per run).
    (folder / "client_state.bin").unlink(missing_ok=True)
    shutil.rmtree(folder / "checkpoints", ignore_errors=True)
    done.write_text(json.dumps({"key": key, "wall_s": wall, "trigger_norms": norms, "z_changes": z_changes}))
    return Run(
        method,
        knob,
        seed,
        rundir.read_metrics(),
        vectors,
        config.partition.num_clients,
        config.rounds,
        wall,
        norms,
        z_changes,
    )


def thresholds_from(calibration: Run, quantile: float) -> tuple[float, float]:
    """Delta and Delta_z at a quantile of the trigger norms and z-changes of a Delta = 0 run."""
    skip = max(1, len(calibration.z_changes) // 10)  # ignore the first rounds' large steps
    agents = calibration.num_agents
    delta = float(np.quantile(calibration.trigger_norms[skip * agents :], quantile))
    delta_z = float(np.quantile(calibration.z_changes[skip:], quantile))
    return delta, delta_z


def sweep(setting: dict[str, Any], seed: int) -> tuple[list[Run], Run]:
    runs: list[Run] = []
    console.rule(f"setting {setting['name']}, seed {seed}")
    calibration = run_one(setting, "event_admm", 0.0, seed)  # Delta = 0: full communication
    runs.append(calibration)
    _progress(calibration)
    for quantile in setting["quantiles"]:
        thresholds = thresholds_from(calibration, quantile)
        for method in EVENT:
            runs.append(run_one(setting, method, quantile, seed, thresholds))
            _progress(runs[-1], f"Delta={thresholds[0]:.3g} Delta_z={thresholds[1]:.3g}")
    for fraction in setting["fractions"]:
        for method in BASELINES:
            runs.append(run_one(setting, method, fraction, seed))
            _progress(runs[-1])
    return runs, calibration


def _progress(run: Run, extra: str = "") -> None:
    s = run.summary()
    console.print(
        f"  {run.method:<22} knob={run.knob:<5} load={s['load']:.3f} best={s['best_accuracy']:.4f} "
        f"final={s['final_accuracy']:.4f} {run.wall_s:6.1f}s {extra}",
        soft_wrap=True,
        highlight=False,
    )


def targets_for(calibration: Run, offsets: list[float]) -> list[float]:
    ceiling = calibration.best_accuracy()
    return [math.floor((ceiling - off) * 100) / 100 for off in offsets]


def needed(runs: list[Run], method: str, target: float, measure: str) -> float | None:
    """Fewest events (or bytes) any configuration of ``method`` needs to first reach ``target``."""
    best = None
    for run in runs:
        if run.method != method:
            continue
        row = run.first_reaching(target)
        if row is None:
            continue
        value = run.events(row) if measure == "events" else row["bytes_up"] + row["bytes_down"]
        best = value if best is None else min(best, value)
    return best


def saving(runs: list[Run], target: float, measure: str) -> dict[str, float | None]:
    best_baseline = [v for m in BASELINES if (v := needed(runs, m, target, measure)) is not None]
    out: dict[str, float | None] = {}
    for method in EVENT:
        mine = needed(runs, method, target, measure)
        out[method] = None if mine is None or not best_baseline else 1 - mine / min(best_baseline)
    return out


def failure_runs(setting: dict[str, Any], calibration: Run, seed: int, quick: bool) -> list[dict[str, Any]]:
    """Drop every message with probability p on both links, with and without periodic resets."""
    thresholds = thresholds_from(calibration, 0.5)
    out = []
    probabilities = [0.3] if quick else [0.0, 0.1, 0.3]
    resets = [None, 4] if quick else [None, 10, 25]
    for p in probabilities:
        for reset in resets:
            run = run_one(
                setting,
                "event_admm",
                0.5,
                seed,
                thresholds,
                {"drop_up": p, "drop_down": p},
                reset,
                tag=f"-p{p}-r{reset}",
            )
            out.append({"p": p, "reset_every": reset, **run.summary()})
            _progress(run, f"p={p} reset={reset}")
        fedavg = run_one(setting, "fedavg", 1.0, seed, None, {"drop_up": p, "drop_down": p}, tag=f"-p{p}")
        out.append({"p": p, "reset_every": None, **fedavg.summary()})
        _progress(fedavg, f"p={p}")
    return out


def plot_load(setting_name: str, runs: list[Run], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for method in METHODS:
        points = sorted((r.load(), r.best_accuracy()) for r in runs if r.method == method)
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", label=method)
    ax.set(
        xlabel="total communication load (events / 2NT)",
        ylabel="best test accuracy",
        title=f"Setting {setting_name}: accuracy against load",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def report(
    setting: dict[str, Any], runs: list[Run], calibration: Run, failures: list[dict]
) -> dict[str, Any]:
    targets = targets_for(calibration, setting["target_offsets"])
    result: dict[str, Any] = {
        "targets": targets,
        "events": {},
        "bytes": {},
        "savings": {},
        "runs": [],
        "failures": failures,
        "ceiling": calibration.best_accuracy(),
    }
    for measure in ("events", "bytes"):
        result[measure] = {m: [needed(runs, m, t, measure) for t in targets] for m in METHODS}
        result["savings"][measure] = {str(t): saving(runs, t, measure) for t in targets}
    result["runs"] = [r.summary() for r in runs]
    table = Table(
        title=f"Setting {setting['name']}: events to reach a target (ceiling {result['ceiling']:.4f})"
    )
    table.add_column("method")
    for t in targets:
        table.add_column(f"{t:.0%}", justify="right")
    for m in METHODS:
        table.add_row(m, *("n/a" if v is None else str(v) for v in result["events"][m]))
    console.print(table)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="tiny smoke run of the same code (about a minute)"
    )
    parser.add_argument("--settings", default="A,B")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    builders = {"A": setting_a, "B": setting_b}
    results: dict[str, Any] = {
        "quick": args.quick,
        "command": "python benchmarks/event_admm.py" + (" --quick" if args.quick else ""),
    }
    for name in args.settings.split(","):
        setting = builders[name](args.quick)
        all_runs: list[Run] = []
        calibration = None
        for seed in range(args.seeds):
            runs, cal = sweep(setting, seed)
            all_runs += runs
            calibration = calibration or cal
        failures = failure_runs(setting, calibration, 0, args.quick) if name == "A" else []
        results[name] = report(setting, [r for r in all_runs if r.seed == 0], calibration, failures)
        results[name]["plot"] = str(
            plot_load(name, all_runs, IMAGES / f"event_admm_{name}.png").relative_to(ROOT)
        )
        results[name]["settings"] = {k: v for k, v in setting.items() if k != "name"}
        if args.seeds > 1:
            results[name]["seed_spread"] = seed_spread(all_runs)
    out = RESULTS / ("event_admm_quick.json" if args.quick else "event_admm.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    console.print(f"results: {out}")
    command = f"python benchmarks/event_admm.py --settings {args.settings} --seeds {args.seeds}"
    if args.quick:  # render the same tables, but leave the docs alone
        (RUNS / "quick.md").write_text(render(results, command + " --quick"))
    else:
        docs = replace_section(
            "event_admm", render(results, command), "Event-based ADMM against its baselines"
        )
        console.print(f"docs: {docs}")


def _fmt(value: float | None, kind: str = "int") -> str:
    if value is None:
        return "n/a"
    if kind == "MB":
        return f"{value / 1e6:.1f}"
    if kind == "pct":
        return f"{value:+.0%}"
    return str(int(value))


def render(results: dict[str, Any], command: str) -> str:
    """The generated part of the docs section: every table of every setting."""
    parts = [f"Command: `{command}` (results: `benchmarks/results/event_admm.json`)."]
    for name in ("A", "B"):
        if name in results:
            parts += render_setting(name, results[name])
    return "\n\n".join(parts)


def render_setting(name: str, res: dict[str, Any]) -> list[str]:
    targets = res["targets"]
    heads = [f"{t:.0%}" for t in targets]
    parts = [
        f"### Setting {name}\n\nSettings: `{json.dumps(res['settings'])}`. "
        f"Full-communication ceiling (event-based ADMM, Delta = 0): {res['ceiling']:.4f}.",
        "Communication events needed to first reach each target accuracy "
        "(fewest over each method's sweep; n/a: never reached):\n\n"
        + markdown_table(["method", *heads], [[m, *(_fmt(v) for v in res["events"][m])] for m in METHODS]),
        "Megabytes (up + down) needed for the same targets:\n\n"
        + markdown_table(
            ["method", *heads], [[m, *(_fmt(v, "MB") for v in res["bytes"][m])] for m in METHODS]
        ),
    ]
    savings = [
        [f"{method} ({measure})", *(_fmt(res["savings"][measure][str(t)][method], "pct") for t in targets)]
        for measure in ("events", "bytes")
        for method in EVENT
    ]
    parts.append(
        "Saving against the best baseline at each target (positive: fewer events or bytes):\n\n"
        + markdown_table(["", *heads], savings)
    )
    parts.append(f"![accuracy against load, setting {name}]({Path(res['plot']).relative_to('docs')})")
    runs = sorted(res["runs"], key=lambda r: (METHODS.index(r["method"]), r["knob"]))
    parts.append(
        "Every run (knob: participation C for baselines, trigger quantile for event-based ADMM; "
        "knob 0 is Delta = 0):\n\n"
        + markdown_table(
            ["method", "knob", "load", "best acc", "final acc", "events", "MB", "s"],
            [
                [
                    r["method"],
                    r["knob"],
                    f"{r['load']:.3f}",
                    f"{r['best_accuracy']:.4f}",
                    f"{r['final_accuracy']:.4f}",
                    r["events"],
                    f"{r['bytes'] / 1e6:.1f}",
                    f"{r['wall_s']:.0f}",
                ]
                for r in runs
            ],
        )
    )
    if res["failures"]:
        parts.append(
            "Dropped messages (probability p on both links; event-based ADMM at the median trigger "
            "quantile; FedAvg at C = 1 for contrast):\n\n"
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
    if "seed_spread" in res:
        parts.append(
            "Spread over seeds (mean ± standard deviation):\n\n"
            + markdown_table(
                ["method", "knob", "seeds", "best acc", "load"],
                [
                    [
                        s["method"],
                        s["knob"],
                        s["seeds"],
                        f"{s['best_accuracy_mean']:.4f} ± {s['best_accuracy_std']:.4f}",
                        f"{s['load_mean']:.3f} ± {s['load_std']:.3f}",
                    ]
                    for s in res["seed_spread"]
                ],
            )
        )
    return parts


def seed_spread(runs: list[Run]) -> list[dict[str, Any]]:
    """Mean and spread of best accuracy and load per (method, knob) over seeds."""
    groups: dict[tuple[str, float], list[Run]] = {}
    for r in runs:
        groups.setdefault((r.method, r.knob), []).append(r)
    out = []
    for (method, knob), group in sorted(groups.items()):
        acc = np.array([r.best_accuracy() for r in group])
        load = np.array([r.load() for r in group])
        out.append(
            {
                "method": method,
                "knob": knob,
                "seeds": len(group),
                "best_accuracy_mean": acc.mean(),
                "best_accuracy_std": acc.std(),
                "load_mean": load.mean(),
                "load_std": load.std(),
            }
        )
    return out


if __name__ == "__main__":
    main()
