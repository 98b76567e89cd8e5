"""The privacy a run has spent, from Google's ``dp-accounting``.

Each round is one sampled Gaussian mechanism with noise multiplier z (McMahan et al., ICLR 2018,
Alg. 1 and Thm. 1, whose moments accountant is the RDP accountant here): clients are sampled
with probability q (Poisson, add/remove-one neighbours) or m of N without replacement
(replace-one neighbours), each contributes an update of norm at most S, and the noise has std
z S. Rounds compose. ``epsilon(t)`` is epsilon at the configured delta after t rounds, from the
RDP accountant (Mironov 2017; Mironov, Talwar, Zhang 2019 for Poisson subsampling; Wang, Balle,
Kasiviswanathan 2019 for sampling without replacement) or the PLD accountant (Doroshenko et al. 2022).
"""

from __future__ import annotations

from collections.abc import Callable

import dp_accounting
from dp_accounting import pld, rdp

from taciturn.privacy.config import PrivacyConfig


def round_event(
    z: float, sampling: str, num_clients: int, fraction: float, per_round: int
) -> dp_accounting.DpEvent:
    """One round: Poisson sampling with q = fraction, or ``per_round`` of N without replacement."""
    gaussian = dp_accounting.GaussianDpEvent(z)
    if sampling == "poisson":
        return dp_accounting.PoissonSampledDpEvent(fraction, gaussian)
    return dp_accounting.SampledWithoutReplacementDpEvent(num_clients, per_round, gaussian)


def fresh_accountant(config: PrivacyConfig) -> Callable[[], dp_accounting.PrivacyAccountant]:
    relation = (
        dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
        if config.sampling == "poisson"
        else dp_accounting.NeighboringRelation.REPLACE_ONE
    )
    if config.accountant == "pld":
        return lambda: pld.PLDAccountant(neighboring_relation=relation)
    return lambda: rdp.RdpAccountant(neighboring_relation=relation)


def solve_noise_multiplier(
    config: PrivacyConfig, num_clients: int, fraction: float, per_round: int, rounds: int
) -> float:
    """The z for which ``rounds`` rounds spend exactly ``target_epsilon`` at ``delta``."""
    assert config.target_epsilon is not None
    return float(
        dp_accounting.calibrate_dp_mechanism(
            fresh_accountant(config),
            lambda z: dp_accounting.SelfComposedDpEvent(
                round_event(z, config.sampling, num_clients, fraction, per_round), rounds
            ),
            config.target_epsilon,
            config.delta,
            dp_accounting.LowerEndpointAndGuess(1e-3, 1.0),
        )
    )


class Accountant:
    """Composes one round's event per round, lazily: ``epsilon(t)`` composes the rounds since the
    last call in one step (an event's privacy loss is computed once per call, not once per round)."""

    def __init__(
        self,
        config: PrivacyConfig,
        noise_multiplier: float,
        num_clients: int,
        fraction: float,
        per_round: int,
    ):
        self.delta = config.delta
        self.noise_multiplier = noise_multiplier
        self.event = round_event(noise_multiplier, config.sampling, num_clients, fraction, per_round)
        self.accountant = fresh_accountant(config)()
        self.rounds = 0

    def epsilon(self, rounds: int) -> float:
        if rounds < self.rounds:
            raise ValueError(f"the accountant is at round {self.rounds}; it cannot go back to {rounds}")
        if rounds == 0:
            return 0.0
        if rounds > self.rounds:
            self.accountant.compose(self.event, rounds - self.rounds)
            self.rounds = rounds
        return float(self.accountant.get_epsilon(self.delta))
