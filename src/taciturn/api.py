"""The Python front door: ``taciturn.run``, ``taciturn.resume`` and ``taciturn.export``.

They do what the CLI does (the same validation, run directory, executor choice, checkpoints and
report) and take the user's own objects besides the config::

    result = taciturn.run(config, model=Net(), data=taciturn.data.from_tensors(x, y, x_test, y_test))
    result.dir, result.metrics, result.model

A config is a dict or a TOML path. Objects replace config keys: ``model=`` stands for the
[model] table (which may still set ``buffers``), ``data=`` for [data], ``loss=`` for ``loss``;
giving both is an error. The run directory records them as ``kind = "python"``, so resuming
needs them again.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from taciturn.experiments import types
from taciturn.experiments.config import ConfigError, read_tree
from taciturn.experiments.export import export as _export
from taciturn.experiments.export import load_model
from taciturn.experiments.progress import show_progress
from taciturn.experiments.user import UserObjects, check_metric_names
from taciturn.report.rundir import RunDir


@dataclass
class Result:
    """A finished (or resumed) run: its directory, its metrics rows and its trained global model."""

    dir: Path
    objects: UserObjects = field(default_factory=UserObjects, repr=False)

    @property
    def metrics(self) -> list[dict[str, Any]]:
        """The rows of metrics.jsonl, one per evaluated round (round 0 is the starting model)."""
        return RunDir(self.dir).read_metrics()

    @property
    def model(self) -> nn.Module:
        """The trained global model as an instance of the run's model class (a copy of the one given)."""
        return load_model(self.dir, self.objects.model)

    @property
    def best_model(self) -> nn.Module:
        """The best model the run kept (``[checkpoint] best = "<metric>"``), as ``model`` is the last."""
        return load_model(self.dir, self.objects.model, best=True)


def _describe(value: Any) -> str:
    kind = type(value)
    return f"{kind.__module__}.{kind.__qualname__}"


def _tree(config: Mapping[str, Any] | str | Path) -> tuple[dict, str]:
    if isinstance(config, Mapping):
        return copy.deepcopy(dict(config)), "<dict>"
    if isinstance(config, str | os.PathLike):
        return read_tree(config), str(config)
    raise ConfigError(
        f"config= must be a dict or the path of a TOML file, got {type(config).__name__}: {config!r:.60}"
    )


def _path(value: Any, name: str) -> Path | None:
    if value is None or isinstance(value, str | os.PathLike):
        return None if value is None else Path(value)
    raise ConfigError(f"{name}= must be a path (str or pathlib.Path), got {type(value).__name__}")


