"""Accuracy per byte: taciturn's best configuration against the best baselines (issue 43, items 3-4).

Test accuracy against total bytes (uplink plus downlink, the ledger's) for every method x
compressor x participation, on event_admm.py's setting B (MLP, Dirichlet(0.5), 100 agents) and its
harder setting C (CNN, Dirichlet(0.1)), under the protocol of protocol.py:

* Five families, 21 configurations each (``protocol.budget`` refuses unequal searches). FedAvg,
  FedProx, SCAFFOLD and FedADMM: uncompressed at C in {0.05, 0.1, 0.2, 0.5, 1}, and each compressor
  of ``PROFILES`` at the C < 1 (``compression_of``: the same tables for every method, with the error
  feedback each method's messages admit). Event-based ADMM as taciturn runs it beyond the paper:
  sampling and triggering together, per-client downlink, common start, compressed changes with
  error memory; at Delta = 0 uncompressed for every C, then four (Delta, compressor) pairs of
  ``EVENT_PROFILES`` at the C < 1, Delta in units of the median trigger norm of the Delta = 0 run at
  that C on the calibration seed (that run is one of the 21: charged). Learning rates, rho (0.01,
  the authors') and mu are the setting's, not searched.
* Targets from the tuning runs: their best mean accuracy (trailing mean of 3) less 10, 5 and 2
  points, rounded down exactly. Bytes to a target: up plus down until the trailing mean first
  reaches it (protocol.cost_to_target).
* Three choices per target, each the configuration with the fewest mean tuning bytes among those
  reaching the target on every tuning seed: ``best`` (taciturn's best: any configuration of any
  family, compressed FedAvg included), ``baseline_best`` (FedAvg, FedProx, SCAFFOLD, FedADMM
  uncompressed: 20 configurations) and ``baseline_compressed_best`` (those four with every
  compressor: 84, "none" among them, so never weaker than ``baseline_best``). Each family's own
  choice per target too. Selection sees tuning seeds only.
* Report seeds, paired: every choice runs on the five report seeds; the saving is the paired
  geometric-mean ratio of bytes with its 95% t-interval (protocol.paired). Per target the verdict
  is generated: **met** where taciturn's best needs at least 35% fewer bytes than
  ``baseline_best`` and at least 10% fewer than ``baseline_compressed_best``, each whole interval
  (ratio <= 0.65 and <= 0.90); **not met** where either whole interval lies above its bound, or
  taciturn's best missed the target on a report seed; **no conclusion** otherwise. A baseline that
  missed the target on a report seed is charged its whole run's bytes (a lower bound of its cost):
  that can only make a saving look smaller, so such a comparison can be met, never "not met".
* Where the bytes go, per target and choice: up and down, rounds, bytes per round, the first
  round, uplink and downlink messages (docs/benchmarks.md, "frontier" block).

Run budget of the full run (``--settings B C``), one tuning seed, five report seeds:
  tuning   5 families x 21 configurations x 1 seed x 2 settings          = 210 runs
  report   at most (5 families + 3 choices) x 3 targets distinct
           configurations x 5 seeds x 2 settings                          <= 240 runs; about 12
           distinct per setting (one configuration often wins several targets and choices): ~120
  ``plan`` prints the runs left and their time from ``COST`` (measured CPU seconds) before starting
  (``--plan``: only that). On 2 idle cores with --jobs 2: tuning 2.8 h (B 1.6 h, C 1.2 h), report
  about 1.4 h, about 4.2 h in all. Compressed runs at C = 1 would add 1.8 h, a second tuning seed 2.8 h.
Runs are kept in benchmarks/results/frontier_runs.jsonl (keyed by config and simulation code,
run_key.py; event_admm.py's log is read too, so runs the two benchmarks share are made once): an
interrupted run continues where it stopped.

    python benchmarks/frontier.py --quick                  # smoke run: the same code at tiny scale
    python benchmarks/frontier.py --settings B C --jobs 2  # the benchmark, results and docs
    python benchmarks/frontier.py --write-demo DIR         # the demo's two configs from frontier.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import event_admm as ea
import numpy as np
import tomli_w
import torch
from protocol import (
    DOCS,
    Choice,
    Estimate,
    Grid,
    Protocol,
    budget,
    charge_misses,
    cost_to_target,
    estimate,
    first_reaching,
    floor_to,
    label,
    markdown_table,
    paired,
    protocol_lines,
    replace_section,
    save_figure,
    select,
    sentence_to_lower_bound,
    trailing_mean,
)
from rich.console import Console

ROOT, RESULTS, IMAGES = ea.ROOT, ea.RESULTS, ea.IMAGES
RUNS = ROOT / "benchmarks" / "runs" / "frontier"
README = ROOT / "README.md"
console = Console()

BASELINES = ("fedavg", "fedprox", "scaffold", "fedadmm")
EVENT = "event_admm"
FAMILIES = (*BASELINES, EVENT)
# Both links of each compressor. fp16 is left out: int8 and int4 with a scale per 64 values lost no
# accuracy against float32 on setting B (FedAvg C = 0.1, 40 rounds, tuning seed 0: 0.797-0.798
# either way, at 1/4 and 1/7 of the bytes), so fp16 would only be dominated. Top-k (5%, values in
# fp16) and QSGD (s = 7: 4 bits a value) compress the uplink; the downlink is the model, which only
# a value-wise quantiser approximates: int4 (EF21-P's top-k downlink sent 33% more than int8, its
# first message to each client being the raw model).
PROFILES = ("none", "int8", "int4", "topk", "qsgd")
EVENT_PROFILES = (
    (0.0, "none"),
    (0.0, "int4"),
    (1.0, "none"),
    (1.0, "int4"),
    (1.0, "topk"),
)  # (Delta, compressor)
TOPK, QSGD_LEVELS = 0.05, 7
RHO = 0.01  # FedADMM's and event ADMM's penalty: the authors' value
SMOOTH = ea.SMOOTH
OFFSETS = (0.10, 0.05, 0.02)
TUNING_SEEDS, REPORT_SEEDS = (0,), ea.REPORT_SEEDS
POOLS = ("best", "baseline_best", "baseline_compressed_best")
POOL_NAMES = {
    "best": "taciturn's best",
    "baseline_best": "the best uncompressed baseline",
    "baseline_compressed_best": "the best compressed baseline",
}
SAVINGS = {"baseline_best": 0.35, "baseline_compressed_best": 0.10}  # issue 43's target
SETTINGS = {"B": ea.setting_b, "C": ea.setting_c}
# CPU seconds of one run on one core (time.process_time, torch on one thread; measured on this
# 2-core machine with other work running, 4 rounds of B and 3 of C at C = 0.1 and 1, less the start):
# start + rounds x (round[method] + sampled clients x (client[method] + codec if compressed)). The
# ADMMs' per-round cost is the server's N copies (state checks, clones, the mean).
COST = {
    "B": {
        "start": 0.4,
        "round": {"fedavg": 0.02, "fedprox": 0.02, "scaffold": 0.013, "fedadmm": 0.29, EVENT: 0.55},
        "client": {"fedavg": 0.017, "fedprox": 0.030, "scaffold": 0.026, "fedadmm": 0.031, EVENT: 0.030},
        "codec": 0.012,
    },
    "C": {
        "start": 1.0,
        "round": {"fedavg": 0.56, "fedprox": 0.56, "scaffold": 0.6, "fedadmm": 1.2, EVENT: 1.43},
        "client": {"fedavg": 0.069, "fedprox": 0.08, "scaffold": 0.08, "fedadmm": 0.085, EVENT: 0.094},
        "codec": 0.018,
    },
}


# ----- the searches -----
def compression_of(profile: str, method: str) -> dict[str, Any]:
    """The [compression] table of ``profile`` for ``method``: the same chains for every method, with
    the feedback its uplink admits (experiments/config.py refuses the rest): EF21 for FedAvg's and
    FedProx's updates under top-k, error memory for the increments of SCAFFOLD and the ADMMs."""
    if profile == "none":
        return {}
    up = {
        "int8": ["int8"],
        "int4": ["int4"],
        "topk": [{"kind": "topk", "fraction": TOPK}, "fp16"],
        "qsgd": [{"kind": "qsgd", "levels": QSGD_LEVELS}],
    }[profile]
    table: dict[str, Any] = {"up": up, "down": ["int8"] if profile == "int8" else ["int4"]}
    if method in ("scaffold", "fedadmm", EVENT):
        table["up_feedback"] = "memory"
    elif profile == "topk":
        table["up_feedback"] = "ef21"
    return table


