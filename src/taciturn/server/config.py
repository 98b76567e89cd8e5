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

    def problem(self, per_round: int) -> str | None:
        """Why the rule cannot keep its guarantee in rounds of ``per_round`` updates, or None
        (checked before work; a round that shrinks below it is skipped, server/krum.py)."""
        f = self.byzantine
        if self.kind in ("krum", "multi_krum") and per_round <= 2 * f + 2:
            return (
                f"aggregation.kind = '{self.kind}' tolerates byzantine = {f} attackers only among more "
                f"than 2f + 2 = {2 * f + 2} updates a round (Blanchard et al. 2017, Prop. 1), and a round "
                f"has {per_round}: sample more clients or lower aggregation.byzantine"
            )
        if self.kind == "multi_krum" and self.select is not None and self.select > per_round - f:
            return (
                f"aggregation.select = {self.select} averages more than the n - f = {per_round - f} "
                "updates that are surely honest in a round; use at most that"
            )
        if self.kind == "trimmed_mean" and self.trim > 0 and per_round < 3:
            return (
                f"aggregation.trim = {self.trim} removes at least one update at each end, which needs "
                f"3 or more updates a round, and a round has {per_round}"
            )
        return None

    @property
    def per_client(self) -> bool:
        """Whether the server needs every client's update (not just the algorithm's partial sums)."""
        return self.kind != "mean" or self.clip_norm is not None
