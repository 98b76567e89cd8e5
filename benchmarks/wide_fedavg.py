"""Wide FedAvg: does widening the network shrink the harm of data heterogeneity?

Jian & Liu, "Widening the Network Mitigates the Impact of Data Heterogeneity on FedAvg", ICML 2025
(spec: shared/research/fedq_bass_wide.md, section C). Two parts, every run a taciturn run directory:

1. Theory-faithful (Thms 1-3). Fashion-MNIST classes 0 and 1, 10 clients, clients holding one class
   each (five per class), MLP 784-n-n-1 in the NTK parameterisation, squared loss, full-batch
   gradient descent with tau local steps, full participation, widths n = 64 ... 4096. Each run
   switches on the analysis (engine/analysis.py): client divergence, NTK change, distance to the
   linearised model, and a centralized twin that takes the same number of steps from the same
   initialisation. Against width, log-log, with fitted slopes (theory: -1/2):
   (a) RMSE between FedAvg's and centralized GD's outputs on the training points after the last
       round, split into the infinite-width part (the same two runs of the linearised network,
       tasks/lazy.linearized_fedavg, from the run's own initial kernel) and the rest;
   (b) client divergence sum_i p_i ||theta_i - theta_bar|| of the effective weights, mean over rounds;
   (c) relative change of the empirical NTK after the last round;
   (d) RMSE between the network and its linearisation after the last round: the first-order Taylor
       model around w0 evaluated at the weights FedAvg reached (as the authors' fedavg9.py does), and
       beside it Thm 2's own quantity, the RMSE between FedAvg's outputs and those of the linearised
       network trained separately by the same FedAvg (same clients, steps, lr, w0).
2. Practical (Figs. 1-2). Fashion-MNIST, 10 clients, Dirichlet(0.1) against IID, MLP 784-200k-10
   for k in {1, 2, 4, 16, 32}, cross-entropy, minibatch SGD with the lr tuned per width on IID data
   (tune_lr) on tuning seeds, the IID minus non-IID test accuracy gap per width on fresh report
   seeds, beside the paper's MNIST numbers; the gap's change from the narrowest to the widest
   network is tested seed by seed (protocol.paired), and where it is not detected the text says how
   many seeds would detect a change of the size measured (protocol.seeds_for_power).

    python benchmarks/wide_fedavg.py --jobs 2   # full (about 4 h on 2 idle cores): JSON, plots, docs
    python benchmarks/wide_fedavg.py --quick    # a few minutes, same code at tiny scale (smoke test)
The full run is longer than a work session, so what the tables need of each finished run (the
theory run's measurements, the practical run's accuracy by evaluation, the by-layer divergence) is
appended at once as one JSON line to benchmarks/results/wide_fedavg_runs.jsonl (commit it), keyed by
the run's config and the simulation code (run_key.py); a rerun reads stored runs back instead of
running them, so the run goes on over several sessions. Run directories go under runs/bench/; an
interrupted run is resumed from its last checkpoint (--fresh ignores both and starts everything again).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from collections.abc import Callable
from concurrent.futures import as_completed
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch
from protocol import (
    IntervalError,
    Protocol,
    bootstrap_groups,
    paired,
    protocol_lines,
    replace_section,
    save_figure,
    seeds_for_power,
    t_interval,
)
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from run_key import append_run, read_runs, run_key
from workers import one_run_per_core

from taciturn.algorithms.fedavg import FedAvgState
from taciturn.core.rng import SERVER
from taciturn.core.state_store import MemoryStateStore
from taciturn.engine.analysis import TwinState
from taciturn.experiments import checkpoint, runner
from taciturn.experiments.config import RunConfig, to_toml, validate
from taciturn.report.rundir import RunDir
from taciturn.tasks.lazy import divergence, linearized_fedavg, outputs, rmse
from taciturn.tasks.ntk import empirical_ntk

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
TITLE = "Wide FedAvg: does widening the network shrink the harm of heterogeneity?"
PAPER_GAP = {1: 17.4, 2: 9.5, 4: 6.3, 16: 2.0}  # Jian & Liu, FNN_k on MNIST, IID minus non-IID (points)
console = Console()


@dataclass(frozen=True)
class Scale:
    widths: tuple[int, ...]
    taus: tuple[int, ...]
    seeds: tuple[int, ...]
    seeds_widest: tuple[int, ...]  # seeds for the widest network (the bulk of the CPU time)
    rounds: int
    eval_every: int
    lr: float  # eta_0 under the NTK parameterisation, the same for every width
    multipliers: tuple[int, ...]
    practical_train: int
    practical_test: int
    practical_rounds: int
    practical_eval_every: int
    last_evals: int  # practical accuracy: mean of the last evaluations (non-IID curves oscillate)
    practical_seeds: tuple[int, ...]  # report seeds: the gap is stated with a t-interval over these
    practical_tuning_seeds: tuple[int, ...]  # the seeds whose IID accuracy chooses each width's lr
    practical_lrs: tuple[float, ...]  # the lr grid every width starts from, tuned on IID data
    practical_lr_ladder: tuple[float, ...]  # where the grid may widen when its edge wins (tune_lr)
    layer_rounds: int  # rounds of the per-layer divergence check (seed 0, largest tau)

    def __post_init__(self) -> None:  # a bad scale fails here, not hours into the run
        if not set(self.practical_lrs) <= set(self.practical_lr_ladder):
            raise ValueError(
                f"practical_lrs {self.practical_lrs} must all lie on practical_lr_ladder "
                f"{self.practical_lr_ladder}: tune_lr widens the grid along the ladder"
            )


FULL = Scale(
    widths=(64, 128, 256, 512, 1024, 2048, 4096),
    taus=(2, 5),
    seeds=(0, 1, 2, 3, 4),
    seeds_widest=(0, 1, 2, 3, 4),  # every width five seeds: a slope's interval needs spread at each point
    rounds=30,
    eval_every=2,
    lr=0.25,
    multipliers=(1, 2, 4, 16, 32),
    practical_train=6000,
    practical_test=2000,
    practical_rounds=50,
    practical_eval_every=5,
    last_evals=3,
    layer_rounds=10,
    # 10: the 3 seeds of issue 19 put the k = 1 minus k = 32 gap change at 4.6 points with a per-seed
    # sd of 2.4, which 80% power detects with 5-6 paired seeds, 12 at the sd's upper 80% bound
    practical_seeds=tuple(range(10)),
    practical_tuning_seeds=(100, 101),
    practical_lrs=(0.03, 0.1, 0.3),
    practical_lr_ladder=(0.01, 0.03, 0.1, 0.3, 1.0, 3.0),
)
QUICK = Scale(
    widths=(64, 256),
    taus=(2, 5),
    seeds=(0, 1),
    seeds_widest=(0, 1),
    rounds=4,
    eval_every=2,
    lr=0.25,
    multipliers=(1, 2),
    practical_train=500,
    practical_test=500,
    practical_rounds=2,
    practical_eval_every=1,
    last_evals=1,
    layer_rounds=2,
    practical_seeds=(0, 1),
    practical_tuning_seeds=(100,),
    practical_lrs=(0.1,),
    practical_lr_ladder=(0.1,),
)


# ----- configs -----
def theory_config(n: int, tau: int, seed: int, scale: Scale) -> RunConfig:
    return validate(
        {
            "name": f"theory-n{n}-tau{tau}-seed{seed}",
            "seed": seed,
            "rounds": scale.rounds,
            "loss": "mse",
            "data": {"dataset": "fashion_mnist", "classes": [0, 1], "train_size": 100, "test_size": 200},
            "partition": {"kind": "one_class", "num_clients": 10},
            "model": {"kind": "mlp", "hidden": [n, n], "parameterization": "ntk"},
            "algorithm": {
                "name": "fedavg",
                "fraction": 1.0,
                "local": {"steps": tau, "batch_size": 100_000, "lr": scale.lr},
            },
            "eval": {"every": scale.eval_every},
            "checkpoint": {"every": scale.rounds, "keep": 1},
            "analysis": {
                "divergence": True,
                "weight_change": True,
                "ntk_change": True,
                "linearization": True,
                "centralized": True,
                "probe_size": 100,  # every training point
            },
        },
        "wide_fedavg theory",
    )


def practical_config(k: int, split: str, scale: Scale, seed: int = 0, lr: float = 0.1) -> RunConfig:
    partition = {"kind": "iid", "num_clients": 10}
    if split == "non-iid":
        partition = {"kind": "dirichlet", "num_clients": 10, "alpha": 0.1, "min_size": 10}
    return validate(
        {
            "name": f"practical-k{k}-lr{lr}-s{seed}-{split}",
            "seed": seed,
            "rounds": scale.practical_rounds,
            "data": {
                "dataset": "fashion_mnist",
                "train_size": scale.practical_train,
                "test_size": scale.practical_test,
            },
            "partition": partition,
            "model": {"kind": "mlp", "hidden": [200 * k]},
            "algorithm": {
                "name": "fedavg",
                "fraction": 1.0,
                # The authors' code: SGD lr 0.1 (tuned here), batch 64, weight decay 1e-4, gradient clip 60.
                "local": {"epochs": 2, "batch_size": 64, "lr": lr, "weight_decay": 1e-4, "clip_norm": 60.0},
            },
            "eval": {"every": scale.practical_eval_every},
            "checkpoint": {"every": 10, "keep": 1},
        },
        "wide_fedavg practical",
    )


# ----- running -----
def run(config: RunConfig, out: Path, fresh: bool) -> RunDir:
    """A finished run directory for ``config``: reused if complete, resumed if interrupted."""
    rundir = RunDir(out)
    if not fresh and rundir.exists() and rundir.config.read_text() == to_toml(config):
        rows = rundir.read_metrics()
        if rows and rows[-1]["round"] == config.rounds:
            return rundir
        if rundir.latest_checkpoint() is not None:
            return runner.resume(out, progress=False)
    return runner.start(config, out, overwrite=True, progress=False)


Summarize = Callable[[RunConfig, RunDir], dict]


class RunLog:
    """The JSON-lines log of finished runs' summaries (run_key.py), and the seconds the runs this
    report uses took to make, whichever session made them."""

    def __init__(self, path: Path, fresh: bool):
        self.path, self.fresh, self.seconds = path, fresh, 0.0

    def stored(self) -> dict[str, dict]:
        """Every stored record by key, read once per call (none where ``fresh`` ignores them)."""
        return {} if self.fresh else read_runs(self.path)

    def store(self, key: str, name: str, summary: dict, seconds: float) -> dict:
        """Append a finished run's summary at once, with the seconds it took; the record."""
        finished = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        record = {"key": key, "name": name, "finished": finished, "seconds": seconds, "summary": summary}
        append_run(self.path, record)
        return record

    def use(self, record: dict) -> dict:
        """A record this report uses: its seconds counted, its summary returned."""
        self.seconds += record["seconds"]
        return record["summary"]

    def summary(self, key: str, name: str, compute: Callable[[], dict]) -> dict:
        """The summary stored under ``key``, or ``compute()``'s, stored at once."""
        if (record := self.stored().get(key)) is None:
            started = time.perf_counter()
            summary = compute()
            record = self.store(key, name, summary, time.perf_counter() - started)
        return self.use(record)


