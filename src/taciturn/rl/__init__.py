"""Reinforcement learning: tabular episodic MDPs, federated Q-learning (FedQ) and its baselines.

Protocols here are not round-shaped like the engine's (a FedQ round ends when a visit count
triggers), so they have their own loop, over the same Message, Channel, Ledger and Streams.
"""

from taciturn.rl.federation import FedQFederation, RoundRecord
from taciturn.rl.fedq import FedQ, FedQState
from taciturn.rl.mdp import TabularMDP, random_mdp
from taciturn.rl.ucb import UCBQLearning

__all__ = ["FedQ", "FedQFederation", "FedQState", "RoundRecord", "TabularMDP", "UCBQLearning", "random_mdp"]
