"""The protocol of every benchmark that carries a claim (issue 42), and the docs blocks it writes.

1. **Selection never sees what is reported.** A ``Protocol`` names the seeds that choose
   configurations (``tuning_seeds``: whole runs on other seeds; or ``validation``: a split carved
   from the training data) and the fresh ``report_seeds`` (at least ``MIN_REPORT_SEEDS``) the
   chosen configurations are scored on; the two never overlap. ``select`` calls its score only on
   tuning seeds, so perturbing a report seed cannot move a choice.
2. **Equal searches.** A method's search is a ``Grid``, the product of the knobs that matter to it;
   ``budget`` refuses grids of different sizes unless the caller says why (the reason is recorded).
   A method given more configurations than another wins on the tuning, not the method.
3. **Paired seeds.** Every method runs on the same report seeds (the same data, partition and
   initial draw per seed), so comparisons are paired: a t-interval of the per-seed differences
   (or log ratios) and Wilcoxon's signed-rank test beside it (``scipy.stats.t`` and
   ``wilcoxon``; with 5 seeds Wilcoxon's smallest two-sided p is 1/16, so the interval decides).
4. **Intervals over what varies.** Over seeds where only the seed varies; where seeds and test
   examples both vary (a language model's Rouge-L), ``hierarchical_bootstrap`` resamples seeds, then
   examples within each drawn seed. ``seeds_for_power`` says how many seeds a paired test would
   need to detect a given effect (SciPy's noncentral t).
5. **Thresholds exactly.** ``trailing_mean`` sums each window on its own (math.fsum), not as a
   difference of cumulative sums, whose rounding turned an exact tie 0.8394/0.8406/0.84 into
   0.83999...; ``reaches`` compares with ``TOLERANCE`` (1e-9, far below one test example in 10^4).
6. **Claims by code.** ``Paired.sentence`` states a direction only where the paired 95% t-interval
   excludes "no difference" and, where there are seeds enough for it to reject (n >= 6), Wilcoxon's
   test agrees at 5%; otherwise it says "no conclusion", with the interval.

Every results JSON carries ``Protocol.record``: {"selection", "tuning_seeds", "report_seeds",
"configs_per_method"}.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from scipy import stats

from taciturn.core.errors import TaciturnError

LEVEL = 0.95
TOLERANCE = 1e-9  # accuracies are counts over >= 10^2 test examples: steps of 1e-2 or finer, never 1e-9
MIN_REPORT_SEEDS = 5
Selection = Literal["validation", "tuning_seeds", "none"]
Interval = tuple[float, float]


class ProtocolError(TaciturnError, ValueError):
    """A benchmark's protocol is broken before any run: overlapping seeds, unequal searches."""


class IntervalError(ProtocolError):
    """Too few repetitions (or none finite) to state an interval."""


class BudgetError(ProtocolError):
    """Methods in one comparison were given searches of different sizes, with no reason given."""


