"""The user's own model, data and loss: given as Python objects or named by import path in the config.

``taciturn.run(config, model=..., data=..., loss=..., metrics=...)`` hands objects over (the
config records ``kind = "python"``, and resuming needs them again); a config's ``model.factory``,
``data.factory`` and ``loss = "pkg.mod:fn"`` name them, so CLI runs and resumes need no Python.
Everything is checked here, before the first round: the model must accept the data and give
outputs the loss can read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from taciturn.core.rng import SERVER, Streams
from taciturn.data.datasets import ArrayDataset, DataError
from taciturn.data.user import as_dataset
from taciturn.experiments.config import BUILTIN_LOSSES, ConfigError, RunConfig
from taciturn.experiments.plugins import load_callable

# The columns taciturn itself writes in a metrics row (runner.py ``_evaluate``, the server chain's
# numbers, [analysis]): a user metric of one of these names would silently replace one of them in
# every row (a metric named "round" once replaced the round column). "accuracy" may be redefined.
RESERVED_COLUMNS = frozenset(
    {
        *("round", "loss", "train_loss", "clients", "rejected", "failed", "skipped", "wall_s"),
        *("bytes_up", "bytes_down", "messages_up", "messages_down", "delivered_up", "delivered_down"),
        *("epsilon", "nominal_epsilon", "clip_norm", "clipped", "divergence", "weight_change"),
        *("ntk_change", "eval_clients", "eval_samples", "eval_on"),
        *("linearization_rmse", "centralized_output_rmse", "centralized_param_rmse"),
        *("centralized_loss", "centralized_accuracy", "centralized_train_loss"),
    }
)
# The one text column: where a run on per-client data evaluated (tasks/federated_eval.py)
TEXT_COLUMNS = frozenset({"eval_on"})
# FedBN's own-model scores, the centralized twin, client-side evaluation ([eval] clients)
RESERVED_PREFIXES = ("local_", "centralized_", "client_")


def check_metric_names(names: Iterable[Any]) -> None:
    """User metric names: non-empty strings that are not one of taciturn's own columns."""
    for name in names:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"metrics= names must be non-empty strings, got {name!r}")
        if name in RESERVED_COLUMNS or name.startswith(RESERVED_PREFIXES):
            raise ConfigError(
                f"metrics[{name!r}]: {name!r} is a column taciturn writes itself in metrics.jsonl; "
                f"give your metric another name (e.g. 'my_{name}')"
            )


@dataclass(frozen=True)
class UserObjects:
    """What ``taciturn.run`` was given besides the config."""

    model: nn.Module | None = None
    data: Any = None
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    metrics: Mapping[str, Callable[[torch.Tensor, torch.Tensor], Any]] = field(default_factory=dict)


def require_objects(config: RunConfig, objects: UserObjects) -> None:
    """Every object the config says was given in Python (``kind = "python"``) must be given again."""
    wanted = {
        "model": config.model.kind == "python" and objects.model is None,
        "data": config.data.dataset == "python" and objects.data is None,
        "loss": config.loss == "python" and objects.loss is None,
    }
    missing = [name for name, lacking in wanted.items() if lacking]
    if missing:
        one = len(missing) == 1
        raise ConfigError(
            f"[{missing[0]}] this run's {' and '.join(missing)} "
            f"{'was a Python object' if one else 'were Python objects'}; pass {'it' if one else 'them'} "
            f"again: taciturn.resume(run_dir, {', '.join(f'{m}=...' for m in missing)})"
        )


def _call(factory: Callable, kwargs: Mapping[str, Any], key: str, path: str) -> Any:
    try:
        return factory(**kwargs)
    except Exception as error:
        raise ConfigError(
            f"[{key}] {path}(**{dict(kwargs)}) raised {type(error).__name__}: {error}"
        ) from None


def user_dataset(config: RunConfig, streams: Streams, objects: UserObjects) -> ArrayDataset:
    data = config.data
    if data.dataset == "python":
        raw = objects.data
    else:
        raw = _call(load_callable(data.factory, "data.factory"), data.kwargs, "data.factory", data.factory)
    try:
        return as_dataset(raw, streams.numpy(0, SERVER, "holdout"))
    except DataError as error:
        raise ConfigError(f"[data] {error}") from None


def user_model(config: RunConfig, streams: Streams, objects: UserObjects) -> nn.Module:
    """The user's module; a factory runs with the global RNG seeded from the run's stream, so the
    same seed builds the same starting weights."""
    spec = config.model
    if spec.kind == "python":
        return objects.model
    factory = load_callable(spec.factory, "model.factory")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(streams.seed_for(0, SERVER, "model.factory"))
        model = _call(factory, spec.kwargs, "model.factory", spec.factory)
    if not isinstance(model, nn.Module):
        raise ConfigError(
            f"[model.factory] {spec.factory} returned a {type(model).__name__}, not an nn.Module"
        )
    return model


