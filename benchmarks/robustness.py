"""Untrusted clients: attacks against aggregation rules, DP accuracy against epsilon, SecAgg's bytes.

Issue 18's benchmark. Fashion-MNIST, Dirichlet(0.5) over 100 clients, 10 a round, MLP, FedAvg:

* attacks: every attack at 10/20/30% attackers against every server rule on 5 report seeds; each
  cell the mean final accuracy with its 95% t-interval (protocol.py), the clean run beside it. The
  best rule of issue 18's target is chosen on tuning seeds 100-101 (protocol.py: never on the seeds
  it is then scored on);
* privacy: DP-FedAvg (central, Poisson sampling, RDP) on 1,000 clients at epsilon 1, 2, 4, 8 and
  infinity (no noise), delta 1e-5, the noise multiplier solved for each epsilon before work; the
  noise is fresh, from the OS CSPRNG (taciturn's default since issue 39), so a rerun of one config
  and seed gives another sample of the mechanism, not the same number;
* secagg: bytes each client sends and receives per round under SecAgg (complete graph) and SecAgg+
  (sparse, k = 8) for 10/50/100 clients a round, against the plain model's bytes, from the ledger.

Every run is a taciturn run directory under benchmarks/runs/robustness/. Each finished run's config and
final accuracy is appended to benchmarks/results/robustness_runs.jsonl (quick: robustness_quick_runs.jsonl)
under its key (run_key.py: the config and the simulation code); a rerun reuses every run whose key is
unchanged, so an interrupted benchmark continues where it stopped. Runs go to ``--workers`` processes
of one torch thread each.

    python benchmarks/robustness.py --quick     # smoke: the same code at tiny scale, labelled so
    python benchmarks/robustness.py             # the full grid: 744 runs, about 2 hours on 2 idle cores

Every claim is a sentence generated from a paired 95% t-interval over the report seeds (an attacked
run and the clean run of a seed share its data, partition and initial model): issue 18's target per
attack (the chosen rule within 3 points of clean FedAvg), the chosen rule against the undefended mean,
and each epsilon against no noise.

Results go to benchmarks/results/robustness.json (quick: robustness_quick.json) in the schema
{"clean": acc, "attacks": {attack: {fraction: {aggregator: {"mean": acc, "ci95": [lo, hi]}}}},
 "privacy": {epsilon: acc}, "secagg": {clients: {"bytes_per_client": b, "plain_bytes_per_client": b}},
 "target": [{attack, rule, status, ...}], "claims": [sentence, ...]};
the full run also writes its tables and claims into docs/benchmarks.md and the target's lines into
the README.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import time
from concurrent.futures import as_completed
from pathlib import Path
from typing import Any

import numpy as np
from protocol import (
    IntervalError,
    Paired,
    Protocol,
    markdown_table,
    paired,
    protocol_lines,
    replace_section,
    t_interval,
)
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from run_key import append_run, read_runs, run_key
from workers import one_run_per_core

from taciturn.core.channel import Channel
from taciturn.core.codec import encode
from taciturn.core.ledger import Direction, Ledger
from taciturn.core.message import Message
from taciturn.core.rng import Streams
from taciturn.experiments.config import validate
from taciturn.experiments.runner import start
from taciturn.secagg.config import SecAggConfig
from taciturn.secagg.protocol import SecureSum

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "benchmarks" / "runs" / "robustness"
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "README.md"
console = Console()

ATTACKS = {  # kind: strength (None: the attack's own default, e.g. Baruch et al.'s z_max)
    "sign_flip": 10.0,
    "scale": 1e3,
    "gaussian": 1.0,
    "label_flip": None,
    "little_is_enough": None,
    "weight_lie": 1.0,
}


def aggregators(byzantine: int, per_round: int) -> dict[str, dict[str, Any]]:
    """Each rule with the attackers' count f of a round's m clients it is told (a defender that
    knows f, as the papers do); the trimmed mean cuts beta = f / m at each end."""
    return {
        "mean": {},
        "norm_bound": {"clip_norm": 1.0, "adaptive": True},  # Andrew et al.: the median norm
        "median": {"kind": "median"},
        "trimmed_mean": {"kind": "trimmed_mean", "trim": min(max(byzantine, 1) / per_round, 0.49)},
        "krum": {"kind": "krum", "byzantine": byzantine},
        "multi_krum": {"kind": "multi_krum", "byzantine": byzantine},
        "centered_clip": {"kind": "centered_clip", "tau": 1.0, "clip_norm": 1.0, "adaptive": True},
    }


RULES = tuple(aggregators(1, 10))  # the rules' names, whatever f and m they are told
TARGET_FRACTION = 0.2  # issue 18's target: attackers' fraction at which the best rule is chosen


def scale(quick: bool) -> dict[str, Any]:
    if quick:  # sized for a loaded 2-core machine: a smoke test of the code path, not evidence
        return {
            "clients": 10,
            "per_round": 5,
            "rounds": 5,
            "seeds": [0, 1],  # report seeds: a smoke run's two
            "tuning_seeds": [100],
            "fractions": [0.2],
            "train_size": 2000,
            "dp_clients": 50,
            "dp_rounds": 5,
            "epsilons": [1.0, 8.0, math.inf],
            "secagg_clients": [10, 20],
            "secagg_dim": 10_000,
        }
    return {
        "clients": 100,
        "per_round": 10,
        "rounds": 100,
        "seeds": [0, 1, 2, 3, 4],  # report seeds
        "tuning_seeds": [100, 101],  # choose the best rule at TARGET_FRACTION
        "fractions": [0.1, 0.2, 0.3],
        "train_size": None,
        "dp_clients": 1000,
        "dp_rounds": 100,
        "epsilons": [1.0, 2.0, 4.0, 8.0, math.inf],
        "secagg_clients": [10, 50, 100],
        "secagg_dim": None,
    }


def tree(s: dict[str, Any], seed: int, clients: int, rounds: int, **tables: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"dataset": "fashion_mnist"}
    if s["train_size"]:
        data |= {"train_size": s["train_size"], "test_size": 2000}
    return {
        "name": "robustness",
        "seed": seed,
        "rounds": rounds,
        "data": data,
        "partition": {"kind": "dirichlet", "num_clients": clients, "alpha": 0.5, "min_size": 10},
        "model": {"kind": "mlp", "hidden": [200]},
        "algorithm": {
            "name": "fedavg",
            "fraction": s["per_round"] / clients,
            "local": {"epochs": 1, "batch_size": 32, "lr": 0.05},
        },
        "eval": {"every": rounds},
        "checkpoint": {"every": rounds},
        "engine": {"executor": "vectorized"},  # the fused MLP steps, one process: the pool runs two
        **tables,
    }


def final_accuracy(name: str, config_tree: dict[str, Any]) -> float:
    out = RUNS / name
    shutil.rmtree(out, ignore_errors=True)
    rows = start(validate(config_tree, name), out, progress=False).read_metrics()
    return float(rows[-1]["accuracy"])


def job_key(config_tree: dict[str, Any]) -> str:
    """Two jobs with one config are one run; a change to the simulation code changes every key."""
    return run_key(json.dumps(config_tree, sort_keys=True))


def stored_accuracies(log: Path, jobs: dict[str, dict[str, Any]]) -> dict[str, float]:
    """The final accuracy of every job whose key ``log`` holds; a job whose config or simulation
    code changed since is left out, to be run again."""
    rows = read_runs(log)
    return {name: rows[k]["accuracy"] for name, tree in jobs.items() if (k := job_key(tree)) in rows}


def run_all(jobs: dict[str, dict[str, Any]], log: Path, workers: int) -> dict[str, float]:
    """Final accuracy of every job (name: config tree). Runs already in ``log`` are reused; the rest
    go to a process pool and each is appended to ``log`` as it finishes, so an interrupted benchmark
    (or one that outlasts a session: the log is committed) continues where it stopped."""
    done = stored_accuracies(log, jobs)
    todo = {name: tree for name, tree in jobs.items() if name not in done}
    console.print(
        f"{len(jobs)} runs: {len(done)} stored in {log.name}, {len(todo)} to run on {workers} processes"
    )
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress, one_run_per_core(workers) as pool:
        task = progress.add_task("runs", total=len(todo))
        futures = {pool.submit(final_accuracy, name, tree): name for name, tree in todo.items()}
        for future in as_completed(futures):
            name = futures[future]
            done[name] = future.result()
            record = {"key": job_key(todo[name]), "name": name, "config": todo[name]}
            append_run(log, record | {"accuracy": done[name]})
            progress.advance(task)
    return done


def cell(values: list[float]) -> dict[str, Any]:
    try:
        lo, hi = t_interval(values)
        ci: list[float] | None = [lo, hi]
    except IntervalError:  # one seed: no interval (a smoke run)
        ci = None
    return {"mean": float(np.mean(values)), "ci95": ci, "seeds": values}


def attack_jobs(s: dict[str, Any]) -> dict[tuple, tuple[str, dict[str, Any]]]:
    """(attack, fraction, rule, seed) -> (run name, config); the clean runs under ("clean", seed)."""
    jobs: dict[tuple, tuple[str, dict[str, Any]]] = {
        ("clean", seed): (f"clean_s{seed}", tree(s, seed, s["clients"], s["rounds"])) for seed in s["seeds"]
    }
    for kind, strength in ATTACKS.items():
        for fraction in s["fractions"]:
            f = math.ceil(fraction * s["per_round"])
            attack = {"kind": kind, "fraction": fraction} | (
                {} if strength is None else {"strength": strength}
            )
            for rule, table in aggregators(f, s["per_round"]).items():
                tuning = s["tuning_seeds"] if fraction == TARGET_FRACTION else []
                for seed in [*s["seeds"], *tuning]:
                    config = tree(s, seed, s["clients"], s["rounds"], attack=attack, aggregation=table)
                    jobs[(kind, fraction, rule, seed)] = (f"{kind}_{fraction}_{rule}_s{seed}", config)
    return jobs


def privacy_jobs(s: dict[str, Any]) -> dict[tuple, tuple[str, dict[str, Any]]]:
    """(epsilon, seed) -> (run name, config): central DP-FedAvg with noise solved for epsilon."""
    jobs = {}
    for epsilon in s["epsilons"]:
        tables = (
            {}
            if math.isinf(epsilon)
            else {"privacy": {"enabled": True, "clip": 1.0, "target_epsilon": epsilon, "delta": 1e-5}}
        )
        for seed in s["seeds"]:
            config = tree(s, seed, s["dp_clients"], s["dp_rounds"], **tables)
            jobs[(epsilon, seed)] = (f"dp_{epsilon}_s{seed}", config)
    return jobs


def protocol(s: dict[str, Any], quick: bool) -> Protocol:
    return Protocol("tuning_seeds", tuple(s["tuning_seeds"]), tuple(s["seeds"]), smoke=quick)


def tuning(s: dict[str, Any], acc: dict[tuple, float]) -> dict[str, dict[str, float]]:
    """{attack: {rule: mean final accuracy over the tuning seeds}} at TARGET_FRACTION: what chooses
    the best rule."""
    return {
        kind: {
            r: float(np.mean([acc[(kind, TARGET_FRACTION, r, t)] for t in s["tuning_seeds"]])) for r in RULES
        }
        for kind in ATTACKS
    }


def attacks(s: dict[str, Any], acc: dict[tuple, float]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The clean cell and {attack: {fraction: {rule: cell}}} from every run's final accuracy."""
    clean = cell([acc[("clean", seed)] for seed in s["seeds"]])
    out: dict[str, Any] = {}
    for kind in ATTACKS:
        for fraction in s["fractions"]:
            for rule in RULES:
                values = [acc[(kind, fraction, rule, seed)] for seed in s["seeds"]]
                out.setdefault(kind, {}).setdefault(str(fraction), {})[rule] = cell(values)
    return clean, out


