"""Ferret's shared random bases: blocks, basis generation, projection and reconstruction.

Shu, Hu, Lin, Zhou, Dai, Low, "Ferret: Federated Full-Parameter Tuning at Scale for Large Language
Models", ICML 2025 (arXiv 2409.06277v3), Sec. 4.2-4.3.

A block l of d_l parameters gets K_l basis vectors v_{l,k} in R^{d_l} whose elements are i.i.d. from
the standard normal truncated to [-1/sqrt(d_l), 1/sqrt(d_l)] (so ||v|| <= 1). With
rho_l = Var(v) the update Delta_l is projected and reconstructed by Eq. (8):

    gamma_l = (rho_l K_l)^-1 V_l^T Delta_l,        Delta~_l = V_l gamma_l,

which is unbiased (Theorem 1: E[Delta~] = Delta). Client and server regenerate v_{l,k} from a
stream keyed by (run seed, round, block, slot), so a basis never travels and is never stored
for long: generated, used, dropped. ``BasisCache`` is the optional exception within a round
(the "shared-basis trick": generate each basis once for every client and the server).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np
import torch

from taciturn.core.params import Params
from taciturn.core.rng import SERVER, Streams


@dataclass(frozen=True)
class Block:
    """A group of consecutive parameter tensors, projected together as one vector of size d."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    @property
    def size(self) -> int:
        return sum(math.prod(s) for s in self.shapes)


def group_blocks(params: Mapping[str, torch.Tensor]) -> list[Block]:
    """The grouping rule of the official code (``FerretFramework._group_parameters``).

    Walk the parameters in order and start a new block whenever adding the next tensor would
    push the current one past 0.9 x the median tensor size: every large matrix is a block of its
    own, and runs of small tensors (norms, biases) share one. (DataJuicer-1.3B: L = 194, the
    paper's figure; SmolLM2-135M: L = 211.)
    """
    sizes = [p.numel() for p in params.values()]
    target = int(0.9 * float(np.median(sizes)))
    blocks: list[Block] = []
    names: list[str] = []
    total = 0
    for (name, _p), size in zip(params.items(), sizes, strict=True):
        if names and total + size > target:
            blocks.append(Block(tuple(names), tuple(tuple(params[n].shape) for n in names)))
            names, total = [], 0
        names.append(name)
        total += size
    if names:
        blocks.append(Block(tuple(names), tuple(tuple(params[n].shape) for n in names)))
    return blocks


@cache
def basis_variance(d: int) -> float:
    """rho = Var(v) for v ~ N(0, 1) truncated to [-c, c], c = 1/sqrt(d) (Sec. 4.2, below Eq. 7).

    The closed form 1 - 2 c phi(c) / (2 Phi(c) - 1) cancels catastrophically for large d, so
    integrate in u = x / c instead: rho = c^2 int_0^1 u^2 e^{-c^2 u^2 / 2} du / int_0^1 e^{-c^2 u^2 / 2} du,
    which tends to the uniform distribution's c^2 / 3 = 1 / (3 d).
    """
    c2 = 1.0 / d
    from scipy import integrate  # here, not at import: scipy costs every run ~0.3 s of start-up

    num = integrate.quad(lambda u: u * u * math.exp(-c2 * u * u / 2), 0.0, 1.0, epsabs=0, epsrel=1e-13)[0]
    den = integrate.quad(lambda u: math.exp(-c2 * u * u / 2), 0.0, 1.0, epsabs=0, epsrel=1e-13)[0]
    return c2 * num / den


def generate_basis(streams: Streams, round: int, block: int, slot: int, size: int) -> torch.Tensor:
    """v_{round, block, slot}: ``size`` i.i.d. truncated normals from their own seeded stream.

    One stream per (round, block, slot): blocks never share bases. (The official code reseeds
    the global RNG with the same seed for every block, so equal-sized blocks got identical bases
    and unequal ones shared a prefix.) Bit-identical wherever it is regenerated on a CPU.
    """
    generator = streams.torch(round, SERVER, f"ferret-basis/{block}/{slot}")
    # Inverse-CDF sampling: v = sqrt(2) erfinv(u), u ~ U(2 Phi(-c) - 1, 2 Phi(c) - 1) = U(-erf(c/sqrt 2), ..).
    # This is what torch.nn.init.trunc_normal_ did when the authors wrote their code; torch >= 2.11
    # samples by rejection instead, 4-5x slower on a CPU, and generating bases is Ferret's main
    # cost there. The clamp only catches float rounding at the bounds.
    bound = 1.0 / math.sqrt(size)
    edge = math.erf(bound / math.sqrt(2.0))
    basis = torch.empty(size).uniform_(-edge, edge, generator=generator).erfinv_().mul_(math.sqrt(2.0))
    return basis.clamp_(-bound, bound)


