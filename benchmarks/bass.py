"""BASS against independent, pooled and oracle LinUCB, CLUB, SCLUB and DynUCB (issues 7, 19).

Synthetic benchmark of the paper / bandpy: K = 10 Gaussian arms in d = 5, N in {2, 6, 18} agents in
2 or 4 clusters (Gaussian cluster parameters) or with no clusters (theta_i = mu + 0.5 xi_i), T = 10^4
steps (one agent pulls one arm per step), 10 independent runs. Every method runs through the same
code as `taciturn run` (experiments/bandits.py): the same environments, schedules and noise per run,
samples shared as messages through the Channel and counted by the Ledger. BASS runs with three
separation tests (separation.py): ours (`bass`), ellipsoid overlap on the confidence ellipsoids
(`bass_overlap`), and ellipsoid overlap exactly as bandpy's LBC runs it (`bass_lbc`).

Tuning under the protocol of protocol.py (issue 42), nine configurations for every method: the UCB
bonus is alpha times the theory's confidence radius; the methods that learn whom to share with
search 3 alphas x 3 thresholds (BASS: the scale of the radius in its test; CLUB: gamma; SCLUB:
alpha), the others 9 alphas over the same range. As the authors do (best alpha of a grid per
method), each method gets the grid point with the lowest regret on a pilot whose runs use tuning
seeds (PILOT_SEED...) disjoint from the report seeds: 10 runs per pilot setting, because at a small
alpha a few runs in ten lock onto a suboptimal arm and three runs did not show it (bass_traces.py
traces them), and scored by the upper end of the 95% interval of the mean, which charges a grid
point for the runs that lock. Every method sees the same environments, schedules and noise in a
run, so BASS is compared with each method run by run: a paired t-interval of the regret
differences with Wilcoxon beside it (protocol.paired), and sentences only where it excludes 0.

    python benchmarks/bass.py --jobs 2   # full: ~15 min on 2 cores; writes results/bass.json, docs
    python benchmarks/bass.py --quick    # smoke run of the same code at tiny scale (a few minutes)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from multiprocessing import get_context
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from protocol import Protocol, paired, protocol_lines, t_interval
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from taciturn.experiments.bandits import build
from taciturn.experiments.bandits_config import BanditsConfig
from taciturn.experiments.config import validate

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("bass", "independent", "pooled", "oracle", "club", "sclub", "dynucb")
# BASS with an ellipsoid-overlap test instead of ours: on the confidence ellipsoids (V-radius beta),
# and exactly as bandpy's LBC runs it (shape beta V^-1, V-radius sqrt(beta)); separation.py
EXTRA = ("bass_overlap", "bass_lbc")
TESTS = {"bass": "mahalanobis", "bass_overlap": "ellipsoid_overlap", "bass_lbc": "ellipsoid_overlap_bandpy"}
ALPHAS = (0.15, 0.25, 0.4)  # x a threshold's three values: nine configurations
ALPHAS_ONLY = (0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.8)  # nine, for the methods with no threshold
THRESHOLDS = {  # method -> (config table, key, grid)
    "bass": ("bass", "scale", (0.25, 0.35, 0.5)),
    "bass_overlap": ("bass", "scale", (0.25, 0.35, 0.5)),
    "bass_lbc": ("bass", "scale", (0.5, 1.0, 2.0)),  # its V-radius is sqrt(scale beta): 1 = bandpy
    "club": ("club", "gamma", (1.0, 2.0, 4.0)),
    "sclub": ("sclub", "alpha", (1.0, 2.0, 4.0)),
}
PILOT_SEED = 1000
SECTION = "## BASS: multi-agent linear bandits with adaptive sample sharing (issue 7)"
COMMAND = "flock /tmp/taciturn-cpu.lock env PYTHONPATH=src python benchmarks/bass.py --jobs 2"

FULL = {
    "agents": (2, 6, 18),
    "clusters": (2, 4, None),  # a setting with more clusters than agents is not run: N2_C4 is N2_C2
    "horizon": 10_000,
    "repetitions": 10,
    "record_every": 100,
    # 10 pilot runs per setting, not 3: at a small alpha one run in three to ten locks onto a
    # suboptimal arm (docs, "Why single runs got stuck"); three runs did not see it and chose it
    "pilot": {"settings": ("N6_C2", "N6_none", "N18_C2"), "repetitions": 10},
}
QUICK = {
    "agents": (2, 6),
    "clusters": (2, None),
    "horizon": 600,
    "repetitions": 2,
    "record_every": 50,
    "pilot": {"settings": ("N6_C2",), "repetitions": 2},  # an interval needs two runs
}


def setting_name(agents: int, clusters: int | None) -> str:
    return f"N{agents}_C{clusters}" if clusters else f"N{agents}_none"


def parse_setting(name: str) -> tuple[int, int | None]:
    agents, clusters = re.fullmatch(r"N(\d+)_(C\d+|none)", name).groups()
    return int(agents), None if clusters == "none" else int(clusters[1:])


def config(setting: str, method: str, variant: tuple, seed: int, scale: dict) -> BanditsConfig:
    """The bandits config of one method at (alpha, threshold) in one setting."""
    agents, clusters = parse_setting(setting)
    alpha, threshold = variant
    environment = {"num_agents": agents, "num_arms": 10, "dim": 5, "noise": 1.0}
    if clusters:
        environment |= {"kind": "clustered", "num_clusters": clusters}
    else:
        environment |= {"kind": "unclustered", "spread": 0.5}
    tree = {
        "type": "bandits",
        "name": f"{setting}-{method}",
        "seed": seed,
        "repetitions": scale["repetitions"],
        "horizon": scale["horizon"],
        "record_every": scale["record_every"],
        "environment": environment,
        "methods": ["bass" if method in TESTS else method],
        "linucb": {"alpha": alpha},
        "bass": {"test": TESTS.get(method, "mahalanobis")},
        "dynucb": {"num_clusters": clusters or 2},  # DynUCB must be told K; without clusters we give it 2
    }
    if method in THRESHOLDS:
        table, key, _ = THRESHOLDS[method]
        tree[table] = {**tree.get(table, {}), key: threshold}
    return validate(tree, f"<benchmark {setting} {method}>", BanditsConfig)


def grid(method: str) -> list[tuple]:
    """(alpha, threshold) pairs: 3 x 3 for the methods with a threshold, 9 alphas for the others."""
    if method in THRESHOLDS:
        return [(alpha, threshold) for alpha in ALPHAS for threshold in THRESHOLDS[method][2]]
    return [(alpha, None) for alpha in ALPHAS_ONLY]


def protocol(scale: dict) -> Protocol:
    """Tuning seeds: the pilot's runs (PILOT_SEED...); report seeds: the reported runs (0...)."""
    tuning = range(PILOT_SEED, PILOT_SEED + scale["pilot"]["repetitions"])
    return Protocol("tuning_seeds", tuple(tuning), tuple(range(scale["repetitions"])), smoke=scale is QUICK)


