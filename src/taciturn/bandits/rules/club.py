"""CLUB: Gentile, Li and Zappella, "Online Clustering of Bandits", ICML 2014, Algorithm 1.

A user graph starts complete (the paper starts from a random Erdos-Renyi graph to save
memory on many users; with tens of agents the complete graph is what bandpy uses). When user i
is served, every edge (i, j) with ||w_i - w_j|| > CB_i + CB_j is deleted, where
CB_i = gamma * sqrt((1 + ln(1 + T_i)) / (1 + T_i)) and T_i counts i's samples. Users pool their
samples over the connected component they belong to.
"""

from __future__ import annotations

import numpy as np

from taciturn.bandits.rules.base import SharingRule
from taciturn.bandits.stats import AgentStats


def confidence_width(count: np.ndarray) -> np.ndarray:
    """sqrt((1 + ln(1 + T)) / (1 + T)), CLUB's isotropic confidence width (also SCLUB's F(T))."""
    return np.sqrt((1 + np.log1p(count)) / (1 + count))


def connected(graph: np.ndarray) -> np.ndarray:
    """Reachability (R, N, N) of undirected graphs with self-loops, by repeated squaring."""
    reach = graph.copy()
    while True:
        grown = np.matmul(reach.astype(np.int64), reach.astype(np.int64)) > 0
        if np.array_equal(grown, reach):
            return reach
        reach = grown


class Club(SharingRule):
    name = "club"

    def __init__(self, repetitions: int, agents: int, gamma: float = 1.0):
        super().__init__(repetitions, agents)
        self.gamma = gamma
        self.graph = np.ones_like(self.membership)

    def update(self, stats: AgentStats, reps: np.ndarray, active: np.ndarray, step: int) -> None:
        distance = np.linalg.norm(stats.theta[reps, active][:, None] - stats.theta[reps], axis=-1)
        width = self.gamma * confidence_width(stats.count[reps])
        threshold = width[np.arange(len(reps)), active][:, None] + width
        cut = (distance > threshold) & self.graph[reps, active]
        cut[np.arange(len(reps)), active] = False
        if cut.any():
            changed = reps[cut.any(axis=1)]
            self.graph[reps, active] &= ~cut
            self.graph[reps, :, active] = self.graph[reps, active]
            self.membership[changed] = connected(self.graph[changed])

    def state(self) -> dict[str, np.ndarray]:
        return {"graph": self.graph}

    def load(self, state: dict[str, np.ndarray]) -> None:
        self.graph[...] = state["graph"]
        self.membership[...] = connected(self.graph)
