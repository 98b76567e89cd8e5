"""Channel: delivers messages between clients and the server, and may drop them.

Every message is encoded with the codec, so the ledger records the bytes a real network would
carry, and the receiver gets a decoded copy (no aliasing with the sender's memory). A broadcast (one
Message sent to many clients) is encoded once and decoded once: its receivers share the decoded
copy, so they must treat what arrives as read-only (every algorithm builds new tensors from it). Drops are
independent Bernoulli draws per message and direction, from the run's seeded streams, which is
how communication failures are simulated. A dropped message is counted as sent, not delivered.

Per message: the k-th message of a round between one client and the server in one direction takes
the k-th draw of that (round, client, direction)'s stream, so a protocol with several messages a
round (SecAgg's four stages) can lose any one of them, and a run still repeats exactly (the draws
are simulation, not secrets). A client's messages go through one Channel in the order it sends
them, whatever worker serves it, so the count is the same for every executor.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from taciturn.core.codec import decode, encode
from taciturn.core.ledger import Direction, Ledger
from taciturn.core.message import Message
from taciturn.core.rng import Streams


class Channel:
    def __init__(self, ledger: Ledger, streams: Streams, drop_up: float = 0.0, drop_down: float = 0.0):
        for name, p in (("drop_up", drop_up), ("drop_down", drop_down)):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} is a probability and must lie in [0, 1], got {p}")
        self.ledger = ledger
        self.streams = streams
        self.drop = {Direction.UP: drop_up, Direction.DOWN: drop_down}
        self._encoded: tuple[Message, bytes] | None = None
        self._decoded: tuple[bytes, Message] | None = None
        self._round: int | None = None  # the round whose drop streams are open
        self._drops: dict[tuple[int, Direction], np.random.Generator] = {}

    def _encode(self, message: Message) -> bytes:
        # A broadcast sends one Message object to many clients: encode it once.
        if self._encoded is None or self._encoded[0] is not message:
            self._encoded = (message, encode(message))
        return self._encoded[1]

    def _decode(self, data: bytes) -> Message:
        if self._decoded is None or self._decoded[0] is not data:
            self._decoded = (data, decode(data))
        return self._decoded[1]

    def _draw(self, direction: Direction, round: int, client: int) -> float:
        """The next uniform of the (round, client, direction) drop stream: one per message."""
        if round != self._round:  # a new round: the last one's streams are done with
            self._round, self._drops = round, {}
        rng = self._drops.get((client, direction))
        if rng is None:
            rng = self._drops[(client, direction)] = self.streams.numpy(
                round, client, f"drop-{direction.value}"
            )
        return float(rng.random())

    def _deliver(self, direction: Direction, round: int, client: int, nbytes: int) -> bool:
        p = self.drop[direction]
        delivered = p == 0.0 or self._draw(direction, round, client) >= p
        self.ledger.record(round, client, direction, nbytes, delivered)
        return delivered

    def send(self, direction: Direction, round: int, client: int, message: Message) -> Message | None:
        """Send one message between ``client`` and the server; return what arrives, or None if dropped."""
        data = self._encode(message)
        return self._decode(data) if self._deliver(direction, round, client, len(data)) else None

    def multicast(
        self, direction: Direction, round: int, clients: Iterable[int], message: Message
    ) -> tuple[list[int], Message | None]:
        """Send one message to each of ``clients``; return the clients it reached and what arrived.

        Every copy is counted and may be dropped exactly as with ``send``; the receivers share one
        decoded copy, as with any broadcast.
        """
        data = self._encode(message)
        reached = [c for c in clients if self._deliver(direction, round, c, len(data))]
        return reached, self._decode(data) if reached else None