def family_grids(
    fractions: Sequence[float],
    profiles: Sequence[str] = PROFILES,
    event_profiles: Sequence[tuple[float, str]] = EVENT_PROFILES,
) -> dict[str, Grid]:
    """Every family's search; ``budget`` refuses them before any run unless they are equal. Every C
    uncompressed (event ADMM: at Delta = 0, its calibration); compressed or triggered, every C < 1:
    with every client every round the most bytes, and the runs that cost the most CPU."""
    sampled = [c for c in fractions if c < 1]

    def over(full: bool) -> list[float]:
        return list(fractions) if full else sampled

    grids = {
        m: Grid(
            m,
            tuple({"method": m, "compressor": p, "fraction": c} for p in profiles for c in over(p == "none")),
        )
        for m in BASELINES
    }
    grids[EVENT] = Grid(
        EVENT,
        tuple(
            {"method": EVENT, "compressor": p, "delta": d, "fraction": c}
            for d, p in event_profiles
            for c in over(d == 0 and p == "none")
        ),
    )
    budget(grids)
    return grids


def pools(grids: Mapping[str, Grid]) -> dict[str, Grid]:
    """The three choices' candidates: everything; the baselines uncompressed; the baselines."""
    baselines = [p for m in BASELINES for p in grids[m].points]
    return {
        "best": Grid("best", tuple(p for g in grids.values() for p in g.points)),
        "baseline_best": Grid("baseline_best", tuple(p for p in baselines if p["compressor"] == "none")),
        "baseline_compressed_best": Grid("baseline_compressed_best", tuple(baselines)),
    }


def calibration_point(fraction: float) -> dict[str, Any]:
    return {"method": EVENT, "compressor": "none", "delta": 0.0, "fraction": fraction}


def spec_of(
    setting: dict[str, Any], point: Mapping[str, Any], seed: int, calibrations: Mapping[float, ea.Run] | None
) -> ea.Spec:
    """event_admm.py's run of ``point`` at ``seed``: the same [algorithm] tables (uncompressed
    baselines are event_admm.py's runs), with [compression] and, for event ADMM, sampling. Delta
    comes from the calibration run at the point's C; without ``calibrations`` it is a placeholder
    (for checking that the config validates, before any run)."""
    method, profile, fraction = point["method"], point["compressor"], point["fraction"]
    compression = compression_of(profile, method)
    options: tuple[tuple[str, Any], ...] = ()
    thresholds = (0.0, 0.0)
    if method == EVENT:
        algorithm = (("rho", RHO), ("delta", point["delta"]))
        if point["delta"] and calibrations is None:
            thresholds = (point["delta"], point["delta"])
        elif point["delta"]:
            thresholds = ea.thresholds(EVENT, {"delta": point["delta"]}, calibrations[fraction])
        options = (("fraction", fraction), ("start", "common"), ("uplink", "change"))
        tag = f"-C{fraction}-{profile}"
    else:
        knob = ("rho", RHO) if method == "fedadmm" else ("lr", setting["local"]["lr"])
        algorithm = (("fraction", fraction), knob)
        if method == "fedadmm" and compression:
            options = (("uplink", "change"),)  # x_i + u_i is a value; its change compresses
        tag = "" if profile == "none" else f"-{profile}"
    return ea.Spec(
        method,
        algorithm,
        seed,
        thresholds,
        tag=tag,
        options=options,
        compression=json.dumps(compression, sort_keys=True) if compression else "",
    )


