"""``[secagg]``: secure aggregation of FedAvg's (and FedProx's) uplinks."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from taciturn.algorithms.base import StrictModel
from taciturn.core.errors import TaciturnError


class SecAggFailed(TaciturnError):
    """Too few clients survived to rebuild a secret: the round's sum cannot be unmasked."""


class SecAggConfig(StrictModel):
    enabled: bool = Field(False, description="the server learns only the sum of the round's updates")
    clip: float = Field(0.1, gt=0, description="quantisation range: each coordinate clipped to [-clip, clip]")
    bits: int = Field(16, ge=2, le=30, description="quantisation levels 2^bits - 1 (clients x 2^bits < 2^32)")
    graph: Literal["complete", "sparse"] = Field(
        "complete", description="complete: SecAgg (Bonawitz et al.); sparse: SecAgg+ (Bell et al.)"
    )
    neighbours: int = Field(8, ge=2, description="sparse: k, each client's neighbours (a Harary graph)")
    threshold: float = Field(
        0.5, gt=0, lt=1, description="t = floor(threshold x neighbours) + 1 shares rebuild a secret"
    )

    @model_validator(mode="after")
    def _even_degree(self) -> SecAggConfig:
        if self.graph == "sparse" and self.neighbours % 2:
            raise ValueError("secagg.neighbours must be even (k/2 neighbours on each side of the ring)")
        return self
