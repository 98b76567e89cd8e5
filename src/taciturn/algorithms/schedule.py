"""Learning-rate schedules: a factor of the base learning rate at step t of T, in closed form.

The same shapes as ``torch.optim.lr_scheduler`` (tests/test_local_optimizers.py steps torch's own
schedulers by hand against these): an optional linear warmup, ``LinearLR(start_factor=1/(w+1),
total_iters=w)``, followed (``SequentialLR`` at milestone w) by the decay over the T - w steps left:
``constant``; ``cosine``, ``CosineAnnealingLR(T_max, eta_min = final * lr)``; ``linear``,
``LinearLR(1, final, T_max)``; ``step``, ``StepLR(step_size, gamma)``; ``exponential``,
``ExponentialLR(gamma)``. A closed form, not a stateful scheduler: a client's factor at its step t
and the server's at round t follow from t alone, so executors that step many clients at once and a
resumed run compute the same numbers without any scheduler state.

Used three ways: over the local steps of one round (``algorithm.local.schedule``, T = the steps that
client takes in the round, restarting each round), over rounds for the local learning rate
(``algorithm.local.round_schedule``) and for the server's (``algorithm.server_schedule``), with
T = the run's rounds unless ``steps`` says otherwise.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from taciturn.algorithms.config import StrictModel


class Schedule(StrictModel):
    kind: Literal["constant", "cosine", "linear", "step", "exponential"] = Field(
        "constant", description="the decay after the warmup"
    )
    warmup: int = Field(0, ge=0, description="steps (or rounds) of linear warmup from lr / (warmup + 1)")
    final: float = Field(0.0, ge=0, le=1, description="cosine, linear: the factor reached at the end")
    gamma: float = Field(0.1, gt=0, le=1, description="step, exponential: the factor per decay")
    step_size: int = Field(1, ge=1, description="step: decay every step_size steps (or rounds)")
    steps: int | None = Field(
        None, ge=1, description="T, the horizon (default: the client's steps in the round; the run's rounds)"
    )

    @model_validator(mode="after")
    def _options_of_its_kind(self) -> Schedule:
        owners = {"final": ("cosine", "linear"), "gamma": ("step", "exponential"), "step_size": ("step",)}
        for key, kinds in owners.items():  # a value other than the default, for another kind
            if getattr(self, key) != type(self).model_fields[key].default and self.kind not in kinds:
                raise ValueError(f"{key} applies only with kind = {' or '.join(map(repr, kinds))}")
        return self

    @property
    def constant(self) -> bool:
        return self.kind == "constant" and self.warmup == 0

    def factor(self, t: int, total: int | None = None) -> float:
        """The learning-rate factor at step ``t`` (0-based) of ``total`` (``steps`` when set)."""
        total = self.steps or total or 1
        if t < self.warmup:
            return (t + 1) / (self.warmup + 1)
        t, span = t - self.warmup, max(total - self.warmup, 1)
        if self.kind == "cosine":
            return self.final + (1 - self.final) * (1 + math.cos(math.pi * min(t, span) / span)) / 2
        if self.kind == "linear":
            return 1 + (self.final - 1) * min(t, span) / span
        if self.kind == "step":
            return self.gamma ** (t // self.step_size)
        if self.kind == "exponential":
            return self.gamma**t
        return 1.0
