"""Model poisoning: what an attacker sends instead of its honest uplink.

* ``sign_flip``: -s Delta (the "bit flip"/sign-flipping attack of Damaskinos et al. 2018 and the
  robust-aggregation benchmarks, e.g. Karimireddy et al. 2021, Sec. 7);
* ``scale``: s Delta (model replacement's boosting, Bagdasaryan et al., AISTATS 2020, Eq. 3);
* ``gaussian``: N(0, s^2) noise in place of the update (Blanchard et al. 2017, Sec. 5);
* ``weight_lie``: N(0, s^2) noise with a claimed sample count of 10^12 (issue 18's weight attack);
* ``little_is_enough``: Baruch, Baruch, Goldberg, "A Little Is Enough: Circumventing Defenses For
  Distributed Learning", NeurIPS 2019, Alg. 3: with n updates of which f are the attackers',
  s = floor(n/2 + 1) - f and z_max = Phi^{-1}((n - s) / n) (Eq. 2); every attacker sends
  mu - z sigma, mu and sigma the coordinate-wise mean and standard deviation of the round's honest
  updates (omniscient, as benchmark implementations run it: the attackers see every honest update).
Only float arrays are changed; dtypes and shapes stay those of the honest message, so the
server's checks cannot tell them apart by form. Noise comes from the (round, client, "attack") stream.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from taciturn.attacks.config import AttackConfig
from taciturn.core.message import Message
from taciturn.core.rng import SERVER, Streams

CLAIMED_SAMPLES = 10**12
DEFAULT_STRENGTH = {"sign_flip": 1.0, "scale": 100.0, "gaussian": 1.0, "weight_lie": 1.0}


def pick_attackers(fraction: float, num_clients: int, streams: Streams) -> frozenset[int]:
    """round(fraction N) clients drawn once for the run from the (0, server, "attackers") stream."""
    count = math.floor(fraction * num_clients + 0.5)
    order = streams.numpy(0, SERVER, "attackers").permutation(num_clients)
    return frozenset(int(c) for c in order[:count])


def lie_z(n: int, f: int) -> float:
    """Baruch et al. 2019, Alg. 3: s = floor(n/2 + 1) - f supporters needed, z_max = Phi^-1((n - s)/n)."""
    from scipy.stats import norm  # imported here: scipy.stats costs every start-up about a second

    s = math.floor(n / 2 + 1) - f
    return float(norm.ppf((n - s) / n))


class ModelPoisoning:
    def __init__(self, config: AttackConfig, attackers: frozenset[int], streams: Streams):
        self.config, self.attackers, self.streams = config, attackers, streams
        self.strength = config.strength if config.strength is not None else DEFAULT_STRENGTH.get(config.kind)

    def forge(self, round: int, uplinks: Sequence[tuple[int, Message]]) -> list[tuple[int, Message]]:
        """The uplinks as sent: the attackers' replaced, the others untouched."""
        if not any(c in self.attackers for c, _ in uplinks):
            return list(uplinks)
        if self.config.kind == "little_is_enough":
            return self._little_is_enough(uplinks)
        return [(c, self._one(round, c, m) if c in self.attackers else m) for c, m in uplinks]

    def _one(self, round: int, client: int, message: Message) -> Message:
        kind, s = self.config.kind, self.strength
        rng = self.streams.numpy(round, client, "attack")
        arrays = dict(message.arrays)
        meta = dict(message.meta)
        for name, a in message.arrays.items():
            if a.dtype.kind != "f":
                continue
            if kind == "sign_flip":
                arrays[name] = (-s * a).astype(a.dtype)
            elif kind == "scale":
                arrays[name] = (s * a).astype(a.dtype)
            else:  # gaussian, weight_lie
                arrays[name] = (s * rng.standard_normal(a.shape)).astype(a.dtype)
        if kind == "weight_lie" and "num_samples" in meta:
            meta["num_samples"] = CLAIMED_SAMPLES
        return Message(arrays, meta)

    def _little_is_enough(self, uplinks: Sequence[tuple[int, Message]]) -> list[tuple[int, Message]]:
        n = len(uplinks)
        f = sum(c in self.attackers for c, _ in uplinks)
        z = self.config.strength if self.config.strength is not None else lie_z(n, f)
        first = uplinks[0][1]
        arrays = {}
        for name, a in first.arrays.items():
            if a.dtype.kind != "f":
                arrays[name] = a
                continue
            stacked = np.stack([m.arrays[name].astype(np.float64) for _, m in uplinks])
            arrays[name] = (stacked.mean(0) - z * stacked.std(0)).astype(a.dtype)
        return [(c, Message(arrays, dict(m.meta)) if c in self.attackers else m) for c, m in uplinks]
