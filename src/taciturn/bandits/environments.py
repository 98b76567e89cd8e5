"""Multi-agent bandit environments with a finite arm set and Gaussian (sub-Gaussian) noise.

N agents face the same K arms x_k in R^d; agent i pulling arm k receives means[i, k] + noise,
noise ~ N(0, sigma^2) (sigma-sub-Gaussian). In a linear environment means = Theta X^T with one
unknown parameter theta_i per agent; the ratings environment (ratings.py) uses a completed
ratings matrix as ``means``, which a linear model of the item features only approximates.
Pseudo-regret counts max_k means[i, k] - means[i, pulled]: noise-free, as in the BASS paper.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Environment:
    arms: np.ndarray  # (K, d) arm features
    means: np.ndarray  # (N, K) expected reward of each arm for each agent
    noise: float  # standard deviation of the Gaussian reward noise
    thetas: np.ndarray  # (N, d) true parameters, or the least-squares fit of ``means`` on ``arms``
    labels: np.ndarray | None  # (N,) true cluster of each agent; None when unknown

    def __post_init__(self) -> None:
        agents, arms = self.means.shape
        if self.arms.shape[0] != arms or self.thetas.shape != (agents, self.arms.shape[1]):
            raise ValueError(
                f"inconsistent shapes: arms {self.arms.shape}, means {self.means.shape}, "
                f"thetas {self.thetas.shape}"
            )
        if self.labels is not None and self.labels.shape != (agents,):
            raise ValueError(f"labels must have shape ({agents},), got {self.labels.shape}")

    num_agents = property(lambda self: self.means.shape[0])
    num_arms = property(lambda self: self.means.shape[1])
    dim = property(lambda self: self.arms.shape[1])

    @property
    def best(self) -> np.ndarray:
        """(N,) the best expected reward of each agent."""
        return self.means.max(axis=1)

    @property
    def norm_bound(self) -> float:
        """max_i ||theta_i||: the S of the confidence bounds (bandpy sets S the same way)."""
        return float(np.linalg.norm(self.thetas, axis=1).max())

    @property
    def num_clusters(self) -> int | None:
        return None if self.labels is None else len(np.unique(self.labels))


def linear(arms: np.ndarray, thetas: np.ndarray, noise: float, labels: np.ndarray | None) -> Environment:
    return Environment(arms, thetas @ arms.T, noise, thetas, labels)


def clustered(
    rng: np.random.Generator, num_agents: int, num_arms: int, dim: int, num_clusters: int, noise: float
) -> Environment:
    """The BASS / bandpy synthetic benchmark: arms x_k ~ N(0, I_d), one parameter theta_c ~ N(0, I_d)
    per cluster; agent i belongs to cluster i mod C (so N < C leaves C - N clusters empty)."""
    arms = rng.standard_normal((num_arms, dim))
    centres = rng.standard_normal((num_clusters, dim))
    labels = np.arange(num_agents) % num_clusters
    return linear(arms, centres[labels], noise, labels)


def unclustered(
    rng: np.random.Generator, num_agents: int, num_arms: int, dim: int, spread: float, noise: float
) -> Environment:
    """No cluster structure: theta_i = mu + spread * xi_i with mu, xi_i ~ N(0, I_d), all distinct.

    Agents are related (a common mean) but no two are equal, the case BASS is built for: pooling
    helps while the bias ||theta_i - theta_j|| hides under the estimation uncertainty, then hurts.
    Every agent is its own cluster, so oracle clustering is independent LinUCB here.
    """
    arms = rng.standard_normal((num_arms, dim))
    thetas = rng.standard_normal(dim) + spread * rng.standard_normal((num_agents, dim))
    return linear(arms, thetas, noise, np.arange(num_agents))
