"""FedQ's round loop over taciturn's Channel: broadcast, explore, trigger, upload, aggregate.

FedQ rounds are not the engine's rounds: they end when a visit count triggers, not on a clock,
and agents act in an environment instead of training on data. The messages are the same: every
one crosses the Channel, so the Ledger counts its encoded bytes, and drops can hit it.

* The broadcast (down) and the uploads (up) cross the lossy channel. An agent that misses the
  broadcast sits the round out (it has no pi^k to act with); an upload that is lost leaves the
  server without that agent's samples (its episodes were still played, and count in the regret).
* The trigger signal (up, from each agent whose count fired) and the server's stop (down, to
  every exploring agent) are control messages without arrays: they are counted in the ledger
  but never dropped (a lost stop would leave an agent exploring forever; a real deployment
  retransmits them).

Regret is exact: each episode adds V*_1(x_1) - V^{pi^k}_1(x_1) for its first state x_1, with
V^{pi^k} evaluated once per round since the policy is fixed within a round.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from taciturn.core.channel import Channel
from taciturn.core.ledger import Direction
from taciturn.core.message import Message
from taciturn.core.rng import Streams
from taciturn.rl.agents import explore, trigger_thresholds
from taciturn.rl.fedq import FedQ, FedQState
from taciturn.rl.mdp import TabularMDP


@dataclass(frozen=True)
class RoundRecord:
    round: int
    episodes: int  # n^k: episodes each exploring agent ran this round
    exploring: int  # agents that received the broadcast and explored
    regret: float  # sum over exploring agents and episodes of V*_1(x_1) - V^{pi^k}_1(x_1)
    policy_gap: float  # E_{x_1 ~ mu}[V*_1 - V^{pi^k}_1]: the expected regret of one episode with pi^k
    triggered: bool  # False when the episode budget, not a trigger, ended the round
    scalars_up: int  # array elements sent up (uploads)
    scalars_down: int  # array elements sent down (broadcasts)
    uploads_lost: int
    case1: int  # triples updated by case 1 (sample by sample)
    case2: int  # triples updated by case 2 (equal weights)
    policy_changes: int  # states whose greedy action changed


class FedQFederation:
    def __init__(self, mdp: TabularMDP, fedq: FedQ, channel: Channel, streams: Streams):
        if (mdp.horizon, mdp.states, mdp.actions) != (fedq.horizon, fedq.states, fedq.actions):
            raise ValueError(
                f"FedQ is sized for (H, S, A) = {(fedq.horizon, fedq.states, fedq.actions)} but the MDP "
                f"has {(mdp.horizon, mdp.states, mdp.actions)}"
            )
        self.mdp, self.fedq, self.channel, self.streams = mdp, fedq, channel, streams
        self.control = Channel(channel.ledger, streams)  # same ledger, never drops
        self.optimal_first = mdp.optimal[1][0]  # V*_1

    def run_round(self, state: FedQState, round: int, max_episodes: int) -> tuple[FedQState, RoundRecord]:
        """One round of at most ``max_episodes`` episodes per agent."""
        fedq, M = self.fedq, self.fedq.agents
        broadcast = fedq.broadcast(state)
        received = {m: self.channel.send(Direction.DOWN, round, m, broadcast) for m in range(M)}
        exploring = [m for m, message in received.items() if message is not None]
        scalars_down = M * _scalars(broadcast)
        if not exploring:
            record = RoundRecord(round, 0, 0, 0.0, self.policy_gap(state), False, 0, scalars_down, 0, 0, 0, 0)
            return state, record

        arrived = received[exploring[0]]  # every exploring agent decoded the same bytes
        policy, counts, value = (arrived.arrays[k] for k in ("policy", "count", "value"))
        stats = explore(
            self.mdp,
            policy,
            value,
            trigger_thresholds(counts, M, fedq.horizon),
            [self.streams.numpy(round, m, "episodes") for m in exploring],
            max_episodes,
        )
        for i, m in enumerate(exploring):
            if stats.fired[i]:
                self.control.send(Direction.UP, round, m, Message(meta={"trigger": int(stats.episodes)}))
        stop = Message(meta={"stop": int(stats.episodes)})  # one message to all: the channel encodes it once
        for m in exploring:
            self.control.send(Direction.DOWN, round, m, stop)

        reward = self.mdp.rewards[np.arange(fedq.horizon)[:, None], np.arange(fedq.states), policy]
        uploads, lost, scalars_up = {}, 0, 0
        for i, m in enumerate(exploring):
            message = fedq.upload(
                reward, stats.counts[i], stats.next_value_sums[i], stats.next_value_square_sums[i]
            )
            scalars_up += _scalars(message)
            got = self.channel.send(Direction.UP, round, m, message)
            if got is None:
                lost += 1
            else:
                uploads[m] = got

        gap = self.optimal_first - self.mdp.policy_values(policy)[0]  # V*_1 - V^{pi^k}_1 per first state
        new, aggregation = fedq.aggregate(state, uploads)
        record = RoundRecord(
            round=round,
            episodes=stats.episodes,
            exploring=len(exploring),
            regret=float((stats.first_states @ gap).sum()),
            policy_gap=float(gap @ self.mdp.initial),
            triggered=bool(stats.fired.any()),
            scalars_up=scalars_up,
            scalars_down=scalars_down,
            uploads_lost=lost,
            case1=aggregation.case1,
            case2=aggregation.case2,
            policy_changes=aggregation.policy_changes,
        )
        return new, record

    def policy_gap(self, state: FedQState) -> float:
        """E_{x_1 ~ mu}[V*_1(x_1) - V^pi_1(x_1)] of the server's greedy policy pi."""
        gap = self.optimal_first - self.mdp.policy_values(self.fedq.policy(state))[0]
        return float(gap @ self.mdp.initial)


def _scalars(message: Message) -> int:
    return sum(int(a.size) for a in message.arrays.values())
