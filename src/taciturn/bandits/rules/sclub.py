"""SCLUB: Li, Chen, Li and Leung, "Improved Algorithm on Online Clustering of Bandits", IJCAI 2019.

Clusters are sets of users, initially one set holding everyone. Time is cut into stages, stage s
lasting 2^s steps; at the start of a stage every user is marked unchecked and every cluster j
freezes a pivot (its estimate theta~_j and sample count T~_j). When user i of cluster j is served:

* split: if ||theta_i - theta~_j|| > alpha (F(T_i) + F(T~_j)), i leaves j for a new cluster of its own,
  with F(T) = sqrt((1 + ln(1 + T)) / (1 + T));
* i is marked checked;
* merge: two *checked* clusters (all members checked) j1, j2 with
  ||theta_j1 - theta_j2|| < alpha/2 (F(T_j1) + F(T_j2)) become one.

Users pool their samples within their cluster. Departures from the paper, which we could only read
about second hand: (1) SCLUB also splits and merges on differences of user *frequencies*; agents
act uniformly at random here, so those conditions test nothing and are left out. (2) Pivots are
frozen when a stage's first sample reaches the server, just after that sample is added. A merged
cluster keeps the pivot of the cluster it absorbed the other into until the next stage.
"""

from __future__ import annotations

import numpy as np

from taciturn.bandits.rules.base import SharingRule, same_label
from taciturn.bandits.rules.club import confidence_width
from taciturn.bandits.rules.clusters import cluster_estimates
from taciturn.bandits.stats import AgentStats


def stage_of(step: int) -> int:
    """Stage s covers steps 2^s - 2 ... 2^(s+1) - 3 (0-based): lengths 2, 4, 8, ..."""
    return int(np.log2(step + 2))


class Sclub(SharingRule):
    name = "sclub"
    regroups = True

    def __init__(self, repetitions: int, agents: int, dim: int, alpha: float = 1.0):
        super().__init__(repetitions, agents)
        self.alpha = alpha
        self.labels = np.zeros((repetitions, agents), dtype=np.int64)
        self.checked = np.zeros((repetitions, agents), dtype=bool)
        self.stage = np.zeros(repetitions, dtype=np.int64)
        self.pivot_theta = np.zeros((repetitions, agents, dim))  # indexed by cluster id
        self.pivot_count = np.zeros((repetitions, agents), dtype=np.int64)

    def update(self, stats: AgentStats, reps: np.ndarray, active: np.ndarray, step: int) -> None:
        agents = self.labels.shape[1]
        new_stage = reps[self.stage[reps] != stage_of(step)]
        if len(new_stage):
            _, theta, count = cluster_estimates(stats, new_stage, self.labels[new_stage], agents)
            self.stage[new_stage] = stage_of(step)
            self.checked[new_stage] = False
            self.pivot_theta[new_stage], self.pivot_count[new_stage] = theta, count
        self._split(stats, reps, active)
        self.checked[reps, active] = True
        self._merge(stats, reps)
        self.membership[reps] = same_label(self.labels[reps])

    def _split(self, stats: AgentStats, reps: np.ndarray, active: np.ndarray) -> None:
        cluster = self.labels[reps, active]
        gap = np.linalg.norm(stats.theta[reps, active] - self.pivot_theta[reps, cluster], axis=-1)
        width = confidence_width(stats.count[reps, active]) + confidence_width(
            self.pivot_count[reps, cluster]
        )
        alone = (self.labels[reps] == cluster[:, None]).sum(axis=1) == 1
        for n in np.flatnonzero((gap > self.alpha * width) & ~alone):
            rep, agent = reps[n], active[n]
            new = np.setdiff1d(np.arange(self.labels.shape[1]), self.labels[rep])[0]  # a free cluster id
            self.labels[rep, agent] = new
            self.pivot_theta[rep, new] = stats.theta[rep, agent]
            self.pivot_count[rep, new] = stats.count[rep, agent]

    def _merge(self, stats: AgentStats, reps: np.ndarray) -> None:
        pending = reps
        while len(pending):  # one merge per repetition and pass: estimates change after each
            members, theta, count = cluster_estimates(
                stats, pending, self.labels[pending], self.labels.shape[1]
            )
            checked = members.any(axis=2) & ~(members & ~self.checked[pending][:, None]).any(axis=2)
            width = confidence_width(count)
            close = np.linalg.norm(theta[:, :, None] - theta[:, None], axis=-1) < self.alpha / 2 * (
                width[:, :, None] + width[:, None]
            )
            candidates = np.triu(close & checked[:, :, None] & checked[:, None], k=1)
            found = candidates.any(axis=(1, 2))
            for n in np.flatnonzero(found):
                keep, absorbed = np.argwhere(candidates[n])[0]
                labels = self.labels[pending[n]]
                labels[labels == absorbed] = keep
            pending = pending[found]

    def state(self) -> dict[str, np.ndarray]:
        return {
            "labels": self.labels,
            "checked": self.checked,
            "stage": self.stage,
            "pivot_theta": self.pivot_theta,
            "pivot_count": self.pivot_count,
        }

    def load(self, state: dict[str, np.ndarray]) -> None:
        for name, array in self.state().items():
            array[...] = state[name]
        self.membership[...] = same_label(self.labels)