def settings(scale: dict) -> list[str]:
    """Every (agents, clusters) of the scale with no more clusters than agents."""
    return [setting_name(n, c) for n in scale["agents"] for c in scale["clusters"] if c is None or c <= n]


def comparisons(results: dict[str, dict]) -> dict[str, dict[str, dict]]:
    """BASS against every other method in each setting, run by run (the same environment, schedule
    and noise in a run): the paired difference of final regret (negative: BASS lower)."""
    out = {}
    for s, by_method in results.items():
        mine = by_method["bass"]["regret"][-1]
        for m, r in by_method.items():
            if m != "bass":
                out.setdefault(s, {})[m] = paired(mine, r["regret"][-1], ("bass", m)).as_dict()
    return out


def comparison_lines(comparisons: dict[str, dict[str, dict]]) -> list[str]:
    """A sentence per comparison whose interval excludes 0, the rest counted as no conclusion."""
    lines, open_ = [], []
    for s, by_method in comparisons.items():
        for m, c in by_method.items():
            if c["direction"] == 0:
                open_.append(f"{s} {m}")
                continue
            word = "lower" if c["direction"] < 0 else "higher"
            lines.append(
                f"{s}: BASS has {word} final regret than {m}, {c['mean']:+.0f} [{c['ci'][0]:+.0f}, "
                f"{c['ci'][1]:+.0f}] (paired over {c['n']} runs; Wilcoxon p = {c['wilcoxon_p']:.3g}; "
                f"{c['agree']} of {c['n']} runs agree)."
            )
    no = "No conclusion (the paired interval contains 0, or Wilcoxon's test disagrees): "
    lines.append(no + (", ".join(open_) or "none") + ".")
    return lines


def simulate(config: BanditsConfig) -> dict[str, np.ndarray]:
    """Run the one method of ``config`` (all its repetitions at once): its records over time."""
    (simulation,) = build(config).values()
    started, rows = time.process_time(), [simulation.record()[0]]
    while simulation.step < config.horizon:
        simulation.advance(config.record_every)
        rows.append(simulation.record()[0])
    out = {"t": np.array([r["t"] for r in rows]), "cpu_s": time.process_time() - started}
    for field in ("regret", "bytes_up", "bytes_down", "messages_up", "messages_down", "f1"):
        if rows[0][field] is not None:
            out[field] = np.array([r[field] for r in rows], dtype=float)
    return out


