"""DynUCB: Nguyen and Lauw, "Dynamic Clustering of Contextual Multi-Armed Bandits", CIKM 2014.

The number of clusters K is given. Agents start in random clusters; a cluster's estimate pools
its members' samples (V_k = lam*I + sum G_i, b_k = sum b_i). When agent i has been served and
its own estimate updated, i moves to the cluster whose estimate is nearest: argmin_k ||theta_i - theta_k||.
Agents pool their samples within their cluster.

bandpy's ``DynUCB`` recomputes a cluster's estimate only when an agent joins or leaves it, so its
estimates go stale between moves; following the paper, ours always pool the members' current data.
"""

from __future__ import annotations

import numpy as np

from taciturn.bandits.rules.base import SharingRule, same_label
from taciturn.bandits.rules.clusters import cluster_estimates
from taciturn.bandits.stats import AgentStats


class DynUcb(SharingRule):
    name = "dynucb"
    regroups = True

    def __init__(self, initial_labels: np.ndarray, num_clusters: int):
        super().__init__(*initial_labels.shape)
        if initial_labels.min() < 0 or initial_labels.max() >= num_clusters:
            raise ValueError(f"initial labels must lie in [0, {num_clusters})")
        self.num_clusters = num_clusters
        self.labels = initial_labels.astype(np.int64).copy()
        self.membership[...] = same_label(self.labels)

    def update(self, stats: AgentStats, reps: np.ndarray, active: np.ndarray, step: int) -> None:
        _, theta, _ = cluster_estimates(stats, reps, self.labels[reps], self.num_clusters)
        distance = np.linalg.norm(stats.theta[reps, active][:, None] - theta, axis=-1)
        self.labels[reps, active] = np.argmin(distance, axis=1)
        self.membership[reps] = same_label(self.labels[reps])

    def state(self) -> dict[str, np.ndarray]:
        return {"labels": self.labels}

    def load(self, state: dict[str, np.ndarray]) -> None:
        self.labels[...] = state["labels"]
        self.membership[...] = same_label(self.labels)