def privacy(s: dict[str, Any], acc: dict[tuple, float]) -> dict[str, Any]:
    return {
        "inf" if math.isinf(e) else str(e): cell([acc[(e, seed)] for seed in s["seeds"]])
        for e in s["epsilons"]
    }


def within(rule: str, values: list[float], clean: list[float], points: float) -> tuple[str, Paired | None]:
    """Issue 18's target for one rule, paired by seed: "held" where the whole 95% t-interval of
    rule - clean lies at or above -points, "not held" where it lies wholly below, else "no
    conclusion"; "n/a" with one seed on either side (no interval)."""
    if min(len(values), len(clean)) < 2:
        return "n/a", None
    gap = paired(values, clean, (rule, "clean FedAvg"))
    return {"yes": "held", "no": "not held", "open": "no conclusion"}[gap.against(-points, "above")], gap


def target(results: dict[str, Any], fraction: float = TARGET_FRACTION, points: float = 0.03) -> list[dict]:
    """Issue 18's target per attack: the best rule at ``fraction`` attackers within ``points`` of
    clean. The best rule is the one with the highest mean on the tuning seeds (``results["tuning"]``);
    it is then read on the report seeds, paired by seed with the clean run (``within``) and with the
    undefended mean, and each comparison is stated as a sentence."""
    clean = results["clean_cell"]["seeds"]
    where = f"{fraction:.0%} attackers"
    rows = []
    for kind, by_fraction in results["attacks"].items():
        if str(fraction) not in by_fraction:
            continue
        chosen = results["tuning"][kind]
        rule = max(chosen, key=chosen.__getitem__)
        best, undefended = by_fraction[str(fraction)][rule], by_fraction[str(fraction)]["mean"]
        status, gap = within(rule, best["seeds"], clean, points)
        sentences = []
        against = None
        if gap is not None:
            sentences.append(
                f"{kind} at {where}, the rule chosen on the tuning seeds: "
                + gap.sentence("final accuracy", lower_is_better=False)
                + f" Within {100 * points:.0f} points of clean: **{status}** ({_why(status, points)})."
            )
            if rule != "mean":  # the chosen rule against no defence at all
                against = paired(best["seeds"], undefended["seeds"], (rule, "the plain mean"))
                sentences.append(
                    f"{kind} at {where}: " + against.sentence("final accuracy", lower_is_better=False)
                )
        rows.append(
            {
                "attack": kind,
                "fraction": fraction,
                "points": points,
                "rule": rule,
                "accuracy": best,
                "undefended": undefended,
                "status": status,
                "gap": gap and gap.as_dict(),
                "against_undefended": against and against.as_dict(),
                "sentences": sentences,
            }
        )
    return rows


