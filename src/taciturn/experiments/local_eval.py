"""FedBN's evaluation: each client's own model on held-out data like its own.

Li, Jiang, Zhang, Kamp, Dou, "FedBN: Federated Learning on Non-IID Features via Local Batch
Normalization", ICLR 2021, Sec. 5: with local BatchNorm every client has its own model, the global
weights with its own statistics, and the paper reports each client's model on that client's test
data, averaged over the clients.

Clients here have no test split of their own: a run has one held-out set. So client k's model is
scored on that set re-weighted to k's label distribution, sum_c p_k(c) score_k(held-out samples of
class c), p_k(c) = n_k(c) / n_k over the classes the held-out set has: the held-out data k would see
if its test set were drawn like its training set. That is exact for label skew; a feature shift
between clients (FedBN's own case) is not captured, because the held-out samples have no owners.
Targets that are not classes: the whole held-out set. Clients that never trained hold no statistics
(their model is the global one) and are left out of the average.
"""

from __future__ import annotations

import numpy as np
import torch

from taciturn.core.params import Params
from taciturn.core.state_store import ClientStateStore
from taciturn.data.federated import FederatedData
from taciturn.tasks.classification import ClassificationTask


def local_scores(
    task: ClassificationTask,
    data: FederatedData,
    store: ClientStateStore,
    params: Params,
    names: frozenset[str],
) -> dict[str, float | int]:
    """``local_<metric>``: the mean over clients of their own models' scores; ``local_clients``: how many."""
    counts = data.histogram()  # (clients x classes), or one column of sizes
    held_out = None  # which classes the held-out set has (None: targets are not classes)
    if data.dataset.num_classes:
        held_out = torch.bincount(task.y_test, minlength=counts.shape[1]).cpu().numpy()[: counts.shape[1]] > 0
    scores = [
        _client_scores(
            task,
            params | {n: s[f"buffers/{n}"].to(params[n].device) for n in names},
            counts[client],
            held_out,
        )
        for client in sorted(store.clients())
        if (s := store.get(client)) is not None
    ]
    if not scores:
        return {"local_clients": 0}
    return {"local_clients": len(scores)} | {
        f"local_{key}": float(np.mean([s[key] for s in scores])) for key in scores[0]
    }


def _client_scores(
    task: ClassificationTask, params: Params, counts: np.ndarray, held_out: np.ndarray | None
) -> dict[str, float]:
    if held_out is None:
        return task.evaluate(params)
    weights = counts.astype(np.float64) * held_out
    if weights.sum() == 0:  # none of the client's classes is held out: score it on all of them
        return task.evaluate(params)
    weights /= weights.sum()
    y = task.y_test
    total: dict[str, float] = {}
    for c in np.flatnonzero(weights):
        mask = y == int(c)
        for key, value in task.evaluate_on(params, task.x_test[mask], y[mask]).items():
            total[key] = total.get(key, 0.0) + float(weights[c]) * value
    return total
