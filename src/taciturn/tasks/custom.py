"""A task with the user's own loss and evaluation metrics, for anything besides classification.

``loss(outputs, targets)`` returns the mean loss of a batch. When it takes a ``reduction`` keyword
as ``torch.nn.functional``'s losses do (``reduction="none"`` gives per-sample values), batches can be
weighted, which the vectorized executor needs; otherwise that executor is refused.
``metrics`` maps a name to ``metric(outputs, targets)``, returning per-sample values or a batch
mean; evaluation reports each one's mean over the test set. The first metric leads the report
(``loss`` when there is none).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping

import torch
from torch import nn

from taciturn.core.params import Params
from taciturn.tasks.classification import ClassificationTask

OutputFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-sample 1 when the largest output is the target class."""
    return (outputs.argmax(dim=1) == targets).float()


def _takes_reduction(fn: Callable) -> bool:
    try:
        return "reduction" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return False


def _batch_sum(value: torch.Tensor | float, n: int) -> float:
    """A metric's sum over a batch of n from per-sample values or the batch mean."""
    value = torch.as_tensor(value)
    return float(value.sum()) if value.ndim else float(value) * n


class CustomTask(ClassificationTask):
    def __init__(
        self,
        model: nn.Module,
        x_test: torch.Tensor,
        y_test: torch.Tensor,
        eval_batch_size: int,
        loss: OutputFn,
        metrics: Mapping[str, OutputFn],
        reinit: bool = False,
    ):
        super().__init__(model, x_test, y_test, eval_batch_size, reinit=reinit)
        self.loss_fn, self.metrics = loss, dict(metrics)
        self.weighted_batches = _takes_reduction(loss)
        self.primary_metric = next(iter(self.metrics), "loss")
        self.mlp = None  # the low-rank and fused MLP paths hard-code cross-entropy's backward

    def output_loss(self, outputs: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        if reduction == "mean":
            return self.loss_fn(outputs, y)
        if self.weighted_batches:  # per-sample: the mean over each sample's elements, as "mean" takes
            per_element = self.loss_fn(outputs, y, reduction="none")
            per_sample = per_element.reshape(len(y), -1).mean(dim=1) if per_element.ndim > 1 else per_element
            return per_sample if reduction == "none" else per_sample.sum()
        if reduction == "sum":
            return self.loss_fn(outputs, y) * len(y)
        raise ValueError("this loss gives no per-sample values: it needs a reduction keyword")

    @torch.no_grad()
    def evaluate_on(self, params: Params, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        totals = dict.fromkeys(["loss", *self.metrics], 0.0)
        for start in range(0, len(y), self.eval_batch_size):
            outputs = self.logits(params, x[start : start + self.eval_batch_size], training=False)
            target = y[start : start + self.eval_batch_size]
            totals["loss"] += _batch_sum(self.loss_fn(outputs, target), len(target))
            for name, metric in self.metrics.items():
                totals[name] += _batch_sum(metric(outputs, target), len(target))
        return {name: total / len(y) for name, total in totals.items()}
