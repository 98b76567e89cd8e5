"""Speed: taciturn against Flower, pfl-research and the floor, side by side in one invocation.

For every workload, taciturn writes the plan of the run (which clients train in which round, the
order each visits its samples, the initial weights; benchmarks/anchors/workload.py), and every
implementation executes exactly that plan: the same SGD steps from the same start, so all must
reach the same accuracy. Commands run interleaved (repetition 1 of everything, then 2, ...);
each is timed as a whole command (start-up, data loading, training, evaluation, shutdown) while a
sampler sums RSS and PSS over its whole process tree.

    python benchmarks/speed.py --quick            # about a minute, taciturn and the floor only
    make bench-env                                # Flower and pfl in their own venvs
    python benchmarks/speed.py                    # W, W2, W3, W3c (3 repetitions) and W4

Implementations: taciturn (default = executor "auto"), taciturn sequential, taciturn parallel and
vectorized (MLP workloads, where auto may choose otherwise), Flower 1.x simulation (Ray),
pfl-research SimulatedBackend, and the floor (a plain PyTorch loop over the same mini-batches with
2 threads).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from protocol import markdown_table, replace_section, t_interval
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
WORK = BENCH / "runs" / "speed"
RESULTS = BENCH / "results"
PYTHON = sys.executable
FLOWER_PY = BENCH / ".venv-flower" / "bin" / "python"
PFL_PY = BENCH / ".venv-pfl" / "bin" / "python"
console = Console()
IMPLS = [  # the columns of every table
    "taciturn",
    "taciturn_sequential",
    "taciturn_parallel",
    "taciturn_vectorized",
    "taciturn_parallel_vectorized",
    "flower",
    "pfl",
    "floor",
]
MATMUL_GFLOPS = 210  # dense matmul peak measured on this 2-core machine (issue 4)


def workload_tree(name: str, quick: bool) -> dict[str, Any]:
    """The taciturn config of each workload (Fashion-MNIST, fixed seed, SGD lr 0.05)."""
    cnn = {"kind": "cnn", "padding": "valid"}  # the anchors' 2-conv CNN: 582,026 parameters
    mlp = {"kind": "mlp", "hidden": [200, 200]}
    dirichlet = {"kind": "dirichlet", "num_clients": 100, "alpha": 0.5, "min_size": 10}
    cross_device = {"kind": "iid", "num_clients": 1000}
    trees = {
        "W": (dirichlet, cnn, 0.1, 32, 20, 5),
        "W2": (dirichlet, mlp, 0.1, 32, 50, 5),
        "W3": (cross_device, mlp, 0.05, 10, 100, 10),
        "W3c": (cross_device, cnn, 0.05, 10, 100, 10),
    }
    if name == "W4":
        return {
            "name": "W4",
            "seed": 0,
            "rounds": 3 if quick else 20,
            "data": {"dataset": "fashion_mnist"},
            "partition": {"kind": "iid", "num_clients": 10_000},
            "model": mlp,
            "algorithm": {"name": "scaffold", "fraction": 0.01, "local": {"batch_size": 10, "lr": 0.05}},
            "eval": {"every": 5, "batch_size": 1000},
            "checkpoint": {"every": 1000},
        }
    partition, model, fraction, batch, rounds, every = trees[name]
    if quick:
        rounds, every = 3, 3
    return {
        "name": name,
        "seed": 0,
        "rounds": rounds,
        "data": {"dataset": "fashion_mnist"},
        "partition": partition,
        "model": model,
        "algorithm": {
            "name": "fedavg",
            "fraction": fraction,
            "local": {"epochs": 1, "batch_size": batch, "lr": 0.05},
        },
        "eval": {"every": every, "batch_size": 1000},
        "checkpoint": {"every": 1000},
    }


def write_config(tree: dict[str, Any], path: Path) -> Path:
    from taciturn.experiments.config import to_toml, validate

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(to_toml(validate(tree, str(path))))
    return path


def export_plan(config_path: Path, folder: Path) -> None:
    """The exact SGD steps of the run, from taciturn's own seeded streams (see anchors/workload.py)."""
    from taciturn.algorithms.base import ClientContext
    from taciturn.core.rng import SERVER
    from taciturn.experiments.config import load_config
    from taciturn.experiments.runner import prepare

    config = load_config(config_path, ['engine.executor="sequential"'])
    exp = prepare(config, folder / "unused")
    exp.federation.executor.close()
    rounds, order, offsets = [], [], [0]
    for r in range(1, config.rounds + 1):
        selected = [
            int(c)
            for c in exp.algorithm.select_clients(
                None, r, exp.data.num_clients, exp.streams.numpy(r, SERVER, "select")
            )
        ]
        rounds.append(selected)
        for c in selected:
            ctx = ClientContext(
                c, r, None, None, exp.data.client_size(c), exp.streams, exp.data, exp.task.loss
            )
            samples = np.concatenate(ctx.batch_indices(config.algorithm.local))
            order.append(samples)
            offsets.append(offsets[-1] + len(samples))
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(
        folder / "plan.npz",
        round_clients=np.array(rounds),
        order=np.concatenate(order),
        offsets=np.array(offsets),
    )
    init = exp.task.init_params(exp.streams.torch(0, SERVER, "init"))
    np.savez(folder / "init.npz", **{k: v.numpy() for k, v in init.items()})
    local = config.algorithm.local
    meta = {
        "batch_size": local.batch_size,
        "lr": local.lr,
        "eval_every": config.eval.every,
        "model": config.model.kind,
        "hidden": list(getattr(config.model, "hidden", [])),
        "num_clients": exp.data.num_clients,
        "sgd_steps": int(
            sum(-(-(offsets[i + 1] - offsets[i]) // local.batch_size) for i in range(len(offsets) - 1))
        ),
        "samples": int(offsets[-1]),
        "params": int(sum(v.numel() for v in init.values())),
    }
    (folder / "plan.json").write_text(json.dumps(meta))


# ----- measuring one command -----
# Walking /proc and reading smaps_rollup costs CPU: every 50 ms it took a quarter of a core, which
# on 2 cores slowed the measured commands by up to 40% (2-thread matmuls wait for the preempted
# thread). Resident memory changes slowly, so a sample every half second finds the peak.
SAMPLE_EVERY_S = 0.5


def _tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                children.setdefault(int(stat[stat.rfind(")") + 2 :].split()[1]), []).append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def _memory_kb(pid: int) -> tuple[int, int]:
    rss = pss = 0
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Rss:"):
                rss = int(line.split()[1])
            elif line.startswith("Pss:"):
                pss = int(line.split()[1])
    except OSError:
        pass
    return rss, pss


@dataclass
class Measured:
    wall_s: float
    peak_rss_mb: float
    peak_pss_mb: float
    returncode: int


def measure(command: list[str], env: dict[str, str] | None = None, timeout: float = 3600) -> Measured:
    peak = {"rss": 0, "pss": 0}
    started = time.perf_counter()
    process = subprocess.Popen(
        command,
        cwd=BENCH / "anchors",
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            totals = [_memory_kb(p) for p in _tree(process.pid)]
            peak["rss"] = max(peak["rss"], sum(t[0] for t in totals))
            peak["pss"] = max(peak["pss"], sum(t[1] for t in totals))
            done.wait(SAMPLE_EVERY_S)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
    wall = time.perf_counter() - started
    done.set()
    sampler.join()
    if process.returncode != 0:
        console.print(f"[red]failed ({process.returncode})[/]: {' '.join(command)}\n{output[-2000:]}")
    return Measured(wall, peak["rss"] / 1024, peak["pss"] / 1024, process.returncode)


# ----- the implementations -----
def commands(
    workload: str, config: Path, plan: Path, out: Path, quick: bool
) -> dict[str, tuple[list[str], Path]]:
    # --no-report: Flower, pfl and the floor write no report either (`taciturn report` makes it later)
    taciturn = [PYTHON, "-m", "taciturn.cli", "run", str(config), "--quiet", "--overwrite", "--no-report"]
    found = {
        "taciturn": ([*taciturn, "--out", str(out / "taciturn")], out / "taciturn" / "metrics.jsonl"),
        "taciturn_sequential": (
            [*taciturn, "--out", str(out / "seq"), "--set", 'engine.executor="sequential"'],
            out / "seq" / "metrics.jsonl",
        ),
        "floor": ([PYTHON, "floor.py", str(plan), str(out / "floor.json")], out / "floor.json"),
    }
    if "mlp" in json.loads((plan / "plan.json").read_text())["model"]:
        for impl, executor in (
            ("taciturn_parallel", "parallel"),
            ("taciturn_vectorized", "vectorized"),
            ("taciturn_parallel_vectorized", "parallel_vectorized"),
        ):
            found[impl] = (
                [*taciturn, "--out", str(out / impl), "--set", f'engine.executor="{executor}"'],
                out / impl / "metrics.jsonl",
            )
    if FLOWER_PY.exists() and not quick:
        found["flower"] = (
            [str(FLOWER_PY), "flower_fedavg.py", str(plan), str(out / "flower.json")],
            out / "flower.json",
        )
    if PFL_PY.exists() and not quick:
        found["pfl"] = ([str(PFL_PY), "pfl_fedavg.py", str(plan), str(out / "pfl.json")], out / "pfl.json")
    return found


def final_accuracy(result: Path) -> float | None:
    if not result.exists():
        return None
    if result.suffix == ".jsonl":
        return json.loads(result.read_text().splitlines()[-1])["accuracy"]
    return json.loads(result.read_text()).get("accuracy")


def run_workload(name: str, reps: int, quick: bool, only: set[str] | None = None) -> dict[str, Any]:
    folder = WORK / name
    config = write_config(workload_tree(name, quick), folder / "config.toml")
    export_plan(config, folder / "plan")
    meta = json.loads((folder / "plan" / "plan.json").read_text())
    console.rule(
        f"{name}: {meta['sgd_steps']} SGD steps, {meta['samples']} samples, {meta['params']} parameters"
    )
    runs: dict[str, list[Measured]] = {}
    accuracy: dict[str, float | None] = {}
    load: list[float] = []
    executors: list[str] = []  # what `auto` chose in each repetition, and the numbers it chose by
    for rep in range(reps):
        for impl, (command, result) in commands(name, config, folder / "plan", folder / "out", quick).items():
            if only and impl not in only:
                continue
            result.unlink(missing_ok=True)
            load.append(os.getloadavg()[0])  # how busy the machine was just before (quiet: < 0.5)
            m = measure(command)
            runs.setdefault(impl, []).append(m)
            accuracy[impl] = final_accuracy(result)
            if impl == "taciturn":
                executors.append(executor_decision(result.parent / "run.log"))
            console.print(
                f"  rep {rep + 1} {impl:<22} {m.wall_s:7.2f} s  rss {m.peak_rss_mb:7.0f} MB  "
                f"pss {m.peak_pss_mb:7.0f} MB  acc {accuracy[impl]}",
                highlight=False,
                soft_wrap=True,
            )
    wall = {impl: statistics.median(m.wall_s for m in ms) for impl, ms in runs.items()}
    result = {
        "plan": meta,
        "wall_s": wall,
        "wall_all_s": {impl: [m.wall_s for m in ms] for impl, ms in runs.items()},
        "peak_rss_mb": {impl: max(m.peak_rss_mb for m in ms) for impl, ms in runs.items()},
        "peak_pss_mb": {impl: max(m.peak_pss_mb for m in ms) for impl, ms in runs.items()},
        "accuracy": accuracy,
        "load_before_max": max(load),
        "auto_chose": executors,
        "ratio_to_floor": {
            impl: ratio_interval([m.wall_s for m in ms], [m.wall_s for m in runs["floor"]])
            for impl, ms in runs.items()
            if impl != "floor" and "floor" in runs and len(ms) == len(runs["floor"])
        },
    }
    result["gflops"] = {impl: training_flops(meta) / 1e9 / w for impl, w in wall.items()}
    return result


def executor_decision(log: Path) -> str:
    """The executor `auto` ran, from the run log: the trial's line if it tried two, else its choice."""
    lines = log.read_text().splitlines() if log.exists() else []
    picked = [line.split("executor", 1)[1] for line in lines if "executor trial" in line]
    picked = picked or [
        line.split("executor: ", 1)[1].split(" (")[0] for line in lines if "executor: " in line
    ]
    return picked[-1].strip() if picked else "?"


def ratio_interval(times: list[float], floor: list[float]) -> dict[str, float]:
    """The ratio of an implementation's wall time to the floor's, paired by repetition (they ran
    back to back, so they shared the machine's state): the geometric mean with a 95% t-interval of
    the log ratios (benchmarks/protocol.py), and the median. One repetition gives no interval."""
    logs = np.log(np.asarray(times) / np.asarray(floor))
    low, high = t_interval(logs) if len(logs) > 1 else (float("nan"), float("nan"))
    return {
        "median": float(np.median(np.exp(logs))),
        "mean": float(np.exp(logs.mean())),
        "low": float(np.exp(low)),
        "high": float(np.exp(high)),
        "reps": len(logs),
    }


def training_flops(meta: dict[str, Any]) -> float:
    """Forward + backward multiply-adds of the planned samples (2 flops each, backward = 2x forward)."""
    if meta["model"] == "mlp":
        widths = [784, *meta["hidden"], 10]
        macs = sum(a * b for a, b in itertools.pairwise(widths))
    else:  # conv1 24x24x32x25, conv2 8x8x64x800, fc 1024x512, 512x10
        macs = 24 * 24 * 32 * 25 + 8 * 8 * 64 * 800 + 1024 * 512 + 512 * 10
    return 3 * 2 * macs * meta["samples"]


def run_w4(quick: bool) -> dict[str, Any]:
    folder = WORK / "W4"
    config = write_config(workload_tree("W4", quick), folder / "config.toml")
    out = folder / "out"
    m = measure(
        [PYTHON, "-m", "taciturn.cli", "run", str(config), "--quiet", "--overwrite", "--out", str(out)]
    )
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rounds = rows[-1]["round"]
    console.print(
        f"  W4: {m.wall_s:.1f} s, peak RSS {m.peak_rss_mb:.0f} MB, {rows[-1]['wall_s'] / rounds:.2f} s/round"
    )
    return {
        "peak_rss_gib": m.peak_rss_mb / 1024,
        "peak_pss_gib": m.peak_pss_mb / 1024,
        "s_per_round": rows[-1]["wall_s"] / rounds,
        "wall_s": m.wall_s,
        "rounds": rounds,
        "accuracy": rows[-1]["accuracy"],
    }


def show(results: dict[str, Any]) -> None:
    table = Table(title="whole-command wall seconds (median), and ratio to the floor")
    table.add_column("workload")
    impls = IMPLS
    for impl in impls:
        table.add_column(impl, justify="right")
    for name, res in results.items():
        if name == "W4" or not isinstance(res, dict) or "wall_s" not in res:
            continue
        floor = res["wall_s"].get("floor")
        cells = []
        for impl in impls:
            w = res["wall_s"].get(impl)
            cells.append("-" if w is None else f"{w:.1f}" + (f" ({w / floor:.2f}x)" if floor else ""))
        table.add_row(name, *cells)
    console.print(table)
    for line in claims(results):
        console.print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: 3 rounds, one repetition, no anchors"
    )
    parser.add_argument("--workloads", default="W2,W3,W,W3c,W4")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--section",
        default="speed",
        help="the docs/benchmarks.md section (and benchmarks/results/SECTION.json) the tables replace",
    )
    parser.add_argument(
        "--impls", default="", help=f"only these implementations, comma-separated (of {', '.join(IMPLS)})"
    )
    parser.add_argument(
        "--once", default="", help="workloads to run one repetition of (e.g. W3c, whose runs take minutes)"
    )
    args = parser.parse_args()
    reps = 1 if args.quick else args.reps
    results: dict[str, Any] = {
        "command": " ".join(["python benchmarks/speed.py", *sys.argv[1:]]),
        "cores": os.cpu_count(),
    }
    for name in args.workloads.split(","):
        times = 1 if name in args.once.split(",") else reps
        only = set(args.impls.split(",")) - {""} or None
        results[name] = run_w4(args.quick) if name == "W4" else run_workload(name, times, args.quick, only)
    show(results)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / ("speed_quick.json" if args.quick else f"{args.section}.json")
    out.write_text(json.dumps(summary(results), indent=1))
    console.print(f"results: {out}")
    if not args.quick:
        replace_section(
            args.section, render(results, args.section), "Speed: taciturn, Flower, pfl-research and the floor"
        )


def summary(results: dict[str, Any]) -> dict[str, Any]:
    """The numbers of the tables, in the layout issue 4 asks for."""
    out: dict[str, Any] = {"command": results["command"]}
    for name, res in results.items():
        if name in ("command", "cores"):
            continue
        if name == "W4":
            out[name] = res
            continue
        out[name] = {
            **res["wall_s"],
            "accuracy": res["accuracy"],
            "peak_rss_mb": res["peak_rss_mb"],
            "peak_pss_mb": res["peak_pss_mb"],
            "gflops": res["gflops"],
            "all_runs_s": res["wall_all_s"],
            "sgd_steps": res["plan"]["sgd_steps"],
            "ratio_to_floor": res["ratio_to_floor"],
            "load_before_max": res["load_before_max"],
            "auto_chose": res["auto_chose"],
        }
    out["claims"] = claims(results)
    return out


def claims(results: dict[str, Any]) -> list[str]:
    """Issue 21's two claims, decided from the intervals: W's ratio to the floor below 0.95 (the
    whole 95% interval), and on W3 `auto` within 5% of the fastest taciturn executor (medians)."""
    out = []
    w = results.get("W", {}).get("ratio_to_floor", {}).get("taciturn")
    if w:
        holds = w["high"] < 0.95
        out.append(
            f"W at or below 0.95x the floor: {'holds' if holds else 'does not hold'} "
            f"(auto/floor {w['mean']:.3f}x, 95% interval [{w['low']:.3f}, {w['high']:.3f}], {w['reps']} reps)"
        )
    w3 = results.get("W3", {}).get("wall_s", {})
    ours = {i: t for i, t in w3.items() if i.startswith("taciturn_")}
    if "taciturn" in w3 and ours:
        best = min(ours, key=ours.get)
        ratio = w3["taciturn"] / ours[best]
        out.append(
            f"W3 auto within 5% of the fastest executor: {'holds' if ratio <= 1.05 else 'does not hold'} "
            f"(auto {w3['taciturn']:.2f} s, {best} {ours[best]:.2f} s: {ratio:.3f}x, medians)"
        )
    return out


def _ratio_cell(ratio: dict[str, float] | None) -> str:
    if ratio is None:
        return "-"
    if ratio["reps"] < 2:
        return f"{ratio['mean']:.3f}"
    return f"{ratio['mean']:.3f} [{ratio['low']:.3f}, {ratio['high']:.3f}]"


def render(results: dict[str, Any], section: str = "speed") -> str:
    impls = IMPLS
    rows, memory, accuracy = [], [], []
    for name, res in results.items():
        if not isinstance(res, dict) or "wall_s" not in res or name == "W4":
            continue
        floor = res["wall_s"].get("floor")
        rows.append(
            [
                name,
                *(
                    f"{res['wall_s'][i]:.1f} ({res['wall_s'][i] / floor:.2f}x)" if i in res["wall_s"] else "-"
                    for i in impls
                ),
            ]
        )
        memory.append(
            [
                name,
                *(
                    f"{res['peak_pss_mb'][i]:.0f} / {res['peak_rss_mb'][i]:.0f}"
                    if i in res["peak_pss_mb"]
                    else "-"
                    for i in impls
                ),
            ]
        )
        accuracy.append(
            [
                name,
                *(f"{res['accuracy'][i]:.4f}" if res["accuracy"].get(i) is not None else "-" for i in impls),
            ]
        )
    parts = [
        f"Command: `{results['command']}` (results: `benchmarks/results/{section}.json`).",
        "Whole-command wall seconds, median of the repetitions, and the ratio to the floor:\n\n"
        + markdown_table(["workload", *impls], rows),
        "Peak memory of the whole process tree, PSS / RSS in MB (PSS splits shared pages fairly; RSS "
        "counts memory shared by forked workers once per process):\n\n"
        + markdown_table(["workload", *impls], memory),
        "Final test accuracy (every federated implementation takes the same SGD steps from the same "
        "weights; the floor takes them one after another on a single model, without averaging, so "
        "its accuracy differs):\n\n" + markdown_table(["workload", *impls], accuracy),
    ]
    ratios = [
        [name, *(_ratio_cell(res["ratio_to_floor"].get(i)) for i in impls if i != "floor")]
        for name, res in results.items()
        if isinstance(res, dict) and res.get("ratio_to_floor")
    ]
    loads = [
        res["load_before_max"]
        for res in results.values()
        if isinstance(res, dict) and "load_before_max" in res
    ]
    if loads:
        parts.append(f"Highest 1-minute load average before any command: {max(loads):.2f}.")
    if ratios:
        parts.append(
            "Wall time over the floor's, paired by repetition: geometric mean [95% t-interval]:\n\n"
            + markdown_table(["workload", *(i for i in impls if i != "floor")], ratios)
        )
    chose = [
        (name, res["auto_chose"])
        for name, res in results.items()
        if isinstance(res, dict) and res.get("auto_chose")
    ]
    if chose:
        parts.append(
            "What `auto` ran, per repetition:\n\n"
            + "\n".join(f"* {name}: " + "; ".join(c) for name, c in chose)
        )
    if claims(results):
        parts.append("\n".join(f"* {line}" for line in claims(results)))
    if "W4" in results:
        w4 = results["W4"]
        parts.append(
            f"W4 (SCAFFOLD, 10,000 clients, 100 a round, MLP): peak RSS {w4['peak_rss_gib']:.2f} GiB "
            f"(PSS {w4['peak_pss_gib']:.2f} GiB), {w4['s_per_round']:.2f} s per round, "
            f"{w4['wall_s']:.0f} s in all, final accuracy {w4['accuracy']:.4f}."
        )
    return "\n\n".join(parts)


if __name__ == "__main__":
    main()