def _why(status: str, points: float) -> str:
    bound = f"-{100 * points:.0f} points"
    return {
        "held": f"the whole paired interval at or above {bound}",
        "not held": f"the whole paired interval below {bound}",
        "no conclusion": f"the paired interval reaches both sides of {bound}",
    }[status]


def points_against_clean(gap: dict | None) -> str:
    """ "-2.1 [-3.0, -1.2]": the paired difference from clean, in accuracy points."""
    if gap is None:
        return "n/a"
    lo, hi = gap["ci"]
    return f"{100 * gap['mean']:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]"


def target_table(rows: list[dict]) -> str:
    header = ["attack", "undefended", "best rule (tuning seeds)", "its accuracy", "points against clean"]
    within_points = f"within {100 * rows[0]['points']:.0f} points" if rows else "within"
    return markdown_table(
        [*header, within_points],
        [
            [
                r["attack"],
                f"{r['undefended']['mean']:.3f}",
                r["rule"],
                _cell(r["accuracy"]),
                points_against_clean(r["gap"]),
                r["status"],
            ]
            for r in rows
        ],
    )


def privacy_claims(results: dict[str, Any]) -> list[str]:
    """Each epsilon's accuracy against no noise, paired by seed (the same data and sampling seed;
    the noise itself is fresh)."""
    cells = results["privacy"]
    free = cells.get("inf")
    if free is None or len(free["seeds"]) < 2:
        return []
    return [
        paired(c["seeds"], free["seeds"], (f"DP-FedAvg at epsilon {e}", "no noise")).sentence(
            "final accuracy", lower_is_better=False
        )
        for e, c in cells.items()
        if e != "inf"
    ]


