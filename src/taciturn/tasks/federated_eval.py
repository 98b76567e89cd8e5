"""Federated evaluation: the clients evaluate the global model on their own held-out splits.

When the server holds no held-out data (a silo federation: each client's records stay on its
node), each client k scores the global model on its own held-out split of n_k samples, and the
server reports sum_k n_k m_k / sum_k n_k for every metric m. Each m_k is a mean over the client's
samples (mean loss, accuracy), so this is the metric over all the clients' held-out samples
pooled, the same number a server holding them all would compute. The simulation of the same
per-client data computes it the same way, client by client in id order (experiments/clients.py),
so a deployment and its simulation report the same metrics.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from taciturn.core.params import Params


@dataclass(frozen=True)
class Scores:
    client: int
    samples: int  # n_k: the client's held-out samples
    metrics: Mapping[str, float]  # each a mean over those samples


def pooled(scores: Sequence[Scores]) -> dict[str, float | int]:
    """The sample-weighted mean of each metric over the clients (in client order), and how many
    clients and samples it covers; NaN metrics when no client answered."""
    scores = sorted(scores, key=lambda s: s.client)
    total = sum(s.samples for s in scores)
    counts = {"eval_clients": len(scores), "eval_samples": total}
    if not total:
        return counts
    names = list(scores[0].metrics)
    return {
        name: math.fsum(s.samples * float(s.metrics[name]) for s in scores) / total for name in names
    } | counts


class SiloEvaluation:
    """How a run on per-client data evaluates, said in every metrics row (``eval_on``): on the
    server's own held-out set (``clients`` None: the wrapped task's ``evaluate``), or federated
    (``clients(task, params)``: the clients' Scores). The rest (loss, parameters, model) is the
    wrapped task's. ``note``: the same in words, for run.json and the report."""

    def __init__(self, task: Any, clients: Callable[[Any, Params], Sequence[Scores]] | None, note: str):
        self.task, self.clients, self.evaluation = task, clients, note

    def evaluate(self, params: Params) -> dict[str, Any]:
        if self.clients is None:
            return self.task.evaluate(params) | {"eval_on": "server"}
        scores = pooled(self.clients(self.task, params))
        if "loss" not in scores:  # nobody answered: the run goes on, its row says so
            scores = {"loss": math.nan, self.task.primary_metric: math.nan} | scores
        return scores | {"eval_on": "clients"}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.task, name)
