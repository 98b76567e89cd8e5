"""Ledger: bytes and message counts per round, per client, per direction.

A message is counted as *sent* when it leaves its sender and as *delivered* when it reaches its
receiver; a dropped message is sent but not delivered. Bytes are the encoded sizes, i.e. what a
real network would carry. In a deployment (taciturn.deploy) a message also has a *wire* size:
the bytes of the transport's own serialized message around the payload (Flower's records and
metadata), which may carry no payload at all (a training request with no model, an empty reply);
``wire_bytes`` counts those, so framing overhead is measured (0 in simulation: no wire).
The ledger keeps one row per (round, client, direction) that saw traffic, so its size grows with
the traffic, not with the number of clients. A private run writes one row per (round, direction)
instead, client ``all`` (``append_csv(by_client=False)``): which clients took part is what
amplification by sampling assumes hidden, and a file naming them per round would give it away.
"""

from __future__ import annotations

import csv
import enum
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


class Direction(enum.Enum):
    UP = "up"  # client -> server
    DOWN = "down"  # server -> client


ALL = "all"  # the client column of a row summed over a round's clients (private runs)
PAYLOAD = ("messages_sent", "messages_delivered", "bytes_sent", "bytes_delivered")
COLUMNS = ("round", "client", "direction", *PAYLOAD, "wire_bytes")


@dataclass
class Entry:
    messages_sent: int = 0
    messages_delivered: int = 0
    bytes_sent: int = 0
    bytes_delivered: int = 0
    wire_bytes: int = 0


@dataclass(frozen=True)
class Totals:
    """Cumulative traffic in one direction."""

    messages_sent: int
    messages_delivered: int
    bytes_sent: int
    bytes_delivered: int
    wire_bytes: int = 0


class Ledger:
    def __init__(self) -> None:
        self._rows: dict[tuple[int, int, Direction], Entry] = defaultdict(Entry)
        self._totals: dict[Direction, Entry] = {d: Entry() for d in Direction}

    def record(self, round: int, client: int, direction: Direction, nbytes: int, delivered: bool) -> None:
        for entry in (self._rows[(round, client, direction)], self._totals[direction]):
            entry.messages_sent += 1
            entry.bytes_sent += nbytes
            if delivered:
                entry.messages_delivered += 1
                entry.bytes_delivered += nbytes

    def record_wire(self, round: int, client: int, direction: Direction, nbytes: int) -> None:
        """Bytes of one transport message sent between ``client`` and the server (deployments)."""
        for entry in (self._rows[(round, client, direction)], self._totals[direction]):
            entry.wire_bytes += nbytes

    def add_row(self, row: dict) -> None:
        """Add a row produced by another ledger (e.g. a worker process's), as ``rows()`` gives them."""
        direction = Direction(row["direction"])
        for entry in (self._rows[(row["round"], row["client"], direction)], self._totals[direction]):
            for key in COLUMNS[3:]:
                setattr(entry, key, getattr(entry, key) + row.get(key, 0))

    def totals(self, direction: Direction) -> Totals:
        e = self._totals[direction]
        return Totals(e.messages_sent, e.messages_delivered, e.bytes_sent, e.bytes_delivered, e.wire_bytes)

    def round_totals(self, round: int, direction: Direction) -> Totals:
        rows = [e for (r, _, d), e in self._rows.items() if r == round and d == direction]
        return Totals(*(sum(getattr(e, f) for e in rows) for f in COLUMNS[3:]))

    def rows(self, rounds: Iterable[int] | None = None) -> list[dict]:
        wanted = None if rounds is None else set(rounds)
        return [
            {"round": r, "client": c, "direction": d.value, **vars(e)}
            for (r, c, d), e in sorted(
                self._rows.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2].value)
            )
            if wanted is None or r in wanted
        ]

    def append_csv(self, path: Path, round: int, by_client: bool = True) -> None:
        """Append one round's rows to a CSV file (written round by round as the run goes);
        ``by_client=False``: one row per direction, summed over the round's clients."""
        new = not path.exists()
        rows = self.rows([round])
        if not by_client:
            rows = [
                {"round": round, "client": ALL, "direction": d.value, **vars(self.round_totals(round, d))}
                for d in Direction
                if any(row["direction"] == d.value for row in rows)
            ]
        with path.open("a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS)
            if new:
                writer.writeheader()
            writer.writerows(rows)
        self.forget_before(round + 1)

    def forget_before(self, round: int) -> None:
        """Drop per-client rows of rounds already written out (totals are kept)."""
        for key in [k for k in self._rows if k[0] < round]:
            del self._rows[key]

    @classmethod
    def from_csv(cls, path: Path, up_to_round: int | None = None) -> Ledger:
        """Rebuild the cumulative totals from a ledger file, e.g. to resume a run."""
        ledger = cls()
        if not path.exists():
            return ledger
        with path.open(newline="") as f:
            for row in csv.DictReader(f):
                r = int(row["round"])
                if up_to_round is not None and r > up_to_round:
                    continue
                entry = ledger._totals[Direction(row["direction"])]
                for k in COLUMNS[3:]:  # ledgers written before wire_bytes existed lack it
                    setattr(entry, k, getattr(entry, k) + int(row.get(k) or 0))
        return ledger