def config_of(setting: dict[str, Any], point: Mapping[str, Any], calibrations: Mapping) -> dict[str, Any]:
    """The point with the [algorithm] and [compression] tables it runs (Delta resolved)."""
    tree = ea.tree_of(setting, spec_of(setting, point, 0, calibrations))
    return dict(point) | {"algorithm": tree["algorithm"], "compression": tree.get("compression", {})}


def describe(point: Mapping[str, Any] | None) -> str:
    """'event_admm, topk, Delta = 1 unit, C = 0.1'."""
    if point is None:
        return "none"
    delta = ""
    if "delta" in point:
        delta = f", Delta = {point['delta']:g} unit" if point["delta"] else ", Delta = 0"
    return f"{point['method']}, {point['compressor']}{delta}, C = {point['fraction']:g}"


# ----- runs -----
def bytes_of(row: Mapping[str, Any]) -> float:
    return row["bytes_up"] + row["bytes_down"]


def bytes_to_target(rows: Sequence[Mapping[str, Any]], target: float) -> float | None:
    """Bytes (up + down) spent when the trailing mean of SMOOTH evaluations first reaches ``target``."""
    return cost_to_target(rows, target, bytes_of, SMOOTH)


def spent(rows: Sequence[Mapping[str, Any]], target: float) -> dict[str, float] | None:
    """Where the bytes to ``target`` went: up, down, rounds, per round, round 1, messages."""
    index = first_reaching(trailing_mean([r["accuracy"] for r in rows], SMOOTH), target)
    if index is None:
        return None
    row, first = rows[index], rows[min(1, len(rows) - 1)]  # rows[0]: the initial model, nothing sent
    rounds = row["round"]
    return {
        "rounds": rounds,
        "up": row["bytes_up"],
        "down": row["bytes_down"],
        "per_round": bytes_of(row) / rounds if rounds else 0.0,
        "first_up": first["bytes_up"],
        "first_down": first["bytes_down"],
        "messages_up": row["messages_up"],
        "messages_down": row["messages_down"],
    }


def run_points(setting, points: Sequence[Mapping], seeds: Sequence[int], calibrations, jobs: int) -> dict:
    """{(label(point), seed): Run} of every point on every seed (stored runs read back)."""
    specs = {(label(p), s): spec_of(setting, p, s, calibrations) for p in points for s in seeds}
    runs = ea.run_all(setting, list(dict.fromkeys(specs.values())), jobs)
    return {key: runs[spec] for key, spec in specs.items()}


def calibrate(setting, protocol: Protocol, fractions: Sequence[float], jobs: int) -> dict[float, ea.Run]:
    """The Delta = 0 event runs on the calibration seed (the first tuning seed), one per C: their
    median trigger norm and z change are the units of Delta and Delta_z at that C."""
    points = [calibration_point(c) for c in fractions]
    runs = run_points(setting, points, protocol.tuning_seeds[:1], None, jobs)
    return {p["fraction"]: runs[(label(p), protocol.tuning_seeds[0])] for p in points}


def stored_calibrations(setting, protocol: Protocol) -> dict[float, ea.Run]:
    """The calibration runs already in the logs, by C (for the plan of a resumed run)."""
    stored, out = ea.stored_runs(setting), {}
    for c in setting["fractions"]:
        spec = spec_of(setting, calibration_point(c), protocol.tuning_seeds[0], None)
        if (record := stored.get(ea.key_of(setting, spec))) is not None:
            out[c] = ea.as_run(spec, ea.tree_of(setting, spec), record)
    return out


# ----- selection (tuning seeds only) -----
def choose(
    tuned: Mapping[tuple[str, int], ea.Run],
    grids: Mapping[str, Grid],
    protocol: Protocol,
    offsets: Sequence[float] = OFFSETS,
) -> dict[str, Any]:
    """Targets below the tuning runs' ceiling; per target each family's choice and the three pools'.
    ``tuned`` is read at tuning seeds only: ``select`` asks for nothing else."""
    everything = [p for g in grids.values() for p in g.points]
    means = {
        label(p): float(np.mean([tuned[(label(p), s)].best_accuracy() for s in protocol.tuning_seeds]))
        for p in everything
    }
    ceiling = max(means.values())
    targets = [t for off in offsets if (t := floor_to(ceiling - off)) > 0]

    def chooser(search: Grid, target: float) -> Choice:
        return select(
            search, lambda point, seed: bytes_to_target(tuned[(label(point), seed)].rows, target), protocol
        )

    return {
        "ceiling": ceiling,
        "targets": targets,
        "families": {m: {str(t): chooser(g, t) for t in targets} for m, g in grids.items()},
        "pools": {name: {str(t): chooser(g, t) for t in targets} for name, g in pools(grids).items()},
    }


# ----- claims -----
def unpaired(status: str, sentence: str, censored: int = 0, **why: Any) -> dict[str, Any]:
    """A comparison with no paired interval, and why: ``reached``/``seeds`` (ours missed the target
    on a seed), ``why`` (no ratio), ``itself`` (ours is the baseline)."""
    return {"status": status, "paired": None, "censored": censored, "sentence": sentence} | why


