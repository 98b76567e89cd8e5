"""Client state on a Ray cluster: one keeper actor owns it, pinned to the driver's node.

The design, and why. A client's state (SCAFFOLD's c_i, ADMM duals, Ferret's sync markers) must
outlive the worker that trained the client: the Ray executor rebalances the round's clients over
its workers every round (as the parallel executor does), and a worker, or its whole node, may die
mid-round. So state is owned not by a worker but by a keeper actor, which wraps one of the ordinary
stores (memory, or the disk store for many clients) and is placed with a hard node affinity on the
node the driver runs on: it shares the driver's fate, not a worker node's, and its disk store and
checkpoints are files on the driver's machine. (A per-worker disk store would be lost with its node
and would pin each client to one worker; a state owner per worker would do both.)

Writes are staged: a worker fetches its share's states in one call, trains, and sends the new
states back (``stage``) before it returns its part of the round. They take effect when the driver
commits the round (``commit``, called by the Federation once the round's aggregate is validated):
a client that sent an uplink gets its new state only if the server accepted that uplink (the
acceptance rule of engine/pipeline.py); a client that sent nothing gets it at the commit whatever
was accepted. A worker that dies mid-round leaves nothing committed, so its clients can be run again
from the same state. States
cross between processes through the codec (core/state_store.py ``encode_states``), never pickled.

The keeper is not restarted when it dies (with the driver's node, or killed): the states it held
since the last checkpoint are gone, so every call to it then raises ``ClusterLost``, which tells the
user to resume; the checkpoint holds the committed states of its round.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from taciturn.core.disk_store import DiskStateStore
from taciturn.core.errors import TaciturnError
from taciturn.core.folder import Folder
from taciturn.core.state_store import (
    ClientState,
    ClientStateStore,
    MemoryStateStore,
    decode_states,
    encode_states,
)


class ClusterLost(TaciturnError):
    """What the run needs on the Ray cluster is gone (every worker actor, or the state keeper);
    ``taciturn resume`` continues from the last checkpoint."""


def ask(call: ray.ObjectRef):
    """The result of a call to the keeper; its death becomes ``ClusterLost``, not a Ray traceback."""
    try:
        return ray.get(call)
    except ray.exceptions.RayActorError:
        raise ClusterLost(
            "the Ray actor that keeps the clients' state (on the driver's node) died, and with it the "
            "states since the last checkpoint: run `taciturn resume` on the run directory"
        ) from None


@ray.remote(num_cpus=0, max_restarts=0)
class Keeper:
    """Owns every client's committed state, plus the states staged by this round's workers:
    ``silent`` (the client sent nothing: stored at the commit) and ``sent`` (stored if accepted)."""

    def __init__(self, disk_path: str | None, num_clients: int):
        self.store: ClientStateStore = (
            DiskStateStore(Path(disk_path), num_clients) if disk_path else MemoryStateStore()
        )
        self.round: int | None = None  # the round whose states are staged
        self.silent: dict[int, ClientState] = {}
        self.sent: dict[int, ClientState] = {}

    def get(self, clients: Sequence[int]) -> bytes:
        return encode_states({c: s for c in clients if (s := self.store.get(c)) is not None})

    def stage(self, round: int, silent: bytes, sent: bytes) -> None:
        if self.round != round:  # an earlier round never committed: nothing of it was accepted
            self.round, self.silent, self.sent = round, {}, {}
        self.silent.update(decode_states(silent))
        self.sent.update(decode_states(sent))

    def commit(self, round: int, accepted: Sequence[int]) -> None:
        """Store the round's silent clients' states and the states of ``accepted`` clients; forget
        the rest (their uplink was dropped or rejected, or the round was discarded)."""
        if self.round == round:
            for client, state in self.silent.items():
                self.store.put(client, state)
            for client in accepted:
                if (state := self.sent.get(client)) is not None:
                    self.store.put(client, state)
        self.round, self.silent, self.sent = None, {}, {}

    def put(self, client: int, states: bytes) -> None:
        self.store.put(client, decode_states(states)[client])

    def clients(self) -> list[int]:
        return list(self.store.clients())

    def save(self, folder: str) -> None:
        self.store.save(Path(folder))

    def load(self, folder: str) -> None:
        self.store.load(Path(folder))


def _where(folder: Folder | Path) -> str:
    """The checkpoint folder's path for the keeper (another process, on this machine)."""
    return str((folder.path if isinstance(folder, Folder) else Path(folder)).resolve())


class RayStateStore(ClientStateStore):
    """The driver's handle on the keeper: what the runner checkpoints and resumes. Checkpoints keep
    the wrapped store's format, written by the keeper on the driver's machine."""

    def __init__(self, disk_path: Path | None, num_clients: int):
        here = ray.get_runtime_context().get_node_id()
        self.keeper = Keeper.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=here, soft=False)
        ).remote(None if disk_path is None else str(disk_path), num_clients)

    def get(self, client: int) -> ClientState | None:
        return decode_states(ask(self.keeper.get.remote([client]))).get(client)

    def put(self, client: int, state: ClientState) -> None:
        ask(self.keeper.put.remote(client, encode_states({client: state})))

    def clients(self) -> Iterator[int]:
        return iter(ask(self.keeper.clients.remote()))

    def save(self, folder: Folder | Path) -> None:
        ask(self.keeper.save.remote(_where(folder)))

    def load(self, folder: Folder | Path) -> None:
        ask(self.keeper.load.remote(_where(folder)))

    def close(self) -> None:
        ray.kill(self.keeper)
