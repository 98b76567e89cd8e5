"""Finite-ring quantisation for secure aggregation (Bonawitz et al. 2017, Sec. 3: inputs are
vectors in Z_R; here R = 2^32, so uint32 arithmetic wraps exactly as the ring does).

A value x is clipped to [-c, c] and mapped to round((x + c) / (2c) * L), an integer in [0, L];
with n clients and n L < 2^32 the sum of n quantised vectors never wraps, so the server's sum
mod 2^32 is the exact integer sum, and sum_k x_k ~ S (2c) / L - n c.
"""

from __future__ import annotations

import numpy as np

RING_BITS = 32


def levels(clients: int, bits: int) -> int:
    """L = 2^bits - 1, checked against the ring: clients * L must stay below 2^32."""
    top = 2**bits - 1
    if clients * top >= 2**RING_BITS:
        raise ValueError(
            f"{clients} clients with {bits}-bit quantisation overflow the 2^32 ring; use at most "
            f"{int(np.log2(2**RING_BITS / clients))} bits"
        )
    return top


def quantize(x: np.ndarray, clip: float, level: int) -> np.ndarray:
    scaled = (np.clip(np.nan_to_num(x.astype(np.float64)), -clip, clip) + clip) / (2 * clip) * level
    return np.rint(scaled).astype(np.uint32)


def dequantize_sum(total: np.ndarray, clip: float, level: int, clients: int) -> np.ndarray:
    """The float sum that ``total`` (the sum of ``clients`` quantised vectors) stands for."""
    return total.astype(np.float64) * (2 * clip) / level - clients * clip