def summarize_run(summarize: Summarize, config: RunConfig, out: Path, fresh: bool) -> tuple[dict, float]:
    """One run made (or resumed) and summarized, with the seconds it took: what a worker does."""
    started = time.perf_counter()
    return summarize(config, run(config, out, fresh)), time.perf_counter() - started


def run_all(
    jobs: list[tuple[str, RunConfig, Path]], summarize: Summarize, log: RunLog, workers: int = 1
) -> dict[str, dict]:
    """Each job's summary, by job key: read back from ``log`` where stored under the run's key (its
    config, the summary's kind and the simulation code), else run (resuming an interrupted run
    directory), summarized and stored as soon as it finishes. ``workers`` > 1 makes the missing runs
    in that many single-thread processes (workers.py): the runs are seeded, so which process makes a
    run does not matter, though torch's thread count may move its floats in the last digits."""
    keys = {key: run_key(to_toml(config), summarize.__name__) for key, config, _ in jobs}
    stored = log.stored()
    records = {key: stored[keys[key]] for key, _, _ in jobs if keys[key] in stored}
    missing = [(key, config, out) for key, config, out in jobs if key not in records]
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("runs", total=len(missing))

        def finished(key: str, config: RunConfig, summary: dict, seconds: float) -> None:
            records[key] = log.store(keys[key], config.name, summary, seconds)
            progress.console.log(f"{config.name}: {seconds:.1f} s")
            progress.advance(task)

        if workers > 1 and len(missing) > 1:
            with one_run_per_core(min(workers, len(missing))) as pool:
                made = {
                    pool.submit(summarize_run, summarize, config, out, log.fresh): (key, config)
                    for key, config, out in missing
                }
                for future in as_completed(made):
                    finished(*made[future], *future.result())
        else:
            for key, config, out in missing:
                progress.update(task, description=f"[bold]{config.name}")
                finished(key, config, *summarize_run(summarize, config, out, log.fresh))
    return {key: log.use(records[key]) for key, _, _ in jobs}


