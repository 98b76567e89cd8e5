"""Experiment types: what ``taciturn run`` can run, chosen by the config's top-level ``type``.

``federated`` is the round-based engine (FedAvg and the methods sharing its shape). Protocols
that are not round-shaped (federated Q-learning, multi-agent bandits) register their own type:
a config model with a ``type`` literal, a start and a resume function, and a report writer.
All of them write the same run directory.
"""

from __future__ import annotations

import contextlib
import difflib
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from taciturn.core.errors import TaciturnError
from taciturn.experiments.config import ConfigError, read_tree, validate
from taciturn.report.rundir import RunDir, RunDirError, check_comparison_folder


@dataclass(frozen=True)
class ExperimentType:
    config: type[BaseModel]
    start: Callable[..., RunDir]  # (config, out, overwrite=, progress=, callbacks=)
    resume: Callable[..., RunDir]  # (path, progress=, callbacks=)
    report: Callable[[RunDir], Path]
    headline: Callable[[RunDir], str] | None = None  # the line `taciturn run` prints when done
    # `taciturn compare`: (run dirs, out folder) -> (the comparison page, a table row per run)
    compare: Callable[[list[RunDir], Path], tuple[Path, dict[str, dict]]] | None = None


def _federated_report(rundir: RunDir) -> Path:
    from taciturn.report.html import write_report

    return write_report(rundir)


def _federated_headline(rundir: RunDir) -> str:
    from taciturn.report.html import summary
    from taciturn.report.plots import metric_keys

    metric = rundir.primary_metric()
    rows = rundir.numeric_metrics(metric_keys(metric))
    s = summary(rows, metric)
    line = (
        f"final {metric} {s.get(f'final {metric}')}, {s.get('MB up')} MB up, "
        f"{s.get('MB down')} MB down, {s.get('wall s')} s"
    )
    epsilon = rows[-1].get("epsilon")  # [privacy]: a number, or "not private: reproducible noise"
    if isinstance(epsilon, int | float):
        return f"{line}, epsilon {epsilon:.4g}"
    return line if epsilon is None else f"{line}; {str(epsilon).upper()}"


def _federated_comparison(rundirs: list[RunDir], out: Path) -> tuple[Path, dict[str, dict]]:
    from taciturn.report.html import summary, write_comparison
    from taciturn.report.plots import metric_keys

    metric = rundirs[0].primary_metric()
    keys = [f"final {metric}", f"best {metric}", "MB up", "MB down", "rounds", "wall s"]
    rows = {str(r.path): summary(r.numeric_metrics(metric_keys(metric)), metric) for r in rundirs}
    return write_comparison(rundirs, out), {run: {k: s.get(k) for k in keys} for run, s in rows.items()}


# Each type is imported when a config asks for it: a federated run never pays for the imports of
# the bandit or Q-learning code (start-up time counts in every benchmark).
def _federated() -> ExperimentType:
    from taciturn.experiments import runner
    from taciturn.experiments.config import RunConfig

    return ExperimentType(
        RunConfig, runner.start, runner.resume, _federated_report, _federated_headline, _federated_comparison
    )


def _fedq() -> ExperimentType:
    from taciturn.experiments import fedq
    from taciturn.report.fedq import write_fedq_report

    return ExperimentType(
        fedq.FedQRunConfig, fedq.start, fedq.resume, write_fedq_report, fedq.headline, fedq.compare
    )


def _bandits() -> ExperimentType:
    from taciturn.experiments import bandits
    from taciturn.experiments.bandits_config import BanditsConfig
    from taciturn.report import bandits as bandits_report

    return ExperimentType(BanditsConfig, bandits.start, bandits.resume, bandits_report.write_report)


TYPES: dict[str, Callable[[], ExperimentType]] = {"federated": _federated, "fedq": _fedq, "bandits": _bandits}


def _type_of(tree: dict, source: str) -> ExperimentType:
    return TYPES[_known_type(tree, source)]()


def _known_type(tree: dict, source: str) -> str:
    name = tree.get("type", "federated")
    if name not in TYPES:
        close = difflib.get_close_matches(str(name), TYPES, n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"choose one of {', '.join(TYPES)}"
        raise ConfigError(f"invalid config {source}:\n  [type] unknown experiment type {name!r}: {hint}")
    return name


def load(path: Path | str, overrides: list[str] = ()) -> Any:
    return validate_tree(read_tree(path, overrides), str(path))


def validate_tree(tree: dict, source: str) -> Any:
    """A config tree validated against its experiment type's config."""
    return validate(tree, source, _type_of(tree, source).config)


def start(config: Any, out: Path, report: bool = True, **options: Any) -> RunDir:
    """Run ``config`` into ``out``; then write its report.html unless ``report`` is False (a sweep
    can write them later with `taciturn report`)."""
    kind = TYPES[config.type]()
    rundir = kind.start(config, out, **options)
    if report:
        kind.report(rundir)
    return rundir


def _type_of_run(rundir: RunDir) -> ExperimentType:
    return TYPES[_type_name(rundir)]()


def _type_name(rundir: RunDir) -> str:
    """The run's experiment type: a known one, or a clear error."""
    rundir.require()
    try:
        tree = tomllib.loads(rundir.config.read_text())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"{rundir.config} is not valid TOML: {error}") from None
    return _known_type(tree, str(rundir.config))


def resume(path: Path, report: bool = True, **options: Any) -> RunDir:
    kind = _type_of_run(RunDir(path))
    rundir = kind.resume(path, **options)
    if report:
        kind.report(rundir)
    return rundir


def report(rundir: RunDir) -> Path:
    with rundir.lock(), _damaged(str(rundir.path)):
        return _type_of_run(rundir).report(rundir)


@contextlib.contextmanager
def _damaged(what: str) -> Iterator[None]:
    """A report rebuilt from files that taciturn wrote fails only if they were damaged since: say so.
    (The federated report checks every field itself; this covers the other types' readers.)"""
    try:
        yield
    except TaciturnError:
        raise
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as error:
        raise RunDirError(
            f"{what}: the run's files are damaged and cannot be reported ({type(error).__name__}: {error})"
        ) from None


def compare(rundirs: list[RunDir], out: Path) -> tuple[Path, dict[str, dict]]:
    """Compare runs of one experiment type side by side."""
    check_comparison_folder(out)
    names = {str(r.path): _type_name(r) for r in rundirs}
    if len(set(names.values())) > 1:
        listed = ", ".join(f"{path} ({name})" for path, name in names.items())
        raise ConfigError(f"cannot compare runs of different experiment types: {listed}")
    kind = TYPES[next(iter(names.values()))]()
    if kind.compare is None:
        raise ConfigError(f"`taciturn compare` does not support {next(iter(names.values()))} runs yet")
    with _damaged(", ".join(str(r.path) for r in rundirs)):
        return kind.compare(rundirs, out)


def headline(rundir: RunDir) -> str:
    line = _type_of_run(rundir).headline
    return "" if line is None else line(rundir)
