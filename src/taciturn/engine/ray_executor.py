"""The Ray executor: a round's clients spread over long-lived actors on a Ray cluster.

It keeps the parallel executor's contract (engine/parallel.py), so an algorithm cannot tell them
apart: one actor per worker slot, kept for the run; each round every actor trains a share of the
clients (balanced by data size, ``parallel.balance``) with the same client pipeline as the
sequential executor and reduces in place with ``algorithm.accumulate``; the driver merges one
partial per actor with ``combine``.

Start-up is Ray's fixed cost (its processes, then each actor's ``import torch``), so it is
overlapped with the driver's own: the actors (``RayWorkers``) are created as soon as Ray is up,
before the driver loads the data, and a Ray started here has its prestarted worker processes
import this module while ``ray.init`` still waits for its other processes (``connect``). The
client pipeline reaches the actors at the first round, so they get what init_server told the
algorithm (as the parallel executor forks then). What Ray moves:

* the client pipeline (data, task, algorithm), once, through the object store at the first round,
  so client data reaches a node once per run, not once per round; the training data goes as numpy
  arrays (``_shared``), which every actor of a node reads zero-copy from one shared copy;
* each distinct downlink message (the broadcast), encoded once and put into the object store once
  per round, whatever the number of actors or clients;
* per actor per round, one JSON header and codec blobs back (engine/wire.py): no update is pickled.

Client state lives with a keeper actor on the driver's node (engine/ray_state.py): workers stage
the new states there before returning their part, and the Federation's ``commit`` makes them take
effect under the acceptance rule (engine/pipeline.py).

Faults: when an actor dies mid-round (its process or its node), Ray raises ``RayActorError`` for its
call; its clients are run again on the surviving actors in the same round. Every random draw comes
from the run's seeded streams and nothing of the dead actor's work was committed, so the round
ends with the numbers it would have had. The dead actor is not replaced; when none is left, or the
state keeper died, the run stops with ``ClusterLost`` and ``taciturn resume`` continues from the
last checkpoint.

Partial sums are added in another order than the sequential executor's, so results agree with it
up to floating-point rounding (tests/test_ray_executor.py states the tolerance).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import time
import traceback
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import ray
import torch

from taciturn.core.channel import Channel
from taciturn.core.codec import decode, encode
from taciturn.core.ledger import Direction, Ledger
from taciturn.core.message import Message
from taciturn.core.state_store import MemoryStateStore, decode_states, encode_states
from taciturn.data.datasets import ArrayDataset
from taciturn.engine.executor import Executor, LoopTrainer
from taciturn.engine.parallel import WorkerFailed, balance
from taciturn.engine.pipeline import ClientPipeline, RoundPart, merge
from taciturn.engine.ray_state import ClusterLost, RayStateStore, ask
from taciturn.engine.wire import decode_part, decode_spec, encode_part, encode_spec

log = logging.getLogger(__name__)


# Ray's experimental RAY_preload_python_modules (ray-project/ray#33572): the Python workers a raylet
# prestarts (one per CPU, when it starts) import these modules before taking work, so the actors
# that then take those processes skip the import. It only imports; a worker that cannot import it
# logs that, and the actor imports the module when it is created, as without it.
PRELOAD = {"RAY_preload_python_modules": __name__}


def connect(address: str | None) -> bool:
    """Join the cluster at ``address`` ("auto": the one on this machine), or start a local Ray when
    None; a process already connected keeps its connection. True when this call connected."""
    if ray.is_initialized():
        return False
    saved = {name: os.environ.get(name) for name in PRELOAD}
    if address is None:  # the raylet started here inherits this process's environment
        os.environ.update(PRELOAD)
    try:
        ray.init(address=address, include_dashboard=False, logging_level=logging.WARNING)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return True


class RayWorkers:
    """The run's worker actors, created as soon as Ray is up (engine_setup.start_ray, before the
    data is loaded): each takes a worker process and imports torch and taciturn there while the
    driver loads the data, builds the model and evaluates round 0. ``count`` 0: as many as the
    cluster's CPUs (and GPUs) allow. ``connected``: this run joined Ray, so closing leaves it."""

    def __init__(self, count: int, cpus: float, gpus: float, connected: bool):
        self.cpus, self.gpus, self.connected = cpus, gpus, connected
        threads = max(1, int(cpus))
        self.actors = [
            Worker.options(num_cpus=cpus, num_gpus=gpus).remote(threads)
            for _ in range(count or self._slots())
        ]

    def _slots(self) -> int:
        resources = ray.cluster_resources()
        slots = int(resources.get("CPU", 0) // self.cpus)
        if self.gpus:
            slots = min(slots, int(resources.get("GPU", 0) // self.gpus))
        if slots < 1:
            raise ClusterLost(
                f"the Ray cluster ({resources.get('CPU', 0)} CPUs, {resources.get('GPU', 0)} GPUs) has no "
                f"room for one worker of {self.cpus} CPUs and {self.gpus} GPUs "
                "(engine.ray_cpus_per_worker, engine.ray_gpus_per_worker)"
            )
        return slots

    def close(self) -> None:
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []
        if self.connected and ray.is_initialized():
            ray.shutdown()


class RayExecutor(Executor):
    name = "ray"

    def __init__(self, pipeline: ClientPipeline, workers: RayWorkers):
        super().__init__(pipeline)
        if pipeline.algorithm.keeps_client_state and not isinstance(pipeline.store, RayStateStore):
            raise ValueError(
                f"{pipeline.algorithm.name} keeps client state, which Ray actors reach through a "
                "RayStateStore (engine/ray_state.py)"
            )
        self.workers = workers
        self._actors: list[Any] = list(workers.actors)  # the live ones
        self.nodes: list[str] = []  # the node id each live actor runs on, from the first round
        self._shipped = False

    def _ship(self) -> None:
        """At the first round, so the actors get what init_server told the algorithm (as the parallel
        executor forks then)."""
        started = time.perf_counter()
        shipped = copy.copy(self.pipeline)  # every actor gets its own channel and a staging store
        shipped.store = MemoryStateStore()
        drop = self.pipeline.channel.drop
        shipped.channel = Channel(Ledger(), self.pipeline.streams, drop[Direction.UP], drop[Direction.DOWN])
        keeper = self.pipeline.store.keeper if isinstance(self.pipeline.store, RayStateStore) else None
        ray.util.register_serializer(ArrayDataset, serializer=_shared, deserializer=_from_shared)
        try:
            setup = ray.put(shipped)
        finally:
            ray.util.deregister_serializer(ArrayDataset)
        self.nodes = ray.get([actor.setup.remote(setup, keeper) for actor in self._actors])
        self._shipped = True
        log.info(  # benchmarks/scaleout.py reads this line: the wait is start-up, not training
            "ray: %d workers on %d nodes, ready %.2f s into the first round",
            len(self._actors),
            len(set(self.nodes)),
            time.perf_counter() - started,
        )

    def serve(self, round, clients, downlink, spec) -> RoundPart:
        if not self._shipped:
            self._ship()
        distinct: list[Message] = []  # a broadcast is one Message object: put once per round
        position: dict[int, int] = {}  # id of a message -> its place in distinct
        which: dict[int, int | None] = {}
        for client in clients:
            message = downlink.get(client)
            if message is not None and id(message) not in position:
                position[id(message)] = len(distinct)
                distinct.append(message)
            which[client] = None if message is None else position[id(message)]
        refs = [ray.put(encode(message)) for message in distinct]
        spec_json = encode_spec(spec)
        parts: list[RoundPart] = []
        pending = list(clients)
        while pending:  # again, on the survivors, for the clients of actors that died
            pending = self._run(round, pending, which, refs, spec_json, parts)
        return merge(self.pipeline, parts, clients)

    def _run(
        self,
        round: int,
        clients: list[int],
        which: Mapping[int, int | None],
        refs: Sequence[ray.ObjectRef],
        spec: dict[str, list],
        parts: list[RoundPart],
    ) -> list[int]:
        """Serve ``clients`` on the live actors, adding their parts to ``parts``; return the clients
        of actors that died."""
        if not self._actors:
            raise ClusterLost(
                "every Ray worker actor died; bring the cluster's nodes back and run `taciturn resume` "
                "on the run directory (it continues from the last checkpoint)"
            )
        shares = balance(clients, [self.pipeline.data.client_size(c) for c in clients], len(self._actors))
        calls = []
        for actor, share in zip(self._actors, shares, strict=True):
            if share:
                used = sorted({i for c in share if (i := which[c]) is not None})
                request = {
                    "round": round,
                    "clients": share,
                    "downlink": {str(c): None if which[c] is None else used.index(which[c]) for c in share},
                    "spec": spec,
                }
                calls.append((actor, share, actor.serve.remote(request, *[refs[i] for i in used])))
        lost: list[int] = []
        for actor, share, call in calls:
            try:
                header, blobs = ray.get(call)
            except ray.exceptions.RayActorError as error:
                log.warning(
                    "round %d: a Ray worker died (%s); its %d clients run again on the other workers",
                    round,
                    type(error).__name__,
                    len(share),
                )
                index = self._actors.index(actor)
                del self._actors[index], self.nodes[index]
                lost += share
                continue
            if "lost" in header:
                raise ClusterLost(header["lost"])
            if "error" in header:
                raise WorkerFailed(header["error"])
            for row in header["ledger"]:
                self.pipeline.channel.ledger.add_row(row)
            parts.append(decode_part(header, blobs))
        return [c for c in clients if c in set(lost)]

    def commit(self, round: int, accepted: Sequence[int]) -> None:
        """The round's staged client states take effect as engine/ray_state.py says; the keeper has
        stored them when this returns (a checkpoint may follow)."""
        if isinstance(self.pipeline.store, RayStateStore):
            ask(self.pipeline.store.keeper.commit.remote(round, list(accepted)))

    def close(self) -> None:
        self._actors, self.nodes = [], []
        if isinstance(self.pipeline.store, RayStateStore):
            self.pipeline.store.close()
        self.workers.close()


@ray.remote(max_restarts=0)
class Worker:
    """One worker slot: serves a share of each round's clients until the run ends."""

    def __init__(self, threads: int):
        torch.set_num_threads(threads)
        logging.getLogger("taciturn").handlers.clear()  # the driver owns the run log
        self.trainer = LoopTrainer()

    def setup(self, pipeline: ClientPipeline, keeper: Any) -> str:
        """The run's client pipeline (at the first round); returns this actor's node id."""
        self.pipeline, self.keeper = pipeline, keeper
        return self.node()

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def serve(self, request: dict[str, Any], *blobs: bytes) -> tuple[dict[str, Any], list[bytes]]:
        pipeline, round, clients = self.pipeline, request["round"], request["clients"]
        try:
            messages = [decode(blob) for blob in blobs]
            downlink = {int(c): None if i is None else messages[i] for c, i in request["downlink"].items()}
            drop = pipeline.channel.drop
            pipeline.channel = Channel(Ledger(), pipeline.streams, drop[Direction.UP], drop[Direction.DOWN])
            pipeline.store = _Staging(
                decode_states(ask(self.keeper.get.remote(clients))) if self.keeper else {}
            )
            spec = decode_spec(request["spec"])
            part = pipeline.serve(round, clients, downlink, spec, self.trainer)
            silent = pipeline.store.take()  # clients that sent nothing: stored at once, in-process
            pipeline.commit(round, clients)  # hands over the states awaiting acceptance
            sent = pipeline.store.take()
            if silent or sent:  # at the keeper before the result leaves; the driver commits
                ask(self.keeper.stage.remote(round, encode_states(silent), encode_states(sent)))
            return encode_part(part, pipeline.channel.ledger.rows())
        except ClusterLost as lost:
            return {"lost": str(lost)}, []
        except Exception:
            return {"error": f"ray worker {os.getpid()} on node {self.node()}: {traceback.format_exc()}"}, []


def _shared(dataset: ArrayDataset) -> tuple[dict[str, Any], list[str]]:
    """How the training data goes into the object store (registered only while the pipeline is put):
    its CPU tensors as numpy arrays, which Ray gives every actor of a node zero-copy from the one
    shared copy ("Numpy arrays in the object store are shared between workers on the same node",
    Ray's serialization docs) instead of one unpickled copy per actor. Actors only read the data
    (a batch is a gather, data/federated.py)."""
    fields = {f.name: getattr(dataset, f.name) for f in dataclasses.fields(dataset)}
    tensors = [k for k, v in fields.items() if isinstance(v, torch.Tensor) and v.device.type == "cpu"]
    return {k: fields[k].numpy() if k in tensors else v for k, v in fields.items()}, tensors


def _from_shared(shared: tuple[dict[str, Any], list[str]]) -> ArrayDataset:
    fields, tensors = shared
    with warnings.catch_warnings():  # read-only by design: the object store's shared memory
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return ArrayDataset(**{k: torch.from_numpy(v) if k in tensors else v for k, v in fields.items()})


class _Staging(MemoryStateStore):
    """A share's states as the keeper holds them; what the pipeline stores is kept for the keeper."""

    def __init__(self, states: Mapping[int, Any]):
        super().__init__()
        self._states = dict(states)
        self._written: dict[int, Any] = {}

    def put(self, client, state) -> None:
        super().put(client, state)
        self._written[client] = state

    def take(self) -> dict[int, Any]:
        """The states stored since the last take."""
        written, self._written = self._written, {}
        return written
