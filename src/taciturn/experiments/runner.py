"""Build a federation from a validated config, run it round by round, checkpoint, resume.

Everything that can fail because of the config or the data (missing dataset, impossible
partition, a model that does not fit the data) fails in ``prepare``, before the first round.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from taciturn.algorithms import Algorithm, build_algorithm
from taciturn.attacks.label_flip import flip_labels
from taciturn.attacks.poisoning import pick_attackers
from taciturn.compression.link import ReferenceCopies
from taciturn.core import device
from taciturn.core.channel import Channel
from taciturn.core.device import DeviceError, resolve, use
from taciturn.core.errors import TaciturnError
from taciturn.core.ledger import Direction, Ledger
from taciturn.core.rng import SERVER, Streams
from taciturn.core.state_store import ClientStateStore
from taciturn.data.client_holdout import carve
from taciturn.data.datasets import ArrayDataset, DataError, load_dataset
from taciturn.data.federated import FederatedData
from taciturn.data.partition import partition
from taciturn.engine.analysis import Analysis, TwinState
from taciturn.engine.federation import Federation, RoundReport
from taciturn.experiments import checkpoint, limits, memory
from taciturn.experiments.best import BestModel, EarlyStop, check_columns
from taciturn.experiments.client_eval import ClientEvaluation
from taciturn.experiments.clients import ClientsSetup, on_server, simulated
from taciturn.experiments.config import ConfigError, RunConfig, load_run_config, to_toml
from taciturn.experiments.engine_setup import (
    DEPLOYED,
    ExecutorFactory,
    build_federation,
    start_ray,
)
from taciturn.experiments.export import model_record
from taciturn.experiments.local_eval import local_scores
from taciturn.experiments.progress import RoundProgress
from taciturn.experiments.tracking import Trackers, check_installed
from taciturn.experiments.user import (
    TEXT_COLUMNS,
    UserObjects,
    check_fit,
    check_metrics,
    default_metrics,
    require_objects,
    token_model,
    user_dataset,
    user_loss,
    user_model,
)
from taciturn.privacy.config import NOT_PRIVATE
from taciturn.report.divergence import divergence, row_line
from taciturn.report.rundir import RunDir, RunDirError
from taciturn.server.aggregation import ChainState
from taciturn.tasks import squared_error
from taciturn.tasks.base import ClientData, Task
from taciturn.tasks.classification import ClassificationTask
from taciturn.tasks.custom import CustomTask
from taciturn.tasks.federated_eval import SiloEvaluation
from taciturn.tasks.models import build_model

if TYPE_CHECKING:  # the optional extra 'ray'
    from taciturn.engine.ray_executor import RayWorkers

log = logging.getLogger("taciturn")


@dataclass(frozen=True)
class RoundEnd:
    """What a callback sees after each round."""

    round: int
    row: dict[str, Any] | None  # the metrics row, or None if this round was not evaluated
    report: RoundReport
    state: Any  # the server state after aggregation
    algorithm: Algorithm


RoundCallback = Callable[[RoundEnd], None]


class RunFailed(TaciturnError, RuntimeError):
    """Every client of a round raised: that is a bug (in the model, the loss or the data), not a
    client fault, so the run stops with the first client's error; it resumes from the last checkpoint
    once fixed."""


@dataclass
class Experiment:
    config: RunConfig
    rundir: RunDir
    streams: Streams
    data: ClientData  # FederatedData (classification) or TokenData (language models)
    task: Task
    algorithm: Algorithm
    ledger: Ledger
    store: ClientStateStore
    federation: Federation
    engine_note: str  # which executor and store, and why
    analysis: Analysis | None = None
    accountant: Any = None  # privacy/accountant.py Accountant when [privacy] is on
    best: BestModel | None = None  # [checkpoint] best: the best model so far, kept in best/
    stop: EarlyStop | None = None  # [stop]: early stopping
    trackers: Trackers | None = None  # [tracking]: TensorBoard, MLflow
    client_eval: ClientEvaluation | None = None  # [eval] clients: each client's own held-out split


def build_task(
    config: RunConfig,
    streams: Streams,
    objects: UserObjects | None = None,
    clients: ClientsSetup | None = None,
) -> tuple[Task, ClientData]:
    """The task (model, loss, evaluation) and the federated training data a config asks for;
    ``objects``: the model, data, loss and metrics given to ``taciturn.run`` as Python objects;
    ``clients``: per-client data as a deployment sees it (experiments/clients.py; None: read here)."""
    device = _device(config)
    if config.model.kind == "causal_lm":
        from taciturn.experiments.language import build_language_task

        return build_language_task(config, streams)
    objects = objects or UserObjects()
    require_objects(config, objects)
    if config.data.dataset == "clients":  # each client's own data: nothing to partition
        clients = clients or simulated(config)
        dataset, data = on_device(clients.probe, device), clients.data.to(device)
    else:
        dataset = _dataset(config, streams, objects)
        if dataset.num_classes == 0 and config.partition.kind not in ("iid", "natural"):
            raise ConfigError(
                f"[partition.kind] '{config.partition.kind}' splits by class, but the targets are not "
                "class labels: use partition.kind = 'iid'"
            )
        _check_partition(config, dataset)
        part_options = config.partition.model_dump(exclude={"kind", "num_clients", "column"})
        parts = partition(
            dataset.y_train.numpy(),
            config.partition.kind,
            config.partition.num_clients,
            streams.numpy(0, SERVER, "partition"),
            groups=dataset.groups,
            **part_options,
        )
        held_out = None
        if config.eval.clients:  # each client's own held-out split, out of its training data for the run
            parts, held_out = carve(parts, config.eval.client_holdout, streams)
        dataset = on_device(dataset, device)
        data = FederatedData.from_parts(dataset, parts, held_out)
    loss = user_loss(config, objects)
    squared = config.loss == "mse"
    if dataset.num_classes == 0:
        outputs = max(1, math.prod(dataset.y_train.shape[1:]))
    else:
        outputs = squared_error.num_outputs(dataset.num_classes) if squared else dataset.num_classes
    own_model = config.model.kind in ("factory", "python", "hf")  # their weights are round 0's model
    if config.model.kind == "hf":
        model = _hf_classifier(config.model.name_or_path)
    elif own_model:
        model = token_model(user_model(config, streams, objects), dataset)
    else:
        model_options = config.model.model_dump(exclude={"kind"})
        try:
            memory.check_model(
                lambda: build_model(config.model.kind, dataset.input_shape, outputs, **model_options)
            )
            model = build_model(config.model.kind, dataset.input_shape, outputs, **model_options)
        except ValueError as error:
            raise ConfigError(f"[model] {error} (data {dataset.name}: input {dataset.input_shape})") from None
    shape = check_fit(model.to(device) if not _on_meta(model) else model, dataset, loss, outputs)
    check_metrics(model, dataset, objects.metrics)
    try:
        if loss is None and not objects.metrics:
            task_class = squared_error.SquaredErrorTask if squared else ClassificationTask
            task = task_class(
                model, dataset.x_test, dataset.y_test, config.eval.batch_size, reinit=not own_model
            )
        else:
            metrics = default_metrics(dataset, shape, objects.metrics)
            task = CustomTask(
                model,
                dataset.x_test,
                dataset.y_test,
                config.eval.batch_size,
                loss or F.cross_entropy,
                metrics,
                reinit=not own_model,
            )
    except ValueError as error:  # a model taciturn cannot federate (see tasks/classification.py)
        raise ConfigError(f"[model] {error}") from None
    if clients is not None:
        task = SiloEvaluation(task, clients.evaluate, clients.note)
    return task, data


def _on_meta(model: torch.nn.Module) -> bool:
    """A model with no values (PyTorch's meta device): check_fit refuses it with a clear error."""
    return any(t.is_meta for t in (*model.parameters(), *model.buffers()))


def _device(config: RunConfig) -> torch.device:
    """The run's device (engine.device), made the one decoded messages land on; it fails before work
    when the machine does not have it."""
    spec = config.engine.device
    if config.model.kind == "causal_lm":  # the language-model task keeps its tensors on the CPU
        if spec not in ("auto", "cpu"):
            raise ConfigError(f"[engine.device] '{spec}': causal_lm runs use the CPU for now")
        spec = "cpu"
    try:
        device = resolve(spec)
    except DeviceError as error:
        raise ConfigError(f"[engine.device] {error}") from None
    use(device)
    return device


def on_device(dataset: ArrayDataset, device: torch.device) -> ArrayDataset:
    """The dataset's tensors on ``device`` (partitions are computed before, on the host)."""
    if dataset.x_train.device == device:
        return dataset
    moved = {k: getattr(dataset, k).to(device) for k in ("x_train", "y_train", "x_test", "y_test")}
    return dataclasses.replace(dataset, **moved)


def _hf_classifier(name_or_path: str) -> Any:
    from taciturn.tasks.hf import HfModelNotFound, sequence_classifier

    try:
        return sequence_classifier(name_or_path)
    except HfModelNotFound as error:
        raise ConfigError(f"[model.name_or_path] {error}") from None


def _dataset(config: RunConfig, streams: Streams, objects: UserObjects) -> ArrayDataset:
    if config.data.dataset in ("factory", "python"):
        return user_dataset(config, streams, objects)
    if config.data.dataset == "hf":
        from taciturn.data.hf import load_hf_dataset
        from taciturn.tasks.hf import HfModelNotFound

        column = config.partition.column if config.partition.kind == "natural" else None
        try:
            return load_hf_dataset(config.data, config.model, column, streams.numpy(0, SERVER, "holdout"))
        except DataError as error:
            raise ConfigError(f"[data] {error}") from None
        except HfModelNotFound as error:  # its tokenizer
            raise ConfigError(f"[model.name_or_path] {error}") from None
    options = config.data.model_dump(exclude={"dataset", "path"})
    try:
        return load_dataset(
            config.data.dataset,
            streams.numpy(0, SERVER, "data"),
            getattr(config.data, "path", None),
            **options,
        )
    except ValueError as error:  # an impossible subset (classes, train_size, test_size)
        raise ConfigError(f"[data] {error}") from None


def check_bounds(config: RunConfig) -> None:
    """What the config asks of this machine, against its cores and memory (experiments/limits.py,
    memory.py), before any work: workers, threads, iterations, classes, generated data."""
    limits.check_engine(config.engine)
    if config.aggregation.kind == "centered_clip":
        limits.check_iterations("[aggregation.iterations]", config.aggregation.iterations)
    data = config.data
    if data.dataset == "synthetic":
        limits.check_classes("[data.num_classes]", data.num_classes)
        generated = int(data.num_samples / 0.8) + 1  # with the held-out fifth (data/synthetic.py)
        # float64 draws (the class means of each sample, the noise, their sum), float32 features,
        # int64 labels, and the class means
        size = generated * (28 * data.num_features + 16) + 8 * data.num_classes * data.num_features
        memory.check_fits(f"[data] {data.num_samples:,} synthetic samples", size, "use fewer")


def _check_partition(config: RunConfig, dataset: ArrayDataset) -> None:
    """The partition keeps a (clients x classes) histogram and Dirichlet proportions: bound both."""
    limits.check_classes(f"[data] the classes of {dataset.name}", dataset.num_classes)
    clients = config.partition.num_clients or len(dataset.y_train)
    memory.check_fits(
        f"[partition] {clients:,} clients x {dataset.num_classes:,} classes",
        24 * clients * max(1, dataset.num_classes),
        "use fewer clients or classes",
    )


def use_buffers(config: RunConfig, algorithm: Algorithm, task: Task) -> None:
    """Tell the algorithm the model's buffers (BatchNorm statistics): averaged (``model.buffers =
    "federated"``) or kept by each client in its client state (``"local"``: FedBN, Li et al., ICLR
    2021); refuse what cannot federate them, before any work."""
    buffers = getattr(task, "buffers", frozenset())
    local = getattr(config.model, "buffers", "federated") == "local"
    if local and not buffers:
        raise ConfigError("[model.buffers] 'local' needs a model with buffers (BatchNorm statistics)")
    if not buffers:
        return
    if not algorithm.supports_buffers:
        raise ConfigError(
            f"[algorithm.name] '{algorithm.name}' cannot federate a model with buffers (e.g. BatchNorm "
            f"statistics: {', '.join(sorted(buffers)[:3])}); use fedavg, fedprox, scaffold, fedadmm or "
            "event_admm, or a model without them (GroupNorm or LayerNorm keep no statistics)"
        )
    if config.analysis.enabled:
        raise ConfigError("[analysis] does not handle models with buffers (BatchNorm statistics) yet")
    algorithm.use_buffers(buffers, local)


def prepare(
    config: RunConfig,
    out: Path,
    ledger: Ledger | None = None,
    objects: UserObjects | None = None,
    remote: ExecutorFactory | None = None,
) -> Experiment:
    check_bounds(config)  # before any process, thread or array is made
    ray_workers = start_ray(config, remote)  # first: Ray's start-up overlaps the data loading
    try:
        return _prepare(config, out, ledger, objects, remote, ray_workers)
    except BaseException:
        if ray_workers is not None:
            ray_workers.close()
        raise


def _prepare(
    config: RunConfig,
    out: Path,
    ledger: Ledger | None,
    objects: UserObjects | None,
    remote: ExecutorFactory | None,
    ray_workers: RayWorkers | None,
) -> Experiment:
    streams = Streams(config.seed)
    if remote is not None:
        from taciturn.deploy.settings import refuse_undeployable

        refuse_undeployable(config)  # before the nodes are asked for anything
    # a deployed server of per-client data learns the clients' sizes and shapes from the nodes
    clients = on_server(config, remote) if remote is not None and config.data.dataset == "clients" else None
    task, data = build_task(config, streams, objects, clients)
    if config.attack.active and config.attack.kind == "label_flip":
        if not isinstance(data, FederatedData):
            raise ConfigError("[attack] label_flip needs a classification dataset")
        data = flip_labels(data, pick_attackers(config.attack.fraction, data.num_clients, streams))
    algorithm = build_algorithm(config.algorithm)
    accountant = build_accountant(config, data.num_clients) if config.privacy.enabled else None
    use_buffers(config, algorithm, task)
    client_eval = _client_evaluation(config, task, data, streams)
    if (missing := check_installed(config.tracking)) is not None:
        raise ConfigError(missing)
    ledger = ledger or Ledger()
    channel = Channel(ledger, streams, config.channel.drop_up, config.channel.drop_down)
    federation, store, engine_note = build_federation(
        config,
        algorithm,
        task,
        data,
        channel,
        streams,
        out,
        remote,
        noise_multiplier=accountant and accountant.noise_multiplier,
        ray_workers=ray_workers,
    )
    analysis = (
        Analysis(config.analysis, task.model, task, data, algorithm, streams)
        if config.analysis.enabled
        else None
    )
    rundir = RunDir(out)
    return Experiment(
        config,
        rundir,
        streams,
        data,
        task,
        algorithm,
        ledger,
        store,
        federation,
        engine_note,
        analysis,
        accountant,
        client_eval=client_eval,
    )


def _client_evaluation(
    config: RunConfig, task: Task, data: ClientData, streams: Streams
) -> ClientEvaluation | None:
    """[eval] clients: the global model on sampled clients' own held-out splits (in this process, so
    with every simulated executor); deployed runs' data stays on the nodes, so they refuse it
    (deploy/settings.refuse_undeployable)."""
    if not config.eval.clients:
        return None
    assert isinstance(data, FederatedData) and isinstance(task, ClassificationTask)
    try:
        return ClientEvaluation(config.eval.clients, task, data, streams)
    except ValueError as error:
        raise ConfigError(f"[eval.client_holdout] {error}") from None


def build_accountant(config: RunConfig, num_clients: int) -> Any:
    """Client-level DP's accountant, with z given or solved for the target epsilon before any work."""
    try:
        from taciturn.privacy.accountant import Accountant, solve_noise_multiplier
    except ImportError:
        raise ConfigError("[privacy] needs dp-accounting: pip install 'taciturn[dp]'") from None
    privacy, fraction = config.privacy, config.algorithm.fraction
    per_round = config.algorithm.clients_per_round(num_clients)
    try:
        z = privacy.noise_multiplier or solve_noise_multiplier(
            privacy, num_clients, fraction, per_round, config.rounds
        )
    except ValueError as error:
        raise ConfigError(f"[privacy.target_epsilon] {error}") from None
    log.info(
        "client-level DP: noise multiplier %.4f (%s accountant, delta %g)",
        z,
        privacy.accountant,
        privacy.delta,
    )
    return Accountant(privacy, z, num_clients, fraction, per_round)


def _write_partition(exp: Experiment) -> None:
    hist = exp.data.histogram()
    if hist is None:  # a deployed server of per-client data: the labels stay on the nodes
        return
    exp.rundir.write_json(
        exp.rundir.partition,
        {
            "dataset": exp.data.dataset.name,
            "source": exp.data.dataset.source,
            "kind": exp.config.partition.kind,
            "num_clients": exp.data.num_clients,
            "num_classes": exp.data.dataset.num_classes,
            "sizes": hist.sum(axis=1).tolist(),
            "histogram": hist.tolist(),
            **_held_out_sizes(exp.data),
        },
    )


def _held_out_sizes(data: ClientData) -> dict[str, list[int]]:
    """Each client's held-out samples ([eval] clients), which its sizes above no longer count."""
    held_out = getattr(data, "held_out", None)
    if held_out is None:
        return {}
    return {"held_out": [held_out.client_size(c) for c in range(held_out.num_clients)]}


def _attach_log(rundir: RunDir) -> logging.Handler:
    handler = rundir.log_handler()
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    return handler


def start(
    config: RunConfig,
    out: Path,
    overwrite: bool = False,
    progress: bool = True,
    callbacks: tuple[RoundCallback, ...] = (),
    objects: UserObjects | None = None,
    remote: ExecutorFactory | None = None,
) -> RunDir:
    """Run a new experiment into ``out``; ``remote`` builds the executor of a deployed run
    (taciturn.deploy), whose clients train on their own machines."""
    rundir = RunDir(out)
    with rundir.lock():
        rundir.check_free(overwrite)
        exp = prepare(config, out, objects=objects, remote=remote)  # all that can fail on config or data
        params = exp.task.init_params(exp.streams.torch(0, SERVER, "init"))
        state = exp.algorithm.init_server(params, exp.data.num_clients)
        if exp.analysis is not None:
            exp.analysis.begin(params)
        counters: dict[str, Any] = {"round": 0, "wall_s": 0.0, "rejected": 0, "failed": 0, "skipped": 0}
        row = _with_analysis(exp, state, _evaluate(exp, state, counters, None))
        _watchers(exp, row)  # a column that does not exist fails before the folder is written
        rundir.reset(config, to_toml(config))
        info = {"primary_metric": exp.task.primary_metric, "engine": exp.engine_note}
        info["device"] = str(device.current())  # what engine.device = "auto" resolved to
        if exp.accountant is not None:
            info["privacy"] = privacy_record(config, exp.accountant)
        if note := getattr(exp.task, "evaluation", None):  # per-client data: where the model is evaluated
            sizes = [exp.data.client_size(c) for c in range(exp.data.num_clients)]
            info |= {"evaluation": note, "client_sizes": sizes}
        rundir.update_info(info | model_record(exp.task, exp.data))
        _write_partition(exp)
        rundir.append_jsonl(rundir.metrics, row)
        _start_trackers(exp, None)
        _watch(exp, state, row, counters)
        if exp.trackers is not None:
            exp.trackers.log(row)
        return _loop(exp, state, counters, progress, callbacks)


def resume(
    path: Path,
    progress: bool = True,
    callbacks: tuple[RoundCallback, ...] = (),
    objects: UserObjects | None = None,
    remote: ExecutorFactory | None = None,
) -> RunDir:
    """Continue a run from its last checkpoint; it ends with the numbers of an uninterrupted run.
    ``remote``: the executor of a deployed run (taciturn.deploy), as for ``start``."""
    rundir = RunDir(path).require()
    with rundir.lock():
        config = load_run_config(rundir, RunConfig)
        if remote is None and _deployed(rundir):
            raise RunDirError(
                f"{path} is a deployed run: its clients are on SuperNodes; continue it with its app "
                "folder: flwr run APP_DIR --run-config resume=true (docs/deploy.md)"
            )
        latest = rundir.latest_checkpoint()
        if latest is None:
            log.info("no checkpoint in %s: starting it again from round 0", path)
            return start(
                config,
                path,
                overwrite=True,
                progress=progress,
                callbacks=callbacks,
                objects=objects,
                remote=remote,
            )
        round, folder = latest
        rundir.truncate_to(checkpoint.verify(folder))
        ledger = rundir.read_ledger(up_to_round=round)
        exp = prepare(config, path, ledger=ledger, objects=objects, remote=remote)
        params = exp.task.init_params(exp.streams.torch(0, SERVER, "init"))
        initial = exp.algorithm.init_server(params, exp.data.num_clients)
        state, counters = checkpoint.load(folder, initial, exp.store)
        if exp.analysis is not None:
            exp.analysis.begin(params, checkpoint.load_extra(folder, "analysis", TwinState(params, None)))
        if exp.federation.aggregation is not None:
            chain = checkpoint.load_extra(folder, "server_chain", ChainState({}))
            exp.federation.aggregation.restore(chain)
        for link in (exp.federation.uplink, exp.federation.downlink):
            if link is not None:
                link.restore(
                    checkpoint.load_extra(folder, f"{link.direction}link_copies", ReferenceCopies({}))
                )
        _watchers(exp, None)
        _start_trackers(exp, round)
        executor = exp.federation.executor
        executor.checkpointed(
            {
                name: checkpoint.load_extra(folder, name, template)
                for name, template in executor.checkpoint_extras().items()
            }
        )
        return _loop(exp, state, counters, progress, callbacks)


def _deployed(rundir: RunDir) -> bool:
    """Whether the run's clients ran on SuperNodes (its engine note, engine_setup.py, written at start)."""
    engine = rundir.read_info().get("engine")
    return isinstance(engine, str) and DEPLOYED in engine


def _evaluate(
    exp: Experiment, state: Any, counters: dict[str, Any], report: RoundReport | None
) -> dict[str, Any]:
    params = exp.algorithm.global_params(state)
    try:
        scores = exp.task.evaluate(params)
        if local := exp.algorithm.local_buffers:  # FedBN: each client's own model too
            scores |= local_scores(exp.task, exp.data, exp.store, params, local)
        clients = {} if exp.client_eval is None else exp.client_eval.scores(params, counters["round"])
    except TaciturnError:
        raise
    except Exception as error:  # the user's model, loss or metric failed on the held-out data
        raise RunFailed(
            f"evaluating the global model after round {counters['round']} failed: "
            f"{type(error).__name__}: {error}"
        ) from None
    bad = [
        k
        for k, v in scores.items()
        if k not in TEXT_COLUMNS and (not isinstance(v, int | float) or isinstance(v, bool))
    ]
    if bad:
        raise RunFailed(f"evaluation gave {bad[0]} = {scores[bad[0]]!r}, not a number")
    up, down = exp.ledger.totals(Direction.UP), exp.ledger.totals(Direction.DOWN)
    return {
        "round": counters["round"],
        **scores,
        "bytes_up": up.bytes_sent,
        "bytes_down": down.bytes_sent,
        "messages_up": up.messages_sent,
        "messages_down": down.messages_sent,
        "delivered_up": up.messages_delivered,
        "delivered_down": down.messages_delivered,
        "train_loss": None if report is None else report.train_loss,
        "clients": 0 if report is None else len(report.selected),
        "rejected": counters["rejected"],
        "failed": counters["failed"],
        "skipped": counters.get("skipped", 0),
        "wall_s": round(counters["wall_s"], 3),
        **({} if report is None else report.server_info),
        **({} if exp.accountant is None else epsilon_columns(exp.config, exp.accountant, counters["round"])),
        **clients,
    }


def epsilon_columns(config: RunConfig, accountant: Any, round: int) -> dict[str, Any]:
    """``epsilon`` after ``round`` (local DP: of one participation). With reproducible noise the
    column says "not private: reproducible noise" instead, and the figure the accountant gives
    (what the mechanism would cost with secret noise) is ``nominal_epsilon``."""
    epsilon = accountant.epsilon(round)
    if config.privacy.reproducible_noise:
        return {"epsilon": NOT_PRIVATE, "nominal_epsilon": epsilon}
    return {"epsilon": epsilon}


def privacy_record(config: RunConfig, accountant: Any) -> dict[str, Any]:
    """What run.json says about a private run: the mechanism, what its epsilon means, and where
    its noise came from."""
    privacy = config.privacy
    central = privacy.mode == "central"
    return {
        "mode": privacy.mode,
        "noise": NOT_PRIVATE if privacy.reproducible_noise else "the OS CSPRNG (os.urandom)",
        "noise_multiplier": accountant.noise_multiplier,
        "clip": privacy.clip,
        "delta": privacy.delta,
        "accountant": privacy.accountant,
        "epsilon": "after each round, over the whole run"
        if central
        else "of one client's participation, against the server (no amplification by sampling)",
        "neighbours": "the client's own update, any of norm <= clip (sensitivity 2 clip)"
        if not central
        else "add/remove-one client"
        if privacy.sampling == "poisson"
        else "replace-one client (sensitivity 2 clip)",
    }


def _with_analysis(exp: Experiment, state: Any, row: dict[str, Any]) -> dict[str, Any]:
    """The row plus the analysis columns, computed outside the timed part (not the algorithm's cost)."""
    if exp.analysis is None:
        return row
    return row | exp.analysis.metrics(exp.algorithm.global_params(state))


def _watchers(exp: Experiment, row: dict[str, Any] | None) -> None:
    """The best model's keeper and early stopping, when configured. At the start, ``row`` (round 0's)
    checks that [checkpoint] best and [stop] metric name columns the rows will have (its own, the
    training loss, and FedBN's local_ scores, which appear once clients hold statistics)."""
    config = exp.config
    wanted = {"checkpoint.best": config.checkpoint.best, "stop.metric": config.stop.metric}
    try:
        if row is not None:
            primary = ("loss", exp.task.primary_metric)
            local = [f"local_{k}" for k in row if exp.algorithm.local_buffers and k in primary]
            check_columns({k: v for k, v in wanted.items() if v is not None}, [*row, "train_loss", *local])
        if config.checkpoint.best is not None:
            exp.best = BestModel(config.checkpoint.best, config.checkpoint.best_mode, exp.rundir)
        if config.stop.metric is not None:
            stop = config.stop
            exp.stop = EarlyStop(stop.metric, stop.mode, stop.patience, stop.min_delta)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def _start_trackers(exp: Experiment, resumed: int | None) -> None:
    """[tracking]'s TensorBoard and MLflow (``resumed``: the checkpoint's round a resume starts from)."""
    tracking = exp.config.tracking
    if tracking.tensorboard or tracking.mlflow:
        tree = exp.config.model_dump(mode="json", exclude_none=True)
        exp.trackers = Trackers(tracking, exp.rundir, exp.config.name, tree, resumed)


def _watch(exp: Experiment, state: Any, row: dict[str, Any], counters: dict[str, Any]) -> None:
    """Keep the best model and decide on early stopping after an evaluation (counters are checkpointed)."""
    if exp.best is not None:
        exp.best.seen(row, exp.algorithm.global_params(state), counters)
    if exp.stop is not None and (why := exp.stop.seen(row, counters)) is not None:
        counters["stopped"] = {"round": row["round"], "reason": why}
        log.info("stopping early after round %d: %s", row["round"], why)
        exp.rundir.update_info({"stopped": counters["stopped"]})


def _record_events(rundir: RunDir, report: RoundReport, private: bool) -> None:
    """``private``: events name no client (who took part is what sampling hides)."""
    for kind, items in (("rejected", report.rejected), ("failed", report.failed)):
        for client, reason in items:
            rundir.append_jsonl(
                rundir.events,
                {
                    "round": report.round,
                    "client": None if private else client,
                    "event": kind,
                    "reason": reason,
                },
            )
    if report.skipped is not None:
        rundir.append_jsonl(
            rundir.events,
            {"round": report.round, "client": None, "event": "skipped", "reason": report.skipped},
        )


def _loop(
    exp: Experiment,
    state: Any,
    counters: dict[str, Any],
    progress: bool,
    callbacks: tuple[RoundCallback, ...],
) -> RunDir:
    config, rundir = exp.config, exp.rundir
    handler = _attach_log(rundir)
    log.info(exp.engine_note)
    if config.privacy.enabled and config.privacy.reproducible_noise:
        log.warning(
            "%s: [privacy] reproducible_noise = true draws the noise from the run seed, which anyone "
            "with the config can regenerate and subtract; use it for research only",
            NOT_PRIVATE,
        )
    log.info(
        "run %s: %s on %s, rounds %d..%d",
        config.name,
        config.algorithm.name,
        getattr(exp.data, "dataset", None) and exp.data.dataset.name,
        counters["round"] + 1,
        config.rounds,
    )
    first = next(iter(rundir.read_metrics()), None)  # round 0: the loss divergence is measured against
    warned = finished = False
    try:
        with RoundProgress(
            config.rounds, counters["round"], enabled=progress, metric=exp.task.primary_metric
        ) as bar:
            for round in range(counters["round"] + 1, config.rounds + 1):
                if counters.get("stopped"):  # a resumed run that had stopped early
                    break
                started = time.perf_counter()
                started_from = state
                state, report = exp.federation.run_round(state, round)
                counters["wall_s"] += time.perf_counter() - started
                if exp.analysis is not None:
                    exp.analysis.after_round(round, started_from, report)  # not timed: not FedAvg's cost
                private = config.privacy.enabled
                rundir.append_ledger(exp.ledger, round, by_client=not private)
                _record_events(rundir, report, private)
                if report.selected and len(report.failed) == len(report.selected):
                    raise RunFailed(
                        f"every client failed in round {round}; first error: {report.failed[0][1]}"
                    )
                counters["round"] = round
                counters["rejected"] += len(report.rejected)
                counters["failed"] += len(report.failed)
                counters["skipped"] = counters.get("skipped", 0) + (report.skipped is not None)
                row = None
                if round % config.eval.every == 0 or round == config.rounds:
                    started = time.perf_counter()
                    row = _evaluate(exp, state, counters, report)  # wall_s so far, this evaluation excluded
                    counters["wall_s"] += time.perf_counter() - started
                    row = _with_analysis(exp, state, row)
                    rundir.append_jsonl(rundir.metrics, row)
                    if exp.trackers is not None:
                        exp.trackers.log(row)
                    log.info(row_line(row, exp.task.primary_metric))
                    if not warned and (why := divergence([first or row, row])):
                        log.warning(why)
                        warned = True
                    _watch(exp, state, row, counters)
                last_round = round == config.rounds or "stopped" in counters
                if round % config.checkpoint.every == 0 or last_round:
                    extras = {} if exp.analysis is None else exp.analysis.checkpoint_extras()
                    if exp.federation.aggregation is not None:
                        extras |= exp.federation.aggregation.checkpoint_extras()
                    for link in (exp.federation.uplink, exp.federation.downlink):
                        if link is not None:
                            extras |= link.checkpoint_extras()
                    executor = exp.federation.executor.checkpoint_extras()
                    checkpoint.save(
                        rundir.checkpoint_dir(round), state, exp.store, counters, extras | executor, rundir
                    )
                    exp.federation.executor.checkpointed(executor)
                    rundir.prune_checkpoints(config.checkpoint.keep)
                bar.update(round, row, exp.ledger)
                for callback in callbacks:
                    callback(RoundEnd(round, row, report, state, exp.algorithm))
                if "stopped" in counters:
                    break
        last = rundir.read_metrics()[-1:]
        log.info("finished: %s", row_line(last[0], exp.task.primary_metric) if last else "no evaluation")
        if exp.trackers is not None:  # closed before the manifest records what they wrote
            exp.trackers.close()
            exp.trackers = None
        rundir.finished()
        finished = True
    finally:
        exp.federation.executor.close()
        if exp.trackers is not None:
            exp.trackers.close(failed=not finished)
        log.removeHandler(handler)
        handler.close()
    return rundir
