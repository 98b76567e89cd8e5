"""Rules whose pools never change: independent LinUCB, one pooled LinUCB, oracle clustering.

These are the reference points of the BASS paper and of bandpy (``Decentralized``,
``SingleCluster``, ``OracleClustering``): sharing nothing, sharing everything, and sharing exactly
within the true clusters.
"""

from __future__ import annotations

import numpy as np

from taciturn.bandits.rules.base import SharingRule, same_label
from taciturn.bandits.stats import AgentStats


class FixedRule(SharingRule):
    def update(self, stats: AgentStats, reps: np.ndarray, active: np.ndarray, step: int) -> None:
        pass  # the pools are given, not learnt


class Independent(FixedRule):
    """One LinUCB per agent on its own samples."""

    name = "independent"

    def __init__(self, repetitions: int, agents: int):
        super().__init__(repetitions, agents)
        self.membership[...] = np.eye(agents, dtype=bool)


class Pooled(FixedRule):
    """One LinUCB for all agents: every agent uses every sample."""

    name = "pooled"


class Oracle(FixedRule):
    """LinUCB pooled within the true clusters (labels known in advance)."""

    name = "oracle"

    def __init__(self, labels: np.ndarray):
        super().__init__(*labels.shape)
        self.membership[...] = same_label(labels)