# ----- seeds and selection -----
@dataclass(frozen=True)
class Protocol:
    """Which seeds choose configurations and which report them. ``smoke`` lifts the minimum of
    report seeds for a ``--quick`` run, which is labelled and never a claim."""

    selection: Selection
    tuning_seeds: tuple[int, ...]
    report_seeds: tuple[int, ...]
    smoke: bool = False

    def __post_init__(self) -> None:
        tuning, report = tuple(self.tuning_seeds), tuple(self.report_seeds)
        object.__setattr__(self, "tuning_seeds", tuning)
        object.__setattr__(self, "report_seeds", report)
        for name, seeds in (("tuning", tuning), ("report", report)):
            if len(set(seeds)) != len(seeds):
                raise ProtocolError(f"{name} seeds {list(seeds)} repeat a seed: list each once")
        if both := sorted(set(tuning) & set(report)):
            raise ProtocolError(
                f"seeds {both} are both tuning and report seeds: a configuration chosen on a seed "
                "must be scored on others (the winner's curse); pick disjoint seeds"
            )
        minimum = 2 if self.smoke else MIN_REPORT_SEEDS
        if len(report) < minimum:
            raise ProtocolError(
                f"{len(report)} report seeds, at least {minimum} needed"
                + ("" if self.smoke else " for a claim (--quick runs fewer, labelled as a smoke run)")
            )
        if self.selection == "none" and tuning:
            raise ProtocolError("selection 'none' tunes nothing: give no tuning seeds")
        if self.selection != "none" and not tuning:
            raise ProtocolError(f"selection {self.selection!r} needs tuning seeds")

    def record(self, configs_per_method: Mapping[str, int], note: str | None = None) -> dict[str, Any]:
        """The JSON block every results file carries."""
        out = {
            "selection": self.selection,
            "tuning_seeds": list(self.tuning_seeds),
            "report_seeds": list(self.report_seeds),
            "configs_per_method": dict(configs_per_method),
        }
        return out | ({"unequal_because": note} if note else {}) | ({"smoke": True} if self.smoke else {})


@dataclass(frozen=True)
class Grid:
    """One method's search: one dict of knob -> value per configuration."""

    method: str
    points: tuple[dict[str, Any], ...]

    def __len__(self) -> int:
        return len(self.points)


def grid(method: str, **axes: Sequence[Any]) -> Grid:
    """The Cartesian product of ``axes`` (knob name -> values), in the order given."""
    names = list(axes)
    points = tuple(dict(zip(names, values, strict=True)) for values in itertools.product(*axes.values()))
    if not points:
        raise BudgetError(f"{method}: an empty axis leaves no configuration to run")
    return Grid(method, points)


def label(point: Mapping[str, Any]) -> str:
    """'rho=0.1,delta=2' for {"rho": 0.1, "delta": 2}."""
    return ",".join(f"{k}={v}" for k, v in point.items())


def budget(grids: Sequence[Grid] | Mapping[str, Grid], unequal_because: str | None = None) -> dict[str, int]:
    """Each method's search size; BudgetError if they differ and ``unequal_because`` gives no reason."""
    grids = list(grids.values()) if isinstance(grids, Mapping) else list(grids)
    sizes = {g.method: len(g) for g in grids}
    if len(set(sizes.values())) > 1 and not unequal_because:
        raise BudgetError(f"unequal searches {sizes}: give every method a grid of the same size")
    return sizes


@dataclass(frozen=True)
class Choice:
    """A method's configuration, chosen on the tuning seeds; None where none qualified."""

    method: str
    point: dict[str, Any] | None
    scores: dict[str, float | None]  # label -> mean score over the tuning seeds (None: disqualified)
    searched: int

    @property
    def label(self) -> str | None:
        return None if self.point is None else label(self.point)


def select(
    search: Grid,
    score: Callable[[dict[str, Any], int], float | None],
    protocol: Protocol,
    lower_is_better: bool = True,
) -> Choice:
    """The point of ``search`` with the best mean ``score(point, seed)`` over the tuning seeds.

    ``score`` is called with tuning seeds only; it returns None where a point fails on a seed (a
    target not reached), which disqualifies the point. Ties go to the earlier point of the grid.
    With ``selection = "none"`` the grid must hold one point, which is returned unscored."""
    if protocol.selection == "none":
        if len(search) != 1:
            raise BudgetError(f"{search.method}: {len(search)} configurations but nothing tunes them")
        return Choice(search.method, dict(search.points[0]), {label(search.points[0]): None}, 1)
    scores: dict[str, float | None] = {}
    best: dict[str, Any] | None = None
    for point in search.points:
        values = [score(point, seed) for seed in protocol.tuning_seeds]
        mean = None if any(v is None for v in values) else math.fsum(values) / len(values)
        scores[label(point)] = mean
        if mean is None:
            continue
        current = scores[label(best)] if best is not None else None
        if current is None or (mean < current if lower_is_better else mean > current):
            best = point
    return Choice(search.method, None if best is None else dict(best), scores, len(search))


