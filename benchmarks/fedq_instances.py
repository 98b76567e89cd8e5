"""FedQ across random MDP instances: which instances, the fits, the statistics and their text.

Issue 19, point 6: the FedQ headline (ICLR 2024, Zheng et al.: Regret / sqrt(MT) and rounds of
FedQ-Hoeffding and FedQ-Bernstein at (H, S, A) = (5, 3, 2)) and the rounds-against-log(episodes)
slopes (ICML 2025, Zhang et al., Sec. 6: sweeps of M, S and A in {2, 4, 6, 8} at H = 2) measured
over independent draws of the papers' MDP generator (`random_mdp`) instead of one MDP.

* Instance i is the MDP that `taciturn run` draws with `[mdp] seed = i` (`make_mdp(..., seed=i)`
  in fedq.py); its p-th sample path runs with run seed ``instance_seeds(i, paths)[p]``, so no two
  (instance, path) pairs share an episode stream.
* A slope is the least-squares fit of rounds against ln(episodes per agent) over the round ends
  inside a fit window [lo, hi] (`taciturn.rl.analysis.log_slope`); the paper's window is
  [T / 20, T] (counted after 5 x 10^5 of 10^7 episodes).
* Every number over instances is a mean with its Student-t 95% interval (protocol.t_interval):
  the instance, not the sample path, is the unit of repetition, and nothing is tuned (c = iota = 1,
  the papers'). Two learners on the same instances are compared instance by instance: a paired
  t-interval of the differences with Wilcoxon's signed-rank test beside it (protocol.paired). A
  claim ("differ", "above") is stated only where a paired interval excludes 0 (or, between sweep
  values, where their intervals separate); otherwise the text says that no difference was detected,
  which is not a proof of equality.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import combinations, pairwise

import numpy as np
from protocol import IntervalError, estimate, paired, protocol_lines, separated

SWEPT = ("M", "S", "A")
BASE = {"S": 2, "A": 2, "M": 2}  # ICML 2025 sweeps: the two quantities not swept stay at 2 (H = 2)
DELTA_EDGES = (0.01, 0.05)  # Delta_min classes of the sensitivity table


def instance_seeds(instance: int, paths: int) -> list[int]:
    """Run seeds of the sample paths on one instance: instance * paths + p, distinct across instances."""
    return [instance * paths + p for p in range(paths)]


def config(swept: str, value: int) -> tuple[int, int, int]:
    """(S, A, M) of the sweep point ``swept = value`` (ICML 2025, Sec. 6)."""
    if swept not in SWEPT:
        raise ValueError(f"swept must be one of {SWEPT}, got {swept!r}")
    sizes = {**BASE, swept: value}
    return sizes["S"], sizes["A"], sizes["M"]


def window_label(lo: float, hi: float) -> str:
    """The JSON key of a fit window, e.g. '5e+05-1e+07'."""
    return f"{lo:.3g}-{hi:.3g}"


def delta_labels(edges: Sequence[float] = DELTA_EDGES) -> list[str]:
    """Labels of the Delta_min classes cut at ``edges``: '<e0', 'e0-e1', ..., '>=e_last'."""
    middle = [f"{a:g}-{b:g}" for a, b in pairwise(edges)]
    return [f"<{edges[0]:g}", *middle, f">={edges[-1]:g}"]


def delta_bin(delta: float, edges: Sequence[float] = DELTA_EDGES) -> str:
    """The class of one Delta_min (inf, an MDP without a positive gap, falls in the last)."""
    return delta_labels(edges)[int(np.searchsorted(edges, delta, side="right"))]


def summary(values: Sequence[float]) -> dict:
    """Mean and 95% t-interval over instances (protocol.estimate: lo and hi None with fewer than two
    finite values), with median and range."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    spread = (float(np.median(x)), float(x.min()), float(x.max())) if x.size else (None, None, None)
    return estimate(x).as_dict() | dict(zip(("median", "min", "max"), spread, strict=True))


