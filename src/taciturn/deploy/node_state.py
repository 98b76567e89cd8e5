"""A node's client state on its own disk: one version per round, the server says which is in effect.

DESIGN.md, "Acceptance": a client's new persistent state (SCAFFOLD's c_i, ADMM duals, trigger
memory) takes effect only when the server has accepted the message that carries its consequence.
A node cannot know that when it replies, so it keeps the client's state after each round it served
as a *version* of that round. The server names the version in effect with the client's next
request (protocol.py ``accepted``: the last round whose reply it took, an uplink it applied or an
empty one), so a lost, rejected or never-sent reply leaves the client's state as it was.

The server also names ``kept``: the version in effect at its last checkpoint. A resumed server
(``resume = true``, settings.py) starts again from that checkpoint and names that version, so the
node keeps it, and every round the resumed server runs again overwrites the version it wrote the
first time: a resumed run trains every client from exactly the state an uninterrupted one does.
Every other version of the client is removed when a request arrives. A client without state
(FedAvg's) has empty versions, so a version the server names and the node lacks is always an
error (its state-dir was lost or replaced, the client moved to another node, or the server resumed
from an older checkpoint than its last), never a silent restart from a fresh state.

Files (safetensors through the codec, written atomically: temporary file, fsync, rename):
    client-<id>.round-<r>.safetensors   the client's state after round r
The store only ever removes files of this name, so it can share a folder with anything else, and
it survives a node restart: a restarted node carries on from the versions on its disk.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from taciturn.core.codec import decode, encode
from taciturn.core.message import Message
from taciturn.core.state_store import ClientState
from taciturn.deploy.settings import DeployError

_VERSION = re.compile(r"client-(\d+)\.round-(\d+)\.safetensors")


class NodeStateStore:
    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def _path(self, client: int, round: int) -> Path:
        return self.folder / f"client-{client}.round-{round}.safetensors"

    def load(self, client: int, round: int) -> ClientState | None:
        """The client's state after ``round`` (None: no state then, or round 0)."""
        if round == 0:
            return None
        path = self._path(client, round)
        if not path.exists():
            raise DeployError(
                f"client {client}'s state after round {round}, which the server names, is not in "
                f"{self.folder}: this node's state-dir was lost or replaced, the client was hosted by "
                "another node, or the server resumed from an older checkpoint than its last"
            )
        state = {name: t.clone() for name, t in decode(path.read_bytes()).tensors().items()}
        return state or None

    def save(self, client: int, round: int, state: ClientState | None) -> None:
        """The client's state after ``round`` (None: it has none, an empty version)."""
        _write_atomically(self._path(client, round), state or {})

    def settle(self, client: int, accepted: int, kept: int) -> ClientState | None:
        """The state the client trains from (its version of round ``accepted``); every other
        version of the client is removed, except that of round ``kept``."""
        for path in self.folder.iterdir():
            match = _VERSION.fullmatch(path.name)
            if match is not None and int(match[1]) == client and int(match[2]) not in (accepted, kept):
                path.unlink()
        return self.load(client, accepted)


def _write_atomically(path: Path, state: ClientState) -> None:
    data = encode(Message.from_tensors(state))
    temporary = path.with_name(path.name + ".tmp")
    with temporary.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)
