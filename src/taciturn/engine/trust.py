"""The averaging weight the server gives an uplink: what the server knows, not what the client claims.

FedAvg weights client k by n_k (McMahan et al. 2017, Alg. 1), and n_k travels as the uplink's
``num_samples``; trusted as sent, one client claiming 10^12 samples owns the average. The server
replaces it before any aggregation (``[server] weights``):
* ``known``: the size the server knows for the client (in simulation, its partition's size);
* ``capped``: the reported count, capped at ``max_samples`` (a deployment that cannot know sizes);
* ``equal``: 1 for every client (a plain mean, as client-level DP needs; McMahan et al. 2018).
Algorithms whose weights are fractions of the population (SCAFFOLD's p_i = n_i / n) get the
population's total under the same rule (``total``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from taciturn.algorithms.base import StrictModel
from taciturn.core.message import Message
from taciturn.tasks.base import ClientData

WEIGHT_KEY = "num_samples"


class TrustConfig(StrictModel):
    weights: Literal["known", "capped", "equal"] = Field(
        "known",
        description="uplink weights: the client's known data size, the reported size capped at "
        "max_samples, or equal weights",
    )
    max_samples: int | None = Field(None, ge=1, description="the cap for weights = 'capped'")

    @model_validator(mode="after")
    def _cap_given(self) -> TrustConfig:
        if (self.weights == "capped") != (self.max_samples is not None):
            raise ValueError("server.max_samples goes with server.weights = 'capped' (and only with it)")
        return self


class TrustedWeights:
    def __init__(self, config: TrustConfig, data: ClientData):
        self.config = config
        self.data = data

    def weight(self, client: int, reported: int) -> int:
        """The weight the server gives ``client``'s uplink that reported ``reported`` samples."""
        if self.config.weights == "known":
            return self.data.client_size(client)
        if self.config.weights == "capped":
            assert self.config.max_samples is not None
            return min(reported, self.config.max_samples)
        return 1

    def total(self) -> int:
        """The population's total weight under the same rule (n = sum_k n_k for known sizes)."""
        if self.config.weights == "equal":
            return self.data.num_clients
        sizes = (self.data.client_size(c) for c in range(self.data.num_clients))
        if self.config.weights == "capped":
            assert self.config.max_samples is not None
            return sum(min(size, self.config.max_samples) for size in sizes)
        return self.data.num_samples

    def apply(self, client: int, message: Message) -> Message:
        """``message`` with its weight replaced by the server's (arrays shared, not copied)."""
        reported = message.meta.get(WEIGHT_KEY)
        if not isinstance(reported, int):
            return message
        return Message(message.arrays, {**message.meta, WEIGHT_KEY: self.weight(client, reported)})