# ----- theory: measurements -----
def kernel_comparisons(config: RunConfig, rundir: RunDir) -> dict[str, float]:
    """The trained networks against the linearised network trained the same way (the n -> infinity limit).

    From the run's own initialisation: the empirical NTK and outputs over the training points, then
    FedAvg and centralized GD of the linearised network f_lin(w) = f(w0) + J(w0)(w - w0), same
    clients, steps and lr. tasks/lazy.linearized_fedavg runs them in function space, which is exact
    because f_lin is affine in w (tests/test_lazy_metrics.py checks it against FedAvg on the Taylor
    model in parameter space, by torch.func.jvp). After the last round, with F, C the trained
    networks' outputs (final checkpoint) and F_lin, C_lin the linearised ones:
    * (a) split in two: floor = RMSE(F_lin, C_lin), nonlinear = RMSE((F - C) - (F_lin - C_lin));
    * Thm 2 (Jian & Liu, ICML 2025; their sup over t taken at the last round):
      linearized_fedavg_rmse = RMSE(F, F_lin).
    """
    exp = runner.prepare(config, rundir.path)
    model = exp.task.model
    params0 = exp.task.init_params(exp.streams.torch(0, SERVER, "init"))
    x, y = exp.data.dataset.x_train, exp.data.dataset.y_train.to(torch.float32).unsqueeze(1)
    theta = empirical_ntk(model, params0, x).double()
    clients = [exp.data.client_indices(c).tolist() for c in range(exp.data.num_clients)]
    local = config.algorithm.local
    f0 = outputs(model, params0, x).double()
    fed_lin = linearized_fedavg(theta, f0, y, clients, local.lr, local.steps, config.rounds)[-1]
    cen_lin = linearized_fedavg(theta, f0, y, [list(range(len(x)))], local.lr, local.steps, config.rounds)[-1]
    folder = rundir.checkpoint_dir(config.rounds)
    state, _ = checkpoint.load(folder, FedAvgState(params0), MemoryStateStore())
    twin = checkpoint.load_extra(folder, "analysis", TwinState(params0, None))
    fed, cen = outputs(model, state.params, x).double(), outputs(model, twin.params, x).double()
    return {
        "output_rmse_at_end": rmse(fed, cen),
        "floor": rmse(fed_lin, cen_lin),
        "nonlinear": rmse(fed - cen, fed_lin - cen_lin),
        "linearized_fedavg_rmse": rmse(fed, fed_lin),
    }


def theory_summary(config: RunConfig, rundir: RunDir) -> dict[str, float]:
    rows = rundir.read_metrics()
    trained, last = rows[1:], rows[-1]
    return {
        "divergence": float(np.mean([r["divergence"] for r in trained])),
        "ntk_change": last["ntk_change"],
        "linearization_rmse": last["linearization_rmse"],
        "weight_change": last["weight_change"],
        "test_loss": last["loss"],
        "centralized_test_loss": last["centralized_loss"],
        "test_accuracy": last["accuracy"],
        "centralized_test_accuracy": last["centralized_accuracy"],
        **kernel_comparisons(config, rundir),
    }


def layer_config(n: int, scale: Scale) -> RunConfig:
    return theory_config(n, max(scale.taus), 0, scale).model_copy(update={"rounds": scale.layer_rounds})


