"""Tabular episodic MDPs: step-dependent transitions, deterministic rewards, exact values.

The setting of Jin et al. 2018 (UCB Q-learning) and of FedQ (Zheng et al., ICLR 2024, Sec. 2;
Zhang et al., ICML 2025, Sec. 2): S states, A actions, horizon H, transition kernels
P_h(.|x, a) that depend on the step h, deterministic rewards r_h(x, a) in [0, 1], V_{H+1} = 0.
Everything here is exact (backward induction, policy evaluation, gaps); sampling is by inverse
CDF from uniforms the caller draws from the run's streams, so one uniform array gives one
trajectory whichever learner consumes it.

Steps are 0-based in code: index h = 0..H-1 is the papers' step h = 1..H, and value arrays
have H + 1 rows, the last one being V_{H+1} = 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from taciturn.core.message import Message

_TOLERANCE = 1e-9  # on probabilities summing to one


@dataclass(frozen=True)
class TabularMDP:
    transitions: np.ndarray  # (H, S, A, S): P_h(x' | x, a)
    rewards: np.ndarray  # (H, S, A): r_h(x, a) in [0, 1]
    initial: np.ndarray  # (S,): distribution of the first state

    def __post_init__(self) -> None:
        P, r, mu = self.transitions, self.rewards, self.initial
        if P.ndim != 4 or P.shape[1] != P.shape[3]:
            raise ValueError(f"transitions must have shape (H, S, A, S), got {P.shape}")
        H, S, A, _ = P.shape
        if r.shape != (H, S, A):
            raise ValueError(f"rewards must have shape (H, S, A) = {(H, S, A)}, got {r.shape}")
        if mu.shape != (S,):
            raise ValueError(f"initial must have shape (S,) = ({S},), got {mu.shape}")
        if (P < 0).any() or not np.allclose(P.sum(-1), 1.0, atol=_TOLERANCE):
            raise ValueError("every P_h(.|x, a) must be a probability vector (non-negative, summing to 1)")
        if (mu < 0).any() or abs(mu.sum() - 1.0) > _TOLERANCE:
            raise ValueError("initial must be a probability vector (non-negative, summing to 1)")
        if not ((r >= 0) & (r <= 1)).all():
            raise ValueError("rewards must lie in [0, 1] (the regret and bonus constants assume it)")

    horizon = property(lambda self: self.transitions.shape[0])
    states = property(lambda self: self.transitions.shape[1])
    actions = property(lambda self: self.transitions.shape[2])

    # ----- exact values -----
    @cached_property
    def optimal(self) -> tuple[np.ndarray, np.ndarray]:
        """(Q*, V*) by backward induction: V*_{H+1} = 0, Q*_h = r_h + P_h V*_{h+1}, V*_h = max_a Q*_h."""
        H, S, A = self.horizon, self.states, self.actions
        q, v = np.zeros((H, S, A)), np.zeros((H + 1, S))
        for h in reversed(range(H)):
            q[h] = self.rewards[h] + self.transitions[h] @ v[h + 1]
            v[h] = q[h].max(axis=1)
        return q, v

    def policy_values(self, policy: np.ndarray) -> np.ndarray:
        """V^pi (..., H + 1, S) of deterministic policies pi (..., H, S) of action indices, exactly."""
        H, S = self.horizon, self.states
        v = np.zeros((*policy.shape[:-2], H + 1, S))
        rows = np.arange(S)
        for h in reversed(range(H)):
            a = policy[..., h, :]
            kernel = self.transitions[h, rows, a]  # (..., S, S): P_h(.|x, pi_h(x))
            v[..., h, :] = self.rewards[h, rows, a] + (kernel @ v[..., h + 1, :, None])[..., 0]
        return v

    @cached_property
    def gaps(self) -> np.ndarray:
        """Delta_h(x, a) = V*_h(x) - Q*_h(x, a) >= 0 (ICML 2025, Sec. 3)."""
        q, v = self.optimal
        return np.maximum(v[:-1, :, None] - q, 0.0)

    def min_gap(self, tolerance: float = 1e-12) -> float:
        """Delta_min: the smallest strictly positive gap (inf if every action is optimal everywhere).

        Gaps below ``tolerance`` are ties in floating point, not positive gaps.
        """
        positive = self.gaps[self.gaps > tolerance]
        return float(positive.min()) if positive.size else float("inf")

    def occupancy(self, policy: np.ndarray) -> np.ndarray:
        """d_h(x): the probability that pi visits x at step h (H, S)."""
        H, S = self.horizon, self.states
        d = np.zeros((H, S))
        d[0] = self.initial
        rows = np.arange(S)
        for h in range(H - 1):
            d[h + 1] = d[h] @ self.transitions[h, rows, policy[h]]
        return d

    # ----- sampling by inverse CDF -----
    @cached_property
    def _transition_cdf(self) -> np.ndarray:
        return np.cumsum(self.transitions, axis=-1)[..., :-1]  # (H, S, A, S-1): the last bin needs no edge

    @cached_property
    def _initial_cdf(self) -> np.ndarray:
        return np.cumsum(self.initial)[:-1]

    def first_states(self, u: np.ndarray) -> np.ndarray:
        """x_1 for uniforms ``u`` of any shape."""
        return (u[..., None] >= self._initial_cdf).sum(-1)

    def next_states(self, h: int | np.ndarray, x: np.ndarray, a: np.ndarray, u: np.ndarray) -> np.ndarray:
        """x_{h+1} ~ P_h(.|x, a) for uniforms ``u`` (broadcast together)."""
        return (u[..., None] >= self._transition_cdf[h, x, a]).sum(-1)

    def rollout(self, policy: np.ndarray, u: np.ndarray) -> np.ndarray:
        """States x_1..x_{H+1} (shape u.shape) of episodes run with pi; ``u`` is (..., H + 1) uniforms.

        u[..., 0] draws the first state and u[..., h + 1] the transition out of step h.
        """
        states = np.empty(u.shape, dtype=np.int64)
        states[..., 0] = self.first_states(u[..., 0])
        for h in range(self.horizon):
            x = states[..., h]
            states[..., h + 1] = self.next_states(h, x, policy[h, x], u[..., h + 1])
        return states

    # ----- storage through the codec -----
    def to_message(self) -> Message:
        return Message(
            arrays={"transitions": self.transitions, "rewards": self.rewards, "initial": self.initial}
        )

    @classmethod
    def from_message(cls, message: Message) -> TabularMDP:
        names = ("transitions", "rewards", "initial")
        missing = [k for k in names if k not in message.arrays]
        if missing:
            raise ValueError(f"an MDP needs the arrays {', '.join(names)}; missing {', '.join(missing)}")
        return cls(*(np.asarray(message.arrays[k], dtype=np.float64) for k in names))


def random_mdp(states: int, actions: int, horizon: int, rng: np.random.Generator) -> TabularMDP:
    """The generator of the FedQ experiments (ICLR 2024, Sec. 6; ICML 2025, Sec. 6).

    r_h(x, a) ~ U[0, 1] independently, each P_h(.|x, a) uniform on the simplex (Dirichlet(1)),
    and the first state uniform.
    """
    if min(states, actions, horizon) < 1:
        raise ValueError(f"states, actions and horizon must be >= 1, got {states}, {actions}, {horizon}")
    rewards = rng.random((horizon, states, actions))
    transitions = rng.dirichlet(np.ones(states), size=(horizon, states, actions))
    return TabularMDP(transitions, rewards, np.full(states, 1.0 / states))
