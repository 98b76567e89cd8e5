"""Per-run traces of BASS: the sharing graph against the true clusters, and each agent's regret (issue 19).

For each run (seed) of a setting, at a given (alpha, scale), this follows step by step which edges
of the sharing graph are removed (and whether the two agents were in the same true cluster: a
wrong removal) or kept across clusters (a wrong keep), and which agents pile up regret. It is how
the heavy tail of benchmarks/bass.py was traced to its cause (docs/benchmarks.md, "## BASS"). Any
method of the benchmark can be traced (``--method oracle``: the same pools from the first step;
``--scale`` is then ignored).

    python benchmarks/bass_traces.py N6_C2 --alpha 0.15 --scale 0.35 --out /tmp/traces.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from taciturn.experiments.bandits import build, environment

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bass as bench  # the benchmark's own config builder


def trace(
    setting: str, method: str, alpha: float, scale: float, first: int, runs: int, every: int
) -> list[dict]:
    """One dict per run (seeds first, first + 1, ...; simulated together, each as if alone): final
    regret, per-agent regret and suboptimal pulls, edge removals, wrong removals and keeps over time."""
    size = bench.FULL | {"repetitions": runs, "record_every": every}
    config = bench.config(setting, method, (alpha, scale), first, size)
    (simulation,) = build(config).values()
    envs = [environment(config, seed) for seed in config.seeds]
    problem, reps = simulation.problem, np.arange(runs)
    same = problem.labels[:, :, None] == problem.labels[:, None, :]
    upper = np.triu(np.ones(same.shape[1:], dtype=bool), 1)
    per_agent = np.zeros((runs, problem.agents))
    suboptimal = np.zeros((runs, problem.agents), dtype=int)
    removals: list[list[dict]] = [[] for _ in reps]
    curves: list[list[dict]] = [[] for _ in reps]
    for t in range(config.horizon):
        agent = problem.schedule[:, t]
        regret, graph = simulation.regret.copy(), simulation.rule.membership.copy()
        simulation.advance(1)
        loss = simulation.regret - regret
        per_agent[reps, agent] += loss
        suboptimal[reps, agent] += loss > 1e-12
        for r, i, j in zip(*np.nonzero(graph & ~simulation.rule.membership & upper), strict=True):
            removals[r].append({"t": t + 1, "pair": [int(i), int(j)], "same_cluster": bool(same[r, i, j])})
        if (t + 1) % every == 0:
            graph = simulation.rule.membership
            for r in reps:
                curves[r].append(
                    {
                        "t": t + 1,
                        "regret": float(simulation.regret[r]),
                        "per_agent_regret": per_agent[r].round(1).tolist(),
                        "wrong_removals": int((upper & same[r] & ~graph[r]).sum()),
                        "wrong_keeps": int((upper & ~same[r] & graph[r]).sum()),
                    }
                )
    graph = simulation.rule.membership
    return [
        {
            "seed": config.seeds[r],
            "final_regret": float(simulation.regret[r]),
            "per_agent_regret": per_agent[r].round(1).tolist(),
            "suboptimal_pulls": suboptimal[r].tolist(),
            "labels": envs[r].labels.tolist(),
            "final_neighbours": [np.flatnonzero(graph[r, i]).tolist() for i in range(problem.agents)],
            "removals": removals[r],
            "curve": curves[r],
        }
        for r in reps
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("setting")
    parser.add_argument("--alpha", type=float, required=True)
    parser.add_argument("--scale", type=float, required=True)
    parser.add_argument("--method", default="bass", choices=bench.METHODS + bench.EXTRA)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--every", type=int, default=500)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    runs = trace(args.setting, args.method, args.alpha, args.scale, args.first_seed, args.runs, args.every)
    for run in runs:
        wrong = [r for r in run["removals"] if r["same_cluster"]]
        print(
            f"seed {run['seed']}: regret {run['final_regret']:.0f}; per agent {run['per_agent_regret']}; "
            f"wrong removals {len(wrong)} (first at t={wrong[0]['t'] if wrong else '-'}), "
            f"wrong keeps at T {run['curve'][-1]['wrong_keeps']}"
        )
    final = np.array([run["final_regret"] for run in runs])
    q25, median, q75 = np.percentile(final, [25, 50, 75])
    print(
        f"{args.setting} {args.method} alpha {args.alpha} scale {args.scale}: mean {final.mean():.0f}, "
        f"median {median:.0f} [{q25:.0f}, {q75:.0f}], max {final.max():.0f}"
    )
    if args.out:
        args.out.write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
