"""Run a sharing rule on a batch of independent runs, one agent acting per step.

The protocol is asynchronous, as in the BASS paper and bandpy: at each step one agent, drawn
uniformly at random, pulls an arm with LinUCB on its pool (the samples of the agents whose data it
uses), observes the reward, and shares the sample through the Exchange; the server updates that
agent's statistics and the sharing rule. Everything is vectorised over the repetition axis: R
independent runs (seeds) advance together, each with its own environment, schedule, noise and
channel, and with numbers identical to running them one at a time.

All methods of a setting see the same environments, schedules and noise (common random numbers),
so their differences come from how they share, not from luck.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from taciturn.bandits.environments import Environment
from taciturn.bandits.exchange import Exchange
from taciturn.bandits.linucb import Confidence, ucb_choice
from taciturn.bandits.metrics import pair_f1
from taciturn.bandits.rules.base import SharingRule
from taciturn.bandits.stats import AgentStats
from taciturn.core.rng import SERVER, Streams


@dataclass(frozen=True)
class Problem:
    """R independent runs of one setting: per repetition an environment and its random draws."""

    arms: np.ndarray  # (R, K, d)
    means: np.ndarray  # (R, N, K)
    labels: np.ndarray | None  # (R, N), None when some environment's clusters are unknown
    schedule: np.ndarray  # (R, T) the agent acting at each step
    noise: np.ndarray  # (R, T) the reward noise at each step
    seeds: tuple[int, ...]

    @classmethod
    def build(cls, environments: list[Environment], seeds: list[int], horizon: int) -> Problem:
        """Schedules and noise come from each run's seeded streams (purposes "schedule", "noise")."""
        if len(environments) != len(seeds):
            raise ValueError(f"{len(environments)} environments for {len(seeds)} seeds")
        streams = [Streams(seed) for seed in seeds]
        agents = environments[0].num_agents
        return cls(
            arms=np.stack([env.arms for env in environments]),
            means=np.stack([env.means for env in environments]),
            labels=None
            if any(env.labels is None for env in environments)
            else np.stack([env.labels for env in environments]),
            schedule=np.stack(
                [s.numpy(0, SERVER, "schedule").integers(agents, size=horizon) for s in streams]
            ),
            noise=np.stack(
                [
                    env.noise * s.numpy(0, SERVER, "noise").standard_normal(horizon)
                    for env, s in zip(environments, streams, strict=True)
                ]
            ),
            seeds=tuple(seeds),
        )

    repetitions = property(lambda self: self.means.shape[0])
    agents = property(lambda self: self.means.shape[1])
    dim = property(lambda self: self.arms.shape[2])
    horizon = property(lambda self: self.schedule.shape[1])


