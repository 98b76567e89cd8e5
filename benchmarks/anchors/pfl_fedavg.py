"""pfl-research FedAvg on the plan: FederatedAveraging on pfl's in-process SimulatedBackend.

The model is a pfl PyTorchModel around the planned network (`loss` and `metrics` added) with a
central SGD optimizer of lr 1.0, so the central update is exactly the weighted mean of the
clients' updates; WeightByDatapoints weights each client by its number of samples. The
FederatedDataset's user sampler returns the plan's (round, slot) pairs in order, so each
central iteration's cohort is `plan.round_clients[r]`, and each user's Dataset holds
`plan.client_data(round, slot)`, which pfl splits into consecutive batches of the plan's batch
size (local SGD: 1 epoch, the plan's lr). The global model is evaluated with
`workload.evaluate` after the rounds where `plan.evaluate_now`, from a pfl callback (pfl's own
CentralEvaluationCallback evaluates before training and after iterations k*n, i.e. at other
rounds). pfl itself evaluates the first round's users locally before and after training
(central iteration 0 is always an evaluation iteration); kept, it is pfl's behaviour.

Settings, the fastest of the reference measurements on 2 cores (pfl 0.6): 1 process x 2 torch
threads (2 pfl workers via torchrun x 1 thread each gained nothing and cost 2x memory).

usage: python pfl_fedavg.py PLAN_DIR OUT.json     (in benchmarks/.venv-pfl; see `make bench-env`)
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from pfl.aggregate.simulate import SimulatedBackend
from pfl.aggregate.weighting import WeightByDatapoints
from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
from pfl.callback.base import TrainingProcessCallback
from pfl.data.dataset import Dataset
from pfl.data.federated_dataset import FederatedDataset
from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
from pfl.metrics import Metrics, Weighted
from pfl.model.pytorch import PyTorchModel
from torch import nn
from workload import Plan, evaluate, write_result

THREADS = 2


class PflNet(nn.Module):
    """The planned network with the `loss` and `metrics` methods pfl's PyTorchModel calls."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self(x), y)

    @torch.no_grad()
    def metrics(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, Weighted]:
        out = self(x)
        return {
            "loss": Weighted(F.cross_entropy(out, y, reduction="sum").item(), len(y)),
            "accuracy": Weighted((out.argmax(1) == y).sum().item(), len(y)),
        }


class Evaluation(TrainingProcessCallback):
    """Central evaluation after the planned rounds."""

    def __init__(self, plan: Plan, net: nn.Module) -> None:
        self.plan, self.net, self.evals = plan, net, []

    def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
        round = central_iteration + 1
        if self.plan.evaluate_now(round):
            self.evals.append({"round": round, **evaluate(self.net)})
        return False, Metrics()


def main(plan_dir: str, out: str) -> None:
    torch.set_num_threads(THREADS)
    plan = Plan(plan_dir)
    planned = iter([(r, slot) for r in range(plan.rounds) for slot in range(plan.per_round)])

    def make_dataset(uid: tuple[int, int]) -> Dataset:
        r, slot = uid
        return Dataset(raw_data=plan.client_data(r, slot), user_id=str(plan.round_clients[r, slot]))

    net = PflNet(plan.model())
    model = PyTorchModel(
        model=net,
        local_optimizer_create=torch.optim.SGD,
        central_optimizer=torch.optim.SGD(net.parameters(), lr=1.0),
    )
    data = FederatedDataset(make_dataset_fn=make_dataset, user_sampler=lambda: next(planned))
    backend = SimulatedBackend(training_data=data, val_data=data, postprocessors=[WeightByDatapoints()])
    evaluation = Evaluation(plan, net)
    FederatedAveraging().run(
        algorithm_params=NNAlgorithmParams(
            central_num_iterations=plan.rounds,
            evaluation_frequency=plan.rounds + 1,  # pfl's local evaluations: central iteration 0 only
            train_cohort_size=plan.per_round,
            val_cohort_size=None,
        ),
        backend=backend,
        model=model,
        model_train_params=NNTrainHyperParams(
            local_num_epochs=1, local_learning_rate=plan.lr, local_batch_size=plan.batch_size
        ),
        model_eval_params=NNEvalHyperParams(local_batch_size=1000),
        callbacks=[evaluation],
    )
    evals = evaluation.evals
    write_result(
        out,
        {"impl": "pfl", "accuracy": evals[-1]["accuracy"], "evals": evals, "settings": {"threads": THREADS}},
    )


if __name__ == "__main__":
    main(*sys.argv[1:3])
