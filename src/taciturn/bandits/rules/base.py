"""What a sharing rule is: who uses whose samples, decided at the server from the data it holds.

Every method compared here is LinUCB on pooled data; they differ only in the pool. A rule keeps
``membership`` (R, N, N) bool, one matrix per repetition: ``membership[r, j, k]`` says that agent
j acts on agent k's samples (the diagonal is always True). After the server receives a sample
of agent ``active[n]`` in repetition ``reps[n]`` it calls ``update``; the simulation then diffs the
memberships to decide which agents get the sample and which get a fresh copy of their pool.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np

from taciturn.bandits.stats import AgentStats


class SharingRule(ABC):
    name: ClassVar[str]
    # True when an agent's pool may grow (clusters merge, agents move): the server then needs every
    # sample. Rules whose pools only shrink stop uploading once nobody else uses an agent's samples.
    regroups: ClassVar[bool] = False

    def __init__(self, repetitions: int, agents: int):
        self.membership = np.ones((repetitions, agents, agents), dtype=bool)

    @abstractmethod
    def update(self, stats: AgentStats, reps: np.ndarray, active: np.ndarray, step: int) -> None:
        """The server received a new sample of agent ``active[n]`` in repetition ``reps[n]``."""

    def state(self) -> dict[str, np.ndarray]:
        return {"membership": self.membership}

    def load(self, state: dict[str, np.ndarray]) -> None:
        self.membership[...] = state["membership"]


def same_label(labels: np.ndarray) -> np.ndarray:
    """(R, N) labels -> (R, N, N) bool: agents j and k share a label."""
    return labels[:, :, None] == labels[:, None, :]