# ----- thresholds and ties -----
def trailing_mean(values: Sequence[float], window: int) -> list[float]:
    """The mean of the last ``window`` values at each position (fewer at the start), each window
    summed on its own: exact ties stay ties."""
    return [
        math.fsum(values[max(0, i + 1 - window) : i + 1]) / min(i + 1, window) for i in range(len(values))
    ]


def reaches(value: float, target: float) -> bool:
    """``value >= target`` up to TOLERANCE (a tie reaches the target)."""
    return value >= target - TOLERANCE


def first_reaching(values: Sequence[float], target: float) -> int | None:
    """The first index whose value reaches ``target``, or None."""
    return next((i for i, v in enumerate(values) if reaches(v, target)), None)


def floor_to(value: float, step: float = 0.01) -> float:
    """``value`` rounded down to a multiple of ``step``, a multiple itself counting as one."""
    return round(math.floor(value / step + TOLERANCE) * step, 10)


def cost_to_target(
    rows: Sequence[Mapping[str, Any]],
    target: float,
    cost: Callable[[Mapping[str, Any]], float],
    window: int = 1,
    metric: str = "accuracy",
) -> float | None:
    """``cost(row)`` at the first evaluation whose trailing mean of ``metric`` over ``window``
    evaluations reaches ``target`` (events or bytes spent by then); None if none does."""
    index = first_reaching(trailing_mean([r[metric] for r in rows], window), target)
    return None if index is None else float(cost(rows[index]))


# ----- intervals -----
def _values(values: Sequence[float]) -> np.ndarray:
    x = np.asarray(values, dtype=float)
    if x.ndim != 1 or x.size < 2 or not np.all(np.isfinite(x)):
        raise IntervalError(
            f"an interval needs at least two finite repetitions, got {list(values)}: run more seeds"
        )
    return x


def t_interval(values: Sequence[float], level: float = LEVEL) -> Interval:
    """The Student-t interval for the mean of ``values`` (one value per seed)."""
    x = _values(values)
    if np.all(x == x[0]):  # no spread: the interval is the point (SciPy would return nan)
        return float(x[0]), float(x[0])
    lo, hi = stats.t.interval(level, x.size - 1, loc=x.mean(), scale=stats.sem(x))
    return float(lo), float(hi)


@dataclass(frozen=True)
class Estimate:
    """A mean over repetitions with its 95% t-interval (None with fewer than two)."""

    mean: float | None
    lo: float | None
    hi: float | None
    n: int

    def text(self, digits: int = 3, scale: float = 1.0) -> str:
        if self.mean is None:
            return "n/a"
        value = f"{self.mean / scale:,.{digits}f}"
        return (
            value
            if self.lo is None
            else f"{value} [{self.lo / scale:,.{digits}f}, {self.hi / scale:,.{digits}f}]"
        )

    def as_dict(self) -> dict[str, Any]:
        return {"mean": self.mean, "lo": self.lo, "hi": self.hi, "n": self.n}


