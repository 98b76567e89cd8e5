"""Classification trained with the squared loss, the setting of the NTK theory of wide networks.

Jian & Liu, "Widening the Network Mitigates the Impact of Data Heterogeneity on FedAvg", ICML
2025, Sec. 3: the loss is L(theta) = ||f(X; theta) - Y||^2 / (2 |D|), here computed per batch as
    L = 1/(2 B) sum_i ||f(x_i) - t_i||^2.
The targets t_i are one-hot vectors; with two classes the network has a single output and
regresses the label itself (t_i in {0, 1}), as in the authors' mini-MNIST / mini-CIFAR runs
("labels used as regression targets"), and predicts class 1 when the output exceeds 1/2.
(The authors' code uses ``nn.MSELoss``, the mean without the 1/2: the same dynamics at twice the
learning rate.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from taciturn.tasks.classification import ClassificationTask


def num_outputs(num_classes: int) -> int:
    """Network outputs of a squared-loss classifier: one for two classes, else one per class."""
    return 1 if num_classes == 2 else num_classes


class SquaredErrorTask(ClassificationTask):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.mlp = None  # the low-rank MLP path (engine/lowrank.py) hard-codes cross-entropy's backward

    def targets(self, y: torch.Tensor, width: int) -> torch.Tensor:
        return y.to(torch.float32).unsqueeze(1) if width == 1 else F.one_hot(y, width).to(torch.float32)

    def output_loss(self, outputs: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        per_sample = 0.5 * (outputs - self.targets(y, outputs.shape[1])).pow(2).sum(dim=1)
        if reduction == "none":
            return per_sample
        return per_sample.sum() if reduction == "sum" else per_sample.mean()

    def predict(self, outputs: torch.Tensor) -> torch.Tensor:
        return (outputs[:, 0] > 0.5).long() if outputs.shape[1] == 1 else outputs.argmax(dim=1)
