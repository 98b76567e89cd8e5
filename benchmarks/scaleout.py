"""Scale-out: taciturn's Ray executor against its parallel executor, Flower (Ray) and the floor.

The workloads are benchmarks/speed.py's W (CNN, cross-silo) and W3 (MLP, cross-device), each
implementation executing the same plan of SGD steps. taciturn ray runs on a local Ray with 2
single-CPU worker actors (engine.workers = 2); taciturn parallel with 2 worker processes; Flower's
simulation with 2 single-CPU Ray actors. Each command is timed whole (Ray's start-up included),
interleaved (repetition 1 of everything, then 2, ...), median of the repetitions; ratios are paired
by repetition, with a 95% t-interval of the log ratios (speed.ratio_interval). A failed Flower or
floor repetition is left out of its medians and pairs and named in the docs (a failed taciturn run
stops the benchmark: those are what it measures). The parity figure is
the largest difference of any evaluated metric between the ray and the parallel runs (the same
clients and steps; partial sums are added in another order).

From the same runs, the costs the scaling projection in docs/benchmarks.md uses: each taciturn
run's training time (its metrics' wall_s: rounds and evaluations) and the rest of the command
(start-up, data, shutdown), so Ray's fixed cost per run, its extra cost per round, and a client's
training time on one worker (parallel's training time x workers / clients trained).

    python benchmarks/scaleout.py --quick     # smoke: 3 rounds, 1 repetition, no Flower
    python benchmarks/scaleout.py             # 3 repetitions, with Flower when `make bench-env` ran
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
from protocol import markdown_table, replace_section
from speed import (
    FLOWER_PY,
    PYTHON,
    RESULTS,
    WORK,
    console,
    export_plan,
    measure,
    ratio_interval,
    workload_tree,
    write_config,
)

WORKLOADS = ("W", "W3")
IMPLS = ("ray", "parallel", "flower", "floor")
WORKERS = 2
TITLE = "Scale-out: the Ray executor (issue 16)"  # its docs section, written by a run or --docs-only
# The targets: (numerator, denominator, workload, bound) for "numerator / denominator <= bound".
TARGETS = (("ray", "parallel", "W", 1.15), ("ray", "parallel", "W3", 1.5), ("ray", "flower", "W3", 1 / 3))
# The projection's setting (docs/benchmarks.md): a round of 1,000 clients of a 100M-parameter float32
# model on N nodes of 8 single-core workers. Measured here: a client's training time per parameter
# (W3's MLP, whose time grows with its parameter count) and Ray's extra time per round. Assumed (one
# machine cannot measure them): a 10 Gb/s link per node and 10 GB/s memory for the driver's adds.
PROJECTION = {
    "clients": 1000,
    "params": 100_000_000,
    "workers_per_node": 8,
    "link_gbps": 10.0,
    "memory_gbs": 10.0,
}
PROJECTION_NODES = (1, 2, 4, 8, 16, 32)


def commands(name: str, quick: bool) -> tuple[dict[str, tuple[list[str], Path | None]], Path]:
    """Each implementation's command and, for taciturn's, its run folder; and the plan's folder."""
    folder = WORK.parent / "scaleout" / name
    config = write_config(workload_tree(name, quick), folder / "config.toml")
    export_plan(config, folder / "plan")
    run = [PYTHON, "-m", "taciturn.cli", "run", str(config), "--quiet", "--overwrite", "--no-report"]
    workers = ["--set", f"engine.workers={WORKERS}"]
    found: dict[str, tuple[list[str], Path | None]] = {
        impl: (
            [*run, "--out", str(folder / impl), "--set", f'engine.executor="{impl}"', *workers],
            folder / impl,
        )
        for impl in ("ray", "parallel")
    }
    found["floor"] = ([PYTHON, "floor.py", str(folder / "plan"), str(folder / "floor.json")], None)
    if FLOWER_PY.exists() and not quick:
        plan, out = str(folder / "plan"), str(folder / "flower.json")
        found["flower"] = ([str(FLOWER_PY), "flower_fedavg.py", plan, out], None)
    return found, folder / "plan"


def parity(ray_metrics: str, parallel_metrics: str) -> float:
    """The largest |ray - parallel| over every float metric of every evaluated round."""
    rows = [
        [json.loads(line) for line in Path(path).read_text().splitlines()]
        for path in (ray_metrics, parallel_metrics)
    ]
    return max(
        abs(a[key] - b[key])
        for a, b in zip(*rows, strict=True)
        for key in a
        if isinstance(a[key], float) and key != "wall_s"
    )