def estimate(values: Sequence[float]) -> Estimate:
    """Mean and t-interval of the finite values."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return Estimate(None, None, None, 0)
    lo, hi = t_interval(x) if x.size > 1 else (None, None)
    return Estimate(float(x.mean()), lo, hi, int(x.size))


def separated(a: Interval, b: Interval) -> bool:
    """True when two intervals do not overlap (unpaired comparisons only; paired ones use ``paired``)."""
    return a[1] < b[0] or b[1] < a[0]


@dataclass(frozen=True)
class Paired:
    """A paired comparison of ``a`` against ``b`` over the seeds both ran.

    ``scale = "difference"``: ``mean`` is the mean of a - b, no difference is 0. ``scale = "ratio"``:
    the geometric mean of a / b with the interval taken on log(a / b) and exponentiated; no
    difference is 1."""

    a: str
    b: str
    scale: Literal["difference", "ratio"]
    n: int
    mean: float
    lo: float
    hi: float
    wilcoxon_p: float | None  # None where every difference is 0
    agree: int  # seeds whose difference lies on the side of the mean
    per_seed: list[float]

    @property
    def null(self) -> float:
        return 1.0 if self.scale == "ratio" else 0.0

    @property
    def signed_ranks_disagree(self) -> bool:
        """The t-interval excludes no difference, but Wilcoxon's test, with the seeds to reject at
        5% (n >= 6: the smallest two-sided p is 2 / 2^n), does not."""
        excluded = self.lo > self.null or self.hi < self.null
        return excluded and self.n >= 6 and (self.wilcoxon_p is None or self.wilcoxon_p >= 0.05)

    @property
    def direction(self) -> int:
        """+1: a above b, -1: a below b, with the whole t-interval and, where it can reject,
        Wilcoxon's test at 5%; 0: no conclusion."""
        if self.signed_ranks_disagree:
            return 0
        return 1 if self.lo > self.null else -1 if self.hi < self.null else 0

    def against(self, bound: float, claim: Literal["below", "above"]) -> Literal["yes", "no", "open"]:
        """Whether the whole interval lies on the ``claim`` side of ``bound`` (a saving at or below
        0.65, a loss at or above -3 points): "yes" where it does, the bound itself included; "no"
        where it lies wholly on the other side, the bound excluded; "open" where it reaches both.
        Within TOLERANCE of the bound counts as on it."""
        lo, hi = (self.lo, self.hi) if claim == "below" else (-self.hi, -self.lo)
        edge = bound if claim == "below" else -bound
        return "yes" if hi <= edge + TOLERANCE else "no" if lo > edge + TOLERANCE else "open"

    def as_dict(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "scale": self.scale,
            "n": self.n,
            "mean": self.mean,
            "ci": [self.lo, self.hi],
            "wilcoxon_p": self.wilcoxon_p,
            "agree": self.agree,
            "per_seed": self.per_seed,
            "direction": self.direction,
        }

    def sentence(self, what: str, lower_is_better: bool = True, digits: int = 3) -> str:
        """One claim from the interval: which is better at ``what``, or that there is no conclusion.
        On the ratio scale ``what`` is a cost ("events"): "a needs 42% fewer events than b"."""
        wilcoxon = "n/a" if self.wilcoxon_p is None else f"{self.wilcoxon_p:.3g}"
        tail = f"paired 95% t-interval over {self.n} seeds; Wilcoxon p = {wilcoxon}"
        if self.scale == "ratio":
            stated = f"ratio {self.mean:.2f} [{self.lo:.2f}, {self.hi:.2f}]"
        else:
            d = digits
            stated = f"difference {self.mean:+.{d}f} [{self.lo:+.{d}f}, {self.hi:+.{d}f}]"
        if self.direction == 0:
            disagree = f"excludes {self.null:g} but Wilcoxon's test does not agree at 5%"
            none = f"no conclusion, {stated} " + (
                disagree if self.signed_ranks_disagree else f"contains {self.null:g}"
            )
            return f"{self.a} against {self.b} on {what}: {none} ({tail})."
        lower = self.direction < 0
        word = "better" if lower == lower_is_better else "worse"
        agree = f"{self.agree} of {self.n} seeds agree"
        if self.scale == "ratio":
            amount = f"{abs(1 - self.mean):.0%} {'fewer' if lower else 'more'} {what}"
            return f"{self.a} needs {amount} than {self.b} ({word}): {stated}, {agree} ({tail})."
        side = "lower" if lower else "higher"
        return f"{self.a} is {word} than {self.b} on {what} ({side}): {stated}, {agree} ({tail})."


