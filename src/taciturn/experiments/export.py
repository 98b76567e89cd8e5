"""A run's trained global model, outside taciturn: a safetensors state_dict, or the model itself.

The global parameters are named as in the model's ``state_dict`` (no internal prefixes), so
``model.load_state_dict(safetensors.torch.load_file(path))`` accepts them for the user's own class.
Integer buffers (BatchNorm's batch counter) are not federated; run.json keeps their starting
values, and the second names of tied parameters, so that the exported state_dict is complete.
"""

from __future__ import annotations

import copy
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from taciturn.algorithms import build_algorithm
from taciturn.core.folder import as_folder
from taciturn.core.params import Params
from taciturn.core.rng import Streams
from taciturn.experiments import checkpoint, plugins
from taciturn.experiments.best import read_best
from taciturn.experiments.config import ConfigError, RunConfig, load_run_config
from taciturn.report.rundir import RunDir, RunDirError
from taciturn.tasks.hf import WRAPPED, TokenModel

FORMATS = ("state_dict", "hf")


def model_record(task: Any, data: Any) -> dict[str, Any]:
    """What run.json keeps to rebuild and export the model: its input shape and outputs, and the
    values of the buffers that are not federated."""
    model, buffers = getattr(task, "model", None), getattr(task, "buffers", None)
    if not isinstance(model, nn.Module) or buffers is None or not hasattr(data, "dataset"):
        return {}
    persistent = set(model.state_dict())
    fixed = {
        name: {"dtype": str(b.dtype).removeprefix("torch."), "value": b.tolist()}
        for name, b in model.named_buffers()
        if name not in buffers and name in persistent
    }
    dataset = data.dataset
    with torch.no_grad():
        was_training = model.training
        outputs = model.eval()(dataset.x_test[:1]).shape[1:]
        model.train(was_training)
    record = {"input_shape": list(dataset.input_shape), "outputs": list(outputs), "fixed_buffers": fixed}
    if tied := tied_names(model):
        record["tied"] = tied
    if isinstance(model, TokenModel):  # a Hugging Face model: its own names are the ones past the prefix
        record["wrapped"] = WRAPPED
    return {"model": record}


def tied_names(model: nn.Module) -> dict[str, str]:
    """{alias: name} of parameters shared under two names (a language model's output layer tied to
    its embedding): the federated parameters hold each tensor once, under ``name``, but the
    model's state_dict lists both."""
    first: dict[int, str] = {}
    tied = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            tied[name] = first[id(p)]
        else:
            first[id(p)] = name
    return tied


def _checkpoint(rundir: RunDir, round: int | None) -> tuple[int, Path]:
    done = dict(rundir.committed_checkpoints())
    if not done:
        raise RunDirError(f"{rundir.path} has no checkpoint to export")
    if round is None:
        return max(done), done[max(done)]
    if round not in done:
        raise ConfigError(f"--round {round}: {rundir.path} keeps checkpoints of rounds {sorted(done)}")
    return round, done[round]


def _federated_config(rundir: RunDir) -> RunConfig:
    config = load_run_config(rundir.require(), RunConfig)
    if config.model.kind == "causal_lm":
        raise ConfigError("[model.kind] causal_lm runs cannot be exported yet")
    return config


def state_dict(path: Path | str, round: int | None = None, best: bool = False) -> tuple[int, Params]:
    """The global model of a checkpoint (the last one by default), or the best model kept
    ([checkpoint] best), as a state_dict, and its round."""
    rundir = RunDir(path)
    config = _federated_config(rundir)
    if best:
        if round is not None:
            raise ConfigError("--best and --round name different models: give one of them")
        kept, params = read_best(rundir.path)
        round = int(kept["round"])
    else:
        round, folder = _checkpoint(rundir, round)
        algorithm = build_algorithm(config.algorithm)
        algorithm.use_streams(Streams(config.seed))
        params = algorithm.global_params(checkpoint.load_server(folder, algorithm))
    record = rundir.read_info().get("model", {})
    fixed = {
        name: torch.tensor(b["value"], dtype=getattr(torch, b["dtype"]))
        for name, b in record.get("fixed_buffers", {}).items()
    }
    weights = {k: v.detach().contiguous() for k, v in params.items()} | fixed
    for alias, name in record.get("tied", {}).items():  # a copy: safetensors stores no shared tensors
        if isinstance(alias, str) and isinstance(name, str) and name in weights:
            weights[alias] = weights[name].clone()
    if config.model.kind == "hf" or record.get("wrapped"):  # the Hugging Face model's own names
        weights = {k.removeprefix(WRAPPED): v for k, v in weights.items()}
    return round, weights


