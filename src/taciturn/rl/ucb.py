"""Single-agent Q-learning with UCB-Hoeffding or UCB-Bernstein bonuses: the FedQ papers' baselines.

Jin, Allen-Zhu, Bubeck, Jordan, "Is Q-learning provably efficient?", NeurIPS 2018, Algorithms 1-2.
At step h of an episode: a_h = argmax_a Q_h(x_h, a), observe x_{h+1}, t = N_h(x_h, a_h) += 1 and

    Q_h(x_h, a_h) <- (1 - alpha_t) Q_h(x_h, a_h) + alpha_t [r_h(x_h, a_h) + V_{h+1}(x_{h+1}) + b_t]
    V_h(x_h)      <- min{H, max_a Q_h(x_h, a)}

with b_t = c sqrt(H^3 iota / t) (Hoeffding) or b_t = (beta_t - (1 - alpha_t) beta_{t-1}) / (2 alpha_t)
(Bernstein, beta_t of rl/bonuses.py with W_t the variance of the t next-state values V_{h+1}(x_{h+1})
seen at (x, a, h), the current one included).

The update at step h changes only Q_h and V_h, which no later step of the same episode reads
(step h' > h acts on Q_{h'} and bootstraps on V_{h'+1}). So an episode is the rollout of the policy
greedy at its start followed by its H updates at once, each reading the V of the episode's start:
exactly Jin et al.'s step-by-step order. Many independent runs ("paths", the papers' sample
paths) on one MDP advance together as a batch.
"""

from __future__ import annotations

import numpy as np

from taciturn.core.rng import Streams
from taciturn.rl import bonuses
from taciturn.rl.fedq import Bonus
from taciturn.rl.mdp import TabularMDP
from taciturn.rl.step_sizes import alpha

_BLOCK = 4096  # episodes of uniforms drawn at once per path


class UCBQLearning:
    def __init__(
        self, mdp: TabularMDP, paths: int = 1, bonus: Bonus = "hoeffding", c: float = 1.0, iota: float = 1.0
    ):
        if bonus not in ("hoeffding", "bernstein"):
            raise ValueError(f"bonus must be 'hoeffding' or 'bernstein', got {bonus!r}")
        H, S, A = mdp.horizon, mdp.states, mdp.actions
        self.mdp, self.paths, self.bonus, self.c, self.iota = mdp, paths, bonus, c, iota
        self.q = np.full((paths, H, S, A), float(H))
        self.visits = np.zeros((paths, H, S, A), dtype=np.int64)
        self.value = np.zeros((paths, H + 1, S))
        self.value[:, :H] = H
        self.policy = np.zeros(
            (paths, H, S), dtype=np.int64
        )  # greedy in Q (first maximiser): argmax of Q^1 = H
        if bonus == "bernstein":
            self.burn_in = bonuses.jin_burn_in(H, S, A)
            self.beta = np.zeros((paths, H, S, A))
            self.square_sum = np.zeros((paths, H, S, A))
            self.value_sum = np.zeros((paths, H, S, A))

    def episode(self, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Play one episode on every path with uniforms ``u`` (P, H + 1).

        Returns the states (P, H + 1) and which paths' greedy policy the updates changed (P,).
        """
        mdp, H = self.mdp, self.mdp.horizon
        paths = np.arange(self.paths)
        states = np.empty(u.shape, dtype=np.int64)
        states[:, 0] = mdp.first_states(u[:, 0])
        for step in range(H):  # the same inverse-CDF draws as TabularMDP.rollout
            x = states[:, step]
            states[:, step + 1] = mdp.next_states(step, x, self.policy[paths, step, x], u[:, step + 1])
        p, h = paths[:, None], np.arange(H)
        x, x_next = states[:, :H], states[:, 1:]
        a = self.policy[p, h, x]
        cell = (p, h, x, a)
        self.visits[cell] += 1
        t = self.visits[cell]
        next_value = self.value[p, h + 1, x_next]
        step = alpha(t, H)
        if self.bonus == "hoeffding":
            bonus = bonuses.hoeffding(t, H, self.c, self.iota)
        else:
            self.square_sum[cell] += next_value**2
            self.value_sum[cell] += next_value
            variance = np.maximum(self.square_sum[cell] / t - (self.value_sum[cell] / t) ** 2, 0.0)
            beta = bonuses.bernstein(t, variance, H, self.burn_in, self.c, self.iota)
            bonus = (beta - (1 - step) * self.beta[cell]) / (2 * step)
            self.beta[cell] = beta
        self.q[cell] = (1 - step) * self.q[cell] + step * (mdp.rewards[h, x, a] + next_value + bonus)
        row = self.q[p, h, x]  # (P, H, A): Q_h(x_h, .) after the update
        self.value[p, h, x] = np.minimum(float(H), row.max(axis=-1))
        greedy = row.argmax(axis=-1)
        self.policy[p, h, x] = greedy
        return states, (greedy != a).any(axis=1)


def run(learner: UCBQLearning, episodes: int, streams: list[Streams], record_at: np.ndarray) -> np.ndarray:
    """Play ``episodes`` episodes on every path; return the exact cumulative regret (P, len(record_at)).

    Path p draws its uniforms from ``streams[p]`` (its single agent 0, purpose "episodes", keyed by
    the block of episodes), so a path's numbers do not depend on which other paths share the batch. Regret
    adds V*_1(x_1) - V^{pi_j}_1(x_1) per episode j, with V^{pi_j} re-evaluated whenever a path's
    greedy policy changed.
    """
    mdp, P = learner.mdp, learner.paths
    if len(streams) != P:
        raise ValueError(f"one Streams per path: got {len(streams)} for {P} paths")
    record_at = np.asarray(record_at, dtype=np.int64)
    optimal_first = mdp.optimal[1][0]
    gap = optimal_first - mdp.policy_values(learner.policy)[:, 0]  # (P, S): V*_1 - V^pi_1
    paths = np.arange(P)
    regret = np.zeros(P)
    out = np.zeros((P, len(record_at)))
    next_record = 0
    for block_start in range(0, episodes, _BLOCK):
        size = min(_BLOCK, episodes - block_start)
        block = block_start // _BLOCK
        draws = [s.numpy(block, 0, "episodes").random((size, mdp.horizon + 1)) for s in streams]  # agent 0
        u = np.stack(draws, axis=1)
        for j in range(size):
            states, changed = learner.episode(u[j])
            regret += gap[paths, states[:, 0]]
            if changed.any():
                gap[changed] = optimal_first - mdp.policy_values(learner.policy[changed])[:, 0]
            done = block_start + j + 1
            while next_record < len(record_at) and record_at[next_record] == done:
                out[:, next_record] = regret
                next_record += 1
    return out