def token_model(model: nn.Module, dataset: ArrayDataset) -> nn.Module:
    """A Hugging Face model (a ``PreTrainedModel`` object) wrapped to read token ids and return its
    logits as the other models do (tasks/hf.py); any other module as it is."""
    from taciturn.tasks.hf import is_hf_model
    from taciturn.tasks.hf import token_model as wrap

    if not is_hf_model(model):
        return model
    if dataset.x_train.is_floating_point():
        raise ConfigError(
            f"[data] {type(model).__name__} reads token ids, but the inputs are {dataset.x_train.dtype}: "
            "give integer tensors (the tokenizer's input_ids, int64)"
        )
    return wrap(model)


def user_loss(config: RunConfig, objects: UserObjects) -> Callable | None:
    """The loss function the config or the caller names; None for the built-in ones."""
    if config.loss in BUILTIN_LOSSES:
        return None
    if config.loss == "python":
        return objects.loss
    return load_callable(config.loss, "loss")


def check_fit(
    model: nn.Module, dataset: ArrayDataset, loss: Callable | None, outputs_needed: int
) -> tuple[int, ...]:
    """One forward pass on two samples (and the loss on it), so a mismatch fails before round 1;
    returns the shape of one sample's outputs."""
    meta = [name for name, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
    if meta:
        raise ConfigError(
            f"[model] {meta[0]} (and {len(meta) - 1} more) is on PyTorch's meta device, which holds no "
            "values: build the model on a real device, or call model.to_empty(device='cpu') and "
            "initialise its weights"
        )
    was_training = model.training
    model.eval()
    x, y = dataset.x_train[:2], dataset.y_train[:2]
    try:
        with torch.no_grad():
            out = model(x)
    except Exception as error:
        raise ConfigError(
            f"[model] the model fails on the data (inputs {tuple(x.shape[1:])}): "
            f"{type(error).__name__}: {error}"
        ) from None
    finally:
        model.train(was_training)
    if not isinstance(out, torch.Tensor):
        raise ConfigError(
            f"[model] the model must return a tensor of outputs, it returned {type(out).__name__}"
        )
    if not out.is_floating_point() or out.shape[:1] != x.shape[:1]:
        raise ConfigError(
            f"[model] the model must return floating-point outputs, one row per sample; for "
            f"{len(x)} samples it returned {out.dtype} of shape {tuple(out.shape)} (a loss needs gradients)"
        )
    if loss is None:
        if dataset.num_classes == 0:
            raise ConfigError(
                "[loss] the targets are not class labels (floating point, or several per sample): give "
                "a loss, e.g. "
                "loss=torch.nn.functional.mse_loss or loss = 'package.module:callable'"
            )
        if out.ndim != 2 or out.shape[1] < outputs_needed:
            raise ConfigError(
                f"[model] outputs of shape {tuple(out.shape[1:])} for {dataset.num_classes} classes: "
                f"the model needs {outputs_needed} outputs per sample"
            )
        return tuple(out.shape[1:])
    try:
        value = loss(out, y)
    except Exception as error:
        raise ConfigError(
            f"[loss] the loss fails on the model's outputs: {type(error).__name__}: {error}"
        ) from None
    if not isinstance(value, torch.Tensor) or value.ndim != 0:
        raise ConfigError("[loss] the loss must return a scalar tensor (the batch mean)")
    return tuple(out.shape[1:])


def check_metrics(model: nn.Module, dataset: ArrayDataset, metrics: Mapping[str, Callable]) -> None:
    """Each metric on the model's outputs for two samples gives numbers: per-sample values or a
    batch mean (a metric returning a string failed only at the first evaluation)."""
    if not metrics:
        return
    x, y = dataset.x_train[:2], dataset.y_train[:2]
    with torch.no_grad():
        out = model(x)
    for name, metric in metrics.items():
        try:
            result = metric(out, y)
        except Exception as error:
            raise ConfigError(
                f"[metrics] {name!r} fails on the model's outputs: {type(error).__name__}: {error}"
            ) from None
        try:
            value = torch.as_tensor(result)
        except (TypeError, ValueError, RuntimeError):
            value = None
        if value is None or value.is_complex() or value.numel() not in (1, len(y)):
            shown = type(result).__name__ if value is None else f"{value.dtype} of shape {tuple(value.shape)}"
            raise ConfigError(
                f"[metrics] {name!r} must return a number or one number per sample; for {len(y)} samples "
                f"it returned {shown}"
            )


def default_metrics(
    dataset: ArrayDataset, outputs: tuple[int, ...], metrics: Mapping[str, Callable]
) -> dict[str, Callable]:
    """Classification (class labels, a score per class) keeps its accuracy after the user's metrics,
    the first of which leads the report."""
    from taciturn.tasks.custom import accuracy

    check_metric_names(metrics)
    scores = dataset.num_classes and len(outputs) == 1 and outputs[0] >= dataset.num_classes
    return dict(metrics) | ({"accuracy": accuracy} if scores and "accuracy" not in metrics else {})
