"""Compressors: what one float array becomes on the wire, and how the receiver rebuilds it.

Each compressor maps a 1-D float array x of length d to named *parts* (arrays the codec carries as
they are: float16 values, int8 codes and float32 scales, indices and values) and back. The parts
are the compressed form itself, so the ledger counts exactly what would travel; nothing is sent
as float32 and "counted as" something smaller. ``layout(d, dtype)`` says which parts of which
shapes and dtypes a valid message holds, so a receiver checks them before it decodes anything.

* ``fp16``, ``bf16``: IEEE half precision (values saturate at +-65504; updates below 6e-8 become 0),
  or bfloat16 (float32's exponent, 8 bits of mantissa; round to nearest even, as torch does).
  Deterministic; elementwise relative error <= 2^-11 (fp16, in range) or 2^-8 (bf16).
* ``int8``, ``int4``: linear quantisation with one float32 scale per block of ``block`` values
  (blockwise absmax, the scheme of bitsandbytes' and NVFlare's blockwise filters without their
  dynamic code map): q = x / s, s = max|x_block| / L, L = 127 or 7, codes rounded to the nearest
  integer (biased, error <= s/2 per value) or stochastically (floor(q + U[0, 1)): unbiased, variance
  <= s^2/4 per value). int4 codes are packed two per byte.
* ``qsgd``: QSGD (Alistarh, Grubic, Li, Tomioka, Vojnovic, "QSGD: Communication-Efficient SGD via
  Gradient Quantization and Encoding", NeurIPS 2017, Sec. 3.1): per bucket of ``bucket`` values,
  Q_s(v)_i = ||v||_2 sgn(v_i) xi_i, xi_i = (l + 1)/s with probability |v_i| s / ||v|| - l, else l/s,
  l = floor(|v_i| s / ||v||). Unbiased, and (Lemma 3.1) E||Q_s(v) - v||^2 <= min(b/s^2, sqrt(b)/s)
  ||v||^2 for a bucket of b values. The signed level (2s + 1 values) is sent in the fewest of 2, 4,
  8 or 16 bits that hold it, the norm as float32; the paper's Elias coding of the levels is not done.
* ``topk``: the k = ceil(fraction d) largest |x_i| with their indices (uint16 when d <= 65536, else
  uint32). Biased, contractive: ||C(x) - x||^2 <= (1 - k/d) ||x||^2.
* ``randk``: k coordinates drawn uniformly without replacement from a stream sender and receiver
  both derive (core/rng.py), so only the values travel. ``unbiased`` (default): values scaled by d/k,
  E C(x) = x and E||C(x) - x||^2 = (d/k - 1) ||x||^2 exactly (Stich, Cordonnier, Jaggi 2018, and
  Beznosikov et al. 2020's "unbiased random sparsification"); else unscaled, contractive like top-k
  in expectation (E||C(x) - x||^2 = (1 - k/d) ||x||^2).

``sparsifier`` compressors leave a float payload (part "v", the kept values) that a second
compressor may quantise (compression/chain.py): top-k values in fp16, random-k values in int8.
``for_values``: the error is bounded relative to each value or block (the casts, int8, int4), so
it may be applied to a model itself; the others only make sense on changes (deltas, increments),
where an error of the order of ||x|| is what error feedback or averaging absorbs.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import ClassVar

import numpy as np
import torch

Draw = Callable[[str], np.random.Generator]  # a fresh generator for a purpose, the same on both sides
Layout = dict[str, tuple[tuple[int, ...], np.dtype]]

FP16_MAX = float(np.finfo(np.float16).max)


class Compressor(ABC):
    kind: ClassVar[str]
    sparsifier: ClassVar[bool] = False  # leaves a float payload "v" that a second piece may quantise
    for_values: ClassVar[bool] = False  # error bounded per value or block: safe on a model itself
    unbiased: bool = False  # E C(x) = x

    @abstractmethod
    def encode(self, x: np.ndarray, draw: Draw) -> dict[str, np.ndarray]:
        """The parts that stand for the 1-D float array ``x``."""

    @abstractmethod
    def decode(self, parts: Mapping[str, np.ndarray], size: int, dtype: np.dtype, draw: Draw) -> np.ndarray:
        """The 1-D array of ``size`` values of ``dtype`` that ``parts`` stand for (checked by layout)."""

    @abstractmethod
    def layout(self, size: int, dtype: np.dtype) -> Layout:
        """Every part a valid encoding of ``size`` values of ``dtype`` has: shape and dtype."""

    def problem(self, parts: Mapping[str, np.ndarray], size: int) -> str | None:
        """A reason to refuse parts whose layout is right but whose content is not (indices)."""
        return None


class Fp16(Compressor):
    kind = "fp16"
    for_values = True

    def encode(self, x, draw):
        return {"h": np.clip(x, -FP16_MAX, FP16_MAX).astype(np.float16)}

    def decode(self, parts, size, dtype, draw):
        return parts["h"].astype(dtype)

    def layout(self, size, dtype):
        return {"h": ((size,), np.dtype(np.float16))}


class Bf16(Compressor):
    kind = "bf16"
    for_values = True

    def encode(self, x, draw):
        half = torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(torch.bfloat16)
        return {"b": half.view(torch.int16).numpy().view(np.uint16)}

    def decode(self, parts, size, dtype, draw):
        bits = torch.from_numpy(parts["b"].view(np.int16).copy())
        return bits.view(torch.bfloat16).to(torch.float32).numpy().astype(dtype)

    def layout(self, size, dtype):
        return {"b": ((size,), np.dtype(np.uint16))}


def _pack(codes: np.ndarray, width: int) -> np.ndarray:
    """Unsigned codes below 2**width, packed little-end first into bytes (width 2 or 4), or as
    uint8 / uint16 (width 8 / 16)."""
    if width >= 8:
        return codes.astype(np.uint8 if width == 8 else np.uint16)
    per = 8 // width
    padded = np.zeros(-(-codes.size // per) * per, np.uint8)
    padded[: codes.size] = codes
    grouped = padded.reshape(-1, per)
    shifts = np.arange(per, dtype=np.uint8) * width
    return np.bitwise_or.reduce(grouped << shifts, axis=1).astype(np.uint8)


def _unpack(packed: np.ndarray, width: int, size: int) -> np.ndarray:
    if width >= 8:
        return packed.astype(np.int64)
    per = 8 // width
    shifts = np.arange(per, dtype=np.uint8) * width
    codes = (packed[:, None] >> shifts) & np.uint8((1 << width) - 1)
    return codes.reshape(-1)[:size].astype(np.int64)


def _packed_length(size: int, width: int) -> int:
    return size if width >= 8 else -(-size // (8 // width))


def _code_dtype(width: int) -> np.dtype:
    return np.dtype(np.uint16 if width == 16 else np.uint8)


def _float32_at_least(values: np.ndarray) -> np.ndarray:
    """float32 values no smaller than ``values`` (so |x| / s stays <= L after rounding the scale)."""
    rounded = values.astype(np.float32)
    low = rounded.astype(np.float64) < values
    rounded[low] = np.nextafter(rounded[low], np.float32(np.inf))
    return rounded


def _groups(size: int, group: int) -> int:
    """How many groups of ``group`` values hold ``size`` values (the last one zero-padded)."""
    return -(-size // group)


def _grouped(x: np.ndarray, group: int) -> np.ndarray:
    """``x`` zero-padded to whole groups, one group of ``group`` values a row, in float64."""
    padded = np.zeros(_groups(x.size, group) * group)
    padded[: x.size] = x
    return padded.reshape(-1, group)


def _per_value(scales: np.ndarray, group: int, size: int) -> np.ndarray:
    """Each group's scale (a block's absmax, a bucket's norm) repeated for its values, in float64."""
    return np.repeat(scales.astype(np.float64), group)[:size]


