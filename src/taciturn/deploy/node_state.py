"""A node's client state on its own disk, committed only when the server accepted the uplink.

DESIGN.md, "Acceptance": a client's new persistent state (SCAFFOLD's c_i, ADMM duals, trigger
memory) takes effect only when the server has accepted the message that carries its consequence.
A node cannot know that when it replies, so it *stages* the state with the round it belongs to;
the server's next request to that client says which of its rounds the server last accepted
(protocol.py ``accepted``), and ``settle`` commits the staged state of that round or drops it (the
reply was lost, rejected, or never arrived because the node died). A client that sent nothing has
nothing to wait for: its state is committed at once (engine/pipeline.py does the same in
simulation).

Files (safetensors through the codec, written atomically: temporary file, fsync, rename):
    client-<id>.safetensors                  the committed state
    client-<id>.round-<r>.staged.safetensors state staged in round r
The store only ever removes files of these names, so it can share a folder with anything else,
and it survives a node restart: a restarted node carries on from its committed state.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from taciturn.core.codec import decode, encode
from taciturn.core.message import Message
from taciturn.core.state_store import ClientState

_STAGED = re.compile(r"client-(\d+)\.round-(\d+)\.staged\.safetensors")


class NodeStateStore:
    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def _committed(self, client: int) -> Path:
        return self.folder / f"client-{client}.safetensors"

    def _staged(self, client: int, round: int) -> Path:
        return self.folder / f"client-{client}.round-{round}.staged.safetensors"

    def get(self, client: int) -> ClientState | None:
        path = self._committed(client)
        if not path.exists():
            return None
        return {name: t.clone() for name, t in decode(path.read_bytes()).tensors().items()}

    def put(self, client: int, state: ClientState) -> None:
        """Commit at once (a client that sent nothing)."""
        _write_atomically(self._committed(client), state)

    def stage(self, client: int, round: int, state: ClientState) -> None:
        _write_atomically(self._staged(client, round), state)

    def settle(self, client: int, accepted: int) -> None:
        """Commit the state staged in round ``accepted``; drop every other staged state of ``client``."""
        for path in self.folder.iterdir():
            match = _STAGED.fullmatch(path.name)
            if match is None or int(match[1]) != client:
                continue
            if int(match[2]) == accepted:
                os.replace(path, self._committed(client))
            else:
                path.unlink()


def _write_atomically(path: Path, state: ClientState) -> None:
    data = encode(Message.from_tensors(state))
    temporary = path.with_name(path.name + ".tmp")
    with temporary.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)
