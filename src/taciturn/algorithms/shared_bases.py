"""Ferret's random bases: blocks, basis generation, projection and reconstruction.

Shu, Hu, Lin, Zhou, Dai, Low, "Ferret: Federated Full-Parameter Tuning at Scale for Large Language
Models", ICML 2025 (arXiv 2409.06277v3), Sec. 4.2-4.3.

A block l of d_l parameters gets K_l basis vectors v_{l,k} in R^{d_l} with i.i.d. elements of mean 0,
variance rho_l and fourth moment mu4_l, bounded by c = 1/sqrt(d_l) (so ||v|| <= 1). The update
Delta_l is projected and reconstructed by Eq. (8):

    gamma_l = (rho_l K_l)^-1 V_l^T Delta_l,        Delta~_l = V_l gamma_l,

which is unbiased whenever E[v v^T] = rho I (Theorem 1: E[Delta~] = Delta), with squared error

    E||Delta~_l - Delta_l||^2 = ||Delta_l||^2 (mu4 / rho^2 + d_l - 2) / K_l

(expand E[v v^T Delta Delta^T v v^T] over i.i.d. elements). Two element distributions:

  * ``truncated_normal``: the paper's, N(0, 1) truncated to [-c, c];
  * ``uniform``: U(-c, c), rho = c^2 / 3 and mu4 / rho^2 = 9/5 exactly. At c = 1/sqrt(d) the
    truncated normal's density varies by a factor exp(-1/(2d)) over its support, so its rho and
    mu4 / rho^2 differ from these by O(1/d): the two have the same error to O(1/d) relative,
    and the uniform one costs one ``uniform_`` per element instead of ``uniform_`` + ``erfinv``.

Client and server regenerate v from a stream keyed by (run seed, round, owner, block, slot): the
owner is the server for the round's shared bases, or a client for its own (Alg. 1's per-client
seeds). A basis never travels and is never stored: each slot's stream fills ``CHUNK`` elements
at a time, and a block's K_l slots are generated chunk by chunk into one (K_l, CHUNK) buffer
that is used at once, for one matrix-vector product (projection) or one transposed one
(reconstruction), so the bases pass through the cache once. Blocks run in parallel threads.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from typing import Literal, TypeVar

import numpy as np
import torch

from taciturn.core.params import Params
from taciturn.core.rng import Streams

BasisKind = Literal["uniform", "truncated_normal"]
CHUNK = 1 << 16  # elements of one slot generated at a time: a (16, CHUNK) float32 buffer is 4 MiB
T = TypeVar("T")


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
def basis_variance(kind: BasisKind, d: int) -> float:
    """rho = Var(v) of the elements of a basis of a d-parameter block (Sec. 4.2, below Eq. 7).

    Uniform on [-c, c], c = 1/sqrt(d): c^2 / 3 = 1 / (3 d). Truncated normal: the paper's closed
    form 1 - 2 c phi(c) / (2 Phi(c) - 1) cancels catastrophically for large d, so integrate in
    u = x / c instead: rho = c^2 int_0^1 u^2 e^{-c^2 u^2 / 2} du / int_0^1 e^{-c^2 u^2 / 2} du, which
    tends to the uniform distribution's 1 / (3 d).
    """
    c2 = 1.0 / d
    if kind == "uniform":
        return c2 / 3.0
    from scipy import integrate  # here, not at import: scipy costs every run ~0.3 s of start-up

    num = integrate.quad(lambda u: u * u * math.exp(-c2 * u * u / 2), 0.0, 1.0, epsabs=0, epsrel=1e-13)[0]
    den = integrate.quad(lambda u: math.exp(-c2 * u * u / 2), 0.0, 1.0, epsabs=0, epsrel=1e-13)[0]
    return c2 * num / den


@dataclass(frozen=True)
class Contribution:
    """One set of coordinates to reconstruct: sum_{l,k} coords_{l,k} v_{owner, l, k} (Eq. 8)."""

    owner: int  # whose bases: SERVER for a round's shared bases, else the client's own
    counts: Sequence[int]  # K_l per block
    coords: torch.Tensor  # sum_l K_l float32 values, block after block

    def by_block(self) -> list[torch.Tensor]:
        return list(torch.split(self.coords, list(self.counts)))


PARALLEL_WORK = 1 << 22  # elements (sum K_l d_l) below which threads cost more than they save


def _per_block(work: Callable[[int], T], blocks: Sequence[Block], counts: Sequence[int]) -> list[T]:
    """work(l) for every block, on all of torch's threads when the pass is large (generation and
    products release the GIL). Each block is computed whole by one thread with the same
    operations, so the numbers do not depend on the number of threads."""
    threads = torch.get_num_threads()
    total = sum(block.size * k for block, k in zip(blocks, counts, strict=True))
    if threads <= 1 or len(blocks) <= 1 or total < PARALLEL_WORK:
        return [work(l) for l in range(len(blocks))]
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(work, range(len(blocks))))


class Bases:
    """Where client and server get v_{round, owner, block, slot}: regenerated, chunk by chunk."""

    def __init__(self, streams: Streams, kind: BasisKind):
        self.streams = streams
        self.kind = kind

    def _generators(self, round: int, owner: int, block: int, slots: range) -> list[torch.Generator]:
        # One seed per (round, owner, block, slot), the slot-th of the (round, owner, block)
        # stream: blocks never share bases. (The official code
        # reseeds the global RNG with the same seed for every block, so equal-sized blocks got
        # identical bases and unequal ones shared a prefix.)
        seeds = self.streams.seeds_for(round, owner, f"ferret-basis/{block}", slots.stop)
        return [torch.Generator().manual_seed(seeds[slot]) for slot in slots]

    def _fill(self, rows: torch.Tensor, generators: Sequence[torch.Generator], size: int) -> None:
        """The next chunk of every slot, row k from generator k; bit-identical when rerun on a CPU."""
        bound = 1.0 / math.sqrt(size)
        for row, generator in zip(rows, generators, strict=True):
            if self.kind == "uniform":
                row.uniform_(-bound, bound, generator=generator)
            else:
                # Inverse-CDF sampling: v = sqrt(2) erfinv(u), u ~ U(-erf(c / sqrt 2), erf(c / sqrt 2)).
                # This is what torch.nn.init.trunc_normal_ did when the authors wrote their code;
                # torch >= 2.11 samples by rejection instead, 4-5x slower on a CPU. The clamp only
                # catches float rounding at the bounds.
                edge = math.erf(bound / math.sqrt(2.0))
                row.uniform_(-edge, edge, generator=generator).erfinv_().mul_(math.sqrt(2.0))
                row.clamp_(-bound, bound)

    def _chunks(self, round: int, owner: int, block: int, count: int, size: int):
        """(start, (count, n) view of the K_l bases' elements start..start+n) for every chunk."""
        generators = self._generators(round, owner, block, range(count))
        buffer = torch.empty(count, min(CHUNK, size))
        for start in range(0, size, CHUNK):
            rows = buffer[:, : min(CHUNK, size - start)]
            self._fill(rows, generators, size)
            yield start, rows

    def basis(self, round: int, owner: int, block: int, slot: int, size: int) -> torch.Tensor:
        """v_{round, owner, block, slot} whole (for checks; projection and reconstruction stream it)."""
        generators = self._generators(round, owner, block, range(slot, slot + 1))
        out = torch.empty(size)
        for start in range(0, size, CHUNK):
            self._fill(out[None, start : start + CHUNK], generators, size)
        return out

    def project(
        self,
        delta: Mapping[str, torch.Tensor],
        blocks: Sequence[Block],
        counts: Sequence[int],
        round: int,
        owner: int,
    ) -> torch.Tensor:
        """Eq. (8): gamma_l = (rho_l K_l)^-1 V_l^T Delta_l for every block, concatenated (sum K_l values)."""

        def one(l: int) -> torch.Tensor:
            block, k_l = blocks[l], counts[l]
            d_l = block_vector(delta, block)
            gamma = torch.zeros(k_l)
            for start, rows in self._chunks(round, owner, l, k_l, block.size):
                gamma.addmv_(rows, d_l[start : start + rows.shape[1]])
            return gamma / (basis_variance(self.kind, block.size) * k_l)

        return torch.cat(_per_block(one, blocks, counts))

    def reconstruct(
        self, blocks: Sequence[Block], contributions: Sequence[Contribution], round: int
    ) -> list[torch.Tensor]:
        """sum over contributions of V_l gamma_l, block by block (Eq. 8's Delta~_l; Alg. 1 line 4's sum)."""
        by_block = [c.by_block() for c in contributions]

        def one(l: int) -> torch.Tensor:
            piece = torch.zeros(blocks[l].size)
            for contribution, gammas in zip(contributions, by_block, strict=True):
                if len(gammas[l]) == 0:
                    continue
                chunks = self._chunks(round, contribution.owner, l, len(gammas[l]), blocks[l].size)
                for start, rows in chunks:
                    piece[start : start + rows.shape[1]].addmv_(rows.T, gammas[l])
            return piece

        most = [max((len(g[l]) for g in by_block), default=0) for l in range(len(blocks))]
        return _per_block(one, blocks, [k * len(contributions) for k in most])


def apply_pieces(
    params: Params, blocks: Sequence[Block], pieces: Sequence[torch.Tensor], scale: float
) -> None:
    """params += scale * piece_l, block by block, in place: the server's step and every catch-up,
    so both compute the very same floating-point operations and end with bit-identical models."""
    for block, piece in zip(blocks, pieces, strict=True):
        start = 0
        for name, shape in zip(block.names, block.shapes, strict=True):
            n = math.prod(shape)
            params[name].add_(piece[start : start + n].view(shape), alpha=scale)
            start += n


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
