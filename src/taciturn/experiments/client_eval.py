"""Client-side evaluation: the global model scored on sampled clients' own held-out splits.

Federated papers report how the global model does on each client's own data, and the spread of
those numbers (e.g. the 10th percentile of per-client accuracy, "fairness" in q-FFL, Li et al.,
ICLR 2020; LEAF, Caldas et al. 2018, evaluates on each user's test split). With ``[eval] clients =
f``, at every evaluation a sample of ``max(1, floor(f K'))`` of the K' clients that hold a
held-out split (data/client_holdout.py) is drawn from the run's stream (round, server,
"client_eval"), and each scores the global model on its own held-out samples. For every score ``m``
of the task (``loss``, ``accuracy`` or your metrics) the row gets:

- ``client_<m>``: the mean weighted by held-out size (the score of the pooled samples, as
  Flower's weighted average of client evaluations),
- ``client_<m>_mean``: the unweighted mean over clients (each client counts once),
- ``client_<m>_min``, ``_p10``, ``_p50``, ``_p90``, ``_max``: the distribution over clients
  (quantiles by linear interpolation, numpy's default),
- ``client_<m>_by_client``: each evaluated client's value, keyed by its id;

and ``eval_clients``, ``eval_samples``: how many clients and held-out samples were evaluated. This
is the global model's evaluation, so it runs in the main process whatever the executor.
"""

from __future__ import annotations

import math

import numpy as np

from taciturn.core.params import Params
from taciturn.core.rng import SERVER, Streams
from taciturn.data.federated import FederatedData
from taciturn.tasks.classification import ClassificationTask

PREFIX = "client_"
QUANTILES = {"p10": 0.1, "p50": 0.5, "p90": 0.9}
PURPOSE = "client_eval"


class ClientEvaluation:
    def __init__(self, fraction: float, task: ClassificationTask, data: FederatedData, streams: Streams):
        assert data.held_out is not None, "[eval] clients carves each client's held-out split first"
        self.task, self.data, self.held_out, self.streams = task, data, data.held_out, streams
        sizes = np.array([self.held_out.client_size(c) for c in range(self.held_out.num_clients)])
        self.eligible = np.flatnonzero(sizes > 0)  # clients too small to hold any sample out are never scored
        if len(self.eligible) == 0:
            raise ValueError(
                "no client holds enough samples to hold one out; raise eval.client_holdout or give the "
                "clients more data"
            )
        self.per_evaluation = max(1, math.floor(round(fraction * len(self.eligible), 6)))

    def sample(self, round: int) -> list[int]:
        """The clients evaluated after ``round`` (sorted), from the run's stream for that round."""
        rng = self.streams.numpy(round, SERVER, PURPOSE)
        return sorted(int(c) for c in rng.choice(self.eligible, size=self.per_evaluation, replace=False))

    def scores(self, params: Params, round: int) -> dict[str, object]:
        clients = self.sample(round)
        sizes = np.array([self.held_out.client_size(c) for c in clients], dtype=np.float64)
        held_out = [self.data.batch(self.held_out.client_indices(c)) for c in clients]
        each = [self.task.evaluate_on(params, x, y) for x, y in held_out]
        row: dict[str, object] = {"eval_clients": len(clients), "eval_samples": int(sizes.sum())}
        for key in each[0]:
            values = np.array([s[key] for s in each], dtype=np.float64)
            row[f"{PREFIX}{key}"] = float(values @ sizes / sizes.sum())
            row[f"{PREFIX}{key}_mean"] = float(values.mean())
            row[f"{PREFIX}{key}_min"] = float(values.min())
            for name, q in QUANTILES.items():
                row[f"{PREFIX}{key}_{name}"] = float(np.quantile(values, q))
            row[f"{PREFIX}{key}_max"] = float(values.max())
            row[f"{PREFIX}{key}_by_client"] = {str(c): float(v) for c, v in zip(clients, values, strict=True)}
        return row
