"""Turn the config's [engine] table into an executor and a client-state store, saying why."""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from taciturn.algorithms.base import Algorithm
from taciturn.attacks.poisoning import ModelPoisoning, pick_attackers
from taciturn.core import device
from taciturn.core.channel import Channel
from taciturn.core.disk_store import DiskStateStore
from taciturn.core.rng import Streams
from taciturn.core.state_store import ClientStateStore, MemoryStateStore
from taciturn.engine import choice, lowrank, mlp_steps
from taciturn.engine.executor import Executor, SequentialExecutor
from taciturn.engine.federation import Federation
from taciturn.engine.parallel import ParallelExecutor
from taciturn.engine.pipeline import ClientPipeline
from taciturn.engine.trial import TrialExecutor
from taciturn.engine.vectorized import VectorizedExecutor
from taciturn.experiments.config import ConfigError, RunConfig
from taciturn.privacy.gaussian import GaussianSum, LocalGaussian, expected_clients
from taciturn.report.rundir import RunDir
from taciturn.secagg.quantize import levels
from taciturn.server.aggregation import ServerAggregation, build_chain
from taciturn.server.clipping import NormBound
from taciturn.server.transform import Chain
from taciturn.tasks.base import ClientData, Task

if TYPE_CHECKING:  # the optional extras 'secagg' and 'ray'
    from taciturn.engine.ray_executor import RayWorkers
    from taciturn.secagg.protocol import SecureSum

DISK_STORE_CLIENTS = 1000  # with more stateful clients than this, "auto" keeps their state on disk

# Builds the executor for a run whose clients live elsewhere (taciturn.deploy: Flower's SuperNodes).
ExecutorFactory = Callable[[ClientPipeline], Executor]
DEPLOYED = "(deployed)"  # in the engine note of a run whose clients are on SuperNodes (runner.resume)


def choose_executor(config: RunConfig, algorithm: Algorithm, task: Task, data: ClientData) -> choice.Choice:
    engine = config.engine
    weighted = getattr(task, "weighted_batches", False)
    if getattr(task, "buffers", None):
        if engine.executor.endswith("vectorized"):
            raise ConfigError(
                f"[engine.executor] '{engine.executor}' trains clients under vmap, which cannot update "
                "a model's buffers (BatchNorm statistics) per client; use 'sequential', 'parallel' or 'auto'"
            )
        weighted = False  # auto: no vectorized path
    if engine.executor.endswith("vectorized") and not weighted:
        raise ConfigError(
            f"[engine.executor] '{engine.executor}' needs a task whose loss takes sample weights"
        )
    on = device.current()
    if on.type != "cpu":  # worker processes cannot share a GPU context; in-process executors use the device
        if engine.executor.startswith("parallel"):
            raise ConfigError(
                f"[engine.executor] '{engine.executor}' runs CPU worker processes; on {on} use "
                "'vectorized', 'sequential' or 'auto'"
            )
        if engine.executor == "auto":
            picked = "vectorized" if weighted and not config.analysis.enabled else "sequential"
            return choice.Choice(
                picked, 0, f"on {on}: clients in this process, vectorized where the task allows"
            )
    if engine.executor == "auto" and config.analysis.enabled:
        return choice.Choice("sequential", 0, "[analysis] reads every client's trained model")
    if engine.executor == "auto" and config.secagg.enabled:
        return choice.Choice(
            "sequential", 0, "secure aggregation runs among a round's clients in one process"
        )
    if engine.executor == "auto" and config.attack.colluding:
        return choice.Choice("sequential", 0, "the simulated attackers read every honest update")
    if engine.executor == "ray":
        return choice.Choice("ray", engine.workers, "set in the config")
    if engine.executor != "auto":
        workers = engine.workers or choice.available_cores()
        return choice.Choice(
            engine.executor, workers if engine.executor.startswith("parallel") else 0, "set in the config"
        )
    if not weighted:  # e.g. a language model: one client at a time keeps every thread on its large products
        why = "the model's buffers rule out" if getattr(task, "buffers", None) else "this task has no"
        return choice.Choice("sequential", 0, f"{why} a vectorized path and its steps use all threads")
    local = config.algorithm.local
    clients = config.algorithm.clients_per_round(data.num_clients)
    mean_size = data.num_samples / data.num_clients
    steps = local.steps or local.epochs * math.ceil(mean_size / local.batch_size)
    first = data.client_indices(
        int(np.argmax([data.client_size(c) for c in range(min(data.num_clients, 50))]))
    )
    batch = data.batch(first[: local.batch_size])
    mlp_algebra = None
    if lowrank.applies(algorithm, task):
        pays = lowrank.pays(task, lowrank.local_samples(local, mean_size))
        mlp_algebra = "low-rank" if pays else "fused"
    elif mlp_steps.applies(algorithm, task):
        mlp_algebra = "fused"
    picked = choice.choose(task, batch, clients, steps, vectorized=weighted, mlp_algebra=mlp_algebra)
    if engine.workers and picked.executor.startswith("parallel"):
        picked = choice.Choice(picked.executor, engine.workers, picked.reason)
    return picked.tried(config.rounds)


