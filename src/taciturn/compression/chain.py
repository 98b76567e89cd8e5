"""A link's compression, in optax's shape: pieces with ``init`` and their own state, composed.

* ``ArrayChain``: the list of compressors one float array goes through, at most a sparsifier then
  a quantiser of its kept values (["topk", "fp16"]: indices and half-precision values); decoding
  runs the list backwards.
* ``Compress``: the chain applied to every float array of a message. Array ``w`` becomes the parts
  ``w#<part>`` (``w#i`` indices, ``w#v`` values, ``w#v#q`` codes of those values...) and the metadata
  ``w#`` = "<dtype>:<shape>", which the receiver needs to rebuild it (and checks against what it
  expects). Integer and boolean arrays (counts, seeds) travel as they are. Stateless.
* ``ErrorFeedback(inner)``: Stich, Cordonnier, Jaggi, "Sparsified SGD with Memory", NeurIPS 2018,
  Alg. 1 (and Karimireddy et al. 2019's EF-SGD): the sender keeps e, sends C(x + e) and keeps
  e <- x + e - D(C(x + e)), what compression dropped, to add to its next message. The receiver keeps
  nothing. The sender's state is client state: it takes effect under the acceptance rule
  (engine/pipeline.py), so a lost or rejected message does not consume the memory.
* ``Reference(inner)``: the sender sends the compressed change from a reference both sides hold,
  C(x - r), and both set r <- r + D(C(x - r)); the receiver's copy is r. On the uplink this is EF21
  (Richtarik, Sokolov, Fatkhullin, "EF21: A New, Simpler, Theoretically Better, and Practically
  Faster Error Feedback", NeurIPS 2021, Alg. 1: g_i <- g_i + C(grad_i - g_i), from g_i = 0), with the
  server's copies kept per client as in its partial-participation variant (Fatkhullin et al., "EF21
  with Bells & Whistles", 2021, EF21-PP). On the downlink it is EF21-P (Gruntkowska, Tyurin,
  Richtarik, "EF21-P and Friends", ICML 2023, Alg. 1: w <- w + C(x - w)), again one reference per
  client; there a client's first message goes uncompressed (a model is far from 0) and becomes
  the reference. Unlike the memory, the messages shrink to nothing as x settles, even when the
  clients' x differ (heterogeneous data): EF21 reaches the optimum where the memory circles it.

Every random draw (QSGD's rounding, random-k's coordinates, stochastic rounding) comes from a
stream of the run's seeded streams named by (round, owner, link, array, purpose), so a receiver
regenerates random-k's coordinates instead of receiving them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from taciturn.compression.compressors import Compressor, Draw, Layout
from taciturn.core.errors import TaciturnError
from taciturn.core.message import Message

SEP = "#"  # array "w" travels as "w#<part>", described by metadata "w#"
MAX_VALUES = 1 << 31  # a described array larger than this is refused before anything is allocated

State = dict[str, np.ndarray]  # flat arrays by message array name
Draws = Callable[[str], Draw]  # the draws of one array, by its name
Expected = Mapping[str, tuple[tuple[int | None, ...], np.dtype]]  # name -> (shape, dtype) the receiver knows


class CompressionError(TaciturnError, ValueError):
    """A compressed message that does not decode: what is wrong with it."""


@dataclass(frozen=True)
class ArrayChain:
    pieces: tuple[Compressor, ...]

    def __post_init__(self) -> None:
        if not self.pieces or len(self.pieces) > 2 or any(p.sparsifier for p in self.pieces[1:]):
            raise ValueError("a chain is one compressor, or a sparsifier followed by a quantiser")
        if len(self.pieces) == 2 and not self.pieces[0].sparsifier:
            raise ValueError(
                f"'{self.pieces[0].kind}' leaves no values for '{self.pieces[1].kind}' to compress"
            )

    @property
    def unbiased(self) -> bool:
        return all(p.unbiased for p in self.pieces)

    @property
    def for_values(self) -> bool:
        return all(p.for_values for p in self.pieces)

    def _kept(self, size: int, dtype: np.dtype) -> int:
        return self.pieces[0].layout(size, dtype)["v"][0][0]

    def encode(self, x: np.ndarray, draw: Draw) -> dict[str, np.ndarray]:
        parts = self.pieces[0].encode(x, draw)
        if len(self.pieces) == 2:
            values = parts.pop("v")
            inner = self.pieces[1].encode(values, lambda purpose: draw(f"v/{purpose}"))
            parts |= {f"v{SEP}{p}": a for p, a in inner.items()}
        return parts

    def decode(self, parts: Mapping[str, np.ndarray], size: int, dtype: np.dtype, draw: Draw) -> np.ndarray:
        if len(self.pieces) == 2:
            k, head = self._kept(size, dtype), f"v{SEP}"
            inner = {p[len(head) :]: a for p, a in parts.items() if p.startswith(head)}
            values = self.pieces[1].decode(inner, k, dtype, lambda purpose: draw(f"v/{purpose}"))
            parts = {p: a for p, a in parts.items() if not p.startswith(head)} | {"v": values}
        return self.pieces[0].decode(parts, size, dtype, draw)

    def layout(self, size: int, dtype: np.dtype) -> Layout:
        outer = self.pieces[0].layout(size, dtype)
        if len(self.pieces) == 1:
            return outer
        k = outer.pop("v")[0][0]
        return outer | {f"v{SEP}{p}": spec for p, spec in self.pieces[1].layout(k, dtype).items()}

    def problem(self, parts: Mapping[str, np.ndarray], size: int, dtype: np.dtype) -> str | None:
        if len(self.pieces) == 2:
            head = f"v{SEP}"
            inner = {p[len(head) :]: a for p, a in parts.items() if p.startswith(head)}
            if reason := self.pieces[1].problem(inner, self._kept(size, dtype)):
                return reason
        return self.pieces[0].problem(parts, size)


def _describe(array: np.ndarray) -> str:
    return f"{array.dtype.name}:{','.join(str(n) for n in array.shape)}"


def _parse(text: object, name: str) -> tuple[np.dtype, tuple[int, ...]]:
    try:
        dtype_name, shape_text = str(text).split(":")
        dtype = np.dtype(dtype_name)
        shape = tuple(int(n) for n in shape_text.split(",")) if shape_text else ()
    except (ValueError, TypeError):
        raise CompressionError(f"array {name!r}: cannot read its description {text!r}") from None
    if dtype.kind != "f" or any(n < 0 for n in shape) or int(np.prod(shape)) > MAX_VALUES:
        raise CompressionError(f"array {name!r}: {text!r} is not a float array taciturn would send")
    return dtype, shape


class LinkTransform(ABC):
    """One piece of a link's compression: ``encode`` runs at the sender, ``decode`` at the receiver,
    each with its side's state of the piece (``init``: the state before the first message)."""

    stateful = False

    def init(self) -> State:
        return {}

    @abstractmethod
    def encode(self, message: Message, state: State, draws: Draws) -> tuple[Message, State]: ...

    @abstractmethod
    def decode(
        self, message: Message, state: State, draws: Draws, expected: Expected | None
    ) -> tuple[Message, State]:
        """The message as sent, rebuilt, or a CompressionError; ``expected``: the arrays the receiver
        knows it must get (the server's uplink spec), None where it learns them from the message."""


