"""``[aggregation]``: how the server combines the updates that passed validation."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from taciturn.algorithms.base import StrictModel


class AggregationConfig(StrictModel):
    kind: Literal["mean", "median", "trimmed_mean", "krum", "multi_krum", "centered_clip"] = Field(
        "mean", description="the aggregation rule (server/coordinatewise.py, krum.py, centered_clip.py)"
    )
    trim: float = Field(0.1, ge=0, lt=0.5, description="trimmed_mean: fraction beta cut at each end")
    byzantine: int = Field(1, ge=0, description="krum, multi_krum: f, the attackers tolerated per round")
    select: int | None = Field(None, ge=1, description="multi_krum: updates averaged (default n - f)")
    tau: float = Field(1.0, gt=0, description="centered_clip: the clipping radius around the center")
    iterations: int = Field(1, ge=1, description="centered_clip: L, clipping iterations per round")
    clip_norm: float | None = Field(
        None, gt=0, description="bound every update's L2 norm (the initial bound when adaptive)"
    )
    adaptive: bool = Field(False, description="adapt clip_norm to a quantile of the norms (Andrew et al.)")
    target_quantile: float = Field(0.5, gt=0, lt=1, description="adaptive: gamma, the unclipped fraction")
    clip_lr: float = Field(0.2, gt=0, description="adaptive: eta_C, the geometric step")

    @model_validator(mode="after")
    def _consistent(self) -> AggregationConfig:
        if self.adaptive and self.clip_norm is None:
            raise ValueError("aggregation.adaptive adapts clip_norm: set aggregation.clip_norm (its start)")
        return self

    @property
    def per_client(self) -> bool:
        """Whether the server needs every client's update (not just the algorithm's partial sums)."""
        return self.kind != "mean" or self.clip_norm is not None