def build_store(
    config: RunConfig, algorithm: Algorithm, picked: choice.Choice, out: Path, num_clients: int
) -> ClientStateStore:
    wanted = config.engine.store
    if wanted == "auto":
        stateful = algorithm.keeps_client_state
        parallel = picked.executor.startswith("parallel") or picked.challenger is not None
        wanted = "disk" if stateful and (parallel or num_clients >= DISK_STORE_CLIENTS) else "memory"
    path = Path(out) / "client_state.bin" if wanted == "disk" else None
    rundir, folder = RunDir(out), None
    if path is not None and rundir.held():  # the run's manifest lists the store's files first
        rundir.claim(path.name, path.with_suffix(".layout.json").name)
        folder = rundir.fs
    if picked.executor == "ray" and algorithm.keeps_client_state:
        from taciturn.engine.ray_state import RayStateStore

        return RayStateStore(None if path is None else path.resolve(), num_clients)
    return MemoryStateStore() if path is None else DiskStateStore(path, num_clients, folder)


def build_federation(
    config: RunConfig,
    algorithm: Algorithm,
    task: Task,
    data: ClientData,
    channel: Channel,
    streams: Streams,
    out: Path,
    remote: ExecutorFactory | None = None,
    noise_multiplier: float | None = None,
    ray_workers: RayWorkers | None = None,
) -> tuple[Federation, ClientStateStore, str]:
    """``noise_multiplier``: z of client-level DP, solved before work when [privacy] is on;
    ``ray_workers``: the actors ``start_ray`` started, for engine.executor = "ray"."""
    if config.engine.threads:
        torch.set_num_threads(config.engine.threads)
    picked = None if remote is not None else choose_executor(config, algorithm, task, data)
    chain, local_dp = server_chain(config, data, noise_multiplier), None
    privacy = config.privacy
    if privacy.enabled and privacy.mode == "local":
        assert noise_multiplier is not None and algorithm.delta_prefix is not None
        local_dp = LocalGaussian(noise_multiplier, privacy.clip, algorithm.delta_prefix, streams)
    poisoning = None
    if config.attack.active and config.attack.kind != "label_flip":
        attackers = pick_attackers(config.attack.fraction, data.num_clients, streams)
        poisoning = ModelPoisoning(config.attack, attackers, streams)
    # a deployed run's clients keep their state on their own nodes (deploy/node_state.py)
    store = (
        MemoryStateStore()
        if picked is None
        else build_store(config, algorithm, picked, out, data.num_clients)
    )
    pipeline = ClientPipeline(
        algorithm,
        channel,
        store,
        streams,
        data,
        task.loss,
        keep_arrivals=config.analysis.divergence,
        trust=config.server,
        buffers=getattr(task, "buffers", frozenset()),
        per_client=chain is not None,
        poisoning=poisoning,
        local_dp=local_dp,
        secure_sum=secure_sum(config, data, streams, simulated=remote is None),
    )
    if picked is None:
        executor = remote(pipeline)
        note = f"executor: {executor.name} {DEPLOYED}; client state: on each node's disk"
    else:
        executor = build_executor(picked.executor, picked.workers, pipeline, ray_workers)
        if picked.challenger is not None:
            challenger = build_executor(picked.challenger, picked.workers, pipeline)
            executor = TrialExecutor(executor, challenger, _work(config, data))
        named = f"{picked.executor} or {picked.challenger}" if picked.challenger else picked.executor
        workers = f" with {picked.workers} workers" if picked.workers else ""
        note = f"executor: {named}{workers} ({picked.reason}); client state: {type(store).__name__}"
    aggregation = None if chain is None else ServerAggregation(chain, algorithm, streams)
    poisson = config.algorithm.fraction if privacy.enabled and privacy.sampling == "poisson" else None
    return Federation(algorithm, executor, streams, data, aggregation, poisson), store, note


