"""Classification task: cross-entropy loss and evaluation as pure functions of the parameters.

The model module only provides the architecture; parameters live outside it as a name -> tensor
dict and are passed in with ``torch.func.functional_call``. That makes the loss a pure function
of (parameters, batch), which algorithms extend into their local objectives and which a
vectorized executor can ``vmap`` over clients.

Floating buffers (BatchNorm running statistics) travel with the parameters under their
state_dict names: local training updates them in place during the forward pass (train mode) and
takes no gradient for them (``buffers``), and the server averages them as it averages weights.
Integer buffers (BatchNorm's batch counter) stay out of the federated state.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from taciturn.core.params import Params
from taciturn.tasks.functional import mlp_layers, sequential_forward

Batch = tuple[torch.Tensor, ...]  # (x, y) or (x, y, sample weight)


class ClassificationTask:
    primary_metric = "accuracy"
    weighted_batches = True  # loss accepts (x, y, weight): the vectorized executor needs this

    def __init__(
        self,
        model: nn.Module,
        x_test: torch.Tensor,
        y_test: torch.Tensor,
        eval_batch_size: int = 2000,
        reinit: bool = True,
    ):
        """``reinit``: draw fresh weights from the run's stream (built-in models); False: the
        model's own weights are round 0's global model (the user's models, pretrained ones)."""
        self.model = model
        self.reinit = reinit
        self.buffers = federated_buffers(model)
        self.random_layers = random_layers(model)
        self._forward = sequential_forward(model)  # None: fall back to functional_call
        self.mlp = mlp_layers(model)  # (weight, bias) names if the model is a plain ReLU MLP
        self.x_test, self.y_test, self.eval_batch_size = x_test, y_test, eval_batch_size

    def init_params(self, generator: torch.Generator) -> Params:
        """Fresh parameters with PyTorch's default initialisation, drawn from ``generator``."""
        if self.reinit:  # drawn on the CPU, so that every device starts from the same weights
            device = next(self.model.parameters()).device
            self.model.cpu()
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(int(torch.randint(0, 2**62, (), generator=generator)))
                for module in self.model.modules():
                    if module is not self.model and hasattr(module, "reset_parameters"):
                        module.reset_parameters()
            self.model.to(device)
        params = {name: p.detach().clone() for name, p in self.model.named_parameters()}
        return params | {
            name: b.detach().clone() for name, b in self.model.named_buffers() if name in self.buffers
        }

    def logits(self, params: Params, x: torch.Tensor, training: bool = True) -> torch.Tensor:
        if self._forward is not None:  # plain layers: no mode-dependent module
            return self._forward(params, x)
        self.model.train(training)  # BatchNorm: batch statistics and in-place running updates; dropout
        return functional_call(self.model, params, (x,), strict=False)

    def loss(self, params: Params, batch: Batch) -> torch.Tensor:
        """Mean loss; a batch (x, y, weight) gives the weighted mean, which lets a vectorized
        executor pad clients' batches to one size and mask the padding out."""
        if len(batch) == 2:
            x, y = batch
            return self.output_loss(self.logits(params, x), y)
        x, y, weight = batch
        return (self.output_loss(self.logits(params, x), y, reduction="none") * weight).sum() / weight.sum()

    def output_loss(self, outputs: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        return F.cross_entropy(outputs, y, reduction=reduction)

    def predict(self, outputs: torch.Tensor) -> torch.Tensor:
        return outputs.argmax(dim=1)

    def evaluate(self, params: Params) -> dict[str, float]:
        return self.evaluate_on(params, self.x_test, self.y_test)

    @torch.no_grad()
    def evaluate_on(self, params: Params, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        """Mean loss and accuracy on (x, y), in large batches."""
        batch_size = self.eval_batch_size
        total_loss, correct = 0.0, 0
        for start in range(0, len(y), batch_size):
            logits = self.logits(params, x[start : start + batch_size], training=False)
            target = y[start : start + batch_size]
            total_loss += float(self.output_loss(logits, target, reduction="sum"))
            correct += int((self.predict(logits) == target).sum())
        return {"loss": total_loss / len(y), "accuracy": correct / len(y)}


def federated_buffers(model: nn.Module) -> frozenset[str]:
    """Names of the buffers that are federated with the weights: the floating ones."""
    for name, module in model.named_modules():
        batchnorm = isinstance(module, nn.modules.batchnorm._BatchNorm) and module.track_running_stats
        if batchnorm and module.momentum is None:
            raise ValueError(
                f"{name or 'the model'}: BatchNorm with momentum=None keeps a cumulative average over "
                "a batch count, which has no federated meaning; give it a momentum (PyTorch's is 0.1)"
            )
    return frozenset(name for name, b in model.named_buffers() if b.is_floating_point())


def random_layers(model: nn.Module) -> bool:
    """Whether training draws random numbers in the model's layers (dropout with p > 0), which
    local training seeds per (round, client) and vmap cannot draw per client."""
    return any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules())
