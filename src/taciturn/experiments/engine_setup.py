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
from taciturn.compression.link import Downlink, Uplink
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
from taciturn.privacy.noise import GaussianNoise
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
    # what the vectorized executor cannot do: asked for by name it is an error, under auto it is skipped
    unvectorizable = (
        (
            getattr(task, "buffers", None),
            "trains clients under vmap, which cannot update a model's buffers (BatchNorm statistics) per "
            "client; use 'sequential', 'parallel' or 'auto'",
        ),
        (
            getattr(task, "random_layers", False),
            "trains clients under vmap, which cannot draw a model's dropout masks per client from the "
            "run's seeded streams; use 'sequential', 'parallel' or 'auto' (or dropout p = 0)",
        ),
        (
            config.algorithm.local.precision == "fp16",
            "steps every client at once, which fp16's loss scaling cannot (it skips one client's "
            "overflowing step); use precision = 'bf16', or 'sequential', 'parallel' or 'auto'",
        ),
    )
    for present, why in unvectorizable:
        if present:
            if engine.executor.endswith("vectorized"):
                raise ConfigError(f"[engine.executor] '{engine.executor}' {why}")
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
    if engine.executor == "auto" and (feedback := in_process_links(config)):
        in_process = "vectorized" if weighted else "sequential"
        return choice.Choice(
            in_process, 0, f"[compression] {feedback} keeps each client's copy in this process"
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
        why = "this task has no vectorized path"
        if getattr(task, "buffers", None):
            why = "the model's buffers rule out a vectorized path"
        elif getattr(task, "random_layers", False):
            why = "the model's dropout rules out a vectorized path"
        elif config.algorithm.local.precision == "fp16":
            why = "fp16's per-client loss scaling rules out a vectorized path"
        return choice.Choice("sequential", 0, f"{why} and its steps use all threads")
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


def store_kind(config: RunConfig, algorithm: Algorithm, picked: choice.Choice, num_clients: int) -> str:
    """ "disk" or "memory": where the client states will live."""
    wanted = config.engine.store
    if wanted == "auto":
        stateful = algorithm.keeps_client_state
        parallel = picked.executor.startswith("parallel") or picked.challenger is not None
        wanted = "disk" if stateful and (parallel or num_clients >= DISK_STORE_CLIENTS) else "memory"
    return wanted


def build_store(
    config: RunConfig, algorithm: Algorithm, picked: choice.Choice, out: Path, num_clients: int
) -> ClientStateStore:
    wanted = store_kind(config, algorithm, picked, num_clients)
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
    uplink, downlink = links(config, algorithm, streams)
    picked = None if remote is not None else choose_executor(config, algorithm, task, data)
    if picked is not None and (feedback := in_process_links(config)):
        on_disk = store_kind(config, algorithm, picked, data.num_clients) == "disk"
        if on_disk or picked.executor not in ("sequential", "vectorized") or picked.challenger:
            raise ConfigError(
                f"[compression] {feedback} keeps a copy of each client's reference on the server, in this "
                "process, and the client's in a store whose layout may grow with its first message: use "
                "engine.executor = 'sequential' or 'vectorized' with engine.store = 'memory' (or 'auto')"
            )
    chain, local_dp = server_chain(config, data, noise_multiplier), None
    privacy = config.privacy
    if privacy.enabled and privacy.mode == "local":
        assert noise_multiplier is not None and algorithm.delta_prefix is not None
        noise = GaussianNoise(privacy.reproducible_noise)
        local_dp = LocalGaussian(noise_multiplier, privacy.clip, algorithm.delta_prefix, streams, noise)
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
        private=privacy.enabled,
        uplink=uplink,
        downlink=downlink,
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
    aggregation = None
    if chain is not None:
        central = privacy.enabled and privacy.mode == "central"
        expected = dp_expected_clients(config, data) if central else None
        aggregation = ServerAggregation(chain, algorithm, streams, expected)
    poisson = config.algorithm.fraction if privacy.enabled and privacy.sampling == "poisson" else None
    federation = Federation(algorithm, executor, streams, data, aggregation, poisson, uplink, downlink)
    return federation, store, note


def in_process_links(config: RunConfig) -> str:
    """The feedback settings whose per-client copies need an in-process executor ('' if none)."""
    compression = config.compression
    wanted = [f"up_feedback = '{compression.up_feedback}'"] if compression.up_feedback == "ef21" else []
    wanted += (
        [f"down_feedback = '{compression.down_feedback}'"] if compression.down_feedback == "ef21p" else []
    )
    return " and ".join(wanted)


def links(config: RunConfig, algorithm: Algorithm, streams: Streams) -> tuple[Uplink | None, Downlink | None]:
    """Each link's compression ([compression]; deployed runs refuse it: refuse_undeployable in
    deploy/settings.py); a link that keeps client state (error memory, a reference) makes the
    clients stateful, so the executors store it."""
    compression = config.compression
    up, down = compression.transform("up"), compression.transform("down")
    uplink = None if up is None else Uplink(up, streams)
    downlink = None if down is None else Downlink(down, streams)
    if any(link is not None and link.stateful for link in (uplink, downlink)):
        algorithm.keeps_client_state = True
    return uplink, downlink


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
        noise = GaussianNoise(privacy.reproducible_noise)
        return Chain(
            [
                NormBound(privacy.clip, count=False),  # the exact clipped count is no DP release
                GaussianSum(noise_multiplier, privacy.clip, dp_expected_clients(config, data), noise),
            ]
        )
    if not config.aggregation.per_client:
        return None
    if problem := config.aggregation.problem(config.algorithm.clients_per_round(data.num_clients)):
        raise ConfigError(f"[aggregation] {problem}")
    return build_chain(config.aggregation)


def dp_expected_clients(config: RunConfig, data: ClientData) -> float:
    """q N: the clients a central-DP round expects, its release's fixed denominator."""
    per_round = config.algorithm.clients_per_round(data.num_clients)
    return expected_clients(config.privacy.sampling, config.algorithm.fraction, data.num_clients, per_round)


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