class Simulation:
    def __init__(self, problem: Problem, rule: SharingRule, confidence: Confidence, exchange: Exchange):
        self.problem, self.rule, self.confidence, self.exchange = problem, rule, confidence, exchange
        reps, agents, dim = problem.repetitions, problem.agents, problem.dim
        self.stats = AgentStats(reps, agents, dim, confidence.lam)  # at the server
        self.pool_gram = np.broadcast_to(confidence.lam * np.eye(dim), (reps, agents, dim, dim)).copy()
        self.pool_b = np.zeros((reps, agents, dim))  # each agent's copy of its pool
        self.regret = np.zeros(reps)
        self.best = problem.means.max(axis=2)
        self.step = 0
        self._reps = np.arange(reps)

    def advance(self, steps: int) -> None:
        for _ in range(min(steps, self.problem.horizon - self.step)):
            self._act()
            self.step += 1

    def _act(self) -> None:
        p, t, reps = self.problem, self.step, self._reps
        agent = p.schedule[:, t]
        arm = ucb_choice(self.pool_gram[reps, agent], self.pool_b[reps, agent], p.arms, self.confidence)
        x = p.arms[reps, arm]
        mean = p.means[reps, agent, arm]
        reward = mean + p.noise[:, t]
        self.regret += self.best[reps, agent] - mean
        self.pool_gram[reps, agent] += x[:, :, None] * x[:, None, :]
        self.pool_b[reps, agent] += reward[:, None] * x
        self._share(t, agent, x, reward)

    def _share(self, t: int, agent: np.ndarray, x: np.ndarray, reward: np.ndarray) -> None:
        rule = self.rule
        if rule.regroups:
            uploading = self._reps
        else:  # pools only shrink: a sample nobody else uses never needs to leave its agent
            uploading = np.flatnonzero(rule.membership[self._reps, :, agent].sum(axis=1) > 1)
        received, samples = [], []
        for rep in uploading:
            sample = self.exchange.upload(t, rep, agent[rep], x[rep], reward[rep])
            if sample is not None:
                received.append(rep)
                samples.append(sample)
        if not received:
            return
        received, samples = np.array(received), np.array(samples)
        self.stats.add(received, agent[received], samples[:, :-1], samples[:, -1])
        before = rule.membership[received].copy()
        rule.update(self.stats, received, agent[received], t)
        after = rule.membership[received]
        changed = (before != after).any(axis=2)  # agents whose pool changed get it anew
        for n, rep in enumerate(received):
            for j in np.flatnonzero(changed[n]):
                self._send_pool(t, rep, j, after[n, j])
            users = np.flatnonzero(after[n, :, agent[rep]] & ~changed[n])
            reached, arrived = self.exchange.forward(t, rep, users[users != agent[rep]])
            if reached:
                self.pool_gram[rep, reached] += np.outer(arrived[:-1], arrived[:-1])
                self.pool_b[rep, reached] += arrived[-1] * arrived[:-1]

    def _send_pool(self, t: int, rep: int, agent: int, uses: np.ndarray) -> None:
        gram = self.stats.gram[rep, uses].sum(axis=0) + self.confidence.lam * np.eye(self.problem.dim)
        arrived = self.exchange.send_pool(t, rep, agent, gram, self.stats.b[rep, uses].sum(axis=0))
        if arrived is not None:
            self.pool_gram[rep, agent], self.pool_b[rep, agent] = arrived

    def record(self) -> tuple[dict, list[list[dict]]]:
        """Numbers per repetition after ``step`` steps, and the ledger rows since the last record."""
        ledger_rows = self.exchange.close_block()
        up, down = self.exchange.traffic[:, 0], self.exchange.traffic[:, 1]
        row = {
            "t": self.step,
            "regret": self.regret.tolist(),
            "bytes_up": up[:, 2].tolist(),
            "bytes_down": down[:, 2].tolist(),
            "messages_up": up[:, 0].tolist(),
            "messages_down": down[:, 0].tolist(),
            "delivered_up": up[:, 1].tolist(),
            "delivered_down": down[:, 1].tolist(),
            "f1": None
            if self.problem.labels is None
            else pair_f1(self.rule.membership, self.problem.labels).tolist(),
        }
        return row, ledger_rows

    def state(self) -> dict[str, np.ndarray]:
        return {
            "step": np.array(self.step),
            "regret": self.regret,
            "pool_gram": self.pool_gram,
            "pool_b": self.pool_b,
            "traffic": self.exchange.traffic,
            **{f"stats/{k}": v for k, v in self.stats.state().items()},
            **{f"rule/{k}": v for k, v in self.rule.state().items()},
        }

    def load(self, state: dict[str, np.ndarray]) -> None:
        self.step = int(state["step"])
        self.regret[...], self.pool_gram[...], self.pool_b[...] = (
            state["regret"],
            state["pool_gram"],
            state["pool_b"],
        )
        self.exchange.traffic[...] = state["traffic"]
        self.stats.load({k.split("/", 1)[1]: v for k, v in state.items() if k.startswith("stats/")})
        self.rule.load({k.split("/", 1)[1]: v for k, v in state.items() if k.startswith("rule/")})