class Compress(LinkTransform):
    def __init__(self, chain: ArrayChain):
        self.chain = chain

    def encode(self, message, state, draws):
        arrays, meta = {}, dict(message.meta)
        for name, array in message.arrays.items():
            if array.dtype.kind != "f":
                arrays[name] = array
                continue
            flat = np.ascontiguousarray(array).reshape(-1)
            arrays |= {f"{name}{SEP}{p}": a for p, a in self.chain.encode(flat, draws(name)).items()}
            meta[name + SEP] = _describe(array)
        return Message(arrays, meta), state

    def decode(self, message, state, draws, expected):
        return Message(*self.rebuild(message, draws, expected)), state

    def rebuild(
        self, message: Message, draws: Draws, expected: Expected | None
    ) -> tuple[dict[str, np.ndarray], dict]:
        """The decoded arrays and the metadata without the descriptions."""
        meta = {k: v for k, v in message.meta.items() if not k.endswith(SEP)}
        described = {k[: -len(SEP)]: v for k, v in message.meta.items() if k.endswith(SEP)}
        arrays = {n: a for n, a in message.arrays.items() if SEP not in n}
        if stray := sorted(n for n, a in arrays.items() if a.dtype.kind == "f"):
            raise CompressionError(f"arrays {stray} arrived uncompressed")
        used: set[str] = set()
        for name, text in sorted(described.items()):
            dtype, shape = _parse(text, name)
            if expected is not None:
                self._check_expected(name, dtype, shape, expected)
            size = int(np.prod(shape))
            layout = self.chain.layout(size, dtype)
            parts = {}
            for part, (part_shape, part_dtype) in layout.items():
                key = f"{name}{SEP}{part}"
                got = message.arrays.get(key)
                if got is None or got.shape != part_shape or got.dtype != part_dtype:
                    what = "missing" if got is None else f"{got.dtype}{list(got.shape)}"
                    raise CompressionError(f"part {key!r} is {what}, expected {part_dtype}{list(part_shape)}")
                parts[part] = got
                used.add(key)
            if reason := self.chain.problem(parts, size, dtype):
                raise CompressionError(f"array {name!r}: {reason}")
            arrays[name] = self.chain.decode(parts, size, dtype, draws(name)).reshape(shape)
        if unused := sorted(set(message.arrays) - used - set(arrays)):
            raise CompressionError(f"unexpected arrays {unused}")
        return arrays, meta

    def _check_expected(self, name: str, dtype: np.dtype, shape: tuple[int, ...], expected: Expected) -> None:
        if name not in expected:
            raise CompressionError(f"unexpected array {name!r}")
        want_shape, want_dtype = expected[name]
        fits = len(shape) == len(want_shape) and all(
            w is None or w == n for n, w in zip(shape, want_shape, strict=True)
        )
        if not fits or dtype != want_dtype:
            raise CompressionError(
                f"array {name!r} is described as {dtype}{list(shape)}, expected {np.dtype(want_dtype)}"
                f"{list(want_shape)}"
            )
        if None in want_shape and not self.chain.for_values:
            # a sparse array's size is only claimed: never allocate what a sender merely claims
            raise CompressionError(f"array {name!r} has no fixed shape, which a sparsifier needs")