def compare_saving(
    ours: Sequence[float | None],
    theirs: Sequence[float | None],
    theirs_total: Sequence[float],
    saving: float,
    names: tuple[str, str],
) -> dict[str, Any]:
    """Whether ``names[0]`` needs at least ``saving`` fewer bytes than ``names[1]``, seed by seed:
    "met" (the whole paired interval of the ratio at or below 1 - saving), "not met" (the whole
    interval above it, or ours missed the target on a seed), else "no conclusion". A seed where
    theirs missed the target counts their whole run's bytes, a lower bound of their cost."""
    bound = 1 - saving
    need = f">= {saving:.0%} fewer bytes"
    n = len(ours)
    if any(v is None for v in ours):
        reached = sum(v is not None for v in ours)
        sentence = f"{names[0]} reached the target on {reached} of {n} report seeds: {need}, not met."
        return unpaired("not met", sentence, reached=reached, seeds=n)
    b, censored = charge_misses(theirs, theirs_total)
    if min(*ours, *b) <= 0:
        why = "reached the target before any byte was sent: no ratio"
        sentence = f"{names[0]} against {names[1]}: {why}."
        return unpaired("no conclusion", sentence, censored, why=why)
    p = paired(list(ours), b, names, ratio=True)
    side = p.against(bound, "below")
    if p.direction < 0 and side == "yes":
        status, why = "met", f"the whole interval at or below {bound:.2f}"
    elif side == "no" and not censored:
        status, why = "not met", f"the whole interval above {bound:.2f}"
    else:
        status, why = "no conclusion", f"the interval reaches both sides of {bound:.2f}"
        if censored and side == "no":
            why = f"above {bound:.2f}, but {names[1]}'s cost is only bounded below"
    sentence = sentence_to_lower_bound(p, censored, "bytes") + f"; {need}: {status} ({why})."
    return {"status": status, "paired": p.as_dict(), "censored": censored, "sentence": sentence}


def own_method(
    where: str, own: Mapping[str, Any] | None, theirs: Mapping[str, Any] | None, by_label: Mapping
) -> dict[str, Any]:
    """Where taciturn's own method (EVENT, its family's choice at this target) stands against the
    best compressed baseline, with the same 10% test: reported beside the verdict, never part of it
    (the verdict's "taciturn's best" is chosen among every configuration, baselines included)."""
    if own is None or theirs is None:
        why = (
            "reached the target with none of its configurations on the tuning seed"
            if own is None
            else "has no compressed baseline to compare with: none reached the target on the tuning seed"
        )
        return unpaired("no conclusion", f"{where}: {EVENT} at its best {why}.", why=why)
    names = (
        f"{EVENT} at its best ({describe(by_label.get(own['label']))})",
        f"{POOL_NAMES['baseline_compressed_best']} ({describe(by_label.get(theirs['label']))})",
    )
    compared = compare_saving(
        own["per_seed"], theirs["per_seed"], theirs["total"], SAVINGS["baseline_compressed_best"], names
    )
    return compared | {"sentence": f"{where}: {compared['sentence']}"}


