"""FedQ-Hoeffding and FedQ-Bernstein: the server, and the messages it exchanges with the agents.

Zheng, Gao, Xue, Yang, "Federated Q-Learning: Linear Regret Speedup with Low Communication Cost",
ICLR 2024 (arXiv 2312.15023), Algorithms 1 and 2; their gap-dependent analysis is Zhang, Zheng,
Xue, "Gap-Dependent Bounds for Federated Q-Learning", ICML 2025 (arXiv 2502.02859).

Round k:
  1. broadcast   pi^k, {N_h^k(x, pi_h^k(x))}, {V_h^k(x)}: 3SH scalars          (``broadcast``)
  2. agents explore with pi^k and the frozen V^k until the visit-count trigger  (rl/agents.py)
  3. upload      per agent, for every (x, h) with a = pi_h^k(x): r_h(x, a),
                 n_h^{m,k}(x, a) and the mean of V_{h+1}^k(next state): 3SH scalars
                 (+ the mean of its square for Bernstein: 4SH)                   (``upload``)
  4. aggregate   for the triples with a = pi_h^k(x) and n^k > 0, with t^{k-1} = N_h^k,
                 t^k = t^{k-1} + n^k and alpha_agg = 1 - alpha^c(t^{k-1} + 1, t^k):
     case 1, N_h^k < i0 = 2 M H (H + 1): every visiting agent brought one sample; in agent order
        Q <- (1 - alpha_agg) Q + alpha_agg r + sum_{i=1}^{n} theta_{t^k}^{t^{k-1}+i} v^{m_i} + beta/2,
        which is single-agent Q-learning run over the samples one by one;
     case 2, N_h^k >= i0: equal-weight aggregation, v_bar = sum_m n^m v^m / n^k,
        Q <- (1 - alpha_agg) Q + alpha_agg (r + v_bar) + beta/2;
     beta/2 = sum_{t=t^{k-1}+1}^{t^k} theta_{t^k}^t b_t (Hoeffding) or
     (beta_{t^k} - alpha^c(t^{k-1} + 1, t^k) beta_{t^{k-1}}) / 2 (Bernstein, beta_t of Eq. (8) with
     the variance W = W1 / N - (W2 / N)^2 of all next-state values so far); then
     V_h^{k+1}(x) = min{H, max_a Q_h^{k+1}(x, a)}, pi_h^{k+1}(x) = argmax_a Q_h^{k+1}(x, a).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from taciturn.core.message import Message
from taciturn.rl import bonuses
from taciturn.rl.step_sizes import alpha_c, theta

Bonus = Literal["hoeffding", "bernstein"]


@dataclass
class FedQState:
    """The server's state per (h, x, a): Q, the visit count N and, for Bernstein, beta_N, W1, W2."""

    q: np.ndarray  # (H, S, A)
    visits: np.ndarray  # (H, S, A) int64
    beta: np.ndarray | None = None  # Bernstein beta_{N} at the last update
    square_sum: np.ndarray | None = None  # Bernstein W1: sum of V_{h+1}(next)^2 over all samples
    value_sum: np.ndarray | None = None  # Bernstein W2: sum of V_{h+1}(next)


@dataclass(frozen=True)
class Aggregation:
    """What one aggregation did: triples updated by each case, states whose greedy action changed."""

    case1: int
    case2: int
    policy_changes: int


