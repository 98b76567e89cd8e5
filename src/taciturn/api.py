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
from taciturn.experiments.user import UserObjects
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
    return read_tree(config), str(config)


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
    tree, source = _tree(config)
    given = _any(objects)
    if given:
        tree = _place(tree, source, objects)
    parsed = types.validate_tree(tree, source)
    if given and parsed.type != "federated":
        raise ConfigError(f"model=, data= and loss= apply to federated runs, not to type = '{parsed.type}'")
    out = Path(out or Path("runs") / parsed.name)
    options = {"objects": objects} if given else {}
    progress = show_progress() if progress is None else progress
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
) -> Result:
    """Continue a run from its last checkpoint; runs given Python objects need them again."""
    objects = _objects(model, data, loss, metrics)
    options = {"objects": objects} if _any(objects) else {}
    progress = show_progress() if progress is None else progress
    rundir = types.resume(Path(run_dir), report=report, progress=progress, **options)
    return Result(rundir.path, objects)


def export(
    run_dir: str | Path,
    out: str | Path,
    format: str = "state_dict",
    round: int | None = None,
    model: nn.Module | None = None,
    overwrite: bool = False,
    best: bool = False,
) -> Path:
    """Write the run's global model (of its last checkpoint, of ``round``, or with ``best`` the best
    one kept): a safetensors state_dict for ``model.load_state_dict``, or a Hugging Face
    ``save_pretrained`` folder ("hf")."""
    return _export(run_dir, out, format, round, model, overwrite, best)
