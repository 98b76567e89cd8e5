"""Seeded random streams derived from (run seed, round, client, purpose).

Every random draw in a run comes from one of these streams, so the same config and seed give
the same numbers whatever the executor, the number of workers or the order clients run in.
Shared randomness (Ferret's bases, FedKSeed's seeds) is simply a stream that client and server
both derive. Streams are stateless to create, so nothing about them needs checkpointing.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

SERVER = -1  # the client id used for the server's own streams


def _purpose_id(purpose: str) -> int:
    return int.from_bytes(hashlib.blake2b(purpose.encode(), digest_size=8).digest(), "little")


class Streams:
    def __init__(self, seed: int):
        if seed < 0:
            raise ValueError(f"the run seed must be a non-negative integer, got {seed}")
        self.seed = seed

    def _sequence(self, round: int, client: int, purpose: str) -> np.random.SeedSequence:
        if round < 0 or client < SERVER:
            raise ValueError(f"streams need round >= 0 and client >= {SERVER}, got ({round}, {client})")
        return np.random.SeedSequence(self.seed, spawn_key=(round, client + 1, _purpose_id(purpose)))

    def numpy(self, round: int, client: int, purpose: str) -> np.random.Generator:
        return np.random.Generator(np.random.PCG64(self._sequence(round, client, purpose)))

    def seed_for(self, round: int, client: int, purpose: str) -> int:
        """A 63-bit integer seed, for libraries that take a seed rather than a generator."""
        return self.seeds_for(round, client, purpose, 1)[0]

    def seeds_for(self, round: int, client: int, purpose: str, n: int) -> list[int]:
        """n 63-bit seeds from one stream, each the first of ``n + 1``'s (a prefix stays a prefix):
        one SeedSequence instead of n, for many generators of one purpose (Ferret's K_l bases)."""
        state = self._sequence(round, client, purpose).generate_state(n, np.uint64) >> np.uint64(1)
        return [int(seed) for seed in state]

    def torch(self, round: int, client: int, purpose: str) -> torch.Generator:
        return torch.Generator().manual_seed(self.seed_for(round, client, purpose))