def paired(
    a: Sequence[float], b: Sequence[float], names: tuple[str, str] = ("a", "b"), ratio: bool = False
) -> Paired:
    """The paired comparison of per-seed values ``a`` and ``b`` (same seeds, same order)."""
    x, y = _values(a), _values(b)
    if x.size != y.size:
        raise IntervalError(f"paired values need the same seeds: {x.size} against {y.size}")
    if ratio and (np.any(x <= 0) or np.any(y <= 0)):
        raise IntervalError("a ratio needs positive values")
    d = np.log(x) - np.log(y) if ratio else x - y
    lo, hi = t_interval(d)
    mean = float(d.mean())
    p = None if np.all(d == 0) else float(stats.wilcoxon(d).pvalue)
    agree = int(np.sum(np.sign(d) == np.sign(mean))) if mean != 0 else int(np.sum(d == 0))
    if ratio:
        mean, lo, hi = math.exp(mean), math.exp(lo), math.exp(hi)
    return Paired(
        names[0],
        names[1],
        "ratio" if ratio else "difference",
        int(d.size),
        mean,
        lo,
        hi,
        p,
        agree,
        d.tolist(),
    )


def charge_misses(theirs: Sequence[float | None], totals: Sequence[float]) -> tuple[list[float], int]:
    """Costs to a target per seed, each seed where it was missed (None) charged its whole run's cost,
    and how many were. That charge is only a lower bound of what reaching the target would cost, so a
    ratio of ours over it below 1 stands and above 1 shows nothing (``sentence_to_lower_bound``)."""
    charged = [t if t is not None else total for t, total in zip(theirs, totals, strict=True)]
    return charged, sum(t is None for t in theirs)


def direction_to_lower_bound(p: Paired, censored: int) -> int:
    """``p.direction`` where ``censored`` of b's seeds were charged by ``charge_misses``: more than a
    lower bound of b's cost shows nothing, so a direction in b's favour is withheld (0)."""
    return 0 if censored and p.direction > 0 else p.direction


def sentence_to_lower_bound(p: Paired, censored: int, what: str) -> str:
    """``p.sentence(what)``, without its full stop, where ``censored`` of b's seeds were charged by
    ``charge_misses``: a direction in b's favour is then withheld, and the charge is said."""
    said = p.sentence(what).rstrip(".")
    if not censored:
        return said
    if direction_to_lower_bound(p, censored) != p.direction:
        said = (
            f"{p.a} against {p.b} on {what}: ratio {p.mean:.2f} [{p.lo:.2f}, {p.hi:.2f}] to a lower bound"
            f" of {p.b}'s {what}, so no direction follows"
        )
    return said + f" ({p.b} missed the target on {censored} of {p.n} seeds: its whole run's {what} counted)"


def seeds_for_power(
    differences: Sequence[float], effect: float, power: float = 0.8, level: float = LEVEL, most: int = 10_000
) -> int | None:
    """Seeds a two-sided paired t-test at 1 - ``level`` needs to detect a mean difference of
    ``effect`` with probability ``power``, at the spread (sample sd) of ``differences`` (a pilot);
    None if not within ``most``. Power from the noncentral t (scipy.stats.nct)."""
    sd = float(np.std(_values(differences), ddof=1))
    if sd == 0:
        return 2
    for n in range(2, most + 1):
        critical = stats.t.ppf(1 - (1 - level) / 2, n - 1)
        shift = abs(effect) / (sd / math.sqrt(n))
        if stats.nct.sf(critical, n - 1, shift) + stats.nct.cdf(-critical, n - 1, shift) >= power:
            return n
    return None