def simulate_all(configs: list[BanditsConfig], jobs: int, progress: Progress, task) -> list[dict]:
    """``simulate`` of every config, in order; in ``jobs`` worker processes when jobs > 1 (the
    runs are independent and seeded, so the numbers do not depend on jobs)."""
    with ProcessPoolExecutor(jobs, mp_context=get_context("spawn")) if jobs > 1 else nullcontext() as pool:
        results = []
        for result in pool.map(simulate, configs) if pool else map(simulate, configs):
            results.append(result)
            progress.advance(task)
    return results


def pilot(scale: dict, progress, jobs: int = 1) -> tuple[dict[str, tuple], dict]:
    """Each method's (alpha, threshold): the grid point with the lowest mean, over the pilot
    settings, of its upper regret bound / (the method's best upper bound in that setting).

    The upper bound is the upper end of the 95% t-interval of the mean final regret over the pilot
    runs, not the mean: a grid point whose runs sometimes lock onto a suboptimal arm pays for its
    spread. Scored by the mean, BASS kept alpha = 0.25 with a 10-run pilot (mean 130 against 128
    at alpha = 0.4 on N6_C2), and 2 of the 10 reported runs locked (issue 19). Returns the choice
    and the pilot's mean final regret per method, setting and grid point."""
    settings = scale["pilot"]["settings"]
    pilot_scale = scale | {"repetitions": scale["pilot"]["repetitions"]}
    methods = METHODS + EXTRA
    keys = [(m, s, v) for m in methods for s in settings for v in grid(m)]
    task = progress.add_task("pilot runs", total=len(keys))
    configs = [config(s, m, v, PILOT_SEED, pilot_scale) for m, s, v in keys]
    regret: dict = {}  # method -> setting -> str(variant) -> mean final regret
    upper: dict = {}  # method -> setting -> str(variant) -> upper end of its 95% interval
    for (method, setting, variant), r in zip(keys, simulate_all(configs, jobs, progress, task), strict=True):
        final = r["regret"][-1]
        regret.setdefault(method, {}).setdefault(setting, {})[str(variant)] = float(final.mean())
        upper.setdefault(method, {}).setdefault(setting, {})[str(variant)] = t_interval(final)[1]
    chosen = {}
    for method in methods:
        mine = upper[method]
        score = {
            v: np.mean([mine[s][str(v)] / min(mine[s].values()) for s in settings]) for v in grid(method)
        }
        chosen[method] = min(score, key=score.get)
    return chosen, regret


def summarise(results: dict[str, dict]) -> dict:
    final = lambda field: {  # noqa: E731
        s: {m: float(r[field][-1].mean()) for m, r in res.items() if field in r} for s, res in results.items()
    }
    return {
        "final_regret": final("regret"),
        "final_regret_std": {
            s: {m: float(r["regret"][-1].std()) for m, r in res.items()} for s, res in results.items()
        },
        # Student-t 95% interval of the mean over the runs (wide where one run dominates)
        "final_regret_ci": {
            s: {m: list(t_interval(r["regret"][-1])) for m, r in res.items()} for s, res in results.items()
        },
        # heavy tails (one stuck run dominates a mean): the median and interquartile range beside it
        "final_regret_median": {
            s: {m: float(np.median(r["regret"][-1])) for m, r in res.items()} for s, res in results.items()
        },
        "final_regret_iqr": {
            s: {m: [float(q) for q in np.percentile(r["regret"][-1], [25, 75])] for m, r in res.items()}
            for s, res in results.items()
        },
        "final_regret_by_run": {
            s: {m: r["regret"][-1].tolist() for m, r in res.items()} for s, res in results.items()
        },
        "f1_final": {
            s: float(res["bass"]["f1"][-1].mean()) for s, res in results.items() if parse_setting(s)[1]
        },
        "f1_final_by_method": {s: v for s, v in final("f1").items() if parse_setting(s)[1]},
        "mb_shared": {
            s: {m: float((r["bytes_up"][-1] + r["bytes_down"][-1]).mean() / 1e6) for m, r in res.items()}
            for s, res in results.items()
        },
        "messages": {
            s: {m: float((r["messages_up"][-1] + r["messages_down"][-1]).mean()) for m, r in res.items()}
            for s, res in results.items()
        },
        "cpu_s": {s: {m: round(r["cpu_s"], 1) for m, r in res.items()} for s, res in results.items()},
    }


