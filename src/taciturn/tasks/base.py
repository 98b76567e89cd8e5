"""What a task gives the rest of taciturn: parameters, a pure loss, and an evaluation.

Executors only need ``loss(params, batch)``; the runner only needs ``init_params`` and
``evaluate``. A task binds its own test data, so evaluation is ``evaluate(params)``.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from taciturn.core.params import Params


class Task(Protocol):
    primary_metric: str  # the evaluate() key plots and reports lead with (e.g. "accuracy")

    def init_params(self, generator: torch.Generator) -> Params: ...

    def loss(self, params: Params, batch: Any) -> torch.Tensor: ...

    def evaluate(self, params: Params) -> dict[str, float]:
        """At least {"loss": ..., primary_metric: ...} on the task's held-out data."""
        ...


class ClientData(Protocol):
    """A federated training set: index arrays per client, batches gathered from shared storage."""

    @property
    def num_clients(self) -> int: ...

    @property
    def num_samples(self) -> int:
        """All clients' samples together."""
        ...

    def client_size(self, client: int) -> int: ...

    def client_indices(self, client: int) -> Any: ...

    def batch(self, indices: Any) -> Any: ...