class ErrorFeedback(LinkTransform):
    stateful = True

    def __init__(self, inner: Compress):
        self.inner = inner

    def encode(self, message, state, draws):
        corrected = {n: a + state[n].reshape(a.shape) if n in state else a for n, a in message.arrays.items()}
        sent, _ = self.inner.encode(Message(corrected, message.meta), {}, draws)
        arrived, _ = self.inner.rebuild(sent, draws, None)  # what the receiver will rebuild
        memory = {
            n: (corrected[n] - arrived[n]).reshape(-1)
            for n, a in message.arrays.items()
            if a.dtype.kind == "f"
        }
        return sent, memory

    def decode(self, message, state, draws, expected):
        return self.inner.decode(message, state, draws, expected)


class Reference(LinkTransform):
    """Compressed changes from a reference both sides hold (``first``: what a side holds before its
    first message: "zero", EF21's h_i^0 = 0, or "raw": the first message goes uncompressed)."""

    stateful = True

    def __init__(self, inner: Compress, first: str):
        self.inner, self.first = inner, first

    def _held(self, floats: Mapping[str, np.ndarray], state: State) -> State | None:
        """The reference for these arrays; None: none yet and the first message goes raw."""
        if set(state) == set(floats):
            return state
        if self.first == "raw":
            return None
        return {n: np.zeros(a.size, a.dtype) for n, a in floats.items()}

    def encode(self, message, state, draws):
        floats = {n: a for n, a in message.arrays.items() if a.dtype.kind == "f"}
        held = self._held(floats, state)
        if held is None:  # the message itself, uncompressed, becomes the reference
            return message, {n: a.reshape(-1).copy() for n, a in floats.items()}
        change = {n: a - held[n].reshape(a.shape) if n in floats else a for n, a in message.arrays.items()}
        sent, _ = self.inner.encode(Message(change, message.meta), {}, draws)
        arrived, _ = self.inner.rebuild(sent, draws, None)  # what the receiver will rebuild
        return sent, {n: held[n] + arrived[n].reshape(-1) for n in floats}

    def decode(self, message, state, draws, expected):
        if self.first == "raw" and not any(SEP in n for n in message.arrays):  # a first, raw message
            floats = {n: a for n, a in message.arrays.items() if a.dtype.kind == "f"}
            return message, {n: a.reshape(-1).copy() for n, a in floats.items()}
        arrays, meta = self.inner.rebuild(message, draws, expected)
        floats = {n: a for n, a in arrays.items() if a.dtype.kind == "f"}
        held = self._held(floats, state)
        if held is None or any(held[n].size != a.size for n, a in floats.items()):
            raise CompressionError(f"arrays {sorted(floats)} do not match the reference held")
        new = {n: held[n] + a.reshape(-1) for n, a in floats.items()}
        arrays |= {n: new[n].reshape(a.shape) for n, a in floats.items()}
        return Message(arrays, meta), new