def stored_layer_divergence(scale: Scale, out: Path, log: RunLog) -> dict[int, dict[str, float]]:
    """layer_divergence, kept in the log like a run (JSON turns its width keys into strings)."""
    key = run_key("layer_divergence", *(to_toml(layer_config(n, scale)) for n in scale.widths))
    found = log.summary(key, "layer_divergence", lambda: layer_divergence(scale, out))
    return {int(n): row for n, row in found.items()}


def layer_divergence(scale: Scale, out: Path) -> dict[int, dict[str, float]]:
    """(b) by layer: client divergence of the input layer (fan-in 784 at every width) and of the
    layers whose fan-in is the width, in effective weights, and of the raw NTK-parameterised weights;
    mean over the first rounds of seed 0, the largest tau. Driven round by round with the engine."""
    result = {}
    for n in scale.widths:
        config = layer_config(n, scale)
        exp = runner.prepare(config, out / f"n{n}")
        state = exp.algorithm.init_server(exp.task.init_params(exp.streams.torch(0, SERVER, "init")), 10)
        sums = {"input layer": 0.0, "width fan-in layers": 0.0, "all (effective)": 0.0, "all (raw NTK)": 0.0}
        for round in range(1, scale.layer_rounds + 1):
            started_from = state
            state, report = exp.federation.run_round(state, round)
            models = exp.algorithm.client_models(started_from, report.arrivals)
            weights = [w for w, _ in models]
            effective = [exp.analysis.effective(m) for _, m in models]
            first = [{k: v for k, v in m.items() if k.startswith("1.")} for m in effective]
            rest = [{k: v for k, v in m.items() if not k.startswith("1.")} for m in effective]
            sums["input layer"] += divergence(first, weights)
            sums["width fan-in layers"] += divergence(rest, weights)
            sums["all (effective)"] += divergence(effective, weights)
            sums["all (raw NTK)"] += divergence([m for _, m in models], weights)
        result[n] = {k: v / scale.layer_rounds for k, v in sums.items()}
    return result


def fit_slope(widths: list[int], values: list[float]) -> float:
    """Least-squares slope of log(value) against log(width)."""
    return float(np.polyfit(np.log(widths), np.log(values), 1)[0])


def slope_interval(widths: list[int], per_seed: list[list[float]]) -> list[float] | None:
    """95% percentile-bootstrap interval of the slope of log(mean over seeds) against log(width),
    the seeds at each width resampled on their own; None if some width has fewer than 2 seeds."""
    try:
        lo, hi = bootstrap_groups(per_seed, lambda *groups: fit_slope(widths, [g.mean() for g in groups]))
    except IntervalError:
        return None
    return [lo, hi]


THEORY_QUANTITIES = {
    "output_rmse": ("output_rmse_at_end", "(a) FedAvg vs centralized outputs, RMSE"),
    "nonlinear": ("nonlinear", "(a) its finite-width part"),
    "divergence": ("divergence", "(b) client divergence (effective weights)"),
    "ntk_change": ("ntk_change", "(c) relative NTK change"),
    "linearization": (
        "linearization_rmse",
        "(d) RMSE to the linearised network (Taylor, at FedAvg's weights)",
    ),
    "linearized_fedavg": (
        "linearized_fedavg_rmse",
        "(d) RMSE to linearised FedAvg trained on its own (Thm 2)",
    ),
}


def theory_table(scale: Scale, per_run: dict[str, dict[str, float]]) -> dict:
    """Means over seeds per (tau, width), slopes against width, and their bootstrap intervals, from
    each run's theory_summary."""
    result: dict = {"runs": per_run, "mean": {}, "slopes": {}, "slope_ci": {}}
    for tau in scale.taus:
        means, seed_values = {}, {}
        for n in scale.widths:
            seeds = scale.seeds_widest if n == max(scale.widths) else scale.seeds
            seed_values[n] = values = [per_run[f"n{n}-tau{tau}-seed{s}"] for s in seeds]
            means[n] = {k: float(np.mean([v[k] for v in values])) for k in values[0]}
        result["mean"][tau] = means
        result["slopes"][tau] = {
            name: fit_slope(list(scale.widths), [means[n][column] for n in scale.widths])
            for name, (column, _) in THEORY_QUANTITIES.items()
        }
        result["slope_ci"][tau] = {
            name: slope_interval(
                list(scale.widths), [[v[column] for v in seed_values[n]] for n in scale.widths]
            )
            for name, (column, _) in THEORY_QUANTITIES.items()
        }
    return result


# ----- practical -----
def practical_key(k: int, lr: float, seed: int, split: str) -> str:
    return f"k{k}-lr{lr}-s{seed}-{split}"


def practical_summary(config: RunConfig, rundir: RunDir) -> dict[str, list]:
    """A practical run's test accuracy at each evaluation, and the rounds they were taken at."""
    rows = rundir.read_metrics()
    return {"round": [r["round"] for r in rows], "accuracy": [r["accuracy"] for r in rows]}


def final_accuracy(summary: dict[str, list], scale: Scale) -> float:
    return float(np.mean(summary["accuracy"][-scale.last_evals :]))


def tune_lr(scale: Scale, iid_accuracy: Callable[[float], float]) -> tuple[float, list[float]]:
    """One width's learning rate: the best mean IID accuracy over seeds (``iid_accuracy``) on the
    grid, the grid widened one ladder step at a time toward whichever edge wins (a best at the edge
    says the optimum may lie beyond it) until the best has a tried neighbour on each side or the
    ladder ends. Returns the best and the learning rates tried, ascending."""
    ladder = scale.practical_lr_ladder
    scores = {lr: iid_accuracy(lr) for lr in scale.practical_lrs}
    while True:
        tried = sorted(scores)
        best = max(tried, key=scores.__getitem__)
        step = ladder.index(best)
        if best == tried[0] and step > 0:
            wider = ladder[step - 1]
        elif best == tried[-1] and step < len(ladder) - 1:
            wider = ladder[step + 1]
        else:
            return best, tried
        scores[wider] = iid_accuracy(wider)


