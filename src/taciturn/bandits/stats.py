"""Per-agent ridge statistics of a batch of independent runs, kept where the sharing rule runs.

Arrays carry a leading repetition axis (independent runs simulated together) and an agent axis:
``gram`` (R, N, d, d) is the Gram matrix of an agent's own samples (without the lam*I), ``b``
(R, N, d) the reward-weighted sum, ``count`` (R, N) the number of samples. The ridge quantities
every rule reads (V^-1, theta_hat, log det V with V = lam*I + gram) are cached and recomputed
from scratch, never by rank-one updates, so a checkpoint needs only gram, b and count.
"""

from __future__ import annotations

import numpy as np

from taciturn.bandits.linucb import ridge


class AgentStats:
    def __init__(self, repetitions: int, agents: int, dim: int, lam: float):
        self.lam = lam
        self.gram = np.zeros((repetitions, agents, dim, dim))
        self.b = np.zeros((repetitions, agents, dim))
        self.count = np.zeros((repetitions, agents), dtype=np.int64)
        self.inverse = np.broadcast_to(np.eye(dim) / lam, self.gram.shape).copy()
        self.theta = np.zeros_like(self.b)
        self.logdet = np.full((repetitions, agents), dim * np.log(lam))

    def add(self, reps: np.ndarray, agents: np.ndarray, x: np.ndarray, reward: np.ndarray) -> None:
        """Add one sample (x (n, d), reward (n,)) to agent ``agents[k]`` of repetition ``reps[k]``."""
        self.gram[reps, agents] += x[:, :, None] * x[:, None, :]
        self.b[reps, agents] += reward[:, None] * x
        self.count[reps, agents] += 1
        self._refresh(reps, agents)

    def regularised(self, reps: np.ndarray | slice = slice(None), agents: np.ndarray | slice = slice(None)):
        return self.gram[reps, agents] + self.lam * np.eye(self.gram.shape[-1])

    def _refresh(self, reps, agents) -> None:
        inverse, theta, logdet = ridge(self.regularised(reps, agents), self.b[reps, agents])
        self.inverse[reps, agents], self.theta[reps, agents], self.logdet[reps, agents] = (
            inverse,
            theta,
            logdet,
        )

    def state(self) -> dict[str, np.ndarray]:
        return {"gram": self.gram, "b": self.b, "count": self.count}

    def load(self, state: dict[str, np.ndarray]) -> None:
        self.gram[...], self.b[...], self.count[...] = state["gram"], state["b"], state["count"]
        self._refresh(slice(None), slice(None))
