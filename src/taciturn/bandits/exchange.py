"""What agents share, as messages through the core Channel and Ledger.

The protocol is a relay: an agent that pulled an arm uploads its sample (x, r) to the server, which
holds every agent's statistics and runs the sharing rule; the server forwards the sample to every
other agent that uses it, and sends an agent its whole pool (lam*I + sum of the Gram matrices it
uses, and the matching b) when the rule changes whose samples that agent uses. Agents act on
their own copy of their pool, so nobody waits for the server to choose an arm.

Each repetition (an independent run) has its own Channel, Ledger and seeded streams: messages
are encoded (safetensors), counted and may be dropped exactly as in a federated run. A dropped
sample leaves the receiver's pool without it until its next resync; a dropped upload never
reaches the server. The channel is told the step (drops are drawn per step, agent and direction)
and the ledger sums blocks of ``block`` steps: one row per (block, agent, direction), which is what
the run directory keeps.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from taciturn.core.channel import Channel, Direction
from taciturn.core.ledger import PAYLOAD, Ledger
from taciturn.core.message import Message
from taciturn.core.rng import Streams

FIELDS = PAYLOAD  # messages_sent, messages_delivered, bytes_sent, bytes_delivered
DIRECTIONS = (Direction.UP, Direction.DOWN)


def sample_message(x: np.ndarray, reward: float) -> Message:
    return Message(arrays={"sample": np.append(x, reward)})


def pool_message(gram: np.ndarray, b: np.ndarray) -> Message:
    return Message(arrays={"gram": gram, "b": b})


class BlockLedger(Ledger):
    """A ledger whose rounds are blocks of ``block`` steps (the channel passes the step as the round)."""

    def __init__(self, block: int):
        super().__init__()
        self.block = block

    def record(self, round: int, client: int, direction: Direction, nbytes: int, delivered: bool) -> None:
        super().record(round // self.block, client, direction, nbytes, delivered)


class Exchange:
    def __init__(self, seeds: list[int], drop_up: float = 0.0, drop_down: float = 0.0, block: int = 1):
        self.channels = [Channel(BlockLedger(block), Streams(seed), drop_up, drop_down) for seed in seeds]
        # cumulative traffic per repetition, direction (up, down) and field (FIELDS)
        self.traffic = np.zeros((len(seeds), len(DIRECTIONS), len(FIELDS)), dtype=np.int64)
        self._uploaded: list[Message | None] = [None] * len(seeds)

    def upload(self, step: int, rep: int, agent: int, x: np.ndarray, reward: float) -> np.ndarray | None:
        """The sample as the server received it, or None if the upload was dropped."""
        self._uploaded[rep] = sample_message(x, reward)
        arrived = self.channels[rep].send(Direction.UP, step, int(agent), self._uploaded[rep])
        return None if arrived is None else arrived.arrays["sample"]

    def forward(self, step: int, rep: int, agents: np.ndarray) -> tuple[list[int], np.ndarray | None]:
        """Relay the last sample uploaded in ``rep`` to ``agents``: (those reached, the sample as it arrived).

        The relay sends the very bytes it received (the channel encodes that message once).
        """
        reached, arrived = self.channels[rep].multicast(
            Direction.DOWN, step, [int(j) for j in agents], self._uploaded[rep]
        )
        return reached, None if arrived is None else arrived.arrays["sample"]

    def send_pool(self, step: int, rep: int, agent: int, gram: np.ndarray, b: np.ndarray):
        """Send an agent its pool; return (gram, b) as it arrived, or None if dropped."""
        arrived = self.channels[rep].send(Direction.DOWN, step, agent, pool_message(gram, b))
        return None if arrived is None else (arrived.arrays["gram"], arrived.arrays["b"])

    def close_block(self) -> list[list[dict]]:
        """Per repetition, the ledger rows (client, direction, FIELDS) since the last call, summed
        over blocks; they are added to ``traffic`` and the ledgers forget them."""
        blocks = []
        for rep, channel in enumerate(self.channels):
            folded: dict[tuple[int, str], np.ndarray] = defaultdict(lambda: np.zeros(len(FIELDS), np.int64))
            for row in channel.ledger.rows():
                folded[(row["client"], row["direction"])] += [row[f] for f in FIELDS]
            channel.ledger.forget_before(np.iinfo(np.int64).max)
            rows = []
            for (client, direction), counts in sorted(folded.items()):
                self.traffic[rep, [d.value for d in DIRECTIONS].index(direction)] += counts
                rows.append(
                    {
                        "client": client,
                        "direction": direction,
                        **dict(zip(FIELDS, counts.tolist(), strict=True)),
                    }
                )
            blocks.append(rows)
        return blocks