def bootstrap_groups(
    groups: Sequence[Sequence[float]],
    statistic: Callable[..., float],
    level: float = LEVEL,
    resamples: int = 9999,
    seed: int = 0,
) -> Interval:
    """Percentile bootstrap of ``statistic(*group_arrays)`` over independent groups (the seeds at
    each width), each resampled on its own, as ``scipy.stats.bootstrap`` with several samples."""
    arrays = [_values(g) for g in groups]
    result = stats.bootstrap(
        tuple(arrays),
        statistic,
        confidence_level=level,
        n_resamples=resamples,
        method="percentile",
        vectorized=False,
        random_state=np.random.default_rng(seed),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


@dataclass
class Hierarchical:
    """Per named statistic: the value on the data as drawn and its percentile interval."""

    point: dict[str, float]
    interval: dict[str, Interval] = field(default_factory=dict)


def hierarchical_bootstrap(
    examples_per_seed: Sequence[int],
    statistic: Callable[[Sequence[int], Sequence[np.ndarray]], Mapping[str, float]],
    level: float = LEVEL,
    resamples: int = 2000,
    seed: int = 0,
) -> Hierarchical:
    """Two-stage bootstrap where both the training seed and the test examples vary (Davison &
    Hinkley 1997, Sec. 3.8): each resample draws seeds with replacement, then examples with
    replacement within each drawn seed; ``statistic(seeds, picks)`` gets the drawn seed indices and
    one index array per drawn seed and returns named values. Every name is computed on the same
    draws, so differences between methods that share seeds and examples are paired. SciPy's
    bootstrap resamples one level only, hence this loop."""
    if len(examples_per_seed) < 2:
        raise IntervalError("a bootstrap over seeds needs at least two seeds: run more seeds")
    rng = np.random.default_rng(seed)
    everything = [np.arange(k) for k in examples_per_seed]
    point = dict(statistic(list(range(len(examples_per_seed))), everything))
    draws: dict[str, list[float]] = {name: [] for name in point}
    for _ in range(resamples):
        seeds = rng.integers(0, len(examples_per_seed), len(examples_per_seed))
        picks = [rng.integers(0, examples_per_seed[s], examples_per_seed[s]) for s in seeds]
        for name, value in statistic(seeds.tolist(), picks).items():
            draws[name].append(value)
    tail = 100 * (1 - level) / 2
    out = Hierarchical({k: float(v) for k, v in point.items()})
    for name, values in draws.items():
        lo, hi = np.percentile(values, [tail, 100 - tail])
        out.interval[name] = (float(lo), float(hi))
    return out


# ----- docs: generated blocks of docs/benchmarks.md -----
DOCS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


def markdown_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def save_figure(fig, path: Path, dpi: int = 110) -> Path:
    """Lay out a matplotlib figure, write it to ``path`` (its folder made) and close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def replace_section(name: str, body: str, title: str, path: Path = DOCS) -> Path:
    """Replace the text between ``<!-- name:begin -->`` and ``<!-- name:end -->`` (appended under
    ``## title`` if absent); everything outside the markers is written by hand and kept."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    block = f"{begin}\n{body.strip()}\n{end}"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip() + f"\n\n## {title}\n\n{block}\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def protocol_lines(record: Mapping[str, Any]) -> str:
    """The docs sentence that states a results file's protocol."""
    configs = record["configs_per_method"]
    sizes = sorted(set(configs.values()))
    one = f"{sizes[0]} configuration{'s' if sizes[0] != 1 else ''} per method"
    searched = one if len(sizes) == 1 else f"searches of {configs}"
    how = {
        "tuning_seeds": f"chosen on tuning seeds {record['tuning_seeds']}",
        "validation": f"chosen on validation splits of seeds {record['tuning_seeds']}",
        "none": "fixed in advance (nothing tuned)",
    }[record["selection"]]
    text = f"Protocol: configurations {how} ({searched}), reported on fresh seeds {record['report_seeds']}"
    text += f"; {record['unequal_because']}" if record.get("unequal_because") else ""
    if record.get("smoke"):
        return text + ". **Smoke run (--quick): tiny scale, too few seeds; no conclusion may be drawn.**"
    return text + "."