def training_s(run: Path) -> float:
    """A run's own clock over its rounds and evaluations (the last metrics row's wall_s)."""
    return json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["wall_s"]


def ray_start(run_log: Path) -> tuple[int, float]:
    """How many Ray nodes the run's actors were on, and how long its first round waited for them
    (the pipeline's shipping and whatever of their start-up was not done yet), from its log line
    "ray: W workers on N nodes, ready S s into the first round"."""
    for line in run_log.read_text().splitlines():
        said = line.split("ray: ", 1)[-1]
        if " nodes, ready " in said:
            nodes = int(said.split(" on ", 1)[1].split()[0])
            return nodes, float(said.split(" ready ", 1)[1].split()[0])
    raise ValueError(f"{run_log} does not say where the Ray workers ran")


def costs(
    wall: dict[str, list[float]], train: dict[str, list[float]], ready: list[float], rounds: int, clients: int
) -> dict:
    """Medians over the repetitions: Ray's fixed cost per run over parallel's (the command's time
    outside the rounds, counting the first round's wait for the actors, ``ready``, as start-up), its
    extra time per round, and a client's training time on one worker (parallel's time over the
    rounds, which also holds the driver's evaluations and aggregation: an upper bound)."""
    rounds_s = {
        "ray": [t - r for t, r in zip(train["ray"], ready, strict=True)],
        "parallel": train["parallel"],
    }
    outside = {i: [w - t for w, t in zip(wall[i], rounds_s[i], strict=True)] for i in rounds_s}
    return {
        "ray_fixed_s": statistics.median(
            r - p for r, p in zip(outside["ray"], outside["parallel"], strict=True)
        ),
        "ray_per_round_s": statistics.median(
            (r - p) / rounds for r, p in zip(rounds_s["ray"], rounds_s["parallel"], strict=True)
        ),
        "client_s": statistics.median(p * WORKERS / (rounds * clients) for p in train["parallel"]),
        "outside_rounds_s": {i: statistics.median(v) for i, v in outside.items()},
        "ray_ready_s": statistics.median(ready),
    }


def projection(client_s: float, params: int, ray_per_round_s: float) -> list[dict[str, float]]:
    """A round's seconds on each of PROJECTION_NODES: every worker trains its share of the clients
    one after another (each client's time scaled from ``client_s`` at ``params`` parameters), the
    broadcast leaves the driver's object store once per node, one partial per worker comes back
    over the driver's link and is added there (three passes over the model: read two, write one),
    plus Ray's measured extra time per round (a measured extra below zero is this machine's noise,
    not a saving: it counts as 0)."""
    p = PROJECTION
    model_bytes = 4 * p["params"]
    link_s = model_bytes / (p["link_gbps"] * 1e9 / 8)  # one model over one link
    add_s = 3 * model_bytes / (p["memory_gbs"] * 1e9)
    client = client_s * p["params"] / params
    rows = []
    for nodes in PROJECTION_NODES:
        workers = nodes * p["workers_per_node"]
        row = {
            "nodes": nodes,
            "workers": workers,
            "train_s": math.ceil(p["clients"] / workers) * client,
            "broadcast_s": nodes * link_s,
            "partials_s": workers * (link_s + add_s),
            "ray_s": max(ray_per_round_s, 0.0),
        }
        row["round_s"] = row["train_s"] + row["broadcast_s"] + row["partials_s"] + row["ray_s"]
        rows.append(row)
    return rows


def summary(wall: dict[str, dict[str, list[float | None]]]) -> dict[str, dict[str, float | None]]:
    """The issue's layout: per workload, every implementation's median whole-command seconds over
    the repetitions it completed (None where it completed none)."""
    out: dict[str, dict[str, float | None]] = {}
    for name, times in wall.items():
        done = {impl: [t for t in times.get(impl, []) if t is not None] for impl in IMPLS}
        out[name] = {impl: statistics.median(done[impl]) if done[impl] else None for impl in IMPLS}
    return out