class SharedBases:
    """Where client and server get v_{round, block, slot}: regenerated from the stream on demand.

    In a simulation one process plays every client and the server. Without a cache
    (``cache_bytes=0``) each of them regenerates the same basis, as the official code does. With
    one (the "shared-basis trick") a basis is generated once per round and reused by every
    client's projection, the server's reconstruction and, one round later, the clients catching
    up. Only the two latest rounds are kept, at most ``cache_bytes``; beyond that, bases are
    generated and dropped as usual. Both ways give bit-identical numbers.
    """

    def __init__(self, streams: Streams, cache_bytes: int = 0):
        self.streams = streams
        self.cache_bytes = cache_bytes
        self._cache: dict[tuple[int, int, int], torch.Tensor] = {}
        self._bytes = 0
        self.generated = 0  # how many bases were generated (for benchmarks and tests)

    def __call__(self, round: int, block: int, slot: int, size: int) -> torch.Tensor:
        key = (round, block, slot)
        if key in self._cache:
            return self._cache[key]
        for old in [k for k in self._cache if k[0] < round - 1]:
            self._bytes -= self._cache.pop(old).nbytes
        basis = generate_basis(self.streams, round, block, slot, size)
        self.generated += 1
        if self._bytes + basis.nbytes <= self.cache_bytes:
            self._cache[key] = basis
            self._bytes += basis.nbytes
        return basis


def block_vector(params: Mapping[str, torch.Tensor], block: Block) -> torch.Tensor:
    return torch.cat([params[n].reshape(-1) for n in block.names])


def allocate_bases(norms: Sequence[float], max_per_block: int, minimum: int = 2) -> list[int]:
    """K_l proportional to ||Delta_l|| (Sec. 4.3, the allocation the experiments use), at least 2.

    The paper fixes only the proportionality; the constant is the official code's: the block
    with the largest update gets ``max_per_block`` bases, K_l = max(floor(K ||D_l|| / max ||D||), 2).
    """
    largest = max(norms, default=0.0)
    if not math.isfinite(largest) or largest <= 0.0:
        return [minimum] * len(norms)
    return [max(int(n / largest * max_per_block), minimum) for n in norms]


def project(
    delta: Mapping[str, torch.Tensor],
    blocks: Sequence[Block],
    counts: Sequence[int],
    basis: SharedBases,
    round: int,
) -> torch.Tensor:
    """Eq. (8): gamma_l = (rho_l K_l)^-1 V_l^T Delta_l for every block, concatenated (sum K_l values)."""
    coords = []
    for l, (block, k_l) in enumerate(zip(blocks, counts, strict=True)):
        d_l = block_vector(delta, block)
        scale = 1.0 / (basis_variance(block.size) * k_l)
        gamma = torch.stack([basis(round, l, k, block.size) @ d_l for k in range(k_l)])
        coords.append(gamma * scale)
    return torch.cat(coords)


def reconstruct_into(
    params: Params,
    blocks: Sequence[Block],
    counts: Sequence[int],
    coords: torch.Tensor,
    basis: SharedBases,
    round: int,
    scale: float,
) -> None:
    """params += scale * sum_{l,k} coords_{l,k} v_{l,k}, block by block, in place.

    Used for the server's update and for every client's catch-up, so both compute the very same
    floating-point operations in the same order and end with bit-identical models.
    """
    offset = 0
    for l, (block, k_l) in enumerate(zip(blocks, counts, strict=True)):
        if k_l == 0:
            continue
        piece = torch.zeros(block.size)
        for k in range(k_l):
            piece.add_(basis(round, l, k, block.size), alpha=float(coords[offset + k]))
        offset += k_l
        start = 0
        for name, shape in zip(block.names, block.shapes, strict=True):
            n = math.prod(shape)
            params[name].add_(piece[start : start + n].view(shape), alpha=scale)
            start += n
