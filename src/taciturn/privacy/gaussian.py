"""The Gaussian mechanism of DP-FedAvg (McMahan, Ramage, Talwar, Zhang, "Learning Differentially
Private Recurrent Language Models", ICLR 2018, Alg. 1).

Central (``GaussianSum``, a server-chain aggregator after ``NormBound(S)``): with every update
clipped to norm S and weight w_k = 1, the server releases the fixed-denominator estimate
    Delta = (sum_k Delta_k + N(0, z^2 S^2 I)) / (q N)
(Alg. 1, "f~_f" with W = N, and sigma = z S / (q N) on the average). q N is the expected number of
clients a round (exactly m with fixed-size sampling).
Local (``LocalGaussian``): each client clips its own delta to S and adds N(0, z^2 S^2 I) before
sending; the server averages what arrives.
Noise comes from the OS CSPRNG (privacy/noise.py): the run seed, which is public, cannot
regenerate it. Only ``[privacy] reproducible_noise = true`` (research, labelled not private) takes
it from the run's streams: the server's (round, server, "server-chain") or the client's
(round, client, "dp-local").
"""

from __future__ import annotations

import torch

from taciturn.core.message import Message
from taciturn.core.rng import Streams
from taciturn.privacy.noise import GaussianNoise
from taciturn.server.clipping import clip_rows
from taciturn.server.transform import Info, ServerTransform, State, Updates


class GaussianSum(ServerTransform):
    releases_without_input = True  # noise / (q N) even in a round that sampled nobody

    def __init__(self, noise_multiplier: float, clip: float, expected_clients: float, noise: GaussianNoise):
        self.z, self.clip, self.expected, self.noise = noise_multiplier, clip, expected_clients, noise

    def init(self, dim: int) -> State:
        return {}

    def update(self, updates: Updates, state: State, rng: torch.Generator) -> tuple[Updates, State, Info]:
        total = updates.rows.double().sum(0)
        noise = self.noise.sample(total.numel(), self.z * self.clip, rng)
        row = ((total + noise) / self.expected).to(updates.rows.dtype)
        return Updates(row[None], updates.weights.sum()[None]), state, {"noise_std": self.z * self.clip}


class LocalGaussian:
    """A client's own clip-and-noise on the arrays of its uplink that form its model delta."""

    def __init__(
        self, noise_multiplier: float, clip: float, prefix: str, streams: Streams, noise: GaussianNoise
    ):
        self.z, self.clip, self.prefix, self.streams = noise_multiplier, clip, prefix, streams
        self.noise = noise

    def apply(self, round: int, client: int, message: Message) -> Message:
        names = sorted(n for n in message.arrays if n.startswith(self.prefix))
        flat = torch.cat([torch.from_numpy(message.arrays[n]).reshape(-1).double() for n in names])
        clipped, _ = clip_rows(flat[None], self.clip)
        # the client's seeded stream is derived only for reproducible noise (not per client per round
        # in a private run, whose noise never touches the seed)
        seeded = self.streams.torch(round, client, "dp-local") if self.noise.reproducible else None
        noised = clipped[0] + self.noise.sample(flat.numel(), self.z * self.clip, seeded)
        arrays = dict(message.arrays)
        offset = 0
        for n in names:
            a = message.arrays[n]
            arrays[n] = noised[offset : offset + a.size].reshape(a.shape).numpy().astype(a.dtype)
            offset += a.size
        return Message(arrays, dict(message.meta))


def expected_clients(sampling: str, fraction: float, num_clients: int, per_round: int) -> float:
    """q N: the expected number of clients a round (the fixed denominator)."""
    return fraction * num_clients if sampling == "poisson" else float(per_round)