COLOURS = {
    "bass": "tab:blue",
    "bass_overlap": "tab:cyan",
    "bass_lbc": "tab:purple",
    "independent": "tab:gray",
    "pooled": "black",
    "oracle": "tab:red",
    "club": "tab:orange",
    "sclub": "tab:brown",
    "dynucb": "tab:green",
}


def _band(ax, x, values, method):
    ax.plot(x, values.mean(axis=1), color=COLOURS[method], label=method, lw=1.5 if method != "bass" else 2.5)
    low, high = np.percentile(values, [10, 90], axis=1)
    ax.fill_between(x, low, high, color=COLOURS[method], alpha=0.12)


def plot_grid(results: dict, field: str, path: Path, ylabel: str, log: bool, methods=None) -> Path:
    settings = list(results)
    rows = sorted({parse_setting(s)[0] for s in settings})
    cols = list(dict.fromkeys(s.split("_")[1] for s in settings))
    fig, axes = plt.subplots(len(rows), len(cols), figsize=(4.2 * len(cols), 3.2 * len(rows)), squeeze=False)
    for s in settings:
        ax = axes[rows.index(parse_setting(s)[0])][cols.index(s.split("_")[1])]
        for method, r in results[s].items():
            if field in r and (methods is None or method in methods):
                _band(ax, r["t"][1:], r[field][1:], method)
        ax.set_title(s, fontsize=10)
        ax.grid(alpha=0.3)
        if log:
            ax.set_yscale("log")
        ax.set_xlabel("step t", fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
    for ax in axes.flat:
        if not ax.has_data():
            ax.set_visible(False)
    handles, labels = next(ax for ax in axes.flat if ax.has_data()).get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_regret_vs_bytes(results: dict, path: Path) -> Path:
    settings = [s for s in results if s.startswith("N18")] or list(results)[-3:]
    fig, axes = plt.subplots(1, len(settings), figsize=(4.2 * len(settings), 3.4), squeeze=False)
    for ax, s in zip(axes[0], settings, strict=True):
        for method, r in results[s].items():
            mb = (r["bytes_up"] + r["bytes_down"]).mean(axis=1)[1:] / 1e6
            ax.plot(mb, r["regret"].mean(axis=1)[1:], color=COLOURS[method], label=method, marker=".", ms=2)
        ax.set(title=s, xlabel="MB shared (up + down)", ylabel="cumulative regret", yscale="log")
        ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def tables_markdown(
    summary: dict, variants: dict, plots: dict[str, str], record: dict | None = None, paired_lines=()
) -> str:
    methods = list(METHODS + EXTRA)
    runs = len(next(iter(next(iter(summary["final_regret_by_run"].values())).values())))
    lines = [protocol_lines(record), ""] if record else []
    lines += [
        f"Final cumulative pseudo-regret at T over the {runs} runs, lower is better: the mean and its "
        "Student-t 95% interval, below it the median [interquartile range], which one stuck run "
        "cannot drag:",
        "",
    ]
    lines += ["| setting | " + " | ".join(methods) + " |", "|---" * (len(methods) + 1) + "|"]
    for s, by_method in summary["final_regret"].items():
        best = min(v for m, v in by_method.items() if m != "oracle")
        cells = []
        for m in methods:
            low, high = summary["final_regret_ci"][s][m]
            text = f"{by_method[m]:.0f} [{low:.0f}, {high:.0f}]"
            q25, q75 = summary["final_regret_iqr"][s][m]
            text = f"**{text}**" if by_method[m] == best else text
            cells.append(f"{text}<br>{summary['final_regret_median'][s][m]:.0f} [{q25:.0f}, {q75:.0f}]")
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    lines += ["", "(bold: best method that does not know the clusters; `oracle` is given them.)", ""]
    lines += [
        "Cluster recovery at T, pairwise F1 of who-shares-with-whom against the true clusters (mean):",
        "",
    ]
    f1_methods = ["bass", *EXTRA, "club", "sclub", "dynucb"]
    lines += ["| setting | " + " | ".join(f1_methods) + " |", "|---" * (len(f1_methods) + 1) + "|"]
    for s, by_method in summary["f1_final_by_method"].items():
        lines.append(f"| {s} | " + " | ".join(f"{by_method[m]:.2f}" for m in f1_methods) + " |")
    lines += ["", "MB shared (uploads + forwarded samples + pool resyncs, mean per run):", ""]
    lines += ["| setting | " + " | ".join(methods) + " |", "|---" * (len(methods) + 1) + "|"]
    for s, by_method in summary["mb_shared"].items():
        lines.append(f"| {s} | " + " | ".join(f"{by_method[m]:.2f}" for m in methods) + " |")
    if paired_lines:
        lines += ["", "BASS against each method, run by run (generated from the paired intervals):", ""]
        lines += [f"- {line}" for line in paired_lines]
    lines += ["", "Tuned on the pilot, (alpha, threshold) per method: "]
    lines[-1] += (
        ", ".join(f"{m} {v[0]}, {v[1]}" if v[1] else f"{m} {v[0]}" for m, v in variants.items()) + "."
    )
    lines += [""] + [f"![{name}]({path})" for name, path in plots.items()]
    return "\n".join(lines)


def write_docs(markdown: str) -> Path:
    """Replace the generated block of our section in docs/benchmarks.md, keeping the prose around it."""
    docs = ROOT / "docs" / "benchmarks.md"
    text = docs.read_text() if docs.exists() else "# Benchmarks\n"
    begin, end = "<!-- bass:generated -->", "<!-- /bass:generated -->"
    block = f"{begin}\n{markdown}\n{end}"
    if SECTION not in text:
        text = text.rstrip("\n") + f"\n\n{SECTION}\n\nReproduce: `{COMMAND}`\n\n{block}\n"
    elif begin in text:
        text = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    else:
        head, tail = text.split(SECTION, 1)
        text = head + SECTION + "\n\n" + block + "\n" + tail
    docs.write_text(text)
    return docs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny smoke run; writes nothing under the repository"
    )
    parser.add_argument(
        "--out", type=Path, help="where to write results (default: benchmarks/results, or a temp dir)"
    )
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (one run each)")
    args = parser.parse_args(argv)
    scale = QUICK if args.quick else FULL
    out = args.out or (Path("/tmp/taciturn-bass-quick") if args.quick else ROOT / "benchmarks" / "results")
    images = out if args.quick else ROOT / "docs" / "img"
    out.mkdir(parents=True, exist_ok=True)
    images.mkdir(parents=True, exist_ok=True)
    names = settings(scale)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    started = time.perf_counter()
    with Progress(*columns, console=Console(stderr=True)) as progress:
        variants, pilot_regret = pilot(scale, progress, args.jobs)
        keys = [(s, m) for s in names for m in METHODS + EXTRA]
        task = progress.add_task("benchmark runs", total=len(keys))
        configs = [config(s, m, variants[m], protocol(scale).report_seeds[0], scale) for s, m in keys]
        results: dict = {}
        for (s, m), r in zip(keys, simulate_all(configs, args.jobs, progress, task), strict=True):
            results.setdefault(s, {})[m] = r
    summary = summarise(results)
    plots = {
        "regret": plot_grid(results, "regret", images / "bass_regret.png", "cumulative regret", log=True),
        "f1": plot_grid(
            {s: r for s, r in results.items() if parse_setting(s)[1]},
            "f1",
            images / "bass_f1.png",
            "pairwise F1",
            log=False,
            methods=("bass", *EXTRA, "club", "sclub", "dynucb"),
        ),
        "regret vs bytes": plot_regret_vs_bytes(results, images / "bass_regret_vs_bytes.png"),
    }
    record = protocol(scale).record({m: len(grid(m)) for m in METHODS + EXTRA})
    paired_results = comparisons(results)
    paired_lines = comparison_lines(paired_results)
    payload = {
        "protocol": record,
        **summary,
        "comparisons": paired_results,
        "conclusions": paired_lines,
        "tuned": {m: {"alpha": a, "threshold": t} for m, (a, t) in variants.items()},
        "pilot_final_regret": pilot_regret,
        "scale": {k: v for k, v in scale.items() if k != "pilot"} | {"pilot": dict(scale["pilot"])},
        "wall_s": round(time.perf_counter() - started, 1),
        "command": COMMAND + (" --quick" if args.quick else ""),
    }
    (out / "bass.json").write_text(json.dumps(payload, indent=1, default=list))
    relative = {k: os.path.relpath(p, ROOT / "docs") for k, p in plots.items()}
    text = tables_markdown(summary, variants, relative, record, paired_lines)
    Console().print(text, markup=False, highlight=False)
    if args.quick:  # a smoke run: the same block, beside its results, not in the docs
        (out / "bass.md").write_text(text)
    else:
        write_docs(text)
    Console(stderr=True).print(f"results: {out / 'bass.json'} ({payload['wall_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
