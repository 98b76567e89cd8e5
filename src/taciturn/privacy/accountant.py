"""The privacy a run has spent, from Google's ``dp-accounting``.

Central DP (McMahan et al., ICLR 2018, Alg. 1 and Thm. 1, whose moments accountant is the RDP
accountant here): each round is one sampled Gaussian mechanism on the sum of clipped updates
(every update of L2 norm at most S, noise std z S). The noise multiplier an accountant needs is
the std over the sum's sensitivity *under the neighbouring relation of the sampling scheme*:

* ``poisson`` (each client joins with probability q): add/remove-one neighbours, sensitivity S,
  so the event is PoissonSampled(q, Gaussian(z)) (Mironov, Talwar, Zhang 2019);
* ``fixed`` (m of N without replacement): replace-one neighbours. Replacing one client's update
  u by another u' moves the sum by ||u - u'|| <= 2S, so the event is
  SampledWithoutReplacement(N, m, Gaussian(z / 2)) (Wang, Balle, Kasiviswanathan 2019, whose
  noise multiplier is "the std over the l2-sensitivity"). Reading z over S here reports about a
  tenth of the epsilon (N = 1000, m = 10, z = 1, 100 rounds: 1.48 instead of 11.2).

Local DP: each client clips its own update to S and adds N(0, z^2 S^2 I) before sending, and the
server sees that release. Against the server one participation is a Gaussian mechanism whose
input (the client's update) can be any vector of norm <= S, so its sensitivity is 2S: the event
is Gaussian(z / 2), with no amplification by sampling (the server sees who sent). ``epsilon``
is then the epsilon of one participation; a client that takes part k times spends k of them
composed.

``epsilon(t)`` is epsilon at the configured delta after t rounds, from the RDP accountant
(Mironov 2017) or the PLD accountant (Doroshenko et al. 2022).
"""

from __future__ import annotations

from collections.abc import Callable

import dp_accounting
from dp_accounting import pld, rdp

from taciturn.privacy.config import PrivacyConfig

MIN_Z = 1e-3  # the RDP solver's lower end (RDP's cost does not grow as z shrinks)
PLD_FLOOR = 0.05  # the PLD accountant is never asked below this z: its grids grow like 1/z^2


def round_event(
    z: float, sampling: str, num_clients: int, fraction: float, per_round: int
) -> dp_accounting.DpEvent:
    """One central round: Poisson sampling with q = fraction (add/remove-one, sensitivity S), or
    ``per_round`` of N without replacement (replace-one, sensitivity 2S: z / 2 over it)."""
    if sampling == "poisson":
        return dp_accounting.PoissonSampledDpEvent(fraction, dp_accounting.GaussianDpEvent(z))
    return dp_accounting.SampledWithoutReplacementDpEvent(
        num_clients, per_round, dp_accounting.GaussianDpEvent(z / 2)
    )


def participation_event(z: float) -> dp_accounting.DpEvent:
    """One client's local-DP release against the server: sensitivity 2S, std z S."""
    return dp_accounting.GaussianDpEvent(z / 2)


def fresh_accountant(config: PrivacyConfig) -> Callable[[], dp_accounting.PrivacyAccountant]:
    relation = (
        dp_accounting.NeighboringRelation.REPLACE_ONE
        if config.mode == "central" and config.sampling == "fixed"
        else dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    )
    if config.accountant == "pld":
        return lambda: pld.PLDAccountant(neighboring_relation=relation)
    return lambda: rdp.RdpAccountant(neighboring_relation=relation)


def run_event(
    config: PrivacyConfig, num_clients: int, fraction: float, per_round: int, rounds: int
) -> Callable[[float], dp_accounting.DpEvent]:
    """z -> what the whole run releases: ``rounds`` central rounds, or one local participation."""
    if config.mode == "local":
        return participation_event
    return lambda z: dp_accounting.SelfComposedDpEvent(
        round_event(z, config.sampling, num_clients, fraction, per_round), rounds
    )


def epsilon_of(config: PrivacyConfig, event: dp_accounting.DpEvent) -> float:
    accountant = fresh_accountant(config)()
    accountant.compose(event)
    return float(accountant.get_epsilon(config.delta))


def solve_noise_multiplier(
    config: PrivacyConfig, num_clients: int, fraction: float, per_round: int, rounds: int
) -> float:
    """The z for which the run spends exactly ``target_epsilon`` at ``delta`` (local mode: one
    participation does).

    dp-accounting's solver evaluates its bracket's ends; PLD's memory grows like 1/z^2 (at
    z = 1e-3, 38 GiB), so its bracket comes from the RDP solution, which is cheap at any z and
    never tighter than PLD: PLD's z lies at or below it. The lower end halves from z_rdp / 2 until
    PLD overspends there, and never goes below ``PLD_FLOOR`` (a target only reachable below it is
    refused when RDP's z is already there, else PLD_FLOOR is returned: it spends less)."""
    assert config.target_epsilon is not None
    target, event = config.target_epsilon, run_event(config, num_clients, fraction, per_round, rounds)
    rdp_config = config.model_copy(update={"accountant": "rdp"})
    z_rdp = float(
        dp_accounting.calibrate_dp_mechanism(
            fresh_accountant(rdp_config),
            event,
            target,
            config.delta,
            dp_accounting.LowerEndpointAndGuess(MIN_Z, 1.0),
        )
    )
    if config.accountant == "rdp":
        return z_rdp
    if z_rdp <= PLD_FLOOR:  # PLD's z is lower still
        raise ValueError(
            f"target_epsilon = {target} needs a noise multiplier below {PLD_FLOOR}, where the PLD "
            "accountant's grids become too large; use accountant = 'rdp' or a smaller target"
        )
    high = z_rdp
    while epsilon_of(config, event(high)) > target:  # not expected (PLD is the tighter bound)
        high *= 1.25
    low = max(high / 2, PLD_FLOOR)
    while epsilon_of(config, event(low)) <= target:
        if low == PLD_FLOOR:
            return PLD_FLOOR  # spends less than the target: the most noise PLD is asked about
        low = max(low / 2, PLD_FLOOR)
    return float(
        dp_accounting.calibrate_dp_mechanism(
            fresh_accountant(config),
            event,
            target,
            config.delta,
            dp_accounting.ExplicitBracketInterval(low, high),
        )
    )


class Accountant:
    """Central: composes one round's event per round, lazily (``epsilon(t)`` composes the rounds
    since the last call in one step). Local: the epsilon of one participation, every round."""

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
        self.local = config.mode == "local"
        self.event = (
            participation_event(noise_multiplier)
            if self.local
            else round_event(noise_multiplier, config.sampling, num_clients, fraction, per_round)
        )
        self.accountant = fresh_accountant(config)()
        self.rounds = 0

    def epsilon(self, rounds: int) -> float:
        if self.local:  # one participation, whatever the round: composed once
            if rounds == 0:
                return 0.0
            if self.rounds == 0:
                self.accountant.compose(self.event)
                self.rounds = 1
            return float(self.accountant.get_epsilon(self.delta))
        if rounds < self.rounds:
            raise ValueError(f"the accountant is at round {self.rounds}; it cannot go back to {rounds}")
        if rounds == 0:
            return 0.0
        if rounds > self.rounds:
            self.accountant.compose(self.event, rounds - self.rounds)
            self.rounds = rounds
        return float(self.accountant.get_epsilon(self.delta))
