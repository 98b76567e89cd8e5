"""Where differential-privacy noise comes from.

DP's guarantee needs noise the adversary cannot predict. The run seed is public (it is in
config.toml and, deployed, on every node), so noise drawn from the run's seeded streams can be
regenerated and subtracted by anyone holding the config: such a run is not private at all.
``GaussianNoise`` therefore draws from the operating system's CSPRNG (``os.urandom``) unless the
run asks for reproducible noise (``[privacy] reproducible_noise = true``, for research only),
in which case it uses the seeded generator it is handed and the run is labelled
"not private: reproducible noise" everywhere it reports an epsilon.

Standard normals from the CSPRNG: the Box-Muller transform (Box & Muller 1958) of pairs of
uniforms built from 53 random bits each, u1 in (0, 1], u2 in [0, 1), in float64:
    z1 = sqrt(-2 ln u1) cos(2 pi u2),  z2 = sqrt(-2 ln u1) sin(2 pi u2).
The tails stop at sqrt(-2 ln 2^-53) = 8.57 standard deviations (a probability of 1e-17 each).

Floating point (Mironov, "On Significance of the Least Significant Bits for Differential
Privacy", CCS 2012): noise sampled and added in floating point does not take every value a real
Gaussian would, and the gaps can tell two neighbouring inputs apart. Here the noise is a float64
sample added to the float64 sum, and the release is rounded to the model's dtype (float32: 24
bits against the sample's 53), which removes the float64 gaps the attack reads in the usual
regime. That is a mitigation, not a proof: no snapping mechanism (Mironov 2012) or discrete
Gaussian (Canonne, Kamath, Steinke, NeurIPS 2020) is implemented; docs/guide.md says so.
"""

from __future__ import annotations

import math
import os

import numpy as np
import torch

CHUNK = 1 << 20  # normals drawn per batch of random bytes: bounds the temporary memory (16 MB)


def standard_normal(size: int) -> torch.Tensor:
    """``size`` independent N(0, 1) values in float64 from the OS CSPRNG (Box-Muller)."""
    out = torch.empty(size, dtype=torch.float64)
    flat = out.numpy()
    for start in range(0, size, CHUNK):
        n = min(CHUNK, size - start)
        pairs = (n + 1) // 2
        words = np.frombuffer(os.urandom(16 * pairs), dtype="<u8").reshape(2, pairs) >> np.uint64(11)
        u1 = (words[0] + 1).astype(np.float64) * 2.0**-53  # (0, 1]: log(u1) is finite
        u2 = words[1].astype(np.float64) * 2.0**-53  # [0, 1)
        radius = np.sqrt(-2.0 * np.log(u1))
        angle = 2.0 * math.pi * u2
        flat[start : start + n] = np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])[:n]
    return out


class GaussianNoise:
    """Gaussian noise for DP: from the OS CSPRNG, or (``reproducible``) from a seeded generator."""

    def __init__(self, reproducible: bool = False):
        self.reproducible = reproducible

    def sample(self, size: int, std: float, seeded: torch.Generator | None) -> torch.Tensor:
        """``size`` draws of N(0, std^2) in float64. ``seeded`` (the run's stream for this draw) is
        used only by a reproducible run: a private run never lets the seed near its noise."""
        if self.reproducible:
            if seeded is None:
                raise ValueError("reproducible noise needs the run's seeded stream for this draw")
            return torch.randn(size, generator=seeded, dtype=torch.float64) * std
        return standard_normal(size) * std
