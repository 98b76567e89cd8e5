"""``[privacy]``: client-level DP for algorithms whose uplink is a model delta."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from taciturn.algorithms.base import StrictModel

# What every report of a run with seeded noise says where it would give an epsilon.
NOT_PRIVATE = "not private: reproducible noise"


class PrivacyConfig(StrictModel):
    enabled: bool = Field(False, description="clip client updates and add Gaussian noise")
    mode: Literal["central", "local"] = Field(
        "central", description="central: noise on the sum at the server; local: each client noises its own"
    )
    clip: float = Field(1.0, gt=0, description="S: every client update is clipped to this L2 norm")
    noise_multiplier: float | None = Field(
        None, gt=0, description="z: noise std = z S (or set target_epsilon)"
    )
    target_epsilon: float | None = Field(
        None,
        gt=0,
        description="solve z so that the run ends at this epsilon (local: one participation costs it)",
    )
    delta: float = Field(1e-5, gt=0, lt=1, description="the delta of (epsilon, delta)-DP")
    accountant: Literal["rdp", "pld"] = Field("rdp", description="Renyi DP or privacy loss distributions")
    sampling: Literal["poisson", "fixed"] = Field(
        "poisson",
        description="poisson: each client joins a round with probability algorithm.fraction (the "
        "accountants' Poisson subsampling); fixed: exactly fraction N clients, without replacement",
    )
    reproducible_noise: bool = Field(
        False,
        description="research only: draw the noise from the run seed (which is public), so two runs "
        "repeat bit for bit and anyone with the config can remove it: the run is labelled 'not private'",
    )

    @model_validator(mode="after")
    def _one_noise_source(self) -> PrivacyConfig:
        if self.enabled and (self.noise_multiplier is None) == (self.target_epsilon is None):
            raise ValueError("[privacy] set exactly one of noise_multiplier and target_epsilon")
        if self.accountant == "pld" and self.sampling == "fixed":
            raise ValueError(
                "[privacy] dp-accounting's PLD accountant has no fixed-size sampling; use accountant = 'rdp' "
                "or sampling = 'poisson'"
            )
        return self