def load_model(
    path: Path | str,
    model: nn.Module | None = None,
    round: int | None = None,
    best: bool = False,
    trust_code: bool = False,
) -> nn.Module:
    """The trained global model (or the best one kept): a copy of ``model`` (the user's own, for runs
    given a Python object) with the run's weights, or the model the config builds (built-in kinds,
    model.factory: imported only if this user's taciturn wrote the run, or ``trust_code``)."""
    rundir = RunDir(path)
    config = _federated_config(rundir)
    if model is None:
        tree = config.model_dump(mode="json")
        with plugins.trusted(rundir, tree, trust_code, "export it"):
            model = build_model_of(config, rundir)
    else:
        model = copy.deepcopy(model)
    _, weights = state_dict(path, round, best)
    model.load_state_dict(weights)
    return model.eval()


def build_model_of(config: RunConfig, rundir: RunDir) -> nn.Module:
    """A fresh instance of the run's model (its weights are replaced by the caller)."""
    from taciturn.experiments.user import UserObjects, user_model
    from taciturn.tasks.models import build_model

    if config.model.kind == "python":
        raise ConfigError(
            f"[model] this run's model was a Python object ({config.model.name}): pass it as model= "
            "(taciturn.export(run_dir, path, model=...)), or export --format state_dict"
        )
    if config.model.kind == "factory":
        return user_model(config, Streams(config.seed), UserObjects())
    if config.model.kind == "hf":
        from taciturn.tasks.hf import sequence_classifier

        return sequence_classifier(config.model.name_or_path).model
    record = rundir.read_info().get("model")
    if not record:
        raise ConfigError(
            f"{rundir.path}/run.json does not record the model's shape (a run from an older taciturn)"
        )
    options = config.model.model_dump(exclude={"kind"})
    return build_model(config.model.kind, tuple(record["input_shape"]), record["outputs"][0], **options)


def _save_pretrained(model: Any, out: Path) -> None:
    """``model.save_pretrained`` into a folder of taciturn's own, then each file copied into ``out``
    through the run-folder layer: save_pretrained writes by path, which would follow a link a
    user (or whoever prepared ``out``) left inside it; the layer refuses links at every component."""
    with tempfile.TemporaryDirectory(prefix="taciturn-export-") as staging:
        model.save_pretrained(staging)
        target = as_folder(out)
        for source in sorted(Path(staging).rglob("*")):
            if source.is_file():
                with (
                    source.open("rb") as data,
                    target.open(source.relative_to(staging).as_posix(), "wb") as sink,
                ):
                    shutil.copyfileobj(data, sink)


def export(
    path: Path | str,
    out: Path | str,
    format: str = "state_dict",
    round: int | None = None,
    model: nn.Module | None = None,
    overwrite: bool = False,
    best: bool = False,
    trust_code: bool = False,
) -> Path:
    """Write the run's global model (``best``: the best one kept) to ``out``: a .safetensors
    state_dict, or (format "hf") a Hugging Face ``save_pretrained`` folder. An existing file is
    replaced only with ``overwrite``, a link never. A state_dict needs no code; the "hf" format
    builds the model, which imports a model.factory only if this user's taciturn wrote the run, or
    with ``trust_code``."""
    out = Path(out)
    if format not in FORMATS:
        raise ConfigError(f"--format {format!r}: choose one of {', '.join(FORMATS)}")
    if out.is_symlink():
        raise RunDirError(
            f"{out} is a symbolic link; taciturn does not write through links: choose another --out"
        )
    if out.exists() and not (overwrite and (out.is_file() or format == "hf")):
        raise RunDirError(f"{out} exists; choose another --out, or pass --overwrite to replace it")
    if format == "hf":
        trained = load_model(path, model, round, best, trust_code)
        if not hasattr(trained, "save_pretrained"):
            raise ConfigError(
                f"--format hf needs a Hugging Face model; this run's is a {type(trained).__name__}"
            )
        _save_pretrained(trained, out)
        return out
    from safetensors.torch import save

    _, weights = state_dict(path, round, best)
    as_folder(out.parent).write_bytes(out.name, save(weights), sync=True)
    return out