def _bad_scales(scales: np.ndarray) -> bool:
    return not np.isfinite(scales).all() or bool((scales < 0).any())


class BlockQuant(Compressor):
    """int8 / int4 codes with one float32 absmax scale per block (see the module docstring)."""

    for_values = True

    def __init__(self, bits: int, block: int, rounding: str):
        self.bits, self.block, self.rounding = bits, block, rounding
        self.kind = f"int{bits}"  # type: ignore[misc]
        self.levels = (1 << (bits - 1)) - 1  # L: codes in [-L, L]
        self.unbiased = rounding == "stochastic"

    def encode(self, x, draw):
        n, grouped = x.size, _grouped(x, self.block)
        scale = _float32_at_least(np.abs(grouped).max(axis=1) / self.levels)
        safe = np.where(scale > 0, scale, 1.0).astype(np.float64)
        q = (grouped / safe[:, None]).reshape(-1)[:n]
        stochastic = self.rounding == "stochastic"  # floor(q + U[0, 1)) has expectation q
        q = np.floor(q + draw("rounding").random(n)) if stochastic else np.rint(q)
        q = np.clip(q, -self.levels, self.levels).astype(np.int64)
        codes = q.astype(np.int8) if self.bits == 8 else _pack(q + self.levels, self.bits)
        return {"q": codes, "s": scale}

    def decode(self, parts, size, dtype, draw):
        q = (
            parts["q"].astype(np.int64)
            if self.bits == 8
            else _unpack(parts["q"], self.bits, size) - self.levels
        )
        return (q * _per_value(parts["s"], self.block, size)).astype(dtype)

    def layout(self, size, dtype):
        codes = (
            ((size,), np.dtype(np.int8))
            if self.bits == 8
            else ((_packed_length(size, 4),), np.dtype(np.uint8))
        )
        return {"q": codes, "s": ((_groups(size, self.block),), np.dtype(np.float32))}

    def problem(self, parts, size):
        if self.bits == 8 and (parts["q"] == -128).any():
            return "int8 code -128 is outside [-127, 127]"
        if _bad_scales(parts["s"]):
            return "block scales must be finite and non-negative"
        return None


