"""Statistics of label-defined clusters: the pooled ridge estimate of every cluster at once."""

from __future__ import annotations

import numpy as np

from taciturn.bandits.stats import AgentStats


def cluster_estimates(
    stats: AgentStats, reps: np.ndarray, labels: np.ndarray, num_clusters: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For labels (n, N) of repetitions ``reps``: (members (n, C, N) bool, theta (n, C, d), count (n, C)).

    Cluster c pools its members' samples: V_c = lam*I + sum_{i in c} G_i, b_c = sum_{i in c} b_i.
    """
    members = labels[:, None, :] == np.arange(num_clusters)[None, :, None]
    weights = members.astype(float)
    gram = np.einsum("nci,nide->ncde", weights, stats.gram[reps]) + stats.lam * np.eye(stats.gram.shape[-1])
    b = np.einsum("nci,nid->ncd", weights, stats.b[reps])
    theta = np.linalg.solve(gram, b[..., None])[..., 0]
    return members, theta, np.einsum("nci,ni->nc", members, stats.count[reps])
