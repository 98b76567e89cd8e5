"""Lazy-training analysis that any round-based run can switch on (config table ``[analysis]``).

It measures what Jian & Liu ("Widening the Network Mitigates the Impact of Data Heterogeneity on
FedAvg", ICML 2025) prove shrinks like n^{-1/2} with the width n, on the run's own model:
* ``divergence``: sum_i p_i ||theta_i - theta_bar|| of the clients' trained models (Thm 1);
* ``weight_change``: sqrt(||w_t - w_0||^2 / |w|), how far the global model moved (Figs. 3-4);
* ``ntk_change``: ||Theta_t - Theta_0||_F / ||Theta_0||_F of the global model's empirical NTK on
  the probe points (Thm 1, Figs. 3-4);
* ``linearization``: RMSE between f(w_t) and f(w_0) + J(w_0)(w_t - w_0) on the probe points (Thm 2);
* ``centralized``: the FedAvg-vs-centralized comparison (Thm 3, Fig. 6). A twin model starts from
  the same initial parameters and, every round, takes as many gradient steps as each client does
  (``algorithm.local.steps``), with the same optimizer, on the pooled training data: centralized
  (full-batch, if the batch size covers the pooled data) gradient descent with the same total
  number of steps. It is literally FedAvg with one client holding all the data. Rows then carry
  the RMSE between the two models' outputs on the probe points and between their parameters, and
  the twin's test loss and accuracy.
Probe points are a seeded sample of the pooled training set (``probe_size``, all of it if fewer).

Parameter distances (divergence, weight change, parameter RMSE to the twin) are measured on the
effective weights, s_w W and s_b b as the forward pass uses them (tasks/layers.py), so they do not
depend on the parameterisation: under the NTK parameterisation the raw N(0, 1) parameters of the
clients differ by O(1) in norm whatever the width, while the effective weights differ by
O(n^{-1/2}), which is the statement of Jian & Liu's Thm 1 (their code uses the standard
parameterisation, where the two coincide).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import Field
from torch import nn

from taciturn.algorithms.base import Algorithm, ClientContext, LocalTraining, StrictModel
from taciturn.algorithms.fedavg import FedAvg, FedAvgConfig
from taciturn.core.params import Params, clone
from taciturn.core.rng import SERVER, Streams
from taciturn.data.federated import FederatedData
from taciturn.engine.federation import RoundReport
from taciturn.engine.local_training import train_locally
from taciturn.tasks.base import Task
from taciturn.tasks.layers import effective_scales
from taciturn.tasks.lazy import divergence, linearization_rmse, outputs, param_rmse, rmse
from taciturn.tasks.ntk import empirical_ntk, relative_change


class AnalysisConfig(StrictModel):
    divergence: bool = Field(False, description="sum_i p_i ||theta_i - theta_bar|| of the trained clients")
    weight_change: bool = Field(False, description="sqrt(||w_t - w_0||^2 / |w|) of the global model")
    ntk_change: bool = Field(False, description="relative change of the empirical NTK on the probe points")
    linearization: bool = Field(False, description="RMSE between f and its linearisation around w_0")
    centralized: bool = Field(False, description="train a centralized twin with the same number of steps")
    probe_size: int = Field(
        256, ge=1, description="training points for ntk_change, linearization, centralized"
    )

    @property
    def enabled(self) -> bool:
        return (
            self.divergence or self.weight_change or self.ntk_change or self.linearization or self.centralized
        )


@dataclass
class TwinState:
    """The centralized twin: its parameters and its optimizer's state (engine/optimizers.py), checkpointed."""

    params: Params
    momentum: Params | None  # the optimizer's state (named so for checkpoints of older runs)


class PooledData:
    """The federated training set seen as one client that holds all of it (whatever its id)."""

    def __init__(self, data: FederatedData):
        self.data = data
        self.indices = np.sort(data.order)

    num_clients = 1

    def client_size(self, client: int) -> int:
        return len(self.indices)

    def client_indices(self, client: int) -> np.ndarray:
        return self.indices

    def batch(self, indices: np.ndarray) -> Any:
        return self.data.batch(indices)