class QSGD(Compressor):
    kind = "qsgd"
    unbiased = True

    def __init__(self, levels: int, bucket: int):
        self.s, self.bucket = levels, bucket
        self.width = next(w for w in (2, 4, 8, 16) if (1 << w) > 2 * levels)  # 2s + 1 signed levels

    def encode(self, x, draw):
        n, grouped = x.size, _grouped(x, self.bucket)
        norms = _float32_at_least(np.linalg.norm(grouped, axis=1))
        safe = np.where(norms > 0, norms, 1.0).astype(np.float64)
        r = (np.abs(grouped) / safe[:, None] * self.s).reshape(-1)[:n]  # |v_i| s / ||v|| in [0, s]
        low = np.floor(r)
        level = low + (draw("qsgd").random(n) < r - low)  # up with probability r - l
        signed = (np.sign(x) * np.minimum(level, self.s)).astype(np.int64)
        return {"q": _pack(signed + self.s, self.width), "n": norms}

    def decode(self, parts, size, dtype, draw):
        signed = _unpack(parts["q"], self.width, size) - self.s
        return (_per_value(parts["n"], self.bucket, size) * signed / self.s).astype(dtype)

    def layout(self, size, dtype):
        return {
            "q": ((_packed_length(size, self.width),), _code_dtype(self.width)),
            "n": ((_groups(size, self.bucket),), np.dtype(np.float32)),
        }

    def problem(self, parts, size):
        if (_unpack(parts["q"], self.width, size) > 2 * self.s).any():
            return f"QSGD levels must lie in [-{self.s}, {self.s}]"
        if _bad_scales(parts["n"]):
            return "bucket norms must be finite and non-negative"
        return None

    def omega(self, size: int) -> float:
        """Lemma 3.1's bound on E||Q(v) - v||^2 / ||v||^2 for ``size`` values (per bucket of b)."""
        b = min(self.bucket, size)
        return min(b / self.s**2, math.sqrt(b) / self.s)


def kept(fraction: float, size: int) -> int:
    """k = ceil(fraction d), at least 1 (float noise below 1e-9 ignored: 0.01 of 300 keeps 3)."""
    return max(1, min(size, math.ceil(fraction * size - 1e-9)))


def _index_dtype(size: int) -> np.dtype:
    return np.dtype(np.uint16 if size <= 1 << 16 else np.uint32)


class TopK(Compressor):
    kind = "topk"
    sparsifier = True

    def __init__(self, fraction: float):
        self.fraction = fraction

    def encode(self, x, draw):
        k = kept(self.fraction, x.size)
        # stable: ties go to the lower index, the same on every machine
        index = np.sort(np.argsort(-np.abs(x), kind="stable")[:k])
        return {"i": index.astype(_index_dtype(x.size)), "v": x[index]}

    def decode(self, parts, size, dtype, draw):
        out = np.zeros(size, dtype)
        out[parts["i"].astype(np.int64)] = parts["v"]
        return out

    def layout(self, size, dtype):
        k = kept(self.fraction, size)
        return {"i": ((k,), _index_dtype(size)), "v": ((k,), np.dtype(dtype))}

    def problem(self, parts, size):
        index = parts["i"].astype(np.int64)
        if index.size and (index[-1] >= size or (np.diff(index) <= 0).any()):
            return f"top-k indices must be increasing and below {size}"
        return None


class RandK(Compressor):
    kind = "randk"
    sparsifier = True

    def __init__(self, fraction: float, unbiased: bool):
        self.fraction, self.unbiased = fraction, unbiased

    def indices(self, size: int, draw: Draw) -> np.ndarray:
        """The k coordinates of this message: uniform without replacement, from the shared stream."""
        return np.sort(draw("randk").choice(size, kept(self.fraction, size), replace=False))

    def scale(self, size: int) -> float:
        return size / kept(self.fraction, size) if self.unbiased else 1.0

    def encode(self, x, draw):
        return {"v": x[self.indices(x.size, draw)] * self.scale(x.size)}

    def decode(self, parts, size, dtype, draw):
        out = np.zeros(size, dtype)
        out[self.indices(size, draw)] = parts["v"]
        return out

    def layout(self, size, dtype):
        return {"v": ((kept(self.fraction, size),), np.dtype(dtype))}


def build(kind: str, **options) -> Compressor:
    """The compressor a config table names (compression/config.py validates the options)."""
    if kind == "fp16":
        return Fp16()
    if kind == "bf16":
        return Bf16()
    if kind in ("int8", "int4"):
        return BlockQuant(int(kind[3:]), options["block"], options["rounding"])
    if kind == "qsgd":
        return QSGD(options["levels"], options["bucket"])
    if kind == "topk":
        return TopK(options["fraction"])
    if kind == "randk":
        return RandK(options["fraction"], options["unbiased"])
    raise ValueError(f"unknown compressor {kind!r}")