def difference(a: Sequence[float], b: Sequence[float]) -> dict:
    """Paired difference a - b over the instances where both are finite (the same instance in
    both): its summary, the paired t-interval, Wilcoxon's p, and the sign the interval supports
    ('above', 'below', or None when it contains 0)."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    both = np.isfinite(x) & np.isfinite(y)
    out = summary(x[both] - y[both]) | {"sign": None, "wilcoxon_p": None, "agree": None}
    try:
        p = paired(x[both], y[both])
    except IntervalError:
        return out
    sign = {1: "above", -1: "below", 0: None}[p.direction]
    return out | {"lo": p.lo, "hi": p.hi, "sign": sign, "wilcoxon_p": p.wilcoxon_p, "agree": p.agree}


def difference_sentence(name_a: str, name_b: str, d: dict, unit: str = "") -> str:
    """One line: the paired difference with its interval and Wilcoxon's p, and a conclusion only if
    the interval excludes 0."""
    if d["lo"] is None:
        return f"{name_a} - {name_b}{unit}: fewer than two instances, no interval"
    wilcoxon = "n/a" if d["wilcoxon_p"] is None else f"{d['wilcoxon_p']:.3g}"
    text = f"{name_a} - {name_b}{unit}: {d['mean']:+.3g} [{d['lo']:+.3g}, {d['hi']:+.3g}]"
    text += f" over {d['n']} instances (paired; Wilcoxon p = {wilcoxon}; {d['agree']} of {d['n']} agree)"
    if d["sign"] is None and (d["lo"] > 0 or d["hi"] < 0):
        return f"{text}; the interval excludes 0 but Wilcoxon's test does not agree at 5%: no conclusion"
    if d["sign"] is None:
        return f"{text}; the interval contains 0: no difference detected"
    return f"{text}; {name_a} is {d['sign']} {name_b} (95% interval excludes 0)"


def compare_values(by_value: Mapping[str, Sequence[float]]) -> dict:
    """ICML 2025's "nearly equal slopes", two ways of letting intervals decide:

    * the t-interval of the mean slope at each swept value, and the pairs of values whose intervals
      separate;
    * the paired difference, instance by instance, between the largest and the smallest value (in
      the M sweep on the same MDP, so the spread between MDPs cancels), and whether its interval
      excludes 0 (None unless both values have the same instances).

    Slopes are said to differ only where one of the two separates; the verdict names both."""
    stats = {v: summary(s) for v, s in by_value.items()}
    stated = {v: (s["lo"], s["hi"]) for v, s in stats.items() if s["lo"] is not None}
    pairs = [[a, b] for a, b in combinations(stated, 2) if separated(stated[a], stated[b])]
    widths = [hi - lo for lo, hi in stated.values()]
    if len(stated) < 2:
        verdict = "fewer than two values with an interval: no test"
    elif pairs:
        verdict = "differ: " + ", ".join(f"{a} vs {b}" for a, b in pairs) + " separate"
    else:
        verdict = f"no pair separates (widest interval {max(widths):.3g})"
    names, series = list(by_value), list(by_value.values())
    extremes = None
    if len(series) > 1 and len(series[0]) == len(series[-1]) > 0:
        extremes = difference(series[-1], series[0])
        if extremes["lo"] is not None:
            verdict += f"; paired {names[-1]}-{names[0]}: " + (
                f"{extremes['sign']} 0" if extremes["sign"] else "contains 0"
            )
    return {"separated_pairs": pairs, "verdict": verdict, "largest_minus_smallest": extremes}


def sweep_slopes(runs: Sequence[Mapping], swept: str, values: Sequence[int], window: str) -> dict:
    """{value: [slope of each instance]} of one sweep at one fit window, from the run records
    (each run: S, A, M, instance and slopes by window label), in instance order."""
    out = {}
    for value in values:
        S, A, M = config(swept, value)
        chosen = sorted(
            (r for r in runs if (r["S"], r["A"], r["M"]) == (S, A, M)), key=lambda r: r["instance"]
        )
        out[str(value)] = [r["slopes"][window] for r in chosen]
    return out


def sensitivity(
    runs: Sequence[Mapping], windows: Sequence[str], edges: Sequence[float] = DELTA_EDGES
) -> dict:
    """{window: {Delta_min class: summary of the slopes of the runs in it}}, pooled over the sweeps'
    distinct (S, A, M, instance) runs."""
    labels = delta_labels(edges)
    out = {}
    for window in windows:
        groups: dict[str, list[float]] = {label: [] for label in labels}
        for r in runs:
            groups[delta_bin(r["delta_min"], edges)].append(r["slopes"][window])
        out[window] = {label: summary(values) for label, values in groups.items()}
    return out


def rounds_statistics(runs: Sequence[Mapping], values: Sequence[int], windows: Sequence[str]) -> dict:
    """Slopes by window, sweep and value (summaries over instances), the equal-slopes test, and the
    window x Delta_min sensitivity table."""
    slopes, equal = {}, {}
    for window in windows:
        slopes[window], equal[window] = {}, {}
        for swept in SWEPT:
            by_value = sweep_slopes(runs, swept, values, window)
            slopes[window][swept] = {v: summary(s) for v, s in by_value.items()}
            equal[window][swept] = compare_values(by_value)
    return {"slopes": slopes, "equal_slopes": equal, "sensitivity": sensitivity(runs, windows)}


# ----- text -----
def interval_cell(s: dict, digits: int = 2) -> str:
    """'mean [lo, hi]' (or the mean alone, or '-')."""
    if s["mean"] is None:
        return "-"
    if s["lo"] is None:
        return f"{s['mean']:.{digits}f}"
    return f"{s['mean']:.{digits}f} [{s['lo']:.{digits}f}, {s['hi']:.{digits}f}]"


def markdown(inst: dict) -> list[str]:
    """The across-instance tables of the FedQ docs section."""
    head, rounds = inst["headline"], inst["rounds"]
    names = list(head["per_instance"])
    lines = [protocol_lines(inst["protocol"]), ""] if "protocol" in inst else []
    lines += [
        f"{inst['count']} instances, {inst['paths_per_instance']} sample path(s) each; instance i is "
        "`[mdp] seed = i`. Mean over instances with its 95% t-interval (the instance is the unit).",
        f"Wall time {inst['wall_s'] / 60:.1f} min ({inst['headline_wall_s'] / 60:.1f} for the headline).",
        "",
        f"**Headline, ICLR 2024 setting** (H, S, A) = (5, 3, 2), {head['total_episodes']} episodes in total:",
        "",
        "| learner | Regret/sqrt(MT), mean [95%] | median | min-max | rounds, mean [95%] | min-max |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in names:
        r = head["summary"][name]["normalised_regret"]
        row = f"| {name} | {interval_cell(r)} | {r['median']:.2f} | {r['min']:.2f}-{r['max']:.2f} |"
        k = head["summary"][name].get("rounds")
        row += f" {interval_cell(k, 0)} | {k['min']:.0f}-{k['max']:.0f} |" if k else " - | - |"
        lines.append(row)
    lines += ["", *(f"* {line}." for line in head["verdicts"]), "", "Per instance:", ""]
    fedq = [n for n in names if "rounds" in head["per_instance"][n]]
    lines += [
        "| instance | Delta_min | " + " | ".join(names + [f"rounds {n}" for n in fedq]) + " |",
        "|---:|---:|" + "---:|" * (len(names) + len(fedq)),
    ]
    for i, gap in enumerate(head["delta_min"]):
        regret = [f"{head['per_instance'][n]['normalised_regret'][i]:.2f}" for n in names]
        count = [f"{head['per_instance'][n]['rounds'][i]:.0f}" for n in fedq]
        lines.append(f"| {i} | {gap:.3g} | " + " | ".join(regret + count) + " |")
    paper = rounds["paper_window"]
    values = [str(v) for v in rounds["values"]]
    lines += [
        "",
        f"**Rounds per ln(episodes), ICML 2025 sweeps** (H = 2, {rounds['episodes_per_agent']} episodes per "
        f"agent), fitted over the paper's window {paper} episodes per agent (least squares over the round "
        "ends inside the window, per instance):",
        "",
        "| swept | " + " | ".join(values) + f" | {values[-1]} minus {values[0]}, paired | equal slopes? |",
        "|---|" + "---:|" * (len(values) + 1) + "---|",
    ]
    for swept in SWEPT:
        test = rounds["equal_slopes"][paper][swept]
        cells = [interval_cell(rounds["slopes"][paper][swept][v]) for v in values]
        cells.append(interval_cell(test["largest_minus_smallest"]) if test["largest_minus_smallest"] else "-")
        lines.append(f"| {swept} | " + " | ".join(cells) + f" | {test['verdict']} |")
    lines += [
        "",
        "Equal-slopes test at every fit window (pairs of swept values whose 95% intervals separate; paired "
        "largest minus smallest value, instance by instance):",
        "",
        "| fit window | " + " | ".join(SWEPT) + " |",
        "|---|" + "---|" * len(SWEPT),
    ]
    for window in rounds["windows"]:
        verdicts = [rounds["equal_slopes"][window][s]["verdict"] for s in SWEPT]
        lines.append(f"| {window} | " + " | ".join(verdicts) + " |")
    labels = list(next(iter(rounds["sensitivity"].values())))
    lines += [
        "",
        "Sensitivity: mean slope [95% interval] (n runs) by fit window and Delta_min class, pooled over the "
        "distinct (S, A, M, instance) runs of the three sweeps:",
        "",
        "| fit window | " + " | ".join(f"Delta_min {label}" for label in labels) + " |",
        "|---|" + "---:|" * len(labels),
    ]
    for window, by_bin in rounds["sensitivity"].items():
        cells = [f"{interval_cell(s)} (n={s['n']})" if s["n"] else "-" for s in by_bin.values()]
        lines.append(f"| {window} | " + " | ".join(cells) + " |")
    return lines