def ratios(wall: dict[str, dict[str, list[float | None]]]) -> dict[str, dict[str, dict[str, float]]]:
    """Paired ratios of the targets over the repetitions where both sides completed, as
    speed.ratio_interval states them."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for top, bottom, name, _ in TARGETS:
        times = wall.get(name, {})
        pairs = [
            (a, b)
            for a, b in zip(times.get(top, []), times.get(bottom, []), strict=False)
            if a is not None and b is not None
        ]
        if pairs:
            tops, bottoms = zip(*pairs, strict=True)
            out.setdefault(name, {})[f"{top}/{bottom}"] = ratio_interval(list(tops), list(bottoms))
    return out


def verdicts(found: dict[str, dict[str, dict[str, float]]]) -> list[str]:
    """One line per target: held or not by the median ratio, and whether the whole 95% interval is
    on the same side (the only case a benchmark here states as a claim)."""
    lines = []
    for top, bottom, name, bound in TARGETS:
        target = (
            f"{name}: {top} <= {bound:.2f}x {bottom}"
            if bound >= 1
            else f"{name}: {bottom} >= {1 / bound:.0f}x {top}"
        )
        r = found.get(name, {}).get(f"{top}/{bottom}")
        if r is None:
            lines.append(f"{target}: not measured ({bottom if top == 'ray' else top} did not run)")
            continue
        held = r["median"] <= bound
        if r["reps"] < 2:
            sure = "one repetition: no interval, no claim"
        elif (r["high"] <= bound) if held else (r["low"] > bound):
            sure = "the whole 95% interval agrees"
        else:
            sure = "the 95% interval straddles the target: no claim"
        shown = (
            f"{r['median']:.3f}x median, 95% interval [{r['low']:.3f}, {r['high']:.3f}]"
            if bound >= 1
            else f"{bottom} / {top} {1 / r['median']:.2f}x median, "
            f"95% interval [{1 / r['high']:.2f}, {1 / r['low']:.2f}]"
        )
        lines.append(f"{target}: {'holds' if held else 'does not hold'} ({shown}, {r['reps']} reps; {sure})")
    return lines


def flower_version() -> str | None:
    if not FLOWER_PY.exists():
        return None
    done = subprocess.run(
        [str(FLOWER_PY), "-c", "import flwr; print(flwr.__version__)"], capture_output=True, text=True
    )
    return done.stdout.strip() or None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 3 rounds, 1 repetition")
    parser.add_argument(
        "--docs-only",
        action="store_true",
        help="rewrite the docs block from results/scaleout.json, run nothing",
    )
    args = parser.parse_args()
    if args.docs_only:
        results = json.loads((RESULTS / "scaleout.json").read_text())
        replace_section(
            "scaleout",
            docs_body(results, results["detail"]["smoke"]),
            TITLE,
        )
        return
    reps = 1 if args.quick else 3
    wall: dict[str, dict[str, list[float | None]]] = {}  # None: that repetition failed
    detail: dict[str, Any] = {
        "smoke": args.quick,
        "repetitions": reps,
        "workers": WORKERS,
        "flower_version": None if args.quick else flower_version(),
        "load_before": [],
        "failed": [],
        "costs": {},
    }
    diffs, nodes = [], set()
    for name in WORKLOADS:
        found, plan = commands(name, args.quick)
        rounds, clients = np.load(plan / "plan.npz")["round_clients"].shape
        params = json.loads((plan / "plan.json").read_text())["params"]
        wall[name] = {impl: [] for impl in found}
        train: dict[str, list[float]] = {"ray": [], "parallel": []}
        ready: list[float] = []
        for rep in range(reps):
            for impl, (command, run) in found.items():
                detail["load_before"].append(os.getloadavg()[0])
                measured = measure(command)
                if measured.returncode != 0:
                    if run is not None:  # taciturn's own runs are what this benchmark is about
                        raise SystemExit(f"{name} {impl} failed: {' '.join(command)}")
                    detail["failed"].append(f"{name} {impl} repetition {rep + 1}")
                    wall[name][impl].append(None)  # measure() printed its output's tail
                    continue
                wall[name][impl].append(measured.wall_s)
                if run is not None:
                    train[impl].append(training_s(run))
                if impl == "ray":
                    ray_nodes, ray_ready = ray_start(run / "run.log")
                    nodes.add(ray_nodes)
                    ready.append(ray_ready)
                console.print(f"  {name} rep {rep + 1} {impl:<9} {measured.wall_s:7.2f} s", highlight=False)
        diffs.append(
            parity(str(found["ray"][1] / "metrics.jsonl"), str(found["parallel"][1] / "metrics.jsonl"))
        )
        detail["costs"][name] = costs(wall[name], train, ready, rounds, clients) | {
            "rounds": int(rounds),
            "clients": int(clients),
            "params": params,
        }
    found_ratios = ratios(wall)
    results: dict[str, Any] = summary(wall)
    results["parity_max_abs_diff"] = max(diffs)
    results["nodes"] = max(nodes)
    detail |= {"wall_all_s": wall, "ratios": found_ratios, "targets": verdicts(found_ratios)}
    results["detail"] = detail
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "scaleout.json").write_text(json.dumps(results, indent=2) + "\n")
    console.print(docs_body(results, args.quick))
    replace_section("scaleout", docs_body(results, args.quick), TITLE)


def docs_body(results: dict[str, Any], quick: bool) -> str:
    detail = results["detail"]
    flower = detail["flower_version"] or "not installed"
    label = (
        "SMOKE RUN, no claim (3 rounds, 1 repetition: start-up dominates)."
        if quick
        else f"{detail['repetitions']} repetitions, interleaved; Flower {flower}."
    )
    rows = [
        [
            name,
            *(f"{results[name][impl]:.1f}" if results[name][impl] else "-" for impl in IMPLS),
            f"{results[name]['ray'] / results[name]['parallel']:.3f}",
        ]
        for name in WORKLOADS
    ]
    cost_rows = [
        [
            name,
            f"{c['outside_rounds_s']['parallel']:.1f}",
            f"{c['outside_rounds_s']['ray']:.1f}",
            f"{c['ray_ready_s']:.1f}",
            f"{c['ray_fixed_s']:.1f}",
            f"{c['ray_per_round_s'] * 1000:.0f}",
            f"{c['client_s'] * 1000:.0f}",
            f"{c['rounds']} x {c['clients']}",
        ]
        for name, c in detail["costs"].items()
    ]
    return "\n\n".join(
        [
            f"Command: `python benchmarks/scaleout.py{' --quick' if quick else ''}` "
            f"(results: `benchmarks/results/scaleout.json`). {label} Ray on {results['nodes']} node(s), "
            f"{detail['workers']} single-CPU workers; highest 1-minute load average before a command: "
            f"{max(detail['load_before']):.2f}.",
            "Whole-command wall seconds, median of the repetitions:",
            markdown_table(
                ["workload", "ray s", "parallel s", "flower s", "floor s", "ray / parallel"], rows
            ),
            "Targets (paired ratios by repetition):\n\n"
            + "\n".join(f"* {line}" for line in detail["targets"]),
            "Where the time goes (medians; the scaling projection below uses these): the command's time "
            "outside the rounds (start-up, data, shutdown; for ray also the first round's wait for its "
            "actors, of which the next column is the part not overlapped with the driver's set-up), "
            "Ray's extra fixed cost per run over parallel, its extra time per round, and one client's "
            "training time on one worker (parallel's time over the rounds x workers / clients trained):",
            markdown_table(
                [
                    "workload",
                    "parallel outside rounds s",
                    "ray outside rounds s",
                    "ray first-round wait s",
                    "ray fixed extra s",
                    "ray extra per round ms",
                    "client ms",
                    "rounds x clients",
                ],
                cost_rows,
            ),
            f"Largest metric difference ray vs parallel: {results['parity_max_abs_diff']:.2e}."
            + (f" Failed, left out: {', '.join(detail['failed'])}." if detail["failed"] else ""),
            projection_text(detail["costs"]["W3"]),
        ]
    )


def projection_text(w3: dict[str, Any]) -> str:
    p = PROJECTION
    rows = [
        [
            r["nodes"],
            r["workers"],
            *(f"{r[k]:.1f}" for k in ("train_s", "broadcast_s", "partials_s", "ray_s", "round_s")),
        ]
        for r in projection(w3["client_s"], w3["params"], w3["ray_per_round_s"])
    ]
    return (
        "Projection (computed from the W3 costs above; the text below derives it): a round of "
        f"{p['clients']:,} clients of a {p['params'] / 1e6:.0f}M-parameter model, "
        f"{p['workers_per_node']} single-core workers per node, "
        f"a client's training {w3['client_s'] * 1000:.1f} ms at {w3['params']:,} parameters scaled by the "
        f"parameter count, Ray's extra {w3['ray_per_round_s'] * 1000:.0f} ms per round"
        + (" (below zero: noise, counted as 0)" if w3["ray_per_round_s"] < 0 else "")
        + "; assumed: "
        f"{p['link_gbps']:.0f} Gb/s per link, {p['memory_gbs']:.0f} GB/s memory on the driver.\n\n"
        + markdown_table(
            ["nodes", "workers", "training s", "broadcast s", "partials s", "Ray per round s", "round s"],
            rows,
        )
    )


if __name__ == "__main__":
    main()