def verdict(where: str, comparisons: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """The target's verdict from its two comparisons (against baseline_best and
    baseline_compressed_best): met if both are, not met if either is not, else no conclusion."""
    statuses = [comparisons[k]["status"] for k in SAVINGS]
    status = (
        "met"
        if all(s == "met" for s in statuses)
        else "not met"
        if "not met" in statuses
        else "no conclusion"
    )
    claim = (
        "taciturn's best configuration needs at least 35% fewer bytes than the best uncompressed "
        "baseline and at least 10% fewer than the best compressed baseline"
    )
    details = " ".join(dict.fromkeys(comparisons[k]["sentence"] for k in SAVINGS))  # once if both say it
    return {"status": status, "sentence": f"{where}: {claim}: **{status}**. {details}"}


def pareto_front(points: Iterable[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """The (bytes, accuracy, name) points that no other point beats with no more bytes and no
    less accuracy, by increasing bytes (an exact duplicate keeps its first)."""
    front: list[tuple[float, float, str]] = []
    for b, a, name in sorted(points, key=lambda p: (p[0], -p[1])):
        if not front or a > front[-1][1]:
            front.append((b, a, name))
    return front


def fronts(tuned: Mapping, grids: Mapping[str, Grid], seeds: Sequence[int]) -> dict[str, list]:
    """Per family, the accuracy-per-byte front of its tuning runs: every round of every
    configuration, bytes and trailing-mean accuracy averaged over the tuning seeds."""
    out = {}
    for family, search in grids.items():
        points = []
        for p in search.points:
            runs = [tuned[(label(p), s)] for s in seeds]
            spent_bytes = np.mean([[bytes_of(r) for r in run.rows] for run in runs], axis=0)
            accuracy = np.mean([run.smoothed() for run in runs], axis=0)
            points += [
                (float(b), float(a), label(p)) for b, a in zip(spent_bytes, accuracy, strict=True) if b > 0
            ]
        out[family] = [list(p) for p in pareto_front(points)]
    return out


# ----- the report seeds -----
def cell(runs: Mapping, point: Mapping | None, target: float, seeds: Sequence[int]) -> dict[str, Any] | None:
    """A configuration's bytes to ``target`` on each report seed, with mean and interval where all reached."""
    if point is None:
        return None
    chosen = [runs[(label(point), s)] for s in seeds]
    values = [bytes_to_target(r.rows, target) for r in chosen]
    reached = sum(v is not None for v in values)
    est = estimate(values) if reached == len(values) else Estimate(None, None, None, reached)
    return {
        "label": label(point),
        "per_seed": values,
        "total": [bytes_of(r.rows[-1]) for r in chosen],
        "reached": reached,
        "bytes": est.as_dict(),
        "spent": [spent(r.rows, target) for r in chosen],
    }


def report(setting, protocol: Protocol, grids, tuned, choice, reported, calibrations) -> dict[str, Any]:
    seeds = protocol.report_seeds
    by_label = {label(p): p for g in grids.values() for p in g.points}
    per_target: dict[str, Any] = {}
    for t in choice["targets"]:
        where = f"Setting {setting['name']}, {t:.0%}"
        cells = {pool: cell(reported, choice["pools"][pool][str(t)].point, t, seeds) for pool in POOLS}
        comparisons = {}
        for pool, saving in SAVINGS.items():
            ours, theirs = cells["best"], cells[pool]
            names = (
                f"{POOL_NAMES['best']} ({describe(by_label.get(ours and ours['label']))})",
                f"{POOL_NAMES[pool]} ({describe(by_label.get(theirs and theirs['label']))})",
            )
            if ours is None or theirs is None:
                missing = names[0] if ours is None else names[1]
                sentence = f"no configuration for {missing} reached the target on every tuning seed."
                status = "not met" if ours is None else "no conclusion"
                comparisons[pool] = {"status": status, "paired": None, "censored": 0, "sentence": sentence}
            elif ours["label"] == theirs["label"]:  # taciturn's best is a baseline configuration
                sentence = (
                    f"{names[0]} is {POOL_NAMES[pool]} itself: no configuration beyond the baselines' own "
                    f"(given taciturn's compressors) does better, so >= {saving:.0%} fewer bytes: not met."
                )
                comparisons[pool] = unpaired("not met", sentence, itself=True)
            else:
                comparisons[pool] = compare_saving(
                    ours["per_seed"], theirs["per_seed"], theirs["total"], saving, names
                )
        per_target[str(t)] = {
            "cells": cells,
            "configs": {
                pool: (c and config_of(setting, by_label[c["label"]], calibrations))
                for pool, c in cells.items()
            },
            "comparisons": comparisons,
            "verdict": verdict(where, comparisons),
            "families": {m: cell(reported, choice["families"][m][str(t)].point, t, seeds) for m in grids},
        }
        own = per_target[str(t)]["families"].get(EVENT)
        per_target[str(t)]["own"] = own_method(where, own, cells["baseline_compressed_best"], by_label)
    tuning = protocol.tuning_seeds
    return {
        "settings": {
            k: v for k, v in setting.items() if k in ("rounds", "data", "partition", "model", "local", "mu")
        },
        "ceiling": choice["ceiling"],
        "targets": choice["targets"],
        "per_target": per_target,
        "tuning_bytes": {
            str(t): {m: c.scores for m, c in ((m, choice["families"][m][str(t)]) for m in grids)}
            for t in choice["targets"]
        },
        "search_cost": {
            m: {
                "runs": len(g) * len(tuning),
                "bytes": float(
                    sum(bytes_of(tuned[(label(p), s)].rows[-1]) for p in g.points for s in tuning)
                ),
                "wall_s": float(sum(tuned[(label(p), s)].wall_s for p in g.points for s in tuning)),
            }
            for m, g in grids.items()
        },
        "units": {str(c): list(ea.unit_of(run, "absolute")) for c, run in calibrations.items()},
        "fronts": fronts(tuned, grids, tuning),
        "tuning_runs": {f"{k[0]}|s{k[1]}": summary(r) for k, r in tuned.items()},
        "report_runs": {f"{k[0]}|s{k[1]}": summary(r) for k, r in reported.items()},
    }


def summary(run: ea.Run) -> dict[str, Any]:
    last = run.rows[-1]
    return {
        "best_accuracy": run.best_accuracy(),
        "final_accuracy": run.smoothed()[-1],
        "bytes_up": last["bytes_up"],
        "bytes_down": last["bytes_down"],
        "wall_s": run.wall_s,
    } | ({"stopped": run.stopped} if run.stopped else {})


# ----- the top-level results: one key per setting and target -----
def flatten(by_setting: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """{"targets": ["B@0.81", ...], "best": {target: {"config", "bytes_ci", ...}}, "baseline_best",
    "baseline_compressed_best", "verdict"}: a target is its setting and accuracy."""
    out: dict[str, Any] = {"targets": [], **{pool: {} for pool in POOLS}, "verdict": {}}
    for name, res in by_setting.items():
        for t in res["targets"]:
            key = f"{name}@{t:g}"
            entry = res["per_target"][str(t)]
            out["targets"].append(key)
            for pool in POOLS:
                c = entry["cells"][pool]
                b = c and c["bytes"]
                out[pool][key] = {
                    "config": entry["configs"][pool],
                    "bytes_ci": [b["lo"], b["hi"]] if b and b["lo"] is not None else None,
                    "bytes_mean": b["mean"] if b else None,
                    "per_seed": c and c["per_seed"],
                    "reached": c["reached"] if c else 0,
                }
            out["verdict"][key] = {
                "status": entry["verdict"]["status"],
                "sentence": entry["verdict"]["sentence"],
            }
    return out


# ----- plot -----
def plot(name: str, res: Mapping[str, Any], path: Path) -> Path:
    """Left: each family's accuracy-per-byte front on the tuning seeds, the targets dashed. Right:
    bytes to each target on the report seeds, the three choices, mean and 95% interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12.0, 4.6))
    for i, (family, front) in enumerate(res["fronts"].items()):
        if front:
            left.step([p[0] for p in front], [p[1] for p in front], where="post", color=f"C{i}", label=family)
    for t in res["targets"]:
        left.axhline(t, color="grey", lw=0.6, ls="--")
    left.set(
        xscale="log",
        xlabel="bytes, up + down (tuning seed mean)",
        ylabel=f"test accuracy (trailing mean of {SMOOTH})",
        title=f"Setting {name}: accuracy-per-byte front of each family",
    )
    left.grid(alpha=0.3)
    left.legend(fontsize=7)
    width = 0.25
    for j, pool in enumerate(POOLS):
        xs, ys, errs = [], [], []
        for i, t in enumerate(res["targets"]):
            c = res["per_target"][str(t)]["cells"][pool]
            x = i + (j - 1) * width
            if c and c["bytes"]["mean"] is not None:
                b = c["bytes"]
                lo, hi = (b["lo"], b["hi"]) if b["lo"] is not None else (b["mean"], b["mean"])
                xs.append(x)
                ys.append(b["mean"])
                errs.append([b["mean"] - lo, hi - b["mean"]])
            else:  # no bar: say why where it would stand
                why = (
                    "none reached it (tuning)"
                    if c is None
                    else f"reached on {c['reached']} of {len(c['per_seed'])}"
                )
                right.text(
                    x,
                    0.02,
                    why,
                    transform=right.get_xaxis_transform(),
                    rotation=90,
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    color=f"C{j}",
                )
        if xs:
            right.bar(xs, ys, width, yerr=np.array(errs).T, color=f"C{j}", label=POOL_NAMES[pool], capsize=3)
    right.set_xticks(range(len(res["targets"])), [f"{t:.0%}" for t in res["targets"]])
    right.set_xlim(-0.5, len(res["targets"]) - 0.5)
    right.set(
        yscale="log",
        xlabel="target accuracy",
        ylabel="bytes to target (report seeds)",
        title="Bytes to each target: mean and 95% t-interval",
    )
    right.grid(alpha=0.3, axis="y")
    right.legend(fontsize=7)
    return save_figure(fig, path)


# ----- docs -----
def megabytes(value: float | None) -> str:
    return "n/a" if value is None else f"{value / 1e6:,.1f}"


def bytes_text(c: Mapping[str, Any] | None) -> str:
    if c is None:
        return "none reached it (tuning)"
    if c["bytes"]["mean"] is None:
        return f"reached on {c['reached']} of {len(c['per_seed'])}"
    return Estimate(**c["bytes"]).text(1, scale=1e6)


def render(results: Mapping[str, Any], folder: Path) -> str:
    """The docs block; ``folder`` holds the file it goes into (images are linked from there)."""
    parts = [
        protocol_lines(results["protocol"]),
        f"Results: `benchmarks/results/{results['file']}`; every run's per-round log in "
        f"`benchmarks/results/{results['log']}`. Command: `{results['command']}`.",
    ]
    for name, res in results["settings"].items():
        parts += render_setting(name, res, folder)
    return "\n\n".join(parts)


def render_setting(name: str, res: Mapping[str, Any], folder: Path) -> list[str]:
    targets = res["targets"]
    heads = [f"{t:.0%}" for t in targets]
    entries = [res["per_target"][str(t)] for t in targets]
    parts = [
        f"### Setting {name}\n\nWorkload: `{json.dumps(res['settings'])}`. Best mean accuracy of any "
        f"configuration on the tuning seeds (trailing mean of {SMOOTH}): {res['ceiling']:.4f}; the targets "
        "sit below it.",
        "Verdicts (generated from the paired intervals over the report seeds):\n\n"
        + "\n".join(f"- {e['verdict']['sentence']}" for e in entries),
        f"Taciturn's own method ({EVENT}: sampling and triggering together, per-client downlink, "
        "compressed changes) at its family's choice against the best compressed baseline, by the same "
        "10% test (beside the verdicts, not part of them):\n\n"
        + "\n".join(f"- {e['own']['sentence']}" for e in entries if "own" in e),
        "MB (10^6 bytes, up + down) to each target on the report seeds, mean [95% t-interval]; each "
        "configuration chosen on the tuning seeds:\n\n"
        + markdown_table(
            ["choice", *heads],
            [[POOL_NAMES[pool], *(bytes_text(e["cells"][pool]) for e in entries)] for pool in POOLS]
            + [[f"family {m}", *(bytes_text(e["families"][m]) for e in entries)] for m in res["fronts"]],
        ),
        "The configurations:\n\n"
        + markdown_table(
            ["choice", *heads],
            [[POOL_NAMES[pool], *(describe(e["configs"][pool]) for e in entries)] for pool in POOLS],
        ),
        "Where the bytes go, to each target (means over the report seeds): rounds, MB up and down, MB "
        "per round, MB in round 1 (up / down), messages up and down (a downlink message is one client "
        "sent the model):\n\n"
        + markdown_table(
            [
                "target",
                "choice",
                "rounds",
                "MB up",
                "MB down",
                "MB/round",
                "round 1 MB",
                "messages up",
                "messages down",
            ],
            where_rows(res),
        ),
        "What each family's search cost on the tuning seeds:\n\n"
        + markdown_table(
            ["family", "runs", "GB sent", "wall s (one core each)"],
            [
                [m, c["runs"], f"{c['bytes'] / 1e9:,.1f}", f"{c['wall_s']:,.0f}"]
                for m, c in res["search_cost"].items()
            ],
        ),
    ]
    stopped = {
        name: run["stopped"]
        for runs in (res["tuning_runs"], res["report_runs"])
        for name, run in runs.items()
        if run.get("stopped")
    }
    if stopped:
        parts.append(
            "Runs that ended before their last round (they count as reaching no target after it):\n\n"
            + "\n".join(f"- `{name}`: {why}" for name, why in sorted(stopped.items()))
        )
    if res.get("plot"):
        parts.append(f"![Accuracy per byte, setting {name}]({os.path.relpath(ROOT / res['plot'], folder)})")
    return parts


def ratio_text(comparison: Mapping[str, Any], whom: str) -> str:
    """ "sends 0.15x [0.12, 0.18] the bytes of <whom>" from a comparison's paired interval, saying
    where <whom> missed the target on a seed (its bytes are then only a lower bound), "reached the
    target on only 3 of 5 report seeds" where the one compared missed it, or why there is no ratio."""
    p = comparison["paired"]
    if p is None:
        if "reached" in comparison:
            return f"reached the target on only {comparison['reached']} of {comparison['seeds']} report seeds"
        return comparison["why"]
    text = f"sends {p['mean']:.2f}x [{p['ci'][0]:.2f}, {p['ci'][1]:.2f}] the bytes of {whom}"
    if comparison["censored"]:
        missed = f"{comparison['censored']} of {p['n']} seeds"
        text += f" (which missed the target on {missed}: a lower bound of its bytes)"
    return text


def readme_block(results: Mapping[str, Any]) -> str:
    """The README's lines: each setting and target's verdict and the byte ratios behind it
    (paired 95% intervals over the report seeds), generated like the docs block."""
    lines = []
    for name, res in results["settings"].items():
        for t in res["targets"]:
            e = res["per_target"][str(t)]
            c, own = e["comparisons"], e.get("own")
            uncompressed, compressed = c["baseline_best"], c["baseline_compressed_best"]
            line = f"- Setting {name}, {t:.0%}: **{e['verdict']['status']}**. taciturn's best "
            line += f"({describe(e['configs']['best'])}) "
            line += ratio_text(uncompressed, "the best uncompressed baseline")
            if uncompressed["paired"] is None:
                line += ", so neither saving is shown"
            else:
                line += f" (>= 35% fewer: {uncompressed['status']})"
            if compressed.get("itself"):
                line += "; it is the best compressed baseline itself (>= 10% fewer: not met)"
            elif compressed["paired"] is not None:
                line += f"; it {ratio_text(compressed, 'the best compressed baseline')}"
                line += f" (>= 10% fewer: {compressed['status']})"
            if own is not None:
                line += f"; {EVENT} at its best {ratio_text(own, 'the best compressed baseline')}"
            lines.append(line + ".")
    return "\n".join(lines)


def where_rows(res: Mapping[str, Any]) -> list[list[str]]:
    rows = []
    for t in res["targets"]:
        for pool in POOLS:
            c = res["per_target"][str(t)]["cells"][pool]
            gone = [s for s in (c["spent"] if c else []) if s is not None]
            if not gone:
                rows.append([f"{t:.0%}", POOL_NAMES[pool], *["n/a"] * 7])
                continue
            mean = {k: float(np.mean([s[k] for s in gone])) for k in gone[0]}
            rows.append(
                [
                    f"{t:.0%}",
                    POOL_NAMES[pool],
                    f"{mean['rounds']:.1f}",
                    megabytes(mean["up"]),
                    megabytes(mean["down"]),
                    megabytes(mean["per_round"]),
                    f"{megabytes(mean['first_up'])} / {megabytes(mean['first_down'])}",
                    f"{mean['messages_up']:,.0f}",
                    f"{mean['messages_down']:,.0f}",
                ]
            )
    return rows


# ----- the demo: the frontier's winner beside the best baseline -----
def demo_configs(results: Mapping[str, Any], setting: str = "B", target: str | None = None) -> dict[str, str]:
    """The two TOML files of ``taciturn demo`` from frontier.json: ``best`` and ``baseline_best``
    at ``target`` (default: the highest of ``setting`` where both have a configuration), on that
    setting's workload, for the same rounds and seed. File name -> text."""
    keys = [k for k in results["targets"] if k.startswith(f"{setting}@")]
    usable = [k for k in keys if results["best"][k]["config"] and results["baseline_best"][k]["config"]]
    if target is None:
        if not usable:
            raise ValueError(f"no target of setting {setting} has both a best and a baseline configuration")
        target = usable[-1]
    elif target not in usable:
        raise ValueError(f"target {target!r} has no pair of configurations; choose from {usable}")
    workload = results["settings"][setting]["settings"]
    out = {}
    for pool, file, run in (
        ("baseline_best", "demo_baseline.toml", "demo-baseline"),
        ("best", "demo_winner.toml", "demo-winner"),
    ):
        entry = results[pool][target]
        config = entry["config"]
        tree = {
            "name": run,
            "seed": 0,
            "rounds": workload["rounds"],
            "data": workload["data"],
            "partition": workload["partition"],
            "model": workload["model"],
            "algorithm": config["algorithm"],
            **({"compression": config["compression"]} if config["compression"] else {}),
            "eval": {"every": 1},
            "checkpoint": {"every": workload["rounds"], "keep": 1},
        }
        ci = entry["bytes_ci"]
        interval = "n/a" if ci is None else f"[{ci[0] / 1e6:,.1f}, {ci[1] / 1e6:,.1f}] MB"
        head = (
            f"# taciturn demo: {POOL_NAMES[pool]} at {target} of benchmarks/frontier.py\n"
            f"# ({describe(config)}), chosen on its tuning seeds; bytes to the target on\n"
            f"# its report seeds: {interval}. Written by `python benchmarks/frontier.py\n"
            f"# --write-demo DIR` from benchmarks/results/{results.get('file', 'frontier.json')}.\n"
        )
        out[file] = head + tomli_w.dumps(tree)
    return out


def write_demo(results: Mapping[str, Any], folder: Path, setting: str = "B") -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for file, text in demo_configs(results, setting).items():
        (folder / file).write_text(text)
        paths.append(folder / file)
    return paths


# ----- plan and main -----
def seconds(setting: Mapping[str, Any], point: Mapping[str, Any]) -> float:
    """Estimated CPU seconds of one run of ``point`` (COST, from measured runs)."""
    cost, method = COST[setting["name"]], point["method"]
    clients = round(point["fraction"] * setting["partition"]["num_clients"])
    codec = cost["codec"] * (2 if method == "scaffold" else 1) if point["compressor"] != "none" else 0.0
    return cost["start"] + setting["rounds"] * (
        cost["round"][method] + clients * (cost["client"][method] + codec)
    )


def plan(settings: Sequence[dict[str, Any]], protocol: Protocol, jobs: int) -> float:
    """Print the runs left and their estimated wall time on ``jobs`` idle cores; return seconds."""
    total = 0.0
    for setting in settings:
        grids = family_grids(setting["fractions"])
        stored, calibrations = ea.stored_runs(setting), stored_calibrations(setting, protocol)
        tuning = [p for g in grids.values() for p in g.points]
        left = [  # a Delta > 0 run whose calibration is still to make is still to make
            (p, s)
            for p in tuning
            for s in protocol.tuning_seeds
            if (p.get("delta") and p["fraction"] not in calibrations)
            or ea.key_of(setting, spec_of(setting, p, s, calibrations)) not in stored
        ]
        tune_s = sum(seconds(setting, p) for p, _ in left)
        # the report: about 12 distinct choices (5 families + 3 pools, 3 targets, many shared) on every
        # report seed, at the mean cost of the configurations with C <= 0.5 (fewest bytes: low C)
        typical = float(np.mean([seconds(setting, p) for p in tuning if p["fraction"] <= 0.5]))
        report_s = 12 * len(protocol.report_seeds) * typical
        total += tune_s + report_s
        console.print(
            f"setting {setting['name']}: {len(tuning) * len(protocol.tuning_seeds)} tuning runs, {len(left)} "
            f"to make (~{tune_s / 3600 / jobs:.1f} h on {jobs} cores), then about "
            f"{12 * len(protocol.report_seeds)} report runs (~{report_s / 3600 / jobs:.1f} h)"
        )
    console.print(f"estimate: ~{total / 3600 / jobs:.1f} h on {jobs} idle cores (COST in frontier.py)")
    return total / jobs


def run_setting(setting, protocol: Protocol, jobs: int, offsets: Sequence[float]) -> dict[str, Any]:
    grids = family_grids(setting["fractions"])
    for p in (p for g in grids.values() for p in g.points):  # every config validates before any run
        ea.key_of(setting, spec_of(setting, p, protocol.tuning_seeds[0], None))
    console.rule(f"setting {setting['name']}: calibration and tuning on seeds {list(protocol.tuning_seeds)}")
    calibrations = calibrate(setting, protocol, setting["fractions"], jobs)
    points = [p for g in grids.values() for p in g.points]
    tuned = run_points(setting, points, protocol.tuning_seeds, calibrations, jobs)
    choice = choose(tuned, grids, protocol, offsets)
    wanted = {
        c.label: c.point
        for group in (*choice["families"].values(), *choice["pools"].values())
        for c in group.values()
        if c.point is not None
    }
    console.rule(
        f"setting {setting['name']}: {len(wanted)} choices on report seeds {list(protocol.report_seeds)}"
    )
    reported = run_points(setting, list(wanted.values()), protocol.report_seeds, calibrations, jobs)
    result = report(setting, protocol, grids, tuned, choice, reported, calibrations)
    image = (RUNS if setting["quick"] else IMAGES) / f"frontier_{setting['name']}.png"
    result["plot"] = str(plot(setting["name"], result, image).relative_to(ROOT))
    for t in result["targets"]:
        console.print(result["per_target"][str(t)]["verdict"]["sentence"], highlight=False, soft_wrap=True)
    return result


def with_earlier_settings(results: dict[str, Any], out: Path) -> dict[str, Any]:
    """Keep the settings of the results file ``out`` this invocation did not run, if made on the
    same seeds (``--settings C`` keeps B)."""
    if not out.exists():
        return results
    earlier = json.loads(out.read_text())
    seeds = ("selection", "tuning_seeds", "report_seeds")
    if {k: earlier["protocol"].get(k) for k in seeds} != {k: results["protocol"][k] for k in seeds}:
        return results
    kept = {n: r for n, r in earlier.get("settings", {}).items() if n not in results["settings"]}
    return results | {"settings": {**kept, **results["settings"]}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run of the same code at tiny scale")
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    parser.add_argument(
        "--plan", action="store_true", help="print the runs left and the estimate, run nothing"
    )
    parser.add_argument(
        "--write-demo",
        metavar="DIR",
        type=Path,
        help="write the demo's two configs from benchmarks/results/frontier.json into DIR (and run nothing)",
    )
    args = parser.parse_args(argv)
    if args.write_demo:  # with --quick, from the smoke run's results (to try the mechanism)
        results = json.loads(
            (RESULTS / ("frontier_quick.json" if args.quick else "frontier.json")).read_text()
        )
        for path in write_demo(results, args.write_demo):
            console.print(f"demo config: {path}")
        return 0
    torch.set_num_threads(1)
    quick = args.quick
    protocol = (
        Protocol("tuning_seeds", TUNING_SEEDS, REPORT_SEEDS[:2], smoke=True)
        if quick
        else Protocol("tuning_seeds", TUNING_SEEDS, REPORT_SEEDS)
    )
    settings = [
        SETTINGS[name](quick)
        | {"quick": quick, "benchmark": "frontier", "shares": ("event_admm",)}
        | ({"fractions": [0.5, 1.0]} if quick else {"fractions": [0.05, 0.1, 0.2, 0.5, 1.0]})
        for name in args.settings
    ]
    plan(settings, protocol, args.jobs)
    if args.plan:
        return 0
    file = "frontier_quick.json" if quick else "frontier.json"
    command = (
        "python benchmarks/frontier.py --settings " + " ".join(args.settings) + (" --quick" if quick else "")
    )
    sizes = budget(family_grids(settings[0]["fractions"]))
    record = protocol.record(sizes) | {
        "pools": {name: len(g) for name, g in pools(family_grids(settings[0]["fractions"])).items()},
        "calibration": "event ADMM's Delta = 0 run at each C on the first tuning seed sets Delta's unit; "
        "it is one of the family's configurations",
    }
    offsets = (0.3, 0.1) if quick else OFFSETS
    started = time.perf_counter()
    by_setting = {s["name"]: run_setting(s, protocol, args.jobs, offsets) for s in settings}
    results: dict[str, Any] = {"protocol": record, "settings": by_setting}
    out = RESULTS / file
    results = with_earlier_settings(results, out)
    results = {
        **flatten(results["settings"]),
        **results,
        "quick": quick,
        "command": command,
        "file": file,
        "log": ea.runs_log(settings[0]).name,
        "wall_s": time.perf_counter() - started,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    console.print(f"results: {out}")
    if quick:  # a smoke run writes the same block into its run folder, never into the docs
        docs = replace_section("frontier", render(results, RUNS), "Frontier (smoke run)", RUNS / "quick.md")
    else:
        block = render(results, DOCS.parent)
        docs = replace_section("frontier", block, "Accuracy per byte: the frontier (issue 43)", DOCS)
        replace_section("frontier", readme_block(results), "Accuracy per byte", README)
    console.print(f"docs: {docs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
