"""Scale-out: taciturn's Ray executor against its parallel executor, Flower (Ray) and the floor.

The workloads are benchmarks/speed.py's W (CNN, cross-silo) and W3 (MLP, cross-device), each
implementation executing the same plan of SGD steps. taciturn ray runs on a local Ray with 2
single-CPU worker actors (engine.workers = 2); taciturn parallel with 2 worker processes. Each
command is timed whole (Ray's start-up included), interleaved, median of the repetitions. The
parity column is the largest difference of any evaluated metric between the ray and the parallel
runs (the same clients and steps; partial sums are added in another order).

    python benchmarks/scaleout.py --quick     # smoke: 3 rounds, 1 repetition, no Flower
    python benchmarks/scaleout.py             # 3 repetitions, with Flower when `make bench-env` ran
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from docs_section import markdown_table, replace_section
from speed import (
    FLOWER_PY,
    PYTHON,
    RESULTS,
    WORK,
    console,
    export_plan,
    measure,
    workload_tree,
    write_config,
)

WORKLOADS = ("W", "W3")
IMPLS = ("ray", "parallel", "flower", "floor")
WORKERS = ("--set", "engine.workers=2")


def commands(name: str, quick: bool) -> dict[str, tuple[list[str], str]]:
    folder = WORK.parent / "scaleout" / name
    config = write_config(workload_tree(name, quick), folder / "config.toml")
    export_plan(config, folder / "plan")
    run = [PYTHON, "-m", "taciturn.cli", "run", str(config), "--quiet", "--overwrite", "--no-report"]
    found = {
        impl: (
            [
                *run,
                "--out",
                str(folder / impl),
                "--set",
                f'engine.executor="{impl}"',
                "--set",
                "engine.workers=2",
            ],
            str(folder / impl / "metrics.jsonl"),
        )
        for impl in ("ray", "parallel")
    }
    found["floor"] = ([PYTHON, "floor.py", str(folder / "plan"), str(folder / "floor.json")], "")
    if FLOWER_PY.exists() and not quick:
        plan, out = str(folder / "plan"), str(folder / "flower.json")
        found["flower"] = ([str(FLOWER_PY), "flower_fedavg.py", plan, out], "")
    return found


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 3 rounds, 1 repetition")
    args = parser.parse_args()
    reps = 1 if args.quick else 3
    results: dict = {"smoke": args.quick, "nodes": 1, "workers": 2, "repetitions": reps}
    diffs = []
    for name in WORKLOADS:
        found = commands(name, args.quick)
        times: dict[str, list[float]] = {impl: [] for impl in found}
        for rep in range(reps):
            for impl, (command, _) in found.items():
                measured = measure(command)
                if measured.returncode != 0:
                    raise SystemExit(f"{name} {impl} failed: {' '.join(command)}")
                times[impl].append(measured.wall_s)
                console.print(f"  {name} rep {rep + 1} {impl:<9} {measured.wall_s:7.2f} s", highlight=False)
        results[name] = {impl: statistics.median(times[impl]) if impl in times else None for impl in IMPLS}
        diffs.append(parity(found["ray"][1], found["parallel"][1]))
    results["parity_max_abs_diff"] = max(diffs)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "scaleout.json").write_text(json.dumps(results, indent=2) + "\n")
    rows = [
        [
            name,
            *(f"{results[name][impl]:.1f}" if results[name][impl] else "-" for impl in IMPLS),
            f"{results[name]['ray'] / results[name]['parallel']:.2f}",
        ]
        for name in WORKLOADS
    ]
    label = "SMOKE RUN (3 rounds, 1 repetition: start-up dominates; no claim)" if args.quick else ""
    body = (
        f"{label}\n\n"
        + markdown_table(["workload", "ray s", "parallel s", "flower s", "floor s", "ray / parallel"], rows)
        + f"\n\nlargest metric difference ray vs parallel: {results['parity_max_abs_diff']:.2e}; "
        f"command: `python benchmarks/scaleout.py{' --quick' if args.quick else ''}`"
    )
    replace_section("scaleout", body, "Scale-out: the Ray executor (issue 16)")
    console.print(body)


if __name__ == "__main__":
    main()