def readme_lines(rows: list[dict]) -> str:
    """The README's lines: the target's verdict per attack, from the paired intervals."""

    def rule(name: str) -> str:
        return "no defence (the tuning seeds chose the plain mean)" if name == "mean" else name

    return "\n".join(
        f"- {r['attack']}: **{r['status']}** with {rule(r['rule'])} ({points_against_clean(r['gap'])} "
        f"points against clean; undefended {r['undefended']['mean']:.3f})."
        for r in rows
    )


def secagg(s: dict[str, Any]) -> dict[str, Any]:
    """Per client and round: everything SecAgg sends and receives, against the plain model's upload."""
    from taciturn.tasks.models import build_model

    dim = s["secagg_dim"] or sum(
        p.numel() for p in build_model("mlp", (1, 28, 28), 10, hidden=(200,)).parameters()
    )
    plain = len(encode(Message({"w": np.zeros(dim, np.float32)})))
    out = {}
    for clients in s["secagg_clients"]:
        row = {"plain_bytes_per_client": plain, "dim": dim}
        for graph in ("complete", "sparse"):
            ledger = Ledger()
            rng = np.random.default_rng(0)
            inputs = {c: rng.integers(0, 2**16, dim).astype(np.uint32) for c in range(clients)}
            started = time.perf_counter()
            SecureSum(SecAggConfig(enabled=True, graph=graph, neighbours=8), Streams(0)).run(
                Channel(ledger, Streams(0)), 1, inputs
            )
            up, down = ledger.totals(Direction.UP), ledger.totals(Direction.DOWN)
            key = "bytes_per_client" if graph == "complete" else "sparse_bytes_per_client"
            row[key] = up.bytes_sent / clients
            row[key.replace("bytes", "down_bytes")] = down.bytes_sent / clients
            row[f"{graph}_seconds"] = time.perf_counter() - started
        out[str(clients)] = row
        console.print(f"secagg {clients}: {row}")
    return out


