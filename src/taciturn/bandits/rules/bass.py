"""BASS: Bandit Adaptive Sample Sharing (Cherkaoui, Barlier and Colin, ICML 2025, arXiv 2309.08710).

Each agent pools its samples with those of its *neighbours* in a sharing graph that starts
complete; when an agent receives a sample, the server tests the agent against each current
neighbour and removes the edge for good once the separation test fires (separation.py). Agents
share with their neighbours, not with whole connected components: two agents that have been
separated never use each other's samples even if a chain of neighbours still links them (the
authors' code, bandpy ``LBC``, pools over ``graph_G.neighbors(i)`` since the commit "based the LBC
on neighbors sharing"; CLUB pools over components).
"""

from __future__ import annotations

import numpy as np

from taciturn.bandits.linucb import Confidence
from taciturn.bandits.rules.base import SharingRule
from taciturn.bandits.separation import TESTS
from taciturn.bandits.stats import AgentStats


class Bass(SharingRule):
    name = "bass"

    def __init__(self, repetitions: int, agents: int, confidence: Confidence, test: str = "mahalanobis"):
        super().__init__(repetitions, agents)  # complete graph with self-loops
        if test not in TESTS:
            raise ValueError(f"unknown separation test {test!r}; choose one of {', '.join(TESTS)}")
        self.confidence = confidence
        self.test = TESTS[test]

    def update(self, stats: AgentStats, reps: np.ndarray, active: np.ndarray, step: int) -> None:
        # Only the tests involving the agent whose statistics just changed can change their outcome.
        separated = self.test(
            stats.theta[reps, active][:, None],
            stats.inverse[reps, active][:, None],
            stats.logdet[reps, active][:, None],
            stats.theta[reps],
            stats.inverse[reps],
            stats.logdet[reps],
            self.confidence.of(reps),
        )
        separated[np.arange(len(reps)), active] = False  # an agent always uses its own samples
        kept = self.membership[reps, active] & ~separated
        self.membership[reps, active] = kept
        self.membership[reps, :, active] = kept
