"""FedQ's agents in one round: local exploration with the frozen global V until the trigger fires.

ICLR 2024, Algorithm 1, lines 4-9 (the agent side of FedQ-Hoeffding and FedQ-Bernstein):
every agent runs full episodes with the broadcast deterministic policy pi^k and, for each visited
(x_h, a_h = pi_h^k(x_h)), counts the visit n_h^m and sums V_{h+1}^k(x_{h+1}) (and its square, for
Bernstein) with the *frozen* global V^k. At the end of each episode an agent checks whether some
triple reached

    n_h^{m,k}(x, a) = c_h^k(x, a) = max{1, floor(N_h^k(x, a) / (M H (H + 1)))};

if one did it signals the server, which stops every agent: in the synchronous model all agents
have then run the same number n^k of episodes.

Agents run together, vectorised with NumPy, in chunks of episodes. Each agent draws its own
uniforms from its own stream, one row of H + 1 per episode, and a chunk takes consecutive rows,
so how the episodes are chunked never changes a trajectory. Episodes simulated past the trigger
in the last chunk are discarded (they never happened).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from taciturn.rl.mdp import TabularMDP

_EPISODES_PER_CHUNK = 1 << 18  # agent-episodes simulated at once


def trigger_thresholds(counts: np.ndarray, agents: int, horizon: int) -> np.ndarray:
    """c_h^k(x) = max{1, floor(N_h^k(x, pi_h^k(x)) / (M H (H + 1)))} (ICLR 2024, Eq. (4))."""
    return np.maximum(1, counts // (agents * horizon * (horizon + 1)))


@dataclass
class LocalStats:
    """What each agent gathered in one round (agent-major arrays)."""

    episodes: int  # n^k: episodes run by every agent
    counts: np.ndarray  # (M, H, S) visits n_h^m(x, pi_h(x))
    next_value_sums: np.ndarray  # (M, H, S) sum of V_{h+1}^k(x_{h+1}) over those visits
    next_value_square_sums: np.ndarray  # (M, H, S) sum of V_{h+1}^k(x_{h+1})^2
    first_states: np.ndarray  # (M, S) how often each agent started an episode in each state
    fired: np.ndarray  # (M,) agents whose trigger fired at the last episode (none: the budget ended it)


def explore(
    mdp: TabularMDP,
    policy: np.ndarray,
    value: np.ndarray,
    thresholds: np.ndarray,
    rngs: list[np.random.Generator],
    max_episodes: int,
) -> LocalStats:
    """Run the agents of ``rngs`` in lockstep until a trigger fires or ``max_episodes`` have run.

    ``policy`` (H, S) and ``value`` (H, S) are the broadcast pi^k and V^k (V_{H+1} = 0 is implied);
    ``thresholds`` (H, S) are the trigger counts c_h^k(x).
    """
    H, S, M = mdp.horizon, mdp.states, len(rngs)
    next_value = np.vstack([value[1:], np.zeros((1, S))])  # V_{h+1}^k for h = 1..H
    counts = np.zeros((M, H, S), dtype=np.int64)
    sums = np.zeros(M * H * S)
    square_sums = np.zeros(M * H * S)
    first = np.zeros(M * S, dtype=np.int64)
    cell_of = (np.arange(M)[:, None] * H + np.arange(H)) * S  # (M, H): offset of (m, h) in a flat (M, H, S)
    cap = max(1, _EPISODES_PER_CHUNK // M)
    chunk = min(_first_chunk(mdp, policy, thresholds), cap)
    done = 0
    fired = np.zeros(M, dtype=bool)
    while done < max_episodes and not fired.any():
        size = min(chunk, max_episodes - done)
        u = np.stack([g.random((size, H + 1)) for g in rngs], axis=1)  # (E, M, H + 1)
        states = mdp.rollout(policy, u)
        cells = cell_of + states[..., :H]  # (E, M, H): the flat (m, h, x_h) of every visit
        reached = counts + np.bincount(cells.ravel(), minlength=M * H * S).reshape(M, H, S) >= thresholds
        if reached.any():  # cut the chunk after the first episode at which a count hit its threshold
            size, fired = _first_trigger(states[..., :H], counts, thresholds, reached)
            states, cells = states[:size], cells[:size]
        visits = cells.ravel()
        seen = next_value[np.arange(H), states[..., 1:]].ravel()  # V_{h+1}^k(x_{h+1}) of every visit
        counts += np.bincount(visits, minlength=M * H * S).reshape(M, H, S)
        sums += np.bincount(visits, weights=seen, minlength=M * H * S)
        square_sums += np.bincount(visits, weights=seen * seen, minlength=M * H * S)
        first += np.bincount((np.arange(M) * S + states[..., 0]).ravel(), minlength=M * S)
        done += size
        chunk = min(2 * chunk, cap)
    shape = (M, H, S)
    return LocalStats(
        done, counts, sums.reshape(shape), square_sums.reshape(shape), first.reshape(M, S), fired
    )


def _first_trigger(
    xs: np.ndarray, counts: np.ndarray, thresholds: np.ndarray, reached: np.ndarray
) -> tuple[int, np.ndarray]:
    """(episodes until the first trigger, agents that fired then) within a chunk of visits xs (E, M, H).

    Only the cells that reach their threshold somewhere in the chunk are followed episode by episode.
    """
    m, h, x = np.nonzero(reached)
    need = (np.broadcast_to(thresholds, counts.shape) - counts)[m, h, x]  # visits still missing, >= 1
    running = np.cumsum(xs[:, m, h] == x, axis=0)  # (E, K) visits of each followed cell so far
    at = (running >= need).argmax(axis=0)  # the episode (0-based) at which each cell reaches it
    size = int(at.min()) + 1
    fired = np.zeros(counts.shape[0], dtype=bool)
    fired[m[at == size - 1]] = True
    return size, fired


def _first_chunk(mdp: TabularMDP, policy: np.ndarray, thresholds: np.ndarray) -> int:
    """A guess of the round's length (the trigger cell reaches c after about c / d_h(x) episodes).

    Only the simulation's speed depends on it: too short costs another chunk, too long wastes
    the episodes simulated past the trigger.
    """
    occupancy = mdp.occupancy(policy)
    with np.errstate(divide="ignore"):
        expected = np.where(occupancy > 0, thresholds / occupancy, np.inf).min()
    return int(max(8, min(expected, 1e9)))