def _cell(c: dict[str, Any]) -> str:
    return f"{c['mean']:.3f}" + ("" if c["ci95"] is None else f" [{c['ci95'][0]:.3f}, {c['ci95'][1]:.3f}]")


def docs(results: dict[str, Any], quick: bool) -> None:
    """The generated tables of docs/benchmarks.md (the smoke run's in its own, labelled section)."""
    s = results["settings"]
    body = [
        *([protocol_lines(results["protocol"]), ""] if "protocol" in results else []),
        f"Scale: {results['scale']}. Fashion-MNIST ({s['train_size'] or 'all'} training images), "
        f"Dirichlet(0.5) over {s['clients']} clients, {s['per_round']} a round, {s['rounds']} rounds, MLP "
        f"784-200-10, FedAvg, seeds {s['seeds']}. Command: `python benchmarks/robustness.py"
        f"{' --quick' if quick else ''}`.",
        "",
        f"Clean FedAvg: {results['clean']:.4f}. Final accuracy per attack (rows: attackers' fraction; "
        "columns: server rule; the mean over seeds, with its 95% t-interval when there are several):",
        "",
    ]
    for kind, by_fraction in results["attacks"].items():
        rules = list(next(iter(by_fraction.values())))
        rows = [[fraction, *(_cell(c) for c in cells.values())] for fraction, cells in by_fraction.items()]
        body += [f"**{kind}**", "", markdown_table(["attackers", *rules], rows), ""]
    body += [
        "Target (issue 18): with the best rule, accuracy within 3 points of clean at 20% attackers. "
        "The best rule is picked by its mean over the tuning seeds and scored on the report seeds, "
        "paired by seed with the clean run (the same data, partition and initial model): the target "
        "is held where the whole paired 95% interval of its difference from clean lies at or above -3 "
        "points. The rules were not tuned (one setting each, told the attackers' count), so this is "
        "the best of seven fixed defences, not of tuned ones:",
        "",
        target_table(results["target"]),
        "",
        "What the intervals carry (generated):",
        "",
        *(f"- {line}" for line in results["claims"]),
        "",
    ]
    privacy_rows = [[e, _cell(c)] for e, c in results["privacy"].items()]
    noise = results.get("privacy_noise") or "seeded from the run seed (before issue 39: not private)"
    body += [
        f"DP-FedAvg (central, Poisson sampling, RDP, delta 1e-5, clip 1) on {s['dp_clients']} clients, "
        f"{s['dp_rounds']} rounds, noise solved for each epsilon; noise: {noise}.",
        "",
        markdown_table(["epsilon", "accuracy"], privacy_rows),
        "",
        f"SecAgg bytes per client and round for a {next(iter(results['secagg'].values()))['dim']}-value "
        "update (SecAgg+: k = 8), from the ledger:",
        "",
        markdown_table(
            ["clients/round", "plain upload", "SecAgg up", "SecAgg down", "SecAgg+ up", "SecAgg+ down"],
            [
                [
                    n,
                    r["plain_bytes_per_client"],
                    int(r["bytes_per_client"]),
                    int(r["down_bytes_per_client"]),
                    int(r["sparse_bytes_per_client"]),
                    int(r["sparse_down_bytes_per_client"]),
                ]
                for n, r in results["secagg"].items()
            ],
        ),
    ]
    name, title = (
        ("robustness_quick", "Robustness smoke run (issue 18, not evidence)")
        if quick
        else ("robustness", "Robustness, privacy and secure aggregation (issue 18)")
    )
    replace_section(name, "\n".join(body), title)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smoke run at tiny scale (labelled so)")
    parser.add_argument("--workers", type=int, default=2, help="runs at once, one torch thread each")
    args = parser.parse_args()
    s = scale(args.quick)
    jobs = attack_jobs(s) | privacy_jobs(s)
    RESULTS.mkdir(parents=True, exist_ok=True)
    log = RESULTS / ("robustness_quick_runs.jsonl" if args.quick else "robustness_runs.jsonl")
    by_name = run_all(dict(jobs.values()), log, args.workers)
    acc = {key: by_name[name] for key, (name, _) in jobs.items()}
    clean, attacked = attacks(s, acc)
    record = protocol(s, args.quick).record({"server rule": len(RULES)})
    results = {
        "scale": "smoke (--quick): 2 report seeds, not evidence" if args.quick else "full",
        "settings": s | {"epsilons": [str(e) for e in s["epsilons"]]},
        "clean": clean["mean"],
        "clean_cell": clean,
        "protocol": record,
        "tuning": tuning(s, acc),
        "attacks": attacked,
        "privacy": privacy(s, acc),
        "privacy_noise": "fresh, from the OS CSPRNG",
        "secagg": secagg(s),
    }
    results["target"] = target(results)
    results["claims"] = [
        *(line for row in results["target"] for line in row["sentences"]),
        *privacy_claims(results),
    ]
    path = RESULTS / ("robustness_quick.json" if args.quick else "robustness.json")
    path.write_text(json.dumps(results, indent=1))
    console.print(f"wrote {path}")
    docs(results, args.quick)
    if not args.quick:  # the README carries the full run's verdicts only
        replace_section("robustness", readme_lines(results["target"]), "Robustness", README)


if __name__ == "__main__":
    main()