class Analysis:
    def __init__(
        self,
        config: AnalysisConfig,
        model: nn.Module,
        task: Task,
        data: FederatedData,
        algorithm: Algorithm,
        streams: Streams,
    ):
        self.config = config
        self.model = model
        self.task = task
        self.algorithm = algorithm
        self.streams = streams
        self.pooled = PooledData(data)
        self.scales = {k: s for k, s in effective_scales(model).items() if s != 1.0}
        # Centralized SGD is FedAvg's local training on the pooled data: one optimizer, one code path.
        self.twin_algorithm = FedAvg(FedAvgConfig(local=algorithm.config.local))
        self.twin: TwinState | None = None
        self.twin_train_loss: float | None = None
        self.last_divergence: float | None = None

    def effective(self, params: Params) -> Params:
        """The weights as the forward pass uses them (scaled layers' factors applied)."""
        return {k: v * self.scales[k] if k in self.scales else v for k, v in params.items()}

    def begin(self, params0: Params, twin: TwinState | None = None) -> None:
        """Record the initial parameters (and restore the twin when resuming)."""
        self.params0 = clone(params0)
        n = len(self.pooled.indices)
        rng = self.streams.numpy(0, SERVER, "probe")
        chosen = np.sort(rng.choice(n, size=min(self.config.probe_size, n), replace=False))
        self.x_probe = self.pooled.batch(self.pooled.indices[chosen])[0]
        if self.config.ntk_change:
            self.ntk0 = empirical_ntk(self.model, self.params0, self.x_probe)
        if self.config.centralized:
            self.twin = twin or TwinState(clone(params0), None)

    def after_round(self, round: int, started_from: Any, report: RoundReport) -> None:
        """Per-round work: the clients' divergence, and the twin's steps for this round."""
        if self.config.divergence:
            models = self.algorithm.client_models(started_from, report.arrivals)
            self.last_divergence = (
                divergence([self.effective(m) for _, m in models], [w for w, _ in models]) if models else None
            )
        if self.twin is not None:
            size = len(self.pooled.indices)
            ctx = ClientContext(SERVER, round, None, None, size, self.streams, self.pooled, self.task.loss)
            work = LocalTraining(self.twin.params, {}, self.twin.momentum)
            result = train_locally(self.twin_algorithm, ctx, work, self.twin_algorithm.config.local)
            self.twin = TwinState(result.params, result.optimizer_state)
            self.twin_train_loss = result.mean_loss

    def checkpoint_extras(self) -> dict[str, TwinState]:
        """What a checkpoint must keep to resume the analysis exactly (runner: ``load_extra``)."""
        return {} if self.twin is None else {"analysis": self.twin}

    def metrics(self, params: Params) -> dict[str, float | None]:
        """This evaluation's analysis columns for the global model ``params``."""
        row: dict[str, float | None] = {}
        if self.config.divergence:
            row["divergence"] = self.last_divergence
        if self.config.weight_change:
            row["weight_change"] = param_rmse(self.effective(params), self.effective(self.params0))
        if self.config.ntk_change:
            row["ntk_change"] = relative_change(self.ntk0, empirical_ntk(self.model, params, self.x_probe))
        if self.config.linearization:
            row["linearization_rmse"] = linearization_rmse(self.model, self.params0, params, self.x_probe)
        if self.twin is not None:
            twin_scores = self.task.evaluate(self.twin.params)
            row |= {
                "centralized_output_rmse": rmse(
                    outputs(self.model, params, self.x_probe),
                    outputs(self.model, self.twin.params, self.x_probe),
                ),
                "centralized_param_rmse": param_rmse(
                    self.effective(params), self.effective(self.twin.params)
                ),
                "centralized_loss": twin_scores["loss"],
                "centralized_accuracy": twin_scores["accuracy"],
                "centralized_train_loss": self.twin_train_loss,
            }
        return row