def practical_table(
    scale: Scale, runs: dict[str, dict], lrs: dict[int, float], tried: dict[int, list[float]]
) -> dict:
    """IID and non-IID accuracy at each width's tuned lr; the gap per seed (paired) with its 95%
    t-interval over seeds; the lrs the tuning tried."""
    result = {}
    for k, lr in lrs.items():
        per_seed = {
            split: [
                final_accuracy(runs[practical_key(k, lr, s, split)], scale) for s in scale.practical_seeds
            ]
            for split in ("iid", "non-iid")
        }
        gaps = [100 * (a - b) for a, b in zip(per_seed["iid"], per_seed["non-iid"], strict=True)]
        try:
            ci = list(t_interval(gaps))
        except IntervalError:
            ci = None
        result[k] = {
            "lr": lr,
            "iid": float(np.mean(per_seed["iid"])),
            "non-iid": float(np.mean(per_seed["non-iid"])),
            "gap_points": float(np.mean(gaps)),
            "gap_ci": ci,
            "gap_per_seed": gaps,
            "lrs_tried": tried[k],
        }
    return result


def width_effect(scale: Scale, practical: dict) -> dict:
    """The gap's change from the narrowest to the widest network, seed by seed (the same seed's
    partition and draws at both widths): the paired interval, its sentence, and how many seeds a
    paired test would need to detect a change of the size measured with 80% power."""
    narrow, wide = min(practical), max(practical)
    a, b = practical[narrow]["gap_per_seed"], practical[wide]["gap_per_seed"]
    try:
        p = paired(a, b, (f"the gap at k = {narrow}", f"at k = {wide}"))
    except IntervalError:
        return {"sentence": "fewer than two report seeds: no test of the width effect", "paired": None}
    needed = seeds_for_power(p.per_seed, p.mean)
    # a wider gap is the harm of heterogeneity, so the width whose gap is higher is the worse one
    sentence = p.sentence("the IID minus non-IID accuracy gap (points)", lower_is_better=True, digits=1)
    if p.direction == 0:
        sentence += (
            f" A paired test would need {needed} seeds to detect a change of {p.mean:+.1f} points at this "
            f"spread with 80% power; this run has {p.n}."
            if needed
            else " No feasible number of seeds would."
        )
    return {"sentence": sentence, "paired": p.as_dict(), "seeds_for_80_power": needed}


def protocols(scale: Scale, quick: bool) -> tuple[Protocol, Protocol]:
    """The theory part tunes nothing (eta_0 fixed); the practical part tunes lr on its tuning seeds."""
    theory = Protocol("none", (), scale.seeds, smoke=quick)
    practical = Protocol("tuning_seeds", scale.practical_tuning_seeds, scale.practical_seeds, smoke=quick)
    return theory, practical


# ----- plots -----
def plot_theory(scale: Scale, theory: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    widths = np.array(scale.widths)
    panels = [
        (
            "(a) FedAvg vs centralized outputs",
            ["output_rmse", "nonlinear"],
            "RMSE on training points, last round",
        ),
        ("(b) client divergence", ["divergence"], r"$\sum_i p_i\|\theta_i-\bar\theta\|$, mean over rounds"),
        ("(c) empirical NTK change", ["ntk_change"], r"$\|\Theta_T-\Theta_0\|_F/\|\Theta_0\|_F$"),
        (
            "(d) distance to the linearised network",
            ["linearization", "linearized_fedavg"],
            r"RMSE$(f, f_{lin})$ on training points, last round",
        ),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8.2))
    colors = {
        "output_rmse": "tab:blue",
        "nonlinear": "tab:red",
        "divergence": "tab:green",
        "linearized_fedavg": "tab:orange",
    }
    short = {
        "output_rmse": "measured",
        "nonlinear": "finite-width part",
        "linearization": "Taylor at FedAvg's w",
        "linearized_fedavg": "linearised FedAvg (Thm 2)",
    }
    for ax, (title, names, ylabel) in zip(axes.flat, panels, strict=True):
        for name in names:
            column = THEORY_QUANTITIES[name][0]
            for tau, style in zip(scale.taus, ("--", "-"), strict=False):
                values = np.array([theory["mean"][tau][n][column] for n in scale.widths])
                label = f"{short.get(name, '')} tau={tau}: slope {theory['slopes'][tau][name]:+.2f}".strip()
                ax.plot(widths, values, style, marker="o", color=colors.get(name, "tab:purple"), label=label)
        if names[0] == "output_rmse":
            for tau, style in zip(scale.taus, ("--", "-"), strict=False):
                floor = [theory["mean"][tau][n]["floor"] for n in scale.widths]
                ax.plot(widths, floor, style, color="grey", label=f"infinite width (kernel) tau={tau}")
        anchor_value = theory["mean"][scale.taus[-1]][scale.widths[0]][THEORY_QUANTITIES[names[-1]][0]]
        ax.plot(widths, anchor_value * (widths / widths[0]) ** -0.5, ":", color="black", label="slope -1/2")
        ax.set(xscale="log", yscale="log", xlabel="width n", ylabel=ylabel, title=title)
        ax.set_xticks(widths, [str(n) for n in widths])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.suptitle(
        "Theory-faithful: MLP 784-n-n-1, NTK parameterisation, squared loss, full-batch GD", fontsize=11
    )
    return save_figure(fig, path)


