"""``[compression]``: what the uplink and the downlink do to a message's float arrays.

    [compression]
    up = [{ kind = "topk", fraction = 0.01 }, "fp16"]   # a chain: a sparsifier, then a quantiser
    up_feedback = "memory"                                # Stich et al. 2018's error memory
    down = ["int8"]                                       # the broadcast in 8 bits per value
    down_feedback = "none"                                # or "ef21p": compressed changes

A chain item is a compressor's name or a table with its options (compression/compressors.py).
Which combinations hold with the algorithm, SecAgg, DP and the robust rules is checked on the
whole run config (experiments/config.py, ``_compression_fits``), before any work.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from taciturn.algorithms.base import StrictModel
from taciturn.compression.chain import ArrayChain, Compress, ErrorFeedback, LinkTransform, Reference
from taciturn.compression.compressors import build


class Fp16Options(StrictModel):
    kind: Literal["fp16"]


class Bf16Options(StrictModel):
    kind: Literal["bf16"]


class IntOptions(StrictModel):
    kind: Literal["int8", "int4"]
    block: int = Field(64, ge=1, le=1 << 20, description="values sharing one float32 absmax scale")
    rounding: Literal["nearest", "stochastic"] = Field(
        "nearest", description="nearest (biased, error <= scale/2) or stochastic (unbiased)"
    )


class QsgdOptions(StrictModel):
    kind: Literal["qsgd"]
    levels: int = Field(16, ge=1, le=32767, description="s: quantisation levels per sign")
    bucket: int = Field(512, ge=1, le=1 << 24, description="values sharing one norm (the paper's d)")


class TopkOptions(StrictModel):
    kind: Literal["topk"]
    fraction: float = Field(0.01, gt=0, le=1, description="share of each array's values kept")


class RandkOptions(StrictModel):
    kind: Literal["randk"]
    fraction: float = Field(0.01, gt=0, le=1, description="share of each array's values kept")
    unbiased: bool = Field(True, description="scale kept values by d/k (unbiased); false: unscaled")


Piece = Annotated[
    Fp16Options | Bf16Options | IntOptions | QsgdOptions | TopkOptions | RandkOptions,
    Field(discriminator="kind"),
]
SPARSIFIERS = ("topk", "randk")
FOR_VALUES = ("fp16", "bf16", "int8", "int4")  # error bounded per value or block


def _chain_problem(direction: str, chain: tuple[Any, ...]) -> str | None:
    kinds = [p.kind for p in chain]
    if (
        len(kinds) > 2
        or any(k in SPARSIFIERS for k in kinds[1:])
        or (len(kinds) == 2 and kinds[0] not in SPARSIFIERS)
    ):
        return (
            f"compression.{direction} = {kinds}: a chain is one compressor, or a sparsifier (topk, randk) "
            "followed by one quantiser of its kept values (fp16, bf16, int8, int4, qsgd)"
        )
    return None


class CompressionConfig(StrictModel):
    up: tuple[Piece, ...] = Field((), description="uplink chain: each client update, as it is sent")
    down: tuple[Piece, ...] = Field((), description="downlink chain: what the server sends")
    up_feedback: Literal["none", "memory", "ef21"] = Field(
        "none",
        description="memory: each client keeps what compression dropped and adds it next time (Stich et "
        "al. 2018); ef21: each client sends the compressed change from a reference the server also "
        "keeps (Richtarik et al. 2021)",
    )
    down_feedback: Literal["none", "ef21p"] = Field(
        "none",
        description="ef21p: the server sends each client the compressed change from the copy that client "
        "holds (Gruntkowska et al. 2023, one copy per client on both sides)",
    )

    @model_validator(mode="before")
    @classmethod
    def _names_are_tables(cls, tree: Any) -> Any:
        """``up = ["fp16"]`` is short for ``up = [{ kind = "fp16" }]``."""
        if isinstance(tree, dict):
            for key in ("up", "down"):
                if isinstance(tree.get(key), list | tuple):
                    tree = {**tree, key: [{"kind": p} if isinstance(p, str) else p for p in tree[key]]}
        return tree

    @model_validator(mode="after")
    def _consistent(self) -> CompressionConfig:
        for direction in ("up", "down"):
            if reason := _chain_problem(direction, getattr(self, direction)):
                raise ValueError(reason)
        if self.up_feedback != "none" and not self.up:
            raise ValueError("compression.up_feedback needs an uplink chain: set compression.up")
        if self.down_feedback != "none" and not self.down:
            raise ValueError("compression.down_feedback needs a downlink chain: set compression.down")
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.up or self.down)

    @staticmethod
    def for_values(chain: tuple[Any, ...]) -> bool:
        return all(p.kind in FOR_VALUES for p in chain)

    def transform(self, direction: str) -> LinkTransform | None:
        chain = getattr(self, direction)
        if not chain:
            return None
        compress = Compress(ArrayChain(tuple(build(**p.model_dump()) for p in chain)))
        feedback = self.up_feedback if direction == "up" else self.down_feedback
        if feedback == "memory":
            return ErrorFeedback(compress)
        if feedback == "ef21":
            return Reference(compress, first="zero")
        if feedback == "ef21p":
            return Reference(compress, first="raw")
        return compress