@dataclass(frozen=True)
class FedQ:
    horizon: int
    states: int
    actions: int
    agents: int
    bonus: Bonus = "hoeffding"
    c: float = 1.0  # bonus constant (c for Hoeffding, c' for Bernstein); the papers' experiments use 1
    iota: float = 1.0  # the log factor iota; the papers' experiments use 1

    def __post_init__(self) -> None:
        if min(self.horizon, self.states, self.actions, self.agents) < 1:
            raise ValueError("horizon, states, actions and agents must all be >= 1")
        if self.bonus not in ("hoeffding", "bernstein"):
            raise ValueError(f"bonus must be 'hoeffding' or 'bernstein', got {self.bonus!r}")

    @property
    def case_threshold(self) -> int:
        """i0 = 2 M H (H + 1): below it a triple is updated sample by sample (case 1)."""
        return 2 * self.agents * self.horizon * (self.horizon + 1)

    # ----- state -----
    def init(self) -> FedQState:
        """Q^1 = V^1 = H, N^1 = 0 (pi^1 = argmax of a constant Q: action 0 everywhere)."""
        shape = (self.horizon, self.states, self.actions)
        zeros = (lambda: np.zeros(shape)) if self.bonus == "bernstein" else (lambda: None)
        return FedQState(
            np.full(shape, float(self.horizon)), np.zeros(shape, dtype=np.int64), zeros(), zeros(), zeros()
        )

    @staticmethod
    def policy(state: FedQState) -> np.ndarray:
        """pi_h(x) = argmax_a Q_h(x, a) (the first maximiser on ties), shape (H, S)."""
        return state.q.argmax(axis=-1)

    def values(self, state: FedQState) -> np.ndarray:
        """V_h(x) = min{H, max_a Q_h(x, a)}, shape (H, S)."""
        return np.minimum(float(self.horizon), state.q.max(axis=-1))

    # ----- messages -----
    def broadcast(self, state: FedQState) -> Message:
        """pi^k, N^k under pi^k and V^k: 3SH scalars.

        V_1 is sent although agents only use V_2..V_H: the paper's protocol (and its 3SH count).
        """
        policy = self.policy(state)
        counts = np.take_along_axis(state.visits, policy[..., None], axis=-1)[..., 0]
        return Message(
            arrays={"policy": policy.astype(np.int32), "count": counts, "value": self.values(state)}
        )

    def upload(
        self, reward: np.ndarray, count: np.ndarray, value_sum: np.ndarray, square_sum: np.ndarray
    ) -> Message:
        """One agent's round: r_h(x, pi_h(x)), n_h^m and the mean next value (and its mean square).

        Arrays are (H, S) over every (x, h), visited or not (zeros where n = 0): 3SH or 4SH scalars.
        """
        visited = count > 0
        mean = np.divide(value_sum, count, out=np.zeros(count.shape), where=visited)
        arrays = {"reward": np.where(visited, reward, 0.0), "count": count, "next_value": mean}
        if self.bonus == "bernstein":
            arrays["next_value_sq"] = np.divide(square_sum, count, out=np.zeros(count.shape), where=visited)
        return Message(arrays=arrays)

    # ----- aggregation -----
    def aggregate(self, state: FedQState, uploads: Mapping[int, Message]) -> tuple[FedQState, Aggregation]:
        """The server's update from the uploads that arrived, keyed by agent id."""
        H = self.horizon
        agents = sorted(uploads)  # case 1 applies the samples in agent order m_1 < ... < m_n
        if not agents:
            return state, Aggregation(0, 0, 0)
        n_m = np.stack([uploads[m].arrays["count"] for m in agents]).astype(np.int64)  # (M', H, S)
        v_m = np.stack([uploads[m].arrays["next_value"] for m in agents])
        r_m = np.stack([uploads[m].arrays["reward"] for m in agents])
        n = n_m.sum(axis=0)
        hs, xs = np.nonzero(n > 0)
        policy = self.policy(state)
        cell = (hs, xs, policy[hs, xs])
        t0 = state.visits[cell]
        t1 = t0 + n[hs, xs]
        n_m, v_m = n_m[:, hs, xs], v_m[:, hs, xs]  # (M', K) for the K updated triples
        reward = (n_m * r_m[:, hs, xs]).sum(axis=0) / n[hs, xs]  # deterministic rewards: all equal
        keep = alpha_c(t0 + 1, t1, H)  # alpha^c(t^{k-1} + 1, t^k) = 1 - alpha_agg

        case1 = t0 < self.case_threshold
        if (n_m[:, case1] > 1).any():
            raise AssertionError("case 1 needs at most one sample per agent: the trigger was not respected")
        rank = np.cumsum(n_m, axis=0)  # in case 1, the i of agent m_i among the visiting agents
        sequential = (np.where(n_m > 0, theta(t0 + rank, t1, H), 0.0) * v_m).sum(axis=0)
        equal_weight = (1 - keep) * (n_m * v_m).sum(axis=0) / n[hs, xs]
        next_term = np.where(case1, sequential, equal_weight)

        new = replace(state, q=state.q.copy(), visits=state.visits.copy())
        if self.bonus == "hoeffding":
            half_beta = bonuses.hoeffding_round(t0, t1, H, self.c, self.iota)
        else:
            half_beta = self._bernstein_update(new, uploads, agents, cell, n_m, v_m, t0, t1, keep)
        new.q[cell] = keep * state.q[cell] + (1 - keep) * reward + next_term + half_beta
        new.visits[cell] = t1
        changes = int((self.policy(new) != policy).sum())
        return new, Aggregation(int(case1.sum()), int((~case1).sum()), changes)

    def _bernstein_update(self, new, uploads, agents, cell, n_m, v_m, t0, t1, keep) -> np.ndarray:
        """W1 += sum_m n^m mu^m, W2 += sum_m n^m v^m; return (beta_{t^k} - alpha^c beta_{t^{k-1}}) / 2."""
        hs, xs, _ = cell
        mu_m = np.stack([uploads[m].arrays["next_value_sq"] for m in agents])[:, hs, xs]
        new.square_sum, new.value_sum, new.beta = new.square_sum.copy(), new.value_sum.copy(), new.beta.copy()
        new.square_sum[cell] += (n_m * mu_m).sum(axis=0)
        new.value_sum[cell] += (n_m * v_m).sum(axis=0)
        variance = np.maximum(new.square_sum[cell] / t1 - (new.value_sum[cell] / t1) ** 2, 0.0)
        burn_in = bonuses.fedq_burn_in(self.horizon, self.states, self.actions, self.agents)
        beta = bonuses.bernstein(t1, variance, self.horizon, burn_in, self.c, self.iota)
        half_beta = (beta - keep * new.beta[cell]) / 2
        new.beta[cell] = beta
        return half_beta