def secure_sum(
    config: RunConfig, data: ClientData, streams: Streams, simulated: bool = True
) -> SecureSum | None:
    """The simulated protocol (secagg/protocol.py); None when off or deployed, where the round runs
    Flower's SecAgg+ (deploy/secagg.py) with the same ring check."""
    if not config.secagg.enabled:
        return None
    try:
        levels(config.algorithm.clients_per_round(data.num_clients), config.secagg.bits)
    except ValueError as error:
        raise ConfigError(f"[secagg.bits] {error}") from None
    if not simulated:
        return None
    try:
        from taciturn.secagg.protocol import SecureSum
    except ImportError:
        raise ConfigError(
            "[secagg] needs cryptography and pycryptodome: pip install 'taciturn[secagg]'"
        ) from None
    return SecureSum(config.secagg, streams)


def server_chain(config: RunConfig, data: ClientData, noise_multiplier: float | None) -> Chain | None:
    """The server's chain: central DP's clip and noisy sum, or [aggregation]'s; None for the plain
    mean, which the algorithm's own partial sums compute."""
    privacy = config.privacy
    if privacy.enabled and privacy.mode == "central":
        assert noise_multiplier is not None
        per_round = config.algorithm.clients_per_round(data.num_clients)
        expected = expected_clients(privacy.sampling, config.algorithm.fraction, data.num_clients, per_round)
        return Chain([NormBound(privacy.clip), GaussianSum(noise_multiplier, privacy.clip, expected)])
    return build_chain(config.aggregation) if config.aggregation.per_client else None


def build_executor(
    name: str, workers: int, pipeline: ClientPipeline, ray_workers: RayWorkers | None = None
) -> Executor:
    if name.startswith("parallel"):
        try:
            return ParallelExecutor(pipeline, workers, vectorized=name.endswith("vectorized"))
        except ValueError as error:
            raise ConfigError(f"[engine] {error}") from None
    if name == "ray":
        from taciturn.engine.ray_executor import RayExecutor

        assert ray_workers is not None, "start_ray starts the actors of a Ray run"
        return RayExecutor(pipeline, ray_workers)
    if name == "vectorized":
        return VectorizedExecutor(pipeline)
    return SequentialExecutor(pipeline)


def _work(config: RunConfig, data: ClientData):
    """A round's local work, so the trial compares rounds of different sizes: samples visited
    (epochs of each client's data) or steps taken (a fixed number per client)."""
    local = config.algorithm.local
    if local.steps:
        return lambda clients: float(local.steps * len(clients))
    return lambda clients: float(local.epochs * sum(data.client_size(c) for c in clients))


def start_ray(config: RunConfig, remote: ExecutorFactory | None = None) -> RayWorkers | None:
    """For engine.executor = "ray" (not deployed): join or start Ray and create the worker actors
    now, before the data is loaded, so that their start-up (each imports torch) overlaps this
    process's data loading, model set-up and round-0 evaluation; the client pipeline reaches them
    at the first round (engine/ray_executor.py). None for any other executor."""
    if remote is not None or config.engine.executor != "ray":
        return None
    if importlib.util.find_spec("ray") is None:
        raise ConfigError(
            "engine.executor = 'ray' needs Ray, which is not installed: pip install 'taciturn[ray]'"
        )
    from taciturn.engine.ray_executor import RayWorkers, connect

    engine, address = config.engine, config.engine.ray_address
    try:
        connected = connect(address)
    except ConnectionError as error:
        raise ConfigError(f"[engine] cannot reach the Ray cluster at {address!r}: {error}") from None
    try:
        return RayWorkers(engine.workers, engine.ray_cpus_per_worker, engine.ray_gpus_per_worker, connected)
    except BaseException:
        if connected:
            import ray

            ray.shutdown()
        raise