def plot_practical(scale: Scale, runs: dict[str, dict], practical: dict, path: Path) -> Path:
    """Curves: seed 0 at each width's tuned lr. Gap: mean over seeds with its 95% interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_curves, ax_gap) = plt.subplots(1, 2, figsize=(11, 4))
    cmap = plt.get_cmap("viridis")
    for i, k in enumerate(scale.multipliers):
        color = cmap(i / max(1, len(scale.multipliers) - 1))
        for split, style in (("iid", "-"), ("non-iid", "--")):
            curve = runs[practical_key(k, practical[k]["lr"], scale.practical_seeds[0], split)]
            ax_curves.plot(
                curve["round"],
                curve["accuracy"],
                style,
                color=color,
                label=f"k={k} {split}",
            )
    ax_curves.set(xlabel="round", ylabel="test accuracy", title="IID (solid) vs Dirichlet(0.1) (dashed)")
    ax_curves.grid(alpha=0.3)
    ax_curves.legend(fontsize=7, ncol=2)
    ks = list(scale.multipliers)
    gaps = np.array([practical[k]["gap_points"] for k in ks])
    cis = [practical[k]["gap_ci"] or [practical[k]["gap_points"]] * 2 for k in ks]
    errors = np.array([gaps - [ci[0] for ci in cis], [ci[1] for ci in cis] - gaps])
    ax_gap.errorbar(ks, gaps, yerr=errors, fmt="o-", capsize=3, label="taciturn, Fashion-MNIST (95% CI)")
    paper = [k for k in ks if k in PAPER_GAP]
    ax_gap.plot(paper, [PAPER_GAP[k] for k in paper], "s--", color="grey", label="Jian & Liu, MNIST (paper)")
    ax_gap.set(
        xscale="log",
        xlabel="width multiplier k (hidden units 200k)",
        ylabel="IID - non-IID accuracy (points)",
        title="Heterogeneity gap vs width",
    )
    ax_gap.set_xticks(ks, [str(k) for k in ks])
    ax_gap.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax_gap.grid(alpha=0.3)
    ax_gap.legend(fontsize=8)
    return save_figure(fig, path)


# ----- tables and docs -----
def with_interval(value: float, ci: list[float] | None, sign: str = "") -> tuple[str, str]:
    """``value`` and its 95% interval as text, to the decimals the interval supports: the last digit
    shown is the largest power of ten not above the interval's width (an interval 0.13 wide gets
    one decimal, 0.08 wide two). Without an interval (one seed): two decimals and "n/a"."""
    if ci is None:
        return f"{value:{sign}.2f}", "n/a (one seed)"
    width = ci[1] - ci[0]
    decimals = 4 if width <= 0 else min(4, max(0, -math.floor(math.log10(width))))
    text = f"{{:{sign}.{decimals}f}}".format
    return text(value), f"[{text(ci[0])}, {text(ci[1])}]"


def markdown(
    scale: Scale,
    theory: dict,
    layers: dict,
    practical: dict,
    command: str,
    minutes: float,
    results: dict | None = None,
) -> str:
    tau = scale.taus[-1]
    lines = [
        'Jian & Liu, "Widening the Network Mitigates the Impact of Data Heterogeneity on FedAvg", ICML 2025.',
        f"Reproduce with `{command}` (its runs took {minutes:.0f} minutes, summed run by run on the "
        "2-core CPU; `--jobs 2` makes two at once; `--quick` runs the same code "
        "at tiny scale in a few minutes, a smoke test). Numbers: `benchmarks/results/wide_fedavg.json`.",
        "",
        "### Theory-faithful",
        "",
        "Fashion-MNIST classes 0 (T-shirt) and 1 (trouser): 100 training images, 10 clients each holding "
        "10 images of one class (5 clients per class; taciturn's `one_class` split numbers them 0, 2, ... "
        "and 1, 3, ..., a relabelling of the paper's 0-4 / 5-9), 200 test images. MLP 784-n-n-1 in the NTK "
        f"parameterisation (sigma_w^2 = 1.5, sigma_b^2 = 0.01), squared loss, full-batch GD with lr eta_0 = "
        f"{scale.lr} at every width, tau local steps, full participation, {scale.rounds} rounds, seeds "
        f"{list(scale.seeds)}"
        + (
            ""
            if scale.seeds_widest == scale.seeds
            else f" (width {max(scale.widths)}: seeds {list(scale.seeds_widest)})"
        )
        + " at every width. Every run has the analysis on: `[analysis]` with a centralized twin taking "
        "the same number of gradient steps from the same initial weights. The empirical NTK, Theta = J J^T, "
        "is taken in this NTK parameterisation: J holds the derivatives with respect to the N(0, 1) "
        "parameters, whose layers scale by sigma_w / sqrt(fan-in) in the forward pass. The authors' code "
        "(model.py) uses the standard parameterisation (weights drawn N(0, 1.5 / n) with n the hidden "
        "width, also for the first layer), where J is taken with respect to those weights; each layer's "
        "share of the kernel then differs by its factor sigma_w^2 / fan-in (1.5 / 784 for the first "
        "layer, 1.5 / n for the others), so (c) is not comparable point for point with their Figs. 3-4.",
        "",
        "![theory](img/wide_fedavg_theory.png)",
        "",
        "Fitted log-log slopes of the mean over seeds against width (theory: -1/2), with 95% "
        "percentile-bootstrap intervals (the seeds at each width resampled with replacement on their "
        "own, the slope refitted, 9,999 resamples); decimals as the interval supports:",
        "",
        "| quantity | " + " | ".join(f"tau = {t}: slope | 95% interval" for t in reversed(scale.taus)) + " |",
        "|---|" + "---|---|" * len(scale.taus),
    ]
    for name, (_, label) in THEORY_QUANTITIES.items():
        cells = [
            " | ".join(with_interval(theory["slopes"][t][name], theory["slope_ci"][t][name], "+"))
            for t in reversed(scale.taus)
        ]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Means over seeds, tau = {tau}:",
        "",
        "| width | (a) RMSE | infinite-width part | finite-width part | (b) divergence | (c) NTK change "
        "| (d) RMSE to linearised (Taylor) | (d) RMSE to linearised FedAvg (Thm 2) "
        "| test loss FedAvg / centralized |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n in scale.widths:
        m = theory["mean"][tau][n]
        lines.append(
            f"| {n} | {m['output_rmse_at_end']:.4f} | {m['floor']:.4f} | {m['nonlinear']:.4f} | "
            f"{m['divergence']:.4f} | {m['ntk_change']:.4f} | {m['linearization_rmse']:.4f} | "
            f"{m['linearized_fedavg_rmse']:.4f} | "
            f"{m['test_loss']:.4f} / {m['centralized_test_loss']:.4f} |"
        )
    keys = list(next(iter(layers.values())))
    lines += [
        "",
        f"(b) by layer, mean over the first {scale.layer_rounds} rounds (seed 0, tau = {tau}): the input "
        "layer's fan-in is 784 at every width, the other layers' fan-in is n; effective weights are "
        "s_w W as the forward pass uses them, raw ones the N(0, 1) parameters of the NTK parameterisation.",
        "",
        "| width | " + " | ".join(keys) + " |",
        "|---|" + "---|" * len(keys),
    ]
    for n, row in layers.items():
        lines.append(f"| {n} | " + " | ".join(f"{row[k]:.4f}" for k in keys) + " |")
    lines += [
        "",
        "### Practical",
        "",
        f"Fashion-MNIST ({scale.practical_train} training images sampled by class, "
        f"{scale.practical_test} test), "
        "10 clients, Dirichlet(0.1) label split against IID, MLP 784-200k-10 (PyTorch's parameterisation "
        "and initialisation), cross-entropy, the authors' SGD settings (batch 64, weight decay 1e-4, "
        "gradient clip 60) with the learning rate tuned per width on IID data: the best mean IID accuracy "
        f"over the tuning seeds {list(scale.practical_tuning_seeds)} on the grid "
        f"{list(scale.practical_lrs)}, "
        "the same for every width, widened one step "
        f"at a time along {list(scale.practical_lr_ladder)} toward an edge that wins until the best lies "
        "inside what was tried (`tune_lr`). The non-IID runs then use that lr, so the gap is not "
        "confounded with a step size fixed across widths. Tuning rather than the NTK parameterisation: "
        "this part asks what width does to FedAvg as it is trained in practice and in the paper's Figs. "
        "1-2, and the NTK parameterisation with a fixed lr is a different, lazier training regime at "
        "large width. 2 local "
        f"epochs, full participation, {scale.practical_rounds} rounds, report seeds "
        f"{list(scale.practical_seeds)}. "
        f"Accuracy: mean of the last {scale.last_evals} evaluations (every {scale.practical_eval_every} "
        "rounds); gap: IID minus non-IID per seed, mean and 95% t-interval over seeds.",
        "",
        "![practical](img/wide_fedavg_practical.png)",
        "",
        "| k | hidden units | tuned lr | lrs tried | IID | Dirichlet(0.1) | gap (points) | 95% interval "
        "| paper, MNIST FNN_k |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    ladder = scale.practical_lr_ladder
    for k, row in practical.items():
        edge = " (ladder's edge)" if len(ladder) > 1 and row["lr"] in (min(ladder), max(ladder)) else ""
        tried = ", ".join(map(str, row["lrs_tried"]))
        lines.append(
            f"| {k} | {200 * k} | {row['lr']}{edge} | {tried} | {row['iid']:.4f} | {row['non-iid']:.4f} | "
            f"{' | '.join(with_interval(row['gap_points'], row['gap_ci']))} | {PAPER_GAP.get(k, '-')} |"
        )
    if results:
        lines += ["", f"The gap's change with width, seed by seed: {results['gap_change']['sentence']}"]
        lines += [
            "",
            protocol_lines(results["protocol"]),
            "",
            "Theory part. " + protocol_lines(results["theory_protocol"]),
        ]
    return "\n".join(lines) + "\n"


def readme_lines(results: dict) -> str:
    """The README's lines, from the intervals alone: the practical gap at the narrowest and widest
    network with the paired change between them, and the theory's slopes against Thms 1-2's -1/2."""
    practical = results["practical"]
    narrow, wide = min(practical, key=int), max(practical, key=int)

    def gap(k: str) -> str:
        value, ci = with_interval(practical[k]["gap_points"], practical[k]["gap_ci"])
        return f"{value} points {ci} at k = {k}"

    tau = max(results["slope_ci_by_tau"], key=int)
    slopes, cis = results["slopes_by_tau"][tau], results["slope_ci_by_tau"][tau]

    def slope(quantity: str) -> str:
        value, ci = with_interval(slopes[quantity], cis[quantity], "+")
        return f"{value} {ci}"

    seeds = results["protocol"]["report_seeds"]
    return "\n".join(
        [
            f"- Practical (Dirichlet(0.1) against IID, lr chosen per width on tuning seeds "
            f"{results['protocol']['tuning_seeds']}, {len(seeds)} report seeds): the IID minus non-IID "
            f"accuracy gap is {gap(narrow)} and {gap(wide)}; seed by seed, "
            f"{results['gap_change']['sentence']}",
            f"- Theory (NTK parameterisation, {len(results['theory_protocol']['report_seeds'])} seeds, "
            f"tau = {tau}): log-log slopes against width of the relative NTK change "
            f"{slope('ntk_change')}, the clients' divergence {slope('divergence')} and FedAvg's distance "
            f"to centralized GD {slope('output_rmse')}, against the -1/2 of Thms 1-2 (upper bounds).",
        ]
    )


# ----- main -----
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny scale, a few minutes (smoke test); writes only under runs/"
    )
    parser.add_argument(
        "--fresh", action="store_true", help="rerun every run instead of reusing finished ones"
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument(
        "--jobs", type=int, default=1, help="worker processes of one thread each (default 1: in this process)"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    scale = QUICK if args.quick else FULL
    out = ROOT / "runs" / "bench" / ("wide_fedavg-quick" if args.quick else "wide_fedavg")
    if args.fresh:
        shutil.rmtree(out, ignore_errors=True)
    log = RunLog(
        out / "runs.jsonl" if args.quick else ROOT / "benchmarks" / "results" / "wide_fedavg_runs.jsonl",
        args.fresh,
    )

    theory_jobs = []
    for n in scale.widths:
        for tau in scale.taus:
            for seed in scale.seeds_widest if n == max(scale.widths) else scale.seeds:
                key = f"n{n}-tau{tau}-seed{seed}"
                theory_jobs.append((key, theory_config(n, tau, seed, scale), out / "theory" / key))

    def practical_jobs(split: str, lrs: dict[int, tuple[float, ...]], seeds=scale.practical_seeds) -> list:
        return [
            (
                key := practical_key(k, lr, seed, split),
                practical_config(k, split, scale, seed, lr),
                out / "practical" / key,
            )
            for k, width_lrs in lrs.items()
            for lr in width_lrs
            for seed in seeds
        ]

    console.rule("[bold]Wide FedAvg: theory-faithful")
    theory = theory_table(scale, run_all(theory_jobs, theory_summary, log, args.jobs))
    console.rule("[bold]Wide FedAvg: divergence by layer")
    layers = stored_layer_divergence(scale, out / "layers", log)
    console.rule("[bold]Wide FedAvg: practical")
    practical_runs: dict[str, dict] = {}
    lrs, tried = {}, {}
    for k in scale.multipliers:

        def iid_accuracy(lr: float, k: int = k) -> float:  # on the tuning seeds only
            found = run_all(
                practical_jobs("iid", {k: (lr,)}, scale.practical_tuning_seeds),
                practical_summary,
                log,
                args.jobs,
            )
            return float(np.mean([final_accuracy(summary, scale) for summary in found.values()]))

        lrs[k], tried[k] = tune_lr(scale, iid_accuracy)
    chosen = {k: (lr,) for k, lr in lrs.items()}
    report_jobs = practical_jobs("iid", chosen) + practical_jobs("non-iid", chosen)
    practical_runs = run_all(report_jobs, practical_summary, log, args.jobs)
    practical = practical_table(scale, practical_runs, lrs, tried)
    gap_change = width_effect(scale, practical)

    images = ROOT / "docs" / "img" if not args.quick else out
    plot_theory(scale, theory, images / "wide_fedavg_theory.png")
    plot_practical(scale, practical_runs, practical, images / "wide_fedavg_practical.png")
    minutes = log.seconds / 60  # what the runs used here took to make, over however many sessions
    tau = scale.taus[-1]
    results = {
        "slopes": {k: theory["slopes"][tau][k] for k in ("output_rmse", "divergence", "ntk_change")},
        "gap_points": {str(k): row["gap_points"] for k, row in practical.items()},
        "gap_ci": {str(k): row["gap_ci"] for k, row in practical.items()},
        "slopes_by_tau": theory["slopes"],
        "slope_ci": {k: theory["slope_ci"][tau][k] for k in THEORY_QUANTITIES},
        "slope_ci_by_tau": theory["slope_ci"],
        "theory_means": theory["mean"],
        "theory_runs": theory["runs"],
        "divergence_by_layer": layers,
        "practical": {str(k): row for k, row in practical.items()},
        "gap_change": gap_change,
        "protocol": protocols(scale, args.quick)[1].record(
            {"lr per width": len(scale.practical_lrs)},
            "the lr grid widens along the ladder toward a winning edge, so a width may try more",
        ),
        "theory_protocol": protocols(scale, args.quick)[0].record({"theory (fixed lr)": 1}),
        "paper_gap_points_mnist": {str(k): v for k, v in PAPER_GAP.items()},
        "scale": scale.__dict__,
        "minutes": minutes,
    }
    target = out / "wide_fedavg.json" if args.quick else ROOT / "benchmarks" / "results" / "wide_fedavg.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(results, indent=1, default=str))
    command = "python benchmarks/wide_fedavg.py" + (" --quick" if args.quick else "")
    text = markdown(scale, theory, layers, practical, command, minutes, results)
    console.print(text, markup=False, highlight=False)
    if args.quick:  # a smoke run: the same section, beside its results, not in the docs
        (out / "wide_fedavg.md").write_text(text)
    else:
        replace_section("wide_fedavg", text, TITLE)  # the reading after the block is written by hand
        replace_section("wide_fedavg", readme_lines(results), TITLE, README)
    console.print(f"results: {target} ({minutes:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
