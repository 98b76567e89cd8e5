"""One client's local training on a ReLU MLP: autograd against the written-out algebra.

The three trainers a FedAvg client on a 784-200-200-10 MLP can run, on the same client, the same
minibatch plan and the same start, one thread (as in a parallel worker): the reference loop
(engine/local_training.py, autograd), the fused steps (engine/mlp_steps.py) and the low-rank
algebra for a whole round of clients (engine/lowrank.py, per client of the round). Repetitions
are interleaved; the table gives the median milliseconds per local step and the ratio to autograd.

    python benchmarks/mlp_steps.py --quick    # a few seconds
    python benchmarks/mlp_steps.py            # writes benchmarks/results/mlp_steps.json and docs
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from protocol import markdown_table, replace_section
from rich.console import Console
from rich.table import Table

from taciturn.algorithms.base import ClientContext, LocalTraining
from taciturn.core.rng import SERVER
from taciturn.engine import lowrank, mlp_steps
from taciturn.engine.local_training import train_locally
from taciturn.experiments.config import validate
from taciturn.experiments.runner import prepare

RESULTS = Path(__file__).resolve().parent / "results"
console = Console()


def experiment(batch: int, samples: int, clients: int, momentum: float, folder: Path):
    tree = {
        "name": "mlp-steps",
        "data": {
            "dataset": "synthetic",
            "num_samples": samples * clients,
            "num_features": 784,
            "num_classes": 10,
        },
        "partition": {"kind": "iid", "num_clients": clients},
        "model": {"kind": "mlp", "hidden": [200, 200]},
        "algorithm": {
            "name": "fedavg",
            "fraction": 1.0,
            "local": {"epochs": 1, "batch_size": batch, "lr": 0.05, "momentum": momentum},
        },
        "engine": {"executor": "sequential"},
    }
    exp = prepare(validate(tree, "<mlp_steps>"), folder)
    exp.federation.executor.close()
    start = exp.task.init_params(exp.streams.torch(0, SERVER, "init"))
    items = [
        (
            ClientContext(c, 1, None, None, exp.data.client_size(c), exp.streams, exp.data, exp.task.loss),
            LocalTraining(params=start, consts={}),
        )
        for c in range(clients)
    ]
    return exp.algorithm, items


def measure(case: dict, reps: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        algorithm, items = experiment(
            case["batch"], case["samples"], case["clients"], case["momentum"], Path(folder)
        )
        config = algorithm.config.local
        steps = sum(-(-ctx.num_samples // config.batch_size) for ctx, _ in items)
        trainers = {
            "autograd": lambda: [train_locally(algorithm, ctx, work, config) for ctx, work in items],
            "fused": lambda: mlp_steps.train_each(algorithm, items, config),
        }
        if not case["momentum"]:
            trainers["low-rank"] = lambda: lowrank.train_group(algorithm, items, config)
        times: dict[str, list[float]] = {name: [] for name in trainers}
        for _ in range(reps):
            for name, run in trainers.items():
                began = time.perf_counter()
                run()
                times[name].append((time.perf_counter() - began) / steps * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


CASES = [  # samples per client and clients per round as in the speed workloads
    {
        "label": "W3: batch 10, 60 samples, 50 clients",
        "batch": 10,
        "samples": 60,
        "clients": 50,
        "momentum": 0.0,
    },
    {
        "label": "W2: batch 32, 600 samples, 10 clients",
        "batch": 32,
        "samples": 600,
        "clients": 10,
        "momentum": 0.0,
    },
    {"label": "demo: batch 32, momentum 0.5", "batch": 32, "samples": 600, "clients": 10, "momentum": 0.5},
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one repetition of small clients")
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    reps = 1 if args.quick else args.reps
    cases = [{**c, "clients": 4} for c in CASES] if args.quick else CASES
    results = {c["label"]: measure(c, reps) for c in cases}
    table = Table(title="milliseconds per local step, one thread (median), and ratio to autograd")
    for column in ("case", "autograd", "fused", "low-rank"):
        table.add_column(column, justify="left" if column == "case" else "right")
    rows = []
    for label, ms in results.items():
        cells = [
            "-" if name not in ms else f"{ms[name]:.3f} ({ms['autograd'] / ms[name]:.2f}x)"
            for name in ("autograd", "fused", "low-rank")
        ]
        table.add_row(label, *cells)
        rows.append([label, *cells])
    console.print(table)
    if args.quick:
        return
    command = f"python benchmarks/mlp_steps.py --reps {args.reps}"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "mlp_steps.json").write_text(
        json.dumps({"command": command, "ms_per_step": results}, indent=1)
    )
    body = (
        f"Command: `{command}` (results: `benchmarks/results/mlp_steps.json`). Milliseconds per local "
        "step on one thread (median of the repetitions) and the speed-up over autograd; the low-rank "
        "algebra trains all the case's clients at once (plain SGD only):\n\n"
        + markdown_table(["case", "autograd", "fused", "low-rank"], rows)
    )
    replace_section(
        "mlp_steps", body, "One client's local steps on a ReLU MLP: autograd and written-out algebra"
    )


if __name__ == "__main__":
    main()