def _flag(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{name}= must be True or False, got {type(value).__name__}: {value!r:.60}")
    return value


def _place(tree: dict, source: str, objects: UserObjects) -> dict:
    """Record the given objects in the config tree, refusing a table that names something else."""
    for table, tag, value in (("model", "kind", objects.model), ("data", "dataset", objects.data)):
        if value is None:
            continue
        given = tree.get(table, {})
        allowed = {tag, "name", "buffers"} if table == "model" else {tag, "name"}
        if not isinstance(given, dict) or set(given) - allowed or given.get(tag, "python") != "python":
            raise ConfigError(
                f"invalid config {source}:\n  [{table}] is given twice: by {table}= and by the config; "
                f"leave the [{table}] table out when you pass {table}="
            )
        tree[table] = given | {tag: "python", "name": _describe(value)}
    if objects.loss is not None:
        if tree.get("loss", "python") != "python":
            raise ConfigError(
                f"invalid config {source}:\n  [loss] is given twice: by loss= and by the config"
            )
        tree["loss"] = "python"
    return tree


def _any(objects: UserObjects) -> bool:
    return any(v is not None for v in (objects.model, objects.data, objects.loss)) or bool(objects.metrics)


def _objects(model, data, loss, metrics) -> UserObjects:
    if model is not None and not isinstance(model, nn.Module):
        raise ConfigError(f"model= must be a torch.nn.Module, got {type(model).__name__}")
    if loss is not None and not callable(loss):
        raise ConfigError(f"loss= must be a function (outputs, targets) -> loss, got {type(loss).__name__}")
    if metrics is not None and not isinstance(metrics, Mapping):
        raise ConfigError(f"metrics= must be a dict of name -> function, got {type(metrics).__name__}")
    check_metric_names(metrics or {})
    for name, metric in (metrics or {}).items():
        if not callable(metric):
            raise ConfigError(f"metrics[{name!r}] must be a function (outputs, targets) -> values")
    return UserObjects(model, data, loss, dict(metrics or {}))


def run(
    config: Mapping[str, Any] | str | Path,
    model: nn.Module | None = None,
    data: Any = None,
    loss: Callable | None = None,
    metrics: Mapping[str, Callable] | None = None,
    out: str | Path | None = None,
    overwrite: bool = False,
    progress: bool | None = None,
    report: bool = True,
) -> Result:
    """Run a federated experiment, as ``taciturn run`` does, into ``out`` (default runs/<name>).

    ``data``: ``taciturn.data.from_tensors(...)``, a torch Dataset of (x, y) items or a Hugging Face
    dataset (a (train, test) pair, a DatasetDict, or one set of which a seeded 10% is held out).
    ``loss(outputs, targets)`` returns a batch's mean loss; ``metrics`` maps names to
    ``metric(outputs, targets)`` (per-sample values or a batch mean), reported every evaluation.
    ``progress``: a progress bar (rich) of rounds, the leading metric and bytes; by default shown in
    a terminal or a notebook, not when the output goes to a file; False silences it.
    """
    objects = _objects(model, data, loss, metrics)
    out = _path(out, "out")
    overwrite, report = _flag(overwrite, "overwrite"), _flag(report, "report")
    progress = show_progress() if progress is None else _flag(progress, "progress")
    tree, source = _tree(config)
    given = _any(objects)
    if given:
        tree = _place(tree, source, objects)
    parsed = types.validate_tree(tree, source)
    if given and parsed.type != "federated":
        raise ConfigError(f"model=, data= and loss= apply to federated runs, not to type = '{parsed.type}'")
    out = Path(out or Path("runs") / parsed.name)
    options = {"objects": objects} if given else {}
    rundir = types.start(parsed, out, report=report, overwrite=overwrite, progress=progress, **options)
    return Result(rundir.path, objects)


def resume(
    run_dir: str | Path,
    model: nn.Module | None = None,
    data: Any = None,
    loss: Callable | None = None,
    metrics: Mapping[str, Callable] | None = None,
    progress: bool | None = None,
    report: bool = True,
    trust_code: bool = False,
) -> Result:
    """Continue a run from its last checkpoint; runs given Python objects need them again. Code the
    run's config names (model.factory ...) is imported only if your taciturn wrote the folder on this
    machine, or with ``trust_code=True`` (read that code first), as Hugging Face's trust_remote_code."""
    objects = _objects(model, data, loss, metrics)
    options = {"objects": objects} if _any(objects) else {}
    path = _path(run_dir, "run_dir")
    if path is None:
        raise ConfigError("run_dir= is the run directory to resume")
    progress = show_progress() if progress is None else _flag(progress, "progress")
    report, trust_code = _flag(report, "report"), _flag(trust_code, "trust_code")
    rundir = types.resume(path, report=report, progress=progress, trust_code=trust_code, **options)
    return Result(rundir.path, objects)


def export(
    run_dir: str | Path,
    out: str | Path,
    format: str = "state_dict",
    round: int | None = None,
    model: nn.Module | None = None,
    overwrite: bool = False,
    best: bool = False,
    trust_code: bool = False,
) -> Path:
    """Write the run's global model (of its last checkpoint, of ``round``, or with ``best`` the best
    one kept): a safetensors state_dict for ``model.load_state_dict``, or a Hugging Face
    ``save_pretrained`` folder ("hf"); ``trust_code`` as for ``resume`` (only "hf" builds the model)."""
    return _export(
        run_dir,
        out,
        format,
        round,
        model,
        overwrite=_flag(overwrite, "overwrite"),
        best=_flag(best, "best"),
        trust_code=_flag(trust_code, "trust_code"),
    )
